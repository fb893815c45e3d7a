//! Memory windows (`struct ibv_mw`): a peer's access to part of a region, granted and
//! taken back through the send queue. The guide is on [`MemoryWindow`] (public, where
//! rustdoc shows it).

use std::fmt;
use std::marker::PhantomData;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ops::Range;
use std::ptr;
use std::sync::Arc;

use crate::buf::{SendBuf, MAX_SGE};
use crate::conv;
use crate::error::{Error, Refused, Result, Verb};
use crate::ffi;
use crate::handle::Owned;
use crate::mr::{AccessFlags, MemoryRegion, RegisterableBuffer, RemoteMr, RemoteWritable};
use crate::pd::ProtectionDomain;
use crate::qp::QueuePair;
use crate::queue::{wr_id, End, Ext, SendLimits, SendQueue, SendRequest, SendSealed, Token};
use crate::wc::{WcStatus, WorkCompletion};
use crate::wr::{Done, Op, SendWr};

type Sges = [MaybeUninit<ffi::ibv_sge>; MAX_SGE];

/// The two kinds of memory window (`enum ibv_mw_type`).
#[doc(alias = "ibv_mw_type")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Type 1: bound with `ibv_bind_mw` (which posts the bind on a QP's send queue), tied
    /// to the protection domain; unbound by a bind of length 0 or by deallocation.
    Type1,
    /// Type 2 (2B on rxe): bound by a bind work request, tied to the QP that bound it
    /// (peers reach it through that QP's connection only); unbound by a local invalidate
    /// or by the peer's send with invalidate.
    Type2,
}

impl MwType {
    fn to_c(self) -> ffi::ibv_mw_type {
        match self {
            MwType::Type1 => ffi::ibv_mw_type::IBV_MW_TYPE_1,
            MwType::Type2 => ffi::ibv_mw_type::IBV_MW_TYPE_2,
        }
    }
}

/// A region a window may reach: what a bind needs of it, type-erased, kept alive by the
/// window while a binding may still be live.
trait WindowRegion: Send + Sync {
    fn raw_mr(&self) -> *mut ffi::ibv_mr;
    fn start(&self) -> u64;
    fn length(&self) -> u64;
    fn flags(&self) -> AccessFlags;
    fn pd_raw(&self) -> *mut ffi::ibv_pd;
}

impl<B> WindowRegion for MemoryRegion<B, RemoteWritable>
where
    B: RegisterableBuffer + Send + Sync,
    B::Parts: Send + Sync,
{
    fn raw_mr(&self) -> *mut ffi::ibv_mr {
        self.as_raw()
    }
    fn start(&self) -> u64 {
        self.addr()
    }
    fn length(&self) -> u64 {
        self.len() as u64
    }
    fn flags(&self) -> AccessFlags {
        self.access()
    }
    fn pd_raw(&self) -> *mut ffi::ibv_pd {
        self.pd().as_raw()
    }
}

