//! One probe hit per runtime call: the driver's (libcuda's) probes, per
//! process and per function, taken off where a process reaches a driver
//! function only through its runtime (docs/cuda.md, "One probe hit per
//! runtime call").
//!
//! A runtime call (`cudaMemcpyAsync`) enters the driver (`cuMemcpy*`)
//! inside: with both probed, every runtime call pays two uprobe traps (four
//! with the returns), and the driver's hit is only counted as nested. But
//! real programs also call the driver directly (cuBLAS, Triton's
//! `cuLaunchKernel`, PyTorch's driver entry points), so the driver cannot
//! simply go unprobed. Here, with multi-uprobe links (they take a pid),
//! each target process gets its own driver probes, one link per function
//! and kind; the kernel counts per (process, driver function) the hits made
//! inside a probed call and the direct ones (`CUDA_DRV_ROUTE`). Once a
//! function has been entered [`HOT_NESTED`] times from inside runtime calls
//! and never directly, its probes are closed for that process: the kernel
//! no longer plants the breakpoint there, so its runtime calls trap once.
//! Every [`RECHECK_EVERY_NS`] the function is probed again for
//! [`RECHECK_SLICE_NS`]: a direct call seen then keeps it probed from then
//! on. What was off, when, and for how long is in the report
//! (`cuda.driver_probes_off`, and a note): direct calls made while a
//! function was off are not counted, and the report says so.
//!
//! Rarely used functions (allocations, frees, peer copies) never reach
//! [`HOT_NESTED`]: their direct calls stay exact. Launch functions
//! (`cuLaunchKernel`, `cuLaunchKernelEx`, `cuLaunchCooperativeKernel`,
//! `cuGraphLaunch`, their `_ptsz` forms) are never taken off: a process that launches through its
//! runtime for a long while often starts launching directly later (Triton
//! kernels compiled after a warm-up, cuBLAS, CuPy), and those launches
//! would go uncounted until a re-check. Launches have no return probe, so
//! a runtime launch pays one more entry trap for it (two in all; more where
//! the driver's own launch functions call each other), and the kernel's
//! `nested_launch` keeps it counted once, whatever driver function the
//! runtime forwards to. Without multi-uprobe
//! links the driver stays probed in every process (two hits per runtime
//! call, every call counted).

use std::{
    collections::HashMap,
    fs::File,
    os::fd::{AsRawFd, OwnedFd},
    path::PathBuf,
};

use aya::maps::HashMap as BpfHashMap;
use tracer_common::cuda::api;

use super::{programs::CudaProbes, slicer::LaunchSlicer};
use crate::{
    os::clock,
    engine::{Cx, Topic},
    os::probe::{self, ProbeError},
    os::procfs,
    recording::cuda::DriverProbesOff,
};

use super::{HOT_NESTED, RECHECK_EVERY_NS};
/// How long a re-check probes it.
pub const RECHECK_SLICE_NS: u64 = 200_000_000;

type Identity = (u64, u64);

/// A driver library probed per process, kept open: every attachment goes
/// through `/proc/self/fd/N` of this very file.
struct GateFile {
    file: File,
    shown: String,
    symbols: Vec<(u32, u64)>,
}

#[derive(Default)]
struct FnState {
    /// Its links in this process, entry first (empty while off).
    links: Vec<OwnedFd>,
    /// Off since then (monotonic ns).
    off_since: Option<u64>,
    /// Probed again for a re-check since then.
    check_since: Option<u64>,
    /// Index of its record in [`DriverGate::records`], once it went off.
    record: Option<usize>,
    /// Nanoseconds off in all, before `off_since`.
    off_ns: u64,
}

#[derive(Default)]
pub(super) struct DriverGate {
    files: HashMap<Identity, GateFile>,
    /// (pid, driver file) -> function id -> state.
    procs: HashMap<(u32, Identity), HashMap<u32, FnState>>,
    records: Vec<(DriverProbesOff, u64)>,
}

impl DriverGate {
    /// Drops the probes kept per process for these (gone) processes:
    /// their links close with them.
    pub fn forget(&mut self, pids: &std::collections::HashSet<u32>) {
        self.procs.retain(|(pid, _), _| !pids.contains(pid));
    }

    /// Takes a driver library to probe per process from now on.
    pub fn register(
        &mut self,
        identity: Identity,
        file: File,
        shown: &str,
        symbols: &[(u32, u64)],
    ) {
        self.files.entry(identity).or_insert_with(|| GateFile {
            file,
            shown: shown.to_owned(),
            symbols: symbols.to_vec(),
        });
    }

