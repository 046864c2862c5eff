//! Findings of the selected host, each with its explanation and the suggested action.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::{fg, panel, selected, truncate};
use crate::core::model::Severity;
use crate::tui::app::{App, Panel};

pub fn render(app: &App, f: &mut Frame, area: Rect, compact: bool) {
    let focused = app.view.sel.focus == Panel::Findings;
    let findings = app.snap().map_or(&[][..], |s| s.findings.as_slice());
    let block = panel(
        app,
        &format!("Findings ({})", findings.len()),
        focused,
        compact,
    );
    let inner = block.inner(area);
    f.render_widget(block, area);
    if findings.is_empty() {
        f.render_widget(
            Paragraph::new(Span::styled(
                "no findings: nothing leaked here",
                fg(app, Color::Green),
            )),
            inner,
        );
        return;
    }
    let w = inner.width as usize;
    // Two lines a finding (explanation, action) where there is room; one otherwise.
    let two = !compact && inner.height as usize >= findings.len().min(4) * 2;
    let per = if two { 2 } else { 1 };
    let rows = ((inner.height as usize).saturating_sub(usize::from(!two)) / per).max(1);
    let start = app.view.sel.finding.saturating_sub(rows.saturating_sub(1));
    let mut lines = Vec::new();
    for (i, fd) in findings.iter().enumerate().skip(start).take(rows) {
        let (glyph, st) = match fd.severity {
            Severity::Leak => ("!", fg(app, Color::Red).add_modifier(Modifier::BOLD)),
            Severity::Warning => ("~", fg(app, Color::Yellow)),
            Severity::Info => ("i", fg(app, Color::Blue)),
        };
        let sel = focused && i == app.view.sel.finding;
        let head = format!("{glyph} {:<13} ", fd.kind.as_str());
        let mut l1 = Line::from(vec![
            Span::styled(head, st),
            Span::raw(truncate(&fd.detail, w.saturating_sub(16))),
        ]);
        if sel {
            l1 = l1.style(selected(app));
        }
        lines.push(l1);
        // The selected finding always shows its action, even where each finding gets one line.
        if two || sel {
            lines.push(Line::from(Span::styled(
                format!("    → {}", truncate(&fd.action, w.saturating_sub(6))),
                Style::default().add_modifier(Modifier::ITALIC),
            )));
        }
    }
    f.render_widget(Paragraph::new(lines), inner);
}
