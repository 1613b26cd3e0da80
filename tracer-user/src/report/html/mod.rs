//! `--format html`: one self-contained page (docs/html.md). Everything is
//! inline (styles, script, data), nothing is fetched, and the page's
//! Content-Security-Policy allows no network and no script but its own
//! (by hash), so a name that escaped escaping still could not run.
//!
//! Built with [`maud`]: the markup is checked at compile time and every
//! value spliced into it is HTML-escaped unless marked otherwise; the only
//! unescaped splices are the page's own CSS and script and the data JSON,
//! made inert by [`embed::script_json`]. The static parts (verdict,
//! findings, thread bars, charts, tables, cost) are plain HTML and SVG that
//! read and print without scripts; the flame graphs and the timeline strip
//! are drawn by the page's script from the embedded data.

pub mod diff;
mod embed;
pub mod flame;
pub mod series;
mod source;
pub mod strip;

use std::fmt::Write as _;

use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde::Serialize;

use crate::{
    recording::{CutReason, Recording, ThreadTimes},
    report::{
        findings::{cuda_advice, cuda_message},
        fmt::{fmt_duration, fmt_share, printable, printable_text, share},
        rows::syscall_rows,
        text,
        verdict::{self, ClassShare, ProcessVerdict, Verdict},
    },
};

const CSS: &str = include_str!("page.css");
const JS: &str = include_str!("page.js");
/// Processes with at least this share of the first's thread time are shown
/// open (the compact text report's rule); the rest down to 1% collapsed.
const MAIN_SHARE: f64 = crate::report::text::view::MIN_SHARE_OF_FIRST;
/// Thread rows in the table; the rest are counted.
const MAX_THREAD_ROWS: usize = 400;

/// What the page may do when it is made.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Show the source lines around findings, read from the files the
    /// recording names (`report`, `record`); never for pages served by the agent.
    pub source: bool,
}

/// The data the page's script reads (`#infertrace-data`): also how tests
/// read back what the page shows.
#[derive(Serialize)]
struct PageData<'a> {
    /// Version of this data's layout (additive changes keep it).
    page_data_version: u32,
    duration_ns: u64,
    flames: &'a [flame::Flame],
    series: &'a [series::Series],
    strip: Option<&'a strip::Strip>,
    threads: Vec<ThreadRow>,
}

#[derive(Serialize)]
struct ThreadRow {
    pid: u32,
    tid: u32,
    wall_ns: u64,
    on_cpu_ns: u64,
}

/// The page of `rec`.
pub fn render(rec: &Recording, opts: Options) -> String {
    let verdict = (!rec.threads.is_empty()).then(|| verdict::verdict(rec));
    let flames = flame::all(rec);
    let series = series::all(rec);
    let strip = strip::of(rec);
    let mut threads: Vec<&ThreadTimes> = rec.threads.iter().collect();
    threads.sort_by(|a, b| b.wall_ns.cmp(&a.wall_ns).then(a.pid.cmp(&b.pid)).then(a.tid.cmp(&b.tid)));
    let data = PageData {
        page_data_version: 1,
        duration_ns: rec.duration_ns,
        flames: &flames,
        series: &series,
        strip: strip.as_ref(),
        threads: threads.iter().take(MAX_THREAD_ROWS).map(|t| ThreadRow { pid: t.pid, tid: t.tid, wall_ns: t.wall_ns, on_cpu_ns: t.on_cpu_ns }).collect(),
    };
    let mut sources = source::Sources::new(opts.source, rec.started_unix_ms);
    let title = title(rec);
    let body = html! {
        header {
            h1 { "infertrace: " (title) }
            p.meta { (summary_line(rec)) }
            @if let Some(cut) = &rec.cut {
                p.warn { "Cut: this recording ends at the tracer's last checkpoint (" (fmt_duration(rec.duration_ns)) " into the window): "
                    (match cut.reason { CutReason::Checkpoint => "the tracer did not finish" }) "; what came after is missing." }
            }
            @if rec.lost_events() > 0 {
                p.warn { "Lost events: " (rec.lost_events()) " (" (lost_detail(rec)) "); counts are incomplete." }
            }
            nav { a href="#verdict" { "Verdict" } " · " a href="#threads" { "Threads" } " · " a href="#flames" { "Flame graphs" } " · "
                a href="#series" { "Series" } @if strip.is_some() { " · " a href="#timeline" { "Timeline" } } " · " a href="#tables" { "Tables and notes" } " · " a href="#cost" { "Cost" } }
        }
        main {
            (verdict_section(rec, verdict.as_ref(), &mut sources))
            (threads_section(&threads))
            (flames_section(&flames))
            (series_section(rec, &series))
            @if let Some(s) = &strip { (timeline_section(s)) }
            (tables_section(rec))
            (cost_section(rec))
        }
    };
    page(&title, body, &embed::script_json(&data))
}

