//! Snapshot -> findings. Pure: no I/O, no clock. The words are DESIGN's: ghost, hidden holder, residual,
//! orphan, zombie, shm leftover, smem limit (and not_visible for PIDs another PID namespace owns).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::{Finding, FindingKind, Gpu, HostSnapshot, MIB, Proc, Severity, fmt_bytes};
use crate::smem;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnalyzeOptions {
    /// A GPU at or under this many used bytes, with nothing listed, is clean.
    pub tolerance: u64,
    /// While live processes are listed, used memory beyond what they are charged is normal up to this much
    /// (context overhead is not charged: a real H200 read 19692 MiB used for 19684 MiB charged).
    pub residual_slack: u64,
}

impl Default for AnalyzeOptions {
    fn default() -> Self {
        AnalyzeOptions {
            tolerance: 0,
            residual_slack: 256 * MIB,
        }
    }
}

/// How a GPU reads, for the glyphs in every view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuState {
    Clean,
    InUse,
    Leak,
    Unknown,
    Error,
}

impl GpuState {
    pub fn glyph(self) -> &'static str {
        match self {
            GpuState::Clean => "✓",
            GpuState::InUse => "●",
            GpuState::Leak => "!",
            GpuState::Unknown => "?",
            GpuState::Error => "✗",
        }
    }
    pub fn word(self) -> &'static str {
        match self {
            GpuState::Clean => "clean",
            GpuState::InUse => "in use",
            GpuState::Leak => "leak",
            GpuState::Unknown => "N/A",
            GpuState::Error => "error",
        }
    }
}

/// DESIGN's "clean": used at or under the tolerance and nothing listed. `None` when it cannot be told.
pub fn gpu_clean(g: &Gpu, tolerance: u64) -> Option<bool> {
    if g.error.is_some() && g.memory.used.is_none() {
        return None;
    }
    g.memory
        .used
        .map(|u| u <= tolerance && g.processes.is_empty())
}

pub fn gpu_state(snap: &HostSnapshot, g: &Gpu, opts: &AnalyzeOptions) -> GpuState {
    if g.error.is_some() && g.memory.used.is_none() {
        return GpuState::Error;
    }
    match gpu_clean(g, opts.tolerance) {
        None => GpuState::Unknown,
        Some(true) => GpuState::Clean,
        Some(false) => {
            let leaking = snap.findings.iter().any(|f| {
                f.gpu == Some(g.index)
                    && matches!(
                        f.kind,
                        FindingKind::Ghost | FindingKind::Residual | FindingKind::HiddenHolder
                    )
            });
            if leaking {
                GpuState::Leak
            } else {
                GpuState::InUse
            }
        }
    }
}

/// Whether a listed PID is alive as the same process, from what the snapshot can tell.
enum Liveness<'a> {
    Live,
    Gone,
    Zombie,
    /// The PID exists but is another program with no GPU device open: the PID was reused.
    Reused(&'a Proc),
    NotVisible,
}

