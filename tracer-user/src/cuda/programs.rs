//! The CUDA probe family's kernel programs: uprobes on the runtime
//! (libcudart) and driver (libcuda) functions, attached per library file by
//! the collector once it finds one, and the two globals they read.

use aya::{
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
        UProbe,
    },
    Ebpf,
};
use tracer_common::cuda::api;

use crate::{
    collect::{FamilyTable, GlobalSpec, GlobalValue, ProgramKind, ProgramSpec},
    probe::{self, ProbeError},
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
        uprobe("cuda_return"),
    ],
    globals: &[
        GlobalSpec { name: "CUDA_REGS_SP_OFFSET", value: |i| Ok(GlobalValue::U64(i.arch.regs_sp_offset)) },
        GlobalSpec { name: "CUDA_REGS_LR_OFFSET", value: |i| Ok(GlobalValue::U64(i.arch.regs_lr_offset)) },
    ],
};

/// The entry program for function `id`.
fn entry_program(id: u32) -> &'static str {
    if api::is_peer_copy(id) {
        return "cuda_peer_copy_enter";
    }
    if api::is_driver(id) && api::is_copy(id) {
        return "cuda_drv_copy_enter";
    }
    if id == api::CU_LAUNCH_EX || id == api::CU_LAUNCH_EX_PTSZ {
        return "cuda_launch_ex";
    }
    match api::canonical(id) {
        api::MEMCPY | api::MEMCPY_PTDS | api::MEMCPY_ASYNC | api::MEMCPY_ASYNC_PTSZ => "cuda_copy_enter",
        api::MEMCPY2D | api::MEMCPY2D_PTDS | api::MEMCPY2D_ASYNC | api::MEMCPY2D_ASYNC_PTSZ => "cuda_copy2d_enter",
        api::LAUNCH | api::LAUNCH_PTSZ => "cuda_launch",
        _ => "cuda_generic_enter",
    }
}

/// Attaches the entry (and, but for launches, return) probe to every
/// function found. Returns the functions probed and the failures.
///
/// Each function's return probe goes in before its entry probe: the kernel
/// hooks a call's return at its entry, so a call whose entry the programs
/// see has its return seen too, also for calls made while the probes are
/// being attached to a running process, and for calls nested in them.
/// (Entry first, a call entered between the two attachments kept its
/// in-flight slot: the thread's next call took it over and counted the
/// first as lost, and a driver call nested in a runtime call never
/// un-nested.)
pub fn attach_file(
    ebpf: &mut Ebpf,
    path: &std::path::Path,
    symbols: &[(u32, u64)],
) -> Result<(Vec<&'static str>, Vec<String>), ProbeError> {
    let mut done = Vec::new();
    let mut errors = Vec::new();
    for &(id, offset) in symbols {
        let name = api::NAMES[id as usize];
        let mut progs = Vec::with_capacity(2);
        if !api::is_launch(id) {
            progs.push("cuda_return");
        }
        progs.push(entry_program(id));
        let mut ok = true;
        for prog_name in progs {
            let prog: &mut UProbe = probe::program(ebpf, prog_name)?;
            let point = UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie: Some(id as u64) };
            if let Err(e) = prog.attach(point, path, UProbeScope::AllProcesses) {
                errors.push(format!("probing {name} failed: {e}"));
                ok = false;
                break;
            }
        }
        if ok {
            done.push(name);
        }
    }
    Ok((done, errors))
}
