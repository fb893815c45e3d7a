//! Known-bad combinations of firmware and driver versions: a JSON data file shipped with
//! the crate (`known-bad.json`), extended by files the user names. Each match becomes a
//! warning that cites the entry's source.

use std::cmp::Ordering;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::model::report::{DeviceFacts, Finding, Severity};

/// The data file shipped with the crate.
pub const BUILTIN: &str = include_str!("known-bad.json");

/// A known-bad list (the built-in one, or a user's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KnownBadList {
    /// `rdma-doctor-known-bad`.
    pub format: String,
    /// 1.
    pub format_version: u32,
    /// The entries.
    pub entries: Vec<KnownBad>,
}

/// One known-bad combination. Every condition given must hold; conditions left out
/// match anything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KnownBad {
    /// A short unique name.
    pub id: String,
    /// The product, for people (`ConnectX-6 Dx`).
    pub device: String,
    /// The IEEE vendor id `ibv_devinfo` prints (`0x02c9`).
    #[serde(default)]
    pub vendor_id: Option<String>,
    /// Vendor part ids (the PCI device id: 4125 is ConnectX-6 Dx).
    #[serde(default)]
    pub vendor_part_ids: Vec<u32>,
    /// Firmware versions below this one match.
    #[serde(default)]
    pub fw_below: Option<String>,
    /// Firmware versions equal to one of these match.
    #[serde(default)]
    pub fw_equals: Vec<String>,
    /// The kernel driver's module name (`mlx5_core`).
    #[serde(default)]
    pub kernel_driver: Option<String>,
    /// The kernel driver's version (`/sys/module/<driver>/version`); `5.4-1.0.3` and
    /// `5.4-1.0.3.0` are the same version.
    #[serde(default)]
    pub driver_version: Option<String>,
    /// What goes wrong.
    pub problem: String,
    /// What to do (advice only).
    pub advice: String,
    /// Where this is documented.
    pub source: String,
}

/// Parses a known-bad file. An entry whose `fw_below` is not a version of dotted numbers
/// (a typo such as `abc.def` would compare as text and match every firmware), or whose
/// id is empty or given twice, refuses the whole file.
pub fn parse(text: &str) -> Result<KnownBadList, String> {
    let list: KnownBadList = crate::model::input::parse_strict(text)?;
    if list.format != "rdma-doctor-known-bad" || list.format_version != 1 {
        return Err(format!(
            "not a known-bad list of format version 1 (format {:?}, version {})",
            list.format, list.format_version
        ));
    }
    for (i, e) in list.entries.iter().enumerate() {
        if e.id.trim().is_empty() {
            return Err(format!("entry {i} has an empty id"));
        }
        if let Some(v) = e.fw_below.as_deref().filter(|v| !is_numeric_version(v)) {
            return Err(format!("entry {}: fw_below {v:?} is not a version of dotted numbers (22.27.0090)", e.id));
        }
        if list.entries[..i].iter().any(|o| o.id == e.id) {
            return Err(format!("entry id {:?} is given twice", e.id));
        }
    }
    Ok(list)
}

/// `22.27.0090`, `5.4-1.0.3`: numbers separated by `.`, `-` or `_`.
fn is_numeric_version(v: &str) -> bool {
    v.trim().split(['.', '-', '_']).all(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()))
}

/// The built-in list followed by the entries of `extra` files; an id already taken by an
/// earlier list (the built-in one included) is refused, naming both.
pub fn load(extra: &[impl AsRef<Path>]) -> Result<Vec<KnownBad>, String> {
    let builtin = "the built-in known-bad list";
    let mut entries: Vec<(String, KnownBad)> = parse(BUILTIN)
        .map_err(|e| format!("{builtin}: {e}"))?
        .entries
        .into_iter()
        .map(|e| (builtin.to_owned(), e))
        .collect();
    for path in extra {
        let path = path.as_ref();
        let text = crate::model::input::read_limited(path)?;
        let name = path.display().to_string();
        for e in parse(&text).map_err(|e| format!("{name}: {e}"))?.entries {
            if let Some((first, _)) = entries.iter().find(|(_, o)| o.id == e.id) {
                return Err(format!("{name}: entry id {:?} is taken already by {first}", e.id));
            }
            entries.push((name.clone(), e));
        }
    }
    Ok(entries.into_iter().map(|(_, e)| e).collect())
}

