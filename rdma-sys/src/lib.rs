//! Raw bindings to libibverbs and librdmacm (rdma-core).
//!
//! Most users reach this crate through the safe one, as `rdma_verbs::ffi`.
//!
//! The bindings come from bindgen, run by the build script on the installed headers
//! (found with pkg-config) when libclang can be loaded; otherwise, and on docs.rs, from
//! the checked-in `src/bindings.rs`, made from rdma-core 44 (libibverbs 1.14.44) on
//! x86_64, which the build script uses only there and with an rdma-core at least that
//! new. The `bindgen` feature
//! makes generation mandatory. [`PREGENERATED`] says which this build used; a test
//! compares the two item by item for everything the crates use.
//!
//! The exception is [`inline`]: the `static inline` verbs of `<infiniband/verbs.h>`,
//! which have no symbol in the library. They are ported to Rust with the same names and
//! call the provider's function pointers exactly as the C inlines do, so the data path
//! costs what it costs in C.
//!
//! With the feature `dlopen`, nothing is linked: the libraries are loaded when first
//! needed, and [`dl::load`] says which one is missing, unreadable or too old. Call it (the
//! safe crate does, in `devices` and `Context::open` and when it makes an rdma_cm event
//! channel) before any other function of that library.
//!
//! C enums are transparent newtypes with associated constants
//! (`ibv_wc_status::IBV_WC_SUCCESS`), never Rust enums: a provider may hand back a
//! value this crate has never heard of, and that must stay plain data.
#![warn(missing_docs)]

#[allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    missing_docs,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
mod bindings {
    #[cfg(not(feature = "dlopen"))]
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
    // The same items, with each C function a wrapper over `dl`'s tables (build.rs).
    #[cfg(feature = "dlopen")]
    include!(concat!(env!("OUT_DIR"), "/bindings_dl.rs"));
}
pub use bindings::*;

pub mod dl;
pub mod inline;
pub use inline::*;

/// True when this build uses the checked-in (pregenerated) bindings instead of
/// generating them from the installed headers.
pub const PREGENERATED: bool = cfg!(rdma_verbs_sys_pregenerated);

/// `__VERBS_ABI_IS_EXTENDED`: the value of `ibv_context::abi_compat` when the
/// context is embedded in a `verbs_context` (every provider since rdma-core 13).
pub const VERBS_ABI_IS_EXTENDED: *mut core::ffi::c_void = usize::MAX as *mut core::ffi::c_void;

#[cfg(not(feature = "dlopen"))]
extern "C" {
    /// The exported `ibv_query_port` symbol, which fills the old (compat)
    /// port attribute layout. Call [`inline::ibv_query_port`] instead, as C
    /// code does through the header's macro.
    #[link_name = "ibv_query_port"]
    pub fn ibv_query_port_compat(
        context: *mut ibv_context,
        port_num: u8,
        port_attr: *mut _compat_ibv_port_attr,
    ) -> core::ffi::c_int;
}
