//! The CUDA probe family's kernel programs: uprobes on the runtime
//! (libcudart) and driver (libcuda) functions, attached per library file by
//! the collector once it finds one, and the two globals they read.
//!
//! Where the kernel has multi-uprobe links (Linux 6.6+), each program is
//! attached to a file with one link for all its functions
//! ([`crate::os::uprobe_multi`]): at most 9 links per file, released in ~0.1 s
//! at the window end. Elsewhere aya attaches one perf-event uprobe per
//! function and kind (124 for 66 functions), each taking ~0.1 s to release
//! under a kernel-wide lock. Either way the links are released from
//! several threads at once, with progress shown past a second
//! ([`release_all`]), before the final drain.

use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsFd, OwnedFd},
    path::Path,
};

use aya::{
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeScope},
        UProbe,
    },
    Btf, Ebpf,
};
use tracer_common::cuda::api;

use crate::{
    engine::{
        release::{release_all, Released},
        FamilyTable, GlobalSpec, GlobalValue, ProgramKind, ProgramSpec,
    },
    os::probe::{self, ProbeError},
    os::uprobe_multi::{self, MapFds},
};

const fn uprobe(name: &'static str) -> ProgramSpec {
    ProgramSpec { name, kind: ProgramKind::UProbe }
}

pub static TABLE: FamilyTable = FamilyTable {
    family: "cuda",
    programs: &[
        uprobe("cuda_copy_enter"),
        uprobe("cuda_copy2d_enter"),
        uprobe("cuda_drv_copy_enter"),
        uprobe("cuda_peer_copy_enter"),
        uprobe("cuda_generic_enter"),
        uprobe("cuda_launch"),
        uprobe("cuda_launch_ex"),
        uprobe("cuda_nccl_enter"),
        uprobe("cuda_return"),
        uprobe("cuda_usdt"),
    ],
    globals: &[
        GlobalSpec { name: "CUDA_REGS_SP_OFFSET", value: |i| Ok(GlobalValue::U64(i.arch.regs_sp_offset)) },
        GlobalSpec { name: "CUDA_REGS_LR_OFFSET", value: |i| Ok(GlobalValue::U64(i.arch.regs_lr_offset)) },
        GlobalSpec { name: "CUDA_REGS_IP_OFFSET", value: |i| Ok(GlobalValue::U64(i.arch.regs_ip_offset)) },
        GlobalSpec {
            name: "CUDA_LAUNCH_SLICING",
            value: |i| Ok(GlobalValue::U32(u32::from(i.opts.max_overhead.is_some()))),
        },
    ],
};

/// The entry program for function `id`.
fn entry_program(id: u32) -> &'static str {
    if api::is_peer_copy(id) {
        return "cuda_peer_copy_enter";
    }
    if api::is_nccl(id) {
        return "cuda_nccl_enter";
    }
    if api::is_driver(id) && api::is_copy(id) {
        return "cuda_drv_copy_enter";
    }
    // `cuLaunchKernelEx(config, f, ...)`, `cudaLaunchKernelExC(config,
    // func, args)`: the kernel is the second argument.
    if matches!(id, api::CU_LAUNCH_EX | api::CU_LAUNCH_EX_PTSZ | api::LAUNCH_EX_C | api::LAUNCH_EX_C_PTSZ) {
        return "cuda_launch_ex";
    }
    match api::canonical(id) {
        api::MEMCPY | api::MEMCPY_PTDS | api::MEMCPY_ASYNC | api::MEMCPY_ASYNC_PTSZ => "cuda_copy_enter",
        api::MEMCPY2D | api::MEMCPY2D_PTDS | api::MEMCPY2D_ASYNC | api::MEMCPY2D_ASYNC_PTSZ => "cuda_copy2d_enter",
        // `cudaGraphLaunch(exec, stream)`: the executable graph first.
        api::LAUNCH | api::LAUNCH_PTSZ | api::GRAPH_LAUNCH | api::GRAPH_LAUNCH_PTSZ => "cuda_launch",
        _ => "cuda_generic_enter",
    }
}

/// The program that takes the returns of every function but launches (of
/// kernels and graphs).
const RETURN_PROGRAM: &str = "cuda_return";

