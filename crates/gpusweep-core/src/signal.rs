//! Signal requests and their outcomes: what a front end asks for, what `act` (or an agent) reports back.
//! A target is (pid, start time): a PID is never signalled without the start time it had when chosen.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::format::{escape, truncate};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Sig {
    Term,
    Kill,
    Int,
    Hup,
    Quit,
    Usr1,
    Usr2,
    Cont,
    Stop,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UnknownSignal {
    #[error(
        "unknown signal {0:?} (use TERM, KILL, INT, HUP, QUIT, USR1, USR2, CONT, STOP or their numbers)"
    )]
    Name(String),
    #[error(
        "signal {0} is out of range: Linux signals are 1 to 64 (TERM is 15, KILL 9, INT 2, HUP 1)"
    )]
    OutOfRange(i64),
    #[error(
        "signal {0} is not one gpusweep sends (TERM 15, KILL 9, INT 2, HUP 1, QUIT 3, USR1 10, USR2 12, CONT 18, STOP 19)"
    )]
    NotSent(i64),
}

impl Sig {
    pub const ALL: [Sig; 9] = [
        Sig::Term,
        Sig::Kill,
        Sig::Int,
        Sig::Hup,
        Sig::Quit,
        Sig::Usr1,
        Sig::Usr2,
        Sig::Cont,
        Sig::Stop,
    ];
    pub fn number(self) -> i32 {
        match self {
            Sig::Term => libc::SIGTERM,
            Sig::Kill => libc::SIGKILL,
            Sig::Int => libc::SIGINT,
            Sig::Hup => libc::SIGHUP,
            Sig::Quit => libc::SIGQUIT,
            Sig::Usr1 => libc::SIGUSR1,
            Sig::Usr2 => libc::SIGUSR2,
            Sig::Cont => libc::SIGCONT,
            Sig::Stop => libc::SIGSTOP,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Sig::Term => "TERM",
            Sig::Kill => "KILL",
            Sig::Int => "INT",
            Sig::Hup => "HUP",
            Sig::Quit => "QUIT",
            Sig::Usr1 => "USR1",
            Sig::Usr2 => "USR2",
            Sig::Cont => "CONT",
            Sig::Stop => "STOP",
        }
    }
    /// Whether the default action of this signal ends a process.
    pub fn ends(self) -> bool {
        matches!(
            self,
            Sig::Term | Sig::Kill | Sig::Int | Sig::Hup | Sig::Quit
        )
    }
}

impl std::str::FromStr for Sig {
    type Err = UnknownSignal;
    /// "TERM", "SIGTERM", "term" or "15".
    fn from_str(s: &str) -> Result<Sig, UnknownSignal> {
        let u = s.trim().to_ascii_uppercase();
        let u = u.strip_prefix("SIG").unwrap_or(&u);
        if let Ok(n) = u.parse::<i64>() {
            return Sig::ALL
                .into_iter()
                .find(|g| i64::from(g.number()) == n)
                .ok_or(if (1..=64).contains(&n) {
                    UnknownSignal::NotSent(n)
                } else {
                    UnknownSignal::OutOfRange(n)
                });
        }
        Sig::ALL
            .into_iter()
            .find(|g| g.name() == u)
            .ok_or_else(|| UnknownSignal::Name(s.to_string()))
    }
}

/// One process to signal, as it was when it was chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetInfo {
    pub pid: u32,
    pub start_time: u64,
    /// For people only: the audit log records what `/proc` says at the moment of the signal.
    #[serde(default)]
    pub cmdline: String,
    /// The pidfs inode when it was chosen (Linux 6.9+): checked against the pidfd opened to signal it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pidfs_ino: Option<u64>,
}

