//! The engine of the bandwidth tools `write_bw`, `read_bw` and `send_bw` (perftest's
//! `ib_write_bw`, `ib_read_bw`, `ib_send_bw`) on the safe data path. Each tool is a thin
//! `main` over [`bw_main`]; they share the flags, the checks, server/client/`--loopback`,
//! the posting loop (`Bw::post_loop`), the progress lines, the table or JSON, and the
//! data check, which differs by operation:
//!
//! - **write**: the client writes the pattern into one region per server QP; the server
//!   checks every region at the end and sends its verdict to the client.
//! - **read**: the server fills one region per QP with the pattern; the client reads it
//!   into a pool of buffers (a READ needs a buffer of its own while in flight) and checks
//!   every buffer it used at the end; its verdict goes to the server. The client's QP
//!   may have `-o` READs outstanding at the responder (default: the device's
//!   `max_qp_rd_atom`, at most 16, which the endpoint handshake gives the server's QP);
//!   the requests beyond that wait in the send queue, so `-t` stays the send queue depth.
//! - **send**: the server keeps `-r` receives posted per QP (default 512, at most the
//!   device's `max_qp_wr`), re-posting each as it completes, and checks every message:
//!   the pattern, with the message's number in its first and last 8 bytes (a receive
//!   buffer is stamped with the complement before it is posted, so a buffer the message
//!   did not overwrite fails). The client never has more messages sent than the server
//!   has receives posted, so receiver-not-ready never happens: the server RDMA WRITEs
//!   the number of receives it has posted in all into an 8-byte word the client
//!   advertised (after connecting, then each time a quarter of its receives were
//!   re-posted), and the client posts only up to that number. perftest's client instead
//!   relies on RNR retries.
//!
//! Sources and receive buffers of read and send are pools of one buffer per request in
//! flight, at most 64 MiB for all QPs of a side: with large messages fewer requests are
//! in flight than `-t` (or `-r`) says.
//!
//! Client requests are prepared once per size (one per `-t` for write, per pool buffer
//! for read and send) and posted again and again.
//!
//! Whenever a lane cannot post again without a completion, one of its requests in flight
//! is signaled, whatever `-Q` says (a post list that does not divide `-t` used to leave
//! write_bw waiting forever), and a run that sees no completion for a minute stops with
//! an error saying what it waited for.
//!
//! Only the client reports, for every operation (perftest's `ib_send_bw` reports on both
//! sides): the server prints whether the data check passed on stderr.
//!
//! Over TCP the tools speak perftest's out-of-band exchange ([`crate::oob`]), so a
//! server or client of perftest's (`ib_write_bw`, `ib_read_bw`, `ib_send_bw`) may be the
//! other side. With one: a single size for `-n` iterations; our server registers
//! perftest's cycle buffer when it is larger than `-s` and prints the client's report;
//! our send_bw client sends without credits and retries on RNR NAKs forever (perftest's
//! `rnr_retry` 7), our send_bw server writes none and waits for `-n` messages per QP;
//! nothing is checked. Two of ours recognise each other in that exchange and go on with
//! the endpoint handshake per QP and size, with every check above.

use std::ops::Range;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, DeviceAttr, Done, MemoryRegion, PreparedSend,
    PreparedSendQueue, ProtectionDomain, QpAccess, QpType, QueuePair, RecvQueue, RemoteMr, RemoteWritable, RtsAttr,
    SendBuf, SendQueue, SendWr, WorkCompletion,
};

use crate::oob::{BwReport, Offer, Peer, Shape};
use crate::perftest::{self, BwRow, Common, Res, Role, Stream};

/// Beyond these, a flag is a typo rather than a test (the device's own limits are checked
/// once it is open).
const MAX_DEPTH: u32 = 1 << 24;
const MAX_QPS: u32 = 1024;
/// The endpoint handshake gives the responder's QP this many incoming READs
/// (`max_dest_rd_atomic`), so a requester may not have more outstanding.
const MAX_OUTS: u32 = 16;
/// perftest's receive depth of `ib_send_bw`.
const DEFAULT_RX_DEPTH: u32 = 512;
/// Bytes of buffers one side of read/send spends on its pool, all QPs together.
const POOL_BYTES: usize = 64 << 20;
/// Credit writes a send_bw server may have in flight per QP.
const CREDIT_SLOTS: u32 = 8;
/// Without a completion for this long a run is stuck: a peer stopped, or a credit never came.
const STALL: Duration = Duration::from_secs(60);

/// The three bandwidth tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BwTest {
    /// The client RDMA WRITEs into the server's regions.
    Write,
    /// The client RDMA READs the server's regions.
    Read,
    /// The client SENDs into the server's receives.
    Send,
}

impl BwTest {
    fn title(self) -> &'static str {
        match self {
            BwTest::Write => "RDMA_Write BW Test",
            BwTest::Read => "RDMA_Read BW Test",
            BwTest::Send => "Send BW Test",
        }
    }

    fn noun(self) -> &'static str {
        match self {
            BwTest::Write => "writes",
            BwTest::Read => "reads",
            BwTest::Send => "sends",
        }
    }
}

/// Command-line flags, named as perftest names them; `X` holds the flags of one test.
#[derive(Parser, Debug)]
struct Opts<X: clap::Args> {
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
    /// No progress lines on stderr (a long run prints one a second after 3 s).
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    extra: X,
}

/// write_bw has no flags of its own.
#[derive(clap::Args, Debug)]
struct WriteFlags {}

/// read_bw's own flag.
#[derive(clap::Args, Debug)]
struct ReadFlags {
    /// RDMA READs outstanding per QP (default: the device's max_qp_rd_atom, at most 16).
    #[arg(short = 'o', long = "outs")]
    outs: Option<u32>,
}

/// send_bw's own flag.
#[derive(clap::Args, Debug)]
struct SendFlags {
    /// Receives the server keeps posted per QP (default 512, at most the device's max_qp_wr).
    #[arg(short = 'r', long = "rx-depth")]
    rx_depth: Option<u32>,
}

/// The flags of any of the tests, once parsed.
#[derive(Debug)]
struct Flags {
    common: Common,
    duration: Option<f64>,
    tx_depth: u32,
    cq_mod: Option<u32>,
    post_list: u32,
    qps: u32,
    report_gbits: bool,
    quiet: bool,
    outs: Option<u32>,
    rx_depth: Option<u32>,
}

impl<X: clap::Args> Opts<X> {
    fn flags(self, outs: Option<u32>, rx_depth: Option<u32>) -> Flags {
        Flags {
            common: self.common,
            duration: self.duration,
            tx_depth: self.tx_depth,
            cq_mod: self.cq_mod,
            post_list: self.post_list,
            qps: self.qps,
            report_gbits: self.report_gbits,
            quiet: self.quiet,
            outs,
            rx_depth,
        }
    }
}

/// `main` of a bandwidth tool.
pub fn bw_main(test: BwTest, name: &'static str, about: &'static str) -> ExitCode {
    let f = match test {
        BwTest::Write => perftest::parse::<Opts<WriteFlags>>(name, about).flags(None, None),
        BwTest::Read => {
            let o = perftest::parse::<Opts<ReadFlags>>(name, about);
            let outs = o.extra.outs;
            o.flags(outs, None)
        }
        BwTest::Send => {
            let o = perftest::parse::<Opts<SendFlags>>(name, about);
            let rx = o.extra.rx_depth;
            o.flags(None, rx)
        }
    };
    let bw = Bw { test, name, f, outs: 0, rx_depth: 0 };
    perftest::exit_with(name, bw.run())
}

