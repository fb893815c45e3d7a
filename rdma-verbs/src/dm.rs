//! Device memory (`struct ibv_dm`): memory on the adapter itself, reached by copies.

use std::ffi::c_int;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use crate::caps::device_attr_ex;
use crate::context::Context;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::{destroy_shared, Owned, RawObject};
use crate::mr::{remote_descriptor, AccessFlags, RemoteMr};
use crate::pd::ProtectionDomain;

impl RawObject for ffi::ibv_dm {
    const DESTROY: Verb = Verb::FreeDm;
    unsafe fn destroy(raw: *mut Self) -> c_int {
        // SAFETY: forwarded from the caller's contract.
        unsafe { ffi::ibv_free_dm(raw) }
    }
}

/// Memory on the device (`ibv_alloc_dm`), freed on drop (`ibv_free_dm`).
///
/// What it promises: [`alloc`](DeviceMemory::alloc) reads the device's `max_dm_size`
/// (`ibv_query_device_ex`) first; a device reporting 0 (rxe) gives
/// [`Error::NotSupported`] naming [`Verb::DeviceMemoryAlloc`] and `max_dm_size`, and a
/// length of 0 or above it, or an alignment above 2^63, is [`Error::InvalidArgument`],
/// all before C. Copies in and out are bounds-checked before C; a copy into the memory
/// takes `&mut self`, so no copy out runs at the same time. The regions registered over
/// it ([`register`](DeviceMemory::register)) keep the memory allocated until they are
/// deregistered.
pub struct DeviceMemory {
    inner: Arc<DmInner>,
}

struct DmInner {
    raw: Owned<ffi::ibv_dm>,
    len: usize,
    ctx: Context,
}

// SAFETY: the allocation is the device's; libibverbs lets any thread copy and free it.
unsafe impl Send for DmInner {}
// SAFETY: &DmInner gives only the raw pointer (copies out, ibv_memcpy_from_dm, which
// threads may do at once; copies in take &mut DeviceMemory), the length and the context.
unsafe impl Sync for DmInner {}

/// The checks of [`DeviceMemory::alloc`] against the device's `max_dm_size`.
fn check_alloc(len: usize, log_align: u32, max_dm_size: u64) -> Result<()> {
    if max_dm_size == 0 {
        return Err(Error::not_supported(
            Verb::DeviceMemoryAlloc,
            "device memory: the device reports max_dm_size 0 (ibv_query_device_ex)",
        ));
    }
    if len == 0 {
        return Err(Error::invalid(Verb::DeviceMemoryAlloc, "device memory cannot be empty (length 0)"));
    }
    if len as u64 > max_dm_size {
        return Err(Error::invalid(
            Verb::DeviceMemoryAlloc,
            format!("{len} bytes exceed the device's max_dm_size {max_dm_size}"),
        ));
    }
    if log_align > 63 {
        return Err(Error::invalid(Verb::DeviceMemoryAlloc, format!("alignment 2^{log_align} is not a 64-bit value")));
    }
    Ok(())
}

fn check_span(offset: u64, n: usize, len: usize) -> Result<()> {
    match offset.checked_add(n as u64) {
        Some(end) if end <= len as u64 => Ok(()),
        _ => Err(Error::invalid(
            Verb::DeviceMemoryCopy,
            format!("{n} bytes at offset {offset} are not within the {len} bytes of device memory"),
        )),
    }
}

impl DeviceMemory {
    /// Allocates `len` bytes of device memory aligned to `2^log_align` bytes
    /// (`ibv_alloc_dm`).
    #[doc(alias = "ibv_alloc_dm")]
    pub fn alloc(ctx: &Context, len: usize, log_align: u32) -> Result<DeviceMemory> {
        check_alloc(len, log_align, device_attr_ex(ctx)?.max_dm_size)?;
        let mut attr = ffi::ibv_alloc_dm_attr { length: len, log_align_req: log_align, comp_mask: 0 };
        // SAFETY: the context is open and `attr` is readable.
        let raw = unsafe { ffi::ibv_alloc_dm(ctx.as_raw(), &mut attr) };
        if raw.is_null() {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
            return Err(Error::verb_or_not_supported(
                Verb::AllocDm,
                errno,
                "device memory: the provider has no alloc_dm",
            ));
        }
        // SAFETY: a new allocation that only this Owned frees.
        let raw = unsafe { Owned::new(raw, Verb::AllocDm)? };
        Ok(DeviceMemory { inner: Arc::new(DmInner { raw, len, ctx: ctx.clone() }) })
    }

