//! Completion queues: creation limits, polling, completion channels, and real completions.
//!
//! A real completion without a peer: a receive posted on an RC QP that is then moved to
//! the error state comes back flushed (`IBV_WC_WR_FLUSH_ERR`). The QP, the memory region
//! and the receive are made with raw ffi here, so these tests depend on the CQ alone.

use std::ffi::c_int;
use std::os::fd::AsRawFd;
use std::ptr;
use std::time::{Duration, Instant};

use rdma_verbs::ffi;
use rdma_verbs::{CompletionQueue, Error, ProtectionDomain, Verb, WcOpcode, WcStatus, WorkCompletion};

use crate::{open, LeakCheck};

/// Long enough for rxe under emulation to run its flush task.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn cq_is_created_sized_and_destroyed_with_and_without_a_channel() {
    let _leaks = LeakCheck::new();
    let ctx = open();

    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    assert!(cq.cqe() >= 16, "{cq:?}");
    assert!(!cq.has_channel());
    assert_eq!(cq.channel_fd(), None);
    assert_eq!(cq.comp_vector(), 0);
    cq.destroy().unwrap();

    let cq = CompletionQueue::builder(&ctx, 100).with_channel().build().unwrap();
    assert!(cq.cqe() >= 100, "{cq:?}");
    let fd = cq.as_raw_fd();
    assert_eq!(cq.channel_fd(), Some(fd));
    // SAFETY: F_GETFL on the channel's open fd.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    assert!(flags >= 0 && flags & libc::O_NONBLOCK != 0, "the channel fd must not block: flags {flags:#x}");
    cq.destroy().unwrap();

    // Dropped rather than destroyed: the leak check sees both freed.
    let with = CompletionQueue::builder(&ctx, 8).with_channel().build().unwrap();
    let without = CompletionQueue::new(&ctx, 8).unwrap();
    drop((with, without));
    ctx.destroy().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn cqe_past_max_cqe_zero_cqe_and_a_bad_comp_vector_are_rejected_and_the_context_still_works() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let max_cqe = ctx.query_device().unwrap().max_cqe;

    let err = CompletionQueue::new(&ctx, max_cqe + 1).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { verb: Verb::CqBuilderBuild, .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&format!("cqe {} exceeds the device's max_cqe {max_cqe}", max_cqe + 1)), "{text}");

    let err = CompletionQueue::new(&ctx, 0).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    assert!(err.to_string().contains("cqe 0"), "{err}");

    let vectors = CompletionQueue::num_comp_vectors(&ctx);
    assert!(vectors >= 1);
    let err = CompletionQueue::builder(&ctx, 8).comp_vector(vectors).with_channel().build().unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&format!("comp_vector {vectors}")) && text.contains(&format!("has {vectors}")), "{text}");

    // Nothing was created, and the limits themselves are accepted.
    let last = CompletionQueue::builder(&ctx, 8).comp_vector(vectors - 1).build().unwrap();
    assert_eq!(last.comp_vector(), vectors - 1);
    let biggest = CompletionQueue::new(&ctx, max_cqe).unwrap();
    assert!(biggest.cqe() >= max_cqe);
    drop((last, biggest));
    ctx.destroy().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn poll_on_an_empty_cq_returns_no_completions() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let mut cq = CompletionQueue::new(&ctx, 16).unwrap();
    let mut wcs = [WorkCompletion::EMPTY; 8];
    assert!(cq.poll(&mut wcs).unwrap().is_empty());
    assert!(cq.poll(&mut []).unwrap().is_empty());
    assert!(cq.poll_one().unwrap().is_none());
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn wait_on_an_armed_empty_cq_times_out_and_needs_a_channel() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let mut cq = CompletionQueue::builder(&ctx, 16).with_channel().build().unwrap();
    cq.arm(false).unwrap();

    let timeout = Duration::from_millis(200);
    let start = Instant::now();
    let err = cq.wait(Some(timeout)).unwrap_err();
    let waited = start.elapsed();
    assert!(matches!(err, Error::Timeout { verb: Verb::GetCqEvent, timeout: t } if t == timeout), "{err:?}");
    assert!(waited >= timeout, "returned after {waited:?}, before the timeout");
    assert!(waited < timeout + Duration::from_secs(5), "slept {waited:?}");

    assert!(matches!(cq.wait(Some(Duration::ZERO)), Err(Error::Timeout { .. })));
    assert!(!cq.try_wait().unwrap());
    assert_eq!(cq.unacked_events(), 0);

    let mut plain = CompletionQueue::new(&ctx, 16).unwrap();
    for err in [plain.arm(false).unwrap_err(), plain.wait(Some(timeout)).unwrap_err()] {
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
        assert!(err.to_string().contains("with_channel"), "{err}");
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn receives_flushed_by_the_error_state_come_back_through_poll_in_order_with_their_wr_ids() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let mut cq = CompletionQueue::new(&ctx, 16).unwrap();
    let qp = RawQp::new(&ctx, &cq);
    qp.to_init();
    for wr_id in [0xC0FF_EE01, 0xC0FF_EE02, 0xC0FF_EE03] {
        qp.post_recv(wr_id);
    }
    assert!(cq.poll_one().unwrap().is_none(), "nothing completes while the QP is in INIT");
    qp.to_error();

    // A buffer smaller than what is there: poll hands out at most its length per call.
    let mut got = Vec::new();
    let deadline = Instant::now() + FLUSH_TIMEOUT;
    while got.len() < 3 && Instant::now() < deadline {
        let mut wcs = [WorkCompletion::EMPTY; 2];
        let done = cq.poll(&mut wcs).unwrap();
        assert!(done.len() <= 2);
        got.extend(done.iter_mut().map(std::mem::take));
    }
    assert_eq!(got.len(), 3, "flushed receives seen: {got:?}");
    eprintln!("flushed receive as the provider reports it: {:?}, raw opcode {:?}", got[0], got[0].opcode());
    for (wc, wr_id) in got.iter().zip([0xC0FF_EE01, 0xC0FF_EE02, 0xC0FF_EE03]) {
        assert_eq!(wc.wr_id(), wr_id, "{got:?}");
        assert_eq!(wc.status(), WcStatus::WrFlushErr, "{wc:?}");
        assert!(!wc.status().is_success() && !wc.is_success());
        assert_eq!(wc.qp_num(), qp.num());
        let err = wc.ok().unwrap_err();
        assert!(
            matches!(err, Error::WorkCompletion { status: WcStatus::WrFlushErr, wr_id: w, .. } if w == wr_id),
            "{err:?}"
        );
        assert!(err.to_string().contains("flushed") && err.to_string().contains("data plane"), "{err}");
    }
    // rxe (kernel 6.1) leaves the opcode of a flushed receive at 0, IBV_WC_SEND; the
    // opcode of a failed completion is undefined, so accept any receive-side value too.
    let opcode = got[0].opcode();
    assert!(opcode == WcOpcode::Send || opcode.is_recv(), "opcode of a flushed receive: {opcode:?}");
    assert!(cq.poll_one().unwrap().is_none(), "each receive completes once");

    drop(qp);
    cq.destroy().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn armed_channel_wakes_on_a_flushed_receive_and_poll_then_gets_it() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let mut cq = CompletionQueue::builder(&ctx, 16).with_channel().build().unwrap();
    let qp = RawQp::new(&ctx, &cq);
    qp.to_init();
    qp.post_recv(77);

    // The no-lost-wakeup order: arm, drain, then wait.
    cq.arm(false).unwrap();
    assert!(cq.poll_one().unwrap().is_none());
    assert!(matches!(cq.wait(Some(Duration::from_millis(50))), Err(Error::Timeout { .. })));
    qp.to_error();
    cq.wait(Some(FLUSH_TIMEOUT)).unwrap();
    assert_eq!(cq.unacked_events(), 1);

    let wc = cq.poll_one().unwrap().expect("the event came for a completion that poll must see");
    assert_eq!((wc.wr_id(), wc.status(), wc.qp_num()), (77, WcStatus::WrFlushErr, qp.num()), "{wc:?}");

    // Not armed again: no second event.
    assert!(matches!(cq.wait(Some(Duration::from_millis(50))), Err(Error::Timeout { .. })));
    drop(qp);
    // destroy must acknowledge the consumed event, or ibv_destroy_cq would wait forever.
    assert_eq!(cq.unacked_events(), 1);
    cq.destroy().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn cq_dropped_with_an_unacknowledged_event_is_freed_without_hanging() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let mut cq = CompletionQueue::builder(&ctx, 16).with_channel().build().unwrap();
    let qp = RawQp::new(&ctx, &cq);
    qp.to_init();
    qp.post_recv(5);
    cq.arm(false).unwrap();
    qp.to_error();
    cq.wait(Some(FLUSH_TIMEOUT)).unwrap();
    assert_eq!(cq.unacked_events(), 1);
    drop(qp);
    // Drop (not destroy) must acknowledge it too; the leak check sees the CQ gone.
    drop(cq);

    // ack_events acknowledges at once.
    let mut cq = CompletionQueue::builder(&ctx, 16).with_channel().build().unwrap();
    let qp = RawQp::new(&ctx, &cq);
    qp.to_init();
    qp.post_recv(6);
    cq.arm(false).unwrap();
    qp.to_error();
    cq.wait(Some(FLUSH_TIMEOUT)).unwrap();
    cq.ack_events();
    assert_eq!(cq.unacked_events(), 0);
    assert_eq!(cq.poll_one().unwrap().map(|wc| wc.wr_id()), Some(6));
    drop(qp);
    cq.destroy().unwrap();
}

