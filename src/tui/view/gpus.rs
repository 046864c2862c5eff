//! The selected host's GPUs: memory bar, utilization, temperature, power, state, and a memory history
//! sparkline so a warm-up ramp or a slow leak can be seen rather than read.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Modifier};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Row, Table, TableState};

use super::{bar, fg, panel, selected, sparkline, state_style, truncate};
use crate::core::format::{fmt_bytes, fmt_opt};
use crate::core::model::{Gpu, GpuState, MIB};
use crate::tui::app::{App, HostView, Panel};

/// The columns: (header, width); some only where the panel is wide.
fn columns(wide: bool, name_w: u16, bar_w: u16) -> (Vec<&'static str>, Vec<Constraint>) {
    let mut cols = vec![
        ("#", 2),
        ("NAME", name_w),
        ("MEMORY USED / TOTAL", bar_w + 21),
    ];
    if wide {
        cols.extend([
            ("RESERVED", 8),
            ("UTIL", 5),
            ("TEMP", 5),
            ("POWER", 6),
            ("CC", 4),
        ]);
    } else {
        cols.extend([("UTIL", 4), ("TEMP", 4)]);
    }
    cols.extend([("PR", 3), ("STATE", 8)]);
    let (mut header, mut widths): (Vec<_>, Vec<_>) = cols
        .into_iter()
        .map(|(h, w)| (h, Constraint::Length(w)))
        .unzip();
    header.push("HISTORY");
    widths.push(Constraint::Min(4));
    (header, widths)
}

/// What the panel says where there is no GPU table: the host down, silent, not read yet, or GPU-less.
fn no_table(app: &App, h: &HostView) -> Option<String> {
    let Some(s) = h.snap.as_ref().filter(|s| s.error.is_none()) else {
        return Some(match (&h.snap, &h.status) {
            (Some(s), _) => s.error.clone().unwrap_or_default(),
            (None, crate::core::conn::ConnStatus::Down(e)) => {
                format!("down: {e} — retrying (r retries now)")
            }
            (None, _) if app.silent_too_long(h) => format!(
                "no reading within {}s (--connect-timeout); still trying (r retries now)",
                app.cfg.connect_timeout.as_secs()
            ),
            (None, _) => "waiting for the first reading…".into(),
        });
    };
    s.gpus.is_empty().then(|| {
        format!(
            "{} — holders, zombies and /dev/shm are still watched",
            s.gpu_error.as_deref().unwrap_or("no GPUs on this host")
        )
    })
}

/// One GPU's row.
fn row<'a>(
    app: &App,
    h: &HostView,
    (k, g): (usize, &Gpu),
    wide: bool,
    widths: (u16, u16, usize),
) -> Row<'a> {
    let (name_w, bar_w, spark_w) = widths;
    let st = g.state.unwrap_or(GpuState::Unknown);
    let (utilization, temperature_c, power_mw) = h.gauges_of(k, g);
    let na = || "N/A".to_string();
    let mem = format!(
        "{} {:>9}/{:<9}",
        bar(g.memory.used, g.memory.total, bar_w as usize - 1),
        fmt_bytes(g.memory.used),
        fmt_bytes(g.memory.total)
    );
    let name = g
        .name
        .as_deref()
        .unwrap_or("N/A")
        .trim_start_matches("NVIDIA ");
    let mut cells = vec![
        Cell::from(g.index.to_string()),
        Cell::from(truncate(name, name_w as usize)),
        Cell::from(mem).style(state_style(app, st)),
    ];
    if wide {
        cells.push(Cell::from(fmt_bytes(g.memory.reserved)));
    }
    cells.push(Cell::from(utilization.map_or_else(na, |u| format!("{u}%"))));
    cells.push(Cell::from(
        temperature_c.map_or_else(na, |t| format!("{t}C")),
    ));
    if wide {
        cells.push(Cell::from(
            power_mw.map_or_else(na, |p| format!("{}W", p / 1000)),
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
        sparkline(
            &h.history
                .get(&g.index)
                .map(|x| x.last(spark_w))
                .unwrap_or_default(),
            max,
            spark_w,
        ),
        fg(app, Color::Cyan),
    ))));
    Row::new(cells)
}

/// A MIG instance's row, under its GPU: its profile, memory and state (the GPU's gauges are the GPU's).
fn instance_row<'a>(
    app: &App,
    i: &crate::core::model::MigInstance,
    wide: bool,
    widths: (u16, u16),
) -> Row<'a> {
    let (name_w, bar_w) = widths;
    let st = i.state.unwrap_or(GpuState::Unknown);
    let mem = format!(
        "{} {:>9}/{:<9}",
        bar(i.memory.used, i.memory.total, bar_w as usize - 1),
        fmt_bytes(i.memory.used),
        fmt_bytes(i.memory.total)
    );
    let mut cells = vec![
        Cell::from(""),
        Cell::from(truncate(&format!("└ {}", i.label()), name_w as usize)),
        Cell::from(mem).style(state_style(app, st)),
    ];
    // Reserved, utilization, temperature, power and CC (or utilization and temperature): the GPU's.
    let blanks = if wide { 5 } else { 2 };
    cells.extend((0..blanks).map(|_| Cell::from("")));
    cells.push(Cell::from(i.processes.len().to_string()));
    let state_txt = match &i.error {
        Some(_) => "✗ error".to_string(),
        None => format!("{} {}", st.glyph(), st.word()),
    };
    cells.push(Cell::from(state_txt).style(state_style(app, st)));
    cells.push(Cell::from(""));
    Row::new(cells)
}

pub fn render(app: &App, f: &mut Frame, area: Rect, compact: bool) {
    let Some(h) = app.host() else { return };
    let focused = app.view.sel.focus == Panel::Gpus;
    let drv = h
        .snap
        .as_ref()
        .and_then(|s| s.driver_version.as_deref())
        .map(|d| format!(", driver {d}"))
        .unwrap_or_default();
    let block = panel(app, &format!("GPUs on {}{drv}", h.label), focused, compact);
    if let Some(msg) = no_table(app, h) {
        f.render_widget(ratatui::widgets::Paragraph::new(msg).block(block), area);
        return;
    }
    let Some(s) = h.snap.as_ref() else { return };
    let wide = area.width >= 120;
    let name_w: u16 = if wide { 24 } else { 11 };
    let bar_w = if wide { 12 } else { 6 };
    let (header, widths) = columns(wide, name_w, bar_w);
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
    // Each GPU's row, its MIG instances' rows under it; the selection moves over GPUs alone.
    let mut rows: Vec<Row> = Vec::new();
    let mut chosen = None;
    for (i, g) in s.gpus.iter().enumerate() {
        let r = row(app, h, (i, g), wide, (name_w, bar_w, spark_w));
        if focused && i == app.view.sel.gpu {
            chosen = Some(rows.len());
            rows.push(r.style(selected(app)));
        } else {
            rows.push(r);
        }
        rows.extend(
            g.mig
                .iter()
                .map(|m| instance_row(app, m, wide, (name_w, bar_w))),
        );
    }
    let table = Table::new(rows, widths)
        .header(Row::new(header).style(fg(app, Color::Gray).add_modifier(Modifier::BOLD)))
        .block(block);
    let mut state = TableState::default().with_selected(chosen);
    f.render_stateful_widget(table, area, &mut state);
}
