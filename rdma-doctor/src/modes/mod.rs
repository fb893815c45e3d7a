//! What the command does with a diagnosis: the command line ([`cli`]), the readable report
//! ([`text`]), metrics ([`metrics`]), `--serve` and `--peer` ([`peer`]) with its door
//! ([`gate`]) and fresh reports ([`fresh`]), `--fleet` ([`fleet`]), `--watch` ([`watch`])
//! and Slurm's health check ([`health`]).

pub mod cli;
pub mod fleet;
pub mod fresh;
pub mod gate;
pub mod health;
pub mod metrics;
pub mod peer;
pub mod text;
pub mod watch;
