//! The RDMA lines of the kernel log, read from `/dev/kmsg` without blocking. Where the
//! log is not readable (dmesg_restrict without CAP_SYSLOG) that is recorded, not failed.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

use crate::model::report::{KernelLog, LogError};

/// Words that mark a kernel log line as RDMA's (matched lowercase).
const KEYWORDS: &[&str] = &[
    "infiniband",
    "rdma",
    "rxe",
    "siw",
    "mlx4",
    "mlx5",
    "ib_core",
    "ib_uverbs",
    "ib_cm",
    "iw_cm",
    "roce",
    "uverbs",
    "bnxt_re",
    "irdma",
    "efa",
    "qedr",
    "hns_roce",
    "erdma",
    "mana_ib",
    "pvrdma",
    "hfi1",
];

/// The part of the kernel log the doctor reads: the first [`BOOT_WINDOW_USEC`] after boot
/// (when the drivers probe) and the last [`RECENT_WINDOW_USEC`] before the run (a recent
/// `modprobe`, a program that just failed). A line between the two is an old event of the
/// running system (a registration that failed hours ago), not the state of the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// Lines up to this many microseconds after boot.
    pub boot_usec: u64,
    /// Lines from this many microseconds after boot on.
    pub since_usec: u64,
}

/// Drivers probe within the first 10 minutes after boot.
pub(crate) const BOOT_WINDOW_USEC: u64 = 600_000_000;
/// The last 30 minutes before the doctor ran.
pub(crate) const RECENT_WINDOW_USEC: u64 = 1_800_000_000;

impl Window {
    /// The window for a run at `now_usec` after boot.
    pub(crate) fn at(now_usec: u64) -> Window {
        Window { boot_usec: BOOT_WINDOW_USEC, since_usec: now_usec.saturating_sub(RECENT_WINDOW_USEC) }
    }

    /// The whole log (and what `--watch` reads as it comes).
    pub(crate) fn all() -> Window {
        Window { boot_usec: u64::MAX, since_usec: 0 }
    }

    fn contains(self, usec: u64) -> bool {
        usec <= self.boot_usec || usec >= self.since_usec
    }
}

/// Microseconds since boot on the clock of the kernel log's time stamps (CLOCK_MONOTONIC:
/// neither counts a suspend).
fn now_usec() -> u64 {
    // SAFETY: timespec is plain data; all-zero is a valid value.
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `t` is a valid out-pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) } != 0 {
        return u64::MAX;
    }
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(t.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000).saturating_add(nanos / 1000)
}

/// Reads the kernel ring buffer and keeps the last `keep` RDMA lines of the [`Window`].
pub(crate) fn read(keep: usize) -> KernelLog {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open("/dev/kmsg");
    let mut file = match file {
        Ok(f) => f,
        Err(e) => return KernelLog { error: Some(format!("/dev/kmsg: {e}")), ..KernelLog::default() },
    };
    let mut records = Vec::new();
    // One read returns one record; records are at most a few KiB.
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => records.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            // EPIPE: the record was overwritten while we read; the next read goes on.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) => {
                return KernelLog { error: Some(format!("reading /dev/kmsg: {e}")), ..KernelLog::default() };
            }
        }
    }
    filter(records.iter().map(String::as_str), keep, Window::at(now_usec()))
}

/// Keeps the RDMA records (`prio,seq,usec,flags;text`) of `window`, as `[seconds] text`,
/// and the ones that report an errno.
pub(crate) fn filter<'a>(records: impl Iterator<Item = &'a str>, keep: usize, window: Window) -> KernelLog {
    let mut lines = Vec::new();
    let mut errors = Vec::new();
    for rec in records {
        let first = rec.lines().next().unwrap_or("");
        let (meta, text) = first.split_once(';').unwrap_or(("", first));
        let lower = text.to_ascii_lowercase();
        // Whole words that start with a keyword: `mlx5_core`, `rxe0`, but not `default`.
        let mut words = lower.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
        if !words.any(|w| KEYWORDS.iter().any(|k| w.starts_with(k))) {
            continue;
        }
        let usec: u64 = meta.split(',').nth(2).and_then(|u| u.parse().ok()).unwrap_or(0);
        if !window.contains(usec) {
            continue;
        }
        let line = format!("[{:>5}.{:06}] {text}", usec / 1_000_000, usec % 1_000_000);
        // A registration that failed (a program's memlock or memory, the doctor's own
        // earlier run included) is no driver error: a note, never a driver's errno.
        if let Some(errno) = reported_errno(&lower).filter(|_| registration(&lower).is_none()) {
            errors.push(LogError { line: line.clone(), errno, meaning: errno_meaning(errno) });
        }
        lines.push(line);
    }
    let skip = lines.len().saturating_sub(keep);
    let skip_err = errors.len().saturating_sub(keep);
    KernelLog { readable: true, error: None, lines: lines.split_off(skip), errors: errors.split_off(skip_err) }
}

