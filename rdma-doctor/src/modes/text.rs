//! The readable report.

use std::fmt::Write as _;

use crate::model::layer::{human, Outcome};
use crate::model::report::{Report, Severity, Status};

/// Renders `r` for a person: the verdict at a glance (one line a layer, worst first), then versions,
/// devices and ports, the kernel log, the verdict with its evidence, findings, drift and
/// the result.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let b = &r.baseline;
    let lib = |n: &str| b.libraries.get(n).and_then(|l| l.version.clone()).unwrap_or_else(|| "?".into());
    let _ = writeln!(
        s,
        "rdma-doctor on {} (kernel {}, rdma-core {}) by {}",
        r.host.hostname,
        b.kernel.release,
        lib("rdma-core"),
        r.tool
    );
    s += &at_a_glance(r);
    s += "\nVersions\n";
    let _ = writeln!(s, "  {:<16} {} ({} {})", "kernel", b.kernel.release, b.kernel.machine, b.kernel.version);
    for (name, v) in &b.libraries {
        let _ = writeln!(s, "  {:<16} {:<12} from {}", name, v.version.as_deref().unwrap_or("unknown"), v.source);
    }
    let pkgs: Vec<String> = b.packages.versions.iter().map(|(n, v)| format!("{n} {v}")).collect();
    let manager = b.packages.manager.as_deref().unwrap_or("no package database");
    let _ = writeln!(
        s,
        "  {:<16} {}",
        format!("packages ({manager})"),
        if pkgs.is_empty() { "none found".into() } else { pkgs.join(", ") }
    );
    let mods: Vec<String> = b
        .modules
        .iter()
        .map(|(n, m)| match &m.version {
            Some(v) => format!("{n} {} v{v}", m.state),
            None => format!("{n} {}", m.state),
        })
        .collect();
    let _ = writeln!(s, "  {:<16} {}", "modules", if mods.is_empty() { "none".into() } else { mods.join(", ") });
    let lim = |v: Option<u64>| v.map_or_else(|| "unlimited".to_owned(), human);
    let _ = writeln!(
        s,
        "  {:<16} soft {}, hard {}{}",
        "memlock",
        lim(b.memlock.soft_bytes),
        lim(b.memlock.hard_bytes),
        if b.memlock.cap_ipc_lock { ", CAP_IPC_LOCK" } else { "" }
    );
    for (path, n) in &b.dev_nodes {
        let _ = writeln!(
            s,
            "  {:<16} {path} mode {} {}",
            "device node",
            n.mode,
            if n.can_open { "opens" } else { "does not open" }
        );
    }

    for (name, d) in &b.devices {
        let _ = writeln!(s, "\nDevice {name}");
        let driver = d.kernel_driver_name.as_deref().unwrap_or("unknown");
        let version = d.kernel_driver.version.as_deref().unwrap_or("in-tree");
        let _ = writeln!(s, "  {:<14} {driver} {version} ({})", "kernel driver", d.kernel_driver.source);
        match &d.provider {
            Some(p) => {
                let version = p.version.as_deref().map(|v| format!(" {v}")).unwrap_or_default();
                let _ = writeln!(s, "  {:<14} {}{version} ({})", "provider", p.name, p.library);
            }
            None => {
                let _ = writeln!(s, "  {:<14} {}", "provider", d.open_error.as_deref().unwrap_or("not identified"));
            }
        }
        let fw = if d.fw_ver.is_empty() { "none reported" } else { d.fw_ver.as_str() };
        let _ = writeln!(
            s,
            "  {:<14} {fw}, hw_ver {}, vendor {} part {}{}{}",
            "firmware",
            d.hw_ver.map_or("?".into(), |v| format!("{v:#x}")),
            d.vendor_id.as_deref().unwrap_or("?"),
            d.vendor_part_id.map_or("?".into(), |v| v.to_string()),
            d.hca_type.as_deref().map(|t| format!(", {t}")).unwrap_or_default(),
            d.board_id.as_deref().map(|t| format!(", board {t}")).unwrap_or_default(),
        );
        let _ =
            writeln!(s, "  {:<14} {} (system image {}), {}", "node GUID", d.node_guid, d.sys_image_guid, d.node_type);
        if let Some(u) = &d.uverbs {
            let _ = writeln!(s, "  {:<14} /dev/infiniband/{u}", "uverbs");
        }
        if let Some(p) = &d.parent_netdev {
            let _ = writeln!(s, "  {:<14} {p}", "on netdev");
        }
        for (n, p) in &d.ports {
            let _ = writeln!(
                s,
                "  port {n:<9} {} {} {}, {} {} = {} Gb/s, MTU {} (max {}), LID {}",
                p.state, p.phys_state, p.link_layer, p.width, p.speed, p.rate_gbps, p.active_mtu, p.max_mtu, p.lid
            );
            if let Some(nd) = &p.netdev {
                let _ = writeln!(
                    s,
                    "  {:<14} {} operstate {}{}, MTU {}",
                    "  netdev",
                    nd.name,
                    nd.operstate,
                    if nd.admin_up { "" } else { " (admin down)" },
                    nd.mtu.map_or("?".into(), |m| m.to_string())
                );
            }
            for (i, g) in &p.gids {
                let _ = writeln!(s, "    GID {i:<9} {:<40} {}", g.gid, g.gid_type);
            }
        }
    }

    let log = &r.observations.kernel_log;
    s += "\nKernel log (RDMA lines)\n";
    match &log.error {
        Some(e) => {
            let _ = writeln!(s, "  not readable: {e} (not a failure)");
        }
        None if log.lines.is_empty() => s += "  none\n",
        None => log.lines.iter().for_each(|l| {
            let _ = writeln!(s, "  {l}");
        }),
    }

    s += "\nVerdict in detail (top down; the first FAIL of each device is its diagnosis)\n";
    let width = r.layers.iter().map(|l| l.scope.len()).max().unwrap_or(0);
    for l in &r.layers {
        let mark = match l.outcome {
            Outcome::Pass => "PASS",
            Outcome::Fail => "FAIL",
            Outcome::Skipped => "skip",
        };
        let _ = writeln!(s, "  {mark}  {:<width$} {:<14} {}", l.scope, l.layer.name(), l.summary);
        if l.outcome == Outcome::Fail {
            l.evidence.iter().for_each(|e| {
                let _ = writeln!(s, "          evidence: {e}");
            });
            l.fix.iter().for_each(|f| {
                let _ = writeln!(s, "          fix (advice, not run): {f}");
            });
        }
    }

    if !r.findings.is_empty() {
        s += "\nFindings\n";
        for f in &r.findings {
            let sev = if f.severity == Severity::Warning { "warning" } else { "note" };
            let _ = writeln!(s, "  {sev} [{}] {}", f.scope, f.what);
            if let Some(a) = &f.advice {
                let _ = writeln!(s, "          advice (not run): {a}");
            }
            if let Some(src) = &f.source {
                let _ = writeln!(s, "          source: {src}");
            }
        }
    }

    if !r.drift.is_empty() {
        s += "\nDrift from the saved baseline\n";
        for d in &r.drift {
            let show =
                |v: &Option<serde_json::Value>| v.as_ref().map_or_else(|| "(absent)".to_owned(), |v| v.to_string());
            let _ = writeln!(s, "  {}: {} -> {}", d.field, show(&d.expected), show(&d.found));
        }
    }

    let first_fail = r.layers.iter().find(|l| l.outcome == Outcome::Fail);
    let why = match (r.status, first_fail) {
        (Status::LayerFailed, Some(l)) => format!("the {} layer failed on {}", l.layer.name(), l.scope),
        (Status::Drift, _) => format!("{} field(s) drifted from the baseline", r.drift.len()),
        (Status::Warnings, _) => "every layer passed, with warnings".into(),
        _ => "every layer passed".into(),
    };
    let _ = writeln!(s, "\nResult: {why} (exit {})", r.exit_code);
    s
}

