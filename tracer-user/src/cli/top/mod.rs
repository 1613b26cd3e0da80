//! `infertrace top`: a live terminal view of the processes being traced,
//! redrawn every `--refresh` (1 s) from the running collectors. It drives
//! the same window as `record` ([`crate::engine::run::Engine`]: attach, wake-ups
//! and polls, snapshots, and the same close that detaches every probe);
//! [`state`] turns consecutive snapshots into rates, [`view`] draws them
//! with ratatui, [`terminal`] owns the terminal (raw mode and the
//! alternate screen, restored on every exit, panics included) and
//! [`discover`] finds the CPython processes for `--python`.

pub mod args;
pub mod discover;
pub mod state;
pub mod terminal;
pub mod view;

use std::{io::IsTerminal, time::Duration};

use ratatui::crossterm::event::{Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::{
    recording::Recording,
    report::{fmt::printable, verdict},
    engine::{
        run::Engine,
        session::{self, RecordError},
        RecordOptions,
    },
};

/// How often the screen is redrawn by default.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error("`infertrace top` draws on a terminal, and stdout is not one")]
    NotATerminal,
    #[error("no running Python process found")]
    NoPython,
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("terminal: {0}")]
    Terminal(std::io::Error),
    #[error("signal handling: {0}")]
    Signals(std::io::Error),
}

impl TopError {
    pub fn hint(&self) -> &str {
        match self {
            Self::NotATerminal => "run it in a terminal (or tmux); `infertrace record` writes a recording without one",
            Self::NoPython => "start the Python program first, or name processes with -p PID",
            Self::Record(e) => e.hint(),
            Self::Terminal(_) => "run it in a terminal that supports raw mode (TERM set)",
            Self::Signals(_) => "retry",
        }
    }
}

/// What `top` was asked for.
pub struct TopOptions {
    /// The window's options (`pids` filled; no output, no checkpoints).
    pub record: RecordOptions,
    /// Also every running CPython process (added to `record.pids`).
    pub python: bool,
    pub refresh: Duration,
}

/// How the window ended.
pub struct TopOutcome {
    /// The final recording (every probe detached).
    pub recording: Recording,
    pub pids: Vec<u32>,
}

/// The verdict so far (issue 12's bottleneck verdict, docs/verdict.md):
/// the text report's verdict section of the snapshot, without its title
/// and blank lines. The view shows these lines under "verdict so far".
pub fn verdict_lines(rec: &Recording) -> Vec<String> {
    let mut text = String::new();
    verdict::render_text(&verdict::verdict(rec), &mut text);
    text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with("== ")).map(|l| printable(l).into_owned()).collect()
}

/// What a key asks for.
#[derive(Debug, PartialEq, Eq)]
enum Action {
    Quit,
    Redraw,
    None,
}

fn on_key(ui: &mut view::Ui, k: KeyEvent) -> Action {
    if k.kind == KeyEventKind::Release {
        return Action::None;
    }
    match k.code {
        KeyCode::Char('q') | KeyCode::Esc => Action::Quit,
        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => Action::Quit,
        KeyCode::Tab | KeyCode::Right => {
            ui.view = ui.view.next();
            Action::Redraw
        }
        KeyCode::BackTab | KeyCode::Left => {
            ui.view = ui.view.previous();
            Action::Redraw
        }
        KeyCode::Char(c @ '1'..='6') => {
            ui.view = view::View::ALL[(c as usize) - ('1' as usize)];
            Action::Redraw
        }
        KeyCode::Char('s') => {
            ui.sort = ui.sort.next();
            Action::Redraw
        }
        _ => Action::None,
    }
}

