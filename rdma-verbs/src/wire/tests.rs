//! The wire formats' unit tests: round trips and refusals.

use super::*;
use crate::qp::DEFAULT_QKEY;
use std::net::Ipv6Addr;
use std::os::unix::net::UnixStream;
use std::time::Duration;

fn gid(s: &str) -> Gid {
    Gid(s.parse::<Ipv6Addr>().unwrap().octets())
}

fn rc() -> Endpoint {
    Endpoint {
        transport: QpType::Rc,
        qpn: 0x12_3456,
        psn: 0xab_cdef,
        qkey: 0,
        lid: 0,
        gid: gid("::ffff:10.99.0.1"),
        mtu: Mtu::Mtu1024,
        mr: Some(RemoteMr { addr: 0x7f00_0000_1000, len: 8192, rkey: 0xdead_beef }),
    }
}

fn ud() -> Endpoint {
    Endpoint { transport: QpType::Ud, qkey: DEFAULT_QKEY, mr: None, lid: 7, gid: Gid::default(), ..rc() }
}

fn reject(bytes: &[u8]) -> WireError {
    Endpoint::from_bytes(bytes).unwrap_err()
}

/// `rc()` with one byte changed.
fn poked(at: usize, v: u8) -> Vec<u8> {
    let mut b = rc().to_bytes().to_vec();
    b[at] = v;
    b
}

#[test]
fn endpoints_round_trip_through_the_wire_form() {
    for ep in [rc(), Endpoint { mr: None, ..rc() }, Endpoint { transport: QpType::Uc, ..rc() }, ud()] {
        let bytes = ep.to_bytes();
        assert_eq!(Endpoint::from_bytes(&bytes), Ok(ep));
    }
}

#[test]
fn the_wire_form_is_the_documented_big_endian_layout() {
    let b = rc().to_bytes();
    assert_eq!(b.len(), 58);
    assert_eq!(&b[0..8], b"RDVE\x01\x01\x02\x03");
    assert_eq!(&b[8..16], &[0, 0x12, 0x34, 0x56, 0, 0xab, 0xcd, 0xef]);
    assert_eq!(&b[16..22], &[0; 6]);
    assert_eq!(&b[22..38], &gid("::ffff:10.99.0.1").0);
    assert_eq!(&b[38..46], &0x7f00_0000_1000u64.to_be_bytes());
    assert_eq!(&b[46..54], &8192u64.to_be_bytes());
    assert_eq!(&b[54..58], &[0xde, 0xad, 0xbe, 0xef]);
    let u = ud().to_bytes();
    assert_eq!((u[5], u[6]), (0, 4));
    assert_eq!(&u[16..22], &[0x11, 0x11, 0x11, 0x11, 0, 7]);
    assert_eq!(&u[38..], &[0; 20]);
}

#[test]
fn short_and_long_inputs_are_truncated_or_oversized() {
    let b = rc().to_bytes();
    assert_eq!(reject(&[]), WireError::Truncated { got: 0, need: 5 });
    assert_eq!(reject(b"RDV"), WireError::Truncated { got: 3, need: 5 });
    assert_eq!(reject(b"RDVE"), WireError::Truncated { got: 4, need: 5 });
    assert_eq!(reject(&b[..57]), WireError::Truncated { got: 57, need: 58 });
    let mut long = b.to_vec();
    long.push(0);
    assert_eq!(reject(&long), WireError::Oversized { got: 59, len: 58 });
}

