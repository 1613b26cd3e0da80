//! What the kernel's probe mechanism costs per hit on this machine,
//! measured at startup, before any of our probes is attached.
//!
//! The tracer probes itself, for a few milliseconds: a uprobe, then a
//! uprobe plus a uretprobe, with the object's empty programs
//! (`tracer-ebpf/src/overhead.rs`), on a function of its own binary
//! ([`infertrace_calibration_target`]), limited to its own process; then
//! the `sys_enter`/`sys_exit` BTF tracepoints with empty programs around
//! `getppid` calls. Each cost is the fastest of 9 rounds of probed calls
//! minus the fastest of the same calls unprobed (before and after): load
//! from elsewhere on the machine only ever adds time to a round. A launched command is still
//! held before its exec meanwhile.

use std::{num::NonZeroU32, time::Instant};

use aya::programs::{
    uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    UProbe,
};

use crate::{
    os::trap_timing::{fastest, target_location, time_getppid, time_target},
    engine::{programs::Links, Cx, FamilyTable},
    os::probe::{self, ProbeError},
    recording::overhead::Calibration,
};

/// Calls per round for the probes, rounds per measurement.
const UPROBE_CALLS: u32 = 300;
const SYSCALLS: u32 = 1000;
const ROUNDS: usize = 9;

/// The calibration; each part that fails is left at 0 with a note.
pub fn calibrate(cx: &mut Cx<'_>, table: &'static FamilyTable, notes: &mut Vec<String>) -> Calibration {
    let started = Instant::now();
    let mut c = Calibration::default();
    match uprobes(cx, table) {
        Ok((up, uret)) => (c.uprobe_ns, c.uretprobe_ns) = (up, uret),
        Err(e) => notes.push(format!("uprobe cost not calibrated: {e}")),
    }
    match tracepoints(cx, table) {
        Ok(ns) => c.syscall_tracepoints_ns = ns,
        Err(e) => notes.push(format!("syscall tracepoint cost not calibrated: {e}")),
    }
    c.took_ms = started.elapsed().as_secs_f64() * 1e3;
    c
}

fn uprobes(cx: &mut Cx<'_>, table: &'static FamilyTable) -> Result<(f64, f64), String> {
    let (path, offset) = target_location()?;
    let pid = NonZeroU32::new(std::process::id()).ok_or("pid 0")?;
    let mut attach = |name: &'static str| -> Result<(), String> {
        let spec = table.program(name).ok_or_else(|| format!("{name}: not in the table"))?;
        let kernel = &mut *cx.kernel;
        spec.load(&mut kernel.ebpf, &kernel.btf.btf).map_err(|e| e.to_string())?;
        let prog = probe::program::<UProbe>(&mut cx.kernel.ebpf, name).map_err(|e: ProbeError| e.to_string())?;
        let point = UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie: None };
        // The link stays with the program; unloading it detaches it.
        prog.attach(point, &path, UProbeScope::OneProcess(pid)).map(drop).map_err(|e| format!("{name}: {e}"))
    };
    let rounds = |n: u32| -> Vec<f64> { (0..ROUNDS).map(|_| time_target(n)).collect() };
    // Unprobed calls cost a few ns: more of them per round.
    let mut plain = rounds(UPROBE_CALLS * 100);
    let attached = attach("overhead_calib_up");
    let probed_up = attached.as_ref().map(|_| fastest(rounds(UPROBE_CALLS)));
    let probed_both = match &probed_up {
        Ok(_) => attach("overhead_calib_uret").map(|_| fastest(rounds(UPROBE_CALLS))),
        Err(e) => Err(String::clone(e)),
    };
    unload(cx, &["overhead_calib_up", "overhead_calib_uret"]);
    let (probed_up, probed_both) = (probed_up?, probed_both?);
    plain.extend(rounds(UPROBE_CALLS * 100));
    let plain = fastest(plain);
    Ok(((probed_up - plain).max(0.0), (probed_both - probed_up).max(0.0)))
}

/// Unloads programs (which detaches them), so that nothing of the
/// calibration stays attached.
fn unload(cx: &mut Cx<'_>, names: &[&'static str]) {
    for name in names {
        if let Ok(p) = probe::program::<UProbe>(&mut cx.kernel.ebpf, name) {
            let _ = p.unload();
        }
    }
}

fn tracepoints(cx: &mut Cx<'_>, table: &'static FamilyTable) -> Result<f64, String> {
    let plain = || time_getppid(SYSCALLS);
    let before: Vec<f64> = (0..ROUNDS).map(|_| plain()).collect();
    let mut links = Links::default();
    for name in ["overhead_calib_enter", "overhead_calib_exit"] {
        let spec = table.program(name).ok_or_else(|| format!("{name}: not in the table"))?;
        if let Err(e) = links.attach(&mut cx.kernel, spec) {
            links.detach(&mut cx.kernel.ebpf);
            return Err(e.to_string());
        }
    }
    let probed: Vec<f64> = (0..ROUNDS).map(|_| plain()).collect();
    links.detach(&mut cx.kernel.ebpf);
    let after: Vec<f64> = (0..ROUNDS).map(|_| plain()).collect();
    let base = fastest(before.into_iter().chain(after).collect());
    Ok((fastest(probed) - base).max(0.0))
}
