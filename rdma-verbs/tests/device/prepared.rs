//! Prepared requests (`PreparedSendQueue`): checked and built once, posted many times; every
//! byte that arrives is compared with what the round wrote.

use rdma_verbs::Chunk;
use rdma_verbs::{
    AccessFlags, AlignedBuf, CompletionQueue, Error, MemoryRegion, ProtectionDomain, QpAccess, QueuePair, Refused,
    RemoteWritable, WcOpcode, WcStatus,
};
use rdma_verbs::{Done, PreparedSend, PreparedSendQueue, RecvQueue, SendWr};

use crate::datapath::{chunks, poll_one, rc_pair, rc_pair_with, Side};
use crate::LeakCheck;

/// A side whose send side is claimed for prepared requests.
pub struct PSide {
    cq: CompletionQueue,
    pub pq: PreparedSendQueue<Chunk>,
    _rq: RecvQueue<Chunk>,
    qp: QueuePair,
    _link: std::sync::Arc<crate::Link>,
}

/// Gives up a side's `SendQueue` (the claim passes on) and takes a `PreparedSendQueue`.
pub fn prepared_side(side: Side<Chunk>) -> PSide {
    prepared(side)
}

fn prepared(side: Side<Chunk>) -> PSide {
    let Side { cq, sq, rq, qp, link } = side;
    drop(sq);
    let pq = qp.prepared_send_queue::<Chunk>().unwrap();
    PSide { cq, pq, _rq: rq, qp, _link: link }
}

/// A region peers may write and read.
pub type Target = MemoryRegion<AlignedBuf, RemoteWritable>;

/// A zeroed region of `len` bytes that peers may write and read.
pub fn target(pd: &ProtectionDomain, len: usize) -> Target {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    pd.register_remote_writable(AlignedBuf::new(len).unwrap(), access).unwrap()
}

/// `len` bytes of `t` at `offset`.
pub fn read_back(t: &Target, offset: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    t.read_at(offset, &mut v).unwrap();
    v
}

/// Round `r`'s bytes for request `k`: differ between rounds and requests.
pub fn bytes(r: u64, k: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u64).wrapping_mul(7).wrapping_add(r * 13 + k * 101) as u8).collect()
}

#[track_caller]
fn prepare(pq: &PreparedSendQueue<Chunk>, wr: SendWr<Chunk>) -> PreparedSend<Chunk> {
    pq.prepare(wr).unwrap()
}

#[track_caller]
pub fn posted<X>(r: Result<(), Refused<X>>) {
    if let Err(Refused { error: e, .. }) = r {
        panic!("post refused: {e}");
    }
}

