//! Ports and their GID tables: state, link, rate, and which GID to connect with.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::c_enum::c_enum;
use crate::ffi;

c_enum! {
    /// Logical port state (`enum ibv_port_state`).
    PortState: u32 {
        /// No state change.
        Nop = 0,
        /// Link down.
        Down = 1,
        /// Link up, waiting for the subnet manager (InfiniBand).
        Init = 2,
        /// Configured, not yet active.
        Armed = 3,
        /// Ready for traffic.
        Active = 4,
        /// Active, deferred.
        ActiveDefer = 5,
    }
}

c_enum! {
    /// Physical port state, as `ibv_devinfo` prints it.
    PhysState: u8 {
        /// Sleeping.
        Sleep = 1,
        /// Looking for a peer.
        Polling = 2,
        /// Disabled.
        Disabled = 3,
        /// Training.
        PortConfigurationTraining = 4,
        /// Link up.
        LinkUp = 5,
        /// Recovering from a link error.
        LinkErrorRecovery = 6,
        /// Test mode.
        PhyTest = 7,
    }
}

c_enum! {
    /// Path MTU (`enum ibv_mtu`).
    Mtu: u32 {
        /// 256 bytes.
        Mtu256 = 1,
        /// 512 bytes.
        Mtu512 = 2,
        /// 1024 bytes.
        Mtu1024 = 3,
        /// 2048 bytes.
        Mtu2048 = 4,
        /// 4096 bytes.
        Mtu4096 = 5,
    }
}

impl Mtu {
    /// The MTU in bytes (0 for an unknown value).
    pub fn bytes(self) -> u32 {
        match self {
            Mtu::Unknown(_) => 0,
            known => 128 << known.to_raw(),
        }
    }

    /// The raw enum for `ibv_qp_attr::path_mtu`.
    pub fn to_ffi(self) -> ffi::ibv_mtu {
        ffi::ibv_mtu(self.to_raw())
    }
}

c_enum! {
    /// Link layer of a port.
    LinkLayer: u8 {
        /// Not reported (old kernels: InfiniBand).
        Unspecified = 0,
        /// InfiniBand: addressed by LID.
        InfiniBand = 1,
        /// Ethernet (RoCE, iWARP): addressed by GID.
        Ethernet = 2,
    }
}

c_enum! {
    /// GID type (`IBV_GID_TYPE_*`).
    GidType: u32 {
        /// InfiniBand.
        Ib = 0,
        /// RoCE v1 (Ethernet, not routable).
        RoceV1 = 1,
        /// RoCE v2 (UDP/IP, routable).
        RoceV2 = 2,
    }
}

impl fmt::Display for GidType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GidType::Ib => f.write_str("IB"),
            GidType::RoceV1 => f.write_str("RoCE v1"),
            GidType::RoceV2 => f.write_str("RoCE v2"),
            GidType::Unknown(v) => write!(f, "unknown ({v})"),
        }
    }
}

/// What `ibv_query_port` says about a port.
#[derive(Clone)]
pub struct PortAttr {
    /// Logical state.
    pub state: PortState,
    /// Physical state.
    pub phys_state: PhysState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use.
    pub active_mtu: Mtu,
    /// Link width code (1: 1X, 2: 4X, 4: 8X, 8: 12X, 16: 2X).
    pub active_width: u8,
    /// Link speed code (1: SDR 2.5 Gb/s per lane ... 128: NDR 100 Gb/s per lane).
    pub active_speed: u8,
    /// InfiniBand or Ethernet.
    pub link_layer: LinkLayer,
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The subnet manager's LID.
    pub sm_lid: u16,
    /// LID mask control.
    pub lmc: u8,
    /// Entries in the GID table.
    pub gid_tbl_len: u32,
    /// Everything `ibv_query_port` returned.
    pub raw: ffi::ibv_port_attr,
}

impl PortAttr {
    pub(crate) fn from_raw(a: &ffi::ibv_port_attr) -> Self {
        PortAttr {
            state: PortState::from_raw(a.state.0),
            phys_state: PhysState::from_raw(a.phys_state),
            max_mtu: Mtu::from_raw(a.max_mtu.0),
            active_mtu: Mtu::from_raw(a.active_mtu.0),
            active_width: a.active_width,
            active_speed: a.active_speed,
            link_layer: LinkLayer::from_raw(a.link_layer),
            lid: a.lid,
            sm_lid: a.sm_lid,
            lmc: a.lmc,
            gid_tbl_len: u32::try_from(a.gid_tbl_len).unwrap_or(0),
            raw: *a,
        }
    }

