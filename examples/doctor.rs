//! `doctor`: a layered diagnosis of the RDMA stack of this node, its version baseline,
//! and comparisons with saved baselines and other nodes (`rdma_verbs::diag`).
//!
//! ```text
//! doctor [-d NAME | --all] [-p PORT] [--json] [--save FILE] [--compare BASELINE.json]
//!        [--known-bad FILE]... [--ignore PATTERN]... [--expect-rate GBPS]
//!        [--timeout SECONDS] [--no-loopback] [--memlock-need BYTES]
//! doctor --compare-nodes A.json B.json [C.json ...] [--ignore PATTERN]...
//! ```
//!
//! Exit status (docs/doctor-json.md): 0 every layer passed and nothing drifted; 1 a
//! layer failed; 2 usage error or unreadable input; 3 drift from the baseline (or nodes
//! that differ); 4 warnings only (a known-bad firmware/driver combination).
//!
//! It changes nothing on the system; the fixes it prints are advice.
//! On a host without RDMA: `scripts/rxe cargo run --example doctor`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use rdma_verbs::diag::{self, compare, Options, EXIT_USAGE};

const USAGE: &str = "usage: doctor [OPTIONS]
  -d, --ib-dev NAME       examine device NAME (default: the first device)
  -a, --all               examine every device
  -p, --port N            check only port N (default: every port)
      --json              print the report as JSON (docs/doctor-json.md) instead of text
      --save FILE         also write the JSON report to FILE (a baseline for --compare)
      --compare FILE      report every field that drifted from a saved report
      --compare-nodes A B [C ...]
                          compare saved reports of several nodes: name the fields where
                          a node differs from the others (no local diagnosis)
      --ignore PATTERN    do not compare fields matching PATTERN (`devices.*.fw_ver`,
                          `**.source`; `*` is one path segment, `**` any number)
      --known-bad FILE    add a known-bad list (also: RDMA_DOCTOR_KNOWN_BAD=FILE[:FILE])
      --expect-rate GBPS  the rate every port should run at (default: the saved
                          baseline's, if any)
      --timeout SECONDS   longest wait for one loopback completion (default 5)
      --no-loopback       skip the loopback test of the control and data planes
      --memlock-need SIZE locked memory programs must register (default 1M; K, M, G)
  -h, --help              print this help
exit status: 0 healthy, 1 a layer failed, 2 usage error, 3 drift, 4 warnings only";

enum Mode {
    Diagnose { opts: Options, json: bool, save: Option<PathBuf> },
    CompareNodes { files: Vec<PathBuf>, ignore: Vec<String> },
    Help,
}

fn parse_args(args: Vec<String>) -> Result<Mode, String> {
    let mut opts = Options::default();
    let (mut json, mut save, mut compare, mut nodes) = (false, None, None, None::<Vec<PathBuf>>);
    let mut it = args.into_iter().peekable();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let mut value = |what: &str| -> Result<String, String> {
            inline.clone().or_else(|| it.next()).ok_or_else(|| format!("{flag} needs {what}"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Mode::Help),
            "-d" | "--ib-dev" => opts.device = Some(value("a device name")?),
            "-a" | "--all" => opts.all = true,
            "-p" | "--port" => opts.port = Some(number(&value("a port number")?, "--port")?),
            "--json" => json = true,
            "--save" => save = Some(PathBuf::from(value("a file")?)),
            "--compare" => compare = Some(PathBuf::from(value("a baseline file")?)),
            "--ignore" => opts.ignore.push(value("a field pattern")?),
            "--known-bad" => opts.known_bad_files.push(PathBuf::from(value("a file")?)),
            "--expect-rate" => opts.expected_rate = Some(number(&value("a rate in Gb/s")?, "--expect-rate")?),
            "--timeout" => {
                let secs: f64 = number(&value("seconds")?, "--timeout")?;
                if !(secs > 0.0 && secs < 3600.0) {
                    return Err(format!("--timeout {secs}: give 0 < seconds < 3600"));
                }
                opts.timeout = Duration::from_secs_f64(secs);
            }
            "--no-loopback" => opts.loopback = false,
            "--memlock-need" => opts.memlock_need = size(&value("a size")?)?,
            "--compare-nodes" => {
                let mut files = Vec::new();
                while let Some(next) = it.next_if(|a| !a.starts_with('-')) {
                    files.push(PathBuf::from(next));
                }
                nodes = Some(files);
            }
            _ => return Err(format!("unknown argument '{arg}'")),
        }
    }
    if let Some(files) = nodes {
        if files.len() < 2 {
            return Err("--compare-nodes needs at least two report files".into());
        }
        return Ok(Mode::CompareNodes { files, ignore: opts.ignore });
    }
    if let Ok(list) = std::env::var("RDMA_DOCTOR_KNOWN_BAD") {
        opts.known_bad_files.extend(list.split(':').filter(|p| !p.is_empty()).map(PathBuf::from));
    }
    if let Some(path) = compare {
        opts.compare = Some(read_report(&path)?);
    }
    Ok(Mode::Diagnose { opts, json, save })
}

fn number<T: std::str::FromStr>(v: &str, flag: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("{flag}: '{v}' is not a valid number"))
}

