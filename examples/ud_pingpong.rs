//! `ud_pingpong`: rdma-core's `ibv_ud_pingpong` on the safe crate. SENDs go over an
//! unreliable datagram (UD) QP, each through an address handle built from the peer's GID
//! (its LID on InfiniBand without `-g`). It speaks the C tool's TCP exchange, so it works
//! with `ibv_ud_pingpong` in either role, and with itself.
//!
//! ```text
//! ud_pingpong [OPTIONS]          start a server and wait for a connection
//! ud_pingpong [OPTIONS] HOST     connect to the server at HOST
//!   -p, --port <PORT>          listen on / connect to TCP port PORT (default 18515)
//!   -d, --ib-dev <DEV>         use RDMA device DEV (default: the first one)
//!   -i, --ib-port <PORT>       use port PORT of the device (default 1)
//!   -s, --size <SIZE>          size of each message (default 2048; at most the port's
//!                              active MTU)
//!   -r, --rx-depth <N>         receives kept posted (default 500)
//!   -n, --iters <N>            number of exchanges (default 1000)
//!   -l, --sl <SL>              service level (default 0)
//!   -e, --events               sleep on completion events instead of polling
//!   -g, --gid-idx <INDEX>      local GID index (default: on RoCE the IPv4 RoCE v2 GID,
//!                              on InfiniBand none)
//!       --timeout <SECS>       give up after SECS without progress (default 60)
//! ```
//!
//! Like the C tool: the client sends first; each side keeps `rx-depth` receives posted
//! (each `size` + 40 bytes: a UD receive starts with the 40-byte GRH) and sends its next
//! message once its previous send completed and a message arrived, to the Q_Key
//! 0x11111111; at the end it prints `N bytes in T seconds = X Mbit/sec` and
//! `N iters in T seconds = Y usec/iter`. Unlike it, every datagram that arrives is
//! checked: it carries `size` bytes after the GRH, all 0x7b (what the C tool sends: its
//! buffer starts as 0x7b and it sends back what it received), it comes from the peer's
//! QP, and its GRH names the peer's GID as the source (on RoCE v2 over IPv4, the source
//! address of the IPv4 header in the GRH's last 20 bytes). Then it prints
//! `ud_pingpong: N datagrams checked: ...`. Without `-g`, a RoCE port picks its GID by
//! itself; the C tool needs `-g` there.
//!
//! The exchange is `ibv_rc_pingpong`'s (`rdma_verbs::wire::pingpong`): the client sends
//! `"LLLL:QQQQQQ:PPPPPP:GID"`, the server answers with its own, the client ends with
//! `"done"`. The QPN is what the peer's datagrams are addressed to, the GID what its
//! address handle is built from; the PSN is carried but UD has no use for it.
//!
//! Exit codes: 0 on success, 1 on any failure, 2 on a command-line error.
//! `scripts/multihost` runs it across two nodes against `ibv_ud_pingpong` in both roles
//! and against itself.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use rdma_verbs::wire::pingpong;
use rdma_verbs::{
    AccessFlags, AddressHandle, AhAttr, AlignedBuf, Chunk, CompletionQueue, Context, Gid, InitAttr, ProtectionDomain,
    QpType, QueuePair, RecvQueue, Remote, RemoteQpInfo, SendQueue, SendWr, WcFlags, WorkCompletion, DEFAULT_QKEY,
};

/// What the C tool fills its buffer with: every message it sends is this byte.
const FILL: u8 = 0x7b;
/// The global route header that starts every UD receive.
const GRH: usize = 40;
/// Registered memory this example agrees to use: (rx-depth + 1) x (size + 40).
const MAX_MEMORY: usize = 1 << 30;

/// A number as strtoul(.., 0) reads it: decimal, or hex after `0x`.
fn number<T: TryFrom<u64>>(s: &str) -> Result<T, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse::<u64>(),
    };
    v.ok().and_then(|v| T::try_from(v).ok()).ok_or_else(|| format!("{s:?} is not a number in range"))
}

