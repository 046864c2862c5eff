//! The jobs overlay: one row per job (a scheduler's job over several hosts is one row), its phase in words;
//! under it, the selected job's ranks host by host, the ranks it lost, and its memory over time.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::{fg, panel, sparkline, truncate};
use crate::core::format::phase_line;
use crate::core::format::{escape, fmt_bytes, fmt_gpus};
use crate::core::job::Phase;
use crate::tui::app::{App, JobRow};
use crate::tui::keymap::Cmd;

fn phase_style(app: &App, p: Phase) -> Style {
    match p {
        Phase::LostRank | Phase::Hung => fg(app, Color::Red).add_modifier(Modifier::BOLD),
        Phase::Loading | Phase::Starting => fg(app, Color::Yellow),
        Phase::Settled => fg(app, Color::Green),
        Phase::Holding | Phase::Unknown => Style::default(),
    }
}

/// The hosts a row runs on, for its column.
fn hosts_of(app: &App, r: &JobRow) -> String {
    match r.members.as_slice() {
        [(h, _)] => app.label(*h),
        more => format!("{} hosts", more.len()),
    }
}

pub fn render(app: &App, f: &mut Frame, area: Rect) {
    let rows = app.job_rows();
    let sel = app
        .jobs_sel()
        .unwrap_or(0)
        .min(rows.len().saturating_sub(1));
    let km = &app.cfg.keymap;
    let title = format!(
        "Jobs ({})  ↑↓ select  {} sweep the job  {} close",
        rows.len(),
        km.keys_for(Cmd::Sweep),
        km.keys_for(Cmd::Back)
    );
    let block = panel(app, &title, true, false);
    let inner = block.inner(area);
    f.render_widget(block, area);
    if rows.is_empty() {
        f.render_widget(
            Paragraph::new("no job: no GPU process on any host read"),
            inner,
        );
        return;
    }
    let list_h = (rows.len() as u16 + 1).min(inner.height / 2).max(2);
    let parts = Layout::vertical([Constraint::Length(list_h), Constraint::Fill(1)]).split(inner);
    let width = inner.width as usize;
    let mut lines = vec![Line::from(Span::styled(
        format!(
            "  {:<22} {:<12} {:>5} {:>10}  PHASE",
            "JOB", "HOSTS", "RANKS", "MEMORY"
        ),
        Style::default().add_modifier(Modifier::BOLD),
    ))];
    // The selected row stays in view.
    let room = list_h.saturating_sub(1) as usize;
    let first = sel.saturating_sub(room.saturating_sub(1));
    for (i, r) in rows.iter().enumerate().skip(first).take(room) {
        let (host, j) = &r.members[0];
        let snap = app.store.hosts.get(host.0).and_then(|v| v.snap.as_ref());
        let phase = snap.map(|s| phase_line(s, j)).unwrap_or_default();
        let head = format!(
            "{}{:<22} {:<12} {:>5} {:>10}  ",
            if i == sel { "▸ " } else { "  " },
            truncate(&escape(&r.id), 22),
            truncate(&hosts_of(app, r), 12),
            r.ranks(),
            fmt_bytes(r.bytes()),
        );
        let rest = width.saturating_sub(head.chars().count());
        let mut st = Style::default();
        if i == sel {
            st = st.add_modifier(Modifier::REVERSED);
        }
        lines.push(Line::from(vec![
            Span::styled(head, st),
            Span::styled(truncate(&phase, rest), phase_style(app, j.phase)),
        ]));
    }
    f.render_widget(Paragraph::new(lines), parts[0]);
    if let Some(r) = rows.get(sel) {
        detail(app, f, parts[1], r);
    }
}

/// The selected job: its launcher, each host's ranks, what it lost, its memory over time.
/// A job's memory over time: the sum of its GPUs' histories, reading by reading (the last `width`).
fn job_memory(hv: &crate::tui::store::HostView, gpus: &[u32], width: usize) -> Vec<(u64, u64)> {
    let per: Vec<Vec<(u64, u64)>> = gpus
        .iter()
        .filter_map(|g| hv.history.get(g))
        .map(|h| h.last(width))
        .collect();
    let n = per.iter().map(Vec::len).min().unwrap_or(0);
    (0..n)
        .map(|k| {
            let at = per[0][per[0].len() - n + k].0;
            let sum = per.iter().map(|d| d[d.len() - n + k].1).sum();
            (at, sum)
        })
        .collect()
}

fn detail(app: &App, f: &mut Frame, area: Rect, r: &JobRow) {
    let w = area.width as usize;
    let mut lines = Vec::new();
    for (h, j) in &r.members {
        let Some(hv) = app.store.hosts.get(h.0) else {
            continue;
        };
        let label = escape(&hv.label).into_owned();
        let gone = j.launcher_gone_ms.map_or_else(String::new, |t| {
            format!(
                "  (launcher {} gone at {})",
                j.launcher
                    .map_or_else(|| "?".to_string(), |p| p.to_string()),
                crate::core::format::fmt_clock(t)
            )
        });
        lines.push(Line::from(Span::styled(
            truncate(&format!("{label}: {}{gone}", j.name), w),
            Style::default().add_modifier(Modifier::BOLD),
        )));
        let width = w.saturating_sub(14).min(120);
        let hist = job_memory(hv, &j.gpus, width);
        let max = hist.iter().map(|s| s.1).max().unwrap_or(0);
        let spark = sparkline(&hist, max, width);
        lines.push(Line::from(vec![
            Span::styled("  memory     ", fg(app, Color::DarkGray)),
            Span::styled(spark, fg(app, Color::Cyan)),
        ]));
        process_lines(app, j, w, &mut lines);
    }
    let skip = lines.len().saturating_sub(area.height as usize);
    f.render_widget(
        Paragraph::new(lines.into_iter().skip(skip).collect::<Vec<_>>()),
        area,
    );
}

/// A process line's first columns: what it is to the job, its PID, its GPUs and what they charge it.
fn columns(what: &str, pid: u32, gpus: &[u32], bytes: Option<u64>) -> String {
    let pad = 11usize.saturating_sub(what.len());
    format!(
        "  {what} {pid:>pad$}  GPU {:<6} {:>10}  ",
        fmt_gpus(gpus),
        fmt_bytes(bytes)
    )
}

/// A job's ranks (a straggler marked), its helpers, and the ranks it lost, one line each.
fn process_lines(
    app: &App,
    j: &crate::core::job::JobReport,
    w: usize,
    lines: &mut Vec<Line<'static>>,
) {
    let mut line = |text: String, style: Style| {
        lines.push(Line::from(Span::styled(truncate(&text, w), style)));
    };
    for k in &j.ranks {
        let (mark, st) = if k.straggler {
            ("  straggler: behind its peers", fg(app, Color::Yellow))
        } else {
            ("", Style::default())
        };
        line(
            format!(
                "{}{}{mark}",
                columns("rank", k.pid, &k.gpus, k.bytes),
                k.state
            ),
            st,
        );
    }
    for k in &j.helpers {
        line(
            format!("{}{}", columns("helper", k.pid, &k.gpus, k.bytes), k.state),
            fg(app, Color::DarkGray),
        );
    }
    for l in &j.lost {
        line(
            format!(
                "{}{} at {}",
                columns("lost", l.pid, &l.gpus, l.bytes),
                l.how.describe(),
                crate::core::format::fmt_clock(l.at_ms)
            ),
            fg(app, Color::Red),
        );
    }
}
