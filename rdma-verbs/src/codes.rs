//! C values decoded: how a work request ended ([`WcStatus`]), what it was ([`WcOpcode`]),
//! and a QP's transport ([`QpType`]). Below [`crate::error`], which names them.

use std::fmt;

use crate::c_enum::c_enum;
use crate::ffi;

c_enum! {
    /// How a work request ended (`enum ibv_wc_status`). [`Display`](fmt::Display) gives a
    /// short text, [`WcStatus::hint`] the usual cause.
    #[doc(alias = "ibv_wc_status")]
    WcStatus: u32 {
        /// The work request completed.
        Success = ffi::ibv_wc_status::IBV_WC_SUCCESS.0,
        /// Local length error.
        LocLenErr = ffi::ibv_wc_status::IBV_WC_LOC_LEN_ERR.0,
        /// Local QP operation error.
        LocQpOpErr = ffi::ibv_wc_status::IBV_WC_LOC_QP_OP_ERR.0,
        /// Local EE context operation error (RD only).
        LocEecOpErr = ffi::ibv_wc_status::IBV_WC_LOC_EEC_OP_ERR.0,
        /// Local protection error.
        LocProtErr = ffi::ibv_wc_status::IBV_WC_LOC_PROT_ERR.0,
        /// Flushed: the QP was in the error state, the request was not executed.
        WrFlushErr = ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR.0,
        /// Memory window bind error.
        MwBindErr = ffi::ibv_wc_status::IBV_WC_MW_BIND_ERR.0,
        /// Bad response from the peer.
        BadRespErr = ffi::ibv_wc_status::IBV_WC_BAD_RESP_ERR.0,
        /// Local access error.
        LocAccessErr = ffi::ibv_wc_status::IBV_WC_LOC_ACCESS_ERR.0,
        /// Remote invalid request error.
        RemInvReqErr = ffi::ibv_wc_status::IBV_WC_REM_INV_REQ_ERR.0,
        /// Remote access error.
        RemAccessErr = ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR.0,
        /// Remote operation error.
        RemOpErr = ffi::ibv_wc_status::IBV_WC_REM_OP_ERR.0,
        /// Transport retry counter exceeded.
        RetryExcErr = ffi::ibv_wc_status::IBV_WC_RETRY_EXC_ERR.0,
        /// Receiver-not-ready retry counter exceeded.
        RnrRetryExcErr = ffi::ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR.0,
        /// Local RDD violation (RD only).
        LocRddViolErr = ffi::ibv_wc_status::IBV_WC_LOC_RDD_VIOL_ERR.0,
        /// Remote invalid RD request (RD only).
        RemInvRdReqErr = ffi::ibv_wc_status::IBV_WC_REM_INV_RD_REQ_ERR.0,
        /// The peer aborted the operation.
        RemAbortErr = ffi::ibv_wc_status::IBV_WC_REM_ABORT_ERR.0,
        /// Invalid EE context number (RD only).
        InvEecnErr = ffi::ibv_wc_status::IBV_WC_INV_EECN_ERR.0,
        /// Invalid EE context state (RD only).
        InvEecStateErr = ffi::ibv_wc_status::IBV_WC_INV_EEC_STATE_ERR.0,
        /// Fatal device error.
        FatalErr = ffi::ibv_wc_status::IBV_WC_FATAL_ERR.0,
        /// Response timeout.
        RespTimeoutErr = ffi::ibv_wc_status::IBV_WC_RESP_TIMEOUT_ERR.0,
        /// General error.
        GeneralErr = ffi::ibv_wc_status::IBV_WC_GENERAL_ERR.0,
        /// Tag matching error.
        TmErr = ffi::ibv_wc_status::IBV_WC_TM_ERR.0,
        /// Tag matching rendezvous not completed.
        TmRndvIncomplete = ffi::ibv_wc_status::IBV_WC_TM_RNDV_INCOMPLETE.0,
    }
}

impl WcStatus {
    /// True for [`WcStatus::Success`].
    #[inline]
    pub fn is_success(self) -> bool {
        self == WcStatus::Success
    }

    /// The usual cause of this status, as operators meet it, when there is a usual one.
    pub fn hint(self) -> Option<&'static str> {
        Some(match self {
            WcStatus::LocLenErr => {
                "an incoming message was larger than the posted receive buffer, \
                 or a send was larger than the QP or path allows"
            }
            WcStatus::LocQpOpErr => {
                "the work request does not fit this QP: too many SGEs, inline data too large, \
                 or an opcode the QP type does not support; on rxe also a send while the port's \
                 link is down"
            }
            WcStatus::LocProtErr => {
                "an SGE is not covered by its lkey: wrong lkey, address range outside the MR, \
                 an MR of another PD, or a receive into an MR without local write access"
            }
            WcStatus::WrFlushErr => {
                "the QP is in the error state (an earlier request failed, or it is being torn down), \
                 so this request was never executed; look for the first completion that failed"
            }
            WcStatus::MwBindErr => "the memory window bind was refused: check the MR's bind access and the range",
            WcStatus::LocAccessErr => {
                "the data for an RDMA read or atomic result hit a local buffer without write access"
            }
            WcStatus::RemInvReqErr => {
                "the peer rejected the request: message larger than its receive buffer, \
                 or an operation its QP does not allow (check its access flags and max_rd_atomic)"
            }
            WcStatus::RemAccessErr => {
                "the peer refused the memory access: wrong rkey or remote address, range outside \
                 its MR, or the MR lacks the remote access this operation needs"
            }
            WcStatus::RemOpErr => "the peer could not complete the operation (its receive failed on its side)",
            WcStatus::RetryExcErr => {
                "the peer never acknowledged: it is down or unreachable, or the remote QPN, GID or \
                 path is wrong, or its QP is not in RTR/RTS"
            }
            WcStatus::RnrRetryExcErr => {
                "the peer had no receive posted for too long: post receives before the sender \
                 sends, or raise rnr_retry"
            }
            WcStatus::FatalErr => "the device or its driver hit a fatal error; the device may need a reset",
            WcStatus::GeneralErr => "the provider gave no detail: see vendor_err",
            _ => return None,
        })
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "flushed: the QP is in the error state",
            WcStatus::MwBindErr => "memory window bind error",
            WcStatus::BadRespErr => "bad response from the peer",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retries exhausted",
            WcStatus::RnrRetryExcErr => "receiver-not-ready retries exhausted",
            WcStatus::LocRddViolErr => "local RDD violation",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "remote abort",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout",
            WcStatus::GeneralErr => "general error",
            WcStatus::TmErr => "tag matching error",
            WcStatus::TmRndvIncomplete => "tag matching rendezvous incomplete",
            WcStatus::Unknown(v) => return write!(f, "unknown status {v}"),
        })
    }
}

