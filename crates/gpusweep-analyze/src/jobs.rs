//! Jobs as the unit: which GPU processes belong together (a scheduler's or container's job from the cgroup,
//! else the launcher tree they descend from), and, reading after reading, how each job's warm-up stands
//! (starting, loading, settled), which rank it lost while the others hold on, and which rank lags its peers
//! while loading. The only part of analysis with a memory: a rank that exited is no longer in the reading, so
//! the book remembers who the ranks were, and which job each process was in (a job stays one when its launcher
//! dies). Ranks are told from helpers (a forked data-loader, a sidecar: swept with the job, never lost). No
//! clock inside: the reading's time is the time.

use std::collections::{BTreeMap, HashMap};

use super::findings::{Draft, Findings};
use super::index::Indexed;
use gpusweep_core::format::{fmt_bytes, fmt_gpus, fmt_span, truncate};
use gpusweep_core::job::{Job, JobReport, LostHow, LostRank, Phase, Rank};
use gpusweep_core::model::{
    Finding, FindingKind, GIB, HostSnapshot, MIB, Proc, ProcState, Severity,
};

/// The windows a job's phases are told by. Documented in the README ("Jobs").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobOptions {
    /// Memory flat this long, with every rank alive, is settled.
    pub settle_ms: u64,
    /// A rank lagging its peers this long while loading is a straggler.
    pub straggle_ms: u64,
    /// A rank in state D this long is lost (loading weights from a slow disk passes through D briefly).
    pub stuck_ms: u64,
    /// GPUs spinning without work this long, memory flat and every rank alive, is hung (well inside NCCL's
    /// 10-minute collective timeout; longer than a checkpoint's or an evaluation's barrier).
    pub hang_ms: u64,
}

impl Default for JobOptions {
    fn default() -> Self {
        JobOptions {
            settle_ms: 60_000,
            straggle_ms: 10_000,
            stuck_ms: 10_000,
            hang_ms: 5 * 60_000,
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
    ppid: u32,
    start_time: u64,
    gpus: Vec<u32>,
    bytes: Option<u64>,
    /// NVML lists it on some GPU.
    listed: bool,
    /// It holds GPUs whose memory and processes NVML read, yet NVML does not list it: charged nothing yet
    /// (a rank starting CUDA opens its device a moment before NVML lists it).
    unlisted: bool,
    /// A helper, not a rank: NVML does not list it, and every GPU it holds is held by a listed member of
    /// its job or by its own ancestor in it (a data-loader forked after its rank opened the GPU, a sidecar
    /// opening a rank's GPU). It is swept with the job; its exit is no lost rank.
    helper: bool,
    state: ProcState,
    /// Its owner: whose act note may explain its end (`Act::proves_for`).
    uid: Option<u32>,
    started_ms: Option<u64>,
    cmdline: String,
}

/// One job's processes in one reading.
#[derive(Debug)]
struct Group {
    id: String,
    /// Tells a launcher tree from a later one whose launcher got the same PID; 0 where not known (a launcher
    /// gone before it was seen).
    launcher_start: u64,
    job: Option<Job>,
    launcher: Option<u32>,
    name: String,
    members: Vec<Member>,
}

/// Which job a process without a scheduler's cgroup belongs to, as the book remembers it from the readings
/// before: its launcher tree's, kept when the launcher dies and the ranks are reparented.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Remembered {
    id: String,
    launcher: Option<u32>,
    launcher_start: u64,
    name: String,
}

/// The job `p` belongs to: its cgroup's; else the one the book remembers for it or its nearest ancestor (a
/// helper forked after the launcher died); else its launcher tree, or, where the launcher is gone and the
/// ranks reparented, the process group they kept (the launcher's PID: the same `tree:PID`).
fn identity(snap: &Indexed<'_>, p: &Proc, known: &HashMap<(u32, u64), Remembered>) -> Remembered {
    // Remembered first: most processes of most readings are, and need no walk to their launcher.
    if p.job.is_none() {
        let mut cur = p;
        for _ in 0..MAX_DEPTH {
            if let Some(r) = known.get(&(cur.pid, cur.start_time)) {
                return r.clone();
            }
            match snap.proc(cur.ppid) {
                Some(up) if up.pid > 1 && up.pid != cur.pid && up.job.is_none() => cur = up,
                _ => break,
            }
        }
    }
    let top = launcher(snap, p);
    let of_top = |id: String| Remembered {
        id,
        launcher: Some(top.pid),
        launcher_start: top.start_time,
        name: truncate(&top.display_cmd(), 60),
    };
    if let Some(j) = &p.job {
        return of_top(j.query());
    }
    match p.pgid {
        // The group's leader gone (or a zombie nobody reaps): its ranks are one job still.
        Some(g) if g > 1 && g != top.pid && snap.proc(g).is_none_or(|l| l.state.is_zombie()) => {
            Remembered {
                id: format!("tree:{g}"),
                launcher: Some(g),
                launcher_start: 0,
                name: truncate(&top.display_cmd(), 60),
            }
        }
        _ => of_top(format!("tree:{}", top.pid)),
    }
}

/// Every job with a GPU process in the reading, by id (stable order).
fn groups(snap: &Indexed<'_>, known: &HashMap<(u32, u64), Remembered>) -> Vec<Group> {
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
        let who = identity(snap, p, known);
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
        let g = by_id.entry(who.id.clone()).or_insert_with(|| Group {
            id: who.id,
            launcher_start: who.launcher_start,
            job: p.job.clone().map(|j| match j {
                // The job is every step of it.
                Job::Slurm { job, .. } => Job::Slurm { job, step: None },
                other => other,
            }),
            launcher: who.launcher,
            name: who.name,
            members: Vec::new(),
        });
        g.members.push(Member {
            pid,
            ppid: p.ppid,
            start_time: p.start_time,
            gpus,
            bytes: charged,
            listed: listed.contains_key(&pid),
            unlisted,
            helper: false,
            state: p.state,
            uid: p.uid,
            started_ms: p.started_at.map(|s| s * 1000),
            cmdline: p.display_cmd(),
        });
    }
    let mut out: Vec<Group> = by_id.into_values().collect();
    for g in &mut out {
        mark_helpers(snap, &mut g.members);
    }
    out
}

