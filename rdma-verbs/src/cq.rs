//! Completion queues (`struct ibv_cq`) and their completion channels. The guide (one
//! poller, waiting without spinning) is on [`CompletionQueue`], public, where rustdoc
//! shows it; this module is private.

use std::ffi::c_int;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::context::Context;
use crate::conv;
use crate::cq_ex::WcFields;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::{destroy_shared, Owned};
use crate::wc::WorkCompletion;

/// Completion events are acknowledged once this many have been consumed (acknowledging
/// takes the CQ's mutex, so libibverbs advises batching), and always before destroy.
const ACK_BATCH: u32 = 32;

/// A completion queue (`struct ibv_cq`). Not `Clone`: polling needs `&mut self`, so there
/// is one poller.
///
/// Created with [`CompletionQueue::new`] or [`CompletionQueue::builder`]; destroyed when
/// it and every QP or SRQ that uses it are dropped, or now with [`destroy`](Self::destroy).
///
/// # One poller
///
/// At most one thread polls a CQ at a time. That is what the providers need: their poll
/// holds the CQ's lock, and a second poll from a nested or concurrent caller would spin on
/// it. QPs that complete into the CQ hold its C object alive (an `Arc` on the inside), not
/// the right to poll it.
///
/// # Waiting without spinning
///
/// A CQ built [`with_channel`](CqBuilder::with_channel) has its own completion channel and
/// can sleep until a completion comes. An event only says that a completion arrived
/// *after* [`arm`](Self::arm), so the loop arms first, then drains, then
/// [`wait`](Self::wait)s: a completion that lands between the last poll and the wait has
/// raised the event already, and the wait returns at once. After a wake the loop comes
/// back to arm again, then drains. The events `wait` consumed are acknowledged
/// (`ibv_ack_cq_events`) in batches, and all of them before the CQ is destroyed, which
/// `ibv_destroy_cq` requires; [`ack_events`](Self::ack_events) acknowledges them at once.
///
/// For an event loop (epoll, mio, tokio's `AsyncFd`), register the CQ's file descriptor
/// ([`AsRawFd`](std::os::fd::AsRawFd)); it is non-blocking, and on readiness
/// [`try_wait`](Self::try_wait) consumes the event without sleeping. To await completions
/// on an executor instead: [`AsyncCq`](crate::AsyncCq).
///
/// Here an RC QP sends four messages to itself (this example is
/// `tests/device/doc/cq_wait.rs`, which the device tests run):
///
#[doc = concat!("```no_run\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/device/doc/cq_wait.rs")), "```")]
#[doc(alias = "ibv_cq")]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
}

pub(crate) struct CqInner {
    /// First, so that its drop acknowledges the consumed events before `raw` is destroyed
    /// (`ibv_destroy_cq` waits for every event to be acknowledged).
    events: UnackedEvents,
    pub(crate) raw: Owned<ffi::ibv_cq>,
    /// After `raw`: a channel can only be destroyed once no CQ uses it.
    channel: Option<Owned<ffi::ibv_comp_channel>>,
    comp_vector: u32,
    /// The device's `max_cqe`: the largest CQ a refusal may advise.
    max_cqe: u32,
    pub(crate) ctx: Context,
    /// Entries set aside for the safe queues whose completions land here: each reserves
    /// its depth, so together they can never have more completions pending than the CQ
    /// holds (an overrun that the device would report only as an asynchronous CQ error).
    reserved: Mutex<u64>,
    /// The extended view of `raw`, when it was built extended.
    pub(crate) ex: Option<crate::cq_ex::ExCq>,
}

// SAFETY: libibverbs allows every CQ verb from any thread. The raw pointers are owned by
// this struct and only used by the verbs. The one mutable state, the unacknowledged-event
// count, is atomic.
unsafe impl Send for CqInner {}
// SAFETY: what a shared `&CqInner` reaches is the raw pointers (thread-safe verbs) and the
// atomic count. Polling, arming and waiting, which must not run concurrently, are methods
// of `CompletionQueue` taking `&mut self`, and `CompletionQueue` is not `Clone`.
unsafe impl Sync for CqInner {}

/// Completion events consumed by `ibv_get_cq_event` and not yet acknowledged.
struct UnackedEvents {
    cq: NonNull<ffi::ibv_cq>,
    count: AtomicU32,
}

