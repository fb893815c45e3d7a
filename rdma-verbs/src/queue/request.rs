//! What a send queue posts: the [`SendRequest`] trait, and its main kind, a [`SendWr`]
//! checked and built into its C form at each post.

use std::mem::MaybeUninit;
use std::ptr::NonNull;

use super::Sges;
use crate::buf::{SendBuf, MAX_SGE};
use crate::compat;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::mr::RemoteMr;
use crate::qp::SendOps;
use crate::wc::{WcOpcode, WcStatus};
use crate::wr::{Done, Op, SendWr};

/// What a QP's send side takes, as the safe path checks it before calling the provider.
/// (Public only because [`SendRequest`] names it; not reachable from outside.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendLimits {
    /// One more than the SGEs a request without an address handle may have without a
    /// closer look: the smaller of the QP's `max_send_sge` and the device's `max_sge_rd`
    /// (capped at [`MAX_SGE`], which no request passes), plus one; 0 on a UD QP, where
    /// such a request is refused. One comparison, `n >= sge_lim`, tells every request
    /// within both limits and on the right transport (the cold path then says which
    /// failed).
    pub(crate) sge_lim: u16,
    /// The same for a request with an address handle: 0 unless the QP is UD.
    pub(crate) sge_lim_ah: u16,
    /// The QP's `max_send_sge` (at most `u16::MAX`).
    pub(crate) send_sge: u16,
    /// The device's `max_sge_rd`: most SGEs an RDMA READ may scatter into (siw: 1; siw
    /// silently filled only that many).
    pub(crate) read_sge: u16,
    pub(crate) max_inline: u32,
    /// A UD QP: every request needs an address handle, and none other may have one.
    pub(crate) ud: bool,
    /// The QP's protection domain: every buffer must be registered there.
    pub(crate) pd: crate::buf::PdId,
    /// Whether an RDMA ATOMIC WRITE may be posted, and if not, why.
    pub(crate) atomic_write: AtomicWrite,
    /// The device has no immediate data (iWARP): a request with it is not supported.
    pub(crate) lacks_imm: bool,
    /// The device has no atomics (`IBV_ATOMIC_NONE`): compare-and-swap and fetch-and-add
    /// are not supported.
    pub(crate) lacks_atomics: bool,
}

// Three words, as before the flags were kept: they fill what was padding.
const _: () = assert!(std::mem::size_of::<SendLimits>() == 24);

/// Whether a send queue takes an RDMA ATOMIC WRITE ([`SendWr::atomic_write`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AtomicWrite {
    /// The QP was built with `SendOps::ATOMIC_WRITE` (which the device has).
    Takes,
    /// The device has it, the QP was built without the send op.
    NoSendOp,
    /// The device does not have it.
    NoDevice,
    /// The request is prepared: it goes through `ibv_post_send`, which has no form of it.
    Prepared,
}

impl SendLimits {
    /// The SGE, inline and transport limits as one word, to tell in one comparison
    /// whether two QPs take the same requests: equal keys, equal `max_inline` and `ud`,
    /// and `max_sge` equal or both at least [`MAX_SGE`] (no safe request has more SGEs).
    #[inline]
    pub(crate) fn key(self) -> u64 {
        let sge = u32::from(self.send_sge).min(MAX_SGE as u32);
        let rd = u32::from(self.read_sge).min(MAX_SGE as u32);
        let aw = u64::from(self.atomic_write == AtomicWrite::Takes);
        let lacks = u64::from(self.lacks_imm) << 1 | u64::from(self.lacks_atomics);
        u64::from(self.max_inline) << 32
            | aw << 31
            | lacks << 24
            | u64::from(rd) << 16
            | u64::from(sge) << 1
            | u64::from(self.ud)
    }
}

/// The extended QP of a send queue, when the QP was built with send ops.
pub type Ext = Option<(NonNull<ffi::ibv_qp_ex>, SendOps)>;

pub(crate) mod sealed {
    /// Only this crate's requests are posted: a request's C form is trusted to name only
    /// bytes of the buffer it owns.
    pub trait Sealed {}
    /// Makes the trait's methods uncallable outside this crate.
    pub struct Token;
}
pub(crate) use sealed::Token;

