//! The receive side: [`RecvQueue`] (a QP's own receives, completing in order) and
//! [`SrqQueue`] (a shared receive queue's, completing in any order).

use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::Range;

use super::claim::{bury, Claim, ClaimOwner};
use super::request::sealed::Sealed;
use super::request::{Token, TOKEN};
use super::ring::{refuse, Batch, Ring};
use super::tag::{ours, wr_id, Tag, LOW_MASK, RECV_TAG, SLOT_BITS, TAG_SHIFT};
use super::{depth, not_ours, queue_full, Sges, MAX_BATCH, NO_SGES};
use crate::buf::{ExclusiveBuf, PdId};
use crate::conv;
use crate::cq::CqReservation;
use crate::error::{Error, Refused, Result, Verb};
use crate::ffi;
use crate::qp::QueuePair;
use crate::srq::SharedReceiveQueue;
use crate::wc::WorkCompletion;
use crate::wr::Done;

impl QueuePair {
    /// Takes the receive side, as deep as the `max_recv_wr` the QP was built with. Fails
    /// if a [`RecvQueue`] of this QP already exists, if the QP takes its receives from an
    /// SRQ (use [`SharedReceiveQueue::queue`]), or if the receive CQ cannot hold that many
    /// completions besides those reserved by the other queues on it.
    pub fn recv_queue<T: ExclusiveBuf>(&self) -> Result<RecvQueue<T>> {
        self.recv_queue_with_depth(self.inner.asked_depth.1.max(1))
    }

    /// Takes the receive side with room for `depth` posted receives (1 up to the QP's
    /// granted `max_recv_wr`), and sets `depth` entries of the receive CQ aside for them.
    pub fn recv_queue_with_depth<T: ExclusiveBuf>(&self, depth: u32) -> Result<RecvQueue<T>> {
        self.recv_queue_of(depth)
    }

    /// Takes the receive side for [`PreparedRecv`](super::PreparedRecv)s, as deep as the
    /// `max_recv_wr` the QP was built with. Fails as [`recv_queue`](Self::recv_queue) does.
    pub fn prepared_recv_queue<T: ExclusiveBuf>(&self) -> Result<super::PreparedRecvQueue<T>> {
        self.prepared_recv_queue_with_depth(self.inner.asked_depth.1.max(1))
    }

    /// Takes the receive side for prepared receives with room for `depth` of them, as
    /// [`recv_queue_with_depth`](Self::recv_queue_with_depth) does.
    pub fn prepared_recv_queue_with_depth<T: ExclusiveBuf>(&self, depth: u32) -> Result<super::PreparedRecvQueue<T>> {
        self.recv_queue_of(depth)
    }

    /// Takes the receive side for [`PreparedRecvChain`](super::PreparedRecvChain)s, as
    /// deep (in C receives) as the `max_recv_wr` the QP was built with. Fails as
    /// [`recv_queue`](Self::recv_queue) does.
    pub fn recv_chain_queue<T: ExclusiveBuf>(&self) -> Result<super::RecvChainQueue<T>> {
        self.recv_chain_queue_with_depth(self.inner.asked_depth.1.max(1))
    }

    /// Takes the receive side for prepared receive chains with room for `depth` C
    /// receives, as [`recv_queue_with_depth`](Self::recv_queue_with_depth) does.
    pub fn recv_chain_queue_with_depth<T: ExclusiveBuf>(&self, depth: u32) -> Result<super::RecvChainQueue<T>> {
        self.recv_queue_of(depth)
    }

    /// Claims the receive side (one poster at a time, whatever it posts) and sets `depth`
    /// entries of the receive CQ aside for it.
    fn recv_queue_of<T: ExclusiveBuf, R: RecvRequest>(&self, depth: u32) -> Result<RecvQueue<T, R>> {
        const VERB: Verb = Verb::Claim;
        if self.has_srq() {
            return Err(Error::invalid(VERB, "this QP receives through its SRQ"));
        }
        let depth = self::depth(VERB, depth, self.inner.caps.max_recv_wr, "max_recv_wr")?;
        let claim = Claim::take(&self.inner, |q| &q.recv_claimed, "this QP's receive side")?;
        let room = CqReservation::take(&self.inner.recv_cq, depth.into(), VERB, "this receive queue")?;
        let tag = Tag::reserve()?;
        Ok(RecvQueue {
            room: Some(room),
            ring: Ring::new(depth),
            scratch: R::Scratch::with_room(depth),
            raw: self.as_raw(),
            qp_num: self.qp_num(),
            max_sge: self.inner.caps.max_recv_sge,
            pd: PdId::of(self.pd()),
            tag_bits: RECV_TAG | tag.bits(),
            oldest: 0,
            member_fail: None,
            run: Run::NONE,
            next_ids: Numbering::NONE,
            tag,
            claim,
            _buf: PhantomData,
        })
    }
}

