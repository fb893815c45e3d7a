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

use rdma_test_support::{device_name, device_transport, open};
use rdma_verbs::{
    CompletionQueue, Error, Handshake, InitAttr, ProtectionDomain, QpState, QpType, QueuePair, RemoteQpInfo, Transport,
    Verb,
};

/// The device under test, which must be iWARP: these tests prove nothing on another
/// transport.
#[track_caller]
fn iwarp_device() -> String {
    let name = device_name();
    assert_eq!(
        device_transport(),
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

#[test]
#[ignore = "needs an iWARP device: scripts/test runs it on siw"]
fn a_qp_the_user_built_connects_through_rdma_cm_on_iwarp_from_init_and_rtr_is_refused() {
    use std::net::SocketAddr;
    use std::time::Duration;

    use rdma_test_support::{cm_leak_check, rdma_ip};
    use rdma_verbs::{AccessFlags, AlignedBuf, CmEventKind, CmId, ConnParam, EventChannel, PortSpace, SendWr};

    const T: Duration = Duration::from_secs(10);
    iwarp_device();
    let _leaks = cm_leak_check();
    // QPs of a context of the test's own, not the ids' (librdmacm's): the same device.
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut cq = CompletionQueue::new(&ctx, 16).unwrap();
    let qp = || QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(4).max_recv_wr(4).build().unwrap();
    let (a, b) = (qp(), qp());
    let mut chunks =
        pd.register(AlignedBuf::new(2 * 4096).unwrap(), AccessFlags::LOCAL_WRITE).unwrap().into_chunks(4096).unwrap();
    let (mut buf, dst) = (chunks.pop().unwrap(), chunks.pop().unwrap());
    let mut rq = b.recv_queue::<rdma_verbs::Chunk>().unwrap();
    let mut sq = a.send_queue::<rdma_verbs::Chunk>().unwrap();

    let (server_channel, client_channel) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let listener = CmId::new(&server_channel, PortSpace::Tcp).unwrap();
    listener.bind(SocketAddr::new(rdma_ip(), 0)).unwrap();
    listener.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let ids = std::thread::scope(|s| {
        let server = s.spawn(|| {
            let id = listener.get_request(T).unwrap().into_id();
            let e = id.modify_qp(&b, QpState::Rtr).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { verb: Verb::CmModifyQp, .. }), "{e:?}");
            assert!(e.to_string().contains("iWARP") && e.to_string().contains("INIT only"), "{e}");
            id.modify_qp(&b, QpState::Init).unwrap();
            id.accept_with(&b, &ConnParam::new(), T).unwrap();
            id
        });
        let id = CmId::new(&client_channel, PortSpace::Tcp).unwrap();
        id.resolve_addr(None, addr, T).unwrap();
        id.resolve_route(T).unwrap();
        id.modify_qp(&a, QpState::Init).unwrap();
        let ev = id.connect_with(&a, &ConnParam::new(), T).unwrap();
        assert_eq!(ev.kind(), CmEventKind::Established, "iWARP answers a connect with ESTABLISHED");
        let e = id.establish().unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::CmEstablish, .. }), "{e:?}");
        (id, server.join().unwrap())
    });

    // The connection carries a SEND whose bytes arrive.
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
    rq.post(dst, 0..4096, 7).unwrap();
    buf[..data.len()].copy_from_slice(&data);
    sq.post(SendWr::send(buf, 0..data.len()).id(9)).unwrap();
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + T;
    let mut wc = [rdma_verbs::WorkCompletion::EMPTY; 2];
    while got.len() < 2 {
        assert!(std::time::Instant::now() < deadline, "no completion within {T:?}");
        for w in cq.poll(&mut wc).unwrap().iter_mut() {
            got.push(std::mem::take(w));
        }
    }
    for mut w in got {
        if w.opcode() == rdma_verbs::WcOpcode::Recv {
            let done = rq.complete(&mut w).unwrap();
            assert_eq!((done.id, done.byte_len as usize), (7, data.len()));
            assert!(done.value[..data.len()] == data[..], "the received bytes differ");
        } else {
            sq.complete(&mut w, |d| assert_eq!((d.id, d.status), (9, rdma_verbs::WcStatus::Success))).unwrap();
        }
    }
    drop((sq, rq, ids, a, b));
}