/// What a [`SendQueue`](super::SendQueue) posts: a [`SendWr`] (checked and built at each
/// post) or a [`PreparedSend`](super::PreparedSend) request (checked and built once). Sealed.
///
/// The queue is one machine for both; this trait is the variation: how a request is
/// checked against the QP, where its C form comes from, and what its completion hands
/// back.
pub trait SendRequest: sealed::Sealed + Sized + Send + 'static {
    /// What a completion hands back in [`Done::value`]: the buffer of a `SendWr`, the whole
    /// request of a `PreparedSend` one (to post again).
    type Back;

    /// Whether a request of this kind may be a chain of several C requests posted as one
    /// ([`width`](Self::width)). A chain sits in the ring slot of its first C request; the
    /// slots of the others stay empty (the queue counts how many of the oldest chain's
    /// C requests completed, and so finds it).
    #[doc(hidden)]
    const CHAIN: bool = false;

    /// Whether a request of this kind may ever go the extended API's way
    /// ([`ext_takes`](Self::ext_takes) can hold). A kind that never does (a prebuilt C
    /// request, a chain) says so here, and its posts compile to the classic way alone,
    /// with no test of the QP's extended API.
    #[doc(hidden)]
    const EXTENDED: bool = true;

    /// Whether a batch builds its C request in its ring slot, after the move: a kind whose
    /// C request lives inside the request (a memory-window bind) must, and a prepared
    /// one is cheaper so (its stamp reads its heap block's address from the slot). A
    /// `SendWr` is built where the caller built it, before the move (its C request goes
    /// into the queue's scratch space): the build then reads it from registers.
    #[doc(hidden)]
    const BUILD_IN_SLOT: bool = false;

    /// How many C requests it posts (1 unless [`CHAIN`](Self::CHAIN)).
    #[doc(hidden)]
    #[inline(always)]
    fn width(&self) -> usize {
        1
    }

    /// Splits a chain after its first `k` C requests (0 < k < width): `self` keeps
    /// those, the rest comes back. Only called on a [`CHAIN`](Self::CHAIN) kind, when the
    /// provider stopped inside a chain.
    #[doc(hidden)]
    fn split(&mut self, _k: usize, _: Token) -> Self {
        unreachable!("a request of one C request is never split")
    }

    /// Moves this checked request into `slot`, its ring slot, where it stays until its
    /// completion. A kind whose requests callers build in registers writes it field by
    /// field: a move of the whole request made the compiler build it on the stack first
    /// and copy it from there (scripts/instructions).
    #[doc(hidden)]
    #[inline(always)]
    fn keep(self, slot: &mut MaybeUninit<Self>, _: Token) -> &mut Self {
        slot.write(self)
    }

    /// Copies this request bit for bit into `slot`, its ring slot, leaving `self` in
    /// place, as [`keep`](Self::keep) moves it. The lean batch loops copy each request
    /// into its slot before its checks, then read the checks and the C request from
    /// `self` (whose constant fields fold into them): its fields then go into the slot
    /// where they are loaded, not spilled to the stack and reloaded after the checks
    /// (scripts/instructions, 2026-12-08: 4.1 instructions fewer a WRITE in batches of 32,
    /// 7.2 on an extended QP; a refusal hands back the copy, so `self` is dead after the
    /// checks: 4.0 fewer again). A kind that goes through those loops (neither
    /// [`CHAIN`](Self::CHAIN) nor [`BUILD_IN_SLOT`](Self::BUILD_IN_SLOT): a `SendWr`)
    /// must not change itself in `c_request_with_id` or `extended`.
    ///
    /// # Safety
    /// The copy is the owner from then on: `self` is only read, never changed, dropped or
    /// moved out of (the caller holds it in a `ManuallyDrop` and forgets it); the copy is
    /// read out once, by the ring or by a refusal.
    #[doc(hidden)]
    #[inline(always)]
    unsafe fn keep_copy(&self, slot: &mut MaybeUninit<Self>, _: Token) {
        // SAFETY: the caller's contract.
        slot.write(unsafe { std::ptr::read(self) });
    }

    /// Checks the request against the QP and writes its SGEs (if it builds them) into
    /// `sges`; returns how many.
    #[doc(hidden)]
    /// A refusal names `verb`, the method that asked.
    #[doc(hidden)]
    fn check(&self, verb: Verb, limits: &SendLimits, key: u64, sges: &mut Sges, _: Token) -> Result<usize>;

    /// The C request(s) to post, the first as `wr_id(tag, seq)` and each next one
    /// with the next sequence number, linked, the last `next` NULL: built into `out`
    /// (with the `n` SGEs `check` wrote into `sges`, which must not move before the post),
    /// or the request's own. Returns the first and the last.
    #[doc(hidden)]
    fn c_request(
        &mut self,
        tag: u64,
        seq: u64,
        sges: &mut Sges,
        n: usize,
        out: &mut ffi::ibv_send_wr,
        _: Token,
    ) -> (*mut ffi::ibv_send_wr, *mut ffi::ibv_send_wr);

    /// [`c_request`](Self::c_request) of a kind of one C request, whose `wr_id` is `id`
    /// (its tag and sequence number already joined): the one C request. `out` is a
    /// scratch slot's C request, whose `sg_list` already points at `sges`.
    #[doc(hidden)]
    #[inline(always)]
    fn c_request_with_id(
        &mut self,
        id: u64,
        sges: &mut Sges,
        n: usize,
        out: &mut ffi::ibv_send_wr,
        _: Token,
    ) -> *mut ffi::ibv_send_wr {
        // `wr_id(tag, seq)` with the tag bits of `id` and its low bits as the sequence
        // number gives `id` back.
        self.c_request(id & !super::tag::LOW_MASK, id, sges, n, out, TOKEN()).0
    }

    /// Whether the extended API of `ext` takes this checked request (`n` SGEs). Never,
    /// unless a kind says so: a prebuilt C request is what makes a prepared kind cheap,
    /// and the `ibv_wr_*` calls build the request anew each time.
    #[doc(hidden)]
    #[inline]
    fn ext_takes(&self, _ext: Ext, _n: usize, _: Token) -> bool {
        false
    }

    /// Whether this checked request can go the extended API's way only (an RDMA ATOMIC
    /// WRITE): a batch with one goes that way whole, or refuses what would not.
    #[doc(hidden)]
    #[inline(always)]
    fn needs_extended(&self, _: Token) -> bool {
        false
    }

    /// Adds this checked request to the open `ibv_wr_start` batch of `qpx` (not reached
    /// for a kind whose [`ext_takes`](Self::ext_takes) is always false).
    ///
    /// # Safety
    /// `qpx` is the posting queue's extended QP, inside `ibv_wr_start`, and
    /// [`ext_takes`](Self::ext_takes) held; `sges[..n]` were written by `check`.
    #[doc(hidden)]
    #[inline]
    unsafe fn extended(&self, _qpx: *mut ffi::ibv_qp_ex, _wr_id: u64, _sges: &Sges, _n: usize, _: Token) {}

    /// The finished request, read out of its ring slot (no move of the whole request):
    /// what comes back, with how it ended.
    ///
    /// # Safety
    /// `slot` holds a request, which this reads out: the caller treats the slot as empty
    /// afterwards.
    #[doc(hidden)]
    unsafe fn finish(slot: &mut MaybeUninit<Self>, end: End, _: Token) -> Done<Self::Back>;
}

