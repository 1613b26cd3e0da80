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

fn on(pid: u32, mut t: ThreadTimes) -> ThreadTimes {
    t.pid = pid;
    t
}

fn at(pid: u32, mut s: StackRecord) -> StackRecord {
    s.pid = pid;
    s
}

fn target(pid: u32, ppid: u32, cmdline: &str) -> crate::recording::Target {
    crate::recording::Target {
        pid,
        ppid: Some(ppid),
        comm: "python3".into(),
        exe: None,
        cmdline: cmdline.split(' ').map(str::to_owned).collect(),
        origin: crate::recording::Origin::Followed,
        exit_code: None,
    }
}

/// The DataLoader of issue 26: the main thread waits in `next()` (a poll
/// under torch's dataloader.py and multiprocessing's queues.py), its queue
/// feeder thread idles in `Condition.wait`, and two forked workers compute
/// `__getitem__` and wait for a CPU.
fn dataloader() -> Recording {
    let mut r = rec();
    let mp = "/usr/lib/python3.11/multiprocessing";
    let dl = "/venv/lib/python3.11/site-packages/torch/utils/data";
    r.targets = vec![target(10, 1, "python3 pipeline.py"), target(20, 10, "python3 pipeline.py"), target(21, 10, "python3 pipeline.py")];
    let poll = OffCpuTimes { poll_ns: 1800 * MS, ..Default::default() };
    let idle = OffCpuTimes { lock_ns: 1990 * MS, ..Default::default() };
    r.threads = vec![
        thread(10, 200 * MS, poll, 0),
        thread(11, 10 * MS, idle, 0),
        on(20, thread(20, 1400 * MS, OffCpuTimes::default(), 600 * MS)),
        on(20, thread(22, 5 * MS, idle, 0)),
        on(21, thread(21, 1500 * MS, OffCpuTimes::default(), 500 * MS)),
    ];
    let next = vec![
        py("poll", "/usr/lib/python3.11/selectors.py", 415),
        py("wait", &format!("{mp}/connection.py"), 1136),
        py("Connection._poll", &format!("{mp}/connection.py"), 440),
        py("Queue.get", &format!("{mp}/queues.py"), 113),
        py("_MultiProcessingDataLoaderIter._try_get_data", &format!("{dl}/dataloader.py"), 1131),
        py("_BaseDataLoaderIter.__next__", &format!("{dl}/dataloader.py"), 701),
        py("main", "/srv/pipeline.py", 60),
    ];
    let feed = vec![py("Condition.wait", "/usr/lib/python3.11/threading.py", 327), py("Queue._feed", &format!("{mp}/queues.py"), 231)];
    let item = vec![py("SlowDS.__getitem__", "/srv/pipeline.py", 33), py("_worker_loop", &format!("{dl}/_utils/worker.py"), 349)];
    r.stacks = vec![
        stack(StackKind::OffCpu, Some(OffCpuReason::Poll), 10, 0, 1700 * MS, next),
        stack(StackKind::Cpu, None, 10, 20, 0, vec![py("step", "/srv/pipeline.py", 40)]),
        stack(StackKind::OffCpu, Some(OffCpuReason::Lock), 11, 0, 1900 * MS, feed.clone()),
        at(20, stack(StackKind::Cpu, None, 20, 140, 0, item.clone())),
        at(20, stack(StackKind::OffCpu, Some(OffCpuReason::Lock), 22, 0, 1900 * MS, feed)),
        at(21, stack(StackKind::Cpu, None, 21, 150, 0, item)),
    ];
    r
}

