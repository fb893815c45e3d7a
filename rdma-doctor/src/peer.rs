//! The path between two nodes, end to end: `rdma-doctor --serve` on one node,
//! `rdma-doctor --peer HOST` on the other.
//!
//! The two doctors meet over TCP (the control channel, port [`DEFAULT_PORT`]). Each picks
//! the device, port and GID that carry the address the TCP connection uses on its side
//! (the RoCE v2 GID of that IPv4 address, as rdma_cm would), or the first active port's
//! default GID when none does (InfiniBand, or TCP over another interface: said so). They
//! exchange a hello (host, device, port, GID, GID type, active MTU, link layer, atomics),
//! compare the two ends of the path, connect one RC QP each with rdma-verbs' endpoint
//! handshake, then the prober drives the data plane with every byte checked where it
//! lands: an RDMA WRITE (checked by the server in its region), an RDMA READ (checked by
//! the prober), a SEND (checked by the server's receive), FETCH_ADD and CMP_SWAP (the
//! returned value and the server's word), then the server WRITEs and SENDs back (checked
//! by the prober), and last an rdma_cm connection from the prober to a listener the
//! server opens on its address, passing one message.
//!
//! The report has one check per layer of the path, in that order: the control channel,
//! addressing (the GID for the route), the path (link layers, GID types, MTUs), the QP
//! connection (the kernel's control plane), each data-plane operation, and rdma_cm. The
//! first failure stops what depends on it, and names the layer with the usual cause and
//! a fix. Every wait is bounded by the timeout; every line the peer sends is read with
//! a size limit and parsed strictly.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

// The sizes, the atomic word and its values, and the checks of the one-node loopback test.
use crate::loopback::{returned_order, same, ADD, ATOMIC_AT, FIRST_VALUE, LEN, SWAP};
use crate::rdma_cm::wait_one as wait;

use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, GidType, Handshake, MemoryRegion, PortState,
    ProtectionDomain, QpAccess, QpType, QueuePair, RecvQueue, RemoteMr, RemoteWritable, RtsAttr, SendQueue, SendWr,
};

/// The TCP port `--serve` listens on and `--peer` connects to by default.
pub const DEFAULT_PORT: u16 = 18516;
/// What a hello starts with; the protocol's version follows in the hello.
const MAGIC: &str = "rdma-doctor-peer";
const VERSION: u32 = 1;
/// The checks of the data plane.
const DATA_LAYERS: [&str; 6] = ["RDMA_WRITE", "RDMA_READ", "SEND", "FETCH_ADD", "CMP_SWAP", "reverse WRITE+SEND"];
/// How an end's error starts when its QP could not be built.
const SETUP: &str = "setting up the QP";
/// The longest line either side reads from the other.
const LINE_MAX: usize = 4096;

/// One end of the path, as its doctor describes it in the hello.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct End {
    /// Host name.
    pub host: String,
    /// The address the control connection uses on this end.
    pub address: String,
    /// Device, port, GID index, GID and its type (empty when none was found).
    pub device: String,
    /// Port number.
    pub port: u8,
    /// GID index.
    pub gid_index: u32,
    /// The GID.
    pub gid: String,
    /// `RoCE v2`, `RoCE v1`, `IB`.
    pub gid_type: String,
    /// Whether the GID carries `address` (else the first active port's default GID).
    pub gid_matches_address: bool,
    /// The port's active MTU in bytes.
    pub active_mtu: u32,
    /// `Ethernet` or `InfiniBand`.
    pub link_layer: String,
    /// Whether the device does atomics.
    pub atomics: bool,
    /// Why this end cannot take part, when it cannot.
    pub error: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Hello {
    magic: String,
    version: u32,
    end: End,
}

/// One check of the path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    /// The layer: `control channel`, `addressing`, `QP setup`, `path`, `QP connection`, `RDMA_WRITE`,
    /// `RDMA_READ`, `SEND`, `FETCH_ADD`, `CMP_SWAP`, `reverse WRITE+SEND`, `rdma_cm`.
    pub layer: String,
    /// Passed.
    pub ok: bool,
    /// What was verified, or what went wrong.
    pub detail: String,
    /// The usual fix, when it failed.
    pub fix: Option<String>,
}

/// What `--peer` found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerReport {
    /// The peer as given (`HOST[:PORT]`).
    pub peer: String,
    /// This end.
    pub local: Option<End>,
    /// The other end, as it described itself.
    pub remote: Option<End>,
    /// The checks, in the order of the layers.
    pub checks: Vec<Check>,
    /// Milliseconds the probe took.
    pub elapsed_ms: u64,
}

