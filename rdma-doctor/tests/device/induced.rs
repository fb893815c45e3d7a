//! Faults the unit tests cover over recorded inputs, induced for real on the test bed (run
//! as root): the provider's config or library hidden in a private mount namespace, the
//! library replaced by one that does not load, the rdma cgroup refusing every device
//! context, the seed's module case (a NIC driver loaded without its RDMA part, its probe
//! error in the kernel log, no device), a QP timeout in the kernel log, and a memlock limit
//! with CAP_IPC_LOCK dropped. Each checks the layer, the reason and the fix the doctor
//! names: the generic advice it gave before ("install ibverbs-providers", "no driver
//! module") fails them.
//!
//! What only the doctor's process should see is set up in its own process
//! ([`doctor_command`]: a mount namespace dies with it); what is global (a cgroup, a
//! module, the rxe link) is undone by a guard, whose restore is checked.

use std::path::{Path, PathBuf};
use std::process::Command;

use rdma_doctor::{Layer, Options, Outcome, Report, Status};
use rdma_test_support::{device_name, in_own_process, this_test, LeakCheck};

use crate::{doctor_command, first_failure, open, poll_ready, rest_skipped, run, wait_until, RxeLink};

/// The provider that serves the device under test (`rxe`) and its library, from a healthy
/// run (one for every test of this process).
fn provider() -> (String, PathBuf) {
    static FOUND: std::sync::OnceLock<(String, PathBuf)> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            let opts = Options { device: Some(device_name()), loopback: false, ..Options::default() };
            let r = run(&opts);
            let d = &r.baseline.devices[&device_name()];
            let p = d.provider.as_ref().unwrap_or_else(|| panic!("the healthy run identifies the provider: {d:#?}"));
            (p.name.clone(), PathBuf::from(&p.library))
        })
        .clone()
}

/// The provider layer failed first, on the device under test, libibverbs listing it or
/// not (`listed`), and not with the generic verdict.
#[track_caller]
fn provider_failed(r: &Report, listed: bool) -> &rdma_doctor::LayerReport {
    let f = first_failure(r);
    assert_eq!((f.layer, f.scope.as_str()), (Layer::Provider, device_name().as_str()), "{f:#?}");
    let lists = format!("libibverbs {} the device", if listed { "lists" } else { "does not list" });
    assert!(f.evidence.contains(&lists), "{f:#?}");
    assert!(!f.summary.contains("no user-space provider for"), "the old generic verdict: {f:#?}");
    rest_skipped(r, Layer::Provider);
    f
}

#[test]
#[ignore = "needs an RDMA device (run as root): run scripts/test"]
fn provider_config_hidden_fails_the_provider_layer_naming_the_config_with_its_one_line_fix() {
    let _leaks = LeakCheck::new();
    let (p, _) = provider();
    let config = format!("/etc/libibverbs.d/{p}.driver");
    let fix = format!("echo 'driver {p}' > {config}");
    // The whole directory emptied, then only the provider's file.
    for setup in ["mount -t tmpfs none /etc/libibverbs.d".to_owned(), format!("mount --bind /dev/null {config}")] {
        let (code, r) = doctor_command(&["unshare", "-m"], &setup, &["--no-loopback"]);
        assert_eq!(code, Some(1), "{setup}");
        let f = provider_failed(&r, false);
        let want = format!("no provider config: no file in /etc/libibverbs.d says `driver {p}`");
        assert!(f.summary.starts_with(&want), "{setup}: {f:#?}");
        assert_eq!(f.fix[0], fix, "{setup}");
        assert_eq!(f.command.as_deref(), Some(fix.as_str()), "{setup}");
    }
}

