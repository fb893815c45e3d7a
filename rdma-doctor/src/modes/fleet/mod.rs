//! The fleet: `rdma-doctor --fleet HOST...` asks every node's `rdma-doctor --serve` for
//! its report, in parallel with a bounded time per node, and tabulates the versions that
//! matter when something breaks (kernel, rdma-core, provider, driver, firmware, device,
//! port state and rate, MTU), marking each value that differs from the majority of the
//! nodes or from a saved baseline, the known-bad combinations of each node and each
//! node's own verdict. Then it has each node probe the RDMA path to its neighbour (a
//! ring, or every pair with `--mesh`) with `--peer`'s checks, and names the links that
//! fail.
//!
//! A node that cannot be reached, that answers garbage or too slowly, or that runs a
//! doctor of another version is named in a row of its own and left out of the
//! comparison and the probes; the others are examined as usual.
//!
//! The requests ride on the `--serve` door ([`wire`]): a report request in place of a
//! probe's hello, answered with a report as fresh as [`crate::modes::fresh`] says (diagnosed for
//! the request, or at most 2 s before it with every port as it is now), and a probe
//! request, answered with the node's `--peer` report for the path to another node (one
//! its allow-list admits).

mod gather;
mod report;
mod table;
pub mod wire;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::judge::compare::{self, NODES_IGNORE, SELF_IGNORE};
use crate::judge::known_bad::KnownBad;
use crate::judge::saved::check_nodes;
use crate::model::layer::Outcome;
use crate::model::report::{Baseline, Drift, Report, Severity, Status};

pub use gather::probe_wait;
pub use report::{FleetNode, FleetReport, Link, NodeDrift, NodeState, Row};
pub use table::to_text;

/// The value of the `format` field of a fleet report.
pub const FLEET_FORMAT: &str = "rdma-doctor-fleet";
/// The version of the fleet report's JSON (docs/doctor-json.md).
pub const FLEET_FORMAT_VERSION: u32 = 1;
/// The most hosts one run asks.
pub const MAX_HOSTS: usize = 10_000;

/// A saved baseline to compare the fleet with.
#[derive(Debug, Clone)]
pub enum Reference {
    /// A saved fleet report: each node against its own saved baseline (by label, else by
    /// host as given).
    Fleet(String, Vec<FleetNode>),
    /// One node's saved report: every node against it, identities ignored.
    Node(String, Box<Baseline>),
}

/// Reads a saved fleet report or node report, bounded and strictly.
pub fn load_reference(path: &std::path::Path) -> Result<Reference, String> {
    let name = path.display().to_string();
    let text = crate::model::input::read_limited(path)?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{name}: {e}"))?;
    if v.get("format").and_then(Value::as_str) == Some(FLEET_FORMAT) {
        let version = v.get("format_version").and_then(Value::as_u64);
        if !version.is_some_and(|n| (1..=u64::from(FLEET_FORMAT_VERSION)).contains(&n)) {
            return Err(format!(
                "{name}: fleet format_version {version:?}; this doctor reads 1 to {FLEET_FORMAT_VERSION}"
            ));
        }
        let r: FleetReport = crate::model::input::parse_strict(&text).map_err(|e| format!("{name}: {e}"))?;
        return Ok(Reference::Fleet(name, r.nodes.into_iter().filter(|n| n.baseline.is_some()).collect()));
    }
    let r = crate::model::input::parse_report(&text).map_err(|e| format!("{name}: {e}"))?;
    Ok(Reference::Node(name, Box::new(r.baseline)))
}

/// One HOST per line; `#` starts a comment; blank lines are skipped.
pub fn parse_hosts_file(text: &str) -> Result<Vec<String>, String> {
    let mut hosts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        match line.split_whitespace().collect::<Vec<_>>()[..] {
            [] => {}
            [host] => hosts.push(host.to_owned()),
            _ => return Err(format!("line {}: one HOST[:PORT] a line, found {line:?}", i + 1)),
        }
    }
    Ok(hosts)
}

