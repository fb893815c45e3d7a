//! `rdma-doctor --watch 1 --json` as a child process on the test bed: an idle healthy device
//! gives no warning over several intervals and the watch ends cleanly on Ctrl-C; a link
//! flap (the netdev under the device down, then up) is seen as a port-down and a port-up
//! line, each within two intervals, and SIGTERM ends the watch with exit 0 and a summary;
//! a change of the netdev's MTU is one line with the old and new values.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use rdma_test_support::{device_name, open, LeakCheck};
use serde_json::Value;

use crate::{ip, LinkUp};

/// The interval the tests watch at.
const INTERVAL: Duration = Duration::from_secs(1);
/// Starting the doctor (opening the device) under emulation.
const START: Duration = Duration::from_secs(30);

/// A running `rdma-doctor --watch`, its JSON lines with the moment each arrived.
struct Watch {
    child: Child,
    lines: Receiver<(Instant, Value)>,
    seen: Vec<Value>,
}

impl Watch {
    fn start() -> Watch {
        let secs = INTERVAL.as_secs_f64().to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_rdma-doctor"))
            .args(["--watch", &secs, "--json", "-d", &device_name()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run rdma-doctor --watch");
        let out = child.stdout.take().expect("stdout piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                eprintln!("watch: {line}");
                let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
                if tx.send((Instant::now(), v)).is_err() {
                    break;
                }
            }
        });
        let mut w = Watch { child, lines, seen: Vec::new() };
        let (_, first) = w.until("the first line", Instant::now() + START, |_| true);
        assert_eq!(first["kind"], "watching", "{first}");
        assert_eq!(first["details"]["interval_s"], INTERVAL.as_secs_f64(), "{first}");
        assert_eq!(first["details"]["devices"][device_name()]["async_events"], true, "{first}");
        w
    }

    /// The first line from now on that `ok` accepts, and when it arrived; panics at
    /// `deadline` naming `what`.
    #[track_caller]
    fn until(&mut self, what: &str, deadline: Instant, ok: impl Fn(&Value) -> bool) -> (Instant, Value) {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((at, v)) => {
                    self.seen.push(v.clone());
                    if ok(&v) {
                        return (at, v);
                    }
                }
                Err(_) => panic!("no line for {what} in time; lines seen: {:#?}", self.seen),
            }
        }
    }

    /// Sends `signal`, waits for the exit; the status, the lines printed after `signal`, and
    /// every line.
    fn end(mut self, signal: &str) -> (ExitStatus, Vec<Value>, Vec<Value>) {
        let pid = self.child.id().to_string();
        let kill = Command::new("kill").args([&format!("-{signal}"), &pid]).status().expect("run kill");
        assert!(kill.success(), "kill -{signal} {pid}");
        let deadline = Instant::now() + START;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait for the doctor") {
                break s;
            }
            assert!(Instant::now() < deadline, "the doctor did not end within {START:?} of {signal}");
            std::thread::sleep(Duration::from_millis(20));
        };
        // The reader thread sends what is left until the pipe's end.
        let mut rest = Vec::new();
        while let Ok((_, v)) = self.lines.recv_timeout(Duration::from_secs(10)) {
            rest.push(v);
        }
        self.seen.extend(rest.iter().cloned());
        (status, rest, std::mem::take(&mut self.seen))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The summary line among `lines`, which must be the last.
#[track_caller]
fn summary<'a>(lines: &'a [Value], signal: &str) -> &'a Value {
    let last = lines.last().unwrap_or_else(|| panic!("no line after {signal}"));
    assert_eq!(last["kind"], "summary", "{lines:#?}");
    assert_eq!(last["details"]["signal"], signal, "{last}");
    last
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn watch_of_a_healthy_idle_device_prints_no_warning_over_three_intervals_and_ends_cleanly_on_ctrl_c() {
    let _leaks = LeakCheck::new();
    let mut w = Watch::start();
    let deadline = Instant::now() + INTERVAL * 3 + INTERVAL / 2;
    while Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        if let Ok((_, v)) = w.lines.recv_timeout(left) {
            w.seen.push(v);
        }
    }
    let (status, rest, seen) = w.end("INT");
    assert_eq!(status.code(), Some(0), "{status:?}");
    let s = summary(&rest, "SIGINT");
    assert!(s["details"]["intervals"].as_u64().unwrap_or(0) >= 3, "{s}");
    let bad: Vec<&Value> = seen.iter().filter(|v| v["severity"] == "warning" || v["severity"] == "critical").collect();
    assert!(bad.is_empty(), "a healthy idle device gave warnings: {bad:#?}");
    assert!(!seen.iter().any(|v| v["kind"] == "mtu"), "no MTU changed: {seen:#?}");
    assert_eq!(s["details"]["lines"]["warning"], 0, "{s}");
    assert_eq!(s["details"]["lines"]["critical"], 0, "{s}");
}

