//! CUDA runtime calls, seen through uprobes on libcudart. The attach cookie
//! of each uprobe is the API id (`tracer_common::cuda::api`), so one entry
//! program serves every function of the same shape:
//!
//! - `cuda_copy_enter`: `cudaMemcpy*(dst, src, count, kind[, stream])`
//! - `cuda_copy2d_enter`: `cudaMemcpy2D*(dst, dpitch, src, spitch, width,
//!   height, kind[, stream])` (kind and stream on the stack on x86_64)
//! - `cuda_generic_enter`: one pointer/handle and one size argument (syncs,
//!   allocations, frees, host registration)
//! - `cuda_drv_copy_enter`: driver copies `cuMemcpy*(dst, src, bytes[, stream])`
//! - `cuda_peer_copy_enter`: `cudaMemcpyPeer*` / `cuMemcpyPeer*(dst, dst
//!   device or context, src, src device or context, bytes[, stream])`
//! - `cuda_launch`: `cudaLaunchKernel*(func, ...)`,
//!   `cudaLaunchCooperativeKernel*(func, ...)`, `cuLaunchKernel*(f, ...)`,
//!   `cuLaunchCooperativeKernel*(f, ...)`; `cuda_launch_ex`:
//!   `cuLaunchKernelEx*(config, f, ...)`, `cudaLaunchKernelExC*(config,
//!   func, args)`; entry only, counted here
//! - `cuda_generic_enter` also takes the graph setup calls:
//!   `cudaStreamBeginCapture*(stream, mode)`, `cudaStreamEndCapture*(stream,
//!   &graph)`, `cudaGraphInstantiate*(&exec, graph, ...)` and their driver
//!   twins, and memsets; graph launches (`cudaGraphLaunch*(exec, stream)`,
//!   `cuGraphLaunch*`) go through `cuda_launch`, entry only
//! - `cuda_generic_enter` also takes events, queries and the kernel
//!   handle calls (`cuModuleGetFunction`, `cuLibraryGetKernel`,
//!   `cuKernelGetFunction`: the handle made is read at return, and the
//!   name of a lookup goes out through `CUDA_NAMES`)
//! - `cuda_nccl_enter`: NCCL collectives, point-to-point and group calls
//! - `cuda_return`: the uretprobe of everything but launches.
//!
//! A thread between a successful `cudaStreamBeginCapture` and its
//! `cudaStreamEndCapture` (`CUDA_CAPTURE`) records its launches and copies
//! into a graph: they are counted as captured (sent with the end of the
//! capture), not as launches or copies.
//!
//! Driver calls made from inside a runtime call (libcudart calls libcuda)
//! are not counted twice: a copy, sync or memory call entered while another
//! probed call is in flight deeper in the same thread's stack only bumps a
//! nesting depth. Launches have no return probe to nest with: a driver
//! launch that returns into a probed CUDA library's code is that library's
//! own (see `nested_launch`).
//!
//! Entry keeps the arguments and the stacks in a per-thread slot; return
//! aggregates count, bytes, time and errors per (pid, tid, api, kind, site) and
//! sends one event per call to userspace (copies, syncs and memory calls
//! only; they are far rarer than launches).

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user,
        generated::bpf_get_attach_cookie,
    },
    macros::{map, uprobe, uretprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};
use tracer_common::{
    counters,
    cuda::{
        api, CollPending, CudaCapture, CudaEvent, CudaInflight, CudaKey, CudaName, CudaStats, CudaText, EventKey, LaunchKey, UsdtArgSpec, UsdtSpec,
        FINGERPRINT_BYTES, KIND_DEFAULT, KIND_DTOD, KIND_HTOD, KIND_NONE, TEXT_RANGES, USDT_ARGS, USDT_ARG_CONST, USDT_ARG_MEM, USDT_ARG_REG,
        USDT_SPECS,
    },
};

use aya_log_ebpf::warn;

use crate::{count_drop, debug_enabled, debug_log_allowed, global, is_target, python, user_stack_id};

#[map]
pub static CUDA_STATS: HashMap<CudaKey, CudaStats> = HashMap::with_max_entries(16384, 0);

#[map]
pub static CUDA_LAUNCHES: HashMap<LaunchKey, u64> = HashMap::with_max_entries(16384, 0);

#[map]
pub static CUDA_INFLIGHT: HashMap<u32, CudaInflight> = HashMap::with_max_entries(32768, 0);

/// Per thread: its stream capture in progress (a successful
/// `cudaStreamBeginCapture` until `cudaStreamEndCapture` returns). The
/// thread's launches and copies meanwhile are recorded into the graph, not
/// run: counted here, not as launches or copies.
#[map]
pub static CUDA_CAPTURE: HashMap<u32, CudaCapture> = HashMap::with_max_entries(4096, 0);

/// Per (pid, event): the async copy an event was recorded behind (the
/// recording thread's last async copy, on the event's stream): an event
/// synchronize waits for that copy, as a stream synchronize would
/// (`cudaMemcpyAsync(..., s)`, `cudaEventRecord(e, s)`, later
/// `cudaEventSynchronize(e)`: PyTorch's `non_blocking` copy + event, vLLM's
/// token return). Removed when the event is synchronized or recorded again
/// without a copy behind it.
#[map]
pub static CUDA_EVENT_COPY: HashMap<EventKey, CudaKey> = HashMap::with_max_entries(8192, 0);

/// Per (pid, stream or event): the NCCL collective queued on that stream
/// (or behind that event) not yet waited on, with the process's epoch
/// then (`CUDA_COLL_EPOCH`). A collective returns at once; the thread that
/// later synchronizes the stream, the event recorded behind it, or a
/// stream made to wait on that event (`cudaStreamWaitEvent`: torch's
/// `work.wait()`), waits for the collective. LRU: streams and events die
/// unseen.
#[map]
pub static CUDA_COLL_PENDING: LruHashMap<EventKey, CollPending> = LruHashMap::with_max_entries(8192, 0);

/// Per process that queued a collective: the count of its device-wide
/// syncs (`epoch`), whether a collective was queued since the last one
/// (`live`) and the last such collective. A process without one costs
/// its syncs one lookup here.
#[map]
pub static CUDA_COLL_EPOCH: HashMap<u32, CollPending> = HashMap::with_max_entries(4096, 0);

/// Per process: the code ranges `[start, end)` of its probed runtimes
/// (shared, or linked statically into other libraries) and driver, set by
/// userspace (`TEXT_RANGES` pairs, unused ones zero).
#[map]
pub static CUDA_TEXT: HashMap<u32, CudaText> = HashMap::with_max_entries(16384, 0);

