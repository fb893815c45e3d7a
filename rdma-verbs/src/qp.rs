//! Queue pairs (`struct ibv_qp`): creation with capabilities checked against the device,
//! and the state machine RESET -> INIT -> RTR -> RTS, each transition with the attribute
//! mask the InfiniBand spec requires for the QP's transport.
//!
//! ```no_run
//! # fn main() -> rdma_verbs::Result<()> {
//! use rdma_verbs::qp::{InitAttr, QpAccess, QpType, QueuePair};
//! use rdma_verbs::{CompletionQueue, Context, ProtectionDomain};
//!
//! let ctx = Context::open_first()?;
//! let pd = ProtectionDomain::new(&ctx)?;
//! let cq = CompletionQueue::new(&ctx, 256)?;
//! let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(64).build()?;
//! let me = qp.local_info(1)?; // with the PSN the QP will send from: qp.psn()
//! # let peer = me;
//! // ... exchange `me.to_bytes()` with the peer out of band, get `peer` back ...
//! let init = InitAttr { access: QpAccess::REMOTE_WRITE | QpAccess::REMOTE_READ, ..InitAttr::default() };
//! qp.connect(&init, &peer)?; // sends from the PSN `me` advertised
//! # Ok(())
//! # }
//! ```
//!
//! # One PSN per QP
//!
//! The first packet sequence number a QP sends is chosen once, when it is built: at
//! random ([`random_psn`]), or fixed with [`QueuePairBuilder::psn`] (tests, tools that
//! must match a peer's expectations). [`QueuePair::local_info`] advertises it, and
//! [`QueuePair::connect`], [`QueuePair::ready_ud`] and the endpoint
//! [`Handshake`](crate::Handshake) send from it, so the PSN a peer was told and the one
//! this side sends cannot differ. Only the hand-driven transitions take it as an argument
//! ([`RtsAttr::sq_psn`]: pass [`QueuePair::psn`]).
//!
//! ```no_run
//! # fn main() -> rdma_verbs::Result<()> {
//! # use rdma_verbs::{CompletionQueue, Context, ProtectionDomain, QpType, QueuePair};
//! # let ctx = Context::open_first()?;
//! # let pd = ProtectionDomain::new(&ctx)?;
//! # let cq = CompletionQueue::new(&ctx, 256)?;
//! let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).psn(0x1234).build()?;
//! assert_eq!(qp.local_info(1)?.psn, 0x1234);
//! # Ok(())
//! # }
//! ```

use std::ffi::c_int;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use crate::ah::{AhAttr, Remote};
use crate::context::Context;
use crate::conv;
use crate::cq::{CompletionQueue, CqInner};
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::{destroy_shared, Owned};
use crate::pd::ProtectionDomain;
use crate::port::{c_enum, Gid, Mtu};
use crate::srq::{SharedReceiveQueue, SrqInner};

/// Work requests per queue when the builder is not told otherwise.
pub const DEFAULT_MAX_WR: u32 = 128;

/// The Q_Key [`InitAttr::default`] gives UD QPs. Its top bit is clear: Q_Keys with the
/// top bit set are controlled keys that unprivileged senders cannot use.
pub const DEFAULT_QKEY: u32 = 0x1111_1111;

/// Largest packet sequence number: PSNs are 24 bits.
pub const MAX_PSN: u32 = 0xFF_FFFF;

/// A random 24-bit PSN: what a QP starts from unless [`QueuePairBuilder::psn`] fixes it.
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

/// Transport service type (`enum ibv_qp_type`). More types (raw packet, XRC) may come, so
/// matches need a wildcard arm.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected: acknowledged, in order; SEND, RDMA WRITE, RDMA READ, atomics.
    Rc,
    /// Unreliable connected: SEND and RDMA WRITE, no acknowledgements.
    Uc,
    /// Unreliable datagram: SENDs of up to one MTU to any UD QP, addressed per send.
    Ud,
}

impl QpType {
    /// The C value.
    pub fn to_ffi(self) -> ffi::ibv_qp_type {
        match self {
            QpType::Rc => ffi::ibv_qp_type::IBV_QPT_RC,
            QpType::Uc => ffi::ibv_qp_type::IBV_QPT_UC,
            QpType::Ud => ffi::ibv_qp_type::IBV_QPT_UD,
        }
    }

    /// From the C value; `None` for types this crate does not create.
    pub fn from_ffi(t: ffi::ibv_qp_type) -> Option<QpType> {
        match t {
            ffi::ibv_qp_type::IBV_QPT_RC => Some(QpType::Rc),
            ffi::ibv_qp_type::IBV_QPT_UC => Some(QpType::Uc),
            ffi::ibv_qp_type::IBV_QPT_UD => Some(QpType::Ud),
            _ => None,
        }
    }
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
        })
    }
}

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
    /// [`QueuePairBuilder::extended_send_ops`].
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
        // Bits this crate does not name are passed through.
        const _ = !0;
    }
}

impl SendOps {
    /// The operations that only reliable connected QPs can post.
    pub const RC_ONLY: SendOps =
        SendOps::RDMA_READ.union(SendOps::ATOMIC_CMP_AND_SWP).union(SendOps::ATOMIC_FETCH_AND_ADD);
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
    fn from_ffi(c: &ffi::ibv_qp_cap) -> QpCaps {
        QpCaps {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        }
    }
}

/// A queue pair. Verbs on it are thread-safe, so it is `Send + Sync`; it keeps its
/// protection domain, both completion queues and its SRQ alive, and is destroyed first.
pub struct QueuePair {
    pub(crate) inner: Arc<QpInner>,
}

