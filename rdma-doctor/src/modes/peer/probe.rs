//! The prober: `rdma-doctor --peer HOST`, layer by layer.

use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use rdma_verbs::SendWr;

use super::bed::{Bed, BIG, BIG_READ_AT, BIG_SEED, BIG_WRITE_AT};
use super::round_trip::RoundTrip;
use super::{
    ask, pattern, read_answer, say_hello, Control, End, PeerOptions, PeerReport, DEFAULT_PORT, MAX_PROBES,
    PEER_FORMAT_VERSION, SETUP, VERSION,
};
use crate::facts::counters;
use crate::facts::loopback::{returned_order, same, ADD, ATOMIC_AT, FIRST_VALUE, LEN, SWAP};

/// Probes the path to the doctor serving at `peer` (`HOST` or `HOST:PORT`; the port
/// defaults to `opts.tcp_port`).
pub fn probe(peer: &str, opts: &PeerOptions) -> PeerReport {
    let start = Instant::now();
    let mut r = PeerReport { format_version: PEER_FORMAT_VERSION, peer: peer.to_owned(), ..PeerReport::default() };
    // This end's device is known only after the hello: sample every device around the probe.
    let devices = crate::facts::device::sysfs_devices();
    let before = counters::sample(&devices);
    let mut rt = None;
    let _ = probe_steps(peer, opts, &mut r, &mut rt);
    let after = counters::sample(&devices);
    r.elapsed_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    if let Some(end) = r.local.clone() {
        r.counter_changes = counters::changes(&before, &after).into_iter().filter(|c| c.device == end.device).collect();
        let netdevs: std::collections::BTreeMap<String, String> =
            [(end.device.clone(), end.netdev.clone())].into_iter().filter(|(_, n)| !n.is_empty()).collect();
        for f in
            crate::judge::counter_findings::findings(&r.counter_changes, &netdevs, "while the probe ran (this end)")
        {
            let warning = f.severity == crate::model::report::Severity::Warning;
            let (detail, fix) = retries_of_a_long_round_trip(rt.as_ref(), f.what, f.advice);
            r.checks.push(super::Check { layer: "counters".into(), ok: true, warning, detail, fix });
        }
    }
    r
}

/// Retry or timeout counters that moved on a path whose round trip outgrew the QPs' ACK
/// timeout: the long round trip, not loss, with its numbers and fix.
fn retries_of_a_long_round_trip(rt: Option<&RoundTrip>, what: String, fix: Option<String>) -> (String, Option<String>) {
    let meaning = [crate::model::counters::CounterClass::Lossy, crate::model::counters::CounterClass::Timeout]
        .iter()
        .map(|c| c.meaning())
        .find(|m| what.ends_with(m));
    match (rt.filter(|rt| rt.outgrows()), meaning) {
        (Some(rt), Some(m)) => {
            // The counters that moved, without the class's "lossy path".
            let moved = what[..what.len() - m.len()].trim_end_matches([':', ' ']);
            let why = "retransmissions of requests whose ACKs came back late, not lost packets";
            (format!("{}; {moved}: {why}", rt.words()), Some(rt.fix()))
        }
        _ => (what, fix),
    }
}

fn probe_steps(peer: &str, opts: &PeerOptions, r: &mut PeerReport, rt: &mut Option<RoundTrip>) -> Result<(), ()> {
    let stream = match connect_control(peer, opts.tcp_port, opts.timeout) {
        Ok((c, rtt)) => {
            *rt = Some(RoundTrip::new(rtt, opts.timeout));
            c
        }
        Err(e) => {
            let fix =
                format!("run `rdma-doctor --serve` on {peer} and let TCP reach its port (default {DEFAULT_PORT})");
            return r.fail("control channel", e, Some(fix));
        }
    };
    // The server's answer to a request may take its own full timeout (a completion it
    // waits for): the prober waits twice that for a line, so the two never cross.
    let mut ctl = Control::new(stream, opts.timeout * 2, None);
    let local_ip = ctl.local_addr().map(|a| a.ip()).ok();
    let rt = rt.unwrap_or(RoundTrip::new(Duration::ZERO, opts.timeout));
    let (mut bed, remote) = meet(&mut ctl, local_ip, opts, r, &rt)?;
    check_path(&bed.end, &remote, r)?;
    connect_qp(&mut bed, &mut ctl, opts, r, &rt)?;
    let mut p = Prober { bed, ctl, local_ip, opts, rt };
    p.data_plane(&remote, r)?;
    // rdma_cm does not depend on large messages: it runs whatever they found.
    let sized = p.sizes(r);
    let cm = cm_probe(&mut p.ctl, &remote, opts, r);
    sized.and(cm)
}

