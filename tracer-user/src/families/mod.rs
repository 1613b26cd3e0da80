//! The probe families of a recording: their program tables (for the loader,
//! `doctor` and the tests) and the list of collectors `record` runs. The only
//! place that names them all.

pub mod cpu_samples;
pub mod cuda;
pub mod exec_watch;
pub mod memory;
pub mod nvml;
pub mod overhead;
pub mod process;
pub mod python;
pub mod sched;
pub mod syscalls;
pub mod timeline;

use crate::engine::{programs, Collector, Families, FamilyTable, RecordOptions};
use cpu_samples::CpuSampleCollector;
use cuda::{CudaCollector, CudaOptions};
use nvml::NvmlCollector;
use process::ProcessCollector;
use python::collector::PythonCollector;
use sched::SchedCollector;
use syscalls::SyscallCollector;
use timeline::TimelineCollector;

/// Every family's table, in load order.
static TABLES: [&FamilyTable; 13] = [
    &programs::CORE,
    &process::TABLE,
    &syscalls::TABLE,
    &sched::TABLE,
    &cpu_samples::TABLE,
    &python::collector::TABLE,
    &cuda::programs::TABLE,
    &nvml::TABLE,
    &timeline::TABLE,
    &exec_watch::TABLE,
    &overhead::TABLE,
    &python::asyncio::record::TABLE,
    &memory::TABLE,
];

/// Every family's table, in load order.
pub fn tables() -> &'static [&'static FamilyTable; 13] {
    &TABLES
}

/// What the engine runs: every table, and the collectors for some options.
pub fn list() -> Families {
    Families { tables: || tables().as_slice(), collectors }
}

