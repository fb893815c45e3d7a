//! RDMA READ bandwidth, like perftest's `ib_read_bw`, on the safe data path.
//!
//! ```text
//! read_bw [-d DEV] [-x GID] [-i PORT] [-s SIZE | -a] [-n ITERS | -D SECS] [-t DEPTH] [-o OUTS] [-Q MOD] [-l LIST]
//!         [-q QPS] [-u TIMEOUT] [-p PORT] [-R] [--report_gbits] [--json] (--loopback | [HOST])
//! ```
//!
//! Without a host argument it is the server: it waits on the TCP port (`-p`, default
//! 18515) and gives each client QP a remote-readable region holding a pattern. With a
//! host it is the client: it reads (at most `-o` READs outstanding per QP, default the
//! device's `max_qp_rd_atom` up to 16), checks every buffer it read into, and prints
//! perftest's table or, with `--json`, one object per size. A data mismatch fails both
//! sides (the client tells the server). `--loopback` runs both ends in one process.
//! Give both sides the same `-s`/`-a` and `-q`.
//!
//! Over TCP it speaks perftest's out-of-band exchange, so either side may be `ib_read_bw`
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
    bw::bw_main(bw::BwTest::Read, "read_bw", "RDMA READ bandwidth (perftest's ib_read_bw, on rdma-verbs)")
}
