//! rdma-doctor on the test bed: the healthy device passes every layer with the loopback
//! data test run; breaking one layer at a time (netdev down, rxe link deleted, a tiny
//! memlock limit) makes the verdict name that layer; a saved report edited in one field
//! drifts in exactly that field. Every change to the system is undone by a guard, and the
//! guard's restore is checked.
//!
//! They need a real RDMA device, and `scripts/test` runs them on rxe (`scripts/rxe`), as
//! rdma-verbs's device tests: without a device each of them fails; a plain `cargo test`
//! lists them as ignored. Each takes a [`LeakCheck`]: the device's resource counts must be
//! back where they started when it ends (tests run one at a time, `--test-threads=1`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdma_doctor::facts::rdma_cm::{self, NODE};
use rdma_doctor::model::input;
use rdma_doctor::model::report::{Memlock, Severity};
use rdma_doctor::{Layer, LayerReport, Options, Outcome, Report, Status};
use rdma_verbs::{Context, PortState};

/// Counters around the probes, an induced RNR, and the metrics.
mod counters;
/// Faults induced for real on the test bed: providers, the rdma cgroup, the kernel log,
/// memlock.
mod induced;
/// libibverbs and librdmacm hidden in a mount namespace, and both present.
mod libraries;
/// `--serve` and `--peer` on one node, with hostile clients of the server.
mod peer;
/// A QP timeout in the kernel log: a warning with advice, once per boot.
mod qp_timeout;
/// `--peer`'s measured round trip and the ACK timeout of its QPs.
mod round_trip;
/// `--serve`'s verdicts are fresh: a link taken down between two scrapes fails the next.
mod serve;
/// `--watch`: a healthy idle device, a link flap, Ctrl-C and SIGTERM.
mod watch;
// The test bed, shared with rdma-verbs' device tests: every test whose doctor runs the
// rdma_cm check runs in a process of its own (`isolated`), as librdmacm keeps a context of
// the device open until its process exits, and an open context holds an rxe link that
// another test deletes.
use rdma_test_support::{device_name, example, in_own_process, isolated, open, rdma_ip, this_test, LeakCheck};

/// A free TCP port of 127.0.0.1 (bound, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `GET /metrics` on `port` of 127.0.0.1: the whole answer (head and body), or None while
/// nothing listens there.
fn get_metrics(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(text)
}

/// `rdma-doctor --serve` on the device under test, on ports of its own; killed when dropped.
struct Served {
    child: Child,
    /// Its `--metrics-port`.
    metrics: u16,
    /// Its `--peer-port` (where `--peer` and `--fleet` reach it).
    peer: u16,
}

