//! Who gets through `--serve`'s door and its metrics port: `--allow` closes a client
//! outside its networks before reading a byte, and refuses a probe request towards a node
//! outside them; `--secret-file` answers only a collector that proves the secret; with
//! both on, a fleet run over two real doors still gets every report and probe through.
//! No RDMA device: the doors hand out a recorded report.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdma_doctor::modes::fleet::wire::{self, Trouble};
use rdma_doctor::modes::gate::{AllowList, Secret};
use rdma_doctor::modes::peer::{PeerOptions, ServeOptions};
use serde_json::Value;

const NODE_A: &str = include_str!("../testdata/node-a.json");
const REPORT_REQUEST: &str = r#"{"magic":"rdma-doctor-fleet","version":1,"request":"report"}"#;

/// What a door logged, shared with the test.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    /// Waits (5 s at most) for a whole line containing `what`: the door writes a line in
    /// pieces, so the text is returned once the line holding `what` has its newline.
    fn wait_for(&self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
            let whole = text.find(what).is_some_and(|at| text[at..].contains('\n'));
            if whole || Instant::now() > deadline {
                return text;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A `--serve` door on 127.0.0.1 handing out the recorded report: its address and log.
fn door(allow: &[&str], secret: Option<Secret>) -> (String, Log) {
    let port = free_port();
    let opts = PeerOptions { device: None, port: None, timeout: Duration::from_secs(2), tcp_port: port, secret };
    let door = ServeOptions {
        listen: "127.0.0.1".parse().unwrap(),
        allow: AllowList::parse(&allow.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap(),
    };
    let reports =
        Arc::new(rdma_doctor::modes::fresh::Reports::fixed(rdma_doctor::model::input::parse_report(NODE_A).unwrap()));
    let log = Log::default();
    let mut sink = log.clone();
    std::thread::spawn(move || rdma_doctor::modes::peer::serve(&door, false, &opts, Some(reports), &mut sink));
    let addr = format!("127.0.0.1:{port}");
    log.wait_for("serving peer probes");
    (addr, log)
}

/// Sends `line` and reads everything until the door closes (10 s at most): the bytes, and
/// whether the connection was reset (the door closed it with our bytes unread).
fn ask(addr: &str, line: &str) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(line.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => return (got, false),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (got, true),
            Err(e) => panic!("reading from {addr}: {e}"),
        }
    }
}

fn secret_file(name: &str, text: &str) -> (PathBuf, Secret) {
    let dir = std::env::temp_dir().join(format!("rdma-doctor-door-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let secret = Secret::load(&path).unwrap();
    (path, secret)
}

#[test]
fn a_client_outside_the_allow_list_is_closed_unread_and_one_inside_gets_the_report() {
    let (outside, log) = door(&["10.0.0.0/8"], None);
    let (got, reset) = ask(&outside, &format!("{REPORT_REQUEST}\n"));
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    let text = log.wait_for("unread");
    assert!(text.contains("unread: not in --allow (10.0.0.0/8)"), "{text}");
    // Closed with our request still unread in its socket: the kernel resets the connection
    // (unless the door closed it before the request arrived, when there was nothing to read).
    eprintln!("reset: {reset}");
    assert!(!text.contains("closed before its hello") && !text.contains("probe from"), "{text}");

    let (inside, _) = door(&["10.0.0.0/8", "127.0.0.0/8"], None);
    let (got, _) = ask(&inside, &format!("{REPORT_REQUEST}\n"));
    let v: Value = serde_json::from_slice(&got).unwrap();
    assert_eq!(v["report"]["host"]["hostname"], "node-a", "{v}");
}

#[test]
fn the_metrics_port_closes_a_client_outside_the_allow_list_unread() {
    let serve = |allow: &str| {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let allow = AllowList::parse(&[allow.to_owned()]).unwrap();
        std::thread::spawn(move || rdma_doctor::modes::metrics::serve(l, &allow, || Ok("m 1\n".to_owned())));
        addr.to_string()
    };
    let (got, _) = ask(&serve("10.0.0.0/8"), "GET /metrics HTTP/1.0\r\n\r\n");
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    let (got, _) = ask(&serve("127.0.0.1"), "GET /metrics HTTP/1.0\r\n\r\n");
    assert!(String::from_utf8_lossy(&got).ends_with("\r\n\r\nm 1\n"), "{}", String::from_utf8_lossy(&got));
}

#[test]
fn a_probe_request_towards_a_node_outside_the_allow_list_is_refused_and_one_inside_runs() {
    let (addr, _) = door(&["127.0.0.0/8"], None);
    let request = |peer: &str| {
        format!(r#"{{"magic":"rdma-doctor-fleet","version":1,"request":"probe","peer":"{peer}","timeout_ms":1000}}"#)
            + "\n"
    };
    let (got, _) = ask(&addr, &request("10.1.2.3:18516"));
    let v: Value = serde_json::from_slice(&got).unwrap();
    let why = v["error"].as_str().unwrap_or_else(|| panic!("{v}"));
    assert!(why.contains("10.1.2.3:18516 (10.1.2.3) is outside this node's --allow (127.0.0.0/8)"), "{why}");
    // The same through the collector's own call: named a refusal.
    let e = wire::ask_probe(&addr, "10.1.2.3:18516", Duration::from_secs(1), None, Duration::from_secs(10));
    assert_eq!(e.unwrap_err().0, Trouble::Refused);

    // A node inside: the probe runs (and fails at its control channel: nothing listens there).
    let closed = format!("127.0.0.1:{}", free_port());
    let (got, _) = ask(&addr, &request(&closed));
    let v: Value = serde_json::from_slice(&got).unwrap();
    assert_eq!(v["probe"]["checks"][0]["layer"], "control channel", "{v}");
    assert_eq!(v["probe"]["checks"][0]["ok"], false, "{v}");
    assert_eq!(v["probe"]["peer"], closed.as_str(), "{v}");
    let local = AllowList::parse(&["127.0.0.0/8".into()]).unwrap();
    let at = rdma_doctor::modes::peer::peer_admitted("localhost:1", 1, &local).unwrap().unwrap();
    assert!(at.ip().is_loopback() && at.port() == 1, "{at}");
    assert_eq!(rdma_doctor::modes::peer::peer_admitted("anything:1", 1, &AllowList::default()), Ok(None));
}

#[test]
fn a_collector_without_the_secret_or_with_another_gets_nothing_and_with_it_gets_the_report() {
    let (_, secret) = secret_file("right", "correct horse battery staple\n");
    let (_, wrong) = secret_file("wrong", "correct horse battery stapler\n");
    let (addr, log) = door(&[], Some(secret.clone()));

    // A bare request: the challenge, then the door closes without an answer.
    let (got, _) = ask(&addr, &format!("{REPORT_REQUEST}\n"));
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("rdma-doctor-auth 1 ") && text.lines().count() == 1, "{text}");
    assert!(!text.contains("report"), "{text}");
    assert!(log.wait_for("no valid proof").contains("unanswered: no valid proof of the secret"));

    let limit = Duration::from_secs(10);
    let e = wire::fetch_report(&addr, None, limit).unwrap_err();
    assert_eq!(e.0, Trouble::Refused, "{e:?}");
    assert!(e.1.contains("asks for the shared secret"), "{e:?}");
    let e = wire::fetch_report(&addr, Some(&wrong), limit).unwrap_err();
    assert_eq!(e.0, Trouble::Refused, "{e:?}");
    assert!(e.1.contains("unanswered"), "{e:?}");
    let r = wire::fetch_report(&addr, Some(&secret), limit).unwrap();
    assert_eq!(r.host.hostname, "node-a");

    // A prober without the secret fails at the control channel, as does one with it
    // against a door that asks for none.
    let opts = PeerOptions { device: None, port: None, timeout: Duration::from_secs(1), tcp_port: 1, secret: None };
    let p = rdma_doctor::modes::peer::probe(&addr, &opts);
    assert!(p.checks[0].layer == "control channel" && !p.checks[0].ok, "{p:#?}");
    let (open, _) = door(&[], None);
    let p = rdma_doctor::modes::peer::probe(&open, &PeerOptions { secret: Some(secret), ..opts });
    assert!(!p.checks[0].ok && p.checks[0].detail.contains("--secret-file"), "{p:#?}");
}

#[test]
fn a_fleet_run_over_two_doors_with_allow_and_secret_gets_every_report_and_probe_through() {
    let (path, secret) = secret_file("fleet", "0123456789abcdef0123456789abcdef\n");
    let (a, _) = door(&["127.0.0.0/8"], Some(secret.clone()));
    let (b, _) = door(&["127.0.0.0/8"], Some(secret));
    let run = |args: &[&str]| {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = rdma_doctor::modes::cli::run(
            std::iter::once("rdma-doctor").chain(args.iter().copied()),
            &mut out,
            &mut err,
        );
        (code, String::from_utf8(out).unwrap() + &String::from_utf8(err).unwrap())
    };
    let file = path.to_str().unwrap();
    let (_, text) = run(&["--fleet", &a, &b, "--timeout", "2", "--json", "--secret-file", file]);
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(v["nodes"].as_array().unwrap().iter().all(|n| n["state"] == "answered"), "{text}");
    // The probe between them passed the other door's secret (no RDMA device here: it
    // then fails at addressing).
    let link = &v["links"][0];
    assert_eq!(link["probe"]["checks"][0]["layer"], "control channel", "{link}");
    assert_eq!(link["probe"]["checks"][0]["ok"], true, "{link}");
    // Without the secret, no node answers.
    let (code, text) = run(&["--fleet", &a, &b, "--timeout", "2", "--json"]);
    assert_eq!(code, 1, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(v["nodes"].as_array().unwrap().iter().all(|n| n["state"] == "refused"), "{text}");
    // Flags that need --serve, and a secret nobody else may read.
    assert_eq!(run(&["--allow", "10.0.0.0/8"]).0, 2);
    assert_eq!(run(&["--listen", "127.0.0.1"]).0, 2);
    // A network with host bits set is refused before --serve diagnoses or listens.
    let (code, text) = run(&["--serve", "--allow", "10.0.0.1/8"]);
    assert!(code == 2 && text.contains("did you mean 10.0.0.0/8"), "{text}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, text) = run(&["--fleet", &a, "--secret-file", file]);
    assert!(code == 2 && text.contains("chmod 600"), "{text}");
}
