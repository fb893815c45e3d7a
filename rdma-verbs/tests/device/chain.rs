//! Prepared chains (`SendChainQueue`): requests checked and built once, linked, posted whole
//! and handed back whole; every byte that arrives is compared with what was written.

use rdma_verbs::{AccessFlags, Chunk, CompletionQueue, Error, ProtectionDomain, QpAccess, QueuePair, Refused, SendOps};
use rdma_verbs::{
    Done, PreparedSendChain, RecvQueue, RemoteMr, SendChainQueue, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use crate::datapath::{chunks, poll_one, rc_pair, rc_pair_with, Side};
use crate::prepared::{bytes, posted, read_back, target, Target};
use crate::LeakCheck;

const LEN: usize = 64;

/// A side whose send side is claimed for chains.
struct CSide {
    cq: CompletionQueue,
    cq_: SendChainQueue<Chunk>,
    _rq: RecvQueue<Chunk>,
    _qp: QueuePair,
    _link: std::sync::Arc<crate::Link>,
}

fn chained(side: Side<Chunk>, depth: u32) -> CSide {
    let Side { cq, sq, rq, qp, link } = side;
    drop(sq);
    let cq_ = qp.send_chain_queue_with_depth::<Chunk>(depth).unwrap();
    CSide { cq, cq_, _rq: rq, _qp: qp, _link: link }
}

/// Polls until `n` chains have come back.
fn back(s: &mut CSide, n: usize) -> Vec<Done<PreparedSendChain<Chunk>>> {
    let mut out = Vec::new();
    while out.len() < n {
        let mut wc = poll_one(&mut s.cq);
        s.cq_.complete(&mut wc, |d| out.push(d)).unwrap();
    }
    out
}

/// `n` WRITEs with ids 0..n: request `k` writes `LEN` bytes of its own chunk (round 0's
/// bytes for `k`) to `k * LEN` of `t`.
fn writes(pd: &ProtectionDomain, t: &Target, n: usize) -> Vec<SendWr<Chunk>> {
    chunks(pd, n, LEN, AccessFlags::LOCAL_WRITE)
        .into_iter()
        .enumerate()
        .map(|(k, mut c)| {
            c.copy_from_slice(&bytes(0, k as u64, LEN));
            SendWr::write(c, 0..LEN, t.remote().unwrap().slice((k * LEN) as u64..).unwrap()).id(k as u64)
        })
        .collect()
}

/// The caller's id of a work request, as its Debug form shows it.
fn id_of(wr: &SendWr<Chunk>) -> u64 {
    let text = format!("{wr:?}");
    let at = text.find(" id: ").expect("a SendWr's Debug shows its id") + 5;
    text[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_prepared_chain_of_32_writes_lands_every_requests_bytes_each_round_and_comes_back_whole_once() {
    let _leaks = LeakCheck::new();
    let (pd, a, _b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    let mut a = chained(a, 64);
    let mut t = target(&pd, 32 * LEN);
    let mut chain = a.cq_.prepare_chain(writes(&pd, &t, 32)).unwrap();
    assert_eq!(chain.len(), 32);
    for r in 0..20u64 {
        t.write_at(0, &[0u8; 32 * LEN]).unwrap();
        // Requests 0 and 17 change their bytes every round (checked again, linked again).
        for k in [0, 17] {
            chain.get_mut(k).unwrap().bytes_mut()[..LEN].copy_from_slice(&bytes(r + 1, k as u64, LEN));
        }
        posted(a.cq_.post(chain));
        assert_eq!(a.cq_.outstanding(), 32, "one post, 32 C requests outstanding");
        // 32 signaled completions; the chain comes back with the last, once.
        let (mut came, mut finished) = (Vec::new(), 0);
        for _ in 0..32 {
            let mut wc = poll_one(&mut a.cq);
            finished += a.cq_.complete(&mut wc, |d| came.push(d)).unwrap();
        }
        assert_eq!((finished, came.len(), a.cq_.outstanding()), (32, 1, 0), "round {r}");
        let d = came.pop().unwrap();
        assert_eq!((d.id, d.status, d.op), (0, WcStatus::Success, WcOpcode::RdmaWrite), "round {r}");
        for k in 0..32u64 {
            let want = if k == 0 || k == 17 { bytes(r + 1, k, LEN) } else { bytes(0, k, LEN) };
            assert_eq!(read_back(&t, k as usize * LEN, LEN), want, "round {r}: request {k}'s bytes");
        }
        chain = d.value;
    }
    // Request 5 replaced by another prepared request (another chunk, the same target):
    // the chain's C requests are copied and linked again, so the new one's bytes land.
    let mut other = chunks(&pd, 1, LEN, AccessFlags::LOCAL_WRITE).pop().unwrap();
    other.copy_from_slice(&bytes(99, 5, LEN));
    let to = t.remote().unwrap().slice((5 * LEN) as u64..).unwrap();
    let one = a.cq_.prepare_chain([SendWr::write(other, 0..LEN, to).id(5)]).unwrap();
    let old = std::mem::replace(chain.get_mut(5).unwrap(), one.into_parts().pop().unwrap());
    assert_eq!(old.id(), 5);
    t.write_at(0, &[0u8; 32 * LEN]).unwrap();
    posted(a.cq_.post(chain));
    chain = back(&mut a, 1).pop().unwrap().result().unwrap().value;
    for k in 0..32u64 {
        let want = match k {
            5 => bytes(99, 5, LEN),
            0 | 17 => bytes(20, k, LEN),
            _ => bytes(0, k, LEN),
        };
        assert_eq!(read_back(&t, k as usize * LEN, LEN), want, "after the swap: request {k}'s bytes");
    }
    // Taken apart and chained again as 31 and 1, posted in one batch: one provider call.
    let mut wrs: Vec<_> = chain.into_parts().into_iter().map(|p| p.into_wr()).collect();
    let last = a.cq_.prepare_chain(wrs.split_off(31)).unwrap();
    let head = a.cq_.prepare_chain(wrs).unwrap();
    t.write_at(0, &[0u8; 32 * LEN]).unwrap();
    assert_eq!(a.cq_.post_batch([head, last]).unwrap(), 2, "two chains, 32 C requests");
    let came = back(&mut a, 2);
    assert_eq!(came.iter().map(|d| (d.id, d.value.len())).collect::<Vec<_>>(), [(0, 31), (31, 1)]);
    assert_eq!(read_back(&t, 17 * LEN, LEN), bytes(20, 17, LEN), "request 17 kept its last bytes");
    assert_eq!(read_back(&t, 31 * LEN, LEN), bytes(0, 31, LEN));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_chain_whose_middle_write_is_refused_by_the_peer_comes_back_once_with_that_first_failure() {
    let _leaks = LeakCheck::new();
    // Its completions taken one by one (`complete`), then all at once (`complete_all`).
    for all_at_once in [false, true] {
        let (pd, a, _b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
        let mut a = chained(a, 64);
        let t = target(&pd, 4 * LEN);
        let good = t.remote().unwrap();
        let bad = RemoteMr { rkey: good.rkey ^ 0x5a00, ..good };
        let wrs = chunks(&pd, 4, LEN, AccessFlags::LOCAL_WRITE).into_iter().enumerate().map(|(k, mut c)| {
            c.copy_from_slice(&bytes(0, k as u64, LEN));
            let to = if k == 2 { bad } else { good.slice((k * LEN) as u64..).unwrap() };
            SendWr::write(c, 0..LEN, to).id(10 + k as u64)
        });
        let chain = a.cq_.prepare_chain(wrs).unwrap();
        posted(a.cq_.post(chain));
        let (mut came, mut seen) = (Vec::new(), Vec::new());
        if all_at_once {
            let mut wcs: Vec<WorkCompletion> = (0..4).map(|_| poll_one(&mut a.cq)).collect();
            seen.extend(wcs.iter().map(|wc| wc.status()));
            assert_eq!(a.cq_.complete_all(&mut wcs, |d| came.push(d)).unwrap(), 4);
        }
        while a.cq_.outstanding() > 0 {
            let mut wc = poll_one(&mut a.cq);
            seen.push(wc.status());
            a.cq_.complete(&mut wc, |d| came.push(d)).unwrap();
        }
        assert_eq!(came.len(), 1, "the chain comes back once: {seen:?}");
        let d = came.pop().unwrap();
        assert_eq!(d.status, WcStatus::RemAccessErr, "the first failure, not the flush after it: {seen:?}");
        assert_eq!((d.id, d.value.len()), (10, 4));
        let e = d.result().unwrap_err().into_parts().0.to_string();
        assert!(e.contains("RDMA WRITE id 10"), "{e}");
        let before = [bytes(0, 0, LEN), bytes(0, 1, LEN)].concat();
        assert_eq!(read_back(&t, 0, 2 * LEN), before, "the two before it landed");
        assert_eq!(read_back(&t, 2 * LEN, 2 * LEN), vec![0; 2 * LEN], "the refused one and the flushed one did not");
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_chain_is_refused_whole_before_c_when_empty_too_long_bad_full_or_for_another_pd() {
    let _leaks = LeakCheck::new();
    let (pd, a, b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    let mut a = chained(a, 8);
    let t = target(&pd, 4096);
    let by = |e: &Error, method: &str| {
        assert!(matches!(e, Error::InvalidArgument { verb, .. } if verb.name() == method), "by {method}: {e:?}");
        e.to_string()
    };
    let (prepare, post) = ("SendQueue::prepare_chain", "SendQueue::post");
    let Refused { error: e, value } = a.cq_.prepare_chain(Vec::new()).unwrap_err();
    assert!(by(&e, prepare).contains("at least one"), "{e}");
    assert!(value.is_empty());
    // Longer than the queue is deep: every request back, in order.
    let Refused { error: e, value } = a.cq_.prepare_chain(writes(&pd, &t, 9)).unwrap_err();
    assert!(by(&e, prepare).contains("at most 8 requests"), "{e}");
    assert_eq!(value.iter().map(id_of).collect::<Vec<_>>(), (0..9).collect::<Vec<_>>());
    // One bad request (a range past its buffer): all back, in order.
    let mut wrs = writes(&pd, &t, 4);
    let c = chunks(&pd, 1, LEN, AccessFlags::LOCAL_WRITE).pop().unwrap();
    wrs.insert(2, SendWr::write(c, 0..LEN + 1, t.remote().unwrap()).id(99));
    let Refused { error: e, value } = a.cq_.prepare_chain(wrs).unwrap_err();
    assert!(by(&e, prepare).contains("outside a 64-byte buffer"), "{e}");
    assert_eq!(value.iter().map(id_of).collect::<Vec<_>>(), [0, 1, 99, 2, 3]);
    // Four chains of one outstanding on a queue 8 deep; a chain of 6 does not fit: back whole.
    b.qp.reset().unwrap(); // nothing completes: they stay outstanding
    let ones: Vec<_> = writes(&pd, &t, 4).into_iter().map(|w| a.cq_.prepare_chain([w]).unwrap()).collect();
    assert_eq!(a.cq_.post_batch(ones).unwrap(), 4);
    let six = a.cq_.prepare_chain(writes(&pd, &t, 6)).unwrap();
    let Refused { error: e, value: six } = a.cq_.post(six).unwrap_err();
    assert!(by(&e, post).contains("nothing posted: the queue is full"), "{e}");
    assert_eq!((six.len(), a.cq_.outstanding()), (6, 4));
    // Built for a QP of another protection domain, or with a part from one put in its
    // place: refused before C, back whole.
    let (pd2, c, d) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    let (c, d) = (chained(c, 64), crate::prepared::prepared_side(d));
    let t2 = target(&pd2, 4096);
    let foreign = c.cq_.prepare_chain(writes(&pd2, &t2, 3)).unwrap();
    let Refused { error: e, value: foreign } = a.cq_.post(foreign).unwrap_err();
    assert!(by(&e, post).contains("another protection domain"), "{e}");
    assert_eq!((foreign.len(), a.cq_.outstanding()), (3, 4));
    // Prepared for a deeper queue, wider than this one: named so, not "full".
    let wide = c.cq_.prepare_chain(writes(&pd2, &t2, 9)).unwrap();
    let Refused { error: e, value: wide } = a.cq_.post(wide).unwrap_err();
    assert!(by(&e, post).contains("a chain of 9 requests never fits this queue, 8 deep"), "{e}");
    assert_eq!((wide.len(), a.cq_.outstanding()), (9, 4));
    let mut two = a.cq_.prepare_chain(writes(&pd, &t, 2)).unwrap();
    let stranger = d.pq.prepare(writes(&pd2, &t2, 1).pop().unwrap()).unwrap();
    let mine = std::mem::replace(two.get_mut(1).unwrap(), stranger);
    let Refused { error: e, value: mut two } = a.cq_.post(two).unwrap_err();
    assert!(by(&e, post).contains("another protection domain"), "{e}");
    assert_eq!((two.len(), a.cq_.outstanding()), (2, 4));
    // Put back, it is taken again (the four before it still outstanding: 6 of 8).
    let _stranger = std::mem::replace(two.get_mut(1).unwrap(), mine);
    posted(a.cq_.post(two));
    assert_eq!(a.cq_.outstanding(), 6);
    // Dropped with six C requests outstanding: kept until the QP is gone (the leak check).
    drop(a.cq_);
    drop((c, d, foreign, six, wide));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn complete_all_takes_a_polls_completions_at_once_and_stops_at_a_strangers_leaving_the_rest() {
    let _leaks = LeakCheck::new();
    let (pd, a, _b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    let mut a = chained(a, 64);
    let t = target(&pd, 8 * LEN);
    // A chain of 4 and then a chain of 2 in one post: 6 completions, 2 chains back.
    let mut wrs = writes(&pd, &t, 6);
    let two = a.cq_.prepare_chain(wrs.split_off(4)).unwrap();
    let four = a.cq_.prepare_chain(wrs).unwrap();
    assert_eq!(a.cq_.post_batch([four, two]).unwrap(), 2);
    let mut wcs: Vec<WorkCompletion> = (0..6).map(|_| poll_one(&mut a.cq)).collect();
    // A completion that is not this queue's after the first chain's: the four before it
    // are taken (the first chain comes back), it and the rest are left as they were.
    wcs.insert(4, WorkCompletion::EMPTY);
    let mut came = Vec::new();
    let e = a.cq_.complete_all(&mut wcs, |d| came.push(d)).unwrap_err();
    assert!(e.to_string().contains("is not outstanding on this send queue"), "{e}");
    assert_eq!(came.iter().map(|d| (d.id, d.value.len())).collect::<Vec<_>>(), [(0, 4)]);
    assert_eq!(a.cq_.outstanding(), 2);
    assert!(wcs[5..].iter().all(|wc| wc.wr_id() != 0), "the rest are not taken");
    assert_eq!(a.cq_.complete_all(&mut wcs[5..], |d| came.push(d)).unwrap(), 2);
    assert_eq!(came.iter().map(|d| (d.id, d.value.len())).collect::<Vec<_>>(), [(0, 4), (4, 2)]);
    assert_eq!(a.cq_.outstanding(), 0);
    // Taken once: the same completions again are refused, and nothing comes back.
    assert!(a.cq_.complete_all(&mut wcs[..1], |d| came.push(d)).is_err());
    assert_eq!(came.len(), 2);
    for k in 0..6 {
        assert_eq!(read_back(&t, k * LEN, LEN), bytes(0, k as u64, LEN), "request {k}'s bytes");
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_chains_completions_split_across_polls_and_calls_bring_it_back_once_and_a_drop_mid_chain_frees_it_safely() {
    let _leaks = LeakCheck::new();
    let (pd, a, _b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    let mut a = chained(a, 64);
    let t = target(&pd, 8 * LEN);
    // A chain of 5 and a chain of 3 in one post: 8 completions, 2 chains back.
    let mut wrs = writes(&pd, &t, 8);
    let three = a.cq_.prepare_chain(wrs.split_off(5)).unwrap();
    let five = a.cq_.prepare_chain(wrs).unwrap();
    assert_eq!(a.cq_.post_batch([five, three]).unwrap(), 2);
    assert_eq!(a.cq_.outstanding(), 8);
    let mut wcs: Vec<WorkCompletion> = (0..8).map(|_| poll_one(&mut a.cq)).collect();
    let mut came = Vec::new();
    // Two of the first chain's five at once: nothing back yet.
    assert_eq!(a.cq_.complete_all(&mut wcs[..2], |d| came.push(d)).unwrap(), 2);
    assert!(came.is_empty());
    assert_eq!(a.cq_.outstanding(), 6);
    // The third alone (`complete`), then the last two of it and the first of the next
    // chain at once: the first chain comes back, once, whole.
    assert_eq!(a.cq_.complete(&mut wcs[2], |d| came.push(d)).unwrap(), 1);
    assert!(came.is_empty());
    assert_eq!(a.cq_.complete_all(&mut wcs[3..6], |d| came.push(d)).unwrap(), 3);
    assert_eq!(came.iter().map(|d| (d.id, d.value.len(), d.status)).collect::<Vec<_>>(), [(0, 5, WcStatus::Success)]);
    assert_eq!(a.cq_.outstanding(), 2);
    // Taken once: a completion already taken is refused, and changes nothing.
    assert!(a.cq_.complete(&mut wcs[4], |d| came.push(d)).is_err());
    assert_eq!((came.len(), a.cq_.outstanding()), (1, 2));
    for k in 0..8 {
        assert_eq!(read_back(&t, k * LEN, LEN), bytes(0, k as u64, LEN), "request {k}'s bytes");
    }
    // The queue dropped with the second chain one C request in: its requests go to the QP,
    // freed once it is destroyed (the leak check counts every chunk back).
    drop(a);
}

/// Where the sequence numbers wrap: the low 40 bits of a `wr_id` start again from 0.
const WRAP: u64 = 1 << 40;

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn chains_whose_sequence_numbers_wrap_inside_them_land_every_byte_and_come_back_whole_once() {
    let _leaks = LeakCheck::new();
    let (pd, a, _b) = rc_pair::<Chunk>(QpAccess::REMOTE_WRITE);
    let mut a = chained(a, 64);
    let mut t = target(&pd, 16 * LEN);
    // Two chains of 8 in one post, the wrap after the first one's third request: the
    // first chain's wr_ids are stamped one by one, the second's counted up from its first.
    let mut wrs = writes(&pd, &t, 16);
    let mut second = Some(a.cq_.prepare_chain(wrs.split_off(8)).unwrap());
    let mut first = Some(a.cq_.prepare_chain(wrs).unwrap());
    // Round 0: both chains' completions in one `complete_all`; round 1 (the wrap now after
    // the first chain's last request, inside the poll): one `complete` each.
    for (r, start) in [(0u64, WRAP - 3), (1, 2 * WRAP - 8)] {
        t.write_at(0, &[0u8; 16 * LEN]).unwrap();
        a.cq_.restart_sequence_at(start).unwrap();
        assert_eq!(a.cq_.post_batch([first.take().unwrap(), second.take().unwrap()]).unwrap(), 2);
        let mut wcs: Vec<WorkCompletion> = (0..16).map(|_| poll_one(&mut a.cq)).collect();
        let low: Vec<u64> = wcs.iter().map(|wc| wc.wr_id() % WRAP).collect();
        let want: Vec<u64> = (start..start + 16).map(|s| s % WRAP).collect();
        assert_eq!(low, want, "round {r}: the wr_ids' sequence numbers wrap");
        let mut came = Vec::new();
        if r == 0 {
            assert_eq!(a.cq_.complete_all(&mut wcs, |d| came.push(d)).unwrap(), 16);
        } else {
            for wc in wcs.iter_mut() {
                assert_eq!(a.cq_.complete(wc, |d| came.push(d)).unwrap(), 1);
            }
        }
        assert_eq!(
            came.iter().map(|d| (d.id, d.value.len(), d.status)).collect::<Vec<_>>(),
            [(0, 8, WcStatus::Success), (8, 8, WcStatus::Success)]
        );
        assert_eq!(a.cq_.outstanding(), 0);
        for k in 0..16 {
            assert_eq!(read_back(&t, k * LEN, LEN), bytes(0, k as u64, LEN), "round {r}: request {k}'s bytes");
        }
        let mut it = came.into_iter().map(|d| d.result().unwrap().value);
        (first, second) = (it.next(), it.next());
    }
    // Only an empty queue restarts.
    posted(a.cq_.post(first.take().unwrap()));
    assert!(a.cq_.restart_sequence_at(0).is_err());
    back(&mut a, 1);
}

/// On a classic QP and on one built with extended send ops (each with a loop of its own
/// for batches built at each post).
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn send_batches_built_at_each_post_land_every_byte_and_come_back_once_where_sequence_numbers_wrap_and_not() {
    let _leaks = LeakCheck::new();
    for extended in [false, true] {
        let (pd, mut a, _b) = if extended {
            rc_pair_with::<Chunk>(QpAccess::REMOTE_WRITE, |q| q.extended_send_ops(SendOps::RDMA_WRITE))
        } else {
            rc_pair::<Chunk>(QpAccess::REMOTE_WRITE)
        };
        assert_eq!(a.sq.uses_extended_api(), extended);
        let mut t = target(&pd, 16 * LEN);
        let mut wrs = writes(&pd, &t, 16);
        // A batch whose sequence numbers wrap inside it, one that ends just before the
        // wrap (both through the queue's shared loop: a batch that could wrap) and one far
        // from it (the lean loop of the QP's API, its wr_ids a running count).
        for (r, start) in [(0u64, WRAP - 3), (1, 2 * WRAP - 16), (2, 5)] {
            let r = format!("extended {extended}, round {r}");
            t.write_at(0, &[0u8; 16 * LEN]).unwrap();
            a.sq.restart_sequence_at(start).unwrap();
            assert_eq!(a.sq.post_batch(wrs.drain(..)).unwrap(), 16, "{r}");
            let (mut low, mut came) = (Vec::new(), Vec::new());
            for _ in 0..16 {
                let mut wc = poll_one(&mut a.cq);
                low.push(wc.wr_id() % WRAP);
                assert_eq!(a.sq.complete(&mut wc, |d| came.push(d)).unwrap(), 1, "{r}");
            }
            let want: Vec<u64> = (start..start + 16).map(|s| s % WRAP).collect();
            assert_eq!(low, want, "{r}: the wr_ids' sequence numbers");
            assert_eq!(
                came.iter().map(|d| (d.id, d.status)).collect::<Vec<_>>(),
                (0..16).map(|k| (k, WcStatus::Success)).collect::<Vec<_>>(),
                "{r}: each request back once, in order"
            );
            assert_eq!(a.sq.outstanding(), 0);
            for k in 0..16 {
                assert_eq!(read_back(&t, k * LEN, LEN), bytes(0, k as u64, LEN), "{r}: request {k}'s bytes");
            }
            let remote = t.remote().unwrap();
            wrs = came
                .into_iter()
                .enumerate()
                .map(|(k, d)| SendWr::write(d.value, 0..LEN, remote.slice((k * LEN) as u64..).unwrap()).id(k as u64))
                .collect();
        }
    }
}
