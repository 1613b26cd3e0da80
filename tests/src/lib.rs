//! Shared helpers for the infertrace end-to-end tests.
//!
//! The tests run the real `infertrace` binary against the running kernel and
//! compare what it reports with ground truth (known workloads, strace,
//! bpftool). They need root; see [`require`] for how missing prerequisites
//! are handled (never a silent skip).
//!
//! The binary is `$INFERTRACE_BIN`, or `<workspace>/target/release/infertrace`.
//!
//! One module per concern; everything is re-exported here, so tests use
//! `infertrace_e2e::NAME` (or `use infertrace_e2e::*`):
//!
//! - the workspace and the binary under test: [`locations`];
//! - `infertrace agent` on a loopback port, and HTTP GETs: [`agent`];
//! - [`Need`], [`require`], [`skip`] (the `CI=true` rule): [`prereq`];
//! - the CPythons the tests expect, found through pyenv and PATH: [`pythons`];
//! - hostile files (a sparse ELF, a FIFO) and a memory cgroup to bound the
//!   tracer with: [`hostile`];
//! - sid's 3.14 and 3.15 run in a chroot through generated wrappers: [`pyroot`];
//! - temporary directories ([`TempDir`]): [`tmp`];
//! - compiling `tests/workloads/*.c`: [`workloads`];
//! - `# @name` line markers of workload sources: [`markers`];
//! - running commands and infertrace ([`Run`], `record_launch`): [`run`];
//! - processes by pid (`alive`, `kill`, [`KillOnDrop`], `poll`): [`procs`];
//! - the JSON [`Report`] and its invariants: [`json`];
//! - crafting and reading `.itr` recordings directly: [`itr`];
//! - `strace -c` as ground truth: [`strace`];
//! - the loaded BPF programs and a tracer's maps: [`bpftool`];
//! - checks of the text report: [`text`];
//! - wall-time accounting ([`ThreadTimes`]): [`walltime`].

use std::time::Duration;

pub use serde_json;

pub mod agent;
pub mod bpftool;
pub mod cudalibs;
pub mod hostile;
pub mod itr;
pub mod json;
pub mod locations;
pub mod markers;
pub mod prereq;
pub mod procs;
pub mod pyroot;
pub mod pythons;
pub mod run;
pub mod strace;
pub mod text;
pub mod tmp;
pub mod walltime;
pub mod workloads;

pub use agent::*;
pub use bpftool::*;
pub use cudalibs::*;
pub use hostile::*;
pub use itr::*;
pub use json::*;
pub use locations::*;
pub use markers::*;
pub use prereq::*;
pub use procs::*;
pub use pyroot::*;
pub use pythons::*;
pub use run::*;
pub use strace::*;
pub use text::*;
pub use tmp::*;
pub use walltime::*;
pub use workloads::*;

/// Default timeout for one infertrace run.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);
