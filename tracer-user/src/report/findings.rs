//! The words of the findings: the sentence that describes a CUDA finding
//! (`message`) or what an event loop's line was doing (`doing`), and the
//! advice, written from the kind and numbers the recording stores
//! (`crate::recording::cuda::Finding`, `crate::recording::asyncio::AsyncFinding`).
//! Recordings of format 1 carry these words as written at record time:
//! those are shown as they are.

use std::borrow::Cow;

use super::fmt::{fmt_bytes, fmt_duration, fmt_ns};
use crate::recording::{
    asyncio::{AsyncFinding, AsyncioReport, StepActivity},
    cuda::Finding,
};

const ADVICE_SMALL: &str = "Batch these inputs: collate them into one tensor on the CPU (torch.stack/torch.cat, or the DataLoader's collate_fn) and copy once per batch, or create them directly on the GPU (torch.tensor(..., device='cuda')). From pinned memory (pin_memory=True) with .to(device, non_blocking=True) the copy also overlaps compute.";
const ADVICE_SYNC: &str = "Copy from pinned memory with non_blocking=True (DataLoader(pin_memory=True), tensor.pin_memory()) and do not synchronize after each copy: the stream already orders the copy before the kernels that use it. Synchronize (or wait on a torch.cuda.Event) only where the host needs the result.";
const ADVICE_PAGEABLE: &str = "Use pinned host memory: DataLoader(pin_memory=True), tensor.pin_memory() once for buffers that are reused, or torch.empty(..., pin_memory=True); then .to(device, non_blocking=True). Pageable copies are staged by the driver and block the CPU even through cudaMemcpyAsync.";
const ADVICE_TINY: &str = "Avoid .item()/.cpu()/float(t)/bool(t) on GPU tensors inside the loop: each one waits for the GPU to drain. Accumulate on the device (total += loss.detach()) and fetch once after the loop or every N steps; replace Python branches on GPU values with torch.where or masking.";
const ADVICE_REPEATED: &str = "This data does not change between calls: move it to the GPU once, outside the loop (create it with device='cuda', register it as a module buffer, or cache the device tensor), and reuse the device copy.";
const ADVICE_SHARE: &str = "Overlap transfers with compute and remove waits: pinned memory with non_blocking=True, prefetch the next batch on a side stream, keep tensors on the GPU between steps, and take .item()/.cpu()/torch.cuda.synchronize() out of the hot loop.";
const ADVICE_RECAPTURED: &str = "Capture the graph once, outside the loop, and replay it (torch.cuda.CUDAGraph.replay(), or keep the torch.compile(mode=\"reduce-overhead\") function and its input shapes stable): copy new inputs into the captured static tensors instead of capturing again.";
const ADVICE_LEAK: &str = "Free what this line allocates (cudaFree), or in PyTorch drop the references that keep device tensors alive (e.g. a list of outputs or losses that also keeps the autograd graph: store loss.item() or .detach()). Watch torch.cuda.memory_allocated() over time to confirm.";

const ADVICE_POLLING: &str = "Wait instead of spinning: cudaEventSynchronize / torch.cuda.Event.synchronize() or stream.synchronize() (with the event created blocking, cudaEventBlockingSync / torch.cuda.Event(blocking=True), the thread sleeps instead of burning a CPU), or do useful host work between the queries (event.query() once per step, not in a tight loop).";

const ADVICE_NEAR_CAPACITY: &str = "The next allocation may fail with out-of-memory: hold less on the device (a smaller batch or sequence length, activation checkpointing, a smaller dtype, freeing tensors kept by reference), let the caching allocator fragment less (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), check what else uses the GPU (nvidia-smi), or use a bigger one; torch.cuda.empty_cache() only returns the cache.";
const ADVICE_LAUNCH_BOUND: &str = "Launch fewer, bigger kernels: capture the step in a CUDA graph and replay it (torch.cuda.CUDAGraph, torch.compile(mode=\"reduce-overhead\")) so one launch runs them all, or fuse the small ops (torch.compile; fused or foreach optimizers, optim.AdamW(fused=True)); larger batches amortize each launch.";
const ADVICE_GPU_GROWTH: &str = "Something keeps device memory it allocates: tensors held in a list for logging or metrics (store .item() or .detach().cpu() instead), a growing cache, a computation graph kept alive by a loss summed across steps (accumulate loss.item()); at this rate the device runs out: compare torch.cuda.memory_allocated() over steps and look at what the line shown keeps.";

