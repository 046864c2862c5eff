//! Per GPU: ghosts (a listed PID that is gone), residual memory (used bytes no live listed process accounts
//! for), hidden holders (holders NVML does not list, when memory is unexplained), and PIDs of another PID
//! namespace.

use super::{Draft, Findings, list_pids, short_cmd, who};
use crate::AnalyzeOptions;
use crate::index::Indexed;
use gpusweep_core::format::fmt_bytes;
use gpusweep_core::model::{FindingKind, Gpu, Proc, Severity};

/// Whether a listed PID is alive as the same process, from what the snapshot can tell.
enum Liveness<'a> {
    Live,
    Gone,
    Zombie,
    /// The PID exists but is another program with no GPU device open: the PID was reused.
    Reused(&'a Proc),
    NotVisible,
}

fn liveness<'a>(snap: &Indexed<'a>, pid: u32) -> Liveness<'a> {
    match snap.proc(pid) {
        None if snap.in_child_pid_namespace => Liveness::NotVisible,
        None => Liveness::Gone,
        Some(p) if p.state.is_zombie() => Liveness::Zombie,
        // On its way out: its files are closed, and NVML charges it until the driver has freed its memory.
        Some(p) if p.exiting => Liveness::Live,
        Some(p) => {
            // Holder scanning must have been possible for this to mean anything.
            if snap.holder(pid).is_none() && !p.fds_unreadable && snap.holders_known() {
                Liveness::Reused(p)
            } else {
                Liveness::Live
            }
        }
    }
}

/// What the listed processes of one GPU add up to.
struct Accounting {
    live_charged: u64,
    /// A live listed process whose bytes NVML could not tell: nothing can be claimed as residual then.
    live_unknown: bool,
    live_count: usize,
    ghosts: Vec<(u32, Option<u64>, String)>,
}

fn listed(snap: &Indexed<'_>, g: &Gpu, place: &str, out: &mut Findings) -> Accounting {
    let mut l = Accounting {
        live_charged: 0,
        live_unknown: false,
        live_count: 0,
        ghosts: Vec::new(),
    };
    for lp in &g.processes {
        match liveness(snap, lp.pid) {
            Liveness::Live => {
                l.live_count += 1;
                l.live_charged += lp.used_bytes.unwrap_or(0);
                l.live_unknown |= lp.used_bytes.is_none();
            }
            Liveness::NotVisible => {
                l.live_count += 1;
                l.live_charged += lp.used_bytes.unwrap_or(0);
                l.live_unknown |= lp.used_bytes.is_none();
                out.push(Draft {
                    kind: FindingKind::NotVisible,
                    severity: Severity::Info,
                    gpu: Some(g.index),
                    pid: Some(lp.pid),
                    bytes: lp.used_bytes,
                    detail: format!(
                        "NVML lists PID {} on {place} ({}), but it is not visible from this PID namespace",
                        lp.pid,
                        fmt_bytes(lp.used_bytes)
                    ),
                    action: "run gpusweep on the host (outside the container) to see and act on it"
                        .into(),
                    target_pid: None,
                });
            }
            Liveness::Gone => l.ghosts.push((lp.pid, lp.used_bytes, "is gone".into())),
            Liveness::Zombie => l.ghosts.push((lp.pid, lp.used_bytes, "is a zombie".into())),
            Liveness::Reused(p) => l.ghosts.push((
                lp.pid,
                lp.used_bytes,
                format!(
                    "is now another program ({}) with no GPU open: the PID was reused",
                    short_cmd(p)
                ),
            )),
        }
    }
    l
}

/// Holders of this GPU that NVML does not list: the usual owners of memory nobody is charged for.
fn hidden_holders(snap: &Indexed<'_>, g: &Gpu) -> Vec<u32> {
    snap.holders
        .iter()
        .filter(|h| !h.benign && !h.kept && h.gpus.contains(&g.index))
        .filter(|h| !snap.listed_on(g.index, h.pid))
        .filter(|h| snap.proc(h.pid).is_some_and(|p| !p.state.is_zombie()))
        .map(|h| h.pid)
        .collect()
}

