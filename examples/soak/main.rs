//! `soak`: many RC QP pairs on one device, driven for minutes with a mix of RDMA WRITE,
//! RDMA READ and SEND of random sizes, every byte checked. `scripts/soak` runs it on rxe.
//!
//! ```text
//! soak [--minutes M] [--qps N] [--depth D] [--seed S] [--max-size BYTES] [-d DEV]
//! soak --server [-p PORT] [-d DEV] [-x GID_INDEX]
//! soak --client HOST [-p PORT] [the flags of the first line] [-x GID_INDEX]
//!      [--qp-timeout T] [--retry-cnt R] [--ops send,write,read] [--stuck-secs S]
//!      [--accept-link-failure]
//! ```
//!
//! The first line is the single-host mode, described below. The other two are the
//! two-host mode (`two_host.rs`): the same lanes and checks with every pair's A in the
//! client and its B in the server, on two hosts, each pair's QPs connected across by the
//! library's endpoint handshake over one TCP connection; `scripts/netfaults` runs it
//! between the two test-bed nodes under network faults.
//!
//! Each of the N pairs is two RC QPs on the device, connected to each other: the
//! initiator A posts, the target B receives and exposes one remote-readable,
//! remote-writable region. A pair has D lanes, each with one operation at a time and its
//! own 1 MiB buffers (a chunk on A, a receive chunk and a region slot on B). A lane picks
//! an operation and a size (1 B .. 1 MiB, log-uniform) from the pair's seeded generator:
//!
//! - SEND with immediate: A fills its chunk with random bytes; B checks what it received.
//! - RDMA WRITE with immediate into the lane's slot of B's region: B checks the slot.
//! - RDMA READ of the lane's slot, which B filled first: A checks what it read. A fills
//!   its chunk with random bytes first too, so a READ that landed nothing fails the check.
//!
//! The checksum is CRC-32 (IEEE) over every byte of the message. SEND and WRITE carry it
//! in the immediate data (the lane in the top 4 bits, the low 28 bits of the CRC below);
//! for READ, B hands the CRC of what it put in the slot to the reader, as it would
//! advertise it next to the rkey. A lane starts its next operation only after its last
//! one was checked, so stale bytes fail the check too.
//!
//! No CQ can overrun, by construction: A's CQ gets only A's send completions (every send
//! is signaled, at most one per lane: at most D), B's CQ gets only B's receive
//! completions (B keeps exactly D receives posted and reposts one only after taking its
//! completion: at most D). Each CQ is created with D + 1 entries, room for its QP's
//! queues as built (D one way, 1 the other, which building the QP checks), and the program
//! checks the provider gave at least that. B never runs out of receives: a lane's message consumes a
//! receive, and the lane waits until B has taken it before its next message.
//!
//! Every ~10 s it prints ops, bytes, errors and RSS on stderr. At the end it drains every
//! lane, moves B's QPs to the error state (flushing their posted receives) and checks:
//! posts equal completions on every queue, no checksum or completion error, the device's
//! resource counts (`rdma -j resource show`) back to what they were before the run, and
//! the resident memory within `--rss-slack-kib` of what it was after the warm-up. The last
//! line on stdout is a summary; the exit status is 0 only when every check holds.
//!
//! Both modes run the same code but for where B is: `lanes.rs` holds a pair's lanes (A's
//! side and B's, B's verdict on each message an `Ack`), `run.rs` the traffic loop and the
//! end checks over a mode's pairs (`Side`). Here, a `LocalPair` hands B's verdict straight
//! to A; in `two_host.rs` it travels back by SEND.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

mod lanes;
mod run;
mod two_host;
use lanes::{Counts, Initiator, Receiver, Shared, Stats};
use rdma_verbs::{
    AccessFlags, AlignedBuf, Context, InitAttr, ProtectionDomain, QpAccess, QpType, QueuePair, RtsAttr, WorkCompletion,
};
use run::{Lanes, Limits, Side, Tally, Traffic};

/// The largest message, and the size of each lane's buffers.
const SLOT: usize = 1 << 20;
/// Lanes are numbered in the top 4 bits of the immediate data.
const MAX_DEPTH: u32 = 16;
const CRC_BITS: u32 = 0x0FFF_FFFF;
/// A lane whose operation has not finished after this long fails the run.
const STUCK: Duration = Duration::from_secs(60);

