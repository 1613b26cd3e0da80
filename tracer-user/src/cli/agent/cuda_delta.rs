//! The CUDA section of one agent window: the difference of two cumulative
//! CUDA sections (calls, launches and findings by their keys; GPU samples
//! taken after the previous cut, their times made relative to the
//! window's start). Counters only grow in the kernel's aggregates, so a
//! row's difference is what it did in the window; a row that did nothing
//! is left out.

use std::collections::HashMap;

use crate::recording::cuda::{CudaCall, CudaCollective, CudaLaunch, CudaReport, GraphCapture, GraphLaunch, Site};

type CallKey<'a> = (u32, &'a str, Option<&'a str>, &'a Site);

fn call_key(c: &CudaCall) -> CallKey<'_> {
    (c.pid, c.api.as_str(), c.kind.as_deref(), &c.site)
}

/// `cur` minus `prev`; `prev_end_ns` is where the previous window ended
/// (ns since the agent's start, the clock of `GpuSample::ts_ns`).
/// An optional counter's difference (absent stays absent).
fn sub_opt(cur: Option<u64>, prev: Option<u64>) -> Option<u64> {
    cur.map(|v| v.saturating_sub(prev.unwrap_or(0)))
}

pub fn cuda_delta(cur: &CudaReport, prev: Option<&CudaReport>, prev_end_ns: u64) -> CudaReport {
    let Some(prev) = prev else { return cur.clone() };
    let mut out = cur.clone();
    let prev_calls: HashMap<CallKey, &CudaCall> = prev.calls.iter().map(|c| (call_key(c), c)).collect();
    out.calls = cur
        .calls
        .iter()
        .filter_map(|c| {
            let Some(p) = prev_calls.get(&call_key(c)) else { return Some(c.clone()) };
            let mut d = c.clone();
            d.count = c.count.saturating_sub(p.count);
            d.bytes = c.bytes.saturating_sub(p.bytes);
            d.total_ns = c.total_ns.saturating_sub(p.total_ns);
            d.errors = c.errors.saturating_sub(p.errors);
            d.events_lost = c.events_lost.saturating_sub(p.events_lost);
            d.pinned = sub_opt(c.pinned, p.pinned);
            d.pageable = sub_opt(c.pageable, p.pageable);
            d.not_ready = sub_opt(c.not_ready, p.not_ready);
            d.poll_waits = sub_opt(c.poll_waits, p.poll_waits);
            d.poll_ns = sub_opt(c.poll_ns, p.poll_ns);
            d.collective_waits = sub_opt(c.collective_waits, p.collective_waits);
            d.collective_wait_ns = sub_opt(c.collective_wait_ns, p.collective_wait_ns);
            d.return_codes = c
                .return_codes
                .iter()
                .map(|(rc, n)| (*rc, n.saturating_sub(p.return_codes.get(rc).copied().unwrap_or(0))))
                .filter(|(_, n)| *n > 0)
                .collect();
            (d.count > 0).then_some(d)
        })
        .collect();
    clamp_to_totals(&mut out.calls, cur, prev);
    out.calls.retain(|c| c.count > 0);
    let coll_key = |c: &CudaCollective| (c.pid, c.api.clone(), c.comm.clone(), c.site.clone());
    let prev_coll: HashMap<_, &CudaCollective> = prev.collectives.iter().map(|c| (coll_key(c), c)).collect();
    out.collectives = cur
        .collectives
        .iter()
        .filter_map(|c| {
            let mut d = c.clone();
            if let Some(p) = prev_coll.get(&coll_key(c)) {
                d.count = c.count.saturating_sub(p.count);
                d.bytes = c.bytes.saturating_sub(p.bytes);
                d.total_ns = c.total_ns.saturating_sub(p.total_ns);
                d.errors = c.errors.saturating_sub(p.errors);
                d.host_waits = sub_opt(c.host_waits, p.host_waits);
                d.host_wait_ns = sub_opt(c.host_wait_ns, p.host_wait_ns);
            }
            (d.count > 0).then_some(d)
        })
        .collect();
    let launch_key = |l: &CudaLaunch| (l.pid, l.kernel.clone(), l.site.clone(), l.api.clone());
    let prev_launches: HashMap<_, (u64, Option<u64>)> = prev.launches.iter().map(|l| (launch_key(l), (l.count, l.sampled))).collect();
    out.launches = cur
        .launches
        .iter()
        .filter_map(|l| {
            let mut d = l.clone();
            let (count, sampled) = prev_launches.get(&launch_key(l)).copied().unwrap_or((0, None));
            d.count = l.count.saturating_sub(count);
            d.sampled = l.sampled.map(|s| s.saturating_sub(sampled.unwrap_or(0)));
            (d.count > 0).then_some(d)
        })
        .collect();
    clamp_launches(&mut out.launches, cur, prev);
    out.findings = keyed_delta(&cur.findings, &prev.findings, |f| (f.kind.clone(), f.pid, f.site.clone()), |d, p| {
        d.count = d.count.saturating_sub(p.count);
        d.bytes = d.bytes.saturating_sub(p.bytes);
        d.time_ns = d.time_ns.saturating_sub(p.time_ns);
        d.events_lost = d.events_lost.saturating_sub(p.events_lost);
        d.count > 0
    });
    out.gpu_samples = cur
        .gpu_samples
        .iter()
        .filter(|s| s.ts_ns >= prev_end_ns)
        .map(|s| {
            let mut s = s.clone();
            s.ts_ns -= prev_end_ns;
            s
        })
        .collect();
    graph_delta(&mut out, cur, prev);
    out.window_ns = cur.window_ns.saturating_sub(prev.window_ns);
    out.events_lost = cur.events_lost.saturating_sub(prev.events_lost);
    out.calls_lost = cur.calls_lost.saturating_sub(prev.calls_lost);
    out
}

