//! The control plane (creating and connecting objects: the kernel's path) and the data
//! plane (posting and completions: the provider's and the hardware's), judged from the
//! loopback check ([`crate::facts::loopback`]).

use crate::judge::verdict::CGROUP_RDMA;
use crate::model::layer::Layer;
use crate::model::layer::LayerReport;

use crate::facts::loopback::LoopbackReport;
use crate::model::report::PortFacts;

/// `ibv_rc_pingpong` server and client on `port` of `name` (with the IPv4 RoCE v2 GID's
/// index on Ethernet): a second opinion on the loopback.
pub(crate) fn pingpong(name: &str, port: u8, p: Option<&PortFacts>) -> String {
    let v4 = |g: &crate::model::report::GidFacts| g.gid_type == "RoCE v2" && g.gid.starts_with("::ffff:");
    let gid = p.and_then(|p| p.gids.iter().find(|(_, g)| v4(g))).map(|(i, _)| format!(" -g {i}")).unwrap_or_default();
    let one = format!("ibv_rc_pingpong -d {name} -i {port}{gid}");
    format!("{one} & sleep 1; {one} 127.0.0.1")
}

pub(crate) fn planes(layer: Layer, name: &str, port: u8, run: &LoopbackReport, ping: &str) -> LayerReport {
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
                if crate::facts::provider::os_error(e) == Some(libc::EAGAIN) {
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
        let skipped = |o: &&crate::facts::loopback::OpResult| o.detail.starts_with(crate::facts::loopback::SKIPPED);
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