/// Builds the C receive work request for `range` of `buf` into `out` (its `next` NULL),
/// its SGEs into `sges`, in place; returns it.
#[inline(always)]
pub(super) fn fill_recv<'o, T: ExclusiveBuf>(
    verb: Verb,
    buf: &T,
    range: Range<usize>,
    wr_id: u64,
    (max_sge, pd): (u32, PdId),
    sges: &mut Sges,
    out: &'o mut ffi::ibv_recv_wr,
) -> Result<&'o mut ffi::ibv_recv_wr> {
    let n = buf.sges(verb, range, pd, sges)?;
    if n as u32 > max_sge {
        return Err(too_many_recv_sges(verb, n, max_sge));
    }
    out.wr_id = wr_id;
    out.next = std::ptr::null_mut();
    out.sg_list = sges.as_mut_ptr().cast();
    out.num_sge = n as i32;
    Ok(out)
}

#[cold]
#[inline(never)]
fn too_many_recv_sges(verb: Verb, n: usize, max_sge: u32) -> Error {
    Error::invalid(verb, format!("{n} SGEs, but the queue takes {max_sge} (max_recv_sge)"))
}

// ---- receive side ---------------------------------------------------------------

pub(super) const EMPTY_RECV: ffi::ibv_recv_wr =
    ffi::ibv_recv_wr { wr_id: 0, next: std::ptr::null_mut(), sg_list: std::ptr::null_mut(), num_sge: 0 };

/// Scratch space where a receive queue builds the C receives of a post, kept with the
/// queue (on the stack it would cost every post stack probes and cold pages); nothing in
/// it outlives a post. Only the queues of receives built at each post have one: prepared
/// receives bring their C form. (Public in name only: this module is private.)
/// One slot (160 bytes: a C receive and its SGEs) for each receive one post can stage:
/// the queue's depth, at most [`MAX_BATCH`], so a shallow queue's memory stays small. One
/// allocation of slots, as the send queue's (see there why).
pub struct RecvScratch {
    /// Never empty, and exactly `ring.cap.min(MAX_BATCH)` long (`with_room`).
    slots: Box<[RecvSlot]>,
}

/// Where one C receive of a post is built.
struct RecvSlot {
    sges: Sges,
    raw: ffi::ibv_recv_wr,
}

impl RecvScratch {
    /// The slot of the `n`th receive of a post.
    ///
    /// # Safety
    /// `n` is below the ring's capacity and below [`MAX_BATCH`] (so below the slots'
    /// length).
    #[inline(always)]
    unsafe fn slot(&mut self, n: usize) -> &mut RecvSlot {
        debug_assert!(n < self.slots.len());
        // SAFETY: the caller's bound; the slots are `ring.cap.min(MAX_BATCH)` long.
        unsafe { self.slots.get_unchecked_mut(n) }
    }
}

/// A receive queue's scratch space for a queue `depth` deep. (Public in name only.)
#[doc(hidden)]
pub trait WithRoom {
    /// The scratch space of a queue `depth` deep.
    fn with_room(depth: u32) -> Self;
}

impl WithRoom for () {
    fn with_room(_: u32) {}
}

impl WithRoom for RecvScratch {
    fn with_room(depth: u32) -> Self {
        // The ring's capacity is `depth.max(1)`.
        let room = (depth as usize).clamp(1, MAX_BATCH);
        RecvScratch { slots: (0..room).map(|_| RecvSlot { sges: NO_SGES, raw: EMPTY_RECV }).collect() }
    }
}

