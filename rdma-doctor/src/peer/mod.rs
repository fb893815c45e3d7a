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
//! addressing (the GID for the route), the path (link layers, GID types, MTUs; a warning
//! of its own when the two ends' MTUs differ), the QP connection (the kernel's control
//! plane), each data-plane operation, messages at the path MTU and beyond (one MTU, four
//! MTUs, 64 KiB, each WRITTEN and READ: a hop that drops large packets is named), and
//! rdma_cm to the server's RDMA address (the IP its GID carries, told in its hello). A
//! data-plane check that fails is tried once more on fresh QPs before it is called
//! failed; one that passes then is a warning. The first failure stops what depends on
//! it, and names the layer with the usual cause and a fix. Every wait is bounded by the
//! timeout; every line the peer sends is read with a size limit and parsed strictly.
//!
//! The server ([`serve`]) answers up to [`MAX_PROBES`] probes at once, each with its own
//! QP. A connection holds nothing of the device until its hello line is complete, and must
//! complete it within the server's timeout; at most [`MAX_WAITING`] connections wait for
//! their hello, a new one beyond that closing the oldest waiting one (an honest prober
//! speaks within its first round trip), so silent or dripping clients cannot keep a prober
//! out. Past [`MAX_PROBES`] a client gets one `BUSY` line and is closed at once, never
//! queued; and every read and write of a probe is bounded by the exchange's deadline,
//! [`EXCHANGE_TIMEOUTS`] timeouts after accept.

mod bed;
mod door;
mod serve;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

// The sizes, the atomic word and its values, and the checks of the one-node loopback test.
use crate::loopback::{returned_order, same, ADD, ATOMIC_AT, FIRST_VALUE, LEN, SWAP};

use rdma_verbs::SendWr;

use bed::{Bed, BIG, BIG_READ_AT, BIG_SEED, BIG_WRITE_AT};
pub(crate) use door::Control;
pub use door::{EXCHANGE_TIMEOUTS, MAX_PROBES, MAX_WAITING};
pub use serve::serve;

/// The TCP port `--serve` listens on and `--peer` connects to by default.
pub const DEFAULT_PORT: u16 = 18516;
/// What a hello starts with; the protocol's version follows in the hello.
const MAGIC: &str = "rdma-doctor-peer";
/// The exchange's version. 2: the hello names the end's RDMA address and netdev (and its
/// MTU), the server takes `WRITE N` (a large WRITE to check), `AGAIN` (fresh QPs for a
/// retry), reads the prober's hello before it sends its own, and may answer `BUSY`.
const VERSION: u32 = 2;
/// The version of the `--peer --json` report (docs/doctor-json.md).
pub const PEER_FORMAT_VERSION: u32 = 2;
/// How an end's error starts when its QP could not be built.
const SETUP: &str = "setting up the QP";
/// The longest line either side reads from the other.
const LINE_MAX: usize = 4096;
/// What a busy server answers instead of its hello.
const BUSY: &str = "BUSY ";

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
    /// The IP address the GID carries (a RoCE v2 GID), where rdma_cm reaches this end;
    /// empty when it carries none.
    pub rdma_address: String,
    /// The netdev under the GID (RoCE), empty when none.
    pub netdev: String,
    /// Its MTU in bytes, 0 when unknown.
    pub netdev_mtu: u32,
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

/// Only the version of a hello, read first so that a hello of another version is named
/// as such rather than as a parse error.
#[derive(Debug, Deserialize)]
struct HelloVersion {
    magic: String,
    version: u32,
}

/// One check of the path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    /// The layer: `control channel`, `addressing`, `QP setup`, `path`, `MTU`,
    /// `QP connection`, `RDMA_WRITE`, `RDMA_READ`, `SEND`, `FETCH_ADD`, `CMP_SWAP`,
    /// `reverse WRITE+SEND`, `1 MTU message`, `4 MTU message`, `64 KiB message`, `rdma_cm`.
    pub layer: String,
    /// Passed (also when with a warning).
    pub ok: bool,
    /// Passed, but with something to look at: a check that failed once and passed on
    /// its retry, or MTUs that differ between the two ends.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warning: bool,
    /// What was verified, or what went wrong.
    pub detail: String,
    /// The usual fix, when it failed or warns.
    pub fix: Option<String>,
}

