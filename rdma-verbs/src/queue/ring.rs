//! The ring of a queue whose requests complete in order (send queues, QP receive
//! queues): slots indexed by sequence number, staged, committed, popped.

use std::mem::MaybeUninit;

use super::not_ours;
use super::tag::LOW_MASK;
use crate::error::{Error, Refused, Result, Verb};
use crate::wc::WorkCompletion;

/// A ring of entries indexed by sequence number, for queues whose requests complete in
/// order. Entries between `tail` and `head` are initialized (posted); an entry may be
/// *staged* past `head` while a batch is built, and is then either committed (posted) or
/// taken back. Its length is a power of two (the index is a mask), its capacity the
/// queue's depth.
pub(super) struct Ring<E> {
    slots: Box<[MaybeUninit<E>]>,
    mask: u64,
    pub(super) cap: u64,
    pub(super) head: u64,
    pub(super) tail: u64,
}

impl<E> Ring<E> {
    pub(super) fn new(depth: u32) -> Self {
        let cap = u64::from(depth.max(1));
        let len = cap.next_power_of_two();
        Ring { slots: (0..len).map(|_| MaybeUninit::uninit()).collect(), mask: len - 1, cap, head: 0, tail: 0 }
    }

    /// Moves an empty ring's sequence numbers on to `seq` (a test hook's: see
    /// `restart_sequence_at`).
    pub(super) fn restart_at(&mut self, seq: u64) {
        debug_assert_eq!(self.head, self.tail, "only an empty ring restarts");
        (self.head, self.tail) = (seq, seq);
    }

    #[inline]
    pub(super) fn free(&self) -> usize {
        (self.cap - (self.head - self.tail)) as usize
    }

    #[inline]
    pub(super) fn outstanding(&self) -> u64 {
        self.head - self.tail
    }

    #[inline]
    pub(super) fn slot(&mut self, seq: u64) -> &mut MaybeUninit<E> {
        let i = (seq & self.mask) as usize;
        debug_assert!(i < self.slots.len());
        // SAFETY: `slots` has mask + 1 entries (new()), so a masked index is in bounds.
        unsafe { self.slots.get_unchecked_mut(i) }
    }

    /// The slots' base and the index mask, for a loop that keeps them in registers: the
    /// slot of `seq` is `base.add((seq & mask) as usize)`, in bounds for every `seq`.
    /// Valid until the ring is next borrowed whole.
    #[inline(always)]
    pub(super) fn slot_base(&mut self) -> (*mut MaybeUninit<E>, u64) {
        (self.slots.as_mut_ptr(), self.mask)
    }

    /// Writes `e` into the slot `k` places past the head, not posted yet. The caller
    /// checked `k < free()`, and later commits it or takes it back with [`unstage`](Self::unstage).
    /// (Should the caller unwind in between, the staged entry leaks: never freed early.)
    #[inline]
    pub(super) fn stage(&mut self, k: usize, e: E) -> &mut E {
        self.slot(self.head + k as u64).write(e)
    }

    /// The entry staged `k` places past the head.
    ///
    /// # Safety
    /// It was staged and neither committed nor taken back.
    #[inline]
    pub(super) unsafe fn staged(&mut self, k: usize) -> &mut E {
        // SAFETY: the caller's contract: the slot holds an initialized entry.
        unsafe { self.slot(self.head + k as u64).assume_init_mut() }
    }

    /// Takes back the entry staged `k` places past the head.
    ///
    /// # Safety
    /// It was staged and neither committed nor taken back; it is read out once.
    #[inline]
    pub(super) unsafe fn unstage(&mut self, k: usize) -> E {
        // SAFETY: the caller's contract.
        unsafe { self.slot(self.head + k as u64).assume_init_read() }
    }

    /// Marks the first `k` staged entries posted.
    #[inline]
    pub(super) fn commit(&mut self, k: usize) {
        self.head += k as u64;
    }

    #[inline]
    pub(super) fn push(&mut self, e: E) {
        self.stage(0, e);
        self.commit(1);
    }

    /// Takes the oldest entry. The caller checked that one is outstanding.
    #[inline]
    pub(super) fn pop(&mut self) -> E {
        // SAFETY: entries between tail and head are initialized, and this one is moved
        // out exactly once (tail moved past it).
        unsafe { self.pop_slot().assume_init_read() }
    }

    /// Gives up the oldest entry in place: the ring counts it gone, and the caller reads
    /// it out of the slot (which holds it initialized), or it leaks. The caller checked
    /// that one is outstanding.
    #[inline]
    pub(super) fn pop_slot(&mut self) -> &mut MaybeUninit<E> {
        let seq = self.tail;
        self.tail += 1;
        self.slot(seq)
    }

    /// Ends a batch of `n` staged entries of which the provider took the first `posted`:
    /// commits those, and on a failure (`failure`, the provider's, outranks `refused`, the
    /// check that stopped the batch) returns the error with every entry not posted, in
    /// order: the staged ones, the refused one, then `rest`.
    #[inline]
    pub(super) fn finish_batch(
        &mut self,
        b: Batch<E>,
        rest: impl Iterator<Item = E>,
    ) -> Result<usize, Refused<Vec<E>>> {
        if b.failure.is_none() && b.refused.is_none() {
            self.commit(b.staged);
            return Ok(b.staged);
        }
        self.batch_failed(b, rest)
    }

