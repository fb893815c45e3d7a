//! Awaited queues (`AsyncSendQueue`, `AsyncRecvQueue`) on a real device: requests handed
//! back by ticket or in order with the bytes checked, on tokio and on async-io; what they
//! refuse; a dropped await; no allocation per request; and a peer process killed while
//! tasks await.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_verbs::{
    AccessFlags, AsyncCq, AsyncRecvQueue, AsyncSendQueue, Chunk, CompletionQueue, Done, InitAttr, ProtectionDomain,
    QpType, QueuePair, Readiness, SendWr, Ticket, WcOpcode, WcStatus,
};

use crate::alloc::heap_ops;
use crate::datapath::chunks;
use crate::faults::{failure_bound, qp_peer, qp_peer_connected, role, PEER_RECVS, SEND_LEN};
use crate::{connect_rc, open, LeakCheck, Link};

/// Bytes per message; requests each queue may hold.
const LEN: usize = 512;
const DEPTH: u32 = 16;

/// The bytes of message `n`.
fn message(n: u64) -> Vec<u8> {
    (0..LEN).map(|i| (i as u64).wrapping_mul(13).wrapping_add(n * 3) as u8).collect()
}

/// One end of a connection: its QP and its two queues, each awaited on a CQ of its own.
struct End<R> {
    sq: AsyncSendQueue<Chunk, R>,
    rq: AsyncRecvQueue<Chunk, R>,
    _qp: QueuePair,
    _link: Arc<Link>,
}

/// A QP whose send and receive sides each complete on a channel CQ of their own.
fn qp_with_own_cqs(pd: &ProtectionDomain) -> (QueuePair, CompletionQueue, CompletionQueue) {
    let ctx = pd.context();
    let scq = CompletionQueue::builder(ctx, DEPTH).with_channel().build().unwrap();
    let rcq = CompletionQueue::builder(ctx, DEPTH).with_channel().build().unwrap();
    let qp = QueuePair::builder(pd, QpType::Rc, &scq, &rcq).max_send_wr(DEPTH).max_recv_wr(DEPTH).build().unwrap();
    (qp, scq, rcq)
}

/// Two connected RC QPs, their queues awaited through the reactor `wrap` makes.
fn pair<R: Readiness>(
    pd: &ProtectionDomain,
    wrap: impl Fn(CompletionQueue) -> rdma_verbs::Result<AsyncCq<R>>,
) -> (End<R>, End<R>) {
    let ((a, acq), (b, bcq)) = {
        let (a, sa, ra) = qp_with_own_cqs(pd);
        let (b, sb, rb) = qp_with_own_cqs(pd);
        ((a, (sa, ra)), (b, (sb, rb)))
    };
    let link = Arc::new(connect_rc(&a, &b, &InitAttr::default()));
    let end = |qp: QueuePair, (scq, rcq): (CompletionQueue, CompletionQueue)| End {
        sq: AsyncSendQueue::new(qp.send_queue().unwrap(), wrap(scq).unwrap()).unwrap(),
        rq: AsyncRecvQueue::new(qp.recv_queue().unwrap(), wrap(rcq).unwrap()).unwrap(),
        _qp: qp,
        _link: Arc::clone(&link),
    };
    (end(a, acq), end(b, bcq))
}

/// A receive that arrived as message `n`, checked byte for byte.
fn check_received(got: Done<Chunk>, n: u64) -> Chunk {
    let got = got.result().unwrap();
    assert_eq!((got.id, got.byte_len, got.op), (100 + n, LEN as u32, WcOpcode::Recv));
    assert!(got.value[..LEN] == message(n)[..], "message {n}: the bytes differ");
    got.value
}

