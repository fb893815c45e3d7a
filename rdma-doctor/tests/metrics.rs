//! The metrics of a recorded report, read back by a parser of the Prometheus text format
//! as a scraper would: every family, label and value the doctor promises.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use prometheus_parse::{Sample, Scrape, Value};
use rdma_doctor::facts::counters;
use rdma_doctor::judge::known_bad;
use rdma_doctor::model::input;
use rdma_doctor::model::report::LinkReference;
use rdma_doctor::modes::metrics;
use rdma_doctor::{Layer, Outcome};

fn parse(text: &str) -> Vec<Sample> {
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("the exposition parses").samples
}

fn value(v: &Value) -> f64 {
    match v {
        Value::Counter(x) | Value::Gauge(x) | Value::Untyped(x) => *x,
        other => panic!("not a single value: {other:?}"),
    }
}

/// The samples of `metric` whose labels include every pair of `want`.
fn find<'a>(samples: &'a [Sample], metric: &str, want: &[(&str, &str)]) -> Vec<&'a Sample> {
    samples.iter().filter(|s| s.metric == metric && want.iter().all(|(k, v)| s.labels.get(k) == Some(*v))).collect()
}

#[test]
fn a_recorded_known_bad_node_exports_counters_verdicts_versions_known_bad_and_rates() {
    let text = include_str!("../testdata/node-c-connectx5-known-bad.json");
    let mut r = input::parse_report(text).expect("the fixture reads");
    let d = r.baseline.devices["mlx5_0"].clone();
    r.findings.extend(known_bad::check(&known_bad::load(&[] as &[&Path]).unwrap(), "mlx5_0", &d));
    assert!(!r.findings.is_empty(), "the fixture is a known-bad combination");
    // The link failed on this node: a degraded port.
    let link = r.layers.iter_mut().find(|l| l.layer == Layer::Link).unwrap();
    link.outcome = Outcome::Fail;
    r.settle_status();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/counters/mlx5-after");
    let c = BTreeMap::from([("mlx5_0".to_owned(), counters::read_device(&root, "mlx5_0"))]);
    r.observations.link_references = BTreeMap::from([(
        "mlx5_0".into(),
        BTreeMap::from([("1".into(), LinkReference { gbps: 200.0, from: "x".into() })]),
    )]);

    let out = metrics::encode_report(&r, &c, Duration::from_millis(1500));
    let s = parse(&out);
    // The classic text format: a counter's metadata names its samples; no OpenMetrics `# EOF`.
    assert!(out.contains("\n# HELP rdma_doctor_port_hw_counters_total A port hw_counter"), "{out}");
    assert!(out.contains("\n# TYPE rdma_doctor_port_hw_counters_total counter\n"), "{out}");
    assert!(out.contains("# TYPE rdma_doctor_port_counters_total counter\n"), "{out}");
    assert!(
        out.contains("# TYPE rdma_doctor_device_hw_counters_total counter\n") || c["mlx5_0"].hw_counters.is_empty()
    );
    assert!(!out.contains("# EOF") && out.ends_with('\n'), "{out}");
    assert!(out.contains("# TYPE rdma_doctor_port_state gauge\n"), "{out}");

    let seq = find(
        &s,
        "rdma_doctor_port_hw_counters_total",
        &[("device", "mlx5_0"), ("port", "1"), ("name", "out_of_sequence")],
    );
    assert_eq!(seq.len(), 1, "{out}");
    assert_eq!(value(&seq[0].value), 4.0);
    let xmit =
        find(&s, "rdma_doctor_port_counters_total", &[("device", "mlx5_0"), ("port", "1"), ("name", "port_xmit_data")]);
    assert_eq!(value(&xmit[0].value), 2900.0);
    assert!(find(&s, "rdma_doctor_port_hw_counters_total", &[("name", "lifespan")]).is_empty(), "a setting");

    let verdict =
        |layer: &str| value(&find(&s, "rdma_doctor_layer_verdict", &[("scope", "mlx5_0"), ("layer", layer)])[0].value);
    assert_eq!(verdict("link"), 2.0, "failed");
    assert_eq!(verdict("device"), 1.0, "passed with the known-bad warning");
    assert_eq!(verdict("port"), 0.0);
    assert_eq!(value(&find(&s, "rdma_doctor_layer_verdict", &[("scope", "host")])[0].value), 0.0);

    let info = find(&s, "rdma_doctor_versions_info", &[("device", "mlx5_0")]);
    assert_eq!(info.len(), 1, "{out}");
    let l = &info[0].labels;
    assert_eq!(l.get("firmware"), Some(d.fw_ver.as_str()));
    assert_eq!(l.get("kernel"), Some(r.baseline.kernel.release.as_str()));
    assert_eq!(l.get("driver"), d.kernel_driver_name.as_deref());
    assert_eq!(l.get("driver_version"), d.kernel_driver.version.as_deref());
    assert_eq!(l.get("provider"), d.provider.as_ref().map(|p| p.name.as_str()));
    assert!(l.get("rdma_core").is_some_and(|v| !v.is_empty()), "{out}");
    assert_eq!(value(&info[0].value), 1.0);

    assert_eq!(value(&find(&s, "rdma_doctor_known_bad", &[("device", "mlx5_0")])[0].value), 1.0);
    let rate = find(&s, "rdma_doctor_link_rate_gbps", &[("device", "mlx5_0"), ("port", "1")]);
    assert_eq!(value(&rate[0].value), d.ports["1"].rate_gbps);
    let reference = find(&s, "rdma_doctor_link_reference_gbps", &[("device", "mlx5_0"), ("port", "1")]);
    assert_eq!(value(&reference[0].value), 200.0);
    assert_eq!(value(&find(&s, "rdma_doctor_exit_code", &[])[0].value), 1.0);

    let state =
        |s: &[Sample]| value(&find(s, "rdma_doctor_port_state", &[("device", "mlx5_0"), ("port", "1")])[0].value);
    assert_eq!(d.ports["1"].state, "ACTIVE");
    assert_eq!(state(&s), 4.0);
    r.baseline.devices.get_mut("mlx5_0").unwrap().ports.get_mut("1").unwrap().state = "DOWN".into();
    assert_eq!(state(&parse(&metrics::encode_report(&r, &c, Duration::ZERO))), 1.0, "a port that went down");
    assert_eq!(value(&find(&s, "rdma_doctor_report_age_seconds", &[])[0].value), 1.5);
}

