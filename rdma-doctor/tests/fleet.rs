//! `rdma-doctor --fleet` over fake nodes: threads on local ports answering the fleet's
//! requests from recorded reports (testdata/), a hundred of them generated from a few.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_doctor::modes::fleet::wire::{self, Asked};
use rdma_doctor::modes::peer::{Check, PeerReport};
use serde_json::{json, Value};

const NODE_A: &str = include_str!("../testdata/node-a.json");
const NODE_KNOWN_BAD: &str = include_str!("../testdata/node-c-connectx5-known-bad.json");

/// What a fake node does with a request.
#[derive(Clone)]
enum Role {
    /// Answers with this report; probes of the addresses in `bad` fail at RDMA_WRITE, and
    /// every probe fails when `broken`.
    Good { report: Value, broken: bool },
    /// Writes these bytes and closes.
    Garbage(Vec<u8>),
    /// Answers after this long.
    Slow(Duration, Value),
}

/// A `--peer` report from `from` to `peer`: every check passed, or RDMA_WRITE failed.
fn probe_report(peer: &str, ok: bool) -> PeerReport {
    let check = |layer: &str, ok: bool, detail: &str| Check {
        layer: layer.into(),
        ok,
        warning: false,
        detail: detail.into(),
        fix: (!ok).then(|| "check the path's loss: `ethtool -S NETDEV`".to_owned()),
    };
    let mut checks = vec![check("control channel", true, "TCP and hello"), check("QP connection", true, "RTS")];
    checks.push(if ok {
        check("RDMA_WRITE", true, "4096 bytes verified")
    } else {
        check("RDMA_WRITE", false, "no completion within 1 s (the data plane)")
    });
    PeerReport { format_version: 3, peer: peer.into(), checks, elapsed_ms: 3, ..PeerReport::default() }
}

/// Starts a fake node; its address. `bad` holds the addresses whose probes fail.
fn fake_node(role: Role, bad: Arc<std::sync::Mutex<Vec<String>>>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in l.incoming().flatten() {
            let (role, bad) = (role.clone(), Arc::clone(&bad));
            std::thread::spawn(move || answer(stream, &role, &bad));
        }
    });
    addr
}

fn answer(mut stream: TcpStream, role: &Role, bad: &std::sync::Mutex<Vec<String>>) {
    let mut line = String::new();
    if BufReader::new((&stream).take(4096)).read_line(&mut line).is_err() {
        return;
    }
    let asked = wire::parse_request(line.trim_end()).expect("a fleet request");
    let (report, broken) = match role {
        Role::Garbage(bytes) => {
            let _ = stream.write_all(bytes);
            return;
        }
        Role::Slow(wait, report) => {
            std::thread::sleep(*wait);
            (report.clone(), false)
        }
        Role::Good { report, broken } => (report.clone(), *broken),
    };
    let text = match asked {
        // The answer as the real server writes it, around a report as recorded (any version).
        Ok(Asked::Report) => {
            json!({"magic": wire::MAGIC, "version": wire::PROTOCOL_VERSION, "report": report}).to_string() + "\n"
        }
        asked => {
            let fails = |peer: &str| broken || bad.lock().unwrap().iter().any(|b| b == peer);
            wire::answer(
                asked,
                || Err("this node has no report".into()),
                |peer, _| Ok(probe_report(peer, !fails(peer))),
            )
        }
    };
    let _ = stream.write_all(text.as_bytes());
}

/// A recorded report made node `i` of the fleet: its own host name and identities.
fn variant(recorded: &str, i: usize, edit: impl FnOnce(&mut Value)) -> Value {
    let mut v: Value = serde_json::from_str(recorded).unwrap();
    v["host"]["hostname"] = json!(format!("node-{i:03}"));
    let dev = &mut v["baseline"]["devices"]["mlx5_0"];
    dev["node_guid"] = json!(format!("0c42:a103:00{:02x}:{:04x}", i / 256, i));
    dev["sys_image_guid"] = dev["node_guid"].clone();
    dev["ports"]["1"]["gids"]["3"]["gid"] = json!(format!("::ffff:192.168.{}.{}", i / 200, i % 200 + 1));
    edit(&mut v);
    v
}

