//! The input pipeline in the verdict (issue 26; docs/verdict.md#input-pipeline)
//! on the REAL torch wheel (CPU execution; `cargo xtask setup` installs it):
//! a DataLoader with 2 workers whose `__getitem__` costs ~5 ms of Python
//! (tests/workloads/pipeline.py). The main process's headline is
//! `input_pipeline` at the `next(it)` line, naming the workers (the pids the
//! workload printed) and their `__getitem__` line; the workers are one row;
//! the queue feeder threads are left out as helpers; the main thread's
//! pipeline time agrees with the wait the loop measured itself.
//!
//! Needs root, the binary, python3 with torch. Under CI=true a missing one fails.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use infertrace_e2e::serde_json::Value;
use infertrace_e2e::*;

fn source() -> PathBuf {
    workspace_root().join("tests/workloads/pipeline.py")
}

struct Piped {
    run: Run,
    report: Report,
    out: PathBuf,
    _dir: TempDir,
}

impl Piped {
    /// A `KEY VALUE` line the workload printed on stderr.
    fn printed(&self, key: &str) -> String {
        self.run
            .stderr
            .lines()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| panic!("the workload printed no {key}\n{}", self.run.describe()))
    }

    fn number(&self, key: &str) -> f64 {
        self.printed(key).parse().unwrap_or_else(|e| panic!("{key}: {e}"))
    }

    #[track_caller]
    fn main_pid(&self) -> u64 {
        self.number("main_pid") as u64
    }

    fn worker_pids(&self) -> BTreeSet<u64> {
        self.printed("worker_pids").split(',').map(|p| p.parse().unwrap()).collect()
    }

    fn verdict(&self) -> &Value {
        &self.report.0["verdict"]
    }

    #[track_caller]
    fn process(&self, pid: u64) -> &Value {
        self.verdict()["processes"]
            .as_array()
            .and_then(|a| a.iter().find(|p| p["pid"] == pid))
            .unwrap_or_else(|| panic!("no verdict for pid {pid}: {:#}", self.verdict()))
    }

    /// `infertrace report` of the recording: the text a user reads.
    fn text(&self) -> String {
        let r = run_infertrace(["report".as_ref(), self.out.as_os_str()]);
        r.assert_ok();
        r.stdout
    }
}

/// Two screens of a terminal: the compact default report of a short run
/// fits in them (docs/report.md; `--verbose` shows everything).
const TWO_SCREENS: usize = 2 * 75;

/// The default text report fits [`TWO_SCREENS`], says what it left out, and
/// holds no detail of the tracer's internals.
#[track_caller]
fn assert_fits_two_screens(test: &str, text: &str) {
    let n = text.lines().count();
    note(test, &format!("default text report: {n} lines (two screens: {TWO_SCREENS})"));
    assert!(n <= TWO_SCREENS, "{n} lines:\n{text}");
    assert!(text.contains("(compact report: left out "), "no word on what was left out:\n{text}");
    for internal in ["detail: ", "Python stacks attributed", "Python stacks were deeper than", "kernel copies that cut"] {
        assert!(!text.contains(internal), "{internal:?} in the default report:\n{text}");
    }
}

/// `import torch; torch.cuda.is_available()` (the real wheel, no GPU): the
/// headline is the import's own work, not a helper thread's wait; the
/// default report fits two screens, `--verbose` shows the details (the
/// interpreter seen, the CUDA libraries probed) that JSON keeps in
/// `details`.
#[test]
fn import_torch_reads_as_its_own_work_on_two_screens() {
    let test = "import_torch_reads_as_its_own_work_on_two_screens";
    if !require(test, &[Need::Root, Need::Binary]) {
        return;
    }
    let Some(python) = python_with_torch(test) else { return };
    let dir = TempDir::new("verdict-import-torch");
    let out = dir.join("rec.itr");
    let run = run_cmd(
        infertrace(["record".as_ref(), "-q".as_ref(), "-o".as_ref(), out.as_os_str(), "--".as_ref(), python.as_os_str()])
            .args(["-c", "import torch; print(torch.cuda.is_available())"]),
        RUN_TIMEOUT,
    );
    run.assert_ok();
    let text = run.stdout.clone();
    assert_fits_two_screens(test, &text);
    assert!(!text.contains(": bottleneck waiting on other threads"), "a helper's wait heads the verdict:\n{text}");
    let json = run_infertrace(["report".as_ref(), out.as_os_str(), "--format".as_ref(), "json".as_ref()]);
    json.assert_ok();
    let report = json.json();
    let pid = report.one_target("launched")["pid"].as_u64().expect("pid");
    let v = report.0["verdict"]["processes"].as_array().and_then(|a| a.iter().find(|p| p["pid"] == pid)).cloned().expect("a verdict for python");
    let class = v["bottleneck"]["class"].as_str().unwrap_or_default().to_owned();
    note(test, &format!("headline {class}: {}", v["bottleneck"]));
    // The import's own work: interpreting, native init, reading files, or
    // waiting for a CPU (a loaded 2-core machine); never a helper's wait.
    assert!(["python_compute", "native_compute", "io", "cpu_starvation"].contains(&class.as_str()), "headline {class}: {v:#}");
    let details: Vec<String> = report.0["details"].as_array().map(|a| a.iter().filter_map(|d| d.as_str().map(str::to_owned)).collect()).unwrap_or_default();
    let attributed = format!("pid {pid}: CPython ");
    assert!(details.iter().any(|d| d.starts_with(&attributed)), "no detail on the interpreter: {details:#?}");
    let verbose = run_infertrace(["report".as_ref(), "--verbose".as_ref(), out.as_os_str()]);
    verbose.assert_ok();
    note(test, &format!("--verbose: {} lines", verbose.stdout.lines().count()));
    assert!(verbose.stdout.lines().count() > text.lines().count(), "--verbose shows no more:\n{}", verbose.stdout);
    assert!(verbose.stdout.contains(&format!("detail: {attributed}")), "{}", verbose.stdout);
    assert!(!verbose.stdout.contains("(compact report:"), "{}", verbose.stdout);
}