impl TargetInfo {
    /// The identity of `p` as a reading showed it.
    pub fn of(p: &super::model::Proc) -> TargetInfo {
        TargetInfo {
            pid: p.pid,
            start_time: p.start_time,
            cmdline: p.display_cmd(),
            pidfs_ino: p.pidfs_ino,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalRequest {
    pub targets: Vec<TargetInfo>,
    pub signal: Sig,
    /// Wait this long for the targets to exit, then KILL the survivors. `None`: send once, do not wait.
    pub grace_ms: Option<u64>,
    /// Why it was sent (a kill, a sweep, an epilog), for the host's timeline; older agents ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purpose: Option<Purpose>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Fate {
    /// Exited after the named signal.
    Exited { signal: Sig, after_ms: u64 },
    /// Signal delivered; nobody waited for it to exit.
    Signalled { signal: Sig },
    /// Still running after KILL and the wait that followed, not in state D.
    Survived,
    /// Still there after KILL because it sleeps uninterruptibly (state D) in the kernel, at `wchan`: the
    /// KILL stays pending until that I/O returns (a hung NFS or FUSE read, a wedged driver, a frozen cgroup).
    Uninterruptible { wchan: Option<String> },
    /// Gone before anything was sent.
    AlreadyGone,
    /// Not signalled on purpose (PID 1, ourselves, an ancestor, a reused PID).
    Refused { reason: String },
    /// Signalling failed (permissions).
    Failed { reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub pid: u32,
    pub start_time: u64,
    pub cmdline: String,
    pub fate: Fate,
}

impl Outcome {
    /// A target's outcome before anything happened to it.
    pub fn of(t: &TargetInfo, fate: Fate) -> Outcome {
        Outcome {
            pid: t.pid,
            start_time: t.start_time,
            cmdline: t.cmdline.clone(),
            fate,
        }
    }
    pub fn describe(&self) -> String {
        let what = match &self.fate {
            Fate::Exited { signal, after_ms } => {
                format!("exited after {} ({} ms)", signal.name(), after_ms)
            }
            Fate::Signalled { signal } => format!("sent {}", signal.name()),
            Fate::Survived => "still running after KILL".into(),
            Fate::Uninterruptible { wchan } => format!(
                "cannot die yet: in state D (uninterruptible{}); KILL is pending until that I/O returns",
                wchan
                    .as_deref()
                    .map(|w| format!(", waiting in {}", escape(w)))
                    .unwrap_or_default()
            ),
            Fate::AlreadyGone => "already gone".into(),
            Fate::Refused { reason } => format!("refused: {}", escape(reason)),
            Fate::Failed { reason } => format!("failed: {}", escape(reason)),
        };
        format!(
            "{} {}: {what}",
            self.pid,
            truncate(&escape(&self.cmdline), 50)
        )
    }
    pub fn ok(&self) -> bool {
        matches!(
            self.fate,
            Fate::Exited { .. } | Fate::Signalled { .. } | Fate::AlreadyGone
        )
    }
    /// A target that was not dealt with: refused, failed, or still running.
    pub fn failed(&self) -> bool {
        matches!(
            self.fate,
            Fate::Refused { .. }
                | Fate::Failed { .. }
                | Fate::Survived
                | Fate::Uninterruptible { .. }
        )
    }
}

/// Outcomes for a request that could not be carried out at all.
pub fn all_failed(req: &SignalRequest, reason: &str) -> Vec<Outcome> {
    req.targets
        .iter()
        .map(|t| {
            Outcome::of(
                t,
                Fate::Failed {
                    reason: reason.to_string(),
                },
            )
        })
        .collect()
}

/// PIDs never offered for signals on a host. One rule: PID 0/1 everywhere; on this host also gpusweep and its
/// ancestors (`act::protect` builds that set). Plans and dialogs consult it; delivery checks again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protected {
    pids: HashSet<u32>,
    own: Option<u32>,
}

impl Default for Protected {
    fn default() -> Self {
        Protected::remote()
    }
}

impl Protected {
    /// What is known to be protected on another host: PID 0 and 1 (its agent guards the rest).
    pub fn remote() -> Protected {
        Protected {
            pids: HashSet::from([0, 1]),
            own: None,
        }
    }
    /// PID 1, `own` (this process) and `ancestors`.
    pub fn local(own: u32, ancestors: impl IntoIterator<Item = u32>) -> Protected {
        let mut pids = HashSet::from([0, 1, own]);
        pids.extend(ancestors);
        Protected {
            pids,
            own: Some(own),
        }
    }
    pub fn contains(&self, pid: u32) -> bool {
        pid <= 1 || self.pids.contains(&pid)
    }
    /// Why `pid` is protected, for a refusal; `None` when it is not.
    pub fn reason(&self, pid: u32) -> Option<String> {
        if !self.contains(pid) {
            return None;
        }
        let who = if pid <= 1 {
            "PID 1"
        } else if Some(pid) == self.own {
            "gpusweep itself"
        } else {
            "an ancestor of gpusweep"
        };
        Some(format!("{who} is never signalled"))
    }
}

/// Why a signal was sent, for the timeline (`signal_sent`'s `what`). Carried on the wire as an optional
/// field older agents ignore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    Kill,
    Sweep,
    /// The Slurm epilog ending a job's leftovers.
    Epilog,
    /// `gpusweep run` ending what its job left.
    Run,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Kill => "kill",
            Purpose::Sweep => "sweep",
            Purpose::Epilog => "epilog",
            Purpose::Run => "run",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_parse_by_name_and_number() {
        assert_eq!("term".parse::<Sig>(), Ok(Sig::Term));
        assert_eq!("SIGKILL".parse::<Sig>(), Ok(Sig::Kill));
        assert_eq!("9".parse::<Sig>(), Ok(Sig::Kill));
        assert_eq!(
            "99".parse::<Sig>(),
            Err(UnknownSignal::OutOfRange(99)),
            "a number past 64 says the range"
        );
        assert!(
            UnknownSignal::OutOfRange(-3)
                .to_string()
                .contains("1 to 64")
        );
        assert_eq!("17".parse::<Sig>(), Err(UnknownSignal::NotSent(17)));
        assert_eq!("0".parse::<Sig>(), Err(UnknownSignal::OutOfRange(0)));
        assert!(matches!("BOOM".parse::<Sig>(), Err(UnknownSignal::Name(_))));
    }

    #[test]
    fn one_protection_rule() {
        let p = Protected::local(500, [400, 300]);
        assert!(p.contains(1) && p.contains(0) && p.contains(500) && p.contains(300));
        assert!(!p.contains(501));
        assert_eq!(p.reason(1).as_deref(), Some("PID 1 is never signalled"));
        assert_eq!(
            p.reason(500).as_deref(),
            Some("gpusweep itself is never signalled")
        );
        assert_eq!(
            p.reason(400).as_deref(),
            Some("an ancestor of gpusweep is never signalled")
        );
        assert!(Protected::remote().contains(1) && !Protected::remote().contains(2));
    }
}
