//! Work requests: the typed [`SendWr`] of the safe data path, and the raw data path,
//! posting C work requests with no checks of ours ([`QueuePair::post_send_raw`], whose
//! docs say what it costs; public, where rustdoc shows them).

use std::ops::Range;

use crate::ah::AddressHandle;
use crate::buf::{ExclusiveBuf, SendBuf};
use crate::conv;
use crate::error::{Error, Refused, Result, Verb};
use crate::ffi;
use crate::mr::RemoteMr;
use crate::qp::{QueuePair, SendOps};
use crate::srq::SharedReceiveQueue;
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};

/// A post that the provider refused: the error, and which work request of the chain it
/// stopped at (the ones before it were posted; it and the ones after it were not).
pub struct PostError<W> {
    /// What the provider said.
    pub error: Error,
    /// The first work request that was not posted.
    pub bad_wr: *mut W,
}

impl<W> std::fmt::Debug for PostError<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostError").field("error", &self.error).field("bad_wr", &self.bad_wr).finish()
    }
}

impl<W> std::fmt::Display for PostError<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl<W> std::error::Error for PostError<W> {}

impl<W> From<PostError<W>> for Error {
    fn from(e: PostError<W>) -> Error {
        e.error
    }
}

fn check<W>(verb: Verb, rc: i32, bad: *mut W) -> Result<(), PostError<W>> {
    conv::errno(verb, rc).map_err(|error| PostError { error, bad_wr: bad })
}

impl QueuePair {
    /// Posts a chain of send work requests (`ibv_post_send`), with no checks of ours: the
    /// raw data path, for experts who manage buffer lifetimes themselves.
    ///
    /// It is one call to the provider's function pointer (the ported `static inline` of
    /// `verbs.h`), so it costs exactly what the C call costs. A chain of work requests
    /// linked through `next` is one provider call: on rxe one doorbell `write()`, on mlx5
    /// one MMIO doorbell.
    ///
    /// # Safety
    /// - `wr` must point to a valid chain of `ibv_send_wr` (linked by `next`, NULL at the
    ///   end) whose SGEs, with their `lkey`s, lie inside memory regions of this QP's
    ///   protection domain (or are inline data with `IBV_SEND_INLINE`).
    /// - Every byte an SGE names must stay allocated and registered until the work
    ///   request completes or the QP is destroyed, and bytes the device writes (RDMA
    ///   READ and atomic targets) must not be referenced by Rust code until then.
    /// - For UD, `wr.ud.ah` must be an address handle that lives until completion.
    #[doc(alias = "ibv_post_send")]
    #[inline]
    pub unsafe fn post_send_raw(&self, wr: *mut ffi::ibv_send_wr) -> Result<(), PostError<ffi::ibv_send_wr>> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is live (self); the caller vouches for the chain.
        let rc = unsafe { ffi::ibv_post_send(self.as_raw(), wr, &mut bad) };
        check(Verb::PostSend, rc, bad)
    }

    /// Posts a chain of receive work requests (`ibv_post_recv`).
    ///
    /// # Safety
    /// `wr` must point to a valid chain of `ibv_recv_wr` whose SGEs lie inside memory
    /// regions of this QP's protection domain; those bytes must stay allocated and
    /// registered, and unreferenced by Rust code, until the receive completes or the QP
    /// is destroyed.
    #[doc(alias = "ibv_post_recv")]
    #[inline]
    pub unsafe fn post_recv_raw(&self, wr: *mut ffi::ibv_recv_wr) -> Result<(), PostError<ffi::ibv_recv_wr>> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is live (self); the caller vouches for the chain.
        let rc = unsafe { ffi::ibv_post_recv(self.as_raw(), wr, &mut bad) };
        check(Verb::PostRecv, rc, bad)
    }
}