#[derive(Parser, Debug)]
#[command(name = "soak", about = "RC QP pairs under a checked WRITE/READ/SEND mix for minutes")]
struct Opts {
    /// How long to drive traffic, in minutes.
    #[arg(long, default_value_t = 2.0)]
    minutes: f64,
    /// Number of connected QP pairs (each an initiator and a target QP: twice as many QPs).
    #[arg(long, default_value_t = 8)]
    qps: u32,
    /// Operations in flight per pair (lanes), 1 to 16.
    #[arg(long, default_value_t = 4)]
    depth: u32,
    /// Seed of the operation and size choices and of the data (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Largest message in bytes (1 to 1 MiB).
    #[arg(long, default_value_t = SLOT)]
    max_size: usize,
    /// Device name (default: $RDMA_DEVICE, else the first device).
    #[arg(short = 'd', long = "ib-dev")]
    device: Option<String>,
    /// Port of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// Seconds of traffic before the warm-up RSS is taken (at most half the run).
    #[arg(long, default_value_t = 20)]
    warmup_secs: u64,
    /// How far the final RSS may exceed the warm-up RSS, in KiB.
    #[arg(long, default_value_t = 2048)]
    rss_slack_kib: u64,
    /// Seconds between progress lines.
    #[arg(long, default_value_t = 10)]
    report_secs: u64,
    /// Self-test of the checker: flip one bit of the first WRITE that lands, after it
    /// landed and before B checks it. The run must then report a checksum error and fail.
    #[arg(long, hide = true)]
    corrupt_one_write: bool,
    /// Two hosts: be the target side (every B), waiting for a `--client` on `--port`.
    /// The client's flags set the run's shape (pairs, lanes, seed, length, retries).
    #[arg(long, conflicts_with = "client")]
    server: bool,
    /// Two hosts: be the initiator side (every A) of a `--server` on HOST.
    #[arg(long, value_name = "HOST")]
    client: Option<String>,
    /// Two hosts: the TCP port of the exchange.
    #[arg(short = 'p', long, default_value_t = 18600)]
    port: u16,
    /// Two hosts: GID index (default: RoCE v2 with an IPv4 address, or 0 on InfiniBand).
    #[arg(short = 'x', long = "gid-index")]
    gid_index: Option<u32>,
    /// Two hosts: QP timeout (perftest's `-u`): a request unacknowledged for
    /// 4.096 us * 2^N is sent again (0..=31; 0 waits forever).
    #[arg(short = 'u', long, default_value_t = RtsAttr::default().timeout, value_parser = clap::value_parser!(u8).range(0..=31))]
    qp_timeout: u8,
    /// Two hosts: retries after a timeout before a request fails (0..=7; the library's
    /// default, 6; rxe retries forever at 7).
    #[arg(long, default_value_t = RtsAttr::default().retry_cnt, value_parser = clap::value_parser!(u8).range(0..=7))]
    retry_cnt: u8,
    /// Two hosts: a failed link or peer is an accepted outcome. The run then passes when
    /// either everything arrived intact, or the QPs failed cleanly: every request posted
    /// completed exactly once, no byte was wrong, and the first failure came within the
    /// QP's retry bound (timeout and retry count) of the last completion.
    #[arg(long)]
    accept_link_failure: bool,
    /// Two hosts: an operation unfinished this long is a hang, and fails the run.
    #[arg(long, default_value_t = STUCK.as_secs(), value_parser = clap::value_parser!(u64).range(1..=3600))]
    stuck_secs: u64,
    /// Two hosts: the operations the lanes pick from, e.g. `--ops send,write`.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Kind::Send, Kind::Write, Kind::Read])]
    ops: Vec<Kind>,
}

impl Opts {
    /// Whether any two-host flag was given a value of its own.
    fn two_host_flags(&self) -> bool {
        self.gid_index.is_some()
            || self.qp_timeout != RtsAttr::default().timeout
            || self.retry_cnt != RtsAttr::default().retry_cnt
            || self.accept_link_failure
            || self.stuck_secs != STUCK.as_secs()
            || self.ops != [Kind::Send, Kind::Write, Kind::Read]
    }
}

fn main() -> ExitCode {
    let opts = Opts::parse();
    let result = if opts.server {
        two_host::serve(&opts)
    } else if let Some(host) = &opts.client {
        two_host::client(&opts, host)
    } else if opts.two_host_flags() {
        Err("-x, --qp-timeout, --retry-cnt, --accept-link-failure, --stuck-secs and --ops are for the two-host mode (--server, --client)"
            .into())
    } else {
        one_host(&opts)
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("soak: {e}");
            ExitCode::FAILURE
        }
    }
}

