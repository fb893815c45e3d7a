//! Re-registration (`ibv_rereg_mr`): new access flags, or a new buffer, for a region that
//! keeps its C object.
//!
//! Both methods take the region by value. A region cut into chunks
//! ([`MemoryRegion::into_chunks`]) was moved behind its chunks and can never be named
//! again, and a region with a borrowed view (a slice, an `&AtomicU64`) cannot be moved:
//! the compiler refuses a rereg under chunks or under a borrow (tests/ui/mr_rereg_*.rs).

use super::*;
use std::fmt;

/// A re-registration that failed: the error, and the region when the C library says it is
/// still the one it was (as std's `TrySendError` hands back the value).
///
/// `region` is `Some` when the refusal came before C ([`Verb::MrRereg`]), when
/// `ibv_rereg_mr` reported `IBV_REREG_MR_ERR_INPUT` / `IBV_REREG_MR_ERR_DONT_FORK_NEW`
/// ("old MR is valid"), or when the kernel refused the command as not implemented
/// (`EOPNOTSUPP`: rxe of Linux 6.1, which then gives [`Error::NotSupported`] naming
/// [`Verb::ReregMr`]). For its other failures the man page says the region must not be
/// used: it is deregistered then, its buffers freed (or leaked if deregistration fails),
/// and `region` is `None`.
pub struct ReregError<B: RegisterableBuffer, A: AccessMode = Local> {
    /// Why.
    pub error: Error,
    /// The region as it was, when it still is.
    pub region: Option<MemoryRegion<B, A>>,
}

impl<B: RegisterableBuffer, A: AccessMode> fmt::Debug for ReregError<B, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReregError").field("error", &self.error).field("region", &self.region).finish()
    }
}

impl<B: RegisterableBuffer, A: AccessMode> fmt::Display for ReregError<B, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.region {
            Some(_) => write!(f, "{} (the region is unchanged)", self.error),
            None => write!(f, "{} (the region was deregistered)", self.error),
        }
    }
}

impl<B: RegisterableBuffer, A: AccessMode> std::error::Error for ReregError<B, A> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<B: RegisterableBuffer, A: AccessMode> From<ReregError<B, A>> for Error {
    fn from(e: ReregError<B, A>) -> Error {
        e.error
    }
}

/// A check of ours, made on `ibv_reg_mr`'s behalf, renamed as the rereg method's.
fn as_rereg(e: Error) -> Error {
    match e {
        Error::InvalidArgument { what, .. } => Error::InvalidArgument { verb: Verb::MrRereg, what },
        Error::NotSupported { capability, errno, .. } => Error::NotSupported { verb: Verb::MrRereg, capability, errno },
        e => e,
    }
}

/// What `ibv_rereg_mr`'s return code says of the old region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReregOutcome {
    Done,
    /// The old registration still stands.
    OldValid,
    /// The region must not be used: deregister it.
    Unusable,
}

///
/// `IBV_REREG_MR_ERR_CMD` with `EOPNOTSUPP` or `ENOSYS` counts as "old MR valid": the
/// kernel refuses a command its driver does not implement (rxe of Linux 6.1 has no
/// `rereg_user_mr`) before looking at the region, so nothing changed.
pub(super) fn outcome(rc: std::ffi::c_int, errno: i32) -> ReregOutcome {
    use ffi::ibv_rereg_mr_err_code as E;
    match rc {
        0 => ReregOutcome::Done,
        rc if rc == E::IBV_REREG_MR_ERR_INPUT.0 || rc == E::IBV_REREG_MR_ERR_DONT_FORK_NEW.0 => ReregOutcome::OldValid,
        rc if rc == E::IBV_REREG_MR_ERR_CMD.0 && matches!(errno, libc::EOPNOTSUPP | libc::ENOSYS) => {
            ReregOutcome::OldValid
        }
        _ => ReregOutcome::Unusable,
    }
}

