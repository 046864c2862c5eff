//! Findings, one module per kind. Each takes the snapshot and pushes what it finds; `analyze` orders them.

pub mod busy;
pub mod gpu;
pub mod orphan;
pub mod ready;
pub mod shm;
pub mod smem;
pub mod stuck;
pub mod zombie;

use crate::index::Indexed;
use gpusweep_core::model::{FileRef, Finding, FindingKind, Proc, Severity};

/// The parts of a finding every kind fills, for `Findings::push`.
pub struct Draft {
    pub kind: FindingKind,
    pub severity: Severity,
    pub gpu: Option<u32>,
    pub pid: Option<u32>,
    pub bytes: Option<u64>,
    pub detail: String,
    pub action: String,
    pub target_pid: Option<u32>,
}

/// Findings of one host, as they are found.
pub struct Findings {
    host: String,
    pub out: Vec<Finding>,
    /// The MIG instance the findings pushed now are about (set while one instance is judged).
    pub instance: Option<u32>,
}

impl Findings {
    pub fn new(host: &str) -> Findings {
        Findings {
            host: host.to_string(),
            out: Vec::new(),
            instance: None,
        }
    }
    pub fn push(&mut self, d: Draft) {
        self.push_about(d, None);
    }
    /// A finding about a file (a /dev/shm leftover), named with its identity.
    pub fn push_about(&mut self, d: Draft, file: Option<FileRef>) {
        self.out.push(Finding {
            kind: d.kind,
            severity: d.severity,
            host: self.host.clone(),
            gpu: d.gpu,
            pid: d.pid,
            bytes: d.bytes,
            detail: d.detail,
            action: d.action,
            target_pid: d.target_pid,
            gpu_instance: self.instance,
            file,
            confirms_as: None,
        });
    }
}

/// A process's command line, cut for a one-line finding (the details view shows it whole).
pub fn short_cmd(p: &Proc) -> String {
    gpusweep_core::format::truncate(&p.display_cmd(), 60)
}

/// "946 (python3 worker.py)" (with its own PID where it lives in a PID namespace of its own), or the bare PID when the process is not in the snapshot.
pub fn who(snap: &Indexed<'_>, pid: u32) -> String {
    match snap.proc(pid) {
        Some(p) => match p.ns_pid {
            Some(n) => format!("{pid} ({}; pid {n} in its container)", short_cmd(p)),
            None => format!("{pid} ({})", short_cmd(p)),
        },
        None => pid.to_string(),
    }
}

pub(crate) fn list_pids(snap: &Indexed<'_>, pids: &[u32]) -> String {
    pids.iter()
        .map(|&p| who(snap, p))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn join_u32(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}
