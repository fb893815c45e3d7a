//! RDMA WRITE bandwidth, like perftest's `ib_write_bw`, on the safe data path.
//!
//! ```text
//! write_bw --loopback [-d DEV] [-x GID] [-s SIZE | -a] [-n ITERS | -D SECS] [-t DEPTH] [-Q MOD] [-l LIST] [-q QPS]
//! ```
//!
//! `--loopback` runs both ends in one process on one device: the client QPs write into
//! remote-writable regions of the server QPs, and at the end the server side checks that
//! its regions hold the client's pattern (a mismatch fails the run). Bandwidth is in MiB/s
//! (2^20 bytes a second) as perftest prints it, or Gb/s with `--report_gbits`; `--json`
//! prints one object per size. Server/client over TCP (`-p`, a host argument) comes with
//! the endpoint exchange.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, InitAttr, MemoryRegion, ProtectionDomain, QpAccess,
    QpType, QueuePair, RemoteWritable, SendQueue, SendWr, WcStatus, WorkCompletion,
};

/// Command-line flags, named as perftest names them.
#[derive(Parser, Debug)]
#[command(name = "write_bw", about = "RDMA WRITE bandwidth (perftest's ib_write_bw, on rdma-verbs)")]
struct Opts {
    /// Device name (default: the first device).
    #[arg(short = 'd', long = "ib-dev")]
    device: Option<String>,
    /// GID index (default: RoCE v2 with an IPv4 address, or 0 on InfiniBand).
    #[arg(short = 'x', long = "gid-index")]
    gid_index: Option<u32>,
    /// Port of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// Message size in bytes.
    #[arg(short = 's', long = "size", default_value_t = 65536)]
    size: usize,
    /// Run sizes 2 B to 8 MiB, powers of two.
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Iterations per QP.
    #[arg(short = 'n', long = "iters", default_value_t = 5000)]
    iters: u64,
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
    /// TCP port of the exchange (server/client mode).
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    tcp_port: u16,
    /// Report bandwidth in Gb/s.
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// Server and client in one process on one device.
    #[arg(long)]
    loopback: bool,
    /// One JSON object per size on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// The server to connect to (client mode).
    host: Option<String>,
}

/// One size's result, in perftest's units.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Row {
    bytes: usize,
    iterations: u64,
    bw_peak_mib_s: f64,
    bw_avg_mib_s: f64,
    msg_rate_mpps: f64,
}

/// One client QP writing into one server region.
struct Lane {
    sq: SendQueue<Arc<Chunk>>,
    target: MemoryRegion<AlignedBuf, RemoteWritable>,
    posted: u64,
    done: u64,
    // Whether the last posted request was signaled: an unsignaled tail completes only
    // behind a signaled one, so a timed run ends with one more signaled write.
    tail_signaled: bool,
    // Kept alive for the run: the QPs (both ends), the server CQ.
    _qps: (QueuePair, QueuePair),
}

