//! The extended CQ (`struct ibv_cq_ex`): a [`CompletionQueue`] built with
//! [`CqBuilder::extended`](crate::CqBuilder::extended), polled with
//! [`CompletionQueue::poll_extended`] through `ibv_start_poll` / `ibv_next_poll` /
//! `ibv_end_poll`. The guide is on [`ExtendedCompletion`].

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use bitflags::bitflags;

use crate::compat;
use crate::cq::CompletionQueue;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::wc::WorkCompletion;

bitflags! {
    /// What an extended CQ's completions carry besides the classic fields
    /// (`enum ibv_create_cq_wc_flags`), asked for when the CQ is built
    /// ([`CqBuilder::extended`](crate::CqBuilder::extended)). The classic fields (byte
    /// count, immediate data, QP number, source QP, SLID, SL, path bits:
    /// `IBV_WC_STANDARD_FLAGS`) are always asked for: the safe queues need them.
    ///
    /// A device that cannot give a field refuses the CQ with [`Error::NotSupported`]
    /// (rxe has none of these).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct WcFields: u64 {
        /// The completion's time in device clock ticks ([`ExtendedCompletion::timestamp`]).
        const COMPLETION_TIMESTAMP =
            ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP.0 as u64;
        /// The completion's time in wall-clock nanoseconds
        /// ([`ExtendedCompletion::wallclock_ns`]).
        const COMPLETION_TIMESTAMP_WALLCLOCK =
            ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK.0 as u64;
        /// The customer VLAN of a received packet ([`ExtendedCompletion::cvlan`]).
        const CVLAN = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_CVLAN.0 as u64;
        /// The flow tag of a received packet ([`ExtendedCompletion::flow_tag`]).
        const FLOW_TAG = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_FLOW_TAG.0 as u64;
    }
}

/// The `wc_flags` an extended CQ is built with: the classic fields and `fields`.
pub(crate) fn wc_flags(fields: WcFields) -> u64 {
    u64::from(ffi::IBV_WC_STANDARD_FLAGS.0) | fields.bits()
}

/// The capability a refused extended CQ lacked, for [`Error::NotSupported`].
pub(crate) fn capability(fields: WcFields) -> &'static str {
    if fields.is_empty() {
        "the extended CQ (ibv_create_cq_ex)"
    } else {
        "the completion fields asked for (ibv_create_cq_ex wc_flags: timestamps, CVLAN or flow tag)"
    }
}

/// What a CQ built extended keeps: the extended view of its CQ and what it asked for.
#[derive(Clone, Copy)]
pub(crate) struct ExCq {
    pub(crate) raw: NonNull<ffi::ibv_cq_ex>,
    pub(crate) fields: WcFields,
}

/// One completion of an extended CQ ([`CompletionQueue::poll_extended`]): the classic
/// [`WorkCompletion`] (`Deref`s to it, so a queue's `complete` takes it as it takes one
/// from [`poll`](CompletionQueue::poll): `sq.complete(&mut c, ...)`), and the fields the
/// CQ was built to carry besides ([`WcFields`]).
///
/// The ownership rules are the classic CQ's: the completion is copied out of the
/// provider's queue while the poll holds it (between `ibv_start_poll` and
/// `ibv_end_poll`), so nothing of the provider's is borrowed afterwards; a queue's
/// `complete` marks it taken, and it is neither `Copy` nor `Clone`.
///
/// Of a failed completion only `wr_id`, `status`, `qp_num` and `vendor_err` are read (the
/// others are undefined then, `man ibv_create_cq_ex`), the rest stays zero.
///
/// Here a send with immediate data goes from one QP to another, and the receiver reads
/// its completion from an extended CQ (`tests/device/doc/cq_ex.rs`, run by the device
/// tests):
///
#[doc = concat!("```no_run\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/device/doc/cq_ex.rs")), "```")]
#[doc(alias = "ibv_cq_ex", alias = "ibv_start_poll", alias = "ibv_next_poll", alias = "ibv_end_poll")]
#[derive(Default)]
pub struct ExtendedCompletion {
    wc: WorkCompletion,
    timestamp: Option<u64>,
    wallclock_ns: Option<u64>,
    cvlan: Option<u16>,
    flow_tag: Option<u32>,
}

impl ExtendedCompletion {
    /// A placeholder for a poll buffer (no queue takes it):
    /// `std::array::from_fn(|_| ExtendedCompletion::EMPTY)`.
    pub const EMPTY: ExtendedCompletion = ExtendedCompletion {
        wc: WorkCompletion::EMPTY,
        timestamp: None,
        wallclock_ns: None,
        cvlan: None,
        flow_tag: None,
    };