    /// The failure path of [`finish_batch`](Self::finish_batch), out of line.
    #[cold]
    #[inline(never)]
    pub(super) fn batch_failed(
        &mut self,
        b: Batch<E>,
        rest: impl Iterator<Item = E>,
    ) -> Result<usize, Refused<Vec<E>>> {
        let Batch { staged: n, posted, failure, refused } = b;
        let mut unposted = Vec::new();
        for i in posted..n {
            // SAFETY: the caller staged 0..n and did not commit them; each is read once.
            unposted.push(unsafe { self.unstage(i) });
        }
        self.commit(posted);
        let error = failure_of(failure, refused, &mut unposted);
        unposted.extend(rest);
        Err(Refused::new(error, unposted))
    }

    /// Checks the send completion `wc` against the queue whose tag bits are `tag` on QP
    /// `qp_num`, and marks it taken: returns how many of the oldest outstanding entries
    /// it finishes (the unsignaled ones before its own, then its own), which the caller
    /// then pops in order. A completion that is not this queue's is an error, left as it
    /// was.
    #[inline(always)]
    pub(super) fn send_completion(&self, wc: &mut WorkCompletion, tag: u64, qp_num: u32) -> Result<u64> {
        // The common case: the oldest outstanding request (every request signaled).
        // Ours when the wr_id is this queue's tag with that sequence number, and the QP is
        // this one: compared without a branch between them.
        let (id, tail) = (wc.wr_id(), self.tail);
        if (id == tag | (tail & LOW_MASK)) & (wc.qp_num() == qp_num) & (tail != self.head) {
            wc.consume();
            return Ok(1);
        }
        // How far past the oldest outstanding request this one is (sequence numbers wrap
        // at 40 bits; at most a ring's worth is outstanding). Ours when the wr_id carries
        // this queue's tag (send side), the QP is this one, and it is outstanding.
        let ahead = id.wrapping_sub(tail) & LOW_MASK;
        if (id & !LOW_MASK != tag) | (wc.qp_num() != qp_num) | (ahead >= self.outstanding()) {
            return Err(not_ours(Verb::SendQueueComplete, "send", wc));
        }
        wc.consume();
        Ok(ahead + 1)
    }

    /// Everything still posted, for the graveyard.
    pub(super) fn take_all(&mut self) -> Vec<E> {
        let mut all = Vec::with_capacity(self.outstanding() as usize);
        while self.outstanding() > 0 {
            all.push(self.pop());
        }
        all
    }

    /// Everything still posted, for the graveyard, where an entry may span several slots
    /// (a chain, in the slot of its first): the oldest starts at `first`, each next one
    /// `width` of the one before further on. Empties the ring.
    pub(super) fn take_spans(&mut self, first: u64, width: impl Fn(&E) -> usize) -> Vec<E> {
        let mut all = Vec::with_capacity(self.outstanding() as usize);
        let mut seq = first;
        while seq < self.head {
            // SAFETY: an entry starts at `seq` (the oldest at `first`, each next one past
            // the last's width), posted and not yet read out; read out once here, and the
            // ring emptied below.
            let e = unsafe { self.slot(seq).assume_init_read() };
            seq += width(&e) as u64;
            all.push(e);
        }
        self.tail = self.head;
        all
    }
}

/// How a post of staged entries went: `staged` were staged, the provider took the first
/// `posted`; `failure` is the provider's error, `refused` the entry our checks stopped at
/// (not staged). Both are boxed, made only on the failure path: the batch is a few words
/// that move for free on the fast path, where a request-sized refusal would be copied
/// on every post.
pub(super) struct Batch<E> {
    pub(super) staged: usize,
    pub(super) posted: usize,
    pub(super) failure: Option<Box<Error>>,
    pub(super) refused: Option<Box<Refused<E>>>,
}

/// The error of a failed post, the provider's (`failure`) outranking our refusal of the
/// request that stopped the batch (`refused`), whose request joins `unposted`.
#[cold]
pub(super) fn failure_of<E>(
    failure: Option<Box<Error>>,
    refused: Option<Box<Refused<E>>>,
    unposted: &mut Vec<E>,
) -> Error {
    match (failure, refused) {
        (Some(e), refused) => {
            unposted.extend(refused.map(|r| r.into_value()));
            *e
        }
        (None, Some(r)) => {
            let Refused { error, value } = *r;
            unposted.push(value);
            error
        }
        (None, None) => unreachable!("a post fails with an error or a refusal"),
    }
}

/// A refusal of the batch's, boxed (out of line: the failure path only).
#[cold]
#[inline(never)]
pub(super) fn refuse<E>(error: Error, value: E) -> Option<Box<Refused<E>>> {
    Some(Box::new(Refused::new(error, value)))
}
