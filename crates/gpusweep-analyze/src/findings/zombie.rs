//! Zombies: they hold no memory; the action is on the parent that does not reap them.

use super::{Draft, Findings, who};
use crate::index::Indexed;
use gpusweep_core::model::{FindingKind, Severity};

/// PID 1 programs that reap the children they adopt.
fn reaps(comm: &str) -> bool {
    matches!(
        comm,
        "systemd"
            | "init"
            | "tini"
            | "dumb-init"
            | "catatonit"
            | "docker-init"
            | "s6-svscan"
            | "runit"
            | "openrc-init"
            | "busybox"
            | "launchd"
            | "upstart"
    )
}

pub fn find(snap: &Indexed<'_>, out: &mut Findings) {
    for &z in &snap.zombies {
        let Some(p) = snap.proc(z) else { continue };
        let init = snap.proc(1).map(|i| i.comm.as_str());
        let (detail_parent, action, target) = if p.ppid <= 1 && init.is_some_and(reaps) {
            (
                format!("PID 1 ({}) will reap it", init.unwrap_or("init")),
                "nothing to do: init reaps it".to_string(),
                None,
            )
        } else if p.ppid <= 1 {
            // Seen on real machines: a PID 1 that is a plain program (a container's entry point, an agent)
            // never calls wait(), so its adopted children stay zombies until it exits. Whether this one reaps
            // is not known: it is not said.
            (
                format!(
                    "its parent is PID 1 ({}), not an init gpusweep knows; if it does not reap the children it \
                     adopts, this one stays until PID 1 exits",
                    init.unwrap_or("unknown")
                ),
                "nothing to do for the GPU (a zombie holds no memory); if zombies pile up, run containers with \
                 an init (docker --init, tini)"
                    .to_string(),
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
        // It touches a GPU when NVML still lists it or its parent holds one (a rank's child).
        let listed = snap
            .gpus
            .iter()
            .find(|g| g.processes.iter().any(|l| l.pid == z))
            .map(|g| g.index);
        let parents = snap
            .holder(p.ppid)
            .filter(|h| !h.benign)
            .and_then(|h| h.gpus.first().copied());
        out.push(Draft {
            kind: FindingKind::Zombie,
            severity: Severity::Warning,
            gpu: listed.or(parents),
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
