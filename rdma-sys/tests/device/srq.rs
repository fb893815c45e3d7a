//! Shared receive queues: `ibv_create_srq_ex` and `ibv_post_srq_recv`.

use std::ptr::null_mut;

use rdma_verbs_sys::*;

use crate::common::*;

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn post_srq_recv_feeds_the_receives_of_a_qp_attached_to_the_srq() {
    let _leaks = LeakCheck::new();
    let dev = Device::open();
    let pd = Pd::new(&dev);
    let cq_a = Cq::new(&dev, 16, null_mut());
    let cq_b = Cq::new(&dev, 16, null_mut());
    let mut src = Mr::new(&pd, 2048, full_access());
    let dst = Mr::new(&pd, 2048, full_access());

    // A basic SRQ described by PD and type: the port routes it to ibv_create_srq.
    let mask = ibv_srq_init_attr_mask::IBV_SRQ_INIT_ATTR_PD | ibv_srq_init_attr_mask::IBV_SRQ_INIT_ATTR_TYPE;
    let mut attr = ibv_srq_init_attr_ex {
        attr: ibv_srq_attr { max_wr: 16, max_sge: 1, srq_limit: 0 },
        comp_mask: mask.0,
        srq_type: ibv_srq_type::IBV_SRQT_BASIC,
        pd: pd.0,
        ..Default::default()
    };
    // SAFETY: the context and PD are live; `attr` is valid and writable.
    let srq = Srq(unsafe { ibv_create_srq_ex(dev.ctx, &mut attr) });
    check(!srq.0.is_null(), "ibv_create_srq_ex");
    assert!(attr.attr.max_wr >= 16, "the SRQ got {} entries", attr.attr.max_wr);

    let a = Qp::rc(&pd, cq_a.0, cq_a.0, null_mut());
    let b = Qp::rc(&pd, cq_b.0, cq_b.0, srq.0);
    connect_pair(&dev, &a, &b);

    // Two receives posted as one list on the SRQ.
    let (mut sge1, mut sge2) = (dst.sge(0, 512), dst.sge(1024, 512));
    let mut r2 = ibv_recv_wr { wr_id: 62, next: null_mut(), sg_list: &mut sge2, num_sge: 1 };
    let mut r1 = ibv_recv_wr { wr_id: 61, next: &mut r2, sg_list: &mut sge1, num_sge: 1 };
    let mut bad = null_mut();
    // SAFETY: the SRQ is live; the list and SGEs live through the call; the buffers are
    // registered and outlive the receives (polled below).
    check_rc(unsafe { ibv_post_srq_recv(srq.0, &mut r1, &mut bad) }, "ibv_post_srq_recv");
    assert!(bad.is_null(), "ibv_post_srq_recv set bad_recv_wr on success");

    let (m1, m2) = (pattern(300, 21), pattern(450, 22));
    src.bytes_mut()[..300].copy_from_slice(&m1);
    src.bytes_mut()[1024..1474].copy_from_slice(&m2);
    for (wr_id, offset, len) in [(63u64, 0usize, 300usize), (64, 1024, 450)] {
        let mut sge = src.sge(offset, len);
        let mut wr = ibv_send_wr {
            wr_id,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: ibv_wr_opcode::IBV_WR_SEND,
            send_flags: ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        let mut bad = null_mut();
        // SAFETY: the QP is live, `wr` and `sge` live through the call, the buffer is
        // registered and outlives the send.
        check_rc(unsafe { ibv_post_send(a.0, &mut wr, &mut bad) }, "ibv_post_send");
        expect_one(cq_a.0, wr_id, ibv_wc_opcode::IBV_WC_SEND);
    }
    let got = poll(cq_b.0, 2);
    expect_wc(&got[0], 61, ibv_wc_opcode::IBV_WC_RECV);
    expect_wc(&got[1], 62, ibv_wc_opcode::IBV_WC_RECV);
    assert_eq!((got[0].byte_len, got[1].byte_len), (300, 450));
    assert_eq!((got[0].qp_num, got[1].qp_num), (b.num(), b.num()));
    assert_eq!(&dst.bytes()[..300], &m1[..]);
    assert_eq!(&dst.bytes()[1024..1474], &m2[..]);
    eprintln!("{}: two SRQ receives posted as a list took two SENDs", dev.name);
}
