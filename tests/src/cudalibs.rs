//! What the CUDA tests run against: the real `libcudart.so.12` from
//! NVIDIA's wheel (`tests/cudasim/fetch-cudart.sh`), the timing stand-in
//! libraries built by `tests/cudasim/build.sh`, and the interpreter that
//! `python3` runs. Each is fetched or built when missing; when it cannot
//! be, the test is skipped (a failure under `CI=true`, see [`skip`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::{infertrace, require, run_cmd, skip, workspace_root, Need, Run, TempDir};

/// Runs `sh tests/cudasim/NAME` and returns the path it prints.
pub fn cudasim_script(name: &str) -> Result<PathBuf, String> {
    cudasim_script_env(name, &[])
}

/// [`cudasim_script`] with variables set.
pub fn cudasim_script_env(name: &str, env: &[(&str, &str)]) -> Result<PathBuf, String> {
    let o = Command::new("sh")
        .arg(workspace_root().join("tests/cudasim").join(name))
        .envs(env.iter().copied())
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
}

/// The real `libcudart.so.12`.
pub fn real_cudart(test: &str) -> Option<PathBuf> {
    cudasim_script("fetch-cudart.sh")
        .map_err(|e| skip(test, &format!("the real libcudart.so.12 (tests/cudasim/fetch-cudart.sh): {e}")))
        .ok()
}

/// The real `libcudart.so.12` and `libcudart.so.13` (PyTorch cu13's), as
/// (major version, path).
pub fn real_cudarts(test: &str) -> Option<Vec<(u32, PathBuf)>> {
    let mut out = vec![(12, real_cudart(test)?)];
    let thirteen = cudasim_script_env("fetch-cudart.sh", &[("CUDART_MAJOR", "13")])
        .map_err(|e| skip(test, &format!("the real libcudart.so.13 (CUDART_MAJOR=13 tests/cudasim/fetch-cudart.sh): {e}")))
        .ok()?;
    out.push((13, thirteen));
    Some(out)
}

/// The real `libnccl.so.2` (nvidia-nccl-cu12; tests/cudasim/fetch-nccl.sh).
pub fn real_nccl(test: &str) -> Option<PathBuf> {
    cudasim_script("fetch-nccl.sh").map_err(|e| skip(test, &format!("the real libnccl.so.2 (tests/cudasim/fetch-nccl.sh): {e}"))).ok()
}

/// The directory of the stand-in libraries and drivers.
pub fn cuda_standin_dir(test: &str) -> Option<PathBuf> {
    cudasim_script("build.sh").map_err(|e| skip(test, &format!("tests/cudasim/build.sh: {e}"))).ok()
}

/// The interpreter `python3` runs (its `sys.executable`, not a pyenv shim
/// script).
pub fn python3_executable(test: &str) -> Option<PathBuf> {
    let python = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if python.is_none() {
        skip(test, "python3");
    }
    python
}

/// `infertrace record -q --format json -o DIR/rec.itr -- python
/// tests/workloads/cuda_patterns.py MODE` with `CUDART=cudart`,
/// `FAKE_KERNELS=kernels` and `env`; asserts it succeeded.
pub fn record_cuda_patterns(dir: &TempDir, python: &Path, cudart: &Path, kernels: &Path, mode: &str, env: &[(&str, &Path)]) -> Run {
    let source = workspace_root().join("tests/workloads/cuda_patterns.py");
    let mut cmd = infertrace(["record", "-q", "--format", "json", "-o"]);
    cmd.arg(dir.join("rec.itr")).arg("--").arg(python).arg(&source).arg(mode);
    cmd.env("CUDART", cudart).env("FAKE_KERNELS", kernels).env("END_SLEEP_S", "0.2");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let run = run_cmd(&mut cmd, Duration::from_secs(180));
    run.assert_ok();
    run
}

/// The rows of the JSON array `list` whose `site.line` is `line`.
pub fn rows_at_line(list: &Value, line: u64) -> Vec<Value> {
    list.as_array().map_or(Vec::new(), |l| l.iter().filter(|x| x["site"]["line"] == line).cloned().collect())
}

