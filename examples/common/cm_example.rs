//! What `rdma_server` and `rdma_client` share: the `main` that prints librdmacm's
//! start/end lines, address resolution and a bounded wait for one completion. Included by
//! both with `#[path]`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdma_verbs::{CompletionQueue, WorkCompletion};

/// The first address `host` resolves to, IPv4 first (RoCE GIDs are mostly IPv4).
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs().map_err(|e| format!("{host}: {e}"))?.collect();
    addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()).copied().ok_or_else(|| format!("{host}: no address"))
}

/// Polls `cq` until one completion arrives, at most `timeout`.
pub fn wait_one(cq: &mut CompletionQueue, timeout: Duration, what: &str) -> Result<WorkCompletion, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(wc) = cq.poll_one().map_err(|e| e.to_string())? {
            return wc.ok().map(|_| ()).map_err(|e| format!("{what}: {e}")).map(|()| wc);
        }
        if Instant::now() > deadline {
            return Err(format!("no {what} completion within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The body of both `main`s: `run` between librdmacm's "NAME: start" and "NAME: end
/// STATUS" lines (0 or -1), as its examples print. The flags are parsed before (clap: a
/// bad one exits 2 with the usage, before the start line).
pub fn main_with<O>(name: &str, opts: O, run: impl FnOnce(&O) -> Result<(), String>) -> ExitCode {
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
pub fn seconds(s: &str) -> Result<Duration, String> {
    s.parse().map(Duration::from_secs).map_err(|e| format!("{e}"))
}