/// Which members are helpers: not listed, and every GPU they hold held by a listed member or by an
/// ancestor of theirs in the job.
fn mark_helpers(snap: &Indexed<'_>, members: &mut [Member]) {
    let ancestor = |a: u32, m: &Member| {
        let mut cur = m.ppid;
        for _ in 0..MAX_DEPTH {
            if cur == a {
                return true;
            }
            match snap.proc(cur) {
                Some(p) if p.ppid != cur && cur > 1 => cur = p.ppid,
                _ => return false,
            }
        }
        false
    };
    let helpers: Vec<bool> = members
        .iter()
        .map(|m| {
            !m.listed
                && !m.gpus.is_empty()
                && m.gpus.iter().all(|gpu| {
                    members.iter().any(|o| {
                        o.pid != m.pid && o.gpus.contains(gpu) && (o.listed || ancestor(o.pid, m))
                    })
                })
        })
        .collect();
    for (m, h) in members.iter_mut().zip(helpers) {
        m.helper = h;
    }
}

/// A rank as the book remembers it from the last reading that showed it alive.
#[derive(Debug, Clone)]
struct Seen {
    start_time: u64,
    gpus: Vec<u32>,
    bytes: Option<u64>,
    cmdline: String,
    uid: Option<u32>,
    /// Since when it is in state D, stopped (T, t) or a zombie not reaped.
    stuck_since: Option<u64>,
    /// Since when it lags its peers while loading.
    lag_since: Option<u64>,
}