impl UnackedEvents {
    /// Acknowledges every counted event.
    fn ack_all(&self) {
        let n = self.count.swap(0, Ordering::Relaxed);
        if n > 0 {
            // SAFETY: the CQ is live (this field drops before `CqInner::raw`, and
            // `CqInner::destroy` drops it before destroying the CQ), and these `n` events
            // were returned by `ibv_get_cq_event` for this CQ and not acknowledged yet.
            unsafe { ffi::ibv_ack_cq_events(self.cq.as_ptr(), n) }
        }
    }
}

impl Drop for UnackedEvents {
    fn drop(&mut self) {
        self.ack_all();
    }
}

impl CqInner {
    fn destroy(self) -> Result<()> {
        let CqInner { events, raw, channel, comp_vector: _, max_cqe: _, ctx: _, reserved: _, ex: _ } = self;
        drop(events);
        if let Err(e) = raw.destroy() {
            // The CQ still uses the channel: destroying it would fail too.
            std::mem::forget(channel);
            return Err(e);
        }
        channel.map_or(Ok(()), Owned::destroy)
    }
}

impl CqInner {
    /// The CQ's entries, as the provider granted them.
    pub(crate) fn entries(&self) -> u64 {
        // SAFETY: the CQ is live (self). `cqe` changes only in ibv_resize_cq, which
        // `CompletionQueue::resize` calls holding `reserved`'s lock: every caller of this
        // but `CompletionQueue::cqe` (which resize's `&mut self` excludes) holds it too.
        let cqe = unsafe { (*self.raw.as_ptr()).cqe };
        u64::try_from(cqe).unwrap_or(0)
    }

    /// Refuses, reserving nothing, when `n` more entries do not fit besides those the safe
    /// queues on this CQ reserved: the check [`CqReservation::take`] makes when a queue is
    /// claimed, made when a QP is built. `what` says whose completions they are, `smaller`
    /// how to ask for fewer.
    pub(crate) fn check_room(&self, n: u64, verb: Verb, what: &str, smaller: &str) -> Result<()> {
        let reserved = self.reserved.lock().unwrap_or_else(|p| p.into_inner());
        match no_room(self.entries(), *reserved, n, self.max_cqe.into(), what, smaller) {
            None => Ok(()),
            Some(why) => Err(Error::invalid(verb, why)),
        }
    }
}

/// Why `n` more completions do not fit in a CQ of `entries` of which `reserved` are set
/// aside, or `None` when they fit. The advice stays within the device: a CQ of at least
/// the size needed when `max_cqe` allows one, else smaller depths (`smaller`) or another CQ.
fn no_room(entries: u64, reserved: u64, n: u64, max_cqe: u64, what: &str, smaller: &str) -> Option<String> {
    let need = reserved.saturating_add(n);
    if need <= entries {
        return None;
    }
    let advice = if need <= max_cqe {
        format!("create the CQ with at least {need} entries, or {smaller}")
    } else {
        format!(
            "{need} entries is more than the device's max_cqe {max_cqe}, so no CQ of this device holds \
             them: {smaller}, or give some of the queues another CQ"
        )
    };
    Some(format!(
        "{what} may have {n} completions pending, but its CQ has {entries} entries and {reserved} of them are \
         reserved by other queues: {advice} (completions beyond the CQ's size would overrun it)"
    ))
}

/// Entries of a CQ set aside for one safe queue (its depth), given back on drop.
pub(crate) struct CqReservation {
    cq: Arc<CqInner>,
    n: u64,
}

impl CqReservation {
    /// Sets `n` entries of `cq` aside for `what`, or refuses when the CQ cannot hold them
    /// on top of what the other queues on it reserved.
    pub(crate) fn take(cq: &Arc<CqInner>, n: u64, verb: Verb, what: &str) -> Result<Self> {
        let mut reserved = cq.reserved.lock().unwrap_or_else(|p| p.into_inner());
        let smaller = "claim the queue with a smaller depth";
        if let Some(why) = no_room(cq.entries(), *reserved, n, cq.max_cqe.into(), what, smaller) {
            return Err(Error::invalid(verb, why));
        }
        *reserved += n;
        Ok(CqReservation { cq: Arc::clone(cq), n })
    }
}