fn at_least_one<T: TryFrom<u64> + PartialEq + From<u8>>(s: &str) -> Result<T, String> {
    let v = number::<T>(s)?;
    if v == T::from(0) {
        return Err("must be at least 1".into());
    }
    Ok(v)
}

fn service_level(s: &str) -> Result<u8, String> {
    number::<u8>(s).and_then(|v| if v <= 15 { Ok(v) } else { Err("service levels are 0..=15".into()) })
}

#[derive(Parser, Debug)]
#[command(name = "ud_pingpong", about = "UD ping-pong (rdma-core's ibv_ud_pingpong, on rdma-verbs)")]
struct Options {
    /// Listen on / connect to this TCP port.
    #[arg(short = 'p', long = "port", default_value = "18515", value_parser = number::<u16>)]
    port: u16,
    /// RDMA device (default: the first one).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Port of the device, from 1.
    #[arg(short = 'i', long = "ib-port", default_value = "1", value_parser = at_least_one::<u8>)]
    ib_port: u8,
    /// Size of each message, at most the port's active MTU.
    #[arg(short = 's', long = "size", default_value = "2048", value_parser = at_least_one::<usize>)]
    size: usize,
    /// Receives kept posted.
    #[arg(short = 'r', long = "rx-depth", default_value = "500", value_parser = at_least_one::<u32>)]
    rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long = "iters", default_value = "1000", value_parser = at_least_one::<u64>)]
    iters: u64,
    /// Service level (0..=15).
    #[arg(short = 'l', long = "sl", default_value = "0", value_parser = service_level)]
    sl: u8,
    /// Sleep on completion events instead of polling.
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// Local GID index (default: on RoCE the IPv4 RoCE v2 GID, on InfiniBand none).
    #[arg(short = 'g', long = "gid-idx", value_name = "INDEX", value_parser = number::<u32>)]
    gid_index: Option<u32>,
    /// Give up after this many seconds without progress.
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = number::<u64>)]
    timeout: u64,
    /// The server to connect to (none: be the server).
    server: Option<String>,
}

type AnyError = Box<dyn std::error::Error>;

/// This side's address, as the exchange sends it, and the GID index it sends from.
struct Local {
    info: RemoteQpInfo,
    sgid_index: u32,
}

fn local_address(ctx: &Context, qp: &QueuePair, o: &Options) -> Result<Local, AnyError> {
    let port = ctx.query_port(o.ib_port)?;
    if !port.is_ethernet() && port.lid == 0 {
        return Err(format!("port {} has no LID (is the subnet manager running?)", o.ib_port).into());
    }
    let (sgid_index, gid) = match o.gid_index {
        Some(i) => (i, ctx.query_gid(o.ib_port, i)?.gid),
        None if port.is_ethernet() => {
            let e = ctx.default_gid(o.ib_port)?;
            (e.index, e.gid)
        }
        // Like the C tool without -g: no GID, addressed by LID.
        None => (0, Gid::default()),
    };
    Ok(Local { info: RemoteQpInfo { qpn: qp.qp_num(), psn: qp.psn(), lid: port.lid, gid }, sgid_index })
}

fn print_address(label: &str, a: &RemoteQpInfo) {
    println!("  {label} LID {:#06x}, QPN {:#08x}, PSN {:#08x}, GID {}", a.lid, a.qpn, a.psn, a.gid);
}

/// A GID with an interface ID (its last 8 bytes) is one to route by, as the C tool decides.
fn has_interface_id(gid: &Gid) -> bool {
    gid.0[8..] != [0; 8]
}

/// The address handle towards the peer: by its GID when it sent one, else by its LID.
fn peer_ah(
    pd: &ProtectionDomain,
    o: &Options,
    local: &Local,
    remote: &RemoteQpInfo,
) -> Result<AddressHandle, AnyError> {
    let remote_path =
        if has_interface_id(&remote.gid) { Remote::gid(remote.gid, local.sgid_index) } else { Remote::lid(remote.lid) };
    let attr = AhAttr { sl: o.sl, ..AhAttr::new(o.ib_port, remote_path) };
    Ok(AddressHandle::new(pd, &attr)?)
}