/// How a send request ended, as its queue saw it.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct End {
    pub(crate) status: WcStatus,
    pub(crate) byte_len: u32,
    pub(crate) qp_num: u32,
    pub(crate) vendor_err: u32,
}

impl End {
    /// An unsignaled request released by a later completion: a success of its own.
    pub(super) const IMPLIED: End = End { status: WcStatus::Success, byte_len: 0, qp_num: 0, vendor_err: 0 };

    /// What comes back of a request: `value`, with the caller's `id`, its operation `op`,
    /// and how it ended.
    #[inline(always)]
    pub(crate) fn done<B>(self, id: u64, op: WcOpcode, value: B) -> Done<B> {
        let End { status, byte_len, qp_num, vendor_err } = self;
        Done { id, value, status, byte_len, op, qp_num, vendor_err }
    }

    /// How the request that `wc` completes ended, on QP `qp_num`.
    #[inline(always)]
    pub(super) fn of(wc: &crate::wc::WorkCompletion, qp_num: u32) -> End {
        End { status: wc.status(), byte_len: wc.byte_len(), qp_num, vendor_err: wc.vendor_err() }
    }
}

pub(super) const TOKEN: fn() -> Token = || Token;

impl<T: SendBuf> sealed::Sealed for SendWr<T> {}

