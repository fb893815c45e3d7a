//! One error type for the whole crate.
//!
//! Every error names the verb that failed. Errors from C carry the errno as a
//! [`std::io::Error`], say which plane of the RDMA stack they came from, and, where the
//! usual cause is known, give a one-line hint.

use std::borrow::Cow;
use std::fmt;
use std::io;
use std::time::Duration;

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which path through the RDMA stack a verb takes: the first question when it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plane {
    /// Opening devices, creating and modifying objects, connecting: libibverbs, then a
    /// system call into the kernel (ib_uverbs, the driver, possibly the firmware).
    Control,
    /// Posting work requests and polling completions: the user-space provider
    /// (libmlx5, librxe, ...) and the hardware queues, with no kernel in between.
    Data,
}

impl fmt::Display for Plane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Plane::Control => "control plane: libibverbs -> kernel driver",
            Plane::Data => "data plane: user-space provider -> hardware queues",
        })
    }
}

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A verb returned an error.
    #[error("{verb} failed ({plane}): {source}{}", Hint(.hint))]
    Verb {
        /// The C function that failed, e.g. `ibv_reg_mr`.
        verb: &'static str,
        /// Which path through the stack the verb took.
        plane: Plane,
        /// The errno the verb reported.
        #[source]
        source: io::Error,
        /// The usual cause, when it is known.
        hint: Option<Cow<'static, str>>,
    },
    /// An argument was rejected before any C code ran.
    #[error("{verb}: invalid argument: {what}")]
    InvalidArgument {
        /// The verb the argument was meant for.
        verb: &'static str,
        /// What is wrong with it.
        what: Cow<'static, str>,
    },
    /// The host has no RDMA device at all.
    #[error(
        "no RDMA device found (is an RDMA kernel driver loaded? for SoftRoCE: \
         `modprobe rdma_rxe; rdma link add rxe0 type rxe netdev IFACE`)"
    )]
    NoDevice,
    /// No device has the requested name.
    #[error("no RDMA device named {name:?}; available: {available}")]
    UnknownDevice {
        /// The name asked for.
        name: String,
        /// The names that exist, comma separated.
        available: String,
    },
    /// A RoCE port has no usable RoCE v2 GID.
    #[error(
        "{device} port {port}: no RoCE v2 GID with an IPv4 address \
         (the netdev under the device has no IPv4 address, or is down)"
    )]
    NoRoceV2Gid {
        /// The device name.
        device: String,
        /// The port number.
        port: u8,
    },
    /// A work request completed with an error status (see
    /// [`WorkCompletion::ok`](crate::wc::WorkCompletion::ok)). A data-plane failure: the
    /// provider and the hardware (or the peer) ended the request, no errno is involved.
    #[error(
        "work request wr_id {wr_id} on QP {qp_num} failed: {status} (vendor_err {vendor_err:#x}; {plane}){}",
        Hint(&.status.hint().map(Cow::Borrowed)),
        plane = Plane::Data
    )]
    WorkCompletion {
        /// The completion status.
        status: crate::wc::WcStatus,
        /// The `wr_id` of the failed work request.
        wr_id: u64,
        /// The local QP number.
        qp_num: u32,
        /// The provider's own error code (0 when it gives none).
        vendor_err: u32,
    },
    /// The peer's side refused a connection (rdma_cm's REJECTED event): the application
    /// rejected it, or nothing listens on that port.
    #[error("{verb}: connection rejected (reject reason {status}: {reason})")]
    Rejected {
        /// The call that asked for the connection, e.g. `rdma_connect`.
        verb: &'static str,
        /// The transport's reason code: on InfiniBand and RoCE the IB CM reject reason
        /// (see [`RejectReason`](crate::cm::RejectReason)), on iWARP a negative errno.
        status: i32,
        /// The reason in words.
        reason: Cow<'static, str>,
        /// What the peer sent with its rejection (InfiniBand and RoCE pad it with zeros).
        private_data: Vec<u8>,
    },
    /// A wait ran out of time.
    #[error("{verb}: timed out after {timeout:?}")]
    Timeout {
        /// What was being waited for.
        verb: &'static str,
        /// How long we waited.
        timeout: Duration,
    },
    /// The byte stream of an endpoint exchange failed: an I/O error, or the peer closed
    /// it (see [`endpoint`](crate::endpoint)).
    #[error("{what}: {source}")]
    Io {
        /// What was being done, e.g. "reading the peer's endpoint".
        what: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A peer's message was malformed, described an endpoint this side cannot connect
    /// to, or said that the peer gave up (see [`endpoint`](crate::endpoint)).
    #[error("{what}: {source}")]
    Wire {
        /// What was being done, e.g. "reading the peer's endpoint".
        what: &'static str,
        /// What is wrong.
        #[source]
        source: crate::endpoint::WireError,
    },
}

struct Hint<'a>(&'a Option<Cow<'static, str>>);

impl fmt::Display for Hint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(h) => write!(f, "; hint: {h}"),
            None => Ok(()),
        }
    }
}

