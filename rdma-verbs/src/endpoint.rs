//! Connecting two QPs over an out-of-band byte stream (a TCP connection, most often): an
//! [`Endpoint`] descriptor with a compact versioned wire format, and a [`Handshake`] that
//! exchanges endpoints and brings a QP up with its peer. The guide (the steps of the
//! handshake) and an example are on [`Handshake`], public, where rustdoc shows them.

use std::io::{Read, Write};

use crate::ah::{AddressHandle, AhAttr, Remote};
use crate::error::{Error, Result, Verb, WireError};
use crate::mr::RemoteMr;
use crate::port::{Mtu, PortAttr};
use crate::qp::{InitAttr, QpAccess, QpState, QpType, QueuePair, RtrAttr, RtsAttr};
use crate::wire::{exchange, give_up, sync, wire_error as wire, Endpoint, Status};

// ---- the handshake -----------------------------------------------------------------

/// Brings a QP up with a peer over a byte stream. Build it with the QP, set what differs
/// from the defaults, then call [`connect`](Self::connect) (RC, UC) or
/// [`ready_ud`](Self::ready_ud) (UD) on each side.
///
/// The PSN it sends from and advertises is the QP's own, chosen when the QP was built
/// ([`QueuePair::psn`]; fix it with [`QueuePairBuilder::psn`]).
///
/// Defaults: port 1, no remote access, path MTU up to 4096
/// (and never above the port's active MTU), the GID of [`Context::default_gid`] on RoCE
/// (index 0 on InfiniBand), Q_Key [`DEFAULT_QKEY`], P_Key index 0, service level 0, no
/// memory region advertised.
///
/// # The handshake
///
/// Both sides run the same steps, each writing before it reads, so neither waits for the
/// other to speak first: write the local endpoint, read the peer's, move the QP on (RTR
/// and RTS, or an address handle for UD), write a 6-byte status (`"RDVS"`, version,
/// 0 ready / 1 rejected your endpoint / 2 could not bring my QP up), read the peer's.
/// When [`connect`](Self::connect) returns `Ok`, both QPs are at RTS; when a side fails,
/// the other is told why instead of waiting for a message that will not come. The
/// endpoint's byte format is in [`wire`](crate::wire).
///
/// Two RC QPs connected over TCP, and a SEND each way: each side is the function `side`,
/// given its end of a TCP connection (this example is `tests/device/doc/handshake.rs`,
/// which the device tests run):
///
#[doc = concat!("```no_run\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/device/doc/handshake.rs")), "```")]
///
/// [`Context::default_gid`]: crate::Context::default_gid
/// [`DEFAULT_QKEY`]: crate::qp::DEFAULT_QKEY
/// [`QueuePairBuilder::psn`]: crate::qp::QueuePairBuilder::psn
#[must_use = "a handshake does nothing until connect() or ready_ud() is called"]
#[derive(Debug, Clone)]
pub struct Handshake<'a> {
    qp: &'a QueuePair,
    init: InitAttr,
    max_mtu: Mtu,
    gid_index: Option<u32>,
    mr: Option<RemoteMr>,
    sl: u8,
    rts: RtsAttr,
}

/// An RC or UC QP connected by [`Handshake::connect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connection {
    /// What this side sent.
    pub local: Endpoint,
    /// What the peer sent (its memory region, if it advertised one, is `remote.mr`).
    pub remote: Endpoint,
    /// The path MTU in use: the smallest of both sides' and the port's active MTU.
    pub path_mtu: Mtu,
}

/// A UD peer, as [`Handshake::ready_ud`] found it: where to send datagrams.
#[derive(Clone)]
pub struct UdPeer {
    /// The address handle of the peer.
    pub ah: AddressHandle,
    /// The peer's QP number.
    pub qpn: u32,
    /// The peer's Q_Key: sends to it must carry this one.
    pub qkey: u32,
    /// What this side sent.
    pub local: Endpoint,
    /// What the peer sent.
    pub remote: Endpoint,
}

crate::debug_hex::debug_hex!(UdPeer { ah, qpn: hex, qkey: hex, local, remote });

impl UdPeer {
    /// The largest datagram both sides can carry: the smaller of the two MTUs. A receive
    /// buffer needs 40 bytes more, for the global route header the device puts first.
    pub fn max_payload(&self) -> u32 {
        min_mtu(self.local.mtu, self.remote.mtu).bytes()
    }
}

fn min_mtu(a: Mtu, b: Mtu) -> Mtu {
    if a.to_raw() <= b.to_raw() {
        a
    } else {
        b
    }
}

