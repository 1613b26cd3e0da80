//! NCCL (issue 24, deliverable 5): collectives, point-to-point and group
//! calls counted with their bytes (count x the datatype's size), host time
//! and return codes, per Python site and per communicator.
//!
//! On tests/cudasim's NCCL stand-in (NOT NCCL: the real names and argument
//! ABI, `ncclReduce`'s communicator and stream on the stack) and on the
//! REAL libnccl.so.2 from nvidia-nccl-cu12 (its collectives fail without a
//! communicator, no GPU here, but are entered). Needs root, the binary,
//! gcc, python3 and PyPI once (target/cuda-real); under CI=true a missing
//! one fails the test.

use infertrace_e2e::serde_json::Value;
use infertrace_e2e::*;

#[test]
fn nccl_calls_counted_with_bytes_per_site_and_communicator() {
    let test = "nccl_calls_counted_with_bytes_per_site_and_communicator";
    let Some((dir, run)) = record_on_standins(test, "nccl") else { return };
    let report = run.json();
    let cuda = &report.0["cuda"];
    let m = markers_of(&workspace_root().join("tests/workloads/cuda_patterns.py"));
    // (marker, api, calls, bytes, communicator)
    let expected: &[(&str, &str, u64, u64, &str)] = &[
        ("nc_allreduce", "ncclAllReduce", 10, 10 * 1024 * 4, "0x1100"),
        ("nc_allgather", "ncclAllGather", 5, 5 * 256 * 2, "0x1100"),
        ("nc_reducescatter", "ncclReduceScatter", 4, 4 * 512, "0x2200"),
        ("nc_broadcast", "ncclBroadcast", 3, 3 * 100 * 8, "0x2200"),
        ("nc_bcast", "ncclBcast", 2, 2 * 64 * 4, "0x1100"),
        ("nc_reduce", "ncclReduce", 2, 2 * 32 * 2, "0x1100"),
        ("nc_alltoall", "ncclAlltoAll", 3, 3 * 128, "0x2200"),
        ("nc_send", "ncclSend", 4, 4 * 16 * 4, "0x1100"),
        ("nc_recv", "ncclRecv", 4, 4 * 16 * 4, "0x1100"),
    ];
    let collectives = cuda["collectives"].as_array().unwrap_or_else(|| panic!("no cuda.collectives: {cuda:#}"));
    for &(marker, api, n, bytes, comm) in expected {
        let r = call_row(cuda, &m, marker, api);
        assert_eq!((u(&r["count"]), u(&r["bytes"]), u(&r["errors"]), r["class"].as_str()), (n, bytes, 0, Some("collective")), "@{marker}: {r}");
        let c: Vec<&Value> = collectives.iter().filter(|c| c["api"] == api && c["site"]["line"] == m[marker]).collect();
        assert_eq!(c.len(), 1, "{api} @{marker}: {collectives:#?}");
        assert_eq!((c[0]["comm"].as_str(), u(&c[0]["count"]), u(&c[0]["bytes"])), (Some(comm), n, bytes), "{}", c[0]);
    }
    for (marker, api) in [("nc_group_start", "ncclGroupStart"), ("nc_group_end", "ncclGroupEnd")] {
        let r = call_row(cuda, &m, marker, api);
        assert_eq!((u(&r["count"]), u(&r["bytes"]), r["class"].as_str()), (4, 0, Some("other")), "@{marker}: {r}");
    }
    let bad = call_row(cuda, &m, "nc_bad", "ncclAllReduce");
    assert_eq!((u(&bad["count"]), u(&bad["errors"]), bad["return_codes"]["4"].as_u64()), (1, 1, Some(1)), "{bad}");
    let text = run_infertrace([std::ffi::OsString::from("report"), dir.join("rec.itr").into()]);
    text.assert_ok();
    assert!(text.stdout.contains("NCCL calls by communicator and site") && text.stdout.contains("ncclInvalidArgument"), "{}", text.stdout);
}

#[test]
fn real_libnccl_calls_counted_with_return_codes() {
    let test = "real_libnccl_calls_counted_with_return_codes";
    if !require(test, &[Need::Root, Need::Binary, Need::Gcc]) {
        return;
    }
    let Some(nccl) = real_nccl(test) else { return };
    let Some(sim) = cuda_standin_dir(test) else { return };
    let Some(python) = python3_executable(test) else { return };
    let dir = TempDir::new("cuda-nccl-real");
    // No private copy (~470 MB): only this test probes the file.
    let run = record_cuda_patterns(&dir, &python, &sim.join("libcudart.so.12"), &sim.join("libfakekernels.so"), "nccl_real", &[("NCCL", &nccl)]);
    let truth = return_codes_seen(&run.stderr);
    let report = run.json();
    let cuda = &report.0["cuda"];
    let m = markers_of(&workspace_root().join("tests/workloads/cuda_patterns.py"));
    for (marker, api, n, bytes) in [
        ("real_nc_allreduce", "ncclAllReduce", 3, 3 * 1024 * 4),
        ("real_nc_send", "ncclSend", 2, 2 * 16 * 2),
        ("real_nc_group_start", "ncclGroupStart", 1, 0),
        ("real_nc_group_end", "ncclGroupEnd", 1, 0),
    ] {
        let r = call_row(cuda, &m, marker, api);
        let codes = codes_of(&r);
        let want = truth.get(api).unwrap_or_else(|| panic!("no rc line for {api}: {}", run.stderr));
        let errors: u64 = want.iter().filter(|(k, _)| k.as_str() != "0").map(|(_, v)| v).sum();
        assert_eq!((u(&r["count"]), u(&r["bytes"]), u(&r["errors"]), &codes), (n, bytes, errors, want), "@{marker}: {r}");
    }
    let libs: Vec<&str> = cuda["libraries"].as_array().expect("libraries").iter().filter_map(|l| l["path"].as_str()).collect();
    assert!(libs.iter().any(|p| p.ends_with("libnccl.so.2")), "{libs:?}");
}

