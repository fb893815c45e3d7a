//! Prepared receives: [`PreparedRecv`], posted through a [`PreparedRecvQueue`]
//! (documented there).

use std::fmt;
use std::ops::Range;

use super::recv::{fill_recv, RecvQueue, RecvRequest, EMPTY_RECV};
use super::request::sealed::Sealed;
use super::request::Token;
use super::ring::{refuse, Batch};
use super::tag::wr_id;
use super::{queue_full, Chain, Sges, MAX_BATCH, NO_SGES};
use crate::buf::{ExclusiveBuf, PdId};
use crate::conv;
use crate::error::{Error, Refused, Result, Verb};
use crate::ffi;
use crate::wc::WorkCompletion;
use crate::wr::Done;

/// A receive checked and built once, to be posted many times through a
/// [`PreparedRecvQueue`] (see there).
pub struct PreparedRecv<T: ExclusiveBuf> {
    inner: Box<Inner<T>>,
}

struct Inner<T> {
    /// The C request, always initialized; `stamp` points its `sg_list` at `sges` in
    /// this block at every post (where it was built, the SGEs were on the stack).
    raw: ffi::ibv_recv_wr,
    sges: Sges,
    buf: T,
    range: Range<usize>,
    id: u64,
    /// The protection domain and the receive SGE limit it was checked against.
    pd: PdId,
    max_sge: u32,
}

// SAFETY: the raw pointers in the C request point into this block (the SGEs); the buffer
// is T: Send. Nothing is shared with another thread.
unsafe impl<T: ExclusiveBuf> Send for PreparedRecv<T> {}

impl<T: ExclusiveBuf> PreparedRecv<T> {
    /// The caller's identifier, handed back with the completion.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Sets the caller's identifier (nothing is rebuilt: the `wr_id` is the queue's).
    pub fn set_id(&mut self, id: u64) {
        self.inner.id = id;
    }

    /// The range of the buffer the receive lands in.
    pub fn range(&self) -> Range<usize> {
        self.inner.range.clone()
    }

    /// The buffer, read-only: what the last receive brought, while the request is yours
    /// (not posted). The buffer cannot be replaced, since its SGEs are built in.
    pub fn buf(&self) -> &T {
        &self.inner.buf
    }

    /// The buffer, the range and the id it was built from.
    pub fn into_parts(self) -> (T, Range<usize>, u64) {
        let Inner { buf, range, id, .. } = *self.inner;
        (buf, range, id)
    }

    /// The C request, ready to post as `wr_id`: its SGE pointer taken afresh from this
    /// borrow of the block (so no pointer from an earlier borrow is used), its `next` NULL.
    #[inline(always)]
    fn stamp(&mut self, wr_id: u64) -> *mut ffi::ibv_recv_wr {
        let inner = &mut *self.inner;
        let raw = &mut inner.raw;
        raw.wr_id = wr_id;
        raw.sg_list = inner.sges.as_mut_ptr().cast();
        raw.next = std::ptr::null_mut();
        raw
    }

    /// Whether the queue with `max_sge` and `pd` takes it: at once when it was checked
    /// against the same, else out of line.
    #[inline(always)]
    fn check(&self, verb: Verb, max_sge: u32, pd: PdId) -> Result<()> {
        let inner = &*self.inner;
        if inner.pd == pd && inner.max_sge == max_sge {
            return Ok(());
        }
        takes(verb, inner, max_sge, pd)
    }
}

/// Whether a queue with `max_sge` and `pd` takes a receive prepared for another.
#[cold]
fn takes<T>(verb: Verb, p: &Inner<T>, max_sge: u32, pd: PdId) -> Result<()> {
    if p.pd != pd {
        return Err(Error::invalid(
            verb,
            "a receive prepared for a QP of another protection domain: its buffer is not registered in this one",
        ));
    }
    let n = p.raw.num_sge as u32;
    if n > max_sge {
        return Err(Error::invalid(
            verb,
            format!("a receive prepared with {n} SGEs, but this queue takes {max_sge} (max_recv_sge)"),
        ));
    }
    Ok(())
}

impl<T: ExclusiveBuf> fmt::Debug for PreparedRecv<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedRecv").field("id", &self.inner.id).field("range", &self.inner.range).finish()
    }
}

impl<T: ExclusiveBuf> Sealed for PreparedRecv<T> {}

impl<T: ExclusiveBuf> RecvRequest for PreparedRecv<T> {
    type Back = PreparedRecv<T>;
    type Scratch = ();

    #[inline(always)]
    fn finish(self, wc: &WorkCompletion, _: Token) -> Done<PreparedRecv<T>> {
        let id = self.inner.id;
        Done::received(id, self, wc)
    }
}

