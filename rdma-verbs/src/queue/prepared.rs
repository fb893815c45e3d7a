//! Prepared requests: [`PreparedQueue`] and [`Prepared`] (documented there).

use std::fmt;
use std::mem::MaybeUninit;
use std::ops::{DerefMut, Range};

use super::{
    bury, check_send, queue_full, send_wr_id, Claim, Ring, SendLimits as Limits, SendQueue, Sges, Tag, NO_SGES,
};
use crate::buf::SendBuf;
use crate::cq::CqReservation;
use crate::error::{Error, Refused, Result, Verb};
use crate::ffi;
use crate::mr::RemoteMr;
use crate::qp::QueuePair;
use crate::wc::WorkCompletion;
use crate::wr::{Done, SendWr};

/// A send work request checked and built once, to be posted many times through a
/// [`PreparedQueue`] (see there).
pub struct Prepared<T: SendBuf> {
    inner: Box<Inner<T>>,
}

struct Inner<T> {
    /// The C request, always initialized; `sg_list` points at `sges` in this block.
    raw: MaybeUninit<ffi::ibv_send_wr>,
    sges: Sges,
    wr: SendWr<T>,
    /// The limits it was checked against (the preparing QP's max_send_sge, max_inline_data).
    limits: Limits,
    /// `limits.key()`, compared at each post.
    key: u64,
    /// What it needs of a QP: SGEs, and bytes inline (0 when not inline).
    needs: (u32, u32),
}

// SAFETY: the raw pointers in the C request point into this block (the SGEs) or at the
// address handle that `wr` keeps alive; the buffer is T: Send. Nothing is shared with
// another thread.
unsafe impl<T: SendBuf> Send for Prepared<T> {}

impl<T: SendBuf> Prepared<T> {
    /// Checks `wr` against `limits` (max SGEs, max inline bytes) and builds it.
    #[allow(clippy::result_large_err)] // the refused request comes back by value
    fn build(wr: SendWr<T>, limits: Limits) -> Result<Self, Refused<SendWr<T>>> {
        let mut sges = NO_SGES;
        let n = match check_send(limits, &wr, &mut sges) {
            Ok(n) => n,
            Err(e) => return Err(Refused::new(e, wr)),
        };
        let needs = needs(&wr, n);
        let key = limits.key();
        let mut inner = Box::new(Inner { raw: MaybeUninit::uninit(), sges, wr, limits, key, needs });
        let Inner { raw, sges, wr, .. } = &mut *inner;
        SendQueue::classic(wr, 0, sges, n, raw);
        Ok(Prepared { inner })
    }

    /// Checks the request again after a change and rebuilds its C form; on refusal
    /// nothing changed (the caller restores what it changed).
    fn rebuild(&mut self) -> Result<()> {
        let inner = &mut *self.inner;
        let mut sges = NO_SGES;
        let n = check_send(inner.limits, &inner.wr, &mut sges)?;
        inner.sges = sges;
        inner.needs = needs(&inner.wr, n);
        let Inner { raw, sges, wr, .. } = inner;
        SendQueue::classic(wr, 0, sges, n, raw);
        Ok(())
    }

    fn raw(&mut self) -> &mut ffi::ibv_send_wr {
        // SAFETY: `raw` is initialized by build() and kept so.
        unsafe { self.inner.raw.assume_init_mut() }
    }

    /// The C request, ready to post as `wr_id`: its SGE pointer taken afresh from this
    /// borrow of the block (so no pointer from an earlier borrow is used), its `next` NULL.
    #[inline]
    fn stamp(&mut self, wr_id: u64) -> *mut ffi::ibv_send_wr {
        let inner = &mut *self.inner;
        // SAFETY: `raw` is initialized by build() and kept so.
        let raw = unsafe { inner.raw.assume_init_mut() };
        raw.wr_id = wr_id;
        raw.sg_list = inner.sges.as_mut_ptr().cast();
        raw.next = std::ptr::null_mut();
        raw
    }

    /// The caller's identifier, handed back with the completion.
    pub fn id(&self) -> u64 {
        self.inner.wr.id
    }

