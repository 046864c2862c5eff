//! Safe signal delivery on this host.
//!
//! A target is (pid, start time). Delivery opens a pidfd first, then re-reads the start time: if the PID now
//! names another process, nothing is sent. The signal goes through the pidfd, so it cannot reach a process
//! that took the PID after the check. PID 1, gpusweep itself and its ancestors are never signalled. Every
//! signal is recorded in the audit log (one write, synced) before it is sent.

use std::fs;
use std::time::{Duration, Instant};

use super::audit::AuditLog;
use super::pidfd::{PidFd, wait_exits};
use super::protect;
use crate::core::format::millis;
use crate::core::procstat::{parse_cmdline, parse_stat};
use crate::core::signal::{Fate, Outcome, Protected, Sig, SignalRequest, TargetInfo};

/// How long a process may take to vanish after KILL before it is reported as stuck in the kernel.
const AFTER_KILL: Duration = Duration::from_secs(5);

/// The start time `/proc` shows now. `Ok(None)` only when the process is gone (ENOENT/ESRCH); any other
/// failure (out of file descriptors, a permission) is an error, never "gone".
fn start_time_now(pid: u32) -> std::io::Result<Option<u64>> {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => Ok(parse_stat(&s).map(|p| p.start_time)),
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ESRCH) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn describe_errno(e: &std::io::Error, pid: u32) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) => {
            format!("permission denied: {pid} belongs to another user (run as that user or root)")
        }
        Some(libc::ESRCH) => "no such process".into(),
        _ => e.to_string(),
    }
}

/// A target that passed every check and was signalled: its pidfd and where its outcome sits.
struct Live {
    slot: usize,
    fd: PidFd,
    target: TargetInfo,
}

/// Pin the target with a pidfd and check that it is still the process that was chosen.
fn pin(t: &TargetInfo, protected: &Protected) -> Result<(PidFd, TargetInfo), Fate> {
    if let Some(reason) = protected.reason(t.pid) {
        return Err(Fate::Refused { reason });
    }
    let fd = match PidFd::open(t.pid) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Err(Fate::AlreadyGone),
        Err(e) => {
            return Err(Fate::Failed {
                reason: format!("pidfd_open: {}", describe_errno(&e, t.pid)),
            });
        }
    };
    // The pidfd pins this process; now make sure it is the one that was chosen.
    match start_time_now(t.pid) {
        Err(e) => {
            return Err(Fate::Failed {
                reason: format!("reading /proc/{}/stat: {e}", t.pid),
            });
        }
        Ok(None) => return Err(Fate::AlreadyGone),
        Ok(Some(st)) if st != t.start_time => {
            return Err(Fate::Refused {
                reason: format!(
                    "PID reused: it started at tick {st}, the target at {}",
                    t.start_time
                ),
            });
        }
        Ok(Some(_)) => {}
    }
    // The record names what /proc says now, never what a client sent.
    let mut t = t.clone();
    t.cmdline = fs::read(format!("/proc/{}/cmdline", t.pid))
        .map(|raw| parse_cmdline(&raw))
        .unwrap_or_default();
    Ok((fd, t))
}

/// Record, then send one signal. `Ok` when it was delivered. No record, no signal.
fn send(host: &str, fd: &PidFd, t: &TargetInfo, sig: Sig, audit: &AuditLog) -> Result<(), Fate> {
    if let Err(e) = audit.record(host, t, sig, "sending") {
        return Err(Fate::Refused {
            reason: format!("not signalled: {e}"),
        });
    }
    let sent = fd.send(sig);
    if let Err(e) = &sent {
        // The attempt is on record; what became of it is worth a line too, but it is not required.
        let _ = audit.record(
            host,
            t,
            sig,
            &format!("failed: {}", describe_errno(e, t.pid)),
        );
    }
    match sent {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Err(Fate::AlreadyGone),
        Err(e) => Err(Fate::Failed {
            reason: describe_errno(&e, t.pid),
        }),
    }
}

/// Signal `req.targets` on this host, safely. With a grace period: wait for exits, KILL the survivors.
pub fn deliver(host: &str, req: &SignalRequest, audit: &AuditLog) -> Vec<Outcome> {
    let protected = protect::this_host();
    // No signal without a record of it.
    if let Err(e) = audit.open() {
        let reason = e.to_string();
        return req
            .targets
            .iter()
            .map(|t| {
                Outcome::of(
                    t,
                    Fate::Refused {
                        reason: reason.clone(),
                    },
                )
            })
            .collect();
    }
    let started = Instant::now();
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut live: Vec<Live> = Vec::new();
    for t in &req.targets {
        let (fd, t) = match pin(t, &protected) {
            Ok(p) => p,
            Err(fate) => {
                outcomes.push(Outcome::of(t, fate));
                continue;
            }
        };
        match send(host, &fd, &t, req.signal, audit) {
            Ok(()) => {
                outcomes.push(Outcome::of(&t, Fate::Signalled { signal: req.signal }));
                live.push(Live {
                    slot: outcomes.len() - 1,
                    fd,
                    target: t,
                });
            }
            Err(fate) => outcomes.push(Outcome::of(&t, fate)),
        }
    }
    if let Some(grace) = req.grace_ms.map(Duration::from_millis) {
        escalate(
            host,
            req.signal,
            grace,
            &live,
            started,
            audit,
            &mut outcomes,
        );
    }
    outcomes
}

/// Wait out the grace period; KILL whoever is left; report who is stuck even after KILL.
fn escalate(
    host: &str,
    signal: Sig,
    grace: Duration,
    live: &[Live],
    started: Instant,
    audit: &AuditLog,
    outcomes: &mut [Outcome],
) {
    if live.is_empty() {
        return;
    }
    let fds: Vec<&PidFd> = live.iter().map(|l| &l.fd).collect();
    let exited = wait_exits(&fds, Instant::now() + grace);
    let mut survivors = Vec::new();
    for (l, done) in live.iter().zip(exited) {
        let fate = &mut outcomes[l.slot].fate;
        if done {
            *fate = Fate::Exited {
                signal,
                after_ms: millis(started.elapsed()),
            };
        } else if signal == Sig::Kill {
            // KILL was the signal: it only needs the wait below.
            survivors.push(l);
        } else {
            match send(host, &l.fd, &l.target, Sig::Kill, audit) {
                Ok(()) => survivors.push(l),
                Err(Fate::AlreadyGone) => {
                    *fate = Fate::Exited {
                        signal,
                        after_ms: millis(started.elapsed()),
                    };
                }
                Err(f) => *fate = f,
            }
        }
    }
    if survivors.is_empty() {
        return;
    }
    // KILL cannot be caught; what remains after this is stuck in the kernel (state D).
    let fds: Vec<&PidFd> = survivors.iter().map(|l| &l.fd).collect();
    let exited = wait_exits(&fds, Instant::now() + AFTER_KILL);
    for (l, done) in survivors.iter().zip(exited) {
        outcomes[l.slot].fate = if done {
            Fate::Exited {
                signal: Sig::Kill,
                after_ms: millis(started.elapsed()),
            }
        } else {
            Fate::Survived
        };
    }
}
