//! The TUI's layers: the main screen, a line being typed, a dialog, the shared-memory overlay, the timeline.
//! One is on top at a time (`Mode`); a key goes to it alone, through the keymap's layer for it. One file per
//! dialog and overlay.

pub mod filter;
pub mod finding;
pub mod help;
pub mod jobs;
pub mod kill;
pub mod main;
pub mod remove;
pub mod smem;
pub mod sweep;
pub mod timeline;

use crossterm::event::KeyEvent;
pub use sweep::SweepScope;

use super::app::{App, Effect};
use crate::core::model::{Finding, HostId};
use crate::core::removal::ShmFile;

/// What is on top.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Mode {
    #[default]
    Main,
    /// The process filter is being typed.
    Filter,
    /// The hosts filter is being typed.
    HostFilter,
    Dialog(Dialog),
    /// The shared-memory panel and tile calculator; `editing`: the tile is being typed.
    Smem {
        editing: bool,
    },
    /// The timeline, scrolled back this many rows from the newest event.
    Timeline {
        scroll: usize,
    },
    /// Every job of every host; `sel` the selected row.
    Jobs {
        sel: usize,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Dialog {
    Kill(kill::Kill),
    /// A finding's whole text and the evidence behind it.
    Finding {
        host: HostId,
        finding: Finding,
    },
    /// Remove these /dev/shm leftovers of a host.
    Remove {
        host: HostId,
        files: Vec<ShmFile>,
    },
    Sweep(sweep::Sweep),
    Help,
}

/// A key, to whatever is on top. The mode is taken while its handler runs; the handler puts back what is
/// on top afterwards (itself, another layer, or the main screen).
pub fn key(app: &mut App, k: KeyEvent) -> Vec<Effect> {
    match std::mem::take(&mut app.mode) {
        Mode::Main => main::key(app, k),
        Mode::Filter => filter::key(app, k),
        Mode::HostFilter => filter::host_key(app, k),
        Mode::Smem { editing } => smem::key(app, editing, k),
        Mode::Timeline { scroll } => timeline::key(app, scroll, k),
        Mode::Jobs { sel } => jobs::key(app, sel, k),
        Mode::Dialog(Dialog::Help) => help::key(app),
        Mode::Dialog(Dialog::Finding { host, finding }) => finding::key(app, host, &finding, k),
        Mode::Dialog(Dialog::Remove { host, files }) => remove::key(app, host, files, k),
        Mode::Dialog(Dialog::Kill(d)) => kill::key(app, d, k),
        Mode::Dialog(Dialog::Sweep(d)) => sweep::key(app, d, k),
    }
}
