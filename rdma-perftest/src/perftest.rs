//! What the perftest-style tools (`write_bw`, `write_lat`, `send_lat`, `read_lat`) share:
//! the common flags, the device and size checks, the out-of-band exchange, the clock, the
//! latency statistics and the printing of perftest's tables. The latency tools are thin
//! `main`s over [`lat_main`].
//!
//! Over TCP the exchange starts as perftest's ([`crate::oob`]: versions, system data,
//! MTU), so each tool talks to perftest's tool of the same name. With a perftest peer it
//! goes on as perftest's (its destination messages, barriers and end); between two of
//! ours, and over the Unix socket pair of `--loopback`, it goes on in the library's own
//! format (`rdma_verbs::endpoint`): one [`Handshake`] per QP, then the handshake's status
//! message as a barrier where both sides must meet.
//!
//! write_lat's server sends the first message, as `ib_write_lat`'s does, so the client's
//! samples are the `-n` - 1 round trips between the messages it received.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{CommandFactory, FromArgMatches};
use rdma_verbs::wire::{self, Status};
use rdma_verbs::Handshake;

use crate::cm::{CmLink, CmQp};
use crate::oob::{self, Offer, Peer, Shape};
use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, MemoryRegion, PreparedSend, PreparedSendQueue, QpAccess,
    QpType, QueuePair, QueuePairBuilder, RecvQueue, RemoteMr, RemoteWritable, RtsAttr, SendWr, WorkCompletion,
};

/// Any error of a tool: a message for stderr.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A tool's result.
pub type Res<T> = Result<T, BoxError>;

/// Largest size `-a` runs (perftest's 8 MiB).
pub const MAX_ALL_SIZE: usize = 1 << 23;
/// perftest's TCP port.
pub const DEFAULT_PORT: u16 = 18515;
/// How long a latency side waits for the peer's next message before it gives up.
const PEER_SILENCE: Duration = Duration::from_secs(20);

/// The flags every tool takes, named as perftest names them.
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// Device name (default: the first device).
    #[arg(short = 'd', long = "ib-dev")]
    pub device: Option<String>,
    /// GID index (default: RoCE v2 with an IPv4 address, or 0 on InfiniBand).
    #[arg(short = 'x', long = "gid-index")]
    pub gid_index: Option<u32>,
    /// Port of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// Message size in bytes.
    #[arg(short = 's', long = "size")]
    pub size: Option<usize>,
    /// Run all sizes, 2 B to 8 MiB, powers of two.
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Iterations (per QP).
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// TCP port of the exchange (server/client mode).
    #[arg(short = 'p', long = "port", default_value_t = DEFAULT_PORT)]
    pub tcp_port: u16,
    /// QP timeout, perftest's `-u`: an RC request unacknowledged for 4.096 us * 2^N is
    /// sent again (0..=31; 0 waits forever).
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14, value_parser = clap::value_parser!(u8).range(0..=31))]
    pub qp_timeout: u8,
    /// Server and client in one process on one device (two QPs, two threads).
    #[arg(long)]
    pub loopback: bool,
    /// perftest's rdma_cm mode: the test's QPs connected through rdma_cm, the exchange
    /// over an rdma_cm connection on port -p (the only way on iWARP). The host is then
    /// the IP address of the server's RDMA netdev, and the device the one rdma_cm picks.
    #[arg(short = 'R', long = "rdma_cm")]
    pub rdma_cm: bool,
    /// One JSON object per size on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// The server to connect to (client mode); without it, this is the server.
    pub host: Option<String>,
}

/// Which end of the test this process is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Both ends, in two threads.
    Loopback,
    /// Waits for a client on the TCP port.
    Server,
    /// Connects to this host.
    Client(String),
}

impl Role {
    /// For the header of the table.
    pub fn describe(&self) -> String {
        match self {
            Role::Loopback => "loopback (one process)".to_owned(),
            Role::Server => "server".to_owned(),
            Role::Client(host) => format!("client of {host}"),
        }
    }
}

impl Common {
    /// Which end this process is.
    pub fn role(&self) -> Res<Role> {
        match (&self.host, self.loopback) {
            (_, true) if self.rdma_cm => {
                Err("--loopback runs both ends in one process; -R connects a server and a client: pick one".into())
            }
            (Some(h), true) => Err(format!("--loopback runs both ends: drop the host argument {h:?}").into()),
            (Some(h), false) => Ok(Role::Client(h.clone())),
            (None, true) => Ok(Role::Loopback),
            (None, false) => Ok(Role::Server),
        }
    }

    /// The sizes to run: `-s` (or the tool's default), or every power of two from 2 B to
    /// 8 MiB with `-a`. Nonsense is refused before any device is touched.
    pub fn sizes(&self, default: usize) -> Res<Vec<usize>> {
        match (self.all, self.size) {
            (true, Some(_)) => Err("-a runs every size: it cannot be combined with -s".into()),
            (_, Some(0)) => Err("size 0 (-s): a message must be at least 1 byte (perftest refuses 0 too)".into()),
            (true, None) => Ok((1..=23).map(|p| 1usize << p).collect()),
            (false, s) => Ok(vec![s.unwrap_or(default)]),
        }
    }

    /// The iteration count: `-n` or the tool's default; 0 is refused.
    pub fn iterations(&self, default: u64) -> Res<u64> {
        match self.iters.unwrap_or(default) {
            0 => Err("0 iterations (-n): run at least 1".into()),
            n => Ok(n),
        }
    }

    /// Opens the device (`-d`, else the first one) and checks that the port exists and
    /// takes messages of every size.
    pub fn open(&self, sizes: &[usize]) -> Res<Context> {
        let ctx = Context::open(self.device.as_deref())?;
        self.check_port(&ctx, sizes)?;
        Ok(ctx)
    }