#[test]
#[ignore = "needs an RDMA device (RoCE, run as root): run scripts/test"]
fn watch_sees_a_link_flap_port_down_then_up_each_within_two_intervals_and_ends_cleanly_on_sigterm() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let gid = ctx.default_gid(1).unwrap();
    let netdev = gid.netdev.clone().expect("a RoCE device: the default GID names its netdev");
    let guard = LinkUp { ctx: ctx.clone(), netdev: netdev.clone(), gid_index: gid.index, gid: gid.gid.to_string() };
    let port_line = |v: &Value, active: bool| {
        v["kind"] == "link_state" && v["port"] == 1 && (v["details"]["to"]["state"] == "ACTIVE") == active
    };
    let mut w = Watch::start();

    ip(&["link", "set", &netdev, "down"]);
    let down_at = Instant::now();
    let (seen, down) = w.until("the port going down", down_at + INTERVAL * 2, |v| port_line(v, false));
    eprintln!("port down seen after {:?}", seen - down_at);
    assert_eq!(down["severity"], "critical", "{down}");
    assert_eq!(down["details"]["from"]["state"], "ACTIVE", "{down}");
    assert_eq!(down["device"], device_name(), "{down}");
    // The kernel's port event, folded into the line or a line of its own.
    let port_err = |v: &Value| {
        v["details"]["events"].as_array().is_some_and(|e| e.iter().any(|e| e == "IBV_EVENT_PORT_ERR"))
            || (v["kind"] == "async_event" && v["details"]["event"] == "IBV_EVENT_PORT_ERR")
    };
    assert!(w.seen.iter().any(port_err), "no IBV_EVENT_PORT_ERR: {:#?}", w.seen);

    ip(&["link", "set", &netdev, "up"]);
    let up_at = Instant::now();
    let (seen, up) = w.until("the port coming back", up_at + INTERVAL * 2, |v| port_line(v, true));
    eprintln!("port up seen after {:?}", seen - up_at);
    assert_eq!(up["severity"], "info", "{up}");
    guard.restore().unwrap_or_else(|e| panic!("{e}"));

    let (status, rest, _) = w.end("TERM");
    assert_eq!(status.code(), Some(0), "{status:?}");
    let s = summary(&rest, "SIGTERM");
    assert!(s["details"]["lines"]["critical"].as_u64().unwrap_or(0) >= 1, "{s}");
}

/// Sets the MTU of `netdev` back to what it was, whatever happens in the test.
struct MtuBack {
    netdev: String,
    mtu: String,
}

impl Drop for MtuBack {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "set", "dev", &self.netdev, "mtu", &self.mtu]).status();
    }
}

#[test]
#[ignore = "needs an RDMA device (RoCE, run as root): run scripts/test"]
fn watch_notes_each_change_of_the_netdev_mtu_once_and_warns_when_the_active_mtu_falls() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let gid = ctx.default_gid(1).unwrap();
    let netdev = gid.netdev.clone().expect("a RoCE device: the default GID names its netdev");
    let mtu = std::fs::read_to_string(format!("/sys/class/net/{netdev}/mtu")).unwrap().trim().to_owned();
    let active = ctx.query_port(1).unwrap().active_mtu.bytes();
    assert_eq!((mtu.as_str(), active), ("1500", 1024), "the test bed's rxe0 on dummy0");
    let back = MtuBack { netdev: netdev.clone(), mtu };
    let mtu_line = |v: &Value| v["kind"] == "mtu" && v["port"] == 1;
    let mut w = Watch::start();

    // rxe keeps an active MTU of 1024 down to a netdev MTU of 1104 (1024 and its headers).
    ip(&["link", "set", "dev", &netdev, "mtu", "1200"]);
    let at = Instant::now();
    let (seen, line) = w.until("the MTU change to 1200", at + INTERVAL * 2, mtu_line);
    eprintln!("MTU 1200 seen after {:?}", seen - at);
    assert_eq!(line["severity"], "note", "{line}");
    assert_eq!(
        line["message"],
        format!("the MTU of netdev {netdev} changed from 1500 to 1200; the port's active MTU stays 1024"),
        "{line}"
    );
    assert_eq!(line["details"]["to"]["active_mtu"], 1024, "{line}");

    ip(&["link", "set", "dev", &netdev, "mtu", "1000"]);
    let at = Instant::now();
    let (seen, line) = w.until("the MTU change to 1000", at + INTERVAL * 2, mtu_line);
    eprintln!("MTU 1000 seen after {:?}", seen - at);
    assert_eq!(line["severity"], "warning", "{line}");
    let said = line["message"].as_str().unwrap();
    let want =
        format!("the MTU of netdev {netdev} changed from 1200 to 1000; the port's active MTU fell from 1024 to 512");
    assert!(said.starts_with(&want), "{line}");

    drop(back);
    let at = Instant::now();
    let (_, line) = w.until("the MTU back to 1500", at + INTERVAL * 2, mtu_line);
    assert_eq!(line["severity"], "note", "{line}");
    assert!(line["message"].as_str().unwrap().ends_with("active MTU rose from 512 to 1024"), "{line}");
    assert_eq!(ctx.query_port(1).unwrap().active_mtu.bytes(), 1024);

    let (status, rest, seen) = w.end("TERM");
    assert_eq!(status.code(), Some(0), "{status:?}");
    summary(&rest, "SIGTERM");
    assert_eq!(seen.iter().filter(|v| mtu_line(v)).count(), 3, "one line per change: {seen:#?}");
}