/// `multiprocessing.Pool.imap`: the main thread waits in pool.py's
/// `IMapIterator.next` for two busy child processes (not DataLoader
/// workers): an input pipeline fed by "worker processes", with advice in
/// the pool's words (processes, chunksize), not the DataLoader's.
#[test]
fn a_loop_waiting_for_a_process_pool_is_input_pipeline() {
    let mut r = dataloader();
    let imap = vec![
        py("Condition.wait", "/usr/lib/python3.11/threading.py", 331),
        py("IMapIterator.next", "/usr/lib/python3.11/multiprocessing/pool.py", 856),
        py("main", "/srv/pipeline.py", 60),
    ];
    let work = vec![py("work", "/srv/pipeline.py", 33), py("worker", "/usr/lib/python3.11/multiprocessing/pool.py", 125)];
    // The queue feeder threads' stacks stay (helpers); the rest is the pool's.
    r.stacks.retain(|s| s.tid == 11 || s.tid == 22);
    r.stacks.extend([
        stack(StackKind::OffCpu, Some(OffCpuReason::Lock), 10, 0, 1700 * MS, imap),
        stack(StackKind::Cpu, None, 10, 20, 0, vec![py("step", "/srv/pipeline.py", 40)]),
        at(20, stack(StackKind::Cpu, None, 20, 140, 0, work.clone())),
        at(21, stack(StackKind::Cpu, None, 21, 150, 0, work)),
    ]);
    r.threads[0].off_cpu = OffCpuTimes { lock_ns: 1800 * MS, ..Default::default() };
    let v = verdict(&r);
    let p = v.processes.iter().find(|p| p.pid == 10).unwrap();
    let b = p.bottleneck.as_ref().unwrap();
    assert_eq!(b.class, Class::InputPipeline, "{:?}", p.classes);
    let pr = b.producers.as_ref().unwrap();
    assert_eq!((pr.kind.as_str(), pr.pids.as_slice()), ("processes", &[20, 21][..]));
    assert_eq!(pr.site.as_ref().unwrap().site.function, "work");
    assert!(b.advice.contains("worker processes") && b.advice.contains("Pool(processes=N)"), "{}", b.advice);
    assert!(!b.advice.contains("num_workers") && !b.advice.contains("pin_memory") && !b.advice.contains("augmentation"), "{}", b.advice);
}

/// multiprocessing's resource tracker, a child of the consumer with a
/// command line of its own, blocked reading its pipe ("I/O") after a
/// start-up that waited for a CPU on a busy machine (on a CPU 3%, in the
/// run queue 4%: 7% together) is not a producer; a worker on a CPU 4% of
/// its life and starved the rest is.
#[test]
fn a_blocked_helper_is_no_producer_however_long_it_waited_for_a_cpu() {
    let mut r = dataloader();
    r.targets.push(target(30, 10, "python3 -c from multiprocessing.resource_tracker import main;main(5)"));
    r.threads.push(on(30, thread(30, 60 * MS, OffCpuTimes { io_ns: 1800 * MS, ..Default::default() }, 80 * MS)));
    let v = verdict(&r);
    let pr = v.processes.iter().find(|p| p.pid == 10).and_then(|p| p.bottleneck.as_ref()?.producers.clone()).expect("producers");
    assert_eq!(pr.pids, [20, 21], "{pr:?}");
    // Starved workers still produce: little CPU, most of their life waiting for one.
    for t in r.threads.iter_mut().filter(|t| t.pid == 20 || t.pid == 21) {
        (t.on_cpu_ns, t.runqueue_ns) = (80 * MS, 1800 * MS);
        t.wall_ns = t.on_cpu_ns + t.runqueue_ns + t.off_cpu.total();
    }
    let v = verdict(&r);
    let pr = v.processes.iter().find(|p| p.pid == 10).and_then(|p| p.bottleneck.as_ref()?.producers.clone()).expect("starved producers");
    assert_eq!(pr.pids, [20, 21], "{pr:?}");
}

