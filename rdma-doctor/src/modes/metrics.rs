//! A report as metrics a monitoring system scrapes, in the text exposition format of
//! Prometheus (its classic form, version 0.0.4, which Prometheus scrapes, node_exporter's
//! textfile collector reads and `promtool check metrics` lints; the Prometheus project's
//! own `prometheus-client` crate writes it in the OpenMetrics form, which differs only in
//! the name a counter's `HELP` and `TYPE` lines give and in its closing `# EOF`):
//! `rdma-doctor --prometheus` prints them once, and `rdma-doctor --serve --metrics-port
//! PORT` answers `GET /metrics` beside the probe server.
//!
//! | metric | labels | value |
//! | --- | --- | --- |
//! | `rdma_doctor_port_counters_total` | device, port, name | `ports/N/counters/NAME` |
//! | `rdma_doctor_port_hw_counters_total` | device, port, name | `ports/N/hw_counters/NAME` |
//! | `rdma_doctor_device_hw_counters_total` | device, name | `hw_counters/NAME` |
//! | `rdma_doctor_layer_verdict` | scope, layer | 0 pass, 1 warn (passed with a warning of that layer), 2 fail; a skipped layer is absent |
//! | `rdma_doctor_versions_info` | device, kernel, rdma_core, provider, provider_version, driver, driver_version, firmware | 1 |
//! | `rdma_doctor_known_bad` | device | 1 when a known-bad combination matched, else 0 |
//! | `rdma_doctor_port_state` | device, port | the port's state as the IB spec numbers it: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER, 0 other |
//! | `rdma_doctor_link_rate_gbps` | device, port | the port's rate |
//! | `rdma_doctor_link_reference_gbps` | device, port | the rate it is judged against (absent without one; the report's `observations.link_references` says where it came from) |
//! | `rdma_doctor_exit_code` | | the doctor's exit status for the report |
//! | `rdma_doctor_report_time_seconds` | | when the diagnosis ran (Unix time) |
//! | `rdma_doctor_report_age_seconds` | | how long before this answer the diagnosis started |
//!
//! Unreadable counters are left out. The series of a metric come out in the order of
//! their label values (the same order at every scrape).
//!
//! The endpoint serves each scrape a report from [`crate::modes::fresh::Reports`] (at most
//! [`crate::modes::fresh::MAX_AGE`] old, diagnosed again when a port changed) with the counters
//! read for the scrape. It admits only the clients of its allow-list, and closes the others
//! before it reads a byte; it takes no secret (a Prometheus scraper cannot answer a
//! challenge).
//! It serves many clients at once, each within a bounded time (`metrics/server.rs`): a client
//! that holds the port idle delays no scrape.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::model::counters::DeviceCounters;
use crate::model::layer::Outcome;
use crate::model::report::{Report, Severity};
use crate::modes::gate::AllowList;

mod server;
pub use server::{ANSWER_THREADS, MAX_CONNECTIONS};