impl PeerReport {
    /// 0 when every check passed, else 1.
    pub fn exit_code(&self) -> i32 {
        i32::from(self.checks.is_empty() || self.checks.iter().any(|c| !c.ok))
    }

    /// The report for a person: the two ends, then one line per check, failures first.
    pub fn to_text(&self) -> String {
        let mut s = format!("rdma-doctor --peer {}\n", self.peer);
        for (name, end) in [("here ", &self.local), ("there", &self.remote)] {
            if let Some(e) = end {
                s += &format!(
                    "  {name}: {} {} {} port {} GID[{}] {} ({}), active MTU {}, {}\n",
                    e.host, e.address, e.device, e.port, e.gid_index, e.gid, e.gid_type, e.active_mtu, e.link_layer
                );
            }
        }
        let mut order: Vec<&Check> = self.checks.iter().filter(|c| !c.ok).collect();
        order.extend(self.checks.iter().filter(|c| c.ok));
        for c in order {
            s += &format!("{}  {:<18} {}\n", if c.ok { "PASS" } else { "FAIL" }, c.layer, c.detail);
            c.fix.iter().for_each(|f| s += &format!("      fix (advice, not run): {f}\n"));
        }
        if let Some(first) = self.checks.iter().find(|c| !c.ok) {
            if DATA_LAYERS.contains(&first.layer.as_str()) {
                s += "the control plane works (TCP, both doctors, the QPs at RTS) and the data plane \
                      between these two nodes does not\n";
            }
        }
        let failed = self.checks.iter().filter(|c| !c.ok).count();
        s += &match failed {
            0 => format!("result: the path to {} works end to end ({} ms)\n", self.peer, self.elapsed_ms),
            n => format!("result: {n} check(s) failed on the path to {}\n", self.peer),
        };
        s
    }

    /// The report as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    fn pass(&mut self, layer: &str, detail: impl Into<String>) {
        self.checks.push(Check { layer: layer.into(), ok: true, detail: detail.into(), fix: None });
    }

    /// Records a failure; returns `Err(())` so a step can stop with `?`.
    fn fail<T>(&mut self, layer: &str, detail: impl Into<String>, fix: Option<String>) -> Result<T, ()> {
        self.checks.push(Check { layer: layer.into(), ok: false, detail: detail.into(), fix });
        Err(())
    }
}

/// The choices both roles share.
#[derive(Debug, Clone)]
pub struct PeerOptions {
    /// Use this device (default: the one whose GID carries the connection's address).
    pub device: Option<String>,
    /// Use this port of it.
    pub port: Option<u8>,
    /// Longest wait for one completion, event or line.
    pub timeout: Duration,
    /// The TCP port: the one `--serve` listens on, the one `--peer` connects to when
    /// its HOST names none.
    pub tcp_port: u16,
}

// ---- the prober ----------------------------------------------------------------------

/// Probes the path to the doctor serving at `peer` (`HOST` or `HOST:PORT`; the port
/// defaults to `opts.tcp_port`).
pub fn probe(peer: &str, opts: &PeerOptions) -> PeerReport {
    let start = Instant::now();
    let mut r = PeerReport { peer: peer.to_owned(), ..PeerReport::default() };
    let _ = probe_steps(peer, opts, &mut r);
    r.elapsed_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    r
}

fn probe_steps(peer: &str, opts: &PeerOptions, r: &mut PeerReport) -> Result<(), ()> {
    let mut ctl = match connect_control(peer, opts.tcp_port, opts.timeout) {
        Ok(c) => c,
        Err(e) => {
            let fix =
                format!("run `rdma-doctor --serve` on {peer} and let TCP reach its port (default {DEFAULT_PORT})");
            return r.fail("control channel", e, Some(fix));
        }
    };
    let local_ip = ctl.local_addr().map(|a| a.ip()).ok();
    let (mut bed, remote) = meet(&mut ctl, local_ip, opts, r)?;
    check_path(&bed.end, &remote, r)?;
    connect_qp(&mut bed, &mut ctl, r)?;
    data_plane(&mut bed, &mut ctl, &remote, opts, r)?;
    cm_probe(&mut ctl, opts, r)
}

fn ctl_peer(ctl: &TcpStream) -> String {
    ctl.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "the peer".into())
}

fn connect_control(peer: &str, port: u16, timeout: Duration) -> Result<TcpStream, String> {
    let with_port =
        if peer.parse::<IpAddr>().is_ok() || !peer.contains(':') { format!("{peer}:{port}") } else { peer.to_owned() };
    let addrs: Vec<SocketAddr> =
        with_port.to_socket_addrs().map_err(|e| format!("cannot resolve {peer}: {e}"))?.collect();
    let mut last = format!("{peer} resolves to no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => {
                s.set_read_timeout(Some(timeout)).and_then(|()| s.set_write_timeout(Some(timeout))).ok();
                s.set_nodelay(true).ok();
                return Ok(s);
            }
            Err(e) => last = format!("TCP connect to {a}: {e} (no `rdma-doctor --serve` listening there?)"),
        }
    }
    Err(last)
}

