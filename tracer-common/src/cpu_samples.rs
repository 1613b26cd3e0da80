//! CPU samples: the kernel counts the software CPU clock's samples of
//! targets per (thread, stacks).

/// Key of the `CPU_SAMPLES` map (value: sample count).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SampleKey {
    pub pid: u32,
    pub tid: u32,
    pub user_stack: i32,
    pub kernel_stack: i32,
    pub py_stack: u64,
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for SampleKey {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_have_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<SampleKey>(), 24);
    }
}
