//! The timeline: every event of the session with its time (UTC) and host, newest at the bottom.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::{fg, panel, truncate};
use crate::core::event::{Event, EventKind};
use crate::tui::app::App;

/// `HH:MM:SS.mmm` of a Unix time in milliseconds, UTC.
pub fn clock(ms: u64) -> String {
    crate::core::format::fmt_clock_ms(ms)
}

fn style(app: &App, e: &Event) -> Style {
    if e.bad() {
        return fg(app, Color::Red);
    }
    match e.what {
        EventKind::GpuClean { .. } | EventKind::AllClean { .. } => {
            fg(app, Color::Green).add_modifier(Modifier::BOLD)
        }
        EventKind::SignalSent { .. } | EventKind::SignalFate { .. } => fg(app, Color::Yellow),
        EventKind::FindingAppeared { .. } => fg(app, Color::Magenta),
        _ => Style::default(),
    }
}

pub fn render(app: &App, f: &mut Frame, area: Rect) {
    let title = format!(
        "Timeline ({} events, UTC){}  ↑↓ scroll  Esc close",
        app.store.timeline.len(),
        if app.timeline_scroll().unwrap_or(0) > 0 {
            format!(", {} newer below", app.timeline_scroll().unwrap_or(0))
        } else {
            String::new()
        }
    );
    let block = panel(app, &title, true, false);
    let inner = block.inner(area);
    f.render_widget(block, area);
    if app.store.timeline.is_empty() {
        f.render_widget(Paragraph::new("nothing has happened yet"), inner);
        return;
    }
    let rows = inner.height as usize;
    let host_w = app
        .store
        .hosts
        .iter()
        .map(|h| h.label.chars().count())
        .max()
        .unwrap_or(4)
        .clamp(4, 16);
    let end = app
        .store
        .timeline
        .len()
        .saturating_sub(app.timeline_scroll().unwrap_or(0));
    let start = end.saturating_sub(rows);
    let w = inner.width as usize;
    let lines: Vec<Line> = app
        .store
        .timeline
        .range(start..end)
        .map(|e| {
            let head = format!("{} {:<host_w$} ", clock(e.at_ms), truncate(&e.host, host_w));
            let rest = w.saturating_sub(head.chars().count());
            Line::from(vec![
                Span::styled(head, fg(app, Color::DarkGray)),
                Span::styled(truncate(&e.describe(), rest), style(app, e)),
            ])
        })
        .collect();
    f.render_widget(Paragraph::new(lines), inner);
}

#[cfg(test)]
mod tests {
    #[test]
    fn clock_is_utc_time_of_day() {
        assert_eq!(super::clock(1_764_669_600_000 + 3_723_456), "11:02:03.456");
    }
}
