//! The messages of perftest's out-of-band exchange, byte for byte, with strict parsers:
//! every message has a fixed size, so every read is bounded, and nothing a peer sends
//! can panic the parser (the tests below feed it hostile input).

use rdma_verbs::Mtu;

/// The version field: 16 bytes, text, NUL-padded (perftest's `MAX_VERSION`).
pub const VERSION_LEN: usize = 16;
/// What these tools send as their version: perftest 6.06's exchange (the version of
/// Debian's perftest 4.5+0.17), marked so that two of our tools recognise each other.
/// perftest reads it with `atof`, which stops at the space: 6.06.
pub const OUR_VERSION: &[u8; VERSION_LEN] = b"6.06 rdma-verbs\0";
/// The oldest peer perftest itself accepts (`check_version_compatibility`).
pub const MIN_VERSION: f64 = 5.70;
/// A destination message with a GID (perftest's `KEY_MSG_SIZE_GID`): RoCE, or `-x`.
pub const DEST_LEN_GID: usize = 108;
/// A destination message without one (`KEY_MSG_SIZE`): InfiniBand without `-x`.
pub const DEST_LEN: usize = 59;
/// A destination message of the rdma_cm mode (`-R`): perftest's `struct pingpong_dest`
/// in binary, as x86_64 lays it out (56 bytes).
pub const DEST_LEN_CM: usize = 56;
/// What each side writes after the closing handshake (`ctx_close_connection`).
pub const DONE: &[u8; 5] = b"done\0";
/// Largest cycle buffer taken from a peer: it sizes the region a perftest requester
/// cycles its addresses over, which this side allocates.
pub const MAX_CYCLE_BUFFER: u32 = 64 << 20;
/// Largest cache line taken from a peer.
pub const MAX_CACHE_LINE: u32 = 4096;

/// Who the peer is, from its version field.
#[derive(Debug, Clone, PartialEq)]
pub enum PeerKind {
    /// Another of these tools: the exchange goes on in rdma-verbs' endpoint format.
    Ours,
    /// perftest (or a tool speaking its exchange), with its version text.
    Perftest(String),
}

/// The peer's version field: printable text up to the first NUL, a number at least
/// [`MIN_VERSION`] at its start (as perftest reads it with `atof`).
pub fn parse_version(buf: &[u8; VERSION_LEN]) -> Result<PeerKind, String> {
    if buf == OUR_VERSION {
        return Ok(PeerKind::Ours);
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(VERSION_LEN);
    let text = &buf[..end];
    if text.is_empty() || !text.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        return Err(format!("the peer's version field is not a perftest version: {:02x?}", &buf[..]));
    }
    let text = String::from_utf8_lossy(text).into_owned();
    let number: String = text.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    let value: f64 = number.parse().map_err(|_| format!("the peer's version {text:?} does not start with a number"))?;
    if value < MIN_VERSION {
        return Err(format!(
            "the peer's perftest version {text:?} is older than {MIN_VERSION:.2}, which perftest itself refuses"
        ));
    }
    Ok(PeerKind::Perftest(text))
}

/// A system data field (cycle buffer, cache line): a big-endian `int`, positive and at
/// most `max`.
pub fn parse_sys(buf: [u8; 4], what: &str, max: u32) -> Result<u32, String> {
    let v = i32::from_be_bytes(buf);
    match u32::try_from(v) {
        Ok(v) if (1..=max).contains(&v) => Ok(v),
        _ => Err(format!("the peer's {what} is {v}: expected 1 to {max}")),
    }
}

/// The MTU field: `enum ibv_mtu` in decimal text, NUL-terminated, in 2 bytes.
pub fn mtu_bytes(mtu: Mtu) -> [u8; 2] {
    // Codes are 1..=5; an unknown one is sent as perftest's smallest, 256 B.
    let code = match mtu {
        Mtu::Unknown(_) => 1,
        m => m.to_raw().clamp(1, 5),
    };
    [b'0' + code as u8, 0]
}

/// Reads the peer's MTU field.
pub fn parse_mtu(buf: [u8; 2]) -> Result<Mtu, String> {
    match buf {
        [d @ b'1'..=b'5', 0] => Ok(Mtu::from_raw(u32::from(d - b'0'))),
        _ => Err(format!("the peer's MTU field {buf:02x?} is not an IB MTU code (1 to 5, then NUL)")),
    }
}

/// One QP's destination message (perftest's `struct pingpong_dest` as text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dest {
    /// The port's LID (0 on RoCE).
    pub lid: u16,
    /// RDMA READs the sender's QP takes as a responder (`max_dest_rd_atomic`).
    pub out_reads: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN (24 bits).
    pub psn: u32,
    /// The remote key of the sender's buffer.
    pub rkey: u32,
    /// The address in the sender's buffer a requester targets.
    pub vaddr: u64,
    /// The GID, in the 108-byte form only.
    pub gid: Option<[u8; 16]>,
    /// SRQ number (XRC, DC; 0 here).
    pub srqn: u32,
}

