//! What the CUDA tests run against: the real `libcudart.so.12` from
//! NVIDIA's wheel (`tests/cudasim/fetch-cudart.sh`), the timing stand-in
//! libraries built by `tests/cudasim/build.sh`, and the interpreter that
//! `python3` runs. Each is fetched or built when missing; when it cannot
//! be, the test is skipped (a failure under `CI=true`, see [`skip`]).

use std::path::PathBuf;
use std::process::Command;

use crate::{skip, workspace_root};

/// Runs `sh tests/cudasim/NAME` and returns the path it prints.
pub fn cudasim_script(name: &str) -> Result<PathBuf, String> {
    let o = Command::new("sh")
        .arg(workspace_root().join("tests/cudasim").join(name))
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
