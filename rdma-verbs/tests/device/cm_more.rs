//! The rest of rdma_cma.h on a real device: id options, send-only multicast joins, a QP
//! the user made connected through rdma_cm (`rdma_init_qp_attr`, `rdma_establish`,
//! `rdma_notify`), and ECE carried by the CM handshake. Each test runs in a process of
//! its own, as those of cm.rs do.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use rdma_verbs::{
    AccessFlags, AddressHandle, Chunk, CmEventKind, CmId, CmNotify, CmOption, CompletionQueue, ConnParam, Ece, Error,
    EventChannel, JoinMode, PortSpace, ProtectionDomain, QpState, QpType, QueuePair, RecvQueue, RejectReason, Remote,
    SendQueue, SendWr, Verb, WcOpcode, WcStatus,
};

use crate::cm::{isolated, listener, mc_quiet, pattern, rdma_ip, resolved};
use crate::datapath::{chunks, poll_one};

const T: Duration = Duration::from_secs(10);

/// A QP the test makes itself on an id's context, with its CQ, queues and buffers.
struct UserQp {
    bufs: Vec<Chunk>,
    sq: SendQueue<Chunk>,
    rq: RecvQueue<Chunk>,
    cq: CompletionQueue,
    qp: QueuePair,
}

impl UserQp {
    fn new(id: &CmId) -> UserQp {
        let ctx = id.context().unwrap();
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let cq = CompletionQueue::new(&ctx, 32).unwrap();
        let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(8).max_recv_wr(8).build().unwrap();
        assert_eq!(qp.state().unwrap(), QpState::Reset, "a QP the user builds starts in RESET");
        let bufs = chunks(&pd, 4, 4096, AccessFlags::LOCAL_WRITE);
        UserQp { sq: qp.send_queue().unwrap(), rq: qp.recv_queue().unwrap(), bufs, cq, qp }
    }

    fn post_recv(&mut self) {
        let buf = self.bufs.pop().expect("a free buffer");
        self.rq.post(buf, 0..4096, 1).unwrap();
    }

    fn send(&mut self, data: &[u8]) {
        let mut buf = self.bufs.pop().expect("a free buffer");
        buf[..data.len()].copy_from_slice(data);
        self.sq.post(SendWr::send(buf, 0..data.len())).unwrap();
        let mut wc = poll_one(&mut self.cq);
        self.sq.complete(&mut wc, |d| assert_eq!(d.status, WcStatus::Success)).unwrap();
    }

    fn recv(&mut self) -> Vec<u8> {
        let mut wc = poll_one(&mut self.cq);
        assert_eq!(wc.opcode(), WcOpcode::Recv);
        let done = self.rq.complete(&mut wc).unwrap();
        assert_eq!(done.status, WcStatus::Success);
        done.value[..done.byte_len as usize].to_vec()
    }
}

