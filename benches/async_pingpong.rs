//! Completions awaited (`AsyncCq` on tokio) against busy polling and against blocking on
//! the completion channel, on one setup: RC QP pairs on one device, 64-byte SEND/RECV,
//! each end one CQ with a completion channel (so every way below runs on the same QPs and
//! CQs), each end re-posting its receive before it answers. Needs a device:
//! `scripts/rxe cargo bench --bench async_pingpong`; it fails, not skips, without one.
//!
//! Two loads:
//! - ping-pong: one connection, one message in flight; the cost is the round trip.
//! - message rate: `ASYNC_BENCH_CONNS` (64) connections, each ping-ponging with a window
//!   of `ASYNC_BENCH_WINDOW` (1) messages in flight: requests answered as they come,
//!   as a server with many clients sees them; messages/s counts the SENDs of both ends.
//!
//! The ways of waiting for the completions:
//! - `busy`: one thread polls every CQ in turn (`cq.poll` in a loop), driving both ends.
//! - `busy-threads` (ping-pong only): each end polls its own CQ on its own thread, as two
//!   perftest processes do.
//! - `blocking`: each end on its own thread (128 threads at 64 connections: the
//!   thread-per-connection design; the crate has no shared channel): poll, when empty
//!   arm and poll again, then `cq.wait` until the channel's event.
//! - `async spin N (1 thread)`: each end its own task (two per connection, as a server's
//!   task and its client's) on one current-thread tokio runtime, awaiting
//!   `AsyncCq::completions` with `set_spin(N)`. One thread, like `busy`, and what a
//!   thread-per-core server does; a task that spins here holds up its peer.
//! - `async spin N (rt per end)` (ping-pong only): each end its task on its own
//!   current-thread runtime on its own thread, as a peer in another process would be;
//!   as many threads as `busy-threads` and `blocking`, and the case spinning is for.
//!
//! The FINAL table compares each async way with the busy and blocking ways of as many
//! threads. Under TCG on two vCPUs, rxe needs those CPUs itself: ways whose threads spin
//! or sleep on both of them pay for it far more than they would beside a hardware NIC.
//!
//! Criterion measures some of them one after the other; on a noisy machine (a VM under
//! emulation) the speed drifts between them. So afterwards every way runs in turns,
//! `ASYNC_BENCH_ROUNDS` rounds with the order rotating, and the last table printed holds
//! the ratios of those interleaved medians, with the per-round ratios' spread. Knobs:
//! `ASYNC_BENCH_ROUNDS` (15), `ASYNC_BENCH_ITERS` (round trips per ping-pong turn, 200),
//! `ASYNC_BENCH_MESSAGES` (round trips per connection per rate turn, 20),
//! `ASYNC_BENCH_CONNS` (64), `ASYNC_BENCH_WINDOW` (1). Without `--bench` (as `cargo test
//! --benches` runs it) everything is short.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use rdma_verbs::{
    AccessFlags, AlignedBuf, AsyncCq, Chunk, CompletionQueue, Context, InitAttr, ProtectionDomain, QpType, QueuePair,
    RecvQueue, SendQueue, SendWr, TokioFd, WorkCompletion,
};
use tokio::runtime::Runtime;

/// Bytes per message.
const LEN: usize = 64;
/// The `set_spin` values measured.
const SPINS: [u32; 3] = [0, 200, 2000];
/// Spins measured only with a runtime per end (where spinning is for): under emulation a
/// round trip lasts some hundred empty polls' time, so this is what "spin about as long as
/// a round trip" takes there.
const LONG_SPINS: [u32; 1] = [20000];
/// A bound on every wait: rxe can lose a completion, and then the bench fails, not hangs.
const LIMIT: Duration = Duration::from_secs(60);

/// How long a run is.
struct Knobs {
    rounds: usize,
    iters: u64,
    messages: u64,
    conns: usize,
    window: u64,
}

