//! Building a QP: capabilities checked against the device and its CQs.

use super::*;
use crate::caps::{device_attr_ex, DEVICE_ATOMIC_WRITE, NO_ATOMICS, NO_ATOMIC_WRITE, NO_IMM};
use crate::context::Context;
use crate::conv;
use crate::cq::CompletionQueue;
use crate::device::AtomicCap;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::Owned;
use crate::pd::ProtectionDomain;
use crate::srq::SharedReceiveQueue;
use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// What a QP made through another object (an rdma_cm id) keeps of it: a guard dropped just
/// before the QP is destroyed (taking the QP off its creator), and the creator itself,
/// held until after. `qp` names no module above it; `cm` fills this in.
pub(crate) struct Creator {
    pub(crate) detach: Box<dyn Send + Sync>,
    pub(crate) keep: Arc<dyn Send + Sync>,
}

/// Sizes asked of a QP, before the device's limits are applied.
#[derive(Debug, Clone, Copy)]
pub(super) struct CapRequest {
    pub(super) qp_type: QpType,
    pub(super) has_srq: bool,
    pub(super) max_send_wr: u32,
    pub(super) max_recv_wr: Option<u32>,
    pub(super) max_send_sge: u32,
    pub(super) max_recv_sge: Option<u32>,
    pub(super) max_inline_data: u32,
    pub(super) send_ops: Option<SendOps>,
}

