//! Holders, listed processes, ghosts and zombies of the selected host; marks are words as well as colours.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::widgets::{Cell, Row, Table, TableState};

use super::{fg, panel, selected, truncate};
use crate::core::format::fmt_secs;
use crate::core::format::{fmt_bytes, fmt_gpus};
use crate::core::model::Mark;
use crate::tui::app::{App, Panel};
use crate::tui::rows::ProcRow;

fn mark_style(app: &App, marks: &[Mark]) -> Style {
    if marks
        .iter()
        .any(|m| matches!(m, Mark::Ghost | Mark::Hidden))
    {
        fg(app, Color::Red).add_modifier(Modifier::BOLD)
    } else if marks
        .iter()
        .any(|m| matches!(m, Mark::Orphan | Mark::Zombie))
    {
        fg(app, Color::Yellow)
    } else if marks.contains(&Mark::Benign) {
        fg(app, Color::DarkGray)
    } else {
        Style::default()
    }
}

/// The columns: (header, width); user, parent, age and job only where the panel is wide.
fn columns(wide: bool) -> (Vec<&'static str>, Vec<Constraint>) {
    let mut cols = vec![("PID", 7)];
    if wide {
        cols.extend([("USER", 8), ("S", 1), ("PPID", 7)]);
    } else {
        cols.push(("S", 1));
    }
    cols.extend([("GPUS", 5), ("GPU MEM", 9)]);
    if wide {
        cols.extend([("AGE", 6), ("JOB", 13)]);
    }
    cols.push(("MARK", 13));
    let (mut header, mut widths): (Vec<_>, Vec<_>) = cols
        .into_iter()
        .map(|(h, w)| (h, Constraint::Length(w)))
        .unzip();
    header.push("COMMAND");
    widths.push(Constraint::Min(10));
    (header, widths)
}

/// One process's row; ages run from the reading's time.
fn row<'a>(app: &App, r: &ProcRow, wide: bool, now_s: u64) -> Row<'a> {
    let dash = || "-".to_string();
    let state = Cell::from(r.state.map_or_else(dash, |s| s.to_string()));
    let mut cells = vec![Cell::from(r.pid.to_string())];
    if wide {
        cells.push(Cell::from(truncate(&r.user, 8)));
        cells.push(state);
        cells.push(Cell::from(r.ppid.map_or_else(dash, |p| p.to_string())));
    } else {
        cells.push(state);
    }
    // The column is 5 wide: a longer set is cut with a mark, never silently.
    cells.push(Cell::from(truncate(&fmt_gpus(&r.gpus), 5)));
    cells.push(Cell::from(if r.bytes.is_some() {
        fmt_bytes(r.bytes)
    } else {
        dash()
    }));
    if wide {
        cells.push(Cell::from(r.started_at.map_or_else(
            || "N/A".into(),
            |t| fmt_secs(now_s.saturating_sub(t)),
        )));
        cells.push(Cell::from(if r.job.is_empty() {
            dash()
        } else {
            truncate(&crate::core::format::escape(&r.job), 13)
        }));
    }
    let marks: Vec<&str> = r.marks.iter().map(|m| m.as_str()).collect();
    cells.push(Cell::from(marks.join(",")).style(mark_style(app, &r.marks)));
    let indent = if app.view.procs.tree && r.depth > 0 {
        format!("{}└ ", "  ".repeat(r.depth - 1))
    } else {
        String::new()
    };
    cells.push(Cell::from(format!("{indent}{}", r.cmd)));
    Row::new(cells)
}

pub fn render(app: &App, f: &mut Frame, area: Rect, compact: bool) {
    let focused = app.view.sel.focus == Panel::Processes;
    let rows_data = app.process_rows();
    let procs = &app.view.procs;
    let mut title = format!("Processes ({}) sort:{}", rows_data.len(), procs.sort.name());
    if procs.tree {
        title.push_str(" tree");
    }
    if !procs.filter.is_empty() {
        title.push_str(&format!(" filter:{}", procs.filter));
    }
    let block = panel(app, &title, focused, compact);
    let wide = area.width >= 90;
    // The host's last reading's time (a reading that said the same is one too).
    let now_s = app
        .host()
        .and_then(|h| h.last_seen_ms)
        .map_or(app.view.now_ms / 1000, |t| t / 1000);
    let (header, widths) = columns(wide);
    let rows: Vec<Row> = rows_data
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let row = row(app, r, wide, now_s);
            if focused && i == app.view.sel.proc {
                row.style(selected(app))
            } else {
                row
            }
        })
        .collect();
    let table = Table::new(rows, widths)
        .header(Row::new(header).style(fg(app, Color::Gray).add_modifier(Modifier::BOLD)))
        .block(block);
    let mut state = TableState::default().with_selected(focused.then_some(app.view.sel.proc));
    f.render_stateful_widget(table, area, &mut state);
}
