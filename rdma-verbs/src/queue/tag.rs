//! The `wr_id`s of the safe queues: which side, which queue, which request.

use std::collections::HashSet;
use std::sync::Mutex;

use crate::error::{Error, Result, Verb};
use crate::wc::WorkCompletion;

// A wr_id is ours: bit 63 says receive side, bits 40..63 carry the posting queue's tag,
// unique in this process among live queues and queues whose requests are still posted,
// and bits 0..40 the sequence number (ring queues) or slot (SRQ). A completion is
// accepted only by the queue whose tag it carries.
pub(super) const RECV_TAG: u64 = 1 << 63;
pub(super) const TAG_SHIFT: u32 = 40;
const TAG_LIMIT: u32 = 1 << 23;
pub(super) const LOW_MASK: u64 = (1 << TAG_SHIFT) - 1;
pub(super) const SLOT_BITS: u32 = 20;

/// A queue's tag, reserved until dropped: with the queue, or after the QP or SRQ that
/// still holds the queue's posted requests is destroyed.
pub(super) struct Tag(pub(super) u32);

static TAGS: Mutex<(u32, Option<HashSet<u32>>)> = Mutex::new((0, None));

impl Tag {
    pub(super) fn reserve() -> Result<Tag> {
        let mut guard = TAGS.lock().map_err(|_| Error::invalid(Verb::Claim, "the queue tag registry is poisoned"))?;
        let (next, used) = &mut *guard;
        let used = used.get_or_insert_with(HashSet::new);
        for _ in 0..TAG_LIMIT {
            *next = if *next + 1 >= TAG_LIMIT { 1 } else { *next + 1 };
            if used.insert(*next) {
                return Ok(Tag(*next));
            }
        }
        Err(Error::invalid(Verb::Claim, "every queue tag is in use: too many queues or buried requests"))
    }

    #[inline]
    pub(super) fn bits(&self) -> u64 {
        u64::from(self.0) << TAG_SHIFT
    }
}

impl Drop for Tag {
    fn drop(&mut self) {
        if let Ok(mut guard) = TAGS.lock() {
            if let Some(used) = guard.1.as_mut() {
                used.remove(&self.0);
            }
        }
    }
}

/// The `wr_id` of the request (send or receive) with sequence number `seq` of the queue
/// whose tag bits are `tag` (with `RECV_TAG` on the receive side).
#[inline(always)]
pub(crate) fn wr_id(tag: u64, seq: u64) -> u64 {
    tag | (seq & LOW_MASK)
}

/// The low bits of `wr_id` when the completion carries the tag whose bits are `tag` on
/// the given side.
#[inline]
pub(super) fn ours(wc: &WorkCompletion, recv: bool, tag: u64) -> Option<u64> {
    let id = wc.wr_id();
    let side = if recv { RECV_TAG } else { 0 };
    (id & !LOW_MASK == side | tag).then_some(id & LOW_MASK)
}
