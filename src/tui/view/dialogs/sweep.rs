//! The sweep confirmation: its scope (the GPU, the host, everything) and every process it signals.

// Widths and row counts are bounded by the screen.
#![allow(clippy::cast_possible_truncation)]

use ratatui::Frame;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};

use super::super::truncate;
use super::{centered, choice, confirm_box, hint};
use crate::analyze::plan::plan_summary;
use crate::core::format::{fmt_bytes, fmt_gpus};
use crate::tui::app::{App, TUI_GRACE};
use crate::tui::keymap::Cmd;
use crate::tui::modes::sweep::{Sweep, SweepScope};

pub fn render(app: &App, f: &mut Frame, d: &Sweep) {
    let area = f.area();
    let w = area.width.min(110);
    let reset = reset_plan(app, d);
    let extra = if reset.is_some() { 2 } else { 0 };
    let height = (d.plan.items.len() as u16 + 9 + extra).min(area.height);
    let r = centered(area, w, height);
    let label = app.label(d.host);
    let mut scopes = vec![Span::raw(" scope   ")];
    if d.scope == SweepScope::Job {
        // The job's ranks, on every host it runs on: no other scope to step to.
        scopes.push(choice(
            app,
            &format!("job {} (its ranks only)", d.job.as_deref().unwrap_or("?")),
            true,
        ));
    } else {
        if let Some(g) = d.gpu {
            scopes.push(choice(
                app,
                &format!("GPU {g} of {label}"),
                d.scope == SweepScope::Gpu,
            ));
            scopes.push(Span::raw(" "));
        }
        scopes.push(choice(
            app,
            &format!("all of {label}"),
            d.scope == SweepScope::Host,
        ));
        scopes.push(Span::raw(" "));
        scopes.push(choice(app, "everything", d.scope == SweepScope::Everything));
    }
    let mut lines = vec![Line::from(scopes), Line::default()];
    if d.plan.items.is_empty() {
        lines.push(Line::from(
            " nothing to signal: no live holder or listed process in this scope",
        ));
    } else {
        lines.push(Line::from(Span::styled(
            format!(
                " {:<10} {:>7} {:<8} {:<6} {:>10}  COMMAND",
                "HOST", "PID", "USER", "GPUS", "GPU MEM"
            ),
            Style::default().add_modifier(Modifier::BOLD),
        )));
        let cmd_w = w.saturating_sub(52) as usize;
        for i in &d.plan.items {
            lines.push(Line::from(format!(
                " {:<10} {:>7} {:<8} {:<6} {:>10}  {}",
                truncate(&i.host, 10),
                i.pid,
                truncate(i.user.as_deref().unwrap_or("N/A"), 8),
                fmt_gpus(&i.gpus),
                fmt_bytes(i.bytes),
                truncate(&crate::core::format::brief_cmd(&i.cmdline), cmd_w)
            )));
        }
    }
    if let Some(plan) = reset {
        lines.push(Line::default());
        lines.push(Line::from(plan));
    }
    lines.push(Line::default());
    lines.push(Line::from(format!(
        " {} — TERM, then KILL after {}s; then re-watch until clean",
        plan_summary(&d.plan),
        TUI_GRACE.as_secs()
    )));
    let keys: &[(Cmd, &str)] = if d.scope == SweepScope::Job {
        &[(Cmd::Confirm, "sweep"), (Cmd::Cancel, "cancel")]
    } else {
        &[
            (Cmd::Confirm, "sweep"),
            (Cmd::NextChoice, "change scope"),
            (Cmd::Cancel, "cancel"),
        ]
    };
    lines.push(hint(app, keys));
    confirm_box(app, f, r, lines, "Sweep", "process", false);
}

/// A GPU whose leftover no signal reaches (a kernel left running, memory nobody holds): the reset's plan.
fn reset_plan(app: &App, d: &Sweep) -> Option<String> {
    let (SweepScope::Gpu, Some(g)) = (d.scope, d.gpu) else {
        return None;
    };
    let snap = app.store.hosts.get(d.host.0)?.snap.as_ref()?;
    let gpu = snap.gpu(g)?;
    let unreached = snap.findings.iter().any(|f| {
        f.gpu == Some(g)
            && f.target_pid.is_none()
            && f.severity == crate::core::model::Severity::Leak
    });
    (gpu.state == Some(crate::core::model::GpuState::Leak) && unreached).then(|| {
        format!(
            " no signal reaches what holds GPU {g}: {}",
            crate::analyze::reset::plan(snap, gpu)
        )
    })
}
