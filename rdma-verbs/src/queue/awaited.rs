//! Queues whose completions are awaited: [`AsyncSendQueue`], [`AsyncRecvQueue`]. The guide
//! (tickets, a slot per request, no allocation or lock, cancellation) and an example are
//! on [`AsyncSendQueue`], public, where rustdoc shows them.

use std::future::poll_fn;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{ready, Context, Poll};

use super::{RecvQueue, SendQueue, SendRequest};
use crate::aio::{AsyncCq, Readiness};
use crate::buf::{ExclusiveBuf, SendBuf};
use crate::cq::CqReservation;
use crate::error::{Error, Refused, Result, Verb};
use crate::wc::WorkCompletion;
use crate::wr::{Done, SendWr};

/// Completions taken from the CQ per poll.
const POLL: usize = 16;

/// One posted request's claim on its completion, from [`AsyncSendQueue::post`] or
/// [`AsyncRecvQueue::post`]: [`wait`](AsyncSendQueue::wait) hands it back for the
/// finished request. Neither `Copy` nor `Clone`: a request is handed back once. Dropping
/// a ticket gives up nothing: the request still comes back through
/// [`next`](AsyncSendQueue::next), in posting order.
#[derive(Debug, PartialEq, Eq)]
pub struct Ticket {
    queue: u64,
    seq: u64,
}

impl Ticket {
    /// The request's place in its queue's posting order (0 for the first post).
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// The tickets of one batch, in posting order.
#[derive(Debug)]
pub struct Tickets {
    queue: u64,
    seqs: Range<u64>,
}

impl Iterator for Tickets {
    type Item = Ticket;
    fn next(&mut self) -> Option<Ticket> {
        self.seqs.next().map(|seq| Ticket { queue: self.queue, seq })
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.seqs.size_hint()
    }
}

impl ExactSizeIterator for Tickets {}

/// Where finished requests wait for their owner, and the CQ they arrive on.
struct Slots<B, Rt> {
    cq: AsyncCq<Rt>,
    /// The finished request of sequence number `seq` at `seq & mask`, until taken.
    done: Box<[Option<Done<B>>]>,
    mask: u64,
    /// How many requests may be posted and not yet handed back.
    cap: u64,
    /// This queue's mark on its tickets (unique in the process, never reused).
    id: u64,
    /// Tickets issued: the sequence number of the next post.
    posted: u64,
    /// Requests finished (`seq < arrived`): in their slot, or handed back.
    arrived: u64,
    /// Every request before `front` was handed back.
    front: u64,
    wcs: [WorkCompletion; POLL],
    /// The rest of the CQ, set aside so that no other queue completes on it.
    _whole: CqReservation,
}

impl<B, Rt> Slots<B, Rt> {
    fn debug(&self, f: &mut std::fmt::Formatter<'_>, name: &str, queue: &dyn std::fmt::Debug) -> std::fmt::Result {
        f.debug_struct(name)
            .field("queue", queue)
            .field("posted", &self.posted)
            .field("finished", &self.arrived)
            .field("handed_back", &self.front)
            .finish()
    }
}

static QUEUE_IDS: AtomicU64 = AtomicU64::new(1);

impl<B, Rt: Readiness> Slots<B, Rt> {
    fn new(cq: AsyncCq<Rt>, depth: u64, whole: CqReservation) -> Self {
        let len = depth.max(1).next_power_of_two();
        Slots {
            cq,
            done: (0..len).map(|_| None).collect(),
            mask: len - 1,
            cap: depth,
            id: QUEUE_IDS.fetch_add(1, Ordering::Relaxed),
            posted: 0,
            arrived: 0,
            front: 0,
            wcs: [WorkCompletion::EMPTY; POLL],
            _whole: whole,
        }
    }

    /// How many more requests may be posted: those handed back make room, finished ones
    /// waiting in their slots do not.
    #[inline]
    fn room(&self) -> usize {
        (self.cap - (self.posted - self.front)) as usize
    }

    #[inline]
    fn issue(&mut self, n: usize) -> Tickets {
        let start = self.posted;
        self.posted += n as u64;
        Tickets { queue: self.id, seqs: start..self.posted }
    }