/// One tool's run: the test, its name for messages, the flags, and the limits settled
/// once the device is open.
struct Bw {
    test: BwTest,
    name: &'static str,
    f: Flags,
    /// read: RDMA READs outstanding per QP.
    outs: u32,
    /// send: the receive depth asked for (before the pool's limit).
    rx_depth: u32,
}

/// What the posting loop measured.
struct Measured {
    /// Requests completed, all QPs.
    finished: u64,
    secs: f64,
    /// Best window, bytes a second.
    peak: f64,
}

/// What a client's run brought back, besides the numbers.
struct Outcome {
    row: BwRow,
    /// Requests posted per QP (send_bw tells the server, which waits for that many).
    posted: Vec<u64>,
    /// read_bw: the client's own check of what it read.
    check: Res<()>,
    /// The lanes, their QPs kept until the server's verdict: with `-R` a QP holds its
    /// rdma_cm connection, and on iWARP closing it flushes the server's receives (send_bw's
    /// server would fail on them before it has counted every message).
    _lanes: Box<dyn std::any::Any>,
}

impl Bw {
    /// Refuses nonsense before the device is touched.
    fn check_flags(&self) -> Res<()> {
        let o = &self.f;
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
            return Err(
                format!("post list {} (-l) is larger than the tx depth {} (-t)", o.post_list, o.tx_depth).into()
            );
        }
        if o.post_list as usize > rdma_verbs::MAX_BATCH {
            return Err(format!(
                "post list {} (-l) is longer than the {} requests one post takes",
                o.post_list,
                rdma_verbs::MAX_BATCH
            )
            .into());
        }
        self.check_run_flags()
    }

    /// -Q, -D, -o and -r on their own.
    fn check_run_flags(&self) -> Res<()> {
        let o = &self.f;
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
        if o.outs == Some(0) {
            return Err("0 outstanding reads (-o): allow at least 1".into());
        }
        match o.rx_depth {
            Some(0) => return Err("rx depth 0 (-r): the server needs at least 1 receive posted".into()),
            Some(r) if r > MAX_DEPTH => {
                return Err(format!("rx depth {r} (-r) is beyond {MAX_DEPTH}: no device takes that many").into())
            }
            _ => {}
        }
        Ok(())
    }

    /// The limits that depend on the device: -t and -q against its queues, -o against
    /// its READ resources, -r against its receive queue.
    fn check_device(&mut self, dev: &DeviceAttr) -> Res<()> {
        let o = &self.f;
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
        if self.test == BwTest::Read {
            let cap = MAX_OUTS.min(dev.max_qp_rd_atom).min(dev.max_qp_init_rd_atom);
            if cap == 0 {
                return Err("the device allows no outstanding RDMA READ (max_qp_rd_atom 0)".into());
            }
            self.outs = match o.outs {
                Some(n) if n > cap => {
                    return Err(format!(
                        "{n} outstanding reads (-o) is beyond {cap}: the device's max_qp_rd_atom is {}, \
                         max_qp_init_rd_atom {}, and the server's QP takes {MAX_OUTS}",
                        dev.max_qp_rd_atom, dev.max_qp_init_rd_atom
                    )
                    .into())
                }
                Some(n) => n,
                None => cap,
            };
        }
        if self.test == BwTest::Send {
            self.rx_depth = match o.rx_depth {
                Some(r) if r > dev.max_qp_wr => {
                    return Err(format!("rx depth {r} (-r) exceeds the device's max_qp_wr {}", dev.max_qp_wr).into())
                }
                Some(r) => r,
                None => DEFAULT_RX_DEPTH.min(dev.max_qp_wr),
            };
            let cqes = (u64::from(self.rx_depth) + u64::from(CREDIT_SLOTS)) * u64::from(o.qps);
            if cqes > u64::from(dev.max_cqe) {
                return Err(format!(
                    "rx depth {} x {} QPs exceeds the device's max_cqe {}: lower -r or -q",
                    self.rx_depth, o.qps, dev.max_cqe
                )
                .into());
            }
        }
        Ok(())
    }

    fn run(mut self) -> Res<()> {
        let c = &self.f.common;
        let role = c.role()?;
        let sizes = c.sizes(65536)?;
        let iters = c.iterations(5000)?;
        self.check_flags()?;
        let show = !c.json && role != Role::Server;
        let c = self.f.common.clone();
        let timed = self.f.duration.is_some();
        let (ctx, mut stream, mut peer) = perftest::connect_peer(&role, &c, &sizes, timed, |ctx| {
            self.check_device(&ctx.query_device()?)?;
            if show {
                self.print_header(ctx, &role);
            }
            Ok(())
        })?;
        for &size in &sizes {
            let row = match stream.as_deref_mut() {
                None => perftest::loopback(
                    |s| self.server(&ctx, size, iters, s, &mut Peer::Ours),
                    |s| self.client(&ctx, size, iters, s, &mut Peer::Ours),
                )?,
                Some(s) if role == Role::Server => {
                    self.server(&ctx, size, iters, s, &mut peer)?;
                    self.report_served(size, &peer);
                    continue;
                }
                Some(s) => self.client(&ctx, size, iters, s, &mut peer)?,
            };
            perftest::print_bw_row(&row, self.f.report_gbits, c.json);
        }
        if show {
            println!("{}", perftest::rule());
        }
        Ok(())
    }

    /// The server's line on stderr once a size is served.
    fn report_served(&self, size: usize, peer: &Peer) {
        let qps = self.f.qps;
        let whose = match (peer.is_perftest(), self.test) {
            (true, _) => "not checked (the client is perftest)",
            (false, BwTest::Read) => "the client's data check passed",
            (false, _) => "the data check passed",
        };
        eprintln!("{}: {size} B: {whose} on {qps} QP{}", self.name, if qps == 1 { "" } else { "s" });
    }

    /// perftest's moderation rule: every 100th signaled, every one above 8 KiB unless -Q.
    fn cq_mod(&self, size: usize) -> u32 {
        let m = self.f.cq_mod.unwrap_or(if size > 8192 { 1 } else { 100 });
        m.clamp(1, self.f.tx_depth)
    }

    /// Buffers per QP of a read/send pool of messages of `size`, at most `depth`.
    fn pool_len(&self, size: usize, depth: u32) -> u32 {
        let fit = POOL_BYTES / self.f.qps as usize / size;
        u32::try_from(fit).unwrap_or(u32::MAX).clamp(1, depth)
    }

    // ---- the server ----------------------------------------------------------------

    /// The server's side of one size.
    fn server(&self, ctx: &Context, size: usize, iters: u64, stream: &mut dyn Stream, peer: &mut Peer) -> Res<()> {
        match self.test {
            BwTest::Write => self.write_server(ctx, size, stream, peer),
            BwTest::Read => self.read_server(ctx, size, stream, peer),
            BwTest::Send => self.send_server(ctx, size, iters, stream, peer),
        }
    }

    /// The bytes of a region the client targets: `size`, or perftest's cycle buffer
    /// when larger (a perftest client spreads small messages over it).
    fn region_len(size: usize, peer: &Peer) -> usize {
        match peer {
            Peer::Perftest(p) => size.max(p.cycle_buffer),
            Peer::Ours => size,
        }
    }

    /// A QP and a region (`make` registers it: `len` bytes) per client QP, connected
    /// to the client's QPs, which may do `access` on them.
    fn served_regions<R>(
        &self,
        ctx: &Context,
        size: usize,
        (access, make): (QpAccess, impl Fn(&ProtectionDomain, usize) -> Res<(R, RemoteMr)>),
        stream: &mut dyn Stream,
        peer: &mut Peer,
    ) -> Res<Vec<(QueuePair, R)>> {
        let pd = ProtectionDomain::new(ctx)?;
        let cq = CompletionQueue::new(ctx, 4)?;
        let len = Self::region_len(size, peer);
        let mut held = Vec::with_capacity(self.f.qps as usize);
        let how = self.f.common.cm_qp(&self.f.common.rts(), self.test == BwTest::Read);
        for _ in 0..self.f.qps {
            let builder = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(1).max_recv_wr(1);
            let qp = perftest::new_qp(stream, builder, how)?;
            let (region, remote) = make(&pd, len)?;
            held.push((qp, region, remote));
        }
        let offers: Vec<Offer> =
            held.iter().map(|(qp, _, mr)| Offer { qp, access, mr: Some(*mr), rts: self.f.common.rts() }).collect();
        peer.connect(&self.f.common, Shape::RDMA_BW, &offers, 0, stream)?;
        Ok(held.into_iter().map(|(qp, r, _)| (qp, r)).collect())
    }

    /// A region per QP for the client to write, then the check of what arrived, whose
    /// verdict goes back to the client (perftest's client: its report instead).
    fn write_server(&self, ctx: &Context, size: usize, stream: &mut dyn Stream, peer: &mut Peer) -> Res<()> {
        let make = |pd: &ProtectionDomain, len: usize| -> Res<_> {
            let flags = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
            let region = pd.register_remote_writable(AlignedBuf::new(len)?, flags)?;
            let remote = region.remote()?;
            Ok((region, remote))
        };
        let held = self.served_regions(ctx, size, (QpAccess::REMOTE_WRITE, make), stream, peer)?;
        if let Peer::Perftest(p) = peer {
            return self.print_client_report(p.end_bw(stream, &BwReport::default())?);
        }
        perftest::barrier(stream, true).map_err(|e| format!("the client did not finish its run: {e}"))?;
        let check = check_regions(held.iter().map(|(_, r)| r), size);
        perftest::send_verdict(stream, check.is_ok())?;
        check
    }

    /// A region per QP holding the pattern, for the client to read; the client checks
    /// what it read and sends its verdict (perftest's client: its report).
    fn read_server(&self, ctx: &Context, size: usize, stream: &mut dyn Stream, peer: &mut Peer) -> Res<()> {
        // The pattern, again and again over a perftest client's cycle buffer.
        let make = |pd: &ProtectionDomain, len: usize| -> Res<_> {
            let mut buf = AlignedBuf::new(len)?;
            for (b, p) in buf.as_mut_slice().iter_mut().zip(pattern(size).cycle()) {
                *b = p;
            }
            let region = pd.register(buf, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)?;
            let remote = region.remote()?;
            Ok((region, remote))
        };
        let _held = self.served_regions(ctx, size, (QpAccess::REMOTE_READ, make), stream, peer)?;
        if let Peer::Perftest(p) = peer {
            return self.print_client_report(p.end_bw(stream, &BwReport::default())?);
        }
        perftest::barrier(stream, true).map_err(|e| format!("the client did not finish its run: {e}"))?;
        if !perftest::read_verdict(stream)? {
            return Err(format!(
                "the client's data check failed at {size} B: what it read differs from what this side serves \
                 (its log says where)"
            )
            .into());
        }
        Ok(())
    }

    /// A perftest client's report, printed as ib_write_bw's server prints it.
    fn print_client_report(&self, r: BwReport) -> Res<()> {
        let row = BwRow {
            bytes: usize::try_from(r.size).unwrap_or(usize::MAX),
            iterations: r.iters,
            bw_peak_mib_s: r.bw_peak,
            bw_avg_mib_s: r.bw_avg,
            msg_rate_mpps: r.msg_rate,
        };
        eprintln!("{}: the client's report (in its units):", self.name);
        perftest::print_bw_row(&row, false, self.f.common.json);
        Ok(())
    }

    /// Receives kept posted on every QP, each message checked, credits written back to
    /// the client, until the client says how many it sent and they all arrived. A
    /// perftest client gets no credits (it relies on RNR retries), its messages are not
    /// checked, and it sends `-n` per QP.
    fn send_server(&self, ctx: &Context, size: usize, iters: u64, stream: &mut dyn Stream, peer: &mut Peer) -> Res<()> {
        let depth = self.pool_len(size, self.rx_depth);
        let pd = ProtectionDomain::new(ctx)?;
        let mut cq = CompletionQueue::new(ctx, (depth + CREDIT_SLOTS) * self.f.qps)?;
        let mut lanes = self.rx_lanes(&pd, &cq, size, depth, stream, peer)?;
        for lane in &mut lanes {
            lane.credit()?;
        }
        let verify = !peer.is_perftest();
        let known = peer.is_perftest().then(|| vec![iters; lanes.len()]);
        let fault = std::thread::scope(|scope| -> Res<Option<String>> {
            // Our client's end of the run comes over the stream while this thread polls.
            let waiter = match known {
                Some(_) => None,
                None => Some(scope.spawn(|| client_counts(stream, self.f.qps as usize))),
            };
            let mut rx = Receiver { lanes: &mut lanes, want: pattern(size).collect(), size, verify, fault: None };
            rx.run(&mut cq, (depth / 4).max(1).into(), known, waiter)?;
            Ok(rx.fault)
        })?;
        if let Peer::Perftest(p) = peer {
            return p.close(stream);
        }
        let check = fault.map_or(Ok(()), |e| Err(format!("data check failed on {e}")));
        perftest::send_verdict(stream, check.is_ok())?;
        Ok(check?)
    }

    /// A send server's QP in INIT with `depth` receives of `size` posted, each buffer
    /// stamped with the complement of its message's number.
    fn rx_qp(
        &self,
        (pd, cq): (&ProtectionDomain, &CompletionQueue),
        size: usize,
        depth: u32,
        stream: &mut dyn Stream,
    ) -> Res<(QueuePair, RecvQueue<Chunk>)> {
        let builder = QueuePair::builder(pd, QpType::Rc, cq, cq).max_send_wr(CREDIT_SLOTS).max_recv_wr(depth);
        let c = &self.f.common;
        let qp = perftest::new_qp(stream, builder, c.cm_qp(&c.rts(), false))?;
        // A QP of -R is the CM's to move (siw reads it back as RESET all the same); the
        // client sends only once the exchange after the connections is over, when these
        // receives are posted.
        if stream.cm_link().is_none() {
            c.handshake(&qp, QpAccess::empty()).init()?;
        }
        let mut rq: RecvQueue<Chunk> = qp.recv_queue()?;
        let bufs = pd.register(AlignedBuf::new(size * depth as usize)?, AccessFlags::LOCAL_WRITE)?;
        for (i, mut b) in bufs.into_chunks(size)?.into_iter().enumerate() {
            put_stamp(&mut b, !(i as u64 + 1));
            rq.post(b, 0..size, 0)?;
        }
        Ok((qp, rq))
    }

    /// The send server's QPs, each with `depth` receives posted (stamped so that a buffer
    /// no message overwrote fails the check) before it is connected.
    fn rx_lanes(
        &self,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        size: usize,
        depth: u32,
        stream: &mut dyn Stream,
        peer: &mut Peer,
    ) -> Res<Vec<RxLane>> {
        let qps = (0..self.f.qps).map(|_| self.rx_qp((pd, cq), size, depth, stream)).collect::<Res<Vec<_>>>()?;
        let offers: Vec<Offer> = qps
            .iter()
            .map(|(qp, _)| Offer { qp, access: QpAccess::empty(), mr: None, rts: self.f.common.rts() })
            .collect();
        let remotes = peer.connect(&self.f.common, Shape::SEND, &offers, 8, stream)?;
        let ours = !peer.is_perftest();
        let mut lanes = Vec::with_capacity(qps.len());
        for ((qp, rq), mr) in qps.into_iter().zip(remotes) {
            let peer = match mr {
                _ if !ours => None,
                Some(mr) if mr.len >= 8 => Some(mr.slice(0..8)?),
                _ => return Err("the client advertised no 8-byte credit word: is it send_bw?".into()),
            };
            let credit_bufs =
                pd.register(AlignedBuf::new(8 * CREDIT_SLOTS as usize)?, AccessFlags::LOCAL_WRITE)?.into_chunks(8)?;
            let sq = qp.send_queue()?;
            lanes.push(RxLane {
                rq,
                sq,
                credit_bufs,
                peer,
                posted: u64::from(depth),
                credited: 0,
                received: 0,
                _qp: qp,
            });
        }
        Ok(lanes)
    }

    // ---- the client ----------------------------------------------------------------

    /// The client's side of one size: runs, meets the server, exchanges the verdict
    /// (with a perftest server: perftest's end instead).
    fn client(&self, ctx: &Context, size: usize, iters: u64, stream: &mut dyn Stream, peer: &mut Peer) -> Res<BwRow> {
        let result = match self.test {
            BwTest::Write => self.write_run(ctx, size, iters, stream, peer),
            BwTest::Read => self.read_run(ctx, size, iters, stream, peer),
            BwTest::Send => self.send_run(ctx, size, iters, stream, peer),
        };
        if let Peer::Perftest(p) = peer {
            // The QPs (in `out`) live until perftest's end, as perftest's own do.
            let out = result?;
            match self.test {
                BwTest::Send => p.close(stream)?,
                BwTest::Write | BwTest::Read => drop(p.end_bw(stream, &self.report(&out.row))?),
            }
            return Ok(out.row);
        }
        perftest::barrier(stream, result.is_ok())?;
        let out = result?;
        match self.test {
            BwTest::Read => {
                perftest::send_verdict(stream, out.check.is_ok())?;
                out.check?;
            }
            BwTest::Write | BwTest::Send => self.server_verdict(size, &out, stream)?,
        }
        Ok(out.row)
    }

    /// write and send: tells the server how many were sent (send), reads its verdict.
    fn server_verdict(&self, size: usize, out: &Outcome, stream: &mut dyn Stream) -> Res<()> {
        if self.test == BwTest::Send {
            let bytes: Vec<u8> = out.posted.iter().flat_map(|n| n.to_le_bytes()).collect();
            stream
                .write_all(&bytes)
                .and_then(|()| stream.flush())
                .map_err(|e| format!("telling the server how many messages were sent: {e}"))?;
        }
        if !perftest::read_verdict(stream)? {
            let verb = if self.test == BwTest::Write { "written" } else { "sent" };
            return Err(format!(
                "the server's data check failed at {size} B: what arrived differs from what was {verb} \
                 (its log says where)"
            )
            .into());
        }
        Ok(())
    }

    /// This side's row as perftest's report, in the units this side prints.
    fn report(&self, row: &BwRow) -> BwReport {
        let unit = |mib: f64| if self.f.report_gbits { mib * f64::from(1 << 20) * 8.0 / 1e9 } else { mib };
        BwReport {
            size: row.bytes as u64,
            iters: row.iterations,
            bw_peak: unit(row.bw_peak_mib_s),
            bw_avg: unit(row.bw_avg_mib_s),
            msg_rate: row.msg_rate_mpps,
        }
    }

    /// The client's QPs (`-q`, each `-t` deep), built with `extra(qp)` (what it
    /// advertises, kept alive with it) and connected to the server's; with each, the
    /// server's region checked to hold `size` bytes (or the credit word, send).
    #[allow(clippy::type_complexity)]
    fn client_qps<X>(
        &self,
        (pd, cq): (&ProtectionDomain, &CompletionQueue),
        (size, rts): (usize, RtsAttr),
        extra: impl Fn() -> Res<(X, Option<RemoteMr>)>,
        stream: &mut dyn Stream,
        peer: &mut Peer,
    ) -> Res<Vec<(QueuePair, X, RemoteMr)>> {
        let mut qps = Vec::with_capacity(self.f.qps as usize);
        let how = self.f.common.cm_qp(&rts, self.test == BwTest::Read);
        for _ in 0..self.f.qps {
            let builder = QueuePair::builder(pd, QpType::Rc, cq, cq).max_send_wr(self.f.tx_depth).max_recv_wr(1);
            let qp = perftest::new_qp(stream, builder, how)?;
            let (x, mr) = extra()?;
            qps.push((qp, x, mr));
        }
        let (shape, access) = match self.test {
            BwTest::Send => (Shape::SEND, QpAccess::REMOTE_WRITE),
            _ => (Shape::RDMA_BW, QpAccess::empty()),
        };
        let offers: Vec<Offer> = qps.iter().map(|(qp, _, mr)| Offer { qp, access, mr: *mr, rts }).collect();
        let remotes = peer.connect(&self.f.common, shape, &offers, size as u64, stream)?;
        let send = self.test == BwTest::Send;
        qps.into_iter()
            .zip(remotes)
            .map(|((qp, x, _), mr)| {
                // send_bw's server advertises nothing to our client; perftest's its buffer.
                let remote = match send {
                    true => RemoteMr { addr: 0, len: 0, rkey: 0 },
                    false => perftest::check_remote(mr, size)?,
                };
                Ok((qp, x, remote))
            })
            .collect()
    }

    /// RDMA WRITEs of one registered source, shared by every request.
    fn write_run(
        &self,
        ctx: &Context,
        size: usize,
        iters: u64,
        stream: &mut dyn Stream,
        peer: &mut Peer,
    ) -> Res<Outcome> {
        let pd = ProtectionDomain::new(ctx)?;
        // Each QP's queues complete here: tx_depth sends and its one receive (build() checks).
        let mut cq = CompletionQueue::new(ctx, (self.f.tx_depth + 1) * self.f.qps)?;
        let mut src = pd.register(AlignedBuf::new(size)?, AccessFlags::LOCAL_WRITE)?.into_chunks(size)?.remove(0);
        for (b, p) in src.iter_mut().zip(pattern(size)) {
            *b = p;
        }
        let src = Arc::new(src);
        let qps = self.client_qps((&pd, &cq), (size, self.f.common.rts()), || Ok(((), None)), stream, peer)?;
        let mut lanes = Vec::with_capacity(qps.len());
        for (qp, (), remote) in qps {
            // Each request's id is its place in the window: a failure names it.
            let wrs = (0..self.f.tx_depth).map(|i| SendWr::write(Arc::clone(&src), 0..size, remote).id(u64::from(i)));
            lanes.push(Lane::new(qp, wrs, |free| WriteSrc { free })?);
        }
        let m = self.post_loop(&mut cq, &mut lanes, size, iters, self.f.tx_depth)?;
        Ok(self.outcome(size, m, lanes, Ok(())))
    }

    /// RDMA READs into a pool of buffers, each checked at the end.
    fn read_run(
        &self,
        ctx: &Context,
        size: usize,
        iters: u64,
        stream: &mut dyn Stream,
        peer: &mut Peer,
    ) -> Res<Outcome> {
        let pd = ProtectionDomain::new(ctx)?;
        let mut cq = CompletionQueue::new(ctx, (self.f.tx_depth + 1) * self.f.qps)?;
        let pool = self.pool_len(size, self.f.tx_depth);
        // RtsAttr's max_rd_atomic is a u8; -o is at most MAX_OUTS (checked).
        let rts = RtsAttr { max_rd_atomic: u8::try_from(self.outs).unwrap_or(u8::MAX), ..self.f.common.rts() };
        let qps = self.client_qps((&pd, &cq), (size, rts), || Ok(((), None)), stream, peer)?;
        let mut lanes = Vec::with_capacity(qps.len());
        for (qp, (), remote) in qps {
            let bufs = pd.register(AlignedBuf::new(size * pool as usize)?, AccessFlags::LOCAL_WRITE)?;
            let wrs = bufs.into_chunks(size)?.into_iter().enumerate();
            let wrs = wrs.map(|(i, b)| SendWr::read(b, 0..size, remote).id(i as u64));
            lanes.push(Lane::new(qp, wrs, |free| ReadSrc { total: free.len(), low: free.len(), free })?);
        }
        let m = self.post_loop(&mut cq, &mut lanes, size, iters, pool)?;
        // perftest serves bytes of its own: nothing to check them against.
        let check = match peer {
            Peer::Perftest(_) => Ok(()),
            Peer::Ours => {
                let want: Vec<u8> = pattern(size).collect();
                lanes.iter().enumerate().try_for_each(|(q, l)| l.src.check(q, &want))
            }
        };
        Ok(self.outcome(size, m, lanes, check))
    }

    /// SENDs from a pool of buffers, each stamped with its message's number, never more
    /// than the server's credit word allows (a perftest server writes none: the word is
    /// set to "no limit", and RNR retries wait for its receives, as perftest's client
    /// does).
    fn send_run(
        &self,
        ctx: &Context,
        size: usize,
        iters: u64,
        stream: &mut dyn Stream,
        peer: &mut Peer,
    ) -> Res<Outcome> {
        let pd = ProtectionDomain::new(ctx)?;
        let mut cq = CompletionQueue::new(ctx, (self.f.tx_depth + 1) * self.f.qps)?;
        let pool = self.pool_len(size, self.f.tx_depth);
        let unlimited = peer.is_perftest();
        let credit_word = || -> Res<_> {
            let credit =
                pd.register_remote_writable(AlignedBuf::new(8)?, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
            if unlimited {
                credit.atomic_u64(0)?.store(u64::MAX, Ordering::Release);
            }
            let remote = credit.remote()?;
            Ok((credit, Some(remote)))
        };
        let rts =
            RtsAttr { rnr_retry: if unlimited { 7 } else { RtsAttr::default().rnr_retry }, ..self.f.common.rts() };
        let qps = self.client_qps((&pd, &cq), (size, rts), credit_word, stream, peer)?;
        let mut lanes = Vec::with_capacity(qps.len());
        for (qp, credit, _) in qps {
            let bufs = pd.register(AlignedBuf::new(size * pool as usize)?, AccessFlags::LOCAL_WRITE)?;
            let mut bufs = bufs.into_chunks(size)?;
            for b in &mut bufs {
                for (b, p) in b.iter_mut().zip(pattern(size)) {
                    *b = p;
                }
            }
            let wrs = bufs.into_iter().enumerate().map(|(i, b)| SendWr::send(b, 0..size).id(i as u64));
            lanes.push(Lane::new(qp, wrs, |free| SendSrc { free, credit })?);
        }
        let m = self.post_loop(&mut cq, &mut lanes, size, iters, pool)?;
        Ok(self.outcome(size, m, lanes, Ok(())))
    }

    fn outcome<S: Source + 'static>(&self, size: usize, m: Measured, lanes: Vec<Lane<S>>, check: Res<()>) -> Outcome {
        let avg = m.finished as f64 * size as f64 / m.secs;
        let row = BwRow {
            bytes: size,
            iterations: m.finished / u64::from(self.f.qps),
            bw_peak_mib_s: m.peak.max(avg) / f64::from(1 << 20),
            bw_avg_mib_s: avg / f64::from(1 << 20),
            msg_rate_mpps: m.finished as f64 / m.secs / 1e6,
        };
        Outcome { row, posted: lanes.iter().map(|l| l.posted).collect(), check, _lanes: Box::new(lanes) }
    }

    /// The posting loop: keeps every lane's send queue at most `-t` deep (and within
    /// what its source allows, at most `depth`), posts `-l` requests per call, signals
    /// one in `-Q`, polls the shared CQ, and runs for `-n` requests per QP or `-D`
    /// seconds. Returns how many completed, over how long, and the best window.
    fn post_loop<S: Source>(
        &self,
        cq: &mut CompletionQueue,
        lanes: &mut [Lane<S>],
        size: usize,
        iters: u64,
        depth: u32,
    ) -> Res<Measured> {
        let o = &self.f;
        // A pool source frees its buffers only on a signaled completion: signal within it.
        let moderation = u64::from(self.cq_mod(size).min(depth));
        let deadline = o.duration.map(Duration::from_secs_f64);
        let limit = if deadline.is_some() { u64::MAX } else { iters };
        let plan = Plan { moderation, tx_depth: o.tx_depth as usize, post_list: u64::from(o.post_list), limit };
        let mut meter = Meter::start(size, moderation.max(u64::from(o.tx_depth)));
        let started = Instant::now();
        let mut wcs = [WorkCompletion::EMPTY; 64];
        let total_target = iters * u64::from(o.qps);
        let mut finished = 0u64;
        let mut stop_posting = false;
        let mut quiet_since: Option<Instant> = None;
        let mut idle = 0u32;

        loop {
            if let Some(d) = deadline {
                stop_posting = stop_posting || started.elapsed() >= d;
            }
            post_all(lanes, &plan, stop_posting)?;
            let (n, done) = reap(cq, lanes, &mut wcs)?;
            finished += done;
            if n > 0 {
                quiet_since = None;
                if meter.completed(finished) && !o.quiet {
                    self.report_progress(finished, total_target, started);
                }
            } else {
                idle = idle.wrapping_add(1);
                if idle % 4096 == 0 {
                    let waits = || lanes.iter().map(|l| l.src.waiting(l.posted)).collect::<Vec<_>>().join(", ");
                    self.check_stall(&mut quiet_since, finished, total_target, waits)?;
                }
            }
            if deadline.is_some() {
                if stop_posting && lanes.iter().all(|l| l.sq.outstanding() == 0) {
                    break;
                }
            } else if finished >= total_target {
                break;
            }
        }
        Ok(Measured { finished, secs: started.elapsed().as_secs_f64(), peak: meter.peak })
    }

    /// An error once no completion came for [`STALL`].
    fn check_stall(
        &self,
        quiet_since: &mut Option<Instant>,
        finished: u64,
        total: u64,
        waits: impl FnOnce() -> String,
    ) -> Res<()> {
        let now = Instant::now();
        match *quiet_since {
            None => *quiet_since = Some(now),
            Some(t) if now.duration_since(t) > STALL => {
                let why = match self.test {
                    BwTest::Send => format!(" (no credit from the server: is it still receiving? {})", waits()),
                    _ => " (is the server still running?)".to_owned(),
                };
                let of = if self.f.duration.is_some() { String::new() } else { format!(" of {total}") };
                return Err(
                    format!("no completion for {STALL:?}: {finished}{of} {} completed{why}", self.test.noun()).into()
                );
            }
            Some(_) => {}
        }
        Ok(())
    }

    fn report_progress(&self, finished: u64, total: u64, started: Instant) {
        match self.f.duration {
            Some(d) => eprintln!("{}: {:.0} of {d} s", self.name, started.elapsed().as_secs_f64()),
            None => eprintln!(
                "{}: {finished} of {total} {} ({:.0}%)",
                self.name,
                self.test.noun(),
                finished as f64 * 100.0 / total as f64
            ),
        }
    }

    fn print_header(&self, ctx: &Context, role: &Role) {
        let o = &self.f;
        println!("{}", perftest::rule());
        println!("                    {}", self.test.title());
        println!(" Device         : {}", ctx.name());
        println!(" Number of qps  : {}\t\tTransport type : IB", o.qps);
        println!(" Connection type : RC\t\tUsing SRQ      : OFF");
        println!(" TX depth        : {}", o.tx_depth);
        match self.test {
            BwTest::Read => println!(" Outstand reads  : {}", self.outs),
            BwTest::Send => println!(" RX depth        : {}", self.rx_depth),
            BwTest::Write => {}
        }
        println!(" CQ Moderation   : {}", o.cq_mod.map_or("100 (1 above 8 KiB)".into(), |m| m.to_string()));
        println!(" Post List       : {}", o.post_list);
        println!(" Mode            : {}", role.describe());
        println!("{}", perftest::rule());
        perftest::print_bw_header(o.report_gbits);
    }
}