/// What `--peer` found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerReport {
    /// [`PEER_FORMAT_VERSION`].
    #[serde(default)]
    pub format_version: u32,
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

/// Whether a check's layer is one of the data plane's (the operations and the sizes).
fn is_data_layer(layer: &str) -> bool {
    matches!(layer, "RDMA_WRITE" | "RDMA_READ" | "SEND" | "FETCH_ADD" | "CMP_SWAP" | "reverse WRITE+SEND")
        || layer.ends_with(" message")
}

impl PeerReport {
    /// 1 when a check failed (or none ran), else 4 when one warned, else 0: the doctor's
    /// exit statuses.
    pub fn exit_code(&self) -> i32 {
        if self.checks.is_empty() || self.checks.iter().any(|c| !c.ok) {
            1
        } else if self.checks.iter().any(|c| c.warning) {
            crate::Status::Warnings.exit_code()
        } else {
            0
        }
    }

    /// The report for a person: the two ends, then one line per check, failures first,
    /// then warnings.
    pub fn to_text(&self) -> String {
        let mut s = format!("rdma-doctor --peer {}\n", self.peer);
        for (name, end) in [("here ", &self.local), ("there", &self.remote)] {
            if let Some(e) = end {
                s += &format!(
                    "  {name}: {} {} {} port {} GID[{}] {} ({}), active MTU {}, {}",
                    e.host, e.address, e.device, e.port, e.gid_index, e.gid, e.gid_type, e.active_mtu, e.link_layer
                );
                if !e.netdev.is_empty() {
                    s += &format!(", netdev {} MTU {}", e.netdev, e.netdev_mtu);
                }
                s += "\n";
            }
        }
        let mut order: Vec<&Check> = self.checks.iter().filter(|c| !c.ok).collect();
        order.extend(self.checks.iter().filter(|c| c.ok && c.warning));
        order.extend(self.checks.iter().filter(|c| c.ok && !c.warning));
        for c in order {
            let tag = match (c.ok, c.warning) {
                (false, _) => "FAIL",
                (true, true) => "WARN",
                (true, false) => "PASS",
            };
            s += &format!("{tag}  {:<18} {}\n", c.layer, c.detail);
            c.fix.iter().for_each(|f| s += &format!("      fix (advice, not run): {f}\n"));
        }
        if let Some(first) = self.checks.iter().find(|c| !c.ok) {
            if first.layer.ends_with(" message") {
                s += "the control plane and messages up to the size that passed work between these two \
                      nodes; larger messages do not\n";
            } else if is_data_layer(&first.layer) {
                s += "the control plane works (TCP, both doctors, the QPs at RTS) and the data plane \
                      between these two nodes does not\n";
            }
        }
        let failed = self.checks.iter().filter(|c| !c.ok).count();
        let warned = self.checks.iter().filter(|c| c.ok && c.warning).count();
        s += &match (failed, warned) {
            (0, 0) => format!("result: the path to {} works end to end ({} ms)\n", self.peer, self.elapsed_ms),
            (0, w) => format!(
                "result: the path to {} works end to end, with {w} warning(s) ({} ms)\n",
                self.peer, self.elapsed_ms
            ),
            (n, _) => format!("result: {n} check(s) failed on the path to {}\n", self.peer),
        };
        s
    }

    /// The report as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    fn pass(&mut self, layer: &str, detail: impl Into<String>) {
        self.checks.push(Check { layer: layer.into(), ok: true, warning: false, detail: detail.into(), fix: None });
    }

    fn warn(&mut self, layer: &str, detail: impl Into<String>, fix: Option<String>) {
        self.checks.push(Check { layer: layer.into(), ok: true, warning: true, detail: detail.into(), fix });
    }

    /// Records a failure; returns `Err(())` so a step can stop with `?`.
    fn fail<T>(&mut self, layer: &str, detail: impl Into<String>, fix: Option<String>) -> Result<T, ()> {
        self.checks.push(Check { layer: layer.into(), ok: false, warning: false, detail: detail.into(), fix });
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
    let mut r = PeerReport { format_version: PEER_FORMAT_VERSION, peer: peer.to_owned(), ..PeerReport::default() };
    let _ = probe_steps(peer, opts, &mut r);
    r.elapsed_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    r
}

