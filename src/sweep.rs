//! Kill plans and safe signal delivery.
//!
//! A target is (pid, start time). Delivery opens a pidfd first, then re-reads the start time: if the PID now
//! names another process, nothing is sent. The signal goes through the pidfd, so it cannot reach a process
//! that took the PID after the check. PID 1, gpusweep itself and its ancestors are never signalled. Every
//! signal sent is appended to the audit log before delivery is reported.

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::model::{HostSnapshot, MIB};
use crate::source::procfs::{parse_stat, read_cmdline};

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

impl Sig {
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
    /// "TERM", "SIGTERM", "term" or "15".
    pub fn parse(s: &str) -> Result<Sig, String> {
        let u = s.trim().to_ascii_uppercase();
        let u = u.strip_prefix("SIG").unwrap_or(&u);
        let all = [
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
        all.into_iter()
            .find(|g| g.name() == u || g.number().to_string() == u)
            .ok_or_else(|| format!("unknown signal {s:?} (use TERM, KILL, INT, HUP, QUIT, USR1, USR2, CONT, STOP or a number)"))
    }
}

/// One process to signal, as it was when it was chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetInfo {
    pub pid: u32,
    pub start_time: u64,
    #[serde(default)]
    pub cmdline: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalRequest {
    pub targets: Vec<TargetInfo>,
    pub signal: Sig,
    /// Wait this long for the targets to exit, then KILL the survivors. `None`: send once, do not wait.
    pub grace_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Fate {
    /// Exited after the named signal.
    Exited { signal: Sig, after_ms: u64 },
    /// Signal delivered; nobody waited for it to exit.
    Signalled { signal: Sig },
    /// Still running after KILL and the wait that followed (a process stuck in the driver, state D).
    Survived,
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
    pub fn describe(&self) -> String {
        let what = match &self.fate {
            Fate::Exited { signal, after_ms } => {
                format!("exited after {} ({} ms)", signal.name(), after_ms)
            }
            Fate::Signalled { signal } => format!("sent {}", signal.name()),
            Fate::Survived => "still running after KILL (stuck in the driver?)".into(),
            Fate::AlreadyGone => "already gone".into(),
            Fate::Refused { reason } => format!("refused: {reason}"),
            Fate::Failed { reason } => format!("failed: {reason}"),
        };
        format!(
            "{} {}: {what}",
            self.pid,
            crate::tui::view::truncate(&self.cmdline, 50)
        )
    }
    pub fn ok(&self) -> bool {
        matches!(
            self.fate,
            Fate::Exited { .. } | Fate::Signalled { .. } | Fate::AlreadyGone
        )
    }
}

/// Where every signal is recorded, one JSON line each.
#[derive(Debug, Clone)]
pub struct AuditLog {
    pub path: Option<PathBuf>,
}

impl AuditLog {
    /// `$GPUSWEEP_AUDIT_LOG`, else `$XDG_STATE_HOME/gpusweep/actions.jsonl` (~/.local/state/...).
    pub fn default_location() -> AuditLog {
        if let Some(p) = std::env::var_os("GPUSWEEP_AUDIT_LOG") {
            return AuditLog {
                path: Some(PathBuf::from(p)),
            };
        }
        let base = std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| dirs::home_dir().map(|h| h.join(".local/state")));
        AuditLog {
            path: base.map(|b| b.join("gpusweep").join("actions.jsonl")),
        }
    }

    fn open(&self) -> Result<fs::File, String> {
        let Some(path) = &self.path else {
            return Err("no audit log location (set GPUSWEEP_AUDIT_LOG)".into());
        };
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("cannot write audit log {}: {e}", path.display()))
    }

    pub fn record(
        &self,
        host: &str,
        t: &TargetInfo,
        signal: Sig,
        result: &str,
    ) -> Result<(), String> {
        let mut f = self.open()?;
        let line = serde_json::json!({
            "time": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            "host": host,
            "pid": t.pid,
            "start_time": t.start_time,
            "cmdline": t.cmdline,
            "signal": signal.name(),
            "result": result,
        });
        writeln!(f, "{line}").map_err(|e| format!("audit log write: {e}"))
    }
}