    /// Copies `src` into the device memory at `offset` (`ibv_memcpy_to_dm`).
    #[doc(alias = "ibv_memcpy_to_dm")]
    pub fn copy_to(&mut self, offset: u64, src: &[u8]) -> Result<()> {
        check_span(offset, src.len(), self.len())?;
        // SAFETY: the allocation is live and the span inside it; `src` is readable.
        let rc = unsafe { ffi::ibv_memcpy_to_dm(self.as_raw(), offset, src.as_ptr().cast(), src.len()) };
        match rc {
            0 => Ok(()),
            rc => Err(Error::verb(Verb::MemcpyToDm, rc.abs())),
        }
    }

    /// Copies `dst.len()` bytes at `offset` of the device memory into `dst`
    /// (`ibv_memcpy_from_dm`).
    #[doc(alias = "ibv_memcpy_from_dm")]
    pub fn copy_from(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        check_span(offset, dst.len(), self.len())?;
        // SAFETY: the allocation is live and the span inside it; `dst` is writable.
        let rc = unsafe { ffi::ibv_memcpy_from_dm(dst.as_mut_ptr().cast(), self.as_raw(), offset, dst.len()) };
        match rc {
            0 => Ok(()),
            rc => Err(Error::verb(Verb::MemcpyFromDm, rc.abs())),
        }
    }

    /// The length in bytes (never zero).
    #[allow(clippy::len_without_is_empty)] // alloc rejects zero lengths
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// The context the memory belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The raw allocation, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_dm {
        self.inner.raw.as_ptr()
    }

    /// Frees the memory now (`ibv_free_dm`) and reports the result; `EBUSY`, freeing
    /// nothing yet, while a region registered over it lives.
    #[doc(alias = "ibv_free_dm")]
    pub fn free(self) -> Result<()> {
        destroy_shared(self.inner, Verb::FreeDm, |inner| inner.raw.destroy())
    }

    /// Registers the bytes `range` of the device memory as a region of `pd`
    /// (`ibv_reg_dm_mr`). Such a region is zero based: its scatter entries and a peer's
    /// requests address it by the offset from `range.start` (its [`remote`](DmRegion::remote)
    /// descriptor has address 0). `ZERO_BASED`, which ibv_reg_dm_mr(3) requires, is added,
    /// and `LOCAL_WRITE` to remote write and atomics, as for every region.
    ///
    /// Refused before C ([`Error::InvalidArgument`] naming
    /// [`Verb::DeviceMemoryRegister`]): an empty range or one past the memory's end,
    /// `ON_DEMAND` (device memory is never paged), a PD of another device context. A
    /// provider without it gives [`Error::NotSupported`] naming [`Verb::RegDmMr`] and
    /// `EOPNOTSUPP`.
    #[doc(alias = "ibv_reg_dm_mr")]
    pub fn register(&self, pd: &ProtectionDomain, range: Range<u64>, access: AccessFlags) -> Result<DmRegion> {
        let access = check_register(&range, self.len(), access)?;
        if pd.context().as_raw() != self.context().as_raw() {
            return Err(Error::invalid(
                Verb::DeviceMemoryRegister,
                "the PD belongs to another device context than the device memory",
            ));
        }
        let len = (range.end - range.start) as usize;
        // SAFETY: the PD and the allocation are live and of one context; the range is
        // inside the allocation (checked above).
        let raw = unsafe { ffi::ibv_reg_dm_mr(pd.as_raw(), self.as_raw(), range.start, len, access.bits()) };
        if raw.is_null() {
            return Err(Error::last_os_or_not_supported(
                Verb::RegDmMr,
                "device memory regions: the provider has no reg_dm_mr",
            ));
        }
        // SAFETY: a new region that only this Owned deregisters.
        let raw = unsafe { Owned::new(raw, Verb::RegDmMr)? };
        // SAFETY: the live region just registered.
        let (lkey, rkey) = unsafe { ((*raw.as_ptr()).lkey, (*raw.as_ptr()).rkey) };
        Ok(DmRegion { raw, dm: Arc::clone(&self.inner), offset: range.start, len, lkey, rkey, access, pd: pd.clone() })
    }
}

/// The checks of [`DeviceMemory::register`] that need no device; the access flags to
/// register with.
fn check_register(range: &Range<u64>, dm_len: usize, access: AccessFlags) -> Result<AccessFlags> {
    let v = Verb::DeviceMemoryRegister;
    if range.start >= range.end {
        return Err(Error::invalid(v, format!("the range {range:?} is empty: a memory region cannot be")));
    }
    if range.end > dm_len as u64 {
        return Err(Error::invalid(
            v,
            format!("the range {range:?} runs past the {dm_len} bytes of the device memory"),
        ));
    }
    if access.contains(AccessFlags::ON_DEMAND) {
        return Err(Error::invalid(v, "ON_DEMAND: device memory is on the device, never paged"));
    }
    let access = access | AccessFlags::ZERO_BASED;
    Ok(if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC) {
        access | AccessFlags::LOCAL_WRITE
    } else {
        access
    })
}

