//! Sweep plans: which processes a sweep of some GPUs would signal, and why. Items carry the `HostId` they
//! live on, so a plan is routed by identity, never by label.

use serde::{Deserialize, Serialize};

use gpusweep_core::action::Purpose;
use gpusweep_core::format::fmt_bytes;
use gpusweep_core::model::{FindingKind, HostId, HostSnapshot, MIB};
use gpusweep_core::signal::{Protected, Sig, SignalRequest, TargetInfo};

/// One process a sweep would signal, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanItem {
    #[serde(skip)]
    pub host_id: HostId,
    /// The host's label, for people.
    pub host: String,
    pub pid: u32,
    pub start_time: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pidfs_ino: Option<u64>,
    pub user: Option<String>,
    pub cmdline: String,
    pub gpus: Vec<u32>,
    /// GPU memory it is charged (or, for a lone hidden holder, what nobody is charged for).
    pub bytes: Option<u64>,
    pub why: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub items: Vec<PlanItem>,
    /// (pid, reason) left out on purpose.
    pub skipped: Vec<(u32, String)>,
    /// Processes of the chosen GPUs a sweep of leftovers leaves alone: live, healthy jobs' (each `why` says
    /// which job and how it stands). Ended only when named (`--job`) or asked for (`--live`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub live: Vec<PlanItem>,
}

impl Plan {
    pub fn total_bytes(&self) -> u64 {
        self.items.iter().filter_map(|i| i.bytes).sum()
    }
    /// The signal request for one host's share of the plan.
    pub fn request(
        &self,
        host: HostId,
        signal: Sig,
        grace_ms: Option<u64>,
        purpose: Purpose,
    ) -> SignalRequest {
        SignalRequest {
            targets: self
                .items
                .iter()
                .filter(|i| i.host_id == host)
                .map(|i| TargetInfo {
                    pid: i.pid,
                    start_time: i.start_time,
                    cmdline: i.cmdline.clone(),
                    pidfs_ino: i.pidfs_ino,
                })
                .collect(),
            signal,
            grace_ms,
            purpose: Some(purpose),
        }
    }
    /// The hosts the plan signals, in order, without repeats.
    pub fn hosts(&self) -> Vec<HostId> {
        let mut h: Vec<HostId> = Vec::new();
        for i in &self.items {
            if !h.contains(&i.host_id) {
                h.push(i.host_id);
            }
        }
        h
    }
    fn labels(&self) -> Vec<String> {
        let mut h: Vec<String> = Vec::new();
        for i in &self.items {
            if !h.contains(&i.host) {
                h.push(i.host.clone());
            }
        }
        h
    }
    pub fn extend(&mut self, other: Plan) {
        self.items.extend(other.items);
        self.skipped.extend(other.skipped);
        self.live.extend(other.live);
    }

    /// Keep only the leftovers of `snap` (its share of the plan): what a finding names (an orphan, a
    /// hidden holder, the holder behind a ghost or a residual, an orphaned job's process) and the members of
    /// a job that lost a rank or its launcher. The rest, live and healthy, moves to `live`, each saying
    /// which job it is of.
    pub fn only_leftovers(&mut self, snap: &HostSnapshot) {
        let items = std::mem::take(&mut self.items);
        for mut item in items {
            if item.host != snap.host {
                self.items.push(item);
                continue;
            }
            if let Some(why) = leftover(snap, item.pid) {
                item.why = format!("{why}; {}", item.why);
                self.items.push(item);
            } else {
                item.why = live_why(snap, item.pid);
                self.live.push(item);
            }
        }
    }
}

/// Why a process is a leftover, if it is one.
fn leftover(snap: &HostSnapshot, pid: u32) -> Option<String> {
    // What the findings name: the process itself, or the one their action is on. Not a zombie's parent (a
    // live server that has not reaped a child is still a live server), a straggler, a stuck process.
    let named = snap.findings.iter().find(|f| {
        (f.pid == Some(pid) || f.target_pid == Some(pid))
            && matches!(
                f.kind,
                FindingKind::Orphan
                    | FindingKind::OrphanedJob
                    | FindingKind::HiddenHolder
                    | FindingKind::Ghost
                    | FindingKind::Residual
                    | FindingKind::LostRank
            )
    });
    if let Some(f) = named {
        return Some(format!("leftover ({})", f.kind.as_str()));
    }
    let job = snap.jobs.iter().find(|j| {
        j.ranks.iter().chain(&j.helpers).any(|r| r.pid == pid) || j.launcher == Some(pid)
    })?;
    if job.phase == gpusweep_core::job::Phase::LostRank {
        return Some(format!("leftover (job {} lost a rank)", job.id));
    }
    job.launcher_gone_ms
        .map(|_| format!("leftover (job {}: its launcher is gone)", job.id))
}

/// Why a live process is left alone, naming its job.
fn live_why(snap: &HostSnapshot, pid: u32) -> String {
    let job = snap.jobs.iter().find(|j| {
        j.ranks.iter().chain(&j.helpers).any(|r| r.pid == pid) || j.launcher == Some(pid)
    });
    match job {
        Some(j) => format!(
            "live job {} ({}): not a leftover; `--job {}` ends it, `--live` every live job",
            j.id,
            j.phase.as_str(),
            j.id
        ),
        None => "live, named by no finding: not a leftover; `--live` ends it".to_string(),
    }
}