pub(crate) struct QpInner {
    /// For a QP made through a CM id: detaches it from the id (under the CM lock) before
    /// `raw` destroys it, so that librdmacm never touches a destroyed QP.
    cm: Option<crate::cm::CmQpLink>,
    // The QP is destroyed before the parents below are released.
    pub(crate) raw: Owned<ffi::ibv_qp>,
    pub(crate) qp_ex: Option<NonNull<ffi::ibv_qp_ex>>,
    qp_type: QpType,
    pub(crate) caps: QpCaps,
    /// The send and receive depths asked for: the safe queues' default depths (a provider
    /// may grant more, which the CQ was not necessarily sized for).
    pub(crate) asked_depth: (u32, u32),
    pub(crate) send_ops: SendOps,
    /// The first PSN it sends: chosen once, at build.
    psn: u32,
    sq_sig_all: bool,
    max_qp_rd_atom: u8,
    max_qp_init_rd_atom: u8,
    pd: ProtectionDomain,
    /// The CM id a QP was made through, released only after the QP is destroyed.
    _cm_id: Option<Arc<dyn Send + Sync>>,
    // Held only to keep the parents alive.
    pub(crate) send_cq: Arc<CqInner>,
    pub(crate) recv_cq: Arc<CqInner>,
    srq: Option<Arc<SrqInner>>,
    /// Buffers of requests still posted when their queue was dropped: freed after the
    /// QP (the field above) is destroyed, when the device can no longer touch them.
    pub(crate) graveyard: Mutex<Vec<Box<dyn Send>>>,
    /// Set while a [`SendQueue`](crate::queue::SendQueue) owns the send side.
    pub(crate) send_claimed: AtomicBool,
    /// Set while a [`RecvQueue`](crate::queue::RecvQueue) owns the receive side.
    pub(crate) recv_claimed: AtomicBool,
}

// SAFETY: libibverbs verbs on a QP are thread-safe: providers lock the send queue and the
// receive queue separately, and modify/query/destroy go through the kernel, which
// serializes them. The pointers are owned by this struct and freed once.
unsafe impl Send for QpInner {}
// SAFETY: see Send; nothing here is mutated through a shared reference except by those
// thread-safe verbs.
unsafe impl Sync for QpInner {}

/// Sizes asked of a QP, before the device's limits are applied.
#[derive(Debug, Clone, Copy)]
struct CapRequest {
    qp_type: QpType,
    has_srq: bool,
    max_send_wr: u32,
    max_recv_wr: Option<u32>,
    max_send_sge: u32,
    max_recv_sge: Option<u32>,
    max_inline_data: u32,
    send_ops: Option<SendOps>,
}

impl CapRequest {
    /// Checks the sizes against the device and returns the C capabilities to ask for.
    fn check(&self, max_qp_wr: u32, max_sge: u32) -> Result<ffi::ibv_qp_cap> {
        const VERB: Verb = Verb::CreateQpEx;
        let bad = |what: String| Err(Error::invalid(VERB, what));
        if self.has_srq {
            if let Some(n) = self.max_recv_wr.filter(|&n| n > 0) {
                return bad(format!("max_recv_wr {n} with an SRQ: receives are posted to the SRQ, whose size counts"));
            }
            if let Some(n) = self.max_recv_sge.filter(|&n| n > 0) {
                return bad(format!("max_recv_sge {n} with an SRQ: the SRQ's max_sge counts"));
            }
        }
        let recv_wr = if self.has_srq { 0 } else { self.max_recv_wr.unwrap_or(DEFAULT_MAX_WR) };
        let recv_sge = if self.has_srq { 0 } else { self.max_recv_sge.unwrap_or(1) };
        for (name, value, limit, limit_name) in [
            ("max_send_wr", self.max_send_wr, max_qp_wr, "max_qp_wr"),
            ("max_recv_wr", recv_wr, max_qp_wr, "max_qp_wr"),
            ("max_send_sge", self.max_send_sge, max_sge, "max_sge"),
            ("max_recv_sge", recv_sge, max_sge, "max_sge"),
        ] {
            if value > limit {
                return bad(format!("{name} {value} exceeds the device's {limit_name} {limit}"));
            }
        }
        if let Some(ops) = self.send_ops {
            if ops.is_empty() {
                return bad("extended_send_ops with no operation: name at least one".into());
            }
            let forbidden = match self.qp_type {
                QpType::Rc => SendOps::empty(),
                QpType::Uc => SendOps::RC_ONLY,
                QpType::Ud => SendOps::RC_ONLY | SendOps::RDMA_WRITE | SendOps::RDMA_WRITE_WITH_IMM,
            };
            if ops.intersects(forbidden) {
                return bad(format!("{:?} cannot be posted on a {} QP", ops.intersection(forbidden), self.qp_type));
            }
        }
        Ok(ffi::ibv_qp_cap {
            max_send_wr: self.max_send_wr,
            max_recv_wr: recv_wr,
            max_send_sge: self.max_send_sge,
            max_recv_sge: recv_sge,
            max_inline_data: self.max_inline_data,
        })
    }
}

/// Builds a [`QueuePair`]: the PD, the type and the CQs are required, the sizes have
/// defaults ([`DEFAULT_MAX_WR`] work requests and 1 SGE per queue, no inline data).
#[must_use = "a builder does nothing until build() is called"]
pub struct QueuePairBuilder<'a> {
    pd: &'a ProtectionDomain,
    send_cq: &'a CompletionQueue,
    recv_cq: &'a CompletionQueue,
    srq: Option<&'a SharedReceiveQueue>,
    req: CapRequest,
    sq_sig_all: bool,
    psn: Option<u32>,
}

impl<'a> QueuePairBuilder<'a> {
    /// Most outstanding send work requests (default [`DEFAULT_MAX_WR`]).
    pub fn max_send_wr(mut self, n: u32) -> Self {
        self.req.max_send_wr = n;
        self
    }

    /// Most outstanding receive work requests (default [`DEFAULT_MAX_WR`]; an error
    /// together with an SRQ, whose size counts instead).
    pub fn max_recv_wr(mut self, n: u32) -> Self {
        self.req.max_recv_wr = Some(n);
        self
    }

    /// Most scatter/gather entries in one send work request (default 1).
    pub fn max_send_sge(mut self, n: u32) -> Self {
        self.req.max_send_sge = n;
        self
    }

    /// Most scatter/gather entries in one receive work request (default 1; an error
    /// together with an SRQ).
    pub fn max_recv_sge(mut self, n: u32) -> Self {
        self.req.max_recv_sge = Some(n);
        self
    }

    /// Largest payload to send inline (default 0). Providers may grant more, see
    /// [`QueuePair::caps`]; too much is refused by the provider with EINVAL.
    pub fn max_inline_data(mut self, n: u32) -> Self {
        self.req.max_inline_data = n;
        self
    }

