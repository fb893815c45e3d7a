//! Scoped sends: sources borrowed for a scope, drained before the scope returns
//! ([`QueuePair::send_scope`], documented there).

use std::cell::{Cell, UnsafeCell};
use std::marker::PhantomData;
use std::ops::Range;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use super::{not_ours, queue_full, send_wr_id, Tag, LOW_MASK};
use crate::buf::Chunk;
use crate::cq::{CompletionQueue, CqReservation};
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::mr::{AccessMode, RemoteMr};
use crate::qp::{QpState, QueuePair};
use crate::wc::WorkCompletion;

/// How long the drain at the end of a scope waits for the device before it moves the QP
/// to the error state (which flushes everything still posted).
const DRAIN_PATIENCE: Duration = Duration::from_secs(30);
/// How long, once flushing, no completion may arrive before the rest counts as discarded
/// (if the QP is in the error or reset state; else the process aborts rather than return
/// while the device may still read the sources).
const FLUSH_QUIET: Duration = Duration::from_secs(5);

/// Sends from borrowed sources, inside [`QueuePair::send_scope`]: chains built once with
/// [`SendScope::chain`], posted with [`SendScope::post`], completions counted by
/// [`SendScope::poll`].
///
/// It is lent to the scope's closure as `&'scope SendScope<'scope, 'env>`, like
/// `std::thread::Scope`: a shared reference (it cannot be swapped with another scope's,
/// and `'scope` is distinct for each scope), with the counters in cells. Not `Sync`: one
/// thread posts and polls.
pub struct SendScope<'scope, 'env: 'scope> {
    raw: *mut ffi::ibv_qp,
    /// The QP, borrowed by `send_scope` for longer than the scope lives.
    qp: *const QueuePair,
    qp_num: u32,
    /// The CQ, lent to `send_scope` as `&mut` for longer than the scope lives.
    cq: *mut CompletionQueue,
    limits: (u32, u32),
    depth: u64,
    head: Cell<u64>,
    tail: Cell<u64>,
    tag: Tag,
    wcs: UnsafeCell<[WorkCompletion; 16]>,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

/// A chain of send work requests whose sources are borrowed for `'env`: built once,
/// posted any number of times in a [`SendScope`], each post one provider call.
pub struct ScopedChain<'env> {
    wrs: Vec<ffi::ibv_send_wr>,
    sges: Vec<ffi::ibv_sge>,
    limits: (u32, u32),
    /// Requests added since the chain was last linked (its `next` and `sg_list` pointers).
    dirty: bool,
    _bufs: PhantomData<&'env Chunk>,
}

// SAFETY: the raw pointers are into the chain's own vectors (re-linked before a post) or
// none; the borrowed chunks are Sync.
unsafe impl Send for ScopedChain<'_> {}

impl<'env> ScopedChain<'env> {
    /// Adds a request for `range` of `buf` (one SGE, none for an empty range).
    fn push<A: AccessMode>(
        &mut self,
        buf: &'env Chunk<A>,
        range: Range<usize>,
        opcode: ffi::ibv_wr_opcode,
        remote: Option<RemoteMr>,
    ) -> Result<&mut Self> {
        let mut sge = [std::mem::MaybeUninit::uninit(); crate::buf::MAX_SGE];
        let n = crate::buf::SendBuf::sges(buf, range.clone(), &mut sge)?;
        let len = range.len();
        if let Some(r) = remote {
            if len as u64 > r.len {
                return Err(Error::invalid(
                    Verb::PostSend,
                    format!("{len} bytes do not fit the remote region of {} bytes", r.len),
                ));
            }
        }
        // SAFETY: ibv_send_wr is plain data; all-zero is a valid value.
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.opcode = opcode;
        wr.num_sge = n as i32;
        wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        if let Some(r) = remote {
            wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: r.addr, rkey: r.rkey };
        }
        // SAFETY: `sges` wrote sge[0] when it returned 1; an empty range gives a zeroed,
        // unused entry (num_sge 0).
        let sge = if n == 1 { unsafe { sge[0].assume_init() } } else { ffi::ibv_sge { addr: 0, length: 0, lkey: 0 } };
        self.wrs.push(wr);
        self.sges.push(sge);
        self.dirty = true;
        Ok(self)
    }

    /// SEND `range` of `buf`.
    pub fn send<A: AccessMode>(&mut self, buf: &'env Chunk<A>, range: Range<usize>) -> Result<&mut Self> {
        self.push(buf, range, ffi::ibv_wr_opcode::IBV_WR_SEND, None)
    }

    /// RDMA WRITE `range` of `buf` to the start of `remote`.
    pub fn write<A: AccessMode>(
        &mut self,
        buf: &'env Chunk<A>,
        range: Range<usize>,
        remote: RemoteMr,
    ) -> Result<&mut Self> {
        self.push(buf, range, ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE, Some(remote))
    }

    /// Only the last request of the chain makes a completion (one per post); the others
    /// are released by it. By default each makes one.
    pub fn signal_last_only(&mut self) -> &mut Self {
        let n = self.wrs.len();
        for (i, wr) in self.wrs.iter_mut().enumerate() {
            let bit = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
            wr.send_flags = if i + 1 == n { wr.send_flags | bit } else { wr.send_flags & !bit };
        }
        self
    }

    /// Requests in the chain.
    pub fn len(&self) -> usize {
        self.wrs.len()
    }

    /// True when the chain has no request.
    pub fn is_empty(&self) -> bool {
        self.wrs.is_empty()
    }

    /// Points each request at its SGE and the next request (after the vectors moved).
    fn link(&mut self) {
        let n = self.wrs.len();
        let wrs = self.wrs.as_mut_ptr();
        for i in 0..n {
            // SAFETY: i and i + 1 < n are in bounds of both vectors (one SGE slot per request).
            unsafe {
                let wr = &mut *wrs.add(i);
                wr.sg_list = self.sges.as_mut_ptr().add(i);
                wr.next = if i + 1 < n { wrs.add(i + 1) } else { std::ptr::null_mut() };
            }
        }
        self.dirty = false;
    }
}

