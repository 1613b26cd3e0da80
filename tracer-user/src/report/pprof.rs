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
//! (as in the speedscope output). `--profile` does not apply: all three types are in the file.

use std::{
    collections::HashMap,
    io::Write,
};

use flate2::{write::GzEncoder, Compression};
use prost::Message;

use super::{
    folded::Profile,
    speedscope::{thread_name, thread_names, weighted},
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

/// The profile of `rec` (not yet encoded).
pub fn profile(rec: &Recording) -> proto::Profile {
    let mut strings = Strings::new();
    let names = thread_names(rec);
    let vt = |s: &mut Strings, t: &str, u: &str| proto::ValueType { r#type: s.get(t), unit: s.get(u) };
    let sample_type = vec![vt(&mut strings, "samples", "count"), vt(&mut strings, "cpu", "nanoseconds"), vt(&mut strings, "off_cpu", "nanoseconds")];
    let period = 1_000_000_000u64.checked_div(rec.sample_hz).unwrap_or(0);
    let period_type = Some(vt(&mut strings, "cpu", "nanoseconds"));
    let default_sample_type = strings.get("cpu");

    let mut functions: Vec<proto::Function> = Vec::new();
    let mut function_ids: HashMap<(String, String), u64> = HashMap::new();
    let mut locations: Vec<proto::Location> = Vec::new();
    let mut location_ids: HashMap<&Frame, u64> = HashMap::new();
    let mut samples = Vec::new();
    let keys = (strings.get("thread"), strings.get("pid"), strings.get("tid"), strings.get("off_cpu_reason"));
    // Wall holds every CPU sample and every off-CPU stack once.
    for w in weighted(rec, Profile::Wall) {
        let mut ids = Vec::with_capacity(w.frames.len());
        for f in w.frames {
            if let Some(id) = location_ids.get(f) {
                ids.push(*id);
                continue;
            }
            let mut name = if f.function.is_empty() { crate::recording::UNKNOWN.to_owned() } else { f.function.clone() };
            if f.kind == FrameKind::Kernel {
                name.push_str(" [kernel]");
            }
            let file = f.file.clone().or_else(|| f.module.clone()).unwrap_or_default();
            let fid = *function_ids.entry((name.clone(), file.clone())).or_insert_with(|| {
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
            let id = locations.len() as u64 + 1;
            locations.push(proto::Location {
                id,
                mapping_id: 0,
                address: 0,
                line: vec![proto::Line { function_id: fid, line: f.line.map_or(0, i64::from) }],
                is_folded: false,
            });
            location_ids.insert(f, id);
            ids.push(id);
        }
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
    proto::Profile {
        sample_type,
        sample: samples,
        mapping: Vec::new(),
        location: locations,
        function: functions,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos: to_i64(rec.started_unix_ms.saturating_mul(1_000_000)),
        duration_nanos: to_i64(rec.duration_ns),
        period_type,
        period: to_i64(period),
        comment: Vec::new(),
        default_sample_type,
        string_table: strings.table,
    }
}

/// The gzipped, encoded profile of `rec`.
pub fn render(rec: &Recording) -> std::io::Result<Vec<u8>> {
    let bytes = profile(rec).encode_to_vec();
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
        let gz = render(&rec).unwrap();
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
}