#[test]
fn two_encodings_of_a_report_list_the_series_in_the_same_order() {
    let text = include_str!("../testdata/node-c-connectx5-known-bad.json");
    let r = input::parse_report(text).expect("the fixture reads");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/counters/mlx5-after");
    let c = BTreeMap::from([("mlx5_0".to_owned(), counters::read_device(&root, "mlx5_0"))]);
    let first = metrics::encode_report(&r, &c, Duration::ZERO);
    // Many labelled series in one family: a hash map's order would differ between runs.
    let verdicts = first.lines().filter(|l| l.starts_with("rdma_doctor_layer_verdict{")).count();
    let counters = first.lines().filter(|l| l.starts_with("rdma_doctor_port_hw_counters_total{")).count();
    assert!(verdicts >= 8 && counters >= 8, "{first}");
    for _ in 0..20 {
        assert_eq!(metrics::encode_report(&r, &c, Duration::ZERO), first);
    }
    // Sorted within each family, and the families in their order of registration.
    let series: Vec<&str> = first.lines().filter(|l| l.starts_with("rdma_doctor_layer_verdict{")).collect();
    assert!(series.windows(2).all(|w| w[0] < w[1]), "{series:#?}");
    let at = |m: &str| first.find(&format!("# TYPE {m}")).unwrap_or_else(|| panic!("{m}: {first}"));
    assert!(at("rdma_doctor_port_counters_total") < at("rdma_doctor_layer_verdict"));
    assert!(at("rdma_doctor_layer_verdict") < at("rdma_doctor_report_age_seconds"));
    assert!(!first.contains("# EOF"), "{first}");
    assert_eq!(parse(&first).len(), first.lines().filter(|l| !l.starts_with('#')).count());
}

#[test]
fn the_command_refuses_prometheus_with_json_and_metrics_port_without_serve() {
    let run = |args: &[&str]| {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = rdma_doctor::modes::cli::run(
            std::iter::once("rdma-doctor").chain(args.iter().copied()),
            &mut out,
            &mut err,
        );
        (code, String::from_utf8_lossy(&err).into_owned())
    };
    assert_eq!(run(&["--prometheus", "--json"]).0, 2);
    assert_eq!(run(&["--metrics-port", "9100"]).0, 2);
    assert_eq!(run(&["--prometheus", "--serve"]).0, 2);
}
