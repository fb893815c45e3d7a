//! Peer faults on a real device: a peer process killed in the middle of a transfer, a
//! peer process holding an rdma_cm connection killed, and the link under the device
//! deleted while QPs are active. Each test states the bound it checks.
//!
//! The peers are processes: this test binary re-executes itself for one test with
//! `RDMA_VERBS_FAULTS_ROLE` naming the part it plays ([`Peer`]); they talk over their
//! standard input and output, one line per message. A peer's output is shown indented,
//! so that its own lines are not taken for this binary's.
//!
//! What `cm.rs` already covers and is not repeated here: a peer *thread* that calls
//! `rdma_disconnect` is seen as `DISCONNECTED` by the other side (on its own channel and
//! on a shared one), and the disconnecting side's posted receives come back flushed.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use rdma_verbs::{
    AccessFlags, AlignedBuf, AsyncEventKind, AsyncEvents, Chunk, CompletionQueue, Context, EventSource, InitAttr,
    PortState, ProtectionDomain, QpAccess, QpState, QpType, QueuePair, Remote, RemoteMr, RemoteQpInfo, RtrAttr,
    RtsAttr, WcStatus, WorkCompletion,
};
use rdma_verbs::{CmEventKind, CmId, ConnParam, EventChannel, PortSpace};
use rdma_verbs::{RecvQueue, SendQueue, SendWr};

use crate::cm::{cm_leak_check, rdma_ip};
use crate::datapath::{chunks, poll_one};
use crate::{open, LeakCheck, ResourceCounts};

/// Which part a re-executed test binary plays.
const ROLE: &str = "RDMA_VERBS_FAULTS_ROLE";
/// How long a peer process may take to start and answer: under emulation (TCG) the first
/// start of a large debug binary from the shared folder takes seconds.
const STARTUP: Duration = Duration::from_secs(60);

