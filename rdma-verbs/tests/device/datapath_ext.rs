//! The same safe queues on QPs built with extended send ops: posts go through the
//! `ibv_wr_*` API (one `ibv_wr_start`/`ibv_wr_complete` per post or batch) where the
//! loaded rdma-core handles it, and through `ibv_post_send` where it does not.

use rdma_verbs::compat::quirks;
use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, Done, ProtectionDomain, QpAccess, SendBuf, SendOps, SendWr, WcStatus,
};

use crate::datapath::{poll_one, rc_pair_with, Side};
use crate::LeakCheck;

/// Two connected RC QPs built with every RC send op, so their queues post through the
/// `ibv_wr_*` API.
fn ext_pair<T: SendBuf>() -> (ProtectionDomain, Side<T>, Side<T>) {
    let ops = SendOps::SEND
        | SendOps::SEND_WITH_IMM
        | SendOps::RDMA_WRITE
        | SendOps::RDMA_WRITE_WITH_IMM
        | SendOps::RDMA_READ
        | SendOps::ATOMIC_CMP_AND_SWP
        | SendOps::ATOMIC_FETCH_AND_ADD;
    let access = QpAccess::REMOTE_WRITE | QpAccess::REMOTE_READ | QpAccess::REMOTE_ATOMIC;
    let (pd, a, b) =
        rc_pair_with(access, |q| q.max_send_sge(2).max_recv_sge(2).max_inline_data(64).extended_send_ops(ops));
    for side in [&a, &b] {
        assert!(side.qp.as_raw_ex().is_some() && side.sq.uses_extended_api());
    }
    (pd, a, b)
}

fn sent<T: SendBuf>(side: &mut Side<T>) -> Vec<Done<T>> {
    let mut wc = poll_one(&mut side.cq);
    let mut out = Vec::new();
    side.sq.complete(&mut wc, |d| out.push(d)).unwrap();
    out
}

fn chunks(pd: &ProtectionDomain, n: usize, len: usize) -> Vec<Chunk> {
    crate::datapath::chunks(pd, n, len, AccessFlags::LOCAL_WRITE)
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn extended_qp_sends_inline_data_with_immediate_intact() {
    let _leaks = LeakCheck::new();
    eprintln!("rdma-core quirks: {:?}", quirks());
    let (pd, mut a, mut b) = ext_pair::<Chunk>();
    let mut c = chunks(&pd, 4, 1024);
    let (mut s1, dst) = (c.remove(0), c.remove(0));
    s1[..48].copy_from_slice(&[0x5a; 48]);
    // Inline SEND with immediate (ibv_wr_send_imm + ibv_wr_set_inline_data).
    b.rq.post(dst, 0..1024, 1).unwrap();
    a.sq.post(SendWr::send(s1, 0..48).inline().imm(77)).unwrap();
    let s1 = sent(&mut a).pop().unwrap().value;
    let mut wc = poll_one(&mut b.cq);
    let got = b.rq.complete(&mut wc).unwrap();
    assert_eq!((got.status, got.byte_len, wc.imm_data()), (WcStatus::Success, 48, Some(77)));
    assert!(got.value[..48].iter().all(|&x| x == 0x5a));

    drop((s1, got));
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn extended_qp_sends_a_message_spanning_chunks_of_two_regions() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, mut b) = ext_pair::<[Chunk; 2]>();
    // An SGE list: the classic path before rdma-core 64, ibv_wr_set_sge_list after.
    let (mut x, mut y) = (chunks(&pd, 1, 1024).pop().unwrap(), chunks(&pd, 1, 1024).pop().unwrap());
    x.fill(1);
    y.fill(2);
    b.rq.post(chunks(&pd, 1, 1024).pop().unwrap(), 0..1024, 2).unwrap();
    a.sq.post(SendWr::send([x, y], 1000..1030)).unwrap();
    let back = sent(&mut a).pop().unwrap();
    assert_eq!(back.status, WcStatus::Success);
    let got = b.rq.complete(&mut poll_one(&mut b.cq)).unwrap();
    assert_eq!(got.byte_len, 30);
    assert_eq!(&got.value[..30], &[[1u8; 24].as_slice(), &[2u8; 6]].concat()[..]);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn extended_qp_writes_reads_and_atomics_in_one_batch() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, _b) = ext_pair::<Chunk>();
    let target = pd
        .register_remote_writable(
            AlignedBuf::new(4096).unwrap(),
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    let remote = target.remote().unwrap();
    let mut c = chunks(&pd, 3, 512);
    let (mut src, rd, atom) = (c.remove(0), c.remove(0), c.remove(0));
    src.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
    // WRITE, then (fenced) READ of the same bytes, then FETCH_ADD: one ibv_wr batch.
    let wrs = [
        SendWr::write(src, 0..512, remote).signaled(false),
        SendWr::read(rd, 0..512, remote).fence().signaled(false),
        SendWr::fetch_add(atom, 0, remote.slice(1024..).unwrap(), 3).fence(),
    ];
    assert_eq!(a.sq.post_batch(wrs).unwrap(), 3);
    let done = sent(&mut a);
    assert_eq!(done.len(), 3);
    assert!(done.iter().all(|d| d.status == WcStatus::Success), "{done:?}");
    let expect: Vec<u8> = (0..512).map(|i| i as u8).collect();
    assert_eq!(&done[1].value[..], &expect[..], "READ returned what WRITE put there");
    assert_eq!(u64::from_ne_bytes(done[2].value[..8].try_into().unwrap()), 0);
    assert_eq!(target.atomic_u64(1024).unwrap().load(std::sync::atomic::Ordering::SeqCst), 3);
}