    /// When true, every send work request completes with a work completion; when false
    /// (the default), only those posted with the signaled flag do.
    pub fn sq_sig_all(mut self, yes: bool) -> Self {
        self.sq_sig_all = yes;
        self
    }

    /// The first PSN the QP sends (24 bits; default [random](random_psn)). The QP keeps it:
    /// [`QueuePair::local_info`] advertises it and [`QueuePair::connect`] sends from it.
    /// Fix it for tests, or for a peer that expects a given PSN; a value wider than 24 bits
    /// is refused by [`build`](Self::build).
    pub fn psn(mut self, psn: u32) -> Self {
        self.psn = Some(psn);
        self
    }

    /// Takes receives from this shared receive queue instead of a receive queue of its own.
    pub fn srq(mut self, srq: &'a SharedReceiveQueue) -> Self {
        self.srq = Some(srq);
        self.req.has_srq = true;
        self
    }

    /// Creates the QP for the extended send API (`ibv_wr_start` ... `ibv_wr_complete`)
    /// with these operations (`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`). Classic `ibv_post_send`
    /// works on such a QP too; [`QueuePair::as_raw_ex`] is `Some` only for them.
    pub fn extended_send_ops(mut self, ops: SendOps) -> Self {
        self.req.send_ops = Some(ops);
        self
    }

    /// Checks the request against the device's limits, then creates the QP
    /// (`ibv_create_qp_ex`). The QP starts in [`QpState::Reset`].
    ///
    /// Refused with [`Error::InvalidArgument`] naming [`Verb::CreateQpEx`], before the
    /// QP is created: sizes beyond the device's limits, a PSN wider than 24 bits, and
    /// queues that do not fit in their CQs. `max_send_wr` and `max_recv_wr` (their sum
    /// when one CQ takes both) must fit in the CQ's entries besides those the safe queues
    /// already claimed on it reserved ([`CompletionQueue::builder`] says why), so the
    /// defaults (128 + 128) need a CQ of 256 entries.
    #[doc(alias = "ibv_create_qp_ex")]
    #[doc(alias = "ibv_create_qp")]
    pub fn build(self) -> Result<QueuePair> {
        const VERB: Verb = Verb::CreateQpEx;
        let ctx = self.pd.context().clone();
        self.build_with(VERB, |attr| {
            // SAFETY: the context, PD, CQs and SRQ in `attr` are live (borrowed by the
            // builder) and belong to one context; `attr` is valid for reading and writing.
            let raw = unsafe { ffi::ibv_create_qp_ex(ctx.as_raw(), attr) };
            Ok((conv::ptr(VERB, raw)?, None))
        })
    }

    /// Refuses a QP whose queues, at the depths asked, cannot fit in their CQs besides
    /// what the safe queues on those CQs reserved: the claim of such a queue
    /// ([`QueuePair::send_queue`], [`QueuePair::recv_queue`]) would be refused, and a QP
    /// driven another way could overrun the CQ.
    fn check_cq_room(&self, cap: &ffi::ibv_qp_cap) -> Result<()> {
        const VERB: Verb = Verb::CreateQpEx;
        let (send, recv) = (u64::from(cap.max_send_wr), u64::from(cap.max_recv_wr));
        let qp_type = self.req.qp_type;
        if self.send_cq.as_raw() == self.recv_cq.as_raw() {
            let what = format!("the {qp_type} QP's send and receive queues (max_send_wr {send} + max_recv_wr {recv})");
            let smaller = "build the QP with a smaller max_send_wr or max_recv_wr";
            return self.send_cq.inner.check_room(send + recv, VERB, &what, smaller);
        }
        let what = format!("the {qp_type} QP's send queue (max_send_wr {send})");
        self.send_cq.inner.check_room(send, VERB, &what, "build the QP with a smaller max_send_wr")?;
        let what = format!("the {qp_type} QP's receive queue (max_recv_wr {recv})");
        self.recv_cq.inner.check_room(recv, VERB, &what, "build the QP with a smaller max_recv_wr")
    }

