//! Typed rdma_cm events, copied out of librdmacm's event before it is acknowledged.

use std::borrow::Cow;
use std::fmt;

use super::id::CmId;
use crate::ah::AhAttr;
use crate::c_enum::c_enum;
use crate::error::{Error, Result, Verb};
use crate::ffi;

c_enum! {
    /// What happened (`enum rdma_cm_event_type`).
    #[doc(alias = "rdma_cm_event_type")]
    CmEventKind: u32 {
        /// [`CmId::resolve_addr`] found the device and port for the destination.
        AddrResolved = ffi::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED.0,
        /// Address resolution failed; the status is a negative errno.
        AddrError = ffi::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_ERROR.0,
        /// [`CmId::resolve_route`] found a path.
        RouteResolved = ffi::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED.0,
        /// Route resolution failed; the status is a negative errno.
        RouteError = ffi::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_ERROR.0,
        /// A peer asks a listener for a connection; the event carries the new id.
        ConnectRequest = ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST.0,
        /// The server accepted, and this side has no QP through the id to finish with.
        ConnectResponse = ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_RESPONSE.0,
        /// Setting up the connection failed (for instance the QP could not be moved to
        /// RTR/RTS); the status is a negative errno.
        ConnectError = ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_ERROR.0,
        /// The peer's CM did not answer; the status is a negative errno.
        Unreachable = ffi::rdma_cm_event_type::RDMA_CM_EVENT_UNREACHABLE.0,
        /// The peer rejected the connection, or nothing listens on the port; the status
        /// is the transport's reason ([`RejectReason`] on InfiniBand and RoCE).
        Rejected = ffi::rdma_cm_event_type::RDMA_CM_EVENT_REJECTED.0,
        /// The connection is up.
        Established = ffi::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED.0,
        /// The connection is down: the peer disconnected, or this side did and the
        /// handshake finished.
        Disconnected = ffi::rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED.0,
        /// The device went away: destroy everything made from the id, then the id.
        DeviceRemoval = ffi::rdma_cm_event_type::RDMA_CM_EVENT_DEVICE_REMOVAL.0,
        /// A multicast join finished.
        MulticastJoin = ffi::rdma_cm_event_type::RDMA_CM_EVENT_MULTICAST_JOIN.0,
        /// A multicast join failed, or the group went away.
        MulticastError = ffi::rdma_cm_event_type::RDMA_CM_EVENT_MULTICAST_ERROR.0,
        /// The address of the id's netdev changed.
        AddrChange = ffi::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_CHANGE.0,
        /// The QP of a closed connection left its time-wait: its number may be reused.
        TimewaitExit = ffi::rdma_cm_event_type::RDMA_CM_EVENT_TIMEWAIT_EXIT.0,
    }
}

impl fmt::Display for CmEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use CmEventKind::*;
        f.write_str(match self {
            AddrResolved => "ADDR_RESOLVED",
            AddrError => "ADDR_ERROR",
            RouteResolved => "ROUTE_RESOLVED",
            RouteError => "ROUTE_ERROR",
            ConnectRequest => "CONNECT_REQUEST",
            ConnectResponse => "CONNECT_RESPONSE",
            ConnectError => "CONNECT_ERROR",
            Unreachable => "UNREACHABLE",
            Rejected => "REJECTED",
            Established => "ESTABLISHED",
            Disconnected => "DISCONNECTED",
            DeviceRemoval => "DEVICE_REMOVAL",
            MulticastJoin => "MULTICAST_JOIN",
            MulticastError => "MULTICAST_ERROR",
            AddrChange => "ADDR_CHANGE",
            TimewaitExit => "TIMEWAIT_EXIT",
            Unknown(v) => return write!(f, "unknown rdma_cm event {v}"),
        })
    }
}

