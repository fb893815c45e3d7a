//! Prepared chains: [`PreparedSendChain`], posted whole through a [`SendChainQueue`] (documented
//! there).

use std::fmt;
use std::mem::MaybeUninit;

use super::prepared::PreparedSend;
use super::request::{End, SendLimits, SendRequest, Token, TOKEN};
use super::{stamp, SendQueue, Sges, MAX_BATCH};
use crate::buf::{PdId, SendBuf};
use crate::error::{Error, Refused, Result, Verb};
use crate::ffi;
use crate::wr::{Done, SendWr};

/// Prepared requests linked into one chain, posted whole with one provider call and
/// handed back whole, once, by the completion of its last request: built by
/// [`SendChainQueue::prepare_chain`](SendQueue::prepare_chain), posted through a
/// [`SendChainQueue`].
pub struct PreparedSendChain<T: SendBuf> {
    inner: Box<ChainInner<T>>,
}

struct ChainInner<T: SendBuf> {
    /// 1 up to MAX_BATCH requests, in posting order.
    parts: Vec<PreparedSend<T>>,
    /// Their C requests side by side, linked in order (the last `next` NULL), copied from
    /// the parts when the chain is built and again after a part was handed out. Each SGE
    /// pointer names its part's SGEs, in the part's own heap block, which does not move
    /// while the chain holds it. Reached only through `as_mut_ptr`, which materializes no
    /// reference to the elements, so the links stay valid from one post to the next.
    raws: Vec<ffi::ibv_send_wr>,
    /// The limits key and protection domain every part was checked against.
    key: u64,
    pd: PdId,
    /// A part was handed out by `get_mut` (and may have been changed or replaced): every
    /// part is checked again at the next post.
    changed: bool,
}

// SAFETY: it owns its parts, each Send (a prepared request); nothing is shared.
unsafe impl<T: SendBuf> Send for PreparedSendChain<T> {}

impl<T: SendBuf> PreparedSendChain<T> {
    /// How many requests it posts (at least 1).
    pub fn len(&self) -> usize {
        self.inner.parts.len()
    }

    /// Never: a chain holds at least one request.
    pub fn is_empty(&self) -> bool {
        self.inner.parts.is_empty()
    }

    /// Request `i`, in posting order.
    pub fn get(&self, i: usize) -> Option<&PreparedSend<T>> {
        self.inner.parts.get(i)
    }

    /// Request `i`, to change it between posts ([`PreparedSend`]'s setters, its bytes), or to
    /// put another prepared request in its place: every request is checked again at the
    /// next post.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut PreparedSend<T>> {
        self.inner.changed = true;
        self.inner.parts.get_mut(i)
    }

    /// The requests apart, in posting order.
    pub fn into_parts(self) -> Vec<PreparedSend<T>> {
        self.inner.parts
    }

    /// A chain of `parts` (1 up to MAX_BATCH), checked against `key` and `pd`.
    fn of(parts: Vec<PreparedSend<T>>) -> Self {
        let (key, pd, _) = parts[0].checked_for();
        let mut inner = ChainInner { parts, raws: Vec::new(), key, pd, changed: false };
        inner.relink();
        PreparedSendChain { inner: Box::new(inner) }
    }
}

impl<T: SendBuf> ChainInner<T> {
    /// Copies the parts' C requests side by side and links them in order.
    #[cold]
    fn relink(&mut self) {
        self.raws.clear();
        self.raws.extend(self.parts.iter_mut().map(PreparedSend::c_form));
        let (n, base) = (self.raws.len(), self.raws.as_mut_ptr());
        for i in 1..n {
            // SAFETY: i - 1 and i are below the length of `raws`, which does not grow
            // again before the next relink.
            unsafe { (*base.add(i - 1)).next = base.add(i) };
        }
        self.changed = false;
    }
}

impl<T: SendBuf> fmt::Debug for PreparedSendChain<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedSendChain").field("parts", &self.inner.parts).finish()
    }
}

/// The send side of a QP for [`PreparedSendChain`]s: one [`SendQueue`], posting chains.
///
/// A batch of fixed requests posted again and again (a bandwidth tool's window, a
/// collective's fixed transfers) costs least as one chain: its requests are checked and
/// built once ([`prepare_chain`](SendQueue::prepare_chain)), their C requests kept side
/// by side and linked once, and each post stamps their `wr_id`s and calls the provider
/// once; the chain takes one ring slot (its first request's; the queue counts its
/// members' completions), and comes back whole, once, with the completion of its last
/// request: the shape of a C program reposting a prebuilt list, with the checks and the
/// ownership kept. Its [`Done`] names its first request (id, operation) and carries the
/// first failure among its completions (a member the peer refused, not the flush after
/// it), else its last completion's status.
///
/// Soundness is the send queue's ([`SendQueue`]): the chain owns its requests, is posted
/// by value and stays in the ring until its last completion. A chain the provider stops
/// inside (it refuses a request after taking some) is split: the part it took stays with
/// the queue until its last completion, the rest comes back in the error, as a chain.
///
/// A single request posts as a chain of one; a [`PreparedSendQueue`](super::PreparedSendQueue)
/// posts single prepared requests more cheaply.
///
/// A chain of SENDs into prepared receives, posted again each round:
///
#[doc = concat!("```no_run\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/device/doc/prepared.rs")), "```")]
pub type SendChainQueue<T> = SendQueue<T, PreparedSendChain<T>>;