/// Accepts one request on `listen` with a QP made through its id (as cm.rs's Side does),
/// keeping the id and QP alive until `done` says so.
fn accept_with_cm_qp(listen: &CmId, done: mpsc::Receiver<()>) {
    let req = listen.get_request(T).unwrap();
    let id = req.into_id();
    let ctx = id.context().unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    let qp = id.create_qp(QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(4).max_recv_wr(4)).unwrap();
    id.accept(&ConnParam::new(), T).unwrap();
    done.recv_timeout(T).unwrap();
    drop((qp, cq, pd, ctx, id));
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn ack_timeout_and_tos_set_as_options_reach_the_connected_qp_and_reuseaddr_shares_a_port() {
    isolated(this_test!(), || {
        let channel = EventChannel::new().unwrap();
        // REUSEADDR: two ids that both set it bind one address and port; a third without it
        // cannot; and it is refused once the id is bound.
        let a = CmId::new(&channel, PortSpace::Tcp).unwrap();
        a.set_option(CmOption::ReuseAddr(true)).unwrap();
        a.bind(SocketAddr::new(rdma_ip(), 0)).unwrap();
        let shared = a.local_addr().unwrap();
        let b = CmId::new(&channel, PortSpace::Tcp).unwrap();
        b.set_option(CmOption::ReuseAddr(true)).unwrap();
        b.bind(shared).unwrap();
        assert_eq!(b.local_addr(), Some(shared));
        let c = CmId::new(&channel, PortSpace::Tcp).unwrap();
        let e = c.bind(shared).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EADDRINUSE), "without REUSEADDR: {e}");
        let e = a.set_option(CmOption::ReuseAddr(false)).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::CmSetOption, .. }), "{e:?}");
        drop((a, b, c));

        // TOS and the ACK timeout, set before resolution, end up in the QP's attributes.
        let (listen, addr) = listener(&channel);
        let (tx, rx) = mpsc::channel();
        thread::scope(|s| {
            s.spawn(|| accept_with_cm_qp(&listen, rx));
            let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
            id.set_option(CmOption::TypeOfService(0x20)).unwrap();
            id.set_option(CmOption::AckTimeout(18)).unwrap();
            let e = id.set_option(CmOption::AckTimeout(32)).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { verb: Verb::CmSetOption, .. }), "{e:?}");
            id.resolve_addr(None, addr, T).unwrap();
            id.resolve_route(T).unwrap();
            let ctx = id.context().unwrap();
            let pd = ProtectionDomain::new(&ctx).unwrap();
            let cq = CompletionQueue::new(&ctx, 16).unwrap();
            let qp = id.create_qp(QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(4).max_recv_wr(4)).unwrap();
            id.connect(&ConnParam::new(), T).unwrap();
            let attrs = qp.query().unwrap();
            eprintln!("client QP after connect: {attrs:?}");
            assert_eq!(attrs.state, QpState::Rts);
            assert_eq!(attrs.timeout, 18, "the ACK timeout option is the QP's timeout");
            match attrs.path.remote {
                Remote::Gid { traffic_class, .. } => assert_eq!(traffic_class, 0x20, "TOS is the traffic class"),
                other => panic!("a RoCE path has a GRH: {other:?}"),
            }
            tx.send(()).unwrap();
            drop((qp, cq, pd, ctx, id));
        });
    });
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_send_only_join_gets_the_group_but_its_qp_receives_none_of_its_datagrams() {
    isolated(this_test!(), || {
        let group: IpAddr = Ipv4Addr::new(239, 1, 2, 7).into();
        let channel = EventChannel::new().unwrap();
        // Members: b sends only, c is a full member; both have QPs with receives posted.
        let member = |n: usize| {
            let id = CmId::new(&channel, PortSpace::Udp).unwrap();
            id.bind(SocketAddr::new(rdma_ip(), 0)).unwrap();
            let ctx = id.context().unwrap();
            let pd = ProtectionDomain::new(&ctx).unwrap();
            let cq = CompletionQueue::new(&ctx, 16).unwrap();
            let qp = id.create_qp(QueuePair::builder(&pd, QpType::Ud, &cq, &cq).max_send_wr(4).max_recv_wr(4)).unwrap();
            let mut rq: RecvQueue<Chunk> = qp.recv_queue().unwrap();
            for (i, ch) in chunks(&pd, n, 512, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
                rq.post(ch, 0..512, i as u64).unwrap();
            }
            (id, cq, qp, rq, pd)
        };
        let (b_id, mut b_cq, b_qp, b_rq, b_pd) = member(2);
        let (c_id, mut c_cq, _c_qp, mut c_rq, _c_pd) = member(2);
        let send_only = b_id.join_multicast_ex(group, JoinMode::SendOnlyFullMember, T);
        eprintln!("send-only join on this device: {send_only:?}");
        let send_only = send_only.unwrap();
        let full = c_id.join_multicast_ex(group, JoinMode::FullMember, T).unwrap();
        assert_eq!(send_only.qp_num, rdma_verbs::MULTICAST_QPN);
        assert_eq!((send_only.qkey, send_only.ah), (full.qkey, full.ah), "one group, one address and Q_Key");

        // The send-only member sends to the group: the full member receives, b does not.
        let ah = AddressHandle::new(&b_pd, &send_only.ah).unwrap();
        let mut sq: SendQueue<Chunk> = b_qp.send_queue().unwrap();
        let data = pattern(21, 200);
        let mut src = chunks(&b_pd, 1, 512, AccessFlags::LOCAL_WRITE).pop().unwrap();
        src[..data.len()].copy_from_slice(&data);
        if let Err(r) = sq.post(SendWr::send_ud(src, 0..data.len(), &ah, send_only.qp_num, send_only.qkey)) {
            panic!("{}", r.error);
        }
        let mut wc = poll_one(&mut b_cq);
        assert_eq!(wc.opcode(), WcOpcode::Send, "b's only completion is its send");
        sq.complete(&mut wc, |d| assert_eq!(d.status, WcStatus::Success)).unwrap();
        let mut wc = poll_one(&mut c_cq);
        let done = c_rq.complete(&mut wc).unwrap().result().unwrap();
        assert_eq!(&done.value[40..40 + data.len()], &data[..], "the full member got the bytes");
        mc_quiet(&mut b_cq, "a send-only member's QP received the group's datagram");
        assert_eq!(b_rq.outstanding(), 2);

        // Refused before C: a connected id.
        let tcp = CmId::new(&channel, PortSpace::Tcp).unwrap();
        let e = tcp.join_multicast_ex(group, JoinMode::FullMember, T).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::CmJoinMulticastEx, .. }), "{e:?}");
        b_id.leave_multicast(group).unwrap();
        c_id.leave_multicast(group).unwrap();
    });
}

