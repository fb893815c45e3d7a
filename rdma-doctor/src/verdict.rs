//! The layered verdict. Layers are checked top down, as a request travels: kernel
//! modules, the device the kernel enumerated, its device node, the user-space provider,
//! the port, the link, the GID, the memlock limit, then the control plane (creating and
//! connecting objects: kernel path), the data plane (posting and completions: provider
//! and hardware) and rdma_cm (a connection through librdmacm: `cm_layer`). An iWARP
//! device (node type RNIC: siw, irdma and cxgb4 in iWARP mode) is judged by iWARP's
//! rules: it has no RoCE GID and no UDP port 4791; its connections go over TCP to an IP
//! address of the netdev under it, through rdma_cm only (its QPs cannot be connected by
//! hand), so its gid layer checks that address and its loopback connects through rdma_cm.
//! The first
//! layer that fails is a device's diagnosis; the ones below it are not checked, except
//! after the link layer: a link that is slow or degraded still carries traffic, and
//! whether the port works at all is worth knowing beside its rate, so the layers below a
//! failed link are checked too. Every device is checked.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::collect::DEVICE_DRIVERS;
use crate::loopback::LoopbackReport;
use crate::provider::ProviderProbe;
use crate::rdma_cm::{CmNode, CmReport};
use crate::report::{Baseline, DeviceFacts, Memlock, Observations, PortFacts};

/// A layer of the RDMA stack, top down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// ib_core, ib_uverbs and a device driver are loaded and nothing failed to probe.
    KernelModules,
    /// libibverbs and librdmacm load, with every function this build needs (scope `host`).
    Libraries,
    /// The kernel enumerated the device (`/sys/class/infiniband`).
    Device,
    /// `/dev/infiniband/uverbsN` exists, this user can open it, and the kernel lets this
    /// process open a context on the device (the rdma cgroup, the open-file limit).
    DeviceNodes,
    /// libibverbs lists the device and its provider opens it.
    Provider,
    /// The port is ACTIVE.
    Port,
    /// The physical link is up at the rate expected.
    Link,
    /// A RoCE port has a RoCE v2 GID with an IPv4 address; an iWARP port's netdev has an
    /// IPv4 address (iWARP connects over TCP to it).
    Gid,
    /// The locked-memory limit allows registration.
    Memlock,
    /// PD, CQs, QPs and regions can be created and two RC QPs connected.
    ControlPlane,
    /// RDMA WRITE, READ, SEND and atomics complete with the data intact.
    DataPlane,
    /// librdmacm listens, connects and passes a message on the port's IPv4 address:
    /// rdma_ucm, `/dev/infiniband/rdma_cm`, address resolution and the CM handshake.
    RdmaCm,
}

impl Layer {
    /// The per-device layers, in order.
    pub const DEVICE_LAYERS: [Layer; 10] = [
        Layer::Device,
        Layer::DeviceNodes,
        Layer::Provider,
        Layer::Port,
        Layer::Link,
        Layer::Gid,
        Layer::Memlock,
        Layer::ControlPlane,
        Layer::DataPlane,
        Layer::RdmaCm,
    ];

    /// The name used in text and JSON (`kernel_modules`, `data_plane`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Layer::KernelModules => "kernel_modules",
            Layer::Libraries => "libraries",
            Layer::Device => "device",
            Layer::DeviceNodes => "device_nodes",
            Layer::Provider => "provider",
            Layer::Port => "port",
            Layer::Link => "link",
            Layer::Gid => "gid",
            Layer::Memlock => "memlock",
            Layer::ControlPlane => "control_plane",
            Layer::DataPlane => "data_plane",
            Layer::RdmaCm => "rdma_cm",
        }
    }
}

/// How a layer came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Checked and fine.
    Pass,
    /// Checked and broken: the diagnosis.
    Fail,
    /// Not checked (a layer above failed, or the check was turned off).
    Skipped,
}

/// One layer's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerReport {
    /// `host` or the device name.
    pub scope: String,
    /// The layer.
    pub layer: Layer,
    /// Pass, fail or skipped.
    pub outcome: Outcome,
    /// One line.
    pub summary: String,
    /// What was seen.
    pub evidence: Vec<String>,
    /// The usual fix, as commands and steps for a person to run (the doctor runs none).
    pub fix: Vec<String>,
    /// The fix as one command to paste into a shell, without prose (`<netdev>`-style
    /// placeholders only where the doctor cannot know the value); `None` for a layer
    /// that did not fail. Absent from reports of format version 1.
    #[serde(default)]
    pub command: Option<String>,
    /// `command` only shows the problem (`ethtool NETDEV`, `dmesg | grep ...`, `lspci`, a
    /// reproduction with a reference tool): a check to run, not a fix. Absent from reports
    /// of format versions 1 and 2 (read as false).
    #[serde(default)]
    pub command_is_check: bool,
}

impl LayerReport {
    pub(crate) fn pass(scope: &str, layer: Layer, summary: impl Into<String>, evidence: Vec<String>) -> Self {
        LayerReport {
            scope: scope.into(),
            layer,
            outcome: Outcome::Pass,
            summary: summary.into(),
            evidence,
            fix: vec![],
            command: None,
            command_is_check: false,
        }
    }

    pub(crate) fn fail(
        scope: &str,
        layer: Layer,
        summary: impl Into<String>,
        evidence: Vec<String>,
        fix: Vec<String>,
    ) -> Self {
        let summary = summary.into();
        LayerReport {
            scope: scope.into(),
            layer,
            outcome: Outcome::Fail,
            summary,
            evidence,
            fix,
            command: None,
            command_is_check: false,
        }
    }

    pub(crate) fn skipped(scope: &str, layer: Layer, why: impl Into<String>) -> Self {
        LayerReport {
            scope: scope.into(),
            layer,
            outcome: Outcome::Skipped,
            summary: why.into(),
            evidence: vec![],
            fix: vec![],
            command: None,
            command_is_check: false,
        }
    }

    /// Sets the one command to paste ([`LayerReport::command`]), marked a check when it
    /// only shows the problem ([`only_shows`]).
    pub(crate) fn with_command(mut self, command: impl Into<String>) -> Self {
        let command = command.into();
        self.command_is_check = only_shows(&command);
        self.command = Some(command);
        self
    }

    /// Sets the one command to paste when it only shows the problem
    /// ([`LayerReport::command_is_check`]).
    pub(crate) fn with_check(mut self, command: impl Into<String>) -> Self {
        self.command = Some(command.into());
        self.command_is_check = true;
        self
    }
}