const ADVICE_LOOP_CPU: &str =
    "move the CPU work to a process pool (loop.run_in_executor with a ProcessPoolExecutor), or split it with awaits";
const ADVICE_LOOP_BLOCKING: &str = "move the blocking call to a thread (await asyncio.to_thread(...) / loop.run_in_executor) or await an async version (asyncio.sleep, an async client)";
const ADVICE_EXECUTOR: &str = "the loop waits on run_in_executor/to_thread work: give the executor more workers (or a process pool for CPU-bound work), or run the blocking work concurrently";

/// What a CUDA finding's sentence adds when some of its copies failed.
fn failed(copies: u64, errors: u64) -> String {
    if errors == 0 {
        String::new()
    } else if errors == copies {
        " (every one of these calls failed)".to_owned()
    } else {
        format!(" ({errors} of these calls failed)")
    }
}

/// The direction of copies of `copy_kind` (`HtoD`, `DtoH`) in sentences.
fn direction(copy_kind: Option<&str>) -> &str {
    match copy_kind {
        Some("HtoD") => "host-to-device",
        Some("DtoH") => "device-to-host",
        Some(other) => other,
        None => "host/device",
    }
}

/// The sentence of a CUDA finding: the recorded one (format 1), else
/// written from its numbers.
pub fn cuda_message(f: &Finding) -> Cow<'_, str> {
    if let Some(m) = &f.message {
        return Cow::Borrowed(m);
    }
    let copies = f.copies.unwrap_or(f.count);
    let failed = failed(copies, f.errors.unwrap_or(0));
    let dir = direction(f.copy_kind.as_deref());
    Cow::Owned(match f.kind.as_str() {
        "repeated_upload" => format!(
            "the same {} of host data was uploaded {} times from this line ({} of {copies} host-to-device copies here){failed}",
            fmt_bytes(f.bytes / f.count.max(1)),
            f.count,
            f.count
        ),
        "small_htod_copies" => format!(
            "{} small host-to-device copies from this line, {} on average ({} in all){failed}",
            f.count,
            fmt_bytes(f.bytes / f.count.max(1)),
            fmt_bytes(f.bytes)
        ),
        "tiny_dtoh_sync" => format!(
            "{} tiny device-to-host copies ({} each at most) from this line each waited for the GPU: a .item()/.cpu() in a loop{failed}",
            f.count,
            fmt_bytes(f.max_bytes.unwrap_or(0))
        ),
        "sync_after_copy" => format!(
            "{} {dir} copies from this line were each followed by a synchronize of their stream on the same thread: the CPU waits for every transfer{failed}",
            f.count
        ),
        "pageable_copy" => format!(
            "{} {dir} copies ({}) from this line used pageable host memory{}{failed}",
            f.count,
            fmt_bytes(f.bytes),
            if f.time_ns > 0 && f.bytes > 0 && f.errors.unwrap_or(0) == 0 {
                format!(", at {:.2} GB/s", f.bytes as f64 / f.time_ns as f64)
            } else {
                String::new()
            }
        ),
        "device_memory_leak" => format!(
            "{} of {} device allocations ({}) from this line were never freed, and it was still allocating in the second half of the window",
            f.count,
            f.allocs.unwrap_or(f.count),
            fmt_bytes(f.bytes)
        ),
        "graph_recaptured" => format!(
            "a CUDA graph was captured {} times from this line ({} in capturing): the graph is rebuilt instead of replayed",
            f.count,
            fmt_ns(f.time_ns)
        ),
        "launch_bound" => format!(
            "{} kernel launches from this line ({} kernels, {:.0}/s): many small kernels issued one by one, the GPU likely waits for the CPU between them (~{} of launch overhead at ~{} each)",
            f.count,
            f.kernels.unwrap_or(0),
            f.per_s.unwrap_or(0.0),
            fmt_ns(f.time_ns),
            fmt_ns(f.time_ns / f.count.max(1))
        ),
        "sync_polling" => {
            let waits = f.waits.unwrap_or(0);
            let per_wait = f.count.checked_div(waits).map_or(String::new(), |n| format!(" ({n} per wait)"));
            format!(
                "{} queries from this line found the GPU work not done{per_wait}: the thread spun {} polling in {waits} waits{failed}",
                f.count,
                fmt_ns(f.time_ns)
            )
        }
        "gpu_memory_near_capacity" => {
            let total = f.capacity_bytes.unwrap_or(0);
            let held = if f.site.line.is_some() || !f.site.function.is_empty() { "; the line shown held the most device memory of the traced processes" } else { "" };
            format!(
                "GPU {} had {} of its {} memory in use ({:.0}%), in {} NVML samples at or above 90%{held}",
                f.gpu.unwrap_or(0),
                fmt_bytes(f.bytes),
                fmt_bytes(total),
                100.0 * f.bytes as f64 / total.max(1) as f64,
                f.count
            )
        }
        "gpu_memory_growth" => format!(
            "GPU memory held grew steadily by {} over {} ({}/s); the line shown holds the most of it at the end ({} allocations)",
            fmt_bytes(f.bytes),
            fmt_ns(f.time_ns),
            fmt_bytes(f.per_s.unwrap_or(0.0).max(0.0) as u64),
            f.count
        ),
        "copy_time_share" => {
            let window_ns = f.window_ns.unwrap_or(0);
            format!(
                "host/device copies and synchronizations took {:.0}% of the wall time ({} of {}); this line alone {}",
                f.time_ns as f64 / window_ns.max(1) as f64 * 100.0,
                fmt_ns(f.time_ns),
                fmt_ns(window_ns),
                fmt_ns(f.site_time_ns.unwrap_or(0))
            )
        }
        _ => String::new(),
    })
}

