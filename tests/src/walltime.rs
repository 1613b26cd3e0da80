//! Wall-time accounting: the per-thread breakdown of a JSON report.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::Report;

/// The wall-time breakdown of one thread (`threads[]` of a JSON report).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadTimes {
    pub pid: u64,
    pub tid: u64,
    pub comm: String,
    pub wall_ns: u64,
    pub on_cpu_ns: u64,
    pub syscall_ns: u64,
    pub io_ns: u64,
    pub lock_ns: u64,
    pub poll_ns: u64,
    pub sleep_ns: u64,
    pub other_ns: u64,
    /// Off-CPU reasons beyond the five above (e.g. `gil_ns`), by field name.
    pub extra_off_cpu: BTreeMap<String, u64>,
    pub runqueue_ns: u64,
}

impl ThreadTimes {
    /// Parses one `threads[]` entry; panics on a missing or mistyped field.
    #[track_caller]
    pub fn from_json(v: &Value) -> ThreadTimes {
        let u = |x: &Value, what: &str| -> u64 {
            x.as_u64()
                .unwrap_or_else(|| panic!("threads[]: {what} is not a u64: {v}"))
        };
        let off = &v["off_cpu"];
        let known = ["io_ns", "lock_ns", "poll_ns", "sleep_ns", "other_ns"];
        let extra_off_cpu = off
            .as_object()
            .unwrap_or_else(|| panic!("threads[]: off_cpu is not an object: {v}"))
            .iter()
            // `*_ns` reasons; objects (`memory`) break one of them down.
            .filter(|(k, _)| !known.contains(&k.as_str()) && k.ends_with("_ns"))
            .map(|(k, x)| (k.clone(), u(x, k)))
            .collect();
        ThreadTimes {
            pid: u(&v["pid"], "pid"),
            tid: u(&v["tid"], "tid"),
            comm: v["comm"]
                .as_str()
                .unwrap_or_else(|| panic!("threads[]: comm: {v}"))
                .to_string(),
            wall_ns: u(&v["wall_ns"], "wall_ns"),
            on_cpu_ns: u(&v["on_cpu_ns"], "on_cpu_ns"),
            syscall_ns: u(&v["syscall_ns"], "syscall_ns"),
            io_ns: u(&off["io_ns"], "off_cpu.io_ns"),
            lock_ns: u(&off["lock_ns"], "off_cpu.lock_ns"),
            poll_ns: u(&off["poll_ns"], "off_cpu.poll_ns"),
            sleep_ns: u(&off["sleep_ns"], "off_cpu.sleep_ns"),
            other_ns: u(&off["other_ns"], "off_cpu.other_ns"),
            extra_off_cpu,
            runqueue_ns: u(&v["runqueue_ns"], "runqueue_ns"),
        }
    }

    pub fn off_cpu_ns(&self) -> u64 {
        self.io_ns
            + self.lock_ns
            + self.poll_ns
            + self.sleep_ns
            + self.other_ns
            + self.extra_off_cpu.values().sum::<u64>()
    }

    /// on-CPU + off-CPU (all reasons) + run-queue: should equal `wall_ns`.
    pub fn parts_ns(&self) -> u64 {
        self.on_cpu_ns + self.off_cpu_ns() + self.runqueue_ns
    }

    /// The categories as (name, ns): on_cpu, io, lock, poll, sleep, other,
    /// any further off-CPU reasons (name without `_ns`), runqueue.
    pub fn categories(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = [
            ("on_cpu", self.on_cpu_ns),
            ("io", self.io_ns),
            ("lock", self.lock_ns),
            ("poll", self.poll_ns),
            ("sleep", self.sleep_ns),
            ("other", self.other_ns),
        ]
        .into_iter()
        .map(|(k, n)| (k.to_string(), n))
        .collect();
        for (k, n) in &self.extra_off_cpu {
            v.push((k.trim_end_matches("_ns").to_string(), *n));
        }
        v.push(("runqueue".to_string(), self.runqueue_ns));
        v
    }

    /// The largest category (first one on a tie).
    pub fn dominant(&self) -> (String, u64) {
        let mut best = (String::new(), 0);
        for x in self.categories() {
            if x.1 > best.1 || best.0.is_empty() {
                best = x;
            }
        }
        best
    }

    /// One line, in milliseconds, for assertion messages.
    pub fn describe(&self) -> String {
        let ms = |n: u64| n as f64 / 1e6;
        let extra: String = self
            .extra_off_cpu
            .iter()
            .map(|(k, n)| format!(" + {} {:.3}", k.trim_end_matches("_ns"), ms(*n)))
            .collect();
        format!(
            "{} (pid {} tid {}): wall {:.3} ms = on_cpu {:.3} (syscall {:.3}) + io {:.3} + lock {:.3} + poll {:.3} + sleep {:.3} + other {:.3}{extra} + runqueue {:.3} [parts {:.3}]",
            self.comm,
            self.pid,
            self.tid,
            ms(self.wall_ns),
            ms(self.on_cpu_ns),
            ms(self.syscall_ns),
            ms(self.io_ns),
            ms(self.lock_ns),
            ms(self.poll_ns),
            ms(self.sleep_ns),
            ms(self.other_ns),
            ms(self.runqueue_ns),
            ms(self.parts_ns()),
        )
    }
}

impl Report {
    /// `threads[]`.
    pub fn threads(&self) -> &Vec<Value> {
        self.0["threads"].as_array().expect("threads array")
    }

    /// `stacks[]`.
    pub fn stacks(&self) -> &Vec<Value> {
        self.0["stacks"].as_array().expect("stacks array")
    }

