//! The lane core of both modes: A's side of a pair ([`Initiator`]: posting, A's
//! completions, the READ check) and B's side ([`Receiver`]: the receives, the check of a
//! SEND or WRITE where it landed, reposting). B's verdict on a message is an [`Ack`]: on
//! one host it goes straight to A, on two it travels back by SEND. Where a READ reads is
//! the other difference, a [`ReadSource`].

use std::time::{Duration, Instant};

use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, Done, MemoryRegion, ProtectionDomain, RecvQueue, Refused,
    RemoteMr, RemoteWritable, SendQueue, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use super::{AnyError, Crc32, Kind, Opts, Rng, CRC_BITS, SLOT};

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
pub(super) struct Counts {
    pub posts: u64,
    pub completions: u64,
}

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Stats {
    pub ops: [u64; 3],
    pub bytes: u64,
    pub checksum_errors: u64,
    pub wc_errors: u64,
    pub other_errors: u64,
    pub flushed: u64,
    /// Of `other_errors`, the operations reported hung (no completion for `--stuck-secs`).
    pub hung: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        for i in 0..3 {
            self.ops[i] += o.ops[i];
        }
        self.bytes += o.bytes;
        self.add_errors(o);
    }

    /// Adds all but the operations and bytes.
    pub fn add_errors(&mut self, o: &Stats) {
        self.checksum_errors += o.checksum_errors;
        self.wc_errors += o.wc_errors;
        self.other_errors += o.other_errors;
        self.flushed += o.flushed;
        self.hung += o.hung;
    }

    pub fn errors(&self) -> u64 {
        self.checksum_errors + self.wc_errors + self.other_errors
    }
}

/// Counts an error that is not a failed completion, and says what it was.
pub(super) fn fail(index: usize, stats: &mut Stats, what: String) {
    eprintln!("soak: pair {index}: {what}");
    stats.other_errors += 1;
}

/// A CQ of at least `entries` entries (see the module docs of `main.rs`: no CQ can overrun).
pub(super) fn cq(ctx: &Context, entries: u32) -> Result<CompletionQueue, AnyError> {
    let cq = CompletionQueue::new(ctx, entries)?;
    if cq.cqe() < entries {
        return Err(format!("a CQ of {} entries, asked for {entries}", cq.cqe()).into());
    }
    Ok(cq)
}

/// Registers `n` buffers of `len` bytes and posts each as a receive; returns the posts.
pub(super) fn post_receives(
    pd: &ProtectionDomain,
    rq: &mut RecvQueue<Chunk>,
    n: usize,
    len: usize,
) -> Result<Counts, AnyError> {
    let bufs = pd.register(AlignedBuf::new(n * len)?, AccessFlags::LOCAL_WRITE)?.into_chunks(len)?;
    let mut counts = Counts::default();
    for (i, c) in bufs.into_iter().enumerate() {
        rq.post(c, 0..len, i as u64)?;
        counts.posts += 1;
    }
    Ok(counts)
}

/// B's verdict on a SEND or WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ack {
    pub lane: u32,
    /// [`INTACT`], [`MISMATCH`] or [`MALFORMED`].
    pub verdict: u32,
    pub len: u32,
    pub kind: Kind,
}

pub(super) const INTACT: u32 = 0;
pub(super) const MISMATCH: u32 = 1;
/// Not what a lane sends: no immediate data, a bad lane or size, another opcode.
pub(super) const MALFORMED: u32 = 2;

/// The first failed completion A saw, and how long it came after the last good
/// completion of its QP.
pub(super) struct FirstError {
    pub status: WcStatus,
    pub silence: Duration,
}

/// What A's failed completions tell about the link.
#[derive(Default)]
pub(super) struct Watch {
    pub first_error: Option<FirstError>,
    /// Failed completions by status, in the order first seen.
    pub by_status: Vec<(WcStatus, u64)>,
}

