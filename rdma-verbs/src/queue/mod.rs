//! The safe data path: send and receive queues that own what they have posted.
//!
//! # Soundness
//!
//! The device reads and writes posted buffers behind the compiler's back. The safe API
//! makes sure no Rust reference can observe or disturb that, without a lock or an
//! allocation on the fast path:
//!
//! - A buffer is posted by value: a [`Chunk`](crate::Chunk) (exclusive) or an `Arc<Chunk>` (shared,
//!   read-only, for sources the device only reads). The queue keeps it in a slot until
//!   the work request completes, and hands it back with the completion
//!   ([`SendQueue::complete`], [`RecvQueue::complete`]). While it is posted, the program
//!   has no reference to an exclusive chunk, so it cannot read a receive or RDMA READ
//!   target, write a source, move it or free it; and a shared chunk cannot be written
//!   by anyone while any clone is out.
//! - Targets the device writes (receives, RDMA READ, atomics) take only exclusive
//!   chunks: the types refuse `Arc<Chunk>` there ([`ExclusiveBuf`](crate::ExclusiveBuf)).
//! - Each side of a QP has one owner: [`SendQueue`] and [`RecvQueue`] are claimed once
//!   per QP and post through `&mut self`. The two sides are separate queues in verbs
//!   (the provider locks them separately), so they may live on different threads.
//! - Completions are matched to slots by the `wr_id`, which this module chooses: the
//!   side, a tag unique in this process to the posting queue (kept reserved while any of
//!   its requests may still complete), and a sequence number or slot. A completion from
//!   another queue, another QP (even of another device with the same QP number), or a
//!   predecessor queue of the same QP is refused; a completion already taken is refused
//!   because `complete` marks it taken. Making a
//!   completion up is `unsafe` ([`WorkCompletion::from_raw`]). Send completions arrive in
//!   posting order, so a signaled completion also releases the unsignaled requests
//!   before it. A `WorkCompletion` is neither `Copy` nor `Clone`, and `complete` marks the
//!   one it takes, so no completion is ever presented twice.
//! - Dropping a queue that still has requests outstanding must not free their buffers
//!   while the device may use them: they move to the QP, which frees them right after
//!   `ibv_destroy_qp`, when the device can no longer touch them.
//!
//! - A CQ never overruns through these queues: each claims its depth (at most that many
//!   requests outstanding) and sets that many entries of its CQ aside; a claim that the CQ
//!   cannot hold besides the others' shares is refused, with the size the CQ needs. A
//!   dropped queue's share stays with its buried requests until they cannot complete.
//!   (An SRQ's receives complete on the CQs of whichever QPs take them: size those CQs
//!   for the SRQ's depth too.)
//!
//! - The buffer traits ([`SendBuf`](crate::SendBuf), [`ExclusiveBuf`](crate::ExclusiveBuf)) are sealed: a buffer's SGEs are
//!   trusted to name only bytes the buffer owns, so only this crate's chunk types (and
//!   arrays of them) are buffers.
//!
//! Polling is [`CompletionQueue::poll`](crate::CompletionQueue::poll) (`&mut self`: one
//! poller). Waiting through a completion channel is on the CQ as well.
//!
//! One [`SendQueue`] posts every kind of send request ([`SendRequest`]): [`SendWr`](crate::SendWr)s,
//! checked and built into their C form at each post, or [`Prepared`] requests, checked and
//! built once and posted again with only the `wr_id` stamped ([`PreparedQueue`] says how,
//! and why it is as sound). A post is a batch of one; a batch is one provider call.
//!
//! # The walk from post to completion
//!
//! 1. [`SendQueue::post_batch`] (or `post`, a batch of one) takes each request, checks it
//!    against the QP ([`SendRequest`]: SGE count, inline size, remote range, transport,
//!    protection domain), moves it into the next slot of the queue's ring, and builds or
//!    stamps its C request with a `wr_id` that names this queue and the slot.
//! 2. The C requests are linked into one chain and handed to the provider in one
//!    `ibv_post_send` (one doorbell). What the provider refuses is taken back out of the
//!    ring and handed back, in order, in a [`Refused`](crate::Refused).
//! 3. [`CompletionQueue::poll`](crate::CompletionQueue::poll) fills
//!    [`WorkCompletion`]s (`ibv_poll_cq`, nothing added).
//! 4. [`SendQueue::complete`] checks that the completion's `wr_id` is this queue's and
//!    outstanding, pops the request and the unsignaled ones before it, and hands each back
//!    as a [`Done`](crate::Done) (its buffer, your id, its operation, its status);
//!    [`Done::result`](crate::Done::result) turns a failure into an error naming all that.
//!
//! Receives go through a [`RecvQueue`] the same way, one chain per batch. Shared receive
//! queues get a [`SrqQueue`]: receives complete out of order there (any QP may take the
//! next one), so it keeps its buffers in a slot table with a free list.

use std::mem::MaybeUninit;

use crate::buf::MAX_SGE;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::wc::WorkCompletion;

mod claim;
mod prepared;
mod recv;
mod request;
mod ring;
mod send;
mod tag;

pub use prepared::{Prepared, PreparedQueue};
pub use recv::{RecvQueue, SrqQueue};
pub use request::SendRequest;
pub use send::SendQueue;

/// Most work requests one provider call posts in a batch.
pub const MAX_BATCH: usize = 64;

type Sges = [MaybeUninit<ffi::ibv_sge>; MAX_SGE];
const NO_SGES: Sges = [const { MaybeUninit::uninit() }; MAX_SGE];

/// A C work request with a `next` link.
trait Linked {
    fn next(&self) -> *mut Self;
    fn set_next(&mut self, next: *mut Self);
}

impl Linked for ffi::ibv_send_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

impl Linked for ffi::ibv_recv_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
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
        if self.prev.is_null() {
            self.first = cur;
        } else {
            // SAFETY: `prev` is the C request linked just before this one (in a queue's
            // scratch space or a prepared request's heap block), which nothing moved since.
            unsafe { (*self.prev).set_next(cur) };
        }
        self.prev = cur;
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
fn batch_too_long() -> Error {
    Error::invalid(Verb::PostSend, format!("a batch holds at most {MAX_BATCH} work requests"))
}

#[cold]
#[inline(never)]
fn queue_full(verb: Verb, depth: u64) -> Error {
    Error::invalid(verb, format!("the queue is full ({depth} outstanding): poll completions first"))
}

#[cold]
#[inline(never)]
fn not_ours(side: &str, wc: &WorkCompletion) -> Error {
    Error::invalid(
        Verb::PollCq,
        format!("completion wr_id {:#x} of QP {:#x} is not outstanding on this {side} queue", wc.wr_id(), wc.qp_num()),
    )
}
