//! Who held the GIL while threads waited for it (docs/verdict.md#gil-holders):
//! the recording's GIL waits by holder (`Recording::gil_holders`, read in
//! the kernel when each wait began), summed per holder thread, what it was
//! doing and its line, and the findings for holders that block with the
//! GIL held.
//!
//! What the holder was doing, from its state when the wait began:
//! - `cuda_call`: blocked inside a CUDA or NCCL call (a native frame of the
//!   CUDA API, or its Python line is one the CUDA call table shows syncing);
//! - `native_call`: blocked in native code that keeps the GIL (a
//!   `ctypes.PyDLL` call, an extension that does not release it: CPython
//!   releases it around its own blocking calls), its stack has native
//!   frames; named by its innermost named native frame (without unwinding
//!   through the C library that is often the libc wrapper, e.g.
//!   `clock_nanosleep` for `usleep`); a native stack the kernel could not
//!   store (`[stack lost]`) still makes it native, unnamed;
//! - `syscall`: blocked in a syscall with no native stack at all (none
//!   was taken), the syscall named;
//! - `python`: running or waiting for a CPU (Python code, or native code
//!   that keeps the GIL while it computes): ordinary contention.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{ratio, CudaSites, FindingRef};
use crate::recording::{attribution::{self as sites, SiteRef}, cuda::CallClass, FrameKind, GilHold, Recording};

/// Holders kept per scope, most wait first.
pub const TOP_HOLDERS: usize = 3;
/// A blocked holder gets a finding when it holds this share of the
/// scope's GIL waits at least; `high` from [`HIGH_SHARE`].
pub const FINDING_MIN_SHARE: f64 = 0.2;
pub const HIGH_SHARE: f64 = 0.5;

/// One holder of the GIL, over the waits of a thread or a process
/// (`bottleneck.gil_holders` in JSON).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GilHolderShare {
    pub holder_tid: u32,
    #[serde(default)]
    pub holder_comm: String,
    /// `native_call`, `syscall`, `cuda_call` or `python` (module doc).
    pub doing: String,
    /// The native function it was blocked in (`native_call`, `cuda_call`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// The syscall it was blocked in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscall: Option<String>,
    /// Its Python line (user code where there is some).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<SiteRef>,
    /// GIL wait of the scope's threads while it held the GIL.
    pub wait_ns: u64,
    /// Of the scope's GIL waits whose holder is known.
    pub share: f64,
}

impl GilHolderShare {
    /// `in a native call (clock_nanosleep, blocked in clock_nanosleep)`.
    pub fn what(&self) -> String {
        let mut detail: Vec<String> = Vec::new();
        if let Some(f) = &self.function {
            detail.push(f.clone());
        }
        if let Some(s) = &self.syscall {
            detail.push(format!("blocked in {s}"));
        }
        let detail = if detail.is_empty() { String::new() } else { format!(" ({})", detail.join(", ")) };
        match self.doing.as_str() {
            "native_call" => format!("in a native call{detail}, not releasing the GIL"),
            "syscall" => format!("in a syscall{detail}, not releasing the GIL"),
            "cuda_call" => format!("in a CUDA call{detail}, not releasing the GIL"),
            _ => "running Python code".to_owned(),
        }
    }

    /// The finding kind of a blocked holder.
    pub fn finding_kind(&self) -> Option<&'static str> {
        match self.doing.as_str() {
            "native_call" => Some("gil_held_in_native_call"),
            "syscall" => Some("gil_held_in_syscall"),
            "cuda_call" => Some("gil_held_in_cuda_call"),
            _ => None,
        }
    }

    /// Advice for a GIL bottleneck this holder causes.
    pub fn advice(&self) -> String {
        let at = self.site.as_ref().map(|s| format!(" at {}", s.short())).unwrap_or_default();
        match self.doing.as_str() {
            "native_call" => format!(
                "thread {} holds the GIL while it blocks in native code{at}: call it so that the GIL is released (ctypes.CDLL instead of ctypes.PyDLL; in an extension, Py_BEGIN_ALLOW_THREADS / Cython `with nogil` around the blocking part), or move it to another process",
                self.holder_tid
            ),
            "syscall" => format!(
                "thread {} holds the GIL while it blocks in a syscall{at}: release the GIL around the blocking call (Py_BEGIN_ALLOW_THREADS in the extension that makes it), or make the call from another process",
                self.holder_tid
            ),
            "cuda_call" => format!(
                "thread {} holds the GIL while it waits for the GPU{at}: every other Python thread stops meanwhile (NCCL watchdogs time out this way); release the GIL around synchronizes and collectives in the extension (torch does for its own), or sync less often",
                self.holder_tid
            ),
            _ => format!(
                "Python threads take turns on the GIL, mostly with thread {}{at}: use processes (multiprocessing), fewer Python threads, or native code that releases the GIL",
                self.holder_tid
            ),
        }
    }
}

/// `__GI___clock_nanosleep` -> `clock_nanosleep`.
fn clean(name: &str) -> String {
    let mut n = name;
    for p in ["__GI___", "__GI_", "__libc_", "__"] {
        if let Some(rest) = n.strip_prefix(p) {
            n = rest;
            break;
        }
    }
    n.to_owned()
}

