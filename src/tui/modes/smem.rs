//! The shared-memory overlay and tile calculator: dtype, stages, and a tile typed in place.

use crossterm::event::{KeyCode, KeyEvent};

use super::{Dialog, Mode};
use crate::tui::app::{App, DTYPES, Effect};
use crate::tui::keymap::{Cmd, Layer};

/// The longest tile typed ("128x256x128" and a margin).
const MAX_TILE: usize = 20;
/// The most pipeline stages the calculator offers.
const MAX_STAGES: u64 = 16;

pub fn key(app: &mut App, editing: bool, k: KeyEvent) -> Vec<Effect> {
    if editing {
        return type_tile(app, k);
    }
    app.mode = Mode::Smem { editing: false };
    let form = &mut app.smem;
    match app.cfg.keymap.lookup_in(Layer::Smem, &k) {
        Some(Cmd::Quit) => app.view.quit = true,
        Some(Cmd::Back | Cmd::Smem) => app.mode = Mode::Main,
        Some(Cmd::EditTile) => app.mode = Mode::Smem { editing: true },
        Some(Cmd::NextDtype) => form.dtype_idx = (form.dtype_idx + 1) % DTYPES.len(),
        Some(Cmd::MoreStages) => form.stages = (form.stages + 1).min(MAX_STAGES),
        Some(Cmd::FewerStages) => form.stages = form.stages.saturating_sub(1).max(1),
        Some(Cmd::Up) => app.move_sel(-1),
        Some(Cmd::Down) => app.move_sel(1),
        Some(Cmd::Help) => app.mode = Mode::Dialog(Dialog::Help),
        _ => {}
    }
    vec![]
}

/// The tile being typed: digits and `x`; Enter or Esc ends it.
fn type_tile(app: &mut App, k: KeyEvent) -> Vec<Effect> {
    let tile = &mut app.smem.tile;
    let mut editing = true;
    match app.cfg.keymap.lookup_in(Layer::Edit, &k) {
        Some(Cmd::Confirm | Cmd::Cancel) => editing = false,
        Some(Cmd::Erase) => {
            tile.pop();
        }
        _ => {
            if let KeyCode::Char(c) = k.code
                && (c.is_ascii_digit() || c == 'x')
                && tile.len() < MAX_TILE
            {
                tile.push(c);
            }
        }
    }
    app.mode = Mode::Smem { editing };
    vec![]
}