fn ctl_peer(ctl: &Control) -> String {
    ctl.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "the peer".into())
}

/// The control connection, and how long its TCP connect took: one round trip of the path.
fn connect_control(peer: &str, port: u16, timeout: Duration) -> Result<(TcpStream, Duration), String> {
    let with_port =
        if peer.parse::<IpAddr>().is_ok() || !peer.contains(':') { format!("{peer}:{port}") } else { peer.to_owned() };
    let addrs: Vec<SocketAddr> =
        with_port.to_socket_addrs().map_err(|e| format!("cannot resolve {peer}: {e}"))?.collect();
    let mut last = format!("{peer} resolves to no address");
    for a in addrs {
        let start = Instant::now();
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok((s, start.elapsed())),
            Err(e) => last = format!("TCP connect to {a}: {e} (no `rdma-doctor --serve` listening there?)"),
        }
    }
    Err(last)
}

/// Sets this end up, exchanges hellos, and records why either end cannot go on.
fn meet(
    ctl: &mut Control,
    local_ip: Option<IpAddr>,
    opts: &PeerOptions,
    r: &mut PeerReport,
    rt: &RoundTrip,
) -> Result<(Bed, End), ()> {
    let bed = Bed::new(local_ip, opts);
    let end = match &bed {
        Ok(b) => b.end.clone(),
        Err(e) => End::clone(e),
    };
    r.local = Some(end.clone());
    let remote = match say_hello(ctl, &end, opts.secret.as_ref()) {
        Ok(h) => h,
        Err(e) if e.starts_with("the server is busy") => {
            let fix = format!("probe again in a while: the server answers up to {MAX_PROBES} probes at once");
            return r.fail("control channel", e, Some(fix));
        }
        Err(e) => {
            let fix = "run the same rdma-doctor version with `--serve` on the peer".to_owned();
            return r.fail("control channel", e, Some(fix));
        }
    };
    let hello = format!("TCP to {} and the doctors' hello (version {VERSION})", ctl_peer(ctl));
    r.pass("control channel", format!("{hello}; {}", rt.measured()));
    r.remote = Some(remote.clone());
    let here_fix = |e: &End| match e.error.as_deref() {
        Some(m) if m.contains("no active port") => Some("bring a port up: `rdma link` shows its state".to_owned()),
        _ => Some("run `rdma-doctor` on that node for the layer below".to_owned()),
    };
    // No port or GID is addressing; a QP that could not be built, this end's setup.
    let layer = |e: &str| if e.starts_with(SETUP) { "QP setup" } else { "addressing" };
    if let Some(e) = &end.error {
        return r.fail(layer(e), format!("here: {e}"), here_fix(&end));
    }
    if let Some(e) = &remote.error {
        return r.fail(layer(e), format!("there: {e}"), here_fix(&remote));
    }
    let bed = bed.map_err(|_| ())?;
    Ok((bed, remote))
}

