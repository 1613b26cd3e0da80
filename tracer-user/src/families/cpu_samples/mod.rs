//! CPU sampling, user side: the software CPU clock fires `cpu_sample` on
//! every online CPU at `-F` Hz; the kernel counts samples per thread and
//! stack (`CPU_SAMPLES`), read here into symbolized CPU stacks.

use aya::maps::HashMap as BpfHashMap;
use tracer_common::cpu_samples::SampleKey;

use crate::{
    engine::{Part, programs::Links, Collector, Cx, Handle, FamilyTable, ProgramKind, ProgramSpec},
    os::probe::{self, ProbeError},
    recording::{Recording, StackKind, StackRecord},
};

pub static TABLE: FamilyTable = FamilyTable {
    family: "cpu_samples",
    programs: &[ProgramSpec { name: "cpu_sample", kind: ProgramKind::CpuClock }],
    globals: &[],
};

#[derive(Default)]
pub struct CpuSampleCollector {
    /// Samples per second on every CPU (`-F`), 0: none.
    frequency: u64,
    links: Links,
}

impl CpuSampleCollector {
    pub fn new(frequency: u64) -> Self {
        CpuSampleCollector { frequency, ..Default::default() }
    }
}

impl Collector for CpuSampleCollector {
    fn uses(&self) -> &'static [Handle] {
        &[Handle::Kernel, Handle::Targets, Handle::Stacks]
    }

    fn provides(&self) -> &'static [Part] {
        &[Part::Stacks]
    }

    fn name(&self) -> &'static str {
        "cpu_samples"
    }

    fn attach(&mut self, cx: &mut Cx<'_>) -> Result<(), ProbeError> {
        if self.frequency > 0 {
            for spec in TABLE.programs {
                self.links.attach_sampling(&mut cx.kernel, spec, self.frequency)?;
            }
        }
        Ok(())
    }

    fn snapshot(&mut self, cx: &mut Cx<'_>, rec: &mut Recording) -> Result<(), ProbeError> {
        rec.sample_hz = self.frequency;
        let pids = cx.targets.all_pids();
        let samples: Vec<(SampleKey, u64)> = {
            let map: BpfHashMap<_, SampleKey, u64> = probe::hash_map(&mut cx.kernel.ebpf, tracer_common::maps::CPU_SAMPLES)?;
            map.iter().filter_map(Result::ok).filter(|(k, _)| pids.contains(&k.pid)).collect()
        };
        for (k, n) in samples {
            rec.stacks.push(StackRecord {
                kind: StackKind::Cpu,
                reason: None,
                pid: k.pid,
                tid: k.tid,
                samples: n,
                weight_ns: 0,
                syscall: None,
                frames: cx.frames(k.pid, k.user_stack, k.kernel_stack, k.py_stack)?,
            });
        }
        Ok(())
    }

    fn detach(&mut self, cx: &mut Cx<'_>) {
        self.links.detach(&mut cx.kernel.ebpf);
    }
}
