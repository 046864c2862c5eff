//! What a reader of the serve may see: no more than it could read from `/proc` itself.
//!
//! A root serve reads every process. A node that mounts `/proc` with `hidepid` hides other users' processes
//! from unprivileged users; the serve must not hand them back what the kernel hides. A socket peer is judged
//! by the `/proc` of its own mount namespace (a container's, a `ProtectProc=` unit's), read through
//! `/proc/PEER/mountinfo`, and sees only its own processes when it is in PID or user namespaces of its own;
//! an HTTP reader without a token could be anyone, so it is judged by the serve's own `/proc`. Hidden
//! processes keep what NVML would tell anyone (PID, GPU memory) and lose what `/proc` holds (command line,
//! name, user, cgroup and job, kernel wait channel); the findings say the same things with those texts
//! hidden. Verdicts are the serve's, taken on the whole reading: a redacted reading is never judged again.

use std::collections::HashSet;

use crate::core::event::{Event, EventKind};
use crate::core::model::{HostSnapshot, Proc};
pub use crate::core::mountinfo::{Hiding, proc_hiding};

/// Which processes a reader may see whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// Every process: root, the serve's own user, or a `/proc` that hides nothing.
    Whole,
    /// Only this user's.
    Own(u32),
    /// None but by PID and GPU memory (a reader the serve cannot name).
    NoOthers,
}

/// What stands in for a hidden process's name.
pub const HIDDEN: &str = "hidden";

/// The view of a socket peer, from its credentials (SO_PEERCRED) and the `/proc` of its mount namespace. A
/// peer whose namespace cannot be read is shown only its own processes.
pub fn peer_view(pid: Option<i32>, uid: Option<u32>, gid: Option<u32>, trusted: bool) -> View {
    if trusted {
        return View::Whole;
    }
    let Some(uid) = uid else {
        return View::NoOthers;
    };
    let Some(pid) = pid.filter(|p| *p > 0) else {
        return View::Own(uid);
    };
    // In PID or user namespaces of its own, the peer's `/proc` (whatever its options) shows its own
    // namespace's processes, none of the serve's: it reads its own processes, no more.
    if !shares_namespaces(pid) {
        return View::Own(uid);
    }
    let Ok(mountinfo) = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")) else {
        return View::Own(uid);
    };
    match proc_hiding(&mountinfo) {
        None => View::Whole,
        Some(Hiding {
            exempt_gid: Some(g),
        }) if in_group(pid, gid, g) => View::Whole,
        Some(_) => View::Own(uid),
    }
}

/// Whether the process is in the serve's own PID and user namespaces (false when that cannot be read).
fn shares_namespaces(pid: i32) -> bool {
    ["pid", "user"].iter().all(|ns| {
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}"));
        let ours = std::fs::read_link(format!("/proc/self/ns/{ns}"));
        matches!((theirs, ours), (Ok(a), Ok(b)) if a == b)
    })
}

/// Whether the process is in group `g` (its primary group, or one of its supplementary groups).
fn in_group(pid: i32, primary: Option<u32>, g: u32) -> bool {
    primary == Some(g)
        || std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Groups:"))
                .is_some_and(|gs| gs.split_whitespace().any(|x| x.parse() == Ok(g)))
        })
}

/// The view of HTTP readers: whole with a token (the operator chose who reads), else as the serve's own
/// `/proc` shows processes to an unprivileged user.
pub fn http_view(token: bool) -> View {
    let own = std::fs::read_to_string("/proc/self/mountinfo").ok();
    match own.as_deref().and_then(proc_hiding) {
        Some(_) if !token => View::NoOthers,
        _ => View::Whole,
    }
}

impl View {
    fn shows(self, p: &Proc) -> bool {
        match self {
            View::Whole => true,
            View::Own(uid) => p.uid == Some(uid),
            View::NoOthers => false,
        }
    }
}

