//! perftest's out-of-band exchange: what the tools speak over TCP, so that each talks to
//! perftest's tool of the same name (`write_bw` to `ib_write_bw`, and so on) in either
//! role. The exchange followed is perftest 4.5's as Debian packages it (`perftest
//! 4.5+0.17`, which calls itself version 6.06), over a TCP connection (not rdma_cm).
//!
//! # The exchange
//!
//! Every step is lockstep: the client writes its message, then reads the server's; the
//! server reads, then writes. Each message has a fixed size.
//!
//! 1. **Versions**: 16 bytes of NUL-padded text each way. These tools send
//!    `"6.06 rdma-verbs"` ([`msg::OUR_VERSION`]): perftest reads 6.06 (with `atof`), and
//!    another of our tools recognises the whole text. A peer older than 5.70 is refused,
//!    as perftest refuses it; a newer one is taken at its word (its exchange must be
//!    6.06's).
//! 2. **System data**: the cycle buffer (this side: the page size, as perftest's) and the cache line
//!    (64), each a big-endian 4-byte `int`; both sides keep the larger of each. The cycle
//!    buffer matters: a perftest requester (ib_write_bw, ib_read_bw) spreads messages of
//!    at most half of it over that many bytes from the address it was given, so a server
//!    of ours registers `max(size, cycle buffer)` bytes.
//! 3. **MTU**: the port's active MTU as perftest sends it, `enum ibv_mtu` in decimal and
//!    NUL (2 bytes); both use the smaller.
//! 4. **Destinations**: per QP, perftest's text message, `KEY_PRINT_FMT_GID` (108 bytes
//!    with NUL: LID, outstanding reads, QP number, PSN, rkey, address, the 16 GID bytes,
//!    SRQ number, each in fixed-width hex, `:`-separated) on RoCE or with `-x`, else
//!    `KEY_PRINT_FMT` (59 bytes, no GID). Each tool exchanges them a fixed number of
//!    times, in perftest's order: before the QPs are connected (write_lat and read_lat
//!    one more for QP 0 first), then again per QP after, then once or twice more as
//!    barriers ([`Shape`]). Both GIDs must be IPv4-mapped or neither (perftest's check).
//! 5. **The end**: `ib_write_bw`/`ib_read_bw`: one destination exchange once the client
//!    has run, the client's report (size, iterations, peak and average bandwidth, message
//!    rate: five big-endian 8-byte exchanges; the server answers with zeros and prints the
//!    client's), then the close. `ib_send_bw`, `ib_send_lat`: the close. `ib_read_lat`: the
//!    server closes right after the setup, which waits for the client's close after its
//!    run. `ib_write_lat`: nothing; each side stops after its last message. The close is
//!    one destination exchange and `"done\0"` from each side; these tools read the peer's
//!    `done` (until it closes) before they close.
//!
//! # What is honoured, and what is not
//!
//! Honoured: the version check (>= 5.70), the larger cycle buffer (sizes our server's
//! regions), the smaller MTU (the path MTU), the peer's QP number, PSN, LID or GID,
//! rkey and address, its outstanding reads (a read client of ours issues no more than
//! that), the GID type check, and every step's count and order. Not used: the cache
//! line (this side writes to the one address it was given, not spread), the SRQ number
//! (no XRC, no DC), the peer's reports other than printing them. perftest's rdma_cm mode
//! (`-R`) is spoken too ([`crate::cm`]: the same exchange as SENDs on an rdma_cm
//! connection, destinations in binary, no MTU or LID/GID used). perftest's flags that
//! change the exchange otherwise (`--dont_xchg_versions`, `-D`, `-a`, duplex `-b`,
//! `--report-both`, `--report_per_port`, UD/UC/XRC/DC) are not spoken: with a perftest
//! peer these tools refuse `-a` and `-D`.
//!
//! # Our data check
//!
//! perftest checks no data, and its destination message carries no region length nor
//! any verdict. When the version exchange shows that both sides are ours, the rest of
//! the exchange (system data and MTU still as perftest's) goes on in rdma-verbs' endpoint
//! format ([`rdma_verbs::Handshake`], one per QP and size, which carries the region's
//! length), and the tools keep their data check and its verdict, `-a` and `-D`. With a
//! perftest peer nothing is checked, and both sides say so on stderr. `--loopback` (one
//! process) uses the endpoint format only, over a socket pair.

