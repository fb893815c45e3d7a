//! `syscall_probe`: one data-path operation in a steady loop, for counting its system
//! calls under strace (`scripts/syscalls`) and its user-space instructions under callgrind
//! (`scripts/instructions`), on rxe.
//!
//! ```text
//! syscall_probe poll N          N polls of an empty CQ
//! syscall_probe recv N          N receives posted (RecvQueue), nothing sent (N <= 8192)
//! syscall_probe OP-WAY N K      N rounds of K requests (K <= 64): K = 1 posts one request
//!                               (post), K > 1 all K in one post (post_batch, a chain);
//!                               then every completion is taken before the next round.
//!                               Each way is one loop in one function, as its user writes
//!                               it (the harness's helpers are inlined into it)
//!   OP   write   64 B RDMA WRITEs into the peer's region
//!        send    64 B SENDs; the peer's receives are pre-posted with the raw API at
//!                setup (8192 of them, whatever N), and nothing takes their completions
//!        recv    K receives posted and their completions taken; the SENDs that fill
//!                them are the raw way's, the same code for both ways of receiving
//!   WAY  safe    SendQueue (RecvQueue for recv): each request built on every post, each
//!                completion handed back with `complete`
//!        prepared  PreparedSendQueue (PreparedRecvQueue for recv): requests prepared once,
//!                posted again every round
//!        chain   SendChainQueue (RecvChainQueue for recv): the K requests prepared as one
//!                chain (`prepare_chain`), posted whole with `post` every round, each
//!                poll's completions taken with one `complete_all`
//!        raw     what a C programmer writes: C requests built once, only the wr_id
//!                stamped per post, ibv_post_send (ibv_post_recv for recv) and
//!                ibv_poll_cq called directly, each completion's status checked
//!        rawbuilt  the same loop with the C requests (and SGEs) built at every post,
//!                the work a request built at each post does in C
//!        floorlocal, floorring, floordeque, floorslots  rawbuilt plus the bookkeeping any API that
//!                owns what it posts must do, by hand in plain safe Rust, four ways:
//!                an index ring whose slot is the wr_id (modulo the depth), written
//!                with the loop's locals (local) or as a struct (ring), a VecDeque
//!                in posting order, slots of Option with a free list (the wr_id the
//!                slot's index); each buffer kept until its completion, then handed
//!                back (measures, not APIs: scripts/instructions' floor is the cheapest)
//!        extsafe, extprepared  safe and prepared again, A built with extended send
//!                ops (SendQueue then posts through ibv_wr_*; prepared requests through
//!                ibv_post_send)
//!        extraw  C on that QP: ibv_wr_start, each request's op and SGE, ibv_wr_complete
//!        extfloorlocal, extfloorring, extfloordeque, extfloorslots  extraw plus each
//!                floor's bookkeeping
//! syscall_probe send-batch N K           send-safe    (names scripts/syscalls uses)
//! syscall_probe prepared-send-batch N K  send-prepared
//! ```
//!
//! It opens `RDMA_DEVICE` (else the first device) and connects two RC QPs to each other
//! on it: A sends, B receives. The setup is the same whatever N, so a run with N = 0
//! counts the setup alone, and the difference to a run with N counts N rounds; every run
//! also does two rounds before those N (in both runs, so first-call costs such as lazy
//! symbol binding drop out). Between setup and phase it prints a marker line to stderr
//! and asks callgrind to start instrumenting (a no-op outside Valgrind), and it prints
//! another line at the end; then it exits without tearing down (the kernel releases the
//! objects), so that teardown, which depends on what is still posted, is not counted.
//!
//! Each way is its own small function (`sends_safe`, `sends_prepared`, ...), using only
//! the public API.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use rdma_verbs::{
    ffi, AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, InitAttr, MemoryRegion, ProtectionDomain, QpAccess,
    QpType, QueuePair, RemoteMr, RemoteWritable, SendOps, SendWr, WorkCompletion,
};

/// callgrind's client request that starts the counting (`start_instrumentation`).
#[path = "shared/callgrind.rs"]
mod callgrind;
use callgrind::start_instrumentation;

/// The phase's names, for the usage errors.
const PHASES: &str = "poll N | recv N | OP-WAY N K (OP: write, send, recv; WAY: safe, prepared, chain, raw, rawbuilt, \
     floorlocal, floorring, floordeque, floorslots, extsafe, extprepared, extraw, extfloorlocal, extfloorring, \
     extfloordeque, extfloorslots) | \
                      send-batch N K | prepared-send-batch N K";
/// Receives pre-posted for the SEND phases, B's receive queue depth, and the most
/// receives the `recv` phase posts.
const RECV_DEPTH: usize = 8192;
/// Send queue depth, and the largest K.
const SEND_DEPTH: usize = 64;
/// Bytes per message.
const LEN: usize = 64;
/// Rounds every run does before its N (in the N = 0 run too).
const WARMUP: usize = 2;

type Res<T> = Result<T, Box<dyn std::error::Error>>;
type Wcs = [WorkCompletion; 16];
/// The raw ways' completions: C's own array.
type RawWcs = [ffi::ibv_wc; 16];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Write,
    Send,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Safe,
    Prepared,
    Chain,
    Raw,
    RawBuilt,
    /// RawBuilt plus the bookkeeping any API owning what it posts must do, kept the way
    /// named (a measure, not an API: `sends_floor`).
    Floor(Keep),
    /// The safe ways again, on a QP built with extended send ops (`ibv_wr_*`).
    ExtSafe,
    ExtPrepared,
    /// What a C programmer writes on that QP: `ibv_wr_start`, per request the op and its
    /// SGE, `ibv_wr_complete` (the extended API builds every request at each post).
    ExtRaw,
    /// ExtRaw plus the floor's bookkeeping (`sends_floor_ext`).
    ExtFloor(Keep),
}

impl Way {
    /// Whether A is built with extended send ops.
    fn extended(self) -> bool {
        matches!(self, Way::ExtSafe | Way::ExtPrepared | Way::ExtRaw | Way::ExtFloor(_))
    }
}

enum Phase {
    Poll { n: usize },
    Recv { n: usize },
    Sends { op: Op, way: Way, n: usize, k: usize },
    Recvs { way: Way, n: usize, k: usize },
}

/// The command line: a phase, its N, and its K where it has one (see the module docs).
#[derive(Parser)]
#[command(name = "syscall_probe", about = "One data-path operation in a steady loop, for strace and callgrind")]
#[command(after_help = format!("PHASE: {PHASES}"))]
struct Args {
    /// poll, recv, OP-WAY, send-batch or prepared-send-batch.
    phase: String,
    /// Rounds (polls, receives).
    n: usize,
    /// Requests per round (OP-WAY phases).
    k: Option<usize>,
}

impl Args {
    /// The command line as it was given, for the marker line.
    fn text(&self) -> String {
        let k = self.k.map(|k| format!(" {k}")).unwrap_or_default();
        format!("{} {}{k}", self.phase, self.n)
    }
}

