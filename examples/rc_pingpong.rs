//! `rc_pingpong`: rdma-core's `ibv_rc_pingpong`, on the safe crate. It speaks the same
//! TCP exchange, so it works with the C tool in either role: `ibv_rc_pingpong` as the
//! server and this as the client, or the other way round.
//!
//! ```text
//! rc_pingpong [OPTIONS]          start a server and wait for a connection
//! rc_pingpong [OPTIONS] HOST     connect to the server at HOST
//!   -p, --port=PORT         listen on / connect to TCP port PORT (default 18515)
//!   -d, --ib-dev=DEV        use RDMA device DEV (default: the first one)
//!   -i, --ib-port=PORT      use port PORT of the device (default 1)
//!   -s, --size=SIZE         size of each message (default 4096)
//!   -m, --mtu=MTU           path MTU: 256, 512, 1024, 2048 or 4096 (default 1024)
//!   -r, --rx-depth=N        receives kept posted (default 500)
//!   -n, --iters=N           number of exchanges (default 1000)
//!   -l, --sl=SL             service level (default 0)
//!   -e, --events            sleep on completion events instead of polling
//!   -g, --gid-idx=INDEX     local GID index (default: on RoCE the IPv4 RoCE v2 GID,
//!                           on InfiniBand none)
//!       --handshake         use rdma-verbs' binary endpoint exchange instead of
//!                           rdma-core's text one (both sides must say so); each
//!                           message then carries a pattern of its own
//!       --timeout=SECS      give up after SECS without progress (default 60)
//!   -h, --help              print this help
//! ```
//!
//! Like the C tool: the client sends first; each side keeps `rx-depth` receives posted,
//! and sends its next message once its previous send completed and a message arrived;
//! at the end it prints `N bytes in T seconds = X Mbit/sec` and
//! `N iters in T seconds = Y usec/iter`. Unlike it, every message that arrives is
//! checked: its length is the message size and its bytes are what the peer sent (the
//! C tool's buffer is all 0x7b; with `--handshake`, a pattern numbered per message).
//! Without `-g`, a RoCE port picks its GID by itself; the C tool needs `-g` there.
//!
//! The exchange: the client sends `"LLLL:QQQQQQ:PPPPPP:GID"` (hex, the GID as 32 digits,
//! NUL-terminated, 52 bytes), the server brings its QP up, answers with its own, and the
//! client ends with `"done"`.
//!
//! Exit codes: 0 on success, 1 on any failure, 2 on a command-line error.
//! Where the host has no RDMA device, `scripts/rxe` gives it one:
//! `scripts/rxe cargo run --example rc_pingpong -- -g 1 & ...`.

use std::process::ExitCode;
use std::time::Duration;

#[path = "common/pingpong.rs"]
mod pingpong;
use pingpong::{at_least_one, number, seconds, service_level, AnyError, Buffers, Local, Rounds, Traffic, FILL};

use clap::{CommandFactory, Parser};
use rdma_verbs::Handshake;
use rdma_verbs::{
    Chunk, Context, InitAttr, Mtu, ProtectionDomain, QpType, QueuePair, RemoteQpInfo, RtrAttr, RtsAttr, SendWr,
    WorkCompletion,
};

/// `ibv_rc_pingpong`'s flags, with its short and long names and defaults.
#[derive(Parser)]
#[command(
    name = "rc_pingpong",
    about = "rdma-core's ibv_rc_pingpong on rdma-verbs: a server without HOST, a client with it"
)]
struct Options {
    /// Listen on / connect to TCP port PORT.
    #[arg(short = 'p', long, value_name = "PORT", default_value = "18515", value_parser = number::<u16>)]
    port: u16,
    /// Use RDMA device DEV (default: the first one).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Use port PORT of the device.
    #[arg(short = 'i', long = "ib-port", value_name = "PORT", default_value = "1", value_parser = ib_port)]
    ib_port: u8,
    /// Size of each message.
    #[arg(short = 's', long, value_name = "SIZE", default_value = "4096", value_parser = at_least_one::<usize>)]
    size: usize,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(short = 'm', long, value_name = "MTU", default_value = "1024", value_parser = mtu)]
    mtu: Mtu,
    /// Receives kept posted.
    #[arg(short = 'r', long = "rx-depth", value_name = "N", default_value = "500", value_parser = at_least_one::<u32>)]
    rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long, value_name = "N", default_value = "1000", value_parser = at_least_one::<u64>)]
    iters: u64,
    /// Service level.
    #[arg(short = 'l', long, value_name = "SL", default_value = "0", value_parser = service_level)]
    sl: u8,
    /// Sleep on completion events instead of polling.
    #[arg(short = 'e', long)]
    events: bool,
    /// Local GID index (default: chosen on RoCE, none on InfiniBand).
    #[arg(short = 'g', long = "gid-idx", value_name = "INDEX", value_parser = number::<u32>)]
    gid_index: Option<u32>,
    /// Use rdma-verbs' endpoint exchange (both sides must say so).
    #[arg(long)]
    handshake: bool,
    /// Give up after SECS without progress.
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = seconds)]
    timeout: Duration,
    /// The C tool's on-demand paging: refused.
    #[arg(short = 'o', long, hide = true)]
    odp: bool,
    /// The C tool's timestamps: refused.
    #[arg(short = 't', long, hide = true)]
    ts: bool,
    /// The server to connect to (none: be the server).
    #[arg(value_name = "HOST")]
    server: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            port: rdma_verbs::wire::pingpong::DEFAULT_PORT,
            device: None,
            ib_port: 1,
            size: 4096,
            mtu: Mtu::Mtu1024,
            rx_depth: 500,
            iters: 1000,
            sl: 0,
            events: false,
            gid_index: None,
            handshake: false,
            timeout: Duration::from_secs(60),
            odp: false,
            ts: false,
            server: None,
        }
    }
}