/// Per (pid << 32 | driver API id): `[calls made inside a probed call
/// (runtime -> driver), direct calls]`, while that driver function is
/// probed in that process. What userspace learns from to stop probing a
/// driver function that a process reaches only through its runtime
/// (`tracer-user/src/families/cuda/driver_gate.rs`).
#[map]
pub static CUDA_DRV_ROUTE: HashMap<u64, [u64; 2]> = HashMap::with_max_entries(16384, 0);

/// `--max-overhead`: the launch-sampling slice `[start, end)`, CLOCK_MONOTONIC
/// ns, written by userspace (`tracer-user/src/families/cuda/slicer.rs`). `start` 0:
/// launches are not sampled, every launch counts. Otherwise a launch
/// counts only inside the slice (hits while the probes are being attached
/// or released fall outside it).
#[map]
pub static CUDA_SLICE: Array<u64> = Array::with_max_entries(2, 0);

/// `--max-overhead`: per thread, its launches (not the driver launches
/// nested in them) seen inside slices: what the slicer sizes the slices
/// by and extrapolates from.
#[map]
pub static CUDA_SLICE_HITS: HashMap<u32, u64> = HashMap::with_max_entries(32768, 0);

/// `--max-overhead`: per launch API id, its hits inside slices (nested
/// or not; per CPU). The slicer prices each API's hits by how the kernel
/// runs its first instruction (emulated or stepped: 1 us or 30 us here),
/// and attaches only the APIs seen between its re-checks: each breakpoint
/// it puts in and takes out costs the target (a TLB flush on its CPU) and
/// the slicer (tens of ms to release).
#[map]
pub static CUDA_SLICE_API_HITS: PerCpuArray<u64> = PerCpuArray::with_max_entries(api::COUNT, 0);

/// USDT probe sites (PyTorch's caching allocator), by attach cookie: which
/// probe and where its arguments are (written by userspace from the
/// site's SDT note before it is attached).
#[map]
pub static CUDA_USDT_SPECS: Array<UsdtSpec> = Array::with_max_entries(USDT_SPECS, 0);

#[map]
pub static CUDA_EVENTS: RingBuf = RingBuf::with_byte_size(2 * 1024 * 1024, 0);

/// Kernel handles and their names (`cuModuleGetFunction`,
/// `cuLibraryGetKernel`): what names driver launches. Rare (module loads).
#[map]
pub static CUDA_NAMES: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// 1 with `--max-overhead`: launches may be sampled (`CUDA_SLICE`). 0, the
/// default: the verifier drops the slice's read from every launch.
#[unsafe(no_mangle)]
static CUDA_LAUNCH_SLICING: u32 = 0;

/// 0: no per-call events (aggregates only; the detector then sees less).
#[unsafe(no_mangle)]
static CUDA_EVENTS_ENABLED: u32 = 1;
/// Offset of the user stack pointer in `struct pt_regs` (x86_64 `sp`).
#[unsafe(no_mangle)]
static CUDA_REGS_SP_OFFSET: u64 = 152;
/// Offset of the link register in `struct pt_regs`, or `u64::MAX` where the
/// return address is on the stack at entry (x86_64).
#[unsafe(no_mangle)]
static CUDA_REGS_LR_OFFSET: u64 = u64::MAX;

/// Offset of the instruction pointer in `pt_regs` (x86_64: 128).
#[unsafe(no_mangle)]
static CUDA_REGS_IP_OFFSET: u64 = 128;

/// A u64 of user memory (`what`: which argument, for the diagnostic), 0
/// when unreadable. These reads (stack arguments, the return address, an
/// allocation's result) fail only on unmapped or non-resident memory.
#[inline(always)]
fn read_user_u64(addr: u64, what: &'static str) -> u64 {
    match unsafe { bpf_probe_read_user(addr as *const u64) } {
        Ok(v) => v,
        Err(e) => {
            if debug_enabled() {
                debug_read_failed(what, addr, e.into());
            }
            0
        }
    }
}

/// `DEBUG_EBPF` only: a failed `bpf_probe_read_user` of a call's argument.
#[inline(never)]
fn debug_read_failed(what: &str, addr: u64, err: i64) {
    if !debug_log_allowed() {
        return;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    warn!(&(), "cuda: pid {} tid {}: cannot read {} at {:x} (error {})", tgid, tid, what, addr, err);
}

#[inline(always)]
fn regs_u64<C: EbpfContext>(ctx: &C, offset: u64) -> u64 {
    let p = ctx.as_ptr() as u64 + offset;
    unsafe { bpf_probe_read_kernel(p as *const u64) }.unwrap_or(0)
}

/// The user stack pointer at entry.
#[inline(always)]
fn user_sp(ctx: &ProbeContext) -> u64 {
    regs_u64(ctx, global(&CUDA_REGS_SP_OFFSET))
}

/// The return address of the probed call, read at its entry.
#[inline(always)]
fn return_address(ctx: &ProbeContext) -> u64 {
    let lr = global(&CUDA_REGS_LR_OFFSET);
    if lr == u64::MAX { read_user_u64(user_sp(ctx), "the return address") } else { regs_u64(ctx, lr) }
}

/// Argument `n` (0-based) of the probed function at its entry: registers
/// first, then the stack (x86_64: 7th argument at sp + 8).
#[inline(always)]
fn arg_or_stack(ctx: &ProbeContext, n: usize, first_on_stack: usize) -> u64 {
    match ctx.arg::<u64>(n) {
        Some(v) => v,
        None => read_user_u64(user_sp(ctx) + 8 * (n - first_on_stack + 1) as u64, "a stack argument"),
    }
}

#[inline(always)]
fn cookie(ctx: &ProbeContext) -> u32 {
    (unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }) as u32
}

/// FNV-1a over the first `min(len, FINGERPRINT_BYTES)` bytes at `addr`.
/// A function of its own: its 64-byte buffer is not on the stack while
/// the Python stack walk (a deeper call chain) is.
#[inline(never)]
fn fingerprint(addr: u64, len: u64) -> u64 {
    let mut words = [0u64; (FINGERPRINT_BYTES / 8) as usize];
    let ok = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            words.as_mut_ptr().cast(),
            FINGERPRINT_BYTES as u32,
            addr as *const core::ffi::c_void,
        )
    };
    if ok != 0 {
        // Not a diagnostic: a `cudaMemcpyDefault` source may be device
        // memory, which the host cannot read.
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ len;
    let mut i = 0;
    while i < words.len() {
        let start = 8 * i as u64;
        if start < len {
            let mut w = words[i];
            let left = len - start;
            if left < 8 {
                w &= (1u64 << (8 * left)) - 1;
            }
            h = (h ^ w).wrapping_mul(0x0000_0100_0000_01b3);
        }
        i += 1;
    }
    h | 1
}

