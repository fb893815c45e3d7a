//! The report: what was collected, what the layers say, and how it compares. Its JSON
//! form is documented in `docs/doctor-json.md`; [`FORMAT_VERSION`] changes whenever a
//! field appears, changes meaning or goes away. Reading is strict: a field of the wrong
//! type, a missing one or an unknown one refuses the whole report (`input`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::layer::LayerReport;

/// The value of the `format` field.
pub const FORMAT: &str = "rdma-doctor";
/// The version of the JSON format this crate writes; it reads this one and every older
/// one (version 2 added the `rdma_cm` layer and `layers[].command`; version 3
/// `layers[].command_is_check`; version 4 `observations.counters`,
/// `observations.counter_changes` and `observations.link_references`; version 6 the
/// `libraries` layer).
pub const FORMAT_VERSION: u32 = 6;

/// Everything one run found on one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`FORMAT_VERSION`] of the writer.
    pub format_version: u32,
    /// The program and library that wrote it, e.g. `rdma-verbs 0.1.0`.
    pub tool: String,
    /// Who ran it where and when: never compared.
    pub host: HostInfo,
    /// The facts that make a node's baseline: `--compare` diffs this section.
    pub baseline: Baseline,
    /// Facts that change from run to run (the kernel log): never compared.
    pub observations: Observations,
    /// The layered verdict, top down: the first `fail` is the diagnosis.
    pub layers: Vec<LayerReport>,
    /// Warnings (known-bad combinations, probe errors) and notes, with their sources.
    pub findings: Vec<Finding>,
    /// Fields that differ from the baseline given with `--compare` (empty without one).
    pub drift: Vec<Drift>,
    /// The overall result; `exit_code` is its number.
    pub status: Status,
    /// The exit status of `doctor` for this report (see [`Status::exit_code`]).
    pub exit_code: i32,
}

/// Where and when the report was made.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostInfo {
    /// The node's host name.
    pub hostname: String,
    /// Seconds since the Unix epoch.
    pub time_unix: u64,
    /// The effective user id the doctor ran as (device access and memlock depend on it).
    pub euid: u32,
}

/// A version number and where it was read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionFact {
    /// The version, `None` when no source gave one.
    pub version: Option<String>,
    /// Where the number came from (a file, a package database, a loaded library).
    pub source: String,
}

/// The versioned facts of a node: what `--compare` and `--compare-nodes` look at.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Baseline {
    /// The running kernel.
    pub kernel: KernelInfo,
    /// User-space libraries: `libibverbs`, `librdmacm`, `rdma-core` (the release).
    pub libraries: BTreeMap<String, VersionFact>,
    /// RDMA packages in the package database (dpkg or rpm), name to version.
    pub packages: Packages,
    /// RDMA kernel modules, by name.
    pub modules: BTreeMap<String, ModuleInfo>,
    /// Nodes under `/dev/infiniband`, by path.
    pub dev_nodes: BTreeMap<String, DevNode>,
    /// The locked-memory limit of this process.
    pub memlock: Memlock,
    /// The devices examined, by name.
    pub devices: BTreeMap<String, DeviceFacts>,
}

/// The running kernel (`uname`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelInfo {
    /// `uname -r`.
    pub release: String,
    /// `uname -v` (build string).
    pub version: String,
    /// `uname -m`.
    pub machine: String,
}

/// RDMA packages as the package manager records them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Packages {
    /// `dpkg`, `rpm`, or `None` when no database was readable.
    pub manager: Option<String>,
    /// Package name to version.
    pub versions: BTreeMap<String, String>,
}

/// One kernel module.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleInfo {
    /// `Live`, `Loading`, `Unloading` (from /proc/modules), or `builtin`.
    pub state: String,
    /// `/sys/module/NAME/version` where the module declares one (out-of-tree drivers such
    /// as MLNX_OFED's do; in-tree modules go with the kernel release).
    pub version: Option<String>,
}

/// One node under `/dev/infiniband`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevNode {
    /// Permission bits, octal, e.g. `0666`.
    pub mode: String,
    /// Whether this process could open it for reading and writing.
    pub can_open: bool,
    /// Why it could not, when it could not.
    pub error: Option<String>,
}

/// `RLIMIT_MEMLOCK` and the capability that lifts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Memlock {
    /// Soft limit in bytes; `None` is unlimited.
    pub soft_bytes: Option<u64>,
    /// Hard limit in bytes; `None` is unlimited.
    pub hard_bytes: Option<u64>,
    /// CAP_IPC_LOCK is in the effective set: registration ignores the limit.
    pub cap_ipc_lock: bool,
}