/// The content type of [`encode_report`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The largest HTTP request head the metrics endpoint reads (hyper's smallest buffer).
pub const MAX_REQUEST_BYTES: usize = 8192;
/// The longest a client may take to send its request head, and to take the answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// The metrics of `report`, with the counters of `counters` (the report's own, or a fresh
/// sample for a scrape); `age` is how long ago its diagnosis started.
pub fn encode_report(report: &Report, counters: &BTreeMap<String, DeviceCounters>, age: Duration) -> String {
    let mut registry = Registry::default();
    let port_counter = Family::<Labels, Counter>::default();
    let port_hw = Family::<Labels, Counter>::default();
    let device_hw = Family::<Labels, Counter>::default();
    for (dev, d) in counters {
        for (name, c) in &d.hw_counters {
            if let Some(v) = c.value {
                device_hw.get_or_create(&labels(&[("device", dev), ("name", name)])).inc_by(v);
            }
        }
        for (port, p) in &d.ports {
            for (family, set) in [(&port_counter, &p.counters), (&port_hw, &p.hw_counters)] {
                for (name, c) in set {
                    if let Some(v) = c.value {
                        family.get_or_create(&labels(&[("device", dev), ("port", port), ("name", name)])).inc_by(v);
                    }
                }
            }
        }
    }
    registry.register(
        "rdma_doctor_port_counters",
        "A port counter, /sys/class/infiniband/DEV/ports/N/counters/NAME",
        port_counter,
    );
    registry.register(
        "rdma_doctor_port_hw_counters",
        "A port hw_counter, /sys/class/infiniband/DEV/ports/N/hw_counters/NAME",
        port_hw,
    );
    registry.register(
        "rdma_doctor_device_hw_counters",
        "A device hw_counter, /sys/class/infiniband/DEV/hw_counters/NAME",
        device_hw,
    );

    let verdict = Family::<Labels, Gauge>::default();
    for l in &report.layers {
        let warned = report
            .findings
            .iter()
            .any(|f| f.severity == Severity::Warning && f.layer == Some(l.layer) && f.scope == l.scope);
        let value = match (l.outcome, warned) {
            (Outcome::Skipped, _) => continue,
            (Outcome::Fail, _) => 2,
            (Outcome::Pass, true) => 1,
            (Outcome::Pass, false) => 0,
        };
        verdict.get_or_create(&labels(&[("scope", &l.scope), ("layer", l.layer.name())])).set(value);
    }
    registry.register("rdma_doctor_layer_verdict", "Each layer's verdict: 0 pass, 1 warn, 2 fail", verdict);

    let b = &report.baseline;
    let info = Family::<Labels, Gauge>::default();
    let known_bad = Family::<Labels, Gauge>::default();
    let state = Family::<Labels, Gauge>::default();
    let rate = Family::<Labels, FloatGauge>::default();
    let reference = Family::<Labels, FloatGauge>::default();
    let rdma_core = b.libraries.get("rdma-core").and_then(|v| v.version.clone()).unwrap_or_default();
    for (dev, d) in &b.devices {
        let provider = d.provider.as_ref();
        info.get_or_create(&labels(&[
            ("device", dev),
            ("kernel", &b.kernel.release),
            ("rdma_core", &rdma_core),
            ("provider", provider.map_or("", |p| p.name.as_str())),
            ("provider_version", provider.and_then(|p| p.version.as_deref()).unwrap_or("")),
            ("driver", d.kernel_driver_name.as_deref().unwrap_or("")),
            ("driver_version", d.kernel_driver.version.as_deref().unwrap_or("")),
            ("firmware", &d.fw_ver),
        ]))
        .set(1);
        let bad = report.findings.iter().any(|f| &f.scope == dev && f.what.starts_with("known-bad ["));
        known_bad.get_or_create(&labels(&[("device", dev)])).set(i64::from(bad));
        for (port, p) in &d.ports {
            state.get_or_create(&labels(&[("device", dev), ("port", port)])).set(port_state_number(&p.state));
            rate.get_or_create(&labels(&[("device", dev), ("port", port)])).set(p.rate_gbps);
            if let Some(r) = report.observations.link_references.get(dev).and_then(|m| m.get(port)) {
                reference.get_or_create(&labels(&[("device", dev), ("port", port)])).set(r.gbps);
            }
        }
    }
    registry.register("rdma_doctor_versions_info", "The versions of a device's stack", info);
    registry.register("rdma_doctor_known_bad", "1 when a known-bad firmware/driver combination matched", known_bad);
    registry.register(
        "rdma_doctor_port_state",
        "A port's state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER",
        state,
    );
    registry.register("rdma_doctor_link_rate_gbps", "A port's link rate, Gb/s", rate);
    registry.register("rdma_doctor_link_reference_gbps", "The rate a port's link is judged against, Gb/s", reference);

    let exit = Gauge::<i64>::default();
    exit.set(i64::from(report.exit_code));
    registry.register("rdma_doctor_exit_code", "The doctor's exit status for this diagnosis", exit);
    let time = Gauge::<i64>::default();
    time.set(i64::try_from(report.host.time_unix).unwrap_or(i64::MAX));
    registry.register("rdma_doctor_report_time_seconds", "When the diagnosis ran, Unix time", time);
    let age_gauge = FloatGauge::default();
    age_gauge.set(age.as_secs_f64());
    registry.register(
        "rdma_doctor_report_age_seconds",
        "How long before this answer the diagnosis started, seconds",
        age_gauge,
    );

    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, &registry);
    classic(&in_stable_order(&text))
}