/// Why a process that keeps memory on purpose is never a target.
const KEPT: &str = "kept on purpose (config [keep]): never swept";

/// Builds one host's plan.
struct Planner<'a> {
    id: HostId,
    snap: &'a HostSnapshot,
    protected: &'a Protected,
    plan: Plan,
}

impl Planner<'_> {
    fn add(&mut self, pid: u32, gpus: Vec<u32>, bytes: Option<u64>, why: String) {
        let Some(p) = self.snap.proc(pid) else { return };
        if p.state.is_zombie() {
            return;
        }
        if self.protected.contains(pid) {
            self.plan
                .skipped
                .push((pid, "protected (PID 1, gpusweep or its ancestor)".into()));
            return;
        }
        if let Some(item) = self.plan.items.iter_mut().find(|i| i.pid == pid) {
            for g in gpus {
                if !item.gpus.contains(&g) {
                    item.gpus.push(g);
                }
            }
            item.bytes = match (item.bytes, bytes) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
            return;
        }
        self.plan.items.push(PlanItem {
            host_id: self.id,
            host: self.snap.host.clone(),
            pid,
            start_time: p.start_time,
            pidfs_ino: p.pidfs_ino,
            user: p.user.clone(),
            cmdline: p.display_cmd(),
            gpus,
            bytes,
            why,
        });
    }

    fn has_finding(&self, kind: FindingKind, pid: u32) -> bool {
        self.snap
            .findings
            .iter()
            .any(|f| f.kind == kind && f.pid == Some(pid))
    }

    fn listed(&mut self, chosen: &dyn Fn(u32) -> bool) {
        let snap = self.snap;
        for g in snap.gpus.iter().filter(|g| chosen(g.index)) {
            for lp in &g.processes {
                // A ghost's PID is dead or now names an innocent process: never a target.
                if self.has_finding(FindingKind::Ghost, lp.pid) {
                    continue;
                }
                if snap.holder(lp.pid).is_some_and(|h| h.benign) {
                    self.plan
                        .skipped
                        .push((lp.pid, "benign (monitor or driver daemon)".into()));
                    continue;
                }
                if snap.holder(lp.pid).is_some_and(|h| h.kept) {
                    self.plan.skipped.push((lp.pid, KEPT.into()));
                    continue;
                }
                let why = format!(
                    "listed on GPU {} with {}",
                    g.index,
                    fmt_bytes(lp.used_bytes)
                );
                self.add(lp.pid, vec![g.index], lp.used_bytes, why);
            }
        }
    }

    fn holders(&mut self, gpus: Option<&[u32]>, chosen: &dyn Fn(u32) -> bool) {
        let snap = self.snap;
        for h in &snap.holders {
            if h.benign {
                continue;
            }
            if h.kept {
                if !self.plan.skipped.iter().any(|(p, _)| *p == h.pid) {
                    self.plan.skipped.push((h.pid, KEPT.into()));
                }
                continue;
            }
            let mine: Vec<u32> = h.gpus.iter().copied().filter(|&g| chosen(g)).collect();
            if h.gpus.is_empty() {
                // Only control files (nvidiactl, nvidia-uvm, nvidia-modeset): a desktop shell, a monitor. It
                // holds no GPU, so no sweep takes it; `gpusweep kill PID` does when asked.
                if gpus.is_none() && !snap.proc(h.pid).is_some_and(|p| p.state.is_zombie()) {
                    self.plan.skipped.push((
                        h.pid,
                        format!(
                            "holds only control files ({}): not swept; `gpusweep kill {}` if it must go",
                            h.devices.join(" "),
                            h.pid
                        ),
                    ));
                }
                continue;
            }
            if mine.is_empty() {
                continue;
            }
            let hidden = snap
                .findings
                .iter()
                .find(|f| f.kind == FindingKind::HiddenHolder && f.pid == Some(h.pid));
            let bytes = hidden.and_then(|f| f.bytes);
            let why = if hidden.is_some() {
                "hidden holder: has the GPU open, not listed by NVML".to_string()
            } else {
                format!("holds {}", h.devices.join(" "))
            };
            self.add(h.pid, mine, bytes, why);
        }
    }
}

/// The holders and live listed processes of the chosen GPUs (all when `gpus` is `None`), never benign ones,
/// never zombies (they hold nothing), never a protected PID.
pub fn plan(id: HostId, snap: &HostSnapshot, gpus: Option<&[u32]>, protected: &Protected) -> Plan {
    let chosen = |g: u32| gpus.is_none_or(|list| list.contains(&g));
    let mut p = Planner {
        id,
        snap,
        protected,
        plan: Plan::default(),
    };
    p.listed(&chosen);
    p.holders(gpus, &chosen);
    p.plan.items.sort_by_key(|i| i.pid);
    p.plan
}

/// A short human line for a plan: "3 processes on gpu-b, 81.2 GiB".
pub fn plan_summary(plan: &Plan) -> String {
    let hosts = plan.labels();
    format!(
        "{} process{} on {}, {} GPU memory",
        plan.items.len(),
        if plan.items.len() == 1 { "" } else { "es" },
        if hosts.is_empty() {
            "no host".to_string()
        } else {
            hosts.join(", ")
        },
        if plan.total_bytes() >= MIB {
            fmt_bytes(Some(plan.total_bytes()))
        } else {
            "no charged".into()
        }
    )
}