/// A DataLoader worker's fd-passing listener thread (`socket.accept` in
/// multiprocessing's resource sharer) waits for the GIL a third of its
/// life behind the worker's `__getitem__`: still a helper, and the
/// workers read as what they do.
#[test]
fn a_listener_waiting_for_the_gil_is_a_helper() {
    let mut r = dataloader();
    let gil_poll = OffCpuTimes { gil_ns: 700 * MS, poll_ns: 1250 * MS, ..Default::default() };
    for pid in [20, 21] {
        let tid = pid + 10;
        r.threads.push(on(pid, thread(tid, 30 * MS, gil_poll, 20 * MS)));
        let accept = vec![py("socket.accept", "/usr/lib/python3.11/socket.py", 294), py("_serve", "/usr/lib/python3.11/multiprocessing/resource_sharer.py", 138)];
        r.stacks.push(at(pid, stack(StackKind::OffCpu, Some(OffCpuReason::Poll), tid, 0, 1250 * MS, accept)));
    }
    let v = verdict(&r);
    let g = &v.groups[0];
    assert_eq!(g.helpers.as_ref().map(|h| h.threads), Some(3), "{:?}", g.helpers);
    let b = g.bottleneck.as_ref().unwrap();
    assert_eq!(b.class, Class::PythonCompute, "{:?}", g.classes);
    assert_eq!(b.site.as_ref().unwrap().site.function, "SlowDS.__getitem__");
}

#[test]
fn a_loop_waiting_for_busy_dataloader_workers_is_input_pipeline_naming_them() {
    let r = dataloader();
    let v = verdict(&r);
    let p = v.processes.iter().find(|p| p.pid == 10).unwrap();
    // The feeder thread is a helper, out of the shares.
    assert_eq!(p.helpers, Some(parked::Parked { threads: 1, wall_ns: 2000 * MS, tids: vec![(10, 11)] }));
    assert_eq!(p.wall_ns, 2000 * MS);
    let b = p.bottleneck.as_ref().unwrap();
    assert_eq!(b.class, Class::InputPipeline, "{:?}", p.classes);
    assert!((b.share - 0.9).abs() < 1e-9, "{}", b.share);
    let site = b.site.as_ref().unwrap();
    assert_eq!((site.site.function.as_str(), site.site.line), ("main", Some(60)));
    let pr = b.producers.as_ref().unwrap();
    assert_eq!((pr.kind.as_str(), pr.pids.as_slice()), ("dataloader_workers", &[20, 21][..]));
    assert_eq!(pr.bound_by, Class::PythonCompute);
    assert!(pr.starved_share >= pipeline::STARVED_MIN_SHARE, "{pr:?}");
    assert_eq!(pr.site.as_ref().unwrap().site.function, "SlowDS.__getitem__");
    assert!(b.advice.contains("num_workers"), "{}", b.advice);
    // The workers, one row.
    assert_eq!(v.groups.len(), 1);
    assert_eq!((v.groups[0].pids.as_slice(), v.groups[0].ppid), (&[20, 21][..], Some(10)));
    assert_eq!(v.groups[0].helpers.as_ref().map(|h| h.threads), Some(1));
    let mut text = String::new();
    render_text(&v, &mut text);
    let lines: Vec<&str> = text.lines().collect();
    let head = lines.iter().position(|l| l.starts_with("pid 10 python3 pipeline.py: bottleneck input pipeline 90.0% at main (pipeline.py:60)")).unwrap_or_else(|| panic!("{text}"));
    assert!(lines[head].contains("for DataLoader workers 20, 21"), "{text}");
    assert!(lines[head + 1].starts_with("  producers: DataLoader workers 20, 21, which are CPU-bound (and CPU-starved) at SlowDS.__getitem__ (pipeline.py:33)"), "{text}");
    assert!(text.contains("left out: 1 helper thread"), "{text}");
    assert!(text.contains("pids 20, 21 (2 worker processes of pid 10) python3 pipeline.py: bottleneck"), "{text}");
    assert!(!text.contains("pid 20 "), "members are not shown apart: {text}");
}

#[test]
fn idle_producers_leave_the_consumer_wait_in_its_class() {
    let mut r = dataloader();
    // The workers sleep (a paced source): no pipeline to widen.
    for t in r.threads.iter_mut().filter(|t| t.pid != 10) {
        t.off_cpu.sleep_ns = t.on_cpu_ns + t.runqueue_ns;
        t.on_cpu_ns /= 20;
        t.runqueue_ns = 0;
    }
    let v = verdict(&r);
    let b = v.processes.iter().find(|p| p.pid == 10).unwrap().bottleneck.clone().unwrap();
    assert_eq!(b.class, Class::Polling);
    assert!(b.producers.is_none());
}

