//! XRC domains (`struct ibv_xrcd`): the scope in which XRC receive QPs and XRC SRQs of
//! several processes share receive queues.

use std::ffi::c_int;
use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::caps::device_attr_ex;
use crate::context::Context;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::{Owned, RawObject};

impl RawObject for ffi::ibv_xrcd {
    const DESTROY: Verb = Verb::CloseXrcd;
    unsafe fn destroy(raw: *mut Self) -> c_int {
        // SAFETY: forwarded from the caller's contract.
        unsafe { ffi::ibv_close_xrcd(raw) }
    }
}

/// An XRC domain (`ibv_open_xrcd`). Closed on drop (`ibv_close_xrcd`), before the context
/// it holds is released.
///
/// What it promises: [`open`](XrcDomain::open) checks the device's `device_cap_flags` for
/// `IBV_DEVICE_XRC` first, and a device without it (rxe) gives [`Error::NotSupported`]
/// naming [`Verb::XrcDomainOpen`] and that bit, before any C call; `oflags` other than
/// `O_CREAT` / `O_EXCL`, or no file without `O_CREAT`, are [`Error::InvalidArgument`]
/// before C, as ibv_open_xrcd(3) requires.
pub struct XrcDomain {
    raw: Owned<ffi::ibv_xrcd>,
    ctx: Context,
}

// SAFETY: the XRCD is a kernel object reached through a pointer libibverbs lets any thread
// use and close; the context is Send and Sync.
unsafe impl Send for XrcDomain {}
// SAFETY: &XrcDomain gives only the raw pointer and the context.
unsafe impl Sync for XrcDomain {}

/// Why a device with `device_cap_flags` cannot open an XRC domain, or `None`.
fn xrc_refusal(device_cap_flags: u32) -> Option<&'static str> {
    let xrc = ffi::ibv_device_cap_flags::IBV_DEVICE_XRC.0;
    (device_cap_flags & xrc == 0)
        .then_some("XRC: the device's device_cap_flags lack IBV_DEVICE_XRC (ibv_query_device_ex)")
}

/// The checks of ibv_open_xrcd(3) on `fd` (whether there is one) and `oflags`.
fn check_open(has_file: bool, oflags: c_int) -> Result<()> {
    let known = libc::O_CREAT | libc::O_EXCL;
    if oflags & !known != 0 {
        return Err(Error::invalid(
            Verb::XrcDomainOpen,
            format!("oflags {oflags:#o} has bits other than O_CREAT and O_EXCL"),
        ));
    }
    if !has_file && oflags & libc::O_CREAT == 0 {
        return Err(Error::invalid(
            Verb::XrcDomainOpen,
            "without a file the XRC domain is private and must be created: pass O_CREAT",
        ));
    }
    if oflags & libc::O_EXCL != 0 && oflags & libc::O_CREAT == 0 {
        return Err(Error::invalid(Verb::XrcDomainOpen, "O_EXCL means something only with O_CREAT"));
    }
    Ok(())
}

impl XrcDomain {
    /// Opens (or creates) an XRC domain (`ibv_open_xrcd`). With `file`, processes that
    /// open the same file share the domain (`O_CREAT` creates it if needed, with
    /// `O_EXCL` only if it does not exist yet); without one, the domain is private to this
    /// context and `oflags` must hold `O_CREAT`.
    #[doc(alias = "ibv_open_xrcd")]
    pub fn open(ctx: &Context, file: Option<BorrowedFd<'_>>, oflags: c_int) -> Result<XrcDomain> {
        check_open(file.is_some(), oflags)?;
        let flags = device_attr_ex(ctx)?.orig_attr.device_cap_flags;
        if let Some(why) = xrc_refusal(flags) {
            return Err(Error::not_supported(Verb::XrcDomainOpen, why));
        }
        use ffi::ibv_xrcd_init_attr_mask as M;
        let mut attr = ffi::ibv_xrcd_init_attr {
            comp_mask: M::IBV_XRCD_INIT_ATTR_FD.0 | M::IBV_XRCD_INIT_ATTR_OFLAGS.0,
            fd: file.map_or(-1, |f| f.as_raw_fd()),
            oflags,
        };
        // SAFETY: the context is open and `attr` is a valid, readable attribute set; the
        // file, if any, is open for the duration of the call.
        let raw = unsafe { ffi::ibv_open_xrcd(ctx.as_raw(), &mut attr) };
        if raw.is_null() {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
            return Err(Error::verb_or_not_supported(Verb::OpenXrcd, errno, "XRC: the provider has no open_xrcd"));
        }
        // SAFETY: a new XRCD that only this Owned closes.
        let raw = unsafe { Owned::new(raw, Verb::OpenXrcd)? };
        Ok(XrcDomain { raw, ctx: ctx.clone() })
    }

    /// The context the domain belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The raw domain, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_xrcd {
        self.raw.as_ptr()
    }

    /// Closes the domain now (`ibv_close_xrcd`) and reports the result.
    #[doc(alias = "ibv_close_xrcd")]
    pub fn close(self) -> Result<()> {
        self.raw.destroy()
    }
}

impl fmt::Debug for XrcDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XrcDomain").field("raw", &self.raw.as_ptr()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_flags_are_checked_as_the_man_page_says() {
        assert!(check_open(false, libc::O_CREAT).is_ok());
        assert!(check_open(true, 0).is_ok());
        assert!(check_open(true, libc::O_CREAT | libc::O_EXCL).is_ok());
        let e = check_open(false, 0).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::XrcDomainOpen, .. }), "{e}");
        assert!(e.to_string().contains("O_CREAT"), "{e}");
        assert!(check_open(true, libc::O_RDWR | libc::O_CREAT).is_err());
        assert!(check_open(true, libc::O_EXCL).is_err());
    }

    #[test]
    fn a_device_without_the_xrc_bit_is_refused_naming_it() {
        assert!(xrc_refusal(0).unwrap().contains("IBV_DEVICE_XRC"));
        assert_eq!(xrc_refusal(ffi::ibv_device_cap_flags::IBV_DEVICE_XRC.0), None);
    }
}
