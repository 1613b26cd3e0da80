//! CUDA graphs in the report: graph launches by graph and site, each named
//! by the line that captured its graph, the captures by site, and the
//! finding `graph_recaptured` (docs/cuda.md, "Graphs"), from the replayed
//! graph setup calls ([`super::graph_state`]).

use std::collections::BTreeMap;

use tracer_common::cuda::{api, LaunchKey};

use super::{
    findings::{severity, Thresholds},
    graph_state::GraphState,
    replay::RawSite,
};
use crate::{
    os::probe::ProbeError,
    recording::cuda::{api_name, Finding, GraphCapture, GraphLaunch, Site},
};

/// Resolves a raw site (the collector's site cache).
pub(super) type Resolve<'a> = dyn FnMut(RawSite) -> Result<Site, ProbeError> + 'a;

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
    graphs: &GraphState<RawSite>,
    resolve: &mut Resolve<'_>,
) -> Result<Vec<GraphLaunch>, ProbeError> {
    let mut by = ByGraph::new();
    for (k, n) in launches.iter().filter(|(k, _)| api::is_graph_launch(k.api)) {
        let raw = RawSite { pid: k.pid, user_stack: k.user_stack, py_stack: k.py_stack, caller: 0 };
        let site = resolve(raw)?;
        let captured_at = match graphs.captured_at(k.pid, k.func) {
            Some(r) => Some(resolve(r)?),
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
pub(super) fn graph_captures(graphs: &GraphState<RawSite>, resolve: &mut Resolve<'_>) -> Result<Vec<GraphCapture>, ProbeError> {
    let mut out = Vec::with_capacity(graphs.captures.len());
    for (raw, c) in &graphs.captures {
        out.push(GraphCapture {
            pid: raw.pid,
            site: resolve(*raw)?,
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
            ..Default::default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
