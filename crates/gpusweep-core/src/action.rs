//! What a front end asks a host to do, and what the host answers: one request/answer pair for every action
//! (send a signal, remove /dev/shm leftovers, and whatever comes next), so each layer carries one path, not a
//! twin per action. The agent protocol keeps its older wire names (`signal`/`outcomes`, `remove`/`removals`);
//! `core::protocol` converts at the wire.

use super::removal::{RemovalOutcome, RemovalRequest};
use super::signal::{Outcome, SignalRequest};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionRequest {
    Signal(SignalRequest),
    Remove(RemovalRequest),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionAnswer {
    Signal(Vec<Outcome>),
    Remove(Vec<RemovalOutcome>),
}

pub use super::signal::Purpose;

impl ActionRequest {
    /// The answer of a request that will not be carried out: every target or file failed, for `why`.
    pub fn refuse(&self, why: &str) -> ActionAnswer {
        match self {
            ActionRequest::Signal(r) => ActionAnswer::Signal(super::signal::all_failed(r, why)),
            ActionRequest::Remove(r) => ActionAnswer::Remove(super::removal::all_failed(r, why)),
        }
    }

    /// How long the host may take beyond its answer's own work: a signal's grace period.
    pub fn grace_ms(&self) -> u64 {
        match self {
            ActionRequest::Signal(r) => r.grace_ms.unwrap_or(0),
            ActionRequest::Remove(_) => 0,
        }
    }

    /// Its kind in words, for status lines ("TERM 7306", "remove").
    pub fn name(&self) -> String {
        match self {
            ActionRequest::Signal(r) => {
                let pids: Vec<String> = r.targets.iter().map(|t| t.pid.to_string()).collect();
                format!("{} {}", r.signal.name(), pids.join(","))
            }
            ActionRequest::Remove(r) => format!("remove {} /dev/shm file(s)", r.files.len()),
        }
    }
}

impl ActionAnswer {
    /// How many targets or files it failed for.
    pub fn failures(&self) -> usize {
        match self {
            ActionAnswer::Signal(o) => o.iter().filter(|o| o.failed()).count(),
            ActionAnswer::Remove(o) => o.iter().filter(|o| o.failed()).count(),
        }
    }

    /// One line per target or file, for people.
    pub fn lines(&self) -> Vec<String> {
        match self {
            ActionAnswer::Signal(o) => o.iter().map(Outcome::describe).collect(),
            ActionAnswer::Remove(o) => o.iter().map(RemovalOutcome::describe).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::removal::ShmFile;
    use crate::signal::{Sig, TargetInfo};

    #[test]
    fn a_refused_request_fails_every_target_and_file() {
        let sig = ActionRequest::Signal(SignalRequest {
            targets: vec![
                TargetInfo {
                    pid: 7,
                    start_time: 1,
                    cmdline: "a".into(),
                    pidfs_ino: None,
                },
                TargetInfo {
                    pid: 8,
                    start_time: 2,
                    cmdline: "b".into(),
                    pidfs_ino: None,
                },
            ],
            signal: Sig::Term,
            grace_ms: Some(500),
            purpose: None,
        });
        let a = sig.refuse("host is down");
        assert_eq!(a.failures(), 2);
        assert!(a.lines().iter().all(|l| l.contains("host is down")));
        assert_eq!(sig.grace_ms(), 500);
        assert_eq!(sig.name(), "TERM 7,8");
        let rm = ActionRequest::Remove(RemovalRequest {
            files: vec![ShmFile {
                name: "nccl-1".into(),
                dev: 1,
                ino: 2,
                bytes: 3,
                pod_volume: None,
            }],
        });
        assert_eq!(rm.refuse("no").failures(), 1);
        assert_eq!(rm.grace_ms(), 0);
    }
}
