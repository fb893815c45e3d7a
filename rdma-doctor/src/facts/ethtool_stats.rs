//! The driver's own statistics of a netdev, as `ethtool -S` shows them: the names of the
//! `ETH_SS_STATS` string set (`ETHTOOL_GSSET_INFO` for their count, `ETHTOOL_GSTRINGS`),
//! then their values (`ETHTOOL_GSTATS`), through the `SIOCETHTOOL` ioctl as
//! [`crate::facts::ethtool`] reads the link modes. Only the statistics that say something about
//! pause, PFC and priorities, ECN and CNPs, discards, drops and errors are kept
//! ([`keep`]): a ConnectX port has hundreds of traffic counters besides.
//!
//! A driver with no statistics (rxe's dummy or a virtio NIC may answer `EOPNOTSUPP`) has
//! none; a count above [`MAX_STATS`] or a reply that does not match its request is refused,
//! never a panic.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `ETHTOOL_GSTRINGS` from `<linux/ethtool.h>`.
const GSTRINGS: u32 = 0x1b;
/// `ETHTOOL_GSTATS`.
const GSTATS: u32 = 0x1d;
/// `ETHTOOL_GSSET_INFO`.
const GSSET_INFO: u32 = 0x37;
/// `ETH_SS_STATS`: the string set of the driver's statistics.
const SS_STATS: u32 = 1;
/// `ETH_GSTRING_LEN`: each name is 32 bytes, NUL-padded.
const GSTRING_LEN: usize = 32;
/// The most statistics read from one netdev: a count above it is not believed.
pub const MAX_STATS: usize = 65536;

/// Whether a statistic of this name is kept: pause, PFC and priorities, ECN and CNPs,
/// discards, drops, buffer overruns and errors.
pub fn keep(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["pause", "pfc", "prio", "ecn", "cnp", "discard", "drop", "out_of_buffer", "crc", "err"]
        .iter()
        .any(|w| n.contains(w))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(w)
}

/// Reads an `ETHTOOL_GSSET_INFO` reply for `ETH_SS_STATS` (`struct ethtool_sset_info`:
/// cmd, reserved, sset_mask, then one count a set asked for): the number of statistics,
/// 0 when the driver has no such set.
pub fn parse_count(reply: &[u8]) -> Result<usize, String> {
    if reply.len() < 20 {
        return Err(format!("{} bytes: shorter than a GSSET_INFO reply", reply.len()));
    }
    if u32_at(reply, 0) != GSSET_INFO {
        return Err(format!("command {:#x}, not ETHTOOL_GSSET_INFO", u32_at(reply, 0)));
    }
    if u64_at(reply, 8) & (1 << SS_STATS) == 0 {
        return Ok(0);
    }
    let n = u32_at(reply, 16) as usize;
    if n > MAX_STATS {
        return Err(format!("{n} statistics: more than {MAX_STATS}, not believed"));
    }
    Ok(n)
}

/// Reads an `ETHTOOL_GSTRINGS` reply (`struct ethtool_gstrings`: cmd, string_set, len,
/// then `len` names of 32 bytes) of the `n` names asked for.
pub fn parse_names(reply: &[u8], n: usize) -> Result<Vec<String>, String> {
    if reply.len() < 12 || u32_at(reply, 0) != GSTRINGS || u32_at(reply, 4) != SS_STATS {
        return Err("not an ETHTOOL_GSTRINGS reply of the statistics".into());
    }
    let len = u32_at(reply, 8) as usize;
    if len != n {
        return Err(format!("{len} names where {n} were counted: the driver changed its set"));
    }
    if reply.len() < 12 + GSTRING_LEN * n {
        return Err(format!("{} bytes: too short for {n} names", reply.len()));
    }
    Ok(reply[12..12 + GSTRING_LEN * n]
        .chunks(GSTRING_LEN)
        .map(|s| {
            let end = s.iter().position(|&c| c == 0).unwrap_or(GSTRING_LEN);
            String::from_utf8_lossy(&s[..end]).trim().to_owned()
        })
        .collect())
}

