//! Queue pairs, shared receive queues and address handles: life cycles, the state machine
//! with each transport's attributes, refusals before C, recovery, and drop orders.
//!
//! Where a test proves that a connection or an address really works, it passes a message
//! with raw verbs (`ibv_reg_mr`, `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`), so these
//! tests depend on the QP, SRQ and AH types alone.

use std::ffi::c_int;
use std::ptr;
use std::time::{Duration, Instant};

use rdma_verbs::ffi;
use rdma_verbs::MAX_PSN;
use rdma_verbs::{
    AddressHandle, AhAttr, CompletionQueue, Context, Error, Gid, InitAttr, Mtu, ProtectionDomain, QpAccess, QpState,
    QpType, QueuePair, Remote, RemoteQpInfo, RtrAttr, RtsAttr, SendOps, SharedReceiveQueue, DEFAULT_QKEY,
};

use crate::{gid_index, open, LeakCheck};

/// Long enough for rxe under emulation.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes of the global route header in front of every UD receive on RoCE.
const GRH_LEN: usize = 40;

/// A registered buffer made with raw verbs (mr.rs is not ours to depend on). Declare it
/// after its PD so that it is deregistered first.
struct Buf {
    mr: *mut ffi::ibv_mr,
    mem: Vec<u8>,
}

impl Buf {
    fn new(pd: &ProtectionDomain, len: usize) -> Buf {
        let mut mem = vec![0u8; len];
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ;
        // SAFETY: the PD is live; the heap buffer stays where it is while `Buf` owns it, and
        // `Drop` deregisters before the memory is freed.
        let mr = unsafe { ffi::ibv_reg_mr(pd.as_raw(), mem.as_mut_ptr().cast(), len, access.0 as c_int) };
        assert!(!mr.is_null(), "ibv_reg_mr: {}", std::io::Error::last_os_error());
        Buf { mr, mem }
    }

    fn sge(&self, offset: usize, len: usize) -> ffi::ibv_sge {
        assert!(offset + len <= self.mem.len());
        // SAFETY: the MR is live while `self` is.
        let lkey = unsafe { (*self.mr).lkey };
        ffi::ibv_sge { addr: self.mem.as_ptr() as u64 + offset as u64, length: len as u32, lkey }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: registered in `new`, deregistered once here.
        let rc = unsafe { ffi::ibv_dereg_mr(self.mr) };
        assert_eq!(rc, 0, "ibv_dereg_mr failed: {rc}");
    }
}

