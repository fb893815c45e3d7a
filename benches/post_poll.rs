//! Per-operation cost of the data path: the safe API (work requests built each post, and
//! prepared requests built once), the unsafe raw API and a C loop over the inline verbs
//! (`benches/c_ref.c`), side by side in one run, with the Rust/C ratios printed at the end.
//! Needs a device: `scripts/rxe cargo bench`.
//!
//! - `write_poll/{safe,prepared,raw,c}/B`: B RDMA WRITEs of 64 bytes posted with one
//!   provider call (one doorbell), the last one signaled, then polling until its completion.
//! - `empty_poll/{safe,raw,c}`: polling a CQ with nothing in it.
//! - `post_recv/safe`: posting one receive (drained between batches, not timed).
//! - `reg_mr/SIZE`: registering and deregistering a buffer of SIZE bytes.
//!
//! Criterion measures each loop on its own, one after the other; on a noisy machine (a VM
//! under emulation) the speed drifts between them. So after the `write_poll` group the
//! four loops also run in turns, `BENCH_ROUNDS` (default 15) rounds with the order
//! rotating, and the ratios printed with the targets (safe <= 1.05 and raw <= 1.02 of C;
//! prepared requests are safe code too) are of those interleaved medians. The run ends
//! with them: each ratio as the median of the per-round ratios, with its min and max over
//! the rounds. Criterion's own medians are printed before that, labelled for reference
//! only (measured one loop after another, they carry the drift between them).

use std::ffi::c_long;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, BenchmarkId, Criterion};
use rdma_verbs::{
    ffi, AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, InitAttr, MemoryRegion, PreparedSend,
    PreparedSendQueue, ProtectionDomain, QpAccess, QpType, QueuePair, RecvQueue, RemoteMr, RemoteWritable, SendQueue,
    SendWr, WorkCompletion,
};

extern "C" {
    fn rv_c_write_poll(
        qp: *mut ffi::ibv_qp,
        cq: *mut ffi::ibv_cq,
        laddr: u64,
        lkey: u32,
        len: u32,
        raddr: u64,
        rkey: u32,
        batch: i32,
        rounds: c_long,
    ) -> i32;
    fn rv_c_empty_poll(cq: *mut ffi::ibv_cq, rounds: c_long) -> c_long;
}

const LEN: usize = 64;
const BATCHES: [usize; 3] = [1, 8, 32];

/// One RC QP pair on one device: `a` writes into `target`, which belongs to `b`'s side.
struct Pair {
    cq: CompletionQueue,
    peer_cq: CompletionQueue,
    a: QueuePair,
    b: QueuePair,
}

fn pair(ctx: &Context, pd: &ProtectionDomain) -> Pair {
    let cq = CompletionQueue::new(ctx, 256).unwrap();
    let peer_cq = CompletionQueue::new(ctx, 256).unwrap();
    let a = QueuePair::builder(pd, QpType::Rc, &cq, &cq).max_send_wr(64).max_recv_wr(64).build().unwrap();
    let b = QueuePair::builder(pd, QpType::Rc, &peer_cq, &peer_cq).max_send_wr(64).max_recv_wr(64).build().unwrap();
    let init = InitAttr { access: QpAccess::REMOTE_WRITE, ..InitAttr::default() };
    let (ia, ib) = (a.local_info(1).unwrap(), b.local_info(1).unwrap());
    a.connect(&init, &ib).unwrap();
    b.connect(&init, &ia).unwrap();
    Pair { cq, peer_cq, a, b }
}

fn poll_until_one(cq: &mut CompletionQueue, wcs: &mut [WorkCompletion]) -> usize {
    loop {
        let n = cq.poll(wcs).unwrap().len();
        if n > 0 {
            assert!(wcs[..n].iter().all(WorkCompletion::is_success), "{:?}", &wcs[..n]);
            return n;
        }
    }
}

/// One round of the C loop (`benches/c_ref.c`): `batch` writes, one completion polled.
fn c_write_poll(raw: &Pair, src: &Chunk, remote: RemoteMr, batch: usize) {
    // SAFETY: live QP and CQ; the addresses and keys are of live regions.
    let rc = unsafe {
        rv_c_write_poll(
            raw.a.as_raw(),
            raw.cq.as_raw(),
            src.addr(),
            src.lkey(),
            LEN as u32,
            remote.addr,
            remote.rkey,
            batch as i32,
            1,
        )
    };
    assert_eq!(rc, 0);
}

/// A prebuilt chain of C work requests: RDMA WRITEs of `LEN` bytes, the last signaled.
/// Boxed, so the pointers inside stay valid.
struct Chain {
    sges: [ffi::ibv_sge; 64],
    wrs: [ffi::ibv_send_wr; 64],
}

