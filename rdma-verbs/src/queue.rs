//! The safe data path: send and receive queues that own what they have posted.
//!
//! # Soundness
//!
//! The device reads and writes posted buffers behind the compiler's back. The safe API
//! makes sure no Rust reference can observe or disturb that, without a lock or an
//! allocation on the fast path:
//!
//! - A buffer is posted by value: a [`Chunk`](crate::Chunk) (exclusive) or an `Arc<Chunk>` (shared,
//!   read-only, for sources the device only reads). The queue keeps it in a slot until
//!   the work request completes, and hands it back with the completion
//!   ([`SendQueue::complete`], [`RecvQueue::complete`]). While it is posted, the program
//!   has no reference to an exclusive chunk, so it cannot read a receive or RDMA READ
//!   target, write a source, move it or free it; and a shared chunk cannot be written
//!   by anyone while any clone is out.
//! - Targets the device writes (receives, RDMA READ, atomics) take only exclusive
//!   chunks: the types refuse `Arc<Chunk>` there ([`ExclusiveBuf`]).
//! - Each side of a QP has one owner: [`SendQueue`] and [`RecvQueue`] are claimed once
//!   per QP and post through `&mut self`. The two sides are separate queues in verbs
//!   (the provider locks them separately), so they may live on different threads.
//! - Completions are matched to slots by the `wr_id`, which this module chooses: the
//!   side, a tag unique in this process to the posting queue (kept reserved while any of
//!   its requests may still complete), and a sequence number or slot. A completion from
//!   another queue, another QP (even of another device with the same QP number), or a
//!   predecessor queue of the same QP is refused; a completion already taken is refused
//!   because `complete` marks it taken. Making a
//!   completion up is `unsafe` ([`WorkCompletion::from_raw`]). Send completions arrive in
//!   posting order, so a signaled completion also releases the unsignaled requests
//!   before it. A `WorkCompletion` is neither `Copy` nor `Clone`, and `complete` marks the
//!   one it takes, so no completion is ever presented twice.
//! - Dropping a queue that still has requests outstanding must not free their buffers
//!   while the device may use them: they move to the QP, which frees them right after
//!   `ibv_destroy_qp`, when the device can no longer touch them.
//!
//! - A CQ never overruns through these queues: each claims its depth (at most that many
//!   requests outstanding) and sets that many entries of its CQ aside; a claim that the CQ
//!   cannot hold besides the others' shares is refused, with the size the CQ needs. A
//!   dropped queue's share stays with its buried requests until they cannot complete.
//!   (An SRQ's receives complete on the CQs of whichever QPs take them: size those CQs
//!   for the SRQ's depth too.)
//!
//! - The buffer traits ([`SendBuf`], [`ExclusiveBuf`]) are sealed: a buffer's SGEs are
//!   trusted to name only bytes the buffer owns, so only this crate's chunk types (and
//!   arrays of them) are buffers.
//!
//! Polling is [`CompletionQueue::poll`](crate::CompletionQueue::poll) (`&mut self`: one
//! poller). Waiting through a completion channel is on the CQ as well.
//!
//! Requests posted again and again are cheaper as [`Prepared`] requests through a
//! [`PreparedQueue`]: checked and built into their C form once, then posted with only the
//! `wr_id` stamped ([`PreparedQueue`] says how, and why it is as sound).
//!
//! The other shape the borrow checker allows, for sources only: a send scope
//! ([`QueuePair::send_scope`], like `std::thread::scope`) borrows its sources for the
//! whole call and drains every request before it returns, so nothing moves per post and a
//! completion only advances a counter; it costs what the raw API costs.

//! Shared receive queues get a [`SrqQueue`]: receives complete out of order there (any
//! QP may take the next one), so it keeps its buffers in a slot table with a free list.

use std::collections::HashSet;
use std::fmt;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::buf::MAX_SGE;
pub use crate::buf::{ExclusiveBuf, SendBuf};
use crate::compat;
use crate::conv;
use crate::cq::CqReservation;
use crate::error::{Error, Refused, Result, Verb};
use crate::ffi;
use crate::mr::RemoteMr;
use crate::qp::{QpType, QueuePair, SendOps};
use crate::srq::SharedReceiveQueue;
use crate::wc::{WcStatus, WorkCompletion};
use crate::wr::Op;
pub use crate::wr::{Done, SendWr};

mod prepared;
mod scope;
pub use prepared::{Prepared, PreparedQueue};
pub use scope::{ScopedChain, SendScope};

// A wr_id is ours: bit 63 says receive side, bits 40..63 carry the posting queue's tag,
// unique in this process among live queues and queues whose requests are still posted,
// and bits 0..40 the sequence number (ring queues) or slot (SRQ). A completion is
// accepted only by the queue whose tag it carries.
const RECV_TAG: u64 = 1 << 63;
const TAG_SHIFT: u32 = 40;
const TAG_LIMIT: u32 = 1 << 23;
const LOW_MASK: u64 = (1 << TAG_SHIFT) - 1;
const SLOT_BITS: u32 = 20;

/// A queue's tag, reserved until dropped: with the queue, or after the QP or SRQ that
/// still holds the queue's posted requests is destroyed.
struct Tag(u32);

static TAGS: Mutex<(u32, Option<HashSet<u32>>)> = Mutex::new((0, None));

impl Tag {
    fn reserve() -> Result<Tag> {
        let mut guard = TAGS.lock().map_err(|_| Error::invalid(Verb::Claim, "the queue tag registry is poisoned"))?;
        let (next, used) = &mut *guard;
        let used = used.get_or_insert_with(HashSet::new);
        for _ in 0..TAG_LIMIT {
            *next = if *next + 1 >= TAG_LIMIT { 1 } else { *next + 1 };
            if used.insert(*next) {
                return Ok(Tag(*next));
            }
        }
        Err(Error::invalid(Verb::Claim, "every queue tag is in use: too many queues or buried requests"))
    }

    #[inline]
    fn bits(&self) -> u64 {
        u64::from(self.0) << TAG_SHIFT
    }
}

