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
//!
//! The target's root is not trusted: every path is resolved and every
//! directory listed through descriptors inside it
//! ([`procfs::list_in_root`]), the loader cache is read only when it is a
//! regular file of at most [`LD_SO_CACHE_LIMIT`] bytes and parsed in linear
//! time, and every list is capped ([`MAX_PATH_ENTRIES`], [`MAX_DIRS`],
//! [`MAX_LISTED`], [`MAX_CANDIDATES`]); candidates are handed out one at a
//! time. What is cut or refused is counted ([`procfs::refused`]).

use std::{
    cell::Cell,
    collections::BTreeSet,
    fs,
    path::Path,
};

use super::discovery::{is_cudart_name, is_driver_name, is_torch_allocator_name};
use crate::os::procfs::{self, refused, Refused};

/// Entries of one search path (`LD_LIBRARY_PATH`, `PYTHONPATH`, `PATH`) used.
pub const MAX_PATH_ENTRIES: usize = 128;
/// Directories searched for one target.
pub const MAX_DIRS: usize = 512;
/// Directory entries read for one target, all listings together.
pub const MAX_LISTED: usize = 50_000;
/// Entries read of one directory.
pub const MAX_PER_DIR: usize = 10_000;
/// Candidate files handed out for one target.
pub const MAX_CANDIDATES: usize = 64;
/// The largest `/etc/ld.so.cache` read (real ones are well under 1 MiB;
/// a million entries are 24 MiB).
pub const LD_SO_CACHE_LIMIT: u64 = 32 << 20;
/// Entries of the loader cache examined.
pub const LD_SO_CACHE_ENTRIES: usize = 200_000;

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

/// The environment variables the search reads. Only these are kept of a
/// target's environment ([`TargetFacts::read`]): the collector searches
/// once per distinct facts, and processes whose environments differ
/// elsewhere (a request id, a worker number) share one search.
pub const SEARCHED_VARS: &[&str] = &["LD_LIBRARY_PATH", "PATH", "VIRTUAL_ENV", "PYTHONUSERBASE", "HOME", "PYTHONPATH"];