type AnyError = Box<dyn std::error::Error>;

// ---- checksum and data ----------------------------------------------------------------

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320), eight bytes a step
/// ("slicing by 8") so that checking a MiB costs less than moving it through rxe.
struct Crc32 {
    tables: Box<[[u32; 256]; 8]>,
}

impl Crc32 {
    fn new() -> Self {
        let mut t = Box::new([[0u32; 256]; 8]);
        for i in 0..256u32 {
            let mut c = i;
            for _ in 0..8 {
                c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
            }
            t[0][i as usize] = c;
        }
        for i in 0..256 {
            for k in 1..8 {
                let prev = t[k - 1][i];
                t[k][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            }
        }
        Crc32 { tables: t }
    }

    fn sum(&self, data: &[u8]) -> u32 {
        let t = &self.tables;
        let mut crc = !0u32;
        let mut words = data.chunks_exact(8);
        for w in &mut words {
            let lo = u32::from_le_bytes([w[0], w[1], w[2], w[3]]) ^ crc;
            let hi = u32::from_le_bytes([w[4], w[5], w[6], w[7]]);
            crc = t[7][(lo & 0xff) as usize]
                ^ t[6][((lo >> 8) & 0xff) as usize]
                ^ t[5][((lo >> 16) & 0xff) as usize]
                ^ t[4][(lo >> 24) as usize]
                ^ t[3][(hi & 0xff) as usize]
                ^ t[2][((hi >> 8) & 0xff) as usize]
                ^ t[1][((hi >> 16) & 0xff) as usize]
                ^ t[0][(hi >> 24) as usize];
        }
        for &b in words.remainder() {
            crc = (crc >> 8) ^ t[0][((crc ^ u32::from(b)) & 0xff) as usize];
        }
        !crc
    }
}

/// A seeded generator (fastrand's), with the two shapes the soak draws.
struct Rng(fastrand::Rng);

impl Rng {
    fn seeded(seed: u64) -> Rng {
        Rng(fastrand::Rng::with_seed(seed))
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0.u64(0..n)
    }

    /// A size in 1..=max, log-uniform: as many messages of 1-2 bytes as of 0.5-1 MiB.
    fn size(&mut self, max: usize) -> usize {
        let bits = usize::BITS - max.leading_zeros(); // max < 2^bits
        let e = self.below(u64::from(bits)) as u32;
        let lo = 1usize << e;
        let hi = (lo << 1).min(max + 1);
        lo + self.below((hi - lo) as u64) as usize
    }

    fn fill(&mut self, buf: &mut [u8]) {
        self.0.fill(buf);
    }
}

// ---- one pair ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Kind {
    Send,
    Write,
    Read,
}

/// One host: a pair's A and B, both QPs on this device, connected to each other. B's
/// verdict on a SEND or WRITE goes straight to A's lane.
struct LocalPair {
    a: Initiator,
    b: Receiver,
    b_qp: QueuePair,
    _a_qp: QueuePair,
}

impl LocalPair {
    fn new(ctx: &Context, pd: &ProtectionDomain, o: &Opts, index: usize, seed: u64) -> Result<LocalPair, AnyError> {
        let depth = o.depth;
        // CQ depth: see the module docs; at most `depth` completions can be waiting, and the
        // QP's other queue (depth 1) has its share too.
        let (a_cq, b_cq) = (lanes::cq(ctx, depth + 1)?, lanes::cq(ctx, depth + 1)?);
        let psn = |i: usize| (0x1000 + i as u32 * 0x100) & 0xFF_FFFF;
        let a = QueuePair::builder(pd, QpType::Rc, &a_cq, &a_cq)
            .max_send_wr(depth)
            .max_recv_wr(1)
            .psn(psn(2 * index))
            .build()?;
        let b = QueuePair::builder(pd, QpType::Rc, &b_cq, &b_cq)
            .max_send_wr(1)
            .max_recv_wr(depth)
            .psn(psn(2 * index + 1))
            .build()?;
        let (ia, ib) = (a.local_info(o.ib_port)?, b.local_info(o.ib_port)?);
        a.connect(&InitAttr { port: o.ib_port, ..InitAttr::default() }, &ib)?;
        let b_access = QpAccess::REMOTE_WRITE | QpAccess::REMOTE_READ;
        b.connect(&InitAttr { port: o.ib_port, access: b_access, ..InitAttr::default() }, &ia)?;

        let region_access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let region = pd.register_remote_writable(AlignedBuf::new(depth as usize * SLOT)?, region_access)?;
        let remote = region.remote()?;
        Ok(LocalPair {
            a: Initiator::new(pd, index, seed, (a_cq, a.send_queue()?), remote, depth)?,
            b: Receiver::new(pd, index, (b_cq, b.recv_queue()?), region, depth)?,
            b_qp: b,
            _a_qp: a,
        })
    }
}