fn chain(src: &Chunk, remote: RemoteMr, batch: usize) -> Box<Chain> {
    // SAFETY: both arrays are plain data; all-zero is a valid value.
    let mut c: Box<Chain> = Box::new(unsafe { std::mem::zeroed() });
    let c_ref = &mut *c;
    for i in 0..batch {
        c_ref.sges[i] = ffi::ibv_sge { addr: src.addr(), length: LEN as u32, lkey: src.lkey() };
        let next = if i + 1 < batch { &mut c_ref.wrs[i + 1] as *mut _ } else { std::ptr::null_mut() };
        let w = &mut c_ref.wrs[i];
        w.wr_id = i as u64;
        w.sg_list = &mut c_ref.sges[i];
        w.num_sge = 1;
        w.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
        w.send_flags = if i + 1 == batch { ffi::ibv_send_flags::IBV_SEND_SIGNALED.0 } else { 0 };
        w.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: remote.addr, rkey: remote.rkey };
        w.next = next;
    }
    c
}

/// The four write-and-poll loops, each one round of `batch` writes and their completion.
struct Loops {
    sq: SendQueue<Arc<Chunk>>,
    safe: Pair,
    pq: PreparedSendQueue<Arc<Chunk>>,
    /// For each of BATCHES, that many prepared writes, the last one signaled.
    preps: Vec<Vec<PreparedSend<Arc<Chunk>>>>,
    prepared: Pair,
    raw: Pair,
    src: Arc<Chunk>,
    remote: RemoteMr,
    chains: Vec<Box<Chain>>,
    wcs: [WorkCompletion; 16],
}

impl Loops {
    fn new(ctx: &Context, pd: &ProtectionDomain, src: Arc<Chunk>, remote: RemoteMr) -> Loops {
        let safe = pair(ctx, pd);
        let sq = safe.a.send_queue().unwrap();
        let chains = BATCHES.iter().map(|&b| chain(&src, remote, b)).collect();
        let prepared = pair(ctx, pd);
        let pq = prepared.a.prepared_send_queue().unwrap();
        let preps = BATCHES
            .iter()
            .map(|&b| {
                let wr = |i| SendWr::write(Arc::clone(&src), 0..LEN, remote).signaled(i + 1 == b);
                (0..b).map(|i| pq.prepare(wr(i)).unwrap()).collect()
            })
            .collect();
        let raw = pair(ctx, pd);
        Loops { sq, safe, pq, preps, prepared, raw, src, remote, chains, wcs: [WorkCompletion::EMPTY; 16] }
    }

    fn prepared(&mut self, batch: usize) {
        let i = BATCHES.iter().position(|&b| b == batch).unwrap();
        let ps = &mut self.preps[i];
        self.pq.post_batch(ps.drain(..)).unwrap();
        let n = poll_until_one(&mut self.prepared.cq, &mut self.wcs);
        for wc in &mut self.wcs[..n] {
            // In posting order: the batch comes back as it was.
            self.pq.complete(wc, |d| ps.push(d.value)).unwrap();
        }
    }

    fn safe(&mut self, batch: usize) {
        let (src, remote) = (&self.src, self.remote);
        let wrs = (0..batch).map(|i| SendWr::write(Arc::clone(src), 0..LEN, remote).signaled(i + 1 == batch));
        self.sq.post_batch(wrs).unwrap();
        let n = poll_until_one(&mut self.safe.cq, &mut self.wcs);
        for wc in &mut self.wcs[..n] {
            self.sq.complete(wc, drop).unwrap();
        }
    }

    fn raw(&mut self, batch: usize) {
        let i = BATCHES.iter().position(|&b| b == batch).unwrap();
        // SAFETY: the chain names `src` and the target region, which outlive every post,
        // and each round waits for its completion before the chain is posted again.
        unsafe { self.raw.a.post_send_raw(&mut self.chains[i].wrs[0]) }.unwrap();
        poll_until_one(&mut self.raw.cq, &mut self.wcs);
    }

    fn c(&mut self, batch: usize) {
        c_write_poll(&self.raw, &self.src, self.remote, batch);
    }