/// The variables of `environ` the search reads ([`SEARCHED_VARS`]), in order.
pub fn searched_vars(environ: Vec<(String, String)>) -> Vec<(String, String)> {
    environ.into_iter().filter(|(k, _)| SEARCHED_VARS.contains(&k.as_str())).collect()
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
        TargetFacts { exe, argv0, libpython, environ: searched_vars(procfs::environ(pid)), cwd }
    }

    fn env(&self, name: &str) -> Option<&str> {
        debug_assert!(SEARCHED_VARS.contains(&name), "{name} is read by the search: add it to SEARCHED_VARS");
        self.environ.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
    }

    /// The non-empty entries of a `:`-separated variable, at most
    /// [`MAX_PATH_ENTRIES`] (more counted as refused).
    fn env_list(&self, name: &'static str) -> impl Iterator<Item = &str> {
        let mut n = 0;
        self.env(name).unwrap_or("").split(':').filter(|d| !d.is_empty()).take_while(move |_| {
            n += 1;
            if n == MAX_PATH_ENTRIES + 1 {
                refused::count(name, &Refused::TooMany { what: "search path entries", cap: MAX_PATH_ENTRIES });
            }
            n <= MAX_PATH_ENTRIES
        })
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
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut push = |d: String, s: Source| {
        let d = d.trim_end_matches('/').to_owned();
        if d.is_empty() || seen.contains(&d) {
            return;
        }
        if out.len() == MAX_DIRS {
            refused::count(&d, &Refused::TooMany { what: "directories to search", cap: MAX_DIRS });
        }
        if out.len() < MAX_DIRS {
            seen.insert(d.clone());
            out.push((d, s));
        }
    };
    for d in facts.env_list("LD_LIBRARY_PATH") {
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
                path.split(':').filter(|d| d.starts_with('/')).take(MAX_PATH_ENTRIES).map(|d| format!("{}/{a}", d.trim_end_matches('/'))).find(|p| exists(p))
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
        for d in facts.env_list("PYTHONPATH") {
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
    is_cudart_name(name) || (driver && is_driver_name(name)) || is_torch_allocator_name(name)
}

/// What [`ld_so_cache_entries`] read of a loader cache.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LoaderCache {
    /// `(name, path)` of the entries whose name was wanted, in order.
    pub entries: Vec<(String, String)>,
    /// Why the cache was not read whole (malformed, or over a cap).
    pub problem: Option<String>,
}

/// The entries of an `ld.so.cache` (glibc's `glibc-ld.so.cache1.1` format,
/// alone or after the old `ld.so-1.7.0` table) whose name `want`s; empty
/// when the data is not such a cache. Linear in the entries examined
/// (at most [`LD_SO_CACHE_ENTRIES`]): a name is read up to 256 bytes, a
/// path (only for a wanted name) up to 4096, so a cache without a NUL
/// costs no more than a well-formed one; a cache claiming more entries
/// than it holds, or strings without an end, is reported in `problem`.
pub fn ld_so_cache_entries(data: &[u8], want: &dyn Fn(&str) -> bool) -> LoaderCache {
    const MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
    const HEADER: usize = 48;
    const ENTRY: usize = 24;
    const OLD_ENTRY: usize = 12;
    const NAME_MAX: usize = 256;
    const PATH_MAX: usize = 4096;
    let u32_at = |off: usize| -> Option<u32> { Some(u32::from_le_bytes(data.get(off..off.checked_add(4)?)?.try_into().ok()?)) };
    let mut out = LoaderCache::default();
    // The new header is at the start, or right after the old table
    // (aligned to 4 or 8 bytes, depending on the glibc that wrote it).
    let base = if data.starts_with(MAGIC) {
        Some(0)
    } else if data.starts_with(OLD_MAGIC) {
        let end = u32_at(12).and_then(|n| (n as usize).checked_mul(OLD_ENTRY)).and_then(|t| t.checked_add(16));
        end.and_then(|end| {
            [end, end.next_multiple_of(4), end.next_multiple_of(8)]
                .into_iter()
                .find(|b| data.get(*b..).is_some_and(|d| d.starts_with(MAGIC)))
        })
    } else {
        None
    };
    let Some(base) = base else {
        if data.starts_with(OLD_MAGIC) {
            out.problem = Some("an old-format cache with no glibc-ld.so.cache1.1 table after it".into());
        }
        return out;
    };
    let Some(nlibs) = u32_at(base + 20) else {
        out.problem = Some("truncated header".into());
        return out;
    };
    let room = data.len().saturating_sub(base + HEADER) / ENTRY;
    let mut n = nlibs as usize;
    if n > room {
        out.problem = Some(format!("claims {nlibs} entries, {room} fit in its {} bytes", data.len()));
        n = room;
    }
    if n > LD_SO_CACHE_ENTRIES {
        out.problem.get_or_insert_with(|| format!("{nlibs} entries, more than the {LD_SO_CACHE_ENTRIES} examined"));
        n = LD_SO_CACHE_ENTRIES;
    }
    // NUL-terminated string at an offset from the new header, at most `max` bytes.
    let string = |off: u32, max: usize| -> Option<&[u8]> {
        let start = base.checked_add(off as usize)?;
        let rest = data.get(start..)?;
        let rest = &rest[..rest.len().min(max)];
        let end = rest.iter().position(|b| *b == 0)?;
        Some(&rest[..end])
    };
    let mut unterminated = 0usize;
    for i in 0..n {
        let off = base + HEADER + i * ENTRY;
        let (Some(key), Some(value)) = (u32_at(off + 4), u32_at(off + 8)) else { break };
        let Some(name) = string(key, NAME_MAX) else {
            unterminated += 1;
            continue;
        };
        let Ok(name) = std::str::from_utf8(name) else { continue };
        if !want(name) {
            continue;
        }
        match string(value, PATH_MAX).map(|p| String::from_utf8_lossy(p).into_owned()) {
            Some(path) => out.entries.push((name.to_owned(), path)),
            None => unterminated += 1,
        }
    }
    if unterminated > 0 && out.problem.is_none() {
        out.problem = Some(format!("{unterminated} entries whose strings have no end"));
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
/// driver) from, as it sees them (see the module documentation), handed
/// to `each` one at a time (at most [`MAX_CANDIDATES`]); paths are resolved
/// in `root` (`/proc/PID/root`). Stops at `each`'s first error.
pub fn candidates<E>(root: &Path, facts: &TargetFacts, driver: bool, mut each: impl FnMut(Found) -> Result<(), E>) -> Result<(), E> {
    let exists = |p: &str| procfs::exists_in_root(root, Path::new(p));
    let listed = Cell::new(0usize);
    let list = |d: &str| -> Vec<String> {
        let left = MAX_LISTED.saturating_sub(listed.get());
        if left == 0 {
            if listed.get() == MAX_LISTED {
                refused::count(d, &Refused::TooMany { what: "directory entries listed", cap: MAX_LISTED });
                listed.set(MAX_LISTED + 1);
            }
            return Vec::new();
        }
        let Some((names, cut)) = procfs::list_in_root(root, Path::new(d), left.min(MAX_PER_DIR)) else { return Vec::new() };
        listed.set(listed.get() + names.len());
        if cut && names.len() == MAX_PER_DIR {
            refused::count(d, &Refused::TooMany { what: "entries of one directory", cap: MAX_PER_DIR });
        }
        names.into_iter().filter_map(|n| n.into_string().ok()).collect()
    };
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut handed = 0usize;
    let mut hand = |path: String, source: Source, each: &mut dyn FnMut(Found) -> Result<(), E>| -> Result<bool, E> {
        if !seen.insert(path.clone()) {
            return Ok(true);
        }
        if handed == MAX_CANDIDATES {
            refused::count(&path, &Refused::TooMany { what: "candidate CUDA libraries", cap: MAX_CANDIDATES });
            return Ok(false);
        }
        handed += 1;
        each(Found { path, source })?;
        Ok(true)
    };
    for (dir, source) in directories(facts, &exists, &list) {
        let mut names: Vec<String> = list(&dir).into_iter().filter(|n| wanted_name(n, driver)).collect();
        names.sort();
        for n in names {
            if !hand(format!("{dir}/{n}"), source, &mut each)? {
                return Ok(());
            }
        }
    }
    const CACHE: &str = "/etc/ld.so.cache";
    let Ok(file) = procfs::open_in_root(root, Path::new(CACHE)) else { return Ok(()) };
    let Ok(data) = procfs::read_capped(&file, CACHE, "loader cache", LD_SO_CACHE_LIMIT) else { return Ok(()) };
    let cache = ld_so_cache_entries(&data, &|name| wanted_name(name, driver));
    if let Some(detail) = cache.problem {
        refused::count(CACHE, &Refused::Malformed { what: "loader cache", detail });
    }
    for (_, path) in cache.entries {
        if !hand(path, Source::LdSoCache, &mut each)? {
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Every variable the search reads is kept of a target's environment:
    /// the `debug_assert` in `TargetFacts::env` does not run in release
    /// builds, so the source is read here.
    #[test]
    fn every_variable_the_search_reads_is_in_searched_vars() {
        let src = include_str!("search.rs");
        let code = &src[..src.find("#[cfg(test)]").unwrap_or(src.len())];
        let mut read = Vec::new();
        for call in [".env(\"", ".env_list(\""] {
            for (at, _) in code.match_indices(call) {
                let rest = &code[at + call.len()..];
                read.push(&rest[..rest.find('"').unwrap_or(0)]);
            }
        }
        assert!(read.len() >= 6, "the scan found too few reads: {read:?}");
        for name in &read {
            assert!(SEARCHED_VARS.contains(name), "{name} is read by the search but not in SEARCHED_VARS");
        }
        for name in SEARCHED_VARS {
            assert!(read.contains(name), "{name} is in SEARCHED_VARS but never read: drop it");
        }
    }

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
        let data = fs::read("/etc/ld.so.cache").expect("/etc/ld.so.cache");
        let cache = ld_so_cache_entries(&data, &|_| true);
        assert_eq!(cache.problem, None);
        assert!(
            cache.entries.iter().any(|(k, v)| k == "libc.so.6" && v.ends_with("/libc.so.6")),
            "libc.so.6 not in {} entries of /etc/ld.so.cache",
            cache.entries.len()
        );
        let only = ld_so_cache_entries(&data, &|n| n == "libc.so.6");
        assert!(!only.entries.is_empty() && only.entries.iter().all(|(k, _)| k == "libc.so.6"));
        assert_eq!(ld_so_cache_entries(b"not a cache", &|_| true), LoaderCache::default());
    }

    /// A cache claiming `nlibs` entries, `present` of them there, each
    /// naming a string at the start of a `tail` of bytes without a NUL (the
    /// attack: a scan for the end of each string reads the whole tail).
    fn hostile_cache(nlibs: u32, present: usize, tail: usize) -> Vec<u8> {
        let mut d = b"glibc-ld.so.cache1.1".to_vec();
        d.extend_from_slice(&nlibs.to_le_bytes());
        d.resize(48, 0x41);
        let strings = (48 + present * 24) as u32;
        for _ in 0..present {
            d.extend_from_slice(&1u32.to_le_bytes());
            d.extend_from_slice(&strings.to_le_bytes());
            d.extend_from_slice(&strings.to_le_bytes());
            d.extend_from_slice(&[0x41; 12]);
        }
        d.resize(d.len() + tail, 0x41);
        d
    }

    /// The attack's cache (a million entries, no NUL) is read in linear
    /// time and reported; the old parser scanned to the end of the data
    /// for every string (quadratic: minutes at 100% CPU).
    #[test]
    fn malformed_loader_cache_is_linear_and_reported() {
        let time = |nlibs: u32, present: usize, tail: usize| {
            let data = hostile_cache(nlibs, present, tail);
            let t = std::time::Instant::now();
            let cache = ld_so_cache_entries(&data, &|n| wanted_name(n, true));
            (t.elapsed(), cache)
        };
        let (_, cache) = time(1_000_000, 10_000, 0);
        assert!(cache.problem.as_deref().is_some_and(|p| p.contains("claims 1000000 entries, 10000 fit")), "{cache:?}");
        // The attack: a million entries over 8 MiB without a NUL (the old
        // parser read ~10^13 bytes). Bounded per string: well under 1 s.
        let (t, cache) = time(1_000_000, 1_000_000, 8 << 20);
        assert!(cache.entries.is_empty());
        assert!(cache.problem.as_deref().is_some_and(|p| p.contains("entries, more than the")), "{cache:?}");
        assert!(t < std::time::Duration::from_secs(1), "{t:?}");
        let (t, cache) = time(100_000, 100_000, 8 << 20);
        assert!(cache.problem.as_deref().is_some_and(|p| p.contains("100000 entries whose strings have no end")), "{cache:?}");
        assert!(t < std::time::Duration::from_millis(500), "{t:?}");
        // A well-formed entry among them is still found.
        let mut data = hostile_cache(3, 3, 300);
        let strings = data.len() as u32;
        data.extend_from_slice(b"libcudart.so.12\0/opt/cuda/libcudart.so.12\0");
        data[48 + 24 + 4..48 + 24 + 8].copy_from_slice(&strings.to_le_bytes());
        data[48 + 24 + 8..48 + 24 + 12].copy_from_slice(&(strings + 16).to_le_bytes());
        let cache = ld_so_cache_entries(&data, &|n| wanted_name(n, false));
        assert_eq!(cache.entries, [("libcudart.so.12".to_owned(), "/opt/cuda/libcudart.so.12".to_owned())]);
        assert!(cache.problem.as_deref().is_some_and(|p| p.contains("2 entries")), "{cache:?}");
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
        let mut found: Vec<Found> = Vec::new();
        candidates(&base, &facts, true, |f| {
            found.push(f);
            Ok::<(), ()>(())
        })
        .unwrap();
        found.retain(|f| f.source != Source::LdSoCache && f.source != Source::LibDir);
        assert_eq!(
            found,
            [Found { path: "/opt/py/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12".into(), source: Source::SitePackages }]
        );
        let _ = fs::remove_dir_all(&base);
    }
}
