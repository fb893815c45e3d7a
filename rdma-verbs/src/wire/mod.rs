//! Every byte format a peer sends us, with strict parsers that return
//! [`WireError`] (the crate's one parse error): the endpoint message
//! and the handshake's status message ([`Endpoint`], [`Status`], and reading and writing
//! them on a byte stream), a QP's connection details ([`RemoteQpInfo`]),
//! a memory region's descriptor ([`RemoteMr`]), and rdma-core's
//! `ibv_rc_pingpong` text exchange ([`pingpong`]). Nothing a peer sends can panic a
//! parser or make it read without bound: every message has a fixed length.
//!
//! # The wire format (version 1)
//!
//! 58 bytes, every integer big-endian:
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0  | 4  | magic `"RDVE"` |
//! | 4  | 1  | version, 1 |
//! | 5  | 1  | flags: bit 0 = a memory region follows; other bits 0 |
//! | 6  | 1  | transport, as `enum ibv_qp_type`: 2 RC, 3 UC, 4 UD |
//! | 7  | 1  | path MTU, as `enum ibv_mtu`: 1 (256 bytes) ..= 5 (4096 bytes) |
//! | 8  | 4  | QP number, below 2^24, not 0 or 1 |
//! | 12 | 4  | first PSN, below 2^24 |
//! | 16 | 4  | Q_Key (UD; 0 for RC and UC) |
//! | 20 | 2  | LID (0 on RoCE; below 0xC000) |
//! | 22 | 16 | GID (LID and GID not both zero) |
//! | 38 | 8  | memory region address (0 without the flag) |
//! | 46 | 8  | memory region length, address + length below 2^64 (0 without the flag) |
//! | 54 | 4  | memory region rkey (0 without the flag; no region on UD) |
//!
//! Each version has one fixed length, and the version sits at a fixed offset, so a
//! reader learns the length from the first five bytes. Parsing is strict: anything but
//! the one canonical encoding of a usable endpoint is a [`WireError`].
//!

use std::fmt;
use std::io::{self, Read, Write};
use std::time::Instant;

use crate::error::{Error, Result, Verb, WireError};
use crate::mr::RemoteMr;
use crate::port::{Gid, Mtu};
use crate::qp::{QpType, RemoteQpInfo, MAX_PSN};

/// The first four bytes of an endpoint message.
pub const MAGIC: [u8; 4] = *b"RDVE";
/// The first four bytes of a handshake status message.
pub const STATUS_MAGIC: [u8; 4] = *b"RDVS";
/// The wire format version this build writes (and the only one it reads).
pub const VERSION: u8 = crate::error::WIRE_VERSION;
/// Magic and version: enough to know the length of the rest.
pub const HEADER_LEN: usize = 5;
/// Length of a handshake status message.
pub const STATUS_LEN: usize = 6;

const FLAG_MR: u8 = 1;
pub(crate) const MAX_QPN: u32 = 0xFF_FFFF;
const FIRST_MULTICAST_LID: u16 = 0xC000;

/// Everything a peer needs to reach a QP: what the handshake sends.
///
/// Fields are public, so a value may be out of range; [`validate`](Self::validate)
/// says whether it is usable, and [`from_bytes`](Self::from_bytes) returns only usable
/// ones. [`to_bytes`](Self::to_bytes) encodes whatever it is given, and out-of-range
/// values come out as bytes `from_bytes` rejects.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// The QP's transport.
    pub transport: QpType,
    /// The QP number (24 bits).
    pub qpn: u32,
    /// The first PSN it sends (24 bits).
    pub psn: u32,
    /// Its Q_Key (UD; 0 for RC and UC).
    pub qkey: u32,
    /// Its port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The GID it sends from (on RoCE, an IPv6 or IPv4-mapped address).
    pub gid: Gid,
    /// The largest path MTU it will use: the smaller of both sides' is used.
    pub mtu: Mtu,
    /// A memory region it lets the peer reach by RDMA, if any (RC and UC only).
    pub mr: Option<RemoteMr>,
}

crate::debug_hex::debug_hex!(Endpoint { transport, qpn: hex, psn: hex, qkey: hex, lid: hex, gid, mtu, mr });