/// Posts on every lane what it may (or, once a timed run stops posting, its tail).
#[inline]
fn post_all<S: Source>(lanes: &mut [Lane<S>], plan: &Plan, stop_posting: bool) -> Res<()> {
    for lane in lanes.iter_mut() {
        if stop_posting {
            lane.post_tail(plan)?;
        } else {
            lane.post_ready(plan)?;
        }
    }
    Ok(())
}

/// Polls the shared CQ once and hands each completion back to its lane's source:
/// how many completions came, and how many requests they finished.
#[inline]
fn reap<S: Source>(
    cq: &mut CompletionQueue,
    lanes: &mut [Lane<S>],
    wcs: &mut [WorkCompletion; 64],
) -> Res<(usize, u64)> {
    let n = cq.poll(wcs)?.len();
    let mut finished = 0u64;
    for wc in &mut wcs[..n] {
        // One lane: its queue's own check (QP number, tag, outstanding) refuses a
        // stranger's completion, so there is nothing to look up.
        let lane = match lanes {
            [one] => one,
            _ => lanes.iter_mut().find(|l| l.sq.qp_num() == wc.qp_num()).ok_or("completion of an unknown QP")?,
        };
        let (src, mut failed) = (&mut lane.src, None);
        finished += lane.sq.complete(wc, |d| match d.result() {
            Ok(d) => src.done(d),
            // Names the operation, the request's id and the QP.
            Err(e) => failed = Some(rdma_verbs::Error::from(e)),
        })? as u64;
        if let Some(e) = failed {
            return Err(e.into());
        }
    }
    Ok((n, finished))
}

