//! The send side: one [`SendQueue`] for every kind of request, one way to post (a post is
//! a batch of one), one way to complete, one failure path.

use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;

use super::claim::{bury, Claim, ClaimOwner};
use super::request::{zeroed_wr, AtomicWrite, End, Ext, SendLimits, SendRequest, TOKEN};
use super::ring::{failure_of, Batch, Ring};
use super::tag::{wr_id, Tag, LOW_MASK};
use super::{batch_too_long, depth, queue_full, wider_than_queue, Chain, Sges, MAX_BATCH, NO_SGES};
use crate::buf::{PdId, SendBuf};
use crate::conv;
use crate::cq::CqReservation;
use crate::error::{Error, Refused, Result, Verb};
use crate::ffi;
use crate::qp::{QpInner, QpType, QueuePair};
use crate::wc::{WcStatus, WorkCompletion};
use crate::wr::{Done, SendWr};

/// The send side of a QP, owning what it has posted.
///
/// `R` is what it posts: [`SendWr`]s, checked and built into their C form at each post
/// (the default), or [`PreparedSend`](super::PreparedSend) requests, checked and built once
/// ([`PreparedSendQueue`](super::PreparedSendQueue)). Either way a post moves the request into the
/// queue's ring, where it stays until its completion hands it back.
///
/// # Soundness
///
/// The device reads and writes posted buffers behind the compiler's back. The safe API
/// makes sure no Rust reference can observe or disturb that, without a lock or an
/// allocation on the fast path:
///
/// - A buffer is posted by value: a [`Chunk`](crate::Chunk) (exclusive) or an `Arc<Chunk>` (shared,
///   read-only, for sources the device only reads). The queue keeps it in a slot until
///   the work request completes, and hands it back with the completion
///   ([`SendQueue::complete`], [`RecvQueue::complete`](crate::RecvQueue::complete)). While it is posted, the program
///   has no reference to an exclusive chunk, so it cannot read a receive or RDMA READ
///   target, write a source, move it or free it; and a shared chunk cannot be written
///   by anyone while any clone is out.
/// - Targets the device writes (receives, RDMA READ, atomics) take only exclusive
///   chunks: the types refuse `Arc<Chunk>` there ([`ExclusiveBuf`](crate::ExclusiveBuf)).
/// - Each side of a QP has one owner: [`SendQueue`] and [`RecvQueue`](crate::RecvQueue) are claimed once
///   per QP and post through `&mut self`. The two sides are separate queues in verbs
///   (the provider locks them separately), so they may live on different threads.
/// - Completions are matched to slots by the `wr_id`, which this module chooses: the
///   side, a tag unique in this process to the posting queue (kept reserved while any of
///   its requests may still complete), and a sequence number or slot. A completion from
///   another queue, another QP (even of another device with the same QP number), or a
///   predecessor queue of the same QP is refused; a completion already taken is refused
///   because `complete` marks it taken. Making a
///   completion up is `unsafe` ([`WorkCompletion::from_raw`]). Send completions arrive in
///   posting order, so a signaled completion also releases the unsignaled requests
///   before it. A `WorkCompletion` is neither `Copy` nor `Clone`, and `complete` marks the
///   one it takes, so no completion is ever presented twice.
/// - Dropping a queue that still has requests outstanding must not free their buffers
///   while the device may use them: they move to the QP, which frees them right after
///   `ibv_destroy_qp`, when the device can no longer touch them.
///
/// - A CQ never overruns through these queues: each claims its depth (at most that many
///   requests outstanding) and sets that many entries of its CQ aside; a claim that the CQ
///   cannot hold besides the others' shares is refused, with the size the CQ needs. A
///   dropped queue's share stays with its buried requests until they cannot complete.
///   (An SRQ's receives complete on the CQs of whichever QPs take them: size those CQs
///   for the SRQ's depth too.)
///
/// - The buffer traits ([`SendBuf`](crate::SendBuf), [`ExclusiveBuf`](crate::ExclusiveBuf)) are sealed: a buffer's SGEs are
///   trusted to name only bytes the buffer owns, so only this crate's chunk types (and
///   arrays of them) are buffers.
///
/// Polling is [`CompletionQueue::poll`](crate::CompletionQueue::poll) (`&mut self`: one
/// poller). Waiting through a completion channel is on the CQ as well.
///
/// One [`SendQueue`] posts every kind of send request ([`SendRequest`]): [`SendWr`](crate::SendWr)s,
/// checked and built into their C form at each post, or [`PreparedSend`](crate::PreparedSend) requests, checked and
/// built once and posted again with only the `wr_id` stamped ([`PreparedSendQueue`](crate::PreparedSendQueue) says how,
/// and why it is as sound), alone or linked into a chain posted and handed back whole. A
/// post is a batch of one; a batch is one provider call.
///
/// # The walk from post to completion
///
/// 1. [`SendQueue::post_batch`] (or `post`, a batch of one) takes each request, checks it
///    against the QP ([`SendRequest`]: SGE count, inline size, remote range, transport,
///    protection domain), builds or stamps its C request with a `wr_id` that names this
///    queue and the request's slot, and moves it into that slot of the queue's ring
///    (a single post, once the provider took it).
/// 2. The C requests are linked into one chain and handed to the provider in one
///    `ibv_post_send` (one doorbell). What the provider refuses is taken back out of the
///    ring and handed back, in order, in a [`Refused`](crate::Refused).
/// 3. [`CompletionQueue::poll`](crate::CompletionQueue::poll) fills
///    [`WorkCompletion`]s (`ibv_poll_cq`, nothing added).
/// 4. [`SendQueue::complete`] (or [`complete_all`](SendQueue::complete_all), a poll's worth
///    at once) checks that the completion's `wr_id` is this queue's and
///    outstanding, pops the request and the unsignaled ones before it, and hands each back
///    as a [`Done`](crate::Done) (its buffer, your id, its operation, its status);
///    [`Done::result`](crate::Done::result) turns a failure into an error naming all that.
///
/// Receives go through a [`RecvQueue`](crate::RecvQueue) the same way, one chain per batch. Shared receive
/// queues get a [`SrqQueue`](crate::SrqQueue): receives complete out of order there (any QP may take the
/// next one), so it keeps its buffers in a slot table with a free list.
pub struct SendQueue<T: SendBuf, R: SendRequest = SendWr<T>> {
    // Declared first: dropped (claim released) after the ring is buried. A posted request
    // stays whole in its slot: its buffer, its id, a UD request's address handle.
    ring: Ring<R>,
    /// Where a batch's C requests and SGEs are built (requests that bring their own C
    /// form leave it unused).
    scratch: SendScratch,
    /// This queue's share of the send CQ (buried with what is still posted).
    room: Option<CqReservation>,
    raw: *mut ffi::ibv_qp,
    qp_num: u32,
    limits: SendLimits,
    /// `limits.key()`, compared when a prepared request arrives.
    key: u64,
    /// The extended QP, when it was built with send ops: then `ibv_wr_*` posts what
    /// those ops cover and [`compat::quirks`](crate::compat::quirks) allows, and
    /// `ibv_post_send` the rest.
    ext: Ext,
    tag: Tag,
    /// `tag.bits()`, the high bits of every `wr_id` this queue posts.
    tag_bits: u64,
    /// How many requests (each whole, a chain counting once) were ever posted.
    items: u64,
    /// How many C requests of the oldest outstanding chain completed (always 0 for the
    /// other kinds): that chain sits `into` slots behind the ring's tail.
    into: u64,
    /// The first failed completion of a chain's member, reported when the chain finishes.
    member_fail: Option<End>,
    claim: Claim<QpInner>,
    _buf: PhantomData<fn() -> T>,
}

