//! `--format pprof`: a gzipped `profile.proto` (google/pprof
//! `proto/profile.proto`, package `perftools.profiles`), what `go tool
//! pprof`, Pyroscope and Grafana read.
//!
//! Sample types, in this order: `samples/count` (CPU samples),
//! `cpu/nanoseconds` (CPU samples times the sampling period) and
//! `off_cpu/nanoseconds` (off-CPU and GIL-wait time); `cpu` is the default.
//! Every sample carries a `thread` label (the thread's name, as in the
//! speedscope output), `pid` and `tid` number labels, and an off-CPU one an
//! `off_cpu_reason` label. One location per distinct frame, with one line:
//! its function (name, file: the Python source file, or a native frame's
//! module) and line. Stacks with Python frames start at their Python leaf
//! (as in the speedscope output). `--profile cpu|off-cpu|wall` all give
//! that file (all three types are in it); `--profile memory` gives
//! `resident_growth/bytes` (the default) and `resident_release/bytes` per
//! stack the memory family sampled, with `process` and `pid` labels.

use std::{
    collections::HashMap,
    io::Write,
};

use flate2::{write::GzEncoder, Compression};
use prost::Message;

use super::{
    folded::{memory_stacks, Profile},
    speedscope::{from_python_leaf, thread_name, thread_names, weighted},
};
use crate::recording::{Frame, FrameKind, OffCpuReason, Recording};

/// The messages of google/pprof `proto/profile.proto` that a profile
/// needs, with that file's field numbers and types (proto3).
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "7")]
        pub drop_frames: i64,
        #[prost(int64, tag = "8")]
        pub keep_frames: i64,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
        #[prost(bool, tag = "5")]
        pub is_folded: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// The string table: index 0 is "" as the format requires.
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        Strings { table: vec![String::new()], index: HashMap::from([(String::new(), 0)]) }
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(i) = self.index.get(s) {
            return *i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}


fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Functions and locations, one location per distinct frame.
struct Locations<'a> {
    functions: Vec<proto::Function>,
    function_ids: HashMap<(String, String), u64>,
    locations: Vec<proto::Location>,
    location_ids: HashMap<&'a Frame, u64>,
}

impl<'a> Locations<'a> {
    fn new() -> Self {
        Locations { functions: Vec::new(), function_ids: HashMap::new(), locations: Vec::new(), location_ids: HashMap::new() }
    }

    /// The location ids of `frames`, leaf first.
    fn of(&mut self, strings: &mut Strings, frames: &'a [Frame]) -> Vec<u64> {
        let mut ids = Vec::with_capacity(frames.len());
        for f in frames {
            if let Some(id) = self.location_ids.get(f) {
                ids.push(*id);
                continue;
            }
            let mut name = if f.function.is_empty() { crate::recording::UNKNOWN.to_owned() } else { f.function.clone() };
            if f.kind == FrameKind::Kernel {
                name.push_str(" [kernel]");
            }
            let file = f.file.clone().or_else(|| f.module.clone()).unwrap_or_default();
            let functions = &mut self.functions;
            let fid = *self.function_ids.entry((name.clone(), file.clone())).or_insert_with(|| {
                let id = functions.len() as u64 + 1;
                functions.push(proto::Function {
                    id,
                    name: strings.get(&name),
                    system_name: strings.get(&name),
                    filename: strings.get(&file),
                    start_line: 0,
                });
                id
            });
            let id = self.locations.len() as u64 + 1;
            self.locations.push(proto::Location {
                id,
                mapping_id: 0,
                address: 0,
                line: vec![proto::Line { function_id: fid, line: f.line.map_or(0, i64::from) }],
                is_folded: false,
            });
            self.location_ids.insert(f, id);
            ids.push(id);
        }
        ids
    }
}

/// The profile of `rec` (not yet encoded): time, or with
/// [`Profile::Memory`] resident growth.
pub fn profile(rec: &Recording, which: Profile) -> proto::Profile {
    if which == Profile::Memory {
        return memory_profile(rec);
    }
    let mut strings = Strings::new();
    let names = thread_names(rec);
    let sample_type = vec![vt(&mut strings, "samples", "count"), vt(&mut strings, "cpu", "nanoseconds"), vt(&mut strings, "off_cpu", "nanoseconds")];
    let period = 1_000_000_000u64.checked_div(rec.sample_hz).unwrap_or(0);
    let period_type = Some(vt(&mut strings, "cpu", "nanoseconds"));
    let default_sample_type = strings.get("cpu");
    let mut locs = Locations::new();
    let mut samples = Vec::new();
    let keys = (strings.get("thread"), strings.get("pid"), strings.get("tid"), strings.get("off_cpu_reason"));
    // Wall holds every CPU sample and every off-CPU stack once.
    for w in weighted(rec, Profile::Wall) {
        let ids = locs.of(&mut strings, w.frames);
        let thread = thread_name(&names, w.pid, w.tid);
        let mut label = vec![
            proto::Label { key: keys.0, str: strings.get(&thread), num: 0, num_unit: 0 },
            proto::Label { key: keys.1, str: 0, num: i64::from(w.pid), num_unit: 0 },
            proto::Label { key: keys.2, str: 0, num: i64::from(w.tid), num_unit: 0 },
        ];
        let value = if w.on_cpu {
            vec![to_i64(w.samples), to_i64(w.weight_ns), 0]
        } else {
            label.push(proto::Label { key: keys.3, str: strings.get(w.reason.map_or("unknown", OffCpuReason::name)), num: 0, num_unit: 0 });
            vec![0, 0, to_i64(w.weight_ns)]
        };
        samples.push(proto::Sample { location_id: ids, value, label });
    }
    finish(rec, strings, locs, Parts { sample_type, samples, period_type, period, default_sample_type })
}

