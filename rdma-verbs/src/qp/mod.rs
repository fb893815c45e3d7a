//! Queue pairs (`struct ibv_qp`). The guide (creation, the state machine, one PSN per
//! QP) and an example are on [`QueuePair`], public, where rustdoc shows them.

use crate::ah::{AhAttr, Remote};
use crate::context::Context;
use crate::conv;
use crate::cq::{CompletionQueue, CqInner};
use crate::device::Transport;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::{destroy_shared, Owned};
use crate::pd::ProtectionDomain;
use crate::port::Mtu;
use crate::srq::SrqInner;
use std::ffi::c_int;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

mod attr;
mod builder;
mod ece;
mod multicast;
mod rate_limit;

pub use attr::*;
pub(crate) use attr::{check_transition, fits, mask_names, required_mask, Mask};
use builder::CapRequest;
pub(crate) use builder::Creator;
pub use builder::QueuePairBuilder;
pub use ece::Ece;
pub use multicast::{MulticastMembership, MULTICAST_QPN};
pub use rate_limit::RateLimit;

/// A queue pair (`struct ibv_qp`). Verbs on it are thread-safe, so it is `Send + Sync`;
/// it keeps its protection domain, both completion queues and its SRQ alive, and is
/// destroyed first.
///
/// Built with [`QueuePair::builder`], its capabilities checked against the device and its
/// depths against its CQs. Its state machine RESET -> INIT -> RTR -> RTS takes, at each
/// transition, the attribute mask the InfiniBand spec requires for the QP's transport;
/// [`connect`](Self::connect) does the three steps at once.
///
/// # One PSN per QP
///
/// The first packet sequence number a QP sends is chosen once, when it is built: at
/// random ([`random_psn`]), or fixed with [`QueuePairBuilder::psn`] (tests, tools that
/// must match a peer's expectations). [`local_info`](Self::local_info) advertises it, and
/// [`connect`](Self::connect), [`ready_ud`](Self::ready_ud) and the endpoint
/// [`Handshake`](crate::Handshake) send from it, so the PSN a peer was told and the one
/// this side sends cannot differ. Only the hand-driven transitions take it as an argument
/// ([`RtsAttr::sq_psn`]: pass [`psn`](Self::psn)). The example below fixes one side's PSN
/// and checks what `local_info` advertises.
///
/// # Example
///
/// Two RC QPs connected as two programs connect them, each with what the other's
/// [`local_info`](Self::local_info) returned, then an RDMA WRITE from one into the
/// other's memory (this example is `tests/device/doc/qp_connect.rs`, which the device
/// tests run):
///
#[doc = concat!("```no_run\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/device/doc/qp_connect.rs")), "```")]
pub struct QueuePair {
    pub(crate) inner: Arc<QpInner>,
}

pub(crate) struct QpInner {
    /// For a QP made through something else (a CM id): dropped just before `raw`
    /// destroys the QP, it takes the QP off its creator, so that librdmacm never touches a
    /// destroyed QP.
    detach: Option<Box<dyn Send + Sync>>,
    // The QP is destroyed before the parents below are released.
    pub(crate) raw: Owned<ffi::ibv_qp>,
    pub(crate) qp_ex: Option<NonNull<ffi::ibv_qp_ex>>,
    qp_type: QpType,
    pub(crate) caps: QpCaps,
    /// The send and receive depths asked for: the safe queues' default depths (a provider
    /// may grant more, which the CQ was not necessarily sized for).
    pub(crate) asked_depth: (u32, u32),
    pub(crate) send_ops: SendOps,
    /// Whether the device has RDMA ATOMIC WRITE (`IB_UVERBS_DEVICE_ATOMIC_WRITE`).
    pub(crate) atomic_write: bool,
    /// The first PSN it sends: chosen once, at build.
    psn: u32,
    sq_sig_all: bool,
    max_qp_rd_atom: u8,
    max_qp_init_rd_atom: u8,
    /// The device's `max_sge_rd` (its `max_sge` when it reports none).
    pub(crate) max_sge_rd: u32,
    /// An iWARP device: no immediate data ([`NO_IMM`](crate::caps::NO_IMM)).
    pub(crate) lacks_imm: bool,
    /// The device's `atomic_cap` is `IBV_ATOMIC_NONE`.
    pub(crate) lacks_atomics: bool,
    pd: ProtectionDomain,
    /// What a QP was made through (a CM id), released only after the QP is destroyed.
    _creator: Option<Arc<dyn Send + Sync>>,
    // Held only to keep the parents alive.
    pub(crate) send_cq: Arc<CqInner>,
    pub(crate) recv_cq: Arc<CqInner>,
    srq: Option<Arc<SrqInner>>,
    /// Buffers of requests still posted when their queue was dropped: freed after the
    /// QP (the field above) is destroyed, when the device can no longer touch them.
    pub(crate) graveyard: Mutex<Vec<Box<dyn Send>>>,
    /// Set while a [`SendQueue`](crate::queue::SendQueue) owns the send side.
    pub(crate) send_claimed: AtomicBool,
    /// Set while a [`RecvQueue`](crate::queue::RecvQueue) owns the receive side.
    pub(crate) recv_claimed: AtomicBool,
}

