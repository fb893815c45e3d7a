//! The fleet's table and its text: one row per port of each device of each node, a cell
//! marked `*` where it differs from the majority of the nodes and `!` where it differs
//! from the saved baseline; then the nodes without an answer, the failed layers, the
//! known-bad combinations, every differing field, and the links.

use super::{FleetNode, FleetReport, NodeDrift, NodeState, Row};
use crate::judge::compare::NodeDifference;
use crate::model::layer::Outcome;
use crate::model::report::{Finding, Status};

/// The table's columns, as [`Row`]'s drift lists name them.
const COLUMNS: [&str; 12] = [
    "node",
    "kernel",
    "rdma-core",
    "provider",
    "driver",
    "firmware",
    "device",
    "port",
    "state",
    "rate",
    "mtu",
    "doctor",
];

/// The column of the row for `device`/`port` that shows the baseline field `field`.
fn column(field: &str, device: &str, port: &str) -> Option<&'static str> {
    let s: Vec<&str> = field.split('.').collect();
    match s[..] {
        ["kernel", "release"] => Some("kernel"),
        ["libraries", "rdma-core", ..] => Some("rdma-core"),
        ["devices", d, ref rest @ ..] if d == device => match rest {
            ["provider", ..] => Some("provider"),
            ["kernel_driver", ..] | ["kernel_driver_name"] => Some("driver"),
            ["fw_ver"] => Some("firmware"),
            ["vendor_id" | "vendor_part_id" | "hca_type" | "board_id"] => Some("device"),
            ["ports", p, ref port_rest @ ..] if *p == port => match port_rest {
                ["state" | "phys_state"] => Some("state"),
                ["rate_gbps" | "width" | "speed"] => Some("rate"),
                ["active_mtu" | "max_mtu"] | ["netdev", "mtu"] => Some("mtu"),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    }
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_owned()
    }
}

/// The rows of the table.
pub(super) fn rows(
    nodes: &[FleetNode],
    findings: &[Finding],
    differences: &[NodeDifference],
    drift: &[NodeDrift],
) -> Vec<Row> {
    let mut out = Vec::new();
    for n in nodes {
        let Some(r) = &n.report else {
            out.push(Row { node: n.label.clone(), state: n.state.name().into(), ..Row::default() });
            continue;
        };
        let b = &r.baseline;
        let rdma_core = b.libraries.get("rdma-core").and_then(|v| v.version.clone()).unwrap_or_default();
        let verdict = match r.status {
            Status::Healthy => "ok".to_owned(),
            Status::Warnings => "warn".to_owned(),
            Status::Drift => "drift".to_owned(),
            Status::LayerFailed => {
                let first = r.layers.iter().find(|l| l.outcome == Outcome::Fail);
                format!("FAIL {}", first.map_or("", |l| l.layer.name()))
            }
        };
        let mut devices: Vec<(&str, Option<&crate::model::report::DeviceFacts>)> =
            b.devices.iter().map(|(k, d)| (k.as_str(), Some(d))).collect();
        if devices.is_empty() {
            devices.push(("", None));
        }
        for (name, d) in devices {
            let bad =
                findings.iter().any(|f| f.scope == format!("{}/{name}", n.label) && f.what.starts_with("known-bad"));
            let doctor = if bad { format!("{verdict} known-bad") } else { verdict.clone() };
            let mut base = Row {
                node: n.label.clone(),
                kernel: b.kernel.release.clone(),
                rdma_core: rdma_core.clone(),
                device: or_dash(name),
                doctor,
                ..Row::default()
            };
            if let Some(d) = d {
                base.provider = d.provider.as_ref().map_or(String::new(), |p| {
                    format!("{} {}", p.name, p.version.as_deref().unwrap_or("")).trim().to_owned()
                });
                base.driver = format!(
                    "{} {}",
                    d.kernel_driver_name.as_deref().unwrap_or(""),
                    d.kernel_driver.version.as_deref().unwrap_or("")
                )
                .trim()
                .to_owned();
                base.firmware = d.fw_ver.clone();
                if let Some(t) = d.hca_type.as_ref().filter(|t| !t.is_empty()) {
                    base.device = format!("{name} {t}");
                }
            }
            let ports: Vec<(String, Option<&crate::model::report::PortFacts>)> = match d {
                Some(d) if !d.ports.is_empty() => d.ports.iter().map(|(k, p)| (k.clone(), Some(p))).collect(),
                _ => vec![(String::new(), None)],
            };
            for (port, p) in ports {
                let mut row = base.clone();
                row.port = port.clone();
                if let Some(p) = p {
                    row.state = p.state.clone();
                    row.rate = format!("{} {} {}", p.rate_gbps, p.width, p.speed).trim().to_owned();
                    row.mtu = match p.netdev.as_ref().and_then(|nd| nd.mtu) {
                        Some(m) => format!("{}/{m}", p.active_mtu),
                        None => p.active_mtu.to_string(),
                    };
                }
                let col = |field: &str| column(field, name, &port).map(str::to_owned);
                for d in differences {
                    if d.odd.iter().any(|(o, _)| *o == n.label) {
                        row.majority_drift.extend(col(&d.field));
                    }
                }
                row.baseline_drift.extend(drift.iter().filter(|x| x.node == n.label).filter_map(|x| col(&x.field)));
                row.majority_drift.dedup();
                row.baseline_drift.sort();
                row.baseline_drift.dedup();
                out.push(row);
            }
        }
    }
    out
}

