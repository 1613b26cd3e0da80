//! "No usable device" (issue 24, part 8): a process whose runtime or
//! driver found no device or driver gets one note that says which call
//! failed, with what, and where. Without a GPU (`import torch;
//! torch.cuda.is_available()`), every other CUDA table is empty, and an
//! empty table alone does not say why.

use std::collections::BTreeMap;

use tracer_common::cuda::api;

use crate::recording::cuda::{error_name, CudaCall};

/// Return codes that mean no usable device or driver, runtime and driver
/// alike (the two share these numbers): not initialised, stub library,
/// insufficient driver, no device, system driver mismatch, forward
/// compatibility unsupported, unknown.
const NO_DEVICE_CODES: [i32; 7] = [3, 34, 35, 100, 803, 804, 999];

/// A driver `CUresult`'s name, for the codes above (35 is the runtime's
/// only).
fn driver_error_name(rc: i32) -> &'static str {
    match rc {
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        34 => "CUDA_ERROR_STUB_LIBRARY",
        100 => "CUDA_ERROR_NO_DEVICE",
        803 => "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        804 => "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => "",
    }
}

/// One note per process: its device-setup call that failed most often
/// with a no-device code (the earliest API id on a tie: the runtime's).
pub fn notes(calls: &[CudaCall]) -> Vec<String> {
    let mut worst: BTreeMap<u32, (u64, &CudaCall, i32)> = BTreeMap::new();
    for call in calls {
        let Some(id) = api::NAMES.iter().position(|n| *n == call.api) else { continue };
        if !api::is_device_setup(id as u32) {
            continue;
        }
        let failing = call.return_codes.iter().filter(|(rc, n)| NO_DEVICE_CODES.contains(rc) && **n > 0).max_by_key(|(_, n)| **n);
        let Some((rc, n)) = failing else { continue };
        let e = worst.entry(call.pid).or_insert((*n, call, *rc));
        if *n > e.0 {
            *e = (*n, call, *rc);
        }
    }
    worst
        .into_iter()
        .map(|(pid, (n, call, rc))| {
            let name = if api::is_driver_name(&call.api) { driver_error_name(rc) } else { error_name(rc) };
            let times = if n == 1 { String::new() } else { format!(" ({n} calls)") };
            format!(
                "pid {pid}: CUDA found no usable device or driver: {} returned {rc} {name}{times} at {}",
                call.api,
                call.site.display()
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::cuda::Site;

    fn call(pid: u32, api: &str, codes: &[(i32, u64)], line: u32) -> CudaCall {
        CudaCall {
            pid,
            api: api.to_owned(),
            kind: None,
            class: None,
            count: codes.iter().map(|c| c.1).sum(),
            bytes: 0,
            total_ns: 0,
            errors: codes.iter().filter(|c| c.0 != 0).map(|c| c.1).sum(),
            site: Site { function: "is_available".into(), file: Some("torch/cuda/__init__.py".into()), line: Some(line) },
            return_codes: codes.iter().copied().collect(),
            pinned: None,
            pageable: None,
            events_lost: 0,
            not_ready: None,
            poll_waits: None,
            poll_ns: None,
            collective_waits: None,
            collective_wait_ns: None,
        }
    }

    #[test]
    fn one_note_per_process_naming_the_call_the_code_and_the_line() {
        let calls = [
            call(7, "cudaGetDeviceCount", &[(35, 3)], 120),
            call(7, "cudaSetDevice", &[(35, 1)], 130),
            call(8, "cuInit", &[(100, 1)], 5),
            // Succeeded, or failed otherwise: no note.
            call(9, "cudaGetDeviceCount", &[(0, 2)], 1),
            call(9, "cudaSetDevice", &[(101, 1)], 2),
            call(9, "cudaMemcpy", &[(35, 4)], 3),
        ];
        assert_eq!(
            notes(&calls),
            [
                "pid 7: CUDA found no usable device or driver: cudaGetDeviceCount returned 35 cudaErrorInsufficientDriver \
                 (3 calls) at is_available (torch/cuda/__init__.py:120)",
                "pid 8: CUDA found no usable device or driver: cuInit returned 100 CUDA_ERROR_NO_DEVICE at is_available \
                 (torch/cuda/__init__.py:5)",
            ]
        );
    }
}
