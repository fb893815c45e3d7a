//! Work queues (`struct ibv_wq`) and receive-side scaling tables
//! (`struct ibv_rwq_ind_table`): receive queues of their own, spread over by a hash of
//! each packet's headers.
//!
//! Posting receives to a work queue (`ibv_post_wq_recv`) stays in [`crate::ffi`]: a safe
//! receive path would be a fourth queue type with its own ring of owned buffers, which
//! no test bed device can run (rxe has no work queues).

use std::ffi::c_int;
use std::fmt;
use std::sync::Arc;

use crate::caps::device_attr_ex;
use crate::context::Context;
use crate::cq::{CompletionQueue, CqInner};
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::{Owned, RawObject};
use crate::pd::{PdInner, ProtectionDomain};

impl RawObject for ffi::ibv_wq {
    const DESTROY: Verb = Verb::DestroyWq;
    unsafe fn destroy(raw: *mut Self) -> c_int {
        // SAFETY: forwarded from the caller's contract.
        unsafe { ffi::ibv_destroy_wq(raw) }
    }
}

impl RawObject for ffi::ibv_rwq_ind_table {
    const DESTROY: Verb = Verb::DestroyRwqIndTable;
    unsafe fn destroy(raw: *mut Self) -> c_int {
        // SAFETY: forwarded from the caller's contract.
        unsafe { ffi::ibv_destroy_rwq_ind_table(raw) }
    }
}

/// The state of a work queue (`enum ibv_wq_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WqState {
    /// Just created, or reset: takes no receives (`IBV_WQS_RESET`).
    Reset,
    /// Ready: receives are posted and consumed (`IBV_WQS_RDY`).
    Ready,
    /// In error: outstanding receives complete flushed (`IBV_WQS_ERR`).
    Error,
}

impl WqState {
    fn raw(self) -> ffi::ibv_wq_state {
        match self {
            WqState::Reset => ffi::ibv_wq_state::IBV_WQS_RESET,
            WqState::Ready => ffi::ibv_wq_state::IBV_WQS_RDY,
            WqState::Error => ffi::ibv_wq_state::IBV_WQS_ERR,
        }
    }
}

struct WqInner {
    raw: Owned<ffi::ibv_wq>,
    _cq: Arc<CqInner>,
    _pd: Arc<PdInner>,
    ctx: Context,
}

// SAFETY: the WQ is a kernel object any thread may modify and destroy; its parents are
// Send and Sync.
unsafe impl Send for WqInner {}
// SAFETY: &WqInner gives only the raw pointer.
unsafe impl Sync for WqInner {}

/// A receive work queue (`ibv_create_wq`, `IBV_WQT_RQ`), destroyed on drop
/// (`ibv_destroy_wq`) once no [`RssTable`] holds it. It holds its PD and CQ. Its
/// completions go to the CQ, which it does not reserve room in (there is no safe receive
/// path for it: see the module's note on `ibv_post_wq_recv`).
///
/// What it promises: [`new`](WorkQueue::new) refuses before C ([`Error::InvalidArgument`]
/// naming [`Verb::WorkQueueCheck`]) a depth or scatter count of 0 and a CQ of another
/// context than the PD's; then reads the device's `max_wq_type_rq`, and a device with
/// none (rxe) gives [`Error::NotSupported`] naming [`Verb::WorkQueueCheck`] and that field.
pub struct WorkQueue {
    inner: Arc<WqInner>,
}

fn check_wq(max_wr: u32, max_sge: u32, same_context: bool) -> Result<()> {
    let v = Verb::WorkQueueCheck;
    if max_wr == 0 || max_sge == 0 {
        return Err(Error::invalid(v, format!("max_wr {max_wr}, max_sge {max_sge}: a queue needs room for both")));
    }
    if !same_context {
        return Err(Error::invalid(v, "the CQ belongs to another device context than the PD"));
    }
    Ok(())
}

fn wq_refusal(max_wq_type_rq: u32) -> Option<&'static str> {
    (max_wq_type_rq == 0).then_some("work queues: the device reports max_wq_type_rq 0 (ibv_query_device_ex)")
}