/// One RDMA device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceFacts {
    /// The kernel driver bound to it (e.g. `mlx5_core`, `rdma_rxe`).
    pub kernel_driver: VersionFact,
    /// The driver's name, when known (the version is in `kernel_driver`).
    pub kernel_driver_name: Option<String>,
    /// The user-space provider library libibverbs dispatches to, e.g. `librxe-rdmav34.so`.
    pub provider: Option<ProviderFacts>,
    /// Firmware version (`ibv_devinfo`'s fw_ver; empty for soft devices).
    pub fw_ver: String,
    /// Hardware revision.
    pub hw_ver: Option<u32>,
    /// IEEE vendor id (`0x02c9` Mellanox/NVIDIA), as hex.
    pub vendor_id: Option<String>,
    /// Vendor part id (the PCI device id, e.g. 4125 for ConnectX-6 Dx).
    pub vendor_part_id: Option<u32>,
    /// `hca_type` from sysfs (e.g. `MT4125`), where the driver provides it.
    pub hca_type: Option<String>,
    /// `board_id` from sysfs (the card's PSID on NVIDIA cards).
    pub board_id: Option<String>,
    /// Node GUID, as `xxxx:xxxx:xxxx:xxxx`.
    pub node_guid: String,
    /// System image GUID.
    pub sys_image_guid: String,
    /// `CA`, `RNIC`, ... from sysfs `node_type`.
    pub node_type: String,
    /// The uverbs character device name (`uverbs0`).
    pub uverbs: Option<String>,
    /// For soft devices (rxe, siw): the netdev they sit on (sysfs `parent`).
    pub parent_netdev: Option<String>,
    /// Why libibverbs could not open it, when it could not.
    pub open_error: Option<String>,
    /// Ports by number.
    pub ports: BTreeMap<String, PortFacts>,
}

/// The provider library in use for a device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderFacts {
    /// Provider name (`rxe`, `mlx5`).
    pub name: String,
    /// The library file the device's verbs run in (resolved symlinks).
    pub library: String,
    /// The version in the file name, where there is one (`1.24.44.0`).
    pub version: Option<String>,
}

/// One port.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortFacts {
    /// `ACTIVE`, `DOWN`, `INIT`, ...
    pub state: String,
    /// `LinkUp`, `Disabled`, `Polling`, ...
    pub phys_state: String,
    /// `Ethernet` or `InfiniBand`.
    pub link_layer: String,
    /// Active MTU in bytes.
    pub active_mtu: u32,
    /// Largest MTU in bytes.
    pub max_mtu: u32,
    /// Link width, e.g. `4X`.
    pub width: String,
    /// Lane speed, e.g. `EDR` (25 Gb/s a lane).
    pub speed: String,
    /// Width times lane speed, Gb/s.
    pub rate_gbps: f64,
    /// LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The netdev under a RoCE or iWARP port.
    pub netdev: Option<NetdevFacts>,
    /// The GID table by index, empty slots left out.
    pub gids: BTreeMap<String, GidFacts>,
}

/// A network interface under a port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetdevFacts {
    /// Interface name.
    pub name: String,
    /// `/sys/class/net/NAME/operstate` (`up`, `down`, `unknown` for dummy devices).
    pub operstate: String,
    /// Interface MTU.
    pub mtu: Option<u32>,
    /// Whether the interface is administratively up (IFF_UP in `flags`).
    pub admin_up: bool,
}

/// One GID table entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GidFacts {
    /// The GID, as `ibv_devinfo` prints it (`::ffff:10.0.0.1`, `fe80::...`).
    pub gid: String,
    /// `IB`, `RoCE v1` or `RoCE v2`.
    #[serde(rename = "type")]
    pub gid_type: String,
    /// The netdev the GID belongs to.
    pub netdev: Option<String>,
}

