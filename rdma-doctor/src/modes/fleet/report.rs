//! The fleet report's types: each node, the table's rows, the links, and the whole, as
//! `--fleet --json` prints them (docs/doctor-json.md).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::wire::Trouble;
use crate::judge::compare::NodeDifference;
use crate::model::layer::LayerReport;
use crate::model::report::{Baseline, Finding, Report, Status};
use crate::modes::peer::PeerReport;

/// How a node answered the report request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// With a report this doctor reads.
    Answered,
    /// No TCP connection.
    Unreachable,
    /// Not an answer of ours, or over the size limit.
    Garbage,
    /// No complete answer within the timeout.
    Slow,
    /// A doctor of another protocol or report version.
    OtherVersion,
    /// A doctor of ours refused the request.
    Refused,
}

impl From<Trouble> for NodeState {
    fn from(t: Trouble) -> NodeState {
        match t {
            Trouble::Unreachable => NodeState::Unreachable,
            Trouble::Garbage => NodeState::Garbage,
            Trouble::Slow => NodeState::Slow,
            Trouble::OtherVersion => NodeState::OtherVersion,
            Trouble::Refused => NodeState::Refused,
        }
    }
}

impl NodeState {
    /// The word in the table.
    pub fn name(self) -> &'static str {
        match self {
            NodeState::Answered => "answered",
            NodeState::Unreachable => "UNREACHABLE",
            NodeState::Garbage => "GARBAGE",
            NodeState::Slow => "SLOW",
            NodeState::OtherVersion => "OTHER VERSION",
            NodeState::Refused => "REFUSED",
        }
    }
}

/// One node of the fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetNode {
    /// The name in the table and the links: its host name when no other node has it,
    /// else the host as given.
    pub label: String,
    /// The host as given (`HOST[:PORT]`).
    pub given: String,
    /// The `HOST:PORT` asked.
    pub address: String,
    /// How it answered.
    pub state: NodeState,
    /// Why it gave no usable answer.
    pub error: Option<String>,
    /// How long the answer took, milliseconds.
    pub elapsed_ms: u64,
    /// Its report (only its summary and baseline are in the fleet's JSON).
    #[serde(skip)]
    pub report: Option<Report>,
    /// Its host name, its doctor, and when its report was made (Unix time).
    #[serde(default)]
    pub hostname: Option<String>,
    /// The doctor that made its report.
    #[serde(default)]
    pub tool: Option<String>,
    /// When its report was made (Unix time).
    #[serde(default)]
    pub report_time_unix: Option<u64>,
    /// Its own verdict and exit status.
    #[serde(default)]
    pub node_status: Option<Status>,
    /// Its own exit status.
    #[serde(default)]
    pub node_exit_code: Option<i32>,
    /// Its failed layers: `SCOPE LAYER: SUMMARY`.
    #[serde(default)]
    pub failed_layers: Vec<String>,
    /// Its own warnings (findings of severity warning).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Its `baseline` section: a saved fleet report is a baseline per node.
    #[serde(default)]
    pub baseline: Option<Baseline>,
}

impl FleetNode {
    /// A node asked at `address`, before anything is known of it.
    pub(crate) fn new(given: &str, address: &str, state: NodeState) -> FleetNode {
        FleetNode {
            label: given.to_owned(),
            given: given.to_owned(),
            address: address.to_owned(),
            state,
            error: None,
            elapsed_ms: 0,
            report: None,
            hostname: None,
            tool: None,
            report_time_unix: None,
            node_status: None,
            node_exit_code: None,
            failed_layers: Vec::new(),
            warnings: Vec::new(),
            baseline: None,
        }
    }
}

/// A field of a node that differs from the saved baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeDrift {
    /// The node's label.
    pub node: String,
    /// The field's path in the `baseline` section (`node`: the node is new, or gone).
    pub field: String,
    /// Its saved value (`None`: the field is new).
    pub expected: Option<Value>,
    /// Its value now (`None`: the field is gone).
    pub found: Option<Value>,
}

/// The path probe from one node to the next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// The prober's label.
    pub from: String,
    /// The probed node's label.
    pub to: String,
    /// Every check passed (possibly with warnings).
    pub ok: bool,
    /// A check warned.
    pub warning: bool,
    /// The layer of the first failed check (`collector` when no probe report came back).
    pub failed_layer: Option<String>,
    /// The first failed check's words, else the first warning's, else a summary.
    pub detail: String,
    /// The usual fix of the first failure.
    pub fix: Option<String>,
    /// The prober's `--peer` report.
    pub probe: Option<PeerReport>,
}