#[test]
fn wrong_magic_and_versions_are_refused_before_the_length() {
    assert_eq!(reject(b"GET / HTTP/1.1\r\n"), WireError::BadMagic { found: *b"GET ", expected: "RDVE" });
    assert!(matches!(reject(b"X"), WireError::BadMagic { .. }), "one wrong byte is enough");
    // Hex, and the text where it is printable: the wrong protocol shows at a glance.
    let text = reject(b"GET / HTTP/1.1\r\n").to_string();
    assert_eq!(text, r#"it starts with 47 45 54 20 ("GET "), not "RDVE": not a message of this protocol"#);
    let text = reject(b"\x16\x03\x01\x02").to_string();
    assert!(text.starts_with("it starts with 16 03 01 02, not"), "no text when nothing is printable: {text}");
    let text = reject(b"RD\x00\xff").to_string();
    assert!(text.starts_with(r#"it starts with 52 44 00 ff ("RD.."), not"#), "{text}");
    assert_eq!(reject(&poked(4, 0)), WireError::UnsupportedVersion { found: 0 });
    // A newer version is refused whatever its length.
    assert_eq!(reject(b"RDVE\x02"), WireError::UnsupportedVersion { found: 2 });
    assert!(reject(&poked(4, 2)).to_string().contains("reads version 1 only"));
}

#[test]
fn unknown_flags_transports_and_mtus_are_refused() {
    assert_eq!(reject(&poked(5, 0x81)), WireError::UnknownFlags(0x80));
    assert_eq!(reject(&poked(6, 0)), WireError::UnknownTransport(0));
    assert_eq!(reject(&poked(6, 5)), WireError::UnknownTransport(5));
    assert_eq!(reject(&poked(7, 0)), WireError::BadMtu(0));
    assert_eq!(reject(&poked(7, 6)), WireError::BadMtu(6));
}

#[test]
fn qpn_and_psn_wider_than_24_bits_are_refused() {
    assert_eq!(reject(&poked(8, 1)), WireError::QpnTooLarge(0x0112_3456));
    assert_eq!(reject(&poked(12, 0x80)), WireError::PsnTooLarge(0x80ab_cdef));
    let mut b = rc().to_bytes();
    b[8..12].copy_from_slice(&1u32.to_be_bytes());
    assert_eq!(reject(&b), WireError::ReservedQpn(1));
    let ep = Endpoint { qpn: 0x100_0000, ..rc() };
    assert_eq!(ep.validate(), Err(WireError::QpnTooLarge(0x100_0000)));
    assert_eq!(reject(&ep.to_bytes()), WireError::QpnTooLarge(0x100_0000), "to_bytes keeps it invalid");
}

#[test]
fn an_endpoint_without_lid_and_gid_or_with_a_multicast_lid_is_refused() {
    let none = Endpoint { lid: 0, gid: Gid::default(), ..rc() };
    assert_eq!(reject(&none.to_bytes()), WireError::NoAddress);
    let mc = Endpoint { lid: 0xc001, ..rc() };
    assert_eq!(reject(&mc.to_bytes()), WireError::MulticastLid(0xc001));
    let by_lid_only = Endpoint { lid: 0x2a, gid: Gid::default(), ..rc() };
    assert_eq!(Endpoint::from_bytes(&by_lid_only.to_bytes()), Ok(by_lid_only));
}

#[test]
fn a_qkey_outside_ud_and_a_region_on_ud_are_refused() {
    let b = poked(19, 1);
    assert_eq!(reject(&b), WireError::QkeyNotUd { transport: QpType::Rc, qkey: 1 });
    let ud_mr = Endpoint { mr: Some(RemoteMr { addr: 0, len: 1, rkey: 1 }), ..ud() };
    assert_eq!(reject(&ud_mr.to_bytes()), WireError::MrOnUd);
}

#[test]
fn region_fields_must_match_the_flag_and_not_overflow() {
    assert_eq!(reject(&poked(5, 0)), WireError::StrayMrFields);
    let end = Endpoint { mr: Some(RemoteMr { addr: u64::MAX - 9, len: 10, rkey: 1 }), ..rc() };
    assert_eq!(reject(&end.to_bytes()), WireError::MrOverflow { addr: u64::MAX - 9, len: 10 });
    let last = Endpoint { mr: Some(RemoteMr { addr: u64::MAX - 10, len: 10, rkey: 1 }), ..rc() };
    assert_eq!(Endpoint::from_bytes(&last.to_bytes()), Ok(last));
}

#[test]
fn every_single_byte_flip_is_refused_or_reencodes_to_the_same_bytes() {
    let good = rc().to_bytes();
    for at in 0..good.len() {
        for v in [0u8, 1, 0x7f, 0x80, 0xff] {
            let mut b = good;
            b[at] = v;
            if let Ok(ep) = Endpoint::from_bytes(&b) {
                assert_eq!(ep.to_bytes(), b, "byte {at} = {v:#x}");
            }
        }
    }
}

#[test]
fn status_messages_round_trip_and_garbage_is_refused() {
    for s in [Status::Ready, Status::Rejected, Status::Failed] {
        assert_eq!(Status::from_bytes(&s.to_bytes()), Ok(s));
    }
    assert_eq!(Status::from_bytes(b"RDVS\x01\x09"), Err(WireError::UnknownStatus(9)));
    assert_eq!(Status::from_bytes(b"RDVS\x01"), Err(WireError::Truncated { got: 5, need: 6 }));
    assert!(matches!(Status::from_bytes(b"RDVE\x01\x00"), Err(WireError::BadMagic { .. })));
    assert_eq!(Status::from_bytes(b"RDVS\x07\x00"), Err(WireError::UnsupportedVersion { found: 7 }));
}

fn pair() -> (UnixStream, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    for s in [&a, &b] {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    }
    (a, b)
}

#[test]
fn both_sides_exchange_at_once_without_waiting_for_each_other() {
    let (mut a, mut b) = pair();
    let (ea, eb) = (rc(), ud());
    let t = std::thread::spawn(move || {
        let got = exchange(&mut b, &eb).unwrap();
        sync(&mut b, Status::Ready).unwrap();
        got
    });
    assert_eq!(exchange(&mut a, &ea).unwrap(), eb);
    sync(&mut a, Status::Ready).unwrap();
    assert_eq!(t.join().unwrap(), ea);
}

#[test]
fn a_peer_speaking_another_protocol_is_a_wire_error() {
    let (mut a, mut b) = pair();
    b.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
    let e = exchange(&mut a, &rc()).unwrap_err();
    assert!(matches!(e, Error::Wire { source: WireError::BadMagic { .. }, .. }), "{e}");
    assert!(e.to_string().starts_with("reading the peer's endpoint: it starts with"), "{e}");
}

#[test]
fn a_peer_that_hangs_up_or_stays_silent_is_a_clear_error() {
    let (mut a, b) = pair();
    drop(b);
    let e = read_endpoint(&mut a).unwrap_err();
    assert!(e.to_string().contains("the peer closed the connection"), "{e}");

    let (mut a, _b) = pair();
    a.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let e = exchange(&mut a, &rc()).unwrap_err();
    assert!(matches!(e, Error::Timeout { verb: Verb::Handshake, .. }), "{e}");
}

#[test]
fn a_peer_that_gave_up_is_reported_as_such() {
    let (mut a, mut b) = pair();
    b.write_all(&Status::Rejected.to_bytes()).unwrap();
    let e = sync(&mut a, Status::Ready).unwrap_err();
    assert!(matches!(e, Error::Wire { source: WireError::PeerRejected, .. }), "{e}");
    let mut mine = [0u8; STATUS_LEN];
    b.read_exact(&mut mine).unwrap();
    assert_eq!(Status::from_bytes(&mine), Ok(Status::Ready), "this side still told the peer");
}

const PINGPONG_MSG: &[u8; 52] = b"0011:000012:abcdef:00000000000000000000ffff0a630001\0";

#[test]
fn pingpong_messages_match_rdma_core_byte_for_byte() {
    let info = RemoteQpInfo { qpn: 0x12, psn: 0xab_cdef, lid: 0x11, gid: gid("::ffff:10.99.0.1") };
    assert_eq!(&pingpong::encode(&info).unwrap(), PINGPONG_MSG);
    assert_eq!(pingpong::decode(PINGPONG_MSG), Ok(info));
    let upper = PINGPONG_MSG.to_ascii_uppercase();
    assert_eq!(pingpong::decode(&upper), Ok(info), "sscanf's %x takes either case");
    let ib = RemoteQpInfo { qpn: 0xff_ffff, psn: 0, lid: 0xbfff, gid: Gid::default() };
    let m = pingpong::encode(&ib).unwrap();
    assert_eq!(&m[..19], b"bfff:ffffff:000000:");
    assert_eq!(pingpong::decode(&m), Ok(ib));
    assert_eq!(pingpong::encode(&RemoteQpInfo { psn: 1 << 24, ..ib }), Err(WireError::PsnTooLarge(1 << 24)));
}

#[test]
fn malformed_pingpong_messages_are_refused() {
    let bad = |at: usize, v: u8| {
        let mut m = *PINGPONG_MSG;
        m[at] = v;
        pingpong::decode(&m).unwrap_err()
    };
    assert_eq!(pingpong::decode(&PINGPONG_MSG[..51]), Err(WireError::Truncated { got: 51, need: 52 }));
    assert_eq!(pingpong::decode(&[b'0'; 53]), Err(WireError::Oversized { got: 53, len: 52 }));
    assert_eq!(bad(4, b'-'), WireError::Text { offset: 4, what: "expected ':'" });
    assert_eq!(bad(7, b'g'), WireError::Text { offset: 7, what: "expected a hex digit" });
    assert_eq!(bad(40, b' '), WireError::Text { offset: 40, what: "expected a hex digit" });
    assert_eq!(bad(51, b'0'), WireError::Text { offset: 51, what: "expected the terminating NUL" });
    let mut zero = *b"0000:000012:000000:00000000000000000000000000000000\0";
    assert_eq!(pingpong::decode(&zero), Err(WireError::NoAddress));
    zero[10] = b'1';
    zero[3] = b'1';
    assert!(pingpong::decode(&zero).is_ok());
    assert_eq!(
        pingpong::decode(b"0000:000001:000000:00000000000000000000000000000001\0"),
        Err(WireError::ReservedQpn(1))
    );
    assert_eq!(
        pingpong::decode(b"c000:000012:000000:00000000000000000000000000000000\0"),
        Err(WireError::MulticastLid(0xc000))
    );
    pingpong::check_done(b"done\0").unwrap();
    assert_eq!(pingpong::check_done(b"done"), Err(WireError::Truncated { got: 4, need: 5 }));
    assert_eq!(
        pingpong::check_done(b"dune\0"),
        Err(WireError::Text { offset: 1, what: "expected \"done\" and a NUL" })
    );
}
