//! Every file the doctor reads (a saved report, a node's report, a known-bad list) comes
//! through here: read with a size limit, then parsed strictly, so that a file that is not
//! what it claims to be is refused with the file and the field named, never half-read.

use std::io::Read;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::model::report::{FORMAT, FORMAT_VERSION};

use crate::model::report::Report;

/// The most bytes the doctor reads from one file: 4 MiB. A report of a node with a few
/// devices is some tens of KiB; a larger file is not a report, and `/dev/zero` is refused
/// after this many bytes instead of filling the memory.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// The longest the doctor waits for a file to end: a pipe (`--compare <(cmd)`) whose
/// writer neither writes nor closes is refused after this long instead of hanging.
pub const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The text of `path`, at most [`MAX_FILE_BYTES`] long, read within [`READ_TIMEOUT`]. The
/// error names the file.
pub fn read_limited(path: &Path) -> Result<String, String> {
    read_within(path, READ_TIMEOUT)
}

/// [`read_limited`] with the wait bounded by `timeout`.
pub(crate) fn read_within(path: &Path, timeout: std::time::Duration) -> Result<String, String> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let name = path.display();
    // Non-blocking: a pipe or FIFO is waited on with poll(2) and a deadline (a regular
    // file ignores the flag).
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("{name}: {e}"))?;
    let deadline = std::time::Instant::now() + timeout;
    let mut bytes = Vec::new();
    let mut reader = (&file).take(MAX_FILE_BYTES + 1);
    let mut chunk = [0u8; 64 << 10];
    loop {
        match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                let mut pfd = libc::pollfd { fd: file.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
                // SAFETY: one valid pollfd, for the duration of the call.
                let ready = unsafe { libc::poll(&mut pfd, 1, ms) };
                if ready == 0 {
                    return Err(format!(
                        "{name}: nothing more to read after {} s (a pipe whose writer neither writes nor ends?)",
                        timeout.as_secs()
                    ));
                }
            }
            Err(e) => return Err(format!("{name}: {e}")),
        }
    }
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "{name}: larger than {} MiB, the limit for a file the doctor reads (a report is some tens of KiB)",
            MAX_FILE_BYTES >> 20
        ));
    }
    String::from_utf8(bytes).map_err(|e| format!("{name}: not UTF-8 text ({e})"))
}

/// Parses `text` as a `T`, strictly: a field of the wrong type, a missing field or an
/// unknown one is an error that names the field by its path (`baseline.memlock.soft_bytes`).
pub fn parse_strict<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            inner.to_string()
        } else {
            format!("field `{path}`: {inner}")
        }
    })?;
    de.end().map_err(|e| e.to_string())?;
    Ok(value)
}

/// A doctor report: first its `format` and `format_version` (so that another file says
/// what it is), then every field with its type.
pub fn parse_report(text: &str) -> Result<Report, String> {
    let loose: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    baseline_of(&loose)?;
    parse_strict(text)
}

/// The report in the file `path`; the error names the file (and the field).
pub fn load_report(path: &Path) -> Result<Report, String> {
    let text = read_limited(path)?;
    parse_report(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Checks that `v` is a doctor report this crate can read and returns its `baseline`.
pub fn baseline_of(v: &Value) -> Result<&Value, String> {
    let format = v.get("format").and_then(Value::as_str);
    if format != Some(FORMAT) {
        return Err(format!("not an {FORMAT} report (format {format:?})"));
    }
    match v.get("format_version").and_then(Value::as_u64) {
        Some(n) if (1..=u64::from(FORMAT_VERSION)).contains(&n) => {}
        other => return Err(format!("format_version {other:?}; this doctor reads versions 1 to {FORMAT_VERSION}")),
    }
    v.get("baseline").ok_or_else(|| "the report has no baseline section".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE_A: &str = include_str!("../../testdata/node-a.json");

    #[test]
    fn the_fixture_report_reads_and_writes_back_the_same() {
        let r = parse_report(NODE_A).expect("the fixture is a report");
        assert_eq!(parse_report(&r.to_json()).unwrap(), r);
    }

    #[test]
    fn a_wrong_typed_field_is_refused_naming_its_path() {
        let bad = NODE_A.replacen("\"rate_gbps\": 200.0", "\"rate_gbps\": \"200\"", 1);
        assert_ne!(bad, NODE_A, "the fixture has the field");
        let e = parse_report(&bad).unwrap_err();
        assert!(e.contains("baseline.devices.mlx5_0.ports.1.rate_gbps") && e.contains("invalid type"), "{e}");
    }

    #[test]
    fn an_unknown_or_missing_field_is_refused_naming_it() {
        let unknown = NODE_A.replacen("\"euid\": 1000", "\"euid\": 1000, \"uid\": 1000", 1);
        let e = parse_report(&unknown).unwrap_err();
        assert!(e.contains("host") && e.contains("unknown field `uid`"), "{e}");
        let missing = NODE_A.replacen(",\n    \"euid\": 1000", "", 1);
        assert_ne!(missing, NODE_A);
        let e = parse_report(&missing).unwrap_err();
        assert!(e.contains("missing field `euid`"), "{e}");
    }

    #[test]
    fn a_file_over_the_limit_is_refused_after_the_limit() {
        let e = read_limited(Path::new("/dev/zero")).unwrap_err();
        assert!(e.starts_with("/dev/zero: larger than 4 MiB"), "{e}");
        assert!(read_limited(Path::new("/nonexistent/report.json"))
            .unwrap_err()
            .starts_with("/nonexistent/report.json: "));
    }
}