fn read_msg<const N: usize>(s: &mut TcpStream, what: &str) -> Result<[u8; N], AnyError> {
    let mut buf = [0u8; N];
    s.read_exact(&mut buf).map_err(|e| format!("{what}: {e}"))?;
    Ok(buf)
}

fn tcp_stream(o: &Options) -> Result<TcpStream, AnyError> {
    let s = match &o.server {
        Some(host) => TcpStream::connect((host.as_str(), o.port))
            .map_err(|e| format!("couldn't connect to {host}:{}: {e}", o.port))?,
        None => {
            let listener = TcpListener::bind(("0.0.0.0", o.port))
                .map_err(|e| format!("couldn't listen on TCP port {}: {e}", o.port))?;
            let (s, _) = listener.accept().map_err(|e| format!("accept failed: {e}"))?;
            s
        }
    };
    let timeout = Some(Duration::from_secs(o.timeout));
    s.set_read_timeout(timeout)?;
    s.set_write_timeout(timeout)?;
    Ok(s)
}

/// rdma-core's exchange: the client's address, the server's, the client's "done".
fn exchange(o: &Options, local: &Local) -> Result<RemoteQpInfo, AnyError> {
    let mut s = tcp_stream(o)?;
    let mine = pingpong::encode(&local.info)?;
    if o.server.is_some() {
        s.write_all(&mine)?;
        let msg = read_msg::<{ pingpong::MSG_LEN }>(&mut s, "reading the server's address")?;
        let remote = pingpong::decode(&msg).map_err(|e| format!("the server's address: {e}"))?;
        s.write_all(&pingpong::DONE)?;
        Ok(remote)
    } else {
        let msg = read_msg::<{ pingpong::MSG_LEN }>(&mut s, "reading the client's address")?;
        let remote = pingpong::decode(&msg).map_err(|e| format!("the client's address: {e}"))?;
        s.write_all(&mine)?;
        let done = read_msg::<{ pingpong::DONE.len() }>(&mut s, "reading the client's \"done\"")?;
        pingpong::check_done(&done).map_err(|e| format!("the client's last message: {e}"))?;
        Ok(remote)
    }
}

/// Whether the 40 bytes that precede a datagram name `gid` as its source. On RoCE v2 over
/// IPv4 (an IPv4-mapped GID) they are 20 unused bytes and the packet's IPv4 header, whose
/// source address sits at offset 12; otherwise they are a GRH, whose source GID sits at
/// offset 8.
fn grh_source_is(grh: &[u8], gid: &Gid) -> bool {
    let g = &gid.0;
    if g[..10] == [0; 10] && g[10..12] == [0xff, 0xff] {
        grh.get(32..36) == Some(&g[12..16])
    } else {
        grh.get(8..24) == Some(&g[..])
    }
}

/// The check of every datagram that arrives, and what it saw.
struct Arrivals<'a> {
    size: usize,
    remote: &'a RemoteQpInfo,
    checked: u64,
}

impl Arrivals<'_> {
    /// Datagram `n`: its length, its source QP and GID, then its bytes.
    fn check(&mut self, n: u64, wc: &WorkCompletion, byte_len: u32, buf: &[u8]) -> Result<(), AnyError> {
        let (size, remote) = (self.size, self.remote);
        if byte_len as usize != GRH + size {
            return Err(format!(
                "datagram {n}: {byte_len} bytes arrived, {} expected ({GRH} of GRH and {size}: is -s the same on both sides?)",
                GRH + size
            )
            .into());
        }
        if wc.src_qp() != remote.qpn {
            return Err(
                format!("datagram {n} came from QP {:#x}, not the peer's {:#x}", wc.src_qp(), remote.qpn).into()
            );
        }
        if has_interface_id(&remote.gid) {
            if !wc.wc_flags().contains(WcFlags::GRH) {
                return Err(
                    format!("datagram {n} came without a GRH, but the peer sends from GID {}", remote.gid).into()
                );
            }
            if !grh_source_is(&buf[..GRH], &remote.gid) {
                return Err(
                    format!("datagram {n}: its GRH names another source than the peer's GID {}", remote.gid).into()
                );
            }
        }
        if let Some(i) = buf[GRH..GRH + size].iter().position(|&b| b != FILL) {
            return Err(format!("datagram {n}: byte {i} is {:#04x}, not {FILL:#04x}", buf[GRH + i]).into());
        }
        self.checked += 1;
        Ok(())
    }
}

