//! Issue #33, XRC and device memory: the XRC SRQ, its number, the opened XRC receive QP,
//! device memory regions, and which QP types the TSO / RSS / pacing capabilities cover.
//! rxe has no XRC and no device memory: each refuses with a typed `NotSupported` naming
//! the bit or errno it came from, and the C calls below agree with the bits.

use rdma_verbs::ffi::ibv_qp_type as T;
use rdma_verbs::{ffi, XrcDomain};
use rdma_verbs::{AccessFlags, AlignedBuf, DeviceMemory, Error, ProtectionDomain, QpTypeCap, SharedReceiveQueue, Verb};

use crate::LeakCheck;

fn not_supported(e: &Error, verb: Verb, errno: Option<i32>, what: &str) {
    assert!(
        matches!(e, Error::NotSupported { verb: v, errno: n, capability } if *v == verb && *n == errno && capability.contains(what)),
        "{e:?}"
    );
    eprintln!("{e}");
}

/// The XRC SRQ (SharedReceiveQueue::xrc) and the opened receive QP (XrcDomain::open_qp)
/// take an XrcDomain, which rxe cannot open (no IBV_DEVICE_XRC; ibv_open_xrcd itself says
/// EOPNOTSUPP); an SRQ number is refused by the same bit before C, and C's
/// ibv_get_srq_num agrees (EOPNOTSUPP).
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn rxe_refuses_xrc_srqs_their_numbers_and_opened_qps_by_the_xrc_bit_and_c_agrees() {
    let _leaks = LeakCheck::new();
    let ctx = crate::open();
    let flags = ctx.query_device_ex().unwrap().base.raw.device_cap_flags;
    assert_eq!(flags & ffi::ibv_device_cap_flags::IBV_DEVICE_XRC.0, 0, "rxe reports no XRC: {flags:#x}");

    // The one way to an XRC SRQ or an opened XRC QP is refused by the bit...
    let e = XrcDomain::open(&ctx, None, libc::O_CREAT).unwrap_err();
    not_supported(&e, Verb::XrcDomainOpen, None, "IBV_DEVICE_XRC");
    // ...and the C call the bit stands for fails as the bit says.
    let mut attr = ffi::ibv_xrcd_init_attr {
        comp_mask: (ffi::ibv_xrcd_init_attr_mask::IBV_XRCD_INIT_ATTR_FD.0
            | ffi::ibv_xrcd_init_attr_mask::IBV_XRCD_INIT_ATTR_OFLAGS.0),
        fd: -1,
        oflags: libc::O_CREAT,
    };
    // SAFETY: the context is open and `attr` is readable.
    let raw = unsafe { ffi::ibv_open_xrcd(ctx.as_raw(), &mut attr) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    assert!(raw.is_null(), "rxe opened an XRC domain");
    assert_eq!(errno, Some(libc::EOPNOTSUPP));

    // A basic SRQ has no number: on a device without XRC, refused by the bit before C.
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let srq = SharedReceiveQueue::new(&pd, 16, 1).unwrap();
    assert!(!srq.is_xrc() && srq.xrcd().is_none());
    let e = srq.srq_num().unwrap_err();
    not_supported(&e, Verb::SrqNum, None, "IBV_DEVICE_XRC");
    let mut num = u32::MAX;
    // SAFETY: the SRQ is live and `num` writable.
    let rc = unsafe { ffi::ibv_get_srq_num(srq.as_raw(), &mut num) };
    assert_eq!(rc, libc::EOPNOTSUPP, "C's answer for rxe's SRQ");
    assert_eq!(num, u32::MAX, "nothing was written");
    // The SRQ is whole after the refusal.
    assert_eq!(srq.query().unwrap().srq_limit, 0);
    srq.destroy().unwrap();
}

/// Device memory regions take a DeviceMemory, which rxe cannot allocate (max_dm_size 0);
/// C has no device memory either (ibv_alloc_dm: EOPNOTSUPP).
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn rxe_refuses_device_memory_and_so_its_regions_by_max_dm_size_and_c_agrees() {
    let _leaks = LeakCheck::new();
    let ctx = crate::open();
    assert_eq!(ctx.query_device_ex().unwrap().max_dm_size, 0);
    let e = DeviceMemory::alloc(&ctx, 4096, 3).unwrap_err();
    not_supported(&e, Verb::DeviceMemoryAlloc, None, "max_dm_size 0");
    let mut attr = ffi::ibv_alloc_dm_attr { length: 4096, log_align_req: 3, comp_mask: 0 };
    // SAFETY: the context is open and `attr` readable.
    let raw = unsafe { ffi::ibv_alloc_dm(ctx.as_raw(), &mut attr) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    assert!(raw.is_null(), "rxe allocated device memory");
    assert_eq!(errno, Some(libc::EOPNOTSUPP));
    // The PD a region would go in is whole.
    let pd = ProtectionDomain::new(&ctx).unwrap();
    pd.register(AlignedBuf::new(64).unwrap(), AccessFlags::LOCAL_WRITE).unwrap();
}

/// rxe reports no TSO, RSS or packet pacing, so none of them covers any QP type, and
/// qp_type_supported (ibv_is_qpt_supported) agrees with each raw mask.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn rxe_covers_no_qp_type_with_tso_rss_or_pacing_and_each_answer_is_its_masks_bit() {
    let ctx = crate::open();
    let attr = ctx.query_device_ex().unwrap();
    let raw = attr.raw();
    let masks = [
        (QpTypeCap::Tso, raw.tso_caps.supported_qpts),
        (QpTypeCap::Rss, raw.rss_caps.supported_qpts),
        (QpTypeCap::PacketPacing, raw.packet_pacing_caps.supported_qpts),
    ];
    let types =
        [T::IBV_QPT_RC, T::IBV_QPT_UC, T::IBV_QPT_UD, T::IBV_QPT_RAW_PACKET, T::IBV_QPT_XRC_SEND, T::IBV_QPT_XRC_RECV];
    for (cap, mask) in masks {
        assert_eq!(attr.supported_qpts(cap), mask, "{cap:?}");
        assert_eq!(mask, 0, "rxe reports {cap:?} for QP types {mask:#x}");
        for t in types {
            assert!(!attr.qp_type_supported(cap, t), "{cap:?} type {}", t.0);
        }
    }
    eprintln!("{}: TSO, RSS and packet pacing cover no QP type", ctx.name());
}
