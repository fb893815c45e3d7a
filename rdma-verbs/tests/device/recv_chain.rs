//! Prepared receive chains (`RecvChainQueue`): receives checked and built once, linked,
//! posted whole and handed back whole; every byte that arrives, and each receive's
//! length, is compared with what the peer sent.

use rdma_verbs::{AccessFlags, Chunk, CompletionQueue, ProtectionDomain, QpAccess, QueuePair, SendQueue, SendWr};
use rdma_verbs::{Done, PreparedRecvChain, RecvChainQueue, WcOpcode, WcStatus, WorkCompletion};

use crate::datapath::{chunks, poll_one, rc_pair, Side};
use crate::prepared::{bytes, posted};
use crate::LeakCheck;

const LEN: usize = 64;

/// A side whose receive side is claimed for receive chains.
struct RSide {
    cq: CompletionQueue,
    _sq: SendQueue<Chunk>,
    rq: RecvChainQueue<Chunk>,
    qp: QueuePair,
    _link: std::sync::Arc<crate::Link>,
}

/// Gives up a side's `RecvQueue` (the claim passes on) and takes a `RecvChainQueue`.
fn receiving(side: Side<Chunk>, depth: u32) -> RSide {
    let Side { cq, sq, rq, qp, link } = side;
    drop(rq);
    let rq = qp.recv_chain_queue_with_depth::<Chunk>(depth).unwrap();
    RSide { cq, _sq: sq, rq, qp, _link: link }
}

/// `n` receive buffers of `len` bytes with ids `first..`.
fn recvs(pd: &ProtectionDomain, n: usize, len: usize, first: u64) -> Vec<(Chunk, std::ops::Range<usize>, u64)> {
    chunks(pd, n, len, AccessFlags::LOCAL_WRITE)
        .into_iter()
        .enumerate()
        .map(|(k, c)| (c, 0..len, first + k as u64))
        .collect()
}

/// How many bytes round `r` sends to receive `k` (1 up to LEN, differing between them).
fn len_of(r: u64, k: usize) -> usize {
    1 + (r as usize * 7 + k * 13) % LEN
}

/// Posts SENDs from `a`'s sources (request `k` sends `lens[k]` bytes of round `r`'s
/// bytes for `k`) and takes their completions, whatever their status.
fn send_round(a: &mut Side<Chunk>, srcs: &mut Vec<Chunk>, r: u64, lens: &[usize]) -> Vec<WcStatus> {
    send_imm_round(a, srcs, r, lens, &vec![None; lens.len()])
}

/// As `send_round`, with request `k` carrying the immediate data `imms[k]`, if any.
fn send_imm_round(
    a: &mut Side<Chunk>,
    srcs: &mut Vec<Chunk>,
    r: u64,
    lens: &[usize],
    imms: &[Option<u32>],
) -> Vec<WcStatus> {
    let left = srcs.len();
    let sending: Vec<Chunk> = srcs.drain(..lens.len()).collect();
    for (k, mut c) in sending.into_iter().enumerate() {
        let n = lens[k];
        c[..n].copy_from_slice(&bytes(r, k as u64, n));
        let wr = SendWr::send(c, 0..n).id(k as u64);
        posted(a.sq.post(match imms[k] {
            Some(imm) => wr.imm(imm),
            None => wr,
        }));
    }
    let mut statuses = Vec::new();
    while srcs.len() < left {
        let mut wc = poll_one(&mut a.cq);
        a.sq.complete(&mut wc, |d| {
            statuses.push(d.status);
            srcs.push(d.value)
        })
        .unwrap();
    }
    statuses
}

/// Polls `n` completions of `s`'s CQ.
fn poll_n(s: &mut RSide, n: usize) -> Vec<WorkCompletion> {
    (0..n).map(|_| poll_one(&mut s.cq)).collect()
}

