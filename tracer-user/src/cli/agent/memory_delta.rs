//! The memory section of one agent window: the difference of two
//! cumulative memory sections. Each process keeps the points of its series
//! taken after the previous cut (times made relative to the window's
//! start), the bytes each line and stack grew and released in the window
//! (lines and stacks that did neither are left out), and its OOM kill if
//! it came in the window; its peak stays the one of its life.

use std::collections::HashMap;

use crate::recording::{
    memory::{slope, GrowthLine, GrowthStack, MemoryReport, ProcessMemory},
    Frame,
};

/// `cur` minus `prev`; `prev_end_ns` is where the previous window ended
/// (ns since the agent's start, the clock of the series' `t_ns`).
pub fn memory_delta(cur: &MemoryReport, prev: Option<&MemoryReport>, prev_end_ns: u64) -> MemoryReport {
    let Some(prev) = prev else { return cur.clone() };
    let before: HashMap<u32, &ProcessMemory> = prev.processes.iter().map(|p| (p.pid, p)).collect();
    let processes = cur
        .processes
        .iter()
        .map(|p| {
            let Some(old) = before.get(&p.pid) else {
                return ProcessMemory { lines: p.lines.clone(), stacks: p.stacks.clone(), ..shifted(p, prev_end_ns) };
            };
            let mut d = shifted(p, prev_end_ns);
            let old_lines: HashMap<String, &GrowthLine> = old.lines.iter().map(|l| (l.site.key(), l)).collect();
            d.lines = p
                .lines
                .iter()
                .filter_map(|l| {
                    let o = old_lines.get(&l.site.key());
                    let grown = l.grown_bytes.saturating_sub(o.map_or(0, |o| o.grown_bytes));
                    let released = l.released_bytes.saturating_sub(o.map_or(0, |o| o.released_bytes));
                    let samples = l.samples.saturating_sub(o.map_or(0, |o| o.samples));
                    (grown > 0 || released > 0).then(|| GrowthLine { grown_bytes: grown, released_bytes: released, samples, ..l.clone() })
                })
                .collect();
            let old_stacks: HashMap<&[Frame], &GrowthStack> = old.stacks.iter().map(|s| (s.frames.as_slice(), s)).collect();
            d.stacks = p
                .stacks
                .iter()
                .filter_map(|s| {
                    let o = old_stacks.get(s.frames.as_slice());
                    let grown = s.grown_bytes.saturating_sub(o.map_or(0, |o| o.grown_bytes));
                    let released = s.released_bytes.saturating_sub(o.map_or(0, |o| o.released_bytes));
                    let samples = s.samples.saturating_sub(o.map_or(0, |o| o.samples));
                    (grown > 0 || released > 0).then(|| GrowthStack { grown_bytes: grown, released_bytes: released, samples, frames: s.frames.clone() })
                })
                .collect();
            d.rss_stat_events = p.rss_stat_events.saturating_sub(old.rss_stat_events);
            d
        })
        .collect();
    MemoryReport { growth_sample_bytes: cur.growth_sample_bytes, processes }
}

/// `p` with only the points (and the OOM kill) after `prev_end_ns`, their
/// times from there, and no growth lines or stacks (the caller's: cloning
/// them only to replace them doubled the growth stacks at each cut).
fn shifted(p: &ProcessMemory, prev_end_ns: u64) -> ProcessMemory {
    let series: Vec<_> = p.series.iter().filter(|q| q.t_ns >= prev_end_ns).map(|q| crate::recording::memory::MemPoint { t_ns: q.t_ns - prev_end_ns, ..*q }).collect();
    ProcessMemory {
        pid: p.pid,
        growth_bytes_per_s: slope(&series),
        series,
        peak_rss: p.peak_rss,
        vm_hwm: p.vm_hwm,
        lines: Vec::new(),
        memory_limit: p.memory_limit.clone(),
        oom_killed: p.oom_killed.clone().filter(|k| k.t_ns >= prev_end_ns).map(|mut k| {
            k.t_ns -= prev_end_ns;
            k
        }),
        stacks: Vec::new(),
        rss_stat_events: p.rss_stat_events,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::{attribution::SiteRef, memory::MemPoint};

    fn process(points: &[(u64, u64)], grown: u64) -> ProcessMemory {
        let site = SiteRef { function: "handle".into(), file: Some("/srv/app.py".into()), line: Some(7), kind: "python".into(), module: None, user_code: true };
        ProcessMemory {
            pid: 4,
            series: points.iter().map(|&(t_ns, rss)| MemPoint { t_ns, rss, ..Default::default() }).collect(),
            lines: vec![GrowthLine { site, beneath: None, grown_bytes: grown, released_bytes: 0, samples: grown >> 19 }],
            peak_rss: 900,
            ..Default::default()
        }
    }

    #[test]
    fn a_window_has_its_own_points_and_growth() {
        let prev = MemoryReport { growth_sample_bytes: 1 << 19, processes: vec![process(&[(0, 100), (500, 200)], 64 << 20)] };
        let cur = MemoryReport { growth_sample_bytes: 1 << 19, processes: vec![process(&[(0, 100), (500, 200), (1200, 300), (1800, 400)], 96 << 20)] };
        let d = memory_delta(&cur, Some(&prev), 1000);
        let p = &d.processes[0];
        assert_eq!(p.series.iter().map(|q| (q.t_ns, q.rss)).collect::<Vec<_>>(), [(200, 300), (800, 400)]);
        assert_eq!((p.lines.len(), p.lines[0].grown_bytes, p.peak_rss), (1, 32 << 20, 900));
        // Nothing grown since: no line.
        let same = memory_delta(&cur, Some(&cur), 2000);
        assert!(same.processes[0].lines.is_empty() && same.processes[0].series.is_empty());
        // The first window is the cumulative section itself.
        assert_eq!(memory_delta(&cur, None, 0), cur);
    }
}
