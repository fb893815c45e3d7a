//! CM ids (`struct rdma_cm_id`): one endpoint, a listener or one side of a connection.

use std::ffi::{c_int, c_void};
use std::fmt;
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::addr::{self, SockAddr};
use super::channel::{ChannelInner, EventChannel};
use super::event::{CmEvent, CmEventKind, ConnectRequest};
use super::{check_private_data, ConnParam, PortSpace, PrivateDataOp};
use crate::context::Context;
use crate::conv;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::destroy_shared;
use crate::qp::{Creator, QueuePair, QueuePairBuilder};

/// Added to the CM's own timeout of a resolution when waiting for its event, so that the
/// CM's verdict (with its errno) normally arrives before our deadline.
const RESOLVE_GRACE: Duration = Duration::from_secs(1);

static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

/// A number no other id of this process has had: stored in `id->context`, it says which
/// id an event is about without trusting a pointer that may have been reused.
pub(super) fn next_serial() -> u64 {
    NEXT_SERIAL.fetch_add(1, Ordering::Relaxed)
}

/// The new id of a connection request, not yet handed to anyone: destroyed (so rejected
/// by the kernel) unless [`CmId::adopt`] takes it.
pub(super) struct ChildId {
    raw: NonNull<ffi::rdma_cm_id>,
    serial: u64,
}

// SAFETY: the id is owned here alone and destroyed once; it moves between threads only
// inside the channel's locked queue.
unsafe impl Send for ChildId {}

impl ChildId {
    /// # Safety
    /// `raw` must be a live id that nothing else destroys, with no event about it
    /// unacknowledged when this is dropped, and dropped under the CM lock or with the
    /// channel exclusively owned.
    pub(super) unsafe fn new(raw: NonNull<ffi::rdma_cm_id>, serial: u64) -> ChildId {
        ChildId { raw, serial }
    }

    pub(super) fn serial(&self) -> u64 {
        self.serial
    }
}

impl Drop for ChildId {
    fn drop(&mut self) {
        // SAFETY: owned, live, and no event is being read (the contract of `new`).
        if unsafe { ffi::rdma_destroy_id(self.raw.as_ptr()) } != 0 {
            log::error!("{}", Error::last_os(Verb::DestroyId));
        }
    }
}

/// A CM id: one endpoint, a listener or one side of a connection, through the RDMA
/// connection manager (librdmacm): addresses and ports instead of QP numbers and GIDs,
/// as with TCP sockets.
///
/// An [`EventChannel`] carries the events of the ids made on it. The client resolves the
/// server's IP address to a device and a path, makes its QP through the id, and connects;
/// the server binds, listens, takes each request as a new id, makes its QP and accepts.
/// Both may send up to a few dozen bytes of private data with the handshake, and the
/// server may reject instead, with a reason.
///
/// A client and its server (on a thread here). rdma_cm works with the IP address of the
/// netdev under the RDMA device, not with 127.0.0.1 (this example is
/// `tests/device/doc/cm_client.rs`, which the device tests run with the address of the
/// test bed's rxe device in `RDMA_IP`):
///
#[doc = concat!("```no_run\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/device/doc/cm_client.rs")), "```")]
///
/// # Events and their acknowledgement
///
/// librdmacm hands out events that must be acknowledged (`rdma_ack_cm_event`), and an id
/// cannot be destroyed while an event about it is unacknowledged. This crate copies an
/// event (kind, status, private data, the peer's parameters) into a [`CmEvent`] and
/// acknowledges it at once, before anyone sees it: a `CmEvent` is plain data and never
/// holds up a destroy. Events read for one id while another id's caller is waiting are
/// queued in the channel until that id asks; a connection request carries its new id,
/// which is rejected and destroyed if nobody takes it.
///
/// Every wait has a timeout and ends with [`Error::Timeout`](crate::Error::Timeout). The
/// channel's descriptor is non-blocking and can go into an event loop
/// ([`AsRawFd`](std::os::fd::AsRawFd)), with [`EventChannel::try_next_event`] on
/// readiness. To await instead of wait, on any executor: [`AsyncCmId`](crate::AsyncCmId)
/// (an id with a channel of its own, so each connection's task awaits only its own events)
/// and [`AsyncEventChannel`](crate::AsyncEventChannel) (every event of a channel).
///
/// # Lifetimes and teardown
///
/// An id holds its channel. A QP made through the id ([`CmId::create_qp`]) holds the id,
/// and so do a [`Context`] from [`CmId::context`] and everything made from that context.
/// So the order librdmacm requires (QP before id, id before channel, every event
/// acknowledged before its id goes) holds whatever order the handles are dropped in, and
/// the id is destroyed (`rdma_destroy_id`) when this handle and those are all gone.
/// librdmacm also changes the state of an id's QP itself (on accept, on the connect
/// response, on disconnect): a lock of the channel keeps that from racing with the QP's
/// destruction.
///
/// # librdmacm keeps the device context open until the process exits
///
/// librdmacm opens a device's context (`ibv_open_device`) the first time one of its ids
/// binds to that device (resolving or binding an address), and does not close it when the
/// last id on that device goes: it frees only its protection domain then. The context
/// stays open until librdmacm is unloaded, in practice until the process exits (newer
/// releases also close it when the device is removed from the system and no id uses it).
/// Destroying every id and channel and dropping every handle of this crate does not close
/// it, and nothing in librdmacm's API does. So after the first rdma_cm use the device
/// counts one context more than before (`rdma resource show`: ctx + 1); later use opens
/// no further context for that device. A leak check must take its snapshot after the
/// first use, as this crate's device tests do (`tests/device/cm.rs`: `cm_leak_check`, and
/// `librdmacm_keeps_one_device_context_open_from_its_first_use_to_the_end_of_the_process`).
/// An open context also holds the device: on rxe, `rdma link delete` of it waits until
/// the process exits.
#[doc(alias = "rdma_cm_id")]
pub struct CmId {
    pub(crate) inner: Arc<CmIdInner>,
}

