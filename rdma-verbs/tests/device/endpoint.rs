//! Connecting peers on a real device: QPs brought up by the endpoint handshake over TCP
//! on 127.0.0.1 (one thread per side, each with its own device context), and
//! examples/rc_pingpong against rdma-core's ibv_rc_pingpong (one process per side).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Error, Mtu, ProtectionDomain, QpAccess, QpType, QueuePair,
    WcStatus,
};
use rdma_verbs::{Done, RecvQueue, SendQueue, SendWr};
use rdma_verbs::{Handshake, WireError};

use crate::datapath::{chunks, poll_one};
use crate::{device_name, gid_index, open, LeakCheck};

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed.wrapping_mul(101))).collect()
}

/// Two ends of one TCP connection on 127.0.0.1, each read bounded.
fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    for s in [&a, &b] {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    }
    (a, b)
}

/// Both sides finished with the device before either tears its QP down: a send is
/// complete only once the peer acknowledged it, and a QP destroyed early would leave
/// the peer's acknowledgements or retries unanswered.
fn barrier(tcp: &mut TcpStream) {
    tcp.write_all(b"B").unwrap();
    let mut b = [0u8; 1];
    tcp.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"B");
}

/// Polls the shared CQ until `sends` send completions and `recvs` receives arrived;
/// returns the receives in order, with their completions' immediate data.
fn drain(
    cq: &mut CompletionQueue,
    sq: &mut SendQueue<Chunk>,
    rq: &mut RecvQueue<Chunk>,
    sends: usize,
    recvs: usize,
) -> Vec<(Done<Chunk>, Option<u32>, u32)> {
    let (mut sent, mut got) = (0, Vec::new());
    while sent < sends || got.len() < recvs {
        let mut wc = poll_one(cq);
        assert_eq!(wc.status(), WcStatus::Success, "{:?}", wc.ok().err());
        if wc.opcode().is_recv() {
            got.push((rq.complete(&mut wc).unwrap(), wc.imm_data(), wc.src_qp()));
        } else {
            sq.complete(&mut wc, |d| assert_eq!(d.status, WcStatus::Success)).unwrap();
            sent += 1;
        }
    }
    got
}

