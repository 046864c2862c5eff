//! Jobs as the unit: which GPU processes belong together (a scheduler's or container's job from the cgroup,
//! else the launcher tree they descend from), and, reading after reading, how each job's warm-up stands
//! (starting, loading, settled), which rank it lost while the others hold on, and which rank lags its peers
//! while loading. The only part of analysis with a memory: a rank that exited is no longer in the reading, so
//! the book remembers who the ranks were. No clock inside: the reading's time is the time.

use std::collections::{BTreeMap, HashMap};

use super::findings::{Draft, Findings};
use super::index::Indexed;
use crate::core::format::{fmt_bytes, fmt_gpus, fmt_span, truncate};
use crate::core::job::{Job, JobReport, LostHow, LostRank, Phase, Rank};
use crate::core::model::{Finding, FindingKind, GIB, HostSnapshot, MIB, Proc, ProcState, Severity};

/// The windows a job's phases are told by. Documented in the README ("Jobs").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobOptions {
    /// Memory flat this long, with every rank alive, is settled.
    pub settle_ms: u64,
    /// A rank lagging its peers this long while loading is a straggler.
    pub straggle_ms: u64,
    /// A rank in state D this long is lost (loading weights from a slow disk passes through D briefly).
    pub stuck_ms: u64,
}

impl Default for JobOptions {
    fn default() -> Self {
        JobOptions {
            settle_ms: 60_000,
            straggle_ms: 10_000,
            stuck_ms: 10_000,
        }
    }
}

/// A rise smaller than this is allocator noise, not loading: the larger of 64 MiB and 1% of what it held.
fn rose(before: u64, now: u64) -> bool {
    now > before.saturating_add((before / 100).max(64 * MIB))
}

/// A rank lags when it holds less than three quarters of its peers' median and at least 1 GiB less.
fn lags(bytes: u64, median: u64) -> bool {
    bytes.saturating_mul(4) < median.saturating_mul(3) && median - bytes >= GIB
}

/// Whether a launcher tree stops below `p`: an interactive shell (a shell that leads its session: a
/// terminal's, tmux's, ssh's), a terminal or session manager, PID 1's kin. A shell running a script is walked
/// through (`bash launch.sh` starting four ranks is their launcher), and `sudo torchrun ...` is torchrun's
/// job, not the shell's.
fn is_session(p: &Proc) -> bool {
    const SHELLS: [&str; 9] = [
        "bash", "sh", "dash", "zsh", "fish", "ksh", "mksh", "tcsh", "csh",
    ];
    const MANAGERS: [&str; 13] = [
        "sshd",
        "sshd-session",
        "tmux: server",
        "tmux",
        "screen",
        "SCREEN",
        "login",
        "systemd",
        "init",
        "su",
        "sudo",
        "runuser",
        "mosh-server",
    ];
    let comm = p.comm.trim_start_matches('-');
    (SHELLS.contains(&comm) && p.sid == p.pid)
        || MANAGERS.contains(&comm)
        || comm.starts_with("containerd-shim")
        || comm == "conmon"
        || comm == "slurmstepd"
}

/// How far up a tree is walked: a remote reading may carry a parent cycle.
const MAX_DEPTH: usize = 64;

/// The launcher of `p`: its highest ancestor in the same job below a session process or PID 1.
fn launcher<'a>(snap: &Indexed<'a>, p: &'a Proc) -> &'a Proc {
    let mut cur = p;
    for _ in 0..MAX_DEPTH {
        let Some(parent) = snap.proc(cur.ppid) else {
            break;
        };
        if parent.pid <= 1 || parent.pid == cur.pid || is_session(parent) || parent.job != p.job {
            break;
        }
        cur = parent;
    }
    cur
}

/// A GPU process as one reading shows it.
#[derive(Debug, Clone)]
struct Member {
    pid: u32,
    start_time: u64,
    gpus: Vec<u32>,
    bytes: Option<u64>,
    /// It holds GPUs whose memory and processes NVML read, yet NVML does not list it: charged nothing yet
    /// (a rank starting CUDA opens its device a moment before NVML lists it).
    unlisted: bool,
    state: ProcState,
    started_ms: Option<u64>,
    cmdline: String,
}

/// One job's processes in one reading.
#[derive(Debug)]
struct Group {
    id: String,
    /// Tells a launcher tree from a later one whose launcher got the same PID.
    launcher_start: u64,
    job: Option<Job>,
    launcher: Option<u32>,
    name: String,
    members: Vec<Member>,
}

