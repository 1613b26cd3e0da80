//! Libraries loaded late and called at once: tests/workloads/cuda_dlopen.py
//! loads the REAL libcudart.so.12 (NVIDIA's nvidia-cuda-runtime-cu12
//! wheel, fetched once into target/cuda-real by
//! tests/cudasim/fetch-cudart.sh; every call fails with 35 without a GPU
//! driver but is entered) with ctypes.CDLL and calls it the moment CDLL
//! returns, with no wait for the probes. Every call must be counted, at
//! its Python function and line: the tracer probes the files a target can
//! load before it loads them (its LD_LIBRARY_PATH, its venv's
//! site-packages, ...), in launch and attach mode, through shims, and in a
//! mount namespace of its own.
//!
//! Each test uses its own copy of the library (another inode): uprobes are
//! per file, and tests run in parallel.
//!
//! Needs root, the binary, python3 (pyenv), unshare (util-linux), and PyPI
//! once (or a populated target/cuda-real); under CI=true a missing one
//! fails the test.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use infertrace_e2e::serde_json::Value;
use infertrace_e2e::*;

const WORKLOAD: &str = "tests/workloads/cuda_dlopen.py";

struct Env {
    /// The interpreter itself (not a pyenv shim).
    python: PathBuf,
    /// The real libcudart.so.12.
    real: PathBuf,
}

fn prerequisites(test: &str) -> Option<Env> {
    if !require(test, &[Need::Root, Need::Binary]) {
        return None;
    }
    let real = real_cudart(test)?;
    let python = python3_executable(test)?;
    Some(Env { python, real })
}

fn workload() -> PathBuf {
    workspace_root().join(WORKLOAD)
}

/// `# @name` markers of the workload -> line.
fn markers() -> BTreeMap<String, u64> {
    let text = fs::read_to_string(workload()).unwrap();
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| Some((l.rsplit_once("# @")?.1.trim().to_string(), i as u64 + 1)))
        .collect()
}

