//! The rate a port should run at when nobody said (`--expect-rate`) and no saved baseline
//! has it: one rule per kind of device, named in every verdict that uses it.
//!
//! - **Soft RoCE and soft iWARP (rxe, siw)**: the kernel gives such a port the rate it
//!   maps its netdev's speed to (`ib_get_eth_speed` in drivers/infiniband/core/verbs.c):
//!   up to 1 Gb/s, or unknown (a dummy netdev), 1X SDR 2.5 Gb/s; up to 10, 1X FDR10
//!   10 Gb/s; up to 20, 4X DDR 20 Gb/s; up to 25, 1X EDR 25 Gb/s; up to 40, 4X FDR10
//!   40 Gb/s; above 40, 4X EDR 100 Gb/s (kernels from 6.7 map by the netdev's lanes, which
//!   gives its own speed there: the lower of the two is expected). The speed mapped is
//!   the netdev's *reference* speed (below), so an rxe on a bond that lost a leg, or on a
//!   NIC that came up slow, is degraded, while a healthy rxe on a slow netdev is not.
//!   Every rxe reports vendor part 0: two rxe devices are never one model to compare.
//! - **A bond** (`/sys/class/net/NAME/bonding/slaves`): the sum of its legs' reference
//!   speeds (the fastest one in active-backup mode, where one leg carries the traffic), a
//!   leg with none taken as its fellows': not the bond's current speed, which drops with a
//!   lost leg.
//! - **Another netdev**: the fastest mode it and its link partner both advertise; where
//!   the partner's modes are unknown, the fastest mode it supports ([`crate::facts::ethtool`]);
//!   for a netdev with no link modes (virtual), its speed.
//! - **Hardware ports** take the highest of: the reference speed of their netdev (RoCE),
//!   its current speed, and the fastest active sibling port of the same model (vendor part
//!   id, not 0) and link layer among the devices examined.

use std::collections::BTreeMap;

use crate::facts::ethtool::LinkModes;
use crate::facts::netdevs::Netdevs;
use crate::model::layer::RateRef;
use crate::model::report::DeviceFacts;

/// A (device, port) key of [`crate::judge::verdict::Expectations::expected_rate`].
pub type PortKey = (String, String);

/// A netdev's reference speed: Gb/s and how it was found.
#[derive(Debug, Clone, PartialEq)]
struct NetRef {
    gbps: f64,
    how: String,
}

/// The reference speed of netdev `name` (see the module docs); `None` when nothing
/// gives one.
fn netdev_reference(name: &str, netdevs: &Netdevs<'_>) -> Option<NetRef> {
    let Some(bond) = (netdevs.bond)(name) else { return leg_reference(name, netdevs) };
    let refs: Vec<(&String, Option<NetRef>)> = bond.legs.iter().map(|l| (l, leg_reference(l, netdevs))).collect();
    let known = refs
        .iter()
        .filter_map(|(_, r)| r.as_ref().map(|r| r.gbps))
        .fold(None, |m: Option<f64>, g| Some(m.map_or(g, |m| m.max(g))))?;
    let parts: Vec<String> = refs
        .iter()
        .map(|(leg, r)| match r {
            Some(r) => format!("{leg} {} Gb/s ({})", r.gbps, r.how),
            None => format!("{leg} {known} Gb/s (none of its own: its fellow legs')"),
        })
        .collect();
    let each: Vec<f64> = refs.iter().map(|(_, r)| r.as_ref().map_or(known, |r| r.gbps)).collect();
    if bond.mode == "active-backup" {
        let best = each.iter().copied().fold(0.0, f64::max);
        let how = format!("bond {name} in active-backup mode: its fastest leg of {}", parts.join(", "));
        return Some(NetRef { gbps: best, how });
    }
    let sum: f64 = each.iter().sum();
    Some(NetRef { gbps: sum, how: format!("bond {name}: the sum of its legs' {}", parts.join(" + ")) })
}