/// A memory window: a second rkey for a part of a registered region, which this process
/// grants to a peer and takes back, through its send queue, while the region stays
/// registered (`ibv_alloc_mw`).
///
/// # The life of a window
///
/// ```text
/// pd.alloc_mw(MwType::Type2)                 MemoryWindow   (unbound)
///   sq.bind_mw(MwBind::new(w, &region, range, access))
///     completion: MwDone::Bound(bound)       BoundWindow    bound.key(): the rkey a peer uses
///   sq.invalidate_mw(bound, id)              (or the peer's SendWr::send_inv, then
///     completion: MwDone::Unbound(w)          bound.invalidated_by(&receive_wc))
/// w.destroy()                                ibv_dealloc_mw (dropping it does the same)
/// ```
///
/// The window's queue is an [`MwSendQueue`] ([`QueuePair::mw_send_queue`]): the QP's one
/// send queue, which posts every other request too ([`MwRequest::Wr`]). A bind and an
/// invalidation take a ring slot and a `wr_id` of that queue like any request, and their
/// completions are matched like any other (type 1 binds too: `ibv_bind_mw` is handed the
/// queue's `wr_id` and posts on the same send queue). Each is always signaled, and its
/// completion hands the window back in its new state: a [`BoundWindow`] after a bind, a
/// [`MemoryWindow`] after an invalidation.
///
/// # What a window promises
///
/// - **No Rust reference to bytes a peer may write.** A window is bound only to a region
///   registered with `MW_BIND`, which the crate makes a [`RemoteWritable`] region: it
///   hands out no slices, only volatile copies and atomic words
///   ([`MemoryRegion::read_at`]), whether a window is bound or not. The same rule as a
///   region's own rkey, for the same reason.
/// - **The memory outlives every binding.** A bind holds the region (an `Arc`) in the ring
///   slot until its completion, and the window holds it while a binding may be live; it is
///   let go only after an invalidation completed (or a receive showed that the peer's
///   send with invalidate did), or after `ibv_dealloc_mw`. A failed bind or invalidation
///   keeps holding it: the window's state is then unknown, and deallocation is the way out.
/// - **The key ends with the binding.** [`BoundWindow::key`] borrows the bound window, and
///   an invalidation takes the window by value: no `WindowKey` survives the binding (a
///   compile-time check). The rkey's number is plain data once sent to a peer; after the
///   invalidation completes, the device refuses it (the peer's request fails with a remote
///   access error and no byte changes).
/// - **Misuse is refused before C** with an error naming the method: a window or region of
///   another protection domain than the QP's, a region without `MW_BIND`, a range outside
///   the region or empty, access rights a window cannot grant (or remote write and atomics
///   on a region without `LOCAL_WRITE`), a type 1 window in a posted batch or a local
///   invalidate of one, a UD QP.
///
/// Windows here are bound at virtual addresses (not zero-based), always signaled.
///
/// # Example
///
/// A type 2 window bound, written through by RDMA WRITE, and invalidated (a QP connected
/// to itself plays the peer):
///
#[doc = concat!("```no_run\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/device/doc/mw.rs")), "```")]
#[doc(alias = "ibv_mw")]
pub struct MemoryWindow {
    /// Deallocated first (in `teardown`), before `held` is let go.
    raw: ManuallyDrop<Owned<ffi::ibv_mw>>,
    /// The region a binding of this window may still reach.
    held: ManuallyDrop<Option<Arc<dyn WindowRegion>>>,
    pd: ProtectionDomain,
    ty: MwType,
}

// SAFETY: the C window may be used and deallocated from any thread (libibverbs verbs are
// thread-safe); the held region is Send + Sync.
unsafe impl Send for MemoryWindow {}
// SAFETY: &MemoryWindow only reads plain fields.
unsafe impl Sync for MemoryWindow {}

impl ProtectionDomain {
    /// Allocates a memory window of type `ty` in this protection domain (`ibv_alloc_mw`).
    ///
    /// A device without windows (`max_mw` 0, as siw) is refused before the call with
    /// [`Error::NotSupported`](crate::Error::NotSupported) naming
    /// [`Verb::PdAllocMw`](crate::Verb::PdAllocMw) and `max_mw`.
    #[doc(alias = "ibv_alloc_mw")]
    pub fn alloc_mw(&self, ty: MwType) -> Result<MemoryWindow> {
        if self.context().query_device()?.raw.max_mw <= 0 {
            return Err(Error::not_supported(
                Verb::PdAllocMw,
                "memory windows: the device's max_mw is 0 (ibv_query_device)",
            ));
        }
        // SAFETY: the PD is live (self).
        let raw = unsafe { ffi::ibv_alloc_mw(self.as_raw(), ty.to_c()) };
        // SAFETY: a new window that only this Owned deallocates.
        let raw = unsafe { Owned::new(raw, Verb::AllocMw)? };
        Ok(MemoryWindow { raw: ManuallyDrop::new(raw), held: ManuallyDrop::new(None), pd: self.clone(), ty })
    }
}

impl MemoryWindow {
    /// Its type.
    pub fn mw_type(&self) -> MwType {
        self.ty
    }

    /// The protection domain it was allocated in.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The raw window, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_mw {
        self.raw.as_ptr()
    }

    /// True when no binding of it may be live: after allocation, or after an invalidation
    /// completed. False after a failed bind or invalidation (the region is held until the
    /// window is deallocated).
    pub fn is_clear(&self) -> bool {
        self.held.is_none()
    }

    /// Deallocates now (`ibv_dealloc_mw`), which also ends any binding, and then lets the
    /// region go. If deallocation fails, the region is never let go (leaked: a binding
    /// might still reach it) and the error is returned.
    #[doc(alias = "ibv_dealloc_mw")]
    pub fn destroy(self) -> Result<()> {
        let mut me = ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so the teardown runs once and `pd` is read out once.
        unsafe {
            let result = me.teardown();
            drop(ptr::read(&me.pd));
            result
        }
    }

    /// Deallocates the window, then lets the held region go (or leaks it on failure).
    ///
    /// # Safety
    /// Once: `raw` and `held` are taken.
    unsafe fn teardown(&mut self) -> Result<()> {
        // SAFETY: the caller's contract.
        let (raw, held) = unsafe { (ManuallyDrop::take(&mut self.raw), ManuallyDrop::take(&mut self.held)) };
        match raw.destroy() {
            Ok(()) => {
                drop(held);
                Ok(())
            }
            Err(e) => {
                std::mem::forget(held);
                Err(e)
            }
        }
    }

    /// The rkey in the C window: the provider's after a type 1 bind, ours after a type 2
    /// bind completed (see `finish`).
    fn c_rkey(&self) -> u32 {
        // SAFETY: the window is live; only this window's owner writes the field.
        unsafe { (*self.as_raw()).rkey }
    }

    fn set_c_rkey(&mut self, rkey: u32) {
        // SAFETY: as above; &mut self.
        unsafe { (*self.as_raw()).rkey = rkey }
    }

    fn pd_id(&self) -> usize {
        self.pd.as_raw() as usize
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        // SAFETY: drop runs once.
        if let Err(e) = unsafe { self.teardown() } {
            log::error!("{e}; leaking the region the window may still reach");
        }
    }
}