impl SharedReceiveQueue {
    /// Posts a chain of receive work requests to the SRQ (`ibv_post_srq_recv`).
    ///
    /// # Safety
    /// As for [`QueuePair::post_recv_raw`], with the SRQ's protection domain.
    #[doc(alias = "ibv_post_srq_recv")]
    #[inline]
    pub unsafe fn post_recv_raw(&self, wr: *mut ffi::ibv_recv_wr) -> Result<(), PostError<ffi::ibv_recv_wr>> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: the SRQ is live (self); the caller vouches for the chain.
        let rc = unsafe { ffi::ibv_post_srq_recv(self.as_raw(), wr, &mut bad) };
        check(Verb::PostSrqRecv, rc, bad)
    }
}

/// What a send request does: the crate's one opcode table is [`Op::codes`]. Each
/// discriminant is the operation's C opcode (`ibv_wr_opcode`), whose bit is also its
/// extended send op (`IBV_QP_EX_WITH_*`): both come out of the value with no table
/// (checked at compile time below), except RDMA ATOMIC WRITE's (opcode 15, send op bit 12).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Op {
    Write = 0,
    WriteImm = 1,
    Send = 2,
    SendImm = 3,
    Read = 4,
    CompSwap = 5,
    FetchAdd = 6,
    /// A local invalidate of a memory window: built by `mw::MwRequest`, never a
    /// `SendWr`'s operation.
    LocalInv = 7,
    /// A memory window bind: as `LocalInv`, built by `mw::MwRequest` only.
    BindMw = 8,
    /// A SEND that invalidates the receiver's memory window (its rkey in `imm`, see
    /// [`SendWr::send_inv`]).
    SendInv = 9,
    /// RDMA ATOMIC WRITE (IBTA 1.5): 8 bytes written at once, posted through the extended
    /// API only ([`SendWr::atomic_write`]).
    AtomicWrite = 15,
}

/// The send op bit of RDMA ATOMIC WRITE, the one operation whose bit is not its opcode.
const ATOMIC_WRITE_BIT: u32 = 12;

// Each operation's discriminant is its C opcode, and its bit its extended send op.
const _: () = {
    use ffi::ibv_qp_create_send_ops_flags as F;
    use ffi::ibv_wr_opcode as O;
    let table = [
        (Op::Write, O::IBV_WR_RDMA_WRITE, F::IBV_QP_EX_WITH_RDMA_WRITE),
        (Op::WriteImm, O::IBV_WR_RDMA_WRITE_WITH_IMM, F::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM),
        (Op::Send, O::IBV_WR_SEND, F::IBV_QP_EX_WITH_SEND),
        (Op::SendImm, O::IBV_WR_SEND_WITH_IMM, F::IBV_QP_EX_WITH_SEND_WITH_IMM),
        (Op::Read, O::IBV_WR_RDMA_READ, F::IBV_QP_EX_WITH_RDMA_READ),
        (Op::CompSwap, O::IBV_WR_ATOMIC_CMP_AND_SWP, F::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP),
        (Op::FetchAdd, O::IBV_WR_ATOMIC_FETCH_AND_ADD, F::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD),
        (Op::LocalInv, O::IBV_WR_LOCAL_INV, F::IBV_QP_EX_WITH_LOCAL_INV),
        (Op::BindMw, O::IBV_WR_BIND_MW, F::IBV_QP_EX_WITH_BIND_MW),
        (Op::SendInv, O::IBV_WR_SEND_WITH_INV, F::IBV_QP_EX_WITH_SEND_WITH_INV),
    ];
    assert!(
        Op::AtomicWrite as u32 == O::IBV_WR_ATOMIC_WRITE.0 && 1 << ATOMIC_WRITE_BIT == F::IBV_QP_EX_WITH_ATOMIC_WRITE.0
    );
    let mut i = 0;
    while i < table.len() {
        let (op, wr, ops) = table[i];
        assert!(op as u32 == wr.0 && 1 << (op as u32) == ops.0);
        i += 1;
    }
};

/// One operation as each API names it.
pub(crate) struct OpCodes {
    /// The classic `ibv_post_send` opcode.
    pub(crate) wr: ffi::ibv_wr_opcode,
    /// The extended API's send op (what the QP must be built with).
    pub(crate) ops: SendOps,
    /// What its completion says.
    pub(crate) wc: WcOpcode,
}

