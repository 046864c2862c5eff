//! What happened, in order: a process appeared or exited, a finding appeared or cleared, a signal was sent and
//! what became of it, a GPU became clean, a host went down or came back. The TUI's timeline shows them and
//! `--events FILE` writes them as JSON lines, one object each, so a session can be replayed or attached to a
//! bug report. Fields are only ever added.

use serde::{Deserialize, Serialize};

use super::format::{escape, fmt_bytes, fmt_gpus, fmt_ms, fmt_span};
use super::job::{LostHow, Phase};
use super::model::{FindingKind, Severity};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Unix time, milliseconds.
    pub at_ms: u64,
    pub host: String,
    #[serde(flatten)]
    pub what: EventKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    /// A process started holding a GPU or being listed on one.
    ProcessAppeared {
        pid: u32,
        cmdline: String,
        gpus: Vec<u32>,
        /// What NVML charges it, when it is listed with a known amount.
        gpu_bytes: Option<u64>,
    },
    /// A process that held or was listed on a GPU is gone from both.
    ProcessExited {
        pid: u32,
        cmdline: String,
        gpus: Vec<u32>,
        /// What NVML charged it in the last reading that listed it.
        gpu_bytes: Option<u64>,
    },
    FindingAppeared {
        kind: FindingKind,
        severity: Severity,
        gpu: Option<u32>,
        pid: Option<u32>,
        detail: String,
    },
    FindingCleared {
        kind: FindingKind,
        gpu: Option<u32>,
        pid: Option<u32>,
        detail: String,
    },
    /// A signal request the operator confirmed.
    SignalSent {
        signal: String,
        pids: Vec<u32>,
        /// "kill", "sweep".
        what: String,
    },
    /// What became of one target of a signal request.
    SignalFate {
        pid: u32,
        fate: String,
        ok: bool,
    },
    /// A GPU that held memory reads clean. `after_ms`: since the first signal sent to what held it (its
    /// holders, or a launcher of theirs), when one was; `after_exit_ms`: since the last of its holders died.
    GpuClean {
        gpu: u32,
        after_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after_exit_ms: Option<u64>,
    },
    /// Every GPU in `scope` reads zero: a host after signals were sent to it (`after_ms` since the first
    /// one that could free a GPU), or a watch's scope in the TUI.
    AllClean {
        scope: String,
        after_ms: u64,
    },
    ShmRemoved {
        name: String,
        result: String,
        ok: bool,
    },
    HostDown {
        reason: String,
    },
    HostUp {
        first: bool,
    },
    /// A job's first GPU process was seen (`job` as `--job` takes it, or `tree:PID`).
    JobStarted {
        job: String,
        name: String,
        ranks: usize,
        gpus: Vec<u32>,
    },
    /// A job changed phase; `after_ms`: how long it was in the one before. `warmup_ms` when it settled after
    /// being seen loading: from its start to when its memory stopped rising.
    JobPhase {
        job: String,
        phase: Phase,
        after_ms: u64,
        bytes: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        warmup_ms: Option<u64>,
    },
    /// A rank ended while its peers still hold GPU memory.
    RankLost {
        job: String,
        pid: u32,
        gpus: Vec<u32>,
        how: LostHow,
        /// Ranks left alive, and what they hold.
        left: usize,
        left_bytes: Option<u64>,
    },
    /// No GPU process of the job is left on this host.
    JobEnded {
        job: String,
        lived_ms: u64,
    },
}