/// The page the agent serves (`/report/latest.html`): no source lines,
/// gzip-compressed as it is kept.
pub fn render_gzip(rec: &Recording) -> std::io::Result<Vec<u8>> {
    use flate2::{write::GzEncoder, Compression};
    use std::io::Write as _;
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(render(rec, Options { source: false }).as_bytes())?;
    gz.finish()
}

/// The document around `body`: head, styles, CSP, data and script.
fn page(title: &str, body: Markup, data_json: &str) -> String {
    let csp = format!(
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src '{}'; base-uri 'none'; form-action 'none'",
        script_hash(JS)
    );
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta http-equiv="Content-Security-Policy" content=(csp);
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="generator" content={ "infertrace " (env!("CARGO_PKG_VERSION")) };
                title { "infertrace: " (title) }
                style { (PreEscaped(CSS)) }
            }
            body {
                (body)
                pre #js-errors hidden {}
                script #infertrace-data type="application/json" { (PreEscaped(data_json)) }
                script { (PreEscaped(JS)) }
            }
        }
    }
    .into_string()
}

/// `sha256-BASE64` of the page's script, for its CSP.
fn script_hash(js: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, js.as_bytes());
    format!("sha256-{}", base64(d.as_ref()))
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn title(rec: &Recording) -> String {
    let first = rec.targets.iter().find(|t| !t.cmdline.is_empty()).map(|t| t.cmdline.join(" "));
    let name = first.or_else(|| rec.targets.first().map(|t| t.comm.clone())).unwrap_or_else(|| "recording".into());
    let name: String = printable(&name).chars().take(120).collect();
    format!("{name} ({})", fmt_duration(rec.duration_ns))
}

fn summary_line(rec: &Recording) -> String {
    format!(
        "{} process{} traced for {} on {} (kernel {}), {} lost events; infertrace {}",
        rec.targets.len(),
        if rec.targets.len() == 1 { "" } else { "es" },
        fmt_duration(rec.duration_ns),
        printable(&rec.host.hostname),
        printable(&rec.host.kernel_release),
        rec.lost_events(),
        printable(&rec.tool_version)
    )
}

fn lost_detail(rec: &Recording) -> String {
    rec.lost.iter().map(|(k, v)| format!("{}={v}", printable(k))).collect::<Vec<_>>().join(", ")
}

/// The classes of a verdict row as a stacked bar, each part labelled (the
/// colour is never the only label).
pub(crate) fn class_bar(classes: &[ClassShare]) -> Markup {
    let shown: Vec<&ClassShare> = classes.iter().filter(|c| c.share >= 0.001).collect();
    html! {
        div.stack role="img" aria-label="thread time by class" {
            @for c in &shown {
                span class={ "seg c-" (c.class.id()) } style={ "width:" (format!("{:.2}", c.share * 100.0)) "%" }
                    title={ (c.class.label()) " " (format!("{:.1}%", c.share * 100.0)) } {
                    @if c.share >= 0.08 { (c.class.label()) " " (format!("{:.0}%", c.share * 100.0)) }
                }
            }
        }
        ul.legend {
            @for c in shown.iter().filter(|c| c.share >= 0.01) {
                li { span class={ "swatch c-" (c.class.id()) } {} (c.class.label()) " " (format!("{:.1}%", c.share * 100.0)) " (" (fmt_duration(c.time_ns)) ")" }
            }
        }
    }
}

fn excerpt_markup(sources: &mut source::Sources, file: Option<&str>, line: Option<u32>) -> Markup {
    let (Some(file), Some(line)) = (file, line) else { return html! {} };
    let Some(e) = sources.excerpt(file, line) else { return html! {} };
    html! {
        figure.source {
            figcaption { (printable(file)) ":" (line) @if e.changed_since { span.warn { " (the file changed after the recording started: lines may have moved)" } } }
            pre { @for (n, t) in &e.lines { span class=@if *n == e.line { "hit" } @else { "ctx" } { (format!("{n:>5}  ")) (t) } "\n" } }
        }
    }
}

fn process_text(p: &ProcessVerdict) -> String {
    let mut out = String::new();
    verdict::text::render_process(p, &mut out);
    printable_text(out)
}

