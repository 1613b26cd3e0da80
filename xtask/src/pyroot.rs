//! Setup step 6: a minimal Debian sid root holding python3.14 and
//! python3.15 (bookworm has neither), which the end-to-end tests run in a
//! chroot (tests/src/pyroot.rs), with a copy of the real libcudart at a
//! path that exists only inside it.
//!
//! The root is `target/pyroot-sid`, or `$INFERTRACE_PYROOT` (relative to the
//! workspace when not absolute). debootstrap builds it in a sibling
//! directory that is renamed into place when complete, so an interrupted
//! build never looks like a root.
use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::util;

/// The interpreters the root must hold; debootstrap `--include`s them.
const PYTHONS: &[&str] = &["python3.14", "python3.15"];

/// Debian's suite that has them.
const SUITE: &str = "sid";

/// The real libcudart inside the root (tests/src/pyroot.rs knows it too).
const CUDART_IN_ROOT: &str = "opt/cuda-real/libcudart.so.12";

/// The root the tests use: `$INFERTRACE_PYROOT` or `target/pyroot-sid`.
pub fn pyroot_dir() -> PathBuf {
    let root = util::workspace_root();
    match env::var_os("INFERTRACE_PYROOT") {
        Some(p) if !p.is_empty() => root.join(p),
        _ => root.join("target/pyroot-sid"),
    }
}

/// Every interpreter of [`PYTHONS`] is in `root`.
fn complete(root: &Path) -> bool {
    PYTHONS
        .iter()
        .all(|p| root.join("usr/bin").join(p).is_file())
}

pub fn pyroot() -> Result<String> {
    let root = pyroot_dir();
    let cudart = util::real_cudart_path();
    let copy = root.join(CUDART_IN_ROOT);
    let build = !complete(&root);
    let copy_needed = build || !same_contents(&cudart, &copy)?;
    if !build && !copy_needed {
        return Ok(util::ALREADY.into());
    }
    if !util::is_root() {
        // debootstrap, and writing into a root-owned tree, need root.
        let what = if build {
            format!("{} (with {})", root.display(), PYTHONS.join(", "))
        } else {
            copy.display().to_string()
        };
        eprintln!("WARNING: missing {what}\n         run `cargo xtask setup` as root to build it");
        return Ok(format!("MISSING {what} (not root, not built)"));
    }
    let mut done = Vec::new();
    if build {
        debootstrap(&root)?;
        done.push(format!("built {} with debootstrap", root.display()));
    }
    copy_atomically(&cudart, &copy)?;
    done.push(format!("copied {} to /{CUDART_IN_ROOT}", cudart.display()));
    Ok(done.join("; "))
}

/// Whether `b` exists and holds the same bytes as `a`.
fn same_contents(a: &Path, b: &Path) -> Result<bool> {
    let (Ok(ma), Ok(mb)) = (fs::metadata(a), fs::metadata(b)) else {
        return Ok(false);
    };
    if ma.len() != mb.len() {
        return Ok(false);
    }
    let read = |p: &Path| fs::read(p).with_context(|| format!("reading {}", p.display()));
    Ok(read(a)? == read(b)?)
}

fn copy_atomically(from: &Path, to: &Path) -> Result<()> {
    let dir = to.parent().context("a file path has a parent")?;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(".copy.{}", std::process::id()));
    fs::copy(from, &tmp)
        .with_context(|| format!("copying {} to {}", from.display(), tmp.display()))?;
    fs::rename(&tmp, to).with_context(|| format!("renaming {} to {}", tmp.display(), to.display()))
}

/// `root` with `suffix` appended to its last component.
fn sibling(root: &Path, suffix: &str) -> PathBuf {
    let mut s = root.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Builds the root in `ROOT.partial`, then renames it into place (an older,
/// incomplete root is moved aside to `ROOT.old` and removed).
fn debootstrap(root: &Path) -> Result<()> {
    if util::which("debootstrap").is_none() {
        bail!("debootstrap is not installed (step 3 installs it on Debian: apt-get install debootstrap)");
    }
    let parent = root.parent().context("the root has a parent directory")?;
    fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let partial = sibling(root, ".partial");
    remove_tree(&partial)?;
    println!(
        "setup [6/8] debootstrap {SUITE} into {} (about 30 s with a fast mirror)",
        partial.display()
    );
    let out = Command::new("debootstrap")
        .arg("--variant=minbase")
        .arg(format!("--include={}", PYTHONS.join(",")))
        .arg(SUITE)
        .arg(&partial)
        .output()
        .context("running debootstrap")?;
    if !out.status.success() || !complete(&partial) {
        let log = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        // Leave nothing that a later run could mistake for progress.
        let cleanup = remove_tree(&partial).err();
        bail!(
            "debootstrap {SUITE} {} failed ({}){}; its last lines:\n{tail}{}",
            partial.display(),
            out.status,
            if out.status.success() {
                format!(": no {}", PYTHONS.join(", "))
            } else {
                String::new()
            },
            cleanup
                .map(|e| format!("\n(and removing it failed: {e:#})"))
                .unwrap_or_default()
        );
    }
    if root.exists() {
        let old = sibling(root, ".old");
        remove_tree(&old)?;
        fs::rename(root, &old)
            .with_context(|| format!("moving the incomplete {} aside", root.display()))?;
        fs::rename(&partial, root)
            .with_context(|| format!("renaming {} to {}", partial.display(), root.display()))?;
        remove_tree(&old)?;
    } else {
        fs::rename(&partial, root)
            .with_context(|| format!("renaming {} to {}", partial.display(), root.display()))?;
    }
    Ok(())
}

/// Removes the directory `dir` if it exists. An interrupted debootstrap can
/// leave /proc or /sys mounted inside it: those are unmounted first (a
/// recursive removal must never descend into a mount of the host's trees).
fn remove_tree(dir: &Path) -> Result<()> {
    if fs::symlink_metadata(dir).is_err() {
        return Ok(());
    }
    let mut mounts = mounts_under(dir)?;
    // Deepest first.
    mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
    for m in &mounts {
        let _ = util::probe(Command::new("umount").arg("--lazy").arg(m));
    }
    let left = mounts_under(dir)?;
    if !left.is_empty() {
        bail!(
            "{} still has mounts inside ({}); unmount them, then remove it",
            dir.display(),
            left.iter()
                .map(|m| m.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))
}

/// Mount points at or below `dir`, from /proc/self/mountinfo.
fn mounts_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let info =
        fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    Ok(info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mountinfo(m)))
        .filter(|m| m.starts_with(dir))
        .collect())
}

/// mountinfo writes space, tab, newline and backslash as `\ooo` (octal).
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let code = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match code {
            Some(c) => {
                out.push(c);
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo(r"/a\040b/c\134d\011"), "/a b/c\\d\t");
        assert_eq!(unescape_mountinfo(r"/plain\04"), r"/plain\04");
    }

    #[test]
    fn sibling_appends_to_the_last_component() {
        assert_eq!(
            sibling(Path::new("/x/pyroot-sid"), ".partial"),
            Path::new("/x/pyroot-sid.partial")
        );
    }
}
