//! One end's resources: the device, port and GID it uses, its QP, and its regions.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, GidType, Handshake, MemoryRegion, PortState,
    ProtectionDomain, QpAccess, QpType, QueuePair, RecvQueue, RemoteMr, RemoteWritable, RtsAttr, SendQueue, SendWr,
};

use super::{pattern, Control, End, PeerOptions, SETUP};
use crate::facts::loopback::{ATOMIC_AT, FIRST_VALUE, LEN};
use crate::facts::rdma_cm::wait_one as wait;

/// The largest message of the path-MTU checks.
pub(crate) const BIG: usize = 64 * 1024;
/// Where in the target region the prober's large WRITEs land.
pub(crate) const BIG_WRITE_AT: usize = 4 * LEN;
/// Where in the target region the prober's large READs come from ([`BIG`] bytes of
/// pattern [`BIG_SEED`]).
pub(crate) const BIG_READ_AT: usize = BIG_WRITE_AT + BIG;
pub(crate) const BIG_SEED: u8 = 6;
/// The retries of the probe's QPs after a lost packet: 6 on every provider (7 would be
/// "forever" on rxe, and a black hole would never be reported as lost packets).
pub(crate) const RETRY_CNT: u8 = 6;

/// The ACK timeout code (4.096 µs × 2^code) whose whole retry window, the first try and
/// [`RETRY_CNT`] retries, fits in four fifths of the doctor's `timeout`: a probe under
/// load rides out delays that long, and a lost packet is still reported as such (retries
/// exhausted) before the doctor stops waiting. 17 (0.54 s, a 3.8 s window) at the default
/// 5 s; never below 14 (67 ms), the verbs default.
pub(crate) fn ack_timeout(timeout: Duration) -> u8 {
    let budget = timeout.as_secs_f64() * 0.8 / f64::from(RETRY_CNT + 1);
    (14..=24u8).rev().find(|c| 4.096e-6 * f64::from(1u32 << c) <= budget).unwrap_or(14)
}

/// One end: its QP and queues, the region the peer reaches, and what it said of itself.
/// Fields drop in order: the queues and the QP before the regions.
pub(crate) struct Bed {
    sq: SendQueue<Chunk>,
    rq: RecvQueue<Chunk>,
    pub(crate) qp: QueuePair,
    cq: CompletionQueue,
    /// Sources and sinks of this end's requests (one chunk at a time is posted).
    spare: Vec<Chunk>,
    /// The source and sink of the large messages.
    big: Vec<Chunk>,
    /// The region the peer WRITEs, READs and does atomics on.
    pub(crate) target: MemoryRegion<AlignedBuf, RemoteWritable>,
    pub(crate) peer_mr: Option<RemoteMr>,
    /// The path MTU of the connected QP, in bytes.
    pub(crate) path_mtu: u32,
    pub(crate) end: End,
    ctx_port: u8,
    _pd: ProtectionDomain,
}

impl Bed {
    /// Finds the device, port and GID for `local_ip` and builds the QP; on failure, the
    /// [`End`] that says why (to send in the hello).
    pub(crate) fn new(local_ip: Option<IpAddr>, opts: &PeerOptions) -> Result<Bed, Box<End>> {
        let mut end = End {
            host: crate::model::input::read_limited(std::path::Path::new("/proc/sys/kernel/hostname"))
                .map(|h| h.trim().to_owned())
                .unwrap_or_default(),
            address: local_ip.map(|ip| ip.to_string()).unwrap_or_default(),
            ..End::default()
        };
        let fail = |mut end: End, e: String| {
            end.error = Some(e);
            Box::new(end)
        };
        let (ctx, port, gid) = match choose(local_ip, opts) {
            Ok(c) => c,
            Err(e) => return Err(fail(end, e)),
        };
        let attr = match ctx.query_port(port) {
            Ok(a) => a,
            Err(e) => return Err(fail(end, e.to_string())),
        };
        end.device = ctx.name().to_owned();
        end.port = port;
        end.gid_index = gid.index;
        end.gid = gid.gid.to_ipv6().to_string();
        end.gid_type = gid.gid_type.to_string();
        end.gid_matches_address = local_ip.is_some_and(|ip| gid_carries(&gid.gid, ip));
        end.rdma_address = rdma_address(&gid).map(|ip| ip.to_string()).unwrap_or_default();
        end.netdev = gid.netdev.clone().unwrap_or_default();
        end.netdev_mtu = netdev_mtu(&end.netdev);
        end.active_mtu = attr.active_mtu.bytes();
        end.link_layer = if attr.is_ethernet() { "Ethernet" } else { "InfiniBand" }.into();
        end.atomics = ctx.query_device().map(|d| d.atomic_cap.supported()).unwrap_or(false);
        Self::try_build(&ctx, port, end.clone()).map_err(|e| fail(end, format!("{SETUP}: {e}")))
    }

