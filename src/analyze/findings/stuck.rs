//! GPU holders in state D: asleep in the kernel where no signal reaches them until the I/O returns.

use super::{Draft, Findings, who};
use crate::analyze::index::Indexed;
use crate::core::model::{FindingKind, ProcState, Severity};

pub fn find(snap: &Indexed<'_>, out: &mut Findings) {
    for h in snap.holders.iter().filter(|h| !h.gpus.is_empty()) {
        let Some(p) = snap.proc(h.pid) else { continue };
        if p.state != ProcState::DiskSleep {
            continue;
        }
        let gpus = h
            .gpus
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let wchan = p
            .wchan
            .as_deref()
            .map(|w| format!(", waiting in {w}"))
            .unwrap_or_default();
        out.push(Draft {
            kind: FindingKind::Unkillable,
            severity: Severity::Warning,
            gpu: h.gpus.first().copied(),
            pid: Some(h.pid),
            bytes: None,
            detail: format!(
                "{} holds GPU {gpus} and is in state D (uninterruptible{wchan}): no signal ends it \
                 until that I/O returns, and its GPU memory stays held until then",
                who(snap, h.pid)
            ),
            action: "find what it waits on (a hung NFS or FUSE mount, a frozen cgroup, a wedged driver); a \
                     KILL sent now takes effect when the I/O returns; if it never does, drain the node and \
                     reboot it"
                .into(),
            target_pid: Some(h.pid),
        });
    }
}
