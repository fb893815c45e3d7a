//! rdma_cm on a real device: connections between threads and between processes, with
//! private data both ways and verified data, each refusal a clear error, and our
//! examples against librdmacm's own `rdma_server` and `rdma_client`.
//!
//! rdma_cm resolves IP addresses: these tests use RDMA_IP, the address of the netdev
//! under the device (scripts/rxe exports it), never 127.0.0.1. Each runs in a process of
//! its own ([`isolated`]): librdmacm keeps the device open until its process exits, so a
//! leak check taken after its first use counts one context more than before it
//! ([`cm_leak_check`] allows for exactly that, and checks it).

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use rdma_verbs::{
    AccessFlags, AddressHandle, Chunk, CompletionQueue, Context, Error, ProtectionDomain, QpState, QpType, QueuePair,
    SendWr, Verb, WcOpcode, WcStatus,
};
use rdma_verbs::{CmEventKind, CmId, ConnParam, EventChannel, PortSpace, RejectReason};
use rdma_verbs::{RecvQueue, SendQueue};

use crate::datapath::{chunks, poll_one};
use crate::{device_name, example, ResourceCounts};

/// The bound on every wait of these tests.
const T: Duration = Duration::from_secs(10);
/// How long a child process may take to start listening: under emulation (TCG) the
/// first start of a large debug binary from the shared folder takes seconds.
const STARTUP: Duration = Duration::from_secs(60);
/// How long a child process may take to do its whole exchange and exit.
const CHILD: Duration = Duration::from_secs(30);

// The child-process harness and the rdma_cm leak check (rdma-test-support).
pub(crate) use rdma_test_support::{bind_an_id_and_drop_it, cm_leak_check, in_own_process, isolated, rdma_ip};

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn librdmacm_keeps_one_device_context_open_from_its_first_use_to_the_end_of_the_process() {
    in_own_process(this_test!(), || {
        // A fresh process: rdma_cm has not run here yet.
        let before = ResourceCounts::now();
        bind_an_id_and_drop_it();
        let after_first = ResourceCounts::now();
        let one_more = ResourceCounts { ctx: before.ctx + 1, ..before };
        assert_eq!(after_first, one_more, "everything dropped, but librdmacm's context stays open");
        // Later use opens no further context: the count stays at ctx + 1.
        bind_an_id_and_drop_it();
        let channel = EventChannel::new().unwrap();
        let (listen, addr) = listener(&channel);
        let id = resolved(&channel, addr);
        drop((id, listen, channel));
        assert_eq!(ResourceCounts::now(), one_more, "later rdma_cm use keeps ctx + 1, and leaks nothing else");
    });
}

pub(crate) fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed)).collect()
}

/// One side of a connection made through rdma_cm: the id, its QP (made through the id)
/// and both of its queues, and registered buffers.
struct Side {
    bufs: Vec<Chunk>,
    sq: SendQueue<Chunk>,
    rq: RecvQueue<Chunk>,
    cq: CompletionQueue,
    qp: QueuePair,
    id: CmId,
}

impl Side {
    fn new(id: CmId) -> Side {
        let ctx = id.context().unwrap();
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let cq = CompletionQueue::new(&ctx, 64).unwrap();
        let qp = id.create_qp(QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(16).max_recv_wr(16)).unwrap();
        assert_eq!(qp.state().unwrap(), QpState::Init, "rdma_create_qp leaves an RC QP in INIT");
        let bufs = chunks(&pd, 4, 4096, AccessFlags::LOCAL_WRITE);
        Side { sq: qp.send_queue().unwrap(), rq: qp.recv_queue().unwrap(), bufs, cq, qp, id }
    }

    fn post_recv(&mut self, id: u64) {
        let buf = self.bufs.pop().expect("a free buffer");
        self.rq.post(buf, 0..4096, id).unwrap();
    }

    fn send(&mut self, data: &[u8]) {
        let mut buf = self.bufs.pop().expect("a free buffer");
        buf[..data.len()].copy_from_slice(data);
        self.sq.post(SendWr::send(buf, 0..data.len())).unwrap();
        let mut wc = poll_one(&mut self.cq);
        let bufs = &mut self.bufs;
        self.sq
            .complete(&mut wc, |d| {
                assert_eq!(d.status, WcStatus::Success);
                bufs.push(d.value);
            })
            .unwrap();
    }

