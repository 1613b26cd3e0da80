//! Process lifecycle events sent through the `PROC_EVENTS` ring buffer. They
//! are rare (fork/exec of targets), unlike syscalls which never cross.

pub const KIND_FORK: u32 = 1;
pub const KIND_EXEC: u32 = 2;
pub const KIND_EXIT: u32 = 3;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcEvent {
    pub kind: u32,
    /// The process (tgid) the event is about: the child for a fork.
    pub pid: u32,
    /// For a fork: the forking process.
    pub ppid: u32,
    pub _pad: u32,
    pub ts_ns: u64,
    /// Task comm at the time of the event (NUL padded).
    pub comm: [u8; 16],
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for ProcEvent {}