/// What to ask and how.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// The hosts, `HOST[:PORT]`, in order (the ring's order).
    pub hosts: Vec<String>,
    /// The port of a host that names none.
    pub default_port: u16,
    /// The time allowed each node for its report, and the probes' timeout.
    pub timeout: Duration,
    /// Connections at once.
    pub parallel: usize,
    /// Every pair rather than a ring.
    pub mesh: bool,
    /// Probe the paths at all.
    pub probe: bool,
    /// The known-bad list.
    pub known_bad: Vec<KnownBad>,
    /// Fields not to compare.
    pub ignore: Vec<String>,
    /// A saved baseline.
    pub reference: Option<Reference>,
    /// The secret the nodes' doors ask proof of (`--secret-file`).
    pub secret: Option<crate::modes::gate::Secret>,
}

/// Asks every node, compares, probes: the fleet report. Refuses only a host list that is
/// empty, too long, or names a host twice.
pub fn run(opts: &FleetOptions) -> Result<FleetReport, String> {
    if opts.hosts.is_empty() || opts.hosts.len() > MAX_HOSTS {
        return Err(format!("give 1 to {MAX_HOSTS} hosts ({} given)", opts.hosts.len()));
    }
    let addresses: Vec<(String, String)> =
        opts.hosts.iter().map(|h| (h.clone(), wire::with_port(h, opts.default_port))).collect();
    for (i, (h, a)) in addresses.iter().enumerate() {
        if let Some((first, _)) = addresses[..i].iter().find(|(_, b)| b == a) {
            return Err(format!("{h} and {first} are the same node ({a})"));
        }
    }
    let mut nodes = gather::parallel_map(
        &addresses,
        opts.parallel,
        |(h, a)| gather::gather(h, a, opts.secret.as_ref(), opts.timeout),
        |(h, a)| {
            let mut n = FleetNode::new(h, a, NodeState::Refused);
            n.error = Some("the collector had no thread to ask this node".into());
            n
        },
    );
    summarize(&mut nodes);
    let answered: Vec<&FleetNode> = nodes.iter().filter(|n| n.report.is_some()).collect();
    let (links, topology) = match (opts.probe, answered.len() >= 2) {
        (true, true) => {
            let t = if opts.mesh { "mesh" } else { "ring" };
            (gather::probe_links(&answered, opts.mesh, opts.timeout, opts.secret.as_ref(), opts.parallel), t)
        }
        _ => (Vec::new(), "none"),
    };
    Ok(assess(nodes, links, topology, opts))
}

/// Labels each node and copies the summary of its report into the node.
fn summarize(nodes: &mut [FleetNode]) {
    let names: Vec<String> = nodes.iter().filter_map(|n| n.report.as_ref().map(|r| r.host.hostname.clone())).collect();
    for n in nodes.iter_mut() {
        let Some(r) = &n.report else { continue };
        let host = &r.host.hostname;
        if !host.is_empty() && names.iter().filter(|h| *h == host).count() == 1 {
            n.label = host.clone();
        }
        n.hostname = Some(host.clone());
        n.tool = Some(r.tool.clone());
        n.report_time_unix = Some(r.host.time_unix);
        n.node_status = Some(r.status);
        n.node_exit_code = Some(r.exit_code);
        n.failed_layers = r
            .layers
            .iter()
            .filter(|l| l.outcome == Outcome::Fail)
            .map(|l| format!("{} {}: {}", l.scope, l.layer.name(), l.summary))
            .collect();
        n.warnings = r.findings.iter().filter(|f| f.severity == Severity::Warning).map(|f| f.what.clone()).collect();
        n.baseline = Some(r.baseline.clone());
    }
}