    /// The port (`-i`) exists on `ctx`, takes messages of every size, and has the GID
    /// index of `-x`.
    pub fn check_port(&self, ctx: &Context, sizes: &[usize]) -> Res<()> {
        let port = ctx.query_port(self.ib_port).map_err(|e| format!("port {} (-i): {e}", self.ib_port))?;
        let max_msg = port.raw.max_msg_sz as usize;
        if let Some(&too_big) = sizes.iter().find(|&&s| s > max_msg) {
            return Err(format!("size {too_big} exceeds port {}'s max message size {max_msg}", self.ib_port).into());
        }
        if let Some(i) = self.gid_index {
            ctx.query_gid(self.ib_port, i).map_err(|e| format!("GID index {i} (-x): {e}"))?;
        }
        Ok(())
    }

    /// How the CM connects a QP of this side (`-R`), with the RTS attributes `rts`; `reads`
    /// for a READ test.
    pub fn cm_qp(&self, rts: &RtsAttr, reads: bool) -> CmQp {
        CmQp { reads: reads.then_some(rts.max_rd_atomic), rnr_retry: rts.rnr_retry, retry: rts.retry_cnt }
    }

    /// RTS attributes: the QP timeout of `-u`, the rest as `RtsAttr`'s defaults.
    pub fn rts(&self) -> RtsAttr {
        RtsAttr { timeout: self.qp_timeout, ..RtsAttr::default() }
    }

    /// A handshake for `qp` with this side's port, GID index and what the peer may do.
    pub fn handshake<'a>(&self, qp: &'a QueuePair, access: QpAccess) -> Handshake<'a> {
        let hs = Handshake::new(qp).port(self.ib_port).access(access).rts(self.rts());
        match self.gid_index {
            Some(i) => hs.gid_index(i),
            None => hs,
        }
    }
}