/// The best window of a run and the pace of its progress lines. They read the CPU's
/// counter, not the system clock: where that is not in the vDSO (a VM without a stable
/// TSC) each reading is a system call, and at 64 KiB every completion would pay one.
struct Meter {
    clock: &'static perftest::Clock,
    size: usize,
    /// Ticks in a second.
    second: u64,
    /// Completions a window spans at least: a full pipeline (tx depth); shorter windows
    /// only measure how completions bunch up.
    window: u64,
    /// When the current window started, and how many had completed then.
    last: (u64, u64),
    /// Best window, bytes a second.
    peak: f64,
    progress_at: u64,
}

impl Meter {
    fn start(size: usize, window: u64) -> Meter {
        static CLOCK: std::sync::OnceLock<perftest::Clock> = std::sync::OnceLock::new();
        let clock = CLOCK.get_or_init(perftest::Clock::calibrate);
        let second = clock.ticks(Duration::from_secs(1));
        let now = clock.now();
        Meter { clock, size, second, window, last: (now, 0), peak: 0.0, progress_at: now + 3 * second }
    }

    /// After completions, `finished` in all: closes the window once it is long enough.
    /// True when a progress line is due (after 3 s, then every second).
    #[inline]
    fn completed(&mut self, finished: u64) -> bool {
        if finished - self.last.1 < self.window {
            return false;
        }
        let now = self.clock.now();
        let dt = self.clock.us(now.wrapping_sub(self.last.0)) / 1e6;
        if dt > 0.0 {
            self.peak = self.peak.max((finished - self.last.1) as f64 * self.size as f64 / dt);
        }
        self.last = (now, finished);
        if now < self.progress_at {
            return false;
        }
        self.progress_at = now + self.second;
        true
    }
}