impl<T: SendBuf> SendRequest for SendWr<T> {
    type Back = T;

    #[inline(always)]
    fn keep(self, slot: &mut MaybeUninit<Self>, _: Token) -> &mut Self {
        let SendWr { buf, range, id, target, remote_len, ah, imm, op, flags } = self;
        let p = slot.as_mut_ptr();
        // SAFETY: `p` points at the slot, valid for writes; each field is written once,
        // so the slot then holds the whole request (and nothing is dropped in between).
        unsafe {
            (&raw mut (*p).buf).write(buf);
            (&raw mut (*p).range).write(range);
            (&raw mut (*p).id).write(id);
            (&raw mut (*p).target).write(target);
            (&raw mut (*p).remote_len).write(remote_len);
            (&raw mut (*p).ah).write(ah);
            (&raw mut (*p).imm).write(imm);
            (&raw mut (*p).op).write(op);
            (&raw mut (*p).flags).write(flags);
            slot.assume_init_mut()
        }
    }

    #[inline(always)]
    unsafe fn keep_copy(&self, slot: &mut MaybeUninit<Self>, _: Token) {
        let p = slot.as_mut_ptr();
        // SAFETY: `p` points at the slot, valid for writes; each field is copied once
        // (the caller's contract says which copy owns them).
        unsafe {
            (&raw mut (*p).buf).write(std::ptr::read(&self.buf));
            (&raw mut (*p).range).write(self.range.clone());
            (&raw mut (*p).id).write(self.id);
            (&raw mut (*p).target).write(self.target);
            (&raw mut (*p).remote_len).write(self.remote_len);
            (&raw mut (*p).ah).write(std::ptr::read(&self.ah));
            (&raw mut (*p).imm).write(self.imm);
            (&raw mut (*p).op).write(self.op);
            (&raw mut (*p).flags).write(self.flags);
        }
    }

    #[inline(always)]
    fn check(&self, verb: Verb, limits: &SendLimits, _key: u64, sges: &mut Sges, _: Token) -> Result<usize> {
        check_send(verb, limits, self, sges)
    }

    #[inline(always)]
    fn c_request(
        &mut self,
        tag: u64,
        seq: u64,
        sges: &mut Sges,
        n: usize,
        out: &mut ffi::ibv_send_wr,
        _: Token,
    ) -> (*mut ffi::ibv_send_wr, *mut ffi::ibv_send_wr) {
        let wr: *mut ffi::ibv_send_wr = classic(self, super::tag::wr_id(tag, seq), sges, n, out);
        (wr, wr)
    }

    #[inline(always)]
    fn c_request_with_id(
        &mut self,
        id: u64,
        sges: &mut Sges,
        n: usize,
        out: &mut ffi::ibv_send_wr,
        _: Token,
    ) -> *mut ffi::ibv_send_wr {
        // The lean loop's `out` is a scratch slot's C request, which points at its slot's
        // SGEs, `sges`, from the start (`SendScratch::new`).
        debug_assert!(std::ptr::eq(out.sg_list, sges.as_ptr().cast()));
        classic_fields(self, id, n, out)
    }

    #[inline(always)]
    fn ext_takes(&self, ext: Ext, n: usize, _: Token) -> bool {
        ext_takes(ext, self, n)
    }

    #[inline(always)]
    fn needs_extended(&self, _: Token) -> bool {
        self.op == Op::AtomicWrite
    }

    #[inline(always)]
    unsafe fn extended(&self, qpx: *mut ffi::ibv_qp_ex, wr_id: u64, sges: &Sges, n: usize, _: Token) {
        // SAFETY: the caller's contract.
        unsafe { extended(qpx, self, wr_id, sges, n) }
    }