/// Counts one hit of driver function `a` in process `tgid`, made inside a
/// probed call (`nested`) or directly (`CUDA_DRV_ROUTE`). A function of its
/// own: its branches do not multiply the states the verifier walks in the
/// programs that call it.
#[inline(never)]
fn route(tgid: u32, a: u32, nested: bool) {
    if !api::is_driver(a) {
        return;
    }
    let key = ((tgid as u64) << 32) | a as u64;
    match CUDA_DRV_ROUTE.get_ptr_mut(&key) {
        // SAFETY: a map value. Threads of one process share the key: an
        // increment lost to a race only delays the decision (`direct`
        // stays non-zero once a direct call was counted).
        Some(p) => unsafe {
            if nested {
                (*p)[0] += 1;
            } else {
                (*p)[1] += 1;
            }
        },
        None => {
            let v = if nested { [1u64, 0] } else { [0u64, 1] };
            // Two threads inserting at once: one count is lost, which only
            // delays the decision (a direct call leaves `direct` non-zero).
            let _ = CUDA_DRV_ROUTE.insert(&key, &v, 0);
        }
    }
}

/// Records the entry of an accounted call on this thread.
#[inline(always)]
fn begin(ctx: &ProbeContext, api: u32, kind: u32, bytes: u64, dst: u64, src: u64, stream: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !is_target(tgid) {
        return;
    }
    let tid = pid_tgid as u32;
    let sp = user_sp(ctx);
    // The thread's slot, rewritten in place below when it has one (an
    // insert would copy it into a new element and free the old one).
    let mut own: *mut CudaInflight = core::ptr::null_mut();
    if let Some(slot) = CUDA_INFLIGHT.get_ptr_mut(&tid) {
        own = slot;
        // SAFETY: map value owned by this thread.
        unsafe {
            if (*slot).active != 0 {
                // Called from inside the call in flight: deeper in the stack,
                // or a driver function the runtime call tail-called (same
                // stack pointer; the runtime call has not returned, or its
                // return probe would have freed the slot).
                let tail = sp == (*slot).sp && api::is_driver(api) && !api::is_driver((*slot).api);
                if sp < (*slot).sp || tail {
                    (*slot).depth += 1;
                    route(tgid, api, true);
                    return;
                }
                // The call in flight returned unseen: start over.
                count_drop(counters::CUDA_LOST);
            }
        }
    }
    route(tgid, api, false);
    // The native stack only where there is no Python one: a call's site is
    // its leaf Python frame when it has one (as for launches).
    let py_stack = python::capture_reusing(tgid, tid, python::SCRATCH_UPROBE);
    let user_stack = native_stack_unless(ctx, py_stack);
    let fp = if (kind == KIND_HTOD || kind == KIND_DEFAULT) && api::is_copy(api) { fingerprint(src, bytes) } else { 0 };
    let caller = return_address(ctx);
    if own.is_null() {
        // A zeroed slot (no pending async copy), filled in place below: a
        // `CudaInflight` built here would take 144 bytes of the 512-byte
        // stack that this program shares with the Python stack walk.
        if CUDA_INFLIGHT.insert(&tid, &INFLIGHT_ZERO, 0).is_err() {
            count_drop(counters::CUDA_LOST);
            return;
        }
        match CUDA_INFLIGHT.get_ptr_mut(&tid) {
            Some(slot) => own = slot,
            None => return,
        }
    }
    // SAFETY: the thread's own slot (only it writes there). The thread's
    // pending async copy (`last_copy*`) survives the slot's reuse.
    unsafe {
        let s = &mut *own;
        s.api = api;
        s.kind = kind;
        s.bytes = bytes;
        s.dst = dst;
        s.src = src;
        s.stream = stream;
        s.fingerprint = fp;
        s.py_stack = py_stack;
        s.caller = caller;
        s.sp = sp;
        s.user_stack = user_stack;
        s.depth = 0;
        s.active = 1;
    }
    // Timed from here: the stack captures above are not the call's time.
    unsafe { (*own).start_ns = bpf_ktime_get_ns() };
}

/// What a thread's first call inserts into `CUDA_INFLIGHT` (from global
/// data, not the stack).
static INFLIGHT_ZERO: CudaInflight = unsafe { core::mem::zeroed() };

/// The user stack id when there is no Python stack, else -1 (a function of
/// its own, like `route`).
#[inline(never)]
fn native_stack_unless(ctx: &ProbeContext, py_stack: u64) -> i32 {
    if py_stack == 0 {
        user_stack_id(ctx)
    } else {
        -1
    }
}

/// `cudaMemcpy(dst, src, count, kind)`, `cudaMemcpyAsync(dst, src, count, kind, stream)`.
#[uprobe]
pub fn cuda_copy_enter(ctx: ProbeContext) -> u32 {
    let a = cookie(&ctx);
    let dst: u64 = ctx.arg(0).unwrap_or(0);
    let src: u64 = ctx.arg(1).unwrap_or(0);
    let count: u64 = ctx.arg(2).unwrap_or(0);
    let kind = ctx.arg::<u64>(3).unwrap_or(0) as u32;
    let stream: u64 = if api::is_async_copy(a) { ctx.arg(4).unwrap_or(0) } else { 0 };
    begin(&ctx, a, kind, count, dst, src, stream);
    0
}

/// `cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind)`, and the
/// async form with a stream after `kind`.
#[uprobe]
pub fn cuda_copy2d_enter(ctx: ProbeContext) -> u32 {
    let a = cookie(&ctx);
    let dst: u64 = ctx.arg(0).unwrap_or(0);
    let src: u64 = ctx.arg(2).unwrap_or(0);
    let width: u64 = ctx.arg(4).unwrap_or(0);
    let height: u64 = ctx.arg(5).unwrap_or(0);
    let kind = arg_or_stack(&ctx, 6, 6) as u32;
    let stream = if api::is_async_copy(a) { arg_or_stack(&ctx, 7, 6) } else { 0 };
    begin(&ctx, a, kind, width.wrapping_mul(height), dst, src, stream);
    0
}