fn knobs() -> Knobs {
    let env = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    // Criterion runs for real only with --bench (cargo bench passes it); otherwise briefly.
    let short = !std::env::args().any(|a| a == "--bench");
    let pick = |name, long, brief| if short { brief } else { env(name, long) };
    Knobs {
        rounds: pick("ASYNC_BENCH_ROUNDS", 15, 2) as usize,
        iters: pick("ASYNC_BENCH_ITERS", 200, 10),
        messages: pick("ASYNC_BENCH_MESSAGES", 20, 2),
        conns: env("ASYNC_BENCH_CONNS", 64) as usize,
        window: env("ASYNC_BENCH_WINDOW", 1).max(1),
    }
}

/// One end of a connection: the initiator sends `window` messages, then one more per
/// answer until it sent `target`; the responder answers every message.
struct End {
    sq: SendQueue<Arc<Chunk>>,
    rq: RecvQueue<Chunk>,
    src: Arc<Chunk>,
    initiator: bool,
    window: u64,
    target: u64,
    sent: u64,
    received: u64,
    _qp: QueuePair,
}

impl End {
    /// Starts a turn of `target` round trips (the initiator's first sends).
    fn start(&mut self, target: u64) {
        (self.target, self.sent, self.received) = (target, 0, 0);
        if self.initiator {
            for _ in 0..self.window.min(target) {
                self.send();
            }
        }
    }

    fn send(&mut self) {
        let wr = SendWr::send(Arc::clone(&self.src), 0..LEN);
        self.sq.post(wr).unwrap_or_else(|r| panic!("posting a SEND: {}", r.error));
        self.sent += 1;
    }

    /// Takes one completion: a receive is posted again, then answered (or followed by the
    /// initiator's next message); a send gives its slot back.
    fn handle(&mut self, wc: &mut WorkCompletion) {
        assert!(wc.is_success(), "a work request failed: {wc:?}");
        if wc.opcode().is_recv() {
            let buf = self.rq.complete(wc).expect("a receive's completion").value;
            self.rq.post(buf, 0..LEN, 0).unwrap_or_else(|r| panic!("posting a receive: {}", r.error));
            self.received += 1;
            if !self.initiator || self.sent < self.target {
                self.send();
            }
        } else {
            self.sq.complete(wc, drop).expect("a send's completion");
        }
    }

    /// Every message of the turn received, every send completed.
    fn done(&self) -> bool {
        self.received == self.target && self.sq.outstanding() == 0
    }
}

/// An end and its CQ, awaited or polled and waited on directly.
struct Side {
    end: End,
    cq: Waiter,
}

/// A CQ as the way of the turn uses it. The blocking way arms and waits on the CQ itself,
/// so it takes the CQ out of its `AsyncCq` (`into_inner`, as the docs say to) and the
/// async way wraps it again: an `AsyncCq` keeps whether it armed the CQ, and an arming
/// spent behind its back would leave it waiting for an event that never comes. The
/// switch happens between turns, outside the time measured.
enum Waiter {
    Async(AsyncCq<TokioFd>),
    Plain(CompletionQueue),
    Switching,
}

impl Waiter {
    /// The CQ, to poll it (either form).
    fn cq(&mut self) -> &mut CompletionQueue {
        match self {
            Waiter::Async(a) => a.cq(),
            Waiter::Plain(cq) => cq,
            Waiter::Switching => unreachable!("a CQ between its forms"),
        }
    }

    /// The CQ out of its `AsyncCq`, to arm and wait on it.
    fn plain(&mut self) -> &mut CompletionQueue {
        *self = match std::mem::replace(self, Waiter::Switching) {
            Waiter::Async(a) => Waiter::Plain(a.into_inner()),
            other => other,
        };
        self.cq()
    }

    /// The CQ awaited on the runtime `rt`.
    fn awaited(&mut self, rt: &Runtime) -> &mut AsyncCq<TokioFd> {
        *self = match std::mem::replace(self, Waiter::Switching) {
            Waiter::Plain(cq) => {
                let _in_runtime = rt.enter();
                Waiter::Async(AsyncCq::tokio(cq).expect("watching a CQ's channel with tokio"))
            }
            other => other,
        };
        match self {
            Waiter::Async(a) => a,
            _ => unreachable!("a CQ between its forms"),
        }
    }
}