/// Every job with a GPU process in the reading, by id (stable order).
fn groups(snap: &Indexed<'_>) -> Vec<Group> {
    let mut pids: Vec<u32> = snap
        .holders
        .iter()
        .filter(|h| !h.benign && !h.gpus.is_empty())
        .map(|h| h.pid)
        .chain(
            snap.gpus
                .iter()
                .flat_map(|g| g.processes.iter().map(|l| l.pid)),
        )
        .collect();
    pids.sort_unstable();
    pids.dedup();
    // What NVML charges each PID, and where it lists it: looked up per PID, so indexed once.
    let mut listed: HashMap<u32, (Option<u64>, Vec<u32>)> = HashMap::new();
    for g in &snap.gpus {
        for l in &g.processes {
            let e = listed.entry(l.pid).or_insert((None, Vec::new()));
            if let Some(b) = l.used_bytes {
                e.0 = Some(e.0.unwrap_or(0) + b);
            }
            e.1.push(g.index);
        }
    }
    let mut by_id: BTreeMap<String, Group> = BTreeMap::new();
    for pid in pids {
        let Some(p) = snap.proc(pid) else { continue };
        if snap.holder(pid).is_some_and(|h| h.benign) {
            continue;
        }
        let top = launcher(snap, p);
        let id = match &p.job {
            Some(j) => j.query(),
            None => format!("tree:{}", top.pid),
        };
        let mut gpus = snap.holder(pid).map(|h| h.gpus.clone()).unwrap_or_default();
        let (charged, on) = listed.get(&pid).cloned().unwrap_or_default();
        let unlisted = !listed.contains_key(&pid)
            && !gpus.is_empty()
            && gpus.iter().all(|&i| {
                snap.gpu(i).is_some_and(|g| {
                    g.memory.used.is_some() && g.error.is_none() && g.mig_enabled != Some(true)
                })
            });
        for g in on {
            if !gpus.contains(&g) {
                gpus.push(g);
            }
        }
        gpus.sort_unstable();
        let g = by_id.entry(id.clone()).or_insert_with(|| Group {
            id,
            launcher_start: top.start_time,
            job: p.job.clone().map(|j| match j {
                // The job is every step of it.
                Job::Slurm { job, .. } => Job::Slurm { job, step: None },
                other => other,
            }),
            launcher: Some(top.pid),
            name: truncate(&top.display_cmd(), 60),
            members: Vec::new(),
        });
        g.members.push(Member {
            pid,
            start_time: p.start_time,
            gpus,
            bytes: charged,
            unlisted,
            state: p.state,
            started_ms: p.started_at.map(|s| s * 1000),
            cmdline: p.display_cmd(),
        });
    }
    by_id.into_values().collect()
}

/// A rank as the book remembers it from the last reading that showed it alive.
#[derive(Debug, Clone)]
struct Seen {
    start_time: u64,
    gpus: Vec<u32>,
    bytes: Option<u64>,
    cmdline: String,
    /// Since when it is in state D.
    stuck_since: Option<u64>,
    /// Since when it lags its peers while loading.
    lag_since: Option<u64>,
}

#[derive(Debug, Clone)]
struct Track {
    launcher_start: u64,
    started_ms: u64,
    phase: Phase,
    phase_since_ms: u64,
    ranks: BTreeMap<u32, Seen>,
    /// What its live ranks held at the last reading, and when it last rose.
    last_total: Option<u64>,
    last_rise_ms: u64,
    /// It was seen starting or loading: its warm-up time can be told.
    seen_warming: bool,
    warmup_ms: Option<u64>,
    settled_bytes: Option<u64>,
    lost: Vec<LostRank>,
    /// The lost ranks' PIDs, looked up per member.
    lost_pids: std::collections::HashSet<u32>,
}

/// What happened to the jobs since the last reading, for the timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobChange {
    Started {
        job: String,
        name: String,
        ranks: usize,
        gpus: Vec<u32>,
    },
    Phase {
        job: String,
        phase: Phase,
        /// How long it was in the phase before.
        after_ms: u64,
        bytes: Option<u64>,
        warmup_ms: Option<u64>,
    },
    RankLost {
        job: String,
        lost: LostRank,
        /// Ranks still alive, and what they hold.
        left: usize,
        left_bytes: Option<u64>,
    },
    Ended {
        job: String,
        lived_ms: u64,
    },
}

