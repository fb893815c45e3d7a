//! RDMA READ latency (perftest's ib_read_lat): the client times read round trips; the server only serves its region.
//!
//! ```text
//! read_lat [-d DEV] [-x GID] [-i PORT] [-s SIZE | -a] [-n ITERS] [-u TIMEOUT] [-p PORT] [-R] [--json] (--loopback | [HOST])
//! ```
//!
//! Without a host it is the server; with one, the client, which prints perftest's latency
//! table (t_min, t_max, t_typical = median, t_avg, t_stdev, 99% and 99.9%, in
//! microseconds; samples sorted, the two largest dropped) or one JSON object per size.
//! `--loopback` runs both ends in one process on one device. Over TCP it speaks
//! perftest's out-of-band exchange, so either side may be `ib_read_lat` (perftest 4.5, one
//! size); two of ours recognise each other in it and go on in rdma-verbs' endpoint format.
//!
//! With `-R` it runs perftest's rdma_cm mode instead of TCP (the QPs connected through
//! rdma_cm, the only way on iWARP), against our tool or perftest's `-R`: the client then
//! takes the server's RDMA IP address (`rdma-perftest/src/cm.rs`).

use rdma_perftest::perftest;

fn main() -> std::process::ExitCode {
    perftest::lat_main(perftest::LatTest::Read, "read_lat", "RDMA READ latency")
}
