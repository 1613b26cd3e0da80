//! Kernel names as people read them: a driver launch's handle named by the
//! lookup that made it (`cuModuleGetFunction`, `cuLibraryGetKernel`, seen
//! by the replay), C++ names demangled (`_Z13matmul_kernelPfS_S_i` ->
//! `matmul_kernel(float*, float*, float*, int)`); Triton's and NVRTC's
//! plain names stay as they are.

use cpp_demangle::Symbol;

use super::replay::Replay;

/// `name` demangled when it is an Itanium C++ mangled name, else as is.
pub fn demangle(name: &str) -> String {
    if !name.starts_with("_Z") {
        return name.to_owned();
    }
    Symbol::new(name).ok().and_then(|s| s.demangle().ok()).unwrap_or_else(|| name.to_owned())
}

/// The name of a driver launch's kernel handle in process `pid`: its
/// lookup's name, demangled; else the handle (`CUfunction 0x...`: looked
/// up before the window, or its name lost).
pub fn driver_kernel(replay: &Replay, pid: u32, handle: u64) -> String {
    match replay.kernel_name(pid, handle) {
        Some(n) => demangle(n),
        None => format!("CUfunction {handle:#x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mangled_names_are_demangled_others_kept() {
        assert_eq!(demangle("_Z13matmul_kernelPfS_S_i"), "matmul_kernel(float*, float*, float*, int)");
        assert_eq!(demangle("triton_poi_fused_add_0"), "triton_poi_fused_add_0");
        assert_eq!(demangle("_Znot a name"), "_Znot a name");
        assert_eq!(driver_kernel(&Replay::default(), 1, 0xabc), "CUfunction 0xabc");
    }
}
