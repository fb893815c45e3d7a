//! What an id is told besides its addresses: options (`rdma_set_option`), multicast joins
//! with a join mode (`rdma_join_multicast_ex`), and ECE offered and received through the
//! CM handshake (`rdma_set_local_ece`, `rdma_get_remote_ece`, `rdma_reject_ece`).

use std::ffi::{c_int, c_void};
use std::mem::size_of;
use std::net::{IpAddr, SocketAddr};
use std::ptr;
use std::time::Duration;

use super::addr::SockAddr;
use super::event::CmEventKind;
use super::id::{resolve_wait, CmId};
use super::{check_private_data, PortSpace, PrivateDataOp, UdInfo};
use crate::conv;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::qp::Ece;

/// An option of an id (`rdma_set_option` at level `RDMA_OPTION_ID`), with its value.
#[doc(alias = "RDMA_OPTION_ID")]
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmOption {
    /// The IP type of service (RFC 2474: DSCP in the top 6 bits, ECN in the low 2) of the
    /// connection's packets (`RDMA_OPTION_ID_TOS`). On RoCE v2 it becomes the traffic
    /// class of the path; set it before [`CmId::resolve_route`], which picks the path.
    TypeOfService(u8),
    /// Like `SO_REUSEADDR` (`RDMA_OPTION_ID_REUSEADDR`): ids that all set it may bind the
    /// same address and port (a listener still needs the port for itself). Before
    /// [`CmId::bind`] or [`CmId::resolve_addr`].
    ReuseAddr(bool),
    /// Like `IPV6_V6ONLY` (`RDMA_OPTION_ID_AFONLY`): an id bound to an IPv6 wildcard
    /// address takes only IPv6 (true) or also IPv4 (false). Before binding.
    AfOnly(bool),
    /// The local ACK timeout of the connection's QP (`RDMA_OPTION_ID_ACK_TIMEOUT`): the
    /// exponent `n` of 4.096 us * 2^n, 0..=31, which the QP gets at RTS instead of the
    /// one the path suggests. Connected (RC) ids only; before the QP reaches RTS.
    AckTimeout(u8),
}

impl CmOption {
    /// `(optname, value)`: the value as the C option takes it (a byte or an int).
    fn to_ffi(self) -> (u32, OptVal) {
        match self {
            CmOption::TypeOfService(t) => (ffi::RDMA_OPTION_ID_TOS.0, OptVal::Byte(t)),
            CmOption::ReuseAddr(on) => (ffi::RDMA_OPTION_ID_REUSEADDR.0, OptVal::Int(c_int::from(on))),
            CmOption::AfOnly(on) => (ffi::RDMA_OPTION_ID_AFONLY.0, OptVal::Int(c_int::from(on))),
            CmOption::AckTimeout(n) => (ffi::RDMA_OPTION_ID_ACK_TIMEOUT.0, OptVal::Byte(n)),
        }
    }
}

enum OptVal {
    Byte(u8),
    Int(c_int),
}

/// How to join a multicast group (`enum rdma_cm_mc_join_flags`).
#[doc(alias = "rdma_cm_mc_join_flags")]
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JoinMode {
    /// Send to the group and receive its datagrams (`RDMA_MC_JOIN_FLAG_FULLMEMBER`): what
    /// [`CmId::join_multicast`] does.
    FullMember,
    /// Send to the group only (`RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`): librdmacm does not
    /// attach the id's QP to the group, so none of its datagrams arrive there; on
    /// InfiniBand the subnet manager may create the group for a send-only member.
    SendOnlyFullMember,
}

impl JoinMode {
    fn to_ffi(self) -> u32 {
        match self {
            JoinMode::FullMember => ffi::rdma_cm_mc_join_flags::RDMA_MC_JOIN_FLAG_FULLMEMBER.0,
            JoinMode::SendOnlyFullMember => ffi::rdma_cm_mc_join_flags::RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER.0,
        }
    }
}

/// Refuses an ECE that names no vendor, before C (librdmacm says EINVAL for vendor 0).
fn check_ece(verb: Verb, ece: &Ece) -> Result<()> {
    if ece.vendor_id == 0 || ece.vendor_id > 0x00ff_ffff {
        return Err(Error::invalid(
            verb,
            format!("vendor id {:#x} is not an IEEE OUI (24 bits, not 0)", ece.vendor_id),
        ));
    }
    Ok(())
}

/// The checks of [`CmId::set_option`] before C, for an id of `ps` that has a local
/// address (`bound`) or not.
fn check_option(option: CmOption, ps: PortSpace, bound: bool) -> Result<()> {
    const CHECK: Verb = Verb::CmSetOption;
    match option {
        CmOption::AckTimeout(n) if n > 31 => {
            Err(Error::invalid(CHECK, format!("ACK timeout exponent {n} is above its maximum 31")))
        }
        CmOption::AckTimeout(_) if ps != PortSpace::Tcp => {
            Err(Error::invalid(CHECK, "an ACK timeout is for connected (PortSpace::Tcp) ids"))
        }
        CmOption::ReuseAddr(_) | CmOption::AfOnly(_) if bound => Err(Error::invalid(
            CHECK,
            format!("{option:?} must be set before the id is bound (bind() or resolve_addr())"),
        )),
        _ => Ok(()),
    }
}

