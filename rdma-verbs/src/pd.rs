//! Protection domains (`struct ibv_pd`): the scope of memory regions, QPs and AHs.

use std::fmt;
use std::sync::Arc;

use crate::context::Context;
use crate::error::{Result, Verb};
use crate::ffi;
use crate::handle::{destroy_shared, Owned};

/// A protection domain. Cloning is cheap; the PD is deallocated when the last clone and
/// the last object created in it (memory region, QP, SRQ, address handle) are gone.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
}

pub(crate) struct PdInner {
    raw: Owned<ffi::ibv_pd>,
    ctx: Context,
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
        Ok(ProtectionDomain { inner: Arc::new(PdInner { raw, ctx: ctx.clone() }) })
    }

    /// The context this PD belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The raw pointer, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_pd {
        self.inner.raw.as_ptr()
    }

    /// Deallocates now and reports the result (`ibv_dealloc_pd`). Fails with EBUSY,
    /// freeing nothing yet, while clones or objects created in this PD are alive.
    #[doc(alias = "ibv_dealloc_pd")]
    pub fn destroy(self) -> Result<()> {
        destroy_shared(self.inner, Verb::DeallocPd, |inner| inner.raw.destroy())
    }
}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain").field("context", self.context()).finish()
    }
}
