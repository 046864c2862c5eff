//! Shared-memory files of the GPU stack that no live process has open or mapped: in the host's /dev/shm, and
//! in pods' memory-backed volumes (where a pod's NCCL and sglang segments live).

use super::{Draft, Findings};
use crate::index::Indexed;
use gpusweep_core::format::{escape, fmt_bytes, fmt_secs, shell_quote};
use gpusweep_core::model::{FileRef, FindingKind, HostSnapshot, PodShm, Severity, ShmSegment};
use gpusweep_core::removal::ShmFile;

/// A plain file nobody uses: a symlink or socket with such a name is not the stack's leftover, and a file
/// whose users could not be checked is never one.
fn left_over(s: &ShmSegment) -> bool {
    !s.special && s.users.as_ref().is_some_and(Vec::is_empty)
}

/// Every segment of a reading, with the pod volume it is in (`None`: the host's /dev/shm).
fn every(s: &HostSnapshot) -> impl Iterator<Item = (&ShmSegment, Option<&PodShm>)> {
    s.shm.iter().flat_map(|i| {
        i.segments.iter().map(|g| (g, None)).chain(
            i.pods
                .iter()
                .flat_map(|p| p.segments.iter().map(move |g| (g, Some(p)))),
        )
    })
}

/// The leftovers a removal may ask for: plain files nobody has open or mapped, each with the identity
/// (device, inode) the removal is checked against, and the pod volume it is in.
pub fn removable(s: &HostSnapshot) -> Vec<ShmFile> {
    every(s)
        .filter(|(g, _)| left_over(g))
        .filter_map(|(g, pod)| {
            Some(ShmFile {
                name: g.name.clone(),
                dev: g.dev?,
                ino: g.ino?,
                bytes: g.bytes,
                pod_volume: pod.map(|p| p.dir.clone()),
            })
        })
        .collect()
}

pub fn find(snap: &Indexed<'_>, out: &mut Findings) {
    let Some(shm) = &snap.shm else { return };
    for (s, pod) in every(snap) {
        if !left_over(s) {
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
        let (path, whose) = match pod {
            Some(p) => (
                gpusweep_core::model::shm_path(Some(&p.dir), &s.name),
                format!(" in {}", escape(&p.describe())),
            ),
            None => (shm.path_of(&s.name), String::new()),
        };
        out.push_about(
            Draft {
                kind: FindingKind::ShmLeftover,
                severity: Severity::Warning,
                gpu: None,
                pid: None,
                bytes: Some(s.bytes),
                detail: format!(
                    "{}{whose} ({}{age}) is open or mapped by no live process",
                    escape(&path),
                    fmt_bytes(Some(s.bytes))
                ),
                action: format!(
                    "`gpusweep shm clean` (D in the TUI) removes it, re-checked; or rm -- {}",
                    escape(&shell_quote(&path))
                ),
                target_pid: None,
            },
            Some(file),
        );
    }
}
