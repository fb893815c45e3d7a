//! SEND bandwidth, like perftest's `ib_send_bw`, on the safe data path.
//!
//! ```text
//! send_bw [-d DEV] [-x GID] [-i PORT] [-s SIZE | -a] [-n ITERS | -D SECS] [-t DEPTH] [-r RX_DEPTH] [-Q MOD]
//!         [-l LIST] [-q QPS] [-u TIMEOUT] [-p PORT] [-R] [--report_gbits] [--json] (--loopback | [HOST])
//! ```
//!
//! Without a host argument it is the server: it waits on the TCP port (`-p`, default
//! 18515), keeps `-r` receives posted per QP (default 512) and checks every message
//! (the pattern and the message's number). With a host it is the client: it sends, never
//! more than the server has receives posted (the server writes it credits), and prints
//! perftest's table or, with `--json`, one object per size; unlike `ib_send_bw`, only
//! the client reports. A data mismatch fails both sides (the server tells the client).
//! `--loopback` runs both ends in one process. Give both sides the same `-s`/`-a` and
//! `-q`.
//!
//! Over TCP it speaks perftest's out-of-band exchange, so either side may be `ib_send_bw`
//! (perftest 4.5; one size, `-n` iterations, nothing checked: see
//! `rdma-perftest/src/oob/mod.rs`); two of ours recognise each other in it and go on in
//! rdma-verbs' endpoint format, which keeps the data check. The engine is
//! `rdma-perftest/src/bw.rs` (the `rdma-perftest` workspace crate).
//!
//! With `-R` it runs perftest's rdma_cm mode instead of TCP (the QPs connected through
//! rdma_cm, the only way on iWARP), against our tool or perftest's `-R`: the client then
//! takes the server's RDMA IP address (`rdma-perftest/src/cm.rs`).

use rdma_perftest::bw;

fn main() -> std::process::ExitCode {
    bw::bw_main(bw::BwTest::Send, "send_bw", "SEND bandwidth (perftest's ib_send_bw, on rdma-verbs)")
}
