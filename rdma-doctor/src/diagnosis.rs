//! One node's diagnosis: the facts read from it, then the judgments over them, layer by
//! layer ([`diagnose`]).

use crate::facts::collect;
use crate::facts::counters;
use crate::facts::device;
use crate::facts::kmsg;
use crate::facts::loopback::LoopbackReport;
use crate::facts::provider;
use crate::judge::compare;
use crate::judge::verdict;
use crate::model::layer::Layer;
use crate::model::report;
use crate::model::report::Status;
use crate::model::report::FORMAT_VERSION;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::facts::{loopback, rdma_cm, stderr, versions};
use crate::judge::verdict::Expectations;
use crate::judge::{known_bad, qp_timeouts, rates, saved};
use crate::model::layer::RateRef;
use crate::model::report::{Baseline, Finding, Memlock, Observations, Report, Severity};

/// What to examine and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// Only this device (default: every device the kernel or libibverbs lists).
    pub device: Option<String>,
    /// Every device, even when `device` is set: the default without `device` (the
    /// command's `--all` names it).
    pub all: bool,
    /// Only this port (default: every port).
    pub port: Option<u8>,
    /// Run the loopback tests of the control and data planes and of rdma_cm (default
    /// true). librdmacm keeps the context of a device it used open until the process
    /// exits ([`rdma_cm`]).
    pub loopback: bool,
    /// The longest wait for one completion of the loopback test (default 5 s).
    pub timeout: Duration,
    /// Locked memory a program must be able to register (default 1 MiB: the loopback
    /// test's regions and queues, with room).
    pub memlock_need: u64,
    /// Check this limit instead of the process's own (a what-if, and for tests).
    pub memlock: Option<Memlock>,
    /// Known-bad lists to add to the built-in one.
    pub known_bad_files: Vec<PathBuf>,
    /// A saved report to compare with: its `baseline` section is the reference, and its
    /// port rates are the rates expected ([`crate::model::input::load_report`] reads one).
    pub compare: Option<Report>,
    /// The file `compare` came from, to name it in findings.
    pub compare_file: Option<PathBuf>,
    /// Field patterns not to compare (`devices.*.fw_ver`, `**.source`).
    pub ignore: Vec<String>,
    /// The rate every checked port should run at, Gb/s.
    pub expected_rate: Option<f64>,
    /// How many RDMA lines of the kernel log to keep (default 30).
    pub kernel_log_lines: usize,
    /// Where to record the `timeout event on QP` lines warned about, so that each is
    /// said once per boot ([`qp_timeouts`]; the command's `--state-dir`). None (the
    /// default): every run warns about every such line it reads.
    pub state_dir: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            device: None,
            all: false,
            port: None,
            loopback: true,
            timeout: Duration::from_secs(5),
            memlock_need: 1 << 20,
            memlock: None,
            known_bad_files: Vec::new(),
            compare: None,
            compare_file: None,
            ignore: Vec::new(),
            expected_rate: None,
            kernel_log_lines: 30,
            state_dir: None,
        }
    }
}

