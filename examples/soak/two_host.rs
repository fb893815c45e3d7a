//! `soak`'s two-host mode: `soak --server` on one node holds every pair's target B,
//! `soak --client HOST` on the other holds every initiator A, each pair one RC QP a side,
//! connected across the link.
//!
//! The client opens a TCP connection to the server's `--port` and sends the run's shape
//! (a fixed 32-byte setup: pairs, lanes, seed, length, the QPs' timeout and retry count,
//! whether a failed link is accepted), then each pair is brought up by the library's
//! endpoint handshake (`rdma_verbs::Handshake`) over that connection, B advertising its
//! region. The lanes, sizes and CRC-32 checks are the single-host mode's, with two
//! differences that come from the two sides being two processes:
//!
//! - B tells A that it checked a SEND or WRITE by an RDMA SEND back on the same QP pair:
//!   16 bytes (lane, verdict, length, kind). A's lane starts its next operation only after
//!   that ack, so B never runs out of receives and never checks a slot A has overwritten.
//!   B keeps twice as many acks' buffers as lanes, and holds an ack back while none is free.
//! - A READ reads a random span of a 2 MiB read area after B's lane slots, which B filled at
//!   the start with bytes both sides derive from the seed; A keeps the same bytes and
//!   checks the CRC of what it read against theirs. A fills its buffer with fresh random
//!   bytes before each READ, so a READ that landed nothing fails the check.
//!
//! When the time is up (or a request failed), A drains its lanes and sends `DONE`; B
//! stops, lets its last acks complete, moves its QPs to error (flushing its receives),
//! tears down, checks its device counts and RSS, and answers with a fixed 84-byte report
//! (its posts, completions and errors). A then moves its QPs to error (flushing its ack
//! receives), tears down and prints the summary of both sides. Nothing a peer sends is
//! trusted: every message has a fixed size, a magic and checked fields.
//!
//! With `--accept-link-failure` (the network-fault cases of `scripts/netfaults`) a run
//! whose QPs failed passes when they failed cleanly: every request posted completed
//! exactly once, no byte was wrong, nothing hung, and the first failed completion came
//! within the QP's retry bound, (retry_cnt + 1) x 4.096 us x 2^timeout, of the last good
//! completion of its QP (plus [`DETECT_SLACK`] for the emulated guests' scheduling). rxe retries forever
//! when retry_cnt is 7 (its completer does not count down from 7); the library's default is 6.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, Done, Handshake, MemoryRegion, ProtectionDomain,
    QpAccess, QpType, QueuePair, RecvQueue, Refused, RemoteMr, RemoteWritable, RtsAttr, SendQueue, SendWr, WcOpcode,
    WcStatus, WorkCompletion,
};

use super::{
    abandon_sent, busy, check_shape, counts_text, device_name, mib, resource_counts, retire, rss_kib, seed_of,
    AnyError, Counts, Crc32, Flight, Kind, Lane, Opts, Rng, Stats, CRC_BITS, SLOT, STUCK,
};

/// The span of B's region that READs read, after the lanes' slots.
const READ_AREA: usize = 2 * SLOT;
/// An ack: lane, verdict, length, kind (u32 each, little-endian).
const ACK_LEN: usize = 16;
/// The buffer of an ack (and of A's ack receives).
const ACK_BUF: usize = 64;
/// Most pairs a server accepts.
const MAX_QPS: u32 = 1024;
/// What the first failure may take beyond the QP's retry bound: the guests' timers tick
/// in 4 ms jiffies and an emulated CPU schedules late.
const DETECT_SLACK: Duration = Duration::from_millis(1000);
/// How long the server waits for the client's next step before it gives up.
const PEER_SILENCE: Duration = Duration::from_secs(60);

// ---- messages on the TCP connection ---------------------------------------------------------

const SETUP_MAGIC: &[u8; 4] = b"SOAK";
const REPORT_MAGIC: &[u8; 4] = b"SREP";
const DONE: &[u8; 4] = b"DONE";
const VERSION: u32 = 1;
const SETUP_LEN: usize = 32;
const REPORT_FIELDS: usize = 10;
const REPORT_LEN: usize = 4 + 8 * REPORT_FIELDS;

/// The run's shape, sent by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Setup {
    qps: u32,
    depth: u32,
    seed: u64,
    duration_ms: u64,
    qp_timeout: u8,
    retry_cnt: u8,
    accept_link_failure: bool,
}

impl Setup {
    fn encode(&self) -> [u8; SETUP_LEN] {
        let mut b = [0u8; SETUP_LEN];
        b[..4].copy_from_slice(SETUP_MAGIC);
        b[4..8].copy_from_slice(&VERSION.to_le_bytes());
        b[8..12].copy_from_slice(&self.qps.to_le_bytes());
        b[12..16].copy_from_slice(&self.depth.to_le_bytes());
        b[16..24].copy_from_slice(&self.seed.to_le_bytes());
        b[24..28].copy_from_slice(&(self.duration_ms.min(u64::from(u32::MAX)) as u32).to_le_bytes());
        b[28] = self.qp_timeout;
        b[29] = self.retry_cnt;
        b[30] = u8::from(self.accept_link_failure);
        b
    }

    fn decode(b: &[u8; SETUP_LEN]) -> Result<Setup, String> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if &b[..4] != SETUP_MAGIC {
            return Err("the client's first bytes are not a soak setup (is it a soak --client?)".into());
        }
        if u32_at(4) != VERSION {
            return Err(format!("the client speaks setup version {}, this server {VERSION}", u32_at(4)));
        }
        let mut seed = [0u8; 8];
        seed.copy_from_slice(&b[16..24]);
        let s = Setup {
            qps: u32_at(8),
            depth: u32_at(12),
            seed: u64::from_le_bytes(seed),
            duration_ms: u64::from(u32_at(24)),
            qp_timeout: b[28],
            retry_cnt: b[29],
            accept_link_failure: b[30] == 1,
        };
        if s.qps == 0 || s.qps > MAX_QPS {
            return Err(format!("the client asks for {} pairs: 1 to {MAX_QPS}", s.qps));
        }
        if s.depth == 0 || s.depth > super::MAX_DEPTH {
            return Err(format!("the client asks for {} lanes: 1 to {}", s.depth, super::MAX_DEPTH));
        }
        if s.qp_timeout > 31 || s.retry_cnt > 7 || b[30] > 1 || b[31] != 0 || s.duration_ms == 0 {
            return Err(format!("the client's setup has a field out of range: {s:?}"));
        }
        Ok(s)
    }
}

