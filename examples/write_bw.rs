//! RDMA WRITE bandwidth, like perftest's `ib_write_bw`, on the safe data path.
//!
//! ```text
//! write_bw [-d DEV] [-x GID] [-i PORT] [-s SIZE | -a] [-n ITERS | -D SECS] [-t DEPTH] [-Q MOD] [-l LIST] [-q QPS]
//!          [-u TIMEOUT] [-p PORT] [-R] [--report_gbits] [--json] (--loopback | [HOST])
//! ```
//!
//! Without a host argument it is the server: it waits on the TCP port (`-p`, default
//! 18515), gives each client QP a remote-writable region, and at the end of each size
//! checks that every region holds the client's pattern. With a host it is the client: it
//! writes, then prints perftest's table (bandwidth in MiB/s, 2^20 bytes a second, or Gb/s
//! with `--report_gbits`) or, with `--json`, one object per size. A data mismatch fails
//! both sides (the server tells the client). `--loopback` runs both ends in one process
//! on one device. Give both sides the same `-s`/`-a` and `-q`.
//!
//! Over TCP it speaks perftest's out-of-band exchange, so either side may be
//! `ib_write_bw` (perftest 4.5; one size, `-n` iterations, nothing checked: see
//! `rdma-perftest/src/oob/mod.rs` for what is honoured); two of ours recognise each other
//! in it and go on in rdma-verbs' endpoint format, which keeps the data check. The
//! engine, shared with `read_bw` and `send_bw`, is `rdma-perftest/src/bw.rs` (the
//! `rdma-perftest` workspace crate).
//!
//! With `-R` it runs perftest's rdma_cm mode instead of TCP (the QPs connected through
//! rdma_cm, the only way on iWARP), against our tool or perftest's `-R`: the client then
//! takes the server's RDMA IP address (`rdma-perftest/src/cm.rs`).

use rdma_perftest::bw;

fn main() -> std::process::ExitCode {
    bw::bw_main(bw::BwTest::Write, "write_bw", "RDMA WRITE bandwidth (perftest's ib_write_bw, on rdma-verbs)")
}