    /// Number of lanes, from the width code (0 when unknown).
    pub fn width_lanes(&self) -> u32 {
        match self.active_width {
            1 => 1,
            2 => 4,
            4 => 8,
            8 => 12,
            16 => 2,
            _ => 0,
        }
    }

    /// Signalling rate of one lane in Gb/s, from the speed code (0.0 when unknown).
    pub fn lane_gbps(&self) -> f64 {
        match self.active_speed {
            1 => 2.5,
            2 => 5.0,
            4 | 8 => 10.0,
            16 => 14.0,
            32 => 25.0,
            64 => 50.0,
            128 => 100.0,
            _ => 0.0,
        }
    }

    /// The link rate in Gb/s: lanes times lane speed, as `ibv_devinfo` and `ibstat` show it.
    pub fn rate_gbps(&self) -> f64 {
        f64::from(self.width_lanes()) * self.lane_gbps()
    }

    /// True for RoCE and iWARP ports, where peers are addressed by GID.
    pub fn is_ethernet(&self) -> bool {
        self.link_layer == LinkLayer::Ethernet
    }
}

impl fmt::Debug for PortAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PortAttr")
            .field("state", &self.state)
            .field("phys_state", &self.phys_state)
            .field("active_mtu", &self.active_mtu)
            .field("rate_gbps", &self.rate_gbps())
            .field("link_layer", &self.link_layer)
            .field("lid", &self.lid)
            .field("gid_tbl_len", &self.gid_tbl_len)
            .finish_non_exhaustive()
    }
}

/// A 128-bit GID, in network byte order as it goes on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID as an IPv6 address (RoCE GIDs are IPv6 or IPv4-mapped addresses).
    pub fn to_ipv6(self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn ipv4(self) -> Option<Ipv4Addr> {
        self.to_ipv6().to_ipv4_mapped()
    }

    /// True for the all-zero GID of an empty table slot.
    pub fn is_zero(self) -> bool {
        self.0 == [0; 16]
    }

    /// True for an IPv6 link-local GID (`fe80::/10`), the default GID of RoCE ports.
    pub fn is_link_local(self) -> bool {
        self.0[0] == 0xfe && (self.0[1] & 0xc0) == 0x80
    }

    /// The raw union for `ibv_global_route::dgid`.
    pub fn to_ffi(self) -> ffi::ibv_gid {
        ffi::ibv_gid { raw: self.0 }
    }

    /// From the raw union.
    pub fn from_ffi(g: &ffi::ibv_gid) -> Self {
        // SAFETY: every bit pattern of the union is a valid [u8; 16].
        Gid(unsafe { g.raw })
    }
}

/// The IPv4-mapped GID of an IPv4 address (`::ffff:a.b.c.d`): what a RoCE v2 port lists
/// for an IPv4 address of its netdev, and what a peer's `dgid` is when you know its IP.
impl From<Ipv4Addr> for Gid {
    fn from(ip: Ipv4Addr) -> Gid {
        Gid(ip.to_ipv6_mapped().octets())
    }
}

/// The GID of an IPv6 address, byte for byte.
impl From<Ipv6Addr> for Gid {
    fn from(ip: Ipv6Addr) -> Gid {
        Gid(ip.octets())
    }
}

/// An IPv4 address's mapped GID, or an IPv6 address's own.
impl From<IpAddr> for Gid {
    fn from(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => v4.into(),
            IpAddr::V6(v6) => v6.into(),
        }
    }
}

