//! The port layer: each checked port ACTIVE, and if not, why (its physical state, the
//! netdev under it, the cable).

use crate::model::layer::Layer;
use crate::model::layer::LayerReport;

use crate::model::report::PortFacts;

pub(crate) fn port_state(name: &str, ports: &[(&String, &PortFacts)]) -> LayerReport {
    if ports.is_empty() {
        return LayerReport::fail(
            name,
            Layer::Port,
            "no port to check",
            vec![],
            vec![format!("ibv_devinfo -d {name} lists the ports")],
        )
        .with_command(format!("ibv_devinfo -d {name}"));
    }
    let mut evidence = Vec::new();
    for (n, p) in ports {
        let netdev = p.netdev.as_ref().map(|nd| {
            format!(
                ", netdev {} operstate {}{}",
                nd.name,
                nd.operstate,
                if nd.admin_up { "" } else { " (administratively down)" }
            )
        });
        evidence.push(format!(
            "port {n}: state {}, phys_state {}{}",
            p.state,
            p.phys_state,
            netdev.unwrap_or_default()
        ));
    }
    let Some((n, p)) = ports.iter().find(|(_, p)| p.state != "ACTIVE") else {
        return LayerReport::pass(name, Layer::Port, "every port checked is ACTIVE", evidence);
    };
    let mut fix = Vec::new();
    let mut command = format!("ibstat {name} {n}");
    if p.link_layer == "Ethernet" {
        command = format!("rdma link show {name}/{n}");
        if let Some(nd) = &p.netdev {
            command = format!("ethtool {}", nd.name);
            if nd.admin_up {
                fix.push(format!(
                    "{} is administratively up but has no link (operstate {}): check the cable, the transceiver and the peer's switch port: ethtool {}",
                    nd.name, nd.operstate, nd.name
                ));
            } else {
                command = format!("ip link set {} up", nd.name);
                fix.push(format!("ip link set {} up", nd.name));
                fix.push(format!("then check the cable and the switch port: ethtool {}", nd.name));
            }
        }
    } else if p.state == "INIT" || p.state == "ARMED" {
        command = "systemctl start opensm".into();
        fix.push(
            "the port waits for a subnet manager: start one (systemctl start opensm) or enable the switch's SM".into(),
        );
    } else {
        fix.push("check the cable and the switch port: ibstat, ibportstate".into());
    }
    LayerReport::fail(
        name,
        Layer::Port,
        format!("port {n} is {} (phys_state {})", p.state, p.phys_state),
        evidence,
        fix,
    )
    .with_command(command)
}
