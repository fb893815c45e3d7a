//! Host-wide facts: kernel, modules, device nodes, the memlock limit. Everything here
//! only reads (files, `uname`, `getrlimit`); nothing is loaded, created or changed.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use crate::model::layer::KernelRdma;
use crate::model::report::{DevNode, HostInfo, KernelInfo, Memlock, ModuleInfo};

/// The modules the RDMA stack is made of: the core, the user-space interfaces, the
/// connection managers, and the device drivers (RDMA part and, for NICs, the Ethernet
/// part it sits on).
pub const RDMA_MODULES: &[&str] = &[
    "ib_core",
    "ib_uverbs",
    "ib_umad",
    "ib_cm",
    "iw_cm",
    "rdma_cm",
    "rdma_ucm",
    "ib_ipoib",
    "rdma_rxe",
    "siw",
    "mlx4_core",
    "mlx4_ib",
    "mlx4_en",
    "mlx5_core",
    "mlx5_ib",
    "bnxt_en",
    "bnxt_re",
    "irdma",
    "efa",
    "qedr",
    "hns_roce_hw_v2",
    "erdma",
    "mana_ib",
    "vmw_pvrdma",
    "hfi1",
    "ocrdma",
    "cxgb4",
    "iw_cxgb4",
];

/// Modules that make an RDMA device appear: at least one of them must be loaded.
pub const DEVICE_DRIVERS: &[&str] = &[
    "rdma_rxe",
    "siw",
    "mlx4_ib",
    "mlx5_ib",
    "bnxt_re",
    "irdma",
    "efa",
    "qedr",
    "hns_roce_hw_v2",
    "erdma",
    "mana_ib",
    "vmw_pvrdma",
    "hfi1",
    "ocrdma",
    "iw_cxgb4",
];

/// `uname` and who we are.
pub(crate) fn host_and_kernel() -> (HostInfo, KernelInfo) {
    // SAFETY: utsname is plain data; all-zero is a valid value.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid out-pointer.
    let ok = unsafe { libc::uname(&mut u) } == 0;
    let field = |f: &[libc::c_char]| -> String {
        if !ok {
            return String::new();
        }
        // SAFETY: uname NUL-terminates every field within its array.
        unsafe { CStr::from_ptr(f.as_ptr()) }.to_string_lossy().into_owned()
    };
    let time_unix =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    (
        HostInfo { hostname: field(&u.nodename), time_unix, euid },
        KernelInfo { release: field(&u.release), version: field(&u.version), machine: field(&u.machine) },
    )
}

/// RDMA modules from `/proc/modules`, plus the core ones built into the kernel
/// (present under `/sys/module` without being a loadable module).
pub(crate) fn modules() -> BTreeMap<String, ModuleInfo> {
    let text = std::fs::read_to_string("/proc/modules").unwrap_or_default();
    let mut out = parse_proc_modules(&text);
    for name in RDMA_MODULES {
        let dir = Path::new("/sys/module").join(name);
        if let Some(m) = out.get_mut(*name) {
            m.version = read_trimmed(&dir.join("version"));
        } else if dir.is_dir() && !dir.join("initstate").exists() {
            // Built-in modules have a /sys/module entry (for parameters) but no initstate.
            out.insert((*name).to_owned(), ModuleInfo { state: "builtin".into(), version: None });
        }
    }
    out
}

