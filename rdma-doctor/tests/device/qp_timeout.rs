//! The seed's symptom on a healthy device: a `timeout event on QP` line in the kernel log
//! (written to /dev/kmsg as a driver prints it, `infiniband NAME: ...`) is a warning about
//! that device with what to check, said by the first run after it and not by the next run
//! of the same boot. The device is a second rxe of its own, removed at the end: the line
//! stays in the log, and once its device is gone it is a note for every later test.

use std::path::Path;
use std::process::Command;

use rdma_doctor::model::input;
use rdma_doctor::model::report::Severity;
use rdma_doctor::{Layer, Outcome, Report};

use crate::{ip, wait_until, SecondRxe};

const DEVICE: &str = "rxeqpt";
const NETDEV: &str = "dummyqpt";

/// `rdma-doctor --json -d DEVICE --no-loopback --state-dir DIR`: its exit status and report.
fn doctor(state: &Path) -> (Option<i32>, Report) {
    let out = Command::new(env!("CARGO_BIN_EXE_rdma-doctor"))
        .args(["--json", "-d", DEVICE, "--no-loopback", "--state-dir"])
        .arg(state)
        .output()
        .expect("run rdma-doctor");
    let text = String::from_utf8_lossy(&out.stdout);
    let r =
        input::parse_report(&text).unwrap_or_else(|e| panic!("{e}: {text}{}", String::from_utf8_lossy(&out.stderr)));
    eprintln!("{}", rdma_doctor::render(&r));
    (out.status.code(), r)
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_qp_timeout_line_on_a_healthy_device_warns_with_advice_once_and_not_on_the_next_run_of_the_boot() {
    let second = SecondRxe::create(DEVICE, NETDEV);
    ip(&["addr", "add", "10.97.0.1/24", "dev", NETDEV]);
    ip(&["link", "set", NETDEV, "up"]);
    let state_of = |p: &str| std::fs::read_to_string(format!("/sys/class/infiniband/{DEVICE}/ports/1/{p}"));
    wait_until("the second device's port is ACTIVE", || state_of("state").is_ok_and(|s| s.contains("ACTIVE")));
    // Its RoCE v2 GID of 10.97.0.1 (the gid layer looks for it).
    wait_until("the second device's IPv4 GID", || {
        (0..8).any(|i| state_of(&format!("gids/{i}")).is_ok_and(|g| g.contains("ffff:0a61:0001")))
    });
    let state = std::env::temp_dir().join(format!("rdma-doctor-qpt-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);

    // Healthy, no QP timeout of this device: quiet, and no state written.
    let (code, r) = doctor(&state);
    assert!(r.layers.iter().all(|l| l.outcome != Outcome::Fail), "{:#?}", r.layers);
    assert_eq!(code, Some(0), "{:#?}", r.findings);
    assert!(!state.exists(), "a run with nothing to record writes nothing");

    let line = format!("infiniband {DEVICE}: timeout event on QP 0x{:x}", std::process::id());
    std::fs::write("/dev/kmsg", format!("<4>{line}\n")).unwrap_or_else(|e| panic!("write to /dev/kmsg: {e}"));

    let (code, r) = doctor(&state);
    let warned: Vec<_> = r.findings.iter().filter(|f| f.what.contains(&line)).collect();
    assert_eq!(warned.len(), 1, "{:#?}", r.findings);
    let w = warned[0];
    assert_eq!((w.severity, w.scope.as_str(), w.layer), (Severity::Warning, DEVICE, Some(Layer::Device)), "{w:#?}");
    assert!(w.what.contains("[the device timed out a QP"), "{w:#?}");
    let advice = w.advice.as_deref().unwrap_or_default();
    assert!(advice.contains("firmware and driver pair against the known-bad list"), "{advice}");
    assert!(advice.contains("rdma-doctor --peer HOST"), "{advice}");
    assert_eq!(code, Some(4), "a warning on an otherwise healthy device: {:#?}", r.layers);
    assert!(rdma_doctor::render(&r).contains(&line));

    // The next run of the same boot: the line is still read, and said no more.
    let (code, r) = doctor(&state);
    assert!(r.observations.kernel_log.lines.iter().any(|l| l.contains(&line)), "still in the log");
    assert!(r.findings.iter().all(|f| !f.what.contains(&line)), "{:#?}", r.findings);
    assert_eq!(code, Some(0));

    second.remove().unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::remove_dir_all(&state);
}
