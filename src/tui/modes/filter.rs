//! A filter being typed, the processes' or the hosts': characters are text; Enter keeps it, Esc clears it.

use crossterm::event::{KeyCode, KeyEvent};

use super::Mode;
use crate::tui::app::{App, Effect};
use crate::tui::keymap::{Cmd, Layer};

/// The longest filter kept.
const MAX_FILTER: usize = 64;

pub fn key(app: &mut App, k: KeyEvent) -> Vec<Effect> {
    let filter = &mut app.view.procs.filter;
    match app.cfg.keymap.lookup_in(Layer::Edit, &k) {
        Some(Cmd::Confirm) => {}
        Some(Cmd::Cancel) => filter.clear(),
        Some(Cmd::Quit) => app.view.quit = true,
        Some(Cmd::Erase) => {
            filter.pop();
            app.mode = Mode::Filter;
        }
        _ => {
            if let KeyCode::Char(c) = k.code
                && filter.chars().count() < MAX_FILTER
            {
                filter.push(c);
            }
            app.mode = Mode::Filter;
        }
    }
    app.view.sel.proc = 0;
    app.rebuild_rows();
    vec![]
}

/// The hosts filter: words a host must all match, a part of its name or `is:STATE`. Enter keeps it (and says
/// which `is:` words name no state), Esc clears it.
pub fn host_key(app: &mut App, k: KeyEvent) -> Vec<Effect> {
    let filter = &mut app.view.hosts_filter;
    match app.cfg.keymap.lookup_in(Layer::Edit, &k) {
        Some(Cmd::Confirm) => {
            let unknown = app.unknown_states();
            if !unknown.is_empty() {
                let msg = format!(
                    "no state {} (is: {})",
                    unknown.join(", "),
                    crate::tui::app::HOST_STATES.join(", ")
                );
                app.set_status(&msg, crate::tui::app::Level::Bad);
            }
        }
        Some(Cmd::Cancel) => filter.clear(),
        Some(Cmd::Quit) => app.view.quit = true,
        Some(Cmd::Erase) => {
            filter.pop();
            app.mode = Mode::HostFilter;
        }
        _ => {
            if let KeyCode::Char(c) = k.code
                && filter.chars().count() < MAX_FILTER
            {
                filter.push(c);
            }
            app.mode = Mode::HostFilter;
        }
    }
    app.keep_shown_host_selected();
    app.rebuild_rows();
    vec![]
}
