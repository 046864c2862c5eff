//! The selected host's GPUs: memory bar, utilization, temperature, power, state, and a memory history
//! sparkline so a warm-up ramp or a slow leak can be seen rather than read.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Modifier};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Row, Table, TableState};

use super::{bar, fg, panel, selected, sparkline, state_style, truncate};
use crate::core::format::{fmt_bytes, fmt_opt};
use crate::core::model::{GpuState, MIB};
use crate::tui::app::{App, Panel};

#[allow(clippy::too_many_lines)] // the table's columns, top to bottom
pub fn render(app: &App, f: &mut Frame, area: Rect, compact: bool) {
    let Some(h) = app.host() else { return };
    let focused = app.view.sel.focus == Panel::Gpus;
    let title = match &h.snap {
        Some(s) => {
            let drv = s
                .driver_version
                .as_deref()
                .map(|d| format!(", driver {d}"))
                .unwrap_or_default();
            format!("GPUs on {}{drv}", h.label)
        }
        None => format!("GPUs on {}", h.label),
    };
    let block = panel(app, &title, focused, compact);
    let Some(s) = h.snap.as_ref().filter(|s| s.error.is_none()) else {
        let msg = match (&h.snap, &h.status) {
            (Some(s), _) => s.error.clone().unwrap_or_default(),
            (None, crate::source::ConnStatus::Down(e)) => {
                format!("down: {e} — retrying (r retries now)")
            }
            (None, _) if app.silent_too_long(h) => format!(
                "no reading within {}s (--connect-timeout); still trying (r retries now)",
                app.cfg.connect_timeout.as_secs()
            ),
            (None, _) => "waiting for the first reading…".into(),
        };
        f.render_widget(ratatui::widgets::Paragraph::new(msg).block(block), area);
        return;
    };
    if s.gpus.is_empty() {
        let msg = format!(
            "{} — holders, zombies and /dev/shm are still watched",
            s.gpu_error.as_deref().unwrap_or("no GPUs on this host")
        );
        f.render_widget(ratatui::widgets::Paragraph::new(msg).block(block), area);
        return;
    }
    let wide = area.width >= 120;
    let name_w: u16 = if wide { 24 } else { 11 };
    let bar_w = if wide { 12 } else { 6 };
    let mut widths = vec![
        Constraint::Length(2),
        Constraint::Length(name_w),
        Constraint::Length(bar_w + 21),
    ];
    let mut header = vec!["#", "NAME", "MEMORY USED / TOTAL"];
    if wide {
        widths.extend([
            Constraint::Length(8),
            Constraint::Length(5),
            Constraint::Length(5),
            Constraint::Length(6),
            Constraint::Length(4),
        ]);
        header.extend(["RESERVED", "UTIL", "TEMP", "POWER", "CC"]);
    } else {
        widths.extend([Constraint::Length(4), Constraint::Length(4)]);
        header.extend(["UTIL", "TEMP"]);
    }
    widths.extend([
        Constraint::Length(3),
        Constraint::Length(8),
        Constraint::Min(4),
    ]);
    header.extend(["PR", "STATE", "HISTORY"]);
    let fixed: u16 = widths
        .iter()
        .map(|c| {
            if let Constraint::Length(n) = c {
                n + 1
            } else {
                0
            }
        })
        .sum();
    let spark_w = area.width.saturating_sub(fixed + 2) as usize;
    let rows: Vec<Row> = s
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let st = g.state.unwrap_or(GpuState::Unknown);
            let mem = format!(
                "{} {:>9}/{:<9}",
                bar(g.memory.used, g.memory.total, bar_w as usize - 1),
                fmt_bytes(g.memory.used),
                fmt_bytes(g.memory.total)
            );
            let mut cells = vec![
                Cell::from(g.index.to_string()),
                Cell::from(truncate(
                    g.name
                        .as_deref()
                        .unwrap_or("N/A")
                        .trim_start_matches("NVIDIA "),
                    name_w as usize,
                )),
                Cell::from(mem).style(state_style(app, st)),
            ];
            if wide {
                cells.push(Cell::from(fmt_bytes(g.memory.reserved)));
            }
            cells.push(Cell::from(
                g.utilization
                    .map_or_else(|| "N/A".into(), |u| format!("{u}%")),
            ));
            cells.push(Cell::from(
                g.temperature_c
                    .map_or_else(|| "N/A".into(), |t| format!("{t}C")),
            ));
            if wide {
                cells.push(Cell::from(
                    g.power_mw
                        .map_or_else(|| "N/A".into(), |p| format!("{}W", p / 1000)),
                ));
                cells.push(Cell::from(fmt_opt(g.compute_capability.as_ref())));
            }
            cells.push(Cell::from(g.processes.len().to_string()));
            let state_txt = match &g.error {
                Some(_) => "✗ error".to_string(),
                None => format!("{} {}", st.glyph(), st.word()),
            };
            cells.push(Cell::from(state_txt).style(state_style(app, st)));
            let max = g.memory.total.unwrap_or(0) / MIB;
            cells.push(Cell::from(Line::from(Span::styled(
                sparkline(h.history.get(&g.index), max, spark_w),
                fg(app, Color::Cyan),
            ))));
            let mut row = Row::new(cells);
            if focused && i == app.view.sel.gpu {
                row = row.style(selected(app));
            }
            row
        })
        .collect();
    let table = Table::new(rows, widths)
        .header(Row::new(header).style(fg(app, Color::Gray).add_modifier(Modifier::BOLD)))
        .block(block);
    let mut state = TableState::default().with_selected(focused.then_some(app.view.sel.gpu));
    f.render_stateful_widget(table, area, &mut state);
}