pub(crate) struct CmIdInner {
    raw: NonNull<ffi::rdma_cm_id>,
    serial: u64,
    ps: PortSpace,
    channel: Arc<ChannelInner>,
    /// Set by [`CmId::destroy`], so that Drop does not destroy twice.
    destroyed: AtomicBool,
}

// SAFETY: the id is owned here and destroyed once. Every librdmacm call on it, and every
// access to its fields, runs under the channel's CM lock, including librdmacm's own
// processing of its events; so no two threads touch its C state at once.
unsafe impl Send for CmIdInner {}
// SAFETY: see Send.
unsafe impl Sync for CmIdInner {}

impl CmIdInner {
    /// Destroys the id under the CM lock: every event read about it has been acknowledged
    /// by then (that happens under the lock too), so `rdma_destroy_id` does not wait.
    fn destroy_now(&self) -> Result<()> {
        if self.destroyed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let mut st = self.channel.lock();
        st.purge(self.serial);
        // SAFETY: the id is live and destroyed once (the flag above); the QP made through
        // it, which holds this struct, is gone.
        let rc = unsafe { ffi::rdma_destroy_id(self.raw.as_ptr()) };
        let result = conv::rc(Verb::DestroyId, rc);
        drop(st);
        result
    }
}

impl Drop for CmIdInner {
    fn drop(&mut self) {
        if let Err(e) = self.destroy_now() {
            log::error!("{e}");
        }
    }
}

/// Ties a QP made through a CM id to it: dropped (by the QP, just before it is destroyed)
/// it takes the QP off the id under the CM lock, as `rdma_destroy_qp` would, so that
/// librdmacm never reaches a destroyed QP. The QP also holds the id ([`CmQpLink::id`])
/// until after it is destroyed, so the id outlives the QP.
struct CmQpLink {
    id: Arc<CmIdInner>,
    qp: *mut ffi::ibv_qp,
    /// `id->pd` before the QP was made (librdmacm's own PD): put back, so that the id
    /// never points at a PD that may be gone.
    pd: *mut ffi::ibv_pd,
}

// SAFETY: the pointers are only compared and written under the CM lock.
unsafe impl Send for CmQpLink {}
// SAFETY: see Send.
unsafe impl Sync for CmQpLink {}

impl CmQpLink {
    /// The id, for the QP to hold until after it is destroyed.
    fn id(&self) -> Arc<dyn Send + Sync> {
        Arc::clone(&self.id) as Arc<dyn Send + Sync>
    }
}

impl Drop for CmQpLink {
    fn drop(&mut self) {
        let _cm = self.id.channel.lock();
        let id = self.id.raw.as_ptr();
        // SAFETY: the id is alive (held) and its fields are only touched under the lock.
        unsafe {
            if (*id).qp == self.qp {
                (*id).qp = ptr::null_mut();
                (*id).pd = self.pd;
            }
        }
    }
}

