//! `timeout event on QP` lines of the kernel log: a warning about the device the line
//! names (else the host), with what to check, said once per line and boot. The lines a
//! run has warned about are kept in a small file of the state directory (`--state-dir`,
//! default `$STATE_DIRECTORY`, else [`DEFAULT_STATE_DIR`]), keyed by the boot id: a later
//! run of the same boot stays quiet about them, the first run after a reboot starts
//! afresh. A state file that is missing, unreadable, corrupt, too large or of another boot
//! counts as empty; one that cannot be written is a note (the warning will come again),
//! never a failure of the run.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::facts::kmsg;
use crate::model::layer::Layer;
use crate::model::report::{Finding, KernelLog, Severity};

/// Where the state is kept when neither `--state-dir` nor `$STATE_DIRECTORY` says.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/rdma-doctor";
/// The state file, in the state directory.
pub const STATE_FILE: &str = "kernel-log-reported.json";
/// The value of the state file's `format`.
const FORMAT: &str = "rdma-doctor-kernel-log-reported";
/// The lines kept (the newest): a boot that logs more QP timeouts than this hears about
/// the oldest ones again, which is the safe side.
pub const MAX_LINES: usize = 256;
/// A line is kept by its first this many bytes (its time stamp and the driver's words).
const MAX_LINE_BYTES: usize = 240;
/// A state file larger than this is not read (it counts as empty).
const MAX_FILE_BYTES: u64 = 128 * 1024;
/// Where the kernel says which boot this is.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The state directory of a run: `--state-dir`, else `$STATE_DIRECTORY` (its first
/// directory: systemd's `StateDirectory=` sets it), else [`DEFAULT_STATE_DIR`].
pub fn state_dir(given: Option<&Path>) -> PathBuf {
    if let Some(d) = given {
        return d.to_owned();
    }
    let from_env = std::env::var_os("STATE_DIRECTORY")
        .and_then(|v| v.to_str().and_then(|s| s.split(':').next()).map(PathBuf::from))
        .filter(|p| p.is_absolute());
    from_env.unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR))
}

/// The state file's contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Saved {
    format: String,
    boot_id: String,
    lines: Vec<String>,
}

/// The lines already warned about in this boot, read from the state directory.
#[derive(Debug)]
pub(crate) struct Reported {
    file: PathBuf,
    /// None: the boot is unknown, so nothing counts as reported and nothing is saved.
    boot_id: Option<String>,
    lines: Vec<String>,
    changed: bool,
}

impl Reported {
    /// The state of this boot in `dir`.
    pub(crate) fn load(dir: &Path) -> Reported {
        let boot_id = std::fs::read_to_string(BOOT_ID).ok();
        Reported::load_for(dir, boot_id.as_deref())
    }

    /// The state of boot `boot_id` in `dir`: empty unless the file is a readable state
    /// of that boot.
    fn load_for(dir: &Path, boot_id: Option<&str>) -> Reported {
        let boot_id = boot_id.map(str::trim).filter(|b| !b.is_empty() && b.len() <= 64).map(str::to_owned);
        let file = dir.join(STATE_FILE);
        let lines = boot_id
            .as_ref()
            .and_then(|id| read(&file).filter(|s| &s.boot_id == id))
            .map(|s| s.lines.into_iter().take(MAX_LINES).collect())
            .unwrap_or_default();
        Reported { file, boot_id, lines, changed: false }
    }

    /// Whether `line` was warned about in this boot.
    pub(crate) fn contains(&self, line: &str) -> bool {
        let key = key(line);
        self.boot_id.is_some() && self.lines.iter().any(|l| *l == key)
    }

    /// Records `line` as warned about (the oldest go past [`MAX_LINES`]).
    pub(crate) fn add(&mut self, line: &str) {
        if self.contains(line) {
            return;
        }
        self.lines.push(key(line).to_owned());
        let extra = self.lines.len().saturating_sub(MAX_LINES);
        self.lines.drain(..extra);
        self.changed = true;
    }

