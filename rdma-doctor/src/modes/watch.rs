//! `rdma-doctor --watch [SECONDS]`: watches the devices until Ctrl-C or SIGTERM and prints
//! one line per event or change, worst first within an interval, as text or JSON lines
//! (docs/doctor-json.md, "`--watch`").
//!
//! What it watches, on every device (`-d NAME`: one) and port (`-p N`: one):
//!
//! - **Asynchronous events** of each device (`ibv_get_async_event` on a context the watcher
//!   opens, through [`rdma_verbs::AsyncEvents`]): port error and active, GID, LID, P_Key and
//!   SM changes, client re-register, device fatal, each the moment it arrives. QP, CQ, SRQ
//!   and WQ events go only to the process that owns the object: the watcher sees them for
//!   no one else's QPs (their traces are the counters below and the kernel log).
//! - **Link state and rate** (`/sys/class/infiniband/DEV/ports/N/{state,phys_state,rate}`),
//!   read at every wake-up: a port that leaves ACTIVE is critical, one that comes back is
//!   info; a port whose rate drops (or that comes back slower than it last ran) warns.
//! - **Counters** (the port counters and hw_counters of [`crate::facts::counters`]) every
//!   interval, as rates per second by class: link downs and discards warn at their first
//!   move; loss and ACK timeouts, which should stay at zero too, warn at 0.5% of the
//!   port's packets or when they move in three intervals in a row, and a smaller blip
//!   (one lost packet in thousands) is a note ([`judge::LOSS_SHARE`],
//!   [`judge::LOSS_STREAK`]; where the port counts no packets, at their first move);
//!   RNR and congestion, which
//!   healthy fabrics show under load, are notes until their rate passes 1% of the port's
//!   packets and 10 a second ([`judge::LOAD_SHARE`], [`judge::LOAD_MIN_PER_S`]). Where the
//!   port counts its data (`port_xmit_data`), a direction above 90% of the link's rate is
//!   a note (saturated), and an info line when it falls below 80% again.
//! - **MTU**: the MTU of the netdev under each RoCE port (`/sys/class/net/NAME/mtu`) and the
//!   port's active MTU, read at every wake-up: a change is a note, a fall of the active MTU
//!   a warning (`watch/mtu.rs`).
//! - **Devices** that go away or appear.
//! - **The kernel log** from the moment the watch began (`/dev/kmsg`, where readable):
//!   each RDMA line, a warning when it reports an errno or is known trouble (`timeout
//!   event on QP 0x1a2b`): the trace of other programs' QP errors.
//!
//! It wakes at each interval, when an event arrives and on a signal (the event queues'
//! descriptors and a self-pipe of [`signal_hook`] in one `poll`), so it never blocks in
//! `ibv_get_async_event`. The first line says what is watched; the last one, after Ctrl-C
//! or SIGTERM, sums up; the exit status is then 0. Like any program with a device open,
//! the watcher holds up the removal of a device whose driver cannot disassociate its
//! users (rxe: `rdma link delete` waits until the watcher ends).

mod judge;
mod kernel_log;
mod line;
mod mtu;
mod wake;

use std::collections::BTreeMap;
use std::io::{ErrorKind, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use rdma_verbs::AsyncEvents;
use serde_json::json;

pub use judge::{LOAD_MIN_PER_S, LOAD_SHARE, LOSS_SHARE, LOSS_STREAK, SATURATED, UNSATURATED};
pub use line::{Kind, Level, Line};

use crate::model::counters::DeviceCounters;
use judge::PortMemory;
use line::Draft;
use wake::{wait, Stop};

/// The shortest interval accepted, seconds.
pub const MIN_INTERVAL_S: f64 = 0.1;
/// The longest interval accepted, seconds (one hour).
pub const MAX_INTERVAL_S: f64 = 3600.0;
/// The most events read from one device at one wake-up: a device that floods does not
/// starve the others or the clock.
const MAX_EVENTS_PER_WAKE: usize = 256;

/// What to watch and how.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// Only this device (default: every device, including ones that appear later).
    pub device: Option<String>,
    /// Only this port.
    pub port: Option<u8>,
    /// How often counters are read (ports are also read at every event).
    pub interval: Duration,
    /// JSON lines instead of text.
    pub json: bool,
    /// Where the kernel lists devices (`/sys/class/infiniband`; a recorded tree in tests).
    pub root: PathBuf,
    /// Where the kernel lists netdevs (`/sys/class/net`; a recorded tree in tests).
    pub net_root: PathBuf,
    /// Open each device for its asynchronous events (tests over a recorded tree cannot).
    pub async_events: bool,
    /// Follow the kernel log (tests over a recorded tree do not).
    pub kernel_log: bool,
}

