//! UD beyond plain datagrams: a reply addressed from a received completion
//! (`ibv_create_ah_from_wc`), and multicast groups (`ibv_attach_mcast`).

use std::net::{Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

use rdma_verbs::{
    AccessFlags, AddressHandle, AhAttr, Chunk, CompletionQueue, Error, Gid, InitAttr, ProtectionDomain, QpType,
    QueuePair, Remote, SendWr, Verb, WcFlags, WcStatus, WorkCompletion, GRH_LEN, MULTICAST_QPN,
};
use rdma_verbs::{Done, RecvQueue, SendQueue};

use crate::datapath::{chunks, poll_one, random_bytes};
use crate::{gid_index, open, LeakCheck};

const QKEY: u32 = 0x1357_2468;
const UNTOUCHED: u8 = 0xee;

/// A UD QP ready to send and receive with [`QKEY`], its CQ and both of its queues.
struct Ud {
    cq: CompletionQueue,
    sq: SendQueue<Chunk>,
    rq: RecvQueue<Chunk>,
    qp: QueuePair,
}

fn ud(pd: &ProtectionDomain) -> Ud {
    let cq = CompletionQueue::new(pd.context(), 64).unwrap();
    let qp = QueuePair::builder(pd, QpType::Ud, &cq, &cq).max_send_wr(16).max_recv_wr(16).build().unwrap();
    qp.ready_ud(&InitAttr { qkey: QKEY, ..InitAttr::default() }).unwrap();
    Ud { sq: qp.send_queue().unwrap(), rq: qp.recv_queue().unwrap(), cq, qp }
}

/// Posts `n` receives of a GRH and `len` bytes each, filled with [`UNTOUCHED`].
fn post_receives(pd: &ProtectionDomain, u: &mut Ud, n: usize, len: usize) {
    for (i, mut c) in chunks(pd, n, GRH_LEN + len, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
        c.fill(UNTOUCHED);
        if let Err(r) = u.rq.post(c, 0..GRH_LEN + len, i as u64) {
            panic!("{}", r.error);
        }
    }
}

/// Sends `data` from `u` to `qpn` through `ah` and waits for the send to complete.
fn send(pd: &ProtectionDomain, u: &mut Ud, ah: &AddressHandle, qpn: u32, data: &[u8]) -> WorkCompletion {
    let mut c = chunks(pd, 1, data.len().max(1), AccessFlags::LOCAL_WRITE).pop().unwrap();
    c[..data.len()].copy_from_slice(data);
    if let Err(r) = u.sq.post(SendWr::send_ud(c, 0..data.len(), ah, qpn, QKEY)) {
        panic!("{}", r.error);
    }
    let mut wc = poll_one(&mut u.cq);
    assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
    u.sq.complete(&mut wc, |_| ()).unwrap();
    // Taken by the queue (its wr_id cleared), the rest as the device reported it.
    wc
}

/// Takes the next datagram of `u`: its completion and buffer, with the bytes checked.
#[track_caller]
fn received(u: &mut Ud, data: &[u8], from: u32) -> (WorkCompletion, Done<Chunk>) {
    let mut wc = poll_one(&mut u.cq);
    assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
    let got = u.rq.complete(&mut wc).unwrap();
    assert_eq!(got.byte_len as usize, GRH_LEN + data.len(), "byte_len counts the GRH");
    assert!(wc.wc_flags().contains(WcFlags::GRH), "{wc:?}");
    assert_eq!(wc.src_qp(), from, "source QP");
    assert_eq!(&got.value[GRH_LEN..GRH_LEN + data.len()], data, "datagram bytes");
    assert!(got.value[GRH_LEN + data.len()..].iter().all(|&b| b == UNTOUCHED), "bytes past the datagram");
    (wc, got)
}

/// Nothing arrives on `cq` for a while.
#[track_caller]
fn quiet(cq: &mut CompletionQueue, what: &str) {
    let end = Instant::now() + Duration::from_millis(300);
    while Instant::now() < end {
        let mut wc = [WorkCompletion::EMPTY; 2];
        let got = cq.poll(&mut wc).unwrap();
        assert!(got.is_empty(), "{what}: {got:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_receiver_replies_through_an_ah_built_from_the_datagrams_completion_and_the_sender_gets_its_bytes() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (mut a, mut b) = (ud(&pd), ud(&pd));
    post_receives(&pd, &mut a, 2, 512);
    post_receives(&pd, &mut b, 2, 512);

    let a_info = a.qp.local_info(1).unwrap();
    let to_b = AddressHandle::new(&pd, &AhAttr::global(1, b.qp.local_info(1).unwrap().gid, gid_index())).unwrap();
    let ask = random_bytes(1, 300);
    let send_wc = send(&pd, &mut a, &to_b, b.qp.qp_num(), &ask);
    let (wc, got) = received(&mut b, &ask, a.qp.qp_num());

    // The address the datagram came from: A's GID, sent from the GID it arrived on.
    let attr = AhAttr::from_completion(&ctx, 1, &wc, &got.value[..GRH_LEN]).unwrap();
    eprintln!("AhAttr from the completion: {attr:?}");
    match attr.remote {
        Remote::Gid { gid, sgid_index, .. } => {
            assert_eq!(gid, a_info.gid, "the reply goes to the sender's GID");
            assert_eq!(sgid_index, gid_index(), "and leaves from the GID the datagram arrived on");
        }
        other => panic!("a RoCE reply is addressed by GID: {other:?}"),
    }
    let reply_ah = AddressHandle::from_completion(&pd, 1, &wc, &got.value[..GRH_LEN]).unwrap();
    assert_eq!(reply_ah.attr(), &attr);
    let reply = random_bytes(2, 200);
    send(&pd, &mut b, &reply_ah, wc.src_qp(), &reply);
    received(&mut a, &reply, b.qp.qp_num());

    // Misuse is refused before C, naming our method.
    let refused = |r: Result<AhAttr, Error>, want: &str| {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::AhFromCompletion, .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.starts_with("AhAttr::from_completion: invalid argument: ") && text.contains(want), "{text}");
    };
    refused(AhAttr::from_completion(&ctx, 1, &send_wc, &got.value[..GRH_LEN]), "is not a receive");
    refused(AhAttr::from_completion(&ctx, 1, &wc, &got.value[..GRH_LEN - 1]), "grh has 39 bytes");
    refused(AhAttr::from_completion(&ctx, 2, &wc, &got.value[..GRH_LEN]), "port 2 does not exist");
    let e = AddressHandle::from_completion(&pd, 1, &WorkCompletion::EMPTY, &got.value[..GRH_LEN]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { verb: Verb::AhFromCompletion, .. }), "{e:?}");
    quiet(&mut a.cq, "nothing more reaches the sender");
}

/// The IPv4 address of the GID the tests send from (the netdev under the device).
fn local_ipv4(ctx: &rdma_verbs::Context) -> Ipv4Addr {
    ctx.query_gid(1, gid_index()).unwrap().gid.ipv4().expect("the test GID is IPv4-mapped (RoCE v2)")
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn attaching_refuses_a_non_ud_qp_and_a_unicast_gid_before_c_and_attach_detach_round_trips() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let u = ud(&pd);
    let group = Gid(Ipv4Addr::new(239, 1, 2, 4).to_ipv6_mapped().octets());

    let cq = CompletionQueue::new(&ctx, 8).unwrap();
    let rc = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(2).max_recv_wr(2).build().unwrap();
    let e = rc.attach_multicast(group, 0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { verb: Verb::QpAttachMulticast, .. }), "{e:?}");
    assert!(e.to_string().contains("only UD QPs join multicast groups"), "{e}");
    let unicast = ctx.query_gid(1, gid_index()).unwrap().gid;
    let e = u.qp.attach_multicast(unicast, 0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { verb: Verb::QpAttachMulticast, .. }), "{e:?}");
    assert!(e.to_string().contains("is not a multicast GID"), "{e}");

    let ff = Gid("ff0e::1:2:3".parse::<std::net::Ipv6Addr>().unwrap().octets());
    for g in [group, ff] {
        let m = u.qp.attach_multicast(g, 0).unwrap();
        assert_eq!((m.gid(), m.qp_num()), (g, u.qp.qp_num()));
        m.detach().unwrap();
    }
    // Dropped instead of detached: detached all the same, so attaching again works.
    drop(u.qp.attach_multicast(group, 0).unwrap());
    let again = u.qp.attach_multicast(group, 0).unwrap();
    // The membership keeps the QP alive: the QP is destroyed after it detaches.
    let Ud { cq: ucq, sq, rq, qp } = u;
    drop((sq, rq, qp));
    again.detach().unwrap();
    drop((rc, cq, ucq));
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_datagram_to_a_multicast_group_reaches_both_members_and_none_after_they_detach() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let ip = Ipv4Addr::new(239, 1, 2, 3);
    let group = Gid(ip.to_ipv6_mapped().octets());
    // rxe sends a RoCE v2 datagram to an IPv4 group as IP multicast on its netdev; the
    // kernel loops it back to this host only while a socket here is a member of the IP group.
    let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
    sock.join_multicast_v4(&ip, &local_ipv4(&ctx)).unwrap();

    let (mut a, mut b, mut c) = (ud(&pd), ud(&pd), ud(&pd));
    post_receives(&pd, &mut b, 2, 256);
    post_receives(&pd, &mut c, 2, 256);
    let mb = b.qp.attach_multicast(group, 0xc001).unwrap();
    let mc = c.qp.attach_multicast(group, 0xc001).unwrap();
    let ah = AddressHandle::new(&pd, &AhAttr::global(1, group, gid_index())).unwrap();

    let data = random_bytes(3, 200);
    send(&pd, &mut a, &ah, MULTICAST_QPN, &data);
    received(&mut b, &data, a.qp.qp_num());
    received(&mut c, &data, a.qp.qp_num());

    mb.detach().unwrap();
    mc.detach().unwrap();
    send(&pd, &mut a, &ah, MULTICAST_QPN, &random_bytes(4, 200));
    quiet(&mut b.cq, "a detached member received a datagram");
    quiet(&mut c.cq, "a detached member received a datagram");
    assert_eq!((b.rq.outstanding(), c.rq.outstanding()), (1, 1));
    drop(sock);
}
