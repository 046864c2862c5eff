//! Kill and sweep confirmations (exactly whom, with what), and the key help.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Wrap};

use super::{fg, truncate};
use crate::analyze::plan::plan_summary;
use crate::core::format::{escape, fmt_bytes, fmt_gpus};
use crate::core::signal::Sig;
use crate::tui::app::{App, Dialog, SweepScope, TUI_GRACE};
use crate::tui::keymap::Cmd;

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

#[allow(clippy::too_many_lines, clippy::many_single_char_names)] // each dialog's lines top to bottom
pub fn render(app: &App, f: &mut Frame) {
    let Some(d) = &app.dialog else { return };
    let area = f.area();
    match d {
        Dialog::Kill {
            host,
            target,
            user,
            signal,
            note,
        } => {
            let w = area.width.min(76);
            let note_rows = note.as_ref().map_or(0, |n| {
                n.chars()
                    .count()
                    .div_ceil(w.saturating_sub(4).max(1) as usize)
                    + 1
            });
            let r = centered(area, w, 11 + note_rows as u16);
            let inner_w = w.saturating_sub(12) as usize;
            let label = app
                .hosts
                .get(host.0)
                .map(|h| h.label.clone())
                .unwrap_or_default();
            let mut lines = Vec::new();
            if let Some(n) = note {
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
                    target.pid, target.start_time
                )),
                Line::from(format!(" user    {}", user.as_deref().unwrap_or("N/A"))),
                Line::from(format!(" command {}", truncate(&target.cmdline, inner_w))),
                Line::default(),
                Line::from(vec![
                    Span::raw(" signal  "),
                    choice(
                        app,
                        &format!("TERM, KILL after {}s", TUI_GRACE.as_secs()),
                        *signal == Sig::Term,
                    ),
                    Span::raw("  "),
                    choice(app, "KILL now", *signal == Sig::Kill),
                ]),
                Line::default(),
                Line::from(Span::styled(
                    " Enter/y send   Tab switch signal   Esc cancel",
                    fg(app, Color::DarkGray),
                )),
            ]);
            confirm_box(app, f, r, lines, "Kill process", "process", true);
        }
        Dialog::Sweep {
            scope,
            host,
            gpu,
            plan,
        } => {
            let w = area.width.min(110);
            let h = (plan.items.len() as u16 + 9).min(area.height);
            let r = centered(area, w, h);
            let label = app
                .hosts
                .get(host.0)
                .map(|h| h.label.clone())
                .unwrap_or_default();
            let mut scopes = vec![Span::raw(" scope   ")];
            if let Some(g) = gpu {
                scopes.push(choice(
                    app,
                    &format!("GPU {g} of {label}"),
                    *scope == SweepScope::Gpu,
                ));
                scopes.push(Span::raw(" "));
            }
            scopes.push(choice(
                app,
                &format!("all of {label}"),
                *scope == SweepScope::Host,
            ));
            scopes.push(Span::raw(" "));
            scopes.push(choice(app, "everything", *scope == SweepScope::Everything));
            let mut lines = vec![Line::from(scopes), Line::default()];
            if plan.items.is_empty() {
                lines.push(Line::from(
                    " nothing to signal: no live holder or listed process in this scope",
                ));
            } else {
                lines.push(Line::from(Span::styled(
                    format!(
                        " {:<10} {:>7} {:<8} {:<6} {:>10}  COMMAND",
                        "HOST", "PID", "USER", "GPUS", "GPU MEM"
                    ),
                    Style::default().add_modifier(Modifier::BOLD),
                )));
                let cmd_w = w.saturating_sub(52) as usize;
                for i in &plan.items {
                    lines.push(Line::from(format!(
                        " {:<10} {:>7} {:<8} {:<6} {:>10}  {}",
                        truncate(&i.host, 10),
                        i.pid,
                        truncate(i.user.as_deref().unwrap_or("N/A"), 8),
                        fmt_gpus(&i.gpus),
                        fmt_bytes(i.bytes),
                        truncate(&i.cmdline, cmd_w)
                    )));
                }
            }
            lines.push(Line::default());
            lines.push(Line::from(format!(
                " {} — TERM, then KILL after {}s; then re-watch until clean",
                plan_summary(plan),
                TUI_GRACE.as_secs()
            )));
            lines.push(Line::from(Span::styled(
                " Enter/y sweep   Tab change scope   Esc cancel",
                fg(app, Color::DarkGray),
            )));
            confirm_box(app, f, r, lines, "Sweep", "process", false);
        }
        Dialog::Finding { host, finding } => super::details::render(app, f, *host, finding),
        Dialog::Remove { host, files } => {
            let w = area.width.min(100);
            let h = (files.len() as u16 + 8).min(area.height);
            let r = centered(area, w, h);
            let label = app
                .hosts
                .get(host.0)
                .map(|h| h.label.clone())
                .unwrap_or_default();
            let mut lines = vec![
                Line::from(format!(
                    " Remove {} file(s) from /dev/shm on {label}: no live process has them open or mapped.",
                    files.len()
                )),
                Line::default(),
            ];
            for file in files {
                lines.push(Line::from(format!(
                    " {:>10}  /dev/shm/{}",
                    fmt_bytes(Some(file.bytes)),
                    truncate(&escape(&file.name), w.saturating_sub(26) as usize)
                )));
            }
            lines.push(Line::default());
            lines.push(Line::from(
                " Each is re-checked first (same inode, still unused, a plain file) and logged.",
            ));
            lines.push(Line::from(Span::styled(
                " Enter/y remove   Esc cancel",
                fg(app, Color::DarkGray),
            )));
            confirm_box(app, f, r, lines, "Remove /dev/shm leftovers", "file", false);
        }
        Dialog::Help => {
            let shown: Vec<_> = Cmd::ALL
                .iter()
                .filter(|(c, _, _)| {
                    !(app.cfg.readonly && matches!(c, Cmd::Kill | Cmd::Sweep | Cmd::RemoveShm))
                })
                .collect();
            let r = centered(area, 64, (shown.len() as u16 + 9).min(area.height));
            let mut lines: Vec<Line> = shown
                .iter()
                .map(|(c, _, what)| {
                    Line::from(format!(" {:<12} {what}", app.cfg.keymap.keys_for(*c)))
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
    }
}
