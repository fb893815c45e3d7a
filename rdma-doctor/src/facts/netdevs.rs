//! What the kernel says about a netdev, for the rate a port should run at
//! ([`crate::judge::rates`]): its speed, its link modes, and its legs when it is a bond.
//! The judgment takes these as functions ([`Netdevs`]), so its tests feed recorded ones.

use crate::facts::ethtool::LinkModes;

/// What the kernel says about a netdev: its speed in Gb/s (`None` when it has none: a
/// dummy, a link that is down), its link modes, and its legs when it is a bond.
pub struct Netdevs<'a> {
    /// `/sys/class/net/NAME/speed` in Gb/s ([`netdev_speed_gbps`]).
    pub speed_gbps: &'a dyn Fn(&str) -> Option<f64>,
    /// The `ETHTOOL_GLINKSETTINGS` link modes ([`crate::facts::ethtool::query`]).
    pub link_modes: &'a dyn Fn(&str) -> Option<LinkModes>,
    /// The bond a netdev is, when it is one ([`bond`]).
    pub bond: &'a dyn Fn(&str) -> Option<Bond>,
}

/// A bonding netdev: its mode and its legs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bond {
    /// The first word of `/sys/class/net/NAME/bonding/mode` (`balance-rr`, `active-backup`).
    pub mode: String,
    /// `/sys/class/net/NAME/bonding/slaves`.
    pub legs: Vec<String>,
}

impl Netdevs<'static> {
    /// This host's netdevs.
    pub fn live() -> Self {
        Netdevs { speed_gbps: &netdev_speed_gbps, link_modes: &crate::facts::ethtool::query, bond: &bond }
    }
}

/// The bond `name` is, from sysfs; `None` when it is not one.
pub fn bond(name: &str) -> Option<Bond> {
    let dir = std::path::Path::new("/sys/class/net").join(name).join("bonding");
    let legs = crate::facts::collect::read_trimmed(&dir.join("slaves")).unwrap_or_default();
    let mode = crate::facts::collect::read_trimmed(&dir.join("mode"))?;
    Some(Bond {
        mode: mode.split_whitespace().next().unwrap_or_default().to_owned(),
        legs: legs.split_whitespace().map(str::to_owned).collect(),
    })
}

/// `/sys/class/net/NAME/speed` (Mb/s) in Gb/s; `None` when unknown (-1, absent, a dummy).
pub fn netdev_speed_gbps(name: &str) -> Option<f64> {
    let path = std::path::Path::new("/sys/class/net").join(name).join("speed");
    let mbps: i64 = crate::facts::collect::read_trimmed(&path)?.parse().ok()?;
    (mbps > 0).then(|| mbps as f64 / 1000.0)
}
