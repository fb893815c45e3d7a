//! Work completions (`struct ibv_wc`): what [`CompletionQueue::poll`](crate::cq::CompletionQueue::poll)
//! hands back, one per finished work request. The guide is on [`WorkCompletion`], public,
//! where rustdoc shows it.

use std::fmt;

pub(crate) use crate::codes::{WcOpcode, WcStatus};
use crate::error::{Error, Result};
use crate::ffi;

bitflags::bitflags! {
    /// Flags of a work completion (`enum ibv_wc_flags`). Bits this crate does not name
    /// are kept, not dropped.
    #[doc(alias = "ibv_wc_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct WcFlags: u32 {
        /// A 40-byte GRH precedes the data in the receive buffer (UD).
        const GRH = ffi::ibv_wc_flags::IBV_WC_GRH.0;
        /// The message carried immediate data: see [`WorkCompletion::imm_data`].
        const WITH_IMM = ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0;
        /// The device checked the IP checksum of the packet and it was correct.
        const IP_CSUM_OK = ffi::ibv_wc_flags::IBV_WC_IP_CSUM_OK.0;
        /// The message invalidated a local rkey: see [`WorkCompletion::invalidated_rkey`].
        const WITH_INV = ffi::ibv_wc_flags::IBV_WC_WITH_INV.0;
        /// Tag matching: a sync request.
        const TM_SYNC_REQ = ffi::ibv_wc_flags::IBV_WC_TM_SYNC_REQ.0;
        /// Tag matching: the message matched a tag.
        const TM_MATCH = ffi::ibv_wc_flags::IBV_WC_TM_MATCH.0;
        /// Tag matching: the data is in the buffer.
        const TM_DATA_VALID = ffi::ibv_wc_flags::IBV_WC_TM_DATA_VALID.0;
        // Keep bits from newer providers.
        const _ = !0;
    }
}

/// One work completion, laid out as `struct ibv_wc` so that `&mut [WorkCompletion]` is the
/// array `ibv_poll_cq` fills.
///
/// Decoding happens in the accessors, only for the fields read. When the status is not
/// [`WcStatus::Success`], only [`wr_id`](Self::wr_id), [`status`](Self::status),
/// [`qp_num`](Self::qp_num) and [`vendor_err`](Self::vendor_err) are defined
/// (`man ibv_poll_cq`); providers differ in what the other fields hold then. A safe
/// queue's `complete` turns a completion into a [`Done`](crate::Done), whose
/// [`result`](crate::Done::result) names the operation, your id and the QP of a failure.
///
/// Neither `Copy` nor `Clone`, on purpose: a queue's `complete` hands a posted buffer back
/// on the word of a completion and then marks the completion taken, so there is never a
/// second copy of it to present again. Poll buffers start as [`WorkCompletion::EMPTY`].
#[doc(alias = "ibv_wc")]
#[repr(transparent)]
pub struct WorkCompletion(ffi::ibv_wc);

impl Default for WorkCompletion {
    /// All zero: a placeholder for a poll buffer, not a real completion.
    fn default() -> Self {
        Self::EMPTY
    }
}

impl WorkCompletion {
    /// A placeholder for a poll buffer (all zero: no queue takes it):
    /// `[WorkCompletion::EMPTY; 16]`.
    // SAFETY: ibv_wc is plain data; all-zero is a valid value.
    pub const EMPTY: WorkCompletion = WorkCompletion(unsafe { std::mem::zeroed() });

    /// Marks a completion as taken by a queue: its `wr_id` no longer names any request.
    #[inline]
    pub(crate) fn consume(&mut self) {
        self.0.wr_id = 0;
    }

    /// Wraps a raw completion.
    ///
    /// # Safety
    /// `wc` must be what the device reported and not yet handed to a queue's `complete`:
    /// the safe queues give a posted buffer back on the word of a completion, so a made-up
    /// one could return a buffer the device is still writing.
    #[inline]
    pub unsafe fn from_raw(wc: ffi::ibv_wc) -> Self {
        WorkCompletion(wc)
    }