    #[inline(always)]
    unsafe fn finish(slot: &mut MaybeUninit<Self>, end: End, _: Token) -> Done<T> {
        let wr = slot.as_mut_ptr();
        // SAFETY: the caller's contract: `slot` holds a request, read out here once. Of its
        // fields only `buf` (moved out) and `ah` (dropped in place) own anything; the rest
        // are plain values, read by copy. The address handle goes first: read before a
        // call that might drop it, the buffer was spilled to the stack and copied back
        // (scripts/instructions).
        unsafe {
            std::ptr::drop_in_place(&raw mut (*wr).ah);
            let buf = std::ptr::read(&raw const (*wr).buf);
            end.done((*wr).id, (*wr).op.codes().wc, buf)
        }
    }
}

/// A C send request with every field zero: where [`classic`] builds requests (once per
/// scratch slot or prepared request).
pub(super) fn zeroed_wr() -> ffi::ibv_send_wr {
    // SAFETY: ibv_send_wr is plain C data (integers, pointers, unions of them), for which
    // all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Builds the C work request for a checked `wr` whose `n` SGEs are in `sges` (which must
/// not move before the post) into `out`, in place: no allocation, no call, and no zeroing
/// of the 128 bytes. `out` starts zeroed ([`zeroed_wr`]) and only [`classic`] writes it,
/// so it writes every field any request of its own may have set (`next`, the `wr` union);
/// the fields it never sets (XRC, memory-window bind, TSO) stay zero. The immediate (or
/// the key a SEND with invalidate names) is written for the operations that carry one
/// only: the providers read it for no other (rdma-core's mlx5 gives 0 for the rest, and
/// rxe's kernel side takes it only for an operation with immediate data), so an earlier
/// request's value left there is never sent.
#[inline(always)]
pub(super) fn classic<'o, T: SendBuf>(
    wr: &SendWr<T>,
    seq: u64,
    sges: &mut Sges,
    n: usize,
    out: &'o mut ffi::ibv_send_wr,
) -> &'o mut ffi::ibv_send_wr {
    out.sg_list = sges.as_mut_ptr().cast();
    classic_fields(wr, seq, n, out)
}

/// [`classic`] but for `sg_list`, which already points at the request's SGE list (a
/// scratch slot's C request points at its slot's SGEs from the start: one store a request
/// fewer, scripts/instructions).
#[inline(always)]
pub(super) fn classic_fields<'o, T: SendBuf>(
    wr: &SendWr<T>,
    seq: u64,
    n: usize,
    out: &'o mut ffi::ibv_send_wr,
) -> &'o mut ffi::ibv_send_wr {
    out.next = std::ptr::null_mut();
    out.wr_id = seq;
    out.num_sge = n as i32;
    out.send_flags = wr.send_flags();
    out.opcode = wr.op.codes().wr;
    if wr.op.has_imm() || wr.op == Op::SendInv {
        out.__bindgen_anon_1.imm_data = wr.imm.to_be();
    }
    out.wr = wr.target.0;
    out
}