    /// Writes the state if a line was added: a new file renamed over the old one, so
    /// that a reader never sees half of it.
    pub(crate) fn save(&self) -> Result<(), String> {
        let Some(boot_id) = self.boot_id.clone().filter(|_| self.changed) else { return Ok(()) };
        let saved = Saved { format: FORMAT.into(), boot_id, lines: self.lines.clone() };
        let text = serde_json::to_string_pretty(&saved).map_err(|e| e.to_string())? + "\n";
        let dir = self.file.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let tmp = dir.join(format!(".{STATE_FILE}.{}", std::process::id()));
        // create_new: a file (or a link) already there is not written through.
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .and_then(|()| std::fs::rename(&tmp, &self.file));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(format!("{}: {e}", self.file.display()));
        }
        Ok(())
    }
}

/// A line as it is kept: its first [`MAX_LINE_BYTES`] bytes (on a character boundary).
fn key(line: &str) -> &str {
    let mut end = line.len().min(MAX_LINE_BYTES);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}

/// The state file, if it is one of at most [`MAX_FILE_BYTES`].
fn read(file: &Path) -> Option<Saved> {
    let f = std::fs::File::open(file).ok()?;
    let mut text = String::new();
    f.take(MAX_FILE_BYTES + 1).read_to_string(&mut text).ok()?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return None;
    }
    let saved: Saved = serde_json::from_str(&text).ok()?;
    (saved.format == FORMAT).then_some(saved)
}

/// Whether a (kernel log) line reports a QP timeout.
pub(crate) fn is_qp_timeout(line: &str) -> bool {
    line.to_ascii_lowercase().contains("timeout event on qp")
}

/// Whose a line is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Whose {
    /// An examined device's: it names the device or its PCI function.
    Device(String),
    /// Another device's: it names an RDMA device (`infiniband NAME:`) or a PCI function
    /// that none of the examined devices is (what it names).
    Other(String),
    /// It names no device.
    Unknown,
}

/// Whose `line` is, among `devices` (each examined device and its PCI function, if any).
pub(crate) fn whose(line: &str, devices: &[(String, Option<String>)]) -> Whose {
    let text = line.split_once("] ").map_or(line, |(_, t)| t);
    let tokens: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')')
        .map(|t| t.trim_end_matches(':'))
        .filter(|t| !t.is_empty())
        .collect();
    for (name, pci) in devices {
        if tokens.iter().any(|t| t == name || pci.as_deref() == Some(*t)) {
            return Whose::Device(name.clone());
        }
    }
    // `infiniband NAME:` is how the kernel prefixes a line about an RDMA device.
    let named = tokens.windows(2).find(|w| w[0] == "infiniband").map(|w| format!("device {}", w[1]));
    let pci = tokens.iter().find(|t| is_pci_address(t)).map(|t| format!("PCI function {t}"));
    named.or(pci).map_or(Whose::Unknown, Whose::Other)
}

/// `0000:03:00.0`: domain, bus, device and function.
fn is_pci_address(t: &str) -> bool {
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    let parts: Vec<&str> = t.split(':').collect();
    match parts.as_slice() {
        [domain, bus, devfn] => {
            let (dev, func) = devfn.split_once('.').unwrap_or(("", ""));
            hex(domain, 4) && hex(bus, 2) && hex(dev, 2) && hex(func, 1)
        }
        _ => false,
    }
}

/// The PCI function under an RDMA device (`/sys/class/infiniband/NAME/device`), if any.
pub(crate) fn pci_function(name: &str) -> Option<String> {
    let target = std::fs::canonicalize(format!("/sys/class/infiniband/{name}/device")).ok()?;
    let last = target.file_name()?.to_str()?;
    is_pci_address(last).then(|| last.to_owned())
}

/// What to check after a QP timeout.
pub const ADVICE: &str = "check this device's firmware and driver pair against the known-bad list \
    (the doctor flags a listed pair as `known-bad [ID]`; `--known-bad FILE` adds a site's list), \
    and the peer the QP talks to: `rdma-doctor --peer HOST` against `rdma-doctor --serve` there";

