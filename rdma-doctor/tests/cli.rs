//! The `rdma-doctor` command over recorded reports (testdata/), on the host (no device):
//! a report with a wrong-typed or an unknown field is refused with exit 2 naming the file
//! and the field; a file over the size limit, `/dev/zero` included, is refused at once; a
//! known-bad firmware/driver combination is found in a node's report and in a baseline;
//! `--compare-nodes --json` prints JSON; `--peer` with nobody serving, or a peer that is
//! another program or floods a line, fails at the control channel with a bounded read;
//! `--serve` lets an honest prober in past 130 silent connections and a client that sends
//! a byte every 2 s.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A recorded report.
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata").join(name)
}

/// Runs the command with `args` (no loopback: nothing here needs the data plane).
fn doctor(args: &[&str]) -> (i32, String, String) {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_rdma-doctor"))
        .args(args)
        .env_remove("RDMA_DOCTOR_KNOWN_BAD")
        .output()
        .expect("run rdma-doctor");
    let text = |b: Vec<u8>| String::from_utf8(b).expect("UTF-8 output");
    (out.status.code().expect("an exit status"), text(out.stdout), text(out.stderr))
}

const KNOWN_BAD_CX5: &str = "known-bad [connectx5-fw-16.24.1000-ofed-5.4-1.0.3.0]";

