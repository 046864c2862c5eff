//! One row per host: a strip with one cell per GPU (fill and state), findings, connection state.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Color;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::{fg, panel, selected, state_style, truncate};
use crate::core::conn::ConnStatus;
use crate::core::format::fmt_secs;
use crate::core::model::GpuState;
use crate::core::model::Severity;
use crate::tui::app::{App, HostView, Panel};

/// One character per GPU: `·` clean, a block as high as its memory fill when in use, `!` leak, `?` N/A.
pub fn cell(state: GpuState, used: Option<u64>, total: Option<u64>) -> char {
    const FILL: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    match state {
        GpuState::Clean => '·',
        GpuState::Leak => '!',
        GpuState::Unknown => '?',
        GpuState::Error => '✗',
        GpuState::NeedsReset => '‼',
        GpuState::InUse => match (used, total) {
            (Some(u), Some(t)) if t > 0 => {
                FILL[((u as f64 / t as f64) * 7.0).round().min(7.0) as usize]
            }
            _ => '●',
        },
    }
}

/// A host's GPU cells and its clean count, with its leak and warning counts after them.
fn cells(app: &App, h: &HostView, spans: &mut Vec<Span<'static>>) {
    let mut leaks = 0;
    let mut warn = 0;
    match &h.snap {
        Some(s) if s.error.is_none() && !s.gpus.is_empty() => {
            spans.push(Span::raw("["));
            for g in &s.gpus {
                let st = g.state.unwrap_or(GpuState::Unknown);
                spans.push(Span::styled(
                    cell(st, g.memory.used, g.memory.total).to_string(),
                    state_style(app, st),
                ));
            }
            spans.push(Span::raw("] "));
            let clean = h.counts.clean;
            spans.push(Span::raw(format!("{clean}/{} clean ", s.gpus.len())));
            leaks = h.leaks;
            warn = s
                .findings
                .iter()
                .filter(|f| f.severity == Severity::Warning)
                .count();
        }
        Some(s) if s.error.is_none() => {
            spans.push(Span::styled(
                truncate(s.gpu_error.as_deref().unwrap_or("no GPUs"), 28),
                fg(app, Color::DarkGray),
            ));
            spans.push(Span::raw(" "));
            warn = s.findings.len();
        }
        _ => spans.push(Span::styled("[no reading] ", fg(app, Color::DarkGray))),
    }
    if leaks > 0 {
        spans.push(Span::styled(format!("{leaks} leak "), fg(app, Color::Red)));
    }
    if warn > 0 {
        spans.push(Span::styled(
            format!("{warn} warn "),
            fg(app, Color::Yellow),
        ));
    }
}

/// A host's connection in words: up, connecting, silent too long, stale since, down and why.
fn connection(app: &App, h: &HostView) -> Span<'static> {
    let ago = |t: u64| fmt_secs(app.view.now_ms.saturating_sub(t) / 1000);
    match &h.status {
        ConnStatus::Up => Span::styled("up", fg(app, Color::Green)),
        ConnStatus::Connecting if app.silent_too_long(h) => Span::styled(
            format!(
                "no reading within {}s; still trying",
                app.cfg.connect_timeout.as_secs()
            ),
            fg(app, Color::Red),
        ),
        ConnStatus::Connecting => Span::styled("connecting…", fg(app, Color::Yellow)),
        // The age runs on between messages: it is the age of the reading shown.
        ConnStatus::Stale { silent_ms } => {
            let age = h.last_seen_ms.map_or(fmt_secs(*silent_ms / 1000), ago);
            Span::styled(
                format!("stale: no reading for {age}"),
                fg(app, Color::Yellow),
            )
        }
        ConnStatus::Down(e) => {
            let seen = h
                .last_seen_ms
                .map(|t| format!(", seen {} ago", ago(t)))
                .unwrap_or_default();
            Span::styled(
                format!("down: {}{seen}", truncate(e, 40)),
                fg(app, Color::Red),
            )
        }
    }
}

/// "Hosts 4: 1 leaking, 0 unreadable": what a long list holds, so a fleet of thousands is read at a glance
/// (`n` goes to the next host that leaks or cannot be read).
fn title(app: &App, shown: usize) -> String {
    let hosts = &app.store.hosts;
    if hosts.len() < 2 {
        return "Hosts".into();
    }
    let leaking = hosts.iter().filter(|h| h.leaks > 0).count();
    let unreadable = hosts
        .iter()
        .filter(|h| {
            matches!(h.status, ConnStatus::Down(_) | ConnStatus::Stale { .. })
                || app.silent_too_long(h)
        })
        .count();
    let connecting = hosts
        .iter()
        .filter(|h| h.snap.is_none() && matches!(h.status, ConnStatus::Connecting))
        .count();
    let mut t = if app.view.hosts_filter.trim().is_empty() {
        format!(
            "Hosts {}: {leaking} leaking, {unreadable} unreadable",
            hosts.len()
        )
    } else {
        format!(
            "Hosts {} of {} shown ({}): {leaking} leaking, {unreadable} unreadable",
            shown,
            hosts.len(),
            truncate(app.view.hosts_filter.trim(), 24)
        )
    };
    if connecting > 0 {
        t.push_str(&format!(", {connecting} connecting"));
    }
    t
}

/// The hosts strip: one row per host, its cells in order.
pub fn render(app: &App, f: &mut Frame, area: Rect, compact: bool) {
    let focused = app.view.sel.focus == Panel::Hosts;
    let shown = app.shown_hosts();
    let block = panel(app, &title(app, shown.len()), focused, compact);
    let inner = block.inner(area);
    f.render_widget(block, area);
    let rows = inner.height as usize;
    let at = shown
        .iter()
        .position(|&i| i == app.view.sel.host)
        .unwrap_or(0);
    let start = at.saturating_sub(rows.saturating_sub(1));
    let name_w = app.store.label_width(4, 24);
    let mut lines = Vec::new();
    for &i in shown.iter().skip(start).take(rows) {
        let h = &app.store.hosts[i];
        let at = if i == app.view.sel.host { "▸ " } else { "  " };
        let mut spans = vec![
            Span::raw(at),
            Span::raw(format!("{:<name_w$} ", truncate(&h.label, name_w))),
        ];
        cells(app, h, &mut spans);
        spans.push(connection(app, h));
        let mut line = Line::from(spans);
        if i == app.view.sel.host && focused {
            line = line.style(selected(app));
        }
        lines.push(line);
    }
    f.render_widget(Paragraph::new(lines), inner);
}
