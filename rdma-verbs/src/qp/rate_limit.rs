//! The send rate limit of a QP (`ibv_modify_qp_rate_limit`, packet pacing).

use crate::caps::device_attr_ex;
use crate::codes::QpType;
use crate::error::{Error, Result, Verb};
use crate::ffi;

use super::QueuePair;

/// A QP's send rate limit ([`QueuePair::set_rate_limit`]; `struct ibv_qp_rate_limit_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateLimit {
    /// The rate in kb/s; 0 lifts the limit.
    pub kbps: u32,
    /// The largest burst in bytes the device may send at once; 0 leaves it to the device.
    pub max_burst_bytes: u32,
    /// The typical packet size in bytes, which some devices pace by; 0 leaves it to the device.
    pub typical_packet_bytes: u16,
}

impl RateLimit {
    /// A limit of `kbps` kb/s, burst and packet size left to the device.
    pub const fn kbps(kbps: u32) -> RateLimit {
        RateLimit { kbps, max_burst_bytes: 0, typical_packet_bytes: 0 }
    }

    /// No limit.
    pub const UNLIMITED: RateLimit = RateLimit::kbps(0);
}

/// The checks of [`QueuePair::set_rate_limit`] against the device's `packet_pacing_caps`.
fn check_rate_limit(caps: &ffi::ibv_packet_pacing_caps, qp_type: QpType, limit: &RateLimit) -> Result<()> {
    if caps.qp_rate_limit_max == 0 {
        return Err(Error::not_supported(
            Verb::QpSetRateLimit,
            "QP rate limits: the device reports packet_pacing_caps.qp_rate_limit_max 0 (ibv_query_device_ex)",
        ));
    }
    if caps.supported_qpts & (1 << qp_type.to_ffi().0) == 0 {
        return Err(Error::not_supported(
            Verb::QpSetRateLimit,
            format!(
                "QP rate limits on {qp_type} QPs: packet_pacing_caps.supported_qpts {:#x} lacks them",
                caps.supported_qpts
            ),
        ));
    }
    let (min, max) = (caps.qp_rate_limit_min, caps.qp_rate_limit_max);
    if limit.kbps != 0 && !(min..=max).contains(&limit.kbps) {
        return Err(Error::invalid(
            Verb::QpSetRateLimit,
            format!("{} kb/s is outside the device's range {min}..={max} kb/s (packet_pacing_caps)", limit.kbps),
        ));
    }
    Ok(())
}

impl QueuePair {
    /// Limits the rate at which the QP sends (`ibv_modify_qp_rate_limit`);
    /// [`RateLimit::UNLIMITED`] lifts the limit.
    ///
    /// The device's `packet_pacing_caps` (`ibv_query_device_ex`) are read first: a device
    /// with `qp_rate_limit_max` 0 (rxe), or without this QP's type in `supported_qpts`,
    /// gives [`Error::NotSupported`] naming [`Verb::QpSetRateLimit`] and the field; a
    /// rate outside `qp_rate_limit_min..=qp_rate_limit_max` is
    /// [`Error::InvalidArgument`]; both before C.
    #[doc(alias = "ibv_modify_qp_rate_limit")]
    pub fn set_rate_limit(&self, limit: RateLimit) -> Result<()> {
        let caps = device_attr_ex(self.context())?.packet_pacing_caps;
        check_rate_limit(&caps, self.qp_type(), &limit)?;
        let mut attr = ffi::ibv_qp_rate_limit_attr {
            rate_limit: limit.kbps,
            max_burst_sz: limit.max_burst_bytes,
            typical_pkt_sz: limit.typical_packet_bytes,
            comp_mask: 0,
        };
        // SAFETY: the QP is live and `attr` is readable.
        let rc = unsafe { ffi::ibv_modify_qp_rate_limit(self.as_raw(), &mut attr) };
        match rc {
            0 => Ok(()),
            rc => Err(Error::verb_or_not_supported(
                Verb::ModifyQpRateLimit,
                rc.abs(),
                "QP rate limits: the provider has no modify_qp_rate_limit",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(min: u32, max: u32, qpts: u32) -> ffi::ibv_packet_pacing_caps {
        ffi::ibv_packet_pacing_caps { qp_rate_limit_min: min, qp_rate_limit_max: max, supported_qpts: qpts }
    }

    #[test]
    fn a_device_without_pacing_is_refused_naming_the_field_and_rates_are_checked_against_its_range() {
        let ud = 1 << ffi::ibv_qp_type::IBV_QPT_UD.0;
        let e = check_rate_limit(&caps(0, 0, 0), QpType::Ud, &RateLimit::kbps(1000)).unwrap_err();
        assert!(matches!(&e, Error::NotSupported { verb: Verb::QpSetRateLimit, errno: None, .. }), "{e}");
        assert!(e.to_string().contains("qp_rate_limit_max 0"), "{e}");
        let e = check_rate_limit(&caps(1, 100_000, ud), QpType::Rc, &RateLimit::kbps(1000)).unwrap_err();
        assert!(e.to_string().contains("supported_qpts"), "{e}");
        assert!(check_rate_limit(&caps(1000, 100_000, ud), QpType::Ud, &RateLimit::kbps(1000)).is_ok());
        assert!(check_rate_limit(&caps(1000, 100_000, ud), QpType::Ud, &RateLimit::UNLIMITED).is_ok());
        let e = check_rate_limit(&caps(1000, 100_000, ud), QpType::Ud, &RateLimit::kbps(999)).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { verb: Verb::QpSetRateLimit, .. }), "{e}");
        assert!(check_rate_limit(&caps(1000, 100_000, ud), QpType::Ud, &RateLimit::kbps(100_001)).is_err());
    }
}