/// Link layers and GID types must match; MTUs that differ are a warning of their own.
fn check_path(here: &End, there: &End, r: &mut PeerReport) -> Result<(), ()> {
    if here.link_layer != there.link_layer {
        let d = format!(
            "link layers differ: {} here, {} there: no RDMA path joins them",
            here.link_layer, there.link_layer
        );
        return r.fail("path", d, Some("connect ports of the same fabric (both RoCE or both InfiniBand)".into()));
    }
    if here.gid_type != there.gid_type {
        let d = format!(
            "GID types differ: {} here, {} there: the packets would not be understood",
            here.gid_type, there.gid_type
        );
        return r.fail("path", d, Some("use RoCE v2 GIDs on both ends (`-x` / gid index)".into()));
    }
    let mut d = format!("{} both ends, {} GIDs", here.link_layer, here.gid_type);
    if here.active_mtu == there.active_mtu {
        d += &format!(", active MTU {} both ends", here.active_mtu);
    }
    for (side, e) in [("here", here), ("there", there)] {
        if !e.gid_matches_address {
            d += &format!("; {side} no GID carries the control address {}, GID[{}] used", e.address, e.gid_index);
        }
    }
    r.pass("path", d);
    if let Some((what, fix)) = mtu_mismatch(here, there) {
        r.warn("MTU", what, Some(fix));
    }
    Ok(())
}

/// The two ends' MTUs when they differ (the ports' active MTUs, or the netdevs' MTUs where
/// both are known), and the fix.
fn mtu_mismatch(here: &End, there: &End) -> Option<(String, String)> {
    let netdevs_differ = here.netdev_mtu != 0 && there.netdev_mtu != 0 && here.netdev_mtu != there.netdev_mtu;
    if here.active_mtu == there.active_mtu && !netdevs_differ {
        return None;
    }
    let mut d = format!("MTU mismatch: active MTU {} here, {} there", here.active_mtu, there.active_mtu);
    if here.netdev_mtu != 0 && there.netdev_mtu != 0 {
        d += &format!(
            " (netdev {} MTU {} here, {} MTU {} there)",
            here.netdev, here.netdev_mtu, there.netdev, there.netdev_mtu
        );
    }
    d += &format!(
        ": the QPs run at {}; other programs that pick the MTU on one end only, and IP traffic of the larger MTU, \
         can lose packets between these nodes",
        here.active_mtu.min(there.active_mtu)
    );
    let fix = match (here.netdev_mtu, there.netdev_mtu) {
        (a, b) if a != 0 && b != 0 && a != b => {
            let (small, dev, host) =
                if a < b { (a, &there.netdev, &there.host) } else { (b, &here.netdev, &here.host) };
            format!(
                "give both netdevs one MTU, the one every switch port between them carries \
                 (e.g. on {host}: `ip link set dev {dev} mtu {small}`, or raise the other and the switches)"
            )
        }
        _ => "give both ports one MTU (the netdevs' MTUs, or the subnet manager's on InfiniBand)".to_owned(),
    };
    Some((d, fix))
}

fn connect_qp(
    bed: &mut Bed,
    ctl: &mut Control,
    opts: &PeerOptions,
    r: &mut PeerReport,
    rt: &RoundTrip,
) -> Result<(), ()> {
    match bed.connect(ctl, opts.timeout) {
        Ok(mtu) => {
            let qp = format!("RC QP {} at RTS with the peer's QP, path MTU {mtu}", bed.qp.qp_num());
            r.pass("QP connection", format!("{qp}, {}", rt.qp_timeout()));
            Ok(())
        }
        Err(e) => r.fail(
            "QP connection",
            format!("{e} (the kernel's control plane, or the exchange)"),
            Some("compare both nodes' GID tables (`rdma-doctor` on each) and their route to each other".into()),
        ),
    }
}

/// One data-plane check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Write,
    Read,
    Send,
    FetchAdd,
    CmpSwap,
    Reverse,
    /// A WRITE and a READ of this many bytes.
    Sized(usize),
}

/// The prober's half of the data plane: its end, the control channel, and what a fresh
/// pair of QPs needs.
struct Prober<'a> {
    bed: Bed,
    ctl: Control,
    local_ip: Option<IpAddr>,
    opts: &'a PeerOptions,
    /// The path's round trip and the QPs' ACK timeout.
    rt: RoundTrip,
}