fn ib_port(s: &str) -> Result<u8, String> {
    at_least_one(s).map_err(|e| if e.starts_with("must") { "ports are numbered from 1".into() } else { e })
}

fn mtu(s: &str) -> Result<Mtu, String> {
    Ok(match number::<u32>(s)? {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        other => return Err(format!("{other} is not 256, 512, 1024, 2048 or 4096")),
    })
}

/// The flags, or clap's error (exit 2, or 0 for `--help`); the C tool's `-o` and `-t`
/// are refused as usage errors.
fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Options, clap::Error> {
    let o = Options::try_parse_from(std::iter::once("rc_pingpong".to_owned()).chain(args))?;
    if o.odp || o.ts {
        let msg = "-o/--odp and -t/--ts (on-demand paging, timestamps) are not supported";
        return Err(Options::command().error(clap::error::ErrorKind::ArgumentConflict, msg));
    }
    Ok(o)
}

/// RTR and RTS towards `remote` with the C tool's attributes: a global route when the
/// remote GID has an interface ID, else its LID.
fn connect_qp(qp: &QueuePair, o: &Options, local: &Local, remote: &RemoteQpInfo) -> Result<(), AnyError> {
    let rtr = RtrAttr {
        port: o.ib_port,
        sl: o.sl,
        path_mtu: o.mtu,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ..RtrAttr::new(pingpong::path_to(local, remote), remote.qpn, remote.psn)
    };
    qp.to_rtr(&rtr)?;
    let rts = RtsAttr { sq_psn: qp.psn(), timeout: 14, retry_cnt: 7, rnr_retry: 7, max_rd_atomic: 1 };
    qp.to_rts(&rts)?;
    Ok(())
}

/// What each message holds, and the check of each arrival. With `--handshake` a message
/// is a fixed body with its number stamped at both ends; else it is all [`FILL`], as the
/// C tool sends. Filling and checking are one copy and one compare (memcpy, memcmp):
/// cheap enough not to show in the timing.
struct Messages {
    numbered: bool,
    body: Vec<u8>,
    scratch: Vec<u8>,
}

impl Messages {
    fn new(o: &Options) -> Self {
        let body = if o.handshake {
            (0..o.size).map(|i| (i as u8).wrapping_mul(31).wrapping_add(7)).collect()
        } else {
            vec![FILL; o.size]
        };
        Messages { numbered: o.handshake, scratch: body.clone(), body }
    }

    /// Writes message `n` into `buf`.
    fn fill(&self, n: u64, buf: &mut [u8]) {
        buf.copy_from_slice(&self.body);
        if self.numbered {
            let len = buf.len();
            let (head, tail) = (n.to_be_bytes(), (!n).to_be_bytes());
            let k = len.min(8);
            buf[..k].copy_from_slice(&head[..k]);
            buf[len - k..].copy_from_slice(&tail[8 - k..]);
        }
    }

    /// Checks message `n` as it arrived: its length, then its bytes.
    fn arrived(&mut self, n: u64, byte_len: u32, got: &[u8]) -> Result<(), AnyError> {
        let size = self.body.len();
        if byte_len as usize != size {
            return Err(format!(
                "message {n}: {byte_len} bytes arrived, {size} expected (is -s the same on both sides?)"
            )
            .into());
        }
        let mut expect = std::mem::take(&mut self.scratch);
        self.fill(n, &mut expect);
        let bad = if got == &expect[..] { None } else { got.iter().zip(&expect).position(|(a, b)| a != b) };
        self.scratch = expect;
        match bad {
            None => Ok(()),
            Some(i) => Err(format!("message {n}: byte {i} is {:#04x}, not what the peer sent", got[i]).into()),
        }
    }
}

impl Traffic for Messages {
    fn send_wr(&mut self, n: u64, mut buf: Chunk) -> SendWr<Chunk> {
        let size = self.body.len();
        self.fill(n, &mut buf[..size]);
        SendWr::send(buf, 0..size)
    }

    fn check(&mut self, n: u64, _: &WorkCompletion, byte_len: u32, buf: &[u8]) -> Result<(), AnyError> {
        self.arrived(n, byte_len, buf)
    }

