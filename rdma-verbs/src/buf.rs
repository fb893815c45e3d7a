//! Chunks: disjoint, owned pieces of one memory region, the currency of the safe data
//! path. The guide is on [`Chunk`], public, where rustdoc shows it.

use std::fmt;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ops::{Deref, DerefMut, Range};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::mr::{AccessFlags, AccessMode, Local, MemoryRegion, RegisterableBuffer, RemoteMr};

/// A memory region behind its chunks: kept registered, its buffer allocated, while a chunk
/// lives; asked for its access flags and rkey only when a chunk hands out a remote
/// descriptor.
trait KeepAlive: Send + Sync {
    fn access(&self) -> AccessFlags;
    fn rkey(&self) -> u32;
}

impl<B, A> KeepAlive for MemoryRegion<B, A>
where
    B: RegisterableBuffer + Send + Sync,
    B::Parts: Send + Sync,
    A: AccessMode,
{
    fn access(&self) -> AccessFlags {
        MemoryRegion::access(self)
    }
    fn rkey(&self) -> u32 {
        MemoryRegion::rkey(self)
    }
}

/// An owned, exclusive piece of a registered memory region: the currency of the safe data
/// path.
///
/// [`MemoryRegion::into_chunks`] moves a region behind a reference count and cuts it into
/// chunks that do not overlap and are not `Clone`. The region itself is never reachable
/// again, so a chunk is the only way to its bytes: holding a `Chunk<Local>` is exclusive
/// access, and it derefs to `[u8]`. Posting a chunk moves it into the queue
/// ([`SendQueue`](crate::SendQueue), [`RecvQueue`](crate::RecvQueue)); while the device
/// works on it the program holds no reference to it, and it comes back with its
/// completion ([`Done`](crate::Done)). The region is deregistered, and its buffer freed,
/// when the last chunk is dropped.
///
/// A chunk the device only reads (a SEND or RDMA WRITE source) can be posted many times
/// at once as an `Arc<Chunk>`: shared, so nobody can write it while any post holds it.
pub struct Chunk<A: AccessMode = Local> {
    // 32 bytes: what a post reads on every request (its bytes and lkey) inline, what all
    // the region's chunks share behind one thin pointer. Chunks move on every post and
    // completion: 32 bytes move with two vector loads and stores, 48 took three
    // (scripts/instructions: a receive built at post 342 -> 327 instructions a round).
    ptr: NonNull<u8>,
    len: usize,
    lkey: u32,
    region: Arc<Region>,
    _mode: PhantomData<A>,
}

/// What every chunk of a region shares: the region (kept registered and its buffer
/// allocated while a chunk lives) and its protection domain.
struct Region {
    /// The protection domain it is registered in, as an identity (never dereferenced):
    /// a copy of what `mr` knows, read by every post's check without a call.
    pd: usize,
    mr: Box<dyn KeepAlive>,
}

// SAFETY: a chunk is exclusive access to bytes nobody else can reach (the region is
// hidden behind the Arc and chunks do not overlap); the Arc keeps them alive from any
// thread.
unsafe impl<A: AccessMode> Send for Chunk<A> {}
// SAFETY: &Chunk gives only shared access to the bytes (Deref), like &[u8].
unsafe impl<A: AccessMode> Sync for Chunk<A> {}

impl<B, A> MemoryRegion<B, A>
where
    B: RegisterableBuffer + Send + Sync + 'static,
    B::Parts: Send + Sync,
    A: AccessMode,
{
    /// Cuts the region into chunks of `chunk_len` bytes (the last one may be shorter).
    /// The region is kept registered until the last chunk is dropped. A region registered
    /// at a chosen I/O virtual address
    /// ([`register_at_iova`](crate::ProtectionDomain::register_at_iova)) is refused (and
    /// dropped): a chunk's device address is its address in this process.
    pub fn into_chunks(self, chunk_len: usize) -> Result<Vec<Chunk<A>>> {
        if chunk_len == 0 {
            return Err(Error::invalid(Verb::IntoChunks, "chunk length 0"));
        }
        if self.addr() != self.as_ptr() as u64 {
            // A chunk keeps one address for the CPU and the device (it stays small enough
            // to move in registers); such a region is served through its own sge().
            return Err(Error::invalid(
                Verb::IntoChunks,
                "the region was registered at a chosen I/O virtual address (register_at_iova): its chunks \
                 would carry the wrong device address; use MemoryRegion::sge and remote",
            ));
        }
        let (base, len, lkey) = (self.as_ptr(), self.len(), self.lkey());
        let pd = self.pd().as_raw() as usize;
        let region = Arc::new(Region { pd, mr: Box::new(self) });
        let mut chunks = Vec::with_capacity(len.div_ceil(chunk_len));
        let mut off = 0;
        while off < len {
            let n = chunk_len.min(len - off);
            chunks.push(Chunk {
                // SAFETY: off < len, so base + off is inside the region, hence non-null.
                ptr: unsafe { NonNull::new_unchecked(base.add(off)) },
                len: n,
                lkey,
                region: Arc::clone(&region),
                _mode: PhantomData,
            });
            off += n;
        }
        Ok(chunks)
    }
}

