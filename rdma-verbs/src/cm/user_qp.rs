//! A QP the user made ([`QueuePair::builder`]) connected through rdma_cm: the attributes
//! of each transition from the CM (`rdma_init_qp_attr`), connect and accept naming the
//! QP, the RTU of the active side (`rdma_establish`), and the passive side's word that
//! its QP saw the connection come up (`rdma_notify`).
//!
//! On iWARP the connection is a TCP stream the kernel sets up, and the kernel moves the QP
//! from INIT to RTS as it comes up: the user moves the QP to INIT only, `connect_with`
//! returns [`CmEventKind::Established`], and there is no RTR, RTS or RTU to do by hand.

use std::ffi::c_int;
use std::time::Duration;

use super::event::{CmEvent, CmEventKind};
use super::id::CmId;
use super::{ConnParam, PrivateDataOp};
use crate::ah::AhAttr;
use crate::conv;
use crate::device::Transport;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::port::Mtu;
use crate::qp::{check_transition, mask_names, Mask, QpAccess, QpState, QueuePair};

/// What `ibv_modify_qp` needs to move a QP connected through an id to one state, as the
/// CM computed it (`rdma_init_qp_attr`): see [`CmId::qp_attr`].
#[derive(Clone)]
pub struct CmQpAttr {
    raw: ffi::ibv_qp_attr,
    mask: Mask,
}

impl CmQpAttr {
    /// The state these attributes move to.
    pub fn state(&self) -> QpState {
        QpState::from_raw(self.raw.qp_state.0)
    }

    /// The attribute mask (`IBV_QP_*` bits).
    pub fn mask(&self) -> u32 {
        self.mask.0
    }

    /// The remote QP number (RTR of a connected QP).
    pub fn dest_qp_num(&self) -> u32 {
        self.raw.dest_qp_num
    }

    /// The first PSN expected from the peer (RTR).
    pub fn rq_psn(&self) -> u32 {
        self.raw.rq_psn
    }

    /// The first PSN sent (RTS).
    pub fn sq_psn(&self) -> u32 {
        self.raw.sq_psn
    }

    /// The path MTU (RTR).
    pub fn path_mtu(&self) -> Mtu {
        Mtu::from_raw(self.raw.path_mtu.0)
    }

    /// The path to the peer (RTR).
    pub fn path(&self) -> AhAttr {
        AhAttr::from_ffi(&self.raw.ah_attr)
    }

    /// The remote access (INIT of a connected QP).
    pub fn access(&self) -> QpAccess {
        QpAccess::from_bits_retain(self.raw.qp_access_flags)
    }

    /// The port (INIT).
    pub fn port(&self) -> u8 {
        self.raw.port_num
    }

    /// The local ACK timeout exponent (RTS of RC).
    pub fn timeout(&self) -> u8 {
        self.raw.timeout
    }

    /// Retries after a timeout (RTS of RC).
    pub fn retry_cnt(&self) -> u8 {
        self.raw.retry_cnt
    }

    /// Retries after an RNR NAK (RTS of RC).
    pub fn rnr_retry(&self) -> u8 {
        self.raw.rnr_retry
    }

    /// Outstanding RDMA READs and atomics as initiator (RTS) and as target (RTR).
    pub fn rd_atomic(&self) -> (u8, u8) {
        (self.raw.max_rd_atomic, self.raw.max_dest_rd_atomic)
    }

    /// The C struct, as librdmacm filled it.
    pub fn raw(&self) -> &ffi::ibv_qp_attr {
        &self.raw
    }
}

impl std::fmt::Debug for CmQpAttr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmQpAttr")
            .field("state", &self.state())
            .field("mask", &mask_names(self.mask))
            .field("dest_qp_num", &format_args!("{:#x}", self.raw.dest_qp_num))
            .field("rq_psn", &format_args!("{:#x}", self.raw.rq_psn))
            .field("sq_psn", &format_args!("{:#x}", self.raw.sq_psn))
            .field("timeout", &self.raw.timeout)
            .finish_non_exhaustive()
    }
}

/// What the passive side tells the CM about its QP (`rdma_notify`): the QP's async event
/// that stands for a CM message not yet arrived.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmNotify {
    /// The QP received its first packet before the CM's RTU
    /// ([`AsyncEventKind::CommEst`](crate::AsyncEventKind)): the connection is
    /// established; the id gets [`CmEventKind::Established`].
    CommEstablished,
    /// The QP migrated to its alternate path (`IBV_EVENT_PATH_MIG`).
    PathMigrated,
}

/// The bits of an attribute mask the kernel sets for RoCE and that librdmacm clears on
/// InfiniBand ports ("workaround for rdma_ucm kernel bug", as librdmacm's own RTR does).
const ROCE_ONLY_MASK_BITS: u32 = 0x00e0_0000;