c_enum! {
    /// Why an InfiniBand or RoCE peer rejected a connection: the IB CM reject reason
    /// (`enum ib_cm_rej_reason`, IBTA spec table "REJ reason codes") in the status of a
    /// [`CmEventKind::Rejected`] event.
    RejectReason: i32 {
        /// The peer had no QP for it.
        NoQp = 1,
        /// No EE context (RD).
        NoEec = 2,
        /// The peer ran out of resources.
        NoResources = 3,
        /// The peer's CM timed out.
        Timeout = 4,
        /// The request asks for something the peer does not support.
        Unsupported = 5,
        /// The peer knows no such communication id.
        InvalidCommId = 6,
        /// Stale communication instance.
        InvalidCommInstance = 7,
        /// Nothing listens on that port (service id) at the peer.
        InvalidServiceId = 8,
        /// The peer does not take this transport (QP type).
        InvalidTransportType = 9,
        /// A stale connection: the peer still has the QP number in use.
        StaleConn = 10,
        /// No such RD channel.
        RdcNotExist = 11,
        /// The peer refused the primary path's GID.
        InvalidGid = 12,
        /// The peer refused the primary path's LID.
        InvalidLid = 13,
        /// The peer refused the service level.
        InvalidSl = 14,
        /// The peer refused the traffic class.
        InvalidTrafficClass = 15,
        /// The peer refused the hop limit.
        InvalidHopLimit = 16,
        /// The peer refused the packet rate.
        InvalidPacketRate = 17,
        /// The peer refused the alternate path's GID.
        InvalidAltGid = 18,
        /// The peer refused the alternate path's LID.
        InvalidAltLid = 19,
        /// The peer refused the alternate path's service level.
        InvalidAltSl = 20,
        /// The peer refused the alternate path's traffic class.
        InvalidAltTrafficClass = 21,
        /// The peer refused the alternate path's hop limit.
        InvalidAltHopLimit = 22,
        /// The peer refused the alternate path's packet rate.
        InvalidAltPacketRate = 23,
        /// The peer's CM redirects to another port.
        PortCmRedirect = 24,
        /// The peer redirects to another port.
        PortRedirect = 25,
        /// The peer refused the path MTU.
        InvalidMtu = 26,
        /// The peer cannot give the RDMA READ/atomic depth asked for.
        InsufficientRespResources = 27,
        /// The peer's application rejected it ([`CmId::reject`]).
        ConsumerDefined = 28,
        /// The peer refused the RNR retry count.
        InvalidRnrRetry = 29,
        /// The local communication id is already in use at the peer.
        DuplicateLocalCommId = 30,
        /// The peer's CM speaks another class version.
        InvalidClassVersion = 31,
        /// The peer refused the flow label.
        InvalidFlowLabel = 32,
        /// The peer refused the alternate path's flow label.
        InvalidAltFlowLabel = 33,
        /// A vendor option the peer does not support.
        VendorOptionNotSupported = 35,
    }
}

impl RejectReason {
    /// What it means for whoever connects.
    pub fn describe(self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            RejectReason::InvalidServiceId => "nothing listens on that port at the peer (invalid service ID)",
            RejectReason::ConsumerDefined => "the peer application rejected the connection",
            RejectReason::NoQp => "the peer has no QP for the connection",
            RejectReason::NoResources => "the peer ran out of resources",
            RejectReason::Timeout => "the peer's connection manager timed out",
            RejectReason::StaleConn => "stale connection: the peer still holds this QP number in time-wait",
            RejectReason::InsufficientRespResources => {
                "the peer cannot give the RDMA READ/atomic depth asked for (responder resources)"
            }
            RejectReason::Unknown(v) => return Cow::Owned(format!("IB CM reject reason {v}")),
            other => return Cow::Owned(format!("{other:?}")),
        })
    }
}

/// The peer's connection parameters, as a connect request or response reports them.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnInfo {
    /// RDMA READs and atomics the peer accepts outstanding at its side.
    pub responder_resources: u8,
    /// RDMA READs and atomics the peer will have outstanding here.
    pub initiator_depth: u8,
    /// Whether the peer does end-to-end flow control.
    pub flow_control: bool,
    /// The peer's retry count after a timeout.
    pub retry_count: u8,
    /// The peer's RNR retry count.
    pub rnr_retry_count: u8,
    /// Whether the peer's QP takes receives from an SRQ.
    pub srq: bool,
    /// The peer's QP number.
    pub qp_num: u32,
}

/// What a UD peer reports: how to address it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UdInfo {
    /// The peer's QP number.
    pub qp_num: u32,
    /// The Q_Key its QP takes.
    pub qkey: u32,
    /// The address handle attributes that reach it.
    pub ah: AhAttr,
}

crate::debug_hex::debug_hex!(ConnInfo {
    responder_resources,
    initiator_depth,
    flow_control,
    retry_count,
    rnr_retry_count,
    srq,
    qp_num: hex,
});
crate::debug_hex::debug_hex!(UdInfo { qp_num: hex, qkey: hex, ah });

