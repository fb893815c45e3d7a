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
//! - RDMA READ of the lane's slot, which B filled first: A checks what it read.
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

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;

mod two_host;
use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, InitAttr, MemoryRegion, ProtectionDomain, QpAccess,
    QpType, QueuePair, RecvQueue, Refused, RemoteMr, RemoteWritable, RtsAttr, SendQueue, SendWr, WcOpcode, WcStatus,
    WorkCompletion,
};

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
        run(&opts)
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

/// The operation a lane has in flight.
#[derive(Debug)]
struct Flight {
    kind: Kind,
    len: usize,
    crc: u32,
    /// A's send completion came back (with A's chunk).
    sent: bool,
    /// The data was checked where it landed (B for SEND and WRITE; A, on completion, for READ).
    checked: bool,
    since: Instant,
}

struct Lane {
    /// A's buffer while no operation holds it.
    chunk: Option<Chunk>,
    flight: Option<Flight>,
}

/// Posts and completions of one queue.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    posts: u64,
    completions: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    ops: [u64; 3],
    bytes: u64,
    checksum_errors: u64,
    wc_errors: u64,
    other_errors: u64,
    flushed: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        for i in 0..3 {
            self.ops[i] += o.ops[i];
        }
        self.bytes += o.bytes;
        self.checksum_errors += o.checksum_errors;
        self.wc_errors += o.wc_errors;
        self.other_errors += o.other_errors;
        self.flushed += o.flushed;
    }

    fn errors(&self) -> u64 {
        self.checksum_errors + self.wc_errors + self.other_errors
    }
}

struct Pair {
    index: usize,
    rng: Rng,
    a_cq: CompletionQueue,
    a_sq: SendQueue<Chunk>,
    b_cq: CompletionQueue,
    b_rq: RecvQueue<Chunk>,
    b_region: MemoryRegion<AlignedBuf, RemoteWritable>,
    remote: RemoteMr,
    lanes: Vec<Lane>,
    sq: Counts,
    rq: Counts,
    stats: Stats,
    /// Done items of one send completion (all sends are signaled: one each); kept to
    /// reuse its capacity.
    done: Vec<rdma_verbs::Done<Chunk>>,
    b_qp: QueuePair,
    _a_qp: QueuePair,
}

/// What the loop needs besides the pair: the checksum tables, a scratch MiB, the limits.
struct Shared {
    crc: Crc32,
    scratch: Vec<u8>,
    max_size: usize,
    /// `--corrupt-one-write`, until it has been done.
    corrupt_next_write: bool,
}

fn slot_of(remote: &RemoteMr, lane: usize, len: usize) -> Result<RemoteMr, AnyError> {
    let start = (lane * SLOT) as u64;
    Ok(remote.slice(start..start + len as u64)?)
}

impl Pair {
    fn new(ctx: &Context, pd: &ProtectionDomain, o: &Opts, index: usize, seed: u64) -> Result<Pair, AnyError> {
        let depth = o.depth;
        // CQ depth: see the module docs; at most `depth` completions can be waiting, and the
        // QP's other queue (depth 1) has its share too.
        let a_cq = CompletionQueue::new(ctx, depth + 1)?;
        let b_cq = CompletionQueue::new(ctx, depth + 1)?;
        for cq in [&a_cq, &b_cq] {
            if cq.cqe() < depth + 1 {
                return Err(format!("a CQ of {} entries, asked for {}", cq.cqe(), depth + 1).into());
            }
        }
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

        let lanes_len = depth as usize * SLOT;
        let a_chunks = pd.register(AlignedBuf::new(lanes_len)?, AccessFlags::LOCAL_WRITE)?.into_chunks(SLOT)?;
        let b_chunks = pd.register(AlignedBuf::new(lanes_len)?, AccessFlags::LOCAL_WRITE)?.into_chunks(SLOT)?;
        let region_access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let b_region = pd.register_remote_writable(AlignedBuf::new(lanes_len)?, region_access)?;
        let remote = b_region.remote()?;

        let mut pair = Pair {
            index,
            rng: Rng::seeded(seed ^ (index as u64).wrapping_mul(0xA076_1D64_78BD_642F)),
            a_sq: a.send_queue()?,
            b_rq: b.recv_queue()?,
            a_cq,
            b_cq,
            b_region,
            remote,
            lanes: a_chunks.into_iter().map(|c| Lane { chunk: Some(c), flight: None }).collect(),
            sq: Counts::default(),
            rq: Counts::default(),
            stats: Stats::default(),
            done: Vec::with_capacity(4),
            b_qp: b,
            _a_qp: a,
        };
        for (i, c) in b_chunks.into_iter().enumerate() {
            pair.b_rq.post(c, 0..SLOT, i as u64)?;
            pair.rq.posts += 1;
        }
        Ok(pair)
    }

