//! The doctor with rdma-core's user-space libraries hidden, each in a private mount
//! namespace (a bind mount of /dev/null over the file the loader resolves, so loading it
//! fails with "file too short"), as a node with a broken or missing rdma-core: the
//! doctor still starts (it loads them at run time), names the library, its layer and its
//! packages, and checks the kernel's layers all the same. And healthy with both present.

use rdma_doctor::{Layer, Outcome, Report};
use rdma_test_support::{device_name, resolved_library as resolved, LeakCheck};

use crate::doctor_command;

fn layer(r: &Report, scope: &str, layer: Layer) -> rdma_doctor::LayerReport {
    r.layers
        .iter()
        .find(|l| l.scope == scope && l.layer == layer)
        .unwrap_or_else(|| panic!("no {} layer for {scope}: {:#?}", layer.name(), r.layers))
        .clone()
}

#[test]
#[ignore = "needs an RDMA device (run as root): run scripts/test"]
fn the_doctor_binary_links_neither_library_and_a_healthy_node_passes_the_libraries_layer() {
    let _leaks = LeakCheck::new();
    let out = std::process::Command::new("readelf")
        .args(["-d", env!("CARGO_BIN_EXE_rdma-doctor")])
        .output()
        .expect("run readelf");
    let dynamic = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && dynamic.contains("NEEDED"), "{dynamic}");
    assert!(!dynamic.contains("libibverbs") && !dynamic.contains("librdmacm"), "{dynamic}");

    let (code, r) = doctor_command(&[], "", &[]);
    let l = layer(&r, "host", Layer::Libraries);
    assert_eq!((code, l.outcome), (Some(0), Outcome::Pass), "{l:#?}");
    assert_eq!(l.summary, "libibverbs and librdmacm are loaded at run time");
    for (soname, file) in
        [("libibverbs.so.1", resolved("libibverbs.so.1")), ("librdmacm.so.1", resolved("librdmacm.so.1"))]
    {
        assert!(l.evidence.contains(&format!("{soname}: {}", file.display())), "{soname}: {l:#?}");
    }
}

#[test]
#[ignore = "needs an RDMA device (run as root): run scripts/test"]
fn libibverbs_hidden_fails_the_libraries_layer_naming_it_and_the_kernel_layers_are_still_checked() {
    let _leaks = LeakCheck::new();
    let name = device_name();
    let file = resolved("libibverbs.so.1");
    let (code, r) = doctor_command(&["unshare", "-m"], &format!("mount --bind /dev/null {}", file.display()), &[]);
    assert_eq!(code, Some(1));
    let l = layer(&r, "host", Layer::Libraries);
    assert_eq!(l.outcome, Outcome::Fail, "{l:#?}");
    assert!(l.summary.contains("libibverbs.so.1"), "{l:#?}");
    assert!(
        l.evidence.iter().any(|e| e.contains("libibverbs.so.1 could not be loaded") && e.contains("file too short")),
        "{l:#?}"
    );
    assert!(l.fix.iter().any(|f| f.contains("libibverbs1")), "{l:#?}");
    // The kernel's layers: checked, and the healthy device passes them.
    for k in [Layer::Device, Layer::DeviceNodes, Layer::Port, Layer::Link, Layer::Gid] {
        assert_eq!(layer(&r, &name, k).outcome, Outcome::Pass, "{:#?}", layer(&r, &name, k));
    }
    // The layers that need libibverbs: skipped, naming it.
    for k in [Layer::Provider, Layer::ControlPlane, Layer::DataPlane, Layer::RdmaCm] {
        let s = layer(&r, &name, k);
        assert_eq!(s.outcome, Outcome::Skipped, "{s:#?}");
        assert!(s.summary.contains("libibverbs.so.1 is not loaded"), "{s:#?}");
    }
    assert_eq!(r.baseline.libraries["libibverbs"].version, None);
}

#[test]
#[ignore = "needs an RDMA device (run as root): run scripts/test"]
fn librdmacm_hidden_fails_the_libraries_layer_naming_it_and_every_verbs_layer_still_passes() {
    let _leaks = LeakCheck::new();
    let name = device_name();
    let file = resolved("librdmacm.so.1");
    let (code, r) = doctor_command(&["unshare", "-m"], &format!("mount --bind /dev/null {}", file.display()), &[]);
    assert_eq!(code, Some(1));
    let l = layer(&r, "host", Layer::Libraries);
    assert_eq!(l.outcome, Outcome::Fail, "{l:#?}");
    assert!(l.summary.contains("librdmacm.so.1") && !l.summary.contains("libibverbs"), "{l:#?}");
    assert!(
        l.evidence.iter().any(|e| e.contains("librdmacm.so.1 could not be loaded") && e.contains("file too short")),
        "{l:#?}"
    );
    assert_eq!(l.command.as_deref(), Some("apt-get install --reinstall librdmacm1"));
    for k in Layer::DEVICE_LAYERS.into_iter().filter(|k| *k != Layer::RdmaCm) {
        assert_eq!(layer(&r, &name, k).outcome, Outcome::Pass, "{:#?}", layer(&r, &name, k));
    }
    let cm = layer(&r, &name, Layer::RdmaCm);
    assert_eq!(cm.outcome, Outcome::Skipped, "{cm:#?}");
    assert!(cm.summary.contains("librdmacm.so.1 is not loaded"), "{cm:#?}");
}
