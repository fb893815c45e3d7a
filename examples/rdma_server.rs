//! `rdma_server`: librdmacm's `rdma_server` example on the safe API, and a peer for
//! either client (ours, or librdmacm's `rdma_client`).
//!
//! ```text
//! rdma_server [-s server_address] [-p port_number] [-t seconds]
//!   -s  the address to listen on (default 0.0.0.0, every address)
//!   -p  the port (default 7471)
//!   -t  the bound on every wait, the wait for a client included (default 60 s;
//!       librdmacm's example waits forever)
//! ```
//!
//! It serves one client the way librdmacm's example does: RC through rdma_cm (port
//! space TCP, no private data), a QP with one send and one receive of one SGE and 16
//! bytes of inline data, every send signaled. It posts its receive before accepting,
//! waits for the client's 16-byte SEND, SENDs 16 bytes back (inline when the QP allows
//! it), waits for that send to complete and disconnects. Where the C example sends 16
//! zero bytes, this one echoes what it received, which the C client does not check and
//! our client can (`rdma_client -v`).
//!
//! Once it listens it prints `rdma_server: listening on ADDR:PORT` (a line the C
//! example does not have), so that scripts know when to start the client. Exit status
//! 0 on success, 1 on failure, 2 on a command-line error; like the C example it prints
//! `rdma_server: start` and `rdma_server: end <status>`.

use std::io::Write;
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

/// librdmacm's `rdma_server` flags (`-s`, `-p`), and ours (`-t`): short ones only.
#[derive(Parser)]
#[command(name = "rdma_server", about = "librdmacm's rdma_server on rdma-verbs")]
struct Options {
    /// The address to listen on (0.0.0.0: every address).
    #[arg(short = 's', value_name = "server_address", default_value = "0.0.0.0")]
    address: String,
    /// The port.
    #[arg(short = 'p', value_name = "port_number", default_value_t = 7471)]
    port: u16,
    /// The bound on every wait, the wait for a client included, in seconds (librdmacm's
    /// example waits forever).
    #[arg(short = 't', value_name = "seconds", default_value = "60", value_parser = seconds)]
    timeout: Duration,
}

fn run(opts: &Options) -> Result<(), BoxError> {
    let addr = resolve(&opts.address, opts.port)?;
    let channel = EventChannel::new()?;
    let listener = CmId::new(&channel, PortSpace::Tcp)?;
    listener.bind(addr)?;
    listener.listen(0)?;
    println!("rdma_server: listening on {}", listener.local_addr().unwrap_or(addr));
    // Scripts wait for that line: do not leave it in a pipe's buffer.
    std::io::stdout().flush()?;

    let id = listener.get_request(opts.timeout)?.into_id();
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
        println!("rdma_server: device doesn't support IBV_SEND_INLINE, using sge sends");
    }

    let mut bufs: Vec<Chunk> =
        pd.register(AlignedBuf::new(2 * MSG_LEN)?, AccessFlags::LOCAL_WRITE).and_then(|mr| mr.into_chunks(MSG_LEN))?;
    let (mut send_buf, recv_buf) = (bufs.remove(0), bufs.remove(0));
    let mut rq: RecvQueue<Chunk> = qp.recv_queue()?;
    let mut sq: SendQueue<Chunk> = qp.send_queue()?;
    rq.post(recv_buf, 0..MSG_LEN, 1)?;

    id.accept(&ConnParam::new(), opts.timeout)?;

    let mut wc = wait_one(&mut cq, opts.timeout, "receive")?;
    let got = rq.complete(&mut wc)?.result()?; // a failure names the receive, its id and the QP
    let msg = &got.value[..got.byte_len as usize];
    println!("rdma_server: received {} bytes: {:02x?}", msg.len(), msg);
    let n = msg.len().min(MSG_LEN);
    send_buf[..n].copy_from_slice(&msg[..n]);

    let wr = SendWr::send(send_buf, 0..MSG_LEN).id(2);
    sq.post(if inline { wr.inline() } else { wr })?;
    let mut wc = wait_one(&mut cq, opts.timeout, "send")?;
    complete_send(&mut sq, &mut wc)?;
    // Like librdmacm's example: the client may be gone already, which is no failure.
    if let Err(e) = id.disconnect() {
        eprintln!("rdma_server: disconnect: {e}");
    }
    Ok(())
}

fn main() -> ExitCode {
    main_with("rdma_server", Options::parse(), run)
}