fn parse(args: &Args) -> Result<Phase, String> {
    let (name, n) = (args.phase.as_str(), args.n);
    let counts = if args.k.is_some() { "two counts" } else { "one count" };
    let usage = || format!("{name:?} with {counts} is no phase: {PHASES}");
    let (op, way) = match name {
        "poll" | "recv" if args.k.is_none() => {
            if name == "poll" {
                return Ok(Phase::Poll { n });
            }
            if n > RECV_DEPTH {
                return Err(format!("recv: at most {RECV_DEPTH} receives"));
            }
            return Ok(Phase::Recv { n });
        }
        "send-batch" => ("send", "safe"),
        "prepared-send-batch" => ("send", "prepared"),
        _ => name.split_once('-').ok_or_else(usage)?,
    };
    let way = match way {
        "safe" => Way::Safe,
        "prepared" => Way::Prepared,
        "chain" => Way::Chain,
        "raw" => Way::Raw,
        "rawbuilt" => Way::RawBuilt,
        "floorlocal" => Way::Floor(Keep::Local),
        "floorring" => Way::Floor(Keep::Ring),
        "floordeque" => Way::Floor(Keep::Deque),
        "floorslots" => Way::Floor(Keep::Slots),
        "extsafe" => Way::ExtSafe,
        "extprepared" => Way::ExtPrepared,
        "extraw" => Way::ExtRaw,
        "extfloorlocal" => Way::ExtFloor(Keep::Local),
        "extfloorring" => Way::ExtFloor(Keep::Ring),
        "extfloordeque" => Way::ExtFloor(Keep::Deque),
        "extfloorslots" => Way::ExtFloor(Keep::Slots),
        _ => return Err(usage()),
    };
    let k = args.k.ok_or_else(usage)?;
    if k == 0 || k > SEND_DEPTH {
        return Err(format!("{name}: K from 1 to {SEND_DEPTH}"));
    }
    match op {
        "write" => Ok(Phase::Sends { op: Op::Write, way, n, k }),
        "send" if (n + WARMUP) * k > RECV_DEPTH => {
            Err(format!("{name}: at most {RECV_DEPTH} sends in all ({WARMUP} warm-up rounds included)"))
        }
        "send" => Ok(Phase::Sends { op: Op::Send, way, n, k }),
        "recv" if way.extended() => Err(format!("{name}: receives have no extended API")),
        "recv" => Ok(Phase::Recvs { way, n, k }),
        _ => Err(usage()),
    }
}

/// Two RC QPs on one device, connected to each other: A sends, B receives.
struct Loopback {
    cq_a: CompletionQueue,
    cq_b: CompletionQueue,
    a: QueuePair,
    b: QueuePair,
    /// Sources on A, 64 bytes each, filled.
    srcs: Vec<Chunk>,
    /// Receive buffers on B.
    dsts: Vec<Chunk>,
    /// Where the WRITEs land: 64 bytes of B's side that peers may write.
    target: RemoteMr,
    /// Where polls put completions: one array for the whole run, as a program keeps it.
    wcs: Wcs,
    /// The same for the raw ways.
    raw_wcs: RawWcs,
    _target_mr: MemoryRegion<AlignedBuf, RemoteWritable>,
}

/// `extended`: A is built with extended send ops (RDMA WRITE and SEND).
fn setup(extended: bool) -> Res<Loopback> {
    let ctx = match std::env::var("RDMA_DEVICE") {
        Ok(name) => Context::open(Some(&name))?,
        Err(_) => Context::open_first()?,
    };
    let pd = ProtectionDomain::new(&ctx)?;
    let cq_a = CompletionQueue::new(&ctx, (SEND_DEPTH + SEND_DEPTH) as u32)?;
    let cq_b = CompletionQueue::new(&ctx, (SEND_DEPTH + RECV_DEPTH) as u32)?;
    let qp = |cq: &CompletionQueue, recv_depth: usize| {
        QueuePair::builder(&pd, QpType::Rc, cq, cq)
            .max_send_wr(SEND_DEPTH as u32)
            .max_recv_wr(recv_depth as u32)
            .build()
    };
    let a = if extended {
        QueuePair::builder(&pd, QpType::Rc, &cq_a, &cq_a)
            .max_send_wr(SEND_DEPTH as u32)
            .max_recv_wr(SEND_DEPTH as u32)
            .extended_send_ops(SendOps::RDMA_WRITE | SendOps::SEND)
            .build()?
    } else {
        qp(&cq_a, SEND_DEPTH)?
    };
    let b = qp(&cq_b, RECV_DEPTH)?;
    let init = InitAttr { access: QpAccess::REMOTE_WRITE, ..InitAttr::default() };
    let (ia, ib) = (a.local_info(1)?, b.local_info(1)?);
    a.connect(&init, &ib)?;
    b.connect(&init, &ia)?;

    let mut srcs = pd.register(AlignedBuf::new(SEND_DEPTH * LEN)?, AccessFlags::LOCAL_WRITE)?.into_chunks(LEN)?;
    for src in &mut srcs {
        src.fill(0x5a);
    }
    let dsts = pd.register(AlignedBuf::new(RECV_DEPTH * LEN)?, AccessFlags::LOCAL_WRITE)?.into_chunks(LEN)?;
    let target_mr = pd.register_remote_writable(AlignedBuf::new(LEN)?, AccessFlags::REMOTE_WRITE)?;
    let target = target_mr.remote()?;
    let wcs = [WorkCompletion::EMPTY; 16];
    // SAFETY: ibv_wc is plain data; all-zero is a valid value.
    let raw_wcs = unsafe { std::mem::zeroed() };
    Ok(Loopback { cq_a, cq_b, a, b, srcs, dsts, target, wcs, raw_wcs, _target_mr: target_mr })
}