    /// Keeps the next finished request (completions arrive in posting order).
    #[inline]
    fn store(&mut self, done: Done<B>) {
        debug_assert!(self.arrived < self.posted);
        self.done[(self.arrived & self.mask) as usize] = Some(done);
        self.arrived += 1;
    }

    /// The oldest finished request not yet handed back.
    #[inline]
    fn take_next(&mut self) -> Option<Done<B>> {
        if self.front == self.arrived {
            return None;
        }
        // `front` always names a request not handed back (see `settle`).
        let done = self.done[(self.front & self.mask) as usize].take();
        debug_assert!(done.is_some());
        self.front += 1;
        self.settle();
        done
    }

    /// The finished request of `ticket`, or `None` while it is not finished.
    #[inline]
    fn take(&mut self, ticket: &Ticket) -> Result<Option<Done<B>>> {
        let seq = ticket.seq;
        if ticket.queue != self.id || seq >= self.posted {
            return Err(stray_ticket(ticket));
        }
        if seq >= self.arrived {
            return Ok(None);
        }
        let Some(done) = self.done[(seq & self.mask) as usize].take() else {
            return Err(Error::invalid(Verb::Await, format!("request {seq} of this queue was already handed back")));
        };
        self.settle();
        Ok(Some(done))
    }

    /// Moves `front` past the finished requests already handed back (out of order, by
    /// ticket), so that it names the oldest one still to hand back.
    #[inline]
    fn settle(&mut self) {
        while self.front < self.arrived && self.done[(self.front & self.mask) as usize].is_none() {
            self.front += 1;
        }
    }

    /// Polls the CQ (arming and parking as [`AsyncCq`] does) and hands each completion to
    /// `complete`, which stores what it finishes. Every completion polled is handled; the
    /// first error is returned after.
    fn fill(
        &mut self,
        cx: &mut Context<'_>,
        mut complete: impl FnMut(&mut WorkCompletion, &mut dyn FnMut(Done<B>)) -> Result<usize>,
    ) -> Poll<Result<()>> {
        if self.arrived == self.posted {
            return Poll::Ready(Err(Error::invalid(
                Verb::Await,
                "nothing is posted on this queue, so no completion can arrive: post first",
            )));
        }
        let Slots { cq, wcs, .. } = self;
        let n = ready!(cq.poll_completions(cx, wcs))?;
        let mut first_error = None;
        for i in 0..n {
            let mut wc = std::mem::take(&mut self.wcs[i]);
            let mut store = |d| self.store(d);
            if let Err(e) = complete(&mut wc, &mut store) {
                first_error.get_or_insert(e);
            }
        }
        Poll::Ready(first_error.map_or(Ok(()), Err))
    }

    /// `Ready` with the request of `ticket` once it is finished, completing what the CQ
    /// holds with `complete` meanwhile.
    fn poll_wait(
        &mut self,
        cx: &mut Context<'_>,
        ticket: &Ticket,
        mut complete: impl FnMut(&mut WorkCompletion, &mut dyn FnMut(Done<B>)) -> Result<usize>,
    ) -> Poll<Result<Done<B>>> {
        loop {
            if let Some(done) = self.take(ticket)? {
                return Poll::Ready(Ok(done));
            }
            ready!(self.fill(cx, &mut complete))?;
        }
    }

    /// `Ready` with the oldest finished request not yet handed back, as `poll_wait`.
    fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
        mut complete: impl FnMut(&mut WorkCompletion, &mut dyn FnMut(Done<B>)) -> Result<usize>,
    ) -> Poll<Result<Done<B>>> {
        loop {
            if let Some(done) = self.take_next() {
                return Poll::Ready(Ok(done));
            }
            ready!(self.fill(cx, &mut complete))?;
        }
    }

    /// Requests posted and not yet handed back.
    fn outstanding(&self) -> usize {
        (self.posted - self.front) as usize
    }
}

#[cold]
fn stray_ticket(t: &Ticket) -> Error {
    Error::invalid(Verb::Await, format!("ticket {} was not issued by this queue", t.seq))
}

#[cold]
fn full(verb: Verb, cap: u64) -> Error {
    Error::invalid(
        verb,
        format!("{cap} requests are posted or finished and not yet awaited: await some (next or wait) first"),
    )
}

