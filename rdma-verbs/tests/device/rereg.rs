//! Re-registration (`ibv_rereg_mr`), relaxed ordering, and on-demand paging (which rxe of
//! Linux 6.1 does not have): every byte a peer's WRITE moved is compared.

use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, Error, Local, MemoryRegion, QpAccess, RemoteMr, RemoteWritable, SendWr, Verb,
    WcStatus,
};

use crate::datapath::{chunks, poll_one, rc_pair, Side};
use crate::LeakCheck;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// Posts one RDMA WRITE of `data` to `remote` and returns its completion status.
fn write(side: &mut Side<Chunk>, mut src: Chunk, data: &[u8], remote: RemoteMr) -> WcStatus {
    src[..data.len()].copy_from_slice(data);
    if let Err(r) = side.sq.post(SendWr::write(src, 0..data.len(), remote)) {
        panic!("{}", r.error);
    }
    let mut wc = poll_one(&mut side.cq);
    let status = wc.status();
    side.sq.complete(&mut wc, |_| ()).unwrap();
    status
}

fn read_all(mr: &MemoryRegion<AlignedBuf, RemoteWritable>) -> Vec<u8> {
    let mut v = vec![0u8; mr.len()];
    mr.read_at(0, &mut v).unwrap();
    v
}

/// Reads `remote` of B's region into a fresh chunk of A with an RDMA READ; the bytes.
fn read(side: &mut Side<Chunk>, dst: Chunk, len: usize, remote: RemoteMr) -> Vec<u8> {
    if let Err(r) = side.sq.post(SendWr::read(dst, 0..len, remote)) {
        panic!("{}", r.error);
    }
    let mut wc = poll_one(&mut side.cq);
    assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
    let mut got = Vec::new();
    side.sq.complete(&mut wc, |d| got = d.value[..len].to_vec()).unwrap();
    got
}