/// The reading as `view` may see it; `None` when it sees it whole (send the reading as it is).
pub fn redact(snap: &HostSnapshot, view: View) -> Option<HostSnapshot> {
    if view == View::Whole || snap.processes.iter().all(|p| view.shows(p)) {
        return None;
    }
    let mut out = snap.clone();
    // A finding names a process by its cut command line (`short_cmd`), by "PID (name)", and by its PID in a
    // container: the same texts, hidden.
    let mut names: Vec<(String, String)> = Vec::new();
    for p in out.processes.iter_mut().filter(|p| !view.shows(p)) {
        let before = crate::analyze::findings::short_cmd(p);
        let named = format!("{} ({})", p.pid, crate::core::escape::escape(&p.comm));
        if let Some(n) = p.ns_pid {
            names.push((format!("; pid {n} in its container"), String::new()));
        }
        hide(p);
        names.push((before, crate::analyze::findings::short_cmd(p)));
        names.push((named, format!("{} ({HIDDEN})", p.pid)));
    }
    // Longest first, so a command line that is part of another is not half-replaced.
    names.sort_by_key(|(b, _)| std::cmp::Reverse(b.len()));
    names.dedup();
    let hidden: HashSet<u32> = snap
        .processes
        .iter()
        .filter(|p| !view.shows(p))
        .map(|p| p.pid)
        .collect();
    for f in &mut out.findings {
        // A finding about a hidden process says what and where, not what /proc said of it (its job, where it
        // waits, its parent): written anew.
        let about = f
            .pid
            .filter(|p| hidden.contains(p))
            .or(f.target_pid.filter(|p| hidden.contains(p)));
        if let Some(pid) = about {
            let gpu = f.gpu.map_or(String::new(), |g| format!(" on GPU {g}"));
            f.detail = format!(
                "{}{gpu}, PID {pid}: the details are hidden from you (this node's /proc hides other users' processes)",
                f.kind.as_str()
            );
            "its owner or root can see it and act".clone_into(&mut f.action);
            continue;
        }
        for (before, after) in &names {
            if !before.is_empty() && f.detail.contains(before.as_str()) {
                f.detail = f.detail.replace(before.as_str(), after);
            }
            if !before.is_empty() && f.action.contains(before.as_str()) {
                f.action = f.action.replace(before.as_str(), after);
            }
        }
    }
    for g in &mut out.gpus {
        for lp in &mut g.processes {
            if hidden.contains(&lp.pid) {
                lp.name = None;
            }
        }
    }
    // A job with a hidden launcher or rank: its phase, GPUs and memory stay; its name, its scheduler's id
    // and its lost ranks' command lines go (named by its launcher's PID, as NVML's PIDs are shown).
    for j in &mut out.jobs {
        let of_others = j.launcher.is_some_and(|l| hidden.contains(&l))
            || j.members().any(|r| hidden.contains(&r.pid));
        if of_others {
            HIDDEN.clone_into(&mut j.name);
            j.job = None;
            j.id = format!("pid:{}", j.launcher.unwrap_or(0));
            for l in &mut j.lost {
                l.cmdline.clear();
            }
        }
    }
    Some(out)
}

/// A timeline event as a reader the serve cannot name may see it (`View::NoOthers`): a process's command line
/// and a finding's text (which names processes) hidden; what happened, where and to which PID stays.
pub fn event(e: &Event, view: View) -> std::borrow::Cow<'_, Event> {
    if view == View::Whole {
        return std::borrow::Cow::Borrowed(e);
    }
    let mut e = e.clone();
    match &mut e.what {
        EventKind::ProcessAppeared { cmdline, .. } | EventKind::ProcessExited { cmdline, .. } => {
            cmdline.clear();
        }
        EventKind::FindingAppeared { kind, detail, .. }
        | EventKind::FindingCleared { kind, detail, .. } => {
            *detail = format!(
                "{} (its text hidden: this node's /proc hides processes)",
                kind.as_str()
            );
        }
        EventKind::JobStarted { job, name, .. } => {
            HIDDEN.clone_into(job);
            name.clear();
        }
        EventKind::JobPhase { job, .. }
        | EventKind::RankLost { job, .. }
        | EventKind::JobEnded { job, .. } => HIDDEN.clone_into(job),
        _ => {}
    }
    std::borrow::Cow::Owned(e)
}

