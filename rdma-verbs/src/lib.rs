//! Safe Rust over the Linux RDMA verbs (libibverbs and librdmacm from rdma-core).
//!
//! An RC QP sends "hello" to itself (this example is `tests/device/crate_example.rs`,
//! which the device tests run):
//!
#![doc = concat!("```no_run\n", include_str!("../tests/device/crate_example.rs"), "```")]
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
mod c_enum;
pub mod cm;
mod codes;
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
pub use queue::{Prepared, PreparedQueue, RecvQueue, SendQueue, SendRequest, SrqQueue};
pub use srq::SharedReceiveQueue;
pub use wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use wr::{Done, PostError, SendWr};