/// Lines without an errno that are known to mean trouble, and what they mean (matched
/// lowercase).
const TROUBLE: &[(&str, &str)] = &[
    ("timeout event on qp", "the device timed out a QP: its peer stopped answering, or the firmware is stuck"),
    ("health compromised", "the device's firmware reported a fatal error (health poll): it needs a reset"),
    ("fw fatal", "the device's firmware reported a fatal error: it needs a reset"),
    ("internal error", "the device reported an internal error: the driver may have reset it"),
    ("wait_func", "a firmware command timed out (the firmware is stuck or slow)"),
    ("cmd timeout", "a firmware command timed out (the firmware is stuck or slow)"),
    ("transmit queue", "a transmit queue timed out: the NIC stopped sending"),
    ("tx timeout", "a transmit queue timed out: the NIC stopped sending"),
];

/// Lines of a memory registration that failed (mlx5's `umem get failed`, rxe's `Unable to
/// pin memory region`), matched lowercase.
const REGISTRATION: &[&str] = &["umem get failed", "unable to pin memory", "ib_umem_get", "reg_user_mr"];

/// What a registration failure means: a program's, not the driver's.
const REGISTRATION_MEANING: &str = "a memory registration failed: a program's memlock limit or memory ran out (an earlier program's or test's, not a driver error)";

/// Whether a (lowercase) line reports a failed memory registration.
fn registration(lower: &str) -> Option<&'static str> {
    REGISTRATION.iter().any(|p| lower.contains(p)).then_some(REGISTRATION_MEANING)
}

/// What a kernel log line means when it is known trouble without a driver's errno (a
/// failed registration is one: see [`REGISTRATION`]).
pub(crate) fn trouble(line: &str) -> Option<&'static str> {
    let lower = line.to_ascii_lowercase();
    registration(&lower)
        .or_else(|| TROUBLE.iter().find(|(pattern, _)| lower.contains(pattern)).map(|(_, meaning)| *meaning))
}

/// The errno in a failure line: `failed with error -16`, `err -110`, `ret = -12`, `(-5)`.
fn reported_errno(lower: &str) -> Option<i32> {
    if !(lower.contains("fail") || lower.contains("err") || lower.contains("unable")) {
        return None;
    }
    let bytes = lower.as_bytes();
    for (i, _) in lower.match_indices('-') {
        let before = if i == 0 { b' ' } else { bytes[i - 1] };
        if !matches!(before, b' ' | b'(' | b'=' | b':' | b',') {
            continue;
        }
        let digits: String = lower[i + 1..].chars().take_while(char::is_ascii_digit).collect();
        let after = lower[i + 1 + digits.len()..].chars().next();
        if digits.is_empty() || after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '.') {
            continue;
        }
        match digits.parse::<i32>() {
            Ok(n) if (1..=133).contains(&n) => return Some(n),
            _ => continue,
        }
    }
    None
}