/// The graph launches and captures of the window: `cur`'s minus `prev`'s,
/// by (pid, graph, site, api) and (pid, site); rows that did nothing left out.
fn graph_delta(out: &mut CudaReport, cur: &CudaReport, prev: &CudaReport) {
    let launch_key = |l: &GraphLaunch| (l.pid, l.graph.clone(), l.site.clone(), l.api.clone());
    out.graph_launches = keyed_delta(&cur.graph_launches, &prev.graph_launches, launch_key, |d, p| {
        d.count = d.count.saturating_sub(p.count);
        d.count > 0
    });
    out.graph_captures = keyed_delta(&cur.graph_captures, &prev.graph_captures, |c: &GraphCapture| (c.pid, c.site.clone()), |d, p| {
        d.captures = d.captures.saturating_sub(p.captures);
        d.kernels = d.kernels.saturating_sub(p.kernels);
        d.copies = d.copies.saturating_sub(p.copies);
        d.copy_bytes = d.copy_bytes.saturating_sub(p.copy_bytes);
        d.capture_ns = d.capture_ns.saturating_sub(p.capture_ns);
        d.captures > 0
    });
}

/// `cur`'s rows, each less `prev`'s row of the same key: `sub` takes the
/// previous row off and says whether anything is left (rows with nothing
/// left are dropped); a row new since `prev` is kept whole.
fn keyed_delta<T: Clone, K: std::hash::Hash + Eq>(cur: &[T], prev: &[T], key: impl Fn(&T) -> K, sub: impl Fn(&mut T, &T) -> bool) -> Vec<T> {
    let before: HashMap<K, &T> = prev.iter().map(|r| (key(r), r)).collect();
    cur.iter()
        .filter_map(|r| {
            let Some(p) = before.get(&key(r)) else { return Some(r.clone()) };
            let mut d = r.clone();
            sub(&mut d, p).then_some(d)
        })
        .collect()
}

/// A call's site can read differently from one snapshot to the next (its
/// Python stack resolved only later): by site, its whole count would look
/// new again. Per (pid, api, kind), the rows' differences are cut down to
/// the difference of the sums over sites, taken first from the rows whose
/// site the previous snapshot did not have.
/// As [`clamp_to_totals`] for launch rows: a row whose kernel or site
/// reads differently from one window to the next (the process gone, its
/// names resolved otherwise) would count its launches again; the window's
/// launches of a (pid, API) are at most the growth of their total, cut
/// from new rows first.
fn clamp_launches(rows: &mut Vec<CudaLaunch>, cur: &CudaReport, prev: &CudaReport) {
    let key = |l: &CudaLaunch| (l.pid, l.kernel.clone(), l.site.clone(), l.api.clone());
    let sums = |ls: &[CudaLaunch]| {
        let mut m: HashMap<(u32, String), u64> = HashMap::new();
        for l in ls {
            *m.entry((l.pid, l.api.clone())).or_default() += l.count;
        }
        m
    };
    let (now, before, given) = (sums(&cur.launches), sums(&prev.launches), sums(rows));
    let known: std::collections::HashSet<_> = prev.launches.iter().map(key).collect();
    for ((pid, api), given) in given {
        let grown = now.get(&(pid, api.clone())).copied().unwrap_or(0).saturating_sub(before.get(&(pid, api.clone())).copied().unwrap_or(0));
        let mut slots: Vec<(bool, &mut u64)> =
            rows.iter_mut().filter(|r| r.pid == pid && r.api == api).map(|r| (known.contains(&key(r)), &mut r.count)).collect();
        cut_excess(given.saturating_sub(grown), &mut slots);
    }
    rows.retain(|l| l.count > 0);
}