/// The reference speed of a netdev that is not a bond: the fastest mode both ends
/// advertise, else the fastest it supports, else (no link modes) its speed.
fn leg_reference(name: &str, netdevs: &Netdevs<'_>) -> Option<NetRef> {
    let modes = (netdevs.link_modes)(name);
    if let Some((mode, mbps)) = modes.as_ref().and_then(LinkModes::common_top) {
        let how = format!("the fastest mode {name} and its link partner both advertise, {mode}");
        return Some(NetRef { gbps: f64::from(mbps) / 1000.0, how });
    }
    if let Some((mode, mbps)) = modes.as_ref().and_then(LinkModes::supported_top) {
        return Some(NetRef {
            gbps: f64::from(mbps) / 1000.0,
            how: format!("the fastest mode {name} supports, {mode}"),
        });
    }
    let gbps = (netdevs.speed_gbps)(name).filter(|g| g.is_finite() && *g > 0.0)?;
    Some(NetRef { gbps, how: format!("the speed of {name}") })
}

/// The rate the kernel gives a soft RoCE or iWARP port on a netdev of `gbps` (`None`:
/// unknown), as (width and speed, Gb/s): `ib_get_eth_speed`'s table, and above 40 Gb/s
/// the lower of 4X EDR and the speed itself (kernels from 6.7 map by lanes there).
pub fn soft_port_rate(gbps: Option<f64>) -> (&'static str, f64) {
    let mbps = gbps.map_or(1000.0, |g| g * 1000.0);
    match mbps {
        m if m <= 1000.0 => ("1X SDR", 2.5),
        m if m <= 10_000.0 => ("1X FDR10", 10.0),
        m if m <= 20_000.0 => ("4X DDR", 20.0),
        m if m <= 25_000.0 => ("1X EDR", 25.0),
        m if m <= 40_000.0 => ("4X FDR10", 40.0),
        m if m < 100_000.0 => ("at least its own speed (4X EDR before 6.7)", m / 1000.0),
        _ => ("4X EDR", 100.0),
    }
}

/// Whether `d` is a soft device (rxe, siw): its rate is the kernel's mapping of its
/// netdev's speed, and it has no model to share with a sibling.
pub fn is_soft(d: &DeviceFacts) -> bool {
    let driver = d.kernel_driver_name.as_deref();
    let provider = d.provider.as_ref().map(|p| p.name.as_str());
    matches!(driver, Some("rdma_rxe" | "siw")) || matches!(provider, Some("rxe" | "siw"))
}

/// The derived reference of each port of `devices` that has one.
pub fn derived(devices: &BTreeMap<String, DeviceFacts>, netdevs: &Netdevs<'_>) -> BTreeMap<PortKey, RateRef> {
    let mut out = BTreeMap::new();
    for (name, d) in devices {
        for (port, p) in &d.ports {
            let best = if is_soft(d) {
                soft_reference(d, p.netdev.as_ref().map(|nd| nd.name.as_str()), netdevs)
            } else {
                hardware_reference(devices, name, port, d, netdevs)
            };
            if let Some(r) = best {
                out.insert((name.clone(), port.clone()), r);
            }
        }
    }
    out
}

/// rxe's and siw's rule: the kernel's mapping of the reference speed of their netdev.
fn soft_reference(d: &DeviceFacts, netdev: Option<&str>, netdevs: &Netdevs<'_>) -> Option<RateRef> {
    let kind = if d.kernel_driver_name.as_deref() == Some("siw") { "siw" } else { "rxe" };
    let netdev = netdev.or(d.parent_netdev.as_deref())?;
    let reference = netdev_reference(netdev, netdevs);
    let (mapped, gbps) = soft_port_rate(reference.as_ref().map(|r| r.gbps));
    let of = match &reference {
        Some(r) => format!("{netdev} at {} Gb/s ({})", r.gbps, r.how),
        None => format!("{netdev} has no speed (a dummy or virtual netdev: the kernel takes 1 Gb/s)"),
    };
    let from =
        format!("{kind}'s rule, the kernel's mapping of its netdev's reference speed: {of} gives {mapped} {gbps} Gb/s");
    Some(RateRef { gbps, from })
}