/// Sets this end up, exchanges hellos, and records why either end cannot go on.
fn meet(
    ctl: &mut TcpStream,
    local_ip: Option<IpAddr>,
    opts: &PeerOptions,
    r: &mut PeerReport,
) -> Result<(Bed, End), ()> {
    let bed = Bed::new(local_ip, opts);
    let end = match &bed {
        Ok(b) => b.end.clone(),
        Err(e) => End::clone(e),
    };
    r.local = Some(end.clone());
    let remote = match say_hello(ctl, &end) {
        Ok(h) => h,
        Err(e) => {
            let fix = "run the same rdma-doctor version with `--serve` on the peer".to_owned();
            return r.fail("control channel", e, Some(fix));
        }
    };
    r.pass("control channel", format!("TCP to {} and the doctors' hello (version {VERSION})", ctl_peer(ctl)));
    r.remote = Some(remote.clone());
    let here_fix = |e: &End| match e.error.as_deref() {
        Some(m) if m.contains("no active port") => Some("bring a port up: `rdma link` shows its state".to_owned()),
        _ => Some("run `rdma-doctor` on that node for the layer below".to_owned()),
    };
    // No port or GID is addressing; a QP that could not be built, this end's setup.
    let layer = |e: &str| if e.starts_with(SETUP) { "QP setup" } else { "addressing" };
    if let Some(e) = &end.error {
        return r.fail(layer(e), format!("here: {e}"), here_fix(&end));
    }
    if let Some(e) = &remote.error {
        return r.fail(layer(e), format!("there: {e}"), here_fix(&remote));
    }
    let bed = bed.map_err(|_| ())?;
    Ok((bed, remote))
}

/// Writes our hello, reads theirs.
fn say_hello(ctl: &mut TcpStream, end: &End) -> Result<End, String> {
    let hello = Hello { magic: MAGIC.into(), version: VERSION, end: end.clone() };
    let line = serde_json::to_string(&hello).map_err(|e| e.to_string())?;
    send_line(ctl, &line)?;
    let theirs = read_line(ctl)?;
    let h: Hello = serde_json::from_str(&theirs)
        .map_err(|e| format!("the peer's hello is not an rdma-doctor hello ({e}): is that port another program?"))?;
    if h.magic != MAGIC || h.version != VERSION {
        return Err(format!(
            "the peer speaks {} version {}, this doctor {MAGIC} version {VERSION}",
            h.magic, h.version
        ));
    }
    Ok(h.end)
}

/// Link layers and GID types must match; the MTU in use is the smaller.
fn check_path(here: &End, there: &End, r: &mut PeerReport) -> Result<(), ()> {
    if here.link_layer != there.link_layer {
        let d = format!(
            "link layers differ: {} here, {} there: no RDMA path joins them",
            here.link_layer, there.link_layer
        );
        return r.fail("path", d, Some("connect ports of the same fabric (both RoCE or both InfiniBand)".into()));
    }
    if here.gid_type != there.gid_type {
        let d = format!(
            "GID types differ: {} here, {} there: the packets would not be understood",
            here.gid_type, there.gid_type
        );
        return r.fail("path", d, Some("use RoCE v2 GIDs on both ends (`-x` / gid index)".into()));
    }
    let mut d = format!("{} both ends, {} GIDs", here.link_layer, here.gid_type);
    if here.active_mtu == there.active_mtu {
        d += &format!(", active MTU {} both ends", here.active_mtu);
    } else {
        d += &format!(
            ", active MTU {} here and {} there: the path uses {}",
            here.active_mtu,
            there.active_mtu,
            here.active_mtu.min(there.active_mtu)
        );
    }
    for (side, e) in [("here", here), ("there", there)] {
        if !e.gid_matches_address {
            d += &format!("; {side} no GID carries the control address {}, GID[{}] used", e.address, e.gid_index);
        }
    }
    r.pass("path", d);
    Ok(())
}

fn connect_qp(bed: &mut Bed, ctl: &mut TcpStream, r: &mut PeerReport) -> Result<(), ()> {
    match bed.connect(ctl) {
        Ok(mtu) => {
            r.pass("QP connection", format!("RC QP {} at RTS with the peer's QP, path MTU {mtu}", bed.qp.qp_num()));
            Ok(())
        }
        Err(e) => r.fail(
            "QP connection",
            format!("{e} (the kernel's control plane, or the exchange)"),
            Some("compare both nodes' GID tables (`rdma-doctor` on each) and their route to each other".into()),
        ),
    }
}