impl<B: RegisterableBuffer, A: AccessMode> MemoryRegion<B, A> {
    /// Re-registers the same memory with new access flags (`ibv_rereg_mr` with
    /// `IBV_REREG_MR_CHANGE_ACCESS`), as mode `A2`: `Local` -> [`RemoteWritable`] to let
    /// peers write from now on, or back.
    ///
    /// What it promises:
    /// - Taking `self` by value, it cannot run under chunks cut from the region (they took
    ///   it for good) or under a borrow of its bytes: the compiler refuses both.
    /// - `access` is checked for `A2` as [`ProtectionDomain::register`] and
    ///   [`register_remote_writable`](ProtectionDomain::register_remote_writable) check it
    ///   (with `LOCAL_WRITE` added for remote write and atomics), refused before C as
    ///   [`Error::InvalidArgument`] naming [`Verb::MrRereg`]; `ON_DEMAND` is checked against
    ///   the device's `odp_caps` as [`register_on_demand`](ProtectionDomain::register_on_demand) does.
    /// - On success the region reports the keys the provider holds now: a provider may
    ///   issue new ones (mlx5 keeps the old ones where it can), and peers must be sent the new
    ///   [`remote`](MemoryRegion::remote) descriptor; requests carrying the old rkey fail.
    /// - On failure, see [`ReregError`]: the region comes back when the C library says it
    ///   is unchanged. rxe of Linux 6.1 has no rereg: [`Error::NotSupported`] naming
    ///   [`Verb::ReregMr`] and `EOPNOTSUPP`, with the region handed back as it was.
    #[doc(alias = "ibv_rereg_mr")]
    pub fn rereg_access<A2: AccessMode>(
        self,
        access: AccessFlags,
    ) -> std::result::Result<MemoryRegion<B, A2>, ReregError<B, A>> {
        let access = match effective_access::<A2>(access)
            .and_then(|a| super::odp::check_access(&self.pd, a).map(|()| a))
            .map_err(as_rereg)
        {
            Ok(a) => a,
            Err(error) => return Err(ReregError { error, region: Some(self) }),
        };
        let flags = ffi::ibv_rereg_mr_flags::IBV_REREG_MR_CHANGE_ACCESS.0 as std::ffi::c_int;
        // SAFETY: the region is live and owned here; with CHANGE_ACCESS alone the
        // pd, address and length arguments are ignored.
        let rc = unsafe {
            ffi::ibv_rereg_mr(self.raw.as_ptr(), flags, ptr::null_mut(), ptr::null_mut(), 0, access.bits() as _)
        };
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
        match outcome(rc, errno) {
            ReregOutcome::Done => Ok(self.reassembled(access)),
            ReregOutcome::OldValid => Err(ReregError { error: rereg_error(errno), region: Some(self) }),
            ReregOutcome::Unusable => {
                drop(self);
                Err(ReregError { error: rereg_error(errno), region: None })
            }
        }
    }

    /// Re-registers the region over a new buffer with new access flags (`ibv_rereg_mr`
    /// with `IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS`), and gives the
    /// old buffer back with its contents: the device no longer reaches it.
    ///
    /// The same promises as [`rereg_access`](Self::rereg_access); the new buffer is
    /// checked as registration checks one (not empty, within the device's `max_mr_size`)
    /// and, as registration does, dropped on failure.
    #[doc(alias = "ibv_rereg_mr")]
    pub fn rereg_buffer<B2: RegisterableBuffer, A2: AccessMode>(
        self,
        buf: B2,
        access: AccessFlags,
    ) -> std::result::Result<(MemoryRegion<B2, A2>, B), ReregError<B, A>> {
        let (ptr2, len2, parts2) = buf.disassemble();
        let checked = effective_access::<A2>(access)
            .and_then(|a| super::odp::check_access(&self.pd, a).map(|()| a))
            .and_then(|a| {
                if len2 == 0 {
                    return Err(Error::invalid(Verb::MrRereg, "a memory region cannot be empty (length 0)"));
                }
                check_len(len2, self.pd.context().query_device()?.max_mr_size).map(|()| a)
            })
            .map_err(as_rereg);
        let access = match checked {
            Ok(a) => a,
            Err(error) => {
                // SAFETY: the parts just taken from `buf`, given back once; the device
                // never saw the memory.
                drop(unsafe { B2::reassemble(ptr2, len2, parts2) });
                return Err(ReregError { error, region: Some(self) });
            }
        };
        let flags = (ffi::ibv_rereg_mr_flags::IBV_REREG_MR_CHANGE_TRANSLATION.0
            | ffi::ibv_rereg_mr_flags::IBV_REREG_MR_CHANGE_ACCESS.0) as std::ffi::c_int;
        // SAFETY: the region is live and owned here; `ptr2` addresses `len2` bytes that
        // stay allocated and are reached only through the region from now on (the
        // RegisterableBuffer contract), as for ibv_reg_mr.
        let rc = unsafe {
            ffi::ibv_rereg_mr(self.raw.as_ptr(), flags, ptr::null_mut(), ptr2.as_ptr().cast(), len2, access.bits() as _)
        };
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
        match outcome(rc, errno) {
            ReregOutcome::Done => {
                let mut me = ManuallyDrop::new(self);
                // SAFETY: `me` is never dropped: each field is taken out once.
                let (raw, pd, parts) =
                    unsafe { (ManuallyDrop::take(&mut me.raw), ptr::read(&me.pd), ManuallyDrop::take(&mut me.parts)) };
                // SAFETY: the region now covers the new buffer only, so the device no
                // longer reaches the old one: its parts, given back once.
                let old = unsafe { B::reassemble(me.ptr, me.len, parts) };
                // SAFETY: the live region ibv_rereg_mr just updated.
                let (lkey, rkey) = unsafe { ((*raw.as_ptr()).lkey, (*raw.as_ptr()).rkey) };
                let region = MemoryRegion {
                    raw: ManuallyDrop::new(raw),
                    pd,
                    ptr: ptr2,
                    len: len2,
                    parts: ManuallyDrop::new(parts2),
                    lkey,
                    rkey,
                    // ibv_rereg_mr gives the new buffer its own address as I/O address.
                    iova: ptr2.as_ptr() as u64,
                    access,
                    _buf: PhantomData,
                };
                Ok((region, old))
            }
            ReregOutcome::OldValid => {
                // SAFETY: the old registration stands; the device never got the new buffer.
                drop(unsafe { B2::reassemble(ptr2, len2, parts2) });
                Err(ReregError { error: rereg_error(errno), region: Some(self) })
            }
            ReregOutcome::Unusable => {
                // The region may cover either buffer: deregister it, then free both, or
                // leak both if that fails.
                let len = self.len;
                match self.destroy() {
                    Ok(old) => {
                        drop(old);
                        // SAFETY: deregistered: the device reaches neither buffer.
                        drop(unsafe { B2::reassemble(ptr2, len2, parts2) });
                    }
                    Err(e) => {
                        log::error!("{e}; leaking the {len}- and {len2}-byte buffers, which the device may still use")
                    }
                }
                Err(ReregError { error: rereg_error(errno), region: None })
            }
        }
    }

