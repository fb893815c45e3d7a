//! What the device tests of this workspace share (rdma-verbs' and rdma-doctor's `device`
//! test binaries): the device under test and its addresses ([`device_name`], [`open`],
//! [`gid_index`], [`rdma_ip`]), the example binaries ([`example`]), the resource-leak
//! check ([`LeakCheck`], [`cm_leak_check`]), the child-process harness
//! ([`in_own_process`], [`isolated`], [`this_test!`]) and the runner of tools as child
//! processes ([`tool`]), and two RC QPs connected as the device's transport allows
//! ([`connect_rc`]: by hand, or through rdma_cm on iWARP).
//!
//! Device tests need a real RDMA device and fail without one: every fixture here names
//! the device or panics, none skips. `scripts/test` runs them on rxe (`scripts/rxe`).
//! A dev-dependency only (`publish = false`).

mod bed;
mod leaks;
mod link;
mod process;
pub mod tool;

pub use bed::{device_name, device_transport, example, gid_index, open, rdma_ip, resolved_library};
pub use leaks::{bind_an_id_and_drop_it, cm_leak_check, LeakCheck, ResourceCounts};
pub use link::{connect_rc, Link};
pub use process::{in_own_process, isolated};

/// This test's path in its binary (`module::name`, or `name` in a binary without
/// modules), for running it alone in a child process ([`in_own_process`]).
#[macro_export]
macro_rules! this_test {
    () => {{
        fn here() {}
        let path = std::any::type_name_of_val(&here); // "<crate>::<module>::<test>::here"
        let path = path.strip_suffix("::here").unwrap_or(path);
        path.split_once("::").map_or(path, |(_crate, rest)| rest)
    }};
}
