//! `async_echo`: a tokio server that accepts rdma_cm connections and echoes every SEND,
//! and its clients, each connection served by its own task on one runtime.
//!
//! ```text
//! async_echo --loopback [--addr IP] [--connections N] [--messages M] [--size BYTES]
//! async_echo --server [--addr IP] [-p PORT] [--connections N]
//! async_echo --connect IP [-p PORT] [--connections N] [--messages M] [--size BYTES]
//! ```
//!
//! A client connects (RC, port space TCP) with private data: the number of messages it
//! will send (8 bytes, little-endian), its connection number (4 bytes, little-endian) and
//! `async_echo: hello`. The server checks those bytes (a request without them is rejected)
//! and accepts with private data of its own: `async_echo: welcome`, then the connection
//! number and the message count it read; the client checks those bytes too (the rest of
//! each side's field must be the zeros rdma_cm pads it with). The client then sends each
//! message (its connection number and sequence in every byte's pattern), awaits the echo
//! and compares it byte for byte. The server echoes that many messages per connection,
//! then disconnects it.
//!
//! Completions are awaited: each side of a connection is an `AsyncSendQueue` or
//! `AsyncRecvQueue` on a channel CQ of its own (`AsyncCq::tokio`), so a post returns a
//! ticket at once and a task parks on its CQs' channels instead of spinning. Connection setup is awaited
//! too (`AsyncCmId::tokio`): the server's listener takes the requests in a loop and hands
//! each to a task of its own, which accepts it on an event channel of its own; each
//! client resolves and connects in its task; both sides await their DISCONNECTED at the
//! end. No thread of tokio's blocking pool is used. `--loopback` runs the server and N clients in one
//! process on one runtime; the exit status is 0 only when every echo matched (1 on a
//! failure, 2 on a command-line error). The address is one of the RDMA device's (scripts/rxe
//! exports `RDMA_IP`, the default of `--addr`). The client (and `--loopback`) ends with
//! `async_echo: N connections x M messages of S bytes: every echo matched, private data
//! checked both ways`; `--server` with `async_echo: served N connections: every client's
//! private data checked`. `scripts/multihost` runs the server and the client on two nodes.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rdma_verbs::{
    AccessFlags, AlignedBuf, AsyncCmId, AsyncCq, AsyncRecvQueue, AsyncSendQueue, Chunk, CmId, CompletionQueue,
    ConnParam, ConnectRequest, EventChannel, PortSpace, ProtectionDomain, QpType, QueuePair, SendWr, TokioFd,
};

#[derive(Parser, Debug, Clone)]
#[command(about = "rdma_cm echo server and clients on tokio, completions awaited")]
struct Opts {
    /// Run the server and the clients in this process, on one runtime.
    #[arg(long, conflicts_with_all = ["server", "connect"])]
    loopback: bool,
    /// Serve --connections clients, then exit.
    #[arg(long, conflicts_with = "connect")]
    server: bool,
    /// Connect to the server at this address.
    #[arg(long, value_name = "IP")]
    connect: Option<IpAddr>,
    /// The address to listen on (server, loopback); default: $RDMA_IP.
    #[arg(long, value_name = "IP")]
    addr: Option<IpAddr>,
    /// rdma_cm port.
    #[arg(short, long, default_value_t = 7472)]
    port: u16,
    /// Connections, each served by its own task.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    connections: u32,
    /// Messages each client sends and checks.
    #[arg(long, default_value_t = 100)]
    messages: u64,
    /// Bytes per message.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    size: u32,
    /// Bound on every rdma_cm wait and every await, in seconds.
    #[arg(short, long, default_value_t = 30)]
    timeout: u64,
}

/// The crate's errors (a failed request's names the operation, its id and the QP) and
/// this program's own; `Send` to cross tasks.
type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// One end of a connection, its rdma_cm events and completions awaited.
struct Conn {
    // The queues first: dropped before the QP and the id.
    sq: AsyncSendQueue<Chunk, TokioFd>,
    rq: AsyncRecvQueue<Chunk, TokioFd>,
    send_buf: Option<Chunk>,
    _qp: QueuePair,
    id: AsyncCmId<TokioFd>,
    /// The messages this connection carries (the client's count).
    messages: u64,
}

impl Conn {
    /// Makes the QP of `id` (a channel CQ for each side, 4 requests each way) and posts
    /// its receive.
    fn new(id: AsyncCmId<TokioFd>, size: usize, messages: u64) -> rdma_verbs::Result<Conn> {
        let ctx = id.id().context()?;
        let pd = ProtectionDomain::new(&ctx)?;
        let cq = || CompletionQueue::builder(&ctx, 4).with_channel().build();
        let (scq, rcq) = (cq()?, cq()?);
        let qp = id.id().create_qp(QueuePair::builder(&pd, QpType::Rc, &scq, &rcq).max_send_wr(4).max_recv_wr(4))?;
        let mut bufs = pd.register(AlignedBuf::new(2 * size)?, AccessFlags::LOCAL_WRITE)?.into_chunks(size)?;
        let (send_buf, recv_buf) = (bufs.remove(0), bufs.remove(0));
        // Each side awaited on its own CQ: posts return tickets, awaits hand buffers back.
        let sq = AsyncSendQueue::new(qp.send_queue()?, AsyncCq::tokio(scq)?)?;
        let mut rq = AsyncRecvQueue::new(qp.recv_queue()?, AsyncCq::tokio(rcq)?)?;
        rq.post(recv_buf, 0..size, 0)?;
        Ok(Conn { sq, rq, send_buf: Some(send_buf), _qp: qp, id, messages })
    }

