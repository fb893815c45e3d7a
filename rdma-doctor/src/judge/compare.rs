//! Comparing reports: one node against its saved baseline (every drifted field), and
//! several nodes against each other (the fields where one node differs from the rest).
//!
//! Both work on the `baseline` section of the JSON, flattened to dotted paths such as
//! `devices.mlx5_0.fw_ver` or `devices.rxe0.ports.1.gids.1.type`. Map keys are natural
//! keys (device name, port number, GID index, module name), so a re-ordered table is not
//! a drift.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::report::Drift;

/// Facts about the user who ran the doctor, not about the node: whether its process had
/// CAP_IPC_LOCK and could open each device node. Never compared.
pub const USER_FACTS: &[&str] = &["memlock.cap_ipc_lock", "dev_nodes.*.can_open", "dev_nodes.*.error"];

/// Fields never compared against a saved baseline: where a number was read is not the
/// number, and [`USER_FACTS`].
pub const SELF_IGNORE: &[&str] = &["**.source", "memlock.cap_ipc_lock", "dev_nodes.*.can_open", "dev_nodes.*.error"];

/// Fields that differ between healthy nodes by design: identities and addresses, and
/// [`USER_FACTS`].
pub const NODES_IGNORE: &[&str] = &[
    "**.source",
    "memlock.cap_ipc_lock",
    "dev_nodes.*.can_open",
    "dev_nodes.*.error",
    "devices.*.node_guid",
    "devices.*.sys_image_guid",
    "devices.*.ports.*.lid",
    "devices.*.ports.*.gids.*.gid",
    "devices.*.ports.*.netdev.name",
    "devices.*.ports.*.gids.*.netdev",
    "devices.*.parent_netdev",
];

/// `{"a": {"b": 1}, "c": [true]}` -> `a.b = 1`, `c.0 = true`.
pub fn flatten(v: &Value) -> BTreeMap<String, Value> {
    fn walk(prefix: &str, v: &Value, out: &mut BTreeMap<String, Value>) {
        let join = |k: &str| if prefix.is_empty() { k.to_owned() } else { format!("{prefix}.{k}") };
        match v {
            Value::Object(m) if !m.is_empty() => m.iter().for_each(|(k, v)| walk(&join(k), v, out)),
            Value::Array(a) if !a.is_empty() => {
                a.iter().enumerate().for_each(|(i, v)| walk(&join(&i.to_string()), v, out))
            }
            leaf => {
                out.insert(prefix.to_owned(), leaf.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", v, &mut out);
    out
}

/// Whether `path` matches `pattern`: dot-separated segments, `*` for one segment, `**`
/// for any number of them.
pub fn matches(pattern: &str, path: &str) -> bool {
    fn go(p: &[&str], s: &[&str]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(&"**"), _) => go(&p[1..], s) || (!s.is_empty() && go(p, &s[1..])),
            (Some(&pp), Some(&ss)) => (pp == "*" || pp == ss) && go(&p[1..], &s[1..]),
            _ => false,
        }
    }
    let p: Vec<&str> = pattern.split('.').collect();
    let s: Vec<&str> = path.split('.').collect();
    go(&p, &s)
}

fn ignored(path: &str, ignore: &[String]) -> bool {
    ignore.iter().any(|p| matches(p, path))
}

/// Every field of `now` that differs from `saved` (both `baseline` sections), except the
/// `ignore` patterns.
pub fn drift(saved: &Value, now: &Value, ignore: &[String]) -> Vec<Drift> {
    let (a, b) = (flatten(saved), flatten(now));
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| !ignored(k, ignore))
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| Drift { field: k.clone(), expected: a.get(k).cloned(), found: b.get(k).cloned() })
        .collect()
}

/// A field on which the nodes do not all agree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeDifference {
    /// The field's path in the `baseline` section.
    pub field: String,
    /// The value most nodes have, when more than half of them agree.
    pub majority: Option<Value>,
    /// The nodes that agree with the majority.
    pub majority_nodes: Vec<String>,
    /// The nodes that do not (all of them when there is no majority), with their values
    /// (`null`: the field is missing there).
    pub odd: Vec<(String, Value)>,
}