    /// The completion's time in device clock ticks, when the CQ was built with
    /// [`WcFields::COMPLETION_TIMESTAMP`].
    #[doc(alias = "ibv_wc_read_completion_ts")]
    pub fn timestamp(&self) -> Option<u64> {
        self.timestamp
    }

    /// The completion's time in wall-clock nanoseconds, when the CQ was built with
    /// [`WcFields::COMPLETION_TIMESTAMP_WALLCLOCK`].
    #[doc(alias = "ibv_wc_read_completion_wallclock_ns")]
    pub fn wallclock_ns(&self) -> Option<u64> {
        self.wallclock_ns
    }

    /// The customer VLAN of a received packet, when the CQ was built with
    /// [`WcFields::CVLAN`].
    #[doc(alias = "ibv_wc_read_cvlan")]
    pub fn cvlan(&self) -> Option<u16> {
        self.cvlan
    }

    /// The flow tag of a received packet, when the CQ was built with
    /// [`WcFields::FLOW_TAG`].
    #[doc(alias = "ibv_wc_read_flow_tag")]
    pub fn flow_tag(&self) -> Option<u32> {
        self.flow_tag
    }
}

impl Deref for ExtendedCompletion {
    type Target = WorkCompletion;
    fn deref(&self) -> &WorkCompletion {
        &self.wc
    }
}

impl DerefMut for ExtendedCompletion {
    fn deref_mut(&mut self) -> &mut WorkCompletion {
        &mut self.wc
    }
}

impl fmt::Debug for ExtendedCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtendedCompletion")
            .field("wc", &self.wc)
            .field("timestamp", &self.timestamp)
            .field("wallclock_ns", &self.wallclock_ns)
            .finish_non_exhaustive()
    }
}

impl CompletionQueue {
    /// True when the CQ was built [`extended`](crate::CqBuilder::extended).
    pub fn is_extended(&self) -> bool {
        self.inner.ex.is_some()
    }

    /// Moves up to `out.len()` completions into the front of `out` and returns that part,
    /// empty when none are ready: one `ibv_start_poll`, an `ibv_next_poll` for each next
    /// completion, one `ibv_end_poll` ([`ExtendedCompletion`] says what each holds).
    ///
    /// Where the loaded rdma-core's rxe provider mishandles `ibv_next_poll` at the end of
    /// the queue (releases before 61: [`compat::Quirks::ext_cq_poll`]), each completion
    /// gets its own `ibv_start_poll` / `ibv_end_poll` instead: the same completions, in
    /// the same order, a lock taken per completion.
    ///
    /// Refused before any C call on a CQ not built extended. As with
    /// [`poll`](Self::poll), a failed work request is a completion, not an `Err`.
    #[doc(alias = "ibv_start_poll", alias = "ibv_next_poll", alias = "ibv_end_poll")]
    #[doc(alias = "ibv_wc_read_opcode", alias = "ibv_wc_read_vendor_err", alias = "ibv_wc_read_byte_len")]
    #[doc(alias = "ibv_wc_read_imm_data", alias = "ibv_wc_read_invalidated_rkey", alias = "ibv_wc_read_qp_num")]
    #[doc(alias = "ibv_wc_read_src_qp", alias = "ibv_wc_read_wc_flags", alias = "ibv_wc_read_slid")]
    #[doc(alias = "ibv_wc_read_sl", alias = "ibv_wc_read_dlid_path_bits")]
    pub fn poll_extended<'a>(&mut self, out: &'a mut [ExtendedCompletion]) -> Result<&'a mut [ExtendedCompletion]> {
        let Some(ExCq { raw, fields }) = self.inner.ex else {
            return Err(Error::invalid(
                Verb::PollExtended,
                "this CQ was not built extended (CqBuilder::extended): poll it with CompletionQueue::poll",
            ));
        };
        if out.is_empty() {
            return Ok(out);
        }
        let cq = raw.as_ptr();
        let next_poll = compat::quirks().ext_cq_poll;
        let mut attr = ffi::ibv_poll_cq_attr { comp_mask: 0 };
        // SAFETY: the CQ is live and extended; `&mut self` makes this its only poll. A
        // batch is opened by a start_poll that returned 0 and closed by one end_poll; the
        // readers run only inside an open batch, on its current completion, and read only
        // the fields the CQ was built with (`read`).
        unsafe {
            match ffi::ibv_start_poll(cq, &mut attr) {
                0 => {}
                libc::ENOENT => return Ok(&mut out[..0]),
                rc => return Err(Error::verb(Verb::StartPoll, rc)),
            }
            let mut n = 0;
            loop {
                out[n] = read(cq, fields);
                n += 1;
                if n == out.len() {
                    ffi::ibv_end_poll(cq);
                    break;
                }
                if next_poll {
                    match ffi::ibv_next_poll(cq) {
                        0 => continue,
                        // The man page: end the batch even when next_poll found none.
                        libc::ENOENT => {
                            ffi::ibv_end_poll(cq);
                            break;
                        }
                        rc => {
                            ffi::ibv_end_poll(cq);
                            return Err(Error::verb(Verb::NextPoll, rc));
                        }
                    }
                }
                // One completion per batch: end this one, open the next.
                ffi::ibv_end_poll(cq);
                match ffi::ibv_start_poll(cq, &mut attr) {
                    0 => {}
                    libc::ENOENT => break,
                    rc => return Err(Error::verb(Verb::StartPoll, rc)),
                }
            }
            Ok(&mut out[..n])
        }
    }
}