impl Prober<'_> {
    /// The 1 KiB operations, then the server's reverse WRITE and SEND.
    fn data_plane(&mut self, remote: &End, r: &mut PeerReport) -> Result<(), ()> {
        if self.bed.peer_mr.is_none() {
            return r.fail("RDMA_WRITE", "the peer advertised no region", None);
        }
        let mut ops = vec![Op::Write, Op::Read, Op::Send];
        if self.bed.end.atomics && remote.atomics {
            ops.extend([Op::FetchAdd, Op::CmpSwap]);
        } else {
            r.pass("atomics", "skipped: a device reports no atomic support (atomic_cap NONE)");
        }
        ops.push(Op::Reverse);
        for op in ops {
            self.check(op, r)?;
        }
        Ok(())
    }

    /// Messages of one MTU, four MTUs and 64 KiB, each WRITTEN and READ; the first size
    /// that fails (twice) is named, and the larger ones are not tried.
    fn sizes(&mut self, r: &mut PeerReport) -> Result<(), ()> {
        let mtu = self.bed.path_mtu as usize;
        let mut sizes: Vec<usize> = [mtu, 4 * mtu, BIG].into_iter().filter(|n| *n > 0 && *n <= BIG).collect();
        sizes.dedup();
        let mut largest_ok = LEN;
        for n in sizes {
            let before = r.checks.len();
            if self.check(Op::Sized(n), r).is_err() {
                if let Some(c) = r.checks.get_mut(before) {
                    c.detail = format!("{}; {}", black_hole(largest_ok, n, mtu), c.detail);
                    c.fix = Some(black_hole_fix(largest_ok, mtu));
                }
                return Err(());
            }
            largest_ok = largest_ok.max(n);
        }
        Ok(())
    }

    /// Runs `op`; when it fails, once more on fresh QPs. Recorded as a pass, a warning
    /// (failed, then passed), or a failure (failed twice).
    fn check(&mut self, op: Op, r: &mut PeerReport) -> Result<(), ()> {
        let layer = op.layer(self.bed.path_mtu as usize);
        let first = match self.run(op) {
            Ok(d) => {
                r.pass(&layer, d);
                return Ok(());
            }
            Err(e) => e,
        };
        let again = self.renew().and_then(|()| {
            // CMP_SWAP compares against the word FETCH_ADD left: a fresh region needs it again.
            if op == Op::CmpSwap {
                self.run(Op::FetchAdd).map_err(|e| format!("FETCH_ADD before it: {e}"))?;
            }
            self.run(op)
        });
        // A round trip past the ACK timeout retries what was not lost: said so, not drops.
        let long = self.rt.outgrows().then_some(self.rt);
        let said = |what: String| match long {
            Some(rt) => format!("{}: {what}", rt.words()),
            None => what,
        };
        match again {
            Ok(d) => {
                let fix = match long {
                    Some(rt) => rt.fix(),
                    None => "a healthy path does not lose a probe: look for drops and pauses on the nodes' ports \
                             and switches (ethtool -S counters, `rdma statistic`), and probe again"
                        .to_owned(),
                };
                let what = format!("failed, passed on retry with fresh QPs: {d}; the first try: {first}");
                r.warn(&layer, said(what), Some(fix));
                Ok(())
            }
            Err(second) => {
                let fix = match long {
                    Some(rt) => Some(rt.fix()),
                    None => data_fix(&first).or_else(|| data_fix(&second)),
                };
                r.fail(&layer, said(format!("failed twice: {first}; on retry with fresh QPs: {second}")), fix)
            }
        }
    }

    /// Fresh QPs on both ends (the failed one is in the error state), connected again.
    fn renew(&mut self) -> Result<(), String> {
        let fresh = Bed::new(self.local_ip, self.opts).map_err(|e| e.error.unwrap_or_default())?;
        self.bed = fresh;
        ask(&mut self.ctl, "AGAIN")?;
        self.bed.connect(&mut self.ctl, self.opts.timeout).map_err(|e| format!("connecting fresh QPs: {e}"))?;
        Ok(())
    }

    /// One operation, its data checked where it lands.
    fn run(&mut self, op: Op) -> Result<String, String> {
        let t = self.opts.timeout;
        let peer_mr = self.bed.peer_mr.ok_or("the peer advertised no region")?;
        let (bed, ctl) = (&mut self.bed, &mut self.ctl);
        let word = || peer_mr.slice(ATOMIC_AT as u64..ATOMIC_AT as u64 + 8).map_err(|e| e.to_string());
        match op {
            Op::Write => {
                bed.post_wait(false, |b| SendWr::write(b, 0..LEN, peer_mr), &pattern(1), t)?;
                ask(ctl, "WRITE")
            }
            Op::Read => {
                let src = peer_mr.slice(LEN as u64..2 * LEN as u64).map_err(|e| e.to_string())?;
                let got = bed.post_wait(false, |b| SendWr::read(b, 0..LEN, src), &[], t)?;
                same(&got[..LEN], &pattern(2), "the READ result")?;
                Ok(format!("{LEN} bytes read from the peer's region and verified"))
            }
            Op::Send => {
                bed.post_wait(false, |b| SendWr::send(b, 0..LEN), &pattern(3), t)?;
                ask(ctl, "SEND")
            }
            Op::FetchAdd => {
                let word = word()?;
                let got = bed.post_wait(false, |b| SendWr::fetch_add(b, 0, word, ADD), &[], t)?;
                let old = u64::from_ne_bytes(got[..8].try_into().unwrap_or_default());
                let order = returned_order(old, FIRST_VALUE)?;
                let now = ask(ctl, "FETCH_ADD")?;
                Ok(format!("returned the old value {FIRST_VALUE:#x} ({order}); {now}"))
            }
            Op::CmpSwap => {
                let word = word()?;
                let current = FIRST_VALUE.wrapping_add(ADD);
                let got = bed.post_wait(false, |b| SendWr::compare_swap(b, 0, word, current, SWAP), &[], t)?;
                let old = u64::from_ne_bytes(got[..8].try_into().unwrap_or_default());
                let order = returned_order(old, current)?;
                let now = ask(ctl, "CMP_SWAP")?;
                Ok(format!("compared {current:#x} ({order}); {now}"))
            }
            Op::Reverse => {
                ask(ctl, "REVERSE")?;
                let mut got = vec![0u8; LEN];
                bed.target.read_at(0, &mut got).map_err(|e| e.to_string())?;
                same(&got, &pattern(4), "the peer's WRITE into our region")?;
                let msg = bed.take_recv(t)?;
                same(&msg, &pattern(5), "the peer's SEND")?;
                Ok(format!("the peer's {LEN}-byte WRITE and SEND arrived here intact"))
            }
            Op::Sized(n) => {
                let at = |off: usize| peer_mr.slice(off as u64..(off + n) as u64).map_err(|e| e.to_string());
                let (dst, src) = (at(BIG_WRITE_AT)?, at(BIG_READ_AT)?);
                let packets = n.div_ceil(bed.path_mtu.max(1) as usize);
                bed.post_wait(true, |b| SendWr::write(b, 0..n, dst), &sized_pattern(n), t)
                    .map_err(|e| format!("the {n}-byte RDMA WRITE: {e}"))?;
                ask(ctl, &format!("WRITE {n}")).map_err(|e| format!("the {n}-byte RDMA WRITE: {e}"))?;
                let got = bed
                    .post_wait(true, |b| SendWr::read(b, 0..n, src), &[], t)
                    .map_err(|e| format!("the {n}-byte RDMA READ: {e}"))?;
                same(&got[..n.min(got.len())], &crate::facts::loopback::pattern(n, BIG_SEED), "the large READ result")?;
                Ok(format!(
                    "a {n}-byte RDMA WRITE (checked by the peer) and READ (checked here), {packets} packet(s) \
                     each way at path MTU {}",
                    bed.path_mtu
                ))
            }
        }
    }
}