/// What a holder was doing: (`doing`, native function).
fn doing(h: &GilHold, cuda: Option<&CudaSites>) -> (&'static str, Option<String>) {
    if h.holder_state != "blocked" {
        return ("python", None);
    }
    let native = h.frames.iter().filter(|f| f.kind == FrameKind::Native && !f.function.starts_with('['));
    for f in native.clone() {
        if !matches!(CallClass::of_symbol(&f.function), CallClass::Other) || f.function.starts_with("nccl") {
            return ("cuda_call", Some(f.function.clone()));
        }
    }
    let py_line = h.frames.iter().find(|f| f.kind == FrameKind::Python).and_then(super::frame_key);
    if let (Some(c), Some(k)) = (cuda, &py_line) {
        if c.sync.contains(k) || c.collective.contains(k) || c.copy.contains(k) {
            return ("cuda_call", None);
        }
    }
    // Blocked with the GIL held: CPython releases it around its own
    // blocking calls, so native code keeps it; named when a frame is.
    if let Some(f) = native.clone().next() {
        return ("native_call", Some(clean(&f.function)));
    }
    if h.frames.iter().any(|f| f.kind == FrameKind::Native) {
        return ("native_call", None);
    }
    ("syscall", None)
}

/// The holders of the GIL waits of process `pid` (of its thread `tid`
/// when given), most wait first, at most [`TOP_HOLDERS`]. Waits whose
/// holder is unknown (its state not published yet, or the waiter itself
/// as the last holder) are left out of the shares.
pub(super) fn holders(rec: &Recording, pid: u32, tid: Option<u32>, cuda: Option<&CudaSites>) -> Vec<GilHolderShare> {
    let mine = rec.gil_holders.iter().filter(|h| h.pid == pid && tid.is_none_or(|t| h.tid == t) && h.holder_tid != 0 && h.holder_tid != h.tid);
    // Per (holder, what it did): the time, and per line (the line with the most names it).
    type Key = (u32, &'static str, Option<String>, Option<String>);
    let mut by: BTreeMap<Key, (u64, BTreeMap<Option<SiteRef>, u64>)> = BTreeMap::new();
    let mut total = 0u64;
    for h in mine {
        let (what, function) = doing(h, cuda);
        let site = sites::charge(&h.frames).map(|c| c.site).filter(|s| s.kind == "python");
        let syscall = if what == "python" { None } else { h.syscall.clone() };
        let e = by.entry((h.holder_tid, what, function, syscall)).or_default();
        e.0 = e.0.saturating_add(h.wait_ns);
        *e.1.entry(site).or_default() += h.wait_ns;
        total = total.saturating_add(h.wait_ns);
    }
    let comm = |t: u32| rec.threads.iter().find(|x| x.pid == pid && x.tid == t).map(|x| x.comm.clone()).unwrap_or_default();
    let mut v: Vec<GilHolderShare> = by
        .into_iter()
        .map(|((holder_tid, what, function, syscall), (ns, lines))| GilHolderShare {
            holder_tid,
            holder_comm: comm(holder_tid),
            doing: what.to_owned(),
            function,
            syscall,
            site: lines.into_iter().max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0))).and_then(|(s, _)| s),
            wait_ns: ns,
            share: ratio(ns, total),
        })
        .collect();
    v.sort_by(|a, b| b.wait_ns.cmp(&a.wait_ns).then(a.holder_tid.cmp(&b.holder_tid)));
    v.truncate(TOP_HOLDERS);
    v
}

/// The findings of blocked holders with at least [`FINDING_MIN_SHARE`].
pub(super) fn findings(holders: &[GilHolderShare]) -> Vec<FindingRef> {
    holders
        .iter()
        .filter(|h| h.share >= FINDING_MIN_SHARE)
        .filter_map(|h| {
            let kind = h.finding_kind()?;
            Some(FindingRef {
                kind: kind.to_owned(),
                severity: if h.share >= HIGH_SHARE { "high" } else { "medium" }.to_owned(),
                site: h.site.as_ref().map(|s| s.short()).unwrap_or_else(|| format!("thread {}", h.holder_tid)),
                advice: h.advice(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::{Frame, STACK_LOST};

    fn frame(function: &str, kind: FrameKind) -> Frame {
        Frame { function: function.into(), file: Some("holder.py".into()), line: Some(3), kind, module: None }
    }

    fn blocked(frames: Vec<Frame>) -> GilHold {
        GilHold {
            pid: 1,
            tid: 2,
            holder_tid: 3,
            holder_state: "blocked".into(),
            syscall: Some("clock_nanosleep".into()),
            frames,
            wait_ns: 1,
            waits: 1,
        }
    }

    #[test]
    fn a_blocked_holder_is_in_native_code_even_when_its_native_stack_was_lost() {
        let py = frame("holder_native", FrameKind::Python);
        let named = blocked(vec![frame("__GI___clock_nanosleep", FrameKind::Native), py.clone()]);
        assert_eq!(doing(&named, None), ("native_call", Some("clock_nanosleep".to_owned())));
        // The kernel could not store its native stack (a stack-map collision).
        let lost = blocked(vec![frame(STACK_LOST, FrameKind::Native), py.clone()]);
        assert_eq!(doing(&lost, None), ("native_call", None));
        // No native stack was taken at all: only the syscall is known.
        assert_eq!(doing(&blocked(vec![py]), None), ("syscall", None));
    }
}
