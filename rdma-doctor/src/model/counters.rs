//! The counters of a report: each port's `counters` and `hw_counters`, the device-level
//! `hw_counters`, the statistics of the netdev under a RoCE port, and what each counter
//! is evidence of ([`CounterClass`]). Read by [`crate::facts::counters`], judged by
//! [`crate::judge::counter_findings`].

use crate::model::layer::Layer;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One counter as read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Counter {
    /// The value, `None` when the file could not be read as a number.
    pub value: Option<u64>,
    /// The file it was read from.
    pub source: String,
    /// Why it has no value.
    pub error: Option<String>,
}

/// The counters of one device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceCounters {
    /// Device-level `hw_counters`, by name (empty where the driver has none).
    pub hw_counters: BTreeMap<String, Counter>,
    /// Per port, by number.
    pub ports: BTreeMap<String, PortCounters>,
}

/// The counters of one port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortCounters {
    /// `ports/N/counters`: the InfiniBand port counters.
    pub counters: BTreeMap<String, Counter>,
    /// `ports/N/hw_counters`: the driver's.
    pub hw_counters: BTreeMap<String, Counter>,
    /// The statistics of the netdev under a RoCE port ([`crate::facts::netstat`]); `None` for
    /// an InfiniBand port, and in reports before version 5.
    #[serde(default)]
    pub netdev: Option<crate::model::counters::NetdevCounters>,
}

/// What a moved counter is evidence of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CounterClass {
    /// Retransmissions and sequence errors: packets lost, duplicated or reordered.
    Lossy,
    /// Receiver not ready: a SEND arrived before a receive was posted.
    Rnr,
    /// ACK timeouts: the responder did not answer in time.
    Timeout,
    /// The link went down or retrained.
    LinkDown,
    /// Congestion: CNPs, ECN marks, pause, transmit waits.
    Congestion,
    /// Packets discarded or received with errors.
    Discard,
}

impl CounterClass {
    /// The class of a counter, by its name (rxe, mlx5 and the InfiniBand port counters);
    /// `None` for traffic counters (`port_xmit_data`) and names not known here.
    pub fn of(name: &str) -> Option<CounterClass> {
        use CounterClass::*;
        Some(match name {
            "retry_exceeded_err"
            | "completer_retry_err"
            | "out_of_seq_request"
            | "duplicate_request"
            | "rcvd_seq_err"
            | "out_of_sequence"
            | "packet_seq_err"
            | "implied_nak_seq_err"
            | "duplicate_request_packets"
            | "roce_adp_retrans"
            | "roce_slow_restart" => Lossy,
            "rcvd_rnr_err" | "send_rnr_err" | "rnr_nak_retry_err" => Rnr,
            "local_ack_timeout_err" | "req_transport_retries_exceeded" | "roce_adp_retrans_to" => Timeout,
            "link_downed" | "link_error_recovery" => LinkDown,
            "np_cnp_sent"
            | "rp_cnp_handled"
            | "rp_cnp_ignored"
            | "np_ecn_marked_roce_packets"
            | "port_xmit_wait"
            | "rx_pause_ctrl_phy"
            | "tx_pause_ctrl_phy"
            | "rx_pause"
            | "tx_pause" => Congestion,
            "port_xmit_discards"
            | "port_rcv_errors"
            | "symbol_error"
            | "port_rcv_remote_physical_errors"
            | "port_rcv_switch_relay_errors"
            | "port_xmit_constraint_errors"
            | "port_rcv_constraint_errors"
            | "local_link_integrity_errors"
            | "excessive_buffer_overrun_errors"
            | "VL15_dropped"
            | "rx_discards_phy"
            | "tx_discards_phy"
            | "out_of_buffer"
            | "rx_icrc_encapsulated" => Discard,
            _ => return None,
        })
    }

    /// The layer a moved counter of this class concerns: the transport (data plane) or
    /// the wire (link).
    pub fn layer(self) -> Layer {
        match self {
            CounterClass::Lossy | CounterClass::Rnr | CounterClass::Timeout => Layer::DataPlane,
            CounterClass::LinkDown | CounterClass::Congestion | CounterClass::Discard => Layer::Link,
        }
    }

    /// What it means, for a person.
    pub fn meaning(self) -> &'static str {
        match self {
            CounterClass::Lossy => "retransmissions or sequence errors: packets lost, duplicated or reordered on the path (a lossy path)",
            CounterClass::Rnr => "receiver not ready: a SEND arrived at a QP with no receive posted (an application that posts its receives late, or too few)",
            CounterClass::Timeout => "ACK timeouts: a responder did not answer in time (packets lost, or the peer stalled)",
            CounterClass::LinkDown => "the link went down or retrained",
            CounterClass::Congestion => "congestion: CNPs, ECN marks, pause frames or transmit waits",
            CounterClass::Discard => "packets discarded or received with errors (a bad cable, transceiver or port, or buffers overrun)",
        }
    }

    /// Whether a move is a warning (else a note): congestion and RNR happen on healthy
    /// fabrics under load; the others are loss or a failing link.
    pub fn warns(self) -> bool {
        !matches!(self, CounterClass::Congestion | CounterClass::Rnr)
    }
}

/// One counter that moved between two samples.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CounterChange {
    /// The device.
    pub device: String,
    /// The port, `None` for a device-level hw_counter.
    pub port: Option<String>,
    /// `counters` or `hw_counters`.
    pub set: String,
    /// The counter's name.
    pub name: String,
    /// The file.
    pub source: String,
    /// The value before the probes.
    pub before: u64,
    /// The value after them.
    pub after: u64,
    /// What it is evidence of; `None` for traffic counters.
    pub class: Option<CounterClass>,
}

/// The statistics of the netdev under a RoCE port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetdevCounters {
    /// The netdev's name.
    pub name: String,
    /// `/sys/class/net/NETDEV/statistics/*`, by name, each with its file.
    pub statistics: BTreeMap<String, Counter>,
    /// The driver's `ethtool -S` statistics about pause, PFC, ECN, discards, drops and
    /// errors, by name; the source is `ethtool -S NETDEV: NAME`. Empty where the driver
    /// has none.
    pub ethtool: BTreeMap<String, Counter>,
}
