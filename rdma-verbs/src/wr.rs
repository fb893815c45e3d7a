//! The raw data path: posting C work requests with no checks of ours.
//!
//! These are for experts who manage buffer lifetimes themselves: each is one call to the
//! provider's function pointer (the ported `static inline` of `verbs.h`), so they cost
//! exactly what the C call costs. A chain of work requests linked through `next` is one
//! provider call: on rxe one doorbell `write()`, on mlx5 one MMIO doorbell.

use crate::error::{Error, Plane, Result};
use crate::ffi;
use crate::qp::QueuePair;
use crate::srq::SharedReceiveQueue;

/// A post that the provider refused: the error, and which work request of the chain it
/// stopped at (the ones before it were posted; it and the ones after it were not).
#[derive(Debug)]
pub struct PostError<W> {
    /// What the provider said.
    pub error: Error,
    /// The first work request that was not posted.
    pub bad_wr: *mut W,
}

impl<W> std::fmt::Display for PostError<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl<W: std::fmt::Debug> std::error::Error for PostError<W> {}

impl<W> From<PostError<W>> for Error {
    fn from(e: PostError<W>) -> Error {
        e.error
    }
}

fn check<W>(verb: &'static str, rc: i32, bad: *mut W) -> Result<(), PostError<W>> {
    if rc == 0 {
        Ok(())
    } else {
        Err(PostError { error: Error::verb(verb, Plane::Data, rc.abs()), bad_wr: bad })
    }
}

impl QueuePair {
    /// Posts a chain of send work requests (`ibv_post_send`).
    ///
    /// # Safety
    /// - `wr` must point to a valid chain of `ibv_send_wr` (linked by `next`, NULL at the
    ///   end) whose SGEs, with their `lkey`s, lie inside memory regions of this QP's
    ///   protection domain (or are inline data with `IBV_SEND_INLINE`).
    /// - Every byte an SGE names must stay allocated and registered until the work
    ///   request completes or the QP is destroyed, and bytes the device writes (RDMA
    ///   READ and atomic targets) must not be referenced by Rust code until then.
    /// - For UD, `wr.ud.ah` must be an address handle that lives until completion.
    #[doc(alias = "ibv_post_send")]
    #[inline]
    pub unsafe fn post_send_raw(&self, wr: *mut ffi::ibv_send_wr) -> Result<(), PostError<ffi::ibv_send_wr>> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is live (self); the caller vouches for the chain.
        let rc = unsafe { ffi::ibv_post_send(self.as_raw(), wr, &mut bad) };
        check("ibv_post_send", rc, bad)
    }

    /// Posts a chain of receive work requests (`ibv_post_recv`).
    ///
    /// # Safety
    /// `wr` must point to a valid chain of `ibv_recv_wr` whose SGEs lie inside memory
    /// regions of this QP's protection domain; those bytes must stay allocated and
    /// registered, and unreferenced by Rust code, until the receive completes or the QP
    /// is destroyed.
    #[doc(alias = "ibv_post_recv")]
    #[inline]
    pub unsafe fn post_recv_raw(&self, wr: *mut ffi::ibv_recv_wr) -> Result<(), PostError<ffi::ibv_recv_wr>> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is live (self); the caller vouches for the chain.
        let rc = unsafe { ffi::ibv_post_recv(self.as_raw(), wr, &mut bad) };
        check("ibv_post_recv", rc, bad)
    }
}

impl SharedReceiveQueue {
    /// Posts a chain of receive work requests to the SRQ (`ibv_post_srq_recv`).
    ///
    /// # Safety
    /// As for [`QueuePair::post_recv_raw`], with the SRQ's protection domain.
    #[doc(alias = "ibv_post_srq_recv")]
    #[inline]
    pub unsafe fn post_recv_raw(&self, wr: *mut ffi::ibv_recv_wr) -> Result<(), PostError<ffi::ibv_recv_wr>> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: the SRQ is live (self); the caller vouches for the chain.
        let rc = unsafe { ffi::ibv_post_srq_recv(self.as_raw(), wr, &mut bad) };
        check("ibv_post_srq_recv", rc, bad)
    }
}
