//! The excessive-transfer detector: patterns of host/device copies and
//! synchronizations that waste time in inference loops, per Python (or
//! native) call site. Thresholds are in [`Thresholds`] and documented in
//! docs/cuda.md. Every rule asks for a pattern repeated at one site, so a
//! single copy, however large, never makes a finding.
//!
//! One function per rule, named after the kind of finding it makes
//! (`small_htod_copies`, `sync_after_copy`, `pageable_copy`,
//! `tiny_dtoh_sync`, `repeated_upload`, `copy_time_share`,
//! `device_memory_leak`, `sync_polling`); [`detect`] runs them all and ranks the findings.
//! A finding holds numbers only: its sentence and advice are written by the
//! report (`crate::report::findings`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tracer_common::cuda::{KIND_DTOH, KIND_HTOD};

use super::{
    replay::{AllocObs, CopyObs, SyncObs},
    CudaLaunch, Finding, Site,
};
use crate::recording::cuda::kind_name;

/// Detector thresholds (docs/cuda.md explains each).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Thresholds {
    /// Repetitions at one site before any per-site rule fires.
    pub min_repeats: u64,
    /// `small_htod_copies`: at least this many H2D copies from a site...
    pub small_copy_min_count: u64,
    /// ...of at most this many bytes on average.
    pub small_copy_max_bytes: u64,
    /// `tiny_dtoh_sync`: D2H copies of at most this many bytes (each).
    pub tiny_copy_max_bytes: u64,
    /// `pageable_copy`: pageable bytes from a site before it matters.
    pub pageable_min_bytes: u64,
    /// `repeated_upload`: the same content must make at least this share of
    /// the site's H2D copies.
    pub repeated_min_share: f64,
    /// `copy_time_share`: copies + syncs of repeated sites over wall time.
    pub time_share: f64,
    /// ...and at least this much time in total.
    pub time_share_min_ns: u64,
    /// `device_memory_leak`: unfreed allocations from one site...
    pub leak_min_live: u64,
    /// ...of which at least this share was made in the second half of the window.
    pub leak_min_late_share: f64,
    /// `sync_polling`: at least this many not-ready queries from a site...
    pub poll_min_not_ready: u64,
    /// ...at least this many per wait on average (a loop that checks once
    /// per step of other work is not spinning).
    pub poll_min_per_wait: u64,
    /// `launch_bound`: at least this many kernel launches from one site...
    pub launch_bound_min: u64,
    /// ...at this rate or more (per second of the window)...
    pub launch_bound_rate: f64,
    /// ...each priced at this much host time (the launch probe has no
    /// return: a typical CUDA launch's cost on the CPU, 3-6 us).
    pub launch_host_ns: u64,
    /// Severity from the share of wall time a finding costs: high from this...
    pub high_share: f64,
    /// ...medium from this.
    pub medium_share: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            min_repeats: 16,
            small_copy_min_count: 32,
            small_copy_max_bytes: 256 * 1024,
            tiny_copy_max_bytes: 1024,
            pageable_min_bytes: 16 << 20,
            repeated_min_share: 0.5,
            time_share: 0.2,
            time_share_min_ns: 10_000_000,
            leak_min_live: 16,
            leak_min_late_share: 0.25,
            poll_min_not_ready: 100,
            poll_min_per_wait: 8,
            launch_bound_min: 2000,
            launch_bound_rate: 1000.0,
            launch_host_ns: 5000,
            high_share: 0.10,
            medium_share: 0.02,
        }
    }
}

/// Everything observed at one resolved site of one process.
#[derive(Clone, Debug, Default)]
pub struct SiteSummary {
    pub pid: u32,
    pub site: Site,
    /// By direction (`cudaMemcpyKind`, inferred for Default when possible).
    pub copies: BTreeMap<u32, CopyObs>,
    pub syncs: SyncObs,
    pub allocs: AllocObs,
    /// Tensors PyTorch's caching allocator handed out for this site.
    pub tensors: AllocObs,
    pub polls: PollObs,
}