impl WorkQueue {
    /// A receive work queue of `max_wr` receives of up to `max_sge` entries each, its
    /// completions to `cq` (`ibv_create_wq`). It starts in [`WqState::Reset`].
    #[doc(alias = "ibv_create_wq")]
    pub fn new(pd: &ProtectionDomain, cq: &CompletionQueue, max_wr: u32, max_sge: u32) -> Result<WorkQueue> {
        check_wq(max_wr, max_sge, pd.context().as_raw() == cq.context().as_raw())?;
        if let Some(why) = wq_refusal(device_attr_ex(pd.context())?.max_wq_type_rq) {
            return Err(Error::not_supported(Verb::WorkQueueCheck, why));
        }
        let mut attr = ffi::ibv_wq_init_attr {
            wq_context: std::ptr::null_mut(),
            wq_type: ffi::ibv_wq_type::IBV_WQT_RQ,
            max_wr,
            max_sge,
            pd: pd.as_raw(),
            cq: cq.as_raw(),
            comp_mask: 0,
            create_flags: 0,
        };
        // SAFETY: the context, PD and CQ are live and `attr` is readable.
        let raw = unsafe { ffi::ibv_create_wq(pd.context().as_raw(), &mut attr) };
        if raw.is_null() {
            return Err(Error::last_os_or_not_supported(Verb::CreateWq, "work queues: the provider has no create_wq"));
        }
        // SAFETY: a new WQ that only this Owned destroys.
        let raw = unsafe { Owned::new(raw, Verb::CreateWq)? };
        let inner = WqInner { raw, _cq: cq.inner.clone(), _pd: pd.inner.clone(), ctx: pd.context().clone() };
        Ok(WorkQueue { inner: Arc::new(inner) })
    }

    /// Moves the queue to `state` (`ibv_modify_wq` with `IBV_WQ_ATTR_STATE`).
    #[doc(alias = "ibv_modify_wq")]
    pub fn set_state(&self, state: WqState) -> Result<()> {
        // SAFETY: plain data, for which all zeros is valid.
        let mut attr: ffi::ibv_wq_attr = unsafe { std::mem::zeroed() };
        attr.attr_mask = ffi::ibv_wq_attr_mask::IBV_WQ_ATTR_STATE.0;
        attr.wq_state = state.raw();
        // SAFETY: the WQ is live and `attr` is readable.
        match unsafe { ffi::ibv_modify_wq(self.as_raw(), &mut attr) } {
            0 => Ok(()),
            rc => Err(Error::verb_or_not_supported(Verb::ModifyWq, rc.abs(), "work queues: no modify_wq")),
        }
    }

    /// The raw queue, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_wq {
        self.inner.raw.as_ptr()
    }

    /// The queue's number.
    pub fn wq_num(&self) -> u32 {
        // SAFETY: the WQ is live; the number never changes.
        unsafe { (*self.as_raw()).wq_num }
    }
}

impl fmt::Debug for WorkQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkQueue").field("raw", &self.as_raw()).finish()
    }
}

/// A receive-side scaling table (`ibv_create_rwq_ind_table`): the work queues an RSS QP
/// spreads packets over. Destroyed on drop (`ibv_destroy_rwq_ind_table`), before the
/// queues it holds are released.
///
/// What it promises: [`new`](RssTable::new) reads the device's `rss_caps` first, and a
/// device whose `max_rwq_indirection_table_size` is 0 (rxe) gives
/// [`Error::NotSupported`] naming [`Verb::RssTableNew`] and that field, whatever the
/// queues; then refuses ([`Error::InvalidArgument`]) a count of queues that is not a
/// power of two or above that size, and a queue of another context.
pub struct RssTable {
    raw: Owned<ffi::ibv_rwq_ind_table>,
    _wqs: Vec<Arc<WqInner>>,
}

// SAFETY: a kernel object any thread may destroy; the queues are Send and Sync.
unsafe impl Send for RssTable {}
// SAFETY: &RssTable gives only the raw pointer.
unsafe impl Sync for RssTable {}

fn check_table(n: usize, max_size: u32, same_context: bool) -> Result<u32> {
    let v = Verb::RssTableNew;
    if max_size == 0 {
        return Err(Error::not_supported(
            v,
            "RSS: the device reports rss_caps.max_rwq_indirection_table_size 0 (ibv_query_device_ex)",
        ));
    }
    if n == 0 || !n.is_power_of_two() || n as u64 > u64::from(max_size) {
        return Err(Error::invalid(
            v,
            format!("{n} work queues: the table takes a power of two of them, at most {max_size}"),
        ));
    }
    if !same_context {
        return Err(Error::invalid(v, "a work queue belongs to another device context"));
    }
    Ok(n.trailing_zeros())
}