impl KnownBad {
    /// Whether the device matches every condition of the entry.
    pub fn matches(&self, d: &DeviceFacts) -> bool {
        let vendor_ok = match (&self.vendor_id, &d.vendor_id) {
            (None, _) => true,
            (Some(want), Some(have)) => parse_hex(want).is_some() && parse_hex(want) == parse_hex(have),
            (Some(_), None) => false,
        };
        let part_ok =
            self.vendor_part_ids.is_empty() || d.vendor_part_id.is_some_and(|p| self.vendor_part_ids.contains(&p));
        let fw_below_ok = self
            .fw_below
            .as_ref()
            .is_none_or(|below| !d.fw_ver.is_empty() && compare_versions(&d.fw_ver, below) == Ordering::Less);
        let fw_eq_ok = self.fw_equals.is_empty()
            || self.fw_equals.iter().any(|v| compare_versions(&d.fw_ver, v) == Ordering::Equal);
        let driver_ok = self.kernel_driver.as_ref().is_none_or(|m| d.kernel_driver_name.as_deref() == Some(m));
        let version_ok = self.driver_version.as_ref().is_none_or(|want| {
            d.kernel_driver.version.as_deref().is_some_and(|have| compare_versions(have, want) == Ordering::Equal)
        });
        vendor_ok && part_ok && fw_below_ok && fw_eq_ok && driver_ok && version_ok
    }
}

/// Warnings for every entry that matches a device.
pub fn check(entries: &[KnownBad], scope: &str, d: &DeviceFacts) -> Vec<Finding> {
    entries
        .iter()
        .filter(|e| e.matches(d))
        .map(|e| {
            let driver = d.kernel_driver.version.as_deref().map(|v| format!(", driver {v}")).unwrap_or_default();
            Finding {
                severity: Severity::Warning,
                scope: scope.to_owned(),
                what: format!("known-bad [{}]: {} firmware {}{driver}: {}", e.id, e.device, d.fw_ver, e.problem),
                advice: Some(e.advice.clone()),
                source: Some(e.source.clone()),
                layer: Some(crate::model::layer::Layer::Device),
            }
        })
        .collect()
}

