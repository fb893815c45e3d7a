//! The safe data path: send and receive queues that own what they have posted.
//!
//! # Soundness
//!
//! The device reads and writes posted buffers behind the compiler's back. The safe API
//! makes sure no Rust reference can observe or disturb that, without a lock or an
//! allocation on the fast path:
//!
//! - A buffer is posted by value: a [`Chunk`] (exclusive) or an `Arc<Chunk>` (shared,
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
//! - Completions are matched to slots by the `wr_id`, which this module chooses (a
//!   sequence number with the side in the top bit): a completion from another QP, or a
//!   forged one, is refused, never trusted. Send completions arrive in posting order,
//!   so a signaled completion also releases the unsignaled requests before it.
//! - Dropping a queue that still has requests outstanding must not free their buffers
//!   while the device may use them: they move to the QP, which frees them right after
//!   `ibv_destroy_qp`, when the device can no longer touch them.
//!
//! Polling is [`CompletionQueue::poll`](crate::CompletionQueue::poll) (`&mut self`: one
//! poller). Waiting through a completion channel is on the CQ as well.

use std::fmt;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::ah::AddressHandle;
use crate::buf::Chunk;
use crate::error::{Error, Plane, Result};
use crate::ffi;
use crate::mr::{AccessMode, RemoteMr};
use crate::qp::{QpInner, QueuePair};
use crate::wc::{WcStatus, WorkCompletion};

const RECV_TAG: u64 = 1 << 63;
const SEQ_MASK: u64 = RECV_TAG - 1;
/// Most work requests one provider call posts for [`SendQueue::post_batch`].
pub const MAX_BATCH: usize = 64;

/// A buffer the device may read: the source of a SEND or an RDMA WRITE.
pub trait SendBuf: Send + 'static {
    /// The SGE for `range` of the buffer.
    fn sge(&self, range: Range<usize>) -> Result<ffi::ibv_sge>;
}

/// A buffer only the posting queue can reach while posted: the device may write it.
pub trait ExclusiveBuf: SendBuf {}

impl<A: AccessMode> SendBuf for Chunk<A> {
    #[inline]
    fn sge(&self, range: Range<usize>) -> Result<ffi::ibv_sge> {
        Chunk::sge(self, range)
    }
}
impl<A: AccessMode> ExclusiveBuf for Chunk<A> {}

impl<A: AccessMode> SendBuf for Arc<Chunk<A>> {
    #[inline]
    fn sge(&self, range: Range<usize>) -> Result<ffi::ibv_sge> {
        Chunk::sge(self, range)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Send,
    Write,
    Read,
    CompSwap { compare: u64, swap: u64 },
    FetchAdd { add: u64 },
}

/// A send-side work request: what to do, with which buffer.
pub struct SendWr<T> {
    op: Op,
    buf: T,
    range: Range<usize>,
    remote: Option<RemoteMr>,
    imm: Option<u32>,
    flags: ffi::ibv_send_flags,
    ud: Option<(AddressHandle, u32, u32)>,
    id: u64,
}

impl<T: SendBuf> SendWr<T> {
    fn new(op: Op, buf: T, range: Range<usize>, remote: Option<RemoteMr>) -> Self {
        SendWr { op, buf, range, remote, imm: None, flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED, ud: None, id: 0 }
    }

    /// SEND `range` of `buf` to the peer's next receive.
    pub fn send(buf: T, range: Range<usize>) -> Self {
        Self::new(Op::Send, buf, range, None)
    }

    /// RDMA WRITE `range` of `buf` to the start of `remote`.
    pub fn write(buf: T, range: Range<usize>, remote: RemoteMr) -> Self {
        Self::new(Op::Write, buf, range, Some(remote))
    }

    /// A UD SEND to `remote_qpn` through `ah`, with the receiver's Q_Key.
    pub fn send_ud(buf: T, range: Range<usize>, ah: &AddressHandle, remote_qpn: u32, qkey: u32) -> Self {
        let mut wr = Self::new(Op::Send, buf, range, None);
        wr.ud = Some((ah.clone(), remote_qpn, qkey));
        wr
    }

    /// Adds immediate data (SEND with immediate, RDMA WRITE with immediate).
    pub fn imm(mut self, imm: u32) -> Self {
        self.imm = Some(imm);
        self
    }

    /// Whether this request makes a completion (default: yes). Unsignaled requests are
    /// released by the next signaled completion after them.
    pub fn signaled(mut self, yes: bool) -> Self {
        self.set(ffi::ibv_send_flags::IBV_SEND_SIGNALED, yes);
        self
    }

