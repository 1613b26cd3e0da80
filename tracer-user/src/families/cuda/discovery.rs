//! Finding the CUDA runtime in a target: `libcudart.so.*` (and renamed
//! copies such as auditwheel's `libcudart-1a2b3c4d.so.12`) in
//! `/proc/PID/maps`, or an executable that links cudart statically; opened
//! through `/proc/PID/map_files` or the process's own root (containers),
//! identified by (device, inode) so that one file mapped by many processes
//! is probed once; symbol file offsets from `.dynsym` and `.symtab`.

use std::{collections::HashSet, fs::File, io, path::PathBuf};

use tracer_common::cuda::{api, UsdtArgSpec, UsdtSpec, USDT_ARGS, USDT_ARG_CONST, USDT_ARG_MEM, USDT_ARG_REG};

use super::programs::UsdtSite;
use crate::os::{
    procfs::{self, MappedFile, MapsLine},
    usdt,
};

/// The file-backed lines of `/proc/PID/maps`.
pub fn parse_maps(text: &str) -> Vec<MapsLine> {
    procfs::parse_maps(text).into_iter().filter(MapsLine::is_file).collect()
}

/// `libcudart.so`, `libcudart.so.12`, `libcudart.so.12.4.127`, and renamed
/// copies `libcudart-<hash>.so[.N...]`; not `libcudart_static.a` and such.
pub fn is_cudart_name(basename: &str) -> bool {
    let Some(rest) = basename.strip_prefix("libcudart") else { return false };
    let rest = match rest.strip_prefix('-') {
        Some(r) => {
            let hash_len = r.find('.').unwrap_or(r.len());
            if hash_len == 0 || !r[..hash_len].bytes().all(|b| b.is_ascii_alphanumeric()) {
                return false;
            }
            &r[hash_len..]
        }
        None => rest,
    };
    match rest.strip_prefix(".so") {
        Some("") => true,
        Some(v) => v.starts_with('.') && v[1..].split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())),
        None => false,
    }
}

/// `libcuda.so`, `libcuda.so.1`, `libcuda.so.535.104.05`: the driver API
/// (the NVIDIA driver's user-space library).
pub fn is_driver_name(basename: &str) -> bool {
    match basename.strip_prefix("libcuda.so") {
        Some("") => true,
        Some(v) => v.starts_with('.') && v[1..].split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())),
        None => false,
    }
}

/// `libnccl.so`, `libnccl.so.2`, `libnccl.so.2.21.5`: NCCL, the collective
/// communication library (exports its `nccl*` functions).
pub fn is_nccl_name(basename: &str) -> bool {
    match basename.strip_prefix("libnccl.so") {
        Some("") => true,
        Some(v) => v.starts_with('.') && v[1..].split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())),
        None => false,
    }
}

/// `libc10_cuda.so` (and renamed copies `libc10_cuda-<hash>.so`): PyTorch's
/// CUDA caching allocator, with its USDT probes `pytorch:malloc` and
/// `pytorch:free`.
pub fn is_torch_allocator_name(basename: &str) -> bool {
    basename.strip_prefix("libc10_cuda").is_some_and(|rest| rest.starts_with(".so") || (rest.starts_with('-') && rest.contains(".so")))
}

/// The `pytorch:malloc` and `pytorch:free` probe sites of a file as the
/// kernel reads them (`cuda_usdt`), and, for sites whose arguments cannot
/// be read here, why (a note: those are not probed).
pub fn torch_usdt_sites(file: &File, shown: &str) -> Result<(Vec<UsdtSite>, Vec<String>), String> {
    let mut sites = Vec::new();
    let mut skipped = Vec::new();
    for p in usdt::probes(file, shown)?.into_iter().filter(|p| p.provider == "pytorch") {
        let (id, needed) = match p.name.as_str() {
            "malloc" => (api::TORCH_MALLOC, 3),
            "free" => (api::TORCH_FREE, 1),
            _ => continue,
        };
        match usdt_spec(id, needed, &p) {
            Ok(spec) => sites.push(UsdtSite { offset: p.offset, semaphore: p.semaphore_offset.unwrap_or(0), spec }),
            Err(e) => skipped.push(format!("pytorch:{} at file offset {:#x} ({}): {e}", p.name, p.offset, p.arg_spec)),
        }
    }
    Ok((sites, skipped))
}

