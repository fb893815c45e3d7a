//! Shared receive queues (`struct ibv_srq`): one pool of receive buffers for many QPs.

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use crate::conv;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::{destroy_shared, Owned};
use crate::pd::ProtectionDomain;

/// What an SRQ holds: the sizes the provider granted (at least what was asked), and the
/// limit that raises `IBV_EVENT_SRQ_LIMIT_REACHED` (0: not armed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// Most outstanding receive work requests.
    pub max_wr: u32,
    /// Most scatter/gather entries in one receive work request.
    pub max_sge: u32,
    /// The armed limit, 0 when not armed.
    pub srq_limit: u32,
}

/// A shared receive queue. Not `Clone`, like a QP's own receive queue; QPs created with
/// [`QueuePairBuilder::srq`](crate::qp::QueuePairBuilder::srq) keep it alive, and it keeps
/// its protection domain alive.
pub struct SharedReceiveQueue {
    pub(crate) inner: Arc<SrqInner>,
}

pub(crate) struct SrqInner {
    raw: Owned<ffi::ibv_srq>,
    /// Buffers of receives still posted when their queue was dropped: freed after the
    /// SRQ (the field above) is destroyed.
    pub(crate) graveyard: Mutex<Vec<Box<dyn Send>>>,
    /// Set while a [`SrqQueue`](crate::queue::SrqQueue) owns the posting side.
    pub(crate) claimed: AtomicBool,
    pub(crate) granted: SrqAttr,
    pd: ProtectionDomain,
}

// SAFETY: SRQ verbs are thread-safe in libibverbs: providers lock the SRQ when posting,
// and modify/query go through the kernel.
unsafe impl Send for SrqInner {}
// SAFETY: as for Send: every verb taking a shared SRQ is safe to call concurrently.
unsafe impl Sync for SrqInner {}

impl SharedReceiveQueue {
    /// Creates an SRQ for at least `max_wr` receives of up to `max_sge` entries each
    /// (`ibv_create_srq`), checked first against the device's `max_srq_wr` and `max_srq_sge`.
    #[doc(alias = "ibv_create_srq")]
    pub fn new(pd: &ProtectionDomain, max_wr: u32, max_sge: u32) -> Result<SharedReceiveQueue> {
        const VERB: Verb = Verb::CreateSrq;
        let dev = pd.context().query_device()?;
        let max_srq_sge = u32::try_from(dev.raw.max_srq_sge).unwrap_or(0);
        if dev.max_srq == 0 {
            return Err(Error::invalid(
                Verb::SrqNew,
                format!("{} has no shared receive queues (max_srq 0)", pd.context().name()),
            ));
        }
        if max_wr == 0 || max_sge == 0 {
            return Err(Error::invalid(Verb::SrqNew, "an SRQ needs max_wr and max_sge of at least 1"));
        }
        if max_wr > dev.max_srq_wr {
            return Err(Error::invalid(
                Verb::SrqNew,
                format!("max_wr {max_wr} exceeds the device's max_srq_wr {}", dev.max_srq_wr),
            ));
        }
        if max_sge > max_srq_sge {
            return Err(Error::invalid(
                Verb::SrqNew,
                format!("max_sge {max_sge} exceeds the device's max_srq_sge {max_srq_sge}"),
            ));
        }
        let mut init =
            ffi::ibv_srq_init_attr { attr: ffi::ibv_srq_attr { max_wr, max_sge, srq_limit: 0 }, ..Default::default() };
        // SAFETY: the PD is live and `init` is valid for reading and writing.
        let raw = unsafe { ffi::ibv_create_srq(pd.as_raw(), &mut init) };
        // SAFETY: a new SRQ that only this Owned destroys.
        let raw = unsafe { Owned::new(raw, VERB)? };
        // The provider wrote back what it granted.
        let granted = SrqAttr { max_wr: init.attr.max_wr, max_sge: init.attr.max_sge, srq_limit: 0 };
        Ok(SharedReceiveQueue {
            inner: Arc::new(SrqInner {
                raw,
                graveyard: Mutex::new(Vec::new()),
                claimed: AtomicBool::new(false),
                granted,
                pd: pd.clone(),
            }),
        })
    }

    /// The sizes the provider granted at creation (at least those asked for).
    pub fn caps(&self) -> SrqAttr {
        self.inner.granted
    }

    /// Arms the limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): when fewer than `limit`
    /// receives remain posted, the device raises one `IBV_EVENT_SRQ_LIMIT_REACHED` async
    /// event and disarms. A limit of 0 disarms.
    #[doc(alias = "ibv_modify_srq")]
    pub fn arm(&self, limit: u32) -> Result<()> {
        let max = self.inner.granted.max_wr;
        if limit > max {
            return Err(Error::invalid(Verb::SrqArm, format!("srq_limit {limit} exceeds the SRQ's max_wr {max}")));
        }
        let mut attr = ffi::ibv_srq_attr { max_wr: 0, max_sge: 0, srq_limit: limit };
        let mask = ffi::ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as i32;
        // SAFETY: the SRQ is live and `attr` is valid for the call.
        let rc = unsafe { ffi::ibv_modify_srq(self.as_raw(), &mut attr, mask) };
        conv::rc(Verb::ModifySrq, rc)
    }

    /// The SRQ's current attributes (`ibv_query_srq`).
    #[doc(alias = "ibv_query_srq")]
    pub fn query(&self) -> Result<SrqAttr> {
        let mut attr = ffi::ibv_srq_attr::default();
        // SAFETY: the SRQ is live and `attr` is a valid out-pointer.
        let rc = unsafe { ffi::ibv_query_srq(self.as_raw(), &mut attr) };
        conv::rc(Verb::QuerySrq, rc)?;
        Ok(SrqAttr { max_wr: attr.max_wr, max_sge: attr.max_sge, srq_limit: attr.srq_limit })
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    /// The raw pointer (for `ibv_post_srq_recv`), valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_srq {
        self.inner.raw.as_ptr()
    }

    /// Destroys the SRQ now and reports the result (`ibv_destroy_srq`). Fails with EBUSY,
    /// destroying nothing yet, while a QP uses it.
    #[doc(alias = "ibv_destroy_srq")]
    pub fn destroy(self) -> Result<()> {
        destroy_shared(self.inner, Verb::DestroySrq, |inner| inner.raw.destroy())
    }
}

impl fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedReceiveQueue").field("caps", &self.inner.granted).finish()
    }
}
