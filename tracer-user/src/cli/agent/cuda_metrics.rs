//! The CUDA and GPU part of `/metrics`: per target, CUDA calls, bytes and
//! seconds by API and copy kind, kernel and graph launches by API,
//! seconds blocked in synchronize calls,
//! findings by kind and call site; per GPU, NVML's utilisation, memory and
//! PCIe throughput (gauges: the last sample of the window). Counters grow
//! by each window's differences (`cuda_delta`). Sites are bounded: at most
//! [`MAX_SITES`] finding sites per target have series of their own, the
//! rest are counted under `site="other"`.

use std::{
    collections::{HashMap, HashSet},
    sync::atomic::AtomicU64,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::labels::TargetLabels;
use crate::recording::cuda::{CallClass, CudaReport};

/// Finding sites per target with series of their own.
pub const MAX_SITES: usize = 20;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    #[prometheus(flatten)]
    pub target: TargetLabels,
    pub api: String,
    /// `HtoD`, `DtoH`, `DtoD`, `HtoH`, `Default` for copies; empty otherwise.
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FindingLabels {
    #[prometheus(flatten)]
    pub target: TargetLabels,
    pub kind: String,
    /// `file.py:LINE function`, or `other` past [`MAX_SITES`].
    pub site: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    #[prometheus(flatten)]
    pub target: TargetLabels,
    /// `tensors` or `reserved`.
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabels {
    pub gpu: String,
    pub name: String,
}

type FCounter = Counter<f64, AtomicU64>;

/// The API and finding label sets of one pid, and its target labels.
type PidSeries = (Vec<ApiLabels>, Vec<FindingLabels>, Option<TargetLabels>);

/// `tensors` or `reserved`, and the figures of that kind.
type HeldKind<'a> = (&'static str, u64, &'a [crate::recording::cuda::DeviceMemoryLine]);
type FGauge = Gauge<f64, AtomicU64>;

#[derive(Default)]
pub struct CudaMetrics {
    calls: Family<ApiLabels, Counter>,
    bytes: Family<ApiLabels, Counter>,
    seconds: Family<ApiLabels, FCounter>,
    errors: Family<ApiLabels, Counter>,
    /// Kernel launches (estimates under `--max-overhead`) and graph
    /// launches, by API (`kind` empty).
    launches: Family<ApiLabels, Counter>,
    graph_launches: Family<ApiLabels, Counter>,
    sync_seconds: Family<TargetLabels, FCounter>,
    /// Of the syncs' (and polling's) time, the waits on NCCL collectives.
    collective_wait_seconds: Family<TargetLabels, FCounter>,
    /// Queries (`cudaEventQuery`, `cudaStreamQuery`) that found the work
    /// not done: polls, by API.
    not_ready: Family<ApiLabels, Counter>,
    findings: Family<FindingLabels, Counter>,
    /// Device memory held per target and site (`kind`: `tensors` where
    /// PyTorch's allocator probes reported, `reserved` for what allocation
    /// calls hold), and per target in all.
    gpu_held: Family<FindingLabels, Gauge>,
    gpu_held_total: Family<KindLabels, Gauge>,
    gpu_util: Family<GpuLabels, FGauge>,
    gpu_mem_used: Family<GpuLabels, Gauge>,
    gpu_pcie_tx: Family<GpuLabels, Gauge>,
    gpu_pcie_rx: Family<GpuLabels, Gauge>,
    /// GPU index -> name (NVML gives it on the first sample only).
    gpu_names: HashMap<u32, String>,
    /// Per pid: the label sets it has series under.
    series: HashMap<u32, PidSeries>,
    /// Per pid: the finding sites that have series of their own.
    sites: HashMap<u32, HashSet<String>>,
}

impl CudaMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register("cuda_calls", "CUDA runtime/driver calls by API and copy kind (exact, counted in the kernel)", self.calls.clone());
        r.register("cuda_bytes", "Bytes copied (copies) or allocated (memory calls) by CUDA calls, by API and kind", self.bytes.clone());
        r.register("cuda_seconds", "Time inside CUDA calls, by API and kind", self.seconds.clone());
        r.register("cuda_errors", "CUDA calls that did not return success, by API and kind", self.errors.clone());
        r.register(
            "cuda_launches",
            "CUDA kernel launches by API (exact, counted in the kernel; estimates under --max-overhead)",
            self.launches.clone(),
        );
        r.register("cuda_graph_launches", "CUDA graph launches (cudaGraphLaunch, cuGraphLaunch) by API", self.graph_launches.clone());
        r.register("cuda_sync_seconds", "Time the target's threads were blocked in CUDA synchronize calls", self.sync_seconds.clone());
        r.register(
            "cuda_collective_wait_seconds",
            "Time the target's threads waited in CUDA syncs (or polling) for queued NCCL collectives",
            self.collective_wait_seconds.clone(),
        );
        r.register(
            "cuda_not_ready",
            "CUDA event/stream queries that found the GPU work not done (polls; not errors), by API",
            self.not_ready.clone(),
        );
        r.register("cuda_findings", "Occurrences of each CUDA finding (docs/cuda.md) by kind and call site", self.findings.clone());
        r.register(
            "gpu_memory_held_bytes",
            "Device memory a target holds now, by the line that allocated it (kind tensors: PyTorch's tensors; reserved: what allocation calls hold)",
            self.gpu_held.clone(),
        );
        r.register("gpu_memory_target_bytes", "Device memory a target holds now (kind tensors or reserved)", self.gpu_held_total.clone());
        r.register("gpu_utilization_ratio", "NVML GPU utilisation, last sample of the window (0 to 1)", self.gpu_util.clone());
        r.register("gpu_memory_used_bytes", "NVML device memory in use, last sample of the window", self.gpu_mem_used.clone());
        r.register("gpu_pcie_tx_bytes_per_second", "NVML PCIe throughput device to host, last sample", self.gpu_pcie_tx.clone());
        r.register("gpu_pcie_rx_bytes_per_second", "NVML PCIe throughput host to device, last sample", self.gpu_pcie_rx.clone());
    }

    /// Adds one window's CUDA differences; `labels` gives a target's labels.
    pub fn add_window(&mut self, c: &CudaReport, labels: &mut dyn FnMut(u32) -> TargetLabels) {
        for call in &c.calls {
            let target = labels(call.pid);
            let l = ApiLabels { target: target.clone(), api: call.api.clone(), kind: call.kind.clone().unwrap_or_default() };
            self.calls.get_or_create(&l).inc_by(call.count);
            self.bytes.get_or_create(&l).inc_by(call.bytes);
            self.seconds.get_or_create(&l).inc_by(call.total_ns as f64 / 1e9);
            self.errors.get_or_create(&l).inc_by(call.errors);
            if call.class() == CallClass::Sync {
                self.sync_seconds.get_or_create(&target).inc_by(call.total_ns as f64 / 1e9);
            }
            if let Some(n) = call.not_ready {
                self.not_ready.get_or_create(&l).inc_by(n);
            }
            if let (Some(ns), false) = (call.collective_wait_ns, call.class() == CallClass::Collective) {
                self.collective_wait_seconds.get_or_create(&target).inc_by(ns as f64 / 1e9);
            }
            if target.pid != "other" {
                let e = self.series.entry(call.pid).or_default();
                push_new(&mut e.0, l);
                e.2 = Some(target);
            }
        }
        let launches = c.launches.iter().map(|l| (l.pid, &l.api, l.count, &self.launches));
        let graphs = c.graph_launches.iter().map(|l| (l.pid, &l.api, l.count, &self.graph_launches));
        for (pid, api, count, family) in launches.chain(graphs) {
            let target = labels(pid);
            let l = ApiLabels { target: target.clone(), api: api.clone(), kind: String::new() };
            family.get_or_create(&l).inc_by(count);
            if target.pid != "other" {
                let e = self.series.entry(pid).or_default();
                push_new(&mut e.0, l);
                e.2 = Some(target);
            }
        }
        for f in &c.findings {
            let target = labels(f.pid);
            let site = site_name(&f.site);
            let own = self.sites.entry(f.pid).or_default();
            let site = if own.contains(&site) || own.len() < MAX_SITES {
                own.insert(site.clone());
                site
            } else {
                "other".to_owned()
            };
            let l = FindingLabels { target: target.clone(), kind: f.kind.clone(), site };
            self.findings.get_or_create(&l).inc_by(f.count);
            if target.pid != "other" {
                let e = self.series.entry(f.pid).or_default();
                push_new(&mut e.1, l);
                e.2 = Some(target);
            }
        }
        for d in &c.device_memory {
            let target = labels(d.pid);
            let mut kinds: Vec<HeldKind<'_>> = vec![("reserved", d.held_bytes, &d.lines)];
            if let Some(a) = d.allocated_bytes {
                kinds.push(("tensors", a, &d.tensor_lines));
            }
            for (kind, total, lines) in kinds {
                let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                self.gpu_held_total.get_or_create(&KindLabels { target: target.clone(), kind: kind.into() }).set(gauge(total));
                // Past the site bound, the rest of the target's holdings as `other`.
                let mut other = 0;
                let mut other_seen = false;
                for l in lines {
                    let site = site_name(&l.site);
                    let own = self.sites.entry(d.pid).or_default();
                    if own.contains(&site) || own.len() < MAX_SITES {
                        own.insert(site.clone());
                        self.set_held(&target, d.pid, kind, site, gauge(l.held_bytes));
                    } else {
                        other += l.held_bytes;
                        other_seen = true;
                    }
                }
                if other_seen {
                    self.set_held(&target, d.pid, kind, "other".into(), gauge(other));
                }
            }
        }
        for s in &c.gpu_samples {
            if let Some(n) = &s.name {
                self.gpu_names.insert(s.gpu, n.clone());
            }
        }
        // The last sample of each GPU in the window.
        let mut last: HashMap<u32, &crate::recording::cuda::GpuSample> = HashMap::new();
        for s in &c.gpu_samples {
            if last.get(&s.gpu).is_none_or(|l| l.ts_ns <= s.ts_ns) {
                last.insert(s.gpu, s);
            }
        }
        for (gpu, s) in last {
            let l = GpuLabels { gpu: gpu.to_string(), name: self.gpu_names.get(&gpu).cloned().unwrap_or_default() };
            self.gpu_util.get_or_create(&l).set(s.util_percent / 100.0);
            self.gpu_mem_used.get_or_create(&l).set(i64::try_from(s.mem_used_bytes).unwrap_or(i64::MAX));
            if let Some(v) = s.pcie_tx_bytes_per_s {
                self.gpu_pcie_tx.get_or_create(&l).set(i64::try_from(v).unwrap_or(i64::MAX));
            }
            if let Some(v) = s.pcie_rx_bytes_per_s {
                self.gpu_pcie_rx.get_or_create(&l).set(i64::try_from(v).unwrap_or(i64::MAX));
            }
        }
    }

    fn set_held(&mut self, target: &TargetLabels, pid: u32, kind: &str, site: String, bytes: i64) {
        let l = FindingLabels { target: target.clone(), kind: kind.into(), site };
        self.gpu_held.get_or_create(&l).set(bytes);
        if target.pid != "other" {
            let e = self.series.entry(pid).or_default();
            push_new(&mut e.1, l);
            e.2 = Some(target.clone());
        }
    }

    /// Removes the series of a target that is gone.
    pub fn forget(&mut self, pid: u32) {
        self.sites.remove(&pid);
        if let Some((apis, findings, target)) = self.series.remove(&pid) {
            for l in apis {
                self.calls.remove(&l);
                self.bytes.remove(&l);
                self.seconds.remove(&l);
                self.errors.remove(&l);
                self.launches.remove(&l);
                self.graph_launches.remove(&l);
                self.not_ready.remove(&l);
            }
            for l in findings {
                self.findings.remove(&l);
                self.gpu_held.remove(&l);
            }
            if let Some(t) = target {
                self.sync_seconds.remove(&t);
                self.collective_wait_seconds.remove(&t);
                for kind in ["tensors", "reserved"] {
                    self.gpu_held_total.remove(&KindLabels { target: t.clone(), kind: kind.into() });
                }
            }
        }
    }
}