/// Pre-posts `RECV_DEPTH` receives on B with the raw API, all into one buffer that
/// nothing reads (for the SEND phases: their completions are never taken).
fn prepost_receives(lo: &mut Loopback) -> Res<()> {
    let sink = lo.dsts.pop().ok_or("no receive buffer")?;
    let mut sge = ffi::ibv_sge { addr: sink.addr(), length: LEN as u32, lkey: sink.lkey() };
    let mut wr = ffi::ibv_recv_wr { wr_id: 0, next: std::ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
    for _ in 0..RECV_DEPTH {
        // SAFETY: the SGE names the bytes of `sink`, which is leaked below: they stay
        // registered for the life of the process and no Rust code reads them.
        unsafe { lo.b.post_recv_raw(&mut wr) }?;
    }
    std::mem::forget(sink);
    Ok(())
}

/// SYSCALL_PROBE_SETTLE=1 (scripts/instructions): lets the device finish first, so the
/// number of empty polls, which depends on timing, does not enter an instruction count.
/// Not inlined: scripts/instructions leaves it out of the count by its name.
#[inline(never)]
fn settle() {
    static SETTLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *SETTLE.get_or_init(|| std::env::var_os("SYSCALL_PROBE_SETTLE").is_some()) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `cq` into `wcs` until `want` completions have been handed to `each`. It reads
/// the clock only after a long run of empty polls: where the clock is not in the vDSO (a
/// VM without a stable TSC), each reading is a system call that would count as the data
/// path's. Inlined: each way is one loop, as a user writes it.
#[inline(always)]
fn drain(
    cq: &mut CompletionQueue,
    wcs: &mut Wcs,
    want: usize,
    mut each: impl FnMut(&mut WorkCompletion) -> Res<()>,
) -> Res<()> {
    settle();
    let (mut got, mut waiting) = (0, Waiting::default());
    while got < want {
        let done = cq.poll(wcs)?;
        for wc in done.iter_mut() {
            wc.ok()?;
            each(wc)?;
            got += 1;
        }
        if done.is_empty() {
            waiting.empty_poll(got, want)?;
        }
    }
    Ok(())
}

/// Empty polls of the measured phase: where SYSCALL_PROBE_SETTLE let the device finish
/// first there are none, and any counted means timing leaked into the instruction count
/// (the probe reports them at the end; scripts/instructions runs such a count again).
static EMPTY_POLLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The empty polls of one drain, all handled out of line: a poll that found completions
/// costs the loop nothing here.
#[derive(Default)]
struct Waiting {
    empty: u32,
    /// How many completions the last long run of empty polls found taken, and when that
    /// run started to count against the 30 s.
    seen: Option<(usize, Instant)>,
}

impl Waiting {
    /// Counts an empty poll; after each run of 2^20 of them, fails once 30 s passed with
    /// no completion taken.
    #[cold]
    #[inline(never)]
    fn empty_poll(&mut self, got: usize, want: usize) -> Res<()> {
        EMPTY_POLLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.empty += 1;
        if self.empty < 1 << 20 {
            return Ok(());
        }
        self.empty = 0;
        let now = Instant::now();
        match self.seen {
            Some((at, since)) if at == got => {
                if now > since + Duration::from_secs(30) {
                    return Err(format!("{got} of {want} completions after 30 s").into());
                }
            }
            _ => self.seen = Some((got, now)),
        }
        Ok(())
    }
}

/// [`drain`] as a C programmer writes it: `ibv_poll_cq` itself, each completion's status
/// checked, nothing handed anywhere. Inlined: the raw ways are one loop each.
#[inline(always)]
fn drain_raw(cq: *mut ffi::ibv_cq, wcs: &mut RawWcs, want: usize) -> Res<()> {
    settle();
    let (mut got, mut waiting) = (0, Waiting::default());
    while got < want {
        // SAFETY: the CQ is the probe's, alive for the run; `wcs` has room for 16.
        let n = unsafe { ffi::ibv_poll_cq(cq, wcs.len() as i32, wcs.as_mut_ptr()) };
        let Ok(n) = usize::try_from(n) else { return Err(format!("ibv_poll_cq: {n}").into()) };
        for wc in &wcs[..n] {
            if wc.status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
                return Err(format!("wr_id {} failed with status {}", wc.wr_id, wc.status.0).into());
            }
        }
        got += n;
        if n == 0 {
            waiting.empty_poll(got, want)?;
        }
    }
    Ok(())
}

/// `ibv_post_send` itself, its error as the probe's.
#[inline(always)]
fn post_send(qp: *mut ffi::ibv_qp, wr: *mut ffi::ibv_send_wr) -> Res<()> {
    let mut bad = std::ptr::null_mut();
    // SAFETY: the caller's requests are linked, valid C requests naming registered bytes
    // of the probe that outlive them; the QP is alive for the run.
    match unsafe { ffi::ibv_post_send(qp, wr, &mut bad) } {
        0 => Ok(()),
        rc => Err(format!("ibv_post_send: {}", std::io::Error::from_raw_os_error(rc)).into()),
    }
}

/// `ibv_post_recv` itself, its error as the probe's.
#[inline(always)]
fn post_recv(qp: *mut ffi::ibv_qp, wr: *mut ffi::ibv_recv_wr) -> Res<()> {
    let mut bad = std::ptr::null_mut();
    // SAFETY: as for post_send: linked receives naming bytes of the probe's receive
    // buffers, which outlive them and which no Rust code reads meanwhile.
    match unsafe { ffi::ibv_post_recv(qp, wr, &mut bad) } {
        0 => Ok(()),
        rc => Err(format!("ibv_post_recv: {}", std::io::Error::from_raw_os_error(rc)).into()),
    }
}

/// [`drain`] a poll at a time: each poll's completions are handed to `take` in one call
/// (`complete_all`), which checks their status itself.
#[inline(always)]
fn drain_all(
    cq: &mut CompletionQueue,
    wcs: &mut Wcs,
    want: usize,
    mut take: impl FnMut(&mut [WorkCompletion]) -> Res<()>,
) -> Res<()> {
    settle();
    let (mut got, mut waiting) = (0, Waiting::default());
    while got < want {
        let done = cq.poll(wcs)?;
        got += done.len();
        let empty = done.is_empty();
        take(done)?;
        if empty {
            waiting.empty_poll(got, want)?;
        }
    }
    Ok(())
}

/// The safe request of `op` for the first 64 bytes of `buf`.
fn wr(op: Op, buf: Chunk, target: RemoteMr) -> SendWr<Chunk> {
    match op {
        Op::Write => SendWr::write(buf, 0..LEN, target),
        Op::Send => SendWr::send(buf, 0..LEN),
    }
}

/// SendQueue: every round builds its requests anew (`post`, or `post_batch` for K > 1),
/// and `complete` hands each source back. The operation is chosen once, outside the
/// loop, as a user's loop names its `SendWr::write` or `SendWr::send` (and as the raw
/// ways choose their opcode).
fn sends_safe(lo: &mut Loopback, op: Op, rounds: usize, k: usize) -> Res<()> {
    let target = lo.target;
    match op {
        Op::Write => sends_safe_of(lo, rounds, k, |b| SendWr::write(b, 0..LEN, target)),
        Op::Send => sends_safe_of(lo, rounds, k, |b| SendWr::send(b, 0..LEN)),
    }
}

/// [`sends_safe`] for the requests that `wr` builds.
// Each way is compiled on its own (out of line): inlined into one `run`, a way's count
// moved by a few instructions whenever another way changed.
#[inline(never)]
fn sends_safe_of(lo: &mut Loopback, rounds: usize, k: usize, wr: impl Fn(Chunk) -> SendWr<Chunk>) -> Res<()> {
    let mut sq = lo.a.send_queue::<Chunk>()?;
    let mut bufs: Vec<Chunk> = lo.srcs.drain(..k).collect();
    if k == 1 {
        let mut buf = bufs.pop();
        for _ in 0..rounds {
            let b = buf.take().ok_or("the source did not come back")?;
            sq.post(wr(b)).map_err(rdma_verbs::Error::from)?;
            drain(&mut lo.cq_a, &mut lo.wcs, 1, |wc| {
                sq.complete(wc, |d| buf = Some(d.value))?;
                Ok(())
            })?;
        }
    } else {
        for _ in 0..rounds {
            sq.post_batch(bufs.drain(..).map(&wr)).map_err(rdma_verbs::Error::from)?;
            drain(&mut lo.cq_a, &mut lo.wcs, k, |wc| {
                sq.complete(wc, |d| bufs.push(d.value))?;
                Ok(())
            })?;
        }
    }
    Ok(())
}

/// PreparedSendQueue: K requests prepared once (before the rounds), posted again every round
/// (`post`, or `post_batch` for K > 1); `complete` hands each back.
#[inline(never)]
fn sends_prepared(lo: &mut Loopback, op: Op, rounds: usize, k: usize) -> Res<()> {
    let mut pq = lo.a.prepared_send_queue::<Chunk>()?;
    let mut ps = Vec::with_capacity(k);
    for b in lo.srcs.drain(..k) {
        ps.push(pq.prepare(wr(op, b, lo.target)).map_err(rdma_verbs::Error::from)?);
    }
    if k == 1 {
        let mut p = ps.pop();
        for _ in 0..rounds {
            pq.post(p.take().ok_or("the request did not come back")?).map_err(rdma_verbs::Error::from)?;
            drain(&mut lo.cq_a, &mut lo.wcs, 1, |wc| {
                pq.complete(wc, |d| p = Some(d.value))?;
                Ok(())
            })?;
        }
    } else {
        for _ in 0..rounds {
            pq.post_batch(ps.drain(..)).map_err(rdma_verbs::Error::from)?;
            drain(&mut lo.cq_a, &mut lo.wcs, k, |wc| {
                // Completions come in posting order: `ps` keeps its order.
                pq.complete(wc, |d| ps.push(d.value))?;
                Ok(())
            })?;
        }
    }
    Ok(())
}

/// SendChainQueue: the K requests prepared as one chain, posted whole each round.
#[inline(never)]
fn sends_chain(lo: &mut Loopback, op: Op, rounds: usize, k: usize) -> Res<()> {
    let mut pq = lo.a.send_chain_queue::<Chunk>()?;
    let target = lo.target;
    let chain = pq.prepare_chain(lo.srcs.drain(..k).map(|b| wr(op, b, target))).map_err(rdma_verbs::Error::from)?;
    let mut chain = Some(chain);
    for _ in 0..rounds {
        pq.post(chain.take().ok_or("the chain did not come back")?).map_err(rdma_verbs::Error::from)?;
        // Each poll's completions taken in one call; the chain comes back once, its Done
        // carrying the first failure among them (checked, as the raw way checks each).
        let mut back = None;
        drain_all(&mut lo.cq_a, &mut lo.wcs, k, |done| {
            pq.complete_all(done, |d| back = Some(d))?;
            Ok(())
        })?;
        let d = back.ok_or("the chain did not come back")?;
        chain = Some(d.result().map_err(rdma_verbs::Error::from)?.value);
    }
    Ok(())
}

/// The raw way's requests: a chain of C send requests built once; each round stamps the
/// `wr_id`s, posts the chain with `post_send_raw`, and counts the completions.
struct RawSends {
    wrs: Box<[ffi::ibv_send_wr]>,
    _sges: Box<[ffi::ibv_sge]>,
    next_id: u64,
}

impl RawSends {
    fn new(op: Op, srcs: &[Chunk], target: RemoteMr) -> RawSends {
        let mut sges: Box<[ffi::ibv_sge]> =
            srcs.iter().map(|s| ffi::ibv_sge { addr: s.addr(), length: LEN as u32, lkey: s.lkey() }).collect();
        // SAFETY: ibv_send_wr is plain data; all-zero is a valid value.
        let mut wrs: Box<[ffi::ibv_send_wr]> = srcs.iter().map(|_| unsafe { std::mem::zeroed() }).collect();
        let k = wrs.len();
        for i in 0..k {
            let next = if i + 1 < k { &mut wrs[i + 1] as *mut _ } else { std::ptr::null_mut() };
            let w = &mut wrs[i];
            (w.sg_list, w.num_sge, w.next) = (&mut sges[i], 1, next);
            w.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
            w.opcode = match op {
                Op::Write => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                Op::Send => ffi::ibv_wr_opcode::IBV_WR_SEND,
            };
            if op == Op::Write {
                w.wr.rdma =
                    ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: target.addr, rkey: target.rkey };
            }
        }
        RawSends { wrs, _sges: sges, next_id: 0 }
    }

    /// One round: post the chain (linked, in boxes that do not move, naming the probe's
    /// sources), take its completions.
    #[inline(always)]
    fn round(&mut self, qp: &QueuePair, cq: &CompletionQueue, wcs: &mut RawWcs) -> Res<()> {
        for w in self.wrs.iter_mut() {
            w.wr_id = self.next_id;
            self.next_id += 1;
        }
        post_send(qp.as_raw(), &mut self.wrs[0])?;
        drain_raw(cq.as_raw(), wcs, self.wrs.len())
    }
}

