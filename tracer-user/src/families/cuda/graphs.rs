//! CUDA graphs: which Python line captured each graph, what went into it,
//! and its launches (docs/cuda.md, "Graphs").
//!
//! The kernel counts what a thread captures between a successful
//! `cudaStreamBeginCapture` and its `cudaStreamEndCapture` (launches and
//! copies recorded into the graph, not run) and sends it with the end of
//! the capture (`CudaEvent`: `src` launches, `fingerprint` copies, `bytes`
//! their bytes, `dst` the graph). Here the events are replayed in order:
//! the capture's site is its `cudaStreamBeginCapture`'s; an instantiation
//! (`dst` the executable graph, `src` the graph) carries the site over to
//! the executable graph that `cudaGraphLaunch` takes, so each graph launch
//! names the line that captured its graph.

use std::collections::{BTreeMap, HashMap};

use tracer_common::cuda::{api, CudaEvent, LaunchKey};

use super::{
    assemble::SiteCache,
    findings::{severity, Thresholds},
    replay::RawSite,
};
use crate::{
    engine::Cx,
    os::probe::ProbeError,
    recording::cuda::{api_name, Finding, GraphCapture, GraphLaunch, Site},
};

/// Graphs and executable graphs remembered per process, at most.
const MAX_HANDLES: usize = 65_536;

/// The captures made from one site.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaptureObs {
    /// Captures that ended with a graph.
    pub captures: u64,
    /// Launches and copies recorded into those graphs, and the copies' bytes.
    pub kernels: u64,
    pub copies: u64,
    pub copy_bytes: u64,
    /// Host time from the captures' begin to their end.
    pub ns: u64,
}

/// The graph setup calls replayed.
#[derive(Clone, Debug, Default)]
pub struct GraphState {
    /// Per thread: the site and start of its capture in progress.
    begun: HashMap<u32, (RawSite, u64)>,
    /// (pid, graph) -> the site that captured it.
    graphs: HashMap<(u32, u64), RawSite>,
    /// (pid, executable graph) -> the site that captured its graph.
    execs: HashMap<(u32, u64), RawSite>,
    pub captures: HashMap<RawSite, CaptureObs>,
}

fn remember(m: &mut HashMap<(u32, u64), RawSite>, k: (u32, u64), v: RawSite) {
    if m.len() < MAX_HANDLES || m.contains_key(&k) {
        m.insert(k, v);
    }
}

impl GraphState {
    /// One capture, end of capture or instantiation, in call order.
    pub fn apply(&mut self, site: RawSite, e: &CudaEvent) {
        if api::is_capture_begin(e.api) {
            if e.rc == 0 {
                self.begun.insert(e.tid, (site, e.start_ns));
            }
        } else if api::is_capture_end(e.api) {
            let (at, start) = self.begun.remove(&e.tid).unwrap_or((site, e.start_ns));
            if e.rc != 0 || e.dst == 0 {
                return;
            }
            let c = self.captures.entry(at).or_default();
            c.captures += 1;
            c.kernels += e.src;
            c.copies += e.fingerprint;
            c.copy_bytes += e.bytes;
            c.ns += (e.start_ns + e.dur_ns).saturating_sub(start);
            remember(&mut self.graphs, (e.pid, e.dst), at);
        } else if api::is_instantiate(e.api) && e.rc == 0 && e.dst != 0 {
            if let Some(at) = self.graphs.get(&(e.pid, e.src)).copied() {
                remember(&mut self.execs, (e.pid, e.dst), at);
            }
        }
    }

    /// The site that captured the graph of executable graph `exec`.
    pub fn captured_at(&self, pid: u32, exec: u64) -> Option<RawSite> {
        self.execs.get(&(pid, exec)).copied()
    }

    /// Threads that exited: a capture they left open is dropped.
    pub fn forget_threads(&mut self, tids: &[u32]) {
        for t in tids {
            self.begun.remove(t);
        }
    }
}

/// A graph's name: the line that captured it, else its handle.
fn graph_name(captured_at: Option<&Site>, exec: u64) -> String {
    match captured_at {
        Some(s) => format!("graph captured at {}", s.display()),
        None => format!("cudaGraphExec {exec:#x}"),
    }
}

/// (pid, graph name, site, API) -> (launches, the capture's site).
type ByGraph = BTreeMap<(u32, String, Site, u32), (u64, Option<Site>)>;

