//! rdma_cm events awaited on any async executor: [`AsyncEventChannel`] and [`AsyncCmId`].
//!
//! The channel's descriptor goes to the runtime's reactor through the same [`Readiness`]
//! as a CQ's ([`AsyncCq`](crate::AsyncCq)); each wait is bounded by a timer on a
//! descriptor of its own (a `timerfd`, watched the same way), so no runtime's timer is
//! named here.

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::channel::{ChannelInner, EventChannel};
use super::event::{CmEvent, CmEventKind, ConnectRequest};
use super::id::{resolve_addr_hint, resolve_wait, CmId};
use super::ConnParam;
use crate::aio::{reactor, ChannelFd, Readiness, Timer};
use crate::error::{Error, Result, Verb};

/// How a reactor handle is made for a descriptor: kept, for the timer made later.
type Make<Rt> = Arc<dyn Fn(ChannelFd) -> io::Result<Rt> + Send + Sync>;

/// An [`EventChannel`] whose events are awaited instead of waited for on a thread.
///
/// The channel's descriptor is non-blocking; the runtime's reactor watches it (the
/// tokio and async-io adapters are the methods `tokio` and `async_io`, behind the cargo
/// features of those names; another runtime brings its own
/// [`Readiness`] through [`with_readiness`](Self::with_readiness)). Awaiting costs nothing
/// when an event is there: the channel's queue (events another waiter already read for
/// someone else) is looked at first, then the descriptor is read until it would block,
/// and only then is the task parked on the reactor. A blocking waiter on another thread
/// that reads an event of the channel's wakes the parked task, so none is lost.
///
/// Every event is copied and acknowledged when it is read, as with the blocking calls:
/// dropping a future of this type at any point leaves no event unacknowledged and loses
/// none (an event is taken out of the channel's queue only in the poll that returns it).
///
/// One task awaits a channel at a time (`&mut self`), and one reactor registration per
/// descriptor: to await the events of several connections in their own tasks, give each
/// connection an [`AsyncCmId`], which has a channel of its own.
pub struct AsyncEventChannel<Rt> {
    // Declared first: deregistered from the reactor before the descriptors can close.
    ready: Rt,
    timer: Option<Timer<Rt>>,
    channel: EventChannel,
    make: Make<Rt>,
}

impl<Rt: Readiness> AsyncEventChannel<Rt> {
    /// Watches `channel`'s descriptor with the reactor handle `make` returns for it
    /// (`make` is kept: it makes the timer of the first wait with a bound, too).
    pub fn with_readiness(
        channel: EventChannel,
        make: impl Fn(ChannelFd) -> io::Result<Rt> + Send + Sync + 'static,
    ) -> Result<Self> {
        Self::with_make(channel, Arc::new(make))
    }

    fn with_make(channel: EventChannel, make: Make<Rt>) -> Result<Self> {
        let owner: Arc<dyn Send + Sync> = Arc::clone(&channel.inner) as Arc<dyn Send + Sync>;
        // SAFETY: the channel's descriptor is closed only when the channel is destroyed,
        // which `owner` prevents; EventChannel::new made it non-blocking.
        let fd = unsafe { ChannelFd::new(channel.inner.fd(), owner) };
        let ready = make(fd).map_err(reactor)?;
        Ok(AsyncEventChannel { ready, timer: None, channel, make })
    }

    /// The channel, for what does not wait (making ids on it, [`EventChannel::as_raw`]).
    pub fn channel(&self) -> &EventChannel {
        &self.channel
    }

    /// The next event of any id on the channel: `Ready` with it, or `Pending` with `cx`'s
    /// waker registered to be woken when the channel has more.
    #[doc(alias = "rdma_get_cm_event")]
    pub fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Result<CmEvent>> {
        self.poll_take(cx, None)
    }

    /// Waits at most `timeout` for the next event of any id on the channel
    /// ([`Error::Timeout`] after that).
    #[doc(alias = "rdma_get_cm_event")]
    pub async fn next_event(&mut self, timeout: Duration) -> Result<CmEvent> {
        self.bounded(None, timeout, Verb::GetCmEvent).await
    }

    /// Gives the channel back (its descriptor is no longer watched).
    pub fn into_inner(self) -> EventChannel {
        self.channel.clone()
    }