impl Op {
    fn layer(self, mtu: usize) -> String {
        match self {
            Op::Write => "RDMA_WRITE".into(),
            Op::Read => "RDMA_READ".into(),
            Op::Send => "SEND".into(),
            Op::FetchAdd => "FETCH_ADD".into(),
            Op::CmpSwap => "CMP_SWAP".into(),
            Op::Reverse => "reverse WRITE+SEND".into(),
            Op::Sized(n) if n == BIG => "64 KiB message".into(),
            Op::Sized(n) if mtu > 0 && n % mtu == 0 => format!("{} MTU message", n / mtu),
            Op::Sized(n) => format!("{n} B message"),
        }
    }
}

/// The pattern of a large WRITE of `n` bytes (what the server checks).
pub(crate) fn sized_pattern(n: usize) -> Vec<u8> {
    crate::facts::loopback::pattern(n, 7)
}

/// What a size that fails after smaller ones passed says about the path.
fn black_hole(largest_ok: usize, failed: usize, mtu: usize) -> String {
    if failed <= largest_ok {
        format!(
            "messages of {failed} bytes failed twice although messages of {largest_ok} bytes passed: \
             packets are lost between the nodes now and then"
        )
    } else if failed <= mtu {
        format!(
            "messages of {largest_ok} bytes pass, messages of {failed} bytes (one packet at path MTU {mtu}) fail: \
             a hop drops large packets (a path-MTU black hole: RoCE's MTU is above what the path carries)"
        )
    } else {
        format!(
            "messages of {largest_ok} bytes pass, messages of {failed} bytes ({} packets of MTU {mtu}) fail: \
             a hop drops trains of full-size packets (bursts, or packets of a long message)",
            failed.div_ceil(mtu.max(1))
        )
    }
}