/// The prober's data-plane steps, then the server's reverse WRITE and SEND.
fn data_plane(
    bed: &mut Bed,
    ctl: &mut TcpStream,
    remote: &End,
    opts: &PeerOptions,
    r: &mut PeerReport,
) -> Result<(), ()> {
    let t = opts.timeout;
    let Some(peer_mr) = bed.peer_mr else {
        return r.fail("RDMA_WRITE", "the peer advertised no region", None);
    };
    step(r, "RDMA_WRITE", || {
        bed.post_wait(|b| SendWr::write(b, 0..LEN, peer_mr), &pattern(1), t)?;
        ask(ctl, "WRITE")
    })?;
    step(r, "RDMA_READ", || {
        let read_src = peer_mr.slice(LEN as u64..2 * LEN as u64).map_err(|e| e.to_string())?;
        let got = bed.post_wait(|b| SendWr::read(b, 0..LEN, read_src), &[], t)?;
        same(&got[..LEN], &pattern(2), "the READ result")?;
        Ok(format!("{LEN} bytes read from the peer's region and verified"))
    })?;
    step(r, "SEND", || {
        bed.post_wait(|b| SendWr::send(b, 0..LEN), &pattern(3), t)?;
        ask(ctl, "SEND")
    })?;
    if bed.end.atomics && remote.atomics {
        let word = peer_mr.slice(ATOMIC_AT as u64..ATOMIC_AT as u64 + 8).map_err(|_| ())?;
        step(r, "FETCH_ADD", || {
            let got = bed.post_wait(|b| SendWr::fetch_add(b, 0, word, ADD), &[], t)?;
            let old = u64::from_ne_bytes(got[..8].try_into().unwrap_or_default());
            let order = returned_order(old, FIRST_VALUE)?;
            let now = ask(ctl, "FETCH_ADD")?;
            Ok(format!("returned the old value {FIRST_VALUE:#x} ({order}); {now}"))
        })?;
        step(r, "CMP_SWAP", || {
            let current = FIRST_VALUE.wrapping_add(ADD);
            let got = bed.post_wait(|b| SendWr::compare_swap(b, 0, word, current, SWAP), &[], t)?;
            let old = u64::from_ne_bytes(got[..8].try_into().unwrap_or_default());
            let order = returned_order(old, current)?;
            let now = ask(ctl, "CMP_SWAP")?;
            Ok(format!("compared {current:#x} ({order}); {now}"))
        })?;
    } else {
        r.pass("atomics", "skipped: a device reports no atomic support (atomic_cap NONE)");
    }
    step(r, "reverse WRITE+SEND", || {
        ask(ctl, "REVERSE")?;
        let mut got = vec![0u8; LEN];
        bed.target.read_at(0, &mut got).map_err(|e| e.to_string())?;
        same(&got, &pattern(4), "the peer's WRITE into our region")?;
        let msg = bed.take_recv(t)?;
        same(&msg, &pattern(5), "the peer's SEND")?;
        Ok(format!("the peer's {LEN}-byte WRITE and SEND arrived here intact"))
    })
}

/// Runs one check; a failure is recorded with the fix its text suggests.
fn step(r: &mut PeerReport, layer: &str, f: impl FnOnce() -> Result<String, String>) -> Result<(), ()> {
    match f() {
        Ok(d) => {
            r.pass(layer, d);
            Ok(())
        }
        Err(e) => {
            let fix = data_fix(&e);
            r.fail(layer, e, fix)
        }
    }
}

/// The usual fix of a data-plane failure, from what the error says.
fn data_fix(e: &str) -> Option<String> {
    if e.contains("retries exhausted") || e.contains("never acknowledged") || e.contains("no completion") {
        Some(
            "RoCE packets are lost between the nodes while TCP gets through: check that UDP port 4791 \
             passes (firewall, `tc`), that the path's MTU fits the network, and the peer's port state"
                .into(),
        )
    } else if e.contains("access") {
        Some("the peer refused the access: compare both doctors' versions".into())
    } else {
        None
    }
}

