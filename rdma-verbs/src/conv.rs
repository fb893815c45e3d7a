//! Every return-code convention of libibverbs and librdmacm, turned into a `Result` in
//! one place (as rustix's `conv.rs` does). Sits right above [`crate::error`].

use std::ffi::c_int;
use std::ptr::NonNull;

use crate::error::{Error, Result, Verb};

/// 0 for success; -1 with `errno` set; or an errno (either sign). The control-plane
/// verbs and librdmacm use the first two, the destroy and modify verbs any of the three.
#[inline]
pub(crate) fn rc(verb: Verb, rc: c_int) -> Result<()> {
    match rc {
        0 => Ok(()),
        -1 => Err(Error::last_os(verb)),
        errno => Err(Error::verb(verb, errno.abs())),
    }
}

/// 0 for success, else the errno itself (either sign; providers differ): the posting verbs,
/// which must not read `errno` (the provider does not set it).
#[inline]
pub(crate) fn errno(verb: Verb, rc: c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::verb(verb, rc.abs()))
    }
}

/// A created object, or NULL with `errno` set.
#[inline]
pub(crate) fn ptr<T>(verb: Verb, p: *mut T) -> Result<NonNull<T>> {
    NonNull::new(p).ok_or_else(|| Error::last_os(verb))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_convention_keeps_the_errno() {
        assert!(rc(Verb::ModifyQp, 0).is_ok());
        assert_eq!(rc(Verb::ModifyQp, libc::EINVAL).unwrap_err().errno(), Some(libc::EINVAL));
        assert_eq!(rc(Verb::ModifyQp, -libc::EINVAL).unwrap_err().errno(), Some(libc::EINVAL));
        assert_eq!(errno(Verb::PostSend, -libc::ENOMEM).unwrap_err().errno(), Some(libc::ENOMEM));
        assert!(ptr::<u8>(Verb::AllocPd, std::ptr::null_mut()).is_err());
    }
}
