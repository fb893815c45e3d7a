//! Memory regions (`struct ibv_mr`): memory the device may read and write.
//!
//! What a region is, who may write its memory and how Rust may look at it, the access
//! rule and ownership: [`MemoryRegion`]'s documentation (public; this module is not).

use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::Owned;
use crate::pd::ProtectionDomain;
use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::{Bound, Range, RangeBounds};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

mod access;
mod buffer;
mod import;
mod iova;
mod odp;
mod rereg;
mod special;

use access::effective_access;
pub(crate) use access::remote_descriptor;
pub use access::{AccessFlags, AccessMode, Local, RemoteWritable};
pub use buffer::{page_size, AlignedBuf, RegisterableBuffer};
pub use import::ImportedRegion;
use iova::check_iova;
pub use odp::Advice;
pub use rereg::ReregError;
pub use special::{DmabufRegion, NullRegion};

/// What a peer needs to target a region with RDMA READ, WRITE or atomics: its remote
/// address, length and rkey. Plain data; [`to_bytes`](RemoteMr::to_bytes) and
/// [`from_bytes`](RemoteMr::from_bytes) give a fixed wire layout for the exchange.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteMr {
    /// The address the peer puts in its work request (`wr.rdma.remote_addr`).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The remote key (`wr.rdma.rkey`).
    pub rkey: u32,
}

crate::debug_hex::debug_hex!(RemoteMr { addr: hex, len, rkey: hex });

impl RemoteMr {
    /// A part of the region (offsets from its start), for a work request that targets
    /// only that part. Out-of-range or reversed ranges are errors.
    pub fn slice(&self, range: impl RangeBounds<u64>) -> Result<RemoteMr> {
        let r = resolve(Verb::RemoteSlice, range.start_bound().cloned(), range.end_bound().cloned(), self.len)?;
        Ok(RemoteMr { addr: self.addr + r.start, len: r.end - r.start, rkey: self.rkey })
    }
}