fn ago(secs: u64) -> String {
    match secs {
        0..=119 => format!("{secs} s"),
        120..=7199 => format!("{} min", secs / 60),
        7200..=172_799 => format!("{} h", secs / 3600),
        _ => format!("{} days", secs / 86_400),
    }
}

/// Passing links listed one a line up to this many; past it, counted.
const MAX_PASS_LINES: usize = 16;

fn cells(row: &Row) -> [String; 12] {
    let plain = [
        &row.node,
        &row.kernel,
        &row.rdma_core,
        &row.provider,
        &row.driver,
        &row.firmware,
        &row.device,
        &row.port,
        &row.state,
        &row.rate,
        &row.mtu,
        &row.doctor,
    ];
    let mut out: [String; 12] = Default::default();
    for (i, (text, name)) in plain.iter().zip(COLUMNS).enumerate() {
        let mut c = or_dash(text);
        if row.majority_drift.iter().any(|m| m == name) {
            c.push('*');
        }
        if row.baseline_drift.iter().any(|m| m == name) {
            c.push('!');
        }
        out[i] = c;
    }
    out
}

/// The fleet report for a person.
pub fn to_text(r: &FleetReport) -> String {
    let answered = r.nodes.iter().filter(|n| n.state == NodeState::Answered).count();
    let mut s = format!(
        "rdma-doctor --fleet: {} node(s) asked, {answered} answered (each within {:.1} s)\n\n",
        r.nodes.len(),
        r.timeout_ms as f64 / 1000.0
    );
    let header: [String; 12] = COLUMNS.map(str::to_uppercase);
    let body: Vec<[String; 12]> = r.rows.iter().map(cells).collect();
    let mut width = [0usize; 12];
    for line in std::iter::once(&header).chain(&body) {
        for (w, c) in width.iter_mut().zip(line) {
            *w = (*w).max(c.chars().count());
        }
    }
    for line in std::iter::once(&header).chain(&body) {
        let padded: Vec<String> = line.iter().zip(width).map(|(c, w)| format!("{c:<w$}")).collect();
        s += padded.join("  ").trim_end();
        s += "\n";
    }
    let baseline =
        r.compared_with.as_deref().map_or(String::new(), |f| format!("; ! differs from the saved baseline {f}"));
    s += &format!("(* differs from the majority of the nodes{baseline})\n");
    // A node's --serve diagnoses for the request, or reuses a report at most
    // crate::modes::fresh::MAX_AGE old whose ports are as they were; a node's clock may differ.
    let oldest = r.nodes.iter().filter_map(|n| n.report_time_unix.map(|t| (t, &n.label))).min();
    if let Some((t, node)) = oldest {
        let age = r.time_unix.saturating_sub(t);
        s += &format!(
            "(each node's report was diagnosed for this request or shortly before: the oldest, {node}'s, is {} old)\n",
            ago(age)
        );
    }

    let silent: Vec<_> = r.nodes.iter().filter(|n| n.state != NodeState::Answered).collect();
    if !silent.is_empty() {
        s += "\nnodes without a usable answer (left out of the comparison and the probes):\n";
        for n in silent {
            let at = if n.address == n.label { String::new() } else { format!(" ({})", n.address) };
            s += &format!("  {}{at}: {}: {}\n", n.label, n.state.name(), n.error.as_deref().unwrap_or(""));
        }
    }
    let failing: Vec<_> = r.nodes.iter().filter(|n| !n.failed_layers.is_empty()).collect();
    if !failing.is_empty() {
        s += "\nnodes whose own diagnosis failed:\n";
        for n in failing {
            n.failed_layers.iter().for_each(|l| s += &format!("  {}: {l}\n", n.label));
        }
    }
    for l in r.layers.iter().filter(|l| l.outcome == Outcome::Fail) {
        s += &format!("FAIL  {} {}: {}\n", l.scope, l.layer.name(), l.summary);
    }
    if !r.findings.is_empty() {
        s += "\nknown-bad combinations:\n";
        for f in &r.findings {
            s += &format!("  warning [{}] {}\n", f.scope, f.what);
            f.advice.iter().for_each(|a| s += &format!("        advice (not run): {a}\n"));
            f.source.iter().for_each(|src| s += &format!("        source: {src}\n"));
        }
    }
    let own: Vec<(&str, &String)> = r
        .nodes
        .iter()
        .flat_map(|n| n.warnings.iter().filter(|w| !w.starts_with("known-bad")).map(move |w| (n.label.as_str(), w)))
        .collect();
    if !own.is_empty() {
        s += "\nwarnings of the nodes' own diagnoses:\n";
        own.iter().for_each(|(n, w)| s += &format!("  {n}: {w}\n"));
    }
    if answered >= 2 {
        s += "\ndifferences between the nodes:\n";
        s += &crate::judge::compare::nodes_text(&r.differences, answered);
    }
    if let Some(f) = &r.compared_with {
        s += &format!("\ndrift from the saved baseline {f}:\n");
        if r.baseline_drift.is_empty() {
            s += "  none\n";
        }
        for d in &r.baseline_drift {
            let v = |x: &Option<serde_json::Value>| x.as_ref().map_or("(none)".to_owned(), |v| v.to_string());
            s += &format!("  {}: {}: {} -> {}\n", d.node, d.field, v(&d.expected), v(&d.found));
        }
    }
    s += &links_text(r);
    s += &result_line(r, answered);
    s
}

