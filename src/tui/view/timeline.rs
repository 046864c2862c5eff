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
    let host_w = app.store.label_width(4, 16);
    let end = app
        .store
        .timeline
        .len()
        .saturating_sub(app.timeline_scroll().unwrap_or(0));
    let w = inner.width as usize;
    // Newest at the bottom; each event whole, its words carried onto lines of their own under it.
    let mut lines: Vec<Line> = Vec::new();
    for e in app.store.timeline.range(..end).rev() {
        if lines.len() >= rows {
            break;
        }
        let head = format!("{} {:<host_w$} ", clock(e.at_ms), truncate(&e.host, host_w));
        let indent = head.chars().count();
        let parts = wrap(&e.describe(), w.saturating_sub(indent).max(8));
        let mut own: Vec<Line> = Vec::with_capacity(parts.len());
        for (k, part) in parts.into_iter().enumerate() {
            let lead = if k == 0 {
                Span::styled(head.clone(), fg(app, Color::DarkGray))
            } else {
                Span::raw(" ".repeat(indent))
            };
            own.push(Line::from(vec![lead, Span::styled(part, style(app, e))]));
        }
        lines.extend(own.into_iter().rev());
    }
    lines.truncate(rows);
    lines.reverse();
    f.render_widget(Paragraph::new(lines), inner);
}

/// `text` in pieces of at most `width` characters, broken at a space where one is near.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest: Vec<char> = text.chars().collect();
    while rest.len() > width {
        let cut = rest[..width]
            .iter()
            .rposition(|c| *c == ' ')
            .filter(|&i| i > width / 2)
            .unwrap_or(width);
        out.push(
            rest[..cut]
                .iter()
                .collect::<String>()
                .trim_end()
                .to_string(),
        );
        rest.drain(..cut);
        while rest.first() == Some(&' ') {
            rest.remove(0);
        }
    }
    out.push(rest.into_iter().collect());
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_long_event_is_carried_whole_onto_lines_of_its_own() {
        let parts = super::wrap(
            "sent TERM to 7306 (sglang::scheduler_TP6) and 7391 (python3)",
            24,
        );
        assert!(parts.iter().all(|p| p.chars().count() <= 24), "{parts:?}");
        assert_eq!(
            parts.join(" "),
            "sent TERM to 7306 (sglang::scheduler_TP6) and 7391 (python3)"
        );
    }

    #[test]
    fn clock_is_utc_time_of_day() {
        assert_eq!(super::clock(1_764_669_600_000 + 3_723_456), "11:02:03.456");
    }
}