fn cm_probe(ctl: &mut TcpStream, opts: &PeerOptions, r: &mut PeerReport) -> Result<(), ()> {
    step(r, "rdma_cm", || {
        let answer = ask(ctl, "CM")?;
        let port: u16 = answer
            .strip_prefix("listening on port ")
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("the peer's rdma_cm listener: {answer}"))?;
        let ip = ctl.peer_addr().map_err(|e| e.to_string())?.ip();
        let sent = crate::rdma_cm::connect_and_send(SocketAddr::new(ip, port), opts.timeout);
        let verdict = read_answer(ctl);
        sent.map_err(|e| format!("rdma_cm to {ip}:{port}: {e}"))?;
        verdict.map(|v| format!("connected to {ip}:{port}; {v}"))
    })
    .map_err(|()| {
        if let Some(c) = r.checks.last_mut() {
            c.fix = Some(
                "check rdma_ucm and /dev/infiniband/rdma_cm on both nodes (`rdma-doctor` on each), \
                 and that both resolve each other's address over the RDMA interface"
                    .into(),
            );
        }
    })
}

// ---- the server ----------------------------------------------------------------------

/// Serves probes on `port` (every address), one at a time, each with a fresh QP; returns
/// after one when `once`. Each probe is logged on `log`.
pub fn serve(port: u16, once: bool, opts: &PeerOptions, log: &mut dyn Write) -> Result<i32, String> {
    let listener = TcpListener::bind(("0.0.0.0", port)).map_err(|e| format!("listening on TCP port {port}: {e}"))?;
    let _ = writeln!(log, "rdma-doctor: serving peer probes on TCP port {port}");
    loop {
        let (mut ctl, from) = listener.accept().map_err(|e| format!("accepting a probe: {e}"))?;
        ctl.set_read_timeout(Some(opts.timeout)).and_then(|()| ctl.set_write_timeout(Some(opts.timeout))).ok();
        ctl.set_nodelay(true).ok();
        let verdict = answer(&mut ctl, opts);
        let _ = match &verdict {
            Ok(()) => writeln!(log, "rdma-doctor: probe from {from}: done"),
            Err(e) => writeln!(log, "rdma-doctor: probe from {from}: {e}"),
        };
        if once {
            return Ok(i32::from(verdict.is_err()));
        }
    }
}

/// Answers one probe: the hello, the QP, then each request of the prober.
fn answer(ctl: &mut TcpStream, opts: &PeerOptions) -> Result<(), String> {
    let local_ip = ctl.local_addr().map(|a| a.ip()).ok();
    let bed = Bed::new(local_ip, opts);
    let end = match &bed {
        Ok(b) => b.end.clone(),
        Err(e) => End::clone(e),
    };
    say_hello(ctl, &end)?;
    let mut bed = bed.map_err(|e| e.error.unwrap_or_default())?;
    bed.connect(ctl).map_err(|e| format!("connecting the QP: {e}"))?;
    loop {
        let request = match read_line(ctl) {
            Ok(l) => l,
            // The prober stopped (its own failure, or the end).
            Err(_) => return Ok(()),
        };
        let verdict = match request.as_str() {
            "WRITE" => check_region(&bed, 0, &pattern(1), "the WRITE"),
            "SEND" => bed
                .take_recv(opts.timeout)
                .and_then(|m| same(&m, &pattern(3), "the SEND"))
                .map(|()| format!("the peer's receive of {LEN} bytes verified")),
            "FETCH_ADD" => word_is(&bed, &[FIRST_VALUE.wrapping_add(ADD)], "FETCH_ADD"),
            "CMP_SWAP" => word_is(&bed, &[SWAP], "CMP_SWAP"),
            "REVERSE" => bed.reverse(opts.timeout),
            "CM" => {
                let ip = match local_ip {
                    Some(IpAddr::V4(ip)) => ip,
                    _ => Ipv4Addr::UNSPECIFIED,
                };
                let mut announced = false;
                let served = crate::rdma_cm::serve_one(ip, opts.timeout, |addr| {
                    announced = true;
                    send_line(ctl, &format!("OK listening on port {}", addr.port()))
                });
                // A listener that never came up was not announced: its failure is the
                // answer to the request (else the answer after the connection).
                if !announced {
                    send_line(ctl, &format!("FAIL {}", served.err().unwrap_or_default()))?;
                    continue;
                }
                served.map(|v| format!("{v} by the peer"))
            }
            other => Err(format!("unknown request {other:?}")),
        };
        match verdict {
            Ok(v) => send_line(ctl, &format!("OK {v}"))?,
            Err(e) => send_line(ctl, &format!("FAIL {e}"))?,
        }
    }
}

fn check_region(bed: &Bed, at: usize, want: &[u8], what: &str) -> Result<String, String> {
    let mut got = vec![0u8; want.len()];
    bed.target.read_at(at, &mut got).map_err(|e| e.to_string())?;
    same(&got, want, &format!("{what} in the peer's region"))?;
    Ok(format!("{} bytes verified in the peer's region", want.len()))
}

