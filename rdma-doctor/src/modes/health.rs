//! `--health-check`: the doctor as Slurm's `HealthCheckProgram`. It diagnoses this node
//! (and, with `--peer HOST`, the path to a node running `--serve`), then acts on Slurm
//! through `scontrol`:
//!
//! - a failed layer (or a failed check of the path) drains the node with the reason
//!   `rdma-doctor: SCOPE LAYER: SUMMARY`, naming the layer and its cause;
//! - a healthy node that the doctor drained (its reason starts with `rdma-doctor:`) is
//!   resumed; a node drained for any other reason (by a person, or another health check)
//!   is never resumed, and its reason is never replaced.
//!
//! Drift and warnings do not drain: only what stops RDMA does. Slurm's node name is
//! `--slurm-node`, or this host's short name (Slurm's default `NodeName`). The exit
//! status is 0 when the node's state is what the verdict asks for (slurmd reruns a health
//! check that fails at its start before it registers, which would keep a broken node from
//! ever being drained); 1 when `scontrol` could not be run or refused.

use std::io::Write;
use std::process::Command;

/// The prefix of every reason the doctor gives: what it may resume.
pub const REASON_PREFIX: &str = "rdma-doctor: ";
/// Slurm keeps reasons short in its tables: longer ones are cut.
const REASON_MAX: usize = 200;

/// What the diagnosis says, for Slurm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing failed.
    Healthy,
    /// The first failure: `SCOPE LAYER: SUMMARY`.
    Failed(String),
}

/// The node's state as `scontrol show node NAME --oneliner` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeState {
    /// `State=` (`IDLE`, `IDLE+DRAIN`, `DOWN+DRAIN`, `MIXED+DRAIN`, ...).
    pub state: String,
    /// `Reason=` without Slurm's ` [user@time]` suffix; empty when there is none.
    pub reason: String,
}

impl NodeState {
    /// Reads the one-line form; `None` when it has no `State=`.
    pub fn parse(line: &str) -> Option<NodeState> {
        let state = line.split_whitespace().find_map(|w| w.strip_prefix("State="))?.to_owned();
        let reason = match line.split_once(" Reason=") {
            Some((_, rest)) => {
                // Slurm appends ` [user@2026-12-07T04:00:00]`; other fields may follow it.
                let end = rest.find(" [").unwrap_or(rest.len());
                rest[..end].trim().to_owned()
            }
            None => String::new(),
        };
        Some(NodeState { state, reason })
    }

    /// Drained or draining (`DRAIN` in any of the state's flags).
    pub fn drained(&self) -> bool {
        self.state.split('+').any(|f| f.starts_with("DRAIN"))
    }

    /// Drained, by the doctor.
    pub fn drained_by_us(&self) -> bool {
        self.drained() && self.reason.starts_with(REASON_PREFIX.trim_end())
    }
}

/// What to ask of Slurm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing: the state already fits (said why).
    Nothing(&'static str),
    /// `scontrol update NodeName=.. State=DRAIN Reason=..`.
    Drain(String),
    /// `scontrol update NodeName=.. State=RESUME`.
    Resume,
}

/// The action for a verdict on a node in `state`.
pub fn decide(verdict: &Verdict, state: &NodeState) -> Action {
    match verdict {
        Verdict::Failed(why) => {
            let reason = reason(why);
            if state.drained() && !state.drained_by_us() {
                Action::Nothing("drained already for another reason, which stays")
            } else if state.drained_by_us() && state.reason == reason {
                Action::Nothing("drained already by rdma-doctor for the same reason")
            } else {
                Action::Drain(reason)
            }
        }
        Verdict::Healthy if state.drained_by_us() => Action::Resume,
        Verdict::Healthy if state.drained() => Action::Nothing("healthy, but drained for another reason: not resumed"),
        Verdict::Healthy => Action::Nothing("healthy"),
    }
}

/// The reason string: the prefix, the failure, cut at a character boundary.
pub fn reason(why: &str) -> String {
    let mut r = format!("{REASON_PREFIX}{}", why.replace(['\n', '\r'], " "));
    if r.len() > REASON_MAX {
        let mut end = REASON_MAX;
        while !r.is_char_boundary(end) {
            end -= 1;
        }
        r.truncate(end);
    }
    r
}

/// The verdict of a diagnosis and, optionally, a probe of a path.
pub fn verdict(report: &crate::model::report::Report, path: Option<&crate::modes::peer::PeerReport>) -> Verdict {
    use crate::model::layer::Outcome;
    if let Some(l) = report.layers.iter().find(|l| l.outcome == Outcome::Fail) {
        return Verdict::Failed(format!("{} {}: {}", l.scope, l.layer.name(), l.summary));
    }
    if let Some(p) = path {
        if let Some(c) = p.checks.iter().find(|c| !c.ok) {
            return Verdict::Failed(format!("path to {} {}: {}", p.peer, c.layer, c.detail));
        }
        if p.checks.is_empty() {
            return Verdict::Failed(format!("path to {}: the probe made no check", p.peer));
        }
    }
    Verdict::Healthy
}

/// This host's short name: Slurm's default `NodeName`.
fn short_hostname() -> Result<String, String> {
    let full = std::fs::read_to_string("/proc/sys/kernel/hostname").map_err(|e| format!("this host's name: {e}"))?;
    let short = full.trim().split('.').next().unwrap_or_default().to_owned();
    if short.is_empty() {
        return Err("this host has no name: give --slurm-node".into());
    }
    Ok(short)
}