    /// `self` with the keys the provider holds now and `access`, as mode `A2`.
    fn reassembled<A2: AccessMode>(self, access: AccessFlags) -> MemoryRegion<B, A2> {
        let mut me = ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped: each field is taken out once.
        let (raw, pd, parts) =
            unsafe { (ManuallyDrop::take(&mut me.raw), ptr::read(&me.pd), ManuallyDrop::take(&mut me.parts)) };
        // SAFETY: the live region ibv_rereg_mr just updated.
        let (lkey, rkey) = unsafe { ((*raw.as_ptr()).lkey, (*raw.as_ptr()).rkey) };
        MemoryRegion {
            raw: ManuallyDrop::new(raw),
            pd,
            ptr: me.ptr,
            len: me.len,
            parts: ManuallyDrop::new(parts),
            lkey,
            rkey,
            iova: me.iova,
            access,
            _buf: PhantomData,
        }
    }
}

fn rereg_error(errno: i32) -> Error {
    Error::verb_or_not_supported(Verb::ReregMr, errno, "re-registration: the provider has no rereg_mr")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rereg_return_codes_say_whether_the_old_region_stands() {
        use ffi::ibv_rereg_mr_err_code as E;
        let inval = libc::EINVAL;
        assert_eq!(outcome(0, 0), ReregOutcome::Done);
        assert_eq!(outcome(E::IBV_REREG_MR_ERR_INPUT.0, inval), ReregOutcome::OldValid);
        assert_eq!(outcome(E::IBV_REREG_MR_ERR_DONT_FORK_NEW.0, inval), ReregOutcome::OldValid);
        assert_eq!(outcome(E::IBV_REREG_MR_ERR_DO_FORK_OLD.0, inval), ReregOutcome::Unusable);
        assert_eq!(outcome(E::IBV_REREG_MR_ERR_CMD.0, inval), ReregOutcome::Unusable);
        assert_eq!(outcome(E::IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW.0, inval), ReregOutcome::Unusable);
        // A command the driver does not implement never touched the region.
        assert_eq!(outcome(E::IBV_REREG_MR_ERR_CMD.0, libc::EOPNOTSUPP), ReregOutcome::OldValid);
    }

    #[test]
    fn checks_made_for_registration_are_renamed_as_the_rereg_method() {
        let e = as_rereg(effective_access::<Local>(AccessFlags::REMOTE_WRITE).unwrap_err());
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::MrRereg, .. }), "{e}");
        assert!(e.to_string().starts_with("MemoryRegion::rereg"), "{e}");
        let e = as_rereg(check_len(10, 4).unwrap_err());
        assert!(e.to_string().contains("max_mr_size 4"), "{e}");
    }

    #[test]
    fn rereg_errors_name_the_c_call_and_enotsupp_becomes_not_supported() {
        assert!(matches!(rereg_error(libc::EOPNOTSUPP), Error::NotSupported { verb: Verb::ReregMr, .. }));
        assert!(matches!(rereg_error(libc::EINVAL), Error::Verb { verb: Verb::ReregMr, .. }));
    }
}