    fn try_build(ctx: &Context, port: u8, end: End) -> rdma_verbs::Result<Bed> {
        let pd = ProtectionDomain::new(ctx)?;
        let cq = CompletionQueue::new(ctx, 16)?;
        let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(4).max_recv_wr(4).build()?;
        let remote = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let mut target = pd.register_remote_writable(AlignedBuf::new(BIG_READ_AT + BIG)?, remote)?;
        target.write_at(LEN, &pattern(2))?;
        target.write_at(BIG_READ_AT, &crate::facts::loopback::pattern(BIG, BIG_SEED))?;
        target.atomic_u64(ATOMIC_AT)?.store(FIRST_VALUE, std::sync::atomic::Ordering::Relaxed);
        let spare = pd.register(AlignedBuf::new(4 * LEN)?, AccessFlags::LOCAL_WRITE)?.into_chunks(LEN)?;
        let big = pd.register(AlignedBuf::new(BIG)?, AccessFlags::LOCAL_WRITE)?.into_chunks(BIG)?;
        let sq = qp.send_queue()?;
        let rq: RecvQueue<Chunk> = qp.recv_queue()?;
        Ok(Bed { sq, rq, qp, cq, spare, big, target, peer_mr: None, path_mtu: 0, end, ctx_port: port, _pd: pd })
    }

    /// The endpoint handshake over the control channel, with the retry window of
    /// [`ack_timeout`]; the path MTU in use.
    pub(crate) fn connect(&mut self, ctl: &mut Control, timeout: Duration) -> rdma_verbs::Result<u32> {
        let access = QpAccess::REMOTE_WRITE | QpAccess::REMOTE_READ | QpAccess::REMOTE_ATOMIC;
        let rts = RtsAttr { timeout: ack_timeout(timeout), retry_cnt: RETRY_CNT, ..RtsAttr::default() };
        let hs = Handshake::new(&self.qp)
            .rts(rts)
            .port(self.ctx_port)
            .gid_index(self.end.gid_index)
            .access(access)
            .advertise(self.target.remote()?);
        // The receive for the peer's SEND goes in at INIT, before the peer can send (a
        // QP in RESET takes none). Four chunks: this one, three spares for requests.
        hs.init()?;
        if let Some(recv) = self.spare.pop() {
            self.rq.post(recv, 0..LEN, 1).map_err(|r| r.error)?;
        }
        let conn = hs.connect(ctl)?;
        self.peer_mr = conn.remote.mr;
        self.path_mtu = conn.path_mtu.bytes();
        Ok(self.path_mtu)
    }

