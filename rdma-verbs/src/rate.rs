//! Static rates (`enum ibv_rate`): the codes an address handle's `static_rate` and a QP's
//! rate limit take, and their rates in Mb/s.

use std::fmt;

use crate::ffi;

/// A static rate code (`enum ibv_rate`), as an address handle's `static_rate` takes it.
/// Codes are not in rate order (they were added as links got faster), so compare
/// [`mbps`](Rate::mbps), never codes. An unknown code is kept as data.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate(u8);

/// Each rate code with its rate in Mb/s, as rdma-core's conversions have it (the
/// 64b/66b rates are their data rates: 25 Gb/s is 25781 Mb/s).
const TABLE: [(ffi::ibv_rate, u32); 23] = {
    use ffi::ibv_rate as R;
    [
        (R::IBV_RATE_2_5_GBPS, 2500),
        (R::IBV_RATE_5_GBPS, 5000),
        (R::IBV_RATE_10_GBPS, 10000),
        (R::IBV_RATE_20_GBPS, 20000),
        (R::IBV_RATE_30_GBPS, 30000),
        (R::IBV_RATE_40_GBPS, 40000),
        (R::IBV_RATE_60_GBPS, 60000),
        (R::IBV_RATE_80_GBPS, 80000),
        (R::IBV_RATE_120_GBPS, 120000),
        (R::IBV_RATE_14_GBPS, 14062),
        (R::IBV_RATE_56_GBPS, 56250),
        (R::IBV_RATE_112_GBPS, 112500),
        (R::IBV_RATE_168_GBPS, 168750),
        (R::IBV_RATE_25_GBPS, 25781),
        (R::IBV_RATE_100_GBPS, 103125),
        (R::IBV_RATE_200_GBPS, 206250),
        (R::IBV_RATE_300_GBPS, 309375),
        (R::IBV_RATE_28_GBPS, 28125),
        (R::IBV_RATE_50_GBPS, 53125),
        (R::IBV_RATE_400_GBPS, 425000),
        (R::IBV_RATE_600_GBPS, 637500),
        (R::IBV_RATE_800_GBPS, 850000),
        (R::IBV_RATE_1200_GBPS, 1275000),
    ]
};

impl Rate {
    /// No limit: the port's full rate (`IBV_RATE_MAX`, code 0).
    pub const MAX: Rate = Rate(0);

    /// The rate with this code (`enum ibv_rate`); unknown codes are kept.
    pub const fn from_code(code: u8) -> Rate {
        Rate(code)
    }

    /// The code, as `ibv_ah_attr.static_rate` takes it.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// The rate in Mb/s (`ibv_rate_to_mbps`); `None` for [`Rate::MAX`] and unknown codes.
    #[doc(alias = "ibv_rate_to_mbps")]
    pub fn mbps(self) -> Option<u32> {
        TABLE.iter().find(|(r, _)| r.0 == u32::from(self.0)).map(|&(_, m)| m)
    }

    /// The code of exactly `mbps` Mb/s (`mbps_to_ibv_rate`), or `None` when no code has
    /// that rate (C answers `IBV_RATE_MAX` then, which would mean "no limit").
    #[doc(alias = "mbps_to_ibv_rate")]
    pub fn from_mbps(mbps: u32) -> Option<Rate> {
        TABLE.iter().find(|&&(_, m)| m == mbps).map(|(r, _)| Rate(r.0 as u8))
    }

    /// The fastest code whose rate is at most `mbps`, or `None` below 2.5 Gb/s: what to
    /// ask for to stay under a budget.
    pub fn at_most_mbps(mbps: u32) -> Option<Rate> {
        TABLE.iter().filter(|&&(_, m)| m <= mbps).max_by_key(|&&(_, m)| m).map(|(r, _)| Rate(r.0 as u8))
    }
}

impl fmt::Debug for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.0, self.mbps()) {
            (0, _) => f.write_str("Rate::MAX"),
            (_, Some(m)) => write!(f, "Rate({m} Mb/s)"),
            (c, None) => write!(f, "Rate(unknown code {c})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libibverbs' `mbps_to_ibv_rate`, missing from the generated bindings: looked up in
    /// the libibverbs this process has loaded (linked, or loaded by `ffi::dl`).
    unsafe fn mbps_to_ibv_rate(mbps: std::ffi::c_int) -> std::ffi::c_uint {
        ffi::dl::load(ffi::dl::Library::Ibverbs).expect("libibverbs loads");
        // SAFETY: RTLD_NOLOAD only finds the library already loaded (just above); the name
        // is a NUL-terminated literal.
        let lib = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        assert!(!lib.is_null(), "libibverbs.so.1 is not loaded");
        // SAFETY: `lib` is a live handle; the name is a NUL-terminated literal.
        let sym = unsafe { libc::dlsym(lib, c"mbps_to_ibv_rate".as_ptr()) };
        assert!(!sym.is_null(), "libibverbs has no mbps_to_ibv_rate");
        // SAFETY: the symbol is libibverbs' `enum ibv_rate mbps_to_ibv_rate(int mbps)`.
        let f: unsafe extern "C" fn(std::ffi::c_int) -> std::ffi::c_uint = unsafe { std::mem::transmute(sym) };
        // SAFETY: a pure function of its argument.
        unsafe { f(mbps) }
    }

    #[test]
    fn every_code_converts_as_libibverbs_converts_it_both_ways() {
        for code in 0..=40u8 {
            // SAFETY: a pure function of its argument.
            let c = unsafe { ffi::ibv_rate_to_mbps(ffi::ibv_rate(code.into())) };
            assert_eq!(Rate::from_code(code).mbps(), u32::try_from(c).ok(), "code {code}");
            if let Some(m) = Rate::from_code(code).mbps() {
                assert_eq!(Rate::from_mbps(m), Some(Rate::from_code(code)));
                // SAFETY: a pure function of its argument.
                assert_eq!(unsafe { mbps_to_ibv_rate(m as _) }, u32::from(code));
            }
        }
        // SAFETY: a pure function of its argument.
        assert_eq!(unsafe { mbps_to_ibv_rate(1234) }, ffi::ibv_rate::IBV_RATE_MAX.0);
        assert_eq!(Rate::from_mbps(1234), None);
        assert_eq!(Rate::MAX.mbps(), None);
    }

    #[test]
    fn known_rates_and_the_fastest_under_a_budget() {
        assert_eq!(Rate::from_mbps(25781).map(Rate::code), Some(15));
        assert_eq!(Rate::from_code(16).mbps(), Some(103125));
        assert_eq!(Rate::at_most_mbps(100_000).and_then(Rate::mbps), Some(80000));
        assert_eq!(Rate::at_most_mbps(2499), None);
        assert_eq!(Rate::at_most_mbps(u32::MAX).and_then(Rate::mbps), Some(1275000));
        assert_eq!(format!("{:?}", Rate::from_code(99)), "Rate(unknown code 99)");
    }
}