#[test]
fn a_queue_fed_by_a_busy_thread_is_input_pipeline_naming_the_thread() {
    let mut r = rec();
    r.threads = vec![thread(10, 50 * MS, OffCpuTimes { lock_ns: 950 * MS, ..Default::default() }, 0), thread(11, 900 * MS, OffCpuTimes::default(), 100 * MS)];
    r.stacks = vec![
        stack(
            StackKind::OffCpu,
            Some(OffCpuReason::Lock),
            10,
            0,
            900 * MS,
            vec![py("Condition.wait", "/usr/lib/python3.11/threading.py", 327), py("Queue.get", "/usr/lib/python3.11/queue.py", 171), py("consume", "/srv/app.py", 20)],
        ),
        stack(StackKind::Cpu, None, 11, 90, 0, vec![py("produce", "/srv/app.py", 9)]),
    ];
    let v = verdict(&r);
    let p = &v.processes[0];
    let t = p.threads.iter().find(|t| t.tid == 10).unwrap().bottleneck.as_ref().unwrap();
    assert_eq!(t.class, Class::InputPipeline);
    let pr = t.producers.as_ref().unwrap();
    assert_eq!((pr.kind.as_str(), pr.tids.as_slice(), pr.bound_by), ("threads", &[11][..], Class::PythonCompute));
    assert!(v.groups.is_empty());
}

#[test]
fn an_idle_native_helper_never_heads_the_verdict() {
    // `import torch; torch.cuda.is_available()`: the main thread computes
    // a little; a native helper is runnable 8% of its life, parked the rest.
    let mut r = rec();
    let futex = OffCpuTimes { lock_ns: 920 * MS, ..Default::default() };
    r.threads = vec![thread(10, 600 * MS, OffCpuTimes { io_ns: 100 * MS, ..Default::default() }, 0), thread(11, 40 * MS, futex, 40 * MS)];
    r.stacks = vec![
        stack(StackKind::Cpu, None, 10, 60, 0, vec![py("<module>", "/srv/check.py", 1)]),
        stack(StackKind::OffCpu, Some(OffCpuReason::Lock), 11, 0, 900 * MS, vec![native("__futex_abstimed_wait_common64", "libc.so.6")]),
        stack(StackKind::Cpu, None, 11, 4, 0, vec![native("worker", "libtorch_cpu.so")]),
    ];
    let v = verdict(&r);
    let p = &v.processes[0];
    assert_eq!(p.bottleneck.as_ref().unwrap().class, Class::PythonCompute, "{:?}", p.classes);
    assert_eq!(p.helpers.as_ref().map(|h| h.threads), Some(1));
    assert!(p.classes.iter().all(|c| c.class != Class::WaitingOnThreads), "{:?}", p.classes);
}

/// A pool whose workers a `multiprocessing` fork server forked: in the
/// job, they are the loop's children (the server, no one's worker).
#[test]
fn fork_server_workers_belong_to_the_loop() {
    let mut r = rec();
    let server = |pid, ppid| {
        let mut t = target(pid, ppid, "python3");
        t.cmdline = ["python3", "-B", "-c", "from multiprocessing.forkserver import main; main(11, 12, ['__main__'])"].map(String::from).to_vec();
        t
    };
    r.targets = vec![target(10, 1, "python3 loop.py"), server(30, 10), server(31, 30), server(32, 30), target(40, 10, "python3 -c other")];
    let p = parents(&r);
    assert_eq!((p.get(&31), p.get(&32), p.get(&40), p.get(&30)), (Some(&10), Some(&10), Some(&10), None), "{p:?}");
    let traced: BTreeSet<u32> = [10, 30, 31, 32, 40].into_iter().collect();
    assert_eq!(worker_groups(&r, &traced), vec![(10, vec![31, 32])]);
}