// SAFETY: the queue owns its requests (R: Send) and posts through the thread-safe
// ibv_post_send; the raw pointers are the QP that `claim` keeps alive.
unsafe impl<T: SendBuf, R: SendRequest> Send for SendQueue<T, R> {}

/// Scratch space where a batch's C requests and their SGEs are built, kept with the send
/// queue (allocated when it is claimed) rather than on the stack, where every post would
/// pay for stack probes and cold pages. Nothing in it outlives a post. One [`Slot`] for
/// each C request one post can stage: the queue's depth, at most [`MAX_BATCH`], so a
/// shallow queue's memory stays small (#45: 16 KiB whatever the depth before). One
/// allocation of slots, not a slice of each part: a post then reads one base address
/// and indexes it once (three slices cost 3 to 4 instructions a single post and 9 to 10
/// a request in batches, scripts/instructions 2026-12-07).
struct SendScratch {
    /// Never empty, and exactly `ring.cap.min(MAX_BATCH)` long (`new`): a post's index
    /// is below that (see `stage`).
    slots: Box<[Slot]>,
}

/// Where one C request of a post is built: its SGEs, the request, and (for the extended
/// API's way) how many SGEs it has.
struct Slot {
    sges: Sges,
    /// Zeroed once; only `classic` writes it (see there).
    raw: ffi::ibv_send_wr,
    count: u8,
}

impl SendScratch {
    /// The scratch of a queue `depth` deep (a ring of capacity `depth.max(1)`).
    fn new(depth: u32) -> SendScratch {
        let room = (depth as usize).clamp(1, MAX_BATCH);
        let mut slots: Box<[Slot]> = (0..room).map(|_| Slot { sges: NO_SGES, raw: zeroed_wr(), count: 0 }).collect();
        // Each C request points at its own slot's SGEs from the start, and every build
        // writes the same (`classic`), so the lean batch loop need not (`classic_fields`).
        // The slots never move: a boxed slice.
        for slot in slots.iter_mut() {
            slot.raw.sg_list = slot.sges.as_mut_ptr().cast();
        }
        SendScratch { slots }
    }

    /// The slot of the `n`th C request of a post.
    ///
    /// # Safety
    /// `n` is below the ring's capacity and below [`MAX_BATCH`] (so below the slots'
    /// length, `ring.cap.min(MAX_BATCH)`).
    #[inline(always)]
    unsafe fn slot(&mut self, n: usize) -> &mut Slot {
        debug_assert!(n < self.slots.len());
        // SAFETY: the caller's bound; the slots are `ring.cap.min(MAX_BATCH)` long.
        unsafe { self.slots.get_unchecked_mut(n) }
    }
}

impl QueuePair {
    pub(crate) fn send_limits(&self) -> SendLimits {
        let caps = self.inner.caps;
        let atomic_write = if self.inner.send_ops.contains(crate::qp::SendOps::ATOMIC_WRITE) {
            AtomicWrite::Takes
        } else if self.inner.atomic_write {
            AtomicWrite::NoSendOp
        } else {
            AtomicWrite::NoDevice
        };
        let ud = self.qp_type() == QpType::Ud;
        // MAX_SGE is small: the limit plus one fits a u16.
        let lim = caps.max_send_sge.min(self.inner.max_sge_rd).min(crate::buf::MAX_SGE as u32) as u16 + 1;
        SendLimits {
            sge_lim: if ud { 0 } else { lim },
            sge_lim_ah: if ud { lim } else { 0 },
            send_sge: u16::try_from(caps.max_send_sge).unwrap_or(u16::MAX),
            read_sge: u16::try_from(self.inner.max_sge_rd).unwrap_or(u16::MAX),
            max_inline: caps.max_inline_data,
            ud,
            pd: PdId::of(self.pd()),
            atomic_write,
            lacks_imm: self.inner.lacks_imm,
            lacks_atomics: self.inner.lacks_atomics,
        }
    }

    /// Takes the send side, as deep as the `max_send_wr` the QP was built with. Fails if
    /// a [`SendQueue`] of this QP already exists, or if the send CQ cannot hold that many
    /// completions besides those reserved by the other queues on it.
    pub fn send_queue<T: SendBuf>(&self) -> Result<SendQueue<T>> {
        self.send_queue_with_depth(self.inner.asked_depth.0)
    }

    /// Takes the send side with room for `depth` outstanding requests (1 up to the QP's
    /// granted `max_send_wr`), and sets `depth` entries of the send CQ aside for their
    /// completions: so a CQ shared by several queues can never overrun.
    pub fn send_queue_with_depth<T: SendBuf>(&self, depth: u32) -> Result<SendQueue<T>> {
        self.send_queue_of(depth)
    }

    /// Takes the send side for [`PreparedSend`](super::PreparedSend) requests, as deep as the
    /// `max_send_wr` the QP was built with. Fails as [`send_queue`](Self::send_queue) does.
    pub fn prepared_send_queue<T: SendBuf>(&self) -> Result<super::PreparedSendQueue<T>> {
        self.prepared_send_queue_with_depth(self.inner.asked_depth.0)
    }

    /// Takes the send side for prepared requests with room for `depth` outstanding
    /// requests, as [`send_queue_with_depth`](Self::send_queue_with_depth) does.
    pub fn prepared_send_queue_with_depth<T: SendBuf>(&self, depth: u32) -> Result<super::PreparedSendQueue<T>> {
        self.send_queue_of(depth)
    }

    /// Takes the send side for [`PreparedSendChain`](super::PreparedSendChain)s, as deep (in C
    /// requests) as the `max_send_wr` the QP was built with. Fails as
    /// [`send_queue`](Self::send_queue) does.
    pub fn send_chain_queue<T: SendBuf>(&self) -> Result<super::SendChainQueue<T>> {
        self.send_chain_queue_with_depth(self.inner.asked_depth.0)
    }

    /// Takes the send side for prepared chains with room for `depth` outstanding C
    /// requests, as [`send_queue_with_depth`](Self::send_queue_with_depth) does.
    pub fn send_chain_queue_with_depth<T: SendBuf>(&self, depth: u32) -> Result<super::SendChainQueue<T>> {
        self.send_queue_of(depth)
    }