fn scontrol(args: &[&str]) -> Result<String, String> {
    let out = Command::new("scontrol")
        .args(args)
        .output()
        .map_err(|e| format!("running scontrol (Slurm's client; is slurm-client installed?): {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "scontrol {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            text.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(text)
}

/// Runs the health check: diagnose, decide, act, and say so in one line on `out`.
pub fn run(
    opts: &crate::diagnosis::Options,
    peer: Option<(&str, &crate::modes::peer::PeerOptions)>,
    node: Option<&str>,
    out: &mut dyn Write,
) -> Result<i32, String> {
    let report = crate::diagnosis::diagnose(opts)?;
    let path = peer.map(|(host, o)| crate::modes::peer::probe(host, o));
    let verdict = verdict(&report, path.as_ref());
    let node = match node {
        Some(n) => n.to_owned(),
        None => short_hostname()?,
    };
    let line = scontrol(&["show", "node", &node, "--oneliner"])?;
    let state = NodeState::parse(&line)
        .ok_or_else(|| format!("scontrol show node {node}: no State= in its answer: {}", line.trim()))?;
    let action = decide(&verdict, &state);
    let said = match &verdict {
        Verdict::Healthy => "healthy".to_owned(),
        Verdict::Failed(why) => format!("failed: {why}"),
    };
    let done = match &action {
        Action::Nothing(why) => format!("nothing to do ({why})"),
        Action::Drain(reason) => {
            scontrol(&["update", &format!("NodeName={node}"), "State=DRAIN", &format!("Reason={reason}")])?;
            format!("drained with the reason \"{reason}\"")
        }
        Action::Resume => {
            scontrol(&["update", &format!("NodeName={node}"), "State=RESUME"])?;
            format!("resumed (it had been drained by rdma-doctor: \"{}\")", state.reason)
        }
    };
    writeln!(out, "rdma-doctor --health-check: node {node} ({}): {said}; {done}", state.state)
        .map_err(|e| format!("writing: {e}"))?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(line: &str) -> NodeState {
        NodeState::parse(line).expect("a State=")
    }

    const IDLE: &str = "NodeName=node2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 State=IDLE ThreadsPerCore=1";

    #[test]
    fn the_state_and_the_reason_are_read_from_scontrols_one_line_form() {
        let s = state("NodeName=node2 Arch=x86_64 State=IDLE+DRAIN Partitions=bed Reason=rdma-doctor: rxe0 port: the port is DOWN [root@2026-12-07T04:30:00] Comment=(null)");
        assert_eq!(s.state, "IDLE+DRAIN");
        assert_eq!(s.reason, "rdma-doctor: rxe0 port: the port is DOWN");
        assert!(s.drained() && s.drained_by_us());
        let s = state(IDLE);
        assert_eq!((s.state.as_str(), s.reason.as_str()), ("IDLE", ""));
        assert!(!s.drained());
        assert!(NodeState::parse("Node node9 not found").is_none());
    }

    #[test]
    fn a_failure_drains_a_healthy_node_naming_the_layer_and_the_cause() {
        let v = Verdict::Failed("rxe0 link: the link is down".into());
        assert_eq!(decide(&v, &state(IDLE)), Action::Drain("rdma-doctor: rxe0 link: the link is down".into()));
        // Drained by us for another cause: the reason is brought up to date.
        let ours = state("NodeName=n State=IDLE+DRAIN Reason=rdma-doctor: rxe0 port: gone [root@t]");
        assert_eq!(decide(&v, &ours), Action::Drain("rdma-doctor: rxe0 link: the link is down".into()));
        let same = state("NodeName=n State=IDLE+DRAIN Reason=rdma-doctor: rxe0 link: the link is down [root@t]");
        assert!(matches!(decide(&v, &same), Action::Nothing(_)));
    }

    #[test]
    fn a_node_someone_else_drained_is_never_resumed_nor_its_reason_replaced() {
        let theirs = state("NodeName=n State=IDLE+DRAIN Reason=maintenance: new DIMM [alice@t]");
        assert!(matches!(decide(&Verdict::Healthy, &theirs), Action::Nothing(_)));
        assert!(matches!(decide(&Verdict::Failed("x".into()), &theirs), Action::Nothing(_)));
        // A reason that only mentions the doctor further in is not ours.
        let other = state("NodeName=n State=DOWN+DRAIN Reason=not rdma-doctor: but close [bob@t]");
        assert!(!other.drained_by_us());
        assert!(matches!(decide(&Verdict::Healthy, &other), Action::Nothing(_)));
    }

    #[test]
    fn a_healthy_node_the_doctor_drained_is_resumed_and_a_healthy_idle_one_left_alone() {
        let ours = state("NodeName=n State=IDLE+DRAIN Reason=rdma-doctor: rxe0 device: gone [root@t]");
        assert_eq!(decide(&Verdict::Healthy, &ours), Action::Resume);
        assert_eq!(decide(&Verdict::Healthy, &state(IDLE)), Action::Nothing("healthy"));
    }

    #[test]
    fn a_long_or_multiline_cause_makes_a_bounded_one_line_reason() {
        let r = reason(&format!("rxe0 link: {}\nmore", "é".repeat(300)));
        assert!(r.len() <= REASON_MAX && r.starts_with(REASON_PREFIX) && !r.contains('\n'), "{r}");
    }
}
