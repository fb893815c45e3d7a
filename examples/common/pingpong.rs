//! What `rc_pingpong` and `ud_pingpong` share, as rdma-core's two tools do: their flags'
//! number parsing, this side's address and rdma-core's text exchange of it over TCP, the
//! registered buffers and the ping-pong loop with its two result lines. What differs (the
//! QP's type and how it comes up, what a message holds and how an arrival is checked) is
//! each example's, the latter through [`Traffic`]. Included by both with `#[path]`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rdma_verbs::wire;
use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, Gid, ProtectionDomain, QueuePair, RecvQueue, Remote,
    RemoteQpInfo, SendQueue, SendWr, WorkCompletion,
};

pub type AnyError = Box<dyn std::error::Error>;

/// What the C tools fill their buffers with: every message they send is this byte.
pub const FILL: u8 = 0x7b;
/// Registered memory these examples agree to use.
pub const MAX_MEMORY: usize = 1 << 30;

/// A number as strtoul(.., 0) reads it: decimal, or hex after `0x`.
pub fn number<T: TryFrom<u64>>(s: &str) -> Result<T, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse::<u64>(),
    };
    v.ok().and_then(|v| T::try_from(v).ok()).ok_or_else(|| format!("{s:?} is not a number in range"))
}

pub fn at_least_one<T: TryFrom<u64> + PartialEq + From<u8>>(s: &str) -> Result<T, String> {
    let n: T = number(s)?;
    if n == T::from(0) {
        return Err("must be at least 1".into());
    }
    Ok(n)
}

pub fn service_level(s: &str) -> Result<u8, String> {
    number(s).ok().filter(|&sl: &u8| sl <= 15).ok_or_else(|| "service levels are 0..=15".into())
}

pub fn seconds(s: &str) -> Result<Duration, String> {
    number(s).map(Duration::from_secs)
}

/// This side's address, as the exchange sends it, and the GID index it sends from.
pub struct Local {
    pub info: RemoteQpInfo,
    pub sgid_index: u32,
}

/// `qp`'s address on `ib_port`: its LID, and the GID at `gid_index`, or without one the
/// port's default GID on RoCE and none on InfiniBand (as the C tools without `-g`).
pub fn local_address(ctx: &Context, qp: &QueuePair, ib_port: u8, gid_index: Option<u32>) -> Result<Local, AnyError> {
    let port = ctx.query_port(ib_port)?;
    if !port.is_ethernet() && port.lid == 0 {
        return Err(format!("port {ib_port} has no LID (is the subnet manager running?)").into());
    }
    let (sgid_index, gid) = match gid_index {
        Some(i) => (i, ctx.query_gid(ib_port, i)?.gid),
        None if port.is_ethernet() => {
            let e = ctx.default_gid(ib_port)?;
            (e.index, e.gid)
        }
        // Like the C tool without -g: no GID, addressed by LID.
        None => (0, Gid::default()),
    };
    Ok(Local { info: RemoteQpInfo { qpn: qp.qp_num(), psn: qp.psn(), lid: port.lid, gid }, sgid_index })
}

pub fn print_address(label: &str, a: &RemoteQpInfo) {
    println!("  {label} LID {:#06x}, QPN {:#08x}, PSN {:#08x}, GID {}", a.lid, a.qpn, a.psn, a.gid);
}

/// A GID with an interface ID (its last 8 bytes) is one to route by, as the C tools decide.
pub fn has_interface_id(gid: &Gid) -> bool {
    gid.0[8..] != [0; 8]
}

/// The path to `remote`: by its GID when it sent one, else by its LID.
pub fn path_to(local: &Local, remote: &RemoteQpInfo) -> Remote {
    if has_interface_id(&remote.gid) {
        Remote::gid(remote.gid, local.sgid_index)
    } else {
        Remote::lid(remote.lid)
    }
}

fn read_msg<const N: usize>(s: &mut TcpStream, what: &str) -> Result<[u8; N], AnyError> {
    let mut buf = [0u8; N];
    s.read_exact(&mut buf).map_err(|e| format!("{what}: {e}"))?;
    Ok(buf)
}