    /// Claims the send side (one poster at a time, whatever it posts) and sets `depth`
    /// entries of the send CQ aside for it.
    pub(crate) fn send_queue_of<T: SendBuf, R: SendRequest>(&self, depth: u32) -> Result<SendQueue<T, R>> {
        let depth = depth_of(self, depth)?;
        let claim = Claim::take(&self.inner, |q| &q.send_claimed, "this QP's send side")?;
        let room = CqReservation::take(&self.inner.send_cq, depth.into(), Verb::Claim, "this send queue")?;
        let limits = self.send_limits();
        let tag = Tag::reserve()?;
        if self.inner.qp_ex.is_some() {
            // Which rdma-core is loaded (its quirks decide what the extended API takes) is
            // read from the file system once: here, in the control plane, not at a post.
            crate::compat::quirks();
        }
        Ok(SendQueue {
            ring: Ring::new(depth),
            scratch: SendScratch::new(depth),
            room: Some(room),
            raw: self.as_raw(),
            qp_num: self.qp_num(),
            key: limits.key(),
            limits,
            ext: self.inner.qp_ex.map(|q| (q, self.inner.send_ops)),
            tag_bits: tag.bits(),
            items: 0,
            into: 0,
            member_fail: None,
            tag,
            claim,
            _buf: PhantomData,
        })
    }
}

fn depth_of(qp: &QueuePair, asked: u32) -> Result<u32> {
    depth(Verb::Claim, asked, qp.inner.caps.max_send_wr, "max_send_wr")
}

impl<T: SendBuf, R: SendRequest> SendQueue<T, R> {
    pub(crate) fn limits(&self) -> &SendLimits {
        &self.limits
    }

    /// How many requests may be outstanding.
    pub(super) fn depth(&self) -> u64 {
        self.ring.cap
    }

    /// How many requests were ever posted (a chain counts once).
    pub(super) fn posted(&self) -> u64 {
        self.items
    }

    /// This queue's share of its CQ.
    pub(super) fn cq_share(&self) -> &CqReservation {
        self.room.as_ref().expect("a live queue holds its share")
    }

