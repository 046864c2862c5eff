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
use crate::core::smem::{self, Tile, group};
use crate::tui::app::App;
use crate::tui::keymap::{Cmd, Layer};

/// The tile calculator's inputs, with the keys that change them (from the keymap).
fn form_line(app: &App) -> Line<'static> {
    let form = &app.smem;
    let editing = app.smem_editing() == Some(true);
    let keys = |c| app.cfg.keymap.keys_in(Layer::Smem, c);
    let hint = format!(
        "   {} edit tile · {} dtype · {}/{} stages · {} back",
        keys(Cmd::EditTile),
        keys(Cmd::NextDtype),
        keys(Cmd::MoreStages),
        keys(Cmd::FewerStages),
        app.cfg.keymap.keys_in(Layer::Main, Cmd::Back),
    );
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
        Span::styled(hint, fg(app, Color::DarkGray)),
    ])
}

/// One row per compute capability, naming the GPUs (of every host) that have it; the table's when none
/// was read.
fn capabilities(app: &App) -> Vec<(String, Vec<String>)> {
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
    ccs
}

/// One capability's limits, and whether the tile fits them.
fn cc_line(app: &App, cc: &str, at: &[String], tile: Option<Tile>) -> Line<'static> {
    let where_ = if at.len() > 2 {
        format!("{} +{}", at[0], at.len() - 1)
    } else {
        at.join(" ")
    };
    let Some(l) = smem::limits(cc) else {
        return Line::from(format!(
            " {:<14} {:<5} unknown compute capability",
            truncate(&where_, 14),
            cc
        ));
    };
    let mut spans = vec![Span::raw(format!(
        " {:<14} {:<5} {:<34} {:>9} {:>10}  ",
        truncate(&where_, 14),
        cc,
        truncate(l.family, 34),
        group(u64::from(l.per_sm)),
        group(u64::from(l.per_block_optin))
    ))];
    if let Some(t) = tile {
        let form = &app.smem;
        let fit = smem::fit(l, t, form.dtype(), form.stages, 0);
        let (txt, style) = if fit.fits {
            (
                format!(
                    "✓ fits: {} B, up to {} stages",
                    group(fit.needed),
                    fit.max_stages
                ),
                fg(app, Color::Green),
            )
        } else {
            (
                format!(
                    "✗ {} B short ({} B needed, {} stage{} fit)",
                    group(fit.short_by),
                    group(fit.needed),
                    fit.max_stages,
                    if fit.max_stages == 1 { "" } else { "s" }
                ),
                fg(app, Color::Red).add_modifier(Modifier::BOLD),
            )
        };
        spans.push(Span::styled(txt, style));
    }
    Line::from(spans)
}

/// The selected host's /dev/shm: usage, System V limits, and each GPU-stack segment with its users.
fn shm_lines(app: &App) -> Vec<Line<'static>> {
    let Some(shm) = app.snap().and_then(|s| s.shm.as_ref()) else {
        return vec![Line::from(" /dev/shm: N/A on this host")];
    };
    let mut l2 = vec![Line::from(format!(
        " /dev/shm {} used of {} ({} free)   SysV shmmax {}  shmall {}  shmmni {}  segments {}",
        fmt_bytes(shm.used),
        fmt_bytes(shm.total),
        fmt_bytes(shm.free),
        crate::core::format::fmt_limit(shm.shmmax, shm.shmmax_unlimited),
        crate::core::format::fmt_limit(shm.shmall, shm.shmall_unlimited),
        fmt_opt(shm.shmmni),
        shm.sysv_segments.len()
    ))];
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
            Some(u) => {
                let pids: Vec<String> = u.iter().map(u32::to_string).collect();
                (format!("in use by {}", pids.join(",")), Style::default())
            }
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
    l2
}

/// The panel's sections, top to bottom: limits and the tile calculator, then /dev/shm.
pub fn render(app: &App, f: &mut Frame, area: Rect) {
    let [top, bottom] =
        Layout::vertical([Constraint::Percentage(60), Constraint::Percentage(40)]).areas(area);
    let tile = app.smem.tile();
    let mut lines = vec![form_line(app), Line::default()];
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
    for (cc, at) in &capabilities(app) {
        lines.push(cc_line(app, cc, at, tile.as_ref().ok().copied()));
    }
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" ▶ Shared memory per block ")),
        top,
    );
    let title = format!(
        " /dev/shm on {} ",
        app.host().map_or("", |h| h.label.as_str())
    );
    f.render_widget(
        Paragraph::new(shm_lines(app)).block(Block::bordered().title(title)),
        bottom,
    );
}