impl Watch {
    /// A failed completion on a QP whose last good one came `silence` ago.
    pub fn failed(&mut self, status: WcStatus, silence: Duration) {
        if self.first_error.is_none() {
            self.first_error = Some(FirstError { status, silence });
        }
        match self.by_status.iter_mut().find(|(s, _)| *s == status) {
            Some((_, n)) => *n += 1,
            None => self.by_status.push((status, 1)),
        }
    }
}

/// What every pair's lanes share: the checksum tables, a scratch MiB, the run's shape.
pub(super) struct Shared {
    pub crc: Crc32,
    pub scratch: Vec<u8>,
    /// The operations lanes pick from.
    pub ops: Vec<Kind>,
    pub max_size: usize,
    pub depth: usize,
    /// The bytes of B's read area (two hosts; empty on one).
    pub read_area: Vec<u8>,
    /// `--corrupt-one-write`, until it has been done.
    pub corrupt_next_write: bool,
    pub watch: Watch,
}

impl Shared {
    pub fn new(o: &Opts, depth: u32) -> Shared {
        Shared {
            crc: Crc32::new(),
            scratch: vec![0u8; SLOT],
            ops: o.ops.clone(),
            max_size: o.max_size,
            depth: depth as usize,
            read_area: Vec::new(),
            corrupt_next_write: o.corrupt_one_write,
            watch: Watch::default(),
        }
    }
}

/// Where a READ reads: readies `len` bytes for `lane` and returns their offset in B's
/// region and their CRC.
pub(super) trait ReadSource {
    fn ready(&mut self, rng: &mut Rng, sh: &mut Shared, lane: usize, len: usize) -> Result<(usize, u32), AnyError>;
}

// ---- A: the initiator -------------------------------------------------------------------

pub(super) struct Initiator {
    pub index: usize,
    rng: Rng,
    cq: CompletionQueue,
    sq: SendQueue<Chunk>,
    /// B's region: the lanes' slots first.
    remote: RemoteMr,
    lanes: Vec<Lane>,
    pub sends: Counts,
    pub stats: Stats,
    /// Done items of one send completion (all sends are signaled: one each); kept to
    /// reuse its capacity.
    done: Vec<Done<Chunk>>,
    /// After the run's first error: lanes whose buffer came back were given up, and a
    /// late ack for one of them is no error.
    stopping: bool,
    /// An operation of this pair has been reported hung.
    hung: bool,
    /// The last good completion of this QP (or the start of the traffic).
    pub last_ok: Instant,
}

impl Initiator {
    /// A's side of pair `index`: `depth` lanes, each with a SLOT of its own.
    pub fn new(
        pd: &ProtectionDomain,
        index: usize,
        seed: u64,
        (cq, sq): (CompletionQueue, SendQueue<Chunk>),
        remote: RemoteMr,
        depth: u32,
    ) -> Result<Initiator, AnyError> {
        let chunks =
            pd.register(AlignedBuf::new(depth as usize * SLOT)?, AccessFlags::LOCAL_WRITE)?.into_chunks(SLOT)?;
        Ok(Initiator {
            index,
            rng: Rng::seeded(seed ^ (index as u64).wrapping_mul(0xA076_1D64_78BD_642F)),
            cq,
            sq,
            remote,
            lanes: chunks.into_iter().map(|c| Lane { chunk: Some(c), flight: None }).collect(),
            sends: Counts::default(),
            stats: Stats::default(),
            done: Vec::with_capacity(4),
            stopping: false,
            hung: false,
            last_ok: Instant::now(),
        })
    }

    pub fn fail(&mut self, what: String) {
        fail(self.index, &mut self.stats, what);
    }

    /// Starts an operation on every idle lane.
    pub fn start_idle(&mut self, sh: &mut Shared, source: &mut impl ReadSource) {
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
            // Where in B's region the bytes go (or come from), and their CRC.
            let at = match kind {
                Kind::Send | Kind::Write => Ok((lane * SLOT, sh.crc.sum(&chunk[..len]))),
                Kind::Read => source.ready(&mut self.rng, sh, lane, len),
            };
            let span = at.and_then(|(start, crc)| Ok((self.remote.slice(start as u64..(start + len) as u64)?, crc)));
            let (target, crc) = match span {
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
            self.post(wr, lane, kind, len, crc);
        }
    }