impl CmId {
    /// Whether a QP was made through the id ([`create_qp`](Self::create_qp)).
    pub(super) fn has_qp(&self) -> bool {
        // SAFETY: the id is live; its fields are read under the CM lock.
        self.locked(|id| unsafe { !(*id).qp.is_null() })
    }

    /// Sets an option of the id (`rdma_set_option`, level `RDMA_OPTION_ID`).
    ///
    /// Refused before C ([`Verb::CmSetOption`]): an ACK timeout above 31 (the field has 5
    /// bits) or on an id of a datagram port space (only connected QPs have one),
    /// `ReuseAddr` and `AfOnly` once the id has a local address (the kernel would say
    /// EINVAL).
    #[doc(alias = "rdma_set_option")]
    pub fn set_option(&self, option: CmOption) -> Result<()> {
        check_option(option, self.port_space(), self.local_addr().is_some())?;
        let (name, mut val) = option.to_ffi();
        let (p, len): (*mut c_void, usize) = match &mut val {
            OptVal::Byte(b) => (ptr::from_mut(b).cast(), size_of::<u8>()),
            OptVal::Int(i) => (ptr::from_mut(i).cast(), size_of::<c_int>()),
        };
        let level = ffi::RDMA_OPTION_ID.0 as c_int;
        // SAFETY: the id is live, under the CM lock; `p` points at `len` readable bytes that
        // outlive the call (the kernel copies them).
        let rc = self.locked(|id| unsafe { ffi::rdma_set_option(id, level, name as c_int, p, len) });
        conv::rc(Verb::SetOption, rc)
    }

    /// Joins the multicast group `group` as `mode` says (`rdma_join_multicast_ex`) and
    /// waits at most `timeout` for the join ([`CmEventKind::MulticastJoin`]): returns how
    /// to send to the group, as [`join_multicast`](Self::join_multicast) does. A
    /// [`JoinMode::SendOnlyFullMember`] join leaves the id's QP unattached: it may send to
    /// the group and receives none of its datagrams. Leave with
    /// [`leave_multicast`](Self::leave_multicast).
    ///
    /// Refused before C ([`Verb::CmJoinMulticastEx`]): an id of a connected port space, an
    /// id bound to no device, an address that is not multicast.
    #[doc(alias = "rdma_join_multicast_ex")]
    pub fn join_multicast_ex(&self, group: IpAddr, mode: JoinMode, timeout: Duration) -> Result<UdInfo> {
        const VERB: Verb = Verb::JoinMulticastEx;
        self.multicast_checks(Verb::CmJoinMulticastEx, group)?;
        let mut addr = SockAddr::new(SocketAddr::new(group, 0));
        let mut attr = ffi::rdma_cm_join_mc_attr_ex {
            comp_mask: ffi::rdma_cm_join_mc_attr_mask::RDMA_CM_JOIN_MC_ATTR_ADDRESS.0
                | ffi::rdma_cm_join_mc_attr_mask::RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS.0,
            join_flags: mode.to_ffi(),
            addr: addr.as_ffi(),
        };
        // SAFETY: the id is live and bound to a device, under the CM lock; `attr` and the
        // address it names are valid for the call (librdmacm copies the address); no user
        // context.
        let rc = self.locked(|id| unsafe { ffi::rdma_join_multicast_ex(id, &mut attr, ptr::null_mut()) });
        conv::rc(VERB, rc).map_err(|e| match e.errno() {
            Some(libc::EOPNOTSUPP | libc::ENOSYS) => {
                Error::verb_or_not_supported(VERB, e.errno().unwrap_or(libc::EIO), "this join mode on this port")
            }
            _ => e,
        })?;
        let event = self.expect(CmEventKind::MulticastJoin, resolve_wait(timeout), VERB)?;
        event.ud().ok_or_else(|| Error::invalid(VERB, "the MULTICAST_JOIN event carried no UD parameters"))
    }

    /// Sets the ECE options this side offers in its connect request, or answers with in
    /// its accept (`rdma_set_local_ece`). For an id whose QP you made yourself
    /// ([`connect_with`](Self::connect_with), [`accept_with`](Self::accept_with)): for a
    /// QP made through the id, librdmacm takes the QP's own ECE
    /// ([`QueuePair::set_ece`](crate::QueuePair::set_ece)).
    ///
    /// The options travel in the CM messages, so this works on any device, rxe included;
    /// what they mean is the vendor's. Refused before C ([`Verb::CmSetLocalEce`]): a vendor
    /// id that is 0 or wider than 24 bits, an id with a QP made through it.
    #[doc(alias = "rdma_set_local_ece")]
    pub fn set_local_ece(&self, ece: Ece) -> Result<()> {
        check_ece(Verb::CmSetLocalEce, &ece)?;
        self.no_cm_qp(Verb::CmSetLocalEce)?;
        let mut raw = ffi::ibv_ece { vendor_id: ece.vendor_id, options: ece.options, comp_mask: 0 };
        // SAFETY: the id is live, under the CM lock; `raw` is readable.
        let rc = self.locked(|id| unsafe { ffi::rdma_set_local_ece(id, &mut raw) });
        conv::rc(Verb::SetLocalEce, rc)
    }

