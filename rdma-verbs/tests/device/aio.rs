//! Completions awaited on async runtimes (`AsyncCq`), on a real device: two RC QPs on one
//! device connected to each other, every byte that arrives compared with what was sent,
//! on tokio (current-thread and multi-thread) and on async-io.

use std::sync::Arc;
use std::time::Duration;

use rdma_verbs::{
    AccessFlags, AsyncCq, Chunk, CompletionQueue, Context, InitAttr, ProtectionDomain, QpType, QueuePair, Readiness,
    RecvQueue, SendQueue, SendWr, WcStatus, WorkCompletion,
};

use crate::alloc::heap_ops;
use crate::datapath::chunks;
use crate::{connect_rc, open, LeakCheck, Link};

/// Bytes per message.
const LEN: usize = 1024;

/// One side of a loopback connection: a QP with both of its queues (its send and receive
/// completions land on one CQ with a completion channel, returned beside it).
struct Side {
    sq: SendQueue<Chunk>,
    rq: RecvQueue<Chunk>,
    _qp: QueuePair,
    _link: Arc<Link>,
}

/// Two connected RC QPs, each with its own channel CQ.
fn pair(ctx: &Context, pd: &ProtectionDomain) -> ((CompletionQueue, Side), (CompletionQueue, Side)) {
    let make = || {
        let cq = CompletionQueue::builder(ctx, 128).with_channel().build().unwrap();
        let qp = QueuePair::builder(pd, QpType::Rc, &cq, &cq).max_send_wr(32).max_recv_wr(32).build().unwrap();
        (cq, qp)
    };
    let ((cq_a, a), (cq_b, b)) = (make(), make());
    let link = Arc::new(connect_rc(&a, &b, &InitAttr::default()));
    let side = |qp: QueuePair| Side {
        sq: qp.send_queue().unwrap(),
        rq: qp.recv_queue().unwrap(),
        _qp: qp,
        _link: Arc::clone(&link),
    };
    ((cq_a, side(a)), (cq_b, side(b)))
}

/// The bytes of message `n`.
fn message(n: u64) -> Vec<u8> {
    (0..LEN).map(|i| (i as u64).wrapping_mul(7).wrapping_add(n) as u8).collect()
}

/// Buffers in flight between the rounds of a ping loop.
struct Bufs {
    src: Option<Chunk>,
    dst: Option<Chunk>,
}

/// What a round checks of the bytes that arrived: all of them (against the message), or
/// only the first and the last (a loop that must not allocate).
#[derive(Clone, Copy, PartialEq)]
enum Check {
    All,
    Ends,
}

/// One round: B posts a receive and awaits it while A, once B's task has parked, SENDs
/// message `n` and awaits its own completion; the bytes are checked and both buffers come
/// back to `bufs`. The receive is awaited before anything is sent, so B's await goes
/// through the channel and the runtime's reactor every round.
async fn round<R: Readiness>(
    n: u64,
    (a, acq): (&mut Side, &mut AsyncCq<R>),
    (b, bcq): (&mut Side, &mut AsyncCq<R>),
    bufs: &mut Bufs,
    check: Check,
) {
    let Bufs { src, dst } = bufs;
    let (first, last) = (n as u8, (n as u8).wrapping_add(0x5a));
    b.rq.post(dst.take().expect("the receive buffer came back"), 0..LEN, n).unwrap();
    let receive = async {
        let mut wcs = [WorkCompletion::EMPTY; 4];
        while dst.is_none() {
            for wc in bcq.completions(&mut wcs).await.unwrap() {
                let got = b.rq.complete(wc).unwrap().result().unwrap();
                assert_eq!((got.id, got.byte_len), (n, LEN as u32));
                match check {
                    Check::All => assert!(got.value[..LEN] == message(n)[..], "message {n}: the bytes differ"),
                    Check::Ends => assert_eq!((got.value[0], got.value[LEN - 1]), (first, last), "message {n}"),
                }
                *dst = Some(got.value);
            }
        }
    };
    let send = async {
        // Let the receiving side park first.
        futures_lite::future::yield_now().await;
        let mut buf = src.take().expect("the source came back");
        match check {
            Check::All => buf[..LEN].copy_from_slice(&message(n)),
            Check::Ends => (buf[0], buf[LEN - 1]) = (first, last),
        }
        a.sq.post(SendWr::send(buf, 0..LEN).id(n)).unwrap();
        let mut wcs = [WorkCompletion::EMPTY; 4];
        while src.is_none() {
            for wc in acq.completions(&mut wcs).await.unwrap() {
                a.sq.complete(wc, |d| {
                    assert_eq!((d.id, d.status), (n, WcStatus::Success));
                    *src = Some(d.value);
                })
                .unwrap();
            }
        }
    };
    futures_lite::future::zip(receive, send).await;
}