/// The hint of a failed address resolution.
pub(super) fn resolve_addr_hint(e: Error, dst: SocketAddr) -> Error {
    match e {
        Error::Verb { .. } => e.with_hint(format!(
            "no route to {} through an RDMA device: for RoCE, use the IP of a netdev under an \
             RDMA device (not 127.0.0.1 unless the device sits on lo)",
            dst.ip()
        )),
        other => other,
    }
}

/// Added to the CM's own timeout of a resolution when waiting for its event (see
/// [`RESOLVE_GRACE`]).
pub(super) fn resolve_wait(timeout: Duration) -> Duration {
    timeout + RESOLVE_GRACE
}

/// Milliseconds for librdmacm: at least 1, at most what fits in a C int.
fn millis(timeout: Duration) -> c_int {
    c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX).max(1)
}

impl CmId {
    /// Makes an id on `channel` in port space `ps` (`rdma_create_id`).
    #[doc(alias = "rdma_create_id")]
    pub fn new(channel: &EventChannel, ps: PortSpace) -> Result<CmId> {
        let serial = next_serial();
        let mut raw = ptr::null_mut();
        // SAFETY: the channel is live; `raw` is a valid out-pointer; the context value is
        // the serial, never dereferenced.
        let rc =
            unsafe { ffi::rdma_create_id(channel.as_raw(), &mut raw, serial as usize as *mut c_void, ps.to_ffi()) };
        conv::rc(Verb::CreateId, rc)?;
        let raw = NonNull::new(raw).ok_or_else(|| Error::verb(Verb::CreateId, libc::EIO))?;
        Ok(CmId {
            inner: Arc::new(CmIdInner {
                raw,
                serial,
                ps,
                channel: Arc::clone(&channel.inner),
                destroyed: AtomicBool::new(false),
            }),
        })
    }

    /// Wraps the new id of a connection request.
    pub(super) fn adopt(child: ChildId, channel: &Arc<ChannelInner>) -> CmId {
        let child = ManuallyDrop::new(child);
        // SAFETY: the id is alive (owned by `child`); ps is set at creation.
        let ps = match unsafe { (*child.raw.as_ptr()).ps } {
            ffi::rdma_port_space::RDMA_PS_UDP => PortSpace::Udp,
            _ => PortSpace::Tcp,
        };
        CmId {
            inner: Arc::new(CmIdInner {
                raw: child.raw,
                serial: child.serial,
                ps,
                channel: Arc::clone(channel),
                destroyed: AtomicBool::new(false),
            }),
        }
    }

    pub(super) fn serial(&self) -> u64 {
        self.inner.serial
    }

    /// Whether only this id holds its channel (no handle of it and no other id on it),
    /// so that no other id's events arrive there.
    pub(super) fn has_channel_alone(&self) -> bool {
        Arc::strong_count(&self.inner.channel) == 1
    }

    /// The raw pointer, valid while `self` lives. Calling librdmacm on it behind this
    /// crate's back bypasses the CM lock: don't, while other threads use the id.
    pub fn as_raw(&self) -> *mut ffi::rdma_cm_id {
        self.inner.raw.as_ptr()
    }

    /// The port space it was made in.
    pub fn port_space(&self) -> PortSpace {
        self.inner.ps
    }

    /// The channel its events arrive on.
    pub fn channel(&self) -> EventChannel {
        EventChannel { inner: Arc::clone(&self.inner.channel) }
    }

    /// Runs `f` on the raw id under the CM lock.
    pub(super) fn locked<T>(&self, f: impl FnOnce(*mut ffi::rdma_cm_id) -> T) -> T {
        let _cm = self.inner.channel.lock();
        f(self.as_raw())
    }

    /// The verbs context librdmacm bound the id to, or NULL.
    pub(super) fn verbs(&self) -> *mut ffi::ibv_context {
        // SAFETY: the id is live; its fields are read under the CM lock.
        self.locked(|id| unsafe { (*id).verbs })
    }

    /// Whether the id's device speaks the InfiniBand transport (InfiniBand and RoCE),
    /// whose CM messages bound the private data. Unbound ids count as InfiniBand.
    pub(super) fn ib_transport(&self) -> bool {
        let verbs = self.verbs();
        if verbs.is_null() {
            return true;
        }
        // SAFETY: a bound id's context stays open while the id lives; `device` is set
        // when the context is opened.
        unsafe { (*(*verbs).device).transport_type == ffi::ibv_transport_type::IBV_TRANSPORT_IB }
    }