impl CqReservation {
    /// Sets the rest of the CQ aside for the queue that holds this share, when `cq` is
    /// that CQ and no other queue has room on it: for a queue that takes every completion
    /// of its CQ as its own (no other queue can claim room on it afterwards).
    pub(crate) fn whole(&self, cq: &CompletionQueue, verb: Verb, what: &str) -> Result<CqReservation> {
        if !Arc::ptr_eq(&self.cq, &cq.inner) {
            return Err(Error::invalid(
                verb,
                format!("{what} awaits its QP side's own CQ, and this CQ is another: pass the QP's CQ"),
            ));
        }
        let mut reserved = self.cq.reserved.lock().unwrap_or_else(|p| p.into_inner());
        if *reserved != self.n {
            let others = *reserved - self.n;
            return Err(Error::invalid(
                verb,
                format!(
                    "{what} needs a CQ of its own, but other queues reserved {others} of its entries: \
                     give this QP side a CQ it does not share"
                ),
            ));
        }
        let rest = self.cq.entries().saturating_sub(*reserved);
        *reserved += rest;
        Ok(CqReservation { cq: Arc::clone(&self.cq), n: rest })
    }
}

impl Drop for CqReservation {
    fn drop(&mut self) {
        let mut reserved = self.cq.reserved.lock().unwrap_or_else(|p| p.into_inner());
        *reserved -= self.n;
    }
}

/// Options for a new [`CompletionQueue`]: from [`CompletionQueue::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until build() is called"]
pub struct CqBuilder<'a> {
    ctx: &'a Context,
    cqe: u32,
    comp_vector: u32,
    channel: bool,
    extended: Option<WcFields>,
}

impl CqBuilder<'_> {
    /// The completion vector (interrupt) the CQ's events are delivered on: below the
    /// device's [`num_comp_vectors`](CompletionQueue::num_comp_vectors). Default 0.
    pub fn comp_vector(mut self, vector: u32) -> Self {
        self.comp_vector = vector;
        self
    }

    /// Gives the CQ its own completion channel, so that it can [`arm`](CompletionQueue::arm)
    /// and [`wait`](CompletionQueue::wait) and has a file descriptor for event loops.
    #[doc(alias = "ibv_create_comp_channel")]
    pub fn with_channel(mut self) -> Self {
        self.channel = true;
        self
    }

    /// Builds an extended CQ (`ibv_create_cq_ex`): its completions can also be polled
    /// with [`CompletionQueue::poll_extended`], which hands out [`ExtendedCompletion`]s
    /// carrying `fields` besides the classic ones (which are always there). It works as a
    /// classic CQ for everything else (QPs, queues, [`poll`](CompletionQueue::poll)).
    /// A device without the extended CQ or one of the fields refuses it at
    /// [`build`](Self::build) with [`Error::NotSupported`].
    ///
    /// [`ExtendedCompletion`]: crate::ExtendedCompletion
    #[doc(alias = "ibv_create_cq_ex")]
    pub fn extended(mut self, fields: WcFields) -> Self {
        self.extended = Some(fields);
        self
    }

    /// Creates the CQ (`ibv_create_cq`, or `ibv_create_cq_ex` when
    /// [`extended`](Self::extended), and `ibv_create_comp_channel` first when asked).
    ///
    /// Fails with [`Error::InvalidArgument`], before any C call, when `cqe` is 0 or above
    /// the device's `max_cqe`, or `comp_vector` is not below the device's vector count.
    #[doc(alias = "ibv_create_cq")]
    pub fn build(self) -> Result<CompletionQueue> {
        const VERB: Verb = Verb::CreateCq;
        let ctx = self.ctx;
        if self.cqe == 0 {
            return Err(Error::invalid(Verb::CqBuilderBuild, "cqe 0: a CQ needs at least one entry"));
        }
        let max_cqe = ctx.query_device()?.max_cqe;
        if self.cqe > max_cqe {
            return Err(Error::invalid(
                Verb::CqBuilderBuild,
                format!("cqe {} exceeds the device's max_cqe {max_cqe}", self.cqe),
            ));
        }
        let vectors = num_comp_vectors(ctx);
        if self.comp_vector >= vectors {
            return Err(Error::invalid(
                Verb::CqBuilderBuild,
                format!(
                    "comp_vector {} is out of range: the device has {vectors} completion vectors (0..{vectors})",
                    self.comp_vector
                ),
            ));
        }
        let channel = if self.channel { Some(new_channel(ctx)?) } else { None };
        let channel_ptr = channel.as_ref().map_or(ptr::null_mut(), Owned::as_ptr);
        // Both fit in c_int: checked against device limits that are c_int in C.
        let (cqe, vector) = (self.cqe as c_int, self.comp_vector as c_int);
        let (raw, ex) = match self.extended {
            None => {
                // SAFETY: the context is open; the channel, if any, is live and belongs to
                // it and outlives the CQ (field order of CqInner); no cq_context.
                let raw = unsafe { ffi::ibv_create_cq(ctx.as_raw(), cqe, ptr::null_mut(), channel_ptr, vector) };
                // SAFETY: a new CQ that only this Owned destroys. On failure `channel`
                // drops here.
                (unsafe { Owned::new(raw, VERB)? }, None)
            }
            Some(fields) => {
                let mut attr = ffi::ibv_cq_init_attr_ex {
                    cqe: self.cqe,
                    cq_context: ptr::null_mut(),
                    channel: channel_ptr,
                    comp_vector: self.comp_vector,
                    wc_flags: crate::cq_ex::wc_flags(fields),
                    comp_mask: 0,
                    flags: 0,
                    parent_domain: ptr::null_mut(),
                };
                // SAFETY: as above; `attr` is valid for the call and asks for nothing
                // beyond its first fields (comp_mask 0).
                let ex = unsafe { ffi::ibv_create_cq_ex(ctx.as_raw(), &mut attr) };
                let Some(ex) = NonNull::new(ex) else {
                    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
                    return Err(Error::verb_or_not_supported(
                        Verb::CreateCqEx,
                        errno,
                        crate::cq_ex::capability(fields),
                    ));
                };
                // SAFETY: an extended CQ is a CQ (ibv_cq_ex_to_cq), destroyed by
                // ibv_destroy_cq; only this Owned destroys it.
                let raw = unsafe { Owned::new(ffi::ibv_cq_ex_to_cq(ex.as_ptr()), Verb::CreateCqEx)? };
                (raw, Some(crate::cq_ex::ExCq { raw: ex, fields }))
            }
        };
        let events = UnackedEvents {
            // Owned::new refused NULL above.
            cq: NonNull::new(raw.as_ptr()).expect("Owned holds a non-null pointer"),
            count: AtomicU32::new(0),
        };
        let inner = CqInner {
            events,
            raw,
            channel,
            comp_vector: self.comp_vector,
            max_cqe,
            ctx: ctx.clone(),
            reserved: Mutex::new(0),
            ex,
        };
        Ok(CompletionQueue { inner: Arc::new(inner) })
    }
}

