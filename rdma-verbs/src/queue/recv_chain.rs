//! Prepared receive chains: [`PreparedRecvChain`], posted whole through a
//! [`RecvChainQueue`] (documented there).

use std::fmt;
use std::ops::Range;

use super::recv::{fill_recv, ChainState, Numbering, RecvQueue, RecvRequest, Run, EMPTY_RECV};
use super::request::sealed::Sealed;
use super::request::Token;
use super::ring::Ring;
use super::tag::LOW_MASK;
use super::{not_ours, queue_full, stamp, stopped_at, wider_than_queue, Sges, MAX_BATCH, NO_SGES};
use crate::buf::{ExclusiveBuf, PdId};
use crate::conv;
use crate::error::{Error, Refused, Result, Verb};
use crate::ffi;
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};
use crate::wr::Done;

/// The completion flag that says a message carried immediate data.
const WITH_IMM: u32 = ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0;

/// Receives linked into one chain, posted whole with one provider call and handed back
/// whole, once, after the completion of its last receive: built by
/// [`RecvChainQueue::prepare_chain`](RecvQueue::prepare_chain), posted through a
/// [`RecvChainQueue`] (see there).
pub struct PreparedRecvChain<T: ExclusiveBuf> {
    inner: Box<ChainInner<T>>,
}

struct ChainInner<T> {
    /// 1 up to MAX_BATCH C receives side by side, one per member, linked in order (the
    /// last `next` NULL), each `sg_list` naming its SGEs in `sges`; then unlinked empty
    /// ones up to a multiple of 8, never posted, so that a post stamps the `wr_id`s eight
    /// at a time with no remainder. Both vectors keep their heap blocks while the chain
    /// holds them (never grown after the chain is built), so the links stay valid from
    /// one post to the next; `raws` is written through `as_mut_ptr` alone, which
    /// materializes no reference to its elements.
    raws: Vec<ffi::ibv_recv_wr>,
    sges: Vec<Sges>,
    /// The receives' buffers, ranges and ids, in posting order.
    members: Vec<Member<T>>,
    /// The first receive's id: the chain's, in its [`Done`].
    id: u64,
    /// What each member's last completion said (all zero before the first). A poll's
    /// run copies only the words up to `byte_len`: the rest (the immediate data and its
    /// flag) is copied for a run with a message that carried immediate data, and then
    /// `fit` says so.
    arrived: Vec<Arrived>,
    /// The protection domain every member was checked against.
    pd: PdId,
    /// The receive SGE limit every member was checked against (the low 32 bits) and
    /// [`EXTRAS`]: a post compares it with its queue's limit in one instruction, and
    /// anything else takes the slow path.
    fit: u64,
}

/// In a chain's `fit`: some member's record holds words past `byte_len` written since the
/// chain was last posted. The next post clears them first, so a record never shows a
/// previous post's immediate data.
const EXTRAS: u64 = 1 << 32;

struct Member<T> {
    buf: T,
    range: Range<usize>,
    id: u64,
}

/// A member's completion: the words of its `ibv_wc` from `status` to `wc_flags`, copied
/// as they are (two 16-byte moves) and decoded when read.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Arrived {
    status: u32,
    opcode: u32,
    vendor_err: u32,
    byte_len: u32,
    imm: u32,
    qp_num: u32,
    src_qp: u32,
    flags: u32,
}

// `Arrived` mirrors `ibv_wc` from `status` on, word for word.
const _: () = {
    use std::mem::offset_of;
    let at = offset_of!(ffi::ibv_wc, status);
    assert!(offset_of!(ffi::ibv_wc, opcode) - at == offset_of!(Arrived, opcode));
    assert!(offset_of!(ffi::ibv_wc, vendor_err) - at == offset_of!(Arrived, vendor_err));
    assert!(offset_of!(ffi::ibv_wc, byte_len) - at == offset_of!(Arrived, byte_len));
    assert!(offset_of!(ffi::ibv_wc, __bindgen_anon_1) - at == offset_of!(Arrived, imm));
    assert!(offset_of!(ffi::ibv_wc, qp_num) - at == offset_of!(Arrived, qp_num));
    assert!(offset_of!(ffi::ibv_wc, src_qp) - at == offset_of!(Arrived, src_qp));
    assert!(offset_of!(ffi::ibv_wc, wc_flags) - at == offset_of!(Arrived, flags));
    assert!(std::mem::size_of::<ffi::ibv_wc__bindgen_ty_1>() == 4);
    assert!(std::mem::size_of::<Arrived>() == 32);
};