    /// Requests posted and not yet completed.
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
        (self.into, self.member_fail) = (0, None);
        Ok(())
    }

    /// The QP number, to route completions of a shared CQ.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// True when this QP was built with extended send ops, so requests built at post
    /// time go through the `ibv_wr_*` API where the loaded rdma-core handles them
    /// ([`compat::quirks`](crate::compat::quirks)).
    pub fn uses_extended_api(&self) -> bool {
        self.ext.is_some()
    }

    /// Posts one request: one provider call (one doorbell), no allocation. On refusal
    /// (by our checks or by the provider) the request comes back in the error. (A
    /// prepared chain the provider stopped inside: its unposted part comes back, and the
    /// posted part with the completion of its last request.)
    #[doc(
        alias = "ibv_post_send",
        alias = "ibv_wr_start",
        alias = "ibv_wr_complete",
        alias = "ibv_wr_set_sge",
        alias = "ibv_wr_set_sge_list"
    )]
    // Always inlined: a tool's posting loop is large enough that the hint alone left this
    // an out-of-line call, ~10 instructions a post (scripts/per-message).
    #[inline(always)]
    #[allow(clippy::result_large_err)] // the refused request comes back by value: no allocation
    pub fn post(&mut self, wr: R) -> Result<(), Refused<R>> {
        self.post_named(Verb::SendQueuePost, wr)
    }

    /// [`post`](Self::post), its refusals naming `verb` (the method that asked).
    #[inline(always)]
    #[allow(clippy::result_large_err)] // as post
    pub(crate) fn post_named(&mut self, verb: Verb, wr: R) -> Result<(), Refused<R>> {
        // A request of one C request (anything but a chain): straight through, with no
        // batch state; on a QP built with send ops, the extended API's way for a kind that
        // may go it.
        if !R::CHAIN {
            let qpx = match self.ext {
                Some((qpx, _)) if R::EXTENDED => Some(qpx.as_ptr()),
                _ => None,
            };
            return self.post_one(verb, wr, qpx);
        }
        // A chain: a batch of one, the same two steps as post_batch without an iterator
        // (which would move the request twice more on its way into the ring).
        let most = MAX_BATCH;
        let room = self.ring.free().min(most);
        let mut chain = Staging::new();
        // SAFETY: room is at most the free slots and MAX_BATCH.
        let (n, refused) = match unsafe { self.stage(verb, 0, room, most, wr, &mut chain) } {
            Ok(w) => (w, None),
            Err(r) => (0, Some(r)),
        };
        let batch = self.post_staged(n, chain, refused);
        if batch.failure.is_none() && batch.refused.is_none() {
            self.ring.commit(n);
            self.items += 1;
            return Ok(());
        }
        let (error, mut unposted) = self.failed(batch, std::iter::empty());
        let wr = unposted.pop().expect("a failed post of one request hands back it or its unposted part");
        Err(Refused::new(error, wr))
    }

    /// [`post`](Self::post) of a request of one C request: the steps of `stage` and
    /// `post_staged` for a batch of one, with nothing kept for a batch (the chain, the
    /// extended API's counts, the batch's outcome), and each refusal out of line. With
    /// `qpx` (a QP built with send ops, for a kind that may go its way) through the
    /// extended API when it takes the request (`ibv_wr_start`, the request's operation
    /// and SGEs, `ibv_wr_complete`), else through `ibv_post_send`, as `post_staged`
    /// chooses for a batch of one.
    #[inline(always)]
    #[allow(clippy::result_large_err)] // as post
    fn post_one(&mut self, verb: Verb, wr: R, qpx: Option<*mut ffi::ibv_qp_ex>) -> Result<(), Refused<R>> {
        debug_assert!(!R::CHAIN && (qpx.is_none() || R::EXTENDED));
        let SendQueue { ring, scratch, limits, key, tag_bits, raw, ext, .. } = self;
        if ring.free() == 0 {
            return Err(full(verb, ring.cap, wr));
        }
        let seq = ring.head;
        // SAFETY: 0 is below MAX_BATCH and below the ring's capacity (at least 1).
        let Slot { sges, raw: out, .. } = unsafe { scratch.slot(0) };
        // Checked and built where the caller built it (its constant fields fold into the
        // checks), and moved into the ring once posted, as `stage` does. Held without
        // drop glue meanwhile: every way out below moves it (into the refusal or the
        // ring). An unwind from a call in between (a refusal's message, the provider's
        // missing operation) would leak it rather than drop it: with its drop on that
        // edge, the compiler kept the whole request on the stack and copied it into its
        // slot from there (scripts/instructions: 5 to 11 instructions a single post).
        let mut wr = ManuallyDrop::new(wr);
        let k = match wr.check(verb, limits, *key, sges, TOKEN()) {
            Ok(k) => k,
            Err(e) => return Err(Refused::new(e, ManuallyDrop::into_inner(wr))),
        };
        let rc = match qpx {
            // SAFETY: `qpx` is this queue's extended QP, posted to by this queue alone
            // (&mut, claimed), so the batch opened here is ours; the request was checked
            // and the extended API takes it (`ext_takes`); its SGEs name bytes of the
            // buffer it owns, which the ring keeps from the post to the completion.
            Some(qpx) if wr.ext_takes(*ext, k, TOKEN()) => unsafe {
                ffi::ibv_wr_start(qpx);
                wr.extended(qpx, wr_id(*tag_bits, seq), sges, k, TOKEN());
                ffi::ibv_wr_complete(qpx)
            },
            _ => {
                let (first, _) = wr.c_request(*tag_bits, seq, sges, k, out, TOKEN());
                let mut bad = std::ptr::null_mut();
                // SAFETY: as in post_staged: one valid C request (its `next` NULL) in the
                // scratch space or in the request (its heap block, or a bind's own C
                // request: the request moves only after the post), its SGEs naming bytes
                // of the buffer the request owns, which the ring keeps from the post to
                // the completion; a UD request's address handle is kept with it.
                unsafe { ffi::ibv_post_send(*raw, first, &mut bad) }
            }
        };
        if rc != 0 {
            // A failed ibv_wr_complete posts nothing of its batch, a failed ibv_post_send
            // of one request nothing.
            return Err(provider_refused(rc, ManuallyDrop::into_inner(wr)));
        }
        // Posted: into the ring until its completion. Nothing in between can fail or
        // unwind, and until then only this function holds the request.
        ManuallyDrop::into_inner(wr).keep(ring.slot(seq), TOKEN());
        ring.commit(1);
        self.items += 1;
        Ok(())
    }

    /// Posts one request with `post` instead of `ibv_post_send`: a provider call that puts
    /// one work request on this QP's send queue by itself, with the `wr_id` it is given
    /// (`ibv_bind_mw`). The request takes the next ring slot like any other, so its
    /// completion is matched, and what it holds kept, as theirs are. `post` gets the QP,
    /// that `wr_id` and the request in its slot (where it stays until its completion);
    /// on its error the request comes back. The caller checked the request (`verb` names
    /// the caller, for a full queue).
    #[cold]
    #[allow(clippy::result_large_err)] // the refused request comes back by value
    pub(crate) fn post_by(
        &mut self,
        verb: Verb,
        wr: R,
        post: impl FnOnce(*mut ffi::ibv_qp, u64, &mut R) -> Result<()>,
    ) -> Result<(), Refused<R>> {
        debug_assert!(!R::CHAIN, "a chain is posted with ibv_post_send");
        if self.ring.free() == 0 {
            return Err(Refused::new(queue_full(verb, self.ring.cap), wr));
        }
        let seq = self.ring.head;
        let staged = self.ring.stage(0, wr);
        match post(self.raw, wr_id(self.tag_bits, seq), staged) {
            Ok(()) => {
                self.ring.commit(1);
                self.items += 1;
                Ok(())
            }
            // SAFETY: staged just above and not committed: read out once.
            Err(e) => Err(Refused::new(e, unsafe { self.ring.unstage(0) })),
        }
    }

    /// Posts up to [`MAX_BATCH`] C requests with one provider call (one doorbell): that
    /// many requests, or fewer when some are prepared chains. (On a QP with extended send
    /// ops, a request the extended API does not take, with the rest after it, goes the
    /// classic way in a second call, in order.) Returns how many requests were posted. When one is refused (by our checks or by the provider), the ones
    /// before it are posted, and the error comes back with the requests that were not
    /// posted, in order (that path allocates, the fast path does not).
    #[doc(
        alias = "ibv_post_send",
        alias = "ibv_wr_start",
        alias = "ibv_wr_complete",
        alias = "ibv_wr_set_sge",
        alias = "ibv_wr_set_sge_list"
    )]
    #[inline]
    pub fn post_batch<I>(&mut self, wrs: I) -> Result<usize, Refused<Vec<R>>>
    where
        I: IntoIterator<Item = R>,
    {
        let mut wrs = wrs.into_iter();
        // A request built at each post (a `SendWr`): a lean loop, with nothing of the
        // other kinds' in it, one for each API. (Unless the low bits of the `wr_id`s could
        // wrap inside the batch, once in 2^40 requests: those loops number them by adding
        // one.)
        let lean = !R::CHAIN && !R::BUILD_IN_SLOT && (self.ring.head & LOW_MASK) + (MAX_BATCH as u64) <= LOW_MASK;
        if lean && (!R::EXTENDED || self.ext.is_none()) {
            return self.post_batch_built(wrs);
        }
        if let (true, Some((qpx, _))) = (lean, self.ext) {
            return match self.post_batch_extended(qpx.as_ptr(), &mut wrs)? {
                (n, None) => Ok(n),
                // A request the extended API does not take: it and the rest go the general
                // way, in a post of their own.
                (n, Some(wr)) => self.post_batch_staged(std::iter::once(wr).chain(wrs), MAX_BATCH - n).map(|m| n + m),
            };
        }
        self.post_batch_staged(wrs, MAX_BATCH)
    }

    /// [`post_batch`](Self::post_batch) through `stage` and `post_staged`, which serve
    /// every kind: at most `most` C requests (MAX_BATCH, less what a lean loop posted of
    /// the same batch).
    #[inline(always)]
    fn post_batch_staged(&mut self, mut wrs: impl Iterator<Item = R>, most: usize) -> Result<usize, Refused<Vec<R>>> {
        let room = self.ring.free().min(most);
        let mut chain = Staging::new();
        let (mut n, mut items, mut refused) = (0, 0, None);
        for wr in wrs.by_ref() {
            // SAFETY: room is at most the free slots and MAX_BATCH.
            match unsafe { self.stage(Verb::SendQueuePostBatch, n, room, most, wr, &mut chain) } {
                Ok(w) => {
                    n += w;
                    items += 1;
                }
                Err(r) => {
                    refused = Some(r);
                    break;
                }
            }
        }
        let batch = self.post_staged(n, chain, refused);
        if batch.failure.is_none() && batch.refused.is_none() {
            self.ring.commit(n);
            self.items += items as u64;
            return Ok(items);
        }
        let (error, unposted) = self.failed(batch, wrs);
        Err(Refused::new(error, unposted))
    }

    /// [`post_batch`](Self::post_batch) of requests built at each post (one C request
    /// each, built from the caller's request: not [`SendRequest::CHAIN`] nor
    /// [`SendRequest::BUILD_IN_SLOT`]) going through `ibv_post_send`: each request copied
    /// into its ring slot (`keep_copy`, the copy its owner from then on), its C request
    /// built in place in its scratch slot straight from the caller's with its `wr_id` (a
    /// running count: the caller made sure its low bits do not wrap within the batch) and
    /// linked to the next scratch slot's, then checked where the caller built it (its
    /// SGEs written into its scratch slot, and their count into the C request); the
    /// queue's state read once for the batch, not once a request. Through `stage`, which
    /// serves every kind, a WRITE in batches of 32 cost 312.6 instructions a request,
    /// here 281.6 (scripts/instructions, 2026-12-08: the fewer values the loop carries
    /// across the checks, the fewer the compiler spills to the stack). The same checks,
    /// refusals and failure path as `stage` and `post_staged`.
    #[inline(always)]
    // `id` moves on with the scratch slot `at`, the loop's state as counted (a zip with a
    // range of ids was not measured).
    #[allow(clippy::explicit_counter_loop)]
    fn post_batch_built(&mut self, mut wrs: impl Iterator<Item = R>) -> Result<usize, Refused<Vec<R>>> {
        debug_assert!(!R::CHAIN && !R::BUILD_IN_SLOT && (!R::EXTENDED || self.ext.is_none()));
        const VERB: Verb = Verb::SendQueuePostBatch;
        let SendQueue { ring, scratch, limits, key, tag_bits, raw, .. } = self;
        let (limits, key, raw) = (*limits, *key, *raw);
        let room = ring.free().min(MAX_BATCH);
        let slots = scratch.slots.as_mut_ptr();
        // The scratch slots of this post are slots..end, the next one `at`.
        let (mut at, end) = (slots, slots.wrapping_add(room));
        let (base, mask) = ring.slot_base();
        // The next request's `wr_id`: its tag and sequence number; the caller made sure
        // its low bits do not wrap within MAX_BATCH. Its low bits masked are the ring
        // slot (the mask is below 2^40).
        let mut id = wr_id(*tag_bits, ring.head);
        debug_assert!(mask <= LOW_MASK && (id & LOW_MASK) + MAX_BATCH as u64 <= LOW_MASK);
        let mut refused = None;
        for wr in wrs.by_ref() {
            // Without drop glue until it is moved (into the refusal or its slot), as in
            // `post_one`: else the compiler builds it on the stack first, to drop it on
            // the way out of a refusal.
            let mut wr = ManuallyDrop::new(wr);
            if at == end {
                let e = if room == MAX_BATCH { batch_too_long(VERB) } else { queue_full(VERB, ring.cap) };
                refused = Some(refusal(e, ManuallyDrop::into_inner(wr)));
                break;
            }
            // SAFETY: `at` is below `end`: one of the `room` slots, at most MAX_BATCH and
            // the ring's free slots (so its capacity), so below the scratch's length,
            // `ring.cap.min(MAX_BATCH)`.
            let Slot { sges, raw: out, .. } = unsafe { &mut *at };
            // Staged past the head, as `Ring::stage` puts it: a copy, which owns the
            // request from here on (`wr` is never dropped, only read); a refusal reads it
            // back out (then the fields of `wr` need not outlive the checks).
            // SAFETY: a masked index is in bounds (`slot_base`), and the ring is not
            // borrowed whole in this loop.
            let slot = unsafe { &mut *base.add((id & mask) as usize) };
            // SAFETY: the copy is the owner; `wr` is not changed while it is read below.
            unsafe { wr.keep_copy(slot, TOKEN()) };
            // The C request is built before the checks, all but its SGE count (a refused
            // request's stays in the scratch, never posted): the request's fields go into
            // it where they are loaded, and need not outlive the checks.
            let cur = wr.c_request_with_id(id, sges, 0, out, TOKEN());
            // Linked to the C request of the next scratch slot, as far as the slot after
            // the last one (the last's `next` is set NULL below): no link to carry from
            // one request to the next. (An address only, never read past the scratch.)
            // SAFETY: `cur` is the C request just built, in its scratch slot.
            unsafe { (*cur).next = cur.cast::<u8>().wrapping_add(std::mem::size_of::<Slot>()).cast() };
            let k = match wr.check(VERB, &limits, key, sges, TOKEN()) {
                Ok(k) => k,
                Err(e) => {
                    // SAFETY: the copy just made, read out once (past the head, the ring
                    // never reads it).
                    refused = Some(refusal(e, unsafe { slot.assume_init_read() }));
                    break;
                }
            };
            // SAFETY: as above.
            unsafe { (*cur).num_sge = k as i32 };
            at = at.wrapping_add(1);
            id += 1;
        }
        // SAFETY: `at` is `slots` moved on once a staged request, within the scratch.
        let n = unsafe { at.offset_from(slots) } as usize;
        let first: *mut ffi::ibv_send_wr = if n == 0 {
            std::ptr::null_mut()
        } else {
            // SAFETY: the first and the last of the n scratch slots staged: the chain ends
            // at the last one.
            unsafe {
                (*at.sub(1)).raw.next = std::ptr::null_mut();
                &raw mut (*slots).raw
            }
        };
        let (posted, failure) = if n == 0 {
            (0, None)
        } else {
            let mut bad = std::ptr::null_mut();
            // SAFETY: `first` heads the n C requests built above, each in its scratch slot,
            // linked to the next, the last `next` NULL (set above), with SGEs naming bytes
            // of buffers the ring keeps until their completion; the QP is alive (claim).
            let rc = unsafe { ffi::ibv_post_send(raw, first, &mut bad) };
            match conv::errno(Verb::PostSend, rc) {
                Ok(()) => (n, None),
                // SAFETY: as above: a valid chain whose last `next` is NULL.
                Err(e) => (unsafe { super::stopped_at(first, bad) }, Some(Box::new(e))),
            }
        };
        if failure.is_none() && refused.is_none() {
            self.ring.commit(n);
            self.items += n as u64;
            return Ok(n);
        }
        let (error, unposted) = self.failed(Batch { staged: n, posted, failure, refused }, wrs);
        Err(Refused::new(error, unposted))
    }

    /// [`post_batch`](Self::post_batch) of requests built at each post on a QP with the
    /// extended API: each request copied into its ring slot (as in `post_batch_built`),
    /// checked where the caller built it, and added to one `ibv_wr_start` batch straight
    /// from it with its `wr_id` (a running count, as in `post_batch_built`);
    /// `ibv_wr_complete` posts them.
    /// Nothing is staged in the scratch slots: the SGE list of the request at hand is on
    /// the stack (the provider copies it during the call; read from scratch slot 0, it
    /// cost 3.9 instructions a request more: scripts/instructions, 2026-12-08). Returns
    /// how many it posted and, when it met a checked request the extended API does not
    /// take (an operation the QP was built without, an SGE list the loaded rdma-core
    /// mishandles: `ext_takes`), that request, not posted: the caller posts it and the
    /// rest the general way.
    #[inline(always)]
    // `id` moves on with `n`, as in `post_batch_built`.
    #[allow(clippy::type_complexity, clippy::explicit_counter_loop)]
    fn post_batch_extended(
        &mut self,
        qpx: *mut ffi::ibv_qp_ex,
        wrs: &mut impl Iterator<Item = R>,
    ) -> Result<(usize, Option<R>), Refused<Vec<R>>> {
        const VERB: Verb = Verb::SendQueuePostBatch;
        let SendQueue { ring, limits, key, tag_bits, ext, .. } = self;
        let (limits, key, ext) = (*limits, *key, *ext);
        let room = ring.free().min(MAX_BATCH);
        let (base, mask) = ring.slot_base();
        let mut id = wr_id(*tag_bits, ring.head);
        debug_assert!(mask <= LOW_MASK && (id & LOW_MASK) + MAX_BATCH as u64 <= LOW_MASK);
        // The SGE list of the request at hand, on the stack: the provider copies it.
        let mut list = NO_SGES;
        let sges = &mut list;
        let (mut n, mut refused, mut other) = (0, None, None);
        for wr in wrs.by_ref() {
            // Without drop glue until it is moved, as in `post_batch_built`.
            let wr = ManuallyDrop::new(wr);
            if n == room {
                let e = if room == MAX_BATCH { batch_too_long(VERB) } else { queue_full(VERB, ring.cap) };
                refused = Some(refusal(e, ManuallyDrop::into_inner(wr)));
                break;
            }
            // Staged past the head, a copy that owns the request, as in
            // `post_batch_built`.
            // SAFETY: a masked index is in bounds (`slot_base`), and the ring is not
            // borrowed whole in this loop.
            let slot = unsafe { &mut *base.add((id & mask) as usize) };
            // SAFETY: the copy is the owner; `wr` is not changed while it is read below.
            unsafe { wr.keep_copy(slot, TOKEN()) };
            let k = match wr.check(VERB, &limits, key, sges, TOKEN()) {
                Ok(k) => k,
                Err(e) => {
                    // SAFETY: the copy just made, read out once (past the head, the ring
                    // never reads it).
                    refused = Some(refusal(e, unsafe { slot.assume_init_read() }));
                    break;
                }
            };
            if !wr.ext_takes(ext, k, TOKEN()) {
                // SAFETY: as above.
                other = Some(unsafe { slot.assume_init_read() });
                break;
            }
            // SAFETY: `qpx` is this queue's extended QP, posted to by this queue alone
            // (&mut, claimed), so the batch opened here is ours; the request was checked
            // and the extended API takes it; its SGEs name bytes of the buffer it owns,
            // which the ring keeps from the post to the completion (or, should the post
            // fail, hands back).
            unsafe {
                if n == 0 {
                    ffi::ibv_wr_start(qpx);
                }
                wr.extended(qpx, id, sges, k, TOKEN());
            }
            n += 1;
            id += 1;
        }
        let failure = if n == 0 {
            None
        } else {
            // SAFETY: the batch opened above, with the n requests added to it.
            let rc = unsafe { ffi::ibv_wr_complete(qpx) };
            // A failed ibv_wr_complete posts nothing of the batch.
            conv::errno(Verb::PostSend, rc).err().map(Box::new)
        };
        if failure.is_none() && refused.is_none() {
            self.ring.commit(n);
            self.items += n as u64;
            return Ok((n, other));
        }
        let posted = if failure.is_some() { 0 } else { n };
        let (error, unposted) =
            self.failed(Batch { staged: n, posted, failure, refused }, other.into_iter().chain(wrs.by_ref()));
        Err(Refused::new(error, unposted))
    }

    /// Step one of every post: checks `wr`, (on a QP without the extended API, or for a
    /// chain) builds or stamps its C request(s) and appends them to `chain`, and moves it
    /// into the ring (into the slot of its first C request, `n` places past the head;
    /// a kind with [`SendRequest::BUILD_IN_SLOT`] is moved before it is built). `room`
    /// is how many C requests this post may stage, `most` the longest post allowed,
    /// `verb` the post method (a refusal names it). Returns how many C requests it
    /// staged.
    ///
    /// # Safety
    /// `room` is at most the ring's free slots and at most [`MAX_BATCH`] (the C requests
    /// staged go into scratch slots `n..n + w`, unchecked).
    #[inline(always)]
    unsafe fn stage(
        &mut self,
        verb: Verb,
        n: usize,
        room: usize,
        most: usize,
        wr: R,
        chain: &mut Staging,
    ) -> Result<usize, Box<Refused<R>>> {
        let SendQueue { ring, scratch, limits, key, ext, tag_bits, .. } = self;
        // Without drop glue until it is moved (into the refusal or its slot), as in
        // `post_one`.
        let mut wr = ManuallyDrop::new(wr);
        let w = wr.width();
        // (Every kind's width is at least 1; `max` makes `n < room` follow whatever a
        // width says, and folds away for a request of one C request.)
        if n + w.max(1) > room {
            let e = if n + w > most {
                batch_too_long(verb)
            } else if w as u64 > ring.cap {
                wider_than_queue(verb, w, ring.cap)
            } else {
                queue_full(verb, ring.cap)
            };
            return Err(refusal(e, ManuallyDrop::into_inner(wr)));
        }
        // SAFETY: n < room (checked above), and room is at most the ring's free slots
        // (so its capacity) and MAX_BATCH (the caller).
        let Slot { sges, raw: out, count } = unsafe { scratch.slot(n) };
        let seq = ring.head + n as u64;
        // Checked where the caller built it (its constant fields fold into the checks),
        // then built and moved into its ring slot, where it stays (in the order its kind
        // says: `SendRequest::BUILD_IN_SLOT`); a refused one goes back as it came. A
        // chain's other C requests leave their slots empty.
        let k = match wr.check(verb, limits, *key, sges, TOKEN()) {
            Ok(k) => k,
            Err(e) => return Err(refusal(e, ManuallyDrop::into_inner(wr))),
        };
        // An RDMA ATOMIC WRITE has no classic form: a batch with one must go the
        // extended way whole (only a QP with the extended API takes one: `check`).
        if R::EXTENDED && ext.is_some() {
            let must = wr.needs_extended(TOKEN());
            if (must && !chain.all_ext) || (chain.needs_ext && !wr.ext_takes(*ext, k, TOKEN())) {
                return Err(refusal(mixed_batch(verb), ManuallyDrop::into_inner(wr)));
            }
            chain.needs_ext |= must;
        }
        // (A function, not a closure: a closure here stopped being inlined, and its
        // call and the request's copy into it cost 35 instructions a request in batches.)
        let at = Staged { seq, k, tag: *tag_bits, ext: *ext };
        if R::BUILD_IN_SLOT {
            build(ManuallyDrop::into_inner(wr).keep(ring.slot(seq), TOKEN()), at, sges, out, count, chain);
        } else {
            build(&mut *wr, at, sges, out, count, chain);
            ManuallyDrop::into_inner(wr).keep(ring.slot(seq), TOKEN());
        }
        Ok(w)
    }

    /// Step two of every post: hands the `n` staged C requests to the provider in one call
    /// (the extended API's batch when it takes them all, else the chain of C requests).
    #[inline(always)]
    fn post_staged(&mut self, n: usize, mut chain: Staging, refused: Option<Box<Refused<R>>>) -> Batch<R> {
        let SendQueue { ring, scratch, raw, ext, tag_bits, .. } = self;
        let (raw, ext, tag) = (*raw, *ext, *tag_bits);
        let (posted, failure) = if n == 0 {
            (0, None)
        } else if R::EXTENDED && ext.is_some() && chain.all_ext {
            post_extended(ext, ring, tag, &scratch.slots[..n])
        } else {
            if R::EXTENDED && ext.is_some() {
                // A batch the extended API does not take whole goes the classic way.
                let head = ring.head;
                for (i, Slot { sges, raw, count }) in scratch.slots[..n].iter_mut().enumerate() {
                    // SAFETY: 0..n were staged by `stage` (one C request each).
                    let wr = unsafe { ring.staged(i) };
                    let (first, last) = wr.c_request(tag, head + i as u64, sges, usize::from(*count), raw, TOKEN());
                    chain.classic.link_span(first, last);
                }
            }
            // SAFETY: the chain holds valid C requests (linked by `stage` or above, the
            // last `next` NULL), each in the scratch space or in the heap block of a
            // request the ring keeps until its completion, with SGEs naming bytes of
            // buffers the ring keeps too; a UD request's address handle is kept with it.
            chain.classic.post(Verb::PostSend, n, |first, bad| unsafe { ffi::ibv_post_send(raw, first, bad) })
        };
        Batch { staged: n, posted, failure, refused }
    }

    /// The failure path of every post: commits the C requests the provider took (a chain
    /// it stopped inside is split: the posted part stays, to come back with its last
    /// completion) and returns the error with every request not posted, in order: the
    /// staged ones, the refused one, then `rest`.
    #[cold]
    #[inline(never)]
    fn failed(&mut self, b: Batch<R>, rest: impl Iterator<Item = R>) -> (Error, Vec<R>) {
        let Batch { staged: n, posted, failure, refused } = b;
        let ring = &mut self.ring;
        let (mut unposted, mut items, mut i) = (Vec::new(), 0, 0);
        while i < n {
            // SAFETY: each request was staged by `stage` in the slot of its first C request,
            // and is not committed.
            let w = unsafe { ring.staged(i) }.width();
            // A request whose C requests are i..i + w.
            if i + w <= posted {
                items += 1;
            } else if i >= posted {
                // SAFETY: as above; read out once.
                unposted.push(unsafe { ring.unstage(i) });
            } else {
                // SAFETY: as above; the part the provider took stays in its slot.
                let whole = unsafe { ring.staged(i) };
                unposted.push(whole.split(posted - i, TOKEN()));
                items += 1;
            }
            i += w;
        }
        ring.commit(posted);
        self.items += items;
        let error = failure_of(failure, refused, &mut unposted);
        unposted.extend(rest);
        (error, unposted)
    }

    /// Takes a completion of this send queue and hands each finished request to `done`,
    /// in posting order: the unsignaled ones the completion implies, then its own.
    /// Returns how many C requests finished (a chain's members count, and the chain comes
    /// back with its last). A completion that is not this queue's is an error.
    #[inline]
    pub fn complete(&mut self, wc: &mut WorkCompletion, mut done: impl FnMut(Done<R::Back>)) -> Result<usize> {
        let k = self.ring.send_completion(wc, self.tag_bits, self.qp_num)?;
        for _ in 1..k {
            self.finish_next(End { qp_num: self.qp_num, ..End::IMPLIED }, &mut done);
        }
        self.finish_next(End::of(wc, self.qp_num), &mut done);
        Ok(k as usize)
    }

    /// Pops the oldest outstanding C request, which ended as `end`, and hands its request
    /// to `done` when that finishes it (a chain finishes with its last C request).
    #[inline(always)]
    fn finish_next(&mut self, mut end: End, done: &mut impl FnMut(Done<R::Back>)) {
        let SendQueue { ring, into, member_fail, .. } = self;
        // The request's slot: a chain's is `into` behind this C request's.
        let at = if R::CHAIN { ring.tail - *into } else { ring.tail };
        ring.tail += 1;
        let slot = ring.slot(at);
        if R::CHAIN {
            // SAFETY: the slot of an outstanding request's first C request holds it.
            let width = unsafe { slot.assume_init_ref() }.width() as u64;
            if *into + 1 < width {
                // A member: the chain comes back with its last completion, and a member's
                // is kept only when it failed, to report the first failure.
                *into += 1;
                if end.status != WcStatus::Success {
                    member_failed(member_fail, end);
                }
                return;
            }
            *into = 0;
            end = chain_end(member_fail, end);
        }
        // SAFETY: the request's C requests are all counted gone (the tail is past them),
        // so it is read out once.
        done(unsafe { R::finish(slot, end, TOKEN()) })
    }
}