    /// The first event about the id with serial `of` (any id's: `None`): from the queue, else read from the descriptor,
    /// else `Pending` once the reactor watches it.
    fn poll_take(&mut self, cx: &mut Context<'_>, of: Option<u64>) -> Poll<Result<CmEvent>> {
        let inner: &Arc<ChannelInner> = &self.channel.inner;
        let waker = cx.waker().clone();
        // Poll first: the queue and the descriptor before any reactor round trip.
        if let Some(event) = inner.try_take(of, &waker)? {
            return Poll::Ready(Ok(event));
        }
        let mut found = None;
        let mut read = || -> Result<bool> {
            found = inner.try_take(of, &waker)?;
            Ok(found.is_some())
        };
        match self.ready.poll_read_with(cx, &mut read) {
            Poll::Ready(Ok(())) => Poll::Ready(found.ok_or_else(|| Error::verb(Verb::GetCmEvent, libc::EPROTO))),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    /// The first event about the id with serial `of` (any id's: `None`), within `timeout` (`verb` names the wait).
    async fn bounded(&mut self, of: Option<u64>, timeout: Duration, verb: Verb) -> Result<CmEvent> {
        // A timeout too large for the clock is no timeout.
        let deadline = Instant::now().checked_add(timeout);
        if deadline.is_some() && self.timer.is_none() {
            self.timer = Some(Timer::new(&*self.make)?);
        }
        poll_fn(|cx| {
            if let Poll::Ready(r) = self.poll_take(cx, of) {
                return Poll::Ready(r);
            }
            match (&mut self.timer, deadline) {
                (Some(timer), Some(deadline)) => match timer.poll_expired(cx, deadline) {
                    Poll::Ready(Ok(())) => Poll::Ready(Err(Error::Timeout { verb, timeout })),
                    Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                    Poll::Pending => Poll::Pending,
                },
                _ => Poll::Pending,
            }
        })
        .await
    }
}

impl<Rt> Drop for AsyncEventChannel<Rt> {
    fn drop(&mut self) {
        self.channel.inner.forget_waker();
    }
}

impl<Rt> fmt::Debug for AsyncEventChannel<Rt> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncEventChannel").field("channel", &self.channel).finish_non_exhaustive()
    }
}

/// A [`CmId`] whose rdma_cm steps are awaited: resolving, connecting, taking requests,
/// accepting, disconnecting, each bounded by a timeout as the blocking ones are. The
/// timeout is a timer on a descriptor of its own (a `timerfd`, watched by the same
/// [`Readiness`] as the channel), so no runtime's timer is needed.
///
/// It has an event channel of its own ([`AsyncEventChannel`]), so each connection's task
/// awaits only its own events and the runtime's reactor wakes exactly that task: made
/// from an id whose channel other handles or ids share, the id is first moved onto a new
/// channel (`rdma_migrate_id`, with the events already read about it). That is how a
/// server serves each connection in its own task: a listener takes the requests in a
/// loop ([`get_request`](Self::get_request)), and each request's id becomes an
/// `AsyncCmId` in the task that serves it. A listener should be wrapped before it listens
/// (requests already queued cannot move with it).
///
/// A server's accept loop and a client, on tokio (this example is
/// `tests/device/doc/async_cm.rs`, which the device tests run on rxe):
///
#[doc = concat!("```no_run\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/device/doc/async_cm.rs")), "```")]
///
/// # Cancellation
///
/// Dropping any of these futures is clean: the events are acknowledged as they are
/// read, so none is left unacknowledged, and one that arrives after the drop is queued
/// for the id. The verb a future started stays started: after a dropped
/// [`connect`](Self::connect) or [`accept`](Self::accept) the connection may still come
/// up (its ESTABLISHED is then [`next_event`](Self::next_event)'s, and
/// [`disconnect`](Self::disconnect) passes over it), and dropping the id destroys it
/// cleanly whatever state it is in.
pub struct AsyncCmId<Rt> {
    events: AsyncEventChannel<Rt>,
    id: CmId,
}

