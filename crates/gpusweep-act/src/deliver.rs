//! Safe signal delivery on this host.
//!
//! A target is (pid, start time, and where the kernel has pidfs, the pidfd's inode). Delivery opens a pidfd
//! first, then re-reads the start time and compares the inode: if the PID now names another process, nothing
//! is sent. The signal goes through the pidfd, so it cannot reach a process that took the PID after the check.
//! PID 1, gpusweep itself and its ancestors are never signalled. Every signal is recorded in the audit log
//! (one write, synced) before it is sent. Without pidfds (old kernels, seccomp) kills are refused unless the
//! operator opted in to kill(2) after a start-time check; the audit log says which way each went.

use std::fs;
use std::time::{Duration, Instant};

use super::audit::AuditLog;
use super::pidfd::{PidFd, no_pidfd, wait_exits};
use super::protect;
use gpusweep_core::format::millis;
use gpusweep_core::model::{Proc, ProcState};
use gpusweep_core::procstat::{dead_zombie, parse_cmdline, parse_stat};
use gpusweep_core::signal::{Fate, Outcome, Protected, Sig, SignalRequest, TargetInfo};

/// How long a process may take to vanish after KILL before it is reported as stuck in the kernel.
const AFTER_KILL: Duration = Duration::from_secs(5);

/// What `/proc/PID/stat` shows now. `Ok(None)` only when the process is gone (ENOENT/ESRCH); any other
/// failure (out of file descriptors, a permission) is an error, never "gone".
fn stat_now(pid: u32) -> std::io::Result<Option<(Proc, bool)>> {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => Ok(parse_stat(&s).map(|p| (p, dead_zombie(&s)))),
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

/// How a target is held between its checks and its signal.
enum Pin {
    /// A pidfd: a PID reuse cannot redirect it.
    Fd(PidFd),
    /// No pidfd on this kernel, by the operator's choice: the start time is re-checked before each kill(2).
    Bare,
}

impl Pin {
    fn method(&self) -> &'static str {
        match self {
            Pin::Fd(_) => "pidfd",
            Pin::Bare => "kill(2) after a start-time check (no pidfd)",
        }
    }
}

/// A target that passed every check and was signalled: how it is held and where its outcome sits.
struct Live {
    slot: usize,
    pin: Pin,
    target: TargetInfo,
}

/// Pin the target and check that it is still the process that was chosen.
fn pin(
    t: &TargetInfo,
    protected: &Protected,
    without_pidfd: bool,
) -> Result<(Pin, TargetInfo), Fate> {
    if let Some(reason) = protected.reason(t.pid) {
        return Err(Fate::Refused { reason });
    }
    let held = match PidFd::open(t.pid) {
        Ok(fd) => Pin::Fd(fd),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Err(Fate::AlreadyGone),
        Err(e) => match no_pidfd(&e) {
            Some(_) if without_pidfd => Pin::Bare,
            Some(why) => {
                return Err(Fate::Refused {
                    reason: format!(
                        "{why} (--kill-without-pidfd opts in to start-time checks and kill(2))"
                    ),
                });
            }
            None => {
                return Err(Fate::Failed {
                    reason: format!("pidfd_open: {}", describe_errno(&e, t.pid)),
                });
            }
        },
    };
    // The pidfd pins this process; now make sure it is the one that was chosen.
    match stat_now(t.pid) {
        Err(e) => {
            return Err(Fate::Failed {
                reason: format!("reading /proc/{}/stat: {e}", t.pid),
            });
        }
        Ok(None) => return Err(Fate::AlreadyGone),
        Ok(Some((now, _))) if now.start_time != t.start_time => {
            return Err(Fate::Refused {
                reason: format!(
                    "PID reused: it started at tick {}, the target at {}",
                    now.start_time, t.start_time
                ),
            });
        }
        // A zombie has exited and holds nothing; a signal would be recorded and "sent" to no effect. (A
        // leader in state Z whose other threads run is alive: the pidfd signals its thread group.)
        Ok(Some((now, true))) => {
            return Err(Fate::Refused {
                reason: format!(
                    "a zombie: dead already, it holds nothing; its parent {} must reap it",
                    now.ppid
                ),
            });
        }
        Ok(Some(_)) => {}
    }
    // Same PID, same start tick, and still another process: only pidfs can tell.
    if let (Pin::Fd(fd), Some(want)) = (&held, t.pidfs_ino)
        && let Some(now) = fd.inode()
        && now != want
    {
        return Err(Fate::Refused {
            reason: format!("PID reused: pidfs inode {now}, the target's {want}"),
        });
    }
    // The record names what /proc says now, never what a client sent.
    let mut t = t.clone();
    t.cmdline = fs::read(format!("/proc/{}/cmdline", t.pid))
        .map(|raw| parse_cmdline(&raw))
        .unwrap_or_default();
    if t.pidfs_ino.is_none()
        && let Pin::Fd(fd) = &held
    {
        t.pidfs_ino = fd.inode();
    }
    Ok((held, t))
}