impl Arrived {
    /// Where `wc`'s words from `status` on are, as an `Arrived` to copy.
    #[inline(always)]
    fn in_wc(wc: &WorkCompletion) -> *const Arrived {
        let raw: *const ffi::ibv_wc = wc.as_raw();
        // In bounds: `Arrived` is the words of `ibv_wc` from `status` to `wc_flags`
        // (checked above at compile time), plain u32s at a 4-aligned offset of an
        // 8-aligned struct, reached from the whole struct's pointer.
        raw.wrapping_byte_add(std::mem::offset_of!(ffi::ibv_wc, status)).cast()
    }

    /// Where `wc`'s words from `status` to `byte_len` are: what a run copies.
    #[inline(always)]
    fn head_in_wc(wc: &WorkCompletion) -> *const [u32; 4] {
        Arrived::in_wc(wc).cast()
    }

    #[inline(always)]
    fn of(wc: &WorkCompletion) -> Self {
        // SAFETY: `in_wc` points at the initialized words of `ibv_wc` it names, aligned.
        unsafe { Arrived::in_wc(wc).read() }
    }
}

// SAFETY: the raw pointers in the C receives point into the chain's own heap blocks (its
// SGEs, its next C receive); the buffers are T: Send. Nothing is shared with another
// thread.
unsafe impl<T: ExclusiveBuf> Send for PreparedRecvChain<T> {}

impl<T: ExclusiveBuf> PreparedRecvChain<T> {
    /// How many receives it posts (at least 1).
    pub fn len(&self) -> usize {
        self.inner.members.len()
    }

    /// Never: a chain holds at least one receive.
    pub fn is_empty(&self) -> bool {
        self.inner.members.is_empty()
    }

    /// Receive `i`, in posting order, with what its last completion said.
    pub fn get(&self, i: usize) -> Option<RecvChainMember<'_, T>> {
        let inner = &*self.inner;
        Some(RecvChainMember { member: inner.members.get(i)?, arrived: inner.arrived[i] })
    }

    /// Every receive, in posting order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = RecvChainMember<'_, T>> {
        let inner = &*self.inner;
        inner.members.iter().zip(&inner.arrived).map(|(member, &arrived)| RecvChainMember { member, arrived })
    }

    /// The receives apart: each buffer, range and id, in posting order.
    pub fn into_parts(self) -> Vec<(T, Range<usize>, u64)> {
        self.inner.members.into_iter().map(|m| (m.buf, m.range, m.id)).collect()
    }

    /// A chain of `members` (1 up to MAX_BATCH) with their SGEs and C receives, checked
    /// against `pd` and `max_sge`: linked here.
    fn of(members: Vec<Member<T>>, sges: Vec<Sges>, raws: Vec<ffi::ibv_recv_wr>, pd: PdId, max_sge: u32) -> Self {
        let arrived = vec![Arrived::default(); members.len()];
        let id = members[0].id;
        let mut inner = ChainInner { raws, sges, members, id, arrived, pd, fit: u64::from(max_sge) };
        inner.relink();
        PreparedRecvChain { inner: Box::new(inner) }
    }

    /// Splits the chain after its first `k` receives (0 < k < len): `self` keeps those,
    /// the rest comes back (the failure path: the provider stopped inside the chain).
    #[cold]
    fn split(&mut self, k: usize) -> Self {
        let inner = &mut *self.inner;
        let (members, sges, raws) = (inner.members.split_off(k), inner.sges.split_off(k), inner.raws.split_off(k));
        inner.arrived.truncate(k);
        inner.relink();
        PreparedRecvChain::of(members, sges, raws, inner.pd, inner.fit as u32)
    }
}

impl<T> ChainInner<T> {
    /// Clears every record's words past `byte_len` (before a post, when a run or a
    /// `complete` wrote some since the last).
    #[cold]
    fn clear_extras(&mut self) {
        for a in &mut self.arrived {
            *a = Arrived { imm: 0, qp_num: 0, src_qp: 0, flags: 0, ..*a };
        }
        self.fit &= !EXTRAS;
    }