    /// SENDs `len` bytes of the send buffer, after `fill` wrote them, and awaits the
    /// completion (the buffer comes back).
    async fn send(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) -> Res<()> {
        let mut buf = self.send_buf.take().ok_or("the send buffer is out")?;
        fill(&mut buf[..len]);
        let sent = self.sq.post(SendWr::send(buf, 0..len))?;
        let done = self.sq.wait(sent).await?;
        self.send_buf = Some(done.result()?.value);
        Ok(())
    }

    /// Awaits the next receive, hands its bytes to `check`, and posts the buffer again.
    async fn recv(&mut self, check: impl FnOnce(&[u8]) -> Res<()>) -> Res<()> {
        let got = self.rq.next().await?.result()?;
        let outcome = check(&got.value[..got.byte_len as usize]);
        let len = got.value.len();
        self.rq.post(got.value, 0..len, 0)?;
        outcome
    }
}

/// What a client's private data ends with, after its message count and connection number.
const HELLO: &[u8] = b"async_echo: hello";
/// What the server's private data starts with, before the connection number and message
/// count it read.
const WELCOME: &[u8] = b"async_echo: welcome";

/// The client's private data: the message count, the connection number, [`HELLO`].
fn hello(conn: u32, messages: u64) -> Vec<u8> {
    [&messages.to_le_bytes()[..], &conn.to_le_bytes(), HELLO].concat()
}

/// The server's private data for a client that sent [`hello`]`(conn, messages)`.
fn welcome(conn: u32, messages: u64) -> Vec<u8> {
    [WELCOME, &conn.to_le_bytes(), &messages.to_le_bytes()].concat()
}

/// Checks that `got` is `want` followed by nothing but the zeros rdma_cm pads with.
fn padded(got: &[u8], want: &[u8], whose: &str) -> Res<()> {
    let ok = got.len() >= want.len() && got[..want.len()] == *want && got[want.len()..].iter().all(|&b| b == 0);
    if ok {
        Ok(())
    } else {
        Err(format!("{whose} private data is {got:02x?}, not {want:02x?} and zeros").into())
    }
}

/// The connection number and message count of a client's private data, once its bytes
/// are checked.
fn read_hello(got: &[u8]) -> Res<(u32, u64)> {
    let (count, conn) = match (got.get(..8), got.get(8..12)) {
        (Some(c), Some(n)) => (c, n),
        _ => return Err(format!("a client's private data is {} bytes, too short for a hello", got.len()).into()),
    };
    let messages = u64::from_le_bytes(count.try_into().map_err(|_| "8 bytes")?);
    let conn = u32::from_le_bytes(conn.try_into().map_err(|_| "4 bytes")?);
    padded(got, &hello(conn, messages), "a client's")?;
    Ok((conn, messages))
}

/// The byte `i` of message `seq` of connection `conn`.
fn pattern(conn: u32, seq: u64, i: usize) -> u8 {
    (conn as u64).wrapping_mul(131).wrapping_add(seq.wrapping_mul(7)).wrapping_add(i as u64) as u8
}

/// Server side of one connection: echoes its messages, then disconnects.
async fn serve(mut c: Conn, size: usize, limit: Duration) -> Res<()> {
    let (mut echo, mut len) = (vec![0u8; size], 0);
    for _ in 0..c.messages {
        tokio::time::timeout(
            limit,
            c.recv(|m| {
                len = m.len().min(size);
                echo[..len].copy_from_slice(&m[..len]);
                Ok(())
            }),
        )
        .await
        .map_err(|_| "server: no message within the timeout")??;
        tokio::time::timeout(limit, c.send(len, |b| b.copy_from_slice(&echo[..len])))
            .await
            .map_err(|_| "server: the echo's send did not complete")??;
    }
    Ok(c.id.disconnect(limit).await.map_err(|e| format!("server: {e}"))?)
}

/// Client side of connection `n`: sends its messages and checks each echo.
async fn talk(n: u32, mut c: Conn, size: usize, limit: Duration) -> Res<()> {
    for seq in 0..c.messages {
        tokio::time::timeout(
            limit,
            c.send(size, |b| b.iter_mut().enumerate().for_each(|(i, x)| *x = pattern(n, seq, i))),
        )
        .await
        .map_err(|_| format!("connection {n}: send {seq} did not complete"))??;
        tokio::time::timeout(
            limit,
            c.recv(|m| {
                let ok = m.len() == size && m.iter().enumerate().all(|(i, &x)| x == pattern(n, seq, i));
                if ok {
                    Ok(())
                } else {
                    Err(format!("connection {n}: echo {seq} differs from what was sent").into())
                }
            }),
        )
        .await
        .map_err(|_| format!("connection {n}: no echo of message {seq}"))??;
    }
    Ok(c.id.disconnect(limit).await.map_err(|e| format!("connection {n}: {e}"))?)
}

