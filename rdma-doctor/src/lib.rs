//! rdma-doctor: a layered diagnosis of the RDMA software stack and a version baseline
//! for every node.
//!
//! [`diagnose`] collects, for the chosen devices, what an operator gathers by hand with
//! `ibv_devinfo -v`, `rdma link`, `lsmod`, `modinfo` and `dmesg`: the kernel release,
//! the libibverbs / librdmacm / rdma-core versions (each with the place it was read),
//! the provider library in use, the kernel driver and its version, firmware, hardware
//! and vendor ids, node GUID; per port the state, physical state, MTU, speed, width and
//! rate, link layer, netdev and GID table; the RDMA kernel modules, the
//! `/dev/infiniband` nodes and whether this user can open them, the memlock limit, and
//! the RDMA lines of the kernel log where it is readable.
//!
//! Then it checks the stack top down ([`Layer`]) and stops at the first layer
//! that fails, naming the evidence and the usual fix (or, where the doctor cannot know the
//! fix, the command that shows the problem: a check), down to a loopback RC test of the
//! data plane ([`facts::loopback`]) and an rdma_cm connection passing a message ([`facts::rdma_cm`]). A
//! failed link does not stop it: a slow or degraded port still says whether it works.
//! Each port's rate is judged by one rule per kind of device, named in the verdict
//! ([`judge::rates`]: rxe by the kernel's mapping of its netdev's speed, a bond by the sum of its
//! legs, hardware by the modes it supports). A kernel built without `CONFIG_INFINIBAND` is
//! told from one whose modules are missing; rdma_ucm not loaded yet is no fault (librdmacm
//! loads it on first use). Known-bad firmware and driver combinations ([`judge::known_bad`])
//! become warnings that cite their source; a saved report
//! ([`Options::compare`]) turns into a list of drifted fields ([`judge::compare`]).
//! Each port's counters and hw_counters are read before and after the probes
//! ([`facts::counters`]): those that moved are named by what they are evidence of (a lossy path,
//! a receiver not ready, timeouts, link downs, congestion, discards), and the whole
//! diagnosis exports as Prometheus metrics ([`modes::metrics`]). With `--serve` on every node,
//! [`modes::fleet`] gathers their reports into one version table, marks what differs, and has
//! the nodes probe the paths between them. `--watch` follows the devices over time
//! ([`modes::watch`]): async events, link state and rate changes, counter rates.
//!
//! It never changes the system: no module is loaded by the doctor, no link touched, no
//! firmware written (its rdma_cm check is a librdmacm program like any other: on a node
//! where rdma_ucm is not loaded yet, the kernel loads it for that first use). Fixes are
//! printed as advice. The JSON form is documented and versioned in
//! `docs/doctor-json.md`; every file the doctor reads is read with a size limit and
//! parsed strictly ([`model::input`]), and the known-bad list and the link checks run over
//! every report it reads ([`judge::saved`]). The `rdma-doctor` command is [`modes::cli`]
//! (`cargo install --path rdma-doctor`).
//!
//! ```no_run
//! let report = rdma_doctor::diagnose(&rdma_doctor::Options::default()).unwrap();
//! print!("{}", rdma_doctor::render(&report));
//! std::process::exit(report.exit_code);
//! ```

#![warn(missing_docs)]

// The house, bottom up; each layer uses only those below it (scripts/layers checks it,
// docs/architecture.md draws it):
//   model      the report's vocabulary: its types, the layers and their outcomes, counters,
//              and the bounded, strict reading of every file the doctor is given;
//   facts      what is read from the node (sysfs, the kernel log, libraries, ethtool) and
//              the probes that measure it (the loopback and rdma_cm checks);
//   judge      the judgments: one module per layer, the known-bad list, rates, drift;
//   diagnosis  facts, then judgments, for one node: [`diagnose`];
//   modes      what the command does with it: the CLI, text, metrics, serve and peer,
//              fleet, watch, the Slurm health check.
mod diagnosis;
pub mod facts;
pub mod judge;
pub mod model;
pub mod modes;

pub use diagnosis::{diagnose, Options};
pub use facts::loopback::LoopbackReport;
pub use judge::compare::{compare_nodes, drift, NodeDifference};
pub use judge::memlock_layer::check_memlock;
pub use model::layer::{Layer, LayerReport, Outcome};
pub use model::report::{Report, Status, EXIT_USAGE, FORMAT_VERSION};
pub use modes::text::render;
