//! Device memory (`struct ibv_dm`): memory on the adapter itself, reached by copies.

use std::ffi::c_int;
use std::fmt;

use crate::caps::device_attr_ex;
use crate::context::Context;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::{Owned, RawObject};

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
/// takes `&mut self`, so no copy out runs at the same time.
pub struct DeviceMemory {
    raw: Owned<ffi::ibv_dm>,
    len: usize,
    ctx: Context,
}

// SAFETY: the allocation is the device's; libibverbs lets any thread copy and free it.
unsafe impl Send for DeviceMemory {}
// SAFETY: &DeviceMemory only copies out (ibv_memcpy_from_dm), which threads may do at once.
unsafe impl Sync for DeviceMemory {}

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
        Ok(DeviceMemory { raw, len, ctx: ctx.clone() })
    }

    /// Copies `src` into the device memory at `offset` (`ibv_memcpy_to_dm`).
    #[doc(alias = "ibv_memcpy_to_dm")]
    pub fn copy_to(&mut self, offset: u64, src: &[u8]) -> Result<()> {
        check_span(offset, src.len(), self.len)?;
        // SAFETY: the allocation is live and the span inside it; `src` is readable.
        let rc = unsafe { ffi::ibv_memcpy_to_dm(self.raw.as_ptr(), offset, src.as_ptr().cast(), src.len()) };
        match rc {
            0 => Ok(()),
            rc => Err(Error::verb(Verb::MemcpyToDm, rc.abs())),
        }
    }

    /// Copies `dst.len()` bytes at `offset` of the device memory into `dst`
    /// (`ibv_memcpy_from_dm`).
    #[doc(alias = "ibv_memcpy_from_dm")]
    pub fn copy_from(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        check_span(offset, dst.len(), self.len)?;
        // SAFETY: the allocation is live and the span inside it; `dst` is writable.
        let rc = unsafe { ffi::ibv_memcpy_from_dm(dst.as_mut_ptr().cast(), self.raw.as_ptr(), offset, dst.len()) };
        match rc {
            0 => Ok(()),
            rc => Err(Error::verb(Verb::MemcpyFromDm, rc.abs())),
        }
    }

    /// The length in bytes (never zero).
    #[allow(clippy::len_without_is_empty)] // alloc rejects zero lengths
    pub fn len(&self) -> usize {
        self.len
    }

    /// The context the memory belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The raw allocation, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_dm {
        self.raw.as_ptr()
    }

    /// Frees the memory now (`ibv_free_dm`) and reports the result.
    #[doc(alias = "ibv_free_dm")]
    pub fn free(self) -> Result<()> {
        self.raw.destroy()
    }
}

impl fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceMemory").field("len", &self.len).finish()
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
    fn copies_are_bounds_checked() {
        assert!(check_span(0, 64, 64).is_ok());
        assert!(check_span(60, 4, 64).is_ok());
        assert!(check_span(61, 4, 64).is_err());
        assert!(check_span(u64::MAX, 1, 64).is_err());
    }
}
