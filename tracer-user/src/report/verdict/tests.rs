//! Unit tests of the verdict on crafted recordings (the e2e tests in
//! tests/tests/verdict.rs check it on real workloads).

use super::*;
use crate::recording::{
    cuda::{CudaCall, CudaReport, Finding, Site},
    OffCpuTimes,
};

fn py(function: &str, file: &str, line: u32) -> Frame {
    Frame { function: function.into(), file: Some(file.into()), line: Some(line), kind: FrameKind::Python, module: None }
}

fn native(function: &str, module: &str) -> Frame {
    Frame { function: function.into(), file: None, line: None, kind: FrameKind::Native, module: Some(module.into()) }
}

fn stack(kind: StackKind, reason: Option<OffCpuReason>, tid: u32, samples: u64, weight_ns: u64, frames: Vec<Frame>) -> StackRecord {
    StackRecord { kind, reason, pid: 10, tid, samples, weight_ns, syscall: None, frames }
}

fn thread(tid: u32, on_cpu_ns: u64, off_cpu: OffCpuTimes, runqueue_ns: u64) -> ThreadTimes {
    let wall_ns = on_cpu_ns + off_cpu.total() + runqueue_ns;
    ThreadTimes { pid: 10, tid, comm: format!("t{tid}"), wall_ns, on_cpu_ns, off_cpu, runqueue_ns, ..Default::default() }
}

fn rec() -> Recording {
    let mut r = crate::recording::tests::sample();
    r.sample_hz = 99;
    r
}

const MS: u64 = 1_000_000;

#[test]
fn queue_consumer_is_waiting_on_other_threads_at_its_q_get_line() {
    let mut r = rec();
    let lock = OffCpuTimes { lock_ns: 950 * MS, ..Default::default() };
    let sleep = OffCpuTimes { sleep_ns: 950 * MS, ..Default::default() };
    r.threads = vec![thread(10, 50 * MS, lock, 0), thread(11, 50 * MS, lock, 0), thread(12, 50 * MS, sleep, 0)];
    let wait = vec![
        py("Condition.wait", "/usr/lib/python3.11/threading.py", 327),
        py("Queue.get", "/usr/lib/python3.11/queue.py", 171),
        py("consume", "/srv/app.py", 20),
    ];
    r.stacks = vec![
        stack(StackKind::OffCpu, Some(OffCpuReason::Lock), 10, 0, 800 * MS, wait.clone()),
        stack(StackKind::OffCpu, Some(OffCpuReason::Lock), 11, 0, 800 * MS, wait),
        stack(StackKind::OffCpu, Some(OffCpuReason::Sleep), 12, 0, 900 * MS, vec![py("produce", "/srv/app.py", 9)]),
        stack(StackKind::Cpu, None, 10, 5, 0, vec![py("consume", "/srv/app.py", 21)]),
    ];
    let v = verdict(&r);
    let p = &v.processes[0];
    assert_eq!(p.wall_ns, 3000 * MS);
    let b = p.bottleneck.as_ref().unwrap();
    assert_eq!(b.class, Class::WaitingOnThreads);
    assert!(b.too_close_with.is_empty(), "{b:?}");
    assert!((b.share - 1900.0 / 3000.0).abs() < 1e-9, "{}", b.share);
    let site = b.site.as_ref().unwrap();
    assert_eq!((site.site.function.as_str(), site.site.line), ("consume", Some(20)));
    assert_eq!(site.beneath.as_ref().unwrap().line, Some(327));
    // The parts add up to the wall time.
    assert_eq!(p.classes.iter().map(|c| c.time_ns).sum::<u64>(), p.wall_ns);
    assert_eq!(p.threads.len(), 3);
    assert_eq!(p.threads.iter().find(|t| t.tid == 12).unwrap().bottleneck.as_ref().unwrap().class, Class::Sleeping);
    let mut text = String::new();
    render_text(&v, &mut text);
    assert!(text.contains("bottleneck waiting on other threads 63.3% at consume (app.py:20) <- Condition.wait (threading.py:327)"), "{text}");
    assert!(text.contains("thread 12 t12: sleeping"), "{text}");
}

#[test]
fn close_classes_are_too_close_to_call() {
    let mut r = rec();
    r.threads = vec![
        thread(10, 0, OffCpuTimes { io_ns: 510 * MS, ..Default::default() }, 0),
        thread(11, 0, OffCpuTimes { sleep_ns: 490 * MS, ..Default::default() }, 0),
    ];
    let v = verdict(&r);
    let b = v.processes[0].bottleneck.as_ref().unwrap();
    assert_eq!((b.class, b.too_close_with.as_slice()), (Class::Io, &[Class::Sleeping][..]));
    let mut text = String::new();
    render_text(&v, &mut text);
    assert!(text.contains("too close to call: I/O 51.0% / sleeping 49.0%"), "{text}");
}

