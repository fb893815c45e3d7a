//! The checks that run over every report the doctor reads, not only over the live node:
//! the known-bad list over each report's devices, and the link layer over each report's
//! active ports. A saved baseline (`--compare`) gets them as findings; the nodes of
//! `--compare-nodes` get them as findings and link layers, beside the fields that differ.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::judge::compare::{compare_nodes, NodeDifference, NODES_IGNORE};
use crate::judge::known_bad::{self, KnownBad};
use crate::judge::link_layer::link;
use crate::model::layer::{LayerReport, Outcome, RateRef};
use crate::model::report::{Baseline, DeviceFacts, Finding, PortFacts, Report, Severity, Status, FORMAT_VERSION};

/// The value of the `format` field of a multi-node comparison.
pub const NODES_FORMAT: &str = "rdma-doctor-nodes";

/// The ACTIVE ports of a device, by number: the ones whose link can be judged.
fn active_ports(d: &DeviceFacts) -> Vec<(&String, &PortFacts)> {
    d.ports.iter().filter(|(_, p)| p.state == "ACTIVE").collect()
}

/// Findings for the saved baseline of `--compare FILE`: each known-bad combination it
/// records (unless `live` already has it for the same device), and each active port of
/// it whose link was not up, whose rate then cannot serve as the expected one.
pub fn baseline_findings(file: &str, saved: &Baseline, entries: &[KnownBad], live: &[Finding]) -> Vec<Finding> {
    let mut out = Vec::new();
    for (name, d) in &saved.devices {
        for mut f in known_bad::check(entries, name, d) {
            if live.iter().any(|l| l.scope == f.scope && l.what == f.what) {
                continue;
            }
            f.what = format!("in the baseline {file}: {}", f.what);
            out.push(f);
        }
        let l = link(name, &active_ports(d), &|_| None);
        if l.outcome == Outcome::Fail {
            out.push(Finding {
                severity: Severity::Warning,
                scope: name.clone(),
                what: format!("the baseline {file} records a failed link: {}", l.summary),
                advice: Some("save baselines from healthy nodes: their port rates become the expected rates".into()),
                source: None,
                layer: Some(crate::model::layer::Layer::Link),
            });
        }
    }
    out
}

/// One node of a comparison.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeLabel {
    /// The name used in the lines below: the host name, or the file when two reports share one.
    pub label: String,
    /// The report file.
    pub file: String,
}

/// What `--compare-nodes` finds: the fields where nodes differ, and per node the link
/// layer of each device and the known-bad findings. Its JSON is `docs/doctor-json.md`'s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodesReport {
    /// Always [`NODES_FORMAT`].
    pub format: String,
    /// [`FORMAT_VERSION`].
    pub format_version: u32,
    /// The nodes, in the order given.
    pub nodes: Vec<NodeLabel>,
    /// The link layer of each device of each node (scope `NODE/DEVICE`).
    pub layers: Vec<LayerReport>,
    /// Known-bad combinations on any node (scope `NODE/DEVICE`).
    pub findings: Vec<Finding>,
    /// The fields of the `baseline` sections where the nodes differ.
    pub differences: Vec<NodeDifference>,
    /// The overall result: a link failed, nodes differ, warnings, or healthy.
    pub status: Status,
    /// The exit status of the doctor for this comparison.
    pub exit_code: i32,
}

/// Compares the nodes `(label, file, report)` and checks each, ignoring the `ignore`
/// patterns besides [`NODES_IGNORE`].
pub fn check_nodes(nodes: &[(String, String, Report)], entries: &[KnownBad], ignore: &[String]) -> NodesReport {
    let mut patterns: Vec<String> = NODES_IGNORE.iter().map(|s| s.to_string()).collect();
    patterns.extend(ignore.iter().cloned());
    let baselines: Vec<(String, serde_json::Value)> = nodes
        .iter()
        .map(|(label, _, r)| (label.clone(), serde_json::to_value(&r.baseline).unwrap_or_default()))
        .collect();
    let differences = compare_nodes(&baselines, &patterns);
    let fastest = fastest_ports(nodes);
    let (mut layers, mut findings) = (Vec::new(), Vec::new());
    for (label, _, r) in nodes {
        for (name, d) in &r.baseline.devices {
            let scope = format!("{label}/{name}");
            findings.extend(known_bad::check(entries, &scope, d));
            let reference = |port: &str| {
                // Ports the operator said differ by design (`--ignore '**.rate_gbps'`) are
                // not held to their peers' rate, as the fields are not compared.
                if rate_ignored(name, port, &patterns) {
                    return None;
                }
                let gbps = *fastest.get(&model_port(name, d, port))?;
                // A soft device's rate is its netdev's: peers are the same soft device on
                // the other nodes, as a saved baseline is for `--compare`.
                let from = if crate::judge::rates::is_soft(d) || d.vendor_part_id == Some(0) {
                    format!("its peers' rate: the fastest node with {name} port {port} (on its netdev)")
                } else {
                    "its peers' rate: the fastest node with this device model and port".to_owned()
                };
                Some(RateRef { gbps, from })
            };
            layers.push(link(&scope, &active_ports(d), &reference));
        }
    }
    let status = Status::of(&layers, differences.len(), &findings);
    NodesReport {
        format: NODES_FORMAT.into(),
        format_version: FORMAT_VERSION,
        nodes: nodes.iter().map(|(label, file, _)| NodeLabel { label: label.clone(), file: file.clone() }).collect(),
        layers,
        findings,
        differences,
        status,
        exit_code: status.exit_code(),
    }
}

