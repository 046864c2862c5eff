//! Zombies: they hold no memory; the action is on the parent that does not reap them.

use super::{Draft, Findings, who};
use crate::core::model::{FindingKind, HostSnapshot, Severity};

pub fn find(snap: &HostSnapshot, out: &mut Findings) {
    for &z in &snap.zombies {
        let Some(p) = snap.proc(z) else { continue };
        let (detail_parent, action, target) = if p.ppid <= 1 {
            (
                "PID 1 will reap it".to_string(),
                "nothing to do: init reaps it".to_string(),
                None,
            )
        } else {
            (
                format!("its parent {} never reaped it", who(snap, p.ppid)),
                format!(
                    "make {} wait() for its child, or end it; killing a zombie does nothing",
                    p.ppid
                ),
                Some(p.ppid),
            )
        };
        out.push(Draft {
            kind: FindingKind::Zombie,
            severity: Severity::Warning,
            gpu: None,
            pid: Some(z),
            bytes: None,
            detail: format!(
                "{z} ({}) is a zombie: it holds no GPU memory, but {detail_parent}",
                p.comm
            ),
            action,
            target_pid: target,
        });
    }
}
