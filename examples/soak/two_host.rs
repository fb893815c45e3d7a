//! `soak`'s two-host mode: `soak --server` on one node holds every pair's target B,
//! `soak --client HOST` on the other holds every initiator A, each pair one RC QP a side,
//! connected across the link.
//!
//! The client opens a TCP connection to the server's `--port` and sends the run's shape
//! (a fixed 32-byte setup: pairs, lanes, seed, length, the QPs' timeout and retry count,
//! whether a failed link is accepted), then each pair is brought up by the library's
//! endpoint handshake (`rdma_verbs::Handshake`) over that connection, B advertising its
//! region. The lanes, sizes and CRC-32 checks are the single-host mode's (the same code,
//! `lanes.rs` and `run.rs`), with two differences that come from the two sides being two
//! processes:
//!
//! - B tells A that it checked a SEND or WRITE by an RDMA SEND back on the same QP pair:
//!   16 bytes (lane, verdict, length, kind). A's lane starts its next operation only after
//!   that ack, so B never runs out of receives and never checks a slot A has overwritten.
//!   B keeps twice as many acks' buffers as lanes, and holds an ack back while none is free.
//! - A READ reads a random span of a 2 MiB read area after B's lane slots, which B filled at
//!   the start with bytes both sides derive from the seed; A keeps the same bytes and
//!   checks the CRC of what it read against theirs.
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
//! completion of its QP (plus [`DETECT_SLACK`] for the emulated guests' scheduling). One
//! hang is the failure itself: when only the server had requests in flight as its link
//! went down, its QPs failed and none of the client's requests did, and a client lane
//! waiting for the server's next message is reported hung after `--stuck-secs`; that run
//! passes too (the server's report says its requests failed). rxe retries forever
//! when retry_cnt is 7 (its completer does not count down from 7); the library's default is 6.

use std::collections::{BTreeMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rdma_perftest::perftest;
use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, Done, Handshake, ProtectionDomain, QpAccess, QpType,
    QueuePair, RecvQueue, Refused, RtsAttr, SendQueue, SendWr, WcStatus, WorkCompletion,
};

use super::lanes::{self, Ack, Counts, Initiator, ReadSource, Receiver, Shared, Stats, Watch, INTACT, MISMATCH};
use super::run::{self, Lanes, Limits, Side, Tally, Traffic};
use super::{check_shape, device_name, mib, resource_counts, rss_kib, seed_of, AnyError, Kind, Opts, Rng, SLOT, STUCK};

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

/// An ack travels as 16 bytes: lane, verdict, length, kind (u32 each, little-endian).
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

/// Two hosts: a READ reads a random span of B's read area, whose bytes both sides derive
/// from the seed.
struct SeededArea;

impl ReadSource for SeededArea {
    fn ready(&mut self, rng: &mut Rng, sh: &mut Shared, _lane: usize, len: usize) -> Result<(usize, u32), AnyError> {
        let off = rng.below((READ_AREA - len + 1) as u64) as usize;
        Ok((sh.depth * SLOT + off, sh.crc.sum(&sh.read_area[off..off + len])))
    }
}

