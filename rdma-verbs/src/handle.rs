//! Ownership of one C verbs object: created once, destroyed once, errors reported.

use std::ffi::c_int;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::conv;
use crate::error::{Error, Result, Verb};
use crate::ffi;

/// A C object with a destroy verb.
pub(crate) trait RawObject {
    /// The destroy verb's name, for errors.
    const DESTROY: Verb;
    /// Calls the destroy verb, returning 0 or an errno (or -1 with errno set).
    ///
    /// # Safety
    /// `raw` must be a live object of this type, destroyed at most once.
    unsafe fn destroy(raw: *mut Self) -> c_int;
}

/// Owns one C object: destroys it on drop (logging a failure) or in [`Owned::destroy`]
/// (returning it). Put it first in a struct whose later fields hold the parents, so that
/// the object is destroyed before its parents are released.
pub(crate) struct Owned<T: RawObject>(NonNull<T>);

impl<T: RawObject> Owned<T> {
    /// Takes ownership of what a create verb returned; NULL becomes the verb's error.
    ///
    /// # Safety
    /// `raw` must be NULL or a live object that nothing else destroys.
    pub(crate) unsafe fn new(raw: *mut T, create_verb: Verb) -> Result<Self> {
        conv::ptr(create_verb, raw).map(Owned)
    }

    pub(crate) fn as_ptr(&self) -> *mut T {
        self.0.as_ptr()
    }

    /// Destroys the object now and reports the verb's result.
    pub(crate) fn destroy(self) -> Result<()> {
        let me = ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so this is the one destroy of a live object.
        let rc = unsafe { T::destroy(me.0.as_ptr()) };
        conv::rc(T::DESTROY, rc)
    }
}

impl<T: RawObject> Drop for Owned<T> {
    fn drop(&mut self) {
        let me = Owned(self.0);
        if let Err(e) = me.destroy() {
            log::error!("{e}");
        }
    }
}

/// `destroy(self)` for an Arc-shared object: destroys it when this is the last handle,
/// and otherwise says who still holds it (the last holder frees it on drop).
pub(crate) fn destroy_shared<I>(inner: Arc<I>, verb: Verb, destroy: impl FnOnce(I) -> Result<()>) -> Result<()> {
    match Arc::try_unwrap(inner) {
        Ok(inner) => destroy(inner),
        Err(shared) => Err(Error::verb(verb, libc::EBUSY).with_hint(format!(
            "{} other handles or child objects still use it; it is freed when the last of them is dropped",
            Arc::strong_count(&shared) - 1
        ))),
    }
}

macro_rules! raw_object {
    ($($t:ty => $verb:ident, $name:ident);* $(;)?) => {$(
        impl RawObject for $t {
            const DESTROY: Verb = Verb::$name;
            unsafe fn destroy(raw: *mut Self) -> c_int {
                // SAFETY: forwarded from the caller's contract.
                unsafe { ffi::$verb(raw) }
            }
        }
    )*};
}

raw_object! {
    ffi::ibv_context => ibv_close_device, CloseDevice;
    ffi::ibv_pd => ibv_dealloc_pd, DeallocPd;
    ffi::ibv_mr => ibv_dereg_mr, DeregMr;
    ffi::ibv_cq => ibv_destroy_cq, DestroyCq;
    ffi::ibv_qp => ibv_destroy_qp, DestroyQp;
    ffi::ibv_srq => ibv_destroy_srq, DestroySrq;
    ffi::ibv_ah => ibv_destroy_ah, DestroyAh;
    ffi::ibv_comp_channel => ibv_destroy_comp_channel, DestroyCompChannel;
    ffi::ibv_mw => ibv_dealloc_mw, DeallocMw;
}

/// A C object imported from another context's handle (`ibv_import_pd`, `ibv_import_mr`).
pub(crate) trait ImportedObject {
    /// Releases the local handle (`ibv_unimport_*`) without destroying the kernel object.
    ///
    /// # Safety
    /// `raw` must be a live imported object, unimported at most once.
    unsafe fn unimport(raw: *mut Self);
}

/// Owns one imported C object: unimports it on drop, never destroys the kernel object,
/// which belongs to the process that created it.
pub(crate) struct Imported<T: ImportedObject>(NonNull<T>);

impl<T: ImportedObject> Imported<T> {
    /// Takes ownership of what an import verb returned; NULL becomes `err()`.
    ///
    /// # Safety
    /// `raw` must be NULL or a live imported object that nothing else unimports.
    pub(crate) unsafe fn new(raw: *mut T, err: impl FnOnce() -> Error) -> Result<Self> {
        NonNull::new(raw).map(Imported).ok_or_else(err)
    }

    pub(crate) fn as_ptr(&self) -> *mut T {
        self.0.as_ptr()
    }
}

impl<T: ImportedObject> Drop for Imported<T> {
    fn drop(&mut self) {
        // SAFETY: drop runs once, and `new`'s caller promised nothing else unimports it.
        unsafe { T::unimport(self.0.as_ptr()) }
    }
}

impl ImportedObject for ffi::ibv_pd {
    unsafe fn unimport(raw: *mut Self) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { ffi::ibv_unimport_pd(raw) }
    }
}

impl ImportedObject for ffi::ibv_mr {
    unsafe fn unimport(raw: *mut Self) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { ffi::ibv_unimport_mr(raw) }
    }
}