/// The requests of a refused batch that were not posted, in order.
#[cold]
fn unposted<R>(mut v: Vec<R>, rest: impl Iterator<Item = R>) -> Vec<R> {
    v.extend(rest);
    v
}

/// Checks that `cq` is the CQ of the queue whose share of it is `share`, and no other
/// queue's; then sets the rest of it aside.
fn own_cq<Rt: Readiness>(share: &CqReservation, cq: &mut AsyncCq<Rt>, what: &str) -> Result<CqReservation> {
    share.whole(cq.cq(), Verb::Claim, what)
}

/// A [`SendQueue`] whose completions are awaited on its own CQ ([`AsyncCq`]), on any
/// executor.
///
/// [`post`](Self::post) returns at once, as [`SendQueue::post`] does, with a [`Ticket`];
/// [`wait`](Self::wait) awaits that request's completion, [`next`](Self::next) the oldest
/// finished request not yet handed back. Either hands back the [`Done`]: the buffer, your
/// id, the operation and the status ([`Done::result`] makes a failure an error).
///
/// - No allocation per request and no lock: each request that may be outstanding has a
///   slot in the queue, made with it, where its completion waits until awaited. One task
///   owns the queue (`&mut self`), so the task's waker is the only one, held by the
///   runtime's reactor for the CQ's channel.
/// - Free when the completion is already there: the CQ is polled first; only an empty
///   CQ is armed and the task parked ([`AsyncCq`], and its
///   [`set_spin`](AsyncCq::set_spin) policy).
/// - The CQ is this queue's alone: it must be the QP's send CQ, no other queue may have
///   claimed room on it, and none can afterwards (the rest of it is set aside).
/// - A request counts against the depth until it is handed back: a finished one still
///   waiting in its slot keeps its place, so a post is refused (with the request back)
///   while `depth` requests are posted or unclaimed.
/// - Cancelling is dropping: a dropped [`wait`](Self::wait) or [`next`](Self::next)
///   future loses nothing (its request comes back through `next`), and a dropped queue
///   keeps what is still posted until the QP is destroyed, as [`SendQueue`] does.
/// - An unsignaled request finishes only when a later signaled one completes: awaiting
///   it with nothing signaled after it waits for ever (wrap it in your runtime's timeout,
///   or post signaled requests).
///
/// Waiting for a QP that broke ends too: a request the peer never answers completes with
/// an error after the QP's timeout and retries, and every request behind it with a flush
/// error.
///
/// The type parameters mean what they mean everywhere in this crate: `T` the buffer, `R`
/// the request kind (as on [`SendQueue<T, R>`](SendQueue)), `Rt` the runtime's readiness
/// ([`Readiness`], as on [`AsyncCq<Rt>`](AsyncCq)).
///
/// A SEND to itself, each request awaited by its ticket on tokio (this example is
/// `tests/device/doc/awaited.rs`, which the device tests run on rxe):
///
#[doc = concat!("```no_run\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/device/doc/awaited.rs")), "```")]
pub struct AsyncSendQueue<T: SendBuf, Rt, R: SendRequest = SendWr<T>> {
    queue: SendQueue<T, R>,
    slots: Slots<R::Back, Rt>,
}

impl<T: SendBuf, Rt: Readiness, R: SendRequest> AsyncSendQueue<T, Rt, R> {
    /// Makes `queue`'s completions awaitable on `cq`, the QP's send CQ, which no other
    /// queue uses. Refused (with both back) when `cq` is another CQ or serves other
    /// queues.
    #[allow(clippy::result_large_err, clippy::type_complexity)] // both come back by value, as they came
    pub fn new(queue: SendQueue<T, R>, mut cq: AsyncCq<Rt>) -> Result<Self, Refused<(SendQueue<T, R>, AsyncCq<Rt>)>> {
        let depth = queue.depth();
        match own_cq(queue.cq_share(), &mut cq, "an AsyncSendQueue") {
            Ok(whole) => Ok(AsyncSendQueue { queue, slots: Slots::new(cq, depth, whole) }),
            Err(e) => Err(Refused::new(e, (queue, cq))),
        }
    }

