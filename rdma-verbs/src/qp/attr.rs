//! What a QP is made with and moved through: capabilities, access, state, and the
//! attributes of each transition with the masks the spec requires.

use crate::ah::{AhAttr, Remote};
use crate::c_enum::c_enum;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::port::{Gid, Mtu};
use std::fmt;

/// Work requests per queue when the builder is not told otherwise.
pub const DEFAULT_MAX_WR: u32 = 128;

/// The Q_Key [`InitAttr::default`] gives UD QPs. Its top bit is clear: Q_Keys with the
/// top bit set are controlled keys that unprivileged senders cannot use.
pub const DEFAULT_QKEY: u32 = 0x1111_1111;

/// Largest packet sequence number: PSNs are 24 bits.
pub const MAX_PSN: u32 = 0xFF_FFFF;

/// A random 24-bit PSN: what a QP starts from unless [`QueuePairBuilder::psn`](crate::QueuePairBuilder::psn) fixes it.
/// Starting PSNs should differ between connections, so that packets of an old connection
/// are not taken for the new one's.
pub fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    use std::time::SystemTime;
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    h.write_u128(now);
    h.write_u32(std::process::id());
    (h.finish() & u64::from(MAX_PSN)) as u32
}

pub(crate) use crate::codes::QpType;

c_enum! {
    /// QP state (`enum ibv_qp_state`), as `ibv_query_qp` reports it.
    QpState: u32 {
        /// Just created, or reset: nothing works, nothing is kept.
        Reset = 0,
        /// Initialized: receives can be posted, nothing is processed yet.
        Init = 1,
        /// Ready to receive.
        Rtr = 2,
        /// Ready to send.
        Rts = 3,
        /// Send queue drained.
        Sqd = 4,
        /// Send queue error (UD, UC): receives still work.
        Sqe = 5,
        /// Error: outstanding work requests complete with a flush error.
        Err = 6,
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QpState::Reset => f.write_str("RESET"),
            QpState::Init => f.write_str("INIT"),
            QpState::Rtr => f.write_str("RTR"),
            QpState::Rts => f.write_str("RTS"),
            QpState::Sqd => f.write_str("SQD"),
            QpState::Sqe => f.write_str("SQE"),
            QpState::Err => f.write_str("ERR"),
            QpState::Unknown(v) => write!(f, "unknown state {v}"),
        }
    }
}

bitflags::bitflags! {
    /// What remote peers may do through a connected QP (`qp_access_flags`); the memory
    /// region must allow it too.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAccess: u32 {
        /// Incoming RDMA WRITE (RC, UC).
        const REMOTE_WRITE = ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        /// Incoming RDMA READ (RC).
        const REMOTE_READ = ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        /// Incoming atomics (RC).
        const REMOTE_ATOMIC = ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
        // Bits this crate does not name are kept, not dropped.
        const _ = !0;
    }
}

bitflags::bitflags! {
    /// The operations a QP may post through the extended `ibv_wr_*` API
    /// (`enum ibv_qp_create_send_ops_flags`), chosen at creation with
    /// [`QueuePairBuilder::extended_send_ops`](crate::QueuePairBuilder::extended_send_ops).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendOps: u64 {
        /// RDMA WRITE.
        const RDMA_WRITE = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE.0 as u64;
        /// RDMA WRITE with immediate.
        const RDMA_WRITE_WITH_IMM = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM.0 as u64;
        /// SEND.
        const SEND = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND.0 as u64;
        /// SEND with immediate.
        const SEND_WITH_IMM = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_IMM.0 as u64;
        /// RDMA READ.
        const RDMA_READ = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_READ.0 as u64;
        /// Atomic compare and swap.
        const ATOMIC_CMP_AND_SWP = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP.0 as u64;
        /// Atomic fetch and add.
        const ATOMIC_FETCH_AND_ADD = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD.0 as u64;
        /// Local invalidate.
        const LOCAL_INV = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_LOCAL_INV.0 as u64;
        /// Memory window bind.
        const BIND_MW = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_BIND_MW.0 as u64;
        /// SEND with invalidate.
        const SEND_WITH_INV = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_INV.0 as u64;
        /// RDMA ATOMIC WRITE (IBTA 1.5, [`SendWr::atomic_write`](crate::SendWr::atomic_write)): RC
        /// only, on a device with `IB_UVERBS_DEVICE_ATOMIC_WRITE` (rxe from Linux 6.2);
        /// [`QueuePairBuilder::build`](crate::QueuePairBuilder::build) refuses it elsewhere with
        /// [`Error::NotSupported`](crate::Error::NotSupported).
        const ATOMIC_WRITE = ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_WRITE.0 as u64;
        // Bits this crate does not name are passed through.
        const _ = !0;
    }
}