fn links_text(r: &FleetReport) -> String {
    if r.links.is_empty() {
        return format!(
            "\npaths: not probed ({})\n",
            if r.topology == "none" { "--no-probe, or fewer than two nodes answered" } else { "no link" }
        );
    }
    let mut s = format!("\npaths ({}, each node probing the next with --peer's checks):\n", r.topology);
    let passed = r.links.iter().filter(|l| l.ok && !l.warning).count();
    // A large fleet's passing links are a count; its failures and warnings are each a line.
    let list_passed = passed <= MAX_PASS_LINES;
    for l in r.links.iter().filter(|l| list_passed || !l.ok || l.warning) {
        let tag = match (l.ok, l.warning) {
            (false, _) => "FAIL",
            (true, true) => "WARN",
            (true, false) => "PASS",
        };
        match &l.failed_layer {
            Some(layer) if !l.ok => s += &format!("  {tag}  {} -> {}: at {layer}: {}\n", l.from, l.to, l.detail),
            _ => s += &format!("  {tag}  {} -> {}: {}\n", l.from, l.to, l.detail),
        }
        if !l.ok || l.warning {
            l.fix.iter().for_each(|f| s += &format!("        fix (advice, not run): {f}\n"));
        }
    }
    if !list_passed {
        s += &format!("  PASS  {passed} other link(s) (--json lists each)\n");
    }
    let bad: Vec<String> = r
        .links
        .iter()
        .filter(|l| !l.ok)
        .map(|l| format!("{} -> {} ({})", l.from, l.to, l.failed_layer.as_deref().unwrap_or("?")))
        .collect();
    if !bad.is_empty() {
        s += &format!("bad link(s): {}\n", bad.join(", "));
    }
    for n in &r.suspects {
        s += &format!("every probed link of {n} failed while others passed: look at {n} first\n");
    }
    s
}

fn result_line(r: &FleetReport, answered: usize) -> String {
    let mut problems = Vec::new();
    let silent = r.nodes.len() - answered;
    if silent > 0 {
        problems.push(format!("{silent} node(s) without a usable answer"));
    }
    let failed_nodes = r.nodes.iter().filter(|n| !n.failed_layers.is_empty()).count();
    if failed_nodes > 0 {
        problems.push(format!("{failed_nodes} node(s) whose diagnosis failed"));
    }
    // The collector's own judgment of each node's ports (below its peers' rate, not up).
    let failed_ports = r.layers.iter().filter(|l| l.outcome == Outcome::Fail).count();
    if failed_ports > 0 {
        problems.push(format!("{failed_ports} device(s) whose link failed"));
    }
    let bad_links = r.links.iter().filter(|l| !l.ok).count();
    if bad_links > 0 {
        problems.push(format!("{bad_links} bad link(s)"));
    }
    if !r.differences.is_empty() {
        problems.push(format!("the nodes differ in {} field(s)", r.differences.len()));
    }
    if !r.baseline_drift.is_empty() {
        problems.push(format!("{} field(s) drifted from the saved baseline", r.baseline_drift.len()));
    }
    if !r.findings.is_empty() {
        problems.push(format!("{} known-bad combination(s)", r.findings.len()));
    }
    let why = if problems.is_empty() {
        match r.status {
            Status::Warnings => "every node answered and agrees, with warnings".to_owned(),
            _ => "every node answered, the nodes agree and every probed path works".to_owned(),
        }
    } else {
        problems.join("; ")
    };
    format!("Result: {why} (exit {})\n", r.exit_code)
}

#[cfg(test)]
mod tests {
    use super::column;

    #[test]
    fn baseline_fields_map_to_their_column_of_the_right_row() {
        assert_eq!(column("kernel.release", "x", "1"), Some("kernel"));
        assert_eq!(column("libraries.rdma-core.version", "x", "1"), Some("rdma-core"));
        assert_eq!(column("devices.rxe0.fw_ver", "rxe0", "1"), Some("firmware"));
        assert_eq!(column("devices.rxe0.fw_ver", "rxe1", "1"), None);
        assert_eq!(column("devices.rxe0.ports.1.netdev.mtu", "rxe0", "1"), Some("mtu"));
        assert_eq!(column("devices.rxe0.ports.1.active_mtu", "rxe0", "2"), None);
        assert_eq!(column("devices.mlx5_0.kernel_driver.version", "mlx5_0", "1"), Some("driver"));
        assert_eq!(column("modules.rdma_ucm.state", "mlx5_0", "1"), None);
    }
}
