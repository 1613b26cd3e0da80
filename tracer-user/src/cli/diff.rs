//! `infertrace diff`: compare two recordings (the verify step), with an exit code for CI.

use std::{io::Write as _, path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::Args;

use super::parse::{parse_max_inflated, parse_pct};
use crate::{
    recording::{ReadLimits, Recording},
    report::{self, fmt::printable},
};

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DiffFormat {
    /// Tables per process: classes, Python lines and CUDA lines, before and after.
    Text,
    /// The same as JSON.
    Json,
    /// One self-contained page: the two verdicts side by side, the changes as bars (use -o FILE.html).
    Html,
}

#[derive(Args)]
pub struct DiffArgs {
    /// The recording before the change.
    pub before: PathBuf,
    /// The recording after it.
    pub after: PathBuf,
    #[arg(long, value_enum, default_value = "text")]
    pub format: DiffFormat,
    /// Write the diff here instead of stdout (as a new file, never through a planted link).
    #[arg(short, long, value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// Exit with code 3 when --metric grew by more than PCT percent (e.g. 10).
    #[arg(long, value_name = "PCT", value_parser = parse_pct, allow_negative_numbers = true)]
    pub fail_if_slower: Option<f64>,
    /// What --fail-if-slower checks: total, a class, file.py:LINE or cuda:file.py:LINE.
    #[arg(long, value_name = "METRIC", default_value = "total")]
    pub metric: String,
    /// Read at most this much inflated data per recording (as for `report`).
    #[arg(long, value_name = "SIZE", value_parser = parse_max_inflated, allow_hyphen_values = true)]
    pub max_inflated: Option<u64>,
}

pub fn run(args: DiffArgs) -> anyhow::Result<ExitCode> {
    let DiffArgs { before, after, format, output, fail_if_slower, metric, max_inflated } = args;
    let limits = max_inflated.map(ReadLimits::plain).unwrap_or_default();
    let read = |p: &PathBuf| Recording::read_limited(p, limits).map_err(|e| anyhow::anyhow!("{e} (hint: {})", e.hint()));
    let (before, after) = (read(&before)?, read(&after)?);
    let d = report::diff::diff(&before, &after);
    // The metric is checked before anything is printed: a wrong name is an error, not a pass.
    let checked = match fail_if_slower {
        Some(pct) => Some((
            pct,
            report::diff::metric(&d, &metric).map_err(|e| {
                anyhow::anyhow!("{e} (hint: `total`, a class such as `gpu_sync`, or a line as the diff prints it, e.g. `serve.py:42` or `cuda:serve.py:40`)")
            })?,
        )),
        None => None,
    };
    let rendered = match format {
        DiffFormat::Text => report::diff::render_text(&d),
        DiffFormat::Json => report::diff::render_json(&d),
        DiffFormat::Html => report::html::diff::render(&before, &after, &d),
    };
    match output {
        Some(out) => crate::recording::output::Output::prepare(&out)
            .and_then(|o| o.write_bytes(rendered.as_bytes()))
            .with_context(|| format!("cannot write {} (hint: choose a writable path)", out.display()))?,
        None => {
            let mut so = std::io::stdout().lock();
            so.write_all(rendered.as_bytes()).and_then(|()| so.flush()).context("cannot write the diff to stdout (hint: use -o FILE)")?;
        }
    }
    let Some((pct, c)) = checked else { return Ok(ExitCode::SUCCESS) };
    let change = c.change_pct.map(|p| format!("{p:+.1}%")).unwrap_or_else(|| "no time before".into());
    let regressed = match c.change_pct {
        Some(p) => p > pct,
        None => c.after > 0.0,
    };
    let verdict = if regressed { format!("REGRESSED beyond {pct}%") } else { format!("within {pct}%") };
    let _ = writeln!(std::io::stderr(), "infertrace diff: {} {:.3} -> {:.3} ({change}): {verdict}", printable(&c.metric), c.before, c.after);
    Ok(if regressed { ExitCode::from(3) } else { ExitCode::SUCCESS })
}
