//! What a change means: port states and rates compared with the last sample, counter
//! deltas turned into rates per second and judged against what is normal for the link,
//! and asynchronous events named. Pure functions over samples, so tests feed them
//! recorded values.

use std::collections::BTreeMap;
use std::path::Path;

use rdma_verbs::{AsyncEvent, AsyncEventKind, EventSource};
use serde_json::json;

use super::line::{Draft, Kind, Level};
use crate::model::counters::{CounterChange, CounterClass, DeviceCounters};

/// RNR and congestion happen on healthy fabrics under load: a warning only above this
/// share of the port's packets in the interval (1%)...
pub const LOAD_SHARE: f64 = 0.01;
/// ... and at least this many events a second (where the port counts no packets, this
/// alone is the threshold).
pub const LOAD_MIN_PER_S: f64 = 10.0;
/// Loss and ACK timeouts should stay at 0, but a single interval's blip (a burst, one
/// lost packet) is a note: a warning at this share of the port's packets (0.5%)...
pub const LOSS_SHARE: f64 = 0.005;
/// ... or when the class moved in this many intervals in a row, however little. Where
/// the port counts no packets, any move warns.
pub const LOSS_STREAK: u32 = 3;
/// How many intervals in a row each device, port and class has moved.
pub type Streaks = BTreeMap<(String, Option<u8>, CounterClass), u32>;
/// A direction of a port is saturated at this share of the link's rate (a note)...
pub const SATURATED: f64 = 0.90;
/// ... and no longer below this one (hysteresis: a link at 89-91% does not flicker).
pub const UNSATURATED: f64 = 0.80;

/// One port as sysfs shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct PortSample {
    /// `ACTIVE` from `4: ACTIVE`.
    pub state: String,
    /// `LinkUp` from `5: LinkUp`.
    pub phys_state: String,
    /// Gb/s, from `2.5 Gb/sec (1X SDR)` (0 when unreadable).
    pub rate_gbps: f64,
    /// The whole rate text.
    pub rate: String,
}

/// The ports of device `name` under `root` (`/sys/class/infiniband`), only `only` when set.
pub fn read_ports(root: &Path, name: &str, only: Option<u8>) -> BTreeMap<u8, PortSample> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(root.join(name).join("ports")) else { return out };
    for e in entries.flatten().take(256) {
        let Some(port) = e.file_name().to_str().and_then(|p| p.parse::<u8>().ok()) else { continue };
        if only.is_some_and(|o| o != port) {
            continue;
        }
        let get = |f: &str| crate::facts::collect::read_trimmed(&e.path().join(f)).unwrap_or_default();
        let after_colon = |s: String| s.split_once(": ").map_or(s.as_str(), |(_, r)| r).trim().to_owned();
        let rate = get("rate");
        let rate_gbps = rate.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        out.insert(
            port,
            PortSample {
                state: after_colon(get("state")),
                phys_state: after_colon(get("phys_state")),
                rate_gbps,
                rate,
            },
        );
    }
    out
}

/// What the watcher remembers of a port between samples.
#[derive(Debug, Clone, PartialEq)]
pub struct PortMemory {
    /// The last sample.
    pub last: PortSample,
    /// The rate it last ran at while ACTIVE (a port that comes back slower is caught).
    pub active_rate: Option<f64>,
    /// Whether each direction (transmit, receive) is saturated now.
    pub saturated: [bool; 2],
}

impl PortMemory {
    /// The memory of a port first seen as `s`.
    pub fn new(s: PortSample) -> Self {
        let active_rate = (s.state == "ACTIVE" && s.rate_gbps > 0.0).then_some(s.rate_gbps);
        PortMemory { last: s, active_rate, saturated: [false; 2] }
    }
}

/// The C name of an event kind (`IBV_EVENT_PORT_ERR`), as operators and ibv_asyncwatch
/// know it.
pub fn event_name(kind: AsyncEventKind) -> String {
    use AsyncEventKind::*;
    let name = match kind {
        CqErr => "CQ_ERR",
        QpFatal => "QP_FATAL",
        QpReqErr => "QP_REQ_ERR",
        QpAccessErr => "QP_ACCESS_ERR",
        CommEst => "COMM_EST",
        SqDrained => "SQ_DRAINED",
        PathMig => "PATH_MIG",
        PathMigErr => "PATH_MIG_ERR",
        DeviceFatal => "DEVICE_FATAL",
        PortActive => "PORT_ACTIVE",
        PortErr => "PORT_ERR",
        LidChange => "LID_CHANGE",
        PkeyChange => "PKEY_CHANGE",
        SmChange => "SM_CHANGE",
        SrqErr => "SRQ_ERR",
        SrqLimitReached => "SRQ_LIMIT_REACHED",
        QpLastWqeReached => "QP_LAST_WQE_REACHED",
        ClientReregister => "CLIENT_REREGISTER",
        GidChange => "GID_CHANGE",
        WqFatal => "WQ_FATAL",
        Unknown(n) => return format!("IBV_EVENT_{n}"),
    };
    format!("IBV_EVENT_{name}")
}

