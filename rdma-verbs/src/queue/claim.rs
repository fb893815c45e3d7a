//! One owner per side of a QP or SRQ, and what happens to a dropped queue's requests.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result, Verb};

/// Hands what a dropped queue still has posted to its QP or SRQ, which frees it right
/// after the C object is destroyed, when the device can no longer touch it.
/// `keep` is the queue's tag and CQ reservation: they stay with the buffers, so a late
/// completion can never match a newer queue, nor overrun the CQ.
pub(super) fn bury<T: Send + 'static, K: Send + 'static>(graveyard: &Mutex<Vec<Box<dyn Send>>>, bufs: Vec<T>, keep: K) {
    if bufs.is_empty() {
        return; // the tag is free again: nothing of this queue can complete any more
    }
    match graveyard.lock() {
        Ok(mut g) => g.push(Box::new((bufs, keep))),
        // A panic while holding the lock: keep the buffers forever rather than free them early.
        Err(_) => std::mem::forget((bufs, keep)),
    }
}

/// Claims one side of a QP or SRQ; the guard gives it back.
pub(super) struct Claim<O: ClaimOwner> {
    pub(super) owner: Arc<O>,
    flag: fn(&O) -> &AtomicBool,
}

pub(super) trait ClaimOwner: Send + Sync + 'static {
    fn graveyard(&self) -> &Mutex<Vec<Box<dyn Send>>>;
}

impl ClaimOwner for crate::qp::QpInner {
    fn graveyard(&self) -> &Mutex<Vec<Box<dyn Send>>> {
        &self.graveyard
    }
}

impl ClaimOwner for crate::srq::SrqInner {
    fn graveyard(&self) -> &Mutex<Vec<Box<dyn Send>>> {
        &self.graveyard
    }
}

impl<O: ClaimOwner> Claim<O> {
    pub(super) fn take(owner: &Arc<O>, flag: fn(&O) -> &AtomicBool, what: &'static str) -> Result<Self> {
        if flag(owner).swap(true, Ordering::AcqRel) {
            return Err(Error::invalid(Verb::Claim, format!("{what} already has an owner")));
        }
        Ok(Claim { owner: Arc::clone(owner), flag })
    }
}

impl<O: ClaimOwner> Drop for Claim<O> {
    fn drop(&mut self) {
        (self.flag)(&self.owner).store(false, Ordering::Release);
    }
}
