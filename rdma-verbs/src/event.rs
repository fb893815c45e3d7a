//! The device's asynchronous events. The guide (waiting, acknowledgement) is on
//! [`AsyncEvents`], public, where rustdoc shows it; this module is private.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use crate::c_enum::c_enum;
use crate::context::Context;
use crate::conv;
use crate::error::{Error, Result, Verb};
use crate::ffi;

const VERB: Verb = Verb::GetAsyncEvent;

c_enum! {
    /// What happened (`enum ibv_event_type`).
    #[doc(alias = "ibv_event_type")]
    AsyncEventKind: u32 {
        /// A CQ overran or hit an error; the CQ is unusable.
        CqErr = ffi::ibv_event_type::IBV_EVENT_CQ_ERR.0,
        /// A QP hit an error that stopped it (moved to the error state).
        QpFatal = ffi::ibv_event_type::IBV_EVENT_QP_FATAL.0,
        /// A QP received an invalid request (transport error on the responder side).
        QpReqErr = ffi::ibv_event_type::IBV_EVENT_QP_REQ_ERR.0,
        /// A QP was refused access (bad rkey, access rights) on the responder side.
        QpAccessErr = ffi::ibv_event_type::IBV_EVENT_QP_ACCESS_ERR.0,
        /// A QP in RTR received its first packet: communication is established.
        CommEst = ffi::ibv_event_type::IBV_EVENT_COMM_EST.0,
        /// A QP in SQD has no more outstanding send work.
        SqDrained = ffi::ibv_event_type::IBV_EVENT_SQ_DRAINED.0,
        /// A QP migrated to its alternate path.
        PathMig = ffi::ibv_event_type::IBV_EVENT_PATH_MIG.0,
        /// Path migration failed.
        PathMigErr = ffi::ibv_event_type::IBV_EVENT_PATH_MIG_ERR.0,
        /// The device failed; every object on it is unusable, close and reopen it.
        DeviceFatal = ffi::ibv_event_type::IBV_EVENT_DEVICE_FATAL.0,
        /// A port became active.
        PortActive = ffi::ibv_event_type::IBV_EVENT_PORT_ACTIVE.0,
        /// A port went down (link down, or the netdev under a RoCE port went down).
        PortErr = ffi::ibv_event_type::IBV_EVENT_PORT_ERR.0,
        /// A port's LID changed (InfiniBand).
        LidChange = ffi::ibv_event_type::IBV_EVENT_LID_CHANGE.0,
        /// A port's P_Key table changed.
        PkeyChange = ffi::ibv_event_type::IBV_EVENT_PKEY_CHANGE.0,
        /// The subnet manager of a port changed (InfiniBand).
        SmChange = ffi::ibv_event_type::IBV_EVENT_SM_CHANGE.0,
        /// An SRQ hit an error; it is unusable.
        SrqErr = ffi::ibv_event_type::IBV_EVENT_SRQ_ERR.0,
        /// An SRQ fell below the limit armed with `ibv_modify_srq`.
        SrqLimitReached = ffi::ibv_event_type::IBV_EVENT_SRQ_LIMIT_REACHED.0,
        /// A QP attached to an SRQ, in the error state, will get no more completions.
        QpLastWqeReached = ffi::ibv_event_type::IBV_EVENT_QP_LAST_WQE_REACHED.0,
        /// The subnet manager asks clients to re-register (InfiniBand).
        ClientReregister = ffi::ibv_event_type::IBV_EVENT_CLIENT_REREGISTER.0,
        /// A port's GID table changed (RoCE: an address was added to or removed from the
        /// netdev).
        GidChange = ffi::ibv_event_type::IBV_EVENT_GID_CHANGE.0,
        /// A WQ hit an error; it is unusable.
        WqFatal = ffi::ibv_event_type::IBV_EVENT_WQ_FATAL.0,
    }
}

