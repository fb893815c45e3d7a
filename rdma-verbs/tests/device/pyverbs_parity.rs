//! Behaviours rdma-core's own tests (pyverbs) check on rxe that no other test of ours
//! covered: device, port and GID queries read against sysfs, PD and CQ creation variants,
//! CQ resizing down and up, completion events on UD, extended QPs of every transport,
//! atomics refused by the QP's access or an unaligned address, posts to a QP in RESET,
//! receives with too many SGEs, and relaxed ordering on received data.
//! docs/pyverbs.md maps each pyverbs test to the test of ours that covers it.

use std::ptr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rdma_verbs::ffi;
use rdma_verbs::{
    AccessFlags, AddressHandle, AhAttr, AlignedBuf, Chunk, CompletionQueue, Error, Gid, GidType, InitAttr, LinkLayer,
    PortState, ProtectionDomain, QpAccess, QpState, QpType, QueuePair, RecvQueue, RemoteMr, SendOps, SendQueue, SendWr,
    Verb, WcStatus, GRH_LEN,
};

use crate::datapath::{chunks, poll_one, random_bytes, rc_pair};
use crate::{device_name, gid_index, open, LeakCheck, ResourceCounts};

const QKEY: u32 = 0x2468_1357;

/// A file of the device under test in sysfs, trimmed.
fn sysfs(path: &str) -> String {
    let full = format!("/sys/class/infiniband/{}/{path}", device_name());
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}")).trim().to_owned()
}

/// A GUID as sysfs prints it (`0250:56ff:fe9a:0001`, big-endian groups) as a number.
fn sysfs_guid(path: &str) -> u64 {
    let text = sysfs(path);
    u64::from_str_radix(&text.replace(':', ""), 16).unwrap_or_else(|e| panic!("{path}: {text:?}: {e}"))
}

/// A GID as sysfs prints it (eight groups of four hex digits).
fn sysfs_gid(index: u32) -> Gid {
    let text = sysfs(&format!("ports/1/gids/{index}"));
    let hex = text.replace(':', "");
    assert_eq!(hex.len(), 32, "{text:?}");
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    Gid(g)
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u64 }
}