/// Reads the current completion of an open batch.
///
/// # Safety
/// `cq` is a live extended CQ built with `wc_flags(fields)`, inside a batch whose
/// start_poll or next_poll returned 0.
unsafe fn read(cq: *mut ffi::ibv_cq_ex, fields: WcFields) -> ExtendedCompletion {
    // SAFETY: plain C data; all-zero is a valid value (what a field not read keeps).
    let mut wc: ffi::ibv_wc = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's contract. The standard fields were asked for (wc_flags), so
    // their readers are set; the others are read only when asked for.
    unsafe {
        wc.wr_id = (*cq).wr_id;
        wc.status = (*cq).status;
        wc.qp_num = ffi::ibv_wc_read_qp_num(cq);
        if wc.status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
            wc.vendor_err = ffi::ibv_wc_read_vendor_err(cq);
            return ExtendedCompletion { wc: WorkCompletion::from_raw(wc), ..ExtendedCompletion::EMPTY };
        }
        wc.opcode = ffi::ibv_wc_read_opcode(cq);
        wc.byte_len = ffi::ibv_wc_read_byte_len(cq);
        wc.wc_flags = ffi::ibv_wc_read_wc_flags(cq);
        let with = ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 | ffi::ibv_wc_flags::IBV_WC_WITH_INV.0;
        if wc.wc_flags & with != 0 {
            // The immediate and the invalidated rkey share the slot and the reader.
            wc.__bindgen_anon_1.imm_data = ffi::ibv_wc_read_imm_data(cq);
        }
        wc.src_qp = ffi::ibv_wc_read_src_qp(cq);
        // The SLID is 16 bits on the wire; the reader widens it.
        wc.slid = ffi::ibv_wc_read_slid(cq) as u16;
        wc.sl = ffi::ibv_wc_read_sl(cq);
        wc.dlid_path_bits = ffi::ibv_wc_read_dlid_path_bits(cq);
        let asked = |f: WcFields| fields.contains(f);
        ExtendedCompletion {
            wc: WorkCompletion::from_raw(wc),
            timestamp: asked(WcFields::COMPLETION_TIMESTAMP).then(|| ffi::ibv_wc_read_completion_ts(cq)),
            wallclock_ns: asked(WcFields::COMPLETION_TIMESTAMP_WALLCLOCK)
                .then(|| ffi::ibv_wc_read_completion_wallclock_ns(cq)),
            cvlan: asked(WcFields::CVLAN).then(|| ffi::ibv_wc_read_cvlan(cq)),
            flow_tag: asked(WcFields::FLOW_TAG).then(|| ffi::ibv_wc_read_flow_tag(cq)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_extended_cq_always_asks_for_the_standard_fields_and_adds_what_was_asked() {
        let std = u64::from(ffi::IBV_WC_STANDARD_FLAGS.0);
        assert_eq!(wc_flags(WcFields::empty()), std);
        let ts = wc_flags(WcFields::COMPLETION_TIMESTAMP);
        assert_eq!(ts & std, std);
        assert_ne!(ts & ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP.0 as u64, 0);
    }

    #[test]
    fn an_empty_extended_completion_is_no_completion_of_any_queue() {
        let c = ExtendedCompletion::EMPTY;
        assert_eq!(c.wr_id(), 0);
        assert_eq!((c.timestamp(), c.wallclock_ns(), c.cvlan(), c.flow_tag()), (None, None, None, None));
    }
}