impl WatchOptions {
    /// Every device, every port, at `interval`, text.
    pub fn new(interval: Duration) -> Self {
        WatchOptions {
            device: None,
            port: None,
            interval,
            json: false,
            root: PathBuf::from(crate::facts::counters::SYSFS_ROOT),
            net_root: PathBuf::from("/sys/class/net"),
            async_events: true,
            kernel_log: true,
        }
    }
}

/// `SECONDS` of `--watch`: a number from [`MIN_INTERVAL_S`] to [`MAX_INTERVAL_S`].
pub fn parse_interval(v: &str) -> Result<Duration, String> {
    let secs: f64 = v.parse().map_err(|_| format!("'{v}' is not a number of seconds"))?;
    if !(MIN_INTERVAL_S..=MAX_INTERVAL_S).contains(&secs) {
        return Err(format!("{v}: give an interval from {MIN_INTERVAL_S} to {MAX_INTERVAL_S} seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The watcher's state between wake-ups.
struct Watcher {
    opts: WatchOptions,
    /// Present devices, with their event queue where it opened.
    devices: BTreeMap<String, Option<AsyncEvents>>,
    ports: BTreeMap<(String, u8), PortMemory>,
    /// Each port's MTUs at the last wake-up.
    mtus: BTreeMap<(String, u8), mtu::MtuSample>,
    counters: BTreeMap<String, DeviceCounters>,
    counters_at: Instant,
    /// How many intervals in a row each class of counters has moved.
    streaks: judge::Streaks,
    /// The kernel log, or why it is not followed.
    log: Result<kernel_log::KernelLog, String>,
}

impl Watcher {
    /// Opens and samples the devices; `Err` when there is none to watch. The drafts are
    /// the first line and any device that could not be opened for its events.
    fn start(opts: WatchOptions) -> Result<(Watcher, Vec<Draft>), String> {
        let mut w = Watcher {
            opts,
            devices: BTreeMap::new(),
            ports: BTreeMap::new(),
            mtus: BTreeMap::new(),
            counters: BTreeMap::new(),
            counters_at: Instant::now(),
            streaks: BTreeMap::new(),
            log: Err("not asked for".into()),
        };
        if w.opts.kernel_log {
            w.log = kernel_log::KernelLog::open();
        }
        let names = w.listed();
        if names.is_empty() {
            let which = w.opts.device.as_deref().map_or("no RDMA device".to_owned(), |d| format!("no device {d}"));
            return Err(format!("nothing to watch: {which} in {}", w.opts.root.display()));
        }
        let mut drafts = Vec::new();
        for name in &names {
            drafts.extend(w.add(name));
        }
        if let Some(p) = w.opts.port {
            if !w.ports.keys().any(|(_, port)| *port == p) {
                return Err(format!("nothing to watch: no port {p} on {}", names.join(", ")));
            }
        }
        w.counters = judge::sample_counters(&w.opts.root, &names);
        w.counters_at = Instant::now();
        drafts.insert(0, w.first_line());
        Ok((w, drafts))
    }

    /// The devices the kernel lists now, among those asked for.
    fn listed(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.opts.root) else { return Vec::new() };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| self.opts.device.as_ref().is_none_or(|d| d == n))
            .collect();
        names.sort();
        names
    }

    /// Starts watching device `name`: its event queue and its ports.
    fn add(&mut self, name: &str) -> Vec<Draft> {
        let mut drafts = Vec::new();
        let events = if self.opts.async_events {
            match rdma_verbs::Context::open(Some(name)).and_then(|c| c.async_events()) {
                Ok(e) => Some(e),
                Err(e) => {
                    let message = format!(
                        "cannot open {name} for its asynchronous events (ports and counters are still watched): {e}"
                    );
                    drafts.push(events_lost(name, message, &e.to_string()));
                    None
                }
            }
        } else {
            None
        };
        for (port, s) in judge::read_ports(&self.opts.root, name, self.opts.port) {
            let mtus = self.read_mtu(name, port, events.as_ref());
            self.mtus.insert((name.to_owned(), port), mtus);
            self.ports.insert((name.to_owned(), port), PortMemory::new(s));
        }
        self.devices.insert(name.to_owned(), events);
        drafts
    }

    /// The MTUs of port `port` of device `name` now (the active MTU through `events`' context).
    fn read_mtu(&self, name: &str, port: u8, events: Option<&AsyncEvents>) -> mtu::MtuSample {
        let ctx = events.map(AsyncEvents::context);
        mtu::MtuSample::read(&self.opts.root, &self.opts.net_root, name, port, ctx)
    }

    fn first_line(&self) -> Draft {
        let mut what = Vec::new();
        let mut devices = serde_json::Map::new();
        for (name, events) in &self.devices {
            let mut ports = serde_json::Map::new();
            for ((_, port), m) in self.ports.range((name.clone(), 0)..=(name.clone(), u8::MAX)) {
                what.push(format!("{name}/{port} {} {}", m.last.state, m.last.rate));
                ports.insert(
                    port.to_string(),
                    json!({"state": m.last.state, "phys_state": m.last.phys_state, "rate_gbps": m.last.rate_gbps}),
                );
            }
            devices.insert(name.clone(), json!({"async_events": events.is_some(), "ports": ports}));
        }
        let secs = self.opts.interval.as_secs_f64();
        let log = match &self.log {
            Ok(_) => "the kernel log".to_owned(),
            Err(e) => format!("not the kernel log ({e})"),
        };
        let message = format!(
            "{} every {secs} s: async events, link state and rate, MTU, counters, {log}; Ctrl-C or SIGTERM ends",
            what.join(", ")
        );
        let details = json!({
            "interval_s": secs,
            "devices": devices,
            "all_devices": self.opts.device.is_none(),
            "kernel_log": self.log.is_ok(),
            "kernel_log_error": self.log.as_ref().err(),
            "thresholds": {"load_share": LOAD_SHARE, "load_min_per_s": LOAD_MIN_PER_S, "loss_share": LOSS_SHARE, "loss_streak": LOSS_STREAK, "saturated": SATURATED, "unsaturated": UNSATURATED},
        });
        Draft { kind: Kind::Watching, severity: Level::Info, device: None, port: None, message, details }
    }

    /// One wake-up: devices gone or new, pending events, port changes, and at a `tick`
    /// the counters.
    fn wake(&mut self, tick: bool, broken: &[String]) -> Vec<Draft> {
        let mut drafts = Vec::new();
        let listed = self.listed();
        let gone: Vec<String> = self.devices.keys().filter(|d| !listed.contains(d)).cloned().collect();
        for name in gone {
            self.devices.remove(&name);
            self.ports.retain(|(d, _), _| d != &name);
            self.mtus.retain(|(d, _), _| d != &name);
            self.counters.remove(&name);
            let message = format!("{name} is gone from {}", self.opts.root.display());
            drafts.push(Draft::new(Kind::Device, Level::Critical, &name, None, message, json!({"present": false})));
        }
        let new: Vec<String> = listed.into_iter().filter(|n| !self.devices.contains_key(n)).collect();
        for name in &new {
            let message = format!("{name} appeared");
            drafts.push(Draft::new(Kind::Device, Level::Note, name, None, message, json!({"present": true})));
            drafts.extend(self.add(name));
            self.counters.insert(name.clone(), crate::facts::counters::read_device(&self.opts.root, name));
        }
        for name in broken {
            if let Some(slot) = self.devices.get_mut(name) {
                *slot = None;
                let message = format!("{name}'s event queue failed; its events are no longer watched");
                drafts.push(events_lost(name, message, "poll: error or hang-up"));
            }
        }
        let names: Vec<String> = self.devices.keys().cloned().collect();
        for name in &names {
            let mut events = Vec::new();
            if let Some(Some(queue)) = self.devices.get(name) {
                for _ in 0..MAX_EVENTS_PER_WAKE {
                    match queue.try_next() {
                        Ok(Some(e)) => events.push(e),
                        Ok(None) => break,
                        Err(e) => {
                            let message = format!("reading {name}'s events failed; they are no longer watched: {e}");
                            drafts.push(events_lost(name, message, &e.to_string()));
                            self.devices.insert(name.clone(), None);
                            break;
                        }
                    }
                }
            }
            // Port events for a port outside `-p` are not shown.
            if let Some(p) = self.opts.port {
                events.retain(|e| !matches!(e.source, rdma_verbs::EventSource::Port(q) if q != p));
            }
            for (port, now) in judge::read_ports(&self.opts.root, name, self.opts.port) {
                match self.ports.get_mut(&(name.clone(), port)) {
                    Some(mem) => drafts.extend(judge::port_lines(name, port, mem, &now, &mut events)),
                    None => {
                        self.ports.insert((name.clone(), port), PortMemory::new(now));
                    }
                }
                let mtus = self.read_mtu(name, port, self.devices.get(name).and_then(Option::as_ref));
                match self.mtus.get_mut(&(name.clone(), port)) {
                    Some(was) => drafts.extend(mtu::mtu_lines(name, port, was, &mtus)),
                    None => {
                        self.mtus.insert((name.clone(), port), mtus);
                    }
                }
            }
            drafts.extend(events.iter().map(|e| judge::event_line(name, e)));
        }
        if let Ok(log) = &mut self.log {
            drafts.extend(log.lines());
        }
        if tick {
            let now = judge::sample_counters(&self.opts.root, &names);
            let elapsed = self.counters_at.elapsed().as_secs_f64();
            self.counters_at = Instant::now();
            let mut changes = crate::facts::counters::changes(&self.counters, &now);
            if let Some(p) = self.opts.port {
                changes.retain(|c| c.port.as_deref().is_none_or(|q| q == p.to_string()));
            }
            let rates = self.ports.iter().map(|(k, m)| (k.clone(), m.last.rate_gbps)).collect();
            drafts.extend(judge::counter_lines(&changes, elapsed, &rates, &mut self.ports, &mut self.streaks));
            self.counters = now;
        }
        drafts
    }
}

/// The warning that device `name`'s asynchronous events are not (or no longer) watched:
/// `message` says why, `error` goes into the details.
fn events_lost(name: &str, message: String, error: &str) -> Draft {
    Draft::new(Kind::Error, Level::Warning, name, None, message, json!({ "error": error }))
}

/// Prints lines and counts them.
struct Printer<'a> {
    out: &'a mut dyn Write,
    json: bool,
    start: Instant,
    counts: BTreeMap<Level, u64>,
}

impl Printer<'_> {
    /// Stamps and prints `drafts` worst first.
    fn print(&mut self, mut drafts: Vec<Draft>) -> std::io::Result<()> {
        if drafts.is_empty() {
            return Ok(());
        }
        line::worst_first(&mut drafts);
        let (now, elapsed) = (SystemTime::now(), self.start.elapsed().as_secs_f64());
        let mut text = String::new();
        for d in drafts {
            let l = d.stamp(now, elapsed);
            if !matches!(l.kind, Kind::Watching | Kind::Summary) {
                *self.counts.entry(l.severity).or_default() += 1;
            }
            text += &if self.json { l.to_json() } else { l.to_text() };
            text.push('\n');
        }
        self.out.write_all(text.as_bytes())?;
        self.out.flush()
    }
}

