//! perftest's rdma_cm mode (`-R`, `--rdma_cm`): the test's QPs are connected through
//! rdma_cm, and the out-of-band exchange itself runs over an rdma_cm connection. It is
//! the only way to run on iWARP (siw, cxgb4, irdma in iWARP mode), whose QPs reach RTS
//! only through the CM, and it works on RoCE and InfiniBand too.
//!
//! # perftest's wire behaviour (perftest 4.5, Debian's `4.5+0.17`)
//!
//! - **The control connection.** The server listens with rdma_cm on the TCP port space,
//!   port `-p` (default 18515), on every address; the client resolves the server's
//!   address and connects (no private data). Each side has one RC QP on it with one
//!   receive posted, and RNR retries forever (7). Once the server accepted it, it
//!   destroys its listener.
//! - **The exchange** is perftest's usual one (versions, system data, MTU, destinations,
//!   reports: [`crate::oob`]), each message one SEND on the control QP instead of bytes on
//!   TCP, lockstep (the client sends, then receives; the server the reverse; each side
//!   posts its receive again before it answers). A destination is perftest's `struct
//!   pingpong_dest` in binary, 56 bytes, each integer big-endian
//!   ([`crate::oob::msg::Dest::to_cm_bytes`]), not the text of the TCP mode.
//! - **The test's QPs.** Right after the MTU, one destination exchange (a barrier); then
//!   the server listens again on the same port (backlog `-q`) and accepts one connection
//!   per QP, making each QP on its request's id; the client makes one id per QP and
//!   connects them all; then another barrier. The QPs are in RTS then: the destination
//!   exchanges that follow (two per QP, then the tool's barriers, as over TCP) only carry
//!   the rkey and address of each side's buffer. READ tests ask for `-o` (perftest: its
//!   outstanding reads) responder resources and initiator depth; the rest is the CM's.
//! - **The end** is as over TCP without the `done` text: a barrier closes the exchange.
//!   perftest's client then disconnects the test's connections and waits for each
//!   DISCONNECTED; dropping ours gives it that.
//!
//! A race perftest has with itself: its server listens for the test's connections only
//! after it answered the first barrier, so a client that connects at once finds no
//! listener; perftest's client retries with fresh ids and QPs. Ours cannot (the tool's QPs
//! exist by then): against a perftest server our client waits 200 ms first. Our server
//! listens before it answers, so no client of any kind meets the race with it.
//!
//! Between two of our tools, the steps are the same up to the test's connections; then
//! each side sends each QP's region in rdma-verbs' own format (with its length), and the
//! rest (barriers, verdicts, counts) is the TCP mode's, over the control connection.
//!
//! The QP timeout (`-u`) is the CM's with `-R` (perftest's too).

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CmEventKind, CmId, CompletionQueue, ConnParam, Context, EventChannel, PortSpace,
    ProtectionDomain, QpType, QueuePair, QueuePairBuilder, RecvQueue, SendQueue, SendWr, WorkCompletion,
};

use crate::oob::msg::DEST_LEN_CM;
use crate::perftest::Res;

/// Bytes of one control message at most (ours; perftest's are at most 56).
const MSG: usize = 4096;
/// Receives kept posted on the control QP (perftest keeps one; lockstep needs one).
const RECVS: u32 = 8;
/// How long a resolution or a connection step may take.
const STEP: Duration = Duration::from_secs(2);
/// How long a client keeps trying to reach a server that may still be starting.
const DIAL: Duration = Duration::from_secs(30);
/// How long a side waits for the peer's connection of a test QP.
const PEER_CONNECT: Duration = Duration::from_secs(60);

/// The control connection's: RNR and timeout retries forever, as perftest's.
const CONTROL: CmQp = CmQp { reads: None, rnr_retry: 7, retry: 7 };

/// How to connect one of the test's QPs: what the tool asks of the CM.
#[derive(Debug, Clone, Copy, Default)]
pub struct CmQp {
    /// RDMA READs this side may have outstanding at the peer (`-o`), and the peer at it:
    /// `None` leaves the device's maximum (READ tests only set it).
    pub reads: Option<u8>,
    /// Retries after an RNR NAK (0..=7).
    pub rnr_retry: u8,
    /// Retries after a timeout (0..=7).
    pub retry: u8,
}

