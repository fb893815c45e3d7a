//! The Ethernet side of a RoCE port: the statistics of the netdev under it, the kernel's
//! (`/sys/class/net/NETDEV/statistics/*`, every file) and the driver's (`ethtool -S`,
//! those [`crate::facts::ethtool_stats::keep`] keeps), recorded with the port's counters and
//! sampled with them around the probes, so that pause frames, drops and CRC errors on the
//! wire are named beside the RDMA counters.

use crate::model::counters::NetdevCounters;

use std::path::Path;

use crate::facts::counters::read_dir;
use crate::model::counters::{Counter, CounterClass, DeviceCounters};

/// Where the kernel lists netdevs.
pub const NET_ROOT: &str = "/sys/class/net";

/// The statistics of netdev `name` under `net_root`, the driver's from `ethtool`.
pub fn read_netdev(net_root: &Path, name: &str, ethtool: &dyn Fn(&str) -> Vec<(String, u64)>) -> NetdevCounters {
    let ethtool = ethtool(name)
        .into_iter()
        .map(|(n, v)| {
            let c = Counter { value: Some(v), source: format!("ethtool -S {name}: {n}"), error: None };
            (n, c)
        })
        .collect();
    NetdevCounters { name: name.to_owned(), statistics: read_dir(&net_root.join(name).join("statistics")), ethtool }
}

/// The netdev under port `port` of device `dev` (under `ib_root`), when its link layer is
/// Ethernet: its GID table's (`gid_attrs/ndevs/0`), else the device's `parent` (a soft
/// device whose netdev is down has no GID yet).
pub fn port_netdev(ib_root: &Path, dev: &str, port: &str) -> Option<String> {
    let d = ib_root.join(dev);
    let p = d.join("ports").join(port);
    let small = |path: &Path| -> Option<String> {
        let text = std::fs::read_to_string(path).ok()?;
        let t = text.trim();
        (!t.is_empty() && t.len() < 64 && !t.contains('/')).then(|| t.to_owned())
    };
    if small(&p.join("link_layer"))? != "Ethernet" {
        return None;
    }
    small(&p.join("gid_attrs/ndevs/0")).or_else(|| small(&d.join("parent")))
}

/// Adds the statistics of each RoCE port's netdev to `counters` of device `dev`.
pub fn attach(
    counters: &mut DeviceCounters,
    ib_root: &Path,
    net_root: &Path,
    dev: &str,
    ethtool: &dyn Fn(&str) -> Vec<(String, u64)>,
) {
    for (port, p) in counters.ports.iter_mut() {
        p.netdev = port_netdev(ib_root, dev, port).map(|n| read_netdev(net_root, &n, ethtool));
    }
}