#[test]
fn a_baseline_with_a_wrong_typed_field_exits_2_naming_the_file_and_the_field() {
    let file = fixture("report-wrong-type.json");
    let (code, out, err) = doctor(&["--no-loopback", "--compare", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("report-wrong-type.json"), "{err}");
    assert!(err.contains("field `baseline.devices.mlx5_0.ports.1.rate_gbps`: invalid type: string \"200\""), "{err}");
    assert!(out.is_empty(), "no report for bad input: {out}");
}

#[test]
fn a_node_report_with_a_wrong_typed_or_unknown_field_exits_2_naming_the_file_and_the_field() {
    let a = fixture("node-a.json");
    for (name, field) in [
        ("report-wrong-type.json", "baseline.devices.mlx5_0.ports.1.rate_gbps"),
        ("report-unknown-field.json", "unknown field `firmware`"),
    ] {
        let bad = fixture(name);
        let (code, out, err) = doctor(&["--compare-nodes", a.to_str().unwrap(), bad.to_str().unwrap()]);
        assert_eq!(code, 2, "{name}: {out}{err}");
        assert!(err.contains(name) && err.contains(field), "{name}: {err}");
    }
}

#[test]
fn a_baseline_with_an_unknown_field_exits_2_naming_it() {
    let file = fixture("report-unknown-field.json");
    let (code, _, err) = doctor(&["--no-loopback", "--compare", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("report-unknown-field.json") && err.contains("unknown field `firmware`"), "{err}");
    assert!(err.contains("baseline.devices.mlx5_0"), "{err}");
}

#[test]
fn dev_zero_and_an_oversized_report_exit_2_at_once_naming_the_limit() {
    let started = Instant::now();
    let (code, _, err) = doctor(&["--no-loopback", "--compare", "/dev/zero"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/dev/zero: larger than 4 MiB"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());

    // A valid report padded past the limit with whitespace: refused by size, not parsed.
    let big = std::env::temp_dir().join(format!("rdma-doctor-big-{}.json", std::process::id()));
    let mut text = std::fs::read_to_string(fixture("node-a.json")).unwrap();
    text.push_str(&" ".repeat(5 << 20));
    std::fs::write(&big, text).unwrap();
    let a = fixture("node-a.json");
    let (code, _, err) = doctor(&["--compare-nodes", a.to_str().unwrap(), big.to_str().unwrap()]);
    std::fs::remove_file(&big).unwrap();
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("rdma-doctor-big-") && err.contains("larger than 4 MiB"), "{err}");

    // A known-bad list too.
    let (code, _, err) =
        doctor(&["--compare-nodes", a.to_str().unwrap(), a.to_str().unwrap(), "--known-bad", "/dev/zero"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/dev/zero: larger than 4 MiB"), "{err}");
}

#[test]
fn compare_nodes_names_the_known_bad_combination_of_one_node_not_only_the_firmware_difference() {
    let files = ["node-a.json", "node-b.json", "node-c-connectx5-known-bad.json"].map(fixture);
    let args: Vec<&str> = std::iter::once("--compare-nodes").chain(files.iter().map(|f| f.to_str().unwrap())).collect();
    let (code, out, err) = doctor(&args);
    // The nodes differ (firmware, part id): drift beats warnings.
    assert_eq!(code, 3, "{out}{err}");
    assert!(out.contains("devices.mlx5_0.fw_ver") && out.contains("node-c has \"16.24.1000\""), "{out}");
    let line = out.lines().find(|l| l.contains(KNOWN_BAD_CX5)).unwrap_or_else(|| panic!("no known-bad line: {out}"));
    assert!(line.contains("[node-c/mlx5_0]"), "{line}");
    assert_eq!(out.matches("known-bad [").count(), 1, "only node-c: {out}");
}

#[test]
fn compare_nodes_json_prints_the_comparison_as_json() {
    let files = ["node-a.json", "node-b.json", "node-c-connectx5-known-bad.json"].map(fixture);
    let mut args: Vec<&str> = vec!["--compare-nodes"];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    args.push("--json");
    let (code, out, err) = doctor(&args);
    assert_eq!(code, 3, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    assert_eq!(v["format"], "rdma-doctor-nodes");
    assert_eq!(v["format_version"], rdma_doctor::FORMAT_VERSION);
    assert_eq!((v["status"].as_str(), v["exit_code"].as_i64()), (Some("drift"), Some(3)));
    let labels: Vec<&str> = v["nodes"].as_array().unwrap().iter().map(|n| n["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["node-a", "node-b", "node-c"]);
    let findings = v["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{findings:#?}");
    assert_eq!(findings[0]["scope"], "node-c/mlx5_0");
    assert_eq!(findings[0]["severity"], "warning");
    assert!(findings[0]["what"].as_str().unwrap().contains(KNOWN_BAD_CX5));
    assert!(v["differences"].as_array().unwrap().iter().any(|d| d["field"] == "devices.mlx5_0.fw_ver"));
    assert!(v["layers"].as_array().unwrap().iter().all(|l| l["outcome"] == "pass"), "{}", v["layers"]);
}

#[test]
fn a_baseline_with_the_known_bad_combination_is_flagged_as_such() {
    // The live node here has no such device (no device at all on the host): the warning
    // comes from the baseline alone.
    let file = fixture("node-c-connectx5-known-bad.json");
    let (code, out, err) = doctor(&["--no-loopback", "--compare", file.to_str().unwrap()]);
    assert_ne!(code, 2, "{err}");
    let line = out.lines().find(|l| l.contains(KNOWN_BAD_CX5)).unwrap_or_else(|| panic!("no known-bad line: {out}"));
    assert!(line.contains("in the baseline") && line.contains("node-c-connectx5-known-bad.json"), "{line}");
}

#[test]
fn usage_errors_exit_2_and_help_exits_0() {
    let a = fixture("node-a.json");
    for args in [
        vec!["--no-such-flag"],
        vec!["--compare-nodes", a.to_str().unwrap()],
        vec!["--timeout", "0"],
        vec!["--memlock-need", "12Q"],
        vec!["-p", "300"],
    ] {
        let (code, _, err) = doctor(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("error"), "{args:?}: {err}");
    }
    let (code, out, _) = doctor(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("--compare-nodes") && out.contains("exit status"), "{out}");
}

/// A TCP server on a free local port that sends `reply` to its first client and keeps the
/// connection until the client goes.
fn fake_peer(reply: Vec<u8>) -> (String, std::thread::JoinHandle<()>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a local port");
    let addr = listener.local_addr().expect("its address").to_string();
    let server = std::thread::spawn(move || {
        if let Ok((mut s, _)) = listener.accept() {
            let _ = s.write_all(&reply);
            let _ = s.read_to_end(&mut Vec::new());
        }
    });
    (addr, server)
}

#[test]
fn peer_with_nobody_serving_fails_the_control_channel_and_says_to_start_the_server() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (code, out, err) = doctor(&["--peer", &format!("127.0.0.1:{port}"), "--timeout", "2"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("FAIL  control channel"), "{out}");
    assert!(out.contains("run `rdma-doctor --serve` on 127.0.0.1"), "{out}");
}

#[test]
fn peer_that_is_another_program_or_floods_a_line_is_refused_at_the_control_channel() {
    let (addr, server) = fake_peer(b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec());
    let (code, out, err) = doctor(&["--peer", &addr, "--timeout", "5"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("not an rdma-doctor hello"), "{out}");
    server.join().unwrap();

    let start = Instant::now();
    let (addr, server) = fake_peer(vec![b'x'; 1 << 20]);
    let (code, out, err) = doctor(&["--peer", &addr, "--timeout", "5"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("over 4096 bytes"), "{out}");
    assert!(start.elapsed() < Duration::from_secs(30), "a flood is cut at the line limit");
    server.join().unwrap();
}

#[test]
fn peer_json_is_one_object_and_serve_options_need_serve() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let port = port.to_string();
    let (code, out, _) = doctor(&["--peer", "127.0.0.1", "--peer-port", &port, "--json", "--timeout", "2"]);
    assert_eq!(code, 1);
    let v: Value = serde_json::from_str(&out).expect("--peer --json prints JSON");
    assert_eq!(v["checks"][0]["layer"], "control channel");
    assert_eq!(v["checks"][0]["ok"], false);
    let (code, _, err) = doctor(&["--once"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = doctor(&["--peer", "a", "--serve"]);
    assert_eq!(code, 2, "{err}");
}

/// Opens `silent` connections to `addr` that never speak, and one that sends a byte every
/// 2 s for 30 s: the clients a `--serve` must not let keep a prober out.
fn hostile_clients(addr: &str, silent: usize) -> (Vec<std::net::TcpStream>, std::thread::JoinHandle<()>) {
    use std::io::Write;
    let quiet = (0..silent).map(|_| std::net::TcpStream::connect(addr).expect("connect")).collect();
    let mut drip = std::net::TcpStream::connect(addr).expect("connect");
    let dripper = std::thread::spawn(move || {
        for _ in 0..15 {
            if drip.write_all(b"{").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    });
    (quiet, dripper)
}

/// Starts `rdma-doctor --serve --once` on a free port with `args`; the child and its address.
fn start_server(args: &[&str]) -> (std::process::Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let server = Command::new(env!("CARGO_BIN_EXE_rdma-doctor"))
        .args(["--serve", "--once", "--peer-port", &port])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run rdma-doctor --serve");
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "--serve did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, addr)
}

#[test]
fn serve_lets_an_honest_prober_in_past_130_silent_connections_and_a_one_byte_per_2s_client() {
    // No device here: the probe gets through the control channel, then fails at addressing.
    // A hello time (the server's timeout) far above the bound checked: a server that
    // queued behind the silent clients would fail it.
    let (mut server, addr) = start_server(&["--timeout", "30"]);
    let (silent, dripper) = hostile_clients(&addr, 130);
    std::thread::sleep(Duration::from_millis(500));
    let start = Instant::now();
    let (code, out, err) = doctor(&["--peer", &addr, "--timeout", "5"]);
    assert!(out.contains("PASS  control channel"), "{out}{err}");
    assert!(out.contains("FAIL  addressing"), "{out}{err}");
    assert_eq!(code, 1, "{out}{err}");
    assert!(start.elapsed() < Duration::from_secs(10), "the probe took {:?}", start.elapsed());
    // --once: the server ends after that one probe, the hostile clients still open.
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = server.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "--serve --once did not end after the probe");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut log = String::new();
    std::io::Read::read_to_string(server.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert_eq!(status.code(), Some(1), "this side could not take part: {log}");
    assert!(log.contains("no hello yet, and 64 connections wait for theirs"), "{log}");
    drop(silent);
    dripper.join().unwrap();
}

#[test]
fn a_rate_that_is_no_positive_number_and_port_0_are_usage_errors() {
    for bad in
        [&["--expect-rate", "NaN"][..], &["--expect-rate", "inf"], &["--expect-rate=-1"], &["--expect-rate", "0"]]
    {
        let mut args = vec!["--no-loopback"];
        args.extend_from_slice(bad);
        let (code, out, err) = doctor(&args);
        assert_eq!(code, 2, "{bad:?}: {out}{err}");
        assert!(err.contains("--expect-rate"), "{bad:?}: {err}");
        assert!(out.is_empty(), "no report for a usage error: {out}");
    }
    let (code, out, err) = doctor(&["--no-loopback", "-p", "0"]);
    assert_eq!(code, 2, "port 0 is no port: {out}{err}");
    assert!(err.contains("'0'") && err.contains("--port"), "{err}");
}

#[test]
fn flags_the_chosen_mode_would_ignore_are_refused() {
    let a = fixture("node-a.json");
    let b = fixture("node-b.json");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let refused: [&[&str]; 8] = [
        &["--compare-nodes", a, b, "-d", "mlx5_0"],
        &["--compare-nodes", a, b, "--expect-rate", "100"],
        &["--compare-nodes", a, b, "--no-loopback"],
        &["--compare-nodes", a, b, "--compare", a],
        &["--peer", "127.0.0.1", "--known-bad", a],
        &["--serve", "--json"],
        &["--serve", "--expect-rate", "100"],
        &["--no-loopback", "--peer-port", "9999"],
    ];
    for args in refused {
        let (code, out, err) = doctor(args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains("cannot be used with") || err.contains("required arguments"), "{args:?}: {err}");
    }
    // What the mode uses is still accepted.
    let (code, _, err) = doctor(&["--compare-nodes", a, b, "--json", "--ignore", "**.source"]);
    assert_ne!(code, 2, "{err}");
}

#[test]
fn a_compare_file_that_never_ends_is_refused_within_the_read_timeout() {
    // `--compare <(sleep 20)`: a pipe whose writer stays silent and open.
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rdma-doctor"))
        .args(["--no-loopback", "--compare", "/dev/fd/0"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run rdma-doctor");
    let writer = child.stdin.take();
    let out = child.wait_with_output().expect("wait for rdma-doctor");
    drop(writer);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("/dev/fd/0: nothing more to read after 10 s"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
}

#[test]
fn compare_nodes_prints_failed_links_then_warnings_then_differences() {
    // node-b with its port at half the rate of the others, and node-c's known-bad firmware.
    let mut slow: Value = serde_json::from_str(&std::fs::read_to_string(fixture("node-b.json")).unwrap()).unwrap();
    slow["baseline"]["devices"]["mlx5_0"]["ports"]["1"]["rate_gbps"] = serde_json::json!(100.0);
    slow["host"]["hostname"] = serde_json::json!("node-slow");
    let path = std::env::temp_dir().join(format!("rdma-doctor-slow-{}.json", std::process::id()));
    std::fs::write(&path, slow.to_string()).unwrap();
    let (a, b, c) = (fixture("node-a.json"), fixture("node-b.json"), fixture("node-c-connectx5-known-bad.json"));
    let files = [a.to_str().unwrap(), b.to_str().unwrap(), path.to_str().unwrap(), c.to_str().unwrap()];
    let mut args = vec!["--compare-nodes"];
    args.extend(files);
    let (code, out, err) = doctor(&args);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(code, 1, "{out}{err}");
    let at = |needle: &str| out.find(needle).unwrap_or_else(|| panic!("{needle} in {out}"));
    assert!(at("FAIL  node-slow/mlx5_0 link") < at("warning [node-c/mlx5_0] known-bad"), "{out}");
    assert!(at("warning [node-c/mlx5_0] known-bad") < at("devices.mlx5_0.fw_ver: 1 differ(s)"), "{out}");
    assert!(at("devices.mlx5_0.fw_ver") < at("Result: "), "{out}");
}