/// The fields where the nodes differ. `nodes` are (label, `baseline` section) pairs.
pub fn compare_nodes(nodes: &[(String, Value)], ignore: &[String]) -> Vec<NodeDifference> {
    let flat: Vec<(String, BTreeMap<String, Value>)> = nodes.iter().map(|(n, v)| (n.clone(), flatten(v))).collect();
    let mut keys: Vec<&String> = flat.iter().flat_map(|(_, m)| m.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut out = Vec::new();
    for key in keys.into_iter().filter(|k| !ignored(k, ignore)) {
        let values: Vec<(&String, Value)> =
            flat.iter().map(|(n, m)| (n, m.get(key).cloned().unwrap_or(Value::Null))).collect();
        if values.iter().all(|(_, v)| *v == values[0].1) {
            continue;
        }
        // The value held by more than half of the nodes, if any.
        let majority = values
            .iter()
            .map(|(_, v)| v)
            .find(|v| values.iter().filter(|(_, w)| w == *v).count() * 2 > values.len())
            .cloned();
        let (agree, odd): (Vec<_>, Vec<_>) = values.into_iter().partition(|(_, v)| Some(v) == majority.as_ref());
        out.push(NodeDifference {
            field: key.clone(),
            majority,
            majority_nodes: agree.into_iter().map(|(n, _)| n.clone()).collect(),
            odd: odd.into_iter().map(|(n, v)| (n.clone(), v)).collect(),
        });
    }
    out
}

/// The comparison as text: one line per field, naming the odd node(s).
pub fn nodes_text(diffs: &[NodeDifference], node_count: usize) -> String {
    if diffs.is_empty() {
        return format!("all {node_count} nodes agree on every compared field\n");
    }
    let mut s = String::new();
    for d in diffs {
        let odd: Vec<String> = d.odd.iter().map(|(n, v)| format!("{n} has {v}")).collect();
        match &d.majority {
            Some(m) => {
                s += &format!(
                    "{}: {} differ(s) from the {} other node(s) ({m}): {}\n",
                    d.field,
                    d.odd.len(),
                    d.majority_nodes.len(),
                    odd.join("; ")
                )
            }
            None => s += &format!("{}: no majority: {}\n", d.field, odd.join("; ")),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::input::baseline_of;
    use crate::model::report::FORMAT;
    use serde_json::json;

    #[test]
    fn patterns_match_segments() {
        assert!(matches("devices.*.node_guid", "devices.mlx5_0.node_guid"));
        assert!(!matches("devices.*.node_guid", "devices.mlx5_0.ports.1.node_guid"));
        assert!(matches("**.source", "libraries.libibverbs.source"));
        assert!(matches("**.source", "source"));
        assert!(!matches("**.source", "libraries.libibverbs.version"));
    }

    #[test]
    fn flatten_uses_dotted_paths() {
        let f = flatten(&json!({"a": {"b": 1, "c": [true, null]}, "d": {}}));
        assert_eq!(f.len(), 4, "{f:?}");
        assert_eq!(f["a.b"], json!(1));
        assert_eq!(f["a.c.1"], Value::Null);
        assert_eq!(f["d"], json!({}));
    }

    /// A ConnectX-6 Dx node's report, as the doctor writes it.
    const NODE_A: &str = include_str!("../../testdata/node-a.json");

    fn node(edit: impl FnOnce(&mut Value)) -> Value {
        let mut v: Value = serde_json::from_str(NODE_A).unwrap();
        edit(&mut v);
        v
    }

    fn set(v: &mut Value, pointer: &str, to: Value) {
        *v.pointer_mut(pointer).unwrap_or_else(|| panic!("{pointer} in the fixture")) = to;
    }

    #[test]
    fn the_fixture_is_a_report_of_the_documented_format() {
        let r: crate::model::report::Report = serde_json::from_str(NODE_A).unwrap();
        // A version-1 report (no rdma_cm layer, no `command`): older versions still read.
        assert_eq!((r.format.as_str(), r.format_version), (FORMAT, 1));
        assert!(r.layers.iter().all(|l| l.command.is_none()));
        assert_eq!(r.baseline.devices["mlx5_0"].vendor_part_id, Some(4125));
        let v: Value = serde_json::from_str(NODE_A).unwrap();
        assert!(baseline_of(&v).is_ok());
        let mut wrong = v.clone();
        set(&mut wrong, "/format_version", json!(99));
        assert!(baseline_of(&wrong).unwrap_err().contains("format_version"));
    }

    #[test]
    fn compare_against_a_baseline_edited_in_one_field_reports_exactly_that_field() {
        let saved = node(|_| {});
        let now = node(|v| set(v, "/baseline/devices/mlx5_0/fw_ver", json!("22.39.2048")));
        let ignore: Vec<String> = SELF_IGNORE.iter().map(|s| s.to_string()).collect();
        let d = drift(baseline_of(&saved).unwrap(), baseline_of(&now).unwrap(), &ignore);
        assert_eq!(d.len(), 1, "{d:#?}");
        assert_eq!(d[0].field, "devices.mlx5_0.fw_ver");
        assert_eq!((d[0].expected.clone(), d[0].found.clone()), (Some(json!("22.36.1010")), Some(json!("22.39.2048"))));

        // Unchanged: nothing; a changed source path alone is not drift; --ignore hides a field.
        assert!(drift(baseline_of(&saved).unwrap(), baseline_of(&saved).unwrap(), &ignore).is_empty());
        let moved = node(|v| set(v, "/baseline/libraries/libibverbs/source", json!("elsewhere")));
        assert!(drift(baseline_of(&saved).unwrap(), baseline_of(&moved).unwrap(), &ignore).is_empty());
        let more = [ignore, vec!["devices.*.fw_ver".to_owned()]].concat();
        assert!(drift(baseline_of(&saved).unwrap(), baseline_of(&now).unwrap(), &more).is_empty());

        // A port that went away, and a module that appeared.
        let changed = node(|v| {
            v.pointer_mut("/baseline/devices/mlx5_0/ports").unwrap().as_object_mut().unwrap().clear();
            let modules = v.pointer_mut("/baseline/modules").unwrap().as_object_mut().unwrap();
            modules.insert("mlx5_fwctl".into(), json!({"state": "Live", "version": null}));
        });
        let d = drift(baseline_of(&saved).unwrap(), baseline_of(&changed).unwrap(), &[]);
        assert!(d.iter().any(|x| x.field == "devices.mlx5_0.ports.1.state" && x.found.is_none()), "{d:#?}");
        assert!(d.iter().any(|x| x.field == "modules.mlx5_fwctl.state" && x.expected.is_none()), "{d:#?}");
    }

    #[test]
    fn multi_node_comparison_names_the_node_whose_firmware_differs() {
        let ignore: Vec<String> = NODES_IGNORE.iter().map(|s| s.to_string()).collect();
        // Four nodes: identities differ everywhere, node-c runs older firmware.
        let nodes: Vec<(String, Value)> = ["node-a", "node-b", "node-c", "node-d"]
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let v = node(|v| {
                    set(v, "/host/hostname", json!(name));
                    set(v, "/baseline/devices/mlx5_0/node_guid", json!(format!("0c42:a103:0012:345{i}")));
                    set(v, "/baseline/devices/mlx5_0/ports/1/gids/3/gid", json!(format!("::ffff:192.168.10.1{i}")));
                    if *name == "node-c" {
                        set(v, "/baseline/devices/mlx5_0/fw_ver", json!("22.31.1014"));
                    }
                });
                (name.to_string(), baseline_of(&v).unwrap().clone())
            })
            .collect();
        let diffs = compare_nodes(&nodes, &ignore);
        assert_eq!(diffs.len(), 1, "{diffs:#?}");
        let d = &diffs[0];
        assert_eq!(d.field, "devices.mlx5_0.fw_ver");
        assert_eq!(d.majority, Some(json!("22.36.1010")));
        assert_eq!(d.odd, vec![("node-c".to_owned(), json!("22.31.1014"))]);
        assert_eq!(d.majority_nodes, ["node-a", "node-b", "node-d"]);
        let text = nodes_text(&diffs, nodes.len());
        assert!(text.contains("devices.mlx5_0.fw_ver") && text.contains("node-c has \"22.31.1014\""), "{text}");
        // Without the identity patterns, GUIDs differ too.
        assert!(compare_nodes(&nodes, &[]).len() > 1);
        assert!(compare_nodes(&nodes[..2], &ignore).is_empty());
    }

    #[test]
    fn who_ran_the_doctor_is_not_a_difference_between_nodes_or_runs() {
        let root = node(|v| {
            set(v, "/baseline/memlock/cap_ipc_lock", json!(true));
            let nodes = v.pointer_mut("/baseline/dev_nodes").unwrap().as_object_mut().unwrap();
            for n in nodes.values_mut() {
                n["can_open"] = json!(false);
                n["error"] = json!("Permission denied (os error 13)");
            }
        });
        let user = node(|_| {});
        for list in [NODES_IGNORE, SELF_IGNORE] {
            let ignore: Vec<String> = list.iter().map(|s| s.to_string()).collect();
            let (a, b) = (baseline_of(&root).unwrap(), baseline_of(&user).unwrap());
            assert!(drift(a, b, &ignore).is_empty(), "{:#?}", drift(a, b, &ignore));
            let nodes = [("root".to_owned(), a.clone()), ("user".to_owned(), b.clone())];
            assert!(compare_nodes(&nodes, &ignore).is_empty());
        }
        for f in USER_FACTS {
            assert!(SELF_IGNORE.contains(f) && NODES_IGNORE.contains(f), "{f}");
        }
    }

    #[test]
    fn majority_needs_more_than_half() {
        let nodes: Vec<(String, Value)> =
            [("a", 1), ("b", 2)].iter().map(|(n, v)| (n.to_string(), json!({ "x": v }))).collect();
        let d = compare_nodes(&nodes, &[]);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].majority, None);
        assert_eq!(d[0].odd.len(), 2);
    }
}
