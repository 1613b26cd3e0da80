//! A target whose root (a container's filesystem) is hostile: the tracer
//! reads files there (its LD_LIBRARY_PATH, its loader cache) to probe the
//! CUDA libraries it could load. Each test builds a root the way the
//! attack was found (a mount namespace and `unshare --root`, the host's
//! /usr bound in, the hostile file planted), runs `record` on a shell in
//! that root under a memory cgroup (512 MiB, the DaemonSet's limit) and a
//! timeout, and checks: `record` ends, nothing was killed for memory, the
//! target ran to its end (its exit status), and the recording's one note
//! on refused files counts the refusal.
//!
//! - a FIFO named `libcudart.so.12` on `LD_LIBRARY_PATH` (the old tracer
//!   blocked in `open` for good);
//! - `/etc/ld.so.cache -> /dev/zero` (the old tracer read it into memory:
//!   3 GB in 8 s);
//! - a sparse `libcudart.so.12` whose `.dynsym` claims 10 GB (the old
//!   tracer allocated and read it: OOM in 3 s);
//! - a malformed `ld.so.cache`, 1,000,000 entries and no NUL (the old
//!   parser was quadratic: hours at 100% CPU);
//! - a directory on `LD_LIBRARY_PATH` swapped, while the tracer searches
//!   it, with a symlink to the absolute path of a host-only directory with
//!   a FIFO `libcudart.so.12`: resolved by name outside the root (a check,
//!   then a re-open by name, as the old fallback without openat2 did), it
//!   is the host's FIFO; the test watches the FIFO for a reader the whole
//!   time (a non-blocking open for writing succeeds only when one has it
//!   open, or is blocked opening it); with openat2 and with the fallback
//!   forced (`INFERTRACE_TEST_NO_OPENAT2`).
//!
//! Needs root, the binary, util-linux's `unshare` and `mount`, and a memory
//! cgroup (v2 or v1); under `CI=true` a missing one fails the test.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use infertrace_e2e::*;

/// The memory the tracer (and its small target) may use: the DaemonSet's limit.
const MEMORY_LIMIT: u64 = 512 << 20;
/// How long one `record` may take (it records a target of a second or a few).
const BOUND: Duration = Duration::from_secs(90);

/// Runs `inner` (a shell command) as the target, in `root` (its own mount
/// namespace, the host's /usr and /dev bound in, `/bin`, `/lib`, `/lib64`
/// links into /usr as on the host) with `LD_LIBRARY_PATH=ld_path`, under
/// `record` in a memory cgroup. Returns the run, the report, the memory
/// peak and the time taken.
fn record_in_root(test: &str, root: &Path, ld_path: &str, inner: &str) -> (Run, Report, Option<u64>, Duration) {
    record_in_root_with(test, root, ld_path, inner, &[])
}

