//! Hostile input, on the host (no device): the doctor's reports read from other nodes and
//! its known-bad lists, truncated at every length, seeded pseudo-random garbage by the
//! thousand, of another format or version or shape: each is refused (never a panic, never
//! half-read), and the comparison of hostile baselines never panics.

use fastrand::Rng;
use rdma_doctor::judge::{compare, known_bad};
use rdma_doctor::model::input;
use serde_json::{json, Value};

/// `len` seeded random bytes.
fn bytes(r: &mut Rng, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    r.fill(&mut v);
    v
}

const NODE_A: &str = include_str!("../testdata/node-a.json");

#[test]
fn a_saved_report_truncated_anywhere_is_refused_and_the_whole_one_is_read() {
    let read = |text: &str| input::parse_report(text).map(|_| ());
    assert!(read(NODE_A).is_ok());
    let trimmed = NODE_A.trim_end();
    for len in (0..trimmed.len()).filter(|&l| trimmed.is_char_boundary(l)) {
        assert!(read(&trimmed[..len]).is_err(), "a report cut at byte {len} was read");
    }
    let mut r = Rng::with_seed(7);
    for _ in 0..20_000 {
        let len = r.u64(0..200) as usize;
        let garbage = String::from_utf8_lossy(&bytes(&mut r, len)).into_owned();
        assert!(read(&garbage).is_err());
    }
}

#[test]
fn reports_of_another_format_or_version_or_shape_are_refused() {
    let whole: Value = serde_json::from_str(NODE_A).expect("the test report parses");
    let with = |key: &str, v: Value| {
        let mut r = whole.clone();
        r[key] = v;
        r
    };
    let without = |key: &str| {
        let mut r = whole.clone();
        r.as_object_mut().expect("an object").remove(key);
        r
    };
    for bad in [
        with("format", json!("rdma-doctor-known-bad")),
        with("format", json!(1)),
        without("format"),
        with("format_version", json!(rdma_doctor::FORMAT_VERSION + 1)),
        with("format_version", json!(0)),
        with("format_version", json!("1")),
        with("format_version", json!(1.5)),
        with("format_version", json!(-1)),
        with("format_version", json!(u64::MAX)),
        without("format_version"),
        without("baseline"),
        json!(null),
        json!([whole.clone()]),
        json!("rdma-doctor"),
        json!(1),
        json!({}),
    ] {
        assert!(input::baseline_of(&bad).is_err(), "{bad}");
        assert!(input::parse_report(&bad.to_string()).is_err(), "{bad}");
    }
}

/// A value of any JSON shape, up to `depth` levels, with keys that look like paths.
fn random_json(r: &mut Rng, depth: u32) -> Value {
    let keys = ["", ".", "a.b", "*", "**", "source", "fw_ver", "0", "devices", "\u{0}", "ports"];
    match if depth == 0 { r.u64(0..4) } else { r.u64(0..6) } {
        0 => Value::Null,
        1 => json!(r.u64(0..2) == 0),
        2 => json!(r.u64(..) as i64),
        3 => json!(keys[r.u64(0..keys.len() as u64) as usize]),
        4 => Value::Array((0..r.u64(0..4)).map(|_| random_json(r, depth - 1)).collect()),
        _ => {
            let mut m = serde_json::Map::new();
            for _ in 0..r.u64(0..4) {
                m.insert(keys[r.u64(0..keys.len() as u64) as usize].to_owned(), random_json(r, depth - 1));
            }
            Value::Object(m)
        }
    }
}

#[test]
fn comparing_hostile_baselines_never_panics_and_finds_every_difference() {
    let whole: Value = serde_json::from_str(NODE_A).expect("the test report parses");
    let base = input::baseline_of(&whole).expect("a baseline").clone();
    let ignore: Vec<String> = compare::NODES_IGNORE.iter().map(|s| s.to_string()).collect();
    let mut r = Rng::with_seed(8);
    for _ in 0..3_000 {
        let odd = random_json(&mut r, 5);
        let nodes = vec![("a".to_owned(), base.clone()), ("b".to_owned(), base.clone()), ("c".to_owned(), odd.clone())];
        let diffs = compare::compare_nodes(&nodes, &ignore);
        let _ = compare::nodes_text(&diffs, nodes.len());
        // Two identical nodes out of three are a majority: only "c" is ever odd.
        assert!(diffs.iter().all(|d| d.odd.iter().all(|(n, _)| n == "c")), "{diffs:?}");
        let drift = compare::drift(&base, &odd, &[]);
        assert_eq!(drift.is_empty(), odd == base);
    }
    // As deep as the JSON parser lets a file be: no stack overflow in the comparison.
    let deep = format!("{}1{}", "[".repeat(127), "]".repeat(127));
    let deep: Value = serde_json::from_str(&deep).expect("127 levels parse");
    assert_eq!(compare::flatten(&deep).len(), 1);
    let too_deep = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
    assert!(serde_json::from_str::<Value>(&too_deep).is_err(), "the parser's depth limit holds");
}

#[test]
fn known_bad_lists_truncated_garbage_or_of_another_format_are_refused() {
    let builtin = known_bad::parse(known_bad::BUILTIN).expect("the shipped list parses");
    assert!(!builtin.entries.is_empty());
    let text = known_bad::BUILTIN.trim_end();
    for len in (0..text.len()).filter(|&l| text.is_char_boundary(l)) {
        assert!(known_bad::parse(&text[..len]).is_err(), "a list cut at byte {len} was read");
    }
    let mut r = Rng::with_seed(9);
    for _ in 0..20_000 {
        let len = r.u64(0..200) as usize;
        assert!(known_bad::parse(&String::from_utf8_lossy(&bytes(&mut r, len))).is_err());
    }
    let mut v: Value = serde_json::from_str(known_bad::BUILTIN).expect("JSON");
    v["format_version"] = json!(2);
    assert!(known_bad::parse(&v.to_string()).unwrap_err().contains("format version 1"));
    let mut v: Value = serde_json::from_str(known_bad::BUILTIN).expect("JSON");
    v["format"] = json!("rdma-doctor");
    assert!(known_bad::parse(&v.to_string()).is_err());
    let mut v: Value = serde_json::from_str(known_bad::BUILTIN).expect("JSON");
    v["entries"][0]["unknown_field"] = json!(1);
    assert!(known_bad::parse(&v.to_string()).is_err(), "unknown fields in an entry are refused");
    // Versions of any shape compare without panicking.
    for _ in 0..20_000 {
        let a = String::from_utf8_lossy(&{
            let n = r.usize(0..12);
            bytes(&mut r, n)
        })
        .into_owned();
        let b = String::from_utf8_lossy(&{
            let n = r.usize(0..12);
            bytes(&mut r, n)
        })
        .into_owned();
        let _ = known_bad::compare_versions(&a, &b);
        assert_eq!(known_bad::compare_versions(&a, &a), std::cmp::Ordering::Equal);
    }
}