#[test]
#[ignore = "needs an RDMA device (run as root): run scripts/test"]
fn provider_library_gone_fails_the_provider_layer_as_a_missing_library_not_a_missing_config() {
    let _leaks = LeakCheck::new();
    let (p, library) = provider();
    let dir = library.parent().expect("the library is in a directory").display().to_string();
    let (code, r) = doctor_command(&["unshare", "-m"], &format!("mount -t tmpfs none {dir}"), &["--no-loopback"]);
    assert_eq!(code, Some(1));
    let f = provider_failed(&r, false);
    let want = format!("provider library missing: /etc/libibverbs.d names `{p}` but lib{p}-rdmav*.so is not in");
    assert!(f.summary.starts_with(&want) && f.summary.contains(&dir), "{f:#?}");
    assert!(
        f.evidence.iter().any(|e| e.starts_with(&format!("lib{p}-rdmav*.so in")) && e.ends_with(": none")),
        "{f:#?}"
    );
}

#[test]
#[ignore = "needs an RDMA device (run as root): run scripts/test"]
fn provider_library_that_does_not_load_quotes_libibverbs_reason_and_advises_ldd() {
    let _leaks = LeakCheck::new();
    let (p, library) = provider();
    let lib = library.display().to_string();
    let (code, r) = doctor_command(&["unshare", "-m"], &format!("mount --bind /dev/null {lib}"), &["--no-loopback"]);
    assert_eq!(code, Some(1));
    let f = provider_failed(&r, false);
    assert!(f.summary.starts_with(&format!("the {p} provider does not load")), "{f:#?}");
    // libibverbs' own words, captured from its stderr.
    assert!(f.summary.contains("couldn't load driver") && f.summary.contains(&format!("lib{p}-rdmav")), "{f:#?}");
    assert!(f.evidence.iter().any(|e| e.starts_with("libibverbs said: ")), "{f:#?}");
    assert_eq!(f.command.as_deref(), Some(format!("ldd {lib}").as_str()));
}

/// A child cgroup (cgroup v2) whose rdma.max allows no device context on `device`, on a
/// cgroup2 mount of its own; removed (and the rdma controller of the root's subtree and
/// the mount put back as they were) whatever happens in the test.
struct RdmaCgroup {
    mount: PathBuf,
    dir: PathBuf,
    enabled_rdma: bool,
}

impl RdmaCgroup {
    fn create(device: &str) -> RdmaCgroup {
        let mount = std::env::temp_dir().join(format!("rdma-doctor-cgroup2-{}", std::process::id()));
        std::fs::create_dir_all(&mount).unwrap();
        sh(&format!("mount -t cgroup2 none {}", mount.display()));
        let mut guard = RdmaCgroup { dir: mount.join("rdma-doctor-test"), mount, enabled_rdma: false };
        let read = |f: &str| std::fs::read_to_string(guard.mount.join(f)).unwrap_or_default();
        let controllers = read("cgroup.controllers");
        assert!(controllers.split_whitespace().any(|c| c == "rdma"), "no rdma cgroup controller: {controllers}");
        if !read("cgroup.subtree_control").split_whitespace().any(|c| c == "rdma") {
            std::fs::write(guard.mount.join("cgroup.subtree_control"), "+rdma").unwrap();
            guard.enabled_rdma = true;
        }
        std::fs::create_dir(&guard.dir).unwrap();
        std::fs::write(guard.dir.join("rdma.max"), format!("{device} hca_handle=0")).unwrap();
        guard
    }

    fn remove(&self) -> Result<(), String> {
        if !self.mount.exists() {
            return Ok(()); // removed already
        }
        if self.dir.exists() {
            // Its process has exited; the kernel lets the directory go once it is empty.
            poll_ready(|| std::fs::remove_dir(&self.dir).map_err(|e| format!("rmdir {}: {e}", self.dir.display())))?;
        }
        if self.enabled_rdma {
            std::fs::write(self.mount.join("cgroup.subtree_control"), "-rdma").map_err(|e| e.to_string())?;
        }
        let out = Command::new("umount").arg(&self.mount).output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("umount {}: {}", self.mount.display(), String::from_utf8_lossy(&out.stderr)));
        }
        std::fs::remove_dir(&self.mount).map_err(|e| e.to_string())
    }
}

impl Drop for RdmaCgroup {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            eprintln!("removing the test cgroup: {e}");
        }
    }
}