/// The GID as an IPv6 address (an IPv4-mapped one for an IPv4 RoCE v2 GID).
impl From<Gid> for Ipv6Addr {
    fn from(gid: Gid) -> Ipv6Addr {
        gid.to_ipv6()
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ipv4() {
            Some(v4) => write!(f, "::ffff:{v4}"),
            None => write!(f, "{}", self.to_ipv6()),
        }
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// One entry of a port's GID table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the table (what `ibv_ah_attr.grh.sgid_index` takes).
    pub index: u32,
    /// The port.
    pub port: u8,
    /// The GID.
    pub gid: Gid,
    /// IB, RoCE v1 or RoCE v2.
    pub gid_type: GidType,
    /// The netdev the GID belongs to (RoCE), if any.
    pub netdev: Option<String>,
}

impl GidEntry {
    pub(crate) fn from_raw(e: &ffi::ibv_gid_entry) -> Self {
        GidEntry {
            index: e.gid_index,
            port: u8::try_from(e.port_num).unwrap_or(0),
            gid: Gid::from_ffi(&e.gid),
            gid_type: GidType::from_raw(e.gid_type),
            netdev: ifindex_name(e.ndev_ifindex),
        }
    }
}

fn ifindex_name(ifindex: u32) -> Option<String> {
    if ifindex == 0 {
        return None;
    }
    let mut buf = [0u8; libc::IF_NAMESIZE];
    // SAFETY: buf holds IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr().cast()) };
    if p.is_null() {
        return None;
    }
    let name = std::ffi::CStr::from_bytes_until_nul(&buf).ok()?;
    Some(name.to_string_lossy().into_owned())
}

/// Picks the GID to connect with on a RoCE port: RoCE v2 with an IPv4-mapped address
/// first (routable, and what perftest and rdma_cm prefer), then any other RoCE v2 GID that
/// is not link-local. `None` when the table has neither.
pub fn choose_roce_gid(table: &[GidEntry]) -> Option<&GidEntry> {
    let v2 = || table.iter().filter(|e| e.gid_type == GidType::RoceV2 && !e.gid.is_zero());
    v2().find(|e| e.gid.ipv4().is_some()).or_else(|| v2().find(|e| !e.gid.is_link_local()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, gid: &str, gid_type: GidType) -> GidEntry {
        let ip: Ipv6Addr = gid.parse().unwrap();
        GidEntry { index, port: 1, gid: ip.into(), gid_type, netdev: None }
    }

    #[test]
    fn a_gid_comes_from_an_ip_address_and_goes_back() {
        let v4 = Ipv4Addr::new(10, 99, 0, 1);
        let gid = Gid::from(v4);
        assert_eq!(gid.to_string(), "::ffff:10.99.0.1");
        assert_eq!((gid.ipv4(), Gid::from(IpAddr::V4(v4))), (Some(v4), gid));
        let v6: Ipv6Addr = "fe80::5054:ff:fe12:3456".parse().unwrap();
        let gid = Gid::from(IpAddr::V6(v6));
        assert!(gid.is_link_local() && gid.ipv4().is_none());
        assert_eq!((Ipv6Addr::from(gid), Gid::from(v6)), (v6, gid));
    }

    #[test]
    fn roce_gid_choice_prefers_ipv4_mapped_roce_v2() {
        let table = [
            entry(0, "fe80::1", GidType::RoceV1),
            entry(1, "fe80::1", GidType::RoceV2),
            entry(2, "2001:db8::5", GidType::RoceV2),
            entry(3, "::ffff:10.0.0.1", GidType::RoceV1),
            entry(4, "::ffff:10.0.0.1", GidType::RoceV2),
        ];
        assert_eq!(choose_roce_gid(&table).unwrap().index, 4);
        assert_eq!(choose_roce_gid(&table[..4]).unwrap().index, 2);
        assert!(choose_roce_gid(&table[..2]).is_none());
    }

    #[test]
    fn gid_text_matches_ibv_devinfo() {
        assert_eq!(entry(1, "::ffff:10.99.0.1", GidType::RoceV2).gid.to_string(), "::ffff:10.99.0.1");
        assert_eq!(entry(0, "fe80::a866:21ff:fe67:2270", GidType::RoceV2).gid.to_string(), "fe80::a866:21ff:fe67:2270");
    }

    #[test]
    fn unknown_c_values_are_kept() {
        assert_eq!(PortState::from_raw(77), PortState::Unknown(77));
        assert_eq!(PortState::Unknown(77).to_raw(), 77);
        assert_eq!(Mtu::from_raw(3).bytes(), 1024);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
    }

    #[test]
    fn rate_is_lanes_times_lane_speed() {
        // SAFETY: ibv_port_attr is plain data; all-zero is a valid value.
        let mut raw: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
        raw.active_width = 2; // 4X
        raw.active_speed = 32; // EDR, 25 Gb/s a lane
        assert_eq!(PortAttr::from_raw(&raw).rate_gbps(), 100.0);
        raw.active_width = 1;
        raw.active_speed = 1;
        assert_eq!(PortAttr::from_raw(&raw).rate_gbps(), 2.5);
    }
}
