//! CPU samples in the kernel: the software CPU clock fires `cpu_sample` on
//! every CPU; samples of targets are counted per (thread, stacks).

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, perf_event},
    maps::HashMap,
    programs::PerfEventContext,
};
use tracer_common::{counters, cpu_samples::SampleKey};

use crate::{count_drop, is_target, kernel_stack_id, python, user_stack_id, window_closed};

#[map]
pub static CPU_SAMPLES: HashMap<SampleKey, u64> = HashMap::with_max_entries(32768, 0);

/// CPU-clock samples on every CPU, kept for targets only.
#[perf_event]
pub fn cpu_sample(ctx: PerfEventContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if tid == 0 || !is_target(tgid) || window_closed(unsafe { bpf_ktime_get_ns() }) {
        return 0;
    }
    let key = SampleKey {
        pid: tgid,
        tid,
        user_stack: user_stack_id(&ctx),
        kernel_stack: kernel_stack_id(&ctx),
        py_stack: python::capture(tgid, tid, python::SCRATCH_SAMPLE),
    };
    crate::timeline::sample(&key);
    match CPU_SAMPLES.get_ptr_mut(&key) {
        Some(p) => unsafe { *p += 1 },
        None => {
            if CPU_SAMPLES.insert(&key, &1u64, 0).is_err() {
                count_drop(counters::STACKS_LOST);
            }
        }
    }
    0
}