impl AsyncEventKind {
    fn target(self) -> Target {
        use AsyncEventKind::*;
        match self {
            CqErr => Target::Cq,
            QpFatal | QpReqErr | QpAccessErr | CommEst | SqDrained | PathMig | PathMigErr | QpLastWqeReached => {
                Target::Qp
            }
            SrqErr | SrqLimitReached => Target::Srq,
            WqFatal => Target::Wq,
            PortActive | PortErr | LidChange | PkeyChange | SmChange | ClientReregister | GidChange => Target::Port,
            DeviceFatal => Target::Device,
            Unknown(_) => Target::Unknown,
        }
    }
}

enum Target {
    Device,
    Port,
    Qp,
    Cq,
    Srq,
    Wq,
    Unknown,
}

/// What an event is about. Objects are identified by value (a QP number, the address
/// of the C object), never by a reference: compare `addr` with the object's `as_raw()`
/// (`cq.as_raw() as usize`). The address may be reused once the object is destroyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventSource {
    /// The device as a whole.
    Device,
    /// A port, numbered from 1.
    Port(u8),
    /// A queue pair.
    Qp {
        /// The QP number.
        qp_num: u32,
        /// The address of the `struct ibv_qp`.
        addr: usize,
    },
    /// A completion queue.
    Cq {
        /// The address of the `struct ibv_cq`.
        addr: usize,
    },
    /// A shared receive queue.
    Srq {
        /// The address of the `struct ibv_srq`.
        addr: usize,
    },
    /// A work queue.
    Wq {
        /// The WQ number.
        wq_num: u32,
        /// The address of the `struct ibv_wq`.
        addr: usize,
    },
    /// An event kind this crate does not know: the raw contents of the element union.
    Unknown {
        /// The union's bits, as a pointer-sized integer.
        raw: usize,
    },
}

/// One asynchronous event, copied out of the C event and already acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncEventKind,
    /// What it happened to.
    pub source: EventSource,
}

impl AsyncEvent {
    /// Copies the event's data out.
    ///
    /// # Safety
    /// `ev` must be an event `ibv_get_async_event` returned and that is not yet
    /// acknowledged, so that the object it points to (if any) is still alive.
    unsafe fn from_raw(ev: &ffi::ibv_async_event) -> AsyncEvent {
        let kind = AsyncEventKind::from_raw(ev.event_type.0);
        let el = ev.element;
        // SAFETY (all union reads below): the event type says which member libibverbs
        // wrote; the union was zeroed before the call, so reading a pointer-sized member
        // of an unknown kind reads initialized bytes. Object pointers are alive until
        // the event is acknowledged (the caller's contract).
        let source = match kind.target() {
            Target::Device => EventSource::Device,
            // SAFETY: see above: port events set port_num.
            Target::Port => EventSource::Port(u8::try_from(unsafe { el.port_num }).unwrap_or(0)),
            Target::Qp => {
                // SAFETY: see above: QP events set qp.
                let qp = unsafe { el.qp };
                // SAFETY: a live QP (not yet acknowledged), or NULL.
                let qp_num = unsafe { qp.as_ref() }.map_or(0, |q| q.qp_num);
                EventSource::Qp { qp_num, addr: qp as usize }
            }
            // SAFETY: see above: CQ events set cq.
            Target::Cq => EventSource::Cq { addr: unsafe { el.cq } as usize },
            // SAFETY: see above: SRQ events set srq.
            Target::Srq => EventSource::Srq { addr: unsafe { el.srq } as usize },
            Target::Wq => {
                // SAFETY: see above: WQ events set wq.
                let wq = unsafe { el.wq };
                // SAFETY: a live WQ (not yet acknowledged), or NULL.
                let wq_num = unsafe { wq.as_ref() }.map_or(0, |w| w.wq_num);
                EventSource::Wq { wq_num, addr: wq as usize }
            }
            // SAFETY: see above: zeroed, then possibly written, pointer-sized bytes.
            Target::Unknown => EventSource::Unknown { raw: unsafe { el.cq } as usize },
        };
        AsyncEvent { kind, source }
    }
}

