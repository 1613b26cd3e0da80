//! Turning the kernel's stack ids into frames: native and kernel stacks from
//! the `STACKS` map through the symbolizer, Python stacks through the
//! interpreters, merged leaf first. Shared by every probe family that
//! records stacks.

use std::collections::HashMap;

use aya::{
    maps::{MapData, StackTraceMap},
    Ebpf,
};
use tracer_common::python::PyStack;

use crate::{
    probe::ProbeError,
    pystacks::{self, PythonTargets},
    recording::Frame,
    symbolize::Symbolizer,
};

pub struct StackResolver<'a> {
    symbolizer: &'a mut Symbolizer,
    python: &'a mut PythonTargets,
    native: HashMap<u32, Vec<u64>>,
    py_stacks: HashMap<u64, PyStack>,
}

/// The leading kernel frames of a stack taken at sched_switch are our own
/// program and the tracepoint machinery: not the user's time.
fn is_tracing_frame(function: &str) -> bool {
    ["bpf_prog_", "bpf_trace_run", "__bpf_trace_", "__traceiter_", "trace_call_bpf"]
        .iter()
        .any(|p| function.starts_with(p))
}

impl<'a> StackResolver<'a> {
    /// Loads every captured stack out of the kernel maps.
    pub fn load(ebpf: &mut Ebpf, symbolizer: &'a mut Symbolizer, python: &'a mut PythonTargets) -> Result<Self, ProbeError> {
        let py_stacks = PythonTargets::load_stacks(ebpf)?;
        let map = ebpf.map("STACKS").ok_or(ProbeError::MissingMap("STACKS"))?;
        let map: StackTraceMap<&MapData> = StackTraceMap::try_from(map).map_err(|e| ProbeError::map("STACKS", e))?;
        let native = map
            .iter()
            .filter_map(Result::ok)
            .map(|(id, st)| (id, st.frames().iter().map(|f| f.ip).filter(|ip| *ip != 0).collect()))
            .collect();
        Ok(Self { symbolizer, python, native, py_stacks })
    }

    fn ips(&self, id: i32) -> &[u64] {
        if id < 0 {
            return &[];
        }
        self.native.get(&(id as u32)).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Leaf-first frames: kernel, native below the Python leaf, Python.
    pub fn frames(&mut self, pid: u32, user_stack: i32, kernel_stack: i32, py_stack: u64) -> Vec<Frame> {
        let kips = self.ips(kernel_stack).to_vec();
        let uips = self.ips(user_stack).to_vec();
        let mut kernel = self.symbolizer.kernel_frames(&kips);
        let ours = kernel.iter().take_while(|f| is_tracing_frame(&f.function)).count();
        kernel.drain(..ours);
        let native = self.symbolizer.user_frames(pid, &uips);
        let python = if py_stack != 0 { self.python.frames(py_stack, &self.py_stacks) } else { Vec::new() };
        pystacks::merge(kernel, native, python)
    }
}