fn word_is(bed: &Bed, want: &[u64], what: &str) -> Result<String, String> {
    let word = bed.target.atomic_u64(ATOMIC_AT).map_err(|e| e.to_string())?;
    let now = word.load(std::sync::atomic::Ordering::Relaxed);
    if want.iter().any(|w| *w == now || w.swap_bytes() == now) {
        Ok(format!("the peer's word is {now:#x} after {what}"))
    } else {
        Err(format!("after {what} the peer's word is {now:#x}, expected {:#x}", want[0]))
    }
}

// ---- one end's resources -------------------------------------------------------------

/// One end: its QP and queues, the region the peer reaches, and what it said of itself.
/// Fields drop in order: the queues and the QP before the regions.
struct Bed {
    sq: SendQueue<Chunk>,
    rq: RecvQueue<Chunk>,
    qp: QueuePair,
    cq: CompletionQueue,
    /// Sources and sinks of this end's requests (one chunk at a time is posted).
    spare: Vec<Chunk>,
    /// The region the peer WRITEs, READs and does atomics on.
    target: MemoryRegion<AlignedBuf, RemoteWritable>,
    peer_mr: Option<RemoteMr>,
    end: End,
    ctx_port: u8,
    _pd: ProtectionDomain,
}

impl Bed {
    /// Finds the device, port and GID for `local_ip` and builds the QP; on failure, the
    /// [`End`] that says why (to send in the hello).
    fn new(local_ip: Option<IpAddr>, opts: &PeerOptions) -> Result<Bed, Box<End>> {
        let mut end = End {
            host: crate::input::read_limited(std::path::Path::new("/proc/sys/kernel/hostname"))
                .map(|h| h.trim().to_owned())
                .unwrap_or_default(),
            address: local_ip.map(|ip| ip.to_string()).unwrap_or_default(),
            ..End::default()
        };
        let fail = |mut end: End, e: String| {
            end.error = Some(e);
            Box::new(end)
        };
        let (ctx, port, gid) = match choose(local_ip, opts) {
            Ok(c) => c,
            Err(e) => return Err(fail(end, e)),
        };
        let attr = match ctx.query_port(port) {
            Ok(a) => a,
            Err(e) => return Err(fail(end, e.to_string())),
        };
        end.device = ctx.name().to_owned();
        end.port = port;
        end.gid_index = gid.index;
        end.gid = gid.gid.to_ipv6().to_string();
        end.gid_type = gid.gid_type.to_string();
        end.gid_matches_address = local_ip.is_some_and(|ip| gid_carries(&gid.gid, ip));
        end.active_mtu = attr.active_mtu.bytes();
        end.link_layer = if attr.is_ethernet() { "Ethernet" } else { "InfiniBand" }.into();
        end.atomics = ctx.query_device().map(|d| d.atomic_cap.supported()).unwrap_or(false);
        Self::build(&ctx, port, end.clone()).map_err(|e| fail(end, format!("{SETUP}: {e}")))
    }

    fn build(ctx: &Context, port: u8, end: End) -> Result<Bed, String> {
        Self::try_build(ctx, port, end).map_err(|e| e.to_string())
    }

    fn try_build(ctx: &Context, port: u8, end: End) -> rdma_verbs::Result<Bed> {
        let pd = ProtectionDomain::new(ctx)?;
        let cq = CompletionQueue::new(ctx, 16)?;
        let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(4).max_recv_wr(4).build()?;
        let remote = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let mut target = pd.register_remote_writable(AlignedBuf::new(4 * LEN)?, remote)?;
        target.write_at(LEN, &pattern(2))?;
        target.atomic_u64(ATOMIC_AT)?.store(FIRST_VALUE, std::sync::atomic::Ordering::Relaxed);
        let spare = pd.register(AlignedBuf::new(4 * LEN)?, AccessFlags::LOCAL_WRITE)?.into_chunks(LEN)?;
        let sq = qp.send_queue()?;
        let rq: RecvQueue<Chunk> = qp.recv_queue()?;
        Ok(Bed { sq, rq, qp, cq, spare, target, peer_mr: None, end, ctx_port: port, _pd: pd })
    }

    /// The endpoint handshake over the control channel; the path MTU in use.
    fn connect(&mut self, ctl: &mut TcpStream) -> rdma_verbs::Result<String> {
        let access = QpAccess::REMOTE_WRITE | QpAccess::REMOTE_READ | QpAccess::REMOTE_ATOMIC;
        // The default retries (6 of 67 ms each; rxe takes 7 as "retry forever"): a probe of
        // a path that drops RoCE ends with an error within about half a second.
        let hs = Handshake::new(&self.qp)
            .rts(RtsAttr::default())
            .port(self.ctx_port)
            .gid_index(self.end.gid_index)
            .access(access)
            .advertise(self.target.remote()?);
        // The receive for the peer's SEND goes in at INIT, before the peer can send (a
        // QP in RESET takes none). Four chunks: this one, three spares for requests.
        hs.init()?;
        if let Some(recv) = self.spare.pop() {
            self.rq.post(recv, 0..LEN, 1).map_err(|r| r.error)?;
        }
        let conn = hs.connect(ctl)?;
        self.peer_mr = conn.remote.mr;
        Ok(format!("{}", conn.path_mtu.bytes()))
    }

