//! What `rdma_server` and `rdma_client` share: the `main` that prints librdmacm's
//! start/end lines, address resolution, a bounded wait for one completion and the
//! completion of one send. Included by both with `#[path]`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdma_verbs::{Chunk, CompletionQueue, SendQueue, WorkCompletion};

/// What `run` fails with: the crate's errors (they name the verb, or the operation, your
/// id and the QP of a failed request) and a few of the programs' own.
pub type BoxError = Box<dyn std::error::Error>;

/// The first address `host` resolves to, IPv4 first (RoCE GIDs are mostly IPv4).
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr, BoxError> {
    let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs().map_err(|e| format!("{host}: {e}"))?.collect();
    Ok(addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()).copied().ok_or_else(|| format!("{host}: no address"))?)
}

/// Polls `cq` until one completion arrives, at most `timeout`. Its status is for the
/// queue that posted the request to judge (`Done::result`).
pub fn wait_one(cq: &mut CompletionQueue, timeout: Duration, what: &str) -> Result<WorkCompletion, BoxError> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(wc) = cq.poll_one()? {
            return Ok(wc);
        }
        if Instant::now() > deadline {
            return Err(format!("no {what} completion within {timeout:?}").into());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Takes `wc`, the completion of the one send outstanding on `sq`: a failure is an error
/// that names the operation, its id and the QP.
pub fn complete_send(sq: &mut SendQueue<Chunk>, wc: &mut WorkCompletion) -> Result<(), BoxError> {
    let mut sent = None;
    sq.complete(wc, |done| sent = Some(done.result().map(drop)))?;
    Ok(sent.ok_or("the send's completion finished no request")??)
}

/// The body of both `main`s: `run` between librdmacm's "NAME: start" and "NAME: end
/// STATUS" lines (0 or -1), as its examples print. The flags are parsed before (clap: a
/// bad one exits 2 with the usage, before the start line).
pub fn main_with<O>(name: &str, opts: O, run: impl FnOnce(&O) -> Result<(), BoxError>) -> ExitCode {
    println!("{name}: start");
    let status = match run(&opts) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{name}: {e}");
            -1
        }
    };
    println!("{name}: end {status}");
    if status == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Seconds, as the `-t` flag takes them.
pub fn seconds(s: &str) -> Result<Duration, std::num::ParseIntError> {
    s.parse().map(Duration::from_secs)
}