/// Whether `command` only shows the problem and changes nothing: the kernel log, the PCI
/// functions, a port's or a netdev's settings (`ethtool NETDEV`, not `ethtool -s`), a
/// route, a file, a library's dependencies, or a reproduction with a reference tool.
pub(crate) fn only_shows(command: &str) -> bool {
    let words: Vec<&str> = command.split_whitespace().collect();
    match words.as_slice() {
        ["dmesg" | "lspci" | "ibv_devinfo" | "ibstat" | "ldd" | "cat" | "grep" | "zgrep", ..] => true,
        ["ibv_rc_pingpong" | "rping" | "ib_write_bw" | "mlxlink" | "ibportstate", ..] => true,
        ["ethtool", netdev] => !netdev.starts_with('-'),
        ["rdma", _, "show", ..] | ["ip", "route", "get", ..] | ["ip", _, "show", ..] => true,
        _ => false,
    }
}

/// A rate a port should run at, and the reference it was taken from.
#[derive(Debug, Clone, PartialEq)]
pub struct RateRef {
    /// Gb/s.
    pub gbps: f64,
    /// Where it came from, for the report (`the saved baseline a.json`, `its netdev's speed`).
    pub from: String,
}

/// The rdma cgroup limit and use of the shell's cgroup.
pub(crate) const CGROUP_RDMA: &str =
    "cat \"/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/rdma.max\" \"/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/rdma.current\"";

/// The scope of the device layers when no device was named and none was found.
const NO_DEVICE: &str = "(any device)";

/// What the verdict looks at besides the collected facts.
#[derive(Debug, Clone, Default)]
pub struct Expectations {
    /// Devices to check, in order; a name the kernel does not list fails the device layer.
    pub devices: Vec<String>,
    /// Only this port (default: every port).
    pub port: Option<u8>,
    /// Bytes of locked memory a program must be able to register.
    pub memlock_need: u64,
    /// The rate each checked port should run at, with where that rate came from (the
    /// command line, a saved baseline, the netdev's speed, a sibling port): a lower active
    /// rate is a degraded link.
    pub expected_rate: BTreeMap<(String, String), RateRef>,
    /// Run the loopback test (control and data plane).
    pub loopback: bool,
    /// The netdev each soft device sat on in a saved baseline (for the exact re-create
    /// command when it is gone).
    pub known_parents: BTreeMap<String, String>,
    /// The IPv4 address of each port's RoCE v2 GID in a saved baseline (for the exact
    /// `ip addr add` when it is gone).
    pub known_addresses: BTreeMap<(String, String), String>,
    /// What was found about the provider of each device libibverbs could not open.
    pub providers: BTreeMap<String, ProviderProbe>,
    /// Whether the running kernel has RDMA at all, and what says so.
    pub kernel_rdma: KernelRdma,
    /// `/dev/infiniband/rdma_cm` as found (for the rdma_cm layer).
    pub rdma_cm_node: CmNode,
    /// Whether libibverbs and librdmacm loaded (empty: not looked at, taken as loaded).
    pub libraries: Vec<crate::libraries_layer::LibraryState>,
    /// The IPv4 addresses of each netdev, by name: where an iWARP port is reached (its
    /// connections go over TCP to them). Read live, not kept in the report's facts: an
    /// address is a node's own, and the gid layer's evidence names the one used.
    pub netdev_ipv4: BTreeMap<String, Vec<Ipv4Addr>>,
}

/// Whether the running kernel has RDMA at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelRdma {
    /// ib_core loaded, built in, built as a module or among the installed modules;
    /// `None` when unknown.
    pub has: Option<bool>,
    /// When the kernel was built without RDMA: the configuration line that says so and
    /// its file (`/proc/config.gz: # CONFIG_INFINIBAND is not set`).
    pub config: Option<String>,
}

/// The checks that use the device: the loopback test of the control and data planes on a
/// device's port, and the rdma_cm exchange on an IPv4 address.
pub struct Probes<'a> {
    /// `loopback(device, port, over)`: the QPs connected by hand, or with `over` (iWARP)
    /// through rdma_cm on that address.
    pub loopback: &'a mut dyn FnMut(&str, u8, Option<Ipv4Addr>) -> LoopbackReport,
    /// `rdma_cm(address)`.
    pub rdma_cm: &'a mut dyn FnMut(Ipv4Addr) -> CmReport,
}

impl Probes<'static> {
    /// Probes for a verdict with the loopback test turned off: calling one panics.
    #[cfg(test)]
    pub(crate) fn none() -> Self {
        Probes {
            loopback: Box::leak(Box::new(|_: &str, _, _| unreachable!("loopback is off"))),
            rdma_cm: Box::leak(Box::new(|_| unreachable!("loopback is off"))),
        }
    }
}

/// Checks every layer, top down. The probes run only for devices whose layers above all
/// passed.
pub fn evaluate(
    facts: &Baseline,
    seen: &Observations,
    want: &Expectations,
    probes: &mut Probes<'_>,
) -> (Vec<LayerReport>, BTreeMap<String, LoopbackReport>) {
    let mut out = vec![crate::modules_layer::check(facts, seen, &want.kernel_rdma)];
    let mut runs = BTreeMap::new();
    let host_ok = out[0].outcome == Outcome::Pass;
    if !want.libraries.is_empty() {
        out.push(crate::libraries_layer::check(&want.libraries));
    }
    let devices: Vec<String> = if want.devices.is_empty() { vec![NO_DEVICE.to_owned()] } else { want.devices.clone() };
    for name in &devices {
        let mut failed: Option<Layer> = if host_ok { None } else { Some(Layer::KernelModules) };
        for layer in Layer::DEVICE_LAYERS {
            if let Some(above) = failed {
                out.push(LayerReport::skipped(name, layer, format!("not checked: the {} layer failed", above.name())));
                continue;
            }
            // A library that did not load skips only the layers that need it (not a failure
            // of theirs): the kernel's own layers below it are checked all the same.
            if let Some(why) = crate::libraries_layer::needs(&want.libraries, layer) {
                out.push(LayerReport::skipped(name, layer, why));
                continue;
            }
            let r = match facts.devices.get(name) {
                None => device_missing(name, seen, facts, want),
                Some(d) => check(layer, name, d, facts, want, &mut runs, probes),
            };
            // A failed link (slow, degraded) does not stop the checks below it.
            if r.outcome == Outcome::Fail && layer != Layer::Link {
                failed = Some(layer);
            }
            out.push(r);
        }
    }
    (out, runs)
}

