//! The event channel (`struct rdma_event_channel`): the descriptor the events of its ids
//! arrive on, and the queue of events read but not yet taken.

use std::collections::VecDeque;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::{Duration, Instant};

use super::event::{CmEvent, CmEventKind, EventData};
use super::id::{next_serial, ChildId, CmId};
use crate::conv;
use crate::error::{Error, Result, Verb};
use crate::ffi;

/// How long one reader sleeps in poll(2) before it looks at the queue again: another
/// thread may have read (and queued) the event it waits for.
const POLL_SLICE: Duration = Duration::from_millis(50);

/// An event channel. Cloning is cheap; the channel is destroyed when the last clone and
/// the last id made on it are gone.
///
/// Several threads may wait at once, each for its own id ([`CmId::next_event`] and the
/// calls that wait): whichever reads an event queues it for the id it is about. A
/// [`next_event`](Self::next_event) on the channel takes the next event of any id, so do
/// not mix it with per-id waits on other threads.
#[doc(alias = "rdma_destroy_event_channel")]
#[derive(Clone)]
pub struct EventChannel {
    pub(super) inner: Arc<ChannelInner>,
}

pub(super) struct ChannelInner {
    raw: NonNull<ffi::rdma_event_channel>,
    /// The CM lock: held while events are read and acknowledged, and around every
    /// librdmacm call on an id of this channel (such calls read and write the id, and
    /// some change the id's QP). Never held while sleeping.
    state: Mutex<State>,
    /// Signalled when the reader has queued events or given up its turn.
    turn: Condvar,
}

// SAFETY: the channel pointer is owned here and freed once, in Drop. librdmacm reads it
// from any thread; the calls that read events from it run under `state`'s lock.
unsafe impl Send for ChannelInner {}
// SAFETY: see Send; shared access goes through the lock or reads the immutable fd.
unsafe impl Sync for ChannelInner {}

pub(super) struct State {
    /// Events read and acknowledged, not yet taken, oldest first.
    pending: VecDeque<Queued>,
    /// Whether a thread is in poll(2) on the descriptor.
    reading: bool,
    /// The task of an async waiter ([`AsyncEventChannel`](super::AsyncEventChannel))
    /// that found nothing for it: woken when another reader queues events, since the
    /// descriptor's readiness that reader consumed will not wake it.
    waker: Option<Waker>,
}

/// An event in the queue: its data, and the new id of a connection request.
struct Queued {
    data: EventData,
    child: Option<ChildId>,
}

impl State {
    /// Moves the queued events of the id with this serial to `to`, in order: the id now
    /// gets its events on `to`'s channel.
    pub(super) fn move_events(&mut self, to: &mut State, serial: u64) {
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i].data.target == serial {
                to.pending.extend(self.pending.remove(i));
            } else {
                i += 1;
            }
        }
    }

    /// Whether connection requests to the listener with this serial are queued.
    pub(super) fn has_requests_for(&self, serial: u64) -> bool {
        self.pending.iter().any(|q| q.data.target == serial && q.child.is_some())
    }

    /// Forgets the queued events of the id with this serial: it is being destroyed. The
    /// new ids of its connection requests are destroyed too (the kernel rejects them),
    /// and their own queued events with them.
    pub(super) fn purge(&mut self, serial: u64) {
        let mut dead = vec![serial];
        while let Some(serial) = dead.pop() {
            let mut i = 0;
            while i < self.pending.len() {
                if self.pending[i].data.target == serial {
                    if let Some(q) = self.pending.remove(i) {
                        dead.extend(q.child.as_ref().map(ChildId::serial));
                        // Destroys the child id: no event is being read (we hold the lock).
                        drop(q);
                    }
                } else {
                    i += 1;
                }
            }
        }
    }
}

impl ChannelInner {
    pub(super) fn as_ptr(&self) -> *mut ffi::rdma_event_channel {
        self.raw.as_ptr()
    }