#[derive(Debug, Clone)]
struct Track {
    launcher_start: u64,
    started_ms: u64,
    /// The phase said (`hung` or `unknown` over the memory's phase, where the GPUs say so).
    phase: Phase,
    /// The phase its memory says (starting, loading, holding, settled, lost rank).
    flow: Phase,
    /// Since when its GPUs spin without work, memory flat (`hang.rs`).
    spin_since: Option<u64>,
    /// Its GPUs were seen busy without activity counters: whether it progresses cannot be told.
    no_signal: bool,
    phase_why: Option<String>,
    waiting_on: Vec<u32>,
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
    /// Ranks seen gone while the others' memory read as nothing held (a listing caught mid-change): kept
    /// until a reading says whether the others hold on (then they are lost) or the whole job ended.
    unsettled: Vec<LostRank>,
    /// Its launcher as first seen (pid, start time), and since when it is gone.
    launcher: Option<(u32, u64)>,
    launcher_gone_ms: Option<u64>,
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
    /// The time of the first reading seen: a job begun after it was watched from its start.
    watching_since: Option<u64>,
    /// The first clock to run out after it (worked out once per reading seen, asked at every one).
    next_clock: Option<u64>,
    /// Processes gpusweep itself signalled (pid -> start time, when): a rank of them that leaves was ended,
    /// not lost.
    signalled: HashMap<u32, (u64, u64)>,
    /// The launcher-tree job of every GPU process (pid, start time) in the last reading: a rank stays in its
    /// job when its launcher dies and it is reparented.
    known: HashMap<(u32, u64), Remembered>,
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
            watching_since: None,
            next_clock: None,
            signalled: HashMap::new(),
            known: HashMap::new(),
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
                let settle = matches!(t.flow, Phase::Loading | Phase::Holding)
                    .then(|| t.last_rise_ms.saturating_add(o.settle_ms));
                let hang = t
                    .spin_since
                    .filter(|_| t.phase != Phase::Hung)
                    .map(|s| s.saturating_add(o.hang_ms));
                let ranks = t.ranks.values().flat_map(|s| {
                    [
                        s.stuck_since.map(|x| x.saturating_add(o.stuck_ms)),
                        s.lag_since.map(|x| x.saturating_add(o.straggle_ms)),
                    ]
                });
                settle.into_iter().chain(hang).chain(ranks.flatten())
            })
            .filter(|&c| c > after)
            .min()
    }

    /// Read one judged reading (its findings in place) at its own time. Call again with the same reading
    /// and a later time when a reading says the same: time alone settles a job or names a straggler.
    pub fn observe(&mut self, snap: &HostSnapshot, at: u64) -> JobsSeen {
        self.observed_at = self.observed_at.max(at);
        self.watching_since.get_or_insert(at);
        let ix = Indexed::new(snap);
        let mut out = JobsSeen::default();
        let mut findings = Findings::new(&snap.host);
        let groups = groups(&ix, &self.known);
        // Each launcher-tree member's job, for the next reading.
        self.known = groups
            .iter()
            .filter(|g| g.job.is_none())
            .flat_map(|g| {
                let who = Remembered {
                    id: g.id.clone(),
                    launcher: g.launcher,
                    launcher_start: g.launcher_start,
                    name: g.name.clone(),
                };
                g.members
                    .iter()
                    .map(move |m| ((m.pid, m.start_time), who.clone()))
            })
            .collect();
        let mut alive_ids = std::collections::HashSet::with_capacity(groups.len());
        for g in groups {
            alive_ids.insert(g.id.clone());
            let report = self.one(&ix, &g, at, &mut out.changes, &mut findings);
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

    /// One job's reading: its track found or begun, its losses, its phase, its stragglers, its report.
    fn one(
        &mut self,
        snap: &Indexed<'_>,
        g: &Group,
        at: u64,
        changes: &mut Vec<JobChange>,
        findings: &mut Findings,
    ) -> JobReport {
        let opts = self.opts;
        let (ranks, helpers): (Vec<&Member>, Vec<&Member>) =
            g.members.iter().partition(|m| !m.helper);
        let started_ms = g
            .members
            .iter()
            .filter_map(|m| m.started_ms)
            .min()
            .unwrap_or(at);
        let (fresh, t) = begin(&mut self.tracks, g, started_ms, at);
        let signalled = &self.signalled;
        launcher_seen(t, snap, at);
        let (alive, newly_lost) = losses(snap, t, &ranks, &g.members, at, opts, signalled);
        let left_bytes = sum_known(alive.iter().map(|m| m.bytes));
        note_losses(t, g, newly_lost, &alive, left_bytes, changes);
        for l in &mut t.lost {
            // A rank lost as exited that its parent has not reaped past the window turned zombie.
            let unreaped = snap.proc(l.pid).is_some_and(|p| p.state.is_zombie());
            if l.how == LostHow::Exited && unreaped && at.saturating_sub(l.at_ms) >= opts.stuck_ms {
                l.how = LostHow::Zombie;
            }
        }
        remember(t, &ranks, at);
        let before = t.phase;
        // Memory at first sight of a job begun while the host was watched rose while it was watched. (A
        // process's start is known to the second: one begun in the second the watch began counts.)
        let unseen_start = fresh
            && self
                .watching_since
                .is_none_or(|w| started_ms / 1000 < w / 1000);
        let flow = next_phase(t, &alive, left_bytes, unseen_start, started_ms, at, opts);
        t.flow = flow;
        let phase = hang::phase(t, snap, &alive, at, opts);
        if left_bytes.is_some() {
            t.last_total = left_bytes;
        }
        note_phase(
            t,
            g,
            (before, phase),
            fresh,
            left_bytes,
            ranks.len(),
            at,
            changes,
        );
        let stragglers = stragglers(t, &alive, phase, at, opts);
        if phase == Phase::LostRank {
            lost_finding(snap, g, t, &alive, left_bytes, findings);
        }
        straggler_findings(snap, g, t, &stragglers, findings);
        let rank = |m: &&Member| Rank {
            pid: m.pid,
            gpus: m.gpus.clone(),
            bytes: m.bytes,
            state: m.state,
            straggler: stragglers.iter().any(|s| s.pid == m.pid),
        };
        JobReport {
            id: g.id.clone(),
            job: g.job.clone(),
            launcher: t.launcher.map(|(pid, _)| pid).or(g.launcher),
            launcher_gone_ms: t.launcher_gone_ms,
            name: g.name.clone(),
            ranks: ranks.iter().map(rank).collect(),
            helpers: helpers.iter().map(rank).collect(),
            gpus: union_gpus(alive.iter().copied()),
            bytes: left_bytes,
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
            phase_why: t.phase_why.clone(),
            waiting_on: t.waiting_on.clone(),
        }
    }
}

/// The job's track, begun where there is none (or where its launcher's PID now names another launcher);
/// whether it was begun now.
fn begin<'t>(
    tracks: &'t mut HashMap<String, Track>,
    g: &Group,
    started_ms: u64,
    at: u64,
) -> (bool, &'t mut Track) {
    // A launcher tree whose launcher's PID was reused is another job.
    if tracks.get(&g.id).is_some_and(|t| {
        g.job.is_none()
            && g.launcher_start != 0
            && t.launcher_start != 0
            && t.launcher_start != g.launcher_start
    }) {
        tracks.remove(&g.id);
    }
    let fresh = !tracks.contains_key(&g.id);
    let t = tracks.entry(g.id.clone()).or_insert_with(|| Track {
        launcher_start: g.launcher_start,
        started_ms,
        phase: Phase::Starting,
        flow: Phase::Starting,
        spin_since: None,
        no_signal: false,
        phase_why: None,
        waiting_on: Vec::new(),
        phase_since_ms: at,
        ranks: BTreeMap::new(),
        last_total: None,
        last_rise_ms: at,
        seen_warming: false,
        warmup_ms: None,
        settled_bytes: None,
        lost: Vec::new(),
        lost_pids: std::collections::HashSet::new(),
        unsettled: Vec::new(),
        launcher: g.launcher.map(|l| (l, g.launcher_start)),
        launcher_gone_ms: None,
    });
    (fresh, t)
}