/// The raw API: C requests built once, only the `wr_id`s stamped per post; completions
/// polled and checked.
#[inline(never)]
fn sends_raw(lo: &mut Loopback, op: Op, rounds: usize, k: usize) -> Res<()> {
    let mut chain = RawSends::new(op, &lo.srcs[..k], lo.target);
    for _ in 0..rounds {
        chain.round(&lo.a, &lo.cq_a, &mut lo.raw_wcs)?;
    }
    Ok(())
}

/// The raw API with each C request and its SGE built at every post (the rest of the
/// request zeroed, as C's `struct ibv_send_wr wr = { ... }` does), linked, posted in one
/// call; completions polled and checked.
#[inline(never)]
fn sends_raw_built(lo: &mut Loopback, op: Op, rounds: usize, k: usize) -> Res<()> {
    let srcs: Vec<(u64, u32)> = lo.srcs[..k].iter().map(|s| (s.addr(), s.lkey())).collect();
    let (qp, cq, target) = (lo.a.as_raw(), lo.cq_a.as_raw(), lo.target);
    let mut sges = [ffi::ibv_sge { addr: 0, length: 0, lkey: 0 }; SEND_DEPTH];
    // SAFETY: ibv_send_wr is plain data; all-zero is a valid value.
    let mut wrs: [ffi::ibv_send_wr; SEND_DEPTH] = unsafe { std::mem::zeroed() };
    let (opcode, rdma) = match op {
        Op::Write => (
            ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: target.addr, rkey: target.rkey },
        ),
        Op::Send => (ffi::ibv_wr_opcode::IBV_WR_SEND, ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1::default()),
    };
    let mut next_id = 0;
    for _ in 0..rounds {
        let (wp, sp) = (wrs.as_mut_ptr(), sges.as_mut_ptr());
        for (i, &(addr, lkey)) in srcs.iter().enumerate() {
            sges[i] = ffi::ibv_sge { addr, length: LEN as u32, lkey };
            // SAFETY: plain data, all-zero valid; the fields a request needs are set below.
            let mut w: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
            w.wr_id = next_id;
            w.next = if i + 1 < k { wp.wrapping_add(i + 1) } else { std::ptr::null_mut() };
            (w.sg_list, w.num_sge) = (sp.wrapping_add(i), 1);
            (w.opcode, w.send_flags) = (opcode, ffi::ibv_send_flags::IBV_SEND_SIGNALED.0);
            w.wr.rdma = rdma;
            wrs[i] = w;
            next_id += 1;
        }
        post_send(qp, wp)?;
        drain_raw(cq, &mut lo.raw_wcs, k)?;
    }
    Ok(())
}

/// How a floor keeps what it posted until its completion: the ways a user owning
/// buffers by hand around the raw verbs would write it, in plain safe Rust. Each is
/// compiled into its own loop (generic, inlined), so each is counted as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Keep {
    /// An index ring whose slot is the `wr_id`, its slots, head and tail locals of the
    /// loop and its hand-back plain arguments (no struct): the floor as first written.
    Local,
    /// An index ring whose slot is the `wr_id` (modulo the depth): completions in posting
    /// order, each checked to be the oldest outstanding.
    Ring,
    /// A `VecDeque` in posting order, the `wr_id` a running count: each completion checked
    /// to be the front's.
    Deque,
    /// Slots of `Option` with a free list, the `wr_id` the slot's index: completions in
    /// any order, each checked to name an occupied slot.
    Slots,
}

/// A custody written by hand: `keep` takes a buffer and gives the `wr_id` to post it
/// with; `back` hands it back for its completion's `wr_id`, or refuses one that is not
/// outstanding.
trait Custody {
    fn new() -> Self;
    fn keep(&mut self, b: Chunk) -> Res<u64>;
    fn back(&mut self, wr_id: u64) -> Res<Chunk>;
}

/// [`Keep::Ring`].
struct RingKeep {
    slots: [Option<Chunk>; SEND_DEPTH],
    head: u64,
    tail: u64,
}

impl Custody for RingKeep {
    fn new() -> Self {
        RingKeep { slots: std::array::from_fn(|_| None), head: 0, tail: 0 }
    }
    #[inline(always)]
    fn keep(&mut self, b: Chunk) -> Res<u64> {
        let id = self.head;
        self.slots[id as usize % SEND_DEPTH] = Some(b);
        self.head += 1;
        Ok(id)
    }
    #[inline(always)]
    fn back(&mut self, wr_id: u64) -> Res<Chunk> {
        if wr_id != self.tail || self.tail == self.head {
            return Err(format!("wr_id {wr_id} is not the oldest outstanding request").into());
        }
        let b = self.slots[self.tail as usize % SEND_DEPTH].take().ok_or("an empty slot")?;
        self.tail += 1;
        Ok(b)
    }
}

/// [`Keep::Deque`].
struct DequeKeep {
    q: std::collections::VecDeque<Chunk>,
    /// How many were ever kept: the next `wr_id`.
    head: u64,
}

impl Custody for DequeKeep {
    fn new() -> Self {
        DequeKeep { q: std::collections::VecDeque::with_capacity(SEND_DEPTH), head: 0 }
    }
    #[inline(always)]
    fn keep(&mut self, b: Chunk) -> Res<u64> {
        self.q.push_back(b);
        self.head += 1;
        Ok(self.head - 1)
    }
    #[inline(always)]
    fn back(&mut self, wr_id: u64) -> Res<Chunk> {
        if wr_id != self.head - self.q.len() as u64 {
            return Err(format!("wr_id {wr_id} is not the oldest outstanding request").into());
        }
        Ok(self.q.pop_front().ok_or("nothing outstanding")?)
    }
}

/// [`Keep::Slots`].
struct SlotsKeep {
    slots: Vec<Option<Chunk>>,
    free: Vec<usize>,
}

