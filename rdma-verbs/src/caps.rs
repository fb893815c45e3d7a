//! The extended device attributes (`ibv_query_device_ex`) that the checks before C read:
//! ODP, XRC, device memory, CQ moderation.

use std::ptr;

use crate::context::Context;
use crate::conv;
use crate::error::{Result, Verb};
use crate::ffi;

/// RDMA ATOMIC WRITE (IBTA 1.5) in `device_cap_flags_ex`: the kernel's
/// `IB_UVERBS_DEVICE_ATOMIC_WRITE` (Linux 6.2's `ib_user_verbs.h`), which rdma-core 44's
/// headers predate; libibverbs passes the kernel's bits through.
pub(crate) const DEVICE_ATOMIC_WRITE: u64 = 1 << 40;

/// What a device without RDMA ATOMIC WRITE lacks, as [`Error::NotSupported`](crate::Error::NotSupported) names it.
pub(crate) const NO_ATOMIC_WRITE: &str =
    "RDMA ATOMIC WRITE: the device's device_cap_flags_ex lack IB_UVERBS_DEVICE_ATOMIC_WRITE (bit 40, \
     ibv_query_device_ex; rxe has it from Linux 6.2)";

/// What a device whose `atomic_cap` is `IBV_ATOMIC_NONE` lacks (siw), as
/// [`Error::NotSupported`](crate::Error::NotSupported) names it.
pub(crate) const NO_ATOMICS: &str =
    "atomics (compare and swap, fetch and add): the device's atomic_cap is IBV_ATOMIC_NONE";

/// What an iWARP device lacks: RDMAP (RFC 5040) carries no immediate data, and iWARP
/// providers (siw) refuse it at post.
pub(crate) const NO_IMM: &str = "immediate data (SEND and RDMA WRITE with immediate): the device is iWARP \
     (transport iWARP), and RDMAP (RFC 5040) carries no immediate data";

/// The device's extended attributes; the fields a provider does not fill stay zero (a
/// capability reported absent).
pub(crate) fn device_attr_ex(ctx: &Context) -> Result<ffi::ibv_device_attr_ex> {
    // SAFETY: a plain C struct of integers, for which all zeros is valid.
    let mut attr: ffi::ibv_device_attr_ex = unsafe { std::mem::zeroed() };
    // SAFETY: the context is open, no input, and `attr` is writable.
    let rc = unsafe { ffi::ibv_query_device_ex(ctx.as_raw(), ptr::null(), &mut attr) };
    conv::errno(Verb::QueryDeviceEx, rc)?;
    Ok(attr)
}

/// What the device can do beyond [`DeviceAttr`](crate::DeviceAttr)
/// (`ibv_query_device_ex`): the capabilities the newer verbs depend on, with the most
/// asked-for typed and the whole C struct in [`raw`](Self::raw). A capability a provider
/// does not report reads as zero (absent).
#[derive(Clone)]
pub struct DeviceAttrEx {
    /// The classic attributes, as [`Context::query_device`] gives them.
    pub base: crate::DeviceAttr,
    /// On-demand paging: `ibv_odp_general_caps` bits (0: no ODP).
    pub odp_general_caps: u64,
    /// On-demand paging per transport (`ibv_odp_transport_cap_bits`): RC, UC, UD.
    pub odp_transport_caps: (u32, u32, u32),
    /// The bits of a completion timestamp that are valid (0: no timestamps).
    pub completion_timestamp_mask: u64,
    /// The device clock in kHz (0: none).
    pub hca_core_clock_khz: u64,
    /// `ibv_device_cap_flags` and the extended bits above them.
    pub device_cap_flags_ex: u64,
    /// CQ moderation: the most completions and the longest period (microseconds) a CQ
    /// waits for (both 0: none).
    pub cq_moderation: (u16, u16),
    /// The most device memory one allocation may have, in bytes (0: none).
    pub max_dm_size: u64,
    /// The number of physical ports, without the 8-bit limit of
    /// [`DeviceAttr::phys_port_cnt`](crate::DeviceAttr::phys_port_cnt).
    pub phys_port_cnt: u32,
    raw: ffi::ibv_device_attr_ex,
}

impl DeviceAttrEx {
    /// The whole C struct, for the capabilities not typed here (TSO, RSS, packet pacing,
    /// tag matching, PCI atomics, XRC ODP).
    pub fn raw(&self) -> &ffi::ibv_device_attr_ex {
        &self.raw
    }
}

/// The capabilities of [`DeviceAttrEx`] that each list the QP types they cover (their
/// `supported_qpts` mask, one bit per `ibv_qp_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpTypeCap {
    /// TCP segmentation offload (`tso_caps`).
    Tso,
    /// Receive-side scaling (`rss_caps`).
    Rss,
    /// Packet pacing, the QP rate limit (`packet_pacing_caps`).
    PacketPacing,
}

impl DeviceAttrEx {
    /// The `supported_qpts` mask of `cap`: bit `t` set for each `ibv_qp_type` `t` it covers.
    pub fn supported_qpts(&self, cap: QpTypeCap) -> u32 {
        match cap {
            QpTypeCap::Tso => self.raw.tso_caps.supported_qpts,
            QpTypeCap::Rss => self.raw.rss_caps.supported_qpts,
            QpTypeCap::PacketPacing => self.raw.packet_pacing_caps.supported_qpts,
        }
    }