impl<T: SendBuf, R: SendRequest> SendQueue<T, R> {
    /// Takes a poll's completions in order, each as [`complete`](Self::complete) does,
    /// and hands every finished request to `done`, in posting order; returns how many
    /// C requests finished (as `complete` counts them). Stops at the first completion
    /// that is not this queue's, with its error: the ones before it are taken, it and the
    /// rest are left as they were. The run of completions of the oldest outstanding
    /// requests that a batch or a chain makes is checked in one loop with the queue's
    /// state in registers. For chains that is the cheaper way (one hand-back a chain). A
    /// batch of requests handed back one by one measured no cheaper than
    /// [`complete`](Self::complete) on each completion (scripts/instructions, 2026-12-05:
    /// 326.6 against 320.5 instructions a WRITE in batches of 32).
    // Out of line: one call per poll, and a loop of its own keeps its registers (inlined
    // into a large polling loop, its state was spilled and reloaded on every completion).
    #[inline(never)]
    pub fn complete_all(&mut self, wcs: &mut [WorkCompletion], mut done: impl FnMut(Done<R::Back>)) -> Result<usize> {
        let took = if R::CHAIN { self.run_of_chains(wcs, &mut done) } else { self.run(wcs, &mut done) };
        if took == wcs.len() {
            return Ok(took);
        }
        self.complete_rest(&mut wcs[took..], took, &mut done)
    }