impl CmQp {
    fn param(&self) -> ConnParam<'static> {
        let p = ConnParam::new().retry_count(self.retry.min(7)).rnr_retry_count(self.rnr_retry.min(7));
        match self.reads {
            Some(n) => p.responder_resources(n).initiator_depth(n),
            None => p,
        }
    }
}

/// The control connection of the rdma_cm mode, a byte stream for the exchange (each
/// `write` one SEND of at most 4 KiB, each `read` from the messages received, in order),
/// and the maker of the test's QPs, which it connects through rdma_cm.
pub struct CmLink {
    sq: SendQueue<Chunk>,
    rq: RecvQueue<Chunk>,
    free: Vec<Chunk>,
    /// The message being read: its buffer, length and how much of it was read.
    cur: Option<(Chunk, usize, usize)>,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    _qp: QueuePair,
    ctx: Context,
    ctl: CmId,
    client: bool,
    /// The server's address (client) or the one it listens on (server).
    addr: SocketAddr,
    data_channel: EventChannel,
    /// The server's listener for the test's connections of the current round.
    listener: Option<CmId>,
    /// The client's ids of the current round, made and resolved, not yet connected.
    pending: Vec<(CmId, CmQp)>,
    /// The barrier before the test's connections was made this round.
    synced: bool,
    /// The peer is perftest (its server listens late: see the module's docs).
    pub(crate) perftest_peer: bool,
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

impl CmLink {
    /// The server's end: listens with rdma_cm on `port` (every address) for one client and
    /// accepts its control connection.
    pub fn serve(port: u16, device: Option<&str>) -> Res<CmLink> {
        let channel = EventChannel::new()?;
        let listener = CmId::new(&channel, PortSpace::Tcp)?;
        let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
        listener.bind(addr).map_err(|e| format!("rdma_cm: binding port {port} (-p): {e}"))?;
        listener.listen(1).map_err(|e| format!("rdma_cm: listening on port {port} (-p): {e}"))?;
        eprintln!("waiting for an rdma_cm client on port {port}");
        let request = loop {
            match listener.get_request(Duration::from_secs(3600)) {
                Ok(r) => break r,
                Err(rdma_verbs::Error::Timeout { .. }) => continue,
                Err(e) => return Err(format!("rdma_cm: waiting for a client on port {port}: {e}").into()),
            }
        };
        let id = request.into_id();
        // The port is the test connections' next (perftest's server does the same).
        listener.destroy()?;
        let link = Self::build(id, false, addr)?;
        link.check_device(device)?;
        link.ctl.accept(&CONTROL.param(), PEER_CONNECT)?;
        Ok(link)
    }

    /// The client's end: connects to the server's rdma_cm port, trying again for 30 s
    /// while nothing listens there yet.
    pub fn dial(host: &str, port: u16, device: Option<&str>) -> Res<CmLink> {
        let addr = (host, port)
            .to_socket_addrs()
            .map_err(|e| format!("{host}: {e}"))?
            .find(|a| a.is_ipv4())
            .ok_or_else(|| format!("{host}: no IPv4 address"))?;
        let deadline = Instant::now() + DIAL;
        loop {
            let attempt = (|| -> Res<CmLink> {
                let channel = EventChannel::new()?;
                let id = CmId::new(&channel, PortSpace::Tcp)?;
                id.resolve_addr(None, addr, STEP)?;
                id.resolve_route(STEP)?;
                let link = Self::build(id, true, addr)?;
                link.ctl.connect(&CONTROL.param(), STEP * 5)?;
                Ok(link)
            })();
            match attempt {
                Ok(link) => {
                    link.check_device(device)?;
                    return Ok(link);
                }
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => {
                    return Err(format!(
                        "rdma_cm: connecting to the server {addr} (is it running with -R, -p {port}?): {e}"
                    )
                    .into())
                }
            }
        }
    }