/// What the server tells the client at the end.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Report {
    ops: u64,
    bytes: u64,
    posts: u64,
    completions: u64,
    unbalanced: u64,
    checksum_errors: u64,
    wc_errors: u64,
    other_errors: u64,
    flushed: u64,
    /// Checks of the server's own that failed: device counts, RSS, the client vanishing.
    failed_checks: u64,
}

impl Report {
    fn fields(&self) -> [u64; REPORT_FIELDS] {
        [
            self.ops,
            self.bytes,
            self.posts,
            self.completions,
            self.unbalanced,
            self.checksum_errors,
            self.wc_errors,
            self.other_errors,
            self.flushed,
            self.failed_checks,
        ]
    }

    fn encode(&self) -> [u8; REPORT_LEN] {
        let mut b = [0u8; REPORT_LEN];
        b[..4].copy_from_slice(REPORT_MAGIC);
        for (i, v) in self.fields().iter().enumerate() {
            b[4 + 8 * i..12 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    fn decode(b: &[u8; REPORT_LEN]) -> Result<Report, String> {
        if &b[..4] != REPORT_MAGIC {
            return Err("the server's answer to DONE is not a soak report".into());
        }
        let f = |i: usize| {
            let mut v = [0u8; 8];
            v.copy_from_slice(&b[4 + 8 * i..12 + 8 * i]);
            u64::from_le_bytes(v)
        };
        Ok(Report {
            ops: f(0),
            bytes: f(1),
            posts: f(2),
            completions: f(3),
            unbalanced: f(4),
            checksum_errors: f(5),
            wc_errors: f(6),
            other_errors: f(7),
            flushed: f(8),
            failed_checks: f(9),
        })
    }
}

/// B's verdict on a SEND or WRITE, sent back to A.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ack {
    lane: u32,
    /// 0 intact, 1 checksum mismatch, 2 not what a lane sends (no immediate, bad lane, size).
    verdict: u32,
    len: u32,
    kind: Kind,
}

const INTACT: u32 = 0;
const MISMATCH: u32 = 1;
const MALFORMED: u32 = 2;

impl Ack {
    fn encode(&self) -> [u8; ACK_LEN] {
        let mut b = [0u8; ACK_LEN];
        b[0..4].copy_from_slice(&self.lane.to_le_bytes());
        b[4..8].copy_from_slice(&self.verdict.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..16].copy_from_slice(&(self.kind as u32).to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<Ack, String> {
        if b.len() != ACK_LEN {
            return Err(format!("an ack of {} bytes, not {ACK_LEN}", b.len()));
        }
        let u = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let kind = match u(12) {
            0 => Kind::Send,
            1 => Kind::Write,
            k => return Err(format!("an ack for operation kind {k}")),
        };
        Ok(Ack { lane: u(0), verdict: u(4), len: u(8), kind })
    }
}

fn read_area(seed: u64) -> Vec<u8> {
    let mut area = vec![0u8; READ_AREA];
    Rng::seeded(seed ^ 0x5EAD_A2EA_0000_0001).fill(&mut area);
    area
}

fn rts(qp_timeout: u8, retry_cnt: u8) -> RtsAttr {
    RtsAttr { timeout: qp_timeout, retry_cnt, ..RtsAttr::default() }
}

/// The spec's bound on how long a request goes unanswered before it fails:
/// (retry_cnt + 1) tries of 4.096 us x 2^timeout each; none when timeout is 0.
fn retry_bound(qp_timeout: u8, retry_cnt: u8) -> Option<Duration> {
    (qp_timeout > 0).then(|| Duration::from_nanos(4096 * (1u64 << qp_timeout) * (u64::from(retry_cnt) + 1)))
}

fn handshake<'a>(o: &Opts, qp: &'a QueuePair, setup: &Setup) -> Handshake<'a> {
    let hs = Handshake::new(qp).port(o.ib_port).rts(rts(setup.qp_timeout, setup.retry_cnt));
    match o.gid_index {
        Some(i) => hs.gid_index(i),
        None => hs,
    }
}

// ---- the client: every pair's A ------------------------------------------------------------

/// The first failed completion the client saw, and how long it came after the last good
/// completion of its QP.
struct FirstError {
    status: WcStatus,
    silence: Duration,
}

/// What the client's failed completions tell about the link.
struct Watch {
    first_error: Option<FirstError>,
    /// Failed completions by status, in the order first seen.
    by_status: Vec<(WcStatus, u64)>,
}

impl Watch {
    /// A failed completion on a QP whose last good one came `silence` ago.
    fn failed(&mut self, status: WcStatus, silence: Duration) {
        if self.first_error.is_none() {
            self.first_error = Some(FirstError { status, silence });
        }
        match self.by_status.iter_mut().find(|(s, _)| *s == status) {
            Some((_, n)) => *n += 1,
            None => self.by_status.push((status, 1)),
        }
    }
}

struct ClientPair {
    index: usize,
    rng: Rng,
    cq: CompletionQueue,
    sq: SendQueue<Chunk>,
    ack_cq: CompletionQueue,
    ack_rq: RecvQueue<Chunk>,
    /// B's region: the lanes' slots, then the read area.
    remote: RemoteMr,
    lanes: Vec<Lane>,
    sends: Counts,
    acks: Counts,
    stats: Stats,
    done: Vec<Done<Chunk>>,
    /// After the run's first error: lanes whose buffer came back were given up, and a
    /// late ack for one of them is no error.
    stopping: bool,
    /// An operation of this pair has been reported hung.
    hung: bool,
    /// The last good completion of this QP (or the start of the traffic).
    last_ok: Instant,
    qp: QueuePair,
}

struct ClientShared {
    crc: Crc32,
    ops: Vec<Kind>,
    read_area: Vec<u8>,
    max_size: usize,
    depth: usize,
}

impl ClientPair {
    fn new(
        o: &Opts,
        pd: &ProtectionDomain,
        setup: &Setup,
        index: usize,
        stream: &mut TcpStream,
    ) -> Result<Self, AnyError> {
        let depth = setup.depth;
        let ctx = pd.context();
        let cq = CompletionQueue::new(ctx, depth + 1)?;
        let ack_cq = CompletionQueue::new(ctx, depth + 1)?;
        for c in [&cq, &ack_cq] {
            if c.cqe() < depth + 1 {
                return Err(format!("a CQ of {} entries, asked for {}", c.cqe(), depth + 1).into());
            }
        }
        let qp = QueuePair::builder(pd, QpType::Rc, &cq, &ack_cq).max_send_wr(depth).max_recv_wr(depth).build()?;
        let hs = handshake(o, &qp, setup);
        hs.init()?;
        let mut ack_rq = qp.recv_queue()?;
        let ack_bufs = pd.register(AlignedBuf::new(depth as usize * ACK_BUF)?, AccessFlags::LOCAL_WRITE)?;
        let mut acks = Counts::default();
        for (i, c) in ack_bufs.into_chunks(ACK_BUF)?.into_iter().enumerate() {
            ack_rq.post(c, 0..ACK_BUF, i as u64).map_err(|r| r.error)?;
            acks.posts += 1;
        }
        let conn = hs.connect(stream).map_err(|e| format!("pair {index}: connecting its QPs across: {e}"))?;
        let remote = conn.remote.mr.ok_or_else(|| format!("pair {index}: the server advertised no region"))?;
        let need = depth as usize * SLOT + READ_AREA;
        if remote.len < need as u64 {
            return Err(
                format!("pair {index}: the server's region has {} bytes, the lanes need {need}", remote.len).into()
            );
        }
        let chunks =
            pd.register(AlignedBuf::new(depth as usize * SLOT)?, AccessFlags::LOCAL_WRITE)?.into_chunks(SLOT)?;
        Ok(ClientPair {
            index,
            rng: Rng::seeded(setup.seed ^ (index as u64).wrapping_mul(0xA076_1D64_78BD_642F)),
            sq: qp.send_queue()?,
            cq,
            ack_cq,
            ack_rq,
            remote,
            lanes: chunks.into_iter().map(|c| Lane { chunk: Some(c), flight: None }).collect(),
            sends: Counts::default(),
            acks,
            stats: Stats::default(),
            done: Vec::with_capacity(4),
            stopping: false,
            hung: false,
            last_ok: Instant::now(),
            qp,
        })
    }

    fn fail(&mut self, what: String) {
        eprintln!("soak: pair {}: {what}", self.index);
        self.stats.other_errors += 1;
    }

    /// Starts an operation on every idle lane.
    fn start_idle(&mut self, sh: &ClientShared) {
        for lane in 0..self.lanes.len() {
            if self.lanes[lane].flight.is_some() {
                continue;
            }
            let Some(mut chunk) = self.lanes[lane].chunk.take() else {
                self.fail(format!("lane {lane} is idle without its buffer"));
                continue;
            };
            let kind = sh.ops[self.rng.below(sh.ops.len() as u64) as usize];
            let len = self.rng.size(sh.max_size);
            // Bytes A sends, or (READ) bytes that must be overwritten by what it reads.
            self.rng.fill(&mut chunk[..len]);
            let (start, crc) = match kind {
                Kind::Send | Kind::Write => (lane * SLOT, sh.crc.sum(&chunk[..len])),
                Kind::Read => {
                    let off = self.rng.below((READ_AREA - len + 1) as u64) as usize;
                    (sh.depth * SLOT + off, sh.crc.sum(&sh.read_area[off..off + len]))
                }
            };
            let target = match self.remote.slice(start as u64..(start + len) as u64) {
                Ok(t) => t,
                Err(e) => {
                    self.lanes[lane].chunk = Some(chunk);
                    self.fail(format!("lane {lane}: {e}"));
                    continue;
                }
            };
            let imm = (lane as u32) << 28 | (crc & CRC_BITS);
            let wr = match kind {
                Kind::Send => SendWr::send(chunk, 0..len).imm(imm),
                Kind::Write => SendWr::write(chunk, 0..len, target).imm(imm),
                Kind::Read => SendWr::read(chunk, 0..len, target),
            };
            match self.sq.post(wr.id(lane as u64)) {
                Ok(()) => {
                    self.sends.posts += 1;
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
    fn poll_sends(&mut self, sh: &ClientShared, wcs: &mut [WorkCompletion], w: &mut Watch) -> Result<usize, AnyError> {
        let n = self.cq.poll(wcs)?.len();
        for wc in &mut wcs[..n] {
            let mut done = std::mem::take(&mut self.done);
            if let Err(e) = self.sq.complete(wc, |d| done.push(d)) {
                self.done = done;
                self.fail(format!("a completion A's send queue refused: {e}"));
                continue;
            }
            for d in done.drain(..) {
                self.sends.completions += 1;
                let lane = d.id as usize;
                let Some(f) = self.lanes.get_mut(lane).and_then(|l| l.flight.as_mut()) else {
                    self.stats.other_errors += 1;
                    eprintln!("soak: pair {}: a send completion for idle lane {lane}", self.index);
                    continue;
                };
                f.sent = true;
                if d.status != WcStatus::Success {
                    self.stats.wc_errors += 1;
                    w.failed(d.status, self.last_ok.elapsed());
                    eprintln!("soak: pair {} lane {lane}: {:?} of {} bytes: {:?}", self.index, f.kind, f.len, d.status);
                } else {
                    self.last_ok = Instant::now();
                    if f.kind == Kind::Read {
                        f.checked = true;
                        if sh.crc.sum(&d.buf[..f.len]) != f.crc {
                            self.stats.checksum_errors += 1;
                            eprintln!(
                                "soak: pair {} lane {lane}: READ of {} bytes: checksum mismatch",
                                self.index, f.len
                            );
                        }
                    }
                }
                self.lanes[lane].chunk = Some(d.buf);
            }
            self.done = done;
        }
        Ok(n)
    }

    /// Takes B's acks: the SEND or WRITE they name was checked. `running` false: after
    /// A's QP was moved to error, when the receives left are flushed.
    fn poll_acks(&mut self, wcs: &mut [WorkCompletion], w: &mut Watch, running: bool) -> Result<usize, AnyError> {
        let n = self.ack_cq.poll(wcs)?.len();
        for wc in &mut wcs[..n] {
            let d = match self.ack_rq.complete(wc) {
                Ok(d) => d,
                Err(e) => {
                    self.fail(format!("a completion A's ack queue refused: {e}"));
                    continue;
                }
            };
            self.acks.completions += 1;
            if !running && d.status == WcStatus::WrFlushErr {
                self.stats.flushed += 1;
                continue;
            }
            if d.status != WcStatus::Success {
                self.stats.wc_errors += 1;
                w.failed(d.status, self.last_ok.elapsed());
                continue;
            }
            self.last_ok = Instant::now();
            self.take_ack(&d.buf[..(d.byte_len as usize).min(ACK_BUF)]);
            match self.ack_rq.post(d.buf, 0..ACK_BUF, d.id) {
                Ok(()) => self.acks.posts += 1,
                Err(Refused { error: e, .. }) => self.fail(format!("reposting an ack receive: {e}")),
            }
        }
        Ok(n)
    }

    fn take_ack(&mut self, bytes: &[u8]) {
        let ack = match Ack::decode(bytes) {
            Ok(a) => a,
            Err(e) => return self.fail(e),
        };
        let lane = ack.lane as usize;
        let Some(f) = self.lanes.get_mut(lane).and_then(|l| l.flight.as_mut()) else {
            if self.stopping && lane < self.lanes.len() {
                // A lane given up after the first error: its ack was still on the way.
                self.stats.flushed += 1;
                return;
            }
            return self.fail(format!("an ack for lane {lane}, which has nothing in flight"));
        };
        if f.kind != ack.kind || f.len != ack.len as usize || f.checked {
            let what = format!(
                "lane {lane}: B acked a {:?} of {} bytes; A posted {:?} of {}",
                ack.kind, ack.len, f.kind, f.len
            );
            return self.fail(what);
        }
        f.checked = true;
        match ack.verdict {
            INTACT => {}
            MISMATCH => {
                self.stats.checksum_errors += 1;
                eprintln!(
                    "soak: pair {} lane {lane}: B found a checksum mismatch in a {:?} of {} bytes",
                    self.index, f.kind, f.len
                );
            }
            v => self.fail(format!("lane {lane}: B could not make sense of the {:?} (verdict {v})", ack.kind)),
        }
    }
}

/// The client's side: connects, drives, drains, and prints the summary of both sides.
pub(super) fn client(o: &Opts, host: &str) -> Result<bool, AnyError> {
    check_shape(o)?;
    if o.qps > MAX_QPS {
        return Err(format!("--qps {}: at most {MAX_QPS} in the two-host mode", o.qps).into());
    }
    let device = device_name(o)?;
    let seed = seed_of(o);
    let duration = Duration::from_secs_f64(o.minutes * 60.0);
    let setup = Setup {
        qps: o.qps,
        depth: o.depth,
        seed,
        duration_ms: (duration.as_millis() as u64).max(1),
        qp_timeout: o.qp_timeout,
        retry_cnt: o.retry_cnt,
        accept_link_failure: o.accept_link_failure,
    };
    let bound = retry_bound(o.qp_timeout, o.retry_cnt);
    eprintln!(
        "soak: two hosts, client of {host}:{}: device {device}, {} pairs x {} lanes, {:?}, sizes 1..={} B, \
         {:.2} min, seed {seed}, QP timeout {} retry_cnt {} (retry bound {})",
        o.port,
        o.qps,
        o.depth,
        o.ops,
        o.max_size,
        o.minutes,
        o.qp_timeout,
        o.retry_cnt,
        bound.map_or("none".to_owned(), |b| format!("{:.3} s", b.as_secs_f64()))
    );
    let before = resource_counts(&device)?;
    let mut stream = dial(host, o.port)?;
    stream.set_read_timeout(Some(PEER_SILENCE))?;
    stream.write_all(&setup.encode())?;
    let out = drive_client(o, &device, &setup, &mut stream, duration)?;
    let after = resource_counts(&device)?;

    let t = &out.totals;
    let peer = out.report.as_ref().ok();
    let rss_grew = out.rss_final.saturating_sub(out.rss_warm);
    let mut failures = Vec::new();
    let checksum_errors = t.checksum_errors + peer.map_or(0, |r| r.checksum_errors);
    if checksum_errors > 0 {
        failures.push(format!("{checksum_errors} checksum errors"));
    }
    let other_errors = t.other_errors + peer.map_or(0, |r| r.other_errors);
    if other_errors > 0 {
        failures.push(format!("{other_errors} errors that are not failed completions (see above)"));
    }
    let unbalanced = out.unbalanced + peer.map_or(0, |r| r.unbalanced);
    if unbalanced > 0 {
        failures.push(format!("{unbalanced} queues whose posts and completions differ"));
    }
    if before != after {
        failures.push(format!("device resources {} before, {} after", counts_text(&before), counts_text(&after)));
    }
    if rss_grew > o.rss_slack_kib {
        failures.push(format!("RSS grew {rss_grew} KiB after the warm-up (bound {} KiB)", o.rss_slack_kib));
    }
    if let Some(r) = peer.filter(|r| r.failed_checks > 0) {
        failures.push(format!("{} of the server's own checks failed (see its output)", r.failed_checks));
    }
    let wc_errors = t.wc_errors + peer.map_or(0, |r| r.wc_errors);
    let outcome = if wc_errors == 0 && out.report.is_ok() { "intact" } else { "failed" };
    if outcome == "failed" {
        if !o.accept_link_failure {
            match &out.report {
                Ok(_) => failures.push(format!("{wc_errors} failed completions")),
                Err(e) => failures.push(format!("no report from the server: {e}")),
            }
        } else if let Some(first) = &out.first_error {
            match bound {
                Some(b) if first.silence > b + DETECT_SLACK => failures.push(format!(
                    "the first failure came {:.3} s after the last good completion, beyond the retry bound {:.3} s \
                     (+{:.1} s slack)",
                    first.silence.as_secs_f64(),
                    b.as_secs_f64(),
                    DETECT_SLACK.as_secs_f64()
                )),
                _ => {}
            }
        } else if t.wc_errors == 0 && out.report.is_err() {
            failures.push("the server vanished, yet none of this side's requests failed".to_owned());
        }
    }
    let ops: u64 = t.ops.iter().sum();
    let secs = out.traffic.as_secs_f64();
    let detect = out.first_error.as_ref().map_or("-".to_owned(), |f| format!("{:.3}", f.silence.as_secs_f64()));
    let first = out.first_error.as_ref().map_or("-".to_owned(), |f| format!("{:?}", f.status));
    let by_status = out.by_status.iter().map(|(s, n)| format!("{s:?}:{n}")).collect::<Vec<_>>().join(",");
    let peer_text = match &out.report {
        Ok(r) => format!(
            "server: ops={} bytes={:.1}MiB posts={} completions={} checksum_errors={} wc_errors={} other_errors={} \
             flushed={}",
            r.ops,
            mib(r.bytes),
            r.posts,
            r.completions,
            r.checksum_errors,
            r.wc_errors,
            r.other_errors,
            r.flushed
        ),
        Err(e) => format!("server: no report ({e})"),
    };
    println!(
        "soak: {} two-host outcome={outcome} minutes={:.2} pairs={} depth={} seed={seed} ops={ops} (send {} write {} \
         read {}) bytes={:.1}MiB ({:.2} MiB/s, {:.0} ops/s) checksum_errors={} wc_errors={} other_errors={} posts={} \
         completions={} (flushed at the end {}) failed_completions={} first_error={first} detect_secs={detect} \
         retry_bound_secs={} qp_timeout={} retry_cnt={} rss_warm={}KiB rss_final={}KiB (+{rss_grew}, bound +{}) \
         resources_before={} resources_after={} {peer_text}",
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
        out.posts,
        out.completions,
        t.flushed,
        if by_status.is_empty() { "0".to_owned() } else { by_status },
        bound.map_or("none".to_owned(), |b| format!("{:.3}", b.as_secs_f64())),
        o.qp_timeout,
        o.retry_cnt,
        out.rss_warm,
        out.rss_final,
        o.rss_slack_kib,
        counts_text(&before),
        counts_text(&after),
    );
    for f in &failures {
        eprintln!("soak: FAIL: {f}");
    }
    Ok(failures.is_empty())
}

struct ClientOutcome {
    totals: Stats,
    posts: u64,
    completions: u64,
    unbalanced: u64,
    traffic: Duration,
    rss_warm: u64,
    rss_final: u64,
    first_error: Option<FirstError>,
    by_status: Vec<(WcStatus, u64)>,
    report: Result<Report, String>,
}

fn drive_client(
    o: &Opts,
    device: &str,
    setup: &Setup,
    stream: &mut TcpStream,
    duration: Duration,
) -> Result<ClientOutcome, AnyError> {
    let ctx = Context::open(Some(device))?;
    let pd = ProtectionDomain::new(&ctx)?;
    let mut pairs = Vec::with_capacity(setup.qps as usize);
    for i in 0..setup.qps as usize {
        pairs.push(ClientPair::new(o, &pd, setup, i, stream)?);
    }
    let sh = ClientShared {
        crc: Crc32::new(),
        ops: o.ops.clone(),
        read_area: read_area(setup.seed),
        max_size: o.max_size,
        depth: setup.depth as usize,
    };
    let mut wcs: Vec<WorkCompletion> = (0..16).map(|_| WorkCompletion::EMPTY).collect();
    let warmup = Duration::from_secs(o.warmup_secs).min(duration / 2);
    let stuck = Duration::from_secs(o.stuck_secs);
    let started = Instant::now();
    let mut w = Watch { first_error: None, by_status: Vec::new() };
    pairs.iter_mut().for_each(|p| p.last_ok = started);
    let report_every = Duration::from_secs(o.report_secs.max(1));
    let mut next_report = started + report_every;
    let mut rss_warm = None;
    let mut failed = false;
    let mut draining_since: Option<Instant> = None;
    loop {
        let running = draining_since.is_none();
        let mut progressed = 0;
        for p in pairs.iter_mut() {
            progressed += p.poll_sends(&sh, &mut wcs, &mut w)?;
            progressed += p.poll_acks(&mut wcs, &mut w, true)?;
            let oldest = retire(&mut p.lanes, &mut p.stats);
            if oldest > stuck && !p.hung {
                p.hung = true;
                p.fail(format!("hung: an operation has not finished after {:.1} s", oldest.as_secs_f64()));
            }
            if p.stats.errors() > 0 && !failed {
                failed = true;
                eprintln!("soak: stopping after the first error");
            }
            if failed {
                p.stopping = true;
                abandon_sent(&mut p.lanes);
            }
            if running && !failed {
                p.start_idle(&sh);
            }
        }
        let now = Instant::now();
        if now >= next_report {
            eprintln!("{}", progress(started, &pairs));
            next_report += report_every;
        }
        if rss_warm.is_none() && now.duration_since(started) >= warmup {
            rss_warm = Some(rss_kib());
        }
        match draining_since {
            None if failed || now.duration_since(started) >= duration => draining_since = Some(now),
            Some(since) => {
                if !pairs.iter().any(|p| busy(&p.lanes)) {
                    break;
                }
                if now.duration_since(since) > stuck {
                    eprintln!("soak: hung: the drain did not finish within {stuck:?}");
                    pairs[0].stats.other_errors += 1;
                    break;
                }
            }
            None => {}
        }
        if progressed == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let traffic = started.elapsed();
    let rss_final = rss_kib();
    eprintln!("{}", progress(started, &pairs));

    // B stops and tears down while A's QPs are still up, so B's last acks complete.
    let report = stream.write_all(DONE).map_err(|e| format!("sending DONE: {e}")).and_then(|()| {
        let wait = if failed { Duration::from_secs(10) } else { PEER_SILENCE };
        stream.set_read_timeout(Some(wait)).map_err(|e| e.to_string())?;
        let mut b = [0u8; REPORT_LEN];
        stream.read_exact(&mut b).map_err(|e| format!("reading the server's report: {e}"))?;
        Report::decode(&b)
    });
    // A's posted ack receives complete only by being flushed.
    for p in pairs.iter_mut() {
        p.qp.to_error()?;
    }
    let flush_deadline = Instant::now() + Duration::from_secs(30);
    while pairs.iter().any(|p| p.acks.completions < p.acks.posts || p.sends.completions < p.sends.posts)
        && Instant::now() < flush_deadline
    {
        for p in pairs.iter_mut() {
            p.poll_acks(&mut wcs, &mut w, false)?;
            p.poll_sends(&sh, &mut wcs, &mut w)?;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut totals = Stats::default();
    let (mut posts, mut completions, mut unbalanced) = (0, 0, 0);
    for p in &pairs {
        totals.add(&p.stats);
        for (side, c) in [("A send", p.sends), ("A ack receive", p.acks)] {
            posts += c.posts;
            completions += c.completions;
            if c.posts != c.completions {
                unbalanced += 1;
                eprintln!("soak: pair {} {side} queue: {} posts, {} completions", p.index, c.posts, c.completions);
            }
        }
    }
    drop(pairs);
    drop((pd, ctx));
    Ok(ClientOutcome {
        totals,
        posts,
        completions,
        unbalanced,
        traffic,
        rss_warm: rss_warm.unwrap_or(rss_final),
        rss_final,
        first_error: w.first_error,
        by_status: w.by_status,
        report,
    })
}

fn progress(started: Instant, pairs: &[ClientPair]) -> String {
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

/// The client's end of the TCP connection. A refused connection is retried for 30 s:
/// the server may still be starting.
fn dial(host: &str, port: u16) -> Result<TcpStream, AnyError> {
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .find(|a| a.is_ipv4())
        .ok_or_else(|| format!("{host}: no IPv4 address"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) if Instant::now() < deadline => {
                log_retry(&e);
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(format!("connecting to {addr}: {e}").into()),
        }
    }
}

fn log_retry(e: &std::io::Error) {
    if e.kind() != ErrorKind::ConnectionRefused {
        eprintln!("soak: connecting: {e}; trying again");
    }
}

// ---- the server: every pair's B ------------------------------------------------------------

struct ServerPair {
    index: usize,
    rcq: CompletionQueue,
    rq: RecvQueue<Chunk>,
    ack_cq: CompletionQueue,
    ack_sq: SendQueue<Chunk>,
    region: MemoryRegion<AlignedBuf, RemoteWritable>,
    free_acks: Vec<Chunk>,
    pending: VecDeque<Ack>,
    recvs: Counts,
    acks: Counts,
    stats: Stats,
    done: Vec<Done<Chunk>>,
    qp: QueuePair,
}

impl ServerPair {
    fn new(
        o: &Opts,
        pd: &ProtectionDomain,
        setup: &Setup,
        index: usize,
        area: &[u8],
        stream: &mut TcpStream,
    ) -> Result<Self, AnyError> {
        let depth = setup.depth;
        let ctx = pd.context();
        let rcq = CompletionQueue::new(ctx, depth + 1)?;
        let ack_cq = CompletionQueue::new(ctx, 2 * depth + 1)?;
        if rcq.cqe() < depth + 1 || ack_cq.cqe() < 2 * depth + 1 {
            return Err(format!(
                "CQs of {} and {} entries, asked for {} and {}",
                rcq.cqe(),
                ack_cq.cqe(),
                depth + 1,
                2 * depth + 1
            )
            .into());
        }
        let qp = QueuePair::builder(pd, QpType::Rc, &ack_cq, &rcq).max_send_wr(2 * depth).max_recv_wr(depth).build()?;
        let lanes_len = depth as usize * SLOT;
        let region_access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let mut region = pd.register_remote_writable(AlignedBuf::new(lanes_len + READ_AREA)?, region_access)?;
        region.write_at(lanes_len, area)?;
        let hs =
            handshake(o, &qp, setup).access(QpAccess::REMOTE_WRITE | QpAccess::REMOTE_READ).advertise(region.remote()?);
        hs.init()?;
        // Receives first: A may send as soon as the handshake returns.
        let mut rq = qp.recv_queue()?;
        let mut recvs = Counts::default();
        let bufs = pd.register(AlignedBuf::new(lanes_len)?, AccessFlags::LOCAL_WRITE)?.into_chunks(SLOT)?;
        for (i, c) in bufs.into_iter().enumerate() {
            rq.post(c, 0..SLOT, i as u64).map_err(|r| r.error)?;
            recvs.posts += 1;
        }
        hs.connect(stream).map_err(|e| format!("pair {index}: connecting its QPs across: {e}"))?;
        let free_acks = pd
            .register(AlignedBuf::new(2 * depth as usize * ACK_BUF)?, AccessFlags::LOCAL_WRITE)?
            .into_chunks(ACK_BUF)?;
        Ok(ServerPair {
            index,
            ack_sq: qp.send_queue()?,
            rcq,
            rq,
            ack_cq,
            region,
            free_acks,
            pending: VecDeque::new(),
            recvs,
            acks: Counts::default(),
            stats: Stats::default(),
            done: Vec::with_capacity(4),
            qp,
        })
    }

    fn fail(&mut self, what: String) {
        eprintln!("soak: pair {}: {what}", self.index);
        self.stats.other_errors += 1;
    }

    /// Takes B's receive completions: checks the SEND or WRITE, reposts the receive, acks.
    fn poll_recvs(
        &mut self,
        sh: &mut ServerShared,
        wcs: &mut [WorkCompletion],
        running: bool,
    ) -> Result<usize, AnyError> {
        let n = self.rcq.poll(wcs)?.len();
        for wc in &mut wcs[..n] {
            let (opcode, imm) = (wc.opcode(), wc.imm_data());
            let d = match self.rq.complete(wc) {
                Ok(d) => d,
                Err(e) => {
                    self.fail(format!("a completion B's receive queue refused: {e}"));
                    continue;
                }
            };
            self.recvs.completions += 1;
            if !running && d.status == WcStatus::WrFlushErr {
                self.stats.flushed += 1;
                continue;
            }
            if d.status != WcStatus::Success {
                self.stats.wc_errors += 1;
                eprintln!("soak: pair {}: receive completed with {:?}", self.index, d.status);
                continue;
            }
            let ack = self.check(sh, opcode, imm, &d.buf, d.byte_len);
            match self.rq.post(d.buf, 0..SLOT, d.id) {
                Ok(()) => self.recvs.posts += 1,
                Err(Refused { error: e, .. }) => self.fail(format!("reposting a receive: {e}")),
            }
            self.pending.push_back(ack);
        }
        self.send_acks();
        Ok(n)
    }

    /// B's check of a SEND (bytes in `buf`) or a WRITE (bytes in the lane's slot).
    fn check(&mut self, sh: &mut ServerShared, opcode: WcOpcode, imm: Option<u32>, buf: &Chunk, byte_len: u32) -> Ack {
        let len = byte_len as usize;
        let kind = if opcode == WcOpcode::RecvRdmaWithImm { Kind::Write } else { Kind::Send };
        let lane = imm.map_or(u32::MAX, |i| i >> 28);
        let mut ack = Ack { lane, verdict: MALFORMED, len: byte_len, kind };
        let Some(imm) = imm.filter(|_| lane < sh.depth && len <= SLOT) else {
            self.fail(format!("a {opcode:?} of {len} bytes without a lane's immediate data"));
            return ack;
        };
        if opcode != WcOpcode::Recv && opcode != WcOpcode::RecvRdmaWithImm {
            self.fail(format!("an unexpected receive opcode {opcode:?}"));
            return ack;
        }
        let data = if kind == Kind::Send {
            &buf[..len]
        } else {
            if let Err(e) = self.region.read_at(lane as usize * SLOT, &mut sh.scratch[..len]) {
                self.fail(format!("lane {lane}: reading the WRITE's slot: {e}"));
                return ack;
            }
            &sh.scratch[..len]
        };
        if sh.crc.sum(data) & CRC_BITS == imm & CRC_BITS {
            ack.verdict = INTACT;
            self.stats.ops[kind as usize] += 1;
            self.stats.bytes += len as u64;
        } else {
            ack.verdict = MISMATCH;
            self.stats.checksum_errors += 1;
            eprintln!("soak: pair {} lane {lane}: {kind:?} of {len} bytes: checksum mismatch", self.index);
        }
        ack
    }

    /// Posts the waiting acks while ack buffers are free.
    fn send_acks(&mut self) {
        while !self.pending.is_empty() {
            let Some(mut chunk) = self.free_acks.pop() else { return };
            let Some(ack) = self.pending.pop_front() else { return };
            chunk[..ACK_LEN].copy_from_slice(&ack.encode());
            match self.ack_sq.post(SendWr::send(chunk, 0..ACK_LEN)) {
                Ok(()) => self.acks.posts += 1,
                Err(Refused { error: e, value: wr }) => {
                    self.free_acks.push(wr.into_buf());
                    self.fail(format!("posting an ack: {e}"));
                }
            }
        }
    }

    fn poll_acks(&mut self, wcs: &mut [WorkCompletion], running: bool) -> Result<usize, AnyError> {
        let n = self.ack_cq.poll(wcs)?.len();
        for wc in &mut wcs[..n] {
            let mut done = std::mem::take(&mut self.done);
            if let Err(e) = self.ack_sq.complete(wc, |d| done.push(d)) {
                self.done = done;
                self.fail(format!("a completion B's ack queue refused: {e}"));
                continue;
            }
            for d in done.drain(..) {
                self.acks.completions += 1;
                if !running && d.status == WcStatus::WrFlushErr {
                    self.stats.flushed += 1;
                } else if d.status != WcStatus::Success {
                    self.stats.wc_errors += 1;
                    eprintln!("soak: pair {}: an ack completed with {:?}", self.index, d.status);
                }
                self.free_acks.push(d.buf);
            }
            self.done = done;
        }
        self.send_acks();
        Ok(n)
    }
}

struct ServerShared {
    crc: Crc32,
    scratch: Vec<u8>,
    depth: u32,
}

/// The server's side: takes one client, serves its run, reports, prints its own summary.
pub(super) fn serve(o: &Opts) -> Result<bool, AnyError> {
    let device = device_name(o)?;
    let listener =
        TcpListener::bind(("0.0.0.0", o.port)).map_err(|e| format!("listening on TCP port {} (-p): {e}", o.port))?;
    eprintln!("soak: two hosts, server on {device}: waiting for a client on TCP port {}", o.port);
    let (mut stream, peer) = listener.accept().map_err(|e| format!("accepting a client: {e}"))?;
    drop(listener);
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(PEER_SILENCE))?;
    let mut b = [0u8; SETUP_LEN];
    stream.read_exact(&mut b).map_err(|e| format!("reading the client's setup: {e}"))?;
    let setup = Setup::decode(&b)?;
    eprintln!(
        "soak: client {peer}: {} pairs x {} lanes, {:.2} min, seed {}, QP timeout {} retry_cnt {}",
        setup.qps,
        setup.depth,
        setup.duration_ms as f64 / 60_000.0,
        setup.seed,
        setup.qp_timeout,
        setup.retry_cnt
    );
    let before = resource_counts(&device)?;
    let (mut report, rss_warm, rss_final) = drive_server(o, &device, &setup, &mut stream)?;
    let after = resource_counts(&device)?;
    let rss_grew = rss_final.saturating_sub(rss_warm);
    let mut failures = Vec::new();
    if before != after {
        failures.push(format!("device resources {} before, {} after", counts_text(&before), counts_text(&after)));
    }
    if rss_grew > o.rss_slack_kib {
        failures.push(format!("RSS grew {rss_grew} KiB after the warm-up (bound {} KiB)", o.rss_slack_kib));
    }
    report.failed_checks += failures.len() as u64;
    let sent = stream.set_read_timeout(None).and_then(|()| stream.write_all(&report.encode()));
    if let Err(e) = &sent {
        eprintln!("soak: sending the report to the client: {e}");
    }
    let r = &report;
    if r.checksum_errors > 0 || r.other_errors > 0 || r.unbalanced > 0 {
        failures.push(format!(
            "{} checksum errors, {} other errors, {} unbalanced queues",
            r.checksum_errors, r.other_errors, r.unbalanced
        ));
    }
    if r.wc_errors > 0 && !setup.accept_link_failure {
        failures.push(format!("{} failed completions", r.wc_errors));
    }
    if r.failed_checks > failures.len() as u64 && !setup.accept_link_failure {
        failures.push("the client went away without DONE".to_owned());
    }
    println!(
        "soak: {} two-host server ops={} bytes={:.1}MiB posts={} completions={} checksum_errors={} wc_errors={} \
         other_errors={} flushed={} rss_warm={rss_warm}KiB rss_final={rss_final}KiB resources_before={} \
         resources_after={}",
        if failures.is_empty() { "PASS" } else { "FAIL" },
        r.ops,
        mib(r.bytes),
        r.posts,
        r.completions,
        r.checksum_errors,
        r.wc_errors,
        r.other_errors,
        r.flushed,
        counts_text(&before),
        counts_text(&after)
    );
    for f in &failures {
        eprintln!("soak: FAIL: {f}");
    }
    Ok(failures.is_empty())
}

/// Serves until the client's DONE; returns the report (but the server's own checks),
/// the warm and the final RSS. Everything it made is dropped when it returns.
fn drive_server(o: &Opts, device: &str, setup: &Setup, stream: &mut TcpStream) -> Result<(Report, u64, u64), AnyError> {
    let ctx = Context::open(Some(device))?;
    let pd = ProtectionDomain::new(&ctx)?;
    let area = read_area(setup.seed);
    let mut pairs = Vec::with_capacity(setup.qps as usize);
    for i in 0..setup.qps as usize {
        pairs.push(ServerPair::new(o, &pd, setup, i, &area, stream)?);
    }
    drop(area);
    let mut sh = ServerShared { crc: Crc32::new(), scratch: vec![0u8; SLOT], depth: setup.depth };
    let mut wcs: Vec<WorkCompletion> = (0..16).map(|_| WorkCompletion::EMPTY).collect();
    let duration = Duration::from_millis(setup.duration_ms);
    let warmup = Duration::from_secs(o.warmup_secs).min(duration / 2);
    // The client's run, its drain and its slowest failure, and some.
    let give_up = duration + 3 * Duration::from_secs(o.stuck_secs.max(STUCK.as_secs())) + PEER_SILENCE;
    stream.set_nonblocking(true)?;
    let started = Instant::now();
    let mut rss_warm = None;
    let mut word = [0u8; 4];
    let mut got = 0;
    let mut client_gone = None;
    let mut next_look = started;
    loop {
        let mut progressed = 0;
        for p in pairs.iter_mut() {
            progressed += p.poll_recvs(&mut sh, &mut wcs, true)?;
            progressed += p.poll_acks(&mut wcs, true)?;
        }
        let now = Instant::now();
        if rss_warm.is_none() && now.duration_since(started) >= warmup {
            rss_warm = Some(rss_kib());
        }
        if now >= next_look {
            next_look = now + Duration::from_millis(20);
            match stream.read(&mut word[got..]) {
                Ok(0) => client_gone = Some("the client closed the connection without DONE".to_owned()),
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => client_gone = Some(format!("the client's connection failed: {e}")),
            }
            if got == word.len() {
                if &word != DONE {
                    client_gone = Some(format!("the client sent {word:?}, not DONE"));
                }
                break;
            }
            if client_gone.is_some() {
                break;
            }
            if now.duration_since(started) > give_up {
                client_gone = Some(format!("no DONE from the client after {give_up:?}"));
                break;
            }
        }
        if progressed == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    stream.set_nonblocking(false)?;
    let rss_final = rss_kib();
    // The client's QPs are still up: B's last acks may complete, for 2 s.
    let ack_deadline = Instant::now() + Duration::from_secs(2);
    while pairs.iter().any(|p| p.acks.completions < p.acks.posts) && Instant::now() < ack_deadline {
        for p in pairs.iter_mut() {
            p.poll_recvs(&mut sh, &mut wcs, true)?;
            p.poll_acks(&mut wcs, true)?;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    for p in pairs.iter_mut() {
        p.qp.to_error()?;
    }
    let flush_deadline = Instant::now() + Duration::from_secs(30);
    while pairs.iter().any(|p| p.recvs.completions < p.recvs.posts || p.acks.completions < p.acks.posts)
        && Instant::now() < flush_deadline
    {
        for p in pairs.iter_mut() {
            p.poll_recvs(&mut sh, &mut wcs, false)?;
            p.poll_acks(&mut wcs, false)?;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut r = Report::default();
    let mut totals = Stats::default();
    for p in &pairs {
        totals.add(&p.stats);
        for (side, c) in [("B receive", p.recvs), ("B ack send", p.acks)] {
            r.posts += c.posts;
            r.completions += c.completions;
            if c.posts != c.completions {
                r.unbalanced += 1;
                eprintln!("soak: pair {} {side} queue: {} posts, {} completions", p.index, c.posts, c.completions);
            }
        }
    }
    r.ops = totals.ops.iter().sum();
    r.bytes = totals.bytes;
    r.checksum_errors = totals.checksum_errors;
    r.wc_errors = totals.wc_errors;
    r.other_errors = totals.other_errors;
    r.flushed = totals.flushed;
    if let Some(why) = client_gone {
        eprintln!("soak: {why}");
        r.failed_checks += 1;
    }
    drop(pairs);
    drop((pd, ctx));
    Ok((r, rss_warm.unwrap_or(rss_final), rss_final))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> Setup {
        Setup {
            qps: 8,
            depth: 4,
            seed: 0x0123_4567_89AB_CDEF,
            duration_ms: 25_000,
            qp_timeout: 12,
            retry_cnt: 2,
            accept_link_failure: true,
        }
    }

    #[test]
    fn setup_round_trips_and_refuses_what_a_server_cannot_serve() {
        let s = setup();
        assert_eq!(Setup::decode(&s.encode()), Ok(s));
        for bad in [
            Setup { qps: 0, ..s },
            Setup { qps: MAX_QPS + 1, ..s },
            Setup { depth: 0, ..s },
            Setup { depth: 17, ..s },
            Setup { qp_timeout: 32, ..s },
            Setup { retry_cnt: 8, ..s },
            Setup { duration_ms: 0, ..s },
        ] {
            assert!(Setup::decode(&bad.encode()).is_err(), "{bad:?}");
        }
        let mut b = s.encode();
        b[0] = b'X';
        assert!(Setup::decode(&b).unwrap_err().contains("not a soak setup"));
        let mut b = s.encode();
        b[4] = 2;
        assert!(Setup::decode(&b).unwrap_err().contains("version 2"));
    }

    #[test]
    fn report_and_ack_round_trip() {
        let r = Report {
            ops: 1,
            bytes: 2,
            posts: 3,
            completions: 4,
            unbalanced: 5,
            checksum_errors: 6,
            wc_errors: 7,
            other_errors: 8,
            flushed: 9,
            failed_checks: 10,
        };
        assert_eq!(Report::decode(&r.encode()), Ok(r));
        assert!(Report::decode(&[0u8; REPORT_LEN]).is_err());
        let a = Ack { lane: 3, verdict: MISMATCH, len: 4096, kind: Kind::Write };
        assert_eq!(Ack::decode(&a.encode()), Ok(a));
        assert!(Ack::decode(&a.encode()[..8]).is_err());
        let mut b = a.encode();
        b[12] = 2; // READ is never acked
        assert!(Ack::decode(&b).is_err());
    }

    #[test]
    fn retry_bound_is_tries_times_the_timeout() {
        // 4.096 us x 2^14 = 67.1 ms a try; 8 tries.
        let b = retry_bound(14, 7).unwrap();
        assert!((b.as_secs_f64() - 0.5369).abs() < 0.001, "{b:?}");
        assert_eq!(retry_bound(0, 3), None);
        assert_eq!(retry_bound(1, 0), Some(Duration::from_nanos(8192)));
    }

    #[test]
    fn both_sides_derive_the_same_read_area() {
        assert_eq!(read_area(7), read_area(7));
        assert_ne!(read_area(7)[..64], read_area(8)[..64]);
    }
}
