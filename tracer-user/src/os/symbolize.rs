//! Turning raw instruction pointers into [`Frame`]s with blazesym.
//!
//! User space: [`Symbolizer::observe_process`] snapshots the executable,
//! file-backed mappings of a live process from `/proc/PID/maps` and opens
//! each mapped file right away (through `/proc/PID/map_files/`, or else by
//! its path resolved inside the process's own root, `/proc/PID/root`, with
//! symlinks confined to that root: `procfs::open_mapped`), so that
//! containers work and the files stay readable after the process exits or
//! the file is deleted. blazesym is handed `/proc/self/fd/N` of the file
//! opened and checked (a regular file), never the target's path. An address
//! is then turned into (file, file offset) and handed to blazesym's ELF
//! source as a file offset; DWARF supplies file, line and inlined functions
//! where present, the ELF symbol table otherwise. Names are demangled (Rust,
//! C++).
//!
//! Kernel space: blazesym's kernel source over `/proc/kallsyms`.
//!
//! Everything is cached: user frames by (file identity, file offset), where
//! the file identity is the opened file's device and inode, so that the same
//! library mapped by many processes is resolved once; kernel frames by
//! address. Lookups are batched per file.

use std::{collections::HashMap, fs::File, os::unix::io::AsRawFd, path::PathBuf};

use blazesym::{
    symbolize::{
        source::{Elf, Kernel, Source},
        Input, Sym, Symbolized,
    },
    MaybeDefault,
};

pub use crate::recording::{JIT_MODULE, JIT_PERF_MAP_MODULE, UNKNOWN};

/// The function of an unresolved leaf whose code is a spin-wait loop
/// (`pause` within [`SPIN_WINDOW`] bytes): the verdict's pool rule counts
/// such samples as spinning (docs/verdict.md#native-worker-pools).
pub const SPIN_WAIT: &str = "[spin-wait]";
/// Bytes looked at on each side of the sampled instruction.
pub const SPIN_WINDOW: u64 = 10;
use crate::{
    os::{perfmap, procfs::{self, MapsLine}},
    recording::{Frame, FrameKind},
};


/// File descriptors kept back from the budget of held-open object files, for
/// everything else the tracer opens (BPF maps and programs, perf events...).
const FD_RESERVE: u64 = 512;

/// An object file (executable or shared library) some process mapped.
struct Object {
    /// What blazesym opens: `/proc/self/fd/N` of `file` while it is held,
    /// else a path into the (then live) process.
    path: PathBuf,
    /// Keeps the file readable after its process exits or it is deleted.
    file: Option<File>,
}

/// One executable mapping of a process.
#[derive(Clone)]
struct Mapping {
    start: u64,
    end: u64,
    /// File offset of `start`.
    offset: u64,
    /// Basename of the mapped path (`[vdso]` and such for special mappings);
    /// `None` for anonymous memory (JIT code).
    module: Option<String>,
    /// Index into `Symbolizer::objects`; `None` when the file could not be opened.
    object: Option<usize>,
}

/// Most mappings unmapped since a snapshot that a process's snapshot keeps
/// (see [`Symbolizer::reobserve_process`]).
const MAX_STALE_MAPPINGS: usize = 4096;

/// Where one input address goes.
enum Slot {
    /// Resolved (or to be resolved) through the user cache.
    Cached((usize, u64)),
    /// Not in a symbolizable file: a single unknown frame.
    Unknown(Option<String>),
    /// In code generated at run time (an anonymous executable mapping):
    /// named by the process's perf map where it has one.
    Jit(u64),
}


/// A process's perf map as last read.
struct JitNames {
    source: perfmap::Source,
    /// `None` until first read.
    map: Option<perfmap::PerfMap>,
    read_at: Option<std::time::Instant>,
}

/// Processes whose root directory is held open for their perf map (one
/// descriptor each); past this, a map is read only while its process
/// lives.
const MAX_JIT_ROOTS: usize = 256;

/// A perf map that misses an address is read again at most this often
/// (and only when it grew).
const PERF_MAP_REREAD: std::time::Duration = std::time::Duration::from_secs(1);