    fn post(&mut self, wr: SendWr<Chunk>, lane: usize, kind: Kind, len: usize, crc: u32) {
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

    /// Takes A's send completions; a READ is checked here, where it landed.
    pub fn poll_sends(&mut self, sh: &mut Shared, wcs: &mut [WorkCompletion]) -> Result<usize, AnyError> {
        let n = self.cq.poll(wcs)?.len();
        for wc in &mut wcs[..n] {
            let mut done = std::mem::take(&mut self.done);
            if let Err(e) = self.sq.complete(wc, |d| done.push(d)) {
                self.done = done;
                self.fail(format!("a completion A's send queue refused: {e}"));
                continue;
            }
            for d in done.drain(..) {
                self.sent(sh, d);
            }
            self.done = done;
        }
        Ok(n)
    }

    /// One send completion: the lane has its buffer back, and a READ's bytes are checked.
    fn sent(&mut self, sh: &mut Shared, d: Done<Chunk>) {
        self.sends.completions += 1;
        let lane = d.id as usize;
        let Some(f) = self.lanes.get_mut(lane).and_then(|l| l.flight.as_mut()) else {
            return self.fail(format!("a send completion for idle lane {lane}"));
        };
        f.sent = true;
        let status = d.status;
        // A failure is counted, not fatal: the soak goes on with the other lanes.
        let buf = match d.result() {
            Ok(d) => {
                self.last_ok = Instant::now();
                if f.kind == Kind::Read {
                    f.checked = true;
                    if sh.crc.sum(&d.value[..f.len]) != f.crc {
                        self.stats.checksum_errors += 1;
                        eprintln!("soak: pair {} lane {lane}: READ of {} bytes: checksum mismatch", self.index, f.len);
                    }
                }
                d.value
            }
            Err(failed) => {
                let (e, buf) = failed.into_parts();
                self.stats.wc_errors += 1;
                sh.watch.failed(status, self.last_ok.elapsed());
                // The error names the operation, the lane (its id) and the QP.
                eprintln!("soak: pair {}: {:?} of {} bytes: {e}", self.index, f.kind, f.len);
                buf
            }
        };
        self.lanes[lane].chunk = Some(buf);
    }

    /// B checked the SEND or WRITE of `ack.lane`: the lane may go on. False when the ack
    /// fits no flight (an error, but after the first error, for a lane given up).
    pub fn checked(&mut self, ack: &Ack) -> bool {
        let lane = ack.lane as usize;
        let Some(f) = self.lanes.get_mut(lane).and_then(|l| l.flight.as_mut()) else {
            if self.stopping && lane < self.lanes.len() {
                // A lane given up after the first error: its ack was still on the way.
                self.stats.flushed += 1;
            } else {
                self.fail(format!("an ack for lane {lane}, which has nothing in flight"));
            }
            return false;
        };
        if f.kind != ack.kind || f.len != ack.len as usize || f.checked {
            let what = format!(
                "lane {lane}: B acked a {:?} of {} bytes; A posted {:?} of {}",
                ack.kind, ack.len, f.kind, f.len
            );
            self.fail(what);
            return false;
        }
        f.checked = true;
        true
    }

    /// Retires the finished lanes (sent and checked); an operation unfinished after
    /// `stuck` is a hang, reported once.
    pub fn retire(&mut self, stuck: Duration) {
        let mut oldest = Duration::ZERO;
        for lane in &mut self.lanes {
            match lane.flight.take() {
                Some(f) if f.sent && f.checked => {
                    self.stats.ops[f.kind as usize] += 1;
                    self.stats.bytes += f.len as u64;
                }
                Some(f) => {
                    oldest = oldest.max(f.since.elapsed());
                    lane.flight = Some(f);
                }
                None => {}
            }
        }
        if oldest > stuck && !self.hung {
            self.hung = true;
            self.stats.hung += 1;
            self.fail(format!("hung: an operation has not finished after {:.1} s", oldest.as_secs_f64()));
        }
    }

    /// After an error, a lane is over once A has its buffer back: its message may never
    /// arrive.
    pub fn stop(&mut self) {
        self.stopping = true;
        for lane in &mut self.lanes {
            if lane.flight.as_ref().is_some_and(|f| f.sent) {
                lane.flight = None;
            }
        }
    }

    pub fn busy(&self) -> bool {
        self.lanes.iter().any(|l| l.flight.is_some())
    }
}

// ---- B: the target ----------------------------------------------------------------------

/// B's receives and region: `depth` receives of a SLOT each, always posted.
pub(super) struct Receiver {
    pub index: usize,
    cq: CompletionQueue,
    rq: RecvQueue<Chunk>,
    /// The lanes' slots first.
    region: MemoryRegion<AlignedBuf, RemoteWritable>,
    pub recvs: Counts,
    /// B's own count: the messages it found intact, and its errors.
    pub stats: Stats,
}

impl Receiver {
    pub fn new(
        pd: &ProtectionDomain,
        index: usize,
        (cq, mut rq): (CompletionQueue, RecvQueue<Chunk>),
        region: MemoryRegion<AlignedBuf, RemoteWritable>,
        depth: u32,
    ) -> Result<Receiver, AnyError> {
        let recvs = post_receives(pd, &mut rq, depth as usize, SLOT)?;
        Ok(Receiver { index, cq, rq, region, recvs, stats: Stats::default() })
    }

