//! `--peer`'s round trip on one node: a healthy path's is far inside the ACK timeout of
//! the probe's QPs, and the probe names both numbers; a 100 ms delay (netem) on the
//! control connection's path (the loopback netdev: both doctors run here) is measured as
//! such. On one node the RDMA packets do not take that path (rxe hands a packet for a
//! local address to its own receive side, past every qdisc), so the QPs retry nothing and
//! the probe stays quiet about it: the long-round-trip verdict itself is checked over
//! recorded counters (src/peer/probe.rs, src/peer/round_trip.rs).

use std::process::{Command, Stdio};

use rdma_test_support::{device_name, rdma_ip, LeakCheck};

use super::peer::{server_end, start_server};

/// `rdma-doctor --peer ADDR -d DEV --timeout SECS`: exit status and text.
fn probe(addr: &str, timeout: &str) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rdma-doctor"))
        .args(["--peer", addr, "-d", &device_name(), "--timeout", timeout])
        .stdin(Stdio::null())
        .output()
        .expect("run rdma-doctor --peer");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

/// The round trip the probe measured, in ms, from its control channel line.
fn round_trip_ms(text: &str) -> f64 {
    let at = text.find("round trip ").unwrap_or_else(|| panic!("no round trip in {text}"));
    text[at + "round trip ".len()..].split(' ').next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{text}"))
}

/// netem on `lo`, removed whatever happens.
struct Netem;

impl Netem {
    fn delay(ms: u32) -> Netem {
        let _ = Command::new("modprobe").arg("sch_netem").status();
        let out = Command::new("tc")
            .args(["qdisc", "add", "dev", "lo", "root", "netem", "delay", &format!("{ms}ms")])
            .output()
            .expect("run tc");
        assert!(out.status.success(), "tc qdisc add: {}", String::from_utf8_lossy(&out.stderr));
        Netem
    }
}

impl Drop for Netem {
    fn drop(&mut self) {
        let _ = Command::new("tc").args(["qdisc", "del", "dev", "lo", "root"]).status();
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn peer_measures_the_round_trip_and_names_the_ack_timeout_and_a_delayed_control_path_is_measured_as_such() {
    let _leaks = LeakCheck::new();
    let (mut server, addr) = start_server(&rdma_ip().to_string());
    let (code, text) = probe(&addr, "5");
    assert_eq!(server_end(&mut server).0.code(), Some(0));
    assert_eq!(code, Some(0), "a healthy path: {text}");
    let healthy = round_trip_ms(&text);
    assert!(text.contains("ACK timeout 536.9 ms (code 17, 6 retries)"), "{text}");
    assert!(healthy < 536.9 / 4.0, "the healthy round trip {healthy} ms is near the ACK timeout: {text}");
    assert!(!text.contains("a long round trip"), "{text}");

    let netem = Netem::delay(100);
    let (mut server, addr) = start_server(&rdma_ip().to_string());
    let (code, text) = probe(&addr, "1");
    assert_eq!(server_end(&mut server).0.code(), Some(0));
    drop(netem);
    let delayed = round_trip_ms(&text);
    assert!(delayed >= 200.0, "100 ms each way: {delayed} ms: {text}");
    assert!(text.contains("ACK timeout 67.1 ms (code 14, 6 retries)"), "{text}");
    // The RDMA packets took no delay: nothing was retried, nothing to say.
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains("a long round trip") && !text.contains("lossy"), "{text}");
    eprintln!("round trip: {healthy} ms healthy, {delayed} ms under netem delay 100ms on lo");
}
