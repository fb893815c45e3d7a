//! Counters and metrics on the test bed: a healthy run records rxe's hw_counters with
//! their files and names no counter that warns; a SEND to a QP with no receive posted
//! moves the RNR counters and the doctor names them as a receiver not ready; the metrics
//! of `--prometheus` and of `--serve --metrics-port` parse with a Prometheus text parser
//! and pass Prometheus' own lint (`promtool check metrics`).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use prometheus_parse::{Sample, Scrape, Value};
use rdma_doctor::facts::counters;
use rdma_doctor::model::counters::CounterClass;
use rdma_doctor::model::report::Severity;
use rdma_doctor::{Layer, Status};
use rdma_test_support::{device_name, isolated, open, this_test, LeakCheck};
use rdma_verbs::{ffi, AccessFlags, AlignedBuf, CompletionQueue, InitAttr, ProtectionDomain, QpType, QueuePair};

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_healthy_run_records_the_hw_counters_with_their_files_and_no_counter_warns() {
    isolated(this_test!(), || {
        let name = device_name();
        let r = super::run(&super::options());
        let c = r.observations.counters.get(&name).unwrap_or_else(|| panic!("no counters recorded: {r:#?}"));
        let port = c.ports.get("1").expect("port 1's counters");
        // rxe keeps its counters per port (hardware may keep some per device).
        let hw = if port.hw_counters.is_empty() { &c.hw_counters } else { &port.hw_counters };
        let retry = hw.get("retry_exceeded_err").unwrap_or_else(|| panic!("rxe's hw_counters: {c:#?}"));
        assert!(retry.source.starts_with(&format!("/sys/class/infiniband/{name}/")), "{retry:?}");
        assert!(retry.value.is_some() && retry.error.is_none(), "{retry:?}");
        // The loopback test sent packets: the traffic counters moved, with no class.
        let sent = r.observations.counter_changes.iter().find(|m| m.name == "sent_pkts");
        assert!(sent.is_some_and(|m| m.after > m.before && m.class.is_none()), "{:#?}", r.observations.counter_changes);
        let moved: Vec<_> = r.findings.iter().filter(|f| f.what.contains("counters moved")).collect();
        assert!(moved.iter().all(|f| f.severity == Severity::Note), "{moved:#?}");
        assert_eq!((r.status, r.exit_code), (Status::Healthy, 0), "{:#?}", r.findings);
        // The report reads back, counters and all.
        assert_eq!(rdma_doctor::model::input::parse_report(&r.to_json()).unwrap(), r);
    });
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_send_to_a_qp_with_no_receive_posted_moves_the_rnr_counters_and_is_named_receiver_not_ready() {
    let _leaks = LeakCheck::new();
    let name = device_name();
    let before = counters::sample(std::slice::from_ref(&name));
    {
        let ctx = open();
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let (cq_a, cq_b) = (CompletionQueue::new(&ctx, 4).unwrap(), CompletionQueue::new(&ctx, 4).unwrap());
        let a = QueuePair::builder(&pd, QpType::Rc, &cq_a, &cq_a).max_send_wr(2).max_recv_wr(2).build().unwrap();
        let b = QueuePair::builder(&pd, QpType::Rc, &cq_b, &cq_b).max_send_wr(2).max_recv_wr(2).build().unwrap();
        let src = pd.register(AlignedBuf::new(4096).unwrap(), AccessFlags::LOCAL_WRITE).unwrap();
        let (ia, ib) = (a.local_info(1).unwrap(), b.local_info(1).unwrap());
        let init = InitAttr { port: 1, ..InitAttr::default() };
        a.connect(&init, &ib).unwrap();
        b.connect(&init, &ia).unwrap();
        // b posts no receive: every try of this SEND is answered with an RNR NAK.
        let mut sge = src.sge(..64).unwrap();
        let mut wr = ffi::ibv_send_wr {
            wr_id: 1,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: ffi::ibv_wr_opcode::IBV_WR_SEND,
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: a is live; the WR and SGE outlive the call; `src` is registered and is
        // dropped only after the completion is polled and the QPs are destroyed (below).
        let rc = unsafe { ffi::ibv_post_send(a.as_raw(), &mut wr, &mut bad) };
        assert_eq!(rc, 0, "ibv_post_send");
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut cq = cq_a;
        let wc = loop {
            if let Some(wc) = cq.poll_one().unwrap() {
                break wc;
            }
            assert!(Instant::now() < deadline, "no completion for the SEND nobody receives");
            std::thread::sleep(Duration::from_millis(1));
        };
        let err = wc.ok().expect_err("a SEND with no receive posted cannot succeed");
        eprintln!("the SEND completed with: {err}");
        drop((a, b));
        drop((cq, cq_b, src));
    }
    // rxe's hw_counters are cached for their lifespan (10 ms by default).
    std::thread::sleep(Duration::from_millis(100));
    let after = counters::sample(std::slice::from_ref(&name));
    let moved = counters::changes(&before, &after);
    let rnr: Vec<_> = moved.iter().filter(|m| m.class == Some(CounterClass::Rnr)).collect();
    assert!(!rnr.is_empty(), "no RNR counter moved: {moved:#?}");
    let found = rdma_doctor::judge::counter_findings::findings(&moved, &Default::default(), "during the test");
    let f = found.iter().find(|f| f.what.contains("receiver not ready")).unwrap_or_else(|| panic!("{found:#?}"));
    assert_eq!((f.layer, f.scope.as_str()), (Some(Layer::DataPlane), name.as_str()), "{f:#?}");
    assert!(f.what.contains(&rnr[0].name), "{f:#?}");
    assert!(f.advice.as_deref().is_some_and(|a| a.contains("rdma resource show qp")), "{f:#?}");
}

fn parse(text: &str) -> Vec<Sample> {
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("the metrics parse").samples
}

fn value(samples: &[Sample], metric: &str, want: &[(&str, &str)]) -> Option<f64> {
    samples.iter().find(|s| s.metric == metric && want.iter().all(|(k, v)| s.labels.get(k) == Some(*v))).map(
        |s| match s.value {
            Value::Counter(x) | Value::Gauge(x) | Value::Untyped(x) => x,
            _ => panic!("{s:?}"),
        },
    )
}

/// `promtool check metrics` (Debian's prometheus package: scripts/setup installs it) has
/// nothing to say about `text`: names, types, suffixes and help texts as Prometheus wants.
#[track_caller]
fn promtool_lint_is_clean(text: &str) {
    let mut lint = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool, of Debian's prometheus package: run scripts/setup");
    lint.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = lint.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics: {said}\n{text}");
}

/// What every scrape of the healthy device says.
#[track_caller]
fn healthy_metrics(text: &str, name: &str) {
    let s = parse(text);
    assert_eq!(
        value(&s, "rdma_doctor_layer_verdict", &[("scope", name), ("layer", "data_plane")]),
        Some(0.0),
        "{text}"
    );
    assert_eq!(value(&s, "rdma_doctor_layer_verdict", &[("scope", name), ("layer", "link")]), Some(0.0), "{text}");
    assert_eq!(value(&s, "rdma_doctor_known_bad", &[("device", name)]), Some(0.0), "{text}");
    assert_eq!(value(&s, "rdma_doctor_versions_info", &[("device", name), ("provider", "rxe")]), Some(1.0), "{text}");
    let hw = [("device", name), ("port", "1"), ("name", "sent_pkts")];
    assert!(value(&s, "rdma_doctor_port_hw_counters_total", &hw).is_some_and(|v| v > 0.0), "{text}");
    let rate = value(&s, "rdma_doctor_link_rate_gbps", &[("device", name), ("port", "1")]).expect("the rate");
    let reference =
        value(&s, "rdma_doctor_link_reference_gbps", &[("device", name), ("port", "1")]).expect("rxe's rule");
    assert!(rate >= reference, "{text}");
    assert_eq!(value(&s, "rdma_doctor_exit_code", &[]), Some(0.0), "{text}");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn prometheus_output_parses_and_the_metrics_port_answers_a_scrape_over_127_0_0_1() {
    // The doctors are processes of their own and have ended when this checks.
    let _leaks = LeakCheck::new();
    let doctor = env!("CARGO_BIN_EXE_rdma-doctor");
    let name = device_name();
    let out = Command::new(doctor).args(["-d", &name, "--prometheus"]).stdin(Stdio::null()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    healthy_metrics(&text, &name);
    promtool_lint_is_clean(&text);

    let (server, answer) = super::Served::start(&[]);
    drop(server);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("{answer}"));
    assert!(head.starts_with("HTTP/1.0 200 OK") && head.contains("text/plain; version=0.0.4"), "{head}");
    healthy_metrics(body, &name);
    promtool_lint_is_clean(body);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_peer_probe_records_the_counters_of_its_device_that_moved_while_it_ran() {
    let _leaks = LeakCheck::new();
    let doctor = env!("CARGO_BIN_EXE_rdma-doctor");
    let dev = device_name();
    let (mut server, addr) = super::peer::start_server(&rdma_test_support::rdma_ip().to_string());
    let out = Command::new(doctor)
        .args(["--peer", &addr, "-d", &dev, "--timeout", "10", "--json"])
        .stdin(Stdio::null())
        .output()
        .expect("run rdma-doctor --peer");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    let (status, log) = super::peer::server_end(&mut server);
    assert_eq!(status.code(), Some(0), "{log}");
    let r: rdma_doctor::modes::peer::PeerReport = serde_json::from_str(&text).expect("one JSON object");
    assert_eq!(r.format_version, rdma_doctor::modes::peer::PEER_FORMAT_VERSION);
    assert_eq!(r.format_version, 3);
    let sent = r.counter_changes.iter().find(|c| c.name == "sent_pkts" && c.device == dev);
    assert!(sent.is_some_and(|c| c.after > c.before), "{:#?}", r.counter_changes);
    assert!(r.checks.iter().filter(|c| c.layer == "counters").all(|c| c.ok), "{:#?}", r.checks);
    assert!(matches!(out.status.code(), Some(0 | 4)), "{text}");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_healthy_run_records_the_netdevs_statistics_with_their_files_and_none_warns() {
    isolated(this_test!(), || {
        let name = device_name();
        let r = super::run(&super::options());
        let c = r.observations.counters.get(&name).unwrap_or_else(|| panic!("no counters recorded: {r:#?}"));
        let port = c.ports.get("1").expect("port 1's counters");
        let nd = port.netdev.as_ref().unwrap_or_else(|| panic!("rxe's port is RoCE: its netdev's statistics: {c:#?}"));
        eprintln!("{}", serde_json::to_string_pretty(nd).unwrap());
        let dropped = nd.statistics.get("rx_dropped").unwrap_or_else(|| panic!("{nd:#?}"));
        assert_eq!(dropped.source, format!("/sys/class/net/{}/statistics/rx_dropped", nd.name), "{dropped:?}");
        assert!(dropped.value.is_some() && dropped.error.is_none(), "{dropped:?}");
        assert!(nd.statistics.contains_key("rx_crc_errors") && nd.statistics.contains_key("tx_carrier_errors"));
        // A driver's ethtool statistics, where it has any, name their command.
        for (n, s) in &nd.ethtool {
            assert_eq!(s.source, format!("ethtool -S {}: {n}", nd.name));
        }
        let warned: Vec<_> = r.findings.iter().filter(|f| f.severity != Severity::Note).collect();
        assert!(warned.is_empty(), "{warned:#?}");
        assert_eq!((r.status, r.exit_code), (Status::Healthy, 0), "{:#?}", r.findings);
        assert_eq!(rdma_doctor::model::input::parse_report(&r.to_json()).unwrap(), r);
    });
}
