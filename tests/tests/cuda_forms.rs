//! Every launch form, counted once (issue 24, deliverable 2): the runtime's
//! `cudaLaunchKernelExC[_ptsz]` and `cudaLaunchCooperativeKernel[_ptsz]`,
//! the driver's `cuLaunchKernel[_ptsz]`, `cuLaunchKernelEx[_ptsz]` and
//! `cuLaunchCooperativeKernel[_ptsz]`.
//!
//! - On tests/cudasim's stand-ins (NOT CUDA: libcudart.so.12 over
//!   libcuda.so.1, each runtime form entering a different driver launch
//!   function inside, as a runtime may), a runtime launch of any form is
//!   counted once, as the runtime call, and direct driver launches of
//!   every form are counted, exactly, also after 10 000 runtime ExC
//!   launches (the driver gate used to take a driver launch function off
//!   after 1 000 runtime-owned hits, hiding the direct ones).
//! - On the REAL libcudart.so.12 and .so.13 (every call fails without a driver, but is
//!   entered): the runtime forms are found, probed and counted at their
//!   Python lines, with the kernel's name.
//!
//! Needs root, the binary, gcc, python3 and PyPI once (target/cuda-real);
//! under CI=true a missing one fails the test.

use std::collections::BTreeMap;

use infertrace_e2e::serde_json::Value;
use infertrace_e2e::*;

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

/// The launches of the report by marker line: (api, count, kernel) each.
fn launches_by_line(report: &Report) -> BTreeMap<u64, Vec<(String, u64, String)>> {
    let launches = report.0["cuda"]["launches"].as_array().expect("cuda.launches");
    let mut out: BTreeMap<u64, Vec<(String, u64, String)>> = BTreeMap::new();
    for l in launches {
        let line = l["site"]["line"].as_u64().unwrap_or(0);
        let api = l["api"].as_str().expect("api").to_owned();
        let kernel = l["kernel"].as_str().expect("kernel").to_owned();
        out.entry(line).or_default().push((api, u(&l["count"]), kernel));
    }
    out
}

#[test]
fn every_launch_form_counted_once_and_direct_driver_launches_after_10000_runtime_ones() {
    let test = "every_launch_form_counted_once_and_direct_driver_launches_after_10000_runtime_ones";
    let Some((_dir, run)) = record_on_standins(test, "forms") else { return };
    let report = run.json();
    let source = workspace_root().join("tests/workloads/cuda_patterns.py");
    let markers = markers_of(&source);
    let by_line = launches_by_line(&report);
    let (n_exc, n) = (10_000u64, 1_500u64);
    let expected: &[(&str, &str, u64)] = &[
        ("form_rt_exc", "cudaLaunchKernelExC", n_exc),
        ("form_rt_exc_ptsz", "cudaLaunchKernelExC_ptsz", n),
        ("form_rt_coop", "cudaLaunchCooperativeKernel", n),
        ("form_rt_coop_ptsz", "cudaLaunchCooperativeKernel_ptsz", n),
        ("form_drv", "cuLaunchKernel", 40),
        ("form_drv_ptsz", "cuLaunchKernel_ptsz", 35),
        ("form_drv_ex", "cuLaunchKernelEx", 30),
        ("form_drv_ex_ptsz", "cuLaunchKernelEx_ptsz", 20),
        ("form_drv_coop", "cuLaunchCooperativeKernel", 25),
        ("form_drv_coop_ptsz", "cuLaunchCooperativeKernel_ptsz", 15),
        ("form_mixed_rt", "cudaLaunchKernelExC", 8),
        ("form_mixed_drv", "cuLaunchKernelEx", 8),
    ];
    for &(marker, api, count) in expected {
        let line = markers[marker];
        let got = by_line.get(&line).cloned().unwrap_or_default();
        // One row: the call made there, never the driver launch it entered.
        assert_eq!(got.len(), 1, "@{marker} (line {line}): {got:?}\nall: {by_line:#?}\n{}", run.describe());
        let (a, c, kernel) = &got[0];
        assert_eq!((a.as_str(), *c), (api, count), "@{marker} (line {line}): {got:?}");
        if api.starts_with("cuda") {
            assert_eq!(kernel, "vector_add_kernel", "@{marker}");
        } else {
            assert!(kernel.starts_with("CUfunction 0x"), "@{marker}: {kernel}");
        }
    }
    let total: u64 = by_line.values().flatten().map(|l| l.1).sum();
    assert_eq!(total, expected.iter().map(|e| e.2).sum::<u64>(), "launches outside the markers: {by_line:#?}");
    // No launch function was taken off by the driver gate.
    let off = report.0["cuda"]["driver_probes_off"].as_array().cloned().unwrap_or_default();
    assert!(
        off.iter().all(|o| !o["function"].as_str().unwrap_or("").contains("Launch")),
        "launch functions taken off: {off:#?}"
    );
    let phase = run.stderr.lines().find(|l| l.starts_with("runtime ")).unwrap_or("?");
    eprintln!("{phase} (runtime ExC launches, other forms each, seconds)");
}

#[test]
fn real_libcudart_launch_forms_counted_at_their_lines() {
    let test = "real_libcudart_launch_forms_counted_at_their_lines";
    let Some(runs) = record_on_real_cudarts(test, "forms_real") else { return };
    for (major, run) in runs {
        eprintln!("the real libcudart.so.{major}");
        let report = run.json();
        let libs = report.0["cuda"]["libraries"].as_array().expect("cuda.libraries");
        assert_eq!(libs.len(), 1, "{libs:#?}");
        let functions: Vec<&str> = libs[0]["functions"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        for f in ["cudaLaunchKernelExC", "cudaLaunchKernelExC_ptsz", "cudaLaunchCooperativeKernel", "cudaLaunchCooperativeKernel_ptsz"] {
            assert!(functions.contains(&f), "{f} not probed: {functions:?}");
        }
        let source = workspace_root().join("tests/workloads/cuda_patterns.py");
        let markers = markers_of(&source);
        let by_line = launches_by_line(&report);
        let expected: &[(&str, &str, u64)] = &[
            ("real_exc", "cudaLaunchKernelExC", 30),
            ("real_exc_ptsz", "cudaLaunchKernelExC_ptsz", 20),
            ("real_coop", "cudaLaunchCooperativeKernel", 15),
            ("real_coop_ptsz", "cudaLaunchCooperativeKernel_ptsz", 10),
        ];
        for &(marker, api, count) in expected {
            let line = markers[marker];
            let got = by_line.get(&line).cloned().unwrap_or_default();
            assert_eq!(got, [(api.to_owned(), count, "vector_add_kernel".to_owned())], "@{marker} (line {line}): {by_line:#?}");
        }
        let total: u64 = by_line.values().flatten().map(|l| l.1).sum();
        assert_eq!(total, 75, "{by_line:#?}");
        let launches = report.0["cuda"]["launches"].as_array().unwrap();
        assert!(launches.iter().all(|l| l["site"]["function"] == "forms_real"), "{launches:#?}");
    }
}