impl fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("type", &self.ty)
            .field("rkey", &format_args!("{:#x}", self.c_rkey()))
            .field("clear", &self.is_clear())
            .finish()
    }
}

/// The C request of a type 2 bind, built in the request itself: the bind union is
/// the one part of a C request the queue's scratch requests never carry.
struct CRequest(ffi::ibv_send_wr);

// SAFETY: plain data and pointers to the window and region the same request owns.
unsafe impl Send for CRequest {}

/// A bind of a window to `range` of a region, granting `access`: what
/// [`SendQueue::bind_mw`] (or an [`MwRequest::Bind`] posted) takes.
#[doc(alias = "ibv_mw_bind", alias = "ibv_mw_bind_info")]
pub struct MwBind {
    window: MemoryWindow,
    region: Arc<dyn WindowRegion>,
    range: Range<usize>,
    access: AccessFlags,
    id: u64,
    /// A type 1 window's rkey before `ibv_bind_mw` moved it on (restored on failure).
    old_rkey: u32,
    c: CRequest,
}

impl MwBind {
    /// Binds `window` to `range` (offsets into the region) of `region`, granting `access`
    /// (`REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC`). The region must have been
    /// registered with `MW_BIND` (and `LOCAL_WRITE` for remote write or atomics).
    pub fn new<B>(
        window: MemoryWindow,
        region: &Arc<MemoryRegion<B, RemoteWritable>>,
        range: Range<usize>,
        access: AccessFlags,
    ) -> Self
    where
        B: RegisterableBuffer + Send + Sync + 'static,
        B::Parts: Send + Sync,
    {
        let region: Arc<dyn WindowRegion> = region.clone();
        let c = CRequest(zeroed_wr());
        MwBind { window, region, range, access, id: 0, old_rkey: 0, c }
    }

    /// The caller's identifier, handed back with the completion.
    pub fn id(mut self, id: u64) -> Self {
        self.id = id;
        self
    }

    /// The window back, out of a bind that was not posted.
    pub fn into_window(self) -> MemoryWindow {
        self.window
    }

    fn info(&self) -> ffi::ibv_mw_bind_info {
        ffi::ibv_mw_bind_info {
            mr: self.region.raw_mr(),
            addr: self.region.start() + self.range.start as u64,
            length: (self.range.end - self.range.start) as u64,
            mw_access_flags: self.access.bits(),
        }
    }
}

impl fmt::Debug for MwBind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MwBind")
            .field("window", &self.window)
            .field("range", &self.range)
            .field("access", &self.access)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// A bound window: the rkey a peer may use ([`key`](Self::key)) while it lives. Ends with
/// [`SendQueue::invalidate_mw`], with [`invalidated_by`](Self::invalidated_by) after the
/// peer's send with invalidate, or when dropped (deallocated, which ends the binding).
pub struct BoundWindow {
    window: MemoryWindow,
    remote: RemoteMr,
    access: AccessFlags,
    /// The QP whose send queue bound it (a type 2 window is tied to it).
    qp_num: u32,
}

/// What a peer needs to reach a bound window: borrowed from the [`BoundWindow`], so it
/// cannot be read after the window was handed to an invalidation.
#[derive(Clone, Copy, Debug)]
pub struct WindowKey<'w> {
    remote: RemoteMr,
    _bound: PhantomData<&'w BoundWindow>,
}