    fn fail(&mut self, what: String) {
        eprintln!("soak: pair {}: {what}", self.index);
        self.stats.other_errors += 1;
    }

    /// Starts an operation on every idle lane.
    fn start_idle(&mut self, sh: &mut Shared) {
        for lane in 0..self.lanes.len() {
            if self.lanes[lane].flight.is_some() {
                continue;
            }
            let Some(mut chunk) = self.lanes[lane].chunk.take() else {
                self.fail(format!("lane {lane} is idle without its buffer"));
                continue;
            };
            let kind = [Kind::Send, Kind::Write, Kind::Read][self.rng.below(3) as usize];
            let len = self.rng.size(sh.max_size);
            let (wr, crc) = match kind {
                Kind::Send | Kind::Write => {
                    self.rng.fill(&mut chunk[..len]);
                    let crc = sh.crc.sum(&chunk[..len]);
                    let imm = (lane as u32) << 28 | (crc & CRC_BITS);
                    let wr = if kind == Kind::Send {
                        SendWr::send(chunk, 0..len)
                    } else {
                        match slot_of(&self.remote, lane, len) {
                            Ok(slot) => SendWr::write(chunk, 0..len, slot),
                            Err(e) => {
                                self.lanes[lane].chunk = Some(chunk);
                                self.fail(format!("lane {lane}: {e}"));
                                continue;
                            }
                        }
                    };
                    (wr.imm(imm), crc)
                }
                Kind::Read => {
                    // B puts fresh bytes in the slot, and tells the reader their CRC.
                    self.rng.fill(&mut sh.scratch[..len]);
                    let crc = sh.crc.sum(&sh.scratch[..len]);
                    let slot = self
                        .b_region
                        .write_at(lane * SLOT, &sh.scratch[..len])
                        .map_err(AnyError::from)
                        .and_then(|()| slot_of(&self.remote, lane, len));
                    match slot {
                        Ok(slot) => (SendWr::read(chunk, 0..len, slot), crc),
                        Err(e) => {
                            self.lanes[lane].chunk = Some(chunk);
                            self.fail(format!("lane {lane}: {e}"));
                            continue;
                        }
                    }
                }
            };
            match self.a_sq.post(wr.id(lane as u64)) {
                Ok(()) => {
                    self.sq.posts += 1;
                    self.lanes[lane].flight =
                        Some(Flight { kind, len, crc, sent: false, checked: false, since: Instant::now() });
                }
                Err(Refused { error: e, value: wr }) => {
                    self.lanes[lane].chunk = Some(wr.into_buf());
                    self.fail(format!("lane {lane}: posting a {kind:?} of {len} bytes: {e}"));
                }
            }
        }
    }

    /// Takes A's send completions; a READ is checked here, where it landed.
    fn poll_a(&mut self, sh: &Shared, wcs: &mut [WorkCompletion]) -> Result<usize, AnyError> {
        let n = self.a_cq.poll(wcs)?.len();
        for wc in &mut wcs[..n] {
            let status = wc.status();
            let mut done = std::mem::take(&mut self.done);
            let taken = self.a_sq.complete(wc, |d| done.push(d));
            if let Err(e) = taken {
                self.done = done;
                self.fail(format!("a completion A's send queue refused: {e}"));
                continue;
            }
            for d in done.drain(..) {
                self.sq.completions += 1;
                let lane = d.id as usize;
                let Some(f) = self.lanes.get_mut(lane).and_then(|l| l.flight.as_mut()) else {
                    self.stats.other_errors += 1;
                    eprintln!("soak: pair {}: a send completion for idle lane {lane}", self.index);
                    continue;
                };
                f.sent = true;
                if d.status != WcStatus::Success {
                    self.stats.wc_errors += 1;
                    eprintln!("soak: pair {} lane {lane}: {:?} of {} bytes: {status:?}", self.index, f.kind, f.len);
                } else if f.kind == Kind::Read {
                    f.checked = true;
                    if sh.crc.sum(&d.buf[..f.len]) != f.crc {
                        self.stats.checksum_errors += 1;
                        eprintln!("soak: pair {} lane {lane}: READ of {} bytes: checksum mismatch", self.index, f.len);
                    }
                }
                self.lanes[lane].chunk = Some(d.buf);
            }
            self.done = done;
        }
        Ok(n)
    }

