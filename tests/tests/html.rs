//! `report --format html` opened in a real browser (Debian's headless
//! Chromium, network off): the page runs without a console error, its DOM
//! holds the verdict, the findings with their lines and one bar per thread
//! with the text report's numbers, its flame graphs add up to the
//! recording's totals and its charts hold the recording's series, a
//! screenshot is not blank, and hostile names stay text.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use infertrace_e2e::serde_json::{self, Value};
use infertrace_e2e::*;

/// What a headless Chromium made of a page.
struct Opened {
    dom: String,
    /// `CONSOLE` lines Chromium logged (console messages and uncaught errors).
    console: Vec<String>,
    elapsed: Duration,
}

/// The flags that keep Chromium off the network and out of the way here.
fn chromium(profile: &Path) -> Command {
    let mut c = Command::new("chromium");
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--proxy-server=127.0.0.1:9",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
    ]);
    c.arg(format!("--user-data-dir={}", profile.display()));
    c
}

fn url(page: &Path) -> String {
    format!("file://{}", page.display())
}

/// The DOM of `page` after its scripts ran.
fn open(dir: &TempDir, page: &Path) -> Opened {
    let started = Instant::now();
    let run = run_cmd(chromium(&dir.join("chromium-profile")).arg("--dump-dom").arg(url(page)), Duration::from_secs(120));
    assert!(run.status.success(), "chromium --dump-dom failed: {}", run.describe());
    let console = run.stderr.lines().filter(|l| l.contains(":CONSOLE")).map(str::to_owned).collect();
    Opened { dom: run.stdout, console, elapsed: started.elapsed() }
}

/// A screenshot of `page`, decoded: (width, height, RGBA rows).
fn screenshot(dir: &TempDir, page: &str, png: &Path) -> (u32, u32, Vec<u8>) {
    let run = run_cmd(
        chromium(&dir.join("chromium-profile")).arg("--window-size=1280,1600").arg(format!("--screenshot={}", png.display())).arg(page),
        Duration::from_secs(120),
    );
    assert!(run.status.success() && png.is_file(), "chromium --screenshot failed: {}", run.describe());
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(png).unwrap()));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("a size")];
    let info = reader.next_frame(&mut buf).expect("a frame");
    buf.truncate(info.buffer_size());
    let rgba = match info.color_type {
        png::ColorType::Rgba => buf,
        png::ColorType::Rgb => buf.chunks(3).flat_map(|p| [p[0], p[1], p[2], 255]).collect(),
        other => panic!("unexpected screenshot colour type {other:?}"),
    };
    (info.width, info.height, rgba)
}

/// Pixels unlike the first pixel, and distinct colours.
fn pixel_content(rgba: &[u8]) -> (usize, usize) {
    let first = &rgba[..4];
    let differ = rgba.chunks(4).filter(|p| *p != first).count();
    let mut colours: Vec<[u8; 4]> = rgba.chunks(4).map(|p| [p[0], p[1], p[2], p[3]]).collect();
    colours.sort_unstable();
    colours.dedup();
    (differ, colours.len())
}

/// Where screenshots are kept after the test (a test artifact).
fn artifact(name: &str) -> PathBuf {
    let dir = workspace_root().join("target/test-artifacts/html");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The page's embedded data (`#infertrace-data`), from the DOM or the file.
fn page_data(html: &str) -> Value {
    let start = html.find("id=\"infertrace-data\"").expect("the page's data element");
    let body = &html[start..];
    let body = &body[body.find('>').unwrap() + 1..];
    let body = &body[..body.find("</script>").expect("the end of the data")];
    serde_json::from_str(body).unwrap_or_else(|e| panic!("the page's data is not JSON ({e}): {}", &body[..body.len().min(300)]))
}

/// The text of each `<td>` of a table row's HTML, tags stripped.
fn cells(row: &str) -> Vec<String> {
    row.split("<td").skip(1).map(|c| strip_tags(&c[c.find('>').unwrap() + 1..c.find("</td>").unwrap_or(c.len())])).collect()
}

fn strip_tags(s: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in s.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"")
}

/// The `<tr>` of thread `tid` of `pid` in the DOM.
fn thread_row(dom: &str, pid: u64, tid: u64) -> Option<&str> {
    let key = format!("<tr class=\"thread\" data-pid=\"{pid}\" data-tid=\"{tid}\">");
    let at = dom.find(&key)?;
    let row = &dom[at..];
    Some(&row[..row.find("</tr>")?])
}