    /// Waits for earlier RDMA READs and atomics to finish before this one starts.
    pub fn fence(mut self) -> Self {
        self.set(ffi::ibv_send_flags::IBV_SEND_FENCE, true);
        self
    }

    /// Asks the receiver's CQ to raise a solicited event.
    pub fn solicited(mut self) -> Self {
        self.set(ffi::ibv_send_flags::IBV_SEND_SOLICITED, true);
        self
    }

    /// Copies the data into the work request at post time (checked against the QP's
    /// max inline data before posting).
    pub fn inline(mut self) -> Self {
        self.set(ffi::ibv_send_flags::IBV_SEND_INLINE, true);
        self
    }

    /// The caller's identifier, handed back with the completion.
    pub fn id(mut self, id: u64) -> Self {
        self.id = id;
        self
    }

    fn set(&mut self, flag: ffi::ibv_send_flags, on: bool) {
        self.flags = if on { ffi::ibv_send_flags(self.flags.0 | flag.0) } else { ffi::ibv_send_flags(self.flags.0 & !flag.0) };
    }
}

impl<T: ExclusiveBuf> SendWr<T> {
    /// RDMA READ the start of `remote` into `range` of `buf`.
    pub fn read(buf: T, range: Range<usize>, remote: RemoteMr) -> Self {
        Self::new(Op::Read, buf, range, Some(remote))
    }

    /// Atomic compare-and-swap on the 8 bytes at `remote.addr`; the old value lands in
    /// the first 8 bytes of `buf` at `offset`.
    pub fn compare_swap(buf: T, offset: usize, remote: RemoteMr, compare: u64, swap: u64) -> Self {
        Self::new(Op::CompSwap { compare, swap }, buf, offset..offset + 8, Some(remote))
    }

    /// Atomic fetch-and-add on the 8 bytes at `remote.addr`; the old value lands in `buf`
    /// at `offset`.
    pub fn fetch_add(buf: T, offset: usize, remote: RemoteMr, add: u64) -> Self {
        Self::new(Op::FetchAdd { add }, buf, offset..offset + 8, Some(remote))
    }
}

/// A finished work request, with the buffer it lent.
#[derive(Debug)]
pub struct Done<T> {
    /// The caller's identifier ([`SendWr::id`], [`RecvQueue::post`]).
    pub id: u64,
    /// The buffer, back with its owner.
    pub buf: T,
    /// How it ended. Unsignaled requests released by a later success report success.
    pub status: WcStatus,
    /// Bytes received (receives), or as the completion says.
    pub byte_len: u32,
}

struct Slot<T> {
    buf: MaybeUninit<T>,
    id: u64,
    // Keeps a UD request's address handle alive until completion.
    ah: Option<AddressHandle>,
}

/// A ring of slots indexed by sequence number.
struct Ring<T> {
    slots: Box<[Slot<T>]>,
    head: u64,
    tail: u64,
}

impl<T> Ring<T> {
    fn new(n: u32) -> Self {
        let n = n.max(1) as usize;
        Ring { slots: (0..n).map(|_| Slot { buf: MaybeUninit::uninit(), id: 0, ah: None }).collect(), head: 0, tail: 0 }
    }

    #[inline]
    fn free(&self) -> usize {
        self.slots.len() - (self.head - self.tail) as usize
    }

    #[inline]
    fn push(&mut self, buf: T, id: u64, ah: Option<AddressHandle>) {
        let i = (self.head % self.slots.len() as u64) as usize;
        self.slots[i] = Slot { buf: MaybeUninit::new(buf), id, ah };
        self.head += 1;
    }

    /// Takes the oldest slot. The caller checked that one is outstanding.
    #[inline]
    fn pop(&mut self) -> (T, u64) {
        let i = (self.tail % self.slots.len() as u64) as usize;
        self.tail += 1;
        let slot = &mut self.slots[i];
        slot.ah = None;
        // SAFETY: slots between tail and head hold an initialized buffer, and this one is
        // moved out exactly once (tail moved past it).
        (unsafe { slot.buf.assume_init_read() }, slot.id)
    }

