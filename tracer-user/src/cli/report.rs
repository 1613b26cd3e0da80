//! `infertrace report`: render a recording in any format (needs no privileges).

use std::{io::Write as _, path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Args, ValueEnum};

use super::parse::parse_max_inflated;
use crate::{
    recording::{output::Output, ReadLimits, Recording},
    report::{self, folded::Profile},
};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The verdict, then strace -c style tables, wall-time breakdown and top stacks (compact unless --verbose).
    Text,
    /// Machine-readable report (docs/report-schema.md).
    Json,
    /// Folded stacks (flamegraph.pl, inferno, speedscope).
    Folded,
    /// A flame graph, rendered in-process.
    Svg,
    /// speedscope JSON (speedscope.app): one profile per thread, for --profile cpu|off-cpu|wall (per process for memory).
    Speedscope,
    /// Gzipped pprof profile.proto (go tool pprof, Pyroscope, Grafana): samples/count, cpu/nanoseconds,
    /// off_cpu/nanoseconds, a `thread` label per sample; with --profile memory: resident_growth/bytes and
    /// resident_release/bytes, a `process` label (binary; use -o FILE).
    Pprof,
    /// Perfetto protobuf trace of the timeline (ui.perfetto.dev; needs `record --timeline`; binary, use -o FILE).
    Perfetto,
    /// One self-contained page (use -o FILE.html; opens offline in any browser): the verdict with its lines,
    /// per-thread bars, flame graphs (cpu, off-cpu, wall, memory), the series as charts, with --timeline a
    /// zoomable thread strip, the tables and the tracer's cost (docs/html.md).
    Html,
}

#[derive(Args)]
pub struct ReportArgs {
    /// The .itr file written by `infertrace record`.
    pub file: PathBuf,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// What the folded/svg/speedscope/pprof output weighs: CPU samples, off-CPU time, both (wall), or
    /// resident memory growth in bytes (memory: the stacks the memory family sampled).
    #[arg(long, value_enum, default_value = "cpu")]
    pub profile: Profile,
    /// Text report: show every process, row, stack, histogram and detail (by default a compact report: the
    /// busiest processes and the top rows, two screens for a short run).
    #[arg(short, long)]
    pub verbose: bool,
    /// Write the report here instead of stdout.
    #[arg(short, long, value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// Read at most this much inflated recording data (e.g. 512MiB, 4GiB), for a file you trust. By
    /// default: 1GiB, and past 64MiB at most 100 times the file's size (a gzip bomb inflates 1000 times).
    /// Reading needs a few times this in memory.
    #[arg(long, value_name = "SIZE", value_parser = parse_max_inflated, allow_hyphen_values = true)]
    pub max_inflated: Option<u64>,
}

pub fn run(args: ReportArgs) -> anyhow::Result<ExitCode> {
    let ReportArgs { file, format, profile, verbose, output, max_inflated } = args;
    let limits = max_inflated.map(ReadLimits::plain).unwrap_or_default();
    let rec = Recording::read_limited(&file, limits)
        .map_err(|e| anyhow::anyhow!("{e} (hint: {})", e.hint()))?;
    let text = render(&rec, format, profile, verbose)?;
    match output {
        // As `record -o`: a new file renamed into place, never through a planted link.
        Some(out) => Output::prepare(&out)
            .and_then(|o| o.write_bytes(&text))
            .with_context(|| format!("cannot write {} (hint: choose a writable path)", out.display()))?,
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(&text).and_then(|()| out.flush()).context("cannot write the report to stdout (hint: use -o FILE)")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn render(rec: &Recording, format: Format, profile: Profile, verbose: bool) -> anyhow::Result<Vec<u8>> {
    Ok(match format {
        Format::Text => report::text::render_with(rec, verbose).into_bytes(),
        Format::Json => report::json::render(rec).into_bytes(),
        // Pages made here show the source lines around findings (never the agent's).
        Format::Html => report::html::render(rec, report::html::Options { source: true }).into_bytes(),
        Format::Folded => report::folded::render(rec, profile).into_bytes(),
        Format::Speedscope => report::speedscope::render(rec, profile).into_bytes(),
        Format::Perfetto => report::perfetto::render(rec).map_err(|e| {
            anyhow::anyhow!("{e}: no events to put in a Perfetto trace (hint: record with `infertrace record --timeline ...`)")
        })?,
        Format::Pprof => report::pprof::render(rec, profile).context("encoding the pprof profile (hint: retry; this is an in-memory step)")?,
        Format::Svg => report::svg::render(rec, profile).map_err(|e| match e {
            report::svg::SvgError::Empty if profile == Profile::Memory => anyhow::anyhow!(
                "no memory growth stacks in this recording (hint: record without --no-memory a target whose resident memory grows)"
            ),
            report::svg::SvgError::Empty => anyhow::anyhow!(
                "no {} stacks in this recording (hint: record with sampling on (-F 99) and scheduler tracing (no --no-sched))",
                profile.title()
            ),
            other => anyhow::anyhow!("rendering the flame graph failed: {other}"),
        })?
        .into_bytes(),
    })
}
