//! The data plane over time: each port's counters (`ports/N/counters`, the InfiniBand
//! PortCounters every device exposes) and hw_counters (`ports/N/hw_counters` and the
//! device-level `hw_counters`: the driver's own, named differently by rxe and mlx5),
//! read from sysfs with their paths, and what moved between two samples: the doctor takes
//! one before its probes and one after, and names each error counter that moved by its
//! class (a lossy path, a receiver not ready, timeouts, link downs, congestion, discards),
//! the layer it concerns and a command to run next.
//!
//! Every file is read with a size limit ([`MAX_COUNTER_BYTES`]); a file that is larger, not
//! a number or unreadable is recorded with its error, never a panic. A counter a device
//! does not have is absent, not an error.

use crate::model::counters::Counter;
use crate::model::counters::CounterChange;
use crate::model::counters::CounterClass;
use crate::model::counters::DeviceCounters;
use crate::model::counters::PortCounters;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// The largest counter file read: a counter is one number.
pub const MAX_COUNTER_BYTES: u64 = 4096;
/// The most files read from one counters directory.
pub const MAX_COUNTERS_PER_DIR: usize = 1024;
/// Where the kernel lists RDMA devices.
pub const SYSFS_ROOT: &str = "/sys/class/infiniband";

/// Reads one counter file, at most [`MAX_COUNTER_BYTES`].
pub fn read_counter(path: &Path) -> Counter {
    let source = path.display().to_string();
    let fail = |e: String| Counter { value: None, source: source.clone(), error: Some(e) };
    let mut bytes = Vec::new();
    let read = std::fs::File::open(path).and_then(|f| f.take(MAX_COUNTER_BYTES + 1).read_to_end(&mut bytes));
    if let Err(e) = read {
        return fail(e.to_string());
    }
    if bytes.len() as u64 > MAX_COUNTER_BYTES {
        return fail(format!("larger than {MAX_COUNTER_BYTES} bytes: not a counter"));
    }
    let text = String::from_utf8_lossy(&bytes);
    match text.trim().parse::<u64>() {
        Ok(v) => Counter { value: Some(v), source, error: None },
        Err(_) => {
            let shown: String = text.trim().chars().take(40).collect();
            fail(format!("not a number: {shown:?}"))
        }
    }
}

/// Every counter file of `dir` (none when it does not exist). `lifespan` in hw_counters is
/// a setting (how long the driver caches its values), not a counter.
pub fn read_dir(dir: &Path) -> BTreeMap<String, Counter> {
    let Ok(entries) = std::fs::read_dir(dir) else { return BTreeMap::new() };
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n != "lifespan")
        .take(MAX_COUNTERS_PER_DIR)
        .collect();
    names.sort();
    names.into_iter().map(|n| (n.clone(), read_counter(&dir.join(&n)))).collect()
}

/// The counters of device `name` under `root` (`/sys/class/infiniband` on a live node;
/// a recorded copy in tests).
pub fn read_device(root: &Path, name: &str) -> DeviceCounters {
    let dev = root.join(name);
    let mut out = DeviceCounters { hw_counters: read_dir(&dev.join("hw_counters")), ports: BTreeMap::new() };
    if let Ok(entries) = std::fs::read_dir(dev.join("ports")) {
        for e in entries.flatten().take(256) {
            let Ok(port) = e.file_name().into_string() else { continue };
            if port.parse::<u32>().is_err() {
                continue;
            }
            let dir = e.path();
            let p = PortCounters {
                counters: read_dir(&dir.join("counters")),
                hw_counters: read_dir(&dir.join("hw_counters")),
                netdev: None,
            };
            out.ports.insert(port, p);
        }
    }
    out
}