fn verdict_section(rec: &Recording, v: Option<&Verdict>, sources: &mut source::Sources) -> Markup {
    let findings = rec.cuda.as_ref().map(|c| c.findings.as_slice()).unwrap_or_default();
    let (shown, small) = v.map(|v| verdict::text::shown(v, verdict::PROCESS_MIN_SHARE)).unwrap_or_default();
    let top = shown.first().map(|p| p.wall_ns).unwrap_or(0);
    let (main, minor): (Vec<&ProcessVerdict>, Vec<&ProcessVerdict>) = shown.iter().partition(|p| p.wall_ns as f64 >= top as f64 * MAIN_SHARE);
    let shown_pids: Vec<u32> = shown.iter().flat_map(|p| if p.pids.is_empty() { vec![p.pid] } else { p.pids.clone() }).collect();
    let orphans: Vec<_> = findings.iter().filter(|f| !shown_pids.contains(&f.pid)).collect();
    html! {
        section #verdict {
            h2 { "Verdict" }
            @if v.is_none() { p { "No per-thread times in this recording (recorded with --no-sched): no verdict. The tables below still hold its counts." } }
            @for p in &main { (process_card(p, findings, sources)) }
            @if !minor.is_empty() {
                details.minor { summary { (minor.len()) " smaller process" @if minor.len() > 1 { "es" } " (under 5% of the thread time of the first)" }
                    @for p in &minor { (process_card(p, findings, sources)) } }
            }
            @if small > 0 { p.note { (small) " more process" @if small > 1 { "es" } " with under 1% of the thread time of the first: in the JSON report." } }
            @if let Some(v) = v { @for n in &v.notes { p.note { "Verdict note: " (printable(n)) } } }
            @if !orphans.is_empty() {
                h3 { "Other findings" }
                ol.findings { @for f in &orphans { (finding(f, sources)) } }
            }
        }
    }
}

/// One process's verdict: who, the bottleneck and its line, the advice,
/// the classes as a bar, the findings of its processes, and the verdict's
/// text as the text report prints it.
pub(crate) fn process_card(p: &ProcessVerdict, findings: &[crate::recording::cuda::Finding], sources: &mut source::Sources) -> Markup {
    let mine: Vec<_> = findings.iter().filter(|f| f.pid == p.pid || p.pids.contains(&f.pid)).collect();
    html! {
        article.process data-pid=(p.pid) {
            h3 { (verdict::text::who(p)) }
            @if let Some(b) = &p.bottleneck {
                p.headline { "Bottleneck: " strong { (b.class.label()) " " (format!("{:.1}%", b.share * 100.0)) } " of " (fmt_duration(p.wall_ns)) " thread time"
                    @if let Some(s) = &b.site { " at " code { (printable(&s.site.short())) } } }
                p.advice { "Advice: " (b.advice) }
                @if let Some(s) = &b.site { (excerpt_markup(sources, s.site.file.as_deref(), s.site.line)) }
            }
            (class_bar(&p.classes))
            @if !mine.is_empty() {
                h4 { "Findings" }
                ol.findings { @for f in &mine { (finding(f, sources)) } }
            }
            details { summary { "The verdict as text (as the text report prints it)" } pre.verdict { (process_text(p)) } }
        }
    }
}

fn finding(f: &crate::recording::cuda::Finding, sources: &mut source::Sources) -> Markup {
    let at = match (&f.site.file, f.site.line) {
        (Some(file), Some(l)) => format!("{} ({}:{l})", f.site.function, file.rsplit('/').next().unwrap_or(file)),
        _ => f.site.function.clone(),
    };
    html! {
        li class={ "finding sev-" (printable(&f.severity)) } {
            span.kind { (printable(&f.kind)) } " (" (printable(&f.severity)) ") at " code { (printable(&at)) } " pid " (f.pid) ": " (printable(&cuda_message(f)))
            br; span.advice { "Advice: " (printable(cuda_advice(f))) }
            (excerpt_markup(sources, f.site.file.as_deref(), f.site.line))
        }
    }
}

/// The parts of a thread's wall time, as the text report's bar: (css, label, ns).
fn parts(t: &ThreadTimes) -> [(&'static str, &'static str, u64); 10] {
    let p = text::walltime::parts(t);
    const NAMES: [(&str, &str); 10] = [
        ("cpu", "on-CPU"),
        ("sys", "syscall (on-CPU)"),
        ("rq", "run-queue"),
        ("gil", "GIL"),
        ("io", "io"),
        ("lock", "lock"),
        ("poll", "poll"),
        ("sleep", "sleep"),
        ("mem", "memory"),
        ("other", "other"),
    ];
    std::array::from_fn(|i| (NAMES[i].0, NAMES[i].1, p[i].1))
}

