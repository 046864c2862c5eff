//! A GPU kept busy while no process is listed on it and none has it open: a kernel left running by a job that
//! is gone (a hard-killed job left one at 100%, 0 MiB, no process, for nine days). Memory alone calls such a
//! GPU clean. Guarded against false alarms: it is said at full severity only once it has lasted the confirm
//! window (never on one reading), the source walks every process's descriptors as soon as a GPU is busy with
//! nothing listed, and a GPU a program the host's config declares (benign or kept) holds is its business.
//! Holding the device file open explains nothing (anyone may open it): openers are named, never exempt.

use super::{Draft, Findings};
use crate::AnalyzeOptions;
use crate::index::Indexed;
use gpusweep_core::format::fmt_bytes;
use gpusweep_core::model::{Feature, FindingKind, Severity};

pub fn find(snap: &Indexed<'_>, opts: &AnalyzeOptions, out: &mut Findings) {
    if opts.busy_percent == 0 {
        return;
    }
    for g in &snap.gpus {
        let Some(util) = g.utilization else { continue };
        if util < opts.busy_percent || !g.processes.is_empty() {
            continue;
        }
        // A program the host declares (benign by its config, or kept) holding it is its business. Any other
        // opener explains nothing: work needs a CUDA context, and NVML lists every process that has one; a
        // device file is open to anyone (/dev/nvidiaN is 0666), so holding it open cannot hide a leftover.
        let opens = snap.holders.iter().filter(|h| h.gpus.contains(&g.index));
        if opens.clone().any(|h| h.declared || h.kept) {
            continue;
        }
        let holders: Vec<u32> = opens.map(|h| h.pid).collect();
        let node = format!("/dev/nvidia{}", g.minor.unwrap_or(g.index));
        let (seen, severity, blind_action) = match blind(snap) {
            Some((what, how)) => (what, Severity::Warning, Some(how)),
            None if holders.is_empty() => (
                format!("every process's descriptors were read and none has {node} open"),
                Severity::Leak,
                None,
            ),
            None => (
                if holders.len() == 1 {
                    format!(
                        "every process's descriptors were read; {} has {node} open but NVML does not list it (no CUDA context)",
                        super::list_pids(snap, &holders)
                    )
                } else {
                    format!(
                        "every process's descriptors were read; {} have {node} open but NVML lists none of them (no CUDA context)",
                        super::list_pids(snap, &holders)
                    )
                },
                Severity::Leak,
                None,
            ),
        };
        let reset = crate::reset::plan(snap, g);
        out.push(Draft {
            kind: FindingKind::BusyWithoutHolder,
            severity,
            gpu: Some(g.index),
            pid: None,
            bytes: g.memory.used,
            detail: format!(
                "GPU {} is {util}% busy ({} used) with no process listed on it; {seen}: a kernel left running by a job that is gone",
                g.index,
                fmt_bytes(g.memory.used)
            ),
            action: blind_action.unwrap_or(reset),
            target_pid: None,
        });
    }
}

/// What this reading could not see that may be running the work, and how to see it.
fn blind(snap: &Indexed<'_>) -> Option<(String, String)> {
    if !snap.holders_known() {
        return Some((
            "which processes have the GPU open could not be read on this host".into(),
            "run gpusweep on the host (as root) to see what runs on the GPU".into(),
        ));
    }
    if snap.lacks(Feature::OthersProcesses) {
        return Some((
            "/proc hides other users' processes here (hidepid): one of them may run the work"
                .into(),
            "run gpusweep as root on a /proc that shows every process".into(),
        ));
    }
    super::gpu::blind_spot(snap)
}