impl WindowKey<'_> {
    /// The window's rkey.
    pub fn rkey(&self) -> u32 {
        self.remote.rkey
    }

    /// The descriptor to send the peer (its address, length and the window's rkey): plain
    /// data, which the device refuses once the binding ended.
    pub fn remote(&self) -> RemoteMr {
        self.remote
    }
}

impl BoundWindow {
    /// The bound range and its rkey, for the peer, while the binding lasts.
    pub fn key(&self) -> WindowKey<'_> {
        WindowKey { remote: self.remote, _bound: PhantomData }
    }

    /// The rights granted.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The window's type.
    pub fn mw_type(&self) -> MwType {
        self.window.ty
    }

    /// The window back, unbound, once `wc` (a receive completion of the QP this window
    /// was bound on) shows that the peer's send with invalidate ended this binding: the
    /// receive succeeded, on that QP, and invalidated exactly this window's rkey. Anything
    /// else is refused, with the bound window back.
    #[allow(clippy::result_large_err)] // the window comes back by value
    pub fn invalidated_by(self, wc: &WorkCompletion) -> Result<MemoryWindow, Refused<BoundWindow>> {
        let verb = Verb::BoundWindowInvalidatedBy;
        let why = if self.window.ty == MwType::Type1 {
            Some("a type 1 window is never invalidated by a peer: SendQueue::invalidate_mw unbinds it".to_owned())
        } else if !wc.is_success() {
            Some(format!("the completion failed ({})", wc.status()))
        } else if wc.qp_num() != self.qp_num {
            Some(format!("the completion is of QP {:#x}; the window was bound on QP {:#x}", wc.qp_num(), self.qp_num))
        } else if invalidated_rkey(wc) != Some(self.remote.rkey) {
            Some(format!(
                "the completion invalidated {:?}, not this window's rkey {:#x}",
                invalidated_rkey(wc).map(|k| format!("{k:#x}")),
                self.remote.rkey
            ))
        } else {
            None
        };
        match why {
            Some(what) => Err(Refused::new(Error::invalid(verb, what), self)),
            None => {
                let mut window = self.window;
                // The device ended the binding: nothing reaches the region through this
                // window any more.
                *window.held = None;
                Ok(window)
            }
        }
    }

    /// Deallocates the window now, which ends the binding (`ibv_dealloc_mw`); see
    /// [`MemoryWindow::destroy`].
    #[doc(alias = "ibv_dealloc_mw")]
    pub fn destroy(self) -> Result<()> {
        self.window.destroy()
    }
}

impl fmt::Debug for BoundWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundWindow")
            .field("type", &self.window.ty)
            .field("addr", &format_args!("{:#x}", self.remote.addr))
            .field("len", &self.remote.len)
            .field("rkey", &format_args!("{:#x}", self.remote.rkey))
            .field("access", &self.access)
            .field("qp_num", &format_args!("{:#x}", self.qp_num))
            .finish()
    }
}

/// What an [`MwSendQueue`] posts: any [`SendWr`], a window bind, or a local invalidate.
#[derive(Debug)]
pub enum MwRequest<T: SendBuf> {
    /// An ordinary request (including [`SendWr::send_inv`]).
    Wr(SendWr<T>),
    /// A bind of a type 2 window (type 1 windows bind with [`SendQueue::bind_mw`]).
    Bind(MwBind),
    /// A local invalidate of a bound type 2 window, with the caller's id.
    LocalInv {
        /// The window.
        window: BoundWindow,
        /// The caller's identifier, handed back with the completion.
        id: u64,
    },
}

impl<T: SendBuf> From<SendWr<T>> for MwRequest<T> {
    fn from(wr: SendWr<T>) -> Self {
        MwRequest::Wr(wr)
    }
}

/// What a completion of an [`MwSendQueue`] hands back in [`Done::value`].
#[derive(Debug)]
pub enum MwDone<T> {
    /// The buffer of an ordinary request.
    Buf(T),
    /// The window after a successful bind, or after a failed invalidation (still bound,
    /// as far as this process knows).
    Bound(BoundWindow),
    /// The window after a successful invalidation (clear), or after a failed bind (not
    /// [`clear`](MemoryWindow::is_clear): the region is held until it is deallocated).
    Unbound(MemoryWindow),
}

impl<T> MwDone<T> {
    /// The buffer, for an ordinary request.
    pub fn into_buf(self) -> Option<T> {
        match self {
            MwDone::Buf(b) => Some(b),
            _ => None,
        }
    }

    /// The bound window, after a bind.
    pub fn into_bound(self) -> Option<BoundWindow> {
        match self {
            MwDone::Bound(w) => Some(w),
            _ => None,
        }
    }