/// `conns` connected pairs, laid out initiator, responder, initiator, ...
fn connections(ctx: &Context, pd: &ProtectionDomain, conns: usize, window: u64) -> Vec<Side> {
    let (recv_depth, send_depth) = (window as u32 + 2, window as u32 + 4);
    let src: Arc<Chunk> = Arc::new(
        pd.register(AlignedBuf::new(4096).unwrap(), AccessFlags::LOCAL_WRITE)
            .unwrap()
            .into_chunks(4096)
            .unwrap()
            .remove(0),
    );
    let per_end = recv_depth as usize;
    let mut recv_bufs: Vec<Chunk> = pd
        .register(AlignedBuf::new(2 * conns * per_end * LEN).unwrap(), AccessFlags::LOCAL_WRITE)
        .unwrap()
        .into_chunks(LEN)
        .unwrap();
    let mut sides = Vec::with_capacity(2 * conns);
    for _ in 0..conns {
        let make = || {
            let cq = CompletionQueue::builder(ctx, send_depth + recv_depth).with_channel().build().unwrap();
            let qp = QueuePair::builder(pd, QpType::Rc, &cq, &cq)
                .max_send_wr(send_depth)
                .max_recv_wr(recv_depth)
                .build()
                .unwrap();
            (cq, qp)
        };
        let ((cq_a, a), (cq_b, b)) = (make(), make());
        let (ia, ib) = (a.local_info(1).unwrap(), b.local_info(1).unwrap());
        a.connect(&InitAttr::default(), &ib).unwrap();
        b.connect(&InitAttr::default(), &ia).unwrap();
        for (cq, qp, initiator) in [(cq_a, a, true), (cq_b, b, false)] {
            let mut rq: RecvQueue<Chunk> = qp.recv_queue().unwrap();
            for buf in recv_bufs.drain(..per_end) {
                rq.post(buf, 0..LEN, 0).unwrap_or_else(|r| panic!("posting a receive: {}", r.error));
            }
            let end = End {
                sq: qp.send_queue().unwrap(),
                rq,
                src: Arc::clone(&src),
                initiator,
                window,
                target: 0,
                sent: 0,
                received: 0,
                _qp: qp,
            };
            sides.push(Side { end, cq: Waiter::Plain(cq) });
        }
    }
    sides
}

/// A way of waiting for completions.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Way {
    Busy,
    BusyThreads,
    /// `BusyThreads` once more, as another way: its ratio to `BusyThreads` is the noise
    /// floor (A/A) of the ping-pong ratios.
    BusyThreadsAgain,
    Blocking,
    /// Every end a task on the one shared current-thread runtime; the spin.
    Async(u32),
    /// Every end a task on its own current-thread runtime, on its own thread; the spin.
    AsyncPerEnd(u32),
}

impl Way {
    fn name(self) -> String {
        match self {
            Way::Busy => "busy (1 thread)".into(),
            Way::BusyThreads => "busy (thread per end)".into(),
            Way::BusyThreadsAgain => "busy (thread per end) A/A".into(),
            Way::Blocking => "blocking (thread per end)".into(),
            Way::Async(n) => format!("async spin {n} (1 thread)"),
            Way::AsyncPerEnd(n) => format!("async spin {n} (rt per end)"),
        }
    }
}

/// What one turn took, and how often an end parked (blocking and async).
struct Turn {
    time: Duration,
    waits: u64,
}

/// One turn of `messages` round trips on every connection of `sides`.
fn turn(way: Way, sides: &mut Vec<Side>, rt: &Runtime, messages: u64) -> Turn {
    match way {
        Way::Busy => {
            let t = Instant::now();
            busy(sides, messages);
            Turn { time: t.elapsed(), waits: 0 }
        }
        Way::BusyThreads | Way::BusyThreadsAgain => threads(sides, messages, |s, m, ready| {
            ready.wait();
            busy(std::slice::from_mut(s), m);
            0
        }),
        Way::Blocking => {
            for s in sides.iter_mut() {
                s.cq.plain();
            }
            threads(sides, messages, |s, m, ready| {
                ready.wait();
                blocking(s, m)
            })
        }
        Way::Async(spin) => awaited(rt, sides, messages, spin),
        Way::AsyncPerEnd(spin) => threads(sides, messages, |s, m, ready| per_end(s, m, ready, spin)),
    }
}