pub fn find(snap: &Indexed<'_>, opts: &AnalyzeOptions, out: &mut Findings) {
    for g in &snap.gpus {
        if g.mig.is_empty() {
            find_on(snap, g, &format!("GPU {}", g.index), opts, out);
            continue;
        }
        // In MIG mode each instance is judged on its own: its memory, its processes; a leftover is named
        // with the instance it is in.
        for inst in &g.mig {
            let part = Gpu {
                index: g.index,
                minor: g.minor,
                memory: inst.memory.clone(),
                processes: inst.processes.clone(),
                ..Gpu::default()
            };
            out.instance = inst.gpu_instance;
            find_on(
                snap,
                &part,
                &format!("GPU {} {}", g.index, inst.label()),
                opts,
                out,
            );
            out.instance = None;
        }
        mig_outside(snap, g, opts, out);
    }
}

/// A GPU in MIG mode, outside its instances: processes NVML lists on it in no instance (a dead one is a
/// ghost as anywhere), and memory its own reading says beyond what the instances account for.
fn mig_outside(snap: &Indexed<'_>, g: &Gpu, opts: &AnalyzeOptions, out: &mut Findings) {
    let outside: Vec<_> = g
        .processes
        .iter()
        .filter(|p| p.gpu_instance.is_none())
        .cloned()
        .collect();
    if !outside.is_empty() {
        let part = Gpu {
            index: g.index,
            minor: g.minor,
            // Their ghosts and holders; the memory is told below, against the instances.
            memory: gpusweep_core::model::Memory {
                used: Some(0),
                ..Default::default()
            },
            processes: outside,
            ..Gpu::default()
        };
        let place = format!("GPU {} (outside its MIG instances)", g.index);
        find_on(snap, &part, &place, opts, out);
    }
    if let Some((used, inside)) = crate::state::beyond_instances(g, opts) {
        out.push(Draft {
            kind: FindingKind::Residual,
            // What a MIG GPU's own figure holds beyond its instances is not validated on hardware: a
            // warning, and the GPU is not clean.
            severity: Severity::Warning,
            gpu: Some(g.index),
            pid: None,
            bytes: Some(used - inside),
            detail: format!(
                "{} used on GPU {} but its MIG instances account for {}: memory outside every instance",
                fmt_bytes(Some(used)),
                g.index,
                fmt_bytes(Some(inside))
            ),
            action: "look at the GPU's instances (nvidia-smi mig -lgi); if it stays, reset the GPU"
                .into(),
            target_pid: None,
        });
    }
}

/// One GPU's (or one MIG instance's) accounting: ghosts, residual memory, hidden holders.
fn find_on(snap: &Indexed<'_>, g: &Gpu, place: &str, opts: &AnalyzeOptions, out: &mut Findings) {
    let Some(used) = g.memory.used else { return };
    let l = listed(snap, g, place, out);
    let residual = used.saturating_sub(l.live_charged);
    // Unknown is unknown: bytes nobody could read are never counted as 0 to make a leak.
    let is_residual = !l.live_unknown
        && residual > opts.tolerance
        && (l.live_count == 0 || residual > opts.residual_slack);
    let hidden = hidden_holders(snap, g);
    let unexplained = is_residual || !l.ghosts.is_empty();
    let target = if unexplained {
        hidden.first().copied()
    } else {
        None
    };
    ghosts(snap, g, place, &l.ghosts, &hidden, target, out);
    if is_residual {
        residual_finding(
            snap,
            g,
            place,
            used,
            l.live_charged,
            residual,
            &hidden,
            target,
            out,
        );
    }
    if unexplained {
        for &pid in &hidden {
            out.push(Draft {
                kind: FindingKind::HiddenHolder,
                severity: Severity::Leak,
                gpu: Some(g.index),
                pid: Some(pid),
                bytes: (hidden.len() == 1).then_some(residual),
                detail: format!(
                    "{} has {place} open but NVML does not list it: the likely owner of the {} no live listed process accounts for",
                    who(snap, pid),
                    fmt_bytes(Some(residual))
                ),
                action: format!("kill {pid}"),
                target_pid: Some(pid),
            });
        }
    }
}