/// A host's jobs, reading after reading.
#[derive(Debug, Default)]
pub struct JobBook {
    opts: JobOptions,
    tracks: HashMap<String, Track>,
    /// The time of the last reading seen: a clock that ran out by then has had its effect.
    observed_at: u64,
    /// The first clock to run out after it (worked out once per reading seen, asked at every one).
    next_clock: Option<u64>,
    /// Processes gpusweep itself signalled (pid -> start time, when): a rank of them that leaves was ended,
    /// not lost.
    signalled: HashMap<u32, (u64, u64)>,
}

/// How long a signal gpusweep sent explains a rank's exit (a sweep's grace, and more).
const SIGNALLED_FOR_MS: u64 = 10 * 60 * 1000;

/// The book's answer for one reading.
#[derive(Debug, Default)]
pub struct JobsSeen {
    pub reports: Vec<JobReport>,
    pub findings: Vec<Finding>,
    pub changes: Vec<JobChange>,
}

/// The sum of the amounts that are known; `None` when none is.
pub fn sum_known(v: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    v.fold(None, |acc, b| match (acc, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    })
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

impl JobBook {
    pub fn new(opts: JobOptions) -> JobBook {
        JobBook {
            opts,
            tracks: HashMap::new(),
            observed_at: 0,
            next_clock: None,
            signalled: HashMap::new(),
        }
    }

    /// Whether time alone may have changed what the book says by `at` (a job settling, a rank turning
    /// straggler or lost in D): a clock of it ran out since the last reading it saw. A reading that says the
    /// same is then seen again; before, it would say the same, and is not (ten thousand quiet hosts'
    /// readings would each cost a job analysis).
    pub fn due(&self, at: u64) -> bool {
        self.next_clock.is_some_and(|c| at >= c)
    }

    /// The first time after the last observation at which a clock runs out.
    fn first_clock(&self) -> Option<u64> {
        let o = &self.opts;
        let after = self.observed_at;
        self.tracks
            .values()
            .flat_map(|t| {
                let settle = matches!(t.phase, Phase::Loading | Phase::Holding)
                    .then(|| t.last_rise_ms.saturating_add(o.settle_ms));
                let ranks = t.ranks.values().flat_map(|s| {
                    [
                        s.stuck_since.map(|x| x.saturating_add(o.stuck_ms)),
                        s.lag_since.map(|x| x.saturating_add(o.straggle_ms)),
                    ]
                });
                settle.into_iter().chain(ranks.flatten())
            })
            .filter(|&c| c > after)
            .min()
    }

    /// Read one judged reading (its findings in place) at its own time. Call again with the same reading
    /// and a later time when a reading says the same: time alone settles a job or names a straggler.
    pub fn observe(&mut self, snap: &HostSnapshot, at: u64) -> JobsSeen {
        self.observed_at = self.observed_at.max(at);
        let ix = Indexed::new(snap);
        let mut out = JobsSeen::default();
        let mut findings = Findings::new(&snap.host);
        let groups = groups(&ix);
        let mut alive_ids = std::collections::HashSet::with_capacity(groups.len());
        for g in groups {
            alive_ids.insert(g.id.clone());
            let report = self.one(&ix, g, at, &mut out.changes, &mut findings);
            out.reports.push(report);
        }
        // Jobs with no GPU process left ended.
        let mut gone: Vec<String> = self
            .tracks
            .keys()
            .filter(|k| !alive_ids.contains(*k))
            .cloned()
            .collect();
        gone.sort();
        for id in gone {
            if let Some(t) = self.tracks.remove(&id) {
                out.changes.push(JobChange::Ended {
                    job: id,
                    lived_ms: at.saturating_sub(t.started_ms),
                });
            }
        }
        out.findings = findings.out;
        self.next_clock = self.first_clock();
        out
    }

    /// gpusweep signalled these processes (pid, start time) at `at`: their exits are its doing.
    pub fn signalled(&mut self, targets: impl Iterator<Item = (u32, u64)>, at: u64) {
        self.signalled
            .retain(|_, (_, t)| at.saturating_sub(*t) < SIGNALLED_FOR_MS);
        for (pid, start) in targets {
            self.signalled.insert(pid, (start, at));
        }
    }

    #[allow(clippy::too_many_lines)] // one job's whole reading: lost ranks, phase, stragglers, report
    fn one(
        &mut self,
        snap: &Indexed<'_>,
        g: Group,
        at: u64,
        changes: &mut Vec<JobChange>,
        findings: &mut Findings,
    ) -> JobReport {
        let opts = self.opts;
        let started_ms = g
            .members
            .iter()
            .filter_map(|m| m.started_ms)
            .min()
            .unwrap_or(at);
        // A launcher tree whose launcher's PID was reused is another job.
        if self
            .tracks
            .get(&g.id)
            .is_some_and(|t| g.job.is_none() && t.launcher_start != g.launcher_start)
        {
            self.tracks.remove(&g.id);
        }
        let fresh = !self.tracks.contains_key(&g.id);
        let t = self.tracks.entry(g.id.clone()).or_insert_with(|| Track {
            launcher_start: g.launcher_start,
            started_ms,
            phase: Phase::Starting,
            phase_since_ms: at,
            ranks: BTreeMap::new(),
            last_total: None,
            last_rise_ms: at,
            seen_warming: false,
            warmup_ms: None,
            settled_bytes: None,
            lost: Vec::new(),
            lost_pids: std::collections::HashSet::new(),
        });
        // Ranks alive now, and those in state D (lost once stuck past the window).
        let mut alive: Vec<&Member> = Vec::new();
        let mut newly_lost: Vec<LostRank> = Vec::new();
        for m in &g.members {
            let prev = t.ranks.get(&m.pid).filter(|s| s.start_time == m.start_time);
            match m.state {
                ProcState::Zombie | ProcState::Dead => {
                    if prev.is_some() || !t.lost_pids.contains(&m.pid) {
                        newly_lost.push(LostRank {
                            pid: m.pid,
                            gpus: prev.map_or_else(|| m.gpus.clone(), |s| s.gpus.clone()),
                            how: LostHow::Zombie,
                            at_ms: at,
                            bytes: prev.and_then(|s| s.bytes).or(m.bytes),
                            cmdline: m.cmdline.clone(),
                        });
                    }
                }
                ProcState::DiskSleep => {
                    let since = prev.and_then(|s| s.stuck_since).unwrap_or(at);
                    if at.saturating_sub(since) >= opts.stuck_ms {
                        newly_lost.push(LostRank {
                            pid: m.pid,
                            gpus: m.gpus.clone(),
                            how: LostHow::StuckD,
                            at_ms: at,
                            bytes: m.bytes,
                            cmdline: m.cmdline.clone(),
                        });
                    } else {
                        alive.push(m);
                    }
                }
                _ => alive.push(m),
            }
        }
        // Ranks seen alive last time and absent now exited (or their PID went to another process).
        let present: std::collections::HashSet<(u32, u64)> =
            g.members.iter().map(|m| (m.pid, m.start_time)).collect();
        for (pid, s) in &t.ranks {
            if !present.contains(&(*pid, s.start_time)) {
                let now = snap.proc(*pid).filter(|p| p.start_time == s.start_time);
                // A zombie its launcher has not reaped is off the GPU and out of the job's members, but
                // it is as lost as one that left /proc.
                let zombie =
                    now.is_some_and(|p| matches!(p.state, ProcState::Zombie | ProcState::Dead));
                if now.is_none() || zombie {
                    newly_lost.push(LostRank {
                        pid: *pid,
                        gpus: s.gpus.clone(),
                        how: if zombie {
                            LostHow::Zombie
                        } else {
                            LostHow::Exited
                        },
                        at_ms: at,
                        bytes: s.bytes,
                        cmdline: s.cmdline.clone(),
                    });
                }
                // Alive but no longer on a GPU: it let go of its device, which is no loss.
            }
        }
        newly_lost.retain(|l| !t.lost_pids.contains(&l.pid));
        // A rank gpusweep signalled was ended, not lost (a sweep of a healthy job is no crash).
        newly_lost.retain(|l| {
            let seen = t.ranks.get(&l.pid).map(|s| s.start_time);
            self.signalled.get(&l.pid).map(|(start, _)| *start) != seen
        });
        let left_bytes = sum_known(alive.iter().map(|m| m.bytes));
        // The others still hold GPU memory (or, where it is unread, their GPUs).
        let others_hold = match left_bytes {
            Some(b) => b > 0,
            None => alive.iter().any(|m| !m.gpus.is_empty()),
        };
        if others_hold && !alive.is_empty() {
            for l in newly_lost {
                changes.push(JobChange::RankLost {
                    job: g.id.clone(),
                    lost: l.clone(),
                    left: alive.len(),
                    left_bytes,
                });
                t.lost_pids.insert(l.pid);
                t.lost.push(l);
            }
        }
        // Remember the live ranks for the next reading.
        let old = std::mem::take(&mut t.ranks);
        for m in &g.members {
            if matches!(m.state, ProcState::Zombie | ProcState::Dead) {
                continue;
            }
            let prev = old.get(&m.pid).filter(|s| s.start_time == m.start_time);
            t.ranks.insert(
                m.pid,
                Seen {
                    start_time: m.start_time,
                    gpus: m.gpus.clone(),
                    bytes: m.bytes,
                    cmdline: m.cmdline.clone(),
                    stuck_since: (m.state == ProcState::DiskSleep)
                        .then(|| prev.and_then(|s| s.stuck_since).unwrap_or(at)),
                    lag_since: prev.and_then(|s| s.lag_since),
                },
            );
        }
        // The phase.
        let total = left_bytes;
        let before = t.phase;
        let phase = if t.lost.is_empty() {
            match (total, t.last_total) {
                // Every rank charged nothing or not listed yet: starting, not unreadable.
                (None, None) if alive.iter().all(|m| m.unlisted || m.bytes == Some(0)) => {
                    t.seen_warming = true;
                    t.last_rise_ms = at;
                    Phase::Starting
                }
                (None, _) => Phase::Unknown,
                (Some(0), _) => {
                    t.seen_warming = true;
                    t.last_rise_ms = at;
                    Phase::Starting
                }
                (Some(now), Some(prev)) if rose(prev, now) => {
                    t.last_rise_ms = at;
                    t.seen_warming = true;
                    Phase::Loading
                }
                (Some(_), None) => {
                    t.last_rise_ms = at;
                    // Memory at first sight: it rose since the job started, if that was within the window.
                    if fresh && at.saturating_sub(started_ms) >= opts.settle_ms {
                        Phase::Holding
                    } else {
                        t.seen_warming = true;
                        Phase::Loading
                    }
                }
                (Some(now), Some(_)) => {
                    if at.saturating_sub(t.last_rise_ms) >= opts.settle_ms
                        && before != Phase::Settled
                    {
                        t.warmup_ms = t
                            .seen_warming
                            .then(|| t.last_rise_ms.saturating_sub(t.started_ms));
                        t.settled_bytes = Some(now);
                        Phase::Settled
                    } else if before == Phase::Starting || before == Phase::Unknown {
                        Phase::Holding
                    } else {
                        before
                    }
                }
            }
        } else {
            Phase::LostRank
        };
        if total.is_some() {
            t.last_total = total;
        }
        if fresh {
            changes.push(JobChange::Started {
                job: g.id.clone(),
                name: g.name.clone(),
                ranks: g.members.len(),
                gpus: union_gpus(g.members.iter()),
            });
        }
        if phase != before || fresh {
            if !fresh {
                changes.push(JobChange::Phase {
                    job: g.id.clone(),
                    phase,
                    after_ms: at.saturating_sub(t.phase_since_ms),
                    bytes: total,
                    warmup_ms: (phase == Phase::Settled).then_some(t.warmup_ms).flatten(),
                });
            }
            // Settled dates from when memory stopped rising.
            t.phase_since_ms = if phase == Phase::Settled {
                t.last_rise_ms
            } else {
                at
            };
            t.phase = phase;
        }
        // Stragglers: while loading, a rank far behind its peers' median for the window.
        let mut stragglers = Vec::new();
        let known: Vec<(u32, u64)> = alive
            .iter()
            .filter_map(|m| m.bytes.map(|b| (m.pid, b)))
            .collect();
        if phase == Phase::Loading && known.len() >= 2 && known.len() == alive.len() {
            let med = median(known.iter().map(|k| k.1).collect());
            for (pid, b) in &known {
                let Some(s) = t.ranks.get_mut(pid) else {
                    continue;
                };
                if lags(*b, med) {
                    let since = *s.lag_since.get_or_insert(at);
                    if at.saturating_sub(since) >= opts.straggle_ms {
                        stragglers.push((*pid, *b, med, at - since));
                    }
                } else {
                    s.lag_since = None;
                }
            }
        } else {
            for s in t.ranks.values_mut() {
                s.lag_since = None;
            }
        }
        // Findings.
        if phase == Phase::LostRank {
            lost_finding(snap, &g, t, &alive, left_bytes, findings);
        }
        for &(pid, b, med, for_ms) in &stragglers {
            let gpus = t
                .ranks
                .get(&pid)
                .map(|s| s.gpus.clone())
                .unwrap_or_default();
            findings.push(Draft {
                kind: FindingKind::Straggler,
                severity: Severity::Warning,
                gpu: gpus.first().copied(),
                pid: Some(pid),
                bytes: Some(b),
                detail: format!(
                    "job {}: rank {} on GPU {} holds {} while its {} peers' median is {}, for {} of \
                     loading: a slower shard load, a slower GPU or link, or a rank stuck before its \
                     collective",
                    g.id,
                    super::findings::who(snap, pid),
                    fmt_gpus(&gpus),
                    fmt_bytes(Some(b)),
                    known.len() - 1,
                    fmt_bytes(Some(med)),
                    fmt_span(for_ms)
                ),
                action: format!(
                    "compare its GPU's clocks and PCIe/NVLink with its peers' (`gpusweep snapshot`); if it \
                     stops growing, `py-spy dump --pid {pid}` shows where it waits"
                ),
                target_pid: None,
            });
        }
        let ranks = g
            .members
            .iter()
            .map(|m| Rank {
                pid: m.pid,
                gpus: m.gpus.clone(),
                bytes: m.bytes,
                state: m.state,
                straggler: stragglers.iter().any(|s| s.0 == m.pid),
            })
            .collect();
        JobReport {
            id: g.id,
            job: g.job,
            launcher: g.launcher,
            name: g.name,
            ranks,
            gpus: union_gpus(alive.iter().copied()),
            bytes: total,
            started_ms: t.started_ms,
            phase: t.phase,
            phase_since_ms: t.phase_since_ms,
            warmup_ms: t.warmup_ms,
            settled_bytes: t.settled_bytes,
            lost: t.lost.clone(),
            kept: !g.members.is_empty()
                && g.members
                    .iter()
                    .all(|m| snap.holder(m.pid).is_some_and(|h| h.kept)),
        }
    }
}

fn union_gpus<'a>(members: impl Iterator<Item = &'a Member>) -> Vec<u32> {
    let mut v: Vec<u32> = members.flat_map(|m| m.gpus.iter().copied()).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// One finding per lost rank: who, how, when, who is left holding what, and what to do.
fn lost_finding(
    snap: &Indexed<'_>,
    g: &Group,
    t: &Track,
    alive: &[&Member],
    left_bytes: Option<u64>,
    findings: &mut Findings,
) {
    let left_gpus = union_gpus(alive.iter().copied());
    // A kernel tile that does not fit an SM120 part's shared memory kills one rank in warm-up.
    let smem = snap
        .findings
        .iter()
        .any(|f| f.kind == FindingKind::SmemLimit);
    for l in &t.lost {
        let held = left_bytes.map_or_else(
            || "GPU memory (amount unread)".to_string(),
            |b| fmt_bytes(Some(b)),
        );
        let cause = if smem {
            "; on this SM120-class host a kernel tile larger than its ~99 KB of shared memory per \
             block is a known cause (see the smem_limit finding)"
        } else {
            ""
        };
        findings.push(Draft {
            kind: FindingKind::LostRank,
            severity: Severity::Leak,
            gpu: l.gpus.first().copied(),
            pid: Some(l.pid),
            bytes: left_bytes,
            detail: format!(
                "job {}: rank {} on GPU {} {} at {}, while its {} other rank(s) hold {} on GPU {}: they \
                 wait on it in a collective until NCCL's timeout, tens of minutes{cause}",
                g.id,
                l.pid,
                fmt_gpus(&l.gpus),
                l.how.describe(),
                crate::core::format::fmt_clock(l.at_ms),
                alive.len(),
                held,
                fmt_gpus(&left_gpus),
            ),
            action: format!(
                "end the job now rather than wait for the timeout: `gpusweep sweep --job {}` (or `gpusweep \
                 run --fail-fast` to do it unasked)",
                g.id
            ),
            target_pid: g.launcher,
        });
    }
}

#[cfg(test)]
mod tests;