/// Runs the live view until `q` (or Ctrl-C, SIGTERM, SIGHUP), then closes
/// the window: the terminal is restored first, then every probe detached.
pub async fn run(mut opts: TopOptions, argv: Vec<String>) -> Result<TopOutcome, TopError> {
    if !std::io::stdout().is_terminal() {
        return Err(TopError::NotATerminal);
    }
    if opts.python {
        // One that exited since the scan is not an error, as a `-p` pid is.
        let mut found = discover::python_pids();
        found.retain(|&pid| crate::engine::targets::validate_pid(pid).is_ok());
        if found.is_empty() && opts.record.pids.is_empty() {
            return Err(TopError::NoPython);
        }
        for pid in found {
            if !opts.record.pids.contains(&pid) {
                opts.record.pids.push(pid);
            }
        }
    }
    let pids = opts.record.pids.clone();
    opts.record.output = None;
    opts.record.checkpoint_every = None;
    opts.record.duration = None;
    opts.record.quiet = true;
    use tokio::signal::unix::{signal, SignalKind};
    // Attached before the screen is taken: an error is one line on a normal terminal.
    let btf = session::preflight(&opts.record)?;
    let mut live = Engine::open(opts.record, argv, btf, crate::families::list())?;
    let signals = Signals {
        int: signal(SignalKind::interrupt()).map_err(TopError::Signals)?,
        term: signal(SignalKind::terminate()).map_err(TopError::Signals)?,
        hup: signal(SignalKind::hangup()).map_err(TopError::Signals)?,
    };
    // Whatever ended the loop, the window is closed the way `record` closes it.
    let looped = drive(&mut live, opts.refresh, signals).await;
    let recording = live.close().await?;
    looped?;
    Ok(TopOutcome { recording, pids })
}

struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

/// The screen's loop: snapshots every `refresh`, keys, signals, and the
/// session's own wake-ups and polls. The terminal is restored when it
/// returns (or unwinds).
async fn drive(live: &mut Engine, refresh: Duration, mut signals: Signals) -> Result<(), TopError> {
    let mut screen = terminal::Screen::enter().map_err(TopError::Terminal)?;
    let mut keys = terminal::keys();
    let mut ui = view::Ui::default();
    let mut state = state::State::new();
    let mut model = state.update(&live.snapshot()?);
    model.alive = live.alive();
    screen.draw(&model, &ui).map_err(TopError::Terminal)?;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + refresh, refresh);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = signals.int.recv() => return Ok(()),
            _ = signals.term.recv() => return Ok(()),
            _ = signals.hup.recv() => return Ok(()),
            key = keys.recv() => match key {
                Some(Event::Key(k)) => match on_key(&mut ui, k) {
                    Action::Quit => return Ok(()),
                    Action::Redraw => screen.draw(&model, &ui).map_err(TopError::Terminal)?,
                    Action::None => {}
                },
                Some(Event::Resize(..)) => screen.draw(&model, &ui).map_err(TopError::Terminal)?,
                Some(_) => {}
                // The terminal's reader failed: nothing left to read keys from.
                None => return Ok(()),
            },
            _ = tick.tick() => {
                model = state.update(&live.snapshot()?);
                model.alive = live.alive();
                screen.draw(&model, &ui).map_err(TopError::Terminal)?;
            }
            // As in `record`, a failed poll ends the window.
            stepped = live.step() => {
                stepped?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ratatui::crossterm::event::{KeyEvent, KeyModifiers};

    use super::*;

    #[test]
    fn keys() {
        let mut ui = view::Ui::default();
        let key = |c| KeyEvent::new(c, KeyModifiers::NONE);
        assert_eq!(on_key(&mut ui, key(KeyCode::Char('q'))), Action::Quit);
        assert_eq!(on_key(&mut ui, KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)), Action::Quit);
        assert_eq!(on_key(&mut ui, key(KeyCode::Char('c'))), Action::None);
        assert_eq!(on_key(&mut ui, key(KeyCode::Tab)), Action::Redraw);
        assert_eq!(ui.view, view::View::Threads);
        on_key(&mut ui, key(KeyCode::Char('5')));
        assert_eq!(ui.view, view::View::Cuda);
        on_key(&mut ui, key(KeyCode::Char('s')));
        assert_eq!(ui.sort, view::Sort::Total);
    }

    #[test]
    fn verdict_names_the_bottleneck_and_the_line() {
        let rec = state::tests::snapshot(2, 10);
        let lines = verdict_lines(&rec);
        assert!(lines[0].starts_with("pid 10 demo: bottleneck Python compute 90.0% at fib (app.py:7)"), "{lines:?}");
        assert!(lines.iter().any(|l| l.trim_start().starts_with("advice: ")), "{lines:?}");
    }
}