/// Parses the flags of a tool whose `Opts` derive `clap::Parser`, with the tool's name.
pub fn parse<T: CommandFactory + FromArgMatches>(name: &'static str, about: &'static str) -> T {
    let matches = T::command().name(name).about(about).get_matches();
    T::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Runs a tool's body: an error goes to stderr with the tool's name, and the exit code is 1.
pub fn exit_with(name: &str, result: Res<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---- the out-of-band exchange ----------------------------------------------------------

/// A byte stream to the peer: TCP between processes, a Unix socket pair in one process,
/// or the rdma_cm control connection of `-R`.
pub trait Stream: Read + Write + Send {
    /// The rdma_cm link, when the exchange runs over one (`-R`).
    fn cm_link(&mut self) -> Option<&mut CmLink> {
        None
    }
}
impl Stream for TcpStream {}
impl Stream for UnixStream {}
impl Stream for CmLink {
    fn cm_link(&mut self) -> Option<&mut CmLink> {
        Some(self)
    }
}

/// A QP of the test: built here over TCP and in `--loopback`; with `-R`, made on an
/// rdma_cm id and connected by the CM ([`CmLink::data_qp`]), which `how` tunes.
pub fn new_qp(stream: &mut dyn Stream, builder: QueuePairBuilder<'_>, how: CmQp) -> Res<QueuePair> {
    match stream.cm_link() {
        Some(link) => link.data_qp(builder, how),
        None => Ok(builder.build()?),
    }
}

/// What [`connect_peer`] gives: the device, the stream to the peer (none in
/// `--loopback`) and who the peer is.
pub type Connected = (Context, Option<Box<dyn Stream>>, Peer);

/// The device, the connection to the peer and who the peer is. Over TCP the device is
/// opened first (`-d`) and `checks` run before the connection; with `-R` the connection
/// comes first and the device is the one rdma_cm chose for the address. Then the first
/// steps of perftest's exchange ([`open_peer`]'s).
pub fn connect_peer(
    role: &Role,
    c: &Common,
    sizes: &[usize],
    timed: bool,
    checks: impl FnOnce(&Context) -> Res<()>,
) -> Res<Connected> {
    if !c.rdma_cm {
        let ctx = c.open(sizes)?;
        checks(&ctx)?;
        let (stream, peer) = open_peer(role, c, &ctx, timed)?;
        return Ok((ctx, stream, peer));
    }
    let link = match role {
        Role::Server => CmLink::serve(c.tcp_port, c.device.as_deref())?,
        Role::Client(host) => CmLink::dial(host, c.tcp_port, c.device.as_deref())?,
        Role::Loopback => return Err("-R needs a server and a client, not --loopback".into()),
    };
    let ctx = link.context().clone();
    c.check_port(&ctx, sizes)?;
    checks(&ctx)?;
    let mut stream: Box<dyn Stream> = Box::new(link);
    let peer = oob::greet(stream.as_mut(), matches!(role, Role::Client(_)), &ctx, c)?;
    check_perftest_peer(&peer, c, timed)?;
    Ok((ctx, Some(stream), peer))
}

/// The server's end: waits on the TCP port for one client.
pub fn accept(port: u16) -> Res<TcpStream> {
    let listener = listen(port)?;
    eprintln!("waiting for a client on TCP port {port}");
    Ok(accept_on(&listener)?.0)
}

/// Listens on the TCP port, on every address, for [`accept_on`].
pub fn listen(port: u16) -> Res<TcpListener> {
    Ok(TcpListener::bind(("0.0.0.0", port)).map_err(|e| format!("listening on TCP port {port} (-p): {e}"))?)
}

/// Takes one client from `listener`; returns its stream, ready for the exchange, and its
/// address.
pub fn accept_on(listener: &TcpListener) -> Res<(TcpStream, SocketAddr)> {
    let port = listener.local_addr().map_or(0, |a| a.port());
    let (stream, peer) = listener.accept().map_err(|e| format!("accepting a client on TCP port {port}: {e}"))?;
    prepare(&stream)?;
    Ok((stream, peer))
}

/// The client's end. Failing connections are retried for 30 s: the server may still be
/// starting (a refusal, retried quietly; perftest's client gives up at once, but scripts
/// start both together), or the link still coming up (any other error, retried with a
/// line on stderr).
pub fn connect(host: &str, port: u16) -> Res<TcpStream> {
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .find(|a| a.is_ipv4())
        .ok_or_else(|| format!("{host}: no IPv4 address"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            Ok(stream) => {
                prepare(&stream)?;
                return Ok(stream);
            }
            Err(e) if Instant::now() < deadline => {
                if e.kind() != std::io::ErrorKind::ConnectionRefused {
                    eprintln!("connecting to {addr}: {e}; trying again");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(format!("connecting to the server {addr} (is it running, -p {port}?): {e}").into()),
        }
    }
}

fn prepare(stream: &TcpStream) -> Res<()> {
    // Small messages that each wait for an answer: do not let Nagle hold them.
    // No read timeout: a barrier waits for the peer's whole run, which has no bound
    // under emulation; a peer that dies closes the connection, which ends the wait.
    Ok(stream.set_nodelay(true)?)
}

/// The connection to the peer process: `None` in `--loopback`, where each size makes a
/// socket pair of its own ([`loopback`]).
pub fn open_stream(role: &Role, port: u16) -> Res<Option<Box<dyn Stream>>> {
    Ok(match role {
        Role::Server => Some(Box::new(accept(port)?)),
        Role::Client(host) => Some(Box::new(connect(host, port)?)),
        Role::Loopback => None,
    })
}

/// The connection to the peer process and who the peer is: perftest's exchange starts
/// on the TCP connection ([`oob::greet`]); `--loopback` has no connection and its peer
/// is ours. A perftest peer runs one size, for a number of iterations: `-a` and `-D`
/// are refused with it.
pub fn open_peer(role: &Role, c: &Common, ctx: &Context, timed: bool) -> Res<(Option<Box<dyn Stream>>, Peer)> {
    let mut stream = open_stream(role, c.tcp_port)?;
    let peer = match stream.as_deref_mut() {
        None => Peer::Ours,
        Some(s) => oob::greet(s, matches!(role, Role::Client(_)), ctx, c)?,
    };
    check_perftest_peer(&peer, c, timed)?;
    Ok((stream, peer))
}

/// A perftest peer runs one size for a number of iterations: `-a` and `-D` are refused.
fn check_perftest_peer(peer: &Peer, c: &Common, timed: bool) -> Res<()> {
    if let Peer::Perftest(p) = peer {
        if c.all || timed {
            return Err(format!(
                "the peer is perftest {}: its exchange runs one size for a number of iterations, drop -a and -D",
                p.version
            )
            .into());
        }
        eprintln!("the peer is perftest {}: its exchange, and no data check (perftest checks none)", p.version);
    }
    Ok(())
}

/// Two connected ends for `--loopback`.
pub fn local_pair() -> Res<(UnixStream, UnixStream)> {
    Ok(UnixStream::pair()?)
}

/// Runs `server` in a thread and `client` here, each with one end of a socket pair, and
/// returns the client's result (or the first error of the two).
pub fn loopback<T: Send>(
    server: impl FnOnce(&mut dyn Stream) -> Res<()> + Send,
    client: impl FnOnce(&mut dyn Stream) -> Res<T>,
) -> Res<T> {
    let (mut s, mut c) = local_pair()?;
    std::thread::scope(|scope| {
        let server = scope.spawn(move || server(&mut s).map_err(|e| e.to_string()));
        let client = client(&mut c);
        // The client's end closes here, so a server still waiting for it stops.
        drop(c);
        let server = server.join().map_err(|_| "the server thread panicked")?;
        match (client, server) {
            (Ok(v), Ok(())) => Ok(v),
            (Err(e), Ok(())) => Err(e),
            // Both: the server's says what it found (a data check names the byte).
            (Err(e), Err(s)) => Err(format!("{e}; server: {s}").into()),
            (Ok(_), Err(e)) => Err(format!("server: {e}").into()),
        }
    })
}

/// Meets the peer: tells it whether this side is fine and learns whether it is. `Err`
/// when either is not (or the connection broke).
pub fn barrier(stream: &mut dyn Stream, ok: bool) -> Res<()> {
    Ok(wire::sync(stream, if ok { Status::Ready } else { Status::Failed })?)
}

/// Reads the peer's status without sending one first (the verdict a server sends once it
/// checked the data). `Ok(false)` when the peer reports a failure.
pub fn read_verdict(stream: &mut dyn Stream) -> Res<bool> {
    let mut buf = [0u8; wire::STATUS_LEN];
    stream.read_exact(&mut buf).map_err(|e| format!("reading the server's verdict: {e}"))?;
    Ok(Status::from_bytes(&buf)? == Status::Ready)
}

/// Sends this side's status alone (see [`read_verdict`]).
pub fn send_verdict(stream: &mut dyn Stream, ok: bool) -> Res<()> {
    let status = if ok { Status::Ready } else { Status::Failed };
    stream
        .write_all(&status.to_bytes())
        .and_then(|()| stream.flush())
        .map_err(|e| format!("sending the verdict: {e}"))?;
    Ok(())
}

// ---- clock -------------------------------------------------------------------------

/// A cheap timestamp counter. On x86_64 it is the TSC, as perftest's `get_cycles`: under
/// TCG (the test bed) `clock_gettime` can fall back to a system call that costs several
/// microseconds, which would be added to every latency sample, while `rdtsc` is one
/// instruction (an emulator helper under TCG). The rate is calibrated against `Instant`
/// once. Elsewhere the clock is `Instant` itself.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    ticks_per_us: f64,
    #[cfg(not(target_arch = "x86_64"))]
    origin: Instant,
}

impl Clock {
    /// Measures the counter's rate over 50 ms.
    pub fn calibrate() -> Clock {
        #[cfg(target_arch = "x86_64")]
        {
            let (t0, c0) = (Instant::now(), Self::raw());
            while t0.elapsed() < Duration::from_millis(50) {
                std::hint::spin_loop();
            }
            let (us, c1) = (t0.elapsed().as_secs_f64() * 1e6, Self::raw());
            Clock { ticks_per_us: (c1.wrapping_sub(c0) as f64 / us).max(1e-3) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Clock { ticks_per_us: 1e-3, origin: Instant::now() }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    fn raw() -> u64 {
        // The intrinsic is an unsafe fn before Rust 1.87 and safe since.
        #[allow(unused_unsafe)]
        // SAFETY: rdtsc exists on every x86_64 CPU and has no memory effects.
        unsafe {
            core::arch::x86_64::_rdtsc()
        }
    }

    /// Now, in ticks.
    #[inline]
    pub fn now(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        {
            Self::raw()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self.origin.elapsed().as_nanos() as u64
        }
    }

    /// A duration in ticks.
    pub fn ticks(&self, d: Duration) -> u64 {
        (d.as_secs_f64() * 1e6 * self.ticks_per_us) as u64
    }

    /// Ticks to microseconds.
    pub fn us(&self, ticks: u64) -> f64 {
        self.us_f(ticks as f64)
    }

    /// A clock of a known rate (tests).
    #[cfg(test)]
    fn at_rate(ticks_per_us: f64) -> Clock {
        Clock {
            ticks_per_us,
            #[cfg(not(target_arch = "x86_64"))]
            origin: Instant::now(),
        }
    }

    /// Ticks (a mean, say) to microseconds.
    pub fn us_f(&self, ticks: f64) -> f64 {
        ticks / self.ticks_per_us
    }
}

// ---- results -----------------------------------------------------------------------

/// One size's bandwidth result, in perftest's units.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct BwRow {
    /// Message size.
    pub bytes: usize,
    /// Iterations per QP.
    pub iterations: u64,
    /// Best window, MiB/s.
    pub bw_peak_mib_s: f64,
    /// Whole run, MiB/s.
    pub bw_avg_mib_s: f64,
    /// Messages a second, millions.
    pub msg_rate_mpps: f64,
}

/// perftest's separator line.
pub fn rule() -> String {
    "-".repeat(87)
}

/// The bandwidth table's header.
pub fn print_bw_header(gbits: bool) {
    let unit = if gbits { "Gb/sec" } else { "MiB/sec" };
    println!(" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]");
}

/// One bandwidth row (table or JSON).
pub fn print_bw_row(r: &BwRow, gbits: bool, json: bool) {
    if json {
        println!("{}", serde_json::to_string(r).unwrap_or_default());
        return;
    }
    let conv = |mib: f64| if gbits { mib * f64::from(1 << 20) * 8.0 / 1e9 } else { mib };
    println!(
        " {:<10} {:<10}       {:<12.2}       {:<12.2}         {:.6}",
        r.bytes,
        r.iterations,
        conv(r.bw_peak_mib_s),
        conv(r.bw_avg_mib_s),
        r.msg_rate_mpps
    );
}

/// One size's latency result, in microseconds.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct LatRow {
    /// Message size.
    pub bytes: usize,
    /// Iterations run.
    pub iterations: u64,
    /// Smallest sample.
    pub t_min_us: f64,
    /// Largest sample kept (the two largest are dropped).
    pub t_max_us: f64,
    /// The median.
    pub t_typical_us: f64,
    /// The mean.
    pub t_avg_us: f64,
    /// The standard deviation.
    pub t_stdev_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
}

impl LatRow {
    /// perftest's statistics over per-iteration samples (in ticks of `clock`): the two
    /// largest dropped (outliers such as the first touch), then each statistic in
    /// microseconds divided by `divisor` (2 where a sample is a round trip and the one-way
    /// latency is reported). The same figures as perftest's sort gives.
    pub fn from_samples(
        bytes: usize,
        iterations: u64,
        mut ticks: Vec<u64>,
        clock: &Clock,
        divisor: f64,
    ) -> Res<LatRow> {
        // Selections over integers, not a sort: each statistic is one O(n) pass, and the
        // samples stay in clock ticks until the few that are printed.
        if ticks.len() > 2 {
            // perftest leaves out the two slowest samples.
            let keep = ticks.len() - 2;
            ticks.select_nth_unstable(keep);
            ticks.truncate(keep);
        }
        let n = ticks.len();
        let Some(&first) = ticks.first() else { return Err("no latency samples".into()) };
        let us = |t: f64| clock.us_f(t) / divisor;
        let (lo, hi, mean, var) = spread(&ticks, first);
        let upper = *ticks.select_nth_unstable(n / 2).1;
        let median = if n % 2 == 1 {
            us(upper as f64)
        } else {
            (us(ticks[..n / 2].iter().copied().max().unwrap_or(upper) as f64) + us(upper as f64)) / 2.0
        };
        // Nearest rank: the smallest sample with at least p of them at or below it. The
        // higher ranks lie in the part above the median, then above the 99th.
        let at = |p: f64| ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
        let (r99, r999) = (at(0.99).max(n / 2), at(0.999).max(at(0.99).max(n / 2)));
        let p99 = *ticks[n / 2..].select_nth_unstable(r99 - n / 2).1;
        let p999 = *ticks[r99..].select_nth_unstable(r999 - r99).1;
        let (t_min_us, t_max_us, p99_us, p999_us) = (us(lo as f64), us(hi as f64), us(p99 as f64), us(p999 as f64));
        let (t_avg_us, t_stdev_us) = (us(first as f64 + mean), us(var.sqrt()));
        Ok(LatRow {
            bytes,
            iterations,
            t_min_us,
            t_max_us,
            t_typical_us: median,
            t_avg_us,
            t_stdev_us,
            p99_us,
            p999_us,
        })
    }
}

/// The smallest and largest sample, and the mean and variance of the samples' distances
/// from `first` (sums of distances are numerically steady).
fn spread(ticks: &[u64], first: u64) -> (u64, u64, f64, f64) {
    let (mut lo, mut hi, mut sum, mut squares) = (u64::MAX, 0, 0f64, 0f64);
    for &t in ticks {
        (lo, hi) = (lo.min(t), hi.max(t));
        let d = t as f64 - first as f64;
        sum += d;
        squares += d * d;
    }
    let n = ticks.len() as f64;
    let mean = sum / n;
    (lo, hi, mean, (squares / n - mean * mean).max(0.0))
}

/// Time stamps into samples, in place and front to back: each stamp becomes the time to
/// the next one (a window of two cells reads both before it writes the first), and the
/// last, which has no next, goes. No bounds checks and no memmove (`remove(0)`'s).
fn into_samples(stamps: &mut Vec<u64>) {
    let cells = std::cell::Cell::from_mut(&mut stamps[..]).as_slice_of_cells();
    cells.windows(2).for_each(|w| w[0].set(w[1].get().wrapping_sub(w[0].get())));
    stamps.pop();
}

/// The latency table's header.
pub fn print_lat_header() {
    println!(
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
    );
}

/// One latency row (table or JSON).
pub fn print_lat_row(r: &LatRow, json: bool) {
    if json {
        println!("{}", serde_json::to_string(r).unwrap_or_default());
        return;
    }
    println!(
        " {:<7} {:<11} {:<14.2} {:<14.2} {:<16.2} {:<14.2} {:<15.2} {:<22.2} {:.2}",
        r.bytes, r.iterations, r.t_min_us, r.t_max_us, r.t_typical_us, r.t_avg_us, r.t_stdev_us, r.p99_us, r.p999_us
    );
}

// ---- latency tools -----------------------------------------------------------------

/// The three latency tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatTest {
    /// RDMA WRITE ping-pong, each side polling the last byte of its own buffer.
    Write,
    /// SEND ping-pong with receives.
    Send,
    /// RDMA READ round trips from the client; the server is passive.
    Read,
}

impl LatTest {
    fn title(self) -> &'static str {
        match self {
            LatTest::Write => "RDMA_Write Latency Test",
            LatTest::Send => "Send Latency Test",
            LatTest::Read => "RDMA_Read Latency Test",
        }
    }

    /// Write and send samples are round trips; perftest reports half of them.
    fn divisor(self) -> f64 {
        match self {
            LatTest::Write | LatTest::Send => 2.0,
            LatTest::Read => 1.0,
        }
    }
}

/// The latency tools' flags.
#[derive(clap::Parser, Debug)]
pub struct LatOpts {
    #[command(flatten)]
    pub common: Common,
    /// Largest message sent inline (default as perftest's: 220 B for write_lat, 236 B for
    /// send_lat; read_lat never). perftest itself sends nothing inline on devices it does
    /// not know, rxe among them: give -I 0 to compare with it there.
    #[arg(short = 'I', long = "inline_size")]
    pub inline_size: Option<u32>,
}

impl LatTest {
    /// What the peer may do on this side's QP.
    fn access(self) -> QpAccess {
        match self {
            LatTest::Write => QpAccess::REMOTE_WRITE,
            LatTest::Send => QpAccess::empty(),
            LatTest::Read => QpAccess::REMOTE_READ,
        }
    }

    /// perftest's default inline size for this test.
    fn default_inline(self) -> u32 {
        match self {
            LatTest::Write => 220,
            LatTest::Send => 236,
            LatTest::Read => 0,
        }
    }
}

/// `main` of a latency tool.
pub fn lat_main(test: LatTest, name: &'static str, about: &'static str) -> ExitCode {
    let o: LatOpts = parse(name, about);
    exit_with(name, run_lat(test, &o))
}

fn run_lat(test: LatTest, o: &LatOpts) -> Res<()> {
    let c = &o.common;
    let inline = match (test, o.inline_size) {
        (LatTest::Read, Some(n)) if n > 0 => return Err("-I: an RDMA READ carries no inline data".into()),
        (_, Some(n)) if n > MAX_INLINE => return Err(format!("-I {n}: at most {MAX_INLINE} bytes inline").into()),
        (_, n) => n.unwrap_or(test.default_inline()),
    };
    let role = c.role()?;
    let sizes = c.sizes(2)?;
    let iters = c.iterations(1000)?;
    if test == LatTest::Write && iters < 2 {
        return Err("write_lat needs at least 2 iterations (-n): its samples are the time between two".into());
    }
    if iters > MAX_LAT_ITERS {
        return Err(format!("{iters} iterations (-n): at most {MAX_LAT_ITERS}, whose samples are all kept").into());
    }
    let clock = Clock::calibrate();
    let header = |ctx: &Context| {
        if !c.json && role != Role::Server {
            println!("{}", rule());
            println!("                    {}", test.title());
            println!(" Device         : {}", ctx.name());
            println!(" Connection type : RC\t\tIterations : {iters}");
            println!(" Mode            : {}", role.describe());
            println!("{}", rule());
            print_lat_header();
        }
        Ok(())
    };
    let (ctx, mut stream, mut peer) = connect_peer(&role, c, &sizes, false, header)?;
    for &size in &sizes {
        let side = |stream: &mut dyn Stream, client: bool, peer: &mut Peer| {
            let run = LatRun { test, c, clock: &clock, size, inline, iters, client };
            run.side(&ctx, stream, peer)
        };
        let row = match stream.as_deref_mut() {
            None => loopback(|s| side(s, false, &mut Peer::Ours).map(drop), |s| side(s, true, &mut Peer::Ours))?,
            Some(s) if role == Role::Server => {
                side(s, false, &mut peer)?;
                eprintln!("{}: {size} B: {iters} iterations done", test.title());
                continue;
            }
            Some(s) => side(s, true, &mut peer)?,
        };
        let row = row.ok_or("the client measured nothing")?;
        print_lat_row(&row, c.json);
    }
    if !c.json && role != Role::Server {
        println!("{}", rule());
    }
    Ok(())
}

/// Most inline bytes `-I` asks for (devices grant a few hundred at most).
const MAX_INLINE: u32 = 4096;
/// Requests in flight per side, each way: moderated sends, and receives posted ahead
/// (send_lat). Sends and receives share one CQ of twice this.
const LAT_DEPTH: u32 = 32;
/// Every sample is kept (perftest's percentiles need them all): 8 bytes an iteration.
const MAX_LAT_ITERS: u64 = 100_000_000;

/// One side of one size of a latency test.
struct LatRun<'a> {
    test: LatTest,
    c: &'a Common,
    clock: &'a Clock,
    size: usize,
    /// Largest message sent inline (`-I`).
    inline: u32,
    iters: u64,
    client: bool,
}

/// A latency side's verbs objects, before the run.
struct LatQp {
    pd: rdma_verbs::ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    /// What the peer writes (write_lat, polled for its last byte).
    target: MemoryRegion<AlignedBuf, RemoteWritable>,
    /// What the peer reads (read_lat): it lives to the end of the run.
    read_src: Option<MemoryRegion<AlignedBuf>>,
    rq: RecvQueue<Chunk>,
}

impl LatRun<'_> {
    /// Connects a QP, runs the ping-pong (or the reads), meets the peer at the end, and
    /// returns the statistics on the client.
    fn side(&self, ctx: &Context, stream: &mut dyn Stream, peer: &mut Peer) -> Res<Option<LatRow>> {
        let LatQp { pd, mut cq, qp, target, read_src, mut rq } = self.build(ctx, stream)?;
        let (access, mr, shape) = match (self.test, &read_src) {
            (LatTest::Write, _) => (self.test.access(), Some(target.remote()?), Shape::RDMA_LAT),
            (LatTest::Read, Some(src)) => (self.test.access(), Some(src.remote()?), Shape::RDMA_LAT),
            _ => (self.test.access(), None, Shape::SEND),
        };
        let offer = Offer { qp: &qp, access, mr, rts: self.c.rts() };
        let remote = peer.connect(self.c, shape, &[offer], self.size as u64, stream)?.pop().flatten();
        let remote = self.check_peer_region(remote)?;
        let mut ping = self.pinger(&pd, &qp, remote)?;
        // write_lat polls the word that holds the message's last byte.
        let last_word = (target.atomic_u64((self.size - 1) & !7)?, (self.size - 1) & 7);
        let result = self.ping_pong(&mut ping, &mut cq, &mut rq, last_word);
        // Meet the peer whatever happened, so that it stops too; our error comes first.
        let met = self.meet(stream, peer, result.is_ok());
        let mut stamps = result?;
        met?;
        if !self.client {
            return Ok(None);
        }
        into_samples(&mut stamps);
        Ok(Some(LatRow::from_samples(self.size, self.iters, stamps, self.clock, self.test.divisor())?))
    }

    /// The QP, its regions, and (send_lat) its receives, posted before the peer can send.
    fn build(&self, ctx: &Context, stream: &mut dyn Stream) -> Res<LatQp> {
        let size = self.size;
        let pd = rdma_verbs::ProtectionDomain::new(ctx)?;
        let cq = CompletionQueue::new(ctx, 2 * LAT_DEPTH + 2)?;
        let builder = QueuePair::builder(&pd, QpType::Rc, &cq, &cq)
            .max_send_wr(LAT_DEPTH)
            .max_recv_wr(LAT_DEPTH)
            .max_inline_data(if self.inlined() { size as u32 } else { 0 });
        let rts = self.c.rts();
        let qp = new_qp(stream, builder, self.c.cm_qp(&rts, self.test == LatTest::Read))?;
        // Whole 8-byte words, so that the word holding the last byte is inside it.
        let target = pd.register_remote_writable(
            AlignedBuf::new(size.next_multiple_of(8))?,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )?;
        let read_src = match self.test {
            LatTest::Read => {
                Some(pd.register(AlignedBuf::new(size)?, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)?)
            }
            _ => None,
        };
        // INIT now, with what the peer may do: receives go in before the peer can send.
        // (A QP of -R is the CM's to move; siw reads it back as RESET all the same.)
        if stream.cm_link().is_none() {
            self.c.handshake(&qp, self.test.access()).init()?;
        }
        let mut rq: RecvQueue<Chunk> = qp.recv_queue()?;
        if self.test == LatTest::Send {
            let bufs = pd.register(AlignedBuf::new(size * LAT_DEPTH as usize)?, AccessFlags::LOCAL_WRITE)?;
            for (i, b) in bufs.into_chunks(size)?.into_iter().enumerate() {
                rq.post(b, 0..size, i as u64)?;
            }
        }
        Ok(LatQp { pd, cq, qp, target, read_src, rq })
    }

    /// Inline when the message fits what -I allows (as perftest decides).
    fn inlined(&self) -> bool {
        self.size <= self.inline as usize
    }

    /// The peer's region, where this side writes or reads: at least `-s` bytes.
    fn check_peer_region(&self, mr: Option<RemoteMr>) -> Res<Option<RemoteMr>> {
        match (self.test, mr) {
            (LatTest::Send, _) => Ok(None),
            (_, Some(mr)) if mr.len >= self.size as u64 => Ok(Some(mr)),
            (_, Some(mr)) => Err(format!(
                "the peer's region is {} bytes, smaller than -s {}: give both sides the same -s/-a",
                mr.len, self.size
            )
            .into()),
            (_, None) => Err("the peer advertised no memory region".into()),
        }
    }

    /// Sources: a request per slot in flight, each with its own chunk, so the byte that
    /// changes each iteration is never written while the device may still read it. Each
    /// is prepared once (checked, its C request built) and posted again every time, as
    /// perftest posts its one prebuilt request.
    fn pinger(&self, pd: &rdma_verbs::ProtectionDomain, qp: &QueuePair, peer: Option<RemoteMr>) -> Res<Pinger> {
        let (test, size, inline) = (self.test, self.size, self.inlined());
        let moderation = if size <= 65536 { LAT_DEPTH / 2 } else { 1 };
        let pool = pd.register(AlignedBuf::new(size * 2 * moderation as usize)?, AccessFlags::LOCAL_WRITE)?;
        let sq = qp.prepared_send_queue()?;
        let make = |buf: Chunk| -> Res<SendWr<Chunk>> {
            let wr = match test {
                LatTest::Write => SendWr::write(buf, 0..size, peer.ok_or("no peer region")?),
                LatTest::Send => SendWr::send(buf, 0..size),
                LatTest::Read => SendWr::read(buf, 0..size, peer.ok_or("no peer region")?),
            };
            Ok(if inline { wr.inline() } else { wr })
        };
        let free = pool
            .into_chunks(size)?
            .into_iter()
            .map(|buf| sq.prepare(make(buf)?).map_err(Into::into))
            .collect::<Res<Vec<_>>>()?;
        Ok(Pinger {
            sq,
            free,
            moderation: u64::from(moderation),
            to_signal: u64::from(moderation),
            posted: 0,
            recvs: 0,
            wcs: [WorkCompletion::EMPTY, WorkCompletion::EMPTY, WorkCompletion::EMPTY, WorkCompletion::EMPTY],
        })
    }

    /// The timed loop, a loop per test so that no round asks which test this is.
    /// Returns the stamps: the client's samples are the differences of consecutive ones.
    fn ping_pong(
        &self,
        ping: &mut Pinger,
        cq: &mut CompletionQueue,
        rq: &mut RecvQueue<Chunk>,
        last_word: (&AtomicU64, usize),
    ) -> Res<Vec<u64>> {
        let (clock, client, iters) = (self.clock, self.client, self.iters);
        let mut stamps = Vec::with_capacity(iters as usize + 1);
        let silence = clock.ticks(PEER_SILENCE);
        match self.test {
            // The server sends first, as ib_write_lat's does; the client stamps each
            // message it received, so its samples are the iters - 1 round trips between.
            LatTest::Write => self.write_pongs(ping, cq, rq, last_word, &mut stamps)?,
            LatTest::Send => {
                for i in 1..=iters {
                    if !client {
                        ping.wait_recv(cq, rq, i, clock, silence)?;
                    }
                    stamps.push(clock.now());
                    ping.post(cq, rq, i == iters, None)?;
                    if client {
                        ping.wait_recv(cq, rq, i, clock, silence)?;
                    }
                }
                stamps.push(clock.now());
            }
            // The read_lat server only serves its region, until the end.
            LatTest::Read if !client => return Ok(stamps),
            LatTest::Read => {
                for _ in 1..=iters {
                    stamps.push(clock.now());
                    ping.post(cq, rq, true, None)?;
                    ping.drain(cq, rq)?;
                }
                stamps.push(clock.now());
            }
        }
        ping.drain(cq, rq)?;
        Ok(stamps)
    }

    /// write_lat's loop: each side writes the iteration's number into the last byte of
    /// the peer's region and spins on its own.
    fn write_pongs(
        &self,
        ping: &mut Pinger,
        cq: &mut CompletionQueue,
        rq: &mut RecvQueue<Chunk>,
        last_word: (&AtomicU64, usize),
        stamps: &mut Vec<u64>,
    ) -> Res<()> {
        let (clock, client, iters) = (self.clock, self.client, self.iters);
        let silence = clock.ticks(PEER_SILENCE);
        for i in 1..=iters {
            if client {
                wait_byte(last_word, i, clock, silence, || ping.drain_some(cq, rq))?;
            }
            stamps.push(clock.now());
            ping.post(cq, rq, i == iters, Some(i as u8))?;
            if !client {
                wait_byte(last_word, i, clock, silence, || ping.drain_some(cq, rq))?;
            }
        }
        Ok(())
    }

    /// The end of a size: our barrier, or perftest's end of this test (ib_write_lat has
    /// none; ib_send_lat and ib_read_lat close, which waits for the peer's close).
    fn meet(&self, stream: &mut dyn Stream, peer: &Peer, ok: bool) -> Res<()> {
        match peer {
            Peer::Ours => barrier(stream, ok),
            Peer::Perftest(_) if !ok => Ok(()),
            Peer::Perftest(_) if self.test == LatTest::Write => Ok(()),
            Peer::Perftest(p) => p.close(stream),
        }
    }
}