fn check(
    layer: Layer,
    name: &str,
    d: &DeviceFacts,
    facts: &Baseline,
    want: &Expectations,
    runs: &mut BTreeMap<String, LoopbackReport>,
    probes: &mut Probes<'_>,
) -> LayerReport {
    let ports: Vec<(&String, &PortFacts)> =
        d.ports.iter().filter(|(n, _)| want.port.is_none_or(|p| **n == p.to_string())).collect();
    match layer {
        Layer::Device => {
            let driver = d.kernel_driver_name.as_deref().unwrap_or("unknown driver");
            let fw = if d.fw_ver.is_empty() { String::new() } else { format!(", firmware {}", d.fw_ver) };
            LayerReport::pass(name, layer, format!("enumerated by the kernel ({driver}{fw})"), vec![])
        }
        Layer::DeviceNodes => {
            let nodes = device_nodes(name, d, facts);
            match nodes.outcome {
                Outcome::Pass => {
                    crate::provider::kernel_refusal(name, d, facts, want.providers.get(name)).unwrap_or(nodes)
                }
                _ => nodes,
            }
        }
        Layer::Provider => crate::provider::check(name, d, facts, want.providers.get(name)),
        Layer::Port => port_state(name, &ports),
        Layer::Link => link(name, &ports, &|port| want.expected_rate.get(&(name.to_owned(), port.to_owned())).cloned()),
        Layer::Gid if is_iwarp(d) => iwarp_address(name, &ports, &want.netdev_ipv4),
        Layer::Gid => gid(name, &ports, &|port| want.known_addresses.get(&(name.to_owned(), port.to_owned())).cloned()),
        Layer::Memlock => check_memlock(name, &facts.memlock, want.memlock_need),
        _ if !want.loopback => LayerReport::skipped(name, layer, "not run (loopback test turned off)"),
        Layer::ControlPlane | Layer::DataPlane if is_iwarp(d) => {
            let Some((port, netdev, ip)) = iwarp_ip(&ports, &want.netdev_ipv4) else {
                return LayerReport::skipped(name, layer, NO_IWARP_ADDRESS);
            };
            let port: u8 = port.parse().unwrap_or(1);
            let run = runs.entry(name.to_owned()).or_insert_with(|| (probes.loopback)(name, port, Some(ip)));
            let mut r = planes(layer, name, port, run, &rping(ip));
            r.evidence.push(format!("iWARP: the QPs connected through rdma_cm over TCP to {ip} ({netdev})"));
            r
        }
        Layer::ControlPlane | Layer::DataPlane => {
            let port = ports.first().and_then(|(n, _)| n.parse().ok()).unwrap_or(1);
            let run = runs.entry(name.to_owned()).or_insert_with(|| (probes.loopback)(name, port, None));
            planes(layer, name, port, run, &pingpong(name, port, ports.first().map(|(_, p)| *p)))
        }
        Layer::RdmaCm if is_iwarp(d) => match iwarp_ip(&ports, &want.netdev_ipv4) {
            None => LayerReport::skipped(name, layer, NO_IWARP_ADDRESS),
            Some((port, netdev, ip)) => {
                let on = crate::cm_layer::Address {
                    port,
                    ip,
                    what: format!("{netdev}'s address: iWARP connects over TCP to it"),
                };
                crate::cm_layer::check(name, Some(on), facts, &want.rdma_cm_node, probes.rdma_cm)
            }
        },
        Layer::RdmaCm => {
            let on = crate::cm_layer::roce_address(&ports);
            crate::cm_layer::check(name, on, facts, &want.rdma_cm_node, probes.rdma_cm)
        }
        Layer::KernelModules | Layer::Libraries => unreachable!("a host layer"),
    }
}