impl<'a> Handshake<'a> {
    /// A handshake for `qp` with the defaults.
    pub fn new(qp: &'a QueuePair) -> Self {
        Handshake {
            qp,
            init: InitAttr::default(),
            max_mtu: Mtu::Mtu4096,
            gid_index: None,
            mr: None,
            sl: 0,
            rts: RtsAttr::default(),
        }
    }

    /// The local port, from 1 (default 1).
    pub fn port(mut self, port: u8) -> Self {
        self.init.port = port;
        self
    }

    /// What the peer may do through the QP (RC, UC; default nothing). The memory region
    /// must allow it too.
    pub fn access(mut self, access: QpAccess) -> Self {
        self.init.access = access;
        self
    }

    /// The Q_Key of a UD QP (default [`DEFAULT_QKEY`](crate::qp::DEFAULT_QKEY)); the
    /// peer sends with it.
    pub fn qkey(mut self, qkey: u32) -> Self {
        self.init.qkey = qkey;
        self
    }

    /// The P_Key index (default 0).
    pub fn pkey_index(mut self, index: u16) -> Self {
        self.init.pkey_index = index;
        self
    }

    /// The largest path MTU this side offers (default 4096). The smallest of both
    /// sides' offers and the port's active MTU is used.
    pub fn max_mtu(mut self, mtu: Mtu) -> Self {
        self.max_mtu = mtu;
        self
    }

    /// Sends from this GID index (a [`GidEntry::index`](crate::GidEntry::index)) instead
    /// of the one chosen automatically.
    pub fn gid_index(mut self, index: u32) -> Self {
        self.gid_index = Some(index);
        self
    }

    /// Tells the peer about a memory region it may reach by RDMA (RC, UC): the peer
    /// finds it in [`Connection::remote`]`.mr`.
    pub fn advertise(mut self, mr: RemoteMr) -> Self {
        self.mr = Some(mr);
        self
    }

    /// The service level of the path (0..=15, default 0).
    pub fn sl(mut self, sl: u8) -> Self {
        self.sl = sl;
        self
    }

    /// RC timeouts and retry counts for RTS (default [`RtsAttr::default`]); its
    /// `sq_psn` is replaced by the QP's PSN ([`QueuePair::psn`]).
    pub fn rts(mut self, rts: RtsAttr) -> Self {
        self.rts = rts;
        self
    }

    /// RESET -> INIT, so that receives can be posted before [`connect`](Self::connect)
    /// or [`ready_ud`](Self::ready_ud): a peer may send as soon as they return. Does
    /// nothing on a QP already in INIT.
    pub fn init(&self) -> Result<()> {
        match self.qp.state()? {
            QpState::Init => Ok(()),
            _ => self.qp.to_init(&self.init),
        }
    }

    /// The port's attributes, the GID index to send from, and the endpoint to send.
    fn local(&self) -> Result<(PortAttr, u32, Endpoint)> {
        const VERB: Verb = Verb::Handshake;
        self.qp.by_hand(VERB)?;
        let ctx = self.qp.context();
        let port_num = self.init.port;
        let port = ctx.query_port(port_num)?;
        let entry = match self.gid_index {
            Some(i) => ctx.query_gid(port_num, i)?,
            None if port.is_ethernet() => ctx.default_gid(port_num)?,
            None => ctx.query_gid(port_num, 0)?,
        };
        let sgid_index = entry.index;
        let mtu = match port.active_mtu {
            Mtu::Unknown(_) => self.max_mtu,
            active => min_mtu(self.max_mtu, active),
        };
        let is_ud = self.qp.qp_type() == QpType::Ud;
        let local = Endpoint {
            transport: self.qp.qp_type(),
            qpn: self.qp.qp_num(),
            psn: self.qp.psn(),
            qkey: if is_ud { self.init.qkey } else { 0 },
            lid: port.lid,
            gid: entry.gid,
            mtu,
            mr: self.mr,
        };
        local.validate().map_err(|e| Error::invalid(VERB, format!("this side's endpoint is unusable: {e}")))?;
        Ok((port, sgid_index, local))
    }

    /// The endpoint this side will send: QP number, PSN, the port's LID, the chosen GID,
    /// the MTU offered, the advertised region.
    pub fn endpoint(&self) -> Result<Endpoint> {
        self.local().map(|(_, _, ep)| ep)
    }