fn num_comp_vectors(ctx: &Context) -> u32 {
    // SAFETY: the context is open; libibverbs sets this field when opening the device and
    // never changes it.
    let n = unsafe { (*ctx.as_raw()).num_comp_vectors };
    u32::try_from(n).unwrap_or(0)
}

/// A new completion channel whose file descriptor does not block, so that `wait` can
/// bound its sleep with poll(2) and event loops can own the readiness.
fn new_channel(ctx: &Context) -> Result<Owned<ffi::ibv_comp_channel>> {
    // SAFETY: the context is open.
    let raw = unsafe { ffi::ibv_create_comp_channel(ctx.as_raw()) };
    // SAFETY: a new channel that only this Owned destroys.
    let channel = unsafe { Owned::new(raw, Verb::CreateCompChannel)? };
    // SAFETY: the channel is live; its fd is open for as long as the channel is.
    let fd = unsafe { (*channel.as_ptr()).fd };
    // SAFETY: fcntl on an open fd with integer arguments.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(Error::last_os(Verb::SetFl));
    }
    Ok(channel)
}

impl CompletionQueue {
    /// Creates a CQ with at least `cqe` entries on completion vector 0, no channel:
    /// shorthand for `CompletionQueue::builder(ctx, cqe).build()`.
    #[doc(alias = "ibv_create_cq")]
    pub fn new(ctx: &Context, cqe: u32) -> Result<Self> {
        Self::builder(ctx, cqe).build()
    }