/// Whether its launcher (as first seen) still runs; since when it is gone (a job whose launcher died is
/// still one job).
fn launcher_seen(t: &mut Track, snap: &Indexed<'_>, at: u64) {
    let here = t.launcher.is_some_and(|(pid, start)| {
        snap.proc(pid)
            .is_some_and(|p| (start == 0 || p.start_time == start) && !p.state.is_zombie())
    });
    if t.launcher.is_some() && !here {
        t.launcher_gone_ms.get_or_insert(at);
    }
}

/// The ranks lost now, kept (and told) while the others still hold GPU memory (or, where it is unread,
/// their GPUs): the whole job ending at once loses no rank.
fn note_losses(
    t: &mut Track,
    g: &Group,
    newly_lost: Vec<LostRank>,
    alive: &[&Member],
    left_bytes: Option<u64>,
    changes: &mut Vec<JobChange>,
) {
    let others_hold = match left_bytes {
        Some(b) => b > 0,
        None => alive.iter().any(|m| !m.gpus.is_empty()),
    };
    let mut newly_lost = newly_lost;
    newly_lost.extend(std::mem::take(&mut t.unsettled));
    if alive.is_empty() {
        // The whole job ended: no rank of it was lost.
        return;
    }
    if !others_hold {
        // Gone while the others read as holding nothing: remembered, not forgotten with this reading.
        t.unsettled = newly_lost;
        return;
    }
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

/// A job begun or a phase changed: told, and the phase kept with its time.
#[allow(clippy::too_many_arguments)] // the track and what one reading says of it
fn note_phase(
    t: &mut Track,
    g: &Group,
    (before, phase): (Phase, Phase),
    fresh: bool,
    total: Option<u64>,
    ranks: usize,
    at: u64,
    changes: &mut Vec<JobChange>,
) {
    if fresh {
        changes.push(JobChange::Started {
            job: g.id.clone(),
            name: g.name.clone(),
            ranks,
            gpus: union_gpus(g.members.iter()),
        });
    }
    if phase == before && !fresh {
        return;
    }
    if !fresh {
        changes.push(JobChange::Phase {
            job: g.id.clone(),
            phase,
            after_ms: at.saturating_sub(t.phase_since_ms),
            bytes: total,
            warmup_ms: (phase == Phase::Settled).then_some(t.warmup_ms).flatten(),
        });
    }
    // Settled dates from when memory stopped rising, hung from when the GPUs began to spin.
    t.phase_since_ms = match phase {
        Phase::Settled => t.last_rise_ms,
        Phase::Hung => t.spin_since.unwrap_or(at),
        _ => at,
    };
    t.phase = phase;
}

/// A rank in state D or stopped: off its collective until it leaves that state, lost once it stays past the
/// window (loading weights from a slow disk passes through D briefly). A zombie has exited.
fn held_up(s: ProcState) -> Option<LostHow> {
    match s {
        ProcState::DiskSleep => Some(LostHow::StuckD),
        ProcState::Stopped | ProcState::TracingStop => Some(LostHow::Stopped),
        ProcState::Zombie | ProcState::Dead => Some(LostHow::Zombie),
        _ => None,
    }
}

/// The ranks alive now, and those lost since the last reading: gone from /proc (or their PID another
/// process's), or held up past the window. A rank gpusweep signalled was ended, not lost (a sweep of a
/// healthy job is no crash): this process's own signals (`signalled`), and those another gpusweep on the
/// host noted where its note's owner could have sent them (the reading's `acts`).
fn losses<'a>(
    snap: &Indexed<'_>,
    t: &Track,
    ranks: &[&'a Member],
    members: &[Member],
    at: u64,
    opts: JobOptions,
    signalled: &HashMap<u32, (u64, u64)>,
) -> (Vec<&'a Member>, Vec<LostRank>) {
    let mut alive = Vec::new();
    let mut lost = Vec::new();
    for &m in ranks {
        let prev = t.ranks.get(&m.pid).filter(|s| s.start_time == m.start_time);
        let Some(how) = held_up(m.state) else {
            alive.push(m);
            continue;
        };
        // A zombie has exited: lost now, as exited (a zombie still, past the window, it is said so).
        if how == LostHow::Zombie {
            lost.push(LostRank {
                pid: m.pid,
                gpus: prev.map_or_else(|| m.gpus.clone(), |s| s.gpus.clone()),
                how: LostHow::Exited,
                at_ms: at,
                bytes: prev.and_then(|s| s.bytes).or(m.bytes),
                cmdline: m.cmdline.clone(),
            });
            continue;
        }
        let since = prev.and_then(|s| s.stuck_since).unwrap_or(at);
        if at.saturating_sub(since) >= opts.stuck_ms {
            lost.push(LostRank {
                pid: m.pid,
                gpus: prev.map_or_else(|| m.gpus.clone(), |s| s.gpus.clone()),
                how,
                at_ms: at,
                bytes: prev.and_then(|s| s.bytes).or(m.bytes),
                cmdline: m.cmdline.clone(),
            });
        } else if !how.off_the_gpu() {
            alive.push(m);
        }
    }
    // Ranks seen last time and absent now exited (or their PID went to another process). A helper now
    // (it let a listed peer take its GPU) is no loss.
    let present: std::collections::HashSet<(u32, u64)> =
        members.iter().map(|m| (m.pid, m.start_time)).collect();
    for (pid, s) in &t.ranks {
        if present.contains(&(*pid, s.start_time)) {
            continue;
        }
        let now = snap.proc(*pid).filter(|p| p.start_time == s.start_time);
        // Exited: a zombie not reaped yet, or still on its way out (its files closed while the driver frees
        // its memory, read in that window).
        let exited = now.is_some_and(|p| p.state.is_zombie() || p.exiting);
        // Alive but no longer on a GPU: it let go of its device, which is no loss.
        if now.is_none() || exited {
            lost.push(LostRank {
                pid: *pid,
                gpus: s.gpus.clone(),
                how: LostHow::Exited,
                at_ms: at,
                bytes: s.bytes,
                cmdline: s.cmdline.clone(),
            });
        }
    }
    lost.retain(|l| {
        let who = t
            .ranks
            .get(&l.pid)
            .map(|s| (s.start_time, s.uid))
            .or_else(|| {
                members
                    .iter()
                    .find(|m| m.pid == l.pid)
                    .map(|m| (m.start_time, m.uid))
            });
        let ended_by_us = who.is_some_and(|(start, uid)| {
            signalled.get(&l.pid).is_some_and(|(s, _)| *s == start)
                || snap
                    .acts
                    .iter()
                    .any(|a| a.pid == l.pid && a.start_time == start && a.proves_for(uid))
        });
        !t.lost_pids.contains(&l.pid) && !ended_by_us
    });
    (alive, lost)
}

/// The ranks of this reading remembered for the next one.
fn remember(t: &mut Track, ranks: &[&Member], at: u64) {
    let old = std::mem::take(&mut t.ranks);
    for m in ranks {
        let prev = old.get(&m.pid).filter(|s| s.start_time == m.start_time);
        t.ranks.insert(
            m.pid,
            Seen {
                start_time: m.start_time,
                gpus: prev.map_or_else(
                    || m.gpus.clone(),
                    |s| {
                        if m.gpus.is_empty() {
                            s.gpus.clone()
                        } else {
                            m.gpus.clone()
                        }
                    },
                ),
                bytes: m.bytes.or_else(|| prev.and_then(|s| s.bytes)),
                cmdline: m.cmdline.clone(),
                uid: m.uid,
                stuck_since: held_up(m.state)
                    .map(|_| prev.and_then(|s| s.stuck_since).unwrap_or(at)),
                lag_since: prev.and_then(|s| s.lag_since),
            },
        );
    }
}

/// The job's phase now, from what its live ranks hold and held.
#[allow(clippy::too_many_arguments)] // the track and what one reading says of it
fn next_phase(
    t: &mut Track,
    alive: &[&Member],
    total: Option<u64>,
    start_unseen: bool,
    started_ms: u64,
    at: u64,
    opts: JobOptions,
) -> Phase {
    let before = t.flow;
    if !t.lost.is_empty() {
        return Phase::LostRank;
    }
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
            // Memory at first sight: it rose since the job started, if that was within the window or
            // while the host was watched (`start_unseen` false).
            if start_unseen && at.saturating_sub(started_ms) >= opts.settle_ms {
                Phase::Holding
            } else {
                t.seen_warming = true;
                Phase::Loading
            }
        }
        (Some(now), Some(_)) => {
            if at.saturating_sub(t.last_rise_ms) >= opts.settle_ms && before != Phase::Settled {
                t.warmup_ms = t
                    .seen_warming
                    .then(|| t.last_rise_ms.saturating_sub(t.started_ms));
                t.settled_bytes = Some(now);
                Phase::Settled
            } else if before == Phase::Starting && now > 0 {
                // From nothing charged to something: its rise was seen, however small (a CUDA context).
                t.seen_warming = true;
                t.last_rise_ms = at;
                Phase::Loading
            } else if before == Phase::Starting || before == Phase::Unknown {
                Phase::Holding
            } else {
                before
            }
        }
    }
}