/// How bad an event is, and what it means in a few words.
fn event_level(kind: AsyncEventKind) -> (Level, &'static str) {
    use AsyncEventKind::*;
    match kind {
        DeviceFatal => (Level::Critical, "the device failed: every object on it is unusable"),
        PortErr => (Level::Critical, "the port went down"),
        CqErr => (Level::Warning, "a CQ overran or failed"),
        QpFatal => (Level::Warning, "a QP hit an error that stopped it"),
        QpReqErr => (Level::Warning, "a QP received an invalid request"),
        QpAccessErr => (Level::Warning, "a QP was refused access (rkey, rights)"),
        PathMigErr => (Level::Warning, "path migration failed"),
        SrqErr => (Level::Warning, "an SRQ failed"),
        WqFatal => (Level::Warning, "a WQ failed"),
        GidChange => (Level::Note, "the GID table changed (an address came or went on the netdev)"),
        LidChange => (Level::Note, "the port's LID changed"),
        PkeyChange => (Level::Note, "the P_Key table changed"),
        SmChange => (Level::Note, "the subnet manager changed"),
        ClientReregister => (Level::Note, "the subnet manager asked clients to re-register"),
        PortActive => (Level::Info, "the port became active"),
        CommEst | SqDrained | PathMig | SrqLimitReached | QpLastWqeReached => (Level::Info, "QP life cycle"),
        Unknown(_) => (Level::Note, "an event this doctor does not know"),
    }
}

/// The line of one asynchronous event of `device`.
pub fn event_line(device: &str, e: &AsyncEvent) -> Draft {
    let (level, meaning) = event_level(e.kind);
    let name = event_name(e.kind);
    let (port, on, source) = match e.source {
        EventSource::Device => (None, "the device".to_owned(), json!({"type": "device"})),
        EventSource::Port(p) => (Some(p), format!("port {p}"), json!({"type": "port", "port": p})),
        EventSource::Qp { qp_num, .. } => (None, format!("QP {qp_num:#x}"), json!({"type": "qp", "qp_num": qp_num})),
        EventSource::Cq { addr } => (None, format!("CQ at {addr:#x}"), json!({"type": "cq", "addr": addr})),
        EventSource::Srq { addr } => (None, format!("SRQ at {addr:#x}"), json!({"type": "srq", "addr": addr})),
        EventSource::Wq { wq_num, .. } => (None, format!("WQ {wq_num:#x}"), json!({"type": "wq", "wq_num": wq_num})),
        EventSource::Unknown { raw } => (None, format!("element {raw:#x}"), json!({"type": "unknown", "raw": raw})),
    };
    let details = json!({"event": name, "source": source, "meaning": meaning});
    Draft::new(Kind::AsyncEvent, level, device, port, format!("{name} on {on}: {meaning}"), details)
}

/// The lines of one port between two samples: state (with the port events that explain
/// it, `events`, which it consumes) and rate. Updates `mem`.
pub fn port_lines(
    device: &str,
    port: u8,
    mem: &mut PortMemory,
    now: &PortSample,
    events: &mut Vec<AsyncEvent>,
) -> Vec<Draft> {
    let mut out = Vec::new();
    let was = mem.last.clone();
    if was.state != now.state || was.phys_state != now.phys_state {
        let up = now.state == "ACTIVE";
        let level = match (was.state == "ACTIVE", up) {
            (true, false) => Level::Critical,
            (_, true) if was.state != "ACTIVE" => Level::Info,
            _ => Level::Note,
        };
        // The event that says the same thing is folded into this line.
        let want = if up { AsyncEventKind::PortActive } else { AsyncEventKind::PortErr };
        let folded: Vec<String> = if was.state != now.state {
            let mine = |e: &AsyncEvent| e.kind == want && e.source == EventSource::Port(port);
            let names = events.iter().filter(|e| mine(e)).map(|e| event_name(e.kind)).collect();
            events.retain(|e| !mine(e));
            names
        } else {
            Vec::new()
        };
        let mut message = format!("{} ({}) -> {} ({})", was.state, was.phys_state, now.state, now.phys_state);
        if let Some(e) = folded.first() {
            message += &format!(" [{e}]");
        }
        if up && now.rate_gbps > 0.0 {
            message += &format!(" at {}", now.rate);
        }
        let details = json!({
            "from": {"state": was.state, "phys_state": was.phys_state},
            "to": {"state": now.state, "phys_state": now.phys_state},
            "events": folded,
            "rate_gbps": now.rate_gbps,
        });
        out.push(Draft::new(Kind::LinkState, level, device, Some(port), message, details));
    }
    if now.state == "ACTIVE" && now.rate_gbps > 0.0 {
        if let Some(before) = mem.active_rate.filter(|r| *r != now.rate_gbps) {
            let slower = now.rate_gbps < before;
            let level = if slower { Level::Warning } else { Level::Info };
            let message = if slower {
                format!(
                    "rate dropped from {before} Gb/s to {} (a port that trains slower: a bad cable, transceiver or partner)",
                    now.rate
                )
            } else {
                format!("rate rose from {before} Gb/s to {}", now.rate)
            };
            let details = json!({"from_gbps": before, "to_gbps": now.rate_gbps, "rate": now.rate});
            out.push(Draft::new(Kind::LinkRate, level, device, Some(port), message, details));
        }
        mem.active_rate = Some(now.rate_gbps);
    }
    mem.last = now.clone();
    out
}

