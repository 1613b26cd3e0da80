//! Timing our own calls with and without a probe on them: the function
//! the calibration uprobes ([`infertrace_calibration_target`]), its place
//! in our binary, and loops that time it and `getppid`. Used at startup by
//! the overhead family and by the CUDA launch slicer.

use std::{hint::black_box, time::Instant};

/// The function the calibration uprobes: never inlined, exported so that
/// it keeps a symbol and an address of its own.
#[no_mangle]
#[inline(never)]
pub extern "C" fn infertrace_calibration_target(x: u64) -> u64 {
    black_box(x).wrapping_add(1)
}

/// ns per call of `n` calls of the target.
pub fn time_target(n: u32) -> f64 {
    let t = Instant::now();
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(infertrace_calibration_target(black_box(u64::from(i))));
    }
    black_box(acc);
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

/// ns per call of `n` getppid calls.
pub fn time_getppid(n: u32) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: getppid has no arguments and cannot fail.
        black_box(unsafe { libc::getppid() });
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

/// The fastest round: what the mechanism costs with nothing else in its
/// way (other load on the machine only ever adds time to a round).
pub fn fastest(v: Vec<f64>) -> f64 {
    v.into_iter().min_by(f64::total_cmp).unwrap_or(0.0)
}

/// The file and offset of [`infertrace_calibration_target`] in this process.
pub fn target_location() -> Result<(String, u64), String> {
    let addr = infertrace_calibration_target as *const () as usize as u64;
    let maps = crate::os::procfs::maps(std::process::id()).map_err(|e| format!("reading /proc/self/maps: {e}"))?;
    let line = maps
        .iter()
        .find(|m| m.start <= addr && addr < m.end && m.is_file())
        .ok_or_else(|| "the calibration function is in no file mapping".to_string())?;
    Ok((line.path().to_owned(), addr - line.start + line.offset))
}

