//! Drawing `infertrace top`: pure functions from a [`Model`] (what the
//! snapshots say) and the [`Ui`] (which view, which order) to ratatui
//! widgets. Nothing here reads the terminal or the session, so the tests
//! draw on ratatui's `TestBackend` and read the cells back.

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Paragraph},
    Frame,
};

use super::state::{parts, FunctionRow, Model, ThreadRow};
use crate::report::fmt::{bar_cells, fmt_bytes, fmt_duration, fmt_rate, fmt_share, saturating_sum};

/// The screens, in `Tab` order (keys `1` to `6`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum View {
    /// Every section, a few rows each.
    #[default]
    Overview,
    Threads,
    Python,
    Syscalls,
    Cuda,
    Findings,
}

impl View {
    pub const ALL: [View; 6] = [View::Overview, View::Threads, View::Python, View::Syscalls, View::Cuda, View::Findings];

    pub fn name(self) -> &'static str {
        match self {
            View::Overview => "overview",
            View::Threads => "threads",
            View::Python => "python",
            View::Syscalls => "syscalls",
            View::Cuda => "cuda",
            View::Findings => "findings",
        }
    }

    fn index(self) -> usize {
        View::ALL.iter().position(|v| *v == self).unwrap_or(0)
    }

    pub fn next(self) -> View {
        View::ALL[(self.index() + 1) % View::ALL.len()]
    }

    pub fn previous(self) -> View {
        View::ALL[(self.index() + View::ALL.len() - 1) % View::ALL.len()]
    }
}

/// What the lists show and how they are ordered (key `s` cycles).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sort {
    /// The last interval, as rates, busiest first.
    #[default]
    Recent,
    /// Since the window opened, largest first.
    Total,
    /// The last interval, by pid, thread and name.
    Name,
}

impl Sort {
    pub fn next(self) -> Sort {
        match self {
            Sort::Recent => Sort::Total,
            Sort::Total => Sort::Name,
            Sort::Name => Sort::Recent,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Sort::Recent => "last interval",
            Sort::Total => "since start",
            Sort::Name => "name",
        }
    }
}

/// The user's choices.
#[derive(Clone, Debug, Default)]
pub struct Ui {
    pub view: View,
    pub sort: Sort,
}

/// The colour of each wall-time part (the letters of the text report's legend).
fn part_style(c: char) -> Style {
    let color = match c {
        '#' => Color::Green,
        's' => Color::Yellow,
        'r' => Color::Magenta,
        'g' => Color::Red,
        'i' => Color::Blue,
        'l' => Color::LightRed,
        'p' => Color::Cyan,
        'z' => Color::DarkGray,
        'm' => Color::LightYellow,
        _ => Color::Gray,
    };
    Style::default().fg(color)
}

/// The wall-time split of `t` as a bar of exactly `width` cells, the
/// text report's letters coloured: cells from the running total, as the
/// text report's bars, so rounding never runs past the bar.
fn bar(t: &crate::recording::ThreadTimes, width: usize) -> Vec<Span<'static>> {
    let mut spans = Vec::new();
    let (mut total, mut drawn) = (0u64, 0usize);
    for (c, ns) in parts(t) {
        total = total.saturating_add(ns);
        let upto = bar_cells(total, t.wall_ns, width);
        let n = upto.saturating_sub(drawn);
        if n > 0 {
            spans.push(Span::styled(c.to_string().repeat(n), part_style(c)));
        }
        drawn = drawn.max(upto);
    }
    spans.push(Span::raw(" ".repeat(width.saturating_sub(drawn))));
    spans
}

fn title(text: String) -> Block<'static> {
    Block::bordered().title(Span::styled(text, Style::default().add_modifier(Modifier::BOLD)))
}

fn header(m: &Model, ui: &Ui) -> Line<'static> {
    let procs: Vec<String> = m.processes.iter().take(4).map(|(pid, comm)| format!("pid {pid} ({comm})")).collect();
    let more = m.processes.len().saturating_sub(4);
    let mut who = procs.join(", ");
    if more > 0 {
        who.push_str(&format!(" +{more}"));
    }
    if who.is_empty() {
        who = "no target yet".into();
    }
    let mut text = format!(
        " infertrace top  {who}  | {:.1}s, {} alive | view: {} | sort: {}",
        m.elapsed_ns as f64 / 1e9,
        m.alive,
        ui.view.name(),
        ui.sort.name()
    );
    if m.alive == 0 && !m.processes.is_empty() {
        text.push_str(" | every target exited (q quits)");
    }
    if m.lost_events > 0 {
        text.push_str(&format!(" | {} lost events (counts incomplete)", m.lost_events));
    }
    Line::from(Span::styled(text, Style::default().add_modifier(Modifier::REVERSED)))
}

