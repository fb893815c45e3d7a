use std::path::Path;

use rdma_verbs::{AsyncEvent, AsyncEventKind, EventSource};

use super::judge::{counter_lines, event_line, port_lines, PortMemory, PortSample};
use super::*;
use crate::model::counters::{CounterChange, CounterClass};

fn change(dev: &str, port: Option<&str>, name: &str, before: u64, after: u64) -> CounterChange {
    CounterChange {
        device: dev.into(),
        port: port.map(Into::into),
        set: "hw_counters".into(),
        name: name.into(),
        source: format!("/sys/class/infiniband/{dev}/ports/1/hw_counters/{name}"),
        before,
        after,
        class: CounterClass::of(name),
    }
}

fn port(state: &str, rate_gbps: f64) -> PortSample {
    let phys = if state == "ACTIVE" { "LinkUp" } else { "Disabled" };
    PortSample { state: state.into(), phys_state: phys.into(), rate_gbps, rate: format!("{rate_gbps} Gb/sec (1X SDR)") }
}

fn counters(changes: &[CounterChange], secs: f64) -> Vec<Draft> {
    counter_lines(changes, secs, &BTreeMap::new(), &mut BTreeMap::new(), &mut BTreeMap::new())
}

#[test]
fn the_interval_is_a_number_of_seconds_from_a_tenth_to_an_hour() {
    assert_eq!(parse_interval("1"), Ok(Duration::from_secs(1)));
    assert_eq!(parse_interval("0.5"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_interval("3600"), Ok(Duration::from_secs(3600)));
    for bad in ["0", "-1", "0.05", "3601", "NaN", "inf", "", "1s", "abc"] {
        assert!(parse_interval(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn watch_flags_bad_intervals_and_flags_of_other_modes_are_usage_errors_and_nothing_to_watch_is_exit_1() {
    let run = |args: &[&str]| {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code =
            crate::modes::cli::run(std::iter::once("rdma-doctor").chain(args.iter().copied()), &mut out, &mut err);
        (code, String::from_utf8_lossy(&err).into_owned())
    };
    for args in [
        &["--watch", "0"][..],
        &["--watch", "7200"],
        &["--watch", "x"],
        &["--watch", "--peer", "h"],
        &["--watch", "--serve"],
        &["--watch", "--prometheus"],
        &["--watch", "--save", "f.json"],
        &["--watch", "--no-loopback"],
        &["--watch", "--timeout", "3"],
        &["--watch", "--compare-nodes", "a", "b"],
        &["--watch", "-p", "0"],
    ] {
        assert_eq!(run(args).0, crate::model::report::EXIT_USAGE, "{args:?}");
    }
    let (code, err) = run(&["--watch", "-d", "no-such-device-0", "--json"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("nothing to watch: no device no-such-device-0"), "{err}");
    use clap::Parser;
    let a = crate::modes::cli::Args::try_parse_from(["rdma-doctor", "--watch", "-d", "rxe0"]).unwrap();
    assert_eq!((a.watch, a.device.as_deref()), (Some(Duration::from_secs(1)), Some("rxe0")), "the default is 1 s");
}

#[test]
fn lines_of_one_interval_print_worst_first_and_in_the_order_found_within_a_severity() {
    let d = |severity, message: &str| Draft::new(Kind::Counters, severity, "rxe0", Some(1), message.into(), json!({}));
    let mut lines = vec![
        d(Level::Info, "up"),
        d(Level::Note, "rnr"),
        d(Level::Warning, "lossy"),
        d(Level::Critical, "down"),
        d(Level::Warning, "timeout"),
        d(Level::Note, "gid"),
    ];
    line::worst_first(&mut lines);
    let order: Vec<&str> = lines.iter().map(|l| l.message.as_str()).collect();
    assert_eq!(order, ["down", "lossy", "timeout", "rnr", "gid", "up"]);
}

#[test]
fn a_json_line_is_one_object_with_time_elapsed_kind_severity_device_port_message_and_details() {
    let draft = Draft::new(Kind::LinkState, Level::Critical, "rxe0", Some(1), "ACTIVE -> DOWN".into(), json!({"a": 1}));
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_796_342_401_234);
    let line = draft.stamp(at, 2.00049);
    let text = line.to_json();
    assert!(!text.contains('\n'), "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    let mut want = ["time", "elapsed_s", "kind", "severity", "device", "port", "message", "details"];
    want.sort_unstable();
    let mut got = keys.clone();
    got.sort_unstable();
    assert_eq!(got, want, "{text}");
    assert_eq!(v["time"], "2026-12-04T00:00:01.234Z");
    assert_eq!(v["elapsed_s"], 2.0);
    assert_eq!((v["kind"].as_str(), v["severity"].as_str()), (Some("link_state"), Some("critical")));
    assert_eq!((v["device"].as_str(), v["port"].as_u64()), (Some("rxe0"), Some(1)));
    assert_eq!(line.to_text(), "2026-12-04T00:00:01.234Z CRIT rxe0/1 link_state: ACTIVE -> DOWN");
    let watching = Draft {
        kind: Kind::Watching,
        severity: Level::Info,
        device: None,
        port: None,
        message: "m".into(),
        details: json!({}),
    };
    let v: serde_json::Value = serde_json::from_str(&watching.stamp(at, 0.0).to_json()).unwrap();
    assert!(v["device"].is_null() && v["port"].is_null(), "{v}");
    assert_eq!(v["kind"], "watching");
}

#[test]
fn a_lossy_counter_warns_at_half_a_percent_of_the_packets_with_its_rate_per_second() {
    let moved = [
        change("rxe0", Some("1"), "rcvd_seq_err", 10, 14),
        change("rxe0", Some("1"), "completer_retry_err", 0, 8),
        change("rxe0", Some("1"), "sent_pkts", 1000, 3000),
    ];
    let lines = counters(&moved, 2.0);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    let l = &lines[0];
    assert_eq!((l.kind, l.severity, l.port), (Kind::Counters, Level::Warning, Some(1)));
    assert_eq!(l.details["class"], "lossy");
    assert_eq!(l.details["events"], 12);
    assert_eq!(l.details["rate_per_s"], 6.0);
    assert_eq!(l.details["packets_per_s"], 1000.0);
    assert_eq!(l.details["threshold_per_s"], 5.0);
    assert_eq!(l.details["above_threshold"], true);
    assert!(
        l.message.starts_with("lossy: completer_retry_err +8, rcvd_seq_err +4 in 2.0 s (6.0/s, 0.60% of 1000 packets/s; should stay at 0; above the 0.5% that warns)")
            || l.message.starts_with("lossy: rcvd_seq_err +4, completer_retry_err +8"),
        "{}",
        l.message
    );
    // Traffic alone is no line; nor is a counter that went down (the driver reset it).
    assert!(counters(&[change("rxe0", Some("1"), "sent_pkts", 1, 9)], 1.0).is_empty());
    assert!(counters(&[change("rxe0", Some("1"), "rcvd_seq_err", 9, 0)], 1.0).is_empty());
}

/// What CI's healthy two-node run saw once under clean traffic: 3 retries in 2 s at
/// 3010 packets/s. One interval of that is a note; three in a row warn; a quiet interval
/// starts the count again.
#[test]
fn a_blip_of_loss_is_a_note_and_loss_three_intervals_in_a_row_warns() {
    let mut streaks = BTreeMap::new();
    let mut tick = |seq: u64, retry: u64| {
        let moved = [
            change("rxe0", Some("1"), "rcvd_seq_err", 35, 35 + seq),
            change("rxe0", Some("1"), "completer_retry_err", 84, 84 + retry),
            change("rxe0", Some("1"), "sent_pkts", 0, 6020),
        ];
        counter_lines(&moved, 2.0, &BTreeMap::new(), &mut BTreeMap::new(), &mut streaks)
    };
    let blip = tick(3, 3);
    assert_eq!(blip.len(), 1, "{blip:#?}");
    assert_eq!(blip[0].severity, Level::Note, "{blip:#?}");
    assert_eq!(blip[0].details["above_threshold"], false);
    assert_eq!(blip[0].details["intervals_in_a_row"], 1);
    assert!(
        blip[0]
            .message
            .contains("0.10% of 3010 packets/s; should stay at 0; a blip: a warning at 0.5% or 3 intervals in a row"),
        "{}",
        blip[0].message
    );
    assert_eq!(tick(1, 1)[0].severity, Level::Note);
    let third = tick(1, 0);
    assert_eq!((third[0].severity, &third[0].details["intervals_in_a_row"]), (Level::Warning, &json!(3)), "{third:#?}");
    assert!(third[0].message.contains("should stay at 0; 3 intervals in a row"), "{}", third[0].message);
    assert!(tick(0, 0).is_empty(), "a quiet interval has no line");
    assert_eq!(tick(2, 2)[0].severity, Level::Note, "the count starts again after a quiet interval");
}

#[test]
fn loss_on_a_port_that_counts_no_packets_and_link_errors_warn_at_their_first_move() {
    let lossy = counters(&[change("rxe0", Some("1"), "rcvd_seq_err", 0, 1)], 1.0);
    assert_eq!((lossy.len(), lossy[0].severity), (1, Level::Warning), "{lossy:#?}");
    assert!(lossy[0].details["threshold_per_s"].is_null());
    assert!(lossy[0].message.contains("; should stay at 0)"), "{}", lossy[0].message);
    let down = counters(
        &[
            change("mlx5_0", Some("1"), "link_downed", 0, 1),
            change("mlx5_0", Some("1"), "port_xmit_packets", 0, 1_000_000),
        ],
        1.0,
    );
    assert_eq!((down.len(), down[0].severity), (1, Level::Warning), "{down:#?}");
    assert_eq!(down[0].details["class"], "link_down");
}

#[test]
fn rnr_and_congestion_are_notes_below_one_percent_of_the_packets_and_warnings_above() {
    let with = |rnr: u64, pkts: u64| {
        let moved =
            [change("rxe0", Some("1"), "rcvd_rnr_err", 0, rnr), change("rxe0", Some("1"), "rcvd_pkts", 0, pkts)];
        let lines = counters(&moved, 1.0);
        assert_eq!(lines.len(), 1, "{lines:#?}");
        lines[0].clone()
    };
    let below = with(50, 10_000); // 0.5%
    assert_eq!(below.severity, Level::Note, "{below:#?}");
    assert_eq!(below.details["threshold_per_s"], 100.0);
    assert_eq!(below.details["above_threshold"], false);
    let above = with(200, 10_000); // 2%
    assert_eq!(above.severity, Level::Warning, "{above:#?}");
    assert_eq!(above.details["above_threshold"], true);
    assert!(above.message.contains("above the 100/s normal under load"), "{}", above.message);
    // Few packets: the floor of 10/s holds; no packet counters at all: the floor alone.
    assert_eq!(with(5, 100).severity, Level::Note);
    assert_eq!(with(20, 100).severity, Level::Warning);
    let cnp = counters(&[change("mlx5_0", Some("1"), "np_cnp_sent", 0, 9)], 1.0);
    assert_eq!((cnp[0].severity, cnp[0].details["class"].as_str()), (Level::Note, Some("congestion")));
    // port_xmit_wait counts time ticks: listed, not counted toward the rate.
    let wait = counters(&[change("mlx5_0", Some("1"), "port_xmit_wait", 0, 1_000_000)], 1.0);
    assert_eq!((wait[0].severity, wait[0].details["events"].as_u64()), (Level::Note, Some(0)));
}

#[test]
fn a_port_that_leaves_active_is_critical_with_its_port_err_event_folded_in_and_coming_back_is_info() {
    let mut mem = PortMemory::new(port("ACTIVE", 2.5));
    let ev = |kind, p| AsyncEvent { kind, source: EventSource::Port(p) };
    let mut events =
        vec![ev(AsyncEventKind::PortErr, 1), ev(AsyncEventKind::PortErr, 2), ev(AsyncEventKind::GidChange, 1)];
    let lines = port_lines("rxe0", 1, &mut mem, &port("DOWN", 2.5), &mut events);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert_eq!((lines[0].kind, lines[0].severity), (Kind::LinkState, Level::Critical));
    assert_eq!(lines[0].message, "ACTIVE (LinkUp) -> DOWN (Disabled) [IBV_EVENT_PORT_ERR]");
    assert_eq!(lines[0].details["events"], json!(["IBV_EVENT_PORT_ERR"]));
    assert_eq!(events, [ev(AsyncEventKind::PortErr, 2), ev(AsyncEventKind::GidChange, 1)], "the others stay");
    let lines = port_lines("rxe0", 1, &mut mem, &port("ACTIVE", 2.5), &mut vec![ev(AsyncEventKind::PortActive, 1)]);
    assert_eq!((lines.len(), lines[0].severity), (1, Level::Info), "{lines:#?}");
    assert!(lines[0].message.ends_with("[IBV_EVENT_PORT_ACTIVE] at 2.5 Gb/sec (1X SDR)"), "{}", lines[0].message);
    assert!(port_lines("rxe0", 1, &mut mem, &port("ACTIVE", 2.5), &mut Vec::new()).is_empty(), "no change, no line");
}

#[test]
fn a_port_whose_rate_drops_or_that_comes_back_slower_warns_and_a_rise_is_info() {
    let mut mem = PortMemory::new(port("ACTIVE", 100.0));
    let lines = port_lines("mlx5_0", 1, &mut mem, &port("ACTIVE", 50.0), &mut Vec::new());
    assert_eq!((lines.len(), lines[0].kind, lines[0].severity), (1, Kind::LinkRate, Level::Warning), "{lines:#?}");
    assert_eq!(
        (lines[0].details["from_gbps"].as_f64(), lines[0].details["to_gbps"].as_f64()),
        (Some(100.0), Some(50.0))
    );
    port_lines("mlx5_0", 1, &mut mem, &port("DOWN", 0.0), &mut Vec::new());
    let back = port_lines("mlx5_0", 1, &mut mem, &port("ACTIVE", 25.0), &mut Vec::new());
    let kinds: Vec<(Kind, Level)> = back.iter().map(|l| (l.kind, l.severity)).collect();
    assert_eq!(kinds, [(Kind::LinkState, Level::Info), (Kind::LinkRate, Level::Warning)], "{back:#?}");
    let rise = port_lines("mlx5_0", 1, &mut mem, &port("ACTIVE", 100.0), &mut Vec::new());
    assert_eq!((rise[0].kind, rise[0].severity), (Kind::LinkRate, Level::Info));
}

#[test]
fn a_direction_above_90_percent_of_the_link_rate_is_a_note_once_and_clears_below_80() {
    let key = ("mlx5_0".to_owned(), 1u8);
    let rates = BTreeMap::from([(key.clone(), 100.0)]);
    let mut mem = BTreeMap::from([(key, PortMemory::new(port("ACTIVE", 100.0)))]);
    // 100 Gb/s for one second is 3.125e9 words of 4 octets.
    let words = |share: f64| (share * 3.125e9) as u64;
    let mut at = |share: f64| {
        let moved = [change("mlx5_0", Some("1"), "port_xmit_data", 0, words(share))];
        counter_lines(&moved, 1.0, &rates, &mut mem, &mut BTreeMap::new())
    };
    let l = at(0.95);
    assert_eq!((l.len(), l[0].kind, l[0].severity), (1, Kind::Traffic, Level::Note), "{l:#?}");
    assert!(
        l[0].message.starts_with("transmit at 95.00 Gb/s, 95% of the link's 100 Gb/s: saturated"),
        "{}",
        l[0].message
    );
    assert!(at(0.97).is_empty(), "still saturated: no new line");
    assert!(at(0.85).is_empty(), "between the thresholds: no flicker");
    let l = at(0.10);
    assert_eq!((l.len(), l[0].severity, l[0].details["saturated"].as_bool()), (1, Level::Info, Some(false)), "{l:#?}");
}

#[test]
fn async_events_name_the_qp_or_port_and_a_fatal_device_is_critical() {
    let qp = event_line(
        "mlx5_0",
        &AsyncEvent { kind: AsyncEventKind::QpFatal, source: EventSource::Qp { qp_num: 0x1a2b, addr: 0 } },
    );
    assert_eq!((qp.kind, qp.severity, qp.port), (Kind::AsyncEvent, Level::Warning, None));
    assert_eq!(qp.details["source"], json!({"type": "qp", "qp_num": 0x1a2b}));
    assert!(qp.message.starts_with("IBV_EVENT_QP_FATAL on QP 0x1a2b"), "{}", qp.message);
    let gid = event_line("rxe0", &AsyncEvent { kind: AsyncEventKind::GidChange, source: EventSource::Port(1) });
    assert_eq!(
        (gid.severity, gid.port, gid.details["event"].as_str()),
        (Level::Note, Some(1), Some("IBV_EVENT_GID_CHANGE"))
    );
    let fatal = event_line("rxe0", &AsyncEvent { kind: AsyncEventKind::DeviceFatal, source: EventSource::Device });
    assert_eq!(fatal.severity, Level::Critical);
    let odd =
        event_line("rxe0", &AsyncEvent { kind: AsyncEventKind::Unknown(99), source: EventSource::Unknown { raw: 7 } });
    assert_eq!((odd.severity, odd.details["event"].as_str()), (Level::Note, Some("IBV_EVENT_99")));
}

/// A recorded sysfs tree in a fresh temporary directory.
struct Tree(PathBuf);

impl Tree {
    fn new(test: &str) -> Tree {
        let dir = std::env::temp_dir().join(format!("rdma-doctor-watch-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Tree(dir)
    }

    fn write(&self, file: &str, text: &str) {
        let path = self.0.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn port(&self, dev: &str, state: &str, rate: &str) {
        self.write(&format!("{dev}/ports/1/state"), state);
        self.write(&format!("{dev}/ports/1/phys_state"), "5: LinkUp");
        self.write(&format!("{dev}/ports/1/rate"), rate);
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_watcher_over_a_recorded_tree_says_what_it_watches_and_sees_state_counters_and_a_device_that_goes() {
    let t = Tree::new("tree");
    t.port("rxe0", "4: ACTIVE", "2.5 Gb/sec (1X SDR)");
    t.write("rxe0/ports/1/hw_counters/rcvd_seq_err", "0\n");
    t.write("rxe0/ports/1/hw_counters/sent_pkts", "100\n");
    t.port("rxe1", "4: ACTIVE", "10 Gb/sec (1X FDR10)");
    let opts = WatchOptions {
        root: t.0.clone(),
        async_events: false,
        kernel_log: false,
        ..WatchOptions::new(Duration::from_secs(1))
    };
    let (mut w, first) = Watcher::start(opts.clone()).unwrap();
    assert_eq!(first.len(), 1, "{first:#?}");
    assert_eq!(first[0].kind, Kind::Watching);
    assert!(
        first[0].message.starts_with("rxe0/1 ACTIVE 2.5 Gb/sec (1X SDR), rxe1/1 ACTIVE 10 Gb/sec (1X FDR10) every 1 s"),
        "{}",
        first[0].message
    );
    assert_eq!(first[0].details["devices"]["rxe0"]["ports"]["1"]["rate_gbps"], 2.5);
    assert!(w.wake(true, &[]).is_empty(), "nothing moved");

    t.write("rxe0/ports/1/state", "1: DOWN");
    t.write("rxe0/ports/1/hw_counters/rcvd_seq_err", "3\n");
    std::fs::remove_dir_all(t.0.join("rxe1")).unwrap();
    let mut lines = w.wake(true, &[]);
    line::worst_first(&mut lines);
    let got: Vec<(Kind, Level, Option<&str>)> =
        lines.iter().map(|l| (l.kind, l.severity, l.device.as_deref())).collect();
    assert_eq!(
        got,
        [
            (Kind::Device, Level::Critical, Some("rxe1")),
            (Kind::LinkState, Level::Critical, Some("rxe0")),
            (Kind::Counters, Level::Warning, Some("rxe0")),
        ],
        "{lines:#?}"
    );
    // Between ticks the counters are not read; a device that comes back is watched again.
    t.write("rxe0/ports/1/hw_counters/rcvd_seq_err", "9\n");
    t.port("rxe1", "4: ACTIVE", "10 Gb/sec (1X FDR10)");
    let lines = w.wake(false, &[]);
    assert_eq!(
        lines.iter().map(|l| (l.kind, l.severity)).collect::<Vec<_>>(),
        [(Kind::Device, Level::Note)],
        "{lines:#?}"
    );

    // -d and -p choose; a device or port that is not there is nothing to watch.
    let only = WatchOptions { device: Some("rxe1".into()), port: Some(1), ..opts.clone() };
    let (w, _) = Watcher::start(only).unwrap();
    assert_eq!(w.devices.keys().collect::<Vec<_>>(), ["rxe1"]);
    let err = Watcher::start(WatchOptions { port: Some(2), ..opts.clone() }).err().unwrap();
    assert!(err.starts_with("nothing to watch: no port 2 on rxe0, rxe1"), "{err}");
    let err = Watcher::start(WatchOptions { root: Path::new("/nonexistent").into(), ..opts }).err().unwrap();
    assert_eq!(err, "nothing to watch: no RDMA device in /nonexistent");
}

#[test]
fn kernel_log_lines_warn_when_they_mean_trouble_or_report_an_errno_and_other_rdma_lines_are_notes() {
    let records = [
        "4,3,100,-;mlx5_core 0000:03:00.0: timeout event on QP 0x1a2b",
        "3,4,200,-;infiniband mlx5_0: create_qp:3085:(pid 77): Create QP type 2 failed with error -12",
        "6,5,300,-;rdma_rxe: loaded",
        "6,6,400,-;e1000e: eth0 NIC Link is Up",
    ];
    let lines = kernel_log::judge(records.iter().copied());
    let got: Vec<(Kind, Level)> = lines.iter().map(|l| (l.kind, l.severity)).collect();
    assert_eq!(
        got,
        [(Kind::KernelLog, Level::Warning), (Kind::KernelLog, Level::Warning), (Kind::KernelLog, Level::Note)],
        "{lines:#?}"
    );
    assert!(lines[0].message.contains("timeout event on QP 0x1a2b [the device timed out a QP"), "{}", lines[0].message);
    assert_eq!(lines[1].details["errno"], 12);
    assert!(lines[2].details["meaning"].is_null());
    // The QP timeout says what to check, as the diagnosis does; the others have no advice.
    let advice = lines[0].details["advice"].as_str().unwrap_or_default();
    assert!(advice.contains("known-bad list") && advice.contains("--peer HOST"), "{:#?}", lines[0].details);
    assert!(lines[1].details["advice"].is_null() && lines[2].details["advice"].is_null());
}

fn mtus(netdev: &str, netdev_mtu: Option<u32>, active_mtu: Option<u32>) -> mtu::MtuSample {
    mtu::MtuSample { netdev: Some(netdev.into()), netdev_mtu, active_mtu }
}

#[test]
fn an_mtu_change_is_one_note_with_old_and_new_values_and_a_fall_of_the_active_mtu_warns() {
    let mut was = mtus("dummy0", Some(1500), Some(1024));
    let mut step = |now: mtu::MtuSample| {
        mtu::mtu_lines("rxe0", 1, &mut was, &now)
            .into_iter()
            .map(|d| (d.severity, d.message, d.details))
            .collect::<Vec<_>>()
    };
    assert!(step(mtus("dummy0", Some(1500), Some(1024))).is_empty(), "no change, nothing");

    let lines = step(mtus("dummy0", Some(1200), Some(1024)));
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert_eq!(lines[0].0, Level::Note);
    assert_eq!(lines[0].1, "the MTU of netdev dummy0 changed from 1500 to 1200; the port's active MTU stays 1024");
    assert_eq!(lines[0].2["from"]["netdev_mtu"], 1500);
    assert_eq!(lines[0].2["to"]["netdev_mtu"], 1200);
    assert_eq!(lines[0].2["to"]["active_mtu"], 1024);
    assert!(step(mtus("dummy0", Some(1200), Some(1024))).is_empty(), "once per change");

    let lines = step(mtus("dummy0", Some(1000), Some(512)));
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert_eq!(lines[0].0, Level::Warning);
    assert!(
        lines[0].1.starts_with(
            "the MTU of netdev dummy0 changed from 1200 to 1000; the port's active MTU fell from 1024 to 512 (QPs"
        ),
        "{}",
        lines[0].1
    );
    assert_eq!(lines[0].2["from"]["active_mtu"], 1024);
    assert_eq!(lines[0].2["to"]["active_mtu"], 512);

    // A value that cannot be read is not a change; coming back to the same one is none either.
    assert!(step(mtus("dummy0", None, None)).is_empty());
    assert!(step(mtus("dummy0", Some(1000), Some(512))).is_empty());
    let lines = step(mtus("dummy0", Some(1500), Some(1024)));
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert_eq!(lines[0].0, Level::Note);
    assert!(lines[0].1.ends_with("; the port's active MTU rose from 512 to 1024"), "{}", lines[0].1);
    // Only the active MTU (an InfiniBand port, no netdev) and another netdev under the port.
    let mut ib = mtu::MtuSample { netdev: None, netdev_mtu: None, active_mtu: Some(4096) };
    let lower = mtu::MtuSample { active_mtu: Some(2048), ..ib.clone() };
    let lines = mtu::mtu_lines("mlx5_0", 1, &mut ib, &lower);
    assert_eq!(lines.iter().map(|l| (l.severity, l.kind)).collect::<Vec<_>>(), [(Level::Warning, Kind::Mtu)]);
    assert!(lines[0].message.starts_with("the port's active MTU fell from 4096 to 2048"), "{}", lines[0].message);
    assert!(step(mtus("eth1", Some(9000), Some(1024))).is_empty(), "another netdev is not a change of MTU");
}

#[test]
fn the_watcher_over_a_recorded_tree_notes_a_netdev_mtu_change_once() {
    let t = Tree::new("mtu");
    t.port("infiniband/rxe0", "4: ACTIVE", "2.5 Gb/sec (1X SDR)");
    t.write("infiniband/rxe0/ports/1/link_layer", "Ethernet\n");
    t.write("infiniband/rxe0/ports/1/gid_attrs/ndevs/0", "dummy0\n");
    t.write("net/dummy0/mtu", "1500\n");
    let opts = WatchOptions {
        root: t.0.join("infiniband"),
        net_root: t.0.join("net"),
        async_events: false,
        kernel_log: false,
        ..WatchOptions::new(Duration::from_secs(1))
    };
    let (mut w, first) = Watcher::start(opts).unwrap();
    assert_eq!(first.len(), 1, "{first:#?}");
    assert!(w.wake(true, &[]).is_empty(), "nothing changed");
    t.write("net/dummy0/mtu", "1200\n");
    let lines = w.wake(false, &[]);
    assert_eq!(
        lines.iter().map(|l| (l.kind, l.severity, l.message.as_str())).collect::<Vec<_>>(),
        [(Kind::Mtu, Level::Note, "the MTU of netdev dummy0 changed from 1500 to 1200")],
        "{lines:#?}"
    );
    assert_eq!(lines[0].port, Some(1));
    assert!(w.wake(true, &[]).is_empty(), "said once");
}