/// Eight messages from A to B. A posts four one by one and four in a batch, then awaits
/// the sixth by its ticket before any other, and the rest in order (`next` skips the one
/// already handed back). B awaits its last receive first, then the rest in order, and
/// parks before anything is sent. Every
/// message is checked byte for byte, every buffer comes back. Returns how often the tasks
/// parked.
async fn tickets_and_order<R: Readiness>(
    pd: &ProtectionDomain,
    wrap: impl Fn(CompletionQueue) -> rdma_verbs::Result<AsyncCq<R>>,
) -> u64 {
    let (mut a, mut b) = pair(pd, wrap);
    let mut bufs = chunks(pd, 16, LEN, AccessFlags::LOCAL_WRITE);
    let recv_tickets: Vec<Ticket> = (0..8).map(|n| b.rq.post(bufs.pop().unwrap(), 0..LEN, 100 + n).unwrap()).collect();
    let send = |n: u64, mut buf: Chunk| {
        buf[..LEN].copy_from_slice(&message(n));
        SendWr::send(buf, 0..LEN).id(n)
    };
    let src: Vec<Chunk> = bufs.drain(..8).collect();
    let sender = async {
        // Let B's task park on its channel first.
        futures_lite::future::yield_now().await;
        let mut src = src.into_iter().zip(0..);
        let mut tickets: Vec<Ticket> = src.by_ref().take(4).map(|(b, n)| a.sq.post(send(n, b)).unwrap()).collect();
        tickets.extend(a.sq.post_batch(src.map(|(b, n)| send(n, b))).unwrap());
        assert_eq!(tickets.iter().map(Ticket::seq).collect::<Vec<_>>(), (0..8).collect::<Vec<_>>());
        assert_eq!(a.sq.outstanding(), 8);
        let sixth = a.sq.wait(tickets.swap_remove(5)).await.unwrap().result().unwrap();
        assert_eq!((sixth.id, sixth.op), (5, WcOpcode::Send));
        let mut back = vec![sixth.value];
        let mut ids = vec![];
        for _ in 0..7 {
            let d = a.sq.next().await.unwrap().result().unwrap();
            ids.push(d.id);
            back.push(d.value);
        }
        assert_eq!(ids, [0, 1, 2, 3, 4, 6, 7], "next hands back in posting order, skipping the one taken");
        back
    };
    let receiver = async {
        let mut recv_tickets = recv_tickets;
        let mut back = vec![check_received(b.rq.wait(recv_tickets.pop().unwrap()).await.unwrap(), 7)];
        for n in 0..7 {
            back.push(check_received(b.rq.next().await.unwrap(), n));
        }
        back
    };
    let (received, sent) = futures_lite::future::zip(receiver, sender).await;
    assert_eq!((sent.len(), received.len()), (8, 8), "every buffer came back");
    assert_eq!((a.sq.outstanding(), b.rq.outstanding()), (0, 0));
    assert!(b.rq.waits() > 0, "B's task never parked: the reactor path was not exercised");
    a.sq.waits() + b.rq.waits()
}

/// On tokio's current-thread runtime.
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn awaited_queues_hand_back_by_ticket_or_in_order_with_the_bytes_checked_on_tokio() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    let waits = rt.block_on(tickets_and_order(&pd, AsyncCq::tokio));
    eprintln!("tokio: 8 messages, {waits} waits");
}

/// The same on async-io's reactor (smol, async-std).
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn awaited_queues_hand_back_by_ticket_or_in_order_with_the_bytes_checked_on_async_io() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let waits = async_io::block_on(tickets_and_order(&pd, AsyncCq::async_io));
    eprintln!("async-io: 8 messages, {waits} waits");
}

/// Polls `f` once: `Some` when it finished at once.
fn now_or_never<F: Future>(f: F) -> Option<F::Output> {
    futures_lite::future::block_on(futures_lite::future::poll_once(f))
}

