//! `--serve` on the test bed hands out verdicts as fresh as they claim: a link taken down
//! between two scrapes fails the next scrape's port verdict and the next `--fleet` table's
//! row of the node; two scrapes list their series in the same order. The server runs with
//! `--listen`, `--allow` and `--secret-file` on, as an operator would run it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use prometheus_parse::{Sample, Scrape, Value};
use rdma_test_support::{device_name, open, LeakCheck};
use rdma_verbs::PortState;

use super::{get_metrics, ip, wait_until, LinkUp, Served};

/// `GET /metrics` on `port` of 127.0.0.1: the body, and how long the answer took.
fn scrape(port: u16) -> Option<(String, Duration)> {
    let start = Instant::now();
    let answer = get_metrics(port)?;
    Some((body(&answer).to_owned(), start.elapsed()))
}

/// The body of an answer that must be 200 OK.
fn body(answer: &str) -> &str {
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("{answer}"));
    assert!(head.starts_with("HTTP/1.0 200 OK"), "{answer}");
    body
}

fn samples(text: &str) -> Vec<Sample> {
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("the metrics parse").samples
}

fn verdict(samples: &[Sample], scope: &str, layer: &str) -> Option<f64> {
    let s = samples.iter().find(|s| {
        s.metric == "rdma_doctor_layer_verdict"
            && s.labels.get("scope") == Some(scope)
            && s.labels.get("layer") == Some(layer)
    })?;
    match s.value {
        Value::Gauge(x) | Value::Untyped(x) => Some(x),
        _ => panic!("{s:?}"),
    }
}

fn gauge(samples: &[Sample], metric: &str) -> f64 {
    match samples.iter().find(|s| s.metric == metric).unwrap_or_else(|| panic!("no {metric}")).value {
        Value::Gauge(x) | Value::Untyped(x) => x,
        ref v => panic!("{v:?}"),
    }
}

/// The series of a scrape, without their values.
fn series(text: &str) -> Vec<&str> {
    text.lines().filter(|l| !l.starts_with('#')).map(|l| l.rsplit_once(' ').map_or(l, |(s, _)| s)).collect()
}

#[test]
#[ignore = "needs an RDMA device (RoCE, run as root): run scripts/test"]
fn a_link_taken_down_between_two_scrapes_fails_the_next_scrape_and_the_next_fleet_table() {
    let _leaks = LeakCheck::new();
    let doctor = env!("CARGO_BIN_EXE_rdma-doctor");
    let name = device_name();
    let secret = std::env::temp_dir().join(format!("rdma-doctor-serve-{}", std::process::id()));
    std::fs::write(&secret, "a secret of the test bed's fleet\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let secret = secret.to_str().unwrap().to_owned();
    let (server, answer) = Served::start(&[
        "--timeout",
        "10",
        "--listen",
        "127.0.0.1",
        "--allow",
        "127.0.0.0/8",
        "--secret-file",
        &secret,
    ]);
    let (metrics, peer) = (server.metrics, server.peer);
    let first = body(&answer);
    let s = samples(first);
    assert_eq!((verdict(&s, &name, "port"), verdict(&s, &name, "link")), (Some(0.0), Some(0.0)), "{first}");
    let (second, took) = scrape(metrics).unwrap();
    eprintln!("a second scrape: {:.1} s", took.as_secs_f64());
    assert_eq!(series(first), series(&second), "the same series in the same order");
    assert!(gauge(&samples(&second), "rdma_doctor_report_age_seconds") < 600.0);

    let fleet = |label: &str| {
        let start = Instant::now();
        let out = Command::new(doctor)
            .args(["--fleet", &format!("127.0.0.1:{peer}"), "--timeout", "120", "--json", "--secret-file", &secret])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        eprintln!("--fleet {label}: {:.1} s, exit {:?}", start.elapsed().as_secs_f64(), out.status.code());
        let v: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{e}: {text}{}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code(), v)
    };
    let (code, v) = fleet("healthy");
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(v["nodes"][0]["node_exit_code"], 0, "{v:#}");

    let ctx = open();
    let gid = ctx.default_gid(1).unwrap();
    let netdev = gid.netdev.clone().expect("a RoCE device: the default GID names its netdev");
    let guard = LinkUp { ctx: ctx.clone(), netdev: netdev.clone(), gid_index: gid.index, gid: gid.gid.to_string() };
    ip(&["link", "set", &netdev, "down"]);
    wait_until("the port leaves ACTIVE", || ctx.query_port(1).is_ok_and(|p| p.state != PortState::Active));

    let (down, took) = scrape(metrics).unwrap();
    eprintln!("the scrape after the link went down: {:.1} s", took.as_secs_f64());
    let s = samples(&down);
    assert_eq!(verdict(&s, &name, "port"), Some(2.0), "{down}");
    // The link is not judged past a failed port: absent (skipped) or failed, never a pass.
    assert_ne!(verdict(&s, &name, "link"), Some(0.0), "{down}");
    assert_eq!(gauge(&s, "rdma_doctor_exit_code"), 1.0, "{down}");
    assert!(gauge(&s, "rdma_doctor_report_age_seconds") < took.as_secs_f64() + 1.0, "diagnosed for this scrape");

    let (code, v) = fleet("link down");
    assert_eq!(code, Some(1), "{v:#}");
    let node = &v["nodes"][0];
    assert_eq!(node["node_exit_code"], 1, "{v:#}");
    let failed = node["failed_layers"].as_array().unwrap();
    assert!(failed.iter().any(|l| l.as_str().unwrap().starts_with(&format!("{name} port"))), "{node:#}");
    let row = &v["rows"][0];
    assert!(row["state"].as_str().is_some_and(|s| s.contains("DOWN")), "{row:#}");
    assert_eq!(row["doctor"], "FAIL port", "{row:#}");

    guard.restore().unwrap_or_else(|e| panic!("{e}"));
    let (up, _) = scrape(metrics).unwrap();
    let s = samples(&up);
    assert_eq!((verdict(&s, &name, "port"), verdict(&s, &name, "link")), (Some(0.0), Some(0.0)), "{up}");
    drop(server);
}