impl fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.kind)?;
        match self.source {
            EventSource::Device => f.write_str(" on the device"),
            EventSource::Port(p) => write!(f, " on port {p}"),
            EventSource::Qp { qp_num, .. } => write!(f, " on QP {qp_num:#x}"),
            EventSource::Cq { addr } => write!(f, " on CQ at {addr:#x}"),
            EventSource::Srq { addr } => write!(f, " on SRQ at {addr:#x}"),
            EventSource::Wq { wq_num, .. } => write!(f, " on WQ {wq_num:#x}"),
            EventSource::Unknown { raw } => write!(f, " (element {raw:#x})"),
        }
    }
}

/// The asynchronous event queue of a context (`ibv_get_async_event`): port up and down,
/// GID changes, QP and CQ errors, a fatal device error. Holds a clone of the context, so
/// it may live in an event-loop thread of its own. Several handles (and threads) may wait
/// on one context; each event goes to one of them.
///
/// Each open [`Context`] has its own event queue, a file descriptor the kernel makes
/// readable when an event is pending. [`Context::async_events`] returns this handle,
/// which waits on it with `poll(2)` (so a wait can time out) and can be put in an event
/// loop through [`AsRawFd`]. Getting the handle switches the descriptor to non-blocking
/// mode: code that calls `ibv_get_async_event` on the raw context itself then gets
/// `EAGAIN` instead of blocking when nothing is pending.
///
/// # Acknowledgement
///
/// libibverbs counts the events it reported about each QP, CQ, SRQ or WQ, and destroying
/// that object waits until every one of them is acknowledged (`ibv_ack_async_event`).
/// This handle copies what an event says (the kind, the port number, the QP number, the
/// object's address) into an [`AsyncEvent`] and acknowledges it at once, before
/// returning. So an `AsyncEvent` holds no reference to any object, and never delays the
/// destruction of the object it is about.
#[derive(Clone, Debug)]
pub struct AsyncEvents {
    ctx: Context,
}

impl Context {
    /// The context's asynchronous event queue. Sets `O_NONBLOCK` on the context's event
    /// descriptor (`async_fd`) so that waits can time out.
    pub fn async_events(&self) -> Result<AsyncEvents> {
        let fd = async_fd(self);
        // SAFETY: fcntl on a descriptor the open context owns; F_GETFL reads flags only.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(Error::last_os(Verb::GetFl));
        }
        if flags & libc::O_NONBLOCK == 0 {
            // SAFETY: as above; adds O_NONBLOCK to the file status flags.
            if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
                return Err(Error::last_os(Verb::SetFl));
            }
        }
        Ok(AsyncEvents { ctx: self.clone() })
    }

    /// Waits for the next asynchronous event, at most `timeout` (`None`: no limit);
    /// [`Error::Timeout`] when none came. Shorthand for
    /// `self.async_events()?.wait(timeout)`.
    #[doc(alias = "ibv_get_async_event")]
    pub fn async_event(&self, timeout: Option<Duration>) -> Result<AsyncEvent> {
        self.async_events()?.wait(timeout)
    }
}

fn async_fd(ctx: &Context) -> RawFd {
    // SAFETY: the context is open; async_fd is set by ibv_open_device and never changes.
    unsafe { (*ctx.as_raw()).async_fd }
}

impl AsyncEvents {
    /// The context the events come from.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The next pending event, or `None` at once when there is none.
    #[doc(alias = "ibv_get_async_event", alias = "ibv_ack_async_event")]
    pub fn try_next(&self) -> Result<Option<AsyncEvent>> {
        loop {
            // SAFETY: ibv_async_event is plain data (pointers and integers); zero is valid.
            let mut ev: ffi::ibv_async_event = unsafe { std::mem::zeroed() };
            // SAFETY: the context is open and `ev` is a valid out-pointer; the descriptor
            // is non-blocking (set when this handle was made), so this does not block.
            let rc = unsafe { ffi::ibv_get_async_event(self.ctx.as_raw(), &mut ev) };
            if let Err(err) = conv::rc(VERB, rc) {
                match err.errno() {
                    Some(libc::EAGAIN) => return Ok(None),
                    Some(libc::EINTR) => continue,
                    _ => return Err(err),
                }
            }
            // SAFETY: a fresh, unacknowledged event.
            let event = unsafe { AsyncEvent::from_raw(&ev) };
            // Acknowledge at once: the data is copied out, and an unacknowledged event
            // would block the destruction of the QP/CQ/SRQ/WQ it names.
            // SAFETY: the event ibv_get_async_event returned, acknowledged once.
            unsafe { ffi::ibv_ack_async_event(&mut ev) };
            return Ok(Some(event));
        }
    }

