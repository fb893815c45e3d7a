//! What is read from the node, and the probes that measure it: the host and kernel
//! ([`collect`]), each device ([`device`]), the libraries' versions, the kernel log, the
//! netdevs' link modes and statistics, the counters, what libibverbs says about its
//! providers, and the loopback and rdma_cm checks. Facts judge nothing: [`crate::judge`]
//! does.

pub mod collect;
pub mod counters;
pub mod device;
pub mod ethtool;
pub mod ethtool_stats;
pub mod kmsg;
pub mod libraries;
pub mod loopback;
pub mod netdevs;
pub mod netstat;
pub mod provider;
pub mod rdma_cm;
pub mod said;
pub(crate) mod stderr;
pub mod versions;