fn probe_steps(peer: &str, opts: &PeerOptions, r: &mut PeerReport) -> Result<(), ()> {
    let stream = match connect_control(peer, opts.tcp_port, opts.timeout) {
        Ok(c) => c,
        Err(e) => {
            let fix =
                format!("run `rdma-doctor --serve` on {peer} and let TCP reach its port (default {DEFAULT_PORT})");
            return r.fail("control channel", e, Some(fix));
        }
    };
    // The server's answer to a request may take its own full timeout (a completion it
    // waits for): the prober waits twice that for a line, so the two never cross.
    let mut ctl = Control::new(stream, opts.timeout * 2, None);
    let local_ip = ctl.local_addr().map(|a| a.ip()).ok();
    let (mut bed, remote) = meet(&mut ctl, local_ip, opts, r)?;
    check_path(&bed.end, &remote, r)?;
    connect_qp(&mut bed, &mut ctl, opts, r)?;
    let mut p = Prober { bed, ctl, local_ip, opts };
    p.data_plane(&remote, r)?;
    // rdma_cm does not depend on large messages: it runs whatever they found.
    let sized = p.sizes(r);
    let cm = cm_probe(&mut p.ctl, &remote, opts, r);
    sized.and(cm)
}

fn ctl_peer(ctl: &Control) -> String {
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
            Ok(s) => return Ok(s),
            Err(e) => last = format!("TCP connect to {a}: {e} (no `rdma-doctor --serve` listening there?)"),
        }
    }
    Err(last)
}

/// Sets this end up, exchanges hellos, and records why either end cannot go on.
fn meet(ctl: &mut Control, local_ip: Option<IpAddr>, opts: &PeerOptions, r: &mut PeerReport) -> Result<(Bed, End), ()> {
    let bed = Bed::new(local_ip, opts);
    let end = match &bed {
        Ok(b) => b.end.clone(),
        Err(e) => End::clone(e),
    };
    r.local = Some(end.clone());
    let remote = match say_hello(ctl, &end) {
        Ok(h) => h,
        Err(e) if e.starts_with("the server is busy") => {
            let fix = format!("probe again in a while: the server answers up to {MAX_PROBES} probes at once");
            return r.fail("control channel", e, Some(fix));
        }
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
fn say_hello(ctl: &mut Control, end: &End) -> Result<End, String> {
    send_hello(ctl, end)?;
    let theirs = read_line(ctl)?;
    if let Some(busy) = theirs.strip_prefix(BUSY) {
        return Err(format!("the server is busy: {busy}"));
    }
    parse_hello(&theirs)
}

fn send_hello(ctl: &mut Control, end: &End) -> Result<(), String> {
    let hello = Hello { magic: MAGIC.into(), version: VERSION, end: end.clone() };
    let line = serde_json::to_string(&hello).map_err(|e| e.to_string())?;
    send_line(ctl, &line)
}

/// The other end of a hello line, or why it is not one of ours.
fn parse_hello(line: &str) -> Result<End, String> {
    let not_ours = |e: serde_json::Error| {
        format!("the peer's hello is not an rdma-doctor hello ({e}): is that port another program?")
    };
    let v: HelloVersion = serde_json::from_str(line).map_err(not_ours)?;
    if v.magic != MAGIC || v.version != VERSION {
        return Err(format!(
            "the peer speaks {} version {}, this doctor {MAGIC} version {VERSION}",
            v.magic, v.version
        ));
    }
    let h: Hello = serde_json::from_str(line).map_err(not_ours)?;
    Ok(h.end)
}

/// Link layers and GID types must match; MTUs that differ are a warning of their own.
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
    }
    for (side, e) in [("here", here), ("there", there)] {
        if !e.gid_matches_address {
            d += &format!("; {side} no GID carries the control address {}, GID[{}] used", e.address, e.gid_index);
        }
    }
    r.pass("path", d);
    if let Some((what, fix)) = mtu_mismatch(here, there) {
        r.warn("MTU", what, Some(fix));
    }
    Ok(())
}