/// The kernel's spec of probe `id` from its note: its first `needed`
/// arguments at least, up to [`USDT_ARGS`].
fn usdt_spec(id: u32, needed: usize, p: &usdt::UsdtProbe) -> Result<UsdtSpec, String> {
    let args = p.args.as_ref().map_err(Clone::clone)?;
    if args.len() < needed {
        return Err(format!("{} arguments, {needed} expected", args.len()));
    }
    let mut spec = UsdtSpec { api: id, nargs: args.len().min(USDT_ARGS) as u32, ..Default::default() };
    for (slot, a) in spec.args.iter_mut().zip(args) {
        let (kind, pt_regs_offset, value) = match a.location {
            usdt::ArgLocation::Register { pt_regs_offset } => (USDT_ARG_REG, pt_regs_offset, 0),
            usdt::ArgLocation::Memory { pt_regs_offset, displacement } => (USDT_ARG_MEM, pt_regs_offset, displacement),
            usdt::ArgLocation::Constant(v) => (USDT_ARG_CONST, 0, v),
        };
        *slot = UsdtArgSpec { value, pt_regs_offset, kind, size: a.size, signed: u8::from(a.signed), _pad: [0; 3] };
    }
    Ok(spec)
}

/// A mapped file that may hold the CUDA runtime: one per distinct file in
/// a process.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// The mapping to open it through.
    pub line: MapsLine,
    /// Not a `libcudart`/`libcuda` by name: the executable or another
    /// library with code, checked for a runtime linked in statically
    /// (CuPy's and JAX's extension modules carry their own), quietly.
    pub linked_in: bool,
}

/// The files of `maps` worth examining: every `libcudart` and `libcuda` by
/// name, then the executable (`exe_path`, as the process sees it) and
/// every other file mapped with code.
pub fn candidates(maps: &[MapsLine], exe_path: Option<&str>) -> Vec<Candidate> {
    // Files with code (a process may map thousands of lines).
    let code: HashSet<(&str, u64)> = maps.iter().filter(|m| m.executable).map(|m| (m.dev.as_str(), m.inode)).collect();
    let mut seen: HashSet<(&str, u64)> = HashSet::new();
    let mut out: Vec<Candidate> = Vec::new();
    for m in maps {
        let by_name = is_cudart_name(m.basename())
            || is_driver_name(m.basename())
            || is_nccl_name(m.basename())
            || is_torch_allocator_name(m.basename());
        let is_exe = exe_path.is_some_and(|e| e == m.path());
        if !by_name && !is_exe && !code.contains(&(m.dev.as_str(), m.inode)) {
            continue;
        }
        if !seen.insert((m.dev.as_str(), m.inode)) {
            continue;
        }
        out.push(Candidate { line: m.clone(), linked_in: !by_name });
    }
    out
}

/// Whether a file not named as a CUDA library links in (runtime, NCCL):
/// its symbol string tables name `cudaLaunchKernel` and `cudaMemcpyAsync`
/// (a static runtime: CuPy's, JAX's modules), `ncclAllReduce` and
/// `ncclGroupStart` (NCCL: PyTorch's libtorch_cuda). One pass over the
/// string tables ([`crate::os::elf::symbol_names_present`]) before any
/// symbol is looked up.
pub fn linked_in(file: &File) -> (bool, bool) {
    let found = crate::os::elf::symbol_names_present(file, &["cudaLaunchKernel", "cudaMemcpyAsync", "ncclAllReduce", "ncclGroupStart"]);
    (found[0] && found[1], found[2] && found[3])
}

/// Libraries that carry a CUDA runtime of their own, stripped (no symbol
/// names to probe): their calls reach the GPU through the driver only.
pub fn is_stripped_runtime_carrier(basename: &str) -> bool {
    ["libcublas", "libcublasLt", "libcufft", "libcusparse", "libcusolver", "libcurand", "libcudnn"]
        .iter()
        .any(|p| basename.strip_prefix(p).is_some_and(|rest| rest.starts_with(".so") || rest.starts_with('-') || rest.starts_with('_')))
}

