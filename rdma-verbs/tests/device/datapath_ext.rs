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

/// A region of B's that A may write, read and update atomically.
fn remote_target(pd: &ProtectionDomain) -> rdma_verbs::MemoryRegion<AlignedBuf, rdma_verbs::RemoteWritable> {
    let access =
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    pd.register_remote_writable(AlignedBuf::new(4096).unwrap(), access).unwrap()
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn extended_qp_compare_and_swap_swaps_and_write_with_immediate_lands_with_its_immediate() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, mut b) = ext_pair::<Chunk>();
    let target = remote_target(&pd);
    let remote = target.remote().unwrap();
    let word = target.atomic_u64(2048).unwrap();
    word.store(5, std::sync::atomic::Ordering::SeqCst);
    // ibv_wr_atomic_cmp_swp: 5 -> 42, the old value comes back.
    let atom = chunks(&pd, 1, 64).remove(0);
    a.sq.post(SendWr::compare_swap(atom, 0, remote.slice(2048..).unwrap(), 5, 42)).unwrap();
    let d = sent(&mut a).pop().unwrap();
    assert_eq!(d.status, WcStatus::Success, "{d:?}");
    assert_eq!(u64::from_ne_bytes(d.value[..8].try_into().unwrap()), 5, "the old value");
    assert_eq!(word.load(std::sync::atomic::Ordering::SeqCst), 42, "swapped");
    // A compare that does not match leaves the word.
    let atom = chunks(&pd, 1, 64).remove(0);
    a.sq.post(SendWr::compare_swap(atom, 0, remote.slice(2048..).unwrap(), 5, 7)).unwrap();
    let d = sent(&mut a).pop().unwrap();
    assert_eq!(u64::from_ne_bytes(d.value[..8].try_into().unwrap()), 42);
    assert_eq!(word.load(std::sync::atomic::Ordering::SeqCst), 42, "no swap on a mismatch");

    // ibv_wr_rdma_write_imm: the bytes land, and B's receive completes with the immediate.
    b.rq.post(chunks(&pd, 1, 64).remove(0), 0..64, 9).unwrap();
    let mut src = chunks(&pd, 1, 256).remove(0);
    src.iter_mut().enumerate().for_each(|(i, x)| *x = (i as u8).wrapping_mul(3));
    a.sq.post(SendWr::write(src, 0..256, remote).imm(0xabcd)).unwrap();
    assert_eq!(sent(&mut a).pop().unwrap().status, WcStatus::Success);
    let mut wc = poll_one(&mut b.cq);
    assert_eq!(wc.opcode(), rdma_verbs::WcOpcode::RecvRdmaWithImm);
    assert_eq!(wc.imm_data(), Some(0xabcd));
    let got = b.rq.complete(&mut wc).unwrap();
    assert_eq!(got.id, 9);
    let mut landed = [0u8; 256];
    target.read_at(0, &mut landed).unwrap();
    assert!(landed.iter().enumerate().all(|(i, &x)| x == (i as u8).wrapping_mul(3)), "the written bytes");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn extended_qp_zero_length_write_read_and_send_complete_and_change_nothing() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, mut b) = ext_pair::<Chunk>();
    let mut target = remote_target(&pd);
    let remote = target.remote().unwrap();
    target.write_at(0, &[0x77; 64]).unwrap();
    let mut c = chunks(&pd, 3, 64);
    c[1].fill(0x11);
    let (w, r, s) = (c.remove(0), c.remove(0), c.remove(0));
    // An empty SGE list through ibv_wr_set_sge_list.
    a.sq.post_batch([SendWr::write(w, 0..0, remote), SendWr::read(r, 0..0, remote)]).unwrap();
    let mut done = Vec::new();
    while done.len() < 2 {
        done.extend(sent(&mut a));
    }
    assert!(done.iter().all(|d| d.status == WcStatus::Success && d.byte_len == 0), "{done:?}");
    assert!(done[1].value.iter().all(|&x| x == 0x11), "a zero-length READ writes nothing");
    let mut now = [0u8; 64];
    target.read_at(0, &mut now).unwrap();
    assert_eq!(now, [0x77; 64], "a zero-length WRITE writes nothing");
    // A zero-length SEND consumes a receive of 0 bytes.
    b.rq.post(chunks(&pd, 1, 64).remove(0), 0..64, 4).unwrap();
    a.sq.post(SendWr::send(s, 0..0)).unwrap();
    assert_eq!(sent(&mut a).pop().unwrap().status, WcStatus::Success);
    let got = b.rq.complete(&mut poll_one(&mut b.cq)).unwrap();
    assert_eq!((got.status, got.byte_len, got.id), (WcStatus::Success, 0, 4));
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn an_extended_ud_qp_sends_datagrams_with_and_without_immediate_and_of_zero_size() {
    use rdma_verbs::{AddressHandle, AhAttr, CompletionQueue, InitAttr, QpType, QueuePair, GRH_LEN};
    let _leaks = LeakCheck::new();
    let ctx = crate::open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    const QKEY: u32 = 0x0bad_cafe;
    let ud = |cq: &CompletionQueue| {
        let qp = QueuePair::builder(&pd, QpType::Ud, cq, cq)
            .max_send_wr(8)
            .max_recv_wr(8)
            .extended_send_ops(SendOps::SEND | SendOps::SEND_WITH_IMM)
            .build()
            .unwrap();
        qp.ready_ud(&InitAttr { qkey: QKEY, ..InitAttr::default() }).unwrap();
        qp
    };
    let (mut cq_a, mut cq_b) = (CompletionQueue::new(&ctx, 32).unwrap(), CompletionQueue::new(&ctx, 32).unwrap());
    let (a, b) = (ud(&cq_a), ud(&cq_b));
    let mut sq = a.send_queue::<Chunk>().unwrap();
    assert!(sq.uses_extended_api());
    let mut rq = b.recv_queue::<Chunk>().unwrap();
    for (i, c) in chunks(&pd, 3, GRH_LEN + 256).into_iter().enumerate() {
        rq.post(c, 0..GRH_LEN + 256, i as u64).unwrap();
    }
    let ah = AddressHandle::new(&pd, &AhAttr::global(1, b.local_info(1).unwrap().gid, crate::gid_index())).unwrap();
    let data: Vec<u8> = (0..200).map(|i| (i as u8) ^ 0x3c).collect();
    let cases: [(usize, Option<u32>); 3] = [(200, None), (120, Some(0x600d)), (0, None)];
    for (i, (len, imm)) in cases.into_iter().enumerate() {
        let mut src = chunks(&pd, 1, 256).remove(0);
        src[..len].copy_from_slice(&data[..len]);
        let wr = SendWr::send_ud(src, 0..len, &ah, b.qp_num(), QKEY);
        a_post(&mut sq, if let Some(imm) = imm { wr.imm(imm) } else { wr });
        let mut wc = poll_one(&mut cq_a);
        sq.complete(&mut wc, |d| assert_eq!(d.status, WcStatus::Success)).unwrap();
        let mut wc = poll_one(&mut cq_b);
        assert_eq!((wc.src_qp(), wc.imm_data()), (a.qp_num(), imm), "datagram {i}");
        let got = rq.complete(&mut wc).unwrap();
        assert_eq!((got.status, got.byte_len as usize, got.id), (WcStatus::Success, GRH_LEN + len, i as u64));
        assert_eq!(&got.value[GRH_LEN..GRH_LEN + len], &data[..len], "datagram {i}'s bytes");
    }
}