/// Syncs (`stream` / `event`), allocations (`void **out, size`), frees
/// (`ptr`), `cudaHostRegister(ptr, size, flags)`, memsets (`ptr, value,
/// count, stream`), and graph setup: `cudaStreamBeginCapture(stream, mode)`,
/// `cudaStreamEndCapture(stream, cudaGraph_t *graph)` (the graph is read at
/// return), `cudaGraphInstantiate*(cudaGraphExec_t *exec, cudaGraph_t
/// graph, ...)` (the executable graph is read at return) and the driver's.
/// The arguments are picked first and `begin` is called once: each call
/// site of it would be verified on its own.
#[uprobe]
pub fn cuda_generic_enter(ctx: ProbeContext) -> u32 {
    let a = cookie(&ctx);
    let arg0: u64 = ctx.arg(0).unwrap_or(0);
    let arg1: u64 = ctx.arg(1).unwrap_or(0);
    // (bytes, dst, src, stream)
    let (bytes, dst, src, stream) = if api::is_memset(a) {
        // (ptr, value, count, stream): bytes like a copy's.
        let count: u64 = ctx.arg(2).unwrap_or(0);
        (count.wrapping_mul(api::memset_unit(a)), arg0, 0, ctx.arg::<u64>(3).unwrap_or(0))
    } else if api::is_instantiate(a) {
        (0, arg0, arg1, 0)
    } else if api::is_capture_end(a) {
        (0, arg1, 0, arg0)
    } else if api::is_capture_begin(a) {
        (0, 0, 0, arg0)
    } else if api::is_event_record(a) {
        // (event, stream[, flags])
        (0, arg0, 0, arg1)
    } else if api::is_stream_wait_event(a) {
        // (stream, event, flags)
        (0, arg1, 0, arg0)
    } else if api::is_query(a) {
        // (event) or (stream)
        (0, 0, 0, arg0)
    } else if api::is_kernel_lookup(a) {
        // (CUfunction *out, CUmodule, const char *name): the name in `src`.
        (0, arg0, ctx.arg::<u64>(2).unwrap_or(0), 0)
    } else if api::returns_handle(a) {
        // cuKernelGetFunction(CUfunction *out, CUkernel)
        (0, arg0, arg1, 0)
    } else if api::is_sync(a) {
        (0, 0, 0, if api::canonical(a) == api::DEVICE_SYNC { 0 } else { arg0 })
    } else if api::releases_pointer(a) {
        (0, arg0, 0, 0)
    } else {
        (arg1, arg0, 0, 0)
    };
    begin(&ctx, a, KIND_NONE, bytes, dst, src, stream);
    0
}

/// NCCL calls: `ncclAllReduce(send, recv, count, type, op, comm, stream)`
/// and the other collectives and point-to-point calls (the match below
/// says where count, type, communicator and stream are, after nccl.h; the
/// 7th and 8th arguments on the stack on x86_64), and
/// `ncclGroupStart/End()`. Bytes
/// are count x the type's size; the communicator goes in `dst`, the count
/// in `src`. The arguments are read by constant position (the verifier
/// rejects an argument register chosen at run time).
#[uprobe]
pub fn cuda_nccl_enter(ctx: ProbeContext) -> u32 {
    let a = cookie(&ctx);
    let r = |n: usize| ctx.arg::<u64>(n).unwrap_or(0);
    let (count, dtype, comm, stream) = match a {
        api::NCCL_ALL_REDUCE | api::NCCL_BROADCAST | api::NCCL_REDUCE_SCATTER => (r(2), r(3), r(5), arg_or_stack(&ctx, 6, 6)),
        api::NCCL_REDUCE => (r(2), r(3), arg_or_stack(&ctx, 6, 6), arg_or_stack(&ctx, 7, 6)),
        api::NCCL_ALL_GATHER | api::NCCL_ALL_TO_ALL => (r(2), r(3), r(4), r(5)),
        api::NCCL_BCAST | api::NCCL_SEND | api::NCCL_RECV => (r(1), r(2), r(4), r(5)),
        _ => (0, 0, 0, 0),
    };
    begin(&ctx, a, KIND_NONE, count.wrapping_mul(api::nccl_type_size(dtype & 0xffff_ffff)), comm, count, stream);
    0
}

/// Peer copies, runtime and driver alike: `cudaMemcpyPeer(dst, dst_device,
/// src, src_device, bytes)`, `cudaMemcpyPeerAsync(..., stream)`,
/// `cuMemcpyPeer(dst, dst_ctx, src, src_ctx, bytes)`, `cuMemcpyPeerAsync(...,
/// stream)`: device to device.
#[uprobe]
pub fn cuda_peer_copy_enter(ctx: ProbeContext) -> u32 {
    let a = cookie(&ctx);
    let dst: u64 = ctx.arg(0).unwrap_or(0);
    let src: u64 = ctx.arg(2).unwrap_or(0);
    let count: u64 = ctx.arg(4).unwrap_or(0);
    let stream: u64 = if api::is_async_copy(a) { ctx.arg(5).unwrap_or(0) } else { 0 };
    begin(&ctx, a, KIND_DTOD, count, dst, src, stream);
    0
}

/// Driver copies: `cuMemcpyHtoD_v2(dst, src, bytes)`,
/// `cuMemcpyHtoDAsync_v2(dst, src, bytes, stream)`, `cuMemcpy(dst, src,
/// bytes)` (unified addressing: kind `Default`), ...
#[uprobe]
pub fn cuda_drv_copy_enter(ctx: ProbeContext) -> u32 {
    let a = cookie(&ctx);
    let dst: u64 = ctx.arg(0).unwrap_or(0);
    let src: u64 = ctx.arg(1).unwrap_or(0);
    let count: u64 = ctx.arg(2).unwrap_or(0);
    let stream: u64 = if api::is_async_copy(a) { ctx.arg(3).unwrap_or(0) } else { 0 };
    begin(&ctx, a, api::driver_copy_kind(a), count, dst, src, stream);
    0
}