/// The two ends' MTUs when they differ (the ports' active MTUs, or the netdevs' MTUs where
/// both are known), and the fix.
fn mtu_mismatch(here: &End, there: &End) -> Option<(String, String)> {
    let netdevs_differ = here.netdev_mtu != 0 && there.netdev_mtu != 0 && here.netdev_mtu != there.netdev_mtu;
    if here.active_mtu == there.active_mtu && !netdevs_differ {
        return None;
    }
    let mut d = format!("MTU mismatch: active MTU {} here, {} there", here.active_mtu, there.active_mtu);
    if here.netdev_mtu != 0 && there.netdev_mtu != 0 {
        d += &format!(
            " (netdev {} MTU {} here, {} MTU {} there)",
            here.netdev, here.netdev_mtu, there.netdev, there.netdev_mtu
        );
    }
    d += &format!(
        ": the QPs run at {}; other programs that pick the MTU on one end only, and IP traffic of the larger MTU, \
         can lose packets between these nodes",
        here.active_mtu.min(there.active_mtu)
    );
    let fix = match (here.netdev_mtu, there.netdev_mtu) {
        (a, b) if a != 0 && b != 0 && a != b => {
            let (small, dev, host) =
                if a < b { (a, &there.netdev, &there.host) } else { (b, &here.netdev, &here.host) };
            format!(
                "give both netdevs one MTU, the one every switch port between them carries \
                 (e.g. on {host}: `ip link set dev {dev} mtu {small}`, or raise the other and the switches)"
            )
        }
        _ => "give both ports one MTU (the netdevs' MTUs, or the subnet manager's on InfiniBand)".to_owned(),
    };
    Some((d, fix))
}

fn connect_qp(bed: &mut Bed, ctl: &mut Control, opts: &PeerOptions, r: &mut PeerReport) -> Result<(), ()> {
    match bed.connect(ctl, opts.timeout) {
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

/// One data-plane check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Write,
    Read,
    Send,
    FetchAdd,
    CmpSwap,
    Reverse,
    /// A WRITE and a READ of this many bytes.
    Sized(usize),
}

/// The prober's half of the data plane: its end, the control channel, and what a fresh
/// pair of QPs needs.
struct Prober<'a> {
    bed: Bed,
    ctl: Control,
    local_ip: Option<IpAddr>,
    opts: &'a PeerOptions,
}