/// The passive side of a user-QP connection: takes the request, builds its QP, moves it
/// INIT -> RTR -> RTS from the CM's attributes, tells `main` its QP number and id, and
/// then accepts (waiting for ESTABLISHED) and returns what the peer sent.
fn user_qp_server(listen: &CmId, notify_first: bool, to_main: mpsc::Sender<u32>, go: mpsc::Receiver<()>) -> Vec<u8> {
    let req = listen.get_request(T).unwrap();
    let id = req.into_id();
    let mut side = UserQp::new(&id);
    for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
        id.modify_qp(&side.qp, s).unwrap();
        assert_eq!(side.qp.state().unwrap(), s);
        if s == QpState::Init {
            // Receives go in from INIT on (rxe refuses them in RESET).
            side.post_recv();
        }
    }
    to_main.send(side.qp.qp_num()).unwrap();
    if notify_first {
        // The client answers but does not establish until told: the server says its QP
        // saw the connection come up, and the CM reports ESTABLISHED at once.
        thread::scope(|s| {
            let waiter = s.spawn(|| id.accept_with(&side.qp, &ConnParam::new(), T));
            go.recv_timeout(T).unwrap();
            id.notify(CmNotify::CommEstablished).unwrap();
            waiter.join().unwrap().unwrap();
        });
        let e = id.notify(CmNotify::CommEstablished).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EISCONN), "a second COMM_EST: {e}");
        to_main.send(0).unwrap();
    } else {
        id.accept_with(&side.qp, &ConnParam::new(), T).unwrap();
    }
    let got = side.recv();
    drop(side);
    got
}

