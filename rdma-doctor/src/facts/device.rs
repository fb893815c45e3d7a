//! Per-device facts: sysfs first (what the kernel enumerated), then what libibverbs
//! reports once the device is open, and the netdev under each RoCE port.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use crate::facts::collect::read_trimmed;
use crate::facts::versions;
use crate::model::report::{DeviceFacts, GidFacts, NetdevFacts, PortFacts, VersionFact};
use rdma_verbs::Context;
use rdma_verbs::{LinkLayer, PhysState, PortState};

/// Where the kernel lists RDMA devices.
pub const SYSFS_IB: &str = "/sys/class/infiniband";

/// Device names in `/sys/class/infiniband`, sorted.
pub(crate) fn sysfs_devices() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(SYSFS_IB)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// Collects the facts of device `name`; the open context comes back for the data-plane
/// test when libibverbs could open it.
pub(crate) fn collect(name: &str) -> (DeviceFacts, Option<Context>) {
    let dir = Path::new(SYSFS_IB).join(name);
    let attr = |f: &str| read_trimmed(&dir.join(f));
    let mut d = DeviceFacts {
        fw_ver: attr("fw_ver").unwrap_or_default(),
        node_guid: attr("node_guid").unwrap_or_default(),
        sys_image_guid: attr("sys_image_guid").unwrap_or_default(),
        node_type: attr("node_type").map(|t| after_colon(&t)).unwrap_or_default(),
        hca_type: attr("hca_type"),
        board_id: attr("board_id"),
        parent_netdev: attr("parent"),
        uverbs: uverbs_of(name),
        ..DeviceFacts::default()
    };
    let ctx = match Context::open(Some(name)) {
        Ok(ctx) => Some(ctx),
        Err(e) => {
            d.open_error = Some(e.to_string());
            None
        }
    };
    if let Some(ctx) = &ctx {
        d.provider = versions::provider(ctx.as_raw());
        match ctx.query_device() {
            Ok(a) => {
                if !a.fw_ver.is_empty() {
                    d.fw_ver = a.fw_ver.clone();
                }
                d.hw_ver = Some(a.hw_ver);
                d.vendor_id = Some(format!("{:#06x}", a.vendor_id));
                d.vendor_part_id = Some(a.vendor_part_id);
                for port in 1..=a.phys_port_cnt {
                    if let Some(p) = verbs_port(ctx, port) {
                        d.ports.insert(port.to_string(), p);
                    }
                }
            }
            Err(e) => d.open_error = Some(e.to_string()),
        }
    }
    if d.ports.is_empty() {
        d.ports = sysfs_ports(&dir);
    }
    // siw has no `parent` in sysfs: the netdev its port sits on is its parent.
    if d.parent_netdev.is_none() && d.provider.as_ref().is_some_and(|p| p.name == "siw") {
        d.parent_netdev = d.ports.values().find_map(|p| p.netdev.as_ref().map(|n| n.name.clone()));
    }
    let (driver, source) = kernel_driver(&dir, &d);
    let version = driver.as_deref().and_then(|m| read_trimmed(&Path::new("/sys/module").join(m).join("version")));
    let source = match (&driver, &version) {
        (Some(m), Some(_)) => format!("{source}; version from /sys/module/{m}/version"),
        (Some(m), None) => format!("{source}; /sys/module/{m} has no version: an in-tree module, see kernel.release"),
        (None, _) => source,
    };
    d.kernel_driver = VersionFact { version, source };
    d.kernel_driver_name = driver;
    (d, ctx)
}

/// The bound kernel driver: the `device/driver` link for hardware; for soft devices
/// (which sit on a netdev and have no `device`), the module of the provider's kind.
fn kernel_driver(dir: &Path, d: &DeviceFacts) -> (Option<String>, String) {
    let link = dir.join("device/driver");
    if let Ok(target) = std::fs::read_link(&link) {
        let name = target.file_name().map(|n| n.to_string_lossy().into_owned());
        return (name, format!("{} -> {}", link.display(), target.display()));
    }
    let soft = match d.provider.as_ref().map(|p| p.name.as_str()) {
        Some("rxe") => Some("rdma_rxe"),
        Some("siw") => Some("siw"),
        _ => None,
    };
    let named_by = if dir.join("parent").exists() {
        format!("{}/parent", dir.display())
    } else {
        "the netdev whose MAC its GID carries".to_owned()
    };
    match (soft, &d.parent_netdev) {
        (Some(m), Some(parent)) => {
            (Some(m.to_owned()), format!("soft device on netdev {parent} ({named_by}) served by the {m} module"))
        }
        (Some(m), None) => (Some(m.to_owned()), format!("soft device served by the {m} module")),
        _ => (None, format!("{} does not exist and the provider is not a known soft device", link.display())),
    }
}

