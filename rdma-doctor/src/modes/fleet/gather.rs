//! Asking many nodes at once: a bounded pool of threads, the reports, and the path probes
//! between neighbours (a ring, or every pair scheduled in rounds where each node takes
//! part in one probe at a time).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::wire::{self, Trouble};
use super::{FleetNode, Link, NodeState};
use crate::modes::gate::Secret;
use crate::modes::peer::EXCHANGE_TIMEOUTS;

/// `f` over every item, with at most `workers` threads at once; results in item order.
/// An item whose thread could not start gets `fallback`'s result.
pub(crate) fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    workers: usize,
    f: impl Fn(&T) -> R + Sync,
    fallback: impl Fn(&T) -> R,
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<R>>> = Mutex::new(items.iter().map(|_| None).collect());
    std::thread::scope(|s| {
        for i in 0..workers.clamp(1, items.len().max(1)) {
            let work = || loop {
                let at = next.fetch_add(1, Ordering::SeqCst);
                let Some(item) = items.get(at) else { break };
                let r = f(item);
                if let Ok(mut all) = results.lock() {
                    all[at] = Some(r);
                }
            };
            // A pool smaller than asked still does every item; none at all, the caller's fallback.
            if std::thread::Builder::new().name(format!("fleet {i}")).spawn_scoped(s, work).is_err() {
                break;
            }
        }
    });
    let results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results.into_iter().zip(items).map(|(r, item)| r.unwrap_or_else(|| fallback(item))).collect()
}

/// One node's answer to the report request.
pub(crate) fn gather(given: &str, address: &str, secret: Option<&Secret>, timeout: Duration) -> FleetNode {
    let start = Instant::now();
    let result = wire::fetch_report(address, secret, timeout);
    let elapsed_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut node = FleetNode::new(given, address, NodeState::Answered);
    node.elapsed_ms = elapsed_ms;
    match result {
        Ok(r) => node.report = Some(r),
        Err((trouble, why)) => {
            node.state = NodeState::from(trouble);
            node.error = Some(why);
        }
    }
    node
}

/// The pairs to probe among `n` answering nodes: a ring (0->1, 1->2, ..., n-1->0; one
/// link for two nodes), or every pair, in rounds where no node appears twice.
pub(crate) fn schedule(n: usize, mesh: bool) -> Vec<Vec<(usize, usize)>> {
    match (n, mesh) {
        (0 | 1, _) => Vec::new(),
        (2, _) => vec![vec![(0, 1)]],
        (_, false) => vec![(0..n).map(|i| (i, (i + 1) % n)).collect()],
        (_, true) => {
            // The circle method: with a phantom node when n is odd, n-1 (or n) rounds.
            let m = n + n % 2;
            let mut rounds = Vec::new();
            for r in 0..m - 1 {
                let mut round = Vec::new();
                for i in 0..m / 2 {
                    let a = if i == 0 { m - 1 } else { (r + i) % (m - 1) };
                    let b = (r + m - 1 - i) % (m - 1);
                    if a < n && b < n {
                        round.push((a.min(b), a.max(b)));
                    }
                }
                rounds.push(round);
            }
            rounds
        }
    }
}

/// The longest the collector waits for a node's probe of another: the target's door ends
/// an exchange after [`EXCHANGE_TIMEOUTS`] of its timeouts, the prober waits two timeouts
/// a line, and the answer needs its own time.
pub fn probe_wait(timeout: Duration) -> Duration {
    timeout * (2 * EXCHANGE_TIMEOUTS) + Duration::from_secs(5)
}

/// Probes every scheduled link of `nodes` (the answering ones), round after round.
pub(crate) fn probe_links(
    nodes: &[&FleetNode],
    mesh: bool,
    timeout: Duration,
    secret: Option<&Secret>,
    workers: usize,
) -> Vec<Link> {
    let mut links = Vec::new();
    for round in schedule(nodes.len(), mesh) {
        let done = parallel_map(
            &round,
            workers,
            |&(a, b)| probe_one(nodes[a], nodes[b], timeout, secret),
            |&(a, b)| Link::failed(nodes[a], nodes[b], "collector", "no thread for this probe".into()),
        );
        links.extend(done);
    }
    links
}

fn probe_one(from: &FleetNode, to: &FleetNode, timeout: Duration, secret: Option<&Secret>) -> Link {
    match wire::ask_probe(&from.address, &to.address, timeout, secret, probe_wait(timeout)) {
        Ok(report) => Link::from_report(from, to, report),
        Err((trouble, why)) => {
            let what = match trouble {
                Trouble::Slow => "the probe did not end in time",
                _ => "the collector got no probe report",
            };
            Link::failed(from, to, "collector", format!("{what}: {why}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mesh_probes_every_pair_once_and_no_node_twice_in_a_round() {
        for n in 2..12 {
            let rounds = schedule(n, true);
            let mut pairs: Vec<(usize, usize)> = rounds.iter().flatten().copied().collect();
            pairs.sort_unstable();
            let want: Vec<(usize, usize)> = (0..n).flat_map(|a| (a + 1..n).map(move |b| (a, b))).collect();
            assert_eq!(pairs, want, "n = {n}");
            for r in &rounds {
                let mut seen: Vec<usize> = r.iter().flat_map(|&(a, b)| [a, b]).collect();
                seen.sort_unstable();
                seen.dedup();
                assert_eq!(seen.len(), r.len() * 2, "n = {n}: {r:?}");
            }
        }
    }

    #[test]
    fn a_ring_links_each_node_to_the_next_and_the_last_to_the_first() {
        assert_eq!(schedule(1, false), Vec::<Vec<(usize, usize)>>::new());
        assert_eq!(schedule(2, false), vec![vec![(0, 1)]]);
        assert_eq!(schedule(3, false), vec![vec![(0, 1), (1, 2), (2, 0)]]);
    }

    #[test]
    fn the_pool_keeps_the_order_and_bounds_the_threads() {
        let running = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let items: Vec<u32> = (0..50).collect();
        let out = parallel_map(
            &items,
            4,
            |i| {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(2));
                running.fetch_sub(1, Ordering::SeqCst);
                i * 2
            },
            |_| 0,
        );
        assert_eq!(out, items.iter().map(|i| i * 2).collect::<Vec<_>>());
        assert!(most.load(Ordering::SeqCst) <= 4);
    }
}