/// The interpreter python3 runs, when it imports torch.
fn python_with_torch(test: &str) -> Option<PathBuf> {
    let python = python3_executable(test)?;
    let ok = Command::new(&python).args(["-c", "import torch.utils.data"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        skip(test, &format!("PyTorch (the torch wheel) for {} (cargo xtask setup)", python.display()));
        return None;
    }
    Some(python)
}

fn record(test: &str, mode: &str, seconds: &str) -> Option<Piped> {
    if !require(test, &[Need::Root, Need::Binary]) {
        return None;
    }
    let python = python_with_torch(test)?;
    let dir = TempDir::new("verdict-pipeline");
    let out = dir.join("rec.itr");
    let src = source();
    let cmd = [python.as_os_str(), src.as_os_str(), mode.as_ref(), seconds.as_ref()];
    let (run, report) = record_launch(&out, &cmd);
    Some(Piped { run, report, out, _dir: dir })
}

fn note(test: &str, what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{test}: {what}");
}

fn pids(v: &Value) -> BTreeSet<u64> {
    v.as_array().map(|a| a.iter().filter_map(Value::as_u64).collect()).unwrap_or_default()
}

/// Checks the main process's verdict: `input_pipeline` at the `next(it)`
/// The main process's headline, checked as `input_pipeline` at `main`'s
/// `next_line` (`what` names the case in messages); its producers.
#[track_caller]
fn check_head<'a>(test: &str, what: &str, main: &'a Value, next_line: u64) -> &'a Value {
    let b = &main["bottleneck"];
    note(test, &format!("{what}: main {} {:.1}% at {}; producers {}", b["class"], b["share"].as_f64().unwrap_or(0.0) * 100.0, b["site"]["site"], b["producers"]));
    assert_eq!(b["class"], "input_pipeline", "{what}: {main:#}");
    assert_eq!((b["site"]["site"]["function"].as_str(), b["site"]["site"]["line"].as_u64()), (Some("main"), Some(next_line)), "{what}: {b:#}");
    &b["producers"]
}

/// The main thread's own time in the pipeline, against the `waited`
/// seconds the loop measured in `next()` by its own clock.
#[track_caller]
fn check_piped_time(test: &str, what: &str, main: &Value, main_pid: u64, waited: f64) {
    let thread = main["threads"].as_array().and_then(|t| t.iter().find(|t| t["tid"] == main_pid)).unwrap_or_else(|| panic!("no main thread: {main:#}"));
    let piped = thread["classes"].as_array().unwrap().iter().find(|c| c["class"] == "input_pipeline").and_then(|c| c["time_ns"].as_u64()).unwrap_or(0) as f64 / 1e9;
    note(test, &format!("{what}: main thread input_pipeline {piped:.3} s, the loop measured {waited:.3} s in next()"));
    assert!(piped >= 0.6 * waited && piped <= 1.1 * waited + 0.2, "{what}: input_pipeline {piped:.3} s vs {waited:.3} s measured");
}