    /// The unbound window, after an invalidation.
    pub fn into_unbound(self) -> Option<MemoryWindow> {
        match self {
            MwDone::Unbound(w) => Some(w),
            _ => None,
        }
    }
}

/// The send queue that also binds and invalidates windows: the QP's one send queue
/// ([`QueuePair::mw_send_queue`]).
pub type MwSendQueue<T> = SendQueue<T, MwRequest<T>>;

impl QueuePair {
    /// Takes the send side for [`MwRequest`]s (window binds and invalidations besides every
    /// [`SendWr`]), as deep as the `max_send_wr` the QP was built with. Fails as
    /// [`send_queue`](Self::send_queue) does.
    pub fn mw_send_queue<T: SendBuf>(&self) -> Result<MwSendQueue<T>> {
        self.send_queue_of(self.inner.asked_depth.0)
    }

    /// [`mw_send_queue`](Self::mw_send_queue) with room for `depth` outstanding requests.
    pub fn mw_send_queue_with_depth<T: SendBuf>(&self, depth: u32) -> Result<MwSendQueue<T>> {
        self.send_queue_of(depth)
    }
}

impl<T: SendBuf> SendQueue<T, MwRequest<T>> {
    /// Binds a window (`ibv_bind_mw` for type 1, with this queue's `wr_id`; a bind work
    /// request through `ibv_post_send` for type 2). Its completion hands back
    /// [`MwDone::Bound`], whose [`key`](BoundWindow::key) the peer uses. Refused before C
    /// (the bind comes back) as [`MemoryWindow`] lists.
    #[doc(alias = "ibv_bind_mw", alias = "ibv_wr_bind_mw", alias = "IBV_WR_BIND_MW", alias = "ibv_inc_rkey")]
    #[allow(clippy::result_large_err)] // the bind comes back by value
    pub fn bind_mw(&mut self, bind: MwBind) -> Result<(), Refused<MwBind>> {
        let back = |r: Refused<MwRequest<T>>| r.map(MwRequest::into_bind);
        if bind.window.ty == MwType::Type2 {
            return self.post_named(Verb::SendQueueBindMw, MwRequest::Bind(bind)).map_err(back);
        }
        let verb = Verb::SendQueueBindMwType1;
        if let Err(e) = check_bind(verb, self.limits(), &bind) {
            return Err(Refused::new(e, bind));
        }
        self.post_by(verb, MwRequest::Bind(bind), |qp, wr_id, req| {
            let MwRequest::Bind(b) = req else { unreachable!("bind_mw stages a bind") };
            b.old_rkey = b.window.c_rkey();
            let flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
            let mut mb = ffi::ibv_mw_bind { wr_id, send_flags: flags, bind_info: b.info() };
            // SAFETY: the QP, the window and the region's MR are live (the request, in its
            // ring slot until its completion, owns the window and holds the region), all in
            // the QP's PD (check_bind); `mb` is read during the call only.
            let rc = unsafe { ffi::ibv_bind_mw(qp, b.window.as_raw(), &mut mb) };
            conv::errno(Verb::BindMw, rc)
        })
        .map_err(back)
    }

    /// Ends a window's binding: a local invalidate (type 2, through `ibv_post_send`) or a
    /// bind of length 0 (type 1, through `ibv_bind_mw`). Its completion hands back
    /// [`MwDone::Unbound`]; from then on the device refuses the old rkey.
    #[doc(alias = "ibv_wr_local_inv", alias = "IBV_WR_LOCAL_INV")]
    #[allow(clippy::result_large_err)] // the window comes back by value
    pub fn invalidate_mw(&mut self, window: BoundWindow, id: u64) -> Result<(), Refused<BoundWindow>> {
        let back = |r: Refused<MwRequest<T>>| r.map(MwRequest::into_bound);
        if window.window.ty == MwType::Type2 {
            return self.post_named(Verb::SendQueueInvalidateMw, MwRequest::LocalInv { window, id }).map_err(back);
        }
        let verb = Verb::SendQueueInvalidateMwType1;
        if let Err(e) = check_inv(verb, self.limits(), &window) {
            return Err(Refused::new(e, window));
        }
        self.post_by(verb, MwRequest::LocalInv { window, id }, |qp, wr_id, req| {
            let MwRequest::LocalInv { window, .. } = req else { unreachable!("invalidate_mw stages an invalidate") };
            let flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
            // A bind of length 0 at the region's start (rxe reads the MR's lkey even then).
            let region = window.window.held.as_ref().map_or(ptr::null_mut(), |r| r.raw_mr());
            let info = ffi::ibv_mw_bind_info { mr: region, addr: window.remote.addr, length: 0, mw_access_flags: 0 };
            let mut mb = ffi::ibv_mw_bind { wr_id, send_flags: flags, bind_info: info };
            // SAFETY: the QP, the window and the region's MR are live (the request owns the
            // window, which holds the region); `mb` is read during the call only.
            let rc = unsafe { ffi::ibv_bind_mw(qp, window.window.as_raw(), &mut mb) };
            conv::errno(Verb::BindMw, rc)
        })
        .map_err(back)
    }
}