    /// The rest of [`complete_all`](Self::complete_all), from a completion that is not the
    /// next one in order (an unsignaled request before it, a failure in a chain, or a
    /// stranger): each such one taken by [`complete`](Self::complete), the runs between
    /// them as `complete_all` takes them. `finished` were taken before.
    #[inline(never)]
    fn complete_rest(
        &mut self,
        wcs: &mut [WorkCompletion],
        mut finished: usize,
        done: &mut impl FnMut(Done<R::Back>),
    ) -> Result<usize> {
        let mut at = 0;
        while let Some(wc) = wcs.get_mut(at) {
            finished += self.complete(wc, &mut *done)?;
            at += 1;
            let rest = &mut wcs[at..];
            let took = if R::CHAIN { self.run_of_chains(rest, done) } else { self.run(rest, done) };
            (at, finished) = (at + took, finished + took);
        }
        Ok(finished)
    }

    /// The leading run of `wcs` that completes the oldest outstanding requests in order,
    /// each signaled: each taken, its request handed to `done`. Returns how many.
    #[inline(always)]
    fn run(&mut self, wcs: &mut [WorkCompletion], done: &mut impl FnMut(Done<R::Back>)) -> usize {
        let (tag, qp_num, head) = (self.tag_bits, self.qp_num, self.ring.head);
        let (base, mask) = self.ring.slot_base();
        let start = self.ring.tail;
        let mut tail = start;
        for wc in wcs.iter_mut() {
            // The common case, as `Ring::send_completion` checks it.
            if !((wc.wr_id() == tag | (tail & LOW_MASK)) & (wc.qp_num() == qp_num) & (tail != head)) {
                break;
            }
            wc.consume();
            // SAFETY: a masked index is in bounds (`slot_base`); the ring is not borrowed
            // whole in this loop (only its tail is written).
            let slot = unsafe { &mut *base.add((tail & mask) as usize) };
            tail += 1;
            // The ring learns the new tail before `done`, which might unwind.
            self.ring.tail = tail;
            // SAFETY: this slot was outstanding (tail != head) and is counted gone, so it
            // is read out once.
            done(unsafe { R::finish(slot, End::of(wc, qp_num), TOKEN()) });
        }
        (tail - start) as usize
    }