/// What to do about a CUDA finding: the recorded advice (format 1), else
/// the kind's.
pub fn cuda_advice(f: &Finding) -> &str {
    if let Some(a) = &f.advice {
        return a;
    }
    match f.kind.as_str() {
        "small_htod_copies" => ADVICE_SMALL,
        "sync_after_copy" => ADVICE_SYNC,
        "pageable_copy" => ADVICE_PAGEABLE,
        "tiny_dtoh_sync" => ADVICE_TINY,
        "repeated_upload" => ADVICE_REPEATED,
        "copy_time_share" => ADVICE_SHARE,
        "device_memory_leak" => ADVICE_LEAK,
        "graph_recaptured" => ADVICE_RECAPTURED,
        "sync_polling" => ADVICE_POLLING,
        "launch_bound" => ADVICE_LAUNCH_BOUND,
        "gpu_memory_near_capacity" => ADVICE_NEAR_CAPACITY,
        "gpu_memory_growth" => ADVICE_GPU_GROWTH,
        _ => "",
    }
}

/// What an event loop's line was doing: the recorded words (format 1),
/// else written from the finding's numbers (`blocking syscall
/// clock_nanosleep`, `CPU`, the executor's share).
pub fn async_doing(f: &AsyncFinding) -> Cow<'_, str> {
    if let Some(d) = &f.doing {
        return Cow::Borrowed(d);
    }
    Cow::Owned(match f.kind.as_str() {
        "executor_serialized" => format!(
            "awaiting a thread-pool future ({} of task time) while the loop was idle {:.0}% of the time",
            fmt_duration(f.max_ns),
            100.0 * f.loop_idle_ns.unwrap_or(0) as f64 / f.loop_wall_ns.unwrap_or(0) as f64
        ),
        _ => match (f.step, &f.syscall) {
            (Some(StepActivity::Cpu), _) => "CPU".to_owned(),
            (Some(StepActivity::Syscall), Some(name)) => format!("blocking syscall {name}"),
            (Some(StepActivity::Syscall), None) => "blocking syscall".to_owned(),
            (None, _) => String::new(),
        },
    })
}

