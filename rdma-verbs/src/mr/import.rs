//! Regions imported from another process's context (`ibv_import_mr`), and the handle a
//! region is imported by.

use crate::handle::Imported;

use super::*;

impl<B: RegisterableBuffer, A: AccessMode> MemoryRegion<B, A> {
    /// The kernel's handle of this region (`ibv_mr::handle`), which another process that
    /// imported this context passes to [`ImportedRegion::import`].
    pub fn handle(&self) -> u32 {
        // SAFETY: the region is live while `self` is; libibverbs never changes `handle`.
        unsafe { (*self.as_raw()).handle }
    }
}

/// A region another context registered, imported by its handle (`ibv_import_mr`) into a
/// protection domain of a context that shares its kernel objects
/// ([`Context::import`](crate::Context::import), [`ProtectionDomain::import`]). Unimported on drop
/// (`ibv_unimport_mr`): the registration stays its creator's, who deregisters it.
///
/// What it gives is plain data: the keys, the length, and the handle. The memory behind it
/// is the creator's (another process's, usually), and the address libibverbs reports for
/// an imported region is not one of this process (rdma-core documents it as NULL): there
/// is no view of the bytes, and no safe way to put its local key in a scatter/gather
/// entry, since the device would read or write the creator's memory at an address this
/// process cannot check. That is why it is sound: nothing safe dereferences anything
/// through it. The rkey is what a peer puts in an RDMA READ, WRITE or atomic, with the
/// address the creator tells it ([`RemoteMr`]); what such a peer may do to the memory was
/// decided by the creator when it registered the region with remote access.
pub struct ImportedRegion {
    raw: Imported<ffi::ibv_mr>,
    lkey: u32,
    rkey: u32,
    len: usize,
    handle: u32,
    pd: ProtectionDomain,
}

// SAFETY: the region is a kernel object any thread may unimport; no memory of this process
// is behind it.
unsafe impl Send for ImportedRegion {}
// SAFETY: &ImportedRegion gives only plain data and the raw pointer.
unsafe impl Sync for ImportedRegion {}

impl ImportedRegion {
    /// Imports the region that `handle` names in `pd`'s context (`ibv_import_mr`); `pd`
    /// should be the region's own PD, imported ([`ProtectionDomain::import`]).
    ///
    /// The kernel checks `handle` against the context's objects: an unknown one fails, and
    /// a provider without import (rxe) gives [`Error::NotSupported`] naming
    /// [`Verb::ImportMr`] and `EOPNOTSUPP`.
    #[doc(alias = "ibv_import_mr")]
    #[doc(alias = "ibv_unimport_mr")]
    pub fn import(pd: &ProtectionDomain, handle: u32) -> Result<ImportedRegion> {
        // SAFETY: the PD is live; the kernel validates `handle`.
        let raw = unsafe { ffi::ibv_import_mr(pd.as_raw(), handle) };
        // SAFETY: a new imported region that only this Imported unimports.
        let raw = unsafe {
            Imported::new(raw, || {
                Error::last_os_or_not_supported(
                    Verb::ImportMr,
                    "the import of a region (the provider has no import_mr)",
                )
            })?
        };
        // SAFETY: `raw` is the live region ibv_import_mr just returned.
        let (lkey, rkey, len) = unsafe { ((*raw.as_ptr()).lkey, (*raw.as_ptr()).rkey, (*raw.as_ptr()).length) };
        Ok(ImportedRegion { raw, lkey, rkey, len, handle, pd: pd.clone() })
    }

    /// The local key, as the creator's region has it. Only unsafe code can put it in a
    /// scatter/gather entry (see the type's documentation).
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key, for a peer's RDMA READ, WRITE or atomic.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The length in bytes.
    #[allow(clippy::len_without_is_empty)] // a registered region is never empty
    pub fn len(&self) -> usize {
        self.len
    }

    /// The handle it was imported by.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// The protection domain it was imported into.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The raw region, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_mr {
        self.raw.as_ptr()
    }
}

impl fmt::Debug for ImportedRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImportedRegion")
            .field("handle", &self.handle)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("len", &self.len)
            .finish()
    }
}
