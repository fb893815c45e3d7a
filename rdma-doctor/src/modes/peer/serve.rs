//! The server: `rdma-doctor --serve` answers each probe with a QP of its own.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;

use super::bed::{Bed, BIG, BIG_WRITE_AT};
use super::door::{self, Limits};
use super::probe::sized_pattern;
use crate::modes::fresh::Reports;
use crate::modes::gate::AllowList;

use super::{parse_hello, pattern, read_line, send_hello, send_line, Control, End, PeerOptions, ServeOptions};
use crate::facts::loopback::{same, ADD, ATOMIC_AT, FIRST_VALUE, LEN, SWAP};
use crate::modes::fleet::wire;

/// Serves probes on `opts.tcp_port` of `door.listen`, up to [`super::MAX_PROBES`] at
/// once, each with its own QP and bounded by the limits the module describes; returns
/// after the first probe that completes its hello and ends when `once` (0 when this side's
/// checks passed). Only clients of `door.allow` get in, and with `opts.secret` only those
/// that prove it. What happens to each connection is logged on `log`. A fleet collector's
/// request in place of a hello ([`crate::modes::fleet::wire`]) gets a report of `reports`, or a
/// probe of another node that `door.allow` admits.
pub fn serve(
    door: &ServeOptions,
    once: bool,
    opts: &PeerOptions,
    reports: Option<Arc<Reports>>,
    log: &mut dyn Write,
) -> Result<i32, String> {
    let at = SocketAddr::new(door.listen, opts.tcp_port);
    let listener = TcpListener::bind(at).map_err(|e| format!("listening on TCP {at}: {e}"))?;
    let limits = Limits { allow: door.allow.clone(), secret: opts.secret.clone(), ..Limits::for_timeout(opts.timeout) };
    let _ = writeln!(
        log,
        "rdma-doctor: serving peer probes on TCP {at} ({} at once, each within {:?}) to {}{}",
        limits.probes,
        limits.exchange,
        limits.allow,
        if limits.secret.is_some() { " with the secret" } else { "" }
    );
    let (opts, allow) = (opts.clone(), door.allow.clone());
    let answer = move |mut ctl: Control, hello: String| match wire::parse_request(&hello) {
        None => answer(ctl, &hello, &opts),
        Some(asked) => {
            let report = || match &reports {
                Some(r) => r.get().map(|f| f.report),
                None => Err("this node has no report".to_owned()),
            };
            // At most this node's own timeout: the probe then ends within the door's
            // deadline for this connection, and the answer gets out.
            let probe = |peer: &str, asked: std::time::Duration| {
                let popts = PeerOptions { timeout: asked.min(opts.timeout), ..opts.clone() };
                // The address checked is the one probed: a name that resolves anew cannot
                // lead the probe elsewhere.
                Ok(match peer_admitted(peer, opts.tcp_port, &allow)? {
                    None => super::probe(peer, &popts),
                    Some(at) => super::PeerReport { peer: peer.to_owned(), ..super::probe(&at.to_string(), &popts) },
                })
            };
            send_line(&mut ctl, wire::answer(asked, report, probe).trim_end())
        }
    };
    door::serve(listener, &limits, once, answer, log)
}

/// Whether a fleet's probe request may name `peer` (`HOST[:PORT]`): every address it
/// resolves to is in `allow`. `Some` of the first of them, to be probed; `None` with no
/// `--allow` (any peer, resolved by the probe).
pub fn peer_admitted(peer: &str, port: u16, allow: &AllowList) -> Result<Option<SocketAddr>, String> {
    if allow.is_open() {
        return Ok(None);
    }
    let addrs: Vec<SocketAddr> = wire::with_port(peer, port)
        .to_socket_addrs()
        .map_err(|e| format!("refused: cannot resolve the peer {peer} to check it against --allow: {e}"))?
        .collect();
    match addrs.iter().find(|a| !allow.admits(a.ip())) {
        _ if addrs.is_empty() => Err(format!("refused: the peer {peer} resolves to no address")),
        Some(a) => Err(format!("refused: the peer {peer} ({}) is outside this node's --allow ({allow})", a.ip())),
        None => Ok(addrs.first().copied()),
    }
}

