//! The judgments: [`verdict`] walks the layers top down, one module per layer
//! (`*_layer`), over the facts; beside them the known-bad list ([`known_bad`]), the rate a
//! port should run at ([`rates`]), drift between reports ([`compare`]), the checks every
//! report read gets ([`saved`]), what moved counters are evidence of
//! ([`counter_findings`]), and the QP timeouts of the kernel log, said once per boot
//! ([`qp_timeouts`]).

pub mod cm_layer;
pub mod compare;
pub mod counter_findings;
pub mod device_layer;
pub mod gid_layer;
pub mod known_bad;
pub mod libraries_layer;
pub mod link_layer;
pub mod memlock_layer;
pub mod modules_layer;
pub mod planes_layer;
pub mod port_layer;
pub mod provider_layer;
pub mod qp_timeouts;
pub mod rates;
pub mod saved;
pub mod verdict;