impl RssTable {
    /// A table over `wqs` (`ibv_create_rwq_ind_table`), a power of two of them; the table
    /// keeps them.
    #[doc(alias = "ibv_create_rwq_ind_table")]
    pub fn new(ctx: &Context, wqs: &[&WorkQueue]) -> Result<RssTable> {
        let max = device_attr_ex(ctx)?.rss_caps.max_rwq_indirection_table_size;
        let same = wqs.iter().all(|w| w.inner.ctx.as_raw() == ctx.as_raw());
        let log = check_table(wqs.len(), max, same)?;
        let mut ptrs: Vec<*mut ffi::ibv_wq> = wqs.iter().map(|w| w.as_raw()).collect();
        let mut attr =
            ffi::ibv_rwq_ind_table_init_attr { log_ind_tbl_size: log, ind_tbl: ptrs.as_mut_ptr(), comp_mask: 0 };
        // SAFETY: the context and every WQ are live; `attr` points at 2^log WQ pointers.
        let raw = unsafe { ffi::ibv_create_rwq_ind_table(ctx.as_raw(), &mut attr) };
        if raw.is_null() {
            return Err(Error::last_os_or_not_supported(
                Verb::CreateRwqIndTable,
                "RSS: the provider has no create_rwq_ind_table",
            ));
        }
        // SAFETY: a new table that only this Owned destroys.
        let raw = unsafe { Owned::new(raw, Verb::CreateRwqIndTable)? };
        Ok(RssTable { raw, _wqs: wqs.iter().map(|w| w.inner.clone()).collect() })
    }

    /// The raw table, valid while `self` lives (for `ibv_create_qp_ex`'s `rwq_ind_tbl`).
    pub fn as_raw(&self) -> *mut ffi::ibv_rwq_ind_table {
        self.raw.as_ptr()
    }

    /// Destroys the table now (`ibv_destroy_rwq_ind_table`) and reports the result.
    #[doc(alias = "ibv_destroy_rwq_ind_table")]
    pub fn destroy(self) -> Result<()> {
        let RssTable { raw, .. } = self;
        raw.destroy()
    }
}

impl WorkQueue {
    /// Destroys the queue now (`ibv_destroy_wq`) if no table holds it, and reports the
    /// result; otherwise `EBUSY`, and it is destroyed when the last table is.
    #[doc(alias = "ibv_destroy_wq")]
    pub fn destroy(self) -> Result<()> {
        crate::handle::destroy_shared(self.inner, Verb::DestroyWq, |inner| inner.raw.destroy())
    }
}

impl fmt::Debug for RssTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RssTable").field("raw", &self.raw.as_ptr()).field("wqs", &self._wqs.len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_work_queue_needs_room_and_one_context_and_a_device_with_none_is_refused_naming_the_field() {
        assert!(check_wq(64, 1, true).is_ok());
        let e = check_wq(0, 1, true).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { verb: Verb::WorkQueueCheck, .. }), "{e}");
        assert!(check_wq(64, 0, true).is_err());
        assert!(check_wq(64, 1, false).is_err());
        assert!(wq_refusal(0).unwrap().contains("max_wq_type_rq 0"));
        assert_eq!(wq_refusal(4), None);
    }

    #[test]
    fn an_rss_table_takes_a_power_of_two_of_queues_within_the_devices_size() {
        let e = check_table(4, 0, true).unwrap_err();
        assert!(matches!(&e, Error::NotSupported { verb: Verb::RssTableNew, errno: None, .. }), "{e}");
        assert_eq!(check_table(4, 64, true).unwrap(), 2);
        assert_eq!(check_table(1, 64, true).unwrap(), 0);
        for bad in [0, 3, 128] {
            let e = check_table(bad, 64, true).unwrap_err();
            assert!(matches!(&e, Error::InvalidArgument { verb: Verb::RssTableNew, .. }), "{bad}: {e}");
        }
        assert!(check_table(2, 64, false).is_err());
    }
}