    pub fn fail(&mut self, what: String) {
        fail(self.index, &mut self.stats, what);
    }

    /// Takes B's receive completions: checks the SEND or WRITE each announces, posts the
    /// receive again and hands the verdict to `ack`. `running` false: after B's QP was
    /// moved to error, when the receives left are flushed.
    pub fn poll(
        &mut self,
        sh: &mut Shared,
        wcs: &mut [WorkCompletion],
        running: bool,
        mut ack: impl FnMut(Ack),
    ) -> Result<usize, AnyError> {
        let n = self.cq.poll(wcs)?.len();
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
            let d = match d.result() {
                Ok(d) => d,
                Err(failed) => {
                    self.stats.wc_errors += 1;
                    // Names the receive, its id and the QP; the buffer is not posted again.
                    eprintln!("soak: pair {}: {}", self.index, failed);
                    continue;
                }
            };
            let verdict = self.check(sh, opcode, imm, &d.value, d.byte_len);
            match self.rq.post(d.value, 0..SLOT, d.id) {
                Ok(()) => self.recvs.posts += 1,
                Err(Refused { error: e, .. }) => self.fail(format!("reposting a receive: {e}")),
            }
            ack(verdict);
        }
        Ok(n)
    }

    /// B's check of a SEND (bytes in `buf`) or a WRITE (bytes in the lane's slot), from
    /// what the receive completion says: the lane and CRC in the immediate data, the
    /// length in `byte_len`.
    fn check(&mut self, sh: &mut Shared, opcode: WcOpcode, imm: Option<u32>, buf: &Chunk, byte_len: u32) -> Ack {
        let len = byte_len as usize;
        let kind = if opcode == WcOpcode::RecvRdmaWithImm { Kind::Write } else { Kind::Send };
        let lane = imm.map_or(u32::MAX, |i| i >> 28);
        let mut ack = Ack { lane, verdict: MALFORMED, len: byte_len, kind };
        let Some(imm) = imm.filter(|_| (lane as usize) < sh.depth && len <= SLOT) else {
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
            if std::mem::take(&mut sh.corrupt_next_write) {
                sh.scratch[len / 2] ^= 0x10;
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
}

/// One host: B puts fresh bytes in the lane's slot before each READ, and tells the
/// reader their CRC, as it would advertise it next to the rkey.
impl ReadSource for Receiver {
    fn ready(&mut self, rng: &mut Rng, sh: &mut Shared, lane: usize, len: usize) -> Result<(usize, u32), AnyError> {
        rng.fill(&mut sh.scratch[..len]);
        self.region.write_at(lane * SLOT, &sh.scratch[..len])?;
        Ok((lane * SLOT, sh.crc.sum(&sh.scratch[..len])))
    }
}
