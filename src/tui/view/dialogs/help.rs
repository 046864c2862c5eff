//! The key help: the main screen's commands with the keys bound to them (kills, sweeps and removals left
//! out where they are off), and what the marks and cells mean. Every line is whole on screen: the box is as
//! wide as the screen allows, and where the commands do not fit one column they take two, each line cut to
//! its column (never wrapped past the box's bottom).

// Row counts are bounded by the screen.
#![allow(clippy::cast_possible_truncation)]

use ratatui::Frame;
use ratatui::style::Color;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph};

use super::super::{fg, truncate};
use super::centered;
use crate::tui::app::App;
use crate::tui::keymap::{Cmd, Layer};

/// What the marks and cells mean, under the commands.
const LEGEND: [&str; 3] = [
    " marks: ghost = dead PID still charged; hidden = holds a GPU, not listed;",
    " orphan = launcher gone; zombie = parent must reap.",
    " GPU cells: · clean  ▁…█ in use (fill)  ! leak  ‼ needs reset  ? N/A",
];

pub fn render(app: &App, f: &mut Frame) {
    let mut entries: Vec<(String, &str)> = Cmd::ALL
        .iter()
        .filter(|(c, layer, ..)| {
            *layer == Layer::Main
                && !(app.cfg.readonly && matches!(c, Cmd::Kill | Cmd::Sweep | Cmd::RemoveShm))
        })
        .map(|(c, _, _, what)| (app.cfg.keymap.keys_in(Layer::Main, *c), *what))
        .collect();
    entries.push(("C-c".into(), "quit (always)"));
    let area = f.area();
    // Rows inside the border, less the legend, a blank line and the closing hint.
    let rows = area.height.saturating_sub(2 + LEGEND.len() as u16 + 2) as usize;
    let columns = if entries.len() <= rows.max(1) { 1 } else { 2 };
    let w = area
        .width
        .saturating_sub(2)
        .min(if columns == 1 { 80 } else { 120 });
    let per = entries.len().div_ceil(columns);
    let col_w = (w.saturating_sub(2) as usize) / columns;
    // The keys' column as wide as the widest binding: the rest is the description's.
    let key_w = entries
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0)
        .max(3);
    let cell = |(k, what): &(String, &str)| {
        truncate(&format!(" {k:<key_w$}  {what}"), col_w.saturating_sub(1))
    };
    let mut lines: Vec<Line> = (0..per)
        .map(|r| {
            let mut text = String::new();
            for c in 0..columns {
                if let Some(e) = entries.get(c * per + r) {
                    let s = cell(e);
                    let pad = col_w.saturating_sub(s.chars().count());
                    text.push_str(&s);
                    if c + 1 < columns {
                        text.push_str(&" ".repeat(pad));
                    }
                }
            }
            Line::from(text)
        })
        .collect();
    lines.push(Line::default());
    lines.extend(
        LEGEND
            .iter()
            .map(|l| Line::from(truncate(l, w.saturating_sub(2) as usize))),
    );
    lines.push(Line::from(Span::styled(
        " any key closes",
        fg(app, Color::DarkGray),
    )));
    let h = (lines.len() as u16 + 2).min(area.height);
    let r = centered(area, w, h);
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" Keys ")),
        r,
    );
}