    /// Waits for the next event, at most `timeout` (`None`: no limit). Returns
    /// [`Error::Timeout`] when none came in time; `Some(Duration::ZERO)` only looks.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<AsyncEvent> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            if let Some(event) = self.try_next()? {
                return Ok(event);
            }
            let ms: libc::c_int = match (timeout, deadline) {
                (None, _) | (Some(_), None) => -1,
                (Some(t), Some(d)) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(Error::Timeout { verb: VERB, timeout: t });
                    }
                    // Round up, so that the wait does not end just short of the deadline.
                    let ms = left.as_nanos().div_ceil(1_000_000);
                    libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
                }
            };
            let mut pfd = libc::pollfd { fd: self.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc < 0 {
                let err = Error::last_os(Verb::Poll);
                if err.errno() != Some(libc::EINTR) {
                    return Err(err);
                }
            }
        }
    }
}

impl AsRawFd for AsyncEvents {
    /// The context's event descriptor (non-blocking), readable when an event is pending.
    fn as_raw_fd(&self) -> RawFd {
        async_fd(&self.ctx)
    }
}

impl AsFd for AsyncEvents {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor belongs to the context, which `self` keeps open.
        unsafe { BorrowedFd::borrow_raw(async_fd(&self.ctx)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_kinds_decode_and_unknown_values_are_data() {
        assert_eq!(AsyncEventKind::from_raw(9), AsyncEventKind::PortActive);
        assert_eq!(AsyncEventKind::from_raw(10), AsyncEventKind::PortErr);
        assert_eq!(AsyncEventKind::from_raw(19), AsyncEventKind::WqFatal);
        assert_eq!(AsyncEventKind::from_raw(77), AsyncEventKind::Unknown(77));
        assert_eq!(AsyncEventKind::Unknown(77).to_raw(), 77);
    }

    #[test]
    fn port_event_names_the_port_and_qp_event_reads_the_qp_number() {
        // SAFETY: plain data.
        let mut ev: ffi::ibv_async_event = unsafe { std::mem::zeroed() };
        ev.event_type = ffi::ibv_event_type::IBV_EVENT_PORT_ERR;
        ev.element.port_num = 1;
        // SAFETY: a port event holds no pointer.
        let e = unsafe { AsyncEvent::from_raw(&ev) };
        assert_eq!(e, AsyncEvent { kind: AsyncEventKind::PortErr, source: EventSource::Port(1) });
        assert_eq!(e.to_string(), "PortErr on port 1");

        // SAFETY: plain data.
        let mut qp: ffi::ibv_qp = unsafe { std::mem::zeroed() };
        qp.qp_num = 0x1234;
        ev.event_type = ffi::ibv_event_type::IBV_EVENT_QP_FATAL;
        ev.element.qp = &mut qp;
        // SAFETY: the QP pointer is valid for the call.
        let e = unsafe { AsyncEvent::from_raw(&ev) };
        assert_eq!(e.source, EventSource::Qp { qp_num: 0x1234, addr: &qp as *const _ as usize });

        ev.event_type = ffi::ibv_event_type::IBV_EVENT_DEVICE_FATAL;
        // SAFETY: no pointer is followed for a device event.
        assert_eq!(unsafe { AsyncEvent::from_raw(&ev) }.source, EventSource::Device);
    }
}