/// Whether the `ignore` patterns cover the rate of a port (`devices.NAME.ports.PORT.rate_gbps`):
/// then no other report's rate is its reference, in a comparison of nodes as with `--compare`.
pub(crate) fn rate_ignored(device: &str, port: &str, ignore: &[String]) -> bool {
    let path = format!("devices.{device}.ports.{port}.rate_gbps");
    ignore.iter().any(|p| crate::judge::compare::matches(p, &path))
}

/// A port of a device model: (device name, vendor part id, port).
type ModelPort = (String, Option<u32>, String);

fn model_port(name: &str, d: &DeviceFacts, port: &str) -> ModelPort {
    (name.to_owned(), d.vendor_part_id, port.to_owned())
}

/// The highest rate each port of each device model runs at on any node (active ports only).
fn fastest_ports(nodes: &[(String, String, Report)]) -> BTreeMap<ModelPort, f64> {
    let mut out: BTreeMap<ModelPort, f64> = BTreeMap::new();
    for (_, _, r) in nodes {
        for (name, d) in &r.baseline.devices {
            for (port, p) in active_ports(d) {
                let best = out.entry(model_port(name, d, port)).or_insert(0.0);
                *best = best.max(p.rate_gbps);
            }
        }
    }
    out
}

impl NodesReport {
    /// The comparison as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::input::parse_report;

    const NODE_A: &str = include_str!("../../testdata/node-a.json");

    fn node(label: &str, edit: impl FnOnce(&mut DeviceFacts)) -> (String, String, Report) {
        let mut r = parse_report(NODE_A).unwrap();
        edit(r.baseline.devices.get_mut("mlx5_0").unwrap());
        (label.to_owned(), format!("{label}.json"), r)
    }

    #[test]
    fn identical_healthy_nodes_pass_with_exit_0() {
        let entries = known_bad::load(&[] as &[&str]).unwrap();
        let r = check_nodes(&[node("a", |_| {}), node("b", |_| {})], &entries, &[]);
        assert!(r.differences.is_empty() && r.findings.is_empty(), "{r:#?}");
        assert_eq!(r.layers.len(), 2);
        assert_eq!((r.status, r.exit_code), (Status::Healthy, 0));
    }

    #[test]
    fn a_known_bad_combination_is_found_in_a_node_report_and_in_a_baseline() {
        let entries = known_bad::load(&[] as &[&str]).unwrap();
        let cx5 = |d: &mut DeviceFacts| {
            d.vendor_part_id = Some(4119);
            d.fw_ver = "16.24.1000".into();
            d.kernel_driver.version = Some("5.4-1.0.3.0".into());
        };
        let r = check_nodes(&[node("a", |_| {}), node("b", |_| {}), node("c", cx5)], &entries, &[]);
        assert_eq!(r.findings.len(), 1, "{r:#?}");
        assert_eq!(r.findings[0].scope, "c/mlx5_0");
        assert!(r.findings[0].what.contains("known-bad [connectx5-fw-16.24.1000-ofed-5.4-1.0.3.0]"), "{r:#?}");

        let (_, _, saved) = node("c", cx5);
        let found = baseline_findings("c.json", &saved.baseline, &entries, &[]);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(found[0].what.starts_with("in the baseline c.json: known-bad [connectx5"), "{found:#?}");
        // Already found on the live node: not twice.
        let live = known_bad::check(&entries, "mlx5_0", &saved.baseline.devices["mlx5_0"]);
        assert!(baseline_findings("c.json", &saved.baseline, &entries, &live).is_empty());
    }

    #[test]
    fn a_connectx6_below_20_27_1000_is_known_bad_in_node_reports_and_baselines() {
        let entries = known_bad::load(&[] as &[&str]).unwrap();
        let cx6 = |fw: &'static str| {
            move |d: &mut DeviceFacts| {
                d.vendor_part_id = Some(4123);
                d.fw_ver = fw.into();
            }
        };
        let r = check_nodes(&[node("a", cx6("20.27.1000")), node("b", cx6("20.27.0500"))], &entries, &[]);
        assert_eq!(r.findings.len(), 1, "{r:#?}");
        assert_eq!((r.findings[0].scope.as_str(), r.findings[0].severity), ("b/mlx5_0", Severity::Warning));
        assert!(r.findings[0].what.contains("known-bad [connectx6-fw-below-20.27.1000]"), "{r:#?}");
        assert_eq!(r.exit_code, Status::Drift.exit_code(), "the firmware differs too: {r:#?}");
        let r = check_nodes(&[node("a", cx6("20.27.0500")), node("b", cx6("20.27.0500"))], &entries, &[]);
        assert_eq!((r.findings.len(), r.exit_code), (2, Status::Warnings.exit_code()), "{r:#?}");

