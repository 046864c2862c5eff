//! The removal dialog: the host's /dev/shm leftovers nobody uses, each to be re-checked where it is removed.

use crossterm::event::KeyEvent;

use super::{Dialog, Mode};
use crate::analyze::findings::shm::removable;
use crate::core::action::ActionRequest;
use crate::core::conn::HostCmd;
use crate::core::model::HostId;
use crate::core::removal::{RemovalRequest, ShmFile};
use crate::tui::app::{App, Effect, Level};
use crate::tui::keymap::{Cmd, Layer};

/// D: the selected host's leftovers, for a confirmation that lists them.
pub fn open(app: &mut App) {
    let host = HostId(app.view.sel.host);
    let files = app.snap().map(removable).unwrap_or_default();
    if files.is_empty() {
        let label = app.label(host);
        app.set_status(
            format!("no /dev/shm leftovers on {label} (nobody-uses-it files only)"),
            Level::Info,
        );
        return;
    }
    app.mode = Mode::Dialog(Dialog::Remove { host, files });
}

pub fn key(app: &mut App, host: HostId, files: Vec<ShmFile>, k: KeyEvent) -> Vec<Effect> {
    match app.cfg.keymap.lookup_in(Layer::Dialog, &k) {
        Some(Cmd::Cancel) => vec![],
        Some(Cmd::Confirm) => {
            let id = app.take_id("remove".into());
            app.set_status(
                format!("removing {} /dev/shm file(s)…", files.len()),
                Level::Info,
            );
            let req = ActionRequest::Remove(RemovalRequest { files });
            vec![Effect::Send(host, HostCmd::Act { id, req })]
        }
        _ => {
            app.mode = Mode::Dialog(Dialog::Remove { host, files });
            vec![]
        }
    }
}
