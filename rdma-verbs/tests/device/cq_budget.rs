//! CQ overrun is prevented by construction: every safe queue sets its depth aside in the
//! CQ its completions land in, and a claim that the CQ cannot hold is refused with an
//! error that says how big the CQ must be.

use rdma_verbs::{
    AccessFlags, Chunk, CompletionQueue, Error, InitAttr, ProtectionDomain, QpAccess, QpType, QueuePair, RecvQueue,
    Refused, SendQueue, SendWr,
};

use crate::datapath::{chunks, rc_pair, Side};
use crate::{open, LeakCheck};

fn invalid_message(e: Error) -> String {
    match e {
        Error::InvalidArgument { .. } => e.to_string(),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_cq_refuses_queues_whose_depths_together_exceed_its_entries() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    let entries = cq.cqe();
    assert!(entries >= 16, "the provider granted {entries} entries for 16");
    // Both sides as deep as the CQ, on the same CQ: only one of them fits.
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(entries).max_recv_wr(entries).build().unwrap();
    let sq: SendQueue<Chunk> = qp.send_queue().unwrap();
    let msg = invalid_message(qp.recv_queue::<Chunk>().unwrap_err());
    assert!(msg.contains("receive queue") && msg.contains(&format!("{} entries", 2 * entries)), "{msg}");
    // A shallower receive side fits in what is left once the send side is shallower too.
    drop(sq);
    let sq: SendQueue<Chunk> = qp.send_queue_with_depth(entries / 2).unwrap();
    let rq: RecvQueue<Chunk> = qp.recv_queue_with_depth(entries - entries / 2).unwrap();
    assert_eq!((sq.outstanding(), rq.outstanding()), (0, 0));
    // Depths outside 1..=max_*_wr are refused before anything is reserved.
    drop((sq, rq));
    assert!(invalid_message(qp.send_queue_with_depth::<Chunk>(0).unwrap_err()).contains("depth 0"));
    let too_deep = qp.caps().max_send_wr + 1;
    assert!(invalid_message(qp.send_queue_with_depth::<Chunk>(too_deep).unwrap_err()).contains("max_send_wr"));
    // Everything given back: the full-depth send side fits again.
    let sq: SendQueue<Chunk> = qp.send_queue().unwrap();
    assert_eq!(sq.outstanding(), 0);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_queue_never_has_more_requests_outstanding_than_its_depth() {
    let _leaks = LeakCheck::new();
    let (pd, a, mut b) = rc_pair::<Chunk>(QpAccess::empty());
    // Swap the 64-deep send queue of A for a 4-deep one.
    let Side { sq, rq: _rq, qp, mut cq } = a;
    drop(sq);
    let mut sq: SendQueue<Chunk> = qp.send_queue_with_depth(4).unwrap();
    let mut bufs = chunks(&pd, 8, 64, AccessFlags::LOCAL_WRITE);
    for (i, buf) in chunks(&pd, 8, 64, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
        b.rq.post(buf, 0..64, i as u64).unwrap();
    }
    for i in 0..4u8 {
        let mut buf = bufs.pop().unwrap();
        buf.fill(i);
        sq.post(SendWr::send(buf, 0..64).id(u64::from(i))).unwrap();
    }
    let Refused { error: e, value: wr } = sq.post(SendWr::send(bufs.pop().unwrap(), 0..64)).unwrap_err();
    assert!(invalid_message(e).contains("full"), "the fifth request must be refused");
    bufs.push(wr.into_buf());
    // One completion makes room for one more request.
    let mut wc = crate::datapath::poll_one(&mut cq);
    let mut back = Vec::new();
    sq.complete(&mut wc, |d| back.push(d)).unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].id, 0);
    sq.post(SendWr::send(bufs.pop().unwrap(), 0..64)).unwrap();
    // The receiver got the first requests' bytes in order.
    for i in 0..4u8 {
        let mut wc = crate::datapath::poll_one(&mut b.cq);
        let done = b.rq.complete(&mut wc).unwrap();
        assert!(done.buf.iter().all(|&x| x == i), "receive {i} holds the bytes of send {i}");
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_dropped_queue_keeps_its_cq_share_until_its_posted_requests_cannot_complete() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    let entries = cq.cqe();
    let build = || QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(1).max_recv_wr(entries).build().unwrap();
    let qp = build();
    qp.to_init(&InitAttr::default()).unwrap(); // receives are posted from INIT on
    let mut rq: RecvQueue<Chunk> = qp.recv_queue().unwrap();
    for (i, buf) in chunks(&pd, 2, 64, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
        rq.post(buf, 0..64, i as u64).unwrap();
    }
    // Dropped with receives posted: they may still complete into the CQ, so its share stays.
    drop(rq);
    let other = build();
    let msg = invalid_message(other.recv_queue::<Chunk>().unwrap_err());
    assert!(msg.contains("reserved by other queues"), "{msg}");
    // Once the QP is destroyed its receives can no longer complete: the share comes back.
    drop(qp);
    let rq: RecvQueue<Chunk> = other.recv_queue().unwrap();
    assert_eq!(rq.outstanding(), 0);
}
