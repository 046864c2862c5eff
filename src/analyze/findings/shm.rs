//! /dev/shm segments of the GPU stack that no live process has open or mapped.

use super::{Draft, Findings};
use crate::core::format::{escape, fmt_bytes, fmt_secs, shell_quote};
use crate::core::model::{FindingKind, HostSnapshot, Severity};

pub fn find(snap: &HostSnapshot, out: &mut Findings) {
    let Some(shm) = &snap.shm else { return };
    for s in &shm.segments {
        if !s.users.as_ref().is_some_and(Vec::is_empty) {
            continue;
        }
        let age = s
            .age_s
            .map(|a| format!(", {} old", fmt_secs(a)))
            .unwrap_or_default();
        out.push(Draft {
            kind: FindingKind::ShmLeftover,
            severity: Severity::Warning,
            gpu: None,
            pid: None,
            bytes: Some(s.bytes),
            detail: format!(
                "/dev/shm/{} ({}{age}) is open or mapped by no live process",
                escape(&s.name),
                fmt_bytes(Some(s.bytes))
            ),
            action: format!(
                "rm -- {}",
                escape(&shell_quote(&format!("/dev/shm/{}", s.name)))
            ),
            target_pid: None,
        });
    }
}