// ---- what the client posts -----------------------------------------------------------

/// One client QP and what its requests are made of.
struct Lane<S: Source> {
    sq: PreparedSendQueue<S::Buf>,
    src: S,
    posted: u64,
    /// The number (from 1) of the last signaled request posted.
    last_signaled: u64,
    // Whether the last posted request was signaled: an unsignaled tail completes only
    // behind a signaled one, so a timed run ends with one more signaled request.
    tail_signaled: bool,
    /// The number of the next request the moderation signals: the first multiple of
    /// `-Q` after `posted` (kept, not divided out for every request).
    next_mark: u64,
    _qp: QueuePair,
}

/// How a client posts, fixed for a run.
struct Plan {
    /// Every `moderation`th request is signaled (`-Q`).
    moderation: u64,
    /// Requests in flight at most (`-t`).
    tx_depth: usize,
    /// Requests in one post (`-l`).
    post_list: u64,
    /// Requests to post (`u64::MAX` for a timed run).
    limit: u64,
}

impl<S: Source> Lane<S> {
    /// The lane of `qp`, its requests `wrs` prepared once and handed to its source.
    fn new(
        qp: QueuePair,
        wrs: impl Iterator<Item = SendWr<S::Buf>>,
        src: impl FnOnce(Vec<PreparedSend<S::Buf>>) -> S,
    ) -> Res<Self> {
        let sq = qp.prepared_send_queue()?;
        let free = wrs.map(|wr| sq.prepare(wr).map_err(|r| rdma_verbs::Error::from(r).into())).collect::<Res<_>>()?;
        Ok(Lane { sq, src: src(free), posted: 0, last_signaled: 0, tail_signaled: true, next_mark: 0, _qp: qp })
    }

