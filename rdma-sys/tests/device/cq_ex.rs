//! Extended CQ polling (`ibv_start_poll`, `ibv_end_poll`, the `ibv_wc_read_*`
//! readers), kept to one completion per batch: rdma-core 44's rxe provider has known
//! bugs past the first one (fixed in v55/v59). Its `ibv_next_poll` reports a second
//! completion where there is none, so this test does not call it.

use std::ptr::null_mut;
use std::time::Instant;

use rdma_verbs_sys::*;

use crate::common::*;

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn start_poll_reads_one_receive_and_reports_enoent_when_empty() {
    let _leaks = LeakCheck::new();
    use ibv_create_cq_wc_flags as w;
    let dev = Device::open();
    let pd = Pd::new(&dev);
    let cq_a = Cq::new(&dev, 16, null_mut());
    let wc_flags = w::IBV_WC_EX_WITH_BYTE_LEN
        | w::IBV_WC_EX_WITH_IMM
        | w::IBV_WC_EX_WITH_QP_NUM
        | w::IBV_WC_EX_WITH_SRC_QP
        | w::IBV_WC_EX_WITH_SLID
        | w::IBV_WC_EX_WITH_SL
        | w::IBV_WC_EX_WITH_DLID_PATH_BITS;
    let cq_b = CqEx::new(&dev, 16, u64::from(wc_flags.0));
    let mut src = Mr::new(&pd, 256, full_access());
    let dst = Mr::new(&pd, 256, full_access());
    let a = Qp::rc(&pd, cq_a.0, cq_a.0, null_mut());
    let b = Qp::rc(&pd, cq_b.cq(), cq_b.cq(), null_mut());
    connect_pair(&dev, &a, &b);

    let mut attr = ibv_poll_cq_attr::default();
    // SAFETY: the extended CQ is live, no batch is open, `attr` is readable.
    let rc = unsafe { ibv_start_poll(cq_b.0, &mut attr) };
    assert_eq!(rc, libc::ENOENT, "ibv_start_poll on an empty CQ");

    // One SEND with immediate, 77 bytes.
    let msg = pattern(77, 4);
    src.bytes_mut()[..77].copy_from_slice(&msg);
    post_recv(&b, 51, dst.sge(0, 256));
    let imm = 0xcafe_f00d_u32.to_be();
    let mut sge = src.sge(0, 77);
    let mut wr = ibv_send_wr {
        wr_id: 52,
        sg_list: &mut sge,
        num_sge: 1,
        opcode: ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
        send_flags: ibv_send_flags::IBV_SEND_SIGNALED.0,
        ..Default::default()
    };
    wr.__bindgen_anon_1.imm_data = imm;
    let mut bad = null_mut();
    // SAFETY: the QP is live, `wr` and `sge` live through the call, and the buffer is
    // registered and outlives the send (polled below).
    check_rc(unsafe { ibv_post_send(a.0, &mut wr, &mut bad) }, "ibv_post_send");
    expect_one(cq_a.0, 52, ibv_wc_opcode::IBV_WC_SEND);

    let start = Instant::now();
    let rc = loop {
        // SAFETY: as above; after 0 a batch is open and closed below.
        let rc = unsafe { ibv_start_poll(cq_b.0, &mut attr) };
        if rc != libc::ENOENT || start.elapsed() > TIMEOUT {
            break rc;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    };
    assert_eq!(rc, 0, "ibv_start_poll did not return the receive within {TIMEOUT:?}");
    // SAFETY: a batch is open with a current completion, and the CQ was created with the
    // wc_flags for every reader used here; the batch is closed right after.
    let wc = unsafe {
        let wc = ReadWc {
            status: (*cq_b.0).status,
            wr_id: (*cq_b.0).wr_id,
            opcode: ibv_wc_read_opcode(cq_b.0),
            vendor_err: ibv_wc_read_vendor_err(cq_b.0),
            byte_len: ibv_wc_read_byte_len(cq_b.0),
            imm_data: ibv_wc_read_imm_data(cq_b.0),
            qp_num: ibv_wc_read_qp_num(cq_b.0),
            src_qp: ibv_wc_read_src_qp(cq_b.0),
            wc_flags: ibv_wc_read_wc_flags(cq_b.0),
            slid: ibv_wc_read_slid(cq_b.0),
            sl: ibv_wc_read_sl(cq_b.0),
            dlid_path_bits: ibv_wc_read_dlid_path_bits(cq_b.0),
        };
        ibv_end_poll(cq_b.0);
        wc
    };
    assert_eq!(wc.status.0, ibv_wc_status::IBV_WC_SUCCESS.0, "status, vendor_err {:#x}", wc.vendor_err);
    assert_eq!(wc.wr_id, 51);
    assert_eq!(wc.opcode.0, ibv_wc_opcode::IBV_WC_RECV.0);
    assert_eq!(wc.vendor_err, 0);
    assert_eq!(wc.byte_len, 77);
    assert_eq!(wc.imm_data, imm);
    assert_eq!(wc.qp_num, b.num());
    let with_imm = ibv_wc_flags::IBV_WC_WITH_IMM.0;
    assert_ne!(wc.wc_flags & with_imm, 0, "wc_flags {:#x} lack IBV_WC_WITH_IMM", wc.wc_flags);
    assert_eq!(&dst.bytes()[..77], &msg[..]);

    // Drained: the next batch finds nothing.
    // SAFETY: the CQ is live and its batch was closed.
    assert_eq!(unsafe { ibv_start_poll(cq_b.0, &mut attr) }, libc::ENOENT);
    eprintln!(
        "{}: ibv_start_poll read RECV of {} B, imm {:#x}, qp {}, src_qp {}, slid {}, sl {}, \
         dlid_path_bits {}",
        dev.name,
        wc.byte_len,
        u32::from_be(wc.imm_data),
        wc.qp_num,
        wc.src_qp,
        wc.slid,
        wc.sl,
        wc.dlid_path_bits
    );
}

/// One completion as read through the extended CQ's readers.
struct ReadWc {
    status: ibv_wc_status,
    wr_id: u64,
    opcode: ibv_wc_opcode,
    vendor_err: u32,
    byte_len: u32,
    imm_data: u32,
    qp_num: u32,
    src_qp: u32,
    wc_flags: u32,
    slid: u32,
    sl: u8,
    dlid_path_bits: u8,
}
