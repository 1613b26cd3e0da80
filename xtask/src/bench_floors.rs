//! The floors of `cargo xtask bench`: what the bare kernel mechanism costs
//! on this machine, measured in the same run as the tracers.
//!
//! A floor is bpftrace with empty actions on the attach points infertrace
//! uses, so that the only cost is the kernel's: a `raw_syscalls` enter+exit
//! pair (every syscall takes the tracepoint slow path and runs two empty
//! programs), a uprobe on entry only, or a uprobe plus a uretprobe, on the
//! stand-in libcudart's own function. Each infertrace row of a workload
//! with a floor shows its ratio to that floor, and goals are written as
//! those ratios: what we add beyond the kernel's price, which no eBPF
//! tracer can avoid.
//!
//! The syscall loop's ratios are to infertrace on an idle pid instead (the
//! BTF raw tracepoints infertrace uses, its programs exiting at once):
//! bpftrace 0.17 (Debian 12) has no raw tracepoints, and its classic
//! `tracepoint:` programs pay for the perf trace buffer, more than the
//! tp_btf path (here 3.0x untraced against 1.9x for the idle pid, same run).
//! The bpftrace row stays in the table for reference.

/// One floor mode of the bench.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Floor {
    /// `tracepoint:raw_syscalls:sys_enter {}` and `sys_exit {}`.
    Syscalls,
    /// `uprobe:LIB:FUNCTION {}` on the workload's CUDA function.
    Uprobe,
    /// `uprobe:LIB:FUNCTION {}` and `uretprobe:LIB:FUNCTION {}`.
    UprobeUretprobe,
    /// `uprobe:LIB:FUNCTION {}` and an entry uprobe on the driver
    /// function it enters (the stand-in libcuda.so.1 next to LIB): what a
    /// runtime launch costs when the driver's launch functions stay probed
    /// (they are never taken off, docs/cuda.md).
    UprobePlusDriver,
    /// `tracepoint:kmem:rss_stat {}`: every change of a process's memory
    /// counters (page faults, unmaps) runs an empty program.
    RssStat,
}

impl Floor {
    /// The bpftrace program; `lib` and `function` name the probed
    /// function (CUDA floors only).
    pub fn program(self, lib: &str, function: &str) -> String {
        match self {
            Floor::Syscalls => {
                "tracepoint:raw_syscalls:sys_enter {} tracepoint:raw_syscalls:sys_exit {}".into()
            }
            Floor::Uprobe => format!("uprobe:{lib}:{function} {{}}"),
            Floor::UprobeUretprobe => {
                format!("uprobe:{lib}:{function} {{}} uretprobe:{lib}:{function} {{}}")
            }
            Floor::RssStat => "tracepoint:kmem:rss_stat {}".into(),
            Floor::UprobePlusDriver => {
                let driver = std::path::Path::new(lib).with_file_name("libcuda.so.1");
                let inner = driver_function(function).unwrap_or(function);
                format!("uprobe:{lib}:{function} {{}} uprobe:{}:{inner} {{}}", driver.display())
            }
        }
    }

    /// Whether the workload must wait for the uprobe's int3 before its
    /// loop (`bench_cuda.py --probed`).
    pub fn probes_user_code(self) -> bool {
        !matches!(self, Floor::Syscalls | Floor::RssStat)
    }
}

/// The stand-in libcudart function a `bench_cuda.py` mode calls.
pub fn cuda_function(bench_args: &[&str]) -> Option<&'static str> {
    match bench_args.first().copied() {
        Some("copy") => Some("cudaMemcpyAsync"),
        Some("launch") => Some("cudaLaunchKernel"),
        Some("graph") => Some("cudaGraphLaunch"),
        Some("event") => Some("cudaEventRecord"),
        _ => None,
    }
}

/// The driver function the stand-in runtime's `function` enters.
pub fn driver_function(function: &str) -> Option<&'static str> {
    match function {
        "cudaLaunchKernel" => Some("cuLaunchKernel"),
        "cudaMemcpyAsync" => Some("cuMemcpyAsync"),
        _ => None,
    }
}

/// The "vs floor" cell and the goal cell of a row: `ratio` is the row's
/// ns/iter over its floor's, `goal` the largest acceptable ratio.
pub fn cells(ratio: Option<f64>, goal: Option<f64>) -> (String, String) {
    let r = ratio.map_or(String::new(), |r| format!("{r:.2}x"));
    let g = match (goal, ratio) {
        (Some(g), Some(r)) => format!("<= {g:.2}x fl {}", if r <= g { "met" } else { "MISSED" }),
        (Some(g), None) => format!("<= {g:.2}x fl"),
        _ => String::new(),
    };
    (r, g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_name_the_function() {
        assert_eq!(
            Floor::UprobeUretprobe.program("/l.so", "f"),
            "uprobe:/l.so:f {} uretprobe:/l.so:f {}"
        );
        assert_eq!(Floor::Uprobe.program("/l.so", "f"), "uprobe:/l.so:f {}");
        assert!(Floor::Syscalls.program("", "").contains("sys_exit {}"));
        assert_eq!(cuda_function(&["launch"]), Some("cudaLaunchKernel"));
    }

    #[test]
    fn goal_cells_say_met_or_missed() {
        assert_eq!(cells(Some(1.1), Some(1.2)).1, "<= 1.20x fl met");
        assert_eq!(cells(Some(1.3), Some(1.2)).1, "<= 1.20x fl MISSED");
        assert_eq!(cells(None, None), (String::new(), String::new()));
    }
}
