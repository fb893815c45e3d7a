//! Memory regions: every kind of buffer through its life cycle, keys and bounds, the
//! access rules, drop orders, and the remote-writable views (written locally here: the
//! peer's writes come with the data path).

use std::sync::atomic::Ordering;

use rdma_verbs::page_size;
use rdma_verbs::{AccessFlags, AlignedBuf, Error, MemoryRegion, ProtectionDomain, RemoteMr, Verb};

use crate::{open, LeakCheck, ResourceCounts};

fn mr_count() -> u64 {
    ResourceCounts::now().mr
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn aligned_buffer_region_reports_its_address_length_and_keys_and_is_counted_by_the_kernel() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let before = mr_count();
    let len = 3 * page_size() + 5;
    let mut buf = AlignedBuf::new(len).unwrap();
    buf[0] = 0xab;
    let addr = buf.as_ptr() as u64;
    let mr = pd.register(buf, AccessFlags::default()).unwrap();
    assert_eq!(mr_count(), before + 1, "the kernel sees one more MR");
    assert_eq!(mr.addr(), addr);
    assert_eq!(mr.addr() % page_size() as u64, 0);
    assert_eq!(mr.len(), len);
    assert_eq!(mr.access(), AccessFlags::LOCAL_WRITE);
    // SAFETY: reading the C struct of a live region.
    let raw = unsafe { &*mr.as_raw() };
    assert_eq!((raw.lkey, raw.rkey, raw.addr as u64, raw.length), (mr.lkey(), mr.rkey(), addr, len));
    assert_eq!(raw.pd, pd.as_raw());
    assert_eq!(mr.as_slice()[0], 0xab);
    assert!(mr.as_slice()[1..].iter().all(|&b| b == 0), "AlignedBuf is zeroed");
    mr.destroy().unwrap();
    assert_eq!(mr_count(), before);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn vec_region_destroy_gives_the_vec_back_with_what_was_written() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut v = Vec::with_capacity(100);
    v.extend_from_slice(b"hello");
    let ptr = v.as_ptr();
    let mut mr = pd.register(v, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(mr.len(), 5, "the Vec's length, not its capacity, is registered");
    assert_eq!(mr.addr(), ptr as u64);
    mr.as_mut_slice().copy_from_slice(b"world");
    let v = mr.destroy().unwrap();
    assert_eq!(v, b"world");
    assert_eq!(v.as_ptr(), ptr, "same allocation");
    assert_eq!(v.capacity(), 100);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn boxed_slice_region_is_freed_on_drop_and_gives_the_box_back_on_destroy() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let before = mr_count();
    let mr = pd.register(vec![7u8; 4096].into_boxed_slice(), AccessFlags::REMOTE_READ).unwrap();
    assert_eq!(mr.access(), AccessFlags::REMOTE_READ);
    assert_ne!(mr.rkey(), 0, "remote read access has an rkey");
    drop(mr); // deregistered and freed
    assert_eq!(mr_count(), before);

    let mut mr = pd.register(vec![0u8; 64].into_boxed_slice(), AccessFlags::default()).unwrap();
    mr.as_mut_slice()[63] = 9;
    let b: Box<[u8]> = mr.destroy().unwrap();
    assert_eq!((b.len(), b[63]), (64, 9));
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn borrowed_slice_region_covers_exactly_the_slice_and_releases_it() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut storage = [0u8; 256];
    {
        let part = &mut storage[16..80];
        let start = part.as_ptr() as u64;
        let mut mr = pd.register_slice(part, AccessFlags::default()).unwrap();
        assert_eq!((mr.addr(), mr.len()), (start, 64));
        mr.as_mut_slice().fill(0x5a);
        let back: &mut [u8] = mr.destroy().unwrap();
        back[0] = 1;
    }
    {
        let mr = pd.register_slice(&mut storage[..], AccessFlags::default()).unwrap();
        drop(mr); // released on drop too
    }
    assert_eq!(storage[16], 1);
    assert!(storage[17..80].iter().all(|&b| b == 0x5a));
    assert!(storage[..16].iter().chain(&storage[80..]).all(|&b| b == 0), "nothing outside the slice changed");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn remote_descriptor_matches_the_region_and_round_trips_through_its_wire_form() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mr = pd
        .register_remote_writable(AlignedBuf::new(8192).unwrap(), AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ)
        .unwrap();
    let remote = mr.remote().unwrap();
    assert_eq!(remote, RemoteMr { addr: mr.addr(), len: 8192, rkey: mr.rkey() });
    assert_ne!(remote.rkey, 0);
    let wire = remote.to_bytes();
    assert_eq!(wire.len(), RemoteMr::WIRE_LEN);
    assert_eq!(RemoteMr::from_bytes(&wire).unwrap(), remote);
    assert!(matches!(RemoteMr::from_bytes(&wire[..wire.len() - 1]), Err(rdma_verbs::WireError::Truncated { .. })));
    let tail = remote.slice(4096..).unwrap();
    assert_eq!((tail.addr, tail.len, tail.rkey), (mr.addr() + 4096, 4096, mr.rkey()));
    assert!(remote.slice(..8193).is_err());
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_region_without_remote_rights_hands_out_no_remote_descriptor_nor_do_its_chunks() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let refused = |r: Result<RemoteMr, Error>, what: &str| {
        let e = r.expect_err(what);
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::MrRemote, .. }), "{what}: {e}");
        assert!(e.to_string().contains("lets no peer reach it"), "{what}: {e}");
    };
    // Local only: the device would refuse its rkey on every request (tests/device/access.rs).
    let local = pd.register(AlignedBuf::new(8192).unwrap(), AccessFlags::LOCAL_WRITE).unwrap();
    refused(local.remote(), "a local-only region");
    let chunks = local.into_chunks(4096).unwrap();
    refused(chunks[1].remote(), "a chunk of a local-only region");
    // Windows may be bound, but the region's own rkey grants nothing.
    let mw_only = pd
        .register_remote_writable(AlignedBuf::new(4096).unwrap(), AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)
        .unwrap();
    refused(mw_only.remote(), "a region with MW_BIND alone");
    // Any remote right: the descriptor of the region, and of each chunk.
    let readable = pd.register(AlignedBuf::new(8192).unwrap(), AccessFlags::REMOTE_READ).unwrap();
    let (addr, rkey) = (readable.addr(), readable.rkey());
    assert_eq!(readable.remote().unwrap(), RemoteMr { addr, len: 8192, rkey });
    let chunks = readable.into_chunks(4096).unwrap();
    assert_eq!(chunks[1].remote().unwrap(), RemoteMr { addr: addr + 4096, len: 4096, rkey });
    let writable = pd
        .register_remote_writable(AlignedBuf::new(4096).unwrap(), AccessFlags::REMOTE_WRITE | AccessFlags::MW_BIND)
        .unwrap();
    assert_eq!(writable.remote().unwrap().rkey, writable.rkey());
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn sge_covers_the_asked_range_with_the_lkey_and_rejects_ranges_past_the_end() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mr = pd.register(AlignedBuf::new(1000).unwrap(), AccessFlags::default()).unwrap();
    let sge = mr.sge(..).unwrap();
    assert_eq!((sge.addr, sge.length, sge.lkey), (mr.addr(), 1000, mr.lkey()));
    let sge = mr.sge(100..=199).unwrap();
    assert_eq!((sge.addr, sge.length), (mr.addr() + 100, 100));
    assert_eq!(mr.sge(1000..).unwrap().length, 0, "an empty range at the end is a zero-length SGE");
    for bad in [mr.sge(0..1001), mr.sge(999..=1000), mr.sge(1001..)] {
        let Err(err) = bad else { panic!("a range past the end was accepted") };
        assert!(matches!(err, Error::InvalidArgument { verb: Verb::MrSge, .. }), "{err:?}");
        assert!(err.to_string().contains("1000 bytes"), "{err}");
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn empty_and_oversize_buffers_are_rejected_before_c_and_leave_the_pd_usable() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let before = mr_count();

    let err = pd.register(Vec::new(), AccessFlags::default()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { verb: Verb::RegMr, .. }), "{err:?}");
    assert!(err.to_string().contains("length 0"), "{err}");
    let err = pd.register_slice(&mut [], AccessFlags::default()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    let err = pd.register_remote_writable(Vec::new(), AccessFlags::REMOTE_WRITE).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    assert!(matches!(AlignedBuf::new(0), Err(Error::InvalidArgument { .. })));
    let err = AlignedBuf::new(usize::MAX).unwrap_err();
    assert!(err.to_string().contains("too large"), "{err}");

    // A device limit below the address space can be exceeded for real only with a
    // buffer that large; rxe's max_mr_size is the whole 64-bit range, which makes this
    // check a no-op there (the limit's message is covered by the unit tests).
    let max = ctx.query_device().unwrap().max_mr_size;
    eprintln!("max_mr_size: {max:#x}");

    assert_eq!(mr_count(), before, "nothing was registered");
    let mr = pd.register(vec![1u8; 32], AccessFlags::default()).unwrap();
    assert_eq!(mr.as_slice(), &[1u8; 32]);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn peer_writable_flags_need_the_remote_writable_kind_which_adds_local_write() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let before = mr_count();
    for f in [AccessFlags::REMOTE_WRITE, AccessFlags::REMOTE_ATOMIC, AccessFlags::MW_BIND] {
        let err = pd.register(AlignedBuf::new(64).unwrap(), AccessFlags::LOCAL_WRITE | f).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { verb: Verb::RegMr, .. }), "{err:?}");
        assert!(err.to_string().contains("register_remote_writable"), "{err}");
    }
    assert_eq!(mr_count(), before);

    // Without LOCAL_WRITE, which the verbs require with remote write: added for us.
    let mr = pd.register_remote_writable(AlignedBuf::new(64).unwrap(), AccessFlags::REMOTE_WRITE).unwrap();
    assert_eq!(mr.access(), AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE);
    let mr2 = pd
        .register_remote_writable(AlignedBuf::new(64).unwrap(), AccessFlags::REMOTE_ATOMIC | AccessFlags::REMOTE_READ)
        .unwrap();
    assert!(mr2.access().contains(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC));
    assert_ne!(mr.rkey(), mr2.rkey());
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn unknown_access_bits_are_passed_to_the_kernel_whose_refusal_names_ibv_reg_mr() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let before = mr_count();
    // Bit 15 is no access flag of this kernel: kept by AccessFlags, refused by ib_uverbs.
    let odd = AccessFlags::LOCAL_WRITE | AccessFlags::from_bits_retain(1 << 15);
    let err = pd.register(AlignedBuf::new(64).unwrap(), odd).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "a local region refuses it first: {err:?}");
    let err = pd.register_remote_writable(AlignedBuf::new(64).unwrap(), odd).unwrap_err();
    assert_eq!(err.verb_name(), Some("ibv_reg_mr"), "{err:?}");
    assert!(err.errno().is_some(), "a verb error from the kernel: {err:?}");
    assert_eq!(mr_count(), before);
    pd.register(AlignedBuf::new(64).unwrap(), AccessFlags::default()).unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn relaxed_ordering_is_an_optional_hint_that_registration_accepts() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    // An optional flag: libibverbs drops it where the kernel or device cannot honour it.
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::RELAXED_ORDERING;
    let mr = pd.register(AlignedBuf::new(4096).unwrap(), access).unwrap();
    assert_eq!(mr.access(), access);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn region_outlives_its_pd_and_context_handles_and_keeps_them_open() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut mr = pd.register(AlignedBuf::new(128).unwrap(), AccessFlags::default()).unwrap();
    // Destroying the parents while the region lives is refused, not done.
    assert_eq!(pd.clone().destroy().unwrap_err().errno(), Some(libc::EBUSY));
    assert_eq!(ctx.clone().destroy().unwrap_err().errno(), Some(libc::EBUSY));
    drop(pd);
    drop(ctx);
    mr.as_mut_slice()[0] = 3;
    assert_eq!(mr.as_slice()[0], 3);
    assert!(mr.pd().context().query_device().is_ok(), "the context is still open");
    let pd = mr.pd().clone();
    let buf = mr.destroy().unwrap();
    assert_eq!(buf[0], 3);
    pd.destroy().unwrap(); // the last handle: freed now
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn many_regions_in_one_pd_drop_in_any_order() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let before = mr_count();
    let a = pd.register(AlignedBuf::new(4096).unwrap(), AccessFlags::default()).unwrap();
    let b = pd.register(vec![0u8; 10], AccessFlags::REMOTE_READ).unwrap();
    let c = pd.register_remote_writable(vec![0u8; 10].into_boxed_slice(), AccessFlags::REMOTE_ATOMIC).unwrap();
    assert_eq!(mr_count(), before + 3);
    let lkeys = [a.lkey(), b.lkey(), c.lkey()];
    assert!(lkeys[0] != lkeys[1] && lkeys[1] != lkeys[2] && lkeys[0] != lkeys[2], "{lkeys:x?}");
    drop(pd);
    drop(b);
    drop(ctx);
    drop(a);
    assert_eq!(mr_count(), before + 1);
    drop(c);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn remote_writable_region_copies_in_and_out_at_any_offset_and_bounds_checks() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut mr = pd.register_remote_writable(AlignedBuf::new(100).unwrap(), AccessFlags::REMOTE_WRITE).unwrap();
    let pattern: Vec<u8> = (0..100u8).map(|i| i.wrapping_mul(7).wrapping_add(1)).collect();
    mr.write_at(0, &pattern).unwrap();
    // Unaligned starts and ends, across word boundaries, and the last byte.
    for (off, n) in [(0, 100), (3, 20), (7, 1), (8, 8), (13, 87), (99, 1), (100, 0)] {
        let mut out = vec![0u8; n];
        mr.read_at(off, &mut out).unwrap();
        assert_eq!(out, &pattern[off..off + n], "read {n} at {off}");
    }
    mr.write_at(5, b"abcdefghijklm").unwrap();
    let mut out = [0u8; 20];
    mr.read_at(0, &mut out).unwrap();
    assert_eq!(&out[5..18], b"abcdefghijklm");
    assert_eq!(&out[..5], &pattern[..5]);
    assert_eq!(&out[18..], &pattern[18..20]);

    for err in [mr.read_at(90, &mut [0u8; 11]), mr.read_at(usize::MAX, &mut [0u8; 2]), mr.write_at(100, &[1])] {
        let err = err.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
        assert!(err.to_string().contains("100 bytes"), "{err}");
    }
    let buf = mr.destroy().unwrap();
    assert_eq!(&buf[5..18], b"abcdefghijklm", "destroy gives the buffer back with its contents");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn atomic_view_of_an_aligned_word_sees_copies_and_rejects_misaligned_or_short_words() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut mr: MemoryRegion<AlignedBuf, _> = pd
        .register_remote_writable(AlignedBuf::new(64).unwrap(), AccessFlags::REMOTE_ATOMIC | AccessFlags::REMOTE_READ)
        .unwrap();
    mr.write_at(8, &41u64.to_ne_bytes()).unwrap();
    {
        let word = mr.atomic_u64(8).unwrap();
        assert_eq!(word.load(Ordering::Acquire), 41);
        assert_eq!(word.fetch_add(1, Ordering::AcqRel), 41);
        assert_eq!(word.compare_exchange(42, u64::MAX - 1, Ordering::AcqRel, Ordering::Acquire), Ok(42));
    }
    let mut out = [0u8; 8];
    mr.read_at(8, &mut out).unwrap();
    assert_eq!(u64::from_ne_bytes(out), u64::MAX - 1, "read_at sees the atomic store");
    // Part of the word, through read_at.
    let mut two = [0u8; 2];
    mr.read_at(9, &mut two).unwrap();
    assert_eq!(two, (u64::MAX - 1).to_ne_bytes()[1..3]);

    for (off, what) in [(4, "not 8-byte aligned"), (60, "not within"), (64, "not within")] {
        let err = mr.atomic_u64(off).unwrap_err();
        assert!(err.to_string().contains(what), "offset {off}: {err}");
    }
    assert!(mr.atomic_u64(56).is_ok(), "the last word");
    // A sge over the word, as an atomic work request would use.
    let sge = mr.sge(8..16).unwrap();
    assert_eq!((sge.addr % 8, sge.length), (0, 8));
}