/// The counters of each device of `names` on this node, with the statistics of the netdev
/// under each RoCE port ([`crate::facts::netstat`]).
pub fn sample(names: &[String]) -> BTreeMap<String, DeviceCounters> {
    let (ib, net) = (Path::new(SYSFS_ROOT), Path::new(crate::facts::netstat::NET_ROOT));
    names
        .iter()
        .map(|n| {
            let mut d = read_device(ib, n);
            crate::facts::netstat::attach(&mut d, ib, net, n, &crate::facts::ethtool_stats::query);
            (n.clone(), d)
        })
        .collect()
}

/// Every counter readable in both samples whose value changed, in the order device, port
/// (device level first), set, name. A counter that went down (the driver reset it) is
/// listed too: `after` below `before`.
pub fn changes(
    before: &BTreeMap<String, DeviceCounters>,
    after: &BTreeMap<String, DeviceCounters>,
) -> Vec<CounterChange> {
    let mut out = Vec::new();
    for (dev, a) in after {
        let Some(b) = before.get(dev) else { continue };
        let mut diff =
            |port: Option<&String>, set: &str, was: &BTreeMap<String, Counter>, now: &BTreeMap<String, Counter>| {
                let netdev = set.starts_with("netdev ");
                for (name, c) in now {
                    let (Some(old), Some(new)) = (was.get(name).and_then(|c| c.value), c.value) else { continue };
                    if old != new {
                        out.push(CounterChange {
                            device: dev.clone(),
                            port: port.cloned(),
                            set: set.to_owned(),
                            name: name.clone(),
                            source: c.source.clone(),
                            before: old,
                            after: new,
                            class: if netdev { crate::facts::netstat::class_of(name) } else { CounterClass::of(name) },
                        });
                    }
                }
            };
        diff(None, "hw_counters", &b.hw_counters, &a.hw_counters);
        for (port, pa) in &a.ports {
            let Some(pb) = b.ports.get(port) else { continue };
            diff(Some(port), "counters", &pb.counters, &pa.counters);
            diff(Some(port), "hw_counters", &pb.hw_counters, &pa.hw_counters);
            // The same netdev in both samples: one that changed is not compared.
            if let (Some(nb), Some(na)) = (&pb.netdev, &pa.netdev) {
                if nb.name == na.name {
                    diff(Some(port), &format!("netdev {} statistics", na.name), &nb.statistics, &na.statistics);
                    diff(Some(port), &format!("netdev {} ethtool", na.name), &nb.ethtool, &na.ethtool);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::counter_findings::findings;
    use crate::model::layer::Layer;
    use crate::model::report::Severity;
    use std::path::PathBuf;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/counters")
    }

    #[test]
    fn an_mlx5_set_records_port_and_hw_counters_with_their_paths() {
        let d = read_device(&fixtures().join("mlx5-before"), "mlx5_0");
        let p = &d.ports["1"];
        assert_eq!(p.hw_counters["out_of_sequence"].value, Some(0));
        assert_eq!(p.hw_counters["np_cnp_sent"].value, Some(12));
        assert_eq!(p.counters["port_xmit_discards"].value, Some(0));
        assert!(p.counters["symbol_error"].source.ends_with("mlx5-before/mlx5_0/ports/1/counters/symbol_error"));
        assert!(!p.hw_counters.contains_key("lifespan"), "a setting, not a counter");
        assert!(d.hw_counters.is_empty(), "no device-level hw_counters: absent, not an error");
    }

    #[test]
    fn a_large_or_non_numeric_counter_file_is_unreadable_not_a_panic() {
        let d = read_device(&fixtures().join("ib"), "mlx4_0");
        let c = &d.ports["1"].counters;
        assert_eq!(c["link_downed"].value, Some(3));
        let big = &c["huge"];
        assert_eq!(big.value, None);
        assert!(big.error.as_deref().unwrap().contains("larger than 4096 bytes"), "{big:?}");
        let text = &c["garbage"];
        assert!(text.error.as_deref().unwrap().starts_with("not a number"), "{text:?}");
        // The device-level hw_counters of the InfiniBand set.
        assert_eq!(d.hw_counters["rq_num_udsdprd"].value, Some(7));
        assert!(read_device(&fixtures(), "nothing-here").ports.is_empty());
    }

    #[test]
    fn retransmissions_that_moved_are_a_data_plane_warning_naming_each_counter() {
        let before = BTreeMap::from([("mlx5_0".to_owned(), read_device(&fixtures().join("mlx5-before"), "mlx5_0"))]);
        let after = BTreeMap::from([("mlx5_0".to_owned(), read_device(&fixtures().join("mlx5-after"), "mlx5_0"))]);
        let moved = changes(&before, &after);
        let names: Vec<&str> = moved.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "port_rcv_data",
                "port_xmit_data",
                "local_ack_timeout_err",
                "np_cnp_sent",
                "out_of_sequence",
                "packet_seq_err"
            ]
        );
        let netdevs = BTreeMap::from([("mlx5_0".to_owned(), "ens1f0np0".to_owned())]);
        let f = findings(&moved, &netdevs, "during the loopback test");
        let classes: Vec<(Severity, Option<Layer>)> = f.iter().map(|f| (f.severity, f.layer)).collect();
        // Lossy (warning, data plane), timeout (warning, data plane), congestion (note, link).
        assert_eq!(
            classes,
            [
                (Severity::Warning, Some(Layer::DataPlane)),
                (Severity::Warning, Some(Layer::DataPlane)),
                (Severity::Note, Some(Layer::Link))
            ],
            "{f:#?}"
        );
        assert!(f[0].what.contains("port 1 out_of_sequence +4 (0 -> 4), port 1 packet_seq_err +2"), "{}", f[0].what);
        assert!(f[0].what.contains("a lossy path"), "{}", f[0].what);
        assert!(f[0].advice.as_deref().unwrap().starts_with("ethtool -S ens1f0np0"), "{:?}", f[0].advice);
        assert!(f[1].what.contains("local_ack_timeout_err +1"), "{}", f[1].what);
    }

    #[test]
    fn a_version_4_report_with_counters_reads_back_and_a_version_1_report_reads_with_none() {
        let old = crate::model::input::parse_report(include_str!("../../testdata/node-a.json")).unwrap();
        assert!(old.observations.counters.is_empty() && old.observations.counter_changes.is_empty());
        let mut r = old.clone();
        r.format_version = crate::model::report::FORMAT_VERSION;
        let before = BTreeMap::from([("mlx5_0".to_owned(), read_device(&fixtures().join("mlx5-before"), "mlx5_0"))]);
        r.observations.counters =
            BTreeMap::from([("mlx5_0".to_owned(), read_device(&fixtures().join("mlx5-after"), "mlx5_0"))]);
        r.observations.counter_changes = changes(&before, &r.observations.counters);
        let json = r.to_json();
        assert!(
            json.contains(&format!("\"format_version\": {}", crate::model::report::FORMAT_VERSION))
                && json.contains("hw_counters/out_of_sequence")
        );
        assert_eq!(crate::model::input::parse_report(&json).unwrap(), r);
        let typo = json.replacen("\"before\": ", "\"befor\": ", 1);
        assert!(crate::model::input::parse_report(&typo).unwrap_err().contains("befor"));
    }

    #[test]
    fn every_class_has_its_layer_and_unknown_names_have_none() {
        assert_eq!(CounterClass::of("rcvd_rnr_err"), Some(CounterClass::Rnr));
        assert_eq!(CounterClass::of("link_downed").map(CounterClass::layer), Some(Layer::Link));
        assert_eq!(CounterClass::of("symbol_error"), Some(CounterClass::Discard));
        assert_eq!(CounterClass::of("rcvd_seq_err"), Some(CounterClass::Lossy));
        assert_eq!(CounterClass::of("port_xmit_wait"), Some(CounterClass::Congestion));
        assert_eq!(CounterClass::of("sent_pkts"), None);
        assert_eq!(CounterClass::of("port_xmit_data"), None);
    }
}
