//! The perftest-style tools, run as the user runs them: the example binaries (built on
//! the host beforehand, found in target/<profile>/examples) in child processes on the
//! device, server and client over TCP on 127.0.0.1 or `--loopback` in one process. Few
//! iterations each: the test bed emulates its CPU.

use std::path::PathBuf;

use serde_json::Value;

use crate::{device_name, gid_index, open, LeakCheck};
use rdma_test_support::tool::{run, Finished, Proc};

/// The device flags every run takes.
fn dev_args() -> Vec<String> {
    vec!["-d".into(), device_name(), "-x".into(), gid_index().to_string()]
}

/// Runs a server and then its client on 127.0.0.1 (same flags, `extra` per side), and
/// returns both.
fn server_client(name: &str, port: u16, args: &[&str], client_extra: &[&str]) -> (Finished, Finished) {
    let mut common = dev_args();
    common.extend(["-p".to_string(), port.to_string()]);
    common.extend(args.iter().map(|s| s.to_string()));
    let mut server = Proc::spawn(name, &common);
    server.wait_stderr("waiting for a client");
    let mut c = common.clone();
    c.extend(client_extra.iter().map(|s| s.to_string()));
    c.push("127.0.0.1".into());
    let client = run(name, &c);
    (server.finish(), client)
}

/// One JSON object per line of `stdout`.
fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

/// A latency object with every key, sane values and the iterations asked for.
fn check_latency_json(v: &Value, bytes: u64, iterations: u64, what: &str) {
    let num = |k: &str| v.get(k).and_then(Value::as_f64).unwrap_or_else(|| panic!("{what}: no number {k} in {v}"));
    assert_eq!(v.get("bytes").and_then(Value::as_u64), Some(bytes), "{what}: bytes in {v}");
    assert_eq!(v.get("iterations").and_then(Value::as_u64), Some(iterations), "{what}: iterations in {v}");
    let (min, typ, max) = (num("t_min_us"), num("t_typical_us"), num("t_max_us"));
    let (avg, stdev, p99, p999) = (num("t_avg_us"), num("t_stdev_us"), num("p99_us"), num("p999_us"));
    assert!(min > 0.0 && min <= typ && typ <= max, "{what}: t_min <= t_typical <= t_max fails in {v}");
    assert!(min <= avg && avg <= max && stdev >= 0.0, "{what}: t_avg or t_stdev out of range in {v}");
    assert!(typ <= p99 && p99 <= p999 && p999 <= max, "{what}: percentiles out of order in {v}");
    // A round trip on any device, even emulated, is well under a second.
    assert!(typ < 1e6, "{what}: t_typical of {typ} us is no latency in {v}");
}

