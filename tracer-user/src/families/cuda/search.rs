//! Where a target may load the CUDA runtime or driver from, before it
//! does: uprobes are attached by file, so a library probed up front is
//! traced from its first call, even one made the moment `dlopen` returns.
//!
//! The places searched, all as the target sees them (inside
//! `/proc/PID/root`, symlinks confined to it):
//! - its `LD_LIBRARY_PATH` (from `/proc/PID/environ`, what it was exec'd
//!   with);
//! - for a Python interpreter (its executable is `python*` or it maps a
//!   `libpython`): the site-packages of its prefix (from the executable's
//!   and libpython's paths), of the virtual environment it was started in
//!   (`pyvenv.cfg` beside the `bin/` of its argv\[0\], or `$VIRTUAL_ENV`),
//!   of the user site (`$PYTHONUSERBASE`, `$HOME/.local`) and the
//!   `$PYTHONPATH` entries; in each, the directories where wheels put CUDA:
//!   `nvidia/*/lib` (`nvidia/cuda_runtime/lib`, `nvidia/cu13/lib`),
//!   `torch/lib` and auditwheel's `*.libs`;
//! - the loader cache `/etc/ld.so.cache` (its `libcudart`/`libcuda`
//!   entries) and the standard library directories.
//!
//! Only file names are matched here ([`is_cudart_name`],
//! [`is_driver_name`]); the collector opens each candidate and probes it
//! when its symbols make it a CUDA library.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

use super::discovery::{is_cudart_name, is_driver_name};
use crate::os::procfs::{self, resolve_in_root};

/// Where a candidate was found (for the note that says it was probed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    LdLibraryPath,
    SitePackages,
    PythonPath,
    LdSoCache,
    LibDir,
}

impl Source {
    pub fn describe(self) -> &'static str {
        match self {
            Source::LdLibraryPath => "its LD_LIBRARY_PATH",
            Source::SitePackages => "its site-packages",
            Source::PythonPath => "its PYTHONPATH",
            Source::LdSoCache => "the loader cache",
            Source::LibDir => "a standard library directory",
        }
    }
}

/// What the search reads about a target, gathered once per look.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TargetFacts {
    /// `/proc/PID/exe` as the process sees it.
    pub exe: Option<String>,
    /// argv\[0\] as given (may be relative or a bare name).
    pub argv0: Option<String>,
    /// The mapped `libpython*.so*`, if any.
    pub libpython: Option<String>,
    /// The environment it was exec'd with.
    pub environ: Vec<(String, String)>,
    /// Its working directory, when its root is ours (relative argv\[0\]
    /// and PYTHONPATH entries are resolved against it; else dropped).
    pub cwd: Option<String>,
}

impl TargetFacts {
    pub fn read(pid: u32, libpython: Option<String>) -> TargetFacts {
        let exe = procfs::exe(pid).map(|p| p.trim_end_matches(" (deleted)").to_owned());
        let argv0 = procfs::cmdline(pid).into_iter().next();
        let same_root = same_file(Path::new(&format!("/proc/{pid}/root")), Path::new("/"));
        let cwd = same_root
            .then(|| fs::read_link(format!("/proc/{pid}/cwd")).ok())
            .flatten()
            .and_then(|p| p.to_str().map(str::to_owned));
        TargetFacts { exe, argv0, libpython, environ: procfs::environ(pid), cwd }
    }

    fn env(&self, name: &str) -> Option<&str> {
        self.environ.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
    }

    /// A path as the target would resolve it: absolute, or relative to its
    /// working directory when known.
    fn absolute(&self, p: &str) -> Option<String> {
        if p.starts_with('/') {
            return Some(p.to_owned());
        }
        let cwd = self.cwd.as_deref()?;
        Some(format!("{}/{p}", cwd.trim_end_matches('/')))
    }