/// Collects, checks and compares. While it lists and opens the devices, fd 2 of the
/// process points at a temporary file, to read libibverbs' warnings (call it while no
/// other thread needs stderr). `Err` only for bad input: a known-bad file or a saved
/// report that cannot be read (the doctor's usage error); everything wrong with the
/// system itself is in the report.
pub fn diagnose(opts: &Options) -> Result<Report, String> {
    let known_bad = known_bad::load(&opts.known_bad_files)?;
    let reference = opts.compare.as_ref().map(|r| &r.baseline);

    let (host, kernel) = collect::host_and_kernel();
    // Loaded first (a no-op where linked): every use of a library below finds it loaded or
    // gets its load error, never a panic.
    let libraries = crate::facts::libraries::load_all();
    let sysfs_devices = device::sysfs_devices();
    // libibverbs says why a provider did not load only on stderr: listing and opening run
    // with fd 2 captured (`stderr`).
    let ((verbs_devices, selected, devices, contexts), said) = stderr::capture(|| {
        let verbs_devices = rdma_verbs::devices().map(|l| l.names()).unwrap_or_default();
        let selected = select(opts, &sysfs_devices, &verbs_devices);
        let (devices, contexts) = collect_devices(&selected, &sysfs_devices, &verbs_devices);
        (verbs_devices, selected, devices, contexts)
    });
    let providers: BTreeMap<String, provider::ProviderProbe> = devices
        .iter()
        .filter(|(_, d)| d.open_error.is_some())
        .map(|(n, d)| (n.clone(), provider::probe(n, d, verbs_devices.contains(n), &said)))
        .collect();
    let baseline = Baseline {
        kernel,
        libraries: versions::libraries(),
        packages: versions::packages(),
        modules: collect::modules(),
        dev_nodes: collect::dev_nodes(),
        memlock: opts.memlock.unwrap_or_else(collect::memlock),
        devices,
    };
    let mut observations = Observations {
        kernel_log: kmsg::read(opts.kernel_log_lines),
        verbs_devices,
        sysfs_devices,
        ..Observations::default()
    };
    // Sampled around the probes: what moved while they ran is evidence of the data plane.
    let examined: Vec<String> = baseline.devices.keys().cloned().collect();
    let before = counters::sample(&examined);

    let mut want = expectations(opts, &selected, &baseline, reference);
    want.providers = providers;
    want.kernel_rdma = collect::kernel_has_rdma(&baseline.kernel.release);
    want.rdma_cm_node = rdma_cm::node();
    want.libraries = libraries;
    want.netdev_ipv4 = device::ipv4_addresses();
    let mut run = |name: &str, port: u8, over| match contexts.get(name) {
        Some(ctx) => loopback::run(ctx, port, opts.timeout, over),
        None => LoopbackReport { setup_error: Some(format!("{name} is not open")), ..LoopbackReport::default() },
    };
    let mut cm = |ip| rdma_cm::run(ip, opts.timeout);
    let mut probes = verdict::Probes { loopback: &mut run, rdma_cm: &mut cm };
    let (layers, _runs) = verdict::evaluate(&baseline, &observations, &want, &mut probes);
    drop(contexts);
    observations.counters = counters::sample(&examined);
    observations.counter_changes = counters::changes(&before, &observations.counters);
    observations.link_references = link_references(&want);

    let mut findings = Vec::new();
    for (name, d) in &baseline.devices {
        findings.extend(known_bad::check(&known_bad, name, d));
    }
    if let Some(old) = reference {
        let file = opts.compare_file.as_ref().map_or("(given)".to_owned(), |f| f.display().to_string());
        let more = saved::baseline_findings(&file, old, &known_bad, &findings);
        findings.extend(more);
    }
    findings.extend(notes(&baseline, &observations));
    let examined: Vec<(String, Option<String>)> =
        baseline.devices.keys().map(|n| (n.clone(), crate::facts::device::pci_function(n))).collect();
    let mut reported = opts.state_dir.as_deref().map(crate::facts::said::Reported::load);
    findings.extend(qp_timeouts::findings(&observations.kernel_log, &examined, reported.as_mut()));
    if let Some(Err(e)) = reported.map(|r| r.save()) {
        findings.push(qp_timeouts::unsaved(&e));
    }
    findings.extend(provider_findings(&want.providers));
    let during = if opts.loopback {
        "while the doctor's loopback and rdma_cm tests ran (other traffic on the port counts too)"
    } else {
        "while the doctor ran"
    };
    findings.extend(crate::judge::counter_findings::findings(
        &observations.counter_changes,
        &netdevs(&baseline),
        during,
    ));

    let drift = match reference {
        Some(saved) => {
            let (saved, now) = (to_value(saved)?, to_value(&baseline)?);
            let mut ignore: Vec<String> = compare::SELF_IGNORE.iter().map(|s| s.to_string()).collect();
            ignore.extend(opts.ignore.iter().cloned());
            compare::drift(&saved, &now, &ignore)
        }
        None => Vec::new(),
    };

    let mut report = Report {
        format: report::FORMAT.into(),
        format_version: FORMAT_VERSION,
        tool: format!("rdma-doctor {}", env!("CARGO_PKG_VERSION")),
        host,
        baseline,
        observations,
        layers,
        findings,
        drift,
        status: Status::Healthy,
        exit_code: 0,
    };
    report.settle_status();
    Ok(report)
}