/// The text report's thread lines: tid -> (wall, [cpu, sys, rq, gil, io, lock, poll, sleep, mem, other]).
fn text_thread_lines(text: &str) -> Vec<(u64, String, Vec<String>)> {
    let mut out = Vec::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix("  tid ") else { continue };
        let Some((head, shares)) = rest.split_once("| cpu") else { continue };
        let tid: u64 = head.split_whitespace().next().and_then(|t| t.parse().ok()).unwrap();
        let wall = head.split('|').next().unwrap().split_whitespace().rev().take(2).collect::<Vec<_>>();
        let wall = format!("{} {}", wall[1], wall[0]);
        let nums: Vec<String> = shares.split_whitespace().filter(|w| w.ends_with('%') || w.ends_with("%)") || w.ends_with("%!")).map(|w| w.trim_end_matches(')').to_owned()).collect();
        out.push((tid, wall, nums));
    }
    out
}

/// Thread rows the page shows for `report` (at most 400).
fn threads_in(report: &Value) -> usize {
    report["threads"].as_array().map_or(0, |t| t.len().min(400))
}

fn assert_ran_clean(o: &Opened, what: &str) {
    assert!(o.console.is_empty(), "{what}: console messages (errors, CSP refusals): {:#?}", o.console);
    assert!(o.dom.contains("data-ready=\"1\""), "{what}: the page's script did not finish");
    let errors = o.dom.find("id=\"js-errors\"").map(|i| &o.dom[i..]).map(|s| &s[s.find('>').unwrap() + 1..s.find("</pre>").unwrap()]).unwrap_or("");
    assert!(errors.is_empty(), "{what}: script errors: {errors}");
}