/// Polls every CQ in turn, one thread, until each end is done.
fn busy(sides: &mut [Side], messages: u64) {
    let mut wcs = [WorkCompletion::EMPTY; 16];
    for s in sides.iter_mut() {
        s.end.start(messages);
    }
    let (deadline, mut passes) = (Instant::now() + LIMIT, 0u32);
    loop {
        let mut left = false;
        for Side { end, cq } in sides.iter_mut() {
            if end.done() {
                continue;
            }
            left = true;
            for wc in cq.cq().poll(&mut wcs).expect("polling a CQ") {
                end.handle(wc);
            }
        }
        if !left {
            return;
        }
        passes = passes.wrapping_add(1);
        if passes % 65536 == 0 {
            assert!(Instant::now() < deadline, "busy polling: no progress within {LIMIT:?} (a lost completion?)");
        }
    }
}

/// One end on its own thread, sleeping on the channel when its CQ is empty: poll; when
/// empty, arm and poll again (a completion before the arming raises no event); then wait.
/// Returns how often it slept.
fn blocking(side: &mut Side, messages: u64) -> u64 {
    let Side { end, cq } = side;
    let cq = cq.cq();
    let (mut wcs, mut armed, mut waits) = ([WorkCompletion::EMPTY; 16], false, 0);
    end.start(messages);
    while !end.done() {
        let got = cq.poll(&mut wcs).expect("polling a CQ");
        if !got.is_empty() {
            for wc in got {
                end.handle(wc);
            }
        } else if !armed {
            cq.arm(false).expect("arming a CQ");
            armed = true;
        } else {
            cq.wait(Some(LIMIT)).expect("waiting on the channel (a lost completion?)");
            (armed, waits) = (false, waits + 1);
        }
    }
    waits
}

/// Each side on its own thread running `run`, which waits on the barrier when it is ready
/// to start; timed from the moment all are ready.
fn threads(sides: &mut [Side], messages: u64, run: impl Fn(&mut Side, u64, &Barrier) -> u64 + Sync) -> Turn {
    let ready = Barrier::new(sides.len() + 1);
    thread::scope(|scope| {
        let handles: Vec<_> = sides
            .iter_mut()
            .map(|side| {
                let (ready, run) = (&ready, &run);
                thread::Builder::new()
                    .stack_size(256 << 10)
                    .spawn_scoped(scope, move || run(side, messages, ready))
                    .expect("spawning a thread")
            })
            .collect();
        ready.wait();
        let t = Instant::now();
        let waits = handles.into_iter().map(|h| h.join().expect("an end's thread panicked")).sum();
        Turn { time: t.elapsed(), waits }
    })
}

/// Each side its own task on the current-thread runtime `rt`, awaiting its completions.
fn awaited(rt: &Runtime, sides: &mut Vec<Side>, messages: u64, spin: u32) -> Turn {
    let mut before = 0;
    for s in sides.iter_mut() {
        let cq = s.cq.awaited(rt);
        cq.set_spin(spin);
        before += cq.waits();
    }
    let time = rt.block_on(async {
        let t = Instant::now();
        let tasks: Vec<_> = sides
            .drain(..)
            .map(|mut s| {
                tokio::spawn(async move {
                    task(&mut s, messages).await;
                    s
                })
            })
            .collect();
        for task in tasks {
            let side =
                tokio::time::timeout(LIMIT, task).await.expect("an awaited end made no progress (a lost completion?)");
            sides.push(side.expect("an end's task panicked"));
        }
        t.elapsed()
    });
    let after: u64 = sides.iter_mut().map(|s| s.cq.awaited(rt).waits()).sum();
    Turn { time, waits: after - before }
}

/// What each end's task does: await completions and handle them until done.
async fn task(side: &mut Side, messages: u64) {
    let mut wcs = [WorkCompletion::EMPTY; 16];
    let Side { end, cq: Waiter::Async(cq) } = side else { unreachable!("the CQ was made async for the turn") };
    end.start(messages);
    while !end.done() {
        for wc in cq.completions(&mut wcs).await.expect("awaiting completions") {
            end.handle(wc);
        }
    }
}

