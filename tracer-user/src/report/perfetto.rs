//! `--format perfetto`: the recording's timeline (`record --timeline`) as
//! a Perfetto protobuf trace (open it in ui.perfetto.dev or
//! trace_processor).
//!
//! Tracks: one process track per target (process descriptor: pid, name,
//! command line), one thread track per thread (thread descriptor), and
//! under each thread a `CUDA` and a `syscalls` track. Slices:
//! - on the thread track, the thread's states: `on-cpu`, `runqueue`,
//!   `off-cpu: io|lock|poll|sleep|other|gil|memory` (with `stack`, the stack
//!   captured when it began); CPU samples as instant events `cpu sample`
//!   with `stack`; `thread start` / `thread exit` instants;
//! - on `CUDA`, every call named by its API, args `bytes`, `kind`, `site`,
//!   `rc`;
//! - on `syscalls`, syscalls slower than `--slow-syscall`, args `site`
//!   (the leaf Python frame) and `stack`.
//!
//! Counter tracks: `GPU N utilization %` and `GPU N memory used` per GPU
//! (NVML samples), and `copy bandwidth` per process (bytes of the CUDA
//! copies that ended in each 10 ms bin, in B/s), and `resident memory` and
//! `resident anon` per process (the memory family's series, bytes; absent
//! with `--no-memory`), `GPU memory held` and `GPU memory in tensors` per
//! process (the CUDA family's device memory series, bytes). Process fork, exec and
//! exit are instants on the process track. Timestamps are CLOCK_MONOTONIC
//! ns (the packets name no clock, so viewers take them as their default).
//!
//! The messages are those of Perfetto's `protos/perfetto/trace/` (trace.proto,
//! trace_packet.proto, track_event/*.proto), with their field numbers.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use prost::Message;

use crate::recording::{
    cuda::CallClass,
    timeline::{LifecycleKind, ThreadState, Timeline},
    Frame, FrameKind, OffCpuReason, Recording,
};