impl<A: AccessMode> Chunk<A> {
    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length chunk (never made by `into_chunks`).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address the device knows these bytes by.
    #[inline]
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The region's local key.
    #[inline]
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// What a peer needs to reach this chunk. Fails, as [`MemoryRegion::remote`] does,
    /// when the region grants no remote access.
    pub fn remote(&self) -> Result<RemoteMr> {
        crate::mr::remote_descriptor(
            Verb::MrRemote,
            self.addr(),
            self.len as u64,
            self.region.mr.rkey(),
            self.region.mr.access(),
        )
    }

    /// A scatter/gather entry for `range` of this chunk, bounds checked.
    #[inline]
    pub fn sge(&self, range: Range<usize>) -> Result<ffi::ibv_sge> {
        self.sge_for(Verb::ChunkSge, range)
    }

    /// [`Chunk::sge`] for `verb`, the method that asked: a refusal names it.
    #[inline]
    fn sge_for(&self, verb: Verb, range: Range<usize>) -> Result<ffi::ibv_sge> {
        if range.start > range.end || range.end > self.len {
            return Err(out_of_range(verb, range, self.len));
        }
        let Ok(length) = u32::try_from(range.end - range.start) else {
            return Err(too_long(verb));
        };
        Ok(ffi::ibv_sge { addr: self.addr() + range.start as u64, length, lkey: self.lkey })
    }
}

impl Deref for Chunk<Local> {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: the bytes are registered and alive (the Arc), no peer may write a Local
        // region, and the device touches them only while the chunk is posted, when the
        // queue owns it and no reference to it exists.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for Chunk<Local> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for Deref, and &mut self is the only access to these bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<A: AccessMode> fmt::Debug for Chunk<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chunk").field("addr", &format_args!("{:#x}", self.addr())).field("len", &self.len).finish()
    }
}

/// Most scatter/gather entries one safe work request carries.
pub const MAX_SGE: usize = 8;

mod sealed {
    /// The data path trusts a buffer's SGEs: they name the bytes the device will read or
    /// write. Only this crate's buffer types may make that claim, so these traits are
    /// sealed (a type of yours could name bytes that someone else still reads).
    pub trait Sealed {}
}

impl<A: AccessMode> sealed::Sealed for Chunk<A> {}
impl<A: AccessMode> sealed::Sealed for Arc<Chunk<A>> {}
impl<S: Segment, const N: usize> sealed::Sealed for [S; N] {}

/// The protection domain a queue posts in, as an identity: a buffer registered in another
/// one is refused before C (the device would fail it as a local protection or QP
/// operation error, far from its cause).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PdId(pub(crate) usize);

impl PdId {
    pub(crate) fn of(pd: &crate::pd::ProtectionDomain) -> Self {
        PdId(pd.as_raw() as usize)
    }
}

/// One contiguous piece of registered memory: a chunk, owned or shared. Sealed: only
/// this crate's chunks are segments.
pub trait Segment: sealed::Sealed {
    /// Length in bytes.
    fn seg_len(&self) -> usize;
    /// The protection domain it is registered in.
    fn seg_pd(&self) -> PdId;
    /// The SGE for `range` of the piece, bounds checked; a refusal names `verb`.
    fn seg_sge(&self, verb: Verb, range: Range<usize>) -> Result<ffi::ibv_sge>;
}

/// A chunk is a segment whether it is owned or shared.
macro_rules! chunk_segment {
    ($($chunk:ty),*) => {$(
        impl<A: AccessMode> Segment for $chunk {
            #[inline]
            fn seg_len(&self) -> usize {
                self.len
            }
            #[inline]
            fn seg_pd(&self) -> PdId {
                PdId(self.region.pd)
            }
            #[inline]
            fn seg_sge(&self, verb: Verb, range: Range<usize>) -> Result<ffi::ibv_sge> {
                self.sge_for(verb, range)
            }
        }
    )*};
}
chunk_segment!(Chunk<A>, Arc<Chunk<A>>);