/// Compares the answering nodes with each other and with the saved baseline, checks
/// each, and settles the result.
fn assess(nodes: Vec<FleetNode>, links: Vec<Link>, topology: &str, opts: &FleetOptions) -> FleetReport {
    let labelled: Vec<(String, String, Report)> = nodes
        .iter()
        .filter_map(|n| n.report.as_ref().map(|r| (n.label.clone(), n.address.clone(), r.clone())))
        .collect();
    let checked = check_nodes(&labelled, &opts.known_bad, &opts.ignore);
    let baseline_drift = opts.reference.as_ref().map(|r| drift_from(r, &nodes, &opts.ignore)).unwrap_or_default();
    let suspects = suspects(&links);
    let rows = table::rows(&nodes, &checked.findings, &checked.differences, &baseline_drift);

    let failed = nodes.iter().any(|n| n.state != NodeState::Answered || n.node_status == Some(Status::LayerFailed))
        || checked.layers.iter().any(|l| l.outcome == Outcome::Fail)
        || links.iter().any(|l| !l.ok);
    let warned = checked.findings.iter().any(|f| f.severity == Severity::Warning)
        || links.iter().any(|l| l.warning)
        || nodes.iter().any(|n| n.node_status == Some(Status::Warnings));
    let status = if failed {
        Status::LayerFailed
    } else if !checked.differences.is_empty() || !baseline_drift.is_empty() {
        Status::Drift
    } else if warned {
        Status::Warnings
    } else {
        Status::Healthy
    };
    let time_unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    FleetReport {
        format: FLEET_FORMAT.into(),
        format_version: FLEET_FORMAT_VERSION,
        tool: format!("rdma-doctor {}", env!("CARGO_PKG_VERSION")),
        time_unix,
        timeout_ms: u64::try_from(opts.timeout.as_millis()).unwrap_or(u64::MAX),
        topology: topology.into(),
        compared_with: opts.reference.as_ref().map(|r| match r {
            Reference::Fleet(f, _) | Reference::Node(f, _) => f.clone(),
        }),
        nodes,
        rows,
        layers: checked.layers,
        findings: checked.findings,
        differences: checked.differences,
        baseline_drift,
        links,
        suspects,
        status,
        exit_code: status.exit_code(),
    }
}

/// Every field of every answering node that differs from its saved baseline; a node new
/// to a saved fleet, or one of it not asked now, is a drift of the field `node`.
fn drift_from(reference: &Reference, nodes: &[FleetNode], ignore: &[String]) -> Vec<NodeDrift> {
    let patterns =
        |base: &[&str]| -> Vec<String> { base.iter().map(|s| s.to_string()).chain(ignore.iter().cloned()).collect() };
    let value = |b: &Baseline| serde_json::to_value(b).unwrap_or_default();
    let mut out = Vec::new();
    let node_drift = |node: &str, expected: Option<&str>, found: Option<&str>| NodeDrift {
        node: node.to_owned(),
        field: "node".into(),
        expected: expected.map(Value::from),
        found: found.map(Value::from),
    };
    for n in nodes {
        let Some(now) = n.report.as_ref().map(|r| &r.baseline) else { continue };
        let (saved, ignore) = match reference {
            Reference::Node(_, b) => (Some(b.as_ref()), patterns(NODES_IGNORE)),
            Reference::Fleet(_, saved) => {
                let same =
                    saved.iter().find(|s| s.label == n.label).or_else(|| saved.iter().find(|s| s.given == n.given));
                (same.and_then(|s| s.baseline.as_ref()), patterns(SELF_IGNORE))
            }
        };
        match saved {
            Some(s) => out.extend(compare::drift(&value(s), &value(now), &ignore).into_iter().map(|d: Drift| {
                NodeDrift { node: n.label.clone(), field: d.field, expected: d.expected, found: d.found }
            })),
            None => out.push(node_drift(&n.label, None, Some("not in the saved baseline"))),
        }
    }
    if let Reference::Fleet(_, saved) = reference {
        for s in saved {
            if !nodes.iter().any(|n| n.label == s.label || n.given == s.given) {
                out.push(node_drift(&s.label, Some("in the saved baseline"), None));
            }
        }
    }
    out
}

/// The nodes every link of which failed (two links at least) while a link elsewhere passed.
fn suspects(links: &[Link]) -> Vec<String> {
    if !links.iter().any(|l| l.ok) {
        return Vec::new();
    }
    let mut by_node: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for l in links {
        for n in [&l.from, &l.to] {
            let e = by_node.entry(n).or_default();
            e.0 += 1;
            e.1 += usize::from(!l.ok);
        }
    }
    by_node.into_iter().filter(|(_, (all, bad))| *all >= 2 && all == bad).map(|(n, _)| n.to_owned()).collect()
}