/// The CUDA uprobes of one recording: how they are attached, and every
/// attachment, to release together at the window end.
pub enum CudaProbes {
    /// Multi-uprobe links: the programs loaded for them, and one link per
    /// (program, file, entry or return).
    Multi { programs: HashMap<&'static str, OwnedFd>, links: Vec<OwnedFd> },
    /// aya's perf-event uprobes, one per function and kind, taken out of
    /// the programs so that they can be released from several threads.
    Perf { links: Vec<UProbeLink> },
}

impl CudaProbes {
    /// Loads the programs (the verifier runs here): for multi-uprobe links
    /// where the kernel has them, else with aya. The note says why
    /// multi-uprobe links are not used when the kernel has them but
    /// loading for them failed.
    pub fn load(ebpf: &mut Ebpf, btf: &Btf, maps: &MapFds) -> Result<(Self, Option<String>), ProbeError> {
        let mut note = None;
        if uprobe_multi::supported() {
            let names: Vec<&'static str> = TABLE.programs.iter().map(|p| p.name).collect();
            match uprobe_multi::load_programs(&names, maps, btf) {
                Ok(programs) => return Ok((CudaProbes::Multi { programs, links: Vec::new() }, None)),
                Err(e) => {
                    note = Some(format!(
                        "CUDA probes attached one perf event per function ({e}): stopping takes about 0.1 s per probe"
                    ))
                }
            }
        }
        for spec in TABLE.programs {
            spec.load(ebpf, btf)?;
        }
        Ok((CudaProbes::Perf { links: Vec::new() }, note))
    }

    /// The descriptor of a program loaded for multi-uprobe links.
    pub fn program_fd(&self, name: &str) -> Option<std::os::fd::BorrowedFd<'_>> {
        match self {
            CudaProbes::Multi { programs, .. } => programs.get(name).map(|p| p.as_fd()),
            CudaProbes::Perf { .. } => None,
        }
    }