fn footer() -> Line<'static> {
    Line::from(" q quit  Tab/1-6 view  s sort  | # on-CPU s syscall r run-queue g GIL i io l lock p poll z sleep o other")
}

fn verdict(m: &Model) -> Vec<Line<'static>> {
    if m.verdict.is_empty() {
        return vec![Line::from("(no wall time yet: needs scheduler tracing)")];
    }
    m.verdict.iter().map(|l| Line::from(l.clone())).collect()
}

fn sorted_threads(m: &Model, sort: Sort) -> Vec<&ThreadRow> {
    let mut v: Vec<&ThreadRow> = m.threads.iter().collect();
    match sort {
        Sort::Recent => v.sort_by_key(|t| (std::cmp::Reverse(t.recent.on_cpu_ns), t.pid, t.tid)),
        Sort::Total => v.sort_by_key(|t| (std::cmp::Reverse(t.total.on_cpu_ns), t.pid, t.tid)),
        Sort::Name => v.sort_by_key(|t| (t.pid, t.tid)),
    }
    v
}

fn threads(m: &Model, sort: Sort, width: u16) -> Vec<Line<'static>> {
    const LABEL: usize = 24;
    const STATS: usize = 34;
    let bar_width = (width as usize).saturating_sub(LABEL + STATS + 4).clamp(10, 60);
    let mut out = Vec::new();
    for t in sorted_threads(m, sort) {
        let times = if sort == Sort::Total { &t.total } else { &t.recent };
        let label = if t.aggregated_threads > 0 {
            format!("{} exited ({})", t.pid, t.aggregated_threads)
        } else {
            format!("{} {}", t.tid, t.comm)
        };
        let label: String = label.chars().take(LABEL).collect();
        let w = times.wall_ns;
        let off = saturating_sum([
            times.off_cpu.io_ns,
            times.off_cpu.lock_ns,
            times.off_cpu.poll_ns,
            times.off_cpu.sleep_ns,
            times.off_cpu.other_ns,
            times.off_cpu.gil_ns,
            times.off_cpu.memory_ns,
        ]);
        let mut spans = vec![Span::raw(format!("{label:<LABEL$} |"))];
        spans.extend(bar(times, bar_width));
        spans.push(Span::raw(format!(
            "| cpu{} off{} rq{}",
            fmt_share(times.on_cpu_ns, w),
            fmt_share(off, w),
            fmt_share(times.runqueue_ns, w)
        )));
        out.push(Line::from(spans));
    }
    if out.is_empty() {
        out.push(Line::from("(no thread times yet)"));
    }
    out
}

fn sorted_functions(rows: &[FunctionRow], sort: Sort) -> Vec<&FunctionRow> {
    let mut v: Vec<&FunctionRow> = rows.iter().filter(|r| sort == Sort::Total || r.amount.recent > 0).collect();
    match sort {
        Sort::Recent => v.sort_by(|a, b| b.amount.recent.cmp(&a.amount.recent).then(a.name.cmp(&b.name))),
        Sort::Total => v.sort_by(|a, b| b.amount.total.cmp(&a.amount.total).then(a.name.cmp(&b.name))),
        Sort::Name => v.sort_by(|a, b| a.name.cmp(&b.name).then(a.reason.cmp(b.reason))),
    }
    v
}