    /// Probes every function of the driver library `identity` in `pid`
    /// (those not probed there yet). Returns the functions probed and what
    /// failed.
    ///
    /// With a `slicer` (`--max-overhead`), the launch functions go to it,
    /// probed in time slices, and stay out of the gate's own decisions.
    pub fn attach(
        &mut self,
        probes: &CudaProbes,
        pid: u32,
        identity: Identity,
        slicer: Option<&LaunchSlicer>,
    ) -> (Vec<&'static str>, Vec<String>) {
        let Some(f) = self.files.get(&identity) else {
            return (Vec::new(), Vec::new());
        };
        let path = PathBuf::from(format!("/proc/self/fd/{}", f.file.as_raw_fd()));
        let fns = self.procs.entry((pid, identity)).or_default();
        let (mut done, mut errors) = (Vec::new(), Vec::new());
        for &(id, offset) in &f.symbols {
            if fns.contains_key(&id) {
                done.push(api::NAMES[id as usize]);
                continue;
            }
            if let Some(slicer) = slicer.filter(|_| api::is_launch(id)) {
                let added = probes
                    .slice_targets(&f.file, &f.shown, &[(id, offset)], Some(pid))
                    .and_then(|ts| ts.into_iter().try_for_each(|t| slicer.add(t)));
                match added {
                    // Inert here: no links, never off.
                    Ok(()) => {
                        fns.insert(id, FnState::default());
                        done.push(api::NAMES[id as usize]);
                    }
                    Err(e) => errors.push(e),
                }
                continue;
            }
            match probes.attach_for_pid(&path, id, offset, pid) {
                Ok(links) => {
                    fns.insert(
                        id,
                        FnState {
                            links,
                            ..Default::default()
                        },
                    );
                    done.push(api::NAMES[id as usize]);
                }
                Err(e) => errors.push(e),
            }
        }
        (done, errors)
    }

    /// [`attach`](Self::attach) for every driver library known, in a target
    /// that uses CUDA (it may load the driver later: a pid-scoped probe on
    /// a file it never maps costs it nothing).
    pub fn attach_all(&mut self, probes: &CudaProbes, pid: u32, slicer: Option<&LaunchSlicer>) -> Vec<String> {
        let ids: Vec<Identity> = self
            .files
            .keys()
            .copied()
            .filter(|id| !self.procs.contains_key(&(pid, *id)))
            .collect();
        let mut errors = Vec::new();
        for id in ids {
            errors.extend(self.attach(probes, pid, id, slicer).1);
        }
        errors
    }