#[test]
fn samples_split_on_cpu_time_between_python_native_and_gpu() {
    let mut r = rec();
    r.threads = vec![thread(10, 1000 * MS, OffCpuTimes { sleep_ns: 1000 * MS, ..Default::default() }, 0)];
    let line = py("step", "/srv/train.py", 30);
    r.stacks = vec![
        stack(StackKind::Cpu, None, 10, 60, 0, vec![native("_PyEval_EvalFrameDefault", "libpython3.11.so.1.0"), line.clone()]),
        stack(StackKind::Cpu, None, 10, 40, 0, vec![native("[unknown]", "libonnxruntime.so"), py("run", "/srv/train.py", 31)]),
        // Blocked in the sync at line 40 (the CUDA call table says so).
        stack(StackKind::OffCpu, Some(OffCpuReason::Sleep), 10, 0, 700 * MS, vec![py("step", "/srv/train.py", 40)]),
        stack(StackKind::OffCpu, Some(OffCpuReason::Sleep), 10, 0, 300 * MS, vec![py("step", "/srv/train.py", 45)]),
    ];
    let site = Site { function: "step".into(), file: Some("/srv/train.py".into()), line: Some(40) };
    r.cuda = Some(CudaReport {
        calls: vec![CudaCall {
            pid: 10,
            api: "cudaStreamSynchronize".into(),
            kind: None,
            class: None,
            count: 10,
            bytes: 0,
            total_ns: 700 * MS,
            errors: 0,
            site: site.clone(),
            return_codes: Default::default(),
            pinned: None,
            pageable: None,
            events_lost: 0,
            not_ready: None,
            poll_waits: None,
            poll_ns: None,
            collective_waits: None,
            collective_wait_ns: None,
        }],
        findings: vec![Finding {
            kind: "tiny_dtoh_sync".into(),
            severity: "high".into(),
            pid: 10,
            site,
            count: 10,
            bytes: 40,
            time_ns: 700 * MS,
            message: Some("m".into()),
            advice: Some("keep it on the GPU".into()),
            ..Default::default()
        }],
        ..Default::default()
    });
    let v = verdict(&r);
    let p = &v.processes[0];
    let of = |c: Class| p.classes.iter().find(|s| s.class == c).map(|s| s.time_ns).unwrap_or(0);
    assert_eq!((of(Class::PythonCompute), of(Class::NativeCompute)), (600 * MS, 400 * MS));
    assert_eq!((of(Class::GpuSync), of(Class::Sleeping)), (700 * MS, 300 * MS));
    let nc = p.classes.iter().find(|s| s.class == Class::NativeCompute).unwrap();
    assert_eq!(nc.libraries[0].library, "libonnxruntime.so");
    let b = p.bottleneck.as_ref().unwrap();
    assert_eq!((b.class, b.site.as_ref().unwrap().site.line), (Class::GpuSync, Some(40)));
    assert_eq!(b.findings[0].kind, "tiny_dtoh_sync");
    let mut text = String::new();
    render_text(&v, &mut text);
    assert!(text.contains("CUDA finding tiny_dtoh_sync (high) at step (/srv/train.py:40): keep it on the GPU"), "{text}");
    assert!(text.contains("native compute 20.0% [libonnxruntime.so]"), "{text}");
    // A pool thread's row names its library (a thread without Python frames: native_pool).
    r.threads.push(thread(11, 990 * MS, OffCpuTimes { lock_ns: 10 * MS, ..Default::default() }, 0));
    r.stacks.push(stack(StackKind::Cpu, None, 11, 100, 0, vec![native("[unknown]", "libonnxruntime_pybind11_state.so")]));
    let mut text = String::new();
    render_text(&verdict(&r), &mut text);
    assert!(text.contains("thread 11 t11: native worker pool 99.0% [libonnxruntime_pybind11_state.so]"), "{text}");
}

#[test]
fn no_scheduler_data_says_so() {
    let v = verdict(&crate::recording::tests::sample());
    assert!(v.processes.is_empty());
    assert!(v.notes[0].contains("--no-sched"), "{:?}", v.notes);
}