impl Drop for Tag {
    fn drop(&mut self) {
        if let Ok(mut guard) = TAGS.lock() {
            if let Some(used) = guard.1.as_mut() {
                used.remove(&self.0);
            }
        }
    }
}

/// The `wr_id` of the send request with sequence number `seq` of the queue whose tag
/// bits are `tag`.
#[inline]
fn send_wr_id(tag: u64, seq: u64) -> u64 {
    tag | (seq & LOW_MASK)
}

/// The low bits of `wr_id` when the completion carries `tag` on the given side.
#[inline]
fn ours(wc: &WorkCompletion, recv: bool, tag: &Tag) -> Option<u64> {
    let id = wc.wr_id();
    let side = if recv { RECV_TAG } else { 0 };
    (id & !LOW_MASK == side | tag.bits()).then_some(id & LOW_MASK)
}

/// Most work requests one provider call posts in a batch.
pub const MAX_BATCH: usize = 64;

type Sges = [MaybeUninit<ffi::ibv_sge>; MAX_SGE];
const NO_SGES: Sges = [const { MaybeUninit::uninit() }; MAX_SGE];

/// A ring of entries indexed by sequence number, for queues whose requests complete in
/// order. Entries between `tail` and `head` are initialized (posted); an entry may be
/// *staged* past `head` while a batch is built, and is then either committed (posted) or
/// taken back. Its length is a power of two (the index is a mask), its capacity the
/// queue's depth.
struct Ring<E> {
    slots: Box<[MaybeUninit<E>]>,
    mask: u64,
    cap: u64,
    head: u64,
    tail: u64,
}

impl<E> Ring<E> {
    fn new(depth: u32) -> Self {
        let cap = u64::from(depth.max(1));
        let len = cap.next_power_of_two();
        Ring { slots: (0..len).map(|_| MaybeUninit::uninit()).collect(), mask: len - 1, cap, head: 0, tail: 0 }
    }

    #[inline]
    fn free(&self) -> usize {
        (self.cap - (self.head - self.tail)) as usize
    }

    #[inline]
    fn outstanding(&self) -> u64 {
        self.head - self.tail
    }

    #[inline]
    fn slot(&mut self, seq: u64) -> &mut MaybeUninit<E> {
        let i = (seq & self.mask) as usize;
        debug_assert!(i < self.slots.len());
        // SAFETY: `slots` has mask + 1 entries (new()), so a masked index is in bounds.
        unsafe { self.slots.get_unchecked_mut(i) }
    }

    /// Writes `e` into the slot `k` places past the head, not posted yet. The caller
    /// checked `k < free()`, and later commits it or takes it back with [`unstage`](Self::unstage).
    /// (Should the caller unwind in between, the staged entry leaks: never freed early.)
    #[inline]
    fn stage(&mut self, k: usize, e: E) -> &mut E {
        self.slot(self.head + k as u64).write(e)
    }

    /// The entry staged `k` places past the head.
    ///
    /// # Safety
    /// It was staged and neither committed nor taken back.
    #[inline]
    unsafe fn staged(&mut self, k: usize) -> &mut E {
        // SAFETY: the caller's contract: the slot holds an initialized entry.
        unsafe { self.slot(self.head + k as u64).assume_init_mut() }
    }

    /// Takes back the entry staged `k` places past the head.
    ///
    /// # Safety
    /// It was staged and neither committed nor taken back; it is read out once.
    #[inline]
    unsafe fn unstage(&mut self, k: usize) -> E {
        // SAFETY: the caller's contract.
        unsafe { self.slot(self.head + k as u64).assume_init_read() }
    }

    /// Marks the first `k` staged entries posted.
    #[inline]
    fn commit(&mut self, k: usize) {
        self.head += k as u64;
    }

    #[inline]
    fn push(&mut self, e: E) {
        self.stage(0, e);
        self.commit(1);
    }

    /// Takes the oldest entry. The caller checked that one is outstanding.
    #[inline]
    fn pop(&mut self) -> E {
        let seq = self.tail;
        self.tail += 1;
        // SAFETY: entries between tail and head are initialized, and this one is moved
        // out exactly once (tail moved past it).
        unsafe { self.slot(seq).assume_init_read() }
    }

    /// Ends a post of the one entry staged at the head: committed when the provider took
    /// it (`rc` 0), else taken back and returned with the provider's error.
    #[inline]
    fn finish_one(&mut self, rc: i32) -> Result<(), Refused<E>> {
        if let Err(error) = conv::errno(Verb::PostSend, rc) {
            // SAFETY: the caller staged the entry at the head and did not commit it.
            return Err(Refused::new(error, unsafe { self.unstage(0) }));
        }
        self.commit(1);
        Ok(())
    }

    /// Ends a batch of `n` staged entries of which the provider took the first `posted`:
    /// commits those, and on a failure (`failure`, the provider's, outranks `refused`, the
    /// check that stopped the batch) returns the error with every entry not posted, in
    /// order: the staged ones, the refused one, then `rest`.
    #[inline]
    fn finish_batch(
        &mut self,
        (n, posted): (usize, usize),
        failure: Option<Error>,
        refused: Option<Refused<E>>,
        rest: impl Iterator<Item = E>,
    ) -> Result<usize, Refused<Vec<E>>> {
        if failure.is_none() && refused.is_none() {
            self.commit(n);
            return Ok(n);
        }
        self.batch_failed((n, posted), failure, refused, rest)
    }

    /// The failure path of [`finish_batch`](Self::finish_batch), out of line.
    #[cold]
    #[inline(never)]
    fn batch_failed(
        &mut self,
        (n, posted): (usize, usize),
        failure: Option<Error>,
        refused: Option<Refused<E>>,
        rest: impl Iterator<Item = E>,
    ) -> Result<usize, Refused<Vec<E>>> {
        let mut unposted = Vec::new();
        for i in posted..n {
            // SAFETY: the caller staged 0..n and did not commit them; each is read once.
            unposted.push(unsafe { self.unstage(i) });
        }
        self.commit(posted);
        let error = match (failure, refused) {
            (Some(e), refused) => {
                unposted.extend(refused.map(Refused::into_value));
                e
            }
            (None, Some(Refused { error, value })) => {
                unposted.push(value);
                error
            }
            (None, None) => unreachable!("handled above"),
        };
        unposted.extend(rest);
        Err(Refused::new(error, unposted))
    }

