//! `--format json`: the machine-readable report (docs/report-schema.md).

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    rows::{syscall_rows, targets, totals, SyscallRow, Totals},
    SCHEMA_VERSION,
};
use crate::recording::{Origin, Recording};

#[derive(Serialize)]
struct JsonTarget<'a> {
    pid: u32,
    ppid: Option<u32>,
    comm: &'a str,
    exe: Option<&'a str>,
    cmdline: &'a [String],
    origin: Origin,
    exit_code: Option<i32>,
}

/// `cuda` in the report: the calls, launches and GPU samples (findings
/// are top-level).
#[derive(Serialize)]
struct JsonCuda<'a> {
    calls: &'a [crate::recording::cuda::CudaCall],
    launches: &'a [crate::recording::cuda::CudaLaunch],
    gpu_samples: &'a [crate::recording::cuda::GpuSample],
    libraries: &'a [crate::recording::cuda::CudaLibrary],
    notes: &'a [String],
    /// Per-call events lost (`cuda_events_lost`): findings and per-call
    /// columns incomplete; `calls[].events_lost` and `findings[].events_lost` say where.
    events_lost: u64,
    /// Calls or launches missing from `calls` and `launches` (`cuda_lost`).
    calls_lost: u64,
    /// Driver functions no longer probed in a process (docs/cuda.md).
    driver_probes_off: &'a [crate::recording::cuda::DriverProbesOff],
    /// `--max-overhead`: launches probed in time slices, `launches[].count`
    /// estimated where `launches[].estimated` (absent without the budget).
    #[serde(skip_serializing_if = "Option::is_none")]
    launch_sampling: Option<&'a crate::recording::cuda::LaunchSampling>,
    /// CUDA graph launches by graph and site (schema 1.x addition).
    graph_launches: &'a [crate::recording::cuda::GraphLaunch],
    /// Stream captures by site: what they recorded (schema 1.x addition).
    graph_captures: &'a [crate::recording::cuda::GraphCapture],
    /// NCCL calls by API, communicator and site (schema 1.x addition).
    collectives: &'a [crate::recording::cuda::CudaCollective],
    /// Device memory held by the allocation calls per process and line
    /// (schema 1.x addition; absent when empty).
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    device_memory: &'a [crate::recording::cuda::DeviceMemory],
}

#[derive(Serialize)]
struct JsonReport<'a> {
    schema_version: u32,
    tool_version: &'a str,
    recording_format_version: u32,
    host: &'a crate::recording::HostInfo,
    started_unix_ms: u64,
    duration_ns: u64,
    targets: Vec<JsonTarget<'a>>,
    syscalls: Vec<SyscallRow>,
    totals: Totals,
    threads: &'a [crate::recording::ThreadTimes],
    stacks: &'a [crate::recording::StackRecord],
    runqueue_hist_log2_ns: &'a BTreeMap<u32, Vec<u64>>,
    sample_hz: u64,
    cuda: Option<JsonCuda<'a>>,
    /// The findings with their `message` and `advice` written in.
    findings: Vec<crate::recording::cuda::Finding>,
    lost_events: u64,
    lost_detail: &'a BTreeMap<String, u64>,
    notes: &'a [String],
    /// How the tracer worked (probe timings, interpreter internals): what
    /// the text report shows with `--verbose` (schema 1.x addition; absent
    /// when empty).
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    details: &'a [String],
    /// Set when the recording ends at a checkpoint (the tracer did not finish); null otherwise.
    cut: Option<&'a crate::recording::Cut>,
    /// `record --timeline`: how many events the recording's timeline holds
    /// and how many it dropped; absent without a timeline.
    #[serde(skip_serializing_if = "Option::is_none")]
    timeline: Option<crate::report::timeline_summary::TimelineSummary>,
    /// The bottleneck verdict (docs/verdict.md).
    verdict: super::verdict::Verdict,
    /// What tracing cost (docs/overhead.md); null for recordings made
    /// before it existed.
    tracer_overhead: Option<&'a crate::recording::overhead::TracerOverhead>,
    /// asyncio event loops (`record --async`); absent when none was found.
    #[serde(skip_serializing_if = "Option::is_none")]
    asyncio: Option<crate::recording::asyncio::AsyncioReport>,
    /// Resident memory per process (docs/memory.md); absent with
    /// `--no-memory` and for older recordings.
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<&'a crate::recording::memory::MemoryReport>,
    /// GIL waits by the thread that held the GIL (docs/python.md#gil-holders);
    /// absent without GIL waits.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    gil_holders: &'a [crate::recording::GilHold],
}