/// `64K`, `8M`, `1G`, or bytes.
fn size(v: &str) -> Result<u64, String> {
    let (digits, shift) = match v.chars().last() {
        Some('K' | 'k') => (&v[..v.len() - 1], 10),
        Some('M' | 'm') => (&v[..v.len() - 1], 20),
        Some('G' | 'g') => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    let n: u64 = number(digits, "--memlock-need")?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("--memlock-need {v} is too large"))
}

fn read_report(path: &PathBuf) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    compare::baseline_of(&v).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(v)
}

fn compare_nodes(files: &[PathBuf], ignore: &[String]) -> Result<i32, String> {
    let mut nodes = Vec::new();
    for f in files {
        let v = read_report(f)?;
        let host = v.pointer("/host/hostname").and_then(|h| h.as_str()).unwrap_or("").to_owned();
        nodes.push((host, f.display().to_string(), compare::baseline_of(&v)?.clone()));
    }
    // Host names label the nodes unless two reports share one.
    let unique = nodes.iter().all(|(h, _, _)| !h.is_empty() && nodes.iter().filter(|(o, _, _)| o == h).count() == 1);
    let labelled: Vec<(String, serde_json::Value)> =
        nodes.into_iter().map(|(h, f, b)| (if unique { h } else { f }, b)).collect();
    let mut patterns: Vec<String> = compare::NODES_IGNORE.iter().map(|s| s.to_string()).collect();
    patterns.extend(ignore.iter().cloned());
    let diffs = compare::compare_nodes(&labelled, &patterns);
    print!("{}", compare::nodes_text(&diffs, labelled.len()));
    Ok(if diffs.is_empty() { 0 } else { diag::Status::Drift.exit_code() })
}

fn main() -> ExitCode {
    let code = match parse_args(std::env::args().skip(1).collect()) {
        Err(e) => {
            eprintln!("doctor: {e}\n{USAGE}");
            EXIT_USAGE
        }
        Ok(Mode::Help) => {
            println!("{USAGE}");
            0
        }
        Ok(Mode::CompareNodes { files, ignore }) => compare_nodes(&files, &ignore).unwrap_or_else(|e| {
            eprintln!("doctor: {e}");
            EXIT_USAGE
        }),
        Ok(Mode::Diagnose { opts, json, save }) => match diag::diagnose(&opts) {
            Err(e) => {
                eprintln!("doctor: {e}");
                EXIT_USAGE
            }
            Ok(report) => {
                if let Some(path) = save {
                    if let Err(e) = std::fs::write(&path, report.to_json() + "\n") {
                        eprintln!("doctor: writing {}: {e}", path.display());
                        return ExitCode::from(EXIT_USAGE as u8);
                    }
                }
                if json {
                    println!("{}", report.to_json());
                } else {
                    print!("{}", diag::render(&report));
                }
                report.exit_code
            }
        },
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