/// Two hosts, the client: a pair's A, and the receives of B's acks on the same QP.
struct ClientPair {
    a: Initiator,
    ack_cq: CompletionQueue,
    ack_rq: RecvQueue<Chunk>,
    acks: Counts,
    qp: QueuePair,
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
        let (cq, ack_cq) = (lanes::cq(pd.context(), depth + 1)?, lanes::cq(pd.context(), depth + 1)?);
        let qp = QueuePair::builder(pd, QpType::Rc, &cq, &ack_cq).max_send_wr(depth).max_recv_wr(depth).build()?;
        let hs = handshake(o, &qp, setup);
        hs.init()?;
        let mut ack_rq = qp.recv_queue()?;
        let acks = lanes::post_receives(pd, &mut ack_rq, depth as usize, ACK_BUF)?;
        let conn = hs.connect(stream).map_err(|e| format!("pair {index}: connecting its QPs across: {e}"))?;
        let remote = conn.remote.mr.ok_or_else(|| format!("pair {index}: the server advertised no region"))?;
        let need = depth as usize * SLOT + READ_AREA;
        if remote.len < need as u64 {
            return Err(
                format!("pair {index}: the server's region has {} bytes, the lanes need {need}", remote.len).into()
            );
        }
        let a = Initiator::new(pd, index, setup.seed, (cq, qp.send_queue()?), remote, depth)?;
        Ok(ClientPair { a, ack_cq, ack_rq, acks, qp })
    }

    /// Takes B's acks: the SEND or WRITE they name was checked. `running` false: after
    /// A's QP was moved to error, when the receives left are flushed.
    fn poll_acks(&mut self, sh: &mut Shared, wcs: &mut [WorkCompletion], running: bool) -> Result<usize, AnyError> {
        let n = self.ack_cq.poll(wcs)?.len();
        for wc in &mut wcs[..n] {
            let d = match self.ack_rq.complete(wc) {
                Ok(d) => d,
                Err(e) => {
                    self.a.fail(format!("a completion A's ack queue refused: {e}"));
                    continue;
                }
            };
            self.acks.completions += 1;
            if !running && d.status == WcStatus::WrFlushErr {
                self.a.stats.flushed += 1;
                continue;
            }
            if d.status != WcStatus::Success {
                self.a.stats.wc_errors += 1;
                sh.watch.failed(d.status, self.a.last_ok.elapsed());
                continue;
            }
            self.a.last_ok = Instant::now();
            self.take_ack(&d.value[..(d.byte_len as usize).min(ACK_BUF)]);
            match self.ack_rq.post(d.value, 0..ACK_BUF, d.id) {
                Ok(()) => self.acks.posts += 1,
                Err(Refused { error: e, .. }) => self.a.fail(format!("reposting an ack receive: {e}")),
            }
        }
        Ok(n)
    }

    /// B's verdict, counted on this side too: B's counts reach the client only at the end.
    fn take_ack(&mut self, bytes: &[u8]) {
        let ack = match Ack::decode(bytes) {
            Ok(a) => a,
            Err(e) => return self.a.fail(e),
        };
        if !self.a.checked(&ack) {
            return;
        }
        let lane = ack.lane;
        match ack.verdict {
            INTACT => {}
            MISMATCH => {
                self.a.stats.checksum_errors += 1;
                eprintln!(
                    "soak: pair {} lane {lane}: B found a checksum mismatch in a {:?} of {} bytes",
                    self.a.index, ack.kind, ack.len
                );
            }
            v => self.a.fail(format!("lane {lane}: B could not make sense of the {:?} (verdict {v})", ack.kind)),
        }
    }
}

impl Side for ClientPair {
    fn index(&self) -> usize {
        self.a.index
    }

    fn poll(&mut self, sh: &mut Shared, wcs: &mut [WorkCompletion], running: bool) -> Result<usize, AnyError> {
        Ok(self.a.poll_sends(sh, wcs)? + self.poll_acks(sh, wcs, running)?)
    }

    fn queues(&self) -> [(&'static str, Counts); 2] {
        [("A send", self.a.sends), ("A ack receive", self.acks)]
    }

    fn stats(&self) -> Stats {
        self.a.stats
    }

    fn qp(&self) -> &QueuePair {
        &self.qp
    }
}

impl Lanes for ClientPair {
    fn a(&mut self) -> &mut Initiator {
        &mut self.a
    }

    fn busy(&self) -> bool {
        self.a.busy()
    }

