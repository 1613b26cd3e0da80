//! `record --timeline`: every CUDA call the kernel reported (`CUDA_EVENTS`,
//! kept by the drain), as timeline events with their site resolved like
//! the report's calls (`cuda.calls[].site`).

use std::collections::HashMap;

use super::{collector::CudaCollector, replay::RawSite, assemble::SiteCache};
use crate::{
    engine::Cx,
    os::probe::ProbeError,
    recording::{
        cuda::{api_name, kind_name},
        timeline::CudaCallEvent,
        Recording,
    },
};

impl CudaCollector {
    /// Adds the calls kept so far to `rec.timeline` (created if missing).
    pub(super) fn timeline_calls(&mut self, cx: &mut Cx<'_>, rec: &mut Recording) -> Result<(), ProbeError> {
        let Some((events, dropped)) = self.events.as_ref().and_then(|e| e.timeline()) else { return Ok(()) };
        let start = cx.window.start;
        let mut sites = SiteCache { sites: HashMap::new() };
        let tl = rec.timeline.get_or_insert_with(Default::default);
        tl.dropped += dropped;
        tl.cuda.reserve(events.len());
        for e in &events {
            let site = sites.resolve(RawSite::of(e), cx)?;
            let begin_ns = e.start_ns.saturating_sub(start);
            tl.cuda.push(CudaCallEvent {
                pid: e.pid,
                tid: e.tid,
                api: api_name(e.api),
                kind: kind_name(e.kind).map(str::to_owned),
                bytes: e.bytes,
                begin_ns,
                end_ns: begin_ns.saturating_add(e.dur_ns),
                rc: e.rc,
                site,
            });
        }
        Ok(())
    }
}
