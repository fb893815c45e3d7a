//! CQ overrun is prevented by construction: every safe queue sets its depth aside in the
//! CQ its completions land in, and a claim that the CQ cannot hold is refused with an
//! error that says how big the CQ must be. A QP is checked when it is built too: its
//! depths must fit in its CQs besides what the claimed queues on them reserved. The
//! advice in a refusal never names a CQ larger than the device can make.

use rdma_verbs::{
    AccessFlags, Chunk, CompletionQueue, Error, InitAttr, ProtectionDomain, QpAccess, QpType, QueuePair, RecvQueue,
    Refused, SendQueue, SendWr, Verb,
};

use crate::datapath::{chunks, rc_pair, Side};
use crate::{open, LeakCheck, ResourceCounts};

fn invalid_message(e: Error) -> String {
    match e {
        Error::InvalidArgument { .. } => e.to_string(),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// The text of a refusal by `QueuePairBuilder::build`, before the QP was created.
#[track_caller]
fn build_refusal(e: Error) -> String {
    match e {
        Error::InvalidArgument { verb: Verb::QueuePairBuilderBuild, .. } => e.to_string(),
        other => panic!("expected InvalidArgument naming QueuePairBuilder::build, got {other:?}"),
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
    // Two QPs that each fit the CQ alone (built before either claims anything): together
    // their queues do not, and the claim that would overrun it is refused.
    let build = || QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(entries - 1).max_recv_wr(1).build();
    let (a, b) = (build().unwrap(), build().unwrap());
    let sq_a: SendQueue<Chunk> = a.send_queue().unwrap();
    let rq_b: RecvQueue<Chunk> = b.recv_queue().unwrap(); // entries - 1 + 1: exactly full
    let msg = invalid_message(b.send_queue::<Chunk>().unwrap_err());
    assert!(msg.starts_with("claiming a queue: invalid argument: this send queue"), "{msg}");
    assert!(msg.contains(&format!("create the CQ with at least {} entries", 2 * entries - 1)), "{msg}");
    // A shallower send side fits in what is left once the other one is shallower too.
    drop(sq_a);
    let sq_a: SendQueue<Chunk> = a.send_queue_with_depth(entries / 2).unwrap();
    let sq_b: SendQueue<Chunk> = b.send_queue_with_depth(entries - entries / 2 - 1).unwrap();
    assert_eq!((sq_a.outstanding(), sq_b.outstanding(), rq_b.outstanding()), (0, 0, 0));
    // Depths outside 1..=max_*_wr are refused before anything is reserved.
    drop((sq_a, sq_b, rq_b));
    assert!(invalid_message(a.send_queue_with_depth::<Chunk>(0).unwrap_err()).contains("depth 0"));
    let too_deep = a.caps().max_send_wr + 1;
    assert!(invalid_message(a.send_queue_with_depth::<Chunk>(too_deep).unwrap_err()).contains("max_send_wr"));
    // Everything given back: the full-depth queues fit again.
    let (sq, rq): (SendQueue<Chunk>, RecvQueue<Chunk>) = (a.send_queue().unwrap(), a.recv_queue().unwrap());
    assert_eq!((sq.outstanding(), rq.outstanding()), (0, 0));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_qp_whose_depths_do_not_fit_its_cqs_is_refused_when_built_naming_the_cq_size_it_needs() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let qps = || ResourceCounts::now().qp;
    let before = qps();
    // The defaults (128 + 128) on a 64-entry CQ: refused before the QP exists.
    let small = CompletionQueue::new(&ctx, 64).unwrap();
    let entries = small.cqe();
    assert!(entries < 256, "this test needs a CQ of fewer than 256 entries; asked 64, got {entries}");
    let msg = build_refusal(QueuePair::builder(&pd, QpType::Rc, &small, &small).build().unwrap_err());
    assert!(msg.contains("the RC QP's send and receive queues (max_send_wr 128 + max_recv_wr 128)"), "{msg}");
    assert!(msg.contains(&format!("its CQ has {entries} entries")), "{msg}");
    assert!(msg.contains("create the CQ with at least 256 entries, or build the QP with a smaller"), "{msg}");
    assert_eq!(qps(), before, "a refused QP was not created");
    // Each CQ holds only its side's completions: a send CQ as deep as max_send_wr is enough.
    let big = CompletionQueue::new(&ctx, 256).unwrap();
    let msg = build_refusal(QueuePair::builder(&pd, QpType::Rc, &small, &big).build().unwrap_err());
    assert!(msg.contains("send queue (max_send_wr 128)"), "{msg}");
    let msg = build_refusal(QueuePair::builder(&pd, QpType::Rc, &big, &small).build().unwrap_err());
    assert!(msg.contains("receive queue (max_recv_wr 128)"), "{msg}");
    let full = QueuePair::builder(&pd, QpType::Rc, &small, &big).max_send_wr(entries).build().unwrap();
    let default = QueuePair::builder(&pd, QpType::Rc, &big, &big).build().unwrap();
    // What claimed queues reserved counts: with the send side of `full` claimed, nothing
    // more fits in `small`, and a QP built on it now is refused.
    let sq: SendQueue<Chunk> = full.send_queue().unwrap();
    let msg = build_refusal(QueuePair::builder(&pd, QpType::Rc, &small, &big).max_send_wr(1).build().unwrap_err());
    assert!(msg.contains(&format!("{entries} of them are reserved by other queues")), "{msg}");
    drop(sq); // nothing was posted: its share comes back at once
    QueuePair::builder(&pd, QpType::Rc, &small, &big).max_send_wr(1).build().unwrap();
    drop((full, default));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_refusal_never_advises_a_cq_larger_than_the_device_can_make() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let dev = ctx.query_device().unwrap();
    let cq = CompletionQueue::new(&ctx, dev.max_cqe).unwrap();
    let depth = dev.max_qp_wr.min(cq.cqe());
    assert!(
        u64::from(depth) * 2 > u64::from(dev.max_cqe),
        "this test needs max_qp_wr above half of max_cqe (rxe: 16384 and 32767); the device has {} and {}",
        dev.max_qp_wr,
        dev.max_cqe
    );
    // Both queues as deep as the device allows, on the largest CQ it can make.
    let err = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(depth).max_recv_wr(depth).build().unwrap_err();
    let msg = build_refusal(err);
    assert!(!msg.contains("create the CQ with at least"), "advises a CQ the device cannot make: {msg}");
    let need = 2 * u64::from(depth);
    assert!(msg.contains(&format!("{need} entries is more than the device's max_cqe {}", dev.max_cqe)), "{msg}");
    assert!(msg.contains("smaller max_send_wr or max_recv_wr, or give some of the queues another CQ"), "{msg}");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_queue_never_has_more_requests_outstanding_than_its_depth() {
    let _leaks = LeakCheck::new();
    let (pd, a, mut b) = rc_pair::<Chunk>(QpAccess::empty());
    // Swap the 64-deep send queue of A for a 4-deep one.
    let Side { sq, rq: _rq, qp, mut cq, link: _link } = a;
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
        assert!(done.value.iter().all(|&x| x == i), "receive {i} holds the bytes of send {i}");
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
    let build = || QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(1).max_recv_wr(entries - 1).build();
    // Both built while nothing is reserved on the CQ: each fits it alone.
    let (qp, other) = (build().unwrap(), build().unwrap());
    qp.to_init(&InitAttr::default()).unwrap(); // receives are posted from INIT on
    let mut rq: RecvQueue<Chunk> = qp.recv_queue().unwrap();
    for (i, buf) in chunks(&pd, 2, 64, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
        rq.post(buf, 0..64, i as u64).unwrap();
    }
    // Dropped with receives posted: they may still complete into the CQ, so its share stays,
    // for claims and for QPs built meanwhile alike.
    drop(rq);
    let msg = invalid_message(other.recv_queue::<Chunk>().unwrap_err());
    assert!(msg.contains("reserved by other queues"), "{msg}");
    let msg = build_refusal(build().unwrap_err());
    assert!(msg.contains(&format!("{} of them are reserved by other queues", entries - 1)), "{msg}");
    // Once the QP is destroyed its receives can no longer complete: the share comes back.
    drop(qp);
    let rq: RecvQueue<Chunk> = other.recv_queue().unwrap();
    assert_eq!(rq.outstanding(), 0);
}
