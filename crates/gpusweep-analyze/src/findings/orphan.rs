//! Orphans: holders reparented to PID 1 (or a subreaper) that are not daemons (session leaders); and
//! orphaned jobs: holders whose job is over, by the job their cgroup names — a `gpusweep run` job whose
//! supervisor is gone, a Slurm job whose step daemon (slurmstepd) is no longer above them.

use super::{Draft, Findings, who};
use crate::index::Indexed;
use gpusweep_core::job::Job;
use gpusweep_core::model::{FindingKind, Proc, Severity};

/// The ancestors of `p` the reading knows, nearest first.
fn ancestors<'a>(snap: &Indexed<'a>, p: &Proc) -> Vec<&'a Proc> {
    let mut out = Vec::new();
    let mut cur = p.ppid;
    for _ in 0..64 {
        let Some(a) = snap.proc(cur) else { break };
        out.push(a);
        if a.pid <= 1 {
            break;
        }
        cur = a.ppid;
    }
    out
}

/// Why `p`'s job is over, when the reading shows it is.
fn job_over(snap: &Indexed<'_>, p: &Proc) -> Option<String> {
    let up = ancestors(snap, p);
    match p.job.as_ref()? {
        Job::Run { supervisor } => (!up.iter().any(|a| a.pid == *supervisor))
            .then(|| format!("its `gpusweep run` supervisor {supervisor} is gone")),
        Job::Slurm { job, .. } => (p.ppid == 1 && !up.iter().any(|a| a.comm == "slurmstepd"))
            .then(|| format!("Slurm job {job}'s step is gone (no slurmstepd above it)")),
        _ => None,
    }
}

pub fn find(snap: &Indexed<'_>, out: &mut Findings) {
    for h in snap.holders.iter().filter(|h| !h.benign && !h.kept) {
        let Some(p) = snap.proc(h.pid) else { continue };
        if p.state.is_zombie() {
            continue;
        }
        if let Some(why) = job_over(snap, p) {
            let job = p.job.as_ref().map(Job::short).unwrap_or_default();
            let query = p.job.as_ref().map(Job::query).unwrap_or_default();
            out.push(Draft {
                kind: FindingKind::OrphanedJob,
                severity: Severity::Leak,
                gpu: h.gpus.first().copied(),
                pid: Some(h.pid),
                bytes: snap.charged(h.pid),
                detail: format!(
                    "{} of job {job} still holds GPU {}: {why}",
                    who(snap, h.pid),
                    gpusweep_core::format::fmt_gpus(&h.gpus)
                ),
                action: format!(
                    "sweep the job: gpusweep sweep --job {query} (or kill {})",
                    h.pid
                ),
                target_pid: Some(h.pid),
            });
            continue;
        }
        if p.sid == p.pid {
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
                "{} holds {gpus} and its launcher is gone: reparented to PID {}{}",
                who(snap, h.pid),
                p.ppid,
                p.job
                    .as_ref()
                    .map(|j| format!(" (job {})", j.short()))
                    .unwrap_or_default()
            ),
            action: format!("kill {} if its job is over", h.pid),
            target_pid: Some(h.pid),
        });
    }
}
