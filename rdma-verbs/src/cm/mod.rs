//! Connections through the RDMA connection manager (librdmacm): [`CmId`],
//! [`EventChannel`], and their async forms in `aio`.
//!
//! The guide (events and their acknowledgement, lifetimes and teardown, the device
//! context librdmacm keeps open until the process exits) is on [`CmId`], public, where
//! rustdoc shows it; this module is private.

mod addr;
mod aio;
mod channel;
mod event;
mod id;
mod options;
mod user_qp;

pub use aio::{AsyncCmId, AsyncEventChannel};
pub use channel::EventChannel;
pub use event::{CmEvent, CmEventKind, ConnInfo, ConnectRequest, RejectReason, UdInfo};
pub use id::CmId;
pub use options::{CmOption, JoinMode};
pub use user_qp::{CmNotify, CmQpAttr};

use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::qp::QpType;

/// The port space of an id (`enum rdma_port_space`): which transport its connections
/// use, like TCP and UDP ports for IP.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// Reliable connections (RC QPs), `RDMA_PS_TCP`.
    Tcp,
    /// Datagrams (UD QPs), `RDMA_PS_UDP`.
    Udp,
}

impl PortSpace {
    /// The C value.
    pub fn to_ffi(self) -> ffi::rdma_port_space {
        match self {
            PortSpace::Tcp => ffi::rdma_port_space::RDMA_PS_TCP,
            PortSpace::Udp => ffi::rdma_port_space::RDMA_PS_UDP,
        }
    }

    /// The QP type an id of this port space connects.
    pub fn qp_type(self) -> QpType {
        match self {
            PortSpace::Tcp => QpType::Rc,
            PortSpace::Udp => QpType::Ud,
        }
    }
}

/// What private data travels with (the CM message it rides in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrivateDataOp {
    Connect,
    Accept,
    Reject,
}

/// Largest private data that fits in one CM message of `op` for `ps` on InfiniBand and
/// RoCE: the IB CM message's private data field, less the 36-byte header rdma_cm puts in
/// front of a request for IP addressing. Other transports (iWARP) are bounded by the
/// u8 length of the kernel interface.
pub(crate) fn max_private_data(ps: PortSpace, op: PrivateDataOp, ib_transport: bool) -> usize {
    if !ib_transport {
        return u8::MAX as usize;
    }
    match (ps, op) {
        (PortSpace::Tcp, PrivateDataOp::Connect) => 56,  // REQ: 92 - 36
        (PortSpace::Tcp, PrivateDataOp::Accept) => 196,  // REP
        (PortSpace::Tcp, PrivateDataOp::Reject) => 148,  // REJ
        (PortSpace::Udp, PrivateDataOp::Connect) => 180, // SIDR REQ: 216 - 36
        (PortSpace::Udp, _) => 136,                      // SIDR REP
    }
}

/// Refuses private data longer than the message can carry, before any C call.
pub(crate) fn check_private_data(
    verb: Verb,
    data: &[u8],
    ps: PortSpace,
    op: PrivateDataOp,
    ib_transport: bool,
) -> Result<()> {
    let max = max_private_data(ps, op, ib_transport);
    if data.len() > max {
        let on = if ib_transport { "on InfiniBand and RoCE" } else { "through the kernel interface" };
        return Err(Error::invalid(
            verb,
            format!("{} bytes of private data exceed the {max} a {op:?} message carries {on}", data.len()),
        ));
    }
    Ok(())
}

/// Connection parameters for [`CmId::connect`] and [`CmId::accept`] (`struct
/// rdma_conn_param`). The defaults: no private data, RDMA READ and atomic depths as
/// large as the device allows, 6 retries after a timeout and 6 after an RNR NAK (not 7:
/// an RNR retry count of 7 retries forever while the peer posts no receive, and rxe
/// never counts a retry count of 7 down; see [`RtsAttr`](crate::RtsAttr)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct ConnParam<'a> {
    pub(crate) private_data: &'a [u8],
    pub(crate) responder_resources: Option<u8>,
    pub(crate) initiator_depth: Option<u8>,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry_count: u8,
}

impl Default for ConnParam<'_> {
    fn default() -> Self {
        ConnParam {
            private_data: &[],
            responder_resources: None,
            initiator_depth: None,
            retry_count: 6,
            rnr_retry_count: 6,
        }
    }
}

impl<'a> ConnParam<'a> {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes for the peer, delivered with its event. At most 56 with a connect and 196
    /// with an accept on InfiniBand and RoCE (UD: 180 and 136); the peer receives them
    /// padded with zeros to the size of the message's field, so put your own length in
    /// them when it matters.
    pub fn private_data(mut self, data: &'a [u8]) -> Self {
        self.private_data = data;
        self
    }

    /// RDMA READs and atomics the peer may have outstanding at this side (default: the
    /// device's maximum).
    pub fn responder_resources(mut self, n: u8) -> Self {
        self.responder_resources = Some(n);
        self
    }

    /// RDMA READs and atomics this side may have outstanding at the peer (default: the
    /// device's maximum).
    pub fn initiator_depth(mut self, n: u8) -> Self {
        self.initiator_depth = Some(n);
        self
    }

    /// Retries after a transport timeout, 0..=7 (default 7).
    pub fn retry_count(mut self, n: u8) -> Self {
        self.retry_count = n;
        self
    }

    /// Retries after an RNR NAK (the peer had no receive posted), 0..=7, 7 = forever
    /// (default 6).
    pub fn rnr_retry_count(mut self, n: u8) -> Self {
        self.rnr_retry_count = n;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_data_limits_follow_the_ib_cm_message_sizes() {
        assert_eq!(max_private_data(PortSpace::Tcp, PrivateDataOp::Connect, true), 56);
        assert_eq!(max_private_data(PortSpace::Tcp, PrivateDataOp::Accept, true), 196);
        assert_eq!(max_private_data(PortSpace::Tcp, PrivateDataOp::Reject, true), 148);
        assert_eq!(max_private_data(PortSpace::Udp, PrivateDataOp::Connect, true), 180);
        assert_eq!(max_private_data(PortSpace::Udp, PrivateDataOp::Accept, true), 136);
        assert_eq!(max_private_data(PortSpace::Tcp, PrivateDataOp::Connect, false), 255);
    }

    #[test]
    fn too_much_private_data_is_refused_naming_the_limit() {
        check_private_data(Verb::Connect, &[0; 56], PortSpace::Tcp, PrivateDataOp::Connect, true).unwrap();
        let e = check_private_data(Verb::Connect, &[0; 57], PortSpace::Tcp, PrivateDataOp::Connect, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("57 bytes of private data exceed the 56 a Connect message carries"), "{e}");
    }

    #[test]
    fn port_spaces_map_to_their_c_values_and_qp_types() {
        assert_eq!(PortSpace::Tcp.to_ffi().0, 0x106);
        assert_eq!(PortSpace::Udp.to_ffi().0, 0x111);
        assert_eq!(PortSpace::Tcp.qp_type(), QpType::Rc);
        assert_eq!(PortSpace::Udp.qp_type(), QpType::Ud);
    }

    #[test]
    fn conn_param_defaults_cannot_retry_forever() {
        let p = ConnParam::new();
        assert_eq!((p.retry_count, p.rnr_retry_count), (6, 6));
        assert!(p.private_data.is_empty());
    }
}