/// Checks that a chain that came back holds round `r`'s bytes and lengths in each
/// receive, with ids `first..`.
#[track_caller]
fn check_arrived(chain: &PreparedRecvChain<Chunk>, r: u64, first: u64) {
    for (k, m) in chain.iter().enumerate() {
        let n = len_of(r, k);
        assert_eq!((m.id(), m.range(), m.status()), (first + k as u64, 0..LEN, WcStatus::Success), "round {r}: {k}");
        assert_eq!(m.byte_len() as usize, n, "round {r}: receive {k}'s length");
        assert_eq!(m.buf()[..n], bytes(r, k as u64, n)[..], "round {r}: receive {k}'s bytes");
        assert_eq!(m.imm_data(), None);
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_receive_chain_posted_again_each_round_hands_back_every_receives_bytes_and_length_once() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, b) = rc_pair::<Chunk>(QpAccess::empty());
    let mut b = receiving(b, 64);
    let mut srcs = chunks(&pd, 32, LEN, AccessFlags::LOCAL_WRITE);
    let mut chain = Some(b.rq.prepare_chain(recvs(&pd, 32, LEN, 100)).unwrap());
    assert_eq!(chain.as_ref().unwrap().len(), 32);
    for r in 0..8u64 {
        posted(b.rq.post(chain.take().unwrap()));
        assert_eq!(b.rq.outstanding(), 32, "one post, 32 C receives outstanding");
        let lens: Vec<usize> = (0..32).map(|k| len_of(r, k)).collect();
        assert!(send_round(&mut a, &mut srcs, r, &lens).iter().all(|s| *s == WcStatus::Success));
        let mut wcs = poll_n(&mut b, 32);
        let mut came: Vec<Done<PreparedRecvChain<Chunk>>> = Vec::new();
        if r % 2 == 0 {
            // One completion at a time: the chain comes back with the last, once.
            for (i, wc) in wcs.iter_mut().enumerate() {
                assert_eq!(b.rq.complete(wc, |d| came.push(d)).unwrap(), 1);
                assert_eq!(came.len(), usize::from(i == 31), "after completion {i}");
                assert_eq!(b.rq.outstanding(), 31 - i);
            }
        } else {
            // Polls that split the chain: runs of 5 (and the last of 2), each in one call.
            for run in wcs.chunks_mut(5) {
                assert_eq!(b.rq.complete_all(run, |d| came.push(d)).unwrap(), run.len());
            }
        }
        assert!(wcs.iter().all(|wc| wc.wr_id() == 0), "every completion is taken");
        let d = came.pop().unwrap();
        assert!(came.is_empty());
        assert_eq!((d.id, d.status, d.op, d.qp_num), (100, WcStatus::Success, WcOpcode::Recv, b.qp.qp_num()));
        assert_eq!(d.byte_len as usize, len_of(r, 31), "the last receive's length");
        let c = d.result().unwrap().value;
        check_arrived(&c, r, 100);
        chain = Some(c);
    }
    // Apart: every buffer, range and id, in posting order.
    let parts = chain.take().unwrap().into_parts();
    assert_eq!(parts.iter().map(|p| p.2).collect::<Vec<_>>(), (100..132).collect::<Vec<_>>());
    assert!(parts.iter().all(|p| p.0.len() == LEN && p.1 == (0..LEN)));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn complete_all_stops_at_a_strangers_completion_inside_a_chain_leaving_it_and_the_rest() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, b) = rc_pair::<Chunk>(QpAccess::empty());
    let mut b = receiving(b, 64);
    let mut srcs = chunks(&pd, 6, LEN, AccessFlags::LOCAL_WRITE);
    // A chain of 4, then a chain of 2: 6 completions, 2 chains back.
    posted(b.rq.post(b.rq.prepare_chain(recvs(&pd, 4, LEN, 0)).unwrap()));
    posted(b.rq.post(b.rq.prepare_chain(recvs(&pd, 2, LEN, 4)).unwrap()));
    assert_eq!(b.rq.outstanding(), 6);
    let lens: Vec<usize> = (0..6).map(|k| len_of(0, k)).collect();
    send_round(&mut a, &mut srcs, 0, &lens);
    let mut wcs = poll_n(&mut b, 6);
    // A completion that is not this queue's inside the first chain: the two before it
    // are taken (no chain comes back yet), it and the rest are left as they were.
    wcs.insert(2, WorkCompletion::EMPTY);
    let mut came = Vec::new();
    let e = b.rq.complete_all(&mut wcs, |d| came.push(d)).unwrap_err();
    assert!(e.to_string().contains("is not outstanding on this receive queue"), "{e}");
    assert!(came.is_empty());
    assert_eq!(b.rq.outstanding(), 4);
    assert!(wcs[2..].iter().skip(1).all(|wc| wc.wr_id() != 0), "the rest are not taken");
    // One at a time, a stranger is refused too, and nothing changes.
    let mut stranger = WorkCompletion::EMPTY;
    assert!(b.rq.complete(&mut stranger, |d| came.push(d)).is_err());
    assert_eq!(b.rq.outstanding(), 4);
    // The rest: the first chain (its third member next), then the second.
    assert_eq!(b.rq.complete_all(&mut wcs[3..], |d| came.push(d)).unwrap(), 4);
    assert_eq!(came.iter().map(|d| (d.id, d.value.len())).collect::<Vec<_>>(), [(0, 4), (4, 2)]);
    assert_eq!(b.rq.outstanding(), 0);
    for (k, m) in came[0].value.iter().chain(came[1].value.iter()).enumerate() {
        assert_eq!(m.byte_len() as usize, lens[k]);
        assert_eq!(m.buf()[..lens[k]], bytes(0, k as u64, lens[k])[..], "receive {k}'s bytes");
    }
    // Taken once: the same completions again are refused, and nothing comes back.
    assert!(b.rq.complete_all(&mut wcs[3..4], |d| came.push(d)).is_err());
    let mut again = WorkCompletion::EMPTY;
    assert!(b.rq.complete(&mut again, |d| came.push(d)).is_err(), "nothing outstanding");
    assert_eq!(came.len(), 2);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_receive_chain_is_refused_before_c_when_empty_too_long_bad_full_or_for_another_pd_with_its_buffers_back() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, b) = rc_pair::<Chunk>(QpAccess::empty());
    let (other_pd, _c, d) = rc_pair::<Chunk>(QpAccess::empty());
    let mut b = receiving(b, 4);
    let mut d = receiving(d, 4);
    // Empty, or longer than the queue is deep: refused, every buffer back in order.
    let (e, back) = b.rq.prepare_chain([]).unwrap_err().into_parts();
    assert!(e.to_string().contains("at least one"), "{e}");
    assert!(back.is_empty());
    let (e, back) = b.rq.prepare_chain(recvs(&pd, 5, LEN, 0)).unwrap_err().into_parts();
    assert!(e.to_string().contains("at most 4"), "{e}");
    assert_eq!(back.iter().map(|r| r.2).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
    // A buffer of another protection domain, or a range outside its buffer, in the middle.
    let mut mixed = recvs(&pd, 3, LEN, 0);
    mixed.insert(1, recvs(&other_pd, 1, LEN, 9).pop().unwrap());
    let (e, back) = b.rq.prepare_chain(mixed).unwrap_err().into_parts();
    assert!(e.to_string().contains("protection domain"), "{e}");
    assert_eq!(back.iter().map(|r| r.2).collect::<Vec<_>>(), [0, 9, 1, 2]);
    let mut bad = back;
    bad.remove(1);
    bad[2].1 = 0..LEN + 1;
    let (e, back) = b.rq.prepare_chain(bad).unwrap_err().into_parts();
    assert!(e.to_string().contains("outside"), "{e}");
    assert_eq!(back.iter().map(|r| r.2).collect::<Vec<_>>(), [0, 1, 2]);
    // Prepared for b's QP, posted on d's (another PD): refused before C, handed back.
    let mut three = back;
    three[2].1 = 0..LEN;
    let chain = b.rq.prepare_chain(three).unwrap();
    let (e, chain) = d.rq.post(chain).unwrap_err().into_parts();
    assert!(e.to_string().contains("another protection domain"), "{e}");
    assert_eq!((d.rq.outstanding(), chain.len()), (0, 3));
    // Prepared for a deeper queue, wider than b's: named so, not "full".
    let (pd3, _e, f) = rc_pair::<Chunk>(QpAccess::empty());
    let f = receiving(f, 8);
    let wide = f.rq.prepare_chain(recvs(&pd3, 5, LEN, 0)).unwrap();
    let (e, wide) = b.rq.post(wide).unwrap_err().into_parts();
    assert!(e.to_string().contains("a chain of 5 requests never fits this queue, 4 deep"), "{e}");
    assert_eq!((b.rq.outstanding(), wide.len()), (0, 5));
    drop((wide, f));
    // A queue of depth 4 takes the 3; a chain of 2 more does not fit and comes back.
    posted(b.rq.post(chain));
    let two = b.rq.prepare_chain(recvs(&pd, 2, LEN, 3)).unwrap();
    let (e, two) = b.rq.post(two).unwrap_err().into_parts();
    assert!(e.to_string().contains("full"), "{e}");
    assert_eq!((two.len(), b.rq.outstanding()), (2, 3));
    // The three still land.
    let mut srcs = chunks(&pd, 3, LEN, AccessFlags::LOCAL_WRITE);
    send_round(&mut a, &mut srcs, 1, &[LEN, LEN, LEN]);
    let mut came = Vec::new();
    for mut wc in poll_n(&mut b, 3) {
        b.rq.complete(&mut wc, |d| came.push(d)).unwrap();
    }
    let c = came.pop().unwrap().result().unwrap().value;
    for (k, m) in c.iter().enumerate() {
        assert_eq!(m.buf()[..], bytes(1, k as u64, LEN)[..]);
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn immediate_data_shows_on_each_receive_whose_message_carried_it_and_never_from_an_earlier_post() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, b) = rc_pair::<Chunk>(QpAccess::empty());
    let mut b = receiving(b, 64);
    let mut srcs = chunks(&pd, 12, LEN, AccessFlags::LOCAL_WRITE);
    let mut chain = Some(b.rq.prepare_chain(recvs(&pd, 12, LEN, 0)).unwrap());
    // Which receives' messages carry immediate data, round by round: some, then none
    // (what the earlier round left must not show), and so on. The first and last rounds
    // take the completions one by one, the others in runs of 5 (`complete_all`).
    let plans: [fn(usize) -> bool; 6] =
        [|k| k % 3 == 0, |_| false, |k| k == 11 || k == 4, |_| false, |k| k == 9, |_| false];
    for (r, carries) in plans.iter().enumerate() {
        posted(b.rq.post(chain.take().unwrap()));
        let imms: Vec<Option<u32>> =
            (0..12).map(|k| carries(k).then_some(0xa000_0000 | (r as u32) << 8 | k as u32)).collect();
        let sent = send_imm_round(&mut a, &mut srcs, r as u64, &[LEN; 12], &imms);
        assert!(sent.iter().all(|s| *s == WcStatus::Success));
        let mut wcs = poll_n(&mut b, 12);
        let mut came = Vec::new();
        if r != 0 && r != 5 {
            for run in wcs.chunks_mut(5) {
                assert_eq!(b.rq.complete_all(run, |d| came.push(d)).unwrap(), run.len());
            }
        } else {
            for wc in &mut wcs {
                b.rq.complete(wc, |d| came.push(d)).unwrap();
            }
        }
        let c = came.pop().unwrap().result().unwrap().value;
        for (k, m) in c.iter().enumerate() {
            assert_eq!(m.imm_data(), imms[k], "round {r}: receive {k}");
            assert_eq!(m.buf()[..], bytes(r as u64, k as u64, LEN)[..], "round {r}: receive {k}'s bytes");
        }
        chain = Some(c);
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_send_longer_than_its_receive_fails_the_chain_which_reports_that_first_failure_once() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, b) = rc_pair::<Chunk>(QpAccess::empty());
    let mut b = receiving(b, 64);
    let chain = b.rq.prepare_chain(recvs(&pd, 3, LEN, 10)).unwrap();
    posted(b.rq.post(chain));
    // The second SEND is longer than its receive: it fails there, and the receive after
    // it is flushed (the QP is in error).
    let mut srcs = chunks(&pd, 3, 2 * LEN, AccessFlags::LOCAL_WRITE);
    let sent = send_round(&mut a, &mut srcs, 0, &[LEN, 2 * LEN, LEN]);
    assert_eq!(sent[0], WcStatus::Success);
    let mut came = Vec::new();
    let mut wcs = poll_n(&mut b, 3);
    assert_eq!(b.rq.complete_all(&mut wcs, |d| came.push(d)).unwrap(), 3);
    let d = came.pop().unwrap();
    assert!(came.is_empty(), "the chain comes back once");
    // A local length error (rxe reports a local QP operation error), then a flush.
    let statuses: Vec<WcStatus> = d.value.iter().map(|m| m.status()).collect();
    let bad = statuses[1];
    assert!(matches!(bad, WcStatus::LocLenErr | WcStatus::LocQpOpErr), "{statuses:?}");
    assert_eq!(statuses, [WcStatus::Success, bad, WcStatus::WrFlushErr]);
    assert_eq!((d.id, d.status, d.qp_num), (10, bad, b.qp.qp_num()), "the first failure, named by the first id");
    assert_eq!(d.value.get(0).unwrap().byte_len() as usize, LEN);
    assert_eq!(d.value.get(0).unwrap().buf()[..], bytes(0, 0, LEN)[..]);
    let (e, chain) = d.result().unwrap_err().into_parts();
    assert!(matches!(e, rdma_verbs::Error::WorkCompletion { id: Some(10), status, .. } if status == bad), "{e}");
    assert_eq!(chain.len(), 3);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn dropping_a_receive_chain_queue_with_chains_posted_and_one_half_complete_is_sound() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, b) = rc_pair::<Chunk>(QpAccess::empty());
    let mut b = receiving(b, 64);
    posted(b.rq.post(b.rq.prepare_chain(recvs(&pd, 4, LEN, 0)).unwrap()));
    posted(b.rq.post(b.rq.prepare_chain(recvs(&pd, 3, LEN, 4)).unwrap()));
    // Two of the first chain's receives complete; the rest stays posted.
    let mut srcs = chunks(&pd, 2, LEN, AccessFlags::LOCAL_WRITE);
    send_round(&mut a, &mut srcs, 0, &[LEN, LEN]);
    let mut came = Vec::new();
    for mut wc in poll_n(&mut b, 2) {
        b.rq.complete(&mut wc, |d| came.push(d)).unwrap();
    }
    assert!(came.is_empty());
    assert_eq!(b.rq.outstanding(), 5);
    // The queue goes with two chains posted (one half complete): they are kept until the
    // QP is destroyed. The receive side can be claimed again meanwhile.
    let RSide { cq, _sq, rq, qp, _link } = b;
    drop(rq);
    let again = qp.recv_chain_queue_with_depth::<Chunk>(8).unwrap();
    assert_eq!(again.outstanding(), 0);
    drop((again, qp, _sq, cq, a));
}