/// Watches until Ctrl-C or SIGTERM; `Ok(0)` after a clean end (and when the reader of the
/// output went away), `Err` when there is nothing to watch or the output fails.
pub fn run(opts: WatchOptions, out: &mut dyn Write) -> Result<i32, String> {
    let interval = opts.interval;
    let (mut w, first) = Watcher::start(opts)?;
    let mut stop = Stop::install().map_err(|e| format!("installing the Ctrl-C and SIGTERM handlers: {e}"))?;
    let start = Instant::now();
    let mut printer = Printer { out, json: w.opts.json, start, counts: BTreeMap::new() };
    let mut intervals = 0u64;
    let mut next_tick = start + interval;
    let mut result = printer.print(first);
    let why = loop {
        if let Err(e) = result {
            break Err(e);
        }
        if let Some(signal) = stop.requested() {
            break Ok(signal);
        }
        let (ready, broken) = wait(&w, &stop, next_tick.saturating_duration_since(Instant::now()));
        if ready.0 {
            stop.drain();
            continue;
        }
        let tick = Instant::now() >= next_tick;
        if tick {
            intervals += 1;
            next_tick += interval;
            if next_tick <= Instant::now() {
                // Fell behind (a stopped process, a slow sysfs): the next one from now.
                next_tick = Instant::now() + interval;
            }
        }
        if !tick && !ready.1 && broken.is_empty() {
            continue;
        }
        result = printer.print(w.wake(tick, &broken));
    };
    match why {
        Ok(signal) => {
            let c = |l| printer.counts.get(&l).copied().unwrap_or(0);
            let secs = start.elapsed().as_secs_f64();
            let message = format!(
                "ended by {signal} after {secs:.1} s, {intervals} interval(s): {} critical, {} warning, {} note, {} info line(s)",
                c(Level::Critical),
                c(Level::Warning),
                c(Level::Note),
                c(Level::Info)
            );
            let details = json!({
                "signal": signal,
                "duration_s": secs,
                "intervals": intervals,
                "lines": {"critical": c(Level::Critical), "warning": c(Level::Warning), "note": c(Level::Note), "info": c(Level::Info)},
            });
            let summary =
                Draft { kind: Kind::Summary, severity: Level::Info, device: None, port: None, message, details };
            match printer.print(vec![summary]) {
                Err(e) if e.kind() != ErrorKind::BrokenPipe => Err(format!("writing: {e}")),
                _ => Ok(0),
            }
        }
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(0),
        Err(e) => Err(format!("writing: {e}")),
    }
}

#[cfg(test)]
mod tests;