impl Served {
    /// Starts `rdma-doctor --serve -d DEVICE --metrics-port M --peer-port P ARGS...` and waits
    /// until its metrics port answers (its first diagnosis done; three minutes at most, and
    /// a failure if it exits first): the server and that first answer, head and body.
    fn start(args: &[&str]) -> (Served, String) {
        let (metrics, peer) = (free_port(), free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_rdma-doctor"))
            .args(["--serve", "-d", &device_name(), "--metrics-port", &metrics.to_string()])
            .args(["--peer-port", &peer.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut served = Served { child, metrics, peer };
        let started = Instant::now();
        loop {
            if let Some(answer) = get_metrics(metrics) {
                eprintln!("the first diagnosis and scrape: {:.1} s", started.elapsed().as_secs_f64());
                return (served, answer);
            }
            let exited = served.child.try_wait().unwrap();
            assert!(exited.is_none(), "rdma-doctor --serve {args:?} exited: {exited:?}");
            assert!(started.elapsed() < Duration::from_secs(180), "the metrics port never answered");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// rxe reacts at once; emulation and the GID work around it can be slow.
const WAIT: Duration = Duration::from_secs(15);

fn options() -> Options {
    Options { device: Some(device_name()), ..Options::default() }
}

fn run(opts: &Options) -> Report {
    let report = rdma_doctor::diagnose(opts).unwrap_or_else(|e| panic!("diagnose: {e}"));
    eprintln!("{}", rdma_doctor::render(&report));
    report
}

/// The first failing layer, or a panic that shows the verdict.
#[track_caller]
fn first_failure(r: &Report) -> &LayerReport {
    r.layers.iter().find(|l| l.outcome == Outcome::Fail).unwrap_or_else(|| panic!("no layer failed: {:#?}", r.layers))
}

/// Layers after the first failure were not checked.
#[track_caller]
fn rest_skipped(r: &Report, failed: Layer) {
    let scope = &first_failure(r).scope;
    for l in r.layers.iter().filter(|l| &l.scope == scope && l.layer > failed) {
        assert_eq!(l.outcome, Outcome::Skipped, "{l:?}");
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn healthy_device_passes_every_layer_and_the_loopback_verifies_write_read_send_and_atomics() {
    isolated(this_test!(), || {
        let name = device_name();
        let r = run(&options());

        let layers: Vec<(Layer, Outcome)> = r.layers.iter().map(|l| (l.layer, l.outcome)).collect();
        // kernel_modules and libraries (scope host), then the device's.
        assert_eq!(layers.len(), 2 + Layer::DEVICE_LAYERS.len(), "{layers:?}");
        for l in &r.layers {
            assert_eq!(l.outcome, Outcome::Pass, "{l:#?}");
        }
        let data = r.layers.iter().find(|l| l.layer == Layer::DataPlane).unwrap();
        assert!(data.summary.contains("RDMA_WRITE, RDMA_READ, SEND, FETCH_ADD, CMP_SWAP"), "{data:?}");
        assert!(data.evidence.iter().all(|e| !e.contains("skipped")), "rxe has atomics: {data:?}");
        let cm = r.layers.iter().find(|l| l.layer == Layer::RdmaCm).unwrap();
        assert!(cm.summary.contains("32-byte message received over rdma_cm and verified"), "{cm:?}");
        let ip = rdma_ip();
        assert!(cm.summary.starts_with(&format!("listened on {ip}, connected")), "{cm:?}");
        assert_eq!((r.status, r.exit_code), (Status::Healthy, 0), "{:#?}", r.findings);
        assert!(r.drift.is_empty());

        // The baseline names what the test bed is made of.
        let b = &r.baseline;
        let d = &b.devices[&name];
        assert!(!b.kernel.release.is_empty());
        assert_eq!(b.libraries["libibverbs"].version.as_deref().map(|v| v.starts_with("1.")), Some(true), "{b:#?}");
        assert!(b.modules.contains_key("ib_core") && b.modules.contains_key("ib_uverbs"), "{:?}", b.modules);
        let uverbs = d.uverbs.as_ref().expect("a uverbs node");
        assert!(b.dev_nodes[&format!("/dev/infiniband/{uverbs}")].can_open);
        let provider = d.provider.as_ref().expect("the provider library is identified");
        assert!(Path::new(&provider.library).exists(), "{provider:?}");
        if d.kernel_driver_name.as_deref() == Some("rdma_rxe") {
            assert_eq!(provider.name, "rxe");
            assert!(provider.library.contains("librxe"), "{provider:?}");
            assert!(d.parent_netdev.is_some(), "rxe names its netdev: {d:#?}");
        }
        let port = &d.ports["1"];
        assert_eq!((port.state.as_str(), port.phys_state.as_str()), ("ACTIVE", "LinkUp"), "{port:#?}");
        if let Ok(ip) = std::env::var("RDMA_IP") {
            if !ip.is_empty() {
                let gid = port.gids.values().find(|g| g.gid == format!("::ffff:{ip}")).expect("the IPv4 GID is listed");
                assert_eq!(gid.gid_type, "RoCE v2");
            }
        }

        // The JSON form reads back into the same report.
        let back: Report = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(back, r);
    });
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn the_command_and_its_example_alias_report_the_healthy_device_in_json_and_in_text() {
    // The doctors run in child processes: librdmacm's context leaves with them.
    let _leaks = LeakCheck::new();
    let name = device_name();
    let out = Command::new(env!("CARGO_BIN_EXE_rdma-doctor"))
        .args(["-d", &name, "--json"])
        .output()
        .expect("run rdma-doctor");
    let text = String::from_utf8_lossy(&out.stdout);
    let r =
        input::parse_report(&text).unwrap_or_else(|e| panic!("{e}: {text}{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(out.status.code(), Some(0), "{:#?}", r.layers);
    assert_eq!((r.status, r.exit_code), (Status::Healthy, 0), "{:#?}", r.findings);
    let passed = r.layers.iter().filter(|l| l.scope == name && l.outcome == Outcome::Pass).count();
    assert_eq!(passed, Layer::DEVICE_LAYERS.len(), "every layer of {name} passes: {:#?}", r.layers);

    // `cargo run --example doctor`, the old name, is the same command.
    let out = Command::new(example("doctor")).args(["-d", &name]).output().expect("run examples/doctor");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let data_plane_passed =
        text.lines().any(|l| l.split_whitespace().take(3).eq(["PASS", name.as_str(), "data_plane"]));
    assert!(data_plane_passed, "the loopback data test did not pass: {text}");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn saved_report_edited_in_one_field_drifts_in_exactly_that_field() {
    let _leaks = LeakCheck::new();
    let name = device_name();
    let mut opts = options();
    opts.loopback = false;
    let saved = run(&opts);
    let mut json: serde_json::Value = serde_json::from_str(&saved.to_json()).unwrap();
    let fw = json.pointer_mut(&format!("/baseline/devices/{name}/fw_ver")).expect("fw_ver in the report");
    *fw = serde_json::Value::String("99.99.9999".into());

    opts.compare = Some(input::parse_report(&json.to_string()).expect("the edited report reads"));
    let r = run(&opts);
    let fields: Vec<&str> = r.drift.iter().map(|d| d.field.as_str()).collect();
    assert_eq!(fields, [format!("devices.{name}.fw_ver")], "{:#?}", r.drift);
    assert_eq!(r.drift[0].expected, Some(serde_json::json!("99.99.9999")));
    assert_eq!((r.status, r.exit_code), (Status::Drift, 3));
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn memlock_limit_below_the_need_fails_the_memlock_layer_with_the_ulimit_hint() {
    let _leaks = LeakCheck::new();
    let mut opts = options();
    opts.memlock = Some(Memlock { soft_bytes: Some(64 << 10), hard_bytes: Some(64 << 10), cap_ipc_lock: false });
    let r = run(&opts);
    let f = first_failure(&r);
    assert_eq!((f.layer, f.scope.as_str()), (Layer::Memlock, device_name().as_str()), "{f:#?}");
    assert!(f.summary.contains("64 KiB") && f.summary.contains("1 MiB"), "{f:?}");
    assert!(f.fix.iter().any(|x| x.contains("ulimit -l")), "{f:?}");
    rest_skipped(&r, Layer::Memlock);
    assert_eq!(r.exit_code, 1);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_user_known_bad_entry_for_this_driver_is_a_warning_citing_its_source_with_exit_4() {
    let _leaks = LeakCheck::new();
    let mut opts = options();
    opts.loopback = false;
    let driver = run(&opts).baseline.devices[&device_name()].kernel_driver_name.clone().expect("a known driver");
    let path = std::env::temp_dir().join(format!("doctor-known-bad-{}.json", std::process::id()));
    let list = serde_json::json!({
        "format": "rdma-doctor-known-bad",
        "format_version": 1,
        "entries": [{
            "id": "site-test", "device": "the test bed", "kernel_driver": driver,
            "problem": "flagged by this test", "advice": "nothing to do", "source": "rdma-doctor/tests/device/main.rs"
        }]
    });
    std::fs::write(&path, list.to_string()).unwrap();
    opts.known_bad_files.push(path.clone());
    let r = run(&opts);
    std::fs::remove_file(&path).unwrap();

    assert!(r.layers.iter().all(|l| l.outcome != Outcome::Fail), "{:#?}", r.layers);
    let warnings: Vec<_> = r.findings.iter().filter(|f| f.severity == Severity::Warning).collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(warnings[0].what.contains("known-bad [site-test]"), "{:?}", warnings[0]);
    assert_eq!(warnings[0].source.as_deref(), Some("rdma-doctor/tests/device/main.rs"));
    assert_eq!((r.status, r.exit_code), (Status::Warnings, 4));
}

#[test]
#[ignore = "needs an RDMA device (RoCE, run as root): run scripts/test"]
fn netdev_down_under_the_device_fails_the_port_layer_and_names_the_netdev() {
    isolated(this_test!(), || {
        let ctx = open();
        let gid = ctx.default_gid(1).unwrap();
        let netdev = gid.netdev.clone().expect("a RoCE device: the default GID names its netdev");
        let guard = LinkUp { ctx: ctx.clone(), netdev: netdev.clone(), gid_index: gid.index, gid: gid.gid.to_string() };

        ip(&["link", "set", &netdev, "down"]);
        wait_until("the port leaves ACTIVE", || ctx.query_port(1).is_ok_and(|p| p.state != PortState::Active));
        let r = run(&options());
        let f = first_failure(&r);
        assert_eq!(f.layer, Layer::Port, "{f:#?}");
        assert!(f.summary.contains("port 1 is DOWN"), "{f:?}");
        assert!(f.evidence.iter().any(|e| e.contains(&netdev) && e.contains("administratively down")), "{f:?}");
        assert!(f.fix.iter().any(|x| x == &format!("ip link set {netdev} up")), "{f:?}");
        rest_skipped(&r, Layer::Port);

        guard.restore().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(run(&options()).exit_code, 0, "healthy again after the netdev came back");
    });
}

#[test]
#[ignore = "needs an rxe device (run as root): run scripts/test"]
fn deleted_rxe_link_fails_the_device_layer_and_is_recreated_as_before() {
    // Deleting an rxe link waits until every context of the device is closed: no
    // process of this binary but this test's may hold one (`in_own_process`).
    in_own_process(this_test!(), || {
        let leaks = LeakCheck::new();
        let name = device_name();
        let parent = std::fs::read_to_string(format!("/sys/class/infiniband/{name}/parent")).unwrap_or_else(|e| {
            panic!("{name} is not an rxe device (no sysfs parent: {e}); this test deletes an rxe link")
        });
        let netdev = parent.trim().to_owned();
        let (gid_index, gid) = {
            let ctx = open();
            let g = ctx.default_gid(1).unwrap();
            (g.index, g.gid.to_string())
        }; // every context closed: rxe's unregistration waits for open ones

        let mut opts = options();
        opts.loopback = false;
        let saved = run(&opts);
        let guard = RxeLink { name: name.clone(), netdev: netdev.clone(), gid_index, gid };

        let out = Command::new("rdma").args(["link", "delete", &name]).output().expect("run `rdma` (iproute2)");
        assert!(out.status.success(), "rdma link delete {name}: {}", String::from_utf8_lossy(&out.stderr));
        wait_until("the device leaves sysfs", || !Path::new("/sys/class/infiniband").join(&name).exists());

        let r = run(&opts);
        let f = first_failure(&r);
        assert_eq!((f.layer, f.scope.as_str()), (Layer::Device, name.as_str()), "{f:#?}");
        assert!(f.summary.contains("not enumerated"), "{f:?}");
        assert!(f.fix.iter().any(|x| x.contains("rdma link add")), "{f:?}");
        rest_skipped(&r, Layer::Device);
        // With the saved report, the fix is the exact command, and the device's fields drift.
        opts.compare = Some(saved);
        let r = run(&opts);
        let f = first_failure(&r);
        let exact = format!("rdma link add {name} type rxe netdev {netdev}");
        assert!(f.fix.iter().any(|x| x.starts_with(&exact)), "{f:?}");
        assert!(
            r.drift.iter().any(|d| d.field == format!("devices.{name}.fw_ver") && d.found.is_none()),
            "{:#?}",
            r.drift
        );

        guard.restore().unwrap_or_else(|e| panic!("{e}"));
        // The healthy run's rdma_cm check leaves librdmacm's context of the device open until
        // this process exits: the leak check ends before it.
        drop(leaks);
        opts.compare = None;
        opts.loopback = true;
        assert_eq!(run(&opts).exit_code, 0, "healthy again after the re-creation");
    });
}

#[test]
#[ignore = "needs an rxe device (run as root): run scripts/test"]
fn a_second_device_on_a_netdev_that_is_down_fails_the_default_run_naming_its_port_layer() {
    isolated(this_test!(), || {
        let second = SecondRxe::create("rxedown", "dummydown");
        wait_until("the second device appears", || Path::new("/sys/class/infiniband/rxedown").exists());

        let r = run(&Options::default());
        let first = device_name();
        assert!(r.baseline.devices.contains_key(&first) && r.baseline.devices.contains_key("rxedown"), "both examined");
        let f = first_failure(&r);
        assert_eq!((f.layer, f.scope.as_str()), (Layer::Port, "rxedown"), "{f:#?}");
        assert!(f.fix.iter().any(|x| x == "ip link set dummydown up"), "{f:?}");
        assert!(r.layers.iter().filter(|l| l.scope == first).all(|l| l.outcome != Outcome::Fail), "{:#?}", r.layers);
        assert_eq!((r.status, r.exit_code), (Status::LayerFailed, 1));

        second.remove().unwrap_or_else(|e| panic!("{e}"));
        assert!(!Path::new("/sys/class/infiniband/rxedown").exists());
    });
}

/// A second rxe device on a dummy netdev that stays down, removed (device and netdev)
/// whatever happens in the test.
struct SecondRxe {
    name: &'static str,
    netdev: &'static str,
}

impl SecondRxe {
    fn create(name: &'static str, netdev: &'static str) -> SecondRxe {
        let guard = SecondRxe { name, netdev };
        ip(&["link", "add", netdev, "type", "dummy"]);
        let out = Command::new("rdma").args(["link", "add", name, "type", "rxe", "netdev", netdev]).output();
        let out = out.expect("run `rdma` (iproute2)");
        assert!(out.status.success(), "rdma link add {name}: {}", String::from_utf8_lossy(&out.stderr));
        guard
    }

    /// Deletes the link, then the netdev (bounded: a context left open would hold the
    /// deletion forever).
    fn remove(&self) -> Result<(), String> {
        let steps: [&[&str]; 2] = [&["rdma", "link", "delete", self.name], &["ip", "link", "delete", self.netdev]];
        let mut errors = Vec::new();
        for step in steps {
            let out = Command::new("timeout").arg("60").args(step).output().map_err(|e| e.to_string())?;
            if !out.status.success() {
                errors.push(format!("{}: {}", step.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
            }
        }
        let gone = !Path::new("/sys/class/infiniband").join(self.name).exists()
            && !Path::new("/sys/class/net").join(self.netdev).exists();
        if gone {
            Ok(())
        } else {
            Err(format!("{} or {} is still there: {}", self.name, self.netdev, errors.join("; ")))
        }
    }
}

impl Drop for SecondRxe {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            eprintln!("removing {}: {e}", self.name);
        }
    }
}

#[test]
#[ignore = "needs an rxe device (run as root, bonding and veth in the kernel): run scripts/test"]
fn rxe_on_a_bond_that_lost_one_of_two_legs_fails_its_link_against_the_sum_of_the_legs_the_checks_below_still_run_and_no_rxe_is_anothers_sibling(
) {
    isolated(this_test!(), || {
        // balance-rr over two veths (10 Gb/s each): the bond says 20, rxe runs 4X DDR 20.
        let bed = Undo(vec![
            "rdma link delete rxebond".into(),
            "ip link delete rdbond0".into(),
            "ip link delete rdleg0".into(),
            "ip link delete rdleg1".into(),
        ]);
        ip(&["link", "add", "rdbond0", "type", "bond", "mode", "balance-rr"]);
        for i in 0..2 {
            let (leg, peer) = (format!("rdleg{i}"), format!("rdpeer{i}"));
            ip(&["link", "add", &leg, "type", "veth", "peer", "name", &peer]);
            ip(&["link", "set", &leg, "master", "rdbond0"]);
            ip(&["link", "set", &peer, "up"]);
        }
        ip(&["link", "set", "rdbond0", "up"]);
        ip(&["addr", "add", "10.97.0.1/24", "dev", "rdbond0"]);
        let out = Command::new("rdma").args(["link", "add", "rxebond", "type", "rxe", "netdev", "rdbond0"]).output();
        let out = out.expect("run `rdma` (iproute2)");
        assert!(out.status.success(), "rdma link add rxebond: {}", String::from_utf8_lossy(&out.stderr));
        let rate = || std::fs::read_to_string("/sys/class/infiniband/rxebond/ports/1/rate").unwrap_or_default();
        wait_until("rxebond runs at 20 Gb/s", || rate().starts_with("20 "));
        let opts = Options { device: Some("rxebond".into()), loopback: false, ..Options::default() };
        let link = |r: &Report| r.layers.iter().find(|l| l.layer == Layer::Link).cloned().unwrap();

        let l = link(&run(&opts));
        assert_eq!(l.outcome, Outcome::Pass, "both legs up: {l:#?}");
        assert!(l.summary.contains("bond rdbond0: the sum of its legs'"), "{l:#?}");
        // The device under test (rxe0 on a dummy: 2.5 Gb/s) beside rxebond at 20: every
        // rxe reports vendor part 0, which makes them no siblings; each has its own rule.
        let all = run(&Options { loopback: false, ..Options::default() });
        let ours = all.layers.iter().find(|l| l.scope == device_name() && l.layer == Layer::Link).unwrap();
        assert_eq!(ours.outcome, Outcome::Pass, "{ours:#?}");
        assert!(ours.summary.contains("rxe's rule") && !ours.summary.contains("sibling"), "{ours:#?}");

        // One leg loses its link: the bond says 10, and so does rxe (1X FDR10).
        ip(&["link", "set", "rdpeer1", "down"]);
        wait_until("rxebond drops to 10 Gb/s", || rate().starts_with("10 "));
        let l = link(&run(&opts));
        assert_eq!(l.outcome, Outcome::Fail, "a lost leg: {l:#?}");
        assert!(l.summary.contains("runs at 10 Gb/s, below the expected 20 Gb/s"), "{l:#?}");
        assert!(l.summary.contains("rxe's rule") && l.summary.contains("gives 4X DDR 20 Gb/s"), "{l:#?}");

        // The slow link does not hide whether the port works: the loopback and rdma_cm
        // still run (the command, in a process of its own: librdmacm's context of rxebond
        // leaves with it, and the link can be deleted after).
        wait_until("rxebond has its IPv4 GID", || {
            let gids = Path::new("/sys/class/infiniband/rxebond/ports/1/gids");
            (0..8)
                .any(|i| std::fs::read_to_string(gids.join(i.to_string())).is_ok_and(|g| g.contains("ffff:0a61:0001")))
        });
        let out = Command::new(env!("CARGO_BIN_EXE_rdma-doctor"))
            .args(["-d", "rxebond", "--json"])
            .output()
            .expect("run rdma-doctor");
        let text = String::from_utf8_lossy(&out.stdout);
        let r = input::parse_report(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(out.status.code(), Some(1), "the slow link fails the run");
        let outcome = |l: Layer| r.layers.iter().find(|x| x.layer == l).map(|x| (x.outcome, x.summary.clone()));
        assert_eq!(outcome(Layer::Link).map(|o| o.0), Some(Outcome::Fail), "{:#?}", r.layers);
        for l in [Layer::ControlPlane, Layer::DataPlane, Layer::RdmaCm] {
            assert_eq!(outcome(l).map(|o| o.0), Some(Outcome::Pass), "{l:?} below the slow link: {:#?}", r.layers);
        }

        bed.run().unwrap_or_else(|e| panic!("{e}"));
        assert!(!Path::new("/sys/class/infiniband/rxebond").exists());
    });
}

/// Commands that undo a test's set-up, run in order (each bounded: a context left open
/// would hold an rxe link's deletion forever) whatever happens in the test.
struct Undo(Vec<String>);

impl Undo {
    fn run(&self) -> Result<(), String> {
        let mut errors = Vec::new();
        for step in &self.0 {
            let words: Vec<&str> = step.split_whitespace().collect();
            let out = Command::new("timeout").arg("60").args(&words).output().map_err(|e| e.to_string())?;
            let gone = String::from_utf8_lossy(&out.stderr).contains("Cannot find");
            if !out.status.success() && !gone {
                errors.push(format!("{step}: {}", String::from_utf8_lossy(&out.stderr).trim()));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        let _ = self.run();
    }
}

#[test]
#[ignore = "needs an RDMA device (run as root): run scripts/test"]
fn rdma_cm_node_hidden_by_a_bind_mount_fails_the_rdma_cm_layer_with_umount_as_the_fix() {
    let _leaks = LeakCheck::new();
    let name = device_name();
    // A private mount namespace: the node is hidden from the doctor only.
    let (code, r) = doctor_command(&["unshare", "-m"], &format!("mount --bind /dev/null {NODE}"), &[]);
    assert_eq!(code, Some(1), "{:#?}", r.layers);
    let f = first_failure(&r);
    assert_eq!((f.layer, f.scope.as_str()), (Layer::RdmaCm, name.as_str()), "{f:#?}");
    assert!(f.summary.contains("is not rdma_ucm's device") && f.summary.contains("device 1:3"), "{f:?}");
    assert_eq!(f.command.as_deref(), Some("umount /dev/infiniband/rdma_cm"), "{f:?}");
    let data = r.layers.iter().find(|l| l.scope == name && l.layer == Layer::DataPlane).unwrap();
    assert_eq!(data.outcome, Outcome::Pass, "verbs still work: {data:?}");
    let here = rdma_cm::node();
    assert!(here.node_dev.is_some() && here.node_dev == here.kernel_dev && !here.mounted_over, "{here:?}");
}

#[test]
#[ignore = "needs an RDMA device (run as root): run scripts/test"]
fn rdma_ucm_not_loaded_is_no_fault_the_doctor_exits_0_and_librdmacm_loads_it_on_demand() {
    // A freshly booted node: rdma_ucm is loaded only once a program connects through
    // librdmacm. The doctor runs as a command; this test in a process of its own, so that
    // no rdma_cm file of this binary holds the module.
    in_own_process(this_test!(), || {
        let _leaks = LeakCheck::new();
        let guard = UcmLoaded;
        if module_is_loaded("rdma_ucm") {
            let out = Command::new("modprobe").args(["-r", "rdma_ucm"]).output().expect("run `modprobe`");
            assert!(out.status.success(), "modprobe -r rdma_ucm: {}", String::from_utf8_lossy(&out.stderr));
        }
        wait_until("rdma_cm leaves sysfs", || rdma_cm::node().kernel_dev.is_none());
        assert!(!module_is_loaded("rdma_ucm"));

        let (code, r) = doctor_command(&[], "", &[]);
        assert_eq!(code, Some(0), "a healthy node without rdma_ucm loaded yet: {:#?}", r.layers);
        let cm = r.layers.iter().find(|l| l.layer == Layer::RdmaCm).unwrap();
        assert_eq!(cm.outcome, Outcome::Pass, "{cm:#?}");
        assert!(cm.evidence.iter().any(|e| e.starts_with("rdma_ucm was not loaded before this check")), "{cm:#?}");
        assert!(!r.baseline.modules.contains_key("rdma_ucm"), "the report says how it found the node");
        assert!(module_is_loaded("rdma_ucm"), "librdmacm's first use loaded it");
        guard.restore().unwrap_or_else(|e| panic!("{e}"));
    });
}

fn module_is_loaded(name: &str) -> bool {
    Path::new("/sys/module").join(name).join("initstate").exists()
}

/// Loads rdma_ucm again and waits for its node, whatever happens in the test.
struct UcmLoaded;

impl UcmLoaded {
    fn restore(&self) -> Result<(), String> {
        let out = Command::new("modprobe").arg("rdma_ucm").output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("modprobe rdma_ucm: {}", String::from_utf8_lossy(&out.stderr)));
        }
        poll_ready(|| {
            let n = rdma_cm::node();
            match n.node_dev.is_some() && n.node_dev == n.kernel_dev {
                true => Ok(()),
                false => Err(format!("{NODE} not back: {n:?}")),
            }
        })
    }
}

impl Drop for UcmLoaded {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            eprintln!("reloading rdma_ucm: {e}");
        }
    }
}

/// Runs the `rdma-doctor` command on the device under test with `--json` and `args`, as
/// `WRAP... sh -c 'SETUP && exec rdma-doctor ...'` (SETUP may be empty), and reads its
/// report back: the way to induce a fault that only the doctor's process should see (a
/// private mount namespace, a cgroup, dropped capabilities, a limit).
fn doctor_command(wrap: &[&str], setup: &str, args: &[&str]) -> (Option<i32>, Report) {
    let doctor = env!("CARGO_BIN_EXE_rdma-doctor");
    let mut line = format!("exec '{doctor}' --json -d '{}'", device_name());
    args.iter().for_each(|a| line += &format!(" '{a}'"));
    let script = if setup.is_empty() { line } else { format!("{setup} && {line}") };
    let (program, wrap) = wrap.split_first().map_or(("sh", &[][..]), |(p, rest)| (*p, rest));
    let mut cmd = Command::new(program);
    cmd.args(wrap);
    if program != "sh" {
        cmd.arg("sh");
    }
    let out = cmd.args(["-c", &script]).output().unwrap_or_else(|e| panic!("run {program}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let r = input::parse_report(&text)
        .unwrap_or_else(|e| panic!("{e}: {script}\n{text}{}", String::from_utf8_lossy(&out.stderr)));
    eprintln!("{}", rdma_doctor::render(&r));
    (out.status.code(), r)
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run `ip` (iproute2)");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

#[track_caller]
fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !ok() {
        assert!(Instant::now() < deadline, "waited {WAIT:?} for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `name`'s port 1 is ACTIVE with the default GID at `index` being `gid`.
fn ready(ctx: &Context, index: u32, gid: &str) -> Result<(), String> {
    let port = ctx.query_port(1).map_err(|e| e.to_string())?;
    let now = ctx.default_gid(1).map_err(|e| e.to_string())?;
    if port.state == PortState::Active && now.index == index && now.gid.to_string() == gid {
        Ok(())
    } else {
        Err(format!("port {:?}, default GID {} {}; want ACTIVE, {index} {gid}", port.state, now.index, now.gid))
    }
}

fn poll_ready(mut check: impl FnMut() -> Result<(), String>) -> Result<(), String> {
    let deadline = Instant::now() + WAIT;
    loop {
        match check() {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(format!("not restored after {WAIT:?}: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Brings the netdev back up and waits for the port and its GID, whatever happens in the
/// test: the tests after this one need them.
struct LinkUp {
    ctx: Context,
    netdev: String,
    gid_index: u32,
    gid: String,
}

impl LinkUp {
    fn restore(&self) -> Result<(), String> {
        let out = Command::new("ip").args(["link", "set", &self.netdev, "up"]).output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("ip link set {} up: {}", self.netdev, String::from_utf8_lossy(&out.stderr)));
        }
        poll_ready(|| ready(&self.ctx, self.gid_index, &self.gid))
    }
}

impl Drop for LinkUp {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            eprintln!("restoring {}: {e}", self.netdev);
        }
    }
}

/// Re-creates the rxe link exactly as it was (same name, same netdev) if it is gone, and
/// waits until its port is ACTIVE with the IPv4 GID at the same index.
struct RxeLink {
    name: String,
    netdev: String,
    gid_index: u32,
    gid: String,
}

impl RxeLink {
    fn restore(&self) -> Result<(), String> {
        if !Path::new("/sys/class/infiniband").join(&self.name).exists() {
            let out = Command::new("rdma")
                .args(["link", "add", &self.name, "type", "rxe", "netdev", &self.netdev])
                .output()
                .map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!("rdma link add {}: {}", self.name, String::from_utf8_lossy(&out.stderr)));
            }
        }
        poll_ready(|| {
            let ctx = Context::open(Some(&self.name)).map_err(|e| e.to_string())?;
            ready(&ctx, self.gid_index, &self.gid)
        })
    }
}

impl Drop for RxeLink {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            eprintln!("re-creating {}: {e}", self.name);
        }
    }
}