    /// Posts one request built by `make` around a spare chunk (the large one when `big`)
    /// holding `fill`, waits for its completion, and hands the chunk's bytes back (READ
    /// and atomic results).
    pub(crate) fn post_wait(
        &mut self,
        big: bool,
        make: impl FnOnce(Chunk) -> SendWr<Chunk>,
        fill: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, String> {
        let pool = if big { &mut self.big } else { &mut self.spare };
        let mut buf = pool.pop().ok_or("no spare buffer (a request is still out)")?;
        buf[..fill.len()].copy_from_slice(fill);
        let start = Instant::now();
        self.sq.post(make(buf).id(7)).map_err(|r| r.error.to_string())?;
        let mut wc = wait(&mut self.cq, timeout, "the request")?;
        let mut back = None;
        self.sq.complete(&mut wc, |d| back = Some(d)).map_err(|e| e.to_string())?;
        let done = back.ok_or("the completion handed nothing back")?;
        let pool = if big { &mut self.big } else { &mut self.spare };
        let done = done.result().map_err(|r| {
            let text = format!("{} (reported {} ms after the post)", r.error, start.elapsed().as_millis());
            pool.push(r.value);
            text
        })?;
        let bytes = done.value.to_vec();
        pool.push(done.value);
        Ok(bytes)
    }

    /// Waits for the receive posted at setup; its bytes.
    pub(crate) fn take_recv(&mut self, timeout: Duration) -> Result<Vec<u8>, String> {
        let mut wc = wait(&mut self.cq, timeout, "the peer's SEND")?;
        let done = self.rq.complete(&mut wc).map_err(|e| e.to_string())?;
        let done = done.result().map_err(|r| r.error.to_string())?;
        let len = (done.byte_len as usize).min(done.value.len());
        let bytes = done.value[..len].to_vec();
        self.spare.push(done.value);
        Ok(bytes)
    }

    /// The server's turn: WRITE and SEND to the prober.
    pub(crate) fn reverse(&mut self, timeout: Duration) -> Result<String, String> {
        let peer = self.peer_mr.ok_or("the prober advertised no region")?;
        self.post_wait(false, |b| SendWr::write(b, 0..LEN, peer), &pattern(4), timeout)?;
        self.post_wait(false, |b| SendWr::send(b, 0..LEN), &pattern(5), timeout)?;
        Ok(format!("the peer WRITE and SENT {LEN} bytes each"))
    }
}

/// The device, port and GID for the control connection's local address: the GID that
/// carries it, else the first active port's default GID.
fn choose(local_ip: Option<IpAddr>, opts: &PeerOptions) -> Result<(Context, u8, rdma_verbs::GidEntry), String> {
    let list = rdma_verbs::devices().map_err(|e| format!("listing RDMA devices: {e}"))?;
    let names: Vec<String> = match &opts.device {
        Some(d) => vec![d.clone()],
        None => list.names(),
    };
    let mut fallback = None;
    for name in names {
        let ctx = Context::open(Some(&name)).map_err(|e| format!("opening {name}: {e}"))?;
        let ports = ctx.query_device().map_err(|e| e.to_string())?.phys_port_cnt;
        for port in (1..=ports).filter(|p| opts.port.is_none_or(|want| want == *p)) {
            let active = ctx.query_port(port).map(|a| a.state == PortState::Active).unwrap_or(false);
            if !active {
                continue;
            }
            let table = ctx.gid_table(port).unwrap_or_default();
            if let Some(g) =
                local_ip.and_then(|ip| table.iter().find(|g| gid_carries(&g.gid, ip) && g.gid_type == GidType::RoceV2))
            {
                let g = g.clone();
                return Ok((ctx, port, g));
            }
            if fallback.is_none() {
                if let Ok(g) = ctx.default_gid(port) {
                    fallback = Some((name.clone(), port, g));
                }
            }
        }
    }
    match fallback {
        Some((name, port, g)) => Ok((Context::open(Some(&name)).map_err(|e| e.to_string())?, port, g)),
        None => Err("no active port on any RDMA device".into()),
    }
}

pub(crate) fn gid_carries(gid: &rdma_verbs::Gid, ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => gid.ipv4() == Some(v4),
        IpAddr::V6(v6) => gid.to_ipv6() == v6,
    }
}

/// The IP address a RoCE v2 GID carries (what rdma_cm resolves to this port): the IPv4
/// of an IPv4-mapped GID, else a GID that is not link-local as IPv6.
fn rdma_address(gid: &rdma_verbs::GidEntry) -> Option<IpAddr> {
    if gid.gid_type != GidType::RoceV2 {
        return None;
    }
    match gid.gid.ipv4() {
        Some(v4) => Some(v4.into()),
        None if !gid.gid.is_link_local() && !gid.gid.is_zero() => Some(gid.gid.to_ipv6().into()),
        None => None,
    }
}

/// The MTU of `netdev` (`/sys/class/net/NAME/mtu`), 0 when unknown.
fn netdev_mtu(netdev: &str) -> u32 {
    if netdev.is_empty() || netdev.contains('/') {
        return 0;
    }
    let path = std::path::PathBuf::from(format!("/sys/class/net/{netdev}/mtu"));
    crate::model::input::read_limited(&path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_window_fits_the_timeout_and_never_drops_below_the_verbs_default() {
        assert_eq!(ack_timeout(Duration::from_secs(5)), 17);
        assert_eq!(ack_timeout(Duration::from_millis(100)), 14);
        let window = |c: u8| 4.096e-6 * f64::from(1u32 << c) * f64::from(RETRY_CNT + 1);
        for secs in [2.0, 5.0, 10.0, 30.0, 300.0] {
            let c = ack_timeout(Duration::from_secs_f64(secs));
            assert!(window(c) <= secs * 0.8 || c == 14, "{secs} s: code {c}");
            assert!(c == 24 || window(c + 1) > secs * 0.8, "{secs} s: code {c} is not the largest");
        }
    }
}
