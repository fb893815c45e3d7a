//! Completion queues (`struct ibv_cq`). (Skeleton: the safe-core work fills it in.)

use std::sync::Arc;

use crate::context::Context;
use crate::error::Result;
use crate::ffi;
use crate::handle::Owned;

/// A completion queue. Not `Clone`: polling needs `&mut self`, so there is one poller.
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
}

pub(crate) struct CqInner {
    pub(crate) raw: Owned<ffi::ibv_cq>,
    pub(crate) ctx: Context,
}

// SAFETY: libibverbs allows CQ verbs from any thread; polling is serialized by &mut.
unsafe impl Send for CqInner {}
// SAFETY: the &self methods of a CQ are thread-safe verbs.
unsafe impl Sync for CqInner {}

impl CompletionQueue {
    /// Creates a CQ with at least `cqe` entries on completion vector 0, no channel.
    pub fn new(ctx: &Context, cqe: u32) -> Result<Self> {
        let cqe = i32::try_from(cqe).map_err(|_| crate::Error::invalid("ibv_create_cq", "cqe too large"))?;
        // SAFETY: the context is open; no channel, no context pointer.
        let raw = unsafe { ffi::ibv_create_cq(ctx.as_raw(), cqe, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        // SAFETY: a new CQ owned only here.
        let raw = unsafe { Owned::new(raw, "ibv_create_cq")? };
        Ok(CompletionQueue { inner: Arc::new(CqInner { raw, ctx: ctx.clone() }) })
    }

    /// The raw pointer, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_cq {
        self.inner.raw.as_ptr()
    }

    /// The context this CQ belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }
}
