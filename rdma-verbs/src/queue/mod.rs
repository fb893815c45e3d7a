//! The safe data path: send and receive queues that own what they have posted.
//!
//! Why it is sound, and the walk from post to completion, are documented on
//! [`SendQueue`] (public, where a user reads them). Inside: `send` holds the one send
//! core, `request` what it posts ([`SendRequest`]), `prepared` the prepared requests,
//! `chain` prepared chains, `recv` the receive queues (one receive core, generic over
//! what it keeps: [`RecvRequest`]), `prepared_recv` prepared receives, `recv_chain` prepared receive chains, `ring` the
//! in-order ring with its one failure path, `tag` the `wr_id`s, `claim` one owner per
//! side and the graveyard; [`Chain`] here is the one chain builder.

use std::mem::MaybeUninit;

use crate::buf::MAX_SGE;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::wc::WorkCompletion;

mod awaited;
mod chain;
mod claim;
mod prepared;
mod prepared_recv;
mod recv;
mod recv_chain;
mod request;
mod ring;
mod send;
mod tag;

pub use awaited::{AsyncRecvQueue, AsyncSendQueue, Ticket, Tickets};
pub use chain::{PreparedSendChain, SendChainQueue};
pub use prepared::{PreparedSend, PreparedSendQueue};
pub use prepared_recv::{PreparedRecv, PreparedRecvQueue};
pub use recv::{RecvQueue, RecvRequest, SrqQueue};
pub use recv_chain::{PreparedRecvChain, RecvChainMember, RecvChainQueue};
pub use request::SendRequest;
pub(crate) use request::{sealed::Sealed as SendSealed, End, Ext, SendLimits, Token};
pub use send::SendQueue;
pub(crate) use tag::wr_id;

/// Most work requests one provider call posts in a batch.
pub const MAX_BATCH: usize = 64;

type Sges = [MaybeUninit<ffi::ibv_sge>; MAX_SGE];
const NO_SGES: Sges = [const { MaybeUninit::uninit() }; MAX_SGE];

/// A C work request with a `next` link and a `wr_id`.
trait Linked {
    fn next(&self) -> *mut Self;
    fn set_next(&mut self, next: *mut Self);
    /// Writes the `wr_id` of the request at `wr` through the pointer alone (no reference
    /// to it is made, so links into it stay valid).
    ///
    /// # Safety
    /// `wr` points at a live request.
    unsafe fn set_wr_id(wr: *mut Self, id: u64);
}

impl Linked for ffi::ibv_send_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
    #[inline(always)]
    unsafe fn set_wr_id(wr: *mut Self, id: u64) {
        // SAFETY: the caller's contract.
        unsafe { (*wr).wr_id = id };
    }
}

impl Linked for ffi::ibv_recv_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
    #[inline(always)]
    unsafe fn set_wr_id(wr: *mut Self, id: u64) {
        // SAFETY: the caller's contract.
        unsafe { (*wr).wr_id = id };
    }
}

/// Stamps the `n` C requests side by side from `first` with the `wr_id`s of sequence
/// numbers `seq..` of the queue whose tag bits are `tag`: the first's plus i, or each on
/// its own when the low bits wrap inside them (once in 2^40).
///
/// # Safety
/// `first` heads `n` live C requests side by side.
#[inline(always)]
unsafe fn stamp<W: Linked>(first: *mut W, n: usize, tag: u64, seq: u64) {
    if (seq & tag::LOW_MASK) + n as u64 <= tag::LOW_MASK {
        let id = tag::wr_id(tag, seq);
        for i in 0..n {
            // SAFETY: i < n: the caller's contract.
            unsafe { W::set_wr_id(first.add(i), id + i as u64) };
        }
    } else {
        for i in 0..n {
            // SAFETY: as above.
            unsafe { W::set_wr_id(first.add(i), tag::wr_id(tag, seq + i as u64)) };
        }
    }
}