impl<Rt: Readiness> AsyncCmId<Rt> {
    /// Takes `id` and watches its events with the reactor handles `make` returns. The id
    /// must not be shared yet (no QP or context made from it) unless its channel is its
    /// alone (no [`EventChannel`] handle and no other id on it): else it is moved onto a
    /// channel of its own.
    pub fn with_readiness(
        id: CmId,
        make: impl Fn(ChannelFd) -> io::Result<Rt> + Send + Sync + 'static,
    ) -> Result<Self> {
        Self::with_make(id, Arc::new(make))
    }

    fn with_make(mut id: CmId, make: Make<Rt>) -> Result<Self> {
        if !id.has_channel_alone() {
            id.migrate(&EventChannel::new()?)?;
        }
        let events = AsyncEventChannel::with_make(id.channel(), make)?;
        Ok(AsyncCmId { events, id })
    }

    /// The id, for the steps that do not wait (bind, listen, context, create_qp, reject).
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// Gives the id back (its channel is no longer watched).
    pub fn into_inner(self) -> CmId {
        self.id
    }

    /// The next event about this id (for a listener: connection requests among them),
    /// `Pending` with `cx`'s waker registered until there is one.
    pub fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Result<CmEvent>> {
        let serial = self.id.serial();
        self.events.poll_take(cx, Some(serial))
    }

    /// Waits at most `timeout` for the next event about this id.
    #[doc(alias = "rdma_get_cm_event")]
    pub async fn next_event(&mut self, timeout: Duration) -> Result<CmEvent> {
        self.wait(timeout, Verb::GetCmEvent).await
    }

    async fn wait(&mut self, timeout: Duration, verb: Verb) -> Result<CmEvent> {
        let serial = self.id.serial();
        self.events.bounded(Some(serial), timeout, verb).await
    }

    /// [`CmId::resolve_addr`], awaited: `dst` to a local device, port and source address.
    /// librdmacm gives up after `timeout` (an error with ETIMEDOUT); [`Error::Timeout`]
    /// if nothing came a second later. Any other event is an error naming it.
    #[doc(alias = "rdma_resolve_addr")]
    pub async fn resolve_addr(&mut self, src: Option<SocketAddr>, dst: SocketAddr, timeout: Duration) -> Result<()> {
        const VERB: Verb = Verb::ResolveAddr;
        self.id.start_resolve_addr(src, dst, timeout)?;
        let event = self.wait(resolve_wait(timeout), VERB).await;
        event.and_then(|e| e.expect(CmEventKind::AddrResolved, VERB)).map(drop).map_err(|e| resolve_addr_hint(e, dst))
    }

    /// [`CmId::resolve_route`], awaited, after [`resolve_addr`](Self::resolve_addr).
    #[doc(alias = "rdma_resolve_route")]
    pub async fn resolve_route(&mut self, timeout: Duration) -> Result<()> {
        const VERB: Verb = Verb::ResolveRoute;
        self.id.start_resolve_route(timeout)?;
        let event = self.wait(resolve_wait(timeout), VERB).await?;
        event.expect(CmEventKind::RouteResolved, VERB).map(drop)
    }

    /// [`CmId::connect`], awaited: connects and returns the
    /// [`Established`](CmEventKind::Established) event, with the server's private data
    /// and parameters ([`CmEvent::conn`]). A rejection is [`Error::Rejected`]; another
    /// event an error naming it; nothing within `timeout` [`Error::Timeout`].
    #[doc(alias = "rdma_connect")]
    pub async fn connect(&mut self, param: &ConnParam<'_>, timeout: Duration) -> Result<CmEvent> {
        const VERB: Verb = Verb::Connect;
        self.id.start_connect(param)?;
        self.wait(timeout, VERB).await?.expect(CmEventKind::Established, VERB)
    }

    /// [`CmId::get_request`], awaited: the next connection request on this listener,
    /// with its new id (still on the listener's channel: make it an `AsyncCmId` where it
    /// is served, which moves it onto a channel of its own). Other events of the
    /// listener are errors naming them.
    #[doc(alias = "rdma_get_request")]
    pub async fn get_request(&mut self, timeout: Duration) -> Result<ConnectRequest> {
        const VERB: Verb = Verb::GetCmEvent;
        let event = self.wait(timeout, VERB).await?.expect(CmEventKind::ConnectRequest, VERB)?;
        ConnectRequest::from_event(event)
    }