    /// The four loops in turns, ROUNDS times (the order rotating each round), so drift
    /// in the machine's speed reaches them alike; prints each one's median cost per round
    /// and the ratios against the C loop with the targets.
    fn interleaved(&mut self) {
        let rounds: usize = std::env::var("BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(15);
        const PER_TURN: u32 = 200;
        println!(
            "\nwrite_poll interleaved: {rounds} rounds of {PER_TURN} iterations per loop, medians in ns per iteration"
        );
        println!(
            "{:<6} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7}  target",
            "batch", "safe", "prepared", "raw", "C", "safe/C", "prep/C", "raw/C"
        );
        for batch in BATCHES {
            let mut times: [Vec<f64>; 4] = Default::default();
            for round in 0..rounds {
                for k in 0..4 {
                    let which = (round + k) % 4;
                    let t = Instant::now();
                    for _ in 0..PER_TURN {
                        match which {
                            0 => self.safe(batch),
                            1 => self.prepared(batch),
                            2 => self.raw(batch),
                            _ => self.c(batch),
                        }
                    }
                    times[which].push(t.elapsed().as_nanos() as f64 / f64::from(PER_TURN));
                }
            }
            let [s, p, r, c] = times.clone().map(|mut v| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            });
            let verdict = |ratio: f64, max: f64| if ratio <= max { "ok" } else { "MISS" };
            println!(
                "{batch:<6} {s:>9.0} {p:>9.0} {r:>9.0} {c:>9.0} {:>7.3} {:>7.3} {:>7.3}  safe, prepared <= 1.05: {}, {}; \
                 raw <= 1.02: {}",
                s / c,
                p / c,
                r / c,
                verdict(s / c, 1.05),
                verdict(p / c, 1.05),
                verdict(r / c, 1.02)
            );
            // The spread: each round's own ratio (the loops of one round ran moments apart).
            let spread = |k: usize| {
                let mut v: Vec<f64> = (0..rounds).map(|i| times[k][i] / times[3][i]).collect();
                v.sort_by(f64::total_cmp);
                format!("{:.3} [{:.3}..{:.3}]", v[v.len() / 2], v[0], v[v.len() - 1])
            };
            FINAL.lock().unwrap().push(format!(
                "{batch:<6} {:>25} {:>25} {:>25}  {}",
                spread(0),
                spread(1),
                spread(2),
                if s / c <= 1.05 && p / c <= 1.05 && r / c <= 1.02 { "ok" } else { "MISS" }
            ));
        }
        *ROUNDS.lock().unwrap() = rounds;
    }
}

/// The interleaved table's rows with their spread, printed last (the sound figures).
static FINAL: Mutex<Vec<String>> = Mutex::new(Vec::new());
static ROUNDS: Mutex<usize> = Mutex::new(0);

fn benches(c: &mut Criterion) {
    let ctx =
        Context::open(std::env::var("RDMA_DEVICE").ok().as_deref()).expect("no RDMA device: run under scripts/rxe");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let target: MemoryRegion<AlignedBuf, RemoteWritable> = pd
        .register_remote_writable(AlignedBuf::new(4096).unwrap(), AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let remote = target.remote().unwrap();
    let src: Arc<Chunk> = Arc::new(
        pd.register(AlignedBuf::new(4096).unwrap(), AccessFlags::LOCAL_WRITE)
            .unwrap()
            .into_chunks(4096)
            .unwrap()
            .remove(0),
    );
    let mut wcs = [WorkCompletion::EMPTY; 16];

    // Safe: SendQueue posts, the CQ polls, complete() hands the shared source back.
    // Raw and C share one pair: both post C work requests themselves.
    let mut l = Loops::new(&ctx, &pd, Arc::clone(&src), remote);

    let mut g = c.benchmark_group("write_poll");
    for batch in BATCHES {
        g.bench_with_input(BenchmarkId::new("safe", batch), &batch, |b, &batch| b.iter(|| l.safe(batch)));
        g.bench_with_input(BenchmarkId::new("prepared", batch), &batch, |b, &batch| b.iter(|| l.prepared(batch)));
        g.bench_with_input(BenchmarkId::new("raw", batch), &batch, |b, &batch| b.iter(|| l.raw(batch)));
        g.bench_with_input(BenchmarkId::new("c", batch), &batch, |b, &batch| b.iter(|| l.c(batch)));
    }
    g.finish();
    l.interleaved();
    let Loops { sq, safe, raw, .. } = l;
    let mut sq = sq;
    let mut safe = safe;

    let mut g = c.benchmark_group("empty_poll");
    g.bench_function("safe", |b| b.iter(|| black_box(safe.peer_cq.poll(&mut wcs).unwrap().len())));
    g.bench_function("raw", |b| {
        b.iter(|| {
            // SAFETY: live CQ; `wcs` has room for 16 (WorkCompletion is repr(transparent)).
            black_box(unsafe { ffi::ibv_poll_cq(raw.peer_cq.as_raw(), 16, wcs.as_mut_ptr().cast()) })
        })
    });
    // SAFETY: a live CQ.
    g.bench_function("c", |b| b.iter(|| black_box(unsafe { rv_c_empty_poll(raw.peer_cq.as_raw(), 1) })));
    g.finish();

    // Receives: post k (timed), then have the peer consume them (untimed).
    let mut rq: RecvQueue<Chunk> = safe.b.recv_queue().unwrap();
    let recv_bufs: Vec<Chunk> =
        pd.register(AlignedBuf::new(64 * 64).unwrap(), AccessFlags::LOCAL_WRITE).unwrap().into_chunks(64).unwrap();
    let mut recv_bufs = Some(recv_bufs);
    let mut g = c.benchmark_group("post_recv");
    g.bench_function("safe", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            let mut bufs = recv_bufs.take().unwrap();
            let mut back = Vec::with_capacity(bufs.len());
            while left > 0 {
                let k = left.min(bufs.len() as u64) as usize;
                let t = Instant::now();
                for _ in 0..k {
                    let buf = bufs.pop().unwrap();
                    rq.post(buf, 0..64, 0).unwrap();
                }
                total += t.elapsed();
                // Drain: A sends k messages into them.
                for _ in 0..k {
                    sq.post(SendWr::send(Arc::clone(&src), 0..8)).unwrap();
                    let n = poll_until_one(&mut safe.cq, &mut wcs);
                    for wc in &mut wcs[..n] {
                        sq.complete(wc, drop).unwrap();
                    }
                }
                let mut got = 0;
                while got < k {
                    let n = poll_until_one(&mut safe.peer_cq, &mut wcs);
                    for wc in &mut wcs[..n] {
                        back.push(rq.complete(wc).unwrap().value);
                    }
                    got += n;
                }
                bufs.append(&mut back);
                left -= k as u64;
            }
            recv_bufs = Some(bufs);
            total
        })
    });
    g.finish();

    let mut g = c.benchmark_group("reg_mr");
    for size in [4096usize, 65536, 1 << 20, 16 << 20] {
        let mut buf = vec![0u8; size];
        g.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, _| {
            b.iter(|| drop(pd.register_slice(&mut buf, AccessFlags::LOCAL_WRITE).unwrap()))
        });
    }
    g.finish();
    drop((target, raw));
}