    /// Sets the caller's identifier (nothing is rebuilt: the `wr_id` is the queue's).
    pub fn set_id(&mut self, id: u64) {
        self.inner.wr.id = id;
    }

    /// Whether the next post makes a completion (nothing else is rebuilt). Unsignaled
    /// requests are released by the next signaled completion after them.
    #[inline]
    pub fn set_signaled(&mut self, yes: bool) {
        let bit = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let flags = if yes { self.inner.wr.flags.0 | bit } else { self.inner.wr.flags.0 & !bit };
        self.inner.wr.flags = ffi::ibv_send_flags(flags);
        self.raw().send_flags = flags;
    }

    /// The range of the buffer it sends (or reads into).
    pub fn range(&self) -> Range<usize> {
        self.inner.wr.range.clone()
    }

    /// Sends (or reads into) another range of the same buffer: checked again as at
    /// [`PreparedQueue::prepare`]; on refusal the request is unchanged.
    pub fn set_range(&mut self, range: Range<usize>) -> Result<()> {
        let old = std::mem::replace(&mut self.inner.wr.range, range);
        self.rebuild().inspect_err(|_| self.inner.wr.range = old)
    }

    /// Targets another remote region (RDMA WRITE, READ, atomics): checked again; on
    /// refusal the request is unchanged. A request without a remote side refuses.
    pub fn set_remote(&mut self, remote: RemoteMr) -> Result<()> {
        let Some(old) = self.inner.wr.remote else {
            return Err(Error::invalid(Verb::PostSend, "this request has no remote side (a SEND)"));
        };
        self.inner.wr.remote = Some(remote);
        self.rebuild().inspect_err(|_| self.inner.wr.remote = Some(old))
    }

    /// The buffer, read-only.
    pub fn buf(&self) -> &T {
        &self.inner.wr.buf
    }

    /// The buffer's bytes, to change what the next post sends. The buffer itself cannot
    /// be replaced (its SGEs are built in), only its bytes written, and only while the
    /// request is not posted (it is yours, not the queue's).
    pub fn bytes_mut(&mut self) -> &mut [u8]
    where
        T: DerefMut<Target = [u8]>,
    {
        &mut self.inner.wr.buf
    }

    /// The work request it was built from, to post it another way or take its buffer.
    pub fn into_wr(self) -> SendWr<T> {
        self.inner.wr
    }
}

impl<T: SendBuf> fmt::Debug for Prepared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prepared").field("wr", &self.inner.wr).field("sges", &self.inner.needs.0).finish()
    }
}

/// What a checked request with `n` SGEs needs of a QP: SGEs, and inline bytes.
fn needs<T: SendBuf>(wr: &SendWr<T>, n: usize) -> (u32, u32) {
    let inline = if wr.is_inline() { (wr.range.end - wr.range.start) as u32 } else { 0 };
    (n as u32, inline)
}

/// Prepared requests: a work request checked and built into its C form once, then posted
/// again and again with nothing redone but the `wr_id`.
///
/// A [`SendQueue`] checks each [`SendWr`] and builds its C request on every post, because
/// each may differ. Programs that post the same few requests over and over (a benchmark,
/// a ping-pong, an RPC layer with fixed request slots) pay that for nothing. A
/// [`PreparedQueue`] takes [`Prepared`] requests instead: [`PreparedQueue::prepare`]
/// checks a request against the QP's limits and builds its `ibv_send_wr` and SGEs in a
/// heap block that belongs to the request; posting stamps the `wr_id`, links the chain
/// and calls the provider, which is what a C program reposting a prebuilt chain does.
///
/// Soundness is the send queue's (see the [queue module](crate::queue)): a prepared request
/// owns its buffer, is posted by value, stays in the queue's ring until its completion
/// hands it back, and exposes no `&mut` to the buffer value itself, so it cannot be
/// swapped for another while its SGEs name the first. Its bytes can be changed between
/// posts through [`Prepared::bytes_mut`] (exclusive, local chunks only), and its range,
/// remote target and flags through setters that check again what they change. Its C
/// request points into its own heap block, which does not move when the request does.
///
/// Posting always goes through the classic `ibv_post_send`, even on a QP built with
/// extended send ops: a prebuilt C request is what makes this path cheap, and the
/// `ibv_wr_*` calls build the request anew each time.
///
/// It claims the send side as a [`SendQueue`] does (a QP has one or the other at a
/// time), with the same CQ share.
pub struct PreparedQueue<T: SendBuf> {
    ring: Ring<Prepared<T>>,
    room: Option<CqReservation>,
    raw: *mut ffi::ibv_qp,
    qp_num: u32,
    limits: Limits,
    /// `limits.key()`.
    key: u64,
    tag: Tag,
    claim: Claim<crate::qp::QpInner>,
}