/// An RC QP on one CQ with a registered receive buffer, all raw ffi (the safe QP and MR
/// modules are not what is under test). Dropped before the CQ it uses.
struct RawQp {
    qp: *mut ffi::ibv_qp,
    mr: *mut ffi::ibv_mr,
    buf: Vec<u8>,
    _pd: ProtectionDomain,
}

impl RawQp {
    fn new(ctx: &rdma_verbs::Context, cq: &CompletionQueue) -> RawQp {
        let pd = ProtectionDomain::new(ctx).unwrap();
        let mut buf = vec![0u8; 4096];
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        // SAFETY: the PD is live and `buf` is valid for its length; the MR is deregistered
        // in Drop before `buf` is freed.
        let mr = unsafe { ffi::ibv_reg_mr(pd.as_raw(), buf.as_mut_ptr().cast(), buf.len(), access.0 as c_int) };
        assert!(!mr.is_null(), "ibv_reg_mr: {}", std::io::Error::last_os_error());
        let mut attr = ffi::ibv_qp_init_attr {
            send_cq: cq.as_raw(),
            recv_cq: cq.as_raw(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: 4,
                max_recv_wr: 8,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            ..Default::default()
        };
        // SAFETY: the PD and the CQ are live; `attr` is valid and writable.
        let qp = unsafe { ffi::ibv_create_qp(pd.as_raw(), &mut attr) };
        if qp.is_null() {
            let e = std::io::Error::last_os_error();
            // SAFETY: the MR was registered above and is not used.
            unsafe { ffi::ibv_dereg_mr(mr) };
            panic!("ibv_create_qp: {e}");
        }
        RawQp { qp, mr, buf, _pd: pd }
    }

    fn num(&self) -> u32 {
        // SAFETY: the QP is live.
        unsafe { (*self.qp).qp_num }
    }

    fn to_init(&self) {
        use ffi::ibv_qp_attr_mask as m;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0,
            ..Default::default()
        };
        self.modify(&mut attr, m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS);
    }

