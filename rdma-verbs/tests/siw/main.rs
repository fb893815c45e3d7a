//! rdma-verbs on soft-iWARP: what iWARP refuses is refused before C, by type, naming why.
//!
//! These tests need an iWARP device: `scripts/test` runs this binary in the siw test bed
//! (`RXE_PROVIDER=siw scripts/rxe`, siw0 where rxe0 would be) and checks that every test
//! ran. On any other device (rxe, or none) each of them fails: it is no iWARP device. A plain
//! `cargo test` lists them as ignored. Beside what iWARP refuses, write_bw's rdma_cm mode
//! (`-R`), the way perftest runs on iWARP, runs here against itself and against
//! perftest's. The rxe device suite is `tests/device`;
//! docs/siw-survey.md is what that suite does on siw.

mod lacks;

use std::net::{TcpListener, TcpStream};

use rdma_test_support::{device_name, open};
use rdma_verbs::{
    devices, CompletionQueue, Error, Handshake, InitAttr, ProtectionDomain, QpState, QpType, QueuePair, RemoteQpInfo,
    Transport, Verb,
};

/// The device under test, which must be iWARP: these tests prove nothing on another
/// transport.
#[track_caller]
fn iwarp_device() -> String {
    let name = device_name();
    let list = devices().unwrap_or_else(|e| panic!("no device list ({e}): these tests need an iWARP device"));
    let dev = list.find(&name).unwrap_or_else(|e| panic!("{e}: these tests need an iWARP device"));
    assert_eq!(
        dev.transport(),
        Transport::Iwarp,
        "{name} is no iWARP device: run these tests with RXE_PROVIDER=siw scripts/rxe (scripts/test does)"
    );
    name
}

/// A refusal of connecting by hand: typed, naming `verb`, rdma_cm and `CmId`.
#[track_caller]
fn refused_by_hand(e: Error, verb: Verb) {
    let text = e.to_string();
    match &e {
        Error::NotSupported { verb: v, errno: None, .. } => assert_eq!(*v, verb, "{text}"),
        other => panic!("expected NotSupported before C from {verb:?}, got {other:?}"),
    }
    for word in ["iWARP", "only through rdma_cm", "cm::CmId", &device_name()] {
        assert!(text.contains(word), "{word:?} missing from: {text}");
    }
}

#[test]
#[ignore = "needs an iWARP device: scripts/test runs it on siw"]
fn connecting_a_qp_by_hand_on_iwarp_is_refused_before_c_naming_rdma_cm_and_cm_id() {
    let name = iwarp_device();
    let ctx = open();
    assert_eq!(ctx.name(), name);
    assert_eq!(ctx.transport(), Transport::Iwarp);
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 8).unwrap();
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(4).max_recv_wr(4).build().unwrap();

    // Each step of the by-hand path: what a peer would need, each transition, the whole.
    refused_by_hand(qp.local_info(1).unwrap_err(), Verb::QpLocalInfo);
    refused_by_hand(qp.to_init(&InitAttr::default()).unwrap_err(), Verb::ModifyQp);
    let remote = RemoteQpInfo { qpn: qp.qp_num(), psn: 1, lid: 0, gid: Default::default() };
    refused_by_hand(qp.connect(&InitAttr::default(), &remote).unwrap_err(), Verb::ModifyQp);

    // The endpoint handshake over a byte stream refuses before it sends a byte: the peer
    // reads end-of-stream, not an endpoint.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (mut peer, _) = listener.accept().unwrap();
    refused_by_hand(Handshake::new(&qp).connect(&mut stream).unwrap_err(), Verb::Handshake);
    drop(stream);
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut peer, &mut got).unwrap();
    assert!(got.is_empty(), "the handshake sent {} bytes before refusing", got.len());

    // Nothing reached the kernel, and the QP is still usable: it moves to ERR. (siw's
    // ibv_query_qp fills in no state, Linux 6.1's siw_query_qp: it reads RESET whatever
    // the state, so the state read back cannot show more.)
    assert_eq!(qp.state().unwrap(), QpState::Reset);
    qp.to_error().unwrap();
}

#[test]
#[ignore = "needs an iWARP device: scripts/test runs it on siw"]
fn write_bw_over_rdma_cm_runs_on_iwarp_with_its_data_check_and_meets_perftest_in_both_roles() {
    iwarp_device();
    rdma_test_support::tool::write_bw_over_rdma_cm_meets_itself_and_perftest(18631);
}