    pub(super) fn fd(&self) -> RawFd {
        // SAFETY: the channel is live; `fd` is set at creation and never changes.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    /// Takes the CM lock (a panic while it was held leaves the queue consistent: it is
    /// only changed by whole pushes and removals).
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads every event the kernel has ready into the queue, copying and acknowledging
    /// each at once.
    fn drain(&self, st: &mut State) -> Result<()> {
        loop {
            let mut ev: *mut ffi::rdma_cm_event = ptr::null_mut();
            // SAFETY: the channel is live and its descriptor non-blocking, so this returns
            // EAGAIN instead of sleeping; `ev` is a valid out-pointer.
            let rc = unsafe { ffi::rdma_get_cm_event(self.as_ptr(), &mut ev) };
            if let Err(err) = conv::rc(Verb::GetCmEvent, rc) {
                match err.errno() {
                    Some(libc::EAGAIN) => return Ok(()),
                    Some(libc::EINTR) => continue,
                    _ => return Err(err),
                }
            }
            // SAFETY: a fresh event from rdma_get_cm_event, acknowledged below, once.
            let queued = unsafe { take_event(ev) };
            st.pending.push_back(queued);
            // The async waiter, if any, learns of it here, not from the descriptor.
            if let Some(w) = st.waker.take() {
                w.wake();
            }
        }
    }

    /// The first queued event about the id with serial `of` (any id's: `None`); else
    /// reads what the kernel has ready and looks again. Without sleeping; for the async
    /// waiter, whose task `waker` is woken when another reader queues events after this
    /// found none.
    pub(super) fn try_take(self: &Arc<Self>, of: Option<u64>, waker: &Waker) -> Result<Option<CmEvent>> {
        let want = |d: &EventData| of.is_none_or(|serial| d.target == serial);
        let mut st = self.lock();
        // This reader's own reads need not wake it.
        st.waker = None;
        let mut found = st.pending.iter().position(|q| want(&q.data));
        if found.is_none() {
            let before = st.pending.len();
            let drained = self.drain(&mut st);
            if st.pending.len() > before {
                // A thread in poll(2) may be waiting for one of these.
                self.turn.notify_all();
            }
            found = st.pending.iter().position(|q| want(&q.data));
            if found.is_none() {
                drained?;
                st.waker = Some(waker.clone());
                return Ok(None);
            }
        }
        let queued = found.and_then(|i| st.pending.remove(i));
        drop(st);
        // Outside the lock: the request's new id is wrapped here.
        Ok(queued.map(|q| self.hand_out(q)))
    }

    /// Forgets the async waiter (it is gone).
    pub(super) fn forget_waker(&self) {
        self.lock().waker = None;
    }

    /// Waits for the first event that `want` takes, at most `timeout`. One waiting thread
    /// at a time polls the descriptor; the others sleep on the condition variable until
    /// it has queued what it read.
    pub(super) fn wait(
        self: &Arc<Self>,
        want: impl Fn(&EventData) -> bool,
        timeout: Duration,
        verb: Verb,
    ) -> Result<CmEvent> {
        let start = Instant::now();
        let mut st = self.lock();
        loop {
            if let Some(i) = st.pending.iter().position(|q| want(&q.data)) {
                let queued = st.pending.remove(i);
                drop(st);
                // Outside the lock: the request's new id is wrapped here.
                return Ok(self.hand_out(queued.expect("position() found it")));
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                // A last look at what the kernel has ready (a zero timeout only looks).
                if !st.reading {
                    self.drain(&mut st)?;
                    if st.pending.iter().any(|q| want(&q.data)) {
                        continue;
                    }
                }
                return Err(Error::Timeout { verb, timeout });
            }
            if st.reading {
                st = self.turn.wait_timeout(st, left).unwrap_or_else(PoisonError::into_inner).0;
                continue;
            }
            st.reading = true;
            drop(st);
            let polled = poll_readable(self.fd(), left.min(POLL_SLICE));
            st = self.lock();
            st.reading = false;
            let drained = self.drain(&mut st);
            self.turn.notify_all();
            polled?;
            drained?;
        }
    }

    /// The next queued or ready event of any id, without sleeping.
    fn try_next(self: &Arc<Self>) -> Result<Option<CmEvent>> {
        let mut st = self.lock();
        if st.pending.is_empty() {
            let drained = self.drain(&mut st);
            if !st.pending.is_empty() {
                // A thread in poll(2) may be waiting for one of these.
                self.turn.notify_all();
            }
            drained?;
        }
        let queued = st.pending.pop_front();
        drop(st);
        Ok(queued.map(|q| self.hand_out(q)))
    }

    fn hand_out(self: &Arc<Self>, q: Queued) -> CmEvent {
        CmEvent { data: q.data, request: q.child.map(|child| CmId::adopt(child, self)) }
    }
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // Unclaimed connection requests: their ids go before the channel they are on.
        self.state.get_mut().unwrap_or_else(PoisonError::into_inner).pending.clear();
        // SAFETY: no id is left on the channel (each holds it), so it is destroyed once,
        // unused.
        unsafe { ffi::rdma_destroy_event_channel(self.raw.as_ptr()) }
    }
}

