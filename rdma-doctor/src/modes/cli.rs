//! The `rdma-doctor` command: a layered diagnosis of the RDMA stack of this node, its
//! version baseline, and comparisons with saved baselines and other nodes.
//!
//! ```text
//! rdma-doctor [-d NAME | --all (the default)] [-p PORT] [--json] [--save FILE] [--compare BASELINE.json]
//!             [--known-bad FILE]... [--ignore PATTERN]... [--expect-rate GBPS]
//!             [--timeout SECONDS] [--no-loopback] [--memlock-need BYTES] [--prometheus] [--state-dir DIR]
//! rdma-doctor --compare-nodes A.json B.json [C.json ...] [--json] [--ignore PATTERN]...
//! rdma-doctor --serve [--peer-port PORT] [--once] [--metrics-port PORT] [-d NAME] [-p PORT] [--timeout SECONDS]
//!             [--listen ADDRESS] [--allow CIDR]... [--secret-file FILE]
//! rdma-doctor --peer HOST[:PORT] [--peer-port PORT] [--json] [-d NAME] [-p PORT] [--timeout SECONDS] [--secret-file FILE]
//! rdma-doctor --fleet HOST[:PORT]... | --fleet-file FILE [--mesh | --no-probe] [--parallel N] [--timeout SECONDS] [--secret-file FILE]
//!             [--json] [--save FILE] [--compare FLEET.json|NODE.json] [--known-bad FILE]... [--ignore PATTERN]...
//! rdma-doctor --watch [SECONDS] [--json] [-d NAME] [-p PORT]
//! ```
//!
//! `--fleet` gathers every node's report from its `--serve`, prints the fleet's table with
//! what differs and the links probed between neighbours ([`crate::modes::fleet`]).
//!
//! `--watch` prints a line per event or change until Ctrl-C or SIGTERM ([`crate::modes::watch`]),
//! then exits 0.
//!
//! `--serve` and `--peer` check the path between two nodes end to end ([`crate::modes::peer`]):
//! exit 0 when every check passed, 4 when one warned (an MTU mismatch, a check that passed
//! on its retry), 1 when one failed.
//!
//! `--prometheus` prints the diagnosis as metrics, and `--serve --metrics-port PORT`
//! answers `GET /metrics` with them ([`crate::modes::metrics`]). `--serve` diagnoses again for the
//! requests it gets ([`crate::modes::fresh`]); `--listen`, `--allow` and `--secret-file` say who
//! may ask ([`crate::modes::gate`]).
//!
//! Exit status (docs/doctor-json.md): 0 every layer passed and nothing drifted; 1 a
//! layer failed; 2 usage error (a flag the chosen mode would ignore, a rate that is not a
//! finite number above 0, port 0) or unreadable input (a file read within 10 s); 3 drift from the baseline (or nodes
//! that differ); 4 warnings only (a known-bad firmware/driver combination).
//!
//! It changes nothing on the system but its own state (the `timeout event on QP` lines it
//! warned about, so that each is said once per boot: `--state-dir`, [`crate::judge::qp_timeouts`]);
//! the fixes it prints are advice.
//! On a host without RDMA: `scripts/rxe cargo run -p rdma-doctor`.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::judge::known_bad;
use crate::judge::saved::{check_nodes, NodesReport};
use crate::model::input::load_report;
use crate::model::report::{Status, EXIT_USAGE};
use crate::modes::text::render;
use crate::{diagnose, Options};

