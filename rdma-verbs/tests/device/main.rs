//! Device tests of the safe crate: they need a real RDMA device, and `scripts/test` runs
//! them on rxe (`scripts/rxe`). Without a device each of them fails; a plain
//! `cargo test` lists them as ignored.
//!
//! Every test takes a [`LeakCheck`] first: when the test ends, the device's resource
//! counts (PD, MR, CQ, QP, SRQ, contexts, CM ids, as `rdma resource show` prints them)
//! must be back where they started. Tests run one at a time (`--test-threads=1`), so the
//! counts are this process's own (and those of the processes it started, which are gone
//! by then). Tests that use rdma_cm run in a process of their own, which takes the check
//! (cm.rs, faults.rs) after librdmacm's first use: librdmacm keeps one device context
//! open from then to the end of the process, so such a check counts from ctx + 1
//! (`cm::cm_leak_check`, which checks that the first use left exactly that).

/// `this_test!()`: this test's path in the binary, for running it alone in a child
/// process (cm.rs and faults.rs do).
#[macro_use]
extern crate rdma_test_support;

mod access;
mod acm;
mod aio;
mod alloc;
mod atomic_write;
mod awaited;
mod basics;
mod chain;
mod cm;
mod cm_more;
mod cq;
mod cq_budget;
mod cq_ex;
mod cq_resize;
mod datapath;
mod datapath2;
mod datapath_ext;
/// The examples in the docs, each a program in `doc/`, run.
mod doc_examples;
mod endpoint;
mod events;
/// The area examples (examples/memory_window.rs and the others) run on the device.
mod examples_areas;
mod faults;
mod import;
/// libibverbs and librdmacm hidden: Error::Library with `dlopen`, no start when linked.
mod library;
mod mr;
mod mw;
mod prepared;
mod prepared_recv;
mod pyverbs_parity;
mod qp;
mod recv_chain;
mod rereg;
mod rest;
mod tools;
mod ud_more;
mod xrc_dm;

// The test bed, shared with rdma-doctor's device tests (rdma-test-support).
pub use rdma_test_support::{connect_rc, device_name, example, gid_index, open, LeakCheck, Link, ResourceCounts};