/// Adds `l` to `v` unless it is there.
fn push_new<T: PartialEq>(v: &mut Vec<T>, l: T) {
    if !v.contains(&l) {
        v.push(l);
    }
}

fn site_name(s: &crate::recording::cuda::Site) -> String {
    super::labels::site_label(&s.function, s.file.as_deref(), s.line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::cuda::{CudaCall, CudaLaunch, Finding, GraphLaunch, Site};

    fn labels(pid: u32) -> TargetLabels {
        TargetLabels {
            pid: pid.to_string(),
            comm: "python3".into(),
            container_id: String::new(),
            pod_uid: String::new(),
            container_name: String::new(),
        }
    }

    #[test]
    fn counts_sync_time_and_bounds_sites() {
        let mut m = CudaMetrics::default();
        let mut r = Registry::default();
        m.register(&mut r);
        let site = |line| Site { function: "step".into(), file: Some("/app/m.py".into()), line: Some(line) };
        let call = |api: &str, count, ns| CudaCall {
            pid: 9,
            api: api.into(),
            kind: None,
            class: None,
            count,
            bytes: 0,
            total_ns: ns,
            errors: 0,
            site: site(1),
            return_codes: Default::default(),
            pinned: None,
            pageable: None,
            events_lost: 0,
            not_ready: None,
            poll_waits: None,
            poll_ns: None,
            collective_waits: None,
            collective_wait_ns: None,
        };
        let finding = |line| Finding {
            kind: "sync_after_copy".into(),
            severity: "high".into(),
            pid: 9,
            site: site(line),
            count: 2,
            bytes: 0,
            time_ns: 0,
            ..Default::default()
        };
        let c = CudaReport {
            calls: vec![call("cudaStreamSynchronize", 3, 2_000_000_000), call("cudaMemcpy", 4, 1_000_000_000)],
            findings: (0..MAX_SITES as u32 + 5).map(finding).collect(),
            ..Default::default()
        };
        m.add_window(&c, &mut labels);
        m.add_window(&c, &mut labels);
        let launches = CudaReport {
            launches: vec![CudaLaunch {
                pid: 9,
                kernel: "k".into(),
                count: 70,
                site: site(2),
                api: "cudaLaunchKernel".into(),
                estimated: false,
                sampled: None,
            }],
            graph_launches: vec![GraphLaunch {
                pid: 9,
                graph: "g".into(),
                count: 5,
                site: site(3),
                api: "cudaGraphLaunch".into(),
                captured_at: None,
            }],
            ..Default::default()
        };
        m.add_window(&launches, &mut labels);
        m.add_window(&launches, &mut labels);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        assert!(text.contains(r#"cuda_calls_total{pid="9",comm="python3",container_id="",pod_uid="",container_name="",api="cudaStreamSynchronize",kind=""} 6"#), "{text}");
        assert!(text.contains(r#"cuda_sync_seconds_total{pid="9",comm="python3",container_id="",pod_uid="",container_name=""} 4.0"#), "{text}");
        assert!(text.contains(r#"site="other"} 20"#), "{text}");
        let who = "pid=\"9\",comm=\"python3\",container_id=\"\",pod_uid=\"\",container_name=\"\"";
        assert!(text.contains(&format!("cuda_launches_total{{{who},api=\"cudaLaunchKernel\",kind=\"\"}} 140")), "{text}");
        assert!(text.contains(&format!("cuda_graph_launches_total{{{who},api=\"cudaGraphLaunch\",kind=\"\"}} 10")), "{text}");
        let sites = text.lines().filter(|l| l.starts_with("cuda_findings_total{")).count();
        assert_eq!(sites, MAX_SITES + 1, "{text}");
        m.forget(9);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        assert!(!text.contains(r#"api="cudaMemcpy""#), "{text}");
        assert!(!text.contains(r#"api="cudaGraphLaunch""#), "{text}");
    }

    #[test]
    fn gpu_memory_held_by_site_and_in_all() {
        use crate::recording::cuda::{DeviceMemory, DeviceMemoryLine};
        let mut m = CudaMetrics::default();
        let mut r = Registry::default();
        m.register(&mut r);
        let line = |l: u32, held: u64| DeviceMemoryLine { site: Site { function: "step".into(), file: Some("/app/m.py".into()), line: Some(l) }, held_bytes: held, ..Default::default() };
        let c = CudaReport {
            device_memory: vec![DeviceMemory {
                pid: 9,
                held_bytes: 64 << 20,
                lines: vec![line(4, 64 << 20)],
                allocated_bytes: Some(30 << 20),
                tensor_lines: vec![line(7, 20 << 20), line(8, 10 << 20)],
                ..Default::default()
            }],
            ..Default::default()
        };
        m.add_window(&c, &mut labels);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        let who = "pid=\"9\",comm=\"python3\",container_id=\"\",pod_uid=\"\",container_name=\"\"";
        for want in [
            format!("gpu_memory_held_bytes{{{who},kind=\"tensors\",site=\"m.py:7 step\"}} {}", 20 << 20),
            format!("gpu_memory_held_bytes{{{who},kind=\"reserved\",site=\"m.py:4 step\"}} {}", 64 << 20),
            format!("gpu_memory_target_bytes{{{who},kind=\"tensors\"}} {}", 30 << 20),
            format!("gpu_memory_target_bytes{{{who},kind=\"reserved\"}} {}", 64 << 20),
        ] {
            assert!(text.contains(&want), "{want}\n{text}");
        }
        m.forget(9);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        assert!(!text.contains("gpu_memory_held_bytes{") && !text.contains("gpu_memory_target_bytes{"), "{text}");
    }
}
