//! `tests/siw/device-suite.txt` names every test of the device suite (`tests/device`) once,
//! each either run on siw (`siw`) or not, with a reason that the file defines: no device
//! test is silently left off the siw run. Read from the sources, so no device is needed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every `#[test]` of tests/device, as `module::test` (`module::inline::test` for the
/// inline modules of rustfmt'd code: `mod NAME {` at the start of a line, closed by `}`).
fn device_tests(dir: &Path) -> BTreeSet<String> {
    let mut tests = BTreeSet::new();
    for entry in std::fs::read_dir(dir).expect("tests/device") {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") || path.file_stem().is_some_and(|s| s == "main") {
            continue;
        }
        let module = path.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        let (mut inline, mut is_test) = (None::<String>, false);
        for line in text.lines() {
            if let Some(name) = line.strip_prefix("mod ").and_then(|r| r.strip_suffix(" {")) {
                inline = Some(name.to_string());
            } else if line == "}" {
                inline = None;
            }
            let t = line.trim();
            if t == "#[test]" {
                is_test = true;
            } else if is_test && !t.starts_with("#[") {
                let name = t.split("fn ").nth(1).and_then(|r| r.split('(').next()).expect("a test fn after #[test]");
                tests.insert(match &inline {
                    Some(m) => format!("{module}::{m}::{name}"),
                    None => format!("{module}::{name}"),
                });
                is_test = false;
            }
        }
    }
    tests
}

#[test]
fn every_device_test_is_listed_for_siw_once_with_siw_or_a_defined_reason() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let list = std::fs::read_to_string(dir.join("siw/device-suite.txt")).expect("tests/siw/device-suite.txt");
    let mut reasons = BTreeMap::new();
    let mut listed = BTreeMap::new();
    for line in list.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        if let Some(r) = line.strip_prefix("reason ") {
            let (key, why) = r.split_once(": ").unwrap_or_else(|| panic!("a reason is `reason KEY: why`: {line}"));
            assert!(reasons.insert(key.to_string(), why.to_string()).is_none(), "reason {key} defined twice");
            continue;
        }
        let mut words = line.split_whitespace();
        let (test, key) = (words.next().unwrap(), words.next().unwrap_or_else(|| panic!("no `siw` or key: {line}")));
        assert!(words.next().is_none(), "one test and one key per line: {line}");
        assert!(listed.insert(test.to_string(), key.to_string()).is_none(), "{test} is listed twice");
    }
    let tests = device_tests(&dir.join("device"));
    assert!(tests.len() > 200, "found only {} device tests: is the parser still right?", tests.len());
    let missing: Vec<_> = tests.iter().filter(|t| !listed.contains_key(*t)).collect();
    assert!(missing.is_empty(), "device tests missing from tests/siw/device-suite.txt: {missing:#?}");
    let stale: Vec<_> = listed.keys().filter(|t| !tests.contains(*t)).collect();
    assert!(stale.is_empty(), "tests/siw/device-suite.txt names tests that do not exist: {stale:#?}");
    for (test, key) in &listed {
        assert!(key == "siw" || reasons.contains_key(key), "{test}: reason {key} is not defined");
    }
    let unused: Vec<_> = reasons.keys().filter(|k| !listed.values().any(|v| v == *k)).collect();
    assert!(unused.is_empty(), "reasons no test gives: {unused:?}");
    assert!(listed.values().any(|k| k == "siw"), "no device test runs on siw");
}
