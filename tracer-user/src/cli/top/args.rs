//! `infertrace top`'s command line (the live view itself is the rest of this module).

use std::{io::Write as _, process::ExitCode, time::Duration};

use anyhow::{bail, Context as _};
use clap::Args;

use crate::{
    cli::parse::{parse_frequency, parse_pid, parse_refresh},
    engine::{self, session},
    families::sched::SchedOptions,
};

#[derive(Args)]
pub struct TopArgs {
    /// Trace a running process (all its threads, and processes it starts). Repeatable.
    #[arg(short = 'p', long = "pid", value_name = "PID", value_parser = parse_pid, allow_negative_numbers = true)]
    pub pids: Vec<u32>,
    /// Also every running CPython process (an executable named python*, or one that maps libpython*).
    #[arg(long)]
    pub python: bool,
    /// How often the screen is redrawn, 100ms to 1m.
    #[arg(long, value_parser = parse_refresh, default_value = "1s", value_name = "DURATION", allow_hyphen_values = true)]
    pub refresh: Duration,
    /// CPU sampling frequency in Hz, on every CPU, 0 to 10000 (0 turns sampling off).
    #[arg(short = 'F', long, default_value_t = engine::DEFAULT_FREQUENCY, value_name = "HZ",
          value_parser = parse_frequency, allow_negative_numbers = true)]
    pub frequency: u64,
    /// Do not probe CUDA (libcudart, libcuda), and do not sample the GPUs.
    #[arg(long)]
    pub no_cuda: bool,
}

pub fn run(args: TopArgs) -> anyhow::Result<ExitCode> {
    let TopArgs { pids, python, refresh, frequency, no_cuda } = args;
    if pids.is_empty() && !python {
        bail!("nothing to watch (hint: give -p PID (repeatable) or --python)");
    }
    let sched = SchedOptions { frequency, ..SchedOptions::default() };
    let record = session::RecordOptions { pids, sched, cuda: !no_cuda, asyncio: crate::families::python::asyncio::record::AsyncOptions { enabled: false, ..Default::default() }, ..session::RecordOptions::default() };
    let opts = crate::cli::top::TopOptions { record, python, refresh };
    let argv: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let outcome = rt.block_on(crate::cli::top::run(opts, argv)).map_err(|e| anyhow::anyhow!("{e} (hint: {})", e.hint()))?;
    let secs = outcome.recording.duration_ns as f64 / 1e9;
    let _ = writeln!(std::io::stderr(), "infertrace top: watched {} process{} for {secs:.1}s; every probe detached", outcome.pids.len(), if outcome.pids.len() == 1 { "" } else { "es" });
    Ok(ExitCode::SUCCESS)
}
