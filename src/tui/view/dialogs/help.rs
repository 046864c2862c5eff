//! The key help: the main screen's commands with the keys bound to them (kills, sweeps and removals left
//! out where they are off), and what the marks and cells mean.

// Row counts are bounded by the screen.
#![allow(clippy::cast_possible_truncation)]

use ratatui::Frame;
use ratatui::style::Color;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Wrap};

use super::super::fg;
use super::centered;
use crate::tui::app::App;
use crate::tui::keymap::{Cmd, Layer};

pub fn render(app: &App, f: &mut Frame) {
    let shown: Vec<_> = Cmd::ALL
        .iter()
        .filter(|(c, layer, ..)| {
            *layer == Layer::Main
                && !(app.cfg.readonly && matches!(c, Cmd::Kill | Cmd::Sweep | Cmd::RemoveShm))
        })
        .collect();
    let r = centered(f.area(), 64, (shown.len() as u16 + 9).min(f.area().height));
    let mut lines: Vec<Line> = shown
        .iter()
        .map(|(c, _, _, what)| {
            Line::from(format!(
                " {:<12} {what}",
                app.cfg.keymap.keys_in(Layer::Main, *c)
            ))
        })
        .collect();
    lines.push(Line::from(" C-c          quit (always)"));
    lines.push(Line::default());
    lines.push(Line::from(
        " marks: ghost = dead PID still charged; hidden = holds a GPU,",
    ));
    lines.push(Line::from(
        " not listed; orphan = launcher gone; zombie = parent must reap.",
    ));
    lines.push(Line::from(
        " GPU cells: · clean  ▁…█ in use (fill)  ! leak  ? N/A",
    ));
    lines.push(Line::from(Span::styled(
        " any key closes",
        fg(app, Color::DarkGray),
    )));
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().title(" Keys ")),
        r,
    );
}