    /// The raw completion.
    #[inline]
    pub fn as_raw(&self) -> &ffi::ibv_wc {
        &self.0
    }

    /// The `wr_id` of the work request this completes, as it was posted.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    /// How the work request ended.
    #[inline]
    pub fn status(&self) -> WcStatus {
        WcStatus::from_raw(self.0.status.0)
    }

    /// True when the work request completed without error.
    #[inline]
    pub fn is_success(&self) -> bool {
        self.0.status == ffi::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// Itself when the status is [`WcStatus::Success`], else an
    /// [`Error::WorkCompletion`] that names the status, the `wr_id` and the QP.
    #[inline]
    pub fn ok(&self) -> Result<&Self> {
        if self.is_success() {
            Ok(self)
        } else {
            Err(self.to_error())
        }
    }

    #[cold]
    fn to_error(&self) -> Error {
        Error::WorkCompletion {
            status: self.status(),
            op: None,
            id: None,
            wr_id: self.wr_id(),
            qp_num: self.qp_num(),
            vendor_err: self.vendor_err(),
        }
    }

    /// What the work request was. Defined only for successful completions: for failed
    /// ones the provider may leave anything here (rxe reports [`WcOpcode::Send`], the
    /// zero value, for a flushed receive).
    #[inline]
    pub fn opcode(&self) -> WcOpcode {
        WcOpcode::from_raw(self.0.opcode.0)
    }

    /// Bytes transferred: the received message length for receives, the result size for
    /// RDMA reads and atomics.
    #[inline]
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// The immediate data, in host byte order, when the message carried any.
    #[inline]
    pub fn imm_data(&self) -> Option<u32> {
        if self.0.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
            // SAFETY: both members of the union are a plain u32; WITH_IMM says which it is.
            Some(u32::from_be(unsafe { self.0.__bindgen_anon_1.imm_data }))
        } else {
            None
        }
    }

    /// The local rkey the message invalidated, when it was a send with invalidate.
    #[inline]
    pub fn invalidated_rkey(&self) -> Option<u32> {
        if self.0.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_INV.0 != 0 {
            // SAFETY: both members of the union are a plain u32; WITH_INV says which it is.
            Some(unsafe { self.0.__bindgen_anon_1.invalidated_rkey })
        } else {
            None
        }
    }

    /// The number of the local QP the work request was posted on.
    #[inline]
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }

    /// The source QP number of the message (UD receives).
    #[inline]
    pub fn src_qp(&self) -> u32 {
        self.0.src_qp
    }

    /// The completion's flags.
    #[inline]
    pub fn wc_flags(&self) -> WcFlags {
        WcFlags::from_bits_retain(self.0.wc_flags)
    }

    /// The P_Key index of the message (GSI QPs).
    #[inline]
    pub fn pkey_index(&self) -> u16 {
        self.0.pkey_index
    }

    /// The source LID of the message (UD receives on InfiniBand).
    #[inline]
    pub fn slid(&self) -> u16 {
        self.0.slid
    }

    /// The service level of the message (UD receives on InfiniBand).
    #[inline]
    pub fn sl(&self) -> u8 {
        self.0.sl
    }

    /// The source path bits of the message (UD receives on InfiniBand).
    #[inline]
    pub fn dlid_path_bits(&self) -> u8 {
        self.0.dlid_path_bits
    }

    /// The provider's own error code, for failed completions (0 when it gives none).
    #[inline]
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }
}

