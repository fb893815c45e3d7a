//! Fork safety (`ibv_fork_init`, `ibv_is_fork_initialized`): whether a child process
//! created by `fork()` can break the parent's registered memory.

use crate::error::{Error, Result, Verb};
use crate::ffi;

/// Whether registered memory survives a `fork()` of this process
/// (`enum ibv_fork_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ForkStatus {
    /// Not protected: after a `fork()`, the parent's first write to a registered page may
    /// move it (copy-on-write), and the device keeps using the old one.
    Disabled,
    /// Protected by libibverbs: registered ranges are marked `MADV_DONTFORK`, so the child
    /// does not see them at all.
    Enabled,
    /// The kernel copies pinned pages at `fork()` (copy-on-fork, Linux 5.13 on): nothing
    /// to do, and the child sees the memory as an ordinary copy.
    Unneeded,
    /// A value this crate does not know.
    Unknown(u32),
}

impl ForkStatus {
    fn from_raw(s: ffi::ibv_fork_status) -> Self {
        use ffi::ibv_fork_status as S;
        match s {
            S::IBV_FORK_DISABLED => ForkStatus::Disabled,
            S::IBV_FORK_ENABLED => ForkStatus::Enabled,
            S::IBV_FORK_UNNEEDED => ForkStatus::Unneeded,
            S(v) => ForkStatus::Unknown(v),
        }
    }
}

/// Whether registered memory is safe across `fork()` (`ibv_is_fork_initialized`).
#[doc(alias = "ibv_is_fork_initialized")]
pub fn fork_status() -> ForkStatus {
    // Without libibverbs (feature `dlopen`) nothing can be registered, and nothing protected.
    if ffi::dl::load(ffi::dl::Library::Ibverbs).is_err() {
        return ForkStatus::Disabled;
    }
    // SAFETY: no arguments; the call reads libibverbs' state and asks the kernel (netlink)
    // whether it copies pinned pages on fork.
    ForkStatus::from_raw(unsafe { ffi::ibv_is_fork_initialized() })
}

/// Makes registered memory safe across `fork()` (`ibv_fork_init`) and returns the status
/// now.
///
/// Where the kernel copies pinned pages at `fork()` ([`ForkStatus::Unneeded`], Linux
/// 5.13 on, the test bed's 6.1) this calls nothing and returns at once: there is nothing
/// to protect, at any time. Otherwise libibverbs marks every range registered from then
/// on `MADV_DONTFORK`; it can do so only for ranges registered *after* this call, so
/// once a region was registered (or deregistered) without it, `ibv_fork_init` refuses
/// with `EINVAL`, which comes back as [`Error::Verb`] naming [`Verb::ForkInit`] with a
/// hint saying so. Call it first thing (or set `RDMAV_FORK_SAFE=1`, which does it as
/// libibverbs loads).
#[doc(alias = "ibv_fork_init")]
pub fn fork_init() -> Result<ForkStatus> {
    let status = fork_status();
    if matches!(status, ForkStatus::Unneeded | ForkStatus::Enabled) {
        return Ok(status);
    }
    ffi::dl::load(ffi::dl::Library::Ibverbs)?;
    // SAFETY: no arguments; libibverbs sets its own state under its own rules.
    let rc = unsafe { ffi::ibv_fork_init() };
    match rc {
        0 => Ok(fork_status()),
        rc => Err(init_error(rc.abs())),
    }
}

fn init_error(errno: i32) -> Error {
    let e = Error::verb(Verb::ForkInit, errno);
    match errno {
        libc::EINVAL => e.with_hint(
            "a memory region was registered before fork_init, and its range cannot be protected any more: call \
             fork_init before the first registration, or set RDMAV_FORK_SAFE=1",
        ),
        libc::ENOSYS => e.with_hint("madvise(MADV_DONTFORK) is not available on this kernel"),
        _ => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_and_unknown_ones_are_kept() {
        use ffi::ibv_fork_status as S;
        assert_eq!(ForkStatus::from_raw(S::IBV_FORK_DISABLED), ForkStatus::Disabled);
        assert_eq!(ForkStatus::from_raw(S::IBV_FORK_ENABLED), ForkStatus::Enabled);
        assert_eq!(ForkStatus::from_raw(S::IBV_FORK_UNNEEDED), ForkStatus::Unneeded);
        assert_eq!(ForkStatus::from_raw(S(7)), ForkStatus::Unknown(7));
    }

    #[test]
    fn too_late_is_an_error_naming_ibv_fork_init_with_the_order_to_follow() {
        let e = init_error(libc::EINVAL);
        assert!(matches!(&e, Error::Verb { verb: Verb::ForkInit, .. }), "{e}");
        assert!(e.to_string().contains("before the first registration"), "{e}");
    }
}