pub struct Symbolizer {
    inner: blazesym::symbolize::Symbolizer,
    kernel: Source<'static>,
    objects: Vec<Object>,
    /// (st_dev, st_ino) of an opened file -> index into `objects`.
    by_identity: HashMap<(u64, u64), usize>,
    /// (device as written in /proc/PID/maps, inode) -> index into `objects`;
    /// spares opening a file that is already held.
    by_maps_id: HashMap<(String, u64), usize>,
    /// pid -> executable mappings, sorted by start address.
    processes: HashMap<u32, Vec<Mapping>>,
    user_cache: HashMap<(usize, u64), Vec<Frame>>,
    /// Whether the code at an unresolved leaf address is a spin-wait loop.
    spin_cache: HashMap<(usize, u64), bool>,
    /// Perf maps by process, read on the first address in generated code.
    perf_maps: HashMap<u32, JitNames>,
    kernel_cache: HashMap<u64, Frame>,
    /// How many more files may be held open.
    fd_budget: u64,
    /// Try /proc/PID/map_files first (off in tests of the fallback).
    use_map_files: bool,
}

// SAFETY: blazesym's `Symbolizer` is `!Send` only because its caches share
// data through `Rc`/`RefCell` and hold `Box<dyn Resolve>` trait objects
// without a `Send` bound; it uses no thread-local state. All those `Rc`
// clones live inside the blazesym `Symbolizer` that this struct owns
// exclusively, and nothing borrowed from it (`Symbolized<'_>`) outlives a
// method call here (results are converted into owned `Frame`s at once), so
// moving the whole `Symbolizer` to another thread moves every clone with it.
// It is not `Sync`.
unsafe impl Send for Symbolizer {}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// Drops the mappings kept of these processes (the agent, once they
    /// exited and a window covered their end); files they shared with
    /// others stay open.
    pub fn forget(&mut self, pids: &std::collections::HashSet<u32>) {
        self.processes.retain(|pid, _| !pids.contains(pid));
        self.perf_maps.retain(|pid, _| !pids.contains(pid));
        self.compact(COMPACT_MIN);
    }

    /// Drops the files no observed process maps any more, once there are
    /// at least `min` of them and they are half of those held: their
    /// descriptors, their frames in the cache, and blazesym's parses (the
    /// inner symbolizer is made anew: it knows files by their
    /// `/proc/self/fd/N` path, and a number closed here is given to the
    /// next file opened). Without this an agent on a node where
    /// containers come and go would hold every library it ever saw.
    fn compact(&mut self, min: usize) {
        let mut live = vec![false; self.objects.len()];
        for m in self.processes.values().flatten() {
            if let Some(i) = m.object {
                live[i] = true;
            }
        }
        let dead = live.iter().filter(|l| !**l).count();
        if dead == 0 || dead < min || dead * 2 < self.objects.len() {
            return;
        }
        let mut remap = vec![None; self.objects.len()];
        let mut kept = Vec::with_capacity(self.objects.len() - dead);
        for (i, o) in std::mem::take(&mut self.objects).into_iter().enumerate() {
            if live[i] {
                remap[i] = Some(kept.len());
                kept.push(o);
            } else if o.file.is_some() {
                self.fd_budget += 1;
            }
        }
        self.objects = kept;
        for m in self.processes.values_mut().flatten() {
            m.object = m.object.and_then(|i| remap[i]);
        }
        self.by_identity = std::mem::take(&mut self.by_identity).into_iter().filter_map(|(k, i)| Some((k, remap[i]?))).collect();
        self.by_maps_id = std::mem::take(&mut self.by_maps_id).into_iter().filter_map(|(k, i)| Some((k, remap[i]?))).collect();
        self.user_cache =
            std::mem::take(&mut self.user_cache).into_iter().filter_map(|((i, off), f)| Some(((remap[i]?, off), f))).collect();
        self.inner = inner_symbolizer();
    }

    pub fn new() -> Self {
        let inner = inner_symbolizer();
        let kernel = Kernel {
            kallsyms: MaybeDefault::Some(PathBuf::from("/proc/kallsyms")),
            vmlinux: MaybeDefault::None,
            debug_syms: false,
            ..Kernel::default()
        };
        Symbolizer {
            inner,
            kernel: Source::Kernel(kernel),
            objects: Vec::new(),
            by_identity: HashMap::new(),
            by_maps_id: HashMap::new(),
            processes: HashMap::new(),
            user_cache: HashMap::new(),
            spin_cache: HashMap::new(),
            perf_maps: HashMap::new(),
            kernel_cache: HashMap::new(),
            fd_budget: fd_budget(),
            use_map_files: true,
        }
    }

    /// Snapshot the file-backed executable mappings of a live process. Call on first sight and after exec; calling again replaces the snapshot. Errors are swallowed (process gone): returns false.
    ///
    /// A process that has exited but is not yet reaped (a zombie) still has
    /// a /proc entry, with no mappings: that never replaces a snapshot (a
    /// live process always maps some code), so a late re-snapshot cannot
    /// erase what its stacks need.
    pub fn observe_process(&mut self, pid: u32) -> bool {
        self.observe(pid, false)
    }

    /// [`observe_process`](Self::observe_process) again for a process
    /// whose image has not changed since (no exec): the mappings unmapped
    /// since the last snapshot and not replaced by another are kept (at
    /// most [`MAX_STALE_MAPPINGS`]), because stacks captured before hold
    /// their addresses. A JIT frees its code when the process shuts down
    /// (oneDNN's kernels at interpreter exit): a snapshot taken then, the
    /// last before the exit, would leave every earlier sample in that code
    /// unnamed.
    pub fn reobserve_process(&mut self, pid: u32) -> bool {
        self.observe(pid, true)
    }

    fn observe(&mut self, pid: u32, keep_unmapped: bool) -> bool {
        let Ok(maps) = procfs::maps(pid) else {
            return false;
        };
        let mut mappings = Vec::new();
        for entry in maps {
            if !entry.executable {
                continue;
            }
            let object = if entry.is_file() { self.object_for(pid, &entry) } else { None };
            // An anonymous executable mapping is code generated at run time
            // (oneDNN's kernels, a JIT): named as such, not left nameless.
            let module = Some(entry.path.as_ref().map(|_| entry.basename().to_owned()).unwrap_or_else(|| JIT_MODULE.to_owned()));
            mappings.push(Mapping { start: entry.start, end: entry.end, offset: entry.offset, module, object });
        }
        if mappings.is_empty() {
            return false;
        }
        // Live mappings are disjoint: sorted by start, their ends ascend too.
        mappings.sort_by_key(|m| m.start);
        if keep_unmapped {
            if let Some(old) = self.processes.get(&pid) {
                let live = &mappings;
                let overlaps_live = |o: &Mapping| {
                    let i = live.partition_point(|m| m.start < o.end);
                    i > 0 && live[i - 1].end > o.start
                };
                let gone: Vec<Mapping> = old.iter().filter(|o| !overlaps_live(o)).take(MAX_STALE_MAPPINGS).cloned().collect();
                if !gone.is_empty() {
                    mappings.extend(gone);
                    mappings.sort_by_key(|m| m.start);
                }
            }
        }
        // Code generated at run time: where its perf map is, taken now
        // (the process may be gone when its stacks are named).
        if mappings.iter().any(|m| m.module.as_deref() == Some(JIT_MODULE)) && !self.perf_maps.contains_key(&pid) {
            let hold = self.perf_maps.len() < MAX_JIT_ROOTS;
            self.perf_maps.insert(pid, JitNames { source: perfmap::Source::of(pid, hold), map: None, read_at: None });
        }
        self.processes.insert(pid, mappings);
        true
    }

    /// Leaf-first user frames for raw user-space instruction pointers of `pid` (as returned by bpf_get_stackid with BPF_F_USER_STACK; addresses after the first are return addresses: subtract 1 before lookup for frames other than the leaf to land inside the call instruction).
    ///
    /// An address inside inlined code yields several frames (innermost
    /// first), so the result may be longer than `addrs`. An address that
    /// resolves to nothing yields one `[unknown]` frame with the module it
    /// fell in, when known. A process never observed is observed now (which
    /// only works while it lives).
    pub fn user_frames(&mut self, pid: u32, addrs: &[u64]) -> Vec<Frame> {
        if !self.processes.contains_key(&pid) {
            self.observe_process(pid);
        }
        let empty = Vec::new();
        let mappings = self.processes.get(&pid).unwrap_or(&empty);
        let mut slots = Vec::with_capacity(addrs.len());
        let mut wanted: HashMap<usize, Vec<u64>> = HashMap::new();
        for (i, &addr) in addrs.iter().enumerate() {
            let addr = if i == 0 { addr } else { addr.saturating_sub(1) };
            let slot = match find_mapping(mappings, addr) {
                Some(Mapping { start, offset, object: Some(object), .. }) => {
                    let key = (*object, addr - start + offset);
                    if !self.user_cache.contains_key(&key) {
                        wanted.entry(key.0).or_default().push(key.1);
                    }
                    Slot::Cached(key)
                }
                Some(m) if m.module.as_deref() == Some(JIT_MODULE) => Slot::Jit(addr),
                Some(m) => Slot::Unknown(m.module.clone()),
                None => Slot::Unknown(None),
            };
            slots.push(slot);
        }
        for (object, mut offsets) in wanted {
            offsets.sort_unstable();
            offsets.dedup();
            let module = module_of(mappings, object);
            let path = &self.objects[object].path;
            let src = Source::Elf(Elf::new(path.clone()));
            let results = self.inner.symbolize(&src, Input::FileOffset(&offsets));
            match results {
                Ok(results) => {
                    for (offset, result) in offsets.iter().zip(results) {
                        self.user_cache.insert((object, *offset), user_frames_of(result, &module));
                    }
                }
                Err(_) => {
                    for offset in offsets {
                        self.user_cache.insert((object, offset), vec![unknown(FrameKind::Native, module.clone())]);
                    }
                }
            }
        }
        let mut frames = Vec::with_capacity(slots.len());
        for (i, slot) in slots.into_iter().enumerate() {
            match slot {
                Slot::Cached(key) => {
                    // An unresolved leaf in a stripped library (libgomp, MKL,
                    // oneDNN): a spin-wait loop when its code has a `pause`.
                    let unresolved = self.user_cache[&key].len() == 1 && self.user_cache[&key][0].function == UNKNOWN;
                    if i == 0 && unresolved && self.spins_at(key) {
                        frames.push(Frame { function: SPIN_WAIT.to_owned(), ..self.user_cache[&key][0].clone() });
                    } else {
                        frames.extend(self.user_cache[&key].iter().cloned());
                    }
                }
                Slot::Unknown(module) => frames.push(unknown(FrameKind::Native, module)),
                Slot::Jit(addr) => frames.push(match self.jit_name(pid, addr) {
                    Some(name) => Frame { function: name, file: None, line: None, kind: FrameKind::Native, module: Some(JIT_PERF_MAP_MODULE.to_owned()) },
                    None => unknown(FrameKind::Native, Some(JIT_MODULE.to_owned())),
                }),
            }
        }
        frames
    }

    /// The name process `pid`'s perf map gives `addr` (generated code). The
    /// map is read on the first such address, and again (at most every
    /// [`PERF_MAP_REREAD`], when it grew) on a miss: a JIT appends to it.
    fn jit_name(&mut self, pid: u32, addr: u64) -> Option<String> {
        let names = self.perf_maps.get_mut(&pid)?;
        if let Some(name) = names.map.as_ref().and_then(|m| m.lookup(addr)) {
            return Some(name.to_owned());
        }
        let now = std::time::Instant::now();
        if names.read_at.is_some_and(|t| now.duration_since(t) < PERF_MAP_REREAD) {
            return None;
        }
        names.read_at = Some(now);
        if let Some(map) = names.source.load_changed(names.map.as_ref()) {
            names.map = Some(map);
        }
        names.map.as_ref().and_then(|m| m.lookup(addr)).map(str::to_owned)
    }

    /// Whether the code around file offset `key.1` of object `key.0` holds
    /// a `pause` (`f3 90`): the instruction of x86 spin-wait loops (OpenMP
    /// barriers, MKL and oneDNN pools, spinlocks). Read once per address,
    /// through the object's own descriptor, [`SPIN_WINDOW`] bytes each side.
    fn spins_at(&mut self, key: (usize, u64)) -> bool {
        if let Some(&b) = self.spin_cache.get(&key) {
            return b;
        }
        let spins = cfg!(target_arch = "x86_64")
            && self.objects.get(key.0).and_then(|o| o.file.as_ref()).is_some_and(|f| {
                use std::os::unix::fs::FileExt;
                let from = key.1.saturating_sub(SPIN_WINDOW);
                let mut buf = [0u8; 2 * SPIN_WINDOW as usize + 2];
                let n = f.read_at(&mut buf, from).unwrap_or(0);
                has_pause(&buf[..n])
            });
        self.spin_cache.insert(key, spins);
        spins
    }

    /// Leaf-first kernel frames. As for user stacks, addresses after the
    /// first are taken as return addresses (looked up at `addr - 1`).
    pub fn kernel_frames(&mut self, addrs: &[u64]) -> Vec<Frame> {
        let lookups: Vec<u64> =
            addrs.iter().enumerate().map(|(i, &a)| if i == 0 { a } else { a.saturating_sub(1) }).collect();
        let mut wanted: Vec<u64> = lookups.iter().copied().filter(|a| !self.kernel_cache.contains_key(a)).collect();
        wanted.sort_unstable();
        wanted.dedup();
        if !wanted.is_empty() {
            match self.inner.symbolize(&self.kernel, Input::AbsAddr(&wanted)) {
                Ok(results) => {
                    for (addr, result) in wanted.iter().zip(results) {
                        let frame = match result {
                            Symbolized::Sym(sym) => kernel_frame(sym),
                            Symbolized::Unknown(_) => unknown(FrameKind::Kernel, None),
                        };
                        self.kernel_cache.insert(*addr, frame);
                    }
                }
                Err(_) => {
                    for addr in wanted {
                        self.kernel_cache.insert(addr, unknown(FrameKind::Kernel, None));
                    }
                }
            }
        }
        lookups.iter().map(|a| self.kernel_cache[a].clone()).collect()
    }

    /// The object for a file-backed mapping: already held, or opened now.
    fn object_for(&mut self, pid: u32, entry: &MapsLine) -> Option<usize> {
        let maps_id = entry.file_key();
        if let Some(&index) = self.by_maps_id.get(&maps_id) {
            return Some(index);
        }
        // map_files names the mapped file itself (even deleted, even in
        // another mount namespace) but needs CAP_SYS_ADMIN; the path inside
        // the process root is the fallback.
        let opened = procfs::open_mapped_via(pid, entry, self.use_map_files).ok()?;
        // Out of descriptors to hold, blazesym opens the file by path while
        // the process lives: only `map_files` (a magic link to the mapped
        // inode itself); never the mapped path inside the process's root,
        // which would be resolved again by name (a link swapped meanwhile
        // leads out of that root).
        let live_path = opened.via_map_files.then(|| opened.map_files.clone());
        let (file, identity) = (opened.file, opened.identity);
        let index = match self.by_identity.get(&identity) {
            Some(&index) => index,
            None => {
                // A target's file: its symbol tables bounded before
                // blazesym reads them (a refusal is counted).
                crate::os::elf::check_tables(&file, entry.path()).ok()?;
                let object = if self.fd_budget > 0 {
                    self.fd_budget -= 1;
                    Object { path: PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd())), file: Some(file) }
                } else {
                    // Out of descriptors to hold: symbolization of this file
                    // only works while the process lives.
                    Object { path: live_path?, file: None }
                };
                self.objects.push(object);
                self.by_identity.insert(identity, self.objects.len() - 1);
                self.objects.len() - 1
            }
        };
        self.by_maps_id.insert(maps_id, index);
        Some(index)
    }
}