    /// `-d`, when given, must be the device rdma_cm chose for the address.
    fn check_device(&self, device: Option<&str>) -> Res<()> {
        match device {
            Some(want) if self.ctx.name() != want => Err(format!(
                "rdma_cm reaches {} through {}, not the device {want} (-d): with -R the address decides the device",
                self.addr,
                self.ctx.name()
            )
            .into()),
            _ => Ok(()),
        }
    }

    /// The control QP on `id`, its receives posted; not yet connected.
    fn build(id: CmId, client: bool, addr: SocketAddr) -> Res<CmLink> {
        let ctx = id.context()?;
        let pd = ProtectionDomain::new(&ctx)?;
        let send_cq = CompletionQueue::new(&ctx, 2)?;
        let recv_cq = CompletionQueue::new(&ctx, RECVS)?;
        let qp =
            id.create_qp(QueuePair::builder(&pd, QpType::Rc, &send_cq, &recv_cq).max_send_wr(1).max_recv_wr(RECVS))?;
        let mut bufs =
            pd.register(AlignedBuf::new(MSG * (RECVS as usize + 1))?, AccessFlags::LOCAL_WRITE)?.into_chunks(MSG)?;
        let free = bufs.pop().into_iter().collect();
        let mut rq: RecvQueue<Chunk> = qp.recv_queue()?;
        for b in bufs {
            rq.post(b, 0..MSG, 0)?;
        }
        let sq = qp.send_queue()?;
        let data_channel = EventChannel::new()?;
        Ok(CmLink {
            sq,
            rq,
            free,
            cur: None,
            send_cq,
            recv_cq,
            _qp: qp,
            ctx,
            ctl: id,
            client,
            addr,
            data_channel,
            listener: None,
            pending: Vec::new(),
            synced: false,
            perftest_peer: false,
        })
    }

    /// Whether this is the client's end.
    pub fn is_client(&self) -> bool {
        self.client
    }

    /// The device context rdma_cm bound the connection to: the test's PD, CQs and regions
    /// belong there.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// A QP of the test, made from `builder` (its PD and CQs of [`context`](Self::context))
    /// on an rdma_cm id of its own. The server's is connected when this returns (it waits
    /// for the client's request); the client's once every QP of the round is made
    /// ([`connect_round`](Self::connect_round)). The first of a round makes perftest's
    /// barrier before the test's connections.
    pub fn data_qp(&mut self, builder: QueuePairBuilder<'_>, how: CmQp) -> Res<QueuePair> {
        if !self.synced {
            self.barrier(true)?;
            self.synced = true;
        }
        if self.client {
            let id = CmId::new(&self.data_channel, PortSpace::Tcp)?;
            id.resolve_addr(None, self.addr, STEP)?;
            id.resolve_route(STEP)?;
            let qp = id.create_qp(builder)?;
            self.pending.push((id, how));
            return Ok(qp);
        }
        let listener = self.listener.as_ref().ok_or("rdma_cm: no listener for the test's connections")?;
        let request = listener
            .get_request(PEER_CONNECT)
            .map_err(|e| format!("rdma_cm: waiting for the client's connection of a test QP: {e}"))?;
        let id = request.into_id();
        let qp = id.create_qp(builder)?;
        id.accept(&how.param(), PEER_CONNECT)?;
        Ok(qp)
    }

    /// The end of a round of [`data_qp`](Self::data_qp): the client connects its ids in
    /// order (so QP i meets the server's QP i), the server closes its listener, and both
    /// meet at perftest's barrier after the test's connections.
    pub fn connect_round(&mut self) -> Res<()> {
        if self.client {
            if self.perftest_peer && !self.pending.is_empty() {
                // perftest's server listens only after it answered the barrier.
                std::thread::sleep(Duration::from_millis(200));
            }
            for (i, (id, how)) in self.pending.drain(..).enumerate() {
                id.connect(&how.param(), PEER_CONNECT)
                    .map_err(|e| format!("rdma_cm: connecting test QP {i} to {}: {e}", self.addr))?;
            }
        } else if let Some(l) = self.listener.take() {
            l.destroy()?;
        }
        self.synced = false;
        self.barrier(false)
    }

