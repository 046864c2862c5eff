//! "Until clean": the state machine shared by `gpusweep wait`, `sweep` and the TUI's re-watch. Hosts are
//! keyed by `HostId`, never by label. No clock inside: callers pass the time, so it is deterministic.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{GpuState, gpu_clean};
use gpusweep_core::format::{fmt_bytes, fmt_gpu_ranges};
use gpusweep_core::model::{HostId, HostSnapshot};
use gpusweep_core::parse::GpuRef;

/// Which GPUs matter: all, or these indices on every host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    pub gpus: Option<Vec<u32>>,
}

impl Scope {
    pub fn includes(&self, gpu: u32) -> bool {
        self.gpus.as_ref().is_none_or(|g| g.contains(&gpu))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "why", rename_all = "snake_case")]
pub enum Verdict {
    Clean,
    /// What still holds memory, one line per GPU or holder.
    Dirty(Vec<String>),
    /// The host could not be read.
    Unknown(String),
}

fn dirty_gpu_line(snap: &HostSnapshot, g: &gpusweep_core::model::Gpu) -> String {
    let holders: Vec<String> = snap
        .holders
        .iter()
        .filter(|h| !h.benign && h.gpus.contains(&g.index))
        .map(|h| h.pid.to_string())
        .collect();
    let listed: Vec<String> = g.processes.iter().map(|p| p.pid.to_string()).collect();
    let mut line = format!("GPU {}: {} used", g.index, fmt_bytes(g.memory.used));
    if !listed.is_empty() {
        line.push_str(&format!(", listed {}", at_most(&listed)));
    }
    if !holders.is_empty() {
        line.push_str(&format!(", held by {}", at_most(&holders)));
    }
    if let (true, Some(u)) = (g.processes.is_empty(), g.utilization.filter(|u| *u > 0)) {
        line.push_str(&format!(", {u}% busy"));
    }
    for i in g.mig.iter().filter(|i| i.state != Some(GpuState::Clean)) {
        let pids: Vec<String> = i.processes.iter().map(|p| p.pid.to_string()).collect();
        line.push_str(&format!(
            "; {}: {} used",
            i.label(),
            fmt_bytes(i.memory.used)
        ));
        if !pids.is_empty() {
            line.push_str(&format!(", listed {}", at_most(&pids)));
        }
    }
    line
}

/// The most PIDs a line names: a host (or a hostile serve) listing thousands would make one line of
/// hundreds of kilobytes.
pub const PIDS_A_LINE: usize = 8;

