//! The container image of the agent's container test: podman with runc
//! (crun refuses this machine's hybrid cgroups), configured through files
//! under `target/podman/` (`CONTAINERS_CONF`, `CONTAINERS_STORAGE_CONF`:
//! the system's configuration is left alone), and an image imported from
//! the debootstrap'd Debian root of the `pyroot` step (python3.14), once.

use std::{
    fs,
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{bail, Context, Result};

use crate::util;

/// The image the test runs (`localhost/NAME`).
pub const IMAGE: &str = "localhost/infertrace-pytest";

pub fn podman_dir() -> PathBuf {
    util::target_dir().join("podman")
}

/// `podman` with this project's configuration.
fn podman() -> Command {
    let dir = podman_dir();
    let mut c = Command::new("podman");
    c.env("CONTAINERS_CONF", dir.join("containers.conf")).env("CONTAINERS_STORAGE_CONF", dir.join("storage.conf"));
    c
}

/// Writes the configuration, then imports the image unless present.
pub fn agent_image() -> Result<String> {
    if !util::is_root() {
        return Ok("WARNING: not root, skipped (podman needs root here; the container test says what is missing)".into());
    }
    if util::which("podman").is_none() || util::which("runc").is_none() {
        bail!("podman and runc are missing (the Debian packages step installs them)");
    }
    let dir = podman_dir();
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // No network namespace setup, no per-container ulimits (this machine's
    // limits are below podman's defaults), cgroupfs (no systemd here).
    let conf = "[containers]\ndefault_ulimits = []\nnetns = \"none\"\n\n[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n";
    fs::write(dir.join("containers.conf"), conf)?;
    let storage = format!(
        "[storage]\ndriver = \"vfs\"\nrunroot = \"{}\"\ngraphroot = \"{}\"\n",
        dir.join("run").display(),
        dir.join("graph").display()
    );
    fs::write(dir.join("storage.conf"), storage)?;
    let exists = podman().args(["image", "exists", IMAGE]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    if exists.is_ok_and(|s| s.success()) {
        return Ok(format!("{IMAGE} present"));
    }
    let root = crate::pyroot::pyroot_dir();
    if !root.join("usr/bin/python3.14").is_file() {
        bail!("the Debian root {} has no python3.14 (the pyroot step builds it)", root.display());
    }
    // tar -C ROOT -c . | podman import - IMAGE
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .args(["--exclude=./usr/share/doc", "--exclude=./usr/share/man", "--exclude=./usr/share/locale", "-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .context("tar")?;
    let stdin = tar.stdout.take().context("tar stdout")?;
    let import = podman().args(["import", "-", IMAGE]).stdin(stdin).stdout(Stdio::null()).status().context("podman import")?;
    let tar_ok = tar.wait().context("tar")?.success();
    if !import.success() || !tar_ok {
        bail!("importing {} as {IMAGE} failed", root.display());
    }
    Ok(format!("imported {IMAGE} from {}", root.display()))
}