/// One RC side: advertises a writable region, SENDs `seed`'s data, WRITEs `seed + 1`'s
/// data into the peer's region and notifies with a SEND with immediate; then checks what
/// the peer (`peer_seed`) sent and wrote. Returns this side's connection.
fn rc_side(mut tcp: TcpStream, seed: u8, peer_seed: u8, mtu: Mtu) -> rdma_verbs::Connection {
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut cq = CompletionQueue::new(&ctx, 64).unwrap();
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(8).max_recv_wr(8).build().unwrap();
    let target = pd
        .register_remote_writable(AlignedBuf::new(4096).unwrap(), AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let hs = Handshake::new(&qp).access(QpAccess::REMOTE_WRITE).advertise(target.remote().unwrap()).max_mtu(mtu);
    hs.init().unwrap();
    let mut rq: RecvQueue<Chunk> = qp.recv_queue().unwrap();
    let mut sq: SendQueue<Chunk> = qp.send_queue().unwrap();
    let mut bufs = chunks(&pd, 5, 4096, AccessFlags::LOCAL_WRITE);
    for (i, c) in bufs.drain(..2).enumerate() {
        rq.post(c, 0..4096, i as u64).unwrap();
    }
    let conn = hs.connect(&mut tcp).unwrap();
    assert_eq!(qp.state().unwrap(), rdma_verbs::QpState::Rts);
    let peer_mr = conn.remote.mr.expect("the peer advertised its region");
    assert_eq!(peer_mr.len, 4096);

    let (mut data, mut written, notify) = (bufs.remove(0), bufs.remove(0), bufs.remove(0));
    data[..3000].copy_from_slice(&pattern(seed, 3000));
    written.copy_from_slice(&pattern(seed.wrapping_add(1), 4096));
    sq.post(SendWr::send(data, 0..3000)).unwrap();
    sq.post(SendWr::write(written, 0..4096, peer_mr)).unwrap();
    // RC delivers in order: the notice arrives after the WRITE has landed.
    sq.post(SendWr::send(notify, 0..0).imm(0xc0ffee)).unwrap();

    let got = drain(&mut cq, &mut sq, &mut rq, 3, 2);
    let (first, _, _) = &got[0];
    assert_eq!(first.byte_len, 3000);
    assert_eq!(&first.value[..3000], &pattern(peer_seed, 3000)[..], "SEND payload");
    assert_eq!((got[1].0.byte_len, got[1].1), (0, Some(0xc0ffee)));
    let mut landed = vec![0u8; 4096];
    target.read_at(0, &mut landed).unwrap();
    assert_eq!(landed, pattern(peer_seed.wrapping_add(1), 4096), "RDMA WRITE payload");
    barrier(&mut tcp);
    conn
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn handshake_connects_rc_qps_over_tcp_and_send_and_write_arrive_intact() {
    let _leaks = LeakCheck::new();
    let (a, b) = tcp_pair();
    // Side B offers a smaller path MTU: both must use it.
    let tb = thread::spawn(move || rc_side(b, 2, 1, Mtu::Mtu512));
    let ca = rc_side(a, 1, 2, Mtu::Mtu4096);
    let cb = tb.join().expect("side B");
    assert_eq!(ca.remote, cb.local);
    assert_eq!(cb.remote, ca.local);
    assert_eq!((ca.path_mtu, cb.path_mtu), (Mtu::Mtu512, Mtu::Mtu512));
    assert_eq!(ca.local.transport, QpType::Rc);
    assert!(!ca.local.gid.is_zero(), "a RoCE endpoint carries its GID");
}

/// One UD side: sends one datagram of `seed`'s data to the peer, checks the peer's.
fn ud_side(mut tcp: TcpStream, seed: u8, peer_seed: u8) -> rdma_verbs::UdPeer {
    const GRH: usize = 40;
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut cq = CompletionQueue::new(&ctx, 256).unwrap();
    let qp = QueuePair::builder(&pd, QpType::Ud, &cq, &cq).max_send_wr(4).max_recv_wr(4).build().unwrap();
    let hs = Handshake::new(&qp).qkey(0x1234_0000 | u32::from(seed));
    hs.init().unwrap();
    let mut rq: RecvQueue<Chunk> = qp.recv_queue().unwrap();
    let mut sq: SendQueue<Chunk> = qp.send_queue().unwrap();
    let mut bufs = chunks(&pd, 2, 4096 + GRH, AccessFlags::LOCAL_WRITE);
    rq.post(bufs.remove(0), 0..4096 + GRH, 7).unwrap();
    let peer = hs.ready_ud(&mut tcp).unwrap();
    assert_eq!(peer.qkey, 0x1234_0000 | u32::from(peer_seed));
    let n = (peer.max_payload() as usize).min(1000);
    assert!(n >= 256, "max payload {}", peer.max_payload());

    let mut src = bufs.remove(0);
    src[..n].copy_from_slice(&pattern(seed, n));
    sq.post(SendWr::send_ud(src, 0..n, &peer.ah, peer.qpn, peer.qkey)).unwrap();
    let got = drain(&mut cq, &mut sq, &mut rq, 1, 1);
    let (d, _, src_qp) = &got[0];
    assert_eq!(d.byte_len as usize, GRH + n, "a UD receive starts with the 40-byte GRH");
    assert_eq!(&d.value[GRH..GRH + n], &pattern(peer_seed, n)[..]);
    assert_eq!(*src_qp, peer.qpn, "the datagram came from the peer's QP");
    barrier(&mut tcp);
    peer
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn handshake_prepares_ud_qps_over_tcp_and_datagrams_arrive_intact() {
    let _leaks = LeakCheck::new();
    let (a, b) = tcp_pair();
    let tb = thread::spawn(move || ud_side(b, 4, 3));
    let pa = ud_side(a, 3, 4);
    let pb = tb.join().expect("side B");
    assert_eq!((pa.remote, pb.remote), (pb.local, pa.local));
    assert_eq!(pa.local.transport, QpType::Ud);
}

fn wire_error(e: &Error) -> &WireError {
    match e {
        Error::Wire { source, .. } => source,
        other => panic!("expected a wire error, got {other}"),
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn handshake_refuses_a_peer_of_another_transport_on_both_sides() {
    let _leaks = LeakCheck::new();
    let (mut a, mut b) = tcp_pair();
    let tb = thread::spawn(move || {
        let ctx = open();
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let cq = CompletionQueue::new(&ctx, 256).unwrap();
        let qp = QueuePair::builder(&pd, QpType::Ud, &cq, &cq).build().unwrap();
        Handshake::new(&qp).ready_ud(&mut b).map(|_| ()).unwrap_err().to_string()
    });
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 256).unwrap();
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).build().unwrap();
    let e = Handshake::new(&qp).connect(&mut a).unwrap_err();
    let text = e.to_string();
    assert!(matches!(wire_error(&e), WireError::Incompatible(_)), "{text}");
    assert!(text.contains("the peer's QP is UD, this one is RC"), "{text}");
    let text_b = tb.join().unwrap();
    assert!(text_b.contains("the peer's QP is RC, this one is UD"), "{text_b}");
    assert_eq!(qp.state().unwrap(), rdma_verbs::QpState::Init, "no transition past INIT");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_side_that_cannot_reach_rts_tells_its_peer_instead_of_leaving_it_waiting() {
    let _leaks = LeakCheck::new();
    let (mut a, mut b) = tcp_pair();
    let tb = thread::spawn(move || {
        let ctx = open();
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let cq = CompletionQueue::new(&ctx, 256).unwrap();
        let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).build().unwrap();
        // Service level 16 does not exist: RTR is refused on this side.
        Handshake::new(&qp).sl(16).connect(&mut b).map(|_| ()).unwrap_err().to_string()
    });
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 256).unwrap();
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).build().unwrap();
    let started = Instant::now();
    let e = Handshake::new(&qp).connect(&mut a).unwrap_err();
    assert_eq!(wire_error(&e), &WireError::PeerFailed, "{e}");
    assert!(started.elapsed() < Duration::from_secs(20), "told at once, not after the read timeout");
    let text_b = tb.join().unwrap();
    assert!(text_b.contains("service level 16"), "{text_b}");
}

// ---- rc_pingpong against rdma-core's ibv_rc_pingpong --------------------------------

const ITERS: &str = "50";
/// Under emulation each process takes seconds to start; a run never takes this long.
const RUN_LIMIT: Duration = Duration::from_secs(180);

/// examples/rc_pingpong, built next to this test binary (target/<profile>/examples).
fn our_pingpong() -> PathBuf {
    crate::example("rc_pingpong")
}

/// A TCP port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// True when something listens on `port` (any address), from /proc/net/tcp{,6}.
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).unwrap_or_default().lines().skip(1).any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
        })
    })
}

