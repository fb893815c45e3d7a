//! Safe Rust over the Linux RDMA verbs (libibverbs and librdmacm from rdma-core).
//!
//! # Getting started
//!
//! Depend on `rdma-verbs` (not yet on crates.io: a path or git dependency on a clone, as
//! the repository's README says) with rdma-core's development files installed:
//! `apt-get install libibverbs-dev librdmacm-dev pkg-config` on Debian and Ubuntu,
//! `dnf install rdma-core-devel pkgconf-pkg-config` on Fedora and RHEL. libclang is
//! optional: with it the bindings are generated from your headers, without it the
//! pregenerated ones are used ([`ffi`] says more; the `bindgen` feature insists on
//! generating them). Then:
//!
//! ```
//! let names = rdma_verbs::devices().map(|list| list.names()); // an error where the kernel has no RDMA
//! println!("RDMA devices: {names:?}");
//! ```
//!
//! The tour, in the order a program meets the types: [`Context`] (an open device),
//! [`ProtectionDomain`], memory ([`MemoryRegion`], cut into [`Chunk`]s), a
//! [`CompletionQueue`], a [`QueuePair`] (built, then connected to what the peer's
//! [`QueuePair::local_info`] says, exchanged by a [`Handshake`] or through rdma_cm's
//! [`CmId`]), and the data path: [`SendQueue`] and [`RecvQueue`] take [`SendWr`]s and
//! buffers and give each buffer back with its completion ([`Done`]). Every failure is an
//! [`Error`] naming the verb. The raw C API is [`ffi`].
//!
//! An RC QP sends "hello" to itself (this example is `tests/device/doc/quickstart.rs`,
//! which the device tests run on rxe, as they run every example in these docs):
//!
#![doc = concat!("```no_run\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/device/doc/quickstart.rs")), "```")]
//!
//! [`SendQueue`] documents why this is sound: posted buffers travel with their
//! work requests and come back with the completions, so safe code can never touch memory
//! the device is reading or writing. [`QueuePair::post_send_raw`] is the unsafe C-shaped
//! path for those who manage that themselves.
//!
//! # The data path: which queue
//!
//! Every safe queue owns what it has posted and hands it back with its completion as a
//! [`Done`] (the buffer or request, your id, the operation, the status;
//! [`Done::result`] turns a failure into an error naming the operation, your id and the
//! QP). Each sets its depth aside in its CQ when it is made, so a CQ cannot overrun. A
//! post is a batch of one, and a batch is one provider call (on rxe, one doorbell system
//! call). A refusal hands back what was not taken: [`Refused`], which `?` turns into an
//! [`Error`].
//!
//! | to post | use | made by |
//! | --- | --- | --- |
//! | requests built as you go (the way of the example above) | [`SendQueue`], [`RecvQueue`] | [`QueuePair::send_queue`], [`QueuePair::recv_queue`] |
//! | the same requests again and again | [`PreparedSendQueue`], [`PreparedRecvQueue`] | [`QueuePair::prepared_send_queue`], [`QueuePair::prepared_recv_queue`] |
//! | a fixed batch, posted whole (the cheapest batch) | [`SendChainQueue`], [`RecvChainQueue`] | [`QueuePair::send_chain_queue`], [`QueuePair::recv_chain_queue`] |
//! | receives of a shared receive queue | [`SrqQueue`] | [`SharedReceiveQueue::queue`] |
//! | any of the above, completions awaited | [`AsyncSendQueue`], [`AsyncRecvQueue`] | `new(queue, AsyncCq)` |
//! | C requests, with no checks of ours (unsafe) | [`QueuePair::post_send_raw`] | |
//!
//! - One [`SendQueue`] posts any [`SendRequest`]: a [`SendWr`] checked and built at each
//!   post; a [`PreparedSend`] request, checked and built once and posted again with only its
//!   `wr_id` stamped ([`PreparedSendQueue`], what the perftest-style tools use); or a
//!   [`PreparedSendChain`] of them ([`SendChainQueue::prepare_chain`]), posted whole with one
//!   `post` and handed back whole with its last completion, the first failure named.
//!   [`SendQueue::complete_all`] takes a poll's completions in one call.
//! - One [`RecvQueue`] takes receives built at each post (`post(buf, range, id)`),
//!   [`PreparedRecv`]s built once ([`PreparedRecvQueue::prepare`], handed back whole to
//!   read what arrived), or a [`PreparedRecvChain`] ([`RecvChainQueue::prepare_chain`]:
//!   posted whole, each receive's completion recorded in the chain, which comes back after
//!   its last with each receive's bytes and length).
//! - What each way costs against the raw API, in instructions per request
//!   (`scripts/instructions`): the repository's `docs/queues.md`. In short, prepared
//!   requests and chains come within about 10% of C; a request built at each post costs
//!   more, most in batches.
//!
//! # Async
//!
//! Completions can be awaited on any executor, at no cost when they are already there:
//! [`AsyncCq`] polls a CQ first and parks the task on its completion channel only when it
//! is empty; [`AsyncSendQueue`] and [`AsyncRecvQueue`] return a [`Ticket`] from each post
//! and hand the request back when its ticket (or `next`) is awaited, with no allocation
//! per request. The features `tokio` and `async-io` (smol, async-std) supply the reactor;
//! [`Readiness`] is all another runtime implements.
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
//! One [`Error`] type for the whole crate. Every error names the [`Verb`] that failed: a
//! C call, or the method of ours that checked the arguments before one. Errors from C
//! carry the errno as a [`std::io::Error`], tell whether the failure came from the
//! control plane (kernel path) or the data plane (provider), and, where the usual cause
//! is known, give a one-line hint. A failed work request names the operation, your id and
//! the QP ([`Done::result`]). A value that a call did not take comes back with its error
//! in a [`Refused`]; `?` turns it into an [`Error`]. Byte formats from a peer fail with a
//! [`WireError`].
//!
//! # Map
//!
//! Everything is at the crate root except three namespaces: [`ffi`] (the raw C API),
//! [`wire`] (every byte format a peer sends: the endpoint message, [`RemoteQpInfo`],
//! [`RemoteMr`], the `ibv_rc_pingpong` text; strict parsers, fuzzed) and [`compat`]
//! (which rdma-core releases have which data-path bugs, so the path that works is taken).
//!
//! - Devices: [`devices`], [`Context`], [`DeviceAttr`], [`PortAttr`] (with the rate), the GID table and
//!   the default GID choice ([`Context::default_gid`], [`choose_roce_gid`]: RoCE v2 with
//!   an IPv4 address first); the device's asynchronous events ([`AsyncEvents`]).
//! - Memory: [`ProtectionDomain`]; [`MemoryRegion`] over owned or borrowed buffers, with
//!   remote write and atomics only in a type that never hands out `&[u8]`; [`Chunk`]s,
//!   the owned pieces of a region that the data path moves; [`MemoryRegion::remote`]
//!   (what a peer targets) is an error for a region that grants no remote right.
//!   Memory windows ([`MemoryWindow`], type 1 and 2): a peer's access to part of a region,
//!   granted and taken back through the QP's one send queue ([`MwSendQueue`]).
//! - Completions: [`CompletionQueue`] (polling needs `&mut`; completion channels: arm,
//!   wait with a timeout, ack), [`WorkCompletion`]; [`AsyncCq`] awaits them on any
//!   executor ([`ChannelFd`] is the descriptor a reactor watches).
//! - Queue pairs: [`QueuePair`] with typed state transitions and defaults that cannot
//!   hang, one PSN per QP, depths checked against its CQs when built;
//!   [`SharedReceiveQueue`]; [`AddressHandle`] (where a UD send goes).
//! - Connecting: [`QueuePair::local_info`] and [`QueuePair::connect`] with anything that
//!   carries 26 bytes; the [`Handshake`] over any `Read + Write` (RC and UC to RTS, UD
//!   prepared); rdma_cm's [`CmId`] and [`EventChannel`], awaited with [`AsyncCmId`] and
//!   [`AsyncEventChannel`].
//! - The data path: the queues above, [`SendWr`], [`Done`]; RDMA ATOMIC WRITE
//!   ([`SendWr::atomic_write`], IBTA 1.5) where the device has it (rxe from Linux 6.2),
//!   [`Error::NotSupported`] naming the capability where it does not (rxe of Linux 6.1).
//! - The rest of verbs.h: the P_Key table ([`Context::query_pkey`]), fork safety
//!   ([`fork_init`]), static rates ([`Rate`]), regions at a chosen I/O address
//!   ([`ProtectionDomain::register_at_iova`]), and what some devices have and rxe lacks,
//!   each refused with [`Error::NotSupported`] naming the capability bit or errno: XRC
//!   ([`XrcDomain`], its SRQs [`SharedReceiveQueue::xrc`] and opened [`XrcRecvQp`]s),
//!   [`DeviceMemory`] and its [`DmRegion`]s, [`ThreadDomain`] and [`ParentDomain`], the QP's
//!   [`RateLimit`] and [`Ece`], [`NullRegion`], [`DmabufRegion`], [`Counters`], [`Flow`]s,
//!   [`WorkQueue`]s and [`RssTable`]s.
//!
//! Short programs in the repository's `examples/` show one area each on one device, with
//! the data checked (`scripts/rxe cargo run --example NAME`; the device tests run each on
//! rxe): `memory_window`, `multicast` (with the IP-level join that
//! [`QueuePair::attach_multicast`] does not make), `cq_ex`, `cq_resize`, `rereg`,
//! `ah_from_completion` ([`AddressHandle::from_completion`] after the queue took the
//! completion), and `not_supported` (the [`Error::NotSupported`] of each feature above
//! that the device lacks).
#![warn(missing_docs)]

