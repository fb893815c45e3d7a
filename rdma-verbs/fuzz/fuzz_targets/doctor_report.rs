//! What the doctor reads from other nodes and from users' files, on arbitrary text: a
//! saved report (`input::parse_report`, then `compare_nodes` and `drift` against a real
//! report) and a known-bad list (`known_bad::parse`). None of them panics; a report that
//! reads compares against itself without a difference.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_doctor::judge::{compare, known_bad};
use rdma_doctor::model::input;
use serde_json::Value;

const NODE_A: &str = include_str!("../../../rdma-doctor/testdata/node-a.json");

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = known_bad::parse(text);
    let Ok(report) = input::parse_report(text) else { return };
    let v = serde_json::to_value(&report.baseline).expect("a baseline serializes");
    let theirs = &v;
    let ours: Value = serde_json::from_str(NODE_A).expect("the test report parses");
    let ours = input::baseline_of(&ours).expect("a baseline");
    let ignore: Vec<String> = compare::NODES_IGNORE.iter().map(|s| s.to_string()).collect();
    let nodes = vec![("ours".to_owned(), ours.clone()), ("theirs".to_owned(), theirs.clone())];
    let diffs = compare::compare_nodes(&nodes, &ignore);
    let _ = compare::nodes_text(&diffs, nodes.len());
    let _ = compare::drift(ours, theirs, &ignore);
    assert!(compare::drift(theirs, theirs, &[]).is_empty());
});