impl Custody for SlotsKeep {
    fn new() -> Self {
        SlotsKeep { slots: (0..SEND_DEPTH).map(|_| None).collect(), free: (0..SEND_DEPTH).rev().collect() }
    }
    #[inline(always)]
    fn keep(&mut self, b: Chunk) -> Res<u64> {
        let i = self.free.pop().ok_or("no free slot")?;
        self.slots[i] = Some(b);
        Ok(i as u64)
    }
    #[inline(always)]
    fn back(&mut self, wr_id: u64) -> Res<Chunk> {
        let i = wr_id as usize;
        let b = self.slots.get_mut(i).and_then(Option::take).ok_or("a wr_id not outstanding")?;
        self.free.push(i);
        Ok(b)
    }
}

/// [`sends_floor_of`] with the custody `keep` names.
fn sends_floor(lo: &mut Loopback, op: Op, keep: Keep, rounds: usize, k: usize) -> Res<()> {
    match keep {
        Keep::Local => sends_floor_local(lo, op, rounds, k),
        Keep::Ring => sends_floor_of::<RingKeep>(lo, op, rounds, k),
        Keep::Deque => sends_floor_of::<DequeKeep>(lo, op, rounds, k),
        Keep::Slots => sends_floor_of::<SlotsKeep>(lo, op, rounds, k),
    }
}

/// [`sends_raw_built`] plus the bookkeeping that any API which owns what it posts must do,
/// written by hand in plain safe Rust over the raw verbs: each source kept (`C`) until its
/// completion, after a check that the range fits it; each completion's `wr_id` matched
/// to what was kept, and the source handed back. It leaves out what the safe queues also
/// do (the protection domain and the QP's limits checked, a completion of another queue
/// or QP refused, the caller's id, operation and status handed back, a refused request
/// returned). A measure of what keeping buffers costs by itself, not a lower bound: how it
/// is written moves it, which is why three ways are counted and the cheapest is the floor.
#[inline(never)]
fn sends_floor_of<C: Custody>(lo: &mut Loopback, op: Op, rounds: usize, k: usize) -> Res<()> {
    let (qp, cq, target) = (lo.a.as_raw(), lo.cq_a.as_raw(), lo.target);
    let mut bufs: Vec<Chunk> = lo.srcs.drain(..k).collect();
    let mut kept = C::new();
    let mut sges = [ffi::ibv_sge { addr: 0, length: 0, lkey: 0 }; SEND_DEPTH];
    // SAFETY: ibv_send_wr is plain data; all-zero is a valid value.
    let mut wrs: [ffi::ibv_send_wr; SEND_DEPTH] = unsafe { std::mem::zeroed() };
    let (opcode, rdma) = match op {
        Op::Write => (
            ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: target.addr, rkey: target.rkey },
        ),
        Op::Send => (ffi::ibv_wr_opcode::IBV_WR_SEND, ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1::default()),
    };
    for _ in 0..rounds {
        let (wp, sp) = (wrs.as_mut_ptr(), sges.as_mut_ptr());
        for i in 0..k {
            // Popped, not drained: a drain's setup and teardown cost more than the pops.
            let b = bufs.pop().ok_or("a source did not come back")?;
            if LEN > b.len() {
                return Err("the range does not fit the source".into());
            }
            sges[i] = ffi::ibv_sge { addr: b.addr(), length: LEN as u32, lkey: b.lkey() };
            // SAFETY: plain data, all-zero valid; the fields a request needs are set below.
            let mut w: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
            w.wr_id = kept.keep(b)?;
            w.next = if i + 1 < k { wp.wrapping_add(i + 1) } else { std::ptr::null_mut() };
            (w.sg_list, w.num_sge) = (sp.wrapping_add(i), 1);
            (w.opcode, w.send_flags) = (opcode, ffi::ibv_send_flags::IBV_SEND_SIGNALED.0);
            w.wr.rdma = rdma;
            wrs[i] = w;
        }
        post_send(qp, wp)?;
        floor_drain(cq, &mut lo.raw_wcs, k, &mut kept, &mut bufs)?;
    }
    Ok(())
}

/// The floors' hand-back: polls `cq` until `want` completions came, each checked (its
/// status, and its `wr_id` by the custody) and its buffer moved from the custody back
/// into `bufs`.
#[inline(always)]
fn floor_drain<C: Custody>(
    cq: *mut ffi::ibv_cq,
    wcs: &mut RawWcs,
    want: usize,
    kept: &mut C,
    bufs: &mut Vec<Chunk>,
) -> Res<()> {
    settle();
    let (mut got, mut waiting) = (0, Waiting::default());
    while got < want {
        // SAFETY: the CQ is the probe's, alive for the run; `wcs` has room for 16.
        let n = unsafe { ffi::ibv_poll_cq(cq, wcs.len() as i32, wcs.as_mut_ptr()) };
        let Ok(n) = usize::try_from(n) else { return Err(format!("ibv_poll_cq: {n}").into()) };
        for wc in &wcs[..n] {
            if wc.status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
                return Err(format!("wr_id {} failed with status {}", wc.wr_id, wc.status.0).into());
            }
            bufs.push(kept.back(wc.wr_id)?);
        }
        got += n;
        if n == 0 {
            waiting.empty_poll(got, want)?;
        }
    }
    Ok(())
}

/// [`sends_floor_ext_of`] with the custody `keep` names.
fn sends_floor_ext(lo: &mut Loopback, op: Op, keep: Keep, rounds: usize, k: usize) -> Res<()> {
    match keep {
        Keep::Local => sends_floor_ext_local(lo, op, rounds, k),
        Keep::Ring => sends_floor_ext_of::<RingKeep>(lo, op, rounds, k),
        Keep::Deque => sends_floor_ext_of::<DequeKeep>(lo, op, rounds, k),
        Keep::Slots => sends_floor_ext_of::<SlotsKeep>(lo, op, rounds, k),
    }
}

/// [`sends_raw_ext`] plus the bookkeeping of [`sends_floor_of`].
#[inline(never)]
fn sends_floor_ext_of<C: Custody>(lo: &mut Loopback, op: Op, rounds: usize, k: usize) -> Res<()> {
    let qpx = lo.a.as_raw_ex().ok_or("A was built without extended send ops")?;
    let (cq, target) = (lo.cq_a.as_raw(), lo.target);
    let mut bufs: Vec<Chunk> = lo.srcs.drain(..k).collect();
    let mut kept = C::new();
    for _ in 0..rounds {
        // SAFETY: A's extended QP, alive for the run and posted to by this loop alone.
        unsafe { ffi::ibv_wr_start(qpx) };
        for _ in 0..k {
            let b = bufs.pop().ok_or("a source did not come back")?;
            if LEN > b.len() {
                return Err("the range does not fit the source".into());
            }
            let (lkey, addr) = (b.lkey(), b.addr());
            let id = kept.keep(b)?;
            // SAFETY: inside this round's ibv_wr_start; the SGE names registered bytes of
            // a source that the custody keeps until its completion.
            unsafe {
                (*qpx).wr_id = id;
                (*qpx).wr_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
                match op {
                    Op::Write => ffi::ibv_wr_rdma_write(qpx, target.rkey, target.addr),
                    Op::Send => ffi::ibv_wr_send(qpx),
                }
                ffi::ibv_wr_set_sge(qpx, lkey, addr, LEN as u32);
            }
        }
        // SAFETY: closes this round's batch.
        let rc = unsafe { ffi::ibv_wr_complete(qpx) };
        if rc != 0 {
            return Err(format!("ibv_wr_complete: {}", std::io::Error::from_raw_os_error(rc)).into());
        }
        floor_drain(cq, &mut lo.raw_wcs, k, &mut kept, &mut bufs)?;
    }
    Ok(())
}

