//! The main screen's keys: moving, panels, opening a host, and the commands that open a dialog or an
//! overlay.

use crossterm::event::KeyEvent;

use super::{Dialog, Mode};
use crate::core::conn::HostCmd;
use crate::core::model::{HostId, SourceKind};
use crate::tui::app::{App, Effect, Level, Panel};
use crate::tui::keymap::{Cmd, Layer};

pub fn key(app: &mut App, k: KeyEvent) -> Vec<Effect> {
    match app.cfg.keymap.lookup_in(Layer::Main, &k) {
        Some(cmd) => run(app, cmd),
        None => vec![],
    }
}

/// A main-screen command; a kill, sweep or removal only where one may start.
pub fn run(app: &mut App, cmd: Cmd) -> Vec<Effect> {
    if matches!(cmd, Cmd::Kill | Cmd::Sweep | Cmd::RemoveShm)
        && let Some(why) = no_actions(app)
    {
        app.set_status(why, Level::Info);
        return vec![];
    }
    command(app, cmd)
}

/// Why no kill, sweep or removal can start here, if none can: read-only everywhere, or this host.
fn no_actions(app: &App) -> Option<String> {
    if app.cfg.readonly {
        return Some(
            "read-only: kills, sweeps and removals are off (--readonly / readonly = true)".into(),
        );
    }
    if !app.host().is_some_and(|h| h.read_only) {
        return None;
    }
    let prom = app.snap().map_or(SourceKind::Http, |s| s.source) == SourceKind::Prometheus;
    let (from, how) = if prom {
        (
            "from Prometheus",
            "Enter on it in the hosts panel opens it live",
        )
    } else {
        (
            "over HTTP",
            "reach it over SSH (--hosts user@node) or through its agent to act",
        )
    };
    Some(format!(
        "{} is read-only (read {from}): {how}",
        app.label(HostId(app.view.sel.host))
    ))
}

fn command(app: &mut App, cmd: Cmd) -> Vec<Effect> {
    match cmd {
        Cmd::Quit => app.view.quit = true,
        Cmd::Up => app.move_sel(-1),
        Cmd::Down => app.move_sel(1),
        Cmd::Open => return open(app),
        Cmd::Back => return back(app),
        Cmd::Timeline => app.mode = Mode::Timeline { scroll: 0 },
        Cmd::Jobs => app.mode = Mode::Jobs { sel: 0 },
        Cmd::NextTrouble => app.next_trouble(),
        Cmd::Chart => app.view.chart_open = !app.view.chart_open,
        Cmd::NextPanel => app.view.sel.focus = app.view.sel.focus.step(1),
        Cmd::PrevPanel => app.view.sel.focus = app.view.sel.focus.step(-1),
        Cmd::Kill => super::kill::open(app),
        Cmd::Sweep => super::sweep::open(app),
        Cmd::RemoveShm => super::remove::open(app),
        Cmd::Rewatch => return app.toggle_rewatch(),
        // On the hosts panel of several hosts the filter is the hosts'; elsewhere the processes'.
        Cmd::Filter if app.view.sel.focus == Panel::Hosts && app.store.hosts.len() > 1 => {
            app.mode = Mode::HostFilter;
        }
        Cmd::Filter => {
            app.mode = Mode::Filter;
            app.view.sel.focus = Panel::Processes;
        }
        Cmd::Sort => {
            app.view.procs.sort = app.view.procs.sort.next();
            app.rebuild_rows();
        }
        Cmd::Refresh => {
            app.set_status("refreshing", Level::Info);
            return vec![Effect::Broadcast(HostCmd::PollNow)];
        }
        Cmd::Smem => app.mode = Mode::Smem { editing: false },
        Cmd::Help => app.mode = Mode::Dialog(Dialog::Help),
        Cmd::Tree => {
            app.view.procs.tree = !app.view.procs.tree;
            app.rebuild_rows();
        }
        Cmd::Confirm
        | Cmd::Cancel
        | Cmd::NextChoice
        | Cmd::PrevChoice
        | Cmd::EditTile
        | Cmd::NextDtype
        | Cmd::MoreStages
        | Cmd::FewerStages
        | Cmd::Erase => {}
    }
    vec![]
}

/// Enter: a finding opens whole; a host opens, live where it was seen through Prometheus.
fn open(app: &mut App) -> Vec<Effect> {
    match app.view.sel.focus {
        Panel::Findings => super::finding::open(app),
        Panel::Hosts => {
            app.view.sel.focus = Panel::Gpus;
            let host = HostId(app.view.sel.host);
            if let Some(url) = app
                .snap()
                .filter(|s| s.source == SourceKind::Prometheus)
                .and_then(|s| s.live_url.clone())
            {
                let label = app.label(host);
                app.set_status(format!("opening {label} live: {url}"), Level::Info);
                return vec![Effect::OpenLive(host, url)];
            }
        }
        Panel::Gpus | Panel::Processes => {}
    }
    vec![]
}

/// Esc: first ends what runs without end (a re-watch), then the banner, the filter, the focus.
fn back(app: &mut App) -> Vec<Effect> {
    if app.rewatch.is_some() {
        return app.toggle_rewatch();
    }
    if app.view.banner.is_some() {
        app.view.banner = None;
    } else if !app.view.procs.filter.is_empty() {
        app.view.procs.filter.clear();
        app.rebuild_rows();
    } else if !app.view.hosts_filter.is_empty() {
        app.view.hosts_filter.clear();
    } else {
        app.view.sel.focus = Panel::Hosts;
    }
    vec![]
}