/// `uverbsN` whose `ibdev` is `name`.
fn uverbs_of(name: &str) -> Option<String> {
    let entries = std::fs::read_dir("/sys/class/infiniband_verbs").ok()?;
    entries.flatten().find_map(|e| {
        let ibdev = read_trimmed(&e.path().join("ibdev"))?;
        (ibdev == name).then(|| e.file_name().to_string_lossy().into_owned())
    })
}

fn verbs_port(ctx: &Context, port: u8) -> Option<PortFacts> {
    let a = ctx.query_port(port).ok()?;
    let table = ctx.gid_table(port).unwrap_or_default();
    let gids: BTreeMap<String, GidFacts> = table
        .iter()
        .filter(|g| !g.gid.is_zero())
        .map(|g| {
            let facts = GidFacts { gid: g.gid.to_string(), gid_type: g.gid_type.to_string(), netdev: g.netdev.clone() };
            (g.index.to_string(), facts)
        })
        .collect();
    // A soft device on a netdev that is down may have no GID yet: its `parent` names it.
    let dev = Path::new(SYSFS_IB).join(ctx.name());
    let netdev_name = table
        .iter()
        .find_map(|g| g.netdev.clone())
        .or_else(|| read_trimmed(&dev.join(format!("ports/{port}/gid_attrs/ndevs/0"))))
        .or_else(|| read_trimmed(&dev.join("parent")))
        .or_else(|| iwarp_netdev(&dev, port));
    Some(PortFacts {
        state: state_name(a.state),
        phys_state: phys_name(a.phys_state),
        link_layer: link_layer_name(a.link_layer),
        active_mtu: a.active_mtu.bytes(),
        max_mtu: a.max_mtu.bytes(),
        width: width_name(a.active_width),
        speed: speed_name(a.active_speed),
        rate_gbps: a.rate_gbps(),
        lid: a.lid,
        netdev: netdev_name.map(|n| netdev(&n)),
        gids,
    })
}

/// Ports as sysfs shows them, for a device libibverbs cannot open.
fn sysfs_ports(dir: &Path) -> BTreeMap<String, PortFacts> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir.join("ports")) else { return out };
    for e in entries.flatten() {
        let p = e.path();
        let get = |f: &str| read_trimmed(&p.join(f)).unwrap_or_default();
        // "2.5 Gb/sec (1X SDR)"
        let rate_text = get("rate");
        let rate_gbps = rate_text.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        let inner = rate_text.split_once('(').map(|(_, r)| r.trim_end_matches(')').to_owned()).unwrap_or_default();
        let (width, speed) = inner.split_once(' ').map(|(w, s)| (w.to_owned(), s.to_owned())).unwrap_or_default();
        let name = read_trimmed(&p.join("gid_attrs/ndevs/0"))
            .or_else(|| read_trimmed(&dir.join("parent")))
            .or_else(|| e.file_name().to_str().and_then(|n| n.parse().ok()).and_then(|n| iwarp_netdev(dir, n)));
        let netdev = name.map(|n| netdev(&n));
        out.insert(
            e.file_name().to_string_lossy().into_owned(),
            PortFacts {
                state: after_colon(&get("state")),
                phys_state: after_colon(&get("phys_state")),
                link_layer: get("link_layer"),
                width,
                speed,
                rate_gbps,
                netdev,
                gids: sysfs_gids(&p),
                ..PortFacts::default()
            },
        );
    }
    out
}