/// Takes `excess` off the values of one group's rows: from those new
/// since the last window first (`(known, value)`, known: false), then
/// from any.
fn cut_excess(mut excess: u64, slots: &mut [(bool, &mut u64)]) {
    for pass in [false, true] {
        for (known, v) in slots.iter_mut() {
            if excess == 0 {
                return;
            }
            if pass || !*known {
                let cut = excess.min(**v);
                **v -= cut;
                excess -= cut;
            }
        }
    }
}

fn clamp_to_totals(rows: &mut [CudaCall], cur: &CudaReport, prev: &CudaReport) {
    type Group<'a> = (u32, &'a str, Option<&'a str>);
    let sums = |calls: &[CudaCall]| {
        let mut m: HashMap<(u32, String, Option<String>), [u64; 4]> = HashMap::new();
        for c in calls {
            let e = m.entry((c.pid, c.api.clone(), c.kind.clone())).or_default();
            for (v, add) in e.iter_mut().zip([c.count, c.bytes, c.total_ns, c.errors]) {
                *v += add;
            }
        }
        m
    };
    let (now, before, given) = (sums(&cur.calls), sums(&prev.calls), sums(rows));
    let known: std::collections::HashSet<CallKey> = prev.calls.iter().map(call_key).collect();
    for (group, given) in given {
        let zero = [0; 4];
        let (n, b) = (now.get(&group).unwrap_or(&zero), before.get(&group).unwrap_or(&zero));
        for field in 0..4 {
            let excess = given[field].saturating_sub(n[field].saturating_sub(b[field]));
            let g: Group = (group.0, group.1.as_str(), group.2.as_deref());
            // New sites first, then any row of the group.
            let mut slots: Vec<(bool, &mut u64)> = rows
                .iter_mut()
                .filter(|r| (r.pid, r.api.as_str(), r.kind.as_deref()) == g)
                .map(|r| {
                    let known = known.contains(&call_key(r));
                    let v = match field {
                        0 => &mut r.count,
                        1 => &mut r.bytes,
                        2 => &mut r.total_ns,
                        _ => &mut r.errors,
                    };
                    (known, v)
                })
                .collect();
            cut_excess(excess, &mut slots);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::cuda::GpuSample;

    fn call(api: &str, count: u64, bytes: u64, ns: u64) -> CudaCall {
        CudaCall {
            pid: 7,
            api: api.into(),
            kind: Some("HtoD".into()),
            class: None,
            count,
            bytes,
            total_ns: ns,
            errors: 0,
            site: Site { function: "step".into(), file: Some("m.py".into()), line: Some(3) },
            return_codes: [(0, count)].into(),
            pinned: None,
            pageable: Some(count),
            events_lost: 0,
            not_ready: None,
            poll_waits: None,
            poll_ns: None,
            collective_waits: None,
            collective_wait_ns: None,
        }
    }

    /// Polls and NCCL calls are per-window differences too.
    #[test]
    fn polls_and_collectives_are_differences() {
        let poll = |n: u64, not_ready: u64| CudaCall { kind: None, not_ready: Some(not_ready), poll_waits: Some(n), poll_ns: Some(10 * n), ..call("cudaEventQuery", n + not_ready, 0, 0) };
        let coll = |count: u64| CudaCollective {
            pid: 7,
            api: "ncclAllReduce".into(),
            comm: "0x1100".into(),
            count,
            bytes: 4096 * count,
            total_ns: count,
            errors: 0,
            site: Site { function: "step".into(), file: Some("m.py".into()), line: Some(9) },
            host_waits: Some(count / 5),
            host_wait_ns: None,
        };
        let prev = CudaReport { calls: vec![poll(2, 50)], collectives: vec![coll(10)], ..Default::default() };
        let cur = CudaReport { calls: vec![poll(5, 80)], collectives: vec![coll(25)], ..Default::default() };
        let d = cuda_delta(&cur, Some(&prev), 0);
        assert_eq!((d.calls[0].count, d.calls[0].not_ready, d.calls[0].poll_waits, d.calls[0].poll_ns), (33, Some(30), Some(3), Some(30)));
        assert_eq!((d.collectives[0].count, d.collectives[0].bytes, d.collectives[0].host_waits), (15, 15 * 4096, Some(3)));
        let idle = cuda_delta(&cur, Some(&cur), 0);
        assert!(idle.collectives.is_empty() && idle.calls.is_empty());
    }

    #[test]
    fn a_call_whose_site_resolved_later_is_not_counted_again() {
        let mut unknown = call("cudaMemcpy", 300, 3000, 30_000);
        unknown.site = Site::unknown();
        let prev = CudaReport { calls: vec![unknown, call("cudaFree", 2, 0, 20)], ..Default::default() };
        // The same 300 calls now read at `step`, plus 18 new ones.
        let cur = CudaReport { calls: vec![call("cudaMemcpy", 318, 3180, 31_800), call("cudaFree", 2, 0, 20)], ..Default::default() };
        let d = cuda_delta(&cur, Some(&prev), 0);
        assert_eq!(d.calls.len(), 1, "{:?}", d.calls);
        let c = &d.calls[0];
        assert_eq!((c.count, c.bytes, c.total_ns), (18, 180, 1_800));
        assert_eq!(c.site.function, "step");
    }

    #[test]
    fn rows_are_differences_and_idle_rows_go() {
        let prev = CudaReport {
            calls: vec![call("cudaMemcpy", 10, 100, 1000), call("cudaFree", 2, 0, 20)],
            gpu_samples: vec![GpuSample { ts_ns: 5, ..Default::default() }],
            window_ns: 1_000,
            ..Default::default()
        };
        let cur = CudaReport {
            calls: vec![call("cudaMemcpy", 25, 250, 2500), call("cudaFree", 2, 0, 20), call("cudaMalloc", 1, 8, 9)],
            gpu_samples: vec![GpuSample { ts_ns: 5, ..Default::default() }, GpuSample { ts_ns: 1_500, ..Default::default() }],
            window_ns: 2_000,
            ..Default::default()
        };
        let d = cuda_delta(&cur, Some(&prev), 1_000);
        assert_eq!(d.calls.len(), 2, "{:?}", d.calls);
        let m = d.calls.iter().find(|c| c.api == "cudaMemcpy").unwrap();
        assert_eq!((m.count, m.bytes, m.total_ns, m.pageable), (15, 150, 1500, Some(15)));
        assert_eq!(m.return_codes.get(&0), Some(&15));
        assert!(d.calls.iter().any(|c| c.api == "cudaMalloc" && c.count == 1));
        assert_eq!(d.gpu_samples.len(), 1);
        assert_eq!(d.gpu_samples[0].ts_ns, 500);
        assert_eq!(d.window_ns, 1_000);
    }

    /// A launch row whose site reads differently in the next window (the
    /// process gone) counts its launches once.
    #[test]
    fn launches_count_once_when_their_site_reads_differently() {
        let at = |function: &str| Site { function: function.into(), file: None, line: None };
        let launch = |count, site: Site| CudaLaunch { pid: 4, kernel: "k".into(), count, site, api: "cudaLaunchKernel".into(), estimated: false, sampled: None };
        let prev = CudaReport { launches: vec![launch(300, at("patterns"))], ..Default::default() };
        let cur = CudaReport { launches: vec![launch(300, at("[unknown]"))], ..Default::default() };
        assert!(cuda_delta(&cur, Some(&prev), 0).launches.is_empty());
        let more = CudaReport { launches: vec![launch(300, at("patterns")), launch(40, at("[unknown]"))], ..Default::default() };
        let d = cuda_delta(&more, Some(&prev), 0);
        assert_eq!(d.launches.iter().map(|l| l.count).sum::<u64>(), 40, "{:?}", d.launches);
    }

    #[test]
    fn graph_rows_are_differences_and_idle_ones_go() {
        let site = Site { function: "step".into(), file: Some("/srv/serve.py".into()), line: Some(7) };
        let launch = |count| GraphLaunch { pid: 1, graph: "graph captured at g".into(), count, site: site.clone(), api: "cudaGraphLaunch".into(), captured_at: None };
        let capture = |captures| GraphCapture { pid: 1, site: site.clone(), captures, kernels: 4 * captures, copies: 0, copy_bytes: 0, capture_ns: 10 * captures };
        let prev = CudaReport { graph_launches: vec![launch(50)], graph_captures: vec![capture(3)], ..Default::default() };
        let cur = CudaReport { graph_launches: vec![launch(80)], graph_captures: vec![capture(3)], ..Default::default() };
        let d = cuda_delta(&cur, Some(&prev), 0);
        assert_eq!(d.graph_launches.len(), 1);
        assert_eq!(d.graph_launches[0].count, 30);
        assert!(d.graph_captures.is_empty(), "{:?}", d.graph_captures);
        let later = CudaReport { graph_launches: vec![launch(80)], graph_captures: vec![capture(5)], ..Default::default() };
        let d = cuda_delta(&later, Some(&cur), 0);
        assert!(d.graph_launches.is_empty());
        assert_eq!((d.graph_captures[0].captures, d.graph_captures[0].kernels, d.graph_captures[0].capture_ns), (2, 8, 20));
    }
}