/// OpenMetrics text in the classic form: a counter family's `HELP` and `TYPE` lines name
/// its samples (`X_total`) rather than the family (`X`), and there is no `# EOF`.
fn classic(open_metrics: &str) -> String {
    let counters: Vec<&str> =
        open_metrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::with_capacity(open_metrics.len());
    for line in open_metrics.lines().filter(|l| *l != "# EOF") {
        let meta = ["# HELP ", "# TYPE "].into_iter().find_map(|p| Some((p, line.strip_prefix(p)?)));
        match meta.and_then(|(p, rest)| Some((p, rest.split_once(' ')?))) {
            Some((p, (name, rest))) if counters.contains(&name) => {
                out.push_str(&format!("{p}{name}_total {rest}"));
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// The number the InfiniBand specification (and `ibv_port_state`) gives a port state the
/// report names; 0 for any other.
fn port_state_number(name: &str) -> i64 {
    match name {
        "DOWN" => 1,
        "INIT" => 2,
        "ARMED" => 3,
        "ACTIVE" => 4,
        "ACTIVE_DEFER" => 5,
        _ => 0,
    }
}

/// `text` with each metric's series sorted: a family keeps its series in a hash map, whose
/// order changes from one encoding to the next. The comment lines (`# HELP`, `# TYPE`,
/// `# EOF`) stay where they are; every series here is one line (no histograms).
fn in_stable_order(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut series: Vec<&str> = Vec::new();
    let flush = |series: &mut Vec<&str>, out: &mut String| {
        series.sort_unstable();
        for l in series.drain(..) {
            out.push_str(l);
            out.push('\n');
        }
    };
    for line in text.lines() {
        if line.starts_with('#') {
            flush(&mut series, &mut out);
            out.push_str(line);
            out.push('\n');
        } else {
            series.push(line);
        }
    }
    flush(&mut series, &mut out);
    out
}

/// Answers `GET /metrics` on `listener` with `metrics()` (500 with its error), until the
/// listener fails: many clients at once, each within a bounded time, on the thread of the
/// caller (`metrics/server.rs`). A client that `allow` does not admit is closed before anything is
/// read. Each request head is read up to [`MAX_REQUEST_BYTES`] within [`REQUEST_TIMEOUT`];
/// anything but `GET /metrics` gets 400, 404, 405 or 431.
pub fn serve(
    listener: TcpListener,
    allow: &AllowList,
    metrics: impl Fn() -> Result<String, String> + Send + Sync + 'static,
) -> std::io::Error {
    server::serve(listener, allow, std::sync::Arc::new(metrics))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    #[test]
    fn counter_metadata_names_the_total_samples_and_there_is_no_eof() {
        let om = "# HELP a_events Events.\n# TYPE a_events counter\na_events_total{x=\"1\"} 3\n\
                  # HELP a_state State.\n# TYPE a_state gauge\na_state 4\n# EOF\n";
        assert_eq!(
            classic(om),
            "# HELP a_events_total Events.\n# TYPE a_events_total counter\na_events_total{x=\"1\"} 3\n\
             # HELP a_state State.\n# TYPE a_state gauge\na_state 4\n"
        );
    }

    #[test]
    fn a_request_that_is_not_get_metrics_gets_an_error_status() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || serve(listener, &AllowList::default(), || Ok("m 1\n".to_owned())));
        let ask = |req: &[u8]| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(req).unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            out
        };
        let ok = ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n") && ok.ends_with("\r\n\r\nm 1\n"), "{ok}");
        assert!(ok.contains(&format!("content-type: {CONTENT_TYPE}\r\n")), "{ok}");
        assert!(ask(b"GET /metrics HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 200 OK\r\n"));
        assert!(ask(b"GET / HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 404"));
        assert!(ask(b"POST /metrics HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 405"));
        assert!(ask(b"hello\r\n\r\n").starts_with("HTTP/1.1 400"));
        let big = ask(&[b"GET /metrics HTTP/1.0\r\nX: ".as_slice(), &[b'A'; 10_000]].concat());
        assert!(big.starts_with("HTTP/1.1 431"), "a head beyond the limit: {big}");
    }

    #[test]
    fn a_silent_client_and_a_trickling_one_are_closed_after_the_request_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || serve(listener, &AllowList::default(), || Ok("m 1\n".to_owned())));
        let closed_after = |mut s: TcpStream| {
            let started = Instant::now();
            s.set_read_timeout(Some(REQUEST_TIMEOUT * 5)).unwrap();
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            (started.elapsed(), out)
        };
        let (took, said) = closed_after(TcpStream::connect(addr).unwrap());
        assert!(said.is_empty(), "{}", String::from_utf8_lossy(&said));
        assert!(took < REQUEST_TIMEOUT + Duration::from_secs(1), "a silent client held on {took:?}");

        // One byte of a header every 100 ms: never a whole head.
        let trickler = TcpStream::connect(addr).unwrap();
        let mut writer = trickler.try_clone().unwrap();
        let sent = std::thread::spawn(move || {
            let _ = writer.write_all(b"GET /metrics HTTP/1.0\r\nX-Slow: ");
            let mut sent = 0;
            while sent < 100 && writer.write_all(b"a").is_ok() {
                sent += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            sent
        });
        let (took, said) = closed_after(trickler);
        assert!(said.is_empty(), "{}", String::from_utf8_lossy(&said));
        assert!(took < REQUEST_TIMEOUT + Duration::from_secs(1), "a trickling client held on {took:?}");
        assert!(sent.join().unwrap() < 100, "its writes fail once it is closed");
    }

    #[test]
    fn a_client_outside_the_allow_list_is_closed_unanswered_and_a_slow_diagnosis_is_waited_for() {
        let start = |allow: AllowList, wait: Duration| {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            std::thread::spawn(move || {
                serve(listener, &allow, move || {
                    std::thread::sleep(wait);
                    Ok("m 1\n".to_owned())
                })
            });
            addr
        };
        let ask = |addr| {
            let mut s = TcpStream::connect(addr).unwrap();
            let _ = s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            out
        };
        let elsewhere = start(AllowList::parse(&["10.0.0.0/8".into()]).unwrap(), Duration::ZERO);
        assert_eq!(ask(elsewhere), "");
        let slow = start(AllowList::parse(&["127.0.0.0/8".into()]).unwrap(), REQUEST_TIMEOUT + Duration::from_secs(1));
        assert!(ask(slow).starts_with("HTTP/1.0 200 OK"), "the diagnosis' time is not the client's");
    }

    /// A scrape's answer and how long it took, with `idle` clients connected and silent.
    fn scrape_among_idle_clients(addr: std::net::SocketAddr, idle: usize) -> (String, Duration) {
        let holders: Vec<TcpStream> = (0..idle).map(|_| TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let took = started.elapsed();
        drop(holders);
        (out, took)
    }

    #[test]
    fn eight_idle_clients_do_not_delay_a_scrape() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || serve(listener, &AllowList::default(), || Ok("m 1\n".to_owned())));
        let (answer, took) = scrape_among_idle_clients(addr, 8);
        eprintln!("a scrape among 8 idle clients: {:.2} s", took.as_secs_f64());
        assert!(answer.starts_with("HTTP/1.0 200 OK\r\n") && answer.ends_with("\r\n\r\nm 1\n"), "{answer}");
        assert!(took < Duration::from_millis(500), "{took:?}");
    }
}