/// What the awaited queues refuse, each with a clear error and nothing lost: another CQ
/// than the QP side's, a CQ other queues use, a claim on a CQ an awaited queue owns, a
/// post past the depth while finished requests wait unclaimed, an await with nothing
/// posted, a ticket of another queue.
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn awaited_queues_refuse_what_would_lose_a_completion_or_wait_for_ever() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    let _guard = rt.enter();

    // The receive CQ offered to the send side: refused, both back.
    let (qp, scq, rcq) = qp_with_own_cqs(&pd);
    let r = AsyncSendQueue::new(qp.send_queue::<Chunk>().unwrap(), AsyncCq::tokio(rcq).unwrap()).unwrap_err();
    assert!(r.error.to_string().contains("this CQ is another"), "{}", r.error);
    let (sq, rcq) = r.value;
    drop((sq, rcq, scq, qp));

    // One CQ for both sides, both claimed: the send side's is not its own.
    let cq = CompletionQueue::builder(&ctx, 2 * DEPTH).with_channel().build().unwrap();
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(DEPTH).max_recv_wr(DEPTH).build().unwrap();
    let rq = qp.recv_queue::<Chunk>().unwrap();
    let r = AsyncSendQueue::new(qp.send_queue::<Chunk>().unwrap(), AsyncCq::tokio(cq).unwrap()).unwrap_err();
    assert!(r.error.to_string().contains(&format!("other queues reserved {DEPTH} of its entries")), "{}", r.error);
    drop((r, rq, qp));

    // An awaited queue owns its CQ: another QP's queue cannot claim room on it afterwards.
    let scq = CompletionQueue::builder(&ctx, 2 * DEPTH).with_channel().build().unwrap();
    let rcq = CompletionQueue::builder(&ctx, 2 * DEPTH).build().unwrap();
    let build = || QueuePair::builder(&pd, QpType::Rc, &scq, &rcq).max_send_wr(DEPTH).max_recv_wr(1).build().unwrap();
    let (one, two) = (build(), build());
    let mut sq = AsyncSendQueue::new(one.send_queue::<Chunk>().unwrap(), AsyncCq::tokio(scq).unwrap()).unwrap();
    let e = two.send_queue_with_depth::<Chunk>(1).unwrap_err().to_string();
    assert!(e.contains("reserved by other queues"), "{e}");
    let (a, mut b) = pair(&pd, AsyncCq::tokio);

    // Nothing posted: an await would never end.
    let e = now_or_never(sq.next()).expect("answered at once").unwrap_err().to_string();
    assert!(e.contains("nothing is posted"), "{e}");
    // A ticket of another queue.
    let mut bufs = chunks(&pd, DEPTH as usize + 2, LEN, AccessFlags::LOCAL_WRITE);
    let foreign = b.rq.post(bufs.pop().unwrap(), 0..LEN, 1).unwrap();
    let e = now_or_never(sq.wait(foreign)).expect("answered at once").unwrap_err().to_string();
    assert!(e.contains("was not issued by this queue"), "{e}");
    drop((a, b, sq, one, two, rcq));

    // Past the depth while finished requests wait in their slots: refused with the
    // request back; after one is awaited, a post goes in.
    let (mut a, mut b) = pair(&pd, AsyncCq::tokio);
    for n in 0..u64::from(DEPTH) {
        b.rq.post(bufs.pop().unwrap(), 0..LEN, 100 + n).unwrap();
    }
    let mut src = chunks(&pd, DEPTH as usize + 1, LEN, AccessFlags::LOCAL_WRITE);
    for n in 0..u64::from(DEPTH) {
        a.sq.post(SendWr::send(src.pop().unwrap(), 0..LEN).id(n)).unwrap();
    }
    rt.block_on(async {
        assert_eq!(a.sq.outstanding(), DEPTH as usize);
        let first = a.sq.next().await.unwrap();
        assert_eq!(first.id, 0);
        // B hands back its first receive and posts it again, for the SEND below.
        let r0 = b.rq.next().await.unwrap().result().unwrap();
        b.rq.post(r0.value, 0..LEN, 200).unwrap();
        a.sq.post(SendWr::send(first.value, 0..LEN).id(99)).unwrap();
        // DEPTH posted or finished and not handed back: refused, the request back.
        let r = a.sq.post(SendWr::send(src.pop().unwrap(), 0..LEN).id(1000)).unwrap_err();
        assert!(r.error.to_string().contains("not yet awaited"), "{}", r.error);
        assert_eq!(r.value.into_buf().len(), LEN, "the refused request came back");
        let mut ids = vec![];
        for _ in 0..DEPTH {
            ids.push(a.sq.next().await.unwrap().result().unwrap().id);
            assert!(b.rq.next().await.unwrap().is_success());
        }
        assert_eq!(ids, (1..u64::from(DEPTH)).chain([99]).collect::<Vec<_>>());
    });
}

/// A `wait` dropped while its receive is posted (a timeout) loses nothing: the receive
/// comes back through `next` once the peer sends, bytes intact. A queue dropped with
/// receives posted keeps their buffers alive with the QP: the peer's SENDs still land in
/// them and succeed, and nothing leaks.
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_dropped_wait_loses_nothing_and_a_dropped_queue_keeps_its_buffers_until_the_qp_goes() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build().unwrap();
    rt.block_on(async {
        let (mut a, mut b) = pair(&pd, AsyncCq::tokio);
        let mut bufs = chunks(&pd, 8, LEN, AccessFlags::LOCAL_WRITE);
        let t = b.rq.post(bufs.pop().unwrap(), 0..LEN, 100).unwrap();
        let early = tokio::time::timeout(Duration::from_millis(50), b.rq.wait(t)).await;
        assert!(early.is_err(), "a receive completed with nothing sent");
        let mut src = bufs.pop().unwrap();
        src[..LEN].copy_from_slice(&message(0));
        let sent = a.sq.post(SendWr::send(src, 0..LEN).id(0)).unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), b.rq.next()).await.expect("the receive came back");
        bufs.push(check_received(got.unwrap(), 0));
        bufs.push(a.sq.wait(sent).await.unwrap().result().unwrap().value);

        // B's receive queue dropped with four receives posted; then A sends into them.
        for n in 0..4 {
            b.rq.post(bufs.pop().unwrap(), 0..LEN, 100 + n).unwrap();
        }
        let End { rq, sq: bsq, _qp: bqp, _link } = b;
        drop(rq);
        for n in 0..4 {
            let mut src = bufs.pop().unwrap();
            src[..LEN].copy_from_slice(&message(n));
            a.sq.post(SendWr::send(src, 0..LEN).id(n)).unwrap();
        }
        for n in 0..4 {
            let d = tokio::time::timeout(Duration::from_secs(10), a.sq.next()).await.expect("the send completed");
            let d = d.unwrap().result().unwrap();
            assert_eq!(d.id, n);
        }
        drop((bsq, bqp, a));
    });
}

