//! Counters objects (`struct ibv_counters`): packet and byte counts of the verbs objects
//! they are attached to (flows, in rdma-core 44), read at once (`ibv_read_counters`).

use std::ffi::c_int;
use std::fmt;

use crate::context::Context;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::{Owned, RawObject};

impl RawObject for ffi::ibv_counters {
    const DESTROY: Verb = Verb::DestroyCounters;
    unsafe fn destroy(raw: *mut Self) -> c_int {
        // SAFETY: forwarded from the caller's contract.
        unsafe { ffi::ibv_destroy_counters(raw) }
    }
}

/// What a counter counts (`enum ibv_counter_description`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CounterKind {
    /// Packets (`IBV_COUNTER_PACKETS`).
    Packets,
    /// Bytes (`IBV_COUNTER_BYTES`).
    Bytes,
}

impl CounterKind {
    pub(crate) fn raw(self) -> ffi::ibv_counter_description {
        match self {
            CounterKind::Packets => ffi::ibv_counter_description::IBV_COUNTER_PACKETS,
            CounterKind::Bytes => ffi::ibv_counter_description::IBV_COUNTER_BYTES,
        }
    }
}

/// A counters object (`ibv_create_counters`), destroyed on drop (`ibv_destroy_counters`).
///
/// Counting points are attached at indices ([`attach`](Counters::attach), or
/// [`Flow::attach_counters`](crate::Flow::attach_counters) on a live flow); a flow created
/// with [`FlowSpec::count`](crate::FlowSpec::count) binds them, and
/// [`read`](Counters::read) fills a slice, index by index, with the sums.
///
/// What it promises: no device attribute says whether a provider has counters, so the
/// answer is the call's: a provider without them (rxe) gives [`Error::NotSupported`]
/// naming [`Verb::CreateCounters`] and `EOPNOTSUPP`. A read into an empty slice, or one
/// longer than `u32::MAX`, is [`Error::InvalidArgument`] naming [`Verb::CountersCheck`].
pub struct Counters {
    raw: Owned<ffi::ibv_counters>,
    ctx: Context,
}

// SAFETY: the object is the kernel's; libibverbs lets any thread attach, read and destroy.
unsafe impl Send for Counters {}
// SAFETY: &Counters only attaches and reads, which the provider serialises.
unsafe impl Sync for Counters {}

fn check_read(n: usize) -> Result<u32> {
    match u32::try_from(n) {
        Ok(0) => Err(Error::invalid(Verb::CountersCheck, "an empty slice: no counter to read")),
        Ok(n) => Ok(n),
        Err(_) => Err(Error::invalid(Verb::CountersCheck, format!("{n} counters: more than u32::MAX"))),
    }
}

/// The errno of a counters verb: `EOPNOTSUPP` (and `ENOTSUP`, the same value) is the
/// provider or the object saying no.
fn counters_error(verb: Verb, errno: i32) -> Error {
    Error::verb_or_not_supported(verb, errno, "counters: the provider has no such counters verb")
}

impl Counters {
    /// Creates a counters object, every index at 0 (`ibv_create_counters`).
    #[doc(alias = "ibv_create_counters")]
    pub fn new(ctx: &Context) -> Result<Counters> {
        let mut attr = ffi::ibv_counters_init_attr { comp_mask: 0 };
        // SAFETY: the context is open and `attr` is readable.
        let raw = unsafe { ffi::ibv_create_counters(ctx.as_raw(), &mut attr) };
        if raw.is_null() {
            return Err(Error::last_os_or_not_supported(
                Verb::CreateCounters,
                "counters: the provider has no create_counters",
            ));
        }
        // SAFETY: a new object that only this Owned destroys.
        let raw = unsafe { Owned::new(raw, Verb::CreateCounters)? };
        Ok(Counters { raw, ctx: ctx.clone() })
    }

    /// Attaches a counting point of `kind` at `index`, statically: it counts once a flow
    /// is created with these counters ([`FlowSpec::count`](crate::FlowSpec::count))
    /// (`ibv_attach_counters_point_flow` with no flow). Points at the same index add up.
    /// Once bound to a flow, no more static points are taken (`EBUSY`).
    #[doc(alias = "ibv_attach_counters_point_flow")]
    pub fn attach(&self, kind: CounterKind, index: u32) -> Result<()> {
        self.attach_raw(kind, index, std::ptr::null_mut())
    }

    /// `ibv_attach_counters_point_flow` on `flow` (NULL: static).
    pub(crate) fn attach_raw(&self, kind: CounterKind, index: u32, flow: *mut ffi::ibv_flow) -> Result<()> {
        let mut attr = ffi::ibv_counter_attach_attr { counter_desc: kind.raw(), index, comp_mask: 0 };
        // SAFETY: the counters object is live, `attr` readable, and `flow` NULL or a live
        // flow of the caller's.
        let rc = unsafe { ffi::ibv_attach_counters_point_flow(self.raw.as_ptr(), &mut attr, flow) };
        match rc {
            0 => Ok(()),
            rc => Err(counters_error(Verb::AttachCountersPointFlow, rc.abs())),
        }
    }

    /// Reads `out.len()` counters, index 0 first (`ibv_read_counters`): from the device,
    /// or with `prefer_cached` from the driver's cache where it has one
    /// (`IBV_READ_COUNTERS_ATTR_PREFER_CACHED`).
    #[doc(alias = "ibv_read_counters")]
    pub fn read(&self, out: &mut [u64], prefer_cached: bool) -> Result<()> {
        let n = check_read(out.len())?;
        let flags =
            if prefer_cached { ffi::ibv_read_counters_flags::IBV_READ_COUNTERS_ATTR_PREFER_CACHED.0 } else { 0 };
        // SAFETY: the counters object is live and `out` holds `n` writable u64s.
        let rc = unsafe { ffi::ibv_read_counters(self.raw.as_ptr(), out.as_mut_ptr(), n, flags) };
        match rc {
            0 => Ok(()),
            rc => Err(counters_error(Verb::ReadCounters, rc.abs())),
        }
    }

    /// The raw object, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_counters {
        self.raw.as_ptr()
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Destroys it now (`ibv_destroy_counters`) and reports the result.
    #[doc(alias = "ibv_destroy_counters")]
    pub fn destroy(self) -> Result<()> {
        self.raw.destroy()
    }
}

impl fmt::Debug for Counters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counters").field("raw", &self.raw.as_ptr()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_needs_a_slice_that_fits_the_c_count() {
        assert_eq!(check_read(2).unwrap(), 2);
        let e = check_read(0).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { verb: Verb::CountersCheck, .. }), "{e}");
        if usize::BITS > 32 {
            assert!(check_read(u32::MAX as usize + 1).is_err());
        }
        let e = counters_error(Verb::CreateCounters, libc::EOPNOTSUPP);
        assert!(matches!(&e, Error::NotSupported { verb: Verb::CreateCounters, errno: Some(_), .. }), "{e}");
    }
}
