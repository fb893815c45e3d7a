//! The `rdma-doctor` command: a layered diagnosis of the RDMA stack of this node, its
//! version baseline, and comparisons with saved baselines and other nodes.
//!
//! ```text
//! rdma-doctor [-d NAME | --all (the default)] [-p PORT] [--json] [--save FILE] [--compare BASELINE.json]
//!             [--known-bad FILE]... [--ignore PATTERN]... [--expect-rate GBPS]
//!             [--timeout SECONDS] [--no-loopback] [--memlock-need BYTES]
//! rdma-doctor --compare-nodes A.json B.json [C.json ...] [--json] [--ignore PATTERN]...
//! rdma-doctor --serve [--peer-port PORT] [--once] [-d NAME] [-p PORT] [--timeout SECONDS]
//! rdma-doctor --peer HOST[:PORT] [--peer-port PORT] [--json] [-d NAME] [-p PORT] [--timeout SECONDS]
//! ```
//!
//! `--serve` and `--peer` check the path between two nodes end to end ([`crate::peer`]):
//! exit 0 when every check passed, 4 when one warned (an MTU mismatch, a check that passed
//! on its retry), 1 when one failed.
//!
//! Exit status (docs/doctor-json.md): 0 every layer passed and nothing drifted; 1 a
//! layer failed; 2 usage error or unreadable input; 3 drift from the baseline (or nodes
//! that differ); 4 warnings only (a known-bad firmware/driver combination).
//!
//! It changes nothing on the system; the fixes it prints are advice.
//! On a host without RDMA: `scripts/rxe cargo run -p rdma-doctor`.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::input::load_report;
use crate::saved::{check_nodes, NodesReport};
use crate::{diagnose, known_bad, render, Options, Status, EXIT_USAGE};

const AFTER_HELP: &str = "exit status: 0 healthy, 1 a layer failed, 2 usage error or unreadable input, \
3 drift, 4 warnings only. Files read are limited to 4 MiB each.";

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "rdma-doctor", version, about = "A layered diagnosis of this node's RDMA stack", after_help = AFTER_HELP)]
pub struct Args {
    /// Examine only device NAME (default: every device)
    #[arg(short = 'd', long = "ib-dev", value_name = "NAME")]
    pub device: Option<String>,
    /// Examine every device (the default; kept for scripts that say so)
    #[arg(short = 'a', long)]
    pub all: bool,
    /// Check only port N (default: every port)
    #[arg(short = 'p', long, value_name = "N")]
    pub port: Option<u8>,
    /// Print the report as JSON (docs/doctor-json.md) instead of text
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON report to FILE (a baseline for --compare)
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,
    /// Report every field that drifted from a saved report
    #[arg(long, value_name = "FILE")]
    pub compare: Option<PathBuf>,
    /// Compare saved reports of several nodes: the fields where a node differs from the
    /// others, each node's links and known-bad combinations (no local diagnosis)
    #[arg(long, value_name = "FILE", num_args = 2..)]
    pub compare_nodes: Option<Vec<PathBuf>>,
    /// Do not compare fields matching PATTERN (`devices.*.fw_ver`, `**.source`; `*` is one
    /// path segment, `**` any number)
    #[arg(long, value_name = "PATTERN")]
    pub ignore: Vec<String>,
    /// Add a known-bad list (also: RDMA_DOCTOR_KNOWN_BAD, files separated by colons)
    #[arg(long, value_name = "FILE")]
    pub known_bad: Vec<PathBuf>,
    /// The rate every port should run at (default: the saved baseline's, if any)
    #[arg(long, value_name = "GBPS")]
    pub expect_rate: Option<f64>,
    /// Longest wait for one loopback completion, seconds
    #[arg(long, value_name = "SECONDS", default_value = "5", value_parser = timeout)]
    pub timeout: Duration,
    /// Skip the loopback tests of the control and data planes and of rdma_cm
    #[arg(long)]
    pub no_loopback: bool,
    /// Probe the RDMA path to the node HOST (TCP port PORT, default 18516), where
    /// `rdma-doctor --serve` runs: GIDs, path MTU, RDMA WRITE/READ/SEND/atomics both ways
    /// with the data verified, and rdma_cm
    #[arg(long, value_name = "HOST[:PORT]", conflicts_with_all = ["serve", "compare_nodes", "compare", "save"])]
    pub peer: Option<String>,
    /// Answer `--peer` probes from other nodes until killed: up to 16 at once, each with its
    /// own QP; a client must say hello within --timeout and end within 24 timeouts
    #[arg(long, conflicts_with_all = ["compare_nodes", "compare", "save"])]
    pub serve: bool,
    /// The TCP port `--serve` listens on, and `--peer` connects to when HOST names none
    #[arg(long, value_name = "PORT", default_value_t = crate::peer::DEFAULT_PORT)]
    pub peer_port: u16,
    /// With --serve: exit after the first probe that completed its hello (status 0 when
    /// this side's checks passed)
    #[arg(long, requires = "serve")]
    pub once: bool,
    /// Locked memory programs must register (K, M, G)
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = size)]
    pub memlock_need: u64,
}