impl Endpoint {
    /// Length of the version-1 wire form.
    pub const WIRE_LEN: usize = 58;

    /// The wire length of `version`, or `None` for a version this build does not know.
    pub fn wire_len(version: u8) -> Option<usize> {
        (version == VERSION).then_some(Self::WIRE_LEN)
    }

    /// The version-1 wire form (see the [module docs](self)).
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = if self.mr.is_some() { FLAG_MR } else { 0 };
        b[6] = transport_code(self.transport);
        // An MTU code that does not fit becomes 0, which the parser rejects.
        b[7] = u8::try_from(self.mtu.to_raw()).unwrap_or(0);
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..20].copy_from_slice(&self.qkey.to_be_bytes());
        b[20..22].copy_from_slice(&self.lid.to_be_bytes());
        b[22..38].copy_from_slice(&self.gid.0);
        if let Some(mr) = self.mr {
            b[38..58].copy_from_slice(&mr.to_bytes());
        }
        b
    }

    /// Parses the wire form: exactly one message of a known version, every field in
    /// range and consistent with the others ([`validate`](Self::validate)).
    pub fn from_bytes(bytes: &[u8]) -> Result<Endpoint, WireError> {
        let len = check_header(bytes)?;
        if bytes.len() < len {
            return Err(WireError::Truncated { got: bytes.len(), need: len });
        }
        if bytes.len() > len {
            return Err(WireError::Oversized { got: bytes.len(), len });
        }
        let flags = bytes[5];
        if flags & !FLAG_MR != 0 {
            return Err(WireError::UnknownFlags(flags & !FLAG_MR));
        }
        let transport = match bytes[6] {
            2 => QpType::Rc,
            3 => QpType::Uc,
            4 => QpType::Ud,
            other => return Err(WireError::UnknownTransport(other)),
        };
        let mr_bytes = &bytes[38..58];
        let mr = if flags & FLAG_MR != 0 {
            let mr =
                RemoteMr { addr: be_u64(&bytes[38..46]), len: be_u64(&bytes[46..54]), rkey: be_u32(&bytes[54..58]) };
            Some(mr)
        } else if mr_bytes.iter().any(|&b| b != 0) {
            return Err(WireError::StrayMrFields);
        } else {
            None
        };
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&bytes[22..38]);
        let ep = Endpoint {
            transport,
            qpn: be_u32(&bytes[8..12]),
            psn: be_u32(&bytes[12..16]),
            qkey: be_u32(&bytes[16..20]),
            lid: u16::from_be_bytes([bytes[20], bytes[21]]),
            gid: Gid(gid),
            mtu: Mtu::from_raw(u32::from(bytes[7])),
            mr,
        };
        ep.validate()?;
        Ok(ep)
    }

    /// Checks that the fields are in range and consistent: 24-bit QPN (not 0 or 1) and
    /// PSN, a known MTU, a LID or a GID to reach it by, a unicast LID, a Q_Key only on
    /// UD, a memory region only on RC or UC and only one whose end fits in 64 bits.
    pub fn validate(&self) -> Result<(), WireError> {
        if self.qpn > MAX_QPN {
            return Err(WireError::QpnTooLarge(self.qpn));
        }
        if self.qpn <= 1 {
            return Err(WireError::ReservedQpn(self.qpn));
        }
        if self.psn > MAX_PSN {
            return Err(WireError::PsnTooLarge(self.psn));
        }
        if let Mtu::Unknown(code) = self.mtu {
            return Err(WireError::BadMtu(code));
        }
        check_address(self.lid, self.gid)?;
        if self.transport != QpType::Ud && self.qkey != 0 {
            return Err(WireError::QkeyNotUd { transport: self.transport, qkey: self.qkey });
        }
        if let Some(mr) = self.mr {
            if self.transport == QpType::Ud {
                return Err(WireError::MrOnUd);
            }
            if mr.addr.checked_add(mr.len).is_none() {
                return Err(WireError::MrOverflow { addr: mr.addr, len: mr.len });
            }
        }
        Ok(())
    }

    /// The QP number, PSN, LID and GID, as [`QueuePair::connect`](crate::QueuePair::connect) takes them.
    pub fn qp_info(&self) -> RemoteQpInfo {
        RemoteQpInfo { qpn: self.qpn, psn: self.psn, lid: self.lid, gid: self.gid }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} QPN {:#08x} PSN {:#08x} LID {:#06x} GID {} MTU {}",
            self.transport,
            self.qpn,
            self.psn,
            self.lid,
            self.gid,
            self.mtu.bytes()
        )?;
        if self.transport == QpType::Ud {
            write!(f, " Q_Key {:#x}", self.qkey)?;
        }
        if let Some(mr) = self.mr {
            write!(f, " MR {:#x}+{} rkey {:#x}", mr.addr, mr.len, mr.rkey)?;
        }
        Ok(())
    }
}