/// A Python serving thread (sess.run, then sleeps) and an onnxruntime pool
/// thread without Python frames, spinning: the pool's CPU is `native_pool`
/// per library, charged to the serving line, and busy-waiting; a pool
/// thread that blocks between requests is not.
#[test]
fn native_pool_thread_is_its_own_class_charged_to_the_feeding_line() {
    const ORT: &str = "onnxruntime_pybind11_state.so";
    let mut r = rec();
    let serve_sleep = OffCpuTimes { sleep_ns: 400 * MS, ..Default::default() };
    r.threads = vec![thread(10, 600 * MS, serve_sleep, 0), thread(11, 900 * MS, OffCpuTimes::default(), 100 * MS)];
    let run = vec![native("[unknown]", ORT), py("Session.run", "/v/lib/python3.11/site-packages/onnxruntime/capi/x.py", 406), py("serve", "/srv/app.py", 48)];
    r.stacks = vec![
        stack(StackKind::Cpu, None, 10, 60, 0, run),
        // The feeder's sleep passes through libc, as does the pool now and then:
        // no call into the pool (it charged the pool to the sleep once).
        stack(StackKind::OffCpu, Some(OffCpuReason::Sleep), 10, 0, 400 * MS, vec![native("clock_nanosleep", "libc.so.6"), py("serve", "/srv/app.py", 50)]),
        stack(StackKind::Cpu, None, 11, 88, 0, vec![native("[unknown]", ORT)]),
        stack(StackKind::Cpu, None, 11, 2, 0, vec![native("memcpy", "libc.so.6"), native("[unknown]", ORT)]),
    ];
    let v = verdict(&r);
    let p = &v.processes[0];
    let pool = p.classes.iter().find(|c| c.class == Class::NativePool).expect("native_pool");
    assert_eq!(pool.time_ns, 900 * MS);
    assert_eq!(pool.libraries[0].library, ORT);
    assert_eq!((pool.sites[0].site.function.as_str(), pool.sites[0].site.line), ("serve", Some(48)));
    assert_eq!(pool.sites.len(), 1, "{:?}", pool.sites);
    assert_eq!(p.classes.iter().map(|c| c.time_ns).sum::<u64>(), p.wall_ns);
    let t = p.threads.iter().find(|t| t.tid == 11).unwrap();
    let info = t.pool.as_ref().expect("pool info");
    assert!(info.busy_waiting, "{info:?}");
    assert_eq!(info.charged_by, "library");
    assert!(p.threads.iter().find(|t| t.tid == 10).unwrap().pool.is_none());
    let mut text = String::new();
    render_text(&v, &mut text);
    assert!(text.contains("busy-waiting native worker pool: thread 11 spins"), "{text}");
    assert!(text.contains("native worker pool, busy-waiting (runnable 100.0% of its life"), "{text}");
    // The same pool blocking between requests (futex) is a pool, not busy-waiting.
    r.threads[1] = thread(11, 300 * MS, OffCpuTimes { lock_ns: 700 * MS, ..Default::default() }, 0);
    let v = verdict(&r);
    let t = v.processes[0].threads.iter().find(|t| t.tid == 11).unwrap();
    assert!(!t.pool.as_ref().unwrap().busy_waiting);
    // Without a Python thread in the process there is no pool class.
    r.stacks.retain(|s| s.tid == 11);
    r.threads.truncate(2);
    let v = verdict(&r);
    assert!(v.processes[0].classes.iter().all(|c| c.class != Class::NativePool));
}

/// A sync line whose syncs mostly waited on NCCL collectives is
/// `collective`; one that mostly did not stays `gpu_sync`; a thread
/// inside an NCCL call is `collective` by its native frame.
#[test]
fn syncs_waiting_on_collectives_are_collective() {
    let mut r = rec();
    r.threads = vec![thread(10, 0, OffCpuTimes { sleep_ns: 1000 * MS, ..Default::default() }, 0)];
    r.stacks = vec![
        stack(StackKind::OffCpu, Some(OffCpuReason::Sleep), 10, 0, 600 * MS, vec![py("step", "/srv/ddp.py", 40)]),
        stack(StackKind::OffCpu, Some(OffCpuReason::Sleep), 10, 0, 250 * MS, vec![py("step", "/srv/ddp.py", 45)]),
        stack(
            StackKind::OffCpu,
            Some(OffCpuReason::Sleep),
            10,
            0,
            150 * MS,
            vec![native("ncclGroupEnd", "libnccl.so.2"), py("step", "/srv/ddp.py", 50)],
        ),
    ];
    let sync = |line: u32, total_ns: u64, coll_ns: u64| CudaCall {
        pid: 10,
        api: "cudaStreamSynchronize".into(),
        kind: None,
        class: None,
        count: 10,
        bytes: 0,
        total_ns,
        errors: 0,
        site: Site { function: "step".into(), file: Some("/srv/ddp.py".into()), line: Some(line) },
        return_codes: Default::default(),
        pinned: None,
        pageable: None,
        events_lost: 0,
        not_ready: None,
        poll_waits: None,
        poll_ns: None,
        collective_waits: Some(if coll_ns > 0 { 10 } else { 0 }),
        collective_wait_ns: Some(coll_ns),
    };
    r.cuda = Some(CudaReport { calls: vec![sync(40, 600 * MS, 550 * MS), sync(45, 250 * MS, 50 * MS)], ..Default::default() });
    let v = verdict(&r);
    let p = &v.processes[0];
    let of = |c: Class| p.classes.iter().find(|s| s.class == c).map(|s| s.time_ns).unwrap_or(0);
    assert_eq!((of(Class::Collective), of(Class::GpuSync)), (750 * MS, 250 * MS));
    let b = p.bottleneck.as_ref().unwrap();
    assert_eq!((b.class, b.site.as_ref().unwrap().site.line), (Class::Collective, Some(40)));
    assert_eq!(Class::from_id("collective"), Some(Class::Collective));
    let mut text = String::new();
    render_text(&v, &mut text);
    assert!(text.contains("bottleneck waiting on collectives (NCCL) 75.0% at step (ddp.py:40)"), "{text}");
}
