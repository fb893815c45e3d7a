//! The rest of verbs.h (issue #33): the P_Key table, the device index, fork safety,
//! regions at a chosen I/O virtual address, and the objects rxe lacks (rate limit, null
//! region, device clock, dmabuf regions, counters, flows, work queues and RSS, ECE), each
//! refusing with a typed `NotSupported` naming its bit or errno.

use std::process::Command;

use rdma_verbs::{AccessFlags, AlignedBuf, Chunk, Error, Local, MemoryRegion, QpAccess, RemoteWritable, SendWr, Verb};
use rdma_verbs::{ForkStatus, ProtectionDomain, WcStatus};

use crate::datapath::{poll_one, rc_pair};
use crate::LeakCheck;

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn the_pkey_table_holds_the_default_key_at_index_0_and_an_index_past_it_is_refused_before_c() {
    let ctx = crate::open();
    let len = ctx.query_port(1).unwrap().raw.pkey_tbl_len;
    assert!(len >= 1, "pkey_tbl_len {len}");
    assert_eq!(ctx.query_pkey(1, 0).unwrap(), 0xffff, "rxe's default full-membership key");
    assert_eq!(ctx.pkey_index(1, 0xffff).unwrap(), Some(0));
    let table: Vec<u16> = (0..len).map(|i| ctx.query_pkey(1, i).unwrap()).collect();
    let absent = (1..=0x7fffu16).find(|k| !table.contains(k)).unwrap();
    assert_eq!(ctx.pkey_index(1, absent).unwrap(), None, "{absent:#x} is not in {table:x?}");
    let e = ctx.query_pkey(1, len).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { verb: Verb::ContextPkey, .. }), "{e}");
    let e = ctx.query_pkey(0, 0).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { verb: Verb::ContextPkey, .. }), "{e}");
    eprintln!("P_Key table of port 1: {table:#06x?}");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn the_device_index_is_the_one_rdma_dev_prints() {
    let ctx = crate::open();
    let idx = ctx.device_index().expect("the kernel gives rxe an index");
    let list = rdma_verbs::devices().unwrap();
    let dev = list.find(ctx.name()).unwrap();
    assert_eq!(dev.index(), Some(idx));
    let out = Command::new("rdma").args(["dev", "show"]).output().expect("run `rdma` (iproute2)");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains(&format!(" {}:", ctx.name()))).unwrap_or_else(|| panic!("{text}"));
    let printed: u32 = line.split(':').next().unwrap().trim().parse().unwrap();
    assert_eq!(printed, idx, "{line}");
    eprintln!("{} has index {idx}: {line}", ctx.name());
}

/// On the test bed's kernel (6.1, copy-on-fork) protection is unneeded, so fork_init
/// succeeds even after regions exist (ibv_fork_init itself would say EINVAL then), and a
/// child's writes to its copy of a registered page leave the parent's bytes alone.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn fork_safety_is_unneeded_on_a_copy_on_fork_kernel_and_fork_init_after_registration_says_so() {
    let _leaks = LeakCheck::new();
    assert_eq!(rdma_verbs::fork_status(), ForkStatus::Unneeded, "Linux 5.13+ copies pinned pages on fork");
    let ctx = crate::open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut mr: MemoryRegion<AlignedBuf, Local> =
        pd.register(AlignedBuf::new(4096).unwrap(), AccessFlags::LOCAL_WRITE).unwrap();
    mr.as_mut_slice().fill(0xab);
    assert_eq!(rdma_verbs::fork_init().unwrap(), ForkStatus::Unneeded);
    // SAFETY: the child only writes its copy of the page and exits without unwinding.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: the child's own copy of the region's bytes.
        unsafe { std::ptr::write_bytes(mr.as_ptr(), 0x11, 4096) };
        // SAFETY: leaves the child at once.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(mr.as_slice().iter().all(|&b| b == 0xab), "the child's write stayed in the child");
}

/// A peer RDMA-WRITEs at the I/O virtual address a region was registered at, and every
/// byte lands; a region at a chosen iova gives entries at it and is not cut into chunks.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_peers_write_at_the_chosen_iova_lands_every_byte() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    const LEN: usize = 8192;
    const IOVA: u64 = 0x5_0000_0000;
    let target: MemoryRegion<AlignedBuf, RemoteWritable> =
        pd.register_at_iova(AlignedBuf::new(LEN).unwrap(), AccessFlags::REMOTE_WRITE, IOVA).unwrap();
    let remote = target.remote().unwrap();
    assert_eq!(remote.addr, IOVA);
    assert_ne!(target.as_ptr() as u64, IOVA);
    let src: MemoryRegion<AlignedBuf, Local> =
        pd.register_at_iova(AlignedBuf::new(LEN).unwrap(), AccessFlags::LOCAL_WRITE, 0x7_0000_0000).unwrap();
    assert_eq!(src.sge(..).unwrap().addr, 0x7_0000_0000, "its own entries carry the iova");
    let e = src.into_chunks(LEN).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { verb: Verb::IntoChunks, .. }), "{e}");
    let mut src = crate::datapath::chunks(&pd, 1, LEN, AccessFlags::LOCAL_WRITE).pop().unwrap();
    let data: Vec<u8> = (0..LEN).map(|i| (i as u8).wrapping_mul(13) ^ 0x5a).collect();
    src.copy_from_slice(&data);
    if let Err(r) = a.sq.post(SendWr::write(src, 0..LEN, remote.slice(..).unwrap())) {
        panic!("{}", r.error);
    }
    let mut wc = poll_one(&mut a.cq);
    assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
    a.sq.complete(&mut wc, |_| ()).unwrap();
    let mut got = vec![0u8; LEN];
    target.read_at(0, &mut got).unwrap();
    assert_eq!(got, data, "every byte of the WRITE landed at the chosen iova");
    // An iova whose page offset differs from the buffer's is refused before C.
    let e =
        pd.register_at_iova::<_, Local>(AlignedBuf::new(64).unwrap(), AccessFlags::LOCAL_WRITE, IOVA + 8).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { verb: Verb::PdRegisterAtIova, .. }), "{e}");
    drop((a, b, target));
}