fn run(args: &[&str]) -> (i32, String, String) {
    let mut argv = vec!["rdma-doctor"];
    argv.extend_from_slice(args);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = rdma_doctor::modes::cli::run(argv, &mut out, &mut err);
    (code, String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap())
}

/// A local port nothing listens on and none of `taken` is: bound and let go. Made after
/// the fake nodes' listeners, so that none of them can be handed the same port later (a
/// port let go early was once given to the next fake node, and two nodes had one address).
fn closed_port(taken: &[String]) -> String {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        if !taken.contains(&addr) {
            return addr;
        }
    }
}

struct Fleet {
    addrs: Vec<String>,
}

/// A hundred nodes: node-017 and node-042 on older firmware, node-063 on another kernel,
/// node-077 a ConnectX-5 with a known-bad firmware and driver, node-031 whose paths all
/// fail, node-005 unreachable, node-006 answering 5 MiB of garbage, node-009 answering
/// HTTP, node-007 slower than the timeout, node-008 with a report of format version 99.
fn hundred() -> Fleet {
    let bad = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut addrs = Vec::new();
    for i in 0..100 {
        let role = match i {
            5 => {
                // Filled in after the loop, when every listener is bound.
                addrs.push(String::new());
                continue;
            }
            6 => Role::Garbage(vec![b'x'; 5 << 20]),
            9 => Role::Garbage(b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec()),
            7 => Role::Slow(Duration::from_secs(4), variant(NODE_A, i, |_| {})),
            8 => Role::Good { report: variant(NODE_A, i, |v| v["format_version"] = json!(99)), broken: false },
            17 | 42 => Role::Good {
                report: variant(NODE_A, i, |v| v["baseline"]["devices"]["mlx5_0"]["fw_ver"] = json!("22.31.1014")),
                broken: false,
            },
            63 => Role::Good {
                report: variant(NODE_A, i, |v| v["baseline"]["kernel"]["release"] = json!("6.1.0-27-amd64")),
                broken: false,
            },
            77 => Role::Good { report: variant(NODE_KNOWN_BAD, i, |_| {}), broken: false },
            _ => Role::Good { report: variant(NODE_A, i, |_| {}), broken: i == 31 },
        };
        addrs.push(fake_node(role, Arc::clone(&bad)));
    }
    addrs[5] = closed_port(&addrs);
    bad.lock().unwrap().push(addrs[31].clone());
    Fleet { addrs }
}