/// Whether a driver launch is a probed call's own: it returns into the code
/// of this process's probed runtime or driver library (`CUDA_TEXT`), as a
/// runtime launch calling the driver, or `cuLaunchKernelEx` calling
/// `cuLaunchKernel`, does. A direct launch returns into the caller's code.
#[inline(always)]
fn nested_launch(ctx: &ProbeContext, a: u32, tgid: u32) -> bool {
    if !api::is_driver(a) {
        return false;
    }
    let Some(r) = (unsafe { CUDA_TEXT.get(&tgid) }) else { return false };
    let ret = return_address(ctx);
    // Userspace fills the ranges from the first: an empty one ends them.
    let mut i = 0;
    while i < TEXT_RANGES && r[2 * i + 1] != 0 {
        if r[2 * i] <= ret && ret < r[2 * i + 1] {
            return true;
        }
        i += 1;
    }
    false
}

/// Where a launch falls under `--max-overhead` (`CUDA_SLICE`).
#[derive(PartialEq, Eq, Clone, Copy)]
enum Slice {
    /// Launches not sampled: every one counts.
    All,
    /// Outside the slice: not counted.
    Out,
    /// Inside a slice: counted, and in `CUDA_SLICE_HITS`.
    In,
}

#[inline(always)]
fn launch_slice() -> Slice {
    if global(&CUDA_LAUNCH_SLICING) == 0 {
        return Slice::All;
    }
    let start = CUDA_SLICE.get(0).copied().unwrap_or(0);
    if start == 0 {
        return Slice::All;
    }
    let end = CUDA_SLICE.get(1).copied().unwrap_or(0);
    let now = unsafe { bpf_ktime_get_ns() };
    if now < start || now >= end {
        return Slice::Out;
    }
    Slice::In
}

/// One launch of thread `tid` seen in a slice.
#[inline(always)]
fn count_slice_hit(tid: u32) {
    match CUDA_SLICE_HITS.get_ptr_mut(&tid) {
        // SAFETY: per-thread key: this thread is the only writer.
        Some(p) => unsafe { *p += 1 },
        None => {
            let _ = CUDA_SLICE_HITS.insert(&tid, &1u64, 0);
        }
    }
}

/// One hit of launch API `a` in a slice.
#[inline(always)]
fn count_api_hit(a: u32) {
    if let Some(p) = CUDA_SLICE_API_HITS.get_ptr_mut(a) {
        // SAFETY: this CPU's value of a per-CPU map.
        unsafe { *p += 1 };
    }
}

/// `cudaLaunchKernel(func, grid, block, args, shmem, stream)`,
/// `cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params,
/// extra)`: the kernel is the first argument.
#[uprobe]
pub fn cuda_launch(ctx: ProbeContext) -> u32 {
    let func: u64 = ctx.arg(0).unwrap_or(0);
    launch(&ctx, func);
    0
}

/// `cuLaunchKernelEx(config, f, params, extra)`, `cudaLaunchKernelExC(config,
/// func, args)`: the kernel is the second argument (a program of its own:
/// the verifier rejects an argument register chosen at run time).
#[uprobe]
pub fn cuda_launch_ex(ctx: ProbeContext) -> u32 {
    let func: u64 = ctx.arg(1).unwrap_or(0);
    launch(&ctx, func);
    0
}

/// Counts a launch per (pid, func, site), entry only. The user stack is
/// taken only when there is no Python stack.
#[inline(always)]
fn launch(ctx: &ProbeContext, func: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !is_target(tgid) {
        return;
    }
    let a = cookie(ctx);
    // Out of the slice first: a hit there (the probes being attached or
    // released) does nothing more. Graph launches are never sliced.
    let slice = if api::is_graph_launch(a) { Slice::All } else { launch_slice() };
    if slice == Slice::Out {
        return;
    }
    if slice == Slice::In {
        count_api_hit(a);
    }
    let nested = nested_launch(ctx, a, tgid);
    if !nested && slice != Slice::All {
        count_slice_hit(pid_tgid as u32);
    }
    if nested {
        route(tgid, a, true);
        return;
    }
    route(tgid, a, false);
    // Captured into a graph, not run.
    if let Some(c) = CUDA_CAPTURE.get_ptr_mut(&(pid_tgid as u32)) {
        // SAFETY: per-thread key: this thread is the only writer.
        unsafe { (*c).launches += 1 };
        return;
    }
    let py_stack = python::capture_reusing(tgid, pid_tgid as u32, python::SCRATCH_UPROBE);
    let user_stack = if py_stack == 0 {
        user_stack_id(ctx)
    } else {
        -1
    };
    let key = LaunchKey { pid: tgid, tid: pid_tgid as u32, api: a, user_stack, func, py_stack };
    // Per-thread keys: this thread is the only writer.
    match CUDA_LAUNCHES.get_ptr_mut(&key) {
        Some(p) => unsafe { *p += 1 },
        None => {
            if CUDA_LAUNCHES.insert(&key, &1u64, 0).is_err() {
                count_drop(counters::CUDA_LOST);
            }
        }
    }
}

/// One USDT argument as its spec says (0 when it cannot be read).
#[inline(never)]
fn usdt_arg(ctx: &ProbeContext, a: &UsdtArgSpec) -> u64 {
    let raw = match a.kind {
        USDT_ARG_REG => regs_u64(ctx, a.pt_regs_offset as u64),
        USDT_ARG_MEM => read_user_u64(regs_u64(ctx, a.pt_regs_offset as u64).wrapping_add(a.value as u64), "a USDT argument"),
        USDT_ARG_CONST => a.value as u64,
        _ => 0,
    };
    let bits = 8 * (a.size as u64);
    if bits == 0 || bits >= 64 {
        return raw;
    }
    let v = raw & ((1u64 << bits) - 1);
    if a.signed != 0 && v >> (bits - 1) != 0 {
        v | !((1u64 << bits) - 1)
    } else {
        v
    }
}