/// Whether the running kernel (`release`) has RDMA at all: ib_core loaded or built in;
/// else what its build configuration says (`/boot/config-RELEASE`, else
/// `/proc/config.gz`): a kernel built without `CONFIG_INFINIBAND` has none, whatever is
/// installed; else whether ib_core is among its modules (`/lib/modules/RELEASE`).
/// Unknown when none of these can be read (a container).
pub(crate) fn kernel_has_rdma(release: &str) -> KernelRdma {
    if Path::new("/sys/module/ib_core").is_dir() {
        return KernelRdma { has: Some(true), config: None };
    }
    let boot = Path::new("/boot").join(format!("config-{release}"));
    let config = match crate::model::input::read_limited(&boot) {
        Ok(text) => Some((boot.display().to_string(), text)),
        Err(_) => proc_config().map(|text| ("/proc/config.gz".to_owned(), text)),
    };
    if let Some((file, text)) = &config {
        if let Some((false, line)) = infiniband_config(text) {
            return KernelRdma { has: Some(false), config: Some(format!("{file}: {line}")) };
        }
    }
    let dir = Path::new("/lib/modules").join(release);
    let read = |f: &str| crate::model::input::read_limited(&dir.join(f)).ok();
    let has = rdma_in_kernel(read("modules.dep").as_deref(), read("modules.builtin").as_deref());
    // Built with RDMA but its modules are not readable here: it has RDMA.
    let built = config.as_ref().and_then(|(_, text)| infiniband_config(text)).is_some_and(|(b, _)| b);
    KernelRdma { has: has.or(built.then_some(true)), config: None }
}

/// `/proc/config.gz`, decompressed by `gzip -dc` (the doctor links no inflater); `None`
/// when absent or unreadable. Its output is read up to the doctor's file limit.
fn proc_config() -> Option<String> {
    use std::io::Read;
    if !Path::new("/proc/config.gz").exists() {
        return None;
    }
    let mut child = std::process::Command::new("gzip")
        .args(["-dc", "/proc/config.gz"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let mut text = String::new();
    let read = child.stdout.take()?.take(crate::model::input::MAX_FILE_BYTES).read_to_string(&mut text);
    let _ = child.kill();
    let _ = child.wait();
    read.ok().map(|_| text)
}

/// What a kernel build configuration says about `CONFIG_INFINIBAND`: built (`=y` or `=m`)
/// or not (`# CONFIG_INFINIBAND is not set`), with the line; `None` when it says nothing.
pub(crate) fn infiniband_config(text: &str) -> Option<(bool, &str)> {
    text.lines().find_map(|l| match l.trim() {
        "CONFIG_INFINIBAND=y" | "CONFIG_INFINIBAND=m" => Some((true, l.trim())),
        "# CONFIG_INFINIBAND is not set" => Some((false, l.trim())),
        _ => None,
    })
}

/// Whether `modules.dep` or `modules.builtin` lists ib_core (`.../ib_core.ko`, compressed
/// or not); `None` when neither was read.
pub(crate) fn rdma_in_kernel(dep: Option<&str>, builtin: Option<&str>) -> Option<bool> {
    if dep.is_none() && builtin.is_none() {
        return None;
    }
    let lists = |text: &str| {
        text.lines().any(|l| {
            let path = l.split(':').next().unwrap_or("");
            path.rsplit('/').next().is_some_and(|file| file.starts_with("ib_core.ko"))
        })
    };
    Some(dep.is_some_and(lists) || builtin.is_some_and(lists))
}

/// The RDMA lines of `/proc/modules` (`name size refcount users state address`).
pub(crate) fn parse_proc_modules(text: &str) -> BTreeMap<String, ModuleInfo> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let name = *f.first()?;
            RDMA_MODULES
                .contains(&name)
                .then(|| (name.to_owned(), ModuleInfo { state: f.get(4).unwrap_or(&"?").to_string(), version: None }))
        })
        .collect()
}

/// Every character device under `/dev/infiniband`, and whether this process can open it.
pub(crate) fn dev_nodes() -> BTreeMap<String, DevNode> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/dev/infiniband") else { return out };
    for e in entries.flatten() {
        let path = e.path();
        let Ok(meta) = std::fs::metadata(&path) else { continue };
        if !meta.file_type().is_char_device() {
            continue;
        }
        // Opening a uverbs or rdma_cm node allocates nothing until a command is written.
        let opened = std::fs::OpenOptions::new().read(true).write(true).open(&path);
        out.insert(
            path.display().to_string(),
            DevNode {
                mode: format!("{:04o}", meta.permissions().mode() & 0o7777),
                can_open: opened.is_ok(),
                error: opened.err().map(|e| e.to_string()),
            },
        );
    }
    out
}