    /// Every thread's breakdown.
    pub fn thread_times(&self) -> Vec<ThreadTimes> {
        self.threads().iter().map(ThreadTimes::from_json).collect()
    }

    /// The threads named `comm`.
    pub fn threads_named(&self, comm: &str) -> Vec<ThreadTimes> {
        self.thread_times()
            .into_iter()
            .filter(|t| t.comm == comm)
            .collect()
    }

    /// The only thread named `comm`.
    #[track_caller]
    pub fn thread_named(&self, comm: &str) -> ThreadTimes {
        let mut v = self.threads_named(comm);
        assert_eq!(
            v.len(),
            1,
            "expected one thread named {comm:?}; threads:\n{}",
            self.describe_threads()
        );
        v.pop().unwrap()
    }

    /// All threads, one [`ThreadTimes::describe`] line each.
    pub fn describe_threads(&self) -> String {
        self.thread_times()
            .iter()
            .map(|t| format!("  {}", t.describe()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The stacks of `kind` (`"cpu"` or `"off_cpu"`).
    pub fn stacks_of_kind(&self, kind: &str) -> Vec<&Value> {
        self.stacks().iter().filter(|s| s["kind"] == kind).collect()
    }

    /// CPU samples summed by leaf function (first frame's `function`).
    pub fn cpu_samples_by_leaf(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for s in self.stacks_of_kind("cpu") {
            let leaf = s["frames"][0]["function"]
                .as_str()
                .unwrap_or("<no frames>")
                .to_string();
            *m.entry(leaf).or_insert(0) += s["samples"].as_u64().unwrap_or(0);
        }
        m
    }

    /// Checks the wall-time parts of the report: field types, `threads[]`
    /// parts adding up to `wall_ns` within `tolerance` (a fraction; the issue
    /// says 2%), `syscall_ns <= on_cpu_ns`, the stacks' schema, 40-bucket
    /// run-queue histograms, an integer `sample_hz`.
    #[track_caller]
    pub fn check_walltime_invariants(&self, tolerance: f64) {
        let r = &self.0;
        assert!(r["sample_hz"].is_u64(), "sample_hz\n{r}");
        let hists = r["runqueue_hist_log2_ns"]
            .as_object()
            .unwrap_or_else(|| panic!("runqueue_hist_log2_ns is not an object\n{r}"));
        for (pid, h) in hists {
            assert!(pid.parse::<u32>().is_ok(), "runqueue hist key {pid:?}");
            let h = h
                .as_array()
                .unwrap_or_else(|| panic!("runqueue hist of {pid}: {h}"));
            assert_eq!(
                h.len(),
                40,
                "runqueue hist of {pid} has {} buckets",
                h.len()
            );
            assert!(h.iter().all(Value::is_u64), "runqueue hist of {pid}: {h:?}");
        }
        let mut problems = Vec::new();
        for t in self.thread_times() {
            let parts = t.parts_ns() as f64;
            let wall = t.wall_ns as f64;
            if (parts - wall).abs() > tolerance * wall.max(1.0) {
                problems.push(format!(
                    "parts {} ns != wall {} ns (off by {:.2}%): {}",
                    t.parts_ns(),
                    t.wall_ns,
                    (parts - wall).abs() / wall.max(1.0) * 100.0,
                    t.describe()
                ));
            }
            if t.syscall_ns > t.on_cpu_ns {
                problems.push(format!(
                    "syscall_ns {} > on_cpu_ns {}: {}",
                    t.syscall_ns,
                    t.on_cpu_ns,
                    t.describe()
                ));
            }
        }
        assert!(
            problems.is_empty(),
            "wall-time invariants violated:\n  {}\nall threads:\n{}",
            problems.join("\n  "),
            self.describe_threads()
        );
        for s in self.stacks() {
            let kind = s["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("stack kind: {s}"));
            assert!(s["pid"].is_u64() && s["tid"].is_u64(), "stack pid/tid: {s}");
            assert!(
                s["samples"].is_u64() && s["weight_ns"].is_u64(),
                "stack weights: {s}"
            );
            match kind {
                "cpu" => {
                    assert!(s["reason"].is_null(), "cpu stack with a reason: {s}");
                    assert!(
                        s["samples"].as_u64().unwrap() > 0,
                        "cpu stack without samples: {s}"
                    );
                }
                "off_cpu" => {
                    // io, lock, poll, sleep, other (and reasons added later).
                    assert!(
                        s["reason"].as_str().is_some_and(|r| !r.is_empty()),
                        "off_cpu stack reason: {s}"
                    );
                }
                // Kinds added after cpu/off_cpu: only the common fields.
                _ => {}
            }
            let frames = s["frames"]
                .as_array()
                .unwrap_or_else(|| panic!("stack frames: {s}"));
            for f in frames {
                assert!(f["function"].is_string(), "frame function: {f}");
                assert!(
                    f["kind"].as_str().is_some_and(|k| !k.is_empty()),
                    "frame kind: {f}"
                );
                assert!(
                    f["file"].is_string() || f["file"].is_null(),
                    "frame file: {f}"
                );
                assert!(f["line"].is_u64() || f["line"].is_null(), "frame line: {f}");
            }
        }
    }
}

/// Parses the `thread <comm> tid <tid> cpu_ns <ns>` lines the walltime
/// workload prints on stderr: comm -> (tid, own CPU time in ns).
pub fn parse_thread_lines(text: &str) -> BTreeMap<String, (u64, u64)> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() == 6 && t[0] == "thread" && t[2] == "tid" && t[4] == "cpu_ns" {
            if let (Ok(tid), Ok(cpu)) = (t[3].parse(), t[5].parse()) {
                m.insert(t[1].to_string(), (tid, cpu));
            }
        }
    }
    m
}