/// kill(2) for a target held without a pidfd: the start time is checked once more right before.
fn kill_bare(t: &TargetInfo, sig: Sig) -> std::io::Result<()> {
    match stat_now(t.pid)? {
        Some((now, _)) if now.start_time == t.start_time => {}
        _ => return Err(std::io::Error::from_raw_os_error(libc::ESRCH)),
    }
    let pid = nix::unistd::Pid::from_raw(
        i32::try_from(t.pid).map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?,
    );
    let signal = nix::sys::signal::Signal::try_from(sig.number())
        .map_err(|e| std::io::Error::from_raw_os_error(e as i32))?;
    nix::sys::signal::kill(pid, signal).map_err(|e| std::io::Error::from_raw_os_error(e as i32))
}

/// Record, then send one signal. `Ok` when it was delivered. No record, no signal.
fn send(host: &str, held: &Pin, t: &TargetInfo, sig: Sig, audit: &AuditLog) -> Result<(), Fate> {
    if let Err(e) = audit.record(host, t, sig, held.method(), "sending") {
        return Err(Fate::Refused {
            reason: format!("not signalled: {e}"),
        });
    }
    let sent = match held {
        Pin::Fd(fd) => fd.send(sig),
        Pin::Bare => kill_bare(t, sig),
    };
    if let Err(e) = &sent {
        // The attempt is on record; what became of it is worth a line too, but it is not required.
        let _ = audit.record(
            host,
            t,
            sig,
            held.method(),
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
pub fn deliver(
    host: &str,
    req: &SignalRequest,
    audit: &AuditLog,
    without_pidfd: bool,
) -> Vec<Outcome> {
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
    // Every other gpusweep watching this host is told these ends are asked for, before any is sent.
    let asked: Vec<(u32, u64)> = req.targets.iter().map(|t| (t.pid, t.start_time)).collect();
    if let Err(e) = super::note::note(&gpusweep_core::acts::dir(), &asked) {
        gpusweep_core::trace(host, &format!("no act note left: {e}"));
    }
    let started = Instant::now();
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut live: Vec<Live> = Vec::new();
    for t in &req.targets {
        let (held, t) = match pin(t, &protected, without_pidfd) {
            Ok(p) => p,
            Err(fate) => {
                outcomes.push(Outcome::of(t, fate));
                continue;
            }
        };
        match send(host, &held, &t, req.signal, audit) {
            Ok(()) => {
                outcomes.push(Outcome::of(&t, Fate::Signalled { signal: req.signal }));
                live.push(Live {
                    slot: outcomes.len() - 1,
                    pin: held,
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
    let pins: Vec<&Live> = live.iter().collect();
    let exited = wait_live(&pins, Instant::now() + grace);
    let mut survivors = Vec::new();
    for (l, done) in live.iter().zip(exited) {
        let fate = &mut outcomes[l.slot].fate;
        if let Some(at) = done {
            *fate = Fate::Exited {
                signal,
                after_ms: millis(at.saturating_duration_since(started)),
            };
        } else if signal == Sig::Kill {
            // KILL was the signal: it only needs the wait below.
            survivors.push(l);
        } else {
            match send(host, &l.pin, &l.target, Sig::Kill, audit) {
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
    let exited = wait_live(&survivors, Instant::now() + AFTER_KILL);
    for (l, done) in survivors.iter().zip(exited) {
        outcomes[l.slot].fate = if let Some(at) = done {
            Fate::Exited {
                signal: Sig::Kill,
                after_ms: millis(at.saturating_duration_since(started)),
            }
        } else {
            stuck(l.target.pid)
        };
    }
}

/// Why a process outlived KILL: in state D it waits in the kernel (and `wchan` says where).
fn stuck(pid: u32) -> Fate {
    let uninterruptible = fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| parse_stat(&s))
        .is_some_and(|p| p.state == ProcState::DiskSleep);
    if !uninterruptible {
        return Fate::Survived;
    }
    let wchan = fs::read_to_string(format!("/proc/{pid}/wchan"))
        .ok()
        .map(|w| w.trim().to_string())
        .filter(|w| !w.is_empty() && w != "0");
    Fate::Uninterruptible { wchan }
}

/// Whether a target held without a pidfd is gone: its PID is free, names another process, or is a zombie.
fn bare_gone(t: &TargetInfo) -> bool {
    match fs::read_to_string(format!("/proc/{}/stat", t.pid)) {
        Ok(s) => parse_stat(&s).is_none_or(|p| p.start_time != t.start_time || p.state.is_zombie()),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH),
    }
}

/// Wait until each target exited or the deadline passed. Pidfds are polled by the kernel; targets held
/// without one are looked up in /proc every 10 ms.
fn wait_live(live: &[&Live], deadline: Instant) -> Vec<Option<Instant>> {
    let fds: Vec<&PidFd> = live
        .iter()
        .filter_map(|l| match &l.pin {
            Pin::Fd(fd) => Some(fd),
            Pin::Bare => None,
        })
        .collect();
    if fds.len() == live.len() {
        return wait_exits(&fds, deadline);
    }
    let mut exited: Vec<Option<Instant>> = vec![None; live.len()];
    loop {
        let now = Instant::now();
        for (l, e) in live.iter().zip(&mut exited) {
            let gone = match &l.pin {
                Pin::Fd(fd) => fd.exited(),
                Pin::Bare => bare_gone(&l.target),
            };
            if e.is_none() && gone {
                *e = Some(now);
            }
        }
        if exited.iter().all(Option::is_some) || now >= deadline {
            return exited;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