const AFTER_HELP: &str = "exit status: 0 healthy, 1 a layer failed, 2 usage error (a flag the mode \
ignores included) or unreadable input, 3 drift, 4 warnings only. Files read are limited to 4 MiB and \
10 s each. Each port's rate is judged by the rule for its kind (rxe: the kernel's mapping of its \
netdev's speed; a bond: the sum of its legs; hardware: its supported modes), named in the verdict.";

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "rdma-doctor", version, about = "A layered diagnosis of this node's RDMA stack", after_help = AFTER_HELP)]
// A flag that the chosen mode would ignore is refused (a usage error), not dropped.
#[command(group(clap::ArgGroup::new("remote").args(["peer", "serve"]).multiple(false)))]
#[command(group(clap::ArgGroup::new("fleet_mode").args(["fleet", "fleet_file"]).multiple(true)))]
#[command(group(clap::ArgGroup::new("ported").args(["peer", "serve", "fleet", "fleet_file"]).multiple(true)))]
pub struct Args {
    /// Examine only device NAME (default: every device)
    #[arg(short = 'd', long = "ib-dev", value_name = "NAME", conflicts_with = "compare_nodes")]
    pub device: Option<String>,
    /// Examine every device (the default; kept for scripts that say so)
    #[arg(short = 'a', long, conflicts_with_all = ["compare_nodes", "peer", "serve"])]
    pub all: bool,
    /// Check only port N (default: every port)
    #[arg(short = 'p', long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..), conflicts_with = "compare_nodes")]
    pub port: Option<u8>,
    /// Print the report as JSON (docs/doctor-json.md) instead of text
    #[arg(long, conflicts_with = "serve")]
    pub json: bool,
    /// Print the diagnosis as Prometheus metrics (its text exposition format) instead of
    /// text: counters, each layer's verdict, the versions, the known-bad flag, link rates
    #[arg(long, conflicts_with_all = ["json", "serve", "peer", "compare_nodes"])]
    pub prometheus: bool,
    /// With --serve: also answer HTTP `GET /metrics` on TCP port PORT (a diagnosis at most
    /// 2 s old whose ports are as they are now, with the counters read at each scrape;
    /// --listen and --allow apply, --secret-file does not)
    #[arg(long, value_name = "PORT", requires = "serve")]
    pub metrics_port: Option<u16>,
    /// With --serve: listen on this address only (default: every address), for the probes
    /// and the metrics
    #[arg(long, value_name = "ADDRESS", requires = "serve")]
    pub listen: Option<std::net::IpAddr>,
    /// With --serve: admit only clients from CIDR (`10.0.0.0/8`, or one address; repeat
    /// for more), checked before a byte is read; a fleet's probe request may name only a
    /// node it admits (default: every address)
    #[arg(long, value_name = "CIDR", requires = "serve")]
    pub allow: Vec<String>,
    /// The shared secret (a file only its owner can read, at least 16 bytes): --serve asks
    /// each client to prove it, --fleet and --peer prove it (an HMAC over a challenge)
    #[arg(long, value_name = "FILE", requires = "ported")]
    pub secret_file: Option<PathBuf>,
    /// Also write the JSON report to FILE (a baseline for --compare; with --fleet, the
    /// fleet's report)
    #[arg(long, value_name = "FILE", conflicts_with = "compare_nodes")]
    pub save: Option<PathBuf>,
    /// Report every field that drifted from a saved report (read within 10 s: a pipe that
    /// never ends is refused); with --fleet, a saved fleet report (each node against its
    /// own row) or one node's report (every node against it)
    #[arg(long, value_name = "FILE", conflicts_with = "compare_nodes")]
    pub compare: Option<PathBuf>,
    /// Compare saved reports of several nodes: the fields where a node differs from the
    /// others, each node's links and known-bad combinations (no local diagnosis)
    #[arg(long, value_name = "FILE", num_args = 2..)]
    pub compare_nodes: Option<Vec<PathBuf>>,
    /// Do not compare fields matching PATTERN (`devices.*.fw_ver`, `**.source`; `*` is one
    /// path segment, `**` any number)
    #[arg(long, value_name = "PATTERN", conflicts_with_all = ["peer", "serve"])]
    pub ignore: Vec<String>,
    /// Add a known-bad list (also: RDMA_DOCTOR_KNOWN_BAD, files separated by colons)
    #[arg(long, value_name = "FILE", conflicts_with_all = ["peer", "serve"])]
    pub known_bad: Vec<PathBuf>,
    /// The rate every port should run at (default: the saved baseline's, if any, else the
    /// rule for the device's kind: see the link layer in docs/doctor-json.md)
    #[arg(long, value_name = "GBPS", value_parser = rate, conflicts_with_all = ["compare_nodes", "peer", "serve"])]
    pub expect_rate: Option<f64>,
    /// Longest wait for one loopback completion, seconds; with --fleet, the time each node
    /// has to answer, and the timeout of the probes between them
    #[arg(long, value_name = "SECONDS", default_value = "5", value_parser = timeout, conflicts_with = "compare_nodes")]
    pub timeout: Duration,
    /// Skip the loopback tests of the control and data planes and of rdma_cm
    #[arg(long, conflicts_with_all = ["compare_nodes", "peer", "serve"])]
    pub no_loopback: bool,
    /// Probe the RDMA path to the node HOST (TCP port PORT, default 18516), where
    /// `rdma-doctor --serve` runs: GIDs, path MTU, RDMA WRITE/READ/SEND/atomics both ways
    /// with the data verified, and rdma_cm
    #[arg(long, value_name = "HOST[:PORT]", conflicts_with_all = ["serve", "compare_nodes", "compare", "save"])]
    pub peer: Option<String>,
    /// Answer `--peer` probes from other nodes until killed: up to 16 at once, each with its
    /// own QP; a client must say hello within --timeout and end within 24 timeouts. A
    /// `--fleet` collector gets this node's report (diagnosed for the request, or at most
    /// 2 s before it with every port as it is now) and has it probe another node
    #[arg(long, conflicts_with_all = ["compare_nodes", "compare", "save"])]
    pub serve: bool,
    /// The TCP port `--serve` listens on, and `--peer` and `--fleet` connect to when HOST
    /// names none
    #[arg(long, value_name = "PORT", default_value_t = crate::modes::peer::DEFAULT_PORT, requires = "ported")]
    pub peer_port: u16,
    /// With --serve: exit after the first probe that completed its hello (status 0 when
    /// this side's checks passed)
    #[arg(long, requires = "serve")]
    pub once: bool,
    /// Ask the nodes HOST or HOST:PORT (each running `rdma-doctor --serve`) for their reports,
    /// each within --timeout, and tabulate kernel, rdma-core, provider, driver, firmware,
    /// device, port state, rate and MTU, marking what differs from the majority (or from
    /// --compare's baseline) and known-bad combinations; then have each node probe the
    /// path to the next (a ring); a node that gives no usable answer is named in its row
    #[arg(long, value_name = "HOST[:PORT]", num_args = 1.., conflicts_with_all = FLEET_IGNORES)]
    pub fleet: Vec<String>,
    /// Read --fleet's hosts from FILE: one HOST or HOST:PORT a line, `#` starts a comment
    #[arg(long, value_name = "FILE", conflicts_with_all = FLEET_IGNORES)]
    pub fleet_file: Option<PathBuf>,
    /// With --fleet: probe the path between every pair of nodes, not a ring (in rounds
    /// where each node takes part in one probe at a time)
    #[arg(long, requires = "fleet_mode")]
    pub mesh: bool,
    /// With --fleet: the table only, no path probes
    #[arg(long, requires = "fleet_mode", conflicts_with = "mesh")]
    pub no_probe: bool,
    /// With --fleet: nodes asked at once (reports, and probes within a round)
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=256), requires = "fleet_mode")]
    pub parallel: u16,
    /// Watch the devices until Ctrl-C or SIGTERM, reading counters every SECONDS (default 1,
    /// 0.1 to 3600): a line per async event, link state or rate change, and counter class
    /// that moved or passed its rate threshold, worst first; with --json one JSON object a line
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "1",
          value_parser = crate::modes::watch::parse_interval,
          conflicts_with_all = ["compare_nodes", "peer", "serve", "prometheus", "save", "compare", "known_bad",
                                "ignore", "expect_rate", "no_loopback", "timeout", "memlock_need", "fleet", "fleet_file"])]
    pub watch: Option<Duration>,
    /// Slurm's HealthCheckProgram (through a wrapper, as it takes no arguments): diagnose
    /// this node, and with --peer the path to HOST, then drain the node in Slurm
    /// (`scontrol`) with the failed layer and its cause as the reason, or resume it when
    /// it is healthy and rdma-doctor drained it (never a node drained for another reason)
    #[arg(long, conflicts_with_all = ["serve", "fleet", "fleet_file", "compare_nodes", "watch", "prometheus", "json", "save"])]
    pub health_check: bool,
    /// With --health-check: the node's name in Slurm (default: this host's short name)
    #[arg(long, value_name = "NAME", requires = "health_check")]
    pub slurm_node: Option<String>,
    /// Where to record the `timeout event on QP` kernel-log lines warned about, so that a
    /// later run of the same boot does not warn about them again (default:
    /// $STATE_DIRECTORY, else /var/lib/rdma-doctor; a directory that cannot be written
    /// only means the warning comes again)
    #[arg(long, value_name = "DIR", conflicts_with_all = ["compare_nodes", "peer", "serve", "watch", "fleet", "fleet_file"])]
    pub state_dir: Option<PathBuf>,
    /// Locked memory programs must register (K, M, G)
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = size, conflicts_with_all = ["compare_nodes", "peer", "serve"])]
    pub memlock_need: u64,
}