    fn stalled(&self, timeout: Duration, received: u64, sent: u64) -> AnyError {
        format!("no completion for {timeout:?} after {received} messages in and {sent} out: is the peer alive?").into()
    }
}

/// The QP's handshake (`--handshake`), which brings it to RTS; rdma-core's exchange
/// does that with [`connect_qp`] instead.
fn handshake<'a>(qp: &'a QueuePair, o: &Options) -> Handshake<'a> {
    // The QP's PSN (random) is what both exchanges advertise and what it sends from.
    let handshake = Handshake::new(qp).port(o.ib_port).max_mtu(o.mtu).sl(o.sl);
    let handshake = match o.gid_index {
        Some(i) => handshake.gid_index(i),
        None => handshake,
    };
    handshake.rts(RtsAttr { rnr_retry: 7, max_rd_atomic: 1, ..RtsAttr::default() })
}

fn run(o: &Options) -> Result<(), AnyError> {
    let ctx = Context::open(o.device.as_deref())?;
    let pd = ProtectionDomain::new(&ctx)?;
    let mut cq = pingpong::completion_queue(&ctx, o.rx_depth, o.events)?;
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(1).max_recv_wr(o.rx_depth).build()?;
    let handshake = handshake(&qp, o);
    if o.handshake {
        handshake.init()?;
    } else {
        qp.to_init(&InitAttr { port: o.ib_port, ..InitAttr::default() })?;
    }
    let mut buffers = Buffers::post(&pd, &qp, o.rx_depth, o.size, "size")?;
    if o.events {
        cq.arm(false)?;
    }

    let client = o.server.is_some();
    let tcp_stream = || pingpong::tcp_stream(o.server.as_deref(), o.port, o.timeout);
    if o.handshake {
        pingpong::print_address("local address: ", &handshake.endpoint()?.qp_info());
        let conn = handshake.connect(&mut tcp_stream()?)?;
        pingpong::print_address("remote address:", &conn.remote.qp_info());
    } else {
        let local = pingpong::local_address(&ctx, &qp, o.ib_port, o.gid_index)?;
        pingpong::print_address("local address: ", &local.info);
        pingpong::exchange(&mut tcp_stream()?, &local.info, client, |remote| connect_qp(&qp, o, &local, remote))?;
    }

    let inline = o.size <= qp.caps().max_inline_data as usize;
    let rounds = Rounds { iters: o.iters, events: o.events, timeout: o.timeout, client, inline };
    let elapsed = pingpong::ping_pong(&mut cq, &mut buffers, &rounds, &mut Messages::new(o))?;
    pingpong::print_result(o.size, o.iters, elapsed);
    Ok(())
}

fn main() -> ExitCode {
    let opts = parse_args(std::env::args().skip(1)).unwrap_or_else(|e| e.exit());
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rc_pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn flags_read_like_getopt() {
        let o = parse(&["-d", "rxe0", "-g1", "--port=18600", "-n", "0x10", "--mtu", "2048", "127.0.0.1"]).unwrap();
        assert_eq!(o.device.as_deref(), Some("rxe0"));
        assert_eq!((o.gid_index, o.port, o.iters, o.mtu), (Some(1), 18600, 16, Mtu::Mtu2048));
        assert_eq!(o.server.as_deref(), Some("127.0.0.1"));
        let d = parse(&[]).unwrap();
        assert_eq!((d.port, d.size, d.iters, d.rx_depth, d.mtu), (18515, 4096, 1000, 500, Mtu::Mtu1024));
        assert!(d.server.is_none());
    }

    #[test]
    fn bad_flags_are_errors() {
        for bad in [&["-m", "1000"][..], &["-p", "70000"], &["-x"], &["a", "b"], &["-s", "0"], &["-n"], &["-t"]] {
            let e = parse(bad).err().unwrap_or_else(|| panic!("{bad:?} was accepted"));
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
        }
        for bad in [&["-i", "0"][..], &["-l", "16"], &["-r", "0"], &["--events=1"], &["-o"], &["--ts"]] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse(&["-h"]).err().map(|e| e.exit_code()), Some(0), "--help exits 0");
    }

    #[test]
    fn messages_are_numbered_with_handshake_and_all_0x7b_without() {
        for size in [1, 5, 64] {
            let o = Options { handshake: true, size, ..Options::default() };
            let mut m = Messages::new(&o);
            let (mut a, mut b) = (vec![0u8; size], vec![0u8; size]);
            m.fill(3, &mut a);
            m.fill(4, &mut b);
            assert_ne!(a, b, "size {size}");
            m.arrived(3, size as u32, &a).unwrap();
            assert!(m.arrived(4, size as u32, &a).is_err());
            assert!(m.arrived(3, size as u32 - 1, &a).is_err());
        }
        let mut c = Messages::new(&Options { size: 64, ..Options::default() });
        c.arrived(0, 64, &[FILL; 64]).unwrap();
        let mut off = [FILL; 64];
        off[9] = 0;
        let e = c.arrived(0, 64, &off).unwrap_err().to_string();
        assert!(e.contains("byte 9 is 0x00"), "{e}");
    }
}