/// The collectors `opts` asks for, in the order they see every step.
///
/// The order matters twice: `sched` seeds the threads of an attached
/// process before `process` (last) puts it in the kernel's target set, so
/// that the kernel never creates their entries first; and a snapshot runs
/// `syscalls` before `sched` (wall time reads the syscall table) and `cuda`
/// before `nvml` (the GPU samples join the CUDA report).
pub fn collectors(opts: &RecordOptions) -> Vec<Box<dyn Collector>> {
    // The overhead pair: calibration before any probe is attached, the
    // account once every other family has filled the recording.
    let (overhead_start, overhead_report) = overhead::collectors(tables());
    let mut list: Vec<Box<dyn Collector>> = vec![overhead_start, Box::new(SyscallCollector::new(opts.sched.enabled))];
    if opts.sched.enabled {
        list.push(Box::new(SchedCollector::default()));
        list.push(Box::new(CpuSampleCollector::new(opts.sched.frequency)));
    }
    // CUDA before Python: a target's exec reaches the CUDA collector first,
    // which probes what the new program can load before it gets to load it
    // (the Python collector's examination of the interpreter takes longer).
    if opts.cuda {
        let cuda = CudaOptions { driver: opts.cuda_driver, max_overhead: opts.max_overhead, timeline_limit: opts.timeline_limit, quiet: opts.quiet };
        list.push(Box::new(CudaCollector::new(cuda)));
        list.push(Box::new(NvmlCollector::new(opts.gpu_sample_hz)));
    }
    if opts.python {
        list.push(Box::new(PythonCollector::default()));
    }
    if opts.python && opts.asyncio.enabled {
        list.push(Box::new(python::asyncio::record::AsyncioCollector::new(opts.asyncio)));
    }
    // After CUDA: its snapshot puts the CUDA calls into the timeline first.
    if opts.timeline_limit.is_some() {
        list.push(Box::new(TimelineCollector::new(opts.timeline_limit)));
    }
    if opts.memory {
        list.push(Box::new(memory::MemoryCollector::default()));
    }
    list.push(Box::new(ProcessCollector::default()));
    list.push(overhead_report);
    list
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use object::{Object, ObjectSection, ObjectSymbol, SectionKind, SymbolKind};

    use super::*;

    /// (programs, globals) of the embedded kernel object: functions in
    /// program sections, and data symbols in `.rodata`/`.data`/`.bss`.
    fn object_contents() -> (BTreeSet<String>, BTreeSet<String>) {
        let obj = object::File::parse(crate::os::probe::object_bytes()).expect("the embedded object is ELF");
        let (mut progs, mut globals) = (BTreeSet::new(), BTreeSet::new());
        for sym in obj.symbols() {
            let (Ok(name), Some(idx)) = (sym.name(), sym.section_index()) else { continue };
            let Ok(section) = obj.section_by_index(idx) else { continue };
            let sname = section.name().unwrap_or("");
            match sym.kind() {
                SymbolKind::Text if section.kind() == SectionKind::Text && sname != ".text" && sym.is_global() => {
                    progs.insert(name.to_owned());
                }
                SymbolKind::Data
                    if sname.starts_with(".rodata") || sname.starts_with(".data") || sname.starts_with(".bss") =>
                {
                    globals.insert(name.to_owned());
                }
                _ => {}
            }
        }
        (progs, globals)
    }

    /// The maps of the embedded kernel object: data symbols in the legacy
    /// `maps` section (aya-ebpf's `#[map]`) or the BTF `.maps` section.
    fn object_maps() -> BTreeSet<String> {
        let obj = object::File::parse(crate::os::probe::object_bytes()).expect("the embedded object is ELF");
        let mut maps = BTreeSet::new();
        for sym in obj.symbols() {
            let (Ok(name), Some(idx)) = (sym.name(), sym.section_index()) else { continue };
            let Ok(section) = obj.section_by_index(idx) else { continue };
            if sym.kind() == SymbolKind::Data && matches!(section.name(), Ok("maps" | ".maps")) {
                maps.insert(name.to_owned());
            }
        }
        maps
    }

    /// `tracer_common::maps`: each constant is its own name, listed in
    /// `ALL`, and a map of the object; every map constant the userspace
    /// sources name is in `ALL`.
    #[test]
    fn map_names_are_maps_of_the_object() {
        use tracer_common::maps::ALL;
        let maps = object_maps();
        for name in ALL {
            assert!(maps.contains(*name), "tracer_common::maps::{name}: no such map in the object ({maps:?})");
        }
        let src = include_str!("../../../tracer-common/src/maps.rs");
        let mut consts = 0;
        for line in src.lines() {
            let Some((ident, value)) = line.strip_prefix("pub const ").and_then(|l| l.split_once(": &str = ")) else { continue };
            let value = value.trim_end_matches(';').trim_matches('"');
            assert_eq!(ident, value, "tracer_common::maps::{ident} names another map");
            assert!(ALL.contains(&value), "tracer_common::maps::{ident} is missing from ALL");
            consts += 1;
        }
        assert_eq!(consts, ALL.len(), "tracer_common::maps::ALL lists a name twice");
        // Best effort: the paths to a map constant (not `use` lists) in
        // the code (not the comments) of tracer-user/src.
        let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
        let mut used = BTreeSet::new();
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("read_dir").map(|e| e.expect("dir entry").path()) {
                if entry.is_dir() {
                    dirs.push(entry);
                    continue;
                }
                if entry.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&entry).expect("read source");
                for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
                    for (i, m) in line.match_indices("maps::") {
                        let rest = &line[i + m.len()..];
                        let name: String = rest.chars().take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_').collect();
                        let whole = !rest[name.len()..].starts_with(|c: char| c.is_ascii_alphanumeric());
                        if !name.is_empty() && whole && name != "ALL" {
                            used.insert(name);
                        }
                    }
                }
            }
        }
        assert!(used.contains("WINDOW"), "no use of tracer_common::maps found: is the scan broken?");
        for name in &used {
            assert!(ALL.contains(&name.as_str()), "maps::{name} is used by tracer-user but missing from tracer_common::maps::ALL");
        }
    }

    #[test]
    fn tables_describe_every_program_once_and_name_real_globals() {
        let (progs, globals) = object_contents();
        let mut described = BTreeSet::new();
        for t in tables() {
            for p in t.programs {
                assert!(described.insert(p.name.to_owned()), "{} is in two tables", p.name);
            }
            for g in t.globals {
                assert!(globals.contains(g.name), "{}/{}: no such global in the object ({globals:?})", t.family, g.name);
            }
        }
        assert_eq!(described, progs, "the tables and the object's programs differ");
    }

    /// Where each collector's code lives (by `Collector::name`).
    fn folder(name: &str) -> &'static str {
        match name {
            "syscalls" => "syscalls",
            "sched" => "sched",
            "cpu_samples" => "cpu_samples",
            "cuda" => "cuda",
            "nvml" => "nvml",
            "python" => "python",
            "asyncio" => "python/asyncio/record",
            "timeline" => "timeline",
            "process" => "process",
            "overhead" | "overhead calibration" => "overhead",
            other => panic!("collector {other}: add its folder here"),
        }
    }

    /// `rec.FIELD` mentions in a folder's sources (tests left out), with
    /// the files they are in; sub-folders that are other collectors' are
    /// left out.
    fn fields_used(folder: &str, skip: &[&str]) -> BTreeSet<(String, String)> {
        mentions(folder, skip, r"\brec\.([a-z_]+)")
    }

    /// The first group of `pattern` wherever it matches in the code of a
    /// folder's sources (tests and comment lines left out), with the files
    /// it is in; sub-folders that are other collectors' are left out.
    fn mentions(folder: &str, skip: &[&str], pattern: &str) -> BTreeSet<(String, String)> {
        fn walk(dir: &std::path::Path, skip: &[std::path::PathBuf], re: &regex::Regex, out: &mut BTreeSet<(String, String)>) {
            let Ok(entries) = std::fs::read_dir(dir) else { return };
            for e in entries.flatten() {
                let p = e.path();
                if p.is_dir() {
                    if !skip.contains(&p) {
                        walk(&p, skip, re, out);
                    }
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                let code = text.split("#[cfg(test)]").next().unwrap_or("");
                let code: String = code.lines().filter(|l| !l.trim_start().starts_with("//")).flat_map(|l| [l, "\n"]).collect();
                for c in re.captures_iter(&code) {
                    out.insert((c[1].to_owned(), p.display().to_string()));
                }
            }
        }
        let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/families");
        let skip: Vec<std::path::PathBuf> = skip.iter().map(|s| base.join(s)).collect();
        let mut out = BTreeSet::new();
        let re = regex::Regex::new(pattern).expect("regex");
        walk(&base.join(folder), &skip, &re, &mut out);
        out
    }

    /// Every part of the recording a family's code touches in `rec` is one
    /// it declares (provides or needs), so the snapshot order computed from
    /// the declarations is the one the code relies on; and the order has
    /// no cycle.
    #[test]
    fn families_declare_the_parts_of_the_recording_they_touch() {
        use crate::engine::{snapshot_order, Part};
        // Filled by the engine before any snapshot, or sink-owned.
        const ENGINE: [&str; 4] = ["host", "duration_ns", "notes", "lost"];
        let opts = RecordOptions { timeline_limit: Some(1000), ..RecordOptions::default() };
        let list = collectors(&opts);
        snapshot_order(&list).expect("the declared parts form no cycle");
        // Per folder, what its collectors declare (the overhead pair shares one).
        let mut declared: std::collections::BTreeMap<&str, (String, BTreeSet<&str>)> = Default::default();
        for c in &list {
            let e = declared.entry(folder(c.name())).or_insert_with(|| (c.name().to_owned(), BTreeSet::new()));
            e.1.extend(c.provides().iter().chain(c.needs()).flat_map(|p: &Part| p.fields().iter().copied()));
        }
        let mut bad = Vec::new();
        for (dir, (name, fields)) in &declared {
            let skip: &[&str] = if *dir == "python" { &["python/asyncio/record"] } else { &[] };
            for (field, file) in fields_used(dir, skip) {
                if !fields.contains(field.as_str()) && !ENGINE.contains(&field.as_str()) {
                    bad.push(format!("{file}: `rec.{field}` is not in what {name} provides or needs"));
                }
            }
        }
        assert!(bad.is_empty(), "undeclared reads or writes of the recording:\n{}", bad.join("\n"));
    }

    /// Every handle of the context a family's code reaches (`cx.kernel`,
    /// `cx.window`, `cx.targets`, `cx.stacks`, `cx.calibration`; `cx.frames`
    /// reaches the stacks and the kernel) is one its collectors declare in
    /// `Collector::uses`, so that no family finds a handle missing from its
    /// view at run time; and every declared handle is reached. A view is
    /// only ever called `cx`, so that this reading sees every use.
    #[test]
    fn families_declare_the_handles_they_use() {
        use crate::engine::Handle;
        let opts = RecordOptions { timeline_limit: Some(1000), ..RecordOptions::default() };
        let list = collectors(&opts);
        let mut declared: std::collections::BTreeMap<&str, (String, BTreeSet<&str>)> = Default::default();
        for c in &list {
            let e = declared.entry(folder(c.name())).or_insert_with(|| (c.name().to_owned(), BTreeSet::new()));
            e.1.extend(c.uses().iter().map(|h: &Handle| h.field()));
        }
        for name in ["syscalls", "sched", "cpu_samples", "cuda", "nvml", "python", "asyncio", "timeline", "process", "overhead"] {
            assert!(declared.contains_key(folder(name)), "{name}: not in the collectors the test options give");
        }
        let fields: Vec<&str> = Handle::ALL.iter().map(|h| h.field()).collect();
        let pattern = format!(r"\bcx\.({}|frames)\b", fields.join("|"));
        let mut bad = Vec::new();
        for (dir, (name, uses)) in &declared {
            let skip: &[&str] = if *dir == "python" { &["python/asyncio/record"] } else { &[] };
            let mut reached = BTreeSet::new();
            for (field, file) in mentions(dir, skip, &pattern) {
                let needed: &[&str] = if field == "frames" { &["stacks", "kernel"] } else { &[field.as_str()] };
                for h in needed {
                    reached.insert(h.to_string());
                    if !uses.contains(h) {
                        bad.push(format!("{file}: `cx.{field}` reaches the {h} handle, which {name} does not declare in `uses`"));
                    }
                }
            }
            for h in uses {
                if !reached.contains(*h) {
                    bad.push(format!("{dir}: {name} declares the {h} handle in `uses` and never reaches `cx.{h}`"));
                }
            }
            for (binding, file) in mentions(dir, skip, r"\b([A-Za-z_][A-Za-z0-9_]*)\s*:\s*&(?:'[a-z_]+\s+)?(?:mut\s+)?Cx\b") {
                if binding != "cx" && binding != "_cx" {
                    bad.push(format!("{file}: a view named `{binding}`: call it `cx`, so that this test reads its uses"));
                }
            }
        }
        assert!(bad.is_empty(), "handles reached and declared differ:\n{}", bad.join("\n"));
    }

    #[test]
    fn every_global_has_a_value_with_defaults() {
        let btf = crate::os::btf_offsets::KernelBtf::load(std::path::Path::new("/sys/kernel/btf/vmlinux"));
        let btf = match btf {
            Ok(b) => b,
            Err(e) => return infertrace_e2e::skip("every_global_has_a_value_with_defaults", &format!("kernel BTF unreadable: {e}")),
        };
        let opts = RecordOptions::default();
        let arch = crate::system::arch_constants().expect("supported arch");
        let inputs = crate::engine::LoadInputs { opts: &opts, arch, btf: &btf, tracefs: None };
        for t in tables() {
            for g in t.globals {
                assert!((g.value)(&inputs).is_ok(), "{}/{}", t.family, g.name);
            }
        }
    }
}