impl<T: SendBuf> MwRequest<T> {
    fn into_bind(self) -> MwBind {
        match self {
            MwRequest::Bind(b) => b,
            _ => unreachable!("a refused bind comes back as the bind it was"),
        }
    }

    fn into_bound(self) -> BoundWindow {
        match self {
            MwRequest::LocalInv { window, .. } => window,
            _ => unreachable!("a refused invalidation comes back as it was"),
        }
    }
}

/// The rkey a receive completion says the sender invalidated: `IBV_WC_WITH_INV`, or the
/// kernel's own bit for it as rxe writes it. rxe (Linux 6.1) copies its completion to user
/// space with the kernel's `IB_WC_WITH_INVALIDATE` (1 << 2), the bit libibverbs names
/// `IBV_WC_IP_CSUM_OK`, with the rkey in the union as usual. An IP checksum is never
/// reported for a receive of a connected QP without immediate data, so there the bit
/// says nothing else.
fn invalidated_rkey(wc: &WorkCompletion) -> Option<u32> {
    use crate::wc::WcFlags;
    let flags = wc.wc_flags();
    let rxe_bit = flags.contains(WcFlags::IP_CSUM_OK)
        && !flags.contains(WcFlags::WITH_IMM)
        && wc.opcode() == crate::codes::WcOpcode::Recv;
    if rxe_bit && !flags.contains(WcFlags::WITH_INV) {
        // SAFETY: both members of the union are a plain u32.
        return Some(unsafe { wc.as_raw().__bindgen_anon_1.invalidated_rkey });
    }
    wc.invalidated_rkey()
}

/// The checks of every bind, before C.
fn check_bind(verb: Verb, limits: &SendLimits, b: &MwBind) -> Result<()> {
    let rights = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    let len = b.region.length();
    let flags = b.region.flags();
    let what = if limits.ud {
        "windows are bound on connected QPs (RC, UC), not UD".to_owned()
    } else if b.window.pd_id() != limits.pd.0 {
        "the window was allocated in another protection domain than the QP's".to_owned()
    } else if b.region.pd_raw() as usize != b.window.pd_id() {
        "the region is registered in another protection domain than the window's".to_owned()
    } else if !flags.contains(AccessFlags::MW_BIND) {
        format!("the region was registered with {flags:?}, without MW_BIND: no window may be bound to it")
    } else if b.access.is_empty() || !rights.contains(b.access) {
        format!(
            "a window grants REMOTE_READ, REMOTE_WRITE or REMOTE_ATOMIC (at least one, nothing else), not {:?}",
            b.access
        )
    } else if b.access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
        && !flags.contains(AccessFlags::LOCAL_WRITE)
    {
        format!("remote write or atomics through a window need LOCAL_WRITE on the region, registered with {flags:?}")
    } else if b.range.start >= b.range.end || b.range.end as u64 > len {
        format!("range {:?} is empty or outside the region's {len} bytes", b.range)
    } else {
        return Ok(());
    };
    Err(Error::invalid(verb, what))
}

/// The checks of every invalidation, before C.
fn check_inv(verb: Verb, limits: &SendLimits, w: &BoundWindow) -> Result<()> {
    if w.window.pd_id() != limits.pd.0 {
        return Err(Error::invalid(verb, "the window was allocated in another protection domain than the QP's"));
    }
    Ok(())
}

