//! What the installed rdma-core can be trusted with, by release.
//!
//! Some releases have bugs on some providers that a caller cannot see from the API:
//! rdma-core before 55 overruns the consumer index in rxe's extended CQ polling, and
//! before 64 `ibv_wr_set_sge_list` with more than one SGE posts the first SGE's length
//! for all of them, and `ibv_wr_set_inline_data_list` drops the length. The data path
//! asks [`quirks`] and takes the path that works.

use std::ffi::{c_void, CStr};
use std::sync::OnceLock;

use crate::ffi;

/// Which optional paths are safe with the loaded libibverbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quirks {
    /// The rdma-core release of the loaded libibverbs (`1.14.44.0` is release 44), if known.
    pub release: Option<u32>,
    /// `ibv_next_poll` of the extended CQ works on rxe at the end of the queue (release 61
    /// and later: 55 stopped `ibv_end_poll` from passing the producer index after it, 61
    /// the double unlock). Before, [`CompletionQueue::poll_extended`](crate::CompletionQueue::poll_extended)
    /// opens one batch per completion and never calls it.
    pub ext_cq_poll: bool,
    /// `ibv_wr_set_sge_list` with several SGEs works (release 64 and later).
    pub wr_sge_list: bool,
    /// `ibv_wr_set_inline_data_list` works (release 64 and later).
    pub wr_inline_list: bool,
}

impl Quirks {
    /// The quirks of a release; an unknown release is treated as the oldest.
    pub fn of_release(release: Option<u32>) -> Quirks {
        let at_least = |r: u32| release.is_some_and(|v| v >= r);
        Quirks { release, ext_cq_poll: at_least(61), wr_sge_list: at_least(64), wr_inline_list: at_least(64) }
    }
}

static QUIRKS: OnceLock<Quirks> = OnceLock::new();

/// The quirks of the libibverbs this process loaded (computed once).
pub fn quirks() -> &'static Quirks {
    QUIRKS.get_or_init(|| Quirks::of_release(loaded_release()))
}

/// The quirks if they were computed already, for the data path: a send queue's claim
/// computes them (it reads the file system), so a post only loads them, with no call
/// that could unwind (an unwind edge kept the posted request on the stack,
/// scripts/instructions).
#[inline]
pub(crate) fn quirks_known() -> Option<&'static Quirks> {
    QUIRKS.get()
}

/// The rdma-core release of the loaded libibverbs, from its file name
/// (`libibverbs.so.1.<abi>.<release>.0`), found through `dladdr` on one of its symbols.
pub fn loaded_release() -> Option<u32> {
    let path = loaded_object(ffi::dl::address(ffi::dl::Library::Ibverbs)?)?;
    release_of(&path)
}

/// The file of the shared object holding `addr`, symlinks resolved.
pub(crate) fn loaded_object(addr: *const c_void) -> Option<std::path::PathBuf> {
    // SAFETY: Dl_info is plain data; all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address; `info` is a valid out-pointer.
    if addr.is_null() || unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader, valid while the
    // object stays loaded (it does: this process calls into it).
    let name = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    let path = std::path::PathBuf::from(name);
    Some(std::fs::canonicalize(&path).unwrap_or(path))
}

fn release_of(path: &std::path::Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let (_, version) = name.split_once(".so.")?;
    version.split('.').nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_comes_from_the_third_version_field() {
        assert_eq!(release_of("/usr/lib/libibverbs.so.1.14.44.0".as_ref()), Some(44));
        assert_eq!(release_of("/usr/lib/libibverbs.so.1".as_ref()), None);
        assert_eq!(release_of("/usr/lib/libibverbs.so.1.14.fifty.0".as_ref()), None);
    }

    #[test]
    fn old_and_unknown_releases_avoid_the_buggy_paths() {
        for r in [None, Some(44), Some(54), Some(60)] {
            let q = Quirks::of_release(r);
            assert!(!q.ext_cq_poll && !q.wr_sge_list && !q.wr_inline_list, "{q:?}");
        }
        let q = Quirks::of_release(Some(61));
        assert!(q.ext_cq_poll && !q.wr_sge_list);
        assert!(Quirks::of_release(Some(64)).wr_sge_list);
    }

    #[test]
    fn this_process_finds_its_libibverbs() {
        // The test binary links libibverbs, so dladdr must find a versioned file.
        let release = loaded_release();
        assert!(release.is_some_and(|r| r >= 13), "{release:?}");
    }
}