fn transport_code(t: QpType) -> u8 {
    // enum ibv_qp_type: RC 2, UC 3, UD 4, part of the verbs ABI.
    t.to_ffi().0 as u8
}

fn be_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(b);
    u32::from_be_bytes(a)
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_be_bytes(a)
}

pub(crate) fn check_address(lid: u16, gid: Gid) -> Result<(), WireError> {
    if lid == 0 && gid.is_zero() {
        return Err(WireError::NoAddress);
    }
    if lid >= FIRST_MULTICAST_LID {
        return Err(WireError::MulticastLid(lid));
    }
    Ok(())
}

/// Checks the magic and version at the start of `bytes` and returns the message's
/// full length. Looks at no more than [`HEADER_LEN`] bytes.
fn check_header(bytes: &[u8]) -> Result<usize, WireError> {
    check_magic(bytes, &MAGIC, "RDVE")?;
    if bytes.len() < HEADER_LEN {
        return Err(WireError::Truncated { got: bytes.len(), need: HEADER_LEN });
    }
    Endpoint::wire_len(bytes[4]).ok_or(WireError::UnsupportedVersion { found: bytes[4] })
}

/// A wrong byte among the first four is `BadMagic` even when fewer than four arrived.
fn check_magic(bytes: &[u8], magic: &[u8; 4], name: &'static str) -> Result<(), WireError> {
    let n = bytes.len().min(4);
    if bytes[..n] != magic[..n] {
        let mut found = [0u8; 4];
        found[..n].copy_from_slice(&bytes[..n]);
        return Err(WireError::BadMagic { found, expected: name });
    }
    if n < 4 {
        return Err(WireError::Truncated { got: n, need: HEADER_LEN });
    }
    Ok(())
}

/// A handshake status: how the side that sends it fared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Its QP is ready (RTS, or an address handle for UD).
    Ready,
    /// It could not use the other side's endpoint.
    Rejected,
    /// It could not bring its own QP up.
    Failed,
}

impl Status {
    fn code(self) -> u8 {
        match self {
            Status::Ready => 0,
            Status::Rejected => 1,
            Status::Failed => 2,
        }
    }

    /// The wire form: `"RDVS"`, the version, the status code.
    pub fn to_bytes(self) -> [u8; STATUS_LEN] {
        let mut b = [0u8; STATUS_LEN];
        b[..4].copy_from_slice(&STATUS_MAGIC);
        b[4] = VERSION;
        b[5] = self.code();
        b
    }

    /// Parses the wire form, strictly.
    pub fn from_bytes(bytes: &[u8]) -> Result<Status, WireError> {
        check_magic(bytes, &STATUS_MAGIC, "RDVS")?;
        if bytes.len() < HEADER_LEN {
            return Err(WireError::Truncated { got: bytes.len(), need: STATUS_LEN });
        }
        if bytes[4] != VERSION {
            return Err(WireError::UnsupportedVersion { found: bytes[4] });
        }
        if bytes.len() != STATUS_LEN {
            return Err(if bytes.len() < STATUS_LEN {
                WireError::Truncated { got: bytes.len(), need: STATUS_LEN }
            } else {
                WireError::Oversized { got: bytes.len(), len: STATUS_LEN }
            });
        }
        match bytes[5] {
            0 => Ok(Status::Ready),
            1 => Ok(Status::Rejected),
            2 => Ok(Status::Failed),
            other => Err(WireError::UnknownStatus(other)),
        }
    }
}

