//! rdma-doctor on soft-iWARP: a healthy siw device passes every layer by iWARP's rules (no
//! RoCE GID, its loopback and rdma_cm check connected over TCP through rdma_cm, no atomics),
//! and a siw device whose netdev is down, or has no IPv4 address, fails the layer that
//! says so. Every change to the system is undone by a guard, and the guard's restore is
//! checked.
//!
//! They need an iWARP device: `scripts/test` runs this binary in a test bed of its own with
//! siw0 (`RXE_PROVIDER=siw scripts/rxe`), and checks that every test ran. On any other
//! device (rxe in the main device phase, or none) each of them fails: it is no iWARP
//! device. A plain `cargo test` lists them as ignored. The rxe device suite is
//! `tests/device`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rdma_doctor::{Layer, LayerReport, Options, Outcome, Report, Status};
use rdma_test_support::{device_name, isolated, rdma_ip, this_test};

/// siw reacts at once; emulation can be slow.
const WAIT: Duration = Duration::from_secs(15);

/// The device under test, which must be iWARP (sysfs node type `4: RNIC`): these tests
/// prove nothing on another transport.
#[track_caller]
fn iwarp_device() -> String {
    let name = device_name();
    let node_type = std::fs::read_to_string(Path::new("/sys/class/infiniband").join(&name).join("node_type"))
        .unwrap_or_else(|e| panic!("{name}: no node_type in sysfs ({e}): these tests need an iWARP device"));
    assert!(
        node_type.contains("RNIC"),
        "{name} is no iWARP device (node type {}): run these tests with RXE_PROVIDER=siw scripts/rxe (scripts/test does)",
        node_type.trim()
    );
    name
}

fn run() -> Report {
    let opts = Options { device: Some(iwarp_device()), ..Options::default() };
    let report = rdma_doctor::diagnose(&opts).unwrap_or_else(|e| panic!("diagnose: {e}"));
    eprintln!("{}", rdma_doctor::render(&report));
    report
}

fn layer(r: &Report, l: Layer) -> &LayerReport {
    r.layers.iter().find(|x| x.layer == l && x.scope != "host").unwrap_or_else(|| panic!("no {l:?}: {:#?}", r.layers))
}

/// The first failing layer, or a panic that shows the verdict.
#[track_caller]
fn first_failure(r: &Report) -> &LayerReport {
    r.layers.iter().find(|l| l.outcome == Outcome::Fail).unwrap_or_else(|| panic!("no layer failed: {:#?}", r.layers))
}

/// Layers after the first failure were not checked.
#[track_caller]
fn rest_skipped(r: &Report, failed: Layer) {
    for l in r.layers.iter().filter(|l| l.scope != "host" && l.layer > failed) {
        assert_eq!(l.outcome, Outcome::Skipped, "{l:?}");
    }
}

/// The netdev under the device, as the doctor found it (siw names it nowhere in sysfs).
fn netdev_of(r: &Report) -> String {
    let d = &r.baseline.devices[&iwarp_device()];
    let nd = d.ports["1"].netdev.as_ref().unwrap_or_else(|| panic!("the netdev under the port is found: {d:#?}"));
    nd.name.clone()
}

#[test]
#[ignore = "needs an iWARP device: scripts/test runs it on siw"]
fn siw_healthy_device_passes_every_layer_by_iwarps_rules_with_its_loopback_connected_through_rdma_cm() {
    isolated(this_test!(), || {
        let name = iwarp_device();
        let r = run();
        // kernel_modules and libraries (scope host), then the device's.
        assert_eq!(r.layers.len(), 2 + Layer::DEVICE_LAYERS.len(), "{:#?}", r.layers);
        for l in &r.layers {
            assert_eq!(l.outcome, Outcome::Pass, "{l:#?}");
            assert!(!l.summary.contains("RoCE v2 GID"), "no RoCE rule on iWARP: {l:#?}");
        }
        assert_eq!((r.status, r.exit_code), (Status::Healthy, 0), "{:#?}", r.findings);

        let d = &r.baseline.devices[&name];
        assert_eq!(d.node_type, "RNIC");
        assert_eq!(d.provider.as_ref().map(|p| p.name.as_str()), Some("siw"), "{d:#?}");
        assert_eq!(d.kernel_driver_name.as_deref(), Some("siw"));
        let netdev = netdev_of(&r);
        assert_eq!(d.parent_netdev.as_deref(), Some(netdev.as_str()), "siw's netdev, found by its MAC");
        let ip = rdma_ip();

        let gid = layer(&r, Layer::Gid);
        assert_eq!(
            gid.summary,
            format!("iWARP (no RoCE GID, no UDP 4791): reached over TCP through rdma_cm at {ip} on {netdev}")
        );
        let control = layer(&r, Layer::ControlPlane);
        assert!(control.evidence.iter().any(|e| e.contains(&format!("rdma_cm over TCP to {ip}"))), "{control:#?}");
        // siw has no atomics (atomic_cap NONE): named as not run, not as verified.
        let data = layer(&r, Layer::DataPlane);
        assert_eq!(
            data.summary,
            "loopback RDMA_WRITE, RDMA_READ, SEND verified (FETCH_ADD, CMP_SWAP not supported by the device: not run)"
        );
        let cm = layer(&r, Layer::RdmaCm);
        assert!(cm.summary.starts_with(&format!("listened on {ip}, connected")), "{cm:#?}");
        assert!(cm.evidence.iter().any(|e| e.contains("iWARP connects over TCP")), "{cm:#?}");
        // Its rate follows siw's rule: the kernel's mapping of its netdev's speed.
        let refs = &r.observations.link_references[&name]["1"];
        assert!(refs.from.contains("siw's rule"), "{refs:#?}");
        assert_eq!(refs.gbps, d.ports["1"].rate_gbps);
    });
}