pub fn render(rec: &Recording) -> String {
    let mut out = Vec::new();
    if let Err(e) = render_to(rec, &mut out) {
        return format!("{{\"error\": \"{e}\"}}\n");
    }
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// [`render`], gzip-compressed as it is written: what the agent keeps for
/// `/report/latest` (a busy window's report is tens of MB as text, a
/// tenth of that compressed, and never whole in memory).
pub fn render_gzip(rec: &Recording) -> std::io::Result<Vec<u8>> {
    use flate2::{write::GzEncoder, Compression};
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    render_to(rec, &mut gz)?;
    gz.finish()
}

/// The report of `rec` as pretty JSON into `w`, with what a terminal would
/// act on \u-escaped ([`super::fmt::printable_json`]).
pub fn render_to(rec: &Recording, w: impl std::io::Write) -> std::io::Result<()> {
    use std::io::Write as _;
    let rows: Vec<SyscallRow> = syscall_rows(rec).into_values().flatten().collect();
    let report = JsonReport {
        schema_version: SCHEMA_VERSION,
        tool_version: &rec.tool_version,
        recording_format_version: rec.format_version,
        host: &rec.host,
        started_unix_ms: rec.started_unix_ms,
        duration_ns: rec.duration_ns,
        targets: targets(rec)
            .into_iter()
            .map(|t| JsonTarget {
                pid: t.pid,
                ppid: t.ppid,
                comm: &t.comm,
                exe: t.exe.as_deref(),
                cmdline: &t.cmdline,
                origin: t.origin,
                exit_code: t.exit_code,
            })
            .collect(),
        totals: totals(&rows),
        syscalls: rows,
        threads: &rec.threads,
        stacks: &rec.stacks,
        runqueue_hist_log2_ns: &rec.runqueue_hist,
        sample_hz: rec.sample_hz,
        cuda: rec.cuda.as_ref().map(|c| JsonCuda {
            calls: &c.calls,
            launches: &c.launches,
            gpu_samples: &c.gpu_samples,
            libraries: &c.libraries,
            notes: &c.notes,
            events_lost: c.events_lost,
            calls_lost: c.calls_lost,
            driver_probes_off: &c.driver_probes_off,
            launch_sampling: c.launch_sampling.as_ref(),
            graph_launches: &c.graph_launches,
            graph_captures: &c.graph_captures,
            collectives: &c.collectives,
            device_memory: &c.device_memory,
        }),
        findings: rec.cuda.as_ref().map(|c| super::findings::cuda_worded(&c.findings)).unwrap_or_default(),
        lost_events: rec.lost_events(),
        lost_detail: &rec.lost,
        notes: &rec.notes,
        details: &rec.details,
        cut: rec.cut.as_ref(),
        timeline: rec.timeline.as_ref().map(crate::report::timeline_summary::TimelineSummary::of),
        verdict: super::verdict::verdict(rec),
        tracer_overhead: rec.tracer_overhead.as_ref(),
        asyncio: rec.asyncio.as_ref().map(super::findings::async_worded),
        memory: rec.memory.as_ref(),
        gil_holders: &rec.gil_holders,
    };
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, super::fmt::PrintableJsonWriter::new(w));
    serde_json::to_writer_pretty(&mut out, &report)?;
    out.write_all(b"\n")?;
    out.into_inner().map_err(|e| e.into_error())?.into_inner()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn has_contract_fields() {
        let rec = crate::recording::tests::sample();
        let v: serde_json::Value = serde_json::from_str(&super::render(&rec)).unwrap();
        assert_eq!(v["schema_version"], 1);
        assert_eq!(v["duration_ns"], 1_000_000_000u64);
        assert_eq!(v["targets"][0]["pid"], 10);
        assert_eq!(v["targets"][0]["origin"], "launched");
        let s = &v["syscalls"][0];
        assert_eq!(s["name"], "openat");
        assert_eq!(s["nr"], 257);
        assert_eq!(s["count"], 5);
        assert_eq!(s["errors"], 3);
        assert_eq!(s["errnos"]["ENOENT"], 3);
        assert_eq!(s["hist_log2_ns"].as_array().unwrap().len(), 40);
        assert_eq!(v["lost_events"], 0);
        assert!(v["cut"].is_null());
    }

    #[test]
    fn a_checkpoint_says_it_is_cut() {
        let mut rec = crate::recording::tests::sample();
        rec.cut = Some(crate::recording::Cut { reason: crate::recording::CutReason::Checkpoint, at_unix_ms: 1234 });
        let v: serde_json::Value = serde_json::from_str(&super::render(&rec)).unwrap();
        assert_eq!(v["cut"]["reason"], "checkpoint");
        assert_eq!(v["cut"]["at_unix_ms"], 1234);
    }
}
