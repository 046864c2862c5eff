//! Shared memory: per GPU the compute capability and its limits, the GEMM tile calculator (red where a tile
//! does not fit), /dev/shm usage and leftovers, and the System V limits.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};

use super::{fg, truncate};
use crate::core::format::fmt_secs;
use crate::core::format::{fmt_bytes, fmt_opt};
use crate::core::smem::{self, group};
use crate::tui::app::App;

#[allow(clippy::too_many_lines)] // the panel's sections (limits, tile calculator, /dev/shm), top to bottom
pub fn render(app: &App, f: &mut Frame, area: Rect) {
    let [top, bottom] =
        Layout::vertical([Constraint::Percentage(60), Constraint::Percentage(40)]).areas(area);
    let form = &app.smem;
    let editing = app.smem_editing() == Some(true);
    let tile = form.tile();
    let mut lines = vec![
        Line::from(vec![
            Span::raw(" tile "),
            Span::styled(
                format!("[{}{}]", form.tile, if editing { "▏" } else { "" }),
                if editing {
                    fg(app, Color::Yellow).add_modifier(Modifier::BOLD)
                } else {
                    Style::default().add_modifier(Modifier::BOLD)
                },
            ),
            Span::raw(format!(
                "  dtype {}  stages {}",
                form.dtype().name(),
                form.stages
            )),
            Span::styled(
                "   e edit tile · d dtype · +/- stages · Esc back",
                fg(app, Color::DarkGray),
            ),
        ]),
        Line::default(),
    ];
    if let Err(e) = &tile {
        lines.push(Line::from(Span::styled(
            format!(" {e}"),
            fg(app, Color::Red),
        )));
    }
    lines.push(Line::from(Span::styled(
        format!(
            " {:<14} {:<5} {:<34} {:>9} {:>10}  {}",
            "GPUS", "CC", "FAMILY", "PER SM", "PER BLOCK", "TILE"
        ),
        Style::default().add_modifier(Modifier::BOLD),
    )));
    // One row per compute capability, naming the GPUs (of every host) that have it.
    let mut ccs: Vec<(String, Vec<String>)> = Vec::new();
    for h in &app.store.hosts {
        let Some(s) = &h.snap else { continue };
        for g in &s.gpus {
            let Some(cc) = &g.compute_capability else {
                continue;
            };
            let at = format!("{}:{}", h.label, g.index);
            match ccs.iter_mut().find(|(c, _)| c == cc) {
                Some((_, v)) => v.push(at),
                None => ccs.push((cc.clone(), vec![at])),
            }
        }
    }
    if ccs.is_empty() {
        ccs = smem::TABLE
            .iter()
            .map(|r| (r.cc.to_string(), vec!["(table)".to_string()]))
            .collect();
    }
    for (cc, at) in &ccs {
        let where_ = if at.len() > 2 {
            format!("{} +{}", at[0], at.len() - 1)
        } else {
            at.join(" ")
        };
        let Some(l) = smem::limits(cc) else {
            lines.push(Line::from(format!(
                " {:<14} {:<5} unknown compute capability",
                truncate(&where_, 14),
                cc
            )));
            continue;
        };
        let mut spans = vec![Span::raw(format!(
            " {:<14} {:<5} {:<34} {:>9} {:>10}  ",
            truncate(&where_, 14),
            cc,
            truncate(l.family, 34),
            group(u64::from(l.per_sm)),
            group(u64::from(l.per_block_optin))
        ))];
        if let Ok(t) = tile {
            let fit = smem::fit(l, t, form.dtype(), form.stages, 0);
            let style = if fit.fits {
                fg(app, Color::Green)
            } else {
                fg(app, Color::Red).add_modifier(Modifier::BOLD)
            };
            let txt = if fit.fits {
                format!(
                    "✓ fits: {} B, up to {} stages",
                    group(fit.needed),
                    fit.max_stages
                )
            } else {
                format!(
                    "✗ {} B short ({} B needed, {} stage{} fit)",
                    group(fit.short_by),
                    group(fit.needed),
                    fit.max_stages,
                    if fit.max_stages == 1 { "" } else { "s" }
                )
            };
            spans.push(Span::styled(txt, style));
        }
        lines.push(Line::from(spans));
    }
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" ▶ Shared memory per block ")),
        top,
    );

    let mut l2 = Vec::new();
    match app.snap().and_then(|s| s.shm.as_ref()) {
        Some(shm) => {
            l2.push(Line::from(format!(
                " /dev/shm {} used of {} ({} free)   SysV shmmax {}  shmall {}  shmmni {}  segments {}",
                fmt_bytes(shm.used),
                fmt_bytes(shm.total),
                fmt_bytes(shm.free),
                fmt_opt(shm.shmmax),
                fmt_opt(shm.shmall),
                fmt_opt(shm.shmmni),
                shm.sysv_segments.len()
            )));
            if shm.segments.is_empty() {
                l2.push(Line::from(Span::styled(
                    " no nccl-*, torch_*, psm_* or sem.* segments",
                    fg(app, Color::Green),
                )));
            }
            for seg in &shm.segments {
                let (who, st) = match &seg.users {
                    Some(u) if u.is_empty() => (
                        "leftover: nobody has it open or mapped".to_string(),
                        fg(app, Color::Yellow),
                    ),
                    Some(u) => (
                        format!(
                            "in use by {}",
                            u.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
                        ),
                        Style::default(),
                    ),
                    None => ("users unknown".to_string(), fg(app, Color::DarkGray)),
                };
                l2.push(Line::from(vec![
                    Span::raw(format!(
                        " {:<28} {:>9} {:>7}  ",
                        truncate(&seg.name, 28),
                        fmt_bytes(Some(seg.bytes)),
                        seg.age_s.map_or_else(|| "N/A".into(), fmt_secs)
                    )),
                    Span::styled(who, st),
                ]));
            }
        }
        None => l2.push(Line::from(" /dev/shm: N/A on this host")),
    }
    let title = format!(
        " /dev/shm on {} ",
        app.host().map_or("", |h| h.label.as_str())
    );
    f.render_widget(
        Paragraph::new(l2).block(Block::bordered().title(title)),
        bottom,
    );
}