/// line, naming `workers` and the `__getitem__` line, with the main
/// thread's pipeline time within bounds of what the loop measured.
fn check_main(test: &str, p: &Piped, workers: &BTreeSet<u64>, main_pid: u64, waited: Option<f64>) {
    let m = markers_of(&source());
    let main = p.process(main_pid);
    let pr = check_head(test, "dataloader", main, m["next"]);
    assert_eq!(pr["kind"], "dataloader_workers", "{pr:#}");
    assert_eq!(&pids(&pr["pids"]), workers, "the producers are the workers the DataLoader started: {pr:#}");
    assert!(matches!(pr["bound_by"].as_str(), Some("python_compute" | "cpu_starvation")), "{pr:#}");
    assert_eq!((pr["site"]["site"]["function"].as_str(), pr["site"]["site"]["line"].as_u64()), (Some("SlowDS.__getitem__"), Some(m["getitem"])), "{pr:#}");
    if let Some(waited) = waited {
        check_piped_time(test, "dataloader", main, main_pid, waited);
    }
    // The workers: one row.
    let groups = p.verdict()["groups"].as_array().unwrap_or_else(|| panic!("no verdict.groups: {:#}", p.verdict()));
    let g = groups.iter().find(|g| g["ppid"] == main_pid).unwrap_or_else(|| panic!("no group of the main's workers: {groups:#?}"));
    assert_eq!(&pids(&g["pids"]), workers, "{g:#}");
}

/// Checks the text verdict: the main's headline, the producers line, no
/// helper-thread headline, the workers in one row; prints its length.
fn check_text(test: &str, p: &Piped, workers: &BTreeSet<u64>, main_pid: u64) {
    let m = markers_of(&source());
    let text = p.text();
    let verdict: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("== verdict")).skip(1).take_while(|l| !l.starts_with("== ")).collect();
    note(test, &format!("text report: {} lines, verdict {} lines", text.lines().count(), verdict.len()));
    assert_fits_two_screens(test, &text);
    let head = format!("pid {main_pid} ");
    let main = verdict.iter().find(|l| l.starts_with(&head)).unwrap_or_else(|| panic!("no verdict line for the main process:\n{}", verdict.join("\n")));
    assert!(main.contains(": bottleneck input pipeline ") && main.contains(&format!("at main (pipeline.py:{})", m["next"])) && main.contains("for DataLoader worker"), "{main}");
    let producers = verdict.iter().find(|l| l.starts_with("  producers: DataLoader worker")).unwrap_or_else(|| panic!("no producers line:\n{}", verdict.join("\n")));
    assert!(producers.contains(&format!("at SlowDS.__getitem__ (pipeline.py:{})", m["getitem"])), "{producers}");
    assert!(!verdict.iter().any(|l| l.contains(": bottleneck waiting on other threads")), "a waiting headline:\n{}", verdict.join("\n"));
    let rows: Vec<&&str> = verdict.iter().filter(|l| l.contains(&format!("({} worker processes of pid {main_pid})", workers.len()))).collect();
    assert_eq!(rows.len(), 1, "the workers in one row:\n{}", verdict.join("\n"));
    for w in workers {
        assert!(!verdict.iter().any(|l| l.starts_with(&format!("pid {w} "))), "worker {w} has a row of its own:\n{}", verdict.join("\n"));
    }
    assert!(verdict.iter().any(|l| l.contains("helper thread")), "the feeder threads are not said to be left out:\n{}", verdict.join("\n"));
}

#[test]
fn dataloader_wait_is_input_pipeline_naming_the_workers_line() {
    let test = "dataloader_wait_is_input_pipeline_naming_the_workers_line";
    let Some(p) = record(test, "persistent", "4") else { return };
    let workers = p.worker_pids();
    assert_eq!(workers.len(), 2, "{}", p.run.stderr);
    check_main(test, &p, &workers, p.main_pid(), Some(p.number("waited_s")));
    check_text(test, &p, &workers, p.main_pid());
}

/// `persistent_workers=False`: 2 new workers per epoch, each a short life;
/// all of them one row, all named producers.
#[test]
fn fresh_workers_are_one_row_feeding_the_pipeline() {
    let test = "fresh_workers_are_one_row_feeding_the_pipeline";
    let Some(p) = record(test, "fresh", "4") else { return };
    let workers = p.worker_pids();
    assert!(workers.len() >= 6, "{}", p.run.stderr);
    check_main(test, &p, &workers, p.main_pid(), Some(p.number("waited_s")));
    check_text(test, &p, &workers, p.main_pid());
    // No worker thread outlives its process's main thread (a thread whose
    // exit was missed ran to the end of the window: 6.9 s in a 0.7 s worker).
    let threads = p.report.0["threads"].as_array().expect("threads");
    for w in &workers {
        let of = |pred: &dyn Fn(&Value) -> bool| threads.iter().filter(|t| t["pid"] == *w && pred(t)).filter_map(|t| t["wall_ns"].as_u64()).max().unwrap_or(0);
        let leader = of(&|t| t["tid"] == *w);
        let longest = of(&|_| true);
        assert!(leader > 0 && longest <= leader + 100_000_000, "worker {w}: a thread of {longest} ns, its main thread {leader} ns");
    }
}