/// Spins on the last byte of the target (`word`, and the byte's index in it) until it is
/// `i` (mod 256), as `ib_write_lat` does: the device writes a message's bytes in order,
/// so the last one arriving means the whole message did. One load a spin; `idle`
/// recycles send completions now and then, and the clock is read only then.
fn wait_byte(
    (word, at): (&AtomicU64, usize),
    i: u64,
    clock: &Clock,
    silence: u64,
    mut idle: impl FnMut() -> Res<()>,
) -> Res<()> {
    let want = i as u8;
    let mut started = None;
    let mut spins = 0u32;
    loop {
        if word.load(Ordering::Acquire).to_ne_bytes()[at] == want {
            return Ok(());
        }
        spins = spins.wrapping_add(1);
        if spins % 1024 == 0 {
            idle()?;
            let now = clock.now();
            if now.wrapping_sub(*started.get_or_insert(now)) > silence {
                return Err(format!("iteration {i}: no RDMA WRITE from the peer within {PEER_SILENCE:?}").into());
            }
        }
    }
}

/// The send side of a latency test: a pool of prepared requests, moderated signaling.
struct Pinger {
    sq: PreparedSendQueue<Chunk>,
    free: Vec<PreparedSend<Chunk>>,
    moderation: u64,
    /// Requests until the next one the moderation signals.
    to_signal: u64,
    posted: u64,
    recvs: u64,
    wcs: [WorkCompletion; 4],
}