pub mod msg;

use rdma_verbs::{Context, Gid, InitAttr, Mtu, QpAccess, QpState, QueuePair, Remote, RemoteMr, RtrAttr, RtsAttr};

use crate::perftest::{Common, Res, Stream};
pub use msg::{BwReport, Dest, PeerKind};

/// Cache line this side reports (perftest's default when it cannot read one).
const CACHE_LINE: u32 = 64;

/// How many destination exchanges a perftest tool makes around the QPs' connection,
/// besides the one per QP before and the one per QP after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Exchanges of QP 0's destination before the per-QP ones (write_lat, read_lat: 1).
    pub lead: usize,
    /// Exchanges of QP 0's after the second per-QP round (bw: 1; send tools: 2, one of
    /// them after the receives are posted).
    pub trail: usize,
}

impl Shape {
    /// ib_write_bw, ib_read_bw.
    pub const RDMA_BW: Shape = Shape { lead: 0, trail: 1 };
    /// ib_send_bw, ib_send_lat.
    pub const SEND: Shape = Shape { lead: 0, trail: 2 };
    /// ib_write_lat, ib_read_lat.
    pub const RDMA_LAT: Shape = Shape { lead: 1, trail: 1 };
}

/// The peer, once the first steps of the exchange told who it is.
#[derive(Debug, Clone)]
pub enum Peer {
    /// One of our tools (or `--loopback`): rdma-verbs' endpoint handshake, per QP.
    Ours,
    /// perftest: its destination messages, its barriers, its end.
    Perftest(Perftest),
}

/// What the exchange with a perftest peer has settled.
#[derive(Debug, Clone)]
pub struct Perftest {
    /// The peer's version text.
    pub version: String,
    /// The larger cycle buffer of the two sides.
    pub cycle_buffer: usize,
    /// The smaller active MTU of the two ports.
    pub mtu: Mtu,
    client: bool,
    with_gid: bool,
    /// Over rdma_cm (`-R`): binary destinations, QPs connected by the CM, no `done`.
    cm: bool,
    /// This side's destination of QP 0, sent again at every barrier.
    me: Dest,
}

/// One QP of this side, as the exchange needs it.
pub struct Offer<'q> {
    /// The QP (in RESET or INIT).
    pub qp: &'q QueuePair,
    /// What the peer may do on it.
    pub access: QpAccess,
    /// The region the peer may target, if any.
    pub mr: Option<RemoteMr>,
    /// RTS attributes (timeout, READs outstanding).
    pub rts: RtsAttr,
}

/// Writes `mine`, then reads the peer's message of `theirs.len()` bytes (the client), or
/// the reverse (the server). Each message goes in one write: perftest reads each with one
/// `read` of its size.
fn xchg(stream: &mut dyn Stream, client: bool, mine: &[u8], theirs: &mut [u8], what: &str) -> Res<()> {
    let write = |s: &mut dyn Stream| s.write_all(mine).and_then(|()| s.flush());
    let done = if client {
        write(stream).and_then(|()| stream.read_exact(theirs))
    } else {
        stream.read_exact(theirs).and_then(|()| write(stream))
    };
    done.map_err(|e| format!("perftest exchange, {what}: {e}").into())
}