fn a_post(sq: &mut rdma_verbs::SendQueue<Chunk>, wr: SendWr<Chunk>) {
    if let Err(r) = sq.post(wr) {
        panic!("{}", r.error);
    }
}

/// A batch on the extended QP with a request the extended API does not take (an SGE list
/// before rdma-core 64): the requests before it go the extended way, it and the rest the
/// classic way, in a post of their own; on later releases the list goes the extended way
/// too. Either way every request lands, byte for byte, each comes back once in order, and
/// the queue posts again after.
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn an_extended_batch_with_a_request_the_wr_api_does_not_take_lands_every_byte_in_order() {
    let _leaks = LeakCheck::new();
    let q = quirks();
    eprintln!("rdma-core release {:?}: ibv_wr_set_sge_list of several SGEs works: {}", q.release, q.wr_sge_list);
    let (pd, mut a, _b) = ext_pair::<[Chunk; 2]>();
    let target = remote_target(&pd);
    let remote = target.remote().unwrap();
    let pair = |fill: u8| {
        let (mut x, mut y) = (chunks(&pd, 1, 1024).remove(0), chunks(&pd, 1, 1024).remove(0));
        x.iter_mut().enumerate().for_each(|(i, b)| *b = fill.wrapping_add(i as u8));
        y.iter_mut().enumerate().for_each(|(i, b)| *b = fill.wrapping_add(100).wrapping_add(i as u8));
        [x, y]
    };
    for round in 0..2u8 {
        let at = |off: u64| remote.slice(off..off + 64).unwrap();
        // One SGE, then two (the range spans both chunks), then one again.
        let ranges = [0..64, 1000..1064, 8..72];
        let pairs = [pair(round), pair(round + 10), pair(round + 20)];
        let expect: Vec<Vec<u8>> = pairs
            .iter()
            .zip(&ranges)
            .map(|(p, r)| p[0].iter().chain(p[1].iter()).copied().skip(r.start).take(r.len()).collect())
            .collect();
        let wrs: Vec<_> = pairs
            .into_iter()
            .zip(ranges)
            .zip([0, 512, 1024])
            .enumerate()
            .map(|(k, ((p, r), off))| SendWr::write(p, r, at(off)).id(k as u64))
            .collect();
        assert_eq!(a.sq.post_batch(wrs).unwrap(), 3);
        let mut done = Vec::new();
        while done.len() < 3 {
            done.extend(sent(&mut a));
        }
        assert_eq!(
            done.iter().map(|d| (d.id, d.status)).collect::<Vec<_>>(),
            [(0, WcStatus::Success), (1, WcStatus::Success), (2, WcStatus::Success)],
            "round {round}: each back once, in order"
        );
        for (off, want) in [0usize, 512, 1024].into_iter().zip(&expect) {
            let mut landed = vec![0u8; 64];
            target.read_at(off, &mut landed).unwrap();
            assert_eq!(&landed, want, "round {round}: the bytes written at {off}");
        }
    }
}

