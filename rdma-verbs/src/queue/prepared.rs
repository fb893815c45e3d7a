//! Prepared requests: [`PreparedSend`], posted through a [`PreparedSendQueue`] (documented there).

use std::fmt;
use std::mem::MaybeUninit;
use std::ops::{DerefMut, Range};

use super::request::{check_send, classic, zeroed_wr, AtomicWrite, End, SendLimits as Limits, SendRequest, Token};
use super::tag::wr_id;
use super::{SendQueue, Sges, NO_SGES};
use crate::buf::SendBuf;
use crate::error::{Error, Refused, Result, Verb};
use crate::ffi;
use crate::mr::RemoteMr;
use crate::wc::WcOpcode;
use crate::wr::{Done, SendWr};

/// A send work request checked and built once, to be posted many times through a
/// [`PreparedSendQueue`] (see there).
pub struct PreparedSend<T: SendBuf> {
    inner: Box<Inner<T>>,
}

struct Inner<T> {
    /// The C request, always initialized; `sg_list` points at `sges` in this block.
    raw: ffi::ibv_send_wr,
    sges: Sges,
    wr: SendWr<T>,
    /// The limits it was checked against (the preparing QP's max_send_sge, max_inline_data).
    limits: Limits,
    /// `limits.key()`, compared at each post.
    key: u64,
    /// What it needs of a QP: SGEs, and bytes inline (0 when not inline).
    needs: (u32, u32),
    /// What its completion says.
    wc_op: WcOpcode,
}

// SAFETY: the raw pointers in the C request point into this block (the SGEs) or at the
// address handle that `wr` keeps alive; the buffer is T: Send. Nothing is shared with
// another thread.
unsafe impl<T: SendBuf> Send for PreparedSend<T> {}

impl<T: SendBuf> PreparedSend<T> {
    /// Checks `wr` against `limits` (max SGEs, max inline bytes) and builds it.
    #[allow(clippy::result_large_err)] // the refused request comes back by value
    pub(super) fn build(verb: Verb, wr: SendWr<T>, limits: Limits) -> Result<Self, Refused<SendWr<T>>> {
        let mut sges = NO_SGES;
        // Posted through ibv_post_send: no RDMA ATOMIC WRITE (which goes the extended way).
        let classic_only = classic_only(limits);
        let n = match check_send(verb, &classic_only, &wr, &mut sges) {
            Ok(n) => n,
            Err(e) => return Err(Refused::new(e, wr)),
        };
        let needs = needs(&wr, n);
        let key = limits.key();
        let wc_op = wr.op.codes().wc;
        let mut inner = Box::new(Inner { raw: zeroed_wr(), sges, wr, limits, key, needs, wc_op });
        let Inner { raw, sges, wr, .. } = &mut *inner;
        classic(wr, 0, sges, n, raw);
        Ok(PreparedSend { inner })
    }

    /// Checks the request again after a change and rebuilds its C form; on refusal
    /// nothing changed (the caller restores what it changed).
    fn rebuild(&mut self, verb: Verb) -> Result<()> {
        let inner = &mut *self.inner;
        let mut sges = NO_SGES;
        let classic_only = classic_only(inner.limits);
        let n = check_send(verb, &classic_only, &inner.wr, &mut sges)?;
        inner.sges = sges;
        inner.needs = needs(&inner.wr, n);
        let Inner { raw, sges, wr, .. } = inner;
        classic(wr, 0, sges, n, raw);
        Ok(())
    }

    pub(super) fn raw(&mut self) -> &mut ffi::ibv_send_wr {
        &mut self.inner.raw
    }

    /// The C request, ready to post as `wr_id`: its SGE pointer taken afresh from this
    /// borrow of the block (so no pointer from an earlier borrow is used), its `next` NULL.
    #[inline(always)]
    pub(super) fn stamp(&mut self, wr_id: u64) -> *mut ffi::ibv_send_wr {
        let inner = &mut *self.inner;
        let raw = &mut inner.raw;
        raw.wr_id = wr_id;
        raw.sg_list = inner.sges.as_mut_ptr().cast();
        raw.next = std::ptr::null_mut();
        raw
    }

