//! RDMA WRITE bandwidth, like perftest's `ib_write_bw`, on the safe data path.
//!
//! ```text
//! write_bw [-d DEV] [-x GID] [-i PORT] [-s SIZE | -a] [-n ITERS | -D SECS] [-t DEPTH] [-Q MOD] [-l LIST] [-q QPS]
//!          [-p TCP_PORT] [--report_gbits] [--json] (--loopback | [HOST])
//! ```
//!
//! Without a host argument it is the server: it waits on the TCP port (`-p`, default
//! 18515), gives each client QP a remote-writable region, and at the end of each size
//! checks that every region holds the client's pattern. With a host it is the client: it
//! writes, then prints perftest's table (bandwidth in MiB/s, 2^20 bytes a second, or Gb/s
//! with `--report_gbits`) or, with `--json`, one object per size. A data mismatch fails
//! both sides (the server tells the client). `--loopback` runs both ends in one process
//! on one device. Give both sides the same `-s`/`-a` and `-q`.
//!
//! The exchange is rdma-verbs' endpoint handshake (`rdma_verbs::endpoint`), one per QP,
//! not perftest's: this server and client talk to each other, not to `ib_write_bw`.

#[path = "common/perftest.rs"]
mod perftest;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use perftest::{BwRow, Common, Res, Role, Stream};
use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpAccess, QpType,
    QueuePair, RemoteMr, RemoteWritable, SendQueue, SendWr, WcStatus, WorkCompletion,
};

/// Beyond these, a flag is a typo rather than a test (the device's own limits are checked
/// once it is open).
const MAX_DEPTH: u32 = 1 << 24;
const MAX_QPS: u32 = 1024;

/// Command-line flags, named as perftest names them.
#[derive(Parser, Debug)]
struct Opts {
    #[command(flatten)]
    common: Common,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration")]
    duration: Option<f64>,
    /// Work requests in flight per QP.
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    tx_depth: u32,
    /// Signal one completion every this many work requests (default 100, 1 above 8 KiB).
    #[arg(short = 'Q', long = "cq-mod")]
    cq_mod: Option<u32>,
    /// Work requests posted per provider call (one doorbell each).
    #[arg(short = 'l', long = "post_list", default_value_t = 1)]
    post_list: u32,
    /// Number of QPs.
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    qps: u32,
    /// Report bandwidth in Gb/s.
    #[arg(long = "report_gbits")]
    report_gbits: bool,
}

fn main() -> ExitCode {
    let o: Opts = perftest::parse("write_bw", "RDMA WRITE bandwidth (perftest's ib_write_bw, on rdma-verbs)");
    perftest::exit_with("write_bw", run(&o))
}

/// Refuses nonsense before the device is touched.
fn check_flags(o: &Opts) -> Res<()> {
    if o.tx_depth == 0 || o.post_list == 0 || o.qps == 0 {
        return Err("-t (tx depth), -l (post list) and -q (QPs) must be at least 1".into());
    }
    if o.tx_depth > MAX_DEPTH {
        return Err(format!("tx depth {} (-t) is beyond {MAX_DEPTH}: no device takes that many", o.tx_depth).into());
    }
    if o.qps > MAX_QPS {
        return Err(format!("{} QPs (-q) is beyond {MAX_QPS}", o.qps).into());
    }
    if o.post_list > o.tx_depth {
        return Err(format!("post list {} (-l) is larger than the tx depth {} (-t)", o.post_list, o.tx_depth).into());
    }
    match o.cq_mod {
        Some(0) => return Err("CQ moderation 0 (-Q): signal at least every request (1)".into()),
        Some(m) if m > o.tx_depth => {
            return Err(format!(
                "CQ moderation {m} (-Q) is larger than the tx depth {} (-t): no completion would ever come",
                o.tx_depth
            )
            .into())
        }
        _ => {}
    }
    if let Some(d) = o.duration {
        if !(d.is_finite() && d > 0.0 && d <= 86400.0) {
            return Err(format!("duration {d} (-D) must be a positive number of seconds, at most a day").into());
        }
    }
    Ok(())
}

