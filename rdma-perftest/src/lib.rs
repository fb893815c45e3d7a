//! The engine of rdma-verbs' perftest-style tools. The bandwidth tools (`write_bw`,
//! `read_bw`, `send_bw`) are thin `main`s over [`bw::bw_main`]; the latency tools
//! (`write_lat`, `send_lat`, `read_lat`) over [`perftest::lat_main`]. The tools themselves
//! are the root package's examples (`cargo run --example write_bw`); this crate is not
//! published. Over TCP they speak perftest's out-of-band exchange ([`oob`]: which version
//! checks and parameter exchanges are honoured, and how our data check survives), so
//! each talks to perftest's tool of the same name; with `-R`, perftest's rdma_cm mode
//! ([`cm`]), the one that runs on iWARP.

pub mod bw;
pub mod cm;
pub mod oob;
pub mod perftest;
