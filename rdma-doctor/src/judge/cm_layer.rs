//! The rdma_cm layer, after the data plane: the verbs loopback passed, so a failure here
//! is the connection manager's own path (rdma_ucm, its device node, address and route
//! resolution, the CM handshake), which verbs programs never touch and most
//! applications (MPI, NCCL, NVMe-oF, SMB Direct, anything over librdmacm) connect by.
//! The node is checked first, so that a hidden or closed node is named with its fix
//! instead of librdmacm's errno. rdma_ucm not loaded is no fault: librdmacm has the kernel
//! load it on first use (a freshly booted node has it only once a program connected), so
//! the check runs, and fails only when that first use does not bring it.

use std::net::Ipv4Addr;

use crate::facts::rdma_cm::{CmNode, CmReport, NODE};
use crate::model::layer::{Layer, LayerReport};
use crate::model::report::{Baseline, PortFacts};

const LAYER: Layer = Layer::RdmaCm;

/// Where the exchange runs: a port's IPv4 address and where it comes from.
pub(crate) struct Address<'a> {
    /// The port's number.
    pub port: &'a str,
    /// The address.
    pub ip: Ipv4Addr,
    /// Where it comes from, for the evidence (`its RoCE v2 GID`).
    pub what: String,
}

/// The address of the first of `ports` with an IPv4 RoCE v2 GID.
pub(crate) fn roce_address<'a>(ports: &[(&'a String, &PortFacts)]) -> Option<Address<'a>> {
    ports.iter().find_map(|(n, p)| ipv4(p).map(|ip| Address { port: n.as_str(), ip, what: "its RoCE v2 GID".into() }))
}

/// The rdma_cm layer of device `name`: its node, then `run` on `address` (a RoCE port's
/// IPv4 RoCE v2 GID, [`roce_address`], or an iWARP port's netdev's address).
pub(crate) fn check(
    name: &str,
    address: Option<Address<'_>>,
    facts: &Baseline,
    node: &CmNode,
    run: &mut dyn FnMut(Ipv4Addr) -> CmReport,
) -> LayerReport {
    if let Some(broken) = node_problem(name, facts, node) {
        return broken;
    }
    // Not loaded yet: the exchange below is librdmacm's first use, which loads it.
    let on_demand = node.kernel_dev.is_none();
    let Some(Address { port, ip, what }) = address else {
        return LayerReport::skipped(
            name,
            LAYER,
            "not run: no port with an IPv4 RoCE v2 GID (on InfiniBand the IPoIB address is not looked up)",
        );
    };
    let r = run(ip);
    let mut evidence = vec![format!("port {port}: IPv4 {ip} ({what})")];
    if on_demand {
        evidence.push(UNLOADED.to_owned());
    }
    evidence.extend(r.address.iter().map(|a| format!("listened on {a}")));
    evidence.push(format!("took {} ms", r.elapsed_ms));
    match (&r.error, &r.verified) {
        (None, Some(v)) => LayerReport::pass(name, LAYER, format!("listened on {ip}, connected and {v}"), evidence),
        (e, _) if on_demand => {
            let error = e.as_deref().unwrap_or("nothing verified");
            LayerReport::fail(
                name,
                LAYER,
                format!("rdma_ucm is not loaded and librdmacm's first use did not load it: {error}"),
                evidence,
                vec![
                    "modprobe rdma_ucm".into(),
                    "if modprobe cannot find it: the kernel lacks CONFIG_INFINIBAND_USER_ACCESS or its modules are not installed".into(),
                ],
            )
            .with_command("modprobe rdma_ucm")
        }
        (e, _) => failed_run(name, ip, e.as_deref().unwrap_or("nothing verified"), evidence),
    }
}

/// The evidence line of a check that started with rdma_ucm not loaded.
const UNLOADED: &str =
    "rdma_ucm was not loaded before this check: librdmacm has the kernel load it on first use (not a fault)";