pub use rdma_verbs_sys as ffi;

// One public path per type: the modules are private and everything is re-exported here,
// flat (as git2 does), except for three namespaces of their own: `ffi` (the raw C API),
// `wire` (the byte formats a peer sends) and `compat` (which rdma-core has which bugs).
// The doctor is a crate of its own (rdma-doctor). The layers: docs/architecture.md.
mod ah;
mod aio;
mod buf;
mod c_enum;
mod caps;
mod cm;
mod codes;
pub mod compat;
mod context;
mod conv;
mod counters;
mod cq;
mod cq_ex;
mod debug_hex;
mod device;
mod dm;
mod endpoint;
mod error;
mod event;
mod flow;
mod fork;
mod handle;
mod mr;
mod mw;
mod pd;
mod port;
mod qp;
mod queue;
mod rate;
mod srq;
mod td;
mod wc;
pub mod wire;
mod wq;
mod wr;
mod xrc;

pub use ah::{udp_sport_from_flow_label, AddressHandle, AhAttr, Remote, DEFAULT_HOP_LIMIT, GRH_LEN};
#[cfg(feature = "async-io")]
pub use aio::AsyncIoFd;
#[cfg(feature = "tokio")]
pub use aio::TokioFd;
pub use aio::{AsyncCq, ChannelFd, Readiness};
pub use buf::{Chunk, ExclusiveBuf, PdId, Segment, SendBuf, MAX_SGE};
pub use caps::{DeviceAttrEx, QpTypeCap};
pub use cm::{
    AsyncCmId, AsyncEventChannel, CmEvent, CmEventKind, CmId, ConnInfo, ConnParam, ConnectRequest, EventChannel,
    PortSpace, RejectReason, UdInfo,
};
pub use cm::{CmNotify, CmOption, CmQpAttr, JoinMode};
pub use codes::{QpType, WcOpcode, WcStatus};
pub use context::Context;
pub use counters::{CounterKind, Counters};
pub use cq::{CompletionQueue, CqBuilder};
pub use cq_ex::{ExtendedCompletion, WcFields};
pub use device::{devices, AtomicCap, Device, DeviceAttr, DeviceList, Transport};
pub use dm::{DeviceMemory, DmRegion};
pub use endpoint::{Connection, Handshake, UdPeer};
pub use error::{Error, Plane, Refused, Result, Verb, WireError};
pub use event::{AsyncEvent, AsyncEventKind, AsyncEvents, EventSource};
pub use flow::{Flow, FlowSpec};
pub use fork::{fork_init, fork_status, ForkStatus};
pub use mr::ImportedRegion;
pub use mr::{
    page_size, AccessFlags, AccessMode, Advice, AlignedBuf, DmabufRegion, Local, MemoryRegion, NullRegion,
    RegisterableBuffer, RemoteMr, RemoteWritable, ReregError,
};
pub use mw::{BoundWindow, MemoryWindow, MwBind, MwDone, MwRequest, MwSendQueue, MwType, WindowKey};
pub use pd::ProtectionDomain;
pub use port::{choose_roce_gid, Gid, GidEntry, GidType, LinkLayer, Mtu, PhysState, PortAttr, PortState};
pub use qp::{
    random_psn, InitAttr, QpAccess, QpAttrs, QpCaps, QpState, QueuePair, QueuePairBuilder, RemoteQpInfo, RtrAttr,
    RtsAttr, SendOps, DEFAULT_MAX_WR, DEFAULT_QKEY, MAX_PSN,
};
pub use qp::{Ece, MulticastMembership, RateLimit, MULTICAST_QPN};
pub use queue::{AsyncRecvQueue, AsyncSendQueue, Ticket, Tickets};
pub use queue::{
    PreparedRecv, PreparedRecvChain, PreparedRecvQueue, PreparedSend, PreparedSendChain, PreparedSendQueue,
    RecvChainMember, RecvChainQueue, RecvQueue, RecvRequest, SendChainQueue, SendQueue, SendRequest, SrqQueue,
    MAX_BATCH,
};
pub use rate::Rate;
pub use srq::{SharedReceiveQueue, SrqAttr};
pub use td::{ParentDomain, ThreadDomain};
pub use wc::{WcFlags, WorkCompletion};
pub use wq::{RssTable, WorkQueue, WqState};
pub use wr::{Done, PostError, SendWr};
pub use xrc::{XrcDomain, XrcRecvQp};
