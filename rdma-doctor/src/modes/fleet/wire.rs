//! The fleet's requests on the `--serve` door, and the collector's side of them.
//!
//! A collector connects to a node's `--serve` port and sends one line in place of a
//! probe's hello: `{"magic":"rdma-doctor-fleet","version":1,"request":"report"}`, or
//! `{"magic":"rdma-doctor-fleet","version":1,"request":"probe","peer":"HOST:PORT","timeout_ms":5000}`
//! to have the node probe the path to another node with `--peer`'s checks. The node
//! answers with one JSON object and closes the connection:
//! `{"magic":"rdma-doctor-fleet","version":1,"report":{...}}` (its report, format 4),
//! `{"magic":...,"version":1,"probe":{...}}` (a `--peer --json` report), or
//! `{"magic":...,"version":1,"error":"..."}`.
//!
//! A node with a secret (`--secret-file`) first writes its challenge, and takes the request
//! only with the proof of the secret before it ([`crate::modes::gate`]).
//!
//! The collector reads at most [`MAX_ANSWER_BYTES`] within its deadline and parses
//! strictly: what a node sends can fail that node's row, never the collector.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::report::Report;
use crate::modes::gate::Secret;
use crate::modes::peer::PeerReport;

/// What fleet requests and answers start with.
pub const MAGIC: &str = "rdma-doctor-fleet";
/// The version of the fleet requests and answers.
pub const PROTOCOL_VERSION: u32 = 1;
/// The most bytes the collector reads from one node (the limit of a file the doctor reads).
pub const MAX_ANSWER_BYTES: usize = crate::model::input::MAX_FILE_BYTES as usize;
/// The longest `peer` a request may name.
const MAX_PEER_LEN: usize = 255;
/// The longest probe timeout a request may ask for.
const MAX_PROBE_TIMEOUT: Duration = Duration::from_secs(600);

/// A request, as the collector sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// [`MAGIC`].
    pub magic: String,
    /// [`PROTOCOL_VERSION`].
    pub version: u32,
    /// `report` or `probe`.
    pub request: String,
    /// For `probe`: the node to probe, `HOST:PORT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// For `probe`: the probe's timeout (per completion, event or line), milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// What a node was asked, once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// Its report.
    Report,
    /// To probe the path to `peer` with this timeout.
    Probe {
        /// `HOST:PORT`.
        peer: String,
        /// The probe's timeout.
        timeout: Duration,
    },
}

/// `None` when `line` is no fleet request (a probe's hello); else the request, or why it
/// is refused (another version, a bad field).
pub fn parse_request(line: &str) -> Option<Result<Asked, String>> {
    let loose: Value = serde_json::from_str(line).ok()?;
    if loose.get("magic").and_then(Value::as_str) != Some(MAGIC) {
        return None;
    }
    Some(check_request(line))
}

fn check_request(line: &str) -> Result<Asked, String> {
    let r: Request = crate::model::input::parse_strict(line).map_err(|e| format!("not a fleet request: {e}"))?;
    if r.version != PROTOCOL_VERSION {
        return Err(format!("this node speaks {MAGIC} version {PROTOCOL_VERSION}, the request version {}", r.version));
    }
    match r.request.as_str() {
        "report" => Ok(Asked::Report),
        "probe" => {
            let peer = r.peer.ok_or("a probe request names no peer")?;
            let bad = peer.is_empty()
                || peer.len() > MAX_PEER_LEN
                || peer.chars().any(|c| c.is_whitespace() || c.is_control());
            if bad {
                return Err(format!("peer {peer:?}: give HOST:PORT, at most {MAX_PEER_LEN} characters"));
            }
            let ms = r.timeout_ms.ok_or("a probe request gives no timeout_ms")?;
            let timeout = Duration::from_millis(ms);
            if timeout.is_zero() || timeout > MAX_PROBE_TIMEOUT {
                return Err(format!("timeout_ms {ms}: give 1 to {}", MAX_PROBE_TIMEOUT.as_millis()));
            }
            Ok(Asked::Probe { peer, timeout })
        }
        other => Err(format!("unknown request {other:?} (this node answers report and probe)")),
    }
}