impl fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceMemory").field("len", &self.len()).finish()
    }
}

/// A region over part of a [`DeviceMemory`] ([`DeviceMemory::register`]), deregistered
/// on drop (`ibv_dereg_mr`), before the device memory it keeps allocated is released.
/// Zero based: offsets from its first byte address it, in scatter entries (with
/// [`lkey`](Self::lkey)) and in a peer's requests (with [`remote`](Self::remote)).
pub struct DmRegion {
    raw: Owned<ffi::ibv_mr>,
    dm: Arc<DmInner>,
    offset: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
    access: AccessFlags,
    pd: ProtectionDomain,
}

// SAFETY: the region is a kernel object any thread may use and deregister; the memory is
// the device's.
unsafe impl Send for DmRegion {}
// SAFETY: &DmRegion gives only keys, lengths and raw pointers.
unsafe impl Sync for DmRegion {}

impl DmRegion {
    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Where in the device memory the region starts.
    pub fn dm_offset(&self) -> u64 {
        self.offset
    }

    /// The length in bytes (never zero).
    #[allow(clippy::len_without_is_empty)] // register rejects empty ranges
    pub fn len(&self) -> usize {
        self.len
    }

    /// The access the region was registered with (with `ZERO_BASED`).
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// What a peer needs to target the region (address 0: zero based); an error for a
    /// region that grants no remote access, as for
    /// [`MemoryRegion::remote`](crate::MemoryRegion::remote).
    pub fn remote(&self) -> Result<RemoteMr> {
        remote_descriptor(Verb::MrRemote, 0, self.len as u64, self.rkey, self.access)
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The raw device memory under it, valid while `self` lives.
    pub fn dm_as_raw(&self) -> *mut ffi::ibv_dm {
        self.dm.raw.as_ptr()
    }

    /// The raw region, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_mr {
        self.raw.as_ptr()
    }

    /// Deregisters now (`ibv_dereg_mr`) and reports the result.
    pub fn deregister(self) -> Result<()> {
        self.raw.destroy()
    }
}

impl fmt::Debug for DmRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmRegion")
            .field("dm_offset", &self.offset)
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_is_checked_against_max_dm_size_and_zero_means_not_supported() {
        let e = check_alloc(64, 0, 0).unwrap_err();
        assert!(matches!(&e, Error::NotSupported { verb: Verb::DeviceMemoryAlloc, errno: None, .. }), "{e}");
        assert!(e.to_string().contains("max_dm_size 0"), "{e}");
        assert!(check_alloc(4096, 6, 4096).is_ok());
        assert!(check_alloc(4097, 0, 4096).unwrap_err().to_string().contains("max_dm_size 4096"));
        assert!(matches!(check_alloc(0, 0, 4096), Err(Error::InvalidArgument { .. })));
        assert!(check_alloc(64, 64, 4096).is_err());
    }

    #[test]
    fn a_registration_is_checked_against_the_memory_before_c_and_made_zero_based() {
        let a = check_register(&(0..4096), 4096, AccessFlags::LOCAL_WRITE).unwrap();
        assert_eq!(a, AccessFlags::LOCAL_WRITE | AccessFlags::ZERO_BASED);
        let a = check_register(&(64..128), 4096, AccessFlags::REMOTE_WRITE).unwrap();
        assert_eq!(a, AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE | AccessFlags::ZERO_BASED);
        #[allow(clippy::reversed_empty_ranges)] // a reversed range is what is checked
        for r in [0..0, 8..4, 4000..4097, u64::MAX - 1..u64::MAX] {
            let e = check_register(&r, 4096, AccessFlags::LOCAL_WRITE).unwrap_err();
            assert!(matches!(&e, Error::InvalidArgument { verb: Verb::DeviceMemoryRegister, .. }), "{e}");
            assert!(e.to_string().starts_with("DeviceMemory::register"), "{e}");
        }
        let e = check_register(&(0..64), 4096, AccessFlags::LOCAL_WRITE | AccessFlags::ON_DEMAND).unwrap_err();
        assert!(e.to_string().contains("ON_DEMAND"), "{e}");
    }

    #[test]
    fn copies_are_bounds_checked() {
        assert!(check_span(0, 64, 64).is_ok());
        assert!(check_span(60, 4, 64).is_ok());
        assert!(check_span(61, 4, 64).is_err());
        assert!(check_span(u64::MAX, 1, 64).is_err());
    }
}