/// PIDs that are never signalled from here: PID 1, ourselves and our ancestors.
pub fn protected_pids() -> HashSet<u32> {
    let mut set = HashSet::from([0, 1, std::process::id()]);
    let mut cur = std::process::id();
    for _ in 0..128 {
        let Ok(s) = fs::read_to_string(format!("/proc/{cur}/stat")) else {
            break;
        };
        let Some(p) = parse_stat(&s) else { break };
        if p.ppid == 0 || !set.insert(p.ppid) {
            break;
        }
        cur = p.ppid;
    }
    set
}

fn start_time_now(pid: u32) -> Option<u64> {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| parse_stat(&s))
        .map(|p| p.start_time)
}

struct PidFd(i32);

impl Drop for PidFd {
    fn drop(&mut self) {
        // SAFETY: we own this descriptor.
        unsafe { libc::close(self.0) };
    }
}

fn pidfd_open(pid: u32) -> std::io::Result<PidFd> {
    // SAFETY: plain syscall with integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0 as libc::c_uint) };
    if fd < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(PidFd(fd as i32))
    }
}

fn pidfd_send(fd: &PidFd, sig: Sig) -> std::io::Result<()> {
    // SAFETY: a valid pidfd, a valid signal number, no siginfo.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.0,
            sig.number(),
            std::ptr::null::<libc::siginfo_t>(),
            0 as libc::c_uint,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Wait until each pidfd is readable (its process exited) or the deadline passes. Returns which exited.
fn wait_exits(fds: &[&PidFd], deadline: Instant) -> Vec<bool> {
    let mut exited = vec![false; fds.len()];
    loop {
        let mut polls: Vec<libc::pollfd> = fds
            .iter()
            .zip(&exited)
            .filter(|(_, e)| !**e)
            .map(|(f, _)| libc::pollfd {
                fd: f.0,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        if polls.is_empty() {
            return exited;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `polls` is a valid array of pollfd for its length.
        let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, ms) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return exited;
        }
        for p in polls.iter().filter(|p| p.revents != 0) {
            if let Some(i) = fds.iter().position(|f| f.0 == p.fd) {
                exited[i] = true;
            }
        }
        if n == 0 || Instant::now() >= deadline {
            return exited;
        }
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

/// Signal `req.targets` on this host, safely. With a grace period: wait for exits, KILL the survivors.
pub fn deliver(host: &str, req: &SignalRequest, audit: &AuditLog) -> Vec<Outcome> {
    let protected = protected_pids();
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut live: Vec<(usize, PidFd, TargetInfo)> = Vec::new();
    // No signal without a record of it.
    if let Err(e) = audit.open() {
        return req
            .targets
            .iter()
            .map(|t| Outcome {
                pid: t.pid,
                start_time: t.start_time,
                cmdline: t.cmdline.clone(),
                fate: Fate::Refused { reason: e.clone() },
            })
            .collect();
    }
    let started = Instant::now();
    for t in &req.targets {
        let mut t = t.clone();
        let mut out = Outcome {
            pid: t.pid,
            start_time: t.start_time,
            cmdline: t.cmdline.clone(),
            fate: Fate::AlreadyGone,
        };
        if protected.contains(&t.pid) {
            let who = if t.pid == 1 {
                "PID 1"
            } else if t.pid == std::process::id() {
                "gpusweep itself"
            } else {
                "an ancestor of gpusweep"
            };
            out.fate = Fate::Refused {
                reason: format!("{who} is never signalled"),
            };
            outcomes.push(out);
            continue;
        }
        let fd = match pidfd_open(t.pid) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                outcomes.push(out);
                continue;
            }
            Err(e) => {
                out.fate = Fate::Failed {
                    reason: format!("pidfd_open: {}", describe_errno(&e, t.pid)),
                };
                outcomes.push(out);
                continue;
            }
        };
        // The pidfd pins this process; now make sure it is the one that was chosen.
        match start_time_now(t.pid) {
            None => {
                outcomes.push(out);
                continue;
            }
            Some(st) if st != t.start_time => {
                out.fate = Fate::Refused {
                    reason: format!(
                        "PID reused: it started at tick {st}, the target at {}",
                        t.start_time
                    ),
                };
                outcomes.push(out);
                continue;
            }
            Some(_) => {}
        }
        if t.cmdline.is_empty() {
            t.cmdline = read_cmdline(std::path::Path::new(&format!("/proc/{}/cmdline", t.pid)));
            out.cmdline = t.cmdline.clone();
        }
        let sent = pidfd_send(&fd, req.signal);
        let result = match &sent {
            Ok(()) => "sent".to_string(),
            Err(e) => describe_errno(e, t.pid),
        };
        if let Err(e) = audit.record(host, &t, req.signal, &result) {
            out.fate = Fate::Failed { reason: e };
            outcomes.push(out);
            continue;
        }
        match sent {
            Ok(()) => {
                out.fate = Fate::Signalled { signal: req.signal };
                outcomes.push(out);
                live.push((outcomes.len() - 1, fd, t));
            }
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => outcomes.push(out),
            Err(e) => {
                out.fate = Fate::Failed {
                    reason: describe_errno(&e, t.pid),
                };
                outcomes.push(out);
            }
        }
    }
    let Some(grace) = req.grace_ms.map(Duration::from_millis) else {
        return outcomes;
    };
    if live.is_empty() {
        return outcomes;
    }
    let fds: Vec<&PidFd> = live.iter().map(|(_, f, _)| f).collect();
    let exited = wait_exits(&fds, Instant::now() + grace);
    let mut survivors = Vec::new();
    for ((i, fd, t), done) in live.iter().zip(exited) {
        if done {
            outcomes[*i].fate = Fate::Exited {
                signal: req.signal,
                after_ms: started.elapsed().as_millis() as u64,
            };
        } else if req.signal != Sig::Kill {
            let res = pidfd_send(fd, Sig::Kill);
            let txt = match &res {
                Ok(()) => "sent".to_string(),
                Err(e) => describe_errno(e, t.pid),
            };
            let _ = audit.record(host, t, Sig::Kill, &txt);
            match res {
                Ok(()) => survivors.push((*i, fd)),
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                    outcomes[*i].fate = Fate::Exited {
                        signal: req.signal,
                        after_ms: started.elapsed().as_millis() as u64,
                    }
                }
                Err(e) => {
                    outcomes[*i].fate = Fate::Failed {
                        reason: describe_errno(&e, t.pid),
                    }
                }
            }
        } else {
            outcomes[*i].fate = Fate::Survived;
        }
    }
    if !survivors.is_empty() {
        // KILL cannot be caught; what remains after this is stuck in the kernel (state D).
        let fds: Vec<&PidFd> = survivors.iter().map(|(_, f)| *f).collect();
        let exited = wait_exits(&fds, Instant::now() + Duration::from_secs(5));
        for ((i, _), done) in survivors.iter().zip(exited) {
            outcomes[*i].fate = if done {
                Fate::Exited {
                    signal: Sig::Kill,
                    after_ms: started.elapsed().as_millis() as u64,
                }
            } else {
                Fate::Survived
            };
        }
    }
    outcomes
}

/// One process a sweep would signal, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanItem {
    pub host: String,
    pub pid: u32,
    pub start_time: u64,
    pub user: Option<String>,
    pub cmdline: String,
    pub gpus: Vec<u32>,
    /// GPU memory it is charged (or, for a lone hidden holder, what nobody is charged for).
    pub bytes: Option<u64>,
    pub why: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub items: Vec<PlanItem>,
    /// (pid, reason) left out on purpose.
    pub skipped: Vec<(u32, String)>,
}