/// A rank lagging its peers while the job loads, past the window: who, what it holds, its peers' median,
/// for how long.
struct Straggler {
    pid: u32,
    bytes: u64,
    median: u64,
    peers: usize,
    for_ms: u64,
}

/// While loading, a rank far behind its peers' median for the window, judged among the ranks whose memory
/// is known (a rank NVML does not list yet is no evidence either way).
fn stragglers(
    t: &mut Track,
    alive: &[&Member],
    phase: Phase,
    at: u64,
    opts: JobOptions,
) -> Vec<Straggler> {
    let mut out = Vec::new();
    let known: Vec<(u32, u64)> = alive
        .iter()
        .filter_map(|m| m.bytes.map(|b| (m.pid, b)))
        .collect();
    if phase != Phase::Loading || known.len() < 2 {
        for s in t.ranks.values_mut() {
            s.lag_since = None;
        }
        return out;
    }
    let med = median(known.iter().map(|k| k.1).collect());
    for (pid, b) in &known {
        let Some(s) = t.ranks.get_mut(pid) else {
            continue;
        };
        if lags(*b, med) {
            let since = *s.lag_since.get_or_insert(at);
            if at.saturating_sub(since) >= opts.straggle_ms {
                out.push(Straggler {
                    pid: *pid,
                    bytes: *b,
                    median: med,
                    peers: known.len() - 1,
                    for_ms: at - since,
                });
            }
        } else {
            s.lag_since = None;
        }
    }
    out
}

