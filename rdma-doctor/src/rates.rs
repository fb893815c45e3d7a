//! The rate a port should run at when nobody said (`--expect-rate`) and no saved baseline
//! has it: the speed of the netdev under a RoCE port, the fastest mode that netdev and its
//! link partner both advertise ([`crate::ethtool`] says why that one and not the modes the
//! NIC supports), or the fastest active sibling port of the same device model among the
//! devices examined; the highest of them. Each reference says where it came from, so that
//! a finding can name it.

use std::collections::BTreeMap;

use crate::ethtool::LinkModes;
use crate::report::DeviceFacts;
use crate::verdict::RateRef;

/// A (device, port) key of [`crate::verdict::Expectations::expected_rate`].
pub type PortKey = (String, String);

/// What the kernel says about a netdev: its speed in Gb/s (`None` when it has none: a
/// dummy, a link that is down) and its link modes.
pub struct Netdevs<'a> {
    /// `/sys/class/net/NAME/speed` in Gb/s ([`netdev_speed_gbps`]).
    pub speed_gbps: &'a dyn Fn(&str) -> Option<f64>,
    /// The `ETHTOOL_GLINKSETTINGS` link modes ([`crate::ethtool::query`]).
    pub link_modes: &'a dyn Fn(&str) -> Option<LinkModes>,
}

impl Netdevs<'static> {
    /// This host's netdevs.
    pub fn live() -> Self {
        Netdevs { speed_gbps: &netdev_speed_gbps, link_modes: &crate::ethtool::query }
    }
}

/// The derived reference of each port of `devices` that has one.
pub fn derived(devices: &BTreeMap<String, DeviceFacts>, netdevs: &Netdevs<'_>) -> BTreeMap<PortKey, RateRef> {
    let mut out = BTreeMap::new();
    for (name, d) in devices {
        for (port, p) in &d.ports {
            let by_netdev = p.netdev.as_ref().and_then(|nd| {
                let gbps = (netdevs.speed_gbps)(&nd.name).filter(|g| g.is_finite() && *g > 0.0)?;
                Some(RateRef { gbps, from: format!("the speed of its netdev {} ({gbps} Gb/s)", nd.name) })
            });
            let by_modes = p.netdev.as_ref().and_then(|nd| {
                let (mode, mbps) = (netdevs.link_modes)(&nd.name)?.common_top()?;
                let gbps = f64::from(mbps) / 1000.0;
                let from =
                    format!("the fastest mode its netdev {} and its link partner both advertise ({mode})", nd.name);
                Some(RateRef { gbps, from })
            });
            let by_sibling = fastest_sibling(devices, name, port, d);
            let candidates = [by_netdev, by_modes, by_sibling];
            let best = candidates.into_iter().flatten().max_by(|a, b| a.gbps.total_cmp(&b.gbps));
            if let Some(r) = best {
                out.insert((name.clone(), port.clone()), r);
            }
        }
    }
    out
}

/// The fastest ACTIVE port of another device of the same model (vendor part id) and link
/// layer, or another port of the same device.
fn fastest_sibling(
    devices: &BTreeMap<String, DeviceFacts>,
    name: &str,
    port: &str,
    d: &DeviceFacts,
) -> Option<RateRef> {
    let model = d.vendor_part_id?;
    let link_layer = &d.ports.get(port)?.link_layer;
    devices
        .iter()
        .filter(|(_, o)| o.vendor_part_id == Some(model))
        .flat_map(|(o, od)| od.ports.iter().map(move |(op, pp)| (o, op, pp)))
        .filter(|(o, op, pp)| {
            (o.as_str(), op.as_str()) != (name, port) && pp.state == "ACTIVE" && &pp.link_layer == link_layer
        })
        .filter(|(_, _, pp)| pp.rate_gbps.is_finite() && pp.rate_gbps > 0.0)
        .max_by(|a, b| a.2.rate_gbps.total_cmp(&b.2.rate_gbps))
        .map(|(o, op, pp)| RateRef {
            gbps: pp.rate_gbps,
            from: format!("its sibling {o} port {op} of the same model (vendor part {model}) at {} Gb/s", pp.rate_gbps),
        })
}