/// The devices of `selected` the kernel or libibverbs lists: their facts, and the
/// contexts of the ones that opened.
fn collect_devices(
    selected: &[String],
    sysfs: &[String],
    verbs: &[String],
) -> (BTreeMap<String, report::DeviceFacts>, BTreeMap<String, rdma_verbs::Context>) {
    let mut devices = BTreeMap::new();
    let mut contexts = BTreeMap::new();
    for name in selected.iter().filter(|n| sysfs.contains(n) || verbs.contains(n)) {
        let (facts, ctx) = device::collect(name);
        devices.insert(name.clone(), facts);
        if let Some(ctx) = ctx {
            contexts.insert(name.clone(), ctx);
        }
    }
    (devices, contexts)
}

/// libibverbs' own words about each device it could not open.
fn provider_findings(probes: &BTreeMap<String, provider::ProviderProbe>) -> Vec<Finding> {
    let mut out = Vec::new();
    for (name, p) in probes {
        out.extend(p.warnings.iter().map(|w| Finding {
            severity: Severity::Warning,
            scope: name.clone(),
            what: format!("libibverbs said: {w}"),
            advice: None,
            source: Some("libibverbs' stderr while the doctor listed and opened the devices".into()),
            layer: Some(Layer::Provider),
        }));
    }
    out
}

/// The netdev under each device (its first port's, else a soft device's parent), for the
/// counters' next steps.
fn netdevs(b: &Baseline) -> BTreeMap<String, String> {
    b.devices
        .iter()
        .filter_map(|(name, d)| {
            let port = d.ports.values().find_map(|p| p.netdev.as_ref().map(|n| n.name.clone()));
            port.or_else(|| d.parent_netdev.clone()).map(|n| (name.clone(), n))
        })
        .collect()
}

/// The rates the link layer judged each port against, for the report.
fn link_references(want: &Expectations) -> BTreeMap<String, BTreeMap<String, report::LinkReference>> {
    let mut out: BTreeMap<String, BTreeMap<String, report::LinkReference>> = BTreeMap::new();
    for ((dev, port), r) in &want.expected_rate {
        out.entry(dev.clone())
            .or_default()
            .insert(port.clone(), report::LinkReference { gbps: r.gbps, from: r.from.clone() });
    }
    out
}

fn to_value(b: &Baseline) -> Result<serde_json::Value, String> {
    serde_json::to_value(b).map_err(|e| e.to_string())
}

/// The devices to examine: `-d NAME` (even if absent: then the device layer says so),
/// else every device the kernel lists, then those only libibverbs lists: a second
/// device that is down is a failure too, not a device nobody looked at.
fn select(opts: &Options, sysfs: &[String], verbs: &[String]) -> Vec<String> {
    match &opts.device {
        Some(d) if !opts.all => vec![d.clone()],
        _ => {
            let mut all: Vec<String> = sysfs.to_vec();
            all.extend(verbs.iter().filter(|v| !sysfs.contains(v)).cloned());
            all
        }
    }
}