    /// [`CmId::accept`], awaited: accepts the request this id came with and, for RC,
    /// waits at most `timeout` for [`Established`](CmEventKind::Established).
    #[doc(alias = "rdma_accept")]
    pub async fn accept(&mut self, param: &ConnParam<'_>, timeout: Duration) -> Result<()> {
        const VERB: Verb = Verb::Accept;
        if !self.id.start_accept(param)? {
            return Ok(());
        }
        self.wait(timeout, VERB).await?.expect(CmEventKind::Established, VERB).map(drop)
    }

    /// [`CmId::disconnect`], then waits at most `timeout` for this side's
    /// [`Disconnected`](CmEventKind::Disconnected): at once when the peer disconnected
    /// first (its event is already here, and this call answers it), else when the peer
    /// answers by disconnecting (or destroying its id) or the CM gives up on it. So a
    /// peer that awaits this too must not wait for this side's disconnect to finish
    /// before starting its own. An ESTABLISHED left by a dropped connect or accept is
    /// passed over; another event is an error naming it.
    #[doc(alias = "rdma_disconnect")]
    pub async fn disconnect(&mut self, timeout: Duration) -> Result<()> {
        const VERB: Verb = Verb::Disconnect;
        self.id.disconnect()?;
        let start = Instant::now();
        loop {
            let left = timeout.saturating_sub(start.elapsed());
            let event = self.wait(left, VERB).await.map_err(|e| match e {
                Error::Timeout { verb, .. } => Error::Timeout { verb, timeout },
                other => other,
            })?;
            if event.kind() != CmEventKind::Established {
                return event.expect(CmEventKind::Disconnected, VERB).map(drop);
            }
        }
    }
}

impl<Rt> fmt::Debug for AsyncCmId<Rt> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncCmId").field("id", &self.id).field("events", &self.events).finish()
    }
}

#[cfg(feature = "tokio")]
mod tokio_rt {
    use super::*;
    use crate::aio::TokioFd;

    impl AsyncEventChannel<TokioFd> {
        /// Watches `channel` with the tokio reactor of the runtime this is called in
        /// (feature `tokio`).
        pub fn tokio(channel: EventChannel) -> Result<Self> {
            Self::with_make(channel, Arc::new(TokioFd::register))
        }
    }

    impl AsyncCmId<TokioFd> {
        /// Takes `id` and watches its events with the tokio reactor of the runtime this
        /// is called in (feature `tokio`); see [`with_readiness`](Self::with_readiness).
        pub fn tokio(id: CmId) -> Result<Self> {
            Self::with_make(id, Arc::new(TokioFd::register))
        }
    }
}

#[cfg(feature = "async-io")]
mod async_io_rt {
    use super::*;
    use crate::aio::AsyncIoFd;

    impl AsyncEventChannel<AsyncIoFd> {
        /// Watches `channel` with async-io's reactor (feature `async-io`).
        pub fn async_io(channel: EventChannel) -> Result<Self> {
            Self::with_make(channel, Arc::new(AsyncIoFd::register))
        }
    }

    impl AsyncCmId<AsyncIoFd> {
        /// Takes `id` and watches its events with async-io's reactor (feature
        /// `async-io`); see [`with_readiness`](Self::with_readiness).
        pub fn async_io(id: CmId) -> Result<Self> {
            Self::with_make(id, Arc::new(AsyncIoFd::register))
        }
    }
}

#[cfg(all(test, feature = "tokio"))]
mod tests {
    use super::*;
    use crate::aio::TokioFd;

    /// What a task spawned on a multi-thread runtime holds across its awaits must be Send.
    #[allow(dead_code, clippy::manual_async_fn)]
    fn futures_are_send(id: &mut AsyncCmId<TokioFd>, ch: &mut AsyncEventChannel<TokioFd>, p: &ConnParam<'_>) {
        fn send<T: Send>(_: &T) {}
        send(&id.connect(p, Duration::ZERO));
        send(&id.accept(p, Duration::ZERO));
        send(&id.get_request(Duration::ZERO));
        send(&id.disconnect(Duration::ZERO));
        send(&id.resolve_addr(None, "10.0.0.1:1".parse().unwrap(), Duration::ZERO));
        send(&ch.next_event(Duration::ZERO));
    }
}
