//! The sweep dialog: the plan for the selected GPU, its host, or every host (Tab changes the scope), or for
//! a job chosen in the jobs overlay (its ranks on every host it runs on), and the sweep it starts.

use crossterm::event::KeyEvent;

use super::{Dialog, Mode};
use crate::analyze::plan::{Plan, plan};
use crate::core::model::HostId;
use crate::tui::app::{App, Effect, Panel};
use crate::tui::keymap::{Cmd, Layer};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepScope {
    Gpu,
    Host,
    Everything,
    /// The job `Sweep::job` names: its GPU processes, on every host it runs on.
    Job,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sweep {
    pub scope: SweepScope,
    pub host: HostId,
    pub gpu: Option<u32>,
    /// The job's id, for the job scope.
    pub job: Option<String>,
    pub plan: Plan,
}

/// The plan for a scope, from the latest readings.
pub fn plan_for(app: &App, scope: SweepScope, host: HostId, gpu: Option<u32>) -> Plan {
    let mut all = Plan::default();
    for (i, h) in app.store.hosts.iter().enumerate() {
        if scope != SweepScope::Everything && i != host.0 {
            continue;
        }
        let Some(s) = &h.snap else { continue };
        let gpus = if scope == SweepScope::Gpu {
            gpu.map(|g| vec![g])
        } else {
            None
        };
        all.extend(plan(HostId(i), s, gpus.as_deref(), &h.protected));
    }
    all
}

/// The plan for a job: on each host it runs on, the processes a sweep of its GPUs would signal that are
/// its ranks (never another process that shares a GPU with it).
pub fn plan_for_job(app: &App, row: &crate::tui::app::JobRow) -> Plan {
    let mut all = Plan::default();
    for (host, j) in &row.members {
        let Some(h) = app.store.hosts.get(host.0) else {
            continue;
        };
        // Read over HTTP or from Prometheus: no signal reaches it.
        if h.read_only {
            continue;
        }
        let Some(s) = &h.snap else { continue };
        let ranks: Vec<u32> = crate::analyze::watch::job_processes(s, &row.id)
            .into_iter()
            .map(|(pid, _)| pid)
            .chain(j.members().map(|r| r.pid))
            .collect();
        let mut p = plan(*host, s, Some(&j.gpus), &h.protected);
        p.items.retain(|i| ranks.contains(&i.pid));
        all.extend(p);
    }
    all
}

/// S in the jobs overlay: the selected job's plan.
pub fn open_job(app: &mut App, row: &crate::tui::app::JobRow) {
    let plan = plan_for_job(app, row);
    let host = row.members.first().map_or(HostId(0), |m| m.0);
    app.mode = Mode::Dialog(Dialog::Sweep(Sweep {
        scope: SweepScope::Job,
        host,
        gpu: None,
        job: Some(row.id.clone()),
        plan,
    }));
}

/// S: the selected GPU's plan from the GPU panel, else the host's.
pub fn open(app: &mut App) {
    let host = HostId(app.view.sel.host);
    let gpu = app
        .snap()
        .and_then(|s| s.gpus.get(app.view.sel.gpu))
        .map(|g| g.index);
    let scope = match app.view.sel.focus {
        Panel::Gpus if gpu.is_some() => SweepScope::Gpu,
        _ => SweepScope::Host,
    };
    let plan = plan_for(app, scope, host, gpu);
    app.mode = Mode::Dialog(Dialog::Sweep(Sweep {
        scope,
        host,
        gpu,
        job: None,
        plan,
    }));
}

pub fn key(app: &mut App, d: Sweep, k: KeyEvent) -> Vec<Effect> {
    let step = match app.cfg.keymap.lookup_in(Layer::Dialog, &k) {
        Some(Cmd::Cancel) => return vec![],
        Some(Cmd::Confirm) => {
            return app.start_sweep(d.scope, d.host, d.gpu, d.job.as_deref(), &d.plan);
        }
        Some(Cmd::NextChoice) => 1,
        Some(Cmd::PrevChoice) => 2,
        _ => 0,
    };
    // A job's sweep is the job's: no other scope to step to.
    if d.scope == SweepScope::Job {
        app.mode = Mode::Dialog(Dialog::Sweep(d));
        return vec![];
    }
    let order = [SweepScope::Gpu, SweepScope::Host, SweepScope::Everything];
    let i = order.iter().position(|s| *s == d.scope).unwrap_or(1);
    let mut scope = order[(i + step) % 3];
    if scope == SweepScope::Gpu && d.gpu.is_none() {
        scope = SweepScope::Host;
    }
    let plan = if scope == d.scope {
        d.plan
    } else {
        plan_for(app, scope, d.host, d.gpu)
    };
    app.mode = Mode::Dialog(Dialog::Sweep(Sweep { scope, plan, ..d }));
    vec![]
}