/// Queries from one site (`cudaEventQuery`, `cudaStreamQuery`): the
/// kernel's aggregates (queries send no per-call event).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PollObs {
    pub queries: u64,
    /// Answers "not ready" (`cudaErrorNotReady`).
    pub not_ready: u64,
    /// Waits polling ended, and their wall time.
    pub waits: u64,
    pub wait_ns: u64,
    pub errors: u64,
}

impl SiteSummary {
    fn repeated_time_ns(&self, t: &Thresholds) -> (u64, u64, u64) {
        let mut ns = 0;
        let mut calls = 0;
        let mut bytes = 0;
        for c in self.copies.values().filter(|c| c.count >= t.min_repeats) {
            ns += c.ns;
            calls += c.count;
            bytes += c.bytes;
        }
        if self.syncs.count >= t.min_repeats {
            // Waits on collectives are communication, not copies.
            ns += self.syncs.ns.saturating_sub(self.syncs.collective_ns);
            calls += self.syncs.count;
        }
        (ns, calls, bytes)
    }
}

pub(super) fn severity(time_ns: u64, window_ns: u64, t: &Thresholds) -> &'static str {
    let share = time_ns as f64 / window_ns.max(1) as f64;
    if share >= t.high_share {
        "high"
    } else if share >= t.medium_share {
        "medium"
    } else {
        "low"
    }
}

/// One rule: the findings it makes over all sites, given the window's
/// length (ns).
type Rule = fn(&[SiteSummary], u64, &Thresholds) -> Vec<Finding>;

/// Every rule. Each keeps the order of `sites`, which [`detect`]'s stable
/// sort keeps among findings it ranks equal.
const RULES: [Rule; 8] = [
    small_htod_copies,
    sync_after_copy,
    pageable_copy,
    tiny_dtoh_sync,
    repeated_upload,
    copy_time_share,
    device_memory_leak,
    sync_polling,
];

/// Runs every rule, most severe findings first (then by time, calls, kind).
/// `window_ns`: the length of the tracing window.
pub fn detect(sites: &[SiteSummary], window_ns: u64, t: &Thresholds) -> Vec<Finding> {
    let mut out: Vec<Finding> = RULES.iter().flat_map(|rule| rule(sites, window_ns, t)).collect();
    rank(&mut out);
    out
}

/// High severity first, then by time, count and kind.
/// Most severe first, then the costliest (`recording::cuda::rank_findings`).
pub fn rank(findings: &mut [Finding]) {
    crate::recording::cuda::rank_findings(findings);
}

/// What a finding covers: calls (or allocations), bytes, time.
struct Cost {
    count: u64,
    bytes: u64,
    time_ns: u64,
}

/// A finding about the copies `c` of direction `kind` at one site, with
/// its severity from the share of the window its time costs.
fn copy_finding(s: &SiteSummary, kind: &str, copy_kind: u32, c: &CopyObs, cost: Cost, window_ns: u64, t: &Thresholds) -> Finding {
    Finding {
        kind: kind.to_owned(),
        severity: severity(cost.time_ns, window_ns, t).to_owned(),
        pid: s.pid,
        site: s.site.clone(),
        count: cost.count,
        bytes: cost.bytes,
        time_ns: cost.time_ns,
        copy_kind: kind_name(copy_kind).map(str::to_owned),
        copies: Some(c.count),
        errors: Some(c.errors),
        ..Default::default()
    }
}

/// Whether the per-direction rules look at copies of `kind`.
fn has_direction(kind: u32) -> bool {
    matches!(kind, KIND_HTOD | KIND_DTOH)
}

/// D2H copies small enough that waiting for them is all they cost.
fn is_tiny(c: &CopyObs, t: &Thresholds) -> bool {
    c.max_bytes <= t.tiny_copy_max_bytes
}

/// The content uploaded most often from a site's H2D copies, as (size,
/// uploads), when it repeats enough for `repeated_upload`.
fn repeated_content(c: &CopyObs, t: &Thresholds) -> Option<(u64, u64)> {
    let ((_, size), n) = c.top_content()?;
    (n >= t.min_repeats && n as f64 >= t.repeated_min_share * c.count as f64).then_some((size, n))
}

