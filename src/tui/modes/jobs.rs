//! The jobs overlay: every job of every host with its phase; ↑↓ choose one, S sweeps it (its ranks only, on
//! every host it runs on), its key or Esc closes it.

use crossterm::event::KeyEvent;

use super::{Dialog, Mode};
use crate::tui::app::{App, Effect};
use crate::tui::keymap::{Cmd, Layer};

pub fn key(app: &mut App, sel: usize, k: KeyEvent) -> Vec<Effect> {
    let rows = app.job_rows();
    let last = rows.len().saturating_sub(1);
    app.mode = match app.cfg.keymap.lookup_in(Layer::Jobs, &k) {
        Some(Cmd::Quit) => {
            app.view.quit = true;
            Mode::Jobs { sel }
        }
        Some(Cmd::Back | Cmd::Jobs) => Mode::Main,
        Some(Cmd::Up) => Mode::Jobs {
            sel: sel.saturating_sub(1),
        },
        Some(Cmd::Down) => Mode::Jobs {
            sel: (sel + 1).min(last),
        },
        Some(Cmd::Sweep) if !app.cfg.readonly => {
            if let Some(row) = rows.get(sel.min(last)) {
                super::sweep::open_job(app, row);
                return vec![];
            }
            Mode::Jobs { sel }
        }
        Some(Cmd::Help) => Mode::Dialog(Dialog::Help),
        _ => Mode::Jobs { sel },
    };
    vec![]
}