/// The hardware rule: the highest of the netdev's reference and current speeds and the
/// fastest sibling of the same model.
fn hardware_reference(
    devices: &BTreeMap<String, DeviceFacts>,
    name: &str,
    port: &str,
    d: &DeviceFacts,
    netdevs: &Netdevs<'_>,
) -> Option<RateRef> {
    let p = d.ports.get(port)?;
    let by_netdev = p.netdev.as_ref().and_then(|nd| {
        let gbps = (netdevs.speed_gbps)(&nd.name).filter(|g| g.is_finite() && *g > 0.0)?;
        Some(RateRef { gbps, from: format!("the hardware rule, the speed of its netdev {} ({gbps} Gb/s)", nd.name) })
    });
    let by_reference = p.netdev.as_ref().and_then(|nd| {
        let r = netdev_reference(&nd.name, netdevs)?;
        Some(RateRef { gbps: r.gbps, from: format!("the hardware rule, {}", r.how) })
    });
    let by_sibling = fastest_sibling(devices, name, port, d);
    // On a tie the later one is named: the plainest reference.
    let candidates = [by_reference, by_netdev, by_sibling];
    candidates.into_iter().flatten().max_by(|a, b| a.gbps.total_cmp(&b.gbps))
}

/// The fastest ACTIVE port of another hardware device of the same model (vendor part id,
/// not 0: every rxe reports 0) and link layer, or another port of the same device.
fn fastest_sibling(
    devices: &BTreeMap<String, DeviceFacts>,
    name: &str,
    port: &str,
    d: &DeviceFacts,
) -> Option<RateRef> {
    let model = d.vendor_part_id.filter(|m| *m != 0)?;
    let link_layer = &d.ports.get(port)?.link_layer;
    devices
        .iter()
        .filter(|(_, o)| o.vendor_part_id == Some(model) && !is_soft(o))
        .flat_map(|(o, od)| od.ports.iter().map(move |(op, pp)| (o, op, pp)))
        .filter(|(o, op, pp)| {
            (o.as_str(), op.as_str()) != (name, port) && pp.state == "ACTIVE" && &pp.link_layer == link_layer
        })
        .filter(|(_, _, pp)| pp.rate_gbps.is_finite() && pp.rate_gbps > 0.0)
        .max_by(|a, b| a.2.rate_gbps.total_cmp(&b.2.rate_gbps))
        .map(|(o, op, pp)| RateRef {
            gbps: pp.rate_gbps,
            from: format!(
                "the hardware rule, its sibling {o} port {op} of the same model (vendor part {model}) at {} Gb/s",
                pp.rate_gbps
            ),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::netdevs::Bond;
    use crate::judge::verdict::{evaluate, Expectations};
    use crate::model::layer::{Layer, Outcome};
    use crate::model::report::{DeviceFacts, Observations, Report};

    fn fixture() -> crate::model::report::Baseline {
        let r: Report = serde_json::from_str(include_str!("../../testdata/node-a.json")).unwrap();
        r.baseline
    }

    /// The link layer of `name` with the derived references (`netdev` speeds in Gb/s).
    fn link_of(
        b: &crate::model::report::Baseline,
        name: &str,
        netdev: Option<f64>,
    ) -> crate::model::layer::LayerReport {
        link_with_modes(b, name, netdev, None)
    }

    fn link_with_modes(
        b: &crate::model::report::Baseline,
        name: &str,
        netdev: Option<f64>,
        modes: Option<LinkModes>,
    ) -> crate::model::layer::LayerReport {
        let netdevs = Netdevs { speed_gbps: &|_| netdev, link_modes: &|_| modes.clone(), bond: &|_| None };
        let want = Expectations {
            devices: vec![name.into()],
            expected_rate: derived(&b.devices, &netdevs),
            ..Default::default()
        };
        let seen = Observations { sysfs_devices: b.devices.keys().cloned().collect(), ..Observations::default() };
        let (layers, _) = evaluate(b, &seen, &want, &mut crate::judge::verdict::Probes::none());
        layers.into_iter().find(|l| l.layer == Layer::Link).unwrap()
    }

    #[test]
    fn a_port_slower_than_its_netdev_fails_naming_the_netdev_as_the_reference() {
        let mut b = fixture();
        b.devices.get_mut("mlx5_0").unwrap().ports.get_mut("1").unwrap().rate_gbps = 100.0;
        let l = link_of(&b, "mlx5_0", Some(200.0));
        assert_eq!(l.outcome, Outcome::Fail, "{l:#?}");
        assert!(
            l.summary.contains(
                "below the expected 200 Gb/s (the hardware rule, the speed of its netdev ens1f0np0 (200 Gb/s))"
            ),
            "{l:#?}"
        );
    }

    #[test]
    fn a_port_slower_than_its_sibling_of_the_same_model_fails_naming_the_sibling() {
        let mut b = fixture();
        let mut slow = b.devices["mlx5_0"].clone();
        slow.ports.get_mut("1").unwrap().rate_gbps = 50.0;
        b.devices.insert("mlx5_1".into(), slow);
        let l = link_of(&b, "mlx5_1", None);
        assert_eq!(l.outcome, Outcome::Fail, "{l:#?}");
        assert!(
            l.summary.contains(
                "the hardware rule, its sibling mlx5_0 port 1 of the same model (vendor part 4125) at 200 Gb/s"
            ),
            "{l:#?}"
        );
        // The fast one passes, and says what it was compared with.
        let l = link_of(&b, "mlx5_0", None);
        assert_eq!(l.outcome, Outcome::Pass, "{l:#?}");
        assert!(l.summary.contains("sibling mlx5_1 port 1"), "{l:#?}");
    }

    /// Link modes as `ETHTOOL_GLINKSETTINGS` reports them (three words a mask).
    fn modes(autoneg: bool, ours: &[u32], partner: &[u32]) -> LinkModes {
        let mask = |bits: &[u32]| {
            let mut words = vec![0u32; 3];
            bits.iter().for_each(|b| words[(b / 32) as usize] |= 1 << (b % 32));
            words
        };
        LinkModes { autoneg, supported: mask(ours), advertising: mask(ours), lp_advertising: mask(partner) }
    }

    #[test]
    fn a_roce_port_below_the_mode_both_ends_advertise_fails_even_when_its_netdev_agrees() {
        // A 200 Gb/s NIC (fixture) whose link came up at 100 Gb/s, the netdev saying 100
        // too; the NIC and its partner both advertise 25G (bit 31) and 56G CR4 (bit 28).
        let mut b = fixture();
        b.devices.get_mut("mlx5_0").unwrap().ports.get_mut("1").unwrap().rate_gbps = 25.0;
        let l = link_with_modes(&b, "mlx5_0", Some(25.0), Some(modes(true, &[31, 28], &[31, 28])));
        assert_eq!(l.outcome, Outcome::Fail, "{l:#?}");
        let want = "below the expected 56 Gb/s (the hardware rule, the fastest mode ens1f0np0 and its link partner \
                    both advertise, 56000baseCR4/Full)";
        assert!(l.summary.contains(want), "{l:#?}");
        // The partner advertises 25G only (a breakout): 25 is the rate, and it passes.
        let l = link_with_modes(&b, "mlx5_0", Some(25.0), Some(modes(true, &[31, 28], &[31])));
        assert_eq!(l.outcome, Outcome::Pass, "{l:#?}");
    }

    #[test]
    fn a_nic_forced_below_its_supported_speed_fails_with_no_baseline() {
        // A 100G NIC (25G bit 31, 100G CR4 bit 38) forced to 25G: no autonegotiation, so
        // no common mode; its netdev says 25, the port runs at 25. It supports 100G.
        let mut b = fixture();
        b.devices.get_mut("mlx5_0").unwrap().ports.get_mut("1").unwrap().rate_gbps = 25.0;
        for m in [modes(false, &[31, 38], &[31, 38]), modes(true, &[31, 38], &[])] {
            let l = link_with_modes(&b, "mlx5_0", Some(25.0), Some(m));
            assert_eq!(l.outcome, Outcome::Fail, "{l:#?}");
            let want = "below the expected 100 Gb/s (the hardware rule, the fastest mode ens1f0np0 supports, \
                        100000baseCR4/Full)";
            assert!(l.summary.contains(want), "{l:#?}");
        }
    }

    /// An rxe device on netdev `netdev` whose port runs at `rate` Gb/s (from the fixture).
    fn rxe(netdev: &str, rate: f64) -> DeviceFacts {
        let mut d = fixture().devices["mlx5_0"].clone();
        d.kernel_driver_name = Some("rdma_rxe".into());
        d.vendor_part_id = Some(0);
        d.parent_netdev = Some(netdev.into());
        let p = d.ports.get_mut("1").unwrap();
        p.rate_gbps = rate;
        p.netdev.as_mut().unwrap().name = netdev.into();
        d
    }

    /// The link layer of `name` among `devices`, with netdev speeds and bonds as given.
    fn soft_link(
        devices: &[(&str, DeviceFacts)],
        name: &str,
        speeds: &dyn Fn(&str) -> Option<f64>,
        bonds: &dyn Fn(&str) -> Option<Bond>,
    ) -> crate::model::layer::LayerReport {
        let mut b = fixture();
        b.devices = devices.iter().map(|(n, d)| (n.to_string(), d.clone())).collect();
        let netdevs = Netdevs { speed_gbps: speeds, link_modes: &|_| None, bond: bonds };
        let want = Expectations {
            devices: vec![name.into()],
            expected_rate: derived(&b.devices, &netdevs),
            ..Default::default()
        };
        let seen = Observations { sysfs_devices: b.devices.keys().cloned().collect(), ..Observations::default() };
        let (layers, _) = evaluate(&b, &seen, &want, &mut crate::judge::verdict::Probes::none());
        layers.into_iter().find(|l| l.layer == Layer::Link && l.scope == name).unwrap()
    }

    #[test]
    fn rxe_is_judged_by_the_kernels_mapping_of_its_netdevs_speed_never_by_another_rxe() {
        let speeds = |n: &str| match n {
            "veth0" => Some(10.0),
            "fast0" => Some(200.0),
            _ => None, // dummy0: no speed
        };
        let devices = [("rxe0", rxe("veth0", 10.0)), ("rxe1", rxe("dummy0", 2.5)), ("rxe2", rxe("fast0", 100.0))];
        // On a dummy: the kernel takes 1 Gb/s, 1X SDR 2.5 Gb/s; not "degraded" against rxe0.
        let l = soft_link(&devices, "rxe1", &speeds, &|_| None);
        assert_eq!(l.outcome, Outcome::Pass, "{l:#?}");
        assert!(l.summary.contains("rxe's rule, the kernel's mapping of its netdev's reference speed"), "{l:#?}");
        assert!(l.summary.contains("dummy0 has no speed") && l.summary.contains("1X SDR 2.5 Gb/s"), "{l:#?}");
        assert!(!l.summary.contains("sibling"), "{l:#?}");
        // On a 200G netdev: at most 4X EDR 100 Gb/s.
        let l = soft_link(&devices, "rxe2", &speeds, &|_| None);
        assert_eq!(l.outcome, Outcome::Pass, "{l:#?}");
        assert!(l.summary.contains("gives 4X EDR 100 Gb/s"), "{l:#?}");
        // On a 10G veth: 1X FDR10 10 Gb/s.
        let l = soft_link(&devices, "rxe0", &speeds, &|_| None);
        assert_eq!(l.outcome, Outcome::Pass, "{l:#?}");
        assert!(l.summary.contains("gives 1X FDR10 10 Gb/s"), "{l:#?}");
    }

    #[test]
    fn rxe_on_a_bond_that_lost_a_leg_is_degraded_against_the_sum_of_its_legs() {
        // balance-rr over two 10G veths; one leg lost: the bond says 10, rxe runs 1X FDR10.
        let speeds = |n: &str| match n {
            "bond0" | "veth0" | "veth1" => Some(10.0),
            _ => None,
        };
        let bond = |mode: &'static str| {
            move |n: &str| {
                (n == "bond0").then(|| Bond { mode: mode.into(), legs: vec!["veth0".into(), "veth1".into()] })
            }
        };
        let devices = [("rxe0", rxe("bond0", 10.0))];
        let l = soft_link(&devices, "rxe0", &speeds, &bond("balance-rr"));
        assert_eq!(l.outcome, Outcome::Fail, "{l:#?}");
        assert!(l.summary.contains("below the expected 20 Gb/s"), "{l:#?}");
        assert!(l.summary.contains("bond bond0: the sum of its legs' veth0 10 Gb/s"), "{l:#?}");
        assert!(l.summary.contains("gives 4X DDR 20 Gb/s"), "{l:#?}");
        // Both legs up: the bond and rxe say 20; it passes.
        let whole = [("rxe0", rxe("bond0", 20.0))];
        assert_eq!(soft_link(&whole, "rxe0", &speeds, &bond("balance-rr")).outcome, Outcome::Pass);
        // active-backup: one leg carries the traffic; 10 is its rate.
        let l = soft_link(&devices, "rxe0", &speeds, &bond("active-backup"));
        assert_eq!(l.outcome, Outcome::Pass, "{l:#?}");
        assert!(l.summary.contains("active-backup"), "{l:#?}");
        // A leg with no speed of its own counts as its fellows'.
        let down = |n: &str| (n != "veth1" && n != "dummy0").then_some(10.0);
        let l = soft_link(&devices, "rxe0", &down, &bond("balance-rr"));
        assert_eq!(l.outcome, Outcome::Fail, "{l:#?}");
        assert!(l.summary.contains("veth1 10 Gb/s (none of its own"), "{l:#?}");
    }

    #[test]
    fn the_soft_port_rate_follows_the_kernels_table() {
        let table = [
            (None, ("1X SDR", 2.5)),
            (Some(1.0), ("1X SDR", 2.5)),
            (Some(10.0), ("1X FDR10", 10.0)),
            (Some(20.0), ("4X DDR", 20.0)),
            (Some(25.0), ("1X EDR", 25.0)),
            (Some(40.0), ("4X FDR10", 40.0)),
            (Some(100.0), ("4X EDR", 100.0)),
            (Some(400.0), ("4X EDR", 100.0)),
        ];
        for (speed, want) in table {
            assert_eq!(soft_port_rate(speed), want, "{speed:?}");
        }
        assert_eq!(soft_port_rate(Some(50.0)).1, 50.0, "lanes on kernels from 6.7: the lower");
    }

    #[test]
    fn with_nothing_to_compare_the_link_does_not_claim_the_expected_rate() {
        let b = fixture();
        let l = link_of(&b, "mlx5_0", None);
        assert_eq!(l.outcome, Outcome::Pass);
        assert!(!l.summary.contains("expected rate"), "{l:#?}");
        assert!(l.summary.contains("rate not compared"), "{l:#?}");
    }
}