/// The flags `--fleet` has no use for (it diagnoses no device here).
const FLEET_IGNORES: [&str; 10] = [
    "serve",
    "peer",
    "compare_nodes",
    "device",
    "all",
    "port",
    "prometheus",
    "expect_rate",
    "no_loopback",
    "memlock_need",
];

fn timeout(v: &str) -> Result<Duration, String> {
    let secs: f64 = v.parse().map_err(|_| format!("'{v}' is not a valid number"))?;
    if !(secs > 0.0 && secs < 3600.0) {
        return Err(format!("{secs}: give 0 < seconds < 3600"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A rate in Gb/s: a finite number above 0.
fn rate(v: &str) -> Result<f64, String> {
    let gbps: f64 = v.parse().map_err(|_| format!("'{v}' is not a valid number"))?;
    if !(gbps.is_finite() && gbps > 0.0) {
        return Err(format!("{v}: give a rate in Gb/s above 0"));
    }
    Ok(gbps)
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
            state_dir: Some(crate::facts::said::state_dir(self.state_dir.as_deref())),
            ..Options::default()
        })
    }

    /// The options of a probe or a server; reads the `--secret-file`.
    fn peer_options(&self) -> Result<crate::modes::peer::PeerOptions, String> {
        Ok(crate::modes::peer::PeerOptions {
            device: self.device.clone(),
            port: self.port,
            timeout: self.timeout,
            tcp_port: self.peer_port,
            secret: self.secret()?,
        })
    }

    fn secret(&self) -> Result<Option<crate::modes::gate::Secret>, String> {
        self.secret_file.as_deref().map(crate::modes::gate::Secret::load).transpose()
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
        _ if args.health_check => health(&args, out),
        _ if !args.fleet.is_empty() || args.fleet_file.is_some() => fleet(&args, out),
        (Some(files), _) => nodes(&args, files, out),
        (None, Some(peer)) => probe_peer(&args, peer, out),
        (None, None) if args.serve => serve(&args, err),
        (None, None) if args.watch.is_some() => Ok(watch(&args, out, err)),
        (None, None) => diagnose_here(&args, out),
    };
    result.unwrap_or_else(|e| {
        let _ = writeln!(err, "rdma-doctor: {e}");
        EXIT_USAGE
    })
}

fn health(args: &Args, out: &mut dyn Write) -> Result<i32, String> {
    let peer_opts = args.peer_options()?;
    let peer = args.peer.as_deref().map(|host| (host, &peer_opts));
    crate::modes::health::run(&args.options()?, peer, args.slurm_node.as_deref(), out)
}

fn probe_peer(args: &Args, peer: &str, out: &mut dyn Write) -> Result<i32, String> {
    let report = crate::modes::peer::probe(peer, &args.peer_options()?);
    let text = if args.json { report.to_json() + "\n" } else { report.to_text() };
    out.write_all(text.as_bytes()).map_err(|e| format!("writing the report: {e}"))?;
    Ok(report.exit_code())
}

fn fleet(args: &Args, out: &mut dyn Write) -> Result<i32, String> {
    let mut hosts = args.fleet.clone();
    if let Some(f) = &args.fleet_file {
        let text = crate::model::input::read_limited(f)?;
        hosts.extend(crate::modes::fleet::parse_hosts_file(&text).map_err(|e| format!("{}: {e}", f.display()))?);
    }
    let opts = crate::modes::fleet::FleetOptions {
        hosts,
        default_port: args.peer_port,
        timeout: args.timeout,
        parallel: usize::from(args.parallel),
        mesh: args.mesh,
        probe: !args.no_probe,
        known_bad: known_bad::load(&args.known_bad_files())?,
        ignore: args.ignore.clone(),
        reference: args.compare.as_deref().map(crate::modes::fleet::load_reference).transpose()?,
        secret: args.secret()?,
    };
    let report = crate::modes::fleet::run(&opts)?;
    if let Some(path) = &args.save {
        std::fs::write(path, report.to_json() + "\n").map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    let text = if args.json { report.to_json() + "\n" } else { crate::modes::fleet::to_text(&report) };
    out.write_all(text.as_bytes()).map_err(|e| format!("writing the fleet's report: {e}"))?;
    Ok(report.exit_code)
}

fn diagnose_here(args: &Args, out: &mut dyn Write) -> Result<i32, String> {
    let report = diagnose(&args.options()?)?;
    if let Some(path) = &args.save {
        std::fs::write(path, report.to_json() + "\n").map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    let text = if args.prometheus {
        crate::modes::metrics::encode_report(&report, &report.observations.counters, Duration::ZERO)
    } else if args.json {
        report.to_json() + "\n"
    } else {
        render(&report)
    };
    out.write_all(text.as_bytes()).map_err(|e| format!("writing the report: {e}"))?;
    Ok(report.exit_code)
}

/// `--serve`, and with `--metrics-port` the metrics endpoint on a thread of its own. The
/// first diagnosis runs before either starts, the others as requests need them
/// ([`crate::modes::fresh`]), one at a time.
fn serve(args: &Args, err: &mut dyn Write) -> Result<i32, String> {
    let opts = args.peer_options()?;
    let door = crate::modes::peer::ServeOptions {
        listen: args.listen.unwrap_or(crate::modes::peer::ServeOptions::default().listen),
        allow: crate::modes::gate::AllowList::parse(&args.allow)?,
    };
    // Every report it serves names the QP timeouts it read: no once-per-boot state.
    let served = Options { state_dir: None, ..args.options()? };
    let reports = std::sync::Arc::new(crate::modes::fresh::Reports::diagnosing(served)?);
    if let Some(port) = args.metrics_port {
        let at = std::net::SocketAddr::new(door.listen, port);
        let listener =
            std::net::TcpListener::bind(at).map_err(|e| format!("listening for metrics on TCP {at}: {e}"))?;
        let _ = writeln!(err, "rdma-doctor: metrics at http://{at}/metrics to {}", door.allow);
        let (reports, allow) = (std::sync::Arc::clone(&reports), door.allow.clone());
        std::thread::spawn(move || {
            let e = crate::modes::metrics::serve(listener, &allow, move || {
                let fresh = reports.get()?;
                let devices: Vec<String> = fresh.report.baseline.devices.keys().cloned().collect();
                Ok(crate::modes::metrics::encode_report(
                    &fresh.report,
                    &crate::facts::counters::sample(&devices),
                    fresh.age,
                ))
            });
            eprintln!("rdma-doctor: the metrics endpoint stopped: {e}");
        });
    }
    crate::modes::peer::serve(&door, args.once, &opts, Some(reports), err)
}

/// `--watch`: 0 after Ctrl-C or SIGTERM; 1 (with the reason) when there is nothing to
/// watch or the output failed.
fn watch(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let opts = crate::modes::watch::WatchOptions {
        device: args.device.clone(),
        port: args.port,
        json: args.json,
        ..crate::modes::watch::WatchOptions::new(args.watch.unwrap_or(Duration::from_secs(1)))
    };
    crate::modes::watch::run(opts, out).unwrap_or_else(|e| {
        let _ = writeln!(err, "rdma-doctor: {e}");
        1
    })
}

fn nodes(args: &Args, files: &[PathBuf], out: &mut dyn Write) -> Result<i32, String> {
    let entries = known_bad::load(&args.known_bad_files())?;
    let mut reports = Vec::new();
    for f in files {
        reports.push((f.display().to_string(), load_report(f)?));
    }
    // Host names label the nodes unless two reports share one.
    let host = |r: &crate::model::report::Report| r.host.hostname.clone();
    let unique = reports
        .iter()
        .all(|(_, r)| !host(r).is_empty() && reports.iter().filter(|(_, o)| host(o) == host(r)).count() == 1);
    let labelled: Vec<(String, String, crate::model::report::Report)> =
        reports.into_iter().map(|(f, r)| (if unique { host(&r) } else { f.clone() }, f, r)).collect();
    let report = check_nodes(&labelled, &entries, &args.ignore);
    let text = if args.json { report.to_json() + "\n" } else { nodes_text(&report) };
    out.write_all(text.as_bytes()).map_err(|e| format!("writing the comparison: {e}"))?;
    Ok(report.exit_code)
}

/// The comparison for a person, worst first: failed links, warnings, then the differing
/// fields, and the result.
fn nodes_text(r: &NodesReport) -> String {
    let mut s = String::new();
    for l in r.layers.iter().filter(|l| l.outcome == crate::Outcome::Fail) {
        s += &format!("FAIL  {} {}: {}\n", l.scope, l.layer.name(), l.summary);
        l.evidence.iter().for_each(|e| s += &format!("        evidence: {e}\n"));
        let label = if l.command_is_check { "check" } else { "fix" };
        l.fix.iter().for_each(|f| s += &format!("        {label} (advice, not run): {f}\n"));
    }
    for f in &r.findings {
        s += &format!("warning [{}] {}\n", f.scope, f.what);
        f.advice.iter().for_each(|a| s += &format!("        advice (not run): {a}\n"));
        f.source.iter().for_each(|src| s += &format!("        source: {src}\n"));
    }
    s += &crate::judge::compare::nodes_text(&r.differences, r.nodes.len());
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