/// The fields of a destination message, in order, with their widths in hex digits.
const WIDTHS: [usize; 6] = [4, 4, 6, 6, 8, 16];

impl Dest {
    /// The message: `KEY_PRINT_FMT` (or `KEY_PRINT_FMT_GID`) and its NUL, exactly
    /// [`DEST_LEN`] (or [`DEST_LEN_GID`]) bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            self.rkey,
            self.vaddr
        );
        if let Some(gid) = self.gid {
            for b in gid {
                s.push_str(&format!("{b:02x}:"));
            }
        }
        s.push_str(&format!("{:08x}", self.srqn));
        if self.gid.is_some() {
            s.push(':');
        }
        let mut bytes = s.into_bytes();
        bytes.push(0);
        bytes
    }

    /// Parses a message of exactly the length its form has: fixed-width hex fields
    /// separated by `:`, then NUL.
    pub fn parse(buf: &[u8], with_gid: bool) -> Result<Dest, String> {
        let want = if with_gid { DEST_LEN_GID } else { DEST_LEN };
        if buf.len() != want {
            return Err(format!("a destination message is {want} bytes, this one {}", buf.len()));
        }
        let mut cur = Cursor { buf, at: 0 };
        let mut head = [0u64; 6];
        for (v, w) in head.iter_mut().zip(WIDTHS) {
            *v = cur.field(w, b':')?;
        }
        let gid = match with_gid {
            true => {
                let mut gid = [0u8; 16];
                for b in &mut gid {
                    *b = cur.field(2, b':')? as u8;
                }
                Some(gid)
            }
            false => None,
        };
        let srqn = cur.field(8, if with_gid { b':' } else { 0 })? as u32;
        if with_gid && buf[want - 1] != 0 {
            return Err("a destination message must end with NUL".to_owned());
        }
        let [lid, out_reads, qpn, psn, rkey, vaddr] = head;
        Ok(Dest {
            lid: lid as u16,
            out_reads: out_reads as u16,
            qpn: qpn as u32,
            psn: psn as u32,
            rkey: rkey as u32,
            vaddr,
            gid,
            srqn,
        })
    }
}

impl Dest {
    /// The rdma_cm mode's form (perftest's `rdma_write_keys`): `lid`, `out_reads`, `qpn`,
    /// `psn`, `rkey` as big-endian 4-byte integers, 4 bytes of padding, `vaddr` (8), the
    /// GID's 16 bytes, `srqn` and the GID index (4 each, here 0), [`DEST_LEN_CM`] bytes.
    pub fn to_cm_bytes(&self) -> [u8; DEST_LEN_CM] {
        let mut b = [0u8; DEST_LEN_CM];
        let words = [u32::from(self.lid), u32::from(self.out_reads), self.qpn, self.psn, self.rkey];
        for (at, w) in words.iter().enumerate() {
            b[4 * at..4 * at + 4].copy_from_slice(&w.to_be_bytes());
        }
        b[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        b[32..48].copy_from_slice(&self.gid.unwrap_or_default());
        b[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        b
    }

    /// Parses the rdma_cm mode's form: exactly [`DEST_LEN_CM`] bytes, a LID and an
    /// outstanding-reads count that fit 16 bits, a QP number and a PSN that fit 24. The
    /// padding, the SRQ number and the GID index are not read (perftest does not read
    /// them either, and sends its padding uninitialised).
    pub fn parse_cm(buf: &[u8]) -> Result<Dest, String> {
        if buf.len() != DEST_LEN_CM {
            return Err(format!("an rdma_cm destination message is {DEST_LEN_CM} bytes, this one {}", buf.len()));
        }
        let word = |i: usize| u32::from_be_bytes([buf[4 * i], buf[4 * i + 1], buf[4 * i + 2], buf[4 * i + 3]]);
        let small = |i: usize, what: &str, max: u32| match word(i) {
            v if v <= max => Ok(v),
            v => Err(format!("the peer's {what} {v:#x} in its rdma_cm destination is above {max:#x}")),
        };
        let mut vaddr = [0u8; 8];
        vaddr.copy_from_slice(&buf[24..32]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&buf[32..48]);
        Ok(Dest {
            lid: small(0, "LID", 0xffff)? as u16,
            out_reads: small(1, "outstanding reads", 0xffff)? as u16,
            qpn: small(2, "QP number", 0xff_ffff)?,
            psn: small(3, "PSN", 0xff_ffff)?,
            rkey: word(4),
            vaddr: u64::from_be_bytes(vaddr),
            gid: Some(gid),
            srqn: 0,
        })
    }
}

/// Reads fixed-width hex fields.
struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    /// `width` hex digits (at most 16), then the byte `sep`.
    fn field(&mut self, width: usize, sep: u8) -> Result<u64, String> {
        let end = self.at + width;
        let digits = self.buf.get(self.at..end).ok_or("a destination message ends early")?;
        if self.buf.get(end) != Some(&sep) {
            return Err(format!(
                "a destination message has {:?} at byte {end}, expected {:?}",
                self.buf.get(end).map(|&b| b as char),
                sep as char
            ));
        }
        let mut v = 0u64;
        for &d in digits {
            let x = (d as char).to_digit(16).ok_or_else(|| {
                format!("a destination message has {:?} at byte {}, expected a hex digit", d as char, self.at)
            })?;
            v = v << 4 | u64::from(x);
        }
        self.at = end + 1;
        Ok(v)
    }
}

/// A bandwidth report (`struct bw_report_data` as `xchg_bw_reports` sends it to a peer
/// of version 5.33 or later: five big-endian 8-byte fields, one exchange each).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwReport {
    /// Message size.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// Peak bandwidth, in the sender's units (MiB/s, or Gb/s with `--report_gbits`).
    pub bw_peak: f64,
    /// Average bandwidth, same units.
    pub bw_avg: f64,
    /// Message rate, Mpps.
    pub msg_rate: f64,
}