impl fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("WorkCompletion");
        d.field("wr_id", &self.wr_id())
            .field("status", &self.status())
            .field("qp_num", &format_args!("{:#x}", self.qp_num()));
        if !self.is_success() {
            // Only these fields are defined for a failed completion.
            return d.field("vendor_err", &self.vendor_err()).finish_non_exhaustive();
        }
        d.field("opcode", &self.opcode()).field("byte_len", &self.byte_len()).field("wc_flags", &self.wc_flags());
        if let Some(imm) = self.imm_data() {
            d.field("imm_data", &format_args!("{imm:#x}"));
        }
        if let Some(rkey) = self.invalidated_rkey() {
            d.field("invalidated_rkey", &format_args!("{rkey:#x}"));
        }
        d.field("src_qp", &format_args!("{:#x}", self.src_qp()))
            .field("pkey_index", &self.pkey_index())
            .field("slid", &self.slid())
            .field("sl", &self.sl())
            .field("dlid_path_bits", &self.dlid_path_bits())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(status: ffi::ibv_wc_status, flags: u32, imm_be: u32) -> WorkCompletion {
        let mut raw = ffi::ibv_wc { wr_id: 42, status, qp_num: 17, wc_flags: flags, ..Default::default() };
        raw.__bindgen_anon_1.imm_data = imm_be;
        // SAFETY: a unit test of the accessors; no queue sees it.
        unsafe { WorkCompletion::from_raw(raw) }
    }

    #[test]
    fn layout_is_ibv_wc() {
        assert_eq!(std::mem::size_of::<WorkCompletion>(), std::mem::size_of::<ffi::ibv_wc>());
        assert_eq!(std::mem::align_of::<WorkCompletion>(), std::mem::align_of::<ffi::ibv_wc>());
    }

    #[test]
    fn imm_data_is_host_order_and_only_with_the_flag() {
        let with = wc(ffi::ibv_wc_status::IBV_WC_SUCCESS, ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0, 0x1234_5678u32.to_be());
        assert_eq!(with.imm_data(), Some(0x1234_5678));
        assert_eq!(with.invalidated_rkey(), None);
        let without = wc(ffi::ibv_wc_status::IBV_WC_SUCCESS, 0, 0x1234_5678u32.to_be());
        assert_eq!(without.imm_data(), None);
    }

    #[test]
    fn unknown_status_opcode_and_flags_are_kept() {
        assert_eq!(WcStatus::from_raw(999), WcStatus::Unknown(999));
        assert_eq!(WcStatus::from_raw(999).to_string(), "unknown status 999");
        assert_eq!(WcOpcode::from_raw(77), WcOpcode::Unknown(77));
        let flags = WcFlags::from_bits_retain(0x8000_0001);
        assert!(flags.contains(WcFlags::GRH));
        assert_eq!(flags.bits(), 0x8000_0001);
    }

    #[test]
    fn every_status_round_trips_and_has_text() {
        for v in 0..=23 {
            let s = WcStatus::from_raw(v);
            assert!(!matches!(s, WcStatus::Unknown(_)), "status {v} has no name");
            assert_eq!(s.to_raw(), v);
            assert!(!s.to_string().is_empty());
        }
        assert_eq!(WcStatus::RemAccessErr.to_string(), "remote access error");
    }

    #[test]
    fn ok_turns_a_failed_status_into_a_data_plane_error() {
        let good = wc(ffi::ibv_wc_status::IBV_WC_SUCCESS, 0, 0);
        assert_eq!(good.ok().unwrap().wr_id(), 42);
        let e = wc(ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR, 0, 0).ok().unwrap_err();
        let text = e.to_string();
        assert!(text.contains("remote access error"), "{text}");
        assert!(text.contains("wr_id 0x2a"), "{text}");
        assert!(text.contains("data plane"), "{text}");
        assert!(text.contains("rkey"), "{text}");
        assert_eq!(e.plane(), Some(crate::Plane::Data));
        assert!(matches!(e, Error::WorkCompletion { status: WcStatus::RemAccessErr, wr_id: 42, qp_num: 17, .. }));
    }

    #[test]
    fn recv_opcodes_are_recognised() {
        assert!(WcOpcode::Recv.is_recv());
        assert!(WcOpcode::RecvRdmaWithImm.is_recv());
        assert!(!WcOpcode::RdmaWrite.is_recv());
        assert!(!WcOpcode::Send.is_recv());
    }

    #[test]
    fn debug_of_a_failed_completion_shows_only_defined_fields() {
        let text = format!("{:?}", wc(ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR, 0, 0));
        assert!(text.contains("WrFlushErr") && text.contains("wr_id: 42"), "{text}");
        assert!(!text.contains("opcode"), "{text}");
    }
}
