//! The reports `--serve` hands out: as fresh as they claim.
//!
//! Each fleet report request and each scrape of the metrics port asks for a report. A
//! diagnosis runs for it unless the last one is at most [`MAX_AGE`] old and every port's
//! state, physical state and rate read now are what they were when it started: a burst of
//! scrapes runs one diagnosis, and a link that went down since is never hidden behind a
//! cached pass. A request that waited while a diagnosis ran takes that one (it started
//! after the request came). Diagnoses run one at a time (each points fd 2 at a file while
//! it opens devices, see `stderr.rs`): a line the server logs in those milliseconds lands
//! in that file and is lost. Every answer carries the report's age.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::diagnosis::Options;
use crate::model::report::Report;

/// The oldest report reused for a request when no port changed since it was made.
pub const MAX_AGE: Duration = Duration::from_secs(2);

/// A report and how long ago its diagnosis started.
#[derive(Debug, Clone)]
pub struct Fresh {
    /// The report.
    pub report: Arc<Report>,
    /// Since its diagnosis started.
    pub age: Duration,
}

struct Cached {
    report: Arc<Report>,
    started: Instant,
    /// The ports' state when the diagnosis started ([`link_states`]).
    links: Vec<String>,
}

/// Where `--serve` gets its reports: diagnoses with the options given, or one report
/// handed in (a saved one, in tests).
pub struct Reports {
    opts: Option<Options>,
    cache: Mutex<Cached>,
}

impl std::fmt::Debug for Reports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reports").field("diagnoses", &self.opts.is_some()).finish_non_exhaustive()
    }
}

impl Reports {
    /// Diagnoses with `opts` now (so a bad option fails at once), and again as requests
    /// need.
    pub fn diagnosing(opts: Options) -> Result<Reports, String> {
        let (links, started) = (link_states(), Instant::now());
        let report = Arc::new(crate::diagnosis::diagnose(&opts)?);
        Ok(Reports { opts: Some(opts), cache: Mutex::new(Cached { report, started, links }) })
    }

    /// Always `report`; its age counts from now.
    pub fn fixed(report: Report) -> Reports {
        let cached = Cached { report: Arc::new(report), started: Instant::now(), links: Vec::new() };
        Reports { opts: None, cache: Mutex::new(cached) }
    }

    /// A report as fresh as the module says; an error when the diagnosis could not run.
    pub fn get(&self) -> Result<Fresh, String> {
        let asked = Instant::now();
        // A diagnosis that panicked leaves the last report, still good to compare with.
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let Some(opts) = &self.opts else {
            return Ok(Fresh { report: Arc::clone(&cache.report), age: cache.started.elapsed() });
        };
        let links = link_states();
        let recent = cache.started >= asked || cache.started.elapsed() <= MAX_AGE;
        if !(recent && links == cache.links) {
            let started = Instant::now();
            let report = Arc::new(crate::diagnosis::diagnose(opts)?);
            *cache = Cached { report, started, links };
        }
        Ok(Fresh { report: Arc::clone(&cache.report), age: cache.started.elapsed() })
    }
}

/// Every port of every device in sysfs: `DEV/PORT state phys_state rate`, in order.
pub fn link_states() -> Vec<String> {
    let root = std::path::Path::new(crate::facts::device::SYSFS_IB);
    let mut out = Vec::new();
    for dev in crate::facts::device::sysfs_devices() {
        let ports = root.join(&dev).join("ports");
        let mut names: Vec<String> = std::fs::read_dir(&ports)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        for port in names {
            let read = |f: &str| std::fs::read_to_string(ports.join(&port).join(f)).unwrap_or_default();
            out.push(format!(
                "{dev}/{port} {} {} {}",
                read("state").trim(),
                read("phys_state").trim(),
                read("rate").trim()
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_shares_one_diagnosis_and_a_report_past_the_max_age_is_made_again() {
        // This host's diagnosis (no RDMA here: it fails, quickly): the cache is the same.
        let reports = Reports::diagnosing(Options { loopback: false, ..Options::default() }).unwrap();
        let first = reports.get().unwrap();
        let burst: Vec<Fresh> = std::thread::scope(|s| {
            let asks: Vec<_> = (0..4).map(|_| s.spawn(|| reports.get().unwrap())).collect();
            asks.into_iter().map(|a| a.join().unwrap()).collect()
        });
        for f in &burst {
            assert!(Arc::ptr_eq(&f.report, &first.report), "one diagnosis for the burst");
            assert!(f.age <= MAX_AGE + Duration::from_secs(1), "{:?}", f.age);
        }
        std::thread::sleep(MAX_AGE + Duration::from_millis(100));
        let later = reports.get().unwrap();
        assert!(!Arc::ptr_eq(&later.report, &first.report), "diagnosed again past {MAX_AGE:?}");
        assert!(later.age < MAX_AGE, "{:?}", later.age);

        let fixed = Reports::fixed((*first.report).clone());
        assert!(Arc::ptr_eq(&fixed.get().unwrap().report, &fixed.get().unwrap().report));
    }
}