    /// The local address: what it was bound to, or what resolution chose (`None` before
    /// either). After binding to port 0, this names the port the kernel picked.
    #[doc(alias = "rdma_get_src_port")]
    #[doc(alias = "rdma_get_local_addr")]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id is live and read under the CM lock; the source address is a
        // sockaddr_storage inside the id.
        self.locked(|id| unsafe { addr::from_ffi(ptr::addr_of!((*id).route.addr.__bindgen_anon_1.src_addr)) })
    }

    /// The peer's address (`None` before address resolution or a connection request).
    #[doc(alias = "rdma_get_dst_port")]
    #[doc(alias = "rdma_get_peer_addr")]
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as for local_addr, the destination address.
        self.locked(|id| unsafe { addr::from_ffi(ptr::addr_of!((*id).route.addr.__bindgen_anon_2.dst_addr)) })
    }

    /// The device port the id is bound to (`None` while it is bound to no device).
    pub fn port_num(&self) -> Option<u8> {
        // SAFETY: the id is live; its fields are read under the CM lock.
        self.locked(|id| unsafe { (!(*id).verbs.is_null()).then_some((*id).port_num) })
    }

    /// Binds the id to a local address and port (`rdma_bind_addr`): an address of a
    /// netdev under an RDMA device, or the wildcard address; port 0 picks a free port
    /// ([`local_addr`](Self::local_addr) tells which). A port another id holds on that
    /// address fails with `EADDRINUSE`.
    #[doc(alias = "rdma_bind_addr")]
    pub fn bind(&self, addr: SocketAddr) -> Result<()> {
        let mut sa = SockAddr::new(addr);
        // SAFETY: the id is live; `sa` is a valid sockaddr for the call.
        let rc = self.locked(|id| conv::rc(Verb::BindAddr, unsafe { ffi::rdma_bind_addr(id, sa.as_ffi()) }));
        rc.map_err(|e| match e.errno() {
            Some(libc::EADDRINUSE) => e.with_hint(format!(
                "port {} on {} is taken by another rdma_cm id (of this process or another): \
                 pick another port, or port 0 for a free one",
                addr.port(),
                addr.ip()
            )),
            Some(libc::EADDRNOTAVAIL | libc::ENODEV) => e.with_hint(format!(
                "no RDMA device has the address {}: use the IP of a netdev under an RDMA device \
                 (for rxe, the netdev it was added on), or the wildcard address",
                addr.ip()
            )),
            Some(libc::EINVAL) => e.with_hint("the id is already bound, or the address family is not IPv4/IPv6"),
            _ => e,
        })
    }

    /// Starts listening for connection requests (`rdma_listen`), at most `backlog`
    /// pending (0: the kernel's default). Take them with [`get_request`](Self::get_request).
    #[doc(alias = "rdma_listen")]
    pub fn listen(&self, backlog: u32) -> Result<()> {
        let backlog = c_int::try_from(backlog).unwrap_or(c_int::MAX);
        // SAFETY: the id is live.
        let rc = self.locked(|id| conv::rc(Verb::Listen, unsafe { ffi::rdma_listen(id, backlog) }));
        rc.map_err(|e| match e.errno() {
            Some(libc::EADDRINUSE) => {
                e.with_hint("another rdma_cm id already listens on this port and address (or on the wildcard address)")
            }
            _ => e,
        })
    }

    /// Resolves `dst` to a local device, port and source address (`rdma_resolve_addr`),
    /// waiting for the result: librdmacm gives up after `timeout` (an error with
    /// ETIMEDOUT), and this returns [`Error::Timeout`] if nothing came a second later.
    /// `src` picks the local address; `None` lets the routing table choose.
    ///
    /// After a timeout the resolution may still finish later; its event is then queued for
    /// this id. Drop the id rather than reuse it.
    #[doc(alias = "rdma_resolve_addr")]
    pub fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr, timeout: Duration) -> Result<()> {
        const VERB: Verb = Verb::ResolveAddr;
        self.start_resolve_addr(src, dst, timeout)?;
        let event = self.expect(CmEventKind::AddrResolved, timeout + RESOLVE_GRACE, VERB);
        event.map(drop).map_err(|e| resolve_addr_hint(e, dst))
    }

    /// `rdma_resolve_addr` without the wait: its event comes later.
    pub(super) fn start_resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr, timeout: Duration) -> Result<()> {
        const VERB: Verb = Verb::ResolveAddr;
        let mut src = src.map(SockAddr::new);
        let mut dst_c = SockAddr::new(dst);
        let src_ptr = src.as_mut().map_or(ptr::null_mut(), SockAddr::as_ffi);
        let rc = self.locked(|id| {
            // SAFETY: the id is live; the addresses are valid sockaddrs for the call.
            let rc = unsafe { ffi::rdma_resolve_addr(id, src_ptr, dst_c.as_ffi(), millis(timeout)) };
            conv::rc(VERB, rc)
        });
        rc.map_err(|e| match e.errno() {
            Some(libc::EINVAL) => {
                e.with_hint("the id is already resolved or listening, or the address is not IPv4/IPv6")
            }
            _ => e,
        })
    }

    /// Resolves the path to the destination (`rdma_resolve_route`), after
    /// [`resolve_addr`](Self::resolve_addr), waiting as it does.
    #[doc(alias = "rdma_resolve_route")]
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        self.start_resolve_route(timeout)?;
        self.expect(CmEventKind::RouteResolved, timeout + RESOLVE_GRACE, Verb::ResolveRoute).map(drop)
    }

    /// `rdma_resolve_route` without the wait.
    pub(super) fn start_resolve_route(&self, timeout: Duration) -> Result<()> {
        const VERB: Verb = Verb::ResolveRoute;
        if self.verbs().is_null() {
            return Err(Error::invalid(VERB, "the address is not resolved: call resolve_addr() first"));
        }
        // SAFETY: the id is live and bound to a device.
        self.locked(|id| conv::rc(VERB, unsafe { ffi::rdma_resolve_route(id, millis(timeout)) }))
    }

    /// The device context librdmacm bound the id to: allocate the PD, CQs and memory
    /// regions of the id's QP here. The context belongs to librdmacm and is never closed
    /// by this crate; the handle holds the id (and so librdmacm's reference on the
    /// device) until it and everything made from it are gone. Each call makes a new
    /// handle on the same device context: call it once and clone.
    ///
    /// Fails until the id is bound to a device: on the client after
    /// [`resolve_addr`](Self::resolve_addr), on the server for the id of a request (a
    /// listener on the wildcard address has no device).
    pub fn context(&self) -> Result<Context> {
        let verbs = NonNull::new(self.verbs()).ok_or_else(|| {
            Error::invalid(
                Verb::CmContext,
                "the id is bound to no device yet: resolve_addr() on the client, or use the id of a \
                 connection request on the server (a listener on the wildcard address has none)",
            )
        })?;
        let keep: Arc<dyn Send + Sync> = Arc::clone(&self.inner) as Arc<dyn Send + Sync>;
        // SAFETY: the id's context stays open while the id lives, and `keep` holds the id.
        unsafe { Context::borrowed(verbs, keep) }
    }

    /// Makes the id's QP from `builder` (`rdma_create_qp_ex`): the builder's PD must come
    /// from [`context`](Self::context), its QP type must be the port space's (RC for
    /// [`PortSpace::Tcp`], UD for [`PortSpace::Udp`]). librdmacm moves it to INIT (UD:
    /// to RTS) and, on connect and accept, on to RTS; the safe data path works on it as
    /// on any QP. It holds the id; one QP per id.
    #[doc(alias = "rdma_create_qp")]
    #[doc(alias = "rdma_create_qp_ex")]
    pub fn create_qp(&self, builder: QueuePairBuilder<'_>) -> Result<QueuePair> {
        const VERB: Verb = Verb::CmCreateQp;
        let want = self.inner.ps.qp_type();
        builder.build_with(VERB, |attr| {
            if attr.qp_type != want.to_ffi() {
                return Err(Error::invalid(
                    VERB,
                    format!(
                        "an id of port space {:?} connects {want} QPs, not {:?}",
                        self.inner.ps,
                        crate::qp::QpType::from_ffi(attr.qp_type)
                    ),
                ));
            }
            let _cm = self.inner.channel.lock();
            let id = self.as_raw();
            // SAFETY: the id is live and its fields are read under the CM lock; `attr.pd`
            // is the builder's live PD.
            let (verbs, has_qp, pd_ctx, pd) =
                unsafe { ((*id).verbs, !(*id).qp.is_null(), (*attr.pd).context, (*id).pd) };
            if verbs.is_null() {
                return Err(Error::invalid(VERB, "the id is bound to no device yet: resolve its address first"));
            }
            if pd_ctx != verbs {
                return Err(Error::invalid(
                    VERB,
                    "the PD belongs to another device context: allocate it on the id's context()",
                ));
            }
            if has_qp {
                return Err(Error::invalid(VERB, "the id already has a QP: one QP per id"));
            }
            // SAFETY: the id is live, under the CM lock; `attr` names a live PD and CQs of
            // the id's context (checked above and by the builder) and is valid to write.
            let rc = unsafe { ffi::rdma_create_qp_ex(id, attr) };
            conv::rc(VERB, rc)?;
            // SAFETY: as above; rdma_create_qp_ex set `qp` on success.
            let qp = NonNull::new(unsafe { (*id).qp }).ok_or_else(|| Error::verb(VERB, libc::EIO))?;
            let link = CmQpLink { id: Arc::clone(&self.inner), qp: qp.as_ptr(), pd };
            Ok((qp, Some(Creator { keep: link.id(), detach: Box::new(link) })))
        })
    }

    pub(super) fn conn_param(&self, verb: Verb, p: &ConnParam<'_>, op: PrivateDataOp) -> Result<ffi::rdma_conn_param> {
        check_private_data(verb, p.private_data, self.inner.ps, op, self.ib_transport())?;
        for (name, v) in [("retry_count", p.retry_count), ("rnr_retry_count", p.rnr_retry_count)] {
            if v > 7 {
                return Err(Error::invalid(verb, format!("{name} {v} is above its maximum 7")));
            }
        }
        let max = ffi::RDMA_MAX_RESP_RES.0 as u8;
        Ok(ffi::rdma_conn_param {
            private_data: if p.private_data.is_empty() { ptr::null() } else { p.private_data.as_ptr().cast() },
            // Checked above: at most 255.
            private_data_len: p.private_data.len() as u8,
            responder_resources: p.responder_resources.unwrap_or(max),
            initiator_depth: p.initiator_depth.unwrap_or(ffi::RDMA_MAX_INIT_DEPTH.0 as u8),
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            ..Default::default()
        })
    }

    pub(super) fn require_qp(&self, verb: Verb) -> Result<()> {
        // SAFETY: the id is live; its fields are read under the CM lock.
        if self.locked(|id| unsafe { (*id).qp.is_null() }) {
            return Err(Error::invalid(verb, "the id has no QP: make it with create_qp() first"));
        }
        Ok(())
    }

    /// Connects to the resolved destination (`rdma_connect`) and waits at most `timeout`
    /// for the outcome: the [`CmEventKind::Established`] event, with the server's private
    /// data. The id's QP (from [`create_qp`](Self::create_qp)) is in RTS then: post its
    /// receives before, since the server may send at once.
    ///
    /// A rejection is [`Error::Rejected`] with the reason and the server's private data:
    /// [`RejectReason::InvalidServiceId`](super::RejectReason::InvalidServiceId) when
    /// nothing listens on the port. After a timeout, drop the id.
    #[doc(alias = "rdma_connect")]
    pub fn connect(&self, param: &ConnParam<'_>, timeout: Duration) -> Result<CmEvent> {
        self.start_connect(param)?;
        self.expect(CmEventKind::Established, timeout, Verb::Connect)
    }

    /// `rdma_connect` without the wait.
    pub(super) fn start_connect(&self, param: &ConnParam<'_>) -> Result<()> {
        const VERB: Verb = Verb::Connect;
        if self.verbs().is_null() {
            return Err(Error::invalid(VERB, "the route is not resolved: resolve_addr() and resolve_route() first"));
        }
        self.require_qp(VERB)?;
        let mut c = self.conn_param(VERB, param, PrivateDataOp::Connect)?;
        // SAFETY: the id is live, under the CM lock; `c` and its private data are valid
        // for the call (librdmacm copies them).
        let rc = self.locked(|id| conv::rc(VERB, unsafe { ffi::rdma_connect(id, &mut c) }));
        rc.map_err(|e| match e.errno() {
            Some(libc::EINVAL) => e.with_hint(
                "the route is not resolved, the id is already connecting, or responder_resources / \
                 initiator_depth exceed the device's limits",
            ),
            _ => e,
        })
    }

    /// Waits at most `timeout` for a connection request on this listener and returns it
    /// with its new id. Other events of the listener are errors.
    #[doc(alias = "rdma_get_request")]
    pub fn get_request(&self, timeout: Duration) -> Result<ConnectRequest> {
        let event = self.expect(CmEventKind::ConnectRequest, timeout, Verb::GetCmEvent)?;
        ConnectRequest::from_event(event)
    }

    /// Accepts the connection request this id came with (`rdma_accept`): librdmacm
    /// moves the id's QP to RTR and RTS and answers with `param`'s private data. For RC
    /// it then waits at most `timeout` for [`CmEventKind::Established`]; a UD accept
    /// ends at once.
    #[doc(alias = "rdma_accept")]
    pub fn accept(&self, param: &ConnParam<'_>, timeout: Duration) -> Result<()> {
        if !self.start_accept(param)? {
            return Ok(());
        }
        self.expect(CmEventKind::Established, timeout, Verb::Accept).map(drop)
    }

    /// `rdma_accept` without the wait: whether an ESTABLISHED event is to come (RC).
    pub(super) fn start_accept(&self, param: &ConnParam<'_>) -> Result<bool> {
        const VERB: Verb = Verb::Accept;
        self.require_qp(VERB)?;
        let mut c = self.conn_param(VERB, param, PrivateDataOp::Accept)?;
        // SAFETY: the id is live, under the CM lock; `c` is valid for the call.
        let rc = self.locked(|id| conv::rc(VERB, unsafe { ffi::rdma_accept(id, &mut c) }));
        rc.map_err(|e| match e.errno() {
            Some(libc::EINVAL) => e.with_hint(
                "the id is not a connection request's, or responder_resources / initiator_depth exceed \
                 the device's limits",
            ),
            _ => e,
        })?;
        Ok(self.inner.ps != PortSpace::Udp)
    }

    /// Rejects the connection request this id came with (`rdma_reject`): the peer sees
    /// [`Error::Rejected`] with reason
    /// [`ConsumerDefined`](super::RejectReason::ConsumerDefined) and these bytes (at most
    /// 148 on InfiniBand and RoCE, 136 for UD).
    #[doc(alias = "rdma_reject")]
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        const VERB: Verb = Verb::Reject;
        check_private_data(VERB, private_data, self.inner.ps, PrivateDataOp::Reject, self.ib_transport())?;
        let data = if private_data.is_empty() { ptr::null() } else { private_data.as_ptr().cast() };
        // The length fits: checked above (at most 255).
        let len = private_data.len() as u8;
        // SAFETY: the id is live, under the CM lock; the data is valid for the call.
        self.locked(|id| conv::rc(VERB, unsafe { ffi::rdma_reject(id, data, len) }))
    }

    /// Disconnects (`rdma_disconnect`): the QP goes to the error state (outstanding work
    /// requests complete with a flush error), the peer gets
    /// [`CmEventKind::Disconnected`], and so does this side once the peer answers.
    #[doc(alias = "rdma_disconnect")]
    pub fn disconnect(&self) -> Result<()> {
        const VERB: Verb = Verb::Disconnect;
        // SAFETY: the id is live, under the CM lock (librdmacm changes the QP's state).
        let rc = self.locked(|id| conv::rc(VERB, unsafe { ffi::rdma_disconnect(id) }));
        rc.map_err(|e| match e.errno() {
            Some(libc::EINVAL) => e.with_hint("the id is not connected (or is bound to no device)"),
            _ => e,
        })
    }

    /// Joins the IP multicast group `group` (`rdma_join_multicast`) and waits at most
    /// `timeout` for the join to complete ([`CmEventKind::MulticastJoin`]): returns how to
    /// send to the group (its address handle attributes, the multicast QP number
    /// [`MULTICAST_QPN`](crate::MULTICAST_QPN) and the group's Q_Key). On RoCE the kernel
    /// also joins the IP group on the netdev (IGMP). A UD id (port space
    /// [`PortSpace::Udp`](super::PortSpace::Udp) or `Ipoib`) bound to a device first
    /// ([`bind`](Self::bind) to a local address, or [`resolve_addr`](Self::resolve_addr));
    /// when the id has a QP ([`create_qp`](Self::create_qp)), librdmacm attaches it to the
    /// group as the join completes, so its receive queue gets the group's datagrams until
    /// [`leave_multicast`](Self::leave_multicast) (or the id's destruction, which leaves
    /// every group it joined).
    ///
    /// Refused before the call: an id of a connected port space, an id bound to no device,
    /// an address that is not multicast.
    #[doc(alias = "rdma_join_multicast")]
    pub fn join_multicast(&self, group: std::net::IpAddr, timeout: Duration) -> Result<super::UdInfo> {
        const VERB: Verb = Verb::JoinMulticast;
        self.multicast_checks(VERB, group)?;
        let mut addr = SockAddr::new(SocketAddr::new(group, 0));
        // SAFETY: the id is live and bound to a device; the address is a valid sockaddr for
        // the call (librdmacm copies it); no user context.
        let rc = self.locked(|id| unsafe { ffi::rdma_join_multicast(id, addr.as_ffi(), ptr::null_mut()) });
        conv::rc(VERB, rc)?;
        let event = self.expect(CmEventKind::MulticastJoin, timeout + RESOLVE_GRACE, VERB)?;
        event.ud().ok_or_else(|| Error::invalid(VERB, "the MULTICAST_JOIN event carried no UD parameters"))
    }

    /// Leaves the multicast group `group` joined by [`join_multicast`](Self::join_multicast)
    /// (`rdma_leave_multicast`): the id's QP is detached from it (no more of its
    /// datagrams arrive), and on RoCE the netdev leaves the IP group.
    #[doc(alias = "rdma_leave_multicast")]
    pub fn leave_multicast(&self, group: std::net::IpAddr) -> Result<()> {
        const VERB: Verb = Verb::LeaveMulticast;
        self.multicast_checks(VERB, group)?;
        let mut addr = SockAddr::new(SocketAddr::new(group, 0));
        // SAFETY: as for the join.
        let rc = self.locked(|id| unsafe { ffi::rdma_leave_multicast(id, addr.as_ffi()) });
        conv::rc(VERB, rc).map_err(|e| match e.errno() {
            Some(libc::EADDRNOTAVAIL) => e.with_hint("this id has not joined that group"),
            _ => e,
        })
    }

    /// What a join or leave needs, checked before C: a UD id bound to a device, a
    /// multicast address.
    pub(super) fn multicast_checks(&self, verb: Verb, group: std::net::IpAddr) -> Result<()> {
        if self.port_space().qp_type() != crate::QpType::Ud {
            return Err(Error::invalid(verb, "multicast is for UD ids (PortSpace::Udp or Ipoib), not connected ones"));
        }
        if !group.is_multicast() {
            return Err(Error::invalid(verb, format!("{group} is not a multicast address")));
        }
        if self.verbs().is_null() {
            return Err(Error::invalid(
                verb,
                "the id is bound to no device: bind() it to a local address (or resolve_addr()) first",
            ));
        }
        Ok(())
    }

    /// Waits at most `timeout` for the next event about this id (for a listener:
    /// connection requests among them).
    #[doc(alias = "rdma_get_cm_event")]
    pub fn next_event(&self, timeout: Duration) -> Result<CmEvent> {
        let serial = self.inner.serial;
        self.inner.channel.wait(|d| d.target == serial, timeout, Verb::GetCmEvent)
    }

    /// The next event of this id, which must be `kind`: any other becomes the error it
    /// stands for.
    pub(super) fn expect(&self, kind: CmEventKind, timeout: Duration, verb: Verb) -> Result<CmEvent> {
        let serial = self.inner.serial;
        let event = self.inner.channel.wait(|d| d.target == serial, timeout, verb)?;
        event.expect(kind, verb)
    }

    /// Moves the id onto `to` (`rdma_migrate_id`), with the events about it that the old
    /// channel has read and not handed out: from now on its events arrive on `to`. Only
    /// while nothing else holds the id (no QP or context made from it yet), and not for a
    /// listener with connection requests queued (their new ids stay on the old channel).
    pub(super) fn migrate(&mut self, to: &EventChannel) -> Result<()> {
        const VERB: Verb = Verb::MigrateId;
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            return Err(Error::invalid(
                VERB,
                "the id is shared (a QP or a context made from it holds it): give it a channel of \
                 its own before making its QP",
            ));
        };
        if Arc::ptr_eq(&inner.channel, &to.inner) {
            return Ok(());
        }
        let old = Arc::clone(&inner.channel);
        // Both locks: nobody reads either channel meanwhile. `to` is one this crate just
        // made, which nobody else locks, so the order cannot deadlock.
        let mut from = old.lock();
        let mut into = to.inner.lock();
        if from.has_requests_for(inner.serial) {
            return Err(Error::invalid(VERB, "connection requests to this listener are queued on its channel"));
        }
        // SAFETY: the id and both channels are live; every event read about the id has
        // been acknowledged (under the lock, which we hold), so this does not wait.
        let rc = unsafe { ffi::rdma_migrate_id(inner.raw.as_ptr(), to.as_raw()) };
        conv::rc(VERB, rc)?;
        from.move_events(&mut into, inner.serial);
        drop((from, into));
        inner.channel = Arc::clone(&to.inner);
        Ok(())
    }

    /// Destroys the id now and reports the result (`rdma_destroy_id`). Fails with EBUSY,
    /// destroying nothing yet, while its QP or a context from it is alive. Queued events
    /// about it are dropped (and the ids of unclaimed connection requests destroyed).
    #[doc(alias = "rdma_destroy_id")]
    pub fn destroy(self) -> Result<()> {
        destroy_shared(self.inner, Verb::DestroyId, |inner| inner.destroy_now())
    }
}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId")
            .field("port_space", &self.inner.ps)
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .finish_non_exhaustive()
    }
}