/// A latency tool in `--loopback` and as server + client: each prints one sane JSON object.
fn latency_tool(name: &str, port: u16, size: &str) {
    let _leaks = LeakCheck::new();
    let mut args = dev_args();
    args.extend(["--loopback", "--json", "-n", "60", "-s", size].map(String::from));
    let done = run(name, &args);
    assert!(done.status.success(), "{name} --loopback failed\n{}", done.report(name));
    let objs = json_lines(&done.stdout);
    assert_eq!(objs.len(), 1, "{name} --loopback: one JSON line expected\n{}", done.report(name));
    check_latency_json(&objs[0], size.parse().unwrap(), 60, &format!("{name} --loopback"));

    let (server, client) = server_client(name, port, &["-n", "40", "-s", size], &["--json"]);
    assert!(server.status.success(), "{name} server failed\n{}", server.report(name));
    assert!(client.status.success(), "{name} client failed\n{}", client.report(name));
    let objs = json_lines(&client.stdout);
    assert_eq!(objs.len(), 1, "{name} client: one JSON line expected\n{}", client.report(name));
    check_latency_json(&objs[0], size.parse().unwrap(), 40, &format!("{name} client"));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn write_lat_loopback_and_server_client_print_sane_json() {
    latency_tool("write_lat", 18611, "2");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn send_lat_loopback_and_server_client_print_sane_json() {
    latency_tool("send_lat", 18612, "2");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn read_lat_loopback_and_server_client_print_sane_json() {
    latency_tool("read_lat", 18613, "64");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn write_bw_server_and_client_over_tcp_pass_the_data_check_and_print_the_table() {
    let _leaks = LeakCheck::new();
    // -u: perftest's QP timeout, taken by both sides (a shorter one than the default 14).
    let (server, client) = server_client("write_bw", 18614, &["-s", "4096", "-n", "300", "-q", "2", "-u", "12"], &[]);
    assert!(server.status.success(), "write_bw server failed\n{}", server.report("server"));
    assert!(client.status.success(), "write_bw client failed\n{}", client.report("client"));
    assert!(
        server.stderr.contains("4096 B: the data check passed on 2 QPs"),
        "the server did not report its data check\n{}",
        server.report("server")
    );
    let header = client.stdout.lines().position(|l| l.contains("#bytes") && l.contains("BW average[MiB/sec]"));
    let header = header.unwrap_or_else(|| panic!("no table header\n{}", client.report("client")));
    let row: Vec<&str> = client.stdout.lines().nth(header + 1).unwrap_or("").split_whitespace().collect();
    assert_eq!(row.len(), 5, "one row of 5 columns after the header\n{}", client.report("client"));
    assert_eq!((row[0], row[1]), ("4096", "300"), "bytes and iterations\n{}", client.report("client"));
    let nums: Vec<f64> = row[2..].iter().map(|s| s.parse().unwrap()).collect();
    assert!(nums.iter().all(|&x| x > 0.0), "positive bandwidth and rate\n{}", client.report("client"));
    assert!(nums[0] >= nums[1], "peak below average\n{}", client.report("client"));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn write_bw_loopback_json_has_every_key_with_post_lists() {
    let _leaks = LeakCheck::new();
    let mut args = dev_args();
    args.extend(["--loopback", "--json", "-s", "64", "-n", "320", "-l", "32", "-q", "2"].map(String::from));
    let done = run("write_bw", &args);
    assert!(done.status.success(), "write_bw failed\n{}", done.report("write_bw"));
    let objs = json_lines(&done.stdout);
    assert_eq!(objs.len(), 1, "one JSON line\n{}", done.report("write_bw"));
    let v = &objs[0];
    assert_eq!(v["bytes"].as_u64(), Some(64), "{v}");
    assert_eq!(v["iterations"].as_u64(), Some(320), "{v}");
    for k in ["bw_peak_mib_s", "bw_avg_mib_s", "msg_rate_mpps"] {
        assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{k} in {v}");
    }
    let (avg, rate) = (v["bw_avg_mib_s"].as_f64().unwrap(), v["msg_rate_mpps"].as_f64().unwrap());
    // Both are the same count over the same time: bytes x rate = bandwidth.
    assert!((avg * f64::from(1 << 20) - rate * 1e6 * 64.0).abs() <= avg * f64::from(1 << 20) * 1e-6, "{v}");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn write_bw_data_mismatch_fails_server_and_client() {
    let _leaks = LeakCheck::new();
    // The server expects the 8 KiB pattern; the client writes the 4 KiB one into the
    // start of the (larger) region: the server's check must catch it and say so to both.
    let mut common = dev_args();
    common.extend(["-p", "18615", "-n", "50"].map(String::from));
    let mut s = common.clone();
    s.extend(["-s", "8192"].map(String::from));
    let mut server = Proc::spawn("write_bw", &s);
    server.wait_stderr("waiting for a client");
    let mut c = common;
    c.extend(["-s", "4096", "127.0.0.1"].map(String::from));
    let client = run("write_bw", &c);
    let server = server.finish();
    assert!(!server.status.success(), "the server passed a wrong pattern\n{}", server.report("server"));
    assert!(server.stderr.contains("data check failed"), "{}", server.report("server"));
    assert!(!client.status.success(), "the client passed a failed check\n{}", client.report("client"));
    assert!(client.stderr.contains("data check failed"), "{}", client.report("client"));
}

/// A bandwidth object with every key, the size and iterations asked for, positive
/// numbers, and bandwidth and message rate that agree.
fn check_bw_json(v: &Value, bytes: u64, iterations: u64, what: &str) {
    assert_eq!(v["bytes"].as_u64(), Some(bytes), "{what}: bytes in {v}");
    assert_eq!(v["iterations"].as_u64(), Some(iterations), "{what}: iterations in {v}");
    for k in ["bw_peak_mib_s", "bw_avg_mib_s", "msg_rate_mpps"] {
        assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{what}: {k} in {v}");
    }
    let (peak, avg, rate) = (
        v["bw_peak_mib_s"].as_f64().unwrap(),
        v["bw_avg_mib_s"].as_f64().unwrap(),
        v["msg_rate_mpps"].as_f64().unwrap(),
    );
    assert!(peak >= avg, "{what}: peak below average in {v}");
    // Both are the same count over the same time: bytes x rate = bandwidth.
    let bw = avg * f64::from(1 << 20);
    assert!((bw - rate * 1e6 * bytes as f64).abs() <= bw * 1e-6, "{what}: bandwidth and rate disagree in {v}");
}

/// A bandwidth tool in `--loopback` (2 QPs, post lists of 4) and as server + client over
/// TCP (2 QPs): sane JSON from both, and the server's data check passed.
fn bandwidth_tool(name: &str, port: u16, passed: &str) {
    let _leaks = LeakCheck::new();
    let mut args = dev_args();
    args.extend(["--loopback", "--json", "-s", "4096", "-n", "240", "-l", "4", "-q", "2"].map(String::from));
    let done = run(name, &args);
    assert!(done.status.success(), "{name} --loopback failed\n{}", done.report(name));
    let objs = json_lines(&done.stdout);
    assert_eq!(objs.len(), 1, "{name} --loopback: one JSON line expected\n{}", done.report(name));
    check_bw_json(&objs[0], 4096, 240, &format!("{name} --loopback"));

    let (server, client) = server_client(name, port, &["-s", "8192", "-n", "150", "-q", "2"], &["--json"]);
    assert!(server.status.success(), "{name} server failed\n{}", server.report("server"));
    assert!(client.status.success(), "{name} client failed\n{}", client.report("client"));
    assert!(
        server.stderr.contains(&format!("8192 B: {passed} passed on 2 QPs")),
        "the {name} server did not report the data check\n{}",
        server.report("server")
    );
    let objs = json_lines(&client.stdout);
    assert_eq!(objs.len(), 1, "{name} client: one JSON line expected\n{}", client.report("client"));
    check_bw_json(&objs[0], 8192, 150, &format!("{name} client"));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn read_bw_loopback_and_server_client_print_sane_json_and_pass_the_data_check() {
    // The client checks what it read; the server reports the client's verdict.
    bandwidth_tool("read_bw", 18616, "the client's data check");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn send_bw_loopback_and_server_client_print_sane_json_and_pass_the_data_check() {
    bandwidth_tool("send_bw", 18617, "the data check");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn bw_tools_finish_when_post_lists_pools_or_credits_do_not_line_up_with_the_moderation() {
    // Post lists of 8 into a depth of 100 stop at 96 requests in flight, none of them the
    // 100th (the moderation's signal); send_bw's 4 receives let the client send 4 at a
    // time against a moderation of 64. Each run needs a signaled request in flight
    // whenever it waits, and send_bw needs the server's credits: without them the client
    // overruns the 4 receives and the server answers receiver-not-ready (on rxe, 75 RNR
    // NAKs in this run when the client ignored its credits), which the device counts.
    let _leaks = LeakCheck::new();
    let rnr_before = rnr_naks();
    let cases: [(&str, &[&str]); 3] = [
        ("write_bw", &["-t", "100", "-l", "8"]),
        ("read_bw", &["-t", "100", "-l", "8"]),
        ("send_bw", &["-r", "4", "-t", "64", "-l", "8"]),
    ];
    for (name, flags) in cases {
        let mut args = dev_args();
        args.extend(["--loopback", "--json", "-s", "64", "-n", "400"].map(String::from));
        args.extend(flags.iter().map(|s| s.to_string()));
        let what = format!("{name} {}", flags.join(" "));
        let done = run(name, &args);
        assert!(done.status.success(), "{what} failed\n{}", done.report(&what));
        let objs = json_lines(&done.stdout);
        assert_eq!(objs.len(), 1, "{what}: one JSON line expected\n{}", done.report(&what));
        check_bw_json(&objs[0], 64, 400, &what);
    }
    match (rnr_before, rnr_naks()) {
        (Some(before), Some(after)) => {
            assert_eq!(after, before, "receiver-not-ready NAKs happened (hw_counters rcvd_rnr_err + send_rnr_err)")
        }
        _ => eprintln!("note: {} has no RNR counters in sysfs: receiver-not-ready not checked", device_name()),
    }
}

/// The device's receiver-not-ready NAKs, sent and received, from rxe's port counters
/// (`None` where the device has no such counters).
fn rnr_naks() -> Option<u64> {
    let dir = PathBuf::from(format!("/sys/class/infiniband/{}/ports/1/hw_counters", device_name()));
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok()?.trim().parse::<u64>().ok();
    Some(read("rcvd_rnr_err")? + read("send_rnr_err")?)
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn read_bw_and_send_bw_data_mismatch_fails_server_and_client() {
    let _leaks = LeakCheck::new();
    // As for write_bw: the server runs 8 KiB, the client 4 KiB. read_bw's client reads
    // the start of the 8 KiB pattern and must find it is not the 4 KiB one; send_bw's
    // server receives 4 KiB messages where it expects 8 KiB ones.
    let cases = [
        ("read_bw", "18618", "client", "byte 0 of 4096"),
        ("send_bw", "18619", "server", "message 1: 4096 bytes arrived, 8192 expected"),
    ];
    for (name, port, checker, where_) in cases {
        let mut common = dev_args();
        common.extend(["-p", port, "-n", "50"].map(String::from));
        let mut s = common.clone();
        s.extend(["-s", "8192"].map(String::from));
        let mut server = Proc::spawn(name, &s);
        server.wait_stderr("waiting for a client");
        let mut c = common;
        c.extend(["-s", "4096", "127.0.0.1"].map(String::from));
        let client = run(name, &c);
        let server = server.finish();
        let both = format!("{}\n{}", server.report("server"), client.report("client"));
        assert!(!server.status.success(), "{name}: the server passed a wrong pattern\n{both}");
        assert!(!client.status.success(), "{name}: the client passed a failed check\n{both}");
        assert!(server.stderr.contains("data check failed"), "{name}: server\n{both}");
        assert!(client.stderr.contains("data check failed"), "{name}: client\n{both}");
        // The side that checks says where.
        let checked = if checker == "client" { &client.stderr } else { &server.stderr };
        assert!(checked.contains(where_), "{name}: the {checker} does not say {where_:?}\n{both}");
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn every_nonsense_flag_exits_non_zero_naming_the_problem() {
    let _leaks = LeakCheck::new();
    let max_qp_wr = open().query_device().unwrap().max_qp_wr;
    let over_device = (max_qp_wr + 1).to_string();
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        ("write_bw", vec!["-s", "0"], "size 0"),
        ("write_bw", vec!["-a", "-s", "64"], "cannot be combined with -s"),
        ("write_bw", vec!["-q", "0"], "must be at least 1"),
        ("write_bw", vec!["-t", "0"], "must be at least 1"),
        ("write_bw", vec!["-t", "100000000"], "tx depth 100000000 (-t) is beyond"),
        ("write_bw", vec!["-t", &over_device], "exceeds the device's max_qp_wr"),
        ("write_bw", vec!["-l", "200"], "post list 200 (-l) is larger than the tx depth"),
        ("write_bw", vec!["-Q", "0"], "CQ moderation 0"),
        ("write_bw", vec!["-Q", "1000"], "CQ moderation 1000 (-Q) is larger than the tx depth"),
        ("write_bw", vec!["-n", "0"], "0 iterations"),
        ("write_bw", vec!["-D", "0"], "duration 0 (-D)"),
        ("write_bw", vec!["-u", "32"], "0..=31"),
        ("write_lat", vec!["-u", "32"], "0..=31"),
        ("read_bw", vec!["-o", "0"], "0 outstanding reads (-o)"),
        ("read_bw", vec!["-o", "100000"], "outstanding reads (-o) is beyond"),
        ("read_bw", vec!["-t", "0"], "must be at least 1"),
        ("send_bw", vec!["-r", "0"], "rx depth 0 (-r)"),
        ("send_bw", vec!["-r", &over_device], "exceeds the device's max_qp_wr"),
        ("send_bw", vec!["-Q", "1000"], "CQ moderation 1000 (-Q) is larger than the tx depth"),
        ("write_lat", vec!["-s", "0"], "size 0"),
        ("send_lat", vec!["-a", "-s", "8"], "cannot be combined with -s"),
        ("read_lat", vec!["-n", "0"], "0 iterations"),
        ("write_lat", vec!["127.0.0.1"], "drop the host argument"),
    ];
    // Every run started at once, then each waited for: they are independent, and a run
    // mostly waits (on rxe under TCG the 29 took 22 s one after another, 5 s at once).
    let mut runs = Vec::new();
    for (name, flags, needle) in cases {
        let mut args = dev_args();
        args.push("--loopback".into());
        args.extend(flags.iter().map(|s| s.to_string()));
        runs.push((format!("{name} {}", flags.join(" ")), Proc::spawn(name, &args), needle));
    }
    for name in ["write_bw", "read_bw", "send_bw", "write_lat", "send_lat", "read_lat"] {
        let args = ["--loopback".into(), "-d".into(), "no_such_dev".into()];
        runs.push((format!("{name} -d no_such_dev"), Proc::spawn(name, &args), "no_such_dev"));
    }
    for (what, proc, needle) in runs {
        let done = proc.finish();
        assert!(!done.status.success(), "{what} was accepted\n{}", done.report(&what));
        assert!(done.stderr.contains(needle), "{what}: stderr does not say {needle:?}\n{}", done.report(&what));
    }
}

// ---- the other example tools (once scripts/test's smoke runs) ---------------------------

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn devinfo_shows_the_device_under_test_with_an_active_port_and_exits_2_on_a_bad_flag() {
    let _leaks = LeakCheck::new();
    let name = device_name();
    let done = run("devinfo", &["-d".into(), name.clone(), "-v".into()]);
    assert!(done.status.success(), "devinfo failed\n{}", done.report("devinfo"));
    assert!(
        done.stdout.contains(&format!("hca_id:\t{name}")),
        "devinfo did not show {name}\n{}",
        done.report("devinfo")
    );
    assert!(done.stdout.contains("PORT_ACTIVE"), "no active port\n{}", done.report("devinfo"));
    let done = run("devinfo", &["-l".into()]);
    assert!(done.status.success() && done.stdout.contains(&name), "devinfo -l\n{}", done.report("devinfo -l"));

    let done = run("devinfo", &["-d".into(), "no_such_dev".into()]);
    assert_eq!(done.status.code(), Some(1), "an unknown device\n{}", done.report("devinfo -d no_such_dev"));
    for bad in [&["--no-such-flag"][..], &["-d"]] {
        let done = run("devinfo", &bad.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(done.status.code(), Some(2), "a usage error\n{}", done.report("devinfo"));
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn soak_for_20_s_checks_every_byte_and_balances_posts_completions_and_resources() {
    let _leaks = LeakCheck::new();
    // scripts/soak runs it for minutes; 20 s with 2 pairs is the test's share.
    let args = ["-d", &device_name(), "--minutes", "0.34", "--qps", "2", "--warmup-secs", "5"].map(String::from);
    let done = run("soak", &args);
    assert!(done.status.success(), "soak failed\n{}", done.report("soak"));
    let summary = done.stdout.lines().last().unwrap_or_default();
    assert!(summary.starts_with("soak: PASS "), "no PASS summary\n{}", done.report("soak"));
    for clean in ["checksum_errors=0 ", "wc_errors=0 ", "other_errors=0 "] {
        assert!(summary.contains(clean), "{clean} in {summary}");
    }
    assert!(!summary.contains(" ops=0 "), "no operation ran: {summary}");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn soak_catches_one_flipped_bit_in_a_write_that_landed() {
    let _leaks = LeakCheck::new();
    // The checker's self-test: one bit of the first WRITE that lands is flipped before
    // its check, and the run must fail on that, not pass.
    let args = ["-d", &device_name(), "--minutes", "0.1", "--qps", "1", "--warmup-secs", "0", "--corrupt-one-write"]
        .map(String::from);
    let done = run("soak", &args);
    assert!(!done.status.success(), "soak passed with a corrupted WRITE\n{}", done.report("soak"));
    let summary = done.stdout.lines().last().unwrap_or_default();
    assert!(summary.starts_with("soak: FAIL "), "no FAIL summary\n{}", done.report("soak"));
    assert!(summary.contains(" checksum_errors=1 "), "one checksum error in {summary}");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn write_bw_over_rdma_cm_passes_the_data_check_and_meets_perftests_rdma_cm_in_both_roles() {
    rdma_test_support::tool::write_bw_over_rdma_cm_meets_itself_and_perftest(18621);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn read_bw_send_bw_and_the_latency_tools_run_over_rdma_cm_with_their_checks() {
    let ip = rdma_test_support::rdma_ip().to_string();
    let runs: [(&str, &[&str], &str); 5] = [
        ("read_bw", &["-s", "4096", "-n", "100"], "4096 B: the client's data check passed on 1 QP"),
        ("send_bw", &["-s", "4096", "-n", "100", "-q", "2"], "4096 B: the data check passed on 2 QPs"),
        ("write_lat", &["-n", "40", "--json"], "iterations done"),
        ("read_lat", &["-s", "64", "-n", "40", "--json"], "iterations done"),
        ("send_lat", &["-n", "40", "--json"], "iterations done"),
    ];
    for (i, (name, args, server_says)) in runs.into_iter().enumerate() {
        let mut s: Vec<String> = ["-R", "-p", &(18622 + i as u16).to_string()].map(String::from).to_vec();
        s.extend(args.iter().map(|a| a.to_string()));
        let mut c = s.clone();
        c.push(ip.clone());
        let (server, client) = rdma_test_support::tool::cm_pair((name, &s), (name, &c));
        assert!(server.status.success(), "{name} -R server failed\n{}", server.report("server"));
        assert!(client.status.success(), "{name} -R client failed\n{}", client.report("client"));
        assert!(
            server.stderr.contains(server_says),
            "{name} -R server: no {server_says:?}\n{}",
            server.report("server")
        );
        if name.ends_with("_lat") {
            let objs = json_lines(&client.stdout);
            assert_eq!(objs.len(), 1, "{name} -R client: one JSON line expected\n{}", client.report("client"));
            let bytes = if name == "read_lat" { 64 } else { 2 };
            check_latency_json(&objs[0], bytes, 40, &format!("{name} -R client"));
        } else {
            let row = rdma_test_support::tool::bw_row(&client.stdout, 4096, 100);
            assert!(row.is_some(), "{name} -R client: no 4096 x 100 row\n{}", client.report("client"));
        }
    }
}