/// 20 round trips to warm up, then 200 counted by the test binary's allocator: post, await
/// by ticket, B parked on its channel before A sends. Returns the heap operations of the
/// 200 (allocations, frees) and how often B parked.
async fn steady_state<R: Readiness>(
    pd: &ProtectionDomain,
    wrap: impl Fn(CompletionQueue) -> rdma_verbs::Result<AsyncCq<R>>,
) -> ((u64, u64), u64) {
    let (mut a, mut b) = pair(pd, wrap);
    let mut c = chunks(pd, 2, LEN, AccessFlags::LOCAL_WRITE);
    let (mut dst, mut src) = (c.pop().unwrap(), c.pop().unwrap());
    for n in 0..20 {
        (dst, src) = round_trip(&mut a.sq, &mut b.rq, n, dst, src).await;
    }
    let (before, waits) = (heap_ops(), b.rq.waits());
    for n in 20..220 {
        (dst, src) = round_trip(&mut a.sq, &mut b.rq, n, dst, src).await;
    }
    let (after, waited) = (heap_ops(), b.rq.waits() - waits);
    ((after.0 - before.0, after.1 - before.1), waited)
}

/// In steady state an awaited round trip allocates nothing, on tokio's current-thread
/// runtime.
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn awaited_queues_allocate_nothing_per_request_in_steady_state() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    let (ops, waited) = rt.block_on(steady_state(&pd, AsyncCq::tokio));
    eprintln!("tokio: 200 awaited round trips ({waited} parked on the channel): {ops:?} heap operations");
    assert!(waited >= 200, "the receiving task parked {waited} times in 200 rounds");
    assert_eq!(ops, (0, 0), "awaiting touched the heap in steady state");
}

/// The same on async-io's reactor. The task runs on futures-lite's `block_on` (which parks
/// the thread) and the reactor on async-io's own thread, so what is counted here is the
/// task's: ours and the adapter's. (async-io's `block_on` runs the reactor on the calling
/// thread, and its reactor allocates now and then while it waits: about 180 times in
/// these 200 rounds, none of it in this crate.)
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn awaited_queues_allocate_nothing_per_request_in_steady_state_on_async_io() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (ops, waited) = futures_lite::future::block_on(steady_state(&pd, AsyncCq::async_io));
    eprintln!("async-io: 200 awaited round trips ({waited} parked on the channel): {ops:?} heap operations");
    assert!(waited >= 200, "the receiving task parked {waited} times in 200 rounds");
    assert_eq!(ops, (0, 0), "awaiting touched the heap in steady state");
}

/// One message from A to B, each side's request awaited by its ticket, B's parked before
/// A sends; the ends of the bytes checked (a loop that must not allocate); both buffers back.
async fn round_trip<R: Readiness>(
    a: &mut AsyncSendQueue<Chunk, R>,
    b: &mut AsyncRecvQueue<Chunk, R>,
    n: u64,
    dst: Chunk,
    mut src: Chunk,
) -> (Chunk, Chunk) {
    let t = b.post(dst, 0..LEN, n).unwrap();
    let receive = async {
        let got = b.wait(t).await.unwrap().result().unwrap();
        assert_eq!((got.id, got.value[0], got.value[LEN - 1]), (n, n as u8, !(n as u8)));
        got
    };
    let send = async {
        // B's task parks first.
        futures_lite::future::yield_now().await;
        (src[0], src[LEN - 1]) = (n as u8, !(n as u8));
        let s = a.post(SendWr::send(src, 0..LEN).id(n)).unwrap();
        a.wait(s).await.unwrap().result().unwrap()
    };
    let (got, sent) = futures_lite::future::zip(receive, send).await;
    (got.value, sent.value)
}