/// USDT probes of PyTorch's CUDA caching allocator (`libc10_cuda.so`):
/// `pytorch:malloc(ptr, device, size, stream)` and `pytorch:free(ptr)`.
/// The cookie indexes `CUDA_USDT_SPECS`. A probe site is no call: counted
/// and sent at once (duration 0), with the Python stack (or the native
/// one) and the probe's own address as its site.
#[uprobe]
pub fn cuda_usdt(ctx: ProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !is_target(tgid) {
        return 0;
    }
    let tid = pid_tgid as u32;
    let index = (unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }) as u32;
    let Some(spec) = CUDA_USDT_SPECS.get(index) else { return 0 };
    if !api::is_torch_allocator(spec.api) {
        return 0;
    }
    let mut vals = [0u64; USDT_ARGS];
    let mut i = 0;
    while i < USDT_ARGS {
        if (i as u32) < spec.nargs {
            vals[i] = usdt_arg(&ctx, &spec.args[i]);
        }
        i += 1;
    }
    let a = spec.api;
    // malloc: (ptr, device, size, stream); free: (ptr).
    let (ptr, device, bytes, stream) = if a == api::TORCH_MALLOC { (vals[0], vals[1], vals[2], vals[3]) } else { (vals[0], 0, 0, 0) };
    let now = unsafe { bpf_ktime_get_ns() };
    let py_stack = python::capture_reusing(tgid, tid, python::SCRATCH_UPROBE);
    let user_stack = native_stack_unless(&ctx, py_stack);
    let key = CudaKey {
        pid: tgid,
        tid,
        api: a,
        kind: KIND_NONE,
        user_stack,
        _pad: 0,
        py_stack,
        caller: regs_u64(&ctx, global(&CUDA_REGS_IP_OFFSET)),
    };
    account(&key, bytes, 0, false);
    if global(&CUDA_EVENTS_ENABLED) == 0 {
        return 0;
    }
    let Some(mut entry) = CUDA_EVENTS.reserve::<CudaEvent>(0) else {
        count_drop(counters::CUDA_EVENTS_LOST);
        return 0;
    };
    entry.write(CudaEvent {
        pid: tgid,
        tid,
        api: a,
        kind: KIND_NONE,
        rc: 0,
        user_stack,
        start_ns: now,
        dur_ns: 0,
        bytes,
        dst: ptr,
        src: device,
        stream,
        fingerprint: 0,
        py_stack,
        caller: key.caller,
    });
    entry.submit(0);
    0
}