/// The copy of the real library at `dir/rel` (directories made).
fn install(env: &Env, dir: &Path, rel: &str) -> PathBuf {
    let p = dir.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::copy(&env.real, &p).unwrap();
    p
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

/// An expected call row: (api, marker of its line, function, kind, count, bytes).
type Expected = (&'static str, &'static str, &'static str, Option<&'static str>, u64, u64);

struct Traced {
    report: Report,
    run: Run,
}

impl Traced {
    fn calls(&self) -> Vec<&Value> {
        let c = &self.report.0["cuda"];
        assert!(c.is_object(), "no `cuda` in the report\n{}", self.run.describe());
        c["calls"].as_array().expect("cuda.calls").iter().collect()
    }

    /// Every note, the report's and the CUDA section's.
    fn notes(&self) -> Vec<String> {
        [&self.report.0["notes"], &self.report.0["cuda"]["notes"]]
            .into_iter()
            .flat_map(|v| v.as_array().into_iter().flatten())
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect()
    }

    /// Asserts the calls, exactly: (api, marker, function, kind, count,
    /// bytes), each failing with 35, and nothing else.
    #[track_caller]
    fn assert_calls(&self, expected: &[Expected]) {
        let lines = markers();
        let calls = self.calls();
        for &(api, marker, function, kind, count, bytes) in expected {
            let line = lines[marker];
            let at: Vec<&&Value> = calls.iter().filter(|c| c["api"] == api && c["site"]["line"] == line).collect();
            assert_eq!(at.len(), 1, "{api} at @{marker} (line {line}): {calls:#?}\n{}", self.run.describe());
            let c = at[0];
            assert_eq!(c["kind"].as_str(), kind, "{api} @{marker}: {c}");
            assert_eq!((u(&c["count"]), u(&c["bytes"]), u(&c["errors"])), (count, bytes, count), "{api} @{marker}: {c}");
            assert_eq!(c["return_codes"], serde_json::json!({ "35": count }), "{api} @{marker}");
            assert_eq!(c["site"]["function"], function, "{api} @{marker}: {c}");
            assert!(c["site"]["file"].as_str().is_some_and(|f| f.ends_with("cuda_dlopen.py")), "{c}");
        }
        let total: u64 = calls.iter().map(|c| u(&c["count"])).sum();
        assert_eq!(total, expected.iter().map(|e| e.4).sum::<u64>(), "calls outside the markers: {calls:#?}");
    }

    /// The note that `lib` was probed before any target loaded it, found in
    /// `source` (`its LD_LIBRARY_PATH`, `its site-packages`).
    #[track_caller]
    fn assert_probed_up_front(&self, lib: &str, source: &str) {
        let notes = self.notes();
        assert!(
            notes.iter().any(|n| n.contains(lib) && n.contains(&format!("(in {source})")) && n.contains("probed before it was loaded")),
            "no note that {lib} was probed up front (in {source}): {notes:#?}"
        );
    }
}

/// `infertrace record -q --format json -o DIR/rec.itr [ARGS]` with `vars`
/// in its environment (the launched command inherits them).
fn record(dir: &TempDir, vars: &[(&str, &OsString)], args: &[OsString]) -> Traced {
    let out = dir.join("rec.itr");
    let mut cmd = infertrace(["record", "-q", "--format", "json", "-o"]);
    cmd.arg(&out).args(args);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let run = run_cmd(&mut cmd, Duration::from_secs(120));
    run.assert_ok();
    let report = run.json();
    let lost = report.0["lost_detail"].as_object().expect("lost_detail");
    assert!(!lost.contains_key("cuda_lost"), "CUDA events lost: {lost:?}");
    Traced { report, run }
}

/// What `now` makes: 20 uploads + syncs in upload(), 7 readbacks.
const NOW: &[Expected] = &[
    ("cudaMemcpyAsync", "upload_copy", "upload", Some("HtoD"), 20, 20 * 4096),
    ("cudaStreamSynchronize", "upload_sync", "upload", None, 20, 0),
    ("cudaMemcpy", "readback_copy", "readback", Some("DtoH"), 7, 7 * 256),
];

fn os(s: impl Into<OsString>) -> OsString {
    s.into()
}

/// Launched through every kind of front: the interpreter itself, its pyenv
/// shim (a bash script that execs `pyenv exec`, which execs the
/// interpreter), `env`, and `bash -c`. The library is a bare soname found
/// through LD_LIBRARY_PATH. Each front twice: loading the library 0.5 s
/// after start (as a program importing torch does), and at once and
/// exiting right after the calls (`STAY_S=0`: the frames resolve from the
/// kernel's copies of the code objects); counts and sites checked.
#[test]
fn called_at_once_after_dlopen_launched() {
    let test = "called_at_once_after_dlopen_launched";
    let Some(env) = prerequisites(test) else { return };
    let shim = pyenv_root().map(|r| r.join("shims/python3")).filter(|p| p.is_file());
    let w = workload();
    let py = env.python.clone();
    let mut fronts: Vec<(&str, Vec<OsString>)> = vec![
        ("interpreter", vec![py.clone().into(), w.clone().into(), os("now")]),
        ("env", vec![os("env"), py.clone().into(), w.clone().into(), os("now")]),
        ("bash -c", vec![os("bash"), os("-c"), os(format!("{} {} now; exit $?", py.display(), w.display()))]),
    ];
    if let Some(shim) = &shim {
        fronts.push(("pyenv shim", vec![shim.clone().into(), w.clone().into(), os("now")]));
    }
    for (front, argv) in fronts {
        for before in ["0.5", "0"] {
            let dir = TempDir::new("cuda-dlopen-launch");
            let lib = install(&env, dir.path(), "lib/libcudart.so.12");
            let mut args = vec![os("--")];
            args.extend(argv.clone());
            let t = record(
                &dir,
                &[
                    ("LD_LIBRARY_PATH", &dir.join("lib").into_os_string()),
                    ("CUDART", &os("libcudart.so.12")),
                    ("BEFORE_S", &os(before)),
                    ("STAY_S", &os(if before == "0" { "0" } else { "1.0" })),
                ],
                &args,
            );
            eprintln!("{front}, loaded after {before} s: ok");
            t.assert_calls(NOW);
            t.assert_probed_up_front(lib.to_str().unwrap(), "its LD_LIBRARY_PATH");
        }
    }
    if shim.is_none() {
        skip(test, "the pyenv shim case: no pyenv here (PYENV_ROOT/shims/python3)");
    }
}

/// A virtual environment whose site-packages holds the runtime where the
/// wheels put it: `nvidia/cuda_runtime/lib` (CUDA 12), `nvidia/cu13/lib`
/// (CUDA 13's wheel; the file is the 12.x library under the 13 soname), and
/// `torch/lib` under an auditwheel name; loaded by its path.
#[test]
fn called_at_once_from_site_packages() {
    let test = "called_at_once_from_site_packages";
    let Some(env) = prerequisites(test) else { return };
    let dir = TempDir::new("cuda-dlopen-venv");
    let venv = dir.join("venv");
    let made = Command::new(&env.python).args(["-m", "venv", "--without-pip"]).arg(&venv).status();
    assert!(made.is_ok_and(|s| s.success()), "{} -m venv {}", env.python.display(), venv.display());
    let version = Command::new(&env.python)
        .args(["-c", "import sys; print(f'python{sys.version_info[0]}.{sys.version_info[1]}')"])
        .output()
        .unwrap();
    let site = format!("lib/{}/site-packages", String::from_utf8_lossy(&version.stdout).trim());
    for rel in ["nvidia/cuda_runtime/lib/libcudart.so.12", "nvidia/cu13/lib/libcudart.so.13", "torch/lib/libcudart-9e1f4a5b.so.12"] {
        let lib = install(&env, &venv, &format!("{site}/{rel}"));
        let run_dir = TempDir::new("cuda-dlopen-venv-run");
        let t = record(
            &run_dir,
            &[("CUDART", &lib.clone().into_os_string()), ("BEFORE_S", &os("0.5"))],
            &[os("--"), venv.join("bin/python").into(), workload().into(), os("now")],
        );
        eprintln!("{rel}: ok");
        t.assert_calls(NOW);
        t.assert_probed_up_front(lib.to_str().unwrap(), "its site-packages");
        fs::remove_file(&lib).unwrap();
    }
}

/// The target runs in a PID and mount namespace of its own, where the
/// library's directory is a bind mount the host does not see
/// (`unshare --pid --mount`): the search reads it through /proc/PID/root.
#[test]
fn called_at_once_in_a_mount_namespace() {
    let test = "called_at_once_in_a_mount_namespace";
    let Some(env) = prerequisites(test) else { return };
    if !in_path("unshare") {
        skip(test, "unshare (util-linux)");
        return;
    }
    let dir = TempDir::new("cuda-dlopen-ns");
    install(&env, dir.path(), "hidden/libcudart.so.12");
    let seen = dir.join("seen");
    fs::create_dir_all(&seen).unwrap();
    let script = format!(
        "mount --bind {hidden} {seen} && LD_LIBRARY_PATH={seen} exec {py} {w} now",
        hidden = dir.join("hidden").display(),
        seen = seen.display(),
        py = env.python.display(),
        w = workload().display()
    );
    // 1 s, not 0.5 s as elsewhere: the library is found at the exec of the
    // third program of the chain (unshare, sh, python), and the CUDA
    // programs' verification (0.5-1.4 s on a 2-core VM with this toolchain,
    // when the first CUDA library is found) must be over before it attaches; at
    // 0.5 s no call was counted (4 runs), at 1 s all 47 were (10 runs,
    // load average 4-5).
    let t = record(
        &dir,
        &[("CUDART", &os("libcudart.so.12")), ("BEFORE_S", &os("1.0"))],
        &[os("--"), os("unshare"), os("--pid"), os("--mount"), os("--fork"), os("sh"), os("-c"), os(script)],
    );
    t.assert_calls(NOW);
    // The path as the target sees it, empty on the host.
    assert!(fs::read_dir(&seen).unwrap().next().is_none());
    t.assert_probed_up_front(seen.join("libcudart.so.12").to_str().unwrap(), "its LD_LIBRARY_PATH");
}

/// Attach mode: the tracer attaches to a process that waits, then loads
/// the library and calls it at once.
#[test]
fn called_at_once_after_dlopen_attached() {
    let test = "called_at_once_after_dlopen_attached";
    let Some(env) = prerequisites(test) else { return };
    let dir = TempDir::new("cuda-dlopen-attach");
    let lib = install(&env, dir.path(), "lib/libcudart.so.12");
    let go = dir.join("go");
    let mut child = Command::new(&env.python)
        .arg(workload())
        .arg("now")
        .env("LD_LIBRARY_PATH", dir.join("lib"))
        .env("CUDART", "libcudart.so.12")
        .env("WAIT_FILE", &go)
        // Exits right after its calls: sites resolve from the kernel's
        // copies of the code objects.
        .env("STAY_S", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut guard = KillOnDrop::new(pid);
    let out = dir.join("rec.itr");
    let mut cmd = infertrace(["record", "-q", "--format", "json", "-o"]);
    cmd.arg(&out).arg("-p").arg(pid.to_string());
    let tracer = spawn(&mut cmd);
    let mut tracer_guard = KillOnDrop::new(tracer.id());
    // The tracer has probed the file when its first bytes are int3 in any
    // process that maps it: an untraced helper maps it and watches.
    let probed = Command::new(&env.python)
        .arg(workload())
        .arg("probed")
        .env("CUDART", &lib)
        .status()
        .unwrap();
    assert!(probed.success(), "the tracer never probed {} (helper: {probed})", lib.display());
    fs::write(&go, b"").unwrap();
    let status = child.wait().unwrap();
    guard.disarm();
    assert!(status.success(), "workload: {status}");
    let run = wait_child(tracer, Duration::from_secs(60), "infertrace record -p");
    tracer_guard.disarm();
    run.assert_ok();
    let t = Traced { report: run.json(), run };
    t.assert_calls(NOW);
    t.assert_probed_up_front(lib.to_str().unwrap(), "its LD_LIBRARY_PATH");
}

/// An inference service's shape: a loader thread loads the runtime and
/// feeds a serving loop; 200 steps of 8 uploads and one `.item()`-like
/// read (4-byte DtoH copy + sync), starting as soon as the runtime is
/// loaded. Launched through the pyenv shim where there is one.
#[test]
fn inference_service_counted_from_the_first_step() {
    let test = "inference_service_counted_from_the_first_step";
    let Some(env) = prerequisites(test) else { return };
    let front: PathBuf = pyenv_root().map(|r| r.join("shims/python3")).filter(|p| p.is_file()).unwrap_or(env.python.clone());
    let dir = TempDir::new("cuda-dlopen-serve");
    let lib = install(&env, dir.path(), "lib/libcudart.so.12");
    let t = record(
        &dir,
        &[
            ("LD_LIBRARY_PATH", &dir.join("lib").into_os_string()),
            ("CUDART", &os("libcudart.so.12")),
            ("BEFORE_S", &os("0.5")),
        ],
        &[os("--"), front.into(), workload().into(), os("serve")],
    );
    t.assert_calls(&[
        ("cudaMemcpyAsync", "serve_upload", "serve_step", Some("HtoD"), 1600, 1600 * 8192),
        ("cudaMemcpyAsync", "serve_item_copy", "serve_step", Some("DtoH"), 200, 200 * 4),
        ("cudaStreamSynchronize", "serve_item_sync", "serve_step", None, 200, 0),
    ]);
    t.assert_probed_up_front(lib.to_str().unwrap(), "its LD_LIBRARY_PATH");
}
