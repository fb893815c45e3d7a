//! Readiness of file descriptors on any async executor: completions awaited
//! ([`AsyncCq`]), and the pieces the async rdma_cm (`cm`) builds on ([`ChannelFd`],
//! [`Readiness`], a timer on a descriptor of its own).
//!
//! How it works and an example: [`AsyncCq`]'s documentation (public; this module is not).

use std::future::poll_fn;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use crate::cq::CompletionQueue;
use crate::error::{Error, Result, Verb};
use crate::wc::WorkCompletion;

/// What an async runtime supplies to [`AsyncCq`] and to the async rdma_cm types
/// ([`AsyncEventChannel`](crate::AsyncEventChannel), [`AsyncCmId`](crate::AsyncCmId)):
/// its reactor's readiness of one non-blocking file descriptor (a CQ's completion
/// channel, an rdma_cm event channel, or the timer that bounds an rdma_cm wait).
///
/// Implemented for tokio and async-io behind the cargo features of those names; another
/// runtime implements it over its own reactor and builds its queue with
/// [`AsyncCq::with_readiness`] (and its channels with
/// [`AsyncEventChannel::with_readiness`](crate::AsyncEventChannel::with_readiness)).
pub trait Readiness {
    /// Returns `Ready(Ok(()))` once `read` has read something from the descriptor
    /// (`Ok(true)`). When `read` finds nothing (`Ok(false)`: it would block), forgets any
    /// readiness the reactor reported and waits for new readiness, registering `cx`'s
    /// waker (`Pending`). An error of `read` or of the reactor ends it.
    fn poll_read_with(&mut self, cx: &mut Context<'_>, read: &mut dyn FnMut() -> Result<bool>) -> Poll<Result<()>>;
}

/// A channel's descriptor, as a runtime's reactor watches it: a CQ's completion channel,
/// an rdma_cm event channel, or the timer of an rdma_cm wait. It keeps the object that
/// owns the descriptor alive while it exists, so the descriptor stays open as long as
/// the reactor watches it.
pub struct ChannelFd {
    fd: RawFd,
    _owner: Arc<dyn Send + Sync>,
}

impl ChannelFd {
    /// # Safety
    /// `fd` must be open as long as `owner` lives, and be non-blocking.
    pub(crate) unsafe fn new(fd: RawFd, owner: Arc<dyn Send + Sync>) -> ChannelFd {
        ChannelFd { fd, _owner: owner }
    }
}

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl AsFd for ChannelFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor is closed only when its owner goes (the contract of
        // `new`), and `_owner` keeps it alive as long as this exists.
        unsafe { BorrowedFd::borrow_raw(self.fd) }
    }
}

impl std::fmt::Debug for ChannelFd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ChannelFd").field(&self.fd).finish()
    }
}

/// A [`CompletionQueue`] whose completions are awaited instead of polled for in a loop.
///
/// A CQ built [`with_channel`](crate::CqBuilder::with_channel) has a file descriptor that
/// becomes readable when the armed CQ raises an event. An async runtime's reactor can
/// watch it like a socket; that is all a runtime has to supply ([`Readiness`]), so the
/// core here names no executor. The adapters are thin and behind cargo features:
/// `tokio` (`AsyncCq::tokio`, over `tokio::io::unix::AsyncFd`) and `async-io`
/// (`AsyncCq::async_io`, over `async_io::Async`, which smol and async-std use), each
/// among this type's methods where its feature is on.
///
/// Awaiting completions costs nothing when they are already there: the CQ is polled
/// first, as a busy-polling loop would. Only when it is empty is it armed, polled again
/// (a completion that arrived before the arming raises no event), and the task parked
/// until the channel says more arrived. Events are acknowledged in batches.
///
/// A SEND to itself, its completions awaited on tokio (this example is
/// `tests/device/doc/async_cq.rs`, which the device tests run on rxe):
///
#[doc = concat!("```no_run\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/device/doc/async_cq.rs")), "```")]
///
/// One task awaits a CQ at a time (`&mut self`). The queues whose completions land here
/// ([`SendQueue`](crate::SendQueue), [`RecvQueue`](crate::RecvQueue)) take them as
/// before: `complete` with each [`WorkCompletion`].
///
/// `Rt` is the runtime's readiness ([`Readiness`]: tokio's, async-io's, or your own), the
/// same parameter on every async type of this crate.
pub struct AsyncCq<Rt> {
    // Declared first: dropped (deregistered from the reactor) before the CQ closes the fd.
    ready: Rt,
    cq: CompletionQueue,
    spin: u32,
    armed: bool,
    waits: u64,
}