// SAFETY: libibverbs verbs on a QP are thread-safe: providers lock the send queue and the
// receive queue separately, and modify/query/destroy go through the kernel, which
// serializes them. The pointers are owned by this struct and freed once.
unsafe impl Send for QpInner {}
// SAFETY: see Send; nothing here is mutated through a shared reference except by those
// thread-safe verbs.
unsafe impl Sync for QpInner {}

impl QueuePair {
    /// Starts building a QP of `qp_type` in `pd`, completing sends on `send_cq` and
    /// receives on `recv_cq` (which may be the same CQ).
    pub fn builder<'a>(
        pd: &'a ProtectionDomain,
        qp_type: QpType,
        send_cq: &'a CompletionQueue,
        recv_cq: &'a CompletionQueue,
    ) -> QueuePairBuilder<'a> {
        QueuePairBuilder {
            pd,
            send_cq,
            recv_cq,
            srq: None,
            req: CapRequest::defaults(qp_type),
            sq_sig_all: false,
            psn: None,
        }
    }

    /// The QP number the peer addresses.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: the QP is live; qp_num is set at creation and never changes.
        unsafe { (*self.as_raw()).qp_num }
    }

    /// The first PSN this QP sends, chosen once when it was built (at random, unless
    /// [`QueuePairBuilder::psn`] fixed it). [`local_info`](Self::local_info) advertises it;
    /// [`connect`](Self::connect), [`ready_ud`](Self::ready_ud) and the endpoint
    /// [`Handshake`](crate::Handshake) send from it. A QP [reset](Self::reset) and connected
    /// again starts from it again; build a new QP for a fresh one. A QP made through a CM id
    /// does not use it: rdma_cm picks and exchanges that QP's PSN itself.
    pub fn psn(&self) -> u32 {
        self.inner.psn
    }

    /// The transport type.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    /// The queue sizes the provider granted (at least those asked for).
    pub fn caps(&self) -> QpCaps {
        self.inner.caps
    }

    /// The extended send operations it was created with (empty for a classic QP).
    pub fn send_ops(&self) -> SendOps {
        self.inner.send_ops
    }

    /// True when every send completes with a work completion.
    pub fn sq_sig_all(&self) -> bool {
        self.inner.sq_sig_all
    }

    /// True when receives come from a shared receive queue (post them there, not here).
    pub fn has_srq(&self) -> bool {
        self.inner.srq.is_some()
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    /// The device context.
    pub fn context(&self) -> &Context {
        self.inner.pd.context()
    }

    /// The raw pointer (for `ibv_post_send`, `ibv_post_recv`), valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_qp {
        self.inner.raw.as_ptr()
    }

    /// The extended QP (for `ibv_wr_*`), when it was built with
    /// [`extended_send_ops`](QueuePairBuilder::extended_send_ops); valid while `self` lives.
    pub fn as_raw_ex(&self) -> Option<*mut ffi::ibv_qp_ex> {
        self.inner.qp_ex.map(NonNull::as_ptr)
    }

    /// Whether the device writes the data of `op` requests (one of [`SendOps`]' RDMA
    /// WRITE, WRITE with immediate, SEND, SEND with immediate, READ) into memory in order,
    /// so that a poller may read the last byte and trust the ones before it
    /// (`ibv_query_qp_data_in_order`). `false` means no such promise: the usual answer,
    /// and what providers without the query give (rxe among them).
    ///
    /// Refused before C: `op` not exactly one of those operations.
    #[doc(alias = "ibv_query_qp_data_in_order")]
    pub fn data_in_order(&self, op: SendOps) -> Result<bool> {
        use ffi::ibv_wr_opcode as O;
        let code = [
            (SendOps::RDMA_WRITE, O::IBV_WR_RDMA_WRITE),
            (SendOps::RDMA_WRITE_WITH_IMM, O::IBV_WR_RDMA_WRITE_WITH_IMM),
            (SendOps::SEND, O::IBV_WR_SEND),
            (SendOps::SEND_WITH_IMM, O::IBV_WR_SEND_WITH_IMM),
            (SendOps::RDMA_READ, O::IBV_WR_RDMA_READ),
        ]
        .into_iter()
        .find_map(|(o, c)| (o == op).then_some(c));
        let Some(code) = code else {
            return Err(Error::invalid(
                Verb::QpDataInOrder,
                format!("{op:?}: one of RDMA_WRITE, RDMA_WRITE_WITH_IMM, SEND, SEND_WITH_IMM, RDMA_READ"),
            ));
        };
        // SAFETY: the QP is live; no flags (the answer is 0 or 1).
        let rc = unsafe { ffi::ibv_query_qp_data_in_order(self.as_raw(), code, 0) };
        Ok(rc > 0)
    }

    /// The current state (`ibv_query_qp` with `IBV_QP_STATE`).
    #[doc(alias = "ibv_query_qp")]
    pub fn state(&self) -> Result<QpState> {
        self.query_mask(ffi::ibv_qp_attr_mask::IBV_QP_STATE).map(|a| QpState::from_raw(a.qp_state.0))
    }

    /// The QP's attributes (`ibv_query_qp`).
    #[doc(alias = "ibv_query_qp")]
    pub fn query(&self) -> Result<QpAttrs> {
        use ffi::ibv_qp_attr_mask as M;
        let mask = M::IBV_QP_STATE
            | M::IBV_QP_PKEY_INDEX
            | M::IBV_QP_PORT
            | M::IBV_QP_QKEY
            | M::IBV_QP_ACCESS_FLAGS
            | M::IBV_QP_AV
            | M::IBV_QP_PATH_MTU
            | M::IBV_QP_TIMEOUT
            | M::IBV_QP_RETRY_CNT
            | M::IBV_QP_RNR_RETRY
            | M::IBV_QP_RQ_PSN
            | M::IBV_QP_SQ_PSN
            | M::IBV_QP_MAX_QP_RD_ATOMIC
            | M::IBV_QP_MAX_DEST_RD_ATOMIC
            | M::IBV_QP_MIN_RNR_TIMER
            | M::IBV_QP_DEST_QPN
            | M::IBV_QP_CAP;
        let a = self.query_mask(mask)?;
        Ok(QpAttrs {
            state: QpState::from_raw(a.qp_state.0),
            path_mtu: Mtu::from_raw(a.path_mtu.0),
            qkey: a.qkey,
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qp_num,
            access: QpAccess::from_bits_retain(a.qp_access_flags),
            cap: QpCaps::from_ffi(&a.cap),
            path: AhAttr::from_ffi(&a.ah_attr),
            pkey_index: a.pkey_index,
            port: a.port_num,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            sq_draining: a.sq_draining != 0,
            raw: a,
        })
    }

    fn query_mask(&self, mask: Mask) -> Result<ffi::ibv_qp_attr> {
        let mut attr = ffi::ibv_qp_attr::default();
        let mut init = ffi::ibv_qp_init_attr::default();
        // SAFETY: the QP is live; both out-structs are valid for writing.
        let rc = unsafe { ffi::ibv_query_qp(self.as_raw(), &mut attr, mask.0 as c_int, &mut init) };
        conv::rc(Verb::QueryQp, rc)?;
        Ok(attr)
    }

    /// The current state, checked as a valid start of a transition to `to`.
    fn begin(&self, to: QpState) -> Result<QpState> {
        let from = self.state()?;
        check_transition(self.qp_num(), self.qp_type(), from, to)?;
        Ok(from)
    }

    /// `ibv_modify_qp` to `to`; EINVAL gets a hint naming the transition and the mask.
    fn modify(&self, from: QpState, to: QpState, mut attr: ffi::ibv_qp_attr, mask: Mask) -> Result<()> {
        attr.qp_state = ffi::ibv_qp_state(to.to_raw());
        // SAFETY: the QP is live and `attr` is valid for the call.
        let rc = unsafe { ffi::ibv_modify_qp(self.as_raw(), &mut attr, mask.0 as c_int) };
        conv::rc(Verb::ModifyQp, rc).map_err(|e| match e.errno() {
            Some(libc::EINVAL) => e.with_hint(format!(
                "{from}->{to} of {} QP {:#x} with attribute mask {}: the kernel refused an attribute \
                 value or the mask for this transition",
                self.qp_type(),
                self.qp_num(),
                mask_names(mask)
            )),
            _ => e,
        })
    }

    /// RESET (or INIT) -> INIT: binds the QP to a port (`ibv_modify_qp`). RC and UC QPs get
    /// `attr.access`, UD QPs `attr.qkey`. Receives may be posted from INIT on.
    #[doc(alias = "ibv_modify_qp")]
    pub fn to_init(&self, attr: &InitAttr) -> Result<()> {
        self.by_hand(Verb::ModifyQp)?;
        let from = self.begin(QpState::Init)?;
        if self.qp_type() == QpType::Ud && !attr.access.is_empty() {
            return Err(Error::invalid(
                Verb::ModifyQp,
                format!("UD QPs take no remote access ({:?}): RDMA READ, WRITE and atomics need RC", attr.access),
            ));
        }
        let port = self.context().query_port(attr.port)?;
        let pkeys = u32::from(port.raw.pkey_tbl_len);
        if u32::from(attr.pkey_index) >= pkeys {
            return Err(Error::invalid(
                Verb::ModifyQp,
                format!(
                    "pkey_index {} is past the P_Key table of port {} ({pkeys} entries)",
                    attr.pkey_index, attr.port
                ),
            ));
        }
        let raw = ffi::ibv_qp_attr {
            pkey_index: attr.pkey_index,
            port_num: attr.port,
            qp_access_flags: attr.access.bits(),
            qkey: attr.qkey,
            ..Default::default()
        };
        self.modify(from, QpState::Init, raw, required_mask(self.qp_type(), QpState::Init))
    }

    /// INIT -> RTR of a connected (RC, UC) QP: names the remote QP and the path to it
    /// (`ibv_modify_qp`). The path MTU is clamped to the port's active MTU and
    /// `max_dest_rd_atomic` to the device's limit; the address is checked against the port.
    #[doc(alias = "ibv_modify_qp")]
    pub fn to_rtr(&self, attr: &RtrAttr) -> Result<()> {
        self.by_hand(Verb::ModifyQp)?;
        if self.qp_type() == QpType::Ud {
            return Err(Error::invalid(
                Verb::ModifyQp,
                "a UD QP has no remote at RTR (each send names its address handle): call to_rtr_ud()",
            ));
        }
        let from = self.begin(QpState::Rtr)?;
        if attr.dest_qpn <= 1 {
            return Err(Error::invalid(
                Verb::ModifyQp,
                format!("dest_qpn {} is a management QP: set the remote QP's number", attr.dest_qpn),
            ));
        }
        fits(attr.dest_qpn, 0xFF_FFFF, "dest_qpn")?;
        fits(attr.rq_psn, MAX_PSN, "rq_psn")?;
        fits(attr.min_rnr_timer.into(), 31, "min_rnr_timer")?;
        let path = AhAttr { port: attr.port, remote: attr.remote, sl: attr.sl, static_rate: 0 };
        let port = path.check(self.context(), Verb::ModifyQp)?;
        let mtu = match (attr.path_mtu, port.active_mtu) {
            (Mtu::Unknown(v), _) => {
                return Err(Error::invalid(Verb::ModifyQp, format!("path MTU code {v} is not an IB MTU")));
            }
            (want, Mtu::Unknown(_)) => want,
            (want, active) => {
                if want.to_raw() <= active.to_raw() {
                    want
                } else {
                    active
                }
            }
        };
        let raw = ffi::ibv_qp_attr {
            path_mtu: mtu.to_ffi(),
            dest_qp_num: attr.dest_qpn,
            rq_psn: attr.rq_psn,
            ah_attr: path.raw(Verb::ModifyQp)?,
            max_dest_rd_atomic: attr.max_dest_rd_atomic.min(self.inner.max_qp_rd_atom),
            min_rnr_timer: attr.min_rnr_timer,
            ..Default::default()
        };
        self.modify(from, QpState::Rtr, raw, required_mask(self.qp_type(), QpState::Rtr))
    }

    /// INIT -> RTR of a UD QP (`ibv_modify_qp` with the state alone).
    #[doc(alias = "ibv_modify_qp")]
    pub fn to_rtr_ud(&self) -> Result<()> {
        if self.qp_type() != QpType::Ud {
            return Err(Error::invalid(
                Verb::ModifyQp,
                format!("to_rtr_ud() is for UD QPs; a {} QP needs to_rtr() with its remote", self.qp_type()),
            ));
        }
        let from = self.begin(QpState::Rtr)?;
        self.modify(from, QpState::Rtr, ffi::ibv_qp_attr::default(), required_mask(QpType::Ud, QpState::Rtr))
    }

    /// RTR -> RTS: the QP may send (`ibv_modify_qp`). RC QPs take the timeouts and retry
    /// counts (see [`RtsAttr`]); UC and UD QPs only `sq_psn`.
    #[doc(alias = "ibv_modify_qp")]
    pub fn to_rts(&self, attr: &RtsAttr) -> Result<()> {
        self.by_hand(Verb::ModifyQp)?;
        let from = self.begin(QpState::Rts)?;
        fits(attr.sq_psn, MAX_PSN, "sq_psn")?;
        fits(attr.timeout.into(), 31, "timeout")?;
        fits(attr.retry_cnt.into(), 7, "retry_cnt")?;
        fits(attr.rnr_retry.into(), 7, "rnr_retry")?;
        let raw = ffi::ibv_qp_attr {
            sq_psn: attr.sq_psn,
            timeout: attr.timeout,
            retry_cnt: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
            max_rd_atomic: attr.max_rd_atomic.min(self.inner.max_qp_init_rd_atom),
            ..Default::default()
        };
        self.modify(from, QpState::Rts, raw, required_mask(self.qp_type(), QpState::Rts))
    }

    /// Any state -> RESET: forgets the connection and drops every outstanding work
    /// request without a completion. From RESET the QP can be brought up again.
    #[doc(alias = "ibv_modify_qp")]
    pub fn reset(&self) -> Result<()> {
        let from = self.state()?;
        self.modify(from, QpState::Reset, ffi::ibv_qp_attr::default(), ffi::ibv_qp_attr_mask::IBV_QP_STATE)
    }

    /// Any state -> ERR: outstanding work requests complete with a flush error. Then
    /// [`reset`](Self::reset) to reuse the QP.
    #[doc(alias = "ibv_modify_qp")]
    pub fn to_error(&self) -> Result<()> {
        let from = self.state()?;
        self.modify(from, QpState::Err, ffi::ibv_qp_attr::default(), ffi::ibv_qp_attr_mask::IBV_QP_STATE)
    }

    /// Refuses connecting by hand on an iWARP device ([`Error::NotSupported`] naming `verb`):
    /// an iWARP QP reaches RTS only through the TCP connection rdma_cm makes for it.
    pub(crate) fn by_hand(&self, verb: Verb) -> Result<()> {
        let ctx = self.context();
        if ctx.transport() != Transport::Iwarp {
            return Ok(());
        }
        Err(Error::not_supported(
            verb,
            format!(
                "a QP connected by hand: {} is an iWARP device, whose QPs connect only through rdma_cm \
                 (the TCP connection under the QP): connect with cm::CmId (connect_with and accept_with \
                 take a QP of your own)",
                ctx.name()
            ),
        ))
    }

    /// What a peer needs to connect to this QP on `port`: its number, the PSN it will send
    /// from ([`psn`](Self::psn), the one [`connect`](Self::connect) uses), the port's LID and
    /// the GID `connect` sends from ([`Context::default_gid`] on RoCE, index 0 on InfiniBand).
    pub fn local_info(&self, port: u8) -> Result<RemoteQpInfo> {
        self.by_hand(Verb::QpLocalInfo)?;
        let ctx = self.context();
        let attr = ctx.query_port(port)?;
        let gid = if attr.is_ethernet() { ctx.default_gid(port)?.gid } else { ctx.query_gid(port, 0)?.gid };
        Ok(RemoteQpInfo { qpn: self.qp_num(), psn: self.psn(), lid: attr.lid, gid })
    }

    /// Connects an RC or UC QP in RESET to `remote`: INIT with `init`, RTR towards the
    /// remote QP (by GID from [`Context::default_gid`] on RoCE, by LID on InfiniBand) with
    /// the [`RtrAttr`] defaults, RTS sending from [`psn`](Self::psn), the PSN
    /// [`local_info`](Self::local_info) advertised, with the [`RtsAttr`] defaults.
    /// For other paths or timeouts, call the three transitions yourself.
    pub fn connect(&self, init: &InitAttr, remote: &RemoteQpInfo) -> Result<()> {
        if self.qp_type() == QpType::Ud {
            return Err(Error::invalid(Verb::ModifyQp, "UD QPs are not connected: call ready_ud()"));
        }
        // Before the GID lookup below, which an iWARP port would fail with a false cause.
        self.by_hand(Verb::ModifyQp)?;
        let ctx = self.context();
        let port = ctx.query_port(init.port)?;
        let path = if port.is_ethernet() {
            Remote::gid(remote.gid, ctx.default_gid(init.port)?.index)
        } else {
            Remote::lid(remote.lid)
        };
        self.to_init(init)?;
        self.to_rtr(&RtrAttr { port: init.port, ..RtrAttr::new(path, remote.qpn, remote.psn) })?;
        self.to_rts(&RtsAttr { sq_psn: self.psn(), ..RtsAttr::default() })
    }

    /// Brings a UD QP in RESET up to RTS: INIT with `init` (port, P_Key index, Q_Key),
    /// RTR, RTS sending from [`psn`](Self::psn).
    pub fn ready_ud(&self, init: &InitAttr) -> Result<()> {
        self.to_init(init)?;
        self.to_rtr_ud()?;
        self.to_rts(&RtsAttr { sq_psn: self.psn(), ..RtsAttr::default() })
    }

    /// Destroys the QP now and reports the result (`ibv_destroy_qp`). Fails with EBUSY,
    /// destroying nothing yet, while another handle of this crate still holds it.
    #[doc(alias = "ibv_destroy_qp", alias = "rdma_destroy_qp")]
    pub fn destroy(self) -> Result<()> {
        destroy_shared(self.inner, Verb::DestroyQp, |mut inner| {
            // A QP made through a CM id leaves it first.
            drop(inner.detach.take());
            inner.raw.destroy()
        })
    }
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &format_args!("{:#x}", self.qp_num()))
            .field("qp_type", &self.inner.qp_type)
            .field("caps", &self.inner.caps)
            .field("srq", &self.has_srq())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::Gid;

    fn req(qp_type: QpType) -> CapRequest {
        CapRequest::defaults(qp_type)
    }

    fn what(e: Error) -> String {
        match e {
            Error::InvalidArgument { what, .. } => what.into_owned(),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn default_caps_are_128_wrs_and_one_sge_each_way() {
        let cap = req(QpType::Rc).check(16384, 32, 65536).unwrap();
        assert_eq!((cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge), (128, 128, 1, 1));
    }

    #[test]
    fn caps_above_the_device_limits_name_the_limit() {
        let r = CapRequest { max_send_wr: 20000, ..req(QpType::Rc) };
        assert_eq!(
            what(r.check(16384, 32, 65536).map(|_| ()).unwrap_err()),
            "max_send_wr 20000 exceeds the device's max_qp_wr 16384"
        );
        let r = CapRequest { max_recv_sge: Some(33), ..req(QpType::Ud) };
        assert_eq!(
            what(r.check(16384, 32, 65536).map(|_| ()).unwrap_err()),
            "max_recv_sge 33 exceeds the device's max_sge 32"
        );
    }

    #[test]
    fn a_depth_the_device_allows_but_no_cq_can_hold_is_refused_naming_max_cqe() {
        // rxe's limits: queues up to 1,048,576 deep, CQs up to 32,767 entries.
        let r = CapRequest { max_send_wr: 1 << 20, ..req(QpType::Rc) };
        let e = r.check(1 << 20, 32, 32767).map(|_| ()).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::QueuePairBuilderBuild, .. }), "{e:?}");
        let text = what(e);
        assert!(text.starts_with("max_send_wr 1048576 is within the device's max_qp_wr 1048576"), "{text}");
        assert!(text.contains("the deepest queue one CQ serves is 32767"), "{text}");
        let r = CapRequest { max_recv_wr: Some(32768), ..req(QpType::Rc) };
        assert!(what(r.check(1 << 20, 32, 32767).map(|_| ()).unwrap_err()).starts_with("max_recv_wr 32768"));
        let r = CapRequest { max_send_wr: 32767, max_recv_wr: Some(32767), ..req(QpType::Rc) };
        r.check(1 << 20, 32, 32767).unwrap();
    }

    #[test]
    fn an_srq_takes_no_receive_sizes() {
        let r = CapRequest { has_srq: true, max_recv_wr: Some(8), ..req(QpType::Rc) };
        assert!(what(r.check(16384, 32, 65536).map(|_| ()).unwrap_err()).contains("with an SRQ"));
        let cap = CapRequest { has_srq: true, ..req(QpType::Rc) }.check(16384, 32, 65536).unwrap();
        assert_eq!((cap.max_recv_wr, cap.max_recv_sge), (0, 0));
    }

    #[test]
    fn extended_send_ops_must_fit_the_transport() {
        let r = CapRequest { send_ops: Some(SendOps::SEND | SendOps::RDMA_WRITE), ..req(QpType::Ud) };
        assert!(what(r.check(16384, 32, 65536).map(|_| ()).unwrap_err()).contains("UD"));
        let r = CapRequest { send_ops: Some(SendOps::RDMA_READ), ..req(QpType::Uc) };
        assert!(what(r.check(16384, 32, 65536).map(|_| ()).unwrap_err()).contains("RDMA_READ"));
        let r = CapRequest { send_ops: Some(SendOps::all()), ..req(QpType::Rc) };
        r.check(16384, 32, 65536).unwrap();
        let r = CapRequest { send_ops: Some(SendOps::empty()), ..req(QpType::Rc) };
        r.check(16384, 32, 65536).map(|_| ()).unwrap_err();
    }

    #[test]
    fn each_transport_gets_the_masks_the_spec_requires() {
        assert_eq!(mask_names(required_mask(QpType::Rc, QpState::Init)), "STATE|ACCESS_FLAGS|PKEY_INDEX|PORT");
        assert_eq!(mask_names(required_mask(QpType::Uc, QpState::Init)), "STATE|ACCESS_FLAGS|PKEY_INDEX|PORT");
        assert_eq!(mask_names(required_mask(QpType::Ud, QpState::Init)), "STATE|PKEY_INDEX|PORT|QKEY");
        assert_eq!(
            mask_names(required_mask(QpType::Rc, QpState::Rtr)),
            "STATE|AV|PATH_MTU|RQ_PSN|MIN_RNR_TIMER|MAX_DEST_RD_ATOMIC|DEST_QPN"
        );
        assert_eq!(mask_names(required_mask(QpType::Uc, QpState::Rtr)), "STATE|AV|PATH_MTU|RQ_PSN|DEST_QPN");
        assert_eq!(mask_names(required_mask(QpType::Ud, QpState::Rtr)), "STATE");
        assert_eq!(
            mask_names(required_mask(QpType::Rc, QpState::Rts)),
            "STATE|TIMEOUT|RETRY_CNT|RNR_RETRY|MAX_QP_RD_ATOMIC|SQ_PSN"
        );
        assert_eq!(mask_names(required_mask(QpType::Uc, QpState::Rts)), "STATE|SQ_PSN");
        assert_eq!(mask_names(required_mask(QpType::Ud, QpState::Rts)), "STATE|SQ_PSN");
    }

    #[test]
    fn illegal_transitions_name_both_states_and_the_way() {
        let e = what(check_transition(0x11, QpType::Rc, QpState::Init, QpState::Rts).unwrap_err());
        assert!(e.contains("RC QP 0x11 is in INIT; RTS can be reached only from RTR"), "{e}");
        let e = what(check_transition(0x11, QpType::Ud, QpState::Rts, QpState::Init).unwrap_err());
        assert!(e.contains("INIT can be reached only from RESET or INIT"), "{e}");
        check_transition(1, QpType::Rc, QpState::Reset, QpState::Init).unwrap();
        check_transition(1, QpType::Rc, QpState::Init, QpState::Init).unwrap();
        check_transition(1, QpType::Rc, QpState::Init, QpState::Rtr).unwrap();
        check_transition(1, QpType::Rc, QpState::Rtr, QpState::Rts).unwrap();
        for from in [QpState::Rts, QpState::Err, QpState::Sqe, QpState::Unknown(9)] {
            check_transition(1, QpType::Rc, from, QpState::Reset).unwrap();
            check_transition(1, QpType::Rc, from, QpState::Err).unwrap();
        }
    }

    #[test]
    fn defaults_cannot_retry_forever() {
        let rts = RtsAttr::default();
        assert_eq!((rts.timeout, rts.retry_cnt, rts.rnr_retry), (14, 6, 6));
        assert_eq!(RtrAttr::default().min_rnr_timer, 12);
        assert_eq!(InitAttr::default().qkey & 0x8000_0000, 0, "the default Q_Key is not a controlled key");
    }

    #[test]
    fn remote_qp_info_round_trips_through_its_wire_form() {
        let info = RemoteQpInfo { qpn: 0x12_3456, psn: 0xab_cdef, lid: 0x2a, gid: Gid([7; 16]) };
        let bytes = info.to_bytes();
        assert_eq!(&bytes[..4], &[0, 0x12, 0x34, 0x56]);
        assert_eq!(RemoteQpInfo::from_bytes(&bytes), Ok(info));
    }

    #[test]
    fn remote_qp_info_from_a_peer_is_checked() {
        use crate::WireError;
        let good = RemoteQpInfo { qpn: 0x12_3456, psn: 0xab_cdef, lid: 0, gid: Gid([7; 16]) };
        let with = |f: fn(&mut RemoteQpInfo)| {
            let mut i = good;
            f(&mut i);
            RemoteQpInfo::from_bytes(&i.to_bytes())
        };
        assert_eq!(with(|i| i.qpn = 0x100_0000), Err(WireError::QpnTooLarge(0x100_0000)));
        assert_eq!(with(|i| i.qpn = 1), Err(WireError::ReservedQpn(1)));
        assert_eq!(with(|i| i.psn = 0x100_0000), Err(WireError::PsnTooLarge(0x100_0000)));
        assert_eq!(with(|i| i.gid = Gid([0; 16])), Err(WireError::NoAddress));
        assert_eq!(with(|i| (i.lid, i.gid) = (0xc000, Gid([0; 16]))), Err(WireError::MulticastLid(0xc000)));
        assert_eq!(with(|_| ()), Ok(good));
    }

    #[test]
    fn random_psns_fit_in_24_bits_and_vary() {
        let psns: Vec<u32> = (0..16).map(|_| random_psn()).collect();
        assert!(psns.iter().all(|&p| p <= MAX_PSN));
        assert!(psns.windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn qp_state_codes_match_the_c_enum() {
        assert_eq!(QpState::from_raw(ffi::ibv_qp_state::IBV_QPS_RTS.0), QpState::Rts);
        assert_eq!(QpState::from_raw(ffi::ibv_qp_state::IBV_QPS_ERR.0), QpState::Err);
        assert_eq!(QpState::from_raw(ffi::ibv_qp_state::IBV_QPS_UNKNOWN.0), QpState::Unknown(7));
        assert_eq!(QpType::from_ffi(QpType::Uc.to_ffi()), Some(QpType::Uc));
    }
}