    /// perftest's barrier around the test's connections: one 56-byte destination each
    /// way (perftest sends its first QP's, still empty). The server listens for the test's
    /// connections before it answers the first (`listen`), so the client never finds the
    /// port closed.
    fn barrier(&mut self, listen: bool) -> Res<()> {
        let mine = [0u8; DEST_LEN_CM];
        let mut theirs = [0u8; DEST_LEN_CM];
        let what = "rdma_cm: the barrier around the test's connections";
        if self.client {
            self.write_all(&mine).and_then(|()| self.read_exact(&mut theirs)).map_err(|e| format!("{what}: {e}"))?;
        } else {
            self.read_exact(&mut theirs).map_err(|e| format!("{what}: {e}"))?;
            if listen {
                let l = CmId::new(&self.data_channel, PortSpace::Tcp)?;
                let port = self.addr.port();
                l.bind(self.addr).map_err(|e| format!("rdma_cm: binding port {port} again for the test's QPs: {e}"))?;
                l.listen(1024)?;
                self.listener = Some(l);
            }
            self.write_all(&mine).map_err(|e| format!("{what}: {e}"))?;
        }
        Ok(())
    }

    /// Whether the peer closed the control connection (checked now and then while waiting).
    fn peer_gone(&self) -> bool {
        matches!(self.ctl.next_event(Duration::ZERO), Ok(e) if e.kind() == CmEventKind::Disconnected)
    }

    /// The next message: its buffer and length (empty messages are skipped).
    fn next_message(&mut self) -> io::Result<(Chunk, usize)> {
        let mut wcs = [WorkCompletion::EMPTY; 1];
        let mut idle = 0u32;
        loop {
            if self.recv_cq.poll(&mut wcs).map_err(io_err)?.is_empty() {
                idle = idle.wrapping_add(1);
                if idle % 4096 == 0 && self.peer_gone() {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the peer closed the rdma_cm connection",
                    ));
                }
                continue;
            }
            let done = self.rq.complete(&mut wcs[0]).map_err(io_err)?.result().map_err(io_err)?;
            let len = (done.byte_len as usize).min(MSG);
            if len == 0 {
                self.rq.post(done.value, 0..MSG, 0).map_err(io_err)?;
                continue;
            }
            return Ok((done.value, len));
        }
    }
}

impl Read for CmLink {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        let (buf, len, mut at) = match self.cur.take() {
            Some(cur) => cur,
            None => {
                let (buf, len) = self.next_message()?;
                (buf, len, 0)
            }
        };
        let n = (len - at).min(out.len());
        out[..n].copy_from_slice(&buf[at..at + n]);
        at += n;
        if at == len {
            self.rq.post(buf, 0..MSG, 0).map_err(io_err)?;
        } else {
            self.cur = Some((buf, len, at));
        }
        Ok(n)
    }
}

impl Write for CmLink {
    /// One SEND of at most 4 KiB, waited for (as perftest waits for each of its own).
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let n = bytes.len().min(MSG);
        let mut buf = self.free.pop().ok_or_else(|| io_err("rdma_cm: no free send buffer"))?;
        buf[..n].copy_from_slice(&bytes[..n]);
        self.sq.post(SendWr::send(buf, 0..n)).map_err(|e| io_err(rdma_verbs::Error::from(e)))?;
        let mut wcs = [WorkCompletion::EMPTY; 1];
        let mut idle = 0u32;
        loop {
            if self.send_cq.poll(&mut wcs).map_err(io_err)?.is_empty() {
                idle = idle.wrapping_add(1);
                if idle % 4096 == 0 && self.peer_gone() {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the peer closed the rdma_cm connection",
                    ));
                }
                continue;
            }
            let (free, mut failed) = (&mut self.free, None);
            self.sq
                .complete(&mut wcs[0], |d| match d.result() {
                    Ok(d) => free.push(d.value),
                    Err(e) => failed = Some(rdma_verbs::Error::from(e)),
                })
                .map_err(io_err)?;
            return match failed {
                Some(e) => Err(io_err(e)),
                None => Ok(n),
            };
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