/// What to do about an event loop finding: the recorded advice (format 1),
/// else the kind's (for a blocked loop, by what the step did).
pub fn async_advice(f: &AsyncFinding) -> &str {
    if let Some(a) = &f.advice {
        return a;
    }
    match (f.kind.as_str(), f.step) {
        ("executor_serialized", _) => ADVICE_EXECUTOR,
        ("blocked_event_loop", Some(StepActivity::Cpu)) => ADVICE_LOOP_CPU,
        ("blocked_event_loop", Some(StepActivity::Syscall)) => ADVICE_LOOP_BLOCKING,
        _ => "",
    }
}

/// The CUDA findings with their sentence and advice written in (as format
/// 1 stored them): what the JSON report shows.
pub fn cuda_worded(findings: &[Finding]) -> Vec<Finding> {
    findings
        .iter()
        .map(|f| Finding { message: Some(cuda_message(f).into_owned()), advice: Some(cuda_advice(f).to_owned()), ..f.clone() })
        .collect()
}

/// The asyncio report with its findings' words written in (as format 1
/// stored them): what the JSON report shows.
pub fn async_worded(r: &AsyncioReport) -> AsyncioReport {
    let findings = r
        .findings
        .iter()
        .map(|f| AsyncFinding { doing: Some(async_doing(f).into_owned()), advice: Some(async_advice(f).to_owned()), ..f.clone() })
        .collect();
    AsyncioReport { findings, ..r.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::asyncio::AsyncLine;

    #[test]
    fn recorded_words_are_kept() {
        let f = Finding {
            kind: "small_htod_copies".into(),
            count: 64,
            bytes: 64 * 4096,
            message: Some("as recorded".into()),
            advice: Some("recorded advice".into()),
            ..Default::default()
        };
        assert_eq!((cuda_message(&f).as_ref(), cuda_advice(&f)), ("as recorded", "recorded advice"));
        let words = cuda_worded(std::slice::from_ref(&f));
        assert_eq!(words[0], f);
        let f = Finding { message: None, advice: None, copies: Some(64), errors: Some(64), ..f };
        assert_eq!(
            cuda_message(&f),
            "64 small host-to-device copies from this line, 4.0 KiB on average (256.0 KiB in all) (every one of these calls failed)"
        );
        assert_eq!(cuda_advice(&f), ADVICE_SMALL);
    }

    #[test]
    fn event_loop_words() {
        let f = |kind: &str| AsyncFinding { kind: kind.into(), at: AsyncLine { function: "handle".into(), file: None, line: None }, ..Default::default() };
        let blocked = AsyncFinding { step: Some(StepActivity::Syscall), syscall: Some("clock_nanosleep".into()), ..f("blocked_event_loop") };
        assert_eq!((async_doing(&blocked).as_ref(), async_advice(&blocked)), ("blocking syscall clock_nanosleep", ADVICE_LOOP_BLOCKING));
        let unnamed = AsyncFinding { syscall: None, ..blocked.clone() };
        assert_eq!(async_doing(&unnamed), "blocking syscall");
        let cpu = AsyncFinding { step: Some(StepActivity::Cpu), ..f("blocked_event_loop") };
        assert_eq!((async_doing(&cpu).as_ref(), async_advice(&cpu)), ("CPU", ADVICE_LOOP_CPU));
        let exec = AsyncFinding { max_ns: 1_500_000_000, loop_idle_ns: Some(900), loop_wall_ns: Some(1000), ..f("executor_serialized") };
        assert_eq!(
            async_doing(&exec),
            "awaiting a thread-pool future (1.500 s of task time) while the loop was idle 90% of the time"
        );
        assert_eq!(async_advice(&exec), ADVICE_EXECUTOR);
        let old = AsyncFinding { doing: Some("CPU".into()), advice: Some("old".into()), ..f("blocked_event_loop") };
        assert_eq!((async_doing(&old).as_ref(), async_advice(&old)), ("CPU", "old"));
    }
}