    /// Posts while the send queue has room for a whole post list (perftest waits for that
    /// too) and the source has requests. Signals every `moderation`th request, the last
    /// one, and one more whenever the lane could not post again without a completion.
    #[inline]
    fn post_ready(&mut self, plan: &Plan) -> Res<()> {
        let Plan { moderation, tx_depth, post_list, limit } = *plan;
        if self.next_mark <= self.posted {
            self.next_mark = (self.posted / moderation + 1) * moderation;
        }
        while self.posted < limit {
            let outstanding = self.sq.outstanding();
            let room = (tx_depth - outstanding) as u64;
            let left = limit - self.posted;
            if post_list == 1 {
                // A post list of one (the default): as many as fit, each posted alone.
                let burst = room.min(left).min(self.src.available(self.posted) as u64);
                if burst == 0 {
                    break;
                }
                // Nothing is left to post after a burst: it took the room, what is left to
                // post, or what the source had (or the source ran dry).
                self.post_singles(plan, burst, room, outstanding as u64)?;
                break;
            }
            let want = post_list.min(left);
            if room < want {
                break; // wait for a whole post list's room, as perftest does
            }
            let k = want.min(self.src.available(self.posted) as u64);
            if k == 0 {
                break;
            }
            let (first, end) = (self.posted, self.posted + k);
            // A request in flight must be signaled whenever the lane cannot post again
            // without a completion (send queue or buffers full), or none would ever come:
            // the moderation's own signals may all be further on (a post list that does
            // not divide -t, a pool, credits).
            let stuck_after = left > k && (room - k < post_list.min(left - k) || self.src.buffers_free() <= k as usize);
            let signal_in_flight = self.last_signaled > first - outstanding as u64;
            let batch_signals = self.next_mark <= end || end >= limit;
            let force_last = stuck_after && !signal_in_flight && !batch_signals;
            let (src, mut mark, mut last_signaled) = (&mut self.src, self.next_mark, self.last_signaled);
            let wrs = (first + 1..end + 1).map_while(|n| {
                let at_mark = n == mark;
                if at_mark {
                    mark += moderation;
                }
                let signaled = at_mark || n == limit || (force_last && n == end);
                if signaled {
                    last_signaled = n;
                }
                src.next(n, signaled)
            });
            let posted = self.sq.post_batch(wrs).map_err(rdma_verbs::Error::from)? as u64;
            self.posted += posted;
            self.last_signaled = last_signaled;
            self.tail_signaled = last_signaled == self.posted;
            self.next_mark = if posted == k { mark } else { (self.posted / moderation + 1) * moderation };
        }
        Ok(())
    }

