//! Orphans: holders reparented to PID 1 (or a subreaper) that are not daemons (session leaders).

use super::{Draft, Findings, who};
use crate::core::model::{FindingKind, HostSnapshot, Severity};

pub fn find(snap: &HostSnapshot, out: &mut Findings) {
    for h in snap.holders.iter().filter(|h| !h.benign) {
        let Some(p) = snap.proc(h.pid) else { continue };
        if p.state.is_zombie() || p.sid == p.pid {
            continue;
        }
        let reparented = p.ppid == 1
            || snap
                .proc(p.ppid)
                .is_some_and(|pp| pp.comm == "systemd" && pp.pid != pp.sid && p.ppid != 0);
        if !reparented {
            continue;
        }
        let gpus = if h.gpus.is_empty() {
            "the GPU driver".to_string()
        } else {
            format!(
                "GPU {}",
                h.gpus
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            )
        };
        out.push(Draft {
            kind: FindingKind::Orphan,
            severity: Severity::Warning,
            gpu: h.gpus.first().copied(),
            pid: Some(h.pid),
            bytes: None,
            detail: format!(
                "{} holds {gpus} and its launcher is gone: reparented to PID {}",
                who(snap, h.pid),
                p.ppid
            ),
            action: format!("kill {} if its job is over", h.pid),
            target_pid: Some(h.pid),
        });
    }
}
