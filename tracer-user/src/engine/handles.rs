//! What a family is handed: not the whole [`Context`], a [`Cx`] with the
//! handles its collector declares ([`Collector::uses`](super::Collector::uses)) and nothing else.
//!
//! The engine keeps everything the families share in the [`Context`],
//! grouped into handles with one job each: the [`Kernel`] (the loaded
//! object and what loading more programs needs), the [`Window`] (when it
//! opened and closed), the [`TargetSet`] (the traced processes, their
//! exited threads, the events about them), the [`Stacks`] resolver, the
//! probe [`Calibration`], and the [`Sink`] for notes and lost counts. For
//! every call into a collector the engine makes a [`Cx`] from the context
//! and the collector's [`uses`](super::Collector::uses): the sink is every
//! family's; each other handle is in the view only when declared. Reaching
//! an undeclared one panics, in every build: it is a bug of the family, as
//! an index out of bounds is, and a test (`families::tests`) reads every
//! family's source for the handles it reaches and fails on one its
//! collectors do not declare (or one they declare and never reach).

use std::{
    ops::{Deref, DerefMut},
    path::PathBuf,
};

use aya::Ebpf;

use super::{stacks::Stacks, Context, Sink, TargetSet};
use crate::{
    os::{btf_offsets::KernelBtf, probe::ProbeError, uprobe_multi::MapFds},
    recording::{overhead::Calibration, Frame},
};

/// A handle a collector may declare in [`Collector::uses`](super::Collector::uses). The sink is
/// not one: every family has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Handle {
    /// [`Cx::kernel`]: the loaded object, its maps and programs.
    Kernel,
    /// [`Cx::window`]: when the window opened and closed.
    Window,
    /// [`Cx::targets`]: the traced processes, their exited threads, the
    /// target events.
    Targets,
    /// [`Cx::stacks`]: the symbolizer and the Python frame resolver.
    /// [`Cx::frames`] needs it and [`Handle::Kernel`] (the stack maps).
    Stacks,
    /// [`Cx::calibration`]: what one probe hit costs here.
    Calibration,
}

impl Handle {
    pub const ALL: [Handle; 5] = [Handle::Kernel, Handle::Window, Handle::Targets, Handle::Stacks, Handle::Calibration];

    /// The field of [`Cx`] that is this handle.
    pub fn field(self) -> &'static str {
        match self {
            Handle::Kernel => "kernel",
            Handle::Window => "window",
            Handle::Targets => "targets",
            Handle::Stacks => "stacks",
            Handle::Calibration => "calibration",
        }
    }
}

/// The loaded object and what loading and attaching more programs needs.
pub struct Kernel {
    pub ebpf: Ebpf,
    /// The kernel BTF, parsed once.
    pub btf: KernelBtf,
    /// Where tracefs is mounted, when it could be.
    pub tracefs: Option<PathBuf>,
    /// Duplicates of the object's map descriptors, taken before any family
    /// took its map out of [`ebpf`](Self::ebpf): what programs loaded
    /// outside aya are relocated against ([`crate::os::uprobe_multi`]).
    pub map_fds: MapFds,
}

impl Kernel {
    pub fn new(ebpf: Ebpf, btf: KernelBtf, tracefs: Option<PathBuf>) -> Kernel {
        let map_fds = MapFds::capture(&ebpf);
        Kernel { ebpf, btf, tracefs, map_fds }
    }
}

/// When the window opened and closed.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// Wall-clock time when the window opened, Unix ms.
    pub started_unix_ms: u64,
    /// CLOCK_MONOTONIC ns when the window opened.
    pub start: u64,
    /// Set when the window closed (the programs are detached).
    pub end: Option<u64>,
}

impl Window {
    /// The end of what a snapshot covers: the window end once closed, else now.
    pub fn now_or_end(&self) -> u64 {
        self.end.unwrap_or_else(crate::os::clock::monotonic_ns)
    }
}

/// One handle of a [`Cx`]: the handle itself when the collector declared
/// it, else nothing (dereferencing it panics, naming the handle).
pub struct Grant<'a, T> {
    handle: Option<&'a mut T>,
    what: Handle,
}

impl<'a, T> Grant<'a, T> {
    fn new(handle: &'a mut T, what: Handle, uses: &[Handle]) -> Self {
        Grant { handle: uses.contains(&what).then_some(handle), what }
    }
}

#[cold]
#[track_caller]
fn undeclared(what: Handle) -> ! {
    panic!("a collector reached cx.{} without declaring Handle::{what:?} in Collector::uses", what.field())
}

impl<T> Deref for Grant<'_, T> {
    type Target = T;

    #[track_caller]
    fn deref(&self) -> &T {
        match &self.handle {
            Some(h) => h,
            None => undeclared(self.what),
        }
    }
}

impl<T> DerefMut for Grant<'_, T> {
    #[track_caller]
    fn deref_mut(&mut self) -> &mut T {
        match &mut self.handle {
            Some(h) => h,
            None => undeclared(self.what),
        }
    }
}

/// A collector's view of the [`Context`] for one call: the [`Sink`], and
/// the handles its [`uses`](super::Collector::uses) declares.
pub struct Cx<'a> {
    pub sink: &'a mut Sink,
    pub kernel: Grant<'a, Kernel>,
    pub window: Grant<'a, Window>,
    pub targets: Grant<'a, TargetSet>,
    pub stacks: Grant<'a, Stacks>,
    pub calibration: Grant<'a, Calibration>,
    /// Set during a counts-only snapshot ([`super::run::Engine::counts`]):
    /// stacks are not resolved ([`frames`](Self::frames) gives none) and a
    /// family may skip its stack rows.
    pub counts_only: bool,
}

impl Cx<'_> {
    /// Leaf-first frames of a captured stack (see `crate::engine::stacks`).
    /// None during a counts-only snapshot. Needs [`Handle::Stacks`] and
    /// [`Handle::Kernel`].
    pub fn frames(&mut self, pid: u32, user_stack: i32, kernel_stack: i32, py_stack: u64) -> Result<Vec<Frame>, ProbeError> {
        if self.counts_only {
            return Ok(Vec::new());
        }
        self.stacks.frames(&mut self.kernel.ebpf, pid, user_stack, kernel_stack, py_stack)
    }
}

impl Context {
    /// A collector's view, given what it [uses](super::Collector::uses).
    pub(in crate::engine) fn view(&mut self, uses: &[Handle]) -> Cx<'_> {
        Cx {
            sink: &mut self.sink,
            kernel: Grant::new(&mut self.kernel, Handle::Kernel, uses),
            window: Grant::new(&mut self.window, Handle::Window, uses),
            targets: Grant::new(&mut self.targets, Handle::Targets, uses),
            stacks: Grant::new(&mut self.stacks, Handle::Stacks, uses),
            calibration: Grant::new(&mut self.calibration, Handle::Calibration, uses),
            counts_only: self.counts_only,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_gives_only_what_was_declared() {
        let (mut a, mut b) = (1u32, 2u32);
        let mut granted = Grant::new(&mut a, Handle::Targets, &[Handle::Targets]);
        *granted += 1;
        assert_eq!(*granted, 2);
        let refused = Grant::new(&mut b, Handle::Kernel, &[Handle::Targets]);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| *refused));
        let msg = r.expect_err("an undeclared handle panics");
        let msg = msg.downcast_ref::<String>().expect("a message");
        assert!(msg.contains("cx.kernel") && msg.contains("Handle::Kernel"), "{msg}");
    }
}