    fn start_idle(&mut self, sh: &mut Shared) {
        self.a.start_idle(sh, &mut SeededArea);
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
    let mut stream = perftest::connect(host, o.port).map_err(|e| e as AnyError)?;
    stream.set_read_timeout(Some(PEER_SILENCE))?;
    stream.write_all(&setup.encode())?;
    let out = drive_client(o, &device, &setup, &mut stream, &Limits::new(o, duration))?;
    let after = resource_counts(&device)?;
    let failures = client_failures(o, &out, &before, &after);
    let w = &out.watch;
    let detect = w.first_error.as_ref().map_or("-".to_owned(), |f| format!("{:.3}", f.silence.as_secs_f64()));
    let first = w.first_error.as_ref().map_or("-".to_owned(), |f| format!("{:?}", f.status));
    let by_status = w.by_status.iter().map(|(s, n)| format!("{s:?}:{n}")).collect::<Vec<_>>().join(",");
    let outcome = if failed_completions(&out) == 0 && out.report.is_ok() { "intact" } else { "failed" };
    println!(
        "soak: {} two-host outcome={outcome} {} failed_completions={} first_error={first} detect_secs={detect} \
         retry_bound_secs={} qp_timeout={} retry_cnt={} {} {} {}",
        if failures.is_empty() { "PASS" } else { "FAIL" },
        run::traffic_fields(o, seed, out.traffic.traffic, &out.tally),
        if by_status.is_empty() { "0".to_owned() } else { by_status },
        bound.map_or("none".to_owned(), |b| format!("{:.3}", b.as_secs_f64())),
        o.qp_timeout,
        o.retry_cnt,
        run::rss_fields(&out.traffic, o.rss_slack_kib),
        run::resources_fields(&before, &after),
        peer_text(&out.report),
    );
    for f in &failures {
        eprintln!("soak: FAIL: {f}");
    }
    Ok(failures.is_empty())
}

/// The checks of the run as the client sees it: both sides' counts, its own process, and
/// (failed completions) whether they fit `--accept-link-failure`.
fn client_failures(
    o: &Opts,
    out: &ClientOutcome,
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> Vec<String> {
    let t = &out.tally.totals;
    let peer = out.report.as_ref().ok();
    let mut failures = Vec::new();
    let checksum_errors = t.checksum_errors + peer.map_or(0, |r| r.checksum_errors);
    if checksum_errors > 0 {
        failures.push(format!("{checksum_errors} checksum errors"));
    }
    // A lane of this side that waited in vain for the server's message, when the server's
    // requests failed and none of this side's did: the server's link went down while only
    // it had requests in flight, and its QPs failed at once (rxe fails a send on a port
    // whose link is down), so nothing of this side's ever fails; the wait for the
    // server's next message is how this side learns. With --accept-link-failure that is
    // the failure found, not an error of its own.
    let peer_failed = peer.is_some_and(|r| r.wc_errors > 0);
    let excused = if o.accept_link_failure && peer_failed && t.wc_errors == 0 { t.hung } else { 0 };
    if excused > 0 {
        eprintln!(
            "soak: {excused} lane(s) waited in vain after the server's requests failed and none of ours did: \
             the failure, seen from this side (--accept-link-failure)"
        );
    }
    let other_errors = t.other_errors - excused + peer.map_or(0, |r| r.other_errors);
    if other_errors > 0 {
        failures.push(format!("{other_errors} errors that are not failed completions (see above)"));
    }
    let unbalanced = out.tally.unbalanced + peer.map_or(0, |r| r.unbalanced);
    if unbalanced > 0 {
        failures.push(format!("{unbalanced} queues whose posts and completions differ"));
    }
    failures.extend(run::own_checks(before, after, (out.traffic.rss_warm, out.traffic.rss_final), o.rss_slack_kib));
    if let Some(r) = peer.filter(|r| r.failed_checks > 0) {
        failures.push(format!("{} of the server's own checks failed (see its output)", r.failed_checks));
    }
    let wc_errors = failed_completions(out);
    if wc_errors == 0 && out.report.is_ok() {
        return failures;
    }
    if !o.accept_link_failure {
        match &out.report {
            Ok(_) => failures.push(format!("{wc_errors} failed completions")),
            Err(e) => failures.push(format!("no report from the server: {e}")),
        }
    } else if let Some(first) = &out.watch.first_error {
        match retry_bound(o.qp_timeout, o.retry_cnt) {
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
    failures
}

/// Both sides' failed completions (the server's as far as it reported).
fn failed_completions(out: &ClientOutcome) -> u64 {
    out.tally.totals.wc_errors + out.report.as_ref().map_or(0, |r| r.wc_errors)
}

/// The server's part of the client's summary.
fn peer_text(report: &Result<Report, String>) -> String {
    match report {
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
    }
}

struct ClientOutcome {
    traffic: Traffic,
    tally: Tally,
    watch: Watch,
    report: Result<Report, String>,
}

fn drive_client(
    o: &Opts,
    device: &str,
    setup: &Setup,
    stream: &mut TcpStream,
    lim: &Limits,
) -> Result<ClientOutcome, AnyError> {
    let ctx = Context::open(Some(device))?;
    let pd = ProtectionDomain::new(&ctx)?;
    let mut pairs = Vec::with_capacity(setup.qps as usize);
    for i in 0..setup.qps as usize {
        pairs.push(ClientPair::new(o, &pd, setup, i, stream)?);
    }
    let mut sh = Shared::new(o, setup.depth);
    sh.read_area = read_area(setup.seed);
    let mut wcs = run::completions();
    let traffic = run::drive(&mut pairs, &mut sh, &mut wcs, lim)?;

    // B stops and tears down while A's QPs are still up, so B's last acks complete.
    let report = stream.write_all(DONE).map_err(|e| format!("sending DONE: {e}")).and_then(|()| {
        let wait = if traffic.failed { Duration::from_secs(10) } else { PEER_SILENCE };
        stream.set_read_timeout(Some(wait)).map_err(|e| e.to_string())?;
        let mut b = [0u8; REPORT_LEN];
        stream.read_exact(&mut b).map_err(|e| format!("reading the server's report: {e}"))?;
        Report::decode(&b)
    });
    // A's posted ack receives complete only by being flushed.
    run::flush(&mut pairs, &mut sh, &mut wcs)?;
    let tally = run::tally(&pairs);
    drop(pairs);
    drop((pd, ctx));
    Ok(ClientOutcome { traffic, tally, watch: sh.watch, report })
}

// ---- the server: every pair's B ------------------------------------------------------------

/// Two hosts, the server: a pair's B, and the sending of its acks on the same QP.
struct ServerPair {
    b: Receiver,
    ack_cq: CompletionQueue,
    ack_sq: SendQueue<Chunk>,
    free_acks: Vec<Chunk>,
    pending: VecDeque<Ack>,
    acks: Counts,
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
        let (rcq, ack_cq) = (lanes::cq(pd.context(), depth + 1)?, lanes::cq(pd.context(), 2 * depth + 1)?);
        let qp = QueuePair::builder(pd, QpType::Rc, &ack_cq, &rcq).max_send_wr(2 * depth).max_recv_wr(depth).build()?;
        let lanes_len = depth as usize * SLOT;
        let region_access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let mut region = pd.register_remote_writable(AlignedBuf::new(lanes_len + READ_AREA)?, region_access)?;
        region.write_at(lanes_len, area)?;
        let hs =
            handshake(o, &qp, setup).access(QpAccess::REMOTE_WRITE | QpAccess::REMOTE_READ).advertise(region.remote()?);
        hs.init()?;
        // Receives first: A may send as soon as the handshake returns.
        let b = Receiver::new(pd, index, (rcq, qp.recv_queue()?), region, depth)?;
        hs.connect(stream).map_err(|e| format!("pair {index}: connecting its QPs across: {e}"))?;
        let free_acks = pd
            .register(AlignedBuf::new(2 * depth as usize * ACK_BUF)?, AccessFlags::LOCAL_WRITE)?
            .into_chunks(ACK_BUF)?;
        Ok(ServerPair {
            b,
            ack_sq: qp.send_queue()?,
            ack_cq,
            free_acks,
            pending: VecDeque::new(),
            acks: Counts::default(),
            done: Vec::with_capacity(4),
            qp,
        })
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
                    self.b.fail(format!("posting an ack: {e}"));
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
                self.b.fail(format!("a completion B's ack queue refused: {e}"));
                continue;
            }
            for d in done.drain(..) {
                self.acks.completions += 1;
                let flushed = !running && d.status == WcStatus::WrFlushErr;
                let buf = match d.result() {
                    Ok(d) => d.value,
                    Err(failed) => {
                        let (e, buf) = failed.into_parts();
                        if flushed {
                            self.b.stats.flushed += 1;
                        } else {
                            self.b.stats.wc_errors += 1;
                            // Names the ack's SEND, its id and the QP.
                            eprintln!("soak: pair {}: an ack: {e}", self.b.index);
                        }
                        buf
                    }
                };
                self.free_acks.push(buf);
            }
            self.done = done;
        }
        self.send_acks();
        Ok(n)
    }
}

impl Side for ServerPair {
    fn index(&self) -> usize {
        self.b.index
    }