fn expectations(opts: &Options, selected: &[String], now: &Baseline, saved: Option<&Baseline>) -> Expectations {
    let mut want = Expectations {
        devices: selected.to_vec(),
        port: opts.port,
        memlock_need: opts.memlock_need,
        loopback: opts.loopback,
        ..Expectations::default()
    };
    let derived = rates::derived(&now.devices, &crate::facts::netdevs::Netdevs::live());
    let file = opts.compare_file.as_ref().map_or("(given)".to_owned(), |f| f.display().to_string());
    for (name, d) in &now.devices {
        for port in d.ports.keys() {
            let from_saved = saved
                .and_then(|s| s.devices.get(name))
                .and_then(|sd| sd.ports.get(port))
                .map(|p| p.rate_gbps)
                .filter(|r| *r > 0.0 && !saved::rate_ignored(name, port, &opts.ignore));
            let given = match (opts.expected_rate, from_saved) {
                (Some(gbps), _) => Some(RateRef { gbps, from: "--expect-rate".into() }),
                (None, Some(gbps)) => Some(RateRef { gbps, from: format!("the saved baseline {file}") }),
                (None, None) => derived.get(&(name.clone(), port.clone())).cloned(),
            };
            if let Some(r) = given {
                want.expected_rate.insert((name.clone(), port.clone()), r);
            }
        }
    }
    if let Some(s) = saved {
        for (name, d) in &s.devices {
            if let Some(p) = &d.parent_netdev {
                want.known_parents.insert(name.clone(), p.clone());
            }
            for (port, p) in &d.ports {
                let v4 = p.gids.values().find(|g| g.gid_type == "RoCE v2" && g.gid.starts_with("::ffff:"));
                if let Some(a) = v4.and_then(|g| g.gid.strip_prefix("::ffff:")) {
                    want.known_addresses.insert((name.clone(), port.clone()), a.to_owned());
                }
            }
        }
    }
    want
}

