//! Two analyzed readings of one host -> what happened between them. Pure, like the rest of `analyze`.
//!
//! The processes followed are the GPU's own: holders and the PIDs NVML lists. A process is the same one
//! while its PID and start time are (a ghost, which /proc no longer has, by its PID alone). A finding is
//! the same one while its kind, GPU, PID and target are; a /dev/shm leftover also by its file.

use std::collections::{BTreeMap, BTreeSet};

use super::GpuState;
use gpusweep_core::event::EventKind;
use gpusweep_core::model::{Finding, HostSnapshot, Severity, Subject};

/// A GPU process as one reading shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GpuProc {
    cmdline: String,
    gpus: Vec<u32>,
    bytes: Option<u64>,
}

/// The GPU's processes by PID, with their start time when /proc has them.
fn gpu_pids(s: &HostSnapshot) -> BTreeMap<u32, Option<u64>> {
    let mut pids: BTreeSet<u32> = s.holders.iter().map(|h| h.pid).collect();
    pids.extend(
        s.gpus
            .iter()
            .flat_map(|g| g.processes.iter().map(|p| p.pid)),
    );
    pids.into_iter()
        .map(|pid| (pid, s.proc(pid).map(|p| p.start_time)))
        .collect()
}

/// What one of them holds, told only for those that came or went.
fn gpu_proc(s: &HostSnapshot, pid: u32) -> GpuProc {
    let mut gpus = s.listed_gpus(pid);
    if let Some(h) = s.holder(pid) {
        gpus.extend(&h.gpus);
    }
    gpus.sort_unstable();
    gpus.dedup();
    GpuProc {
        cmdline: s.proc(pid).map_or_else(
            || "[not in /proc]".to_string(),
            gpusweep_core::model::Proc::display_cmd,
        ),
        gpus,
        bytes: s.charged(pid),
    }
}

/// `pid`, a GPU process of `s`, seen to appear there (or to have exited, `s` its last reading).
fn process_event(s: &HostSnapshot, pid: u32, appeared: bool) -> EventKind {
    let GpuProc {
        cmdline,
        gpus,
        bytes: gpu_bytes,
    } = gpu_proc(s, pid);
    if appeared {
        EventKind::ProcessAppeared {
            pid,
            cmdline,
            gpus,
            gpu_bytes,
        }
    } else {
        EventKind::ProcessExited {
            pid,
            cmdline,
            gpus,
            gpu_bytes,
        }
    }
}

/// The events between `prev` (None: this is the host's first reading) and `next`, both judged (each GPU's
/// state filled in). On a first reading only the findings are events: every process there was already
/// running. A GPU turning clean is `GpuClean` without times: the ledger, which keeps the clocks, adds them.
pub fn between(prev: Option<&HostSnapshot>, next: &HostSnapshot) -> Vec<EventKind> {
    let mut out = Vec::new();
    let empty = HostSnapshot::default();
    let first = prev.is_none();
    let prev = prev.unwrap_or(&empty);
    if !first {
        let (before, now) = (gpu_pids(prev), gpu_pids(next));
        // The same process while its PID is, unless both readings know its start time and they differ (a
        // reused PID). One that left /proc but is still listed (a ghost now) is the same process.
        let same = |pid: &u32, st: &Option<u64>, other: &BTreeMap<u32, Option<u64>>| {
            other
                .get(pid)
                .is_some_and(|o| o.is_none() || st.is_none() || o == st)
        };
        for (&pid, _) in before.iter().filter(|(k, st)| !same(k, st, &now)) {
            out.push(process_event(prev, pid, false));
        }
        for (&pid, _) in now.iter().filter(|(k, st)| !same(k, st, &before)) {
            out.push(process_event(next, pid, true));
        }
    }
    out.extend(verdict_events(
        &prev.findings,
        |i| prev.gpu(i).map(|g| g.state),
        next,
        first,
    ));
    out
}