    /// B's receives (each checked message queues an ack), then the acks' completions.
    fn poll(&mut self, sh: &mut Shared, wcs: &mut [WorkCompletion], running: bool) -> Result<usize, AnyError> {
        let pending = &mut self.pending;
        let n = self.b.poll(sh, wcs, running, |ack| pending.push_back(ack))?;
        self.send_acks();
        Ok(n + self.poll_acks(wcs, running)?)
    }

    fn queues(&self) -> [(&'static str, Counts); 2] {
        [("B receive", self.b.recvs), ("B ack send", self.acks)]
    }

    fn stats(&self) -> Stats {
        self.b.stats
    }

    fn qp(&self) -> &QueuePair {
        &self.qp
    }
}

/// The server's side: takes one client, serves its run, reports, prints its own summary.
pub(super) fn serve(o: &Opts) -> Result<bool, AnyError> {
    let device = device_name(o)?;
    let listener = perftest::listen(o.port).map_err(|e| e as AnyError)?;
    eprintln!("soak: two hosts, server on {device}: waiting for a client on TCP port {}", o.port);
    let (mut stream, peer) = perftest::accept_on(&listener).map_err(|e| e as AnyError)?;
    drop(listener);
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
    let mut failures = run::own_checks(&before, &after, (rss_warm, rss_final), o.rss_slack_kib);
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
         other_errors={} flushed={} rss_warm={rss_warm}KiB rss_final={rss_final}KiB {}",
        if failures.is_empty() { "PASS" } else { "FAIL" },
        r.ops,
        mib(r.bytes),
        r.posts,
        r.completions,
        r.checksum_errors,
        r.wc_errors,
        r.other_errors,
        r.flushed,
        run::resources_fields(&before, &after)
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
    let mut sh = Shared::new(o, setup.depth);
    let mut wcs = run::completions();
    let lim = Limits::new(o, Duration::from_millis(setup.duration_ms));
    let (client_gone, rss_warm) = serve_until_done(&mut pairs, &mut sh, &mut wcs, stream, &lim)?;
    let rss_final = rss_kib();
    // The client's QPs are still up: B's last acks may complete, for 2 s.
    let ack_deadline = Instant::now() + Duration::from_secs(2);
    while pairs.iter().any(|p| p.acks.completions < p.acks.posts) && Instant::now() < ack_deadline {
        for p in pairs.iter_mut() {
            p.poll(&mut sh, &mut wcs, true)?;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    run::flush(&mut pairs, &mut sh, &mut wcs)?;
    let t = run::tally(&pairs);
    let s = &t.totals;
    let mut r = Report {
        ops: s.ops.iter().sum(),
        bytes: s.bytes,
        posts: t.posts,
        completions: t.completions,
        unbalanced: t.unbalanced,
        checksum_errors: s.checksum_errors,
        wc_errors: s.wc_errors,
        other_errors: s.other_errors,
        flushed: s.flushed,
        failed_checks: 0,
    };
    if let Some(why) = client_gone {
        eprintln!("soak: {why}");
        r.failed_checks += 1;
    }
    drop(pairs);
    drop((pd, ctx));
    Ok((r, rss_warm.unwrap_or(rss_final), rss_final))
}

/// Takes B's completions until the client's DONE; returns why the client is gone if it
/// went otherwise, and the RSS after the warm-up if it came.
fn serve_until_done(
    pairs: &mut [ServerPair],
    sh: &mut Shared,
    wcs: &mut [WorkCompletion],
    stream: &mut TcpStream,
    lim: &Limits,
) -> Result<(Option<String>, Option<u64>), AnyError> {
    // The client's run, its drain and its slowest failure, and some.
    let give_up = lim.duration + 3 * lim.stuck.max(STUCK) + PEER_SILENCE;
    stream.set_nonblocking(true)?;
    let started = Instant::now();
    let mut rss_warm = None;
    let (mut word, mut got) = ([0u8; 4], 0);
    let mut next_look = started;
    let client_gone = loop {
        let mut progressed = 0;
        for p in pairs.iter_mut() {
            progressed += p.poll(sh, wcs, true)?;
        }
        let now = Instant::now();
        if rss_warm.is_none() && now.duration_since(started) >= lim.warmup {
            rss_warm = Some(rss_kib());
        }
        if now >= next_look {
            next_look = now + Duration::from_millis(20);
            let gone = match stream.read(&mut word[got..]) {
                Ok(0) => Some("the client closed the connection without DONE".to_owned()),
                Ok(n) => {
                    got += n;
                    None
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => None,
                Err(e) => Some(format!("the client's connection failed: {e}")),
            };
            if got == word.len() {
                break (&word != DONE).then(|| format!("the client sent {word:?}, not DONE"));
            }
            if gone.is_some() {
                break gone;
            }
            if now.duration_since(started) > give_up {
                break Some(format!("no DONE from the client after {give_up:?}"));
            }
        }
        if progressed == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    };
    stream.set_nonblocking(false)?;
    Ok((client_gone, rss_warm))
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