criterion_group! {
    name = data_path;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2)).sample_size(20);
    targets = benches
}

fn main() {
    data_path();
    Criterion::default().final_summary();
    print_ratios();
    print_final();
}

/// The last table: the interleaved ratios with their spread over rounds, the figures to
/// quote.
fn print_final() {
    let rows = FINAL.lock().unwrap();
    if rows.is_empty() {
        return;
    }
    println!(
        "\nRust/C ratios, interleaved (the sound figures): median of the per-round ratios [min..max] over {} rounds",
        ROUNDS.lock().unwrap()
    );
    println!(
        "{:<6} {:>25} {:>25} {:>25}  targets (safe, prepared <= 1.05; raw <= 1.02)",
        "batch", "safe/C", "prepared/C", "raw/C"
    );
    for row in rows.iter() {
        println!("{row}");
    }
}

/// Reads criterion's medians back and prints the Rust/C ratios.
fn print_ratios() {
    let dir = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into()) + "/criterion";
    let median = |path: &str| -> Option<f64> {
        let text = std::fs::read_to_string(format!("{dir}/{path}/new/estimates.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v["median"]["point_estimate"].as_f64()
    };
    println!(
        "\nFor reference only: Rust/C ratios of criterion's medians. Criterion measured each loop on its own, one \
         after the other, so drift in the machine's speed between them moves these ratios (under emulation by \
         tens of percent); quote the interleaved table below."
    );
    println!("{:<22} {:>10} {:>10} {:>10} {:>9} {:>9}", "benchmark", "safe ns", "raw ns", "C ns", "safe/C", "raw/C");
    let mut rows: Vec<(String, String, String, String)> = BATCHES
        .iter()
        .map(|b| {
            (
                format!("write_poll batch {b}"),
                format!("write_poll/safe/{b}"),
                format!("write_poll/raw/{b}"),
                format!("write_poll/c/{b}"),
            )
        })
        .collect();
    rows.push(("empty_poll".into(), "empty_poll/safe".into(), "empty_poll/raw".into(), "empty_poll/c".into()));
    for (name, s, r, c) in rows {
        match (median(&s), median(&r), median(&c)) {
            (Some(s), Some(r), Some(c)) => {
                println!("{name:<22} {s:>10.0} {r:>10.0} {c:>10.0} {:>9.3} {:>9.3}", s / c, r / c)
            }
            _ => println!("{name:<22} (no estimates under {dir})"),
        }
    }
}