fn run(o: &Opts) -> Res<()> {
    let c = &o.common;
    let role = c.role()?;
    let sizes = c.sizes(65536)?;
    let iters = c.iterations(5000)?;
    check_flags(o)?;
    let ctx = c.open(&sizes)?;
    let dev = ctx.query_device()?;
    if o.tx_depth > dev.max_qp_wr {
        return Err(format!("tx depth {} (-t) exceeds the device's max_qp_wr {}", o.tx_depth, dev.max_qp_wr).into());
    }
    if u64::from(o.tx_depth) * u64::from(o.qps) > u64::from(dev.max_cqe) {
        return Err(format!(
            "tx depth {} x {} QPs exceeds the device's max_cqe {}: lower -t or -q",
            o.tx_depth, o.qps, dev.max_cqe
        )
        .into());
    }
    let show = !c.json && role != Role::Server;
    if show {
        print_header(o, &ctx, &role);
    }
    let mut stream = perftest::open_stream(&role, c.tcp_port)?;
    for &size in &sizes {
        let row = match stream.as_deref_mut() {
            None => perftest::loopback(|s| server(o, &ctx, size, s), |s| client(o, &ctx, size, iters, s))?,
            Some(s) if role == Role::Server => {
                server(o, &ctx, size, s)?;
                eprintln!(
                    "write_bw: {size} B: the data check passed on {} QP{}",
                    o.qps,
                    if o.qps == 1 { "" } else { "s" }
                );
                continue;
            }
            Some(s) => client(o, &ctx, size, iters, s)?,
        };
        perftest::print_bw_row(&row, o.report_gbits, c.json);
    }
    if show {
        println!("{}", perftest::rule());
    }
    Ok(())
}

/// perftest's moderation rule: every 100th signaled, every one above 8 KiB unless -Q.
fn cq_mod(o: &Opts, size: usize) -> u32 {
    let m = o.cq_mod.unwrap_or(if size > 8192 { 1 } else { 100 });
    m.clamp(1, o.tx_depth)
}

/// What the client writes and the server expects.
fn pattern(size: usize) -> impl Iterator<Item = u8> {
    (0..size).map(move |i| (i as u8).wrapping_mul(13).wrapping_add(size as u8))
}

/// The server's side of one size: a region per QP for the client to write, then the
/// check of what arrived, whose verdict goes back to the client.
fn server(o: &Opts, ctx: &Context, size: usize, stream: &mut dyn Stream) -> Res<()> {
    let pd = ProtectionDomain::new(ctx)?;
    let cq = CompletionQueue::new(ctx, 4)?;
    let mut held = Vec::with_capacity(o.qps as usize);
    for _ in 0..o.qps {
        let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(1).max_recv_wr(1).build()?;
        let region =
            pd.register_remote_writable(AlignedBuf::new(size)?, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
        o.common.handshake(&qp, QpAccess::REMOTE_WRITE).advertise(region.remote()).connect(stream)?;
        held.push((qp, region));
    }
    perftest::barrier(stream, true).map_err(|e| format!("the client did not finish its run: {e}"))?;
    let check = check_data(held.iter().map(|(_, r)| r), size);
    perftest::send_verdict(stream, check.is_ok())?;
    check
}

/// Every region holds the pattern of `size`.
fn check_data<'a>(regions: impl Iterator<Item = &'a MemoryRegion<AlignedBuf, RemoteWritable>>, size: usize) -> Res<()> {
    let want: Vec<u8> = pattern(size).collect();
    let mut got = vec![0u8; size];
    for (i, region) in regions.enumerate() {
        region.read_at(0, &mut got)?;
        if got != want {
            let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!(
                "data check failed on QP {i}: byte {at} of {size} is {:#04x}, the pattern has {:#04x}",
                got[at], want[at]
            )
            .into());
        }
    }
    Ok(())
}

/// The client's side of one size: writes, then meets the server and takes its verdict.
fn client(o: &Opts, ctx: &Context, size: usize, iters: u64, stream: &mut dyn Stream) -> Res<BwRow> {
    let result = write_run(o, ctx, size, iters, stream);
    perftest::barrier(stream, result.is_ok())?;
    let row = result?;
    if !perftest::read_verdict(stream)? {
        return Err(format!(
            "the server's data check failed at {size} B: what arrived differs from what was written (its log says where)"
        )
        .into());
    }
    Ok(row)
}

/// One client QP writing into one server region.
struct Lane {
    sq: SendQueue<Arc<Chunk>>,
    remote: RemoteMr,
    posted: u64,
    done: u64,
    // Whether the last posted request was signaled: an unsignaled tail completes only
    // behind a signaled one, so a timed run ends with one more signaled write.
    tail_signaled: bool,
    _qp: QueuePair,
}

