//! The layers of the RDMA stack the doctor checks, what each concluded ([`LayerReport`]:
//! pass, fail, warn or skipped, with the evidence and the fix or the check), and the
//! words every judgment shares (sizes as people write them, lists).

use serde::{Deserialize, Serialize};

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