#[test]
fn a_hundred_recorded_nodes_are_tabulated_in_seconds_with_every_fault_named_and_none_fatal() {
    let fleet = hundred();
    let mut args = vec!["--fleet"];
    args.extend(fleet.addrs.iter().map(String::as_str));
    args.extend(["--timeout", "1.5"]);
    let start = Instant::now();
    let (code, text, err) = run(&args);
    let took = start.elapsed();
    assert!(took < Duration::from_secs(8), "took {took:?}");
    assert_eq!(code, 1, "{text}{err}");
    let a = |i: usize| fleet.addrs[i].as_str();
    // The table: a row per answering node, drift marked where it is.
    let row =
        |name: &str| text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name}: {text}")).to_owned();
    assert!(row("node-017").contains("22.31.1014*"), "{}", row("node-017"));
    assert!(row("node-042").contains("22.31.1014*"), "{}", row("node-042"));
    assert!(row("node-063").contains("6.1.0-27-amd64*"), "{}", row("node-063"));
    assert!(row("node-077").contains("16.24.1000*") && row("node-077").contains("known-bad"), "{}", row("node-077"));
    assert!(!row("node-050").contains('*'), "{}", row("node-050"));
    // Nodes without an answer, each with its reason.
    for (i, what) in [(5, "UNREACHABLE"), (6, "GARBAGE"), (9, "GARBAGE"), (7, "SLOW"), (8, "OTHER VERSION")] {
        assert!(text.contains(&format!("  {}: {what}: ", a(i))), "node {i} {what}: {text}");
    }
    assert!(text.contains("an answer over 4 MiB"), "{text}");
    assert!(text.contains("the answer is not JSON"), "{text}");
    assert!(text.contains("format_version Some(99)"), "{text}");
    // The known-bad combination and the differing fields.
    assert!(text.contains("warning [node-077/mlx5_0] known-bad [connectx5-fw-16.24.1000-ofed-5.4-1.0.3.0]"), "{text}");
    assert!(text.contains("devices.mlx5_0.fw_ver: 3 differ(s) from the 92 other node(s)"), "{text}");
    // The ring over the 95 answering nodes: the two links of node-031 fail, and it is named.
    assert!(text.contains("FAIL  node-030 -> node-031: at RDMA_WRITE: no completion"), "{text}");
    assert!(text.contains("FAIL  node-031 -> node-032: at RDMA_WRITE"), "{text}");
    assert!(text.contains("PASS  93 other link(s)"), "{text}");
    assert_eq!(text.matches("\n  FAIL  ").count(), 2, "{text}");
    assert!(text.contains("every probed link of node-031 failed while others passed"), "{text}");
    assert!(text.contains("Result: 5 node(s) without a usable answer; 2 bad link(s)"), "{text}");
}