impl QueuePair {
    /// Runs `f` with a [`SendScope`] over this QP's send side and its send CQ `cq`, and
    /// returns once every request `f` posted has completed.
    ///
    /// Inside, chains of SENDs and RDMA WRITEs from chunks borrowed for `'env` (the whole
    /// call) are built once and posted any number of times; a post stamps each request's
    /// `wr_id` and makes the one provider call, and a completion only moves a counter, so
    /// this path costs a few instructions more than the raw API (scripts/instructions).
    ///
    /// # Soundness
    /// The sources are shared borrows for `'env`, which outlives this call: nothing can
    /// write, move or free them until it returns. The scope itself is only lent to `f`,
    /// so it cannot be leaked to skip the end: after `f` returns (or panics), this
    /// function polls `cq` until every posted request has completed. Should the device
    /// stay silent for 30 s, the QP is moved to the error state, which flushes what is
    /// posted; what is still counted 5 s after the last flushed completion was discarded
    /// by a reset (the QP is in the error or reset state then, and the device reads none
    /// of it). Should the QP be in any other state, the process aborts rather than return
    /// while the device may still read the sources.
    ///
    /// The scope takes the send side (no [`SendQueue`](crate::SendQueue) or
    /// [`PreparedQueue`](crate::PreparedQueue) may exist) and the whole CQ: `cq` must be
    /// this QP's send CQ, with no entries reserved by other queues, so that every
    /// completion on it is the scope's (no other queue's completion is swallowed).
    pub fn send_scope<'env, R, F>(&self, cq: &mut CompletionQueue, depth: u32, f: F) -> Result<R>
    where
        F: for<'scope> FnOnce(&'scope SendScope<'scope, 'env>) -> R,
    {
        const VERB: Verb = Verb::Claim;
        if self.qp_type() == crate::qp::QpType::Ud {
            // A chain carries no address handle, which every UD send needs.
            return Err(Error::invalid(VERB, "a send scope is for RC and UC QPs: UD sends need an address handle"));
        }
        if !std::ptr::eq(cq.inner.raw.as_ptr(), self.inner.send_cq.raw.as_ptr()) {
            return Err(Error::invalid(VERB, "the CQ is not this QP's send CQ"));
        }
        let (claim, room, depth) = self.claim_send_side(VERB, depth)?;
        // The rest of the CQ too: no queue may claim entries on it while the scope runs.
        let rest = cq.inner.entries().saturating_sub(u64::from(depth));
        let all = CqReservation::take(&cq.inner, rest, VERB, "the scope (it takes the whole CQ)")?;
        let caps = self.inner.caps;
        let scope = SendScope {
            raw: self.as_raw(),
            qp: self,
            qp_num: self.qp_num(),
            cq,
            limits: (caps.max_send_sge, caps.max_inline_data),
            depth: depth.into(),
            head: Cell::new(0),
            tail: Cell::new(0),
            tag: Tag::reserve()?,
            wcs: UnsafeCell::new([const { WorkCompletion::EMPTY }; 16]),
            _scope: PhantomData,
            _env: PhantomData,
        };
        // Whether `f` returns or unwinds, nothing leaves before the drain.
        let result = catch_unwind(AssertUnwindSafe(|| f(&scope)));
        scope.drain();
        drop((all, room, claim));
        match result {
            Ok(r) => Ok(r),
            Err(panic) => resume_unwind(panic),
        }
    }
}