/// What a [`RecvQueue`] keeps of each posted receive, and hands back with its
/// completion: `(buffer, your id)` for a receive posted with [`RecvQueue::post`] (checked
/// and built at each post, the default), a [`PreparedRecv`](super::PreparedRecv)
/// (checked and built once, posted again), or a
/// [`PreparedRecvChain`](super::PreparedRecvChain) (several, linked once, posted whole).
/// Sealed.
pub trait RecvRequest: Sealed + Sized + Send + 'static {
    /// What a completion hands back in [`Done::value`]: the buffer, or the whole prepared
    /// receive (to post again).
    type Back;

    /// Where its queue builds C receives at post time: [`RecvScratch`] for receives built
    /// at each post, nothing (`()`) for the kinds that bring their C form.
    #[doc(hidden)]
    type Scratch: WithRoom;

    /// Whether a request of this kind may be a chain of several C receives
    /// ([`width`](Self::width)). A chain sits in the ring slot of its first C receive,
    /// the slots of the others left unwritten; the queue counts how many of the oldest
    /// chain's members have completed.
    #[doc(hidden)]
    const CHAIN: bool = false;

    /// How many C receives it posts (1 unless [`CHAIN`](Self::CHAIN)).
    #[doc(hidden)]
    #[inline(always)]
    fn width(&self) -> usize {
        1
    }

    /// What comes back of it, with how it ended (`wc`, taken by the queue).
    #[doc(hidden)]
    fn finish(self, wc: &WorkCompletion, _: Token) -> Done<Self::Back>;
}

impl<T: ExclusiveBuf> Sealed for (T, u64) {}

impl<T: ExclusiveBuf> RecvRequest for (T, u64) {
    type Back = T;
    type Scratch = RecvScratch;

    #[inline(always)]
    fn finish(self, wc: &WorkCompletion, _: Token) -> Done<T> {
        Done::received(self.1, self.0, wc)
    }
}

/// The receive side of a QP, owning the buffers it has posted. Why that is sound is
/// documented on [`SendQueue`](crate::SendQueue).
///
/// `R` is what it keeps of a posted receive: the buffer and your id, for receives built
/// at each post ([`post`](RecvQueue::post), the default),
/// [`PreparedRecv`](super::PreparedRecv)s, built once
/// ([`PreparedRecvQueue`](super::PreparedRecvQueue)), or
/// [`PreparedRecvChain`](super::PreparedRecvChain)s of them, linked once and posted whole
/// ([`RecvChainQueue`](super::RecvChainQueue), whose `complete` hands a chain back after
/// its last receive). Either way the receive stays in the queue's ring until its
/// completion hands it back.
pub struct RecvQueue<T: Send + 'static, R: RecvRequest = (T, u64)> {
    ring: Ring<R>,
    /// Where a post's C receives and SGEs are built, for the kinds built at post time.
    scratch: R::Scratch,
    /// This queue's share of the receive CQ (buried with what is still posted).
    room: Option<CqReservation>,
    pub(super) raw: *mut ffi::ibv_qp,
    qp_num: u32,
    pub(super) max_sge: u32,
    pub(super) pd: PdId,
    tag: Tag,
    /// `RECV_TAG | tag.bits()`, the high bits of every `wr_id` this queue posts.
    tag_bits: u64,
    /// The sequence number of the oldest outstanding chain's first receive, the slot it
    /// sits in (chains only: `tail - oldest` of its members have completed).
    oldest: u64,
    /// The first failed member of the oldest chain, and its vendor error (chains only;
    /// the failure path).
    member_fail: Option<(usize, u32)>,
    /// Where the next run of the oldest chain's completions goes (chains only).
    run: Run,
    /// The `wr_id`s of the next posts (chains only).
    next_ids: Numbering,
    claim: Claim<crate::qp::QpInner>,
    _buf: PhantomData<fn() -> T>,
}

// SAFETY: as for SendQueue, with the thread-safe ibv_post_recv; what it keeps is Send.
unsafe impl<T: Send + 'static, R: RecvRequest> Send for RecvQueue<T, R> {}