/// `messages` rounds over a fresh pair whose CQs `wrap` makes async; returns how often
/// each side's task waited on its channel.
async fn ping<R: Readiness>(
    ctx: &Context,
    pd: &ProtectionDomain,
    messages: u64,
    wrap: impl Fn(CompletionQueue) -> rdma_verbs::Result<AsyncCq<R>>,
) -> (u64, u64) {
    let ((acq, mut a), (bcq, mut b)) = pair(ctx, pd);
    let (mut acq, mut bcq) = (wrap(acq).unwrap(), wrap(bcq).unwrap());
    let mut c = chunks(pd, 2, LEN, AccessFlags::LOCAL_WRITE);
    let mut bufs = Bufs { dst: c.pop(), src: c.pop() };
    for n in 0..messages {
        round(n, (&mut a, &mut acq), (&mut b, &mut bcq), &mut bufs, Check::All).await;
    }
    (acq.waits(), bcq.waits())
}

/// A CQ without a channel cannot be awaited: a clear error, before any runtime is touched.
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_cq_without_a_channel_is_refused_with_the_way_to_build_one() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let cq = CompletionQueue::new(&ctx, 8).unwrap();
    let e = AsyncCq::async_io(cq).unwrap_err().to_string();
    assert!(e.contains("with_channel"), "{e}");
}

/// Awaiting on tokio's current-thread runtime: every message arrives intact, and the
/// tasks really parked on the channel (a loop that only polled would never wait).
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn tokio_awaits_sends_and_receives_with_the_bytes_checked() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    let (wa, wb) = rt.block_on(ping(&ctx, &pd, 200, AsyncCq::tokio));
    eprintln!("tokio: 200 messages, waits on the channel: A {wa}, B {wb}");
    assert!(wb >= 200, "B waited on its channel {wb} times in 200 rounds: the reactor path was not exercised");
}

/// The same on async-io's reactor (smol, async-std), driven by its own block_on.
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn async_io_awaits_sends_and_receives_with_the_bytes_checked() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (wa, wb) = async_io::block_on(ping(&ctx, &pd, 200, AsyncCq::async_io));
    eprintln!("async-io: 200 messages, waits on the channel: A {wa}, B {wb}");
    assert!(wb >= 200, "B waited on its channel {wb} times in 200 rounds: the reactor path was not exercised");
}

/// Many connections in one multi-thread tokio runtime, each served by its own task.
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn many_connections_each_in_its_own_task_on_one_tokio_runtime() {
    const CONNECTIONS: usize = 8;
    const MESSAGES: u64 = 50;
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_io().build().unwrap();
    let waits: u64 = rt.block_on(async {
        let tasks: Vec<_> = (0..CONNECTIONS)
            .map(|_| {
                let (ctx, pd) = (ctx.clone(), pd.clone());
                tokio::spawn(async move { ping(&ctx, &pd, MESSAGES, AsyncCq::tokio).await })
            })
            .collect();
        let mut waits = 0;
        for t in tasks {
            let (wa, wb) = t.await.expect("a connection's task failed");
            waits += wa + wb;
        }
        waits
    });
    eprintln!("{CONNECTIONS} connections x {MESSAGES} messages: {waits} waits on the channels");
}