/// The Perfetto messages this output uses (a subset of their fields).
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Trace {
        #[prost(message, repeated, tag = "1")]
        pub packet: Vec<TracePacket>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TracePacket {
        #[prost(uint64, optional, tag = "8")]
        pub timestamp: Option<u64>,
        #[prost(uint32, optional, tag = "10")]
        pub trusted_packet_sequence_id: Option<u32>,
        #[prost(message, optional, tag = "11")]
        pub track_event: Option<TrackEvent>,
        #[prost(uint32, optional, tag = "13")]
        pub sequence_flags: Option<u32>,
        #[prost(message, optional, tag = "60")]
        pub track_descriptor: Option<TrackDescriptor>,
        #[prost(bool, optional, tag = "87")]
        pub first_packet_on_sequence: Option<bool>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TrackDescriptor {
        #[prost(uint64, optional, tag = "1")]
        pub uuid: Option<u64>,
        #[prost(string, optional, tag = "2")]
        pub name: Option<String>,
        #[prost(message, optional, tag = "3")]
        pub process: Option<ProcessDescriptor>,
        #[prost(message, optional, tag = "4")]
        pub thread: Option<ThreadDescriptor>,
        #[prost(uint64, optional, tag = "5")]
        pub parent_uuid: Option<u64>,
        #[prost(message, optional, tag = "8")]
        pub counter: Option<CounterDescriptor>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProcessDescriptor {
        #[prost(int32, optional, tag = "1")]
        pub pid: Option<i32>,
        #[prost(string, repeated, tag = "2")]
        pub cmdline: Vec<String>,
        #[prost(string, optional, tag = "6")]
        pub process_name: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ThreadDescriptor {
        #[prost(int32, optional, tag = "1")]
        pub pid: Option<i32>,
        #[prost(int32, optional, tag = "2")]
        pub tid: Option<i32>,
        #[prost(string, optional, tag = "5")]
        pub thread_name: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CounterDescriptor {
        /// `CounterDescriptor.Unit`: 1 ns, 2 count, 3 bytes.
        #[prost(int32, optional, tag = "3")]
        pub unit: Option<i32>,
        #[prost(string, optional, tag = "6")]
        pub unit_name: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TrackEvent {
        #[prost(message, repeated, tag = "4")]
        pub debug_annotations: Vec<DebugAnnotation>,
        /// `TrackEvent.Type`: 1 slice begin, 2 slice end, 3 instant, 4 counter.
        #[prost(int32, optional, tag = "9")]
        pub r#type: Option<i32>,
        #[prost(uint64, optional, tag = "11")]
        pub track_uuid: Option<u64>,
        #[prost(string, repeated, tag = "22")]
        pub categories: Vec<String>,
        #[prost(string, optional, tag = "23")]
        pub name: Option<String>,
        #[prost(double, optional, tag = "44")]
        pub double_counter_value: Option<f64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DebugAnnotation {
        #[prost(uint64, optional, tag = "3")]
        pub uint_value: Option<u64>,
        #[prost(int64, optional, tag = "4")]
        pub int_value: Option<i64>,
        #[prost(string, optional, tag = "6")]
        pub string_value: Option<String>,
        #[prost(string, optional, tag = "10")]
        pub name: Option<String>,
    }
}

use proto::{DebugAnnotation, TrackDescriptor, TrackEvent, TracePacket};

const SEQ: u32 = 1;
const SLICE_BEGIN: i32 = 1;
const SLICE_END: i32 = 2;
const INSTANT: i32 = 3;
const COUNTER: i32 = 4;
/// Copy-bandwidth bins.
const BIN_NS: u64 = 10_000_000;

#[derive(Debug, thiserror::Error)]
pub enum PerfettoError {
    #[error("this recording has no timeline")]
    NoTimeline,
}

fn arg_str(name: &str, v: impl Into<String>) -> DebugAnnotation {
    DebugAnnotation { name: Some(name.into()), string_value: Some(v.into()), ..Default::default() }
}

fn arg_uint(name: &str, v: u64) -> DebugAnnotation {
    DebugAnnotation { name: Some(name.into()), uint_value: Some(v), ..Default::default() }
}

fn arg_int(name: &str, v: i64) -> DebugAnnotation {
    DebugAnnotation { name: Some(name.into()), int_value: Some(v), ..Default::default() }
}


fn frame_text(f: &Frame) -> String {
    match (&f.file, f.line) {
        (Some(file), Some(line)) => format!("{} ({file}:{line})", f.function),
        (Some(file), None) => format!("{} ({file})", f.function),
        _ if f.kind == FrameKind::Kernel => format!("{} [kernel]", f.function),
        _ => f.function.clone(),
    }
}

/// A stack as text, leaf first, one frame a line.
fn stack_text(frames: &[Frame]) -> String {
    frames.iter().map(frame_text).collect::<Vec<_>>().join("\n")
}

/// The leaf Python frame, else the first frame.
fn site_text(frames: &[Frame]) -> Option<String> {
    frames.iter().find(|f| f.kind == FrameKind::Python).or(frames.first()).map(frame_text)
}

/// One event before sorting: (ts, order at equal ts: ends first, then instants, then begins).
struct Ev {
    ts: u64,
    order: u8,
    seq: usize,
    event: TrackEvent,
}

struct Builder {
    events: Vec<Ev>,
}

impl Builder {
    fn push(&mut self, ts: u64, kind: i32, track: u64, name: Option<String>, args: Vec<DebugAnnotation>, counter: Option<f64>) {
        let order = match kind {
            SLICE_END => 0,
            INSTANT | COUNTER => 1,
            _ => 2,
        };
        self.push_ordered(ts, order, kind, track, name, args, counter);
    }

    #[allow(clippy::too_many_arguments)]
    fn push_ordered(
        &mut self,
        ts: u64,
        order: u8,
        kind: i32,
        track: u64,
        name: Option<String>,
        args: Vec<DebugAnnotation>,
        counter: Option<f64>,
    ) {
        let seq = self.events.len();
        self.events.push(Ev {
            ts,
            order,
            seq,
            event: TrackEvent {
                debug_annotations: args,
                r#type: Some(kind),
                track_uuid: Some(track),
                categories: Vec::new(),
                name,
                double_counter_value: counter,
            },
        });
    }

    fn slice(&mut self, begin: u64, end: u64, track: u64, name: String, args: Vec<DebugAnnotation>) {
        self.push(begin, SLICE_BEGIN, track, Some(name), args, None);
        if end > begin {
            self.push(end, SLICE_END, track, None, Vec::new(), None);
        } else {
            // An empty slice: its end after its begin at the same time.
            self.push_ordered(begin, 3, SLICE_END, track, None, Vec::new(), None);
        }
    }
}

fn descriptor(uuid: u64) -> TrackDescriptor {
    TrackDescriptor { uuid: Some(uuid), ..Default::default() }
}

/// The trace of `rec` (not yet encoded).
/// Track ids, handed out in order (the trace's tracks keep their order).
struct Ids(u64);

impl Ids {
    fn next(&mut self) -> u64 {
        self.0 += 1;
        self.0
    }
}

/// (pid, tid) -> (thread, CUDA, syscalls) track ids.
type ThreadTracks = HashMap<(u32, u32), (u64, u64, u64)>;

pub fn trace(rec: &Recording) -> Result<proto::Trace, PerfettoError> {
    let tl: &Timeline = rec.timeline.as_ref().ok_or(PerfettoError::NoTimeline)?;
    let base = tl.window_start_mono_ns;
    let mut tracks: Vec<TrackDescriptor> = Vec::new();
    let mut ids = Ids(1);
    let (process_track, thread_tracks) = process_and_thread_tracks(rec, tl, &mut tracks, &mut ids);
    let mut b = Builder { events: Vec::new() };
    timeline_events(tl, base, &process_track, &thread_tracks, &mut b);
    copy_bandwidth(tl, base, &process_track, &mut tracks, &mut ids, &mut b);
    gpu_counters(rec, base, &mut tracks, &mut ids, &mut b);
    memory_counters(rec, base, &process_track, &mut tracks, &mut ids, &mut b);
    gpu_memory_counters(rec, base, &process_track, &mut tracks, &mut ids, &mut b);
    Ok(proto::Trace { packet: packets(base, tracks, b) })
}

/// A track per process (the targets, and any pid the timeline names) and
/// three per thread.
fn process_and_thread_tracks(rec: &Recording, tl: &Timeline, tracks: &mut Vec<TrackDescriptor>, ids: &mut Ids) -> (HashMap<u32, u64>, ThreadTracks) {
    let mut pids: BTreeSet<u32> = rec.targets.iter().map(|t| t.pid).collect();
    let mut tids: BTreeSet<(u32, u32)> = BTreeSet::new();
    tids.extend(tl.states.iter().map(|s| (s.pid, s.tid)));
    tids.extend(tl.samples.iter().map(|s| (s.pid, s.tid)));
    tids.extend(tl.syscalls.iter().map(|s| (s.pid, s.tid)));
    tids.extend(tl.cuda.iter().map(|s| (s.pid, s.tid)));
    tids.extend(tl.lifecycle.iter().filter(|l| matches!(l.kind, LifecycleKind::ThreadStart | LifecycleKind::ThreadExit)).map(|l| (l.pid, l.tid)));
    pids.extend(tids.iter().map(|(p, _)| *p));
    pids.extend(tl.lifecycle.iter().map(|l| l.pid));
    let mut process_track: HashMap<u32, u64> = HashMap::new();
    for pid in &pids {
        let u = ids.next();
        let target = rec.targets.iter().find(|t| t.pid == *pid);
        let name = target.map(|t| t.comm.clone()).filter(|c| !c.is_empty());
        tracks.push(TrackDescriptor {
            process: Some(proto::ProcessDescriptor {
                pid: Some(*pid as i32),
                cmdline: target.map(|t| t.cmdline.clone()).unwrap_or_default(),
                process_name: name,
            }),
            ..descriptor(u)
        });
        process_track.insert(*pid, u);
    }
    let comm: HashMap<(u32, u32), &str> = rec.threads.iter().map(|t| ((t.pid, t.tid), t.comm.as_str())).collect();
    // (pid, tid) -> (thread, CUDA, syscalls) tracks.
    let mut thread_tracks: ThreadTracks = HashMap::new();
    for &(pid, tid) in &tids {
        let (t, c, s) = (ids.next(), ids.next(), ids.next());
        tracks.push(TrackDescriptor {
            thread: Some(proto::ThreadDescriptor {
                pid: Some(pid as i32),
                tid: Some(tid as i32),
                thread_name: comm.get(&(pid, tid)).filter(|c| !c.is_empty()).map(|c| (*c).to_owned()),
            }),
            ..descriptor(t)
        });
        tracks.push(TrackDescriptor { name: Some("CUDA".into()), parent_uuid: Some(t), ..descriptor(c) });
        tracks.push(TrackDescriptor { name: Some("syscalls".into()), parent_uuid: Some(t), ..descriptor(s) });
        thread_tracks.insert((pid, tid), (t, c, s));
    }
    (process_track, thread_tracks)
}

/// The timeline's intervals, samples, CUDA calls, slow syscalls and
/// lifecycle events on their tracks.
fn timeline_events(tl: &Timeline, base: u64, process_track: &HashMap<u32, u64>, thread_tracks: &ThreadTracks, b: &mut Builder) {
    let track = |pid: u32, tid: u32| thread_tracks.get(&(pid, tid)).copied().unwrap_or_default();
    let stack = |i: Option<u32>| i.and_then(|i| tl.stacks.get(i as usize)).map(Vec::as_slice);

    for s in &tl.states {
        let name = match s.state {
            ThreadState::OnCpu => "on-cpu".to_owned(),
            ThreadState::Runqueue => "runqueue".to_owned(),
            ThreadState::OffCpu => format!("off-cpu: {}", s.reason.unwrap_or(OffCpuReason::Other).name()),
        };
        let mut args = Vec::new();
        if let Some(frames) = stack(s.stack) {
            args.push(arg_str("stack", stack_text(frames)));
        }
        b.slice(base + s.begin_ns, base + s.end_ns, track(s.pid, s.tid).0, name, args);
    }
    for s in &tl.samples {
        let args = stack(s.stack).map(|f| vec![arg_str("stack", stack_text(f))]).unwrap_or_default();
        b.push(base + s.ts_ns, INSTANT, track(s.pid, s.tid).0, Some("cpu sample".into()), args, None);
    }
    for c in &tl.cuda {
        let mut args = vec![arg_uint("bytes", c.bytes), arg_str("site", c.site.display()), arg_int("rc", i64::from(c.rc))];
        if let Some(k) = &c.kind {
            args.push(arg_str("kind", k.clone()));
        }
        b.slice(base + c.begin_ns, base + c.end_ns, track(c.pid, c.tid).1, c.api.clone(), args);
    }
    for s in &tl.syscalls {
        let mut args = Vec::new();
        if let Some(frames) = stack(s.stack) {
            if let Some(site) = site_text(frames) {
                args.push(arg_str("site", site));
            }
            args.push(arg_str("stack", stack_text(frames)));
        }
        b.slice(base + s.begin_ns, base + s.end_ns, track(s.pid, s.tid).2, s.name.clone(), args);
    }
    for l in &tl.lifecycle {
        let (on, name) = match l.kind {
            LifecycleKind::ThreadStart => (track(l.pid, l.tid).0, "thread start"),
            LifecycleKind::ThreadExit => (track(l.pid, l.tid).0, "thread exit"),
            LifecycleKind::ProcessStart => (process_track.get(&l.pid).copied().unwrap_or_default(), "process start"),
            LifecycleKind::Exec => (process_track.get(&l.pid).copied().unwrap_or_default(), "exec"),
            LifecycleKind::ProcessExit => (process_track.get(&l.pid).copied().unwrap_or_default(), "process exit"),
        };
        let args = l.comm.as_ref().map(|c| vec![arg_str("comm", c.clone())]).unwrap_or_default();
        b.push(base + l.ts_ns, INSTANT, on, Some(name.into()), args, None);
    }
}

/// Copy bandwidth per process, in 10 ms bins, from the copies' ends.
fn copy_bandwidth(tl: &Timeline, base: u64, process_track: &HashMap<u32, u64>, tracks: &mut Vec<TrackDescriptor>, ids: &mut Ids, b: &mut Builder) {
    let mut bins: BTreeMap<u32, BTreeMap<u64, u64>> = BTreeMap::new();
    for c in tl.cuda.iter().filter(|c| CallClass::of_name(&c.api) == CallClass::Copy) {
        *bins.entry(c.pid).or_default().entry(c.end_ns / BIN_NS).or_default() += c.bytes;
    }
    for (pid, per_bin) in bins {
        let u = ids.next();
        tracks.push(TrackDescriptor {
            name: Some("copy bandwidth".into()),
            parent_uuid: process_track.get(&pid).copied(),
            counter: Some(proto::CounterDescriptor { unit: None, unit_name: Some("B/s".into()) }),
            ..descriptor(u)
        });
        let mut last: Option<u64> = None;
        for (bin, bytes) in per_bin {
            // Back to 0 after a gap.
            if last.is_some_and(|l| l + 1 < bin) {
                b.push(base + (last.unwrap_or(0) + 1) * BIN_NS, COUNTER, u, None, Vec::new(), Some(0.0));
            }
            b.push(base + bin * BIN_NS, COUNTER, u, None, Vec::new(), Some(bytes as f64 * 1e9 / BIN_NS as f64));
            last = Some(bin);
        }
        if let Some(l) = last {
            b.push(base + (l + 1) * BIN_NS, COUNTER, u, None, Vec::new(), Some(0.0));
        }
    }
}

/// NVML samples, per GPU: utilisation and memory counters.
fn gpu_counters(rec: &Recording, base: u64, tracks: &mut Vec<TrackDescriptor>, ids: &mut Ids, b: &mut Builder) {
    if let Some(cuda) = &rec.cuda {
        let gpus: BTreeSet<u32> = cuda.gpu_samples.iter().map(|s| s.gpu).collect();
        for gpu in gpus {
            let (util, mem) = (ids.next(), ids.next());
            tracks.push(TrackDescriptor {
                name: Some(format!("GPU {gpu} utilization %")),
                counter: Some(proto::CounterDescriptor { unit: None, unit_name: Some("%".into()) }),
                ..descriptor(util)
            });
            tracks.push(TrackDescriptor {
                name: Some(format!("GPU {gpu} memory used")),
                counter: Some(proto::CounterDescriptor { unit: Some(3), unit_name: None }),
                ..descriptor(mem)
            });
            for s in cuda.gpu_samples.iter().filter(|s| s.gpu == gpu) {
                b.push(base + s.ts_ns, COUNTER, util, None, Vec::new(), Some(s.util_percent));
                b.push(base + s.ts_ns, COUNTER, mem, None, Vec::new(), Some(s.mem_used_bytes as f64));
            }
        }
    }
}

/// Device memory per process: what its allocation calls held and, where
/// PyTorch's allocator probes reported, what its tensors took (the CUDA
/// family's series, from the window's start).
fn gpu_memory_counters(rec: &Recording, base: u64, process_track: &HashMap<u32, u64>, tracks: &mut Vec<TrackDescriptor>, ids: &mut Ids, b: &mut Builder) {
    let Some(cuda) = &rec.cuda else { return };
    for d in &cuda.device_memory {
        let parent = process_track.get(&d.pid).copied();
        let name = |what: &str| if parent.is_some() { what.to_owned() } else { format!("pid {} {what}", d.pid) };
        for (series, what) in [(&d.held_series, "GPU memory held"), (&d.allocated_series, "GPU memory in tensors")] {
            if series.is_empty() {
                continue;
            }
            let u = ids.next();
            tracks.push(TrackDescriptor {
                name: Some(name(what)),
                parent_uuid: parent,
                counter: Some(proto::CounterDescriptor { unit: Some(3), unit_name: None }),
                ..descriptor(u)
            });
            for &[t, v] in series {
                b.push(base + t, COUNTER, u, None, Vec::new(), Some(v as f64));
            }
        }
    }
}

/// Resident memory per process, and its anonymous part: the memory
/// family's series (times from the same window start as the timeline).
fn memory_counters(rec: &Recording, base: u64, process_track: &HashMap<u32, u64>, tracks: &mut Vec<TrackDescriptor>, ids: &mut Ids, b: &mut Builder) {
    let Some(m) = &rec.memory else { return };
    for p in m.processes.iter().filter(|p| !p.series.is_empty()) {
        let parent = process_track.get(&p.pid).copied();
        // A process with no track of its own says which it is.
        let name = |what: &str| if parent.is_some() { what.to_owned() } else { format!("pid {} {what}", p.pid) };
        let (rss, anon) = (ids.next(), ids.next());
        for (u, what) in [(rss, "resident memory"), (anon, "resident anon")] {
            tracks.push(TrackDescriptor {
                name: Some(name(what)),
                parent_uuid: parent,
                counter: Some(proto::CounterDescriptor { unit: Some(3), unit_name: None }),
                ..descriptor(u)
            });
        }
        for pt in &p.series {
            b.push(base + pt.t_ns, COUNTER, rss, None, Vec::new(), Some(pt.rss as f64));
            b.push(base + pt.t_ns, COUNTER, anon, None, Vec::new(), Some(pt.anon as f64));
        }
    }
}

/// The tracks' descriptors first, then the events in time order.
fn packets(base: u64, tracks: Vec<TrackDescriptor>, b: Builder) -> Vec<TracePacket> {
    let mut packet = Vec::with_capacity(tracks.len() + b.events.len());
    for (i, t) in tracks.into_iter().enumerate() {
        packet.push(TracePacket {
            timestamp: Some(base),
            trusted_packet_sequence_id: Some(SEQ),
            sequence_flags: (i == 0).then_some(1),
            first_packet_on_sequence: (i == 0).then_some(true),
            track_descriptor: Some(t),
            ..Default::default()
        });
    }
    let mut events = b.events;
    events.sort_by_key(|e| (e.ts, e.order, e.seq));
    for e in events {
        packet.push(TracePacket {
            timestamp: Some(e.ts),
            trusted_packet_sequence_id: Some(SEQ),
            track_event: Some(e.event),
            ..Default::default()
        });
    }
    packet
}

/// The encoded trace of `rec`.
pub fn render(rec: &Recording) -> Result<Vec<u8>, PerfettoError> {
    Ok(trace(rec)?.encode_to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::{
        cuda::Site,
        timeline::{CudaCallEvent, StateInterval, SyscallEvent},
    };

    #[test]
    fn needs_a_timeline() {
        let rec = crate::recording::tests::sample();
        assert!(matches!(render(&rec), Err(PerfettoError::NoTimeline)));
    }

    #[test]
    fn slices_pair_up_on_their_tracks() {
        let mut rec = crate::recording::tests::sample();
        let py = Frame { function: "main".into(), file: Some("/w/x.py".into()), line: Some(3), kind: FrameKind::Python, module: None };
        rec.timeline = Some(Timeline {
            window_start_mono_ns: 1000,
            limit: 10,
            states: vec![
                StateInterval { pid: 10, tid: 10, state: ThreadState::OnCpu, reason: None, begin_ns: 0, end_ns: 5, stack: None },
                StateInterval {
                    pid: 10,
                    tid: 10,
                    state: ThreadState::OffCpu,
                    reason: Some(OffCpuReason::Sleep),
                    begin_ns: 5,
                    end_ns: 200,
                    stack: Some(0),
                },
            ],
            syscalls: vec![SyscallEvent { pid: 10, tid: 10, name: "clock_nanosleep".into(), begin_ns: 5, end_ns: 200, stack: Some(0) }],
            cuda: vec![CudaCallEvent {
                pid: 10,
                tid: 10,
                api: "cudaMemcpy".into(),
                kind: Some("HtoD".into()),
                bytes: 4096,
                begin_ns: 1,
                end_ns: 4,
                rc: 0,
                site: Site::of_frame(&py),
            }],
            stacks: vec![vec![py]],
            ..Default::default()
        });
        let t = trace(&rec).unwrap();
        let bytes = t.encode_to_vec();
        let back = proto::Trace::decode(&bytes[..]).unwrap();
        let evs: Vec<&TrackEvent> = back.packet.iter().filter_map(|p| p.track_event.as_ref()).collect();
        let begins = evs.iter().filter(|e| e.r#type == Some(SLICE_BEGIN)).count();
        let ends = evs.iter().filter(|e| e.r#type == Some(SLICE_END)).count();
        assert_eq!((begins, ends), (4, 4));
        let sleep = back
            .packet
            .iter()
            .find(|p| p.track_event.as_ref().is_some_and(|e| e.name.as_deref() == Some("off-cpu: sleep")))
            .unwrap();
        assert_eq!(sleep.timestamp, Some(1005));
        let threads = back.packet.iter().filter(|p| p.track_descriptor.as_ref().is_some_and(|d| d.thread.is_some())).count();
        assert_eq!(threads, 1);
        // A copy-bandwidth counter track for pid 10.
        assert!(back.packet.iter().any(|p| p.track_descriptor.as_ref().is_some_and(|d| d.name.as_deref() == Some("copy bandwidth"))));
    }

    fn track_uuid(back: &proto::Trace, name: &str) -> u64 {
        back.packet.iter().find_map(|p| p.track_descriptor.as_ref().filter(|d| d.name.as_deref() == Some(name)).and_then(|d| d.uuid)).unwrap()
    }

    fn counter_values(back: &proto::Trace, uuid: u64) -> Vec<(Option<u64>, Option<f64>)> {
        back.packet
            .iter()
            .filter_map(|p| p.track_event.as_ref().filter(|e| e.track_uuid == Some(uuid) && e.r#type == Some(COUNTER)).map(|e| (p.timestamp, e.double_counter_value)))
            .collect()
    }

    #[test]
    fn resident_memory_is_a_counter_track_per_process() {
        use crate::recording::memory::{MemPoint, MemoryReport, ProcessMemory};
        let mut rec = crate::recording::tests::sample();
        rec.timeline = Some(Timeline {
            window_start_mono_ns: 1000,
            limit: 10,
            states: vec![StateInterval { pid: 10, tid: 10, state: ThreadState::OnCpu, reason: None, begin_ns: 0, end_ns: 5, stack: None }],
            ..Default::default()
        });
        let pt = |t_ns, rss| MemPoint { t_ns, rss, anon: rss / 2, ..Default::default() };
        rec.memory = Some(MemoryReport {
            growth_sample_bytes: 256 << 10,
            processes: vec![ProcessMemory {
                pid: 10,
                series: vec![pt(0, 100 << 20), pt(50, 120 << 20)],
                peak_rss: 120 << 20,
                ..Default::default()
            }],
        });
        let back = proto::Trace::decode(&trace(&rec).unwrap().encode_to_vec()[..]).unwrap();
        let track = |name: &str| track_uuid(&back, name);
        let values = |uuid: u64| counter_values(&back, uuid);
        assert_eq!(values(track("resident memory")), [(Some(1000), Some((100u64 << 20) as f64)), (Some(1050), Some((120u64 << 20) as f64))]);
        assert_eq!(values(track("resident anon")).len(), 2);
        // The device memory series of the CUDA family, on the same clock.
        let mut cuda = rec.cuda.clone().unwrap_or_default();
        cuda.device_memory = vec![crate::recording::cuda::DeviceMemory {
            pid: 10,
            held_series: vec![[0, 2 << 20], [40, 6 << 20]],
            allocated_series: vec![[10, 1 << 20]],
            allocated_bytes: Some(1 << 20),
            ..Default::default()
        }];
        rec.cuda = Some(cuda);
        let back = proto::Trace::decode(&trace(&rec).unwrap().encode_to_vec()[..]).unwrap();
        let track = |name: &str| track_uuid(&back, name);
        let values = |uuid: u64| counter_values(&back, uuid);
        assert_eq!(values(track("GPU memory held")), [(Some(1000), Some((2u64 << 20) as f64)), (Some(1040), Some((6u64 << 20) as f64))]);
        assert_eq!(values(track("GPU memory in tensors")), [(Some(1010), Some((1u64 << 20) as f64))]);
    }
}
