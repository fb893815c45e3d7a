//! The kernel log followed from the moment the watch began: the RDMA lines the kernel
//! writes (`/dev/kmsg`, read without blocking). Other programs' QP errors reach no one's
//! event queue but the owner's; drivers log them (`timeout event on QP 0x1a2b`).

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;

use serde_json::json;

use super::line::{Draft, Kind, Level};
use crate::facts::kmsg;

/// `/dev/kmsg`, positioned after the last record when the watch began.
pub struct KernelLog {
    /// The open log (its descriptor is polled).
    pub file: File,
}

impl KernelLog {
    /// Opens the log at its end; `Err` says why not (dmesg_restrict without CAP_SYSLOG).
    pub fn open() -> Result<KernelLog, String> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .map_err(|e| format!("/dev/kmsg: {e}"))?;
        file.seek(SeekFrom::End(0)).map_err(|e| format!("/dev/kmsg: {e}"))?;
        Ok(KernelLog { file })
    }

    /// The RDMA records written since the last call, as lines: a warning for a line that
    /// reports an errno or is known trouble, a note for the others.
    pub fn lines(&mut self) -> Vec<Draft> {
        let mut records = Vec::new();
        // One read returns one record; records are at most a few KiB.
        let mut buf = vec![0u8; 16 * 1024];
        for _ in 0..1024 {
            match self.file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => records.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                // EPIPE: records were overwritten before we read them; the next read goes on.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        judge(records.iter().map(String::as_str))
    }
}

/// The lines of kernel log records (`prio,seq,usec,flags;text`).
pub fn judge<'a>(records: impl Iterator<Item = &'a str>) -> Vec<Draft> {
    let log = kmsg::filter(records, usize::MAX, kmsg::Window::all());
    log.lines
        .iter()
        .map(|line| {
            let error = log.errors.iter().find(|e| &e.line == line);
            let meaning = error.map(|e| e.meaning.clone()).or_else(|| kmsg::trouble(line).map(str::to_owned));
            let level = if meaning.is_some() { Level::Warning } else { Level::Note };
            let message = match &meaning {
                Some(m) => format!("{line} [{m}]"),
                None => line.clone(),
            };
            // A QP timeout gets what to check, as the diagnosis says it (once: the watch
            // reads each line as it comes).
            let advice = crate::judge::qp_timeouts::is_qp_timeout(line).then_some(crate::judge::qp_timeouts::ADVICE);
            let details = json!({"line": line, "errno": error.map(|e| e.errno), "meaning": meaning, "advice": advice});
            Draft { kind: Kind::KernelLog, severity: level, device: None, port: None, message, details }
        })
        .collect()
}