#[test]
#[ignore = "needs an iWARP device: scripts/test runs it on siw"]
fn siw_on_a_netdev_that_is_down_fails_the_port_layer_naming_the_netdev_and_passes_once_it_is_up() {
    isolated(this_test!(), || {
        let netdev = netdev_of(&run());
        let undo = ["link", "set", &netdev, "up"].map(String::from).to_vec();
        let guard = Restore { netdev: netdev.clone(), undo };
        ip(&["link", "set", &netdev, "down"]);
        wait_until("the port leaves ACTIVE", || port_state().is_some_and(|s| !s.contains("ACTIVE")));
        let r = run();
        let f = first_failure(&r);
        assert_eq!(f.layer, Layer::Port, "{f:#?}");
        assert!(f.summary.contains("port 1 is DOWN"), "{f:?}");
        assert!(f.evidence.iter().any(|e| e.contains(&netdev) && e.contains("administratively down")), "{f:?}");
        assert_eq!(f.command.as_deref(), Some(format!("ip link set {netdev} up").as_str()));
        rest_skipped(&r, Layer::Port);

        guard.restore().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(run().exit_code, 0, "healthy again after the netdev came back");
    });
}

#[test]
#[ignore = "needs an iWARP device: scripts/test runs it on siw"]
fn siw_on_a_netdev_without_an_ipv4_address_fails_the_gid_layer_with_ip_addr_add_not_a_roce_gid() {
    isolated(this_test!(), || {
        let netdev = netdev_of(&run());
        let ip_now = rdma_ip().to_string();
        let out = Command::new("ip").args(["-4", "-o", "addr", "show", "dev", &netdev]).output().unwrap();
        let listing = String::from_utf8_lossy(&out.stdout).into_owned();
        let cidr = listing
            .split_whitespace()
            .find(|w| w.starts_with(&format!("{ip_now}/")))
            .unwrap_or_else(|| panic!("{ip_now} is on {netdev}: {listing}"))
            .to_owned();
        let undo = ["addr", "add", &cidr, "dev", &netdev].map(String::from).to_vec();
        let guard = Restore { netdev: netdev.clone(), undo };
        ip(&["addr", "del", &cidr, "dev", &netdev]);
        let r = run();
        let f = first_failure(&r);
        assert_eq!(f.layer, Layer::Gid, "{f:#?}");
        assert!(f.summary.contains(&format!("{netdev} has no IPv4 address")), "{f:?}");
        assert!(!f.summary.contains("RoCE"), "{f:?}");
        assert_eq!(f.command.as_deref(), Some(format!("ip addr add <address>/<prefix> dev {netdev}").as_str()));
        rest_skipped(&r, Layer::Gid);

        guard.restore().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(run().exit_code, 0, "healthy again with the address back");
    });
}

fn port_state() -> Option<String> {
    let path = Path::new("/sys/class/infiniband").join(device_name()).join("ports/1/state");
    std::fs::read_to_string(path).ok()
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

/// Runs `ip UNDO...` (bringing the netdev up, giving its address back) and waits until
/// the port is ACTIVE with the test bed's address on the netdev, whatever happens in the
/// test.
struct Restore {
    netdev: String,
    undo: Vec<String>,
}

impl Restore {
    fn restore(&self) -> Result<(), String> {
        let out = Command::new("ip").args(&self.undo).output().map_err(|e| e.to_string())?;
        // Already done (a second restore, from Drop): the address exists.
        let already = String::from_utf8_lossy(&out.stderr).contains("File exists");
        if !out.status.success() && !already {
            return Err(format!("ip {}: {}", self.undo.join(" "), String::from_utf8_lossy(&out.stderr)));
        }
        let deadline = Instant::now() + WAIT;
        let ip = rdma_ip().to_string();
        let netdev = &self.netdev;
        loop {
            let out = Command::new("ip").args(["-4", "-o", "addr", "show", "dev", netdev]).output();
            let has_ip = out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&format!(" {ip}/")));
            if has_ip && port_state().is_some_and(|s| s.contains("ACTIVE")) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "not restored after {WAIT:?}: port {:?}, {ip} on {netdev}: {has_ip}",
                    port_state()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            eprintln!("restoring: {e}");
        }
    }
}
