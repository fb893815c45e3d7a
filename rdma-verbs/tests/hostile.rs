//! Hostile input, on the host (no device): every parser that reads what a peer sends gets
//! truncated input at every length, oversized input, seeded pseudo-random garbage by the
//! thousand, wrong magic and versions, and out-of-range fields. Each must return an error
//! (never panic, never accept), and valid input must round-trip. Then the endpoint
//! exchange runs over a real TCP connection on 127.0.0.1 against a peer that sends
//! garbage, hangs up early, stays silent or sends too much: a clear error, in bounded time.
//!
//! The parsers: the endpoint and handshake-status messages ([`Endpoint::from_bytes`],
//! [`Status::from_bytes`], and [`endpoint::exchange`]/[`endpoint::sync`] on a stream),
//! rdma-core's pingpong text message ([`pingpong::decode`], [`pingpong::check_done`]), the
//! memory-region descriptor ([`RemoteMr::from_bytes`]). The doctor's reports and known-bad
//! lists have their own such tests (rdma-doctor/tests/hostile.rs). rdma_cm private data
//! has no parser in the library or the tools (it is handed over as bytes), so there is
//! nothing of it to feed.

use std::io::{Read, Write};
use std::net::{Ipv6Addr, Shutdown, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use rdma_verbs::wire::{self, pingpong, Endpoint, Status, HEADER_LEN, MAGIC, STATUS_LEN, VERSION};
use rdma_verbs::WireError;
use rdma_verbs::{Error, Gid, Mtu, QpType, RemoteMr, RemoteQpInfo, Verb};
use rdma_verbs::{DEFAULT_QKEY, MAX_PSN};

/// A seeded generator (fastrand's), so every run feeds the same garbage and a failure
/// replays; with the few shapes these tests draw.
struct Rng(fastrand::Rng);

impl Rng {
    fn seeded(seed: u64) -> Rng {
        Rng(fastrand::Rng::with_seed(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.u64(..)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0.u64(0..n)
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.0.fill(&mut v);
        v
    }

    /// Fewer than `max` random bytes, how many also random.
    fn bytes_below(&mut self, max: u64) -> Vec<u8> {
        let len = self.below(max) as usize;
        self.bytes(len)
    }
}

fn gid(s: &str) -> Gid {
    Gid(s.parse::<Ipv6Addr>().expect("a test GID").octets())
}

/// One endpoint of each shape: RC with a region, RC and UC without, UD, and an
/// InfiniBand one addressed by LID only.
fn endpoints() -> Vec<Endpoint> {
    let rc = Endpoint {
        transport: QpType::Rc,
        qpn: 0x12_3456,
        psn: 0xab_cdef,
        qkey: 0,
        lid: 0,
        gid: gid("::ffff:10.99.0.1"),
        mtu: Mtu::Mtu1024,
        mr: Some(RemoteMr { addr: 0x7f00_0000_1000, len: 8192, rkey: 0xdead_beef }),
    };
    vec![
        rc,
        Endpoint { mr: None, ..rc },
        Endpoint { transport: QpType::Uc, mtu: Mtu::Mtu4096, ..rc },
        Endpoint { transport: QpType::Ud, qkey: DEFAULT_QKEY, mr: None, mtu: Mtu::Mtu256, ..rc },
        Endpoint { lid: 0x2a, gid: Gid::default(), psn: 0, qpn: 2, ..rc },
    ]
}

/// A random endpoint that validate() accepts: every field anywhere in its range.
fn random_valid_endpoint(r: &mut Rng) -> Endpoint {
    let transport = [QpType::Rc, QpType::Uc, QpType::Ud][r.below(3) as usize];
    let mut g = [0u8; 16];
    g.copy_from_slice(&r.bytes(16));
    let lid = r.below(0xC000) as u16;
    let gid = if r.below(4) == 0 { Gid::default() } else { Gid(g) };
    let lid = if gid.is_zero() && lid == 0 { 1 } else { lid };
    let mr = (transport != QpType::Ud && r.below(2) == 0).then(|| {
        let addr = r.next();
        RemoteMr { addr, len: r.next().min(u64::MAX - addr), rkey: r.next() as u32 }
    });
    Endpoint {
        transport,
        qpn: 2 + r.below(0xFF_FFFE) as u32,
        psn: r.below(u64::from(MAX_PSN) + 1) as u32,
        qkey: if transport == QpType::Ud { r.next() as u32 } else { 0 },
        lid,
        gid,
        mtu: Mtu::from_raw(1 + r.below(5) as u32),
        mr,
    }
}

// ---- the endpoint message ------------------------------------------------------------

#[test]
fn valid_endpoints_round_trip_including_thousands_of_random_ones() {
    let mut r = Rng::seeded(1);
    let random = (0..20_000).map(|_| random_valid_endpoint(&mut r));
    for ep in endpoints().into_iter().chain(random) {
        assert_eq!(ep.validate(), Ok(()), "{ep:?}");
        let bytes = ep.to_bytes();
        assert_eq!(Endpoint::from_bytes(&bytes), Ok(ep));
    }
}

#[test]
fn an_endpoint_truncated_at_every_length_is_truncated() {
    for ep in endpoints() {
        let bytes = ep.to_bytes();
        for len in 0..bytes.len() {
            let need = if len < HEADER_LEN { HEADER_LEN } else { Endpoint::WIRE_LEN };
            assert_eq!(Endpoint::from_bytes(&bytes[..len]), Err(WireError::Truncated { got: len, need }), "{len}");
        }
    }
}

#[test]
fn an_endpoint_with_any_trailing_bytes_is_oversized() {
    let mut r = Rng::seeded(2);
    for ep in endpoints() {
        for extra in [1usize, 2, 7, 58, 59, 4096, 1 << 20] {
            let mut long = ep.to_bytes().to_vec();
            long.extend(r.bytes(extra));
            let got = long.len();
            assert_eq!(Endpoint::from_bytes(&long), Err(WireError::Oversized { got, len: Endpoint::WIRE_LEN }));
        }
    }
}

#[test]
fn random_garbage_is_refused_with_and_without_a_valid_header() {
    let mut r = Rng::seeded(3);
    for i in 0..200_000 {
        let len = r.below(130) as usize;
        let mut b = r.bytes(len);
        // Half of them get past the header, so the field checks are what refuses them.
        if i % 2 == 0 && len >= HEADER_LEN {
            b[..4].copy_from_slice(&MAGIC);
            b[4] = VERSION;
        }
        assert!(Endpoint::from_bytes(&b).is_err(), "accepted garbage {b:02x?}");
        assert!(Status::from_bytes(&b).is_err(), "accepted garbage {b:02x?}");
    }
    // Full-length bodies behind a valid header: each field check gets its turn.
    for _ in 0..200_000 {
        let mut b = r.bytes(Endpoint::WIRE_LEN);
        b[..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        assert!(Endpoint::from_bytes(&b).is_err(), "accepted garbage {b:02x?}");
    }
}

#[test]
fn every_wrong_magic_byte_and_version_is_refused_before_the_length() {
    let good = endpoints()[0].to_bytes();
    for at in 0..4 {
        for v in 0..=255u8 {
            if v == MAGIC[at] {
                continue;
            }
            let mut b = good;
            b[at] = v;
            for len in at + 1..=b.len() {
                let e = Endpoint::from_bytes(&b[..len]).unwrap_err();
                assert!(matches!(e, WireError::BadMagic { expected: "RDVE", .. }), "{at} {v} {len}: {e}");
            }
        }
    }
    for v in (0..=255u8).filter(|&v| v != VERSION) {
        let mut b = good;
        b[4] = v;
        // The version decides the length: refused whatever follows, even nothing.
        for len in [HEADER_LEN, 20, Endpoint::WIRE_LEN] {
            assert_eq!(Endpoint::from_bytes(&b[..len]), Err(WireError::UnsupportedVersion { found: v }));
        }
        assert_eq!(Endpoint::wire_len(v), None);
    }
}

#[test]
fn every_single_byte_change_is_refused_or_is_another_canonical_endpoint() {
    for ep in endpoints() {
        let good = ep.to_bytes();
        for at in 0..good.len() {
            for v in 0..=255u8 {
                let mut b = good;
                b[at] = v;
                if let Ok(got) = Endpoint::from_bytes(&b) {
                    assert_eq!(got.to_bytes(), b, "byte {at} = {v:#x}: not the canonical encoding");
                    assert_eq!(got.validate(), Ok(()));
                }
            }
        }
    }
}

#[test]
fn out_of_range_fields_are_refused_with_the_field_named() {
    let rc = endpoints()[0];
    let ud = endpoints()[3];
    let reject = |ep: Endpoint| Endpoint::from_bytes(&ep.to_bytes()).unwrap_err();
    for qpn in [0x100_0000, u32::MAX] {
        assert_eq!(reject(Endpoint { qpn, ..rc }), WireError::QpnTooLarge(qpn));
    }
    for qpn in [0, 1] {
        assert_eq!(reject(Endpoint { qpn, ..rc }), WireError::ReservedQpn(qpn));
    }
    for psn in [MAX_PSN + 1, u32::MAX] {
        assert_eq!(reject(Endpoint { psn, ..rc }), WireError::PsnTooLarge(psn));
    }
    for code in [0u32, 6, 255] {
        assert_eq!(reject(Endpoint { mtu: Mtu::from_raw(code), ..rc }), WireError::BadMtu(code));
    }
    // An MTU code wider than the byte it travels in becomes 0 on the wire.
    assert_eq!(reject(Endpoint { mtu: Mtu::from_raw(0x101), ..rc }), WireError::BadMtu(0));
    for lid in [0xC000, 0xFFFF] {
        assert_eq!(reject(Endpoint { lid, ..rc }), WireError::MulticastLid(lid));
    }
    assert_eq!(reject(Endpoint { lid: 0, gid: Gid::default(), ..rc }), WireError::NoAddress);
    assert_eq!(reject(Endpoint { qkey: 1, ..rc }), WireError::QkeyNotUd { transport: QpType::Rc, qkey: 1 });
    let mr = Some(RemoteMr { addr: 0, len: 1, rkey: 1 });
    assert_eq!(reject(Endpoint { mr, ..ud }), WireError::MrOnUd);
    let mr = Some(RemoteMr { addr: u64::MAX, len: 1, rkey: 1 });
    assert_eq!(reject(Endpoint { mr, ..rc }), WireError::MrOverflow { addr: u64::MAX, len: 1 });
    for (at, v, want) in [
        (5, 0x02, WireError::UnknownFlags(0x02)),
        (5, 0xFF, WireError::UnknownFlags(0xFE)),
        (6, 0, WireError::UnknownTransport(0)),
        (6, 1, WireError::UnknownTransport(1)),
        (6, 5, WireError::UnknownTransport(5)),
        (6, 0xFF, WireError::UnknownTransport(0xFF)),
    ] {
        let mut b = rc.to_bytes();
        b[at] = v;
        assert_eq!(Endpoint::from_bytes(&b), Err(want));
    }
    // Region fields without the flag: any non-zero byte among them.
    let plain = Endpoint { mr: None, ..rc }.to_bytes();
    for at in 38..58 {
        let mut b = plain;
        b[at] = 1;
        assert_eq!(Endpoint::from_bytes(&b), Err(WireError::StrayMrFields), "byte {at}");
    }
}

// ---- the handshake status message ----------------------------------------------------

#[test]
fn status_messages_round_trip_and_everything_else_is_refused() {
    for s in [Status::Ready, Status::Rejected, Status::Failed] {
        let b = s.to_bytes();
        assert_eq!(Status::from_bytes(&b), Ok(s));
        for len in 0..b.len() {
            assert!(matches!(Status::from_bytes(&b[..len]), Err(WireError::Truncated { got, .. }) if got == len));
        }
        let mut long = b.to_vec();
        long.push(0);
        assert_eq!(Status::from_bytes(&long), Err(WireError::Oversized { got: 7, len: STATUS_LEN }));
    }
    let mut b = Status::Ready.to_bytes();
    for code in 3..=255u8 {
        b[5] = code;
        assert_eq!(Status::from_bytes(&b), Err(WireError::UnknownStatus(code)));
    }
    b[5] = 0;
    for v in (0..=255u8).filter(|&v| v != VERSION) {
        b[4] = v;
        assert_eq!(Status::from_bytes(&b), Err(WireError::UnsupportedVersion { found: v }));
    }
    // An endpoint is not a status, nor the reverse.
    assert!(matches!(Status::from_bytes(&endpoints()[0].to_bytes()[..6]), Err(WireError::BadMagic { .. })));
    assert!(matches!(Endpoint::from_bytes(&Status::Ready.to_bytes()), Err(WireError::BadMagic { .. })));
}

// ---- rdma-core's pingpong text message ------------------------------------------------

const PINGPONG_MSG: &[u8; pingpong::MSG_LEN] = b"0011:000012:abcdef:00000000000000000000ffff0a630001\0";

fn is_hex_position(at: usize) -> bool {
    at < pingpong::MSG_LEN - 1 && ![4, 11, 18].contains(&at)
}

#[test]
fn pingpong_messages_round_trip_including_random_addresses() {
    let mut r = Rng::seeded(4);
    assert!(pingpong::decode(PINGPONG_MSG).is_ok());
    let mut accepted = 0;
    for _ in 0..20_000 {
        let mut g = [0u8; 16];
        g.copy_from_slice(&r.bytes(16));
        let info = RemoteQpInfo {
            qpn: 2 + r.below(0xFF_FFFE) as u32,
            psn: r.below(u64::from(MAX_PSN) + 1) as u32,
            lid: r.below(0xC000) as u16,
            gid: Gid(g),
        };
        let msg = pingpong::encode(&info).expect("in range");
        assert_eq!(pingpong::decode(&msg), Ok(info));
        assert_eq!(pingpong::decode(&msg.to_ascii_uppercase()), Ok(info), "sscanf's %x takes either case");
        accepted += 1;
    }
    assert_eq!(accepted, 20_000);
    pingpong::check_done(&pingpong::DONE).expect("the real thing");
}

#[test]
fn pingpong_messages_truncated_oversized_or_garbage_are_refused() {
    for len in 0..pingpong::MSG_LEN {
        assert_eq!(
            pingpong::decode(&PINGPONG_MSG[..len]),
            Err(WireError::Truncated { got: len, need: pingpong::MSG_LEN })
        );
    }
    for extra in [1usize, 52, 4096] {
        let mut long = PINGPONG_MSG.to_vec();
        long.resize(pingpong::MSG_LEN + extra, b'0');
        assert_eq!(
            pingpong::decode(&long),
            Err(WireError::Oversized { got: pingpong::MSG_LEN + extra, len: pingpong::MSG_LEN })
        );
    }
    let mut r = Rng::seeded(5);
    for i in 0..200_000 {
        // Raw garbage, and garbage of the exact length with the colons and NUL in place.
        let mut b = if i % 2 == 0 { r.bytes_below(70) } else { r.bytes(pingpong::MSG_LEN) };
        if b.len() == pingpong::MSG_LEN && i % 4 == 1 {
            for at in [4, 11, 18] {
                b[at] = b':';
            }
            b[51] = 0;
        }
        assert!(pingpong::decode(&b).is_err(), "accepted garbage {b:02x?}");
        assert!(pingpong::check_done(&b).is_err());
    }
    for len in 0..8 {
        let mut b = pingpong::DONE.to_vec();
        b.resize(len, 0);
        assert_eq!(pingpong::check_done(&b).is_ok(), len == pingpong::DONE.len());
    }
}

#[test]
fn every_single_byte_change_of_a_pingpong_message_is_refused_or_a_hex_digit() {
    for at in 0..pingpong::MSG_LEN {
        for v in 0..=255u8 {
            let mut m = *PINGPONG_MSG;
            m[at] = v;
            match pingpong::decode(&m) {
                Ok(_) if v == PINGPONG_MSG[at] => {}
                Ok(info) => {
                    assert!(is_hex_position(at) && v.is_ascii_hexdigit(), "byte {at} = {v:#x} accepted");
                    let again = pingpong::encode(&info).expect("a decoded address fits");
                    assert!(again.eq_ignore_ascii_case(&m), "byte {at} = {v:#x}: re-encodes differently");
                }
                Err(WireError::Text { offset, .. }) => assert_eq!(offset, at, "byte {at} = {v:#x}"),
                // A digit that makes the QP number 0 or 1, or the LID a multicast one.
                Err(WireError::ReservedQpn(_) | WireError::MulticastLid(_)) => assert!(v.is_ascii_hexdigit()),
                Err(e) => panic!("byte {at} = {v:#x}: {e}"),
            }
        }
    }
}

#[test]
fn pingpong_out_of_range_fields_are_refused() {
    let decode = |m: &[u8]| pingpong::decode(m).unwrap_err();
    assert_eq!(decode(b"0011:000000:000000:00000000000000000000ffff0a630001\0"), WireError::ReservedQpn(0));
    assert_eq!(decode(b"0011:000001:000000:00000000000000000000ffff0a630001\0"), WireError::ReservedQpn(1));
    assert_eq!(decode(b"c000:000012:000000:00000000000000000000ffff0a630001\0"), WireError::MulticastLid(0xc000));
    assert_eq!(decode(b"FFFF:000012:000000:00000000000000000000ffff0a630001\0"), WireError::MulticastLid(0xffff));
    assert_eq!(decode(b"0000:000012:000000:00000000000000000000000000000000\0"), WireError::NoAddress);
    // Signs, spaces and prefixes that sscanf would skip or take are not hex digits here.
    for bad in [&b"+011"[..], b" 011", b"0x11", b"-001"] {
        let mut m = *PINGPONG_MSG;
        m[..4].copy_from_slice(bad);
        assert!(matches!(pingpong::decode(&m), Err(WireError::Text { .. })), "{bad:?}");
    }
    let too_big = RemoteQpInfo { qpn: 1 << 24, psn: 0, lid: 1, gid: Gid::default() };
    assert_eq!(pingpong::encode(&too_big), Err(WireError::QpnTooLarge(1 << 24)));
    assert_eq!(
        pingpong::encode(&RemoteQpInfo { qpn: 2, psn: 1 << 24, ..too_big }),
        Err(WireError::PsnTooLarge(1 << 24))
    );
}

// ---- the memory-region descriptor ------------------------------------------------------

#[test]
fn region_descriptors_of_the_wrong_length_or_overflowing_are_refused() {
    let mr = RemoteMr { addr: 0x1000, len: 4096, rkey: 7 };
    let b = mr.to_bytes();
    assert_eq!(RemoteMr::from_bytes(&b).expect("valid"), mr);
    for len in (0..b.len()).chain([21, 40, 4096]) {
        let mut v = b.to_vec();
        v.resize(len, 0);
        let e = RemoteMr::from_bytes(&v).unwrap_err();
        let want = if len < 20 {
            WireError::Truncated { got: len, need: 20 }
        } else {
            WireError::Oversized { got: len, len: 20 }
        };
        assert_eq!(e, want, "{e}");
    }
    let over = RemoteMr { addr: u64::MAX - 1, len: 2, rkey: 0 }.to_bytes();
    assert!(RemoteMr::from_bytes(&over).unwrap_err().to_string().contains("overflows"));
    let mut r = Rng::seeded(6);
    for _ in 0..100_000 {
        let v = r.bytes(RemoteMr::WIRE_LEN);
        match RemoteMr::from_bytes(&v) {
            Ok(m) => {
                assert!(m.addr.checked_add(m.len).is_some());
                assert_eq!(m.to_bytes().to_vec(), v);
            }
            Err(e) => assert!(e.to_string().contains("overflows"), "{e}"),
        }
    }
}

// ---- the exchange over TCP against a hostile peer ----------------------------------------

/// How long one read may wait for a peer that does answer: generous, because a loaded
/// 2-core machine may not run the peer's thread for a while.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The read timeout against a silent peer: it is detected after this.
const SILENT_TIMEOUT: Duration = Duration::from_millis(300);
/// No exchange in this file may take longer than this: no hang.
const BOUND: Duration = Duration::from_secs(20);

/// Connects to a peer on 127.0.0.1 that runs `peer` on its end of the connection, and
/// returns this end (with a read timeout) and the peer's thread.
fn hostile_peer(peer: impl FnOnce(TcpStream) + Send + 'static) -> (TcpStream, thread::JoinHandle<()>) {
    hostile_peer_with(READ_TIMEOUT, peer)
}

/// [`hostile_peer`] with this side's read timeout.
fn hostile_peer_with(
    read_timeout: Duration,
    peer: impl FnOnce(TcpStream) + Send + 'static,
) -> (TcpStream, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local address");
    let t = thread::spawn(move || {
        let (s, _) = listener.accept().expect("accept");
        s.set_read_timeout(Some(BOUND)).expect("timeout");
        peer(s);
    });
    let s = TcpStream::connect(addr).expect("connect to 127.0.0.1");
    s.set_read_timeout(Some(read_timeout)).expect("read timeout");
    s.set_write_timeout(Some(BOUND)).expect("write timeout");
    (s, t)
}

/// Reads the 58 bytes this side sends first, as a real peer would before misbehaving.
fn take_endpoint(s: &mut TcpStream) -> Endpoint {
    let mut b = [0u8; Endpoint::WIRE_LEN];
    s.read_exact(&mut b).expect("this side's endpoint");
    Endpoint::from_bytes(&b).expect("this side sends a valid endpoint")
}

/// Reads this side's endpoint and status, so that the peer's close is a clean one (a
/// socket closed with unread data resets the connection instead).
fn take_endpoint_and_status(s: &mut TcpStream) {
    assert_eq!(take_endpoint(s), endpoints()[0]);
    let mut st = [0u8; STATUS_LEN];
    s.read_exact(&mut st).expect("this side's status");
    assert_eq!(Status::from_bytes(&st), Ok(Status::Ready));
}

/// Runs the exchange and status sync as a handshake does, timing it.
fn handshake_with(s: &mut TcpStream) -> (Result<Endpoint, Error>, Duration) {
    let started = Instant::now();
    let got = wire::exchange(s, &endpoints()[0]).and_then(|ep| wire::sync(s, Status::Ready).map(|()| ep));
    let took = started.elapsed();
    assert!(took < BOUND, "the exchange took {took:?}");
    (got, took)
}

#[test]
fn a_well_behaved_peer_over_tcp_completes_the_exchange() {
    let theirs = endpoints()[3];
    let (mut s, t) = hostile_peer(move |mut p| {
        // Dribbled a byte at a time: short reads are fine.
        for b in theirs.to_bytes().iter().chain(Status::Ready.to_bytes().iter()) {
            p.write_all(&[*b]).expect("write");
            thread::sleep(Duration::from_millis(1));
        }
        take_endpoint_and_status(&mut p);
    });
    let (got, _) = handshake_with(&mut s);
    assert_eq!(got.expect("the exchange"), theirs);
    t.join().expect("peer thread");
}

#[test]
fn a_peer_sending_garbage_over_tcp_is_a_wire_error() {
    for seed in 0..64u64 {
        let (mut s, t) = hostile_peer(move |mut p| {
            let mut r = Rng::seeded(100 + seed);
            let mut junk = r.bytes_below(4096);
            junk.push(0x55);
            if seed % 2 == 1 && junk.len() >= HEADER_LEN {
                // Past the header: the field checks refuse it.
                junk[..4].copy_from_slice(&MAGIC);
                junk[4] = VERSION;
            }
            let _ = p.write_all(&junk);
            let _ = take_endpoint(&mut p);
            let _ = p.shutdown(Shutdown::Write);
        });
        let (got, _) = handshake_with(&mut s);
        match got {
            Err(Error::Wire { what: "reading the peer's endpoint", .. }) => {}
            // A garbage header with a short body can also end in the peer's hang-up.
            Err(Error::Io { what: "reading the peer's endpoint", ref source })
                if source.kind() == std::io::ErrorKind::UnexpectedEof => {}
            other => panic!("seed {seed}: {other:?}"),
        }
        t.join().expect("peer thread");
    }
}

#[test]
fn a_peer_closing_at_every_point_of_its_endpoint_is_a_clear_error() {
    let theirs = endpoints()[1].to_bytes();
    for cut in 0..theirs.len() {
        let (mut s, t) = hostile_peer(move |mut p| {
            let _ = take_endpoint(&mut p);
            p.write_all(&theirs[..cut]).expect("write");
        });
        let (got, _) = handshake_with(&mut s);
        let e = got.expect_err("a truncated endpoint");
        assert!(matches!(e, Error::Io { what: "reading the peer's endpoint", .. }), "cut {cut}: {e}");
        assert!(e.to_string().contains("the peer closed the connection"), "cut {cut}: {e}");
        t.join().expect("peer thread");
    }
}

#[test]
fn a_peer_closing_before_its_status_is_a_clear_error() {
    let theirs = endpoints()[1];
    for cut in 0..STATUS_LEN {
        let (mut s, t) = hostile_peer(move |mut p| {
            p.write_all(&theirs.to_bytes()).expect("write");
            p.write_all(&Status::Ready.to_bytes()[..cut]).expect("write");
            take_endpoint_and_status(&mut p);
        });
        let (got, _) = handshake_with(&mut s);
        let e = got.expect_err("no status");
        assert!(matches!(e, Error::Io { what: "reading the peer's handshake status", .. }), "cut {cut}: {e}");
        assert!(e.to_string().contains("the peer closed the connection"), "{e}");
        t.join().expect("peer thread");
    }
}

#[test]
fn a_silent_peer_times_out_instead_of_hanging() {
    let (mut s, t) = hostile_peer_with(SILENT_TIMEOUT, |p| {
        // Keeps the connection open and says nothing.
        thread::sleep(SILENT_TIMEOUT * 4);
        drop(p);
    });
    let (got, took) = handshake_with(&mut s);
    let e = got.expect_err("silence");
    assert!(matches!(e, Error::Timeout { verb: Verb::Handshake, .. }), "{e}");
    assert!(took >= SILENT_TIMEOUT, "{took:?}");
    t.join().expect("peer thread");

    // Silent after half an endpoint: the same.
    let (mut s, t) = hostile_peer_with(SILENT_TIMEOUT, |mut p| {
        p.write_all(&endpoints()[0].to_bytes()[..30]).expect("write");
        thread::sleep(SILENT_TIMEOUT * 4);
    });
    let (got, _) = handshake_with(&mut s);
    assert!(matches!(got, Err(Error::Timeout { .. })), "{got:?}");
    t.join().expect("peer thread");
}

#[test]
fn a_peer_sending_too_much_is_refused_after_a_bounded_read() {
    // A valid endpoint followed by a flood bigger than the socket buffers: the endpoint
    // is read, the flood is not a status, and nobody hangs.
    let (mut s, t) = hostile_peer(|mut p| {
        p.write_all(&endpoints()[2].to_bytes()).expect("write");
        take_endpoint_and_status(&mut p);
        // This side stops reading after 6 bytes: the write ends with an error when it
        // hangs up, never in a hang.
        let _ = p.write_all(&vec![0xA5u8; 64 << 20]);
    });
    let (got, _) = handshake_with(&mut s);
    let e = got.expect_err("a flood instead of a status");
    assert!(
        matches!(e, Error::Wire { what: "reading the peer's handshake status", source: WireError::BadMagic { .. } }),
        "{e}"
    );
    drop(s);
    t.join().expect("peer thread");

    // A newer version's header: refused after its 5 bytes, whatever the peer says follows.
    let (mut s, t) = hostile_peer(|mut p| {
        let _ = take_endpoint(&mut p);
        let _ = p.write_all(b"RDVE\x02");
        let _ = p.write_all(&vec![0u8; 64 << 20]);
    });
    let (got, _) = handshake_with(&mut s);
    assert!(matches!(got, Err(Error::Wire { source: WireError::UnsupportedVersion { found: 2 }, .. })), "{got:?}");
    drop(s);
    t.join().expect("peer thread");
}

#[test]
fn reading_an_endpoint_takes_exactly_its_length_from_the_stream() {
    /// A stream that counts what was taken from it.
    struct Counting<'a>(&'a [u8], usize);
    impl Read for Counting<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = (&self.0[self.1..]).read(buf)?;
            self.1 += n;
            Ok(n)
        }
    }
    let mut data = endpoints()[0].to_bytes().to_vec();
    data.extend(std::iter::repeat_n(0xEE, 1 << 16));
    let mut c = Counting(&data, 0);
    assert_eq!(wire::read_endpoint(&mut c).expect("valid"), endpoints()[0]);
    assert_eq!(c.1, Endpoint::WIRE_LEN, "read past the message");
    // A bad header stops the read after the header.
    let mut bad = b"RDVE\x07".to_vec();
    bad.extend(std::iter::repeat_n(0u8, 1 << 16));
    let mut c = Counting(&bad, 0);
    assert!(wire::read_endpoint(&mut c).is_err());
    assert_eq!(c.1, HEADER_LEN);
}

#[test]
fn a_peer_that_gave_up_or_sent_an_unknown_status_is_reported() {
    for (status, want) in [
        (Status::Rejected.to_bytes(), "rejected this side's endpoint"),
        (Status::Failed.to_bytes(), "could not bring its QP up"),
        (*b"RDVS\x01\x09", "unknown handshake status code 9"),
        (*b"RDVS\x05\x00", "version 5"),
        (*b"RDVE\x01\x00", "not a message of this protocol"),
    ] {
        let (mut s, t) = hostile_peer(move |mut p| {
            p.write_all(&endpoints()[1].to_bytes()).expect("write");
            p.write_all(&status).expect("write");
            take_endpoint_and_status(&mut p);
        });
        let (got, _) = handshake_with(&mut s);
        let e = got.expect_err("not ready");
        assert!(matches!(e, Error::Wire { what: "reading the peer's handshake status", .. }), "{e}");
        assert!(e.to_string().contains(want), "{e}");
        t.join().expect("peer thread");
    }
}