    /// Posts one request built by `make` around a spare chunk holding `fill`, waits for
    /// its completion, and hands the chunk's bytes back (READ and atomic results).
    fn post_wait(
        &mut self,
        make: impl FnOnce(Chunk) -> SendWr<Chunk>,
        fill: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, String> {
        let mut buf = self.spare.pop().ok_or("no spare buffer (a request is still out)")?;
        buf[..fill.len()].copy_from_slice(fill);
        let start = Instant::now();
        self.sq.post(make(buf).id(7)).map_err(|r| r.error.to_string())?;
        let mut wc = wait(&mut self.cq, timeout, "the request")?;
        let mut back = None;
        self.sq.complete(&mut wc, |d| back = Some(d)).map_err(|e| e.to_string())?;
        let done = back.ok_or("the completion handed nothing back")?;
        let done = done.result().map_err(|r| {
            let text = format!("{} (reported {} ms after the post)", r.error, start.elapsed().as_millis());
            self.spare.push(r.value);
            text
        })?;
        let bytes = done.buf[..LEN].to_vec();
        self.spare.push(done.buf);
        Ok(bytes)
    }

    /// Waits for the receive posted at setup; its bytes.
    fn take_recv(&mut self, timeout: Duration) -> Result<Vec<u8>, String> {
        let mut wc = wait(&mut self.cq, timeout, "the peer's SEND")?;
        let done = self.rq.complete(&mut wc).map_err(|e| e.to_string())?;
        let done = done.result().map_err(|r| r.error.to_string())?;
        let len = (done.byte_len as usize).min(done.buf.len());
        let bytes = done.buf[..len].to_vec();
        self.spare.push(done.buf);
        Ok(bytes)
    }

    /// The server's turn: WRITE and SEND to the prober.
    fn reverse(&mut self, timeout: Duration) -> Result<String, String> {
        let peer = self.peer_mr.ok_or("the prober advertised no region")?;
        self.post_wait(|b| SendWr::write(b, 0..LEN, peer), &pattern(4), timeout)?;
        self.post_wait(|b| SendWr::send(b, 0..LEN), &pattern(5), timeout)?;
        Ok(format!("the peer WRITE and SENT {LEN} bytes each"))
    }
}

/// The device, port and GID for the control connection's local address: the GID that
/// carries it, else the first active port's default GID.
fn choose(local_ip: Option<IpAddr>, opts: &PeerOptions) -> Result<(Context, u8, rdma_verbs::GidEntry), String> {
    let list = rdma_verbs::devices().map_err(|e| format!("listing RDMA devices: {e}"))?;
    let names: Vec<String> = match &opts.device {
        Some(d) => vec![d.clone()],
        None => list.names(),
    };
    let mut fallback = None;
    for name in names {
        let ctx = Context::open(Some(&name)).map_err(|e| format!("opening {name}: {e}"))?;
        let ports = ctx.query_device().map_err(|e| e.to_string())?.phys_port_cnt;
        for port in (1..=ports).filter(|p| opts.port.is_none_or(|want| want == *p)) {
            let active = ctx.query_port(port).map(|a| a.state == PortState::Active).unwrap_or(false);
            if !active {
                continue;
            }
            let table = ctx.gid_table(port).unwrap_or_default();
            if let Some(g) =
                local_ip.and_then(|ip| table.iter().find(|g| gid_carries(&g.gid, ip) && g.gid_type == GidType::RoceV2))
            {
                let g = g.clone();
                return Ok((ctx, port, g));
            }
            if fallback.is_none() {
                if let Ok(g) = ctx.default_gid(port) {
                    fallback = Some((name.clone(), port, g));
                }
            }
        }
    }
    match fallback {
        Some((name, port, g)) => Ok((Context::open(Some(&name)).map_err(|e| e.to_string())?, port, g)),
        None => Err("no active port on any RDMA device".into()),
    }
}

fn gid_carries(gid: &rdma_verbs::Gid, ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => gid.ipv4() == Some(v4),
        IpAddr::V6(v6) => gid.to_ipv6() == v6,
    }
}

// ---- the control channel's lines -----------------------------------------------------