impl<T: Send + 'static, R: RecvRequest> RecvQueue<T, R> {
    /// How many receives may be outstanding.
    pub(super) fn depth(&self) -> u64 {
        self.ring.cap
    }

    /// This queue's share of its CQ.
    pub(super) fn cq_share(&self) -> &CqReservation {
        self.room.as_ref().expect("a live queue holds its share")
    }

    /// Receives posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.ring.outstanding() as usize
    }

    /// Moves an empty queue's sequence numbers on to `seq`, so that a test sees them wrap
    /// (every 2^40 requests, where the low bits of the `wr_id`s start again from 0) within
    /// a few posts. Refused while anything is posted. A test hook, not part of the API.
    #[doc(hidden)]
    pub fn restart_sequence_at(&mut self, seq: u64) -> Result<()> {
        if self.ring.outstanding() != 0 {
            return Err(Error::invalid(Verb::RestartSequenceAt, "only an empty queue restarts its sequence numbers"));
        }
        self.ring.restart_at(seq);
        (self.oldest, self.run, self.member_fail, self.next_ids) = (seq, Run::NONE, None, Numbering::NONE);
        Ok(())
    }

    /// The QP number, to route completions of a shared CQ.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    #[inline(always)]
    fn wr_id(&self, seq: u64) -> u64 {
        wr_id(self.tag_bits, seq)
    }

    /// The ring, for a kind's post, with the `wr_id` tag bits.
    #[inline(always)]
    pub(super) fn ring_and_tag(&mut self) -> (&mut Ring<R>, u64) {
        (&mut self.ring, self.tag_bits)
    }

    /// The sequence number of the next receive posted.
    #[inline(always)]
    pub(super) fn ring_head(&self) -> u64 {
        self.ring.head
    }

    /// The state a chain's completion works on.
    #[inline(always)]
    pub(super) fn chain_state(&mut self) -> ChainState<'_, R> {
        ChainState {
            ring: &mut self.ring,
            tag: self.tag_bits,
            qp_num: self.qp_num,
            oldest: &mut self.oldest,
            member_fail: &mut self.member_fail,
            run: &mut self.run,
        }
    }

    /// The `wr_id`s of the next posts, with the tag bits (chains).
    #[inline(always)]
    pub(super) fn next_ids(&mut self) -> (&mut Numbering, u64) {
        (&mut self.next_ids, self.tag_bits)
    }

    /// Takes a completion of the oldest outstanding receive (a kind of one C receive
    /// each): the core of each such kind's `complete`.
    #[inline(always)]
    pub(super) fn complete_one(&mut self, wc: &mut WorkCompletion) -> Result<Done<R::Back>> {
        debug_assert!(!R::CHAIN, "a chain's members complete one by one");
        // Ours when it is the oldest outstanding receive of this queue on this QP.
        let expected = self.wr_id(self.ring.tail);
        if (wc.wr_id() != expected) | (wc.qp_num() != self.qp_num) | (self.ring.outstanding() == 0) {
            return Err(not_ours(Verb::RecvQueueComplete, "receive", wc));
        }
        let r = self.ring.pop();
        wc.consume();
        Ok(r.finish(wc, TOKEN()))
    }
}

/// What a chain's post and completion reach of a [`RecvQueue`].
pub(super) struct ChainState<'q, R> {
    pub(super) ring: &'q mut Ring<R>,
    /// The `wr_id` tag bits.
    pub(super) tag: u64,
    pub(super) qp_num: u32,
    /// The sequence number of the oldest chain's first receive.
    pub(super) oldest: &'q mut u64,
    /// Its first failed member and that one's vendor error.
    pub(super) member_fail: &'q mut Option<(usize, u32)>,
    pub(super) run: &'q mut Run,
}

/// A receive chain queue's run: what a poll's completions of its oldest chain are
/// checked against and recorded with, set when the chain's first completion (or the
/// first after a wrap of the sequence numbers, or after `complete`) is taken, and kept
/// until the chain's last. A run is on while the ring's tail is below `end`; only the
/// tail moves as completions are taken.
pub(super) struct Run {
    /// The sequence number the run stops at: the chain's end, or the wrap (0: no run).
    pub(super) end: u64,
    /// The sequence number just past the chain's last receive.
    pub(super) last: u64,
    /// What a sequence number adds up to its receive's `wr_id` within the run.
    pub(super) to_id: u64,
    /// Where the record of the chain's member with sequence number 0 would be: that of
    /// the member with sequence number `seq` is `seq` records on (wrapping arithmetic),
    /// in its `arrived`, a heap block that does not move while the chain is posted.
    pub(super) records: *mut u8,
}