fn ghosts(
    snap: &Indexed<'_>,
    g: &Gpu,
    place: &str,
    ghosts: &[(u32, Option<u64>, String)],
    hidden: &[u32],
    target: Option<u32>,
    out: &mut Findings,
) {
    for (pid, bytes, why) in ghosts {
        // Never state an absence that was not observed: name what could not be seen.
        let (holder_txt, fallback) = if !hidden.is_empty() {
            (
                format!("the memory is kept alive by {}", list_pids(snap, hidden)),
                String::new(),
            )
        } else if let Some(blind) = blind_spot(snap) {
            (blind.0, blind.1)
        } else {
            (
                "no live process on this host has the GPU open".to_string(),
                "wait a moment for the driver to free it; if it stays, check containers or reset the GPU"
                    .to_string(),
            )
        };
        let action = match target {
            Some(t) => format!("kill {t}: it holds the context the dead PID created"),
            None => fallback,
        };
        out.push(Draft {
            kind: FindingKind::Ghost,
            severity: Severity::Leak,
            gpu: Some(g.index),
            pid: Some(*pid),
            bytes: *bytes,
            detail: format!(
                "PID {pid} {why}, yet NVML still charges it {} on {place}; {holder_txt}",
                fmt_bytes(*bytes)
            ),
            action,
            target_pid: target,
        });
    }
}

/// What this reading could not see that may hold the memory, and how to see it: (what, action).
pub(super) fn blind_spot(snap: &Indexed<'_>) -> Option<(String, String)> {
    if snap.in_child_pid_namespace {
        return Some((
            "gpusweep runs inside a PID namespace of its own (a container without the host's PIDs), where NVML \
             lists only this namespace's processes (the driver drops the others' PIDs): what holds this memory \
             is outside it, another container's live job or a leftover, and cannot be told apart from here"
                .into(),
            "read the node's serve instead (--node-serve http://NODE:9401, or GPUSWEEP_NODE_SERVE), or run \
             gpusweep on the host"
                .into(),
        ));
    }
    if snap.unreadable_processes > 0 {
        return Some((
            format!(
                "{} processes could not be inspected (not root): the holder may be one of them",
                snap.unreadable_processes
            ),
            "run gpusweep as root to see which process holds the GPU".into(),
        ));
    }
    None
}

#[allow(clippy::too_many_arguments)] // one GPU's whole accounting, computed once by `find`
fn residual_finding(
    snap: &Indexed<'_>,
    g: &Gpu,
    place: &str,
    used: u64,
    live_charged: u64,
    residual: u64,
    hidden: &[u32],
    target: Option<u32>,
    out: &mut Findings,
) {
    let mut detail = format!(
        "{} used on {place} but live listed processes account for {}",
        fmt_bytes(Some(used)),
        fmt_bytes(Some(live_charged))
    );
    let blind = blind_spot(snap);
    if !hidden.is_empty() {
        detail.push_str(&format!("; held by {}", list_pids(snap, hidden)));
    } else if let Some((what, _)) = &blind {
        detail.push_str(&format!("; {what}"));
    }
    let action = if let (true, Some((_, how))) = (hidden.is_empty(), &blind) {
        how.clone()
    } else if hidden.is_empty() {
        "no holder found: if it does not drain, look for processes in containers or reset the GPU"
            .to_string()
    } else {
        format!("sweep GPU {} (kills {})", g.index, super::join_u32(hidden))
    };
    // Inside a child PID namespace NVML cannot list what holds the rest: no leak is observed, only memory.
    let severity = if hidden.is_empty() && snap.in_child_pid_namespace {
        Severity::Warning
    } else {
        Severity::Leak
    };
    out.push(Draft {
        kind: FindingKind::Residual,
        severity,
        gpu: Some(g.index),
        pid: None,
        bytes: Some(residual),
        detail,
        action,
        target_pid: target,
    });
}