    /// Takes B's receive completions: checks the SEND or WRITE they announce and reposts
    /// the receive. `running` false: completions after B's QP was moved to error.
    fn poll_b(&mut self, sh: &mut Shared, wcs: &mut [WorkCompletion], running: bool) -> Result<usize, AnyError> {
        let n = self.b_cq.poll(wcs)?.len();
        for wc in &mut wcs[..n] {
            let (opcode, imm) = (wc.opcode(), wc.imm_data());
            let d = match self.b_rq.complete(wc) {
                Ok(d) => d,
                Err(e) => {
                    self.fail(format!("a completion B's receive queue refused: {e}"));
                    continue;
                }
            };
            self.rq.completions += 1;
            if !running && d.status == WcStatus::WrFlushErr {
                self.stats.flushed += 1;
                continue;
            }
            if d.status != WcStatus::Success {
                self.stats.wc_errors += 1;
                eprintln!("soak: pair {}: receive completed with {:?}", self.index, d.status);
                continue;
            }
            self.check_landed(sh, opcode, imm, &d.buf, d.byte_len);
            match self.b_rq.post(d.buf, 0..SLOT, d.id) {
                Ok(()) => self.rq.posts += 1,
                Err(Refused { error: e, .. }) => self.fail(format!("reposting a receive: {e}")),
            }
        }
        Ok(n)
    }

    /// B's check of a SEND (bytes in `buf`) or a WRITE (bytes in the lane's slot), from
    /// what the receive completion says: the lane and CRC in the immediate data, the
    /// length in `byte_len`.
    fn check_landed(&mut self, sh: &mut Shared, opcode: WcOpcode, imm: Option<u32>, buf: &Chunk, byte_len: u32) {
        let Some(imm) = imm else {
            return self.fail(format!("a {opcode:?} completion without immediate data"));
        };
        let lane = (imm >> 28) as usize;
        let len = byte_len as usize;
        let kind = match opcode {
            WcOpcode::Recv => Kind::Send,
            WcOpcode::RecvRdmaWithImm => Kind::Write,
            other => return self.fail(format!("an unexpected receive opcode {other:?}")),
        };
        let Some(f) = self.lanes.get(lane).and_then(|l| l.flight.as_ref()) else {
            return self.fail(format!("a {kind:?} for lane {lane}, which has nothing in flight"));
        };
        if f.kind != kind || f.len != len || f.checked || len > SLOT {
            let what = format!("lane {lane}: B got a {kind:?} of {len} bytes; A posted {:?} of {}", f.kind, f.len);
            return self.fail(what);
        }
        let data = if kind == Kind::Send {
            &buf[..len]
        } else {
            if let Err(e) = self.b_region.read_at(lane * SLOT, &mut sh.scratch[..len]) {
                return self.fail(format!("lane {lane}: reading the WRITE's slot: {e}"));
            }
            if std::mem::take(&mut sh.corrupt_next_write) {
                sh.scratch[len / 2] ^= 0x10;
            }
            &sh.scratch[..len]
        };
        if sh.crc.sum(data) & CRC_BITS != imm & CRC_BITS {
            self.stats.checksum_errors += 1;
            eprintln!("soak: pair {} lane {lane}: {kind:?} of {len} bytes: checksum mismatch", self.index);
        }
        if let Some(f) = self.lanes[lane].flight.as_mut() {
            f.checked = true;
        }
    }

    /// Retires finished lanes; returns the oldest flight's age.
    fn retire(&mut self) -> Duration {
        retire(&mut self.lanes, &mut self.stats)
    }

    /// After an error, a lane is over once A has its buffer back: its message may never
    /// arrive.
    fn abandon_sent(&mut self) {
        abandon_sent(&mut self.lanes);
    }

    fn busy(&self) -> bool {
        busy(&self.lanes)
    }
}