/// Packet counters: a port's traffic in packets (InfiniBand port counters, rxe's).
const PACKETS: [&str; 4] = ["port_xmit_packets", "port_rcv_packets", "sent_pkts", "rcvd_pkts"];
/// Counters of time, not events: listed, not counted toward a rate.
const TICKS: [&str; 1] = ["port_xmit_wait"];

/// The lines for the counters that moved between two samples `elapsed_s` apart: one per
/// device, port and class, and the traffic lines of ports whose data rate crossed
/// saturation (`rates`: each port's link rate in Gb/s; `mem`: each port's memory;
/// `streaks`: how long each class has been moving, updated here).
pub fn counter_lines(
    changes: &[CounterChange],
    elapsed_s: f64,
    rates: &BTreeMap<(String, u8), f64>,
    mem: &mut BTreeMap<(String, u8), PortMemory>,
    streaks: &mut Streaks,
) -> Vec<Draft> {
    let elapsed_s = if elapsed_s.is_finite() && elapsed_s > 0.0 { elapsed_s } else { 1.0 };
    let port_of = |c: &CounterChange| c.port.as_deref().and_then(|p| p.parse::<u8>().ok());
    let up = |c: &&CounterChange| c.after > c.before;
    // Packets per device and port (device-level counters as port None).
    let mut packets: BTreeMap<(String, Option<u8>), u64> = BTreeMap::new();
    for c in changes.iter().filter(up).filter(|c| PACKETS.contains(&c.name.as_str())) {
        *packets.entry((c.device.clone(), port_of(c))).or_default() += c.after - c.before;
    }
    let mut groups: BTreeMap<(String, Option<u8>, CounterClass), Vec<&CounterChange>> = BTreeMap::new();
    for c in changes.iter().filter(up) {
        if let Some(class) = c.class {
            groups.entry((c.device.clone(), port_of(c), class)).or_default().push(c);
        }
    }
    streaks.retain(|k, _| groups.contains_key(k));
    let mut out = Vec::new();
    for ((dev, port, class), moved) in groups {
        let streak = streaks.entry((dev.clone(), port, class)).or_default();
        *streak += 1;
        let streak = *streak;
        let events: u64 = moved.iter().filter(|c| !TICKS.contains(&c.name.as_str())).map(|c| c.after - c.before).sum();
        let rate = events as f64 / elapsed_s;
        // A device-level counter's packets are the device's, whichever port.
        let pkts = packets.get(&(dev.clone(), port)).or_else(|| packets.get(&(dev.clone(), None))).copied();
        let pkts_per_s = pkts.map(|p| p as f64 / elapsed_s);
        // Loss and timeouts: a share of the packets, once there are packets to share.
        let blips = matches!(class, CounterClass::Lossy | CounterClass::Timeout);
        let loss_threshold = pkts_per_s.filter(|p| blips && *p > 0.0).map(|p| p * LOSS_SHARE);
        let threshold = match loss_threshold {
            Some(t) => t,
            None => pkts_per_s.map_or(LOAD_MIN_PER_S, |p| (p * LOAD_SHARE).max(LOAD_MIN_PER_S)),
        };
        let above = rate >= threshold;
        let warns = match loss_threshold {
            Some(_) => above || streak >= LOSS_STREAK,
            None => class.warns() || above,
        };
        let level = if warns { Level::Warning } else { Level::Note };
        let list: Vec<String> = moved.iter().map(|c| format!("{} +{}", c.name, c.after - c.before)).collect();
        let share = match pkts_per_s {
            Some(p) if p > 0.0 => format!(", {:.2}% of {p:.0} packets/s", 100.0 * rate / p),
            _ => String::new(),
        };
        let judged = if loss_threshold.is_some() && above {
            format!("should stay at 0; above the {:.1}% that warns", 100.0 * LOSS_SHARE)
        } else if loss_threshold.is_some() && warns {
            format!("should stay at 0; {streak} intervals in a row")
        } else if loss_threshold.is_some() {
            format!(
                "should stay at 0; a blip: a warning at {:.1}% or {LOSS_STREAK} intervals in a row",
                100.0 * LOSS_SHARE
            )
        } else if class.warns() {
            "should stay at 0".to_owned()
        } else if above {
            format!("above the {threshold:.0}/s normal under load")
        } else {
            format!("below the {threshold:.0}/s normal under load")
        };
        let message = format!(
            "{}: {} in {elapsed_s:.1} s ({rate:.1}/s{share}; {judged}): {}",
            class_name(class),
            list.join(", "),
            short_meaning(class)
        );
        let counters: Vec<_> = moved
            .iter()
            .map(|c| {
                json!({"name": c.name, "set": c.set, "source": c.source, "before": c.before, "after": c.after, "delta": c.after - c.before})
            })
            .collect();
        let details = json!({
            "class": class,
            "counters": counters,
            "events": events,
            "interval_s": elapsed_s,
            "rate_per_s": rate,
            "packets_per_s": pkts_per_s,
            "threshold_per_s": if class.warns() && loss_threshold.is_none() { None } else { Some(threshold) },
            "above_threshold": (!class.warns() || loss_threshold.is_some()) && above,
            "intervals_in_a_row": streak,
            "meaning": class.meaning(),
        });
        out.push(Draft::new(Kind::Counters, level, &dev, port, message, details));
    }
    out.extend(traffic_lines(changes, elapsed_s, rates, mem));
    out
}