/// `waited PHASE N SECONDS` lines of the workload's stderr: its own clock.
fn waited(stderr: &str) -> std::collections::HashMap<String, (u64, f64)> {
    stderr
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("waited ")?.split_whitespace();
            Some((w.next()?.to_owned(), (w.next()?.parse().ok()?, w.next()?.parse().ok()?)))
        })
        .collect()
}

/// A host that waits on collectives (issue 24, deliverable 5): the NCCL
/// stand-in's collectives keep their stream busy (1 GB/s), and the syncs
/// that wait for them, directly, through an event and
/// `cudaStreamWaitEvent` (torch's `work.wait()` then `.item()`), the
/// device, an event, or polling, count as collective waits at their line
/// and at the collective's; a sync with no collective queued does not.
/// The verdict names `collective` at the line that waits most.
#[test]
fn syncs_that_wait_for_collectives_are_collective_waits() {
    let test = "syncs_that_wait_for_collectives_are_collective_waits";
    let Some((dir, run)) = record_on_standins(test, "nccl_wait") else { return };
    let truth = waited(&run.stderr);
    let report = run.json();
    let cuda = &report.0["cuda"];
    let m = markers_of(&workspace_root().join("tests/workloads/cuda_patterns.py"));
    // (sync marker, API, phase, collective marker, collective API)
    let cases: &[(&str, &str, &str, &str, &str)] = &[
        ("nw_stream_sync", "cudaStreamSynchronize", "stream", "nw_allreduce", "ncclAllReduce"),
        ("nw_torch_item_sync", "cudaStreamSynchronize", "torch", "nw_torch_allreduce", "ncclAllReduce"),
        ("nw_device_sync", "cudaDeviceSynchronize", "device", "nw_allgather", "ncclAllGather"),
        ("nw_event_sync", "cudaEventSynchronize", "event", "nw_event_allreduce", "ncclAllReduce"),
        ("nw_poll_query", "cudaStreamQuery", "poll", "nw_poll_allreduce", "ncclAllReduce"),
    ];
    let collectives = cuda["collectives"].as_array().unwrap_or_else(|| panic!("no cuda.collectives: {cuda:#}"));
    for &(marker, api, phase, coll_marker, coll_api) in cases {
        let (n, secs) = *truth.get(phase).unwrap_or_else(|| panic!("no `waited {phase}` line: {}", run.stderr));
        let r = call_row(cuda, &m, marker, api);
        let (waits, wait_ns) = (u(&r["collective_waits"]), u(&r["collective_wait_ns"]));
        eprintln!("[{test}] {phase}: {waits} collective waits, {:.3} s traced, {secs:.3} s by the workload's clock", wait_ns as f64 / 1e9);
        assert_eq!(waits, n, "@{marker}: {r}");
        // Inside the workload's own clock around the same calls, and most
        // of it: each wait is the collective's 4-16 ms transfer.
        assert!(wait_ns as f64 <= secs * 1e9 && wait_ns as f64 >= secs * 1e9 * 0.5, "@{marker}: {wait_ns} ns traced, {secs} s measured: {r}");
        let c = call_row(cuda, &m, coll_marker, coll_api);
        assert_eq!((u(&c["count"]), u(&c["collective_waits"])), (n, n), "@{coll_marker}: {c}");
        let row: Vec<&Value> = collectives.iter().filter(|c| c["api"] == coll_api && c["site"]["line"] == m[coll_marker]).collect();
        assert_eq!(row.len(), 1, "{coll_api} @{coll_marker}: {collectives:#?}");
        assert_eq!((u(&row[0]["count"]), u(&row[0]["host_waits"])), (n, n), "{}", row[0]);
        assert_eq!(u(&row[0]["host_wait_ns"]), wait_ns, "{}", row[0]);
    }
    // No collective queued: a plain sync.
    let plain = call_row(cuda, &m, "nw_plain_sync", "cudaStreamSynchronize");
    assert_eq!((u(&plain["count"]), u(&plain["collective_waits"])), (20, 0), "{plain}");
    // The event record and the stream wait are not waits.
    for (marker, api) in [("nw_torch_record", "cudaEventRecord"), ("nw_torch_wait_event", "cudaStreamWaitEvent")] {
        let r = call_row(cuda, &m, marker, api);
        assert!(r.get("collective_waits").is_none(), "@{marker}: {r}");
    }
    // The verdict: the process waits on collectives, most at the stream sync.
    let p = report.0["verdict"]["processes"].as_array().and_then(|p| p.first()).unwrap_or_else(|| panic!("no verdict: {:#}", report.0["verdict"]));
    let b = &p["bottleneck"];
    eprintln!("[{test}] verdict: {b}");
    assert_eq!((b["class"].as_str(), b["site"]["site"]["line"].as_u64()), (Some("collective"), m.get("nw_stream_sync").copied()), "{b:#}");
    let text = run_infertrace([std::ffi::OsString::from("report"), dir.join("rec.itr").into()]);
    text.assert_ok();
    for want in ["waiting on collectives (NCCL)", "Host waits on NCCL collectives by site", "WAITED"] {
        assert!(text.stdout.contains(want), "{want:?} missing:\n{}", text.stdout);
    }
}