/// A port's GID table as sysfs shows it (`gids/N`, `gid_attrs/types/N`,
/// `gid_attrs/ndevs/N`), empty entries left out: the same facts as libibverbs' table.
fn sysfs_gids(port: &Path) -> BTreeMap<String, GidFacts> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(port.join("gids")) else { return out };
    for e in entries.flatten() {
        let index = e.file_name().to_string_lossy().into_owned();
        let Some(gid) = read_trimmed(&e.path()).and_then(|g| g.parse::<std::net::Ipv6Addr>().ok()) else { continue };
        if gid.is_unspecified() {
            continue;
        }
        let gid_type = match read_trimmed(&port.join("gid_attrs/types").join(&index)).as_deref() {
            Some("RoCE v2") => "RoCE v2".to_owned(),
            // sysfs says `IB/RoCE v1` for both; on an Ethernet port it is RoCE v1.
            Some(t) if t.contains("RoCE v1") => {
                let ib = read_trimmed(&port.join("link_layer")).as_deref() == Some("InfiniBand");
                if ib { "IB" } else { "RoCE v1" }.to_owned()
            }
            Some(t) => t.to_owned(),
            None => continue,
        };
        let netdev = read_trimmed(&port.join("gid_attrs/ndevs").join(&index));
        out.insert(index, GidFacts { gid: gid.to_string(), gid_type, netdev });
    }
    out
}

/// The netdev under an iWARP port that sysfs does not name (siw has no `parent` and its
/// `gid_attrs/ndevs` reads EINVAL): an iWARP GID is the netdev's MAC address in its first
/// six bytes (siw's `siw_query_gid`), so the netdev whose address that is. When several
/// netdevs share the MAC (a VLAN and its parent), the first by name.
pub(crate) fn iwarp_netdev(dev: &Path, port: u8) -> Option<String> {
    if read_trimmed(&dev.join("node_type")).is_none_or(|t| after_colon(&t) != "RNIC") {
        return None;
    }
    let gid = read_trimmed(&dev.join(format!("ports/{port}/gids/0")))?;
    let mac = mac_of_gid(&gid)?;
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .ok()?
        .flatten()
        .filter(|e| read_trimmed(&e.path().join("address")).is_some_and(|a| a.eq_ignore_ascii_case(&mac)))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names.into_iter().next()
}

/// `aa:66:21:67:22:70` from the sysfs GID `aa66:2167:2270:0000:0000:0000:0000:0000`; `None`
/// for a GID that is not eight groups of four hex digits or a MAC of zeros.
fn mac_of_gid(gid: &str) -> Option<String> {
    let groups: Vec<&str> = gid.split(':').collect();
    if groups.len() != 8 || !groups.iter().all(|g| g.len() == 4 && g.bytes().all(|b| b.is_ascii_hexdigit())) {
        return None;
    }
    let hex: String = groups[..3].concat();
    if hex.bytes().all(|b| b == b'0') {
        return None;
    }
    let bytes: Vec<&str> = (0..6).map(|i| &hex[2 * i..2 * i + 2]).collect();
    Some(bytes.join(":").to_ascii_lowercase())
}