/// The errno's name and what it usually means when a driver reports it.
pub(crate) fn errno_meaning(errno: i32) -> String {
    let (name, usual) = match errno {
        libc::EBUSY => (
            "EBUSY",
            "PCIe resources taken (another driver bound, BAR or MSI-X allocation), or a firmware the driver rejects",
        ),
        libc::ETIMEDOUT => {
            ("ETIMEDOUT", "the firmware did not answer the driver (stuck firmware, needs a reset or a power cycle)")
        }
        libc::ENOMEM => ("ENOMEM", "the driver could not allocate memory or device resources"),
        libc::ENOENT => ("ENOENT", "a firmware file or an object the driver expected is missing"),
        libc::ENODEV => ("ENODEV", "the device went away or is not supported by this driver"),
        libc::EINVAL => ("EINVAL", "the driver and the firmware disagree on a parameter (version mismatch)"),
        libc::EIO => ("EIO", "a hardware or PCIe error"),
        libc::EOPNOTSUPP => ("EOPNOTSUPP", "the firmware lacks a capability this driver needs"),
        libc::EPERM | libc::EACCES => ("EPERM/EACCES", "the operation is not permitted (secure boot, lockdown)"),
        libc::EAGAIN => ("EAGAIN", "the device was not ready; the driver may retry"),
        _ => {
            let text = std::io::Error::from_raw_os_error(errno).to_string();
            return format!("errno {errno}: {text}");
        }
    };
    format!("{name} ({errno}): {usual}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_lines_and_probe_errors_are_kept() {
        let records = [
            "6,100,34245517,-;rdma_rxe: loaded",
            "6,101,35000000,-;e1000: eth0 link up",
            "3,102,36000000,-;mlx5_core 0000:03:00.0: probe_one:1620:(pid 1): mlx5_init_one failed with error code -16",
            "3,103,37000000,-;mlx5_core: probe of 0000:03:00.1 failed with error -110",
            "6,104,37100000,-;infiniband rxe0: set active\n SUBSYSTEM=infiniband",
            "6,105,37200000,-;mlx5_core 0000:03:00.0: firmware version: 16.24.1000",
            "6,106,37300000,-;ACPI: Added _OSI(Processor Device), default domain",
        ];
        let log = filter(records.iter().copied(), 10, Window::all());
        assert_eq!(log.lines.len(), 5, "{:#?}", log.lines);
        assert!(log.lines[0].starts_with("[   34.245517] rdma_rxe: loaded"), "{}", log.lines[0]);
        let errnos: Vec<i32> = log.errors.iter().map(|e| e.errno).collect();
        assert_eq!(errnos, [16, 110], "{:#?}", log.errors);
        assert!(log.errors[0].meaning.starts_with("EBUSY (16)"), "{}", log.errors[0].meaning);
        assert_eq!(filter(records.iter().copied(), 2, Window::all()).lines.len(), 2);
    }

    #[test]
    fn a_registration_that_failed_is_a_note_not_a_driver_error() {
        // An earlier test's ibv_reg_mr beyond the memlock limit, a minute before the run.
        let now = 20_000_000_000;
        let records = [
            "4,1,19940000000,-;rdma_rxe: rxe_mr_init_user: Unable to pin memory region err = -12",
            "3,2,19950000000,-;mlx5_ib: mr_umem_get: umem get failed (-12)",
            "3,3,19960000000,-;mlx5_core 0000:03:00.0: mlx5_cmd_out_err:838: CREATE_MKEY(0x200) op_mod(0x0) failed, status bad parameter(0x3), syndrome (0x3b2f6f), err(-22)",
        ];
        let log = filter(records.iter().copied(), 10, Window::at(now));
        assert_eq!(log.lines.len(), 3, "{:#?}", log.lines);
        assert_eq!(log.errors.iter().map(|e| e.errno).collect::<Vec<_>>(), [22], "{:#?}", log.errors);
        for line in &log.lines[..2] {
            assert!(trouble(line).is_some_and(|m| m.starts_with("a memory registration failed")), "{line}");
        }
        // With no device, rxe is not blamed for its registration line.
        let mut facts = crate::model::report::Baseline::default();
        for m in ["ib_core", "ib_uverbs", "rdma_rxe"] {
            facts
                .modules
                .insert(m.into(), crate::model::report::ModuleInfo { state: "Live".into(), ..Default::default() });
        }
        let seen = crate::model::report::Observations { kernel_log: log, ..Default::default() };
        let yes = crate::model::layer::KernelRdma { has: Some(true), config: None };
        let r = crate::judge::modules_layer::check(&facts, &seen, &yes);
        assert!(r.evidence.iter().all(|e| !e.contains("Unable to pin")), "{r:#?}");
        assert!(!r.summary.contains("driver errors"), "{r:#?}");
    }

    #[test]
    fn only_the_boot_and_the_recent_windows_are_read() {
        let now = 20_000_000_000; // 5.5 hours after boot
        let records = [
            "3,1,20000000,-;mlx5_core 0000:03:00.0: probe_one:1620:(pid 1): mlx5_init_one failed with error code -16",
            "3,2,5000000000,-;mlx5_ib: mr_umem_get: umem get failed (-12)",
            "4,3,19990000000,-;mlx5_core 0000:03:00.0: timeout event on QP 0x1a2b",
        ];
        let log = filter(records.iter().copied(), 10, Window::at(now));
        assert_eq!(log.lines.len(), 2, "{:#?}", log.lines);
        assert!(log.lines.iter().all(|l| !l.contains("umem get failed")), "{:#?}", log.lines);
        assert_eq!(log.errors.iter().map(|e| e.errno).collect::<Vec<_>>(), [16]);
        assert_eq!(trouble(&log.lines[1]), Some(TROUBLE[0].1));
        assert_eq!(trouble(&log.lines[0]), None);
        // Soon after boot the two windows meet: everything is read.
        assert_eq!(filter(records.iter().copied(), 10, Window::at(BOOT_WINDOW_USEC)).lines.len(), 3);
    }
}