/// What `/proc` holds of a process, gone.
fn hide(p: &mut Proc) {
    p.cmdline.clear();
    HIDDEN.clone_into(&mut p.comm);
    p.user = None;
    p.uid = None;
    p.cgroup = None;
    p.job = None;
    p.wchan = None;
    p.ns_pid = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "22 27 0:21 / /proc rw,relatime - proc proc rw\n";

    #[test]
    fn the_topmost_proc_mount_decides() {
        assert_eq!(proc_hiding(HOST), None);
        let hidden =
            format!("{HOST}66 22 0:40 / /proc rw,relatime - proc proc rw,hidepid=invisible\n");
        assert_eq!(proc_hiding(&hidden), Some(Hiding { exempt_gid: None }));
        let exempt = format!("{HOST}66 22 0:40 / /proc rw - proc proc rw,hidepid=2,gid=27\n");
        assert_eq!(
            proc_hiding(&exempt),
            Some(Hiding {
                exempt_gid: Some(27)
            })
        );
        let off = format!("{HOST}66 22 0:40 / /proc rw - proc proc rw,hidepid=off\n");
        assert_eq!(proc_hiding(&off), None);
        // A proc mounted elsewhere (a container's rootfs) is not this namespace's /proc.
        let elsewhere = format!("{HOST}70 22 0:41 / /srv/c/proc rw - proc proc rw,hidepid=2\n");
        assert_eq!(proc_hiding(&elsewhere), None);
    }

    fn proc(pid: u32, uid: u32, cmd: &str) -> Proc {
        Proc {
            pid,
            uid: Some(uid),
            user: Some(format!("u{uid}")),
            comm: "python3".into(),
            cmdline: cmd.into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_analyzers_texts_name_no_hidden_process() {
        // Root's zombie, its parent in a container, under PID 1 that is a plain program: every text that
        // names them, as the analyzers write it.
        let mut init = proc(1, 0, "");
        "entry-secret-init".clone_into(&mut init.comm);
        let mut parent = proc(20, 0, "python3 launch.py --token s3cret");
        parent.ns_pid = Some(4711);
        let mut zombie = proc(21, 0, "");
        zombie.ppid = 20;
        "rank-s3cret".clone_into(&mut zombie.comm);
        zombie.state = crate::core::model::ProcState::Zombie;
        let mut orphan_zombie = proc(22, 0, "");
        orphan_zombie.ppid = 1;
        "other-s3cret".clone_into(&mut orphan_zombie.comm);
        orphan_zombie.state = crate::core::model::ProcState::Zombie;
        let mut snap = HostSnapshot {
            processes: vec![
                init,
                parent,
                zombie,
                orphan_zombie,
                proc(30, 1000, "mine.py"),
            ],
            zombies: vec![21, 22],
            ..Default::default()
        };
        snap.findings = crate::analyze::analyze(&snap, &crate::analyze::AnalyzeOptions::default());
        assert!(
            snap.findings
                .iter()
                .any(|f| f.detail.contains("rank-s3cret")),
            "the analyzers name it: {:?}",
            snap.findings
        );
        let seen = redact(&snap, View::Own(1000)).expect("redacted");
        let texts = format!("{:?}", seen.findings);
        for secret in ["s3cret", "entry-secret", "4711"] {
            assert!(!texts.contains(secret), "{secret} in {texts}");
        }
        assert!(
            texts.contains("zombie, PID 21: the details are hidden"),
            "{texts}"
        );
    }

    #[test]
    fn another_users_job_keeps_its_phase_and_loses_its_names() {
        let mut snap = HostSnapshot {
            processes: vec![
                proc(10, 0, "torchrun --secret-run"),
                proc(11, 0, "python3 rank0"),
                proc(20, 1000, "python3 mine.py"),
            ],
            ..Default::default()
        };
        snap.processes[1].ppid = 10;
        let rank = |pid| crate::core::job::Rank {
            pid,
            gpus: vec![0],
            bytes: Some(1 << 30),
            state: crate::core::model::ProcState::Sleeping,
            straggler: false,
        };
        snap.jobs = vec![
            crate::core::job::JobReport {
                launcher_gone_ms: None,
                helpers: Vec::new(),
                id: "slurm:4711".into(),
                job: Some(crate::core::job::Job::Slurm {
                    job: 4711,
                    step: None,
                }),
                launcher: Some(10),
                name: "torchrun --secret-run".into(),
                ranks: vec![rank(11)],
                gpus: vec![0],
                bytes: Some(1 << 30),
                started_ms: 0,
                phase: crate::core::job::Phase::LostRank,
                phase_since_ms: 0,
                warmup_ms: None,
                settled_bytes: None,
                lost: vec![crate::core::job::LostRank {
                    pid: 12,
                    gpus: vec![1],
                    how: crate::core::job::LostHow::Exited,
                    at_ms: 0,
                    bytes: None,
                    cmdline: "python3 rank1 --secret-rank".into(),
                }],
                kept: false,
                phase_why: None,
                waiting_on: Vec::new(),
            },
            crate::core::job::JobReport {
                launcher_gone_ms: None,
                helpers: Vec::new(),
                id: "tree:20".into(),
                job: None,
                launcher: Some(20),
                name: "python3 mine.py".into(),
                ranks: vec![rank(20)],
                gpus: vec![2],
                bytes: Some(1 << 30),
                started_ms: 0,
                phase: crate::core::job::Phase::Loading,
                phase_since_ms: 0,
                warmup_ms: None,
                settled_bytes: None,
                lost: vec![],
                kept: false,
                phase_why: None,
                waiting_on: Vec::new(),
            },
        ];
        let seen = redact(&snap, View::Own(1000)).expect("redacted");
        let json = serde_json::to_string(&seen.jobs).expect("json");
        for secret in ["secret", "4711"] {
            assert!(!json.contains(secret), "{secret} in {json}");
        }
        assert_eq!(seen.jobs[0].id, "pid:10");
        assert_eq!(seen.jobs[0].phase, crate::core::job::Phase::LostRank);
        assert_eq!(seen.jobs[1].name, "python3 mine.py", "its own stays");
    }

    #[test]
    fn another_users_command_line_is_hidden_in_processes_and_findings() {
        let mut snap = HostSnapshot {
            processes: vec![
                proc(10, 0, "python3 serve.py --api-key s3cret"),
                proc(11, 1000, "python3 mine.py"),
            ],
            ..Default::default()
        };
        snap.findings.push(crate::core::model::Finding {
            kind: crate::core::model::FindingKind::Orphan,
            severity: crate::core::model::Severity::Leak,
            host: "h".into(),
            gpu: Some(0),
            pid: Some(11),
            bytes: None,
            detail: "held by 10 (python3 serve.py --api-key s3cret) and 11 (python3 mine.py)"
                .into(),
            action: "kill 10 (python3 serve.py --api-key s3cret)".into(),
            target_pid: Some(11),
            gpu_instance: None,
            file: None,
            confirms_as: None,
        });
        assert!(redact(&snap, View::Whole).is_none());
        let seen = redact(&snap, View::Own(1000)).expect("redacted");
        let json = serde_json::to_string(&seen).expect("json");
        assert!(!json.contains("s3cret") && !json.contains("u0"), "{json}");
        assert!(json.contains("mine.py"), "its own stays: {json}");
        assert_eq!(seen.processes[0].pid, 10, "the PID stays, as NVML shows it");
        assert!(
            seen.findings[0].detail.contains("10 ([hidden])"),
            "{seen:?}"
        );
        assert!(
            seen.findings[0].action.contains("10 ([hidden])"),
            "{seen:?}"
        );
        let none = redact(&snap, View::NoOthers).expect("redacted");
        assert!(
            !serde_json::to_string(&none)
                .expect("json")
                .contains("mine.py")
        );
    }
}
