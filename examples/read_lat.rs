//! RDMA READ latency (perftest's ib_read_lat): the client times read round trips; the server only serves its region.
//!
//! ```text
//! read_lat [-d DEV] [-x GID] [-i PORT] [-s SIZE | -a] [-n ITERS] [-u TIMEOUT] [-p TCP_PORT] [--json] (--loopback | [HOST])
//! ```
//!
//! Without a host it is the server; with one, the client, which prints perftest's latency
//! table (t_min, t_max, t_typical = median, t_avg, t_stdev, 99% and 99.9%, in
//! microseconds; samples sorted, the two largest dropped) or one JSON object per size.
//! `--loopback` runs both ends in one process on one device. The exchange is
//! rdma-verbs' endpoint handshake over TCP, not perftest's: it talks to itself only.

use rdma_perftest::perftest;

fn main() -> std::process::ExitCode {
    perftest::lat_main(perftest::LatTest::Read, "read_lat", "RDMA READ latency")
}