impl Op {
    /// This operation in each API: the crate's one opcode table.
    #[inline(always)]
    pub(crate) fn codes(self) -> OpCodes {
        let wc = match self {
            Op::Send | Op::SendImm | Op::SendInv => WcOpcode::Send,
            Op::Write | Op::WriteImm => WcOpcode::RdmaWrite,
            Op::Read => WcOpcode::RdmaRead,
            Op::CompSwap => WcOpcode::CompSwap,
            Op::FetchAdd => WcOpcode::FetchAdd,
            Op::BindMw => WcOpcode::BindMw,
            Op::LocalInv => WcOpcode::LocalInv,
            Op::AtomicWrite => WcOpcode::AtomicWrite,
        };
        // The discriminant is the C opcode and the send op's bit (checked above); `self`
        // is a constant where it matters, so the test folds away.
        let bit = if self == Op::AtomicWrite { ATOMIC_WRITE_BIT } else { self as u32 };
        let ops = SendOps::from_bits_retain(1 << bit);
        OpCodes { wr: ffi::ibv_wr_opcode(self as u32), ops, wc }
    }

    pub(crate) fn is_atomic(self) -> bool {
        matches!(self, Op::CompSwap | Op::FetchAdd)
    }

    pub(crate) fn has_remote(self) -> bool {
        matches!(self, Op::Write | Op::WriteImm | Op::Read | Op::CompSwap | Op::FetchAdd | Op::AtomicWrite)
    }

    /// The operations on 8 remote bytes that must be 8-byte aligned: the atomics and
    /// RDMA ATOMIC WRITE.
    pub(crate) fn is_word(self) -> bool {
        matches!(self, Op::CompSwap | Op::FetchAdd | Op::AtomicWrite)
    }

    /// The operations that carry immediate data.
    pub(crate) fn has_imm(self) -> bool {
        matches!(self, Op::WriteImm | Op::SendImm)
    }

    /// The operations the send path checks beyond sizes: the words above, and those
    /// with immediate data (which an iWARP device lacks). One test keeps them off the
    /// path of a WRITE, SEND or READ.
    pub(crate) fn is_word_or_imm(self) -> bool {
        matches!(self, Op::CompSwap | Op::FetchAdd | Op::AtomicWrite | Op::WriteImm | Op::SendImm)
    }
}

/// The `wr` union of a C send request, built with the request: the remote address and
/// key (RDMA), with the operands (atomics), or the address handle, QPN and Q_Key (UD);
/// zero for a connected SEND. Posting copies it as it is.
#[derive(Clone, Copy)]
pub(crate) struct Target(pub(crate) ffi::ibv_send_wr__bindgen_ty_2);

// SAFETY: plain integers, and for UD the address handle's pointer, which the request's
// `ah` field keeps alive and which only the provider reads.
unsafe impl Send for Target {}
// SAFETY: as for Send; nothing writes through it.
unsafe impl Sync for Target {}

impl Target {
    fn rdma(remote: &RemoteMr) -> Self {
        Target(ffi::ibv_send_wr__bindgen_ty_2 {
            rdma: ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: remote.addr, rkey: remote.rkey },
        })
    }

    fn atomic(remote: &RemoteMr, compare_add: u64, swap: u64) -> Self {
        Target(ffi::ibv_send_wr__bindgen_ty_2 {
            atomic: ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                remote_addr: remote.addr,
                compare_add,
                swap,
                rkey: remote.rkey,
            },
        })
    }
}