/// [`record_in_root`] with `env` set for the tracer.
fn record_in_root_with(test: &str, root: &Path, ld_path: &str, inner: &str, env: &[(&str, &str)]) -> (Run, Report, Option<u64>, Duration) {
    for d in ["usr", "dev", "etc", "tmp"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    for (link, to) in [("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")] {
        if !root.join(link).exists() {
            let _ = symlink(to, root.join(link));
        }
    }
    let outer = r#"mount --rbind /usr "$1/usr" && mount --rbind /dev "$1/dev" || exit 125
exec unshare --root="$1" /usr/bin/env -i PATH=/usr/bin LD_LIBRARY_PATH="$2" /usr/bin/sh -c "$3""#;
    let cg = MemCgroup::new(test, MEMORY_LIMIT).unwrap_or_else(|e| panic!("{test}: {e}"));
    let out = root.parent().unwrap().join(format!("{test}.itr"));
    let args: Vec<&OsStr> = vec![
        "record".as_ref(),
        "-q".as_ref(),
        "--format".as_ref(),
        "json".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
        "--".as_ref(),
        "unshare".as_ref(),
        "-m".as_ref(),
        "--propagation".as_ref(),
        "private".as_ref(),
        "sh".as_ref(),
        "-c".as_ref(),
        outer.as_ref(),
        "sh".as_ref(),
        root.as_os_str(),
        ld_path.as_ref(),
        inner.as_ref(),
    ];
    let started = Instant::now();
    let mut cmd = cg.command(&bin(), &args);
    cmd.envs(env.iter().copied());
    let run = wait_child(spawn(&mut cmd), BOUND, test);
    let took = started.elapsed();
    let peak = cg.peak();
    assert_eq!(cg.oom_kills(), 0, "{test}: killed for memory under {MEMORY_LIMIT} bytes\n{}", run.describe());
    run.assert_ok();
    assert!(out.is_file(), "{test}: recording {} not written\n{}", out.display(), run.describe());
    let rep = run.json();
    rep.check_invariants();
    eprintln!("{test}: record took {took:?}, memory peak {:?} MiB", peak.map(|p| p >> 20));
    (run, rep, peak, took)
}

/// The recording's note on refused files.
fn refusal_note(rep: &Report) -> String {
    let notes = rep.0["notes"].as_array().cloned().unwrap_or_default();
    notes
        .iter()
        .filter_map(|n| n.as_str())
        .find(|n| n.starts_with("files of targets not read"))
        .unwrap_or_else(|| panic!("no note on refused files in {notes:?}"))
        .to_owned()
}

/// The target ran to its end: its last command wrote `done` in the root.
fn assert_target_finished(root: &Path, rep: &Report) {
    let done = fs::read_to_string(root.join("tmp/done")).unwrap_or_default();
    assert_eq!(done.trim(), "done", "the target did not run to its end\n{}", rep.0);
}

fn setup(test: &str) -> Option<TempDir> {
    if !require(test, &[Need::Root, Need::Binary, Need::Unshare]) {
        return None;
    }
    Some(TempDir::new(test))
}

const SLEEP_THEN_DONE: &str = "sleep 0.5; echo done > /tmp/done";

#[test]
fn fifo_named_libcudart_on_ld_library_path() {
    let Some(tmp) = setup("fifo_libcudart") else { return };
    let root = tmp.join("root");
    fs::create_dir_all(root.join("evil")).unwrap();
    mkfifo(&root.join("evil/libcudart.so.12")).unwrap();
    mkfifo(&root.join("evil/libcuda.so.1")).unwrap();
    let (_, rep, _, _) = record_in_root("fifo_libcudart", &root, "/evil", SLEEP_THEN_DONE);
    assert_target_finished(&root, &rep);
    let note = refusal_note(&rep);
    assert!(note.contains("not a regular file") && note.contains("FIFO"), "{note}");
}

#[test]
fn loader_cache_linked_to_dev_zero() {
    let Some(tmp) = setup("cache_dev_zero") else { return };
    let root = tmp.join("root");
    fs::create_dir_all(root.join("etc")).unwrap();
    symlink("/dev/zero", root.join("etc/ld.so.cache")).unwrap();
    let (_, rep, peak, _) = record_in_root("cache_dev_zero", &root, "/nowhere", SLEEP_THEN_DONE);
    assert_target_finished(&root, &rep);
    let note = refusal_note(&rep);
    assert!(note.contains("/etc/ld.so.cache: not a regular file (a character device)"), "{note}");
    assert!(peak.is_none_or(|p| p < MEMORY_LIMIT), "{peak:?}");
}

#[test]
fn sparse_libcudart_claiming_a_huge_symbol_table() {
    let Some(tmp) = setup("sparse_elf") else { return };
    let root = tmp.join("root");
    fs::create_dir_all(root.join("evil")).unwrap();
    sparse_elf(&root.join("evil/libcudart.so.12"), 10 << 30).unwrap();
    let (_, rep, _, _) = record_in_root("sparse_elf", &root, "/evil", SLEEP_THEN_DONE);
    assert_target_finished(&root, &rep);
    let note = refusal_note(&rep);
    assert!(note.contains("over its size limit") && note.contains("/evil/libcudart.so.12: ELF symbol table of 10737418240 bytes"), "{note}");
}

#[test]
fn malformed_loader_cache_of_a_million_entries() {
    let Some(tmp) = setup("cache_malformed") else { return };
    let root = tmp.join("root");
    fs::create_dir_all(root.join("etc")).unwrap();
    // The header claims 1,000,000 entries, and they are there (24 MB),
    // every string offset (0x01010101) inside the file, and no NUL
    // anywhere: a scan for the end of each string reads to the end.
    let mut cache = b"glibc-ld.so.cache1.1".to_vec();
    cache.extend_from_slice(&1_000_000u32.to_le_bytes());
    cache.resize(48, 0x41);
    for _ in 0..1_000_000 {
        cache.extend_from_slice(&[0x41, 0x41, 0x41, 0x41, 1, 1, 1, 1, 1, 1, 1, 1]);
        cache.extend_from_slice(&[0x41; 12]);
    }
    cache.resize(cache.len() + 4096, 0x41);
    assert!(!cache[48..].contains(&0));
    fs::write(root.join("etc/ld.so.cache"), &cache).unwrap();
    let (_, rep, _, took) = record_in_root("cache_malformed", &root, "/nowhere", SLEEP_THEN_DONE);
    assert_target_finished(&root, &rep);
    let note = refusal_note(&rep);
    assert!(note.contains("/etc/ld.so.cache: malformed loader cache: 1000000 entries"), "{note}");
    assert!(took < Duration::from_secs(60), "{took:?}");
}

/// Swaps two paths at once (`renameat2(RENAME_EXCHANGE)`).
fn exchange(a: &Path, b: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let (Ok(a), Ok(b)) = (std::ffi::CString::new(a.as_os_str().as_bytes()), std::ffi::CString::new(b.as_os_str().as_bytes())) else {
        return false;
    };
    // SAFETY: two NUL-terminated paths.
    unsafe { libc::syscall(libc::SYS_renameat2, libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), libc::RENAME_EXCHANGE) == 0 }
}

