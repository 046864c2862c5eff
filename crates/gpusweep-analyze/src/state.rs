//! How a GPU reads: clean, in use, leaking, or unknown. The runtime's ledger calls `gpu_state` once per GPU
//! of each reading and stores it in the reading (`Gpu.state`); everything else reads that. How each state is
//! shown belongs to `core::format`.

use super::AnalyzeOptions;
pub use gpusweep_core::model::GpuState;
use gpusweep_core::model::{FindingKind, Gpu, HostSnapshot};

/// DESIGN's "clean" by memory: used at or under the tolerance and nothing listed (`gpu_state` adds "idle"). `None` when it cannot be told. A GPU
/// judged by the host's own gpusweep (read from Prometheus, without its process list) is clean only when
/// that gpusweep says so and the memory it reports agrees.
pub fn gpu_clean(g: &Gpu, tolerance: u64) -> Option<bool> {
    if g.error.is_some() && g.memory.used.is_none() {
        return None;
    }
    if let Some(said) = g.judged {
        return match (said, g.memory.used) {
            // Its own bytes and its own process list both have to agree with a "clean".
            (GpuState::Clean, Some(u)) => Some(u <= tolerance && g.processes.is_empty()),
            (GpuState::Clean | GpuState::Unknown | GpuState::Error, _) => None,
            (GpuState::InUse | GpuState::Leak | GpuState::NeedsReset, _) => Some(false),
        };
    }
    g.memory
        .used
        .map(|u| u <= tolerance && g.processes.is_empty())
}

/// A GPU's state in its reading: the ledger's one judgement. A GPU already judged (the reading went
/// through a ledger) keeps its state.
pub fn gpu_state(snap: &HostSnapshot, g: &Gpu, opts: &AnalyzeOptions) -> GpuState {
    if let Some(s) = g.state {
        return s;
    }
    if g.error.is_some() && g.memory.used.is_none() {
        return GpuState::Error;
    }
    if g.mig_error.is_some() {
        // In MIG mode, with instances that could not be read: nothing can be said of it.
        return GpuState::Unknown;
    }
    if needs_reset(g).is_some() || g.judged == Some(GpuState::NeedsReset) {
        return GpuState::NeedsReset;
    }
    if !g.mig.is_empty() {
        let st = mig_state(snap, g, opts);
        // Clean means idle, and every byte the GPU reports in an instance.
        if st == GpuState::Clean && (busy(snap, g, opts) || beyond_instances(g, opts).is_some()) {
            return leak_or_in_use(snap, g.index, None);
        }
        return st;
    }
    let clean = gpu_clean(g, opts.tolerance).map(|c| c && !busy(snap, g, opts));
    match clean {
        None if g.judged == Some(GpuState::Error) => GpuState::Error,
        None => GpuState::Unknown,
        // A zero no node proved (read from Prometheus without its serve's seal) is labels anyone may
        // write: never a clean, on any screen.
        Some(true) if snap.lacks(gpusweep_core::model::Feature::Proof) => GpuState::Unknown,
        Some(true) => GpuState::Clean,
        // The host's own word where it was judged there; else its leftovers (a finding the host's config made
        // a note, memory kept on purpose, is no leak).
        Some(false) if g.judged == Some(GpuState::Leak) => GpuState::Leak,
        Some(false) => leak_or_in_use(snap, g.index, None),
    }
}

/// Why a GPU is not ready for a launch whatever its memory says: the driver asks for a reset or a reboot
/// (NVML's recovery action), or an XID after which NVIDIA's guidance is a reset was seen. `None`: nothing
/// says so.
pub fn needs_reset(g: &Gpu) -> Option<String> {
    let asked = match g.recovery_action.as_deref() {
        Some("gpu_reset") => Some("the driver asks for a GPU reset"),
        Some("node_reboot") => Some("the driver asks for a node reboot"),
        Some("drain_and_reset") => Some("the driver asks to drain the node and reset the GPU"),
        Some("drain_p2p") => Some("the driver asks to drain the GPU's peer-to-peer traffic"),
        _ => None,
    };
    let seen: Vec<String> = g
        .xids
        .iter()
        .flat_map(|x| x.counts.keys())
        .filter_map(|x| {
            gpusweep_core::model::RESET_XIDS
                .iter()
                .find(|(id, _)| id == x)
                .map(|(id, what)| format!("XID {id} ({what})"))
        })
        .collect();
    match (asked, seen.is_empty()) {
        (None, true) => None,
        (Some(a), true) => Some(a.to_string()),
        (None, false) => Some(format!("{} seen", seen.join(", "))),
        (Some(a), false) => Some(format!("{} seen; {a}", seen.join(", "))),
    }
}

/// A GPU in MIG mode whose own reading says more memory used than its instances account for (past the
/// tolerance and the residual slack: an instance's bookkeeping is the driver's): (used, the instances' sum).
pub(crate) fn beyond_instances(g: &Gpu, opts: &AnalyzeOptions) -> Option<(u64, u64)> {
    let used = g.memory.used?;
    let inside: u64 = g.mig.iter().filter_map(|i| i.memory.used).sum();
    (used > inside.saturating_add(opts.tolerance.max(opts.residual_slack)))
        .then_some((used, inside))
}

/// Not clean: a leak where a leak-severity leftover finding names this GPU (and this MIG instance, or none),
/// else in use.
fn leak_or_in_use(snap: &HostSnapshot, gpu: u32, instance: Option<u32>) -> GpuState {
    let leaking = snap.findings.iter().any(|f| {
        f.gpu == Some(gpu)
            && f.gpu_instance == instance
            && f.severity == gpusweep_core::model::Severity::Leak
            && f.kind.is_leftover()
    });
    if leaking {
        GpuState::Leak
    } else {
        GpuState::InUse
    }
}