    /// Takes the send completion `wc` of the queue with `tag` on QP `qp_num`: hands each
    /// entry it finishes to `done`, in posting order (the unsignaled ones before it as
    /// successes, then its own with its status and length), and returns how many.
    #[inline]
    fn complete_sends(
        &mut self,
        wc: &mut WorkCompletion,
        tag: &Tag,
        qp_num: u32,
        mut done: impl FnMut(E, WcStatus, u32, u32),
    ) -> Result<usize> {
        // How far past the oldest outstanding request this one is (sequence numbers wrap
        // at 40 bits; at most a ring's worth is outstanding).
        let ahead = ours(wc, false, tag)
            .filter(|_| wc.qp_num() == qp_num)
            .map(|low| low.wrapping_sub(self.tail) & LOW_MASK)
            .filter(|&d| d < self.outstanding());
        let Some(ahead) = ahead else {
            return Err(not_ours("send", wc));
        };
        wc.consume();
        for _ in 0..ahead {
            done(self.pop(), WcStatus::Success, 0, 0);
        }
        done(self.pop(), wc.status(), wc.byte_len(), wc.vendor_err());
        Ok(ahead as usize + 1)
    }

    /// Everything still posted, for the graveyard.
    fn take_all(&mut self) -> Vec<E> {
        let mut all = Vec::with_capacity(self.outstanding() as usize);
        while self.outstanding() > 0 {
            all.push(self.pop());
        }
        all
    }
}

/// Hands what a dropped queue still has posted to its QP or SRQ, which frees it right
/// after the C object is destroyed, when the device can no longer touch it.
/// `keep` is the queue's tag and CQ reservation: they stay with the buffers, so a late
/// completion can never match a newer queue, nor overrun the CQ.
fn bury<T: Send + 'static, K: Send + 'static>(graveyard: &Mutex<Vec<Box<dyn Send>>>, bufs: Vec<T>, keep: K) {
    if bufs.is_empty() {
        return; // the tag is free again: nothing of this queue can complete any more
    }
    match graveyard.lock() {
        Ok(mut g) => g.push(Box::new((bufs, keep))),
        // A panic while holding the lock: keep the buffers forever rather than free them early.
        Err(_) => std::mem::forget((bufs, keep)),
    }
}

/// Claims one side of a QP or SRQ; the guard gives it back.
struct Claim<O: ClaimOwner> {
    owner: Arc<O>,
    flag: fn(&O) -> &AtomicBool,
}

trait ClaimOwner: Send + Sync + 'static {
    fn graveyard(&self) -> &Mutex<Vec<Box<dyn Send>>>;
}

impl ClaimOwner for crate::qp::QpInner {
    fn graveyard(&self) -> &Mutex<Vec<Box<dyn Send>>> {
        &self.graveyard
    }
}

impl ClaimOwner for crate::srq::SrqInner {
    fn graveyard(&self) -> &Mutex<Vec<Box<dyn Send>>> {
        &self.graveyard
    }
}

impl<O: ClaimOwner> Claim<O> {
    fn take(owner: &Arc<O>, flag: fn(&O) -> &AtomicBool, what: &'static str) -> Result<Self> {
        if flag(owner).swap(true, Ordering::AcqRel) {
            return Err(Error::invalid(Verb::Claim, format!("{what} already has an owner")));
        }
        Ok(Claim { owner: Arc::clone(owner), flag })
    }
}

impl<O: ClaimOwner> Drop for Claim<O> {
    fn drop(&mut self) {
        (self.flag)(&self.owner).store(false, Ordering::Release);
    }
}

/// Builds the C receive work request for `range` of `buf` into `wr`, its SGEs into `sges`.
#[inline]
fn fill_recv<T: ExclusiveBuf>(
    buf: &T,
    range: Range<usize>,
    wr_id: u64,
    max_sge: u32,
    sges: &mut Sges,
) -> Result<ffi::ibv_recv_wr> {
    let n = buf.sges(range, sges)?;
    if n as u32 > max_sge {
        return Err(too_many_recv_sges(n, max_sge));
    }
    Ok(ffi::ibv_recv_wr { wr_id, next: std::ptr::null_mut(), sg_list: sges.as_mut_ptr().cast(), num_sge: n as i32 })
}

#[cold]
#[inline(never)]
fn too_many_recv_sges(n: usize, max_sge: u32) -> Error {
    Error::invalid(Verb::PostRecv, format!("{n} SGEs, but the queue takes {max_sge} (max_recv_sge)"))
}

/// Posts a chain of C receive requests through `post` and returns how many went in.
#[inline]
fn post_recv_chain(
    verb: Verb,
    raws: &mut [MaybeUninit<ffi::ibv_recv_wr>],
    post: impl FnOnce(*mut ffi::ibv_recv_wr, &mut *mut ffi::ibv_recv_wr) -> i32,
) -> (usize, Option<Error>) {
    let n = raws.len();
    if n == 0 {
        return (0, None);
    }
    for i in 0..n {
        let next = if i + 1 < n { raws[i + 1].as_mut_ptr() } else { std::ptr::null_mut() };
        // SAFETY: the caller initialized raws[..n].
        unsafe { raws[i].assume_init_mut() }.next = next;
    }
    let mut bad = std::ptr::null_mut();
    let rc = post(raws[0].as_mut_ptr(), &mut bad);
    if rc == 0 {
        return (n, None);
    }
    let posted = (0..n).find(|&i| raws[i].as_mut_ptr() == bad).unwrap_or(0);
    (posted, Some(Error::verb(verb, rc.abs())))
}

// ---- send side ------------------------------------------------------------------