/// The first steps, right after the TCP connection: versions, system data, MTU. Tells
/// whether the peer is ours or perftest.
pub fn greet(stream: &mut dyn Stream, client: bool, ctx: &Context, c: &Common) -> Res<Peer> {
    let mut theirs = [0u8; msg::VERSION_LEN];
    xchg(stream, client, msg::OUR_VERSION, &mut theirs, "versions")?;
    let kind = msg::parse_version(&theirs)?;
    let page = u32::try_from(rdma_verbs::page_size()).unwrap_or(msg::MAX_CYCLE_BUFFER);
    let cycle = xchg_sys(stream, client, page, "cycle buffer", msg::MAX_CYCLE_BUFFER)?;
    xchg_sys(stream, client, CACHE_LINE, "cache line", msg::MAX_CACHE_LINE)?;
    let port = ctx.query_port(c.ib_port)?;
    let mut mtu = [0u8; 2];
    xchg(stream, client, &msg::mtu_bytes(port.active_mtu), &mut mtu, "MTU")?;
    let peer_mtu = msg::parse_mtu(mtu)?;
    let version = match kind {
        PeerKind::Ours => return Ok(Peer::Ours),
        PeerKind::Perftest(v) => v,
    };
    let cm = match stream.cm_link() {
        Some(link) => {
            link.perftest_peer = true;
            true
        }
        None => false,
    };
    let mtu = if peer_mtu.to_raw() < port.active_mtu.to_raw() { peer_mtu } else { port.active_mtu };
    let with_gid = port.is_ethernet() || c.gid_index.is_some();
    let cycle_buffer = cycle.max(page) as usize;
    Ok(Peer::Perftest(Perftest { version, cycle_buffer, mtu, client, with_gid, cm, me: Dest::default() }))
}

/// One system data field each way; the larger of the two.
fn xchg_sys(stream: &mut dyn Stream, client: bool, mine: u32, what: &str, max: u32) -> Res<u32> {
    let mut theirs = [0u8; 4];
    xchg(stream, client, &(mine as i32).to_be_bytes(), &mut theirs, what)?;
    Ok(msg::parse_sys(theirs, what, max)?.max(mine))
}