    fn recv(&mut self) -> Vec<u8> {
        let mut wc = poll_one(&mut self.cq);
        assert_eq!(wc.opcode(), WcOpcode::Recv);
        let done = self.rq.complete(&mut wc).unwrap();
        assert_eq!(done.status, WcStatus::Success);
        let data = done.value[..done.byte_len as usize].to_vec();
        self.bufs.push(done.value);
        data
    }
}

/// A listener on RDMA_IP, on a port the kernel picks.
pub(crate) fn listener(channel: &EventChannel) -> (CmId, SocketAddr) {
    let id = CmId::new(channel, PortSpace::Tcp).unwrap();
    id.bind(SocketAddr::new(rdma_ip(), 0)).unwrap();
    id.listen(4).unwrap();
    let addr = id.local_addr().expect("a bound listener has an address");
    assert_eq!(addr.ip(), rdma_ip());
    assert_ne!(addr.port(), 0, "binding to port 0 picks a port");
    (id, addr)
}

/// A client id with its address and route resolved to `server`.
pub(crate) fn resolved(channel: &EventChannel, server: SocketAddr) -> CmId {
    let id = CmId::new(channel, PortSpace::Tcp).unwrap();
    id.resolve_addr(None, server, T).unwrap();
    id.resolve_route(T).unwrap();
    assert_eq!(id.peer_addr(), Some(server));
    assert_eq!(id.port_num(), Some(1));
    id
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn two_threads_connect_with_private_data_both_ways_and_move_verified_data() {
    isolated(this_test!(), || {
        let channel = EventChannel::new().unwrap();
        let (listen, addr) = listener(&channel);
        let (request, reply) = (pattern(1, 3000), pattern(2, 2000));
        let (req2, reply2) = (request.clone(), reply.clone());

        let server = thread::spawn(move || {
            let req = listen.get_request(T).unwrap();
            eprintln!("server: request with {} bytes of private data", req.private_data().len());
            assert!(req.private_data().starts_with(b"client hello"), "{:?}", req.private_data());
            assert_eq!(req.id().peer_addr().map(|a| a.ip()), Some(rdma_ip()));
            assert_eq!(req.id().local_addr(), Some(addr));
            assert!(req.conn().unwrap().qp_num > 1, "the request names the client's QP");
            let mut side = Side::new(req.into_id());
            side.post_recv(1);
            side.id.accept(&ConnParam::new().private_data(b"server welcome"), T).unwrap();
            assert_eq!(side.qp.state().unwrap(), QpState::Rts, "accept brought the QP to RTS");
            assert_eq!(side.recv(), req2, "the client's bytes arrived intact");
            side.send(&reply2);
            let ev = side.id.next_event(T).unwrap();
            assert_eq!(ev.kind(), CmEventKind::Disconnected, "{ev:?}");
            drop(listen);
        });

        // The client on a channel of its own, as another process would have.
        let client_channel = EventChannel::new().unwrap();
        let mut side = Side::new(resolved(&client_channel, addr));
        side.post_recv(1);
        let established = side.id.connect(&ConnParam::new().private_data(b"client hello"), T).unwrap();
        assert_eq!(established.kind(), CmEventKind::Established);
        eprintln!("client: accept with {} bytes of private data", established.private_data().len());
        assert!(established.private_data().starts_with(b"server welcome"), "{:?}", established.private_data());
        assert_eq!(side.qp.state().unwrap(), QpState::Rts);
        side.send(&request);
        assert_eq!(side.recv(), reply, "the server's bytes arrived intact");
        side.id.disconnect().unwrap();
        let ev = side.id.next_event(T).unwrap();
        assert_eq!(ev.kind(), CmEventKind::Disconnected, "the disconnecting side sees the end too: {ev:?}");
        server.join().unwrap();
    });
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn both_sides_on_one_channel_each_get_their_own_events_and_the_peer_sees_the_disconnect() {
    isolated(this_test!(), || {
        // One channel for both threads: whichever reads an event queues it for its id.
        let channel = EventChannel::new().unwrap();
        let (listen, addr) = listener(&channel);
        let (done_tx, done_rx) = mpsc::channel();
        let server = thread::spawn(move || {
            let mut side = Side::new(listen.get_request(T).unwrap().into_id());
            side.post_recv(1);
            side.id.accept(&ConnParam::new(), T).unwrap();
            let ev = side.id.next_event(T).unwrap();
            assert_eq!(ev.kind(), CmEventKind::Disconnected, "the peer's disconnect reached the server: {ev:?}");
            done_tx.send(()).unwrap();
        });
        let mut side = Side::new(resolved(&channel, addr));
        side.post_recv(7);
        side.id.connect(&ConnParam::new(), T).unwrap();
        side.id.disconnect().unwrap();
        // Disconnecting moved our QP to ERR: the posted receive comes back flushed.
        let mut wc = poll_one(&mut side.cq);
        let done = side.rq.complete(&mut wc).unwrap();
        assert_eq!((done.id, done.status), (7, WcStatus::WrFlushErr));
        assert_eq!(side.qp.state().unwrap(), QpState::Err);
        done_rx.recv_timeout(T).expect("the server saw DISCONNECTED");
        let ev = side.id.next_event(T).unwrap();
        assert_eq!(ev.kind(), CmEventKind::Disconnected, "{ev:?}");
        server.join().unwrap();
    });
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn listening_twice_on_one_address_and_port_fails_with_eaddrinuse() {
    isolated(this_test!(), || {
        let channel = EventChannel::new().unwrap();
        let (_first, addr) = listener(&channel);
        let second = CmId::new(&channel, PortSpace::Tcp).unwrap();
        let err = second.bind(addr).and_then(|()| second.listen(4)).unwrap_err();
        eprintln!("{err}");
        assert_eq!(err.errno(), Some(libc::EADDRINUSE), "{err}");
        assert!(err.to_string().contains(&format!("port {}", addr.port())), "the error names the port: {err}");
    });
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn connecting_to_a_port_nobody_listens_on_is_rejected_quickly_as_invalid_service_id() {
    isolated(this_test!(), || {
        let channel = EventChannel::new().unwrap();
        // A port that was free a moment ago, and is free again.
        let (gone, addr) = listener(&channel);
        drop(gone);
        let side = Side::new(resolved(&channel, addr));
        let start = Instant::now();
        let err = side.id.connect(&ConnParam::new(), T).unwrap_err();
        let took = start.elapsed();
        eprintln!("{err} (after {took:?})");
        match &err {
            Error::Rejected { status, verb, .. } => {
                assert_eq!(*verb, Verb::Connect);
                assert_eq!(RejectReason::from_raw(*status), RejectReason::InvalidServiceId, "{err}");
            }
            other => panic!("expected a rejection, got {other}"),
        }
        assert!(err.to_string().contains("nothing listens"), "{err}");
        assert!(took < T, "refused within the bound, not timed out: {took:?}");
    });
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_rejecting_server_gives_the_client_its_reason_and_private_data() {
    isolated(this_test!(), || {
        let channel = EventChannel::new().unwrap();
        let (listen, addr) = listener(&channel);
        let server = thread::spawn(move || {
            let req = listen.get_request(T).unwrap();
            assert!(req.private_data().starts_with(b"let me in"));
            // Too much private data for a REJ is refused before any C call.
            let too_long = [0u8; 149];
            assert!(matches!(req.id().reject(&too_long), Err(Error::InvalidArgument { .. })));
            req.id().reject(b"go away: full").unwrap();
            drop(req);
        });
        let client_channel = EventChannel::new().unwrap();
        let side = Side::new(resolved(&client_channel, addr));
        let err = side.id.connect(&ConnParam::new().private_data(b"let me in"), T).unwrap_err();
        eprintln!("{err}");
        match err {
            Error::Rejected { status, private_data, .. } => {
                assert_eq!(RejectReason::from_raw(status), RejectReason::ConsumerDefined);
                eprintln!("reject private data: {} bytes", private_data.len());
                assert!(private_data.starts_with(b"go away: full"), "{private_data:?}");
            }
            other => panic!("expected a rejection, got {other}"),
        }
        server.join().unwrap();
    });
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn waiting_for_a_request_that_never_comes_times_out_within_its_bound() {
    isolated(this_test!(), || {
        let channel = EventChannel::new().unwrap();
        let (listen, _addr) = listener(&channel);
        assert!(channel.try_next_event().unwrap().is_none(), "nothing pending, and no blocking");
        let start = Instant::now();
        let err = listen.get_request(Duration::from_millis(300)).unwrap_err();
        let took = start.elapsed();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(3), "{took:?}");
    });
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn create_qp_refuses_a_foreign_pd_a_wrong_qp_type_and_a_second_qp() {
    isolated(this_test!(), || {
        let channel = EventChannel::new().unwrap();
        let (_listen, addr) = listener(&channel);
        let id = resolved(&channel, addr);
        let ctx = id.context().unwrap();
        let pd = ProtectionDomain::new(&ctx).unwrap();
        // Room for the default depths (128 + 128), which building the QP checks.
        let cq = CompletionQueue::new(&ctx, 256).unwrap();
        // A context we opened ourselves is another ibv_context than librdmacm's.
        let own = Context::open(Some(&device_name())).unwrap();
        let own_pd = ProtectionDomain::new(&own).unwrap();
        let own_cq = CompletionQueue::new(&own, 256).unwrap();
        let err = id.create_qp(QueuePair::builder(&own_pd, QpType::Rc, &own_cq, &own_cq)).unwrap_err();
        assert!(err.to_string().contains("another device context"), "{err}");
        let err = id.create_qp(QueuePair::builder(&pd, QpType::Ud, &cq, &cq)).unwrap_err();
        assert!(err.to_string().contains("connects RC QPs"), "{err}");
        let qp = id.create_qp(QueuePair::builder(&pd, QpType::Rc, &cq, &cq)).unwrap();
        let err = id.create_qp(QueuePair::builder(&pd, QpType::Rc, &cq, &cq)).unwrap_err();
        assert!(err.to_string().contains("one QP per id"), "{err}");
        // Too much private data for a REQ: refused before any C call, the QP untouched.
        let err = id.connect(&ConnParam::new().private_data(&[1; 57]), T).unwrap_err();
        assert!(err.to_string().contains("exceed the 56"), "{err}");
        assert_eq!(qp.state().unwrap(), QpState::Init);
        // The id is held by its QP and by its context: destroy says so instead of freeing it.
        drop((qp, cq, pd));
        let err = id.destroy().unwrap_err();
        assert_eq!(err.errno(), Some(libc::EBUSY), "{err}");
        drop(ctx);
    });
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_udp_id_learns_the_peers_qp_number_qkey_and_address_and_a_datagram_arrives() {
    isolated(this_test!(), || {
        let channel = EventChannel::new().unwrap();
        let listen = CmId::new(&channel, PortSpace::Udp).unwrap();
        listen.bind(SocketAddr::new(rdma_ip(), 0)).unwrap();
        listen.listen(4).unwrap();
        let addr = listen.local_addr().unwrap();
        let payload = pattern(5, 512);
        let expected = payload.clone();
        let server = thread::spawn(move || {
            let req = listen.get_request(T).unwrap();
            eprintln!("UD request with {} bytes of private data", req.private_data().len());
            assert!(req.private_data().starts_with(b"ud hello"), "{:?}", req.private_data());
            let id = req.into_id();
            let ctx = id.context().unwrap();
            let pd = ProtectionDomain::new(&ctx).unwrap();
            let mut cq = CompletionQueue::new(&ctx, 16).unwrap();
            // 8 + 8 work requests: the CQ holds both queues' completions.
            let qp = id.create_qp(QueuePair::builder(&pd, QpType::Ud, &cq, &cq).max_send_wr(8).max_recv_wr(8)).unwrap();
            assert_eq!(qp.state().unwrap(), QpState::Rts, "rdma_create_qp brings a UD QP to RTS");
            let mut rq: RecvQueue<Chunk> = qp.recv_queue().unwrap();
            let buf = chunks(&pd, 1, 4096, AccessFlags::LOCAL_WRITE).pop().unwrap();
            rq.post(buf, 0..4096, 1).unwrap();
            // A UD accept answers the request and returns: there is no ESTABLISHED here.
            id.accept(&ConnParam::new().private_data(b"ud welcome"), T).unwrap();
            let mut wc = poll_one(&mut cq);
            let done = rq.complete(&mut wc).unwrap();
            assert_eq!(done.status, WcStatus::Success);
            // A UD receive starts with the 40-byte global route header.
            assert_eq!(done.byte_len as usize, 40 + expected.len());
            assert_eq!(&done.value[40..40 + expected.len()], &expected[..], "the datagram arrived intact");
        });
        let client_channel = EventChannel::new().unwrap();
        let id = CmId::new(&client_channel, PortSpace::Udp).unwrap();
        id.resolve_addr(None, addr, T).unwrap();
        id.resolve_route(T).unwrap();
        let ctx = id.context().unwrap();
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let mut cq = CompletionQueue::new(&ctx, 16).unwrap();
        let qp = id.create_qp(QueuePair::builder(&pd, QpType::Ud, &cq, &cq).max_send_wr(8).max_recv_wr(8)).unwrap();
        let est = id.connect(&ConnParam::new().private_data(b"ud hello"), T).unwrap();
        assert_eq!(est.kind(), CmEventKind::Established);
        assert!(est.private_data().starts_with(b"ud welcome"), "{:?}", est.private_data());
        let peer = est.ud().expect("a UD ESTABLISHED event says how to reach the peer");
        eprintln!("UD peer: {peer:?}");
        assert!(peer.qp_num > 1 && peer.qkey != 0, "{peer:?}");
        let ah = AddressHandle::new(&pd, &peer.ah).unwrap();
        let mut sq: SendQueue<Chunk> = qp.send_queue().unwrap();
        let mut src = chunks(&pd, 1, 4096, AccessFlags::LOCAL_WRITE).pop().unwrap();
        src[..payload.len()].copy_from_slice(&payload);
        sq.post(SendWr::send_ud(src, 0..payload.len(), &ah, peer.qp_num, peer.qkey)).unwrap();
        let mut wc = poll_one(&mut cq);
        sq.complete(&mut wc, |d| assert_eq!(d.status, WcStatus::Success)).unwrap();
        server.join().unwrap();
    });
}

// ---- processes: our examples and librdmacm's -----------------------------------------

/// One of librdmacm's example programs (Debian: rdmacm-utils).
fn librdmacm_tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(name))
        .find(|p| p.exists());
    path.unwrap_or_else(|| panic!("{name} is not installed: install rdmacm-utils"))
}

/// A child process whose stdout lines arrive on a channel as they come.
struct Proc {
    name: String,
    child: Child,
    lines: mpsc::Receiver<String>,
    out: Vec<String>,
}

// A test that fails halfway must not leave a server behind: its PD, context and CM id
// would fail the next tests' leak checks.
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn spawn(path: &PathBuf, args: &[&str]) -> Proc {
        let mut child = Command::new(path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", path.display()));
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let name = format!("{} {}", path.file_name().unwrap().to_string_lossy(), args.join(" "));
        Proc { name, child, lines, out: Vec::new() }
    }

    /// Waits until a stdout line starts with `prefix`, at most `timeout`.
    fn wait_line(&mut self, prefix: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.starts_with(prefix);
                    self.out.push(line);
                    if hit {
                        return;
                    }
                }
                Err(_) => break,
            }
        }
        let report = self.kill();
        panic!("{}: no line {prefix:?} within {timeout:?}\n{report}", self.name);
    }

    /// Waits for the exit, at most `timeout`; killed and reported after that.
    fn finish(mut self, timeout: Duration) -> (ExitStatus, String) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status, self.output());
            }
            if Instant::now() > deadline {
                let report = self.kill();
                panic!("{} did not finish within {timeout:?}\n{report}", self.name);
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn kill(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.output()
    }

    /// Everything it printed so far (stdout, then stderr).
    fn output(&mut self) -> String {
        self.out.extend(self.lines.try_iter());
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        format!("--- {} stdout:\n{}\n--- stderr:\n{err}", self.name, self.out.join("\n"))
    }
}

/// Runs a client against a server that may not listen yet: retried while the server
/// runs, each run bounded.
fn run_client_until_served(server: &mut Proc, client: &PathBuf, args: &[&str]) -> String {
    let deadline = Instant::now() + STARTUP;
    loop {
        let (status, out) = Proc::spawn(client, args).finish(CHILD);
        if status.success() {
            return out;
        }
        eprintln!("client attempt failed ({status}), retrying:\n{out}");
        assert!(server.is_running(), "the server exited before serving the client\n{}", server.output());
        assert!(Instant::now() < deadline, "the client never got through\n{out}\n{}", server.kill());
        thread::sleep(Duration::from_millis(300));
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn our_rdma_client_talks_to_librdmacm_rdma_server() {
    isolated(this_test!(), || {
        let ip = rdma_ip().to_string();
        // It prints nothing we could wait for (its stdout is block-buffered into our pipe until
        // it exits): the client retries until the server listens.
        let mut server = Proc::spawn(&librdmacm_tool("rdma_server"), &["-s", &ip, "-p", "7481"]);
        let out = run_client_until_served(&mut server, &example("rdma_client"), &["-s", &ip, "-p", "7481", "-t", "10"]);
        eprintln!("{out}");
        assert!(out.contains("rdma_client: received 16 bytes"), "{out}");
        assert!(out.contains("rdma_client: end 0"), "{out}");
        let (status, sout) = server.finish(CHILD);
        eprintln!("{sout}");
        assert!(status.success(), "librdmacm's rdma_server failed: {status}\n{sout}");
        assert!(sout.contains("rdma_server: end 0"), "{sout}");
    });
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn librdmacm_rdma_client_talks_to_our_rdma_server() {
    isolated(this_test!(), || {
        let ip = rdma_ip().to_string();
        let mut server = Proc::spawn(&example("rdma_server"), &["-s", &ip, "-p", "7482", "-t", "20"]);
        server.wait_line("rdma_server: listening on", STARTUP);
        let (status, cout) = Proc::spawn(&librdmacm_tool("rdma_client"), &["-s", &ip, "-p", "7482"]).finish(CHILD);
        eprintln!("{cout}");
        assert!(status.success(), "librdmacm's rdma_client failed: {status}\n{cout}\n{}", server.kill());
        assert!(cout.contains("rdma_client: end 0"), "{cout}");
        let (status, sout) = server.finish(CHILD);
        eprintln!("{sout}");
        assert!(status.success(), "our rdma_server failed: {status}\n{sout}");
        // librdmacm's client sends 16 zero bytes.
        assert!(sout.contains(&format!("rdma_server: received 16 bytes: {:02x?}", [0u8; 16])), "{sout}");
        assert!(sout.contains("rdma_server: end 0"), "{sout}");
    });
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn our_rdma_client_and_server_as_two_processes_echo_verified_bytes() {
    isolated(this_test!(), || {
        let ip = rdma_ip().to_string();
        let mut server = Proc::spawn(&example("rdma_server"), &["-s", &ip, "-p", "7483", "-t", "20"]);
        server.wait_line("rdma_server: listening on", STARTUP);
        // -v: the client checks that the reply is its own message, echoed.
        let (status, cout) =
            Proc::spawn(&example("rdma_client"), &["-s", &ip, "-p", "7483", "-t", "10", "-v"]).finish(CHILD);
        eprintln!("{cout}");
        assert!(status.success(), "our rdma_client failed: {status}\n{cout}\n{}", server.kill());
        let echoed = format!("rdma_client: received 16 bytes: {:02x?}", b"rdma-verbs: ping");
        assert!(cout.contains(&echoed), "{cout}");
        let (status, sout) = server.finish(CHILD);
        eprintln!("{sout}");
        assert!(status.success() && sout.contains("rdma_server: end 0"), "{status}\n{sout}");
    });
}

// ---- multicast through rdma_cm --------------------------------------------------------

/// A UD id bound to the test bed's address, with its own PD, CQ and UD QP (which
/// `create_qp` brings to RTS), and `n` receives of 512 bytes posted.
struct McMember {
    id: CmId,
    cq: CompletionQueue,
    qp: QueuePair,
    rq: RecvQueue<Chunk>,
    pd: ProtectionDomain,
}

fn mc_member(channel: &EventChannel, n: usize) -> McMember {
    let id = CmId::new(channel, PortSpace::Udp).unwrap();
    id.bind(SocketAddr::new(rdma_ip(), 0)).unwrap();
    let ctx = id.context().unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 32).unwrap();
    let qp = id.create_qp(QueuePair::builder(&pd, QpType::Ud, &cq, &cq).max_send_wr(8).max_recv_wr(8)).unwrap();
    let mut rq: RecvQueue<Chunk> = qp.recv_queue().unwrap();
    if n > 0 {
        for (i, c) in chunks(&pd, n, 512, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
            rq.post(c, 0..512, i as u64).unwrap();
        }
    }
    McMember { id, cq, qp, rq, pd }
}

/// No completion arrives on `cq` within half a second.
pub(crate) fn mc_quiet(cq: &mut CompletionQueue, why: &str) {
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut wc = [rdma_verbs::WorkCompletion::EMPTY; 2];
    while Instant::now() < deadline {
        assert!(cq.poll(&mut wc).unwrap().is_empty(), "{why}");
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn rdma_cm_joins_a_multicast_group_every_member_gets_the_datagram_and_none_after_they_leave() {
    isolated(this_test!(), || {
        let group: std::net::IpAddr = std::net::Ipv4Addr::new(239, 1, 2, 5).into();
        let channel = EventChannel::new().unwrap();
        let (mut b, mut c) = (mc_member(&channel, 2), mc_member(&channel, 2));
        let joined = b.id.join_multicast(group, T).unwrap();
        let joined_c = c.id.join_multicast(group, T).unwrap();
        eprintln!("joined {group}: {joined:?}");
        assert_eq!(joined.qp_num, rdma_verbs::MULTICAST_QPN, "a group is sent to at the multicast QP number");
        assert_eq!(joined.qkey, joined_c.qkey, "one group, one Q_Key");

        // The sender has not joined: it sends to the group's address with its Q_Key.
        let mut a = mc_member(&channel, 0);
        let ah = AddressHandle::new(&a.pd, &joined.ah).unwrap();
        let mut sq: SendQueue<Chunk> = a.qp.send_queue().unwrap();
        let send = |sq: &mut SendQueue<Chunk>, a: &mut McMember, data: &[u8]| {
            let mut src = chunks(&a.pd, 1, 512, AccessFlags::LOCAL_WRITE).pop().unwrap();
            src[..data.len()].copy_from_slice(data);
            if let Err(r) = sq.post(SendWr::send_ud(src, 0..data.len(), &ah, joined.qp_num, joined.qkey)) {
                panic!("{}", r.error);
            }
            let mut wc = poll_one(&mut a.cq);
            sq.complete(&mut wc, |d| assert_eq!(d.status, WcStatus::Success)).unwrap();
        };
        let data = pattern(9, 300);
        send(&mut sq, &mut a, &data);
        for (name, m) in [("b", &mut b), ("c", &mut c)] {
            let mut wc = poll_one(&mut m.cq);
            assert_eq!(wc.opcode(), WcOpcode::Recv);
            assert_eq!(wc.src_qp(), a.qp.qp_num(), "member {name}: the datagram names its sender");
            let done = m.rq.complete(&mut wc).unwrap().result().unwrap();
            assert_eq!(done.byte_len as usize, 40 + data.len(), "member {name}: GRH and payload");
            assert_eq!(&done.value[40..40 + data.len()], &data[..], "member {name}: the bytes sent");
        }

        b.id.leave_multicast(group).unwrap();
        c.id.leave_multicast(group).unwrap();
        let e = b.id.leave_multicast(group).unwrap_err();
        assert!(matches!(e, Error::Verb { verb: Verb::LeaveMulticast, .. }), "leaving twice: {e:?}");
        send(&mut sq, &mut a, &pattern(10, 300));
        mc_quiet(&mut b.cq, "a member that left received a datagram");
        mc_quiet(&mut c.cq, "a member that left received a datagram");
        assert_eq!((b.rq.outstanding(), c.rq.outstanding()), (1, 1));

        // Refused before C: a connected id, an address that is not multicast.
        let tcp = CmId::new(&channel, PortSpace::Tcp).unwrap();
        let e = tcp.join_multicast(group, T).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::JoinMulticast, .. }), "{e:?}");
        let e = b.id.join_multicast(rdma_ip(), T).unwrap_err();
        assert!(e.to_string().contains("not a multicast address"), "{e}");
    });
}