impl Run {
    pub(super) const NONE: Run = Run { end: 0, last: 0, to_id: 0, records: std::ptr::null_mut() };
}

/// How a receive chain queue numbers its `wr_id`s between two wraps of their low bits:
/// the sequence numbers below `end` that share the high bits of the one it was set at
/// have `wr_id`s `seq + to_id` (the tag bits and the low bits of `seq`).
#[derive(Clone, Copy)]
pub(super) struct Numbering {
    pub(super) to_id: u64,
    /// The first sequence number past the wrap (0: not set).
    pub(super) end: u64,
}

impl Numbering {
    pub(super) const NONE: Numbering = Numbering { to_id: 0, end: 0 };

    /// The numbering of the queue whose tag bits are `tag` from sequence number `seq` up
    /// to the wrap.
    #[inline(always)]
    pub(super) fn at(tag: u64, seq: u64) -> Numbering {
        let epoch = seq & !LOW_MASK;
        Numbering { to_id: tag.wrapping_sub(epoch), end: epoch.saturating_add(LOW_MASK + 1) }
    }
}

impl<T: ExclusiveBuf> RecvQueue<T> {
    /// Takes a completion of this receive queue and returns the finished receive with
    /// its buffer. Receives complete in posting order; anything else is refused.
    #[inline(always)]
    pub fn complete(&mut self, wc: &mut WorkCompletion) -> Result<Done<T>> {
        self.complete_one(wc)
    }

