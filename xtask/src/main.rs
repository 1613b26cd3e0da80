//! Developer tasks for infertrace: `cargo xtask <command>`.
mod bench;
mod bench_floors;
mod bench_self;
mod podman;
mod pyroot;
mod readers;
mod setup;
mod soak;
mod soak_agent;
mod tasks;
mod util;

use std::{ffi::OsString, process::ExitCode};

use anyhow::{bail, Result};

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  setup    install what building and testing need, when missing: nightly
           rust-src, bpf-linker (against the nightly's LLVM), Debian packages
           (strace bpftool bpftrace jq linux-perf gcc libc6-dev make
           util-linux), py-spy
  build    setup, then `cargo build --release -p tracer-user`
           (-> target/release/infertrace)
             --toolchain-only   set up only the toolchain (nightly rust-src,
                                bpf-linker), none of the tests' fixtures: the
                                container image's build (deploy/Dockerfile)
  demo     build, then record tests/workloads/demo.py with infertrace and
           print its report
  test     build, then unit tests and end-to-end tests (needs root)
             --unit        unit tests only
             --e2e         end-to-end tests only
             -- ARGS...    passed to the test binaries of both runs
                           (e.g. a name filter, --nocapture)
  bench    build, then one table of Python workloads (tests/workloads/)
           untraced and traced, in ns/iteration and x untraced (~2-3 min):
             syscall loop  os.read+os.write: infertrace (goal <= 1.4x),
                           --no-sched, on an idle pid (the floor), bpftrace,
                           strace -c, perf trace -s,
                           perf record -g, bpftrace offcputime, py-spy
             cpu loop      pure-Python arithmetic: infertrace (<= 1.05x),
                           perf record -g, bpftrace offcputime
             fib           recursive fib, Python attribution: infertrace
                           (<= 1.05x), --no-python, py-spy record --rate 99
             ping-pong     two processes over pipes: infertrace (<= 1.3x),
                           --no-offcpu-stacks, --no-sched, perf record -g,
                           bpftrace offcputime
             cuda copy,    cudaMemcpyAsync / cudaLaunchKernel /
             cuda launch,  cudaGraphLaunch / cudaEventRecord on the
             cuda graph,   tests/cudasim stand-in: infertrace's cost per
             cuda event    call (copy, event: entry+return probes;
                           launch, graph: entry)
           and under the table the time from SIGINT to exit with 127 CUDA
           functions probed (goal <= 1.5 s) and with --no-cuda
           missing tools give n/a; tracer logs in target/bench/
             --no-build    use the infertrace binary as it is (no setup/build)
             --stop        only the time from SIGINT to exit (~1 min)
             --only NAME   only the workloads whose name contains NAME
                           (e.g. cuda, \"syscall loop\"), no stop line
             --self        instead, the tracer's own cost (~2 min): start-up
                           (wall, CPU, by phase), CPU, steady CPU, peak and
                           steady memory, stop and report times, for
                           record -p (idle, busy, CUDA stand-in, 50
                           targets), launch mode, top and the agent
           floors (same run): bpftrace with empty actions (raw_syscalls
           enter+exit; uprobe and uprobe+uretprobe on the stand-in's copy
           and launch functions) and infertrace on an idle pid (the
           syscall loop's floor); infertrace rows show their ratio to the
           floor (\"vs floor\"), goals as that ratio
  soak     build, then N minutes of thread and process churn (850 threads/s,
           ~10 processes/s, tests/workloads/churn.c) under `infertrace
           record -p`: the tracer's RSS at each minute, the recording's
           size, `report`'s time and memory on it (needs root; not in `test`)
             --minutes N   minutes of churn (default 10; 30 with --agent)
             --no-build    use the infertrace binary as it is
             --agent       instead: `infertrace agent --python` under 5 new
                           Python processes/s (each its own environment)
                           and 50 busy ones: its RSS and open descriptors
                           each minute, the growth from minute 2 to the end
             --window D    with --agent: the agent's --window (default 60s)
  help     this text
";

fn main() -> ExitCode {
    util::ensure_cargo_bin_on_path();
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match dispatch(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(args: Vec<OsString>) -> Result<()> {
    let Some((cmd, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        bail!("no command given");
    };
    let cmd = cmd.to_string_lossy();
    let no_args = |name: &str| -> Result<()> {
        if let Some(a) = rest.first() {
            bail!(
                "`{name}` takes no arguments (got {:?}); see `cargo xtask help`",
                a
            );
        }
        Ok(())
    };
    match cmd.as_ref() {
        "setup" => {
            no_args("setup")?;
            setup::setup()
        }
        "build" => match (rest.len(), rest.first().and_then(|a| a.to_str())) {
            (0, _) => tasks::build(),
            (1, Some("--toolchain-only")) => tasks::build_toolchain_only(),
            _ => bail!("`build` takes only --toolchain-only; see `cargo xtask help`"),
        },
        "demo" => {
            no_args("demo")?;
            tasks::demo()
        }
        "test" => tasks::test(parse_test_args(rest)?),
        "bench" => {
            let (mut build, mut stop_only, mut only, mut own) = (true, false, None, false);
            let mut iter = rest.iter();
            while let Some(a) = iter.next() {
                match a.to_str() {
                    Some("--no-build") => build = false,
                    Some("--stop") => stop_only = true,
                    Some("--self") => own = true,
                    Some("--only") => {
                        only = iter.next().and_then(|v| v.to_str()).map(str::to_string);
                        if only.is_none() {
                            bail!("--only needs a workload name (hint: --only cuda)");
                        }
                    }
                    _ => bail!("`bench` takes only --no-build, --self, --stop and --only NAME; see `cargo xtask help`"),
                }
            }
            if own {
                if stop_only || only.is_some() {
                    bail!("`bench --self` takes only --no-build");
                }
                return bench_self::bench_self(build);
            }
            bench::bench(build, stop_only, only.as_deref())
        }
        "soak" if rest.iter().any(|a| a == "--agent") => soak_agent::soak(parse_agent_soak_args(rest)?),
        "soak" => soak::soak(parse_soak_args(rest)?),
        "help" | "-h" | "--help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => {
            eprint!("{USAGE}");
            bail!("unknown command `{other}`")
        }
    }
}

fn parse_soak_args(rest: &[OsString]) -> Result<soak::SoakArgs> {
    let mut args = soak::SoakArgs { minutes: 10, build: true };
    let mut iter = rest.iter();
    while let Some(a) = iter.next() {
        match a.to_str() {
            Some("--no-build") => args.build = false,
            Some("--minutes") => {
                let v = iter.next().and_then(|v| v.to_str()).unwrap_or("");
                args.minutes = match v.parse() {
                    Ok(n) if (1..=24 * 60).contains(&n) => n,
                    _ => bail!("--minutes takes a whole number of minutes from 1 to 1440 (got {v:?})"),
                };
            }
            _ => bail!("unknown option {a:?} for `soak`; see `cargo xtask help`"),
        }
    }
    Ok(args)
}

fn parse_agent_soak_args(rest: &[OsString]) -> Result<soak_agent::AgentSoakArgs> {
    let mut args = soak_agent::AgentSoakArgs { minutes: 30, build: true, window: "60s".into() };
    let mut iter = rest.iter();
    while let Some(a) = iter.next() {
        match a.to_str() {
            Some("--agent") => {}
            Some("--no-build") => args.build = false,
            Some("--window") => {
                args.window = iter.next().and_then(|v| v.to_str()).unwrap_or("").to_owned();
                if args.window.is_empty() {
                    bail!("--window takes a duration (e.g. 60s)");
                }
            }
            Some("--minutes") => {
                let v = iter.next().and_then(|v| v.to_str()).unwrap_or("");
                args.minutes = match v.parse() {
                    Ok(n) if (3..=24 * 60).contains(&n) => n,
                    _ => bail!("--minutes takes a whole number of minutes from 3 to 1440 with --agent (got {v:?})"),
                };
            }
            _ => bail!("unknown option {a:?} for `soak --agent`; see `cargo xtask help`"),
        }
    }
    Ok(args)
}

fn parse_test_args(rest: &[OsString]) -> Result<tasks::TestArgs> {
    let (mut unit, mut e2e) = (false, false);
    let mut harness_args = Vec::new();
    let mut iter = rest.iter();
    while let Some(a) = iter.next() {
        match a.to_str() {
            Some("--unit") => unit = true,
            Some("--e2e") => e2e = true,
            Some("--") => {
                harness_args.extend(iter.by_ref().cloned());
            }
            _ => bail!(
                "unknown option {a:?} for `test`; arguments for the test binaries go after `--`"
            ),
        }
    }
    if !unit && !e2e {
        (unit, e2e) = (true, true);
    }
    Ok(tasks::TestArgs {
        unit,
        e2e,
        harness_args,
    })
}