impl Side for LocalPair {
    fn index(&self) -> usize {
        self.a.index
    }

    fn poll(&mut self, sh: &mut Shared, wcs: &mut [WorkCompletion], running: bool) -> Result<usize, AnyError> {
        let n = self.a.poll_sends(sh, wcs)?;
        let a = &mut self.a;
        // B counted what it found wrong; a malformed message names no lane A could free.
        let m = self.b.poll(sh, wcs, running, |ack| {
            if ack.verdict != lanes::MALFORMED {
                a.checked(&ack);
            }
        })?;
        Ok(n + m)
    }

    fn queues(&self) -> [(&'static str, Counts); 2] {
        [("A send", self.a.sends), ("B receive", self.b.recvs)]
    }

    /// A's operations (B counts the same ones again) and both sides' errors.
    fn stats(&self) -> Stats {
        let mut s = self.a.stats;
        s.add_errors(&self.b.stats);
        s
    }

    fn qp(&self) -> &QueuePair {
        &self.b_qp
    }
}

impl Lanes for LocalPair {
    fn a(&mut self) -> &mut Initiator {
        &mut self.a
    }

    fn busy(&self) -> bool {
        self.a.busy()
    }

    fn start_idle(&mut self, sh: &mut Shared) {
        self.a.start_idle(sh, &mut self.b);
    }
}

// ---- resident memory and device resources --------------------------------------------------

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The device's resource counts as the kernel sees them (`rdma -j resource show`):
/// `[{"ifindex":0,"ifname":"rxe0","pd":1,"cq":2,...}]`, every number but the index.
fn resource_counts(device: &str) -> Result<BTreeMap<String, u64>, AnyError> {
    let out = std::process::Command::new("rdma")
        .args(["-j", "resource", "show"])
        .output()
        .map_err(|e| format!("running `rdma -j resource show` (iproute2): {e}"))?;
    if !out.status.success() {
        return Err(format!("`rdma -j resource show` failed: {}", String::from_utf8_lossy(&out.stderr).trim()).into());
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let dev = v
        .as_array()
        .and_then(|a| a.iter().find(|d| d.get("ifname").and_then(|n| n.as_str()) == Some(device)))
        .and_then(|d| d.as_object())
        .ok_or_else(|| format!("{device} is not in `rdma -j resource show`"))?;
    Ok(dev.iter().filter(|(k, _)| *k != "ifindex").filter_map(|(k, v)| Some((k.clone(), v.as_u64()?))).collect())
}

fn counts_text(c: &BTreeMap<String, u64>) -> String {
    c.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

// ---- the run --------------------------------------------------------------------------------

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

/// Refuses a shape the run cannot have, before any device is touched.
fn check_shape(o: &Opts) -> Result<(), AnyError> {
    if !(o.minutes > 0.0 && o.minutes.is_finite()) {
        return Err(format!("--minutes {}: give a positive number", o.minutes).into());
    }
    if o.qps == 0 {
        return Err("--qps must be at least 1".into());
    }
    if o.depth == 0 || o.depth > MAX_DEPTH {
        return Err(
            format!("--depth {}: 1 to {MAX_DEPTH} (the lane travels in 4 bits of the immediate)", o.depth).into()
        );
    }
    if o.max_size == 0 || o.max_size > SLOT {
        return Err(format!("--max-size {}: 1 to {SLOT} bytes", o.max_size).into());
    }
    Ok(())
}

/// `-d`, else $RDMA_DEVICE, else the first device.
fn device_name(o: &Opts) -> Result<String, AnyError> {
    Ok(match o.device.clone().or_else(|| std::env::var("RDMA_DEVICE").ok()) {
        Some(d) => d,
        None => rdma_verbs::devices()?.iter().next().map(|d| d.name().to_owned()).ok_or("no RDMA device")?,
    })
}

/// `--seed`, else one from the clock.
fn seed_of(o: &Opts) -> u64 {
    o.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        t.as_nanos() as u64 ^ u64::from(std::process::id())
    })
}

/// The single-host mode: runs, checks and prints the summary.
fn one_host(o: &Opts) -> Result<bool, AnyError> {
    check_shape(o)?;
    let device = device_name(o)?;
    let seed = seed_of(o);
    let duration = Duration::from_secs_f64(o.minutes * 60.0);
    eprintln!(
        "soak: device {device}, {} pairs x {} lanes, sizes 1..={} B, {:.1} min, seed {seed}",
        o.qps, o.depth, o.max_size, o.minutes
    );
    let before = resource_counts(&device)?;

    let (traffic, t) = drive(o, &device, seed, &Limits::new(o, duration))?;
    // Everything of the run is dropped by now: the device must be back where it was.
    let after = resource_counts(&device)?;
    let rss_after_teardown = rss_kib();

    let s = &t.totals;
    let mut failures = Vec::new();
    if s.checksum_errors > 0 {
        failures.push(format!("{} checksum errors", s.checksum_errors));
    }
    if s.wc_errors + s.other_errors > 0 {
        failures.push(format!("{} completion errors, {} other errors", s.wc_errors, s.other_errors));
    }
    if t.unbalanced > 0 {
        failures.push(format!("{} queues whose posts and completions differ", t.unbalanced));
    }
    failures.extend(run::own_checks(&before, &after, (traffic.rss_warm, traffic.rss_final), o.rss_slack_kib));
    println!(
        "soak: {} {} {} rss_after_teardown={rss_after_teardown}KiB {}",
        if failures.is_empty() { "PASS" } else { "FAIL" },
        run::traffic_fields(o, seed, traffic.traffic, &t),
        run::rss_fields(&traffic, o.rss_slack_kib),
        run::resources_fields(&before, &after),
    );
    for f in &failures {
        eprintln!("soak: FAIL: {f}");
    }
    Ok(failures.is_empty())
}

/// Sets everything up, drives traffic, drains and counts; everything it made is dropped
/// when it returns.
fn drive(o: &Opts, device: &str, seed: u64, lim: &Limits) -> Result<(Traffic, Tally), AnyError> {
    let ctx = Context::open(Some(device))?;
    let pd = ProtectionDomain::new(&ctx)?;
    let mut pairs = Vec::with_capacity(o.qps as usize);
    for i in 0..o.qps as usize {
        pairs.push(LocalPair::new(&ctx, &pd, o, i, seed)?);
    }
    let mut sh = Shared::new(o, o.depth);
    let mut wcs = run::completions();
    let traffic = run::drive(&mut pairs, &mut sh, &mut wcs, lim)?;
    // B's posted receives complete only by being flushed: the error state does that.
    run::flush(&mut pairs, &mut sh, &mut wcs)?;
    let t = run::tally(&pairs);
    drop(pairs);
    drop((pd, ctx));
    Ok((traffic, t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_ieee_check_value_at_every_alignment() {
        let crc = Crc32::new();
        assert_eq!(crc.sum(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc.sum(b""), 0);
        // The 8-byte steps and the byte-wise tail agree with a bit-at-a-time CRC.
        let data: Vec<u8> = (0..100u32).map(|i| (i * 37 + 11) as u8).collect();
        for len in 0..data.len() {
            let mut slow = !0u32;
            for &b in &data[..len] {
                slow ^= u32::from(b);
                for _ in 0..8 {
                    slow = if slow & 1 != 0 { 0xEDB8_8320 ^ (slow >> 1) } else { slow >> 1 };
                }
            }
            assert_eq!(crc.sum(&data[..len]), !slow, "length {len}");
        }
    }

    #[test]
    fn sizes_stay_in_range_and_cover_every_power_of_two() {
        let mut rng = Rng::seeded(42);
        let mut seen = [false; 21];
        for _ in 0..20_000 {
            let s = rng.size(SLOT);
            assert!((1..=SLOT).contains(&s), "{s}");
            seen[(usize::BITS - 1 - s.leading_zeros()) as usize] = true;
        }
        assert!(seen.iter().all(|&b| b), "{seen:?}");
        for max in [1, 2, 3, 1000] {
            assert!((0..1000).map(|_| rng.size(max)).all(|s| (1..=max).contains(&s)));
        }
    }
}