    /// The ECE options the peer sent (`rdma_get_remote_ece`): on the passive side those of
    /// the connect request, on the active side those of the accept (after
    /// [`connect_with`](Self::connect_with) returns). A peer that offered none reads as
    /// vendor 0. For an id whose QP you made yourself; refused before C
    /// ([`Verb::CmRemoteEce`]) for an id with a QP made through it.
    #[doc(alias = "rdma_get_remote_ece")]
    pub fn remote_ece(&self) -> Result<Ece> {
        self.no_cm_qp(Verb::CmRemoteEce)?;
        let mut raw = ffi::ibv_ece { vendor_id: 0, options: 0, comp_mask: 0 };
        // SAFETY: the id is live, under the CM lock; `raw` is writable.
        let rc = self.locked(|id| unsafe { ffi::rdma_get_remote_ece(id, &mut raw) });
        conv::rc(Verb::GetRemoteEce, rc)?;
        Ok(Ece { vendor_id: raw.vendor_id, options: raw.options })
    }

    /// Rejects the connection request this id came with because of its ECE options
    /// (`rdma_reject_ece`): the peer sees [`Error::Rejected`] with reason
    /// [`VendorOptionNotSupported`](super::RejectReason::VendorOptionNotSupported) (35)
    /// and these bytes (at most 148 on InfiniBand and RoCE, 136 for UD).
    #[doc(alias = "rdma_reject_ece")]
    pub fn reject_ece(&self, private_data: &[u8]) -> Result<()> {
        check_private_data(
            Verb::RejectEce,
            private_data,
            self.port_space(),
            PrivateDataOp::Reject,
            self.ib_transport(),
        )?;
        let data = if private_data.is_empty() { ptr::null() } else { private_data.as_ptr().cast() };
        // The length fits: checked above (at most 148).
        let len = private_data.len() as u8;
        // SAFETY: the id is live, under the CM lock; the data is valid for the call.
        self.locked(|id| conv::rc(Verb::RejectEce, unsafe { ffi::rdma_reject_ece(id, data, len) }))
    }

    fn no_cm_qp(&self, verb: Verb) -> Result<()> {
        if self.has_qp() {
            return Err(Error::invalid(
                verb,
                "the id has a QP made through it (create_qp): librdmacm exchanges that QP's own ECE \
                 (QueuePair::set_ece, query_ece)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_map_to_their_c_names_and_value_sizes() {
        let (n, v) = CmOption::TypeOfService(0x20).to_ffi();
        assert!(n == 0 && matches!(v, OptVal::Byte(0x20)));
        let (n, v) = CmOption::ReuseAddr(true).to_ffi();
        assert!(n == 1 && matches!(v, OptVal::Int(1)));
        let (n, v) = CmOption::AfOnly(false).to_ffi();
        assert!(n == 2 && matches!(v, OptVal::Int(0)));
        let (n, v) = CmOption::AckTimeout(18).to_ffi();
        assert!(n == 3 && matches!(v, OptVal::Byte(18)));
    }

    #[test]
    fn option_checks_refuse_what_the_kernel_would_with_einval() {
        assert!(check_option(CmOption::AckTimeout(31), PortSpace::Tcp, true).is_ok());
        let e = check_option(CmOption::AckTimeout(32), PortSpace::Tcp, false).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { verb: Verb::CmSetOption, .. }), "{e}");
        assert!(e.to_string().contains("above its maximum 31"), "{e}");
        assert!(check_option(CmOption::AckTimeout(14), PortSpace::Udp, false).is_err());
        assert!(check_option(CmOption::ReuseAddr(true), PortSpace::Tcp, false).is_ok());
        let e = check_option(CmOption::ReuseAddr(true), PortSpace::Tcp, true).unwrap_err();
        assert!(e.to_string().contains("before the id is bound"), "{e}");
        assert!(check_option(CmOption::AfOnly(true), PortSpace::Udp, true).is_err());
        assert!(check_option(CmOption::TypeOfService(0xb8), PortSpace::Udp, true).is_ok());
    }

    #[test]
    fn join_modes_are_the_c_values() {
        assert_eq!(JoinMode::FullMember.to_ffi(), 0);
        assert_eq!(JoinMode::SendOnlyFullMember.to_ffi(), 1);
    }

    #[test]
    fn an_ece_without_a_vendor_is_refused_naming_our_method() {
        assert!(check_ece(Verb::CmSetLocalEce, &Ece { vendor_id: 0x2c9, options: 3 }).is_ok());
        let e = check_ece(Verb::CmSetLocalEce, &Ece { vendor_id: 0, options: 3 }).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::CmSetLocalEce, .. }), "{e}");
        assert!(check_ece(Verb::CmSetLocalEce, &Ece { vendor_id: 1 << 24, options: 0 }).is_err());
    }
}