/// A future dropped while it waits (a timeout) leaves the queue usable: the next await
/// gets the completion that came later.
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_dropped_await_leaves_the_cq_usable() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build().unwrap();
    rt.block_on(async {
        let ((mut acq, mut a), (bcq, mut b)) = pair(&ctx, &pd);
        let mut bcq = AsyncCq::tokio(bcq).unwrap();
        let mut c = chunks(&pd, 2, LEN, AccessFlags::LOCAL_WRITE);
        let (dst, mut src) = (c.pop().unwrap(), c.pop().unwrap());
        b.rq.post(dst, 0..LEN, 5).unwrap();
        let mut wcs = [WorkCompletion::EMPTY; 4];
        // Nothing was sent: the await parks and is dropped by the timeout.
        let early = tokio::time::timeout(Duration::from_millis(50), bcq.completions(&mut wcs)).await;
        assert!(early.is_err(), "a completion came with nothing sent");
        let want = message(5);
        src[..LEN].copy_from_slice(&want);
        a.sq.post(SendWr::send(src, 0..LEN)).unwrap();
        let wc = tokio::time::timeout(Duration::from_secs(10), bcq.completions(&mut wcs))
            .await
            .expect("the receive completed after the dropped await")
            .unwrap();
        let got = b.rq.complete(&mut wc[0]).unwrap().result().unwrap();
        assert!(got.value[..LEN] == want[..]);
        // The send's completion, polled plainly, and its buffer back.
        let mut done = None;
        while done.is_none() {
            for wc in acq.poll(&mut wcs).unwrap() {
                a.sq.complete(wc, |d| done = Some(d.status)).unwrap();
            }
        }
        assert_eq!(done, Some(WcStatus::Success));
    });
}

/// In steady state, awaiting allocates nothing: rounds of post, await, complete on a
/// current-thread runtime, counted by the test binary's allocator.
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn awaiting_completions_allocates_nothing_in_steady_state() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    rt.block_on(async {
        let ((acq, mut a), (bcq, mut b)) = pair(&ctx, &pd);
        let (mut acq, mut bcq) = (AsyncCq::tokio(acq).unwrap(), AsyncCq::tokio(bcq).unwrap());
        let mut c = chunks(&pd, 2, LEN, AccessFlags::LOCAL_WRITE);
        let mut bufs = Bufs { dst: c.pop(), src: c.pop() };
        for n in 0..20 {
            round(n, (&mut a, &mut acq), (&mut b, &mut bcq), &mut bufs, Check::Ends).await;
        }
        let (waits, before) = (acq.waits() + bcq.waits(), heap_ops());
        for n in 20..220 {
            round(n, (&mut a, &mut acq), (&mut b, &mut bcq), &mut bufs, Check::Ends).await;
        }
        let (after, waited) = (heap_ops(), acq.waits() + bcq.waits() - waits);
        eprintln!(
            "200 awaited rounds ({waited} waits on the channels): {:?} heap operations",
            (after.0 - before.0, after.1 - before.1)
        );
        assert!(waited > 0, "no await waited on a channel");
        assert_eq!(after, before, "awaiting touched the heap in steady state");
    });
}

/// examples/async_echo: a tokio server accepting rdma_cm connections, each served by its
/// own task, and as many clients on the same runtime; it exits 0 only when every echo
/// matched what was sent, byte for byte, and each side's private data arrived intact.
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn async_echo_serves_many_connections_on_one_runtime_and_every_echo_matches() {
    let _leaks = LeakCheck::new();
    let out = std::process::Command::new(crate::example("async_echo"))
        .args(["--loopback", "--connections", "16", "--messages", "100", "--size", "256", "-t", "60"])
        .output()
        .expect("run examples/async_echo");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "async_echo failed: {}\n{stdout}\n{stderr}", out.status);
    assert!(
        stdout
            .contains("16 connections x 100 messages of 256 bytes: every echo matched, private data checked both ways"),
        "{stdout}"
    );
}