/// rereg_access adding REMOTE_WRITE: where the kernel implements rereg (mlx5; rxe of a
/// kernel newer than 6.1 whose driver has rereg_user_mr), a peer's WRITE lands under the new rkey and the old rkey, if changed,
/// is refused; where it does not (rxe of Linux 6.1, the test bed), the refusal is
/// NotSupported naming ibv_rereg_mr and EOPNOTSUPP, the region comes back, and it still
/// serves a peer's READ under its old rkey while refusing its WRITE. Bytes checked in both.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn rereg_adding_remote_write_lands_a_peers_write_or_is_not_supported_and_keeps_the_region_serving() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE | QpAccess::REMOTE_READ);
    const LEN: usize = 4096;
    let mut target: MemoryRegion<AlignedBuf, Local> =
        pd.register(AlignedBuf::new(LEN).unwrap(), AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ).unwrap();
    let before = pattern(0x5a, LEN);
    target.as_mut_slice().copy_from_slice(&before);
    let old = target.remote().unwrap();
    let (old_lkey, old_rkey) = (target.lkey(), target.rkey());
    let mut srcs = chunks(&pd, 3, LEN, AccessFlags::LOCAL_WRITE);
    let data = pattern(7, 1000);

    match target.rereg_access::<RemoteWritable>(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE) {
        Ok(target) => {
            assert!(target.access().contains(AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE));
            let new = target.remote().unwrap();
            assert_eq!((new.addr, new.len), (old.addr, old.len), "same memory");
            eprintln!("rereg: lkey {old_lkey:#x} -> {:#x}, rkey {old_rkey:#x} -> {:#x}", target.lkey(), target.rkey());
            assert_eq!(read_all(&target), before, "rereg keeps the contents");
            let status = write(&mut a, srcs.pop().unwrap(), &data, new.slice(100..).unwrap());
            assert_eq!(status, WcStatus::Success);
            let got = read_all(&target);
            assert_eq!(&got[100..1100], &data[..], "the written bytes");
            assert_eq!((&got[..100], &got[1100..]), (&before[..100], &before[1100..]), "bytes around it untouched");
            if target.rkey() != old_rkey {
                let status = write(&mut a, srcs.pop().unwrap(), &pattern(9, 64), old);
                assert_eq!(status, WcStatus::RemAccessErr, "the rkey from before rereg must be refused");
                assert_eq!(read_all(&target), got, "the refused write changed nothing");
            }
            drop((a, b, srcs));
            target.destroy().unwrap();
        }
        Err(e) => {
            assert!(
                matches!(&e.error, Error::NotSupported { verb: Verb::ReregMr, errno: Some(libc::EOPNOTSUPP), .. }),
                "{e}"
            );
            eprintln!("{e}");
            let target = e.region.expect("a command the kernel does not implement leaves the region as it was");
            assert_eq!(
                (target.lkey(), target.rkey(), target.access()),
                (old_lkey, old_rkey, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            );
            // Still registered as before: the peer reads it, byte for byte, under the old rkey...
            assert_eq!(read(&mut a, srcs.pop().unwrap(), LEN, old), before);
            // ...and may still not write it.
            let status = write(&mut a, srcs.pop().unwrap(), &data, old);
            assert_eq!(status, WcStatus::RemAccessErr, "the access did not change");
            assert_eq!(target.as_slice(), &before[..], "the refused write changed nothing");
            drop((a, b, srcs, target));
        }
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn rereg_refuses_a_local_region_with_remote_write_before_c_and_hands_the_region_back() {
    let _leaks = LeakCheck::new();
    let (pd, a, b) = rc_pair::<Chunk>(QpAccess::empty());
    let mut mr = pd.register(AlignedBuf::new(4096).unwrap(), AccessFlags::LOCAL_WRITE).unwrap();
    mr.as_mut_slice()[..3].copy_from_slice(b"abc");
    let rkey = mr.rkey();
    let e = mr.rereg_access::<Local>(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap_err();
    assert!(matches!(e.error, Error::InvalidArgument { verb: Verb::MrRereg, .. }), "{e}");
    let mr = e.region.expect("refused before C: the region is unchanged");
    assert_eq!((mr.rkey(), &mr.as_slice()[..3]), (rkey, &b"abc"[..]));
    drop((a, b, mr));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn relaxed_ordering_is_accepted_as_a_hint_and_a_peers_write_lands() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    const LEN: usize = 8192;
    let target = pd
        .register_remote_writable(
            AlignedBuf::new(LEN).unwrap(),
            AccessFlags::REMOTE_WRITE | AccessFlags::RELAXED_ORDERING,
        )
        .unwrap();
    assert!(target.access().contains(AccessFlags::RELAXED_ORDERING | AccessFlags::LOCAL_WRITE));
    let data = pattern(3, LEN);
    let src = chunks(&pd, 1, LEN, AccessFlags::LOCAL_WRITE).pop().unwrap();
    assert_eq!(write(&mut a, src, &data, target.remote().unwrap()), WcStatus::Success);
    assert_eq!(read_all(&target), data, "every byte of the WRITE landed");
    // A local region may carry the hint too.
    let local = pd.register(AlignedBuf::new(64).unwrap(), AccessFlags::LOCAL_WRITE | AccessFlags::RELAXED_ORDERING);
    assert!(local.unwrap().access().contains(AccessFlags::RELAXED_ORDERING));
    drop((a, b, target));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn on_demand_registration_is_refused_before_c_naming_ibv_odp_support_on_a_device_without_odp() {
    let _leaks = LeakCheck::new();
    let ctx = crate::open();
    let pd = rdma_verbs::ProtectionDomain::new(&ctx).unwrap();
    let e = pd.register_on_demand::<_, Local>(AlignedBuf::new(4096).unwrap(), AccessFlags::LOCAL_WRITE).unwrap_err();
    assert!(
        matches!(&e, Error::NotSupported { verb: Verb::PdRegisterOnDemand, errno: None, capability }
            if capability.contains("IBV_ODP_SUPPORT")),
        "{e}"
    );
    // The plain path checks the same bit on ibv_reg_mr's behalf.
    let e = pd.register(AlignedBuf::new(4096).unwrap(), AccessFlags::LOCAL_WRITE | AccessFlags::ON_DEMAND).unwrap_err();
    assert!(matches!(&e, Error::NotSupported { verb: Verb::RegMr, errno: None, .. }), "{e}");
    // And so does rereg, which hands the region back.
    let mr = pd.register(AlignedBuf::new(4096).unwrap(), AccessFlags::LOCAL_WRITE).unwrap();
    let e = mr.rereg_access::<Local>(AccessFlags::LOCAL_WRITE | AccessFlags::ON_DEMAND).unwrap_err();
    assert!(matches!(&e.error, Error::NotSupported { verb: Verb::MrRereg, errno: None, .. }), "{e}");
    let mr = e.region.unwrap();
    // advise on a pinned region is refused before C.
    let e = mr.advise(rdma_verbs::Advice::Prefetch, .., true).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { verb: Verb::MrAdvise, .. }), "{e}");
    eprintln!("{}", pd.register_on_demand::<_, Local>(vec![0u8; 64], AccessFlags::LOCAL_WRITE).unwrap_err());
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn rxe_has_no_xrc_device_memory_thread_or_parent_domains_and_each_refusal_names_its_bit_or_errno() {
    let _leaks = LeakCheck::new();
    let ctx = crate::open();
    let e = rdma_verbs::XrcDomain::open(&ctx, None, libc::O_CREAT).unwrap_err();
    assert!(
        matches!(&e, Error::NotSupported { verb: Verb::XrcDomainOpen, errno: None, capability }
            if capability.contains("IBV_DEVICE_XRC")),
        "{e}"
    );
    eprintln!("{e}");
    let e = rdma_verbs::DeviceMemory::alloc(&ctx, 4096, 6).unwrap_err();
    assert!(
        matches!(&e, Error::NotSupported { verb: Verb::DeviceMemoryAlloc, errno: None, capability }
            if capability.contains("max_dm_size 0")),
        "{e}"
    );
    eprintln!("{e}");
    let e = rdma_verbs::ThreadDomain::alloc(&ctx).unwrap_err();
    assert!(matches!(&e, Error::NotSupported { verb: Verb::AllocTd, errno: Some(libc::EOPNOTSUPP), .. }), "{e}");
    eprintln!("{e}");
    let pd = rdma_verbs::ProtectionDomain::new(&ctx).unwrap();
    let e = rdma_verbs::ParentDomain::new(&pd, None).unwrap_err();
    assert!(
        matches!(&e, Error::NotSupported { verb: Verb::AllocParentDomain, errno: Some(libc::EOPNOTSUPP), .. }),
        "{e}"
    );
    eprintln!("{e}");
    // The PD is still whole after the refusal: a region registers in it.
    pd.register(AlignedBuf::new(64).unwrap(), AccessFlags::LOCAL_WRITE).unwrap();
}

/// rereg_buffer moving a remote-writable region to a new buffer: where the kernel
/// implements translation changes, the old buffer comes back with its bytes and a peer's
/// WRITE lands in the new one; on rxe of Linux 6.1 the refusal is NotSupported naming
/// ibv_rereg_mr, and the region, handed back, still takes the peer's WRITE in the old one.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn rereg_buffer_moves_a_peers_write_to_the_new_buffer_or_is_not_supported_and_the_old_region_still_takes_it() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    const LEN: usize = 4096;
    let mut target = pd.register_remote_writable(AlignedBuf::new(LEN).unwrap(), AccessFlags::REMOTE_WRITE).unwrap();
    target.write_at(0, b"old buffer").unwrap();
    let mut srcs = chunks(&pd, 1, LEN, AccessFlags::LOCAL_WRITE);
    let data = pattern(11, 512);
    let empty = AlignedBuf::new(LEN).unwrap();
    match target.rereg_buffer::<AlignedBuf, RemoteWritable>(empty, AccessFlags::REMOTE_WRITE) {
        Ok((target, old)) => {
            assert_eq!(&old[..10], b"old buffer", "the old buffer comes back with its bytes");
            let status = write(&mut a, srcs.pop().unwrap(), &data, target.remote().unwrap());
            assert_eq!(status, WcStatus::Success);
            let got = read_all(&target);
            assert_eq!(&got[..512], &data[..], "the peer's bytes are in the new buffer");
            assert_eq!(&old[..10], b"old buffer", "and not in the old one");
            drop((a, b, srcs, target));
        }
        Err(e) => {
            assert!(
                matches!(&e.error, Error::NotSupported { verb: Verb::ReregMr, errno: Some(libc::EOPNOTSUPP), .. }),
                "{e}"
            );
            let target = e.region.expect("a command the kernel does not implement leaves the region as it was");
            let status = write(&mut a, srcs.pop().unwrap(), &data, target.remote().unwrap());
            assert_eq!(status, WcStatus::Success, "the region is still registered as before");
            assert_eq!(&read_all(&target)[..512], &data[..], "the peer's bytes landed in the old buffer");
            drop((a, b, srcs, target));
        }
    }
}