/// A send-side work request: what to do, with which buffer.
///
/// It holds what the C request needs in the form the provider reads (the `wr` union is
/// built here, once), in at most 128 bytes for a [`Chunk`](crate::Chunk): a post moves it
/// into its queue with a few register moves, not a `memcpy` call.
pub struct SendWr<T> {
    pub(crate) buf: T,
    pub(crate) range: Range<usize>,
    pub(crate) id: u64,
    pub(crate) target: Target,
    /// The remote region's length (RDMA and atomics), for the range check; `u64::MAX`
    /// for an operation without a remote side (SENDs), which no range exceeds.
    pub(crate) remote_len: u64,
    /// A UD request's address handle, kept alive until the completion.
    pub(crate) ah: Option<AddressHandle>,
    /// Immediate data, host order (with [`Op::SendImm`] and [`Op::WriteImm`]).
    pub(crate) imm: u32,
    pub(crate) op: Op,
    /// `ibv_send_flags` bits (all of the safe ones fit in a byte).
    pub(crate) flags: u8,
}

impl<T> std::fmt::Debug for SendWr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendWr")
            .field("op", &self.op)
            .field("range", &self.range)
            .field("remote", &self.remote())
            .field("imm", &matches!(self.op, Op::SendImm | Op::WriteImm).then_some(self.imm))
            .field("flags", &format_args!("{:#x}", self.flags))
            .field("ud", &self.ud())
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl<T> SendWr<T> {
    /// The remote region of an RDMA or atomic request.
    pub(crate) fn remote(&self) -> Option<RemoteMr> {
        let (addr, rkey) = match self.op {
            // SAFETY: the constructors write the `rdma` variant for these operations.
            Op::Write | Op::WriteImm | Op::Read | Op::AtomicWrite => unsafe {
                (self.target.0.rdma.remote_addr, self.target.0.rdma.rkey)
            },
            // SAFETY: and the `atomic` variant for these.
            Op::CompSwap | Op::FetchAdd => unsafe { (self.target.0.atomic.remote_addr, self.target.0.atomic.rkey) },
            Op::Send | Op::SendImm | Op::SendInv | Op::BindMw | Op::LocalInv => return None,
        };
        Some(RemoteMr { addr, len: self.remote_len, rkey })
    }

    /// The atomic operands (compare or add, swap).
    pub(crate) fn operands(&self) -> (u64, u64) {
        if !self.op.is_atomic() {
            return (0, 0);
        }
        // SAFETY: the constructors write the `atomic` variant for atomics.
        let a = unsafe { self.target.0.atomic };
        (a.compare_add, a.swap)
    }

    /// A UD request's destination QPN and Q_Key.
    pub(crate) fn ud(&self) -> Option<(u32, u32)> {
        // SAFETY: `send_ud` writes the `ud` variant and sets `ah`; nothing else sets `ah`.
        self.ah.as_ref().map(|_| unsafe { (self.target.0.ud.remote_qpn, self.target.0.ud.remote_qkey) })
    }

    /// Points an RDMA or atomic request at another remote region (its operands kept);
    /// returns the old one, or None (nothing changed) for a request with no remote side.
    pub(crate) fn retarget(&mut self, remote: RemoteMr) -> Option<RemoteMr> {
        let old = self.remote()?;
        self.target = if self.op.is_atomic() {
            let (compare_add, swap) = self.operands();
            Target::atomic(&remote, compare_add, swap)
        } else {
            Target::rdma(&remote)
        };
        self.remote_len = remote.len;
        Some(old)
    }
}

impl<T: SendBuf> SendWr<T> {
    #[inline(always)]
    fn new(op: Op, buf: T, range: Range<usize>, target: Target, remote_len: u64) -> Self {
        let flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0 as u8;
        // No remote side, no bound: the range check then needs no test of the operation
        // (`op` is a constant at every constructor, so this folds away).
        let remote_len = if op.has_remote() { remote_len } else { u64::MAX };
        SendWr { buf, range, id: 0, target, remote_len, ah: None, imm: 0, op, flags }
    }

    /// SEND `range` of `buf` to the peer's next receive.
    #[doc(alias = "ibv_wr_send")]
    #[inline]
    pub fn send(buf: T, range: Range<usize>) -> Self {
        Self::new(Op::Send, buf, range, Target::rdma(&RemoteMr { addr: 0, len: 0, rkey: 0 }), 0)
    }