impl Prober<'_> {
    /// The 1 KiB operations, then the server's reverse WRITE and SEND.
    fn data_plane(&mut self, remote: &End, r: &mut PeerReport) -> Result<(), ()> {
        if self.bed.peer_mr.is_none() {
            return r.fail("RDMA_WRITE", "the peer advertised no region", None);
        }
        let mut ops = vec![Op::Write, Op::Read, Op::Send];
        if self.bed.end.atomics && remote.atomics {
            ops.extend([Op::FetchAdd, Op::CmpSwap]);
        } else {
            r.pass("atomics", "skipped: a device reports no atomic support (atomic_cap NONE)");
        }
        ops.push(Op::Reverse);
        for op in ops {
            self.check(op, r)?;
        }
        Ok(())
    }

    /// Messages of one MTU, four MTUs and 64 KiB, each WRITTEN and READ; the first size
    /// that fails (twice) is named, and the larger ones are not tried.
    fn sizes(&mut self, r: &mut PeerReport) -> Result<(), ()> {
        let mtu = self.bed.path_mtu as usize;
        let mut sizes: Vec<usize> = [mtu, 4 * mtu, BIG].into_iter().filter(|n| *n > 0 && *n <= BIG).collect();
        sizes.dedup();
        let mut largest_ok = LEN;
        for n in sizes {
            let before = r.checks.len();
            if self.check(Op::Sized(n), r).is_err() {
                if let Some(c) = r.checks.get_mut(before) {
                    c.detail = format!("{}; {}", black_hole(largest_ok, n, mtu), c.detail);
                    c.fix = Some(black_hole_fix(largest_ok, mtu));
                }
                return Err(());
            }
            largest_ok = largest_ok.max(n);
        }
        Ok(())
    }

    /// Runs `op`; when it fails, once more on fresh QPs. Recorded as a pass, a warning
    /// (failed, then passed), or a failure (failed twice).
    fn check(&mut self, op: Op, r: &mut PeerReport) -> Result<(), ()> {
        let layer = op.layer(self.bed.path_mtu as usize);
        let first = match self.run(op) {
            Ok(d) => {
                r.pass(&layer, d);
                return Ok(());
            }
            Err(e) => e,
        };
        let again = self.renew().and_then(|()| {
            // CMP_SWAP compares against the word FETCH_ADD left: a fresh region needs it again.
            if op == Op::CmpSwap {
                self.run(Op::FetchAdd).map_err(|e| format!("FETCH_ADD before it: {e}"))?;
            }
            self.run(op)
        });
        match again {
            Ok(d) => {
                let fix = "a healthy path does not lose a probe: look for drops and pauses on the nodes' ports \
                           and switches (ethtool -S counters, `rdma statistic`), and probe again"
                    .to_owned();
                r.warn(
                    &layer,
                    format!("failed, passed on retry with fresh QPs: {d}; the first try: {first}"),
                    Some(fix),
                );
                Ok(())
            }
            Err(second) => {
                let fix = data_fix(&first).or_else(|| data_fix(&second));
                r.fail(&layer, format!("failed twice: {first}; on retry with fresh QPs: {second}"), fix)
            }
        }
    }

    /// Fresh QPs on both ends (the failed one is in the error state), connected again.
    fn renew(&mut self) -> Result<(), String> {
        let fresh = Bed::new(self.local_ip, self.opts).map_err(|e| e.error.unwrap_or_default())?;
        self.bed = fresh;
        ask(&mut self.ctl, "AGAIN")?;
        self.bed.connect(&mut self.ctl, self.opts.timeout).map_err(|e| format!("connecting fresh QPs: {e}"))?;
        Ok(())
    }

    /// One operation, its data checked where it lands.
    fn run(&mut self, op: Op) -> Result<String, String> {
        let t = self.opts.timeout;
        let peer_mr = self.bed.peer_mr.ok_or("the peer advertised no region")?;
        let (bed, ctl) = (&mut self.bed, &mut self.ctl);
        let word = || peer_mr.slice(ATOMIC_AT as u64..ATOMIC_AT as u64 + 8).map_err(|e| e.to_string());
        match op {
            Op::Write => {
                bed.post_wait(false, |b| SendWr::write(b, 0..LEN, peer_mr), &pattern(1), t)?;
                ask(ctl, "WRITE")
            }
            Op::Read => {
                let src = peer_mr.slice(LEN as u64..2 * LEN as u64).map_err(|e| e.to_string())?;
                let got = bed.post_wait(false, |b| SendWr::read(b, 0..LEN, src), &[], t)?;
                same(&got[..LEN], &pattern(2), "the READ result")?;
                Ok(format!("{LEN} bytes read from the peer's region and verified"))
            }
            Op::Send => {
                bed.post_wait(false, |b| SendWr::send(b, 0..LEN), &pattern(3), t)?;
                ask(ctl, "SEND")
            }
            Op::FetchAdd => {
                let word = word()?;
                let got = bed.post_wait(false, |b| SendWr::fetch_add(b, 0, word, ADD), &[], t)?;
                let old = u64::from_ne_bytes(got[..8].try_into().unwrap_or_default());
                let order = returned_order(old, FIRST_VALUE)?;
                let now = ask(ctl, "FETCH_ADD")?;
                Ok(format!("returned the old value {FIRST_VALUE:#x} ({order}); {now}"))
            }
            Op::CmpSwap => {
                let word = word()?;
                let current = FIRST_VALUE.wrapping_add(ADD);
                let got = bed.post_wait(false, |b| SendWr::compare_swap(b, 0, word, current, SWAP), &[], t)?;
                let old = u64::from_ne_bytes(got[..8].try_into().unwrap_or_default());
                let order = returned_order(old, current)?;
                let now = ask(ctl, "CMP_SWAP")?;
                Ok(format!("compared {current:#x} ({order}); {now}"))
            }
            Op::Reverse => {
                ask(ctl, "REVERSE")?;
                let mut got = vec![0u8; LEN];
                bed.target.read_at(0, &mut got).map_err(|e| e.to_string())?;
                same(&got, &pattern(4), "the peer's WRITE into our region")?;
                let msg = bed.take_recv(t)?;
                same(&msg, &pattern(5), "the peer's SEND")?;
                Ok(format!("the peer's {LEN}-byte WRITE and SEND arrived here intact"))
            }
            Op::Sized(n) => {
                let at = |off: usize| peer_mr.slice(off as u64..(off + n) as u64).map_err(|e| e.to_string());
                let (dst, src) = (at(BIG_WRITE_AT)?, at(BIG_READ_AT)?);
                let packets = n.div_ceil(bed.path_mtu.max(1) as usize);
                bed.post_wait(true, |b| SendWr::write(b, 0..n, dst), &sized_pattern(n), t)
                    .map_err(|e| format!("the {n}-byte RDMA WRITE: {e}"))?;
                ask(ctl, &format!("WRITE {n}")).map_err(|e| format!("the {n}-byte RDMA WRITE: {e}"))?;
                let got = bed
                    .post_wait(true, |b| SendWr::read(b, 0..n, src), &[], t)
                    .map_err(|e| format!("the {n}-byte RDMA READ: {e}"))?;
                same(&got[..n.min(got.len())], &crate::loopback::pattern(n, BIG_SEED), "the large READ result")?;
                Ok(format!(
                    "a {n}-byte RDMA WRITE (checked by the peer) and READ (checked here), {packets} packet(s) \
                     each way at path MTU {}",
                    bed.path_mtu
                ))
            }
        }
    }
}

