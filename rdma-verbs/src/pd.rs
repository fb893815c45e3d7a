//! Protection domains (`struct ibv_pd`): the scope of memory regions, QPs and AHs.

use std::fmt;
use std::sync::Arc;

use crate::context::Context;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::{destroy_shared, Imported, Owned};

/// A protection domain. Cloning is cheap; the PD is deallocated when the last clone and
/// the last object created in it (memory region, QP, SRQ, address handle) are gone.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
}

pub(crate) struct PdInner {
    raw: RawPd,
    ctx: Context,
}

/// Who ends the C PD.
enum RawPd {
    /// Allocated here (`ibv_alloc_pd`): deallocated with the last handle.
    Allocated(Owned<ffi::ibv_pd>),
    /// Imported from a handle (`ibv_import_pd`): unimported with the last handle; the
    /// kernel PD is its creator's to deallocate.
    Imported(Imported<ffi::ibv_pd>),
}

// SAFETY: a PD is an immutable handle; verbs that take it are thread-safe.
unsafe impl Send for PdInner {}
// SAFETY: as for Send.
unsafe impl Sync for PdInner {}

impl ProtectionDomain {
    /// Allocates a protection domain (`ibv_alloc_pd`).
    #[doc(alias = "ibv_alloc_pd")]
    pub fn new(ctx: &Context) -> Result<Self> {
        // SAFETY: the context is open.
        let raw = unsafe { ffi::ibv_alloc_pd(ctx.as_raw()) };
        // SAFETY: a new PD that only this Owned deallocates.
        let raw = unsafe { Owned::new(raw, Verb::AllocPd)? };
        Ok(ProtectionDomain { inner: Arc::new(PdInner { raw: RawPd::Allocated(raw), ctx: ctx.clone() }) })
    }

    /// Imports the PD that `handle` names in `ctx`'s kernel context (`ibv_import_pd`):
    /// `ctx` is usually [imported](Context::import) from another process, and `handle`
    /// that process's [`ProtectionDomain::handle`]. The PD serves every verb a PD serves
    /// (regions, QPs, address handles); dropping the last handle unimports it
    /// (`ibv_unimport_pd`) and leaves the kernel PD to its creator, who must keep it
    /// alive while this process uses it (after it is deallocated, verbs on it fail).
    ///
    /// The kernel checks `handle` against the context's objects: an unknown one fails
    /// (`EINVAL` or `ENOENT`, as the provider reports it), and a provider without import
    /// (rxe) gives [`Error::NotSupported`](crate::Error::NotSupported) naming
    /// [`Verb::ImportPd`] and `EOPNOTSUPP`.
    #[doc(alias = "ibv_import_pd")]
    #[doc(alias = "ibv_unimport_pd")]
    pub fn import(ctx: &Context, handle: u32) -> Result<Self> {
        // SAFETY: the context is open; the kernel validates `handle`.
        let raw = unsafe { ffi::ibv_import_pd(ctx.as_raw(), handle) };
        // SAFETY: a new imported PD that only this Imported unimports.
        let raw = unsafe {
            Imported::new(raw, || {
                Error::last_os_or_not_supported(Verb::ImportPd, "the import of a PD (the provider has no import_pd)")
            })?
        };
        Ok(ProtectionDomain { inner: Arc::new(PdInner { raw: RawPd::Imported(raw), ctx: ctx.clone() }) })
    }

    /// The kernel's handle of this PD (`ibv_pd::handle`), which another process that
    /// imported this context passes to [`ProtectionDomain::import`].
    pub fn handle(&self) -> u32 {
        // SAFETY: the PD is live while `self` is; libibverbs never changes `handle`.
        unsafe { (*self.as_raw()).handle }
    }

    /// Whether this PD was imported ([`ProtectionDomain::import`]): dropping it unimports
    /// rather than deallocates.
    pub fn is_imported(&self) -> bool {
        matches!(self.inner.raw, RawPd::Imported(_))
    }

    /// The context this PD belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The raw pointer, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_pd {
        match &self.inner.raw {
            RawPd::Allocated(raw) => raw.as_ptr(),
            RawPd::Imported(raw) => raw.as_ptr(),
        }
    }

    /// Deallocates now and reports the result (`ibv_dealloc_pd`). Fails with EBUSY,
    /// freeing nothing yet, while clones or objects created in this PD are alive. An
    /// imported PD is unimported instead (`ibv_unimport_pd`, which cannot fail).
    #[doc(alias = "ibv_dealloc_pd")]
    pub fn destroy(self) -> Result<()> {
        destroy_shared(self.inner, Verb::DeallocPd, |inner| match inner.raw {
            RawPd::Allocated(raw) => raw.destroy(),
            RawPd::Imported(raw) => {
                drop(raw);
                Ok(())
            }
        })
    }
}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("context", self.context())
            .field("imported", &self.is_imported())
            .finish()
    }
}