/// The findings of the QP timeouts in `log`: a warning for each line of an examined device
/// (or of no device it names) not yet reported this boot, a note for a line of another
/// device; the warned lines are recorded in `reported`, and a state that cannot be saved
/// is a note.
pub(crate) fn findings(
    log: &KernelLog,
    devices: &[(String, Option<String>)],
    mut reported: Option<&mut Reported>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for line in log.lines.iter().filter(|l| is_qp_timeout(l)) {
        let meaning = kmsg::trouble(line).unwrap_or("the device timed out a QP");
        let what = format!("kernel log: {line} [{meaning}]");
        let scope = match whose(line, devices) {
            Whose::Device(name) => name,
            Whose::Unknown => "host".to_owned(),
            Whose::Other(named) => {
                out.push(Finding {
                    severity: Severity::Note,
                    scope: "host".into(),
                    what: format!("{what} ({named}: none of the examined devices)"),
                    advice: None,
                    source: None,
                    layer: None,
                });
                continue;
            }
        };
        if reported.as_ref().is_some_and(|r| r.contains(line)) {
            continue;
        }
        if let Some(r) = reported.as_mut() {
            r.add(line);
        }
        out.push(Finding {
            severity: Severity::Warning,
            scope,
            what,
            advice: Some(ADVICE.into()),
            source: Some("the kernel log (/dev/kmsg); said once per line and boot".into()),
            layer: Some(Layer::Device),
        });
    }
    if let Some(Err(e)) = reported.map(|r| r.save()) {
        out.push(Finding {
            severity: Severity::Note,
            scope: "host".into(),
            what: format!("could not record the QP timeouts warned about ({e}): the next run warns again"),
            advice: Some("give `--state-dir DIR` a directory this user can write".into()),
            source: None,
            layer: None,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rdma-doctor-qpt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn log(lines: &[&str]) -> KernelLog {
        KernelLog { readable: true, lines: lines.iter().map(|l| l.to_string()).collect(), ..KernelLog::default() }
    }

    const RXE: &str = "[  120.000001] infiniband rxe0: timeout event on QP 0x11";
    const MLX: &str = "[  130.000002] mlx5_core 0000:03:00.0: timeout event on QP 0x1a2b";

    #[test]
    fn a_qp_timeout_is_a_warning_with_advice_once_per_line_and_boot() {
        let dir = temp_dir("once");
        let devices = [("rxe0".to_owned(), None), ("mlx5_0".to_owned(), Some("0000:03:00.0".to_owned()))];
        let mut r = Reported::load_for(&dir, Some("boot-1"));
        let found = findings(&log(&[RXE, MLX, "[  1.0] rdma_rxe: loaded"]), &devices, Some(&mut r));
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(found.iter().all(|f| f.severity == Severity::Warning && f.layer == Some(Layer::Device)));
        assert_eq!((found[0].scope.as_str(), found[1].scope.as_str()), ("rxe0", "mlx5_0"));
        assert!(found[0].what.contains("timeout event on QP 0x11 [the device timed out a QP"), "{found:#?}");
        let advice = found[0].advice.as_deref().unwrap();
        assert!(advice.contains("known-bad list") && advice.contains("--peer HOST"), "{advice}");
        // A later run of the same boot: quiet about both; a new line is said.
        let mut r = Reported::load_for(&dir, Some("boot-1"));
        assert!(findings(&log(&[RXE, MLX]), &devices, Some(&mut r)).is_empty());
        let newer = "[  200.5] infiniband rxe0: timeout event on QP 0x12";
        let again = findings(&log(&[RXE, MLX, newer]), &devices, Some(&mut r));
        assert_eq!(again.len(), 1, "{again:#?}");
        assert!(again[0].what.contains("QP 0x12"), "{again:#?}");
        // Another boot: every line is new.
        let mut r = Reported::load_for(&dir, Some("boot-2"));
        assert_eq!(findings(&log(&[RXE, MLX]), &devices, Some(&mut r)).len(), 2);
        // Without a state: every run warns.
        assert_eq!(findings(&log(&[RXE]), &devices, None).len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_line_of_another_pci_function_is_a_note_and_a_line_naming_none_is_the_hosts() {
        let devices = [("rxe0".to_owned(), None)];
        let found = findings(&log(&[MLX]), &devices, None);
        assert_eq!((found.len(), found[0].severity), (1, Severity::Note), "{found:#?}");
        assert!(found[0].what.contains("PCI function 0000:03:00.0: none of the examined devices"), "{found:#?}");
        let bare = "[   5.000000] rdma_rxe: timeout event on QP 17";
        let found = findings(&log(&[bare]), &devices, None);
        assert_eq!((found[0].severity, found[0].scope.as_str()), (Severity::Warning, "host"), "{found:#?}");
        let gone = "[ 1.0] infiniband rxe01: timeout event on QP 1";
        assert_eq!(whose(gone, &devices), Whose::Other("device rxe01".into()));
        assert_eq!(findings(&log(&[gone]), &devices, None)[0].severity, Severity::Note);
        assert!(is_pci_address("0000:5e:00.0") && !is_pci_address("00:5e:00.0") && !is_pci_address("0x1a2b"));
    }

    #[test]
    fn a_corrupt_foreign_or_oversized_state_file_counts_as_empty_and_is_replaced() {
        let dir = temp_dir("corrupt");
        let file = dir.join(STATE_FILE);
        let devices = [("rxe0".to_owned(), None)];
        let large =
            format!(r#"{{"format":"{FORMAT}","boot_id":"b","lines":["{}"]}}"#, "x".repeat(MAX_FILE_BYTES as usize));
        let bad: [&[u8]; 6] = [
            b"{not json",
            b"\xff\xfe\x00garbage",
            br#"{"format":"something-else","boot_id":"b","lines":[]}"#,
            br#"{"format":"rdma-doctor-kernel-log-reported","boot_id":"b","lines":[1,2]}"#,
            br#"{"format":"rdma-doctor-kernel-log-reported","boot_id":"b","lines":[],"extra":1}"#,
            large.as_bytes(),
        ];
        for contents in bad {
            std::fs::write(&file, contents).unwrap();
            let mut r = Reported::load_for(&dir, Some("b"));
            assert!(r.lines.is_empty(), "{:?}", String::from_utf8_lossy(&contents[..contents.len().min(60)]));
            assert_eq!(findings(&log(&[RXE]), &devices, Some(&mut r)).len(), 1);
            let saved = read(&file).expect("replaced by a good state");
            assert_eq!((saved.boot_id.as_str(), saved.lines.as_slice()), ("b", [RXE.to_owned()].as_slice()));
        }
        // A directory where the file should be: unreadable and unwritable, a note only.
        std::fs::remove_file(&file).unwrap();
        std::fs::create_dir(&file).unwrap();
        let mut r = Reported::load_for(&dir, Some("b"));
        let found = findings(&log(&[RXE]), &devices, Some(&mut r));
        assert_eq!(found.len(), 2, "{found:#?}");
        assert_eq!(found[0].severity, Severity::Warning);
        assert!(
            found[1].severity == Severity::Note && found[1].what.contains("the next run warns again"),
            "{found:#?}"
        );
        // No boot id: nothing is kept, every run warns, nothing is written.
        std::fs::remove_dir(&file).unwrap();
        let mut r = Reported::load_for(&dir, None);
        assert_eq!(findings(&log(&[RXE]), &devices, Some(&mut r)).len(), 1);
        assert!(!file.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_state_keeps_the_newest_lines_and_their_first_bytes_only() {
        let dir = temp_dir("bound");
        let mut r = Reported::load_for(&dir, Some("b"));
        for i in 0..MAX_LINES + 10 {
            r.add(&format!("[ {i}.0] infiniband rxe0: timeout event on QP {i}"));
        }
        r.add(&format!("[ 9.9] infiniband rxe0: timeout event on QP 1 {}", "é".repeat(400)));
        r.save().unwrap();
        let r = Reported::load_for(&dir, Some("b"));
        assert_eq!(r.lines.len(), MAX_LINES);
        assert!(!r.contains("[ 0.0] infiniband rxe0: timeout event on QP 0"), "the oldest went");
        assert!(r.contains(&format!("[ {}.0] infiniband rxe0: timeout event on QP {}", MAX_LINES + 9, MAX_LINES + 9)));
        assert!(r.lines.iter().all(|l| l.len() <= MAX_LINE_BYTES));
        assert!(std::fs::metadata(dir.join(STATE_FILE)).unwrap().len() < MAX_FILE_BYTES);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_state_directory_is_the_option_else_systemds_else_var_lib() {
        assert_eq!(state_dir(Some(Path::new("/tmp/x"))), PathBuf::from("/tmp/x"));
        // The environment is the process's: read, not set, here.
        let env = std::env::var("STATE_DIRECTORY").ok().filter(|v| v.starts_with('/'));
        let want = env.map_or(PathBuf::from(DEFAULT_STATE_DIR), |v| PathBuf::from(v.split(':').next().unwrap()));
        assert_eq!(state_dir(None), want);
    }
}