/// The send side of a QP, owning what it has posted. See the [module docs](self).
pub struct SendQueue<T: Send + 'static> {
    // Declared first: dropped (claim released) after the ring is buried. A posted request
    // stays whole in its slot: its buffer, its id, a UD request's address handle.
    ring: Ring<SendWr<T>>,
    scratch: Box<SendScratch>,
    /// This queue's share of the send CQ (buried with what is still posted).
    room: Option<CqReservation>,
    raw: *mut ffi::ibv_qp,
    qp_num: u32,
    limits: SendLimits,
    /// The extended QP, when it was built with send ops: then `ibv_wr_*` posts what
    /// those ops cover and [`compat::quirks`] allows, and `ibv_post_send` the rest.
    ext: Option<(NonNull<ffi::ibv_qp_ex>, SendOps)>,
    tag: Tag,
    claim: Claim<crate::qp::QpInner>,
}

// SAFETY: the queue owns its buffers (T: Send) and posts through the thread-safe
// ibv_post_send; the raw pointer is the QP that `claim` keeps alive.
unsafe impl<T: Send + 'static> Send for SendQueue<T> {}

/// What a QP's send side takes, as the safe path checks it before calling the provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SendLimits {
    pub(crate) max_sge: u32,
    pub(crate) max_inline: u32,
    /// A UD QP: every request needs an address handle, and none other may have one.
    pub(crate) ud: bool,
}

impl SendLimits {
    /// The limits as one word, to tell in one comparison whether two QPs take the same
    /// requests: equal keys, equal `max_inline` and `ud`, and `max_sge` equal or both at
    /// least [`MAX_SGE`] (no safe request has more SGEs).
    #[inline]
    pub(crate) fn key(self) -> u64 {
        let sge = self.max_sge.min(MAX_SGE as u32);
        u64::from(self.max_inline) << 32 | u64::from(sge) << 1 | u64::from(self.ud)
    }
}

impl QueuePair {
    pub(crate) fn send_limits(&self) -> SendLimits {
        let caps = self.inner.caps;
        SendLimits { max_sge: caps.max_send_sge, max_inline: caps.max_inline_data, ud: self.qp_type() == QpType::Ud }
    }
}

/// Checks a queue depth asked of a QP side that holds `max` work requests.
fn depth(verb: Verb, asked: u32, max: u32, what: &str) -> Result<u32> {
    if asked == 0 || asked > max {
        return Err(Error::invalid(verb, format!("depth {asked}: the QP's {what} allows 1 to {max}")));
    }
    Ok(asked)
}

impl QueuePair {
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
        let (claim, room, depth) = self.claim_send_side(Verb::Claim, depth)?;
        Ok(SendQueue {
            scratch: SendScratch::new(),
            room: Some(room),
            ring: Ring::new(depth),
            raw: self.as_raw(),
            qp_num: self.qp_num(),
            limits: self.send_limits(),
            ext: self.inner.qp_ex.map(|q| (q, self.inner.send_ops)),
            tag: Tag::reserve()?,
            claim,
        })
    }

    /// Claims the send side (one poster at a time, whichever queue type) and sets `depth`
    /// entries of the send CQ aside for it.
    fn claim_send_side(&self, verb: Verb, depth: u32) -> Result<(Claim<crate::qp::QpInner>, CqReservation, u32)> {
        let depth = self::depth(verb, depth, self.inner.caps.max_send_wr, "max_send_wr")?;
        let claim = Claim::take(&self.inner, |q| &q.send_claimed, "this QP's send side")?;
        let room = CqReservation::take(&self.inner.send_cq, depth.into(), verb, "this send queue")?;
        Ok((claim, room, depth))
    }

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
        const VERB: Verb = Verb::Claim;
        if self.has_srq() {
            return Err(Error::invalid(VERB, "this QP receives through its SRQ"));
        }
        let depth = self::depth(VERB, depth, self.inner.caps.max_recv_wr, "max_recv_wr")?;
        let claim = Claim::take(&self.inner, |q| &q.recv_claimed, "this QP's receive side")?;
        let room = CqReservation::take(&self.inner.recv_cq, depth.into(), VERB, "this receive queue")?;
        Ok(RecvQueue {
            room: Some(room),
            ring: Ring::new(depth),
            raw: self.as_raw(),
            qp_num: self.qp_num(),
            max_sge: self.inner.caps.max_recv_sge,
            tag: Tag::reserve()?,
            claim,
        })
    }
}

