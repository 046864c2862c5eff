//! Memory over time for the selected host, one line per GPU (only the selected GPU while the GPU panel has
//! the focus): the last minutes of readings on a time axis, so a warm-up ramp, a slow leak or the drop after
//! a sweep is seen at a glance.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Style};
use ratatui::symbols::Marker;
use ratatui::text::Line;
use ratatui::widgets::{Axis, Chart, Dataset, GraphType, LegendPosition, Paragraph};

use super::{fg, panel};
use crate::core::model::MIB;
use crate::tui::app::{App, HostView, Panel};

/// The longest window shown, seconds.
pub const WINDOW_S: u64 = 300;

const COLORS: [Color; 8] = [
    Color::Cyan,
    Color::Yellow,
    Color::Green,
    Color::Magenta,
    Color::LightRed,
    Color::LightBlue,
    Color::White,
    Color::LightGreen,
];

fn gib(mib: f64) -> String {
    format!("{:.0} GiB", mib / 1024.0)
}

/// Each GPU's (seconds before now, MiB) points within the window, and the window in seconds.
type Series = Vec<(u32, Vec<(f64, f64)>)>;

fn series(h: &HostView, indices: &[u32], now: u64) -> (Series, u64) {
    let oldest = indices
        .iter()
        .filter_map(|g| h.history.get(g)?.front().map(|s| s.0))
        .min()
        .unwrap_or(now);
    // The window grows with the history, from one minute up to WINDOW_S.
    let span_s = (now.saturating_sub(oldest) / 1000).clamp(60, WINDOW_S);
    let series = indices
        .iter()
        .filter_map(|g| {
            let pts = h
                .history
                .get(g)?
                .iter()
                .filter(|(t, _)| now.saturating_sub(*t) <= span_s * 1000)
                .map(|(t, mib)| (-((now.saturating_sub(t)) as f64) / 1000.0, mib as f64))
                .collect();
            Some((*g, pts))
        })
        .collect();
    (series, span_s)
}

/// The memory axis' top: the largest GPU's total, else the highest point.
fn top_mib(app: &App, series: &Series) -> f64 {
    app.snap()
        .and_then(|s| s.gpus.iter().filter_map(|g| g.memory.total).max())
        .map_or_else(
            || {
                series
                    .iter()
                    .flat_map(|(_, p)| p.iter().map(|x| x.1))
                    .fold(1.0, f64::max)
            },
            |t| (t / MIB) as f64,
        )
}

/// Series, scale, axes: one chart.
pub fn render(app: &App, f: &mut Frame, area: Rect) {
    let Some(h) = app.host() else { return };
    let only = (app.view.sel.focus == Panel::Gpus)
        .then(|| {
            app.snap()
                .and_then(|s| s.gpus.get(app.view.sel.gpu))
                .map(|g| g.index)
        })
        .flatten();
    let title = match only {
        Some(g) => format!("Memory of GPU {g} on {} (c closes)", h.label),
        None => format!("Memory on {} (c closes)", h.label),
    };
    let block = panel(app, &title, false, false);
    let mut indices: Vec<u32> = h
        .history
        .keys()
        .copied()
        .filter(|g| only.is_none_or(|o| o == *g))
        .collect();
    indices.sort_unstable();
    let (series, span_s) = series(h, &indices, app.view.now_ms);
    if series.iter().all(|(_, p)| p.is_empty()) {
        f.render_widget(Paragraph::new("no memory readings yet").block(block), area);
        return;
    }
    let total_mib = top_mib(app, &series);
    let datasets: Vec<Dataset> = series
        .iter()
        .map(|(g, pts)| {
            Dataset::default()
                .name(format!("GPU {g}"))
                // Half blocks: every terminal font has them at one cell wide (braille is not everywhere).
                .marker(Marker::HalfBlock)
                .graph_type(GraphType::Line)
                .style(fg(app, COLORS[*g as usize % COLORS.len()]))
                .data(pts)
        })
        .collect();
    let span = span_s as f64;
    let x = Axis::default()
        .bounds([-span, 0.0])
        .style(Style::default())
        .labels([
            Line::from(format!("-{span_s}s")),
            Line::from(format!("-{}s", span_s / 2)),
            Line::from("now"),
        ]);
    let y = Axis::default().bounds([0.0, total_mib]).labels([
        Line::from("0"),
        Line::from(gib(total_mib / 2.0)),
        Line::from(gib(total_mib)),
    ]);
    let chart = Chart::new(datasets)
        .block(block)
        .x_axis(x)
        .y_axis(y)
        .legend_position(Some(LegendPosition::TopLeft))
        .hidden_legend_constraints((Constraint::Percentage(40), Constraint::Percentage(60)));
    f.render_widget(chart, area);
}