impl<T: SendBuf> SendQueue<T, PreparedSendChain<T>> {
    /// Checks and builds `wrs` (1 up to [`MAX_BATCH`], and no more than this queue's
    /// depth) as one chain. On refusal every work request comes back, in order.
    #[allow(clippy::result_large_err)] // the refused requests come back by value
    pub fn prepare_chain<I>(&self, wrs: I) -> Result<PreparedSendChain<T>, Refused<Vec<SendWr<T>>>>
    where
        I: IntoIterator<Item = SendWr<T>>,
    {
        let most = (self.depth() as usize).min(MAX_BATCH);
        let mut wrs = wrs.into_iter();
        let mut parts: Vec<PreparedSend<T>> = Vec::new();
        let back = |parts: Vec<PreparedSend<T>>, wr, rest| {
            parts.into_iter().map(PreparedSend::into_wr).chain([wr]).chain(rest).collect()
        };
        while let Some(wr) = wrs.next() {
            if parts.len() == most {
                let e = Error::invalid(
                    Verb::SendQueuePrepareChain,
                    format!("a chain holds at most {most} requests (MAX_BATCH, and this queue's depth)"),
                );
                return Err(Refused::new(e, back(parts, wr, wrs)));
            }
            match PreparedSend::build(Verb::SendQueuePrepareChain, wr, *self.limits()) {
                Ok(p) => parts.push(p),
                Err(r) => {
                    let (error, wr) = r.into_parts();
                    return Err(Refused::new(error, back(parts, wr, wrs)));
                }
            }
        }
        if parts.is_empty() {
            return Err(Refused::new(
                Error::invalid(Verb::SendQueuePrepareChain, "a chain needs at least one request"),
                Vec::new(),
            ));
        }
        Ok(PreparedSendChain::of(parts))
    }
}

impl<T: SendBuf> super::request::sealed::Sealed for PreparedSendChain<T> {}

impl<T: SendBuf> SendRequest for PreparedSendChain<T> {
    type Back = PreparedSendChain<T>;
    // Stamped in its slot: cheaper than before the move (scripts/instructions).
    const BUILD_IN_SLOT: bool = true;

    const CHAIN: bool = true;
    const EXTENDED: bool = false;

    #[inline(always)]
    fn width(&self) -> usize {
        self.inner.parts.len()
    }

    #[cold]
    fn split(&mut self, k: usize, _: Token) -> Self {
        let rest = PreparedSendChain::of(self.inner.parts.split_off(k));
        self.inner.relink();
        rest
    }

    /// Whether this QP takes every part: at once when they were checked against its
    /// limits and domain and none was handed out since, else part by part.
    #[inline(always)]
    fn check(&self, verb: Verb, limits: &SendLimits, key: u64, sges: &mut Sges, _: Token) -> Result<usize> {
        let inner = &*self.inner;
        if !inner.changed && inner.key == key && inner.pd == limits.pd {
            return Ok(0);
        }
        check_parts(verb, inner, limits, key, sges)
    }

    /// Stamps each part's `wr_id` in the side-by-side C requests (linked when the chain
    /// was built, or again here after a part was handed out); returns the first and the
    /// last.
    #[inline(always)]
    fn c_request(
        &mut self,
        tag: u64,
        seq: u64,
        _sges: &mut Sges,
        _n: usize,
        _out: &mut ffi::ibv_send_wr,
        _: Token,
    ) -> (*mut ffi::ibv_send_wr, *mut ffi::ibv_send_wr) {
        let inner = &mut *self.inner;
        if inner.changed {
            inner.relink();
        }
        let (n, base) = (inner.raws.len(), inner.raws.as_mut_ptr());
        // SAFETY: `raws` has n C requests from `base`.
        unsafe { stamp(base, n, tag, seq) };
        // SAFETY: a chain holds at least one request, so n - 1 is in bounds.
        (base, unsafe { base.add(n - 1) })
    }

    #[inline(always)]
    unsafe fn finish(slot: &mut MaybeUninit<Self>, end: End, _: Token) -> Done<PreparedSendChain<T>> {
        // SAFETY: the caller's contract: `slot` holds a chain, read out here once.
        let chain = unsafe { slot.assume_init_read() };
        let head = &chain.inner.parts[0];
        let (id, op) = (head.id(), head.checked_for().2);
        end.done(id, op, chain)
    }
}

/// Checks every part of a chain against a QP (the cold path: a part was handed out, or
/// the chain was built for another QP).
#[cold]
fn check_parts<T: SendBuf>(
    verb: Verb,
    inner: &ChainInner<T>,
    limits: &SendLimits,
    key: u64,
    sges: &mut Sges,
) -> Result<usize> {
    for p in &inner.parts {
        p.check(verb, limits, key, sges, TOKEN())?;
    }
    Ok(0)
}
