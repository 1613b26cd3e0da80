//! CUDA graphs replayed from the per-call events: which site captured
//! each graph and executable graph, and what each capture site recorded
//! (docs/cuda.md, "Graphs"; the report's side is [`super::graphs`]).
//!
//! The kernel counts what a thread captures between a successful
//! `cudaStreamBeginCapture` and its `cudaStreamEndCapture` (launches and
//! copies recorded into the graph, not run) and sends it with the end of
//! the capture (`CudaEvent`: `src` launches, `fingerprint` copies, `bytes`
//! their bytes, `dst` the graph). The capture's site is its
//! `cudaStreamBeginCapture`'s; an instantiation (`dst` the executable
//! graph, `src` the graph) carries the site over to the executable graph
//! that `cudaGraphLaunch` takes. Generic over the site (the replay's raw
//! site), so that it imports no sibling.

use std::collections::HashMap;
use std::hash::Hash;

use tracer_common::cuda::{api, CudaEvent};

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
#[derive(Clone, Debug)]
pub struct GraphState<S> {
    /// Per thread: the site and start of its capture in progress.
    begun: HashMap<u32, (S, u64)>,
    /// (pid, graph) -> the site that captured it.
    graphs: HashMap<(u32, u64), S>,
    /// (pid, executable graph) -> the site that captured its graph.
    execs: HashMap<(u32, u64), S>,
    pub captures: HashMap<S, CaptureObs>,
}

fn remember<S>(m: &mut HashMap<(u32, u64), S>, k: (u32, u64), v: S) {
    if m.len() < MAX_HANDLES || m.contains_key(&k) {
        m.insert(k, v);
    }
}

impl<S> Default for GraphState<S> {
    fn default() -> Self {
        GraphState { begun: HashMap::new(), graphs: HashMap::new(), execs: HashMap::new(), captures: HashMap::new() }
    }
}

impl<S: Copy + Eq + Hash> GraphState<S> {
    /// One capture, end of capture or instantiation, in call order.
    pub fn apply(&mut self, site: S, e: &CudaEvent) {
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
    pub fn captured_at(&self, pid: u32, exec: u64) -> Option<S> {
        self.execs.get(&(pid, exec)).copied()
    }

    /// Threads that exited: a capture they left open is dropped.
    pub fn forget_threads(&mut self, tids: &[u32]) {
        for t in tids {
            self.begun.remove(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(api: u32, tid: u32, py: u64, rc: i32, dst: u64, src: u64, start: u64) -> CudaEvent {
        CudaEvent { pid: 1, tid, api, rc, py_stack: py, dst, src, start_ns: start, dur_ns: 10, ..Default::default() }
    }

    #[test]
    fn a_graph_launch_is_named_by_the_line_that_captured_it() {
        let mut g: GraphState<u64> = GraphState::default();
        let begin = 7u64;
        g.apply(begin, &ev(api::BEGIN_CAPTURE, 5, 7, 0, 0, 0, 100));
        let mut end = ev(api::CU_END_CAPTURE, 5, 8, 0, 0xa0, 10, 200);
        end.fingerprint = 2;
        end.bytes = 64;
        g.apply(8, &end);
        g.apply(9, &ev(api::GRAPH_INSTANTIATE, 5, 9, 0, 0xe0, 0xa0, 300));
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

}
