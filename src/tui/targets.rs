//! What a kill on a row or a finding really means. A zombie cannot be killed (its parent must reap it), a
//! ghost is a dead PID (the holder keeping its memory is the one to end), a benign holder frees nothing: each
//! case offers the process that a signal would actually help, and says why, or explains why there is none.

use crate::core::format::{escape, fmt_bytes};
use crate::core::model::{Finding, FindingKind, HostSnapshot, Proc, ProcState};
use crate::core::signal::Protected;

#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    /// Offer this process in the kill dialog, with what the operator should know first.
    Offer {
        target: Box<Proc>,
        note: Option<String>,
    },
    /// Nothing to offer; say why.
    Explain(String),
}

fn label(p: &Proc) -> String {
    format!(
        "{} ({})",
        p.pid,
        crate::core::format::truncate(&crate::core::format::brief_cmd(&p.display_cmd()), 40)
    )
}

/// A kill asked for on the row of `pid`.
pub fn for_pid(snap: &HostSnapshot, pid: u32, protected: &Protected) -> Choice {
    let zombie = snap.proc(pid).is_some_and(|p| p.state.is_zombie());
    if let Some(why) = protected.reason(pid).filter(|_| !zombie) {
        return Choice::Explain(format!("{pid} is protected: {why}"));
    }
    let Some(p) = snap.proc(pid) else {
        if snap
            .gpus
            .iter()
            .any(|g| g.processes.iter().any(|l| l.pid == pid))
        {
            return for_ghost(snap, pid, protected);
        }
        return Choice::Explain(format!("{pid} is not in the last reading"));
    };
    if p.state.is_zombie() {
        return for_zombie(snap, p, protected);
    }
    let note = if snap.holder(pid).is_some_and(|h| h.benign) {
        Some(format!(
            "benign: {} opens the GPU without holding memory (a driver daemon or monitor); killing it frees \
             nothing and can stop persistence mode or monitoring",
            escape(&p.comm)
        ))
    } else if p.state == ProcState::DiskSleep {
        Some(format!(
            "in state D (waiting in {}): no signal ends it until that I/O returns; KILL stays pending",
            p.wchan.as_deref().map_or("the kernel".into(), escape)
        ))
    } else {
        None
    };
    Choice::Offer {
        target: Box::new(p.clone()),
        note,
    }
}

fn for_zombie(snap: &HostSnapshot, z: &Proc, protected: &Protected) -> Choice {
    let parent = snap.proc(z.ppid);
    if protected.contains(z.ppid) || parent.is_none() {
        return Choice::Explain(format!(
            "{} is a zombie: it holds nothing and no signal removes it; its parent {} is never signalled \
             here (see the zombie finding for who reaps it)",
            z.pid, z.ppid
        ));
    }
    let Some(parent) = parent else {
        return Choice::Explain(format!("{} is a zombie whose parent is unknown", z.pid));
    };
    Choice::Offer {
        target: Box::new(parent.clone()),
        note: Some(format!(
            "{} is a zombie: it holds nothing and no signal removes it. Its parent {} has not reaped it; \
             ending the parent hands it to init, which reaps it",
            z.pid,
            label(parent)
        )),
    }
}

/// A kill asked for on a dead PID that NVML still charges.
pub fn for_ghost(snap: &HostSnapshot, pid: u32, protected: &Protected) -> Choice {
    let holder = snap
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::Ghost && f.pid == Some(pid))
        .find_map(|f| f.target_pid)
        .and_then(|h| snap.proc(h));
    let charged = fmt_bytes(snap.charged(pid));
    match holder {
        Some(h) if !protected.contains(h.pid) => Choice::Offer {
            target: Box::new(h.clone()),
            note: Some(format!(
                "{pid} is gone, but NVML still charges {charged} to it: {} keeps its GPU context alive. \
                 Ending it frees the memory",
                label(h)
            )),
        },
        Some(h) => Choice::Explain(format!(
            "{pid} is gone; {} keeps its {charged} alive but is protected",
            h.pid
        )),
        None => Choice::Explain(format!(
            "{pid} is gone: there is no process to signal, and no live process is known to keep its \
             {charged}; sweep the GPU or look in other PID namespaces"
        )),
    }
}

/// A kill asked for on a finding.
pub fn for_finding(snap: &HostSnapshot, f: &Finding, protected: &Protected) -> Choice {
    match (f.kind, f.pid) {
        (FindingKind::Ghost, Some(pid)) => for_ghost(snap, pid, protected),
        (FindingKind::Zombie, Some(pid)) => for_pid(snap, pid, protected),
        (FindingKind::ShmLeftover, _) => Choice::Explain(
            "a /dev/shm file, not a process: D removes the host's leftovers (after a confirmation)"
                .into(),
        ),
        _ => match f.target_pid.or(f.pid) {
            Some(pid) => for_pid(snap, pid, protected),
            None => Choice::Explain(format!(
                "{}: no process to kill here; S sweeps the GPU",
                f.kind.as_str()
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::{AnalyzeOptions, analyzed};
    use crate::source::demo::{DemoClock, DemoHost};

    fn gpu_b() -> HostSnapshot {
        let (clock, _t) = DemoClock::manual(30_000);
        analyzed(
            DemoHost::new("gpu-b", clock).snapshot(),
            &AnalyzeOptions::default(),
        )
    }

    #[test]
    fn each_case_offers_the_process_a_signal_would_help() {
        let s = gpu_b();
        let p = Protected::remote();
        match for_pid(&s, 7350, &p) {
            Choice::Offer { target, note } => {
                assert_eq!(target.pid, 7340, "a zombie offers its parent");
                assert!(note.is_some_and(|n| n.contains("zombie")));
            }
            other @ Choice::Explain(_) => panic!("{other:?}"),
        }
        match for_pid(&s, 7307, &p) {
            Choice::Offer { target, note } => {
                assert_eq!(
                    target.pid, 7391,
                    "a ghost offers the holder that keeps it alive"
                );
                assert!(note.is_some_and(|n| n.contains("7307 is gone")));
            }
            other @ Choice::Explain(_) => panic!("{other:?}"),
        }
        let benign = s
            .holders
            .iter()
            .find(|h| h.benign)
            .expect("a benign holder")
            .pid;
        match for_pid(&s, benign, &p) {
            Choice::Offer { note, .. } => {
                assert!(note.is_some_and(|n| n.starts_with("benign")));
            }
            other @ Choice::Explain(_) => panic!("{other:?}"),
        }
        assert!(matches!(for_pid(&s, 1, &p), Choice::Explain(m) if m.contains("protected")));
    }
}
