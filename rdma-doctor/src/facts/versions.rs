//! Version numbers of the user-space stack, each with the place it was read: the library
//! this process really loaded, the files next to it, the package database.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};

use crate::model::report::{Packages, ProviderFacts, VersionFact};
use rdma_verbs::ffi;

/// Packages worth recording; names differ between distributions.
const PACKAGES: &[&str] = &[
    "rdma-core",
    "libibverbs1",
    "libibverbs",
    "librdmacm1",
    "librdmacm",
    "ibverbs-providers",
    "libibverbs-utils",
    "ibverbs-utils",
    "mlnx-ofed-kernel-dkms",
    "mlnx-ofed-kernel-utils",
    "mlnx-ofed-kernel",
    "kmod-mlnx-ofa_kernel",
    "mlnx-tools",
];

/// The shared object that contains `addr`: the file of the mapping of `/proc/self/maps`
/// that holds it (the kernel names the file itself, symlinks resolved).
pub(crate) fn object_of(addr: *const c_void) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    mapping_of(&maps, addr as usize)
}

/// The file of the line of a maps table whose range holds `addr`
/// (`start-end perms offset dev inode path`).
fn mapping_of(maps: &str, addr: usize) -> Option<PathBuf> {
    maps.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (start, end) = f.next()?.split_once('-')?;
        let (start, end) = (usize::from_str_radix(start, 16).ok()?, usize::from_str_radix(end, 16).ok()?);
        let path = f.nth(4)?;
        (start <= addr && addr < end && path.starts_with('/')).then(|| PathBuf::from(path))
    })
}

/// `1.14.44.0` from `libibverbs.so.1.14.44.0`.
pub(crate) fn so_version(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    let (_, v) = name.split_once(".so.")?;
    (!v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.')).then(|| v.to_owned())
}

/// The user-space libraries: libibverbs as loaded, librdmacm as loaded or installed next
/// to it, and the rdma-core release both belong to.
pub(crate) fn libraries() -> BTreeMap<String, VersionFact> {
    let mut out = BTreeMap::new();
    let verbs = ffi::dl::address(ffi::dl::Library::Ibverbs).and_then(object_of);
    let verbs_fact = match &verbs {
        Some(p) => VersionFact {
            version: so_version(p),
            source: format!("file name of the libibverbs this process loaded: {}", p.display()),
        },
        None => VersionFact {
            version: None,
            source: match ffi::dl::load(ffi::dl::Library::Ibverbs) {
                Err(e) => e.to_string(),
                Ok(()) => "no mapped file holds libibverbs' ibv_get_device_list".into(),
            },
        },
    };
    // rdma-core names its libraries ABI.MINOR.RELEASE.PATCH: libibverbs.so.1.14.44.0 is
    // rdma-core 44.0.
    let release = verbs_fact.version.as_deref().and_then(|v| {
        let parts: Vec<&str> = v.split('.').collect();
        (parts.len() >= 4).then(|| parts[2..].join("."))
    });
    out.insert(
        "rdma-core".to_owned(),
        VersionFact {
            source: match &verbs {
                Some(p) if release.is_some() => format!("release part of the libibverbs file name ({})", p.display()),
                _ => "no libibverbs file name with a release number".into(),
            },
            version: release,
        },
    );
    out.insert("libibverbs".to_owned(), verbs_fact);
    out.insert("librdmacm".to_owned(), rdmacm(verbs.as_deref()));
    out
}

fn rdmacm(verbs: Option<&Path>) -> VersionFact {
    if let Some(p) = loaded_object("librdmacm.so") {
        return VersionFact { version: so_version(&p), source: format!("loaded by this process: {}", p.display()) };
    }
    let mut dirs: Vec<PathBuf> = verbs.and_then(Path::parent).map(Path::to_path_buf).into_iter().collect();
    for d in ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib64", "/lib/x86_64-linux-gnu"] {
        dirs.push(PathBuf::from(d));
    }
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        let mut found: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("librdmacm.so."))
                    && !p.is_symlink()
            })
            .collect();
        found.sort();
        if let Some(p) = found.pop() {
            return VersionFact { version: so_version(&p), source: format!("file name of {}", p.display()) };
        }
    }
    VersionFact { version: None, source: "librdmacm is neither loaded nor installed next to libibverbs".into() }
}