#[test]
fn the_page_shows_the_verdict_findings_threads_flames_and_series_in_a_browser() {
    const TEST: &str = "the_page_shows_the_verdict_findings_threads_flames_and_series_in_a_browser";
    if !require(TEST, &[Need::Chromium]) {
        return;
    }
    // CUDA copy patterns on the stand-ins: findings at known lines, the
    // verdict, threads, stacks and the memory series.
    let Some((dir, _run)) = record_on_standins(TEST, "patterns") else { return };
    let rec = dir.join("rec.itr");
    let page = dir.join("report.html");
    run_infertrace([std::ffi::OsStr::new("report"), rec.as_os_str(), "--format".as_ref(), "html".as_ref(), "-o".as_ref(), page.as_os_str()]).assert_ok();
    let json = run_infertrace([std::ffi::OsStr::new("report"), rec.as_os_str(), "--format".as_ref(), "json".as_ref()]);
    json.assert_ok();
    let report: Value = serde_json::from_str(&json.stdout).unwrap();
    let text = run_infertrace([std::ffi::OsStr::new("report"), rec.as_os_str(), "--verbose".as_ref()]);
    text.assert_ok();

    let o = open(&dir, &page);
    eprintln!("{TEST}: page {} bytes, opened and its scripts run in {:?}", std::fs::metadata(&page).unwrap().len(), o.elapsed);
    assert_ran_clean(&o, "the report page");
    let dom = &o.dom;

    // The verdict: the first process's bottleneck and share, in its card.
    let first = &report["verdict"]["processes"].as_array().unwrap().iter().max_by_key(|p| p["wall_ns"].as_u64()).unwrap().clone();
    let card_at = dom.find(&format!("<article class=\"process\" data-pid=\"{}\">", first["pid"])).expect("a card for the busiest process");
    let card = &dom[card_at..card_at + dom[card_at..].find("</article>").unwrap()];
    let share = format!("{:.1}%", first["bottleneck"]["share"].as_f64().unwrap() * 100.0);
    assert!(card.contains("Bottleneck: ") && card.contains(&share), "the card lacks the bottleneck share {share}: {card}");
    // Every finding, with its kind and its line.
    let findings = report["findings"].as_array().unwrap();
    assert!(!findings.is_empty(), "the patterns workload has findings");
    for f in findings {
        let line = format!("cuda_patterns.py:{}", f["site"]["line"]);
        let kind = f["kind"].as_str().unwrap();
        assert!(dom.contains(kind) && dom.contains(&line), "finding {kind} at {line} not in the page");
    }
    // The source line of a finding is shown (the workload's file is readable).
    assert!(dom.contains("<span class=\"hit\">"), "no source excerpt around a finding");

    // One bar per thread, with the text report's numbers.
    let lines = text_thread_lines(&text.stdout);
    assert!(!lines.is_empty(), "no thread lines in the text report");
    let threads = report["threads"].as_array().unwrap();
    for t in threads {
        let (pid, tid) = (t["pid"].as_u64().unwrap(), t["tid"].as_u64().unwrap());
        let row = thread_row(dom, pid, tid).unwrap_or_else(|| panic!("no row for thread {tid}"));
        assert_eq!(row.matches("<div class=\"bar\"").count(), 1, "thread {tid}: one bar");
        let c = cells(row);
        let (_, wall, shares) = lines.iter().find(|(x, _, _)| *x == tid).unwrap_or_else(|| panic!("tid {tid} not in the text report"));
        assert_eq!(&c[3], wall, "thread {tid}: wall time as in the text report");
        assert_eq!(&c[5..15], &shares[..], "thread {tid}: shares as in the text report");
    }

    // The static parts are in the file as written, not made by the script
    // (headless Chromium dumps no DOM with scripts off: the file is checked).
    let raw = std::fs::read_to_string(&page).unwrap();
    assert!(raw.contains(&share) && raw.matches("<tr class=\"thread\"").count() == threads_in(&report), "the verdict and threads need no script");
    assert!(findings.iter().all(|f| raw.contains(&format!("cuda_patterns.py:{}", f["site"]["line"]))), "the findings need no script");

    // The flame graphs add up to the recording's totals.
    let data = page_data(dom);
    let flame = |p: &str| data["flames"].as_array().unwrap().iter().find(|f| f["profile"] == p).cloned();
    let samples: u64 = report["stacks"].as_array().unwrap().iter().filter(|s| s["kind"] == "cpu").map(|s| s["samples"].as_u64().unwrap()).sum();
    if samples > 0 {
        let cpu = flame("cpu").expect("a CPU flame graph");
        assert_eq!(cpu["total"].as_u64(), Some(samples), "CPU flame graph total = the recording's samples");
        assert_eq!(cpu["nodes"][0][1].as_u64(), Some(samples), "its root");
    }
    let off_ns: u64 = report["stacks"].as_array().unwrap().iter().filter(|s| s["kind"] == "off_cpu" || s["kind"] == "gil").map(|s| s["weight_ns"].as_u64().unwrap()).sum();
    if let Some(off) = flame("off-cpu") {
        // Each folded line is rounded to a microsecond.
        let lines = report["stacks"].as_array().unwrap().len() as f64;
        let total = off["total"].as_f64().unwrap();
        assert!((total - off_ns as f64 / 1000.0).abs() <= lines, "off-CPU flame total {total} us vs {off_ns} ns");
    }
    // The page draws them: frames in the DOM.
    assert!(dom.contains("class=\"fr"), "no flame graph frames drawn");

    // The charts hold the recording's series (resident memory per process).
    let series = data["series"].as_array().unwrap();
    let procs = report["memory"]["processes"].as_array().expect("the memory family's processes");
    let mut checked = 0;
    for s in series {
        let name = s["name"].as_str().unwrap();
        let Some(pid) = name.strip_prefix("Resident memory, pid ").and_then(|r| r.split(' ').next()).and_then(|p| p.parse::<u64>().ok()) else { continue };
        let p = procs.iter().find(|p| p["pid"] == pid).unwrap();
        let want: Vec<(f64, f64)> = p["series"].as_array().unwrap().iter().map(|x| (x["t_ns"].as_u64().unwrap() as f64 / 1e9, x["rss"].as_u64().unwrap() as f64)).collect();
        let got: Vec<(f64, f64)> = s["points"].as_array().unwrap().iter().map(|x| (x[0].as_f64().unwrap(), x[1].as_f64().unwrap())).collect();
        assert_eq!(got, want, "{name}: the chart's points are the recording's series");
        checked += 1;
    }
    assert!(checked > 0, "no resident memory chart");
    assert_eq!(dom.matches("<polyline class=\"series\"").count(), series.len(), "one line per series");

    // A screenshot with content, against a blank page's.
    let blank = dir.join("blank.html");
    std::fs::write(&blank, "<!DOCTYPE html><html><body></body></html>").unwrap();
    let (_, _, blank_px) = screenshot(&dir, &url(&blank), &dir.join("blank.png"));
    let (bd, bc) = pixel_content(&blank_px);
    assert_eq!((bd, bc), (0, 1), "a blank page is one colour");
    let shot = artifact("report.png");
    let (w, h, px) = screenshot(&dir, &url(&page), &shot);
    let (differ, colours) = pixel_content(&px);
    eprintln!("{TEST}: screenshot {w}x{h} kept at {}: {differ} pixels unlike the background, {colours} colours", shot.display());
    assert!(differ > (w * h / 50) as usize && colours >= 16, "the page looks blank: {differ} pixels, {colours} colours");
}