    /// Whether the target is a Python interpreter.
    fn is_python(&self) -> bool {
        self.libpython.is_some() || self.exe.as_deref().is_some_and(|e| basename(e).starts_with("python"))
    }
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

fn parent(p: &str) -> Option<&str> {
    let p = p.trim_end_matches('/');
    let (dir, _) = p.rsplit_once('/')?;
    Some(if dir.is_empty() { "/" } else { dir })
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// The directories to list for CUDA libraries, in search order, each with
/// its source; paths as the target sees them. `exists` tells whether a
/// path exists in the target's root, `list` lists a directory there.
pub fn directories(
    facts: &TargetFacts,
    exists: &dyn Fn(&str) -> bool,
    list: &dyn Fn(&str) -> Vec<String>,
) -> Vec<(String, Source)> {
    let mut out: Vec<(String, Source)> = Vec::new();
    let mut push = |d: String, s: Source| {
        let d = d.trim_end_matches('/').to_owned();
        if !d.is_empty() && !out.iter().any(|(x, _)| *x == d) {
            out.push((d, s));
        }
    };
    for d in facts.env("LD_LIBRARY_PATH").unwrap_or("").split(':').filter(|d| !d.is_empty()) {
        if let Some(d) = facts.absolute(d) {
            push(d, Source::LdLibraryPath);
        }
    }
    if facts.is_python() {
        // Prefixes: the interpreter's, its venv's, the user base.
        let mut prefixes: Vec<String> = Vec::new();
        let prefix = |prefixes: &mut Vec<String>, p: Option<&str>| {
            if let Some(p) = p.filter(|p| p.starts_with('/')) {
                if !prefixes.iter().any(|x| x == p) {
                    prefixes.push(p.to_owned());
                }
            }
        };
        // {prefix}/bin/pythonX.Y and {prefix}/lib/libpythonX.Y.so.
        prefix(&mut prefixes, facts.exe.as_deref().and_then(parent).and_then(parent));
        prefix(&mut prefixes, facts.libpython.as_deref().and_then(parent).and_then(parent));
        // The venv: `python -m venv` links bin/python to the base
        // interpreter, so /proc/PID/exe names the base; argv[0] (or the
        // PATH entry it was found in) names the venv's bin/.
        let invoked = facts.argv0.as_deref().and_then(|a| {
            if a.contains('/') {
                facts.absolute(a)
            } else {
                let path = facts.env("PATH")?;
                path.split(':').filter(|d| d.starts_with('/')).map(|d| format!("{}/{a}", d.trim_end_matches('/'))).find(|p| exists(p))
            }
        });
        if let Some(venv) = invoked.as_deref().and_then(parent).and_then(parent) {
            if exists(&format!("{}/pyvenv.cfg", venv.trim_end_matches('/'))) {
                prefix(&mut prefixes, Some(venv));
            }
        }
        prefix(&mut prefixes, facts.env("VIRTUAL_ENV"));
        let user_base = facts.env("PYTHONUSERBASE").map(str::to_owned).or_else(|| facts.env("HOME").map(|h| format!("{}/.local", h.trim_end_matches('/'))));
        prefix(&mut prefixes, user_base.as_deref());
        if prefixes.iter().any(|p| p == "/usr") {
            prefix(&mut prefixes, Some("/usr/local"));
        }
        let mut sites: Vec<(String, Source)> = Vec::new();
        for p in &prefixes {
            let p = p.trim_end_matches('/');
            for lib in ["lib", "lib64"] {
                let lib_dir = format!("{p}/{lib}");
                let mut versions: Vec<String> = list(&lib_dir).into_iter().filter(|n| n.starts_with("python3")).collect();
                versions.sort();
                for v in versions {
                    for s in ["site-packages", "dist-packages"] {
                        sites.push((format!("{lib_dir}/{v}/{s}"), Source::SitePackages));
                    }
                }
            }
        }
        for d in facts.env("PYTHONPATH").unwrap_or("").split(':').filter(|d| !d.is_empty()) {
            if let Some(d) = facts.absolute(d) {
                sites.push((d, Source::PythonPath));
            }
        }
        for (site, source) in sites {
            if !exists(&site) {
                continue;
            }
            let mut nvidia: Vec<String> = list(&format!("{site}/nvidia"));
            nvidia.sort();
            for n in nvidia {
                push(format!("{site}/nvidia/{n}/lib"), source);
            }
            push(format!("{site}/torch/lib"), source);
            let mut libs: Vec<String> = list(&site).into_iter().filter(|n| n.ends_with(".libs")).collect();
            libs.sort();
            for l in libs {
                push(format!("{site}/{l}"), source);
            }
        }
    }
    for d in standard_lib_dirs() {
        push(d, Source::LibDir);
    }
    out
}

/// The directories the dynamic loader searches by default, and where CUDA
/// installs (`/usr/local/cuda/lib64`, usually in ld.so.conf).
fn standard_lib_dirs() -> Vec<String> {
    let triple = match std::env::consts::ARCH {
        "x86_64" => "x86_64-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        other => other,
    };
    vec![
        "/lib".into(),
        "/usr/lib".into(),
        "/lib64".into(),
        "/usr/lib64".into(),
        format!("/lib/{triple}"),
        format!("/usr/lib/{triple}"),
        "/usr/local/lib".into(),
        "/usr/local/cuda/lib64".into(),
    ]
}

/// Whether a file name is one of the libraries probed.
pub fn wanted_name(name: &str, driver: bool) -> bool {
    is_cudart_name(name) || (driver && is_driver_name(name))
}

/// The `(name, path)` entries of an `ld.so.cache` (glibc's
/// `glibc-ld.so.cache1.1` format, alone or after the old `ld.so-1.7.0`
/// table); empty when the data is not such a cache.
pub fn ld_so_cache_entries(data: &[u8]) -> Vec<(String, String)> {
    const MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    const HEADER: usize = 48;
    const ENTRY: usize = 24;
    let Some(base) = data.windows(MAGIC.len()).position(|w| w == MAGIC) else { return Vec::new() };
    let u32_at = |off: usize| -> Option<u32> { Some(u32::from_le_bytes(data.get(off..off + 4)?.try_into().ok()?)) };
    let Some(nlibs) = u32_at(base + 20) else { return Vec::new() };
    // NUL-terminated string at an offset from the new header.
    let string = |off: u32| -> Option<String> {
        let start = base.checked_add(off as usize)?;
        let rest = data.get(start..)?;
        let end = rest.iter().position(|b| *b == 0)?;
        String::from_utf8(rest[..end].to_vec()).ok()
    };
    let mut out = Vec::new();
    for i in 0..nlibs as usize {
        let off = base + HEADER + i * ENTRY;
        let (Some(key), Some(value)) = (u32_at(off + 4), u32_at(off + 8)) else { break };
        if let (Some(k), Some(v)) = (string(key), string(value)) {
            out.push((k, v));
        }
    }
    out
}

/// A candidate file: its path as the target sees it, and where it was found.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Found {
    pub path: String,
    pub source: Source,
}

/// Every file a target may load the CUDA runtime (and, with `driver`, the
/// driver) from, as it sees them (see the module documentation); paths
/// are resolved in `root` (`/proc/PID/root`).
pub fn candidates(root: &Path, facts: &TargetFacts, driver: bool) -> Vec<Found> {
    let host = |p: &str| resolve_in_root(root, Path::new(p)).ok();
    let exists = |p: &str| host(p).is_some();
    let list = |d: &str| -> Vec<String> {
        let Some(h) = host(d) else { return Vec::new() };
        fs::read_dir(h)
            .map(|it| it.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
            .unwrap_or_default()
    };
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    for (dir, source) in directories(facts, &exists, &list) {
        let mut names: Vec<String> = list(&dir).into_iter().filter(|n| wanted_name(n, driver)).collect();
        names.sort();
        for n in names {
            let path = format!("{dir}/{n}");
            if seen.insert(path.clone()) {
                out.push(Found { path, source });
            }
        }
    }
    let cache: Option<PathBuf> = host("/etc/ld.so.cache");
    if let Some(data) = cache.and_then(|c| fs::read(c).ok()) {
        for (name, path) in ld_so_cache_entries(&data) {
            if wanted_name(&name, driver) && seen.insert(path.clone()) {
                out.push(Found { path, source: Source::LdSoCache });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A fake filesystem: directory -> entries.
    fn fake(tree: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        tree.iter().map(|(d, e)| (d.to_string(), e.iter().map(|s| s.to_string()).collect())).collect()
    }

    fn dirs_of(facts: &TargetFacts, tree: &BTreeMap<String, Vec<String>>) -> Vec<(String, Source)> {
        let exists = |p: &str| {
            tree.contains_key(p) || {
                let (d, n) = p.rsplit_once('/').unwrap();
                tree.get(d).is_some_and(|e| e.iter().any(|x| x == n))
            }
        };
        let list = |d: &str| tree.get(d).cloned().unwrap_or_default();
        directories(facts, &exists, &list).into_iter().filter(|(_, s)| *s != Source::LibDir).collect()
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn python_prefix_venv_user_site_and_paths() {
        let tree = fake(&[
            ("/opt/py/lib", &["python3.11", "libpython3.11.so.1.0"]),
            ("/opt/py/lib/python3.11", &["site-packages"]),
            ("/opt/py/lib/python3.11/site-packages", &["nvidia", "torch", "numpy.libs", "numpy"]),
            ("/opt/py/lib/python3.11/site-packages/nvidia", &["cuda_runtime", "cu13"]),
            ("/srv/venv", &["pyvenv.cfg", "bin", "lib"]),
            ("/srv/venv/bin", &["python"]),
            ("/srv/venv/lib", &["python3.11"]),
            ("/srv/venv/lib/python3.11", &["site-packages"]),
            ("/srv/venv/lib/python3.11/site-packages", &["nvidia"]),
            ("/srv/venv/lib/python3.11/site-packages/nvidia", &["cuda_runtime"]),
            ("/home/u/.local/lib", &["python3.11"]),
            ("/home/u/.local/lib/python3.11", &["site-packages"]),
            ("/home/u/.local/lib/python3.11/site-packages", &[]),
            ("/work/app", &["vendored"]),
            ("/work/app/vendored", &["nvidia"]),
            ("/work/app/vendored/nvidia", &["cu12"]),
        ]);
        let facts = TargetFacts {
            exe: Some("/opt/py/bin/python3.11".into()),
            argv0: Some("python".into()),
            libpython: None,
            environ: env(&[
                ("PATH", "/srv/venv/bin:/usr/bin"),
                ("HOME", "/home/u"),
                ("LD_LIBRARY_PATH", "/usr/local/cuda/lib64::rel"),
                ("PYTHONPATH", "vendored"),
            ]),
            cwd: Some("/work/app".into()),
        };
        let got = dirs_of(&facts, &tree);
        let want: Vec<(String, Source)> = [
            ("/usr/local/cuda/lib64", Source::LdLibraryPath),
            ("/work/app/rel", Source::LdLibraryPath),
            ("/opt/py/lib/python3.11/site-packages/nvidia/cu13/lib", Source::SitePackages),
            ("/opt/py/lib/python3.11/site-packages/nvidia/cuda_runtime/lib", Source::SitePackages),
            ("/opt/py/lib/python3.11/site-packages/torch/lib", Source::SitePackages),
            ("/opt/py/lib/python3.11/site-packages/numpy.libs", Source::SitePackages),
            ("/srv/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib", Source::SitePackages),
            ("/srv/venv/lib/python3.11/site-packages/torch/lib", Source::SitePackages),
            ("/home/u/.local/lib/python3.11/site-packages/torch/lib", Source::SitePackages),
            ("/work/app/vendored/nvidia/cu12/lib", Source::PythonPath),
            ("/work/app/vendored/torch/lib", Source::PythonPath),
        ]
        .iter()
        .map(|(d, s)| (d.to_string(), *s))
        .collect();
        assert_eq!(got, want);

        // Not Python: LD_LIBRARY_PATH only (and the standard directories).
        let shell = TargetFacts { exe: Some("/usr/bin/bash".into()), ..facts.clone() };
        let got = dirs_of(&shell, &tree);
        assert_eq!(got.iter().map(|(d, _)| d.as_str()).collect::<Vec<_>>(), ["/usr/local/cuda/lib64", "/work/app/rel"]);
        // A cwd unknown (another root): relative entries are dropped.
        let other_root = TargetFacts { cwd: None, ..facts };
        assert!(!dirs_of(&other_root, &tree).iter().any(|(d, _)| d.contains("rel") || d.contains("vendored")));
    }

    #[test]
    fn libpython_names_the_prefix() {
        let tree = fake(&[
            ("/opt/embed/lib", &["python3.12"]),
            ("/opt/embed/lib/python3.12", &["site-packages"]),
            ("/opt/embed/lib/python3.12/site-packages", &["nvidia"]),
            ("/opt/embed/lib/python3.12/site-packages/nvidia", &["cu13"]),
        ]);
        let facts = TargetFacts {
            exe: Some("/usr/bin/my-server".into()),
            libpython: Some("/opt/embed/lib/libpython3.12.so.1.0".into()),
            ..Default::default()
        };
        let got = dirs_of(&facts, &tree);
        assert_eq!(got[0].0, "/opt/embed/lib/python3.12/site-packages/nvidia/cu13/lib");
    }

    #[test]
    fn this_machines_loader_cache() {
        let Ok(data) = fs::read("/etc/ld.so.cache") else { return };
        let entries = ld_so_cache_entries(&data);
        assert!(
            entries.iter().any(|(k, v)| k == "libc.so.6" && v.ends_with("/libc.so.6")),
            "libc.so.6 not in {} entries of /etc/ld.so.cache",
            entries.len()
        );
        assert!(ld_so_cache_entries(b"not a cache").is_empty());
    }

    #[test]
    fn finds_files_in_a_root() {
        let base = std::env::temp_dir().join(format!("infertrace-search-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let site = base.join("opt/py/lib/python3.11/site-packages");
        fs::create_dir_all(site.join("nvidia/cuda_runtime/lib")).unwrap();
        fs::create_dir_all(base.join("opt/py/bin")).unwrap();
        fs::write(site.join("nvidia/cuda_runtime/lib/libcudart.so.12"), b"x").unwrap();
        fs::write(site.join("nvidia/cuda_runtime/lib/libnvrtc.so.12"), b"x").unwrap();
        // A link out of the root is not followed out.
        std::os::unix::fs::symlink("/", site.join("torch")).unwrap();
        let facts = TargetFacts { exe: Some("/opt/py/bin/python3.11".into()), ..Default::default() };
        let found: Vec<Found> = candidates(&base, &facts, true).into_iter().filter(|f| f.source != Source::LdSoCache && f.source != Source::LibDir).collect();
        assert_eq!(
            found,
            [Found { path: "/opt/py/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12".into(), source: Source::SitePackages }]
        );
        let _ = fs::remove_dir_all(&base);
    }
}
