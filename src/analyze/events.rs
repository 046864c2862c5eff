//! Two analyzed readings of one host -> what happened between them. Pure, like the rest of `analyze`.
//!
//! The processes followed are the GPU's own: holders and the PIDs NVML lists. A process is the same one
//! while its PID and start time are (a ghost, which /proc no longer has, by its PID alone). A finding is
//! the same one while its kind, GPU, PID and target are; a /dev/shm leftover also by its file.

use std::collections::{BTreeMap, BTreeSet};

use super::{AnalyzeOptions, GpuState, gpu_state};
use crate::core::event::EventKind;
use crate::core::model::{Finding, FindingKind, HostSnapshot};

/// A GPU process as one reading shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GpuProc {
    cmdline: String,
    gpus: Vec<u32>,
    bytes: Option<u64>,
}

/// By PID: (start time when /proc has it, what it holds).
fn gpu_procs(s: &HostSnapshot) -> BTreeMap<u32, (Option<u64>, GpuProc)> {
    let mut pids: BTreeSet<u32> = s.holders.iter().map(|h| h.pid).collect();
    pids.extend(
        s.gpus
            .iter()
            .flat_map(|g| g.processes.iter().map(|p| p.pid)),
    );
    pids.into_iter()
        .map(|pid| {
            let p = s.proc(pid);
            let mut gpus = s.listed_gpus(pid);
            if let Some(h) = s.holder(pid) {
                gpus.extend(&h.gpus);
            }
            gpus.sort_unstable();
            gpus.dedup();
            (
                pid,
                (
                    p.map(|p| p.start_time),
                    GpuProc {
                        cmdline: p.map_or_else(
                            || "[not in /proc]".to_string(),
                            crate::core::model::Proc::display_cmd,
                        ),
                        gpus,
                        bytes: s.charged(pid),
                    },
                ),
            )
        })
        .collect()
}

type FindingKey = (FindingKind, Option<u32>, Option<u32>, Option<u32>, String);

fn key(f: &Finding) -> FindingKey {
    let file = if f.kind == FindingKind::ShmLeftover {
        f.action.clone()
    } else {
        String::new()
    };
    (f.kind, f.gpu, f.pid, f.target_pid, file)
}

/// The events between `prev` (None: this is the host's first reading) and `next`. On a first reading only
/// the findings are events: every process there was already running.
pub fn between(
    prev: Option<&HostSnapshot>,
    next: &HostSnapshot,
    opts: &AnalyzeOptions,
) -> Vec<EventKind> {
    let mut out = Vec::new();
    let empty = HostSnapshot::default();
    let first = prev.is_none();
    let prev = prev.unwrap_or(&empty);
    if !first {
        let (before, now) = (gpu_procs(prev), gpu_procs(next));
        // The same process while its PID is, unless both readings know its start time and they differ (a
        // reused PID). One that left /proc but is still listed (a ghost now) is the same process.
        let same = |pid: &u32, st: &Option<u64>, other: &BTreeMap<u32, (Option<u64>, GpuProc)>| {
            other
                .get(pid)
                .is_some_and(|(o, _)| o.is_none() || st.is_none() || o == st)
        };
        for (pid, (_, p)) in before.iter().filter(|(k, (st, _))| !same(k, st, &now)) {
            out.push(EventKind::ProcessExited {
                pid: *pid,
                cmdline: p.cmdline.clone(),
                gpus: p.gpus.clone(),
                gpu_bytes: p.bytes,
            });
        }
        for (pid, (_, p)) in now.iter().filter(|(k, (st, _))| !same(k, st, &before)) {
            out.push(EventKind::ProcessAppeared {
                pid: *pid,
                cmdline: p.cmdline.clone(),
                gpus: p.gpus.clone(),
                gpu_bytes: p.bytes,
            });
        }
    }
    let was: BTreeSet<FindingKey> = prev.findings.iter().map(key).collect();
    let is: BTreeSet<FindingKey> = next.findings.iter().map(key).collect();
    for f in prev.findings.iter().filter(|f| !is.contains(&key(f))) {
        out.push(EventKind::FindingCleared {
            kind: f.kind,
            gpu: f.gpu,
            pid: f.pid,
            detail: f.detail.clone(),
        });
    }
    for f in next.findings.iter().filter(|f| !was.contains(&key(f))) {
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
            let now_clean = gpu_state(next, g, opts) == GpuState::Clean;
            let was_clean = prev
                .gpu(g.index)
                .is_some_and(|p| gpu_state(prev, p, opts) == GpuState::Clean);
            if now_clean && !was_clean && prev.gpu(g.index).is_some() {
                out.push(EventKind::GpuClean {
                    gpu: g.index,
                    after_ms: None,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::analyzed;
    use crate::core::model::{Gpu, Holder, ListedProcess, Memory, Proc};

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
        analyzed(s, &AnalyzeOptions::default())
    }

    #[test]
    fn a_holder_exiting_is_one_exit_and_the_gpu_turning_clean() {
        let o = AnalyzeOptions::default();
        let ev = between(Some(&reading(true)), &reading(false), &o);
        assert!(
            ev.iter().any(|e| matches!(e, EventKind::ProcessExited { pid: 42, gpu_bytes: Some(b), gpus, .. } if *b == 10 << 30 && gpus == &[0])),
            "{ev:?}"
        );
        assert!(
            ev.contains(&EventKind::GpuClean {
                gpu: 0,
                after_ms: None
            }),
            "{ev:?}"
        );
        let back = between(Some(&reading(false)), &reading(true), &o);
        assert!(
            matches!(&back[0], EventKind::ProcessAppeared { pid: 42, .. }),
            "{back:?}"
        );
        assert!(
            back.iter()
                .all(|e| !matches!(e, EventKind::ProcessExited { .. })),
            "{back:?}"
        );
        assert!(between(Some(&reading(true)), &reading(true), &o).is_empty());
    }

    #[test]
    fn a_first_reading_reports_findings_only_and_a_reused_pid_is_a_new_process() {
        let o = AnalyzeOptions::default();
        let mut ghost = reading(true);
        ghost.processes.clear();
        ghost.holders.clear();
        let ghost = analyzed(ghost, &o);
        let ev = between(None, &ghost, &o);
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
        let ev = between(Some(&reading(true)), &reused, &o);
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
}