fn write_run(o: &Opts, ctx: &Context, size: usize, iters: u64, stream: &mut dyn Stream) -> Res<BwRow> {
    let pd = ProtectionDomain::new(ctx)?;
    let mut cq = CompletionQueue::new(ctx, o.tx_depth * o.qps)?;

    let mut src = pd.register(AlignedBuf::new(size)?, AccessFlags::LOCAL_WRITE)?.into_chunks(size)?.remove(0);
    for (b, p) in src.iter_mut().zip(pattern(size)) {
        *b = p;
    }
    let src = Arc::new(src);

    let mut lanes = Vec::with_capacity(o.qps as usize);
    for _ in 0..o.qps {
        let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(o.tx_depth).max_recv_wr(1).build()?;
        let conn = o.common.handshake(&qp, QpAccess::empty()).connect(stream)?;
        let remote = perftest::check_remote(conn.remote.mr, size)?;
        lanes.push(Lane { sq: qp.send_queue()?, remote, posted: 0, done: 0, tail_signaled: true, _qp: qp });
    }

    let moderation = cq_mod(o, size);
    let deadline = o.duration.map(Duration::from_secs_f64);
    let started = Instant::now();
    let mut progress_at = started + Duration::from_secs(3);
    let mut last = (started, 0u64);
    let mut peak = 0f64;
    let mut wcs = [WorkCompletion::EMPTY; 64];
    let total_target = iters * u64::from(o.qps);
    let mut finished = 0u64;
    let mut stop_posting = false;

    loop {
        if let Some(d) = deadline {
            stop_posting = stop_posting || started.elapsed() >= d;
        }
        for lane in lanes.iter_mut() {
            let limit = if deadline.is_some() { u64::MAX } else { iters };
            while !stop_posting && lane.posted < limit && lane.sq.outstanding() < o.tx_depth as usize {
                let room = (o.tx_depth as usize - lane.sq.outstanding()).min(o.post_list as usize);
                let k = (room as u64).min(limit - lane.posted);
                if k < u64::from(o.post_list).min(limit - lane.posted) {
                    break; // wait for a whole post list's room, as perftest does
                }
                let remote = lane.remote;
                let first = lane.posted;
                let wrs = (0..k).map(|j| {
                    let n = first + j + 1;
                    let signaled = n % u64::from(moderation) == 0 || n == limit;
                    SendWr::write(Arc::clone(&src), 0..size, remote).signaled(signaled)
                });
                lane.sq.post_batch(wrs).map_err(|(e, _)| e)?;
                lane.posted += k;
                lane.tail_signaled = lane.posted % u64::from(moderation) == 0 || lane.posted == limit;
            }
            if stop_posting && !lane.tail_signaled && lane.sq.outstanding() < o.tx_depth as usize {
                let wr = SendWr::write(Arc::clone(&src), 0..size, lane.remote);
                lane.sq.post(wr).map_err(|(e, _)| e)?;
                lane.posted += 1;
                lane.tail_signaled = true;
            }
        }
        let n = cq.poll(&mut wcs)?.len();
        for wc in &mut wcs[..n] {
            if wc.status() != WcStatus::Success {
                wc.ok()?;
            }
            let lane = lanes.iter_mut().find(|l| l.sq.qp_num() == wc.qp_num()).ok_or("completion of an unknown QP")?;
            let released = lane.sq.complete(wc, drop)? as u64;
            lane.done += released;
            finished += released;
        }
        if n > 0 {
            let now = Instant::now();
            let dt = now.duration_since(last.0).as_secs_f64();
            // Peak: the best window of at least a full pipeline (tx depth) of completions;
            // shorter windows only measure how completions bunch up.
            if finished - last.1 >= u64::from(moderation.max(o.tx_depth)) && dt > 0.0 {
                peak = peak.max((finished - last.1) as f64 * size as f64 / dt);
                last = (now, finished);
            }
            if now >= progress_at {
                report_progress(o, finished, total_target, started);
                progress_at = now + Duration::from_secs(1);
            }
        }
        let all_posted_done = lanes.iter().all(|l| l.sq.outstanding() == 0);
        if deadline.is_some() {
            if stop_posting && all_posted_done {
                break;
            }
        } else if finished >= total_target {
            break;
        }
    }
    let secs = started.elapsed().as_secs_f64();

    let bytes = finished as f64 * size as f64;
    let avg = bytes / secs;
    Ok(BwRow {
        bytes: size,
        iterations: finished / u64::from(o.qps),
        bw_peak_mib_s: peak.max(avg) / f64::from(1 << 20),
        bw_avg_mib_s: avg / f64::from(1 << 20),
        msg_rate_mpps: finished as f64 / secs / 1e6,
    })
}

fn report_progress(o: &Opts, finished: u64, total: u64, started: Instant) {
    match o.duration {
        Some(d) => eprintln!("write_bw: {:.0} of {d} s", started.elapsed().as_secs_f64()),
        None => eprintln!("write_bw: {finished} of {total} writes ({:.0}%)", finished as f64 * 100.0 / total as f64),
    }
}

fn print_header(o: &Opts, ctx: &Context, role: &Role) {
    println!("{}", perftest::rule());
    println!("                    RDMA_Write BW Test");
    println!(" Device         : {}", ctx.name());
    println!(" Number of qps  : {}\t\tTransport type : IB", o.qps);
    println!(" Connection type : RC\t\tUsing SRQ      : OFF");
    println!(" TX depth        : {}", o.tx_depth);
    println!(" CQ Moderation   : {}", o.cq_mod.map_or("100 (1 above 8 KiB)".into(), |m| m.to_string()));
    println!(" Post List       : {}", o.post_list);
    println!(" Mode            : {}", role.describe());
    println!("{}", perftest::rule());
    perftest::print_bw_header(o.report_gbits);
}