/// The C requests of one post, linked as they are built: the one chain builder of the
/// send and receive queues.
struct Chain<W> {
    first: *mut W,
    prev: *mut W,
}

impl<W: Linked> Chain<W> {
    #[inline(always)]
    fn new() -> Self {
        Chain { first: std::ptr::null_mut(), prev: std::ptr::null_mut() }
    }

    /// Appends `cur`, whose `next` is NULL.
    #[inline(always)]
    fn link(&mut self, cur: *mut W) {
        self.link_span(cur, cur);
    }

    /// Appends the chain from `first` to `last` (linked, the last `next` NULL).
    #[inline(always)]
    fn link_span(&mut self, first: *mut W, last: *mut W) {
        if self.prev.is_null() {
            self.first = first;
        } else {
            // SAFETY: `prev` is the C request linked just before this one (in a queue's
            // scratch space or a prepared request's heap block), which nothing moved since.
            unsafe { (*self.prev).set_next(first) };
        }
        self.prev = last;
    }

    /// Hands the chain of `n` requests to `post` (one provider call, given the head and
    /// where to say which request it stopped at); returns how many went in, and the error.
    #[inline(always)]
    fn post(self, verb: Verb, n: usize, post: impl FnOnce(*mut W, &mut *mut W) -> i32) -> (usize, Option<Box<Error>>) {
        if n == 0 {
            return (0, None);
        }
        let mut bad = std::ptr::null_mut();
        match crate::conv::errno(verb, post(self.first, &mut bad)) {
            Ok(()) => (n, None),
            // SAFETY: `first` heads the chain built by `link`, whose last `next` is NULL.
            Err(e) => (unsafe { stopped_at(self.first, bad) }, Some(Box::new(e))),
        }
    }
}

/// Which request of the chain at `first` the provider stopped at (`bad`): everything
/// before it was posted, it and everything after it not.
///
/// # Safety
/// `first` heads a valid chain whose last `next` is NULL.
#[cold]
unsafe fn stopped_at<W: Linked>(first: *mut W, bad: *mut W) -> usize {
    let (mut at, mut wr) = (0, first);
    while !wr.is_null() && wr != bad {
        // SAFETY: the caller's contract: every link of the chain is a valid request.
        wr = unsafe { (*wr).next() };
        at += 1;
    }
    // A `bad` outside the chain (a provider that does not set it): nothing was posted.
    if wr.is_null() {
        0
    } else {
        at
    }
}

/// Checks a queue depth asked of a QP side that holds `max` work requests.
fn depth(verb: Verb, asked: u32, max: u32, what: &str) -> Result<u32> {
    if asked == 0 || asked > max {
        return Err(Error::invalid(verb, format!("depth {asked}: the QP's {what} allows 1 to {max}")));
    }
    Ok(asked)
}

#[cold]
#[inline(never)]
fn batch_too_long(verb: Verb) -> Error {
    Error::invalid(verb, format!("a batch holds at most {MAX_BATCH} work requests"))
}

#[cold]
#[inline(never)]
fn queue_full(verb: Verb, depth: u64) -> Error {
    Error::invalid(verb, format!("the queue is full ({depth} outstanding): poll completions first"))
}

/// A chain of `width` C requests posted on a queue only `depth` deep (it was prepared for
/// a deeper one): it would never fit, however many completions are taken.
#[cold]
#[inline(never)]
fn wider_than_queue(verb: Verb, width: usize, depth: u64) -> Error {
    Error::invalid(
        verb,
        format!("a chain of {width} requests never fits this queue, {depth} deep: split it, or claim a deeper queue"),
    )
}

#[cold]
#[inline(never)]
fn not_ours(verb: Verb, side: &str, wc: &WorkCompletion) -> Error {
    Error::invalid(
        verb,
        format!("completion wr_id {:#x} of QP {:#x} is not outstanding on this {side} queue", wc.wr_id(), wc.qp_num()),
    )
}