    /// A copy of the C request, for a chain's side-by-side list: its SGE pointer taken
    /// afresh from this borrow of the block (which does not move while the chain holds the
    /// request), its `next` NULL.
    pub(super) fn c_form(&mut self) -> ffi::ibv_send_wr {
        let inner = &mut *self.inner;
        let mut raw = inner.raw;
        raw.sg_list = inner.sges.as_mut_ptr().cast();
        raw.next = std::ptr::null_mut();
        raw
    }

    /// The limits key and protection domain it was checked against, and what its
    /// completion says.
    #[inline(always)]
    pub(super) fn checked_for(&self) -> (u64, crate::buf::PdId, WcOpcode) {
        (self.inner.key, self.inner.limits.pd, self.inner.wc_op)
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
        self.inner.wr.set(ffi::ibv_send_flags::IBV_SEND_SIGNALED, yes);
        let flags = self.inner.wr.send_flags();
        self.raw().send_flags = flags;
    }

    /// The range of the buffer it sends (or reads into).
    pub fn range(&self) -> Range<usize> {
        self.inner.wr.range.clone()
    }

    /// Sends (or reads into) another range of the same buffer: checked again as at
    /// [`PreparedSendQueue::prepare`]; on refusal the request is unchanged.
    pub fn set_range(&mut self, range: Range<usize>) -> Result<()> {
        let old = std::mem::replace(&mut self.inner.wr.range, range);
        self.rebuild(Verb::PreparedSetRange).inspect_err(|_| self.inner.wr.range = old)
    }

