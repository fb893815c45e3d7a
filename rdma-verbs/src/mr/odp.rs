//! On-demand paging (ODP): regions whose pages are not pinned, faulted in by the device
//! as it touches them, and prefetch advice for them (`ibv_advise_mr`).

use super::*;
use crate::caps::device_attr_ex;

/// Why a device that reports `general_caps` cannot take an `ON_DEMAND` region, or `None`.
pub(super) fn odp_refusal(general_caps: u64) -> Option<&'static str> {
    let support = u64::from(ffi::ibv_odp_general_caps::IBV_ODP_SUPPORT.0);
    (general_caps & support == 0).then_some(
        "on-demand paging: the device reports odp_caps.general_caps without IBV_ODP_SUPPORT (ibv_query_device_ex)",
    )
}

/// Refuses `ON_DEMAND` in `access` before C when the device has no ODP (naming `verb`).
pub(super) fn check_on_demand(pd: &ProtectionDomain, access: AccessFlags, verb: Verb) -> Result<()> {
    if !access.contains(AccessFlags::ON_DEMAND) {
        return Ok(());
    }
    let caps = device_attr_ex(pd.context())?.odp_caps;
    match odp_refusal(caps.general_caps) {
        Some(why) => Err(Error::not_supported(verb, why)),
        None => Ok(()),
    }
}

/// [`check_on_demand`] for a check made on `ibv_reg_mr`'s (or `ibv_rereg_mr`'s) behalf.
pub(super) fn check_access(pd: &ProtectionDomain, access: AccessFlags) -> Result<()> {
    check_on_demand(pd, access, Verb::RegMr)
}

/// What to tell the device about a range of an ODP region ([`MemoryRegion::advise`];
/// `enum ib_uverbs_advise_mr_advice`).
#[doc(alias = "ib_uverbs_advise_mr_advice")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Advice {
    /// Fault the pages in for reading (`IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH`).
    Prefetch,
    /// Fault the pages in for writing (`..._PREFETCH_WRITE`); the region needs `LOCAL_WRITE`.
    PrefetchWrite,
    /// Map the pages that are present without faulting in the others
    /// (`..._PREFETCH_NO_FAULT`).
    PrefetchNoFault,
}

impl Advice {
    fn raw(self) -> ffi::ib_uverbs_advise_mr_advice {
        use ffi::ib_uverbs_advise_mr_advice as A;
        match self {
            Advice::Prefetch => A::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH,
            Advice::PrefetchWrite => A::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE,
            Advice::PrefetchNoFault => A::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT,
        }
    }
}

/// The checks of [`MemoryRegion::advise`] that need no device.
pub(super) fn check_advise(access: AccessFlags, advice: Advice, len: u32) -> Result<()> {
    if !access.contains(AccessFlags::ON_DEMAND) {
        return Err(Error::invalid(
            Verb::MrAdvise,
            format!(
                "the region was registered with {access:?}, without ON_DEMAND: advice applies only to \
                 on-demand regions (register_on_demand)"
            ),
        ));
    }
    if advice == Advice::PrefetchWrite && !access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(Error::invalid(Verb::MrAdvise, "PrefetchWrite needs a region with LOCAL_WRITE"));
    }
    if len == 0 {
        return Err(Error::invalid(Verb::MrAdvise, "an empty range: nothing to advise"));
    }
    Ok(())
}

impl ProtectionDomain {
    /// Registers `buf` with on-demand paging (`ibv_reg_mr` with `IBV_ACCESS_ON_DEMAND`,
    /// added for you): the pages are not pinned, the device faults them in as it
    /// touches them, and [`MemoryRegion::advise`] can prefetch them. Mode `A` is chosen
    /// as for [`MemoryRegion::new`].
    ///
    /// The device's `odp_caps` (`ibv_query_device_ex`) are read first: a device without
    /// `IBV_ODP_SUPPORT` (rxe of Linux 6.1) gives [`Error::NotSupported`] naming
    /// [`Verb::PdRegisterOnDemand`] before any C call, and the buffer is dropped. Which
    /// operations a transport may run on such a region is in
    /// `odp_caps.per_transport_caps` and is not checked here: the device fails what it
    /// cannot do.
    #[doc(alias = "IBV_ACCESS_ON_DEMAND")]
    pub fn register_on_demand<B: RegisterableBuffer, A: AccessMode>(
        &self,
        buf: B,
        access: AccessFlags,
    ) -> Result<MemoryRegion<B, A>> {
        let access = access | AccessFlags::ON_DEMAND;
        if let Err(e) = check_on_demand(self, access, Verb::PdRegisterOnDemand) {
            drop(buf);
            return Err(e);
        }
        MemoryRegion::new(self, buf, access)
    }
}