/// The extended API as a C programmer uses it on a QP built with send ops: each round
/// `ibv_wr_start`, for each request its `wr_id`, flags, operation and SGE, then
/// `ibv_wr_complete` (one doorbell); completions polled and checked.
#[inline(never)]
fn sends_raw_ext(lo: &mut Loopback, op: Op, rounds: usize, k: usize) -> Res<()> {
    let qpx = lo.a.as_raw_ex().ok_or("A was built without extended send ops")?;
    let srcs: Vec<(u64, u32)> = lo.srcs[..k].iter().map(|s| (s.addr(), s.lkey())).collect();
    let (cq, target) = (lo.cq_a.as_raw(), lo.target);
    let mut next_id = 0;
    for _ in 0..rounds {
        // SAFETY: A's extended QP, alive for the run and posted to by this loop alone; the
        // SGEs name registered bytes of the probe's sources, which outlive the run.
        let rc = unsafe {
            ffi::ibv_wr_start(qpx);
            for &(addr, lkey) in &srcs {
                (*qpx).wr_id = next_id;
                (*qpx).wr_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
                match op {
                    Op::Write => ffi::ibv_wr_rdma_write(qpx, target.rkey, target.addr),
                    Op::Send => ffi::ibv_wr_send(qpx),
                }
                ffi::ibv_wr_set_sge(qpx, lkey, addr, LEN as u32);
                next_id += 1;
            }
            ffi::ibv_wr_complete(qpx)
        };
        if rc != 0 {
            return Err(format!("ibv_wr_complete: {}", std::io::Error::from_raw_os_error(rc)).into());
        }
        drain_raw(cq, &mut lo.raw_wcs, k)?;
    }
    Ok(())
}

/// RecvQueue: K receives posted every round (`post`, or `post_batch` for K > 1); the
/// raw way's SENDs fill them, and `complete` hands each buffer back.
#[inline(never)]
fn recvs_safe(lo: &mut Loopback, rounds: usize, k: usize) -> Res<()> {
    let mut rq = lo.b.recv_queue::<Chunk>()?;
    let mut feed = RawSends::new(Op::Send, &lo.srcs[..k], lo.target);
    let mut bufs: Vec<Chunk> = lo.dsts.drain(..k).collect();
    if k == 1 {
        let mut buf = bufs.pop();
        for _ in 0..rounds {
            rq.post(buf.take().ok_or("the buffer did not come back")?, 0..LEN, 0).map_err(rdma_verbs::Error::from)?;
            feed.round(&lo.a, &lo.cq_a, &mut lo.raw_wcs)?;
            drain(&mut lo.cq_b, &mut lo.wcs, 1, |wc| {
                buf = Some(rq.complete(wc)?.value);
                Ok(())
            })?;
        }
    } else {
        for _ in 0..rounds {
            rq.post_batch(bufs.drain(..).map(|b| (b, 0..LEN, 0))).map_err(rdma_verbs::Error::from)?;
            feed.round(&lo.a, &lo.cq_a, &mut lo.raw_wcs)?;
            drain(&mut lo.cq_b, &mut lo.wcs, k, |wc| {
                bufs.push(rq.complete(wc)?.value);
                Ok(())
            })?;
        }
    }
    Ok(())
}

/// PreparedRecvQueue: K receives prepared once (before the rounds), posted again every
/// round (`post`, or `post_batch` for K > 1); the raw way's SENDs fill them, and
/// `complete` hands each back.
#[inline(never)]
fn recvs_prepared(lo: &mut Loopback, rounds: usize, k: usize) -> Res<()> {
    let mut rq = lo.b.prepared_recv_queue::<Chunk>()?;
    let mut feed = RawSends::new(Op::Send, &lo.srcs[..k], lo.target);
    let mut ps = Vec::with_capacity(k);
    for (i, b) in lo.dsts.drain(..k).enumerate() {
        ps.push(rq.prepare(b, 0..LEN, i as u64).map_err(rdma_verbs::Error::from)?);
    }
    if k == 1 {
        let mut p = ps.pop();
        for _ in 0..rounds {
            rq.post(p.take().ok_or("the receive did not come back")?).map_err(rdma_verbs::Error::from)?;
            feed.round(&lo.a, &lo.cq_a, &mut lo.raw_wcs)?;
            drain(&mut lo.cq_b, &mut lo.wcs, 1, |wc| {
                p = Some(rq.complete(wc)?.value);
                Ok(())
            })?;
        }
    } else {
        for _ in 0..rounds {
            rq.post_batch(ps.drain(..)).map_err(rdma_verbs::Error::from)?;
            feed.round(&lo.a, &lo.cq_a, &mut lo.raw_wcs)?;
            drain(&mut lo.cq_b, &mut lo.wcs, k, |wc| {
                ps.push(rq.complete(wc)?.value);
                Ok(())
            })?;
        }
    }
    Ok(())
}

/// RecvChainQueue: the K receives prepared once as one chain, posted whole every round
/// (`post`); the raw way's SENDs fill them, each poll's completions are taken with one
/// `complete_all`, and the chain comes back once, its Done carrying the first failure
/// among its receives (checked, as the raw way checks each).
#[inline(never)]
fn recvs_chain(lo: &mut Loopback, rounds: usize, k: usize) -> Res<()> {
    let mut rq = lo.b.recv_chain_queue::<Chunk>()?;
    let mut feed = RawSends::new(Op::Send, &lo.srcs[..k], lo.target);
    let recvs = lo.dsts.drain(..k).enumerate().map(|(i, b)| (b, 0..LEN, i as u64));
    let mut chain = rq.prepare_chain(recvs).map_err(rdma_verbs::Error::from)?;
    for _ in 0..rounds {
        rq.post(chain).map_err(rdma_verbs::Error::from)?;
        feed.round(&lo.a, &lo.cq_a, &mut lo.raw_wcs)?;
        let mut back = None;
        drain_all(&mut lo.cq_b, &mut lo.wcs, k, |done| {
            rq.complete_all(done, |d| back = Some(d))?;
            Ok(())
        })?;
        chain = back.ok_or("the chain did not come back")?.result().map_err(rdma_verbs::Error::from)?.value;
    }
    Ok(())
}

/// The raw API: a chain of K C receive requests built once, only the `wr_id`s stamped
/// per post (`post_recv_raw`); the same SENDs fill them; completions polled and counted.
#[inline(never)]
fn recvs_raw(lo: &mut Loopback, rounds: usize, k: usize) -> Res<()> {
    let mut feed = RawSends::new(Op::Send, &lo.srcs[..k], lo.target);
    let mut sges: Box<[ffi::ibv_sge]> =
        lo.dsts[..k].iter().map(|d| ffi::ibv_sge { addr: d.addr(), length: LEN as u32, lkey: d.lkey() }).collect();
    let mut wrs: Box<[ffi::ibv_recv_wr]> = sges
        .iter_mut()
        .map(|s| ffi::ibv_recv_wr { wr_id: 0, next: std::ptr::null_mut(), sg_list: s, num_sge: 1 })
        .collect();
    for i in 1..k {
        wrs[i - 1].next = &mut wrs[i];
    }
    let mut next_id = 0;
    for _ in 0..rounds {
        for w in wrs.iter_mut() {
            w.wr_id = next_id;
            next_id += 1;
        }
        // The chain is linked (boxes that do not move).
        post_recv(lo.b.as_raw(), &mut wrs[0])?;
        feed.round(&lo.a, &lo.cq_a, &mut lo.raw_wcs)?;
        drain_raw(lo.cq_b.as_raw(), &mut lo.raw_wcs, k)?;
    }
    Ok(())
}