impl SendOps {
    /// The operations that only reliable connected QPs can post.
    pub const RC_ONLY: SendOps = SendOps::RDMA_READ
        .union(SendOps::ATOMIC_CMP_AND_SWP)
        .union(SendOps::ATOMIC_FETCH_AND_ADD)
        .union(SendOps::ATOMIC_WRITE);
}

/// Queue sizes (`struct ibv_qp_cap`): asked for at creation, granted by the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCaps {
    /// Most outstanding send work requests.
    pub max_send_wr: u32,
    /// Most outstanding receive work requests (0 with an SRQ).
    pub max_recv_wr: u32,
    /// Most scatter/gather entries in one send work request.
    pub max_send_sge: u32,
    /// Most scatter/gather entries in one receive work request.
    pub max_recv_sge: u32,
    /// Largest payload that can be sent inline (copied into the work request).
    pub max_inline_data: u32,
}

impl QpCaps {
    pub(crate) fn from_ffi(c: &ffi::ibv_qp_cap) -> QpCaps {
        QpCaps {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        }
    }
}

/// RESET -> INIT attributes. RC and UC QPs use `access`, UD QPs use `qkey`.
///
/// ```
/// use rdma_verbs::{InitAttr, DEFAULT_QKEY};
///
/// // A UD peer sends with the Q_Key the receiver's QP was given at INIT.
/// assert_eq!(InitAttr::default().qkey, DEFAULT_QKEY);
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct InitAttr {
    /// The local port, from 1 (default 1).
    pub port: u8,
    /// Index in the port's P_Key table (default 0).
    pub pkey_index: u16,
    /// What the remote side may do (RC, UC; default: nothing). Must be empty for UD.
    pub access: QpAccess,
    /// The Q_Key (UD; default [`DEFAULT_QKEY`]). Senders must use the same one.
    pub qkey: u32,
}

crate::debug_hex::debug_hex!(InitAttr { port, pkey_index, access, qkey: hex });

impl Default for InitAttr {
    fn default() -> Self {
        InitAttr { port: 1, pkey_index: 0, access: QpAccess::empty(), qkey: DEFAULT_QKEY }
    }
}

/// INIT -> RTR attributes of a connected (RC or UC) QP.
///
/// Defaults: port 1, path MTU 4096 (clamped to the port's active MTU at the transition),
/// `max_dest_rd_atomic` 16 (clamped to the device's `max_qp_rd_atom`), `min_rnr_timer` 12
/// (0.64 ms). `remote` and `dest_qpn` have no meaningful default: [`RtrAttr::new`] takes
/// them, and a transition with the placeholders is refused before C.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RtrAttr {
    /// The local port to send from, from 1.
    pub port: u8,
    /// How to reach the remote QP.
    pub remote: Remote,
    /// Service level (0..=15).
    pub sl: u8,
    /// Path MTU; the smaller of this and the port's active MTU is used.
    pub path_mtu: Mtu,
    /// The remote QP number.
    pub dest_qpn: u32,
    /// The first PSN expected from the remote side: its `sq_psn` (24 bits).
    pub rq_psn: u32,
    /// RDMA READs and atomics the remote side may have outstanding here (RC; clamped to
    /// the device's `max_qp_rd_atom`).
    pub max_dest_rd_atomic: u8,
    /// The RNR NAK timer code (RC; 0..=31, 12 = 0.64 ms): how long a sender that found no
    /// receive posted waits before retrying.
    pub min_rnr_timer: u8,
}

crate::debug_hex::debug_hex!(RtrAttr {
    port,
    remote,
    sl,
    path_mtu,
    dest_qpn: hex,
    rq_psn: hex,
    max_dest_rd_atomic,
    min_rnr_timer
});

impl Default for RtrAttr {
    fn default() -> Self {
        RtrAttr {
            port: 1,
            // A placeholder that the transition refuses (LID 0 is reserved).
            remote: Remote::Lid { dlid: 0, src_path_bits: 0 },
            sl: 0,
            path_mtu: Mtu::Mtu4096,
            dest_qpn: 0,
            rq_psn: 0,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
        }
    }
}

impl RtrAttr {
    /// The remote address, QP number and first PSN, with the defaults for the rest.
    pub fn new(remote: Remote, dest_qpn: u32, rq_psn: u32) -> RtrAttr {
        RtrAttr { remote, dest_qpn, rq_psn, ..RtrAttr::default() }
    }
}