/// The IPv4 addresses of every netdev, by name (`getifaddrs`); empty when it fails.
pub(crate) fn ipv4_addresses() -> BTreeMap<String, Vec<Ipv4Addr>> {
    let mut out: BTreeMap<String, Vec<Ipv4Addr>> = BTreeMap::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list it allocated into `head`, freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut at = head;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list getifaddrs returned, not freed yet; its name is
        // a NUL-terminated string and its address, when not null, a sockaddr of the family
        // it says, read as sockaddr_in only for AF_INET.
        unsafe {
            let ifa = &*at;
            if !ifa.ifa_addr.is_null() && i32::from((*ifa.ifa_addr).sa_family) == libc::AF_INET {
                let sin = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                let name = std::ffi::CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned();
                out.entry(name).or_default().push(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            }
            at = ifa.ifa_next;
        }
    }
    // SAFETY: the list from getifaddrs above, freed once; nothing points into it now.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// `/sys/class/net/NAME`: operstate, MTU and the administrative up flag.
pub(crate) fn netdev(name: &str) -> NetdevFacts {
    let dir = PathBuf::from("/sys/class/net").join(name);
    let flags = read_trimmed(&dir.join("flags"))
        .and_then(|f| u32::from_str_radix(f.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0);
    NetdevFacts {
        name: name.to_owned(),
        operstate: read_trimmed(&dir.join("operstate")).unwrap_or_else(|| "absent".into()),
        mtu: read_trimmed(&dir.join("mtu")).and_then(|m| m.parse().ok()),
        admin_up: flags & libc::IFF_UP as u32 != 0,
    }
}

/// `ACTIVE` from `4: ACTIVE`.
fn after_colon(s: &str) -> String {
    s.split_once(": ").map_or(s, |(_, r)| r).trim().to_owned()
}

/// Port state as sysfs and `ibstat` name it.
pub fn state_name(s: PortState) -> String {
    match s {
        PortState::Nop => "NOP".into(),
        PortState::Down => "DOWN".into(),
        PortState::Init => "INIT".into(),
        PortState::Armed => "ARMED".into(),
        PortState::Active => "ACTIVE".into(),
        PortState::ActiveDefer => "ACTIVE_DEFER".into(),
        PortState::Unknown(v) => format!("unknown({v})"),
    }
}

/// Physical state as sysfs names it.
pub fn phys_name(s: PhysState) -> String {
    match s {
        PhysState::Sleep => "Sleep".into(),
        PhysState::Polling => "Polling".into(),
        PhysState::Disabled => "Disabled".into(),
        PhysState::PortConfigurationTraining => "PortConfigurationTraining".into(),
        PhysState::LinkUp => "LinkUp".into(),
        PhysState::LinkErrorRecovery => "LinkErrorRecovery".into(),
        PhysState::PhyTest => "Phy Test".into(),
        PhysState::Unknown(v) => format!("unknown({v})"),
    }
}

fn link_layer_name(l: LinkLayer) -> String {
    match l {
        LinkLayer::Ethernet => "Ethernet".into(),
        // Unspecified is what old kernels report for InfiniBand.
        LinkLayer::InfiniBand | LinkLayer::Unspecified => "InfiniBand".into(),
        LinkLayer::Unknown(v) => format!("unknown({v})"),
    }
}

fn width_name(code: u8) -> String {
    match code {
        1 => "1X".into(),
        2 => "4X".into(),
        4 => "8X".into(),
        8 => "12X".into(),
        16 => "2X".into(),
        other => format!("unknown({other})"),
    }
}

fn speed_name(code: u8) -> String {
    match code {
        1 => "SDR".into(),
        2 => "DDR".into(),
        4 => "QDR".into(),
        8 => "FDR10".into(),
        16 => "FDR".into(),
        32 => "EDR".into(),
        64 => "HDR".into(),
        128 => "NDR".into(),
        other => format!("unknown({other})"),
    }
}

/// The PCI function under an RDMA device (`/sys/class/infiniband/NAME/device`), if any.
pub(crate) fn pci_function(name: &str) -> Option<String> {
    let target = std::fs::canonicalize(format!("/sys/class/infiniband/{name}/device")).ok()?;
    let last = target.file_name()?.to_str()?;
    is_pci_address(last).then(|| last.to_owned())
}

/// `0000:03:00.0`: domain, bus, device and function.
pub(crate) fn is_pci_address(t: &str) -> bool {
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    let parts: Vec<&str> = t.split(':').collect();
    match parts.as_slice() {
        [domain, bus, devfn] => {
            let (dev, func) = devfn.split_once('.').unwrap_or(("", ""));
            hex(domain, 4) && hex(bus, 2) && hex(dev, 2) && hex(func, 1)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_iwarp_gid_names_its_netdevs_mac_and_anything_else_nothing() {
        // siw0 on a dummy netdev whose address is aa:66:21:67:22:70 (seen in the test bed).
        assert_eq!(mac_of_gid("aa66:2167:2270:0000:0000:0000:0000:0000").as_deref(), Some("aa:66:21:67:22:70"));
        assert_eq!(mac_of_gid("0000:0000:0000:0000:0000:0000:0000:0000"), None);
        assert_eq!(mac_of_gid("fe80::1"), None);
        assert_eq!(mac_of_gid("zz66:2167:2270:0000:0000:0000:0000:0000"), None);
    }
}
