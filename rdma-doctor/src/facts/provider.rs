//! What is found about the user-space provider of a device libibverbs cannot open (the
//! provider layer, [`crate::judge::provider_layer`], judges it).
//!
//! libibverbs reads `/etc/libibverbs.d/*.driver` (`driver mlx5`), loads
//! `lib<name>-rdmav<ABI>.so` from its provider directory for each name, and lets each
//! provider claim the devices it knows. So a device it does not list has one of four
//! causes, told apart by what is read here: no config file names the provider; the config names it but
//! the library is missing; the library is there but does not load or claim the device
//! (built for another libibverbs: libibverbs says why on stderr, captured by the private `stderr` module);
//! and for a device it lists, `ibv_open_device` failing with an errno is the kernel
//! refusing (the rdma cgroup, the open-file limit), not user space.

use std::path::{Path, PathBuf};

use crate::model::report::DeviceFacts;

/// Where libibverbs reads which providers to load (rdma-core's `IBV_CONFIG_DIR`).
pub const CONFIG_DIR: &str = "/etc/libibverbs.d";

/// What was found about the provider of one device, beyond the report's facts (not part
/// of the JSON: its conclusions are, in the provider layer and the findings).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderProbe {
    /// Whether libibverbs lists the device (`ibv_get_device_list`).
    pub listed: bool,
    /// The provider the device's kernel driver needs (`mlx5` for `mlx5_core`), when known.
    pub expected: Option<String>,
    /// The config files that name it (`/etc/libibverbs.d/mlx5.driver`).
    pub configs: Vec<String>,
    /// The provider directories searched.
    pub dirs: Vec<String>,
    /// Its library files found there (`.../libmlx5-rdmav34.so`).
    pub libraries: Vec<String>,
    /// libibverbs' own warnings about this device or this provider.
    pub warnings: Vec<String>,
}

/// The provider for a kernel driver.
pub fn expected_provider(driver: &str) -> Option<&'static str> {
    let by_driver = match driver {
        "mlx5_core" => "mlx5",
        "mlx4_core" => "mlx4",
        "rdma_rxe" => "rxe",
        "siw" => "siw",
        "bnxt_en" | "bnxt_re" => "bnxt_re",
        "ice" | "i40e" | "irdma" => "irdma",
        "efa" => "efa",
        "qede" | "qedr" => "qedr",
        "hns3" | "hns_roce_hw_v2" => "hns",
        "erdma" => "erdma",
        "mana" | "mana_ib" => "mana",
        "vmw_pvrdma" => "vmw_pvrdma",
        "hfi1" => "hfi1verbs",
        "cxgb4" | "iw_cxgb4" => "cxgb4",
        "be2net" | "ocrdma" => "ocrdma",
        _ => return None,
    };
    Some(by_driver)
}

/// The provider for a device: by its kernel driver, or for a soft device (whose driver
/// is known only once it opens) by its name.
pub(crate) fn expected_for(driver: Option<&str>, device: &str) -> Option<&'static str> {
    match driver {
        Some(d) => expected_provider(d),
        None => ["rxe", "siw"].into_iter().find(|soft| device.starts_with(soft)),
    }
}

/// The `driver NAME` directives of a libibverbs config file.
pub fn config_drivers(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("driver")).then(|| words.next().map(str::to_owned)).flatten()
        })
        .collect()
}

/// The lines of libibverbs' stderr that concern `provider` (its library) or the device's
/// uverbs node; at most 10.
pub fn relevant_warnings(stderr: &str, provider: Option<&str>, uverbs: Option<&str>) -> Vec<String> {
    let lib = provider.map(|p| format!("lib{p}-rdmav"));
    let driver = provider.map(|p| format!("driver {p} "));
    let node = uverbs.map(|u| format!("/{u}"));
    stderr
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("libibverbs:"))
        .filter(|l| {
            let has = |needle: &Option<String>| needle.as_deref().is_some_and(|n| l.contains(n));
            has(&lib) || has(&driver) || has(&node)
        })
        .take(10)
        .map(|l| l.chars().take(400).collect())
        .collect()
}

/// Reads the config directory and the provider directories for device `name`.
pub(crate) fn probe(name: &str, d: &DeviceFacts, listed: bool, stderr: &str) -> ProviderProbe {
    let expected = expected_for(d.kernel_driver_name.as_deref(), name);
    let dirs = provider_dirs();
    let (configs, libraries) = match expected {
        Some(p) => (configs_naming(Path::new(CONFIG_DIR), p), libraries_of(&dirs, p)),
        None => (vec![], vec![]),
    };
    ProviderProbe {
        listed,
        expected: expected.map(str::to_owned),
        configs,
        dirs: dirs.iter().map(|d| d.display().to_string()).collect(),
        libraries,
        warnings: relevant_warnings(stderr, expected, d.uverbs.as_deref()),
    }
}

/// The config files of `dir` with a `driver PROVIDER` line (each read with the size limit).
fn configs_naming(dir: &Path, provider: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return vec![] };
    let mut out: Vec<String> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .filter(|p| {
            crate::model::input::read_limited(p).is_ok_and(|t| config_drivers(&t).iter().any(|d| d == provider))
        })
        .map(|p| p.display().to_string())
        .collect();
    out.sort();
    out
}

/// The directory of providers next to the libibverbs this process loaded, then the
/// usual ones.
fn provider_dirs() -> Vec<PathBuf> {
    let loaded =
        rdma_verbs::ffi::dl::address(rdma_verbs::ffi::dl::Library::Ibverbs).and_then(crate::facts::versions::object_of);
    let mut dirs: Vec<PathBuf> = loaded.and_then(|p| p.parent().map(|d| d.join("libibverbs"))).into_iter().collect();
    for d in ["/usr/lib/x86_64-linux-gnu/libibverbs", "/usr/lib64/libibverbs", "/usr/lib/libibverbs"] {
        let d = PathBuf::from(d);
        if !dirs.contains(&d) && d.is_dir() {
            dirs.push(d);
        }
    }
    dirs
}

fn libraries_of(dirs: &[PathBuf], provider: &str) -> Vec<String> {
    let prefix = format!("lib{provider}-rdmav");
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        out.extend(
            entries
                .flatten()
                .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".so")))
                .map(|e| e.path().display().to_string()),
        );
    }
    out.sort();
    out
}

/// The errno in `... (os error 11)`, as `std::io::Error` prints one.
pub fn os_error(text: &str) -> Option<i32> {
    let (_, after) = text.rsplit_once("(os error ")?;
    after.split(')').next()?.parse().ok()
}