/// The answer line to a request: the report (made by `report`), the probe's report (made
/// by `probe`), or the refusal.
pub fn answer(
    asked: Result<Asked, String>,
    report: impl FnOnce() -> Result<std::sync::Arc<Report>, String>,
    probe: impl FnOnce(&str, Duration) -> Result<PeerReport, String>,
) -> String {
    let body = match asked {
        Ok(Asked::Report) => match report() {
            Ok(r) => ("report", serde_json::to_value(&*r)),
            Err(e) => ("error", Ok(Value::from(e))),
        },
        Ok(Asked::Probe { peer, timeout }) => match probe(&peer, timeout) {
            Ok(r) => ("probe", serde_json::to_value(r)),
            Err(e) => ("error", Ok(Value::from(e))),
        },
        Err(e) => ("error", Ok(Value::from(e))),
    };
    let mut v = serde_json::json!({ "magic": MAGIC, "version": PROTOCOL_VERSION });
    v[body.0] = body.1.unwrap_or_else(|e| Value::from(format!("encoding the answer: {e}")));
    v.to_string() + "\n"
}

/// Why a node gave no usable answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trouble {
    /// No TCP connection (refused, no route, name not resolved, connect timed out).
    Unreachable,
    /// It answered, but not an answer of ours (or one over the size limit).
    Garbage,
    /// No complete answer within the time allowed.
    Slow,
    /// A doctor of another protocol or report version.
    OtherVersion,
    /// A doctor of ours that refused the request (says why).
    Refused,
}

/// A failed exchange: the kind and the words.
pub type Failure = (Trouble, String);

/// `HOST:PORT` for `host` (`HOST`, `HOST:PORT`, an IPv6 address, `[V6]:PORT`).
pub fn with_port(host: &str, port: u16) -> String {
    match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(v6)) => format!("[{v6}]:{port}"),
        Ok(ip) => format!("{ip}:{port}"),
        Err(_) if host.contains(':') => host.to_owned(),
        Err(_) => format!("{host}:{port}"),
    }
}

/// The addresses of `address`, resolved within `limit`: a name server that does not answer
/// costs this node its row, not the collector its bound (the lookup's thread is left to end
/// on its own).
fn resolve(address: &str, limit: Duration) -> Result<Vec<SocketAddr>, Failure> {
    if let Ok(a) = address.parse::<SocketAddr>() {
        return Ok(vec![a]);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let name = address.to_owned();
    let spawned = std::thread::Builder::new().name("fleet resolve".into()).spawn(move || {
        let _ = tx.send(name.to_socket_addrs().map(|a| a.collect::<Vec<_>>()));
    });
    if let Err(e) = spawned {
        return Err((Trouble::Unreachable, format!("no thread to resolve {address}: {e}")));
    }
    match rx.recv_timeout(limit) {
        Ok(Ok(addrs)) => Ok(addrs),
        Ok(Err(e)) => Err((Trouble::Unreachable, format!("cannot resolve {address}: {e}"))),
        Err(_) => Err((Trouble::Unreachable, format!("{address} not resolved within {:.1} s", limit.as_secs_f64()))),
    }
}

/// The server's challenge line (without its newline): at most 256 bytes, read one at a
/// time so nothing after it is taken, within `deadline`.
fn read_challenge(stream: &mut TcpStream, deadline: Instant) -> Result<String, Failure> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || line.len() > 256 {
            let why = "no challenge from the node: does its --serve run with --secret-file?";
            return Err((if left.is_zero() { Trouble::Slow } else { Trouble::Garbage }, why.to_owned()));
        }
        stream.set_read_timeout(Some(left)).ok();
        match stream.read(&mut byte) {
            Ok(0) => return Err((Trouble::Unreachable, "the node closed the connection before its challenge".into())),
            Ok(_) if byte[0] == b'\n' => return Ok(String::from_utf8_lossy(&line).into_owned()),
            Ok(_) => line.push(byte[0]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => return Err((Trouble::Unreachable, format!("reading the node's challenge: {e}"))),
        }
    }
}