/// Reads an `ETHTOOL_GSTATS` reply (`struct ethtool_stats`: cmd, n_stats, then `n_stats`
/// 64-bit values) of the `n` values asked for.
pub fn parse_values(reply: &[u8], n: usize) -> Result<Vec<u64>, String> {
    if reply.len() < 8 || u32_at(reply, 0) != GSTATS {
        return Err("not an ETHTOOL_GSTATS reply".into());
    }
    let len = u32_at(reply, 4) as usize;
    if len != n {
        return Err(format!("{len} values where {n} were counted: the driver changed its set"));
    }
    if reply.len() < 8 + 8 * n {
        return Err(format!("{} bytes: too short for {n} values", reply.len()));
    }
    Ok((0..n).map(|i| u64_at(reply, 8 + 8 * i)).collect())
}

/// Pairs names with values and keeps those [`keep`] keeps; a name given twice keeps its
/// first value.
pub fn select(names: &[String], values: &[u64]) -> Vec<(String, u64)> {
    let mut seen = std::collections::BTreeSet::new();
    names
        .iter()
        .zip(values)
        .filter(|(n, _)| !n.is_empty() && keep(n) && seen.insert(n.as_str()))
        .map(|(n, v)| (n.clone(), *v))
        .collect()
}

/// The kept statistics of netdev `name`, in the driver's order; none where it has none,
/// the name is not a netdev's, or any step is refused.
pub fn query(name: &str) -> Vec<(String, u64)> {
    read(name).unwrap_or_default()
}

fn read(name: &str) -> Option<Vec<(String, u64)>> {
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a descriptor we just opened and own from here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };

    // struct ethtool_sset_info with room for one count: 24 bytes.
    let mut info = [0u64; 3];
    info[0] = words(GSSET_INFO, 0);
    info[1] = 1 << SS_STATS;
    let n = parse_count(&bytes(call(&fd, name, &mut info)?, 24)).ok()?;
    if n == 0 {
        return Some(Vec::new());
    }
    // The kernel writes as many names and values as the driver counts at the time of
    // each call, whatever we ask: the buffers have room for MAX_STATS, and a reply whose
    // count is not `n` is refused.
    let mut strings = vec![0u64; (12 + GSTRING_LEN * MAX_STATS).div_ceil(8)];
    strings[0] = words(GSTRINGS, SS_STATS);
    strings[1] = words(n as u32, 0);
    let names = parse_names(&bytes(call(&fd, name, &mut strings)?, 12 + GSTRING_LEN * n), n).ok()?;
    let mut stats = vec![0u64; 1 + MAX_STATS];
    stats[0] = words(GSTATS, n as u32);
    let values = parse_values(&bytes(call(&fd, name, &mut stats)?, 8 + 8 * n), n).ok()?;
    Some(select(&names, &values))
}

/// Two `u32` in one `u64`, in memory order.
fn words(first: u32, second: u32) -> u64 {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&first.to_ne_bytes());
    b[4..].copy_from_slice(&second.to_ne_bytes());
    u64::from_ne_bytes(b)
}

/// The first `len` bytes of `buf`.
fn bytes(buf: &[u64], len: usize) -> Vec<u8> {
    buf.iter().flat_map(|w| w.to_ne_bytes()).take(len).collect()
}