// ---- device, port, GIDs ----------------------------------------------------------------

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn query_device_matches_sysfs_and_reports_page_sizes_a_vendor_and_nonzero_limits() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let attr = ctx.query_device().unwrap();
    // What the kernel also shows in sysfs is the same value.
    assert_eq!(attr.node_guid, sysfs_guid("node_guid"), "{attr:?}");
    assert_eq!(attr.sys_image_guid, sysfs_guid("sys_image_guid"), "{attr:?}");
    assert_ne!(attr.node_guid, 0);
    assert_ne!(attr.sys_image_guid, 0);
    assert_eq!(
        u32::from(attr.phys_port_cnt),
        std::fs::read_dir(format!("/sys/class/infiniband/{}/ports", device_name())).unwrap().count() as u32
    );
    // Sizes and limits a user sizes things by.
    let page = page_size();
    assert!(attr.max_mr_size > page, "max_mr_size {}", attr.max_mr_size);
    assert!(attr.raw.page_size_cap >= page, "page_size_cap {:#x}", attr.raw.page_size_cap);
    assert_ne!(attr.vendor_id, 0);
    for (name, v) in [
        ("max_qp", attr.max_qp),
        ("max_qp_wr", attr.max_qp_wr),
        ("max_sge", attr.max_sge),
        ("max_cq", attr.max_cq),
        ("max_cqe", attr.max_cqe),
        ("max_mr", attr.max_mr),
        ("max_pd", attr.max_pd),
        ("max_pkeys", u32::from(attr.raw.max_pkeys)),
    ] {
        assert!(v > 0, "{name} is 0: {attr:?}");
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn query_port_gives_valid_mtus_width_and_speed_the_rate_sysfs_shows_and_messages_above_4_kib() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let port = ctx.query_port(1).unwrap();
    assert_eq!(port.state, PortState::Active);
    assert!(sysfs("ports/1/state").ends_with("ACTIVE"), "{}", sysfs("ports/1/state"));
    assert!(port.max_mtu.bytes() >= 256 && port.active_mtu.bytes() >= 256, "{port:?}");
    assert!(port.active_mtu.bytes() <= port.max_mtu.bytes(), "{port:?}");
    assert!(port.width_lanes() > 0 && port.lane_gbps() > 0.0, "unknown width or speed code: {port:?}");
    // sysfs: "2.5 Gb/sec (1X SDR)", from the same width and speed codes.
    let rate = sysfs("ports/1/rate");
    let shown: f64 = rate.split_whitespace().next().unwrap().parse().unwrap();
    assert!((port.rate_gbps() - shown).abs() < 0.01, "ours {} Gb/s, sysfs {rate:?}", port.rate_gbps());
    let layer = sysfs("ports/1/link_layer");
    assert_eq!(port.link_layer, if layer == "Ethernet" { LinkLayer::Ethernet } else { LinkLayer::InfiniBand });
    assert!(port.raw.max_msg_sz > 0x1000, "max_msg_sz {}", port.raw.max_msg_sz);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn every_gid_index_reads_as_sysfs_shows_it_through_the_table_and_query_gid_and_an_empty_one_is_enodata() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let len = ctx.query_port(1).unwrap().gid_tbl_len;
    let table = ctx.gid_table(1).unwrap();
    let mut populated = 0;
    let mut empty = None;
    for index in 0..len {
        let want = sysfs_gid(index);
        if want.is_zero() {
            let err = ctx.query_gid(1, index).unwrap_err();
            assert_eq!(err.errno(), Some(libc::ENODATA), "GID index {index} is empty: {err:?}");
            assert!(table.iter().all(|e| e.index != index), "the table lists empty index {index}");
            empty.get_or_insert(index);
            continue;
        }
        populated += 1;
        let one = ctx.query_gid(1, index).unwrap();
        assert_eq!((one.index, one.port, one.gid), (index, 1, want), "{one:?}");
        let kind = sysfs(&format!("ports/1/gid_attrs/types/{index}"));
        let want_type = match kind.as_str() {
            "RoCE v2" => GidType::RoceV2,
            "IB/RoCE v1" if one.netdev.is_some() => GidType::RoceV1,
            _ => GidType::Ib,
        };
        assert_eq!(one.gid_type, want_type, "sysfs says {kind:?}");
        let in_table = table.iter().find(|e| e.index == index).expect("every populated index is in the table");
        assert_eq!(in_table, &one);
        if let Some(dev) = &one.netdev {
            assert_eq!(&sysfs(&format!("ports/1/gid_attrs/ndevs/{index}")), dev);
        }
    }
    assert_eq!(table.len(), populated, "the table has exactly the populated entries: {table:?}");
    assert!(populated >= 1);
    // rxe on an IPv4 netdev fills two of its entries (link-local and the IPv4 one).
    if ctx.name().starts_with("rxe") {
        assert!(empty.is_some(), "rxe leaves most of its {len} entries empty");
    }
}

