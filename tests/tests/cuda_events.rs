//! Events and queries (issue 24, deliverable 3): `cudaEventRecord*`,
//! `cudaStreamWaitEvent*`, `cudaEventQuery`, `cudaStreamQuery*` and the
//! driver's forms counted once each; an event synchronize waits for the
//! copy its event was recorded behind (torch's `non_blocking` copy +
//! `Event.synchronize()`, vLLM's token return), so `tiny_dtoh_sync` and
//! `sync_after_copy` fire at the copies' lines; polling counted with its
//! not-ready answers against the workload's own count, and `sync_polling`
//! made for a spin, not for a once-per-step check.
//!
//! On tests/cudasim's stand-ins (NOT CUDA) and on the REAL libcudart.so.12
//! and .so.13 (their calls fail without a driver, but are entered). Needs
//! root, the binary, gcc, python3 and PyPI once (target/cuda-real); under
//! CI=true a missing one fails the test.

use std::collections::BTreeMap;

use infertrace_e2e::serde_json::{json, Value};
use infertrace_e2e::*;

/// The findings of `kind` at `marker`'s line (`root`: the report).
fn findings_at(root: &Value, m: &BTreeMap<String, u64>, marker: &str, kind: &str) -> Vec<Value> {
    rows_at_line(&root["findings"], m[marker]).into_iter().filter(|f| f["kind"] == kind).collect()
}

/// `poll NAME NOT_READY WAITS SECONDS` lines of the workload.
fn polls_seen(stderr: &str) -> BTreeMap<String, (u64, u64, f64)> {
    stderr
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f[..] {
                ["poll", name, n, w, s] => Some((name.to_owned(), (n.parse().ok()?, w.parse().ok()?, s.parse().ok()?))),
                _ => None,
            }
        })
        .collect()
}

