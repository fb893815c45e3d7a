//! `syscall_probe`: one data-path operation in a steady loop, for counting its system
//! calls under strace (`scripts/syscalls` does, on rxe).
//!
//! ```text
//! syscall_probe poll N            N polls of an empty CQ
//! syscall_probe recv N            N receives posted, nothing sent (N <= 4096)
//! syscall_probe send-batch N K    N batches of K SENDs (K <= 64), each batch one
//!                                 post_batch; K receives posted before each batch and
//!                                 every completion drained after it
//! syscall_probe raw-send-batch N K    the same sends through the raw API, one prebuilt
//!                                 chain of C work requests posted again each round
//! syscall_probe raw-build-send-batch N K  the raw API as a C program that posts
//!                                 changing requests uses it: each round fills the C work
//!                                 requests anew, and maps each completion's wr_id back
//!                                 to its buffer
//! syscall_probe raw-match-send-batch N K  the prebuilt chain of raw-send-batch, with
//!                                 each completion matched back to its buffer by wr_id
//!                                 (the bookkeeping the safe queues do for you)
//! syscall_probe prepared-send-batch N K  the same sends as K prepared requests
//!                                 (PreparedQueue), built once and posted again each round
//! ```
//!
//! It opens `RDMA_DEVICE` (else the first device) and connects two RC QPs to each other
//! on it. The setup is the same whatever the phase and N, so a run with N = 0 counts the
//! setup alone, and the difference to a run with N counts the phase. Between setup and
//! phase it prints a marker line to stderr, and another one at the end; then it exits
//! without tearing down (the kernel releases the objects), so that teardown, which
//! depends on what is still posted, is not counted either.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_verbs::Chunk;
use rdma_verbs::{
    ffi, AccessFlags, AlignedBuf, CompletionQueue, Context, InitAttr, ProtectionDomain, QpType, QueuePair,
    WorkCompletion,
};
use rdma_verbs::{RecvQueue, SendQueue, SendWr};

const USAGE: &str =
    "usage: syscall_probe poll N | recv N | send-batch N K | raw-send-batch N K | raw-build-send-batch N K \
     | raw-match-send-batch N K | prepared-send-batch N K";
/// Receive queue depth, and the most receives the `recv` phase posts.
const RECV_DEPTH: usize = 4096;
/// Send queue depth, and the largest batch.
const SEND_DEPTH: usize = 64;
/// Bytes per message.
const LEN: usize = 64;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

enum Phase {
    Poll {
        n: usize,
    },
    Recv {
        n: usize,
    },
    SendBatch {
        n: usize,
        k: usize,
    },
    /// The same sends through the unsafe raw API: C work requests built on the stack,
    /// `post_send_raw`, completions counted without the queue.
    RawSendBatch {
        n: usize,
        k: usize,
    },
    /// The raw API with the requests built every round, and completions matched to
    /// their buffers by wr_id.
    RawBuildSendBatch {
        n: usize,
        k: usize,
    },
    /// The prebuilt raw chain, with completions matched to their buffers by wr_id.
    RawMatchSendBatch {
        n: usize,
        k: usize,
    },
    /// The safe API with prepared requests: built once (outside the rounds), posted
    /// again every round.
    PreparedSendBatch {
        n: usize,
        k: usize,
    },
}