/// One end on its own thread with its own current-thread runtime (as a peer in another
/// process would be), its CQ registered with that runtime for the turn and taken back
/// out after it. Returns how often the task parked.
fn per_end(side: &mut Side, messages: u64, ready: &Barrier, spin: u32) -> u64 {
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build().expect("a runtime");
    // Out of the shared runtime's reactor (if it was there), into this one's.
    side.cq.plain();
    side.cq.awaited(&rt).set_spin(spin);
    ready.wait();
    rt.block_on(async {
        tokio::time::timeout(LIMIT, task(side, messages))
            .await
            .expect("an awaited end made no progress (a lost completion?)")
    });
    let waits = side.cq.awaited(&rt).waits();
    side.cq.plain();
    waits
}

/// The ways of one load and what each turn measured, per round.
struct Interleaved {
    ways: Vec<Way>,
    /// Per way, per round: the cost of one round trip (ping-pong) or one message (rate).
    cost: Vec<Vec<f64>>,
    /// Per way, per round: parkings per round trip or per message.
    waits: Vec<Vec<f64>>,
}

/// Runs every way in turns, `rounds` times, the order rotating each round.
fn interleave(
    ways: &[Way],
    sides: &mut Vec<Side>,
    rt: &Runtime,
    rounds: usize,
    messages: u64,
    per_turn: f64,
) -> Interleaved {
    let n = ways.len();
    let (mut cost, mut waits) = (vec![Vec::new(); n], vec![Vec::new(); n]);
    for round in 0..rounds {
        for k in 0..n {
            let w = (round + k) % n;
            let t = turn(ways[w], sides, rt, messages);
            cost[w].push(t.time.as_secs_f64() / per_turn);
            waits[w].push(t.waits as f64 / per_turn);
        }
    }
    Interleaved { ways: ways.to_vec(), cost, waits }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

impl Interleaved {
    fn of(&self, way: Way) -> usize {
        self.ways.iter().position(|&w| w == way).expect("a way that ran")
    }

    /// The table of one load: `unit` names the value, `show` turns a cost into it.
    fn print(&self, title: &str, unit: &str, show: impl Fn(f64) -> f64) {
        println!("\n{title}");
        println!("{:<29} {:>12} {:>12} {:>12} {:>10}", "way", format!("median {unit}"), "min", "max", "waits");
        for (w, way) in self.ways.iter().enumerate() {
            let (lo, hi) = min_max(&self.cost[w]);
            let (a, b) = (show(lo), show(hi));
            println!(
                "{:<29} {:>12.1} {:>12.1} {:>12.1} {:>10.2}",
                way.name(),
                show(median(&self.cost[w])),
                a.min(b),
                a.max(b),
                median(&self.waits[w])
            );
        }
    }

    /// A row of the ratio table: `way`'s cost over `base`'s, of the medians, and the
    /// spread of the per-round ratios (both measured in the same round).
    fn ratio(&self, load: &str, way: Way, base: Way) {
        let (w, b) = (self.of(way), self.of(base));
        let of_medians = median(&self.cost[w]) / median(&self.cost[b]);
        let per_round: Vec<f64> = self.cost[w].iter().zip(&self.cost[b]).map(|(x, y)| x / y).collect();
        let (lo, hi) = min_max(&per_round);
        println!(
            "{:<10} {:<29} {:<29} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>6}",
            load,
            way.name(),
            format!("/ {}", base.name()),
            of_medians,
            lo,
            median(&per_round),
            hi,
            per_round.len()
        );
    }
}

/// What one empty poll costs here, in ns: what a spin of N polls means in time.
fn empty_poll_ns(sides: &mut [Side]) -> f64 {
    let mut wcs = [WorkCompletion::EMPTY; 16];
    let cq = sides[0].cq.cq();
    const N: u32 = 20_000;
    let t = Instant::now();
    for _ in 0..N {
        assert!(cq.poll(&mut wcs).unwrap().is_empty());
    }
    t.elapsed().as_nanos() as f64 / f64::from(N)
}

fn main() {
    let k = knobs();
    let ctx = Context::open(std::env::var("RDMA_DEVICE").ok().as_deref())
        .expect("no RDMA device: run under scripts/rxe (scripts/rxe cargo bench --bench async_pingpong)");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build().unwrap();
    let mut one = connections(&ctx, &pd, 1, 1);
    let mut many = connections(&ctx, &pd, k.conns, k.window);

    // What criterion_group! expands to, by hand: the state outlives criterion's part, so
    // that the interleaved tables come after its summary and end the output.
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10)
        .configure_from_args();
    let mut g = c.benchmark_group("pingpong");
    for way in [Way::Busy, Way::Blocking, Way::Async(0)] {
        g.bench_function(way.name(), |b| b.iter_custom(|iters| turn(way, &mut one, &rt, iters).time));
    }
    g.finish();
    let mut g = c.benchmark_group(format!("rate_{}_connections", k.conns));
    g.throughput(Throughput::Elements(2 * k.conns as u64));
    for way in [Way::Busy, Way::Blocking, Way::Async(0)] {
        g.bench_function(way.name(), |b| b.iter_custom(|iters| turn(way, &mut many, &rt, iters).time));
    }
    g.finish();
    c.final_summary();

    interleaved(&k, &rt, &mut one, &mut many);
    // The CQs leave the reactor before the runtime goes.
    drop((one, many));
}