impl Event {
    /// One line for people, escaped (cmdlines and details come from the host).
    pub fn describe(&self) -> String {
        match &self.what {
            EventKind::ProcessAppeared {
                pid,
                cmdline,
                gpus,
                gpu_bytes,
            } => format!(
                "+ process {pid} on GPU {}{}: {}",
                fmt_gpus(gpus),
                gpu_bytes
                    .map(|b| format!(", {}", fmt_bytes(Some(b))))
                    .unwrap_or_default(),
                escape(cmdline)
            ),
            EventKind::ProcessExited {
                pid,
                cmdline,
                gpus,
                gpu_bytes,
            } => format!(
                "- process {pid} exited from GPU {}{}: {}",
                fmt_gpus(gpus),
                gpu_bytes
                    .map(|b| format!(" (held {})", fmt_bytes(Some(b))))
                    .unwrap_or_default(),
                escape(cmdline)
            ),
            EventKind::FindingAppeared { kind, detail, .. } => {
                format!("! {}: {}", kind.as_str(), escape(detail))
            }
            EventKind::FindingCleared { kind, detail, .. } => {
                format!("✓ cleared {}: {}", kind.as_str(), escape(detail))
            }
            EventKind::SignalSent { signal, pids, what } => format!(
                "→ {what}: {signal} to {}",
                pids.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            EventKind::SignalFate { fate, .. } => format!("← {}", escape(fate)),
            EventKind::GpuClean {
                gpu,
                after_ms,
                after_exit_ms,
            } => match (after_ms, after_exit_ms) {
                (Some(ms), _) => format!(
                    "✓ GPU {gpu} reads clean, {} after the first signal",
                    fmt_ms(*ms)
                ),
                (None, Some(ms)) => format!(
                    "✓ GPU {gpu} reads clean, {} after its last holder ended",
                    fmt_ms(*ms)
                ),
                (None, None) => format!("✓ GPU {gpu} reads clean"),
            },
            EventKind::AllClean { scope, after_ms } => {
                format!("✓ {}: all zero after {}", escape(scope), fmt_ms(*after_ms))
            }
            EventKind::ShmRemoved { result, .. } => format!("rm {}", escape(result)),
            EventKind::HostDown { reason } => format!("✗ host down: {}", escape(reason)),
            EventKind::HostUp { first: true } => "host up: first reading".to_string(),
            EventKind::HostUp { first: false } => "host back up".to_string(),
            EventKind::JobStarted { .. }
            | EventKind::JobPhase { .. }
            | EventKind::RankLost { .. }
            | EventKind::JobEnded { .. } => self.describe_job(),
        }
    }

    /// A job's event, for people.
    fn describe_job(&self) -> String {
        match &self.what {
            EventKind::JobStarted {
                job,
                name,
                ranks,
                gpus,
            } => format!(
                "+ job {} on GPU {}: {ranks} process(es), {}",
                escape(job),
                fmt_gpus(gpus),
                escape(name)
            ),
            EventKind::JobPhase {
                job,
                phase,
                after_ms,
                bytes,
                warmup_ms,
            } => {
                let held = bytes.map(|b| format!(" at {}", fmt_bytes(Some(b))));
                match (phase, warmup_ms) {
                    (Phase::Settled, Some(w)) => format!(
                        "= job {} settled{} after a {} warm-up",
                        escape(job),
                        held.unwrap_or_default(),
                        fmt_span(*w)
                    ),
                    _ => format!(
                        "~ job {} now {}{}, after {} in its phase before",
                        escape(job),
                        phase.as_str(),
                        held.unwrap_or_default(),
                        fmt_span(*after_ms)
                    ),
                }
            }
            EventKind::RankLost {
                job,
                pid,
                gpus,
                how,
                left,
                left_bytes,
            } => format!(
                "✗ job {}: rank {pid} on GPU {} {}; {left} rank(s) left holding {}",
                escape(job),
                fmt_gpus(gpus),
                how.describe(),
                fmt_bytes(*left_bytes)
            ),
            EventKind::JobEnded { job, lived_ms } => {
                format!("- job {} ended after {}", escape(job), fmt_span(*lived_ms))
            }
            _ => String::new(),
        }
    }

    /// Whether it reports something wrong (drawn in red).
    pub fn bad(&self) -> bool {
        match &self.what {
            EventKind::FindingAppeared { severity, .. } => *severity == Severity::Leak,
            EventKind::SignalFate { ok, .. } | EventKind::ShmRemoved { ok, .. } => !ok,
            EventKind::HostDown { .. } | EventKind::RankLost { .. } => true,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_json_lines_with_a_tag_and_escaped_for_people() {
        let e = Event {
            at_ms: 5,
            host: "gpu-b".into(),
            what: EventKind::ProcessExited {
                pid: 7,
                cmdline: "evil\x1b[2J".into(),
                gpus: vec![0, 1, 2, 3],
                gpu_bytes: Some(1 << 30),
            },
        };
        let j = serde_json::to_string(&e).expect("json");
        assert!(j.contains(r#""event":"process_exited""#), "{j}");
        assert!(j.contains(r#""host":"gpu-b""#), "{j}");
        let back: Event = serde_json::from_str(&j).expect("back");
        assert_eq!(back, e);
        let d = e.describe();
        assert!(!d.contains('\x1b'), "{d}");
        assert!(d.contains("GPU 0-3") && d.contains("1024 MiB"), "{d}");
    }
}
