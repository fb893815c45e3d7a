//! `rdma_client`: librdmacm's `rdma_client` example on the safe API, and a peer for
//! either server (ours, or librdmacm's `rdma_server`).
//!
//! ```text
//! rdma_client [-s server_address] [-p port_number] [-t seconds] [-v]
//!   -s  the server's address (default 127.0.0.1; on RoCE, the IP of a netdev under
//!       an RDMA device)
//!   -p  its port (default 7471)
//!   -t  the bound on every wait (default 30 s; librdmacm's example waits forever)
//!   -v  check that the reply is our message echoed (our rdma_server echoes;
//!       librdmacm's sends 16 zero bytes)
//! ```
//!
//! What goes over the wire is what librdmacm's pair does: an RC connection through
//! rdma_cm (port space TCP, no private data), a QP with one send and one receive of one
//! SGE and 16 bytes of inline data, every send signaled. The client posts its receive,
//! connects, SENDs 16 bytes (inline when the QP allows it), waits for that send to
//! complete, then for the server's 16-byte SEND, and disconnects.
//!
//! Exit status 0 on success, 1 on failure, 2 on a command-line error; like the C
//! example it prints `rdma_client: start` and `rdma_client: end <status>`.
//! `scripts/rxe cargo run --example rdma_client -- -s "$RDMA_IP"` runs it next to rxe.

use std::process::ExitCode;
use std::time::Duration;

#[path = "common/cm_example.rs"]
mod cm_example;
use cm_example::{complete_send, main_with, resolve, seconds, wait_one, BoxError};

use clap::Parser;

use rdma_verbs::{AccessFlags, AlignedBuf, Chunk, CompletionQueue, ProtectionDomain, QpType, QueuePair, SendWr};
use rdma_verbs::{CmId, ConnParam, EventChannel, PortSpace};
use rdma_verbs::{RecvQueue, SendQueue};

/// Message size of librdmacm's example pair.
const MSG_LEN: usize = 16;
const MESSAGE: &[u8; MSG_LEN] = b"rdma-verbs: ping";
/// librdmacm's rdma_create_ep resolves with these timeouts.
const RESOLVE_TIMEOUT: Duration = Duration::from_millis(2000);

/// librdmacm's `rdma_client` flags (`-s`, `-p`), and ours (`-t`, `-v`): short ones only.
#[derive(Parser)]
#[command(name = "rdma_client", about = "librdmacm's rdma_client on rdma-verbs")]
struct Options {
    /// The server's address (on RoCE, the IP of a netdev under an RDMA device).
    #[arg(short = 's', value_name = "server_address", default_value = "127.0.0.1")]
    server: String,
    /// Its port.
    #[arg(short = 'p', value_name = "port_number", default_value_t = 7471)]
    port: u16,
    /// The bound on every wait, in seconds (librdmacm's example waits forever).
    #[arg(short = 't', value_name = "seconds", default_value = "30", value_parser = seconds)]
    timeout: Duration,
    /// Check that the reply is our message echoed (our rdma_server echoes; librdmacm's
    /// sends 16 zero bytes).
    #[arg(short = 'v')]
    verify: bool,
}

fn run(opts: &Options) -> Result<(), BoxError> {
    let dst = resolve(&opts.server, opts.port)?;
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel, PortSpace::Tcp)?;
    id.resolve_addr(None, dst, RESOLVE_TIMEOUT)?;
    id.resolve_route(RESOLVE_TIMEOUT)?;

    let ctx = id.context()?;
    let pd = ProtectionDomain::new(&ctx)?;
    let mut cq = CompletionQueue::new(&ctx, 4)?;
    let builder = QueuePair::builder(&pd, QpType::Rc, &cq, &cq)
        .max_send_wr(1)
        .max_recv_wr(1)
        .max_send_sge(1)
        .max_recv_sge(1)
        .max_inline_data(MSG_LEN as u32)
        .sq_sig_all(true);
    let qp = id.create_qp(builder)?;
    let inline = qp.caps().max_inline_data as usize >= MSG_LEN;
    if !inline {
        println!("rdma_client: device doesn't support IBV_SEND_INLINE, using sge sends");
    }

    let mut bufs: Vec<Chunk> =
        pd.register(AlignedBuf::new(2 * MSG_LEN)?, AccessFlags::LOCAL_WRITE).and_then(|mr| mr.into_chunks(MSG_LEN))?;
    let (mut send_buf, recv_buf) = (bufs.remove(0), bufs.remove(0));
    send_buf.copy_from_slice(MESSAGE);
    let mut rq: RecvQueue<Chunk> = qp.recv_queue()?;
    let mut sq: SendQueue<Chunk> = qp.send_queue()?;
    rq.post(recv_buf, 0..MSG_LEN, 1)?;

    id.connect(&ConnParam::new(), opts.timeout)?;

    let wr = SendWr::send(send_buf, 0..MSG_LEN).id(2);
    sq.post(if inline { wr.inline() } else { wr })?;
    let mut wc = wait_one(&mut cq, opts.timeout, "send")?;
    complete_send(&mut sq, &mut wc)?;
    let mut wc = wait_one(&mut cq, opts.timeout, "receive")?;
    let got = rq.complete(&mut wc)?.result()?; // a failure names the receive, its id and the QP
    let reply = &got.value[..got.byte_len as usize];
    println!("rdma_client: received {} bytes: {:02x?}", reply.len(), reply);
    if got.byte_len as usize != MSG_LEN {
        return Err(format!("expected a {MSG_LEN}-byte reply, got {} bytes", got.byte_len).into());
    }
    if opts.verify && reply != MESSAGE {
        return Err(format!("the reply is not our message echoed: {reply:02x?}").into());
    }
    // The server may have disconnected already; like librdmacm's example, ignore that.
    if let Err(e) = id.disconnect() {
        eprintln!("rdma_client: disconnect: {e}");
    }
    Ok(())
}

fn main() -> ExitCode {
    main_with("rdma_client", Options::parse(), run)
}