fn parse_hex(s: &str) -> Option<u32> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Compares dotted (and dashed) version numbers numerically, component by component;
/// missing trailing components count as 0 (`5.4-1.0.3` equals `5.4-1.0.3.0`), and a
/// component that is not a number compares as text.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    let split = |s: &str| s.trim().split(['.', '-', '_']).map(str::to_owned).collect::<Vec<_>>();
    let (a, b) = (split(a), split(b));
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).map_or("0", String::as_str);
        let y = b.get(i).map_or("0", String::as_str);
        let ord = match (x.parse::<u64>(), y.parse::<u64>()) {
            (Ok(x), Ok(y)) => x.cmp(&y),
            _ => x.cmp(y),
        };
        if ord != Ordering::Equal {
            return ord;
        }
    }
    Ordering::Equal
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::report::VersionFact;

    fn mellanox(part: u32, fw: &str, driver_version: Option<&str>) -> DeviceFacts {
        DeviceFacts {
            vendor_id: Some("0x02c9".into()),
            vendor_part_id: Some(part),
            fw_ver: fw.into(),
            kernel_driver_name: Some("mlx5_core".into()),
            kernel_driver: VersionFact { version: driver_version.map(Into::into), source: String::new() },
            ..DeviceFacts::default()
        }
    }

    #[test]
    fn versions_compare_numerically_with_trailing_zeros_equal() {
        assert_eq!(compare_versions("20.26.9999", "20.27.1000"), Ordering::Less);
        assert_eq!(compare_versions("22.27.0090", "22.27.90"), Ordering::Equal);
        assert_eq!(compare_versions("5.4-1.0.3", "5.4-1.0.3.0"), Ordering::Equal);
        assert_eq!(compare_versions("16.100.1", "16.24.1000"), Ordering::Greater);
    }

    #[test]
    fn builtin_list_parses_and_every_entry_cites_a_source() {
        let entries = load(&[] as &[&str]).unwrap();
        assert!(entries.len() >= 3);
        for e in &entries {
            assert!(!e.source.is_empty() && !e.advice.is_empty(), "{}", e.id);
        }
    }

    #[test]
    fn seeded_cases_match_only_their_devices() {
        let entries = load(&[] as &[&str]).unwrap();
        let ids = |d: &DeviceFacts| check(&entries, "mlx5_0", d).iter().map(|f| f.what.clone()).collect::<Vec<_>>();
        // ConnectX-6 Dx below and at the minimum.
        let old = ids(&mellanox(4125, "22.26.1040", None));
        assert_eq!(old.len(), 1, "{old:?}");
        assert!(old[0].contains("connectx6dx-fw-below-22.27.0090"), "{old:?}");
        assert!(ids(&mellanox(4125, "22.27.0090", None)).is_empty());
        // ConnectX-5 16.24.1000: only with that driver version (either spelling).
        assert!(ids(&mellanox(4119, "16.24.1000", None)).is_empty());
        assert_eq!(ids(&mellanox(4119, "16.24.1000", Some("5.4-1.0.3"))).len(), 1);
        assert!(ids(&mellanox(4119, "16.24.1000", Some("5.8-1.0.1"))).is_empty());
        assert!(ids(&mellanox(4119, "16.35.2000", Some("5.4-1.0.3.0"))).is_empty());
        // ConnectX-6 below 20.27.1000 (the seed rule), at and above it.
        let cx6 = ids(&mellanox(4123, "20.27.0500", None));
        assert_eq!(cx6.len(), 1, "{cx6:?}");
        assert!(
            cx6[0].contains("known-bad [connectx6-fw-below-20.27.1000]: ConnectX-6 firmware 20.27.0500"),
            "{cx6:?}"
        );
        assert!(cx6[0].contains("occasional QP timeouts"), "{cx6:?}");
        assert_eq!(ids(&mellanox(4124, "20.27.0500", None)).len(), 1, "its VF runs the same firmware");
        for fw in ["20.27.1000", "20.27.1016", "20.28.1002", "20.40.1000"] {
            assert!(ids(&mellanox(4123, fw, None)).is_empty(), "{fw}");
        }
        // Not a ConnectX-6 Dx (22.x) nor a ConnectX-5 at a 20.x-looking version.
        assert!(ids(&mellanox(4125, "22.27.0500", None)).is_empty());
        assert!(ids(&mellanox(4119, "20.27.0500", None)).is_empty());
        // A soft device matches nothing.
        assert!(ids(&DeviceFacts::default()).is_empty());
        let f = &check(&entries, "mlx5_0", &mellanox(4125, "22.20.1010", None))[0];
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.source.as_deref().unwrap().contains("doc.dpdk.org"), "{f:?}");
    }

    #[test]
    fn a_user_file_adds_entries_and_a_bad_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("rdma-doctor-kb-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("site.json");
        std::fs::write(
            &good,
            r#"{"format":"rdma-doctor-known-bad","format_version":1,"entries":[{"id":"site-rxe",
            "device":"SoftRoCE","kernel_driver":"rdma_rxe","problem":"p","advice":"a","source":"site runbook"}]}"#,
        )
        .unwrap();
        let entries = load(&[&good]).unwrap();
        let rxe = DeviceFacts { kernel_driver_name: Some("rdma_rxe".into()), ..DeviceFacts::default() };
        let found = check(&entries, "rxe0", &rxe);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].source.as_deref(), Some("site runbook"));

        let bad = dir.join("bad.json");
        std::fs::write(
            &bad,
            r#"{"format":"rdma-doctor-known-bad","format_version":1,"entries":[{"id":"x","typo":1}]}"#,
        )
        .unwrap();
        let err = load(&[&bad]).unwrap_err();
        assert!(err.contains("bad.json"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn list(entries: &str) -> String {
        format!(r#"{{"format":"rdma-doctor-known-bad","format_version":1,"entries":[{entries}]}}"#)
    }

    fn entry(id: &str, fw_below: &str) -> String {
        format!(
            r#"{{"id":"{id}","device":"ConnectX-6 Dx","vendor_part_ids":[4125],"fw_below":"{fw_below}","problem":"p","advice":"a","source":"s"}}"#
        )
    }

    #[test]
    fn a_fw_below_that_is_no_version_is_refused_instead_of_matching_every_firmware() {
        let err = parse(&list(&entry("typo", "abc.def"))).unwrap_err();
        assert!(err.contains("typo") && err.contains("\"abc.def\" is not a version"), "{err}");
        for bad in ["", "22..1", "22.27.x"] {
            assert!(parse(&list(&entry("typo", bad))).is_err(), "{bad:?}");
        }
        assert!(parse(&list(&entry("fine", "22.27.0090"))).is_ok());
    }

    #[test]
    fn duplicate_entry_ids_are_refused_within_a_file_and_against_the_built_in_list() {
        let twice = list(&format!("{},{}", entry("same", "1.2"), entry("same", "1.3")));
        assert!(parse(&twice).unwrap_err().contains("\"same\" is given twice"));
        let builtin_id = parse(BUILTIN).unwrap().entries[0].id.clone();
        let path = std::env::temp_dir().join(format!("rdma-doctor-kb-dup-{}.json", std::process::id()));
        std::fs::write(&path, list(&entry(&builtin_id, "1.2"))).unwrap();
        let err = load(&[&path]).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(err.contains(&builtin_id) && err.contains("taken already by the built-in known-bad list"), "{err}");
    }
}