/// What one await on the survivor saw: the caller's id, the status, the error text of a
/// failure, when it ended.
type Ended = (u64, WcStatus, Option<String>, Instant);

/// SENDs past the peer's receives (one stalls on it, the rest queue behind it), and
/// receives the peer never fills.
const KILL_SENDS: u64 = PEER_RECVS as u64 + 8;
const KILL_RECVS: u64 = 4;

/// The survivor's side of a peer killed while it awaits: one future awaits the SENDs by
/// ticket, another the receives, a third SIGKILLs the peer once every SEND it had a
/// receive for has succeeded. Returns what each await saw and when the kill was.
async fn survive_a_kill<R: Readiness>(
    test: &str,
    wrap: impl Fn(CompletionQueue) -> rdma_verbs::Result<AsyncCq<R>>,
) -> (Vec<Ended>, Vec<Ended>, Instant) {
    use futures_lite::future::zip;
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let scq = CompletionQueue::builder(&ctx, KILL_SENDS as u32).with_channel().build().unwrap();
    let rcq = CompletionQueue::builder(&ctx, KILL_RECVS as u32).with_channel().build().unwrap();
    let qp = QueuePair::builder(&pd, QpType::Rc, &scq, &rcq)
        .max_send_wr(KILL_SENDS as u32)
        .max_recv_wr(KILL_RECVS as u32)
        .build()
        .unwrap();
    let (mut peer, _) = qp_peer_connected(test, &ctx, &qp);
    let mut sq = AsyncSendQueue::new(qp.send_queue::<Chunk>().unwrap(), wrap(scq).unwrap()).unwrap();
    let mut rq = AsyncRecvQueue::new(qp.recv_queue::<Chunk>().unwrap(), wrap(rcq).unwrap()).unwrap();
    let recv_tickets: Vec<Ticket> = chunks(&pd, KILL_RECVS as usize, SEND_LEN, AccessFlags::LOCAL_WRITE)
        .into_iter()
        .zip(0..)
        .map(|(buf, n)| rq.post(buf, 0..SEND_LEN, 500 + n).unwrap())
        .collect();
    let send_tickets: Vec<Ticket> = chunks(&pd, KILL_SENDS as usize, SEND_LEN, AccessFlags::LOCAL_WRITE)
        .into_iter()
        .zip(0..)
        .map(|(buf, n)| sq.post(SendWr::send(buf, 0..SEND_LEN).id(n)).unwrap())
        .collect();
    let ended = |d: Done<Chunk>| (d.id, d.status, d.result().err().map(|r| r.error.to_string()), Instant::now());
    let stalled = std::cell::Cell::new(false);
    let sends = async {
        let mut ends = vec![];
        for t in send_tickets {
            let d = sq.wait(t).await.unwrap();
            // Every SEND the peer had a receive for has succeeded: the next one stalls.
            stalled.set(stalled.get() || d.id + 1 == PEER_RECVS as u64);
            ends.push(ended(d));
        }
        ends
    };
    let recvs = async {
        let mut ends = vec![];
        for t in recv_tickets {
            ends.push(ended(rq.wait(t).await.unwrap()));
        }
        ends
    };
    let kill = async {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !stalled.get() {
            assert!(Instant::now() < deadline, "the SENDs did not reach the stall");
            async_io::Timer::after(Duration::from_millis(10)).await;
        }
        async_io::Timer::after(Duration::from_millis(100)).await;
        let killed = Instant::now();
        peer.kill();
        killed
    };
    let ((sends, recvs), killed) = zip(zip(sends, recvs), kill).await;
    drop((sq, rq, qp, pd, ctx));
    (sends, recvs, killed)
}