/// A loaded object whose file name starts with `prefix` (`/proc/self/maps`).
fn loaded_object(prefix: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(PathBuf::from)
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix)))
}

/// The provider behind an open context: the object that holds its `poll_cq`, which every
/// provider implements itself.
pub(crate) fn provider(ctx: *mut ffi::ibv_context) -> Option<ProviderFacts> {
    // SAFETY: the caller passes an open context; its ops table is plain data the
    // provider filled in at open.
    let poll_cq = unsafe { (*ctx).ops.poll_cq }?;
    let path = object_of(poll_cq as *const c_void)?;
    let file = path.file_name()?.to_str()?.to_owned();
    // libmlx5.so.1.24.44.0 -> mlx5; librxe-rdmav34.so -> rxe.
    let stem = file.strip_prefix("lib").unwrap_or(&file);
    let name = stem.split(['-', '.']).next().unwrap_or(stem).to_owned();
    Some(ProviderFacts { name, version: so_version(&path), library: path.display().to_string() })
}

/// RDMA package versions from dpkg's database, or from rpm.
pub(crate) fn packages() -> Packages {
    if let Ok(status) = std::fs::read_to_string("/var/lib/dpkg/status") {
        return Packages { manager: Some("dpkg".into()), versions: parse_dpkg_status(&status) };
    }
    // rpm has no database format worth parsing by hand; querying it changes nothing.
    let out = std::process::Command::new("rpm")
        .args(["-q", "--qf", "%{NAME} %{VERSION}-%{RELEASE}\\n"])
        .args(PACKAGES)
        .stderr(std::process::Stdio::null())
        .output();
    match out {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            let versions = text
                .lines()
                .filter(|l| !l.contains("not installed"))
                .filter_map(|l| l.split_once(' '))
                .map(|(n, v)| (n.to_owned(), v.trim().to_owned()))
                .collect();
            Packages { manager: Some("rpm".into()), versions }
        }
        Err(_) => Packages::default(),
    }
}

/// Installed RDMA packages in a dpkg status file.
pub(crate) fn parse_dpkg_status(status: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for stanza in status.split("\n\n") {
        let field = |name: &str| {
            stanza.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')).map(str::trim))
        };
        let (Some(pkg), Some(version)) = (field("Package"), field("Version")) else { continue };
        let installed = field("Status").is_some_and(|s| s.ends_with(" installed"));
        if installed && PACKAGES.contains(&pkg) {
            out.insert(pkg.to_owned(), version.to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_holding_an_address_is_the_mapping_whose_range_holds_it() {
        let maps = "7f0000000000-7f0000001000 r--p 00000000 fd:01 42 /usr/lib/libibverbs.so.1.14.44.0\n\
                    7f0000001000-7f0000009000 r-xp 00001000 fd:01 42 /usr/lib/libibverbs.so.1.14.44.0\n\
                    7f0000009000-7f000000a000 rw-p 00000000 00:00 0 \n\
                    7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]\n";
        let lib = Some(PathBuf::from("/usr/lib/libibverbs.so.1.14.44.0"));
        assert_eq!(mapping_of(maps, 0x7f00_0000_1234), lib);
        assert_eq!(mapping_of(maps, 0x7f00_0000_9010), None);
        assert_eq!(mapping_of(maps, 0x7ffd_0000_0010), None);
        assert_eq!(mapping_of(maps, 0x10), None);
        // This process: the function below lives in this test binary.
        fn here() {}
        let me = object_of(here as fn() as *const c_void).expect("a mapping");
        assert_eq!(me, std::env::current_exe().unwrap());
    }

    #[test]
    fn so_versions_and_dpkg_records_are_read() {
        assert_eq!(so_version(Path::new("/usr/lib/libibverbs.so.1.14.44.0")).as_deref(), Some("1.14.44.0"));
        assert_eq!(so_version(Path::new("/usr/lib/libibverbs/librxe-rdmav34.so")), None);
        let status = "Package: libibverbs1\nStatus: install ok installed\nArchitecture: amd64\nVersion: 44.0-2\n\n\
                      Package: rdma-core\nStatus: deinstall ok config-files\nVersion: 43.0-1\n\n\
                      Package: bash\nStatus: install ok installed\nVersion: 5.2\n";
        let got = parse_dpkg_status(status);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got["libibverbs1"], "44.0-2");
    }
}