/// Graph launches by (pid, graph, site, API), most first.
pub(super) fn graph_launches(
    launches: &[(LaunchKey, u64)],
    graphs: &GraphState,
    sites: &mut SiteCache,
    cx: &mut Cx<'_>,
) -> Result<Vec<GraphLaunch>, ProbeError> {
    let mut by = ByGraph::new();
    for (k, n) in launches.iter().filter(|(k, _)| api::is_graph_launch(k.api)) {
        let raw = RawSite { pid: k.pid, user_stack: k.user_stack, py_stack: k.py_stack, caller: 0 };
        let site = sites.resolve(raw, cx)?;
        let captured_at = match graphs.captured_at(k.pid, k.func) {
            Some(r) => Some(sites.resolve(r, cx)?),
            None => None,
        };
        let e = by.entry((k.pid, graph_name(captured_at.as_ref(), k.func), site, k.api)).or_default();
        e.0 += n;
        e.1 = captured_at;
    }
    let mut out: Vec<GraphLaunch> = by
        .into_iter()
        .map(|((pid, graph, site, a), (count, captured_at))| GraphLaunch { pid, graph, count, site, api: api_name(a), captured_at })
        .collect();
    out.sort_by(|a, b| b.count.cmp(&a.count).then(a.graph.cmp(&b.graph)));
    Ok(out)
}

/// Captures by site, most first.
pub(super) fn graph_captures(graphs: &GraphState, sites: &mut SiteCache, cx: &mut Cx<'_>) -> Result<Vec<GraphCapture>, ProbeError> {
    let mut out = Vec::with_capacity(graphs.captures.len());
    for (raw, c) in &graphs.captures {
        out.push(GraphCapture {
            pid: raw.pid,
            site: sites.resolve(*raw, cx)?,
            captures: c.captures,
            kernels: c.kernels,
            copies: c.copies,
            copy_bytes: c.copy_bytes,
            capture_ns: c.ns,
        });
    }
    out.sort_by(|a, b| b.captures.cmp(&a.captures).then(a.site.cmp(&b.site)));
    Ok(out)
}

/// `graph_recaptured`: a site that captured a graph at least `min_repeats`
/// times (a capture in the hot loop: the graph is rebuilt instead of
/// replayed).
pub(super) fn recaptured(captures: &[GraphCapture], window_ns: u64, t: &Thresholds) -> Vec<Finding> {
    captures
        .iter()
        .filter(|c| c.captures >= t.min_repeats)
        .map(|c| Finding {
            kind: "graph_recaptured".to_owned(),
            severity: severity(c.capture_ns, window_ns, t).to_owned(),
            pid: c.pid,
            site: c.site.clone(),
            count: c.captures,
            bytes: c.copy_bytes,
            time_ns: c.capture_ns,
            message: None,
            advice: None,
            events_lost: 0,
            copy_kind: None,
            copies: None,
            errors: None,
            max_bytes: None,
            allocs: None,
            window_ns: None,
            site_time_ns: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(api: u32, tid: u32, py: u64, rc: i32, dst: u64, src: u64, start: u64) -> CudaEvent {
        CudaEvent { pid: 1, tid, api, rc, py_stack: py, dst, src, start_ns: start, dur_ns: 10, ..Default::default() }
    }

    #[test]
    fn a_graph_launch_is_named_by_the_line_that_captured_it() {
        let mut g = GraphState::default();
        let begin = RawSite { pid: 1, py_stack: 7, ..Default::default() };
        g.apply(begin, &ev(api::BEGIN_CAPTURE, 5, 7, 0, 0, 0, 100));
        let mut end = ev(api::CU_END_CAPTURE, 5, 8, 0, 0xa0, 10, 200);
        end.fingerprint = 2;
        end.bytes = 64;
        g.apply(RawSite { py_stack: 8, ..begin }, &end);
        g.apply(RawSite { py_stack: 9, ..begin }, &ev(api::GRAPH_INSTANTIATE, 5, 9, 0, 0xe0, 0xa0, 300));
        assert_eq!(g.captured_at(1, 0xe0), Some(begin));
        assert_eq!(g.captured_at(1, 0xa0), None);
        let c = &g.captures[&begin];
        assert_eq!((c.captures, c.kernels, c.copies, c.copy_bytes, c.ns), (1, 10, 2, 64, 110));
        // A failed capture or instantiation names nothing.
        g.apply(begin, &ev(api::BEGIN_CAPTURE, 6, 7, 35, 0, 0, 400));
        g.apply(begin, &ev(api::END_CAPTURE, 6, 7, 35, 0, 0, 500));
        g.apply(begin, &ev(api::GRAPH_INSTANTIATE, 6, 7, 35, 0xf0, 0xa0, 600));
        assert_eq!(g.captured_at(1, 0xf0), None);
        assert_eq!(g.captures[&begin].captures, 1);
    }

    #[test]
    fn recaptured_fires_from_min_repeats_captures() {
        let t = Thresholds::default();
        let cap = |n: u64| GraphCapture { pid: 1, site: Site::unknown(), captures: n, kernels: 4 * n, copies: 0, copy_bytes: 0, capture_ns: 1000 };
        assert!(recaptured(&[cap(t.min_repeats - 1)], 1_000_000, &t).is_empty());
        let f = recaptured(&[cap(t.min_repeats)], 1_000_000, &t);
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].kind.as_str(), f[0].count), ("graph_recaptured", t.min_repeats));
    }
}