impl<B: RegisterableBuffer, A: AccessMode> MemoryRegion<B, A> {
    /// Advises the device about `range` of this on-demand region (`ibv_advise_mr`),
    /// typically to prefetch pages before the data path touches them. With `flush` the
    /// call returns once the advice was carried out (`IBV_ADVISE_MR_FLAG_FLUSH`);
    /// otherwise it may be carried out later, or not at all: advice is a hint.
    ///
    /// Refused before C ([`Error::InvalidArgument`] naming [`Verb::MrAdvise`]): a region
    /// without `ON_DEMAND`, `PrefetchWrite` on one without `LOCAL_WRITE`, an empty or
    /// out-of-bounds range. A provider without the verb gives [`Error::NotSupported`]
    /// naming [`Verb::AdviseMr`] and `EOPNOTSUPP`.
    #[doc(alias = "ibv_advise_mr")]
    pub fn advise(&self, advice: Advice, range: impl RangeBounds<usize>, flush: bool) -> Result<()> {
        let r =
            resolve(Verb::MrAdvise, usize_bound(range.start_bound()), usize_bound(range.end_bound()), self.len as u64)?;
        let length = u32::try_from(r.end - r.start)
            .map_err(|_| Error::invalid(Verb::MrAdvise, "a range above 4 GiB: advise it in parts"))?;
        check_advise(self.access, advice, length)?;
        let mut sge = ffi::ibv_sge { addr: self.addr() + r.start, length, lkey: self.lkey };
        let flags = if flush { ffi::ib_uverbs_advise_mr_flag::IB_UVERBS_ADVISE_MR_FLAG_FLUSH.0 } else { 0 };
        // SAFETY: the PD is live (the region holds it) and `sge` is one readable entry
        // naming bytes of this live region.
        let rc = unsafe { ffi::ibv_advise_mr(self.pd.as_raw(), advice.raw(), flags, &mut sge, 1) };
        match rc {
            0 => Ok(()),
            rc => {
                Err(Error::verb_or_not_supported(Verb::AdviseMr, rc.abs(), "ODP advice: the provider has no advise_mr"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_without_odp_support_is_named_by_its_capability_bit() {
        assert!(odp_refusal(0).unwrap().contains("IBV_ODP_SUPPORT"));
        // IMPLICIT alone is not support.
        assert!(odp_refusal(2).is_some());
        assert_eq!(odp_refusal(1), None);
        assert_eq!(odp_refusal(3), None);
    }

    #[test]
    fn advice_is_refused_before_c_for_pinned_regions_write_without_local_write_and_empty_ranges() {
        let odp = AccessFlags::ON_DEMAND | AccessFlags::LOCAL_WRITE;
        assert!(check_advise(odp, Advice::Prefetch, 4096).is_ok());
        assert!(check_advise(odp, Advice::PrefetchWrite, 4096).is_ok());
        let e = check_advise(AccessFlags::LOCAL_WRITE, Advice::Prefetch, 4096).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::MrAdvise, .. }), "{e}");
        assert!(e.to_string().contains("without ON_DEMAND"), "{e}");
        let e = check_advise(AccessFlags::ON_DEMAND, Advice::PrefetchWrite, 4096).unwrap_err();
        assert!(e.to_string().contains("LOCAL_WRITE"), "{e}");
        assert!(check_advise(AccessFlags::ON_DEMAND, Advice::PrefetchNoFault, 4096).is_ok());
        assert!(check_advise(odp, Advice::Prefetch, 0).is_err());
    }

    #[test]
    fn advice_values_come_from_the_c_enum() {
        assert_eq!(Advice::Prefetch.raw().0, 0);
        assert_eq!(Advice::PrefetchWrite.raw().0, 1);
        assert_eq!(Advice::PrefetchNoFault.raw().0, 2);
    }
}