#[derive(Debug, Clone, Copy)]
pub(super) enum Params {
    None,
    Conn(ConnInfo),
    Ud(UdInfo),
}

/// What an event says, copied out of librdmacm's event.
#[derive(Debug)]
pub(super) struct EventData {
    pub(super) kind: CmEventKind,
    pub(super) status: i32,
    pub(super) private_data: Vec<u8>,
    pub(super) params: Params,
    /// The serial of the id the event is for (for a connect request: the listener).
    pub(super) target: u64,
}

impl EventData {
    /// Copies an event's data out.
    ///
    /// # Safety
    /// `ev` must be an event `rdma_get_cm_event` returned and that is not acknowledged
    /// yet (so its ids and private data are alive).
    pub(super) unsafe fn capture(ev: &ffi::rdma_cm_event) -> EventData {
        let kind = CmEventKind::from_raw(ev.event.0);
        let owner = if kind == CmEventKind::ConnectRequest && !ev.listen_id.is_null() { ev.listen_id } else { ev.id };
        // SAFETY: the ids of an unacknowledged event are alive; `context` holds the serial
        // this module stored in every id it made or adopted.
        let target = unsafe { owner.as_ref() }.map_or(0, |id| id.context as usize as u64);
        // SAFETY: as above.
        let ud = unsafe { ev.id.as_ref() }.is_some_and(|id| id.qp_type == ffi::ibv_qp_type::IBV_QPT_UD);
        let (data, len, params) = match kind {
            // For multicast events librdmacm puts the join's user context where the
            // private data pointer goes: not data to copy. A join carries the group's
            // address, QP number and Q_Key in the ud member.
            CmEventKind::MulticastJoin => {
                // SAFETY: librdmacm fills the ud member for a completed join.
                let p = unsafe { ev.param.ud };
                (
                    std::ptr::null(),
                    0,
                    Params::Ud(UdInfo { qp_num: p.qp_num, qkey: p.qkey, ah: AhAttr::from_ffi(&p.ah_attr) }),
                )
            }
            CmEventKind::MulticastError => (std::ptr::null(), 0, Params::None),
            _ if ud => {
                // SAFETY: librdmacm fills the ud member for ids of UD port spaces.
                let p = unsafe { ev.param.ud };
                let params = match kind {
                    CmEventKind::Established | CmEventKind::ConnectRequest => {
                        Params::Ud(UdInfo { qp_num: p.qp_num, qkey: p.qkey, ah: AhAttr::from_ffi(&p.ah_attr) })
                    }
                    _ => Params::None,
                };
                (p.private_data, p.private_data_len, params)
            }
            _ => {
                // SAFETY: librdmacm fills the conn member for connected port spaces (and
                // zeroes the event first, so unset members read as zero).
                let p = unsafe { ev.param.conn };
                let params = match kind {
                    CmEventKind::ConnectRequest | CmEventKind::ConnectResponse | CmEventKind::Established => {
                        Params::Conn(ConnInfo {
                            responder_resources: p.responder_resources,
                            initiator_depth: p.initiator_depth,
                            flow_control: p.flow_control != 0,
                            retry_count: p.retry_count,
                            rnr_retry_count: p.rnr_retry_count,
                            srq: p.srq != 0,
                            qp_num: p.qp_num,
                        })
                    }
                    _ => Params::None,
                };
                (p.private_data, p.private_data_len, params)
            }
        };
        let private_data = if data.is_null() || len == 0 {
            Vec::new()
        } else {
            // SAFETY: librdmacm copied `len` (a u8, at most 255) bytes into the event's own
            // buffer of RDMA_MAX_PRIVATE_DATA (256) bytes, alive until the acknowledgement.
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }.to_vec()
        };
        EventData { kind, status: ev.status, private_data, params, target }
    }
}

/// One rdma_cm event, already acknowledged: plain data, plus the new id of a
/// connection request.
#[doc(alias = "rdma_ack_cm_event")]
pub struct CmEvent {
    pub(super) data: EventData,
    pub(super) request: Option<CmId>,
}

impl CmEvent {
    /// What happened.
    pub fn kind(&self) -> CmEventKind {
        self.data.kind
    }

    /// The event's status: 0, a negative errno for the error events, the reject reason
    /// for [`CmEventKind::Rejected`].
    pub fn status(&self) -> i32 {
        self.data.status
    }

    /// The private data the peer sent with its request, accept or reject. On
    /// InfiniBand and RoCE it comes padded with zeros to the size of the message's field.
    pub fn private_data(&self) -> &[u8] {
        &self.data.private_data
    }