    /// `--max-overhead`: the launch functions among `symbols` of `file`, as
    /// groups for the slicer (one per entry program), in process `pid` or
    /// in every process. Multi-uprobe links only.
    pub fn slice_targets(
        &self,
        file: &std::fs::File,
        shown: &str,
        symbols: &[(u32, u64)],
        pid: Option<u32>,
    ) -> Result<Vec<super::slicer::SliceTarget>, String> {
        let file = std::sync::Arc::new(file.try_clone().map_err(|e| format!("keeping {shown} open: {e}"))?);
        let mut out: Vec<(&'static str, super::slicer::SliceTarget)> = Vec::new();
        for &(id, offset) in symbols.iter().filter(|(id, _)| api::is_launch(*id)) {
            let program = entry_program(id);
            if let Some((_, t)) = out.iter_mut().find(|(p, _)| *p == program) {
                t.offsets.push(offset);
                t.cookies.push(u64::from(id));
                t.what = format!("{}, {}", t.what, api::NAMES[id as usize]);
                t.route = None;
                continue;
            }
            let prog = self
                .program_fd(program)
                .ok_or_else(|| format!("sampling launches needs multi-uprobe links ({program})"))?
                .try_clone_to_owned()
                .map_err(|e| format!("duplicating {program}: {e}"))?;
            out.push((
                program,
                super::slicer::SliceTarget {
                    prog,
                    file: file.clone(),
                    offsets: vec![offset],
                    cookies: vec![u64::from(id)],
                    pid,
                    route: pid.filter(|_| api::is_driver(id)).map(|p| (u64::from(p) << 32) | u64::from(id)),
                    what: format!("{} ({shown})", api::NAMES[id as usize]),
                },
            ));
        }
        Ok(out.into_iter().map(|(_, t)| t).collect())
    }

    /// Whether driver functions can be probed per process and function
    /// ([`attach_for_pid`](Self::attach_for_pid)): with multi-uprobe links.
    pub fn per_process(&self) -> bool {
        matches!(self, CudaProbes::Multi { .. })
    }

    /// Probes function `id` at `offset` of `path` in process `pid` only:
    /// its return (but for launches), then its entry. The links, to close
    /// to stop probing it there (entry first), or why it failed (a note).
    /// Multi-uprobe links only.
    pub fn attach_for_pid(&self, path: &Path, id: u32, offset: u64, pid: u32) -> Result<Vec<OwnedFd>, String> {
        let CudaProbes::Multi { programs, .. } = self else {
            return Err("probing one process needs multi-uprobe links".to_owned());
        };
        let mut order = Vec::with_capacity(2);
        if !api::entry_only(id) {
            order.push((RETURN_PROGRAM, true));
        }
        order.push((entry_program(id), false));
        let mut links = Vec::with_capacity(2);
        for (name, ret) in order {
            let prog = programs.get(name).ok_or_else(|| format!("eBPF program `{name}` missing"))?;
            let link = uprobe_multi::attach_pid(prog.as_fd(), path, &[offset], &[u64::from(id)], ret, pid)
                .map_err(|e| format!("probing {} failed: {e}", api::NAMES[id as usize]))?;
            links.push(link);
        }
        // Closing goes in this order: entry first.
        links.reverse();
        Ok(links)
    }

    /// Takes links made outside [`attach_file`](Self::attach_file) (per
    /// process, [`attach_for_pid`](Self::attach_for_pid)) to release with
    /// the others.
    pub fn adopt(&mut self, more: impl IntoIterator<Item = OwnedFd>) {
        if let CudaProbes::Multi { links, .. } = self {
            links.extend(more);
        }
    }

    /// How many attachments there are to release.
    pub fn links(&self) -> usize {
        match self {
            CudaProbes::Multi { links, .. } => links.len(),
            CudaProbes::Perf { links } => links.len(),
        }
    }

    /// Attaches the entry (and, but for launches, return) probe to every
    /// function found. Returns the functions probed and the failures.
    ///
    /// Each function's return probe goes in before its entry probe: the
    /// kernel hooks a call's return at its entry, so a call whose entry the
    /// programs see has its return seen too, also for calls made while the
    /// probes are being attached to a running process, and for calls nested
    /// in them. (Entry first, a call entered between the two attachments
    /// kept its in-flight slot: the thread's next call took it over and
    /// counted the first as lost, and a driver call nested in a runtime call
    /// never un-nested.) With multi-uprobe links, every return of the file
    /// goes in (one link) before any entry.
    pub fn attach_file(
        &mut self,
        ebpf: &mut Ebpf,
        path: &Path,
        symbols: &[(u32, u64)],
    ) -> Result<(Vec<&'static str>, Vec<String>), ProbeError> {
        match self {
            CudaProbes::Multi { programs, links } => attach_multi(programs, links, path, symbols),
            CudaProbes::Perf { links } => attach_perf(ebpf, links, path, symbols),
        }
    }

    /// Attaches the USDT probe `sites` of `path` (PyTorch's caching
    /// allocator), in every process, their specs at `CUDA_USDT_SPECS[first..]`,
    /// their semaphores raised by the kernel. Multi-uprobe links only (the
    /// reference counters and cookies they take).
    pub fn attach_usdt(&mut self, ebpf: &mut Ebpf, path: &Path, sites: &[UsdtSite], first: u32) -> Result<(), String> {
        let CudaProbes::Multi { programs, links } = self else {
            return Err("USDT probes need multi-uprobe links (Linux 6.6+)".to_owned());
        };
        let end = first as usize + sites.len();
        if end > tracer_common::cuda::USDT_SPECS as usize {
            return Err(format!("more than {} USDT probe sites in one recording", tracer_common::cuda::USDT_SPECS));
        }
        let map = ebpf.map_mut(tracer_common::maps::CUDA_USDT_SPECS).ok_or("eBPF map CUDA_USDT_SPECS missing")?;
        let mut specs: aya::maps::Array<_, tracer_common::cuda::UsdtSpec> =
            aya::maps::Array::try_from(map).map_err(|e| format!("CUDA_USDT_SPECS: {e}"))?;
        let mut cookies = Vec::with_capacity(sites.len());
        for (i, s) in sites.iter().enumerate() {
            let index = first + i as u32;
            specs.set(index, s.spec, 0).map_err(|e| format!("writing CUDA_USDT_SPECS[{index}]: {e}"))?;
            cookies.push(u64::from(index));
        }
        let prog = programs.get(USDT_PROGRAM).ok_or_else(|| format!("eBPF program `{USDT_PROGRAM}` missing"))?;
        let offsets: Vec<u64> = sites.iter().map(|s| s.offset).collect();
        let ref_ctrs: Vec<u64> = sites.iter().map(|s| s.semaphore).collect();
        let link = uprobe_multi::attach_usdt(prog.as_fd(), path, &offsets, &cookies, &ref_ctrs).map_err(|e| e.to_string())?;
        links.push(link);
        Ok(())
    }

    /// Releases every probe (from several threads; progress on stderr past
    /// a second unless `quiet`), then the programs. Returns when all are
    /// gone, with what went wrong unloading a program.
    pub fn release(self, ebpf: &mut Ebpf, quiet: bool) -> (Released, Vec<String>) {
        let mut errors = Vec::new();
        let released = match self {
            CudaProbes::Multi { programs, links } => {
                let r = release_all(links, "CUDA uprobe links", quiet);
                drop(programs);
                r
            }
            CudaProbes::Perf { links } => {
                let r = release_all(links, "CUDA uprobes", quiet);
                for spec in TABLE.programs {
                    if let Ok(p) = probe::program::<UProbe>(ebpf, spec.name) {
                        if let Err(e) = p.unload() {
                            errors.push(format!("detaching {}: {e}", spec.name));
                        }
                    }
                }
                r
            }
        };
        (released, errors)
    }
}

/// The program of the USDT probe sites.
const USDT_PROGRAM: &str = "cuda_usdt";

/// One USDT probe site to attach: its file offset, its semaphore's (0:
/// none) and what the kernel reads there.
#[derive(Clone, Debug)]
pub struct UsdtSite {
    pub offset: u64,
    pub semaphore: u64,
    pub spec: tracer_common::cuda::UsdtSpec,
}

/// The functions of one file one program takes, on entry or return.
struct Group {
    program: &'static str,
    ret: bool,
    /// (function id, file offset)
    members: Vec<(u32, u64)>,
}

/// One link per program for all its functions in `path`, returns first;
/// a link that fails is retried one function at a time, to name those
/// that fail.
fn attach_multi(
    programs: &HashMap<&'static str, OwnedFd>,
    links: &mut Vec<OwnedFd>,
    path: &Path,
    symbols: &[(u32, u64)],
) -> Result<(Vec<&'static str>, Vec<String>), ProbeError> {
    let returns = symbols.iter().copied().filter(|&(id, _)| !api::entry_only(id)).collect();
    let mut groups = vec![Group { program: RETURN_PROGRAM, ret: true, members: returns }];
    for &(id, offset) in symbols {
        let program = entry_program(id);
        match groups.iter_mut().find(|g| g.program == program && !g.ret) {
            Some(g) => g.members.push((id, offset)),
            None => groups.push(Group { program, ret: false, members: vec![(id, offset)] }),
        }
    }
    let mut failed = HashSet::new();
    let mut errors = Vec::new();
    for Group { program, ret, members } in groups {
        // A function whose return probe failed gets no entry probe.
        let members: Vec<(u32, u64)> = members.into_iter().filter(|(id, _)| !failed.contains(id)).collect();
        if members.is_empty() {
            continue;
        }
        let prog = programs.get(program).ok_or(ProbeError::MissingProgram(program))?;
        let offsets: Vec<u64> = members.iter().map(|m| m.1).collect();
        let cookies: Vec<u64> = members.iter().map(|m| u64::from(m.0)).collect();
        if let Ok(link) = uprobe_multi::attach(prog.as_fd(), path, &offsets, &cookies, ret) {
            links.push(link);
            continue;
        }
        for (id, offset) in members {
            match uprobe_multi::attach(prog.as_fd(), path, &[offset], &[u64::from(id)], ret) {
                Ok(link) => links.push(link),
                Err(e) => {
                    errors.push(format!("probing {} failed: {e}", api::NAMES[id as usize]));
                    failed.insert(id);
                }
            }
        }
    }
    let done = symbols.iter().filter(|(id, _)| !failed.contains(id)).map(|&(id, _)| api::NAMES[id as usize]).collect();
    Ok((done, errors))
}

/// One aya perf-event uprobe per function and kind, return first.
fn attach_perf(
    ebpf: &mut Ebpf,
    links: &mut Vec<UProbeLink>,
    path: &Path,
    symbols: &[(u32, u64)],
) -> Result<(Vec<&'static str>, Vec<String>), ProbeError> {
    let mut done = Vec::new();
    let mut errors = Vec::new();
    for &(id, offset) in symbols {
        let name = api::NAMES[id as usize];
        let mut progs = Vec::with_capacity(2);
        if !api::entry_only(id) {
            progs.push(RETURN_PROGRAM);
        }
        progs.push(entry_program(id));
        let mut ok = true;
        for prog_name in progs {
            let prog: &mut UProbe = probe::program(ebpf, prog_name)?;
            let point = UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie: Some(id as u64) };
            let attached = prog.attach(point, path, UProbeScope::AllProcesses).and_then(|l| prog.take_link(l));
            match attached {
                Ok(link) => links.push(link),
                Err(e) => {
                    errors.push(format!("probing {name} failed: {e}"));
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            done.push(name);
        }
    }
    Ok((done, errors))
}