/// Top Python functions by on-CPU samples: share of the samples, and
/// samples per second (or in all).
fn python_cpu(m: &Model, sort: Sort) -> Vec<Line<'static>> {
    let rows = sorted_functions(&m.python_cpu, sort);
    let whole = saturating_sum(rows.iter().map(|r| if sort == Sort::Total { r.amount.total } else { r.amount.recent }));
    let mut out: Vec<Line> = rows
        .into_iter()
        .map(|r| {
            let (v, amount) = if sort == Sort::Total {
                (r.amount.total, format!("{:>6} smp", r.amount.total))
            } else {
                (r.amount.recent, format!("{:>6.0} /s ", m.per_second(r.amount.recent)))
            };
            Line::from(format!("{} {amount} {}", fmt_share(v, whole), r.name))
        })
        .collect();
    if out.is_empty() {
        out.push(Line::from(if m.sample_hz == 0 { "(CPU sampling off)" } else { "(no Python samples in this interval)" }));
    }
    out
}

/// Top Python functions by off-CPU wait (and GIL wait), with the reason:
/// wait per second of wall time (1 s/s: one thread waiting all along).
fn python_wait(m: &Model, sort: Sort) -> Vec<Line<'static>> {
    let mut out: Vec<Line> = sorted_functions(&m.python_wait, sort)
        .into_iter()
        .map(|r| {
            let amount = if sort == Sort::Total {
                format!("{:>10}", fmt_duration(r.amount.total))
            } else {
                format!("{:>8}/s", fmt_duration(m.per_second(r.amount.recent) as u64))
            };
            Line::from(format!("{amount} {:<5} {}", r.reason, r.name))
        })
        .collect();
    if out.is_empty() {
        out.push(Line::from("(no Python off-CPU wait in this interval)"));
    }
    out
}

/// Top syscalls by time: time per second of wall time, calls per second.
fn syscalls(m: &Model, sort: Sort) -> Vec<Line<'static>> {
    let mut rows: Vec<_> = m.syscalls.iter().filter(|r| sort == Sort::Total || r.calls.recent > 0).collect();
    match sort {
        Sort::Recent => rows.sort_by(|a, b| b.time_ns.recent.cmp(&a.time_ns.recent).then(b.calls.recent.cmp(&a.calls.recent))),
        Sort::Total => rows.sort_by(|a, b| b.time_ns.total.cmp(&a.time_ns.total).then(b.calls.total.cmp(&a.calls.total))),
        Sort::Name => rows.sort_by(|a, b| a.pid.cmp(&b.pid).then(a.name.cmp(&b.name))),
    }
    let mut out: Vec<Line> = rows
        .into_iter()
        .map(|r| {
            if sort == Sort::Total {
                Line::from(format!("{:<16} {:>10} {:>10} calls  pid {}", r.name, fmt_duration(r.time_ns.total), r.calls.total, r.pid))
            } else {
                Line::from(format!(
                    "{:<16} {:>8}/s {:>8.0} calls/s  pid {}",
                    r.name,
                    fmt_duration(m.per_second(r.time_ns.recent) as u64),
                    m.per_second(r.calls.recent),
                    r.pid
                ))
            }
        })
        .collect();
    if out.is_empty() {
        out.push(Line::from("(no syscalls in this interval)"));
    }
    out
}

/// Host<->device copies per second and bytes, per direction, then in all.
fn cuda(m: &Model, sort: Sort) -> Vec<Line<'static>> {
    let Some(rows) = &m.copies else {
        return vec![Line::from("(no CUDA library probed in the targets)")];
    };
    let mut out = Vec::new();
    let (mut n, mut b) = (0u64, 0u64);
    for r in rows {
        let line = if sort == Sort::Total {
            format!("{:<8} {:>10} copies {:>12} {:>10} in copies", r.kind, r.copies.total, fmt_bytes(r.bytes.total), fmt_duration(r.time_ns.total))
        } else {
            format!(
                "{:<8} {:>8.0} copies/s {:>12} {:>8}/s in copies",
                r.kind,
                m.per_second(r.copies.recent),
                fmt_rate(m.per_second(r.bytes.recent)),
                fmt_duration(m.per_second(r.time_ns.recent) as u64)
            )
        };
        out.push(Line::from(line));
        n = n.saturating_add(r.copies.total);
        b = b.saturating_add(r.bytes.total);
    }
    out.push(Line::from(format!("all copies since start: {n}, {}", fmt_bytes(b))));
    out
}

