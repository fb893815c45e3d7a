//! Regions that are not a buffer of this process: the null region (`ibv_alloc_null_mr`)
//! and regions over a dmabuf (`ibv_reg_dmabuf_mr`), memory another driver exports (a GPU's,
//! or udmabuf's).

use std::os::fd::{AsRawFd, OwnedFd};

use super::*;

/// The null region (`ibv_alloc_null_mr`): its lkey in a scatter entry makes the device
/// drop the bytes a receive or READ response would write there, and read nothing for a
/// send. Deregistered on drop (`ibv_dereg_mr`).
pub struct NullRegion {
    raw: Owned<ffi::ibv_mr>,
    lkey: u32,
    pd: ProtectionDomain,
}

// SAFETY: the region is a kernel object any thread may use and deregister; no memory of
// this process is behind it.
unsafe impl Send for NullRegion {}
// SAFETY: &NullRegion gives only its key and raw pointer.
unsafe impl Sync for NullRegion {}

impl NullRegion {
    /// The local key to put in scatter/gather entries whose bytes are to be dropped.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The raw region, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_mr {
        self.raw.as_ptr()
    }
}

impl fmt::Debug for NullRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NullRegion").field("lkey", &format_args!("{:#x}", self.lkey)).finish()
    }
}

/// A region over `len` bytes at `offset` of a dmabuf (`ibv_reg_dmabuf_mr`). It owns the
/// dmabuf's file descriptor, closed after the region is deregistered. The memory is not
/// this process's: there is no view of the bytes, only the keys and the descriptor a
/// peer targets.
pub struct DmabufRegion {
    raw: Owned<ffi::ibv_mr>,
    fd: OwnedFd,
    iova: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
    access: AccessFlags,
    pd: ProtectionDomain,
}

// SAFETY: the region and the descriptor may be used and closed from any thread; the
// memory is the exporting driver's.
unsafe impl Send for DmabufRegion {}
// SAFETY: &DmabufRegion gives only keys, addresses and the descriptor.
unsafe impl Sync for DmabufRegion {}

impl DmabufRegion {
    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The I/O virtual address the device knows the first byte by.
    pub fn addr(&self) -> u64 {
        self.iova
    }

    /// The length in bytes (never zero).
    #[allow(clippy::len_without_is_empty)] // registration rejects zero lengths
    pub fn len(&self) -> usize {
        self.len
    }

    /// The dmabuf's descriptor.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// What a peer needs to target the region; an error for a region that grants no
    /// remote access, as for [`MemoryRegion::remote`].
    pub fn remote(&self) -> Result<RemoteMr> {
        remote_descriptor(Verb::MrRemote, self.iova, self.len as u64, self.rkey, self.access)
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// Deregisters now (`ibv_dereg_mr`) and gives the descriptor back.
    pub fn destroy(self) -> Result<OwnedFd> {
        let DmabufRegion { raw, fd, .. } = self;
        raw.destroy().map(|()| fd)
    }
}

impl fmt::Debug for DmabufRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmabufRegion")
            .field("fd", &self.fd.as_raw_fd())
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len)
            .finish()
    }
}

/// The checks of [`ProtectionDomain::register_dmabuf`] that need no device.
fn check_dmabuf(offset: u64, len: usize, iova: u64, access: AccessFlags) -> Result<()> {
    let v = Verb::PdRegisterDmabuf;
    if len == 0 {
        return Err(Error::invalid(v, "a memory region cannot be empty (length 0)"));
    }
    if offset.checked_add(len as u64).is_none() || iova.checked_add(len as u64).is_none() {
        return Err(Error::invalid(v, format!("offset {offset:#x} or iova {iova:#x} plus {len} bytes overflows")));
    }
    if access.contains(AccessFlags::ON_DEMAND) {
        return Err(Error::invalid(v, "ON_DEMAND: a dmabuf region is always moved by its exporter, not paged"));
    }
    Ok(())
}

impl ProtectionDomain {
    /// Allocates the null region (`ibv_alloc_null_mr`). A provider without it (rxe) gives
    /// [`Error::NotSupported`] naming [`Verb::AllocNullMr`] and `EOPNOTSUPP`.
    #[doc(alias = "ibv_alloc_null_mr")]
    pub fn alloc_null_region(&self) -> Result<NullRegion> {
        // SAFETY: the PD is live.
        let raw = unsafe { ffi::ibv_alloc_null_mr(self.as_raw()) };
        if raw.is_null() {
            return Err(Error::last_os_or_not_supported(
                Verb::AllocNullMr,
                "the null region: the provider has no alloc_null_mr",
            ));
        }
        // SAFETY: a new region that only this Owned deregisters.
        let raw = unsafe { Owned::new(raw, Verb::AllocNullMr)? };
        // SAFETY: the live region just allocated.
        let lkey = unsafe { (*raw.as_ptr()).lkey };
        Ok(NullRegion { raw, lkey, pd: self.clone() })
    }

    /// Registers `len` bytes at `offset` of the dmabuf `fd` (`ibv_reg_dmabuf_mr`), which
    /// the device knows by `iova` on; the region owns `fd`. `LOCAL_WRITE` is added to
    /// remote write and atomics, as for every region.
    ///
    /// Refused before C ([`Error::InvalidArgument`] naming [`Verb::PdRegisterDmabuf`]): an
    /// empty range, an offset or iova whose end overflows, `ON_DEMAND`; on such a refusal
    /// or any error, `fd` is closed. A provider without dmabuf regions (rxe of Linux 6.1)
    /// gives [`Error::NotSupported`] naming [`Verb::RegDmabufMr`] and `EOPNOTSUPP`.
    #[doc(alias = "ibv_reg_dmabuf_mr")]
    pub fn register_dmabuf(
        &self,
        fd: OwnedFd,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<DmabufRegion> {
        check_dmabuf(offset, len, iova, access)?;
        let access = if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC) {
            access | AccessFlags::LOCAL_WRITE
        } else {
            access
        };
        // SAFETY: the PD is live and `fd` is open for the call; the kernel takes its own
        // reference to the dmabuf and checks the range against it.
        let raw = unsafe {
            ffi::ibv_reg_dmabuf_mr(self.as_raw(), offset, len, iova, fd.as_raw_fd(), access.bits() as std::ffi::c_int)
        };
        if raw.is_null() {
            return Err(Error::last_os_or_not_supported(
                Verb::RegDmabufMr,
                "dmabuf regions: the provider (or the kernel driver) has no reg_dmabuf_mr",
            ));
        }
        // SAFETY: a new region that only this Owned deregisters.
        let raw = unsafe { Owned::new(raw, Verb::RegDmabufMr)? };
        // SAFETY: the live region just registered.
        let (lkey, rkey) = unsafe { ((*raw.as_ptr()).lkey, (*raw.as_ptr()).rkey) };
        Ok(DmabufRegion { raw, fd, iova, len, lkey, rkey, access, pd: self.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dmabuf_range_is_checked_before_c() {
        let ok = AccessFlags::LOCAL_WRITE;
        assert!(check_dmabuf(0, 4096, 0, ok).is_ok());
        let e = check_dmabuf(0, 0, 0, ok).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { verb: Verb::PdRegisterDmabuf, .. }), "{e}");
        assert!(check_dmabuf(u64::MAX, 1, 0, ok).is_err());
        assert!(check_dmabuf(0, 2, u64::MAX, ok).is_err());
        assert!(check_dmabuf(0, 64, 0, ok | AccessFlags::ON_DEMAND).is_err());
    }
}