    /// Posts a receive into `range` of `buf` (one provider call, no allocation, no
    /// syscall). On refusal the buffer comes back in the error.
    #[doc(alias = "ibv_post_recv")]
    // Always inlined, as the send queue's `post`: a call costs more than the rest of it.
    #[inline(always)]
    #[allow(clippy::result_large_err)] // the refused buffer comes back by value
    pub fn post(&mut self, buf: T, range: Range<usize>, id: u64) -> Result<(), Refused<T>> {
        // Without drop glue until it is moved (into the refusal or the ring), as a send
        // queue holds its request: an unwind from a refusal's message would leak it.
        let buf = ManuallyDrop::new(buf);
        if self.ring.free() == 0 {
            return Err(Refused::new(queue_full(Verb::RecvQueuePost, self.ring.cap), ManuallyDrop::into_inner(buf)));
        }
        let wr_id = self.wr_id(self.ring.head);
        // Built in the scratch space (every field written), not on the stack.
        // SAFETY: 0 is below MAX_BATCH and below the ring's capacity (at least 1).
        let RecvSlot { sges, raw } = unsafe { self.scratch.slot(0) };
        let wr = match fill_recv(Verb::RecvQueuePost, &*buf, range, wr_id, (self.max_sge, self.pd), sges, raw) {
            Ok(wr) => wr,
            Err(e) => return Err(Refused::new(e, ManuallyDrop::into_inner(buf))),
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is alive (claim); the SGEs name bytes of `buf`, which the ring
        // owns until the completion and nobody else can reach (ExclusiveBuf).
        let rc = unsafe { ffi::ibv_post_recv(self.raw, wr, &mut bad) };
        if let Err(e) = conv::errno(Verb::PostRecv, rc) {
            return Err(Refused::new(e, ManuallyDrop::into_inner(buf)));
        }
        self.ring.push((ManuallyDrop::into_inner(buf), id));
        Ok(())
    }

    /// Posts up to [`MAX_BATCH`] receives `(buffer, range, id)` with one provider call.
    /// Returns how many were posted; on refusal, the error and the unposted buffers.
    #[doc(alias = "ibv_post_recv")]
    pub fn post_batch<I>(&mut self, recvs: I) -> Result<usize, Refused<Vec<T>>>
    where
        I: IntoIterator<Item = (T, Range<usize>, u64)>,
    {
        const VERB: Verb = Verb::RecvQueuePostBatch;
        // The queue's state read once for the batch, not once a receive, and each C
        // receive linked through the last one's `next` (no test of a first one):
        // scripts/instructions, 2026-12-07.
        let RecvQueue { ring, scratch, raw, max_sge, pd, tag_bits, .. } = self;
        let (limits, tag, raw) = ((*max_sge, *pd), *tag_bits, *raw);
        let room = MAX_BATCH.min(ring.free());
        let head = ring.head;
        let slots = scratch.slots.as_mut_ptr();
        let (base, mask) = ring.slot_base();
        let (mut n, mut refused) = (0, None);
        let mut recvs = recvs.into_iter();
        for (buf, range, id) in recvs.by_ref() {
            if n == room {
                refused = refuse(queue_full(VERB, ring.cap), (buf, id));
                break;
            }
            let seq = head + n as u64;
            // SAFETY: n < room (checked above), at most the ring's free slots (so its
            // capacity) and MAX_BATCH: below the scratch's length, `ring.cap.min(MAX_BATCH)`.
            let RecvSlot { sges, raw: out } = unsafe { &mut *slots.add(n) };
            match fill_recv(VERB, &buf, range, wr_id(tag, seq), limits, sges, out) {
                Ok(wr) => {
                    // Linked to the C receive of the next scratch slot, as far as the slot
                    // after the last one (the last's `next` is set NULL below): no link to
                    // carry from one receive to the next. (An address only, never read
                    // past the scratch.)
                    let next = (&raw mut *wr).cast::<u8>().wrapping_add(std::mem::size_of::<RecvSlot>());
                    wr.next = next.cast();
                    // Staged: `n` past the head, as `Ring::stage` puts it.
                    // SAFETY: a masked index is in bounds (`slot_base`), and the ring is
                    // not borrowed whole in this loop.
                    unsafe { (*base.add((seq & mask) as usize)).write((buf, id)) };
                    n += 1;
                }
                Err(e) => {
                    refused = refuse(e, (buf, id));
                    break;
                }
            }
        }
        let (posted, failure) = if n == 0 {
            (0, None)
        } else {
            // SAFETY: the first and the last of the n scratch slots staged: the chain ends
            // at the last one.
            let first = unsafe {
                (*slots.add(n - 1)).raw.next = std::ptr::null_mut();
                &raw mut (*slots).raw
            };
            let mut bad = std::ptr::null_mut();
            // SAFETY: the QP is alive (claim); `first` heads the n C receives built above,
            // each linked to the next, the last `next` NULL, their SGEs naming bytes of
            // buffers the ring keeps and nobody else can reach (ExclusiveBuf).
            let rc = unsafe { ffi::ibv_post_recv(raw, first, &mut bad) };
            match conv::errno(Verb::PostRecv, rc) {
                Ok(()) => (n, None),
                // SAFETY: as above: a valid chain whose last `next` is NULL.
                Err(e) => (unsafe { super::stopped_at(first, bad) }, Some(Box::new(e))),
            }
        };
        let batch = Batch { staged: n, posted, failure, refused };
        self.ring
            .finish_batch(batch, recvs.map(|(buf, _, id)| (buf, id)))
            .map_err(|r| r.map(|v| v.into_iter().map(|(buf, _)| buf).collect()))
    }
}

impl<T: Send + 'static, R: RecvRequest> Drop for RecvQueue<T, R> {
    fn drop(&mut self) {
        let keep = (std::mem::replace(&mut self.tag, Tag(0)), self.room.take());
        let all = if R::CHAIN { self.ring.take_spans(self.oldest, R::width) } else { self.ring.take_all() };
        bury(self.claim.owner.graveyard(), all, keep);
    }
}

impl<T: Send + 'static, R: RecvRequest> fmt::Debug for RecvQueue<T, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvQueue")
            .field("qp_num", &self.qp_num)
            .field("outstanding", &self.ring.outstanding())
            .finish()
    }
}

// ---- shared receive queue -------------------------------------------------------

/// The posting side of an SRQ, owning the buffers it has posted. Receives complete out of
/// order (any of the SRQ's QPs takes the next one), so each has a slot whose index and
/// generation make up its `wr_id`: a stale or forged completion is refused.
pub struct SrqQueue<T: Send + 'static> {
    slots: Box<[SrqSlot<T>]>,
    free: Box<[u32]>,
    nfree: usize,
    raw: *mut ffi::ibv_srq,
    max_sge: u32,
    pd: PdId,
    tag: Tag,
    claim: Claim<crate::srq::SrqInner>,
}

struct SrqSlot<T> {
    buf: Option<(T, u64)>,
    generation: u32,
}