/// The class of a netdev statistic that moved, by its name: pause and PFC are congestion
/// (as are ECN marks and CNPs), discards, drops, missed packets and buffer overruns are
/// discards, CRC and other errors a lossy link; `None` for traffic. The kernel's own
/// `rx_dropped` and `tx_dropped` are recorded but not classed: they count what the stack
/// threw away (no listener, a protocol nobody handles, a full backlog), which moves on a
/// healthy node, while a NIC's discards have names of their own (`rx_discards_phy`,
/// `rx_out_of_buffer`, `rx_missed_errors`).
pub fn class_of(name: &str) -> Option<CounterClass> {
    let n = name.to_ascii_lowercase();
    if n == "rx_dropped" || n == "tx_dropped" {
        return None;
    }
    let has = |words: &[&str]| words.iter().any(|w| n.contains(w));
    if has(&["pause", "pfc", "ecn", "cnp"]) {
        Some(CounterClass::Congestion)
    } else if has(&["discard", "drop", "out_of_buffer", "missed", "fifo", "over_err"]) {
        Some(CounterClass::Discard)
    } else if has(&["crc", "err"]) {
        Some(CounterClass::Lossy)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::counters::{changes, read_device};
    use crate::judge::counter_findings::findings;
    use crate::model::layer::Layer;
    use crate::model::report::Severity;
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata")
    }

    /// The recorded mlx5 set, with `moved` statistics raised by `by`.
    fn ethtool_with(moved: &'static [(&'static str, u64)]) -> impl Fn(&str) -> Vec<(String, u64)> {
        move |_netdev| {
            let rec = crate::facts::ethtool_stats::tests::recorded();
            let all: Vec<(String, u64)> = rec
                .into_iter()
                .map(|(n, v)| {
                    let by = moved.iter().find(|(m, _)| *m == n).map_or(0, |(_, b)| *b);
                    (n, v + by)
                })
                .collect();
            let (names, values): (Vec<String>, Vec<u64>) = all.into_iter().unzip();
            crate::facts::ethtool_stats::select(&names, &values)
        }
    }

    fn sample(ib: &str, net: &str, ethtool: &dyn Fn(&str) -> Vec<(String, u64)>) -> BTreeMap<String, DeviceCounters> {
        let ib_root = fixtures().join("counters").join(ib);
        let mut d = read_device(&ib_root, "mlx5_0");
        attach(&mut d, &ib_root, &fixtures().join("netdev").join(net), "mlx5_0", ethtool);
        BTreeMap::from([("mlx5_0".to_owned(), d)])
    }

    #[test]
    fn a_roce_port_records_its_netdevs_sysfs_and_ethtool_statistics_with_their_sources() {
        let s = sample("mlx5-before", "before", &ethtool_with(&[]));
        let nd = s["mlx5_0"].ports["1"].netdev.as_ref().expect("port 1 is RoCE: its netdev");
        assert_eq!(nd.name, "ens1f0np0");
        let drop = &nd.statistics["rx_dropped"];
        assert_eq!(drop.value, Some(0));
        assert!(drop.source.ends_with("testdata/netdev/before/ens1f0np0/statistics/rx_dropped"), "{drop:?}");
        assert_eq!(nd.statistics["rx_crc_errors"].value, Some(0));
        let pause = &nd.ethtool["rx_pause_ctrl_phy"];
        assert_eq!((pause.value, pause.source.as_str()), (Some(7), "ethtool -S ens1f0np0: rx_pause_ctrl_phy"));
        assert!(!nd.ethtool.contains_key("rx_packets"), "traffic is not kept");
        // An InfiniBand port has no netdev; a driver with no ethtool statistics has none.
        let ib = fixtures().join("counters/ib");
        assert_eq!(port_netdev(&ib, "mlx4_0", "1"), None);
        let none = sample("mlx5-before", "before", &|_| Vec::new());
        assert!(none["mlx5_0"].ports["1"].netdev.as_ref().unwrap().ethtool.is_empty());
    }

    #[test]
    fn moved_pause_and_discards_of_the_netdev_are_named_congestion_and_discards_with_the_netdev() {
        let before = sample("mlx5-before", "before", &ethtool_with(&[]));
        let after = sample("mlx5-before", "after", &ethtool_with(&[("rx_pause_ctrl_phy", 40), ("rx_discards_phy", 5)]));
        let moved = changes(&before, &after);
        let net: Vec<(&str, &str, Option<CounterClass>)> = moved
            .iter()
            .filter(|c| c.set.starts_with("netdev "))
            .map(|c| (c.set.as_str(), c.name.as_str(), c.class))
            .collect();
        assert_eq!(
            net,
            [
                ("netdev ens1f0np0 statistics", "rx_bytes", None),
                ("netdev ens1f0np0 statistics", "rx_dropped", None),
                ("netdev ens1f0np0 statistics", "rx_packets", None),
                ("netdev ens1f0np0 ethtool", "rx_discards_phy", Some(CounterClass::Discard)),
                ("netdev ens1f0np0 ethtool", "rx_pause_ctrl_phy", Some(CounterClass::Congestion)),
            ]
        );
        let netdevs = BTreeMap::from([("mlx5_0".to_owned(), "ens1f0np0".to_owned())]);
        let f = findings(&moved, &netdevs, "during the loopback test");
        let pause = f.iter().find(|f| f.what.contains("rx_pause_ctrl_phy")).unwrap_or_else(|| panic!("{f:#?}"));
        assert_eq!((pause.severity, pause.layer), (Severity::Note, Some(Layer::Link)));
        assert!(pause.what.contains("port 1 ens1f0np0 rx_pause_ctrl_phy +40 (7 -> 47)"), "{}", pause.what);
        assert!(pause.source.as_deref() == Some("ethtool -S ens1f0np0: rx_pause_ctrl_phy"), "{pause:?}");
        let advice = pause.advice.as_deref().unwrap();
        assert!(advice.starts_with("ethtool -S ens1f0np0 | grep -iE 'pause"), "{advice}");
        let disc = f.iter().find(|f| f.what.contains("rx_discards_phy")).unwrap_or_else(|| panic!("{f:#?}"));
        assert_eq!((disc.severity, disc.layer), (Severity::Warning, Some(Layer::Link)));
        assert!(disc.what.contains("port 1 ens1f0np0 rx_discards_phy +5 (3 -> 8)"), "{}", disc.what);
        assert!(!disc.what.contains("rx_dropped"), "the stack's own drops warn of nothing: {}", disc.what);
        // The watch command names only files; ethtool's statistics are in its grep.
        let advice = disc.advice.as_deref().unwrap();
        assert!(!advice.contains("grep -H . ethtool"), "{advice}");
    }

    #[test]
    fn netdev_statistics_are_classed_by_their_names() {
        use CounterClass::*;
        for (name, class) in [
            ("rx_pause_ctrl_phy", Some(Congestion)),
            ("tx_prio3_pause", Some(Congestion)),
            ("rx_ecn_mark", Some(Congestion)),
            ("rx_discards_phy", Some(Discard)),
            ("tx_dropped", None),
            ("rx_dropped", None),
            ("rx_out_of_buffer", Some(Discard)),
            ("rx_missed_errors", Some(Discard)),
            ("rx_fifo_errors", Some(Discard)),
            ("rx_crc_errors", Some(Lossy)),
            ("rx_crc_errors_phy", Some(Lossy)),
            ("tx_carrier_errors", Some(Lossy)),
            ("rx_packets", None),
            ("collisions", None),
        ] {
            assert_eq!(class_of(name), class, "{name}");
        }
    }
}