/// A request our checks refuse in the middle of a batch on the extended QP: the requests
/// before it are posted (one `ibv_wr_*` batch) and land; it and the rest come back in
/// order, and the queue's next batch lands too.
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_request_refused_inside_an_extended_batch_comes_back_with_the_rest_and_the_ones_before_land() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, _b) = ext_pair::<Chunk>();
    let target = remote_target(&pd);
    let remote = target.remote().unwrap();
    let src = |fill: u8| {
        let mut c = chunks(&pd, 1, 256).remove(0);
        c.fill(fill);
        c
    };
    let small = remote.slice(0..16).unwrap();
    let wrs = vec![
        SendWr::write(src(1), 0..64, remote.slice(0..64).unwrap()).id(1),
        SendWr::write(src(2), 0..64, remote.slice(64..128).unwrap()).id(2),
        // 64 bytes into a 16-byte remote region: refused before any C call.
        SendWr::write(src(3), 0..64, small).id(3),
        SendWr::write(src(4), 0..64, remote.slice(192..256).unwrap()).id(4),
    ];
    let refused = a.sq.post_batch(wrs).unwrap_err();
    let text = refused.error.to_string();
    assert!(text.contains("SendQueue::post_batch") && text.contains("16"), "{text}");
    let back: Vec<String> = refused.value.iter().map(|w| format!("{w:?}")).collect();
    assert_eq!(back.len(), 2, "{back:?}");
    assert!(
        back[0].contains("id: 3") && back[1].contains("id: 4"),
        "the refused request and the rest, in order: {back:?}"
    );
    let mut done = Vec::new();
    while done.len() < 2 {
        done.extend(sent(&mut a));
    }
    assert_eq!(
        done.iter().map(|d| (d.id, d.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    // The rest again, the refused one fixed: the queue posts on.
    let mut again = refused.value;
    again[0] = SendWr::write(src(3), 0..64, remote.slice(128..192).unwrap()).id(3);
    assert_eq!(a.sq.post_batch(again).unwrap(), 2);
    let mut done = Vec::new();
    while done.len() < 2 {
        done.extend(sent(&mut a));
    }
    assert!(done.iter().all(|d| d.status == WcStatus::Success), "{done:?}");
    let mut landed = [0u8; 256];
    target.read_at(0, &mut landed).unwrap();
    for (i, fill) in [1u8, 2, 3, 4].into_iter().enumerate() {
        assert!(landed[i * 64..(i + 1) * 64].iter().all(|&x| x == fill), "bytes {}..{}: {fill}", i * 64, (i + 1) * 64);
    }
}