/// Names a recording may hold that try to leave their text: tags, a
/// script end, quotes, an event handler, bidi overrides, control
/// characters. The page shows them as text and no script of theirs runs.
#[test]
fn hostile_names_stay_text_in_the_browser() {
    const TEST: &str = "hostile_names_stay_text_in_the_browser";
    if !require(TEST, &[Need::Binary, Need::Chromium]) {
        return;
    }
    let dir = TempDir::new("html-hostile");
    let evil = "</script><script>document.title='pwned';document.body.dataset.pwned=1</script>\"'><img src=x onerror=\"document.title='pwned'\">\u{202e}gpj.py\u{1b}[2J";
    let mut threads = vec![itr::thread_row(10, 1_000_000_000, 600_000_000, 0), itr::thread_row(11, 900_000_000, 300_000_000, 0)];
    for t in &mut threads {
        t["comm"] = Value::from(evil);
    }
    let mut rec = itr::crafted_recording(Value::from(threads));
    rec["targets"][0]["comm"] = Value::from(evil);
    rec["targets"][0]["cmdline"] = serde_json::json!(["python3", format!("/srv/{evil}/app.py"), evil]);
    rec["notes"] = serde_json::json!([evil]);
    rec["sample_hz"] = Value::from(99);
    rec["stacks"] = serde_json::json!([{
        "kind": "cpu", "reason": null, "pid": 10, "tid": 10, "samples": 50, "weight_ns": 0, "syscall": null,
        "frames": [{"function": evil, "file": format!("/srv/{evil}.py"), "line": 3, "kind": "python"}]
    }]);
    let itr_path = dir.join("hostile.itr");
    itr::write_itr(&itr_path, &rec);
    let page = dir.join("hostile.html");
    run_infertrace([std::ffi::OsStr::new("report"), itr_path.as_os_str(), "--format".as_ref(), "html".as_ref(), "-o".as_ref(), page.as_os_str()]).assert_ok();
    let raw = std::fs::read_to_string(&page).unwrap();
    assert_eq!(raw.matches("<script").count(), 2, "only the page's data and script elements");
    assert!(!raw.contains("<img"), "markup from a name reached the page");
    assert!(!raw.contains('\u{202e}') && !raw.contains('\u{1b}'), "a bidi override or escape reached the page raw");

    let o = open(&dir, &page);
    assert_ran_clean(&o, "the hostile page");
    assert!(!o.dom.contains("data-pwned"), "a script from a name ran");
    assert!(!o.dom.contains("<title>pwned"), "a handler from a name ran");
    // The names are there, as text: in the thread table and the data.
    let row = thread_row(&o.dom, 10, 10).expect("the thread's row");
    assert!(cells(row)[2].contains("</script><script>document.title="), "the name is not shown as text: {row}");
    let data = page_data(&o.dom);
    assert!(data["flames"][0]["names"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("onerror=")), "the data lost the name");
}