/// The IPv4 address of a port's RoCE v2 GID (`::ffff:10.0.0.1`).
fn ipv4(p: &PortFacts) -> Option<Ipv4Addr> {
    p.gids
        .values()
        .filter(|g| g.gid_type == "RoCE v2")
        .find_map(|g| g.gid.strip_prefix("::ffff:").and_then(|a| a.parse().ok()))
}

/// The node missing, hidden or closed to this user while rdma_ucm is loaded (not loaded
/// is no problem: see the module docs).
fn node_problem(name: &str, facts: &Baseline, node: &CmNode) -> Option<LayerReport> {
    let evidence = vec![
        format!("rdma_ucm: {}", facts.modules.get("rdma_ucm").map_or("not loaded", |m| m.state.as_str())),
        format!("/sys/class/misc/rdma_cm/dev: {}", node.kernel_dev.as_deref().unwrap_or("absent")),
        format!(
            "{NODE}: {}{}",
            match (&node.node_dev, node.exists) {
                (Some(d), _) => format!("character device {d}"),
                (None, true) => "not a character device".to_owned(),
                (None, false) => "missing".to_owned(),
            },
            if node.mounted_over { ", a mount point" } else { "" }
        ),
    ];
    let fail = |summary: String, command: String, more: &[&str]| {
        let mut fix = vec![command.clone()];
        fix.extend(more.iter().map(|s| s.to_string()));
        Some(LayerReport::fail(name, LAYER, summary, evidence.clone(), fix).with_command(command))
    };
    let dev = node.kernel_dev.as_ref()?;
    let (major, minor) = dev.split_once(':').unwrap_or((dev, "0"));
    let mknod = format!("mknod -m 0666 {NODE} c {major} {minor}");
    if !node.exists {
        return fail(
            format!("rdma_ucm is loaded but {NODE} is missing"),
            mknod,
            &["in a container, pass it in: --device /dev/infiniband/rdma_cm"],
        );
    }
    if node.node_dev.as_ref() != Some(dev) {
        let what = node.node_dev.as_deref().map_or("not a character device".to_owned(), |d| format!("device {d}"));
        let summary = format!("{NODE} is not rdma_ucm's device ({dev}): it is {what}");
        return match node.mounted_over {
            true => fail(summary + ", mounted over it", format!("umount {NODE}"), &[]),
            false => fail(summary, format!("rm -f {NODE} && {mknod}"), &[]),
        };
    }
    let closed = facts.dev_nodes.get(NODE).filter(|n| !n.can_open)?;
    fail(
        format!("{NODE} exists but this user cannot open it ({})", closed.error.as_deref().unwrap_or("open failed")),
        format!("chmod 0666 {NODE}"),
        &["rdma-core's udev rule makes it 0666: /usr/lib/udev/rules.d/90-rdma-ucm.rules"],
    )
}