/// `/sys/class/net/NAME/speed` (Mb/s) in Gb/s; `None` when unknown (-1, absent, a dummy).
pub fn netdev_speed_gbps(name: &str) -> Option<f64> {
    let path = std::path::Path::new("/sys/class/net").join(name).join("speed");
    let mbps: i64 = crate::collect::read_trimmed(&path)?.parse().ok()?;
    (mbps > 0).then(|| mbps as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Observations, Report};
    use crate::verdict::{evaluate, Expectations, Layer, Outcome};

    fn fixture() -> crate::report::Baseline {
        let r: Report = serde_json::from_str(include_str!("../testdata/node-a.json")).unwrap();
        r.baseline
    }

    /// The link layer of `name` with the derived references (`netdev` speeds in Gb/s).
    fn link_of(b: &crate::report::Baseline, name: &str, netdev: Option<f64>) -> crate::verdict::LayerReport {
        link_with_modes(b, name, netdev, None)
    }

    fn link_with_modes(
        b: &crate::report::Baseline,
        name: &str,
        netdev: Option<f64>,
        modes: Option<LinkModes>,
    ) -> crate::verdict::LayerReport {
        let netdevs = Netdevs { speed_gbps: &|_| netdev, link_modes: &|_| modes.clone() };
        let want = Expectations {
            devices: vec![name.into()],
            expected_rate: derived(&b.devices, &netdevs),
            ..Default::default()
        };
        let seen = Observations { sysfs_devices: b.devices.keys().cloned().collect(), ..Observations::default() };
        let (layers, _) = evaluate(b, &seen, &want, &mut crate::verdict::Probes::none());
        layers.into_iter().find(|l| l.layer == Layer::Link).unwrap()
    }

    #[test]
    fn a_port_slower_than_its_netdev_fails_naming_the_netdev_as_the_reference() {
        let mut b = fixture();
        b.devices.get_mut("mlx5_0").unwrap().ports.get_mut("1").unwrap().rate_gbps = 100.0;
        let l = link_of(&b, "mlx5_0", Some(200.0));
        assert_eq!(l.outcome, Outcome::Fail, "{l:#?}");
        assert!(
            l.summary.contains("below the expected 200 Gb/s (the speed of its netdev ens1f0np0 (200 Gb/s))"),
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
            l.summary.contains("its sibling mlx5_0 port 1 of the same model (vendor part 4125) at 200 Gb/s"),
            "{l:#?}"
        );
        // The fast one passes, and says what it was compared with.
        let l = link_of(&b, "mlx5_0", None);
        assert_eq!(l.outcome, Outcome::Pass, "{l:#?}");
        assert!(l.summary.contains("sibling mlx5_1 port 1"), "{l:#?}");
    }

    /// Link modes as `ETHTOOL_GLINKSETTINGS` reports them (one word a mask: bits < 32).
    fn modes(autoneg: bool, ours: &[u32], partner: &[u32]) -> LinkModes {
        let mask = |bits: &[u32]| vec![bits.iter().fold(0u32, |m, b| m | 1 << b)];
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
        let want = "below the expected 56 Gb/s (the fastest mode its netdev ens1f0np0 and its link partner both \
                    advertise (56000baseCR4/Full))";
        assert!(l.summary.contains(want), "{l:#?}");
        // The partner advertises 25G only (a breakout): 25 is the rate, and it passes.
        let l = link_with_modes(&b, "mlx5_0", Some(25.0), Some(modes(true, &[31, 28], &[31])));
        assert_eq!(l.outcome, Outcome::Pass, "{l:#?}");
        // The partner's modes not reported, or no autonegotiation: the NIC's own modes
        // are no reference, and the netdev's speed is what it is compared with.
        for m in [modes(true, &[31, 28], &[]), modes(false, &[31, 28], &[31, 28])] {
            let l = link_with_modes(&b, "mlx5_0", Some(25.0), Some(m));
            assert_eq!(l.outcome, Outcome::Pass, "{l:#?}");
            assert!(l.summary.contains("the speed of its netdev ens1f0np0"), "{l:#?}");
        }
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