    /// How to reach `peer` from `port`: by GID on RoCE (the only way there), by LID on
    /// InfiniBand when the peer has one, else by GID (another subnet).
    fn route(&self, port: &PortAttr, sgid_index: u32, local: &Endpoint, peer: &Endpoint) -> Result<Remote, WireError> {
        if peer.transport != local.transport {
            return Err(WireError::Incompatible(format!(
                "the peer's QP is {}, this one is {}: both sides must use the same transport",
                peer.transport, local.transport
            )));
        }
        if port.is_ethernet() {
            if peer.gid.is_zero() {
                return Err(WireError::Incompatible(format!(
                    "the peer sent no GID, but port {} is RoCE, where peers are addressed by GID",
                    self.init.port
                )));
            }
            return Ok(Remote::gid(peer.gid, sgid_index));
        }
        if peer.lid != 0 {
            Ok(Remote::lid(peer.lid))
        } else {
            Ok(Remote::gid(peer.gid, sgid_index))
        }
    }

    /// Exchanges endpoints over `stream` and brings the RC or UC QP to RTS: INIT (unless
    /// [`init`](Self::init) did it), RTR towards the peer with the smaller path MTU,
    /// RTS. Both sides are at RTS when it returns `Ok`; a failure on either side is an
    /// error on both. A read timeout set on the stream bounds each read.
    pub fn connect<S: Read + Write + ?Sized>(&self, stream: &mut S) -> Result<Connection> {
        if self.qp.qp_type() == QpType::Ud {
            return Err(Error::invalid(Verb::Handshake, "UD QPs are not connected: call ready_ud()"));
        }
        let (port, sgid_index, local) = self.local()?;
        self.init()?;
        let remote = match exchange(stream, &local) {
            Ok(r) => r,
            Err(e @ Error::Wire { .. }) => return give_up(stream, Status::Rejected, e),
            Err(e) => return Err(e),
        };
        let path = match self.route(&port, sgid_index, &local, &remote) {
            Ok(p) => p,
            Err(e) => return give_up(stream, Status::Rejected, wire("checking the peer's endpoint", e)),
        };
        let path_mtu = min_mtu(local.mtu, remote.mtu);
        let rtr = RtrAttr { port: self.init.port, sl: self.sl, path_mtu, ..RtrAttr::new(path, remote.qpn, remote.psn) };
        let up = self.qp.to_rtr(&rtr).and_then(|()| self.qp.to_rts(&RtsAttr { sq_psn: self.qp.psn(), ..self.rts }));
        if let Err(e) = up {
            return give_up(stream, Status::Failed, e);
        }
        sync(stream, Status::Ready)?;
        // to_rtr clamps to the port's active MTU, which `local.mtu` already is below.
        Ok(Connection { local, remote, path_mtu })
    }

    /// Brings the UD QP to RTS, exchanges endpoints over `stream` and makes the address
    /// handle of the peer. Both sides are ready when it returns `Ok`.
    pub fn ready_ud<S: Read + Write + ?Sized>(&self, stream: &mut S) -> Result<UdPeer> {
        if self.qp.qp_type() != QpType::Ud {
            return Err(Error::invalid(
                Verb::Handshake,
                format!("ready_ud() is for UD QPs; a {} QP is connected with connect()", self.qp.qp_type()),
            ));
        }
        if self.mr.is_some() {
            return Err(Error::invalid(Verb::Handshake, "UD QPs cannot do RDMA: advertise no memory region"));
        }
        let (port, sgid_index, local) = self.local()?;
        self.init()?;
        if self.qp.state()? == QpState::Init {
            self.qp.to_rtr_ud()?;
        }
        if self.qp.state()? == QpState::Rtr {
            self.qp.to_rts(&RtsAttr { sq_psn: self.qp.psn(), ..self.rts })?;
        }
        let remote = match exchange(stream, &local) {
            Ok(r) => r,
            Err(e @ Error::Wire { .. }) => return give_up(stream, Status::Rejected, e),
            Err(e) => return Err(e),
        };
        let path = match self.route(&port, sgid_index, &local, &remote) {
            Ok(p) => p,
            Err(e) => return give_up(stream, Status::Rejected, wire("checking the peer's endpoint", e)),
        };
        let attr = AhAttr { sl: self.sl, ..AhAttr::new(self.init.port, path) };
        let ah = match AddressHandle::new(self.qp.pd(), &attr) {
            Ok(ah) => ah,
            Err(e) => return give_up(stream, Status::Failed, e),
        };
        sync(stream, Status::Ready)?;
        Ok(UdPeer { ah, qpn: remote.qpn, qkey: remote.qkey, local, remote })
    }
}