/// How bad a line of the glance is: failures first, then warnings, drift, notes, passes,
/// skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Rank {
    Fail,
    Warn,
    Drift,
    Note,
    Pass,
    Skip,
}

/// One line per layer, per warning, per drifted field and per note, worst first (top down
/// within each kind): the mark, the scope, the layer, the one-line reason, and for a
/// failure the fix (or the check) as one command to paste. It opens the report so that the answer is on the first screen, above
/// the facts it was drawn from.
pub(crate) fn at_a_glance(r: &Report) -> String {
    let mut lines: Vec<(Rank, &str, &str, String)> = r
        .layers
        .iter()
        .map(|l| {
            let rank = match l.outcome {
                Outcome::Fail => Rank::Fail,
                Outcome::Pass => Rank::Pass,
                Outcome::Skipped => Rank::Skip,
            };
            let label = if l.command_is_check { "check" } else { "fix" };
            let fix = l.command.as_deref().map(|c| format!("  {label}: {c}")).unwrap_or_default();
            (rank, l.scope.as_str(), l.layer.name(), format!("{}{fix}", l.summary))
        })
        .collect();
    for f in &r.findings {
        let advice = f.advice.as_deref().map(|a| format!("  advice: {a}")).unwrap_or_default();
        let (rank, kind) = match f.severity {
            Severity::Warning => (Rank::Warn, "warning"),
            Severity::Note => (Rank::Note, "note"),
        };
        lines.push((rank, f.scope.as_str(), f.layer.map_or(kind, |l| l.name()), format!("{}{advice}", f.what)));
    }
    for d in &r.drift {
        let show = |v: &Option<serde_json::Value>| v.as_ref().map_or_else(|| "(absent)".to_owned(), |v| v.to_string());
        lines.push((
            Rank::Drift,
            "baseline",
            "drift",
            format!("{}: {} -> {}", d.field, show(&d.expected), show(&d.found)),
        ));
    }
    lines.sort_by_key(|(rank, ..)| *rank);
    let scope_width = lines.iter().map(|(_, scope, ..)| scope.len()).max().unwrap_or(0);
    let mut s =
        String::from("\nAt a glance (worst first; each fix or check is a command to paste, not run by the doctor)\n");
    for (rank, scope, layer, text) in lines {
        let mark = match rank {
            Rank::Fail => "FAIL",
            Rank::Warn => "WARN",
            Rank::Drift => "DRFT",
            Rank::Note => "note",
            Rank::Pass => "PASS",
            Rank::Skip => "skip",
        };
        let _ = writeln!(s, "  {mark}  {scope:<scope_width$}  {layer:<14} {text}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layer::{Layer, LayerReport};
    use crate::model::report::Finding;

    fn layer(scope: &str, layer: Layer, outcome: Outcome, summary: &str, command: Option<&str>) -> LayerReport {
        LayerReport {
            scope: scope.into(),
            layer,
            outcome,
            summary: summary.into(),
            evidence: vec!["seen".into()],
            fix: vec!["prose about the fix: ip link set dummy1 up".into()],
            command: command.map(Into::into),
            command_is_check: false,
        }
    }

    #[test]
    fn the_glance_lists_failures_then_warnings_then_the_rest_each_fix_a_bare_command() {
        let mut r: Report = serde_json::from_str(include_str!("../../testdata/node-a.json")).unwrap();
        r.layers = vec![
            layer("host", Layer::KernelModules, Outcome::Pass, "ib_core loaded", None),
            layer("rxe0", Layer::Port, Outcome::Pass, "every port checked is ACTIVE", None),
            layer("rxe1", Layer::Port, Outcome::Fail, "port 1 is DOWN", Some("ip link set dummy1 up")),
            layer("rxe1", Layer::Link, Outcome::Skipped, "not checked: the port layer failed", None),
        ];
        r.findings = vec![Finding {
            severity: Severity::Warning,
            scope: "rxe0".into(),
            what: "known-bad [x]: flagged".into(),
            advice: Some("update the firmware".into()),
            source: None,
            layer: Some(Layer::Device),
        }];
        let text = render(&r);
        let glance: Vec<&str> =
            text.lines().skip_while(|l| !l.starts_with("At a glance")).skip(1).take_while(|l| !l.is_empty()).collect();
        assert_eq!(
            glance,
            [
                "  FAIL  rxe1  port           port 1 is DOWN  fix: ip link set dummy1 up",
                "  WARN  rxe0  device         known-bad [x]: flagged  advice: update the firmware",
                "  PASS  host  kernel_modules ib_core loaded",
                "  PASS  rxe0  port           every port checked is ACTIVE",
                "  skip  rxe1  link           not checked: the port layer failed",
            ],
            "{text}"
        );
        let at = |needle: &str| text.find(needle).unwrap_or_else(|| panic!("{needle} in {text}"));
        assert!(at("At a glance") < at("\nVersions"), "the glance opens the report");
    }

    #[test]
    fn drift_and_notes_reach_the_glance_after_warnings_and_checks_are_labelled() {
        let mut r: Report = serde_json::from_str(include_str!("../../testdata/node-a.json")).unwrap();
        let mut link =
            layer("mlx5_0", Layer::Link, Outcome::Fail, "port 1 runs at 100 Gb/s", Some("ethtool ens1f0np0"));
        link.command_is_check = true;
        r.layers = vec![layer("host", Layer::KernelModules, Outcome::Pass, "ib_core loaded", None), link];
        let note = |what: &str| Finding {
            severity: Severity::Note,
            scope: "host".into(),
            what: what.into(),
            advice: None,
            source: None,
            layer: None,
        };
        r.findings = vec![
            note("kernel log: mlx5_core 0000:03:00.0: timeout event on QP 0x1a2b [the device timed out a QP]"),
            note("kernel log: mlx5_ib: probe failed with error -16 [EBUSY]"),
        ];
        r.drift = vec![crate::model::report::Drift {
            field: "devices.mlx5_0.fw_ver".into(),
            expected: Some(serde_json::json!("22.27.0090")),
            found: Some(serde_json::json!("22.26.1040")),
        }];
        let text = render(&r);
        let glance: Vec<&str> =
            text.lines().skip_while(|l| !l.starts_with("At a glance")).skip(1).take_while(|l| !l.is_empty()).collect();
        assert_eq!(glance.len(), 5, "{text}");
        assert!(
            glance[0].starts_with("  FAIL  mlx5_0") && glance[0].ends_with("check: ethtool ens1f0np0"),
            "{glance:#?}"
        );
        assert!(
            glance[1].contains("DRFT") && glance[1].contains("devices.mlx5_0.fw_ver: \"22.27.0090\" -> \"22.26.1040\""),
            "{glance:#?}"
        );
        assert!(glance[2].contains("note") && glance[2].contains("timeout event on QP"), "{glance:#?}");
        assert!(glance[3].contains("error -16"), "{glance:#?}");
        assert!(glance[4].starts_with("  PASS  host"), "{glance:#?}");
    }
}