/// Answers one probe whose hello is `hello`: our hello, the QP, then each request of the
/// prober until it closes the connection.
fn answer(mut ctl: Control, hello: &str, opts: &PeerOptions) -> Result<(), String> {
    let local_ip = ctl.local_addr().map(|a| a.ip()).ok();
    let theirs = parse_hello(hello);
    let bed = Bed::new(local_ip, opts);
    let end = match &bed {
        Ok(b) => b.end.clone(),
        Err(e) => End::clone(e),
    };
    // Ours goes out even to a hello we refuse: the prober then names the version.
    send_hello(&mut ctl, &end)?;
    theirs?;
    let mut bed = bed.map_err(|e| e.error.unwrap_or_default())?;
    bed.connect(&mut ctl, opts.timeout).map_err(|e| format!("connecting the QP: {e}"))?;
    loop {
        let request = match read_line(&mut ctl) {
            Ok(l) => l,
            // The prober stopped (its own failure, or the end).
            Err(_) => return Ok(()),
        };
        let verdict = match request.as_str() {
            "WRITE" => check_region(&bed, 0, &pattern(1), "the WRITE"),
            "SEND" => bed
                .take_recv(opts.timeout)
                .and_then(|m| same(&m, &pattern(3), "the SEND"))
                .map(|()| format!("the peer's receive of {LEN} bytes verified")),
            "FETCH_ADD" => word_is(&bed, &[FIRST_VALUE.wrapping_add(ADD)], "FETCH_ADD"),
            "CMP_SWAP" => word_is(&bed, &[SWAP], "CMP_SWAP"),
            "REVERSE" => bed.reverse(opts.timeout),
            "AGAIN" => {
                // Fresh QPs for a retry: the failed one is in the error state.
                match Bed::new(local_ip, opts) {
                    Ok(fresh) => {
                        bed = fresh;
                        send_line(&mut ctl, "OK fresh QP")?;
                        bed.connect(&mut ctl, opts.timeout).map_err(|e| format!("connecting fresh QPs: {e}"))?;
                    }
                    Err(e) => send_line(&mut ctl, &format!("FAIL {}", e.error.unwrap_or_default()))?,
                }
                continue;
            }
            "CM" => {
                let ip = match (bed.end.rdma_address.parse::<IpAddr>(), local_ip) {
                    (Ok(IpAddr::V4(ip)), _) | (Err(_), Some(IpAddr::V4(ip))) => ip,
                    _ => Ipv4Addr::UNSPECIFIED,
                };
                let mut announced = false;
                let served = crate::facts::rdma_cm::serve_one(ip, opts.timeout, |addr| {
                    announced = true;
                    send_line(&mut ctl, &format!("OK listening on port {}", addr.port()))
                });
                // A listener that never came up was not announced: its failure is the
                // answer to the request (else the answer after the connection).
                if !announced {
                    send_line(&mut ctl, &format!("FAIL {}", served.err().unwrap_or_default()))?;
                    continue;
                }
                served.map(|v| format!("{v} by the peer"))
            }
            other => match other.strip_prefix("WRITE ").and_then(|n| n.parse::<usize>().ok()) {
                Some(n) if n > 0 && n <= BIG => check_region(&bed, BIG_WRITE_AT, &sized_pattern(n), "the large WRITE"),
                _ => Err(format!("unknown request {other:?}")),
            },
        };
        match verdict {
            Ok(v) => send_line(&mut ctl, &format!("OK {v}"))?,
            Err(e) => send_line(&mut ctl, &format!("FAIL {e}"))?,
        }
    }
}

fn check_region(bed: &Bed, at: usize, want: &[u8], what: &str) -> Result<String, String> {
    let mut got = vec![0u8; want.len()];
    bed.target.read_at(at, &mut got).map_err(|e| e.to_string())?;
    same(&got, want, &format!("{what} in the peer's region"))?;
    Ok(format!("{} bytes verified in the peer's region", want.len()))
}

fn word_is(bed: &Bed, want: &[u64], what: &str) -> Result<String, String> {
    let word = bed.target.atomic_u64(ATOMIC_AT).map_err(|e| e.to_string())?;
    let now = word.load(std::sync::atomic::Ordering::Relaxed);
    if want.iter().any(|w| *w == now || w.swap_bytes() == now) {
        Ok(format!("the peer's word is {now:#x} after {what}"))
    } else {
        Err(format!("after {what} the peer's word is {now:#x}, expected {:#x}", want[0]))
    }
}
