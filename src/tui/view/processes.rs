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

#[allow(clippy::too_many_lines)] // the table's columns, top to bottom
pub fn render(app: &App, f: &mut Frame, area: Rect, compact: bool) {
    let focused = app.view.sel.focus == Panel::Processes;
    let rows_data = app.process_rows();
    let mut title = format!(
        "Processes ({}) sort:{}",
        rows_data.len(),
        app.view.procs.sort.name()
    );
    if app.view.procs.tree {
        title.push_str(" tree");
    }
    if !app.view.procs.filter.is_empty() {
        title.push_str(&format!(" filter:{}", app.view.procs.filter));
    }
    let block = panel(app, &title, focused, compact);
    let wide = area.width >= 90;
    let now_s = app
        .snap()
        .map_or(app.view.now_ms / 1000, |s| s.taken_at_ms / 1000);
    let mut widths = vec![Constraint::Length(7)];
    let mut header = vec!["PID"];
    if wide {
        widths.extend([
            Constraint::Length(8),
            Constraint::Length(1),
            Constraint::Length(7),
        ]);
        header.extend(["USER", "S", "PPID"]);
    } else {
        widths.push(Constraint::Length(1));
        header.push("S");
    }
    widths.extend([Constraint::Length(5), Constraint::Length(9)]);
    header.extend(["GPUS", "GPU MEM"]);
    if wide {
        widths.extend([Constraint::Length(6), Constraint::Length(13)]);
        header.extend(["AGE", "JOB"]);
    }
    widths.extend([Constraint::Length(13), Constraint::Min(10)]);
    header.extend(["MARK", "COMMAND"]);
    let rows: Vec<Row> = rows_data
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut cells = vec![Cell::from(r.pid.to_string())];
            if wide {
                cells.push(Cell::from(truncate(&r.user, 8)));
                cells.push(Cell::from(
                    r.state.map_or_else(|| "-".to_string(), |s| s.to_string()),
                ));
                cells.push(Cell::from(
                    r.ppid.map_or_else(|| "-".into(), |p| p.to_string()),
                ));
            } else {
                cells.push(Cell::from(
                    r.state.map_or_else(|| "-".to_string(), |s| s.to_string()),
                ));
            }
            // The column is 5 wide: a longer set is cut with a mark, never silently.
            cells.push(Cell::from(truncate(&fmt_gpus(&r.gpus), 5)));
            cells.push(Cell::from(if r.bytes.is_some() {
                fmt_bytes(r.bytes)
            } else {
                "-".into()
            }));
            if wide {
                cells.push(Cell::from(r.started_at.map_or_else(
                    || "N/A".into(),
                    |t| fmt_secs(now_s.saturating_sub(t)),
                )));
                cells.push(Cell::from(if r.job.is_empty() {
                    "-".to_string()
                } else {
                    truncate(&crate::core::format::escape(&r.job), 13)
                }));
            }
            cells.push(
                Cell::from(
                    r.marks
                        .iter()
                        .map(|m| m.as_str())
                        .collect::<Vec<_>>()
                        .join(","),
                )
                .style(mark_style(app, &r.marks)),
            );
            let indent = if app.view.procs.tree && r.depth > 0 {
                format!("{}└ ", "  ".repeat(r.depth - 1))
            } else {
                String::new()
            };
            cells.push(Cell::from(format!("{indent}{}", r.cmd)));
            let mut row = Row::new(cells);
            if focused && i == app.view.sel.proc {
                row = row.style(selected(app));
            }
            row
        })
        .collect();
    let table = Table::new(rows, widths)
        .header(Row::new(header).style(fg(app, Color::Gray).add_modifier(Modifier::BOLD)))
        .block(block);
    let mut state = TableState::default().with_selected(focused.then_some(app.view.sel.proc));
    f.render_stateful_widget(table, area, &mut state);
}