impl Link {
    pub(super) fn failed(from: &FleetNode, to: &FleetNode, layer: &str, detail: String) -> Link {
        Link {
            from: from.label.clone(),
            to: to.label.clone(),
            ok: false,
            warning: false,
            failed_layer: Some(layer.into()),
            detail,
            fix: None,
            probe: None,
        }
    }

    pub(super) fn from_report(from: &FleetNode, to: &FleetNode, report: PeerReport) -> Link {
        let code = report.exit_code();
        let first_fail = report.checks.iter().find(|c| !c.ok);
        let first_warn = report.checks.iter().find(|c| c.ok && c.warning);
        let (failed_layer, detail, fix) = match (first_fail, first_warn) {
            (Some(c), _) => (Some(c.layer.clone()), c.detail.clone(), c.fix.clone()),
            (None, Some(c)) => (None, format!("{}: {}", c.layer, c.detail), c.fix.clone()),
            (None, None) if report.checks.is_empty() => (Some("none".into()), "no check ran".into(), None),
            (None, None) => (None, format!("{} checks passed in {} ms", report.checks.len(), report.elapsed_ms), None),
        };
        Link {
            from: from.label.clone(),
            to: to.label.clone(),
            ok: code != 1,
            warning: code == Status::Warnings.exit_code(),
            failed_layer,
            detail,
            fix,
            probe: Some(report),
        }
    }
}

/// One row of the table: a port of a device of a node (a node without an answer has one
/// row, with its state).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row {
    /// The node's label.
    pub node: String,
    /// `kernel.release`.
    pub kernel: String,
    /// rdma-core's version.
    pub rdma_core: String,
    /// The provider and its version.
    pub provider: String,
    /// The kernel driver and its version.
    pub driver: String,
    /// The firmware.
    pub firmware: String,
    /// The device: name, and its part id (or `hca_type`).
    pub device: String,
    /// The port number.
    pub port: String,
    /// `ACTIVE`, `DOWN`, ... or the node's state when it gave no answer.
    pub state: String,
    /// Rate, Gb/s, with width and speed.
    pub rate: String,
    /// Active MTU / netdev MTU.
    pub mtu: String,
    /// The node's own verdict: `ok`, `fail: LAYER`, `warn`, `known-bad`.
    pub doctor: String,
    /// The columns whose value differs from the majority of the nodes.
    pub majority_drift: Vec<String>,
    /// The columns whose value differs from the saved baseline.
    pub baseline_drift: Vec<String>,
}

/// What `--fleet` found: docs/doctor-json.md's fleet report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetReport {
    /// Always [`FLEET_FORMAT`](super::FLEET_FORMAT).
    pub format: String,
    /// [`FLEET_FORMAT_VERSION`](super::FLEET_FORMAT_VERSION).
    pub format_version: u32,
    /// The collector's doctor.
    pub tool: String,
    /// When the collector ran (Unix time).
    pub time_unix: u64,
    /// The time allowed each node for its report, milliseconds.
    pub timeout_ms: u64,
    /// `ring`, `mesh`, or `none` (`--no-probe`, or fewer than two nodes answered).
    pub topology: String,
    /// The saved baseline compared with, when one was given.
    pub compared_with: Option<String>,
    /// The nodes, in the order given.
    pub nodes: Vec<FleetNode>,
    /// The table.
    pub rows: Vec<Row>,
    /// Each answering node's link layer per device, judged against the fastest node with
    /// the same device model (scope `NODE/DEVICE`).
    pub layers: Vec<LayerReport>,
    /// Known-bad combinations on any node (scope `NODE/DEVICE`).
    pub findings: Vec<Finding>,
    /// The fields where the answering nodes differ.
    pub differences: Vec<NodeDifference>,
    /// The fields that differ from the saved baseline, per node.
    pub baseline_drift: Vec<NodeDrift>,
    /// The path probes.
    pub links: Vec<Link>,
    /// Nodes every probed link of which failed while others passed: the likely fault.
    pub suspects: Vec<String>,
    /// The overall result.
    pub status: Status,
    /// The doctor's exit status for it.
    pub exit_code: i32,
}

impl FleetReport {
    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}