/// The exchange failed after the node looked right.
fn failed_run(name: &str, ip: Ipv4Addr, error: &str, evidence: Vec<String>) -> LayerReport {
    let resolving = ["rdma_resolve_addr", "rdma_resolve_route", "rdma_bind_addr"].iter().any(|s| error.contains(s));
    let command = if resolving {
        format!("ip route get {ip}")
    } else {
        format!("rping -s -a {ip} -C 1 -v & sleep 1; rping -c -a {ip} -C 1 -v")
    };
    let fix = vec![
        command.clone(),
        "the kernel's view of the connection: dmesg | grep -iE 'rdma_cm|ib_cm|rxe|mlx5'".to_owned(),
    ];
    LayerReport::fail(
        name,
        LAYER,
        format!("verbs work, but an rdma_cm connection on {ip} failed: {error}"),
        evidence,
        fix,
    )
    .with_command(command)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layer::Outcome;

    const CM_DEV: &str = "10:58";

    fn node_a() -> (Baseline, PortFacts) {
        let report: crate::model::report::Report =
            serde_json::from_str(include_str!("../../testdata/node-a.json")).unwrap();
        let port = report.baseline.devices["mlx5_0"].ports["1"].clone();
        (report.baseline, port)
    }

    fn healthy() -> CmNode {
        CmNode { kernel_dev: Some(CM_DEV.into()), exists: true, node_dev: Some(CM_DEV.into()), mounted_over: false }
    }

    fn layer(node: &CmNode, run: &mut dyn FnMut(Ipv4Addr) -> CmReport) -> LayerReport {
        let (facts, port) = node_a();
        let one = "1".to_owned();
        check("mlx5_0", roce_address(&[(&one, &port)]), &facts, node, run)
    }

    fn not_run(_: Ipv4Addr) -> CmReport {
        unreachable!("the node is broken: nothing runs")
    }

    #[test]
    fn rdma_ucm_not_loaded_yet_is_no_fault_when_the_first_use_connects() {
        // A freshly booted node: rdma_ucm not loaded, no node; librdmacm loads it.
        let gone = CmNode { kernel_dev: None, exists: false, node_dev: None, mounted_over: false };
        let mut ok = |_| CmReport { verified: Some("a 32-byte message received".into()), ..CmReport::default() };
        let r = layer(&gone, &mut ok);
        assert_eq!((r.layer, r.outcome), (Layer::RdmaCm, Outcome::Pass), "{r:#?}");
        assert!(r.evidence.iter().any(|e| e.starts_with("rdma_ucm was not loaded before this check")), "{r:#?}");
        // The first use did not bring it: then modprobe is the fix.
        let mut refused = |_| CmReport {
            error: Some("opening /dev/infiniband/rdma_cm (rdma_create_event_channel): No such device".into()),
            ..CmReport::default()
        };
        let r = layer(&gone, &mut refused);
        assert_eq!(r.outcome, Outcome::Fail, "{r:#?}");
        assert!(r.summary.starts_with("rdma_ucm is not loaded and librdmacm's first use did not load it"), "{r:#?}");
        assert_eq!(r.command.as_deref(), Some("modprobe rdma_ucm"));
    }

    #[test]
    fn a_hidden_or_missing_node_fails_with_the_command_that_fixes_it() {
        let hidden = CmNode { node_dev: Some("1:3".into()), mounted_over: true, ..healthy() };
        let r = layer(&hidden, &mut not_run);
        assert!(r.summary.contains("is not rdma_ucm's device (10:58): it is device 1:3"), "{r:#?}");
        assert_eq!(r.command.as_deref(), Some("umount /dev/infiniband/rdma_cm"));

        let missing = CmNode { exists: false, node_dev: None, ..healthy() };
        let r = layer(&missing, &mut not_run);
        assert_eq!(r.command.as_deref(), Some("mknod -m 0666 /dev/infiniband/rdma_cm c 10 58"));
    }

    #[test]
    fn the_exchange_runs_on_the_gid_address_and_its_failure_names_the_step() {
        let mut asked = Vec::new();
        let mut ok = |ip: Ipv4Addr| {
            asked.push(ip);
            CmReport { verified: Some("a 32-byte message received".into()), ..CmReport::default() }
        };
        let r = layer(&healthy(), &mut ok);
        assert_eq!(r.outcome, Outcome::Pass, "{r:#?}");
        let (_, port) = node_a();
        assert_eq!(asked, [ipv4(&port).unwrap()], "the IPv4 of the RoCE v2 GID");

        let mut refused = |_| CmReport { error: Some("rdma_resolve_addr: ENODEV".into()), ..CmReport::default() };
        let r = layer(&healthy(), &mut refused);
        assert_eq!(r.outcome, Outcome::Fail);
        assert!(r.summary.contains("rdma_resolve_addr: ENODEV"), "{r:#?}");
        assert!(r.command.as_deref().is_some_and(|c| c.starts_with("ip route get ")), "{r:#?}");
    }
}
