//! What can be registered: buffers that stay put while the device uses them, and a
//! page-aligned one of our own.

use crate::error::{Error, Result, Verb};
use std::alloc::{self, Layout};
use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::ptr::{self, NonNull};
use std::sync::OnceLock;

/// A buffer that can be registered: a stable allocation of initialized bytes that the
/// region takes apart into a pointer and a length while registered, and rebuilds after
/// deregistration.
///
/// Implemented for [`AlignedBuf`], `Vec<u8>`, `Box<[u8]>` and `&mut [u8]`.
///
/// # Safety
///
/// `disassemble` must return a pointer to `len` initialized bytes that are valid for
/// reads and writes and stay allocated, at that address, untouched by anything but the
/// holder of the parts, until `reassemble` is called with the same parts (the bytes
/// may have changed by then: any value is a valid `u8`). `reassemble` must rebuild a
/// buffer equivalent to the one taken apart.
pub unsafe trait RegisterableBuffer: Sized {
    /// What besides the address and the length rebuilding the buffer needs (a `Vec`'s
    /// capacity).
    type Parts;

    /// Takes the buffer apart: address, length in bytes, the rest.
    fn disassemble(self) -> (NonNull<u8>, usize, Self::Parts);

    /// Rebuilds the buffer.
    ///
    /// # Safety
    /// The arguments must be what one call of `disassemble` returned, used once.
    unsafe fn reassemble(ptr: NonNull<u8>, len: usize, parts: Self::Parts) -> Self;
}

// SAFETY: a Vec's first `len` bytes are initialized heap memory owned by the Vec; the
// heap block does not move while the parts are held, and Vec::from_raw_parts with the
// same pointer, length and capacity rebuilds it.
unsafe impl RegisterableBuffer for Vec<u8> {
    type Parts = usize;

    fn disassemble(self) -> (NonNull<u8>, usize, usize) {
        let mut v = ManuallyDrop::new(self);
        // A Vec's pointer is never null (dangling when it has not allocated).
        let ptr = NonNull::new(v.as_mut_ptr()).unwrap_or(NonNull::dangling());
        (ptr, v.len(), v.capacity())
    }

    unsafe fn reassemble(ptr: NonNull<u8>, len: usize, cap: usize) -> Self {
        // SAFETY: the caller passes back the parts of one Vec, once.
        unsafe { Vec::from_raw_parts(ptr.as_ptr(), len, cap) }
    }
}

// SAFETY: a boxed slice is initialized heap memory owned by the box; Box::from_raw of the
// same slice pointer rebuilds it.
unsafe impl RegisterableBuffer for Box<[u8]> {
    type Parts = ();

    fn disassemble(self) -> (NonNull<u8>, usize, ()) {
        let len = self.len();
        let raw = Box::into_raw(self);
        // Box::into_raw never returns null.
        let ptr = NonNull::new(raw.cast::<u8>()).unwrap_or(NonNull::dangling());
        (ptr, len, ())
    }

    unsafe fn reassemble(ptr: NonNull<u8>, len: usize, _: ()) -> Self {
        // SAFETY: the caller passes back the parts of one Box<[u8]>, once.
        unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(ptr.as_ptr(), len)) }
    }
}

// SAFETY: an exclusive borrow gives exclusive access to initialized bytes for 'a; the
// region that holds the parts carries 'a (through PhantomData<B>), so it cannot outlive
// the borrow, and rebuilding the slice hands the same exclusive borrow back.
unsafe impl RegisterableBuffer for &mut [u8] {
    type Parts = ();

    fn disassemble(self) -> (NonNull<u8>, usize, ()) {
        let len = self.len();
        (NonNull::from(self).cast::<u8>(), len, ())
    }

    unsafe fn reassemble(ptr: NonNull<u8>, len: usize, _: ()) -> Self {
        // SAFETY: the caller passes back the parts of one `&'a mut [u8]`, once.
        unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), len) }
    }
}

/// The system page size (`sysconf(_SC_PAGESIZE)`), read once.
pub fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(v).ok().filter(|p| p.is_power_of_two()).unwrap_or(4096)
    })
}

/// A zeroed, page-aligned heap buffer: the usual memory to register. Its allocation is
/// rounded up to whole pages, so no other allocation shares its pages (which matters to
/// `fork()` after `ibv_fork_init`, and keeps unrelated data out of pinned pages).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its bytes like a Box<[u8]> does.
unsafe impl Send for AlignedBuf {}
// SAFETY: &AlignedBuf only gives &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes at a page boundary. A zero length is an error (a
    /// region cannot be empty), as is a length whose page-rounded size overflows `isize`.
    pub fn new(len: usize) -> Result<AlignedBuf> {
        let layout = Self::layout(len)?;
        // SAFETY: the layout has a non-zero size (checked in layout()).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            Error::verb(Verb::AlignedBufNew, libc::ENOMEM)
                .with_hint(format!("the allocator could not provide {} bytes", layout.size()))
        })?;
        Ok(AlignedBuf { ptr, len })
    }

    fn layout(len: usize) -> Result<Layout> {
        if len == 0 {
            return Err(Error::invalid(Verb::AlignedBufNew, "a zero-length buffer cannot be registered"));
        }
        let page = page_size();
        len.checked_add(page - 1)
            .map(|n| n & !(page - 1))
            .and_then(|size| Layout::from_size_align(size, page).ok())
            .ok_or_else(|| {
                Error::invalid(Verb::AlignedBufNew, format!("{len} bytes rounded up to whole pages is too large"))
            })
    }

    /// The length in bytes (as asked for, not rounded).
    #[allow(clippy::len_without_is_empty)] // never empty: new() rejects zero
    pub fn len(&self) -> usize {
        self.len
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` zero-initialized-or-written bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // new() built this layout from this length, so it cannot fail here.
        if let Ok(layout) = Self::layout(self.len) {
            // SAFETY: allocated by alloc_zeroed with this layout, freed once.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf").field("addr", &self.ptr).field("len", &self.len).finish()
    }
}

// SAFETY: the bytes are owned, initialized (zeroed) and page-aligned; the parts are the
// pointer and length of one AlignedBuf, and rebuilding gives that same AlignedBuf.
unsafe impl RegisterableBuffer for AlignedBuf {
    type Parts = ();

    fn disassemble(self) -> (NonNull<u8>, usize, ()) {
        let me = ManuallyDrop::new(self);
        (me.ptr, me.len, ())
    }

    unsafe fn reassemble(ptr: NonNull<u8>, len: usize, _: ()) -> Self {
        AlignedBuf { ptr, len }
    }
}