impl Plan {
    pub fn total_bytes(&self) -> u64 {
        self.items.iter().filter_map(|i| i.bytes).sum()
    }
    pub fn request(&self, host: &str, signal: Sig, grace_ms: Option<u64>) -> SignalRequest {
        SignalRequest {
            targets: self
                .items
                .iter()
                .filter(|i| i.host == host)
                .map(|i| TargetInfo {
                    pid: i.pid,
                    start_time: i.start_time,
                    cmdline: i.cmdline.clone(),
                })
                .collect(),
            signal,
            grace_ms,
        }
    }
    pub fn hosts(&self) -> Vec<String> {
        let mut h: Vec<String> = self.items.iter().map(|i| i.host.clone()).collect();
        h.dedup();
        h
    }
}

/// The holders and live listed processes of the chosen GPUs (all when `gpus` is `None`), never benign ones,
/// never zombies (they hold nothing), never a protected PID.
pub fn plan(snap: &HostSnapshot, gpus: Option<&[u32]>, protected: &HashSet<u32>) -> Plan {
    let chosen = |g: u32| gpus.is_none_or(|list| list.contains(&g));
    let mut plan = Plan::default();
    let add = |pid: u32, gpu_list: Vec<u32>, bytes: Option<u64>, why: String, plan: &mut Plan| {
        let Some(p) = snap.proc(pid) else { return };
        if p.state == 'Z' {
            return;
        }
        if protected.contains(&pid) {
            plan.skipped
                .push((pid, "protected (PID 1, gpusweep or its ancestor)".into()));
            return;
        }
        if let Some(item) = plan.items.iter_mut().find(|i| i.pid == pid) {
            for g in gpu_list {
                if !item.gpus.contains(&g) {
                    item.gpus.push(g);
                }
            }
            item.bytes = match (item.bytes, bytes) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
            return;
        }
        plan.items.push(PlanItem {
            host: snap.host.clone(),
            pid,
            start_time: p.start_time,
            user: p.user.clone(),
            cmdline: p.display_cmd(),
            gpus: gpu_list,
            bytes,
            why,
        });
    };
    for g in snap.gpus.iter().filter(|g| chosen(g.index)) {
        for lp in &g.processes {
            // A ghost's PID is dead or now names an innocent process: never a target.
            if snap
                .findings
                .iter()
                .any(|f| f.kind == crate::model::FindingKind::Ghost && f.pid == Some(lp.pid))
            {
                continue;
            }
            if snap.holder(lp.pid).is_some_and(|h| h.benign) {
                plan.skipped
                    .push((lp.pid, "benign (monitor or driver daemon)".into()));
                continue;
            }
            let why = format!(
                "listed on GPU {} with {}",
                g.index,
                crate::model::fmt_bytes(lp.used_bytes)
            );
            add(lp.pid, vec![g.index], lp.used_bytes, why, &mut plan);
        }
    }
    for h in &snap.holders {
        if h.benign {
            continue;
        }
        let mine: Vec<u32> = h.gpus.iter().copied().filter(|&g| chosen(g)).collect();
        // A holder of only control files (nvidiactl, nvidia-uvm) goes with a sweep of everything.
        if mine.is_empty() && !(h.gpus.is_empty() && gpus.is_none()) {
            continue;
        }
        let bytes = snap
            .findings
            .iter()
            .find(|f| f.kind == crate::model::FindingKind::HiddenHolder && f.pid == Some(h.pid))
            .and_then(|f| f.bytes);
        let why = if bytes.is_some()
            || snap
                .findings
                .iter()
                .any(|f| f.kind == crate::model::FindingKind::HiddenHolder && f.pid == Some(h.pid))
        {
            "hidden holder: has the GPU open, not listed by NVML".to_string()
        } else {
            format!("holds {}", h.devices.join(" "))
        };
        add(h.pid, mine, bytes, why, &mut plan);
    }
    plan.items.sort_by_key(|i| i.pid);
    plan
}

/// A short human line for a plan: "3 processes on gpu-b, 81.2 GiB".
pub fn plan_summary(plan: &Plan) -> String {
    let hosts = plan.hosts();
    format!(
        "{} process{} on {}, {} GPU memory",
        plan.items.len(),
        if plan.items.len() == 1 { "" } else { "es" },
        if hosts.is_empty() {
            "no host".to_string()
        } else {
            hosts.join(", ")
        },
        if plan.total_bytes() >= MIB {
            crate::model::fmt_bytes(Some(plan.total_bytes()))
        } else {
            "no charged".into()
        }
    )
}
