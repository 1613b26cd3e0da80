//! Process lifecycle events sent through the `PROC_EVENTS` ring buffer. They
//! are rare (fork/exec/exit of targets, executable file mappings), unlike
//! syscalls which never cross.

pub const KIND_FORK: u32 = 1;
pub const KIND_EXEC: u32 = 2;
pub const KIND_EXIT: u32 = 3;
/// A target mapped a file with `PROT_EXEC` (`mmap` returned): the dynamic
/// loader brought in a library (dlopen), whose code may run at once.
pub const KIND_MAPPED: u32 = 4;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcEvent {
    pub kind: u32,
    /// The process (tgid) the event is about: the child for a fork.
    pub pid: u32,
    /// For a fork: the forking process. For a mapping: the thread that mapped.
    pub ppid: u32,
    pub _pad: u32,
    pub ts_ns: u64,
    /// Task comm at the time of the event (NUL padded).
    pub comm: [u8; 16],
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for ProcEvent {}