impl<Rt: Readiness> AsyncCq<Rt> {
    /// Takes `cq` (built with a completion channel) and watches its channel with the
    /// reactor handle `make` returns for the descriptor.
    pub fn with_readiness(cq: CompletionQueue, make: impl FnOnce(ChannelFd) -> io::Result<Rt>) -> Result<Self> {
        let Some(fd) = cq.channel_fd() else {
            return Err(Error::invalid(
                Verb::GetCqEvent,
                "the CQ has no completion channel: build it with CompletionQueue::builder(..).with_channel()",
            ));
        };
        let owner: Arc<dyn Send + Sync> = Arc::clone(&cq.inner) as Arc<dyn Send + Sync>;
        // SAFETY: the completion channel's descriptor is closed only when the CQ is
        // destroyed, which `owner` prevents; the CQ made it non-blocking.
        let ready = make(unsafe { ChannelFd::new(fd, owner) }).map_err(reactor)?;
        Ok(AsyncCq { ready, cq, spin: 0, armed: false, waits: 0 })
    }

    /// How many more times to poll an empty CQ before arming it and parking the task
    /// (default 0). Parking costs a reactor round trip and the channel's event (a
    /// system call or two); spinning costs the thread, and every other task on it waits.
    ///
    /// # Spin policy
    ///
    /// - **0 (the default) on a runtime thread serving many connections** (a
    ///   thread-per-core server): a spinning task holds up the tasks whose completions
    ///   are already there. At 64 connections with one request each in flight, all on
    ///   one current-thread runtime: about 4,600 to 5,200 messages/s at spin 0, 3,600 to
    ///   3,800 at spin 200, 1,100 to 1,300 at spin 2000.
    /// - **Spin for about as long as a completion takes to come when latency matters and
    ///   the task has its thread to itself** (its peer working elsewhere): N polls last N
    ///   times an empty poll (tens of nanoseconds on hardware, which makes "a few
    ///   microseconds" a few hundred polls). With a runtime per end on its own thread, a
    ///   ping-pong's round trip against a thread per end busy-polling: spin 0 parks 1.4
    ///   times per round trip and costs 3.9 to 4.8 times as much; spin 200 parks 0.07 to
    ///   0.14 times and costs 1.3 to 1.6 times; spin 2000 (a few round trips' time there)
    ///   parks 0.01 times or less and costs 0.99 to 1.15 times, spin 20000 1.00 to 1.06:
    ///   as much as busy polling, within the noise (the same busy way measured twice: 0.95).
    /// - Spinning never helps while what it waits for needs the same thread: with both
    ///   ends of a ping-pong on one runtime, the round trip grew from 0.54 ms (spin 0)
    ///   to 0.83 ms (200) and 2.0 ms (2000).
    ///
    /// Parking is what awaiting costs when nothing spins: a round trip in which each end
    /// parks once costs about what a thread per end blocking on the channel costs (1.05 to
    /// 1.24 times) and 3.3 to 4.1 times one thread busy-polling both CQs.
    ///
    /// These numbers are `scripts/rxe cargo bench --bench async_pingpong`
    /// (`benches/async_pingpong.rs`), four runs of 15 interleaved rounds on an idle host,
    /// on rxe in a VM under emulation (2 vCPUs; an empty poll 86 to 187 ns; a busy-polled
    /// round trip about 0.1 ms): the ratios say more than the times. Run it where you
    /// deploy.
    pub fn set_spin(&mut self, polls: u32) {
        self.spin = polls;
    }

    /// How many times an await found the CQ empty and parked its task until the channel
    /// said more arrived: how often awaiting was not free.
    pub fn waits(&self) -> u64 {
        self.waits
    }

    /// The CQ, to poll or inspect it directly. Whatever is done with it (an arming and a
    /// wait of its own consume the armed state), the next await arms it again before it
    /// parks: arming twice is harmless, an event spent behind this queue's back would
    /// leave the await waiting for ever.
    pub fn cq(&mut self) -> &mut CompletionQueue {
        self.armed = false;
        &mut self.cq
    }