fn timeout(v: &str) -> Result<Duration, String> {
    let secs: f64 = v.parse().map_err(|_| format!("'{v}' is not a valid number"))?;
    if !(secs > 0.0 && secs < 3600.0) {
        return Err(format!("{secs}: give 0 < seconds < 3600"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `64K`, `8M`, `1G`, or bytes.
fn size(v: &str) -> Result<u64, String> {
    let (digits, shift) = match v.chars().last() {
        Some('K' | 'k') => (&v[..v.len() - 1], 10),
        Some('M' | 'm') => (&v[..v.len() - 1], 20),
        Some('G' | 'g') => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    let n: u64 = digits.parse().map_err(|_| format!("'{v}' is not a valid size"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("{v} is too large"))
}

impl Args {
    /// The options of a diagnosis; reads the `--compare` file (the only input error here).
    fn options(&self) -> Result<Options, String> {
        Ok(Options {
            device: self.device.clone(),
            all: self.all,
            port: self.port,
            loopback: !self.no_loopback,
            timeout: self.timeout,
            memlock_need: self.memlock_need,
            known_bad_files: self.known_bad_files(),
            compare: self.compare.as_deref().map(load_report).transpose()?,
            compare_file: self.compare.clone(),
            ignore: self.ignore.clone(),
            expected_rate: self.expect_rate,
            ..Options::default()
        })
    }

    fn peer_options(&self) -> crate::peer::PeerOptions {
        crate::peer::PeerOptions {
            device: self.device.clone(),
            port: self.port,
            timeout: self.timeout,
            tcp_port: self.peer_port,
        }
    }

    /// `--known-bad` files, then those of `RDMA_DOCTOR_KNOWN_BAD`.
    fn known_bad_files(&self) -> Vec<PathBuf> {
        let mut files = self.known_bad.clone();
        if let Ok(list) = std::env::var("RDMA_DOCTOR_KNOWN_BAD") {
            files.extend(list.split(':').filter(|p| !p.is_empty()).map(PathBuf::from));
        }
        files
    }
}

/// Runs the command with `args` (the program name first), printing to `out` and `err`;
/// returns the exit status.
pub fn run(
    args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let args = match Args::try_parse_from(args) {
        Ok(a) => a,
        Err(e) if e.use_stderr() => {
            let _ = write!(err, "{}", e.render());
            return EXIT_USAGE;
        }
        Err(e) => {
            // --help, --version.
            let _ = write!(out, "{}", e.render());
            return 0;
        }
    };
    let result = match (&args.compare_nodes, &args.peer) {
        (Some(files), _) => nodes(&args, files, out),
        (None, Some(peer)) => probe_peer(&args, peer, out),
        (None, None) if args.serve => {
            crate::peer::serve(args.peer_port, args.once, &args.peer_options(), err).map_err(|e| e.to_string())
        }
        (None, None) => diagnose_here(&args, out),
    };
    result.unwrap_or_else(|e| {
        let _ = writeln!(err, "rdma-doctor: {e}");
        EXIT_USAGE
    })
}

fn probe_peer(args: &Args, peer: &str, out: &mut dyn Write) -> Result<i32, String> {
    let report = crate::peer::probe(peer, &args.peer_options());
    let text = if args.json { report.to_json() + "\n" } else { report.to_text() };
    out.write_all(text.as_bytes()).map_err(|e| format!("writing the report: {e}"))?;
    Ok(report.exit_code())
}

fn diagnose_here(args: &Args, out: &mut dyn Write) -> Result<i32, String> {
    let report = diagnose(&args.options()?)?;
    if let Some(path) = &args.save {
        std::fs::write(path, report.to_json() + "\n").map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    let text = if args.json { report.to_json() + "\n" } else { render(&report) };
    out.write_all(text.as_bytes()).map_err(|e| format!("writing the report: {e}"))?;
    Ok(report.exit_code)
}

fn nodes(args: &Args, files: &[PathBuf], out: &mut dyn Write) -> Result<i32, String> {
    let entries = known_bad::load(&args.known_bad_files())?;
    let mut reports = Vec::new();
    for f in files {
        reports.push((f.display().to_string(), load_report(f)?));
    }
    // Host names label the nodes unless two reports share one.
    let host = |r: &crate::Report| r.host.hostname.clone();
    let unique = reports
        .iter()
        .all(|(_, r)| !host(r).is_empty() && reports.iter().filter(|(_, o)| host(o) == host(r)).count() == 1);
    let labelled: Vec<(String, String, crate::Report)> =
        reports.into_iter().map(|(f, r)| (if unique { host(&r) } else { f.clone() }, f, r)).collect();
    let report = check_nodes(&labelled, &entries, &args.ignore);
    let text = if args.json { report.to_json() + "\n" } else { nodes_text(&report) };
    out.write_all(text.as_bytes()).map_err(|e| format!("writing the comparison: {e}"))?;
    Ok(report.exit_code)
}

/// The comparison for a person: the differing fields, failed links, findings, result.
fn nodes_text(r: &NodesReport) -> String {
    let mut s = crate::compare::nodes_text(&r.differences, r.nodes.len());
    for l in r.layers.iter().filter(|l| l.outcome == crate::Outcome::Fail) {
        s += &format!("FAIL  {} {}: {}\n", l.scope, l.layer.name(), l.summary);
        l.evidence.iter().for_each(|e| s += &format!("        evidence: {e}\n"));
        l.fix.iter().for_each(|f| s += &format!("        fix (advice, not run): {f}\n"));
    }
    for f in &r.findings {
        s += &format!("warning [{}] {}\n", f.scope, f.what);
        f.advice.iter().for_each(|a| s += &format!("        advice (not run): {a}\n"));
        f.source.iter().for_each(|src| s += &format!("        source: {src}\n"));
    }
    let failed = r.layers.iter().filter(|l| l.outcome == crate::Outcome::Fail).count();
    let why = match r.status {
        Status::LayerFailed => format!("the link failed on {failed} device(s)"),
        Status::Drift => format!("the nodes differ in {} field(s)", r.differences.len()),
        Status::Warnings => "the nodes agree, with warnings".to_owned(),
        Status::Healthy => "the nodes agree and every link is up".to_owned(),
    };
    let warnings = match r.findings.len() {
        0 => String::new(),
        n => format!(", {n} warning(s)"),
    };
    s += &format!("Result: {why}{warnings} (exit {})\n", r.exit_code);
    s
}

/// The `main` of the command (and of `cargo run --example doctor`).
pub fn main() -> ExitCode {
    // libibverbs names a device no provider claims only with IBV_SHOW_WARNINGS set; the
    // doctor captures that text (see `diagnose`). Set here, at the start of `main`, while
    // the process has one thread and before libibverbs reads its environment.
    if std::env::var_os("IBV_SHOW_WARNINGS").is_none() {
        std::env::set_var("IBV_SHOW_WARNINGS", "1");
    }
    let code = run(std::env::args_os(), &mut std::io::stdout().lock(), &mut std::io::stderr().lock());
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
