//! Device tests of the safe crate: they need a real RDMA device, and `scripts/test` runs
//! them on rxe (`scripts/rxe`). Without a device each of them fails; a plain
//! `cargo test` lists them as ignored.
//!
//! Every test takes a [`LeakCheck`] first: when the test ends, the device's resource
//! counts (PD, MR, CQ, QP, SRQ, contexts, CM ids, as `rdma resource show` prints them)
//! must be back where they started. Tests run one at a time (`--test-threads=1`), so the
//! counts are this process's own (and those of the processes it started, which are gone
//! by then). Tests that use rdma_cm run in a process of their own, which takes the check
//! (cm.rs, faults.rs) after librdmacm's first use: librdmacm keeps one device context
//! open from then to the end of the process, so such a check counts from ctx + 1
//! (`cm::cm_leak_check`, which checks that the first use left exactly that).

/// This test's path in the binary (`module::name`), for running it alone in a child
/// process (cm.rs and faults.rs do).
macro_rules! this_test {
    () => {{
        fn here() {}
        let path = std::any::type_name_of_val(&here); // "device::<module>::<test>::here"
        let path = path.strip_suffix("::here").unwrap_or(path);
        path.split_once("::").map_or(path, |(_crate, rest)| rest)
    }};
}

mod access;
mod acm;
mod aio;
mod alloc;
mod awaited;
mod basics;
mod cm;
mod cq;
mod cq_budget;
mod datapath;
mod datapath2;
mod datapath_ext;
/// The examples in the docs, each a program in `doc/`, run.
mod doc_examples;
mod endpoint;
mod events;
mod faults;
mod mr;
mod prepared;
mod qp;
mod tools;

use rdma_verbs::Context;

/// An example binary of this workspace, next to this test binary (built on the host
/// beforehand: `cargo build --examples`, which scripts/test does).
pub fn example(name: &str) -> std::path::PathBuf {
    // target/<profile>/deps/device-<hash> -> target/<profile>/examples/<name>
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

/// Skipping is not an option: name the device or fail.
pub fn device_name() -> String {
    if let Ok(name) = std::env::var("RDMA_DEVICE") {
        return name;
    }
    let list = rdma_verbs::devices().expect("ibv_get_device_list");
    let name = list.iter().next().map(|d| d.name().to_owned());
    name.expect("no RDMA device: device tests need one; run them with scripts/test (rxe in a VM)")
}

/// The device under test, opened.
pub fn open() -> Context {
    let name = device_name();
    eprintln!("device under test: {name}");
    Context::open(Some(&name)).unwrap_or_else(|e| panic!("opening {name}: {e}"))
}

/// The GID index to use (scripts/rxe exports the IPv4 RoCE v2 one).
pub fn gid_index() -> u32 {
    std::env::var("RDMA_GID_INDEX").ok().and_then(|v| v.parse().ok()).unwrap_or(1)
}

/// Resource counts of the device under test, from the kernel (`rdma -j resource show`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResourceCounts {
    pub pd: u64,
    pub cq: u64,
    pub qp: u64,
    pub mr: u64,
    pub srq: u64,
    pub ctx: u64,
    pub cm_id: u64,
}

impl ResourceCounts {
    pub fn now() -> Self {
        let dev = device_name();
        let out = std::process::Command::new("rdma")
            .args(["-j", "resource", "show"])
            .output()
            .expect("run `rdma -j resource show` (iproute2)");
        assert!(out.status.success(), "rdma resource show failed: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        // One JSON object per device: {"ifindex":0,"ifname":"rxe0","pd":0,...}
        let obj = text
            .split('{')
            .find(|o| o.contains(&format!("\"ifname\":\"{dev}\"")))
            .unwrap_or_else(|| panic!("{dev} not in `rdma resource show`: {text}"));
        // A counter the kernel does not print would compare 0 with 0 forever: fail instead.
        let field = |name: &str| -> u64 {
            let key = format!("\"{name}\":");
            obj.find(&key)
                .map(|i| obj[i + key.len()..].chars().take_while(|c| c.is_ascii_digit()).collect::<String>())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no {name:?} counter for {dev} in `rdma -j resource show`: {text}"))
        };
        ResourceCounts {
            pd: field("pd"),
            cq: field("cq"),
            qp: field("qp"),
            mr: field("mr"),
            srq: field("srq"),
            ctx: field("ctx"),
            cm_id: field("cm_id"),
        }
    }
}

/// Asserts on drop that the device's resource counts are back to where they were.
pub struct LeakCheck(ResourceCounts);

impl LeakCheck {
    #[must_use]
    #[allow(clippy::new_without_default)] // taking a snapshot is not a default value
    pub fn new() -> Self {
        LeakCheck(ResourceCounts::now())
    }
}

impl Drop for LeakCheck {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let after = ResourceCounts::now();
        assert_eq!(after, self.0, "device resources leaked (before vs after the test)");
    }
}