/// Polls until `n` prepared requests have come back, in order of completion.
fn back(s: &mut PSide, n: usize) -> Vec<Done<PreparedSend<Chunk>>> {
    let mut out = Vec::new();
    while out.len() < n {
        let mut wc = poll_one(&mut s.cq);
        s.pq.complete(&mut wc, |d| out.push(d)).unwrap();
    }
    assert_eq!(out.len(), n, "more came back than were posted");
    out
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_prepared_write_posted_100_times_lands_each_rounds_bytes_and_comes_back_each_time() {
    let _leaks = LeakCheck::new();
    let (pd, a, _b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    let mut a = prepared(a);
    let t = target(&pd, 4096);
    let src = chunks(&pd, 1, 4096, AccessFlags::LOCAL_WRITE).pop().unwrap();
    let mut p = prepare(&a.pq, SendWr::write(src, 0..3000, t.remote().unwrap().slice(96..).unwrap()).id(77));
    for r in 0..100 {
        let want = bytes(r, 0, 3000);
        p.bytes_mut()[..3000].copy_from_slice(&want);
        posted(a.pq.post(p));
        let mut done = back(&mut a, 1);
        let d = done.pop().unwrap();
        assert_eq!((d.id, d.status), (77, WcStatus::Success), "round {r}");
        assert_eq!(read_back(&t, 96, 3000), want, "round {r}: the target holds other bytes");
        p = d.value;
    }
    assert_eq!(read_back(&t, 0, 96), vec![0u8; 96], "bytes before the target range are untouched");
    assert_eq!(a.pq.outstanding(), 0);
    // Taken apart again, it is the work request it was built from.
    let wr = p.into_wr();
    assert_eq!(wr.into_buf().len(), 4096);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_batch_of_prepared_sends_arrives_in_order_round_after_round_and_unsignaled_ones_come_back_with_the_signaled() {
    let _leaks = LeakCheck::new();
    let (pd, a, b) = rc_pair::<Chunk>(QpAccess::empty());
    let (mut a, mut b) = (prepared(a), b);
    const K: usize = 8;
    const LEN: usize = 512;
    let mut ps: Vec<_> = chunks(&pd, K, LEN, AccessFlags::LOCAL_WRITE)
        .into_iter()
        .enumerate()
        .map(|(k, c)| prepare(&a.pq, SendWr::send(c, 0..LEN - k).id(k as u64)))
        .collect();
    let mut rbufs = chunks(&pd, K, LEN, AccessFlags::LOCAL_WRITE);
    for r in 0..5u64 {
        for (i, rb) in rbufs.drain(..).enumerate() {
            posted(b.rq.post(rb, 0..LEN, i as u64));
        }
        for (k, p) in ps.iter_mut().enumerate() {
            let n = p.range().len();
            p.bytes_mut()[..n].copy_from_slice(&bytes(r, k as u64, n));
            // Only the last of the batch makes a completion.
            p.set_signaled(k == K - 1);
        }
        assert_eq!(a.pq.post_batch(ps.drain(..)).unwrap(), K);
        assert_eq!(a.pq.outstanding(), K);
        let mut wc = poll_one(&mut a.cq);
        let mut came = Vec::new();
        assert_eq!(a.pq.complete(&mut wc, |d| came.push(d)).unwrap(), K, "one completion releases the batch");
        assert_eq!(came.iter().map(|d| d.id).collect::<Vec<_>>(), (0..K as u64).collect::<Vec<_>>());
        assert!(came.iter().all(|d| d.status == WcStatus::Success));
        ps.extend(came.into_iter().map(|d| d.value));
        for k in 0..K {
            let mut wc = poll_one(&mut b.cq);
            assert_eq!(wc.opcode(), WcOpcode::Recv);
            let d = b.rq.complete(&mut wc).unwrap();
            let n = LEN - k;
            assert_eq!((d.id, d.status, d.byte_len as usize), (k as u64, WcStatus::Success, n), "round {r}");
            assert_eq!(d.value[..n], bytes(r, k as u64, n), "round {r}, message {k}");
            rbufs.push(d.value);
        }
    }
    assert_eq!(a.pq.outstanding() + b.rq.outstanding(), 0);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn changing_a_prepared_requests_range_or_target_is_checked_again_and_a_refusal_changes_nothing() {
    let _leaks = LeakCheck::new();
    let (pd, a, mut b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    let mut a = prepared(a);
    let t = target(&pd, 8192);
    let mut bufs = chunks(&pd, 2, 4096, AccessFlags::LOCAL_WRITE);
    let mut send = prepare(&a.pq, SendWr::send(bufs.pop().unwrap(), 0..100));
    let mut write =
        prepare(&a.pq, SendWr::write(bufs.pop().unwrap(), 0..100, t.remote().unwrap().slice(0..100).unwrap()));

    let e = send.set_range(0..4097).unwrap_err();
    assert!(e.to_string().contains("outside a 4096-byte buffer"), "{e}");
    assert_eq!(send.range(), 0..100, "a refused range leaves the old one");
    let e = send.set_remote(t.remote().unwrap()).unwrap_err();
    assert!(e.to_string().contains("no remote side"), "{e}");
    let e = write.set_range(0..200).unwrap_err();
    assert!(e.to_string().contains("do not fit the remote region of 100 bytes"), "{e}");
    assert_eq!(write.range(), 0..100);

    // Accepted changes take effect: 1000 bytes SENT, 2000 bytes WRITTEN at offset 5000.
    send.set_range(10..1010).unwrap();
    send.bytes_mut()[10..1010].copy_from_slice(&bytes(1, 0, 1000));
    write.set_remote(t.remote().unwrap().slice(5000..).unwrap()).unwrap();
    write.set_range(0..2000).unwrap();
    write.bytes_mut()[..2000].copy_from_slice(&bytes(2, 0, 2000));
    let rb = chunks(&pd, 1, 4096, AccessFlags::LOCAL_WRITE).pop().unwrap();
    posted(b.rq.post(rb, 0..4096, 5));
    assert_eq!(a.pq.post_batch([send, write]).unwrap(), 2);
    back(&mut a, 2);
    let mut wc = poll_one(&mut b.cq);
    let d = b.rq.complete(&mut wc).unwrap();
    assert_eq!(d.byte_len, 1000);
    assert_eq!(d.value[..1000], bytes(1, 0, 1000));
    assert_eq!(read_back(&t, 5000, 2000), bytes(2, 0, 2000));
    assert_eq!(read_back(&t, 0, 100), vec![0u8; 100], "the old target is untouched");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_request_prepared_for_a_qp_with_more_inline_room_is_refused_before_c_by_another_and_comes_back_whole() {
    let _leaks = LeakCheck::new();
    let (pd, big, mut big_peer) = rc_pair_with::<Chunk>(QpAccess::empty(), |q| q.max_inline_data(256));
    let (_pd2, small, _small_peer) = rc_pair::<Chunk>(QpAccess::empty());
    let (big, mut small) = (prepared(big), prepared(small));
    let (room, small_room) = (big.qp.caps().max_inline_data, small.qp.caps().max_inline_data);
    assert!(room > small_room, "the test needs two inline sizes: {room} and {small_room}");
    let len = room as usize;
    let mut src = chunks(&pd, 1, len, AccessFlags::LOCAL_WRITE).pop().unwrap();
    src.copy_from_slice(&bytes(3, 0, len));
    let p = prepare(&big.pq, SendWr::send(src, 0..len).inline().id(4));
    let Refused { error: e, value: p } = small.pq.post(p).unwrap_err();
    assert!(e.to_string().contains("max_inline_data"), "{e}");
    assert_eq!(small.pq.outstanding(), 0);
    // Whole: it still posts where it was prepared, and its bytes arrive.
    let mut big = big;
    let rb = chunks(&pd, 1, len, AccessFlags::LOCAL_WRITE).pop().unwrap();
    posted(big_peer.rq.post(rb, 0..len, 1));
    posted(big.pq.post(p));
    assert_eq!(back(&mut big, 1)[0].id, 4);
    let mut wc = poll_one(&mut big_peer.cq);
    let d = big_peer.rq.complete(&mut wc).unwrap();
    assert_eq!(d.value[..len], bytes(3, 0, len));
    // A send queue and a prepared queue of one QP exclude each other.
    assert!(small.qp.send_queue::<Chunk>().is_err(), "the send side is already claimed");
    drop(small.pq);
    let sq = small.qp.send_queue::<Chunk>();
    assert!(sq.is_ok(), "the claim is back once the prepared queue is gone: {:?}", sq.err());
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn an_errored_qp_flushes_every_outstanding_prepared_request_once_none_as_success() {
    let _leaks = LeakCheck::new();
    let (pd, a, b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    let mut a = prepared(a);
    let t = target(&pd, 32 * 64);
    // The peer is reset: nothing it is sent is ever acknowledged.
    b.qp.reset().unwrap();
    let ps: Vec<_> = chunks(&pd, 32, 64, AccessFlags::LOCAL_WRITE)
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let mut p = prepare(
                &a.pq,
                SendWr::write(c, 0..64, t.remote().unwrap().slice(i as u64 * 64..).unwrap()).id(i as u64),
            );
            p.set_signaled(i % 8 == 7);
            p
        })
        .collect();
    // Two batches and single posts, mixed.
    let mut ps = ps.into_iter();
    assert_eq!(a.pq.post_batch(ps.by_ref().take(20)).unwrap(), 20);
    for p in ps {
        posted(a.pq.post(p));
    }
    a.qp.to_error().unwrap();
    let released = back(&mut a, 32);
    assert_eq!(released.iter().map(|d| d.id).collect::<Vec<_>>(), (0..32).collect::<Vec<_>>(), "each once, in order");
    let ok: Vec<u64> = released.iter().filter(|d| d.status == WcStatus::Success).map(|d| d.id).collect();
    assert!(ok.is_empty(), "flushed writes reported as successful: {ok:?}");
    assert_eq!(a.pq.outstanding(), 0);
    assert_eq!(read_back(&t, 0, 32 * 64), vec![0u8; 32 * 64], "target of writes that never ran");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_full_prepared_queue_refuses_before_c_and_a_dropped_one_keeps_its_requests_until_the_qp_is_gone() {
    let _leaks = LeakCheck::new();
    let (pd, a, b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    let Side { cq, sq, rq: _rq, qp, link: _link } = a;
    drop(sq);
    let mut pq = qp.prepared_send_queue_with_depth::<Chunk>(4).unwrap();
    let t = target(&pd, 4096);
    b.qp.reset().unwrap();
    let ps: Vec<_> = chunks(&pd, 6, 64, AccessFlags::LOCAL_WRITE)
        .into_iter()
        .map(|c| prepare(&pq, SendWr::write(c, 0..64, t.remote().unwrap())))
        .collect();
    let Refused { error: e, value: rest } = pq.post_batch(ps).unwrap_err();
    assert!(e.to_string().contains("full"), "{e}");
    assert_eq!((rest.len(), pq.outstanding()), (2, 4), "four posted, two back");
    // Dropped with four outstanding: their buffers stay with the QP until it is destroyed.
    drop(pq);
    drop(rest);
    drop((qp, cq));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_ud_qp_refuses_a_send_without_an_address_handle_and_an_rc_qp_one_with_it_before_c() {
    let _leaks = LeakCheck::new();
    let ctx = crate::open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 64).unwrap();
    let ud = QueuePair::builder(&pd, rdma_verbs::QpType::Ud, &cq, &cq).max_send_wr(8).max_recv_wr(8).build().unwrap();
    ud.ready_ud(&rdma_verbs::InitAttr { qkey: 0x11, ..Default::default() }).unwrap();
    let ah_attr = rdma_verbs::AhAttr::global(1, ud.local_info(1).unwrap().gid, crate::gid_index());
    let ah = rdma_verbs::AddressHandle::new(&pd, &ah_attr).unwrap();
    let mut bufs = chunks(&pd, 2, 64, AccessFlags::LOCAL_WRITE);
    let what = |e: &Error| e.to_string();

    // The provider would read a NULL address handle: refused before C, by every path.
    let mut sq = ud.send_queue::<Chunk>().unwrap();
    let Refused { error: e, value: wr } = sq.post(SendWr::send(bufs.pop().unwrap(), 0..64)).unwrap_err();
    assert!(what(&e).contains("UD QP sends only datagrams with an address handle"), "{e}");
    let Refused { error: e, value: _ } = sq.post_batch([wr]).unwrap_err();
    assert!(what(&e).contains("address handle"), "{e}");
    drop(sq);
    let pq = ud.prepared_send_queue::<Chunk>().unwrap();
    let Refused { error: e, value: _ } = pq.prepare(SendWr::send(bufs.pop().unwrap(), 0..64)).unwrap_err();
    assert!(what(&e).contains("address handle"), "{e}");
    drop(pq);

    // And a connected QP refuses a datagram's address.
    let (pd2, a, _b) = rc_pair::<Chunk>(QpAccess::empty());
    let mut a = prepared(a);
    let src = chunks(&pd2, 1, 64, AccessFlags::LOCAL_WRITE).pop().unwrap();
    let ah2 = rdma_verbs::AddressHandle::new(&pd2, &ah_attr).unwrap();
    let Refused { error: e, value: _ } = a.pq.prepare(SendWr::send_ud(src, 0..64, &ah2, 1, 0x11)).unwrap_err();
    assert!(what(&e).contains("is for UD QPs"), "{e}");
    assert_eq!(a.pq.outstanding(), 0);
    let _ = (&mut a.cq, &a.qp, &ah);
}
