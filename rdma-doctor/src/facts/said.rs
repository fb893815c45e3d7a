//! What the doctor said this boot: the QP timeout lines of the kernel log it has warned
//! about ([`crate::judge::qp_timeouts`]), kept in a small file of the state directory
//! (`--state-dir`, default `$STATE_DIRECTORY`, else [`DEFAULT_STATE_DIR`]), keyed by the
//! boot id: a later run of the same boot stays quiet about them, the first run after a
//! reboot starts afresh. A state file that is missing, unreadable, corrupt, too large or of
//! another boot counts as empty; writing it is the diagnosis' last step.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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
pub(crate) struct Saved {
    format: String,
    pub(crate) boot_id: String,
    pub(crate) lines: Vec<String>,
}

/// The lines already warned about in this boot, read from the state directory.
#[derive(Debug)]
pub(crate) struct Reported {
    file: PathBuf,
    /// None: the boot is unknown, so nothing counts as reported and nothing is saved.
    boot_id: Option<String>,
    pub(crate) lines: Vec<String>,
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
    pub(crate) fn load_for(dir: &Path, boot_id: Option<&str>) -> Reported {
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
pub(crate) fn read(file: &Path) -> Option<Saved> {
    let f = std::fs::File::open(file).ok()?;
    let mut text = String::new();
    f.take(MAX_FILE_BYTES + 1).read_to_string(&mut text).ok()?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return None;
    }
    let saved: Saved = serde_json::from_str(&text).ok()?;
    (saved.format == FORMAT).then_some(saved)
}

#[cfg(test)]
pub(crate) fn saved_state(boot_id: &str, line: &str) -> String {
    format!(r#"{{"format":"{FORMAT}","boot_id":"{boot_id}","lines":["{line}"]}}"#)
}

/// A fresh, empty directory of this process for a test named `name`.
#[cfg(test)]
pub(crate) fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rdma-doctor-said-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[cfg(test)]
mod tests {
    use super::*;

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