/// PIDs joined by commas, at most `PIDS_A_LINE` of them, then how many more.
fn at_most(pids: &[String]) -> String {
    let shown = pids[..pids.len().min(PIDS_A_LINE)].join(",");
    match pids.len().saturating_sub(PIDS_A_LINE) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

/// Whether the process `pid` of this reading is one of `exempt` (pid, start time): the same process, not a
/// PID reused since.
fn exempted(snap: &HostSnapshot, pid: u32, exempt: &[(u32, u64)]) -> bool {
    snap.proc(pid)
        .is_some_and(|p| exempt.contains(&(pid, p.start_time)))
}

/// Whether a GPU that is not clean is held only by exempt processes (`gpusweep run --no-preflight`: what held
/// it before the job is not the job's to wait for).
fn held_only_by(snap: &HostSnapshot, g: &gpusweep_core::model::Gpu, exempt: &[(u32, u64)]) -> bool {
    let listed = g.processes.iter().map(|p| p.pid);
    let holders = snap
        .holders
        .iter()
        .filter(|h| !h.benign && h.gpus.contains(&g.index))
        .map(|h| h.pid);
    let mut any = false;
    for pid in listed.chain(holders) {
        if !exempted(snap, pid, exempt) {
            return false;
        }
        any = true;
    }
    any
}

/// DESIGN's clean, for one host. Where no GPU can be read it judges by holders alone. A GPU that only
/// `exempt` processes hold counts as clean for this verdict.
pub fn verdict(
    snap: &HostSnapshot,
    scope: &Scope,
    tolerance: u64,
    exempt: &[(u32, u64)],
) -> Verdict {
    if let Some(e) = &snap.error {
        return Verdict::Unknown(e.clone());
    }
    let gpus: Vec<_> = snap
        .gpus
        .iter()
        .filter(|g| scope.includes(g.index))
        .collect();
    let readable = gpus.iter().any(|g| g.memory.used.is_some());
    let keeps = super::keeps_any(snap).then(|| super::index::Indexed::new(snap));
    let kept =
        |g: &gpusweep_core::model::Gpu| keeps.as_ref().is_some_and(|ix| super::kept_gpu(ix, g));
    let mut why = Vec::new();
    let mut unread = Vec::new();
    if readable {
        for g in gpus {
            // The ledger's verdict where the reading has one; a reading not judged yet is judged here.
            // Not ready for a launch, whoever holds it: no exemption applies.
            if g.state == Some(GpuState::NeedsReset) {
                why.push(format!(
                    "GPU {}: needs a reset before a launch ({})",
                    g.index,
                    super::state::needs_reset(g).unwrap_or_else(|| "as its host judged it".into())
                ));
                continue;
            }
            let clean = match g.state {
                Some(GpuState::Clean) => Some(true),
                Some(GpuState::InUse | GpuState::Leak | GpuState::NeedsReset) => Some(false),
                Some(GpuState::Unknown | GpuState::Error) => None,
                None => gpu_clean(g, tolerance),
            };
            match clean {
                Some(true) => {}
                // What the host declares kept on purpose is no gate's to wait for.
                Some(false) if held_only_by(snap, g, exempt) || kept(g) => {}
                Some(false) => why.push(dirty_gpu_line(snap, g)),
                None if g.error.is_none() && snap.lacks(gpusweep_core::model::Feature::Proof) => {
                    unread.push(format!(
                        "GPU {}: reads {}, which no node proved",
                        g.index,
                        fmt_bytes(g.memory.used)
                    ));
                }
                None => unread.push(format!(
                    "GPU {}: no reading ({})",
                    g.index,
                    g.error.clone().unwrap_or_default()
                )),
            }
        }
    } else {
        for h in snap
            .holders
            .iter()
            .filter(|h| !h.benign && !h.kept && !exempted(snap, h.pid, exempt))
        {
            if h.gpus.is_empty() || h.gpus.iter().any(|&g| scope.includes(g)) {
                why.push(format!("holder {} ({})", h.pid, h.devices.join(" ")));
            }
        }
    }
    // A chosen GPU that could not be read (a wedged driver, a lost GPU) leaves the host undecided.
    if !unread.is_empty() {
        unread.extend(why);
        // A zero no node proved reads unknown: say why.
        unread.extend(blind_proof(snap));
        return Verdict::Unknown(unread.join("; "));
    }
    if !why.is_empty() {
        return Verdict::Dirty(why);
    }
    // A clean no node proved (read from Prometheus without its serve's seal) is not one.
    match blind_proof(snap) {
        Some(e) => Verdict::Unknown(e),
        None => Verdict::Clean,
    }
}

/// Why a gate cannot call a host clean: its reading came through Prometheus without its serve's seal
/// (`Feature::Proof`), so every "clean" in it rests on labels anyone who can get a series scraped writes.
pub fn blind_proof(snap: &HostSnapshot) -> Option<String> {
    snap.lacks(gpusweep_core::model::Feature::Proof).then(|| {
        format!(
            "{}: read from Prometheus without a seal its own serve made (no fleet key here, no seal there, \
             or dcgm-exporter alone): a clean that rests on labels is never taken; give the fleet key \
             (--seal-key) to reader and serve, or read the host's serve (--hosts http://NODE:9401)",
            gpusweep_core::format::escape(&snap.host)
        )
    })
}

/// Whether this host's GPUs could be read at all (otherwise the verdict was by holders alone).
pub fn judged_by_holders_only(snap: &HostSnapshot) -> bool {
    snap.error.is_none() && !snap.gpus.iter().any(|g| g.memory.used.is_some())
}

/// Which GPUs of each host `refs` names: an index stands for that GPU on every host and must exist on every
/// host whose GPUs could be read; a UUID must name a GPU of some host. Hosts that none of them name are left
/// out of the map. `Err` says which GPU is missing and what the host has.
/// Whether a process belongs to the job `query` names: by its cgroup's job (see `Job::matches`), or as a
/// rank of the launcher tree the reading's jobs call `tree:PID`.
pub fn of_job(snap: &HostSnapshot, p: &gpusweep_core::model::Proc, query: &str) -> bool {
    p.job.as_ref().is_some_and(|j| j.matches(query))
        || snap
            .jobs
            .iter()
            .any(|j| j.job.is_none() && j.id == query.trim() && j.members().any(|r| r.pid == p.pid))
}

/// Whether any process of the reading belongs to the job `query` names.
pub fn job_seen(snap: &HostSnapshot, query: &str) -> bool {
    snap.processes.iter().any(|p| of_job(snap, p, query))
}

/// The PIDs of a host's reading that belong to the job `query` names and hold or are listed on a GPU, with
/// the GPUs they hold.
pub fn job_processes(snap: &HostSnapshot, query: &str) -> Vec<(u32, Vec<u32>)> {
    let mut out: Vec<(u32, Vec<u32>)> = snap
        .processes
        .iter()
        .filter(|p| of_job(snap, p, query))
        .filter_map(|p| {
            let mut gpus = snap.listed_gpus(p.pid);
            if let Some(h) = snap.holder(p.pid).filter(|h| !h.benign) {
                gpus.extend(&h.gpus);
            }
            gpus.sort_unstable();
            gpus.dedup();
            (!gpus.is_empty() || snap.holder(p.pid).is_some_and(|h| !h.benign))
                .then_some((p.pid, gpus))
        })
        .collect();
    out.sort_unstable();
    out
}

pub fn resolve_gpus(
    refs: &[GpuRef],
    hosts: &[(HostId, &HostSnapshot)],
) -> Result<BTreeMap<HostId, Vec<u32>>, String> {
    let mut out: BTreeMap<HostId, Vec<u32>> = BTreeMap::new();
    for (id, snap) in hosts {
        let have: Vec<u32> = snap.gpus.iter().map(|g| g.index).collect();
        let mut mine = Vec::new();
        for r in refs {
            match r {
                GpuRef::Index(i) if have.is_empty() || have.contains(i) => mine.push(*i),
                GpuRef::Index(i) => {
                    return Err(format!(
                        "{}: no GPU {i} (its GPUs: {})",
                        snap.host,
                        fmt_gpu_ranges(&have)
                    ));
                }
                GpuRef::Uuid(u) => mine.extend(
                    snap.gpus
                        .iter()
                        .filter(|g| g.uuid.as_deref().is_some_and(|x| x.eq_ignore_ascii_case(u)))
                        .map(|g| g.index),
                ),
            }
        }
        if !mine.is_empty() {
            mine.sort_unstable();
            mine.dedup();
            out.insert(*id, mine);
        }
    }
    for r in refs {
        if let GpuRef::Uuid(u) = r {
            let found = hosts.iter().any(|(_, s)| {
                s.gpus
                    .iter()
                    .any(|g| g.uuid.as_deref().is_some_and(|x| x.eq_ignore_ascii_case(u)))
            });
            if !found {
                return Err(format!("no host has a GPU {u}"));
            }
        }
    }
    Ok(out)
}

#[derive(Debug, Clone)]
pub struct Watch {
    pub scope: Scope,
    /// Hosts whose GPUs were chosen one by one (`--gpus` with UUIDs); others use `scope`.
    pub per_host: BTreeMap<HostId, Scope>,
    pub tolerance: u64,
    pub started_ms: u64,
    pub clean_at_ms: Option<u64>,
    pub hosts: BTreeMap<HostId, Verdict>,
    /// Hosts that must report before the watch can end, with their labels for messages.
    pub expected: Vec<(HostId, String)>,
    /// Processes (pid, start time) not waited for: a GPU only they hold counts as clean.
    pub exempt: Vec<(u32, u64)>,
}

impl Watch {
    pub fn new(
        expected: Vec<(HostId, String)>,
        scope: Scope,
        tolerance: u64,
        now_ms: u64,
    ) -> Watch {
        Watch {
            scope,
            tolerance,
            started_ms: now_ms,
            clean_at_ms: None,
            hosts: BTreeMap::new(),
            expected,
            per_host: BTreeMap::new(),
            exempt: Vec::new(),
        }
    }

    pub fn watches(&self, host: HostId) -> bool {
        self.expected.iter().any(|(h, _)| *h == host)
    }

    /// Take one host's snapshot. Returns true when this observation made everything clean.
    pub fn observe(&mut self, host: HostId, snap: &HostSnapshot, now_ms: u64) -> bool {
        if !self.watches(host) {
            return false;
        }
        let scope = self.per_host.get(&host).unwrap_or(&self.scope);
        let v = verdict(snap, scope, self.tolerance, &self.exempt);
        self.hosts.insert(host, v);
        self.settle(now_ms)
    }

    /// A host that could not be read: its verdict is unknown until a reading comes.
    pub fn unreadable(&mut self, host: HostId, why: String) {
        if self.watches(host) {
            self.hosts.insert(host, Verdict::Unknown(why));
            self.clean_at_ms = None;
        }
    }

    fn settle(&mut self, now_ms: u64) -> bool {
        let all = self.all_clean();
        if all && self.clean_at_ms.is_none() {
            self.clean_at_ms = Some(now_ms);
            return true;
        }
        if !all {
            self.clean_at_ms = None;
        }
        false
    }

    pub fn all_clean(&self) -> bool {
        !self.expected.is_empty()
            && self
                .expected
                .iter()
                .all(|(h, _)| matches!(self.hosts.get(h), Some(Verdict::Clean)))
    }

    /// Whether some watched host (or GPU) could not be read at the end: the gate cannot say "held" or "clean".
    pub fn undecided(&self) -> bool {
        self.expected
            .iter()
            .any(|(h, _)| !matches!(self.hosts.get(h), Some(Verdict::Clean | Verdict::Dirty(_))))
    }

    pub fn took_ms(&self) -> Option<u64> {
        self.clean_at_ms.map(|c| c.saturating_sub(self.started_ms))
    }

    /// Lines naming what still holds memory, for a timeout message.
    pub fn remaining(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (h, label) in &self.expected {
            match self.hosts.get(h) {
                None => out.push(format!("{label}: no reading yet")),
                Some(Verdict::Clean) => {}
                Some(Verdict::Unknown(e)) => out.push(format!("{label}: {e}")),
                Some(Verdict::Dirty(why)) => {
                    out.extend(why.iter().map(|w| format!("{label}: {w}")));
                }
            }
        }
        out
    }
}