/// Each object rxe lacks refuses with a typed NotSupported naming who found out and the
/// bit or errno it came from; the objects around it stay whole.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn rxe_refuses_rate_limits_null_regions_the_clock_dmabuf_counters_flows_work_queues_rss_and_ece_by_bit_or_errno() {
    use rdma_verbs::{
        CompletionQueue, Counters, Ece, Flow, FlowSpec, QpType, QueuePair, RateLimit, RssTable, WorkQueue,
    };
    let _leaks = LeakCheck::new();
    let ctx = crate::open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    let ud = QueuePair::builder(&pd, QpType::Ud, &cq, &cq).max_send_wr(2).max_recv_wr(2).build().unwrap();
    let rc = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(2).max_recv_wr(2).build().unwrap();
    let not_supported = |e: &Error, verb: Verb, errno: Option<i32>, what: &str| {
        assert!(
            matches!(e, Error::NotSupported { verb: v, errno: n, capability } if *v == verb && *n == errno && capability.contains(what)),
            "{e:?}"
        );
        eprintln!("{e}");
    };

    // The QP rate limit: packet_pacing_caps.qp_rate_limit_max is 0.
    let e = rc.set_rate_limit(RateLimit::kbps(10_000)).unwrap_err();
    not_supported(&e, Verb::QpSetRateLimit, None, "qp_rate_limit_max 0");

    // The null region: no alloc_null_mr in the provider.
    let e = pd.alloc_null_region().unwrap_err();
    not_supported(&e, Verb::AllocNullMr, Some(libc::EOPNOTSUPP), "alloc_null_mr");

    // The device clock: rxe reports hca_core_clock 0 (or, if it reported one, has no
    // query_rt_values).
    let e = ctx.raw_clock().unwrap_err();
    assert!(matches!(&e, Error::NotSupported { verb: Verb::QueryRtValuesEx, .. }), "{e:?}");
    eprintln!("{e}");

    // A dmabuf region: any descriptor (a memfd here: the test bed has no /dev/udmabuf)
    // is refused by the provider before the kernel looks at it, and the descriptor is
    // closed with the refusal.
    // SAFETY: a NUL-terminated name and no flags.
    let fd = unsafe { libc::memfd_create(c"rdma-verbs-dmabuf".as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: a new descriptor nobody else owns.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // SAFETY: the memfd just created.
    assert_eq!(unsafe { libc::ftruncate(std::os::fd::AsRawFd::as_raw_fd(&fd), 4096) }, 0);
    let e = pd.register_dmabuf(fd, 0, 4096, 0, AccessFlags::LOCAL_WRITE).unwrap_err();
    not_supported(&e, Verb::RegDmabufMr, Some(libc::EOPNOTSUPP), "reg_dmabuf_mr");

    // Counters: no create_counters in the provider.
    let e = Counters::new(&ctx).unwrap_err();
    not_supported(&e, Verb::CreateCounters, Some(libc::EOPNOTSUPP), "create_counters");

    // Flows: checked before C, then refused by the device's capability bit.
    let spec = FlowSpec::new(1)
        .eth_dst([0x02, 0, 0, 0, 0, 1])
        .ipv4(None, Some(std::net::Ipv4Addr::new(10, 99, 0, 1)))
        .udp(None, Some(4791));
    let e = Flow::new(&rc, &spec).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { verb: Verb::FlowNew, .. }), "{e:?}");
    let e = Flow::new(&ud, &spec).unwrap_err();
    not_supported(&e, Verb::FlowNew, None, "IBV_DEVICE_MANAGED_FLOW_STEERING");

    // Work queues and RSS tables: max_wq_type_rq 0, max_rwq_indirection_table_size 0.
    let e = WorkQueue::new(&pd, &cq, 0, 1).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { verb: Verb::WorkQueueCheck, .. }), "{e:?}");
    let e = WorkQueue::new(&pd, &cq, 64, 1).unwrap_err();
    not_supported(&e, Verb::WorkQueueCheck, None, "max_wq_type_rq 0");
    let e = RssTable::new(&ctx, &[]).unwrap_err();
    not_supported(&e, Verb::RssTableNew, None, "max_rwq_indirection_table_size 0");

    // ECE: checked before C, then the provider has no set_ece / query_ece.
    let e = rc.set_ece(Ece { vendor_id: 0, options: 1 }).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { verb: Verb::QpSetEce, .. }), "{e:?}");
    let e = rc.set_ece(Ece { vendor_id: 0x2c9, options: 1 }).unwrap_err();
    not_supported(&e, Verb::SetEce, Some(libc::EOPNOTSUPP), "ECE");
    let e = rc.query_ece().unwrap_err();
    not_supported(&e, Verb::QueryEce, Some(libc::EOPNOTSUPP), "ECE");

    // Everything around the refusals is whole: a region registers in the PD.
    pd.register(AlignedBuf::new(64).unwrap(), AccessFlags::LOCAL_WRITE).unwrap();
    drop((ud, rc, cq));
}