    #[inline]
    fn outstanding(&self) -> u64 {
        self.head - self.tail
    }

}

fn seq_of(wc: &WorkCompletion, recv: bool) -> Option<u64> {
    let id = wc.wr_id();
    ((id & RECV_TAG != 0) == recv).then_some(id & SEQ_MASK)
}

/// Releases what a dropped queue still has posted without freeing it under the device:
/// the buffers go to the QP's graveyard, freed right after the QP is destroyed.
fn release<T: Send + 'static>(qp: &mut Option<Arc<QpInner>>, ring: &mut Ring<T>, unclaim: impl Fn(&QpInner)) {
    let Some(inner) = qp.take() else { return };
    unclaim(&inner);
    if ring.outstanding() > 0 {
        let mut bufs = Vec::with_capacity(ring.outstanding() as usize);
        while ring.outstanding() > 0 {
            bufs.push(ring.pop());
        }
        match inner.graveyard.lock() {
            Ok(mut g) => g.push(Box::new(bufs)),
            // A panic while holding the lock: keep the buffers forever rather than free them early.
            Err(_) => std::mem::forget(bufs),
        }
    }
}

/// The send side of a QP, owning what it has posted. See the [module docs](self).
pub struct SendQueue<T: Send + 'static> {
    qp: Option<Arc<QpInner>>,
    raw: *mut ffi::ibv_qp,
    qp_num: u32,
    max_inline: u32,
    ring: Ring<T>,
}

// SAFETY: the queue owns its buffers (T: Send) and posts through the thread-safe
// ibv_post_send; the raw pointer is the QP that `qp` keeps alive.
unsafe impl<T: Send + 'static> Send for SendQueue<T> {}

impl QueuePair {
    /// Takes the send side. Fails if a [`SendQueue`] of this QP already exists.
    pub fn send_queue<T: SendBuf>(&self) -> Result<SendQueue<T>> {
        if self.inner.send_claimed.swap(true, Ordering::AcqRel) {
            return Err(Error::invalid("send_queue", "this QP's send side already has an owner"));
        }
        let caps = self.inner.caps;
        Ok(SendQueue {
            qp: Some(Arc::clone(&self.inner)),
            raw: self.as_raw(),
            qp_num: self.qp_num(),
            max_inline: caps.max_inline_data,
            ring: Ring::new(caps.max_send_wr),
        })
    }

    /// Takes the receive side. Fails if a [`RecvQueue`] of this QP already exists, or if
    /// the QP takes its receives from an SRQ.
    pub fn recv_queue<T: ExclusiveBuf>(&self) -> Result<RecvQueue<T>> {
        if self.has_srq() {
            return Err(Error::invalid("recv_queue", "this QP receives through its SRQ"));
        }
        if self.inner.recv_claimed.swap(true, Ordering::AcqRel) {
            return Err(Error::invalid("recv_queue", "this QP's receive side already has an owner"));
        }
        let caps = self.inner.caps;
        Ok(RecvQueue {
            qp: Some(Arc::clone(&self.inner)),
            raw: self.as_raw(),
            qp_num: self.qp_num(),
            ring: Ring::new(caps.max_recv_wr),
        })
    }
}