fn straggler_findings(
    snap: &Indexed<'_>,
    g: &Group,
    t: &Track,
    stragglers: &[Straggler],
    findings: &mut Findings,
) {
    for st in stragglers {
        let gpus = t
            .ranks
            .get(&st.pid)
            .map(|s| s.gpus.clone())
            .unwrap_or_default();
        findings.push(Draft {
            kind: FindingKind::Straggler,
            severity: Severity::Warning,
            gpu: gpus.first().copied(),
            pid: Some(st.pid),
            bytes: Some(st.bytes),
            detail: format!(
                "job {}: rank {} on GPU {} holds {} while its {} peers' median is {}, for {} of \
                 loading: a slower shard load, a slower GPU or link, or a rank stuck before its \
                 collective",
                g.id,
                super::findings::who(snap, st.pid),
                fmt_gpus(&gpus),
                fmt_bytes(Some(st.bytes)),
                st.peers,
                fmt_bytes(Some(st.median)),
                fmt_span(st.for_ms)
            ),
            action: format!(
                "compare its GPU's clocks and PCIe/NVLink with its peers' (`gpusweep snapshot`); if it \
                 stops growing, `py-spy dump --pid {}` shows where it waits",
                st.pid
            ),
            target_pid: None,
        });
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
                gpusweep_core::format::fmt_clock(l.at_ms),
                alive.len(),
                held,
                fmt_gpus(&left_gpus),
            ),
            action: format!(
                "end the job now rather than wait for the timeout: `gpusweep sweep --job {}` (or `gpusweep \
                 run --fail-fast` to do it unasked)",
                g.id
            ),
            // Its launcher, where it still runs (ending it ends the job); a launcher gone names no one.
            target_pid: g.launcher.filter(|l| snap.proc(*l).is_some()),
        });
    }
}

mod hang;

#[cfg(test)]
mod tests;
