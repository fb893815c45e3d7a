//! Safe Rust over the Linux RDMA verbs (libibverbs and librdmacm from rdma-core).
//!
//! ```no_run
//! use rdma_verbs::{
//!     AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, InitAttr, ProtectionDomain, QpType, QueuePair,
//!     SendWr, WorkCompletion,
//! };
//!
//! # fn main() -> rdma_verbs::Result<()> {
//! let ctx = Context::open(None)?; // the first device
//! let pd = ProtectionDomain::new(&ctx)?;
//! let mut cq = CompletionQueue::new(&ctx, 64)?;
//! let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).build()?;
//! // Connect it: QueuePair::connect with the peer's QueuePair::local_info (exchanged by
//! // the endpoint handshake or rdma_cm), sending from the PSN local_info advertised.
//! // Here it talks to itself.
//! let me = qp.local_info(1)?;
//! qp.connect(&InitAttr::default(), &me)?;
//!
//! // Register memory once and cut it into chunks: the currency of the safe data path.
//! let mut bufs: Vec<Chunk> = pd.register(AlignedBuf::new(8192)?, AccessFlags::LOCAL_WRITE)?.into_chunks(4096)?;
//! let (mut src, dst) = (bufs.remove(0), bufs.remove(0));
//! src[..5].copy_from_slice(b"hello");
//!
//! let mut rq = qp.recv_queue::<Chunk>()?;
//! let mut sq = qp.send_queue::<Chunk>()?;
//! rq.post(dst, 0..4096, 1)?; // the queue owns `dst` now
//! sq.post(SendWr::send(src, 0..5))?;
//!
//! let mut wcs = [WorkCompletion::EMPTY; 4];
//! let mut got = None;
//! while got.is_none() {
//!     for wc in cq.poll(&mut wcs)?.iter_mut() {
//!         if wc.opcode().is_recv() {
//!             got = Some(rq.complete(wc)?); // `dst` comes back, with what arrived
//!         } else {
//!             sq.complete(wc, |done| drop(done.buf))?; // `src` comes back
//!         }
//!     }
//! }
//! assert_eq!(&got.unwrap().buf[..5], b"hello");
//! # Ok(())
//! # }
//! ```
//!
//! The [`queue`] module documents why this is sound: posted buffers travel with their
//! work requests and come back with the completions, so safe code can never touch memory
//! the device is reading or writing. [`QueuePair::post_send_raw`] is the unsafe C-shaped
//! path for those who manage that themselves.
//!
//! # Ownership: an `Arc` chain
//!
//! Every object holds a reference-counted handle to what it was created from: a memory
//! region holds its protection domain, a QP its PD and CQs, a PD its device context.
//! So any drop order that compiles is safe: a parent's C object is destroyed only after
//! its last child is gone, and `destroy(self)` reports EBUSY instead of freeing a parent
//! with live children. Arcs rather than lifetimes, because lifetimes would make every
//! application struct that stores a context and its QPs self-referential; an Arc costs
//! one atomic increment when an object is created and nothing on the data path.
//! Borrowed memory is the exception: a region over a borrowed slice carries the slice's
//! lifetime, so it cannot outlive the memory the device may touch.
//!
//! # Errors
//!
//! One [`Error`] type names the verb, the errno and the usual cause, and tells whether
//! the failure came from the control plane (kernel path) or the data plane (provider).
#![warn(missing_docs)]

pub use rdma_sys as ffi;

pub mod ah;
pub mod buf;
pub mod cm;
pub mod compat;
pub mod context;
mod conv;
pub mod cq;
pub mod device;
pub mod diag;
pub mod endpoint;
pub mod error;
pub mod event;
mod handle;
pub mod mr;
pub mod pd;
pub mod port;
pub mod qp;
pub mod queue;
pub mod srq;
pub mod wc;
pub mod wr;

pub use ah::{AddressHandle, AhAttr, Remote};
pub use buf::{Chunk, ExclusiveBuf, SendBuf};
pub use cm::{CmEvent, CmEventKind, CmId, ConnParam, ConnectRequest, EventChannel, PortSpace, RejectReason};
pub use context::Context;
pub use cq::{CompletionQueue, CqBuilder};
pub use device::{devices, AtomicCap, Device, DeviceAttr, DeviceList};
pub use endpoint::{Connection, Endpoint, Handshake, UdPeer, WireError};
pub use error::{Error, Plane, Refused, Result, Verb};
pub use event::{AsyncEvent, AsyncEventKind, AsyncEvents, EventSource};
pub use mr::{AccessFlags, AccessMode, AlignedBuf, Local, MemoryRegion, RegisterableBuffer, RemoteMr, RemoteWritable};
pub use pd::ProtectionDomain;
pub use port::{Gid, GidEntry, GidType, LinkLayer, Mtu, PhysState, PortAttr, PortState};
pub use qp::{
    InitAttr, QpAccess, QpCaps, QpState, QpType, QueuePair, RemoteQpInfo, RtrAttr, RtsAttr, SendOps, DEFAULT_QKEY,
};
pub use queue::{Prepared, PreparedQueue, RecvQueue, ScopedChain, SendQueue, SendScope, SrqQueue};
pub use srq::SharedReceiveQueue;
pub use wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use wr::{Done, PostError, SendWr};
