//! MTU changes of a port: the MTU of the netdev under a RoCE port
//! (`/sys/class/net/NAME/mtu`) and the port's active MTU (`ibv_query_port`, which a soft
//! device such as rxe derives from its netdev's), compared with the last wake-up.
//!
//! A change is one line, with the old and new values. The active MTU falling is a warning:
//! QPs connected at the larger path MTU before may have their packets dropped, and new
//! ones come up at a smaller MTU than the peers that still run at the old one (a path
//! takes the smaller of its two ends). Any other change (the netdev's MTU alone, or a
//! rise) is a note. A value that cannot be read is left as it was: an unreadable file is
//! not a change.

use std::path::Path;

use serde_json::json;

use super::line::{Draft, Kind, Level};

/// A port's MTUs at one wake-up; `None` where unknown (no netdev, no context).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MtuSample {
    /// The netdev under the port (RoCE, iWARP).
    pub netdev: Option<String>,
    /// Its MTU, bytes.
    pub netdev_mtu: Option<u32>,
    /// The port's active MTU, bytes.
    pub active_mtu: Option<u32>,
}

impl MtuSample {
    /// Port `port` of device `device`: its netdev as `ib_root` (`/sys/class/infiniband`)
    /// names it, that netdev's MTU under `net_root` (`/sys/class/net`), and the active MTU
    /// `ctx` reports (where the device is open).
    pub fn read(
        ib_root: &Path,
        net_root: &Path,
        device: &str,
        port: u8,
        ctx: Option<&rdma_verbs::Context>,
    ) -> MtuSample {
        let netdev = crate::facts::netstat::port_netdev(ib_root, device, &port.to_string());
        let netdev_mtu = netdev.as_ref().and_then(|n| {
            let text = std::fs::read_to_string(net_root.join(n).join("mtu")).ok()?;
            text.trim().parse().ok()
        });
        let active_mtu = ctx.and_then(|c| c.query_port(port).ok()).map(|a| a.active_mtu.bytes());
        MtuSample { netdev, netdev_mtu, active_mtu }
    }

    /// `self` with what `now` could read: a value `now` lacks keeps the last one.
    fn merged(&self, now: &MtuSample) -> MtuSample {
        MtuSample {
            netdev: now.netdev.clone().or_else(|| self.netdev.clone()),
            netdev_mtu: now.netdev_mtu.or(self.netdev_mtu),
            active_mtu: now.active_mtu.or(self.active_mtu),
        }
    }
}

/// The line of port `port` of `device` when its MTUs changed from `was` to `now` (none
/// when nothing did); updates `was`.
pub fn mtu_lines(device: &str, port: u8, was: &mut MtuSample, now: &MtuSample) -> Vec<Draft> {
    let now = was.merged(now);
    // Another netdev under the port is not a change of MTU.
    let same_netdev = was.netdev == now.netdev;
    let netdev_changed = same_netdev && changed(was.netdev_mtu, now.netdev_mtu);
    let active_changed = changed(was.active_mtu, now.active_mtu);
    let before = std::mem::replace(was, now.clone());
    if !netdev_changed && !active_changed {
        return Vec::new();
    }
    let fell = active_changed && now.active_mtu < before.active_mtu;
    let netdev_part = match (netdev_changed, &now.netdev, before.netdev_mtu, now.netdev_mtu) {
        (true, Some(n), Some(a), Some(b)) => Some(format!("the MTU of netdev {n} changed from {a} to {b}")),
        _ => None,
    };
    let active_part = match (active_changed, before.active_mtu, now.active_mtu) {
        (true, Some(a), Some(b)) => {
            Some(format!("the port's active MTU {} from {a} to {b}", if fell { "fell" } else { "rose" }))
        }
        (false, _, Some(b)) => Some(format!("the port's active MTU stays {b}")),
        _ => None,
    };
    let mut message = [netdev_part, active_part].into_iter().flatten().collect::<Vec<_>>().join("; ");
    if fell {
        message += " (QPs connected at the larger path MTU may lose packets, and new ones run below peers \
                    still at the old MTU: give every node's netdev the same MTU)";
    }
    let level = if fell { Level::Warning } else { Level::Note };
    let details = json!({
        "netdev": now.netdev,
        "from": {"netdev_mtu": before.netdev_mtu, "active_mtu": before.active_mtu},
        "to": {"netdev_mtu": now.netdev_mtu, "active_mtu": now.active_mtu},
    });
    vec![Draft::new(Kind::Mtu, level, device, Some(port), message, details)]
}

fn changed(a: Option<u32>, b: Option<u32>) -> bool {
    matches!((a, b), (Some(a), Some(b)) if a != b)
}