/// The states `rdma_init_qp_attr` computes attributes for.
fn check_target(verb: Verb, state: QpState) -> Result<()> {
    match state {
        QpState::Init | QpState::Rtr | QpState::Rts => Ok(()),
        other => Err(Error::invalid(
            verb,
            format!("the CM computes the attributes of INIT, RTR and RTS, not {other}: use reset() or to_error()"),
        )),
    }
}

impl CmId {
    /// The attributes that move a QP connected through this id to `state`, as the CM
    /// knows them (`rdma_init_qp_attr`): INIT once the address is resolved; RTR and RTS
    /// once the peer answered (on the active side after
    /// [`connect_with`](Self::connect_with), on the passive side for the id of a request),
    /// with the peer's QP number, the path, the PSNs the CM exchanged and the
    /// [`CmOption::AckTimeout`](super::CmOption::AckTimeout) if one was set.
    /// [`modify_qp`](Self::modify_qp) applies them.
    ///
    /// Refused before C ([`Verb::CmQpAttr`]): states other than INIT, RTR, RTS; an id
    /// bound to no device.
    #[doc(alias = "rdma_init_qp_attr")]
    pub fn qp_attr(&self, state: QpState) -> Result<CmQpAttr> {
        self.qp_attr_for(Verb::CmQpAttr, state)
    }

    fn qp_attr_for(&self, check: Verb, state: QpState) -> Result<CmQpAttr> {
        check_target(check, state)?;
        if self.verbs().is_null() {
            return Err(Error::invalid(check, "the id is bound to no device yet: resolve its address first"));
        }
        let mut raw = ffi::ibv_qp_attr { qp_state: ffi::ibv_qp_state(state.to_raw()), ..Default::default() };
        let mut mask: c_int = 0;
        // SAFETY: the id is live and bound, under the CM lock; both out-pointers are
        // writable (librdmacm reads `qp_state` and fills the rest).
        let rc = self.locked(|id| unsafe { ffi::rdma_init_qp_attr(id, &mut raw, &mut mask) });
        conv::rc(Verb::InitQpAttr, rc).map_err(|e| match e.errno() {
            Some(libc::EINVAL) => e.with_hint(format!(
                "the CM has no {state} attributes yet: RTR and RTS need the peer's answer \
                 (connect_with() returned, or the id of a connection request)"
            )),
            _ => e,
        })?;
        Ok(CmQpAttr { raw, mask: ffi::ibv_qp_attr_mask(mask as u32) })
    }

    /// Moves `qp`, which you made ([`QueuePair::builder`] on the id's device: on its
    /// [`context`](Self::context) or on a context of your own of the same device), to
    /// `state` with the attributes the CM computes ([`qp_attr`](Self::qp_attr)), then
    /// `ibv_modify_qp`. The active side moves its QP to INIT, and after
    /// [`connect_with`](Self::connect_with) to RTR and RTS, then calls
    /// [`establish`](Self::establish); the passive side moves it through all three before
    /// [`accept_with`](Self::accept_with). On iWARP both sides move it to INIT only: the
    /// kernel moves it on to RTS as the connection comes up.
    ///
    /// Refused before C ([`Verb::CmModifyQp`]): a QP of another device or of another type
    /// than the port space's, the QP made through the id (librdmacm moves that one
    /// itself), RTR and RTS on iWARP, and (naming `ibv_modify_qp`) a transition the QP's
    /// current state does not allow.
    #[doc(alias = "rdma_init_qp_attr")]
    pub fn modify_qp(&self, qp: &QueuePair, state: QpState) -> Result<()> {
        const CHECK: Verb = Verb::CmModifyQp;
        self.check_user_qp(CHECK, qp)?;
        check_target(CHECK, state)?;
        if state != QpState::Init && self.on_iwarp(qp) {
            return Err(Error::invalid(
                CHECK,
                format!(
                    "{state} on iWARP: the kernel moves the QP from INIT to RTS as the connection comes up \
                     (connect_with, accept_with); move it to INIT only"
                ),
            ));
        }
        check_transition(qp.qp_num(), qp.qp_type(), qp.state()?, state)?;
        let mut attr = self.qp_attr_for(CHECK, state)?;
        let port = attr.raw.port_num;
        let port = if port == 0 { self.port_num().unwrap_or(1) } else { port };
        if !qp.context().query_port(port)?.is_ethernet() {
            attr.mask.0 &= !ROCE_ONLY_MASK_BITS;
        }
        // SAFETY: the QP is live (borrowed); `attr` is valid for the call.
        let rc = unsafe { ffi::ibv_modify_qp(qp.as_raw(), &mut attr.raw, attr.mask.0 as c_int) };
        conv::rc(Verb::ModifyQp, rc).map_err(|e| match e.errno() {
            Some(libc::EINVAL) => e.with_hint(format!(
                "the kernel refused the CM's {state} attributes ({}) for QP {:#x}",
                mask_names(attr.mask),
                qp.qp_num()
            )),
            _ => e,
        })
    }