    /// Targets another remote region (RDMA WRITE, READ, atomics): checked again; on
    /// refusal the request is unchanged. A request without a remote side refuses.
    pub fn set_remote(&mut self, remote: RemoteMr) -> Result<()> {
        let Some(old) = self.inner.wr.retarget(remote) else {
            return Err(Error::invalid(Verb::PreparedSetRemote, "this request has no remote side (a SEND)"));
        };
        self.rebuild(Verb::PreparedSetRemote).inspect_err(|_| {
            self.inner.wr.retarget(old);
        })
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

impl<T: SendBuf> fmt::Debug for PreparedSend<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedSend").field("wr", &self.inner.wr).field("sges", &self.inner.needs.0).finish()
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
/// [`PreparedSendQueue`] takes [`PreparedSend`] requests instead: [`PreparedSendQueue::prepare`]
/// checks a request against the QP's limits and builds its `ibv_send_wr` and SGEs in a
/// heap block that belongs to the request; posting stamps the `wr_id`, links the chain
/// and calls the provider, which is what a C program reposting a prebuilt chain does.
///
/// Soundness is the send queue's (see [`SendQueue`]): a prepared request
/// owns its buffer, is posted by value, stays in the queue's ring until its completion
/// hands it back, and exposes no `&mut` to the buffer value itself, so it cannot be
/// swapped for another while its SGEs name the first. Its bytes can be changed between
/// posts through [`PreparedSend::bytes_mut`] (exclusive, local chunks only), and its range,
/// remote target and flags through setters that check again what they change. Its C
/// request points into its own heap block, which does not move when the request does.
///
/// Posting always goes through the classic `ibv_post_send`, even on a QP built with
/// extended send ops: a prebuilt C request is what makes this path cheap, and the
/// `ibv_wr_*` calls build the request anew each time.
///
/// It is a [`SendQueue`] (one machine, whatever it posts): it claims the send side (a QP
/// has one send queue at a time) with the same CQ share, posts and completes the same way.
pub type PreparedSendQueue<T> = SendQueue<T, PreparedSend<T>>;

impl<T: SendBuf> SendQueue<T, PreparedSend<T>> {
    /// Checks `wr` against this QP's limits and builds its C request (one allocation,
    /// here and not at post time). On refusal the work request comes back.
    #[allow(clippy::result_large_err)] // the refused request comes back by value
    pub fn prepare(&self, wr: SendWr<T>) -> Result<PreparedSend<T>, Refused<SendWr<T>>> {
        PreparedSend::build(Verb::SendQueuePrepare, wr, *self.limits())
    }
}

impl<T: SendBuf> super::request::sealed::Sealed for PreparedSend<T> {}

impl<T: SendBuf> SendRequest for PreparedSend<T> {
    type Back = PreparedSend<T>;
    // Stamped in its slot: cheaper than before the move (scripts/instructions).
    const BUILD_IN_SLOT: bool = true;

    /// Never: its prebuilt C request goes through `ibv_post_send` on every QP.
    const EXTENDED: bool = false;

    /// Whether this QP takes it: certainly when it was checked against the same limits
    /// (prepared here, or for a QP alike), else when what it needs fits.
    #[inline(always)]
    fn check(&self, verb: Verb, limits: &Limits, key: u64, _sges: &mut Sges, _: Token) -> Result<usize> {
        let inner = &*self.inner;
        if inner.key == key && inner.limits.pd == limits.pd {
            return Ok(inner.needs.0 as usize);
        }
        takes(verb, inner, limits)
    }

    #[inline(always)]
    fn c_request(
        &mut self,
        tag: u64,
        seq: u64,
        _sges: &mut Sges,
        _n: usize,
        _out: &mut ffi::ibv_send_wr,
        _: Token,
    ) -> (*mut ffi::ibv_send_wr, *mut ffi::ibv_send_wr) {
        let wr = self.stamp(wr_id(tag, seq));
        (wr, wr)
    }

    #[inline(always)]
    unsafe fn finish(slot: &mut MaybeUninit<Self>, end: End, _: Token) -> Done<PreparedSend<T>> {
        // SAFETY: the caller's contract: `slot` holds a request, read out here once (a
        // prepared request is one pointer).
        let p = unsafe { slot.assume_init_read() };
        let (id, op) = (p.inner.wr.id, p.inner.wc_op);
        end.done(id, op, p)
    }
}

/// `limits` as a prepared request meets them: posted through `ibv_post_send`, which has no
/// RDMA ATOMIC WRITE (a device without one still says so first).
fn classic_only(limits: Limits) -> Limits {
    let atomic_write = match limits.atomic_write {
        AtomicWrite::Takes | AtomicWrite::NoSendOp => AtomicWrite::Prepared,
        other => other,
    };
    Limits { atomic_write, ..limits }
}

/// Whether a QP with `limits` takes a request prepared for another QP.
#[cold]
fn takes<T: SendBuf>(verb: Verb, p: &Inner<T>, limits: &Limits) -> Result<usize> {
    let (sges, inline) = p.needs;
    let Limits { send_sge, read_sge, max_inline, ud, pd, lacks_imm, lacks_atomics, .. } = *limits;
    let op = p.wr.op;
    if op.is_atomic() && lacks_atomics {
        return Err(Error::not_supported(verb, crate::caps::NO_ATOMICS));
    }
    if op.has_imm() && lacks_imm {
        return Err(Error::not_supported(verb, crate::caps::NO_IMM));
    }
    let max_sge = u32::from(if op == crate::wr::Op::Read { send_sge.min(read_sge) } else { send_sge });
    if p.limits.ud != ud {
        return Err(Error::invalid(verb, "a request prepared for a QP of another transport (UD or not)"));
    }
    if sges > max_sge || inline > max_inline {
        return Err(too_big_for(verb, sges, inline, max_sge, max_inline));
    }
    if p.limits.pd != pd {
        return Err(Error::invalid(
            verb,
            "a request prepared for a QP of another protection domain: its buffer is not registered in this one",
        ));
    }
    Ok(sges as usize)
}

#[cold]
#[inline(never)]
fn too_big_for(verb: Verb, sges: u32, inline: u32, max_sge: u32, max_inline: u32) -> Error {
    Error::invalid(
        verb,
        format!(
            "a request prepared for another QP: it needs {sges} SGEs and {inline} bytes inline, this QP takes \
             {max_sge} (max_send_sge) and {max_inline} (max_inline_data)"
        ),
    )
}