    /// Starts building a CQ with at least `cqe` entries (the device may round up: see
    /// [`cqe`](Self::cqe)). Size it for every work request that can be outstanding on the
    /// QPs completing into it: a CQ that overflows puts them in the error state. The safe
    /// queues enforce this: each sets its depth aside here when claimed
    /// ([`QueuePair::send_queue`](crate::QueuePair::send_queue)), and a claim that does
    /// not fit is refused. A QP is checked when it is built too: its `max_send_wr` and
    /// `max_recv_wr` (their sum when both sides complete here) must fit besides what the
    /// queues on this CQ have reserved, so a QP with the default 128 + 128 needs 256 entries.
    pub fn builder(ctx: &Context, cqe: u32) -> CqBuilder<'_> {
        CqBuilder { ctx, cqe, comp_vector: 0, channel: false, extended: None }
    }

    /// The raw pointer, valid while `self` lives.
    #[inline]
    pub fn as_raw(&self) -> *mut ffi::ibv_cq {
        self.inner.raw.as_ptr()
    }

    /// The context this CQ belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The number of entries the CQ really has (at least what was asked for).
    pub fn cqe(&self) -> u32 {
        // SAFETY: the CQ is live; `cqe` changes only in ibv_resize_cq, which `resize`
        // calls with `&mut self`, so not while this `&self` is borrowed.
        let cqe = unsafe { (*self.as_raw()).cqe };
        u32::try_from(cqe).unwrap_or(0)
    }

    /// The completion vector the CQ was created on.
    pub fn comp_vector(&self) -> u32 {
        self.inner.comp_vector
    }

    /// How many completion vectors the device has (valid `comp_vector` values are below).
    pub fn num_comp_vectors(ctx: &Context) -> u32 {
        num_comp_vectors(ctx)
    }

    /// True when the CQ was built [`with_channel`](CqBuilder::with_channel).
    pub fn has_channel(&self) -> bool {
        self.inner.channel.is_some()
    }

    /// Resizes the CQ to at least `cqe` entries (`ibv_resize_cq`) and returns the entries
    /// the provider granted, which may be more (providers round up) and which
    /// [`cqe`](Self::cqe) reports from then on.
    ///
    /// Completions already in the CQ stay there, in order, to be polled after the resize.
    /// The CQ budget stays true: the safe queues on this CQ reserved entries for their
    /// depth when they were claimed, and a size below what they reserved is refused with
    /// [`Error::InvalidArgument`] naming [`Verb::CqResize`] and the reservations, before
    /// any C call; so are 0 and sizes above the device's `max_cqe`. No queue can claim
    /// entries while the size changes. Since the completions the safe queues can have
    /// pending never exceed what they reserved, a resize this allows never drops one of
    /// theirs; a provider asked to shrink below the completions the CQ holds (ones of QPs
    /// driven through `ffi`) answers `EINVAL` ([`Verb::ResizeCq`]): poll first.
    #[doc(alias = "ibv_resize_cq")]
    pub fn resize(&mut self, cqe: u32) -> Result<u32> {
        let inner = &*self.inner;
        if cqe == 0 {
            return Err(Error::invalid(Verb::CqResize, "cqe 0: a CQ needs at least one entry"));
        }
        if cqe > inner.max_cqe {
            return Err(Error::invalid(
                Verb::CqResize,
                format!("cqe {cqe} exceeds the device's max_cqe {}", inner.max_cqe),
            ));
        }
        // Held across the call: a queue claimed meanwhile would count on the old size.
        let reserved = inner.reserved.lock().unwrap_or_else(|p| p.into_inner());
        if u64::from(cqe) < *reserved {
            return Err(Error::invalid(
                Verb::CqResize,
                format!(
                    "cqe {cqe} is below the {} entries reserved on this CQ by the safe queues claimed on it \
                     (each sets its depth aside; the CQ has {} entries now): a smaller CQ could overrun, \
                     so drop queues or claim them with smaller depths first",
                    *reserved,
                    inner.entries()
                ),
            ));
        }
        // Fits in c_int: at most max_cqe, which is a c_int in C.
        // SAFETY: the CQ is live; `&mut self` keeps a poll, arm or wait of it from running
        // meanwhile, and the lock keeps the queues on it from reading `cqe`.
        let rc = unsafe { ffi::ibv_resize_cq(self.as_raw(), cqe as c_int) };
        conv::rc(Verb::ResizeCq, rc).map_err(|e| match e.errno() {
            Some(libc::EINVAL) => e.with_hint(
                "the CQ holds more completions than the new size, or the provider cannot make a CQ of this size: \
                 poll the completions first",
            ),
            Some(libc::EOPNOTSUPP | libc::ENOSYS) => Error::verb_or_not_supported(
                Verb::ResizeCq,
                e.errno().unwrap_or(libc::EOPNOTSUPP),
                "CQ resizing: the provider has no resize_cq",
            ),
            _ => e,
        })?;
        drop(reserved);
        Ok(self.cqe())
    }

    /// Sets the CQ's event moderation (`ibv_modify_cq` with `IBV_CQ_ATTR_MODERATE`): an
    /// armed CQ raises its event once `count` completions arrived or `period_us`
    /// microseconds passed since the first, whichever comes first. `(1, 0)` is no
    /// moderation. Polling is unchanged: moderation delays events, not completions.
    ///
    /// Both values are checked against the device's `cq_mod_caps` (`ibv_query_device_ex`)
    /// before any C call: a device that reports no moderation (both limits 0, as rxe does)
    /// gives [`Error::NotSupported`] naming [`Verb::CqSetModeration`] and those limits; a
    /// value above its limit gives [`Error::InvalidArgument`]. A provider without the verb
    /// answers [`Error::NotSupported`] naming [`Verb::ModifyCq`] and `EOPNOTSUPP`.
    #[doc(alias = "ibv_modify_cq")]
    pub fn set_moderation(&mut self, count: u16, period_us: u16) -> Result<()> {
        const OURS: Verb = Verb::CqSetModeration;
        let caps = crate::caps::device_attr_ex(self.context())?.cq_mod_caps;
        let (max_count, max_period) = (caps.max_cq_count, caps.max_cq_period);
        if max_count == 0 && max_period == 0 {
            return Err(Error::not_supported(
                OURS,
                "CQ moderation: the device reports cq_mod_caps.max_cq_count 0 and \
                 cq_mod_caps.max_cq_period 0 (ibv_query_device_ex)",
            ));
        }
        if count > max_count {
            return Err(Error::invalid(
                OURS,
                format!("count {count} exceeds the device's cq_mod_caps.max_cq_count {max_count}"),
            ));
        }
        if period_us > max_period {
            return Err(Error::invalid(
                OURS,
                format!("period {period_us} us exceeds the device's cq_mod_caps.max_cq_period {max_period} us"),
            ));
        }
        let mut attr = ffi::ibv_modify_cq_attr {
            attr_mask: ffi::ibv_cq_attr_mask::IBV_CQ_ATTR_MODERATE.0,
            moderate: ffi::ibv_moderate_cq { cq_count: count, cq_period: period_us },
        };
        // SAFETY: the CQ is live and `attr` is a valid attribute set for the call.
        let rc = unsafe { ffi::ibv_modify_cq(self.as_raw(), &mut attr) };
        match rc {
            0 => Ok(()),
            rc => Err(Error::verb_or_not_supported(
                Verb::ModifyCq,
                rc.abs(),
                "CQ moderation: the provider has no modify_cq",
            )),
        }
    }

    /// Moves up to `wc.len()` completions into the front of `wc` and returns that part,
    /// empty when none are ready (`ibv_poll_cq`, called once).
    ///
    /// No allocation, lock or system call of this crate: the cost is the provider's. Check
    /// each completion's [`status`](WorkCompletion::status) (or call
    /// [`ok`](WorkCompletion::ok)): a failed work request is a completion, not an `Err`.
    /// `Err` means the provider could not read the CQ at all.
    #[doc(alias = "ibv_poll_cq")]
    #[inline]
    pub fn poll<'a>(&mut self, wc: &'a mut [WorkCompletion]) -> Result<&'a mut [WorkCompletion]> {
        let max = c_int::try_from(wc.len()).unwrap_or(c_int::MAX);
        // SAFETY: the CQ is live; `wc` has room for `max` entries and WorkCompletion is
        // repr(transparent) over ibv_wc; `&mut self` makes this the only poll of this CQ.
        let n = unsafe { ffi::ibv_poll_cq(self.as_raw(), max, wc.as_mut_ptr().cast()) };
        match usize::try_from(n) {
            Ok(n) => Ok(&mut wc[..n]),
            Err(_) => Err(poll_error(n)),
        }
    }

    /// Polls for one completion: `Ok(None)` when none is ready.
    #[inline]
    pub fn poll_one(&mut self) -> Result<Option<WorkCompletion>> {
        let mut wc = [WorkCompletion::EMPTY];
        Ok(self.poll(&mut wc)?.first_mut().map(std::mem::take))
    }

    /// Asks for an event on the channel at the next completion, or with `solicited_only`
    /// at the next solicited or failed one (`ibv_req_notify_cq`). One arming raises at most
    /// one event; arm again after each. Arm, then drain, then [`wait`](Self::wait):
    /// [Waiting without spinning](CompletionQueue#waiting-without-spinning) says why.
    #[doc(alias = "ibv_req_notify_cq")]
    pub fn arm(&mut self, solicited_only: bool) -> Result<()> {
        self.channel(Verb::ReqNotifyCq)?;
        // SAFETY: the CQ is live and `&mut self` keeps a poll of it from running meanwhile
        // (providers read the consumer index when arming).
        let rc = unsafe { ffi::ibv_req_notify_cq(self.as_raw(), c_int::from(solicited_only)) };
        conv::rc(Verb::ReqNotifyCq, rc)
    }

    /// Sleeps until the armed CQ raises an event, or for at most `timeout`
    /// ([`Error::Timeout`] when nothing comes; `None` waits forever, `Some(ZERO)` only
    /// looks). Consumes the event (`ibv_get_cq_event`); the CQ must be armed again for the
    /// next one. Completions are not returned here: poll for them.
    #[doc(alias = "ibv_get_cq_event")]
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<()> {
        let fd = self.channel_fd_or(Verb::GetCqEvent)?;
        // A timeout too large for the clock is no timeout.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            let ms = match deadline {
                None => -1,
                Some(d) => {
                    // Round up, so a sub-millisecond remainder sleeps instead of spinning.
                    let left = d.saturating_duration_since(Instant::now());
                    c_int::try_from(left.as_nanos().div_ceil(1_000_000)).unwrap_or(c_int::MAX)
                }
            };
            let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc < 0 {
                let e = Error::last_os(Verb::Poll);
                if e.errno() == Some(libc::EINTR) {
                    continue;
                }
                return Err(e);
            }
            if rc > 0 && self.try_wait()? {
                return Ok(());
            }
            if rc == 0 && ms == 0 {
                return Err(Error::Timeout { verb: Verb::GetCqEvent, timeout: timeout.unwrap_or_default() });
            }
            // Woken with nothing to read (another reader of the fd took it), or the
            // rounded-up sleep ended a hair early: look again with the time left.
        }
    }

    /// Consumes a pending event without sleeping: `Ok(true)` when there was one,
    /// `Ok(false)` when not. For event loops that saw the [file descriptor](AsRawFd)
    /// become readable.
    pub fn try_wait(&mut self) -> Result<bool> {
        let channel = self.channel(Verb::GetCqEvent)?;
        let mut cq = ptr::null_mut();
        let mut cq_context = ptr::null_mut();
        // SAFETY: the channel is live; its fd is non-blocking, so this returns at once.
        let rc = unsafe { ffi::ibv_get_cq_event(channel, &mut cq, &mut cq_context) };
        if let Err(e) = conv::rc(Verb::GetCqEvent, rc) {
            return match e.errno() {
                Some(libc::EAGAIN | libc::EINTR) => Ok(false),
                _ => Err(e),
            };
        }
        // The channel is this CQ's alone, so the event is this CQ's.
        debug_assert_eq!(cq, self.as_raw());
        let events = &self.inner.events;
        if events.count.fetch_add(1, Ordering::Relaxed) + 1 >= ACK_BATCH {
            events.ack_all();
        }
        Ok(true)
    }

    /// Acknowledges every event [`wait`](Self::wait) consumed (`ibv_ack_cq_events`).
    /// Optional: they are acknowledged in batches, and all before the CQ is destroyed.
    #[doc(alias = "ibv_ack_cq_events")]
    pub fn ack_events(&mut self) {
        self.inner.events.ack_all();
    }

    /// Events consumed and not acknowledged yet.
    pub fn unacked_events(&self) -> u32 {
        self.inner.events.count.load(Ordering::Relaxed)
    }

    /// The completion channel's file descriptor, or `None` without a channel.
    pub fn channel_fd(&self) -> Option<RawFd> {
        // SAFETY: the channel is live while the CQ is; `fd` is set once at creation.
        self.inner.channel.as_ref().map(|ch| unsafe { (*ch.as_ptr()).fd })
    }

    /// Destroys the CQ now, then its channel, and reports the result (`ibv_destroy_cq`).
    /// Fails with EBUSY, freeing nothing yet, while QPs or SRQs that use the CQ are alive.
    #[doc(alias = "ibv_destroy_cq", alias = "ibv_destroy_comp_channel")]
    pub fn destroy(self) -> Result<()> {
        destroy_shared(self.inner, Verb::DestroyCq, CqInner::destroy)
    }

    fn channel(&self, verb: Verb) -> Result<*mut ffi::ibv_comp_channel> {
        match &self.inner.channel {
            Some(ch) => Ok(ch.as_ptr()),
            None => Err(no_channel(verb)),
        }
    }

    fn channel_fd_or(&self, verb: Verb) -> Result<RawFd> {
        self.channel_fd().ok_or_else(|| no_channel(verb))
    }
}