fn parse(args: &[String]) -> Res<Phase> {
    let num = |i: usize| -> Res<usize> {
        let s = args.get(i).ok_or(USAGE)?;
        Ok(s.parse().map_err(|_| format!("{s:?} is not a count\n{USAGE}"))?)
    };
    let (phase, argc) = match args.first().map(String::as_str) {
        Some("poll") => (Phase::Poll { n: num(1)? }, 2),
        Some("recv") => (Phase::Recv { n: num(1)? }, 2),
        Some("send-batch") => (Phase::SendBatch { n: num(1)?, k: num(2)? }, 3),
        Some("raw-send-batch") => (Phase::RawSendBatch { n: num(1)?, k: num(2)? }, 3),
        Some("raw-build-send-batch") => (Phase::RawBuildSendBatch { n: num(1)?, k: num(2)? }, 3),
        Some("raw-match-send-batch") => (Phase::RawMatchSendBatch { n: num(1)?, k: num(2)? }, 3),
        Some("prepared-send-batch") => (Phase::PreparedSendBatch { n: num(1)?, k: num(2)? }, 3),
        _ => return Err(USAGE.into()),
    };
    match phase {
        _ if args.len() != argc => Err(USAGE.into()),
        Phase::Recv { n } if n > RECV_DEPTH => Err(format!("recv: at most {RECV_DEPTH} receives").into()),
        Phase::SendBatch { k, .. }
        | Phase::RawSendBatch { k, .. }
        | Phase::RawBuildSendBatch { k, .. }
        | Phase::RawMatchSendBatch { k, .. }
        | Phase::PreparedSendBatch { k, .. }
            if k == 0 || k > SEND_DEPTH =>
        {
            Err(format!("send-batch: K from 1 to {SEND_DEPTH}").into())
        }
        phase => Ok(phase),
    }
}

/// Two RC QPs on one device, connected to each other: A sends, B receives.
struct Loopback {
    cq_a: CompletionQueue,
    cq_b: CompletionQueue,
    /// The send side, claimed at setup; the prepared phase gives it up for a PreparedQueue.
    sq: Option<SendQueue<Arc<Chunk>>>,
    rq: RecvQueue<Chunk>,
    qps: (QueuePair, QueuePair),
}

fn setup() -> Res<(Loopback, Arc<Chunk>, Vec<Chunk>)> {
    let ctx = match std::env::var("RDMA_DEVICE") {
        Ok(name) => Context::open(Some(&name))?,
        Err(_) => Context::open_first()?,
    };
    let pd = ProtectionDomain::new(&ctx)?;
    let cq_a = CompletionQueue::new(&ctx, (SEND_DEPTH + RECV_DEPTH) as u32)?;
    let cq_b = CompletionQueue::new(&ctx, (SEND_DEPTH + RECV_DEPTH) as u32)?;
    let qp = |cq: &CompletionQueue| {
        QueuePair::builder(&pd, QpType::Rc, cq, cq)
            .max_send_wr(SEND_DEPTH as u32)
            .max_recv_wr(RECV_DEPTH as u32)
            .build()
    };
    let (a, b) = (qp(&cq_a)?, qp(&cq_b)?);
    let (ia, ib) = (a.local_info(1)?, b.local_info(1)?);
    a.connect(&InitAttr::default(), &ib)?;
    b.connect(&InitAttr::default(), &ia)?;

    let mut bufs = pd.register(AlignedBuf::new((RECV_DEPTH + 1) * LEN)?, AccessFlags::LOCAL_WRITE)?.into_chunks(LEN)?;
    let mut src = bufs.pop().ok_or("no chunk")?;
    src.fill(0x5a);
    let lo = Loopback { sq: Some(a.send_queue()?), rq: b.recv_queue()?, cq_a, cq_b, qps: (a, b) };
    Ok((lo, Arc::new(src), bufs))
}

