//! The kill dialog: exactly whom, with which signal. It offers the real target (`tui::targets`): a zombie's
//! parent, a ghost's holder, with a note saying why.

use crossterm::event::KeyEvent;

use super::{Dialog, Mode};
use crate::core::action::{ActionRequest, Purpose};
use crate::core::conn::HostCmd;
use crate::core::format::millis;
use crate::core::model::HostId;
use crate::core::signal::{Sig, SignalRequest, TargetInfo};
use crate::tui::app::{App, Effect, Level, Panel, TUI_GRACE};
use crate::tui::keymap::{Cmd, Layer};
use crate::tui::targets::{self, Choice};

#[derive(Debug, Clone, PartialEq)]
pub struct Kill {
    pub host: HostId,
    pub target: TargetInfo,
    pub user: Option<String>,
    pub signal: Sig,
    /// What the operator should know first: the zombie or ghost this target stands for, a benign holder,
    /// state D.
    pub note: Option<String>,
}

/// K: the dialog for the selected process or finding, or why there is none.
pub fn open(app: &mut App) {
    let host = HostId(app.view.sel.host);
    let (Some(snap), protected) = (app.snap(), app.protected(host)) else {
        app.set_status("no reading of this host yet", Level::Info);
        return;
    };
    let choice = match app.view.sel.focus {
        Panel::Processes => match app.process_rows().get(app.view.sel.proc) {
            Some(r) if r.ghost => targets::for_ghost(snap, r.pid, &protected),
            Some(r) => targets::for_pid(snap, r.pid, &protected),
            None => Choice::Explain("no process row selected".into()),
        },
        Panel::Findings => match snap.findings.get(app.view.sel.finding) {
            Some(f) => targets::for_finding(snap, f, &protected),
            None => Choice::Explain("no finding selected".into()),
        },
        Panel::Hosts | Panel::Gpus => {
            Choice::Explain("select a process first: Tab to the process or findings panel".into())
        }
    };
    match choice {
        Choice::Offer { target, note } => {
            app.mode = Mode::Dialog(Dialog::Kill(Kill {
                host,
                target: TargetInfo::of(&target),
                user: target.user.clone(),
                signal: Sig::Term,
                note,
            }));
        }
        Choice::Explain(why) => app.set_status(why, Level::Info),
    }
}

pub fn key(app: &mut App, mut d: Kill, k: KeyEvent) -> Vec<Effect> {
    match app.cfg.keymap.lookup_in(Layer::Dialog, &k) {
        Some(Cmd::Cancel) => vec![],
        Some(Cmd::NextChoice | Cmd::PrevChoice) => {
            d.signal = if d.signal == Sig::Term {
                Sig::Kill
            } else {
                Sig::Term
            };
            app.mode = Mode::Dialog(Dialog::Kill(d));
            vec![]
        }
        Some(Cmd::Confirm) => send(app, d),
        _ => {
            app.mode = Mode::Dialog(Dialog::Kill(d));
            vec![]
        }
    }
}

/// Confirmed: the target as it was chosen, TERM with the TUI's grace (then KILL), or KILL.
fn send(app: &mut App, d: Kill) -> Vec<Effect> {
    let Kill {
        host,
        target,
        signal,
        ..
    } = d;
    let id = app.take_id(format!("{} {}", signal.name(), target.pid));
    let grace = (signal == Sig::Term).then_some(millis(TUI_GRACE));
    app.set_status(
        format!("sending {} to {}…", signal.name(), target.pid),
        Level::Info,
    );
    let req = ActionRequest::Signal(SignalRequest {
        targets: vec![target],
        signal,
        grace_ms: grace,
        purpose: Some(Purpose::Kill),
    });
    vec![Effect::Send(host, HostCmd::Act { id, req })]
}