#[test]
fn the_fleet_json_names_each_node_state_and_a_saved_one_is_a_baseline_per_node() {
    let fleet = hundred();
    let few: Vec<&str> = [0, 1, 2, 5, 7, 8].iter().map(|&i| fleet.addrs[i].as_str()).collect();
    let dir = std::env::temp_dir().join(format!("rdma-doctor-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let saved = dir.join("fleet.json");
    let mut args = vec!["--fleet"];
    args.extend(few.iter().copied());
    args.extend(["--timeout", "1", "--json", "--no-probe", "--save", saved.to_str().unwrap()]);
    let (code, text, err) = run(&args);
    assert_eq!(code, 1, "{err}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!((v["format"].as_str(), v["format_version"].as_u64()), (Some("rdma-doctor-fleet"), Some(1)));
    let states: Vec<&str> = v["nodes"].as_array().unwrap().iter().map(|n| n["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["answered", "answered", "answered", "unreachable", "slow", "other_version"]);
    assert_eq!(v["topology"], "none");
    assert!(v["links"].as_array().unwrap().is_empty());

    // The three healthy nodes against the saved fleet: nothing drifted.
    let (code, text, err) =
        run(&["--fleet", few[0], few[1], few[2], "--no-probe", "--compare", saved.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}{err}");
    assert!(text.contains("drift from the saved baseline") && text.contains("  none\n"), "{text}");
    // node-017's firmware against node-000's saved report: marked `!` and listed.
    let one = dir.join("node.json");
    std::fs::write(&one, variant(NODE_A, 0, |_| {}).to_string()).unwrap();
    let (code, text, _) = run(&["--fleet", fleet.addrs[17].as_str(), "--compare", one.to_str().unwrap()]);
    assert_eq!(code, 3, "{text}");
    assert!(text.contains("22.31.1014!"), "{text}");
    assert!(text.contains("node-017: devices.mlx5_0.fw_ver: \"22.36.1010\" -> \"22.31.1014\""), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn healthy_nodes_exit_0_and_a_mesh_probes_every_pair() {
    let bad = Arc::new(std::sync::Mutex::new(Vec::new()));
    let addrs: Vec<String> = (0..5)
        .map(|i| fake_node(Role::Good { report: variant(NODE_A, i, |_| {}), broken: false }, Arc::clone(&bad)))
        .collect();
    let mut args = vec!["--fleet"];
    args.extend(addrs.iter().map(String::as_str));
    let (code, text, err) = run(&args);
    assert_eq!(code, 0, "{text}{err}");
    assert!(text.contains("all 5 nodes agree") && text.contains("paths (ring,"), "{text}");
    assert_eq!(text.matches("\n  PASS  ").count(), 5, "{text}");
    args.push("--mesh");
    let (code, text, _) = run(&args);
    assert_eq!(code, 0, "{text}");
    assert_eq!(text.matches("\n  PASS  ").count(), 10, "{text}");
}

#[test]
fn the_serve_door_hands_its_report_to_a_collector_and_probes_another_node_on_request() {
    // Two real `--serve` doors on this host (no RDMA device: the probe between them gets
    // through the control channel and fails at addressing, named on the link).
    let start_door = || {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let report: rdma_doctor::Report = rdma_doctor::model::input::parse_report(NODE_A).unwrap();
        let opts = rdma_doctor::modes::peer::PeerOptions {
            device: None,
            port: None,
            timeout: Duration::from_secs(2),
            tcp_port: port,
            secret: None,
        };
        let reports = Arc::new(rdma_doctor::modes::fresh::Reports::fixed(report));
        let door = rdma_doctor::modes::peer::ServeOptions::default();
        std::thread::spawn(move || {
            rdma_doctor::modes::peer::serve(&door, false, &opts, Some(reports), &mut std::io::sink())
        });
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "no door on {addr}");
            std::thread::sleep(Duration::from_millis(20));
        }
        addr
    };
    let (a, b) = (start_door(), start_door());
    let (code, text, err) = run(&["--fleet", &a, &b, "--timeout", "2", "--json"]);
    assert_eq!(code, 1, "{text}{err}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(v["nodes"].as_array().unwrap().iter().all(|n| n["state"] == "answered"), "{text}");
    let link = &v["links"][0];
    assert_eq!(link["ok"], false, "{link}");
    assert_eq!(link["probe"]["checks"][0]["layer"], "control channel", "{link}");
    assert_eq!(link["probe"]["checks"][0]["ok"], true, "{link}");
    assert!(link["failed_layer"] == "addressing" || link["failed_layer"] == "QP setup", "{link}");

    // A request of another version, and a peer that is no HOST:PORT: refused with the reason.
    for (request, why) in [
        (r#"{"magic":"rdma-doctor-fleet","version":7,"request":"report"}"#, "version 7"),
        (r#"{"magic":"rdma-doctor-fleet","version":1,"request":"probe","peer":"a b","timeout_ms":5}"#, "HOST:PORT"),
    ] {
        let mut s = TcpStream::connect(&a).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(format!("{request}\n").as_bytes()).unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        let v: Value = serde_json::from_str(&answer).unwrap();
        assert!(v["error"].as_str().unwrap().contains(why), "{answer}");
    }
}

#[test]
fn a_hosts_file_takes_comments_and_refuses_two_hosts_on_a_line() {
    let hosts = rdma_doctor::modes::fleet::parse_hosts_file("# rack 1\nnode-1\n  node-2:7  # spare port\n\n").unwrap();
    assert_eq!(hosts, ["node-1", "node-2:7"]);
    let e = rdma_doctor::modes::fleet::parse_hosts_file("node-1 node-2\n").unwrap_err();
    assert!(e.contains("line 1"), "{e}");
    // The same node twice is a usage error; so is --mesh without --fleet.
    let (code, _, err) = run(&["--fleet", "127.0.0.1:9", "127.0.0.1:9"]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(run(&["--mesh"]).0, 2);
    assert_eq!(run(&["--fleet", "a", "--serve"]).0, 2);
}

/// The fleet report `scripts/doctor-fleet` saved on the two test-bed nodes (rxe on a
/// virtual wire), healthy.
const TEST_BED: &str = include_str!("../testdata/fleet-rxe-two-nodes.json");

#[test]
fn the_test_beds_saved_fleet_report_is_a_baseline_that_names_the_node_whose_mtu_changed() {
    let saved: Value = serde_json::from_str(TEST_BED).unwrap();
    assert_eq!(saved["exit_code"], 0);
    let bad = Arc::new(std::sync::Mutex::new(Vec::new()));
    // Two nodes answering with the recorded baselines, under the recorded labels; the
    // second one's NIC now at MTU 9000 (rxe's active MTU 4096).
    let addrs: Vec<String> = (0..2)
        .map(|i| {
            let node = &saved["nodes"][i];
            let report = variant(NODE_A, i, |v| {
                v["host"]["hostname"] = node["label"].clone();
                v["baseline"] = node["baseline"].clone();
                if i == 1 {
                    let port = &mut v["baseline"]["devices"]["rxe0"]["ports"]["1"];
                    port["active_mtu"] = json!(4096);
                    port["netdev"]["mtu"] = json!(9000);
                }
            });
            fake_node(Role::Good { report, broken: false }, Arc::clone(&bad))
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("rdma-doctor-fleet-bed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bed.json");
    std::fs::write(&file, TEST_BED).unwrap();
    let (code, text, err) = run(&["--fleet", &addrs[0], &addrs[1], "--compare", file.to_str().unwrap()]);
    assert_eq!(code, 3, "{text}{err}");
    assert!(text.contains("1024/1500*  "), "{text}");
    assert!(text.contains("4096/9000*!"), "{text}");
    assert!(text.contains("10.98.0.2: devices.rxe0.ports.1.active_mtu: 1024 -> 4096"), "{text}");
    assert!(!text.contains("10.98.0.1: "), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The test bed's two recorded nodes (rxe0 on enp0s10), node 10.98.0.1's port at 4X EDR
/// (100 Gb/s) and node 10.98.0.2's at `slow` (width, speed, rate).
fn bed_nodes(slow: (&str, &str, f64)) -> Vec<String> {
    let saved: Value = serde_json::from_str(TEST_BED).unwrap();
    let bad = Arc::new(std::sync::Mutex::new(Vec::new()));
    (0..2)
        .map(|i| {
            let node = &saved["nodes"][i];
            let report = variant(NODE_A, i, |v| {
                v["host"]["hostname"] = node["label"].clone();
                v["baseline"] = node["baseline"].clone();
                let (width, speed, rate) = if i == 0 { ("4X", "EDR", 100.0) } else { slow };
                let port = &mut v["baseline"]["devices"]["rxe0"]["ports"]["1"];
                (port["width"], port["speed"], port["rate_gbps"]) = (json!(width), json!(speed), json!(rate));
            });
            fake_node(Role::Good { report, broken: false }, Arc::clone(&bad))
        })
        .collect()
}

#[test]
fn a_node_whose_port_runs_below_its_peers_rate_is_a_link_failure_there_as_for_one_node() {
    let addrs = bed_nodes(("1X", "EDR", 25.0));
    let (code, text, err) = run(&["--fleet", &addrs[0], &addrs[1]]);
    eprintln!("{text}");
    assert_eq!(code, 1, "{text}{err}");
    let line = text.lines().find(|l| l.contains("FAIL") && l.contains("rxe0 link")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("10.98.0.2/rxe0"), "{line}");
    assert!(
        line.contains(
            "port 1 runs at 25 Gb/s, below the expected 100 Gb/s (its peers' rate: the fastest node with rxe0 port 1"
        ),
        "{line}"
    );
    assert!(!text.contains("10.98.0.1/rxe0 link"), "{text}");
    assert!(text.contains("Result: 1 device(s) whose link failed; the nodes differ in 2 field(s) (exit 1)"), "{text}");
    let (_, json, _) = run(&["--fleet", &addrs[0], &addrs[1], "--json"]);
    let v: Value = serde_json::from_str(&json).unwrap();
    let failed: Vec<&Value> = v["layers"].as_array().unwrap().iter().filter(|l| l["outcome"] == "fail").collect();
    assert_eq!(failed.len(), 1, "{json}");
    assert_eq!((failed[0]["scope"].as_str(), failed[0]["layer"].as_str()), (Some("10.98.0.2/rxe0"), Some("link")));
    assert_eq!(v["exit_code"], 1);
    // Rates that differ by design, said so: compared neither as fields nor as a link.
    let (code, text, err) = run(&[
        "--fleet",
        &addrs[0],
        &addrs[1],
        "--ignore",
        "**.rate_gbps",
        "--ignore",
        "**.width",
        "--ignore",
        "**.speed",
    ]);
    assert_eq!(code, 0, "{text}{err}");
    // Both at the same rate: healthy.
    let addrs = bed_nodes(("4X", "EDR", 100.0));
    let (code, text, err) = run(&["--fleet", &addrs[0], &addrs[1]]);
    assert_eq!(code, 0, "{text}{err}");
}

#[test]
fn no_answer_a_node_can_send_panics_the_collector_or_passes_for_a_report() {
    // A valid answer, then 300 seeded mutations of it (cut, bytes flipped, bytes inserted),
    // deep nesting, and huge numbers: each is a usable report or a named failure.
    let valid = json!({"magic": wire::MAGIC, "version": wire::PROTOCOL_VERSION, "report": variant(NODE_A, 1, |_| {})})
        .to_string();
    let mut rng = fastrand::Rng::with_seed(35);
    let mut payloads: Vec<Vec<u8>> = vec![valid.clone().into_bytes()];
    for _ in 0..300 {
        let mut b = valid.clone().into_bytes();
        match rng.u8(0..3) {
            0 => b.truncate(rng.usize(0..b.len())),
            1 => (0..rng.usize(1..8)).for_each(|_| {
                let at = rng.usize(0..b.len());
                b[at] = rng.u8(..);
            }),
            _ => {
                let at = rng.usize(0..b.len());
                let junk: Vec<u8> = (0..rng.usize(1..16)).map(|_| rng.u8(..)).collect();
                b.splice(at..at, junk);
            }
        }
        payloads.push(b);
    }
    payloads.push(vec![b'['; 100_000]);
    payloads.push(valid.replacen("\"euid\":1000", "\"euid\":1e999999", 1).into_bytes());
    payloads.push(valid.replacen("\"version\":1", "\"version\":18446744073709551616", 1).into_bytes());
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let count = payloads.len();
    std::thread::spawn(move || {
        for (mut s, p) in l.incoming().flatten().zip(payloads) {
            let mut line = String::new();
            let _ = BufReader::new((&s).take(4096)).read_line(&mut line);
            let _ = s.write_all(&p);
        }
    });
    let mut usable = 0;
    for i in 0..count {
        match wire::fetch_report(&addr, None, Duration::from_secs(5)) {
            Ok(r) => {
                usable += 1;
                assert_eq!(r.host.hostname, "node-001", "payload {i}");
            }
            Err((_, why)) => assert!(!why.is_empty(), "payload {i}"),
        }
    }
    assert!(usable >= 1, "the valid answer reads");
}

#[test]
fn a_serve_of_an_older_doctor_that_answers_with_its_peer_hello_is_named_another_version() {
    let bad = Arc::new(std::sync::Mutex::new(Vec::new()));
    let hello = br#"{"magic":"rdma-doctor-peer","version":2,"end":{"host":"old"}}"#.to_vec();
    let old = fake_node(Role::Garbage([hello, b"\n".to_vec()].concat()), Arc::clone(&bad));
    let ok = fake_node(Role::Good { report: variant(NODE_A, 1, |_| {}), broken: false }, bad);
    let (code, text, _) = run(&["--fleet", &ok, &old, "--json"]);
    assert_eq!(code, 1, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["nodes"][0]["state"], "answered");
    assert_eq!(v["nodes"][1]["state"], "other_version");
    let why = v["nodes"][1]["error"].as_str().unwrap();
    assert!(why.contains("speaks only the peer protocol (version 2)"), "{why}");
    assert_eq!(v["topology"], "none", "one answering node: nothing to probe");
}