impl<T: SendBuf> SendQueue<T> {
    /// Requests posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.ring.outstanding() as usize
    }

    /// The QP number, to route completions of a shared CQ.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    #[inline]
    fn wr_id(&self, seq: u64) -> u64 {
        send_wr_id(self.tag.bits(), seq)
    }

    /// True when this QP was built with extended send ops, so posts go through the
    /// `ibv_wr_*` API where the loaded rdma-core handles them ([`compat::quirks`]).
    pub fn uses_extended_api(&self) -> bool {
        self.ext.is_some()
    }

    /// Checks `wr` and writes its SGEs into `sges`; returns how many.
    #[inline]
    fn check(&self, wr: &SendWr<T>, sges: &mut Sges) -> Result<usize> {
        check_send(self.limits, wr, sges)
    }

    /// Whether the extended API takes this request (checked, `n` SGEs).
    #[inline]
    fn ext_takes(&self, wr: &SendWr<T>, n: usize) -> bool {
        ext_takes(self.ext, wr, n)
    }

    /// The C work request for a checked `wr` whose `n` SGEs are in `sges` (which must not
    /// move before the post). No allocation, no call.
    #[inline]
    fn classic<'o>(
        wr: &SendWr<T>,
        seq: u64,
        sges: &mut Sges,
        n: usize,
        out: &'o mut MaybeUninit<ffi::ibv_send_wr>,
    ) -> &'o mut ffi::ibv_send_wr {
        // Filled in place: the C request is 128 bytes, and a copy of it costs as much as
        // the rest of this function.
        // SAFETY: ibv_send_wr is plain data, for which all-zero is a valid value, so after
        // zeroing the reference is to a valid value.
        let out = unsafe {
            out.as_mut_ptr().write_bytes(0, 1);
            out.assume_init_mut()
        };
        out.wr_id = seq;
        out.sg_list = sges.as_mut_ptr().cast();
        out.num_sge = n as i32;
        out.send_flags = wr.flags.0;
        use ffi::ibv_wr_opcode as O;
        out.opcode = match (wr.op, wr.imm) {
            (Op::Send, None) => O::IBV_WR_SEND,
            (Op::Send, Some(_)) => O::IBV_WR_SEND_WITH_IMM,
            (Op::Write, None) => O::IBV_WR_RDMA_WRITE,
            (Op::Write, Some(_)) => O::IBV_WR_RDMA_WRITE_WITH_IMM,
            (Op::Read, _) => O::IBV_WR_RDMA_READ,
            (Op::CompSwap { .. }, _) => O::IBV_WR_ATOMIC_CMP_AND_SWP,
            (Op::FetchAdd { .. }, _) => O::IBV_WR_ATOMIC_FETCH_AND_ADD,
        };
        if let Some(imm) = wr.imm {
            out.__bindgen_anon_1.imm_data = imm.to_be();
        }
        if let Some(r) = wr.remote {
            out.wr = match wr.op {
                Op::CompSwap { compare, swap } => atomic(&r, compare, swap),
                Op::FetchAdd { add } => atomic(&r, add, 0),
                _ => ffi::ibv_send_wr__bindgen_ty_2 {
                    rdma: ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: r.addr, rkey: r.rkey },
                },
            };
        }
        if let Some((ah, qpn, qkey)) = &wr.ud {
            out.wr.ud =
                ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 { ah: ah.as_raw(), remote_qpn: *qpn, remote_qkey: *qkey };
        }
        out
    }

    /// Adds a checked `wr` to the open `ibv_wr_start` batch of `qpx`.
    ///
    /// # Safety
    /// `qpx` is this queue's extended QP, inside `ibv_wr_start`; `ext_takes(wr, n)` holds.
    #[inline]
    unsafe fn extended(qpx: *mut ffi::ibv_qp_ex, wr: &SendWr<T>, seq: u64, sges: &Sges, n: usize) {
        // SAFETY: the caller's contract; `sges[..n]` were written by check().
        unsafe {
            (*qpx).wr_id = seq;
            // rxe (rdma-core 44) wants IBV_SEND_INLINE here as well as set_inline_data.
            (*qpx).wr_flags = wr.flags.0;
            let r = wr.remote.unwrap_or(RemoteMr { addr: 0, len: 0, rkey: 0 });
            match (wr.op, wr.imm) {
                (Op::Send, None) => ffi::ibv_wr_send(qpx),
                (Op::Send, Some(imm)) => ffi::ibv_wr_send_imm(qpx, imm.to_be()),
                (Op::Write, None) => ffi::ibv_wr_rdma_write(qpx, r.rkey, r.addr),
                (Op::Write, Some(imm)) => ffi::ibv_wr_rdma_write_imm(qpx, r.rkey, r.addr, imm.to_be()),
                (Op::Read, _) => ffi::ibv_wr_rdma_read(qpx, r.rkey, r.addr),
                (Op::CompSwap { compare, swap }, _) => ffi::ibv_wr_atomic_cmp_swp(qpx, r.rkey, r.addr, compare, swap),
                (Op::FetchAdd { add }, _) => ffi::ibv_wr_atomic_fetch_add(qpx, r.rkey, r.addr, add),
            }
            if let Some((ah, qpn, qkey)) = &wr.ud {
                ffi::ibv_wr_set_ud_addr(qpx, ah.as_raw(), *qpn, *qkey);
            }
            let sge = sges[0].assume_init();
            if wr.is_inline() && n == 1 {
                ffi::ibv_wr_set_inline_data(qpx, sge.addr as *mut std::ffi::c_void, sge.length as usize);
            } else if n == 1 {
                ffi::ibv_wr_set_sge(qpx, sge.lkey, sge.addr, sge.length);
            } else if wr.is_inline() {
                let mut bufs = [ffi::ibv_data_buf { addr: std::ptr::null_mut(), length: 0 }; MAX_SGE];
                for (b, s) in bufs.iter_mut().zip(&sges[..n]) {
                    let s = s.assume_init();
                    *b = ffi::ibv_data_buf { addr: s.addr as *mut std::ffi::c_void, length: s.length as usize };
                }
                ffi::ibv_wr_set_inline_data_list(qpx, n, bufs.as_ptr());
            } else {
                ffi::ibv_wr_set_sge_list(qpx, n, sges.as_ptr().cast());
            }
        }
    }

    /// Posts one work request: one provider call, no allocation. On refusal the work
    /// request (with its buffer) comes back in the error.
    #[inline]
    #[allow(clippy::result_large_err)] // the refused request comes back by value: no allocation
    pub fn post(&mut self, wr: SendWr<T>) -> Result<(), Refused<SendWr<T>>> {
        if self.ring.free() == 0 {
            return Err(Refused::new(queue_full(Verb::PostSend, self.ring.cap), wr));
        }
        let mut sges = NO_SGES;
        let n = match self.check(&wr, &mut sges) {
            Ok(n) => n,
            Err(e) => return Err(Refused::new(e, wr)),
        };
        let seq = self.wr_id(self.ring.head);
        let ext = self.ext.filter(|_| self.ext_takes(&wr, n));
        // The request goes to its slot first, so that it moves once.
        let wr = self.ring.stage(0, wr);
        let rc = match ext {
            Some((qpx, _)) => {
                let qpx = qpx.as_ptr();
                // SAFETY: this queue is the QP's only poster (&mut self, claimed), so the
                // batch is ours; the SGEs name bytes of `wr.buf`, which the ring keeps
                // until the completion.
                unsafe {
                    ffi::ibv_wr_start(qpx);
                    Self::extended(qpx, wr, seq, &sges, n);
                    ffi::ibv_wr_complete(qpx)
                }
            }
            None => {
                let mut raw = MaybeUninit::uninit();
                let raw = Self::classic(wr, seq, &mut sges, n, &mut raw);
                let mut bad = std::ptr::null_mut();
                // SAFETY: the QP is alive (claim); the SGEs name bytes of `wr.buf`, which
                // the ring keeps until the completion; a UD address handle is kept with it.
                unsafe { ffi::ibv_post_send(self.raw, raw, &mut bad) }
            }
        };
        self.ring.finish_one(rc)
    }

    /// Posts up to [`MAX_BATCH`] work requests with one provider call (one doorbell),
    /// built in scratch space the queue owns. Returns how many were posted. When one is
    /// refused (by our checks or by the provider), the ones before it are posted, and the
    /// error comes back with the work requests that were not posted, in order (that path
    /// allocates, the fast path does not).
    pub fn post_batch<I>(&mut self, wrs: I) -> Result<usize, Refused<Vec<SendWr<T>>>>
    where
        I: IntoIterator<Item = SendWr<T>>,
    {
        // Split borrows: the scratch space is filled while the ring takes the requests.
        let SendQueue { ring, scratch, raw, limits, ext, tag, .. } = self;
        let (raw, limits, ext, tag) = (*raw, *limits, *ext, tag.bits());
        let SendScratch { sges, raws } = &mut **scratch;
        let mut counts = [0u8; MAX_BATCH];
        let room = MAX_BATCH.min(ring.free());
        // Without an extended QP (the common case) each C request is built as its work
        // request arrives, straight from the slot the request moved into.
        let classic_only = ext.is_none();
        let mut all_ext = !classic_only;
        let (mut n, mut refused) = (0, None);
        let mut wrs = wrs.into_iter();
        for wr in wrs.by_ref() {
            if n == room {
                let e = if room == MAX_BATCH { batch_too_long() } else { queue_full(Verb::PostSend, ring.cap) };
                refused = Some(Refused::new(e, wr));
                break;
            }
            let k = match check_send(limits, &wr, &mut sges[n]) {
                Ok(k) => k,
                Err(e) => {
                    refused = Some(Refused::new(e, wr));
                    break;
                }
            };
            if classic_only {
                let seq = send_wr_id(tag, ring.head + n as u64);
                let wr = ring.stage(n, wr);
                Self::classic(wr, seq, &mut sges[n], k, &mut raws[n]);
                if n > 0 {
                    let next = raws[n].as_mut_ptr();
                    // SAFETY: raws[n - 1] was written in the previous round.
                    unsafe { raws[n - 1].assume_init_mut() }.next = next;
                }
            } else {
                all_ext &= ext_takes(ext, &wr, k);
                counts[n] = k as u8;
                ring.stage(n, wr);
            }
            n += 1;
        }
        let (posted, failure) = if n == 0 {
            (0, None)
        } else if all_ext {
            post_staged_extended(ext, ring, tag, n, sges, &counts)
        } else {
            if !classic_only {
                for i in 0..n {
                    let seq = send_wr_id(tag, ring.head + i as u64);
                    // SAFETY: 0..n were staged above.
                    let wr = unsafe { ring.staged(i) };
                    Self::classic(wr, seq, &mut sges[i], usize::from(counts[i]), &mut raws[i]);
                    if i > 0 {
                        let next = raws[i].as_mut_ptr();
                        // SAFETY: raws[i - 1] was written in the previous round.
                        unsafe { raws[i - 1].assume_init_mut() }.next = next;
                    }
                }
            }
            let mut bad = std::ptr::null_mut();
            // SAFETY: raws[..n] is a valid chain (linked above, the last `next` NULL from
            // `classic`); their SGEs (in the scratch space, which does not move) name bytes
            // of buffers the ring keeps until completion.
            let rc = unsafe { ffi::ibv_post_send(raw, raws[0].as_mut_ptr(), &mut bad) };
            if rc == 0 {
                (n, None)
            } else {
                // Nothing from `bad` on went in.
                let at = (0..n).find(|&i| raws[i].as_mut_ptr() == bad).unwrap_or(0);
                (at, Some(Error::verb(Verb::PostSend, rc.abs())))
            }
        };
        ring.finish_batch((n, posted), failure, refused, wrs)
    }
}

