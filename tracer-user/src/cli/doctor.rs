//! `infertrace doctor`: can tracing work here, and if not, what to change.

use std::path::Path;

use crate::{
    engine::{
        programs::{self, LoadInputs},
        RecordOptions,
    },
    families, os::procfs, engine::session, system, os::tracefs,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Pass,
    /// Works, with a limitation worth knowing.
    Warn,
    /// Tracing cannot work until this is fixed.
    Fail,
}

pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    /// What to do about a warning or failure.
    pub remedy: Option<String>,
}

fn check(name: &'static str, status: Status, detail: impl Into<String>, remedy: Option<&str>) -> Check {
    Check { name, status, detail: detail.into(), remedy: remedy.map(str::to_owned) }
}

fn privileges() -> Check {
    let euid = unsafe { libc::geteuid() };
    if session::has_tracing_privileges() {
        let who = if euid == 0 { "running as root" } else { "CAP_BPF + CAP_PERFMON held" };
        check("privileges", Status::Pass, who, None)
    } else {
        check(
            "privileges",
            Status::Fail,
            format!("uid {euid} lacks {} (and CAP_SYS_ADMIN, which implies both)", session::missing_tracing_caps().join(" and ")),
            Some("run as root (sudo), or `setcap cap_bpf,cap_perfmon,cap_sys_admin+ep $(which infertrace)`; in a container use --privileged"),
        )
    }
}

fn kernel_version() -> Check {
    let rel = procfs::sysctl("kernel/osrelease").unwrap_or_default();
    let rel = rel.as_str();
    let mut it = rel.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse::<u32>().ok());
    let (major, minor) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    // Ring buffers need 5.8; tp_btf and BPF_F_* used here are older.
    if (major, minor) >= (5, 8) {
        check("kernel", Status::Pass, format!("Linux {rel}"), None)
    } else {
        check("kernel", Status::Fail, format!("Linux {rel} (5.8 or newer needed)"), Some("upgrade the kernel to 5.8+"))
    }
}

fn btf() -> Check {
    let path = session::btf_path();
    match session::load_btf() {
        Ok(_) => check("BTF", Status::Pass, format!("{} parsed", path.display()), None),
        Err(e) => check(
            "BTF",
            Status::Fail,
            e.to_string(),
            Some("use a kernel built with CONFIG_DEBUG_INFO_BTF=y, or set INFERTRACE_BTF to a BTF file for this kernel"),
        ),
    }
}

fn tracefs_check() -> Check {
    match tracefs::find() {
        Some(p) => check("tracefs", Status::Pass, format!("mounted at {}", p.display()), None),
        // Mode 0700, root's: mounted, but this user cannot read it.
        None if tracefs::mount_point().is_some() => check(
            "tracefs",
            Status::Warn,
            tracefs::ensure_mounted().err().map(|e| e.to_string()).unwrap_or_else(|| "mounted".into()),
            Some("run infertrace as root (root reads it)"),
        ),
        None if session::has_tracing_privileges() => match tracefs::ensure_mounted() {
            Ok((p, _)) => check("tracefs", Status::Pass, format!("was missing; mounted at {}", p.display()), None),
            Err(e) => check(
                "tracefs",
                Status::Warn,
                e.to_string(),
                Some("`mount -t tracefs tracefs /sys/kernel/tracing`; without it forked children are not followed"),
            ),
        },
        None => check(
            "tracefs",
            Status::Warn,
            "not mounted (infertrace record mounts it when run as root)",
            Some("`mount -t tracefs tracefs /sys/kernel/tracing`"),
        ),
    }
}

fn ring_buffer() -> Check {
    if !session::has_tracing_privileges() {
        return check("ring buffer", Status::Warn, "not probed without privileges", Some("rerun as root"));
    }
    // BPF_MAP_TYPE_RINGBUF = 27.
    let obj = aya_obj::Map::new_from_params(27, 0, 0, 4096, 0);
    match aya::maps::MapData::create(
        obj,
        "doctor_ringbuf",
        None,
    ) {
        Ok(_) => check("ring buffer", Status::Pass, "BPF_MAP_TYPE_RINGBUF created", None),
        Err(e) => check("ring buffer", Status::Fail, format!("cannot create a ring buffer: {e}"), Some("kernel 5.8+ with CONFIG_BPF_SYSCALL")),
    }
}

