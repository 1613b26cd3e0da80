//! The bottleneck classes, their labels and the one line of advice each
//! (docs/verdict.md has the table).

use serde::{Deserialize, Serialize};

/// Where a thread's wall time went, as the verdict names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// On CPU in the interpreter (samples whose first user-space frame is
    /// libpython, the python executable, or a Python frame).
    PythonCompute,
    /// On CPU in another native library (numpy, onnxruntime, libc...).
    NativeCompute,
    /// Waiting to take the GIL.
    Gil,
    /// Blocked in read/write/open/... (files, pipes, sockets).
    Io,
    /// Blocked on a lock, queue, condition variable, join (futex).
    WaitingOnThreads,
    /// Blocked in poll/select/epoll (network, event loops).
    Polling,
    /// Blocked in nanosleep & co (time.sleep, timers).
    Sleeping,
    /// Blocked elsewhere (wait4, a child, a stop...).
    OtherWait,
    /// Runnable, waiting for a CPU (run-queue delay).
    CpuStarvation,
    /// Blocked in a CUDA synchronize or a blocking copy (off CPU), or
    /// spinning in a synchronize (on CPU).
    GpuSync,
    /// On CPU inside a host<->device copy call.
    CopyWork,
    /// Waiting for NCCL collectives: blocked (or spinning) in a sync whose
    /// stream, event or device had a collective queued (most of the
    /// line's sync time), or inside an NCCL call (schema 1.x addition).
    Collective,
    /// On CPU in a native library's worker thread (onnxruntime, OpenBLAS,
    /// OpenMP, PyTorch intra-op pools): a thread without Python frames in a
    /// Python process (verdict/pools.rs).
    NativePool,
    /// Blocked on memory: page-ins in page faults (file-backed mappings,
    /// swap), direct reclaim, compaction, memory.high throttling (the
    /// `memory` off-CPU reason; schema 1.x addition).
    MemoryStall,
    /// Waiting for data from the job's other processes or threads
    /// (multiprocessing queues and pipes, `queue.Queue`, a DataLoader's
    /// workers) while they are busy producing it (verdict/pipeline.rs;
    /// schema 1.x addition).
    InputPipeline,
}

impl Class {
    pub const ALL: [Class; 15] = [
        Class::PythonCompute,
        Class::NativeCompute,
        Class::Gil,
        Class::Io,
        Class::WaitingOnThreads,
        Class::Polling,
        Class::Sleeping,
        Class::OtherWait,
        Class::CpuStarvation,
        Class::GpuSync,
        Class::CopyWork,
        Class::Collective,
        Class::NativePool,
        Class::MemoryStall,
        Class::InputPipeline,
    ];

    /// The JSON name (`python_compute`, ...), also what `diff --metric` takes.
    pub fn id(self) -> &'static str {
        match self {
            Class::PythonCompute => "python_compute",
            Class::NativeCompute => "native_compute",
            Class::Gil => "gil",
            Class::Io => "io",
            Class::WaitingOnThreads => "waiting_on_threads",
            Class::Polling => "polling",
            Class::Sleeping => "sleeping",
            Class::OtherWait => "other_wait",
            Class::CpuStarvation => "cpu_starvation",
            Class::GpuSync => "gpu_sync",
            Class::CopyWork => "copy_work",
            Class::Collective => "collective",
            Class::NativePool => "native_pool",
            Class::MemoryStall => "memory_stall",
            Class::InputPipeline => "input_pipeline",
        }
    }

    pub fn from_id(s: &str) -> Option<Class> {
        Class::ALL.into_iter().find(|c| c.id() == s)
    }

    /// How the text report names it.
    pub fn label(self) -> &'static str {
        match self {
            Class::PythonCompute => "Python compute",
            Class::NativeCompute => "native compute",
            Class::Gil => "GIL contention",
            Class::Io => "I/O",
            Class::WaitingOnThreads => "waiting on other threads",
            Class::Polling => "polling/network waits",
            Class::Sleeping => "sleeping",
            Class::OtherWait => "other waits",
            Class::CpuStarvation => "CPU starvation",
            Class::GpuSync => "GPU synchronisation",
            Class::CopyWork => "host<->device copy work",
            Class::Collective => "waiting on collectives (NCCL)",
            Class::NativePool => "native worker pool",
            Class::MemoryStall => "waiting on memory (page-ins, reclaim)",
            Class::InputPipeline => "input pipeline",
        }
    }

    /// One line of advice.
    pub fn advice(self) -> &'static str {
        match self {
            Class::PythonCompute => {
                "the interpreter itself is the cost: vectorise the loop (numpy, torch), cache results, or move it to native code; `report --format svg` shows the hot path"
            }
            Class::NativeCompute => {
                "time in native libraries, not Python overhead: check batch sizes, the library's thread settings and whether the work is needed"
            }
            Class::Gil => {
                "Python threads take turns on the GIL: use processes (multiprocessing), fewer Python threads, or native code that releases the GIL"
            }
            Class::Io => "blocked on files, pipes or sockets: overlap I/O with compute (prefetch in another thread), read bigger chunks, or cache",
            Class::WaitingOnThreads => {
                "this thread waits for another one (lock, queue, condition, join): the thread on the other side is the bottleneck; look at what it does"
            }
            Class::Polling => "waiting for network or events (poll/epoll/select): idle between requests, or waiting on a slow peer",
            Class::Sleeping => "the code sleeps (time.sleep, timers): remove fixed sleeps and back-offs or make them event-driven",
            Class::OtherWait => "blocked outside the usual syscalls (waiting for a child, a stop): see the off-CPU stacks",
            Class::CpuStarvation => {
                "runnable but no CPU free: more busy threads than cores (affinity, cgroup CPU quota, oversized thread pools); reduce them or add CPUs"
            }
            Class::GpuSync => {
                "the host waits for the GPU (synchronize, .item(), blocking copies): drop per-step syncs, keep values on the GPU, copy from pinned memory with non_blocking=True"
            }
            Class::CopyWork => "the CPU copies between host and device: pin host buffers, batch small copies, keep constant tensors on the GPU",
            Class::Collective => {
                "the host waits for NCCL collectives (all-reduce, all-gather...): the slowest rank or the interconnect sets the pace; overlap communication with compute (DDP bucketing, async_op=True and wait later), balance the ranks' work, check the links (NCCL_DEBUG=INFO, nccl-tests)"
            }
            Class::NativePool => {
                "a native library's worker threads (onnxruntime, OpenBLAS, OpenMP, torch intra-op) use the CPU: size the pool (intra_op_num_threads, OMP_NUM_THREADS, torch.set_num_threads) to the cores you have; a busy-waiting pool spins between requests: turn spinning off (onnxruntime session.intra_op.allow_spinning=0, OMP_WAIT_POLICY=passive)"
            }
            Class::MemoryStall => {
                "the thread waits for memory: page-ins of a file-backed mapping (mmap'd weights: read them once, or use MAP_POPULATE/madvise WILLNEED), swap-ins, or reclaim and throttling at a memory limit (raise the cgroup's memory.high/limit, or hold less: see the memory growth lines)"
            }
            Class::InputPipeline => {
                "the loop waits for its producers (DataLoader workers, queue feeders): make producing cheaper or wider; the producers' own bottleneck says how"
            }
        }
    }

    /// On-CPU classes (compute, copies); the others are waits.
    pub fn on_cpu(self) -> bool {
        matches!(self, Class::PythonCompute | Class::NativeCompute | Class::CopyWork | Class::NativePool)
    }
}
