//! The link modes of the netdev under a RoCE port, as the kernel reports them to `ethtool`
//! (the `ETHTOOL_GLINKSETTINGS` ioctl): the modes the NIC supports, those it advertises,
//! and those its link partner advertises.
//!
//! Two references for a degraded link come from them ([`crate::judge::rates`] uses them in this
//! order): the fastest mode both ends advertise ([`LinkModes::common_top`]), which
//! autonegotiation should have picked, so a link that runs slower lost lanes or fell back
//! (a bad cable, a dirty transceiver), and which also knows that a 100 Gb/s NIC in a
//! 25 Gb/s switch port or on a breakout cable is slower by design; and, where the partner's
//! modes are not known (many drivers report none, or the speed is forced), the fastest
//! mode the NIC supports ([`LinkModes::supported_top`]): a NIC forced from 100G to 25G runs
//! below what it can, and the verdict says so and names the rule (`--expect-rate` states
//! the rate a port is meant to have where that is less).
//! InfiniBand ports have no equivalent in the kernel's interfaces: the supported widths
//! and speeds of a port are in its PortInfo, which only a management datagram reads.

/// `ETHTOOL_GLINKSETTINGS` from `<linux/ethtool.h>`.
const GLINKSETTINGS: u32 = 0x4c;
/// The fixed part of `struct ethtool_link_settings`, in bytes; the masks follow.
const HEADER: usize = 48;
/// `link_mode_masks_nwords` is an `__s8`: at most 127 words per mask.
const MAX_WORDS: usize = 127;

/// A netdev's link settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkModes {
    /// Autonegotiation is on.
    pub autoneg: bool,
    /// The modes the NIC supports, advertises, and its link partner advertises: bitmaps
    /// of `ETHTOOL_LINK_MODE_*_BIT`, 32 bits a word.
    pub supported: Vec<u32>,
    /// See [`LinkModes::supported`].
    pub advertising: Vec<u32>,
    /// See [`LinkModes::supported`].
    pub lp_advertising: Vec<u32>,
}

/// The speed modes of `<linux/ethtool.h>` (bits 0 to 92), from 1 Gb/s up: bit, Mb/s, name.
/// A bit not listed (a newer mode, or not a speed) gives no speed.
const SPEEDS: &[(u32, u32, &str)] = &[
    (5, 1000, "1000baseT/Full"),
    (17, 1000, "1000baseKX/Full"),
    (41, 1000, "1000baseX/Full"),
    (15, 2500, "2500baseX/Full"),
    (47, 2500, "2500baseT/Full"),
    (48, 5000, "5000baseT/Full"),
    (12, 10000, "10000baseT/Full"),
    (18, 10000, "10000baseKX4/Full"),
    (19, 10000, "10000baseKR/Full"),
    (42, 10000, "10000baseCR/Full"),
    (43, 10000, "10000baseSR/Full"),
    (44, 10000, "10000baseLR/Full"),
    (45, 10000, "10000baseLRM/Full"),
    (46, 10000, "10000baseER/Full"),
    (21, 20000, "20000baseMLD2/Full"),
    (22, 20000, "20000baseKR2/Full"),
    (31, 25000, "25000baseCR/Full"),
    (32, 25000, "25000baseKR/Full"),
    (33, 25000, "25000baseSR/Full"),
    (23, 40000, "40000baseKR4/Full"),
    (24, 40000, "40000baseCR4/Full"),
    (25, 40000, "40000baseSR4/Full"),
    (26, 40000, "40000baseLR4/Full"),
    (34, 50000, "50000baseCR2/Full"),
    (35, 50000, "50000baseKR2/Full"),
    (40, 50000, "50000baseSR2/Full"),
    (52, 50000, "50000baseKR/Full"),
    (53, 50000, "50000baseSR/Full"),
    (54, 50000, "50000baseCR/Full"),
    (55, 50000, "50000baseLR_ER_FR/Full"),
    (56, 50000, "50000baseDR/Full"),
    (27, 56000, "56000baseKR4/Full"),
    (28, 56000, "56000baseCR4/Full"),
    (29, 56000, "56000baseSR4/Full"),
    (30, 56000, "56000baseLR4/Full"),
    (36, 100000, "100000baseKR4/Full"),
    (37, 100000, "100000baseSR4/Full"),
    (38, 100000, "100000baseCR4/Full"),
    (39, 100000, "100000baseLR4_ER4/Full"),
    (57, 100000, "100000baseKR2/Full"),
    (58, 100000, "100000baseSR2/Full"),
    (59, 100000, "100000baseCR2/Full"),
    (60, 100000, "100000baseLR2_ER2_FR2/Full"),
    (61, 100000, "100000baseDR2/Full"),
    (75, 100000, "100000baseKR/Full"),
    (76, 100000, "100000baseSR/Full"),
    (77, 100000, "100000baseLR_ER_FR/Full"),
    (78, 100000, "100000baseCR/Full"),
    (79, 100000, "100000baseDR/Full"),
    (62, 200000, "200000baseKR4/Full"),
    (63, 200000, "200000baseSR4/Full"),
    (64, 200000, "200000baseLR4_ER4_FR4/Full"),
    (65, 200000, "200000baseDR4/Full"),
    (66, 200000, "200000baseCR4/Full"),
    (80, 200000, "200000baseKR2/Full"),
    (81, 200000, "200000baseSR2/Full"),
    (82, 200000, "200000baseLR2_ER2_FR2/Full"),
    (83, 200000, "200000baseDR2/Full"),
    (84, 200000, "200000baseCR2/Full"),
    (69, 400000, "400000baseKR8/Full"),
    (70, 400000, "400000baseSR8/Full"),
    (71, 400000, "400000baseLR8_ER8_FR8/Full"),
    (72, 400000, "400000baseDR8/Full"),
    (73, 400000, "400000baseCR8/Full"),
    (85, 400000, "400000baseKR4/Full"),
    (86, 400000, "400000baseSR4/Full"),
    (87, 400000, "400000baseLR4_ER4_FR4/Full"),
    (88, 400000, "400000baseDR4/Full"),
    (89, 400000, "400000baseCR4/Full"),
];