#[test]
#[ignore = "needs an RDMA device (RoCE, run as root): run scripts/test"]
fn a_scrape_among_eight_idle_clients_is_answered_at_once_and_a_trickling_client_is_closed() {
    let _leaks = LeakCheck::new();
    let name = device_name();
    let (server, _) = Served::start(&["--timeout", "10", "--listen", "127.0.0.1", "--allow", "127.0.0.0/8"]);
    let metrics = server.metrics;

    // Eight clients connect and send nothing, as a port scanner or a stuck scraper would.
    let idle: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(("127.0.0.1", metrics)).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let (body, took) = scrape(metrics).unwrap();
    let s = samples(&body);
    let age = Duration::from_secs_f64(gauge(&s, "rdma_doctor_report_age_seconds"));
    // A scrape that ran a diagnosis of its own waited for the others only before it.
    let waited = took.saturating_sub(age);
    eprintln!(
        "a scrape among 8 idle clients: {:.2} s (its report {:.2} s old: waited {:.2} s)",
        took.as_secs_f64(),
        age.as_secs_f64(),
        waited.as_secs_f64()
    );
    assert!(waited < Duration::from_secs(3), "the idle clients delayed the scrape by {waited:?}");
    assert_eq!((verdict(&s, &name, "port"), verdict(&s, &name, "link")), (Some(0.0), Some(0.0)), "{body}");
    assert_eq!(gauge(&s, "rdma_doctor_exit_code"), 0.0, "{body}");

    // The idle ones are closed, unanswered, after the request timeout (2 s; the VM is slow).
    for mut c in idle {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut said = Vec::new();
        let end = c.read_to_end(&mut said);
        assert!(end.is_ok() && said.is_empty(), "{end:?} {}", String::from_utf8_lossy(&said));
    }

    // A client that sends its head one byte every 100 ms is closed within the same bound.
    let mut trickler = TcpStream::connect(("127.0.0.1", metrics)).unwrap();
    let opened = Instant::now();
    trickler.write_all(b"GET /metrics HTTP/1.0\r\nX-Slow: ").unwrap();
    let closed = loop {
        std::thread::sleep(Duration::from_millis(100));
        if trickler.write_all(b"a").is_err() {
            break opened.elapsed();
        }
        assert!(opened.elapsed() < Duration::from_secs(15), "a trickling client was never closed");
    };
    eprintln!("a trickling client closed after {:.2} s", closed.as_secs_f64());
    assert!(closed > Duration::from_millis(1500), "closed before the request timeout: {closed:?}");
    assert!(closed < Duration::from_secs(8), "{closed:?}");
    let (after, _) = scrape(metrics).unwrap();
    assert_eq!(gauge(&samples(&after), "rdma_doctor_exit_code"), 0.0, "{after}");
    drop(server);
}