    /// Points each member's C receive at its SGEs and links them in order; pads `raws`
    /// with empty ones to a multiple of 8.
    #[cold]
    fn relink(&mut self) {
        let n = self.members.len();
        self.raws.truncate(n);
        self.raws.resize(n.next_multiple_of(8), EMPTY_RECV);
        let (raws, sges) = (self.raws.as_mut_ptr(), self.sges.as_mut_ptr());
        for i in 0..n {
            let next = if i + 1 < n { raws.wrapping_add(i + 1) } else { std::ptr::null_mut() };
            // SAFETY: i is below the length of `raws` and of `sges` (built side by side,
            // one per member); the element is written through the pointer alone.
            unsafe {
                let wr = raws.add(i);
                (*wr).sg_list = sges.add(i).cast();
                (*wr).next = next;
            }
        }
    }
}

impl<T: ExclusiveBuf> fmt::Debug for PreparedRecvChain<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// One receive of a [`PreparedRecvChain`], read while the chain is yours (not posted):
/// its buffer, range and id, and what its last completion said.
pub struct RecvChainMember<'a, T> {
    member: &'a Member<T>,
    arrived: Arrived,
}

impl<'a, T> RecvChainMember<'a, T> {
    /// The buffer, read-only: what the last receive brought. (It cannot be replaced or
    /// written: its SGEs are built in.)
    pub fn buf(&self) -> &'a T {
        &self.member.buf
    }

    /// The caller's identifier.
    pub fn id(&self) -> u64 {
        self.member.id
    }

    /// The range of the buffer the receive lands in.
    pub fn range(&self) -> Range<usize> {
        self.member.range.clone()
    }

    /// Bytes its last completion received (0 before the chain's first completion).
    pub fn byte_len(&self) -> u32 {
        self.arrived.byte_len
    }

    /// How its last receive ended ([`WcStatus::Success`] before the first).
    pub fn status(&self) -> WcStatus {
        WcStatus::from_raw(self.arrived.status)
    }

    /// The immediate data its last message carried, in host byte order, if any.
    pub fn imm_data(&self) -> Option<u32> {
        let with_imm = self.arrived.flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
        with_imm.then(|| u32::from_be(self.arrived.imm))
    }
}

impl<T> fmt::Debug for RecvChainMember<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvChainMember")
            .field("id", &self.member.id)
            .field("range", &self.member.range)
            .field("byte_len", &self.arrived.byte_len)
            .field("status", &self.status())
            .finish()
    }
}

impl<T: ExclusiveBuf> Sealed for PreparedRecvChain<T> {}

impl<T: ExclusiveBuf> RecvRequest for PreparedRecvChain<T> {
    type Back = PreparedRecvChain<T>;
    type Scratch = ();

    const CHAIN: bool = true;

    #[inline(always)]
    fn width(&self) -> usize {
        self.inner.members.len()
    }

    /// The chain, ended by `wc` (the queue's `complete` records each member instead).
    fn finish(self, wc: &WorkCompletion, _: Token) -> Done<PreparedRecvChain<T>> {
        Done::received(self.inner.id, self, wc)
    }
}