impl BwReport {
    /// The five fields as they go on the wire.
    pub fn to_fields(&self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    /// Reads the five fields: the rates must be finite and not negative.
    pub fn from_fields(f: [[u8; 8]; 5]) -> Result<BwReport, String> {
        let rate = |b: [u8; 8], what: &str| {
            let v = f64::from_bits(u64::from_be_bytes(b));
            if v.is_finite() && v >= 0.0 {
                Ok(v)
            } else {
                Err(format!("the peer's report has {what} {v}: not a rate"))
            }
        };
        Ok(BwReport {
            size: u64::from_be_bytes(f[0]),
            iters: u64::from_be_bytes(f[1]),
            bw_peak: rate(f[2], "peak bandwidth")?,
            bw_avg: rate(f[3], "average bandwidth")?,
            msg_rate: rate(f[4], "message rate")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(gid: bool) -> Dest {
        Dest {
            lid: 0x12,
            out_reads: 16,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0xdead_beef,
            vaddr: 0x7f00_1234_5678,
            gid: gid.then_some([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 98, 0, 1]),
            srqn: 0,
        }
    }

    #[test]
    fn a_destination_message_has_perftests_text_and_size() {
        let b = sample(true).to_bytes();
        assert_eq!(b.len(), DEST_LEN_GID);
        let text = std::str::from_utf8(&b[..b.len() - 1]).unwrap();
        assert_eq!(
            text,
            "0012:0010:000011:abcdef:deadbeef:00007f0012345678:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:62:00:01:00000000:"
        );
        let b = sample(false).to_bytes();
        assert_eq!(b.len(), DEST_LEN);
        assert_eq!(&b[..], &b"0012:0010:000011:abcdef:deadbeef:00007f0012345678:00000000\0"[..]);
    }

    #[test]
    fn an_rdma_cm_destination_is_perftests_struct_in_big_endian() {
        let b = sample(true).to_cm_bytes();
        let mut want = Vec::new();
        for w in [0x12u32, 16, 0x11, 0xabcdef, 0xdead_beef, 0] {
            want.extend_from_slice(&w.to_be_bytes());
        }
        want.extend_from_slice(&0x7f00_1234_5678u64.to_be_bytes());
        want.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 98, 0, 1]);
        want.extend_from_slice(&[0; 8]);
        assert_eq!(&b[..], &want[..]);
        assert_eq!(Dest::parse_cm(&b), Ok(sample(true)));
        // perftest's padding, SRQ number and GID index are garbage or ignored: not read.
        let mut noisy = b;
        noisy[20..24].copy_from_slice(&[0xaa; 4]);
        noisy[48..].copy_from_slice(&[0x55; 8]);
        assert_eq!(Dest::parse_cm(&noisy), Ok(sample(true)));
    }

    #[test]
    fn hostile_rdma_cm_destinations_are_refused_without_panic() {
        for len in (0..200).filter(|&l| l != DEST_LEN_CM) {
            assert!(Dest::parse_cm(&vec![0u8; len]).is_err(), "length {len}");
        }
        // A field beyond its width: LID, outstanding reads (16 bits), QP number, PSN (24).
        for (at, top) in [(0, 0x1_0000u32), (4, 0x1_0000), (8, 0x100_0000), (12, 0x100_0000)] {
            let mut b = sample(true).to_cm_bytes();
            b[at..at + 4].copy_from_slice(&top.to_be_bytes());
            assert!(Dest::parse_cm(&b).is_err(), "field at {at}");
            b[at..at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
            assert!(Dest::parse_cm(&b).is_err(), "field at {at}");
        }
    }

    #[test]
    fn destination_messages_round_trip() {
        for gid in [true, false] {
            let d = sample(gid);
            assert_eq!(Dest::parse(&d.to_bytes(), gid), Ok(d));
        }
        // Upper-case hex is hex too.
        let b = sample(false).to_bytes().to_ascii_uppercase();
        assert_eq!(Dest::parse(&b, false).unwrap().rkey, 0xdead_beef);
    }

    #[test]
    fn hostile_destination_messages_are_refused_without_panic() {
        let good = sample(true).to_bytes();
        // Every length but the right one, for both forms.
        for len in 0..200 {
            let buf = vec![b'0'; len];
            if len != DEST_LEN_GID {
                assert!(Dest::parse(&buf, true).is_err(), "length {len}");
            }
            if len != DEST_LEN {
                assert!(Dest::parse(&buf, false).is_err(), "length {len}");
            }
        }
        // Every byte of a good message replaced by each troublesome value.
        for at in 0..good.len() {
            for bad in [0u8, b':', b'g', b' ', b'-', 0xff, b'x'] {
                let mut m = good.clone();
                if m[at] == bad {
                    continue;
                }
                m[at] = bad;
                let _ = Dest::parse(&m, true);
                let _ = Dest::parse(&m[..DEST_LEN], false);
            }
        }
        // Separators where digits belong, and the reverse, are errors.
        let mut m = good.clone();
        m[4] = b'0';
        assert!(Dest::parse(&m, true).is_err());
        let mut m = good.clone();
        m[0] = b':';
        assert!(Dest::parse(&m, true).is_err());
        let mut m = good;
        m[DEST_LEN_GID - 1] = b'x';
        assert!(Dest::parse(&m, true).is_err());
        // The form without GID parsed as the one with it (and the reverse) fails.
        assert!(Dest::parse(&sample(false).to_bytes(), true).is_err());
        assert!(Dest::parse(&sample(true).to_bytes()[..DEST_LEN], false).is_err());
        // Pseudo-random garbage of the right sizes.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let buf: Vec<u8> = (0..DEST_LEN_GID)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    b"0123456789abcdef:\0zZ"[(x % 20) as usize]
                })
                .collect();
            let _ = Dest::parse(&buf, true);
            let _ = Dest::parse(&buf[..DEST_LEN], false);
        }
    }