    /// Moves up to `wcs.len()` completions into the front of `wcs` and returns how many:
    /// at least one when `Ready(Ok)`. `Pending` when the CQ is empty, with `cx`'s waker
    /// registered to be woken when a completion arrives.
    pub fn poll_completions(&mut self, cx: &mut Context<'_>, wcs: &mut [WorkCompletion]) -> Poll<Result<usize>> {
        let AsyncCq { ready, cq, spin, armed, waits } = self;
        loop {
            for _ in 0..=*spin {
                let n = cq.poll(wcs)?.len();
                if n > 0 {
                    return Poll::Ready(Ok(n));
                }
            }
            if !*armed {
                cq.arm(false)?;
                *armed = true;
                // A completion that arrived after the poll and before the arming raised
                // no event: look once more before parking.
                let n = cq.poll(wcs)?.len();
                if n > 0 {
                    return Poll::Ready(Ok(n));
                }
            }
            match ready.poll_read_with(cx, &mut || cq.try_wait()) {
                Poll::Pending => {
                    *waits += 1;
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                // The event spent the arming: poll, and arm again if still empty.
                Poll::Ready(Ok(())) => *armed = false,
            }
        }
    }

    /// Waits for completions and moves up to `wcs.len()` of them into the front of
    /// `wcs`: that part is returned, never empty. No allocation: the future is this
    /// call's state on the caller's stack or in its task.
    pub async fn completions<'a>(&mut self, wcs: &'a mut [WorkCompletion]) -> Result<&'a mut [WorkCompletion]> {
        let n = poll_fn(|cx| self.poll_completions(cx, wcs)).await?;
        Ok(&mut wcs[..n])
    }

    /// Gives the CQ back (its arming, if any, stays: a later event is consumed by
    /// [`CompletionQueue::wait`] or acknowledged when the CQ is destroyed).
    pub fn into_inner(self) -> CompletionQueue {
        let AsyncCq { ready, cq, .. } = self;
        drop(ready);
        cq
    }
}

impl<Rt> std::fmt::Debug for AsyncCq<Rt> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncCq").field("cq", &self.cq).field("spin", &self.spin).field("waits", &self.waits).finish()
    }
}

/// An error of the runtime's reactor.
#[cold]
pub(crate) fn reactor(source: io::Error) -> Error {
    Error::Io { what: "watching a channel's descriptor with the async runtime's reactor", source }
}

/// A deadline on a descriptor of its own (a non-blocking `timerfd`), which a runtime's
/// reactor watches like any channel: how an async wait of this crate is bounded without
/// naming a runtime's timer. One per waiter, re-armed for each wait.
pub(crate) struct Timer<Rt> {
    // Declared first: deregistered from the reactor before the descriptor closes.
    ready: Rt,
    fd: Arc<OwnedFd>,
    armed_for: Option<Instant>,
}

impl<Rt: Readiness> Timer<Rt> {
    /// A disarmed timer, watched by the reactor handle `make` returns.
    pub(crate) fn new(make: &dyn Fn(ChannelFd) -> io::Result<Rt>) -> Result<Timer<Rt>> {
        // SAFETY: no pointer arguments; returns -1 with errno set on failure.
        let raw = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if raw < 0 {
            return Err(Error::last_os(Verb::TimerfdCreate));
        }
        // SAFETY: a descriptor just opened, owned by nothing else.
        let fd = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
        let owner: Arc<dyn Send + Sync> = Arc::clone(&fd) as Arc<dyn Send + Sync>;
        // SAFETY: `owner` keeps the descriptor open; it is non-blocking (TFD_NONBLOCK).
        let ready = make(unsafe { ChannelFd::new(raw, owner) }).map_err(reactor)?;
        Ok(Timer { ready, fd, armed_for: None })
    }

    /// `Ready(Ok)` once `deadline` has passed; `Pending` (with `cx`'s waker registered
    /// with the reactor) before. Arms the timer for `deadline` when it is not yet.
    pub(crate) fn poll_expired(&mut self, cx: &mut Context<'_>, deadline: Instant) -> Poll<Result<()>> {
        if Instant::now() >= deadline {
            return Poll::Ready(Ok(()));
        }
        let Timer { ready, fd, armed_for } = self;
        if *armed_for != Some(deadline) {
            arm(fd.as_raw_fd(), deadline)?;
            *armed_for = Some(deadline);
        }
        let fd = fd.as_raw_fd();
        ready.poll_read_with(cx, &mut || {
            let mut ticks = 0u64;
            // SAFETY: reads 8 bytes into `ticks` from the timer's non-blocking descriptor.
            let n = unsafe { libc::read(fd, (&mut ticks as *mut u64).cast(), 8) };
            if n < 0 {
                let e = Error::last_os(Verb::TimerfdRead);
                return match e.errno() {
                    Some(libc::EAGAIN | libc::EINTR) => Ok(false),
                    _ => Err(e),
                };
            }
            // An expiry of an earlier arming, or one a hair early: arm again, wait on.
            if Instant::now() < deadline {
                arm(fd, deadline)?;
                return Ok(false);
            }
            Ok(true)
        })
    }
}