    /// Checks the request as [`build`](Self::build) does, then creates the QP with
    /// `create`, which gets the filled-in attributes and returns the new QP (from then on
    /// owned by the result and destroyed with `ibv_destroy_qp`) and, for a QP made
    /// through a CM id, the link that takes it off the id first.
    pub(crate) fn build_with(
        self,
        verb: Verb,
        create: impl FnOnce(&mut ffi::ibv_qp_init_attr_ex) -> Result<(NonNull<ffi::ibv_qp>, Option<crate::cm::CmQpLink>)>,
    ) -> Result<QueuePair> {
        const VERB: Verb = Verb::CreateQpEx;
        let ctx = self.pd.context();
        let same = |other: &Context, what: &str| {
            if other.as_raw() == ctx.as_raw() {
                Ok(())
            } else {
                Err(Error::invalid(
                    VERB,
                    format!(
                        "the {what} belongs to {}, the PD to {}: one QP cannot span contexts",
                        other.name(),
                        ctx.name()
                    ),
                ))
            }
        };
        same(self.send_cq.context(), "send CQ")?;
        same(self.recv_cq.context(), "receive CQ")?;
        if let Some(srq) = self.srq {
            same(srq.pd().context(), "SRQ")?;
        }
        let psn = match self.psn {
            Some(psn) if psn > MAX_PSN => {
                return Err(Error::invalid(
                    VERB,
                    format!("psn {psn:#x} does not fit in 24 bits (at most {MAX_PSN:#x})"),
                ));
            }
            Some(psn) => psn,
            None => random_psn(),
        };
        let dev = ctx.query_device()?;
        let cap = self.req.check(dev.max_qp_wr, dev.max_sge)?;
        self.check_cq_room(&cap)?;

        let mut comp_mask = ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0;
        let send_ops = self.req.send_ops.unwrap_or_default();
        if self.req.send_ops.is_some() {
            comp_mask |= ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0;
        }
        let mut attr = ffi::ibv_qp_init_attr_ex {
            send_cq: self.send_cq.as_raw(),
            recv_cq: self.recv_cq.as_raw(),
            srq: self.srq.map_or(std::ptr::null_mut(), |s| s.as_raw()),
            cap,
            qp_type: self.req.qp_type.to_ffi(),
            sq_sig_all: c_int::from(self.sq_sig_all),
            comp_mask,
            pd: self.pd.as_raw(),
            send_ops_flags: send_ops.bits(),
            ..Default::default()
        };
        let (raw, cm) = create(&mut attr).map_err(|e| match e.errno() {
            Some(libc::EINVAL) => e.with_hint(format!(
                "the provider refused a {} QP with {:?}: most often max_inline_data is above what it supports",
                self.req.qp_type,
                QpCaps::from_ffi(&cap)
            )),
            Some(libc::EOPNOTSUPP | libc::ENOSYS) if self.req.send_ops.is_some() => e.with_hint(format!(
                "the provider has no extended send API for {:?} on {} QPs",
                send_ops, self.req.qp_type
            )),
            _ => e,
        })?;
        // SAFETY: a new QP that only this Owned destroys (after `cm` detached it).
        let raw = unsafe { Owned::new(raw.as_ptr(), verb)? };
        let qp_ex = if self.req.send_ops.is_some() {
            // SAFETY: the QP was created through the provider's create_qp_ex with send ops,
            // so it is a verbs_qp and the conversion reads a valid field.
            NonNull::new(unsafe { ffi::ibv_qp_to_qp_ex(raw.as_ptr()) })
        } else {
            None
        };
        if self.req.send_ops.is_some() && qp_ex.is_none() {
            // Detach from the CM id before `raw` destroys the QP.
            drop(cm);
            return Err(Error::verb(Verb::QpToQpEx, libc::EOPNOTSUPP)
                .with_hint("the provider created the QP without the extended send API"));
        }
        let rd_atom = |v: u32| u8::try_from(v).unwrap_or(u8::MAX);
        let cm_id = cm.as_ref().map(crate::cm::CmQpLink::id);
        Ok(QueuePair {
            inner: Arc::new(QpInner {
                cm,
                raw,
                qp_ex,
                qp_type: self.req.qp_type,
                // The provider wrote back what it granted.
                caps: QpCaps::from_ffi(&attr.cap),
                asked_depth: (cap.max_send_wr, cap.max_recv_wr),
                send_ops,
                psn,
                sq_sig_all: self.sq_sig_all,
                max_qp_rd_atom: rd_atom(dev.max_qp_rd_atom),
                max_qp_init_rd_atom: rd_atom(dev.max_qp_init_rd_atom),
                pd: self.pd.clone(),
                _cm_id: cm_id,
                send_cq: Arc::clone(&self.send_cq.inner),
                recv_cq: Arc::clone(&self.recv_cq.inner),
                srq: self.srq.map(|s| Arc::clone(&s.inner)),
                graveyard: Mutex::new(Vec::new()),
                send_claimed: AtomicBool::new(false),
                recv_claimed: AtomicBool::new(false),
            }),
        })
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// RTR -> RTS attributes. UC and UD QPs use only `sq_psn`: give it [`QueuePair::psn`], the
/// PSN [`QueuePair::local_info`] advertised.
///
/// The defaults cannot hang a sender forever: `timeout` 14 (4.096 us * 2^14, about 67 ms
/// per try), `retry_cnt` 7, `rnr_retry` 6. An `rnr_retry` of 7 means "retry forever while
/// the receiver has no receive posted", which turns a peer's bug into a silent hang; it is
/// allowed but never the default. `max_rd_atomic` 16 is clamped to the device's
/// `max_qp_init_rd_atom`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsAttr {
    /// The first PSN this QP sends (24 bits): the peer's `rq_psn`, so [`QueuePair::psn`]
    /// (what [`QueuePair::local_info`] told the peer). Default 0.
    pub sq_psn: u32,
    /// Local ACK timeout code (RC; 0..=31; 0 waits forever).
    pub timeout: u8,
    /// Retries after a timeout before the send fails (RC; 0..=7).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK (RC; 0..=7, 7 = forever).
    pub rnr_retry: u8,
    /// RDMA READs and atomics this QP may have outstanding (RC; clamped to the device's
    /// `max_qp_init_rd_atom`).
    pub max_rd_atomic: u8,
}

impl Default for RtsAttr {
    fn default() -> Self {
        RtsAttr { sq_psn: 0, timeout: 14, retry_cnt: 7, rnr_retry: 6, max_rd_atomic: 16 }
    }
}

/// What a peer needs to connect to a QP: exchange it out of band (TCP, a file, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

impl RemoteQpInfo {
    /// Size of [`to_bytes`](Self::to_bytes).
    pub const WIRE_LEN: usize = 26;

    /// Big-endian wire form: qpn (4), psn (4), lid (2), gid (16).
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[0..4].copy_from_slice(&self.qpn.to_be_bytes());
        b[4..8].copy_from_slice(&self.psn.to_be_bytes());
        b[8..10].copy_from_slice(&self.lid.to_be_bytes());
        b[10..26].copy_from_slice(&self.gid.0);
        b
    }

    /// From the wire form of [`to_bytes`](Self::to_bytes), checked as the endpoint format
    /// checks its fields (it comes from a peer): a 24-bit QP number that is not a
    /// management QP, a 24-bit PSN, and a unicast LID or a GID to reach the peer by.
    pub fn from_bytes(b: &[u8; Self::WIRE_LEN]) -> std::result::Result<RemoteQpInfo, crate::WireError> {
        use crate::endpoint::{check_address, MAX_QPN};
        use crate::WireError;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[10..26]);
        let info = RemoteQpInfo {
            qpn: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            psn: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            lid: u16::from_be_bytes([b[8], b[9]]),
            gid: Gid(gid),
        };
        if info.qpn > MAX_QPN {
            return Err(WireError::QpnTooLarge(info.qpn));
        }
        if info.qpn <= 1 {
            return Err(WireError::ReservedQpn(info.qpn));
        }
        if info.psn > MAX_PSN {
            return Err(WireError::PsnTooLarge(info.psn));
        }
        check_address(info.lid, info.gid)?;
        Ok(info)
    }
}

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
            .field("rq_psn", &self.rq_psn)
            .field("sq_psn", &self.sq_psn)
            .field("dest_qp_num", &self.dest_qp_num)
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