/// The findings that cleared, appeared or rose, and the GPUs that turned clean, between the verdict before
/// (its findings, and each GPU's state by index: `None` for a GPU it did not have) and `next`: all `between`
/// reads of the reading before but its processes (a reading that moved only its memory is judged against
/// the ledger's `Verdict` of the last one alone).
pub fn verdict_events(
    prev_findings: &[Finding],
    prev_state: impl Fn(u32) -> Option<Option<GpuState>>,
    next: &HostSnapshot,
    first: bool,
) -> Vec<EventKind> {
    let mut out = Vec::new();
    // A finding whose severity rose (one seen to appear, now confirmed) is told again.
    let was: BTreeMap<Subject, Severity> = prev_findings
        .iter()
        .map(|f| (f.subject(), f.severity))
        .collect();
    let is: BTreeSet<Subject> = next.findings.iter().map(Finding::subject).collect();
    for f in prev_findings.iter().filter(|f| !is.contains(&f.subject())) {
        out.push(EventKind::FindingCleared {
            kind: f.kind,
            gpu: f.gpu,
            pid: f.pid,
            detail: f.detail.clone(),
        });
    }
    for f in next
        .findings
        .iter()
        .filter(|f| was.get(&f.subject()).is_none_or(|s| *s < f.severity))
    {
        out.push(EventKind::FindingAppeared {
            kind: f.kind,
            severity: f.severity,
            gpu: f.gpu,
            pid: f.pid,
            detail: f.detail.clone(),
        });
    }
    if !first {
        for g in &next.gpus {
            let now_clean = g.state == Some(GpuState::Clean);
            let was = prev_state(g.index);
            let was_clean = was == Some(Some(GpuState::Clean));
            if now_clean && !was_clean && was.is_some() {
                out.push(EventKind::GpuClean {
                    gpu: g.index,
                    after_ms: None,
                    after_exit_ms: None,
                });
            }
        }
    }
    out
}

