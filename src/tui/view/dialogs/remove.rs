//! The removal confirmation: each /dev/shm leftover by name and size.

// Widths and row counts are bounded by the screen.
#![allow(clippy::cast_possible_truncation)]

use ratatui::Frame;
use ratatui::text::Line;

use super::super::truncate;
use super::{centered, confirm_box, hint};
use crate::core::format::{escape, fmt_bytes};
use crate::core::model::HostId;
use crate::core::removal::ShmFile;
use crate::tui::app::App;
use crate::tui::keymap::Cmd;

pub fn render(app: &App, f: &mut Frame, host: HostId, files: &[ShmFile]) {
    let area = f.area();
    let w = area.width.min(100);
    let h = (files.len() as u16 + 8).min(area.height);
    let r = centered(area, w, h);
    let label = app.label(host);
    let dir = app
        .store
        .hosts
        .get(host.0)
        .and_then(|h| h.snap.as_ref())
        .and_then(|s| s.shm.as_ref())
        .and_then(|i| i.dir.as_deref());
    let mut lines = vec![
        Line::from(format!(
            " Remove {} file(s) from {} on {label}: no live process has them open or mapped.",
            files.len(),
            escape(dir.unwrap_or(crate::core::model::DEFAULT_SHM_DIR))
        )),
        Line::default(),
    ];
    for file in files {
        lines.push(Line::from(format!(
            " {:>10}  {}",
            fmt_bytes(Some(file.bytes)),
            truncate(
                &escape(&crate::core::model::shm_path(dir, &file.name)),
                w.saturating_sub(16) as usize
            )
        )));
    }
    lines.push(Line::default());
    lines.push(Line::from(
        " Each is re-checked first (same inode, still unused, a plain file) and logged.",
    ));
    lines.push(hint(
        app,
        &[(Cmd::Confirm, "remove"), (Cmd::Cancel, "cancel")],
    ));
    confirm_box(app, f, r, lines, "Remove /dev/shm leftovers", "file", false);
}