/// `cuda_patterns.py MODE` recorded on private copies (the workload waits
/// for int3 on them) of the stand-in runtime over the stand-in driver
/// (`CUDA_DRIVER`; the runtime loads the driver next to it, `$ORIGIN`),
/// and of the NCCL stand-in (`NCCL`).
/// None when a prerequisite is missing ([`skip`]). The directory holds
/// `rec.itr`.
pub fn record_on_standins(test: &str, mode: &str) -> Option<(TempDir, Run)> {
    if !require(test, &[Need::Root, Need::Binary, Need::Gcc]) {
        return None;
    }
    let sim = cuda_standin_dir(test)?;
    let python = python3_executable(test)?;
    let dir = TempDir::new(&format!("cuda-{mode}"));
    let cudart = dir.join("libcudart.so.12");
    let driver = dir.join("libcuda.so.1");
    let nccl = dir.join("libnccl.so.2");
    std::fs::copy(sim.join("libcudart.so.12"), &cudart).unwrap_or_else(|e| panic!("copying libcudart.so.12: {e}"));
    std::fs::copy(sim.join("libcuda.so.1"), &driver).unwrap_or_else(|e| panic!("copying libcuda.so.1: {e}"));
    std::fs::copy(sim.join("libnccl.so.2"), &nccl).unwrap_or_else(|e| panic!("copying libnccl.so.2: {e}"));
    let run = record_cuda_patterns(&dir, &python, &cudart, &sim.join("libfakekernels.so"), mode, &[("CUDA_DRIVER", &driver), ("NCCL", &nccl)]);
    Some((dir, run))
}

/// `cuda_patterns.py MODE` recorded on a private copy of each real
/// libcudart ([`real_cudarts`]): (major version, run) each. None when a
/// prerequisite is missing ([`skip`]).
pub fn record_on_real_cudarts(test: &str, mode: &str) -> Option<Vec<(u32, Run)>> {
    if !require(test, &[Need::Root, Need::Binary, Need::Gcc]) {
        return None;
    }
    let reals = real_cudarts(test)?;
    let sim = cuda_standin_dir(test)?;
    let python = python3_executable(test)?;
    let mut out = Vec::new();
    for (major, real) in reals {
        let dir = TempDir::new(&format!("cuda-{mode}-{major}"));
        let cudart = dir.join(format!("libcudart.so.{major}"));
        std::fs::copy(&real, &cudart).unwrap_or_else(|e| panic!("copying {}: {e}", real.display()));
        out.push((major, record_cuda_patterns(&dir, &python, &cudart, &sim.join("libfakekernels.so"), mode, &[])));
    }
    Some(out)
}

/// A JSON number that must be a u64.
pub fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

/// The one row of `cuda.calls` of `api` at marker `marker`'s line (`m`:
/// the workload's markers).
pub fn call_row(cuda: &Value, m: &std::collections::BTreeMap<String, u64>, marker: &str, api: &str) -> Value {
    let rows: Vec<Value> = rows_at_line(&cuda["calls"], m[marker]).into_iter().filter(|r| r["api"] == api).collect();
    assert_eq!(rows.len(), 1, "{api} @{marker}: {:#}", cuda["calls"]);
    rows[0].clone()
}

/// The `rc NAME CODE` lines a workload printed: NAME -> CODE -> calls.
pub fn return_codes_seen(stderr: &str) -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, u64>> {
    let mut out: std::collections::BTreeMap<String, std::collections::BTreeMap<String, u64>> = Default::default();
    for l in stderr.lines() {
        if let ["rc", name, code] = l.split_whitespace().collect::<Vec<_>>()[..] {
            *out.entry(name.to_owned()).or_default().entry(code.to_owned()).or_default() += 1;
        }
    }
    out
}

/// A call row's `return_codes`, code -> calls.
pub fn codes_of(row: &Value) -> std::collections::BTreeMap<String, u64> {
    row["return_codes"].as_object().unwrap_or_else(|| panic!("no return_codes: {row}")).iter().map(|(k, v)| (k.clone(), u(v))).collect()
}

/// On a real libcudart without a driver: the row of `api` at `marker`
/// counts `n` calls, all failed, with exactly the return codes the
/// workload printed (`run`'s `rc NAME CODE` lines), none of them 0.
pub fn assert_failed_as_seen(run: &Run, m: &std::collections::BTreeMap<String, u64>, marker: &str, api: &str, n: u64) {
    let report = run.json();
    let r = call_row(&report.0["cuda"], m, marker, api);
    let truth = return_codes_seen(&run.stderr);
    let want = truth.get(api).unwrap_or_else(|| panic!("no rc line for {api}: {}", run.stderr));
    assert!(!want.contains_key("0"), "{api} succeeded without a GPU? {want:?}");
    assert_eq!((u(&r["count"]), u(&r["errors"]), &codes_of(&r)), (n, n, want), "@{marker}: {r}");
}