fn perf_paranoid() -> Check {
    let raw = procfs::sysctl("kernel/perf_event_paranoid").unwrap_or_default();
    let v: i32 = raw.trim().parse().unwrap_or(99);
    if session::has_tracing_privileges() || v <= 1 {
        check("perf_event_paranoid", Status::Pass, format!("{v} (privileged tracer is not limited by it)"), None)
    } else {
        check(
            "perf_event_paranoid",
            Status::Warn,
            format!("{v}: unprivileged perf events are restricted"),
            Some("run as root, or `sysctl kernel.perf_event_paranoid=1`"),
        )
    }
}

fn container() -> Check {
    let in_container = Path::new("/.dockerenv").exists()
        || Path::new("/run/.containerenv").exists()
        || std::fs::read_to_string("/proc/1/cgroup").is_ok_and(|s| s.contains("kubepods") || s.contains("docker"));
    if !in_container {
        return check("container", Status::Pass, "not in a container", None);
    }
    // In the host pid namespace, pid 2 is kthreadd.
    let host_pid_ns = std::fs::read_to_string("/proc/2/comm").is_ok_and(|c| c.trim() == "kthreadd");
    if host_pid_ns {
        check("container", Status::Pass, "in a container, host pid namespace visible", None)
    } else {
        check(
            "container",
            Status::Warn,
            "in a container with its own pid namespace: only its processes are visible",
            Some("run with --privileged and --pid=host (Kubernetes: privileged: true, hostPID: true)"),
        )
    }
}

/// Loads the object as `record` would (the same program tables and
/// globals) and runs every program through the kernel's verifier, without
/// attaching anything.
fn programs_check() -> Check {
    const NAME: &str = "eBPF programs";
    if !session::has_tracing_privileges() {
        return check(NAME, Status::Warn, "not loaded without privileges", Some("rerun as root"));
    }
    let Ok(btf) = session::load_btf() else {
        return check(NAME, Status::Warn, "not loaded: kernel BTF unavailable (see above)", None);
    };
    let Some(arch) = system::arch_constants() else {
        return check(NAME, Status::Fail, format!("unsupported architecture {}", std::env::consts::ARCH), None);
    };
    let opts = RecordOptions::default();
    let tracefs = tracefs::find();
    let inputs = LoadInputs { opts: &opts, arch, btf: &btf, tracefs: tracefs.as_deref() };
    let tables = families::tables();
    let mut ebpf = match programs::load_object(tables, &inputs) {
        Ok(e) => e,
        Err(e) => return check(NAME, Status::Fail, format!("loading the object failed: {e}"), Some("a kernel with BTF and eBPF (5.8+)")),
    };
    let mut failed = Vec::new();
    let mut n = 0;
    for table in tables {
        for spec in table.programs {
            n += 1;
            if let Err(e) = spec.load(&mut ebpf, &btf.btf) {
                failed.push(format!("{}/{}: {e}", table.family, spec.name));
            }
        }
    }
    if failed.is_empty() {
        check(NAME, Status::Pass, format!("{n} programs of {} families pass the kernel's verifier", tables.len()), None)
    } else {
        check(NAME, Status::Fail, failed.join("; "), Some("report this with `uname -r`; `record --no-sched`/`--no-cuda` avoid some families"))
    }
}

pub fn run_checks() -> Vec<Check> {
    vec![privileges(), kernel_version(), btf(), tracefs_check(), ring_buffer(), perf_paranoid(), programs_check(), container()]
}

/// Renders the checks; returns true when tracing can work.
pub fn render(checks: &[Check]) -> (String, bool) {
    let mut out = String::new();
    for c in checks {
        let tag = match c.status {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        out.push_str(&format!("[{tag}] {:<20} {}", c.name, c.detail));
        if let Some(r) = &c.remedy {
            out.push_str(&format!(" -- fix: {r}"));
        }
        out.push('\n');
    }
    let ok = checks.iter().all(|c| c.status != Status::Fail);
    out.push_str(if ok { "tracing can work here\n" } else { "tracing cannot work here until the FAIL lines are fixed\n" });
    (out, ok)
}

/// `infertrace doctor`: the checks, printed; exit 1 when tracing cannot work.
pub fn run() -> anyhow::Result<std::process::ExitCode> {
    let (text, ok) = render(&run_checks());
    print!("{text}");
    Ok(if ok { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::FAILURE })
}
