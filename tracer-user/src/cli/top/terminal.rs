//! The terminal while `infertrace top` runs: raw mode and the alternate
//! screen, taken by [`Screen::enter`] and given back when the [`Screen`]
//! is dropped, on every return path; ratatui's panic hook gives it back on
//! a panic too. Keys are read on a thread of their own ([`keys`]), so the
//! session's loop never blocks on the terminal.

use ratatui::{crossterm::event, DefaultTerminal};

use super::{state::Model, view};

pub struct Screen {
    term: DefaultTerminal,
}

impl Screen {
    /// Raw mode and the alternate screen (and a panic hook that restores
    /// both before the panic message is printed).
    pub fn enter() -> std::io::Result<Screen> {
        match ratatui::try_init() {
            Ok(term) => Ok(Screen { term }),
            Err(e) => {
                // Raw mode may be on already.
                let _ = ratatui::try_restore();
                Err(e)
            }
        }
    }

    pub fn draw(&mut self, m: &Model, ui: &view::Ui) -> std::io::Result<()> {
        self.term.draw(|f| view::draw(f, m, ui)).map(|_| ())
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = self.term.show_cursor();
        let _ = ratatui::try_restore();
    }
}

/// Terminal events (keys, resizes) as they come. The channel closes when
/// reading the terminal fails; the reading thread ends with the process.
pub fn keys() -> tokio::sync::mpsc::UnboundedReceiver<event::Event> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let spawned = std::thread::Builder::new().name("top-keys".into()).spawn(move || {
        while let Ok(ev) = event::read() {
            if tx.send(ev).is_err() {
                break;
            }
        }
    });
    // Without the thread the receiver reports a closed channel at once:
    // `top` then ends as if the terminal had gone.
    drop(spawned);
    rx
}