fn post_recv(qp: &QueuePair, wr_id: u64, mut sge: ffi::ibv_sge) {
    let mut wr = ffi::ibv_recv_wr { wr_id, next: ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
    let mut bad = ptr::null_mut();
    // SAFETY: the QP is live; the WR and SGE live through the call and the buffer is
    // registered and outlives the receive (the test polls it).
    let rc = unsafe { ffi::ibv_post_recv(qp.as_raw(), &mut wr, &mut bad) };
    assert_eq!(rc, 0, "ibv_post_recv failed: {rc}");
}

fn post_srq_recv(srq: &SharedReceiveQueue, wr_id: u64, mut sge: ffi::ibv_sge) {
    let mut wr = ffi::ibv_recv_wr { wr_id, next: ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
    let mut bad = ptr::null_mut();
    // SAFETY: as in post_recv, for the SRQ.
    let rc = unsafe { ffi::ibv_post_srq_recv(srq.as_raw(), &mut wr, &mut bad) };
    assert_eq!(rc, 0, "ibv_post_srq_recv failed: {rc}");
}

/// Posts one signaled SEND of `sge`; `ud` is (address handle, remote QPN, Q_Key).
fn post_send(qp: &QueuePair, wr_id: u64, mut sge: ffi::ibv_sge, ud: Option<(&AddressHandle, u32, u32)>) {
    let mut wr = ffi::ibv_send_wr {
        wr_id,
        sg_list: &mut sge,
        num_sge: 1,
        opcode: ffi::ibv_wr_opcode::IBV_WR_SEND,
        send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
        ..Default::default()
    };
    if let Some((ah, remote_qpn, remote_qkey)) = ud {
        wr.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 { ah: ah.as_raw(), remote_qpn, remote_qkey };
    }
    let mut bad = ptr::null_mut();
    // SAFETY: the QP (and AH) are live; the WR and SGE live through the call and the buffer
    // is registered and outlives the send (the test polls it).
    let rc = unsafe { ffi::ibv_post_send(qp.as_raw(), &mut wr, &mut bad) };
    assert_eq!(rc, 0, "ibv_post_send failed: {rc}");
}

/// Polls one completion or panics after [`TIMEOUT`].
fn poll_one(cq: &CompletionQueue) -> ffi::ibv_wc {
    let start = Instant::now();
    loop {
        let mut wc = ffi::ibv_wc::default();
        // SAFETY: the CQ is live and `wc` has room for one entry.
        let n = unsafe { ffi::ibv_poll_cq(cq.as_raw(), 1, &mut wc) };
        assert!(n >= 0, "ibv_poll_cq failed: {n}");
        if n == 1 {
            return wc;
        }
        assert!(start.elapsed() < TIMEOUT, "no completion within {TIMEOUT:?}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[track_caller]
fn expect_ok(wc: &ffi::ibv_wc, wr_id: u64, opcode: ffi::ibv_wc_opcode) {
    assert_eq!(wc.status.0, ffi::ibv_wc_status::IBV_WC_SUCCESS.0, "wr_id {} failed: status {}", wc.wr_id, wc.status.0);
    assert_eq!((wc.wr_id, wc.opcode.0), (wr_id, opcode.0));
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Sends `len` bytes from `from` to `to` (a receive posted on `to`, or on `srq` when given)
/// and checks both completions and the bytes.
#[allow(clippy::too_many_arguments)]
fn pass_send(
    pd: &ProtectionDomain,
    from: &QueuePair,
    from_cq: &CompletionQueue,
    to: &QueuePair,
    to_cq: &CompletionQueue,
    srq: Option<&SharedReceiveQueue>,
    len: usize,
    seed: u8,
) {
    let mut src = Buf::new(pd, len);
    let dst = Buf::new(pd, len);
    let msg = pattern(len, seed);
    src.mem.copy_from_slice(&msg);
    match srq {
        Some(srq) => post_srq_recv(srq, 200 + u64::from(seed), dst.sge(0, len)),
        None => post_recv(to, 200 + u64::from(seed), dst.sge(0, len)),
    }
    post_send(from, 100 + u64::from(seed), src.sge(0, len), None);
    expect_ok(&poll_one(from_cq), 100 + u64::from(seed), ffi::ibv_wc_opcode::IBV_WC_SEND);
    let got = poll_one(to_cq);
    expect_ok(&got, 200 + u64::from(seed), ffi::ibv_wc_opcode::IBV_WC_RECV);
    assert_eq!((got.byte_len as usize, got.qp_num), (len, to.qp_num()));
    assert_eq!(dst.mem, msg, "the received bytes differ from those sent");
}

/// The path to a peer on port 1: by the device's GID on RoCE, by LID on InfiniBand.
fn path_to(ctx: &Context, peer: &RemoteQpInfo) -> Remote {
    if ctx.query_port(1).unwrap().is_ethernet() {
        Remote::gid(peer.gid, gid_index())
    } else {
        Remote::lid(peer.lid)
    }
}

/// Connects two RC or UC QPs to each other with `connect`, each sending from its own PSN.
fn connect_pair(a: &QueuePair, b: &QueuePair) {
    let (ia, ib) = (a.local_info(1).unwrap(), b.local_info(1).unwrap());
    let init = InitAttr { access: QpAccess::REMOTE_WRITE | QpAccess::REMOTE_READ, ..InitAttr::default() };
    a.connect(&init, &ib).unwrap();
    b.connect(&init, &ia).unwrap();
}

#[track_caller]
fn invalid_text(err: Error, verb: &str) -> String {
    match &err {
        Error::InvalidArgument { verb: v, .. } if v.name() == verb => err.to_string(),
        _ => panic!("expected an InvalidArgument for {verb} (refused before C), got {err:?}"),
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn rc_uc_and_ud_qps_start_in_reset_with_at_least_the_caps_asked_and_are_destroyed() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (scq, rcq) = (CompletionQueue::new(&ctx, 64).unwrap(), CompletionQueue::new(&ctx, 64).unwrap());
    for qp_type in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let qp = QueuePair::builder(&pd, qp_type, &scq, &rcq)
            .max_send_wr(48)
            .max_recv_wr(32)
            .max_send_sge(2)
            .max_recv_sge(2)
            .max_inline_data(64)
            .sq_sig_all(true)
            .build()
            .unwrap();
        assert_eq!(qp.qp_type(), qp_type);
        assert!(qp.qp_num() > 1, "{qp:?}");
        assert!(qp.sq_sig_all() && !qp.has_srq() && qp.as_raw_ex().is_none());
        let caps = qp.caps();
        assert!(caps.max_send_wr >= 48 && caps.max_recv_wr >= 32, "{caps:?}");
        assert!(caps.max_send_sge >= 2 && caps.max_recv_sge >= 2 && caps.max_inline_data >= 64, "{caps:?}");
        assert_eq!(qp.state().unwrap(), QpState::Reset);
        let attrs = qp.query().unwrap();
        assert_eq!(attrs.state, QpState::Reset);
        assert!(attrs.cap.max_send_wr >= 48, "{attrs:?}");
        // SAFETY: the QP is live; the provider keeps its type in the struct.
        assert_eq!(QpType::from_ffi(unsafe { (*qp.as_raw()).qp_type }), Some(qp_type));
        qp.destroy().unwrap();
    }
    // Defaults: 128 WRs and one SGE each way (on one CQ: it needs 256 entries for them).
    let cq = CompletionQueue::new(&ctx, 256).unwrap();
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).build().unwrap();
    let caps = qp.caps();
    assert!(caps.max_send_wr >= 128 && caps.max_recv_wr >= 128 && caps.max_send_sge >= 1, "{caps:?}");
    drop(qp); // dropped rather than destroyed: the leak check sees it freed
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn two_rc_qps_walk_reset_init_rtr_rts_through_the_device_gid_and_pass_sends_both_ways() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (cq_a, cq_b) = (CompletionQueue::new(&ctx, 256).unwrap(), CompletionQueue::new(&ctx, 256).unwrap());
    let a = QueuePair::builder(&pd, QpType::Rc, &cq_a, &cq_a).build().unwrap();
    let b = QueuePair::builder(&pd, QpType::Rc, &cq_b, &cq_b).build().unwrap();
    let (ia, ib) = (a.local_info(1).unwrap(), b.local_info(1).unwrap());
    let port = ctx.query_port(1).unwrap();
    if port.is_ethernet() {
        assert_eq!(ia.gid, ctx.query_gid(1, gid_index()).unwrap().gid, "local_info uses the device's GID");
    }

    let access = QpAccess::REMOTE_WRITE | QpAccess::REMOTE_READ | QpAccess::REMOTE_ATOMIC;
    for qp in [&a, &b] {
        assert_eq!(qp.state().unwrap(), QpState::Reset);
        qp.to_init(&InitAttr { access, ..InitAttr::default() }).unwrap();
        assert_eq!(qp.state().unwrap(), QpState::Init);
    }
    // Asking for 4096 clamps to the port's active MTU.
    a.to_rtr(&RtrAttr { path_mtu: Mtu::Mtu4096, ..RtrAttr::new(path_to(&ctx, &ib), ib.qpn, ib.psn) }).unwrap();
    b.to_rtr(&RtrAttr::new(path_to(&ctx, &ia), ia.qpn, ia.psn)).unwrap();
    assert_eq!((a.state().unwrap(), b.state().unwrap()), (QpState::Rtr, QpState::Rtr));
    a.to_rts(&RtsAttr { sq_psn: ia.psn, ..RtsAttr::default() }).unwrap();
    b.to_rts(&RtsAttr { sq_psn: ib.psn, ..RtsAttr::default() }).unwrap();
    assert_eq!((a.state().unwrap(), b.state().unwrap()), (QpState::Rts, QpState::Rts));

    let q = a.query().unwrap();
    assert_eq!(q.state, QpState::Rts);
    assert_eq!(q.dest_qp_num, b.qp_num());
    assert_eq!(q.path_mtu, port.active_mtu, "4096 is clamped to the active MTU: {q:?}");
    assert_eq!(q.access, access);
    assert_eq!((q.timeout, q.retry_cnt, q.rnr_retry), (14, 6, 6), "{q:?}");
    assert_eq!(q.port, 1);
    if port.is_ethernet() {
        assert!(matches!(q.path.remote, Remote::Gid { gid, .. } if gid == ib.gid), "{q:?}");
    }

    pass_send(&pd, &a, &cq_a, &b, &cq_b, None, 300, 1);
    pass_send(&pd, &b, &cq_b, &a, &cq_a, None, 2000, 2);
    eprintln!(
        "RC {:#x} <-> {:#x}: RESET->INIT->RTR->RTS, sends both ways checked byte for byte",
        a.qp_num(),
        b.qp_num()
    );
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn uc_qps_connected_with_connect_pass_a_send() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (cq_a, cq_b) = (CompletionQueue::new(&ctx, 256).unwrap(), CompletionQueue::new(&ctx, 256).unwrap());
    let a = QueuePair::builder(&pd, QpType::Uc, &cq_a, &cq_a).psn(7).build().unwrap();
    let b = QueuePair::builder(&pd, QpType::Uc, &cq_b, &cq_b).psn(9).build().unwrap();
    connect_pair(&a, &b);
    assert_eq!((a.state().unwrap(), b.state().unwrap()), (QpState::Rts, QpState::Rts));
    let q = b.query().unwrap();
    assert_eq!((q.dest_qp_num, q.sq_psn), (a.qp_num(), 9), "{q:?}");
    pass_send(&pd, &a, &cq_a, &b, &cq_b, None, 512, 3);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn the_psn_local_info_advertises_is_the_one_connect_sends_from_and_the_peer_expects() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (cq_a, cq_b) = (CompletionQueue::new(&ctx, 256).unwrap(), CompletionQueue::new(&ctx, 256).unwrap());
    // One PSN fixed (tests, tools that must match a peer), one chosen at random.
    let a = QueuePair::builder(&pd, QpType::Rc, &cq_a, &cq_a).psn(0xab_cdef).build().unwrap();
    let b = QueuePair::builder(&pd, QpType::Rc, &cq_b, &cq_b).build().unwrap();
    assert_eq!(a.psn(), 0xab_cdef);
    assert!(b.psn() <= MAX_PSN, "a random PSN has 24 bits: {:#x}", b.psn());
    let (ia, ib) = (a.local_info(1).unwrap(), b.local_info(1).unwrap());
    assert_eq!((ia.psn, ib.psn), (a.psn(), b.psn()), "local_info advertises the QP's PSN");
    assert_eq!(a.local_info(1).unwrap().psn, ia.psn, "chosen once, not per call");
    connect_pair(&a, &b);
    // Each sends from the PSN it advertised, which is what the other expects.
    let (qa, qb) = (a.query().unwrap(), b.query().unwrap());
    assert_eq!((qa.sq_psn, qb.rq_psn), (ia.psn, ia.psn), "a: {qa:?}, b: {qb:?}");
    assert_eq!((qb.sq_psn, qa.rq_psn), (ib.psn, ib.psn), "a: {qa:?}, b: {qb:?}");
    pass_send(&pd, &a, &cq_a, &b, &cq_b, None, 100, 11);
    pass_send(&pd, &b, &cq_b, &a, &cq_a, None, 100, 12);
    // ready_ud sends from the QP's PSN too.
    let ud = QueuePair::builder(&pd, QpType::Ud, &cq_a, &cq_a).max_send_wr(4).max_recv_wr(4).psn(0x42).build().unwrap();
    ud.ready_ud(&InitAttr::default()).unwrap();
    assert_eq!(ud.query().unwrap().sq_psn, 0x42);
    // A PSN wider than 24 bits is refused before the QP exists.
    let err = QueuePair::builder(&pd, QpType::Rc, &cq_a, &cq_a).psn(1 << 24).build().unwrap_err();
    let text = invalid_text(err, "QueuePairBuilder::build");
    assert!(text.contains("psn 0x1000000 does not fit in 24 bits"), "{text}");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn ud_qps_go_init_rtr_rts_with_a_qkey_and_a_datagram_reaches_the_peer_through_an_address_handle() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (cq_a, cq_b) = (CompletionQueue::new(&ctx, 256).unwrap(), CompletionQueue::new(&ctx, 256).unwrap());
    let a = QueuePair::builder(&pd, QpType::Ud, &cq_a, &cq_a).build().unwrap();
    let b = QueuePair::builder(&pd, QpType::Ud, &cq_b, &cq_b).build().unwrap();
    let qkey = 0x0bad_cafe;
    let init = InitAttr { qkey, ..InitAttr::default() };

    // Step by step on one, with ready_ud on the other.
    a.to_init(&init).unwrap();
    assert_eq!(a.state().unwrap(), QpState::Init);
    a.to_rtr_ud().unwrap();
    assert_eq!(a.state().unwrap(), QpState::Rtr);
    a.to_rts(&RtsAttr { sq_psn: 0x42, ..RtsAttr::default() }).unwrap();
    assert_eq!(a.state().unwrap(), QpState::Rts);
    b.ready_ud(&init).unwrap();
    let q = b.query().unwrap();
    assert_eq!((q.state, q.qkey), (QpState::Rts, qkey), "{q:?}");
    assert_eq!(a.query().unwrap().sq_psn, 0x42);

    // A datagram from a to b, addressed by an AH on the device's own GID.
    let peer = b.local_info(1).unwrap();
    let ah = AddressHandle::new(&pd, &AhAttr::new(1, path_to(&ctx, &peer))).unwrap();
    let len = 64;
    let mut src = Buf::new(&pd, len);
    let dst = Buf::new(&pd, GRH_LEN + len);
    let msg = pattern(len, 4);
    src.mem.copy_from_slice(&msg);
    post_recv(&b, 2, dst.sge(0, GRH_LEN + len));
    post_send(&a, 1, src.sge(0, len), Some((&ah, b.qp_num(), qkey)));
    expect_ok(&poll_one(&cq_a), 1, ffi::ibv_wc_opcode::IBV_WC_SEND);
    let got = poll_one(&cq_b);
    expect_ok(&got, 2, ffi::ibv_wc_opcode::IBV_WC_RECV);
    assert_eq!((got.src_qp, got.byte_len as usize), (a.qp_num(), GRH_LEN + len));
    assert_eq!(&dst.mem[GRH_LEN..], &msg[..]);
    drop((src, dst));
    ah.destroy().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn illegal_transitions_are_refused_before_c_and_the_qp_stays_usable() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 256).unwrap();
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).build().unwrap();
    let peer = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).build().unwrap();
    let info = peer.local_info(1).unwrap();

    let text = invalid_text(qp.to_rts(&RtsAttr::default()).unwrap_err(), "ibv_modify_qp");
    assert!(text.contains("is in RESET; RTS can be reached only from RTR"), "{text}");
    eprintln!("{text}");
    let text = invalid_text(qp.to_rtr(&RtrAttr::new(path_to(&ctx, &info), info.qpn, 5)).unwrap_err(), "ibv_modify_qp");
    assert!(text.contains("is in RESET; RTR can be reached only from INIT"), "{text}");
    let text = invalid_text(qp.to_rtr_ud().unwrap_err(), "ibv_modify_qp");
    assert!(text.contains("UD"), "{text}");
    assert_eq!(qp.state().unwrap(), QpState::Reset, "a refused transition changed the state");

    qp.to_init(&InitAttr::default()).unwrap();
    qp.to_init(&InitAttr { access: QpAccess::REMOTE_WRITE, ..InitAttr::default() }).unwrap(); // INIT -> INIT
    let text = invalid_text(qp.to_rts(&RtsAttr::default()).unwrap_err(), "ibv_modify_qp");
    assert!(text.contains("is in INIT; RTS can be reached only from RTR"), "{text}");
    // Placeholders and out-of-range values are refused before C too.
    let text = invalid_text(qp.to_rtr(&RtrAttr::default()).unwrap_err(), "ibv_modify_qp");
    assert!(text.contains("dest_qpn 0"), "{text}");
    let bad_psn = RtrAttr::new(path_to(&ctx, &info), info.qpn, 1 << 24);
    assert!(invalid_text(qp.to_rtr(&bad_psn).unwrap_err(), "ibv_modify_qp").contains("rq_psn"));
    if ctx.query_port(1).unwrap().is_ethernet() {
        let by_lid = RtrAttr::new(Remote::lid(1), info.qpn, 5);
        assert!(invalid_text(qp.to_rtr(&by_lid).unwrap_err(), "ibv_modify_qp").contains("addressed by GID"));
        let past = RtrAttr::new(Remote::gid(info.gid, 255), info.qpn, 5);
        assert!(invalid_text(qp.to_rtr(&past).unwrap_err(), "ibv_modify_qp").contains("sgid_index 255"));
        let wide = RtrAttr::new(Remote::gid(info.gid, 256), info.qpn, 5);
        let text = invalid_text(qp.to_rtr(&wide).unwrap_err(), "ibv_modify_qp");
        assert!(text.contains("sgid_index 256 does not fit the 8 bits"), "{text}");
    }
    assert_eq!(qp.state().unwrap(), QpState::Init);

    // The valid transitions still work.
    qp.to_rtr(&RtrAttr::new(path_to(&ctx, &info), info.qpn, 5)).unwrap();
    let text = invalid_text(qp.to_init(&InitAttr::default()).unwrap_err(), "ibv_modify_qp");
    assert!(text.contains("is in RTR; INIT can be reached only from RESET or INIT"), "{text}");
    let text = invalid_text(qp.to_rts(&RtsAttr { rnr_retry: 8, ..RtsAttr::default() }).unwrap_err(), "ibv_modify_qp");
    assert!(text.contains("rnr_retry"), "{text}");
    qp.to_rts(&RtsAttr::default()).unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Rts);

    // A UD QP refuses remote access and connected-QP calls.
    let ud = QueuePair::builder(&pd, QpType::Ud, &cq, &cq).build().unwrap();
    let access = InitAttr { access: QpAccess::REMOTE_READ, ..InitAttr::default() };
    assert!(invalid_text(ud.to_init(&access).unwrap_err(), "ibv_modify_qp").contains("UD QPs take no remote access"));
    assert!(invalid_text(ud.connect(&InitAttr::default(), &info).unwrap_err(), "ibv_modify_qp").contains("ready_ud"));
    ud.to_init(&InitAttr::default()).unwrap();
    let rtr = RtrAttr::new(path_to(&ctx, &info), info.qpn, 0);
    assert!(invalid_text(ud.to_rtr(&rtr).unwrap_err(), "ibv_modify_qp").contains("to_rtr_ud"));
    assert_eq!(ud.query().unwrap().qkey, DEFAULT_QKEY);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn too_many_wrs_or_sges_are_refused_before_c_and_the_pd_and_cqs_still_work() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let dev = ctx.query_device().unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    // Room for the deepest QP below (1024 + 128), which building it checks.
    let cq = CompletionQueue::new(&ctx, 2048).unwrap();
    let builder = || QueuePair::builder(&pd, QpType::Rc, &cq, &cq);

    let cases = [
        (builder().max_send_wr(dev.max_qp_wr + 1).build(), format!("max_send_wr {}", dev.max_qp_wr + 1), "max_qp_wr"),
        (builder().max_recv_wr(dev.max_qp_wr + 1).build(), format!("max_recv_wr {}", dev.max_qp_wr + 1), "max_qp_wr"),
        (builder().max_send_sge(dev.max_sge + 1).build(), format!("max_send_sge {}", dev.max_sge + 1), "max_sge"),
        (builder().max_recv_sge(dev.max_sge + 1).build(), format!("max_recv_sge {}", dev.max_sge + 1), "max_sge"),
    ];
    for (result, asked, limit) in cases {
        let text = invalid_text(result.unwrap_err(), "QueuePairBuilder::build");
        assert!(text.contains(&asked) && text.contains(limit), "{text}");
    }
    // A depth the device's max_qp_wr allows but no CQ of the device can hold (on rxe,
    // 32,767 < 1,048,576) is refused naming max_cqe, not left to fail at claim time.
    if dev.max_qp_wr > dev.max_cqe {
        let deep = dev.max_cqe + 1;
        for result in [builder().max_send_wr(deep).build(), builder().max_recv_wr(deep).build()] {
            let text = invalid_text(result.unwrap_err(), "QueuePairBuilder::build");
            assert!(text.contains(&format!("max_cqe {}", dev.max_cqe)), "{text}");
            assert!(text.contains("no CQ of this device holds"), "{text}");
        }
    } else {
        // rxe's limits are the case above: on the test bed this branch never runs.
        assert!(!ctx.name().starts_with("rxe"), "rxe's max_qp_wr is above its max_cqe");
    }
    // With an SRQ, receive sizes make no sense.
    let srq = SharedReceiveQueue::new(&pd, 16, 1).unwrap();
    let text = invalid_text(builder().srq(&srq).max_recv_wr(16).build().unwrap_err(), "QueuePairBuilder::build");
    assert!(text.contains("with an SRQ"), "{text}");
    // Extended operations the transport cannot post.
    let ud = QueuePair::builder(&pd, QpType::Ud, &cq, &cq).extended_send_ops(SendOps::RDMA_WRITE).build();
    assert!(invalid_text(ud.unwrap_err(), "QueuePairBuilder::build").contains("UD"));

    // What only the provider knows is its to refuse, with a hint naming the likely cause.
    let err = builder().max_inline_data(1 << 20).build().unwrap_err();
    assert_eq!(err.errno(), Some(libc::EINVAL), "{err}");
    assert!(err.to_string().contains("max_inline_data"), "{err}");
    eprintln!("{err}");

    // Nothing was disturbed: the same PD and CQ make a working QP.
    let qp = builder().max_send_wr(dev.max_qp_wr.min(1024)).max_send_sge(dev.max_sge).build().unwrap();
    qp.to_init(&InitAttr::default()).unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Init);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_cq_of_another_context_is_refused_before_c() {
    let _leaks = LeakCheck::new();
    let (ctx1, ctx2) = (open(), open());
    let pd = ProtectionDomain::new(&ctx1).unwrap();
    let (cq1, cq2) = (CompletionQueue::new(&ctx1, 8).unwrap(), CompletionQueue::new(&ctx2, 8).unwrap());
    let err = QueuePair::builder(&pd, QpType::Rc, &cq1, &cq2).max_send_wr(4).max_recv_wr(4).build().unwrap_err();
    assert!(invalid_text(err, "QueuePairBuilder::build").contains("cannot span contexts"));
    QueuePair::builder(&pd, QpType::Rc, &cq1, &cq1).max_send_wr(4).max_recv_wr(4).build().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn an_errored_rc_pair_recovers_through_reset_and_passes_a_send_again() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (cq_a, cq_b) = (CompletionQueue::new(&ctx, 256).unwrap(), CompletionQueue::new(&ctx, 256).unwrap());
    let a = QueuePair::builder(&pd, QpType::Rc, &cq_a, &cq_a).build().unwrap();
    let b = QueuePair::builder(&pd, QpType::Rc, &cq_b, &cq_b).build().unwrap();
    connect_pair(&a, &b);
    pass_send(&pd, &a, &cq_a, &b, &cq_b, None, 128, 5);

    // ERR: a receive posted before comes back flushed.
    let buf = Buf::new(&pd, 64);
    post_recv(&a, 77, buf.sge(0, 64));
    a.to_error().unwrap();
    assert_eq!(a.state().unwrap(), QpState::Err);
    let wc = poll_one(&cq_a);
    assert_eq!((wc.wr_id, wc.status.0), (77, ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR.0));
    let text = invalid_text(a.to_rts(&RtsAttr::default()).unwrap_err(), "ibv_modify_qp");
    assert!(text.contains("is in ERR"), "{text}");

    // ERR -> RESET -> INIT -> RTR -> RTS on both sides (each keeps the PSN it was built with).
    for qp in [&a, &b] {
        qp.reset().unwrap();
        assert_eq!(qp.state().unwrap(), QpState::Reset);
    }
    connect_pair(&a, &b);
    assert_eq!((a.state().unwrap(), b.state().unwrap()), (QpState::Rts, QpState::Rts));
    pass_send(&pd, &a, &cq_a, &b, &cq_b, None, 256, 6);
    pass_send(&pd, &b, &cq_b, &a, &cq_a, None, 256, 7);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn qp_srq_and_ah_outlive_their_dropped_parent_handles() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 256).unwrap();
    let srq = SharedReceiveQueue::new(&pd, 16, 1).unwrap();
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).srq(&srq).build().unwrap();
    let gid = ctx.default_gid(1).map(|e| e.gid).unwrap_or(Gid([0xfe; 16]));
    let ah =
        AddressHandle::new(&pd, &AhAttr::new(1, path_to(&ctx, &RemoteQpInfo { qpn: 2, psn: 0, lid: 1, gid }))).unwrap();
    let srq2 = SharedReceiveQueue::new(&pd, 8, 1).unwrap();

    // Every parent handle goes first.
    drop((ctx, pd, cq, srq));
    assert!(qp.has_srq());
    qp.to_init(&InitAttr::default()).unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Init);
    assert_eq!(qp.context().name(), crate::device_name());
    assert_eq!(ah.attr().port, 1);
    assert_eq!(srq2.query().unwrap().srq_limit, 0);
    // Then the children, in any order; the leak check proves the parents went with them.
    drop(ah);
    drop(qp);
    drop(srq2);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn children_dropped_before_their_parents_free_everything() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (scq, rcq) = (CompletionQueue::new(&ctx, 256).unwrap(), CompletionQueue::new(&ctx, 256).unwrap());
    let srq = SharedReceiveQueue::new(&pd, 16, 1).unwrap();
    let qp = QueuePair::builder(&pd, QpType::Ud, &scq, &rcq).srq(&srq).build().unwrap();
    qp.ready_ud(&InitAttr::default()).unwrap();
    drop(qp);
    srq.destroy().unwrap();
    scq.destroy().unwrap();
    rcq.destroy().unwrap();
    pd.destroy().unwrap();
    ctx.destroy().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn destroying_a_pd_cq_or_srq_that_a_live_qp_uses_reports_ebusy() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 256).unwrap();
    let srq = SharedReceiveQueue::new(&pd, 16, 1).unwrap();
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).srq(&srq).build().unwrap();

    for err in [pd.clone().destroy().unwrap_err(), cq.destroy().unwrap_err(), srq.destroy().unwrap_err()] {
        assert_eq!(err.errno(), Some(libc::EBUSY), "{err}");
    }
    // The QP still works; its handles were the last ones and go with it.
    qp.to_init(&InitAttr::default()).unwrap();
    qp.destroy().unwrap();
    pd.destroy().unwrap();
    ctx.destroy().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn srq_is_checked_against_the_limits_armed_queried_and_feeds_an_rc_qp() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let dev = ctx.query_device().unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();

    let err = SharedReceiveQueue::new(&pd, dev.max_srq_wr + 1, 1).unwrap_err();
    let text = invalid_text(err, "SharedReceiveQueue::new");
    assert!(text.contains(&format!("max_wr {} exceeds the device's max_srq_wr", dev.max_srq_wr + 1)), "{text}");
    let max_srq_sge = dev.raw.max_srq_sge as u32;
    let text = invalid_text(SharedReceiveQueue::new(&pd, 8, max_srq_sge + 1).unwrap_err(), "SharedReceiveQueue::new");
    assert!(text.contains("max_srq_sge"), "{text}");
    invalid_text(SharedReceiveQueue::new(&pd, 0, 1).unwrap_err(), "SharedReceiveQueue::new");

    let srq = SharedReceiveQueue::new(&pd, 64, 2).unwrap();
    let caps = srq.caps();
    assert!(caps.max_wr >= 64 && caps.max_sge >= 2, "{caps:?}");
    assert_eq!(srq.query().unwrap().srq_limit, 0);
    srq.arm(8).unwrap();
    let now = srq.query().unwrap();
    assert_eq!(now.srq_limit, 8, "{now:?}");
    assert!(now.max_wr >= 64, "{now:?}");
    invalid_text(srq.arm(caps.max_wr + 1).unwrap_err(), "SharedReceiveQueue::arm");

    // Receives posted to the SRQ serve a QP built on it.
    let (cq_a, cq_b) = (CompletionQueue::new(&ctx, 256).unwrap(), CompletionQueue::new(&ctx, 256).unwrap());
    let a = QueuePair::builder(&pd, QpType::Rc, &cq_a, &cq_a).build().unwrap();
    let b = QueuePair::builder(&pd, QpType::Rc, &cq_b, &cq_b).srq(&srq).build().unwrap();
    assert_eq!(b.caps().max_recv_wr, 0);
    connect_pair(&a, &b);
    pass_send(&pd, &a, &cq_a, &b, &cq_b, Some(&srq), 100, 8);
    b.destroy().unwrap();
    srq.destroy().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn address_handle_is_checked_against_the_port_created_and_destroyed() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let port = ctx.query_port(1).unwrap();
    let me = RemoteQpInfo { qpn: 2, psn: 0, lid: port.lid, gid: ctx.query_gid(1, gid_index()).unwrap().gid };

    let attr = AhAttr::new(1, path_to(&ctx, &me));
    let ah = AddressHandle::new(&pd, &attr).unwrap();
    assert_eq!(ah.attr(), &attr);
    assert!(!ah.as_raw().is_null());
    let clone = ah.clone();
    assert_eq!(ah.destroy().unwrap_err().errno(), Some(libc::EBUSY));
    clone.destroy().unwrap();

    let refused = |attr: AhAttr, what: &str| {
        let text = invalid_text(AddressHandle::new(&pd, &attr).unwrap_err(), "ibv_create_ah");
        assert!(text.contains(what), "{text}");
    };
    if port.is_ethernet() {
        refused(AhAttr::new(1, Remote::lid(1)), "addressed by GID");
        refused(AhAttr::global(1, Gid::default(), gid_index()), "all zero");
        refused(AhAttr::global(1, me.gid, u32::from(u8::MAX)), "sgid_index 255");
        // GidEntry::index is a u32, and so is what AhAttr::global takes; one that does not fit
        // the C field's 8 bits is refused before C, for an address handle and at RTR alike.
        let wide = ctx.default_gid(1).unwrap().index + 256;
        refused(AhAttr::global(1, me.gid, wide), &format!("sgid_index {wide} does not fit the 8 bits"));
        let flow =
            Remote::Gid { gid: me.gid, sgid_index: gid_index(), hop_limit: 1, traffic_class: 0, flow_label: 1 << 20 };
        refused(AhAttr::new(1, flow), "20 bits");
    } else {
        refused(AhAttr::new(1, Remote::lid(0)), "LID 0");
    }
    refused(AhAttr { sl: 16, ..attr }, "service level");
    let err = AddressHandle::new(&pd, &AhAttr { port: 0, ..attr }).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn extended_send_ops_give_an_extended_qp_and_classic_qps_have_none() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 256).unwrap();
    let ops = SendOps::SEND | SendOps::SEND_WITH_IMM | SendOps::RDMA_WRITE | SendOps::RDMA_READ;
    let ext = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).extended_send_ops(ops).build().unwrap();
    let qpx = ext.as_raw_ex().expect("an extended QP");
    // SAFETY: the extended QP is live; its embedded ibv_qp is the QP itself.
    assert_eq!(unsafe { ptr::addr_of_mut!((*qpx).qp_base) }, ext.as_raw());
    assert_eq!(ext.send_ops(), ops);
    let ud = QueuePair::builder(&pd, QpType::Ud, &cq, &cq).extended_send_ops(SendOps::SEND).build().unwrap();
    assert!(ud.as_raw_ex().is_some());
    let classic = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).build().unwrap();
    assert!(classic.as_raw_ex().is_none() && classic.send_ops().is_empty());
    // Extended QPs go through the same state machine.
    ext.to_init(&InitAttr::default()).unwrap();
    assert_eq!(ext.state().unwrap(), QpState::Init);
}