/// The raw API with each C receive and its SGE built at every post, linked, posted in
/// one call; the same SENDs fill them; completions polled and checked.
#[inline(never)]
fn recvs_raw_built(lo: &mut Loopback, rounds: usize, k: usize) -> Res<()> {
    let mut feed = RawSends::new(Op::Send, &lo.srcs[..k], lo.target);
    let dsts: Vec<(u64, u32)> = lo.dsts[..k].iter().map(|d| (d.addr(), d.lkey())).collect();
    let mut sges = [ffi::ibv_sge { addr: 0, length: 0, lkey: 0 }; SEND_DEPTH];
    let empty = ffi::ibv_recv_wr { wr_id: 0, next: std::ptr::null_mut(), sg_list: std::ptr::null_mut(), num_sge: 0 };
    let mut wrs = [empty; SEND_DEPTH];
    let mut next_id = 0;
    for _ in 0..rounds {
        let (wp, sp) = (wrs.as_mut_ptr(), sges.as_mut_ptr());
        for (i, &(addr, lkey)) in dsts.iter().enumerate() {
            sges[i] = ffi::ibv_sge { addr, length: LEN as u32, lkey };
            let next = if i + 1 < k { wp.wrapping_add(i + 1) } else { std::ptr::null_mut() };
            wrs[i] = ffi::ibv_recv_wr { wr_id: next_id, next, sg_list: sp.wrapping_add(i), num_sge: 1 };
            next_id += 1;
        }
        post_recv(lo.b.as_raw(), wp)?;
        feed.round(&lo.a, &lo.cq_a, &mut lo.raw_wcs)?;
        drain_raw(lo.cq_b.as_raw(), &mut lo.raw_wcs, k)?;
    }
    Ok(())
}

/// [`recvs_floor_of`] with the custody `keep` names.
fn recvs_floor(lo: &mut Loopback, keep: Keep, rounds: usize, k: usize) -> Res<()> {
    match keep {
        Keep::Local => recvs_floor_local(lo, rounds, k),
        Keep::Ring => recvs_floor_of::<RingKeep>(lo, rounds, k),
        Keep::Deque => recvs_floor_of::<DequeKeep>(lo, rounds, k),
        Keep::Slots => recvs_floor_of::<SlotsKeep>(lo, rounds, k),
    }
}

/// [`recvs_raw_built`] plus the bookkeeping of [`sends_floor_of`].
#[inline(never)]
fn recvs_floor_of<C: Custody>(lo: &mut Loopback, rounds: usize, k: usize) -> Res<()> {
    let mut feed = RawSends::new(Op::Send, &lo.srcs[..k], lo.target);
    let mut bufs: Vec<Chunk> = lo.dsts.drain(..k).collect();
    let mut kept = C::new();
    let mut sges = [ffi::ibv_sge { addr: 0, length: 0, lkey: 0 }; SEND_DEPTH];
    let empty = ffi::ibv_recv_wr { wr_id: 0, next: std::ptr::null_mut(), sg_list: std::ptr::null_mut(), num_sge: 0 };
    let mut wrs = [empty; SEND_DEPTH];
    for _ in 0..rounds {
        let (wp, sp) = (wrs.as_mut_ptr(), sges.as_mut_ptr());
        for i in 0..k {
            let b = bufs.pop().ok_or("a buffer did not come back")?;
            if LEN > b.len() {
                return Err("the range does not fit the buffer".into());
            }
            sges[i] = ffi::ibv_sge { addr: b.addr(), length: LEN as u32, lkey: b.lkey() };
            let next = if i + 1 < k { wp.wrapping_add(i + 1) } else { std::ptr::null_mut() };
            wrs[i] = ffi::ibv_recv_wr { wr_id: kept.keep(b)?, next, sg_list: sp.wrapping_add(i), num_sge: 1 };
        }
        post_recv(lo.b.as_raw(), wp)?;
        feed.round(&lo.a, &lo.cq_a, &mut lo.raw_wcs)?;
        floor_drain(lo.cq_b.as_raw(), &mut lo.raw_wcs, k, &mut kept, &mut bufs)?;
    }
    Ok(())
}

/// [`Keep::Local`], the floor as first written (#32), kept verbatim: [`sends_raw_built`] plus the bookkeeping that any API which owns what it posts must do,
/// written by hand in plain safe Rust over the raw verbs: each source moved into a slot
/// (its index the `wr_id`) until its completion, after a check that the range fits it;
/// each completion's `wr_id` matched to the oldest outstanding slot, and the source handed
/// back. It leaves out what the safe queues also do (the protection domain and the QP's
/// limits checked, a completion of another queue or QP refused, the caller's id, operation
/// and status handed back, a refused request returned). A measure of what keeping buffers
/// costs by itself, not a lower bound: how it is written moves it (the same bookkeeping in
/// a struct, its hand-back through a closure, cost 481 a single WRITE, against 437 written
/// as here).
#[inline(never)]
fn sends_floor_local(lo: &mut Loopback, op: Op, rounds: usize, k: usize) -> Res<()> {
    let (qp, cq, target) = (lo.a.as_raw(), lo.cq_a.as_raw(), lo.target);
    let mut bufs: Vec<Chunk> = lo.srcs.drain(..k).collect();
    let mut slots: [Option<Chunk>; SEND_DEPTH] = std::array::from_fn(|_| None);
    let mut sges = [ffi::ibv_sge { addr: 0, length: 0, lkey: 0 }; SEND_DEPTH];
    // SAFETY: ibv_send_wr is plain data; all-zero is a valid value.
    let mut wrs: [ffi::ibv_send_wr; SEND_DEPTH] = unsafe { std::mem::zeroed() };
    let (opcode, rdma) = match op {
        Op::Write => (
            ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: target.addr, rkey: target.rkey },
        ),
        Op::Send => (ffi::ibv_wr_opcode::IBV_WR_SEND, ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1::default()),
    };
    let (mut head, mut tail) = (0u64, 0u64);
    for _ in 0..rounds {
        let (wp, sp) = (wrs.as_mut_ptr(), sges.as_mut_ptr());
        for i in 0..k {
            // Popped, not drained: a drain's setup and teardown cost more than the pops.
            let b = bufs.pop().ok_or("a source did not come back")?;
            if LEN > b.len() {
                return Err("the range does not fit the source".into());
            }
            sges[i] = ffi::ibv_sge { addr: b.addr(), length: LEN as u32, lkey: b.lkey() };
            // SAFETY: plain data, all-zero valid; the fields a request needs are set below.
            let mut w: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
            w.wr_id = head;
            w.next = if i + 1 < k { wp.wrapping_add(i + 1) } else { std::ptr::null_mut() };
            (w.sg_list, w.num_sge) = (sp.wrapping_add(i), 1);
            (w.opcode, w.send_flags) = (opcode, ffi::ibv_send_flags::IBV_SEND_SIGNALED.0);
            w.wr.rdma = rdma;
            wrs[i] = w;
            slots[head as usize % SEND_DEPTH] = Some(b);
            head += 1;
        }
        post_send(qp, wp)?;
        floor_drain_local(cq, &mut lo.raw_wcs, k, &mut slots, head, &mut tail, &mut bufs)?;
    }
    Ok(())
}

/// The floors' hand-back: polls `cq` until `want` completions came, each checked (its
/// status; its `wr_id` the oldest outstanding of those below `head`, from `tail` on) and
/// its buffer moved from its slot back into `bufs`. Plain arguments, no closure: written
/// with a struct and a closure the same work cost 481 a single WRITE, against 437.
#[inline(always)]
fn floor_drain_local(
    cq: *mut ffi::ibv_cq,
    wcs: &mut RawWcs,
    want: usize,
    slots: &mut [Option<Chunk>; SEND_DEPTH],
    head: u64,
    tail: &mut u64,
    bufs: &mut Vec<Chunk>,
) -> Res<()> {
    settle();
    let (mut got, mut waiting) = (0, Waiting::default());
    while got < want {
        // SAFETY: the CQ is the probe's, alive for the run; `wcs` has room for 16.
        let n = unsafe { ffi::ibv_poll_cq(cq, wcs.len() as i32, wcs.as_mut_ptr()) };
        let Ok(n) = usize::try_from(n) else { return Err(format!("ibv_poll_cq: {n}").into()) };
        for wc in &wcs[..n] {
            if wc.status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
                return Err(format!("wr_id {} failed with status {}", wc.wr_id, wc.status.0).into());
            }
            if wc.wr_id != *tail || *tail == head {
                return Err(format!("wr_id {} is not the oldest outstanding request", wc.wr_id).into());
            }
            bufs.push(slots[*tail as usize % SEND_DEPTH].take().ok_or("an empty slot")?);
            *tail += 1;
        }
        got += n;
        if n == 0 {
            waiting.empty_poll(got, want)?;
        }
    }
    Ok(())
}