/// Files no process maps any more are dropped when there are this many
/// (and they are half of those held).
const COMPACT_MIN: usize = 32;

fn inner_symbolizer() -> blazesym::symbolize::Symbolizer {
    blazesym::symbolize::Symbolizer::builder()
        .enable_demangling(true)
        .enable_code_info(true)
        .enable_inlined_fns(true)
        // Files are held open: their content cannot change under us.
        .enable_auto_reload(false)
        .build()
}

/// How many object files may be held open: the soft `RLIMIT_NOFILE` less a
/// reserve, at least 64. (The limit is not raised: children the tracer
/// launches would inherit it.)
fn fd_budget() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we pass.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 { lim.rlim_cur } else { 1024 };
    soft.saturating_sub(FD_RESERVE).clamp(64, 1 << 20)
}

/// Whether x86 code bytes hold a `pause` (`f3 90`, `rep nop`).
fn has_pause(code: &[u8]) -> bool {
    code.windows(2).any(|w| w == [0xf3, 0x90])
}

fn find_mapping(mappings: &[Mapping], addr: u64) -> Option<&Mapping> {
    let i = mappings.partition_point(|m| m.start <= addr);
    let m = mappings.get(i.checked_sub(1)?)?;
    (addr < m.end).then_some(m)
}

fn module_of(mappings: &[Mapping], object: usize) -> Option<String> {
    mappings.iter().find(|m| m.object == Some(object)).and_then(|m| m.module.clone())
}

