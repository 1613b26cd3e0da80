//! However infertrace is stopped, its BPF programs go away with it; on
//! SIGINT/SIGTERM it still writes a readable recording.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs;
use std::time::{Duration, Instant};

use infertrace_e2e::*;

fn stop_and_check(test: &str, sig: i32) {
    let dir = TempDir::new(test);
    let out = dir.join("rec.itr");
    let before = bpf_prog_ids();
    let tracer = spawn(
        infertrace(["record", "-q", "-o"])
            .arg(&out)
            .args(["--", "sleep", "30"])
            .current_dir(dir.path()),
    );
    let tpid = tracer.id();
    let mut guard = KillOnDrop::new(tpid);
    let ids = wait_for_tracer_progs(tpid, &before, Duration::from_secs(10)).unwrap_or_else(|| {
        panic!("{test}: infertrace's sys_enter/sys_exit never showed up in bpftool")
    });
    // The launched `sleep`, to clean up whatever infertrace does with it.
    let kids = poll(Duration::from_secs(5), || {
        let k = children_of(tpid);
        (!k.is_empty()).then_some(k)
    })
    .unwrap_or_default();
    let _kid_guards: Vec<KillOnDrop> = kids.iter().map(|k| KillOnDrop::new(*k)).collect();

    let sent = Instant::now();
    kill(tpid, sig);
    let r = wait_child(
        tracer,
        Duration::from_secs(10),
        &format!("{test}: infertrace after signal {sig}"),
    );
    guard.disarm();
    let exited = sent.elapsed();

    let left = poll(Duration::from_secs(2), || {
        let now = bpf_prog_ids();
        let left: Vec<u64> = ids.iter().copied().filter(|i| now.contains(i)).collect();
        left.is_empty().then_some(())
    });
    assert!(
        left.is_some(),
        "{test}: programs {ids:?} still loaded 2 s after infertrace exited ({:?} after the signal); now: {:?}\n{}",
        exited,
        bpf_progs().into_iter().filter(|p| ids.contains(&p.id)).collect::<Vec<_>>(),
        r.describe()
    );

    if sig == libc::SIGKILL {
        return;
    }
    r.assert_ok();
    assert!(
        out.is_file(),
        "{test}: no recording written\n{}",
        r.describe()
    );
    let rep = run_infertrace([
        OsStr::new("report"),
        out.as_os_str(),
        OsStr::new("--format"),
        OsStr::new("json"),
    ]);
    rep.assert_ok();
    let rep = rep.json();
    rep.check_invariants();
    let t = rep.one_target("launched");
    assert_eq!(t["comm"], "sleep", "{t}");
    assert!(
        kids.contains(&(t["pid"].as_u64().unwrap() as u32)),
        "launched pid {t} not among children {kids:?}"
    );
    // The report on stdout at exit was the text report.
    assert!(
        r.stdout.contains(TEXT_HEADER),
        "{test}: no text report on stdout\n{}",
        r.describe()
    );
    // No temporary file left next to the recording.
    assert_eq!(dir.entries(), vec!["rec.itr".to_string()]);
    let _ = fs::remove_file(&out);
}

#[test]
fn sigint_unloads_programs_and_writes_recording() {
    require!(
        "sigint_unloads_programs_and_writes_recording",
        Root,
        Binary,
        Bpftool
    );
    stop_and_check("cleanup-sigint", libc::SIGINT);
}

#[test]
fn sigterm_unloads_programs_and_writes_recording() {
    require!(
        "sigterm_unloads_programs_and_writes_recording",
        Root,
        Binary,
        Bpftool
    );
    stop_and_check("cleanup-sigterm", libc::SIGTERM);
}

#[test]
fn sigkill_unloads_programs() {
    require!("sigkill_unloads_programs", Root, Binary, Bpftool);
    stop_and_check("cleanup-sigkill", libc::SIGKILL);
}

/// A process holding private copies of tests/cudasim's stand-in libcudart
/// and libcuda (NOT CUDA); on each line of stdin it answers how many of
/// three probed functions start with int3 (`N/3`).
const HOLD_CUDA: &str = r#"
import ctypes, sys
rt, drv = ctypes.CDLL(sys.argv[1]), ctypes.CDLL(sys.argv[2])
fns = [rt.cudaMemcpyAsync, rt.cudaStreamSynchronize, drv.cuMemcpyHtoDAsync_v2]
addrs = [ctypes.cast(f, ctypes.c_void_p).value for f in fns]
int3 = b"\xcc"
print("ready", flush=True)
for _ in sys.stdin:
    print(f"{sum(ctypes.string_at(a, 1) == int3 for a in addrs)}/3", flush=True)
"#;