fn device_missing(name: &str, seen: &Observations, facts: &Baseline, want: &Expectations) -> LayerReport {
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
fn soft_link_advice(name: &str, drivers: &[&str], want: &Expectations) -> Option<(String, &'static str)> {
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

fn device_nodes(name: &str, d: &DeviceFacts, facts: &Baseline) -> LayerReport {
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

fn port_state(name: &str, ports: &[(&String, &PortFacts)]) -> LayerReport {
    if ports.is_empty() {
        return LayerReport::fail(
            name,
            Layer::Port,
            "no port to check",
            vec![],
            vec![format!("ibv_devinfo -d {name} lists the ports")],
        )
        .with_command(format!("ibv_devinfo -d {name}"));
    }
    let mut evidence = Vec::new();
    for (n, p) in ports {
        let netdev = p.netdev.as_ref().map(|nd| {
            format!(
                ", netdev {} operstate {}{}",
                nd.name,
                nd.operstate,
                if nd.admin_up { "" } else { " (administratively down)" }
            )
        });
        evidence.push(format!(
            "port {n}: state {}, phys_state {}{}",
            p.state,
            p.phys_state,
            netdev.unwrap_or_default()
        ));
    }
    let Some((n, p)) = ports.iter().find(|(_, p)| p.state != "ACTIVE") else {
        return LayerReport::pass(name, Layer::Port, "every port checked is ACTIVE", evidence);
    };
    let mut fix = Vec::new();
    let mut command = format!("ibstat {name} {n}");
    if p.link_layer == "Ethernet" {
        command = format!("rdma link show {name}/{n}");
        if let Some(nd) = &p.netdev {
            command = format!("ethtool {}", nd.name);
            if nd.admin_up {
                fix.push(format!(
                    "{} is administratively up but has no link (operstate {}): check the cable, the transceiver and the peer's switch port: ethtool {}",
                    nd.name, nd.operstate, nd.name
                ));
            } else {
                command = format!("ip link set {} up", nd.name);
                fix.push(format!("ip link set {} up", nd.name));
                fix.push(format!("then check the cable and the switch port: ethtool {}", nd.name));
            }
        }
    } else if p.state == "INIT" || p.state == "ARMED" {
        command = "systemctl start opensm".into();
        fix.push(
            "the port waits for a subnet manager: start one (systemctl start opensm) or enable the switch's SM".into(),
        );
    } else {
        fix.push("check the cable and the switch port: ibstat, ibportstate".into());
    }
    LayerReport::fail(
        name,
        Layer::Port,
        format!("port {n} is {} (phys_state {})", p.state, p.phys_state),
        evidence,
        fix,
    )
    .with_command(command)
}

/// The link layer of `ports`: each is LinkUp, at `expected(port)` or more where that
/// gives a rate. `name` is the scope of the report.
pub(crate) fn link(
    name: &str,
    ports: &[(&String, &PortFacts)],
    expected: &dyn Fn(&str) -> Option<RateRef>,
) -> LayerReport {
    let mut evidence = Vec::new();
    let mut compared = Vec::new();
    for (n, p) in ports {
        let rate = format!("{} {} = {} Gb/s", p.width, p.speed, p.rate_gbps);
        evidence.push(format!("port {n}: phys_state {}, {rate}", p.phys_state));
        if p.phys_state != "LinkUp" {
            return LayerReport::fail(
                name,
                Layer::Link,
                format!("port {n} is {} but its physical state is {}, not LinkUp", p.state, p.phys_state),
                evidence,
                vec![format!(
                    "check the cable, the transceiver and the switch port; the negotiated link: {}",
                    link_command(name, n, p)
                )],
            )
            .with_command(link_command(name, n, p));
        }
        let Some(want) = expected(n) else { continue };
        evidence.push(format!("expected {} Gb/s: {}", want.gbps, want.from));
        if p.rate_gbps + 0.01 < want.gbps {
            return degraded(name, n, p, &want, evidence).with_command(link_command(name, n, p));
        }
        compared.push(format!("port {n}: {}", want.from));
    }
    let summary = if compared.is_empty() {
        "physical link up (rate not compared: no --expect-rate, saved baseline, netdev speed or sibling port)"
            .to_owned()
    } else {
        format!("physical link up at the expected rate ({})", compared.join("; "))
    };
    LayerReport::pass(name, Layer::Link, summary, evidence)
}

/// What shows a port's negotiated link: `ethtool` on its netdev, else `ibstat`.
fn link_command(name: &str, port: &str, p: &PortFacts) -> String {
    match &p.netdev {
        Some(nd) => format!("ethtool {}", nd.name),
        None => format!("ibstat {name} {port}"),
    }
}

fn degraded(name: &str, port: &str, p: &PortFacts, want: &RateRef, evidence: Vec<String>) -> LayerReport {
    let rate = p.rate_gbps;
    LayerReport::fail(
        name,
        Layer::Link,
        format!(
            "port {port} runs at {rate} Gb/s, below the expected {} Gb/s ({}): a degraded link",
            want.gbps, want.from
        ),
        evidence,
        vec![
            "reseat or replace the cable or transceiver; check the switch port's speed and errors".into(),
            format!("the negotiated and supported speeds: {}", link_command(name, port, p)),
        ],
    )
}

/// The gid layer of `ports`; `known(port)` is the IPv4 address a saved baseline had on a
/// port, to fill the fix with.
fn gid(name: &str, ports: &[(&String, &PortFacts)], known: &dyn Fn(&str) -> Option<String>) -> LayerReport {
    let mut evidence = Vec::new();
    for (n, p) in ports {
        if p.link_layer != "Ethernet" {
            evidence.push(format!("port {n}: {}, addressed by LID {}", p.link_layer, p.lid));
            continue;
        }
        let v2 = |g: &&crate::report::GidFacts| g.gid_type == "RoCE v2";
        let v4 = p.gids.iter().find(|(_, g)| v2(g) && g.gid.starts_with("::ffff:"));
        let v6 = p.gids.iter().find(|(_, g)| v2(g) && !g.gid.starts_with("fe80:") && !g.gid.starts_with("::ffff:"));
        match (v4, v6) {
            (Some((i, g)), _) => evidence.push(format!("port {n}: RoCE v2 GID index {i} {}", g.gid)),
            (None, Some((i, g))) => {
                evidence.push(format!("port {n}: no IPv4 RoCE v2 GID; IPv6 RoCE v2 GID index {i} {}", g.gid))
            }
            (None, None) => {
                let netdev = p.netdev.as_ref().map_or("the netdev", |nd| nd.name.as_str());
                let dev = p.netdev.as_ref().map_or("<netdev>", |nd| nd.name.as_str());
                evidence.extend(p.gids.iter().map(|(i, g)| format!("port {n}: GID {i} {} {}", g.gid, g.gid_type)));
                let address = known(n);
                if let Some(a) = &address {
                    evidence.push(format!("the saved baseline had {a} on port {n}"));
                }
                let (prose, command) = match &address {
                    Some(a) => (format!("{a}/PREFIX"), format!("{a}/<prefix>")),
                    None => ("ADDRESS/PREFIX".to_owned(), "<address>/<prefix>".to_owned()),
                };
                return LayerReport::fail(
                    name,
                    Layer::Gid,
                    format!("port {n}: no RoCE v2 GID with an IPv4 address ({netdev} has no IPv4 address)"),
                    evidence,
                    vec![format!("ip addr add {prose} dev {netdev}   # the GID appears with the address")],
                )
                .with_command(format!("ip addr add {command} dev {dev}"));
            }
        }
    }
    LayerReport::pass(name, Layer::Gid, "addressable", evidence)
}

/// Whether `d` is an iWARP device: node type RNIC (sysfs `node_type` `4: RNIC`).
pub(crate) fn is_iwarp(d: &DeviceFacts) -> bool {
    d.node_type == "RNIC"
}

/// Why an iWARP device's loopback and rdma_cm checks did not run.
const NO_IWARP_ADDRESS: &str =
    "not run: iWARP connects only through rdma_cm over TCP, and no IPv4 address of the netdev under it is known";

/// The first checked iWARP port whose netdev has an IPv4 address: the port, the netdev
/// and the address.
fn iwarp_ip<'a>(
    ports: &[(&'a String, &PortFacts)],
    addresses: &BTreeMap<String, Vec<Ipv4Addr>>,
) -> Option<(&'a str, String, Ipv4Addr)> {
    ports.iter().find_map(|(n, p)| {
        let nd = p.netdev.as_ref()?;
        let ip = addresses.get(&nd.name)?.first()?;
        Some((n.as_str(), nd.name.clone(), *ip))
    })
}

/// The gid layer of an iWARP device: it has no RoCE GID to check (its GID is its netdev's
/// MAC); it is reached over TCP at an IP address of the netdev under it, which must have
/// one.
fn iwarp_address(
    name: &str,
    ports: &[(&String, &PortFacts)],
    addresses: &BTreeMap<String, Vec<Ipv4Addr>>,
) -> LayerReport {
    let mut evidence = Vec::new();
    let mut reached = None;
    for (n, p) in ports {
        let Some(nd) = &p.netdev else {
            evidence.push(format!("port {n}: iWARP; the netdev under it was not identified"));
            continue;
        };
        match addresses.get(&nd.name).filter(|a| !a.is_empty()) {
            Some(a) => {
                let list: Vec<String> = a.iter().map(ToString::to_string).collect();
                evidence.push(format!("port {n}: iWARP on {}, IPv4 {}", nd.name, list.join(", ")));
                reached.get_or_insert((nd.name.clone(), a[0]));
            }
            None => {
                evidence.push(format!("port {n}: iWARP on {}, which has no IPv4 address", nd.name));
                return LayerReport::fail(
                    name,
                    Layer::Gid,
                    format!(
                        "port {n}: iWARP connects over TCP to its netdev's IP address, and {} has no IPv4 address",
                        nd.name
                    ),
                    evidence,
                    vec![format!("ip addr add ADDRESS/PREFIX dev {}   # rdma_cm reaches the device there", nd.name)],
                )
                .with_command(format!("ip addr add <address>/<prefix> dev {}", nd.name));
            }
        }
    }
    let summary = match reached {
        Some((netdev, ip)) => {
            format!("iWARP (no RoCE GID, no UDP 4791): reached over TCP through rdma_cm at {ip} on {netdev}")
        }
        None => "iWARP (no RoCE GID): the netdev under it was not identified, its address not checked".to_owned(),
    };
    LayerReport::pass(name, Layer::Gid, summary, evidence)
}

/// `rping` server and client on `ip`: the reference check of an iWARP device, which
/// connects through rdma_cm only (`ibv_rc_pingpong` cannot connect it).
fn rping(ip: Ipv4Addr) -> String {
    format!("rping -s -a {ip} -C 1 -v & sleep 1; rping -c -a {ip} -C 1 -v")
}

/// The memlock layer for a given limit: fails when registering `need` bytes would fail.
pub fn check_memlock(scope: &str, m: &Memlock, need: u64) -> LayerReport {
    let fmt = |v: Option<u64>| v.map_or_else(|| "unlimited".to_owned(), human);
    let evidence = vec![
        format!("RLIMIT_MEMLOCK soft {}, hard {}", fmt(m.soft_bytes), fmt(m.hard_bytes)),
        format!("CAP_IPC_LOCK: {}", if m.cap_ipc_lock { "yes" } else { "no" }),
    ];
    if m.cap_ipc_lock {
        return LayerReport::pass(scope, Layer::Memlock, "CAP_IPC_LOCK: registration is not limited", evidence);
    }
    match m.soft_bytes {
        Some(limit) if limit < need => LayerReport::fail(
            scope,
            Layer::Memlock,
            format!("memlock limit {} is below the {} registration needs: ibv_reg_mr fails with ENOMEM", human(limit), human(need)),
            evidence,
            vec![
                "raise it for the shell: ulimit -l unlimited (up to the hard limit)".into(),
                "for logins: /etc/security/limits.d/rdma.conf with `* soft memlock unlimited` and `* hard memlock unlimited`".into(),
                "for systemd services: LimitMEMLOCK=infinity; for containers: --ulimit memlock=-1".into(),
            ],
        )
        .with_command(match m.hard_bytes {
            None => "ulimit -l unlimited".to_owned(),
            Some(hard) if hard >= need => format!("ulimit -l {}", hard >> 10),
            Some(_) => "echo '* - memlock unlimited' > /etc/security/limits.d/rdma.conf".to_owned(),
        }),
        _ => LayerReport::pass(scope, Layer::Memlock, format!("memlock limit {} allows registration", fmt(m.soft_bytes)), evidence),
    }
}

/// `ibv_rc_pingpong` server and client on `port` of `name` (with the IPv4 RoCE v2 GID's
/// index on Ethernet): a second opinion on the loopback.
fn pingpong(name: &str, port: u8, p: Option<&PortFacts>) -> String {
    let v4 = |g: &crate::report::GidFacts| g.gid_type == "RoCE v2" && g.gid.starts_with("::ffff:");
    let gid = p.and_then(|p| p.gids.iter().find(|(_, g)| v4(g))).map(|(i, _)| format!(" -g {i}")).unwrap_or_default();
    let one = format!("ibv_rc_pingpong -d {name} -i {port}{gid}");
    format!("{one} & sleep 1; {one} 127.0.0.1")
}

fn planes(layer: Layer, name: &str, port: u8, run: &LoopbackReport, ping: &str) -> LayerReport {
    let mut evidence: Vec<String> =
        run.ops.iter().map(|o| format!("{}: {} ({})", o.op, if o.ok { "ok" } else { "FAILED" }, o.detail)).collect();
    evidence.push(format!("loopback on port {port} took {} ms", run.elapsed_ms));
    if layer == Layer::ControlPlane {
        return match &run.setup_error {
            Some(e) => {
                let mut fix = vec![
                    "the kernel driver refused: dmesg | grep -iE 'rdma|infiniband|mlx5|rxe'".to_owned(),
                    format!("a second opinion (server, then client): {ping}"),
                ];
                let mut command = "dmesg | grep -iE 'rdma|infiniband|mlx5|rxe'".to_owned();
                if crate::provider::os_error(e) == Some(libc::EAGAIN) {
                    fix.insert(0, "EAGAIN: the kernel refused more objects: the rdma cgroup's limit (cat /sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/rdma.max rdma.current) or the device's".into());
                    command = CGROUP_RDMA.to_owned();
                }
                LayerReport::fail(
                    name,
                    layer,
                    "creating or connecting the loopback QPs failed (kernel path)",
                    vec![e.clone()],
                    fix,
                )
                .with_command(command)
            }
            None => LayerReport::pass(name, layer, "PD, CQs, regions and two RC QPs created and connected", vec![]),
        };
    }
    if run.passed() {
        let skipped = |o: &&crate::loopback::OpResult| o.detail.starts_with(crate::loopback::SKIPPED);
        let ran: Vec<&str> = run.ops.iter().filter(|o| !skipped(o)).map(|o| o.op.as_str()).collect();
        let not: Vec<&str> = run.ops.iter().filter(skipped).map(|o| o.op.as_str()).collect();
        let mut summary = format!("loopback {} verified", ran.join(", "));
        if !not.is_empty() {
            summary += &format!(" ({} not supported by the device: not run)", not.join(", "));
        }
        return LayerReport::pass(name, layer, summary, evidence);
    }
    let failed =
        run.ops.iter().find(|o| !o.ok).map_or("nothing ran".to_owned(), |o| format!("{} failed: {}", o.op, o.detail));
    LayerReport::fail(
        name,
        layer,
        format!("control plane fine, data plane broken: {failed}"),
        evidence,
        vec![
            "posting and completions run in the provider and the device: check that the provider (rdma-core) and the kernel driver are of one generation, and the firmware against the known-bad list".into(),
            format!("reproduce with a reference tool (server, then client): {ping}"),
        ],
    )
    .with_command(ping)
}

pub(crate) fn list_or(items: &[&str], none: &str) -> String {
    if items.is_empty() {
        none.to_owned()
    } else {
        items.join(", ")
    }
}

/// `8 MiB`, `64 KiB`, `100 B`.
pub fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memlock_check_fails_below_the_need_unless_the_limit_is_lifted() {
        let tiny = Memlock { soft_bytes: Some(64 << 10), hard_bytes: Some(64 << 10), cap_ipc_lock: false };
        let r = check_memlock("mlx5_0", &tiny, 1 << 20);
        assert_eq!((r.layer, r.outcome), (Layer::Memlock, Outcome::Fail));
        assert!(r.summary.contains("64 KiB") && r.summary.contains("ENOMEM"), "{r:?}");
        assert!(r.fix.iter().any(|f| f.contains("ulimit -l")), "{r:?}");
        assert!(r.fix.iter().any(|f| f.contains("LimitMEMLOCK")), "{r:?}");

        let lifted = Memlock { cap_ipc_lock: true, ..tiny };
        assert_eq!(check_memlock("mlx5_0", &lifted, 1 << 20).outcome, Outcome::Pass);
        let unlimited = Memlock { soft_bytes: None, hard_bytes: None, cap_ipc_lock: false };
        assert_eq!(check_memlock("mlx5_0", &unlimited, 1 << 20).outcome, Outcome::Pass);
        let enough = Memlock { soft_bytes: Some(8 << 20), ..tiny };
        assert_eq!(check_memlock("mlx5_0", &enough, 1 << 20).outcome, Outcome::Pass);
    }

    /// The first failing layer of the fixture node after `edit`, with its report.
    fn first_failure(edit: impl FnOnce(&mut Baseline, &mut Expectations)) -> Option<LayerReport> {
        let report: crate::Report = serde_json::from_str(include_str!("../testdata/node-a.json")).unwrap();
        let mut facts = report.baseline;
        let mut want = Expectations {
            devices: vec!["mlx5_0".into()],
            memlock_need: 1 << 20,
            loopback: false,
            ..Expectations::default()
        };
        edit(&mut facts, &mut want);
        let seen = Observations {
            sysfs_devices: facts.devices.keys().cloned().collect(),
            verbs_devices: facts.devices.keys().cloned().collect(),
            ..Observations::default()
        };
        let (layers, _) = evaluate(&facts, &seen, &want, &mut Probes::none());
        assert_eq!(layers.len(), 1 + Layer::DEVICE_LAYERS.len());
        let first = layers.iter().position(|l| l.outcome == Outcome::Fail)?;
        if layers[first].layer == Layer::Link {
            // The layers below a failed link are still checked (the loopback is off here).
            let below: Vec<Outcome> = layers[first + 1..].iter().map(|l| l.outcome).collect();
            assert_eq!(below, [Outcome::Pass, Outcome::Pass, Outcome::Skipped, Outcome::Skipped, Outcome::Skipped]);
            assert!(layers[first + 3..].iter().all(|l| l.summary.contains("loopback test turned off")), "{layers:#?}");
        } else {
            assert!(layers[first + 1..].iter().all(|l| l.outcome == Outcome::Skipped), "{layers:#?}");
        }
        assert!(layers[first].command.as_deref().is_some_and(bare_command), "{:#?}", layers[first]);
        Some(layers[first].clone())
    }

    /// A command to paste: no prose before a colon, no comment.
    pub(crate) fn bare_command(c: &str) -> bool {
        !c.is_empty() && !c.contains(": ") && !c.contains('#')
    }

    #[test]
    fn commands_that_only_diagnose_are_checks_and_the_rest_fixes() {
        let checks = [
            "ethtool dummy0",
            "dmesg | grep -iE 'mlx5'",
            "lspci -nnk | grep -iA3 -E 'mellanox|infiniband|ethernet'",
            "ibv_rc_pingpong -d rxe0 -i 1 -g 1 & sleep 1; ibv_rc_pingpong -d rxe0 -i 1 -g 1 127.0.0.1",
            "ibstat mlx5_0 1",
            "rdma link show rxe0/1",
            "ip route get 10.0.0.1",
            "ldd /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so",
            CGROUP_RDMA,
        ];
        for c in checks {
            let r = LayerReport::fail("x", Layer::Link, "s", vec![], vec![]).with_command(c);
            assert!(r.command_is_check, "{c}");
        }
        let fixes = [
            "ip link set dummy0 up",
            "modprobe rdma_ucm",
            "ethtool -s ens1f0np0 speed 100000",
            "rdma link add rxe0 type rxe netdev dummy0",
            "ulimit -l unlimited",
            "umount /dev/infiniband/rdma_cm",
        ];
        for c in fixes {
            assert!(!only_shows(c), "{c}");
        }
    }

    fn port(b: &mut Baseline) -> &mut PortFacts {
        b.devices.get_mut("mlx5_0").unwrap().ports.get_mut("1").unwrap()
    }

    #[test]
    fn each_broken_layer_is_named_with_its_fix_and_the_ones_below_are_skipped() {
        assert_eq!(first_failure(|_, _| {}), None, "the fixture node is healthy");

        let f = first_failure(|b, _| {
            b.modules.remove("ib_uverbs");
        })
        .unwrap();
        assert_eq!(f.layer, Layer::KernelModules);
        assert!(f.fix[0].starts_with("modprobe ib_uverbs"), "{f:?}");

        let f = first_failure(|_, w| w.devices = vec!["mlx5_1".into()]).unwrap();
        assert_eq!((f.layer, f.scope.as_str()), (Layer::Device, "mlx5_1"), "{f:?}");

        let f = first_failure(|b, _| b.dev_nodes.get_mut("/dev/infiniband/uverbs0").unwrap().can_open = false).unwrap();
        assert_eq!(f.layer, Layer::DeviceNodes);
        assert!(f.fix.iter().any(|x| x.contains("usermod -aG rdma")), "{f:?}");

        let f = first_failure(|b, _| {
            b.devices.get_mut("mlx5_0").unwrap().open_error = Some("ibv_open_device failed: ENOSYS".into())
        })
        .unwrap();
        assert_eq!(f.layer, Layer::Provider);
        assert!(f.fix.iter().any(|x| x.contains("ibverbs-providers")), "{f:?}");

        let f = first_failure(|b, _| {
            let p = port(b);
            p.state = "DOWN".into();
            p.phys_state = "Disabled".into();
            p.netdev.as_mut().unwrap().admin_up = false;
        })
        .unwrap();
        assert_eq!(f.layer, Layer::Port);
        assert_eq!(f.fix[0], "ip link set ens1f0np0 up");
        assert_eq!(f.command.as_deref(), Some("ip link set ens1f0np0 up"));

        let f = first_failure(|b, _| port(b).phys_state = "LinkErrorRecovery".into()).unwrap();
        assert_eq!(f.layer, Layer::Link);
        assert!(f.summary.contains("not LinkUp"), "{f:?}");

        // ACTIVE and LinkUp, but at 100 of the 200 Gb/s the saved baseline had.
        let f = first_failure(|b, w| {
            port(b).rate_gbps = 100.0;
            w.expected_rate
                .insert(("mlx5_0".into(), "1".into()), RateRef { gbps: 200.0, from: "the saved baseline".into() });
        })
        .unwrap();
        assert_eq!(f.layer, Layer::Link);
        assert!(f.summary.contains("degraded"), "{f:?}");

        let f = first_failure(|b, _| port(b).gids.retain(|_, g| !g.gid.starts_with("::ffff:"))).unwrap();
        assert_eq!(f.layer, Layer::Gid);
        assert!(f.summary.contains("ens1f0np0 has no IPv4 address"), "{f:?}");
        assert!(f.fix[0].starts_with("ip addr add ADDRESS/PREFIX dev ens1f0np0"), "{f:?}");
        assert_eq!(f.command.as_deref(), Some("ip addr add <address>/<prefix> dev ens1f0np0"));
        // A saved baseline knows the address: the fix names it.
        let f = first_failure(|b, w| {
            port(b).gids.retain(|_, g| !g.gid.starts_with("::ffff:"));
            w.known_addresses.insert(("mlx5_0".into(), "1".into()), "192.168.7.21".into());
        })
        .unwrap();
        assert_eq!(f.command.as_deref(), Some("ip addr add 192.168.7.21/<prefix> dev ens1f0np0"));
        assert!(f.evidence.iter().any(|e| e == "the saved baseline had 192.168.7.21 on port 1"), "{f:#?}");

        let f = first_failure(|b, _| {
            b.memlock = Memlock { soft_bytes: Some(64 << 10), hard_bytes: Some(64 << 10), cap_ipc_lock: false }
        })
        .unwrap();
        assert_eq!(f.layer, Layer::Memlock);
    }

    #[test]
    fn a_degraded_link_still_runs_the_control_plane_data_plane_and_rdma_cm_checks() {
        let report: crate::Report = serde_json::from_str(include_str!("../testdata/node-a.json")).unwrap();
        let mut facts = report.baseline;
        port(&mut facts).rate_gbps = 100.0;
        let mut want = Expectations {
            devices: vec!["mlx5_0".into()],
            memlock_need: 1 << 20,
            loopback: true,
            rdma_cm_node: CmNode {
                kernel_dev: Some("10:58".into()),
                exists: true,
                node_dev: Some("10:58".into()),
                mounted_over: false,
            },
            ..Expectations::default()
        };
        want.expected_rate.insert(("mlx5_0".into(), "1".into()), RateRef { gbps: 200.0, from: "--expect-rate".into() });
        let seen = Observations { sysfs_devices: vec!["mlx5_0".into()], ..Observations::default() };
        let (mut looped, mut connected) = (0, 0);
        let mut lb = |_: &str, _: u8, _: Option<Ipv4Addr>| {
            looped += 1;
            let op =
                crate::loopback::OpResult { op: "RDMA_WRITE".into(), ok: true, detail: "1024 bytes verified".into() };
            LoopbackReport { ops: vec![op], ..LoopbackReport::default() }
        };
        let mut cm = |_: Ipv4Addr| {
            connected += 1;
            CmReport { verified: Some("a 32-byte message received".into()), ..CmReport::default() }
        };
        let (layers, _) = evaluate(&facts, &seen, &want, &mut Probes { loopback: &mut lb, rdma_cm: &mut cm });
        let of = |l: Layer| layers.iter().find(|r| r.layer == l).unwrap().outcome;
        assert_eq!(of(Layer::Link), Outcome::Fail, "{layers:#?}");
        for l in [Layer::Gid, Layer::Memlock, Layer::ControlPlane, Layer::DataPlane, Layer::RdmaCm] {
            assert_eq!(of(l), Outcome::Pass, "{l:?} is checked below a slow link: {layers:#?}");
        }
        assert_eq!((looped, connected), (1, 1));
        assert_eq!(crate::Status::of(&layers, 0, &[]), crate::Status::LayerFailed, "the slow link still fails the run");
    }

    /// The fixture's mlx5_0 as an iWARP device (node type RNIC, its GID the netdev's MAC),
    /// its netdev with `addresses`, checked with the loopback on: the layers, and the
    /// addresses the loopback and the rdma_cm probe were given.
    fn iwarp_verdict(
        addresses: &[Ipv4Addr],
        netdev_known: bool,
    ) -> (Vec<LayerReport>, Vec<Option<Ipv4Addr>>, Vec<Ipv4Addr>) {
        let report: crate::Report = serde_json::from_str(include_str!("../testdata/node-a.json")).unwrap();
        let mut facts = report.baseline;
        facts.devices.get_mut("mlx5_0").unwrap().node_type = "RNIC".into();
        let p = port(&mut facts);
        p.gids.clear();
        p.gids.insert(
            "0".into(),
            crate::report::GidFacts { gid: "b8ce:f6ff:fe12:3456::".into(), gid_type: "IB".into(), netdev: None },
        );
        if !netdev_known {
            p.netdev = None;
        }
        let mut want = Expectations {
            devices: vec!["mlx5_0".into()],
            memlock_need: 1 << 20,
            loopback: true,
            rdma_cm_node: CmNode {
                kernel_dev: Some("10:58".into()),
                exists: true,
                node_dev: Some("10:58".into()),
                mounted_over: false,
            },
            ..Expectations::default()
        };
        want.netdev_ipv4.insert("ens1f0np0".into(), addresses.to_vec());
        let seen = Observations { sysfs_devices: vec!["mlx5_0".into()], ..Observations::default() };
        let (mut looped, mut connected) = (Vec::new(), Vec::new());
        let mut lb = |_: &str, _: u8, over: Option<Ipv4Addr>| {
            looped.push(over);
            let op = crate::loopback::OpResult { op: "SEND".into(), ok: true, detail: "1024 bytes verified".into() };
            let skipped = crate::loopback::OpResult {
                op: "FETCH_ADD".into(),
                ok: true,
                detail: format!("{}: no atomics", crate::loopback::SKIPPED),
            };
            LoopbackReport { ops: vec![op, skipped], ..LoopbackReport::default() }
        };
        let mut cm = |ip: Ipv4Addr| {
            connected.push(ip);
            CmReport { verified: Some("a 32-byte message received".into()), ..CmReport::default() }
        };
        let (layers, _) = evaluate(&facts, &seen, &want, &mut Probes { loopback: &mut lb, rdma_cm: &mut cm });
        (layers, looped, connected)
    }

    #[test]
    fn iwarp_has_no_roce_gid_to_check_and_connects_its_loopback_and_rdma_cm_over_its_netdevs_address() {
        let ip = Ipv4Addr::new(10, 7, 0, 5);
        let (layers, looped, connected) = iwarp_verdict(&[ip], true);
        for l in &layers {
            assert_eq!(l.outcome, Outcome::Pass, "{l:#?}");
        }
        let of = |l: Layer| layers.iter().find(|r| r.layer == l).unwrap();
        assert!(of(Layer::Gid).summary.contains("iWARP (no RoCE GID, no UDP 4791)"), "{:#?}", of(Layer::Gid));
        assert!(of(Layer::Gid).summary.contains("10.7.0.5 on ens1f0np0"), "{:#?}", of(Layer::Gid));
        assert_eq!(looped, [Some(ip)], "the loopback connects through rdma_cm on the netdev's address, once");
        assert_eq!(connected, [ip]);
        let data = of(Layer::DataPlane);
        assert_eq!(data.summary, "loopback SEND verified (FETCH_ADD not supported by the device: not run)");
        assert!(data.evidence.iter().any(|e| e.contains("rdma_cm over TCP to 10.7.0.5")), "{data:#?}");
        assert!(of(Layer::RdmaCm).evidence.iter().any(|e| e.contains("iWARP connects over TCP")), "{layers:#?}");
    }

    #[test]
    fn iwarp_on_a_netdev_without_an_ipv4_address_fails_the_gid_layer_with_ip_addr_add() {
        let (layers, looped, connected) = iwarp_verdict(&[], true);
        let f = layers.iter().find(|l| l.outcome == Outcome::Fail).unwrap();
        assert_eq!(f.layer, Layer::Gid, "{layers:#?}");
        assert!(f.summary.contains("ens1f0np0 has no IPv4 address"), "{f:#?}");
        assert_eq!(f.command.as_deref(), Some("ip addr add <address>/<prefix> dev ens1f0np0"));
        assert!(!f.summary.contains("RoCE"), "{f:#?}");
        assert!(looped.is_empty() && connected.is_empty());

        // The netdev not identified: nothing to blame, the checks that need it not run.
        let (layers, looped, _) = iwarp_verdict(&[], false);
        assert!(layers.iter().all(|l| l.outcome != Outcome::Fail), "{layers:#?}");
        let cm = layers.iter().find(|l| l.layer == Layer::RdmaCm).unwrap();
        assert_eq!((cm.outcome, cm.summary.as_str()), (Outcome::Skipped, NO_IWARP_ADDRESS));
        assert!(looped.is_empty());
    }

    #[test]
    fn a_second_device_that_is_down_fails_its_port_layer_and_the_exit_status() {
        let report: crate::Report = serde_json::from_str(include_str!("../testdata/node-a.json")).unwrap();
        let mut facts = report.baseline;
        let mut second = facts.devices["mlx5_0"].clone();
        let p = second.ports.get_mut("1").unwrap();
        (p.state, p.phys_state) = ("DOWN".into(), "Disabled".into());
        facts.devices.insert("mlx5_1".into(), second);
        let names: Vec<String> = facts.devices.keys().cloned().collect();
        let want = Expectations { devices: names.clone(), memlock_need: 1 << 20, ..Expectations::default() };
        let seen = Observations { sysfs_devices: names.clone(), verbs_devices: names, ..Observations::default() };
        let (layers, _) = evaluate(&facts, &seen, &want, &mut Probes::none());
        assert_eq!(layers.len(), 1 + 2 * Layer::DEVICE_LAYERS.len(), "both devices are examined");
        let failed: Vec<(&str, Layer)> =
            layers.iter().filter(|l| l.outcome == Outcome::Fail).map(|l| (l.scope.as_str(), l.layer)).collect();
        assert_eq!(failed, [("mlx5_1", Layer::Port)], "{layers:#?}");
        let status = crate::Status::of(&layers, 0, &[]);
        assert_eq!((status, status.exit_code()), (crate::Status::LayerFailed, 1));
    }

    #[test]
    fn advice_names_real_devices_and_soft_links_only_for_soft_devices() {
        let report: crate::Report = serde_json::from_str(include_str!("../testdata/node-a.json")).unwrap();
        let mut facts = report.baseline;
        facts.modules.insert("rdma_rxe".into(), crate::report::ModuleInfo { state: "Live".into(), version: None });
        let (seen, want) = (Observations::default(), Expectations::default());
        let links = |r: &LayerReport| r.fix.iter().filter(|f| f.contains("rdma link add")).cloned().collect::<Vec<_>>();

        let r = device_missing(NO_DEVICE, &seen, &facts, &want);
        assert!(r.fix.iter().all(|f| !f.contains(NO_DEVICE)), "{r:#?}");
        assert_eq!(
            links(&r),
            ["rdma link add rxe0 type rxe netdev <netdev>   # SoftRoCE; rxe0: a name of your choice"]
        );
        assert_eq!(r.command.as_deref(), Some("rdma link add rxe0 type rxe netdev <netdev>"));
        let r = device_missing("mlx5_1", &seen, &facts, &want);
        assert!(links(&r).is_empty(), "mlx5_1 is no rxe link: {r:#?}");
        let r = device_missing("rxe1", &seen, &facts, &want);
        assert_eq!(links(&r), ["rdma link add rxe1 type rxe netdev <netdev>   # soft devices are links on a netdev"]);
        let r = crate::modules_layer::check(
            &Baseline { devices: BTreeMap::new(), ..facts.clone() },
            &seen,
            &KernelRdma { has: Some(true), config: None },
        );
        assert!(r.fix.iter().all(|f| !f.contains("IFACE")), "{r:#?}");
    }

    #[test]
    fn a_carrier_loss_on_an_interface_that_is_up_is_the_cable_not_ip_link_set_up() {
        let f = first_failure(|b, _| {
            let p = port(b);
            p.state = "DOWN".into();
            p.phys_state = "Polling".into();
            let nd = p.netdev.as_mut().unwrap();
            (nd.admin_up, nd.operstate) = (true, "down".into());
        })
        .unwrap();
        assert_eq!(f.layer, Layer::Port);
        assert!(f.fix.iter().all(|x| !x.contains("ip link set")), "{f:#?}");
        assert!(f.fix[0].contains("administratively up but has no link") && f.fix[0].contains("cable"), "{f:#?}");
    }

    #[test]
    fn fixes_name_the_netdev_and_the_gid_index_the_report_knows() {
        let report: crate::Report = serde_json::from_str(include_str!("../testdata/node-a.json")).unwrap();
        let p = &report.baseline.devices["mlx5_0"].ports["1"];
        let ping = pingpong("mlx5_0", 1, Some(p));
        assert!(ping.starts_with("ibv_rc_pingpong -d mlx5_0 -i 1 -g ") && !ping.contains("GID_INDEX"), "{ping}");
        let broken = LoopbackReport {
            ops: vec![crate::loopback::OpResult { op: "RDMA_WRITE".into(), ok: false, detail: "timeout".into() }],
            ..LoopbackReport::default()
        };
        for (layer, run) in [
            (Layer::DataPlane, &broken),
            (
                Layer::ControlPlane,
                &LoopbackReport { setup_error: Some("ibv_create_qp failed".into()), ..LoopbackReport::default() },
            ),
        ] {
            let r = planes(layer, "mlx5_0", 1, run, &ping);
            assert!(r.fix.iter().all(|f| !f.contains("GID_INDEX")), "{r:#?}");
            assert!(r.fix.iter().any(|f| f.contains(&ping)), "{r:#?}");
            assert!(r.command_is_check, "a reproduction or the log is a check: {r:#?}");
        }
        let mut slow = p.clone();
        slow.phys_state = "Polling".into();
        let one = "1".to_owned();
        let r = link("mlx5_0", &[(&one, &slow)], &|_| None);
        assert!(r.fix.iter().all(|f| !f.contains("NETDEV") && !f.contains("<PCI address>")), "{r:#?}");
        assert!(r.fix[0].ends_with("ethtool ens1f0np0"), "{r:#?}");
        assert!(r.command_is_check, "{r:#?}");
    }

    #[test]
    fn eagain_creating_the_loopback_objects_points_at_the_rdma_cgroup() {
        let run = LoopbackReport {
            setup_error: Some(
                "ibv_alloc_pd failed (control plane: libibverbs -> kernel driver): Resource temporarily unavailable (os error 11)".into(),
            ),
            ..LoopbackReport::default()
        };
        let r = planes(Layer::ControlPlane, "mlx5_0", 1, &run, "");
        assert_eq!(r.outcome, Outcome::Fail);
        assert!(r.fix[0].starts_with("EAGAIN") && r.fix[0].contains("rdma.max"), "{r:#?}");
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human(64 << 10), "64 KiB");
        assert_eq!(human(8 << 20), "8 MiB");
        assert_eq!(human(1000), "1000 B");
    }
}