/// `RLIMIT_MEMLOCK` and CAP_IPC_LOCK of this process.
pub(crate) fn memlock() -> Memlock {
    // SAFETY: rlimit is plain data; all-zero is a valid value.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `r` is a valid out-pointer.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0;
    let limit = |v: libc::rlim_t| if !ok || v == libc::RLIM_INFINITY { None } else { Some(v) };
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    Memlock { soft_bytes: limit(r.rlim_cur), hard_bytes: limit(r.rlim_max), cap_ipc_lock: cap_ipc_lock(&status) }
}

/// CAP_IPC_LOCK (bit 14) in the `CapEff` line of `/proc/self/status`.
pub(crate) fn cap_ipc_lock(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

/// A sysfs file's contents without the trailing newline; `None` when absent or empty.
pub(crate) fn read_trimmed(path: &Path) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_modules_keeps_the_rdma_ones_with_their_state() {
        let text = "rdma_rxe 135168 0 - Live 0xffffffffc0997000\n\
                    ib_uverbs 172032 1 rdma_rxe, Live 0xffffffffc096c000\n\
                    udp_tunnel 28672 1 rdma_rxe, Live 0xffffffffc08f1000\n\
                    mlx5_core 2000000 1 mlx5_ib, Loading 0x0\n";
        let m = parse_proc_modules(text);
        assert_eq!(m.keys().collect::<Vec<_>>(), ["ib_uverbs", "mlx5_core", "rdma_rxe"]);
        assert_eq!(m["mlx5_core"].state, "Loading");
    }

    #[test]
    fn a_kernel_without_ib_core_among_its_modules_has_no_rdma() {
        let dep = "kernel/drivers/net/e1000/e1000.ko.zst:\nkernel/fs/fuse/fuse.ko.zst:\n";
        assert_eq!(rdma_in_kernel(Some(dep), Some("kernel/fs/ext4/ext4.ko\n")), Some(false));
        let with = "kernel/drivers/infiniband/core/ib_core.ko.zst:\nkernel/drivers/infiniband/core/ib_uverbs.ko.zst: kernel/drivers/infiniband/core/ib_core.ko.zst\n";
        assert_eq!(rdma_in_kernel(Some(with), None), Some(true));
        assert_eq!(rdma_in_kernel(Some(dep), Some("kernel/drivers/infiniband/core/ib_core.ko\n")), Some(true));
        assert_eq!(rdma_in_kernel(None, None), None);
        assert_eq!(rdma_in_kernel(Some("not_ib_core.ko:\n"), None), Some(false));
    }

    #[test]
    fn a_kernel_built_without_config_infiniband_is_told_from_one_built_with_it() {
        let host = "CONFIG_NET=y\n# CONFIG_INFINIBAND is not set\nCONFIG_DUMMY=m\n";
        assert_eq!(infiniband_config(host), Some((false, "# CONFIG_INFINIBAND is not set")));
        let debian = "CONFIG_INFINIBAND=m\nCONFIG_INFINIBAND_USER_ACCESS=m\n";
        assert_eq!(infiniband_config(debian), Some((true, "CONFIG_INFINIBAND=m")));
        // Another option's line is not this one's.
        assert_eq!(infiniband_config("CONFIG_INFINIBAND_USER_ACCESS=m\n"), None);
        assert_eq!(infiniband_config(""), None);
    }

    #[test]
    fn cap_ipc_lock_is_bit_14_of_cap_eff() {
        assert!(cap_ipc_lock("Name:\tx\nCapEff:\t000001ffffffffff\n"));
        assert!(!cap_ipc_lock("CapEff:\t0000000000000000\n"));
        assert!(cap_ipc_lock("CapEff:\t0000000000004000\n"));
    }
}