    /// RDMA WRITE `range` of `buf` to the start of `remote`.
    #[doc(alias = "ibv_wr_rdma_write")]
    #[inline]
    pub fn write(buf: T, range: Range<usize>, remote: RemoteMr) -> Self {
        Self::new(Op::Write, buf, range, Target::rdma(&remote), remote.len)
    }

    /// SEND `range` of `buf` to the peer's next receive, invalidating the peer's memory
    /// window whose rkey is `rkey` (type 2: the peer bound it on the QP this connects to,
    /// and learns of the invalidation from the receive's completion, see
    /// [`BoundWindow::invalidated_by`](crate::BoundWindow::invalidated_by)). Connected QPs
    /// only; on a QP built with send ops it needs
    /// [`SendOps::SEND_WITH_INV`](crate::SendOps::SEND_WITH_INV).
    #[doc(alias = "ibv_wr_send_inv", alias = "IBV_WR_SEND_WITH_INV")]
    #[inline]
    pub fn send_inv(buf: T, range: Range<usize>, rkey: u32) -> Self {
        let mut wr = Self::new(Op::SendInv, buf, range, Target::rdma(&RemoteMr { addr: 0, len: 0, rkey: 0 }), 0);
        // `invalidate_rkey` shares the C union with `imm_data`, which `classic` writes as
        // `imm.to_be()`: stored so that this gives the rkey as it is.
        wr.imm = u32::from_be(rkey);
        wr
    }

    /// RDMA ATOMIC WRITE (IBTA 1.5): the 8 bytes of `buf` at `offset` land at `remote.addr`
    /// at once, as one 8-byte store the peer never sees half done (where an RDMA WRITE of 8
    /// bytes may be seen torn). `remote.addr` must be 8-byte aligned, and the peer's
    /// region writable by peers (`REMOTE_WRITE`, as for an RDMA WRITE: rxe checks that).
    ///
    /// Posted through the extended API alone (`ibv_wr_atomic_write`: `ibv_post_send` has no
    /// field for the 8 bytes), so the QP must be an RC QP built with
    /// [`SendOps::ATOMIC_WRITE`](crate::SendOps::ATOMIC_WRITE), which needs a device with
    /// `IB_UVERBS_DEVICE_ATOMIC_WRITE` (rxe from Linux 6.2, ConnectX-7). Refused before C:
    /// on a device without it, [`Error::NotSupported`](crate::Error::NotSupported) naming
    /// that capability; on a QP built without the send op, as a prepared request
    /// ([`SendQueue::prepare`](crate::SendQueue::prepare) posts through `ibv_post_send`), a
    /// misaligned remote address or 8 bytes that are not contiguous in `buf`,
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument). Its completion is
    /// [`WcOpcode::AtomicWrite`].
    ///
    /// A QP connected to itself stores 8 bytes, or says the device lacks the operation:
    #[doc = concat!("```no_run\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/device/doc/atomic_write.rs")), "```")]
    #[doc(alias = "ibv_wr_atomic_write", alias = "IBV_WR_ATOMIC_WRITE")]
    pub fn atomic_write(buf: T, offset: usize, remote: RemoteMr) -> Self {
        Self::new(Op::AtomicWrite, buf, offset..offset + 8, Target::rdma(&remote), remote.len)
    }

    /// A UD SEND to `remote_qpn` through `ah`, with the receiver's Q_Key.
    #[doc(alias = "ibv_wr_set_ud_addr")]
    pub fn send_ud(buf: T, range: Range<usize>, ah: &AddressHandle, remote_qpn: u32, qkey: u32) -> Self {
        let ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 { ah: ah.as_raw(), remote_qpn, remote_qkey: qkey };
        let mut wr = Self::new(Op::Send, buf, range, Target(ffi::ibv_send_wr__bindgen_ty_2 { ud }), 0);
        wr.ah = Some(ah.clone());
        wr
    }

    /// Adds immediate data (SEND with immediate, RDMA WRITE with immediate; other
    /// operations carry none). An iWARP device carries none: the queue refuses such a
    /// request there with [`Error::NotSupported`](crate::Error::NotSupported), before C.
    #[doc(alias = "ibv_wr_send_imm", alias = "ibv_wr_rdma_write_imm")]
    #[inline]
    pub fn imm(mut self, imm: u32) -> Self {
        self.op = match self.op {
            Op::Send => Op::SendImm,
            Op::Write => Op::WriteImm,
            op => op,
        };
        // A send with invalidate keeps its rkey where the immediate would go.
        if self.op != Op::SendInv {
            self.imm = imm;
        }
        self
    }

    /// Whether this request makes a completion (default: yes). Unsignaled requests are
    /// released by the next signaled completion after them.
    #[inline]
    pub fn signaled(mut self, yes: bool) -> Self {
        self.set(ffi::ibv_send_flags::IBV_SEND_SIGNALED, yes);
        self
    }

    /// Waits for earlier RDMA READs and atomics to finish before this one starts.
    #[inline]
    pub fn fence(mut self) -> Self {
        self.set(ffi::ibv_send_flags::IBV_SEND_FENCE, true);
        self
    }

    /// Asks the receiver's CQ to raise a solicited event.
    #[inline]
    pub fn solicited(mut self) -> Self {
        self.set(ffi::ibv_send_flags::IBV_SEND_SOLICITED, true);
        self
    }

    /// Copies the data into the work request at post time (checked against the QP's
    /// max inline data before posting).
    #[doc(alias = "ibv_wr_set_inline_data", alias = "ibv_wr_set_inline_data_list")]
    #[inline]
    pub fn inline(mut self) -> Self {
        self.set(ffi::ibv_send_flags::IBV_SEND_INLINE, true);
        self
    }

    /// The caller's identifier, handed back with the completion.
    #[inline]
    pub fn id(mut self, id: u64) -> Self {
        self.id = id;
        self
    }

    /// Takes the buffer back out of a request that was not posted.
    pub fn into_buf(self) -> T {
        self.buf
    }

    #[inline(always)]
    pub(crate) fn is_inline(&self) -> bool {
        u32::from(self.flags) & ffi::ibv_send_flags::IBV_SEND_INLINE.0 != 0
    }

    /// The `ibv_send_flags` as C takes them.
    #[inline(always)]
    pub(crate) fn send_flags(&self) -> u32 {
        u32::from(self.flags)
    }

    pub(crate) fn set(&mut self, flag: ffi::ibv_send_flags, on: bool) {
        let bit = flag.0 as u8;
        self.flags = if on { self.flags | bit } else { self.flags & !bit };
    }
}