// SAFETY: as for SendQueue: it owns its requests (Send) and posts through the thread-safe
// ibv_post_send; the raw pointer is the QP that `claim` keeps alive.
unsafe impl<T: SendBuf> Send for PreparedQueue<T> {}

impl QueuePair {
    /// Takes the send side for prepared requests, as deep as the `max_send_wr` the QP
    /// was built with. Fails as [`send_queue`](Self::send_queue) does.
    pub fn prepared_queue<T: SendBuf>(&self) -> Result<PreparedQueue<T>> {
        self.prepared_queue_with_depth(self.inner.asked_depth.0)
    }

    /// Takes the send side for prepared requests with room for `depth` outstanding
    /// requests, setting `depth` entries of the send CQ aside, as
    /// [`send_queue_with_depth`](Self::send_queue_with_depth) does.
    pub fn prepared_queue_with_depth<T: SendBuf>(&self, depth: u32) -> Result<PreparedQueue<T>> {
        let (claim, room, depth) = self.claim_send_side(Verb::Claim, depth)?;
        Ok(PreparedQueue {
            ring: Ring::new(depth),
            room: Some(room),
            raw: self.as_raw(),
            qp_num: self.qp_num(),
            limits: self.send_limits(),
            key: self.send_limits().key(),
            tag: Tag::reserve()?,
            claim,
        })
    }
}

impl<T: SendBuf> PreparedQueue<T> {
    /// Checks `wr` against this QP's limits and builds its C request (one allocation,
    /// here and not at post time). On refusal the work request comes back.
    #[allow(clippy::result_large_err)] // the refused request comes back by value
    pub fn prepare(&self, wr: SendWr<T>) -> Result<Prepared<T>, Refused<SendWr<T>>> {
        Prepared::build(wr, self.limits)
    }