impl Pinger {
    /// Posts a free prepared request, its last byte set to `last_byte` if given;
    /// signaled every `moderation` requests and when `last` (an unsignaled tail would
    /// never complete).
    fn post(
        &mut self,
        cq: &mut CompletionQueue,
        rq: &mut RecvQueue<Chunk>,
        last: bool,
        last_byte: Option<u8>,
    ) -> Res<()> {
        while self.free.is_empty() {
            self.drain_some(cq, rq)?;
        }
        let mut p = self.free.pop().ok_or("no free request")?;
        // The request sends its whole chunk: its last byte is the message's.
        if let (Some(b), Some(at)) = (last_byte, p.bytes_mut().last_mut()) {
            *at = b;
        }
        self.posted += 1;
        // Every `moderation`th request, counted down rather than divided out each time.
        self.to_signal -= 1;
        let at_mark = self.to_signal == 0;
        if at_mark {
            self.to_signal = self.moderation;
        }
        p.set_signaled(last || at_mark);
        self.sq.post(p).map_err(rdma_verbs::Error::from)?;
        Ok(())
    }

    /// Polls the CQ once and takes what it found: sends back to the pool, receives
    /// counted and posted again.
    fn drain_some(&mut self, cq: &mut CompletionQueue, rq: &mut RecvQueue<Chunk>) -> Res<()> {
        let n = cq.poll(&mut self.wcs)?.len();
        for wc in &mut self.wcs[..n] {
            // A failure names the operation, the request's id and the QP.
            if wc.opcode().is_recv() {
                let done = rq.complete(wc)?.result()?;
                let len = done.value.len();
                rq.post(done.value, 0..len, done.id)?;
                self.recvs += 1;
            } else {
                let (free, mut failed) = (&mut self.free, None);
                self.sq.complete(wc, |d| match d.result() {
                    Ok(d) => free.push(d.value),
                    Err(e) => failed = Some(rdma_verbs::Error::from(e)),
                })?;
                if let Some(e) = failed {
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    /// Until every posted request has completed. The clock is read now and then only
    /// (read_lat drains after every READ, and reading it may be a system call).
    fn drain(&mut self, cq: &mut CompletionQueue, rq: &mut RecvQueue<Chunk>) -> Res<()> {
        let mut deadline = None;
        let mut polls = 0u32;
        while self.sq.outstanding() > 0 {
            self.drain_some(cq, rq)?;
            polls = polls.wrapping_add(1);
            if polls % 1024 == 0 && self.sq.outstanding() > 0 {
                let now = Instant::now();
                if now > *deadline.get_or_insert(now + PEER_SILENCE) {
                    return Err(
                        format!("{} requests did not complete within {PEER_SILENCE:?}", self.sq.outstanding()).into()
                    );
                }
            }
        }
        Ok(())
    }

    /// Until the `i`th message from the peer has arrived.
    fn wait_recv(
        &mut self,
        cq: &mut CompletionQueue,
        rq: &mut RecvQueue<Chunk>,
        i: u64,
        clock: &Clock,
        silence: u64,
    ) -> Res<()> {
        let started = clock.now();
        let mut polls = 0u32;
        while self.recvs < i {
            self.drain_some(cq, rq)?;
            // The clock now and then only: its reading would delay seeing the message.
            polls = polls.wrapping_add(1);
            if polls % 1024 == 0 && self.recvs < i && clock.now().wrapping_sub(started) > silence {
                return Err(format!("iteration {i}: no SEND from the peer within {PEER_SILENCE:?}").into());
            }
        }
        Ok(())
    }
}

/// A remote region, checked against what this side will write into it.
pub fn check_remote(mr: Option<RemoteMr>, size: usize) -> Res<RemoteMr> {
    match mr {
        Some(mr) if mr.len >= size as u64 => Ok(mr),
        Some(mr) => {
            Err(format!("the server's region is {} bytes, smaller than {size}: give both sides the same -s/-a", mr.len)
                .into())
        }
        None => Err("the server advertised no memory region".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::{Clock, LatRow};

    /// The statistics as a sort of every sample gives them (what `from_samples` did
    /// before it used selections), in microseconds at 4 ticks a microsecond.
    fn sorted_reference(ticks: &[u64], divisor: f64) -> [f64; 7] {
        let mut us: Vec<f64> = ticks.iter().map(|&t| t as f64 / 4.0).collect();
        us.sort_by(f64::total_cmp);
        us.truncate(us.len() - 2);
        let n = us.len();
        us.iter_mut().for_each(|v| *v /= divisor);
        let median = if n % 2 == 1 { us[n / 2] } else { (us[n / 2 - 1] + us[n / 2]) / 2.0 };
        let avg = us.iter().sum::<f64>() / n as f64;
        let var = us.iter().map(|v| (v - avg) * (v - avg)).sum::<f64>() / n as f64;
        let pct = |p: f64| us[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
        [us[0], us[n - 1], median, pct(0.99), pct(0.999), avg, var.sqrt()]
    }

    #[test]
    fn stamps_become_the_differences_of_consecutive_ones() {
        let mut stamps = vec![10, 13, 20, 20, u64::MAX, 4];
        super::into_samples(&mut stamps);
        assert_eq!(stamps, [3, 7, 0, u64::MAX - 20, 5]);
        for mut short in [vec![], vec![7]] {
            super::into_samples(&mut short);
            assert!(short.is_empty());
        }
    }

    #[test]
    fn from_samples_gives_what_a_full_sort_gives() {
        let clock = Clock::at_rate(4.0);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for n in [3, 4, 5, 10, 101, 1000, 1001, 4096] {
            let ticks: Vec<u64> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    40_000 + x % 3000 + if x % 97 == 0 { 50_000 } else { 0 }
                })
                .collect();
            let r = LatRow::from_samples(64, n as u64, ticks.clone(), &clock, 2.0).unwrap();
            let want = sorted_reference(&ticks, 2.0);
            let exact = [r.t_min_us, r.t_max_us, r.t_typical_us, r.p99_us, r.p999_us];
            assert_eq!(exact, want[..5], "{n} samples");
            for (got, want) in [(r.t_avg_us, want[5]), (r.t_stdev_us, want[6])] {
                assert!((got - want).abs() <= 1e-9 * want.abs().max(1.0), "{n} samples: {got} against {want}");
            }
        }
        assert!(LatRow::from_samples(64, 0, Vec::new(), &clock, 1.0).is_err());
    }
}