impl Op {
    fn layer(self, mtu: usize) -> String {
        match self {
            Op::Write => "RDMA_WRITE".into(),
            Op::Read => "RDMA_READ".into(),
            Op::Send => "SEND".into(),
            Op::FetchAdd => "FETCH_ADD".into(),
            Op::CmpSwap => "CMP_SWAP".into(),
            Op::Reverse => "reverse WRITE+SEND".into(),
            Op::Sized(n) if n == BIG => "64 KiB message".into(),
            Op::Sized(n) if mtu > 0 && n % mtu == 0 => format!("{} MTU message", n / mtu),
            Op::Sized(n) => format!("{n} B message"),
        }
    }
}

/// The pattern of a large WRITE of `n` bytes (what the server checks).
pub(crate) fn sized_pattern(n: usize) -> Vec<u8> {
    crate::loopback::pattern(n, 7)
}

/// What a size that fails after smaller ones passed says about the path.
fn black_hole(largest_ok: usize, failed: usize, mtu: usize) -> String {
    if failed <= largest_ok {
        format!(
            "messages of {failed} bytes failed twice although messages of {largest_ok} bytes passed: \
             packets are lost between the nodes now and then"
        )
    } else if failed <= mtu {
        format!(
            "messages of {largest_ok} bytes pass, messages of {failed} bytes (one packet at path MTU {mtu}) fail: \
             a hop drops large packets (a path-MTU black hole: RoCE's MTU is above what the path carries)"
        )
    } else {
        format!(
            "messages of {largest_ok} bytes pass, messages of {failed} bytes ({} packets of MTU {mtu}) fail: \
             a hop drops trains of full-size packets (bursts, or packets of a long message)",
            failed.div_ceil(mtu.max(1))
        )
    }
}

