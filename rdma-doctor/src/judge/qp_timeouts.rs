//! `timeout event on QP` lines of the kernel log: a warning about the device the line
//! names (else the host), with what to check, said once per line and boot. Which lines
//! were said this boot is `Reported`, read (and written back by the diagnosis) from the
//! state directory by [`crate::facts::said`]; a state that cannot be written is a note
//! (`unsaved`: the warning will come again), never a failure of the run. A pure
//! judgment: it reads nothing.

use crate::facts::device::is_pci_address;
use crate::facts::kmsg;
use crate::facts::said::Reported;
use crate::model::layer::Layer;
use crate::model::report::{Finding, KernelLog, Severity};

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

/// What to check after a QP timeout.
pub const ADVICE: &str = "check this device's firmware and driver pair against the known-bad list \
    (the doctor flags a listed pair as `known-bad [ID]`; `--known-bad FILE` adds a site's list), \
    and the peer the QP talks to: `rdma-doctor --peer HOST` against `rdma-doctor --serve` there";

/// The findings of the QP timeouts in `log`: a warning for each line of an examined device
/// (or of no device it names) not yet reported this boot, a note for a line of another
/// device; the warned lines are recorded in `reported` (which the caller saves).
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
    out
}

/// The note when the state of what was said could not be saved (`error`).
pub(crate) fn unsaved(error: &str) -> Finding {
    Finding {
        severity: Severity::Note,
        scope: "host".into(),
        what: format!("could not record the QP timeouts warned about ({error}): the next run warns again"),
        advice: Some("give `--state-dir DIR` a directory this user can write".into()),
        source: None,
        layer: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::said::{read, saved_state, temp_dir, STATE_FILE};

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
        r.save().unwrap();
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
        r.save().unwrap();
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
        let large = saved_state("b", &"x".repeat(200 * 1024));
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
            r.save().unwrap();
            let saved = read(&file).expect("replaced by a good state");
            assert_eq!((saved.boot_id.as_str(), saved.lines.as_slice()), ("b", [RXE.to_owned()].as_slice()));
        }
        // A directory where the file should be: unreadable and unwritable, a note only.
        std::fs::remove_file(&file).unwrap();
        std::fs::create_dir(&file).unwrap();
        let mut r = Reported::load_for(&dir, Some("b"));
        let found = findings(&log(&[RXE]), &devices, Some(&mut r));
        assert_eq!((found.len(), found[0].severity), (1, Severity::Warning), "{found:#?}");
        let note = unsaved(&r.save().unwrap_err());
        assert!(note.severity == Severity::Note && note.what.contains("the next run warns again"), "{note:#?}");
        // No boot id: nothing is kept, every run warns, nothing is written.
        std::fs::remove_dir(&file).unwrap();
        let mut r = Reported::load_for(&dir, None);
        assert_eq!(findings(&log(&[RXE]), &devices, Some(&mut r)).len(), 1);
        r.save().unwrap();
        assert!(!file.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
