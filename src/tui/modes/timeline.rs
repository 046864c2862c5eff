//! The timeline overlay: scroll back through what happened; its key or Esc closes it.

use crossterm::event::KeyEvent;

use super::{Dialog, Mode};
use crate::tui::app::{App, Effect};
use crate::tui::keymap::{Cmd, Layer};

pub fn key(app: &mut App, scroll: usize, k: KeyEvent) -> Vec<Effect> {
    let last = app.store.timeline.len().saturating_sub(1);
    app.mode = match app.cfg.keymap.lookup_in(Layer::Timeline, &k) {
        Some(Cmd::Quit) => {
            app.view.quit = true;
            Mode::Timeline { scroll }
        }
        Some(Cmd::Back | Cmd::Timeline) => Mode::Main,
        Some(Cmd::Up) => Mode::Timeline {
            scroll: (scroll + 1).min(last),
        },
        Some(Cmd::Down) => Mode::Timeline {
            scroll: scroll.saturating_sub(1),
        },
        Some(Cmd::Help) => Mode::Dialog(Dialog::Help),
        _ => Mode::Timeline { scroll },
    };
    vec![]
}