    /// Posts one request (one provider call, no allocation) and returns its ticket at
    /// once. On refusal (our checks, the provider, or `depth` requests not yet handed
    /// back) the request comes back in the error.
    #[allow(clippy::result_large_err)] // the refused request comes back by value
    #[inline]
    pub fn post(&mut self, wr: R) -> Result<Ticket, Refused<R>> {
        if self.slots.room() == 0 {
            return Err(Refused::new(full(Verb::AsyncSendQueuePost, self.slots.cap), wr));
        }
        // A chain the provider stopped inside is posted in part (its part gets the
        // ticket), and comes back: only a chain needs the count before and after.
        let before = if R::CHAIN { self.queue.posted() } else { 0 };
        let result = self.queue.post(wr);
        let posted = match result {
            Ok(()) => 1,
            Err(_) if R::CHAIN => (self.queue.posted() - before) as usize,
            Err(_) => 0,
        };
        let mut tickets = self.slots.issue(posted);
        result?;
        Ok(tickets.next().expect("one ticket"))
    }

    /// Posts up to [`MAX_BATCH`](crate::MAX_BATCH) requests with one provider call and
    /// returns their tickets. On refusal the ones before the refused one are posted and
    /// the rest come back in order; the posted ones' tickets are lost with the error, but
    /// those requests still come back through [`next`](Self::next).
    pub fn post_batch<I>(&mut self, wrs: I) -> Result<Tickets, Refused<Vec<R>>>
    where
        I: IntoIterator<Item = R>,
    {
        let room = self.slots.room();
        let before = self.queue.posted();
        let mut wrs = wrs.into_iter();
        let result = self.queue.post_batch(wrs.by_ref().take(room));
        let tickets = self.slots.issue((self.queue.posted() - before) as usize);
        match (result, wrs.next()) {
            (Ok(_), None) => Ok(tickets),
            (Ok(_), Some(first)) => {
                Err(Refused::new(full(Verb::AsyncSendQueuePost, self.slots.cap), unposted(vec![first], wrs)))
            }
            (Err(r), first) => Err(r.map(|v| unposted(v, first.into_iter().chain(wrs)))),
        }
    }

    /// Waits for the request of `ticket` to finish and hands it back. Completions of other
    /// requests that arrive meanwhile wait in their slots.
    pub async fn wait(&mut self, ticket: Ticket) -> Result<Done<R::Back>> {
        poll_fn(|cx| self.poll_wait(cx, &ticket)).await
    }

    /// Waits for the oldest finished request not yet handed back, in posting order.
    /// An error when nothing is outstanding (it would wait for ever).
    pub async fn next(&mut self) -> Result<Done<R::Back>> {
        poll_fn(|cx| self.poll_next(cx)).await
    }

    /// [`wait`](Self::wait) as a poll: `Ready` with the request of `ticket` once it is
    /// finished, else `Pending` with `cx`'s waker registered.
    pub fn poll_wait(&mut self, cx: &mut Context<'_>, ticket: &Ticket) -> Poll<Result<Done<R::Back>>> {
        let AsyncSendQueue { queue, slots } = self;
        slots.poll_wait(cx, ticket, |wc, store| queue.complete(wc, store))
    }

    /// [`next`](Self::next) as a poll.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Done<R::Back>>> {
        let AsyncSendQueue { queue, slots } = self;
        slots.poll_next(cx, |wc, store| queue.complete(wc, store))
    }

    /// Requests posted and not yet handed back (finished ones waiting in their slots
    /// included).
    pub fn outstanding(&self) -> usize {
        self.slots.outstanding()
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.queue.qp_num()
    }

    /// How many polls of an empty CQ before parking: [`AsyncCq::set_spin`].
    pub fn set_spin(&mut self, polls: u32) {
        self.slots.cq.set_spin(polls);
    }

    /// How many times an await parked its task: [`AsyncCq::waits`].
    pub fn waits(&self) -> u64 {
        self.slots.cq.waits()
    }
}

impl<T: SendBuf, Rt, R: SendRequest> std::fmt::Debug for AsyncSendQueue<T, Rt, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.slots.debug(f, "AsyncSendQueue", &self.queue)
    }
}

