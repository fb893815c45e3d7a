//! The device under test, its addresses, and the example binaries the tests run.

use std::net::IpAddr;
use std::path::PathBuf;

use std::sync::OnceLock;

use rdma_verbs::{Context, Transport};

/// The device under test: `RDMA_DEVICE`, else the first device. Skipping is not an
/// option: name the device or fail.
pub fn device_name() -> String {
    if let Ok(name) = std::env::var("RDMA_DEVICE") {
        return name;
    }
    let list = rdma_verbs::devices().expect("ibv_get_device_list");
    let name = list.iter().next().map(|d| d.name().to_owned());
    name.expect("no RDMA device: device tests need one; run them with scripts/test (rxe in a VM)")
}

/// The transport of the device under test (found once): iWARP connects its QPs only
/// through rdma_cm, which [`connect_rc`](crate::connect_rc) and the leak check follow.
pub fn device_transport() -> Transport {
    static TRANSPORT: OnceLock<Transport> = OnceLock::new();
    *TRANSPORT.get_or_init(|| {
        let name = device_name();
        let list = rdma_verbs::devices().expect("ibv_get_device_list");
        list.find(&name).unwrap_or_else(|e| panic!("the device under test: {e}")).transport()
    })
}

/// The device under test, opened.
pub fn open() -> Context {
    let name = device_name();
    eprintln!("device under test: {name}");
    Context::open(Some(&name)).unwrap_or_else(|e| panic!("opening {name}: {e}"))
}

/// The GID index to use: `RDMA_GID_INDEX` (scripts/rxe exports the IPv4 RoCE v2 one),
/// else 1.
pub fn gid_index() -> u32 {
    std::env::var("RDMA_GID_INDEX").ok().and_then(|v| v.parse().ok()).unwrap_or(1)
}

/// The IP address of the netdev under the device, which rdma_cm resolves (never
/// 127.0.0.1): `RDMA_IP` (scripts/rxe exports it), else the IPv4 address in port 1's
/// default GID. Panics when there is neither.
pub fn rdma_ip() -> IpAddr {
    let from_env = std::env::var("RDMA_IP").unwrap_or_default();
    if let Ok(ip) = from_env.parse() {
        return ip;
    }
    let from_gid = open().default_gid(1).ok().and_then(|g| g.gid.to_string().strip_prefix("::ffff:")?.parse().ok());
    from_gid.unwrap_or_else(|| {
        panic!(
            "RDMA_IP is {from_env:?} and port 1 has no IPv4 GID: rdma_cm tests need the IP address of the \
             netdev under the device; run them through scripts/rxe, which exports it"
        )
    })
}

/// An example binary of this workspace (`target/<profile>/examples/<name>`), next to the
/// running test binary (`target/<profile>/deps/<test>-<hash>`). Built on the host
/// beforehand (`cargo build --examples`, which scripts/test does): panics when missing.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(std::path::Path::parent).expect("test binary in target/<profile>/deps");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: build the examples first (`cargo build --examples`; scripts/test does)",
        path.display()
    );
    path
}

/// The file the dynamic loader resolves for `soname` (`ldconfig -p`, the x86-64 entry),
/// symlinks followed: the one to hide (a bind mount of /dev/null over it in a private
/// mount namespace makes loading it fail with "file too short").
pub fn resolved_library(soname: &str) -> std::path::PathBuf {
    let out = std::process::Command::new("ldconfig").arg("-p").output().expect("run ldconfig -p");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{soname} ")) && l.contains("x86-64"))
        .unwrap_or_else(|| panic!("ldconfig -p lists no {soname}: {text}"));
    let path = line.rsplit("=> ").next().expect("a path after =>").trim();
    std::fs::canonicalize(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}