fn user_qp_connection(notify_first: bool) {
    let channel = EventChannel::new().unwrap();
    let (listen, addr) = listener(&channel);
    let (to_main, from_server) = mpsc::channel();
    let (go_tx, go) = mpsc::channel();
    thread::scope(|s| {
        let server = s.spawn(|| user_qp_server(&listen, notify_first, to_main, go));
        let id = resolved(&channel, addr);
        id.set_option(CmOption::AckTimeout(17)).unwrap();
        let mut side = UserQp::new(&id);
        id.modify_qp(&side.qp, QpState::Init).unwrap();
        assert_eq!(side.qp.state().unwrap(), QpState::Init);
        // Before the answer the CM has no RTR attributes to give.
        let ev = id.connect_with(&side.qp, &ConnParam::new().private_data(b"user qp"), T).unwrap();
        assert_eq!(ev.kind(), CmEventKind::ConnectResponse);
        let server_qpn = from_server.recv_timeout(T).unwrap();
        assert_eq!(ev.conn().unwrap().qp_num, server_qpn, "the response names the server's own QP");
        let rtr = id.qp_attr(QpState::Rtr).unwrap();
        assert_eq!(rtr.dest_qp_num(), server_qpn);
        let rts = id.qp_attr(QpState::Rts).unwrap();
        assert_eq!(rts.timeout(), 17, "the ACK timeout option is in the CM's RTS attributes");
        let e = id.qp_attr(QpState::Sqd).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::CmQpAttr, .. }), "{e:?}");
        id.modify_qp(&side.qp, QpState::Rtr).unwrap();
        id.modify_qp(&side.qp, QpState::Rts).unwrap();
        let q = side.qp.query().unwrap();
        assert_eq!((q.state, q.dest_qp_num, q.timeout), (QpState::Rts, server_qpn, 17));
        if notify_first {
            go_tx.send(()).unwrap();
            assert_eq!(from_server.recv_timeout(T).unwrap(), 0, "the server is established without our RTU");
        }
        id.establish().unwrap();
        let data = pattern(33, 1000);
        side.send(&data);
        assert_eq!(server.join().unwrap(), data, "the SEND arrived with its bytes");
        drop(side);
    });
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_qp_the_user_built_connects_through_rdma_cm_with_the_cms_attributes_and_establish() {
    isolated(this_test!(), || user_qp_connection(false));
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn the_passive_side_notifies_comm_est_and_is_established_before_the_peers_rtu() {
    isolated(this_test!(), || user_qp_connection(true));
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn ece_offered_through_rdma_cm_reaches_the_server_and_reject_ece_gives_reason_35() {
    isolated(this_test!(), || {
        let channel = EventChannel::new().unwrap();
        let (listen, addr) = listener(&channel);
        let offered = Ece { vendor_id: 0x2c9, options: 0x5 };
        thread::scope(|s| {
            let server = s.spawn(|| {
                let req = listen.get_request(T).unwrap();
                let got = req.id().remote_ece();
                req.id().reject_ece(b"no such option").unwrap();
                got
            });
            let id = resolved(&channel, addr);
            let e = id.set_local_ece(Ece { vendor_id: 0, options: 1 }).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { verb: Verb::CmSetLocalEce, .. }), "{e:?}");
            id.set_local_ece(offered).unwrap();
            let side = UserQp::new(&id);
            id.modify_qp(&side.qp, QpState::Init).unwrap();
            let e = id.connect_with(&side.qp, &ConnParam::new(), T).unwrap_err();
            let got = server.join().unwrap();
            eprintln!("the server read {got:?}; the client got {e:?}");
            assert_eq!(got.unwrap(), offered, "the REQ carried the ECE options to the server");
            match e {
                Error::Rejected { status, private_data, .. } => {
                    assert_eq!(RejectReason::from_raw(status), RejectReason::VendorOptionNotSupported);
                    assert_eq!(&private_data[..14], b"no such option");
                }
                other => panic!("expected a rejection: {other:?}"),
            }
        });
        // An id with a QP made through it leaves ECE to librdmacm: refused before C.
        let id = resolved(&channel, addr);
        let ctx = id.context().unwrap();
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let cq = CompletionQueue::new(&ctx, 4).unwrap();
        let qp = id.create_qp(QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(2).max_recv_wr(2)).unwrap();
        let e = id.remote_ece().unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::CmRemoteEce, .. }), "{e:?}");
        let e = id.establish().unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::CmEstablish, .. }), "{e:?}");
        let e = id.modify_qp(&qp, QpState::Rtr).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::CmModifyQp, .. }), "{e:?}");
        drop((qp, cq, pd, ctx, id));
    });
}
