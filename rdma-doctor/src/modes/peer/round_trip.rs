//! A long round trip told apart from loss. A QP retransmits a request whose ACK has not
//! come back within its ACK timeout (4.096 µs × 2^code): on a path whose round trip is
//! longer than that, every request is sent again although nothing was lost, the retry
//! counters move as on a lossy path, and the retries may run out. The prober measures the
//! round trip (the TCP connect of its control connection: one SYN and its answer, which
//! the peer's kernel sends) and, where it exceeds the ACK timeout of its QPs, says so
//! instead of blaming drops.

use std::time::Duration;

use super::bed::{ack_timeout, RETRY_CNT};

/// The path's measured round trip and the ACK timeout code of the prober's QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RoundTrip {
    /// The round trip, measured.
    pub rtt: Duration,
    /// The QPs' ACK timeout code.
    pub code: u8,
}

/// 4.096 µs × 2^code.
pub(crate) fn ack_timeout_of(code: u8) -> Duration {
    Duration::from_nanos(4096u64 << code.min(31))
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

impl RoundTrip {
    /// The round trip `rtt` under QPs made for the doctor's `timeout`.
    pub(crate) fn new(rtt: Duration, timeout: Duration) -> RoundTrip {
        RoundTrip { rtt, code: ack_timeout(timeout) }
    }

    /// The QPs' ACK timeout.
    pub(crate) fn ack_timeout(&self) -> Duration {
        ack_timeout_of(self.code)
    }

    /// Whether the round trip outgrew the ACK timeout.
    pub(crate) fn outgrows(&self) -> bool {
        self.rtt > self.ack_timeout()
    }

    /// The numbers, for a check that passed: `round trip 0.4 ms (TCP connect)`.
    pub(crate) fn measured(&self) -> String {
        format!("round trip {} (TCP connect)", ms(self.rtt))
    }

    /// The QPs' ACK timeout, for the QP connection's check.
    pub(crate) fn qp_timeout(&self) -> String {
        format!("ACK timeout {} (code {}, {RETRY_CNT} retries)", ms(self.ack_timeout()), self.code)
    }

    /// What happened, in place of "lost packets".
    pub(crate) fn words(&self) -> String {
        format!(
            "a long round trip, not loss: the path's round trip ({}, measured by the control connection's TCP connect) \
             outgrew the ACK timeout of the probe's QPs ({}, code {}), so they sent again requests whose \
             ACKs were still on their way",
            ms(self.rtt),
            ms(self.ack_timeout()),
            self.code
        )
    }

    /// What to do: a timeout past the round trip, and the path's latency.
    pub(crate) fn fix(&self) -> String {
        // The smallest code whose timeout is twice the round trip, and the --timeout that
        // gives the probe's QPs that code (`ack_timeout`: 7 tries in 4/5 of it).
        let want = (self.code..=24).find(|c| ack_timeout_of(*c) >= self.rtt * 2).unwrap_or(24);
        let secs = ack_timeout_of(want).as_secs_f64() * f64::from(RETRY_CNT + 1) / 0.8;
        format!(
            "raise the QP's ACK timeout past the round trip (code {want}, {}, in the application's \
             ibv_modify_qp / rdma_cm's timeout; this probe: --timeout {:.0} or more), and find what \
             adds latency on the path (a shaper or netem qdisc: `tc qdisc show`; a long or \
             congested link: `ping` the peer's RDMA address)",
            ms(ack_timeout_of(want)),
            secs.ceil()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_trip_past_the_ack_timeout_is_named_with_both_numbers_and_a_timeout_that_fits() {
        // --timeout 1: code 14, 67.1 ms; netem delay 100 ms each way: 200 ms.
        let rt = RoundTrip::new(Duration::from_micros(200_400), Duration::from_secs(1));
        assert_eq!((rt.code, rt.ack_timeout()), (14, Duration::from_nanos(4096 << 14)));
        assert!(rt.outgrows());
        let w = rt.words();
        assert!(w.starts_with("a long round trip, not loss: the path's round trip (200.4 ms"), "{w}");
        assert!(w.contains("ACK timeout of the probe's QPs (67.1 ms, code 14)"), "{w}");
        let f = rt.fix();
        assert!(f.contains("code 17, 536.9 ms") && f.contains("--timeout 5 or more"), "{f}");
        assert!(f.contains("tc qdisc show"), "{f}");
        // The default 5 s: code 17, 537 ms, beyond a 100 ms delay.
        let rt = RoundTrip::new(Duration::from_millis(200), Duration::from_secs(5));
        assert_eq!(rt.code, 17);
        assert!(!rt.outgrows());
        assert_eq!(rt.qp_timeout(), "ACK timeout 536.9 ms (code 17, 6 retries)");
        assert_eq!(
            RoundTrip::new(Duration::from_micros(360), Duration::from_secs(5)).measured(),
            "round trip 0.4 ms (TCP connect)"
        );
    }
}