/// A buffer the device may read: the source of a SEND or an RDMA WRITE. An array of
/// segments is one logical buffer, their bytes in order, and becomes an SGE list: a
/// message can span chunks of different memory regions. Sealed: the buffers are this
/// crate's (`Chunk`, `Arc<Chunk>` and arrays of them).
pub trait SendBuf: sealed::Sealed + Send + 'static {
    /// Total length in bytes.
    fn total_len(&self) -> usize;
    /// Writes the SGEs for `range` of the buffer into `out` and returns how many (0 for
    /// an empty range). Every piece must be registered in `pd`, the poster's. A refusal
    /// names `verb`, the method that asked.
    fn sges(
        &self,
        verb: Verb,
        range: Range<usize>,
        pd: PdId,
        out: &mut [MaybeUninit<ffi::ibv_sge>; MAX_SGE],
    ) -> Result<usize>;
}

/// A buffer only the queue that posted it can reach: the device may write it (receive,
/// RDMA READ and atomic targets). Shared `Arc<Chunk>`s are not.
pub trait ExclusiveBuf: SendBuf {}

// The error paths are cold and out of line, so that the checks inline into the post.
#[cold]
#[inline(never)]
// The range by value: a reference made every post keep the range in memory, two stores a
// request on the fast path (scripts/instructions, 2026-12-07).
fn out_of_range(verb: Verb, range: Range<usize>, len: usize) -> Error {
    Error::invalid(verb, format!("range {range:?} is outside a {len}-byte buffer"))
}

#[cold]
#[inline(never)]
fn too_long(verb: Verb) -> Error {
    Error::invalid(verb, "an SGE is at most 4 GiB - 1")
}

#[cold]
#[inline(never)]
fn other_pd(verb: Verb) -> Error {
    Error::invalid(
        verb,
        "the buffer is registered in another protection domain than the QP's (the device would fail it \
         with a local protection or QP operation error): register it in the QP's PD",
    )
}

#[inline]
fn single<S: Segment>(
    verb: Verb,
    s: &S,
    range: Range<usize>,
    pd: PdId,
    out: &mut [MaybeUninit<ffi::ibv_sge>; MAX_SGE],
) -> Result<usize> {
    if range.start > range.end || range.end > s.seg_len() {
        return Err(out_of_range(verb, range, s.seg_len()));
    }
    if s.seg_pd() != pd {
        return Err(other_pd(verb));
    }
    if range.is_empty() {
        return Ok(0);
    }
    out[0].write(s.seg_sge(verb, range)?);
    Ok(1)
}

/// One segment (a chunk, owned or shared) is a buffer of one SGE.
impl<S: Segment + Send + 'static> SendBuf for S {
    #[inline]
    fn total_len(&self) -> usize {
        self.seg_len()
    }
    #[inline]
    fn sges(
        &self,
        verb: Verb,
        range: Range<usize>,
        pd: PdId,
        out: &mut [MaybeUninit<ffi::ibv_sge>; MAX_SGE],
    ) -> Result<usize> {
        single(verb, self, range, pd, out)
    }
}
impl<A: AccessMode> ExclusiveBuf for Chunk<A> {}

impl<S: Segment + Send + 'static, const N: usize> SendBuf for [S; N] {
    fn total_len(&self) -> usize {
        self.iter().map(Segment::seg_len).sum()
    }

    fn sges(
        &self,
        verb: Verb,
        range: Range<usize>,
        pd: PdId,
        out: &mut [MaybeUninit<ffi::ibv_sge>; MAX_SGE],
    ) -> Result<usize> {
        let total = self.total_len();
        if range.start > range.end || range.end > total {
            return Err(out_of_range(verb, range, total));
        }
        let (mut n, mut base) = (0, 0);
        for seg in self {
            let len = seg.seg_len();
            let (lo, hi) = (range.start.max(base), range.end.min(base + len));
            if lo < hi {
                if seg.seg_pd() != pd {
                    return Err(other_pd(verb));
                }
                if n == MAX_SGE {
                    return Err(Error::invalid(verb, format!("more than {MAX_SGE} SGEs in one request")));
                }
                out[n].write(seg.seg_sge(verb, lo - base..hi - base)?);
                n += 1;
            }
            base += len;
        }
        Ok(n)
    }
}
impl<A: AccessMode, const N: usize> ExclusiveBuf for [Chunk<A>; N] {}