// ---- stream I/O --------------------------------------------------------------------

/// An I/O error of the exchange, with what was being done; a read that hit the stream's
/// timeout becomes [`Error::Timeout`] with the time actually waited.
fn io_error(e: io::Error, what: &'static str, started: Instant) -> Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            Error::Timeout { verb: Verb::Handshake, timeout: started.elapsed() }
        }
        io::ErrorKind::UnexpectedEof => {
            Error::Io { what, source: io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the connection") }
        }
        _ => Error::Io { what, source: e },
    }
}

/// Fills `buf` exactly: a bounded read of a length fixed in advance.
fn read_exactly<S: Read + ?Sized>(stream: &mut S, buf: &mut [u8], what: &'static str) -> Result<()> {
    let started = Instant::now();
    stream.read_exact(buf).map_err(|e| io_error(e, what, started))
}

fn write_all<S: Write + ?Sized>(stream: &mut S, bytes: &[u8], what: &'static str) -> Result<()> {
    let started = Instant::now();
    stream.write_all(bytes).and_then(|()| stream.flush()).map_err(|e| io_error(e, what, started))
}

pub(crate) fn wire_error(what: &'static str, source: WireError) -> Error {
    Error::Wire { what, source }
}

/// Writes `endpoint` to the stream.
pub fn write_endpoint<S: Write + ?Sized>(stream: &mut S, endpoint: &Endpoint) -> Result<()> {
    write_all(stream, &endpoint.to_bytes(), "sending the endpoint")
}

/// Reads one endpoint: the header first, then exactly the length its version has, so
/// a peer of another version is refused before anything more is read.
pub fn read_endpoint<S: Read + ?Sized>(stream: &mut S) -> Result<Endpoint> {
    const WHAT: &str = "reading the peer's endpoint";
    let mut buf = [0u8; Endpoint::WIRE_LEN];
    read_exactly(stream, &mut buf[..HEADER_LEN], WHAT)?;
    let len = check_header(&buf[..HEADER_LEN]).map_err(|e| wire_error(WHAT, e))?;
    read_exactly(stream, &mut buf[HEADER_LEN..len], WHAT)?;
    Endpoint::from_bytes(&buf[..len]).map_err(|e| wire_error(WHAT, e))
}

/// Sends `local` and reads the peer's endpoint: each side writes before it reads, so
/// two callers on either end of a stream do not wait for each other. A read timeout set
/// on the stream bounds each read ([`Error::Timeout`]).
pub fn exchange<S: Read + Write + ?Sized>(stream: &mut S, local: &Endpoint) -> Result<Endpoint> {
    write_endpoint(stream, local)?;
    read_endpoint(stream)
}

/// Tells the peer how this side fared, then reads how the peer fared: `Ok` only when
/// both are ready.
pub fn sync<S: Read + Write + ?Sized>(stream: &mut S, mine: Status) -> Result<()> {
    const WHAT: &str = "reading the peer's handshake status";
    write_all(stream, &mine.to_bytes(), "sending the handshake status")?;
    let mut buf = [0u8; STATUS_LEN];
    read_exactly(stream, &mut buf, WHAT)?;
    match Status::from_bytes(&buf).map_err(|e| wire_error(WHAT, e))? {
        Status::Ready => Ok(()),
        Status::Rejected => Err(wire_error(WHAT, WireError::PeerRejected)),
        Status::Failed => Err(wire_error(WHAT, WireError::PeerFailed)),
    }
}

/// Tells the peer that this side gave up, and returns `err`. The notice is best effort:
/// the stream may be what failed.
pub(crate) fn give_up<S: Write + ?Sized, T>(stream: &mut S, status: Status, err: Error) -> Result<T> {
    let _ = stream.write_all(&status.to_bytes()).and_then(|()| stream.flush());
    Err(err)
}

// ---- a QP's connection details and a region's descriptor ----------------------------

impl RemoteQpInfo {
    /// Size of [`to_bytes`](Self::to_bytes).
    pub const WIRE_LEN: usize = 26;