    fn to_error(&self) {
        let mut attr = ffi::ibv_qp_attr { qp_state: ffi::ibv_qp_state::IBV_QPS_ERR, ..Default::default() };
        self.modify(&mut attr, ffi::ibv_qp_attr_mask::IBV_QP_STATE);
    }

    fn modify(&self, attr: &mut ffi::ibv_qp_attr, mask: ffi::ibv_qp_attr_mask) {
        // SAFETY: the QP is live and `attr` is valid for the bits in `mask`.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp, attr, mask.0 as c_int) };
        assert_eq!(rc, 0, "ibv_modify_qp: {}", std::io::Error::from_raw_os_error(rc));
    }

    fn post_recv(&self, wr_id: u64) {
        let mut sge = ffi::ibv_sge {
            addr: self.buf.as_ptr() as u64,
            length: self.buf.len() as u32,
            // SAFETY: the MR is live.
            lkey: unsafe { (*self.mr).lkey },
        };
        let mut wr = ffi::ibv_recv_wr { wr_id, next: ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is live; the WR and its SGE are valid for the call (the provider
        // copies them), and the buffer stays registered until the QP is destroyed.
        let rc = unsafe { ffi::ibv_post_recv(self.qp, &mut wr, &mut bad) };
        assert_eq!(rc, 0, "ibv_post_recv: {}", std::io::Error::from_raw_os_error(rc));
    }
}

impl Drop for RawQp {
    fn drop(&mut self) {
        // SAFETY: both were created in `new` and are destroyed once, QP first.
        let (q, m) = unsafe { (ffi::ibv_destroy_qp(self.qp), ffi::ibv_dereg_mr(self.mr)) };
        if !std::thread::panicking() {
            assert_eq!((q, m), (0, 0), "ibv_destroy_qp / ibv_dereg_mr");
        }
    }
}