/// Scratch space where a batch's C requests and their SGEs are built: 16 KiB kept with the
/// send queue (allocated when it is claimed) rather than on the stack, where every post
/// would pay for stack probes and cold pages. Nothing in it outlives a post.
struct SendScratch {
    sges: [Sges; MAX_BATCH],
    raws: [MaybeUninit<ffi::ibv_send_wr>; MAX_BATCH],
}

impl SendScratch {
    fn new() -> Box<SendScratch> {
        Box::new(SendScratch { sges: [NO_SGES; MAX_BATCH], raws: [const { MaybeUninit::uninit() }; MAX_BATCH] })
    }
}

/// Checks `wr` against a queue's limits and writes its SGEs into `sges`; returns how
/// many. No allocation; the error paths are out of line.
#[inline]
fn check_send<T: SendBuf>(limits: SendLimits, wr: &SendWr<T>, sges: &mut Sges) -> Result<usize> {
    let SendLimits { max_sge, max_inline, ud } = limits;
    // A UD send without an address handle would have the provider read a NULL one.
    if wr.ud.is_some() != ud {
        return Err(refused(SendRefusal::Transport { ud }));
    }
    let n = wr.buf.sges(wr.range.clone(), sges)?;
    if n as u32 > max_sge {
        return Err(refused(SendRefusal::Sges { n, max: max_sge }));
    }
    let len = wr.range.end - wr.range.start;
    if wr.is_inline() && len > max_inline as usize {
        return Err(refused(SendRefusal::Inline { len, max: max_inline }));
    }
    if let Some(remote) = wr.remote {
        if len as u64 > remote.len {
            return Err(refused(SendRefusal::Remote { len, remote: remote.len }));
        }
        if matches!(wr.op, Op::CompSwap { .. } | Op::FetchAdd { .. }) && (remote.addr % 8 != 0 || remote.len < 8) {
            return Err(refused(SendRefusal::Atomic));
        }
    }
    Ok(n)
}

