//! The examples in the docs, run on the device: each file in `doc/` is a whole program
//! that the docs of a type (or of the crate) show with `include_str!`, and a test here
//! `include!`s it and runs its `main`, so an example that stops working fails here.
//!
//! | file | shown in the docs of |
//! | --- | --- |
//! | `doc/quickstart.rs` | the crate (`src/lib.rs`) |
//! | `doc/qp_connect.rs` | `QueuePair` |
//! | `doc/cq_wait.rs` | `CompletionQueue` |
//! | `doc/cq_ex.rs` | `ExtendedCompletion` |
//! | `doc/handshake.rs` | `Handshake` |
//! | `doc/cm_client.rs` | `CmId` |
//! | `doc/async_cq.rs` | `AsyncCq` |
//! | `doc/awaited.rs` | `AsyncSendQueue` |
//! | `doc/async_cm.rs` | `AsyncCmId` |
//! | `doc/prepared.rs` | `SendChainQueue`, `PreparedRecvQueue` |
//! | `doc/recv_chain.rs` | `RecvChainQueue` |
//! | `doc/mw.rs` | `MemoryWindow` |
//! | `doc/atomic_write.rs` | `SendWr::atomic_write` |

use std::fmt::Display;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use crate::LeakCheck;

/// Runs an example's `main` on a thread of its own and fails when it fails, panics or
/// is not done within a minute (a lost completion would leave an example polling forever).
fn run<E: Display + 'static>(main: fn() -> Result<(), E>) {
    const LIMIT: Duration = Duration::from_secs(60);
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || tx.send(main().map_err(|e| e.to_string())));
    match rx.recv_timeout(LIMIT) {
        Ok(result) => result.unwrap_or_else(|e| panic!("the example failed: {e}")),
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("the example did not finish within {LIMIT:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the example panicked"),
    }
}

mod quickstart {
    include!("doc/quickstart.rs");

    #[test]
    #[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
    fn the_crate_level_example_sizes_its_cq_for_its_qp_and_sends_hello_to_itself() {
        let _leaks = super::LeakCheck::new();
        super::run(main);
    }
}

mod qp_connect {
    include!("doc/qp_connect.rs");

    #[test]
    #[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
    fn the_queue_pair_example_connects_two_qps_by_local_info_and_writes_across() {
        let _leaks = super::LeakCheck::new();
        super::run(main);
    }
}

mod cq_wait {
    include!("doc/cq_wait.rs");

    #[test]
    #[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
    fn the_completion_queue_example_arms_drains_and_waits_until_every_message_arrived() {
        let _leaks = super::LeakCheck::new();
        super::run(main);
    }
}

mod cq_ex {
    include!("doc/cq_ex.rs");

    #[test]
    #[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
    fn the_extended_cq_example_receives_a_send_with_immediate_data_through_poll_extended() {
        let _leaks = super::LeakCheck::new();
        super::run(main);
    }
}

mod handshake {
    include!("doc/handshake.rs");

    #[test]
    #[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
    fn the_handshake_example_connects_over_tcp_and_sends_both_ways() {
        let _leaks = super::LeakCheck::new();
        super::run(main);
    }
}

mod cm_client {
    include!("doc/cm_client.rs");

    /// In a process of its own, with the leak check of a process that uses rdma_cm
    /// (librdmacm keeps a device context open until the process ends: see cm.rs).
    #[test]
    #[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
    fn the_cm_id_example_connects_through_rdma_cm_and_talks_with_its_server() {
        crate::cm::isolated(this_test!(), || super::run(main));
    }
}

mod async_cq {
    include!("doc/async_cq.rs");

    #[test]
    #[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
    fn the_async_cq_example_awaits_a_send_to_itself_on_tokio() {
        let _leaks = super::LeakCheck::new();
        super::run(main);
    }
}

mod awaited {
    include!("doc/awaited.rs");

    #[test]
    #[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
    fn the_awaited_queues_example_sends_to_itself_and_awaits_each_ticket_on_tokio() {
        let _leaks = super::LeakCheck::new();
        super::run(main);
    }
}

mod async_cm {
    include!("doc/async_cm.rs");

    /// In a process of its own, as the other rdma_cm example.
    #[test]
    #[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
    fn the_async_cm_id_example_accepts_in_a_loop_and_connects_two_clients_on_tokio() {
        crate::cm::isolated(this_test!(), || super::run(main));
    }
}

mod prepared {
    include!("doc/prepared.rs");

    #[test]
    #[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
    fn the_prepared_example_sends_a_chain_into_prepared_receives_and_posts_both_again_each_round() {
        let _leaks = super::LeakCheck::new();
        super::run(main);
    }
}

mod recv_chain {
    include!("doc/recv_chain.rs");

    #[test]
    #[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
    fn the_recv_chain_example_fills_a_receive_chain_with_a_send_chain_and_posts_both_again_each_round() {
        let _leaks = super::LeakCheck::new();
        super::run(main);
    }
}

mod mw {
    include!("doc/mw.rs");

    #[test]
    #[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
    fn the_memory_window_example_binds_writes_through_the_window_and_invalidates_it() {
        let _leaks = super::LeakCheck::new();
        super::run(main);
    }
}

mod atomic_write {
    include!("doc/atomic_write.rs");

    #[test]
    #[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
    fn the_atomic_write_example_stores_8_bytes_at_once_or_says_the_device_lacks_it() {
        let _leaks = super::LeakCheck::new();
        super::run(main);
    }
}