fn unknown(kind: FrameKind, module: Option<String>) -> Frame {
    Frame { function: UNKNOWN.to_owned(), file: None, line: None, kind, module }
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn non_empty(name: &str) -> String {
    if name.is_empty() {
        UNKNOWN.to_owned()
    } else {
        name.to_owned()
    }
}

/// Frames of one user address, innermost inlined function first.
fn user_frames_of(result: Symbolized<'_>, module: &Option<String>) -> Vec<Frame> {
    let sym: Sym<'_> = match result {
        Symbolized::Sym(sym) => sym,
        Symbolized::Unknown(_) => return vec![unknown(FrameKind::Native, module.clone())],
    };
    // blazesym reports each frame's own location: `sym.code_info` is the
    // position inside the outer function (the call site of the first inlined
    // function), `inlined[i].code_info` the position inside inlined function i.
    let location = |info: Option<&blazesym::symbolize::CodeInfo<'_>>| match info {
        Some(info) => (Some(info.to_path().to_string_lossy().into_owned()), info.line),
        None => (None, None),
    };
    let mut frames = Vec::with_capacity(1 + sym.inlined.len());
    for inlined in sym.inlined.iter().rev() {
        let (file, line) = location(inlined.code_info.as_ref());
        frames.push(Frame {
            function: non_empty(&inlined.name),
            file,
            line,
            kind: FrameKind::Native,
            module: module.clone(),
        });
    }
    let (file, line) = location(sym.code_info.as_deref());
    frames.push(Frame { function: non_empty(&sym.name), file, line, kind: FrameKind::Native, module: module.clone() });
    frames
}