/// The CUDA findings, newest first, then the session's notes.
fn findings(m: &Model) -> Vec<Line<'static>> {
    let notes = m.notes.iter().map(|n| Line::from(Span::styled(format!("note: {n}"), Style::default().fg(Color::DarkGray))));
    if m.findings.is_empty() {
        return std::iter::once(Line::from("(no findings yet)")).chain(notes).collect();
    }
    m.findings
        .iter()
        .map(|f| {
            Line::from(vec![
                Span::styled(format!("+{:.0}s [{}] {}", f.first_seen_s, f.severity, f.kind), Style::default().fg(Color::Yellow)),
                Span::raw(format!(" at {} (pid {}): {}", f.site, f.pid, f.message)),
            ])
        })
        .chain(notes)
        .collect()
}

fn section(f: &mut Frame, area: Rect, name: String, lines: Vec<Line<'static>>) {
    f.render_widget(Paragraph::new(lines).block(title(name)), area);
}

fn wait_title(sort: Sort) -> String {
    format!("top Python functions by off-CPU wait ({})", if sort == Sort::Total { "since start" } else { "per second" })
}

fn cpu_title(m: &Model, sort: Sort) -> String {
    format!("top Python functions by on-CPU samples ({} Hz, {})", m.sample_hz, if sort == Sort::Total { "since start" } else { "per second" })
}

