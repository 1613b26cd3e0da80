//! The order of the snapshots, from what each family declares it fills
//! ([`Collector::provides`]) and reads ([`Collector::needs`]) of the
//! recording: a family that reads another's part runs after it. Nothing
//! else orders the snapshots; a cycle is an error.

use super::Collector;

/// A part of the recording that one family fills and another reads in its
/// snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    /// `syscalls`: the per-thread syscall table.
    Syscalls,
    /// `threads`, `runqueue_hist`: the wall-time partition.
    Threads,
    /// `stacks`, `sample_hz`, `gil_holders`: CPU samples, off-CPU and slow-syscall stacks, GIL waits by holder.
    Stacks,
    /// `cuda`: the CUDA report (calls, launches, findings, GPU samples).
    Cuda,
    /// `timeline`: timestamped events (CUDA calls are added by the CUDA family).
    Timeline,
    /// `asyncio`: event loops and tasks.
    Asyncio,
    /// `tracer_overhead`: what tracing cost.
    Overhead,
    /// `memory`: resident memory per process.
    Memory,
}

impl Part {
    /// The fields of `Recording` this part is.
    pub fn fields(self) -> &'static [&'static str] {
        match self {
            Part::Syscalls => &["syscalls"],
            Part::Threads => &["threads", "runqueue_hist"],
            Part::Stacks => &["stacks", "sample_hz", "gil_holders"],
            Part::Cuda => &["cuda"],
            Part::Timeline => &["timeline"],
            Part::Asyncio => &["asyncio"],
            Part::Overhead => &["tracer_overhead"],
            Part::Memory => &["memory"],
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OrderError {
    #[error("the snapshot dependencies form a cycle through {0}")]
    Cycle(String),
}

/// The indexes of `collectors` in the order their snapshots run: every
/// provider of a part before the collectors that need it, otherwise the
/// list's own order.
pub fn snapshot_order(collectors: &[Box<dyn Collector>]) -> Result<Vec<usize>, OrderError> {
    let n = collectors.len();
    // before[j]: how many collectors must run before j.
    let mut after: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut before = vec![0usize; n];
    for (i, p) in collectors.iter().enumerate() {
        for (j, q) in collectors.iter().enumerate() {
            if i != j && q.needs().iter().any(|part| p.provides().contains(part)) {
                after[i].push(j);
                before[j] += 1;
            }
        }
    }
    let mut order = Vec::with_capacity(n);
    let mut done = vec![false; n];
    while order.len() < n {
        // The first in list order with nothing left before it.
        let Some(next) = (0..n).find(|&i| !done[i] && before[i] == 0) else {
            let stuck: Vec<&str> = (0..n).filter(|&i| !done[i]).map(|i| collectors[i].name()).collect();
            return Err(OrderError::Cycle(stuck.join(", ")));
        };
        done[next] = true;
        order.push(next);
        for &j in &after[next] {
            before[j] -= 1;
        }
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        engine::Cx,
        os::probe::ProbeError,
        recording::Recording,
    };

    struct Fake(&'static str, &'static [Part], &'static [Part]);

    impl Collector for Fake {
        fn name(&self) -> &'static str {
            self.0
        }
        fn attach(&mut self, _cx: &mut Cx<'_>) -> Result<(), ProbeError> {
            Ok(())
        }
        fn snapshot(&mut self, _cx: &mut Cx<'_>, _rec: &mut Recording) -> Result<(), ProbeError> {
            Ok(())
        }
        fn provides(&self) -> &'static [Part] {
            self.1
        }
        fn needs(&self) -> &'static [Part] {
            self.2
        }
    }

    fn list(v: Vec<Fake>) -> Vec<Box<dyn Collector>> {
        v.into_iter().map(|f| Box::new(f) as Box<dyn Collector>).collect()
    }

    #[test]
    fn providers_run_first_and_the_list_order_stays_otherwise() {
        let c = list(vec![
            Fake("timeline", &[Part::Timeline], &[Part::Cuda]),
            Fake("sched", &[Part::Threads], &[Part::Syscalls]),
            Fake("syscalls", &[Part::Syscalls], &[]),
            Fake("cuda", &[Part::Cuda, Part::Timeline], &[]),
            Fake("process", &[], &[]),
        ]);
        let names: Vec<&str> = snapshot_order(&c).unwrap().into_iter().map(|i| c[i].name()).collect();
        assert_eq!(names, ["syscalls", "sched", "cuda", "timeline", "process"]);
    }

    #[test]
    fn a_cycle_is_an_error() {
        let c = list(vec![Fake("a", &[Part::Cuda], &[Part::Threads]), Fake("b", &[Part::Threads], &[Part::Cuda]), Fake("c", &[], &[])]);
        assert_eq!(snapshot_order(&c), Err(OrderError::Cycle("a, b".into())));
    }

    #[test]
    fn a_need_nobody_provides_orders_nothing() {
        let c = list(vec![Fake("nvml", &[Part::Cuda], &[Part::Cuda]), Fake("x", &[], &[])]);
        assert_eq!(snapshot_order(&c).unwrap(), [0, 1]);
    }
}
