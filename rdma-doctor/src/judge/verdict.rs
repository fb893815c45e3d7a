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

use crate::judge::device_layer::device_missing;
use crate::judge::device_layer::device_nodes;
use crate::judge::gid_layer::gid;
use crate::judge::gid_layer::is_iwarp;
use crate::judge::gid_layer::iwarp_address;
use crate::judge::gid_layer::iwarp_ip;
use crate::judge::gid_layer::rping;
use crate::judge::gid_layer::NO_IWARP_ADDRESS;
use crate::judge::link_layer::link;
use crate::judge::memlock_layer::check_memlock;
use crate::judge::planes_layer::pingpong;
use crate::judge::planes_layer::planes;
use crate::judge::port_layer::port_state;
use crate::model::layer::KernelRdma;
use crate::model::layer::Layer;
use crate::model::layer::LayerReport;
use crate::model::layer::Outcome;
use crate::model::layer::RateRef;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use crate::facts::loopback::LoopbackReport;
use crate::facts::provider::ProviderProbe;
use crate::facts::rdma_cm::{CmNode, CmReport};
use crate::model::report::{Baseline, DeviceFacts, Observations, PortFacts};

/// The rdma cgroup limit and use of the shell's cgroup.
pub(crate) const CGROUP_RDMA: &str =
    "cat \"/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/rdma.max\" \"/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/rdma.current\"";

/// The scope of the device layers when no device was named and none was found.
pub(crate) const NO_DEVICE: &str = "(any device)";

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
    pub libraries: Vec<crate::facts::libraries::LibraryState>,
    /// The IPv4 addresses of each netdev, by name: where an iWARP port is reached (its
    /// connections go over TCP to them). Read live, not kept in the report's facts: an
    /// address is a node's own, and the gid layer's evidence names the one used.
    pub netdev_ipv4: BTreeMap<String, Vec<Ipv4Addr>>,
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
    let mut out = vec![crate::judge::modules_layer::check(facts, seen, &want.kernel_rdma)];
    let mut runs = BTreeMap::new();
    let host_ok = out[0].outcome == Outcome::Pass;
    if !want.libraries.is_empty() {
        out.push(crate::judge::libraries_layer::check(&want.libraries));
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
            if let Some(why) = crate::judge::libraries_layer::needs(&want.libraries, layer) {
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
                Outcome::Pass => crate::judge::provider_layer::kernel_refusal(name, d, facts, want.providers.get(name))
                    .unwrap_or(nodes),
                _ => nodes,
            }
        }
        Layer::Provider => crate::judge::provider_layer::check(name, d, facts, want.providers.get(name)),
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
                let on = crate::judge::cm_layer::Address {
                    port,
                    ip,
                    what: format!("{netdev}'s address: iWARP connects over TCP to it"),
                };
                crate::judge::cm_layer::check(name, Some(on), facts, &want.rdma_cm_node, probes.rdma_cm)
            }
        },
        Layer::RdmaCm => {
            let on = crate::judge::cm_layer::roce_address(&ports);
            crate::judge::cm_layer::check(name, on, facts, &want.rdma_cm_node, probes.rdma_cm)
        }
        Layer::KernelModules | Layer::Libraries => unreachable!("a host layer"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layer::human;
    use crate::model::layer::only_shows;
    use crate::model::report::Memlock;

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
        let report: crate::model::report::Report =
            serde_json::from_str(include_str!("../../testdata/node-a.json")).unwrap();
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
        let report: crate::model::report::Report =
            serde_json::from_str(include_str!("../../testdata/node-a.json")).unwrap();
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
            let op = crate::facts::loopback::OpResult {
                op: "RDMA_WRITE".into(),
                ok: true,
                detail: "1024 bytes verified".into(),
            };
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
        let report: crate::model::report::Report =
            serde_json::from_str(include_str!("../../testdata/node-a.json")).unwrap();
        let mut facts = report.baseline;
        facts.devices.get_mut("mlx5_0").unwrap().node_type = "RNIC".into();
        let p = port(&mut facts);
        p.gids.clear();
        p.gids.insert(
            "0".into(),
            crate::model::report::GidFacts { gid: "b8ce:f6ff:fe12:3456::".into(), gid_type: "IB".into(), netdev: None },
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
            let op =
                crate::facts::loopback::OpResult { op: "SEND".into(), ok: true, detail: "1024 bytes verified".into() };
            let skipped = crate::facts::loopback::OpResult {
                op: "FETCH_ADD".into(),
                ok: true,
                detail: format!("{}: no atomics", crate::facts::loopback::SKIPPED),
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
        let report: crate::model::report::Report =
            serde_json::from_str(include_str!("../../testdata/node-a.json")).unwrap();
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
        let report: crate::model::report::Report =
            serde_json::from_str(include_str!("../../testdata/node-a.json")).unwrap();
        let mut facts = report.baseline;
        facts
            .modules
            .insert("rdma_rxe".into(), crate::model::report::ModuleInfo { state: "Live".into(), version: None });
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
        let r = crate::judge::modules_layer::check(
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
        let report: crate::model::report::Report =
            serde_json::from_str(include_str!("../../testdata/node-a.json")).unwrap();
        let p = &report.baseline.devices["mlx5_0"].ports["1"];
        let ping = pingpong("mlx5_0", 1, Some(p));
        assert!(ping.starts_with("ibv_rc_pingpong -d mlx5_0 -i 1 -g ") && !ping.contains("GID_INDEX"), "{ping}");
        let broken = LoopbackReport {
            ops: vec![crate::facts::loopback::OpResult {
                op: "RDMA_WRITE".into(),
                ok: false,
                detail: "timeout".into(),
            }],
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