fn black_hole_fix(largest_ok: usize, mtu: usize) -> String {
    if largest_ok < mtu {
        format!(
            "find the hop whose MTU is below the RoCE packets of MTU {mtu} (switch ports, tunnels, `tc` filters) \
             and raise it, or lower both netdevs' MTU so that RoCE uses a smaller one; \
             expect `ibv_rc_pingpong -m {mtu}` to hang on this path and `-m {}` to work",
            largest_ok.next_power_of_two().min(mtu / 2).max(256)
        )
    } else {
        "look for drops under bursts between the nodes (switch buffers, pause frames / PFC, `ethtool -S` \
         discard counters on both ports)"
            .into()
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

/// rdma_cm from here to the server's RDMA address (the IP its GID carries), else to the
/// control connection's address. Tried once more when it fails.
fn cm_probe(ctl: &mut Control, remote: &End, opts: &PeerOptions, r: &mut PeerReport) -> Result<(), ()> {
    let (ip, whose) = match remote.rdma_address.parse::<IpAddr>() {
        Ok(ip) => (ip, "the server's RDMA address, from its GID"),
        Err(_) => match ctl.peer_addr() {
            Ok(a) => (a.ip(), "the control connection's address: the server's GID carries none"),
            Err(e) => return r.fail("rdma_cm", format!("no address for the server: {e}"), None),
        },
    };
    let mut once = || -> Result<String, String> {
        let answer = ask(ctl, "CM")?;
        let port: u16 = answer
            .strip_prefix("listening on port ")
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("the peer's rdma_cm listener: {answer}"))?;
        let sent = crate::rdma_cm::connect_and_send(SocketAddr::new(ip, port), opts.timeout);
        let verdict = read_answer(ctl);
        sent.map_err(|e| format!("rdma_cm to {ip}:{port}: {e}"))?;
        verdict.map(|v| format!("connected to {ip}:{port} ({whose}); {v}"))
    };
    let fix = "check rdma_ucm and /dev/infiniband/rdma_cm on both nodes (`rdma-doctor` on each), \
               and that both resolve each other's address over the RDMA interface"
        .to_owned();
    match once() {
        Ok(d) => {
            r.pass("rdma_cm", d);
            Ok(())
        }
        Err(first) => match once() {
            Ok(d) => {
                r.warn("rdma_cm", format!("failed, passed on retry: {d}; the first try: {first}"), Some(fix));
                Ok(())
            }
            Err(second) => r.fail("rdma_cm", format!("failed twice: {first}; on retry: {second}"), Some(fix)),
        },
    }
}

// ---- the control channel's lines -----------------------------------------------------

fn send_line(ctl: &mut (impl Write + ?Sized), line: &str) -> Result<(), String> {
    ctl.write_all(format!("{line}\n").as_bytes()).map_err(|e| format!("writing to the peer: {e}"))
}

/// One line from the peer, at most [`LINE_MAX`] bytes, read byte by byte so nothing past
/// it is taken from the stream (the handshake follows the hello on the same stream).
fn read_line(ctl: &mut (impl Read + ?Sized)) -> Result<String, String> {
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
fn ask(ctl: &mut (impl Read + Write + ?Sized), request: &str) -> Result<String, String> {
    send_line(ctl, request)?;
    read_answer(ctl)
}

fn read_answer(ctl: &mut (impl Read + ?Sized)) -> Result<String, String> {
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

    fn pair() -> (TcpStream, Control) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, Control::new(b, Duration::from_secs(5), None))
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
        assert!(e.contains("version 3"), "{e}");
        // The version is named before the rest is parsed: a version-1 hello is not "garbage".
        a.write_all(b"{\"magic\":\"rdma-doctor-peer\",\"version\":1,\"end\":{\"host\":\"x\"}}\n").unwrap();
        let e = say_hello(&mut b, &End::default()).unwrap_err();
        assert!(e.contains("version 1, this doctor rdma-doctor-peer version 2"), "{e}");
        a.write_all(b"BUSY rdma-doctor --serve is answering 16 probes\n").unwrap();
        let e = say_hello(&mut b, &End::default()).unwrap_err();
        assert!(e.starts_with("the server is busy"), "{e}");
        let typo = r#"{"magic":"rdma-doctor-peer","version":2,"end":{"host":3}}"#;
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
        check_path(&end("Ethernet", "RoCE v2", 1024), &end("Ethernet", "RoCE v2", 1024), &mut r).unwrap();
        assert_eq!(r.checks.len(), 1, "{:?}", r.checks);
        assert_eq!(r.exit_code(), 0);
    }

    #[test]
    fn an_mtu_mismatch_is_a_warning_of_its_own_not_a_remark_in_a_pass() {
        let end = |active_mtu, netdev_mtu, host: &str| End {
            host: host.into(),
            link_layer: "Ethernet".into(),
            gid_type: "RoCE v2".into(),
            netdev: "enp0s10".into(),
            active_mtu,
            netdev_mtu,
            gid_matches_address: true,
            ..End::default()
        };
        let mut r = PeerReport { peer: "b".into(), checks: vec![], ..PeerReport::default() };
        check_path(&end(4096, 9000, "a"), &end(1024, 1500, "b"), &mut r).unwrap();
        assert_eq!(r.checks.len(), 2, "{:?}", r.checks);
        assert!(r.checks[0].ok && !r.checks[0].warning && !r.checks[0].detail.contains("MTU"), "{:?}", r.checks[0]);
        let w = &r.checks[1];
        assert!(w.ok && w.warning && w.layer == "MTU", "{w:?}");
        assert!(w.detail.contains("active MTU 4096 here, 1024 there"), "{}", w.detail);
        assert!(w.detail.contains("MTU 9000 here") && w.detail.contains("MTU 1500 there"), "{}", w.detail);
        assert!(w.fix.as_deref().unwrap().contains("ip link set dev enp0s10 mtu 1500"), "{:?}", w.fix);
        assert_eq!(r.exit_code(), crate::Status::Warnings.exit_code());
        let text = r.to_text();
        assert!(text.contains("\nWARN  MTU "), "{text}");
        assert!(text.contains("works end to end, with 1 warning(s)"), "{text}");
        // Netdevs of different MTUs under ports of one active MTU still differ.
        let mut r = PeerReport::default();
        check_path(&end(4096, 9000, "a"), &end(4096, 4200, "b"), &mut r).unwrap();
        assert!(r.checks.iter().any(|c| c.layer == "MTU" && c.warning), "{:?}", r.checks);
    }

    #[test]
    fn a_size_that_fails_after_smaller_ones_passed_is_named_a_black_hole() {
        let d = black_hole(1024, 4096, 4096);
        assert!(d.contains("messages of 1024 bytes pass, messages of 4096 bytes"), "{d}");
        assert!(d.contains("a hop drops large packets"), "{d}");
        assert!(black_hole_fix(1024, 4096).contains("ibv_rc_pingpong -m 4096"));
        let d = black_hole(4096, 16384, 4096);
        assert!(d.contains("4 packets of MTU 4096") && d.contains("trains of full-size packets"), "{d}");
        assert!(black_hole(1024, 1024, 1024).contains("lost between the nodes now and then"));
        assert_eq!(Op::Sized(4096).layer(4096), "1 MTU message");
        assert_eq!(Op::Sized(16384).layer(4096), "4 MTU message");
        assert_eq!(Op::Sized(BIG).layer(4096), "64 KiB message");
        assert!(is_data_layer("4 MTU message") && is_data_layer("SEND") && !is_data_layer("rdma_cm"));
        let mut r = PeerReport::default();
        r.pass("RDMA_WRITE", "1024 bytes verified");
        let _ = r.fail::<()>("1 MTU message", black_hole(1024, 4096, 4096), Some(black_hole_fix(1024, 4096)));
        let text = r.to_text();
        assert!(text.contains("FAIL  1 MTU message      messages of 1024 bytes pass"), "{text}");
        assert!(text.contains("larger messages do not") && !text.contains("the data plane between"), "{text}");
    }

    #[test]
    fn a_warning_passes_with_status_4_and_a_failure_fails_with_1() {
        let mut r = PeerReport::default();
        r.pass("control channel", "ok");
        assert_eq!(r.exit_code(), 0);
        r.warn("RDMA_WRITE", "failed, passed on retry with fresh QPs: x; the first try: y", None);
        assert_eq!(r.exit_code(), 4);
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json["checks"][1]["warning"], true);
        assert!(json["checks"][0].get("warning").is_none(), "a pass has no warning field");
        let _ = r.fail::<()>("SEND", "failed twice", None);
        assert_eq!(r.exit_code(), 1);
        assert!(r.to_text().contains("the control plane works"), "{}", r.to_text());
    }

    #[test]
    fn a_lost_packet_failure_advises_on_the_network() {
        let fix = data_fix("RDMA WRITE failed: transport retries exhausted (the peer never acknowledged)").unwrap();
        assert!(fix.contains("UDP port 4791"));
        assert!(data_fix("something else").is_none());
    }
}