fn liveness<'a>(snap: &'a HostSnapshot, pid: u32) -> Liveness<'a> {
    match snap.proc(pid) {
        None if snap.in_child_pid_namespace => Liveness::NotVisible,
        None => Liveness::Gone,
        Some(p) if p.state == 'Z' => Liveness::Zombie,
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

impl HostSnapshot {
    /// Whether holders were scanned at all (agentless hosts may not have /proc access).
    pub fn holders_known(&self) -> bool {
        !self.missing_features.iter().any(|f| f == "holders")
    }
}

fn short_cmd(p: &Proc) -> String {
    let c = p.display_cmd();
    if c.chars().count() > 60 {
        format!("{}…", c.chars().take(59).collect::<String>())
    } else {
        c
    }
}

fn who(snap: &HostSnapshot, pid: u32) -> String {
    match snap.proc(pid) {
        Some(p) => format!("{pid} ({})", short_cmd(p)),
        None => pid.to_string(),
    }
}

fn list_pids(snap: &HostSnapshot, pids: &[u32]) -> String {
    pids.iter()
        .map(|&p| who(snap, p))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every finding for one host, in a stable order (by severity, then GPU, then kind, then pid).
pub fn analyze(snap: &HostSnapshot, opts: &AnalyzeOptions) -> Vec<Finding> {
    let host = snap.host.clone();
    let mut out: Vec<Finding> = Vec::new();
    let mk =
        |kind, severity, gpu, pid, bytes, detail: String, action: String, target_pid| Finding {
            kind,
            severity,
            host: host.clone(),
            gpu,
            pid,
            bytes,
            detail,
            action,
            target_pid,
        };

    for g in &snap.gpus {
        let Some(used) = g.memory.used else { continue };
        let mut live_charged: u64 = 0;
        let mut live_listed = 0usize;
        let mut ghosts: Vec<(u32, Option<u64>, String)> = Vec::new();
        for lp in &g.processes {
            match liveness(snap, lp.pid) {
                Liveness::Live => {
                    live_listed += 1;
                    live_charged += lp.used_bytes.unwrap_or(0);
                }
                Liveness::NotVisible => {
                    live_listed += 1;
                    live_charged += lp.used_bytes.unwrap_or(0);
                    out.push(mk(
                        FindingKind::NotVisible,
                        Severity::Info,
                        Some(g.index),
                        Some(lp.pid),
                        lp.used_bytes,
                        format!(
                            "NVML lists PID {} on GPU {} ({}), but it is not visible from this PID namespace",
                            lp.pid,
                            g.index,
                            fmt_bytes(lp.used_bytes)
                        ),
                        "run gpusweep on the host (outside the container) to see and act on it".into(),
                        None,
                    ));
                }
                Liveness::Gone => ghosts.push((lp.pid, lp.used_bytes, "is gone".into())),
                Liveness::Zombie => ghosts.push((lp.pid, lp.used_bytes, "is a zombie".into())),
                Liveness::Reused(p) => ghosts.push((
                    lp.pid,
                    lp.used_bytes,
                    format!(
                        "is now another program ({}) with no GPU open: the PID was reused",
                        short_cmd(p)
                    ),
                )),
            }
        }
        let residual = used.saturating_sub(live_charged);
        let is_residual =
            residual > opts.tolerance && (live_listed == 0 || residual > opts.residual_slack);
        // Holders of this GPU that NVML does not list: the usual owners of memory nobody is charged for.
        let hidden: Vec<u32> = snap
            .holders
            .iter()
            .filter(|h| !h.benign && h.gpus.contains(&g.index))
            .filter(|h| !g.processes.iter().any(|p| p.pid == h.pid))
            .filter(|h| snap.proc(h.pid).is_some_and(|p| p.state != 'Z'))
            .map(|h| h.pid)
            .collect();
        let unexplained = is_residual || !ghosts.is_empty();
        let target = if unexplained {
            hidden.first().copied()
        } else {
            None
        };

        for (pid, bytes, why) in &ghosts {
            let holder_txt = if hidden.is_empty() {
                "no live process on this host has the GPU open".to_string()
            } else {
                format!("the memory is kept alive by {}", list_pids(snap, &hidden))
            };
            let action = match target {
                Some(t) => format!("kill {t}: it holds the context the dead PID created"),
                None => "wait a moment for the driver to free it; if it stays, check containers or reset the GPU".into(),
            };
            out.push(mk(
                FindingKind::Ghost,
                Severity::Leak,
                Some(g.index),
                Some(*pid),
                *bytes,
                format!(
                    "PID {pid} {why}, yet NVML still charges it {} on GPU {}; {holder_txt}",
                    fmt_bytes(*bytes),
                    g.index
                ),
                action,
                target,
            ));
        }
        if is_residual {
            let mut detail = format!(
                "{} used on GPU {} but live listed processes account for {}",
                fmt_bytes(Some(used)),
                g.index,
                fmt_bytes(Some(live_charged))
            );
            if !hidden.is_empty() {
                detail.push_str(&format!("; held by {}", list_pids(snap, &hidden)));
            } else if snap.unreadable_processes > 0 {
                detail.push_str(&format!(
                    "; {} processes could not be inspected (run as root to see them)",
                    snap.unreadable_processes
                ));
            }
            let action = if hidden.is_empty() {
                "no holder found: if it does not drain, look for processes in containers or reset the GPU".to_string()
            } else {
                format!(
                    "sweep GPU {} (kills {})",
                    g.index,
                    hidden
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            out.push(mk(
                FindingKind::Residual,
                Severity::Leak,
                Some(g.index),
                None,
                Some(residual),
                detail,
                action,
                target,
            ));
        }
        if unexplained {
            for &pid in &hidden {
                let bytes = if hidden.len() == 1 {
                    Some(residual)
                } else {
                    None
                };
                out.push(mk(
                    FindingKind::HiddenHolder,
                    Severity::Leak,
                    Some(g.index),
                    Some(pid),
                    bytes,
                    format!(
                        "{} has GPU {} open but NVML does not list it: the likely owner of the {} no live listed process accounts for",
                        who(snap, pid),
                        g.index,
                        fmt_bytes(Some(residual))
                    ),
                    format!("kill {pid}"),
                    Some(pid),
                ));
            }
        }
    }

    // Orphans: holders reparented to PID 1 (or a subreaper) that are not daemons (session leaders).
    for h in snap.holders.iter().filter(|h| !h.benign) {
        let Some(p) = snap.proc(h.pid) else { continue };
        if p.state == 'Z' || p.sid == p.pid {
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
        out.push(mk(
            FindingKind::Orphan,
            Severity::Warning,
            h.gpus.first().copied(),
            Some(h.pid),
            None,
            format!(
                "{} holds {gpus} and its launcher is gone: reparented to PID {}",
                who(snap, h.pid),
                p.ppid
            ),
            format!("kill {} if its job is over", h.pid),
            Some(h.pid),
        ));
    }

    for &z in &snap.zombies {
        let Some(p) = snap.proc(z) else { continue };
        let (detail_parent, action, target) = if p.ppid <= 1 {
            (
                "PID 1 will reap it".to_string(),
                "nothing to do: init reaps it".to_string(),
                None,
            )
        } else {
            (
                format!("its parent {} never reaped it", who(snap, p.ppid)),
                format!(
                    "make {} wait() for its child, or end it; killing a zombie does nothing",
                    p.ppid
                ),
                Some(p.ppid),
            )
        };
        out.push(mk(
            FindingKind::Zombie,
            Severity::Warning,
            None,
            Some(z),
            None,
            format!(
                "{z} ({}) is a zombie: it holds no GPU memory, but {detail_parent}",
                p.comm
            ),
            action,
            target,
        ));
    }

    if let Some(shm) = &snap.shm {
        for s in &shm.segments {
            if s.users.as_ref().is_some_and(|u| u.is_empty()) {
                let age = s
                    .age_s
                    .map(|a| format!(", {} old", crate::watch::fmt_secs(a)))
                    .unwrap_or_default();
                out.push(mk(
                    FindingKind::ShmLeftover,
                    Severity::Warning,
                    None,
                    None,
                    Some(s.bytes),
                    format!(
                        "/dev/shm/{} ({}{age}) is open or mapped by no live process",
                        s.name,
                        fmt_bytes(Some(s.bytes))
                    ),
                    format!("rm /dev/shm/{}", s.name),
                    None,
                ));
            }
        }
    }

    // One note per compute capability whose per-block shared memory is below Hopper's.
    let mut by_cc: BTreeMap<String, Vec<&Gpu>> = BTreeMap::new();
    for g in &snap.gpus {
        if let Some(cc) = &g.compute_capability {
            by_cc.entry(cc.clone()).or_default().push(g);
        }
    }
    for (cc, gpus) in by_cc {
        let Some(l) = smem::limits(&cc) else { continue };
        if l.per_block_optin >= smem::HOPPER_PER_BLOCK {
            continue;
        }
        let name = gpus[0].name.clone().unwrap_or_else(|| "GPU".into());
        let idx = gpus
            .iter()
            .map(|g| g.index.to_string())
            .collect::<Vec<_>>()
            .join(",");
        out.push(mk(
            FindingKind::SmemLimit,
            Severity::Info,
            None,
            None,
            Some(l.per_block_optin as u64),
            format!(
                "GPU {idx} ({name}, CC {cc}): {} KB shared memory per block, against 227 KB on H100/H200; tiles tuned for Hopper may not fit",
                l.per_block_optin / 1024
            ),
            format!("check kernel tiles with `gpusweep smem --cc {cc} --tile MxNxK`"),
            None,
        ));
    }

    out.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(a.gpu.cmp(&b.gpu))
            .then(a.kind.cmp(&b.kind))
            .then(a.pid.cmp(&b.pid))
    });
    out
}

/// The snapshot with its findings filled in.
pub fn analyzed(mut snap: HostSnapshot, opts: &AnalyzeOptions) -> HostSnapshot {
    snap.findings = analyze(&snap, opts);
    snap
}