/// Data counters (`port_xmit_data`, `port_rcv_data`: 4-octet words) against the link rate:
/// a note when a direction reaches [`SATURATED`], an info line when it falls below
/// [`UNSATURATED`] again.
fn traffic_lines(
    changes: &[CounterChange],
    elapsed_s: f64,
    rates: &BTreeMap<(String, u8), f64>,
    mem: &mut BTreeMap<(String, u8), PortMemory>,
) -> Vec<Draft> {
    let mut words: BTreeMap<(String, u8), [u64; 2]> = BTreeMap::new();
    for c in changes.iter().filter(|c| c.after > c.before) {
        let Some(port) = c.port.as_deref().and_then(|p| p.parse::<u8>().ok()) else { continue };
        let dir = match c.name.as_str() {
            "port_xmit_data" => 0,
            "port_rcv_data" => 1,
            _ => continue,
        };
        words.entry((c.device.clone(), port)).or_default()[dir] += c.after - c.before;
    }
    let mut out = Vec::new();
    for ((dev, port), m) in mem.iter_mut() {
        let Some(link) = rates.get(&(dev.clone(), *port)).filter(|r| **r > 0.0) else { continue };
        let w = words.get(&(dev.clone(), *port)).copied().unwrap_or_default();
        for (dir, name) in [(0, "transmit"), (1, "receive")] {
            let gbps = w[dir] as f64 * 32.0 / elapsed_s / 1e9;
            let share = gbps / link;
            let (now, level) = match m.saturated[dir] {
                false if share >= SATURATED => (true, Level::Note),
                true if share < UNSATURATED => (false, Level::Info),
                _ => continue,
            };
            m.saturated[dir] = now;
            let message = if now {
                format!("{name} at {gbps:.2} Gb/s, {:.0}% of the link's {link} Gb/s: saturated", 100.0 * share)
            } else {
                format!("{name} back to {gbps:.2} Gb/s, {:.0}% of the link's {link} Gb/s", 100.0 * share)
            };
            let details = json!({"direction": name, "gbps": gbps, "link_gbps": link, "share": share, "saturated": now});
            out.push(Draft::new(Kind::Traffic, level, dev, Some(*port), message, details));
        }
    }
    out
}

/// The class as the JSON names it.
fn class_name(c: CounterClass) -> String {
    serde_json::to_value(c).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

fn short_meaning(c: CounterClass) -> &'static str {
    match c {
        CounterClass::Lossy => "packets lost, duplicated or reordered on the path",
        CounterClass::Rnr => "receivers not ready (receives posted late or too few)",
        CounterClass::Timeout => "ACK timeouts (packets lost or the peer stalled)",
        CounterClass::LinkDown => "the link went down or retrained",
        CounterClass::Congestion => "congestion (CNPs, ECN marks, pause, transmit waits)",
        CounterClass::Discard => "packets discarded or received with errors",
    }
}

/// The counters of `devices` under `root`.
pub fn sample_counters(root: &Path, devices: &[String]) -> BTreeMap<String, DeviceCounters> {
    devices.iter().map(|n| (n.clone(), crate::facts::counters::read_device(root, n))).collect()
}
