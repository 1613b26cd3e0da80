//! The probe families of a recording: their program tables (for the loader,
//! `doctor` and the tests) and the list of collectors `record` runs. The only
//! place that names them all.

use crate::{
    collect::{Collector, FamilyTable, RecordOptions},
    cpu_samples::{self, CpuSampleCollector},
    cuda::{self, CudaCollector},
    nvml::{self, NvmlCollector},
    process::{self, ProcessCollector},
    pystacks::{self, PythonCollector},
    sched::{self, SchedCollector},
    syscalls::{self, SyscallCollector},
};

/// Every family's table, in load order.
pub fn tables() -> [&'static FamilyTable; 7] {
    [
        &process::TABLE,
        &syscalls::TABLE,
        &sched::TABLE,
        &cpu_samples::TABLE,
        &pystacks::TABLE,
        &cuda::programs::TABLE,
        &nvml::TABLE,
    ]
}

/// The collectors `opts` asks for, in the order they see every step.
///
/// The order matters twice: `sched` seeds the threads of an attached
/// process before `process` (last) puts it in the kernel's target set, so
/// that the kernel never creates their entries first; and a snapshot runs
/// `syscalls` before `sched` (wall time reads the syscall table) and `cuda`
/// before `nvml` (the GPU samples join the CUDA report).
pub fn collectors(opts: &RecordOptions) -> Vec<Box<dyn Collector>> {
    let mut list: Vec<Box<dyn Collector>> = vec![Box::new(SyscallCollector::default())];
    if opts.sched.enabled {
        list.push(Box::new(SchedCollector::default()));
        list.push(Box::new(CpuSampleCollector::default()));
    }
    if opts.python {
        list.push(Box::new(PythonCollector::default()));
    }
    if opts.cuda {
        list.push(Box::new(CudaCollector::default()));
        list.push(Box::new(NvmlCollector::default()));
    }
    list.push(Box::new(ProcessCollector::default()));
    list
}