/// A C send request with every field zero.
fn zeroed_wr() -> ffi::ibv_send_wr {
    // SAFETY: ibv_send_wr is plain C data (integers, pointers, unions of them), for which
    // all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

const SIGNALED: u32 = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;

impl<T: SendBuf> SendSealed for MwRequest<T> {}

impl<T: SendBuf> SendRequest for MwRequest<T> {
    type Back = MwDone<T>;

    // A bind's C request is built inside the request: where it is posted from.
    const BUILD_IN_SLOT: bool = true;

    fn check(&self, verb: Verb, limits: &SendLimits, key: u64, sges: &mut Sges, t: Token) -> Result<usize> {
        match self {
            MwRequest::Wr(wr) => wr.check(verb, limits, key, sges, t),
            MwRequest::Bind(b) if b.window.ty == MwType::Type1 => Err(Error::invalid(
                verb,
                "a type 1 window binds with SendQueue::bind_mw (ibv_bind_mw), not as a posted request",
            )),
            MwRequest::Bind(b) => check_bind(verb, limits, b).map(|()| 0),
            MwRequest::LocalInv { window, .. } if window.window.ty == MwType::Type1 => Err(Error::invalid(
                verb,
                "a type 1 window has no local invalidate: SendQueue::invalidate_mw unbinds it (a bind of length 0)",
            )),
            MwRequest::LocalInv { window, .. } => check_inv(verb, limits, window).map(|()| 0),
        }
    }

    fn c_request(
        &mut self,
        tag: u64,
        seq: u64,
        sges: &mut Sges,
        n: usize,
        out: &mut ffi::ibv_send_wr,
        t: Token,
    ) -> (*mut ffi::ibv_send_wr, *mut ffi::ibv_send_wr) {
        match self {
            MwRequest::Wr(wr) => wr.c_request(tag, seq, sges, n, out, t),
            MwRequest::Bind(b) => {
                // Built in the request itself, which the queue does not move between
                // building its C request and posting it.
                let info = b.info();
                let c = &mut b.c.0;
                c.next = ptr::null_mut();
                c.wr_id = wr_id(tag, seq);
                c.opcode = Op::BindMw.codes().wr;
                c.send_flags = SIGNALED;
                c.__bindgen_anon_2.bind_mw = ffi::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
                    mw: b.window.as_raw(),
                    rkey: ffi::ibv_inc_rkey(b.window.c_rkey()),
                    bind_info: info,
                };
                let c: *mut ffi::ibv_send_wr = c;
                (c, c)
            }
            MwRequest::LocalInv { window, .. } => {
                // Every field `classic` writes, and no other: the scratch request keeps its
                // bind and XRC unions zero.
                out.next = ptr::null_mut();
                out.wr_id = wr_id(tag, seq);
                out.sg_list = ptr::null_mut();
                out.num_sge = 0;
                out.send_flags = SIGNALED;
                out.opcode = Op::LocalInv.codes().wr;
                out.__bindgen_anon_1.invalidate_rkey = window.remote.rkey;
                out.wr = zeroed_wr().wr;
                let out: *mut ffi::ibv_send_wr = out;
                (out, out)
            }
        }
    }

    fn ext_takes(&self, ext: Ext, n: usize, t: Token) -> bool {
        match self {
            MwRequest::Wr(wr) => wr.ext_takes(ext, n, t),
            MwRequest::Bind(_) => ext.is_some_and(|(_, ops)| ops.contains(Op::BindMw.codes().ops)),
            MwRequest::LocalInv { .. } => ext.is_some_and(|(_, ops)| ops.contains(Op::LocalInv.codes().ops)),
        }
    }

    unsafe fn extended(&self, qpx: *mut ffi::ibv_qp_ex, id: u64, sges: &Sges, n: usize, t: Token) {
        // SAFETY: the caller's contract: `qpx` is the queue's extended QP inside
        // `ibv_wr_start`, and `ext_takes` held (its send ops include this operation); the
        // window and the region's MR are live (this request owns and holds them), and
        // `info` is read during the call only.
        unsafe {
            match self {
                MwRequest::Wr(wr) => wr.extended(qpx, id, sges, n, t),
                MwRequest::Bind(b) => {
                    (*qpx).wr_id = id;
                    (*qpx).wr_flags = SIGNALED;
                    let info = b.info();
                    ffi::ibv_wr_bind_mw(qpx, b.window.as_raw(), ffi::ibv_inc_rkey(b.window.c_rkey()), &info);
                }
                MwRequest::LocalInv { window, .. } => {
                    (*qpx).wr_id = id;
                    (*qpx).wr_flags = SIGNALED;
                    ffi::ibv_wr_local_inv(qpx, window.remote.rkey);
                }
            }
        }
    }

    unsafe fn finish(slot: &mut MaybeUninit<Self>, end: End, _: Token) -> Done<MwDone<T>> {
        // SAFETY: the caller's contract: `slot` holds a request, read out here once.
        let req = unsafe { slot.assume_init_read() };
        let ok = end.status == WcStatus::Success;
        match req {
            MwRequest::Wr(wr) => {
                let (id, op) = (wr.id, wr.op.codes().wc);
                end.done(id, op, MwDone::Buf(wr.into_buf()))
            }
            MwRequest::Bind(b) => {
                let MwBind { mut window, region, range, access, id, old_rkey, c: _ } = b;
                let addr = region.start() + range.start as u64;
                if ok {
                    let rkey = match window.ty {
                        // The provider moved the C window's rkey on when it posted the bind.
                        MwType::Type1 => window.c_rkey(),
                        // The device took the new key: the next bind and the provider's
                        // checks start from it.
                        MwType::Type2 => {
                            let new = ffi::ibv_inc_rkey(window.c_rkey());
                            window.set_c_rkey(new);
                            new
                        }
                    };
                    // The window now reaches this region (a previous one is let go: a
                    // bind replaces the binding).
                    *window.held = Some(region);
                    let remote = RemoteMr { addr, len: (range.end - range.start) as u64, rkey };
                    let qp_num = end.qp_num;
                    let bound = BoundWindow { window, remote, access, qp_num };
                    end.done(id, Op::BindMw.codes().wc, MwDone::Bound(bound))
                } else {
                    if window.ty == MwType::Type1 {
                        // rxe: "user has to undo this if he gets an error wc".
                        window.set_c_rkey(old_rkey);
                    }
                    // What the window may reach is unknown: hold the region until dealloc.
                    if window.held.is_none() {
                        *window.held = Some(region);
                    }
                    end.done(id, Op::BindMw.codes().wc, MwDone::Unbound(window))
                }
            }
            MwRequest::LocalInv { window, id } => {
                // A type 1 window's is a bind of length 0.
                let op =
                    if window.window.ty == MwType::Type1 { Op::BindMw.codes().wc } else { Op::LocalInv.codes().wc };
                if ok {
                    let BoundWindow { mut window, .. } = window;
                    // The device ended the binding: nothing reaches the region through
                    // this window any more.
                    *window.held = None;
                    end.done(id, op, MwDone::Unbound(window))
                } else {
                    let mut bound = window;
                    if bound.window.ty == MwType::Type1 {
                        let rkey = bound.remote.rkey;
                        bound.window.set_c_rkey(rkey);
                    }
                    end.done(id, op, MwDone::Bound(bound))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(flags: u32, opcode: ffi::ibv_wc_opcode, union: u32) -> WorkCompletion {
        // SAFETY: all-zero is a valid ibv_wc.
        let mut raw: ffi::ibv_wc = unsafe { std::mem::zeroed() };
        raw.opcode = opcode;
        raw.wc_flags = flags;
        raw.__bindgen_anon_1.invalidated_rkey = union;
        // SAFETY: never handed to a queue.
        unsafe { WorkCompletion::from_raw(raw) }
    }

    #[test]
    fn a_receive_names_the_invalidated_rkey_by_the_verbs_bit_or_the_bit_rxe_writes() {
        use ffi::ibv_wc_flags as F;
        let recv = ffi::ibv_wc_opcode::IBV_WC_RECV;
        assert_eq!(invalidated_rkey(&wc(F::IBV_WC_WITH_INV.0, recv, 0x1234)), Some(0x1234));
        // rxe (Linux 6.1): the kernel's IB_WC_WITH_INVALIDATE, which is IBV_WC_IP_CSUM_OK here.
        assert_eq!(invalidated_rkey(&wc(F::IBV_WC_IP_CSUM_OK.0, recv, 0x1234)), Some(0x1234));
        // Not with immediate data (the union is the immediate), nor on a completion of a send.
        let imm = F::IBV_WC_IP_CSUM_OK.0 | F::IBV_WC_WITH_IMM.0;
        assert_eq!(invalidated_rkey(&wc(imm, recv, 0x1234)), None);
        assert_eq!(invalidated_rkey(&wc(F::IBV_WC_IP_CSUM_OK.0, ffi::ibv_wc_opcode::IBV_WC_SEND, 7)), None);
        assert_eq!(invalidated_rkey(&wc(0, recv, 0x1234)), None);
    }

    #[test]
    fn window_types_and_operations_map_to_their_c_values() {
        assert_eq!(MwType::Type1.to_c().0, ffi::ibv_mw_type::IBV_MW_TYPE_1.0);
        assert_eq!(MwType::Type2.to_c().0, ffi::ibv_mw_type::IBV_MW_TYPE_2.0);
        assert_eq!(Op::BindMw.codes().wc, crate::codes::WcOpcode::BindMw);
        assert_eq!(Op::LocalInv.codes().wr.0, ffi::ibv_wr_opcode::IBV_WR_LOCAL_INV.0);
        assert_eq!(Op::SendInv.codes().wr.0, ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_INV.0);
    }
}
