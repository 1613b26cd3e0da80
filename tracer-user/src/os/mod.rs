//! Operating-system glue shared by every part of the tracer: /proc,
//! tracefs, the kernel's BTF, ELF files, the embedded kernel object and its
//! typed accessors, multi-uprobe links, clocks, native symbolization.
//! Knows no probe family.

pub mod boot_cache;
pub mod bpf_stats;
pub mod btf_offsets;
pub mod clock;
pub mod elf;
pub mod kallsyms;
pub mod usdt;
pub mod probe;
pub mod perfmap;
pub mod procfs;
pub mod sched;
pub mod symbolize;
pub mod tracefs;
pub mod trap_timing;
pub mod uprobe_multi;