fn sh(script: &str) {
    let out = Command::new("sh").args(["-c", script]).output().expect("run sh");
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
#[ignore = "needs an RDMA device (run as root, rdma cgroup controller): run scripts/test"]
fn rdma_cgroup_allowing_no_context_is_the_kernel_refusing_ibv_open_device_with_eagain_under_device_nodes() {
    let _leaks = LeakCheck::new();
    let name = device_name();
    let cgroup = RdmaCgroup::create(&name);
    let join = format!("echo $$ > {}/cgroup.procs", cgroup.dir.display());
    let (code, r) = doctor_command(&[], &join, &["--no-loopback"]);
    assert_eq!(code, Some(1));
    // The kernel's side of the device refused: filed under device_nodes, not the provider.
    let f = first_failure(&r);
    assert_eq!((f.layer, f.scope.as_str()), (Layer::DeviceNodes, name.as_str()), "{f:#?}");
    assert!(f.evidence.iter().any(|e| e == "libibverbs lists the device"), "{f:#?}");
    rest_skipped(&r, Layer::DeviceNodes);
    assert!(f.summary.starts_with("the kernel refused ibv_open_device: EAGAIN"), "{f:#?}");
    assert!(f.summary.contains("kernel layer, not user space") && f.summary.contains("rdma cgroup"), "{f:#?}");
    assert!(f.fix.iter().any(|x| x.contains(&format!("'{name} hca_handle=max'"))), "{f:#?}");
    assert!(f.command.as_deref().is_some_and(|c| c.contains("rdma.max")), "{f:#?}");
    assert!(!f.fix.iter().any(|x| x.contains("ibverbs-providers")), "not user space: {f:#?}");

    cgroup.remove().unwrap_or_else(|e| panic!("{e}"));
    let (code, r) = doctor_command(&[], "", &["--no-loopback"]);
    assert_eq!(code, Some(0), "healthy again outside the cgroup: {:#?}", r.layers);
}

#[test]
#[ignore = "needs an RDMA device (run as root): run scripts/test"]
fn memlock_limit_with_cap_ipc_lock_dropped_fails_the_memlock_layer_and_with_the_capability_passes() {
    let _leaks = LeakCheck::new();
    let name = device_name();
    // The soft limit only: the hard one stays, so the fix is raising the soft one to it.
    let tiny = "ulimit -S -l 64";
    let (code, r) = doctor_command(&["setpriv", "--bounding-set=-ipc_lock"], tiny, &["--no-loopback"]);
    assert_eq!(code, Some(1), "{:#?}", r.layers);
    let f = first_failure(&r);
    assert_eq!((f.layer, f.scope.as_str()), (Layer::Memlock, name.as_str()), "{f:#?}");
    assert!(f.summary.starts_with("memlock limit 64 KiB is below the 1 MiB registration needs"), "{f:#?}");
    assert!(f.evidence.iter().any(|e| e == "CAP_IPC_LOCK: no"), "{f:#?}");
    assert!(f.command.as_deref().is_some_and(|c| c.starts_with("ulimit -l ")), "{f:#?}");
    assert!(!r.baseline.memlock.cap_ipc_lock && r.baseline.memlock.soft_bytes == Some(64 << 10));
    rest_skipped(&r, Layer::Memlock);

    // The same limit with the capability: root is not bound by it.
    let (code, r) = doctor_command(&[], tiny, &["--no-loopback"]);
    assert_eq!(code, Some(0), "{:#?}", r.layers);
    let m = r.layers.iter().find(|l| l.scope == name && l.layer == Layer::Memlock).unwrap();
    assert_eq!((m.outcome, m.summary.as_str()), (Outcome::Pass, "CAP_IPC_LOCK: registration is not limited"));
}

/// Unloads a module this test loaded, whatever happens in it.
struct Loaded(&'static str);

impl Loaded {
    fn remove(&self) -> Result<(), String> {
        if !module_loaded(self.0) {
            return Ok(());
        }
        let out = Command::new("modprobe").args(["-r", self.0]).output().map_err(|e| e.to_string())?;
        match out.status.success() && !module_loaded(self.0) {
            true => Ok(()),
            false => Err(format!("modprobe -r {}: {}", self.0, String::from_utf8_lossy(&out.stderr))),
        }
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            eprintln!("{e}");
        }
    }
}

fn module_loaded(name: &str) -> bool {
    Path::new("/sys/module").join(name).join("initstate").exists()
}

/// Writes a line to the kernel log, as a driver would (`<level>text`).
fn kmsg(line: &str) {
    std::fs::write("/dev/kmsg", line).unwrap_or_else(|e| panic!("write to /dev/kmsg: {e}"));
}

#[test]
#[ignore = "needs an rxe device (run as root, mlx5_core among the kernel's modules): run scripts/test"]
fn nic_driver_without_its_rdma_part_and_a_probe_error_logged_now_is_diagnosed_with_ebusy_citing_the_line() {
    // The rxe link is deleted: no context of the device may be open in this process.
    in_own_process(this_test!(), || {
        let leaks = LeakCheck::new();
        let name = device_name();
        let parent = std::fs::read_to_string(format!("/sys/class/infiniband/{name}/parent"))
            .unwrap_or_else(|e| panic!("{name} is not an rxe device (no sysfs parent: {e})"));
        let (gid_index, gid) = {
            let g = open().default_gid(1).unwrap();
            (g.index, g.gid.to_string())
        };
        let link = RxeLink { name: name.clone(), netdev: parent.trim().to_owned(), gid_index, gid };

        // The seed's case: mlx5_core loaded (no hardware: nothing probes), mlx5_ib not.
        assert!(!module_loaded("mlx5_core"), "mlx5_core was loaded before the test");
        sh("modprobe mlx5_core");
        let mlx5 = Loaded("mlx5_core");
        assert!(module_loaded("mlx5_core") && !module_loaded("mlx5_ib"), "mlx5_core alone");
        let pid = std::process::id();
        let probe = format!("mlx5_core 0000:5e:00.0: probe_one:1620:(pid {pid}): mlx5_init_one failed with error -16");
        kmsg(&format!("<3>{probe}\n"));
        let qp = format!("mlx5_core 0000:5e:00.0: timeout event on QP 0x{pid:x}");
        kmsg(&format!("<4>{qp}\n"));
        let out = Command::new("rdma").args(["link", "delete", &name]).output().expect("run `rdma` (iproute2)");
        assert!(out.status.success(), "rdma link delete {name}: {}", String::from_utf8_lossy(&out.stderr));
        wait_until("the device leaves sysfs", || !Path::new("/sys/class/infiniband").join(&name).exists());

        let r = run(&Options { loopback: false, ..Options::default() });
        let f = first_failure(&r);
        assert_eq!((f.layer, f.scope.as_str()), (Layer::KernelModules, "host"), "{f:#?}");
        let want = "the RDMA driver failed to probe (EBUSY, errno 16): mlx5_core is loaded, mlx5_ib is not";
        assert!(f.summary.starts_with(want) && f.summary.contains(&probe), "{f:#?}");
        assert!(!f.summary.contains("no RDMA device driver module"), "the old verdict: {f:#?}");
        assert!(f.fix[0].starts_with("EBUSY: another driver holds the PCI function"), "{f:#?}");
        assert_eq!(f.command.as_deref(), Some("dmesg | grep -iE 'mlx5'"));
        // The QP timeout has no errno: a finding of its own, with what it means.
        let timeout = r.findings.iter().find(|x| x.what.contains(&qp)).unwrap_or_else(|| panic!("{:#?}", r.findings));
        assert!(timeout.what.contains("the device timed out a QP"), "{timeout:#?}");
        assert_eq!(r.status, Status::LayerFailed);

        mlx5.remove().unwrap_or_else(|e| panic!("{e}"));
        link.restore().unwrap_or_else(|e| panic!("{e}"));
        drop(leaks);
        // The lines stay in the log; with the device back, they are notes, not a failure.
        let r = run(&Options { device: Some(name.clone()), loopback: false, ..Options::default() });
        assert_eq!(r.exit_code, 0, "healthy again: {:#?}", r.layers);
        assert!(r.findings.iter().any(|x| x.what.contains(&probe)), "cited as a note: {:#?}", r.findings);
    });
}