impl<T: ExclusiveBuf> SendWr<T> {
    /// RDMA READ the start of `remote` into `range` of `buf`.
    #[doc(alias = "ibv_wr_rdma_read")]
    #[inline]
    pub fn read(buf: T, range: Range<usize>, remote: RemoteMr) -> Self {
        Self::new(Op::Read, buf, range, Target::rdma(&remote), remote.len)
    }

    /// Atomic compare-and-swap on the 8 bytes at `remote.addr`; the old value lands in
    /// the first 8 bytes of `buf` at `offset`. A device whose `atomic_cap` is
    /// `IBV_ATOMIC_NONE` (siw) has no atomics: the queue refuses the request there with
    /// [`Error::NotSupported`](crate::Error::NotSupported), before C (so does
    /// [`fetch_add`](Self::fetch_add)).
    #[doc(alias = "ibv_wr_atomic_cmp_swp")]
    pub fn compare_swap(buf: T, offset: usize, remote: RemoteMr, compare: u64, swap: u64) -> Self {
        Self::new(Op::CompSwap, buf, offset..offset + 8, Target::atomic(&remote, compare, swap), remote.len)
    }

    /// Atomic fetch-and-add on the 8 bytes at `remote.addr`; the old value lands in `buf`
    /// at `offset`.
    #[doc(alias = "ibv_wr_atomic_fetch_add")]
    pub fn fetch_add(buf: T, offset: usize, remote: RemoteMr, add: u64) -> Self {
        Self::new(Op::FetchAdd, buf, offset..offset + 8, Target::atomic(&remote, add, 0), remote.len)
    }
}