    /// Whether `cap` covers QPs of type `qp_type` (`ibv_is_qpt_supported` over its
    /// `supported_qpts`). `qp_type` is the C enum, so that types without a [`QpType`]
    /// (raw packet, XRC) can be asked about; a value past bit 31 is not covered.
    ///
    /// [`QpType`]: crate::QpType
    #[doc(alias = "ibv_is_qpt_supported")]
    pub fn qp_type_supported(&self, cap: QpTypeCap, qp_type: ffi::ibv_qp_type) -> bool {
        ffi::ibv_is_qpt_supported(self.supported_qpts(cap), qp_type) != 0
    }
}

impl std::fmt::Debug for DeviceAttrEx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceAttrEx")
            .field("odp_general_caps", &format_args!("{:#x}", self.odp_general_caps))
            .field("completion_timestamp_mask", &format_args!("{:#x}", self.completion_timestamp_mask))
            .field("hca_core_clock_khz", &self.hca_core_clock_khz)
            .field("device_cap_flags_ex", &format_args!("{:#x}", self.device_cap_flags_ex))
            .field("cq_moderation", &self.cq_moderation)
            .field("max_dm_size", &self.max_dm_size)
            .field("phys_port_cnt", &self.phys_port_cnt)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// What the device can do, extended (`ibv_query_device_ex`): ODP, timestamps, the
    /// device clock, CQ moderation, device memory, the port count past 255.
    #[doc(alias = "ibv_query_device_ex")]
    pub fn query_device_ex(&self) -> Result<DeviceAttrEx> {
        Ok(DeviceAttrEx::from_raw(device_attr_ex(self)?))
    }
}

impl DeviceAttrEx {
    fn from_raw(raw: ffi::ibv_device_attr_ex) -> DeviceAttrEx {
        let odp = raw.odp_caps.per_transport_caps;
        // Providers that predate phys_port_cnt_ex leave it 0: the classic count stands.
        let phys_port_cnt = match raw.phys_port_cnt_ex {
            0 => u32::from(raw.orig_attr.phys_port_cnt),
            n => n,
        };
        DeviceAttrEx {
            base: crate::DeviceAttr::from_raw(&raw.orig_attr),
            odp_general_caps: raw.odp_caps.general_caps,
            odp_transport_caps: (odp.rc_odp_caps, odp.uc_odp_caps, odp.ud_odp_caps),
            completion_timestamp_mask: raw.completion_timestamp_mask,
            hca_core_clock_khz: raw.hca_core_clock,
            device_cap_flags_ex: raw.device_cap_flags_ex,
            cq_moderation: (raw.cq_mod_caps.max_cq_count, raw.cq_mod_caps.max_cq_period),
            max_dm_size: raw.max_dm_size,
            phys_port_cnt,
            raw,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ffi::ibv_qp_type as T;

    #[test]
    fn each_capability_covers_the_qp_types_of_its_own_mask() {
        // SAFETY: a plain C struct of integers, for which all zeros is valid.
        let mut raw: ffi::ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        raw.tso_caps.supported_qpts = (1 << T::IBV_QPT_RAW_PACKET.0) | (1 << T::IBV_QPT_UD.0);
        raw.rss_caps.supported_qpts = 1 << T::IBV_QPT_RAW_PACKET.0;
        raw.packet_pacing_caps.supported_qpts = 1 << T::IBV_QPT_RC.0;
        let attr = DeviceAttrEx::from_raw(raw);
        assert_eq!(attr.supported_qpts(QpTypeCap::Tso), 0x110);
        assert!(attr.qp_type_supported(QpTypeCap::Tso, T::IBV_QPT_RAW_PACKET));
        assert!(attr.qp_type_supported(QpTypeCap::Tso, T::IBV_QPT_UD));
        assert!(!attr.qp_type_supported(QpTypeCap::Tso, T::IBV_QPT_RC));
        assert!(attr.qp_type_supported(QpTypeCap::Rss, T::IBV_QPT_RAW_PACKET));
        assert!(!attr.qp_type_supported(QpTypeCap::Rss, T::IBV_QPT_UD));
        assert!(attr.qp_type_supported(QpTypeCap::PacketPacing, T::IBV_QPT_RC));
        assert!(!attr.qp_type_supported(QpTypeCap::PacketPacing, T::IBV_QPT_RAW_PACKET));
        // A type past bit 31 is not covered, even by a full mask.
        raw.tso_caps.supported_qpts = u32::MAX;
        let attr = DeviceAttrEx::from_raw(raw);
        assert!(attr.qp_type_supported(QpTypeCap::Tso, T::IBV_QPT_XRC_RECV));
        assert!(!attr.qp_type_supported(QpTypeCap::Tso, T(32)));
        assert!(!attr.qp_type_supported(QpTypeCap::Tso, T::IBV_QPT_DRIVER), "IBV_QPT_DRIVER is 255");
    }
}
