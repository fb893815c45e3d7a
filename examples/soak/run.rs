//! The traffic loop and the end checks of both modes, over a mode's pairs as [`Side`]s.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdma_verbs::{QueuePair, WorkCompletion};

use super::lanes::{Counts, Initiator, Shared, Stats};
use super::{counts_text, mib, rss_kib, AnyError, Opts};

/// One pair of one side, as the loop and the end checks see it: what differs between
/// the one-host pair, the client's and the server's.
pub(super) trait Side {
    fn index(&self) -> usize;
    /// Takes the completions of the pair's queues; `running` false once its QP is in error.
    fn poll(&mut self, sh: &mut Shared, wcs: &mut [WorkCompletion], running: bool) -> Result<usize, AnyError>;
    /// The pair's two queues of this side, named for the end checks.
    fn queues(&self) -> [(&'static str, Counts); 2];
    /// What the pair counted.
    fn stats(&self) -> Stats;
    /// The QP whose posted receives only the error state completes.
    fn qp(&self) -> &QueuePair;
}

/// A side that drives lanes: the one-host pair and the client's.
pub(super) trait Lanes: Side {
    fn a(&mut self) -> &mut Initiator;
    fn busy(&self) -> bool;
    /// Starts an operation on every idle lane.
    fn start_idle(&mut self, sh: &mut Shared);
}

/// Room for one poll's completions.
pub(super) fn completions() -> Vec<WorkCompletion> {
    (0..16).map(|_| WorkCompletion::EMPTY).collect()
}

/// The times of a run.
pub(super) struct Limits {
    pub duration: Duration,
    pub warmup: Duration,
    /// An operation (or the drain) unfinished this long is a hang.
    pub stuck: Duration,
    pub report_every: Duration,
}

impl Limits {
    pub fn new(o: &Opts, duration: Duration) -> Limits {
        Limits {
            duration,
            warmup: Duration::from_secs(o.warmup_secs).min(duration / 2),
            stuck: Duration::from_secs(o.stuck_secs),
            report_every: Duration::from_secs(o.report_secs.max(1)),
        }
    }
}

/// How the traffic went.
pub(super) struct Traffic {
    pub traffic: Duration,
    pub rss_warm: u64,
    /// Measured with every buffer of the run still allocated: what the steady state holds.
    pub rss_final: u64,
    /// A pair had an error: the traffic stopped early.
    pub failed: bool,
}

/// Drives every lane for the run's duration, then drains: no new operations, every lane
/// finishes. Stops after the first error.
pub(super) fn drive<P: Lanes>(
    pairs: &mut [P],
    sh: &mut Shared,
    wcs: &mut [WorkCompletion],
    lim: &Limits,
) -> Result<Traffic, AnyError> {
    let started = Instant::now();
    pairs.iter_mut().for_each(|p| p.a().last_ok = started);
    let mut next_report = started + lim.report_every;
    let mut rss_warm = None;
    let mut failed = false;
    let mut draining_since: Option<Instant> = None;
    loop {
        let running = draining_since.is_none();
        let mut progressed = 0;
        for p in pairs.iter_mut() {
            progressed += step(p, sh, wcs, running, &mut failed, lim.stuck)?;
        }
        let now = Instant::now();
        if now >= next_report {
            eprintln!("{}", progress(started, &*pairs));
            next_report += lim.report_every;
        }
        if rss_warm.is_none() && now.duration_since(started) >= lim.warmup {
            rss_warm = Some(rss_kib());
            eprintln!("soak: warm-up over, RSS {} KiB", rss_warm.unwrap_or(0));
        }
        match draining_since {
            None if failed || now.duration_since(started) >= lim.duration => draining_since = Some(now),
            Some(since) => {
                if !pairs.iter().any(P::busy) {
                    break;
                }
                if now.duration_since(since) > lim.stuck {
                    eprintln!("soak: hung: the drain did not finish within {:?}", lim.stuck);
                    if let Some(p) = pairs.first_mut() {
                        p.a().stats.other_errors += 1;
                    }
                    break;
                }
            }
            None => {}
        }
        if progressed == 0 {
            // Nothing completed: give rxe's kernel threads the CPU for a moment.
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let traffic = started.elapsed();
    let rss_final = rss_kib();
    eprintln!("{}", progress(started, &*pairs));
    Ok(Traffic { traffic, rss_warm: rss_warm.unwrap_or(rss_final), rss_final, failed })
}

/// One pass over a pair: its completions, its finished and hung lanes, new operations.
fn step<P: Lanes>(
    p: &mut P,
    sh: &mut Shared,
    wcs: &mut [WorkCompletion],
    running: bool,
    failed: &mut bool,
    stuck: Duration,
) -> Result<usize, AnyError> {
    let n = p.poll(sh, wcs, true)?;
    p.a().retire(stuck);
    if p.stats().errors() > 0 && !*failed {
        *failed = true;
        eprintln!("soak: stopping after the first error");
    }
    if *failed {
        p.a().stop();
    }
    if running && !*failed {
        p.start_idle(sh);
    }
    Ok(n)
}

pub(super) fn progress<P: Side>(started: Instant, pairs: &[P]) -> String {
    let mut s = Stats::default();
    pairs.iter().for_each(|p| s.add(&p.stats()));
    format!(
        "soak: t={:.0}s ops={} (send {} write {} read {}) bytes={:.1}MiB errors={} rss={}KiB",
        started.elapsed().as_secs_f64(),
        s.ops.iter().sum::<u64>(),
        s.ops[0],
        s.ops[1],
        s.ops[2],
        mib(s.bytes),
        s.errors(),
        rss_kib()
    )
}

/// Moves every pair's QP to the error state, which completes its posted receives by
/// flushing them, and takes the completions left (for up to 30 s).
pub(super) fn flush<P: Side>(pairs: &mut [P], sh: &mut Shared, wcs: &mut [WorkCompletion]) -> Result<(), AnyError> {
    for p in pairs.iter() {
        p.qp().to_error()?;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while pairs.iter().any(|p| p.queues().iter().any(|(_, c)| c.completions < c.posts)) && Instant::now() < deadline {
        for p in pairs.iter_mut() {
            p.poll(sh, wcs, false)?;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// A side's totals at the end: its counts, and every queue's posts and completions.
pub(super) struct Tally {
    pub totals: Stats,
    pub posts: u64,
    pub completions: u64,
    /// Queues whose posts and completions differ.
    pub unbalanced: u64,
}

pub(super) fn tally<P: Side>(pairs: &[P]) -> Tally {
    let mut t = Tally { totals: Stats::default(), posts: 0, completions: 0, unbalanced: 0 };
    for p in pairs {
        t.totals.add(&p.stats());
        for (side, c) in p.queues() {
            t.posts += c.posts;
            t.completions += c.completions;
            if c.posts != c.completions {
                t.unbalanced += 1;
                eprintln!("soak: pair {} {side} queue: {} posts, {} completions", p.index(), c.posts, c.completions);
            }
        }
    }
    t
}

/// The checks of a side's own process: the device's resources back where they were, and
/// the RSS within the slack of what it was after the warm-up.
pub(super) fn own_checks(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    (rss_warm, rss_final): (u64, u64),
    slack_kib: u64,
) -> Vec<String> {
    let mut failures = Vec::new();
    if before != after {
        failures.push(format!("device resources {} before, {} after", counts_text(before), counts_text(after)));
    }
    let rss_grew = rss_final.saturating_sub(rss_warm);
    if rss_grew > slack_kib {
        failures.push(format!("RSS grew {rss_grew} KiB after the warm-up (bound {slack_kib} KiB)"));
    }
    failures
}

/// The summary's fields from `minutes=` to `(flushed at the end N)`, as both modes print them.
pub(super) fn traffic_fields(o: &Opts, seed: u64, traffic: Duration, t: &Tally) -> String {
    let s = &t.totals;
    let ops: u64 = s.ops.iter().sum();
    let secs = traffic.as_secs_f64();
    format!(
        "minutes={:.2} pairs={} depth={} seed={seed} ops={ops} (send {} write {} read {}) bytes={:.1}MiB \
         ({:.2} MiB/s, {:.0} ops/s) checksum_errors={} wc_errors={} other_errors={} posts={} completions={} \
         (flushed at the end {})",
        secs / 60.0,
        o.qps,
        o.depth,
        s.ops[0],
        s.ops[1],
        s.ops[2],
        mib(s.bytes),
        mib(s.bytes) / secs.max(1e-9),
        ops as f64 / secs.max(1e-9),
        s.checksum_errors,
        s.wc_errors,
        s.other_errors,
        t.posts,
        t.completions,
        s.flushed,
    )
}

/// The summary's RSS fields: `rss_warm=..KiB rss_final=..KiB (+grew, bound +slack)`.
pub(super) fn rss_fields(tr: &Traffic, slack_kib: u64) -> String {
    let grew = tr.rss_final.saturating_sub(tr.rss_warm);
    format!("rss_warm={}KiB rss_final={}KiB (+{grew}, bound +{slack_kib})", tr.rss_warm, tr.rss_final)
}

/// The summary's device fields: `resources_before=.. resources_after=..`.
pub(super) fn resources_fields(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> String {
    format!("resources_before={} resources_after={}", counts_text(before), counts_text(after))
}