/// Whether the extended API of a QP built with `ext` takes this request (checked, `n`
/// SGEs): its operation is among the send ops, and the loaded rdma-core has no known bug
/// for its SGE or inline list ([`compat::quirks`]).
#[inline]
fn ext_takes<T: SendBuf>(ext: Option<(NonNull<ffi::ibv_qp_ex>, SendOps)>, wr: &SendWr<T>, n: usize) -> bool {
    let Some((_, ops)) = ext else { return false };
    let q = compat::quirks();
    n >= 1 && ops.contains(wr.send_op()) && (n == 1 || if wr.is_inline() { q.wr_inline_list } else { q.wr_sge_list })
}

/// Posts the `n` requests staged in `ring` through the extended API in one batch; returns
/// how many went in (all or none) and the error.
fn post_staged_extended<T: SendBuf>(
    ext: Option<(NonNull<ffi::ibv_qp_ex>, SendOps)>,
    ring: &mut Ring<SendWr<T>>,
    tag: u64,
    n: usize,
    sges: &[Sges; MAX_BATCH],
    counts: &[u8; MAX_BATCH],
) -> (usize, Option<Error>) {
    let Some((qpx, _)) = ext else { return (0, Some(Error::invalid(Verb::WrStart, "not an extended QP"))) };
    let qpx = qpx.as_ptr();
    let head = ring.head;
    // SAFETY: the caller is the queue, the QP's only poster (&mut, claimed), so the batch
    // is ours; 0..n were staged and checked (`ext_takes` held for each); their SGEs name
    // bytes of buffers the ring keeps until completion.
    let rc = unsafe {
        ffi::ibv_wr_start(qpx);
        for i in 0..n {
            let seq = send_wr_id(tag, head + i as u64);
            SendQueue::extended(qpx, ring.staged(i), seq, &sges[i], usize::from(counts[i]));
        }
        ffi::ibv_wr_complete(qpx)
    };
    if rc == 0 {
        (n, None)
    } else {
        // A failed ibv_wr_complete posts nothing of the batch.
        (0, Some(Error::verb(Verb::PostSend, rc.abs())))
    }
}

impl<T: SendBuf> SendQueue<T> {
    /// Takes a completion of this send queue and hands each finished request to `done`,
    /// in posting order: the unsignaled ones the completion implies, then its own.
    /// Returns how many finished. A completion that is not this queue's is an error.
    #[inline]
    pub fn complete(&mut self, wc: &mut WorkCompletion, mut done: impl FnMut(Done<T>)) -> Result<usize> {
        let qp_num = self.qp_num;
        self.ring.complete_sends(wc, &self.tag, qp_num, |wr, status, byte_len, vendor_err| {
            let op = wr.wc_opcode();
            done(Done { id: wr.id, buf: wr.buf, status, byte_len, op, qp_num, vendor_err })
        })
    }
}

/// Why the safe send path refused a work request before calling the provider.
enum SendRefusal {
    Sges { n: usize, max: u32 },
    Inline { len: usize, max: u32 },
    Remote { len: usize, remote: u64 },
    Atomic,
    Transport { ud: bool },
}

#[cold]
#[inline(never)]
fn refused(why: SendRefusal) -> Error {
    let what = match why {
        SendRefusal::Sges { n, max } => format!("{n} SGEs, but the QP takes {max} (max_send_sge)"),
        SendRefusal::Inline { len, max } => format!("{len} bytes inline, but the QP allows {max} (max_inline_data)"),
        SendRefusal::Remote { len, remote } => format!("{len} bytes do not fit the remote region of {remote} bytes"),
        SendRefusal::Atomic => "an atomic needs an 8-byte aligned remote address with 8 bytes".into(),
        SendRefusal::Transport { ud: true } => {
            "a UD QP sends only datagrams with an address handle (SendWr::send_ud)".into()
        }
        SendRefusal::Transport { ud: false } => {
            "an address handle (SendWr::send_ud) is for UD QPs; this QP is connected".into()
        }
    };
    Error::invalid(Verb::PostSend, what)
}

fn atomic(remote: &RemoteMr, compare_add: u64, swap: u64) -> ffi::ibv_send_wr__bindgen_ty_2 {
    ffi::ibv_send_wr__bindgen_ty_2 {
        atomic: ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
            remote_addr: remote.addr,
            compare_add,
            swap,
            rkey: remote.rkey,
        },
    }
}

impl<T: Send + 'static> Drop for SendQueue<T> {
    fn drop(&mut self) {
        let keep = (std::mem::replace(&mut self.tag, Tag(0)), self.room.take());
        bury(self.claim.owner.graveyard(), self.ring.take_all(), keep);
    }
}

impl<T: Send + 'static> fmt::Debug for SendQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendQueue")
            .field("qp_num", &self.qp_num)
            .field("outstanding", &self.ring.outstanding())
            .finish()
    }
}

// ---- receive side ---------------------------------------------------------------

/// The receive side of a QP, owning the buffers it has posted. See the [module docs](self).
pub struct RecvQueue<T: Send + 'static> {
    ring: Ring<(T, u64)>,
    /// This queue's share of the receive CQ (buried with what is still posted).
    room: Option<CqReservation>,
    raw: *mut ffi::ibv_qp,
    qp_num: u32,
    max_sge: u32,
    tag: Tag,
    claim: Claim<crate::qp::QpInner>,
}

// SAFETY: as for SendQueue, with the thread-safe ibv_post_recv.
unsafe impl<T: Send + 'static> Send for RecvQueue<T> {}