/// `start..end` of a range over `len` bytes, checked.
fn resolve(verb: Verb, start: Bound<u64>, end: Bound<u64>, len: u64) -> Result<Range<u64>> {
    let s = match start {
        Bound::Included(s) => Some(s),
        Bound::Excluded(s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let e = match end {
        Bound::Included(e) => e.checked_add(1),
        Bound::Excluded(e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    match (s, e) {
        (Some(s), Some(e)) if s <= e && e <= len => Ok(s..e),
        _ => Err(Error::invalid(verb, format!("range {start:?}..{end:?} is not within the region's {len} bytes"))),
    }
}

fn usize_bound(b: Bound<&usize>) -> Bound<u64> {
    match b {
        Bound::Included(&v) => Bound::Included(v as u64),
        Bound::Excluded(&v) => Bound::Excluded(v as u64),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// A registered memory region holding buffer `B`; `A` ([`Local`] or [`RemoteWritable`])
/// says whether peers may write it, and so which views of the bytes it gives.
///
/// Create one with [`ProtectionDomain::register`], [`ProtectionDomain::register_slice`] or
/// [`ProtectionDomain::register_remote_writable`].
///
/// A [`MemoryRegion`] registers a buffer with a [`ProtectionDomain`] and owns it (an
/// [`AlignedBuf`], a `Vec<u8>`, a `Box<[u8]>`) or borrows it (`&'a mut [u8]`, which ties
/// the region to the slice's lifetime). The buffer is deregistered before it is freed,
/// and [`MemoryRegion::destroy`] gives it back with its contents.
///
/// # Who may write the memory, and how Rust may look at it
///
/// Rust may hand out `&[u8]` only for memory nobody writes while the reference lives, and
/// `&mut [u8]` only for memory nobody else touches at all. The device is invisible to the
/// compiler, so the access flags decide which views are sound:
///
/// - **[`Local`] regions** (the default: [`AccessFlags::LOCAL_WRITE`], optionally
///   [`AccessFlags::REMOTE_READ`]). The device writes such memory only when this process
///   asks it to: a receive, the response to an RDMA READ, the result of an atomic. Those
///   writes start from work requests posted here, so the data path can keep Rust
///   references away from the memory until the completion (that is its job: posting is
///   where the borrow is taken). A peer may *read* the memory at any time with
///   `REMOTE_READ`; reading does not disturb Rust. So a local region gives
///   [`as_slice`](MemoryRegion::as_slice) and, with `&mut self`,
///   [`as_mut_slice`](MemoryRegion::as_mut_slice).
/// - **[`RemoteWritable`] regions** (`REMOTE_WRITE`, `REMOTE_ATOMIC`, `MW_BIND` or a bit
///   this crate does not know). A peer that holds the rkey may write the memory at any
///   moment, with no action of this process: a plain reference would let the compiler
///   assume bytes that the NIC is changing stay put (cache them, merge or re-order reads,
///   invent reads). Such a region has no `as_slice`. It offers instead
///   [`read_at`](MemoryRegion::read_at) and [`write_at`](MemoryRegion::write_at), which
///   copy through accesses the compiler must perform as written (atomic loads, volatile
///   stores: the tools Rust has for memory changed outside the program), and
///   [`atomic_u64`](MemoryRegion::atomic_u64), an `&AtomicU64` view of an aligned word,
///   the natural type for the target of a peer's fetch-and-add or compare-and-swap.
///   Aligned 8-byte words are read in one load, so a word a peer updates atomically is
///   never seen torn.
///
/// When are a peer's writes complete? The RDMA WRITE itself produces no completion at
/// the target. The peer must tell: typically it follows its WRITEs with a SEND or a
/// WRITE with immediate on the same QP, and the receive completion for that message
/// orders the earlier WRITEs before it. After such a completion, and while the protocol
/// guarantees the peer writes no more, the bytes are stable: `read_at` reads them, and a
/// program that can promise this for the time of a borrow may use the unsafe
/// [`as_slice_unchecked`](MemoryRegion::as_slice_unchecked).
///
/// `MW_BIND` counts as remote-writable because a memory window bound to the region may
/// grant remote write. Bits this crate does not name are kept and passed to the device,
/// but only for remote-writable regions: an unknown bit might grant remote write.
///
/// # Access rule: remote write and atomics need local write
///
/// The verbs reject `REMOTE_WRITE` or `REMOTE_ATOMIC` without `LOCAL_WRITE` (EINVAL).
/// Asking for them states the intent unambiguously, so registration adds `LOCAL_WRITE`
/// itself; [`MemoryRegion::access`] reports the flags actually registered.
///
/// # Ownership
///
/// A region holds a clone of its protection domain (which holds the context), so it may
/// outlive the handles it was created from. The C region is deregistered first, then the
/// buffer is freed (or the borrow released), then the PD reference is dropped. If
/// deregistration fails, the device may still use the buffer: it is leaked, not freed,
/// and the error is logged (or returned by `destroy`).
pub struct MemoryRegion<B: RegisterableBuffer, A: AccessMode = Local> {
    /// The C region. Deregistered in `drop`/`destroy` before the buffer is rebuilt and
    /// freed and before `pd` is released.
    raw: ManuallyDrop<Owned<ffi::ibv_mr>>,
    pd: ProtectionDomain,
    ptr: NonNull<u8>,
    len: usize,
    parts: ManuallyDrop<B::Parts>,
    lkey: u32,
    rkey: u32,
    /// The address the device knows the first byte by: `ptr`, or the I/O virtual address
    /// the region was registered at ([`ProtectionDomain::register_at_iova`]).
    iova: u64,
    access: AccessFlags,
    _buf: PhantomData<(B, fn() -> A)>,
}

// SAFETY: the region owns B (or B's exclusive borrow) the way B itself does, so it may
// move to another thread when B and its parts may. The C region and the PD may be used
// and deregistered from any thread (libibverbs verbs are thread-safe).
unsafe impl<B: RegisterableBuffer + Send, A: AccessMode> Send for MemoryRegion<B, A> where B::Parts: Send {}
// SAFETY: &MemoryRegion gives &[u8] (local regions), or atomic loads and `&AtomicU64`
// (remote-writable regions), all of which may be shared between threads when B may be.
unsafe impl<B: RegisterableBuffer + Sync, A: AccessMode> Sync for MemoryRegion<B, A> where B::Parts: Sync {}

impl ProtectionDomain {
    /// Registers `buf` for local use, and for remote reads when `access` has
    /// `REMOTE_READ` (`ibv_reg_mr`). Flags that let peers write (`REMOTE_WRITE`,
    /// `REMOTE_ATOMIC`, `MW_BIND`, unknown bits) are rejected: use
    /// [`register_remote_writable`](Self::register_remote_writable) for those.
    ///
    /// A zero-length buffer or one longer than the device's `max_mr_size` is an
    /// [`Error::InvalidArgument`]. On error an owned buffer is dropped.
    #[doc(alias = "ibv_reg_mr")]
    pub fn register<B: RegisterableBuffer>(&self, buf: B, access: AccessFlags) -> Result<MemoryRegion<B, Local>> {
        MemoryRegion::new(self, buf, access)
    }

    /// Registers a borrowed slice for local use (see [`register`](Self::register)); the
    /// region cannot outlive the borrow.
    #[doc(alias = "ibv_reg_mr")]
    pub fn register_slice<'a>(
        &self,
        buf: &'a mut [u8],
        access: AccessFlags,
    ) -> Result<MemoryRegion<&'a mut [u8], Local>> {
        MemoryRegion::new(self, buf, access)
    }

    /// Registers `buf` so that peers may write it (`REMOTE_WRITE`), update it atomically
    /// (`REMOTE_ATOMIC`), or bind windows to it (`MW_BIND`). `LOCAL_WRITE` is added when
    /// remote write or atomics are asked for. The region gives volatile copies and atomic
    /// words instead of slices (see [`MemoryRegion`]).
    #[doc(alias = "ibv_reg_mr")]
    pub fn register_remote_writable<B: RegisterableBuffer>(
        &self,
        buf: B,
        access: AccessFlags,
    ) -> Result<MemoryRegion<B, RemoteWritable>> {
        MemoryRegion::new(self, buf, access)
    }
}

impl<B: RegisterableBuffer, A: AccessMode> MemoryRegion<B, A> {
    /// Registers `buf` in `pd` with mode `A` (`ibv_reg_mr`). The `register*` methods of
    /// [`ProtectionDomain`] call this; it exists for code generic over the mode.
    #[doc(alias = "ibv_reg_mr")]
    pub fn new(pd: &ProtectionDomain, buf: B, access: AccessFlags) -> Result<Self> {
        Self::new_at(pd, buf, access, None)
    }

    /// [`new`](Self::new), at `iova` when given (`ibv_reg_mr_iova`).
    fn new_at(pd: &ProtectionDomain, buf: B, access: AccessFlags, iova: Option<u64>) -> Result<Self> {
        let (ptr, len, parts) = buf.disassemble();
        match Self::register_raw(pd, ptr, len, access, iova) {
            Ok((raw, access)) => {
                // SAFETY: `raw` is the live region ibv_reg_mr just returned.
                let (lkey, rkey) = unsafe { ((*raw.as_ptr()).lkey, (*raw.as_ptr()).rkey) };
                Ok(MemoryRegion {
                    raw: ManuallyDrop::new(raw),
                    pd: pd.clone(),
                    ptr,
                    len,
                    parts: ManuallyDrop::new(parts),
                    lkey,
                    rkey,
                    iova: iova.unwrap_or(ptr.as_ptr() as u64),
                    access,
                    _buf: PhantomData,
                })
            }
            Err(e) => {
                // SAFETY: the parts just taken from `buf`, given back once; the device
                // never saw the memory.
                drop(unsafe { B::reassemble(ptr, len, parts) });
                Err(e)
            }
        }
    }

    fn register_raw(
        pd: &ProtectionDomain,
        ptr: NonNull<u8>,
        len: usize,
        access: AccessFlags,
        iova: Option<u64>,
    ) -> Result<(Owned<ffi::ibv_mr>, AccessFlags)> {
        let access = effective_access::<A>(access)?;
        if len == 0 {
            return Err(Error::invalid(Verb::RegMr, "a memory region cannot be empty (length 0)"));
        }
        let max = pd.context().query_device()?.max_mr_size;
        check_len(len, max)?;
        odp::check_access(pd, access)?;
        // Every bit is kept: the C parameter is an int holding the flag bits.
        let bits = access.bits() as std::ffi::c_int;
        let (raw, verb) = match iova {
            // SAFETY: the PD is live; `ptr` addresses `len` bytes that stay allocated and
            // are reached only through the region until it is deregistered (the
            // RegisterableBuffer contract).
            None => (unsafe { ffi::ibv_reg_mr(pd.as_raw(), ptr.as_ptr().cast(), len, bits) }, Verb::RegMr),
            Some(iova) => {
                check_iova(iova, len, ptr.as_ptr() as u64)?;
                // SAFETY: as for ibv_reg_mr; the I/O virtual address is a number the
                // device translates, it points at nothing of ours.
                (unsafe { ffi::ibv_reg_mr_iova(pd.as_raw(), ptr.as_ptr().cast(), len, iova, bits) }, Verb::RegMrIova)
            }
        };
        // SAFETY: a new region that only this Owned deregisters.
        let raw = unsafe { Owned::new(raw, verb)? };
        Ok((raw, access))
    }

    /// The local key, for scatter/gather entries of local work requests.
    #[inline]
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key that peers put in RDMA work requests.
    #[inline]
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The address the device knows the first byte by: the start address of the memory,
    /// or, for a region registered with
    /// [`register_at_iova`](ProtectionDomain::register_at_iova), that I/O virtual address.
    /// Scatter/gather entries and [`remote`](Self::remote) use it; [`as_ptr`](Self::as_ptr)
    /// is where the bytes are in this process.
    #[inline]
    pub fn addr(&self) -> u64 {
        self.iova
    }

    /// The length in bytes (never zero).
    #[inline]
    #[allow(clippy::len_without_is_empty)] // registration rejects zero lengths
    pub fn len(&self) -> usize {
        self.len
    }

    /// The flags actually registered (with `LOCAL_WRITE` added where needed).
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The protection domain the region belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The raw region, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_mr {
        self.raw.as_ptr()
    }

    /// The start of the memory as a raw pointer (like `Cell::as_ptr`). Accessing the
    /// memory through it is subject to the rules in [`MemoryRegion`]'s documentation.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The descriptor a peer needs to target this region with RDMA READ, WRITE or atomics.
    ///
    /// Fails with [`Error::InvalidArgument`] naming [`Verb::MrRemote`] when the region
    /// grants no remote access ([`AccessFlags::is_remote_accessible`]: a local-only region,
    /// or `MW_BIND` alone): the device would refuse every request through its rkey.
    pub fn remote(&self) -> Result<RemoteMr> {
        remote_descriptor(Verb::MrRemote, self.addr(), self.len as u64, self.rkey, self.access)
    }

    /// A scatter/gather entry (address, length, lkey) for `range` of the region, checked
    /// against the region's bounds and the 32-bit SGE length. An empty range is allowed
    /// (zero-length messages exist).
    ///
    /// The entry is plain data: building it grants nothing. Posting a work request that
    /// lets the device write the range (a receive, an RDMA READ, an atomic) is what the
    /// data path must guard, keeping Rust references to those bytes away until the
    /// completion.
    #[inline]
    pub fn sge(&self, range: impl RangeBounds<usize>) -> Result<ffi::ibv_sge> {
        let r =
            resolve(Verb::MrSge, usize_bound(range.start_bound()), usize_bound(range.end_bound()), self.len as u64)?;
        let length = u32::try_from(r.end - r.start).map_err(|_| {
            Error::invalid(Verb::MrSge, format!("{} bytes exceed a scatter/gather entry's 4 GiB", r.end - r.start))
        })?;
        Ok(ffi::ibv_sge { addr: self.addr() + r.start, length, lkey: self.lkey })
    }

    /// Deregisters now (`ibv_dereg_mr`) and gives the buffer back with its contents. If
    /// deregistration fails, the device may still use the buffer, so it is leaked (never
    /// freed) and the error returned.
    #[doc(alias = "ibv_dereg_mr", alias = "into_inner")]
    pub fn destroy(self) -> Result<B> {
        let mut me = ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so each field is taken out exactly once here.
        let (raw, pd, parts) =
            unsafe { (ManuallyDrop::take(&mut me.raw), ptr::read(&me.pd), ManuallyDrop::take(&mut me.parts)) };
        let result = raw.destroy().map(|()| {
            // SAFETY: deregistered, so the device no longer uses the memory; these are
            // the parts of the buffer registered, given back once.
            unsafe { B::reassemble(me.ptr, me.len, parts) }
        });
        drop(pd);
        result
    }

    fn check_span(&self, verb: Verb, offset: usize, n: usize) -> Result<()> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::invalid(
                verb,
                format!("{n} bytes at offset {offset} are not within the region's {} bytes", self.len),
            )),
        }
    }
}

impl<B: RegisterableBuffer, A: AccessMode> Drop for MemoryRegion<B, A> {
    fn drop(&mut self) {
        // SAFETY: drop runs once; `raw` and `parts` are not used after being taken.
        let raw = unsafe { ManuallyDrop::take(&mut self.raw) };
        match raw.destroy() {
            Ok(()) => {
                // SAFETY: deregistered, so the device no longer uses the memory; the parts
                // of the registered buffer, given back once.
                drop(unsafe { B::reassemble(self.ptr, self.len, ManuallyDrop::take(&mut self.parts)) });
            }
            Err(e) => log::error!("{e}; leaking the {}-byte buffer, which the device may still use", self.len),
        }
        // `pd` is dropped after this, releasing the PD only once the region is gone.
    }
}

impl<B: RegisterableBuffer> MemoryRegion<B, Local> {
    /// The bytes. No peer may write a local region, and the data path keeps this
    /// borrow away from memory it has asked the device to write.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` initialized bytes reached only through this region, which no
        // peer may write (see the module documentation).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice; &mut self makes the access exclusive on the Rust side,
        // and a peer reading (REMOTE_READ) does not disturb it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<B: RegisterableBuffer> MemoryRegion<B, RemoteWritable> {
    /// Copies `dst.len()` bytes from `offset` into `dst`, with loads the compiler must
    /// perform as written (a peer may be writing). Aligned 8-byte words are read in one
    /// load each, so a word updated by a remote atomic is never torn.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_span(Verb::MrReadAt, offset, dst.len())?;
        // SAFETY: the span is inside the region, which stays valid while `self` is
        // borrowed; Rust code reaches remote-writable memory only through same-size
        // atomics (read_at, atomic_u64) or with &mut self.
        unsafe { copy_out(self.ptr.as_ptr(), self.len, offset, dst) };
        Ok(())
    }

    /// Copies `src` into the region at `offset` with volatile stores. `&mut self` keeps
    /// every other Rust access (including [`atomic_u64`](Self::atomic_u64) views) away
    /// for the duration; a peer writing the same bytes at the same time wins or loses
    /// byte by byte, as on any shared memory.
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.check_span(Verb::MrWriteAt, offset, src.len())?;
        // SAFETY: the span is inside the region; &mut self excludes every other Rust
        // access for the duration.
        unsafe { copy_in(self.ptr.as_ptr(), offset, src) };
        Ok(())
    }

    /// The 8-byte word at `offset` as an atomic: the target type for a peer's
    /// fetch-and-add or compare-and-swap (`REMOTE_ATOMIC`). The word's address must be
    /// 8-byte aligned, as RDMA atomics require; offsets that are not, or that reach past
    /// the region, are errors. Values are in host byte order, as the device reads and
    /// writes them.
    pub fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64> {
        self.check_span(Verb::MrAtomicU64, offset, 8)?;
        // SAFETY: offset is within the region (checked span).
        let p = unsafe { self.ptr.as_ptr().add(offset) };
        if (p as usize) % 8 != 0 {
            return Err(Error::invalid(
                Verb::MrAtomicU64,
                format!("address {p:p} (offset {offset}) is not 8-byte aligned, as atomics require"),
            ));
        }
        // SAFETY: 8 aligned bytes inside the region, valid while `self` is borrowed.
        // Rust code reaches them only through same-size atomics while this borrow lives
        // (read_at uses 8-byte loads on whole words; write_at needs &mut self).
        Ok(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }

    /// The bytes as a plain slice, for parsing data once a peer is known to be done.
    ///
    /// # Safety
    /// While the borrow lives, nothing may write the region: no peer may have an RDMA
    /// WRITE or atomic to it in flight or start one (for example, the protocol says the
    /// peer writes no more after the message whose completion was just received), and no
    /// other thread may store through an [`atomic_u64`](Self::atomic_u64) view.
    pub unsafe fn as_slice_unchecked(&self) -> &[u8] {
        // SAFETY: initialized bytes inside the region; the caller guarantees no writer.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes as a plain mutable slice.
    ///
    /// # Safety
    /// While the borrow lives, no peer may write the region or run atomics on it (see
    /// [`as_slice_unchecked`](Self::as_slice_unchecked)).
    pub unsafe fn as_mut_slice_unchecked(&mut self) -> &mut [u8] {
        // SAFETY: initialized bytes inside the region; &mut self excludes Rust accesses
        // and the caller guarantees no peer writes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// Copies `dst.len()` bytes at `offset` of the region `base..base + len` into `dst`:
/// one atomic 8-byte load for each aligned word that lies wholly inside the region,
/// atomic byte loads for the bytes of words that stick out of it (which
/// [`MemoryRegion::atomic_u64`] never covers, so no location is accessed atomically with
/// two sizes).
///
/// # Safety
/// `base..base + len` must be valid for reads and `offset + dst.len() <= len`; while this
/// runs, Rust code may access the region only through atomics of the same sizes.
unsafe fn copy_out(base: *mut u8, len: usize, offset: usize, dst: &mut [u8]) {
    let start = base as usize;
    let end = start + len;
    let mut addr = start + offset;
    let mut i = 0;
    while i < dst.len() {
        let word = addr & !7;
        if word >= start && word + 8 <= end {
            let skip = addr - word;
            let n = (8 - skip).min(dst.len() - i);
            // SAFETY: an aligned word inside the region; the caller rules out non-atomic
            // or other-size Rust accesses, and the device is outside the memory model.
            let v = unsafe { AtomicU64::from_ptr(base.add(word - start).cast::<u64>()) }.load(Ordering::Relaxed);
            dst[i..i + n].copy_from_slice(&v.to_ne_bytes()[skip..skip + n]);
            i += n;
            addr += n;
        } else {
            // SAFETY: a byte inside the region, as above.
            dst[i] = unsafe { AtomicU8::from_ptr(base.add(addr - start)) }.load(Ordering::Relaxed);
            i += 1;
            addr += 1;
        }
    }
}

/// Copies `src` to `base + offset` with volatile stores (8 bytes at a time where aligned).
///
/// # Safety
/// `base + offset .. + src.len()` must be valid for writes, with no other Rust access to
/// it while this runs.
unsafe fn copy_in(base: *mut u8, offset: usize, src: &[u8]) {
    // SAFETY: within the span the caller vouches for.
    let mut p = unsafe { base.add(offset) };
    let mut rest = src;
    while !rest.is_empty() {
        if (p as usize) % 8 == 0 && rest.len() >= 8 {
            let mut w = [0u8; 8];
            w.copy_from_slice(&rest[..8]);
            // SAFETY: 8 aligned bytes inside the span; no concurrent Rust access.
            unsafe { ptr::write_volatile(p.cast::<u64>(), u64::from_ne_bytes(w)) };
            rest = &rest[8..];
            // SAFETY: still within the span or one past its end.
            p = unsafe { p.add(8) };
        } else {
            // SAFETY: one byte inside the span; no concurrent Rust access.
            unsafe { ptr::write_volatile(p, rest[0]) };
            rest = &rest[1..];
            // SAFETY: still within the span or one past its end.
            p = unsafe { p.add(1) };
        }
    }
}

/// Rejects lengths above the device's largest region.
fn check_len(len: usize, max_mr_size: u64) -> Result<()> {
    if len as u64 > max_mr_size {
        return Err(Error::invalid(Verb::RegMr, format!("{len} bytes exceed the device's max_mr_size {max_mr_size}")));
    }
    Ok(())
}

impl<B: RegisterableBuffer, A: AccessMode> fmt::Debug for MemoryRegion<B, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("access", &self.access)
            .field("remote_writable", &A::REMOTE_WRITABLE)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_access_is_local_write_only() {
        assert_eq!(AccessFlags::default(), AccessFlags::LOCAL_WRITE);
        assert!(!AccessFlags::default().is_remote_writable());
        assert!(!(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ).is_remote_writable());
    }

    #[test]
    fn flag_values_come_from_the_c_enum() {
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 8);
        assert_eq!(AccessFlags::RELAXED_ORDERING.bits(), 1 << 20);
    }

    #[test]
    fn unknown_bits_are_kept_and_count_as_remote_writable() {
        let f = AccessFlags::from_bits_retain(1 << 15) | AccessFlags::LOCAL_WRITE;
        assert_eq!(f.bits(), (1 << 15) | 1);
        assert!(f.is_remote_writable());
    }

    #[test]
    fn local_mode_rejects_remote_write_atomic_and_window_binding() {
        for f in [AccessFlags::REMOTE_WRITE, AccessFlags::REMOTE_ATOMIC, AccessFlags::MW_BIND] {
            let e = effective_access::<Local>(AccessFlags::LOCAL_WRITE | f).unwrap_err();
            let text = e.to_string();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{text}");
            assert!(text.contains("register_remote_writable"), "{text}");
        }
        let e = effective_access::<Local>(AccessFlags::from_bits_retain(1 << 15)).unwrap_err();
        assert!(e.to_string().contains("unknown bits 0x8000"), "{e}");
    }

    #[test]
    fn remote_write_and_atomic_get_local_write_added() {
        let f = effective_access::<RemoteWritable>(AccessFlags::REMOTE_WRITE).unwrap();
        assert_eq!(f, AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE);
        let f = effective_access::<RemoteWritable>(AccessFlags::REMOTE_ATOMIC).unwrap();
        assert_eq!(f, AccessFlags::REMOTE_ATOMIC | AccessFlags::LOCAL_WRITE);
        // Nothing to add for local or read-only access.
        let f = effective_access::<Local>(AccessFlags::REMOTE_READ).unwrap();
        assert_eq!(f, AccessFlags::REMOTE_READ);
    }

    #[test]
    fn length_above_max_mr_size_is_rejected_naming_the_limit() {
        assert!(check_len(4096, 4096).is_ok());
        let e = check_len(4097, 4096).unwrap_err();
        assert!(e.to_string().contains("max_mr_size 4096"), "{e}");
    }

    #[test]
    fn only_regions_with_a_remote_right_hand_out_a_remote_descriptor() {
        let refused = |access: AccessFlags| {
            let e = remote_descriptor(Verb::MrRemote, 0x1000, 64, 0x77, access).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { verb: Verb::MrRemote, .. }), "{e}");
            assert!(e.to_string().contains("lets no peer reach it"), "{e}");
        };
        refused(AccessFlags::LOCAL_WRITE);
        refused(AccessFlags::empty());
        refused(AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND | AccessFlags::ZERO_BASED);
        for right in [AccessFlags::REMOTE_READ, AccessFlags::REMOTE_WRITE, AccessFlags::REMOTE_ATOMIC] {
            let mr = remote_descriptor(Verb::MrRemote, 0x1000, 64, 0x77, AccessFlags::LOCAL_WRITE | right).unwrap();
            assert_eq!(mr, RemoteMr { addr: 0x1000, len: 64, rkey: 0x77 });
        }
        // A bit this crate does not know might be a remote right: not refused.
        assert!(remote_descriptor(Verb::MrRemote, 0, 1, 1, AccessFlags::from_bits_retain(1 << 30)).is_ok());
    }

    #[test]
    fn remote_mr_wire_form_round_trips_and_parses_strictly() {
        let mr = RemoteMr { addr: 0x1122_3344_5566_7788, len: 4096, rkey: 0xdead_beef };
        let b = mr.to_bytes();
        assert_eq!(b.len(), RemoteMr::WIRE_LEN);
        assert_eq!(&b[..8], &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
        assert_eq!(&b[16..], &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(RemoteMr::from_bytes(&b).unwrap(), mr);
        assert!(RemoteMr::from_bytes(&b[..19]).is_err());
        assert!(RemoteMr::from_bytes(&[0u8; 21]).is_err());
        assert!(RemoteMr::from_bytes(&[]).is_err());
        let overflow = RemoteMr { addr: u64::MAX, len: 2, rkey: 1 }.to_bytes();
        assert!(RemoteMr::from_bytes(&overflow).is_err());
    }

    #[test]
    fn remote_mr_slice_is_bounds_checked() {
        let mr = RemoteMr { addr: 1000, len: 100, rkey: 7 };
        assert_eq!(mr.slice(10..20).unwrap(), RemoteMr { addr: 1010, len: 10, rkey: 7 });
        assert_eq!(mr.slice(..).unwrap(), mr);
        assert_eq!(mr.slice(100..).unwrap().len, 0);
        assert!(mr.slice(90..101).is_err());
        assert!(mr.slice((Bound::Included(20), Bound::Excluded(10))).is_err());
        assert!(mr.slice(..=u64::MAX).is_err());
    }

    #[test]
    fn aligned_buf_is_zeroed_page_aligned_and_rejects_zero_and_overflow() {
        let mut b = AlignedBuf::new(5000).unwrap();
        assert_eq!(b.len(), 5000);
        assert_eq!(b.as_ptr() as usize % page_size(), 0);
        assert!(b.iter().all(|&x| x == 0));
        b[4999] = 7;
        assert_eq!(b.as_slice()[4999], 7);
        assert!(matches!(AlignedBuf::new(0), Err(Error::InvalidArgument { .. })));
        assert!(matches!(AlignedBuf::new(usize::MAX), Err(Error::InvalidArgument { .. })));
    }

    #[test]
    fn copies_in_and_out_of_raw_region_memory_at_every_offset_and_length() {
        // A region's memory as MemoryRegion holds it: taken apart, reached by pointer only.
        let (base, len, ()) = AlignedBuf::new(37).unwrap().disassemble();
        let base = base.as_ptr();
        let pattern: Vec<u8> = (0..37u8).map(|i| i ^ 0xa5).collect();
        // SAFETY: 37 bytes owned here and reached only through `base`.
        unsafe { copy_in(base, 0, &pattern) };
        for off in 0..=len {
            for n in 0..=len - off {
                let mut out = vec![0u8; n];
                // SAFETY: in bounds; no other access.
                unsafe { copy_out(base, len, off, &mut out) };
                assert_eq!(out, &pattern[off..off + n], "{n} at {off}");
            }
        }
        // SAFETY: an aligned word inside the buffer (page-aligned base).
        let word = unsafe { AtomicU64::from_ptr(base.add(8).cast::<u64>()) };
        word.store(0x0102_0304_0506_0708, Ordering::Relaxed);
        let mut out = [0u8; 3];
        // SAFETY: in bounds; the only other access is the same-size atomic above.
        unsafe { copy_out(base, len, 9, &mut out) };
        assert_eq!(out, 0x0102_0304_0506_0708u64.to_ne_bytes()[1..4]);
        // SAFETY: in bounds; no other access.
        unsafe { copy_in(base, 30, b"xyz") };
        // SAFETY: the parts just taken.
        let buf = unsafe { AlignedBuf::reassemble(NonNull::new(base).unwrap(), len, ()) };
        assert_eq!(&buf[30..33], b"xyz");
        assert_eq!(&buf[..8], &pattern[..8]);
    }

    #[test]
    fn buffers_survive_being_taken_apart_and_rebuilt() {
        let v = vec![1u8, 2, 3];
        let (p, l, c) = v.disassemble();
        // SAFETY: the parts just taken.
        let v = unsafe { <Vec<u8> as RegisterableBuffer>::reassemble(p, l, c) };
        assert_eq!(v, [1, 2, 3]);
        let b: Box<[u8]> = vec![4u8, 5].into_boxed_slice();
        let (p, l, ()) = b.disassemble();
        // SAFETY: the parts just taken.
        let b = unsafe { <Box<[u8]> as RegisterableBuffer>::reassemble(p, l, ()) };
        assert_eq!(&*b, &[4, 5]);
        let mut storage = [1u8, 2, 3, 4];
        let (p, l, ()) = (&mut storage[1..3]).disassemble();
        // SAFETY: inside the borrowed slice, reached only through `p` meanwhile.
        unsafe { copy_in(p.as_ptr(), 0, &[9, 9]) };
        // SAFETY: the parts just taken.
        let s = unsafe { <&mut [u8] as RegisterableBuffer>::reassemble(p, l, ()) };
        s[0] = 8;
        assert_eq!(storage, [1, 8, 9, 4]);
    }
}