#[uretprobe]
pub fn cuda_return(ctx: RetProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !is_target(tgid) {
        return 0;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let tid = pid_tgid as u32;
    let Some(slot) = CUDA_INFLIGHT.get_ptr_mut(&tid) else { return 0 };
    // The stack pointer after the return: above the call's own entry
    // stack pointer (x86_64: the return address popped) only when the
    // call in flight itself returns, below it when a call nested in it
    // does. It decides, not the depth count, so that a nested call whose
    // return probe went away while it ran (the driver's probes detached
    // for this process, `driver_gate.rs`) cannot leave the call in flight
    // unaccounted.
    let sp_after = regs_u64(&ctx, global(&CUDA_REGS_SP_OFFSET));
    let popped = if global(&CUDA_REGS_LR_OFFSET) == u64::MAX { 8 } else { 0 };
    // SAFETY: map value owned by this thread.
    let call = unsafe {
        if (*slot).active == 0 {
            return 0;
        }
        let nested_return = if sp_after != 0 { sp_after < (*slot).sp + popped } else { (*slot).depth != 0 };
        if nested_return {
            if (*slot).depth != 0 {
                (*slot).depth -= 1;
            }
            return 0;
        }
        (*slot).depth = 0;
        (*slot).active = 0;
        *slot
    };
    let rc = ctx.ret::<u64>() as i32;
    let ns = now.saturating_sub(call.start_ns);
    if captured_copy(&call, tid) {
        return 0;
    }
    // Graph setup: the capture's state and what it made.
    let mut captured = CudaCapture { stream: 0, launches: 0, copies: 0, copy_bytes: 0 };
    if api::is_graph_setup(call.api) {
        captured = graph_setup(call.api, call.stream, tid, rc);
    }
    let key = CudaKey {
        pid: tgid,
        tid,
        api: call.api,
        kind: if api::is_copy(call.api) { call.kind } else { KIND_NONE },
        user_stack: call.user_stack,
        _pad: 0,
        py_stack: call.py_stack,
        caller: call.caller,
    };
    let bytes = if api::releases_pointer(call.api) || api::is_sync(call.api) { 0 } else { call.bytes };
    if api::is_query(call.api) {
        // Queries are aggregated only (no event: polling loops are hot),
        // not-ready apart from errors; only an error goes out as an event.
        // SAFETY: map value owned by this thread.
        let spun = unsafe { poll_wait(&mut *slot, rc, call.start_ns, now) };
        account_query(&key, ns, rc, spun);
        if spun != 0 {
            // The polling wait ended: it may have waited for a collective.
            coll_waited(tgid, api::STREAM_SYNC, call.stream, &key, spun);
        }
        if rc == 0 || rc == api::NOT_READY {
            return 0;
        }
    } else {
        account(&key, bytes, ns, rc != 0);
    }
    // Copy -> sync pairs, in the kernel too: the detector's main pattern
    // stays exact when per-call events are lost.
    if api::is_copy(call.api) {
        let pending = api::is_async_copy(call.api);
        // SAFETY: map value owned by this thread.
        unsafe {
            (*slot).last_copy_active = pending as u32;
            if pending {
                (*slot).last_copy = key;
                (*slot).last_copy_stream = call.stream;
            }
        }
    } else if api::is_event_record(call.api) {
        if rc == 0 {
            // SAFETY: map value owned by this thread.
            unsafe { record_event(&mut *slot, &call, tgid) };
            coll_follow(tgid, call.dst, call.stream, true);
        }
    } else if api::is_stream_wait_event(call.api) {
        if rc == 0 {
            // The stream's later work waits for the event's collective.
            coll_follow(tgid, call.stream, call.dst, false);
        }
    } else if api::is_collective(call.api) {
        // ncclSuccess, or ncclInProgress (7) on a non-blocking communicator.
        if rc == 0 || rc == 7 {
            coll_queued(tgid, call.stream, &key);
        }
    } else if api::is_sync(call.api) {
        if rc == 0 {
            coll_waited(tgid, api::canonical(call.api), call.stream, &key, ns);
        }
        let event_copy = if api::canonical(call.api) == api::EVENT_SYNC { event_copy(tgid, call.stream) } else { None };
        if let Some(copy) = event_copy {
            // The event was recorded behind a copy: this sync waited for it.
            add_pair(&copy, ns);
            add_pair(&key, ns);
        }
        if call.last_copy_active != 0 {
            unsafe { (*slot).last_copy_active = 0 };
            let covers = match api::canonical(call.api) {
                api::DEVICE_SYNC => true,
                api::STREAM_SYNC | api::STREAM_SYNC_PTSZ => call.stream == call.last_copy_stream,
                _ => false,
            };
            if covers && event_copy.is_none() {
                add_pair(&call.last_copy, ns);
                add_pair(&key, ns);
            }
        }
    }
    if global(&CUDA_EVENTS_ENABLED) == 0 {
        return 0;
    }
    let returns = api::returns_pointer(call.api) || api::is_capture_end(call.api) || api::is_instantiate(call.api) || api::returns_handle(call.api);
    let dst = if returns {
        if rc == 0 { read_user_u64(call.dst, "the pointer returned") } else { 0 }
    } else {
        call.dst
    };
    if api::is_kernel_lookup(call.api) && dst != 0 {
        send_name(tgid, dst, call.src);
    }
    let capture_end = api::is_capture_end(call.api);
    let Some(mut entry) = CUDA_EVENTS.reserve::<CudaEvent>(0) else {
        count_drop(counters::CUDA_EVENTS_LOST);
        return 0;
    };
    entry.write(CudaEvent {
        pid: tgid,
        tid,
        api: call.api,
        kind: key.kind,
        rc,
        user_stack: call.user_stack,
        start_ns: call.start_ns,
        dur_ns: ns,
        bytes: if capture_end { captured.copy_bytes } else { call.bytes },
        dst,
        src: if capture_end { captured.launches } else { call.src },
        stream: call.stream,
        fingerprint: if capture_end { captured.copies } else { call.fingerprint },
        py_stack: call.py_stack,
        caller: call.caller,
    });
    entry.submit(0);
    0
}

/// Sends kernel handle `handle` of process `tgid` and the name at `name`
/// (user memory; cut at `NAME_BYTES`) through `CUDA_NAMES`.
#[inline(never)]
fn send_name(tgid: u32, handle: u64, name: u64) {
    let Some(mut entry) = CUDA_NAMES.reserve::<CudaName>(0) else {
        count_drop(counters::CUDA_NAMES_LOST);
        return;
    };
    let p = entry.as_mut_ptr();
    // SAFETY: the reserved entry, written field by field before submit.
    unsafe {
        (*p).pid = tgid;
        (*p).handle = handle;
        let len = aya_ebpf::helpers::generated::bpf_probe_read_user_str(
            (*p).name.as_mut_ptr().cast(),
            tracer_common::cuda::NAME_BYTES as u32,
            name as *const core::ffi::c_void,
        );
        (*p).len = if len > 0 { len as u32 } else { 0 };
    }
    entry.submit(0);
}

/// `cudaEventRecord(event, stream)` returned 0 on this thread (`slot`):
/// the thread's pending async copy, when it is on the event's stream,
/// passes to the event (its sync now waits for it); otherwise the event
/// covers no copy (it may have covered one before).
#[inline(never)]
fn record_event(slot: &mut CudaInflight, call: &CudaInflight, tgid: u32) {
    let ek = EventKey { pid: tgid, _pad: 0, event: call.dst };
    if call.last_copy_active != 0 && call.stream == call.last_copy_stream {
        slot.last_copy_active = 0;
        if CUDA_EVENT_COPY.insert(&ek, &call.last_copy, 0).is_err() {
            count_drop(counters::CUDA_LOST);
        }
    } else {
        let _ = CUDA_EVENT_COPY.remove(&ek);
    }
}

/// The copy event `event` of process `tgid` was recorded behind, taken
/// (a second synchronize of the event does not wait for it again).
#[inline(never)]
fn event_copy(tgid: u32, event: u64) -> Option<CudaKey> {
    let ek = EventKey { pid: tgid, _pad: 0, event };
    let copy = unsafe { CUDA_EVENT_COPY.get(&ek) }.copied()?;
    let _ = CUDA_EVENT_COPY.remove(&ek);
    Some(copy)
}

/// A query answered `rc` on this thread (`slot`): a not-ready answer
/// starts (or continues) a wait; a ready one ends it. Returns the wall
/// time of the wait it ended, else 0.
#[inline(never)]
fn poll_wait(slot: &mut CudaInflight, rc: i32, start_ns: u64, now: u64) -> u64 {
    if rc == api::NOT_READY {
        if slot.poll_start == 0 {
            slot.poll_start = start_ns;
        }
        return 0;
    }
    let started = slot.poll_start;
    slot.poll_start = 0;
    if rc == 0 && started != 0 { now.saturating_sub(started) } else { 0 }
}

/// One query (`cudaEventQuery`, `cudaStreamQuery`): not-ready answers are
/// polls, counted apart from errors; `spun`: the wall time of the wait
/// this answer ended (0: none).
#[inline(always)]
fn account_query(key: &CudaKey, ns: u64, rc: i32, spun: u64) {
    let poll = rc == api::NOT_READY;
    let error = rc != 0 && !poll;
    let waits = (spun != 0) as u64;
    match CUDA_STATS.get_ptr_mut(key) {
        // SAFETY: per-thread key: this thread is the only writer.
        Some(p) => unsafe {
            (*p).count += 1;
            (*p).total_ns += ns;
            (*p).errors += error as u64;
            (*p).not_ready += poll as u64;
            (*p).poll_waits += waits;
            (*p).poll_ns += spun;
        },
        None => {
            let fresh = CudaStats {
                count: 1,
                bytes: 0,
                total_ns: ns,
                errors: error as u64,
                sync_pairs: 0,
                sync_pair_ns: 0,
                not_ready: poll as u64,
                poll_waits: waits,
                poll_ns: spun,
                coll_waits: 0,
                coll_wait_ns: 0,
            };
            if CUDA_STATS.insert(key, &fresh, 0).is_err() {
                count_drop(counters::CUDA_LOST);
            }
        }
    }
}

/// Whether `call` is a copy or memset made while thread `tid` captures:
/// recorded into the graph, not run, so counted into the capture, not as
/// a copy (nor a memset).
#[inline(always)]
fn captured_copy(call: &CudaInflight, tid: u32) -> bool {
    if !api::is_copy(call.api) && !api::is_memset(call.api) {
        return false;
    }
    let Some(c) = CUDA_CAPTURE.get_ptr_mut(&tid) else { return false };
    // SAFETY: per-thread key: this thread is the only writer.
    unsafe {
        (*c).copies += 1;
        (*c).copy_bytes += call.bytes;
    }
    true
}

/// A capture begun (successfully: `rc` 0) or ended on thread `tid`; for an
/// end, what the capture recorded (zero when none was in progress).
#[inline(always)]
fn graph_setup(a: u32, stream: u64, tid: u32, rc: i32) -> CudaCapture {
    let mut out = CudaCapture { stream: 0, launches: 0, copies: 0, copy_bytes: 0 };
    if api::is_capture_begin(a) {
        if rc == 0 {
            let fresh = CudaCapture { stream, launches: 0, copies: 0, copy_bytes: 0 };
            if CUDA_CAPTURE.insert(&tid, &fresh, 0).is_err() {
                count_drop(counters::CUDA_LOST);
            }
        }
    } else if api::is_capture_end(a) {
        if let Some(c) = unsafe { CUDA_CAPTURE.get(&tid) } {
            out = *c;
        }
        let _ = CUDA_CAPTURE.remove(&tid);
    }
    out
}

#[inline(always)]
fn account(key: &CudaKey, bytes: u64, ns: u64, error: bool) {
    // Per-thread keys: this thread is the only writer.
    match CUDA_STATS.get_ptr_mut(key) {
        Some(p) => unsafe {
            (*p).count += 1;
            (*p).bytes += bytes;
            (*p).total_ns += ns;
            (*p).errors += error as u64;
        },
        None => {
            let fresh = CudaStats { count: 1, bytes, total_ns: ns, errors: error as u64, sync_pairs: 0, sync_pair_ns: 0, not_ready: 0, poll_waits: 0, poll_ns: 0, coll_waits: 0, coll_wait_ns: 0 };
            if CUDA_STATS.insert(key, &fresh, 0).is_err() {
                count_drop(counters::CUDA_LOST);
            }
        }
    }
}

/// One copy -> sync pair on `key`'s aggregate (the copy's or the sync's,
/// accounted already on this thread: the entry exists unless its map was
/// full, which `account` counted).
#[inline(always)]
fn add_pair(key: &CudaKey, ns: u64) {
    if let Some(p) = CUDA_STATS.get_ptr_mut(key) {
        // SAFETY: per-thread key: this thread is the only writer.
        unsafe {
            (*p).sync_pairs += 1;
            (*p).sync_pair_ns += ns;
        }
    }
}

/// What a process's first collective inserts into `CUDA_COLL_EPOCH` (from
/// global data, not the stack).
static COLL_ZERO: CollPending = unsafe { core::mem::zeroed() };

/// A collective (`key`) of process `tgid` returned having queued its work
/// on `stream`: the stream, and the process's device-wide syncs, now wait
/// for it.
#[inline(never)]
fn coll_queued(tgid: u32, stream: u64, key: &CudaKey) {
    if CUDA_COLL_EPOCH.get_ptr_mut(&tgid).is_none() && CUDA_COLL_EPOCH.insert(&tgid, &COLL_ZERO, 0).is_err() {
        count_drop(counters::CUDA_LOST);
        return;
    }
    let Some(e) = CUDA_COLL_EPOCH.get_ptr_mut(&tgid) else { return };
    // SAFETY: a map value; threads of one process share it: a race makes
    // at worst one wait unattributed (the key is rewritten whole below).
    unsafe {
        (*e).live = 1;
        (*e).key = *key;
    }
    let ek = EventKey { pid: tgid, _pad: 0, event: stream };
    // The stream's entry: the process's entry as it is now (epoch, key).
    // SAFETY: a map value, passed by reference to the helper.
    if CUDA_COLL_PENDING.insert(&ek, unsafe { &*e }, 0).is_err() {
        count_drop(counters::CUDA_LOST);
    }
}

/// The collective pending on `from` (a stream or event of process
/// `tgid`), if it is still to be waited on: set in this epoch, not
/// covered by a device-wide sync since.
#[inline(always)]
fn coll_pending(tgid: u32, from: u64) -> Option<*mut CollPending> {
    let e = CUDA_COLL_EPOCH.get_ptr_mut(&tgid)?;
    let p = CUDA_COLL_PENDING.get_ptr_mut(&EventKey { pid: tgid, _pad: 0, event: from })?;
    // SAFETY: map values.
    if unsafe { (*p).epoch != (*e).epoch } {
        return None;
    }
    Some(p)
}

/// `to` (an event recorded on stream `from`, or a stream made to wait on
/// event `from`) now waits for what `from` waits for: its pending
/// collective. When `from` has none, an event (`forget`) forgets the one
/// it was recorded behind before; a stream keeps its own.
#[inline(never)]
fn coll_follow(tgid: u32, to: u64, from: u64, forget: bool) {
    if unsafe { CUDA_COLL_EPOCH.get(&tgid) }.is_none() {
        return;
    }
    let to_key = EventKey { pid: tgid, _pad: 0, event: to };
    match coll_pending(tgid, from) {
        Some(p) => {
            // SAFETY: a map value, passed by reference to the helper.
            if CUDA_COLL_PENDING.insert(&to_key, unsafe { &*p }, 0).is_err() {
                count_drop(counters::CUDA_LOST);
            }
        }
        None if forget => {
            let _ = CUDA_COLL_PENDING.remove(&to_key);
        }
        None => {}
    }
}

/// A sync of process `tgid` (`sync`: the canonical API; `handle`: its
/// stream or event; a query that ended a polling wait passes
/// `STREAM_SYNC`, its stream or event being a key alike) returned after
/// `ns`: when a collective was pending on what it waited for, the wait is
/// counted on the sync's aggregate (`key`) and the collective's, and the
/// collective is taken (a second sync does not wait for it again).
#[inline(never)]
fn coll_waited(tgid: u32, sync: u32, handle: u64, key: &CudaKey, ns: u64) {
    let Some(e) = CUDA_COLL_EPOCH.get_ptr_mut(&tgid) else { return };
    if sync == api::DEVICE_SYNC {
        // SAFETY: a map value (see `coll_queued`).
        unsafe {
            if (*e).live != 0 {
                add_coll(&(*e).key, ns);
                add_coll(key, ns);
            }
            (*e).live = 0;
            (*e).epoch += 1;
        }
        return;
    }
    let Some(p) = coll_pending(tgid, handle) else { return };
    // SAFETY: a map value.
    unsafe { add_coll(&(*p).key, ns) };
    add_coll(key, ns);
    let _ = CUDA_COLL_PENDING.remove(&EventKey { pid: tgid, _pad: 0, event: handle });
}

/// One wait on a collective on `key`'s aggregate (the sync's, or the
/// collective's: another thread's key when it queued the collective; an
/// increment lost to a race is one wait unattributed).
#[inline(always)]
fn add_coll(key: &CudaKey, ns: u64) {
    if let Some(p) = CUDA_STATS.get_ptr_mut(key) {
        // SAFETY: a map value.
        unsafe {
            (*p).coll_waits += 1;
            (*p).coll_wait_ns += ns;
        }
    }
}