fn has(mask: &[u32], bit: u32) -> bool {
    mask.get((bit / 32) as usize).is_some_and(|w| w & (1 << (bit % 32)) != 0)
}

impl LinkModes {
    /// The fastest speed mode both ends advertise, as (name, Mb/s): the rate
    /// autonegotiation should reach. `None` without autonegotiation or without the
    /// partner's modes (see the module docs).
    pub fn common_top(&self) -> Option<(&'static str, u32)> {
        if !self.autoneg {
            return None;
        }
        SPEEDS
            .iter()
            .filter(|(bit, _, _)| has(&self.advertising, *bit) && has(&self.lp_advertising, *bit))
            .max_by_key(|(_, mbps, _)| *mbps)
            .map(|(_, mbps, name)| (*name, *mbps))
    }
}

impl LinkModes {
    /// The fastest speed mode the NIC supports, as (name, Mb/s), whatever autonegotiation
    /// and the partner say; `None` when it lists no speed mode (a virtual netdev).
    pub fn supported_top(&self) -> Option<(&'static str, u32)> {
        SPEEDS
            .iter()
            .filter(|(bit, _, _)| has(&self.supported, *bit))
            .max_by_key(|(_, mbps, _)| *mbps)
            .map(|(_, mbps, name)| (*name, *mbps))
    }
}

/// Reads an `ETHTOOL_GLINKSETTINGS` reply: the fixed part, then three masks of
/// `link_mode_masks_nwords` words each (native byte order, as the kernel wrote them).
pub fn parse(reply: &[u8]) -> Result<LinkModes, String> {
    if reply.len() < HEADER {
        return Err(format!("{} bytes: shorter than the {HEADER}-byte header", reply.len()));
    }
    let word = |at: usize| u32::from_ne_bytes([reply[at], reply[at + 1], reply[at + 2], reply[at + 3]]);
    if word(0) != GLINKSETTINGS {
        return Err(format!("command {:#x}, not ETHTOOL_GLINKSETTINGS", word(0)));
    }
    let nwords = reply[15] as i8;
    let n = usize::try_from(nwords).map_err(|_| format!("{nwords} mask words: the handshake did not finish"))?;
    if reply.len() < HEADER + 3 * 4 * n {
        return Err(format!("{} bytes: too short for 3 masks of {n} words", reply.len()));
    }
    let mask = |i: usize| (0..n).map(|w| word(HEADER + 4 * (i * n + w))).collect::<Vec<u32>>();
    Ok(LinkModes { autoneg: reply[11] == 1, supported: mask(0), advertising: mask(1), lp_advertising: mask(2) })
}

/// The link modes of netdev `name`, from the kernel; `None` where it has none (a dummy, a
/// virtual netdev, a name too long) or the ioctl is refused.
pub fn query(name: &str) -> Option<LinkModes> {
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a descriptor we just opened and own from here.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // The handshake: nwords 0 asks the kernel for its size (it answers with -nwords).
    let mut buf = [0u32; HEADER / 4 + 3 * MAX_WORDS];
    let first = ioctl(&fd, name, &mut buf, 0)?;
    let wanted = -(first[15] as i8);
    if wanted <= 0 {
        return None;
    }
    parse(&ioctl(&fd, name, &mut buf, wanted)?).ok()
}