#[cold]
fn no_channel(verb: Verb) -> Error {
    Error::invalid(verb, "this CQ has no completion channel: build it with CompletionQueue::builder(..).with_channel()")
}

#[cold]
#[inline(never)]
fn poll_error(rc: c_int) -> Error {
    // Providers return a negative number, not always an errno (mlx5 returns -2).
    let errno = if rc == -libc::EOPNOTSUPP { libc::EOPNOTSUPP } else { libc::EIO };
    Error::verb(Verb::PollCq, errno).with_hint(format!(
        "the provider returned {rc}: the CQ is unusable, usually because it overran \
         (more completions outstanding than its cqe entries) or the device failed"
    ))
}

/// The completion channel's file descriptor: register it with epoll, mio or tokio's
/// `AsyncFd` to learn when [`try_wait`](CompletionQueue::try_wait) has an event. It is
/// non-blocking. Arm the CQ before waiting for readiness, as with [`wait`](CompletionQueue::wait).
///
/// # Panics
/// When the CQ has no channel (built without [`with_channel`](CqBuilder::with_channel)).
impl AsRawFd for CompletionQueue {
    fn as_raw_fd(&self) -> RawFd {
        match self.channel_fd() {
            Some(fd) => fd,
            None => panic!("{}", no_channel(Verb::CqFd)),
        }
    }
}