    /// Takes probes off, re-checks and puts them back, from the kernel's
    /// counts; forgets processes that exited. Closing a link waits for the
    /// kernel (tens of ms): that happens on a thread of its own.
    pub fn poll(&mut self, probes: &CudaProbes, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        if self.procs.is_empty() {
            return Ok(());
        }
        let now = clock::monotonic_ns();
        let route: HashMap<u64, [u64; 2]> = {
            let map: BpfHashMap<_, u64, [u64; 2]> =
                probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::CUDA_DRV_ROUTE)?;
            map.iter().filter_map(Result::ok).collect()
        };
        let mut closing: Vec<OwnedFd> = Vec::new();
        let mut gone = Vec::new();
        for (&(pid, identity), fns) in self.procs.iter_mut() {
            if !procfs::exists(pid) {
                gone.push((pid, identity));
                continue;
            }
            let Some(file) = self.files.get(&identity) else {
                continue;
            };
            for (&id, st) in fns.iter_mut() {
                let [nested, direct] = route
                    .get(&((u64::from(pid) << 32) | u64::from(id)))
                    .copied()
                    .unwrap_or([0, 0]);
                let name = api::NAMES[id as usize];
                let window_s = |t: u64| t.saturating_sub(cx.window.start) as f64 / 1e9;
                if let Some(since) = st.off_since {
                    // Off: probed again for a re-check when it is time.
                    if now.saturating_sub(since) < RECHECK_EVERY_NS {
                        continue;
                    }
                    let path = PathBuf::from(format!("/proc/self/fd/{}", file.file.as_raw_fd()));
                    let offset = file.symbols.iter().find(|s| s.0 == id).map_or(0, |s| s.1);
                    match probes.attach_for_pid(&path, id, offset, pid) {
                        Ok(links) => {
                            st.links = links;
                            st.off_ns += now.saturating_sub(since);
                            st.off_since = None;
                            st.check_since = Some(now);
                        }
                        Err(e) => cx.sink.note_on(
                            Topic::Gpu,
                            format!("pid {pid}: re-checking {name} for direct calls: {e}"),
                        ),
                    }
                    continue;
                }
                if let Some(since) = st.check_since {
                    if direct > 0 {
                        // A direct call: probed for good.
                        st.check_since = None;
                        if let Some(r) = st.record.and_then(|i| self.records.get_mut(i)) {
                            r.0.direct_seen_at_s = Some(window_s(now));
                            r.0.off_s = st.off_ns as f64 / 1e9;
                            cx.sink.note_on(Topic::Gpu, format!(
                                "pid {pid}: a re-check saw direct calls of {name}: probed again from {:.2} s; \
                                 direct calls it made in the {:.2} s it was off were not counted",
                                window_s(now),
                                r.0.off_s
                            ));
                        }
                    } else if now.saturating_sub(since) >= RECHECK_SLICE_NS {
                        closing.append(&mut st.links);
                        st.check_since = None;
                        st.off_since = Some(now);
                        if let Some(r) = st.record.and_then(|i| self.records.get_mut(i)) {
                            r.0.rechecks += 1;
                        }
                    }
                    continue;
                }
                // Launch functions never come off (module doc).
                if st.record.is_none()
                    && !api::entry_only(id)
                    && direct == 0
                    && nested >= HOT_NESTED
                    && !st.links.is_empty()
                {
                    closing.append(&mut st.links);
                    st.off_since = Some(now);
                    let off_at_s = window_s(now);
                    cx.sink.note_on(Topic::Gpu, format!(
                        "pid {pid}: CUDA driver {name} reached only through the runtime ({nested} calls, none direct): \
                         no longer probed in this process from {off_at_s:.2} s (one probe hit per runtime call); \
                         re-checked for direct calls every {} s",
                        RECHECK_EVERY_NS / 1_000_000_000
                    ));
                    st.record = Some(self.records.len());
                    self.records.push((
                        DriverProbesOff {
                            pid,
                            function: name.to_owned(),
                            library: file.shown.clone(),
                            off_at_s,
                            calls_through_runtime: nested,
                            rechecks: 0,
                            direct_seen_at_s: None,
                            off_s: 0.0,
                        },
                        0,
                    ));
                }
            }
        }
        for key in gone {
            if let Some(fns) = self.procs.remove(&key) {
                for (_, mut st) in fns {
                    self.close_record(&mut st, now);
                    closing.append(&mut st.links);
                }
            }
        }
        if !closing.is_empty() {
            // Entry links close before return links (each function's are
            // in that order): a call in flight keeps its return probe.
            std::thread::spawn(move || drop(closing));
        }
        Ok(())
    }

    /// Adds the time off so far of a function whose process is gone.
    fn close_record(&mut self, st: &mut FnState, now: u64) {
        if let Some(since) = st.off_since.take() {
            st.off_ns += now.saturating_sub(since);
        }
        if let Some(r) = st.record.and_then(|i| self.records.get_mut(i)) {
            r.1 = st.off_ns;
        }
    }

    /// The records for the report, the time off counted up to `now`.
    pub fn records(&self, now: u64) -> Vec<DriverProbesOff> {
        let mut out: Vec<DriverProbesOff> = self
            .records
            .iter()
            .map(|(r, ended_off)| {
                let mut r = r.clone();
                r.off_s = r.off_s.max(*ended_off as f64 / 1e9);
                r
            })
            .collect();
        for fns in self.procs.values() {
            for st in fns.values() {
                let Some(r) = st.record.and_then(|i| out.get_mut(i)) else {
                    continue;
                };
                let open = st.off_since.map_or(0, |since| now.saturating_sub(since));
                r.off_s = (st.off_ns + open) as f64 / 1e9;
            }
        }
        out
    }

    /// Every link still open, to release with the other CUDA probes.
    pub fn take_links(&mut self) -> Vec<OwnedFd> {
        let now = clock::monotonic_ns();
        let mut out = Vec::new();
        let keys: Vec<(u32, Identity)> = self.procs.keys().copied().collect();
        for key in keys {
            let Some(mut fns) = self.procs.remove(&key) else {
                continue;
            };
            for st in fns.values_mut() {
                self.close_record(st, now);
                out.append(&mut st.links);
            }
        }
        out
    }
}