fn spawn(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"))
}

/// Waits for the child until `deadline`; kills it then. Returns its output.
fn finish(mut child: Child, deadline: Instant) -> (Output, bool) {
    let mut killed = false;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            killed = true;
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    (child.wait_with_output().unwrap(), killed)
}

fn show(who: &str, out: &Output, killed: bool) -> String {
    format!(
        "--- {who}: {}{}\nstdout:\n{}stderr:\n{}",
        out.status,
        if killed { " (killed: no exit in time)" } else { "" },
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs a server, waits until it listens, runs a client; both must exit 0 and print
/// the two result lines.
fn run_pair(mut server: Command, mut client: Command, port: u16) {
    let deadline = Instant::now() + RUN_LIMIT;
    eprintln!("server: {server:?}");
    let mut srv = spawn(&mut server);
    while !listening(port) {
        if let Some(status) = srv.try_wait().unwrap() {
            let (out, _) = finish(srv, deadline);
            panic!("the server exited ({status}) before listening\n{}", show("server", &out, false));
        }
        if Instant::now() > deadline {
            let (out, killed) = finish(srv, Instant::now());
            panic!("the server did not listen on port {port}\n{}", show("server", &out, killed));
        }
        thread::sleep(Duration::from_millis(50));
    }
    eprintln!("client: {client:?}");
    let cli = spawn(&mut client);
    let (cout, ckilled) = finish(cli, deadline);
    let (sout, skilled) = finish(srv, deadline);
    let report = format!("{}\n{}", show("server", &sout, skilled), show("client", &cout, ckilled));
    eprintln!("{report}");
    assert!(sout.status.success() && cout.status.success(), "a side failed\n{report}");
    for out in [&sout, &cout] {
        let text = String::from_utf8_lossy(&out.stdout);
        let bytes = 4096 * 50 * 2;
        assert!(text.contains(&format!("{bytes} bytes in ")), "no bandwidth line\n{report}");
        assert!(text.contains("50 iters in "), "no latency line\n{report}");
        assert!(text.contains("remote address: LID"), "no remote address line\n{report}");
    }
}

fn rdma_args(port: u16) -> Vec<String> {
    let port = port.to_string();
    let gid = gid_index().to_string();
    ["-d", &device_name(), "-g", &gid, "-p", &port, "-n", ITERS].iter().map(|s| s.to_string()).collect()
}

fn theirs(port: u16) -> Command {
    let mut c = Command::new("ibv_rc_pingpong");
    c.args(rdma_args(port));
    c
}

fn ours(port: u16) -> Command {
    let mut c = Command::new(our_pingpong());
    c.args(rdma_args(port)).args(["--timeout", "60"]);
    c
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn our_rc_pingpong_client_runs_against_ibv_rc_pingpong_server() {
    let _leaks = LeakCheck::new();
    let port = free_port();
    let mut client = ours(port);
    client.arg("127.0.0.1");
    run_pair(theirs(port), client, port);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn ibv_rc_pingpong_client_runs_against_our_rc_pingpong_server() {
    let _leaks = LeakCheck::new();
    let port = free_port();
    let mut client = theirs(port);
    client.arg("127.0.0.1");
    run_pair(ours(port), client, port);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn two_rc_pingpong_processes_connect_through_the_handshake_and_verify_every_message() {
    let _leaks = LeakCheck::new();
    let port = free_port();
    let mut server = ours(port);
    server.arg("--handshake");
    let mut client = ours(port);
    client.args(["--handshake", "127.0.0.1"]);
    run_pair(server, client, port);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn our_rc_pingpong_refuses_a_server_that_speaks_garbage() {
    let _leaks = LeakCheck::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut cmd = ours(port);
    cmd.arg("127.0.0.1");
    let child = spawn(&mut cmd);
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut theirs = [0u8; 52];
    s.read_exact(&mut theirs).unwrap();
    assert_eq!(theirs[51], 0, "a NUL-terminated rdma-core message");
    s.write_all(b"0000:00zz12:000000:00000000000000000000ffff0a630001\0").unwrap();
    let (out, killed) = finish(child, Instant::now() + RUN_LIMIT);
    let report = show("client", &out, killed);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(report.contains("byte 7 of the ibv_*_pingpong message: expected a hex digit"), "{report}");
}