fn main() -> ExitCode {
    let opts = Opts::parse();
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("write_bw: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(o: &Opts) -> Result<(), Box<dyn std::error::Error>> {
    if !o.loopback {
        return Err("only --loopback is available in this build: server/client mode needs the endpoint exchange".into());
    }
    if o.size == 0 && !o.all {
        return Err("size must be at least 1 byte (-s)".into());
    }
    if o.tx_depth == 0 || o.post_list == 0 || o.qps == 0 {
        return Err("-t, -l and -q must be at least 1".into());
    }
    if o.post_list > o.tx_depth {
        return Err(format!("post list {} is larger than the tx depth {}", o.post_list, o.tx_depth).into());
    }
    let ctx = Context::open(o.device.as_deref())?;
    let dev = ctx.query_device()?;
    if o.tx_depth > dev.max_qp_wr {
        return Err(format!("tx depth {} exceeds the device's max_qp_wr {}", o.tx_depth, dev.max_qp_wr).into());
    }
    let max_msg = ctx.query_port(o.ib_port)?.raw.max_msg_sz as usize;
    let sizes: Vec<usize> = if o.all { (1..=23).map(|p| 1usize << p).collect() } else { vec![o.size] };
    if let Some(&too_big) = sizes.iter().find(|&&s| s > max_msg) {
        return Err(format!("size {too_big} exceeds the port's max message size {max_msg}").into());
    }
    if !o.json {
        print_header(o, &ctx);
    }
    for &size in &sizes {
        let row = run_size(o, &ctx, size)?;
        if o.json {
            println!("{}", serde_json::to_string(&row)?);
        } else {
            print_row(o, &row);
        }
    }
    if !o.json {
        println!("{}", "-".repeat(87));
    }
    Ok(())
}

/// perftest's moderation rule: every 100th signaled, every one above 8 KiB unless -Q.
fn cq_mod(o: &Opts, size: usize) -> u32 {
    let m = o.cq_mod.unwrap_or(if size > 8192 { 1 } else { 100 });
    m.clamp(1, o.tx_depth)
}

fn pattern(size: usize) -> impl Iterator<Item = u8> {
    (0..size).map(move |i| (i as u8).wrapping_mul(13).wrapping_add(size as u8))
}

fn run_size(o: &Opts, ctx: &Context, size: usize) -> Result<Row, Box<dyn std::error::Error>> {
    let pd = ProtectionDomain::new(ctx)?;
    let mut cq = CompletionQueue::new(ctx, o.tx_depth * o.qps)?;
    let server_cq = CompletionQueue::new(ctx, 16)?;
    let init = InitAttr { port: o.ib_port, access: QpAccess::REMOTE_WRITE, ..InitAttr::default() };

    let mut src = pd.register(AlignedBuf::new(size)?, AccessFlags::LOCAL_WRITE)?.into_chunks(size)?.remove(0);
    for (b, p) in src.iter_mut().zip(pattern(size)) {
        *b = p;
    }
    let src = Arc::new(src);

    let mut lanes = Vec::with_capacity(o.qps as usize);
    for _ in 0..o.qps {
        let client = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(o.tx_depth).max_recv_wr(1).build()?;
        let server =
            QueuePair::builder(&pd, QpType::Rc, &server_cq, &server_cq).max_send_wr(1).max_recv_wr(1).build()?;
        let (c, s) = (client.local_info(o.ib_port, 0)?, server.local_info(o.ib_port, 0)?);
        let (c, s) = match o.gid_index {
            Some(i) => {
                let gid = ctx.query_gid(o.ib_port, i)?.gid;
                (rdma_verbs::RemoteQpInfo { gid, ..c }, rdma_verbs::RemoteQpInfo { gid, ..s })
            }
            None => (c, s),
        };
        client.connect(&init, c.psn, &s)?;
        server.connect(&init, s.psn, &c)?;
        let target =
            pd.register_remote_writable(AlignedBuf::new(size)?, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
        lanes.push(Lane {
            sq: client.send_queue()?,
            target,
            posted: 0,
            done: 0,
            tail_signaled: true,
            _qps: (client, server),
        });
    }

    let moderation = cq_mod(o, size);
    let deadline = o.duration.map(Duration::from_secs_f64);
    let started = Instant::now();
    let mut progress_at = started + Duration::from_secs(3);
    let mut last = (started, 0u64);
    let mut peak = 0f64;
    let mut wcs = [WorkCompletion::EMPTY; 64];
    let total_target = o.iters * u64::from(o.qps);
    let mut finished = 0u64;
    let mut stop_posting = false;

    loop {
        if let Some(d) = deadline {
            stop_posting = stop_posting || started.elapsed() >= d;
        }
        for lane in lanes.iter_mut() {
            let limit = if deadline.is_some() { u64::MAX } else { o.iters };
            while !stop_posting && lane.posted < limit && lane.sq.outstanding() < o.tx_depth as usize {
                let room = (o.tx_depth as usize - lane.sq.outstanding()).min(o.post_list as usize);
                let k = (room as u64).min(limit - lane.posted);
                if k < u64::from(o.post_list).min(limit - lane.posted) {
                    break; // wait for a whole post list's room, as perftest does
                }
                let remote = lane.target.remote();
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
                let wr = SendWr::write(Arc::clone(&src), 0..size, lane.target.remote());
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

    // The server side checks what arrived.
    let want: Vec<u8> = pattern(size).collect();
    let mut got = vec![0u8; size];
    for (i, lane) in lanes.iter().enumerate() {
        lane.target.read_at(0, &mut got)?;
        if got != want {
            let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!("data check failed on QP {i}: byte {at} of {size} differs").into());
        }
    }

    let bytes = finished as f64 * size as f64;
    let avg = bytes / secs;
    Ok(Row {
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

fn print_header(o: &Opts, ctx: &Context) {
    let line = "-".repeat(87);
    println!("{line}");
    println!("                    RDMA_Write BW Test");
    println!(" Device         : {}", ctx.name());
    println!(" Number of qps  : {}\t\tTransport type : IB", o.qps);
    println!(" Connection type : RC\t\tUsing SRQ      : OFF");
    println!(" TX depth        : {}", o.tx_depth);
    println!(" CQ Moderation   : {}", o.cq_mod.map_or("100 (1 above 8 KiB)".into(), |m| m.to_string()));
    println!(" Post List       : {}", o.post_list);
    println!(" Mode            : {}", if o.loopback { "loopback (one process)" } else { "server/client" });
    println!("{line}");
    let unit = if o.report_gbits { "Gb/sec" } else { "MiB/sec" };
    println!(" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]");
}

fn print_row(o: &Opts, r: &Row) {
    let conv = |mib: f64| if o.report_gbits { mib * f64::from(1 << 20) * 8.0 / 1e9 } else { mib };
    println!(
        " {:<10} {:<10}       {:<12.2}       {:<12.2}         {:.6}",
        r.bytes,
        r.iterations,
        conv(r.bw_peak_mib_s),
        conv(r.bw_avg_mib_s),
        r.msg_rate_mpps
    );
}
