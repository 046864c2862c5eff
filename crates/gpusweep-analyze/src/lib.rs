//! Snapshot -> findings, GPU states, the until-clean watch, sweep plans. Pure: no I/O, no clock. The words
//! are DESIGN's: ghost, hidden holder, residual, orphan, zombie, shm leftover, smem limit (and not_visible for
//! PIDs another PID namespace owns). The runtime calls `analyzed` once per reading, for every host.

#![forbid(unsafe_code)]

pub mod confirm;
pub mod events;
pub mod findings;
pub mod index;
pub mod jobs;
pub mod node;
pub mod plan;
pub mod reset;
pub mod spin;
pub mod state;
pub mod watch;

pub use state::{GpuState, gpu_clean, gpu_state};

use gpusweep_core::model::{Finding, HostSnapshot};

/// A kernel left running reads 100%; a GPU that just finished reads its last sample for under a second, and
/// the confirm window outlasts that.
pub const DEFAULT_BUSY_PERCENT: u32 = 50;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnalyzeOptions {
    /// A GPU at or under this many used bytes, with nothing listed, is clean.
    pub tolerance: u64,
    /// While live processes are listed, used memory beyond what they are charged is normal up to this much
    /// (context overhead is not charged: a real H200 read 19692 MiB used for 19684 MiB charged).
    pub residual_slack: u64,
    /// The windows a job's phases are told by (read by the ledger's job book).
    pub jobs: jobs::JobOptions,
    /// A finding seen to appear is said at its full severity once it has lasted this long (0: at once).
    pub confirm_ms: u64,
    /// A GPU this busy (percent) with nothing listed and nobody holding it is not idle, so not clean
    /// (0: utilization is not judged).
    pub busy_percent: u32,
}

impl Default for AnalyzeOptions {
    fn default() -> Self {
        AnalyzeOptions {
            tolerance: 0,
            residual_slack: gpusweep_core::model::RESIDUAL_SLACK,
            jobs: jobs::JobOptions::default(),
            confirm_ms: 3_000,
            busy_percent: DEFAULT_BUSY_PERCENT,
        }
    }
}

/// Every finding for one host, in a stable order (by severity, then GPU, then kind, then pid).
pub fn analyze(snap: &HostSnapshot, opts: &AnalyzeOptions) -> Vec<Finding> {
    let mut out = findings::Findings::new(&snap.host);
    let snap = &index::Indexed::new(snap);
    findings::gpu::find(snap, opts, &mut out);
    findings::busy::find(snap, opts, &mut out);
    findings::ready::find(snap, &mut out);
    findings::orphan::find(snap, &mut out);
    findings::zombie::find(snap, &mut out);
    findings::stuck::find(snap, &mut out);
    findings::shm::find(snap, &mut out);
    findings::smem::find(snap, &mut out);
    let mut out = out.out;
    kept_on_purpose(snap, &mut out);
    order(&mut out);
    out
}

/// Whether what holds a GPU's memory is kept on purpose, as the host's config declares: a part that keeps
/// memory after its processes exit, or a GPU held and listed only by programs that keep memory on purpose.
pub(crate) fn kept_gpu(snap: &index::Indexed<'_>, g: &gpusweep_core::model::Gpu) -> bool {
    let holders: Vec<_> = snap
        .holders
        .iter()
        .filter(|h| !h.benign && h.gpus.contains(&g.index))
        .collect();
    let others = holders.iter().any(|h| !h.kept)
        || g.processes
            .iter()
            .any(|p| !snap.holder(p.pid).is_some_and(|h| h.kept));
    !others && (g.kept || !holders.is_empty())
}

/// Whether the host declares anything kept on purpose at all (most do not: then nothing is looked up).
pub(crate) fn keeps_any(snap: &HostSnapshot) -> bool {
    snap.gpus.iter().any(|g| g.kept) || snap.holders.iter().any(|h| h.kept)
}

/// Memory nobody explains on a GPU whose memory is kept on purpose is a note, not a leak: said so, and never
/// a target.
fn kept_on_purpose(snap: &index::Indexed<'_>, out: &mut [Finding]) {
    use gpusweep_core::model::Severity;
    if !keeps_any(snap) {
        return;
    }
    let mut kept: std::collections::HashMap<u32, bool> = std::collections::HashMap::new();
    for f in out.iter_mut() {
        let unexplained = f.kind.is_leftover();
        let Some(g) = f.gpu.and_then(|i| snap.gpu(i)) else {
            continue;
        };
        if unexplained && *kept.entry(g.index).or_insert_with(|| kept_gpu(snap, g)) {
            f.severity = Severity::Info;
            f.detail = format!("kept on purpose (config [keep]): {}", f.detail);
            "nothing to do: this host declares this memory kept on purpose"
                .clone_into(&mut f.action);
            f.target_pid = None;
        }
    }
}

/// Findings in their stable order: by severity, then GPU, then kind, then pid.
pub fn order(out: &mut [Finding]) {
    out.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(a.gpu.cmp(&b.gpu))
            .then(a.kind.cmp(&b.kind))
            .then(a.pid.cmp(&b.pid))
    });
}

/// The snapshot judged: its findings, then each GPU's state. A host read from Prometheus keeps the findings
/// its own gpusweep reported: the client has its verdicts, not the processes to judge by. The runtime's
/// ledger calls this once per reading that says something new.
pub fn analyzed(mut snap: HostSnapshot, opts: &AnalyzeOptions) -> HostSnapshot {
    if !snap.source.judged_remotely() {
        snap.findings = analyze(&snap, opts);
        reset::fill(&mut snap);
    }
    state::judge_gpus(&mut snap, opts);
    snap
}