// ---- protection domains and completion queues --------------------------------------------

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn pds_made_at_once_and_one_after_another_are_each_counted_by_the_kernel_and_freed() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let before = ResourceCounts::now().pd;
    let pds: Vec<_> = (0..64).map(|_| ProtectionDomain::new(&ctx).unwrap()).collect();
    assert_eq!(ResourceCounts::now().pd, before + 64);
    for pd in pds {
        pd.destroy().unwrap();
    }
    assert_eq!(ResourceCounts::now().pd, before);
    for i in 0..200 {
        let pd = ProtectionDomain::new(&ctx).unwrap();
        // Each one works: a region registers in it.
        pd.register(AlignedBuf::new(64).unwrap(), AccessFlags::LOCAL_WRITE).unwrap();
        if i % 2 == 0 {
            pd.destroy().unwrap();
        }
    }
    assert_eq!(ResourceCounts::now().pd, before);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn cqs_of_one_half_and_all_of_max_cqe_are_made_on_every_comp_vector_with_and_without_a_channel() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let max_cqe = ctx.query_device().unwrap().max_cqe;
    let vectors = CompletionQueue::num_comp_vectors(&ctx);
    assert!(vectors >= 1);
    let mut made = 0;
    for cqe in [1, max_cqe / 2, max_cqe] {
        for vector in (0..vectors.min(2)).chain([vectors - 1]) {
            for channel in [false, true] {
                let mut b = CompletionQueue::builder(&ctx, cqe).comp_vector(vector);
                if channel {
                    b = b.with_channel();
                }
                let cq = b.build().unwrap_or_else(|e| panic!("cqe {cqe}, vector {vector}, channel {channel}: {e}"));
                assert!(cq.cqe() >= cqe, "asked {cqe}, got {}", cq.cqe());
                assert_eq!((cq.comp_vector(), cq.has_channel()), (vector, channel));
                made += 1;
            }
        }
    }
    assert!(made >= 12);
}

/// A UD QP's registered source and the address of its own QP, for completions made with
/// raw verbs (so that no safe queue reserves CQ entries).
struct RawUd {
    src: rdma_verbs::MemoryRegion<AlignedBuf>,
    ah: AddressHandle,
    qp: QueuePair,
}