/// Arms the timer to expire once, at `deadline` (the monotonic clock, as `Instant`'s).
fn arm(fd: RawFd, deadline: Instant) -> Result<()> {
    let left = deadline.saturating_duration_since(Instant::now()).max(std::time::Duration::from_nanos(1));
    let value = libc::itimerspec {
        it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
        it_value: libc::timespec {
            tv_sec: libc::time_t::try_from(left.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(left.subsec_nanos() as i32),
        },
    };
    // SAFETY: a live timerfd; `value` is a valid itimerspec, the old value is not wanted.
    let rc = unsafe { libc::timerfd_settime(fd, 0, &value, std::ptr::null_mut()) };
    if rc < 0 {
        return Err(Error::last_os(Verb::TimerfdSettime));
    }
    Ok(())
}

impl<Rt> std::fmt::Debug for Timer<Rt> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timer").field("fd", &self.fd.as_raw_fd()).field("armed_for", &self.armed_for).finish()
    }
}

#[cfg(feature = "tokio")]
mod tokio_rt {
    use super::*;
    use tokio::io::unix::AsyncFd;

    /// The tokio reactor's readiness of a channel's descriptor (feature `tokio`).
    #[derive(Debug)]
    pub struct TokioFd(AsyncFd<ChannelFd>);

    impl Readiness for TokioFd {
        fn poll_read_with(&mut self, cx: &mut Context<'_>, read: &mut dyn FnMut() -> Result<bool>) -> Poll<Result<()>> {
            loop {
                // tokio caches readiness: no system call until it is cleared.
                let mut guard = match self.0.poll_read_ready(cx) {
                    Poll::Ready(Ok(g)) => g,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(reactor(e))),
                    Poll::Pending => return Poll::Pending,
                };
                if read()? {
                    return Poll::Ready(Ok(()));
                }
                guard.clear_ready();
            }
        }
    }

    impl TokioFd {
        /// Registers `fd` with the tokio reactor of the runtime this is called in.
        pub(crate) fn register(fd: ChannelFd) -> io::Result<TokioFd> {
            if tokio::runtime::Handle::try_current().is_err() {
                return Err(io::Error::other("called outside a tokio runtime (its reactor watches the descriptor)"));
            }
            // SAFETY: a ChannelFd's descriptor stays open, the same file description, as
            // long as the ChannelFd (it keeps the descriptor's owner alive), and it always
            // returns that one descriptor.
            let registered = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
            registered.map(TokioFd).map_err(io::Error::from)
        }
    }

    impl AsyncCq<TokioFd> {
        /// Takes `cq` (built with a completion channel) and watches its channel with the
        /// tokio reactor of the runtime this is called in (feature `tokio`).
        pub fn tokio(cq: CompletionQueue) -> Result<Self> {
            Self::with_readiness(cq, TokioFd::register)
        }
    }
}
#[cfg(feature = "tokio")]
pub use tokio_rt::TokioFd;

#[cfg(feature = "async-io")]
mod async_io_rt {
    use super::*;

    /// The async-io reactor's readiness of a channel's descriptor (feature `async-io`;
    /// the reactor of smol and async-std).
    #[derive(Debug)]
    pub struct AsyncIoFd(async_io::Async<ChannelFd>);

    impl Readiness for AsyncIoFd {
        fn poll_read_with(&mut self, cx: &mut Context<'_>, read: &mut dyn FnMut() -> Result<bool>) -> Poll<Result<()>> {
            // async-io keeps no readiness of its own: try first, as its `read_with` does.
            loop {
                if read()? {
                    return Poll::Ready(Ok(()));
                }
                match self.0.poll_readable(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(reactor(e))),
                    Poll::Pending => return Poll::Pending,
                }
            }
        }
    }

    impl AsyncIoFd {
        /// Registers `fd` with async-io's reactor.
        pub(crate) fn register(fd: ChannelFd) -> io::Result<AsyncIoFd> {
            async_io::Async::new(fd).map(AsyncIoFd)
        }
    }

    impl AsyncCq<AsyncIoFd> {
        /// Takes `cq` (built with a completion channel) and watches its channel with
        /// async-io's reactor (feature `async-io`).
        pub fn async_io(cq: CompletionQueue) -> Result<Self> {
            Self::with_readiness(cq, AsyncIoFd::register)
        }
    }
}
#[cfg(feature = "async-io")]
pub use async_io_rt::AsyncIoFd;
