//! Pure render functions: each takes the app by shared reference and draws; none changes state or does I/O.

// Terminal geometry (u16) and row counts (usize) meet in layout math; every value is bounded by the
// screen or a small simulated quantity, so the casts cannot lose anything that matters.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod chart;
mod dialogs;
mod findings;
mod gpus;
mod header;
mod hosts;
mod jobs;
mod processes;
mod smem;
mod timeline;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};

use crate::analyze::GpuState;
use crate::tui::app::{App, Level, Panel};
use crate::tui::keymap::Cmd;

pub use crate::core::format::truncate;

/// Where each panel goes. Also used to map mouse clicks to panels.
#[derive(Debug, Clone, Copy, Default)]
pub struct Areas {
    pub header: Rect,
    pub banner: Rect,
    pub hosts: Rect,
    pub gpus: Rect,
    pub procs: Rect,
    pub findings: Rect,
    pub smem: Rect,
    pub status: Rect,
    pub compact: bool,
}

pub fn layout(area: Rect, app: &App) -> Areas {
    let compact = area.height < 30;
    let border = if compact { 1 } else { 2 };
    let host_rows = app.store.hosts.len().clamp(1, if compact { 3 } else { 10 }) as u16;
    let gpu_rows = app
        .snap()
        .map_or(1, |s| s.gpus.iter().map(|g| 1 + g.mig.len()).sum())
        .clamp(1, if compact { 8 } else { 16 }) as u16;
    let banner = u16::from(app.view.banner.is_some() || app.rewatch().is_some());
    // Header, banner and status line always get their row; the panels share what is left, so even at
    // 40x10 the all-zero banner is seen.
    let left = area.height.saturating_sub(2 + banner);
    let hosts_h = (host_rows + border).min((left / 3).max(2)).min(left);
    let gpus_h = (gpu_rows + border + 1).min(left.saturating_sub(hosts_h) * 2 / 3);
    let v = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(banner),
        Constraint::Length(hosts_h),
        Constraint::Length(gpus_h),
        Constraint::Fill(1),
        Constraint::Length(1),
    ])
    .split(area);
    let mut a = Areas {
        header: v[0],
        banner: v[1],
        hosts: v[2],
        gpus: v[3],
        status: v[5],
        compact,
        ..Default::default()
    };
    // The shared-memory panel takes the room of the GPU and process panels.
    a.smem = Rect {
        height: v[3].height + v[4].height,
        ..v[3]
    };
    if compact {
        // One bottom panel: findings when they have the focus, processes otherwise.
        if app.view.sel.focus == Panel::Findings {
            a.findings = v[4];
        } else {
            a.procs = v[4];
        }
    } else if area.width >= 140 {
        let h = Layout::horizontal([Constraint::Percentage(58), Constraint::Percentage(42)])
            .split(v[4]);
        a.procs = h[0];
        a.findings = h[1];
    } else {
        let h =
            Layout::vertical([Constraint::Percentage(55), Constraint::Percentage(45)]).split(v[4]);
        a.procs = h[0];
        a.findings = h[1];
    }
    a
}

pub fn render(app: &App, f: &mut Frame) {
    let a = layout(f.area(), app);
    header::render(app, f, a.header, a.banner);
    hosts::render(app, f, a.hosts, a.compact);
    if app.timeline_scroll().is_some() {
        timeline::render(app, f, a.smem);
    } else if app.jobs_sel().is_some() {
        jobs::render(app, f, a.smem);
    } else if app.smem_editing().is_some() {
        smem::render(app, f, a.smem);
    } else {
        gpus::render(app, f, a.gpus, a.compact);
        if a.procs.height > 0 && app.view.chart_open {
            chart::render(app, f, a.procs);
        } else if a.procs.height > 0 {
            processes::render(app, f, a.procs, a.compact);
        }
        if a.findings.height > 0 {
            findings::render(app, f, a.findings, a.compact);
        }
    }
    status_line(app, f, a.status);
    dialogs::render(app, f);
}

/// A style that honours NO_COLOR: without colour, emphasis stays (bold, reverse) and glyphs carry meaning.
pub fn fg(app: &App, c: Color) -> Style {
    if app.cfg.color {
        Style::default().fg(c)
    } else {
        Style::default()
    }
}

