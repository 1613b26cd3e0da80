//! Calibration programs for the tracer's self-reported overhead
//! (`tracer-user/src/families/overhead/calibrate.rs`): empty programs that the tracer
//! attaches for a moment at startup, to its own process only, to measure
//! what the kernel's mechanism costs per hit on this machine (the uprobe
//! trap, the uretprobe's return trap, the syscall tracepoints' slow path),
//! apart from what our programs do. Never attached to a target.

use aya_ebpf::{
    macros::{btf_tracepoint, uprobe, uretprobe},
    programs::{BtfTracePointContext, ProbeContext, RetProbeContext},
};

#[uprobe]
pub fn overhead_calib_up(_ctx: ProbeContext) -> u32 {
    0
}

#[uretprobe]
pub fn overhead_calib_uret(_ctx: RetProbeContext) -> u32 {
    0
}

#[btf_tracepoint(function = "sys_enter")]
pub fn overhead_calib_enter(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "sys_exit")]
pub fn overhead_calib_exit(_ctx: BtfTracePointContext) -> i32 {
    0
}