impl RawUd {
    /// One signaled SEND of 64 bytes to itself.
    fn send(&self, wr_id: u64) {
        let mut sge = self.src.sge(0..64).unwrap();
        let mut wr = ffi::ibv_send_wr {
            wr_id,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: ffi::ibv_wr_opcode::IBV_WR_SEND,
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        wr.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah: self.ah.as_raw(),
            remote_qpn: self.qp.qp_num(),
            remote_qkey: QKEY,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: the QP and the AH are live; the WR and its SGE live through the call; the
        // source is registered and outlives the send (the test polls its completion).
        let rc = unsafe { ffi::ibv_post_send(self.qp.as_raw(), &mut wr, &mut bad) };
        assert_eq!(rc, 0, "ibv_post_send: {}", std::io::Error::from_raw_os_error(rc));
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_cq_shrinks_and_grows_and_the_provider_refuses_to_shrink_it_below_the_completions_it_holds() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut cq = CompletionQueue::new(&ctx, 3).unwrap();
    let granted = cq.resize(1).unwrap();
    assert!(granted >= 1 && cq.cqe() == granted, "granted {granted}, cqe {}", cq.cqe());
    let granted = cq.resize(7).unwrap();
    assert!(granted >= 7 && cq.cqe() == granted, "granted {granted}, cqe {}", cq.cqe());

    // Fill all but one entry with send completions of a UD QP driven through ffi.
    let n = cq.cqe() - 1;
    let rcq = CompletionQueue::new(&ctx, 4).unwrap();
    let qp = QueuePair::builder(&pd, QpType::Ud, &cq, &rcq).max_send_wr(n).max_recv_wr(1).build().unwrap();
    qp.ready_ud(&InitAttr { qkey: QKEY, ..InitAttr::default() }).unwrap();
    let ah = AddressHandle::new(&pd, &AhAttr::global(1, qp.local_info(1).unwrap().gid, gid_index())).unwrap();
    let src = pd.register(AlignedBuf::new(64).unwrap(), AccessFlags::LOCAL_WRITE).unwrap();
    let ud = RawUd { src, ah, qp };
    for i in 0..n {
        ud.send(u64::from(i));
    }
    std::thread::sleep(Duration::from_millis(500)); // rxe completes them meanwhile

    let err = cq.resize(1).unwrap_err();
    assert_eq!((err.verb_name(), err.errno()), (Some("ibv_resize_cq"), Some(libc::EINVAL)), "{err:?}");
    assert!(err.to_string().contains("poll the completions first"), "{err}");
    assert!(cq.cqe() >= 7, "a refused resize leaves the size: {}", cq.cqe());
    // Every completion is still there, in order, once.
    let mut wc = [rdma_verbs::WorkCompletion::EMPTY; 16];
    let got = cq.poll(&mut wc).unwrap();
    assert_eq!(got.len(), n as usize);
    for (i, w) in got.iter().enumerate() {
        assert_eq!((w.status(), w.wr_id()), (WcStatus::Success, i as u64), "{w:?}");
    }
    // Empty now: shrinking is allowed again.
    assert!(cq.resize(1).unwrap() >= 1);
    drop(ud);
}

// ---- completion events on UD -------------------------------------------------------------

/// A UD QP ready with [`QKEY`] on its own CQ, and both of its queues.
struct Ud {
    cq: CompletionQueue,
    sq: SendQueue<Chunk>,
    rq: RecvQueue<Chunk>,
    qp: QueuePair,
}

fn ud(pd: &ProtectionDomain, channel: bool) -> Ud {
    let mut b = CompletionQueue::builder(pd.context(), 64);
    if channel {
        b = b.with_channel();
    }
    let cq = b.build().unwrap();
    let qp = QueuePair::builder(pd, QpType::Ud, &cq, &cq).max_send_wr(16).max_recv_wr(16).build().unwrap();
    qp.ready_ud(&InitAttr { qkey: QKEY, ..InitAttr::default() }).unwrap();
    Ud { sq: qp.send_queue().unwrap(), rq: qp.recv_queue().unwrap(), cq, qp }
}

fn to(pd: &ProtectionDomain, u: &Ud) -> AddressHandle {
    AddressHandle::new(pd, &AhAttr::global(1, u.qp.local_info(1).unwrap().gid, gid_index())).unwrap()
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn each_datagram_wakes_the_receivers_armed_cq_channel_and_poll_then_gets_its_bytes() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut a, mut b) = (ud(&pd, false), ud(&pd, true));
    let ah = to(&pd, &b);
    const LEN: usize = 256;
    // Nothing has completed: an armed wait times out.
    b.cq.arm(false).unwrap();
    assert!(b.cq.wait(Some(Duration::from_millis(100))).is_err(), "an event with nothing completed");
    for round in 0..10u64 {
        let mut r = chunks(&pd, 1, GRH_LEN + LEN, AccessFlags::LOCAL_WRITE).pop().unwrap();
        r.fill(0xee);
        b.rq.post(r, 0..GRH_LEN + LEN, round).unwrap_or_else(|r| panic!("{}", r.error));
        b.cq.arm(false).unwrap();
        let data = random_bytes(round + 1, LEN);
        let mut s = chunks(&pd, 1, LEN, AccessFlags::LOCAL_WRITE).pop().unwrap();
        s.copy_from_slice(&data);
        a.sq.post(SendWr::send_ud(s, 0..LEN, &ah, b.qp.qp_num(), QKEY)).unwrap_or_else(|r| panic!("{}", r.error));
        let mut wc = poll_one(&mut a.cq);
        assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
        a.sq.complete(&mut wc, |_| ()).unwrap();

        b.cq.wait(Some(Duration::from_secs(10))).unwrap_or_else(|e| panic!("round {round}: no event: {e}"));
        b.cq.ack_events();
        let mut wc = b.cq.poll_one().unwrap().expect("the event came with its completion");
        let got = b.rq.complete(&mut wc).unwrap();
        assert_eq!((got.status, got.id, got.byte_len as usize), (WcStatus::Success, round, GRH_LEN + LEN));
        assert_eq!(&got.value[GRH_LEN..], &data[..], "round {round}");
    }
    assert_eq!(b.cq.unacked_events(), 0);
}

// ---- queue pairs ---------------------------------------------------------------------------

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn extended_rc_uc_and_ud_qps_start_in_reset_with_their_caps_and_walk_to_init_or_rts() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 256).unwrap();
    for (qp_type, ops) in [
        (QpType::Rc, SendOps::SEND | SendOps::RDMA_WRITE | SendOps::RDMA_READ),
        (QpType::Uc, SendOps::SEND | SendOps::SEND_WITH_IMM | SendOps::RDMA_WRITE),
        (QpType::Ud, SendOps::SEND | SendOps::SEND_WITH_IMM),
    ] {
        let qp = QueuePair::builder(&pd, qp_type, &cq, &cq)
            .max_send_wr(32)
            .max_recv_wr(16)
            .max_send_sge(2)
            .extended_send_ops(ops)
            .build()
            .unwrap_or_else(|e| panic!("{qp_type}: {e}"));
        assert!(qp.as_raw_ex().is_some(), "{qp_type}: an extended QP");
        assert_eq!(qp.send_ops(), ops);
        let q = qp.query().unwrap();
        assert_eq!(q.state, QpState::Reset, "{qp_type}");
        assert!(q.cap.max_send_wr >= 32 && q.cap.max_recv_wr >= 16 && q.cap.max_send_sge >= 2, "{q:?}");
        if qp_type == QpType::Ud {
            qp.ready_ud(&InitAttr { qkey: QKEY, ..InitAttr::default() }).unwrap();
            let q = qp.query().unwrap();
            assert_eq!((q.state, q.qkey), (QpState::Rts, QKEY), "{q:?}");
        } else {
            qp.to_init(&InitAttr { access: QpAccess::REMOTE_WRITE, ..InitAttr::default() }).unwrap();
            let q = qp.query().unwrap();
            assert_eq!(q.state, QpState::Init, "{qp_type}");
            assert!(q.access.contains(QpAccess::REMOTE_WRITE), "{q:?}");
        }
    }
}