/// What changes between runs and is never compared.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Observations {
    /// The kernel log, as far as it could be read.
    pub kernel_log: KernelLog,
    /// Device names libibverbs lists (`ibv_get_device_list`).
    pub verbs_devices: Vec<String>,
    /// Device names the kernel lists (`/sys/class/infiniband`).
    pub sysfs_devices: Vec<String>,
    /// Each examined device's counters and hw_counters after the probes, with their files
    /// (since version 4; empty in older reports).
    #[serde(default)]
    pub counters: BTreeMap<String, crate::model::counters::DeviceCounters>,
    /// The counters that moved while the doctor's probes ran (since version 4).
    #[serde(default)]
    pub counter_changes: Vec<crate::model::counters::CounterChange>,
    /// The rate each port's link was judged against, by device and port (since version 4;
    /// a port with no reference is absent).
    #[serde(default)]
    pub link_references: BTreeMap<String, BTreeMap<String, LinkReference>>,
}

/// The rate a port's link is judged against, and where it came from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkReference {
    /// Gb/s.
    pub gbps: f64,
    /// The rule or input it came from (`--expect-rate`, the saved baseline, rxe's rule).
    pub from: String,
}

/// The RDMA lines of the kernel log.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelLog {
    /// Whether `/dev/kmsg` could be read (it needs CAP_SYSLOG where dmesg_restrict is set).
    pub readable: bool,
    /// Why not, when it could not be read: not a failure.
    pub error: Option<String>,
    /// The most recent lines that mention RDMA drivers, oldest first.
    pub lines: Vec<String>,
    /// Lines that report a driver error with an errno (`probe ... failed with error -16`).
    pub errors: Vec<LogError>,
}

/// A kernel log line reporting an errno.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogError {
    /// The line.
    pub line: String,
    /// The errno, positive (16).
    pub errno: i32,
    /// Its name and the usual meaning for a driver (`EBUSY: ...`).
    pub meaning: String,
}

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth knowing; does not change the exit status.
    Note,
    /// A known problem; the exit status says so when no layer failed and nothing drifted.
    Warning,
}

/// A warning or a note.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Finding {
    /// Warning or note.
    pub severity: Severity,
    /// `host` or a device name.
    pub scope: String,
    /// What was found.
    pub what: String,
    /// What to do about it (advice only: the doctor changes nothing).
    pub advice: Option<String>,
    /// Where the knowledge comes from (a release note, a data file entry).
    pub source: Option<String>,
    /// The layer it concerns (`device` for a known-bad firmware or driver, `provider` for
    /// libibverbs' own warnings, `link` for a failed link a saved baseline records), or
    /// `None` (notes). Absent from reports of format version 1.
    #[serde(default)]
    pub layer: Option<crate::model::layer::Layer>,
}

/// One field that differs from a saved baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drift {
    /// The field's path in the `baseline` section, e.g. `devices.mlx5_0.fw_ver`.
    pub field: String,
    /// Its value in the saved baseline (`None`: the field is new).
    pub expected: Option<serde_json::Value>,
    /// Its value now (`None`: the field is gone).
    pub found: Option<serde_json::Value>,
}

/// The overall result, most serious first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Every layer passed, nothing drifted, no warning.
    Healthy,
    /// A layer failed: see the first `fail` in `layers`.
    LayerFailed,
    /// Every layer passed, but fields drifted from the baseline (or one node differs from
    /// the others).
    Drift,
    /// Every layer passed and nothing drifted, but a warning was raised.
    Warnings,
}

/// Exit status for a command-line error (bad flag, unreadable or invalid input file).
pub const EXIT_USAGE: i32 = 2;

impl Status {
    /// The doctor's exit status: 0 healthy, 1 a layer failed, 3 drift, 4 warnings only
    /// (2 is a usage error, [`EXIT_USAGE`]).
    pub fn exit_code(self) -> i32 {
        match self {
            Status::Healthy => 0,
            Status::LayerFailed => 1,
            Status::Drift => 3,
            Status::Warnings => 4,
        }
    }
}

impl Report {
    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// Recomputes `status` and `exit_code` from the layers, drift and findings.
    pub fn settle_status(&mut self) {
        self.status = Status::of(&self.layers, self.drift.len(), &self.findings);
        self.exit_code = self.status.exit_code();
    }
}

impl Status {
    /// The most serious of: a layer failed, `differences` fields drifted, a warning.
    pub fn of(layers: &[LayerReport], differences: usize, findings: &[Finding]) -> Status {
        use crate::model::layer::Outcome;
        if layers.iter().any(|l| l.outcome == Outcome::Fail) {
            Status::LayerFailed
        } else if differences > 0 {
            Status::Drift
        } else if findings.iter().any(|f| f.severity == Severity::Warning) {
            Status::Warnings
        } else {
            Status::Healthy
        }
    }
}