/// The interleaved runs and their tables, the ratio table last.
fn interleaved(k: &Knobs, rt: &Runtime, one: &mut Vec<Side>, many: &mut Vec<Side>) {
    let poll_ns = empty_poll_ns(one);
    let shared = SPINS.map(Way::Async);
    let per_end: Vec<Way> = SPINS.iter().chain(&LONG_SPINS).map(|&n| Way::AsyncPerEnd(n)).collect();
    let mut ways = vec![Way::Busy, Way::BusyThreads, Way::BusyThreadsAgain, Way::Blocking];
    ways.extend(shared.iter().chain(&per_end));
    let ping = interleave(&ways, one, rt, k.rounds, k.iters, k.iters as f64);
    // At many connections: one thread polling, a thread per end blocking, one runtime.
    ways.retain(|w| matches!(w, Way::Busy | Way::Blocking | Way::Async(_)));
    let per_turn = (2 * k.conns as u64 * k.messages) as f64;
    let rate = interleave(&ways, many, rt, k.rounds, k.messages, per_turn);

    println!("\none empty poll costs {poll_ns:.0} ns here: a spin of N polls lasts about N x that");
    ping.print(
        &format!(
            "ping-pong, {LEN} B SEND/RECV on one RC connection: {} rounds of {} round trips per way, \
             order rotating; waits = parkings per round trip (both ends)",
            k.rounds, k.iters
        ),
        "us/RT",
        |s| s * 1e6,
    );
    rate.print(
        &format!(
            "message rate, {} connections, window {}: {} rounds of {} round trips per connection per way, \
             order rotating; waits = parkings per message",
            k.conns, k.window, k.rounds, k.messages
        ),
        "msg/s",
        |s| 1.0 / s,
    );

    println!(
        "\nFINAL (interleaved, the numbers to quote): cost ratios of medians, async over busy polling and over \
         blocking\n(time per round trip, or per message at {} connections; 1.10 = async takes 10% longer), \
         each against the way with as many threads; min/median/max of the per-round ratios",
        k.conns
    );
    println!(
        "{:<10} {:<29} {:<29} {:>7} {:>7} {:>7} {:>7} {:>6}",
        "load", "way", "against", "ratio", "min", "median", "max", "rounds"
    );
    // The noise floor: the same way measured twice in every round.
    ping.ratio("ping-pong", Way::BusyThreadsAgain, Way::BusyThreads);
    for way in shared {
        ping.ratio("ping-pong", way, Way::Busy);
        ping.ratio("ping-pong", way, Way::Blocking);
    }
    for &way in &per_end {
        ping.ratio("ping-pong", way, Way::BusyThreads);
        ping.ratio("ping-pong", way, Way::Blocking);
    }
    for way in shared {
        rate.ratio("rate", way, Way::Busy);
        rate.ratio("rate", way, Way::Blocking);
    }
}
