//! The device layers: the device the kernel enumerated (and, for a soft device, the
//! `rdma link add` that re-creates it) and its device nodes under `/dev/infiniband`.

use crate::judge::verdict::Expectations;
use crate::judge::verdict::NO_DEVICE;
use crate::model::layer::list_or;
use crate::model::layer::Layer;
use crate::model::layer::LayerReport;

use crate::facts::collect::DEVICE_DRIVERS;
use crate::model::report::{Baseline, DeviceFacts, Observations};

pub(crate) fn device_missing(name: &str, seen: &Observations, facts: &Baseline, want: &Expectations) -> LayerReport {
    let present = list_or(&seen.sysfs_devices.iter().map(String::as_str).collect::<Vec<_>>(), "none");
    let mut evidence = vec![format!("/sys/class/infiniband lists: {present}")];
    evidence.extend(seen.kernel_log.errors.iter().map(|e| format!("{} [{}]", e.line, e.meaning)));
    let drivers: Vec<&str> = DEVICE_DRIVERS.iter().copied().filter(|d| facts.modules.contains_key(*d)).collect();
    evidence.push(format!("device driver modules loaded: {}", list_or(&drivers, "none")));
    let soft = soft_link_advice(name, &drivers, want);
    let lspci = "lspci -nnk | grep -iA3 -E 'mellanox|infiniband|ethernet'";
    let command = soft.as_ref().map_or(lspci.to_owned(), |(cmd, _)| cmd.clone());
    let mut fix: Vec<String> = soft.map(|(cmd, why)| format!("{cmd}   # {why}")).into_iter().collect();
    fix.push(
        "hardware: check the PCI function and its driver: lspci -nnk | grep -iA3 -E 'mellanox|infiniband|ethernet'"
            .into(),
    );
    fix.push("then the driver's messages: dmesg | grep -iE 'mlx5|rdma|infiniband'".into());
    let what = if name == NO_DEVICE {
        "no RDMA device is enumerated".to_owned()
    } else {
        format!("{name} is not enumerated by the kernel")
    };
    LayerReport::fail(name, Layer::Device, what, evidence, fix).with_command(command)
}

/// The `rdma link add` that re-creates a soft device: for a name of a soft device (`rxe0`,
/// `siw0`) or one the saved baseline had on a netdev, or, when no device is named and
/// rdma_rxe is loaded, in a placeholder form. Never for a hardware device (`mlx5_0`).
/// The command and why.
pub(crate) fn soft_link_advice(name: &str, drivers: &[&str], want: &Expectations) -> Option<(String, &'static str)> {
    let kind = if name.starts_with("siw") { "siw" } else { "rxe" };
    if let Some(netdev) = want.known_parents.get(name) {
        return Some((format!("rdma link add {name} type {kind} netdev {netdev}"), "as in the saved baseline"));
    }
    if name.starts_with("rxe") || name.starts_with("siw") {
        let cmd = format!("rdma link add {name} type {kind} netdev <netdev>");
        return Some((cmd, "soft devices are links on a netdev"));
    }
    (name == NO_DEVICE && drivers.contains(&"rdma_rxe"))
        .then(|| ("rdma link add rxe0 type rxe netdev <netdev>".to_owned(), "SoftRoCE; rxe0: a name of your choice"))
}

pub(crate) fn device_nodes(name: &str, d: &DeviceFacts, facts: &Baseline) -> LayerReport {
    let Some(uverbs) = &d.uverbs else {
        return LayerReport::fail(
            name,
            Layer::DeviceNodes,
            "the device has no uverbs interface (ib_uverbs did not bind it)",
            vec!["no /sys/class/infiniband_verbs/uverbs*/ibdev names it".into()],
            vec!["modprobe ib_uverbs".into()],
        )
        .with_command("modprobe ib_uverbs");
    };
    let path = format!("/dev/infiniband/{uverbs}");
    let mut evidence: Vec<String> = facts
        .dev_nodes
        .iter()
        .map(|(p, n)| format!("{p} mode {} {}", n.mode, if n.can_open { "opens" } else { "does not open" }))
        .collect();
    match facts.dev_nodes.get(&path) {
        None => LayerReport::fail(
            name,
            Layer::DeviceNodes,
            format!("{path} is missing"),
            evidence,
            vec![
                "udev creates it from the rdma-core rules: udevadm trigger --subsystem-match=infiniband_verbs".into(),
                "in a container: pass the device in (--device /dev/infiniband/...)".into(),
            ],
        )
        .with_command("udevadm trigger --subsystem-match=infiniband_verbs"),
        Some(n) if !n.can_open => {
            evidence.push(format!("open {path}: {}", n.error.as_deref().unwrap_or("failed")));
            LayerReport::fail(
                name,
                Layer::DeviceNodes,
                format!("{path} exists but this user cannot open it"),
                evidence,
                vec![
                    "add the user to the group that owns it (ls -l /dev/infiniband; often `rdma`): usermod -aG rdma USER".into(),
                    "or a udev rule: KERNEL==\"uverbs*\", MODE=\"0666\"".into(),
                ],
            )
            .with_command(format!("usermod -aG \"$(stat -c %G {path})\" \"$USER\""))
        }
        Some(_) => LayerReport::pass(name, Layer::DeviceNodes, format!("{path} opens"), evidence),
    }
}
