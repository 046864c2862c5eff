//! /dev/shm segments of the GPU stack that no live process has open or mapped.

use super::{Draft, Findings};
use crate::analyze::index::Indexed;
use crate::core::format::{escape, fmt_bytes, fmt_secs, shell_quote};
use crate::core::model::{FileRef, FindingKind, HostSnapshot, Severity};
use crate::core::removal::ShmFile;

/// The leftovers a removal may ask for: plain files nobody has open or mapped, each with the identity
/// (device, inode) the removal is checked against.
pub fn removable(s: &HostSnapshot) -> Vec<ShmFile> {
    s.shm
        .iter()
        .flat_map(|i| i.segments.iter())
        .filter(|g| !g.special && g.users.as_ref().is_some_and(Vec::is_empty))
        .filter_map(|g| {
            Some(ShmFile {
                name: g.name.clone(),
                dev: g.dev?,
                ino: g.ino?,
                bytes: g.bytes,
            })
        })
        .collect()
}

pub fn find(snap: &Indexed<'_>, out: &mut Findings) {
    let Some(shm) = &snap.shm else { return };
    for s in &shm.segments {
        // Only plain files nobody uses: a symlink or socket with such a name is not the stack's leftover.
        if s.special || !s.users.as_ref().is_some_and(Vec::is_empty) {
            continue;
        }
        let age = s
            .age_s
            .map(|a| format!(", {} old", fmt_secs(a)))
            .unwrap_or_default();
        let file = FileRef {
            name: s.name.clone(),
            dev: s.dev,
            ino: s.ino,
        };
        out.push_about(
            Draft {
                kind: FindingKind::ShmLeftover,
                severity: Severity::Warning,
                gpu: None,
                pid: None,
                bytes: Some(s.bytes),
                detail: format!(
                    "{} ({}{age}) is open or mapped by no live process",
                    escape(&shm.path_of(&s.name)),
                    fmt_bytes(Some(s.bytes))
                ),
                action: format!(
                    "`gpusweep shm clean` (D in the TUI) removes it, re-checked; or rm -- {}",
                    escape(&shell_quote(&shm.path_of(&s.name)))
                ),
                target_pid: None,
            },
            Some(file),
        );
    }
}