impl Peer {
    /// Connects this side's QPs to the peer's, one [`Offer`] each in the same order on
    /// both sides, and returns each peer QP's region: from its endpoint (ours), or its
    /// rkey and address with the length `peer_len` this side will use (perftest's
    /// message carries no length: as perftest, this side trusts the peer to have
    /// registered what the test needs).
    pub fn connect(
        &mut self,
        c: &Common,
        shape: Shape,
        offers: &[Offer<'_>],
        peer_len: u64,
        stream: &mut dyn Stream,
    ) -> Res<Vec<Option<RemoteMr>>> {
        match self {
            Peer::Ours if stream.cm_link().is_some() => ours_over_cm(offers, stream),
            Peer::Ours => offers
                .iter()
                .map(|o| {
                    let hs = c.handshake(o.qp, o.access).rts(o.rts);
                    let hs = match o.mr {
                        Some(mr) => hs.advertise(mr),
                        None => hs,
                    };
                    Ok(hs.connect(stream)?.remote.mr)
                })
                .collect(),
            Peer::Perftest(p) => p.connect(c, shape, offers, peer_len, stream),
        }
    }

    /// Whether the peer is perftest.
    pub fn is_perftest(&self) -> bool {
        matches!(self, Peer::Perftest(_))
    }
}

/// Two of ours over rdma_cm: the test's connections made ([`crate::cm`]), each QP's
/// region (or none) in rdma-verbs' format, with its length, one exchange per QP.
fn ours_over_cm(offers: &[Offer<'_>], stream: &mut dyn Stream) -> Res<Vec<Option<RemoteMr>>> {
    stream.cm_link().ok_or("no rdma_cm link")?.connect_round()?;
    let client = stream.cm_link().is_some_and(|l| l.is_client());
    offers
        .iter()
        .map(|o| {
            let mut mine = [0u8; 1 + RemoteMr::WIRE_LEN];
            if let Some(mr) = o.mr {
                mine[0] = 1;
                mine[1..].copy_from_slice(&mr.to_bytes());
            }
            let mut theirs = [0u8; 1 + RemoteMr::WIRE_LEN];
            xchg(stream, client, &mine, &mut theirs, "regions")?;
            match theirs[0] {
                0 => Ok(None),
                1 => Ok(Some(RemoteMr::from_bytes(&theirs[1..])?)),
                b => Err(format!("the peer's region message starts with {b:#04x}, expected 0 or 1").into()),
            }
        })
        .collect()
}

impl Perftest {
    fn connect(
        &mut self,
        c: &Common,
        shape: Shape,
        offers: &[Offer<'_>],
        peer_len: u64,
        stream: &mut dyn Stream,
    ) -> Res<Vec<Option<RemoteMr>>> {
        let Some(first) = offers.first() else { return Err("no QP to connect".into()) };
        if self.cm {
            stream.cm_link().ok_or("no rdma_cm link")?.connect_round()?;
        }
        let ctx = first.qp.context();
        let (lid, gid) = self.local_address(ctx, c)?;
        let gid = gid.map(|g| (g.index, g.gid));
        let out_reads = responder_reads(ctx)?;
        let mine: Vec<Dest> = offers
            .iter()
            .map(|o| Dest {
                lid,
                out_reads: out_reads.into(),
                qpn: o.qp.qp_num(),
                psn: o.qp.psn(),
                rkey: o.mr.map_or(0, |m| m.rkey),
                vaddr: o.mr.map_or(0, |m| m.addr),
                gid: gid.map(|(_, g)| g.0),
                srqn: 0,
            })
            .collect();
        self.me = mine[0];
        for _ in 0..shape.lead {
            self.barrier(stream)?;
        }
        let peers = mine.iter().map(|d| self.exchange(stream, d)).collect::<Res<Vec<Dest>>>()?;
        // Over rdma_cm the CM brought the QPs up (perftest checks no GID types then).
        for (o, peer) in offers.iter().zip(&peers).filter(|_| !self.cm) {
            check_gid_types(gid.map(|(_, g)| g), peer)?;
            self.bring_up(c, o, peer, gid.map(|(i, _)| i), out_reads)?;
        }
        for d in &mine {
            self.exchange(stream, d)?;
        }
        for _ in 0..shape.trail {
            self.barrier(stream)?;
        }
        Ok(peers.iter().map(|p| Some(RemoteMr { addr: p.vaddr, len: peer_len, rkey: p.rkey })).collect())
    }

    /// The LID and, in the GID form, the GID this side sends from (`-x`, else the
    /// default: RoCE v2 with an IPv4 address first, as perftest's choice).
    fn local_address(&self, ctx: &Context, c: &Common) -> Res<(u16, Option<rdma_verbs::GidEntry>)> {
        let port = ctx.query_port(c.ib_port)?;
        if self.cm {
            // Informational only (perftest prints it): the CM chose the path.
            let gid = ctx.query_gid(c.ib_port, c.gid_index.unwrap_or(0)).ok();
            return Ok((port.lid, gid));
        }
        let gid = match (self.with_gid, c.gid_index) {
            (false, _) => None,
            (true, Some(i)) => Some(ctx.query_gid(c.ib_port, i)?),
            (true, None) => Some(ctx.default_gid(c.ib_port)?),
        };
        Ok((port.lid, gid))
    }

    /// One destination exchange: this side's `mine`, the peer's back.
    fn exchange(&self, stream: &mut dyn Stream, mine: &Dest) -> Res<Dest> {
        if self.cm {
            let mut buf = [0u8; msg::DEST_LEN_CM];
            xchg(stream, self.client, &mine.to_cm_bytes(), &mut buf, "destinations")?;
            return Ok(Dest::parse_cm(&buf)?);
        }
        let len = if self.with_gid { msg::DEST_LEN_GID } else { msg::DEST_LEN };
        let mut buf = [0u8; msg::DEST_LEN_GID];
        xchg(stream, self.client, &mine.to_bytes(), &mut buf[..len], "destinations")?;
        Ok(Dest::parse(&buf[..len], self.with_gid)?)
    }

    /// A destination exchange as a barrier (perftest's `ctx_hand_shake` of QP 0).
    pub fn barrier(&self, stream: &mut dyn Stream) -> Res<()> {
        self.exchange(stream, &self.me).map(drop)
    }

    /// RESET (or INIT) to RTS towards `peer`, as perftest's `ctx_connect`: the smaller
    /// MTU, the peer's PSN and QP number, its GID on RoCE (LID on InfiniBand), no more
    /// READs outstanding than the peer takes.
    fn bring_up(&self, c: &Common, o: &Offer<'_>, peer: &Dest, sgid: Option<u32>, out_reads: u8) -> Res<()> {
        if o.qp.state()? != QpState::Init {
            o.qp.to_init(&InitAttr { port: c.ib_port, access: o.access, ..InitAttr::default() })?;
        }
        let remote = match (peer.gid, sgid) {
            (Some(g), Some(i)) => Remote::gid(Gid(g), i),
            _ if peer.lid != 0 => Remote::lid(peer.lid),
            _ => return Err("the peer sent neither a LID nor a GID: is it on InfiniBand without -x?".into()),
        };
        let rtr = RtrAttr {
            port: c.ib_port,
            path_mtu: self.mtu,
            max_dest_rd_atomic: out_reads,
            ..RtrAttr::new(remote, peer.qpn, peer.psn)
        };
        o.qp.to_rtr(&rtr)?;
        // perftest's requester takes the responder's count as its own; ours keeps -o below it.
        let peer_reads = u8::try_from(peer.out_reads).unwrap_or(u8::MAX);
        let rts = RtsAttr { sq_psn: o.qp.psn(), max_rd_atomic: o.rts.max_rd_atomic.min(peer_reads), ..o.rts };
        Ok(o.qp.to_rts(&rts)?)
    }

    /// ib_write_bw's and ib_read_bw's end: a barrier, the reports (the client's own; a
    /// server sends zeros), the close. Returns the peer's report.
    pub fn end_bw(&self, stream: &mut dyn Stream, mine: &BwReport) -> Res<BwReport> {
        self.barrier(stream)?;
        let mut theirs = [[0u8; 8]; 5];
        for (m, t) in mine.to_fields().iter().zip(&mut theirs) {
            xchg(stream, self.client, m, t, "reports")?;
        }
        let report = BwReport::from_fields(theirs)?;
        self.close(stream)?;
        Ok(report)
    }

    /// perftest's `ctx_close_connection`: a barrier and `done`. The peer's `done` is read
    /// (it may have closed already: that is no error).
    pub fn close(&self, stream: &mut dyn Stream) -> Res<()> {
        self.barrier(stream)?;
        if self.cm {
            // perftest's rdma_cm mode ends with the barrier.
            return Ok(());
        }
        // The peer may be gone once its `done` is out: a failed write here changes nothing.
        let _ = stream.write_all(msg::DONE).and_then(|()| stream.flush());
        let mut done = [0u8; msg::DONE.len()];
        let _ = stream.read_exact(&mut done);
        Ok(())
    }
}

/// The RDMA READs this side's QPs take as responders (as `RtrAttr`'s default, within the
/// device's limit): what the destination message tells the peer.
fn responder_reads(ctx: &Context) -> Res<u8> {
    let dev = ctx.query_device()?;
    let default = RtrAttr::default().max_dest_rd_atomic;
    Ok(u8::try_from(dev.max_qp_rd_atom).unwrap_or(u8::MAX).min(default))
}

/// perftest's `ctx_check_gid_compatibility`: both GIDs IPv4-mapped, or neither.
fn check_gid_types(mine: Option<Gid>, peer: &Dest) -> Res<()> {
    let (Some(mine), Some(theirs)) = (mine, peer.gid) else { return Ok(()) };
    let v4 = |g: &Gid| g.ipv4().is_some();
    if v4(&mine) != v4(&Gid(theirs)) {
        return Err(format!(
            "the peer's GID {:02x?} and this side's {:02x?} are not both IPv4 (or both IPv6): \
             choose another GID with -x",
            theirs, mine.0
        )
        .into());
    }
    Ok(())
}
