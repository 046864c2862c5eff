//! The dialogs on top of the screen, one file each: kill and sweep confirmations (exactly whom, with what),
//! the removal of /dev/shm leftovers, a finding opened whole, and the key help. What each key does is
//! said from the keymap, so rebound keys are shown as bound.

mod finding;
mod help;
mod kill;
mod remove;
mod sweep;

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Wrap};

use super::fg;
use crate::tui::app::{App, Dialog};
use crate::tui::keymap::{Cmd, Layer};

pub fn render(app: &App, f: &mut Frame) {
    match app.dialog() {
        Some(Dialog::Kill(d)) => kill::render(app, f, d),
        Some(Dialog::Sweep(d)) => sweep::render(app, f, d),
        Some(Dialog::Finding { host, finding }) => finding::render(app, f, *host, finding),
        Some(Dialog::Remove { host, files }) => remove::render(app, f, *host, files),
        Some(Dialog::Help) => help::render(app, f),
        None => {}
    }
}

fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let w = w.min(area.width);
    let h = h.min(area.height);
    Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    }
}

/// A confirmation box in red; on the demo its title says nothing real is touched. Tables are cut at the
/// edge, prose (`wrap`) is wrapped.
fn confirm_box(
    app: &App,
    f: &mut Frame,
    r: Rect,
    lines: Vec<Line<'_>>,
    title: &str,
    thing: &str,
    wrap: bool,
) {
    let title = if app.simulated() {
        format!(" {title} (DEMO: simulated, no real {thing}) ")
    } else {
        format!(" {title} ")
    };
    let mut p = Paragraph::new(lines);
    if wrap {
        p = p.wrap(Wrap { trim: false });
    }
    f.render_widget(Clear, r);
    f.render_widget(
        p.block(
            Block::bordered()
                .title(title)
                .border_style(fg(app, Color::Red)),
        ),
        r,
    );
}

fn choice(app: &App, label: &str, on: bool) -> Span<'static> {
    if on {
        Span::styled(
            format!("[{label}]"),
            fg(app, Color::Yellow).add_modifier(Modifier::BOLD | Modifier::REVERSED),
        )
    } else {
        Span::raw(format!(" {label} "))
    }
}

/// The hint line of a dialog: each of its commands with the keys bound to it.
fn hint(app: &App, items: &[(Cmd, &str)]) -> Line<'static> {
    let text: Vec<String> = items
        .iter()
        .map(|(c, what)| format!("{} {what}", app.cfg.keymap.keys_in(Layer::Dialog, *c)))
        .collect();
    Line::from(Span::styled(
        format!(" {}", text.join("   ")),
        fg(app, Color::DarkGray),
    ))
}