    /// Requests posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.ring.outstanding() as usize
    }

    /// The QP number, to route completions of a shared CQ.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// Whether this QP takes `p`: certainly when it was checked against the same limits
    /// (prepared here, or for a QP alike), else when what it needs fits.
    #[inline]
    fn takes(&self, p: &Prepared<T>) -> Result<()> {
        if p.inner.key == self.key {
            return Ok(());
        }
        let (sges, inline) = p.inner.needs;
        let Limits { max_sge, max_inline, ud } = self.limits;
        if p.inner.limits.ud != ud {
            return Err(Error::invalid(Verb::PostSend, "a request prepared for a QP of another transport (UD or not)"));
        }
        if sges > max_sge || inline > max_inline {
            return Err(too_big_for(sges, inline, max_sge, max_inline));
        }
        Ok(())
    }

    /// Posts one prepared request: its `wr_id` stamped, one provider call, no allocation.
    /// On refusal the request comes back in the error.
    #[inline]
    pub fn post(&mut self, p: Prepared<T>) -> Result<(), Refused<Prepared<T>>> {
        if self.ring.free() == 0 {
            return Err(Refused::new(queue_full(Verb::PostSend, self.ring.cap), p));
        }
        if let Err(e) = self.takes(&p) {
            return Err(Refused::new(e, p));
        }
        let seq = send_wr_id(self.tag.bits(), self.ring.head);
        let raw = self.ring.stage(0, p).stamp(seq);
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is alive (claim); the request is a valid C request whose SGEs
        // name bytes of the buffer it owns, and the ring keeps it until the completion.
        let rc = unsafe { ffi::ibv_post_send(self.raw, raw, &mut bad) };
        self.ring.finish_one(rc)
    }

    /// Posts prepared requests as one chain, with one provider call (one doorbell); as
    /// many as the queue has room for, with no limit of its own. Returns how many were
    /// posted. When one is refused (by our checks or by the provider), the ones before it
    /// are posted and the error comes back with the rest, in order (that path allocates,
    /// the fast path does not).
    pub fn post_batch<I>(&mut self, ps: I) -> Result<usize, Refused<Vec<Prepared<T>>>>
    where
        I: IntoIterator<Item = Prepared<T>>,
    {
        let room = self.ring.free();
        let tag = self.tag.bits();
        let (mut n, mut refused) = (0, None);
        let mut first: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        let mut prev: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        let mut ps = ps.into_iter();
        for p in ps.by_ref() {
            if n == room {
                refused = Some(Refused::new(queue_full(Verb::PostSend, self.ring.cap), p));
                break;
            }
            if let Err(e) = self.takes(&p) {
                refused = Some(Refused::new(e, p));
                break;
            }
            let seq = send_wr_id(tag, self.ring.head + n as u64);
            let raw = self.ring.stage(n, p).stamp(seq);
            if prev.is_null() {
                first = raw;
            } else {
                // SAFETY: `prev` is the C request of the entry staged before this one,
                // in its own heap block, which staging did not move.
                unsafe { (*prev).next = raw };
            }
            prev = raw;
            n += 1;
        }
        let (posted, failure) = if n == 0 {
            (0, None)
        } else {
            let mut bad = std::ptr::null_mut();
            // SAFETY: first..prev is a chain of valid C requests linked above (the last
            // `next` NULL), each in the heap block of a request the ring keeps until its
            // completion, with SGEs naming bytes of the buffer that request owns.
            let rc = unsafe { ffi::ibv_post_send(self.raw, first, &mut bad) };
            if rc == 0 {
                (n, None)
            } else {
                let at = (0..n)
                    .find(|&i| {
                        // SAFETY: 0..n were staged above and not committed.
                        let p = unsafe { self.ring.staged(i) };
                        std::ptr::eq(p.raw(), bad)
                    })
                    .unwrap_or(0);
                (at, Some(Error::verb(Verb::PostSend, rc.abs())))
            }
        };
        self.ring.finish_batch((n, posted), failure, refused, ps)
    }

    /// Takes a completion of this queue and hands each finished request back to `done`
    /// (as [`Done::buf`], ready to post again), in posting order: the unsignaled ones the
    /// completion implies, then its own. Returns how many finished. A completion that is
    /// not this queue's is an error.
    #[inline]
    pub fn complete(&mut self, wc: &mut WorkCompletion, mut done: impl FnMut(Done<Prepared<T>>)) -> Result<usize> {
        let qp_num = self.qp_num;
        self.ring.complete_sends(wc, &self.tag, qp_num, |p, status, byte_len, vendor_err| {
            let op = p.inner.wr.wc_opcode();
            done(Done { id: p.id(), buf: p, status, byte_len, op, qp_num, vendor_err })
        })
    }
}

#[cold]
#[inline(never)]
fn too_big_for(sges: u32, inline: u32, max_sge: u32, max_inline: u32) -> Error {
    Error::invalid(
        Verb::PostSend,
        format!(
            "a request prepared for another QP: it needs {sges} SGEs and {inline} bytes inline, this QP takes \
             {max_sge} (max_send_sge) and {max_inline} (max_inline_data)"
        ),
    )
}

impl<T: SendBuf> Drop for PreparedQueue<T> {
    fn drop(&mut self) {
        let keep = (std::mem::replace(&mut self.tag, Tag(0)), self.room.take());
        bury(&self.claim.owner.graveyard, self.ring.take_all(), keep);
    }
}

impl<T: SendBuf> fmt::Debug for PreparedQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedQueue")
            .field("qp_num", &self.qp_num)
            .field("outstanding", &self.ring.outstanding())
            .finish()
    }
}