/// Sends `request` to `address` (with the proof of `secret`, when given) and reads the
/// answer to its end, all within `limit`.
fn exchange(address: &str, request: &Request, secret: Option<&Secret>, limit: Duration) -> Result<Value, Failure> {
    let deadline = Instant::now() + limit;
    let left = || deadline.saturating_duration_since(Instant::now());
    let addrs = resolve(address, limit)?;
    let mut stream = None;
    let mut last = format!("{address} resolves to no address");
    for a in addrs {
        if left().is_zero() {
            break;
        }
        match TcpStream::connect_timeout(&a, left()) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = format!("TCP connect to {a}: {e} (is `rdma-doctor --serve` running there?)"),
        }
    }
    let mut stream = stream.ok_or((Trouble::Unreachable, last))?;
    let mut line = serde_json::to_string(request).unwrap_or_default();
    if let Some(secret) = secret {
        let challenge = read_challenge(&mut stream, deadline)?;
        line = secret.prove(&challenge, &line).map_err(|e| (Trouble::Garbage, e))?;
    }
    line.push('\n');
    let slow = |what: &str, got: usize| {
        (Trouble::Slow, format!("{what} within {:.1} s ({got} bytes of the answer so far)", limit.as_secs_f64()))
    };
    stream.set_write_timeout(Some(left().max(Duration::from_millis(1)))).ok();
    stream.write_all(line.as_bytes()).map_err(|e| (Trouble::Unreachable, format!("sending the request: {e}")))?;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    loop {
        let t = left();
        if t.is_zero() {
            return Err(slow("no complete answer", bytes.len()));
        }
        stream.set_read_timeout(Some(t)).ok();
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                bytes.extend_from_slice(&chunk[..n]);
                if bytes.len() > MAX_ANSWER_BYTES {
                    let max = MAX_ANSWER_BYTES >> 20;
                    return Err((Trouble::Garbage, format!("an answer over {max} MiB: not a report")));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(slow("no complete answer", bytes.len()));
            }
            Err(e) => return Err((Trouble::Unreachable, format!("reading the answer: {e}"))),
        }
    }
    let text = String::from_utf8_lossy(&bytes);
    if text.starts_with(crate::modes::gate::CHALLENGE) {
        return Err((Trouble::Refused, "the node asks for the shared secret: give --secret-file".into()));
    }
    if bytes.is_empty() && secret.is_some() {
        let why = "the node closed the connection unanswered: is its --secret-file the same as ours?";
        return Err((Trouble::Refused, why.into()));
    }
    let v: Value = serde_json::from_str(text.trim_end()).map_err(|e| {
        let start: String = text.chars().take(60).collect();
        (Trouble::Garbage, format!("the answer is not JSON ({e}): {start:?}"))
    })?;
    let magic = v.get("magic").and_then(Value::as_str).unwrap_or_default();
    let version = v.get("version").and_then(Value::as_u64);
    if magic == "rdma-doctor-peer" {
        let why = format!(
            "an rdma-doctor --serve that speaks only the peer protocol (version {}): no fleet requests; upgrade it",
            version.map_or("?".into(), |n| n.to_string())
        );
        return Err((Trouble::OtherVersion, why));
    }
    if magic != MAGIC {
        return Err((Trouble::Garbage, format!("not an {MAGIC} answer (magic {magic:?})")));
    }
    if version != Some(u64::from(PROTOCOL_VERSION)) {
        let v = version.map_or("none".into(), |n| n.to_string());
        return Err((Trouble::OtherVersion, format!("{MAGIC} version {v}, this collector speaks {PROTOCOL_VERSION}")));
    }
    if let Some(e) = v.get("error") {
        return Err((Trouble::Refused, format!("the node refused: {}", e.as_str().unwrap_or("(no reason)"))));
    }
    Ok(v)
}