fn kernel_frame(sym: Sym<'_>) -> Frame {
    let module = sym.module.as_ref().map(|m| basename(&m.to_string_lossy()).to_owned());
    Frame { function: non_empty(&sym.name), file: None, line: None, kind: FrameKind::Kernel, module }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_pause_marks_a_spin_wait_loop() {
        // libgomp's barrier wait: pause; mov; cmp; jne back.
        assert!(super::has_pause(&[0xf3, 0x90, 0x8b, 0x07, 0x39, 0xc2, 0x75, 0xf8]));
        assert!(!super::has_pause(&[0x48, 0x89, 0xe5, 0x90, 0xf3, 0x0f, 0x1e, 0xfa]));
    }

    use super::*;
    use std::{ffi::CString, fs, path::Path};

    #[inline(never)]
    #[no_mangle]
    pub extern "C" fn infertrace_symbolize_probe_target(x: u64) -> u64 {
        std::hint::black_box(x.wrapping_mul(31).rotate_left(7))
    }

    #[inline(never)]
    fn rusty_probe_target_fn(x: u64) -> u64 {
        std::hint::black_box(x ^ 0x5a5a).wrapping_add(3)
    }

    #[test]
    fn symbolizer_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<Symbolizer>();
    }

    /// Code unmapped after a snapshot (a JIT freeing its kernels at exit)
    /// keeps its mapping through a re-snapshot of the same image, and not
    /// through a fresh one (after an exec).
    #[test]
    fn unmapped_code_stays_named_through_a_reobservation() {
        let pid = std::process::id();
        let len = 4096;
        // SAFETY: a fresh anonymous mapping of our own, unmapped below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_EXEC, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
        assert_ne!(p, libc::MAP_FAILED);
        let addr = p as u64 + 16;
        let mut s = Symbolizer::new();
        assert!(s.observe_process(pid));
        let module = |s: &mut Symbolizer| s.user_frames(pid, &[addr])[0].module.clone();
        assert_eq!(module(&mut s).as_deref(), Some(JIT_MODULE));
        // SAFETY: the mapping made above, not used after.
        assert_eq!(unsafe { libc::munmap(p, len) }, 0);
        assert!(s.reobserve_process(pid));
        assert_eq!(module(&mut s).as_deref(), Some(JIT_MODULE), "kept through a re-snapshot");
        assert!(s.observe_process(pid));
        assert_eq!(module(&mut s), None, "a fresh snapshot has only what is mapped now");
    }

    #[test]
    fn own_process_functions() {
        let pid = std::process::id();
        let mut s = Symbolizer::new();
        assert!(s.observe_process(pid));
        let a = infertrace_symbolize_probe_target as *const () as u64;
        let b = rusty_probe_target_fn as *const () as u64;
        // Leaf at the function entry; the second address is taken as a
        // return address (looked up at -1), so point it past the entry.
        let frames = s.user_frames(pid, &[a, b + 1]);
        assert!(frames.len() >= 2, "{frames:?}");
        // Inlined callees (if any) come first, innermost first, then the
        // function itself, then the caller frame's.
        let c = frames.iter().position(|f| f.function == "infertrace_symbolize_probe_target").expect("C-named fn");
        let r = frames.iter().position(|f| f.function.contains("rusty_probe_target_fn")).expect("Rust fn");
        assert!(c < r, "{frames:?}");
        assert_eq!(frames[0].kind, FrameKind::Native);
        assert!(frames.iter().all(|f| !f.function.contains("17h")), "not demangled: {frames:?}");
        let exe = std::env::current_exe().unwrap();
        let exe_name = exe.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(frames[0].module.as_deref(), Some(exe_name.as_str()));
        // Test binaries carry DWARF (debug = 1 in release): file and line.
        let rusty = frames.iter().find(|f| f.function.contains("rusty_probe_target_fn")).unwrap();
        assert!(rusty.file.as_deref().is_some_and(|f| f.ends_with("symbolize.rs")), "{rusty:?}");
        assert!(rusty.line.is_some());

        // Cached: the second lookup does not grow the cache.
        let cached = s.user_cache.len();
        let again = s.user_frames(pid, &[a, b + 1]);
        assert_eq!(again, frames);
        assert_eq!(s.user_cache.len(), cached);

        // An address in no mapping: one unknown frame, no module.
        let frames = s.user_frames(pid, &[8]);
        assert_eq!(frames, vec![unknown(FrameKind::Native, None)]);
    }

    #[test]
    fn through_process_root_without_map_files() {
        let pid = std::process::id();
        let mut s = Symbolizer::new();
        s.use_map_files = false;
        assert!(s.observe_process(pid));
        let b = rusty_probe_target_fn as *const () as u64;
        let frames = s.user_frames(pid, &[b]);
        assert!(frames.iter().any(|f| f.function.contains("rusty_probe_target_fn")), "{frames:?}");
        // Out of descriptors to hold: map_files paths still work (the
        // mapped inode itself, while the process lives)...
        let mut s = Symbolizer::new();
        s.fd_budget = 0;
        assert!(s.observe_process(pid));
        assert!(!s.objects.is_empty());
        assert!(s.objects.iter().all(|o| o.file.is_none() && o.path.starts_with(format!("/proc/{pid}/map_files/"))));
        let frames = s.user_frames(pid, &[b]);
        assert!(frames.iter().any(|f| f.function.contains("rusty_probe_target_fn")), "{frames:?}");
        // ... but a path in the process's root is never handed on by name.
        let mut s = Symbolizer::new();
        (s.use_map_files, s.fd_budget) = (false, 0);
        s.observe_process(pid);
        assert!(s.objects.is_empty());
    }

    #[test]
    fn files_no_process_maps_are_dropped_with_their_descriptors() {
        let pid = std::process::id();
        let mut s = Symbolizer::new();
        let budget = s.fd_budget;
        assert!(s.observe_process(pid));
        let b = rusty_probe_target_fn as *const () as u64;
        let before = s.user_frames(pid, &[b]);
        assert!(before.iter().any(|f| f.function.contains("rusty_probe_target_fn")), "{before:?}");
        let held = s.objects.len();
        assert!(held > 0 && s.fd_budget == budget - held as u64);
        // Still mapped by an observed process: nothing goes.
        s.compact(0);
        assert_eq!(s.objects.len(), held);
        // Forgotten (below the minimum, the files stay) ...
        s.forget(&[pid].into_iter().collect());
        assert_eq!(s.objects.len(), if held < COMPACT_MIN { held } else { 0 });
        // ... and dropped: descriptors back, cache and indices empty.
        s.compact(0);
        assert!(s.objects.is_empty() && s.by_identity.is_empty() && s.by_maps_id.is_empty() && s.user_cache.is_empty());
        assert_eq!(s.fd_budget, budget);
        // Observed again: the same frames (no stale parse behind a reused
        // descriptor number).
        let again = s.user_frames(pid, &[b]);
        assert_eq!(again, before);
    }

    #[test]
    fn exited_process_still_symbolizes() {
        // getpid in libc: its file offset from our own mapping of libc.
        let name = CString::new("getpid").unwrap();
        // SAFETY: dlsym with a valid NUL-terminated name.
        let addr = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as u64;
        assert_ne!(addr, 0);
        let own = fs::read_to_string("/proc/self/maps").unwrap();
        let e = own.lines().filter_map(MapsLine::parse).find(|e| e.start <= addr && addr < e.end).unwrap();
        let (libc_path, file_offset): (String, u64) = (e.path().to_owned(), addr - e.start + e.offset);

        // A child that maps the same libc: observe it, let it exit, then
        // symbolize getpid at the child's address.
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let child_addr = loop {
            let exe = fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            if exe.file_name().is_none_or(|n| n != "sleep") {
                assert!(std::time::Instant::now() < deadline, "child never exec'd sleep");
                std::thread::sleep(std::time::Duration::from_millis(5));
                continue;
            }
            let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
            let found = maps.lines().filter_map(MapsLine::parse).find(|e| {
                e.executable
                    && e.path() == libc_path
                    && e.offset <= file_offset
                    && file_offset < e.offset + (e.end - e.start)
            });
            if let Some(e) = found {
                break e.start + (file_offset - e.offset);
            }
            assert!(std::time::Instant::now() < deadline, "child never mapped {libc_path}");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        let mut s = Symbolizer::new();
        assert!(s.observe_process(pid));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!Path::new(&format!("/proc/{pid}/maps")).exists());
        let frames = s.user_frames(pid, &[child_addr]);
        assert!(frames[0].function.contains("getpid"), "{frames:?}");
        assert_eq!(frames[0].module.as_deref(), Some(basename(&libc_path)));
        assert!(!s.observe_process(pid));
    }

    #[test]
    fn a_zombie_keeps_its_snapshot() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default().file_name().is_none_or(|n| n != "sleep") {
            assert!(std::time::Instant::now() < deadline, "child never exec'd sleep");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let mut s = Symbolizer::new();
        assert!(s.observe_process(pid));
        let before = s.processes[&pid].len();
        assert!(before > 0);
        child.kill().unwrap();
        // Not reaped: a zombie, with a /proc entry and no mappings.
        let zombie = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while crate::os::procfs::state(pid) != Some('Z') {
            assert!(std::time::Instant::now() < zombie, "child never became a zombie");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!s.observe_process(pid), "a zombie's empty maps replaced the snapshot");
        assert_eq!(s.processes[&pid].len(), before);
        child.wait().unwrap();
    }

    #[test]
    fn kernel_symbol_from_kallsyms() {
        let kallsyms = fs::read_to_string("/proc/kallsyms").unwrap();
        let wanted = ["do_sys_openat2", "vfs_read", "schedule"];
        let found = kallsyms.lines().find_map(|l| {
            let mut it = l.split_whitespace();
            let (addr, ty, name) = (it.next()?, it.next()?, it.next()?);
            let addr = u64::from_str_radix(addr, 16).ok()?;
            (addr != 0 && (ty == "T" || ty == "t") && wanted.contains(&name)).then(|| (addr, name.to_owned()))
        });
        let Some((addr, name)) = found else {
            infertrace_e2e::skip(
                "kernel_symbol_from_kallsyms",
                "kernel addresses in /proc/kallsyms (hidden: not root, or kptr_restrict)",
            );
            return;
        };
        let mut s = Symbolizer::new();
        let frames = s.kernel_frames(&[addr + 1, addr + 2]);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].function, name);
        assert_eq!(frames[1].function, name);
        assert_eq!(frames[0].kind, FrameKind::Kernel);
        assert_eq!(s.kernel_cache.len(), 1, "one address resolved once");
        let frames = s.kernel_frames(&[0x10]);
        assert_eq!(frames, vec![unknown(FrameKind::Kernel, None)]);
    }


}
