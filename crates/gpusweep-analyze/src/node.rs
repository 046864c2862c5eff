//! A host's verdict for a gate: what `check` prints, what `wait` and the prolog refuse on, and what the
//! serve writes to its Kubernetes node. Ok (no GPU memory held by leftovers), a problem (a GPU held by what no
//! live job explains, or one that needs a reset), or unknown (the host or a GPU could not be read, or the
//! reading cannot see whole: never an ok). Pure: one judged reading in, the verdict out.

use super::watch::{blind_proof, judged_by_holders_only};
use gpusweep_core::format::{escape, fmt_bytes};
use gpusweep_core::model::{Finding, GpuState, HostSnapshot, Severity};

/// node-problem-detector's three plugin statuses, which a gate and the node condition share; ordered from
/// best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Gate {
    Ok,
    Problem,
    Unknown,
}

impl Gate {
    /// The plugin protocol's exit status: 0 ok, 1 a problem, 2 unknown.
    pub fn code(self) -> i32 {
        match self {
            Gate::Ok => 0,
            Gate::Problem => 1,
            Gate::Unknown => 2,
        }
    }
}

/// One host's verdict: the gate, its line (escaped; PIDs and a pod's UID, never a pod's name or a command
/// line), and the GPUs not fit for a launch (held by a leftover, needing a reset, or unread).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeVerdict {
    pub gate: Gate,
    pub line: String,
    pub unfit: Vec<u32>,
}

/// The verdict on one judged reading. `load_nvml`: GPUs were to be read (a host none of whose GPUs could be
/// read is then unknown, not judged by holders alone).
pub fn node_verdict(snap: &HostSnapshot, load_nvml: bool) -> NodeVerdict {
    // A host that cannot be read or seen whole is unknown, and unfit whole.
    if let Some(e) = unusable(snap, load_nvml)
        .or_else(|| blind_holders(snap))
        .or_else(|| blind_gate(snap))
    {
        return NodeVerdict {
            gate: Gate::Unknown,
            line: format!("unknown: {e}"),
            unfit: snap.gpus.iter().map(|g| g.index).collect(),
        };
    }
    let (gate, line) = gate_and_line(snap);
    // A clean no node proved is no clean to stake a launch on.
    if let (Gate::Ok, Some(e)) = (gate, blind_proof(snap)) {
        return NodeVerdict {
            gate: Gate::Unknown,
            line: format!("unknown: {e}"),
            unfit: snap.gpus.iter().map(|g| g.index).collect(),
        };
    }
    let mut unfit: Vec<u32> = match gate {
        Gate::Ok => Vec::new(),
        _ => snap
            .gpus
            .iter()
            .filter(|g| {
                matches!(
                    g.state,
                    Some(GpuState::Unknown | GpuState::Error | GpuState::NeedsReset)
                )
            })
            .map(|g| g.index)
            .chain(
                snap.findings
                    .iter()
                    .filter(|f| f.severity == Severity::Leak)
                    .filter_map(|f| f.gpu),
            )
            .collect(),
    };
    unfit.sort_unstable();
    unfit.dedup();
    NodeVerdict { gate, line, unfit }
}

/// Why a host's first reading cannot back a verdict, if it cannot.
pub fn unusable(snap: &HostSnapshot, load_nvml: bool) -> Option<String> {
    if let Some(e) = &snap.error {
        return Some(format!(
            "{}: could not be read: {}",
            escape(&snap.host),
            escape(e)
        ));
    }
    if load_nvml && judged_by_holders_only(snap) {
        return Some(format!(
            "{}: no GPU can be read ({}); no verdict without the driver (--no-nvml judges by holders alone)",
            escape(&snap.host),
            escape(snap.gpu_error.as_deref().unwrap_or("no GPUs"))
        ));
    }
    None
}

/// Why a gate cannot judge a host it does not see whole: a GPU holds memory while the reading sees only its
/// own PID namespace (node-problem-detector without `hostPID`), so who holds it is outside its sight. None
/// where it sees the host, or where every GPU reads clean (that zero was read, whoever else there is).
pub fn blind_gate(snap: &HostSnapshot) -> Option<String> {
    if !snap.in_child_pid_namespace {
        return None;
    }
    let held: Vec<String> = snap
        .gpus
        .iter()
        .filter(|g| g.state != Some(gpusweep_core::model::GpuState::Clean))
        .map(|g| g.index.to_string())
        .collect();
    (!held.is_empty()).then(|| {
        format!(
            "{}: GPU {} not idle, and this reading runs in a PID namespace of its own that cannot see who holds it; run on the host (hostPID) or read the node's serve (--node-serve http://NODE:9401)",
            escape(&snap.host),
            held.join(",")
        )
    })
}

