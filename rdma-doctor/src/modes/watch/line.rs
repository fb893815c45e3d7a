//! One line of `--watch`: what it is about, how bad, and its two forms (text for a person,
//! one JSON object for a program).

use std::time::SystemTime;

use serde::Serialize;
use serde_json::Value;

/// How bad a line is; lines of one interval print worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Context: the watch began or ended, a port came up, a rate rose.
    Info,
    /// Worth knowing, not a fault: congestion or RNR below their thresholds, a blip of loss,
    /// a GID change.
    Note,
    /// A fault on a working link: counters that should stay still moved, a rate dropped,
    /// a QP or CQ error.
    Warning,
    /// The link or device is not working: a port left ACTIVE, the device failed or went.
    Critical,
}

impl Level {
    /// The word in the text form.
    pub fn word(self) -> &'static str {
        match self {
            Level::Info => "info",
            Level::Note => "note",
            Level::Warning => "WARN",
            Level::Critical => "CRIT",
        }
    }
}

/// What a line is about (the `kind` of a JSON line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The first line: what is watched, how often.
    Watching,
    /// An asynchronous event of the device (`ibv_get_async_event`).
    AsyncEvent,
    /// A port's state or physical state changed.
    LinkState,
    /// A port's rate changed while it was ACTIVE (or came back at another rate).
    LinkRate,
    /// Error counters of one class moved.
    Counters,
    /// The MTU of the netdev under a port, or the port's active MTU, changed.
    Mtu,
    /// A port's data rate crossed the share of the link's rate called saturated.
    Traffic,
    /// A device appeared or went away.
    Device,
    /// An RDMA line the kernel logged while the watch ran.
    KernelLog,
    /// The watcher could not read or open something.
    Error,
    /// The last line: how long, how many lines of each severity, why it ended.
    Summary,
}

/// One line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Line {
    /// When it was seen: RFC 3339, UTC, milliseconds.
    pub time: String,
    /// Seconds since the watch began.
    pub elapsed_s: f64,
    /// What it is about.
    pub kind: Kind,
    /// How bad.
    pub severity: Level,
    /// The device, `None` for lines about the watch itself.
    pub device: Option<String>,
    /// The port, `None` for device-wide lines.
    pub port: Option<u8>,
    /// The text form's words.
    pub message: String,
    /// Kind-specific facts (docs/doctor-json.md).
    pub details: Value,
}

/// A line in the making: the clock fields are filled in when it is stamped.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    /// See [`Line::kind`].
    pub kind: Kind,
    /// See [`Line::severity`].
    pub severity: Level,
    /// See [`Line::device`].
    pub device: Option<String>,
    /// See [`Line::port`].
    pub port: Option<u8>,
    /// See [`Line::message`].
    pub message: String,
    /// See [`Line::details`].
    pub details: Value,
}

impl Draft {
    /// A line about `device` (and `port`).
    pub fn new(kind: Kind, severity: Level, device: &str, port: Option<u8>, message: String, details: Value) -> Self {
        Draft { kind, severity, device: Some(device.to_owned()), port, message, details }
    }

    /// Stamps it with `now`, `elapsed_s` seconds into the watch.
    pub fn stamp(self, now: SystemTime, elapsed_s: f64) -> Line {
        Line {
            time: humantime::format_rfc3339_millis(now).to_string(),
            elapsed_s: (elapsed_s * 1000.0).round() / 1000.0,
            kind: self.kind,
            severity: self.severity,
            device: self.device,
            port: self.port,
            message: self.message,
            details: self.details,
        }
    }
}

/// Worst first; lines of equal severity keep the order they were found in (device, then
/// port), which is stable.
pub fn worst_first(lines: &mut [Draft]) {
    lines.sort_by_key(|l| std::cmp::Reverse(l.severity));
}

impl Line {
    /// One JSON object, no newline.
    pub fn to_json(&self) -> String {
        // A Line is strings, numbers and a Value: serializing cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// `TIME SEVERITY DEVICE/PORT KIND: MESSAGE`.
    pub fn to_text(&self) -> String {
        let scope = match (&self.device, self.port) {
            (Some(d), Some(p)) => format!("{d}/{p}"),
            (Some(d), None) => d.clone(),
            (None, _) => "-".to_owned(),
        };
        let kind = serde_json::to_value(self.kind).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
        format!("{} {:4} {scope} {kind}: {}", self.time, self.severity.word(), self.message)
    }
}
