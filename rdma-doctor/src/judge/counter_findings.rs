//! What the counters that moved are evidence of: a lossy path, a receiver not ready,
//! timeouts, link downs, congestion, discards; each a finding with its layer and the
//! next step.

use crate::model::counters::CounterChange;
use crate::model::counters::CounterClass;

use crate::model::report::{Finding, Severity};
use std::collections::BTreeMap;

/// One finding per device and class among `changes`: what moved, what it means, the
/// layer, and the command to run next. `netdevs` maps a device to the netdev under it (for
/// `ethtool -S`). Traffic counters are not findings.
pub fn findings(changes: &[CounterChange], netdevs: &BTreeMap<String, String>, during: &str) -> Vec<Finding> {
    let mut grouped: BTreeMap<(String, CounterClass), Vec<&CounterChange>> = BTreeMap::new();
    for c in changes {
        if let Some(class) = c.class {
            if c.after > c.before {
                grouped.entry((c.device.clone(), class)).or_default().push(c);
            }
        }
    }
    grouped
        .into_iter()
        .map(|((dev, class), moved)| {
            let list: Vec<String> = moved
                .iter()
                .map(|c| {
                    let port = c.port.as_ref().map(|p| format!("port {p} ")).unwrap_or_default();
                    let netdev = c.set.strip_prefix("netdev ").and_then(|s| s.split(' ').next());
                    let netdev = netdev.map(|n| format!("{n} ")).unwrap_or_default();
                    format!("{port}{netdev}{} +{} ({} -> {})", c.name, c.after - c.before, c.before, c.after)
                })
                .collect();
            let files: Vec<&str> = moved.iter().map(|c| c.source.as_str()).collect();
            // A port's own netdev, where its statistics moved, else the device's.
            let netdev = moved
                .iter()
                .find_map(|c| c.set.strip_prefix("netdev ").and_then(|s| s.split(' ').next()))
                .or(netdevs.get(&dev).map(String::as_str));
            Finding {
                severity: if class.warns() { Severity::Warning } else { Severity::Note },
                scope: dev.clone(),
                what: format!(
                    "{} layer: counters moved {during}: {}: {}",
                    class.layer().name(),
                    list.join(", "),
                    class.meaning()
                ),
                advice: Some(next_step(class, &dev, netdev, &files)),
                source: Some(files.join(" ")),
                layer: Some(class.layer()),
            }
        })
        .collect()
}

/// A command to paste: watch the counters that moved, with the netdev's own statistics
/// where the class has them.
pub(crate) fn next_step(class: CounterClass, dev: &str, netdev: Option<&str>, files: &[&str]) -> String {
    // `ethtool -S` statistics are not files: the ethtool command below greps them.
    let files: Vec<&str> = files.iter().copied().filter(|f| f.starts_with('/')).collect();
    let watch = match (files.is_empty(), netdev) {
        (false, _) => format!("watch -n1 -d grep -H . {}", files.join(" ")),
        (true, Some(n)) => format!("watch -n1 -d \"ethtool -S {n} | grep -iE 'pause|discard|drop|err|crc|ecn|prio'\""),
        (true, None) => String::new(),
    };
    let ethtool = |what: &str| match netdev {
        Some(n) => format!("ethtool -S {n} | grep -iE '{what}'; "),
        None => String::new(),
    };
    match class {
        CounterClass::Lossy | CounterClass::Timeout => {
            format!("{}{watch}  # and on the peer; check its MTU and UDP 4791", ethtool("discard|drop|err|pause"))
        }
        CounterClass::Rnr => format!("rdma resource show qp dev {dev}; {watch}  # which QP's receiver lags"),
        CounterClass::LinkDown => match netdev {
            Some(n) => format!("ip -s link show {n}; dmesg | grep -iE '{dev}|{n}|link'; {watch}"),
            None => format!("dmesg | grep -iE '{dev}|link'; {watch}"),
        },
        CounterClass::Congestion => format!("{}{watch}", ethtool("pause|ecn|cnp|prio")),
        CounterClass::Discard => {
            format!("{}{watch}  # a rising error count: reseat or replace the cable", ethtool("discard|drop|err|crc"))
        }
    }
}
