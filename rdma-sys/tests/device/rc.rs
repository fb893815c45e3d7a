//! Classic RC data path: `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and
//! `ibv_req_notify_cq` between two QPs on one device.

use std::os::raw::{c_int, c_uint, c_void};
use std::ptr::null_mut;
use std::time::Duration;

use rdma_verbs_sys::*;

use crate::common::*;

fn signaled() -> c_uint {
    ibv_send_flags::IBV_SEND_SIGNALED.0
}

/// A send work request over one SGE (the caller links lists and sets the opcode's fields).
fn send_wr(wr_id: u64, opcode: ibv_wr_opcode, sge: &mut ibv_sge) -> ibv_send_wr {
    ibv_send_wr { wr_id, sg_list: sge, num_sge: 1, opcode, send_flags: signaled(), ..Default::default() }
}

fn post_send(qp: &Qp, wr: &mut ibv_send_wr) {
    let mut bad = null_mut();
    // SAFETY: the QP is live, the list and its SGEs live through the call, and every
    // buffer is registered and outlives the operations (the caller polls them).
    let rc = unsafe { ibv_post_send(qp.0, wr, &mut bad) };
    check_rc(rc, "ibv_post_send");
    assert!(bad.is_null(), "ibv_post_send set bad_wr on success");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn post_send_list_and_rdma_writes_deliver_exact_bytes_between_rc_qps() {
    let _leaks = LeakCheck::new();
    let dev = Device::open();
    let pd = Pd::new(&dev);
    let cq_a = Cq::new(&dev, 32, null_mut());
    let cq_b = Cq::new(&dev, 32, null_mut());
    let mut src = Mr::new(&pd, 4096, full_access());
    let dst = Mr::new(&pd, 4096, full_access());
    let a = Qp::rc(&pd, cq_a.0, cq_a.0, null_mut());
    let b = Qp::rc(&pd, cq_b.0, cq_b.0, null_mut());
    connect_pair(&dev, &a, &b);

    // Two SENDs posted as one list land in two receives, in order.
    let (m1, m2) = (pattern(100, 1), pattern(700, 2));
    src.bytes_mut()[..100].copy_from_slice(&m1);
    src.bytes_mut()[1024..1724].copy_from_slice(&m2);
    post_recv(&b, 11, dst.sge(0, 1024));
    post_recv(&b, 12, dst.sge(1024, 1024));
    let (mut sge1, mut sge2) = (src.sge(0, 100), src.sge(1024, 700));
    let mut wr2 = send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &mut sge2);
    let mut wr1 = send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &mut sge1);
    wr1.next = &mut wr2;
    post_send(&a, &mut wr1);
    let sent = poll(cq_a.0, 2);
    expect_wc(&sent[0], 1, ibv_wc_opcode::IBV_WC_SEND);
    expect_wc(&sent[1], 2, ibv_wc_opcode::IBV_WC_SEND);
    let got = poll(cq_b.0, 2);
    expect_wc(&got[0], 11, ibv_wc_opcode::IBV_WC_RECV);
    expect_wc(&got[1], 12, ibv_wc_opcode::IBV_WC_RECV);
    assert_eq!((got[0].byte_len, got[1].byte_len), (100, 700));
    assert_eq!((got[0].qp_num, got[1].qp_num), (b.num(), b.num()));
    assert_eq!(&dst.bytes()[..100], &m1[..]);
    assert_eq!(&dst.bytes()[1024..1724], &m2[..]);
    assert!(dst.bytes()[100..1024].iter().all(|&x| x == 0), "a SEND wrote past its length");

    // An RDMA WRITE places bytes at the remote address without a receive.
    let m3 = pattern(3000, 3);
    src.bytes_mut()[..3000].copy_from_slice(&m3);
    let mut sge = src.sge(0, 3000);
    let mut wr = send_wr(3, ibv_wr_opcode::IBV_WR_RDMA_WRITE, &mut sge);
    wr.wr.rdma.remote_addr = dst.addr() + 512;
    wr.wr.rdma.rkey = dst.rkey();
    post_send(&a, &mut wr);
    expect_one(cq_a.0, 3, ibv_wc_opcode::IBV_WC_RDMA_WRITE);
    assert_eq!(&dst.bytes()[512..3512], &m3[..]);
    assert_eq!(&dst.bytes()[..100], &m1[..], "bytes before the written range changed");
    assert!(dst.bytes()[3512..].iter().all(|&x| x == 0), "bytes after the written range changed");
    expect_empty(cq_b.0, Duration::from_millis(20));

    // RDMA WRITE with immediate: the data lands and the immediate consumes a receive.
    let imm = 0xdead_beef_u32.to_be();
    post_recv(&b, 13, dst.sge(0, 16));
    let mut sge = src.sge(0, 64);
    let mut wr = send_wr(4, ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM, &mut sge);
    wr.wr.rdma.remote_addr = dst.addr() + 3584;
    wr.wr.rdma.rkey = dst.rkey();
    wr.__bindgen_anon_1.imm_data = imm;
    post_send(&a, &mut wr);
    expect_one(cq_a.0, 4, ibv_wc_opcode::IBV_WC_RDMA_WRITE);
    let wc = expect_one(cq_b.0, 13, ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM);
    assert_ne!(wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0, 0, "no IBV_WC_WITH_IMM flag");
    // SAFETY: the completion carries an immediate (flag checked above).
    assert_eq!(unsafe { wc.__bindgen_anon_1.imm_data }, imm);
    assert_eq!(wc.byte_len, 64);
    assert_eq!(&dst.bytes()[3584..3648], &m3[..64]);
    eprintln!("{}: 2 SENDs, RDMA WRITE of 3000 B and WRITE_WITH_IMM checked byte for byte", dev.name);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn req_notify_cq_arms_an_event_that_the_next_completion_raises() {
    let _leaks = LeakCheck::new();
    let dev = Device::open();
    // SAFETY: the context is open.
    let channel = Channel(unsafe { ibv_create_comp_channel(dev.ctx) });
    check(!channel.0.is_null(), "ibv_create_comp_channel");
    let pd = Pd::new(&dev);
    let cq_a = Cq::new(&dev, 16, channel.0);
    let cq_b = Cq::new(&dev, 16, null_mut());
    let src = Mr::new(&pd, 256, full_access());
    let dst = Mr::new(&pd, 256, full_access());
    let a = Qp::rc(&pd, cq_a.0, cq_a.0, null_mut());
    let b = Qp::rc(&pd, cq_b.0, cq_b.0, null_mut());
    connect_pair(&dev, &a, &b);

    // Nothing armed, nothing pending: the channel has no event.
    // SAFETY: the channel is live.
    let fd = unsafe { (*channel.0).fd };
    assert!(!wait_readable(fd, 0), "event on the channel before any completion");

    // SAFETY: the CQ is live.
    let rc = unsafe { ibv_req_notify_cq(cq_a.0, 0) };
    assert_eq!(rc, 0, "ibv_req_notify_cq returned {rc}");

    let mut sge = src.sge(0, 128);
    let mut wr = send_wr(7, ibv_wr_opcode::IBV_WR_RDMA_WRITE, &mut sge);
    wr.wr.rdma.remote_addr = dst.addr();
    wr.wr.rdma.rkey = dst.rkey();
    post_send(&a, &mut wr);

    let timeout_ms = TIMEOUT.as_millis() as c_int;
    assert!(wait_readable(fd, timeout_ms), "no CQ event within {TIMEOUT:?} after ibv_req_notify_cq");
    let mut ev_cq = null_mut();
    let mut ev_ctx: *mut c_void = null_mut();
    // SAFETY: the channel is live and has an event, so this does not block.
    check_rc(unsafe { ibv_get_cq_event(channel.0, &mut ev_cq, &mut ev_ctx) }, "ibv_get_cq_event");
    assert_eq!(ev_cq, cq_a.0, "the event names another CQ");
    // SAFETY: one event was taken from this CQ and is acknowledged once.
    unsafe { ibv_ack_cq_events(cq_a.0, 1) };
    expect_one(cq_a.0, 7, ibv_wc_opcode::IBV_WC_RDMA_WRITE);
    eprintln!("{}: ibv_req_notify_cq armed an event that the write's completion raised", dev.name);
}

/// Waits up to `timeout_ms` for `fd` to become readable.
fn wait_readable(fd: c_int, timeout_ms: c_int) -> bool {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    assert!(n >= 0, "poll failed: {}", std::io::Error::last_os_error());
    n == 1
}