/// `record -p MAIN` on a loader whose 2 persistent workers already run:
/// the workers are traced too (a note says so), and the verdict is the
/// same; with `--no-descendants` they are not.
#[test]
fn attach_takes_the_existing_workers() {
    let test = "attach_takes_the_existing_workers";
    if !require(test, &[Need::Root, Need::Binary]) {
        return;
    }
    let Some(python) = python_with_torch(test) else { return };
    for descendants in [true, false] {
        let mut child = Command::new(&python).arg(source()).args(["attach", "6"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let mut guard = KillOnDrop::new(child.id());
        let main_pid = u64::from(child.id());
        let lines = line_channel(child.stdout.take().unwrap());
        let ready = lines.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|e| panic!("no ready line: {e}"));
        let workers: BTreeSet<u64> = ready.strip_prefix("ready ").unwrap_or_else(|| panic!("{ready:?}")).split(',').map(|p| p.parse().unwrap()).collect();
        assert_eq!(workers.len(), 2, "{ready}");
        let dir = TempDir::new("verdict-pipeline-attach");
        let out = dir.join("rec.itr");
        let mut args: Vec<std::ffi::OsString> = vec!["record".into(), "-q".into(), "-p".into(), main_pid.to_string().into(), "-d".into(), "3".into(), "--format".into(), "json".into(), "-o".into(), out.clone().into()];
        if !descendants {
            args.push("--no-descendants".into());
        }
        let run = run_infertrace(&args);
        run.assert_ok();
        let report = run.json();
        let _ = child.kill();
        let _ = child.wait();
        guard.disarm();
        let traced: BTreeSet<u64> = report.0["targets"].as_array().map(|a| a.iter().filter_map(|t| t["pid"].as_u64()).collect()).unwrap_or_default();
        let notes: Vec<String> = report.0["notes"].as_array().map(|a| a.iter().filter_map(|n| n.as_str().map(str::to_owned)).collect()).unwrap_or_default();
        let said = notes.iter().find(|n| n.starts_with(&format!("-p {main_pid}: also traced its 2 existing descendant processes")));
        note(test, &format!("descendants {descendants}: traced {traced:?}; note {said:?}"));
        if !descendants {
            assert!(workers.is_disjoint(&traced), "--no-descendants traced the workers: {traced:?}");
            assert!(said.is_none(), "{notes:#?}");
            continue;
        }
        assert!(workers.is_subset(&traced), "the workers {workers:?} are not traced: {traced:?}");
        assert!(said.is_some(), "no note on the descendants: {notes:#?}");
        let p = Piped { run, report, out, _dir: dir };
        check_main(test, &p, &workers, main_pid, None);
    }
}

/// A loop fed by a process pool (tests/workloads/pool_pipeline.py, the
/// standard library only): `multiprocessing.Pool.imap` and
/// `ProcessPoolExecutor.map` over 2 forked workers whose `work` costs ~5 ms
/// of Python, and the Pool with workers forked by a fork server (3.14's
/// default start method: the workers are the server's children). The main's headline is `input_pipeline` at the `next()` line,
/// fed by "processes" (the workers the workload saw), bound by their
/// `work` line, with the pool's advice; its pipeline time agrees with the
/// loop's own clock.
#[test]
fn a_loop_fed_by_a_process_pool_is_input_pipeline() {
    let test = "a_loop_fed_by_a_process_pool_is_input_pipeline";
    if !require(test, &[Need::Root, Need::Binary]) {
        return;
    }
    let Some(python) = python3_executable(test) else { return };
    let src = workspace_root().join("tests/workloads/pool_pipeline.py");
    let m = markers_of(&src);
    for mode in ["pool", "futures", "forkserver"] {
        let dir = TempDir::new("verdict-pool");
        let out = dir.join("rec.itr");
        let (run, report) = record_launch(&out, &[python.as_os_str(), src.as_os_str(), mode.as_ref(), "3".as_ref()]);
        let p = Piped { run, report, out, _dir: dir };
        let (main_pid, workers, waited) = (p.main_pid(), p.worker_pids(), p.number("waited_s"));
        assert_eq!(workers.len(), 2, "{}", p.run.stderr);
        let main = p.process(main_pid);
        let pr = check_head(test, mode, main, m["next"]);
        assert_eq!(pr["kind"], "processes", "{mode}: {pr:#}");
        assert_eq!(&pids(&pr["pids"]), &workers, "{mode}: the producers are the pool's workers: {pr:#}");
        assert_eq!((pr["site"]["site"]["function"].as_str(), pr["site"]["site"]["line"].as_u64()), (Some("work"), Some(m["work"])), "{mode}: {pr:#}");
        let advice = main["bottleneck"]["advice"].as_str().unwrap_or_default();
        assert!(advice.contains("worker processes") && !advice.contains("num_workers"), "{mode}: {advice}");
        check_piped_time(test, mode, main, main_pid, waited);
    }
}