/// A MIG instance's state: clean when its memory is at or under the tolerance and nothing is listed on it,
/// a leak where a leak finding names it, unknown where it could not be read.
pub(crate) fn instance_state(
    snap: &HostSnapshot,
    g: &Gpu,
    inst: &gpusweep_core::model::MigInstance,
    opts: &AnalyzeOptions,
) -> GpuState {
    let Some(used) = inst.memory.used else {
        return GpuState::Unknown;
    };
    if inst.error.is_some() {
        return GpuState::Unknown;
    }
    if used <= opts.tolerance && inst.processes.is_empty() {
        return GpuState::Clean;
    }
    leak_or_in_use(snap, g.index, inst.gpu_instance)
}

/// A GPU in MIG mode reads as its worst instance: unknown over a leak over in use over clean; a process
/// listed on the GPU outside every instance keeps it in use.
fn mig_state(snap: &HostSnapshot, g: &Gpu, opts: &AnalyzeOptions) -> GpuState {
    let states: Vec<GpuState> = g
        .mig
        .iter()
        .map(|i| instance_state(snap, g, i, opts))
        .collect();
    let outside = g.processes.iter().any(|p| p.gpu_instance.is_none());
    if states.contains(&GpuState::Unknown) {
        GpuState::Unknown
    } else if states.contains(&GpuState::Leak)
        || leak_or_in_use(snap, g.index, None) == GpuState::Leak
    {
        GpuState::Leak
    } else if outside || states.contains(&GpuState::InUse) {
        GpuState::InUse
    } else {
        GpuState::Clean
    }
}

/// Clean means idle: a GPU at work with nothing listed on it is not clean, whoever has it open. Its own
/// reading's utilization where this host is judged here; the host's own finding where it was judged there.
pub fn busy(snap: &HostSnapshot, g: &Gpu, opts: &AnalyzeOptions) -> bool {
    let said = snap
        .findings
        .iter()
        .any(|f| f.gpu == Some(g.index) && f.kind == FindingKind::BusyWithoutHolder);
    said || (!snap.source.judged_remotely()
        && g.judged.is_none()
        && opts.busy_percent > 0
        && g.processes.is_empty()
        && g.utilization.is_some_and(|u| u >= opts.busy_percent))
}

/// Whether new utilizations (one per GPU, in order) put some GPU with nothing listed across the busy line
/// (`busy_percent`), one way or the other: clean means idle, so a reading that says the same but for such
/// gauges says something new and is judged again. Never for a host judged where it runs (its own gpusweep
/// judged its utilization), nor for gauges left out (none: as before).
pub fn busy_moved(
    before: &HostSnapshot,
    utilization: impl ExactSizeIterator<Item = Option<u32>>,
    opts: &AnalyzeOptions,
) -> bool {
    let over = |u: Option<u32>| u.is_some_and(|u| u >= opts.busy_percent);
    opts.busy_percent > 0
        && !before.source.judged_remotely()
        && utilization.len() == before.gpus.len()
        && before.gpus.iter().zip(utilization).any(|(g, new)| {
            g.judged.is_none() && g.processes.is_empty() && over(g.utilization) != over(new)
        })
}

/// Fill in every GPU's state (after the findings); a state some other reader gave it is judged again.
pub fn judge_gpus(snap: &mut HostSnapshot, opts: &AnalyzeOptions) {
    for g in &mut snap.gpus {
        g.state = None;
    }
    let states: Vec<GpuState> = snap.gpus.iter().map(|g| gpu_state(snap, g, opts)).collect();
    let parts: Vec<Vec<GpuState>> = snap
        .gpus
        .iter()
        .map(|g| {
            g.mig
                .iter()
                .map(|i| instance_state(snap, g, i, opts))
                .collect()
        })
        .collect();
    for ((g, s), p) in snap.gpus.iter_mut().zip(states).zip(parts) {
        g.state = Some(s);
        for (i, st) in g.mig.iter_mut().zip(p) {
            i.state = Some(st);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusweep_core::model::{MIB, Memory};

    fn said(claim: GpuState, used: Option<u64>) -> Gpu {
        Gpu {
            memory: Memory {
                used,
                ..Default::default()
            },
            judged: Some(claim),
            ..Default::default()
        }
    }

    #[test]
    fn a_remote_clean_is_believed_only_as_far_as_its_bytes_agree() {
        let o = AnalyzeOptions::default();
        let s = HostSnapshot::default();
        let st = |g: &Gpu| gpu_state(&s, g, &o);
        assert_eq!(st(&said(GpuState::Clean, Some(0))), GpuState::Clean);
        assert_eq!(
            st(&said(GpuState::Clean, Some(70_000 * MIB))),
            GpuState::InUse
        );
        assert_eq!(st(&said(GpuState::Clean, None)), GpuState::Unknown);
        // Nothing used, yet a process listed on it (71 GiB charged, by its own word): not clean.
        let mut listed = said(GpuState::Clean, Some(0));
        listed.processes.push(gpusweep_core::model::ListedProcess {
            pid: 7306,
            used_bytes: Some(71 * 1024 * MIB),
            ..Default::default()
        });
        assert_eq!(st(&listed), GpuState::InUse);
        assert_eq!(st(&said(GpuState::Leak, Some(0))), GpuState::Leak);
        assert_eq!(st(&said(GpuState::Error, None)), GpuState::Error);
        let tolerant = AnalyzeOptions {
            tolerance: 4 * MIB,
            ..o
        };
        assert_eq!(
            gpu_state(&s, &said(GpuState::Clean, Some(3 * MIB)), &tolerant),
            GpuState::Clean
        );
    }
}
