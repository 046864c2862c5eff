//! The kill confirmation: the host, the process as it was chosen (re-checked before sending), its user and
//! command, and the signal.

// Widths are bounded by the screen.
#![allow(clippy::cast_possible_truncation)]

use ratatui::Frame;
use ratatui::style::Color;
use ratatui::text::{Line, Span};

use super::super::{fg, truncate};
use super::{centered, choice, confirm_box, hint};
use crate::core::signal::Sig;
use crate::tui::app::{App, TUI_GRACE};
use crate::tui::keymap::Cmd;
use crate::tui::modes::kill::Kill;

pub fn render(app: &App, f: &mut Frame, d: &Kill) {
    let area = f.area();
    let w = area.width.min(76);
    let note_rows = d.note.as_ref().map_or(0, |n| {
        n.chars()
            .count()
            .div_ceil(w.saturating_sub(4).max(1) as usize)
            + 1
    });
    let r = centered(area, w, 11 + note_rows as u16);
    let inner_w = w.saturating_sub(12) as usize;
    let label = app.label(d.host);
    let mut lines = Vec::new();
    if let Some(n) = &d.note {
        lines.push(Line::from(Span::styled(
            format!(" {n}"),
            fg(app, Color::Yellow),
        )));
        lines.push(Line::default());
    }
    lines.extend([
        Line::from(format!(" host    {label}")),
        Line::from(format!(
            " pid     {}  (start time {} — re-checked before sending)",
            d.target.pid, d.target.start_time
        )),
        Line::from(format!(" user    {}", d.user.as_deref().unwrap_or("N/A"))),
        Line::from(format!(" command {}", truncate(&d.target.cmdline, inner_w))),
        Line::default(),
        Line::from(vec![
            Span::raw(" signal  "),
            choice(
                app,
                &format!("TERM, KILL after {}s", TUI_GRACE.as_secs()),
                d.signal == Sig::Term,
            ),
            Span::raw("  "),
            choice(app, "KILL now", d.signal == Sig::Kill),
        ]),
        Line::default(),
        hint(
            app,
            &[
                (Cmd::Confirm, "send"),
                (Cmd::NextChoice, "switch signal"),
                (Cmd::Cancel, "cancel"),
            ],
        ),
    ]);
    confirm_box(app, f, r, lines, "Kill process", "process", true);
}