/// The part this process plays in `test`, when it is a re-executed peer.
pub(crate) fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// Another process of this test binary, running one test in the part `role`: its stdout
/// lines arrive on a channel (and are echoed indented), its stdin takes our lines. It is
/// killed and reaped when dropped.
pub(crate) struct Peer {
    role: String,
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Peer {
    fn spawn(test: &str, role: &str, env: &[(&str, String)]) -> Peer {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--include-ignored", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the test binary as a peer");
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let name = role.to_owned();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("    | {name}: {line}");
                let _ = tx.send(line);
            }
        });
        let name = role.to_owned();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("    | {name}: {line}");
            }
        });
        let stdin = child.stdin.take().unwrap();
        Peer { role: role.to_owned(), child, stdin, lines }
    }

    /// The rest of the first line that starts with `tag`, at most `timeout` from now.
    fn expect(&mut self, tag: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                // libtest prints "test <name> ... " without a newline before the test's
                // own output: the tag may come after it.
                Ok(line) => {
                    if let Some(at) = line.find(tag) {
                        return line[at + tag.len()..].trim().to_owned();
                    }
                }
                Err(_) => {
                    let status = self.child.try_wait().ok().flatten();
                    panic!("{}: no {tag:?} line within {timeout:?} (exit status: {status:?})", self.role);
                }
            }
        }
    }

    fn say(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").and_then(|()| self.stdin.flush()).expect("write to the peer's stdin");
    }

    /// SIGKILL, then reap: when this returns the process is gone, and the kernel has
    /// closed its files (and with them destroyed its QPs and CM ids).
    pub(crate) fn kill(&mut self) {
        self.child.kill().expect("SIGKILL the peer");
        let status = self.child.wait().expect("reap the peer");
        eprintln!("{}: {status}", self.role);
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Blocks until the parent writes a line starting with `tag` (or goes away: then this
/// process has nothing left to do).
fn read_parent(tag: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        let n = std::io::stdin().read_line(&mut line).expect("read the parent's line");
        assert!(n > 0, "the parent closed our stdin before saying {tag:?}");
        if let Some(rest) = line.strip_prefix(tag) {
            return rest.trim().to_owned();
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex from a peer: anything malformed is an error that says what came.
fn unhex<const N: usize>(text: &str) -> Result<[u8; N], String> {
    let bytes = (0..text.len())
        .step_by(2)
        .map(|i| text.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(|| format!("not hex: {text:?}"))?;
    bytes.try_into().map_err(|b: Vec<u8>| format!("{} bytes, expected {N}: {text:?}", b.len()))
}

// ---- a peer process killed in the middle of a transfer ----------------------------------

/// ACK timeout code of the surviving QP: 4.096 us * 2^12 = 16.8 ms per try.
const TIMEOUT: u8 = 12;
/// Retries after a timeout before the request fails.
const RETRY_CNT: u8 = 3;
/// Requests kept outstanding; the size of each WRITE and of each SEND.
const DEPTH: usize = 96;
const MSG: usize = 32 << 10;
pub(crate) const SEND_LEN: usize = 4096;
/// Receives the peer posts. Once they are used, the next SEND meets an empty receive
/// queue and waits (receiver not ready, retried for as long as the peer lives:
/// `rnr_retry` 7) with the rest of the queue behind it: a slow consumer. The kill lands
/// in that state, so every request from that SEND on is in flight when the peer dies, on
/// any machine however fast. (Without the stall, rxe moved the whole queue before the
/// SIGKILL took effect: ~60-130 ms to kill and reap in the VM.)
pub(crate) const PEER_RECVS: usize = 32;
/// Requests that succeed before the stall: the WRITEs and SENDs up to the first SEND
/// without a receive (even ids are WRITEs, odd ids SENDs).
const STALL_AT: u64 = 2 * PEER_RECVS as u64 + 1;
/// Room for the emulated test bed (TCG): each retry resends everything outstanding, at a
/// few MiB/s, and the scheduling of a 2-CPU guest adds its own delays.
const TCG_MARGIN: Duration = Duration::from_secs(20);

const INFO: &str = "peer-info:";
const READY: &str = "peer-ready";

/// The peer: one RC QP with receives posted and a remote-writable region, connected to
/// the parent's QP; then it waits to be killed.
pub(crate) fn qp_peer() {
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, PEER_RECVS as u32 + 16).unwrap();
    let qp =
        QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(4).max_recv_wr(PEER_RECVS as u32).build().unwrap();
    let mut rq: RecvQueue<Chunk> = qp.recv_queue().unwrap();
    let target = pd
        .register_remote_writable(AlignedBuf::new(MSG).unwrap(), AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let me = qp.local_info(1).unwrap();
    println!("{INFO} {} {}", hex(&me.to_bytes()), hex(&target.remote().unwrap().to_bytes()));
    let them = unhex::<{ RemoteQpInfo::WIRE_LEN }>(&read_parent(INFO)).unwrap_or_else(|e| panic!("parent's info: {e}"));
    let init = InitAttr { access: QpAccess::REMOTE_WRITE, ..InitAttr::default() };
    let them = RemoteQpInfo::from_bytes(&them).unwrap_or_else(|e| panic!("parent's QP: {e}"));
    qp.connect(&init, &them).unwrap();
    // Receives need a QP out of RESET; the parent sends nothing before READY.
    for buf in chunks(&pd, PEER_RECVS, SEND_LEN, AccessFlags::LOCAL_WRITE) {
        rq.post(buf, 0..SEND_LEN, 0).unwrap();
    }
    println!("{READY}");
    // Killed while blocked here; if the parent goes away instead, stdin ends and so do we.
    let _ = read_parent("never");
    drop((rq, qp, cq, target, pd));
}

/// One finished request, as the survivor saw it.
struct Seen {
    id: u64,
    status: WcStatus,
    at: Instant,
}

/// The survivor's side of the transfer: requests kept outstanding, buffers that came back,
/// and every completion in the order it came.
struct Stream {
    sq: SendQueue<Chunk>,
    cq: CompletionQueue,
    free: Vec<Chunk>,
    remote: RemoteMr,
    next_id: u64,
    seen: Vec<Seen>,
}

impl Stream {
    /// Posts every free buffer: even ids WRITE `MSG` bytes into the peer's region, odd
    /// ids SEND `SEND_LEN` bytes to its receives. Returns how many were posted.
    fn refill(&mut self) -> usize {
        let mut n = 0;
        while let Some(buf) = self.free.pop() {
            let id = self.next_id;
            let wr = if id % 2 == 0 { SendWr::write(buf, 0..MSG, self.remote) } else { SendWr::send(buf, 0..SEND_LEN) };
            self.sq.post(wr.id(id)).unwrap();
            self.next_id += 1;
            n += 1;
        }
        n
    }

    /// Takes what completed, giving the buffers back to the free list.
    fn poll(&mut self) {
        let mut wc = [WorkCompletion::EMPTY; 32];
        let at = Instant::now();
        let (seen, free) = (&mut self.seen, &mut self.free);
        for w in self.cq.poll(&mut wc).unwrap() {
            self.sq
                .complete(w, |d| {
                    seen.push(Seen { id: d.id, status: d.status, at });
                    free.push(d.value);
                })
                .unwrap();
        }
    }
}

/// Starts a [`qp_peer`] process for `test` (which must call `qp_peer` when [`role`] is
/// `"qp-peer"`) and connects `qp` to it by hand, with the small [`TIMEOUT`] and
/// [`RETRY_CNT`] (so a dead peer fails requests within [`failure_bound`]) and
/// `rnr_retry` 7. Returns the peer, ready, and its remote-writable region.
pub(crate) fn qp_peer_connected(test: &str, ctx: &Context, qp: &QueuePair) -> (Peer, RemoteMr) {
    let mut peer = Peer::spawn(test, "qp-peer", &[]);
    let info = peer.expect(INFO, STARTUP);
    let (them, remote) = info.split_once(' ').unwrap_or_else(|| panic!("peer's info line: {info:?}"));
    let them = RemoteQpInfo::from_bytes(&unhex(them).unwrap_or_else(|e| panic!("peer's QP: {e}")))
        .unwrap_or_else(|e| panic!("peer's QP: {e}"));
    let remote = RemoteMr::from_bytes(&unhex::<{ RemoteMr::WIRE_LEN }>(remote).unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("peer's region: {e}"));
    assert!(remote.len >= MSG as u64, "the peer's region holds one message: {remote:?}");

    // INIT, RTR and RTS by hand: RTS takes the small timeout and retry count.
    let me = qp.local_info(1).unwrap();
    qp.to_init(&InitAttr::default()).unwrap();
    let sgid = ctx.default_gid(1).unwrap().index;
    qp.to_rtr(&RtrAttr::new(Remote::gid(them.gid, sgid), them.qpn, them.psn)).unwrap();
    let rts = RtsAttr { sq_psn: me.psn, timeout: TIMEOUT, retry_cnt: RETRY_CNT, rnr_retry: 7, ..RtsAttr::default() };
    qp.to_rts(&rts).unwrap();
    let attrs = qp.query().unwrap();
    assert_eq!((attrs.timeout, attrs.retry_cnt), (TIMEOUT, RETRY_CNT), "the QP holds the asked timeout and retries");
    peer.say(&format!("{INFO} {}", hex(&me.to_bytes())));
    peer.expect(READY, STARTUP);
    (peer, remote)
}

/// Bound on the time from the SIGKILL to the last error completion: the requester gives
/// up after `RETRY_CNT + 1` ACK timeouts of 4.096 us * 2^`TIMEOUT` each, then flushes the
/// rest at once; plus the emulation margin (which also covers the process's exit).
pub(crate) fn failure_bound() -> (Duration, Duration) {
    let one = Duration::from_nanos(4096 << TIMEOUT);
    let nominal = one * (u32::from(RETRY_CNT) + 1);
    (nominal, nominal + TCG_MARGIN)
}

/// A peer process with a connected RC QP is SIGKILLed while 96 WRITEs and SENDs are in
/// flight towards it. Every one of them comes back exactly once, in posting order, with its
/// buffer: the first as `RETRY_EXC_ERR`, the rest as `WR_FLUSH_ERR`, none as a success
/// after the error. Bound: the last one within (`retry_cnt` + 1) x 4.096 us x 2^`timeout`
/// (4 x 16.8 ms here) plus [`TCG_MARGIN`] of the SIGKILL. Then everything drops and the
/// leak check passes.
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn peer_killed_mid_transfer_fails_every_outstanding_request_exactly_once_within_the_retry_bound() {
    if role().as_deref() == Some("qp-peer") {
        return qp_peer();
    }
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 2 * DEPTH as u32).unwrap();
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(DEPTH as u32).max_recv_wr(1).build().unwrap();
    let sq: SendQueue<Chunk> = qp.send_queue().unwrap();

    let (mut peer, remote) = qp_peer_connected(this_test!(), &ctx, &qp);

    let free = chunks(&pd, DEPTH, MSG, AccessFlags::LOCAL_WRITE);
    let mut st = Stream { sq, cq, free, remote, next_id: 0, seen: Vec::new() };

    // The transfer runs, the queue kept full, until it stalls on the peer's empty
    // receive queue: everything before the stalled SEND succeeded.
    let start = Instant::now();
    while st.seen.len() < STALL_AT as usize {
        st.refill();
        st.poll();
        assert!(start.elapsed() < STARTUP, "only {} of {STALL_AT} requests finished in {STARTUP:?}", st.seen.len());
    }
    assert!(st.seen.iter().all(|s| s.status == WcStatus::Success), "a request failed before the kill");
    thread::sleep(Duration::from_millis(100));
    st.poll();
    assert_eq!(st.seen.len() as u64, STALL_AT, "the stream waits on the SEND without a receive");

    // Full queue, then the kill: the peer's QP dies with every request from the stalled
    // SEND on in flight.
    st.refill();
    let posted = st.next_id;
    let outstanding = st.sq.outstanding();
    let killed = Instant::now();
    peer.kill();
    let dead = Instant::now();
    eprintln!("{outstanding} requests outstanding; SIGKILL and reap took {:?}", dead - killed);

    let (nominal, bound) = failure_bound();
    while st.seen.len() < posted as usize {
        st.poll();
        assert!(
            killed.elapsed() < bound,
            "{} of {posted} requests came back within {bound:?} of the SIGKILL",
            st.seen.len()
        );
        std::hint::spin_loop();
    }
    let Stream { sq, mut cq, free, seen, .. } = st;
    let last = seen.last().map(|s| s.at).unwrap();

    // Every request once, in posting order.
    let ids: Vec<u64> = seen.iter().map(|s| s.id).collect();
    assert_eq!(ids, (0..posted).collect::<Vec<_>>(), "every request came back exactly once, in order");
    // Successes up to the stall, one RETRY_EXC_ERR (the stalled SEND, resent until the
    // ACK timeouts ran out), then only flushes: none missing, none twice, none successful
    // after the error.
    let first_err = seen.iter().position(|s| s.status != WcStatus::Success).expect("no request failed");
    assert_eq!(first_err as u64, STALL_AT, "the first failure is the stalled SEND");
    assert_eq!(seen[first_err].status, WcStatus::RetryExcErr, "the first failure is the exhausted retries");
    let flushed = seen[first_err + 1..].iter().filter(|s| s.status == WcStatus::WrFlushErr).count();
    assert_eq!(flushed, seen.len() - first_err - 1, "after the first failure, every request is flushed");
    assert_eq!(flushed + 1, outstanding, "every request outstanding at the kill failed");
    let err_at = seen[first_err].at;
    eprintln!(
        "{first_err} succeeded, 1 RETRY_EXC_ERR, {flushed} WR_FLUSH_ERR; retry exceeded {:?} after the SIGKILL \
         ({:?} after the reap), the last flush {:?} after the SIGKILL (nominal {nominal:?} = {} x 4.096 us x \
         2^{TIMEOUT}; bound {bound:?})",
        err_at - killed,
        err_at.saturating_duration_since(dead),
        last - killed,
        RETRY_CNT + 1
    );
    assert!(last - killed < bound);

    // Nothing comes twice, every buffer is back, the QP is in ERR; then everything drops.
    thread::sleep(Duration::from_millis(200));
    let mut wc = [WorkCompletion::EMPTY; 4];
    assert!(cq.poll(&mut wc).unwrap().is_empty(), "no completion after the last one");
    assert_eq!((sq.outstanding(), free.len()), (0, DEPTH), "every buffer came back with its completion");
    assert_eq!(qp.state().unwrap(), QpState::Err);
    drop((sq, qp, cq, free, pd, ctx));
}

// ---- a peer process holding an rdma_cm connection killed --------------------------------

/// From the SIGKILL to the survivor's DISCONNECTED: the kernel destroys the dead
/// process's CM id when it closes its files, and that sends a DREQ at once; the rest is
/// the emulation margin.
const CM_BOUND: Duration = Duration::from_secs(10);
const CM_ADDR: &str = "RDMA_VERBS_FAULTS_CM_ADDR";
const CONNECTED: &str = "peer-connected";

/// The peer: connects to the survivor, says so, and waits to be killed.
fn cm_peer() {
    let addr: SocketAddr = std::env::var(CM_ADDR).ok().and_then(|a| a.parse().ok()).expect("the survivor's address");
    let channel = EventChannel::new().unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    id.resolve_addr(None, addr, CM_BOUND).unwrap();
    id.resolve_route(CM_BOUND).unwrap();
    let ctx = id.context().unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    let qp = id.create_qp(QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(4).max_recv_wr(4)).unwrap();
    let established = id.connect(&ConnParam::new(), CM_BOUND).unwrap();
    assert_eq!(established.kind(), CmEventKind::Established);
    println!("{CONNECTED}");
    let _ = read_parent("never");
    drop((qp, cq, pd, ctx, id));
}

/// The survivor, in a process of its own (librdmacm must not open the device in the
/// process that runs the other tests: see cm.rs).
fn cm_survivor(test: &str) {
    let _leaks = cm_leak_check();
    let channel = EventChannel::new().unwrap();
    let listen = CmId::new(&channel, PortSpace::Tcp).unwrap();
    listen.bind(SocketAddr::new(rdma_ip(), 0)).unwrap();
    listen.listen(1).unwrap();
    let addr = listen.local_addr().expect("a bound listener has an address");
    let mut peer = Peer::spawn(test, "cm-peer", &[(CM_ADDR, addr.to_string())]);

    let id = listen.get_request(STARTUP).unwrap().into_id();
    let ctx = id.context().unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut cq = CompletionQueue::new(&ctx, 16).unwrap();
    let qp = id.create_qp(QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(4).max_recv_wr(4)).unwrap();
    let mut rq: RecvQueue<Chunk> = qp.recv_queue().unwrap();
    for (i, c) in chunks(&pd, 2, 256, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
        rq.post(c, 0..256, i as u64).unwrap();
    }
    id.accept(&ConnParam::new(), CM_BOUND).unwrap();
    peer.expect(CONNECTED, CM_BOUND);
    assert_eq!(qp.state().unwrap(), QpState::Rts);
    // The leak check counts CM ids: the listener, ours and the peer's are there now.
    let during = ResourceCounts::now();
    eprintln!("while connected: {during:?}");
    assert!(during.cm_id >= 3, "rdma resource show counts the CM ids: {during:?}");

    let killed = Instant::now();
    peer.kill();
    let ev = id.next_event(CM_BOUND).unwrap_or_else(|e| panic!("no event within {CM_BOUND:?} of the kill: {e}"));
    let took = killed.elapsed();
    eprintln!("{ev:?} {took:?} after the SIGKILL (bound {CM_BOUND:?}); our QP is {}", qp.state().unwrap());
    assert_eq!(ev.kind(), CmEventKind::Disconnected, "the survivor learns that the peer is gone");
    assert!(took < CM_BOUND);

    // The usual answer to DISCONNECTED: disconnect too, which moves our QP to ERR, and
    // the receives come back flushed, each once.
    if let Err(e) = id.disconnect() {
        eprintln!("rdma_disconnect after the peer's death: {e}");
    }
    if qp.state().unwrap() != QpState::Err {
        qp.to_error().unwrap();
    }
    let mut ids = Vec::new();
    for _ in 0..2 {
        let mut wc = poll_one(&mut cq);
        let done = rq.complete(&mut wc).unwrap();
        assert_eq!(done.status, WcStatus::WrFlushErr);
        ids.push(done.id);
    }
    assert_eq!(ids, [0, 1]);
    drop((rq, qp, cq, pd, ctx, id, listen, channel));
}

/// A peer process connected through rdma_cm is SIGKILLed: the survivor gets
/// `RDMA_CM_EVENT_DISCONNECTED` within [`CM_BOUND`], then disconnects, and its posted
/// receives come back flushed, each once. Leaks are checked in the survivor's process and,
/// once both processes are gone, in this one.
#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn killed_rdma_cm_peer_process_is_seen_as_disconnected_within_the_bound() {
    match role().as_deref() {
        Some("cm-peer") => return cm_peer(),
        Some("cm-survivor") => return cm_survivor(this_test!()),
        _ => {}
    }
    // The survivor checks its own leaks, in its own process; this one checks that nothing
    // is left on the device once both processes are gone.
    let _leaks = LeakCheck::new();
    let mut survivor = Peer::spawn(this_test!(), "cm-survivor", &[]);
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(status) = survivor.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the survivor did not finish in 180 s");
        thread::sleep(Duration::from_millis(50));
    };
    // Its stdout thread may still hold the last lines: "test result" comes last.
    let summary = survivor.expect("test result:", Duration::from_secs(5));
    assert!(status.success(), "the survivor failed: {status}");
    assert!(summary.starts_with("ok. 1 passed"), "the survivor ran exactly this test: {summary}");
}

// ---- the link under the device deleted while QPs are active -----------------------------

/// Bound on every reaction to a deleted link: the event, each later verb, the deletion
/// finishing after the last context closed. rxe reacts in milliseconds; the rest is the
/// emulation margin.
const LINK_BOUND: Duration = Duration::from_secs(30);
/// Bound on each verb after the event: an error at once, not a hang.
const VERB_BOUND: Duration = Duration::from_secs(5);

fn run(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn in_sysfs(dev: &str) -> bool {
    std::path::Path::new("/sys/class/infiniband").join(dev).exists()
}

/// A second rxe device, made for one test on a dummy netdev of its own (so rxe0, which
/// the other tests use, is never touched), and removed when dropped, whatever happened.
struct TestLink {
    dev: String,
    netdev: String,
}

impl TestLink {
    fn new(n: u8) -> TestLink {
        let link = TestLink { dev: format!("rxe_fault{n}"), netdev: format!("dummy_fault{n}") };
        let addr = format!("10.97.{n}.1/24");
        for args in [
            &["ip", "link", "add", &link.netdev, "type", "dummy"][..],
            &["ip", "addr", "add", &addr, "dev", &link.netdev],
            &["ip", "link", "set", &link.netdev, "up"],
            &["rdma", "link", "add", &link.dev, "type", "rxe", "netdev", &link.netdev],
        ] {
            run(args).unwrap_or_else(|e| panic!("setting up {}: {e} (this test needs root and rdma_rxe)", link.dev));
        }
        link
    }

    /// The device opened once its port is ACTIVE with its IPv4 GID.
    fn open(&self) -> Context {
        let ctx = Context::open(Some(&self.dev)).unwrap();
        let deadline = Instant::now() + LINK_BOUND;
        loop {
            let active = ctx.query_port(1).is_ok_and(|p| p.state == PortState::Active);
            let gid = ctx.default_gid(1);
            if active && gid.as_ref().is_ok_and(|g| g.gid.to_string().starts_with("::ffff:10.97.")) {
                return ctx;
            }
            assert!(Instant::now() < deadline, "{} not ready in {LINK_BOUND:?}: GID {gid:?}", self.dev);
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for TestLink {
    fn drop(&mut self) {
        // Either may be gone already; both wait for open contexts of the device.
        if in_sysfs(&self.dev) {
            let _ = run(&["rdma", "link", "delete", &self.dev]);
        }
        let _ = run(&["ip", "link", "del", &self.netdev]);
    }
}

/// Two RC QPs of one device connected to each other, with a SEND verified between them
/// and receives still posted: a connection in use.
struct Active {
    events: AsyncEvents,
    cq: CompletionQueue,
    cq_b: CompletionQueue,
    sq: SendQueue<Chunk>,
    rq: RecvQueue<Chunk>,
    a: QueuePair,
    /// The receiving QP, kept alive with its posted receives.
    _b: QueuePair,
    bufs: Vec<Chunk>,
    pd: ProtectionDomain,
}

impl Active {
    fn new(ctx: &Context) -> Active {
        let events = ctx.async_events().unwrap();
        while let Some(e) = events.try_next().unwrap() {
            eprintln!("before the test: {e}");
        }
        let pd = ProtectionDomain::new(ctx).unwrap();
        let (cq, cq_b) = (CompletionQueue::new(ctx, 64).unwrap(), CompletionQueue::new(ctx, 64).unwrap());
        let qp = |cq| QueuePair::builder(&pd, QpType::Rc, cq, cq).max_send_wr(16).max_recv_wr(16).build().unwrap();
        let (a, b) = (qp(&cq), qp(&cq_b));
        let (ia, ib) = (a.local_info(1).unwrap(), b.local_info(1).unwrap());
        a.connect(&InitAttr::default(), &ib).unwrap();
        b.connect(&InitAttr::default(), &ia).unwrap();
        let (sq, rq) = (a.send_queue().unwrap(), b.recv_queue().unwrap());
        let bufs = chunks(&pd, 8, 4096, AccessFlags::LOCAL_WRITE);
        let mut me = Active { events, cq, cq_b, sq, rq, a, _b: b, bufs, pd };
        for i in 0..4 {
            let buf = me.bufs.pop().unwrap();
            me.rq.post(buf, 0..4096, i).unwrap();
        }
        assert_eq!(me.send(7), (7, WcStatus::Success));
        let mut wc = poll_one(&mut me.cq_b);
        let got = me.rq.complete(&mut wc).unwrap();
        assert_eq!((got.id, got.status, got.byte_len), (0, WcStatus::Success, 1000));
        me.bufs.push(got.value);
        me
    }

    /// A SEND of 1000 bytes from A to B; its completion (bounded wait).
    fn send(&mut self, id: u64) -> (u64, WcStatus) {
        let buf = self.bufs.pop().expect("a free buffer");
        self.sq.post(SendWr::send(buf, 0..1000).id(id)).unwrap();
        let mut wc = poll_one(&mut self.cq);
        let mut out = None;
        let bufs = &mut self.bufs;
        self.sq
            .complete(&mut wc, |d| {
                out = Some((d.id, d.status));
                bufs.push(d.value);
            })
            .unwrap();
        out.unwrap()
    }
}

/// Waits for `child` to exit, at most `bound`.
fn exits_within(child: &mut Child, bound: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < bound {
        if child.try_wait().unwrap().is_some() {
            return Some(start.elapsed());
        }
        thread::sleep(Duration::from_millis(20));
    }
    None
}

/// The netdev under a second rxe device is deleted while its two connected QPs have
/// receives posted. Bounds: the async event channel reports it within [`LINK_BOUND`]; then
/// `ibv_query_port` fails with ENODEV, connecting a new QP fails, and a SEND completes with
/// an error, all within [`VERB_BOUND`]; dropping everything lets `ip link del` finish within
/// [`LINK_BOUND`].
#[test]
#[ignore = "needs an rxe device (run as root): run scripts/test"]
fn deleting_the_netdev_under_an_active_rxe_link_is_reported_and_later_verbs_fail_without_hanging() {
    let _leaks = LeakCheck::new();
    let link = TestLink::new(1);
    let ctx = link.open();
    let mut act = Active::new(&ctx);

    // `ip link del` takes the rxe link with the netdev; the kernel finishes removing the
    // device only once every context is closed (rxe cannot take resources away from a
    // process), so the command runs in the background.
    let start = Instant::now();
    let mut deleter = Command::new("ip").args(["link", "del", &link.netdev]).spawn().expect("run `ip` (iproute2)");

    // The async event channel tells: rxe 6.1 reports the GID table change on port 1 (its
    // IPv4 GID went with the netdev); a port error or a fatal device event would do too.
    let ev = act.events.wait(Some(LINK_BOUND)).unwrap_or_else(|e| panic!("no async event within {LINK_BOUND:?}: {e}"));
    let seen = start.elapsed();
    eprintln!("{ev} {seen:?} after the deletion");
    assert!(
        matches!(
            (ev.kind, ev.source),
            (AsyncEventKind::GidChange | AsyncEventKind::PortErr, EventSource::Port(1))
                | (AsyncEventKind::DeviceFatal, EventSource::Device)
        ),
        "{ev}"
    );
    while let Ok(more) = act.events.wait(Some(Duration::from_millis(200))) {
        eprintln!("then: {more}");
    }

    // Later verbs return errors, each at once: the port and its GIDs are gone (ENODEV)...
    let verbs = Instant::now();
    let err = ctx.query_port(1).unwrap_err();
    eprintln!("query_port: {err}");
    assert_eq!(err.errno(), Some(libc::ENODEV), "{err}");
    assert!(ctx.default_gid(1).is_err());
    // ... a new QP cannot be connected (it needs the port) ...
    let qp = QueuePair::builder(&act.pd, QpType::Rc, &act.cq, &act.cq).max_send_wr(8).max_recv_wr(8).build().unwrap();
    let ia = act.a.local_info(1);
    eprintln!("local_info: {ia:?}");
    assert!(ia.is_err(), "no local info without the port");
    let info = RemoteQpInfo { qpn: act.a.qp_num(), psn: 1, lid: 0, gid: Default::default() };
    let err = qp.connect(&InitAttr::default(), &info).unwrap_err();
    eprintln!("connect: {err}");
    // ... and a SEND on the connected QP completes with an error instead of going out.
    let (id, status) = act.send(8);
    eprintln!("SEND after the deletion: {status:?}");
    assert_eq!(id, 8);
    assert_ne!(status, WcStatus::Success, "nothing can be sent through a deleted netdev");
    let took = verbs.elapsed();
    eprintln!("the later verbs and the failed SEND took {took:?}");
    assert!(took < VERB_BOUND, "the errors took {took:?}");
    assert!(in_sysfs(&link.dev), "the device waits for our context");

    // Dropping everything is clean, and lets the kernel finish the removal.
    let dropped = Instant::now();
    drop((qp, act, ctx));
    let gone = exits_within(&mut deleter, LINK_BOUND).expect("`ip link del` finishes once the last context closed");
    eprintln!("dropped in {:?}; `ip link del` done {gone:?} later", dropped.elapsed() - gone);
    assert!(deleter.wait().unwrap().success());
    assert!(!in_sysfs(&link.dev), "{} left sysfs", link.dev);
}

/// `rdma link delete` of a second rxe device in use: for 2 s nothing is reported and the
/// device keeps working; once the context is dropped the deletion finishes within
/// [`LINK_BOUND`].
#[test]
#[ignore = "needs an rxe device (run as root): run scripts/test"]
fn rdma_link_delete_of_an_active_rxe_device_waits_for_its_contexts_which_keep_working_meanwhile() {
    // What rxe cannot do: without the provider's `disassociate_ucontext` (mlx5 has it),
    // the kernel cannot take the device away from a process, so it waits. Nothing is
    // reported to the process (no async event), and its verbs keep working until it
    // drops its context; then the deletion finishes. A program that must let go of a
    // device on request needs to hear it some other way.
    let _leaks = LeakCheck::new();
    let link = TestLink::new(2);
    let ctx = link.open();
    let mut act = Active::new(&ctx);

    let mut deleter = Command::new("rdma").args(["link", "delete", &link.dev]).spawn().expect("run `rdma` (iproute2)");
    let err = act.events.wait(Some(Duration::from_secs(2))).unwrap_err();
    assert!(matches!(err, rdma_verbs::Error::Timeout { .. }), "no event on rxe: {err}");
    assert!(deleter.try_wait().unwrap().is_none(), "`rdma link delete` waits for our context");
    assert!(in_sysfs(&link.dev));
    assert_eq!(act.send(9), (9, WcStatus::Success), "the data path still works");
    let mut wc = poll_one(&mut act.cq_b);
    assert_eq!(act.rq.complete(&mut wc).unwrap().status, WcStatus::Success);
    assert_eq!(ctx.query_port(1).unwrap().state, PortState::Active);

    let dropped = Instant::now();
    drop((act, ctx));
    let gone = exits_within(&mut deleter, LINK_BOUND).expect("the deletion finishes once the last context closed");
    eprintln!("dropped in {:?}; `rdma link delete` done {gone:?} later", dropped.elapsed() - gone);
    assert!(deleter.wait().unwrap().success());
    assert!(!in_sysfs(&link.dev));
}