/// Where the sequence numbers wrap: the low 40 bits of a `wr_id` start again from 0.
const WRAP: u64 = 1 << 40;

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_receive_chain_whose_sequence_numbers_wrap_inside_it_comes_back_whole_with_every_receives_bytes() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, b) = rc_pair::<Chunk>(QpAccess::empty());
    let mut b = receiving(b, 64);
    let mut srcs = chunks(&pd, 32, LEN, AccessFlags::LOCAL_WRITE);
    let mut chain = Some(b.rq.prepare_chain(recvs(&pd, 32, LEN, 100)).unwrap());
    // Each round starts where the wrap falls inside the chain: after its 5th receive,
    // taken in polls of 4 (the wrap inside the second); after its 31st, taken one by one;
    // after its 17th, all 32 taken in one call.
    for (r, start) in [(0u64, WRAP - 5), (1, 2 * WRAP - 31), (2, 3 * WRAP - 17)] {
        b.rq.restart_sequence_at(start).unwrap();
        posted(b.rq.post(chain.take().unwrap()));
        let lens: Vec<usize> = (0..32).map(|k| len_of(r, k)).collect();
        assert!(send_round(&mut a, &mut srcs, r, &lens).iter().all(|s| *s == WcStatus::Success));
        let mut wcs = poll_n(&mut b, 32);
        let low: Vec<u64> = wcs.iter().map(|wc| wc.wr_id() % WRAP).collect();
        let want: Vec<u64> = (start..start + 32).map(|s| s % WRAP).collect();
        assert_eq!(low, want, "round {r}: the wr_ids' sequence numbers wrap");
        let mut came: Vec<Done<PreparedRecvChain<Chunk>>> = Vec::new();
        match r {
            0 => {
                for run in wcs.chunks_mut(4) {
                    assert_eq!(b.rq.complete_all(run, |d| came.push(d)).unwrap(), 4);
                }
            }
            1 => {
                for wc in wcs.iter_mut() {
                    assert_eq!(b.rq.complete(wc, |d| came.push(d)).unwrap(), 1);
                }
            }
            _ => assert_eq!(b.rq.complete_all(&mut wcs, |d| came.push(d)).unwrap(), 32),
        }
        assert!(wcs.iter().all(|wc| wc.wr_id() == 0), "round {r}: every completion is taken");
        assert_eq!(came.len(), 1, "round {r}: the chain comes back once");
        let d = came.pop().unwrap();
        assert_eq!((d.id, d.status, d.byte_len as usize), (100, WcStatus::Success, len_of(r, 31)));
        let c = d.result().unwrap().value;
        check_arrived(&c, r, 100);
        chain = Some(c);
    }
    // Only an empty queue restarts.
    posted(b.rq.post(chain.take().unwrap()));
    assert!(b.rq.restart_sequence_at(0).is_err());
}