impl Error {
    /// An error from a verb that reported `errno`, with the usual hint for that pair.
    pub fn verb(verb: &'static str, plane: Plane, errno: i32) -> Self {
        Error::Verb {
            verb,
            plane,
            source: io::Error::from_raw_os_error(errno),
            hint: known_hint(verb, errno).map(Cow::Borrowed),
        }
    }

    /// An error from a verb that signalled failure and left the cause in `errno`.
    pub fn last_os(verb: &'static str, plane: Plane) -> Self {
        let errno = io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
        // Some verbs fail without setting errno; 0 would print as "Success".
        Self::verb(verb, plane, if errno == 0 { libc::EIO } else { errno })
    }

    /// Replaces the hint (for callers that know more than the errno says).
    pub fn with_hint(mut self, text: impl Into<Cow<'static, str>>) -> Self {
        if let Error::Verb { hint, .. } = &mut self {
            *hint = Some(text.into());
        }
        self
    }

    /// An argument rejected before calling C.
    pub fn invalid(verb: &'static str, what: impl Into<Cow<'static, str>>) -> Self {
        Error::InvalidArgument { verb, what: what.into() }
    }

    /// The errno, for errors that came from C.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Verb { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// The plane a failed verb belongs to, for errors that came from C.
    pub fn plane(&self) -> Option<Plane> {
        match self {
            Error::Verb { plane, .. } => Some(*plane),
            Error::WorkCompletion { .. } => Some(Plane::Data),
            _ => None,
        }
    }

    /// The verb this error is about, when there is one.
    pub fn verb_name(&self) -> Option<&'static str> {
        match self {
            Error::Verb { verb, .. }
            | Error::InvalidArgument { verb, .. }
            | Error::Timeout { verb, .. }
            | Error::Rejected { verb, .. } => Some(verb),
            Error::WorkCompletion { .. } => Some("ibv_poll_cq"),
            _ => None,
        }
    }
}

/// The usual causes of an errno from a verb, as operators meet them.
fn known_hint(verb: &str, errno: i32) -> Option<&'static str> {
    Some(match (verb, errno) {
        ("ibv_reg_mr" | "ibv_reg_mr_iova2", libc::ENOMEM | libc::EAGAIN) => {
            "the locked-memory limit is too low for this registration: raise `ulimit -l` \
             (memlock in /etc/security/limits.conf, LimitMEMLOCK= for systemd services)"
        }
        ("ibv_reg_mr" | "ibv_reg_mr_iova2", libc::EFAULT) => "the buffer is not mapped memory of this process",
        ("ibv_reg_mr" | "ibv_reg_mr_iova2", libc::EINVAL) => {
            "remote write or atomic access also needs local write access, or the device refuses these flags"
        }
        ("ibv_open_device", libc::EACCES | libc::EPERM) => {
            "no permission on /dev/infiniband/uverbs*: add the user to the rdma group or fix the udev rules"
        }
        ("ibv_open_device", libc::ENOSYS | libc::EOPNOTSUPP) => {
            "no user-space provider for this device: install the provider library (ibverbs-providers / rdma-core)"
        }
        ("ibv_modify_qp", libc::EINVAL) => {
            "an attribute is missing or not allowed for this state transition (RESET->INIT->RTR->RTS)"
        }
        ("ibv_post_send" | "ibv_post_recv" | "ibv_post_srq_recv", libc::ENOMEM) => {
            "the queue is full: poll completions before posting more"
        }
        ("ibv_post_send" | "ibv_post_recv" | "ibv_post_srq_recv", libc::EINVAL) => {
            "the work request is malformed for this QP (too many SGEs, inline data too large, or wrong QP state)"
        }
        (_, libc::ENOMEM) => {
            "the device or the kernel ran out of resources: check the device limits (max_qp, max_cqe, ...)"
        }
        (_, libc::EOPNOTSUPP | libc::ENOSYS) => "the provider or the kernel does not support this operation",
        (_, libc::ETIMEDOUT) => "the peer did not answer: check the link, the GID and the remote QP state",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reg_mr_enomem_names_the_verb_the_plane_and_memlock() {
        let e = Error::verb("ibv_reg_mr", Plane::Control, libc::ENOMEM);
        let text = e.to_string();
        assert!(text.starts_with("ibv_reg_mr failed (control plane"), "{text}");
        assert!(text.contains("ulimit -l"), "{text}");
        assert_eq!(e.errno(), Some(libc::ENOMEM));
        assert_eq!(e.plane(), Some(Plane::Control));
    }

    #[test]
    fn post_send_error_is_data_plane() {
        let e = Error::verb("ibv_post_send", Plane::Data, libc::EINVAL);
        assert!(e.to_string().contains("data plane"), "{e}");
        assert!(e.to_string().contains("malformed"), "{e}");
    }

    #[test]
    fn unknown_errno_has_no_hint() {
        let e = Error::verb("ibv_alloc_pd", Plane::Control, libc::EXDEV);
        assert!(!e.to_string().contains("hint"), "{e}");
    }
}
