//! GPU holders in state D, and listed processes on their way out in state D (their files closed, their
//! memory not yet freed): asleep in the kernel where no signal reaches them until the I/O returns.

use super::{Draft, Findings, who};
use crate::index::Indexed;
use gpusweep_core::model::{FindingKind, ProcState, Severity};

pub fn find(snap: &Indexed<'_>, out: &mut Findings) {
    let asleep = |pid: u32| {
        snap.proc(pid)
            .is_some_and(|p| p.state == ProcState::DiskSleep)
    };
    let held = snap
        .holders
        .iter()
        .filter(|h| !h.gpus.is_empty() && asleep(h.pid))
        .map(|h| (h.pid, h.gpus.clone()));
    let leaving = snap.gpus.iter().flat_map(|g| {
        g.processes
            .iter()
            .filter(|lp| snap.holder(lp.pid).is_none())
            .filter(|lp| {
                snap.proc(lp.pid)
                    .is_some_and(|p| p.exiting && p.state == ProcState::DiskSleep)
            })
            .map(|lp| (lp.pid, vec![g.index]))
    });
    let mut seen = std::collections::BTreeMap::<u32, Vec<u32>>::new();
    for (pid, gpus) in held.chain(leaving) {
        seen.entry(pid).or_default().extend(gpus);
    }
    for (pid, gpus) in seen {
        let Some(p) = snap.proc(pid) else { continue };
        let first_gpu = gpus.first().copied();
        let gpus = gpus
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
            gpu: first_gpu,
            pid: Some(pid),
            bytes: None,
            detail: format!(
                "{} holds GPU {gpus} and is in state D (uninterruptible{wchan}): no signal ends it \
                 until that I/O returns, and its GPU memory stays held until then",
                who(snap, pid)
            ),
            action: "find what it waits on (a hung NFS or FUSE mount, a frozen cgroup, a wedged driver); a \
                     KILL sent now takes effect when the I/O returns; if it never does, drain the node and \
                     reboot it"
                .into(),
            target_pid: Some(pid),
        });
    }
}