    /// As [`run`](Self::run), for chains: each chain's successful completions are checked
    /// in one tight loop (its width bounds it, so it never passes the head), and the chain
    /// is handed to `done` after its last. A failed completion ends the run (`complete`
    /// keeps it for the chain's report).
    #[inline(always)]
    fn run_of_chains(&mut self, mut wcs: &mut [WorkCompletion], done: &mut impl FnMut(Done<R::Back>)) -> usize {
        let (tag, qp_num, head) = (self.tag_bits, self.qp_num, self.ring.head);
        let (base, mask) = self.ring.slot_base();
        let (start, mut tail, mut into) = (self.ring.tail, self.ring.tail, self.into);
        while tail != head && !wcs.is_empty() {
            // SAFETY: a masked index is in bounds (`slot_base`); the ring is not borrowed
            // whole in this loop (only its tail is written).
            let slot = unsafe { &mut *base.add(((tail - into) & mask) as usize) };
            // SAFETY: the oldest outstanding chain sits in that slot (`into` of its C
            // requests completed).
            let width = unsafe { slot.assume_init_ref() }.width() as u64;
            // This chain's rest, up to where sequence numbers wrap (then the next turn of
            // the loop takes the chain on).
            let first = tag | (tail & LOW_MASK);
            let before_wrap = LOW_MASK - (tail & LOW_MASK) + 1;
            let want = (width - into).min(before_wrap).min(wcs.len() as u64) as usize;
            let mut id = first;
            for wc in wcs[..want].iter_mut() {
                if wc.wr_id() != id || wc.qp_num() != qp_num || !wc.is_success() {
                    break;
                }
                wc.consume();
                id += 1;
            }
            let took = id - first;
            let (run, rest) = std::mem::take(&mut wcs).split_at_mut(took as usize);
            wcs = rest;
            (tail, into) = (tail + took, into + took);
            if into == width {
                let end = chain_end(&mut self.member_fail, End::of(&run[run.len() - 1], qp_num));
                // The queue learns where it is before `done`, which might unwind.
                (self.ring.tail, self.into, into) = (tail, 0, 0);
                // SAFETY: every C request of the chain is counted gone, so it is read out
                // once.
                done(unsafe { R::finish(slot, end, TOKEN()) });
            }
            if took < want as u64 {
                break;
            }
        }
        (self.ring.tail, self.into) = (tail, into);
        (tail - start) as usize
    }
}

