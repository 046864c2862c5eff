//! A finding opened whole, with its evidence. The kill key acts on it from here, as from the panel.

use crossterm::event::KeyEvent;

use super::{Dialog, Mode};
use crate::core::model::{Finding, HostId};
use crate::tui::app::{App, Effect, Panel};
use crate::tui::keymap::{Cmd, Layer};

/// Enter on a finding.
pub fn open(app: &mut App) {
    let host = HostId(app.view.sel.host);
    if let Some(f) = app
        .snap()
        .and_then(|s| s.findings.get(app.view.sel.finding))
    {
        app.mode = Mode::Dialog(Dialog::Finding {
            host,
            finding: f.clone(),
        });
    }
}

/// Any key closes it; the kill key opens the kill dialog for the finding, where kills are allowed.
pub fn key(app: &mut App, host: HostId, finding: &Finding, k: KeyEvent) -> Vec<Effect> {
    if app.cfg.keymap.lookup_in(Layer::Dialog, &k) != Some(Cmd::Kill) {
        return vec![];
    }
    let at = app
        .store
        .hosts
        .get(host.0)
        .and_then(|h| h.snap.as_ref())
        .and_then(|s| s.findings.iter().position(|f| f == finding));
    if let Some(i) = at {
        let sel = &mut app.view.sel;
        sel.host = host.0;
        sel.focus = Panel::Findings;
        sel.finding = i;
        return super::main::run(app, Cmd::Kill);
    }
    vec![]
}