impl<T: SendBuf> SendQueue<T> {
    /// Requests posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.ring.outstanding() as usize
    }

    /// Builds one C work request from `wr`, its SGE into `sge` (the caller points
    /// `sg_list` at it). No allocation, no call.
    #[inline]
    fn fill(&self, wr: &SendWr<T>, seq: u64, sge: &mut ffi::ibv_sge) -> Result<ffi::ibv_send_wr> {
        *sge = wr.buf.sge(wr.range.clone())?;
        if wr.flags.0 & ffi::ibv_send_flags::IBV_SEND_INLINE.0 != 0 && sge.length > self.max_inline {
            return Err(Error::invalid(
                "ibv_post_send",
                format!("{} bytes inline, but the QP allows {} (max_inline_data)", sge.length, self.max_inline),
            ));
        }
        // SAFETY: ibv_send_wr is plain data; all-zero is a valid value.
        let mut out: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        out.wr_id = seq;
        out.num_sge = i32::from(sge.length > 0 || wr.op != Op::Send);
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
        if let Some(remote) = wr.remote {
            if u64::from(sge.length) > remote.len {
                return Err(Error::invalid(
                    "ibv_post_send",
                    format!("{} bytes do not fit the remote region of {} bytes", sge.length, remote.len),
                ));
            }
            match wr.op {
                Op::CompSwap { compare, swap } => {
                    check_atomic(&remote)?;
                    out.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                        remote_addr: remote.addr,
                        compare_add: compare,
                        swap,
                        rkey: remote.rkey,
                    };
                }
                Op::FetchAdd { add } => {
                    check_atomic(&remote)?;
                    out.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                        remote_addr: remote.addr,
                        compare_add: add,
                        swap: 0,
                        rkey: remote.rkey,
                    };
                }
                _ => out.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: remote.addr, rkey: remote.rkey },
            }
        }
        if let Some((ah, qpn, qkey)) = &wr.ud {
            out.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 { ah: ah.as_raw(), remote_qpn: *qpn, remote_qkey: *qkey };
        }
        Ok(out)
    }

    /// Posts one work request: one provider call, no allocation. On refusal the work
    /// request (with its buffer) comes back in the error.
    #[inline]
    #[allow(clippy::result_large_err)] // the refused request comes back by value: no allocation
    pub fn post(&mut self, wr: SendWr<T>) -> Result<(), (Error, SendWr<T>)> {
        if self.ring.free() == 0 {
            return Err((queue_full("ibv_post_send", self.ring.slots.len()), wr));
        }
        let mut sge = ffi::ibv_sge { addr: 0, length: 0, lkey: 0 };
        let mut raw = match self.fill(&wr, self.ring.head, &mut sge) {
            Ok(raw) => raw,
            Err(e) => return Err((e, wr)),
        };
        raw.sg_list = &mut sge;
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is alive (self.qp); the SGE names bytes of `wr.buf`, which the
        // ring keeps until the completion; a UD address handle is kept with it.
        let rc = unsafe { ffi::ibv_post_send(self.raw, &mut raw, &mut bad) };
        if rc != 0 {
            return Err((Error::verb("ibv_post_send", Plane::Data, rc.abs()), wr));
        }
        let ah = wr.ud.map(|(ah, _, _)| ah);
        self.ring.push(wr.buf, wr.id, ah);
        Ok(())
    }

    /// Posts up to [`MAX_BATCH`] work requests with one provider call (one doorbell),
    /// built on the stack. Returns how many were posted; on refusal, the error and the
    /// work requests that were not posted.
    pub fn post_batch<I>(&mut self, wrs: I) -> Result<usize, (Error, Vec<SendWr<T>>)>
    where
        I: IntoIterator<Item = SendWr<T>>,
    {
        let mut pending: [MaybeUninit<SendWr<T>>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
        let mut sges = [ffi::ibv_sge { addr: 0, length: 0, lkey: 0 }; MAX_BATCH];
        let mut raws: [MaybeUninit<ffi::ibv_send_wr>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
        let mut n = 0;
        let mut rest = Vec::new();
        let mut failure = None;
        for wr in wrs {
            if failure.is_some() || n == MAX_BATCH.min(self.ring.free()) {
                if failure.is_none() {
                    failure = Some(if n == MAX_BATCH {
                        Error::invalid("ibv_post_send", format!("a batch holds at most {MAX_BATCH} work requests"))
                    } else {
                        queue_full("ibv_post_send", self.ring.slots.len())
                    });
                }
                rest.push(wr);
                continue;
            }
            match self.fill(&wr, self.ring.head + n as u64, &mut sges[n]) {
                Ok(raw) => raws[n].write(raw),
                Err(e) => {
                    failure = Some(e);
                    rest.push(wr);
                    continue;
                }
            };
            pending[n].write(wr);
            n += 1;
        }
        if n > 0 {
            for i in 0..n {
                // SAFETY: raws[..n] and sges[..n] were filled above and do not move until
                // the call returns; chain each to the next.
                unsafe {
                    let next = if i + 1 < n { raws[i + 1].as_mut_ptr() } else { std::ptr::null_mut() };
                    let r = raws[i].assume_init_mut();
                    r.sg_list = &mut sges[i];
                    r.next = next;
                }
            }
            let mut bad = std::ptr::null_mut();
            // SAFETY: a valid chain of n work requests whose buffers the ring keeps.
            let rc = unsafe { ffi::ibv_post_send(self.raw, raws[0].as_mut_ptr(), &mut bad) };
            let posted = if rc == 0 {
                n
            } else {
                failure = Some(Error::verb("ibv_post_send", Plane::Data, rc.abs()));
                // Everything from `bad` on was not posted.
                (0..n).find(|&i| raws[i].as_mut_ptr() == bad).unwrap_or(0)
            };
            for (i, slot) in pending.iter_mut().enumerate().take(n) {
                // SAFETY: pending[..n] were written above and are read out once each.
                let wr = unsafe { slot.assume_init_read() };
                if i < posted {
                    let ah = wr.ud.map(|(ah, _, _)| ah);
                    self.ring.push(wr.buf, wr.id, ah);
                } else {
                    rest.insert(i - posted, wr);
                }
            }
            if failure.is_none() {
                return Ok(posted);
            }
        }
        match failure {
            Some(e) => Err((e, rest)),
            None => Ok(0),
        }
    }

    /// Takes a completion of this send queue and hands each finished request to `done`,
    /// in posting order: the unsignaled ones the completion implies, then its own.
    /// Returns how many finished. A completion that is not this queue's is an error.
    #[inline]
    pub fn complete(&mut self, wc: &WorkCompletion, mut done: impl FnMut(Done<T>)) -> Result<usize> {
        let seq = seq_of(wc, false).filter(|_| wc.qp_num() == self.qp_num);
        let Some(seq) = seq.filter(|&s| s >= self.ring.tail && s < self.ring.head) else {
            return Err(not_ours("send", wc));
        };
        let n = (seq - self.ring.tail + 1) as usize;
        for i in 0..n {
            let (buf, id) = self.ring.pop();
            let last = i + 1 == n;
            let status = if last { wc.status() } else { WcStatus::Success };
            done(Done { id, buf, status, byte_len: if last { wc.byte_len() } else { 0 } });
        }
        Ok(n)
    }
}

impl<T: Send + 'static> Drop for SendQueue<T> {
    fn drop(&mut self) {
        release(&mut self.qp, &mut self.ring, |qp| qp.send_claimed.store(false, Ordering::Release));
    }
}