/// The TCP connection to the peer: to `server` when this side is the client, else the
/// first one accepted on `port`; reads and writes give up after `timeout`.
pub fn tcp_stream(server: Option<&str>, port: u16, timeout: Duration) -> Result<TcpStream, AnyError> {
    let s = match server {
        Some(host) => {
            TcpStream::connect((host, port)).map_err(|e| format!("couldn't connect to {host}:{port}: {e}"))?
        }
        None => {
            let listener =
                TcpListener::bind(("0.0.0.0", port)).map_err(|e| format!("couldn't listen on TCP port {port}: {e}"))?;
            let (s, _) = listener.accept().map_err(|e| format!("accept failed: {e}"))?;
            s
        }
    };
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

/// rdma-core's exchange: the client's address, the server's, the client's "done"; then
/// the remote address is printed. `ready` brings this side up towards the peer: the
/// server's runs before it answers, so the client's first message finds it ready; the
/// client's after its "done".
pub fn exchange(
    s: &mut TcpStream,
    local: &RemoteQpInfo,
    client: bool,
    ready: impl FnOnce(&RemoteQpInfo) -> Result<(), AnyError>,
) -> Result<RemoteQpInfo, AnyError> {
    let mine = wire::pingpong::encode(local)?;
    if client {
        s.write_all(&mine)?;
        let msg = read_msg::<{ wire::pingpong::MSG_LEN }>(s, "reading the server's address")?;
        let remote = wire::pingpong::decode(&msg).map_err(|e| format!("the server's address: {e}"))?;
        s.write_all(&wire::pingpong::DONE)?;
        print_address("remote address:", &remote);
        ready(&remote)?;
        Ok(remote)
    } else {
        let msg = read_msg::<{ wire::pingpong::MSG_LEN }>(s, "reading the client's address")?;
        let remote = wire::pingpong::decode(&msg).map_err(|e| format!("the client's address: {e}"))?;
        ready(&remote)?;
        s.write_all(&mine)?;
        let done = read_msg::<{ wire::pingpong::DONE.len() }>(s, "reading the client's \"done\"")?;
        wire::pingpong::check_done(&done).map_err(|e| format!("the client's last message: {e}"))?;
        print_address("remote address:", &remote);
        Ok(remote)
    }
}

/// A CQ of `rx_depth + 1` entries (the receives and the send), with a channel to sleep
/// on when `events`.
pub fn completion_queue(ctx: &Context, rx_depth: u32, events: bool) -> Result<CompletionQueue, AnyError> {
    let cqe = rx_depth + 1;
    Ok(if events {
        CompletionQueue::builder(ctx, cqe).with_channel().build()?
    } else {
        CompletionQueue::new(ctx, cqe)?
    })
}

/// The QP's queues with their buffers: `rx_depth` receives of `len` bytes posted, and one
/// buffer to send from while it is not posted.
pub struct Buffers {
    rq: RecvQueue<Chunk>,
    sq: SendQueue<Chunk>,
    send_buf: Option<Chunk>,
    len: usize,
}

impl Buffers {
    /// Registers `rx_depth + 1` buffers of `len` bytes and posts all but the send buffer on
    /// `qp`, which must be in INIT or later. `len_text` is `len` in the words of the flags,
    /// for the error when they would take more than [`MAX_MEMORY`].
    pub fn post(
        pd: &ProtectionDomain,
        qp: &QueuePair,
        rx_depth: u32,
        len: usize,
        len_text: &str,
    ) -> Result<Self, AnyError> {
        // A posted buffer belongs to the device until its completion: one per receive.
        let total = (rx_depth as usize + 1)
            .checked_mul(len)
            .filter(|&t| t <= MAX_MEMORY)
            .ok_or_else(|| format!("(rx-depth + 1) x {len_text} is above {MAX_MEMORY} bytes: lower -r or -s"))?;
        let mut chunks = pd.register(AlignedBuf::new(total)?, AccessFlags::LOCAL_WRITE)?.into_chunks(len)?;
        let mut send_buf = chunks.pop();
        if let Some(b) = send_buf.as_mut() {
            b.fill(FILL);
        }
        let mut rq: RecvQueue<Chunk> = qp.recv_queue()?;
        let sq: SendQueue<Chunk> = qp.send_queue()?;
        for c in chunks {
            rq.post(c, 0..len, 0)?;
        }
        Ok(Buffers { rq, sq, send_buf, len })
    }

    fn send(&mut self, traffic: &mut impl Traffic, n: u64, inline: bool) -> Result<(), AnyError> {
        let buf = self.send_buf.take().ok_or("the send buffer is still posted")?;
        let wr = traffic.send_wr(n, buf);
        self.sq.post(if inline { wr.inline() } else { wr })?;
        Ok(())
    }
}

/// What a ping-pong sends and how it checks what arrives.
pub trait Traffic {
    /// Message `n`, written into `buf` if it must be.
    fn send_wr(&mut self, n: u64, buf: Chunk) -> SendWr<Chunk>;
    /// Checks arrival `n`: `byte_len` bytes into `buf`, a whole receive buffer.
    fn check(&mut self, n: u64, wc: &WorkCompletion, byte_len: u32, buf: &[u8]) -> Result<(), AnyError>;
    /// The error when nothing completed for `timeout`.
    fn stalled(&self, timeout: Duration, received: u64, sent: u64) -> AnyError;
}

/// The flags the loop goes by.
pub struct Rounds {
    pub iters: u64,
    pub events: bool,
    pub timeout: Duration,
    pub client: bool,
    /// Whether a message fits in the QP's inline data.
    pub inline: bool,
}

const RECV: u8 = 1;
const SEND: u8 = 2;

/// The C tools' loop: the client sends first; each side sends its next message once its
/// previous send completed and a message arrived, until `iters` went each way. Returns
/// the time it took.
pub fn ping_pong(
    cq: &mut CompletionQueue,
    b: &mut Buffers,
    r: &Rounds,
    traffic: &mut impl Traffic,
) -> Result<Duration, AnyError> {
    let start = Instant::now();
    let mut pending = RECV;
    if r.client {
        b.send(traffic, 0, r.inline)?;
        pending |= SEND;
    }
    let (mut rcnt, mut scnt) = (0u64, 0u64);
    let mut wcs = [WorkCompletion::EMPTY; 2];
    let mut progress = Instant::now();
    while rcnt < r.iters || scnt < r.iters {
        if r.events {
            cq.wait(Some(r.timeout))?;
            cq.arm(false)?;
        }
        let n = cq.poll(&mut wcs)?.len();
        if n == 0 {
            if progress.elapsed() > r.timeout {
                return Err(traffic.stalled(r.timeout, rcnt, scnt));
            }
            continue;
        }
        progress = Instant::now();
        for wc in &mut wcs[..n] {
            // A failed request is an error naming the operation, its id and the QP.
            if wc.opcode().is_recv() {
                let done = b.rq.complete(wc)?.result()?;
                traffic.check(rcnt, wc, done.byte_len, &done.value[..b.len])?;
                b.rq.post(done.value, 0..b.len, 0)?;
                rcnt += 1;
                pending &= !RECV;
            } else {
                let mut sent = None;
                b.sq.complete(wc, |d| sent = Some(d.result()))?;
                b.send_buf = Some(sent.ok_or("a send completion that finished no send")??.value);
                scnt += 1;
                pending &= !SEND;
            }
            if scnt < r.iters && pending == 0 {
                b.send(traffic, scnt, r.inline)?;
                pending = RECV | SEND;
            }
        }
    }
    Ok(start.elapsed())
}

/// The C tools' two result lines: `iters` messages of `size` bytes each way in `elapsed`.
pub fn print_result(size: usize, iters: u64, elapsed: Duration) {
    let usec = elapsed.as_secs_f64() * 1e6;
    let bytes = size as u64 * iters * 2;
    println!("{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec", usec / 1e6, bytes as f64 * 8.0 / usec);
    println!("{iters} iters in {:.2} seconds = {:.2} usec/iter", usec / 1e6, usec / iters as f64);
}
