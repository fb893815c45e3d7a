//! The resource-leak check: the device's resource counts as the kernel keeps them
//! (`rdma -j resource show`) must be back where they were when a test ends.
//!
//! Tests run one at a time (`--test-threads=1`), so the counts are this process's own
//! (and those of the processes it started, which are gone by then).

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Once;

use rdma_verbs::{CmId, EventChannel, PortSpace};

use crate::{device_name, rdma_ip};

/// Resource counts of the device under test, from the kernel (`rdma -j resource show`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)] // the kernel's names
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
    /// The counts now. Panics when the device or one of its counters is not listed: a
    /// counter the kernel does not print would compare 0 with 0 forever.
    pub fn now() -> Self {
        let dev = device_name();
        let out = Command::new("rdma")
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
        let field = |name: &str| -> u64 {
            let key = format!("\"{name}\":");
            obj.find(&key)
                .map(|i| obj[i + key.len()..].chars().take_while(char::is_ascii_digit).collect::<String>())
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
    /// Takes the snapshot the drop compares with. On iWARP, whose QPs the tests connect
    /// through rdma_cm ([`connect_rc`](crate::connect_rc)), librdmacm's context is opened
    /// first, as [`cm_leak_check`] does.
    #[must_use]
    #[allow(clippy::new_without_default)] // taking a snapshot is not a default value
    pub fn new() -> Self {
        if crate::device_transport() == rdma_verbs::Transport::Iwarp {
            librdmacm_opened();
        }
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

/// The leak check of a process that uses rdma_cm. librdmacm opens a device's context the
/// first time one of its ids binds to that device and keeps it open for the life of the
/// process: after the first rdma_cm use the device counts one context more (ctx + 1),
/// whatever is dropped. So the first call opens it, checks that the first use left
/// exactly that one context behind and nothing else, and only then takes the snapshot,
/// which the check compares with: it sees only what a test leaves.
pub fn cm_leak_check() -> LeakCheck {
    librdmacm_opened();
    LeakCheck::new()
}

/// The process's first use of rdma_cm, once: it must leave exactly one context open.
fn librdmacm_opened() {
    static OPEN: Once = Once::new();
    OPEN.call_once(|| {
        let before = ResourceCounts::now();
        bind_an_id_and_drop_it();
        let after = ResourceCounts::now();
        assert_eq!(after, ResourceCounts { ctx: before.ctx + 1, ..before }, "the first rdma_cm use leaves ctx + 1");
    });
}

/// A CM id bound to the device under test (so librdmacm opens its context), then
/// dropped: a process's first use of rdma_cm.
pub fn bind_an_id_and_drop_it() {
    let channel = EventChannel::new().unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    id.bind(SocketAddr::new(rdma_ip(), 0)).unwrap();
    let ctx = id.context().unwrap();
    assert_eq!(ctx.name(), device_name(), "rdma_cm picked the device under RDMA_IP");
    drop((ctx, id, channel));
}
