//! `diff A B --format html`: the two verdicts side by side, then per
//! process the classes and lines that changed, as paired bars (before,
//! after) with their numbers.

use maud::{html, Markup};
use serde::Serialize;

use super::{embed::script_json, page, process_card, source::Sources};
use crate::{
    recording::Recording,
    report::{
        diff::{Change, Diff},
        fmt::{fmt_duration, printable},
        verdict,
    },
};

#[derive(Serialize)]
struct DiffData<'a> {
    page_data_version: u32,
    diff: &'a Diff,
}

fn side(label: &str, rec: &Recording) -> Markup {
    let v = (!rec.threads.is_empty()).then(|| verdict::verdict(rec));
    let findings = rec.cuda.as_ref().map(|c| c.findings.as_slice()).unwrap_or_default();
    let mut no_source = Sources::new(false, 0);
    html! {
        div.side {
            h2 { (label) ": " (fmt_duration(rec.duration_ns)) }
            @match &v {
                Some(v) => { @for p in verdict::text::shown(v, verdict::PROCESS_MIN_SHARE).0 { (process_card(p, findings, &mut no_source)) } },
                None => p { "No per-thread times (recorded with --no-sched): no verdict." },
            }
        }
    }
}

fn pct(c: &Change) -> String {
    match c.change_pct {
        Some(p) => format!("{p:+.1}%"),
        None if c.after > 0.0 => "new".into(),
        None => "-".into(),
    }
}

fn changes(title: &str, rows: &[Change]) -> Markup {
    let max = rows.iter().map(|c| c.before.max(c.after)).fold(0.0, f64::max);
    let w = |v: f64| if max > 0.0 { format!("{:.1}", v / max * 100.0) } else { "0".into() };
    html! {
        @if !rows.is_empty() {
            h4 { (title) }
            table.sortable.diff {
                thead { tr { th { "what" } th { "before" } th { "after" } th { "change" } th.nosort { "before / after (ms per s)" } } }
                tbody {
                    @for c in rows {
                        tr data-metric=(printable(&c.metric)) {
                            td { code { (printable(&c.metric)) } " " span.meta { (printable(&c.label)) } }
                            td.num data-v=(c.before) { (format!("{:.1}", c.before)) }
                            td.num data-v=(c.after) { (format!("{:.1}", c.after)) }
                            td.num data-v=(c.change_pct.unwrap_or(0.0)) { (pct(c)) }
                            td {
                                div.pair {
                                    div.bar.before title={ "before " (format!("{:.1}", c.before)) } { span.seg.p-before style={ "width:" (w(c.before)) "%" } { "before" } }
                                    div.bar.after title={ "after " (format!("{:.1}", c.after)) } { span.seg.p-after style={ "width:" (w(c.after)) "%" } { "after" } }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The diff page of `before` and `after` (`d` is their [`crate::report::diff::diff`]).
pub fn render(before: &Recording, after: &Recording, d: &Diff) -> String {
    let title = format!("diff, window {} -> {} ({})", fmt_duration(d.before_duration_ns), fmt_duration(d.after_duration_ns), pct(&d.total));
    let body = html! {
        header { h1 { "infertrace " (title) } p.meta { "Figures are milliseconds of thread time per second of window, as `infertrace diff` prints them." } }
        main {
            section #verdicts { div.sides { (side("Before", before)) (side("After", after)) } }
            section #changes {
                h2 { "What changed" }
                @for p in &d.processes {
                    article.process {
                        h3 { "pid " (p.before_pid) " -> " (p.after_pid) ": " (printable(&p.cmdline)) }
                        (changes("Classes", &p.classes))
                        (changes("Python lines", &p.python_sites))
                        (changes("CUDA lines", &p.cuda_sites))
                    }
                }
                @for c in &d.only_before { p.note { "Only before: " (printable(c)) } }
                @for c in &d.only_after { p.note { "Only after: " (printable(c)) } }
            }
        }
    };
    page(&title, body, &script_json(&DiffData { page_data_version: 1, diff: d }))
}
