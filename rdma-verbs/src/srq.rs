//! Shared receive queues (`struct ibv_srq`): one pool of receive buffers for many QPs.

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use crate::conv;
use crate::cq::{CompletionQueue, CqInner};
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::{destroy_shared, Owned};
use crate::pd::ProtectionDomain;
use crate::xrc::{require_xrc, XrcDomain};

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
    /// An XRC SRQ's domain and CQ, released after the SRQ is destroyed.
    xrc: Option<(XrcDomain, Arc<CqInner>)>,
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
        check_device_sizes(pd, Verb::SrqNew, max_wr, max_sge)?;
        let mut init =
            ffi::ibv_srq_init_attr { attr: ffi::ibv_srq_attr { max_wr, max_sge, srq_limit: 0 }, ..Default::default() };
        // SAFETY: the PD is live and `init` is valid for reading and writing.
        let raw = unsafe { ffi::ibv_create_srq(pd.as_raw(), &mut init) };
        // SAFETY: a new SRQ that only this Owned destroys.
        let raw = unsafe { Owned::new(raw, Verb::CreateSrq)? };
        // The provider wrote back what it granted.
        Ok(Self::wrap(raw, None, init.attr, pd))
    }

    /// Creates an XRC SRQ in `xrcd` for at least `max_wr` receives of up to `max_sge`
    /// entries each (`ibv_create_srq_ex` with `IBV_SRQT_XRC`), whose completions go to
    /// `cq`. Senders of XRC INI QPs address it by its [`srq_num`](Self::srq_num); its
    /// receives are posted as any SRQ's ([`queue`](Self::queue)). It keeps the domain and
    /// the CQ alive.
    ///
    /// Refused before C ([`Error::InvalidArgument`] naming [`Verb::SrqXrc`]): a PD,
    /// domain and CQ of different device contexts, and sizes as for
    /// [`new`](Self::new); a device without XRC gives [`Error::NotSupported`] naming
    /// [`Verb::SrqXrc`] and `IBV_DEVICE_XRC`, and a provider without `create_srq_ex`
    /// [`Error::NotSupported`] naming [`Verb::CreateSrqEx`] and `EOPNOTSUPP`.
    #[doc(alias = "ibv_create_srq_ex")]
    pub fn xrc(
        pd: &ProtectionDomain,
        xrcd: &XrcDomain,
        cq: &CompletionQueue,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<SharedReceiveQueue> {
        let ctx = pd.context().as_raw();
        check_same_context(ctx, xrcd.context().as_raw(), cq.context().as_raw())?;
        require_xrc(pd.context(), Verb::SrqXrc)?;
        check_device_sizes(pd, Verb::SrqXrc, max_wr, max_sge)?;
        use ffi::ibv_srq_init_attr_mask as M;
        // SAFETY: a C struct of pointers and integers, for which all zeros (NULL, no tag
        // matching) is valid.
        let mut init: ffi::ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
        init.attr = ffi::ibv_srq_attr { max_wr, max_sge, srq_limit: 0 };
        init.comp_mask = M::IBV_SRQ_INIT_ATTR_TYPE.0
            | M::IBV_SRQ_INIT_ATTR_PD.0
            | M::IBV_SRQ_INIT_ATTR_XRCD.0
            | M::IBV_SRQ_INIT_ATTR_CQ.0;
        init.srq_type = ffi::ibv_srq_type::IBV_SRQT_XRC;
        init.pd = pd.as_raw();
        init.xrcd = xrcd.as_raw();
        init.cq = cq.as_raw();
        // SAFETY: the context, PD, domain and CQ are live and of one context (checked
        // above); `init` is valid for reading and writing.
        let raw = unsafe { ffi::ibv_create_srq_ex(ctx, &mut init) };
        if raw.is_null() {
            return Err(Error::last_os_or_not_supported(
                Verb::CreateSrqEx,
                "XRC SRQs: the provider has no create_srq_ex",
            ));
        }
        // SAFETY: a new SRQ that only this Owned destroys.
        let raw = unsafe { Owned::new(raw, Verb::CreateSrqEx)? };
        let xrc = Some((XrcDomain::clone(xrcd), Arc::clone(&cq.inner)));
        Ok(Self::wrap(raw, xrc, init.attr, pd))
    }

    fn wrap(
        raw: Owned<ffi::ibv_srq>,
        xrc: Option<(XrcDomain, Arc<CqInner>)>,
        granted: ffi::ibv_srq_attr,
        pd: &ProtectionDomain,
    ) -> SharedReceiveQueue {
        let granted = SrqAttr { max_wr: granted.max_wr, max_sge: granted.max_sge, srq_limit: 0 };
        SharedReceiveQueue {
            inner: Arc::new(SrqInner {
                raw,
                xrc,
                graveyard: Mutex::new(Vec::new()),
                claimed: AtomicBool::new(false),
                granted,
                pd: pd.clone(),
            }),
        }
    }

    /// The number senders address this XRC SRQ by (`ibv_get_srq_num`): an XRC INI QP's
    /// send names it as its target.
    ///
    /// Refused before C: on a device without XRC, [`Error::NotSupported`] naming
    /// [`Verb::SrqNum`] and `IBV_DEVICE_XRC` (such a device has no SRQ numbers to give);
    /// on an SRQ not made by [`xrc`](Self::xrc), [`Error::InvalidArgument`].
    #[doc(alias = "ibv_get_srq_num")]
    pub fn srq_num(&self) -> Result<u32> {
        if self.inner.xrc.is_none() {
            require_xrc(self.pd().context(), Verb::SrqNum)?;
            return Err(Error::invalid(
                Verb::SrqNum,
                "only an XRC SRQ (SharedReceiveQueue::xrc) has a number senders address",
            ));
        }
        let mut num = 0u32;
        // SAFETY: the SRQ is live and `num` is writable.
        let rc = unsafe { ffi::ibv_get_srq_num(self.as_raw(), &mut num) };
        match rc {
            0 => Ok(num),
            rc => Err(Error::verb_or_not_supported(Verb::GetSrqNum, rc.abs(), "XRC: the provider has no get_srq_num")),
        }
    }

    /// Whether this is an XRC SRQ ([`xrc`](Self::xrc)).
    pub fn is_xrc(&self) -> bool {
        self.inner.xrc.is_some()
    }

    /// The XRC domain of an XRC SRQ.
    pub fn xrcd(&self) -> Option<&XrcDomain> {
        self.inner.xrc.as_ref().map(|(x, _)| x)
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

/// The device's SRQ limits, then `max_wr` and `max_sge` against them.
fn check_device_sizes(pd: &ProtectionDomain, verb: Verb, max_wr: u32, max_sge: u32) -> Result<()> {
    let dev = pd.context().query_device()?;
    let limits = SrqLimits {
        max_srq: dev.max_srq,
        max_srq_wr: dev.max_srq_wr,
        max_srq_sge: u32::try_from(dev.raw.max_srq_sge).unwrap_or(0),
    };
    check_sizes(pd.context().name(), verb, limits, max_wr, max_sge)
}

#[derive(Clone, Copy)]
struct SrqLimits {
    max_srq: u32,
    max_srq_wr: u32,
    max_srq_sge: u32,
}

fn check_sizes(device: &str, verb: Verb, dev: SrqLimits, max_wr: u32, max_sge: u32) -> Result<()> {
    if dev.max_srq == 0 {
        return Err(Error::invalid(verb, format!("{device} has no shared receive queues (max_srq 0)")));
    }
    if max_wr == 0 || max_sge == 0 {
        return Err(Error::invalid(verb, "an SRQ needs max_wr and max_sge of at least 1"));
    }
    if max_wr > dev.max_srq_wr {
        return Err(Error::invalid(
            verb,
            format!("max_wr {max_wr} exceeds the device's max_srq_wr {}", dev.max_srq_wr),
        ));
    }
    if max_sge > dev.max_srq_sge {
        return Err(Error::invalid(
            verb,
            format!("max_sge {max_sge} exceeds the device's max_srq_sge {}", dev.max_srq_sge),
        ));
    }
    Ok(())
}

/// An XRC SRQ's PD, domain and CQ must be of one device context.
fn check_same_context(pd: *mut ffi::ibv_context, xrcd: *mut ffi::ibv_context, cq: *mut ffi::ibv_context) -> Result<()> {
    if xrcd != pd || cq != pd {
        return Err(Error::invalid(
            Verb::SrqXrc,
            "the PD, the XRC domain and the CQ of an XRC SRQ must belong to one device context",
        ));
    }
    Ok(())
}

impl fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedReceiveQueue").field("caps", &self.inner.granted).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEV: SrqLimits = SrqLimits { max_srq: 64, max_srq_wr: 1024, max_srq_sge: 4 };

    #[test]
    fn xrc_srq_sizes_are_checked_against_the_device_before_c_naming_our_method() {
        assert!(check_sizes("d", Verb::SrqXrc, DEV, 1024, 4).is_ok());
        let e = check_sizes("d", Verb::SrqXrc, DEV, 1025, 1).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { verb: Verb::SrqXrc, .. }), "{e}");
        assert!(e.to_string().contains("SharedReceiveQueue::xrc") && e.to_string().contains("max_srq_wr 1024"), "{e}");
        assert!(check_sizes("d", Verb::SrqXrc, DEV, 1, 5).unwrap_err().to_string().contains("max_srq_sge 4"));
        assert!(check_sizes("d", Verb::SrqXrc, DEV, 0, 1).is_err());
        assert!(check_sizes("d", Verb::SrqXrc, DEV, 1, 0).is_err());
        let none = SrqLimits { max_srq: 0, ..DEV };
        assert!(check_sizes("d", Verb::SrqNew, none, 1, 1).unwrap_err().to_string().contains("max_srq 0"));
    }

    #[test]
    fn an_xrc_srq_of_objects_of_two_contexts_is_refused_before_c() {
        let (a, b) = (8usize as *mut ffi::ibv_context, 16usize as *mut ffi::ibv_context);
        assert!(check_same_context(a, a, a).is_ok());
        for (x, c) in [(b, a), (a, b), (b, b)] {
            let e = check_same_context(a, x, c).unwrap_err();
            assert!(matches!(&e, Error::InvalidArgument { verb: Verb::SrqXrc, .. }), "{e}");
        }
    }
}