/// After `record -p` of a process with CUDA libraries probed (127
/// functions: tests/cudasim's stand-ins) ends, no breakpoint is left in
/// the process and no link or program of the tracer is left in the kernel.
/// `perf_events`: the probes a kernel without multi-uprobe links gets (one
/// perf event per function and kind), forced by a test-only variable.
fn cuda_probes_released(test: &str, perf_events: bool) {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};

    let (Some(standin), Some(python)) = (cuda_standin_dir(test), python3_executable(test)) else { return };
    let dir = TempDir::new(test);
    // Copies of our own: other tracers' probes never reach them.
    for lib in ["libcudart.so.12", "libcuda.so.1"] {
        fs::copy(standin.join(lib), dir.join(lib)).unwrap_or_else(|e| panic!("copying {lib}: {e}"));
    }
    let mut target = Command::new(&python)
        .args(["-c", HOLD_CUDA])
        .arg(dir.join("libcudart.so.12"))
        .arg(dir.join("libcuda.so.1"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting python3");
    let _target_guard = KillOnDrop::new(target.id());
    let mut ask = target.stdin.take().unwrap();
    let mut answers = BufReader::new(target.stdout.take().unwrap()).lines();
    let mut next = move || answers.next().and_then(Result::ok).unwrap_or_default();
    assert_eq!(next(), "ready");
    let mut probed = move || {
        writeln!(ask, "?").and_then(|_| ask.flush()).expect("asking the target");
        next()
    };

    let out = dir.join("rec.itr");
    // `--verbose`: the notes of each library's probes are counted below.
    let mut cmd = infertrace(["record", "--verbose", "--duration", "3s", "-p"]);
    cmd.arg(target.id().to_string()).arg("-o").arg(&out);
    if perf_events {
        cmd.env("INFERTRACE_TEST_NO_UPROBE_MULTI", "1");
    } else {
        cmd.env_remove("INFERTRACE_TEST_NO_UPROBE_MULTI");
    }
    let tracer = spawn(&mut cmd);
    let tpid = tracer.id();
    let mut guard = KillOnDrop::new(tpid);
    // Every function probed, and the tracer's CUDA programs linked.
    let held = poll(Duration::from_secs(15), || {
        if probed() != "3/3" {
            return None;
        }
        let progs = held_prog_ids(tpid);
        let cuda: Vec<u64> =
            bpf_progs().into_iter().filter(|p| progs.contains(&p.id) && p.name.starts_with("cuda_")).map(|p| p.id).collect();
        let links = held_link_ids(tpid);
        let linked = bpf_links().unwrap_or_default().into_iter().filter(|(l, p)| links.contains(l) && cuda.contains(p)).count();
        // 10 programs: 9 for the runtime and driver, `cuda_usdt` for PyTorch's allocator.
        (cuda.len() == 10 && linked > 0).then_some((progs, links, linked))
    });
    let Some((progs, links, linked)) = held else {
        panic!("{test}: the CUDA probes never appeared\n{}", wait_child(tracer, Duration::from_secs(60), test).describe())
    };
    let r = wait_child(tracer, Duration::from_secs(120), &format!("{test}: infertrace"));
    guard.disarm();
    r.assert_ok();
    let functions: u64 = r
        .stdout
        .lines()
        .filter_map(|l| l.strip_suffix(" functions probed")?.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    // The stand-ins export every probed function: 54 of the runtime, 73 of
    // the driver.
    assert_eq!(functions, 127, "{test}\n{}", r.describe());
    // Multi-uprobe links: one per program for the runtime's file (9 programs),
    // and one per function and kind for the driver, pid-scoped so that a
    // driver function can be taken off per process (docs/cuda.md): at most
    // 2 x 73; perf events take one per function and kind for both.
    if !perf_events {
        assert!(linked <= 9 + 2 * 73, "{test}: {linked} links\n{}", r.describe());
    }
    // Released before exit: no breakpoint left in the target...
    assert_eq!(probed(), "0/3", "{test}: breakpoints left after infertrace exited\n{}", r.describe());
    // ...and nothing of ours in the kernel (ids are freed just after).
    let left = poll(Duration::from_secs(2), || {
        let now_progs = bpf_prog_ids();
        let now_links: HashSet<u64> = bpf_links().unwrap_or_default().into_iter().map(|(l, _)| l).collect();
        let left: Vec<u64> =
            progs.iter().chain(links.iter()).copied().filter(|id| now_progs.contains(id) || now_links.contains(id)).collect();
        left.is_empty().then_some(())
    });
    assert!(left.is_some(), "{test}: programs {progs:?} or links {links:?} still there 2 s after exit\n{}", r.describe());
    // Its stdin closed, the target exits.
    drop(probed);
    let _ = target.wait();
}

#[test]
fn cuda_probes_released_at_exit() {
    require!("cuda_probes_released_at_exit", Root, Binary, Bpftool);
    cuda_probes_released("cuda_probes_released_at_exit", false);
}

#[test]
fn cuda_perf_event_probes_released_at_exit() {
    require!("cuda_perf_event_probes_released_at_exit", Root, Binary, Bpftool);
    cuda_probes_released("cuda_perf_event_probes_released_at_exit", true);
}