/// The GPUs of processes that held or were listed on them in `prev` and died by `next`: left /proc, became
/// another process, or turned zombie (dead is dead when it is a zombie too: its parent may reap it only
/// after the driver let go).
pub fn released_by_deaths(prev: &HostSnapshot, next: &HostSnapshot) -> Vec<u32> {
    let mut out = Vec::new();
    let pids = prev.holders.iter().map(|h| h.pid).chain(
        prev.gpus
            .iter()
            .flat_map(|g| g.processes.iter().map(|p| p.pid)),
    );
    for pid in pids {
        let Some(before) = prev.proc(pid).filter(|p| !p.state.is_zombie()) else {
            continue;
        };
        let alive = |p: &gpusweep_core::model::Proc| {
            p.start_time == before.start_time && !p.state.is_zombie()
        };
        if next.proc(pid).is_some_and(alive) {
            continue;
        }
        out.extend(prev.listed_gpus(pid));
        if let Some(h) = prev.holder(pid) {
            out.extend(&h.gpus);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The GPUs a signal to these PIDs may free: those each holds or is listed on, and those of its
/// descendants (a launcher's workers end with it), as the reading shows them.
pub fn gpus_of_targets(snap: &HostSnapshot, pids: &[u32]) -> Vec<u32> {
    let mut chosen: BTreeSet<u32> = pids.iter().copied().collect();
    // Descendants: a few passes over the parent links reach every generation a reading holds.
    for _ in 0..64 {
        let before = chosen.len();
        for p in &snap.processes {
            if chosen.contains(&p.ppid) {
                chosen.insert(p.pid);
            }
        }
        if chosen.len() == before {
            break;
        }
    }
    let mut out: Vec<u32> = chosen
        .iter()
        .flat_map(|&pid| {
            let mut g = snap.listed_gpus(pid);
            if let Some(h) = snap.holder(pid) {
                g.extend(&h.gpus);
            }
            g
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AnalyzeOptions, analyzed, state::judge_gpus};
    use gpusweep_core::model::{FindingKind, Gpu, Holder, ListedProcess, Memory, Proc};

    fn reading(holding: bool) -> HostSnapshot {
        let mut g = Gpu {
            index: 0,
            minor: Some(0),
            memory: Memory {
                used: Some(0),
                total: Some(80 << 30),
                reserved: None,
            },
            ..Default::default()
        };
        let mut s = HostSnapshot {
            host: "h".into(),
            ..Default::default()
        };
        if holding {
            g.memory.used = Some(10 << 30);
            g.processes.push(ListedProcess {
                pid: 42,
                used_bytes: Some(10 << 30),
                ..Default::default()
            });
            s.holders.push(Holder {
                pid: 42,
                gpus: vec![0],
                ..Default::default()
            });
            s.processes.push(Proc {
                pid: 42,
                ppid: 1,
                start_time: 9,
                cmdline: "python serve.py".into(),
                ..Default::default()
            });
        }
        s.gpus.push(g);
        judged(s)
    }

    fn judged(s: HostSnapshot) -> HostSnapshot {
        let mut s = analyzed(s, &AnalyzeOptions::default());
        judge_gpus(&mut s, &AnalyzeOptions::default());
        s
    }

    #[test]
    fn a_holder_exiting_is_one_exit_and_the_gpu_turning_clean() {
        let ev = between(Some(&reading(true)), &reading(false));
        assert!(
            ev.iter().any(|e| matches!(e, EventKind::ProcessExited { pid: 42, gpu_bytes: Some(b), gpus, .. } if *b == 10 << 30 && gpus == &[0])),
            "{ev:?}"
        );
        assert!(
            ev.contains(&EventKind::GpuClean {
                gpu: 0,
                after_ms: None,
                after_exit_ms: None
            }),
            "{ev:?}"
        );
        let back = between(Some(&reading(false)), &reading(true));
        assert!(
            matches!(&back[0], EventKind::ProcessAppeared { pid: 42, .. }),
            "{back:?}"
        );
        assert!(
            back.iter()
                .all(|e| !matches!(e, EventKind::ProcessExited { .. })),
            "{back:?}"
        );
        assert!(between(Some(&reading(true)), &reading(true)).is_empty());
    }

    #[test]
    fn a_first_reading_reports_findings_only_and_a_reused_pid_is_a_new_process() {
        let mut ghost = reading(true);
        ghost.processes.clear();
        ghost.holders.clear();
        for g in &mut ghost.gpus {
            g.state = None;
        }
        let ghost = judged(ghost);
        let ev = between(None, &ghost);
        assert!(
            ev.iter()
                .all(|e| matches!(e, EventKind::FindingAppeared { .. })),
            "{ev:?}"
        );
        assert!(
            ev.iter().any(|e| matches!(
                e,
                EventKind::FindingAppeared {
                    kind: FindingKind::Ghost,
                    ..
                }
            )),
            "{ev:?}"
        );
        let mut reused = reading(true);
        reused.processes[0].start_time = 99;
        let ev = between(Some(&reading(true)), &reused);
        assert_eq!(
            ev.iter()
                .filter(|e| matches!(
                    e,
                    EventKind::ProcessExited { .. } | EventKind::ProcessAppeared { .. }
                ))
                .count(),
            2,
            "{ev:?}"
        );
    }

    fn with_state(state: Option<gpusweep_core::model::ProcState>) -> HostSnapshot {
        use gpusweep_core::model::{Gpu, Holder, ListedProcess, Proc};
        HostSnapshot {
            gpus: vec![Gpu {
                index: 3,
                processes: vec![ListedProcess {
                    pid: 42,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            holders: vec![Holder {
                pid: 42,
                gpus: vec![3],
                ..Default::default()
            }],
            processes: state
                .map(|st| Proc {
                    pid: 42,
                    ppid: 41,
                    start_time: 7,
                    state: st,
                    ..Default::default()
                })
                .into_iter()
                .chain([Proc {
                    pid: 41,
                    ppid: 1,
                    ..Default::default()
                }])
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_holder_dies_when_it_turns_zombie_not_when_its_parent_reaps_it() {
        use gpusweep_core::model::ProcState;
        let alive = with_state(Some(ProcState::Sleeping));
        let zombie = with_state(Some(ProcState::Zombie));
        let gone = with_state(None);
        assert_eq!(released_by_deaths(&alive, &alive), Vec::<u32>::new());
        assert_eq!(released_by_deaths(&alive, &zombie), vec![3]);
        assert_eq!(released_by_deaths(&alive, &gone), vec![3]);
        assert_eq!(
            released_by_deaths(&zombie, &gone),
            Vec::<u32>::new(),
            "it died once, not twice"
        );
    }

    #[test]
    fn a_signal_may_free_the_gpus_of_its_targets_and_their_descendants_only() {
        use gpusweep_core::model::ProcState;
        let s = with_state(Some(ProcState::Sleeping));
        assert_eq!(gpus_of_targets(&s, &[42]), vec![3]);
        assert_eq!(gpus_of_targets(&s, &[41]), vec![3], "the launcher's worker");
        assert_eq!(gpus_of_targets(&s, &[9]), Vec::<u32>::new(), "unrelated");
    }
}