/// [`sends_raw_ext`] plus the bookkeeping of [`sends_floor_local`].
#[inline(never)]
fn sends_floor_ext_local(lo: &mut Loopback, op: Op, rounds: usize, k: usize) -> Res<()> {
    let qpx = lo.a.as_raw_ex().ok_or("A was built without extended send ops")?;
    let (cq, target) = (lo.cq_a.as_raw(), lo.target);
    let mut bufs: Vec<Chunk> = lo.srcs.drain(..k).collect();
    let mut slots: [Option<Chunk>; SEND_DEPTH] = std::array::from_fn(|_| None);
    let (mut head, mut tail) = (0u64, 0u64);
    for _ in 0..rounds {
        // SAFETY: A's extended QP, alive for the run and posted to by this loop alone.
        unsafe { ffi::ibv_wr_start(qpx) };
        for _ in 0..k {
            let b = bufs.pop().ok_or("a source did not come back")?;
            if LEN > b.len() {
                return Err("the range does not fit the source".into());
            }
            // SAFETY: inside this round's ibv_wr_start; the SGE names registered bytes of
            // a source that its slot keeps until its completion.
            unsafe {
                (*qpx).wr_id = head;
                (*qpx).wr_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
                match op {
                    Op::Write => ffi::ibv_wr_rdma_write(qpx, target.rkey, target.addr),
                    Op::Send => ffi::ibv_wr_send(qpx),
                }
                ffi::ibv_wr_set_sge(qpx, b.lkey(), b.addr(), LEN as u32);
            }
            slots[head as usize % SEND_DEPTH] = Some(b);
            head += 1;
        }
        // SAFETY: closes this round's batch.
        let rc = unsafe { ffi::ibv_wr_complete(qpx) };
        if rc != 0 {
            return Err(format!("ibv_wr_complete: {}", std::io::Error::from_raw_os_error(rc)).into());
        }
        floor_drain_local(cq, &mut lo.raw_wcs, k, &mut slots, head, &mut tail, &mut bufs)?;
    }
    Ok(())
}

/// [`recvs_raw_built`] plus the bookkeeping of [`sends_floor_local`].
#[inline(never)]
fn recvs_floor_local(lo: &mut Loopback, rounds: usize, k: usize) -> Res<()> {
    let mut feed = RawSends::new(Op::Send, &lo.srcs[..k], lo.target);
    let mut bufs: Vec<Chunk> = lo.dsts.drain(..k).collect();
    let mut slots: [Option<Chunk>; SEND_DEPTH] = std::array::from_fn(|_| None);
    let mut sges = [ffi::ibv_sge { addr: 0, length: 0, lkey: 0 }; SEND_DEPTH];
    let empty = ffi::ibv_recv_wr { wr_id: 0, next: std::ptr::null_mut(), sg_list: std::ptr::null_mut(), num_sge: 0 };
    let mut wrs = [empty; SEND_DEPTH];
    let (mut head, mut tail) = (0u64, 0u64);
    for _ in 0..rounds {
        let (wp, sp) = (wrs.as_mut_ptr(), sges.as_mut_ptr());
        for i in 0..k {
            let b = bufs.pop().ok_or("a buffer did not come back")?;
            if LEN > b.len() {
                return Err("the range does not fit the buffer".into());
            }
            sges[i] = ffi::ibv_sge { addr: b.addr(), length: LEN as u32, lkey: b.lkey() };
            let next = if i + 1 < k { wp.wrapping_add(i + 1) } else { std::ptr::null_mut() };
            wrs[i] = ffi::ibv_recv_wr { wr_id: head, next, sg_list: sp.wrapping_add(i), num_sge: 1 };
            slots[head as usize % SEND_DEPTH] = Some(b);
            head += 1;
        }
        post_recv(lo.b.as_raw(), wp)?;
        feed.round(&lo.a, &lo.cq_a, &mut lo.raw_wcs)?;
        floor_drain_local(lo.cq_b.as_raw(), &mut lo.raw_wcs, k, &mut slots, head, &mut tail, &mut bufs)?;
    }
    Ok(())
}

fn run(phase: Phase, lo: &mut Loopback) -> Res<()> {
    match phase {
        Phase::Poll { n } => {
            let mut wcs = [WorkCompletion::EMPTY; 16];
            for _ in 0..n {
                if !lo.cq_a.poll(&mut wcs)?.is_empty() {
                    return Err("a completion on an idle CQ".into());
                }
            }
            Ok(())
        }
        Phase::Recv { n } => {
            let mut rq = lo.b.recv_queue::<Chunk>()?;
            for (i, buf) in lo.dsts.drain(..n).enumerate() {
                rq.post(buf, 0..LEN, i as u64).map_err(rdma_verbs::Error::from)?;
            }
            // Kept until the process exits: dropping it would hand the N posted receives
            // to the QP (teardown, which would count here).
            std::mem::forget(rq);
            Ok(())
        }
        Phase::Sends { op, way, n, k } => match way {
            Way::Safe => sends_safe(lo, op, WARMUP + n, k),
            Way::Prepared => sends_prepared(lo, op, WARMUP + n, k),
            Way::Chain => sends_chain(lo, op, WARMUP + n, k),
            Way::Raw => sends_raw(lo, op, WARMUP + n, k),
            Way::RawBuilt => sends_raw_built(lo, op, WARMUP + n, k),
            Way::Floor(keep) => sends_floor(lo, op, keep, WARMUP + n, k),
            Way::ExtFloor(keep) => sends_floor_ext(lo, op, keep, WARMUP + n, k),
            Way::ExtSafe => sends_safe(lo, op, WARMUP + n, k),
            Way::ExtPrepared => sends_prepared(lo, op, WARMUP + n, k),
            Way::ExtRaw => sends_raw_ext(lo, op, WARMUP + n, k),
        },
        Phase::Recvs { way: Way::Safe, n, k } => recvs_safe(lo, WARMUP + n, k),
        Phase::Recvs { way: Way::Prepared, n, k } => recvs_prepared(lo, WARMUP + n, k),
        Phase::Recvs { way: Way::Chain, n, k } => recvs_chain(lo, WARMUP + n, k),
        Phase::Recvs { way: Way::Raw, n, k } => recvs_raw(lo, WARMUP + n, k),
        Phase::Recvs { way: Way::RawBuilt, n, k } => recvs_raw_built(lo, WARMUP + n, k),
        Phase::Recvs { way: Way::Floor(keep), n, k } => recvs_floor(lo, keep, WARMUP + n, k),
        Phase::Recvs { way, .. } => Err(format!("receives have no {way:?} way").into()),
    }
}

fn main() -> ExitCode {
    // A bad command line exits 2 (clap's usage errors, and a phase that does not exist).
    let args = Args::parse();
    let phase = parse(&args).unwrap_or_else(|e| Args::command().error(ErrorKind::ValueValidation, e).exit());
    if let Err(e) = probe(phase, &args.text()) {
        eprintln!("syscall_probe: {e}");
    }
    ExitCode::FAILURE
}

/// Sets up, runs the phase and exits; returns only on failure.
fn probe(phase: Phase, what: &str) -> Res<()> {
    let extended = matches!(phase, Phase::Sends { way, .. } if way.extended());
    let mut lo = setup(extended)?;
    if matches!(phase, Phase::Sends { op: Op::Send, .. }) {
        prepost_receives(&mut lo)?;
    }
    eprintln!("syscall_probe: setup done, measuring: {what}");
    start_instrumentation();
    run(phase, &mut lo)?;
    eprintln!(
        "syscall_probe: measured phase done ({} empty polls)",
        EMPTY_POLLS.load(std::sync::atomic::Ordering::Relaxed)
    );
    // Exit without tearing down: the kernel releases everything, and teardown, which
    // differs with what is still posted, stays out of the counts.
    std::process::exit(0)
}
