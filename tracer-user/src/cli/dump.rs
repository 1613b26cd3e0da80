//! `infertrace dump`: the Python stacks (or asyncio task trees) of a live process, like `py-spy dump`.

use std::{
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::bail;
use clap::{Args, ValueEnum};

use super::parse::parse_pid;
use crate::{families::python, report::{self, fmt::printable}};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DumpFormat {
    Text,
    Json,
}

#[derive(Args)]
pub struct DumpArgs {
    /// The process.
    #[arg(short = 'p', long = "pid", value_name = "PID", value_parser = parse_pid, allow_negative_numbers = true)]
    pub pid: u32,
    #[arg(long, value_enum, default_value = "text")]
    pub format: DumpFormat,
    /// Also show native frames below the Python ones (text only).
    #[arg(long)]
    pub native: bool,
    /// Instead of the threads' stacks, the asyncio task tree of every event loop (like
    /// `python -m asyncio pstree`): each task's name and id, state (running, awaiting what,
    /// ready, done), coroutine stack with the line of each `await`, the tasks awaiting it.
    /// CPython 3.14+ (the asyncio offsets it publishes). The process is held still
    /// (ptrace-seized, no signal) for the few milliseconds of the read, as py-spy's dump does.
    #[arg(long = "async", conflicts_with = "native")]
    pub async_tasks: bool,
}

pub fn run(args: DumpArgs) -> anyhow::Result<ExitCode> {
    let DumpArgs { pid, format, native, async_tasks } = args;
    crate::engine::targets::validate_pid(pid).map_err(|e| anyhow::anyhow!("{e} (hint: {})", e.hint()))?;
    // --async: hold the process still from the attach (which checks its
    // frames) to the end of the read (python/pause.rs); let go on return.
    let _paused = async_tasks.then(|| {
        let (paused, not_held) = python::pause::Paused::pause(pid);
        if not_held > 0 {
            eprintln!("note: {not_held} thread(s) of pid {pid} could not be paused (already traced?): reading while they run");
        }
        paused
    });
    let mut interp = match python::Interpreter::attach(pid) {
        Ok(Some(i)) => i,
        Ok(None) => bail!("pid {pid} is not running CPython (hint: `infertrace dump` reads CPython {} stacks)", python::SUPPORTED),
        Err(e @ python::PythonError::Unsupported { .. }) => {
            bail!("pid {pid}: {e}; no Python stacks to dump (hint: `infertrace record -p {pid}` still traces its {})", python::STILL_TRACED)
        }
        Err(e) => bail!("{e} (hint: {})", e.hint()),
    };
    if let Some(note) = interp.layout_note() {
        eprintln!("note: {}", printable(note));
    }
    // Every walk over the process's memory ends by then (hostile or
    // corrupted structures: python/walk.rs), with a note.
    interp.set_deadline(Some(Instant::now() + DUMP_TIME));
    let r = if async_tasks { dump_async(&mut interp, format) } else { dump_stacks(&mut interp, format, native) };
    // Said even when the read failed: why it may have.
    for note in interp.take_walk_notes() {
        eprintln!("note: {}", printable(&note));
    }
    r
}

/// How long `dump` may read the process's memory.
const DUMP_TIME: Duration = Duration::from_secs(3);

fn dump_stacks(interp: &mut python::Interpreter, format: DumpFormat, native: bool) -> anyhow::Result<ExitCode> {
    let pid = interp.pid();
    let dumps = interp.dump().map_err(|e| anyhow::anyhow!("reading the stacks of pid {pid} failed: {e} (hint: retry; the process may have exited)"))?;
    match format {
        DumpFormat::Text => print!("{}", report::dump::render_dump_text(&dumps, native)),
        DumpFormat::Json => print!("{}", report::dump::render_dump_json(&dumps)),
    }
    Ok(ExitCode::SUCCESS)
}

/// `dump --async`: the asyncio task tree (python/asyncio, report/async_dump).
fn dump_async(interp: &mut python::Interpreter, format: DumpFormat) -> anyhow::Result<ExitCode> {
    use crate::families::python::asyncio::AsyncioReader;
    let pid = interp.pid();
    let reader = AsyncioReader::new(interp).map_err(|e| anyhow::anyhow!("pid {pid}: {e} (hint: {})", e.hint()))?;
    // A task list the loop is changing right now reads inconsistent: read again.
    let mut tries = 0;
    let loops = loop {
        match reader.read(interp) {
            Ok(l) => break l,
            Err(python::asyncio::AsyncioError::Inconsistent { .. }) if tries < 20 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Err(e) => bail!("reading the asyncio tasks of pid {pid} failed: {e} (hint: {})", e.hint()),
        }
    };
    match format {
        DumpFormat::Text => print!("{}", report::async_dump::render_async_text(&loops)),
        DumpFormat::Json => print!("{}", report::async_dump::render_async_json(&loops)),
    }
    Ok(ExitCode::SUCCESS)
}
