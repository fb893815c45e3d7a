//! The import of verbs objects between processes (issue #33): a context shared by its
//! command descriptor (`Context::cmd_fd`, `Context::import`), and the PD and region handles
//! another process imports (`ProtectionDomain::import`, `ImportedRegion::import`). rxe has
//! no import (rdma-core 44: only mlx5 implements `import_context`, `import_pd` and
//! `import_mr`), so on the test bed each import is a typed `NotSupported` naming its verb
//! and `EOPNOTSUPP`; the handles themselves are real and checked here.

use std::os::fd::{AsFd, AsRawFd};

use rdma_verbs::{AccessFlags, AlignedBuf, Context, Error, ImportedRegion, ProtectionDomain, Verb};

use crate::LeakCheck;

fn is_not_supported(e: &Error, verb: Verb) -> bool {
    matches!(e, Error::NotSupported { verb: v, errno: Some(libc::EOPNOTSUPP), .. } if *v == verb)
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn pd_and_region_handles_are_the_kernels_distinct_small_ids_of_one_context() {
    let _leaks = LeakCheck::new();
    let ctx = crate::open();
    let pd1 = ProtectionDomain::new(&ctx).unwrap();
    let pd2 = ProtectionDomain::new(&ctx).unwrap();
    let mr = pd1.register(AlignedBuf::new(4096).unwrap(), AccessFlags::LOCAL_WRITE).unwrap();
    let handles = [pd1.handle(), pd2.handle(), mr.handle()];
    // One id space per context (the uverbs file's xarray) holds every object's handle.
    assert!(handles[0] != handles[1] && handles[1] != handles[2] && handles[0] != handles[2], "{handles:?}");
    assert!(handles.iter().all(|&h| h < 64), "a fresh context's first ids: {handles:?}");
    // SAFETY: the PD and region are live; this reads the field the methods read.
    let raw = unsafe { [(*pd1.as_raw()).handle, (*pd2.as_raw()).handle, (*mr.as_raw()).handle] };
    assert_eq!(handles, raw);
    assert!(!pd1.is_imported());
    eprintln!("handles: pd {} pd {} mr {}", handles[0], handles[1], handles[2]);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn importing_a_pd_or_a_region_on_rxe_is_not_supported_naming_the_import_verb() {
    let _leaks = LeakCheck::new();
    let ctx = crate::open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mr = pd.register(AlignedBuf::new(4096).unwrap(), AccessFlags::LOCAL_WRITE).unwrap();
    let e = ProtectionDomain::import(&ctx, pd.handle()).unwrap_err();
    assert!(is_not_supported(&e, Verb::ImportPd), "{e:?}");
    let e = ImportedRegion::import(&pd, mr.handle()).unwrap_err();
    assert!(is_not_supported(&e, Verb::ImportMr), "{e:?}");
    // Neither failed import touched the objects it named: the region is still usable.
    drop(mr);
    pd.destroy().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn importing_a_context_by_its_command_descriptor_on_rxe_is_not_supported_and_leaves_the_descriptor_open() {
    let _leaks = LeakCheck::new();
    let ctx = crate::open();
    let fd = ctx.cmd_fd();
    // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open while `ctx` is; `st` is writable.
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
    assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFCHR, "cmd_fd is /dev/infiniband/uverbsN");
    let dup = fd.try_clone_to_owned().unwrap();
    let dup_no = dup.as_raw_fd();
    assert_ne!(dup_no, fd.as_raw_fd());
    let e = Context::import(dup).unwrap_err();
    assert!(is_not_supported(&e, Verb::ImportDevice), "{e:?}");
    // rxe has no import_context: libibverbs failed before the provider took the
    // descriptor, so it is still open (as Context::import documents), and it is the same
    // device. The test, running alone, closes it: the leak check would see the context
    // the open duplicate keeps alive.
    // SAFETY: as above, for the duplicate.
    let mut st2: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `dup_no` was handed to libibverbs, which left it open (checked by the result).
    assert_eq!(unsafe { libc::fstat(dup_no, &mut st2) }, 0, "the duplicate is still open");
    assert_eq!(st2.st_rdev, st.st_rdev);
    // SAFETY: nothing else owns `dup_no` (libibverbs gave up on it, and tests run one at a
    // time), so closing it closes no one else's descriptor.
    assert_eq!(unsafe { libc::close(dup_no) }, 0);
    // The context itself is untouched.
    let pd = ProtectionDomain::new(&ctx).unwrap();
    assert!(ctx.cmd_fd().as_fd().as_raw_fd() >= 0);
    drop(pd);
}
