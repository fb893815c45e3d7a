//! Safe Rust over the Linux RDMA verbs. The safe objects come with the "safe core" issue.
#![warn(missing_docs)]
pub use rdma_sys as ffi;