c_enum! {
    /// What a completed work request was (`enum ibv_wc_opcode`). Send-side opcodes are
    /// below 128, receive-side ones (`Recv*`, tag matching) from 128 up.
    #[doc(alias = "ibv_wc_opcode")]
    WcOpcode: u32 {
        /// A send (with or without immediate data, or with invalidate).
        Send = ffi::ibv_wc_opcode::IBV_WC_SEND.0,
        /// An RDMA write (with or without immediate data).
        RdmaWrite = ffi::ibv_wc_opcode::IBV_WC_RDMA_WRITE.0,
        /// An RDMA read.
        RdmaRead = ffi::ibv_wc_opcode::IBV_WC_RDMA_READ.0,
        /// An atomic compare-and-swap.
        CompSwap = ffi::ibv_wc_opcode::IBV_WC_COMP_SWAP.0,
        /// An atomic fetch-and-add.
        FetchAdd = ffi::ibv_wc_opcode::IBV_WC_FETCH_ADD.0,
        /// A memory window bind.
        BindMw = ffi::ibv_wc_opcode::IBV_WC_BIND_MW.0,
        /// A local invalidate.
        LocalInv = ffi::ibv_wc_opcode::IBV_WC_LOCAL_INV.0,
        /// A TCP segmentation offload send (raw packet QPs).
        Tso = ffi::ibv_wc_opcode::IBV_WC_TSO.0,
        /// An atomic write.
        AtomicWrite = ffi::ibv_wc_opcode::IBV_WC_ATOMIC_WRITE.0,
        /// A receive consumed by an incoming send.
        Recv = ffi::ibv_wc_opcode::IBV_WC_RECV.0,
        /// A receive consumed by an incoming RDMA write with immediate data.
        RecvRdmaWithImm = ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM.0,
        /// Tag matching: a tag was added.
        TmAdd = ffi::ibv_wc_opcode::IBV_WC_TM_ADD.0,
        /// Tag matching: a tag was removed.
        TmDel = ffi::ibv_wc_opcode::IBV_WC_TM_DEL.0,
        /// Tag matching: a sync request.
        TmSync = ffi::ibv_wc_opcode::IBV_WC_TM_SYNC.0,
        /// Tag matching: a tagged receive.
        TmRecv = ffi::ibv_wc_opcode::IBV_WC_TM_RECV.0,
        /// Tag matching: a message that matched no tag.
        TmNoTag = ffi::ibv_wc_opcode::IBV_WC_TM_NO_TAG.0,
        /// Provider-specific opcode 1.
        Driver1 = ffi::ibv_wc_opcode::IBV_WC_DRIVER1.0,
        /// Provider-specific opcode 2.
        Driver2 = ffi::ibv_wc_opcode::IBV_WC_DRIVER2.0,
        /// Provider-specific opcode 3.
        Driver3 = ffi::ibv_wc_opcode::IBV_WC_DRIVER3.0,
    }
}

impl WcOpcode {
    /// True for completions of receive work requests (`IBV_WC_RECV` and up).
    #[inline]
    pub fn is_recv(self) -> bool {
        self.to_raw() & ffi::ibv_wc_opcode::IBV_WC_RECV.0 != 0
    }
}

impl fmt::Display for WcOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WcOpcode::Send => "SEND",
            WcOpcode::RdmaWrite => "RDMA WRITE",
            WcOpcode::RdmaRead => "RDMA READ",
            WcOpcode::CompSwap => "atomic compare-and-swap",
            WcOpcode::FetchAdd => "atomic fetch-and-add",
            WcOpcode::BindMw => "memory window bind",
            WcOpcode::LocalInv => "local invalidate",
            WcOpcode::Tso => "TSO send",
            WcOpcode::AtomicWrite => "atomic write",
            WcOpcode::Recv => "receive",
            WcOpcode::RecvRdmaWithImm => "receive (RDMA WRITE with immediate)",
            WcOpcode::TmAdd | WcOpcode::TmDel | WcOpcode::TmSync | WcOpcode::TmRecv | WcOpcode::TmNoTag => {
                "tag-matching operation"
            }
            WcOpcode::Driver1 | WcOpcode::Driver2 | WcOpcode::Driver3 => "provider-specific operation",
            WcOpcode::Unknown(v) => return write!(f, "unknown operation {v}"),
        })
    }
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