/// SYSCALL_PROBE_SETTLE=1 (scripts/instructions): lets the device finish first, so the
/// number of empty polls, which depends on timing, does not enter an instruction count.
fn settle() {
    static SETTLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *SETTLE.get_or_init(|| std::env::var_os("SYSCALL_PROBE_SETTLE").is_some()) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `cq` until `want` completions have been handed to `each`. It reads the clock
/// only after a long run of empty polls: where the clock is not in the vDSO (a VM without
/// a stable TSC), each reading is a system call that would count as the data path's.
fn drain(cq: &mut CompletionQueue, want: usize, mut each: impl FnMut(&mut WorkCompletion) -> Res<()>) -> Res<()> {
    settle();
    let mut wcs = [WorkCompletion::EMPTY; 16];
    let (mut got, mut empty, mut deadline) = (0, 0u32, None);
    while got < want {
        let done = cq.poll(&mut wcs)?;
        for wc in done.iter_mut() {
            wc.ok()?;
            each(wc)?;
            got += 1;
        }
        empty = if done.is_empty() { empty + 1 } else { 0 };
        if empty == 1 << 20 {
            empty = 0;
            let now = Instant::now();
            if now > *deadline.get_or_insert(now + Duration::from_secs(30)) {
                return Err(format!("{got} of {want} completions after 30 s").into());
            }
        }
    }
    Ok(())
}

fn run(phase: Phase, lo: &mut Loopback, src: &Arc<Chunk>, free: &mut Vec<Chunk>) -> Res<()> {
    match phase {
        Phase::Poll { n } => {
            let mut wcs = [WorkCompletion::EMPTY; 16];
            for _ in 0..n {
                if !lo.cq_a.poll(&mut wcs)?.is_empty() {
                    return Err("a completion on an idle CQ".into());
                }
            }
        }
        Phase::Recv { n } => {
            for i in 0..n {
                let buf = free.pop().ok_or("out of receive buffers")?;
                lo.rq.post(buf, 0..LEN, i as u64)?;
            }
        }
        Phase::SendBatch { n, k } => {
            for _ in 0..n {
                for i in 0..k {
                    let buf = free.pop().ok_or("out of receive buffers")?;
                    lo.rq.post(buf, 0..LEN, i as u64)?;
                }
                let wrs = (0..k).map(|i| SendWr::send(Arc::clone(src), 0..LEN).id(i as u64));
                let sq = lo.sq.as_mut().ok_or("no send queue")?;
                let posted = sq.post_batch(wrs)?;
                assert_eq!(posted, k, "post_batch reports every request posted or an error");
                drain(&mut lo.cq_a, k, |wc| {
                    sq.complete(wc, drop)?;
                    Ok(())
                })?;
                receive(lo, k, src, free)?;
            }
        }
        Phase::RawSendBatch { n, k } | Phase::RawMatchSendBatch { n, k } => {
            let matching = matches!(phase, Phase::RawMatchSendBatch { .. });
            // What each outstanding request lent, found again by its wr_id (matching only).
            let mut lent: [Option<&Chunk>; SEND_DEPTH] = [None; SEND_DEPTH];
            // Built once and posted every round, as a C program does.
            let mut sges = [ffi::ibv_sge { addr: src.addr(), length: LEN as u32, lkey: src.lkey() }; SEND_DEPTH];
            // SAFETY: ibv_send_wr is plain data; all-zero is a valid value.
            let mut wrs: [ffi::ibv_send_wr; SEND_DEPTH] = unsafe { std::mem::zeroed() };
            for i in (0..k).rev() {
                let next = if i + 1 < k { &mut wrs[i + 1] as *mut _ } else { std::ptr::null_mut() };
                let w = &mut wrs[i];
                (w.wr_id, w.sg_list, w.num_sge, w.next) = (i as u64, &mut sges[i], 1, next);
                w.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND;
                w.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
            }
            for _ in 0..n {
                for i in 0..k {
                    let buf = free.pop().ok_or("out of receive buffers")?;
                    lo.rq.post(buf, 0..LEN, i as u64)?;
                }
                if matching {
                    lent[..k].fill(Some(&**src));
                }
                // SAFETY: the chain names `src`, which outlives the sends, and they are
                // drained before the next round.
                unsafe { lo.qps.0.post_send_raw(&mut wrs[0]) }?;
                if matching {
                    drain(&mut lo.cq_a, k, |wc| {
                        let slot = lent.get_mut(wc.wr_id() as usize).ok_or("a wr_id that was not posted")?;
                        slot.take().ok_or("a completion twice")?;
                        Ok(())
                    })?;
                } else {
                    drain(&mut lo.cq_a, k, |_| Ok(()))?;
                }
                receive(lo, k, src, free)?;
            }
        }
        Phase::RawBuildSendBatch { n, k } => {
            // What each outstanding request lent, found again by its wr_id.
            let mut lent: [Option<&Chunk>; SEND_DEPTH] = [None; SEND_DEPTH];
            let mut sges = [ffi::ibv_sge { addr: 0, length: 0, lkey: 0 }; SEND_DEPTH];
            // SAFETY: ibv_send_wr is plain data; all-zero is a valid value.
            let mut wrs: [ffi::ibv_send_wr; SEND_DEPTH] = unsafe { std::mem::zeroed() };
            for _ in 0..n {
                for i in 0..k {
                    let buf = free.pop().ok_or("out of receive buffers")?;
                    lo.rq.post(buf, 0..LEN, i as u64)?;
                }
                for i in 0..k {
                    sges[i] = ffi::ibv_sge { addr: src.addr(), length: LEN as u32, lkey: src.lkey() };
                    let next = if i + 1 < k { &mut wrs[i + 1] as *mut _ } else { std::ptr::null_mut() };
                    // SAFETY: ibv_send_wr is plain data; all-zero is a valid value.
                    wrs[i] = unsafe { std::mem::zeroed() };
                    let w = &mut wrs[i];
                    (w.wr_id, w.sg_list, w.num_sge, w.next) = (i as u64, &mut sges[i], 1, next);
                    w.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND;
                    w.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
                    lent[i] = Some(&**src);
                }
                // SAFETY: the chain names `src`, which outlives the sends, and they are
                // drained before the next round.
                unsafe { lo.qps.0.post_send_raw(&mut wrs[0]) }?;
                drain(&mut lo.cq_a, k, |wc| {
                    let slot = lent.get_mut(wc.wr_id() as usize).ok_or("a wr_id that was not posted")?;
                    slot.take().ok_or("a completion twice")?;
                    Ok(())
                })?;
                receive(lo, k, src, free)?;
            }
        }
        Phase::PreparedSendBatch { n, k } => {
            drop(lo.sq.take());
            let mut pq = lo.qps.0.prepared_queue::<Arc<Chunk>>()?;
            let mut ps = Vec::with_capacity(k);
            for i in 0..k {
                ps.push(pq.prepare(SendWr::send(Arc::clone(src), 0..LEN).id(i as u64))?);
            }
            for _ in 0..n {
                for i in 0..k {
                    let buf = free.pop().ok_or("out of receive buffers")?;
                    lo.rq.post(buf, 0..LEN, i as u64)?;
                }
                let posted = pq.post_batch(ps.drain(..))?;
                assert_eq!(posted, k, "post_batch reports every request posted or an error");
                drain(&mut lo.cq_a, k, |wc| {
                    // Completions come in posting order: `ps` keeps its order.
                    pq.complete(wc, |d| ps.push(d.buf))?;
                    Ok(())
                })?;
                receive(lo, k, src, free)?;
            }
        }
    }
    Ok(())
}

/// Takes `k` receive completions, checks the bytes, and keeps the buffers for reuse.
fn receive(lo: &mut Loopback, k: usize, src: &Arc<Chunk>, free: &mut Vec<Chunk>) -> Res<()> {
    receive_into(&mut lo.rq, &mut lo.cq_b, k, src, free)
}

fn receive_into(
    rq: &mut RecvQueue<Chunk>,
    cq_b: &mut CompletionQueue,
    k: usize,
    src: &Chunk,
    free: &mut Vec<Chunk>,
) -> Res<()> {
    drain(cq_b, k, |wc| {
        let done = rq.complete(wc)?;
        if done.byte_len as usize != LEN || done.buf[..] != src[..] {
            return Err(format!("received {} bytes that differ from those sent", done.byte_len).into());
        }
        free.push(done.buf);
        Ok(())
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let phase = match parse(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("syscall_probe: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = probe(phase, &args.join(" ")) {
        eprintln!("syscall_probe: {e}");
    }
    ExitCode::FAILURE
}

/// Sets up, runs the phase and exits; returns only on failure.
fn probe(phase: Phase, what: &str) -> Res<()> {
    let (mut lo, src, mut free) = setup()?;
    eprintln!("syscall_probe: setup done, measuring: {what}");
    run(phase, &mut lo, &src, &mut free)?;
    eprintln!("syscall_probe: measured phase done");
    // Exit without tearing down: the kernel releases everything, and teardown, which
    // differs with what is still posted, stays out of the counts.
    std::process::exit(0)
}