    /// What a QP the user made must be to go with this id.
    fn check_user_qp(&self, verb: Verb, qp: &QueuePair) -> Result<()> {
        let want = self.port_space().qp_type();
        if qp.qp_type() != want {
            return Err(Error::invalid(
                verb,
                format!("an id of port space {:?} connects {want} QPs, not {}", self.port_space(), qp.qp_type()),
            ));
        }
        // SAFETY: the id is live; its fields are read under the CM lock.
        let (verbs, own) = self.locked(|id| unsafe { ((*id).verbs, (*id).qp) });
        if verbs.is_null() {
            return Err(Error::invalid(verb, "the id is bound to no device yet: resolve its address first"));
        }
        // SAFETY: both contexts are open (the id's while the id lives, the QP's while the
        // QP does); libibverbs set their `device`, which outlives them.
        let (ours, theirs) = unsafe { ((*verbs).device, (*qp.context().as_raw()).device) };
        // The same device object, or one of the same name: libibverbs hands every device
        // list the same objects while a context holds them, but a refreshed list may hold
        // another object for the same device (a wrong match is C's to refuse at connect;
        // a wrong refusal would leave the user no way on).
        // SAFETY: both devices outlive their open contexts (above), and ibv_get_device_name
        // gives the NUL-terminated name held in the device.
        let same = ours == theirs
            || unsafe {
                std::ffi::CStr::from_ptr(ffi::ibv_get_device_name(ours))
                    == std::ffi::CStr::from_ptr(ffi::ibv_get_device_name(theirs))
            };
        if !same {
            return Err(Error::invalid(
                verb,
                format!(
                    "the QP belongs to {}, the id to another device: build it on the id's context()",
                    qp.context().name()
                ),
            ));
        }
        if own == qp.as_raw() {
            return Err(Error::invalid(
                verb,
                "this is the QP made through the id (create_qp): librdmacm moves it itself; use connect() and accept()",
            ));
        }
        Ok(())
    }

    /// Connects with a QP you made (`rdma_connect` naming its number) and waits at most
    /// `timeout` for the server's answer, [`CmEventKind::ConnectResponse`] (with the
    /// server's private data and QP number): then move the QP to RTR and RTS
    /// ([`modify_qp`](Self::modify_qp)) and call [`establish`](Self::establish). On iWARP
    /// (the QP in INIT) the answer is [`CmEventKind::Established`], with the QP already in
    /// RTS: the connection is up, nothing more to do. A rejection is [`Error::Rejected`].
    ///
    /// Refused before C ([`Verb::CmConnectWith`]): an id with a QP made through it (use
    /// [`connect`](Self::connect)), a route not resolved, a QP of another context or type.
    #[doc(alias = "rdma_connect")]
    pub fn connect_with(&self, qp: &QueuePair, param: &ConnParam<'_>, timeout: Duration) -> Result<CmEvent> {
        const CHECK: Verb = Verb::CmConnectWith;
        self.user_qp_checks(CHECK, qp)?;
        let mut c = self.conn_param(Verb::Connect, param, PrivateDataOp::Connect)?;
        c.qp_num = qp.qp_num();
        c.srq = u8::from(qp.has_srq());
        // SAFETY: the id is live, under the CM lock; `c` and its private data are valid
        // for the call (librdmacm copies them).
        let rc = self.locked(|id| unsafe { ffi::rdma_connect(id, &mut c) });
        conv::rc(Verb::Connect, rc)?;
        let answer = if self.on_iwarp(qp) { CmEventKind::Established } else { CmEventKind::ConnectResponse };
        self.expect(answer, timeout, Verb::Connect)
    }