/// Every await ended: the stalled SEND with RETRY_EXC_ERR, the SENDs behind it and every
/// receive flushed, each error naming the operation and the caller's id, the last within
/// (`retry_cnt` + 1) ACK timeouts plus the emulation margin of the SIGKILL.
fn check_every_await_ended(runtime: &str, (sends, recvs, killed): (Vec<Ended>, Vec<Ended>, Instant)) {
    let stall = PEER_RECVS;
    assert_eq!((sends.len() as u64, recvs.len() as u64), (KILL_SENDS, KILL_RECVS), "every await ended");
    assert!(sends[..stall].iter().all(|s| s.1 == WcStatus::Success), "the SENDs before the stall succeeded");
    assert_eq!(sends[stall].1, WcStatus::RetryExcErr, "the stalled SEND ran out of retries");
    assert!(sends[stall + 1..].iter().all(|s| s.1 == WcStatus::WrFlushErr), "the SENDs behind it were flushed");
    assert!(recvs.iter().all(|r| r.1 == WcStatus::WrFlushErr), "every receive was flushed: {recvs:?}");
    for (id, _, error, _) in sends[stall..].iter().chain(&recvs) {
        let e = error.as_deref().expect("a failed request's result is an error");
        let op = if *id >= 500 { "receive id" } else { "SEND id" };
        assert!(e.contains(&format!("{op} {id} ")), "the error names the operation and id {id}: {e}");
    }
    let last = sends.iter().chain(&recvs).map(|s| s.3).max().unwrap();
    let (nominal, bound) = failure_bound();
    eprintln!(
        "{runtime}: {stall} SENDs ok, 1 RETRY_EXC_ERR, {} flushed, {} receives flushed; the last await ended {:?} \
         after the SIGKILL (nominal {nominal:?}, bound {bound:?})",
        sends.len() - stall - 1,
        recvs.len(),
        last - killed,
    );
    assert!(last - killed < bound, "the last await ended {:?} after the SIGKILL", last - killed);
}

/// A peer process is SIGKILLed while a tokio task awaits SENDs by ticket (one stalled on
/// the peer's empty receive queue, more behind it) and receives the peer never fills:
/// every await ends with an error within the QP's bound ([`check_every_await_ended`]).
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_peer_killed_while_tasks_await_ends_every_await_with_an_error_within_the_qp_bound() {
    if role().as_deref() == Some("qp-peer") {
        return qp_peer();
    }
    let _leaks = LeakCheck::new();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    check_every_await_ended("tokio", rt.block_on(survive_a_kill(this_test!(), AsyncCq::tokio)));
}

/// The same on async-io's reactor.
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_peer_killed_while_async_io_tasks_await_ends_every_await_with_an_error_within_the_qp_bound() {
    if role().as_deref() == Some("qp-peer") {
        return qp_peer();
    }
    let _leaks = LeakCheck::new();
    check_every_await_ended("async-io", async_io::block_on(survive_a_kill(this_test!(), AsyncCq::async_io)));
}

/// A prepared chain through an awaited queue: one ticket for the whole chain, handed back
/// once, and the tickets after it still name their own requests.
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn an_awaited_prepared_chain_takes_one_ticket_and_comes_back_whole_once() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    rt.block_on(async {
        let (a, asq, _arq) = qp_with_own_cqs(&pd);
        let (b, _bsq, brq) = qp_with_own_cqs(&pd);
        let _link = connect_rc(&a, &b, &InitAttr::default());
        let pq = a.send_chain_queue::<Chunk>().unwrap();
        let mut rq = AsyncRecvQueue::new(b.recv_queue().unwrap(), AsyncCq::tokio(brq).unwrap()).unwrap();
        for (n, c) in chunks(&pd, 5, LEN, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
            rq.post(c, 0..LEN, 100 + n as u64).unwrap();
        }
        let mut srcs = chunks(&pd, 5, LEN, AccessFlags::LOCAL_WRITE);
        for (n, c) in srcs.iter_mut().enumerate() {
            c.copy_from_slice(&message(n as u64));
        }
        let single = srcs.pop().unwrap();
        let wrs = srcs.into_iter().enumerate().map(|(n, c)| SendWr::send(c, 0..LEN).id(n as u64));
        let chain = pq.prepare_chain(wrs).unwrap();
        let single = pq.prepare_chain([SendWr::send(single, 0..LEN).id(4)]).unwrap();
        let mut sq = AsyncSendQueue::new(pq, AsyncCq::tokio(asq).unwrap()).unwrap();
        let t_chain = sq.post(chain).unwrap();
        let t_single = sq.post(single).unwrap();
        let d = sq.wait(t_single).await.unwrap().result().unwrap();
        assert_eq!((d.id, d.value.len()), (4, 1));
        let d = sq.wait(t_chain).await.unwrap().result().unwrap();
        assert_eq!((d.id, d.op, d.value.len()), (0, WcOpcode::Send, 4));
        assert_eq!(sq.outstanding(), 0, "every ticket handed back");
        for n in 0..5 {
            check_received(rq.next().await.unwrap(), n);
        }
    });
}