/// One `SIOCETHTOOL` call on netdev `name` with `buf` as its data; `buf` after the call.
fn call<'a>(fd: &OwnedFd, name: &str, buf: &'a mut [u64]) -> Option<&'a [u64]> {
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.is_empty() || name.len() >= req.ifr_name.len() || name.as_bytes().contains(&0) {
        return None;
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    req.ifr_ifru.ifru_data = buf.as_mut_ptr().cast();
    // SAFETY: `req` names the interface and points at `buf`, which outlives the call and
    // holds what the command writes: a GSSET_INFO reply of one set (24 bytes), or the
    // names or values of up to MAX_STATS statistics (the caller sized it; see `read`).
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCETHTOOL, &mut req) };
    (rc == 0).then_some(&*buf)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A recorded `ethtool -S` of a ConnectX-5 port (mlx5_core), `name: value` a line.
    pub(crate) fn recorded() -> Vec<(String, u64)> {
        include_str!("../../testdata/ethtool/mlx5-ethtool-S.txt")
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_owned(), v.trim().parse().unwrap()))
            .collect()
    }

    fn names_reply(names: &[String], len: u32) -> Vec<u8> {
        let mut b = Vec::new();
        for w in [GSTRINGS, SS_STATS, len] {
            b.extend(w.to_ne_bytes());
        }
        for n in names {
            let mut s = [0u8; GSTRING_LEN];
            s[..n.len()].copy_from_slice(n.as_bytes());
            b.extend(s);
        }
        b
    }

    fn values_reply(values: &[u64], len: u32) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(GSTATS.to_ne_bytes());
        b.extend(len.to_ne_bytes());
        for v in values {
            b.extend(v.to_ne_bytes());
        }
        b
    }

    fn count_reply(mask: u64, n: u32) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(GSSET_INFO.to_ne_bytes());
        b.extend(0u32.to_ne_bytes());
        b.extend(mask.to_ne_bytes());
        b.extend(n.to_ne_bytes());
        b.extend(0u32.to_ne_bytes());
        b
    }

    #[test]
    fn an_mlx5_set_keeps_its_pause_discard_ecn_and_error_statistics_only() {
        let rec = recorded();
        let (names, values): (Vec<String>, Vec<u64>) = rec.iter().cloned().unzip();
        let n = names.len();
        assert_eq!(parse_count(&count_reply(1 << SS_STATS, n as u32)), Ok(n));
        let names = parse_names(&names_reply(&names, n as u32), n).unwrap();
        let values = parse_values(&values_reply(&values, n as u32), n).unwrap();
        let kept = select(&names, &values);
        let kept_names: Vec<&str> = kept.iter().map(|(n, _)| n.as_str()).collect();
        for want in [
            "rx_pause_ctrl_phy",
            "tx_pause_ctrl_phy",
            "rx_discards_phy",
            "tx_discards_phy",
            "rx_prio3_pause",
            "rx_out_of_buffer",
            "rx_crc_errors_phy",
            "rx_ecn_mark",
        ] {
            assert!(kept_names.contains(&want), "{want} not kept: {kept_names:?}");
        }
        for traffic in ["rx_packets", "tx_bytes", "rx_vport_unicast_packets", "ch0_arm"] {
            assert!(!kept_names.contains(&traffic), "{traffic} kept");
        }
        assert!(kept.contains(&("rx_pause_ctrl_phy".to_owned(), 7)), "{kept:?}");
    }

    #[test]
    fn an_absurd_short_or_mismatched_ethtool_answer_is_refused_not_a_panic() {
        assert_eq!(parse_count(&count_reply(0, 5)), Ok(0), "no statistics set: none");
        assert!(parse_count(&count_reply(1 << SS_STATS, 65537)).unwrap_err().contains("not believed"));
        assert!(parse_count(&count_reply(1 << SS_STATS, u32::MAX)).is_err());
        for len in 0..20 {
            assert!(parse_count(&count_reply(2, 3)[..len]).is_err(), "{len} bytes");
        }
        let names: Vec<String> = ["rx_pause_ctrl_phy", "rx_discards_phy"].map(String::from).to_vec();
        let good = names_reply(&names, 2);
        for len in 0..good.len() {
            assert!(parse_names(&good[..len], 2).is_err(), "{len} bytes");
        }
        assert!(parse_names(&names_reply(&names, 3), 2).unwrap_err().contains("changed"));
        assert!(parse_names(&values_reply(&[1, 2], 2), 2).is_err(), "another command's reply");
        let good = values_reply(&[1, 2], 2);
        for len in 0..good.len() {
            assert!(parse_values(&good[..len], 2).is_err(), "{len} bytes");
        }
        assert!(parse_values(&values_reply(&[1, 2], u32::MAX), 2).is_err());
        // Garbage: names that are not UTF-8 or fill all 32 bytes, fewer values than names.
        let mut junk = names_reply(&["x".repeat(32)], 1);
        junk[12] = 0xff;
        let got = parse_names(&junk, 1).unwrap();
        assert_eq!(got[0].chars().count(), 32);
        assert_eq!(select(&names, &[5]), [("rx_pause_ctrl_phy".to_owned(), 5)]);
        let twice = vec!["rx_discards_phy".to_owned(), "rx_discards_phy".to_owned()];
        assert_eq!(select(&twice, &[1, 2]), [("rx_discards_phy".to_owned(), 1)]);
    }

    #[test]
    fn a_netdev_without_ethtool_statistics_has_none() {
        assert!(query("lo").is_empty());
        assert!(query("no-such-netdev0").is_empty());
        assert!(query("a-name-longer-than-ifnamsiz").is_empty());
        assert!(query("").is_empty());
    }
}
