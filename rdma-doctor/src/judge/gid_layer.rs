//! The gid layer: a RoCE port needs a RoCE v2 GID with an IPv4 address (the netdev under
//! it up and addressed); an iWARP port has no RoCE GID and is reached over TCP at an IPv4
//! address of its netdev, through rdma_cm only.

use crate::model::layer::Layer;
use crate::model::layer::LayerReport;

use crate::model::report::{DeviceFacts, PortFacts};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// The gid layer of `ports`; `known(port)` is the IPv4 address a saved baseline had on a
/// port, to fill the fix with.
pub(crate) fn gid(name: &str, ports: &[(&String, &PortFacts)], known: &dyn Fn(&str) -> Option<String>) -> LayerReport {
    let mut evidence = Vec::new();
    for (n, p) in ports {
        if p.link_layer != "Ethernet" {
            evidence.push(format!("port {n}: {}, addressed by LID {}", p.link_layer, p.lid));
            continue;
        }
        let v2 = |g: &&crate::model::report::GidFacts| g.gid_type == "RoCE v2";
        let v4 = p.gids.iter().find(|(_, g)| v2(g) && g.gid.starts_with("::ffff:"));
        let v6 = p.gids.iter().find(|(_, g)| v2(g) && !g.gid.starts_with("fe80:") && !g.gid.starts_with("::ffff:"));
        match (v4, v6) {
            (Some((i, g)), _) => evidence.push(format!("port {n}: RoCE v2 GID index {i} {}", g.gid)),
            (None, Some((i, g))) => {
                evidence.push(format!("port {n}: no IPv4 RoCE v2 GID; IPv6 RoCE v2 GID index {i} {}", g.gid))
            }
            (None, None) => {
                let netdev = p.netdev.as_ref().map_or("the netdev", |nd| nd.name.as_str());
                let dev = p.netdev.as_ref().map_or("<netdev>", |nd| nd.name.as_str());
                evidence.extend(p.gids.iter().map(|(i, g)| format!("port {n}: GID {i} {} {}", g.gid, g.gid_type)));
                let address = known(n);
                if let Some(a) = &address {
                    evidence.push(format!("the saved baseline had {a} on port {n}"));
                }
                let (prose, command) = match &address {
                    Some(a) => (format!("{a}/PREFIX"), format!("{a}/<prefix>")),
                    None => ("ADDRESS/PREFIX".to_owned(), "<address>/<prefix>".to_owned()),
                };
                return LayerReport::fail(
                    name,
                    Layer::Gid,
                    format!("port {n}: no RoCE v2 GID with an IPv4 address ({netdev} has no IPv4 address)"),
                    evidence,
                    vec![format!("ip addr add {prose} dev {netdev}   # the GID appears with the address")],
                )
                .with_command(format!("ip addr add {command} dev {dev}"));
            }
        }
    }
    LayerReport::pass(name, Layer::Gid, "addressable", evidence)
}

/// Whether `d` is an iWARP device: node type RNIC (sysfs `node_type` `4: RNIC`).
pub(crate) fn is_iwarp(d: &DeviceFacts) -> bool {
    d.node_type == "RNIC"
}

/// Why an iWARP device's loopback and rdma_cm checks did not run.
pub(crate) const NO_IWARP_ADDRESS: &str =
    "not run: iWARP connects only through rdma_cm over TCP, and no IPv4 address of the netdev under it is known";

/// The first checked iWARP port whose netdev has an IPv4 address: the port, the netdev
/// and the address.
pub(crate) fn iwarp_ip<'a>(
    ports: &[(&'a String, &PortFacts)],
    addresses: &BTreeMap<String, Vec<Ipv4Addr>>,
) -> Option<(&'a str, String, Ipv4Addr)> {
    ports.iter().find_map(|(n, p)| {
        let nd = p.netdev.as_ref()?;
        let ip = addresses.get(&nd.name)?.first()?;
        Some((n.as_str(), nd.name.clone(), *ip))
    })
}

/// The gid layer of an iWARP device: it has no RoCE GID to check (its GID is its netdev's
/// MAC); it is reached over TCP at an IP address of the netdev under it, which must have
/// one.
pub(crate) fn iwarp_address(
    name: &str,
    ports: &[(&String, &PortFacts)],
    addresses: &BTreeMap<String, Vec<Ipv4Addr>>,
) -> LayerReport {
    let mut evidence = Vec::new();
    let mut reached = None;
    for (n, p) in ports {
        let Some(nd) = &p.netdev else {
            evidence.push(format!("port {n}: iWARP; the netdev under it was not identified"));
            continue;
        };
        match addresses.get(&nd.name).filter(|a| !a.is_empty()) {
            Some(a) => {
                let list: Vec<String> = a.iter().map(ToString::to_string).collect();
                evidence.push(format!("port {n}: iWARP on {}, IPv4 {}", nd.name, list.join(", ")));
                reached.get_or_insert((nd.name.clone(), a[0]));
            }
            None => {
                evidence.push(format!("port {n}: iWARP on {}, which has no IPv4 address", nd.name));
                return LayerReport::fail(
                    name,
                    Layer::Gid,
                    format!(
                        "port {n}: iWARP connects over TCP to its netdev's IP address, and {} has no IPv4 address",
                        nd.name
                    ),
                    evidence,
                    vec![format!("ip addr add ADDRESS/PREFIX dev {}   # rdma_cm reaches the device there", nd.name)],
                )
                .with_command(format!("ip addr add <address>/<prefix> dev {}", nd.name));
            }
        }
    }
    let summary = match reached {
        Some((netdev, ip)) => {
            format!("iWARP (no RoCE GID, no UDP 4791): reached over TCP through rdma_cm at {ip} on {netdev}")
        }
        None => "iWARP (no RoCE GID): the netdev under it was not identified, its address not checked".to_owned(),
    };
    LayerReport::pass(name, Layer::Gid, summary, evidence)
}

/// `rping` server and client on `ip`: the reference check of an iWARP device, which
/// connects through rdma_cm only (`ibv_rc_pingpong` cannot connect it).
pub(crate) fn rping(ip: Ipv4Addr) -> String {
    format!("rping -s -a {ip} -C 1 -v & sleep 1; rping -c -a {ip} -C 1 -v")
}