/// What `stage` builds for one post: the chain of C requests, and whether the extended
/// API takes every request staged so far (then nothing is linked).
struct Staging {
    classic: Chain<ffi::ibv_send_wr>,
    all_ext: bool,
    /// A request staged so far goes the extended way only (an RDMA ATOMIC WRITE).
    needs_ext: bool,
}

impl Staging {
    #[inline(always)]
    fn new() -> Self {
        Staging { classic: Chain::new(), all_ext: true, needs_ext: false }
    }
}

/// What `stage` builds a checked request with: its sequence number, its SGE count `k`,
/// and the queue's tag and extended API.
#[derive(Clone, Copy)]
struct Staged {
    seq: u64,
    k: usize,
    tag: u64,
    ext: Ext,
}

/// Builds the checked request `r` into `chain`: its C request(s) in its scratch slot
/// (`sges`, `out`) on a QP without the extended API, or for a kind that never goes that
/// way (prepared requests and chains compile to this branch alone); for the extended API,
/// whether it takes the request, and its SGE count in `count`.
#[inline(always)]
fn build<R: SendRequest>(
    r: &mut R,
    at: Staged,
    sges: &mut Sges,
    out: &mut ffi::ibv_send_wr,
    count: &mut u8,
    chain: &mut Staging,
) {
    let Staged { seq, k, tag, ext } = at;
    if !R::EXTENDED || ext.is_none() {
        let (first, last) = r.c_request(tag, seq, sges, k, out, TOKEN());
        chain.classic.link_span(first, last);
        chain.all_ext &= R::EXTENDED;
    } else {
        chain.all_ext &= r.ext_takes(ext, k, TOKEN());
        *count = k as u8;
    }
}

/// A batch that would mix an RDMA ATOMIC WRITE (extended API only) with a request the
/// extended API does not take (the failure path only).
#[cold]
#[inline(never)]
fn mixed_batch(verb: Verb) -> crate::error::Error {
    crate::error::Error::invalid(
        verb,
        "a batch with an RDMA ATOMIC WRITE is posted through the extended API whole, and this request \
         does not go that way (its operation is not among the QP's send ops, or its SGE list meets a \
         known bug of the loaded rdma-core): post it in a batch of its own",
    )
}

/// How a chain whose last C request ended as `last` ended: as the first of its members
/// that failed, if one did (with the last's byte count), else as its last.
#[inline(always)]
fn chain_end(member_fail: &mut Option<End>, last: End) -> End {
    match member_fail.take() {
        Some(first) => End { byte_len: last.byte_len, ..first },
        None => last,
    }
}

/// Keeps the first failed completion of a chain's members (the failure path only).
#[cold]
#[inline(never)]
fn member_failed(first: &mut Option<End>, end: End) {
    first.get_or_insert(end);
}

/// A post refused because the queue is full (out of line: the fast path only branches).
#[cold]
#[inline(never)]
fn full<R>(verb: Verb, depth: u64, wr: R) -> Refused<R> {
    Refused::new(queue_full(verb, depth), wr)
}

/// A post the provider refused with `rc` (`ibv_post_send`'s return), the request back.
#[cold]
#[inline(never)]
fn provider_refused<R>(rc: i32, wr: R) -> Refused<R> {
    Refused::new(Error::verb(Verb::PostSend, rc.abs()), wr)
}

/// A refusal of one request, boxed (the failure path only).
#[cold]
#[inline(never)]
fn refusal<R>(error: Error, wr: R) -> Box<Refused<R>> {
    Box::new(Refused::new(error, wr))
}

/// Posts the requests staged in `ring` (their SGEs in `staged`) through the extended API
/// in one batch; returns how many went in (all or none) and the error. A batch's way (a single request goes
/// through `post_one`). Out of line: inlined into every post (scripts/instructions,
/// 2026-12-04) it cost a batch 10 instructions a request.
#[cold]
fn post_extended<R: SendRequest>(
    ext: Ext,
    ring: &mut Ring<R>,
    tag: u64,
    staged: &[Slot],
) -> (usize, Option<Box<Error>>) {
    let n = staged.len();
    let Some((qpx, _)) = ext else { return (0, Some(Box::new(Error::invalid(Verb::WrStart, "not an extended QP")))) };
    let qpx = qpx.as_ptr();
    let head = ring.head;
    // SAFETY: the caller is the queue, the QP's only poster (&mut, claimed), so the batch
    // is ours; 0..n were staged and checked (`ext_takes` held for each); their SGEs name
    // bytes of buffers the ring keeps until completion.
    let rc = unsafe {
        ffi::ibv_wr_start(qpx);
        for (i, Slot { sges, count, .. }) in staged.iter().enumerate() {
            let seq = wr_id(tag, head + i as u64);
            ring.staged(i).extended(qpx, seq, sges, usize::from(*count), TOKEN());
        }
        ffi::ibv_wr_complete(qpx)
    };
    match conv::errno(Verb::PostSend, rc) {
        Ok(()) => (n, None),
        // A failed ibv_wr_complete posts nothing of the batch.
        Err(e) => (0, Some(Box::new(e))),
    }
}

impl<T: SendBuf, R: SendRequest> Drop for SendQueue<T, R> {
    fn drop(&mut self) {
        let keep = (std::mem::replace(&mut self.tag, Tag(0)), self.room.take());
        // Each outstanding request, from the slot of its first C request (the oldest
        // chain's is `into` behind the tail).
        let all = self.ring.take_spans(self.ring.tail - self.into, R::width);
        self.into = 0;
        bury(self.claim.owner.graveyard(), all, keep);
    }
}

impl<T: SendBuf, R: SendRequest> fmt::Debug for SendQueue<T, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendQueue")
            .field("qp_num", &self.qp_num)
            .field("outstanding", &self.ring.outstanding())
            .finish()
    }
}