/// One `SIOCETHTOOL` `ETHTOOL_GLINKSETTINGS` call with `nwords` asked for; the reply's
/// bytes.
fn ioctl(fd: &std::os::fd::OwnedFd, name: &str, buf: &mut [u32], nwords: i8) -> Option<Vec<u8>> {
    use std::os::fd::AsRawFd;
    buf.fill(0);
    buf[0] = GLINKSETTINGS;
    // link_mode_masks_nwords is byte 15: the last byte of word 3.
    let mut word3 = buf[3].to_ne_bytes();
    word3[3] = nwords as u8;
    buf[3] = u32::from_ne_bytes(word3);
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= req.ifr_name.len() || name.as_bytes().contains(&0) {
        return None;
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    req.ifr_ifru.ifru_data = buf.as_mut_ptr().cast();
    // SAFETY: `req` names the interface and points at `buf`, which holds the header and
    // room for 3 masks of the 127 words the kernel may write at most; both outlive the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCETHTOOL, &mut req) };
    (rc == 0).then(|| buf.iter().flat_map(|w| w.to_ne_bytes()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply as the kernel writes it: autoneg, 2 words a mask, the bits of each mask.
    fn reply(autoneg: bool, masks: [&[u32]; 3]) -> Vec<u8> {
        let n = 3usize;
        let mut words = vec![0u32; HEADER / 4 + 3 * n];
        words[0] = GLINKSETTINGS;
        words[1] = 25000; // the current speed, Mb/s
        let mut w2 = [0u8; 4];
        w2[3] = u8::from(autoneg);
        words[2] = u32::from_ne_bytes(w2);
        let mut w3 = [0u8; 4];
        w3[3] = n as u8;
        words[3] = u32::from_ne_bytes(w3);
        for (i, bits) in masks.iter().enumerate() {
            for b in bits.iter() {
                words[HEADER / 4 + i * n + (*b / 32) as usize] |= 1 << (b % 32);
            }
        }
        words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    // A ConnectX-5 100 Gb/s port: 25/50/100G CR modes supported and advertised.
    const CX5: &[u32] = &[31, 34, 38, 6];

    #[test]
    fn the_fastest_mode_both_ends_advertise_is_the_reference() {
        // The switch port advertises 100G too: a link at 25G lost lanes.
        let m = parse(&reply(true, [CX5, CX5, &[38, 31]])).unwrap();
        assert_eq!(m.common_top(), Some(("100000baseCR4/Full", 100_000)));
        // A breakout cable: the partner advertises 25G only; 25G is what it should run.
        let m = parse(&reply(true, [CX5, CX5, &[31]])).unwrap();
        assert_eq!(m.common_top(), Some(("25000baseCR/Full", 25_000)));
        // 200G CR4 is bit 66: in the third word of each mask.
        let m = parse(&reply(true, [&[66], &[66, 38], &[66]])).unwrap();
        assert_eq!(m.common_top(), Some(("200000baseCR4/Full", 200_000)));
    }

    #[test]
    fn the_fastest_supported_mode_is_read_whatever_the_partner_says() {
        // Forced to 25G (no autonegotiation) on a 100G NIC: it supports 100G.
        let m = parse(&reply(false, [CX5, &[31], &[]])).unwrap();
        assert_eq!(m.supported_top(), Some(("100000baseCR4/Full", 100_000)));
        assert_eq!(parse(&reply(true, [&[6, 13], &[6], &[]])).unwrap().supported_top(), None);
    }

    #[test]
    fn supported_modes_alone_give_no_common_mode() {
        // The partner's modes not reported (many drivers): the NIC's own are no reference.
        assert_eq!(parse(&reply(true, [CX5, CX5, &[]])).unwrap().common_top(), None);
        // Forced speed, no autonegotiation.
        assert_eq!(parse(&reply(false, [CX5, CX5, CX5])).unwrap().common_top(), None);
        // Only bits that are not speeds (autoneg, pause, FEC) in common.
        assert_eq!(parse(&reply(true, [&[6, 13, 50], &[6, 13, 50], &[6, 13, 50]])).unwrap().common_top(), None);
    }

    #[test]
    fn a_short_or_foreign_reply_is_an_error_not_a_panic() {
        let good = reply(true, [CX5, CX5, CX5]);
        for len in [0, 10, HEADER - 1, HEADER, good.len() - 1] {
            assert!(parse(&good[..len]).is_err(), "{len} bytes");
        }
        let mut handshake = good.clone();
        handshake[15] = (-3i8) as u8;
        assert!(parse(&handshake).unwrap_err().contains("handshake"));
        let mut other = good;
        other[0] = 1;
        assert!(parse(&other).is_err());
        // The bit table: one entry a bit, each speed from its name.
        let mut bits: Vec<u32> = SPEEDS.iter().map(|s| s.0).collect();
        bits.sort_unstable();
        bits.dedup();
        assert_eq!(bits.len(), SPEEDS.len());
        for (_, mbps, name) in SPEEDS {
            assert!(name.starts_with(&format!("{mbps}base")), "{name}");
        }
    }

    #[test]
    fn a_netdev_without_link_modes_has_none() {
        assert_eq!(query("lo"), None);
        assert_eq!(query("no-such-netdev0"), None);
        assert_eq!(query("a-name-longer-than-ifnamsiz"), None);
    }
}