    /// Posts `burst` requests one at a time (a post list of one), `burst` being at most
    /// the queue's `room`, what is left to post and what the source has. The same signals
    /// as a batch: every `moderation`th, the run's last, and the burst's last when the
    /// lane could not post again without a completion and no signaled request would be
    /// in flight (only the burst's last can be in that place: the room, and a pool's
    /// buffers, run out there first).
    #[inline]
    fn post_singles(&mut self, plan: &Plan, burst: u64, room: u64, outstanding: u64) -> Res<()> {
        let Plan { moderation, limit, .. } = *plan;
        let (first, end) = (self.posted, self.posted + burst);
        let stuck_after =
            end < limit && (room == burst || self.src.buffers_free().saturating_sub(burst as usize - 1) <= 1);
        let signal_in_flight = self.last_signaled > first - outstanding || self.next_mark < end;
        let force_last = stuck_after && !signal_in_flight && self.next_mark != end;
        for n in first + 1..=end {
            let at_mark = n == self.next_mark;
            let signaled = at_mark || n == limit || (force_last && n == end);
            let Some(p) = self.src.next(n, signaled) else { break };
            self.sq.post(p).map_err(rdma_verbs::Error::from)?;
            self.posted = n;
            if signaled {
                self.last_signaled = n;
            }
            self.tail_signaled = signaled;
            if at_mark {
                self.next_mark += moderation;
            }
        }
        Ok(())
    }

    /// A timed run's end: an unsignaled tail completes only behind a signaled request, so
    /// one more, signaled, goes after it.
    fn post_tail(&mut self, plan: &Plan) -> Res<()> {
        if !self.tail_signaled && self.sq.outstanding() < plan.tx_depth && self.src.available(self.posted) > 0 {
            if let Some(p) = self.src.next(self.posted + 1, true) {
                self.sq.post(p).map_err(rdma_verbs::Error::from)?;
                self.posted += 1;
                self.last_signaled = self.posted;
                self.tail_signaled = true;
            }
        }
        Ok(())
    }
}

/// Hands out a lane's prepared requests and takes them back.
trait Source {
    /// What a request lends to the send queue.
    type Buf: SendBuf;
    /// How many more requests may be posted now, `posted` being posted so far (the
    /// send queue's room is the loop's business).
    fn available(&self, posted: u64) -> usize;
    /// A free request for message `n` (from 1) of the lane; `None` when none is free.
    fn take(&mut self, n: u64) -> Option<PreparedSend<Self::Buf>>;
    /// [`take`](Self::take), signaled or not.
    fn next(&mut self, n: u64, signaled: bool) -> Option<PreparedSend<Self::Buf>> {
        let mut p = self.take(n)?;
        p.set_signaled(signaled);
        Some(p)
    }
    /// A request finished: it is free again.
    fn done(&mut self, done: Done<PreparedSend<Self::Buf>>);
    /// Buffers free for requests (a pool's; `usize::MAX` when requests share one).
    fn buffers_free(&self) -> usize {
        usize::MAX
    }
    /// What a stuck lane waits for, for the error message.
    fn waiting(&self, posted: u64) -> String {
        format!("{posted} posted")
    }
}

/// write_bw: every request writes the same source into the server's region; one per
/// request in flight (`-t`), so one is free whenever the queue has room.
struct WriteSrc {
    free: Vec<PreparedSend<Arc<Chunk>>>,
}

impl Source for WriteSrc {
    type Buf = Arc<Chunk>;

    fn available(&self, _posted: u64) -> usize {
        self.free.len()
    }

    #[inline]
    fn take(&mut self, _n: u64) -> Option<PreparedSend<Arc<Chunk>>> {
        self.free.pop()
    }

    fn done(&mut self, done: Done<PreparedSend<Arc<Chunk>>>) {
        self.free.push(done.value);
    }
}

/// read_bw: every request reads the server's region into its own buffer of the pool;
/// the ones used are checked at the end.
struct ReadSrc {
    /// A stack: taken from the top, given back on top. So the entries below `low`, the
    /// least it ever held, were never taken, and at the end the ones from `low` up are
    /// exactly those used (a mark a request would cost a load from its heap block).
    free: Vec<PreparedSend<Chunk>>,
    low: usize,
    total: usize,
}

impl Source for ReadSrc {
    type Buf = Chunk;

    fn available(&self, _posted: u64) -> usize {
        self.free.len()
    }

    fn buffers_free(&self) -> usize {
        self.free.len()
    }

    #[inline]
    fn take(&mut self, _n: u64) -> Option<PreparedSend<Chunk>> {
        let p = self.free.pop()?;
        self.low = self.low.min(self.free.len());
        Some(p)
    }

    fn done(&mut self, done: Done<PreparedSend<Chunk>>) {
        self.free.push(done.value);
    }
}

impl ReadSrc {
    /// Every buffer a READ landed in holds the server's pattern.
    fn check(&self, q: usize, want: &[u8]) -> Res<()> {
        if self.free.len() < self.total {
            return Err(format!("QP {q}: {} read buffers never came back", self.total - self.free.len()).into());
        }
        for (i, p) in self.free[self.low..].iter().map(|p| (p.id(), p)) {
            let got: &[u8] = p.buf();
            if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
                return Err(format!(
                    "data check failed on QP {q}: byte {at} of {} read into buffer {i} is {:#04x}, the pattern has {:#04x}",
                    want.len(),
                    got[at],
                    want[at]
                )
                .into());
            }
        }
        Ok(())
    }
}

/// send_bw: every request sends a free buffer of the pool, stamped with its number;
/// the server's credit word says how many may be sent in all.
struct SendSrc {
    free: Vec<PreparedSend<Chunk>>,
    credit: MemoryRegion<AlignedBuf, RemoteWritable>,
}

impl Source for SendSrc {
    type Buf = Chunk;

    fn available(&self, posted: u64) -> usize {
        // Aligned 8 bytes (checked when the lane was made), written whole by the server's WRITE.
        let granted = self.credit.atomic_u64(0).map_or(0, |w| u64::from_le(w.load(Ordering::Acquire)));
        let credits = usize::try_from(granted.saturating_sub(posted)).unwrap_or(usize::MAX);
        credits.min(self.free.len())
    }

    fn buffers_free(&self) -> usize {
        self.free.len()
    }

    #[inline]
    fn take(&mut self, n: u64) -> Option<PreparedSend<Chunk>> {
        let mut p = self.free.pop()?;
        put_stamp(p.bytes_mut(), n);
        Some(p)
    }

    fn done(&mut self, done: Done<PreparedSend<Chunk>>) {
        self.free.push(done.value);
    }

    fn waiting(&self, posted: u64) -> String {
        let granted = self.credit.atomic_u64(0).map_or(0, |w| u64::from_le(w.load(Ordering::Acquire)));
        format!("{posted} sent, {granted} allowed, {} buffers free", self.free.len())
    }
}

// ---- the send server's queues --------------------------------------------------------

