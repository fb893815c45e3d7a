//! The child-process harness: a test's body run in a fresh process of its test binary.
//!
//! librdmacm opens a device's context the first time one of its ids binds to the device
//! and keeps it open until the process exits. On rxe an open context blocks the removal
//! of the device (a test deletes and recreates it) for as long as it is open, so no
//! rdma_cm call may happen in the process that runs the other tests.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cm_leak_check;

/// The environment variable that tells a child process which test it runs.
const CHILD: &str = "RDMA_TEST_CHILD";
/// The bound on a child process: under emulation (TCG) the first start of a large debug
/// binary from the shared folder takes seconds, and a doctor run with its rdma_cm check
/// and loopback tens of them.
const LIMIT: Duration = Duration::from_secs(300);

/// Runs `body` in a fresh process of this test binary that runs only `test` (its path in
/// the binary: [`this_test!`](crate::this_test)), bounded in time; here, waits for it and
/// asserts that it ran exactly that test and passed. Its output is shown indented, so that
/// its own "test result" line is not taken for this binary's.
pub fn in_own_process(test: &str, body: impl FnOnce()) {
    if std::env::var(CHILD).as_deref() == Ok(test) {
        body();
        return;
    }
    let log_path =
        std::env::temp_dir().join(format!("rdma-test-child-{}-{}.log", std::process::id(), test.replace(':', "_")));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--include-ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD, test)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("spawn the test binary");
    let deadline = Instant::now() + LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    let _ = std::fs::remove_file(&log_path);
    for line in output.lines() {
        eprintln!("    | {line}");
    }
    let status = status
        .unwrap_or_else(|| panic!("{test} did not finish within {LIMIT:?} in its own process (a context left open?)"));
    assert!(status.success(), "{test} failed in its own process: {status}");
    assert!(output.contains("test result: ok. 1 passed"), "{test}: the child process did not run exactly this test");
}

/// [`in_own_process`] with the rdma_cm leak check ([`cm_leak_check`]) taken first in the
/// child: for a test that uses rdma_cm.
pub fn isolated(test: &str, body: impl FnOnce()) {
    in_own_process(test, || {
        let _leaks = cm_leak_check();
        body();
    });
}