/// `repeated_upload`: the same host content uploaded again and again from
/// one site.
fn repeated_upload(sites: &[SiteSummary], window_ns: u64, t: &Thresholds) -> Vec<Finding> {
    let mut out = Vec::new();
    for s in sites {
        let Some(c) = s.copies.get(&KIND_HTOD) else { continue };
        let Some((size, n)) = repeated_content(c, t) else { continue };
        let time = c.ns * n / c.count.max(1);
        // The content's size is bytes / count.
        out.push(copy_finding(s, "repeated_upload", KIND_HTOD, c, Cost { count: n, bytes: n * size, time_ns: time }, window_ns, t));
    }
    out
}

/// `small_htod_copies`: many small H2D copies from one site (unless they
/// are one repeated upload, which `repeated_upload` reports).
fn small_htod_copies(sites: &[SiteSummary], window_ns: u64, t: &Thresholds) -> Vec<Finding> {
    let mut out = Vec::new();
    for s in sites {
        let Some(c) = s.copies.get(&KIND_HTOD) else { continue };
        let mean = c.bytes / c.count.max(1);
        if repeated_content(c, t).is_some() || c.count < t.small_copy_min_count || mean > t.small_copy_max_bytes {
            continue;
        }
        out.push(copy_finding(s, "small_htod_copies", KIND_HTOD, c, Cost { count: c.count, bytes: c.bytes, time_ns: c.ns }, window_ns, t));
    }
    out
}

/// `tiny_dtoh_sync`: tiny D2H copies from one site that each waited for
/// the GPU (`.item()` in a loop).
fn tiny_dtoh_sync(sites: &[SiteSummary], window_ns: u64, t: &Thresholds) -> Vec<Finding> {
    let mut out = Vec::new();
    for s in sites {
        let Some(c) = s.copies.get(&KIND_DTOH).filter(|c| is_tiny(c, t)) else { continue };
        let waits = c.sync_pairs + c.sync_copies;
        if waits < t.min_repeats {
            continue;
        }
        out.push(Finding {
            max_bytes: Some(c.max_bytes),
            ..copy_finding(s, "tiny_dtoh_sync", KIND_DTOH, c, Cost { count: waits, bytes: c.bytes, time_ns: c.ns + c.sync_pair_ns }, window_ns, t)
        });
    }
    out
}

/// `sync_after_copy`: copies (either direction) each followed by a
/// synchronize of their stream; tiny D2H copies are `tiny_dtoh_sync`'s.
fn sync_after_copy(sites: &[SiteSummary], window_ns: u64, t: &Thresholds) -> Vec<Finding> {
    let mut out = Vec::new();
    for s in sites {
        for (kind, c) in &s.copies {
            if !has_direction(*kind) || (*kind == KIND_DTOH && is_tiny(c, t)) || c.sync_pairs < t.min_repeats {
                continue;
            }
            let cost = Cost {
                count: c.sync_pairs,
                bytes: c.bytes * c.sync_pairs / c.count.max(1),
                time_ns: c.sync_pair_ns + c.ns * c.sync_pairs / c.count.max(1),
            };
            out.push(copy_finding(s, "sync_after_copy", *kind, c, cost, window_ns, t));
        }
    }
    out
}

/// `pageable_copy`: many bytes copied (either direction) from pageable host
/// memory at one site.
fn pageable_copy(sites: &[SiteSummary], window_ns: u64, t: &Thresholds) -> Vec<Finding> {
    let mut out = Vec::new();
    for s in sites {
        for (kind, c) in &s.copies {
            if !has_direction(*kind) || c.pageable < t.min_repeats || c.pageable_bytes < t.pageable_min_bytes {
                continue;
            }
            let cost = Cost { count: c.pageable, bytes: c.pageable_bytes, time_ns: c.pageable_ns };
            out.push(copy_finding(s, "pageable_copy", *kind, c, cost, window_ns, t));
        }
    }
    out
}