/// The span of `file`'s executable mappings in `maps` (same device and
/// inode): where its code runs in that process.
pub fn text_range(maps: &[MapsLine], file: &MapsLine) -> Option<(u64, u64)> {
    let exec = maps.iter().filter(|m| m.executable && m.dev == file.dev && m.inode == file.inode);
    exec.fold(None, |acc, m| match acc {
        None => Some((m.start, m.end)),
        Some((s, e)) => Some((s.min(m.start), e.max(m.end))),
    })
}

/// Opens the file behind `line` of process `pid` ([`procfs::open_mapped`]);
/// also returns the path this process hands to the kernel for the uprobe:
/// `/proc/self/fd/N` of the opened file (valid while it is open), which
/// names exactly the inode checked, whatever the target does to its paths.
pub fn open_mapped(pid: u32, line: &MapsLine) -> io::Result<(MappedFile, PathBuf)> {
    let opened = procfs::open_mapped(pid, line)?;
    let attach_path = opened.by_fd();
    Ok((opened, attach_path))
}

/// File offsets of the probed CUDA runtime functions defined in an ELF
/// file, by api id (`.dynsym` first, then `.symtab`; version suffixes such
/// as `@@libcudart.so.12` are not part of the names read).
pub fn cuda_symbols(file: &File, shown: &str) -> Result<Vec<(u32, u64)>, String> {
    let found = crate::os::elf::lookup(file, shown, &api::NAMES)?;
    let mut out: Vec<(u32, u64)> = api::NAMES
        .iter()
        .enumerate()
        .filter_map(|(id, name)| Some((id as u32, found.file_offset(*found.addresses.get(*name)?)?)))
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// Whether the symbols found make a CUDA runtime (for executables and
/// other libraries, which are only probed when they link cudart
/// statically).
pub fn is_runtime(symbols: &[(u32, u64)]) -> bool {
    let has = |id| symbols.iter().any(|(a, _)| *a == id);
    has(api::MEMCPY_ASYNC) && has(api::LAUNCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cudart_names() {
        for ok in [
            "libcudart.so",
            "libcudart.so.12",
            "libcudart.so.12.4.127",
            "libcudart-9335f6a2.so.12",
            "libcudart-d0da41ae.so.11.0",
        ] {
            assert!(is_cudart_name(ok), "{ok}");
        }
        for bad in [
            "libcudart_static.a",
            "libcudart.a",
            "libcudart.so.12.bak",
            "libcudart.so.",
            "libcudart-.so.12",
            "libcudnn.so.9",
            "libcudart.so12",
            "libcuda.so.1",
        ] {
            assert!(!is_cudart_name(bad), "{bad}");
        }
        for ok in ["libcuda.so", "libcuda.so.1", "libcuda.so.535.104.05"] {
            assert!(is_driver_name(ok), "{ok}");
        }
        for bad in ["libcudart.so.12", "libcuda.so.1.bak", "libcudadebugger.so.1", "libcuda.so."] {
            assert!(!is_driver_name(bad), "{bad}");
        }
        for ok in ["libc10_cuda.so", "libc10_cuda-1a2b3c.so"] {
            assert!(is_torch_allocator_name(ok), "{ok}");
        }
        for bad in ["libc10.so", "libc10_cuda_extra.txt", "libtorch_cuda.so"] {
            assert!(!is_torch_allocator_name(bad), "{bad}");
        }
    }

    #[test]
    fn torch_notes_become_specs() {
        // libc10_cuda.so of torch 2.15.0 (PyPI), as `readelf -n` shows its notes.
        let probe = |name: &str, args: &str| usdt::UsdtProbe {
            provider: "pytorch".into(),
            name: name.into(),
            offset: 0x4a173,
            semaphore_offset: Some(0x867ca),
            args: usdt::parse_args(args),
            arg_spec: args.into(),
        };
        let s = usdt_spec(api::TORCH_MALLOC, 3, &probe("malloc", "-8@%rbp -1@%al -8@%r12 -8@56(%rsp)")).unwrap();
        assert_eq!((s.api, s.nargs), (api::TORCH_MALLOC, 4));
        let a = |i: usize| (s.args[i].kind, s.args[i].pt_regs_offset, s.args[i].size, s.args[i].signed, s.args[i].value);
        assert_eq!(a(0), (USDT_ARG_REG, 4 * 8, 8, 1, 0)); // rbp
        assert_eq!(a(1), (USDT_ARG_REG, 10 * 8, 1, 1, 0)); // al: rax
        assert_eq!(a(2), (USDT_ARG_REG, 3 * 8, 8, 1, 0)); // r12
        assert_eq!(a(3), (USDT_ARG_MEM, 19 * 8, 8, 1, 56)); // 56(%rsp)
        let f = usdt_spec(api::TORCH_FREE, 1, &probe("free", "-8@%rdi")).unwrap();
        assert_eq!((f.nargs, f.args[0].pt_regs_offset), (1, 14 * 8));
        assert!(usdt_spec(api::TORCH_MALLOC, 3, &probe("malloc", "-8@%rdi")).is_err());
    }

    #[test]
    fn maps_lines() {
        let text = "\
7f00-7f10 r-xp 00001000 fd:01 42 /opt/venv/nvidia/cuda_runtime/lib/libcudart.so.12
7f10-7f20 rw-p 00000000 00:00 0
7f20-7f30 r--p 00000000 fd:01 43 /tmp/x/libcudart-1a2b.so.12 (deleted)
7ffd-7ffe r-xp 00000000 00:00 0 [vdso]
";
        let m = parse_maps(text);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].start, m[0].end, m[0].offset, m[0].inode), (0x7f00, 0x7f10, 0x1000, 42));
        assert!(m[0].executable && !m[0].deleted);
        assert_eq!(m[0].basename(), "libcudart.so.12");
        assert!(m[1].deleted && m[1].path() == "/tmp/x/libcudart-1a2b.so.12");
        let c = candidates(&m, Some("/usr/bin/python3.11"));
        assert_eq!(c.len(), 2);
        assert!(!c[0].linked_in && !c[1].linked_in);
        // Any other file with code is checked for a runtime linked in.
        let m = parse_maps(
            "7f00-7f10 r-xp 00000000 fd:01 50 /venv/cupy_backends/cuda/api/runtime.so\n\
             7f10-7f20 r--p 00000000 fd:01 51 /venv/data.bin\n",
        );
        let c = candidates(&m, None);
        assert_eq!(c.len(), 1);
        assert!(c[0].linked_in);
        assert!(is_stripped_runtime_carrier("libcublasLt.so.12") && is_stripped_runtime_carrier("libcudnn_ops.so.9"));
        assert!(is_nccl_name("libnccl.so.2") && is_nccl_name("libnccl.so.2.21.5") && !is_nccl_name("libnccl-net.so"));
        assert!(!is_stripped_runtime_carrier("libcublasfoo.so") && !is_stripped_runtime_carrier("libcudart.so.12"));
    }

    #[test]
    fn text_ranges() {
        let m = parse_maps(
            "7f00-7f10 r--p 00000000 fd:01 42 /lib/libcuda.so.1\n\
             7f10-7f30 r-xp 00010000 fd:01 42 /lib/libcuda.so.1\n\
             7f30-7f40 r-xp 00000000 fd:01 43 /lib/other.so\n\
             7f50-7f60 r-xp 00040000 fd:01 42 /lib/libcuda.so.1\n",
        );
        assert_eq!(text_range(&m, &m[0]), Some((0x7f10, 0x7f60)));
        assert_eq!(text_range(&m, &m[2]), Some((0x7f30, 0x7f40)));
        let none = parse_maps("7f00-7f10 r--p 00000000 fd:01 44 /lib/data.bin\n");
        assert_eq!(text_range(&none, &none[0]), None);
    }

    #[test]
    fn own_executable_has_no_cuda_runtime() {
        let f = File::open("/proc/self/exe").unwrap();
        let syms = cuda_symbols(&f, "/proc/self/exe").unwrap();
        assert!(!is_runtime(&syms));
    }
}