/// A 60 s recording with a timeline: the page's size and the time a browser
/// takes to open it, printed; the page stays under 5 MiB and draws every
/// thread's strip.
#[test]
fn a_sixty_second_timeline_page_is_small_and_opens() {
    const TEST: &str = "a_sixty_second_timeline_page_is_small_and_opens";
    if !require(TEST, &[Need::Root, Need::Binary, Need::Chromium]) {
        return;
    }
    let Some((python, _)) = system_python() else { return skip(TEST, "a python3 on PATH") };
    let dir = TempDir::new("html-60s");
    // Four threads that compute, sleep and hand the GIL around for 60 s.
    let script = "import threading, time\n\
        def work(k):\n    end = time.monotonic() + 60\n    while time.monotonic() < end:\n        s = 0\n        for i in range(20000 * k):\n            s += i\n        time.sleep(0.002 * k)\n\
        ts = [threading.Thread(target=work, args=(k,), name=f'w{k}') for k in (1, 2, 3, 4)]\n\
        [t.start() for t in ts]\n[t.join() for t in ts]\n";
    let rec = dir.join("long.itr");
    let started = Instant::now();
    let run = run_cmd(
        infertrace(["record", "-q", "--timeline", "--format", "json", "-o"]).arg(&rec).arg("--").arg(&python).arg("-c").arg(script),
        Duration::from_secs(240),
    );
    run.assert_ok();
    let recorded = started.elapsed();
    let page = dir.join("long.html");
    let t0 = Instant::now();
    run_infertrace([std::ffi::OsStr::new("report"), rec.as_os_str(), "--format".as_ref(), "html".as_ref(), "-o".as_ref(), page.as_os_str()]).assert_ok();
    let made = t0.elapsed();
    let size = std::fs::metadata(&page).unwrap().len();
    let o = open(&dir, &page);
    eprintln!(
        "{TEST}: recorded {recorded:?} ({} bytes); page {size} bytes ({:.2} MiB), made in {made:?}, opened and drawn by chromium in {:?}",
        std::fs::metadata(&rec).unwrap().len(),
        size as f64 / (1 << 20) as f64,
        o.elapsed
    );
    assert_ran_clean(&o, "the 60 s page");
    assert!(size < 5 << 20, "a 60 s recording's page is {size} bytes, over 5 MiB");
    let data = page_data(&o.dom);
    let tracks = data["strip"]["threads"].as_array().expect("a timeline strip");
    let target = run.json().one_target("launched")["pid"].as_u64().unwrap();
    let mine = tracks.iter().filter(|t| t["pid"] == target).count();
    assert!(mine >= 5, "the main thread and 4 workers each have a strip: {mine} of {} tracks", tracks.len());
    assert_eq!(o.dom.matches("<canvas").count(), tracks.len(), "one drawn strip per track");
}

/// `diff A B --format html`: both verdicts and the changes as bars, with
/// the numbers `diff --format json` gives, in a browser.
#[test]
fn the_diff_page_shows_both_verdicts_and_the_changes() {
    const TEST: &str = "the_diff_page_shows_both_verdicts_and_the_changes";
    if !require(TEST, &[Need::Binary, Need::Chromium]) {
        return;
    }
    let dir = TempDir::new("html-diff");
    let before = dir.join("before.itr");
    let after = dir.join("after.itr");
    itr::write_itr(&before, &itr::crafted_recording(serde_json::json!([itr::thread_row(10, 1_000_000_000, 800_000_000, 100_000_000)])));
    itr::write_itr(&after, &itr::crafted_recording(serde_json::json!([itr::thread_row(10, 1_000_000_000, 300_000_000, 20_000_000)])));
    let page = dir.join("diff.html");
    run_infertrace([std::ffi::OsStr::new("diff"), before.as_os_str(), after.as_os_str(), "--format".as_ref(), "html".as_ref(), "-o".as_ref(), page.as_os_str()]).assert_ok();
    let json = run_infertrace([std::ffi::OsStr::new("diff"), before.as_os_str(), after.as_os_str(), "--format".as_ref(), "json".as_ref()]);
    json.assert_ok();
    let want: Value = serde_json::from_str(&json.stdout).unwrap();
    let o = open(&dir, &page);
    assert_ran_clean(&o, "the diff page");
    assert_eq!(o.dom.matches("<article class=\"process\" data-pid=\"10\">").count(), 2, "a verdict card on each side");
    assert!(o.dom.contains(">Before: ") && o.dom.contains(">After: "), "both sides are named");
    let data = page_data(&o.dom);
    assert_eq!(data["diff"], want, "the page's diff is `diff --format json`'s");
    let classes = want["processes"][0]["classes"].as_array().unwrap();
    assert!(!classes.is_empty());
    for c in classes {
        let metric = c["metric"].as_str().unwrap();
        assert!(o.dom.contains(&format!("<tr data-metric=\"{metric}\">")), "no row for {metric}");
        assert!(o.dom.contains(&format!("{:.1}", c["before"].as_f64().unwrap())), "{metric}: before");
    }
    assert_eq!(o.dom.matches("class=\"bar before\"").count(), o.dom.matches("<tr data-metric=").count(), "a before bar per row");
}