/// Copies an event out, gives a connection request's new id a serial of its own, and
/// acknowledges the event.
///
/// # Safety
/// `ev` must be an event `rdma_get_cm_event` returned, not yet acknowledged; the caller
/// holds the CM lock.
unsafe fn take_event(ev: *mut ffi::rdma_cm_event) -> Queued {
    // SAFETY: an unacknowledged event is alive (caller).
    let data = unsafe { EventData::capture(&*ev) };
    let child = if data.kind == CmEventKind::ConnectRequest {
        // SAFETY: as above; for a request `id` is the new id librdmacm made for it, owned
        // by whoever takes the event, and nobody else knows it yet.
        NonNull::new(unsafe { (*ev).id }).map(|id| {
            let serial = next_serial();
            // SAFETY: the new id is alive and not shared with any other thread yet.
            unsafe { (*id.as_ptr()).context = serial as usize as *mut std::ffi::c_void };
            // SAFETY: the new id is ours to destroy, once.
            unsafe { ChildId::new(id, serial) }
        })
    } else {
        None
    };
    // SAFETY: acknowledged once; nothing in `data` points into it.
    unsafe { ffi::rdma_ack_cm_event(ev) };
    Queued { data, child }
}

/// Sleeps until the descriptor is readable or `timeout` passes (both are `Ok`).
fn poll_readable(fd: RawFd, timeout: Duration) -> Result<()> {
    // Round up, so that the wait does not end just short of the deadline.
    let ms = libc::c_int::try_from(timeout.as_nanos().div_ceil(1_000_000)).unwrap_or(libc::c_int::MAX);
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    if rc < 0 {
        let err = Error::last_os(Verb::Poll);
        if err.errno() != Some(libc::EINTR) {
            return Err(err);
        }
    }
    Ok(())
}

impl EventChannel {
    /// Opens an event channel (`rdma_create_event_channel`) and makes its descriptor
    /// non-blocking, so that every wait can time out.
    #[doc(alias = "rdma_create_event_channel")]
    pub fn new() -> Result<EventChannel> {
        const VERB: Verb = Verb::CreateEventChannel;
        // With the feature `dlopen`, both libraries are loaded here (a CM id's context is
        // libibverbs'); linked, these are no-ops.
        ffi::dl::load(ffi::dl::Library::Ibverbs)?;
        ffi::dl::load(ffi::dl::Library::Rdmacm)?;
        // SAFETY: no arguments; returns NULL with errno set on failure.
        let raw = unsafe { ffi::rdma_create_event_channel() };
        let Some(raw) = NonNull::new(raw) else {
            let e = Error::last_os(VERB);
            return Err(match e.errno() {
                Some(libc::ENODEV | libc::ENOENT | libc::ENXIO) => e.with_hint(
                    "no RDMA connection manager device (/dev/infiniband/rdma_cm): load rdma_ucm \
                     (`modprobe rdma_ucm`), and check that an RDMA device exists",
                ),
                Some(libc::EACCES | libc::EPERM) => {
                    e.with_hint("no permission on /dev/infiniband/rdma_cm: fix the udev rules or the user's groups")
                }
                _ => e,
            });
        };
        let inner = Arc::new(ChannelInner {
            raw,
            state: Mutex::new(State { pending: VecDeque::new(), reading: false, waker: None }),
            turn: Condvar::new(),
        });
        let fd = inner.fd();
        // SAFETY: fcntl on the channel's open descriptor; F_GETFL only reads flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above; adds O_NONBLOCK to the file status flags.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(Error::last_os(Verb::SetFl));
        }
        Ok(EventChannel { inner })
    }

    /// The raw pointer, valid while `self` lives. Reading events from it behind this
    /// crate's back breaks the acknowledgement rules: don't.
    pub fn as_raw(&self) -> *mut ffi::rdma_event_channel {
        self.inner.as_ptr()
    }

    /// Waits at most `timeout` for the next event of any id on the channel.
    #[doc(alias = "rdma_get_cm_event")]
    pub fn next_event(&self, timeout: Duration) -> Result<CmEvent> {
        self.inner.wait(|_| true, timeout, Verb::GetCmEvent)
    }

    /// The next event of any id on the channel, or `None` at once when there is none:
    /// for event loops, on readiness of [`as_raw_fd`](AsRawFd::as_raw_fd).
    pub fn try_next_event(&self) -> Result<Option<CmEvent>> {
        self.inner.try_next()
    }
}

impl AsRawFd for EventChannel {
    /// The channel's descriptor (non-blocking), readable when an event is ready.
    fn as_raw_fd(&self) -> RawFd {
        self.inner.fd()
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor belongs to the channel, which `self` keeps open.
        unsafe { BorrowedFd::borrow_raw(self.inner.fd()) }
    }
}

impl fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.inner.fd())
            .field("queued", &self.inner.lock().pending.len())
            .finish()
    }
}