/// Prepared receives: a receive checked and built into its C form once, then posted again
/// and again with nothing redone but the `wr_id`.
///
/// A [`RecvQueue`] checks the buffer and builds the C receive on every
/// [`post`](RecvQueue::post). A program that posts the same receive buffers over and over
/// (an RPC layer's request slots, a benchmark) pays that for nothing. A
/// [`PreparedRecvQueue`] takes [`PreparedRecv`]s instead:
/// [`prepare`](RecvQueue::prepare) checks the buffer and range against the QP (its
/// protection domain, `max_recv_sge`) and builds the `ibv_recv_wr` and its SGEs in a heap
/// block that belongs to the receive; posting stamps the `wr_id` and calls the provider,
/// and the completion hands the whole receive back ([`Done::value`]), to read what arrived
/// ([`PreparedRecv::buf`]) and post it again.
///
/// Soundness is the receive queue's (see [`SendQueue`](crate::SendQueue)): a prepared
/// receive owns its buffer (an [`ExclusiveBuf`]), is posted by value, stays in the queue's
/// ring until its completion hands it back, and exposes no `&mut` to its buffer, so it
/// can be neither swapped nor written; its C request points into its own heap block,
/// which does not move when the receive does.
///
/// It is a [`RecvQueue`] (one machine, whatever it keeps): it claims the receive side (a
/// QP has one at a time) with the same CQ share, and completes the same way.
///
/// A chain of SENDs into prepared receives, posted again each round:
///
#[doc = concat!("```no_run\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/device/doc/prepared.rs")), "```")]
pub type PreparedRecvQueue<T> = RecvQueue<T, PreparedRecv<T>>;

impl<T: ExclusiveBuf> RecvQueue<T, PreparedRecv<T>> {
    /// Checks `range` of `buf` against this QP (protection domain, `max_recv_sge`) and
    /// builds its C receive (one allocation, here and not at post time), handed back
    /// with `id`. On refusal the buffer comes back.
    #[allow(clippy::result_large_err)] // the refused buffer comes back by value
    pub fn prepare(&self, buf: T, range: Range<usize>, id: u64) -> Result<PreparedRecv<T>, Refused<T>> {
        let (mut sges, mut raw) = (NO_SGES, EMPTY_RECV);
        if let Err(e) =
            fill_recv(Verb::RecvQueuePrepare, &buf, range.clone(), 0, (self.max_sge, self.pd), &mut sges, &mut raw)
        {
            return Err(Refused::new(e, buf));
        }
        let inner = Box::new(Inner { raw, sges, buf, range, id, pd: self.pd, max_sge: self.max_sge });
        Ok(PreparedRecv { inner })
    }

    /// Takes a completion of this receive queue and returns the finished prepared
    /// receive, to read and post again. Receives complete in posting order; anything
    /// else is refused.
    #[inline(always)]
    pub fn complete(&mut self, wc: &mut WorkCompletion) -> Result<Done<PreparedRecv<T>>> {
        self.complete_one(wc)
    }

    /// Posts a prepared receive (one provider call, no allocation, no syscall). On
    /// refusal it comes back in the error.
    #[inline(always)]
    #[allow(clippy::result_large_err)] // the refused receive comes back by value
    pub fn post(&mut self, mut p: PreparedRecv<T>) -> Result<(), Refused<PreparedRecv<T>>> {
        if let Err(e) = p.check(Verb::RecvQueuePost, self.max_sge, self.pd) {
            return Err(Refused::new(e, p));
        }
        let (raw, seq) = (self.raw, self.ring_head());
        let (ring, tag) = self.ring_and_tag();
        if ring.free() == 0 {
            let cap = ring.cap;
            return Err(Refused::new(queue_full(Verb::RecvQueuePost, cap), p));
        }
        let wr = p.stamp(wr_id(tag, seq));
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is alive (the queue's claim); the C request and its SGEs are in
        // the receive's heap block, naming bytes of its buffer, which the ring owns until
        // the completion and nobody else can reach (ExclusiveBuf).
        let rc = unsafe { ffi::ibv_post_recv(raw, wr, &mut bad) };
        if let Err(e) = conv::errno(Verb::PostRecv, rc) {
            return Err(Refused::new(e, p));
        }
        ring.push(p);
        Ok(())
    }

    /// Posts up to [`MAX_BATCH`] prepared receives with one provider call. Returns how many
    /// were posted; on refusal, the error and the unposted receives, in order.
    pub fn post_batch<I>(&mut self, recvs: I) -> Result<usize, Refused<Vec<PreparedRecv<T>>>>
    where
        I: IntoIterator<Item = PreparedRecv<T>>,
    {
        let (raw, max_sge, pd, head) = (self.raw, self.max_sge, self.pd, self.ring_head());
        let (ring, tag) = self.ring_and_tag();
        let room = MAX_BATCH.min(ring.free());
        let (mut n, mut refused) = (0, None);
        let mut chain = Chain::new();
        let mut recvs = recvs.into_iter();
        for p in recvs.by_ref() {
            if n == room {
                refused = refuse(queue_full(Verb::RecvQueuePostBatch, ring.cap), p);
                break;
            }
            if let Err(e) = p.check(Verb::RecvQueuePostBatch, max_sge, pd) {
                refused = refuse(e, p);
                break;
            }
            let p = ring.stage(n, p);
            chain.link(p.stamp(wr_id(tag, head + n as u64)));
            n += 1;
        }
        // SAFETY: the QP is alive; a valid chain of C requests in the heap blocks of
        // receives the ring keeps (staged), naming bytes of their buffers.
        let (posted, failure) = chain.post(Verb::PostRecv, n, |wr, bad| unsafe { ffi::ibv_post_recv(raw, wr, bad) });
        ring.finish_batch(Batch { staged: n, posted, failure, refused }, recvs)
    }
}