impl CapRequest {
    /// What a new builder asks for: the default depths, one SGE each way, no inline data.
    pub(super) fn defaults(qp_type: QpType) -> Self {
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

    /// Checks the sizes against the device and returns the C capabilities to ask for.
    /// A depth must fit `max_qp_wr` (the queue) and `max_cqe` (the CQ its completions go
    /// to): the device may allow queues deeper than any CQ it can make.
    pub(super) fn check(&self, max_qp_wr: u32, max_sge: u32, max_cqe: u32) -> Result<ffi::ibv_qp_cap> {
        let bad = |what: String| Err(Error::invalid(Verb::QueuePairBuilderBuild, what));
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
        for (name, value) in [("max_send_wr", self.max_send_wr), ("max_recv_wr", recv_wr)] {
            if value > max_cqe {
                return bad(format!(
                    "{name} {value} is within the device's max_qp_wr {max_qp_wr} but above its max_cqe \
                     {max_cqe}: no CQ of this device holds that many completions, so the deepest queue one CQ \
                     serves is {max_cqe}"
                ));
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
    pub(super) pd: &'a ProtectionDomain,
    pub(super) send_cq: &'a CompletionQueue,
    pub(super) recv_cq: &'a CompletionQueue,
    pub(super) srq: Option<&'a SharedReceiveQueue>,
    pub(super) req: CapRequest,
    pub(super) sq_sig_all: bool,
    pub(super) psn: Option<u32>,
}

impl<'a> QueuePairBuilder<'a> {
    /// Most outstanding send work requests (default [`DEFAULT_MAX_WR`]). At most the
    /// device's `max_qp_wr` and its `max_cqe`, since one CQ takes the completions
    /// ([`build`](Self::build) refuses more).
    pub fn max_send_wr(mut self, n: u32) -> Self {
        self.req.max_send_wr = n;
        self
    }

    /// Most outstanding receive work requests (default [`DEFAULT_MAX_WR`]; an error
    /// together with an SRQ, whose size counts instead). At most the device's
    /// `max_qp_wr` and its `max_cqe`, as for [`max_send_wr`](Self::max_send_wr).
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
    /// Refused with [`Error::InvalidArgument`] naming [`Verb::QueuePairBuilderBuild`],
    /// before the QP is created: sizes beyond the device's limits, a PSN wider than 24
    /// bits, and queues that do not fit in their CQs. A depth is bounded by the device's
    /// `max_qp_wr` and by its `max_cqe`, whichever is smaller: a device may allow queues
    /// deeper than any CQ it can make (rxe: `max_qp_wr` 1,048,576, `max_cqe` 32,767), and
    /// such a queue is refused, since no CQ could take its completions. `max_send_wr` and `max_recv_wr` (their sum
    /// when one CQ takes both) must fit in the CQ's entries besides those the safe queues
    /// already claimed on it reserved ([`CompletionQueue::builder`] says why), so the
    /// defaults (128 + 128) need a CQ of 256 entries.
    ///
    /// Refused with [`Error::NotSupported`] naming the same verb, before the QP is created:
    /// a UC or UD QP on an iWARP device (iWARP's QPs are RC only), atomics among the
    /// [`extended_send_ops`](Self::extended_send_ops) of a device whose `atomic_cap` is
    /// `ATOMIC_NONE`, and RDMA ATOMIC WRITE on a device without it. A provider without the
    /// extended send API (`EOPNOTSUPP` from `ibv_create_qp_ex` with send ops, as siw) is
    /// [`Error::NotSupported`] too, naming it.
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
        const VERB: Verb = Verb::QueuePairBuilderBuild;
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
        create: impl FnOnce(&mut ffi::ibv_qp_init_attr_ex) -> Result<(NonNull<ffi::ibv_qp>, Option<Creator>)>,
    ) -> Result<QueuePair> {
        let ctx = self.pd.context();
        let same = |other: &Context, what: &str| {
            if other.as_raw() == ctx.as_raw() {
                Ok(())
            } else {
                Err(Error::invalid(
                    Verb::QueuePairBuilderBuild,
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
                    Verb::QueuePairBuilderBuild,
                    format!("psn {psn:#x} does not fit in 24 bits (at most {MAX_PSN:#x})"),
                ));
            }
            Some(psn) => psn,
            None => random_psn(),
        };
        let dev = ctx.query_device()?;
        // iWARP (RFC 5040) is reliable and connected: its devices make RC QPs only.
        let iwarp = ctx.transport() == Transport::Iwarp;
        if iwarp && self.req.qp_type != QpType::Rc {
            return Err(Error::not_supported(
                Verb::QueuePairBuilderBuild,
                format!(
                    "{} QPs: {} is an iWARP device, whose QPs are RC only (transport iWARP)",
                    self.req.qp_type,
                    ctx.name()
                ),
            ));
        }
        let atomics = SendOps::ATOMIC_CMP_AND_SWP | SendOps::ATOMIC_FETCH_AND_ADD;
        if self.req.send_ops.is_some_and(|ops| ops.intersects(atomics)) && !dev.atomic_cap.supported() {
            return Err(Error::not_supported(
                Verb::QueuePairBuilderBuild,
                match dev.atomic_cap {
                    AtomicCap::Unknown(v) => format!("atomics (compare and swap, fetch and add): atomic_cap {v}"),
                    _ => NO_ATOMICS.into(),
                },
            ));
        }
        let imm = SendOps::RDMA_WRITE_WITH_IMM | SendOps::SEND_WITH_IMM;
        if iwarp && self.req.send_ops.is_some_and(|ops| ops.intersects(imm)) {
            return Err(Error::not_supported(Verb::QueuePairBuilderBuild, NO_IMM));
        }
        let cap = self.req.check(dev.max_qp_wr, dev.max_sge, dev.max_cqe)?;
        self.check_cq_room(&cap)?;
        // RDMA ATOMIC WRITE: the device says whether it has it (a provider without the
        // extended query reports no extended bits: absent).
        let atomic_write = device_attr_ex(ctx).map_or(0, |a| a.device_cap_flags_ex) & DEVICE_ATOMIC_WRITE != 0;
        if self.req.send_ops.is_some_and(|ops| ops.contains(SendOps::ATOMIC_WRITE)) && !atomic_write {
            return Err(Error::not_supported(Verb::QueuePairBuilderBuild, NO_ATOMIC_WRITE));
        }

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
        let (raw, creator) = create(&mut attr).map_err(|e| match e.errno() {
            Some(libc::EINVAL) => e.with_hint(format!(
                "the provider refused a {} QP with {:?}: most often max_inline_data is above what it supports",
                self.req.qp_type,
                QpCaps::from_ffi(&cap)
            )),
            Some(errno @ (libc::EOPNOTSUPP | libc::ENOSYS)) if self.req.send_ops.is_some() => Error::NotSupported {
                verb: e.verb_of().unwrap_or(verb),
                capability: format!(
                    "the extended send API (ibv_wr_*, send ops {:?}) on {} QPs: the provider has none",
                    send_ops, self.req.qp_type
                )
                .into(),
                errno: Some(errno),
            },
            _ => e,
        })?;
        let (detach, keep) = creator.map_or((None, None), |c| (Some(c.detach), Some(c.keep)));
        // SAFETY: a new QP that only this Owned destroys (after `detach` is dropped).
        let raw = unsafe { Owned::new(raw.as_ptr(), verb)? };
        let qp_ex = if self.req.send_ops.is_some() {
            // SAFETY: the QP was created through the provider's create_qp_ex with send ops,
            // so it is a verbs_qp and the conversion reads a valid field.
            NonNull::new(unsafe { ffi::ibv_qp_to_qp_ex(raw.as_ptr()) })
        } else {
            None
        };
        if self.req.send_ops.is_some() && qp_ex.is_none() {
            // Detach from the creator (a CM id) before `raw` destroys the QP.
            drop(detach);
            return Err(Error::verb(Verb::QpToQpEx, libc::EOPNOTSUPP)
                .with_hint("the provider created the QP without the extended send API"));
        }
        let rd_atom = |v: u32| u8::try_from(v).unwrap_or(u8::MAX);
        Ok(QueuePair {
            inner: Arc::new(QpInner {
                detach,
                raw,
                qp_ex,
                qp_type: self.req.qp_type,
                // The provider wrote back what it granted.
                caps: QpCaps::from_ffi(&attr.cap),
                asked_depth: (cap.max_send_wr, cap.max_recv_wr),
                send_ops,
                atomic_write,
                psn,
                sq_sig_all: self.sq_sig_all,
                max_qp_rd_atom: rd_atom(dev.max_qp_rd_atom),
                max_qp_init_rd_atom: rd_atom(dev.max_qp_init_rd_atom),
                lacks_imm: iwarp,
                // Only a device that says it has none: an atomic_cap we do not know goes to C.
                lacks_atomics: matches!(dev.atomic_cap, AtomicCap::None),
                max_sge_rd: match u32::try_from(dev.raw.max_sge_rd) {
                    Ok(0) | Err(_) => dev.max_sge,
                    Ok(n) => n,
                },
                pd: self.pd.clone(),
                _creator: keep,
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