/// One screen.
pub fn draw(f: &mut Frame, m: &Model, ui: &Ui) {
    let [head, body, foot] = Layout::vertical([Constraint::Length(1), Constraint::Min(0), Constraint::Length(1)]).areas(f.area());
    f.render_widget(Paragraph::new(header(m, ui)), head);
    f.render_widget(Paragraph::new(footer()), foot);
    let sort = ui.sort;
    let width = body.width;
    match ui.view {
        View::Overview => {
            let rows = |n: usize, most: u16| (n as u16).clamp(1, most) + 2;
            let (v, t) = (verdict(m), threads(m, sort, width));
            let (pc, pw) = (python_cpu(m, sort), python_wait(m, sort));
            let (sc, cu) = (syscalls(m, sort), cuda(m, sort));
            let [va, ta, pa, sa, fa] = Layout::vertical([
                Constraint::Length(rows(v.len(), 4)),
                Constraint::Length(rows(t.len(), 8)),
                Constraint::Length(rows(pc.len().max(pw.len()), 10)),
                Constraint::Length(rows(sc.len().max(cu.len()), 8)),
                Constraint::Min(3),
            ])
            .areas(body);
            section(f, va, "verdict so far".into(), v);
            section(f, ta, "threads: wall time".into(), t);
            let [pca, pwa] = Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(pa);
            section(f, pca, cpu_title(m, sort), pc);
            section(f, pwa, wait_title(sort), pw);
            let [sca, cua] = Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(sa);
            section(f, sca, "top syscalls by time".into(), sc);
            section(f, cua, "CUDA copies".into(), cu);
            section(f, fa, "findings".into(), findings(m));
        }
        View::Threads => section(f, body, "threads: wall time".into(), threads(m, sort, width)),
        View::Python => {
            let [pc, pw] = Layout::vertical([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(body);
            section(f, pc, cpu_title(m, sort), python_cpu(m, sort));
            section(f, pw, wait_title(sort), python_wait(m, sort));
        }
        View::Syscalls => section(f, body, "top syscalls by time".into(), syscalls(m, sort)),
        View::Cuda => section(f, body, "CUDA copies".into(), cuda(m, sort)),
        View::Findings => section(f, body, "findings".into(), findings(m)),
    }
}

#[cfg(test)]
mod tests {
    use ratatui::{backend::TestBackend, Terminal};

    use super::*;
    use crate::cli::top::state::{tests::snapshot, State};

    /// The screen as text, one string per row.
    fn screen(m: &Model, ui: &Ui, w: u16, h: u16) -> Vec<String> {
        let mut term = Terminal::new(TestBackend::new(w, h)).expect("test backend");
        term.draw(|f| draw(f, m, ui)).expect("draw");
        let buf = term.backend().buffer().clone();
        (0..h).map(|y| (0..w).map(|x| buf[(x, y)].symbol().to_owned()).collect::<String>()).collect()
    }

    fn model() -> Model {
        let mut st = State::new();
        st.update(&snapshot(1, 99));
        let mut m = st.update(&snapshot(2, 198));
        m.alive = 1;
        m
    }

    #[test]
    fn overview_shows_pid_hot_function_verdict_and_bar() {
        let rows = screen(&model(), &Ui::default(), 140, 40);
        let all = rows.join("\n");
        assert!(rows[0].contains("pid 10 (python3)") && rows[0].contains("2.0s, 1 alive"), "{all}");
        assert!(all.contains("verdict so far"), "{all}");
        assert!(all.contains("pid 10 demo: bottleneck Python compute 90.0% at fib (app.py:7)"), "{all}");
        // 99 samples in the last second, all in fib.
        assert!(all.contains("100.0%     99 /s  fib (app.py:7)"), "{all}");
        // The main thread's bar: 90% on-CPU, 10% sleep.
        let row = rows.iter().find(|r| r.contains("10 worker")).expect("thread row");
        let bar: String = row.split('|').nth(1).unwrap_or_default().to_owned();
        let on = bar.chars().filter(|c| *c == '#').count();
        let zz = bar.chars().filter(|c| *c == 'z').count();
        assert_eq!(on + zz, bar.chars().count(), "{row}");
        assert_eq!(on * 10, (on + zz) * 9, "{row}");
        assert!(row.contains("cpu 90.0% off 10.0% rq  0.0%"), "{row}");
    }

    #[test]
    fn views_and_sorts_switch() {
        let m = model();
        let ui = Ui { view: View::Python, sort: Sort::Total };
        let all = screen(&m, &ui, 120, 30).join("\n");
        assert!(all.contains("view: python | sort: since start"), "{all}");
        assert!(all.contains("100.0%    198 smp fib (app.py:7)"), "{all}");
        assert!(!all.contains("verdict so far"), "{all}");
        assert_eq!(View::Findings.next(), View::Overview);
        assert_eq!(View::Overview.previous(), View::Findings);
        assert_eq!(Sort::Name.next(), Sort::Recent);
        let all = screen(&m, &Ui { view: View::Cuda, sort: Sort::Recent }, 100, 20).join("\n");
        assert!(all.contains("(no CUDA library probed in the targets)"), "{all}");
        let gone = Model { alive: 0, lost_events: 3, ..m };
        let head = screen(&gone, &Ui::default(), 160, 20).swap_remove(0);
        assert!(head.contains("every target exited (q quits) | 3 lost events (counts incomplete)"), "{head}");
    }

    #[test]
    fn cuda_copies_per_second_and_findings() {
        use crate::cli::top::state::{Amount, CopyRow, FindingRow};
        let mut m = model();
        m.copies = Some(vec![CopyRow {
            kind: "HtoD".into(),
            copies: Amount { recent: 90, total: 900 },
            bytes: Amount { recent: 90 << 20, total: 900 << 20 },
            time_ns: Amount { recent: 60_000_000, total: 600_000_000 },
        }]);
        m.findings = vec![FindingRow {
            first_seen_s: 3.0,
            severity: "medium".into(),
            kind: "pageable_copy".into(),
            pid: 10,
            site: "step (app.py:12)".into(),
            message: "copies from pageable memory".into(),
        }];
        m.notes = vec!["pid 10: 2 Python frames could not be resolved".into()];
        let all = screen(&m, &Ui::default(), 160, 40).join("\n");
        assert!(all.contains("note: pid 10: 2 Python frames could not be resolved"), "{all}");
        // 90 copies of 1 MiB in the last second (the interval is 1 s).
        assert!(all.contains("HtoD           90 copies/s   94.37 MB/s 60.00 ms/s in copies"), "{all}");
        assert!(all.contains("all copies since start: 900, 900.0 MiB"), "{all}");
        assert!(all.contains("+3s [medium] pageable_copy at step (app.py:12) (pid 10): copies from pageable memory"), "{all}");
    }

    /// A hostile comm reaches the screen escaped, and a tiny terminal
    /// draws without panicking.
    #[test]
    fn hostile_names_and_tiny_terminals() {
        let mut rec = snapshot(1, 5);
        rec.threads[0].comm = "\x1b]0;PWNED\x07".into();
        let m = State::new().update(&rec);
        let all = screen(&m, &Ui::default(), 120, 40).join("\n");
        assert!(all.contains("\\x1b]0;PWNED\\x07"), "{all}");
        for (w, h) in [(1, 1), (10, 3), (40, 8)] {
            screen(&m, &Ui::default(), w, h);
        }
    }
}