/// Two UD QPs of `pd`, A moved from RTS back to RESET, and an address handle to B.
fn reset_ud_pair(pd: &ProtectionDomain) -> (Ud, Ud, AddressHandle) {
    let (a, b) = (ud(pd, false), ud(pd, false));
    let ah = to(pd, &b);
    a.qp.reset().unwrap();
    (a, b, ah)
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn posts_to_a_qp_reset_after_rts_are_refused_with_einval_and_hand_the_buffers_back() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut a, b, ah) = reset_ud_pair(&pd);
    assert_eq!(a.qp.state().unwrap(), QpState::Reset);

    let mut r = chunks(&pd, 1, GRH_LEN + 64, AccessFlags::LOCAL_WRITE).pop().unwrap();
    r.fill(0x5a);
    let refused = a.rq.post(r, 0..GRH_LEN + 64, 1).unwrap_err();
    assert_eq!((refused.error.verb_name(), refused.error.errno()), (Some("ibv_post_recv"), Some(libc::EINVAL)));
    assert!(refused.value.iter().all(|&x| x == 0x5a), "the receive buffer comes back untouched");

    let mut s = chunks(&pd, 1, 64, AccessFlags::LOCAL_WRITE).pop().unwrap();
    s.copy_from_slice(&random_bytes(7, 64));
    let refused = a.sq.post(SendWr::send_ud(s, 0..64, &ah, b.qp.qp_num(), QKEY)).unwrap_err();
    assert_eq!((refused.error.verb_name(), refused.error.errno()), (Some("ibv_post_send"), Some(libc::EINVAL)));
    assert_eq!(a.sq.outstanding(), 0, "nothing was posted");
    let mut wc = [rdma_verbs::WorkCompletion::EMPTY; 4];
    assert!(a.cq.poll(&mut wc).unwrap().is_empty(), "and nothing completes");
    drop(refused);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_batch_posted_to_a_qp_reset_after_rts_is_refused_with_einval_and_every_request_comes_back_whole_in_order() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut a, b, ah) = reset_ud_pair(&pd);
    // Four requests that differ in every field a request keeps: buffer bytes, range, id,
    // immediate data and signaling. The provider refuses the batch at its first request.
    let (mut wrs, mut shown) = (Vec::new(), Vec::new());
    for (i, mut s) in chunks(&pd, 4, 64, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
        s.copy_from_slice(&random_bytes(20 + i as u64, 64));
        let wr = SendWr::send_ud(s, i..16 * (i + 1), &ah, b.qp.qp_num(), QKEY)
            .imm(0x100 + i as u32)
            .signaled(i % 2 == 0)
            .id(100 + i as u64);
        shown.push(format!("{wr:?}"));
        wrs.push(wr);
    }
    let refused = a.sq.post_batch(wrs).unwrap_err();
    assert_eq!((refused.error.verb_name(), refused.error.errno()), (Some("ibv_post_send"), Some(libc::EINVAL)));
    assert_eq!(a.sq.outstanding(), 0, "nothing was posted");
    let back: Vec<String> = refused.value.iter().map(|w| format!("{w:?}")).collect();
    assert_eq!(back, shown, "every request comes back as it was built, in order");
    for (i, wr) in refused.value.into_iter().enumerate() {
        assert_eq!(&wr.into_buf()[..], &random_bytes(20 + i as u64, 64)[..], "request {i}'s buffer, untouched");
    }
    let mut wc = [rdma_verbs::WorkCompletion::EMPTY; 8];
    assert!(a.cq.poll(&mut wc).unwrap().is_empty(), "and nothing completes");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_receive_with_more_sges_than_the_qp_takes_is_refused_before_c_and_one_within_fills_them() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 64).unwrap();
    let qp =
        QueuePair::builder(&pd, QpType::Ud, &cq, &cq).max_recv_sge(1).max_recv_wr(4).max_send_wr(4).build().unwrap();
    let max = qp.caps().max_recv_sge;
    qp.ready_ud(&InitAttr { qkey: QKEY, ..InitAttr::default() }).unwrap();
    // Scatter into two regions: one SGE more than the QP takes when it granted one.
    assert_eq!(max, 1, "the test needs a QP granted exactly the one receive SGE it asked for");
    let mut rq: RecvQueue<[Chunk; 2]> = qp.recv_queue().unwrap();
    let two = || chunks(&pd, 1, GRH_LEN + 32, AccessFlags::LOCAL_WRITE).pop().unwrap();
    let refused = rq.post([two(), two()], 0..2 * (GRH_LEN + 32), 1).unwrap_err();
    assert!(matches!(refused.error, Error::InvalidArgument { verb: Verb::RecvQueuePost, .. }), "{:?}", refused.error);
    assert!(refused.error.to_string().contains("2 SGEs, but the queue takes 1 (max_recv_sge)"), "{}", refused.error);
    // The same pair limited to what one SGE covers is posted.
    rq.post(refused.value, 0..GRH_LEN + 32, 2).unwrap_or_else(|r| panic!("{}", r.error));
}