fn vt(s: &mut Strings, t: &str, u: &str) -> proto::ValueType {
    proto::ValueType { r#type: s.get(t), unit: s.get(u) }
}

/// `resident_growth/bytes` (default) and `resident_release/bytes` per
/// stack the memory family sampled, a `process` label and a `pid` one.
fn memory_profile(rec: &Recording) -> proto::Profile {
    let mut strings = Strings::new();
    let sample_type = vec![vt(&mut strings, "resident_growth", "bytes"), vt(&mut strings, "resident_release", "bytes")];
    let period_type = Some(vt(&mut strings, "resident_growth", "bytes"));
    let period = rec.memory.as_ref().map_or(0, |m| m.growth_sample_bytes);
    let default_sample_type = strings.get("resident_growth");
    let keys = (strings.get("process"), strings.get("pid"));
    let comm = |pid: u32| rec.targets.iter().find(|t| t.pid == pid).map(|t| t.comm.clone()).unwrap_or_else(|| format!("pid {pid}"));
    let mut locs = Locations::new();
    let mut samples = Vec::new();
    for (pid, s) in memory_stacks(rec) {
        let ids = locs.of(&mut strings, from_python_leaf(&s.frames));
        let label = vec![
            proto::Label { key: keys.0, str: strings.get(&comm(pid)), num: 0, num_unit: 0 },
            proto::Label { key: keys.1, str: 0, num: i64::from(pid), num_unit: 0 },
        ];
        samples.push(proto::Sample { location_id: ids, value: vec![to_i64(s.grown_bytes), to_i64(s.released_bytes)], label });
    }
    finish(rec, strings, locs, Parts { sample_type, samples, period_type, period, default_sample_type })
}

struct Parts {
    sample_type: Vec<proto::ValueType>,
    samples: Vec<proto::Sample>,
    period_type: Option<proto::ValueType>,
    period: u64,
    default_sample_type: i64,
}

fn finish(rec: &Recording, strings: Strings, locs: Locations<'_>, p: Parts) -> proto::Profile {
    proto::Profile {
        sample_type: p.sample_type,
        sample: p.samples,
        mapping: Vec::new(),
        location: locs.locations,
        function: locs.functions,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos: to_i64(rec.started_unix_ms.saturating_mul(1_000_000)),
        duration_nanos: to_i64(rec.duration_ns),
        period_type: p.period_type,
        period: to_i64(p.period),
        comment: Vec::new(),
        default_sample_type: p.default_sample_type,
        string_table: strings.table,
    }
}

/// The gzipped, encoded profile of `rec`.
pub fn render(rec: &Recording, which: Profile) -> std::io::Result<Vec<u8>> {
    let bytes = profile(rec, which).encode_to_vec();
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&bytes)?;
    gz.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::folded::tests::stacks_sample;
    use flate2::read::GzDecoder;
    use std::io::Read;

    #[test]
    fn totals_types_and_labels() {
        let rec = stacks_sample();
        let gz = render(&rec, Profile::Cpu).unwrap();
        let mut raw = Vec::new();
        GzDecoder::new(&gz[..]).read_to_end(&mut raw).unwrap();
        let p = proto::Profile::decode(&raw[..]).unwrap();
        let s = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(s(0), "");
        let types: Vec<(&str, &str)> = p.sample_type.iter().map(|t| (s(t.r#type), s(t.unit))).collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds"), ("off_cpu", "nanoseconds")]);
        assert_eq!(s(p.default_sample_type), "cpu");
        let sum = |i: usize| p.sample.iter().map(|x| x.value[i]).sum::<i64>();
        // CPU samples: 3 + 4 + 1 + 2 + 5; off-CPU: every off-CPU stack's time.
        assert_eq!(sum(0), 15);
        assert_eq!(sum(1), 15 * 10_000_000);
        assert_eq!(sum(2), 1_500_000 + 500_400 + 2_000_000 + 400);
        for x in &p.sample {
            assert!(x.label.iter().any(|l| s(l.key) == "thread" && !s(l.str).is_empty()));
            for id in &x.location_id {
                assert!(p.location.iter().any(|l| l.id == *id));
            }
        }
    }

    #[test]
    fn memory_profile_is_bytes_by_stack() {
        let rec = crate::report::folded::tests::memory_sample();
        let gz = render(&rec, Profile::Memory).unwrap();
        let mut raw = Vec::new();
        GzDecoder::new(&gz[..]).read_to_end(&mut raw).unwrap();
        let p = proto::Profile::decode(&raw[..]).unwrap();
        let s = |i: i64| p.string_table[i as usize].as_str();
        let types: Vec<(&str, &str)> = p.sample_type.iter().map(|t| (s(t.r#type), s(t.unit))).collect();
        assert_eq!(types, [("resident_growth", "bytes"), ("resident_release", "bytes")]);
        assert_eq!(s(p.default_sample_type), "resident_growth");
        assert_eq!(p.period, 256 << 10);
        let sum = |i: usize| p.sample.iter().map(|x| x.value[i]).sum::<i64>();
        assert_eq!((sum(0), sum(1)), (300 << 20, 101 << 20));
        // Python stacks start at their Python leaf: the interpreter frame is left out.
        let names: Vec<&str> = p.function.iter().map(|f| s(f.name)).collect();
        assert!(!names.contains(&"_PyEval_EvalFrameDefault") && names.contains(&"keep"), "{names:?}");
        for x in &p.sample {
            assert!(x.label.iter().any(|l| s(l.key) == "process" && s(l.str) == "demo"));
        }
    }
}
