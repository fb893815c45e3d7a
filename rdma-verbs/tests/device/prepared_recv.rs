//! Prepared receives (`PreparedRecvQueue`): checked and built once, posted many times;
//! every byte that arrives is compared with what the peer sent that round.

use rdma_verbs::{
    AccessFlags, Chunk, CompletionQueue, Done, PreparedRecv, PreparedRecvQueue, QpAccess, QueuePair, SendQueue, SendWr,
    WcOpcode, WcStatus,
};

use crate::datapath::{chunks, poll_one, rc_pair, Side};
use crate::prepared::{bytes, posted};
use crate::LeakCheck;

const LEN: usize = 64;

/// A side whose receive side is claimed for prepared receives.
struct RSide {
    cq: CompletionQueue,
    _sq: SendQueue<Chunk>,
    prq: PreparedRecvQueue<Chunk>,
    qp: QueuePair,
    _link: std::sync::Arc<crate::Link>,
}

/// Gives up a side's `RecvQueue` (the claim passes on) and takes a `PreparedRecvQueue`.
fn receiving(side: Side<Chunk>, depth: u32) -> RSide {
    let Side { cq, sq, rq, qp, link } = side;
    drop(rq);
    let prq = qp.prepared_recv_queue_with_depth::<Chunk>(depth).unwrap();
    RSide { cq, _sq: sq, prq, qp, _link: link }
}

/// Polls `s`'s CQ until `n` prepared receives have come back, in order of completion.
fn received(s: &mut RSide, n: usize) -> Vec<Done<PreparedRecv<Chunk>>> {
    (0..n).map(|_| s.prq.complete(&mut poll_one(&mut s.cq)).unwrap()).collect()
}

/// Posts `n` SENDs from `a`'s sources `srcs` (request `k` sends round `r`'s bytes for
/// `k`) and takes their completions.
fn send_round(a: &mut Side<Chunk>, srcs: &mut Vec<Chunk>, r: u64, n: usize) {
    let left = srcs.len();
    let sending: Vec<Chunk> = srcs.drain(..n).collect();
    for (k, mut c) in sending.into_iter().enumerate() {
        c[..LEN].copy_from_slice(&bytes(r, k as u64, LEN));
        posted(a.sq.post(SendWr::send(c, 0..LEN).id(k as u64)));
    }
    while srcs.len() < left {
        let mut wc = poll_one(&mut a.cq);
        a.sq.complete(&mut wc, |d| {
            assert_eq!(d.status, WcStatus::Success);
            srcs.push(d.value)
        })
        .unwrap();
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn prepared_receives_posted_again_each_round_hand_back_the_bytes_that_arrived_and_their_ids() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, b) = rc_pair::<Chunk>(QpAccess::empty());
    let mut b = receiving(b, 64);
    let mut srcs = chunks(&pd, 4, LEN, AccessFlags::LOCAL_WRITE);
    let mut recvs: Vec<PreparedRecv<Chunk>> = chunks(&pd, 4, 2 * LEN, AccessFlags::LOCAL_WRITE)
        .into_iter()
        .enumerate()
        .map(|(k, c)| b.prq.prepare(c, 0..2 * LEN, 100 + k as u64).unwrap())
        .collect();
    for r in 0..12u64 {
        // Even rounds post the four in one batch (one provider call), odd rounds one by one.
        if r % 2 == 0 {
            assert_eq!(b.prq.post_batch(recvs.drain(..)).unwrap(), 4);
        } else {
            for p in recvs.drain(..) {
                posted(b.prq.post(p));
            }
        }
        assert_eq!(b.prq.outstanding(), 4);
        send_round(&mut a, &mut srcs, r, 4);
        for (k, d) in received(&mut b, 4).into_iter().enumerate() {
            assert_eq!((d.id, d.status, d.op, d.byte_len), (100 + k as u64, WcStatus::Success, WcOpcode::Recv, 64));
            assert_eq!(d.qp_num, b.qp.qp_num());
            let p = d.result().unwrap().value;
            assert_eq!((p.id(), p.range()), (100 + k as u64, 0..2 * LEN));
            assert_eq!(p.buf()[..LEN], bytes(r, k as u64, LEN)[..], "round {r}: receive {k}'s bytes");
            recvs.push(p);
        }
    }
    // A new id is handed back with the next completion; the buffer comes apart whole.
    recvs[0].set_id(7);
    posted(b.prq.post(recvs.remove(0)));
    send_round(&mut a, &mut srcs, 99, 1);
    let d = received(&mut b, 1).pop().unwrap();
    assert_eq!(d.id, 7);
    let (buf, range, id) = d.value.into_parts();
    assert_eq!((buf.len(), range, id), (2 * LEN, 0..2 * LEN, 7));
    assert_eq!(buf[..LEN], bytes(99, 0, LEN)[..]);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_prepared_receive_is_refused_before_c_for_another_pd_a_bad_range_or_a_full_queue_and_comes_back() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, b) = rc_pair::<Chunk>(QpAccess::empty());
    let (other_pd, _c, d) = rc_pair::<Chunk>(QpAccess::empty());
    let mut b = receiving(b, 2);
    let mut d = receiving(d, 2);
    // A buffer of another protection domain, or a range outside the buffer: refused at
    // prepare, the buffer handed back.
    let stranger = chunks(&other_pd, 1, LEN, AccessFlags::LOCAL_WRITE).pop().unwrap();
    let (e, back) = b.prq.prepare(stranger, 0..LEN, 1).unwrap_err().into_parts();
    assert!(e.to_string().contains("protection domain"), "{e}");
    assert_eq!(back.len(), LEN);
    let mine = chunks(&pd, 3, LEN, AccessFlags::LOCAL_WRITE);
    let mut mine = mine.into_iter();
    let (e, back) = b.prq.prepare(mine.next().unwrap(), 0..LEN + 1, 2).unwrap_err().into_parts();
    assert!(e.to_string().contains("outside"), "{e}");
    // Prepared for b's QP, posted on d's (another PD): refused before C, handed back.
    let p = b.prq.prepare(back, 0..LEN, 3).unwrap();
    let (e, p) = d.prq.post(p).unwrap_err().into_parts();
    assert!(e.to_string().contains("another protection domain"), "{e}");
    assert_eq!(d.prq.outstanding(), 0);
    // A queue of depth 2 takes two; the third comes back, the two still land.
    posted(b.prq.post(p));
    posted(b.prq.post(b.prq.prepare(mine.next().unwrap(), 0..LEN, 4).unwrap()));
    let third = b.prq.prepare(mine.next().unwrap(), 0..LEN, 5).unwrap();
    let (e, third) = b.prq.post(third).unwrap_err().into_parts();
    assert!(e.to_string().contains("full"), "{e}");
    assert_eq!((third.id(), b.prq.outstanding()), (5, 2));
    let (e, refused) = b.prq.post_batch([third]).unwrap_err().into_parts();
    assert!(e.to_string().contains("full"), "{e}");
    assert_eq!(refused.iter().map(PreparedRecv::id).collect::<Vec<_>>(), [5]);
    let mut srcs = chunks(&pd, 2, LEN, AccessFlags::LOCAL_WRITE);
    send_round(&mut a, &mut srcs, 1, 2);
    let got = received(&mut b, 2);
    assert_eq!(got.iter().map(|d| d.id).collect::<Vec<_>>(), [3, 4]);
    for (k, d) in got.iter().enumerate() {
        assert_eq!(d.value.buf()[..LEN], bytes(1, k as u64, LEN)[..]);
    }
}