// ---- atomics -------------------------------------------------------------------------------

/// A fetch-and-add of 5 on the word at `offset` of a fresh remote-atomic region, over a
/// pair whose QPs allow `qp_access`; the completion status and the word afterwards.
fn fetch_add_on(qp_access: QpAccess, aim: impl Fn(RemoteMr) -> RemoteMr) -> (Result<WcStatus, Error>, [u64; 2]) {
    let (pd, mut a, b) = rc_pair::<Chunk>(qp_access);
    let target = pd
        .register_remote_writable(
            AlignedBuf::new(4096).unwrap(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    target.atomic_u64(0).unwrap().store(100, Ordering::SeqCst);
    target.atomic_u64(8).unwrap().store(200, Ordering::SeqCst);
    let word = aim(target.remote().unwrap().slice(0..8).unwrap());
    let local = chunks(&pd, 1, 8, AccessFlags::LOCAL_WRITE).pop().unwrap();
    let status = match a.sq.post(SendWr::fetch_add(local, 0, word, 5)) {
        Err(r) => Err(r.error),
        Ok(()) => {
            let mut wc = poll_one(&mut a.cq);
            let status = wc.status();
            a.sq.complete(&mut wc, |_| ()).unwrap();
            Ok(status)
        }
    };
    let words = [0, 8].map(|o| target.atomic_u64(o).unwrap().load(Ordering::SeqCst));
    drop((a, b, target));
    (status, words)
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn an_atomic_to_a_qp_without_remote_atomic_access_fails_and_leaves_the_word_unchanged() {
    let _leaks = LeakCheck::new();
    // With the right on the QP, the same request adds.
    let (status, words) = fetch_add_on(QpAccess::REMOTE_WRITE | QpAccess::REMOTE_ATOMIC, |r| r);
    assert_eq!((status.unwrap(), words), (WcStatus::Success, [105, 200]));
    // Without it, the responder refuses: the region's right alone is not enough.
    let (status, words) = fetch_add_on(QpAccess::REMOTE_WRITE | QpAccess::REMOTE_READ, |r| r);
    assert_eq!(status.unwrap(), WcStatus::RemInvReqErr);
    assert_eq!(words, [100, 200], "the word is unchanged");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn an_atomic_on_an_unaligned_remote_address_is_refused_before_c_and_leaves_both_words_unchanged() {
    let _leaks = LeakCheck::new();
    let all = QpAccess::REMOTE_WRITE | QpAccess::REMOTE_ATOMIC;
    // One byte past the first word: the request would straddle both.
    let (status, words) = fetch_add_on(all, |r| RemoteMr { addr: r.addr + 1, ..r });
    let err = status.expect_err("an unaligned atomic was posted");
    assert!(matches!(err, Error::InvalidArgument { verb: Verb::SendQueuePost, .. }), "{err:?}");
    assert!(err.to_string().contains("8-byte aligned remote address"), "{err}");
    assert_eq!(words, [100, 200], "neither word it straddles changed");
}

// ---- relaxed ordering ----------------------------------------------------------------------

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn sends_and_datagrams_land_whole_in_receive_buffers_registered_with_relaxed_ordering() {
    let _leaks = LeakCheck::new();
    const LEN: usize = 1024;
    const N: u64 = 20;
    let ro = AccessFlags::LOCAL_WRITE | AccessFlags::RELAXED_ORDERING;

    // RC: SENDs into relaxed-ordering receive buffers.
    let (pd, mut a, mut b) = rc_pair::<Chunk>(QpAccess::empty());
    for round in 0..N {
        let r = pd.register(AlignedBuf::new(LEN).unwrap(), ro).unwrap();
        assert!(r.access().contains(AccessFlags::RELAXED_ORDERING));
        let r = r.into_chunks(LEN).unwrap().pop().unwrap();
        b.rq.post(r, 0..LEN, round).unwrap_or_else(|r| panic!("{}", r.error));
        let data = random_bytes(round + 100, LEN);
        let mut s = chunks(&pd, 1, LEN, AccessFlags::LOCAL_WRITE).pop().unwrap();
        s.copy_from_slice(&data);
        a.sq.post(SendWr::send(s, 0..LEN)).unwrap_or_else(|r| panic!("{}", r.error));
        let mut wc = poll_one(&mut a.cq);
        assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
        a.sq.complete(&mut wc, |_| ()).unwrap();
        let mut wc = poll_one(&mut b.cq);
        let got = b.rq.complete(&mut wc).unwrap();
        assert_eq!((got.status, got.id, got.byte_len as usize), (WcStatus::Success, round, LEN));
        assert_eq!(&got.value[..], &data[..], "RC round {round}");
    }
    drop((a, b));

    // UD: datagrams into relaxed-ordering receive buffers.
    let (mut u, mut v) = (ud(&pd, false), ud(&pd, false));
    let ah = to(&pd, &v);
    for round in 0..N {
        let r = pd.register(AlignedBuf::new(GRH_LEN + LEN).unwrap(), ro).unwrap();
        let r = r.into_chunks(GRH_LEN + LEN).unwrap().pop().unwrap();
        v.rq.post(r, 0..GRH_LEN + LEN, round).unwrap_or_else(|r| panic!("{}", r.error));
        let data = random_bytes(round + 200, LEN);
        let mut s = chunks(&pd, 1, LEN, AccessFlags::LOCAL_WRITE).pop().unwrap();
        s.copy_from_slice(&data);
        u.sq.post(SendWr::send_ud(s, 0..LEN, &ah, v.qp.qp_num(), QKEY)).unwrap_or_else(|r| panic!("{}", r.error));
        let mut wc = poll_one(&mut u.cq);
        assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
        u.sq.complete(&mut wc, |_| ()).unwrap();
        let mut wc = poll_one(&mut v.cq);
        let got = v.rq.complete(&mut wc).unwrap();
        assert_eq!((got.status, got.id, got.byte_len as usize), (WcStatus::Success, round, GRH_LEN + LEN));
        assert_eq!(&got.value[GRH_LEN..], &data[..], "UD round {round}");
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn query_device_ex_agrees_with_query_device_and_reports_what_the_device_lacks_as_zero() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let (base, ex) = (ctx.query_device().unwrap(), ctx.query_device_ex().unwrap());
    eprintln!("{}: {ex:?}", ctx.name());
    assert_eq!(
        (ex.base.node_guid, ex.base.max_qp, ex.base.max_qp_wr, ex.base.max_cqe, ex.base.max_mr_size),
        (base.node_guid, base.max_qp, base.max_qp_wr, base.max_cqe, base.max_mr_size),
        "the extended query's classic part is the classic query's"
    );
    assert_eq!(ex.phys_port_cnt, u32::from(base.phys_port_cnt), "phys_port_cnt_ex agrees with phys_port_cnt");
    assert!(ex.phys_port_cnt >= 1);
    assert_eq!(ex.raw().orig_attr.max_qp as u32, base.max_qp);
    if ctx.name().starts_with("rxe") {
        // Linux 6.1's rxe: no ODP, no timestamps or device clock, no device memory, no
        // CQ moderation.
        assert_eq!(ex.odp_general_caps, 0, "{ex:?}");
        assert_eq!((ex.completion_timestamp_mask, ex.hca_core_clock_khz, ex.max_dm_size), (0, 0, 0), "{ex:?}");
        assert_eq!(ex.cq_moderation, (0, 0), "{ex:?}");
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn data_in_order_answers_for_each_operation_and_refuses_what_is_not_one() {
    use rdma_verbs::SendOps;
    let _leaks = LeakCheck::new();
    let (_pd, a, _b) = rc_pair::<rdma_verbs::Chunk>(rdma_verbs::QpAccess::empty());
    for op in
        [SendOps::RDMA_WRITE, SendOps::RDMA_WRITE_WITH_IMM, SendOps::SEND, SendOps::SEND_WITH_IMM, SendOps::RDMA_READ]
    {
        let in_order = a.qp.data_in_order(op).unwrap();
        eprintln!("{op:?}: data in order {in_order}");
        // rxe's provider has no such query: libibverbs answers 0, no promise.
        assert!(!(device_name().starts_with("rxe") && in_order), "{op:?}: rxe promised in-order data");
    }
    let e = a.qp.data_in_order(SendOps::RDMA_WRITE | SendOps::SEND).unwrap_err();
    assert!(matches!(e, rdma_verbs::Error::InvalidArgument { verb: rdma_verbs::Verb::QpDataInOrder, .. }), "{e:?}");
    let e = a.qp.data_in_order(SendOps::ATOMIC_FETCH_AND_ADD).unwrap_err();
    assert!(e.to_string().contains("one of RDMA_WRITE"), "{e}");
}
