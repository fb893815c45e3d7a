//! The link layer: a port that is up but runs below the rate it should (the reference
//! named: the command line, a saved baseline, the netdev's speed, a sibling port), or
//! whose carrier is lost.

use crate::model::layer::Layer;
use crate::model::layer::LayerReport;
use crate::model::layer::RateRef;

use crate::model::report::PortFacts;

/// The link layer of `ports`: each is LinkUp, at `expected(port)` or more where that
/// gives a rate. `name` is the scope of the report.
pub(crate) fn link(
    name: &str,
    ports: &[(&String, &PortFacts)],
    expected: &dyn Fn(&str) -> Option<RateRef>,
) -> LayerReport {
    let mut evidence = Vec::new();
    let mut compared = Vec::new();
    for (n, p) in ports {
        let rate = format!("{} {} = {} Gb/s", p.width, p.speed, p.rate_gbps);
        evidence.push(format!("port {n}: phys_state {}, {rate}", p.phys_state));
        if p.phys_state != "LinkUp" {
            return LayerReport::fail(
                name,
                Layer::Link,
                format!("port {n} is {} but its physical state is {}, not LinkUp", p.state, p.phys_state),
                evidence,
                vec![format!(
                    "check the cable, the transceiver and the switch port; the negotiated link: {}",
                    link_command(name, n, p)
                )],
            )
            .with_command(link_command(name, n, p));
        }
        let Some(want) = expected(n) else { continue };
        evidence.push(format!("expected {} Gb/s: {}", want.gbps, want.from));
        if p.rate_gbps + 0.01 < want.gbps {
            return degraded(name, n, p, &want, evidence).with_command(link_command(name, n, p));
        }
        compared.push(format!("port {n}: {}", want.from));
    }
    let summary = if compared.is_empty() {
        "physical link up (rate not compared: no --expect-rate, saved baseline, netdev speed or sibling port)"
            .to_owned()
    } else {
        format!("physical link up at the expected rate ({})", compared.join("; "))
    };
    LayerReport::pass(name, Layer::Link, summary, evidence)
}

/// What shows a port's negotiated link: `ethtool` on its netdev, else `ibstat`.
pub(crate) fn link_command(name: &str, port: &str, p: &PortFacts) -> String {
    match &p.netdev {
        Some(nd) => format!("ethtool {}", nd.name),
        None => format!("ibstat {name} {port}"),
    }
}

pub(crate) fn degraded(name: &str, port: &str, p: &PortFacts, want: &RateRef, evidence: Vec<String>) -> LayerReport {
    let rate = p.rate_gbps;
    LayerReport::fail(
        name,
        Layer::Link,
        format!(
            "port {port} runs at {rate} Gb/s, below the expected {} Gb/s ({}): a degraded link",
            want.gbps, want.from
        ),
        evidence,
        vec![
            "reseat or replace the cable or transceiver; check the switch port's speed and errors".into(),
            format!("the negotiated and supported speeds: {}", link_command(name, port, p)),
        ],
    )
}
