//! The header line and the re-watch / all-zero banner.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::{fg, truncate};
use crate::core::format::{fmt_ms, fmt_secs};
use crate::tui::app::App;

/// The name, and on the simulated cluster a DEMO mark that no key or status line replaces.
fn title(app: &App) -> Span<'static> {
    if app.simulated() {
        Span::styled(
            " gpusweep DEMO ",
            fg(app, Color::White)
                .bg_if(app, Color::Magenta)
                .add_modifier(Modifier::BOLD),
        )
    } else {
        Span::styled(
            " gpusweep ",
            fg(app, Color::Black)
                .bg_if(app, Color::Cyan)
                .add_modifier(Modifier::BOLD),
        )
    }
}

pub fn render(app: &App, f: &mut Frame, area: Rect, banner: Rect) {
    let (clean, inuse, leak, unknown) = app.counts();
    let total = clean + inuse + leak + unknown;
    let sweep = match app.view.last_sweep_ms {
        Some(t) => format!(
            "last sweep {} ago",
            fmt_secs(app.view.now_ms.saturating_sub(t) / 1000)
        ),
        None => "no sweep yet".into(),
    };
    if area.width < 100 {
        let sweep = match app.view.last_sweep_ms {
            Some(t) => format!(
                "swept {} ago",
                fmt_secs(app.view.now_ms.saturating_sub(t) / 1000)
            ),
            None => "no sweep".into(),
        };
        let line = Line::from(vec![
            title(app),
            Span::raw(format!(" {}h {total} GPUs ", app.store.hosts.len())),
            Span::styled(format!("{clean}✓ "), fg(app, Color::Green)),
            Span::styled(format!("{inuse}● "), fg(app, Color::Cyan)),
            Span::styled(format!("{leak}!"), leak_style(app, leak)),
            Span::raw(if unknown > 0 {
                format!(" {unknown}?")
            } else {
                String::new()
            }),
            down_span(app, " {n}✗"),
            hung_span(app, " {n} hung"),
            Span::raw(format!(
                " │ {sweep} │ poll {}",
                fmt_ms(app.cfg.interval.as_millis() as u64)
            )),
        ]);
        f.render_widget(Paragraph::new(line), area);
    } else {
        render_wide(app, f, area, (clean, inuse, leak, unknown), &sweep);
    }
    render_banner(app, f, banner);
}

/// The count of leaking GPUs: bold red when there are any, plain at 0.
fn leak_style(app: &App, leak: usize) -> Style {
    if leak > 0 {
        fg(app, Color::Red).add_modifier(Modifier::BOLD)
    } else {
        Style::default()
    }
}

fn render_wide(
    app: &App,
    f: &mut Frame,
    area: Rect,
    (clean, inuse, leak, unknown): (usize, usize, usize, usize),
    sweep: &str,
) {
    let total = clean + inuse + leak + unknown;
    let mut spans = vec![
        title(app),
        Span::raw(format!(
            " {} host{} │ {total} GPUs: ",
            app.store.hosts.len(),
            if app.store.hosts.len() == 1 { "" } else { "s" }
        )),
        Span::styled(format!("{clean} ✓ clean"), fg(app, Color::Green)),
        Span::raw("  "),
        Span::styled(format!("{inuse} ● in use"), fg(app, Color::Cyan)),
        Span::raw("  "),
        Span::styled(format!("{leak} ! leak"), leak_style(app, leak)),
    ];
    if unknown > 0 {
        spans.push(Span::raw(format!("  {unknown} ? N/A")));
    }
    spans.push(down_span(app, "  {n} ✗ host down"));
    spans.push(hung_span(app, "  {n} job(s) hung"));
    if app.cfg.readonly {
        spans.push(Span::styled(" │ read-only", fg(app, Color::Yellow)));
    }
    spans.push(Span::raw(format!(
        " │ {sweep} │ poll {}",
        fmt_ms(app.cfg.interval.as_millis() as u64)
    )));
    f.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// Hosts without a reading now, in red; nothing when all answer. `{n}` in `fmt` is the count.
fn down_span(app: &App, fmt: &str) -> Span<'static> {
    alarm_span(app, app.down_count(), fmt)
}

/// A count that needs a look, in bold red (`{n}` in `fmt`); nothing at 0.
fn alarm_span(app: &App, n: usize, fmt: &str) -> Span<'static> {
    match n {
        0 => Span::raw(""),
        n => Span::styled(
            fmt.replace("{n}", &n.to_string()),
            fg(app, Color::Red).add_modifier(Modifier::BOLD),
        ),
    }
}

/// Jobs hung alive, in red; nothing when none. `{n}` in `fmt` is the count.
fn hung_span(app: &App, fmt: &str) -> Span<'static> {
    alarm_span(app, app.hung_count(), fmt)
}

fn render_banner(app: &App, f: &mut Frame, banner: Rect) {
    if banner.height == 0 {
        return;
    }
    let line = if let Some(rw) = &app.rewatch() {
        let elapsed = app.view.now_ms.saturating_sub(rw.watch.started_ms);
        let rem = rw.watch.remaining();
        let first = rem
            .first()
            .cloned()
            .unwrap_or_else(|| "waiting for readings".into());
        let more = if rem.len() > 1 {
            format!(" (+{} more)", rem.len() - 1)
        } else {
            String::new()
        };
        Line::from(vec![
            Span::styled(
                format!(
                    " ⟳ re-watching {} {} (Esc stops) ",
                    rw.label,
                    fmt_ms(elapsed)
                ),
                fg(app, Color::Black)
                    .bg_if(app, Color::Yellow)
                    .add_modifier(Modifier::BOLD),
            ),
            Span::raw(truncate(
                &format!(" still held: {first}{more}"),
                banner.width.saturating_sub(30) as usize,
            )),
        ])
    } else if let Some(b) = &app.view.banner {
        // Narrow: the verdict and its time before the scope's name.
        let room = banner.width.saturating_sub(2) as usize;
        let text = if b.chars().count() > room {
            b.split_once(": ")
                .map_or(b.clone(), |(_, rest)| format!("✓ {rest}"))
        } else {
            b.clone()
        };
        Line::from(vec![
            Span::styled(
                format!(" {} ", truncate(&text, room)),
                fg(app, Color::Black)
                    .bg_if(app, Color::Green)
                    .add_modifier(Modifier::BOLD),
            ),
            Span::styled("  Esc to dismiss", fg(app, Color::DarkGray)),
        ])
    } else {
        Line::default()
    };
    f.render_widget(Paragraph::new(line), banner);
}

trait BgIf {
    fn bg_if(self, app: &App, c: Color) -> Style;
}

impl BgIf for Style {
    fn bg_if(self, app: &App, c: Color) -> Style {
        if app.cfg.color {
            self.bg(c)
        } else {
            self.add_modifier(Modifier::REVERSED)
        }
    }
}