/// The symlink race: `evil/d`, a directory on `LD_LIBRARY_PATH` holding a
/// `libcudart.so.12`, swapped over and over with a symlink to the
/// absolute path of a host-only directory holding a FIFO of that name,
/// while 60 targets with distinct environments (each searched anew) look
/// in it. Checked, then opened again by name (the old fallback where
/// openat2 is missing or refused by seccomp), the path is the host's FIFO:
/// run with openat2 and with the fallback forced.
fn flip_race(test: &str, env: &[(&str, &str)]) {
    let Some(tmp) = setup(test) else { return };
    let root = tmp.join("root");
    let host_dir = tmp.join("host-only");
    fs::create_dir_all(root.join("evil/d")).unwrap();
    fs::create_dir_all(&host_dir).unwrap();
    fs::write(root.join("evil/d/libcudart.so.12"), b"not an ELF file").unwrap();
    let host_fifo = host_dir.join("libcudart.so.12");
    mkfifo(&host_fifo).unwrap();
    symlink(&host_dir, root.join("evil/d.alt")).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let (flips, opened) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let flipper = {
        let (stop, flips, opened) = (stop.clone(), flips.clone(), opened.clone());
        let (d, alt, host_fifo) = (root.join("evil/d"), root.join("evil/d.alt"), host_fifo.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if exchange(&d, &alt) {
                    flips.fetch_add(1, Ordering::Relaxed);
                }
                if fifo_has_reader(&host_fifo) {
                    opened.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let inner = "i=0; while [ $i -lt 60 ]; do LD_LIBRARY_PATH=/evil/d:/n$i sleep 0.05; i=$((i+1)); done; echo done > /tmp/done";
    let result = std::panic::catch_unwind(|| record_in_root_with(test, &root, "/evil/d", inner, env));
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
    let (_, rep, _, _) = result.unwrap_or_else(|e| std::panic::resume_unwind(e));
    assert_target_finished(&root, &rep);
    let flips = flips.load(Ordering::Relaxed);
    assert!(flips > 100, "the directory was swapped only {flips} times");
    assert_eq!(opened.load(Ordering::Relaxed), 0, "the host-only FIFO was opened (the search left the root)");
}

#[test]
fn flipped_link_never_reaches_a_host_fifo() {
    flip_race("flip_race", &[]);
}

#[test]
fn flipped_link_never_reaches_a_host_fifo_without_openat2() {
    flip_race("flip_race_walk", &[("INFERTRACE_TEST_NO_OPENAT2", "1")]);
}
