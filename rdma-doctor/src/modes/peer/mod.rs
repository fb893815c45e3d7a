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
mod probe;
mod round_trip;
mod serve;

use std::io::{Read, Write};
use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::facts::loopback::LEN;

pub(crate) use door::Control;
pub use door::{EXCHANGE_TIMEOUTS, MAX_PROBES, MAX_WAITING};
pub use probe::probe;
pub use serve::{peer_admitted, serve};

/// The TCP port `--serve` listens on and `--peer` connects to by default.
pub const DEFAULT_PORT: u16 = 18516;
/// What a hello starts with; the protocol's version follows in the hello.
const MAGIC: &str = "rdma-doctor-peer";
/// The exchange's version. 2: the hello names the end's RDMA address and netdev (and its
/// MTU), the server takes `WRITE N` (a large WRITE to check), `AGAIN` (fresh QPs for a
/// retry), reads the prober's hello before it sends its own, and may answer `BUSY`.
const VERSION: u32 = 2;
/// The version of the `--peer --json` report (docs/doctor-json.md); 3 added
/// `counter_changes`.
pub const PEER_FORMAT_VERSION: u32 = 3;
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
    /// The counters of this end's device that moved while the probe ran (since version
    /// 3); the classes among them are also a `counters` check each.
    #[serde(default)]
    pub counter_changes: Vec<crate::model::counters::CounterChange>,
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
    /// The shared secret: a server asks each client for its proof, a prober proves it.
    pub secret: Option<crate::modes::gate::Secret>,
}

/// Where `--serve` listens and whom it admits.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The address listened on (`--listen`; every address by default).
    pub listen: IpAddr,
    /// The clients admitted, and the nodes a fleet's probe request may name (`--allow`).
    pub allow: crate::modes::gate::AllowList,
}

impl Default for ServeOptions {
    fn default() -> ServeOptions {
        ServeOptions {
            listen: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            allow: crate::modes::gate::AllowList::default(),
        }
    }
}

/// Writes our hello (after the server's challenge and with our proof, when we have a
/// secret), reads theirs.
fn say_hello(ctl: &mut Control, end: &End, secret: Option<&crate::modes::gate::Secret>) -> Result<End, String> {
    let hello = Hello { magic: MAGIC.into(), version: VERSION, end: end.clone() };
    let mut line = serde_json::to_string(&hello).map_err(|e| e.to_string())?;
    if let Some(secret) = secret {
        let challenge = read_line(ctl)
            .map_err(|e| format!("no challenge from the server ({e}): does it run with --secret-file?"))?;
        line = secret.prove(&challenge, &line)?;
    }
    send_line(ctl, &line)?;
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
    crate::facts::loopback::pattern(LEN, seed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpStream;

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
        let e = say_hello(&mut b, &End::default(), None).unwrap_err();
        assert!(e.contains("not an rdma-doctor hello"), "{e}");
        let other = Hello { magic: MAGIC.into(), version: VERSION + 1, end: End::default() };
        a.write_all(format!("{}\n", serde_json::to_string(&other).unwrap()).as_bytes()).unwrap();
        let e = say_hello(&mut b, &End::default(), None).unwrap_err();
        assert!(e.contains("version 3"), "{e}");
        // The version is named before the rest is parsed: a version-1 hello is not "garbage".
        a.write_all(b"{\"magic\":\"rdma-doctor-peer\",\"version\":1,\"end\":{\"host\":\"x\"}}\n").unwrap();
        let e = say_hello(&mut b, &End::default(), None).unwrap_err();
        assert!(e.contains("version 1, this doctor rdma-doctor-peer version 2"), "{e}");
        a.write_all(b"BUSY rdma-doctor --serve is answering 16 probes\n").unwrap();
        let e = say_hello(&mut b, &End::default(), None).unwrap_err();
        assert!(e.starts_with("the server is busy"), "{e}");
        let typo = r#"{"magic":"rdma-doctor-peer","version":2,"end":{"host":3}}"#;
        a.write_all(format!("{typo}\n").as_bytes()).unwrap();
        assert!(say_hello(&mut b, &End::default(), None).is_err());
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
}