impl<T: ExclusiveBuf> RecvQueue<T> {
    /// Receives posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.ring.outstanding() as usize
    }

    /// The QP number, to route completions of a shared CQ.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    #[inline]
    fn wr_id(&self, seq: u64) -> u64 {
        RECV_TAG | self.tag.bits() | (seq & LOW_MASK)
    }

    /// Posts a receive into `range` of `buf` (one provider call, no allocation, no
    /// syscall). On refusal the buffer comes back in the error.
    #[inline]
    pub fn post(&mut self, buf: T, range: Range<usize>, id: u64) -> Result<(), Refused<T>> {
        if self.ring.free() == 0 {
            return Err(Refused::new(queue_full(Verb::PostRecv, self.ring.cap), buf));
        }
        let mut sges = NO_SGES;
        let mut wr = match fill_recv(&buf, range, self.wr_id(self.ring.head), self.max_sge, &mut sges) {
            Ok(wr) => wr,
            Err(e) => return Err(Refused::new(e, buf)),
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is alive (claim); the SGEs name bytes of `buf`, which the ring
        // owns until the completion and nobody else can reach (ExclusiveBuf).
        let rc = unsafe { ffi::ibv_post_recv(self.raw, &mut wr, &mut bad) };
        if let Err(e) = conv::errno(Verb::PostRecv, rc) {
            return Err(Refused::new(e, buf));
        }
        self.ring.push((buf, id));
        Ok(())
    }

    /// Posts up to [`MAX_BATCH`] receives `(buffer, range, id)` with one provider call.
    /// Returns how many were posted; on refusal, the error and the unposted buffers.
    pub fn post_batch<I>(&mut self, recvs: I) -> Result<usize, Refused<Vec<T>>>
    where
        I: IntoIterator<Item = (T, Range<usize>, u64)>,
    {
        let mut sges = [NO_SGES; MAX_BATCH];
        let mut raws: [MaybeUninit<ffi::ibv_recv_wr>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
        let room = MAX_BATCH.min(self.ring.free());
        let (mut n, mut refused) = (0, None);
        let mut recvs = recvs.into_iter();
        for (buf, range, id) in recvs.by_ref() {
            if n == room {
                refused = Some(Refused::new(queue_full(Verb::PostRecv, self.ring.cap), buf));
                break;
            }
            match fill_recv(&buf, range, self.wr_id(self.ring.head + n as u64), self.max_sge, &mut sges[n]) {
                Ok(wr) => {
                    raws[n].write(wr);
                    self.ring.stage(n, (buf, id));
                    n += 1;
                }
                Err(e) => {
                    refused = Some(Refused::new(e, buf));
                    break;
                }
            }
        }
        let raw = self.raw;
        // SAFETY: the QP is alive; a valid chain whose buffers the ring keeps.
        let (posted, failure) =
            post_recv_chain(Verb::PostRecv, &mut raws[..n], |wr, bad| unsafe { ffi::ibv_post_recv(raw, wr, bad) });
        if failure.is_none() && refused.is_none() {
            self.ring.commit(n);
            return Ok(n);
        }
        let mut unposted = Vec::new();
        for i in posted..n {
            // SAFETY: posted..n were staged above and not committed; each is read once.
            unposted.push(unsafe { self.ring.unstage(i) }.0);
        }
        self.ring.commit(posted);
        let (error, stopped) = match (failure, refused) {
            (Some(e), refused) => (e, refused.map(Refused::into_value)),
            (None, Some(Refused { error, value })) => (error, Some(value)),
            (None, None) => unreachable!("handled above"),
        };
        unposted.extend(stopped);
        unposted.extend(recvs.map(|(buf, _, _)| buf));
        Err(Refused::new(error, unposted))
    }

    /// Takes a completion of this receive queue and returns the finished receive with
    /// its buffer. Receives complete in posting order; anything else is refused.
    #[inline]
    pub fn complete(&mut self, wc: &mut WorkCompletion) -> Result<Done<T>> {
        let next =
            ours(wc, true, &self.tag).filter(|&low| wc.qp_num() == self.qp_num && low == self.ring.tail & LOW_MASK);
        if next.is_none() || self.ring.outstanding() == 0 {
            return Err(not_ours("receive", wc));
        }
        let (buf, id) = self.ring.pop();
        wc.consume();
        Ok(Done::received(id, buf, wc))
    }
}

impl<T: Send + 'static> Drop for RecvQueue<T> {
    fn drop(&mut self) {
        let keep = (std::mem::replace(&mut self.tag, Tag(0)), self.room.take());
        bury(self.claim.owner.graveyard(), self.ring.take_all(), keep);
    }
}

impl<T: Send + 'static> fmt::Debug for RecvQueue<T> {
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
    #[inline]
    pub fn post(&mut self, buf: T, range: Range<usize>, id: u64) -> Result<(), Refused<T>> {
        if self.nfree == 0 {
            return Err(Refused::new(queue_full(Verb::PostSrqRecv, self.slots.len() as u64), buf));
        }
        let index = self.free[self.nfree - 1];
        let slot = &mut self.slots[index as usize];
        let wr_id = RECV_TAG | self.tag.bits() | (u64::from(slot.generation) << SLOT_BITS) | u64::from(index);
        let mut sges = NO_SGES;
        let mut wr = match fill_recv(&buf, range, wr_id, self.max_sge, &mut sges) {
            Ok(wr) => wr,
            Err(e) => return Err(Refused::new(e, buf)),
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: the SRQ is alive (claim); the SGEs name bytes of `buf`, which the slot
        // owns until the completion and nobody else can reach (ExclusiveBuf).
        let rc = unsafe { ffi::ibv_post_srq_recv(self.raw, &mut wr, &mut bad) };
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
        let Some(low) = ours(wc, true, &self.tag) else {
            return Err(not_ours("shared receive", wc));
        };
        let (index, generation) = ((low & ((1 << SLOT_BITS) - 1)) as usize, (low >> SLOT_BITS) as u32);
        let slot = match self.slots.get_mut(index) {
            Some(s) if s.generation == generation && s.buf.is_some() => s,
            _ => return Err(not_ours("shared receive", wc)),
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

#[cold]
#[inline(never)]
fn batch_too_long() -> Error {
    Error::invalid(Verb::PostSend, format!("a batch holds at most {MAX_BATCH} work requests"))
}

#[cold]
#[inline(never)]
fn queue_full(verb: Verb, depth: u64) -> Error {
    Error::invalid(verb, format!("the queue is full ({depth} outstanding): poll completions first"))
}

#[cold]
#[inline(never)]
fn not_ours(side: &str, wc: &WorkCompletion) -> Error {
    Error::invalid(
        Verb::PollCq,
        format!("completion wr_id {:#x} of QP {:#x} is not outstanding on this {side} queue", wc.wr_id(), wc.qp_num()),
    )
}