/// Notes worth a line that do not change the verdict.
fn notes(b: &Baseline, seen: &Observations) -> Vec<Finding> {
    let note = |what: String, advice: Option<&str>| Finding {
        severity: Severity::Note,
        scope: "host".into(),
        what,
        advice: advice.map(Into::into),
        source: None,
        layer: None,
    };
    let mut out = Vec::new();
    // Only where the RDMA stack is there at all: on a kernel without it there is nothing
    // to load on demand.
    let stack = b.modules.contains_key("ib_core");
    if stack && !b.modules.contains_key("rdma_ucm") && !b.dev_nodes.contains_key("/dev/infiniband/rdma_cm") {
        out.push(note(
            "rdma_ucm was not loaded when the doctor started: librdmacm has the kernel load it on a program's first connection (not a fault)".into(),
            None,
        ));
    }
    if !b.memlock.cap_ipc_lock && b.memlock.soft_bytes.is_some_and(|l| l < 64 << 20) {
        out.push(note(
            format!(
                "memlock limit {}: enough for small programs; large registrations need more",
                crate::model::layer::human(b.memlock.soft_bytes.unwrap_or(0))
            ),
            Some("memlock unlimited for RDMA users (/etc/security/limits.d, LimitMEMLOCK=infinity)"),
        ));
    }
    if !seen.sysfs_devices.is_empty() {
        for e in &seen.kernel_log.errors {
            out.push(note(format!("kernel log: {} [{}]", e.line, e.meaning), None));
        }
    }
    for line in &seen.kernel_log.lines {
        let cited = seen.kernel_log.errors.iter().any(|e| &e.line == line);
        // QP timeouts are warnings of their own (`qp_timeouts`).
        if let (Some(meaning), false, false) = (kmsg::trouble(line), cited, qp_timeouts::is_qp_timeout(line)) {
            out.push(note(format!("kernel log: {line} [{meaning}]"), None));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::input;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn every_device_the_kernel_or_libibverbs_lists_is_examined_unless_one_is_named() {
        // Recorded lists: a node whose second port's provider is missing (sysfs only), and
        // an rxe device libibverbs lists before the kernel does (verbs only).
        let sysfs = names(&["mlx5_0", "mlx5_1"]);
        let verbs = names(&["rxe0", "mlx5_0"]);
        let default = Options::default();
        assert_eq!(select(&default, &sysfs, &verbs), ["mlx5_0", "mlx5_1", "rxe0"]);
        let all = Options { all: true, ..Options::default() };
        assert_eq!(select(&all, &sysfs, &verbs), select(&default, &sysfs, &verbs), "--all is the default");
        let one = Options { device: Some("mlx5_1".into()), ..Options::default() };
        assert_eq!(select(&one, &sysfs, &verbs), ["mlx5_1"]);
        let gone = Options { device: Some("mlx5_9".into()), ..Options::default() };
        assert_eq!(select(&gone, &sysfs, &verbs), ["mlx5_9"], "a named device the kernel lost is still checked");
        assert!(select(&default, &[], &[]).is_empty());
    }

    #[test]
    fn rdma_ucm_not_loaded_is_a_note_that_says_it_is_no_fault_and_only_where_rdma_is() {
        let live = report::ModuleInfo { state: "Live".into(), version: None };
        let mut b = Baseline::default();
        assert!(notes(&b, &Observations::default()).iter().all(|f| !f.what.contains("rdma_ucm")), "no RDMA at all");
        b.modules.insert("ib_core".into(), live.clone());
        let found = notes(&b, &Observations::default());
        let ucm: Vec<&Finding> = found.iter().filter(|f| f.what.contains("rdma_ucm")).collect();
        assert_eq!(ucm.len(), 1, "{found:#?}");
        assert_eq!(ucm[0].severity, Severity::Note);
        assert!(ucm[0].what.contains("not a fault") && !ucm[0].what.contains("cannot connect"), "{ucm:#?}");
        b.modules.insert("rdma_ucm".into(), live);
        assert!(notes(&b, &Observations::default()).iter().all(|f| !f.what.contains("rdma_ucm")));
    }

    #[test]
    fn a_saved_rate_is_the_expected_one_unless_an_ignore_pattern_covers_it() {
        let saved = input::parse_report(include_str!("../testdata/node-a.json")).unwrap().baseline;
        let mut now = saved.clone();
        now.devices.get_mut("mlx5_0").unwrap().ports.get_mut("1").unwrap().rate_gbps = 100.0;
        let key = ("mlx5_0".to_owned(), "1".to_owned());
        let from = |ignore: &[&str]| {
            let opts = Options { ignore: names(ignore), ..Options::default() };
            expectations(&opts, &names(&["mlx5_0"]), &now, Some(&saved)).expected_rate.get(&key).map(|r| r.from.clone())
        };
        assert!(from(&[]).is_some_and(|f| f.starts_with("the saved baseline")), "{:?}", from(&[]));
        for ignore in [&["**.rate_gbps"][..], &["devices.mlx5_0.ports.*.rate_gbps"]] {
            assert!(!from(ignore).is_some_and(|f| f.starts_with("the saved baseline")), "{ignore:?}");
        }
        assert!(from(&["devices.mlx5_1.**"]).is_some_and(|f| f.starts_with("the saved baseline")));
    }

    #[test]
    fn a_known_trouble_line_without_an_errno_is_a_finding() {
        let records = ["4,3,100,-;mlx5_core 0000:03:00.0: timeout event on QP 0x1a2b", "6,4,200,-;rdma_rxe: loaded"];
        let seen = Observations {
            kernel_log: kmsg::filter(records.iter().copied(), 10, kmsg::Window::at(200)),
            ..Observations::default()
        };
        let found = notes(&Baseline::default(), &seen);
        assert!(found.iter().all(|f| !f.what.contains("timeout event on QP")), "a warning of its own: {found:#?}");
        let found = qp_timeouts::findings(&seen.kernel_log, &[], None);
        let qp: Vec<&Finding> = found.iter().filter(|f| f.what.contains("timeout event on QP 0x1a2b")).collect();
        assert_eq!(qp.len(), 1, "{found:#?}");
        assert!(qp[0].what.contains("the device timed out a QP"), "{found:#?}");
        assert!(!found.iter().any(|f| f.what.contains("rdma_rxe: loaded")), "{found:#?}");
    }
}