/// Accepts one connection (in the task that serves it: the id moves onto an event
/// channel of its own), then serves it.
async fn accept(req: ConnectRequest, size: usize, limit: Duration) -> Res<()> {
    let (conn, messages) = match read_hello(req.private_data()) {
        Ok(hello) => hello,
        Err(e) => {
            let _ = req.id().reject(b"send async_echo's hello");
            return Err(e);
        }
    };
    let mut c = Conn::new(AsyncCmId::tokio(req.into_id())?, size, messages)?;
    c.id.accept(&ConnParam::new().private_data(&welcome(conn, messages)), limit).await?;
    serve(c, size, limit).await
}

/// Accepts `n` connections on `addr` in a loop, each handed to a task of its own that
/// accepts and serves it; returns when all of them are served.
async fn server(
    addr: SocketAddr,
    n: u32,
    size: usize,
    limit: Duration,
    listening: tokio::sync::oneshot::Sender<()>,
) -> Res<()> {
    let listener = CmId::new(&EventChannel::new()?, PortSpace::Tcp)?;
    let mut listener = AsyncCmId::tokio(listener)?;
    listener.id().bind(addr)?;
    listener.id().listen(n)?;
    eprintln!("async_echo: listening on {addr}");
    let _ = listening.send(());
    let mut tasks = Vec::new();
    for _ in 0..n {
        let req = listener.get_request(limit).await?;
        tasks.push(tokio::spawn(accept(req, size, limit)));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// Connects `n` clients to `addr`, each in its own task; returns when all have checked
/// every echo.
async fn clients(addr: SocketAddr, n: u32, messages: u64, size: usize, limit: Duration) -> Res<()> {
    let mut tasks = Vec::new();
    for conn in 0..n {
        tasks.push(tokio::spawn(async move {
            let id = CmId::new(&EventChannel::new()?, PortSpace::Tcp)?;
            let mut id = AsyncCmId::tokio(id)?;
            id.resolve_addr(None, addr, limit).await?;
            id.resolve_route(limit).await?;
            let mut c = Conn::new(id, size, messages)?;
            let established = c.id.connect(&ConnParam::new().private_data(&hello(conn, messages)), limit).await;
            let established = established?;
            padded(established.private_data(), &welcome(conn, messages), "the server's")
                .map_err(|e| format!("connection {conn}: {e}"))?;
            talk(conn, c, size, limit).await
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

fn run(o: &Opts) -> Res<()> {
    let limit = Duration::from_secs(o.timeout);
    let size = o.size as usize;
    let env_addr = || std::env::var("RDMA_IP").ok().and_then(|s| s.parse().ok());
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        if let Some(ip) = o.connect {
            return clients(SocketAddr::new(ip, o.port), o.connections, o.messages, size, limit).await;
        }
        let ip = o.addr.or_else(env_addr).ok_or("no address: give --addr or set RDMA_IP")?;
        let addr = SocketAddr::new(ip, o.port);
        let (listening, ready) = tokio::sync::oneshot::channel();
        if o.server {
            return server(addr, o.connections, size, limit, listening).await;
        }
        let serving = tokio::spawn(server(addr, o.connections, size, limit, listening));
        ready.await.map_err(|_| "the server did not start")?;
        clients(addr, o.connections, o.messages, size, limit).await?;
        serving.await?
    })?;
    if o.server {
        println!("async_echo: served {} connections: every client's private data checked", o.connections);
    } else {
        println!(
            "async_echo: {} connections x {} messages of {size} bytes: every echo matched, private data checked both ways",
            o.connections, o.messages
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let opts = Opts::parse();
    if !(opts.loopback || opts.server || opts.connect.is_some()) {
        eprintln!("async_echo: give --loopback, --server or --connect IP");
        return ExitCode::from(2);
    }
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("async_echo: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_data_is_checked_byte_for_byte_with_zero_padding() {
        let mut got = hello(3, 100);
        assert_eq!(read_hello(&got).unwrap(), (3, 100));
        got.resize(56, 0);
        assert_eq!(read_hello(&got).unwrap(), (3, 100), "rdma_cm pads a connect's 56 bytes with zeros");
        got[40] = 1;
        assert!(read_hello(&got).is_err(), "a non-zero byte past the hello");
        let mut typo = hello(3, 100);
        typo[12] ^= 0x20;
        assert!(read_hello(&typo).is_err());
        assert!(read_hello(&[0; 8]).is_err());
        let w = welcome(3, 100);
        padded(&[&w[..], &[0; 20]].concat(), &w, "the server's").unwrap();
        assert!(padded(&w[..w.len() - 1], &w, "the server's").is_err());
        assert!(padded(&welcome(4, 100), &w, "the server's").is_err());
    }
}