#[test]
fn event_syncs_cover_their_copies_and_spins_are_found() {
    let test = "event_syncs_cover_their_copies_and_spins_are_found";
    let Some((dir, run)) = record_on_standins(test, "events") else { return };
    let report = run.json();
    let cuda = &report.0["cuda"];
    let m = markers_of(&workspace_root().join("tests/workloads/cuda_patterns.py"));
    // Each call counted once at its line, as the API called (runtime calls
    // enter the driver's inside: not counted again).
    for (marker, api, n) in [
        ("ev_torch_copy", "cudaMemcpyAsync", 40),
        ("ev_torch_record", "cudaEventRecord", 40),
        ("ev_torch_sync", "cudaEventSynchronize", 40),
        ("ev_vllm_record_main", "cudaEventRecord", 30),
        ("ev_vllm_wait", "cudaStreamWaitEvent", 30),
        ("ev_vllm_record", "cudaEventRecordWithFlags", 30),
        ("ev_vllm_sync", "cudaEventSynchronize", 30),
        ("ev_upload_record", "cudaEventRecord_ptsz", 20),
        ("ev_other_record", "cudaEventRecordWithFlags_ptsz", 20),
        ("ev_wait_ptsz", "cudaStreamWaitEvent_ptsz", 1),
        ("ev_poll_check", "cudaStreamQuery", 20),
        ("ev_drv_record", "cuEventRecord", 3),
        ("ev_drv_record_ptsz", "cuEventRecord_ptsz", 3),
        ("ev_drv_record_flags", "cuEventRecordWithFlags", 3),
        ("ev_drv_record_flags_ptsz", "cuEventRecordWithFlags_ptsz", 3),
        ("ev_drv_wait", "cuStreamWaitEvent", 3),
        ("ev_drv_wait_ptsz", "cuStreamWaitEvent_ptsz", 3),
        ("ev_drv_query", "cuEventQuery", 3),
        ("ev_drv_stream_query", "cuStreamQuery", 3),
        ("ev_drv_stream_query_ptsz", "cuStreamQuery_ptsz", 3),
    ] {
        let r = call_row(cuda, &m, marker, api);
        assert_eq!((u(&r["count"]), u(&r["errors"])), (n, 0), "@{marker}: {r}\n{}", run.describe());
    }
    let names: Vec<&str> = cuda["calls"].as_array().unwrap().iter().filter_map(|c| c["api"].as_str()).collect();
    for inner in ["cuEventRecord", "cuEventQuery", "cuStreamQuery_ptsz", "cuStreamWaitEvent"] {
        let n: u64 = cuda["calls"].as_array().unwrap().iter().filter(|c| c["api"] == inner).map(|c| u(&c["count"])).sum();
        assert_eq!(n, 3, "{inner}: only the direct calls count: {names:?}");
    }

    // The event syncs waited for the copies recorded behind: the findings
    // are at the copies' lines.
    for (marker, kind, n) in [("ev_torch_copy", "tiny_dtoh_sync", 40), ("ev_vllm_copy", "tiny_dtoh_sync", 30), ("ev_upload_copy", "sync_after_copy", 20)] {
        let f = findings_at(&report.0, &m, marker, kind);
        assert_eq!(f.len(), 1, "{kind} @{marker}: {:#}", report.0["findings"]);
        assert_eq!(u(&f[0]["count"]), n, "{kind} @{marker}: {}", f[0]);
    }
    // Recorded on another stream than the copy's: no wait for the copy.
    assert!(rows_at_line(&report.0["findings"], m["ev_other_copy"]).is_empty(), "{:#}", report.0["findings"]);
    let torch_sync = call_row(cuda, &m, "ev_torch_sync", "cudaEventSynchronize");
    assert!(u(&torch_sync["total_ns"]) > 0, "{torch_sync}");

    // Polling: the not-ready answers the workload counted, exactly; the
    // waits (those with one not-ready answer or more), exactly; their
    // wall time within what the workload measured around its loops.
    let truth = polls_seen(&run.stderr);
    for (name, marker, api) in [("event", "ev_poll_event", "cudaEventQuery"), ("stream", "ev_poll_stream", "cudaStreamQuery_ptsz")] {
        let (not_ready, waits, secs) = *truth.get(name).unwrap_or_else(|| panic!("no poll line: {}", run.stderr));
        let r = call_row(cuda, &m, marker, api);
        eprintln!("{test}: {api}: {not_ready} not ready in {waits} waits, {secs:.4} s (workload); recorded {r}");
        assert!(waits >= 5 && not_ready >= 100, "the workload hardly spun ({not_ready} in {waits} waits): the test proves nothing");
        assert_eq!((u(&r["not_ready"]), u(&r["poll_waits"]), u(&r["errors"])), (not_ready, waits, 0), "{r}");
        assert_eq!(r["return_codes"]["600"], json!(not_ready), "{r}");
        let spun = u(&r["poll_ns"]) as f64 / 1e9;
        assert!(spun <= secs * 1.05 + 0.002 && spun >= secs * 0.5, "{api}: spun {spun:.4} s recorded, {secs:.4} s measured");
        let f = findings_at(&report.0, &m, marker, "sync_polling");
        assert_eq!(f.len(), 1, "sync_polling @{marker}: {:#}", report.0["findings"]);
        assert_eq!((u(&f[0]["count"]), u(&f[0]["waits"])), (not_ready, waits), "{}", f[0]);
    }
    // Once per step of other work is not a spin.
    let check = call_row(cuda, &m, "ev_poll_check", "cudaStreamQuery");
    assert!(findings_at(&report.0, &m, "ev_poll_check", "sync_polling").is_empty(), "{check}: {:#}", report.0["findings"]);
    let text = run_infertrace([std::ffi::OsString::from("report"), dir.join("rec.itr").into()]);
    let text = text.stdout;
    assert!(text.contains("found the GPU work not done"), "{text}");
}

#[test]
fn real_libcudart_event_calls_counted_with_return_codes() {
    let test = "real_libcudart_event_calls_counted_with_return_codes";
    let Some(runs) = record_on_real_cudarts(test, "events_real") else { return };
    let m = markers_of(&workspace_root().join("tests/workloads/cuda_patterns.py"));
    for (major, run) in runs {
        eprintln!("the real libcudart.so.{major}");
        for (marker, api) in [
            ("real_ev_record", "cudaEventRecord"),
            ("real_ev_record_ptsz", "cudaEventRecord_ptsz"),
            ("real_ev_record_flags", "cudaEventRecordWithFlags"),
            ("real_ev_record_flags_ptsz", "cudaEventRecordWithFlags_ptsz"),
            ("real_ev_wait", "cudaStreamWaitEvent"),
            ("real_ev_wait_ptsz", "cudaStreamWaitEvent_ptsz"),
            ("real_ev_query", "cudaEventQuery"),
            ("real_ev_stream_query", "cudaStreamQuery"),
            ("real_ev_stream_query_ptsz", "cudaStreamQuery_ptsz"),
        ] {
            assert_failed_as_seen(&run, &m, marker, api, 2);
        }
    }
}