impl<T: Send + 'static> fmt::Debug for SendQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendQueue").field("qp_num", &self.qp_num).field("outstanding", &self.ring.outstanding()).finish()
    }
}

/// The receive side of a QP, owning the buffers it has posted. See the [module docs](self).
pub struct RecvQueue<T: Send + 'static> {
    qp: Option<Arc<QpInner>>,
    raw: *mut ffi::ibv_qp,
    qp_num: u32,
    ring: Ring<T>,
}

// SAFETY: as for SendQueue, with the thread-safe ibv_post_recv.
unsafe impl<T: Send + 'static> Send for RecvQueue<T> {}

impl<T: ExclusiveBuf> RecvQueue<T> {
    /// Receives posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.ring.outstanding() as usize
    }

    /// Posts a receive into `range` of `buf` (one provider call, no allocation, no
    /// syscall). On refusal the buffer comes back in the error.
    #[inline]
    pub fn post(&mut self, buf: T, range: Range<usize>, id: u64) -> Result<(), (Error, T)> {
        if self.ring.free() == 0 {
            return Err((queue_full("ibv_post_recv", self.ring.slots.len()), buf));
        }
        let mut sge = match buf.sge(range) {
            Ok(s) => s,
            Err(e) => return Err((e, buf)),
        };
        let mut wr = ffi::ibv_recv_wr {
            wr_id: RECV_TAG | self.ring.head,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: i32::from(sge.length > 0),
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is alive (self.qp); the SGE names bytes of `buf`, which the ring
        // owns until the completion, and nobody else can reach (ExclusiveBuf).
        let rc = unsafe { ffi::ibv_post_recv(self.raw, &mut wr, &mut bad) };
        if rc != 0 {
            return Err((Error::verb("ibv_post_recv", Plane::Data, rc.abs()), buf));
        }
        self.ring.push(buf, id, None);
        Ok(())
    }

    /// Takes a completion of this receive queue and returns the finished receive with
    /// its buffer. Receives complete in posting order; anything else is refused.
    #[inline]
    pub fn complete(&mut self, wc: &WorkCompletion) -> Result<Done<T>> {
        let ours = seq_of(wc, true).filter(|&s| wc.qp_num() == self.qp_num && s == self.ring.tail);
        if ours.is_none() || self.ring.outstanding() == 0 {
            return Err(not_ours("receive", wc));
        }
        let (buf, id) = self.ring.pop();
        Ok(Done { id, buf, status: wc.status(), byte_len: wc.byte_len() })
    }
}

impl<T: Send + 'static> Drop for RecvQueue<T> {
    fn drop(&mut self) {
        release(&mut self.qp, &mut self.ring, |qp| qp.recv_claimed.store(false, Ordering::Release));
    }
}

impl<T: Send + 'static> fmt::Debug for RecvQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvQueue").field("qp_num", &self.qp_num).field("outstanding", &self.ring.outstanding()).finish()
    }
}

fn check_atomic(remote: &RemoteMr) -> Result<()> {
    if remote.addr % 8 != 0 || remote.len < 8 {
        return Err(Error::invalid("ibv_post_send", "an atomic needs an 8-byte aligned remote address with 8 bytes"));
    }
    Ok(())
}

fn queue_full(verb: &'static str, depth: usize) -> Error {
    Error::invalid(verb, format!("the queue is full ({depth} outstanding): poll completions first"))
}

fn not_ours(side: &str, wc: &WorkCompletion) -> Error {
    Error::invalid(
        "ibv_poll_cq",
        format!("completion wr_id {:#x} of QP {:#x} is not outstanding on this {side} queue", wc.wr_id(), wc.qp_num()),
    )
}
