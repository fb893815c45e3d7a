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

use std::process::ExitCode;
use std::time::Duration;

#[path = "common/pingpong.rs"]
mod pingpong;
use pingpong::{at_least_one, number, seconds, service_level, AnyError, Buffers, Local, Rounds, Traffic, FILL};

use clap::Parser;
use rdma_verbs::{
    AddressHandle, AhAttr, Chunk, Context, Gid, InitAttr, ProtectionDomain, QpType, QueuePair, RemoteQpInfo, SendWr,
    WcFlags, WorkCompletion, DEFAULT_QKEY,
};

/// The global route header that starts every UD receive.
const GRH: usize = 40;

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
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = seconds)]
    timeout: Duration,
    /// The server to connect to (none: be the server).
    server: Option<String>,
}

/// The address handle towards the peer: by its GID when it sent one, else by its LID.
fn peer_ah(
    pd: &ProtectionDomain,
    o: &Options,
    local: &Local,
    remote: &RemoteQpInfo,
) -> Result<AddressHandle, AnyError> {
    let attr = AhAttr { sl: o.sl, ..AhAttr::new(o.ib_port, pingpong::path_to(local, remote)) };
    Ok(AddressHandle::new(pd, &attr)?)
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

/// The datagrams to the peer through its address handle, the check of every datagram
/// that arrives, and how many passed.
struct Datagrams<'a> {
    size: usize,
    remote: &'a RemoteQpInfo,
    ah: &'a AddressHandle,
    checked: u64,
}

impl Traffic for Datagrams<'_> {
    /// What the C tool sends: its buffer as it is, all [`FILL`].
    fn send_wr(&mut self, _: u64, buf: Chunk) -> SendWr<Chunk> {
        SendWr::send_ud(buf, 0..self.size, self.ah, self.remote.qpn, DEFAULT_QKEY)
    }

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
        if pingpong::has_interface_id(&remote.gid) {
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

    fn stalled(&self, timeout: Duration, received: u64, sent: u64) -> AnyError {
        format!(
            "no completion for {timeout:?} after {received} datagrams in and {sent} out: is the peer alive? \
             (a lost datagram stalls a UD ping-pong)"
        )
        .into()
    }
}

fn run(o: &Options) -> Result<(), AnyError> {
    let ctx = Context::open(o.device.as_deref())?;
    let mtu = ctx.query_port(o.ib_port)?.active_mtu.bytes() as usize;
    if o.size > mtu {
        return Err(
            format!("-s {} is larger than the port's active MTU ({mtu}): a datagram is one packet", o.size).into()
        );
    }
    let pd = ProtectionDomain::new(&ctx)?;
    let mut cq = pingpong::completion_queue(&ctx, o.rx_depth, o.events)?;
    let qp = QueuePair::builder(&pd, QpType::Ud, &cq, &cq)
        .max_send_wr(1)
        .max_recv_wr(o.rx_depth)
        .max_send_sge(1)
        .max_recv_sge(1)
        .build()?;
    qp.ready_ud(&InitAttr { port: o.ib_port, qkey: DEFAULT_QKEY, ..InitAttr::default() })?;
    // Each receive with room for the GRH.
    let mut buffers = Buffers::post(&pd, &qp, o.rx_depth, o.size + GRH, &format!("(size + {GRH})"))?;
    if o.events {
        cq.arm(false)?;
    }

    let client = o.server.is_some();
    let local = pingpong::local_address(&ctx, &qp, o.ib_port, o.gid_index)?;
    pingpong::print_address("local address: ", &local.info);
    let mut s = pingpong::tcp_stream(o.server.as_deref(), o.port, o.timeout)?;
    let remote = pingpong::exchange(&mut s, &local.info, client, |_| Ok(()))?;
    let ah = peer_ah(&pd, o, &local, &remote)?;

    let inline = o.size <= qp.caps().max_inline_data as usize;
    let rounds = Rounds { iters: o.iters, events: o.events, timeout: o.timeout, client, inline };
    let mut datagrams = Datagrams { size: o.size, remote: &remote, ah: &ah, checked: 0 };
    let elapsed = pingpong::ping_pong(&mut cq, &mut buffers, &rounds, &mut datagrams)?;
    pingpong::print_result(o.size, o.iters, elapsed);
    println!(
        "ud_pingpong: {} datagrams checked: {} bytes of {FILL:#04x} each, from QPN {:#08x} at GID {}",
        datagrams.checked, o.size, remote.qpn, remote.gid
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
        let mapped = Gid::from(std::net::Ipv4Addr::new(10, 98, 0, 2));
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