/// A [`RecvQueue`] whose completions are awaited on its own CQ ([`AsyncCq`]), on any
/// executor: [`AsyncSendQueue`]'s twin, with the same guarantees (a slot per receive, no
/// allocation or lock, the CQ the QP's receive CQ and this queue's alone, cancelling by
/// dropping).
///
/// A receive the peer never sends into waits until the QP breaks: a disconnect (flush
/// errors) ends it; wrap the await in your runtime's timeout where a bound matters.
pub struct AsyncRecvQueue<T: ExclusiveBuf, Rt> {
    queue: RecvQueue<T>,
    slots: Slots<T, Rt>,
}

impl<T: ExclusiveBuf, Rt: Readiness> AsyncRecvQueue<T, Rt> {
    /// Makes `queue`'s completions awaitable on `cq`, the QP's receive CQ, which no other
    /// queue uses. Refused (with both back) when `cq` is another CQ or serves other
    /// queues.
    #[allow(clippy::result_large_err, clippy::type_complexity)] // both come back by value, as they came
    pub fn new(queue: RecvQueue<T>, mut cq: AsyncCq<Rt>) -> Result<Self, Refused<(RecvQueue<T>, AsyncCq<Rt>)>> {
        let depth = queue.depth();
        match own_cq(queue.cq_share(), &mut cq, "an AsyncRecvQueue") {
            Ok(whole) => Ok(AsyncRecvQueue { queue, slots: Slots::new(cq, depth, whole) }),
            Err(e) => Err(Refused::new(e, (queue, cq))),
        }
    }

    /// Posts a receive into `range` of `buf` under your `id` and returns its ticket at
    /// once. On refusal the buffer comes back in the error.
    #[inline]
    pub fn post(&mut self, buf: T, range: Range<usize>, id: u64) -> Result<Ticket, Refused<T>> {
        if self.slots.room() == 0 {
            return Err(Refused::new(full(Verb::AsyncRecvQueuePost, self.slots.cap), buf));
        }
        self.queue.post(buf, range, id)?;
        Ok(self.slots.issue(1).next().expect("one ticket"))
    }

    /// Waits for the receive of `ticket` and hands it back with its buffer.
    pub async fn wait(&mut self, ticket: Ticket) -> Result<Done<T>> {
        poll_fn(|cx| self.poll_wait(cx, &ticket)).await
    }

    /// Waits for the oldest finished receive not yet handed back, in posting order.
    pub async fn next(&mut self) -> Result<Done<T>> {
        poll_fn(|cx| self.poll_next(cx)).await
    }

    /// [`wait`](Self::wait) as a poll.
    pub fn poll_wait(&mut self, cx: &mut Context<'_>, ticket: &Ticket) -> Poll<Result<Done<T>>> {
        let AsyncRecvQueue { queue, slots } = self;
        slots.poll_wait(cx, ticket, |wc, store| complete_recv(queue, wc, store))
    }

    /// [`next`](Self::next) as a poll.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Done<T>>> {
        let AsyncRecvQueue { queue, slots } = self;
        slots.poll_next(cx, |wc, store| complete_recv(queue, wc, store))
    }

    /// Receives posted and not yet handed back.
    pub fn outstanding(&self) -> usize {
        self.slots.outstanding()
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.queue.qp_num()
    }

    /// How many polls of an empty CQ before parking: [`AsyncCq::set_spin`].
    pub fn set_spin(&mut self, polls: u32) {
        self.slots.cq.set_spin(polls);
    }

    /// How many times an await parked its task: [`AsyncCq::waits`].
    pub fn waits(&self) -> u64 {
        self.slots.cq.waits()
    }
}

/// Takes a receive completion and keeps the finished receive.
fn complete_recv<T: ExclusiveBuf>(
    queue: &mut RecvQueue<T>,
    wc: &mut WorkCompletion,
    store: &mut dyn FnMut(Done<T>),
) -> Result<usize> {
    store(queue.complete(wc)?);
    Ok(1)
}

impl<T: ExclusiveBuf, Rt> std::fmt::Debug for AsyncRecvQueue<T, Rt> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.slots.debug(f, "AsyncRecvQueue", &self.queue)
    }
}
