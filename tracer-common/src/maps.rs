//! Names of the kernel maps userspace opens: the kernel side declares each
//! as a `#[map] static` of this name (`tracer-ebpf/src/`), userspace opens
//! it by the constant. `ALL` lists them; a unit test of tracer-user
//! (`families::tests`) checks that each is a map of the embedded object.

// Shared by the families (tracer-ebpf/src/main.rs).
pub const WINDOW: &str = "WINDOW";
pub const COUNTERS: &str = "COUNTERS";
pub const STACKS: &str = "STACKS";
pub const TARGETS: &str = "TARGETS";
pub const TARGETS_GEN: &str = "TARGETS_GEN";
pub const PROC_EVENTS: &str = "PROC_EVENTS";
pub const SYSCALL_START: &str = "SYSCALL_START";
// exec_watch
pub const AGENT_EXECS: &str = "AGENT_EXECS";
// syscalls
pub const SYSCALL_STATS: &str = "SYSCALL_STATS";
pub const SYSCALL_ERRNO: &str = "SYSCALL_ERRNO";
pub const SYSCALL_PENDING: &str = "SYSCALL_PENDING";
pub const SYSCALL_SLOTS: &str = "SYSCALL_SLOTS";
pub const SYSCALL_SLOT_OWNER: &str = "SYSCALL_SLOT_OWNER";
pub const SLOW_SYSCALLS: &str = "SLOW_SYSCALLS";
// sched
pub const THREADS: &str = "THREADS";
pub const REUSED_THREADS: &str = "REUSED_THREADS";
pub const OFFCPU_STACKS: &str = "OFFCPU_STACKS";
pub const RUNQ_HIST: &str = "RUNQ_HIST";
pub const REASON_OF_NR: &str = "REASON_OF_NR";
pub const GIL_HOLDERS: &str = "GIL_HOLDERS";
// cpu_samples
pub const CPU_SAMPLES: &str = "CPU_SAMPLES";
// python
pub const PY_CODES: &str = "PY_CODES";
pub const PY_STACKS: &str = "PY_STACKS";
pub const PY_LAYOUT: &str = "PY_LAYOUT";
pub const PY_TSTATE: &str = "PY_TSTATE";
pub const GIL_RANGE: &str = "GIL_RANGE";
pub const PY_TSTATE_TID: &str = "PY_TSTATE_TID";
// asyncio
pub const ASYNC_EVENTS: &str = "ASYNC_EVENTS";
pub const ASYNC_LOST: &str = "ASYNC_LOST";
// timeline
pub const TIMELINE_EVENTS: &str = "TIMELINE_EVENTS";
pub const TIMELINE_LOST: &str = "TIMELINE_LOST";
// cuda
pub const CUDA_EVENTS: &str = "CUDA_EVENTS";
pub const CUDA_NAMES: &str = "CUDA_NAMES";
pub const CUDA_STATS: &str = "CUDA_STATS";
pub const CUDA_LAUNCHES: &str = "CUDA_LAUNCHES";
pub const CUDA_INFLIGHT: &str = "CUDA_INFLIGHT";
pub const CUDA_CAPTURE: &str = "CUDA_CAPTURE";
pub const CUDA_EVENT_COPY: &str = "CUDA_EVENT_COPY";
pub const CUDA_COLL_PENDING: &str = "CUDA_COLL_PENDING";
pub const CUDA_COLL_EPOCH: &str = "CUDA_COLL_EPOCH";
pub const CUDA_TEXT: &str = "CUDA_TEXT";
pub const CUDA_USDT_SPECS: &str = "CUDA_USDT_SPECS";
pub const CUDA_DRV_ROUTE: &str = "CUDA_DRV_ROUTE";
pub const CUDA_SLICE: &str = "CUDA_SLICE";
pub const CUDA_SLICE_HITS: &str = "CUDA_SLICE_HITS";
pub const CUDA_SLICE_API_HITS: &str = "CUDA_SLICE_API_HITS";
// memory
pub const MEM_STATE: &str = "MEM_STATE";
pub const MEM_MM: &str = "MEM_MM";
pub const MEM_SAMPLES: &str = "MEM_SAMPLES";
pub const MEM_GROWTH: &str = "MEM_GROWTH";
pub const MEM_OOM: &str = "MEM_OOM";

/// Every name above.
pub const ALL: &[&str] = &[
    WINDOW,
    COUNTERS,
    STACKS,
    TARGETS,
    TARGETS_GEN,
    PROC_EVENTS,
    SYSCALL_START,
    AGENT_EXECS,
    SYSCALL_STATS,
    SYSCALL_ERRNO,
    SYSCALL_PENDING,
    SYSCALL_SLOTS,
    SYSCALL_SLOT_OWNER,
    SLOW_SYSCALLS,
    THREADS,
    REUSED_THREADS,
    OFFCPU_STACKS,
    RUNQ_HIST,
    REASON_OF_NR,
    GIL_HOLDERS,
    CPU_SAMPLES,
    PY_CODES,
    PY_STACKS,
    PY_LAYOUT,
    PY_TSTATE,
    GIL_RANGE,
    PY_TSTATE_TID,
    ASYNC_EVENTS,
    ASYNC_LOST,
    TIMELINE_EVENTS,
    TIMELINE_LOST,
    CUDA_EVENTS,
    CUDA_NAMES,
    CUDA_STATS,
    CUDA_LAUNCHES,
    CUDA_INFLIGHT,
    CUDA_CAPTURE,
    CUDA_EVENT_COPY,
    CUDA_COLL_PENDING,
    CUDA_COLL_EPOCH,
    CUDA_TEXT,
    CUDA_USDT_SPECS,
    CUDA_DRV_ROUTE,
    CUDA_SLICE,
    CUDA_SLICE_HITS,
    CUDA_SLICE_API_HITS,
    MEM_STATE,
    MEM_MM,
    MEM_SAMPLES,
    MEM_GROWTH,
    MEM_OOM,
];
