//! Scoped sends (`QueuePair::send_scope`): sources borrowed for the scope, every posted
//! request completed before the scope returns, whatever the closure does.

use rdma_verbs::buf::Chunk;
use rdma_verbs::{AccessFlags, CompletionQueue, ProtectionDomain, QpAccess, QueuePair, WcStatus};

use crate::datapath::{chunks, poll_one, rc_pair, Side};
use crate::prepared::{read_back, target, Target};
use crate::LeakCheck;

/// A side with nothing claimed: the scope takes the send side and the whole CQ.
fn bare(side: Side<Chunk>) -> (CompletionQueue, QueuePair) {
    let Side { cq, sq, rq, qp } = side;
    drop((sq, rq));
    (cq, qp)
}

/// A bare QP whose peer is reset (nothing it is sent is ever acknowledged), a 64-byte
/// target on the peer's side and a 64-byte source.
fn writer_to_a_reset_peer() -> (ProtectionDomain, CompletionQueue, QueuePair, Target, Chunk) {
    let (pd, a, b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    let (cq, qp) = bare(a);
    let t = target(&pd, 64);
    let src = chunks(&pd, 1, 64, AccessFlags::LOCAL_WRITE).pop().unwrap();
    b.qp.reset().unwrap();
    (pd, cq, qp, t, src)
}

fn bytes(r: u64, k: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u64).wrapping_mul(11).wrapping_add(r * 17 + k * 97) as u8).collect()
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_chain_of_borrowed_sources_posted_many_times_per_scope_lands_each_scopes_bytes() {
    let _leaks = LeakCheck::new();
    let (pd, a, _b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    let (mut cq, qp) = bare(a);
    const K: usize = 8;
    const LEN: usize = 1000;
    let t = target(&pd, K * LEN);
    let mut srcs = chunks(&pd, K, LEN, AccessFlags::LOCAL_WRITE);
    for round in 0..4u64 {
        // Between scopes the sources are ours again: new bytes each round.
        for (k, c) in srcs.iter_mut().enumerate() {
            c.copy_from_slice(&bytes(round, k as u64, LEN));
        }
        let posts = qp
            .send_scope(&mut cq, 32, |s| {
                let mut chain = s.chain();
                for (k, c) in srcs.iter().enumerate() {
                    chain.write(c, 0..LEN, t.remote().unwrap().slice((k * LEN) as u64..).unwrap()).unwrap();
                }
                chain.signal_last_only();
                let mut posts = 0;
                for _ in 0..10 {
                    s.post(&mut chain).unwrap();
                    posts += 1;
                    while s.outstanding() > 16 {
                        s.poll().unwrap();
                    }
                }
                s.wait_all().unwrap();
                assert_eq!(s.outstanding(), 0);
                posts
            })
            .unwrap();
        assert_eq!(posts, 10);
        for k in 0..K {
            assert_eq!(read_back(&t, k * LEN, LEN), bytes(round, k as u64, LEN), "round {round}, source {k}");
        }
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_scope_left_early_or_by_a_panic_drains_before_returning_and_frees_the_send_side() {
    let _leaks = LeakCheck::new();
    let (pd, a, mut b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    let (mut cq, qp) = bare(a);
    let t = target(&pd, 4096);
    let mut src = chunks(&pd, 1, 4096, AccessFlags::LOCAL_WRITE).pop().unwrap();
    src.copy_from_slice(&bytes(1, 0, 4096));
    // Left with 20 requests posted and none polled: the scope waits for them.
    qp.send_scope(&mut cq, 32, |s| {
        let mut chain = s.chain();
        chain.write(&src, 0..4096, t.remote().unwrap()).unwrap();
        for _ in 0..20 {
            s.post(&mut chain).unwrap();
        }
        assert!(s.outstanding() > 0);
    })
    .unwrap();
    assert_eq!(read_back(&t, 0, 4096), bytes(1, 0, 4096));

    // A panic inside: the scope still drains, then the panic goes on.
    src.copy_from_slice(&bytes(2, 0, 4096));
    let rbuf = chunks(&pd, 1, 64, AccessFlags::LOCAL_WRITE).pop().unwrap();
    b.rq.post(rbuf, 0..64, 7).unwrap();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        qp.send_scope(&mut cq, 32, |s| {
            let mut chain = s.chain();
            chain.write(&src, 0..4096, t.remote().unwrap()).unwrap().send(&src, 0..16).unwrap();
            s.post(&mut chain).unwrap();
            panic!("the scope's closure panics with requests posted");
        })
    }));
    assert!(caught.is_err(), "the panic comes through");
    assert_eq!(read_back(&t, 0, 4096), bytes(2, 0, 4096));
    let mut wc = poll_one(&mut b.cq);
    let got = b.rq.complete(&mut wc).unwrap();
    assert_eq!((got.id, got.status, got.byte_len), (7, WcStatus::Success, 16));
    assert_eq!(got.buf[..16], bytes(2, 0, 16));
    // The send side and the CQ are free again.
    let sq = qp.send_queue::<Chunk>();
    assert!(sq.is_ok(), "the send side is free after the scope: {:?}", sq.err());
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_scope_refuses_another_cq_a_shared_cq_and_a_full_depth_before_c() {
    let _leaks = LeakCheck::new();
    let (pd, a, b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    let Side { cq: mut cq_a, sq, rq, qp } = a;
    drop(sq);
    let (mut cq_b, _qp_b) = bare(b);
    let e = qp.send_scope(&mut cq_b, 8, |_| ()).unwrap_err();
    assert!(e.to_string().contains("not this QP's send CQ"), "{e}");
    // A receive queue has entries reserved on the same CQ: the scope wants it whole.
    let e = qp.send_scope(&mut cq_a, 8, |_| ()).unwrap_err();
    assert!(e.to_string().contains("reserved by other queues"), "{e}");
    drop(rq);
    let t = target(&pd, 64);
    let src = chunks(&pd, 1, 64, AccessFlags::LOCAL_WRITE).pop().unwrap();
    qp.send_scope(&mut cq_a, 4, |s| {
        let mut chain = s.chain();
        for _ in 0..3 {
            chain.write(&src, 0..64, t.remote().unwrap()).unwrap();
        }
        s.post(&mut chain).unwrap();
        let e = s.post(&mut chain).unwrap_err();
        assert!(e.to_string().contains("full"), "{e}");
        assert_eq!(s.outstanding(), 3, "the refused chain posted nothing");
        let e = s.chain().write(&src, 0..65, t.remote().unwrap()).err().unwrap();
        assert!(e.to_string().contains("outside a 64-byte buffer"), "{e}");
        s.wait_all().unwrap();
    })
    .unwrap();
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn an_errored_qp_inside_a_scope_flushes_every_request_and_the_scope_counts_them_all() {
    let _leaks = LeakCheck::new();
    let (_pd, mut cq, qp, t, src) = writer_to_a_reset_peer();
    qp.send_scope(&mut cq, 32, |s| {
        let mut chain = s.chain();
        for _ in 0..8 {
            chain.write(&src, 0..64, t.remote().unwrap()).unwrap();
        }
        chain.signal_last_only();
        s.post(&mut chain).unwrap();
        s.post(&mut chain).unwrap();
        qp.to_error().unwrap();
        let e = s.wait_all().unwrap_err();
        assert!(e.to_string().contains("WR_FLUSH_ERR") || e.to_string().contains("flush"), "{e}");
        assert_eq!(s.outstanding(), 0, "each of the 16 flushed requests counted once");
    })
    .unwrap();
    assert_eq!(read_back(&t, 0, 64), vec![0u8; 64], "no write ran");
    // The CQ is empty: the scope took every completion.
    let mut wcs = [rdma_verbs::WorkCompletion::EMPTY; 4];
    assert!(cq.poll(&mut wcs).unwrap().is_empty());
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_qp_reset_inside_a_scope_discards_its_requests_and_the_scope_still_ends_after_its_patience() {
    let _leaks = LeakCheck::new();
    let (_pd, mut cq, qp, t, src) = writer_to_a_reset_peer();
    let started = std::time::Instant::now();
    qp.send_scope(&mut cq, 32, |s| {
        let mut chain = s.chain();
        chain.write(&src, 0..64, t.remote().unwrap()).unwrap();
        for _ in 0..4 {
            s.post(&mut chain).unwrap();
        }
        // Reset discards what is posted without a completion: the scope cannot count it
        // down, and must neither hang nor return while the device could still read.
        qp.reset().unwrap();
    })
    .unwrap();
    let took = started.elapsed();
    // 30 s of silence, the flush, 5 s of quiet: then the QP is in reset or error.
    assert!(took >= std::time::Duration::from_secs(30), "returned after {took:?}, before its patience ran out");
    assert!(took < std::time::Duration::from_secs(60), "took {took:?}");
    assert!(matches!(qp.state().unwrap(), rdma_verbs::QpState::Err | rdma_verbs::QpState::Reset));
    assert_eq!(read_back(&t, 0, 64), vec![0u8; 64], "no write ran");
}