/// Adds a checked `wr` to the open `ibv_wr_start` batch of `qpx`.
///
/// # Safety
/// `qpx` is this queue's extended QP, inside `ibv_wr_start`; `ext_takes(wr, n)` holds.
#[inline(always)]
unsafe fn extended<T: SendBuf>(qpx: *mut ffi::ibv_qp_ex, wr: &SendWr<T>, seq: u64, sges: &Sges, n: usize) {
    // SAFETY: the caller's contract; `sges[..n]` were written by check().
    unsafe {
        (*qpx).wr_id = seq;
        // rxe (rdma-core 44) wants IBV_SEND_INLINE here as well as set_inline_data.
        (*qpx).wr_flags = wr.send_flags();
        // Read in each arm, where the operation is known: its match inside `remote` then
        // folds away (read once before this match, it cost a batched WRITE 10
        // instructions more: scripts/instructions).
        let r = || wr.remote().unwrap_or(RemoteMr { addr: 0, len: 0, rkey: 0 });
        let imm = wr.imm.to_be();
        match wr.op {
            Op::Send => ffi::ibv_wr_send(qpx),
            Op::SendImm => ffi::ibv_wr_send_imm(qpx, imm),
            Op::Write => {
                let r = r();
                ffi::ibv_wr_rdma_write(qpx, r.rkey, r.addr)
            }
            Op::WriteImm => {
                let r = r();
                ffi::ibv_wr_rdma_write_imm(qpx, r.rkey, r.addr, imm)
            }
            Op::Read => {
                let r = r();
                ffi::ibv_wr_rdma_read(qpx, r.rkey, r.addr)
            }
            Op::CompSwap => {
                let (r, (compare, swap)) = (r(), wr.operands());
                ffi::ibv_wr_atomic_cmp_swp(qpx, r.rkey, r.addr, compare, swap)
            }
            Op::FetchAdd => {
                let r = r();
                ffi::ibv_wr_atomic_fetch_add(qpx, r.rkey, r.addr, wr.operands().0)
            }
            // `imm` holds the rkey so that `to_be` gives it as it is (SendWr::send_inv).
            Op::SendInv => ffi::ibv_wr_send_inv(qpx, imm),
            // The provider copies the 8 bytes now; the request has no SGE. `check` made
            // them one SGE of the buffer.
            Op::AtomicWrite => {
                let r = r();
                let sge = sges[0].assume_init();
                ffi::ibv_wr_atomic_write(qpx, r.rkey, r.addr, sge.addr as *const std::ffi::c_void);
                return;
            }
            // Never a SendWr's operation: mw::MwRequest builds those.
            Op::BindMw | Op::LocalInv => {}
        }
        if let (Some(ah), Some((qpn, qkey))) = (&wr.ah, wr.ud()) {
            ffi::ibv_wr_set_ud_addr(qpx, ah.as_raw(), qpn, qkey);
        }
        if n == 0 {
            // A zero-length request: an empty SGE list (the pointer is valid, nothing is
            // read from it).
            ffi::ibv_wr_set_sge_list(qpx, 0, sges.as_ptr().cast());
            return;
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

/// Checks `wr` against a queue's limits and writes its SGEs into `sges`; returns how
/// many. No allocation; the error paths are out of line.
#[inline(always)]
pub(super) fn check_send<T: SendBuf>(
    verb: Verb,
    limits: &SendLimits,
    wr: &SendWr<T>,
    sges: &mut Sges,
) -> Result<usize> {
    let SendLimits { max_inline, pd, atomic_write, .. } = *limits;
    let len = wr.range.end.wrapping_sub(wr.range.start);
    // A SEND's remote_len is u64::MAX (SendWr::new): one comparison for every operation.
    // Made first, so that the remote length need not outlive the rest; refused after
    // `sges`, whose refusal of a range the buffer does not hold (where this length means
    // nothing) comes first.
    let remote_short = len as u64 > wr.remote_len;
    let n = wr.buf.sges(verb, wr.range.clone(), pd, sges)?;
    if remote_short {
        return Err(refused(verb, SendRefusal::Remote { len, remote: wr.remote_len }));
    }
    // Within the SGE limits and with an address handle on a UD QP only: one comparison
    // (`SendLimits::sge_lim`). A UD send without an address handle would have the
    // provider read a NULL one.
    let lim = if wr.ah.is_some() { limits.sge_lim_ah } else { limits.sge_lim };
    if n >= usize::from(lim) {
        sges_within(verb, wr.op, n, wr.ah.is_some(), limits)?;
    }
    if wr.is_inline() && len > max_inline as usize {
        return Err(refused(verb, SendRefusal::Inline { len, max: max_inline }));
    }
    // One test for the common operations (a WRITE or SEND has neither a word nor
    // immediate data), the rest inside.
    if wr.op.is_word_or_imm() {
        if !wr.op.is_word() {
            if limits.lacks_imm {
                return Err(Error::not_supported(verb, crate::caps::NO_IMM));
            }
            return Ok(n);
        }
        if wr.op.is_atomic() && limits.lacks_atomics {
            return Err(Error::not_supported(verb, crate::caps::NO_ATOMICS));
        }
        if wr.remote().is_some_and(|r| r.addr % 8 != 0 || r.len < 8) {
            return Err(refused(verb, SendRefusal::Atomic));
        }
        if wr.op == Op::AtomicWrite {
            match atomic_write {
                AtomicWrite::Takes if n == 1 => {}
                AtomicWrite::NoDevice => return Err(Error::not_supported(verb, crate::caps::NO_ATOMIC_WRITE)),
                why => return Err(refused(verb, SendRefusal::AtomicWrite(why))),
            }
        }
    }
    Ok(n)
}

/// `n` SGEs, not below the limit of `SendLimits::sge_lim`: refused when the address
/// handle does not match the transport, or `n` is over the limit of `op`. Cold: only a
/// device whose `max_sge_rd` is below its `max_send_sge` (siw) comes here with requests
/// it takes, and the hot path keeps its registers as it had them.
#[cold]
#[inline(never)]
fn sges_within(verb: Verb, op: Op, n: usize, ah: bool, limits: &SendLimits) -> Result<()> {
    if ah != limits.ud {
        return Err(refused(verb, SendRefusal::Transport { ud: limits.ud }));
    }
    let (send, read) = (u32::from(limits.send_sge), u32::from(limits.read_sge));
    if n as u32 > send {
        return Err(refused(verb, SendRefusal::Sges { n, max: send }));
    }
    if op == Op::Read && n as u32 > read {
        return Err(refused(verb, SendRefusal::ReadSges { n, max: read }));
    }
    Ok(())
}

/// Whether the extended API of a QP built with `ext` takes this request (checked, `n`
/// SGEs): its operation is among the send ops, and the loaded rdma-core has no known bug
/// for its SGE or inline list ([`compat::quirks`]).
#[inline(always)]
fn ext_takes<T: SendBuf>(ext: Ext, wr: &SendWr<T>, n: usize) -> bool {
    let Some((_, ops)) = ext else { return false };
    // The quirks only matter for lists of two or more: a single SGE and an empty list
    // (a zero-length request) never meet them. The queue's claim has looked them up
    // already (not known: the classic way, which takes every list).
    ops.contains(wr.op.codes().ops)
        && (n <= 1
            || compat::quirks_known().is_some_and(|q| if wr.is_inline() { q.wr_inline_list } else { q.wr_sge_list }))
}

/// Why the safe send path refused a work request before calling the provider.
enum SendRefusal {
    Sges { n: usize, max: u32 },
    ReadSges { n: usize, max: u32 },
    Inline { len: usize, max: u32 },
    Remote { len: usize, remote: u64 },
    Atomic,
    AtomicWrite(AtomicWrite),
    Transport { ud: bool },
}

#[cold]
#[inline(never)]
fn refused(verb: Verb, why: SendRefusal) -> Error {
    let what = match why {
        SendRefusal::Sges { n, max } => format!("{n} SGEs, but the QP takes {max} (max_send_sge)"),
        SendRefusal::ReadSges { n, max } => {
            format!("an RDMA READ into {n} SGEs, but the device scatters a READ into {max} (max_sge_rd)")
        }
        SendRefusal::Inline { len, max } => format!("{len} bytes inline, but the QP allows {max} (max_inline_data)"),
        SendRefusal::Remote { len, remote } => format!("{len} bytes do not fit the remote region of {remote} bytes"),
        SendRefusal::Atomic => "an atomic needs an 8-byte aligned remote address with 8 bytes".into(),
        SendRefusal::AtomicWrite(AtomicWrite::NoSendOp) => "an RDMA ATOMIC WRITE is posted through the extended \
            API only: build the QP with extended_send_ops(SendOps::ATOMIC_WRITE)"
            .into(),
        SendRefusal::AtomicWrite(AtomicWrite::Prepared) => "an RDMA ATOMIC WRITE is posted through the extended \
            API only, and a prepared request goes through ibv_post_send: post it as a SendWr"
            .into(),
        SendRefusal::AtomicWrite(_) => "an RDMA ATOMIC WRITE takes its 8 bytes from one registered span of the \
            buffer, and these lie in two"
            .into(),
        SendRefusal::Transport { ud: true } => {
            "a UD QP sends only datagrams with an address handle (SendWr::send_ud)".into()
        }
        SendRefusal::Transport { ud: false } => {
            "an address handle (SendWr::send_ud) is for UD QPs; this QP is connected".into()
        }
    };
    Error::invalid(verb, what)
}