/// As [`AsRawFd`], including the panic without a channel.
impl AsFd for CompletionQueue {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd is open while the channel is, and the channel lives as long as
        // `self` (and longer, while QPs hold the CQ).
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("cqe", &self.cqe())
            .field("comp_vector", &self.comp_vector())
            .field("channel_fd", &self.channel_fd())
            .field("context", self.context())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::no_room;

    const SMALLER: &str = "build the QP with a smaller max_send_wr or max_recv_wr";

    #[test]
    fn what_fits_besides_the_reserved_entries_is_no_refusal() {
        assert_eq!(no_room(255, 0, 255, 32767, "x", SMALLER), None);
        assert_eq!(no_room(255, 127, 128, 32767, "x", SMALLER), None);
    }

    #[test]
    fn a_refusal_names_the_size_needed_when_the_device_can_make_such_a_cq() {
        let why = no_room(127, 0, 256, 32767, "the RC QP's queues", SMALLER).unwrap();
        assert!(
            why.starts_with("the RC QP's queues may have 256 completions pending, but its CQ has 127 entries"),
            "{why}"
        );
        assert!(why.contains("create the CQ with at least 256 entries, or build the QP with a smaller"), "{why}");
        let why = no_room(127, 100, 28, 32767, "this send queue", "claim the queue with a smaller depth").unwrap();
        assert!(why.contains("100 of them are reserved by other queues"), "{why}");
        assert!(why.contains("at least 128 entries, or claim the queue with a smaller depth"), "{why}");
    }

    #[test]
    fn a_refusal_never_advises_a_cq_larger_than_max_cqe() {
        // The size needed is beyond the device: say so, and advise what can work instead.
        let why =
            no_room(32767, 1 << 20, 64, 32767, "this send queue", "claim the queue with a smaller depth").unwrap();
        assert!(!why.contains("create the CQ with at least"), "{why}");
        assert!(why.contains("1048640 entries is more than the device's max_cqe 32767"), "{why}");
        assert!(why.contains("claim the queue with a smaller depth, or give some of the queues another CQ"), "{why}");
        // Exactly max_cqe is still a CQ the device can make.
        let why = no_room(127, 0, 32767, 32767, "q", SMALLER).unwrap();
        assert!(why.contains("create the CQ with at least 32767 entries"), "{why}");
        let why = no_room(127, 0, 32768, 32767, "q", SMALLER).unwrap();
        assert!(why.contains("more than the device's max_cqe 32767"), "{why}");
    }
}