/// One server QP of send_bw: its receives, and the credit writes to the client.
struct RxLane {
    rq: RecvQueue<Chunk>,
    sq: SendQueue<Chunk>,
    credit_bufs: Vec<Chunk>,
    /// The client's credit word (none for a perftest client).
    peer: Option<RemoteMr>,
    /// Receives posted in all: how many messages the client may have sent.
    posted: u64,
    /// The last `posted` written to the client.
    credited: u64,
    received: u64,
    _qp: QueuePair,
}

impl RxLane {
    /// Writes `posted` into the client's credit word, when a credit buffer is free (else
    /// a later call does; the client waits).
    fn credit(&mut self) -> Res<()> {
        let Some(peer) = self.peer else {
            self.credited = self.posted;
            return Ok(());
        };
        let Some(mut buf) = self.credit_bufs.pop() else {
            return Ok(());
        };
        buf.copy_from_slice(&self.posted.to_le_bytes());
        self.sq.post(SendWr::write(buf, 0..8, peer))?;
        self.credited = self.posted;
        Ok(())
    }
}

/// The send server's polling loop over its lanes.
struct Receiver<'l> {
    lanes: &'l mut [RxLane],
    /// The pattern of one message.
    want: Vec<u8>,
    size: usize,
    /// Check every message (our client), or none (perftest's).
    verify: bool,
    /// The first bad message.
    fault: Option<String>,
}

impl Receiver<'_> {
    /// Until every lane has received what the client sent: `counts` known from the
    /// start (a perftest client: `-n` each), or read by `waiter` from our client once
    /// its run is over. Credits go out every `step` receives posted again.
    fn run(
        &mut self,
        cq: &mut CompletionQueue,
        step: u64,
        mut counts: Option<Vec<u64>>,
        mut waiter: Option<std::thread::ScopedJoinHandle<'_, Res<Vec<u64>>>>,
    ) -> Res<()> {
        let mut wcs = [WorkCompletion::EMPTY; 64];
        let mut quiet_since: Option<Instant> = None;
        let mut idle = 0u32;
        loop {
            if waiter.as_ref().is_some_and(|w| w.is_finished()) {
                let w = waiter.take().ok_or("no waiter")?;
                let got = w.join().map_err(|_| "the thread reading the client panicked")?;
                counts = Some(got.map_err(|e| format!("the client did not finish its run: {e}"))?);
            }
            if let Some(c) = &counts {
                if self.lanes.iter().zip(c).all(|(l, &n)| l.received >= n) {
                    return Ok(());
                }
            }
            let n = cq.poll(&mut wcs)?.len();
            for wc in &mut wcs[..n] {
                self.take(wc)?;
            }
            for lane in self.lanes.iter_mut() {
                if lane.posted - lane.credited >= step {
                    lane.credit()?;
                }
            }
            if n > 0 {
                quiet_since = None;
                continue;
            }
            idle = idle.wrapping_add(1);
            if let (0, Some(c)) = (idle % 4096, &counts) {
                self.check_stall(&mut quiet_since, c)?;
            }
        }
    }

    /// One completion: a credit write done, or a message received (checked, its buffer
    /// stamped and posted again).
    fn take(&mut self, wc: &mut WorkCompletion) -> Res<()> {
        let (q, lane) = self
            .lanes
            .iter_mut()
            .enumerate()
            .find(|(_, l)| l.rq.qp_num() == wc.qp_num())
            .ok_or("completion of an unknown QP")?;
        if !wc.opcode().is_recv() {
            let (free, mut failed) = (&mut lane.credit_bufs, None);
            lane.sq.complete(wc, |d| match d.result() {
                Ok(d) => free.push(d.value),
                Err(e) => failed = Some(rdma_verbs::Error::from(e)),
            })?;
            return failed.map_or(Ok(()), |e| Err(e.into()));
        }
        // A failure names the receive, its id and the QP.
        let mut done = lane.rq.complete(wc)?.result()?;
        lane.received += 1;
        if self.verify && self.fault.is_none() {
            self.fault = check_message(&done, &self.want, lane.received).err().map(|e| format!("QP {q}, {e}"));
        }
        put_stamp(&mut done.value, !(lane.posted + 1));
        lane.rq.post(done.value, 0..self.size, 0)?;
        lane.posted += 1;
        Ok(())
    }

    /// An error once nothing arrived for [`STALL`] though the client sent more.
    fn check_stall(&self, quiet_since: &mut Option<Instant>, counts: &[u64]) -> Res<()> {
        let now = Instant::now();
        match *quiet_since {
            None => *quiet_since = Some(now),
            Some(t) if now.duration_since(t) > STALL => {
                let got: Vec<u64> = self.lanes.iter().map(|l| l.received).collect();
                return Err(
                    format!("the client sent {counts:?} messages per QP, {got:?} arrived within {STALL:?}").into()
                );
            }
            Some(_) => {}
        }
        Ok(())
    }
}

/// The server's thread on the stream: meets the client at the end of its run, then
/// reads how many messages it sent on each QP.
fn client_counts(stream: &mut dyn Stream, qps: usize) -> Res<Vec<u64>> {
    perftest::barrier(stream, true)?;
    let mut bytes = vec![0u8; 8 * qps];
    stream.read_exact(&mut bytes).map_err(|e| format!("reading how many messages the client sent: {e}"))?;
    Ok(bytes.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default())).collect())
}

// ---- the data ------------------------------------------------------------------------

/// What a client writes or sends, what a read_bw server serves. Several bits of the size
/// go in, so that a region of another size never matches.
fn pattern(size: usize) -> impl Iterator<Item = u8> + Clone {
    let salt = (size ^ (size >> 8) ^ (size >> 16) ^ (size >> 24)) as u8;
    (0..size).map(move |i| (i as u8).wrapping_mul(13).wrapping_add(salt))
}

/// Every region holds the pattern of `size` (write_bw's server).
fn check_regions<'a>(
    regions: impl Iterator<Item = &'a MemoryRegion<AlignedBuf, RemoteWritable>>,
    size: usize,
) -> Res<()> {
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

/// Where a send_bw message carries its number: its first 8 bytes (fewer in a shorter
/// message) and, from 16 bytes on, its last 8.
fn stamp_spans(size: usize) -> [Range<usize>; 2] {
    [0..size.min(8), if size >= 16 { size - 8..size } else { 0..0 }]
}

/// Writes the (little-endian) number `n` into the stamp spans of `buf`.
fn put_stamp(buf: &mut [u8], n: u64) {
    let bytes = n.to_le_bytes();
    for span in stamp_spans(buf.len()) {
        let len = span.len();
        buf[span].copy_from_slice(&bytes[..len]);
    }
}

/// A received message is `want.len()` bytes of the pattern stamped with `n`.
fn check_message(done: &Done<Chunk>, want: &[u8], n: u64) -> Result<(), String> {
    let size = want.len();
    if done.byte_len as usize != size {
        return Err(format!("message {n}: {} bytes arrived, {size} expected", done.byte_len));
    }
    let got: &[u8] = &done.value;
    let [head, tail] = stamp_spans(size);
    let body = head.end..if tail.is_empty() { size } else { tail.start };
    let stamp = n.to_le_bytes();
    let stamp_ok = [&head, &tail].iter().all(|s| got[(*s).clone()] == stamp[..s.len()]);
    if stamp_ok && got[body.clone()] == want[body.clone()] {
        return Ok(());
    }
    let mut expect = want.to_vec();
    put_stamp(&mut expect, n);
    let at = got.iter().zip(&expect).position(|(a, b)| a != b).unwrap_or(0);
    Err(format!(
        "message {n}: byte {at} of {size} is {:#04x}, expected {:#04x} (the pattern, the message's number in \
         the first and last 8 bytes)",
        got[at], expect[at]
    ))
}