    /// Accepts the connection request this id came with for a QP you made (`rdma_accept`
    /// naming its number), after moving the QP to RTR (or RTS) with
    /// [`modify_qp`](Self::modify_qp), and waits at most `timeout` for
    /// [`CmEventKind::Established`]: the peer's [`establish`](Self::establish), or this
    /// side's [`notify`](Self::notify). On iWARP the QP stays in INIT, and the kernel moves
    /// it to RTS as the connection comes up.
    ///
    /// Refused before C ([`Verb::CmAcceptWith`]): an id with a QP made through it (use
    /// [`accept`](Self::accept)), a QP of another device or type, a QP not yet in RTR or
    /// RTS (it could not take the peer's first packets), except on iWARP.
    #[doc(alias = "rdma_accept")]
    pub fn accept_with(&self, qp: &QueuePair, param: &ConnParam<'_>, timeout: Duration) -> Result<()> {
        const CHECK: Verb = Verb::CmAcceptWith;
        self.user_qp_checks(CHECK, qp)?;
        // On iWARP the QP is in INIT (and siw's ibv_query_qp reads RESET whatever the state).
        let state = if self.on_iwarp(qp) { QpState::Rts } else { qp.state()? };
        if !matches!(state, QpState::Rtr | QpState::Rts) {
            return Err(Error::invalid(
                CHECK,
                format!("QP {:#x} is in {state}: move it to RTR and RTS (modify_qp) before accepting", qp.qp_num()),
            ));
        }
        let mut c = self.conn_param(Verb::Accept, param, PrivateDataOp::Accept)?;
        c.qp_num = qp.qp_num();
        c.srq = u8::from(qp.has_srq());
        // SAFETY: the id is live, under the CM lock; `c` is valid for the call.
        let rc = self.locked(|id| unsafe { ffi::rdma_accept(id, &mut c) });
        conv::rc(Verb::Accept, rc)?;
        self.expect(CmEventKind::Established, timeout, Verb::Accept).map(drop)
    }

    /// Whether `qp` (checked to be of the id's device) is on an iWARP device.
    fn on_iwarp(&self, qp: &QueuePair) -> bool {
        qp.context().transport() == Transport::Iwarp
    }

    fn user_qp_checks(&self, verb: Verb, qp: &QueuePair) -> Result<()> {
        if self.has_qp() {
            return Err(Error::invalid(verb, "the id has a QP made through it: use connect() and accept()"));
        }
        self.check_user_qp(verb, qp)
    }

    /// Tells the passive side that the connection is up (`rdma_establish`): the last step
    /// of the active side with a QP it made, after [`connect_with`](Self::connect_with)
    /// and the QP's move to RTS. No event follows on this side. Refused before C
    /// ([`Verb::CmEstablish`]) for an id with a QP made through it (librdmacm does this
    /// itself then), and on iWARP, whose connection is up when
    /// [`connect_with`](Self::connect_with) returns.
    #[doc(alias = "rdma_establish")]
    pub fn establish(&self) -> Result<()> {
        if self.has_qp() {
            return Err(Error::invalid(
                Verb::CmEstablish,
                "the id has a QP made through it: librdmacm establishes the connection itself in connect()",
            ));
        }
        if self.context().is_ok_and(|c| c.transport() == Transport::Iwarp) {
            return Err(Error::invalid(
                Verb::CmEstablish,
                "on iWARP the connection is up when connect_with() returns Established: there is no RTU to send",
            ));
        }
        // SAFETY: the id is live, under the CM lock.
        let rc = self.locked(|id| unsafe { ffi::rdma_establish(id) });
        conv::rc(Verb::Establish, rc)
    }

    /// Passes an async event of the connection's QP to the CM (`rdma_notify`): on the
    /// passive side, [`CmNotify::CommEstablished`] when the QP received data before the
    /// peer's RTU arrived, so the id reports [`CmEventKind::Established`] now. Once
    /// established, the kernel answers `EISCONN`.
    #[doc(alias = "rdma_notify")]
    pub fn notify(&self, event: CmNotify) -> Result<()> {
        let ev = match event {
            CmNotify::CommEstablished => ffi::ibv_event_type::IBV_EVENT_COMM_EST,
            CmNotify::PathMigrated => ffi::ibv_event_type::IBV_EVENT_PATH_MIG,
        };
        // SAFETY: the id is live, under the CM lock.
        let rc = self.locked(|id| unsafe { ffi::rdma_notify(id, ev) });
        conv::rc(Verb::Notify, rc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cm_computes_init_rtr_and_rts_only() {
        for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
            check_target(Verb::CmQpAttr, s).unwrap();
        }
        let e = check_target(Verb::CmQpAttr, QpState::Err).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { verb: Verb::CmQpAttr, .. }), "{e}");
        assert!(e.to_string().contains("not ERR"), "{e}");
    }

    #[test]
    fn the_masked_bits_are_none_of_the_transition_masks() {
        // librdmacm's workaround clears bits no ibv_qp_attr_mask of a transition uses.
        for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
            for t in [crate::QpType::Rc, crate::QpType::Ud] {
                assert_eq!(crate::qp::required_mask(t, s).0 & ROCE_ONLY_MASK_BITS, 0);
            }
        }
    }
}