/// RTR -> RTS attributes. UC and UD QPs use only `sq_psn`: give it [`QueuePair::psn`](crate::QueuePair::psn), the
/// PSN [`QueuePair::local_info`](crate::QueuePair::local_info) advertised.
///
/// The defaults cannot hang a sender forever: `timeout` 14 (4.096 us * 2^14, about 67 ms
/// per try), `retry_cnt` 6, `rnr_retry` 6, so a peer that stops answering fails the
/// request with `RETRY_EXC_ERR` after 7 tries, about 0.47 s. Not 7 for either: an
/// `rnr_retry` of 7 means "retry forever while the receiver has no receive posted", and
/// rxe never counts a `retry_cnt` of 7 down, so there it means "retry forever while the
/// peer is silent"; both turn a peer's fault into a silent hang. They are allowed but
/// never the default (perftest gives `retry_cnt` 7). `max_rd_atomic` 16 is clamped to the
/// device's `max_qp_init_rd_atom`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RtsAttr {
    /// The first PSN this QP sends (24 bits): the peer's `rq_psn`, so [`QueuePair::psn`](crate::QueuePair::psn)
    /// (what [`QueuePair::local_info`](crate::QueuePair::local_info) told the peer). Default 0.
    pub sq_psn: u32,
    /// Local ACK timeout code (RC; 0..=31; 0 waits forever).
    pub timeout: u8,
    /// Retries after a timeout before the send fails (RC; 0..=7; 7 is forever on rxe).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK (RC; 0..=7, 7 = forever).
    pub rnr_retry: u8,
    /// RDMA READs and atomics this QP may have outstanding (RC; clamped to the device's
    /// `max_qp_init_rd_atom`).
    pub max_rd_atomic: u8,
}

crate::debug_hex::debug_hex!(RtsAttr { sq_psn: hex, timeout, retry_cnt, rnr_retry, max_rd_atomic });

impl Default for RtsAttr {
    fn default() -> Self {
        RtsAttr { sq_psn: 0, timeout: 14, retry_cnt: 6, rnr_retry: 6, max_rd_atomic: 16 }
    }
}

/// What a peer needs to connect to a QP: exchange it out of band (TCP, a file, ...).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RemoteQpInfo {
    /// QP number.
    pub qpn: u32,
    /// The first PSN it sends.
    pub psn: u32,
    /// Its port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Its GID (the source GID it will use).
    pub gid: Gid,
}

crate::debug_hex::debug_hex!(RemoteQpInfo { qpn: hex, psn: hex, lid: hex, gid });

/// What `ibv_query_qp` reports, the commonly needed fields typed.
#[derive(Clone)]
pub struct QpAttrs {
    /// Current state.
    pub state: QpState,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Next expected receive PSN.
    pub rq_psn: u32,
    /// Next send PSN.
    pub sq_psn: u32,
    /// Remote QP number (connected QPs).
    pub dest_qp_num: u32,
    /// Remote access allowed.
    pub access: QpAccess,
    /// Queue sizes.
    pub cap: QpCaps,
    /// The primary path (connected QPs).
    pub path: AhAttr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Port.
    pub port: u8,
    /// Outstanding RDMA READs and atomics as initiator.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READs and atomics as target.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// Local ACK timeout code.
    pub timeout: u8,
    /// Retry count.
    pub retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry: u8,
    /// True while the send queue drains (SQD).
    pub sq_draining: bool,
    /// Everything `ibv_query_qp` returned.
    pub raw: ffi::ibv_qp_attr,
}

impl fmt::Debug for QpAttrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QpAttrs")
            .field("state", &self.state)
            .field("path_mtu", &self.path_mtu)
            .field("qkey", &format_args!("{:#x}", self.qkey))
            .field("rq_psn", &format_args!("{:#x}", self.rq_psn))
            .field("sq_psn", &format_args!("{:#x}", self.sq_psn))
            .field("dest_qp_num", &format_args!("{:#x}", self.dest_qp_num))
            .field("access", &self.access)
            .field("cap", &self.cap)
            .field("path", &self.path)
            .field("port", &self.port)
            .field("timeout", &self.timeout)
            .field("retry_cnt", &self.retry_cnt)
            .field("rnr_retry", &self.rnr_retry)
            .finish_non_exhaustive()
    }
}

pub(crate) type Mask = ffi::ibv_qp_attr_mask;