        let (_, _, saved) = node("b", cx6("20.27.0500"));
        let found = baseline_findings("b.json", &saved.baseline, &entries, &[]);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].what.starts_with("in the baseline b.json: known-bad [connectx6-fw-below-20.27.1000]"),
            "{found:#?}"
        );
        let (_, _, fixed) = node("b", cx6("20.27.1000"));
        assert!(baseline_findings("b.json", &fixed.baseline, &entries, &[]).is_empty());
    }

    #[test]
    fn a_baseline_that_recorded_a_failed_link_says_so() {
        let (_, _, saved) = node("a", |d| d.ports.get_mut("1").unwrap().phys_state = "LinkErrorRecovery".into());
        let found = baseline_findings("a.json", &saved.baseline, &[], &[]);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(found[0].what.contains("records a failed link: port 1 is ACTIVE but its physical state"), "{found:#?}");
    }

    #[test]
    fn a_node_slower_than_its_peers_fails_its_link_layer() {
        let entries = known_bad::load(&[] as &[&str]).unwrap();
        let slow = node("c", |d| d.ports.get_mut("1").unwrap().rate_gbps = 2.5);
        let r = check_nodes(&[node("a", |_| {}), node("b", |_| {}), slow], &entries, &[]);
        let failed: Vec<&LayerReport> = r.layers.iter().filter(|l| l.outcome == Outcome::Fail).collect();
        assert_eq!(failed.len(), 1, "{r:#?}");
        assert_eq!(failed[0].scope, "c/mlx5_0");
        assert!(failed[0].summary.contains("2.5 Gb/s, below the expected 200 Gb/s"), "{:?}", failed[0]);
        assert_eq!(r.exit_code, 1);
    }

    #[test]
    fn an_rxe_node_below_its_peers_rate_fails_its_link_layer_unless_rates_are_ignored() {
        let entries = known_bad::load(&[] as &[&str]).unwrap();
        let rxe = |rate: f64| {
            move |d: &mut DeviceFacts| {
                (d.kernel_driver_name, d.vendor_part_id) = (Some("rdma_rxe".into()), Some(0));
                d.ports.get_mut("1").unwrap().rate_gbps = rate;
            }
        };
        let nodes = [node("a", rxe(100.0)), node("b", rxe(100.0)), node("c", rxe(25.0))];
        let r = check_nodes(&nodes, &entries, &[]);
        let failed: Vec<&LayerReport> = r.layers.iter().filter(|l| l.outcome == Outcome::Fail).collect();
        assert_eq!(failed.len(), 1, "{r:#?}");
        assert_eq!((failed[0].scope.as_str(), failed[0].layer), ("c/mlx5_0", crate::model::layer::Layer::Link));
        assert!(
            failed[0]
                .summary
                .contains("25 Gb/s, below the expected 100 Gb/s (its peers' rate: the fastest node with mlx5_0 port 1"),
            "{:?}",
            failed[0]
        );
        assert_eq!(r.exit_code, 1);
        // The same rule as one node's `--compare` against a saved report of a faster peer.
        assert!(rate_ignored("rxe0", "1", &["**.rate_gbps".into()]));
        assert!(rate_ignored("rxe0", "1", &["devices.rxe0.ports.*.rate_gbps".into()]));
        assert!(!rate_ignored("rxe0", "1", &["devices.rxe1.**".into(), "**.width".into()]));
        let same = [node("a", rxe(25.0)), node("b", rxe(25.0))];
        assert!(check_nodes(&same, &entries, &[]).layers.iter().all(|l| l.outcome == Outcome::Pass));
    }

    #[test]
    fn rxe_nodes_on_netdevs_of_different_speeds_said_so_are_not_degraded_against_each_other() {
        let entries = known_bad::load(&[] as &[&str]).unwrap();
        let rxe = |rate: f64| {
            move |d: &mut DeviceFacts| {
                (d.kernel_driver_name, d.vendor_part_id) = (Some("rdma_rxe".into()), Some(0));
                d.ports.get_mut("1").unwrap().rate_gbps = rate;
            }
        };
        let r = check_nodes(&[node("a", rxe(100.0)), node("b", rxe(2.5))], &entries, &["**.rate_gbps".into()]);
        assert!(r.layers.iter().all(|l| l.outcome == Outcome::Pass), "{r:#?}");
    }
}
