//! The `ibv_wr_*` work request API on QPs made with `ibv_create_qp_ex`, whose
//! completions go to CQs made with `ibv_create_cq_ex` and are polled through
//! `ibv_poll_cq(ibv_cq_ex_to_cq(..))` (rxe's extended polling is buggy in rdma-core 44).

use std::os::raw::{c_uint, c_void};
use std::time::Duration;

use rdma_verbs_sys::*;

use crate::common::*;

fn ops(flags: &[ibv_qp_create_send_ops_flags]) -> u64 {
    flags.iter().fold(0, |acc, f| acc | u64::from(f.0))
}

fn signaled() -> c_uint {
    ibv_send_flags::IBV_SEND_SIGNALED.0
}

/// The extended view of `qp`, through the exported `ibv_qp_to_qp_ex`.
fn qp_ex(qp: &Qp) -> *mut ibv_qp_ex {
    // SAFETY: the QP is live and was created with send ops.
    let qpx = unsafe { ibv_qp_to_qp_ex(qp.0) };
    check(!qpx.is_null(), "ibv_qp_to_qp_ex");
    // SAFETY: `qpx` is the live QP's extended view.
    assert_eq!(unsafe { (*qpx).qp_base.qp_num }, qp.num());
    qpx
}

/// Sets the id and flags of the next work request of the open batch.
///
/// # Safety
///
/// `qpx` must be live with an open batch.
unsafe fn next_wr(qpx: *mut ibv_qp_ex, wr_id: u64) {
    // SAFETY: the caller's contract.
    unsafe {
        (*qpx).wr_id = wr_id;
        (*qpx).wr_flags = signaled();
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn wr_api_writes_sends_inline_batches_reads_and_aborts() {
    let _leaks = LeakCheck::new();
    use ibv_qp_create_send_ops_flags as f;
    let dev = Device::open();
    let pd = Pd::new(&dev);
    let byte_len = ibv_create_cq_wc_flags::IBV_WC_EX_WITH_BYTE_LEN.0 as u64;
    let cq_a = CqEx::new(&dev, 32, byte_len);
    let cq_b = CqEx::new(&dev, 32, byte_len);
    let mut local = Mr::new(&pd, 4096, full_access());
    let mut remote = Mr::new(&pd, 4096, full_access());
    let send_ops = ops(&[
        f::IBV_QP_EX_WITH_RDMA_WRITE,
        f::IBV_QP_EX_WITH_SEND,
        f::IBV_QP_EX_WITH_SEND_WITH_IMM,
        f::IBV_QP_EX_WITH_RDMA_READ,
    ]);
    let a = Qp::rc_ex(&dev, &pd, cq_a.cq(), cq_a.cq(), send_ops);
    let b = Qp::rc_ex(&dev, &pd, cq_b.cq(), cq_b.cq(), send_ops);
    connect_pair(&dev, &a, &b);
    let qpx = qp_ex(&a);

    // RDMA WRITE of 2000 bytes to an offset in the remote buffer.
    let m1 = pattern(2000, 5);
    local.bytes_mut()[..2000].copy_from_slice(&m1);
    // SAFETY: `qpx` is live; the batch is started, filled and completed on this thread;
    // both buffers are registered and outlive the operation (polled below).
    let rc = unsafe {
        ibv_wr_start(qpx);
        next_wr(qpx, 21);
        ibv_wr_rdma_write(qpx, remote.rkey(), remote.addr() + 100);
        ibv_wr_set_sge(qpx, local.lkey(), local.addr(), 2000);
        ibv_wr_complete(qpx)
    };
    check_rc(rc, "ibv_wr_complete (RDMA WRITE)");
    expect_one(cq_a.cq(), 21, ibv_wc_opcode::IBV_WC_RDMA_WRITE);
    assert_eq!(&remote.bytes()[100..2100], &m1[..]);
    assert!(remote.bytes()[..100].iter().all(|&x| x == 0), "bytes before the write changed");

    // SEND of inline data taken from unregistered memory.
    let msg = *b"inline bytes copied by ibv_wr_set_inline_data";
    post_recv(&b, 31, remote.sge(2048, 256));
    // SAFETY: as above; inline data is copied during the call, so `msg` need not be
    // registered. rxe (rdma-core 44) sends the copied bytes only when the work request
    // also carries IBV_SEND_INLINE (other providers ignore the flag here).
    let rc = unsafe {
        ibv_wr_start(qpx);
        next_wr(qpx, 22);
        (*qpx).wr_flags |= ibv_send_flags::IBV_SEND_INLINE.0;
        ibv_wr_send(qpx);
        ibv_wr_set_inline_data(qpx, msg.as_ptr() as *mut c_void, msg.len());
        ibv_wr_complete(qpx)
    };
    check_rc(rc, "ibv_wr_complete (inline SEND)");
    expect_one(cq_a.cq(), 22, ibv_wc_opcode::IBV_WC_SEND);
    let wc = expect_one(cq_b.cq(), 31, ibv_wc_opcode::IBV_WC_RECV);
    assert_eq!(wc.byte_len as usize, msg.len());
    assert_eq!(&remote.bytes()[2048..2048 + msg.len()], &msg[..]);

    // Two work requests in one batch: a SEND with immediate and an RDMA WRITE.
    let imm = 0x0102_0304_u32.to_be();
    let m2 = pattern(128, 7);
    local.bytes_mut()[..128].copy_from_slice(&m2);
    post_recv(&b, 32, remote.sge(3072, 256));
    // SAFETY: as for the first batch.
    let rc = unsafe {
        ibv_wr_start(qpx);
        next_wr(qpx, 23);
        ibv_wr_send_imm(qpx, imm);
        ibv_wr_set_sge(qpx, local.lkey(), local.addr(), 64);
        next_wr(qpx, 24);
        ibv_wr_rdma_write(qpx, remote.rkey(), remote.addr() + 3500);
        ibv_wr_set_sge(qpx, local.lkey(), local.addr() + 64, 64);
        ibv_wr_complete(qpx)
    };
    check_rc(rc, "ibv_wr_complete (batch of 2)");
    let done = poll(cq_a.cq(), 2);
    expect_wc(&done[0], 23, ibv_wc_opcode::IBV_WC_SEND);
    expect_wc(&done[1], 24, ibv_wc_opcode::IBV_WC_RDMA_WRITE);
    let wc = expect_one(cq_b.cq(), 32, ibv_wc_opcode::IBV_WC_RECV);
    assert_ne!(wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0, 0, "no IBV_WC_WITH_IMM flag");
    // SAFETY: the completion carries an immediate (flag checked above).
    assert_eq!(unsafe { wc.__bindgen_anon_1.imm_data }, imm);
    assert_eq!(wc.byte_len, 64);
    assert_eq!(&remote.bytes()[3072..3136], &m2[..64]);
    assert_eq!(&remote.bytes()[3500..3564], &m2[64..]);

    // RDMA READ of 512 remote bytes into the local buffer.
    let m3 = pattern(512, 9);
    remote.bytes_mut()[..512].copy_from_slice(&m3);
    // SAFETY: as for the first batch.
    let rc = unsafe {
        ibv_wr_start(qpx);
        next_wr(qpx, 25);
        ibv_wr_rdma_read(qpx, remote.rkey(), remote.addr());
        ibv_wr_set_sge(qpx, local.lkey(), local.addr() + 2048, 512);
        ibv_wr_complete(qpx)
    };
    check_rc(rc, "ibv_wr_complete (RDMA READ)");
    let wc = expect_one(cq_a.cq(), 25, ibv_wc_opcode::IBV_WC_RDMA_READ);
    assert_eq!(wc.byte_len, 512);
    assert_eq!(&local.bytes()[2048..2560], &m3[..]);

    // An aborted batch posts nothing: no completion, remote bytes unchanged.
    let before = remote.bytes()[..512].to_vec();
    local.bytes_mut()[..512].fill(0xee);
    // SAFETY: as for the first batch; the batch is abandoned with ibv_wr_abort.
    unsafe {
        ibv_wr_start(qpx);
        next_wr(qpx, 26);
        ibv_wr_rdma_write(qpx, remote.rkey(), remote.addr());
        ibv_wr_set_sge(qpx, local.lkey(), local.addr(), 512);
        ibv_wr_abort(qpx);
    }
    expect_empty(cq_a.cq(), Duration::from_millis(50));
    assert_eq!(&remote.bytes()[..512], &before[..], "an aborted write reached the remote buffer");

    // The QP still works after the abort.
    // SAFETY: as for the first batch.
    let rc = unsafe {
        ibv_wr_start(qpx);
        next_wr(qpx, 27);
        ibv_wr_rdma_write(qpx, remote.rkey(), remote.addr());
        ibv_wr_set_sge(qpx, local.lkey(), local.addr(), 512);
        ibv_wr_complete(qpx)
    };
    check_rc(rc, "ibv_wr_complete (after abort)");
    expect_one(cq_a.cq(), 27, ibv_wc_opcode::IBV_WC_RDMA_WRITE);
    assert!(remote.bytes()[..512].iter().all(|&x| x == 0xee));
    eprintln!("{}: ibv_wr_* write, inline send, 2-WR batch with imm, read and abort checked", dev.name);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn wr_api_atomics_return_the_old_value_and_update_remote_memory() {
    let _leaks = LeakCheck::new();
    use ibv_qp_create_send_ops_flags as f;
    let dev = Device::open();
    let pd = Pd::new(&dev);
    let cq_a = CqEx::new(&dev, 16, 0);
    let cq_b = CqEx::new(&dev, 16, 0);
    let local = Mr::new(&pd, 64, full_access());
    let mut remote = Mr::new(&pd, 64, full_access());
    let send_ops = ops(&[f::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, f::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP]);
    let a = Qp::rc_ex(&dev, &pd, cq_a.cq(), cq_a.cq(), send_ops);
    let b = Qp::rc_ex(&dev, &pd, cq_b.cq(), cq_b.cq(), send_ops);
    connect_pair(&dev, &a, &b);
    let qpx = qp_ex(&a);
    remote.set_word(0, 100);

    // Fetch-and-add 5: the old value comes back, the remote word grows.
    // SAFETY: `qpx` is live; the batch runs on this thread; the 8-byte aligned buffers
    // are registered and outlive the operation (polled below).
    let rc = unsafe {
        ibv_wr_start(qpx);
        next_wr(qpx, 41);
        ibv_wr_atomic_fetch_add(qpx, remote.rkey(), remote.addr(), 5);
        ibv_wr_set_sge(qpx, local.lkey(), local.addr(), 8);
        ibv_wr_complete(qpx)
    };
    check_rc(rc, "ibv_wr_complete (fetch-and-add)");
    expect_one(cq_a.cq(), 41, ibv_wc_opcode::IBV_WC_FETCH_ADD);
    assert_eq!((local.word(0), remote.word(0)), (100, 105));

    // Compare-and-swap that matches: old value back, swap stored.
    // SAFETY: as above.
    let rc = unsafe {
        ibv_wr_start(qpx);
        next_wr(qpx, 42);
        ibv_wr_atomic_cmp_swp(qpx, remote.rkey(), remote.addr(), 105, 7);
        ibv_wr_set_sge(qpx, local.lkey(), local.addr() + 8, 8);
        ibv_wr_complete(qpx)
    };
    check_rc(rc, "ibv_wr_complete (compare-and-swap)");
    expect_one(cq_a.cq(), 42, ibv_wc_opcode::IBV_WC_COMP_SWAP);
    assert_eq!((local.word(1), remote.word(0)), (105, 7));

    // Compare-and-swap that does not match: old value back, remote untouched.
    // SAFETY: as above.
    let rc = unsafe {
        ibv_wr_start(qpx);
        next_wr(qpx, 43);
        ibv_wr_atomic_cmp_swp(qpx, remote.rkey(), remote.addr(), 1, 9);
        ibv_wr_set_sge(qpx, local.lkey(), local.addr() + 16, 8);
        ibv_wr_complete(qpx)
    };
    check_rc(rc, "ibv_wr_complete (failing compare-and-swap)");
    expect_one(cq_a.cq(), 43, ibv_wc_opcode::IBV_WC_COMP_SWAP);
    assert_eq!((local.word(2), remote.word(0)), (7, 7));
    eprintln!("{}: fetch-and-add and two compare-and-swaps returned 100, 105, 7", dev.name);
}
