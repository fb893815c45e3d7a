//! Thread domains (`struct ibv_td`) and parent domains (`ibv_alloc_parent_domain`): a
//! promise that one thread at a time uses the objects made in them, so that the provider
//! may drop its locks.

use std::ffi::c_int;
use std::fmt;

use crate::context::Context;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::{Owned, RawObject};
use crate::pd::ProtectionDomain;

impl RawObject for ffi::ibv_td {
    const DESTROY: Verb = Verb::DeallocTd;
    unsafe fn destroy(raw: *mut Self) -> c_int {
        // SAFETY: forwarded from the caller's contract.
        unsafe { ffi::ibv_dealloc_td(raw) }
    }
}

/// A thread domain (`ibv_alloc_td`), deallocated on drop (`ibv_dealloc_td`). Not `Sync`:
/// it stands for one thread's exclusive use.
///
/// What it promises: no device attribute says whether a provider has thread domains, so
/// the answer is the call's: a provider without them (rxe) gives [`Error::NotSupported`]
/// naming [`Verb::AllocTd`] and `EOPNOTSUPP`.
pub struct ThreadDomain {
    raw: Owned<ffi::ibv_td>,
    ctx: Context,
}

// SAFETY: the domain may move to another thread (it promises one user at a time, not a
// particular thread); it is not Sync.
unsafe impl Send for ThreadDomain {}

/// NULL from an allocation verb: its errno, as [`Error::NotSupported`] for `EOPNOTSUPP`.
fn null_error(verb: Verb, capability: &'static str) -> Error {
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
    Error::verb_or_not_supported(verb, if errno == 0 { libc::EIO } else { errno }, capability)
}

impl ThreadDomain {
    /// Allocates a thread domain (`ibv_alloc_td`).
    #[doc(alias = "ibv_alloc_td")]
    pub fn alloc(ctx: &Context) -> Result<ThreadDomain> {
        let mut attr = ffi::ibv_td_init_attr { comp_mask: 0 };
        // SAFETY: the context is open and `attr` is readable.
        let raw = unsafe { ffi::ibv_alloc_td(ctx.as_raw(), &mut attr) };
        if raw.is_null() {
            return Err(null_error(Verb::AllocTd, "thread domains: the provider has no alloc_td"));
        }
        // SAFETY: a new domain that only this Owned deallocates.
        let raw = unsafe { Owned::new(raw, Verb::AllocTd)? };
        Ok(ThreadDomain { raw, ctx: ctx.clone() })
    }

    /// The raw domain, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_td {
        self.raw.as_ptr()
    }

    /// The context the domain belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Deallocates the domain now (`ibv_dealloc_td`) and reports the result.
    #[doc(alias = "ibv_dealloc_td")]
    pub fn dealloc(self) -> Result<()> {
        self.raw.destroy()
    }
}

impl fmt::Debug for ThreadDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadDomain").field("raw", &self.raw.as_ptr()).finish()
    }
}

/// A parent domain (`ibv_alloc_parent_domain`): a protection domain that carries a thread
/// domain (and in C, custom allocators, which this type does not offer). Deallocated on
/// drop (`ibv_dealloc_pd`), before its thread domain and its protection domain are
/// released.
///
/// What it promises: a thread domain of another context is refused before C
/// ([`Error::InvalidArgument`] naming [`Verb::ParentDomainNew`]); a provider without
/// parent domains (rxe) gives [`Error::NotSupported`] naming [`Verb::AllocParentDomain`]
/// and `EOPNOTSUPP`.
pub struct ParentDomain {
    raw: Owned<ffi::ibv_pd>,
    td: Option<ThreadDomain>,
    pd: ProtectionDomain,
}

// SAFETY: as for ThreadDomain: one user at a time, from any thread; not Sync.
unsafe impl Send for ParentDomain {}

fn check_same_context(pd_ctx: *mut ffi::ibv_context, td_ctx: Option<*mut ffi::ibv_context>) -> Result<()> {
    match td_ctx {
        Some(t) if t != pd_ctx => Err(Error::invalid(
            Verb::ParentDomainNew,
            "the thread domain belongs to another device context than the protection domain",
        )),
        _ => Ok(()),
    }
}

impl ParentDomain {
    /// A parent domain over `pd`, with `td` if given (`ibv_alloc_parent_domain`). The
    /// parent domain keeps both.
    #[doc(alias = "ibv_alloc_parent_domain")]
    pub fn new(pd: &ProtectionDomain, td: Option<ThreadDomain>) -> Result<ParentDomain> {
        check_same_context(pd.context().as_raw(), td.as_ref().map(|t| t.ctx.as_raw()))?;
        // SAFETY: a C struct of pointers and integers, for which all zeros (NULL, no
        // allocators) is valid.
        let mut attr: ffi::ibv_parent_domain_init_attr = unsafe { std::mem::zeroed() };
        attr.pd = pd.as_raw();
        attr.td = td.as_ref().map_or(std::ptr::null_mut(), ThreadDomain::as_raw);
        // SAFETY: the context, PD and TD are live and `attr` is readable.
        let raw = unsafe { ffi::ibv_alloc_parent_domain(pd.context().as_raw(), &mut attr) };
        if raw.is_null() {
            return Err(null_error(Verb::AllocParentDomain, "parent domains: the provider has no alloc_parent_domain"));
        }
        // SAFETY: a new PD that only this Owned deallocates.
        let raw = unsafe { Owned::new(raw, Verb::AllocParentDomain)? };
        Ok(ParentDomain { raw, td, pd: pd.clone() })
    }

    /// The raw parent domain (a `struct ibv_pd`), valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_pd {
        self.raw.as_ptr()
    }

    /// The protection domain it was made over.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// Its thread domain, if it has one.
    pub fn thread_domain(&self) -> Option<&ThreadDomain> {
        self.td.as_ref()
    }
}

impl fmt::Debug for ParentDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParentDomain").field("raw", &self.raw.as_ptr()).field("td", &self.td).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_domain_of_another_context_is_refused_before_c() {
        let (a, b) = (8usize as *mut ffi::ibv_context, 16usize as *mut ffi::ibv_context);
        assert!(check_same_context(a, None).is_ok());
        assert!(check_same_context(a, Some(a)).is_ok());
        let e = check_same_context(a, Some(b)).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::ParentDomainNew, .. }), "{e}");
    }
}
