//! Memory windows: `ibv_alloc_mw`, `ibv_bind_mw` (with its argument checks) and
//! `ibv_dealloc_mw`.

use std::ptr::null_mut;

use rdma_verbs_sys::*;

use crate::common::*;

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn bind_mw_gives_a_type1_window_a_new_rkey_that_admits_remote_writes() {
    let _leaks = LeakCheck::new();
    let dev = Device::open();
    let pd = Pd::new(&dev);
    let cq_a = Cq::new(&dev, 16, null_mut());
    let cq_b = Cq::new(&dev, 16, null_mut());
    let mut src = Mr::new(&pd, 1024, full_access());
    let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE | ibv_access_flags::IBV_ACCESS_MW_BIND;
    let target = Mr::new(&pd, 4096, access.0 as i32);
    let a = Qp::rc(&pd, cq_a.0, cq_a.0, null_mut());
    let b = Qp::rc(&pd, cq_b.0, cq_b.0, null_mut());
    connect_pair(&dev, &a, &b);

    // SAFETY: the PD is live.
    let mw = Mw(unsafe { ibv_alloc_mw(pd.0, ibv_mw_type::IBV_MW_TYPE_1) });
    check(!mw.0.is_null(), "ibv_alloc_mw(type 1)");
    // SAFETY: the window is live.
    let (mw_type, mw_pd, old_rkey) = unsafe { ((*mw.0).type_, (*mw.0).pd, (*mw.0).rkey) };
    assert_eq!((mw_type.0, mw_pd), (ibv_mw_type::IBV_MW_TYPE_1.0, pd.0));

    // The port refuses a range without an MR before the provider sees the bind.
    let mut bad_bind = ibv_mw_bind::default();
    bad_bind.bind_info.addr = target.addr();
    bad_bind.bind_info.length = 64;
    // SAFETY: the QP and window are live, `bad_bind` readable; no MR is named.
    assert_eq!(unsafe { ibv_bind_mw(b.0, mw.0, &mut bad_bind) }, libc::EINVAL);

    // Bind [1024, 2048) of the target for remote writes, on the owner's QP.
    let window = target.addr() + 1024;
    let mut bind = ibv_mw_bind {
        wr_id: 71,
        send_flags: ibv_send_flags::IBV_SEND_SIGNALED.0,
        bind_info: ibv_mw_bind_info {
            mr: target.mr,
            addr: window,
            length: 1024,
            mw_access_flags: ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0,
        },
    };
    // SAFETY: the QP, window and MR are live and on one PD; `bind` is readable.
    check_rc(unsafe { ibv_bind_mw(b.0, mw.0, &mut bind) }, "ibv_bind_mw");
    expect_one(cq_b.0, 71, ibv_wc_opcode::IBV_WC_BIND_MW);
    // SAFETY: the window is live.
    let rkey = unsafe { (*mw.0).rkey };
    // The provider's compiled C inline and our port compute the same next key.
    assert_eq!(rkey, ibv_inc_rkey(old_rkey), "the bind did not give the window the next rkey");

    // The peer writes inside the window with the window's rkey.
    let msg = pattern(200, 31);
    src.bytes_mut()[..200].copy_from_slice(&msg);
    let write = |wr_id: u64, remote_addr: u64, rkey: u32| {
        let mut sge = src.sge(0, 200);
        let mut wr = ibv_send_wr {
            wr_id,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            send_flags: ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        wr.wr.rdma.remote_addr = remote_addr;
        wr.wr.rdma.rkey = rkey;
        let mut bad = null_mut();
        // SAFETY: the QP is live, `wr` and `sge` live through the call, the source is
        // registered and outlives the write (polled by the caller).
        check_rc(unsafe { ibv_post_send(a.0, &mut wr, &mut bad) }, "ibv_post_send");
        poll(cq_a.0, 1)[0]
    };
    let wc = write(72, window + 100, rkey);
    expect_wc(&wc, 72, ibv_wc_opcode::IBV_WC_RDMA_WRITE);
    assert_eq!(&target.bytes()[1124..1324], &msg[..]);

    // The key the window had before the bind no longer opens it: the responder refuses
    // the write and the bytes stay as they were. (rxe on Linux 6.1 checks a type 1
    // window's rkey but lets writes through anywhere in the underlying MR, so this
    // test does not probe the window's bounds.)
    let wc = write(73, window + 400, old_rkey);
    assert_eq!(wc.wr_id, 73);
    assert_eq!(wc.status.0, ibv_wc_status::IBV_WC_REM_ACCESS_ERR.0, "status of a write with the window's stale rkey");
    assert!(target.bytes()[1324..].iter().all(|&x| x == 0), "a refused write changed bytes");
    eprintln!("{}: type 1 window bound, rkey {old_rkey:#x} -> {rkey:#x}; stale key refused", dev.name);
}