/// Prepared receive chains: receives checked and built once, linked once, then posted
/// whole again and again with nothing redone but their `wr_id`s.
///
/// A program that reposts the same window of receive buffers each round (a bandwidth
/// tool, an RPC layer's request slots) costs least this way: the shape of a C program
/// reposting a prebuilt list of `ibv_recv_wr`s, with the checks and the ownership kept.
/// [`prepare_chain`](RecvQueue::prepare_chain) checks each buffer and range against the
/// QP (its protection domain, `max_recv_sge`) and builds the C receives and their SGEs
/// side by side in the chain's own heap blocks, linked once;
/// [`post`](RecvQueue::post) compares the chain's protection domain and SGE limit with
/// the queue's, stamps the `wr_id`s in one loop and calls the provider once. The chain
/// takes one ring entry per receive (so [`outstanding`](RecvQueue::outstanding) and the
/// CQ share count every receive), sits in the slot of its first, and comes back whole,
/// once, with the completion of its last receive: [`complete`](RecvQueue::complete) and
/// [`complete_all`](RecvQueue::complete_all) record each member's completion (bytes
/// received, status, immediate data) in the chain, allocating nothing, and hand the chain
/// back in a [`Done`] that names its first receive's id and carries the first failed
/// member's completion (status, length, vendor error), else its last member's length
/// (with no vendor error: a success has none). Each
/// member is read through [`PreparedRecvChain::get`] or [`iter`](PreparedRecvChain::iter).
///
/// Soundness is the receive queue's (see [`SendQueue`](crate::SendQueue)): the chain
/// owns its buffers ([`ExclusiveBuf`]), is posted by value, stays in the queue's ring until
/// its last completion, and exposes no `&mut` to a buffer, so none can be swapped or
/// written; its C receives point into its own heap blocks, which do not move when the
/// chain does. A chain the provider stops inside (it refuses a receive after taking
/// some) is split: the part it took stays with the queue until its last completion, the
/// rest comes back in the error, as a chain.
///
/// It is a [`RecvQueue`] (one machine, whatever it keeps): it claims the receive side (a
/// QP has one at a time) with the same CQ share.
///
/// A chain of receives filled by a chain of SENDs, posted again each round:
///
#[doc = concat!("```no_run\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/device/doc/recv_chain.rs")), "```")]
pub type RecvChainQueue<T> = RecvQueue<T, PreparedRecvChain<T>>;

impl<T: ExclusiveBuf> RecvQueue<T, PreparedRecvChain<T>> {
    /// Checks each receive `(buffer, range, id)` against this QP (protection domain,
    /// `max_recv_sge`) and builds them as one chain (1 up to [`MAX_BATCH`] receives, and
    /// no more than this queue's depth; the allocations are here, not at post time). On
    /// refusal every buffer comes back, in order.
    #[allow(clippy::type_complexity)] // the refused receives come back as they were given
    pub fn prepare_chain<I>(&self, recvs: I) -> Result<PreparedRecvChain<T>, Refused<Vec<(T, Range<usize>, u64)>>>
    where
        I: IntoIterator<Item = (T, Range<usize>, u64)>,
    {
        let most = (self.depth() as usize).min(MAX_BATCH);
        let mut recvs = recvs.into_iter();
        let (mut members, mut sges, mut raws) = (Vec::new(), Vec::new(), Vec::new());
        while let Some((buf, range, id)) = recvs.next() {
            let refused = if members.len() == most {
                Error::invalid(
                    Verb::RecvQueuePrepareChain,
                    format!("a chain holds at most {most} receives (MAX_BATCH, and this queue's depth)"),
                )
            } else {
                let (mut s, mut raw) = (NO_SGES, EMPTY_RECV);
                match fill_recv(
                    Verb::RecvQueuePrepareChain,
                    &buf,
                    range.clone(),
                    0,
                    (self.max_sge, self.pd),
                    &mut s,
                    &mut raw,
                ) {
                    Ok(_) => {
                        members.push(Member { buf, range, id });
                        sges.push(s);
                        raws.push(raw);
                        continue;
                    }
                    Err(e) => e,
                }
            };
            let back = members.into_iter().map(|m| (m.buf, m.range, m.id)).chain([(buf, range, id)]).chain(recvs);
            return Err(Refused::new(refused, back.collect()));
        }
        if members.is_empty() {
            return Err(Refused::new(
                Error::invalid(Verb::RecvQueuePrepareChain, "a chain needs at least one receive"),
                Vec::new(),
            ));
        }
        Ok(PreparedRecvChain::of(members, sges, raws, self.pd, self.max_sge))
    }