    /// Big-endian wire form: qpn (4), psn (4), lid (2), gid (16).
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[0..4].copy_from_slice(&self.qpn.to_be_bytes());
        b[4..8].copy_from_slice(&self.psn.to_be_bytes());
        b[8..10].copy_from_slice(&self.lid.to_be_bytes());
        b[10..26].copy_from_slice(&self.gid.0);
        b
    }

    /// From the wire form of [`to_bytes`](Self::to_bytes), checked as the endpoint format
    /// checks its fields (it comes from a peer): a 24-bit QP number that is not a
    /// management QP, a 24-bit PSN, and a unicast LID or a GID to reach the peer by.
    pub fn from_bytes(b: &[u8; Self::WIRE_LEN]) -> Result<RemoteQpInfo, WireError> {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[10..26]);
        let info = RemoteQpInfo {
            qpn: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            psn: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            lid: u16::from_be_bytes([b[8], b[9]]),
            gid: Gid(gid),
        };
        if info.qpn > MAX_QPN {
            return Err(WireError::QpnTooLarge(info.qpn));
        }
        if info.qpn <= 1 {
            return Err(WireError::ReservedQpn(info.qpn));
        }
        if info.psn > MAX_PSN {
            return Err(WireError::PsnTooLarge(info.psn));
        }
        check_address(info.lid, info.gid)?;
        Ok(info)
    }
}

impl RemoteMr {
    /// Size of the wire form: `addr` (8 bytes), `len` (8), `rkey` (4), all big-endian.
    pub const WIRE_LEN: usize = 20;

    /// The wire form: `addr`, `len`, `rkey`, big-endian, 20 bytes.
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut out = [0u8; Self::WIRE_LEN];
        out[0..8].copy_from_slice(&self.addr.to_be_bytes());
        out[8..16].copy_from_slice(&self.len.to_be_bytes());
        out[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        out
    }

    /// Parses the wire form. Exactly [`WIRE_LEN`](Self::WIRE_LEN) bytes, and a range
    /// `addr..addr + len` that does not overflow; anything else is an error.
    pub fn from_bytes(bytes: &[u8]) -> Result<RemoteMr, WireError> {
        let bytes: &[u8; Self::WIRE_LEN] = match bytes.len() {
            n if n < Self::WIRE_LEN => return Err(WireError::Truncated { got: n, need: Self::WIRE_LEN }),
            n if n > Self::WIRE_LEN => return Err(WireError::Oversized { got: n, len: Self::WIRE_LEN }),
            _ => bytes.try_into().map_err(|_| WireError::Truncated { got: bytes.len(), need: Self::WIRE_LEN })?,
        };
        let mut addr = [0u8; 8];
        let mut len = [0u8; 8];
        let mut rkey = [0u8; 4];
        addr.copy_from_slice(&bytes[0..8]);
        len.copy_from_slice(&bytes[8..16]);
        rkey.copy_from_slice(&bytes[16..20]);
        let mr =
            RemoteMr { addr: u64::from_be_bytes(addr), len: u64::from_be_bytes(len), rkey: u32::from_be_bytes(rkey) };
        if mr.addr.checked_add(mr.len).is_none() {
            return Err(WireError::MrOverflow { addr: mr.addr, len: mr.len });
        }
        Ok(mr)
    }
}

// ---- rdma-core's pingpong exchange -------------------------------------------------

pub mod pingpong {
    //! The TCP exchange of rdma-core's `ibv_rc_pingpong` (and its UC, UD and SRQ siblings),
    //! for programs that talk to those tools.
    //!
    //! Each side sends one text message of [`MSG_LEN`] bytes, `"LLLL:QQQQQQ:PPPPPP:GGG...G"`
    //! and a NUL: the LID, QP number and PSN in lower-case hex (4, 6 and 6 digits), and the
    //! 16 bytes of the GID as 32 hex digits in memory order. The client sends first; the
    //! server reads it, brings its QP to RTS, and answers with its own; the client then
    //! sends [`DONE`] and both close the connection. A side with no GID (InfiniBand, no
    //! `-g`) sends an all-zero GID.

    use super::{check_address, WireError, MAX_QPN};
    use crate::port::Gid;
    use crate::qp::{RemoteQpInfo, MAX_PSN};