/// The report of the node at `address`, within `limit`.
pub fn fetch_report(address: &str, secret: Option<&Secret>, limit: Duration) -> Result<Report, Failure> {
    let request = Request {
        magic: MAGIC.into(),
        version: PROTOCOL_VERSION,
        request: "report".into(),
        peer: None,
        timeout_ms: None,
    };
    let v = exchange(address, &request, secret, limit)?;
    let report = v.get("report").ok_or((Trouble::Garbage, "the answer has no report".to_owned()))?;
    // Its format and version first, so another version is named as such.
    crate::model::input::baseline_of(report).map_err(|e| {
        let trouble = if e.starts_with("format_version") { Trouble::OtherVersion } else { Trouble::Garbage };
        (trouble, format!("its report: {e}"))
    })?;
    crate::model::input::parse_strict(&report.to_string()).map_err(|e| (Trouble::Garbage, format!("its report: {e}")))
}

/// Has the node at `address` probe the path to `peer` (`HOST:PORT`) with `timeout`; waits
/// for the answer within `limit`.
pub fn ask_probe(
    address: &str,
    peer: &str,
    timeout: Duration,
    secret: Option<&Secret>,
    limit: Duration,
) -> Result<PeerReport, Failure> {
    let request = Request {
        magic: MAGIC.into(),
        version: PROTOCOL_VERSION,
        request: "probe".into(),
        peer: Some(peer.to_owned()),
        timeout_ms: Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
    };
    let v = exchange(address, &request, secret, limit)?;
    let probe = v.get("probe").ok_or((Trouble::Garbage, "the answer has no probe".to_owned()))?;
    crate::model::input::parse_strict(&probe.to_string())
        .map_err(|e| (Trouble::Garbage, format!("its probe report: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_hello_is_no_fleet_request_and_bad_requests_are_refused_with_the_reason() {
        assert_eq!(parse_request("{\"magic\":\"rdma-doctor-peer\",\"version\":2}"), None);
        assert_eq!(parse_request("GET / HTTP/1.1"), None);
        let ok = "{\"magic\":\"rdma-doctor-fleet\",\"version\":1,\"request\":\"report\"}";
        assert_eq!(parse_request(ok), Some(Ok(Asked::Report)));
        let probe =
            "{\"magic\":\"rdma-doctor-fleet\",\"version\":1,\"request\":\"probe\",\"peer\":\"b:1\",\"timeout_ms\":900}";
        assert_eq!(
            parse_request(probe),
            Some(Ok(Asked::Probe { peer: "b:1".into(), timeout: Duration::from_millis(900) }))
        );
        for (bad, why) in [
            ("{\"magic\":\"rdma-doctor-fleet\",\"version\":2,\"request\":\"report\"}", "version 2"),
            ("{\"magic\":\"rdma-doctor-fleet\",\"version\":1,\"request\":\"reboot\"}", "unknown request"),
            ("{\"magic\":\"rdma-doctor-fleet\",\"version\":1,\"request\":\"report\",\"x\":1}", "unknown field"),
            ("{\"magic\":\"rdma-doctor-fleet\",\"version\":1,\"request\":\"probe\",\"peer\":\"a b\",\"timeout_ms\":1}", "HOST:PORT"),
            ("{\"magic\":\"rdma-doctor-fleet\",\"version\":1,\"request\":\"probe\",\"peer\":\"b\",\"timeout_ms\":0}", "timeout_ms 0"),
            ("{\"magic\":\"rdma-doctor-fleet\",\"version\":1,\"request\":\"probe\",\"peer\":\"b\"}", "no timeout_ms"),
        ] {
            let e = parse_request(bad).unwrap().unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn hosts_get_the_default_port_unless_they_name_one() {
        assert_eq!(with_port("node-1", 18516), "node-1:18516");
        assert_eq!(with_port("node-1:7", 18516), "node-1:7");
        assert_eq!(with_port("10.0.0.1", 1), "10.0.0.1:1");
        assert_eq!(with_port("fe80::1", 1), "[fe80::1]:1");
        assert_eq!(with_port("[fe80::1]:9", 1), "[fe80::1]:9");
    }
}