impl<'scope, 'env> SendScope<'scope, 'env> {
    /// An empty chain for this QP (its limits are those it is checked against).
    pub fn chain(&self) -> ScopedChain<'env> {
        ScopedChain { wrs: Vec::new(), sges: Vec::new(), limits: self.limits, dirty: false, _bufs: PhantomData }
    }

    /// Requests posted and not completed yet.
    pub fn outstanding(&self) -> u64 {
        self.head.get() - self.tail.get()
    }

    /// Posts `chain` with one provider call: each request's `wr_id` is stamped, nothing
    /// else is built. Refused before C when the scope has no room for the whole chain.
    #[inline]
    pub fn post(&self, chain: &mut ScopedChain<'env>) -> Result<()> {
        let k = chain.wrs.len() as u64;
        if k == 0 {
            return Ok(());
        }
        let head = self.head.get();
        if head - self.tail.get() + k > self.depth {
            return Err(queue_full(Verb::PostSend, self.depth));
        }
        if chain.limits != self.limits {
            return Err(Error::invalid(Verb::PostSend, "a chain built for another QP"));
        }
        if chain.dirty {
            chain.link();
        }
        let tag = self.tag.bits();
        for (i, wr) in chain.wrs.iter_mut().enumerate() {
            wr.wr_id = send_wr_id(tag, head + i as u64);
        }
        let first = chain.wrs.as_mut_ptr();
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is alive (the scope holds it); the chain is linked (each `next`
        // and `sg_list` into its own vectors, the last `next` NULL); its SGEs name bytes
        // of chunks borrowed for 'env, which outlives the scope, and the scope does not
        // end before every posted request has completed.
        let rc = unsafe { ffi::ibv_post_send(self.raw, first, &mut bad) };
        if rc != 0 {
            // The ones before `bad` went in.
            let posted = (0..chain.wrs.len()).find(|&i| std::ptr::eq(first.wrapping_add(i), bad)).unwrap_or(0);
            self.head.set(head + posted as u64);
            return Err(Error::verb(Verb::PostSend, rc.abs()));
        }
        self.head.set(head + k);
        Ok(())
    }

    /// Polls the CQ once and counts the requests that finished (a completion also
    /// finishes the unsignaled requests before it). A completion with an error status is
    /// returned as the error, after the others of the same poll are counted.
    #[inline]
    pub fn poll(&self) -> Result<usize> {
        // SAFETY: `cq` is the &mut CompletionQueue lent to send_scope, which outlives the
        // scope, and `wcs` is the scope's own buffer; the scope is not Sync and this
        // function calls no code of the user's, so no other reference to either exists
        // while these live.
        let (cq, wcs) = unsafe { (&mut *self.cq, &mut *self.wcs.get()) };
        let done = cq.poll(wcs)?;
        let (mut finished, mut failed) = (0, None);
        let tag = self.tag.bits();
        for wc in done.iter_mut() {
            let id = wc.wr_id();
            let (head, tail) = (self.head.get(), self.tail.get());
            let ahead = id.wrapping_sub(tail) & LOW_MASK;
            if id & !LOW_MASK != tag || wc.qp_num() != self.qp_num || ahead >= head - tail {
                failed = failed.or(Some(not_ours("send", wc)));
                continue;
            }
            self.tail.set(tail + ahead + 1);
            finished += ahead as usize + 1;
            if !wc.is_success() && failed.is_none() {
                failed = Some(wc.ok().map(drop).unwrap_err());
            }
        }
        match failed {
            None => Ok(finished),
            Some(e) => Err(e),
        }
    }

    /// Polls until every posted request has completed; returns the first error seen.
    pub fn wait_all(&self) -> Result<()> {
        let mut first = None;
        while self.outstanding() > 0 {
            if let Err(e) = self.poll() {
                first = first.or(Some(e));
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The end of the scope: polls until nothing is outstanding (see `send_scope`).
    fn drain(&self) {
        // SAFETY: the QP outlives the scope (borrowed by send_scope).
        let qp = unsafe { &*self.qp };
        let mut progress = Instant::now();
        let mut flushed = false;
        while self.outstanding() > 0 {
            let before = self.tail.get();
            let _ = self.poll();
            if self.tail.get() != before {
                progress = Instant::now();
                continue;
            }
            let quiet = progress.elapsed();
            if !flushed && quiet > DRAIN_PATIENCE {
                log::warn!("send_scope: {} requests still posted after {quiet:?}: flushing them", self.outstanding());
                let _ = qp.to_error();
                flushed = true;
                progress = Instant::now();
            } else if flushed && quiet > FLUSH_QUIET {
                // In the error state a QP flushes everything it holds, promptly: what is
                // still counted was discarded (the QP was reset meanwhile), and the device
                // no longer reads it. Anything else is a device that cannot be trusted.
                if matches!(qp.state(), Ok(QpState::Err | QpState::Reset)) {
                    log::warn!("send_scope: {} requests were discarded by a reset", self.outstanding());
                    return;
                }
                eprintln!("send_scope: the device did not flush {} requests: aborting", self.outstanding());
                std::process::abort();
            }
        }
    }
}