const RECV: u8 = 1;
const SEND: u8 = 2;

fn run(o: &Options) -> Result<(), AnyError> {
    let ctx = Context::open(o.device.as_deref())?;
    let mtu = ctx.query_port(o.ib_port)?.active_mtu.bytes() as usize;
    if o.size > mtu {
        return Err(
            format!("-s {} is larger than the port's active MTU ({mtu}): a datagram is one packet", o.size).into()
        );
    }
    let pd = ProtectionDomain::new(&ctx)?;
    let cqe = o.rx_depth + 1;
    let mut cq = if o.events {
        CompletionQueue::builder(&ctx, cqe).with_channel().build()?
    } else {
        CompletionQueue::new(&ctx, cqe)?
    };
    let qp = QueuePair::builder(&pd, QpType::Ud, &cq, &cq)
        .max_send_wr(1)
        .max_recv_wr(o.rx_depth)
        .max_send_sge(1)
        .max_recv_sge(1)
        .build()?;
    qp.ready_ud(&InitAttr { port: o.ib_port, qkey: DEFAULT_QKEY, ..InitAttr::default() })?;

    // One buffer per posted receive (a posted buffer belongs to the device until its
    // completion), each with room for the GRH, and one to send from.
    let chunk = o.size + GRH;
    let total = (o.rx_depth as usize + 1)
        .checked_mul(chunk)
        .filter(|&t| t <= MAX_MEMORY)
        .ok_or_else(|| format!("(rx-depth + 1) x (size + {GRH}) is above {MAX_MEMORY} bytes: lower -r or -s"))?;
    let mut chunks = pd.register(AlignedBuf::new(total)?, AccessFlags::LOCAL_WRITE)?.into_chunks(chunk)?;
    let mut send_buf: Option<Chunk> = chunks.pop();
    if let Some(b) = send_buf.as_mut() {
        b.fill(FILL);
    }
    let mut rq: RecvQueue<Chunk> = qp.recv_queue()?;
    let mut sq: SendQueue<Chunk> = qp.send_queue()?;
    for c in chunks {
        rq.post(c, 0..chunk, 0)?;
    }
    if o.events {
        cq.arm(false)?;
    }

    let local = local_address(&ctx, &qp, o)?;
    print_address("local address: ", &local.info);
    let remote = exchange(o, &local)?;
    print_address("remote address:", &remote);
    let ah = peer_ah(&pd, o, &local, &remote)?;

    let inline = o.size <= qp.caps().max_inline_data as usize;
    let post_send = |sq: &mut SendQueue<Chunk>, buf: Option<Chunk>| -> Result<(), AnyError> {
        let buf = buf.ok_or("the send buffer is still posted")?;
        let wr = SendWr::send_ud(buf, 0..o.size, &ah, remote.qpn, DEFAULT_QKEY);
        sq.post(if inline { wr.inline() } else { wr })?;
        Ok(())
    };

    let timeout = Duration::from_secs(o.timeout);
    let mut arrivals = Arrivals { size: o.size, remote: &remote, checked: 0 };
    let start = Instant::now();
    let mut pending = RECV;
    if o.server.is_some() {
        post_send(&mut sq, send_buf.take())?;
        pending |= SEND;
    }
    let (mut rcnt, mut scnt) = (0u64, 0u64);
    let mut wcs = [WorkCompletion::EMPTY; 2];
    let mut progress = Instant::now();
    while rcnt < o.iters || scnt < o.iters {
        if o.events {
            cq.wait(Some(timeout))?;
            cq.arm(false)?;
        }
        let n = cq.poll(&mut wcs)?.len();
        if n == 0 {
            if progress.elapsed() > timeout {
                return Err(format!(
                    "no completion for {timeout:?} after {rcnt} datagrams in and {scnt} out: is the peer alive? \
                     (a lost datagram stalls a UD ping-pong)"
                )
                .into());
            }
            continue;
        }
        progress = Instant::now();
        for wc in &mut wcs[..n] {
            wc.ok()?;
            if wc.opcode().is_recv() {
                let done = rq.complete(wc)?;
                arrivals.check(rcnt, wc, done.byte_len, &done.buf[..chunk])?;
                rq.post(done.buf, 0..chunk, 0)?;
                rcnt += 1;
                pending &= !RECV;
            } else {
                sq.complete(wc, |d| send_buf = Some(d.buf))?;
                scnt += 1;
                pending &= !SEND;
            }
            if scnt < o.iters && pending == 0 {
                post_send(&mut sq, send_buf.take())?;
                pending = RECV | SEND;
            }
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let bytes = o.size as u64 * o.iters * 2;
    println!("{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec", usec / 1e6, bytes as f64 * 8.0 / usec);
    println!("{} iters in {:.2} seconds = {:.2} usec/iter", o.iters, usec / 1e6, usec / o.iters as f64);
    println!(
        "ud_pingpong: {} datagrams checked: {} bytes of {FILL:#04x} each, from QPN {:#08x} at GID {}",
        arrivals.checked, o.size, remote.qpn, remote.gid
    );
    Ok(())
}

fn main() -> ExitCode {
    let opts = Options::parse();
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ud_pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Options::try_parse_from(std::iter::once("ud_pingpong").chain(args.iter().copied()))
    }

    #[test]
    fn flags_are_the_c_tools() {
        let o = parse(&["-d", "rxe0", "-g1", "--port=18600", "-n", "0x10", "-s", "512", "-e", "10.98.0.1"]).unwrap();
        assert_eq!(o.device.as_deref(), Some("rxe0"));
        assert_eq!((o.gid_index, o.port, o.iters, o.size, o.events), (Some(1), 18600, 16, 512, true));
        assert_eq!(o.server.as_deref(), Some("10.98.0.1"));
        let o =
            parse(&["--ib-dev", "mlx5_0", "--gid-idx", "3", "--rx-depth", "8", "--iters", "5", "--sl", "2"]).unwrap();
        assert_eq!((o.device.as_deref(), o.gid_index, o.rx_depth, o.iters, o.sl), (Some("mlx5_0"), Some(3), 8, 5, 2));
        let d = parse(&[]).unwrap();
        assert_eq!((d.port, d.ib_port, d.size, d.iters, d.rx_depth, d.sl), (18515, 1, 2048, 1000, 500, 0));
        assert!(d.server.is_none() && d.gid_index.is_none() && !d.events);
    }

    #[test]
    fn bad_flags_are_errors() {
        for bad in [&["-p", "70000"][..], &["-x"], &["a", "b"], &["-s", "0"], &["-n"], &["-l", "16"], &["-i", "0"]] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_grh_source_is_read_where_roce_v2_and_ib_put_it() {
        // RoCE v2 over IPv4: 20 unused bytes, then an IPv4 header from 10.98.0.2.
        let mapped = Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 98, 0, 2]);
        let mut grh = [0u8; GRH];
        grh[20] = 0x45;
        grh[32..36].copy_from_slice(&[10, 98, 0, 2]);
        assert!(grh_source_is(&grh, &mapped));
        grh[35] = 1;
        assert!(!grh_source_is(&grh, &mapped));
        // A GRH proper: the source GID at bytes 8..24.
        let ib = Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        let mut grh = [0u8; GRH];
        grh[8..24].copy_from_slice(&ib.0);
        assert!(grh_source_is(&grh, &ib));
        assert!(!grh_source_is(&grh[..20], &ib), "a short buffer names no source");
        grh[23] ^= 1;
        assert!(!grh_source_is(&grh, &ib));
    }
}