/// `device_memory_leak`: device allocations from one site left unfreed,
/// the site still allocating late in the window. Severity by live bytes.
fn device_memory_leak(sites: &[SiteSummary], _window_ns: u64, t: &Thresholds) -> Vec<Finding> {
    let mut out = Vec::new();
    for s in sites {
        let a = &s.allocs;
        if a.live < t.leak_min_live || (a.live_late as f64) < t.leak_min_late_share * a.live as f64 {
            continue;
        }
        out.push(Finding {
            kind: "device_memory_leak".into(),
            severity: (if a.live_bytes >= 1 << 30 {
                "high"
            } else if a.live_bytes >= 64 << 20 {
                "medium"
            } else {
                "low"
            })
            .into(),
            pid: s.pid,
            site: s.site.clone(),
            count: a.live,
            bytes: a.live_bytes,
            time_ns: 0,
            allocs: Some(a.allocs),
            ..Default::default()
        });
    }
    out
}

/// `sync_polling`: a site's queries (`cudaEventQuery`, `cudaStreamQuery`)
/// answered "not ready" again and again in each wait: a thread spinning on
/// the GPU, a CPU burnt for nothing. Cost: the waits' wall time.
fn sync_polling(sites: &[SiteSummary], window_ns: u64, t: &Thresholds) -> Vec<Finding> {
    let mut out = Vec::new();
    for s in sites {
        let p = &s.polls;
        if p.not_ready < t.poll_min_not_ready || p.not_ready < t.poll_min_per_wait * p.waits.max(1) {
            continue;
        }
        out.push(Finding {
            kind: "sync_polling".into(),
            severity: severity(p.wait_ns, window_ns, t).into(),
            pid: s.pid,
            site: s.site.clone(),
            count: p.not_ready,
            bytes: 0,
            time_ns: p.wait_ns,
            waits: Some(p.waits),
            errors: Some(p.errors),
            ..Default::default()
        });
    }
    out
}

/// `launch_bound`: many kernel launches from one site at a high rate
/// (small kernels issued one by one: the GPU waits for the CPU between
/// them). From the launches by kernel and site; the cost is their
/// estimated host time (`launch_host_ns` each).
pub fn launch_bound(launches: &[CudaLaunch], window_ns: u64, t: &Thresholds) -> Vec<Finding> {
    let mut by_site: BTreeMap<(u32, &Site), (u64, u64)> = BTreeMap::new();
    for l in launches {
        let e = by_site.entry((l.pid, &l.site)).or_default();
        e.0 += l.count;
        e.1 += 1;
    }
    let secs = window_ns as f64 / 1e9;
    let mut out = Vec::new();
    for ((pid, site), (count, kernels)) in by_site {
        let rate = if secs > 0.0 { count as f64 / secs } else { 0.0 };
        if count < t.launch_bound_min || rate < t.launch_bound_rate {
            continue;
        }
        let time_ns = count.saturating_mul(t.launch_host_ns);
        out.push(Finding {
            kind: "launch_bound".into(),
            severity: severity(time_ns, window_ns, t).into(),
            pid,
            site: site.clone(),
            count,
            bytes: 0,
            time_ns,
            kernels: Some(kernels),
            per_s: Some((rate * 10.0).round() / 10.0),
            ..Default::default()
        });
    }
    out
}