/// The attributes each transition requires, per transport (IB spec, `ibv_modify_qp(3)`).
pub(crate) fn required_mask(qp_type: QpType, to: QpState) -> Mask {
    use ffi::ibv_qp_attr_mask as M;
    let rc = qp_type == QpType::Rc;
    match (to, qp_type) {
        (QpState::Init, QpType::Ud) => M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_QKEY,
        (QpState::Init, _) => M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
        (QpState::Rtr, QpType::Ud) => M::IBV_QP_STATE,
        (QpState::Rtr, _) => {
            let m = M::IBV_QP_STATE | M::IBV_QP_AV | M::IBV_QP_PATH_MTU | M::IBV_QP_DEST_QPN | M::IBV_QP_RQ_PSN;
            if rc {
                m | M::IBV_QP_MAX_DEST_RD_ATOMIC | M::IBV_QP_MIN_RNR_TIMER
            } else {
                m
            }
        }
        (QpState::Rts, _) if rc => {
            M::IBV_QP_STATE
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_MAX_QP_RD_ATOMIC
        }
        (QpState::Rts, _) => M::IBV_QP_STATE | M::IBV_QP_SQ_PSN,
        _ => M::IBV_QP_STATE,
    }
}

/// The names of the bits of an attribute mask, as `IBV_QP_*` without the prefix.
pub(crate) fn mask_names(mask: Mask) -> String {
    use ffi::ibv_qp_attr_mask as M;
    const NAMES: [(Mask, &str); 21] = [
        (M::IBV_QP_STATE, "STATE"),
        (M::IBV_QP_CUR_STATE, "CUR_STATE"),
        (M::IBV_QP_EN_SQD_ASYNC_NOTIFY, "EN_SQD_ASYNC_NOTIFY"),
        (M::IBV_QP_ACCESS_FLAGS, "ACCESS_FLAGS"),
        (M::IBV_QP_PKEY_INDEX, "PKEY_INDEX"),
        (M::IBV_QP_PORT, "PORT"),
        (M::IBV_QP_QKEY, "QKEY"),
        (M::IBV_QP_AV, "AV"),
        (M::IBV_QP_PATH_MTU, "PATH_MTU"),
        (M::IBV_QP_TIMEOUT, "TIMEOUT"),
        (M::IBV_QP_RETRY_CNT, "RETRY_CNT"),
        (M::IBV_QP_RNR_RETRY, "RNR_RETRY"),
        (M::IBV_QP_RQ_PSN, "RQ_PSN"),
        (M::IBV_QP_MAX_QP_RD_ATOMIC, "MAX_QP_RD_ATOMIC"),
        (M::IBV_QP_ALT_PATH, "ALT_PATH"),
        (M::IBV_QP_MIN_RNR_TIMER, "MIN_RNR_TIMER"),
        (M::IBV_QP_SQ_PSN, "SQ_PSN"),
        (M::IBV_QP_MAX_DEST_RD_ATOMIC, "MAX_DEST_RD_ATOMIC"),
        (M::IBV_QP_PATH_MIG_STATE, "PATH_MIG_STATE"),
        (M::IBV_QP_CAP, "CAP"),
        (M::IBV_QP_DEST_QPN, "DEST_QPN"),
    ];
    let names: Vec<&str> = NAMES.iter().filter(|(bit, _)| mask.0 & bit.0 != 0).map(|&(_, n)| n).collect();
    names.join("|")
}

/// The states a transition to `to` may start from (RESET and ERR: any).
pub(crate) fn allowed_from(to: QpState) -> Option<&'static [QpState]> {
    match to {
        QpState::Init => Some(&[QpState::Reset, QpState::Init]),
        QpState::Rtr => Some(&[QpState::Init]),
        QpState::Rts => Some(&[QpState::Rtr]),
        _ => None,
    }
}

/// Refuses an illegal transition before C, naming the current and the requested state.
pub(crate) fn check_transition(qpn: u32, qp_type: QpType, from: QpState, to: QpState) -> Result<()> {
    let Some(allowed) = allowed_from(to) else { return Ok(()) };
    if allowed.contains(&from) {
        return Ok(());
    }
    let list: Vec<String> = allowed.iter().map(ToString::to_string).collect();
    Err(Error::invalid(
        Verb::ModifyQp,
        format!(
            "{qp_type} QP {qpn:#x} is in {from}; {to} can be reached only from {} \
             (RESET -> INIT -> RTR -> RTS; reset() and to_error() work from any state)",
            list.join(" or ")
        ),
    ))
}

/// Keeps a value within `bits` bits or says which field does not fit.
pub(crate) fn fits(value: u32, max: u32, what: &str) -> Result<()> {
    if value > max {
        return Err(Error::invalid(Verb::ModifyQp, format!("{what} {value:#x} is above its maximum {max:#x}")));
    }
    Ok(())
}
