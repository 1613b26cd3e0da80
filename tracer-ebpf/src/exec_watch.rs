//! `infertrace agent`: every exec on the machine, reported to userspace
//! (which matches it against the agent's selection and adds a match to
//! `TARGETS`). Attached only by the agent; `record` never loads a link for
//! it. One record per exec: rare compared with syscalls.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::RingBuf,
    programs::BtfTracePointContext,
};
use tracer_common::{
    counters,
    process::{ProcEvent, KIND_EXEC},
};

use crate::count_drop;

/// Exec records for the agent (`ProcEvent`, kind `KIND_EXEC`).
#[map]
pub static AGENT_EXECS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// `sched_process_exec(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)`,
/// for every process (the process family's program reports targets only).
#[btf_tracepoint(function = "sched_process_exec")]
pub fn agent_exec(_ctx: BtfTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mut entry) = AGENT_EXECS.reserve::<ProcEvent>(0) else {
        count_drop(counters::AGENT_EXECS_FULL);
        return 0;
    };
    let ev = ProcEvent {
        kind: KIND_EXEC,
        pid: (pid_tgid >> 32) as u32,
        ppid: 0,
        _pad: 0,
        ts_ns: unsafe { bpf_ktime_get_ns() },
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    };
    entry.write(ev);
    entry.submit(0);
    0
}