fn black_hole_fix(largest_ok: usize, mtu: usize) -> String {
    if largest_ok < mtu {
        format!(
            "find the hop whose MTU is below the RoCE packets of MTU {mtu} (switch ports, tunnels, `tc` filters) \
             and raise it, or lower both netdevs' MTU so that RoCE uses a smaller one; \
             expect `ibv_rc_pingpong -m {mtu}` to hang on this path and `-m {}` to work",
            largest_ok.next_power_of_two().min(mtu / 2).max(256)
        )
    } else {
        "look for drops under bursts between the nodes (switch buffers, pause frames / PFC, `ethtool -S` \
         discard counters on both ports)"
            .into()
    }
}

/// The usual fix of a data-plane failure, from what the error says.
fn data_fix(e: &str) -> Option<String> {
    if e.contains("retries exhausted") || e.contains("never acknowledged") || e.contains("no completion") {
        Some(
            "RoCE packets are lost between the nodes while TCP gets through: check that UDP port 4791 \
             passes (firewall, `tc`), that the path's MTU fits the network, and the peer's port state"
                .into(),
        )
    } else if e.contains("access") {
        Some("the peer refused the access: compare both doctors' versions".into())
    } else {
        None
    }
}

/// rdma_cm from here to the server's RDMA address (the IP its GID carries), else to the
/// control connection's address. Tried once more when it fails.
fn cm_probe(ctl: &mut Control, remote: &End, opts: &PeerOptions, r: &mut PeerReport) -> Result<(), ()> {
    let (ip, whose) = match remote.rdma_address.parse::<IpAddr>() {
        Ok(ip) => (ip, "the server's RDMA address, from its GID"),
        Err(_) => match ctl.peer_addr() {
            Ok(a) => (a.ip(), "the control connection's address: the server's GID carries none"),
            Err(e) => return r.fail("rdma_cm", format!("no address for the server: {e}"), None),
        },
    };
    let mut once = || -> Result<String, String> {
        let answer = ask(ctl, "CM")?;
        let port: u16 = answer
            .strip_prefix("listening on port ")
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("the peer's rdma_cm listener: {answer}"))?;
        let sent = crate::facts::rdma_cm::connect_and_send(SocketAddr::new(ip, port), opts.timeout);
        let verdict = read_answer(ctl);
        sent.map_err(|e| format!("rdma_cm to {ip}:{port}: {e}"))?;
        verdict.map(|v| format!("connected to {ip}:{port} ({whose}); {v}"))
    };
    let fix = "check rdma_ucm and /dev/infiniband/rdma_cm on both nodes (`rdma-doctor` on each), \
               and that both resolve each other's address over the RDMA interface"
        .to_owned();
    match once() {
        Ok(d) => {
            r.pass("rdma_cm", d);
            Ok(())
        }
        Err(first) => match once() {
            Ok(d) => {
                r.warn("rdma_cm", format!("failed, passed on retry: {d}; the first try: {first}"), Some(fix));
                Ok(())
            }
            Err(second) => r.fail("rdma_cm", format!("failed twice: {first}; on retry: {second}"), Some(fix)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modes::peer::is_data_layer;

    #[test]
    fn the_path_check_names_what_differs() {
        let end = |ll: &str, ty: &str, mtu| End {
            link_layer: ll.into(),
            gid_type: ty.into(),
            active_mtu: mtu,
            gid_matches_address: true,
            ..End::default()
        };
        let mut r = PeerReport::default();
        assert!(check_path(&end("Ethernet", "RoCE v2", 1024), &end("InfiniBand", "IB", 4096), &mut r).is_err());
        assert!(r.checks[0].detail.contains("link layers differ"));
        let mut r = PeerReport::default();
        assert!(check_path(&end("Ethernet", "RoCE v2", 1024), &end("Ethernet", "RoCE v1", 1024), &mut r).is_err());
        assert!(r.checks[0].detail.contains("GID types differ"));
        let mut r = PeerReport::default();
        check_path(&end("Ethernet", "RoCE v2", 1024), &end("Ethernet", "RoCE v2", 1024), &mut r).unwrap();
        assert_eq!(r.checks.len(), 1, "{:?}", r.checks);
        assert_eq!(r.exit_code(), 0);
    }

    #[test]
    fn an_mtu_mismatch_is_a_warning_of_its_own_not_a_remark_in_a_pass() {
        let end = |active_mtu, netdev_mtu, host: &str| End {
            host: host.into(),
            link_layer: "Ethernet".into(),
            gid_type: "RoCE v2".into(),
            netdev: "enp0s10".into(),
            active_mtu,
            netdev_mtu,
            gid_matches_address: true,
            ..End::default()
        };
        let mut r = PeerReport { peer: "b".into(), checks: vec![], ..PeerReport::default() };
        check_path(&end(4096, 9000, "a"), &end(1024, 1500, "b"), &mut r).unwrap();
        assert_eq!(r.checks.len(), 2, "{:?}", r.checks);
        assert!(r.checks[0].ok && !r.checks[0].warning && !r.checks[0].detail.contains("MTU"), "{:?}", r.checks[0]);
        let w = &r.checks[1];
        assert!(w.ok && w.warning && w.layer == "MTU", "{w:?}");
        assert!(w.detail.contains("active MTU 4096 here, 1024 there"), "{}", w.detail);
        assert!(w.detail.contains("MTU 9000 here") && w.detail.contains("MTU 1500 there"), "{}", w.detail);
        assert!(w.fix.as_deref().unwrap().contains("ip link set dev enp0s10 mtu 1500"), "{:?}", w.fix);
        assert_eq!(r.exit_code(), crate::Status::Warnings.exit_code());
        let text = r.to_text();
        assert!(text.contains("\nWARN  MTU "), "{text}");
        assert!(text.contains("works end to end, with 1 warning(s)"), "{text}");
        // Netdevs of different MTUs under ports of one active MTU still differ.
        let mut r = PeerReport::default();
        check_path(&end(4096, 9000, "a"), &end(4096, 4200, "b"), &mut r).unwrap();
        assert!(r.checks.iter().any(|c| c.layer == "MTU" && c.warning), "{:?}", r.checks);
    }

    #[test]
    fn a_size_that_fails_after_smaller_ones_passed_is_named_a_black_hole() {
        let d = black_hole(1024, 4096, 4096);
        assert!(d.contains("messages of 1024 bytes pass, messages of 4096 bytes"), "{d}");
        assert!(d.contains("a hop drops large packets"), "{d}");
        assert!(black_hole_fix(1024, 4096).contains("ibv_rc_pingpong -m 4096"));
        let d = black_hole(4096, 16384, 4096);
        assert!(d.contains("4 packets of MTU 4096") && d.contains("trains of full-size packets"), "{d}");
        assert!(black_hole(1024, 1024, 1024).contains("lost between the nodes now and then"));
        assert_eq!(Op::Sized(4096).layer(4096), "1 MTU message");
        assert_eq!(Op::Sized(16384).layer(4096), "4 MTU message");
        assert_eq!(Op::Sized(BIG).layer(4096), "64 KiB message");
        assert!(is_data_layer("4 MTU message") && is_data_layer("SEND") && !is_data_layer("rdma_cm"));
        let mut r = PeerReport::default();
        r.pass("RDMA_WRITE", "1024 bytes verified");
        let _ = r.fail::<()>("1 MTU message", black_hole(1024, 4096, 4096), Some(black_hole_fix(1024, 4096)));
        let text = r.to_text();
        assert!(text.contains("FAIL  1 MTU message      messages of 1024 bytes pass"), "{text}");
        assert!(text.contains("larger messages do not") && !text.contains("the data plane between"), "{text}");
    }

    /// The counters' finding of the prober's end after `name` moved by `by` (recorded: rxe's).
    fn counter_finding(name: &str, by: u64) -> crate::model::report::Finding {
        let change = crate::model::counters::CounterChange {
            device: "rxe0".into(),
            port: Some("1".into()),
            set: "hw_counters".into(),
            name: name.into(),
            source: format!("/sys/class/infiniband/rxe0/ports/1/hw_counters/{name}"),
            before: 0,
            after: by,
            class: crate::model::counters::CounterClass::of(name),
        };
        let netdevs = [("rxe0".to_owned(), "enp0s10".to_owned())].into_iter().collect();
        crate::judge::counter_findings::findings(&[change], &netdevs, "while the probe ran (this end)").remove(0)
    }

    #[test]
    fn retries_on_a_path_whose_round_trip_outgrew_the_ack_timeout_are_a_long_round_trip_not_loss() {
        // netem delay 100 ms each way (200 ms) under QPs of --timeout 1 (code 14, 67.1 ms).
        let long = RoundTrip::new(Duration::from_millis(200), Duration::from_secs(1));
        let f = counter_finding("completer_retry_err", 12);
        assert!(f.what.contains("a lossy path"), "{}", f.what);
        let (detail, fix) = retries_of_a_long_round_trip(Some(&long), f.what.clone(), f.advice.clone());
        assert!(detail.starts_with("a long round trip, not loss: the path's round trip (200.0 ms"), "{detail}");
        assert!(detail.contains("ACK timeout of the probe's QPs (67.1 ms, code 14)"), "{detail}");
        let why = "completer_retry_err +12 (0 -> 12): retransmissions of requests whose ACKs came back late, not lost";
        assert!(detail.contains(why) && !detail.contains("lossy"), "{detail}");
        let fix = fix.unwrap();
        assert!(
            fix.starts_with("raise the QP's ACK timeout past the round trip") && !fix.contains("UDP 4791"),
            "{fix}"
        );
        // Within the ACK timeout: the same counters still mean a lossy path.
        let short = RoundTrip::new(Duration::from_micros(400), Duration::from_secs(1));
        assert_eq!(
            retries_of_a_long_round_trip(Some(&short), f.what.clone(), f.advice.clone()),
            (f.what.clone(), f.advice.clone())
        );
        assert_eq!(retries_of_a_long_round_trip(None, f.what.clone(), f.advice.clone()), (f.what, f.advice));
        // Receiver-not-ready is no retry of the path's: left as it is.
        let rnr = counter_finding("rnr_nak_retry_err", 3);
        assert_eq!(retries_of_a_long_round_trip(Some(&long), rnr.what.clone(), None).0, rnr.what);
    }

    #[test]
    fn a_lost_packet_failure_advises_on_the_network() {
        let fix = data_fix("RDMA WRITE failed: transport retries exhausted (the peer never acknowledged)").unwrap();
        assert!(fix.contains("UDP port 4791"));
        assert!(data_fix("something else").is_none());
    }
}