    /// The TCP port the tools use by default.
    pub const DEFAULT_PORT: u16 = 18515;
    /// Length of one message, the terminating NUL included
    /// (`sizeof "0000:000000:000000:00000000000000000000000000000000"`).
    pub const MSG_LEN: usize = 52;
    /// What the client sends last, NUL included; the server reads exactly these 5 bytes.
    pub const DONE: [u8; 5] = *b"done\0";

    const HEX: &[u8; 16] = b"0123456789abcdef";

    fn put_hex(out: &mut [u8], value: u64) {
        let n = out.len();
        for (i, b) in out.iter_mut().enumerate() {
            *b = HEX[((value >> (4 * (n - 1 - i))) & 0xf) as usize];
        }
    }

    /// The message for `info`. The QP number and PSN must fit in 24 bits.
    pub fn encode(info: &RemoteQpInfo) -> Result<[u8; MSG_LEN], WireError> {
        if info.qpn > MAX_QPN {
            return Err(WireError::QpnTooLarge(info.qpn));
        }
        if info.psn > MAX_PSN {
            return Err(WireError::PsnTooLarge(info.psn));
        }
        let mut m = [0u8; MSG_LEN];
        put_hex(&mut m[0..4], info.lid.into());
        m[4] = b':';
        put_hex(&mut m[5..11], info.qpn.into());
        m[11] = b':';
        put_hex(&mut m[12..18], info.psn.into());
        m[18] = b':';
        for (i, byte) in info.gid.0.iter().enumerate() {
            put_hex(&mut m[19 + 2 * i..21 + 2 * i], (*byte).into());
        }
        // m[51] stays the NUL.
        Ok(m)
    }

    fn hex_field(msg: &[u8], start: usize, len: usize) -> Result<u64, WireError> {
        let mut v = 0u64;
        for (i, &c) in msg[start..start + len].iter().enumerate() {
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => return Err(WireError::Text { offset: start + i, what: "expected a hex digit" }),
            };
            v = (v << 4) | u64::from(d);
        }
        Ok(v)
    }

    /// Parses a message strictly: exactly [`MSG_LEN`] bytes, fixed-width hex fields
    /// (either case), colons where they belong, the NUL last; a QP number other than 0
    /// and 1; a LID or a GID to reach the peer by, the LID a unicast one.
    pub fn decode(msg: &[u8]) -> Result<RemoteQpInfo, WireError> {
        if msg.len() < MSG_LEN {
            return Err(WireError::Truncated { got: msg.len(), need: MSG_LEN });
        }
        if msg.len() > MSG_LEN {
            return Err(WireError::Oversized { got: msg.len(), len: MSG_LEN });
        }
        for at in [4, 11, 18] {
            if msg[at] != b':' {
                return Err(WireError::Text { offset: at, what: "expected ':'" });
            }
        }
        if msg[51] != 0 {
            return Err(WireError::Text { offset: 51, what: "expected the terminating NUL" });
        }
        // Fixed widths: 4 hex digits fit in 16 bits, 6 in 24.
        let lid = hex_field(msg, 0, 4)? as u16;
        let qpn = hex_field(msg, 5, 6)? as u32;
        let psn = hex_field(msg, 12, 6)? as u32;
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = hex_field(msg, 19 + 2 * i, 2)? as u8;
        }
        if qpn <= 1 {
            return Err(WireError::ReservedQpn(qpn));
        }
        let gid = Gid(gid);
        check_address(lid, gid)?;
        Ok(RemoteQpInfo { qpn, psn, lid, gid })
    }

    /// Checks the client's final message.
    pub fn check_done(msg: &[u8]) -> Result<(), WireError> {
        if msg.len() != DONE.len() {
            return Err(if msg.len() < DONE.len() {
                WireError::Truncated { got: msg.len(), need: DONE.len() }
            } else {
                WireError::Oversized { got: msg.len(), len: DONE.len() }
            });
        }
        match msg.iter().zip(DONE.iter()).position(|(a, b)| a != b) {
            None => Ok(()),
            Some(offset) => Err(WireError::Text { offset, what: "expected \"done\" and a NUL" }),
        }
    }
}

#[cfg(test)]
mod tests;