/// Why a gate judging by holders alone (no GPU memory read: `--no-nvml`) cannot judge at all: some
/// processes' descriptors could not be read (not root), or it sees only its own PID namespace. Then no
/// absence of holders was observed, whatever it found.
pub fn blind_holders(snap: &HostSnapshot) -> Option<String> {
    if !judged_by_holders_only(snap) {
        return None;
    }
    let why = if snap.in_child_pid_namespace {
        "it runs in a PID namespace of its own and cannot see the host's processes".to_string()
    } else if snap.lacks(gpusweep_core::model::Feature::OthersProcesses) {
        "its /proc hides other users' processes (hidepid)".to_string()
    } else if snap.unreadable_processes > 0 {
        format!(
            "{} processes' descriptors could not be read (run as root)",
            snap.unreadable_processes
        )
    } else {
        return None;
    };
    Some(format!(
        "{}: judging by GPU holders alone (no GPU memory read), {why}: who holds a GPU cannot be told",
        escape(&snap.host)
    ))
}

/// "GPU 7: 10148 MiB held by 7391 (k8s:3f2a9c1e), ghost": one problem finding in a few words.
fn problem(snap: &HostSnapshot, f: &Finding) -> String {
    let who = f.target_pid.or(f.pid).map(|pid| {
        let job = snap
            .proc(pid)
            .and_then(|p| p.job.as_ref())
            .map(|j| format!(" ({})", escape(&j.short())))
            .unwrap_or_default();
        format!(" by {pid}{job}")
    });
    let gpu = f
        .gpu
        .map_or_else(|| "a GPU".to_string(), |g| format!("GPU {g}"));
    let held = f.bytes.map_or_else(
        || " held".into(),
        |b| format!(" {} held", fmt_bytes(Some(b))),
    );
    format!(
        "{gpu}:{held}{}, {}",
        who.unwrap_or_default(),
        f.kind.as_str()
    )
}

/// The gate and line of a host read and seen whole (`check`'s, the node condition's).
fn gate_and_line(snap: &HostSnapshot) -> (Gate, String) {
    let host = escape(&snap.host);
    // A GPU that could not be judged (its reading failed, its MIG instances unread) is never an OK.
    let unread: Vec<String> = snap
        .gpus
        .iter()
        .filter(|g| matches!(g.state, Some(GpuState::Unknown | GpuState::Error)))
        .map(|g| {
            let why = g
                .error
                .as_deref()
                .or(g.mig_error.as_deref())
                .unwrap_or("not judged");
            format!("GPU {} ({})", g.index, escape(why))
        })
        .collect();
    if !unread.is_empty() {
        return (
            Gate::Unknown,
            format!("unknown: {host}: {} could not be judged", unread.join(", ")),
        );
    }
    // Not ready for a launch whatever its memory says: a problem, with why.
    if let Some(g) = snap
        .gpus
        .iter()
        .find(|g| g.state == Some(GpuState::NeedsReset))
    {
        let why = crate::state::needs_reset(g).unwrap_or_else(|| "as its host judged it".into());
        return (
            Gate::Problem,
            format!("{host}: GPU {} needs a reset: {}", g.index, escape(&why)),
        );
    }
    let leaks: Vec<&Finding> = snap
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Leak)
        .collect();
    if let Some(first) = leaks.first() {
        let more = if leaks.len() > 1 {
            format!(" (+{} more)", leaks.len() - 1)
        } else {
            String::new()
        };
        return (
            Gate::Problem,
            format!("{host}: {}{more}", problem(snap, first)),
        );
    }
    let in_use = snap
        .gpus
        .iter()
        .filter(|g| g.memory.used.is_some_and(|u| u > 0))
        .count();
    (
        Gate::Ok,
        format!(
            "{host}: ok, {} GPU(s), {in_use} in use by live processes, none held by leftovers",
            snap.gpus.len()
        ),
    )
}