    /// The peer's connection parameters (connect request, response, established).
    pub fn conn(&self) -> Option<ConnInfo> {
        match self.data.params {
            Params::Conn(c) => Some(c),
            _ => None,
        }
    }

    /// How to reach a UD peer (connect request and established events of UDP ids), or a
    /// multicast group ([`CmEventKind::MulticastJoin`]).
    pub fn ud(&self) -> Option<UdInfo> {
        match self.data.params {
            Params::Ud(u) => Some(u),
            _ => None,
        }
    }

    /// For [`CmEventKind::Rejected`] on InfiniBand and RoCE, the reason.
    pub fn reject_reason(&self) -> Option<RejectReason> {
        (self.data.kind == CmEventKind::Rejected).then(|| RejectReason::from_raw(self.data.status))
    }

    /// Whether the event is about `id` (for a connect request: whether `id` is the
    /// listener it came to).
    pub fn is_for(&self, id: &CmId) -> bool {
        self.data.target == id.serial()
    }

    /// The new id of a [`CmEventKind::ConnectRequest`], taken out once. Accept or reject
    /// it; dropped, it is destroyed and the peer sees a rejection.
    pub fn take_request(&mut self) -> Option<CmId> {
        self.request.take()
    }

    /// The event if it is `kind`, else the error it stands for (`verb` waited for `kind`).
    pub(super) fn expect(self, kind: CmEventKind, verb: Verb) -> Result<CmEvent> {
        if self.kind() == kind {
            Ok(self)
        } else {
            Err(self.into_error(verb, kind))
        }
    }

    /// This event as an error, for code that waited for something else: the error events
    /// with their errno, a rejection with its reason and private data.
    pub(super) fn into_error(self, verb: Verb, expected: CmEventKind) -> Error {
        let status = self.data.status;
        let errno = |fallback: i32| if status < 0 { -status } else { fallback };
        match self.data.kind {
            CmEventKind::Rejected => {
                let reason = match self.reject_reason() {
                    Some(r) if status > 0 => r.describe(),
                    _ => Cow::Owned(format!("status {status}")),
                };
                Error::Rejected { verb, status, reason, private_data: self.data.private_data }
            }
            kind @ (CmEventKind::AddrError | CmEventKind::RouteError) => {
                Error::verb(verb, errno(libc::EIO)).with_hint(format!(
                    "rdma_cm reported {kind}: no RDMA device serves a route to that address, or the \
                     address does not answer (for RoCE use an IP of a netdev under an RDMA device)"
                ))
            }
            CmEventKind::Unreachable => Error::verb(verb, errno(libc::EHOSTUNREACH))
                .with_hint("rdma_cm reported UNREACHABLE: the peer's connection manager did not answer"),
            CmEventKind::ConnectError => Error::verb(verb, errno(libc::ECONNABORTED))
                .with_hint("rdma_cm reported CONNECT_ERROR: setting up the connection failed"),
            CmEventKind::DeviceRemoval => Error::verb(verb, libc::ENODEV)
                .with_hint("rdma_cm reported DEVICE_REMOVAL: destroy the id and everything made from it"),
            CmEventKind::Disconnected => Error::verb(verb, libc::ECONNRESET)
                .with_hint(format!("the connection went down while waiting for {expected}")),
            other => Error::verb(verb, libc::EPROTO)
                .with_hint(format!("rdma_cm reported {other} (status {status}) while waiting for {expected}")),
        }
    }
}

impl fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmEvent")
            .field("kind", &self.data.kind)
            .field("status", &self.data.status)
            .field("private_data_len", &self.data.private_data.len())
            .field("params", &self.data.params)
            .field("request", &self.request.is_some())
            .finish()
    }
}

/// A connection request taken from a listener ([`CmId::get_request`]): the new id, and
/// what the peer sent. Accept or reject the id; dropped unanswered, it is rejected.
pub struct ConnectRequest {
    pub(super) id: CmId,
    pub(super) event: CmEvent,
}

impl ConnectRequest {
    /// The request of a [`CmEventKind::ConnectRequest`] event.
    pub(super) fn from_event(mut event: CmEvent) -> Result<ConnectRequest> {
        let id = event.take_request().ok_or_else(|| Error::verb(Verb::GetCmEvent, libc::EPROTO))?;
        Ok(ConnectRequest { id, event })
    }