fn threads_section(threads: &[&ThreadTimes]) -> Markup {
    type Column = (&'static str, fn(&ThreadTimes) -> u64);
    let cols: [Column; 10] = [
        ("on-CPU", |t| t.on_cpu_ns),
        ("syscall", |t| t.syscall_ns),
        ("run-queue", |t| t.runqueue_ns),
        ("GIL", |t| t.off_cpu.gil_ns),
        ("io", |t| t.off_cpu.io_ns),
        ("lock", |t| t.off_cpu.lock_ns),
        ("poll", |t| t.off_cpu.poll_ns),
        ("sleep", |t| t.off_cpu.sleep_ns),
        ("memory", |t| t.off_cpu.memory_ns),
        ("other", |t| t.off_cpu.other_ns),
    ];
    html! {
        section #threads {
            h2 { "Threads: where the wall time went" }
            @if threads.is_empty() { p { "No per-thread times (recorded with --no-sched)." } } @else {
                p.note { "Shares of each thread's wall time, as in the text report (syscall time is part of on-CPU). Click a column to sort." }
                ul.legend { @for (css, label, _) in parts(threads[0]) { li { span class={ "swatch p-" (css) } {} (label) } } }
                table.sortable #thread-table {
                    thead { tr { th { "pid" } th { "tid" } th { "name" } th { "wall" } th.nosort { "partition" } @for (name, _) in &cols { th { (name) } } } }
                    tbody {
                        @for t in threads.iter().take(MAX_THREAD_ROWS) {
                            tr.thread data-pid=(t.pid) data-tid=(t.tid) {
                                td data-v=(t.pid) { (t.pid) } td data-v=(t.tid) { (t.tid) } td { (printable(&t.comm)) }
                                td data-v=(t.wall_ns) { (fmt_duration(t.wall_ns)) }
                                td { (thread_bar(t)) }
                                @for (name, f) in &cols {
                                    @let s = share(f(t), t.wall_ns);
                                    td.num data-v=(format!("{:.4}", s.percent)) data-col=(name) { (fmt_share(f(t), t.wall_ns).trim()) }
                                }
                            }
                        }
                    }
                }
                @if threads.len() > MAX_THREAD_ROWS { p.note { (threads.len() - MAX_THREAD_ROWS) " shorter threads are in the JSON and text reports." } }
            }
        }
    }
}

/// A thread's partition bar: each part's width from the running total, as
/// the text report's bar (never past 100%).
fn thread_bar(t: &ThreadTimes) -> Markup {
    let segs: Vec<_> = parts(t).into_iter().zip(text::walltime::part_cells(t, 1000)).filter(|(_, w)| *w > 0).map(|((css, label, ns), w)| (css, label, w, ns)).collect();
    html! {
        div.bar role="img" aria-label={ "wall-time partition of thread " (t.tid) } {
            @for (css, label, w, ns) in segs {
                span class={ "seg p-" (css) } style={ "width:" (format!("{:.1}", w as f64 / 10.0)) "%" } title={ (label) " " (fmt_duration(ns)) } {}
            }
        }
    }
}

fn flames_section(flames: &[flame::Flame]) -> Markup {
    html! {
        section #flames {
            h2 { "Flame graphs" }
            @if flames.is_empty() { p { "No stacks in this recording (sampling off, or nothing ran)." } }
            noscript { p.note { "The flame graphs are drawn by the page's script; `infertrace report FILE --format svg --profile cpu|off-cpu|wall` draws the same data without one." } }
            @for (i, f) in flames.iter().enumerate() {
                div.flamebox data-flame=(i) {
                    h3 data-total=(f.total) { (f.title) " (" (amount(f.total, f.unit)) " in all" @if f.pruned > 0 { "; " (f.pruned) " frames under 1/2000 of it not drawn" } ")" }
                    div.controls { label { "Search " input type="search" class="flame-search" placeholder="function, file or library"; } " " button type="button" class="flame-reset" { "Reset zoom" } " " span.flame-match {} }
                    div.flame {}
                    p.flame-info { "Click a frame to zoom into it; hover for its numbers." }
                }
            }
        }
    }
}

/// A flame graph's total in its unit, as a person reads it.
fn amount(total: u64, unit: &str) -> String {
    match unit {
        "us" => fmt_duration(total.saturating_mul(1000)),
        "bytes" => crate::report::fmt::fmt_bytes(total),
        _ => format!("{total} {unit}"),
    }
}