    #[test]
    fn versions_are_read_as_perftest_reads_them() {
        let field = |s: &[u8]| {
            let mut b = [0u8; VERSION_LEN];
            b[..s.len()].copy_from_slice(s);
            b
        };
        assert_eq!(parse_version(OUR_VERSION), Ok(PeerKind::Ours));
        assert_eq!(parse_version(&field(b"6.06")), Ok(PeerKind::Perftest("6.06".into())));
        assert_eq!(parse_version(&field(b"5.70")), Ok(PeerKind::Perftest("5.70".into())));
        // What perftest refuses, and what is not a version at all.
        for bad in [&b"5.60"[..], b"", b"abc", b"\xff\xfe", b".", b"6.06\x07", b"1e9"] {
            assert!(parse_version(&field(bad)).is_err(), "{bad:?}");
        }
        // No NUL at all: 16 bytes of text are read, no further.
        assert_eq!(parse_version(b"6.0600000000000x"), Ok(PeerKind::Perftest("6.0600000000000x".into())));
        assert!(parse_version(&[0xffu8; VERSION_LEN]).is_err());
    }

    #[test]
    fn system_data_and_mtu_are_bounded() {
        assert_eq!(parse_sys(4096i32.to_be_bytes(), "cycle buffer", MAX_CYCLE_BUFFER), Ok(4096));
        for bad in [0i32, -1, i32::MIN, i32::MAX] {
            assert!(parse_sys(bad.to_be_bytes(), "cycle buffer", MAX_CYCLE_BUFFER).is_err(), "{bad}");
        }
        assert_eq!(parse_mtu(mtu_bytes(Mtu::Mtu1024)), Ok(Mtu::Mtu1024));
        assert_eq!(mtu_bytes(Mtu::Mtu4096), *b"5\0");
        for bad in [*b"0\0", *b"6\0", *b"3x", *b"\0\0", *b"33", [0xff, 0]] {
            assert!(parse_mtu(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn reports_round_trip_and_refuse_nonsense() {
        let r = BwReport { size: 4096, iters: 200, bw_peak: 12.5, bw_avg: 11.25, msg_rate: 0.0029 };
        assert_eq!(BwReport::from_fields(r.to_fields()), Ok(r));
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            let mut f = r.to_fields();
            f[3] = bad.to_bits().to_be_bytes();
            assert!(BwReport::from_fields(f).is_err(), "{bad}");
        }
    }
}