type Mask = ffi::ibv_qp_attr_mask;

/// The attributes each transition requires, per transport (IB spec, `ibv_modify_qp(3)`).
fn required_mask(qp_type: QpType, to: QpState) -> Mask {
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
fn mask_names(mask: Mask) -> String {
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
fn allowed_from(to: QpState) -> Option<&'static [QpState]> {
    match to {
        QpState::Init => Some(&[QpState::Reset, QpState::Init]),
        QpState::Rtr => Some(&[QpState::Init]),
        QpState::Rts => Some(&[QpState::Rtr]),
        _ => None,
    }
}

/// Refuses an illegal transition before C, naming the current and the requested state.
fn check_transition(qpn: u32, qp_type: QpType, from: QpState, to: QpState) -> Result<()> {
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
fn fits(value: u32, max: u32, what: &str) -> Result<()> {
    if value > max {
        return Err(Error::invalid(Verb::ModifyQp, format!("{what} {value:#x} is above its maximum {max:#x}")));
    }
    Ok(())
}

impl QueuePair {
    /// Starts building a QP of `qp_type` in `pd`, completing sends on `send_cq` and
    /// receives on `recv_cq` (which may be the same CQ).
    pub fn builder<'a>(
        pd: &'a ProtectionDomain,
        qp_type: QpType,
        send_cq: &'a CompletionQueue,
        recv_cq: &'a CompletionQueue,
    ) -> QueuePairBuilder<'a> {
        QueuePairBuilder {
            pd,
            send_cq,
            recv_cq,
            srq: None,
            req: CapRequest {
                qp_type,
                has_srq: false,
                max_send_wr: DEFAULT_MAX_WR,
                max_recv_wr: None,
                max_send_sge: 1,
                max_recv_sge: None,
                max_inline_data: 0,
                send_ops: None,
            },
            sq_sig_all: false,
            psn: None,
        }
    }

    /// The QP number the peer addresses.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: the QP is live; qp_num is set at creation and never changes.
        unsafe { (*self.as_raw()).qp_num }
    }

    /// The first PSN this QP sends, chosen once when it was built (at random, unless
    /// [`QueuePairBuilder::psn`] fixed it). [`local_info`](Self::local_info) advertises it;
    /// [`connect`](Self::connect), [`ready_ud`](Self::ready_ud) and the endpoint
    /// [`Handshake`](crate::Handshake) send from it. A QP [reset](Self::reset) and connected
    /// again starts from it again; build a new QP for a fresh one. A QP made through a CM id
    /// does not use it: rdma_cm picks and exchanges that QP's PSN itself.
    pub fn psn(&self) -> u32 {
        self.inner.psn
    }

    /// The transport type.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    /// The queue sizes the provider granted (at least those asked for).
    pub fn caps(&self) -> QpCaps {
        self.inner.caps
    }

    /// The extended send operations it was created with (empty for a classic QP).
    pub fn send_ops(&self) -> SendOps {
        self.inner.send_ops
    }

    /// True when every send completes with a work completion.
    pub fn sq_sig_all(&self) -> bool {
        self.inner.sq_sig_all
    }

    /// True when receives come from a shared receive queue (post them there, not here).
    pub fn has_srq(&self) -> bool {
        self.inner.srq.is_some()
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    /// The device context.
    pub fn context(&self) -> &Context {
        self.inner.pd.context()
    }

    /// The raw pointer (for `ibv_post_send`, `ibv_post_recv`), valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_qp {
        self.inner.raw.as_ptr()
    }

    /// The extended QP (for `ibv_wr_*`), when it was built with
    /// [`extended_send_ops`](QueuePairBuilder::extended_send_ops); valid while `self` lives.
    pub fn as_raw_ex(&self) -> Option<*mut ffi::ibv_qp_ex> {
        self.inner.qp_ex.map(NonNull::as_ptr)
    }

    /// The current state (`ibv_query_qp` with `IBV_QP_STATE`).
    #[doc(alias = "ibv_query_qp")]
    pub fn state(&self) -> Result<QpState> {
        self.query_mask(ffi::ibv_qp_attr_mask::IBV_QP_STATE).map(|a| QpState::from_raw(a.qp_state.0))
    }

    /// The QP's attributes (`ibv_query_qp`).
    #[doc(alias = "ibv_query_qp")]
    pub fn query(&self) -> Result<QpAttrs> {
        use ffi::ibv_qp_attr_mask as M;
        let mask = M::IBV_QP_STATE
            | M::IBV_QP_PKEY_INDEX
            | M::IBV_QP_PORT
            | M::IBV_QP_QKEY
            | M::IBV_QP_ACCESS_FLAGS
            | M::IBV_QP_AV
            | M::IBV_QP_PATH_MTU
            | M::IBV_QP_TIMEOUT
            | M::IBV_QP_RETRY_CNT
            | M::IBV_QP_RNR_RETRY
            | M::IBV_QP_RQ_PSN
            | M::IBV_QP_SQ_PSN
            | M::IBV_QP_MAX_QP_RD_ATOMIC
            | M::IBV_QP_MAX_DEST_RD_ATOMIC
            | M::IBV_QP_MIN_RNR_TIMER
            | M::IBV_QP_DEST_QPN
            | M::IBV_QP_CAP;
        let a = self.query_mask(mask)?;
        Ok(QpAttrs {
            state: QpState::from_raw(a.qp_state.0),
            path_mtu: Mtu::from_raw(a.path_mtu.0),
            qkey: a.qkey,
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qp_num,
            access: QpAccess::from_bits_retain(a.qp_access_flags),
            cap: QpCaps::from_ffi(&a.cap),
            path: AhAttr::from_ffi(&a.ah_attr),
            pkey_index: a.pkey_index,
            port: a.port_num,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            sq_draining: a.sq_draining != 0,
            raw: a,
        })
    }

    fn query_mask(&self, mask: Mask) -> Result<ffi::ibv_qp_attr> {
        let mut attr = ffi::ibv_qp_attr::default();
        let mut init = ffi::ibv_qp_init_attr::default();
        // SAFETY: the QP is live; both out-structs are valid for writing.
        let rc = unsafe { ffi::ibv_query_qp(self.as_raw(), &mut attr, mask.0 as c_int, &mut init) };
        conv::rc(Verb::QueryQp, rc)?;
        Ok(attr)
    }

    /// The current state, checked as a valid start of a transition to `to`.
    fn begin(&self, to: QpState) -> Result<QpState> {
        let from = self.state()?;
        check_transition(self.qp_num(), self.qp_type(), from, to)?;
        Ok(from)
    }

    /// `ibv_modify_qp` to `to`; EINVAL gets a hint naming the transition and the mask.
    fn modify(&self, from: QpState, to: QpState, mut attr: ffi::ibv_qp_attr, mask: Mask) -> Result<()> {
        attr.qp_state = ffi::ibv_qp_state(to.to_raw());
        // SAFETY: the QP is live and `attr` is valid for the call.
        let rc = unsafe { ffi::ibv_modify_qp(self.as_raw(), &mut attr, mask.0 as c_int) };
        conv::rc(Verb::ModifyQp, rc).map_err(|e| match e.errno() {
            Some(libc::EINVAL) => e.with_hint(format!(
                "{from}->{to} of {} QP {:#x} with attribute mask {}: the kernel refused an attribute \
                 value or the mask for this transition",
                self.qp_type(),
                self.qp_num(),
                mask_names(mask)
            )),
            _ => e,
        })
    }

    /// RESET (or INIT) -> INIT: binds the QP to a port (`ibv_modify_qp`). RC and UC QPs get
    /// `attr.access`, UD QPs `attr.qkey`. Receives may be posted from INIT on.
    pub fn to_init(&self, attr: &InitAttr) -> Result<()> {
        let from = self.begin(QpState::Init)?;
        if self.qp_type() == QpType::Ud && !attr.access.is_empty() {
            return Err(Error::invalid(
                Verb::ModifyQp,
                format!("UD QPs take no remote access ({:?}): RDMA READ, WRITE and atomics need RC", attr.access),
            ));
        }
        let port = self.context().query_port(attr.port)?;
        let pkeys = u32::from(port.raw.pkey_tbl_len);
        if u32::from(attr.pkey_index) >= pkeys {
            return Err(Error::invalid(
                Verb::ModifyQp,
                format!(
                    "pkey_index {} is past the P_Key table of port {} ({pkeys} entries)",
                    attr.pkey_index, attr.port
                ),
            ));
        }
        let raw = ffi::ibv_qp_attr {
            pkey_index: attr.pkey_index,
            port_num: attr.port,
            qp_access_flags: attr.access.bits(),
            qkey: attr.qkey,
            ..Default::default()
        };
        self.modify(from, QpState::Init, raw, required_mask(self.qp_type(), QpState::Init))
    }

    /// INIT -> RTR of a connected (RC, UC) QP: names the remote QP and the path to it
    /// (`ibv_modify_qp`). The path MTU is clamped to the port's active MTU and
    /// `max_dest_rd_atomic` to the device's limit; the address is checked against the port.
    pub fn to_rtr(&self, attr: &RtrAttr) -> Result<()> {
        if self.qp_type() == QpType::Ud {
            return Err(Error::invalid(
                Verb::ModifyQp,
                "a UD QP has no remote at RTR (each send names its address handle): call to_rtr_ud()",
            ));
        }
        let from = self.begin(QpState::Rtr)?;
        if attr.dest_qpn <= 1 {
            return Err(Error::invalid(
                Verb::ModifyQp,
                format!("dest_qpn {} is a management QP: set the remote QP's number", attr.dest_qpn),
            ));
        }
        fits(attr.dest_qpn, 0xFF_FFFF, "dest_qpn")?;
        fits(attr.rq_psn, MAX_PSN, "rq_psn")?;
        fits(attr.min_rnr_timer.into(), 31, "min_rnr_timer")?;
        let path = AhAttr { port: attr.port, remote: attr.remote, sl: attr.sl, static_rate: 0 };
        let port = path.check(self.context(), Verb::ModifyQp)?;
        let mtu = match (attr.path_mtu, port.active_mtu) {
            (Mtu::Unknown(v), _) => {
                return Err(Error::invalid(Verb::ModifyQp, format!("path MTU code {v} is not an IB MTU")));
            }
            (want, Mtu::Unknown(_)) => want,
            (want, active) => {
                if want.to_raw() <= active.to_raw() {
                    want
                } else {
                    active
                }
            }
        };
        let raw = ffi::ibv_qp_attr {
            path_mtu: mtu.to_ffi(),
            dest_qp_num: attr.dest_qpn,
            rq_psn: attr.rq_psn,
            ah_attr: path.raw(Verb::ModifyQp)?,
            max_dest_rd_atomic: attr.max_dest_rd_atomic.min(self.inner.max_qp_rd_atom),
            min_rnr_timer: attr.min_rnr_timer,
            ..Default::default()
        };
        self.modify(from, QpState::Rtr, raw, required_mask(self.qp_type(), QpState::Rtr))
    }

    /// INIT -> RTR of a UD QP (`ibv_modify_qp` with the state alone).
    pub fn to_rtr_ud(&self) -> Result<()> {
        if self.qp_type() != QpType::Ud {
            return Err(Error::invalid(
                Verb::ModifyQp,
                format!("to_rtr_ud() is for UD QPs; a {} QP needs to_rtr() with its remote", self.qp_type()),
            ));
        }
        let from = self.begin(QpState::Rtr)?;
        self.modify(from, QpState::Rtr, ffi::ibv_qp_attr::default(), required_mask(QpType::Ud, QpState::Rtr))
    }

    /// RTR -> RTS: the QP may send (`ibv_modify_qp`). RC QPs take the timeouts and retry
    /// counts (see [`RtsAttr`]); UC and UD QPs only `sq_psn`.
    pub fn to_rts(&self, attr: &RtsAttr) -> Result<()> {
        let from = self.begin(QpState::Rts)?;
        fits(attr.sq_psn, MAX_PSN, "sq_psn")?;
        fits(attr.timeout.into(), 31, "timeout")?;
        fits(attr.retry_cnt.into(), 7, "retry_cnt")?;
        fits(attr.rnr_retry.into(), 7, "rnr_retry")?;
        let raw = ffi::ibv_qp_attr {
            sq_psn: attr.sq_psn,
            timeout: attr.timeout,
            retry_cnt: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
            max_rd_atomic: attr.max_rd_atomic.min(self.inner.max_qp_init_rd_atom),
            ..Default::default()
        };
        self.modify(from, QpState::Rts, raw, required_mask(self.qp_type(), QpState::Rts))
    }

    /// Any state -> RESET: forgets the connection and drops every outstanding work
    /// request without a completion. From RESET the QP can be brought up again.
    pub fn reset(&self) -> Result<()> {
        let from = self.state()?;
        self.modify(from, QpState::Reset, ffi::ibv_qp_attr::default(), ffi::ibv_qp_attr_mask::IBV_QP_STATE)
    }

    /// Any state -> ERR: outstanding work requests complete with a flush error. Then
    /// [`reset`](Self::reset) to reuse the QP.
    pub fn to_error(&self) -> Result<()> {
        let from = self.state()?;
        self.modify(from, QpState::Err, ffi::ibv_qp_attr::default(), ffi::ibv_qp_attr_mask::IBV_QP_STATE)
    }

    /// What a peer needs to connect to this QP on `port`: its number, the PSN it will send
    /// from ([`psn`](Self::psn), the one [`connect`](Self::connect) uses), the port's LID and
    /// the GID `connect` sends from ([`Context::default_gid`] on RoCE, index 0 on InfiniBand).
    pub fn local_info(&self, port: u8) -> Result<RemoteQpInfo> {
        let ctx = self.context();
        let attr = ctx.query_port(port)?;
        let gid = if attr.is_ethernet() { ctx.default_gid(port)?.gid } else { ctx.query_gid(port, 0)?.gid };
        Ok(RemoteQpInfo { qpn: self.qp_num(), psn: self.psn(), lid: attr.lid, gid })
    }

    /// Connects an RC or UC QP in RESET to `remote`: INIT with `init`, RTR towards the
    /// remote QP (by GID from [`Context::default_gid`] on RoCE, by LID on InfiniBand) with
    /// the [`RtrAttr`] defaults, RTS sending from [`psn`](Self::psn), the PSN
    /// [`local_info`](Self::local_info) advertised, with the [`RtsAttr`] defaults.
    /// For other paths or timeouts, call the three transitions yourself.
    pub fn connect(&self, init: &InitAttr, remote: &RemoteQpInfo) -> Result<()> {
        if self.qp_type() == QpType::Ud {
            return Err(Error::invalid(Verb::ModifyQp, "UD QPs are not connected: call ready_ud()"));
        }
        let ctx = self.context();
        let port = ctx.query_port(init.port)?;
        let path = if port.is_ethernet() {
            Remote::gid(remote.gid, ctx.default_gid(init.port)?.index)
        } else {
            Remote::lid(remote.lid)
        };
        self.to_init(init)?;
        self.to_rtr(&RtrAttr { port: init.port, ..RtrAttr::new(path, remote.qpn, remote.psn) })?;
        self.to_rts(&RtsAttr { sq_psn: self.psn(), ..RtsAttr::default() })
    }

    /// Brings a UD QP in RESET up to RTS: INIT with `init` (port, P_Key index, Q_Key),
    /// RTR, RTS sending from [`psn`](Self::psn).
    pub fn ready_ud(&self, init: &InitAttr) -> Result<()> {
        self.to_init(init)?;
        self.to_rtr_ud()?;
        self.to_rts(&RtsAttr { sq_psn: self.psn(), ..RtsAttr::default() })
    }

    /// Destroys the QP now and reports the result (`ibv_destroy_qp`). Fails with EBUSY,
    /// destroying nothing yet, while another handle of this crate still holds it.
    pub fn destroy(self) -> Result<()> {
        destroy_shared(self.inner, Verb::DestroyQp, |mut inner| {
            // A QP made through a CM id leaves it first.
            drop(inner.cm.take());
            inner.raw.destroy()
        })
    }
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &format_args!("{:#x}", self.qp_num()))
            .field("qp_type", &self.inner.qp_type)
            .field("caps", &self.inner.caps)
            .field("srq", &self.has_srq())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(qp_type: QpType) -> CapRequest {
        CapRequest {
            qp_type,
            has_srq: false,
            max_send_wr: DEFAULT_MAX_WR,
            max_recv_wr: None,
            max_send_sge: 1,
            max_recv_sge: None,
            max_inline_data: 0,
            send_ops: None,
        }
    }

    fn what(e: Error) -> String {
        match e {
            Error::InvalidArgument { what, .. } => what.into_owned(),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn default_caps_are_128_wrs_and_one_sge_each_way() {
        let cap = req(QpType::Rc).check(16384, 32).unwrap();
        assert_eq!((cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge), (128, 128, 1, 1));
    }

    #[test]
    fn caps_above_the_device_limits_name_the_limit() {
        let r = CapRequest { max_send_wr: 20000, ..req(QpType::Rc) };
        assert_eq!(
            what(r.check(16384, 32).map(|_| ()).unwrap_err()),
            "max_send_wr 20000 exceeds the device's max_qp_wr 16384"
        );
        let r = CapRequest { max_recv_sge: Some(33), ..req(QpType::Ud) };
        assert_eq!(
            what(r.check(16384, 32).map(|_| ()).unwrap_err()),
            "max_recv_sge 33 exceeds the device's max_sge 32"
        );
    }

    #[test]
    fn an_srq_takes_no_receive_sizes() {
        let r = CapRequest { has_srq: true, max_recv_wr: Some(8), ..req(QpType::Rc) };
        assert!(what(r.check(16384, 32).map(|_| ()).unwrap_err()).contains("with an SRQ"));
        let cap = CapRequest { has_srq: true, ..req(QpType::Rc) }.check(16384, 32).unwrap();
        assert_eq!((cap.max_recv_wr, cap.max_recv_sge), (0, 0));
    }

    #[test]
    fn extended_send_ops_must_fit_the_transport() {
        let r = CapRequest { send_ops: Some(SendOps::SEND | SendOps::RDMA_WRITE), ..req(QpType::Ud) };
        assert!(what(r.check(16384, 32).map(|_| ()).unwrap_err()).contains("UD"));
        let r = CapRequest { send_ops: Some(SendOps::RDMA_READ), ..req(QpType::Uc) };
        assert!(what(r.check(16384, 32).map(|_| ()).unwrap_err()).contains("RDMA_READ"));
        let r = CapRequest { send_ops: Some(SendOps::all()), ..req(QpType::Rc) };
        r.check(16384, 32).unwrap();
        let r = CapRequest { send_ops: Some(SendOps::empty()), ..req(QpType::Rc) };
        r.check(16384, 32).map(|_| ()).unwrap_err();
    }

    #[test]
    fn each_transport_gets_the_masks_the_spec_requires() {
        assert_eq!(mask_names(required_mask(QpType::Rc, QpState::Init)), "STATE|ACCESS_FLAGS|PKEY_INDEX|PORT");
        assert_eq!(mask_names(required_mask(QpType::Uc, QpState::Init)), "STATE|ACCESS_FLAGS|PKEY_INDEX|PORT");
        assert_eq!(mask_names(required_mask(QpType::Ud, QpState::Init)), "STATE|PKEY_INDEX|PORT|QKEY");
        assert_eq!(
            mask_names(required_mask(QpType::Rc, QpState::Rtr)),
            "STATE|AV|PATH_MTU|RQ_PSN|MIN_RNR_TIMER|MAX_DEST_RD_ATOMIC|DEST_QPN"
        );
        assert_eq!(mask_names(required_mask(QpType::Uc, QpState::Rtr)), "STATE|AV|PATH_MTU|RQ_PSN|DEST_QPN");
        assert_eq!(mask_names(required_mask(QpType::Ud, QpState::Rtr)), "STATE");
        assert_eq!(
            mask_names(required_mask(QpType::Rc, QpState::Rts)),
            "STATE|TIMEOUT|RETRY_CNT|RNR_RETRY|MAX_QP_RD_ATOMIC|SQ_PSN"
        );
        assert_eq!(mask_names(required_mask(QpType::Uc, QpState::Rts)), "STATE|SQ_PSN");
        assert_eq!(mask_names(required_mask(QpType::Ud, QpState::Rts)), "STATE|SQ_PSN");
    }

    #[test]
    fn illegal_transitions_name_both_states_and_the_way() {
        let e = what(check_transition(0x11, QpType::Rc, QpState::Init, QpState::Rts).unwrap_err());
        assert!(e.contains("RC QP 0x11 is in INIT; RTS can be reached only from RTR"), "{e}");
        let e = what(check_transition(0x11, QpType::Ud, QpState::Rts, QpState::Init).unwrap_err());
        assert!(e.contains("INIT can be reached only from RESET or INIT"), "{e}");
        check_transition(1, QpType::Rc, QpState::Reset, QpState::Init).unwrap();
        check_transition(1, QpType::Rc, QpState::Init, QpState::Init).unwrap();
        check_transition(1, QpType::Rc, QpState::Init, QpState::Rtr).unwrap();
        check_transition(1, QpType::Rc, QpState::Rtr, QpState::Rts).unwrap();
        for from in [QpState::Rts, QpState::Err, QpState::Sqe, QpState::Unknown(9)] {
            check_transition(1, QpType::Rc, from, QpState::Reset).unwrap();
            check_transition(1, QpType::Rc, from, QpState::Err).unwrap();
        }
    }

    #[test]
    fn defaults_cannot_retry_forever() {
        let rts = RtsAttr::default();
        assert_eq!((rts.timeout, rts.retry_cnt, rts.rnr_retry), (14, 7, 6));
        assert_eq!(RtrAttr::default().min_rnr_timer, 12);
        assert_eq!(InitAttr::default().qkey & 0x8000_0000, 0, "the default Q_Key is not a controlled key");
    }

    #[test]
    fn remote_qp_info_round_trips_through_its_wire_form() {
        let info = RemoteQpInfo { qpn: 0x12_3456, psn: 0xab_cdef, lid: 0x2a, gid: Gid([7; 16]) };
        let bytes = info.to_bytes();
        assert_eq!(&bytes[..4], &[0, 0x12, 0x34, 0x56]);
        assert_eq!(RemoteQpInfo::from_bytes(&bytes), Ok(info));
    }

    #[test]
    fn remote_qp_info_from_a_peer_is_checked() {
        use crate::WireError;
        let good = RemoteQpInfo { qpn: 0x12_3456, psn: 0xab_cdef, lid: 0, gid: Gid([7; 16]) };
        let with = |f: fn(&mut RemoteQpInfo)| {
            let mut i = good;
            f(&mut i);
            RemoteQpInfo::from_bytes(&i.to_bytes())
        };
        assert_eq!(with(|i| i.qpn = 0x100_0000), Err(WireError::QpnTooLarge(0x100_0000)));
        assert_eq!(with(|i| i.qpn = 1), Err(WireError::ReservedQpn(1)));
        assert_eq!(with(|i| i.psn = 0x100_0000), Err(WireError::PsnTooLarge(0x100_0000)));
        assert_eq!(with(|i| i.gid = Gid([0; 16])), Err(WireError::NoAddress));
        assert_eq!(with(|i| (i.lid, i.gid) = (0xc000, Gid([0; 16]))), Err(WireError::MulticastLid(0xc000)));
        assert_eq!(with(|_| ()), Ok(good));
    }

    #[test]
    fn random_psns_fit_in_24_bits_and_vary() {
        let psns: Vec<u32> = (0..16).map(|_| random_psn()).collect();
        assert!(psns.iter().all(|&p| p <= MAX_PSN));
        assert!(psns.windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn qp_state_codes_match_the_c_enum() {
        assert_eq!(QpState::from_raw(ffi::ibv_qp_state::IBV_QPS_RTS.0), QpState::Rts);
        assert_eq!(QpState::from_raw(ffi::ibv_qp_state::IBV_QPS_ERR.0), QpState::Err);
        assert_eq!(QpState::from_raw(ffi::ibv_qp_state::IBV_QPS_UNKNOWN.0), QpState::Unknown(7));
        assert_eq!(QpType::from_ffi(QpType::Uc.to_ffi()), Some(QpType::Uc));
    }
}
