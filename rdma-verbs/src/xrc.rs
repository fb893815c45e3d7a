//! XRC domains (`struct ibv_xrcd`): the scope in which XRC receive QPs and XRC SRQs of
//! several processes share receive queues.

use std::ffi::c_int;
use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Arc;

use crate::caps::device_attr_ex;
use crate::context::Context;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::{destroy_shared, Owned, RawObject};

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
///
/// A clone is another handle to the same domain: the XRC SRQs
/// ([`SharedReceiveQueue::xrc`](crate::SharedReceiveQueue::xrc)) and the receive QPs
/// opened in it ([`open_qp`](XrcDomain::open_qp)) hold one, so the domain is closed after
/// the last of them.
#[derive(Clone)]
pub struct XrcDomain {
    inner: Arc<XrcdInner>,
}

struct XrcdInner {
    raw: Owned<ffi::ibv_xrcd>,
    ctx: Context,
}

// SAFETY: the XRCD is a kernel object reached through a pointer libibverbs lets any thread
// use and close; the context is Send and Sync.
unsafe impl Send for XrcdInner {}
// SAFETY: &XrcdInner gives only the raw pointer and the context.
unsafe impl Sync for XrcdInner {}

/// Refuses before C, naming `verb`, when the device of `ctx` has no XRC
/// (`IBV_DEVICE_XRC` missing in `device_cap_flags`): what every XRC method checks first.
pub(crate) fn require_xrc(ctx: &Context, verb: Verb) -> Result<()> {
    let flags = device_attr_ex(ctx)?.orig_attr.device_cap_flags;
    match xrc_refusal(flags) {
        Some(why) => Err(Error::not_supported(verb, why)),
        None => Ok(()),
    }
}

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
        require_xrc(ctx, Verb::XrcDomainOpen)?;
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
        Ok(XrcDomain { inner: Arc::new(XrcdInner { raw, ctx: ctx.clone() }) })
    }

    /// The context the domain belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The raw domain, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_xrcd {
        self.inner.raw.as_ptr()
    }

    /// Closes the domain now (`ibv_close_xrcd`) and reports the result; `EBUSY`, closing
    /// nothing yet, while another handle, an XRC SRQ or an opened QP holds it.
    #[doc(alias = "ibv_close_xrcd")]
    pub fn close(self) -> Result<()> {
        destroy_shared(self.inner, Verb::CloseXrcd, |inner| inner.raw.destroy())
    }

    /// Opens the XRC receive QP numbered `qp_num` that a process sharing this domain
    /// created (`ibv_open_qp` with `IBV_QPT_XRC_RECV`): the opener gets the QP's async
    /// events and keeps it alive; the QP is destroyed when its last opener and its creator
    /// are done.
    ///
    /// Refused before C: a `qp_num` wider than the 24 bits of a QP number
    /// ([`Error::InvalidArgument`] naming [`Verb::XrcDomainOpenQp`]), and a device without
    /// XRC ([`Error::NotSupported`] naming it and `IBV_DEVICE_XRC`); a provider without
    /// `open_qp` gives [`Error::NotSupported`] naming [`Verb::OpenQp`] and `EOPNOTSUPP`.
    #[doc(alias = "ibv_open_qp")]
    pub fn open_qp(&self, qp_num: u32) -> Result<XrcRecvQp> {
        check_qp_num(qp_num)?;
        require_xrc(self.context(), Verb::XrcDomainOpenQp)?;
        use ffi::ibv_qp_open_attr_mask as M;
        let mut attr = ffi::ibv_qp_open_attr {
            comp_mask: M::IBV_QP_OPEN_ATTR_NUM.0 | M::IBV_QP_OPEN_ATTR_XRCD.0 | M::IBV_QP_OPEN_ATTR_TYPE.0,
            qp_num,
            xrcd: self.as_raw(),
            qp_context: std::ptr::null_mut(),
            qp_type: ffi::ibv_qp_type::IBV_QPT_XRC_RECV,
        };
        // SAFETY: the context and the domain are live and `attr` is readable.
        let raw = unsafe { ffi::ibv_open_qp(self.context().as_raw(), &mut attr) };
        if raw.is_null() {
            return Err(Error::last_os_or_not_supported(Verb::OpenQp, "XRC: the provider has no open_qp"));
        }
        // SAFETY: a new handle to the QP that only this Owned closes (ibv_destroy_qp).
        let raw = unsafe { Owned::new(raw, Verb::OpenQp)? };
        // SAFETY: the live QP just opened.
        let qp_num = unsafe { (*raw.as_ptr()).qp_num };
        Ok(XrcRecvQp { raw, qp_num, xrcd: self.clone() })
    }
}

/// A QP number is 24 bits.
fn check_qp_num(qp_num: u32) -> Result<()> {
    if qp_num > 0x00ff_ffff {
        return Err(Error::invalid(
            Verb::XrcDomainOpenQp,
            format!("QP number {qp_num:#x} is wider than the 24 bits of a QP number"),
        ));
    }
    Ok(())
}

impl fmt::Debug for XrcDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XrcDomain").field("raw", &self.as_raw()).finish()
    }
}

/// An XRC receive QP opened in an [`XrcDomain`] ([`XrcDomain::open_qp`]): a handle to a
/// QP another process (or this one) created. Closed on drop (`ibv_destroy_qp`, which
/// destroys the QP itself only when no other handle is left), before the domain it holds
/// is released.
pub struct XrcRecvQp {
    raw: Owned<ffi::ibv_qp>,
    qp_num: u32,
    xrcd: XrcDomain,
}

// SAFETY: the QP handle is a kernel object libibverbs lets any thread use and close.
unsafe impl Send for XrcRecvQp {}
// SAFETY: &XrcRecvQp gives only the QP number, the raw pointer and the domain.
unsafe impl Sync for XrcRecvQp {}

impl XrcRecvQp {
    /// The QP number, as the provider reports it for the opened QP.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// The domain it was opened in.
    pub fn xrcd(&self) -> &XrcDomain {
        &self.xrcd
    }

    /// The raw QP, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_qp {
        self.raw.as_ptr()
    }

    /// Closes this handle now (`ibv_destroy_qp`) and reports the result.
    pub fn close(self) -> Result<()> {
        self.raw.destroy()
    }
}

impl fmt::Debug for XrcRecvQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XrcRecvQp").field("qp_num", &format_args!("{:#x}", self.qp_num)).finish()
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
    fn a_qp_number_wider_than_24_bits_is_refused_before_c_naming_open_qp() {
        assert!(check_qp_num(0).is_ok());
        assert!(check_qp_num(0x00ff_ffff).is_ok());
        let e = check_qp_num(0x0100_0000).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { verb: Verb::XrcDomainOpenQp, .. }), "{e}");
        assert!(e.to_string().contains("XrcDomain::open_qp") && e.to_string().contains("0x1000000"), "{e}");
    }

    #[test]
    fn a_device_without_the_xrc_bit_is_refused_naming_it() {
        assert!(xrc_refusal(0).unwrap().contains("IBV_DEVICE_XRC"));
        assert_eq!(xrc_refusal(ffi::ibv_device_cap_flags::IBV_DEVICE_XRC.0), None);
    }
}