/// Retires the finished lanes (sent and checked) into `stats`; returns the oldest
/// unfinished flight's age.
fn retire(lanes: &mut [Lane], stats: &mut Stats) -> Duration {
    let mut oldest = Duration::ZERO;
    for lane in lanes {
        let finished = match &lane.flight {
            Some(f) if f.sent && f.checked => true,
            Some(f) => {
                oldest = oldest.max(f.since.elapsed());
                false
            }
            None => false,
        };
        if finished {
            if let Some(f) = lane.flight.take() {
                stats.ops[f.kind as usize] += 1;
                stats.bytes += f.len as u64;
            }
        }
    }
    oldest
}

/// After an error, a lane is over once A has its buffer back: its message may never arrive.
fn abandon_sent(lanes: &mut [Lane]) {
    for lane in lanes {
        if lane.flight.as_ref().is_some_and(|f| f.sent) {
            lane.flight = None;
        }
    }
}

fn busy(lanes: &[Lane]) -> bool {
    lanes.iter().any(|l| l.flight.is_some())
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

fn progress(started: Instant, pairs: &[Pair]) -> String {
    let mut s = Stats::default();
    pairs.iter().for_each(|p| s.add(&p.stats));
    format!(
        "soak: t={:.0}s ops={} (send {} write {} read {}) bytes={:.1}MiB errors={} rss={}KiB",
        started.elapsed().as_secs_f64(),
        s.ops.iter().sum::<u64>(),
        s.ops[0],
        s.ops[1],
        s.ops[2],
        mib(s.bytes),
        s.errors(),
        rss_kib()
    )
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

fn run(o: &Opts) -> Result<bool, AnyError> {
    check_shape(o)?;
    let device = device_name(o)?;
    let seed = seed_of(o);
    let duration = Duration::from_secs_f64(o.minutes * 60.0);
    let warmup = Duration::from_secs(o.warmup_secs).min(duration / 2);
    eprintln!(
        "soak: device {device}, {} pairs x {} lanes, sizes 1..={} B, {:.1} min, seed {seed}",
        o.qps, o.depth, o.max_size, o.minutes
    );
    let before = resource_counts(&device)?;

    let mut outcome = drive(o, &device, seed, duration, warmup)?;
    // Everything of the run is dropped by now: the device must be back where it was.
    let after = resource_counts(&device)?;
    outcome.rss_after_teardown = rss_kib();

    let t = &outcome.totals;
    let rss_grew = outcome.rss_final.saturating_sub(outcome.rss_warm);
    let mut failures = Vec::new();
    if t.checksum_errors > 0 {
        failures.push(format!("{} checksum errors", t.checksum_errors));
    }
    if t.wc_errors + t.other_errors > 0 {
        failures.push(format!("{} completion errors, {} other errors", t.wc_errors, t.other_errors));
    }
    if outcome.unbalanced > 0 {
        failures.push(format!("{} queues whose posts and completions differ", outcome.unbalanced));
    }
    if before != after {
        failures.push(format!("device resources {} before, {} after", counts_text(&before), counts_text(&after)));
    }
    if rss_grew > o.rss_slack_kib {
        failures.push(format!("RSS grew {rss_grew} KiB after the warm-up (bound {} KiB)", o.rss_slack_kib));
    }
    let ops: u64 = t.ops.iter().sum();
    let secs = outcome.traffic.as_secs_f64();
    println!(
        "soak: {} minutes={:.2} pairs={} depth={} seed={seed} ops={ops} (send {} write {} read {}) bytes={:.1}MiB \
         ({:.2} MiB/s, {:.0} ops/s) checksum_errors={} wc_errors={} other_errors={} posts={} completions={} \
         (flushed at the end {}) rss_warm={}KiB rss_final={}KiB (+{rss_grew}, bound +{}) rss_after_teardown={}KiB \
         resources_before={} resources_after={}",
        if failures.is_empty() { "PASS" } else { "FAIL" },
        secs / 60.0,
        o.qps,
        o.depth,
        t.ops[0],
        t.ops[1],
        t.ops[2],
        mib(t.bytes),
        mib(t.bytes) / secs.max(1e-9),
        ops as f64 / secs.max(1e-9),
        t.checksum_errors,
        t.wc_errors,
        t.other_errors,
        outcome.posts,
        outcome.completions,
        t.flushed,
        outcome.rss_warm,
        outcome.rss_final,
        o.rss_slack_kib,
        outcome.rss_after_teardown,
        counts_text(&before),
        counts_text(&after),
    );
    for f in &failures {
        eprintln!("soak: FAIL: {f}");
    }
    Ok(failures.is_empty())
}

struct Outcome {
    totals: Stats,
    posts: u64,
    completions: u64,
    unbalanced: usize,
    traffic: Duration,
    rss_warm: u64,
    rss_final: u64,
    rss_after_teardown: u64,
}

/// Sets everything up, drives traffic for `duration`, drains and counts; everything it
/// made is dropped when it returns.
fn drive(o: &Opts, device: &str, seed: u64, duration: Duration, warmup: Duration) -> Result<Outcome, AnyError> {
    let ctx = Context::open(Some(device))?;
    let pd = ProtectionDomain::new(&ctx)?;
    let mut pairs = Vec::with_capacity(o.qps as usize);
    for i in 0..o.qps as usize {
        pairs.push(Pair::new(&ctx, &pd, o, i, seed)?);
    }
    let mut sh = Shared {
        crc: Crc32::new(),
        scratch: vec![0u8; SLOT],
        max_size: o.max_size,
        corrupt_next_write: o.corrupt_one_write,
    };
    let mut wcs: Vec<WorkCompletion> = (0..16).map(|_| WorkCompletion::EMPTY).collect();

    let started = Instant::now();
    let report_every = Duration::from_secs(o.report_secs.max(1));
    let mut next_report = started + report_every;
    let mut rss_warm = None;
    let mut failed = false;
    // Traffic, then the drain: no new operations, every lane finishes.
    let mut draining_since: Option<Instant> = None;
    loop {
        let running = draining_since.is_none();
        let mut progressed = 0;
        for p in pairs.iter_mut() {
            progressed += p.poll_a(&sh, &mut wcs)?;
            progressed += p.poll_b(&mut sh, &mut wcs, true)?;
            let oldest = p.retire();
            if oldest > STUCK {
                p.fail(format!("an operation has not finished after {oldest:?}"));
            }
            if p.stats.errors() > 0 && !failed {
                failed = true;
                eprintln!("soak: stopping after the first error");
            }
            if failed {
                p.abandon_sent();
            }
            if running && !failed {
                p.start_idle(&mut sh);
            }
        }
        let now = Instant::now();
        if now >= next_report {
            eprintln!("{}", progress(started, &pairs));
            next_report += report_every;
        }
        if rss_warm.is_none() && now.duration_since(started) >= warmup {
            rss_warm = Some(rss_kib());
            eprintln!("soak: warm-up over, RSS {} KiB", rss_warm.unwrap_or(0));
        }
        match draining_since {
            None if failed || now.duration_since(started) >= duration => {
                draining_since = Some(now);
            }
            Some(since) => {
                if !pairs.iter().any(Pair::busy) {
                    break;
                }
                if now.duration_since(since) > STUCK {
                    eprintln!("soak: the drain did not finish within {STUCK:?}");
                    failed = true;
                    break;
                }
            }
            None => {}
        }
        if progressed == 0 {
            // Nothing completed: give rxe's kernel threads the CPU for a moment.
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let traffic = started.elapsed();
    // Measured with every buffer of the run still allocated: what the steady state holds.
    let rss_final = rss_kib();
    eprintln!("{}", progress(started, &pairs));

    // B's posted receives complete only by being flushed: the error state does that.
    for p in pairs.iter_mut() {
        p.b_qp.to_error()?;
    }
    let flush_deadline = Instant::now() + Duration::from_secs(30);
    while pairs.iter().any(|p| p.rq.completions < p.rq.posts) && Instant::now() < flush_deadline {
        for p in pairs.iter_mut() {
            p.poll_b(&mut sh, &mut wcs, false)?;
            p.poll_a(&sh, &mut wcs)?;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut totals = Stats::default();
    let (mut posts, mut completions, mut unbalanced) = (0, 0, 0);
    for p in &pairs {
        totals.add(&p.stats);
        for (side, c) in [("A send", p.sq), ("B receive", p.rq)] {
            posts += c.posts;
            completions += c.completions;
            if c.posts != c.completions {
                unbalanced += 1;
                eprintln!("soak: pair {} {side} queue: {} posts, {} completions", p.index, c.posts, c.completions);
            }
        }
    }
    if failed && totals.errors() == 0 {
        totals.other_errors += 1;
    }
    drop(pairs);
    drop((pd, ctx));
    Ok(Outcome {
        totals,
        posts,
        completions,
        unbalanced,
        traffic,
        rss_warm: rss_warm.unwrap_or(rss_final),
        rss_final,
        rss_after_teardown: 0,
    })
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