    /// The new id, bound to the device the request came in on.
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// The peer's private data (padded with zeros on InfiniBand and RoCE).
    pub fn private_data(&self) -> &[u8] {
        self.event.private_data()
    }

    /// The peer's connection parameters.
    pub fn conn(&self) -> Option<ConnInfo> {
        self.event.conn()
    }

    /// The request event itself.
    pub fn event(&self) -> &CmEvent {
        &self.event
    }

    /// The new id, to keep.
    pub fn into_id(self) -> CmId {
        self.id
    }
}

impl fmt::Debug for ConnectRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectRequest").field("id", &self.id).field("event", &self.event).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_kinds_decode_and_unknown_values_are_data() {
        assert_eq!(CmEventKind::from_raw(4), CmEventKind::ConnectRequest);
        assert_eq!(CmEventKind::from_raw(8), CmEventKind::Rejected);
        assert_eq!(CmEventKind::from_raw(15), CmEventKind::TimewaitExit);
        assert_eq!(CmEventKind::from_raw(99), CmEventKind::Unknown(99));
        assert_eq!(CmEventKind::Established.to_string(), "ESTABLISHED");
    }

    #[test]
    fn reject_reasons_name_the_two_everyday_causes() {
        assert_eq!(RejectReason::from_raw(8), RejectReason::InvalidServiceId);
        assert_eq!(RejectReason::from_raw(28), RejectReason::ConsumerDefined);
        assert!(RejectReason::InvalidServiceId.describe().contains("nothing listens"));
        assert!(RejectReason::ConsumerDefined.describe().contains("application rejected"));
        assert_eq!(RejectReason::from_raw(34).describe(), "IB CM reject reason 34");
    }

    fn raw_event(kind: ffi::rdma_cm_event_type, id: &mut ffi::rdma_cm_id) -> ffi::rdma_cm_event {
        ffi::rdma_cm_event { id, event: kind, ..Default::default() }
    }

    #[test]
    fn capture_copies_private_data_and_names_the_listener_for_a_request() {
        let (mut listener, mut child) = (ffi::rdma_cm_id::default(), ffi::rdma_cm_id::default());
        listener.context = 7 as *mut _;
        child.context = 7 as *mut _;
        let mut ev = raw_event(ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST, &mut child);
        ev.listen_id = &mut listener;
        let data = [1u8, 2, 3, 0, 0];
        ev.param.conn = ffi::rdma_conn_param {
            private_data: data.as_ptr().cast(),
            private_data_len: 5,
            qp_num: 0x42,
            responder_resources: 4,
            ..Default::default()
        };
        // SAFETY: the ids and the data outlive the call.
        let got = unsafe { EventData::capture(&ev) };
        assert_eq!((got.kind, got.target, got.private_data.as_slice()), (CmEventKind::ConnectRequest, 7, &data[..]));
        match got.params {
            Params::Conn(c) => assert_eq!((c.qp_num, c.responder_resources), (0x42, 4)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_rejection_becomes_an_error_with_its_reason_and_data() {
        let mut id = ffi::rdma_cm_id { context: 3 as *mut _, ..Default::default() };
        let mut ev = raw_event(ffi::rdma_cm_event_type::RDMA_CM_EVENT_REJECTED, &mut id);
        ev.status = 28;
        let data = *b"busy";
        ev.param.conn =
            ffi::rdma_conn_param { private_data: data.as_ptr().cast(), private_data_len: 4, ..Default::default() };
        // SAFETY: the id and the data outlive the call.
        let event = CmEvent { data: unsafe { EventData::capture(&ev) }, request: None };
        assert_eq!(event.reject_reason(), Some(RejectReason::ConsumerDefined));
        match event.into_error(Verb::Connect, CmEventKind::Established) {
            Error::Rejected { status, private_data, reason, .. } => {
                assert_eq!((status, private_data.as_slice()), (28, &b"busy"[..]));
                assert!(reason.contains("application"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn multicast_events_copy_no_private_data() {
        let mut id = ffi::rdma_cm_id::default();
        let mut ev = raw_event(ffi::rdma_cm_event_type::RDMA_CM_EVENT_MULTICAST_JOIN, &mut id);
        // librdmacm puts a user pointer there, with no meaningful length.
        ev.param.ud.private_data = 0x1000 as *const _;
        ev.param.ud.private_data_len = 200;
        // SAFETY: the pointer is never followed for multicast events.
        assert!(unsafe { EventData::capture(&ev) }.private_data.is_empty());
    }
}