pub fn state_style(app: &App, s: GpuState) -> Style {
    match s {
        GpuState::Clean => fg(app, Color::Green),
        GpuState::InUse => fg(app, Color::Cyan),
        GpuState::Leak => fg(app, Color::Red).add_modifier(Modifier::BOLD),
        GpuState::Unknown => fg(app, Color::DarkGray),
        GpuState::Error => fg(app, Color::Magenta),
        GpuState::NeedsReset => fg(app, Color::Magenta).add_modifier(Modifier::BOLD),
    }
}

pub fn selected(app: &App) -> Style {
    if app.cfg.color {
        Style::default()
            .bg(Color::DarkGray)
            .add_modifier(Modifier::BOLD)
    } else {
        Style::default().add_modifier(Modifier::REVERSED)
    }
}

pub fn panel(app: &App, title: &str, focused: bool, compact: bool) -> Block<'static> {
    let mut b = if compact {
        Block::new().borders(Borders::TOP)
    } else {
        Block::bordered()
    };
    let t = if focused {
        format!("▶ {title} ")
    } else {
        format!(" {title} ")
    };
    b = b.title(t);
    if focused {
        b = b.border_style(fg(app, Color::Yellow));
    }
    b
}

/// Used / total as a text bar: `███████░░░ 71.4 GiB/140.4 GiB`.
pub fn bar(used: Option<u64>, total: Option<u64>, width: usize) -> String {
    match (used, total) {
        (Some(u), Some(t)) if t > 0 => {
            let filled = ((u as f64 / t as f64) * width as f64).round() as usize;
            let filled = filled.min(width);
            format!("{}{}", "█".repeat(filled), "░".repeat(width - filled))
        }
        _ => "?".repeat(width),
    }
}

/// The last `width` samples as a sparkline, scaled to `max`.
pub fn sparkline(s: &[(u64, u64)], max: u64, width: usize) -> String {
    const TICKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let skip = s.len().saturating_sub(width);
    s.iter()
        .skip(skip)
        .map(|&(_, v)| {
            if v == 0 || max == 0 {
                ' '
            } else {
                TICKS[((v as f64 / max as f64) * 7.0).round().min(7.0) as usize]
            }
        })
        .collect()
}

fn status_line(app: &App, f: &mut Frame, area: Rect) {
    let line = if app.filter_editing() {
        Line::from(vec![
            Span::styled(" filter: ", fg(app, Color::Yellow)),
            Span::raw(format!("{}▏", app.view.procs.filter)),
            Span::raw("  (Enter keep, Esc clear)"),
        ])
    } else if app.hosts_filter_editing() {
        Line::from(vec![
            Span::styled(" hosts: ", fg(app, Color::Yellow)),
            Span::raw(format!("{}▏", app.view.hosts_filter)),
            Span::raw(
                "  (name parts, is:leaking is:unreadable is:connecting is:clean; Enter keep, Esc clear)",
            ),
        ])
    } else if let Some((msg, level)) = &app.view.status {
        let st = match level {
            Level::Info => fg(app, Color::White),
            Level::Good => fg(app, Color::Green),
            Level::Bad => fg(app, Color::Red),
        };
        Line::from(Span::styled(
            format!(" {}", truncate(msg, area.width.saturating_sub(2) as usize)),
            st,
        ))
    } else {
        let km = &app.cfg.keymap;
        let hint = [
            (Cmd::Quit, "quit"),
            (Cmd::Help, "help"),
            (Cmd::NextPanel, "panel"),
            (Cmd::Kill, "kill"),
            (Cmd::Sweep, "sweep"),
            (Cmd::Rewatch, "re-watch"),
            (Cmd::Timeline, "timeline"),
            (Cmd::Jobs, "jobs"),
            (Cmd::Chart, "chart"),
            (Cmd::Filter, "filter"),
            (Cmd::Smem, "smem"),
        ]
        .iter()
        .filter(|(c, _)| !(app.cfg.readonly && matches!(c, Cmd::Kill | Cmd::Sweep)))
        .map(|(c, w)| format!("{} {w}", km.keys_for(*c)))
        // As many as fit, in this order: ? help lists the rest.
        .fold(String::new(), |acc, h| {
            let next = if acc.is_empty() {
                h
            } else {
                format!("{acc}  {h}")
            };
            if next.chars().count() < area.width as usize {
                next
            } else {
                acc
            }
        });
        Line::from(Span::styled(format!(" {hint}"), fg(app, Color::DarkGray)))
    };
    f.render_widget(Paragraph::new(line), area);
}