fn send_line(ctl: &mut TcpStream, line: &str) -> Result<(), String> {
    ctl.write_all(format!("{line}\n").as_bytes()).map_err(|e| format!("writing to the peer: {e}"))
}

/// One line from the peer, at most [`LINE_MAX`] bytes, read byte by byte so nothing past
/// it is taken from the stream (the handshake follows the hello on the same stream).
fn read_line(ctl: &mut TcpStream) -> Result<String, String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match ctl.read(&mut byte) {
            Ok(0) => return Err("the peer closed the control connection".into()),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) if line.len() >= LINE_MAX => return Err(format!("the peer sent a line over {LINE_MAX} bytes")),
            Ok(_) => line.push(byte[0]),
            Err(e) => return Err(format!("reading from the peer: {e}")),
        }
    }
    String::from_utf8(line).map_err(|_| "the peer sent a line that is not UTF-8".into())
}

/// Sends a request and reads the peer's verdict: `OK ...` or `FAIL ...`.
fn ask(ctl: &mut TcpStream, request: &str) -> Result<String, String> {
    send_line(ctl, request)?;
    read_answer(ctl)
}

fn read_answer(ctl: &mut TcpStream) -> Result<String, String> {
    let line = read_line(ctl)?;
    if let Some(ok) = line.strip_prefix("OK ") {
        Ok(ok.to_owned())
    } else if let Some(fail) = line.strip_prefix("FAIL ") {
        Err(format!("the peer: {fail}"))
    } else {
        Err(format!("the peer answered {line:?}"))
    }
}

// ---- small helpers -------------------------------------------------------------------

/// The loopback test's pattern, [`LEN`] bytes of it.
fn pattern(seed: u8) -> Vec<u8> {
    crate::loopback::pattern(LEN, seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (a, b)
    }

    #[test]
    fn lines_are_bounded_and_leave_what_follows_in_the_stream() {
        let (mut a, mut b) = pair();
        a.write_all(b"first\nsecond\n").unwrap();
        assert_eq!(read_line(&mut b).unwrap(), "first");
        assert_eq!(read_line(&mut b).unwrap(), "second");
        a.write_all(&vec![b'x'; LINE_MAX + 10]).unwrap();
        assert!(read_line(&mut b).unwrap_err().contains("over 4096 bytes"));
        drop(a);
    }

    #[test]
    fn a_hello_from_another_program_or_version_is_refused() {
        let (mut a, mut b) = pair();
        a.write_all(b"HTTP/1.1 400 Bad Request\n").unwrap();
        let e = say_hello(&mut b, &End::default()).unwrap_err();
        assert!(e.contains("not an rdma-doctor hello"), "{e}");
        let other = Hello { magic: MAGIC.into(), version: VERSION + 1, end: End::default() };
        a.write_all(format!("{}\n", serde_json::to_string(&other).unwrap()).as_bytes()).unwrap();
        let e = say_hello(&mut b, &End::default()).unwrap_err();
        assert!(e.contains("version 2"), "{e}");
        let typo = r#"{"magic":"rdma-doctor-peer","version":1,"end":{"host":3}}"#;
        a.write_all(format!("{typo}\n").as_bytes()).unwrap();
        assert!(say_hello(&mut b, &End::default()).is_err());
    }

    #[test]
    fn the_path_check_names_what_differs() {
        let end = |ll: &str, ty: &str, mtu| End {
            link_layer: ll.into(),
            gid_type: ty.into(),
            active_mtu: mtu,
            gid_matches_address: true,
            ..End::default()
        };
        let mut r = PeerReport::default();
        assert!(check_path(&end("Ethernet", "RoCE v2", 1024), &end("InfiniBand", "IB", 4096), &mut r).is_err());
        assert!(r.checks[0].detail.contains("link layers differ"));
        let mut r = PeerReport::default();
        assert!(check_path(&end("Ethernet", "RoCE v2", 1024), &end("Ethernet", "RoCE v1", 1024), &mut r).is_err());
        assert!(r.checks[0].detail.contains("GID types differ"));
        let mut r = PeerReport::default();
        check_path(&end("Ethernet", "RoCE v2", 4096), &end("Ethernet", "RoCE v2", 1024), &mut r).unwrap();
        assert!(r.checks[0].detail.contains("the path uses 1024"), "{}", r.checks[0].detail);
        assert_eq!(r.exit_code(), 0);
    }

    #[test]
    fn a_lost_packet_failure_advises_on_the_network() {
        let fix = data_fix("RDMA WRITE failed: transport retries exhausted (the peer never acknowledged)").unwrap();
        assert!(fix.contains("UDP port 4791"));
        assert!(data_fix("something else").is_none());
    }
}