    /// Posts a prepared chain whole (one provider call, no allocation, no syscall). On
    /// refusal it comes back in the error; if the provider stops inside it, the part it
    /// took stays posted and the rest comes back, as a chain.
    #[inline(always)]
    #[allow(clippy::result_large_err)] // the refused chain comes back by value
    pub fn post(&mut self, chain: PreparedRecvChain<T>) -> Result<(), Refused<PreparedRecvChain<T>>> {
        let (raw, max_sge, pd, head) = (self.raw, self.max_sge, self.pd, self.ring_head());
        let w = chain.inner.members.len();
        let (ring, _) = self.ring_and_tag();
        if w > ring.free() {
            let cap = ring.cap;
            let e = if w as u64 > cap {
                wider_than_queue(Verb::RecvQueuePost, w, cap)
            } else {
                queue_full(Verb::RecvQueuePost, cap)
            };
            return Err(Refused::new(e, chain));
        }
        let mut chain = chain;
        let inner = &mut *chain.inner;
        if inner.pd != pd || inner.fit != u64::from(max_sge) {
            if let Err(e) = inner.make_ready(max_sge, pd) {
                return Err(Refused::new(e, chain));
            }
        }
        let first = chain.inner.raws.as_mut_ptr();
        let (ids, tag) = self.next_ids();
        if head + w as u64 >= ids.end {
            // SAFETY: `first` heads the chain's `w` C receives.
            unsafe { stamp_slow(ids, tag, first, w, head) };
        } else {
            // No wrap inside: the wr_ids are the first's plus i. Eight at a time, the
            // padding too (never posted).
            let (mut id, mut at) = (head.wrapping_add(ids.to_id), first);
            // SAFETY: `raws` has its length of C receives from `first`.
            let end = unsafe { first.add(chain.inner.raws.len()) };
            while at != end {
                for j in 0..8 {
                    // SAFETY: `at` has a multiple of 8 C receives of the chain from it
                    // (it is below `end`); the element is written through the pointer
                    // alone, so the links into it stay valid.
                    unsafe { (*at.add(j)).wr_id = id + j as u64 };
                }
                // SAFETY: as above: the next group, or the end.
                at = unsafe { at.add(8) };
                id += 8;
            }
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is alive (the queue's claim); the chain's C receives are linked
        // (the last `next` NULL), in its heap blocks with their SGEs, naming bytes of its
        // buffers, which the ring owns until the last completion and nobody else can
        // reach (ExclusiveBuf).
        let rc = unsafe { ffi::ibv_post_recv(raw, first, &mut bad) };
        if let Err(e) = conv::errno(Verb::PostRecv, rc) {
            return self.post_failed(chain, e, first, bad);
        }
        let (ring, _) = self.ring_and_tag();
        ring.stage(0, chain);
        ring.commit(w);
        Ok(())
    }

    /// The provider refused the chain at `bad`: what it took before stays posted, the
    /// rest comes back with the error.
    #[cold]
    #[inline(never)]
    #[allow(clippy::result_large_err)] // the refused chain comes back by value
    fn post_failed(
        &mut self,
        mut chain: PreparedRecvChain<T>,
        e: Error,
        first: *mut ffi::ibv_recv_wr,
        bad: *mut ffi::ibv_recv_wr,
    ) -> Result<(), Refused<PreparedRecvChain<T>>> {
        // SAFETY: `first` heads the chain's linked C receives, the last `next` NULL.
        let k = unsafe { stopped_at(first, bad) };
        if k == 0 {
            return Err(Refused::new(e, chain));
        }
        let rest = chain.split(k);
        let (ring, _) = self.ring_and_tag();
        ring.stage(0, chain);
        ring.commit(k);
        Err(Refused::new(e, rest))
    }

    /// Takes a completion of this receive queue: records it in the chain of its receive
    /// and, when it is the chain's last, hands the chain back to `done`. Returns how many
    /// completions it took (1). Receives complete in posting order; anything else is
    /// refused.
    #[inline]
    pub fn complete(
        &mut self,
        wc: &mut WorkCompletion,
        mut done: impl FnMut(Done<PreparedRecvChain<T>>),
    ) -> Result<usize> {
        let ChainState { ring, tag, qp_num, oldest, member_fail, run } = self.chain_state();
        let tail = ring.tail;
        if !((wc.wr_id() == tag | (tail & LOW_MASK)) & (wc.qp_num() == qp_num) & (tail != ring.head)) {
            return Err(not_ours(Verb::RecvQueueComplete, "receive", wc));
        }
        // The next `complete_all` sets its run afresh (this writes a record by index).
        run.end = 0;
        wc.consume();
        ring.tail = tail + 1;
        let slot = ring.slot(*oldest);
        // SAFETY: the oldest outstanding chain sits in the slot of its first receive (the
        // ring's layout for chains), initialized until read out below.
        let inner = unsafe { &mut *slot.assume_init_mut().inner };
        let at = (tail - *oldest) as usize;
        inner.arrived[at] = Arrived::of(wc);
        if wc.as_raw().wc_flags & WITH_IMM != 0 {
            inner.fit |= EXTRAS;
        }
        if !wc.is_success() {
            member_failed(member_fail, at, wc);
        }
        if at + 1 < inner.arrived.len() {
            return Ok(1);
        }
        // SAFETY: the tail just passed the oldest chain's last member.
        done(unsafe { finish_oldest(ring, oldest, run, member_fail, qp_num, wc.byte_len()) });
        Ok(1)
    }

    /// Takes a poll's completions in order, each as [`complete`](Self::complete) does,
    /// and hands every chain whose last receive completed to `done`; returns how many
    /// completions it took. Stops at the first completion that is not this queue's, with
    /// its error: the ones before it are taken, it and the rest are left as they were.
    /// The completions of a chain's members are checked and recorded in one loop with the
    /// chain at hand: the cheaper way to take a batch of them.
    #[inline]
    pub fn complete_all(
        &mut self,
        wcs: &mut [WorkCompletion],
        mut done: impl FnMut(Done<PreparedRecvChain<T>>),
    ) -> Result<usize> {
        let mut at = 0;
        while at < wcs.len() {
            // The completions of one run of the oldest chain's members, up to its last,
            // the sequence numbers' wrap or the poll's end. (The queue's state is read
            // afresh each time: nothing kept across `done`.)
            let ChainState { ring, tag, qp_num, oldest, member_fail, run } = self.chain_state();
            let tail = ring.tail;
            if tail >= run.end && !start_run(ring, tag, *oldest, run) {
                break;
            }
            let rest = &mut wcs[at..];
            let len = ((run.end - tail) as usize).min(rest.len());
            let records = run.records.cast::<Arrived>().wrapping_add(tail as usize);
            // SAFETY: `records` is the record of the oldest chain's member at the tail, and
            // the chain has records up to `run.end` (its last, or before); len <= end -
            // tail. The wr_ids (tail + to_id ...) do not wrap before `end`.
            let (took, marks) = unsafe { take_run(&mut rest[..len], tail.wrapping_add(run.to_id), qp_num, records) };
            if marks != 0 {
                // SAFETY: the oldest outstanding chain sits in the slot of its first
                // receive, initialized (the run is its); nothing else points into it here.
                let inner = unsafe { &mut *ring.slot(*oldest).assume_init_mut().inner };
                run_marked(inner, member_fail, (tail - *oldest) as usize, &rest[..took]);
            }
            let tail = tail + took as u64;
            ring.tail = tail;
            at += took;
            if took < len {
                break; // a stranger
            }
            if tail != run.last {
                continue; // the poll's end, or the wrap (the next run is set afresh)
            }
            // The chain's last member.
            // SAFETY: the run took its last member's completion (`took` >= 1: the tail
            // moved on to `run.last`), whose record is the last written.
            let byte_len = unsafe { (*records.add(took - 1)).byte_len };
            // SAFETY: the tail just passed the oldest chain's last member.
            done(unsafe { finish_oldest(ring, oldest, run, member_fail, qp_num, byte_len) });
        }
        match wcs.get(at) {
            Some(stranger) => Err(not_ours(Verb::RecvQueueComplete, "receive", stranger)),
            None => Ok(at),
        }
    }
}

/// Sets `run` on the oldest outstanding chain (whose first receive's sequence number is
/// `oldest`) from the ring's tail: up to its last member, stopping short of the sequence
/// numbers' wrap. False when no receive is outstanding.
#[inline]
fn start_run<T: ExclusiveBuf>(ring: &mut Ring<PreparedRecvChain<T>>, tag: u64, oldest: u64, run: &mut Run) -> bool {
    let tail = ring.tail;
    if tail == ring.head {
        return false;
    }
    // SAFETY: the oldest outstanding chain sits in the slot of its first receive,
    // initialized; `tail` is inside it (it would have been read out at its last member).
    let inner = unsafe { &mut *ring.slot(oldest).assume_init_mut().inner };
    let ids = Numbering::at(tag, tail);
    run.last = oldest + inner.arrived.len() as u64;
    run.end = run.last.min(ids.end);
    run.to_id = ids.to_id;
    // Offset back by the chain's first sequence number: the record of the member at
    // sequence number `seq` is `records + seq` (wrapping, so no arithmetic overflows).
    run.records = inner.arrived.as_mut_ptr().wrapping_sub(oldest as usize).cast();
    true
}

/// Takes the completions of a run of one chain's members (whose `wr_id`s are `first`,
/// `first + 1`, ..., on QP `qp_num`), copying each one's words up to `byte_len` to
/// `arrived`, up to the first that is not the next: returns how many, and whether one
/// failed or carried immediate data (0: none did; those need [`run_marked`]).
///
/// # Safety
/// `arrived` has room for `wcs.len()` records.
#[inline(always)]
unsafe fn take_run(wcs: &mut [WorkCompletion], first: u64, qp_num: u32, arrived: *mut Arrived) -> (usize, u32) {
    let (mut failed, mut flags) = (0, 0);
    let n = wcs.len();
    let base = wcs.as_mut_ptr();
    // Eight at a time (an eighth of the loop's own instructions), each compared with the
    // group's first wr_id plus its place. The completions, the wr_id and the records
    // each move on by themselves (pointers, not an index): the compiler then keeps the
    // wr_id in a register of its own, one instruction a completion fewer. A stranger
    // ends it where it stands (its place worked out from the pointers).
    let (mut at, mut id, mut rec) = (base, first, arrived);
    // SAFETY: `wcs` has n elements from `base`; n - n % 8 <= n.
    let end8 = unsafe { base.add(n - n % 8) };
    while at != end8 {
        for j in 0..8 {
            // SAFETY: `at` has 8 elements of `wcs` from it (it is below end8).
            let wc = unsafe { &mut *at.add(j) };
            if wc.wr_id() != id + j as u64 || wc.qp_num() != qp_num {
                // SAFETY: both point into `wcs`.
                return (unsafe { at.add(j).offset_from(base) } as usize, failed | flags & WITH_IMM);
            }
            wc.consume();
            let raw = wc.as_raw();
            (failed, flags) = (failed | raw.status.0, flags | raw.wc_flags);
            // SAFETY: `rec` has room for the group's records (the caller's `arrived` for
            // all of `wcs`); the source is the initialized words of `ibv_wc` that
            // `head_in_wc` names; the record's first words are that shape.
            unsafe { std::ptr::copy_nonoverlapping(Arrived::head_in_wc(wc), rec.add(j).cast(), 1) };
        }
        // SAFETY: as above: the next group, or end8.
        unsafe {
            at = at.add(8);
            rec = rec.add(8);
        }
        id += 8;
    }
    for j in 0..n % 8 {
        // SAFETY: `at` (end8) has n % 8 elements of `wcs` from it.
        let wc = unsafe { &mut *at.add(j) };
        if wc.wr_id() != id + j as u64 || wc.qp_num() != qp_num {
            return (n - n % 8 + j, failed | flags & WITH_IMM);
        }
        wc.consume();
        let raw = wc.as_raw();
        (failed, flags) = (failed | raw.status.0, flags | raw.wc_flags);
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(Arrived::head_in_wc(wc), rec.add(j).cast(), 1) };
    }
    (n, failed | flags & WITH_IMM)
}

/// A run of the oldest chain's members `from..` (their completions `wcs`) in which one
/// failed or carried immediate data: keeps the first failed member, and copies the
/// whole of each completion to its record (the failure and immediate data path only).
#[cold]
#[inline(never)]
fn run_marked<T>(inner: &mut ChainInner<T>, first: &mut Option<(usize, u32)>, from: usize, wcs: &[WorkCompletion]) {
    for (i, wc) in wcs.iter().enumerate() {
        if !wc.is_success() {
            first.get_or_insert((from + i, wc.vendor_err()));
        }
        inner.arrived[from + i] = Arrived::of(wc);
    }
    inner.fit |= EXTRAS;
}

/// Stamps the `w` C receives at `first` as sequence numbers `head..` of the queue whose
/// tag bits are `tag`, at or past the end of its numbering `ids`: numbered afresh from
/// `head`, and one by one if they wrap inside (once in 2^40).
///
/// # Safety
/// `first` heads `w` C receives side by side.
#[cold]
#[inline(never)]
unsafe fn stamp_slow(ids: &mut Numbering, tag: u64, first: *mut ffi::ibv_recv_wr, w: usize, head: u64) {
    *ids = Numbering::at(tag, head);
    // SAFETY: the caller's contract.
    unsafe { stamp(first, w, tag, head) };
}

/// Keeps the first failed member of the oldest chain (the failure path only).
#[cold]
#[inline(never)]
fn member_failed(first: &mut Option<(usize, u32)>, at: usize, wc: &WorkCompletion) {
    first.get_or_insert((at, wc.vendor_err()));
}

/// Hands back the oldest chain of the queue whose QP is `qp_num` (its first receive's
/// sequence number `oldest`), ended by its last member's completion of `byte_len` bytes:
/// read out of its slot, the run off, the next chain the oldest.
///
/// # Safety
/// The ring's tail has just passed the oldest chain's last member (and the chain is still
/// in its slot, as it is until then).
#[inline(always)]
unsafe fn finish_oldest<T: ExclusiveBuf>(
    ring: &mut Ring<PreparedRecvChain<T>>,
    oldest: &mut u64,
    run: &mut Run,
    failed: &mut Option<(usize, u32)>,
    qp_num: u32,
    byte_len: u32,
) -> Done<PreparedRecvChain<T>> {
    run.end = 0;
    let first = std::mem::replace(oldest, ring.tail);
    let slot = ring.slot(first);
    // SAFETY: the oldest outstanding chain sits in the slot of its first receive; the tail
    // passed its last member (the caller's contract), so it is read out, once: the slot
    // is behind the tail now. The run is off, so nothing points into it any more.
    let chain = unsafe { slot.assume_init_read() };
    done_of(chain, byte_len, qp_num, failed)
}

/// The finished chain of QP `qp_num`, ended by its last member's completion (of
/// `byte_len` bytes), or reported by its first failed member's (`failed`, taken).
#[inline(always)]
fn done_of<T: ExclusiveBuf>(
    chain: PreparedRecvChain<T>,
    byte_len: u32,
    qp_num: u32,
    failed: &mut Option<(usize, u32)>,
) -> Done<PreparedRecvChain<T>> {
    let id = chain.inner.id;
    if failed.is_some() {
        return failed_done(id, chain, qp_num, failed);
    }
    // No member failed, so neither did the last (and a success has no vendor error).
    Done { id, value: chain, status: WcStatus::Success, byte_len, op: WcOpcode::Recv, qp_num, vendor_err: 0 }
}

#[cold]
fn failed_done<T: ExclusiveBuf>(
    id: u64,
    chain: PreparedRecvChain<T>,
    qp_num: u32,
    failed: &mut Option<(usize, u32)>,
) -> Done<PreparedRecvChain<T>> {
    let (at, vendor_err) = failed.take().unwrap_or_default();
    let a = chain.inner.arrived[at];
    let status = WcStatus::from_raw(a.status);
    Done { id, value: chain, status, byte_len: a.byte_len, op: WcOpcode::Recv, qp_num, vendor_err }
}

impl<T> ChainInner<T> {
    /// Makes the chain ready for a post on a queue with `max_sge` and `pd`, or says why
    /// that queue cannot take it (the slow path of a post: a chain prepared for another
    /// queue, or with records to clear).
    #[cold]
    fn make_ready(&mut self, max_sge: u32, pd: PdId) -> Result<()> {
        takes(self, max_sge, pd)?;
        if self.fit & EXTRAS != 0 {
            self.clear_extras();
        }
        self.fit = u64::from(max_sge);
        Ok(())
    }
}

/// Whether a queue with `max_sge` and `pd` takes a chain prepared for another.
fn takes<T>(c: &ChainInner<T>, max_sge: u32, pd: PdId) -> Result<()> {
    if c.pd != pd {
        return Err(Error::invalid(
            Verb::RecvQueuePost,
            "a receive chain prepared for a QP of another protection domain: its buffers are not registered in this one",
        ));
    }
    let n = c.raws.iter().map(|r| r.num_sge as u32).max().unwrap_or(0);
    if n > max_sge {
        return Err(Error::invalid(
            Verb::RecvQueuePost,
            format!(
                "a receive chain prepared with {n} SGEs in a receive, but this queue takes {max_sge} (max_recv_sge)"
            ),
        ));
    }
    Ok(())
}