/// A finished work request, with what you posted back in [`value`](Done::value): the
/// buffer of a [`SendWr`] or a receive, the [`PreparedSend`](crate::PreparedSend) or
/// [`PreparedRecv`](crate::PreparedRecv) to post again, or a whole prepared chain.
///
/// [`Done::result`] turns it into a `Result`: itself on success, its value with an
/// [`Error::WorkCompletion`] that names the operation, your id, the QP, the status and the
/// usual cause on failure (a [`Refused`], as a refused post is).
pub struct Done<T> {
    /// The caller's identifier ([`SendWr::id`], [`RecvQueue::post`](crate::RecvQueue::post)).
    pub id: u64,
    /// What the queue hands back: the buffer for requests built at each post and for
    /// receives, the prepared request or chain for prepared ones (as [`Refused::value`]).
    pub value: T,
    /// How it ended. Unsignaled requests released by a later success report success.
    pub status: WcStatus,
    /// Bytes received (receives), or as the completion says.
    pub byte_len: u32,
    /// What the request was, as the queue that posted it knows (a failed completion's own
    /// opcode is undefined): [`WcOpcode::Recv`] for every receive.
    pub op: WcOpcode,
    /// The local QP number (for an SRQ, the QP that took the receive).
    pub qp_num: u32,
    /// The provider's own error code (0 when it gives none).
    pub vendor_err: u32,
}

impl<T: std::fmt::Debug> std::fmt::Debug for Done<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Done")
            .field("id", &self.id)
            .field("value", &self.value)
            .field("status", &self.status)
            .field("byte_len", &self.byte_len)
            .field("op", &self.op)
            .field("qp_num", &format_args!("{:#x}", self.qp_num))
            .field("vendor_err", &format_args!("{:#x}", self.vendor_err))
            .finish()
    }
}

impl<T> Done<T> {
    /// A receive `wc` finished for the caller's `id`, with its buffer.
    #[inline]
    pub(crate) fn received(id: u64, value: T, wc: &WorkCompletion) -> Self {
        Done {
            id,
            value,
            status: wc.status(),
            byte_len: wc.byte_len(),
            op: WcOpcode::Recv,
            qp_num: wc.qp_num(),
            vendor_err: wc.vendor_err(),
        }
    }

    /// True when the request completed without error.
    #[inline]
    pub fn is_success(&self) -> bool {
        self.status.is_success()
    }

    /// Itself when the request succeeded; else its value, with the error that names the
    /// operation, the caller's id, the QP, the status and the usual cause.
    #[inline]
    #[allow(clippy::result_large_err)] // the value comes back by value: no allocation
    pub fn result(self) -> Result<Self, Refused<T>> {
        if self.status.is_success() {
            Ok(self)
        } else {
            Err(self.into_failure())
        }
    }

    #[cold]
    fn into_failure(self) -> Refused<T> {
        let error = Error::WorkCompletion {
            status: self.status,
            op: Some(self.op),
            id: Some(self.id),
            wr_id: 0,
            qp_num: self.qp_num,
            vendor_err: self.vendor_err,
        };
        Refused::new(error, self.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::Chunk;

    /// A post moves the request into its ring: at 128 bytes or less the compiler does that
    /// with register moves; past it, with a `memcpy` call (scripts/instructions shows it).
    #[test]
    fn a_chunk_request_fits_in_128_bytes() {
        assert!(std::mem::size_of::<SendWr<Chunk>>() <= 128, "{}", std::mem::size_of::<SendWr<Chunk>>());
        assert!(std::mem::size_of::<SendWr<std::sync::Arc<Chunk>>>() <= 96);
    }

    /// A chunk moves with every post and completion: at 32 bytes, in two vector moves.
    #[test]
    fn a_chunk_is_32_bytes() {
        assert_eq!(std::mem::size_of::<Chunk>(), 32);
    }
}