/// `copy_time_share`: per process, the time of repeated copies and syncs
/// against the window, reported at the site that spent the most.
fn copy_time_share(sites: &[SiteSummary], window_ns: u64, t: &Thresholds) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut pids: Vec<u32> = sites.iter().map(|s| s.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    for pid in pids {
        let mut ns = 0;
        let mut calls = 0;
        let mut bytes = 0;
        let mut top: Option<(&SiteSummary, u64)> = None;
        for s in sites.iter().filter(|s| s.pid == pid) {
            let (n, c, b) = s.repeated_time_ns(t);
            ns += n;
            calls += c;
            bytes += b;
            if n > 0 && top.is_none_or(|(_, best)| n > best) {
                top = Some((s, n));
            }
        }
        let share = ns as f64 / window_ns.max(1) as f64;
        let Some((s, top_ns)) = top else { continue };
        if share < t.time_share || ns < t.time_share_min_ns {
            continue;
        }
        out.push(Finding {
            kind: "copy_time_share".into(),
            severity: if share >= 0.5 { "high" } else { "medium" }.into(),
            pid,
            site: s.site.clone(),
            count: calls,
            bytes,
            time_ns: ns,
            window_ns: Some(window_ns),
            site_time_ns: Some(top_ns),
            ..Default::default()
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(line: u32) -> Site {
        Site { function: "f".into(), file: Some("w.py".into()), line: Some(line) }
    }

    fn copies(kind: u32, c: CopyObs) -> BTreeMap<u32, CopyObs> {
        [(kind, c)].into_iter().collect()
    }

    #[test]
    fn single_large_copy_is_fine() {
        let big = CopyObs {
            count: 1,
            bytes: 1 << 30,
            ns: 900_000_000,
            max_bytes: 1 << 30,
            pageable: 1,
            pageable_bytes: 1 << 30,
            pageable_ns: 900_000_000,
            sync_copies: 1,
            ..Default::default()
        };
        let s = SiteSummary { pid: 1, site: site(3), copies: copies(KIND_HTOD, big), ..Default::default() };
        assert!(detect(&[s], 1_000_000_000, &Thresholds::default()).is_empty());
    }

    #[test]
    fn each_rule_fires() {
        let t = Thresholds::default();
        let small = CopyObs {
            count: 100,
            bytes: 100 * 4096,
            ns: 1_000_000,
            max_bytes: 4096,
            async_count: 100,
            pageable: 100,
            pageable_bytes: 100 * 4096,
            sync_pairs: 100,
            sync_pair_ns: 50_000_000,
            ..Default::default()
        };
        let item = CopyObs { count: 50, bytes: 200, max_bytes: 4, sync_pairs: 50, ..Default::default() };
        let mut constant = CopyObs { count: 40, bytes: 40 * 65536, max_bytes: 65536, ..Default::default() };
        constant.contents.insert((7, 65536), 40);
        let pageable = CopyObs {
            count: 20,
            bytes: 20 << 23,
            max_bytes: 1 << 23,
            pageable: 20,
            pageable_bytes: 20 << 23,
            pageable_ns: 30_000_000,
            sync_copies: 20,
            ..Default::default()
        };
        let sites = vec![
            SiteSummary { pid: 1, site: site(10), copies: copies(KIND_HTOD, small), ..Default::default() },
            SiteSummary {
                pid: 1,
                site: site(11),
                syncs: SyncObs { count: 100, ns: 50_000_000, after_copy: 100, collective_ns: 0 },
                ..Default::default()
            },
            SiteSummary { pid: 1, site: site(20), copies: copies(KIND_DTOH, item), ..Default::default() },
            SiteSummary { pid: 1, site: site(30), copies: copies(KIND_HTOD, constant), ..Default::default() },
            SiteSummary { pid: 1, site: site(40), copies: copies(KIND_HTOD, pageable), ..Default::default() },
            SiteSummary {
                pid: 1,
                site: site(50),
                allocs: AllocObs { allocs: 20, bytes: 20 << 20, live: 20, live_bytes: 20 << 20, live_late: 10, freed: 0, ..Default::default() },
                ..Default::default()
            },
        ];
        let f = detect(&sites, 200_000_000, &t);
        let got: Vec<(String, u32)> = f.iter().map(|f| (f.kind.clone(), f.site.line.unwrap())).collect();
        for want in [
            ("small_htod_copies", 10),
            ("sync_after_copy", 10),
            ("tiny_dtoh_sync", 20),
            ("repeated_upload", 30),
            ("pageable_copy", 40),
            ("device_memory_leak", 50),
            ("copy_time_share", 11),
        ] {
            assert!(got.contains(&(want.0.to_string(), want.1)), "{want:?} missing from {got:?}");
        }
        // repeated_upload replaces small_htod_copies at its site; pageable
        // bytes below the threshold do not make a finding at line 10.
        assert!(!got.contains(&("small_htod_copies".into(), 30)));
        assert!(!got.contains(&("pageable_copy".into(), 10)));
        assert_eq!(got.len(), 7, "{got:?}");
        // Numbers only; the report words them as format 1 recorded them.
        assert!(f.iter().all(|f| f.message.is_none() && f.advice.is_none()));
        let words = |kind: &str| {
            let f = f.iter().find(|f| f.kind == kind).unwrap();
            assert!(!crate::report::findings::cuda_advice(f).is_empty(), "{kind}");
            crate::report::findings::cuda_message(f).into_owned()
        };
        assert_eq!(words("small_htod_copies"), "100 small host-to-device copies from this line, 4.0 KiB on average (400.0 KiB in all)");
        assert_eq!(
            words("sync_after_copy"),
            "100 host-to-device copies from this line were each followed by a synchronize of their stream on the same thread: the CPU waits for every transfer"
        );
        assert_eq!(
            words("tiny_dtoh_sync"),
            "50 tiny device-to-host copies (4 B each at most) from this line each waited for the GPU: a .item()/.cpu() in a loop"
        );
        assert_eq!(
            words("repeated_upload"),
            "the same 64.0 KiB of host data was uploaded 40 times from this line (40 of 40 host-to-device copies here)"
        );
        assert_eq!(words("pageable_copy"), "20 host-to-device copies (160.0 MiB) from this line used pageable host memory, at 5.59 GB/s");
        assert_eq!(
            words("device_memory_leak"),
            "20 of 20 device allocations (20.0 MiB) from this line were never freed, and it was still allocating in the second half of the window"
        );
        assert_eq!(
            words("copy_time_share"),
            "host/device copies and synchronizations took 26% of the wall time (51.0 ms of 200.0 ms); this line alone 50.0 ms"
        );
    }

    /// A spin on `cudaEventQuery` (hundreds of not-ready answers per wait)
    /// is a finding; a loop that checks once per step is not.
    #[test]
    fn polling_spins_only() {
        let t = Thresholds::default();
        let spin = PollObs { queries: 5_050, not_ready: 5_000, waits: 50, wait_ns: 100_000_000, errors: 0 };
        let check = PollObs { queries: 400, not_ready: 200, waits: 200, wait_ns: 2_000_000_000, errors: 0 };
        let sites = vec![
            SiteSummary { pid: 1, site: site(60), polls: spin, ..Default::default() },
            SiteSummary { pid: 1, site: site(61), polls: check, ..Default::default() },
        ];
        let f = detect(&sites, 1_000_000_000, &t);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!((f[0].kind.as_str(), f[0].site.line, f[0].count, f[0].time_ns, f[0].waits), ("sync_polling", Some(60), 5_000, 100_000_000, Some(50)));
        assert_eq!(f[0].severity, "high");
        assert!(!crate::report::findings::cuda_advice(&f[0]).is_empty());
        assert_eq!(
            crate::report::findings::cuda_message(&f[0]),
            "5000 queries from this line found the GPU work not done (100 per wait): the thread spun 100.0 ms polling in 50 waits"
        );
    }

    #[test]
    fn launch_bound_needs_many_launches_at_a_rate() {
        let t = Thresholds::default();
        let l = |line: u32, kernel: &str, count: u64| CudaLaunch {
            pid: 1,
            kernel: kernel.into(),
            count,
            site: site(line),
            api: "cudaLaunchKernel".into(),
            estimated: false,
            sampled: None,
        };
        let launches = vec![l(70, "a", 3000), l(70, "b", 1000), l(71, "c", 2500), l(72, "d", 100)];
        // 2 s: line 70 at 2000/s, line 71 at 1250/s; line 72 too few.
        let f = launch_bound(&launches, 2_000_000_000, &t);
        let got: Vec<(u32, u64, Option<u64>, Option<f64>)> = f.iter().map(|f| (f.site.line.unwrap(), f.count, f.kernels, f.per_s)).collect();
        assert_eq!(got, vec![(70, 4000, Some(2), Some(2000.0)), (71, 2500, Some(1), Some(1250.0))]);
        assert_eq!(f[0].time_ns, 4000 * 5000);
        // The same launches over 10 s: below the rate.
        assert!(launch_bound(&launches, 10_000_000_000, &t).is_empty());
        assert_eq!(
            crate::report::findings::cuda_message(&f[0]),
            "4000 kernel launches from this line (2 kernels, 2000/s): many small kernels issued one by one, the GPU likely waits for the CPU between them (~20.0 ms of launch overhead at ~5.0 µs each)"
        );
        assert!(!crate::report::findings::cuda_advice(&f[0]).is_empty());
    }

    #[test]
    fn failed_copies_are_in_the_words() {
        let t = Thresholds::default();
        let c = CopyObs {
            count: 20,
            bytes: 20 << 23,
            max_bytes: 1 << 23,
            errors: 3,
            pageable: 20,
            pageable_bytes: 20 << 23,
            pageable_ns: 30_000_000,
            sync_pairs: 20,
            ..Default::default()
        };
        let s = SiteSummary { pid: 1, site: site(7), copies: copies(KIND_DTOH, c), ..Default::default() };
        let f = detect(&[s], 1_000_000_000, &t);
        let words: Vec<String> = f.iter().map(|f| crate::report::findings::cuda_message(f).into_owned()).collect();
        assert!(words.contains(&"20 device-to-host copies (160.0 MiB) from this line used pageable host memory (3 of these calls failed)".to_owned()), "{words:?}");
        assert!(words.contains(&"20 device-to-host copies from this line were each followed by a synchronize of their stream on the same thread: the CPU waits for every transfer (3 of these calls failed)".to_owned()), "{words:?}");
    }

    /// Syncs that waited on NCCL collectives are communication: they do
    /// not make `copy_time_share` (the verdict's `collective` class has them).
    #[test]
    fn collective_waits_are_not_copy_time() {
        let t = Thresholds::default();
        let sync = |collective_ns| SiteSummary {
            pid: 1,
            site: site(11),
            syncs: SyncObs { count: 100, ns: 150_000_000, after_copy: 0, collective_ns },
            ..Default::default()
        };
        let kinds = |s: SiteSummary| detect(&[s], 200_000_000, &t).into_iter().map(|f| f.kind).collect::<Vec<_>>();
        assert_eq!(kinds(sync(0)), ["copy_time_share"]);
        assert!(kinds(sync(140_000_000)).is_empty());
    }


    #[test]
    fn a_gpu_near_capacity_names_the_line_holding_the_most() {
        use crate::recording::cuda::{gpu_memory_near_capacity, DeviceMemory, DeviceMemoryLine, GpuSample};
        let sample = |gpu, used, total| GpuSample { gpu, mem_used_bytes: used, mem_total_bytes: total, ..Default::default() };
        let samples = [sample(0, 95, 100), sample(0, 98, 100), sample(0, 50, 100), sample(1, 89, 100), sample(2, 5, 0)];
        let line = |l: u32| DeviceMemoryLine { site: Site { line: Some(l), ..Default::default() }, held_bytes: 1, ..Default::default() };
        let dm = [
            DeviceMemory { pid: 7, held_bytes: 10, peak_held_bytes: 10, lines: vec![line(3)], ..Default::default() },
            DeviceMemory { pid: 8, held_bytes: 60, peak_held_bytes: 60, lines: vec![line(9), line(4)], ..Default::default() },
        ];
        let f = gpu_memory_near_capacity(&samples, &dm);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!((f[0].gpu, f[0].count, f[0].bytes, f[0].capacity_bytes, f[0].severity.as_str()), (Some(0), 2, 98, Some(100), "high"));
        assert_eq!((f[0].pid, f[0].site.line), (8, Some(9)));
        assert!(gpu_memory_near_capacity(&samples[2..], &[]).is_empty());
    }
}