fn series_section(rec: &Recording, series: &[series::Series]) -> Markup {
    let cuda_without_timeline = rec.cuda.as_ref().is_some_and(|c| !c.calls.is_empty()) && rec.timeline.is_none();
    html! {
        section #series {
            h2 { "Series" }
            @if series.is_empty() { p { "No series in this recording (no GPU sampled, no memory family, no timeline)." } }
            @for s in series.iter().filter(|s| !s.minor) { (series::chart(s, rec.duration_ns)) }
            @let minor: Vec<_> = series.iter().filter(|s| s.minor).collect();
            @if !minor.is_empty() { details { summary { "Resident memory of " (minor.len()) " smaller processes" } @for s in &minor { (series::chart(s, rec.duration_ns)) } } }
            @if cuda_without_timeline { p.note { "CUDA calls and copy bandwidth per interval need the timeline: record with --timeline." } }
        }
    }
}

fn timeline_section(s: &strip::Strip) -> Markup {
    html! {
        section #timeline {
            h2 { "Timeline" }
            ul.legend { @for (i, name) in s.states.iter().enumerate() { li { span class={ "swatch st-" (i) } {} (name) } } }
            p.note { "Each thread's state over the window. Drag across a strip to zoom into that time; Reset to see it all."
                @if s.threads_left_out > 0 { " " (s.threads_left_out) " shorter threads are not drawn." }
                @let coarse = s.threads.iter().filter(|t| t.bucket_us > 0).count();
                @if coarse > 0 { " " (coarse) " busy threads are drawn in buckets (the dominant state of each) to keep the page small; the Perfetto trace (--format perfetto) has every interval." } }
            noscript { p.note { "The timeline is drawn by the page's script." } }
            div.controls { button type="button" #strip-reset { "Reset zoom" } " " span #strip-range {} }
            div #strip {}
        }
    }
}

fn text_block(f: impl FnOnce(&mut String)) -> String {
    let mut s = String::new();
    f(&mut s);
    printable_text(s)
}

fn tables_section(rec: &Recording) -> Markup {
    let view = text::view::View::verbose();
    let rows = syscall_rows(rec);
    let syscalls = text_block(|s| text::syscalls::render_tables(s, rec, &rows, &view));
    let cuda = rec.cuda.as_ref().map(|c| text_block(|s| text::cuda::render(s, c, &view)));
    let memory = rec.memory.as_ref().map(|m| text_block(|s| text::memory::render(s, rec, m, &view)));
    let asyncio = rec.asyncio.as_ref().map(|a| text_block(|s| text::asyncio::render(s, a)));
    let python = (!rec.threads.is_empty()).then(|| text_block(|s| text::python::render(s, rec, &view)));
    html! {
        section #tables {
            h2 { "Tables and notes" }
            details { summary { "System calls (strace -c style, per process)" } pre { (syscalls.trim_start()) } }
            @if let Some(c) = &cuda { details { summary { "CUDA: findings, copies, syncs, launches, GPUs" } pre { (c.trim_start()) } } }
            @if let Some(m) = &memory { details { summary { "Memory: resident memory and growth by line" } pre { (m.trim_start()) } } }
            @if let Some(p) = &python { @if !p.trim().is_empty() { details { summary { "Python functions" } pre { (p.trim_start()) } } } }
            @if let Some(a) = &asyncio { details { summary { "asyncio event loops" } pre { (a.trim_start()) } } }
            details { summary { "Notes (" (rec.notes.len()) ")" } ul { @for n in &rec.notes { li { (printable(n)) } } } }
            @if !rec.details.is_empty() { details { summary { "How the tracer worked (" (rec.details.len()) " details)" } ul { @for n in &rec.details { li { (printable(n)) } } } } }
        }
    }
}

fn cost_section(rec: &Recording) -> Markup {
    let cost = rec.tracer_overhead.as_ref().map(|o| text_block(|s| text::overhead::render(s, o, 3)));
    let mut lost = String::new();
    let _ = write!(lost, "lost events: {}", rec.lost_events());
    if rec.lost_events() > 0 {
        let _ = write!(lost, " ({})", lost_detail(rec));
    }
    html! {
        footer #cost {
            h2 { "What tracing cost" }
            @match &cost { Some(c) => pre { (c.trim()) }, None => p { "Not recorded (a recording made before the tracer measured itself)." } }
            p { (lost) }
            p.meta { "Page made by infertrace " (env!("CARGO_PKG_VERSION")) "." }
        }
    }
}

#[cfg(test)]
mod tests;