// SAFETY: as for RecvQueue, with the thread-safe ibv_post_srq_recv.
unsafe impl<T: Send + 'static> Send for SrqQueue<T> {}

impl SharedReceiveQueue {
    /// Takes the posting side. Fails if a [`SrqQueue`] of this SRQ already exists.
    pub fn queue<T: ExclusiveBuf>(&self) -> Result<SrqQueue<T>> {
        let claim = Claim::take(&self.inner, |s| &s.claimed, "this SRQ")?;
        let n = self.inner.granted.max_wr.clamp(1, 1 << SLOT_BITS);
        Ok(SrqQueue {
            slots: (0..n).map(|_| SrqSlot { buf: None, generation: 0 }).collect(),
            free: (0..n).rev().collect(),
            nfree: n as usize,
            raw: self.as_raw(),
            max_sge: self.inner.granted.max_sge,
            pd: PdId::of(self.pd()),
            tag: Tag::reserve()?,
            claim,
        })
    }
}

impl<T: ExclusiveBuf> SrqQueue<T> {
    /// Receives posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.slots.len() - self.nfree
    }

    /// Posts a receive into `range` of `buf`. On refusal the buffer comes back.
    #[doc(alias = "ibv_post_srq_recv")]
    #[inline]
    pub fn post(&mut self, buf: T, range: Range<usize>, id: u64) -> Result<(), Refused<T>> {
        if self.nfree == 0 {
            return Err(Refused::new(queue_full(Verb::SrqQueuePost, self.slots.len() as u64), buf));
        }
        let index = self.free[self.nfree - 1];
        let slot = &mut self.slots[index as usize];
        let wr_id = RECV_TAG | self.tag.bits() | (u64::from(slot.generation) << SLOT_BITS) | u64::from(index);
        let (mut sges, mut wr) = (NO_SGES, EMPTY_RECV);
        let wr = match fill_recv(Verb::SrqQueuePost, &buf, range, wr_id, (self.max_sge, self.pd), &mut sges, &mut wr) {
            Ok(wr) => wr,
            Err(e) => return Err(Refused::new(e, buf)),
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: the SRQ is alive (claim); the SGEs name bytes of `buf`, which the slot
        // owns until the completion and nobody else can reach (ExclusiveBuf).
        let rc = unsafe { ffi::ibv_post_srq_recv(self.raw, wr, &mut bad) };
        if let Err(e) = conv::errno(Verb::PostSrqRecv, rc) {
            return Err(Refused::new(e, buf));
        }
        slot.buf = Some((buf, id));
        self.nfree -= 1;
        Ok(())
    }

    /// Takes a receive completion of any QP attached to this SRQ and returns the
    /// finished receive with its buffer.
    #[inline]
    pub fn complete(&mut self, wc: &mut WorkCompletion) -> Result<Done<T>> {
        let Some(low) = ours(wc, true, self.tag.bits()) else {
            return Err(not_ours(Verb::SrqQueueComplete, "shared receive", wc));
        };
        let (index, generation) = ((low & ((1 << SLOT_BITS) - 1)) as usize, (low >> SLOT_BITS) as u32);
        let slot = match self.slots.get_mut(index) {
            Some(s) if s.generation == generation && s.buf.is_some() => s,
            _ => return Err(not_ours(Verb::SrqQueueComplete, "shared receive", wc)),
        };
        let (buf, user_id) = slot.buf.take().expect("checked above");
        slot.generation = (slot.generation + 1) & ((1 << (TAG_SHIFT - SLOT_BITS)) - 1);
        self.free[self.nfree] = index as u32;
        self.nfree += 1;
        wc.consume();
        Ok(Done::received(user_id, buf, wc))
    }
}

impl<T: Send + 'static> Drop for SrqQueue<T> {
    fn drop(&mut self) {
        let bufs: Vec<T> = self.slots.iter_mut().filter_map(|s| s.buf.take()).map(|(b, _)| b).collect();
        bury(self.claim.owner.graveyard(), bufs, std::mem::replace(&mut self.tag, Tag(0)));
    }
}

impl<T: Send + 'static> fmt::Debug for SrqQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SrqQueue").field("outstanding", &(self.slots.len() - self.nfree)).finish()
    }
}
