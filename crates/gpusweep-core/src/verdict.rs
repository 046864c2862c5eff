//! What a host's ledger decided of a reading (`Verdict`: findings, jobs, each GPU's state), apart from what
//! was read, and the one way two readings are compared (`HostSnapshot::diff`): how far what was read moved,
//! and how far the verdict did. Every "is this news?" question of the ledger, the serve's memory-alone
//! events and the agent is a comparison of one `Diff`, so none of them can drift from the others.
//!
//! `HostSnapshot` stays the JSON view every wire carries (the verdict's fields inside the reading's): a
//! `Verdict` is taken out of it and put back whole.

use crate::job::{JobReport, Rank};
use crate::model::{Finding, Gpu, GpuState, HostSnapshot, ListedProcess, ShmInfo};

/// How far one thing moved from another, in order: a comparison says "at most memory".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Moved {
    Nothing,
    /// Only memory: used bytes, what NVML charges each process or job.
    Memory,
    /// Only figures: the bytes findings quote (a straggler's "holds 24.8 GiB"), with memory.
    Figures,
    /// Anything else: a process, a finding's subject or severity, a phase, a GPU's identity.
    More,
}

/// Two readings compared: what was read, and what was decided (a finding's wording, which may quote an
/// age, aside; GPU states aside too, as they follow from the reading and the findings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Diff {
    pub reading: Moved,
    pub verdict: Moved,
}

impl Diff {
    /// Nothing moved: the later reading says what this one said.
    pub fn is_nothing(self) -> bool {
        self.reading == Moved::Nothing && self.verdict == Moved::Nothing
    }

    /// Whether what was read moved (or, where `judged_remotely`, what its serve decided): a raw reading
    /// compared with the last one judged.
    pub fn input_moved(self, judged_remotely: bool) -> bool {
        self.reading != Moved::Nothing || (judged_remotely && self.verdict != Moved::Nothing)
    }
}

/// What a host's ledger decided of one reading.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdict {
    pub findings: Vec<Finding>,
    pub jobs: Vec<JobReport>,
    /// Each GPU's state, in the reading's order: (its index, its state).
    pub states: Vec<(u32, Option<GpuState>)>,
}

impl Verdict {
    /// The verdict a judged reading carries (a copy).
    pub fn of(snap: &HostSnapshot) -> Verdict {
        Verdict::with_findings(snap, snap.findings.clone())
    }

    /// A judged reading's jobs and GPU states (copied) with `findings`, its own taken out of it.
    pub fn with_findings(snap: &HostSnapshot, findings: Vec<Finding>) -> Verdict {
        Verdict {
            findings,
            jobs: snap.jobs.clone(),
            states: snap.gpus.iter().map(|g| (g.index, g.state)).collect(),
        }
    }

    /// The state it gave the GPU of `index`; `None` where its reading had no such GPU.
    pub fn state(&self, index: u32) -> Option<Option<GpuState>> {
        self.states
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, s)| *s)
    }

    /// Whether `snap` has the GPUs this verdict was made of (the same, in the same order).
    pub fn fits(&self, snap: &HostSnapshot) -> bool {
        self.states.len() == snap.gpus.len()
            && snap
                .gpus
                .iter()
                .zip(&self.states)
                .all(|(g, (i, _))| g.index == *i)
    }

    /// Put into `snap` in place of its own: `false`, and nothing changed, where it does not fit (then
    /// `snap` is not a reading of the shape this verdict was made of).
    pub fn put(self, snap: &mut HostSnapshot) -> bool {
        if !self.fits(snap) {
            return false;
        }
        for (g, (_, s)) in snap.gpus.iter_mut().zip(self.states) {
            g.state = s;
        }
        snap.findings = self.findings;
        snap.jobs = self.jobs;
        true
    }

    /// How far `next`'s verdict moved from this one.
    pub fn moved_to(&self, next: &HostSnapshot) -> Moved {
        findings_moved(&self.findings, &next.findings).max(jobs_moved(&self.jobs, &next.jobs))
    }
}

impl HostSnapshot {
    /// How far `next` moved from this reading, as read and as judged.
    pub fn diff(&self, next: &HostSnapshot) -> Diff {
        Diff {
            reading: reading_moved(self, next),
            verdict: findings_moved(&self.findings, &next.findings)
                .max(jobs_moved(&self.jobs, &next.jobs)),
        }
    }
}

/// How far a list of findings moved: the same things in the same order, at the same severities, asking the
/// same actions (else `More`), quoting other bytes (`Figures`) or not (`Nothing`). Wording is never compared:
/// it may quote an age.
pub fn findings_moved(a: &[Finding], b: &[Finding]) -> Moved {
    fn subject(x: &Finding) -> impl PartialEq + '_ {
        (
            x.kind,
            x.severity,
            x.host.as_str(),
            x.gpu,
            x.pid,
            x.action.as_str(),
            x.target_pid,
            &x.file,
        )
    }
    if a.len() != b.len() || a.iter().zip(b).any(|(x, y)| subject(x) != subject(y)) {
        Moved::More
    } else if a.iter().zip(b).any(|(x, y)| x.bytes != y.bytes) {
        Moved::Figures
    } else {
        Moved::Nothing
    }
}

fn jobs_moved(a: &[JobReport], b: &[JobReport]) -> Moved {
    if a.len() != b.len() {
        return Moved::More;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| job_moved(x, y))
        .max()
        .unwrap_or(Moved::Nothing)
}

/// How far a later reading of this host moved from this one as read, whatever their times: GPU gauges,
/// a /dev/shm file's age and what the ledger decides (findings, jobs, states: `Verdict`)
/// aside. Every field is named, so a new one cannot be forgotten here.
#[allow(clippy::too_many_lines)] // every field named, each compared: none can be forgotten
fn reading_moved(a: &HostSnapshot, b: &HostSnapshot) -> Moved {
    let HostSnapshot {
        host,
        error,
        taken_at_ms: _,
        source,
        gpu_error,
        driver_version,
        gpus,
        processes,
        holders,
        zombies,
        shm,
        unreadable_processes,
        in_child_pid_namespace,
        missing_features,
        findings: _,
        jobs: _,
        live_url,
        simulated,
        acts,
    } = a;
    let shm_same = |x: &Option<ShmInfo>, y: &Option<ShmInfo>| match (x, y) {
        (Some(x), Some(y)) => {
            x.total == y.total
                && x.used == y.used
                && x.free == y.free
                && x.shmmax == y.shmmax
                && x.shmall == y.shmall
                && x.shmmax_unlimited == y.shmmax_unlimited
                && x.shmall_unlimited == y.shmall_unlimited
                && x.shmmni == y.shmmni
                && x.sysv_segments == y.sysv_segments
                && x.segments.len() == y.segments.len()
                && x.segments.iter().zip(&y.segments).all(|(s, t)| {
                    (&s.name, s.bytes, &s.users, s.dev, s.ino, s.special)
                        == (&t.name, t.bytes, &t.users, t.dev, t.ino, t.special)
                })
        }
        (None, None) => true,
        _ => false,
    };
    let rest_same = *host == b.host
        && *error == b.error
        && *source == b.source
        && *gpu_error == b.gpu_error
        && *driver_version == b.driver_version
        && gpus.len() == b.gpus.len()
        && *processes == b.processes
        && *holders == b.holders
        && *zombies == b.zombies
        && shm_same(shm, &b.shm)
        && *unreadable_processes == b.unreadable_processes
        && *in_child_pid_namespace == b.in_child_pid_namespace
        && *missing_features == b.missing_features
        && *simulated == b.simulated
        && *live_url == b.live_url
        && *acts == b.acts;
    if !rest_same {
        return Moved::More;
    }
    gpus.iter()
        .zip(&b.gpus)
        .map(|(x, y)| gpu_moved(x, y))
        .max()
        .unwrap_or(Moved::Nothing)
}

/// How far a later reading of this GPU moved from this one, its gauges aside: nothing, only its memory
/// (its used bytes, what each listed process is charged), or more. Every field is named, so a new one
/// cannot be forgotten here.
fn gpu_moved(a: &Gpu, b: &Gpu) -> Moved {
    let Gpu {
        index,
        uuid,
        name,
        pci_bus_id,
        minor,
        memory,
        utilization: _,
        temperature_c: _,
        power_mw: _,
        counters: _,
        compute_capability,
        mig_enabled,
        persistence_mode,
        processes,
        error,
        judged,
        state: _,
        kept,
        reset_blockers: _,
        recovery_action,
        mig,
        mig_error,
        xids,
    } = a;
    let same_shape = |x: &[ListedProcess], y: &[ListedProcess]| {
        x.len() == y.len()
            && x.iter()
                .zip(y)
                .all(|(p, q)| (p.pid, p.kind, &p.name) == (q.pid, q.kind, &q.name))
    };
    let same_but_memory = *index == b.index
        && *uuid == b.uuid
        && *name == b.name
        && *pci_bus_id == b.pci_bus_id
        && *minor == b.minor
        && (memory.total, memory.reserved) == (b.memory.total, b.memory.reserved)
        && *compute_capability == b.compute_capability
        && *mig_enabled == b.mig_enabled
        && *persistence_mode == b.persistence_mode
        && same_shape(processes, &b.processes)
        && *error == b.error
        && *judged == b.judged
        && *kept == b.kept
        && *recovery_action == b.recovery_action
        && *mig_error == b.mig_error
        && *xids == b.xids
        && mig.len() == b.mig.len()
        && mig.iter().zip(&b.mig).all(|(x, y)| {
            (
                x.gpu_instance,
                x.compute_instance,
                &x.profile,
                &x.uuid,
                &x.error,
            ) == (
                y.gpu_instance,
                y.compute_instance,
                &y.profile,
                &y.uuid,
                &y.error,
            ) && x.processes.len() == y.processes.len()
                && x.processes
                    .iter()
                    .zip(&y.processes)
                    .all(|(p, q)| p.pid == q.pid)
        });
    if !same_but_memory {
        Moved::More
    } else if *memory == b.memory
        && *processes == b.processes
        && mig
            .iter()
            .zip(&b.mig)
            .all(|(x, y)| x.memory == y.memory && x.processes == y.processes)
    {
        Moved::Nothing
    } else {
        Moved::Memory
    }
}

/// How far a later report of this job moved from this one: nothing, only what NVML charges its ranks
/// (`Memory`), or more.
fn job_moved(a: &JobReport, b: &JobReport) -> Moved {
    if a == b {
        return Moved::Nothing;
    }
    let JobReport {
        id,
        job,
        launcher,
        launcher_gone_ms,
        name,
        ranks,
        helpers,
        gpus,
        bytes: _,
        started_ms,
        phase,
        phase_since_ms,
        warmup_ms,
        settled_bytes,
        lost,
        kept,
        phase_why,
        waiting_on,
    } = a;
    let but_memory = *id == b.id
        && *job == b.job
        && *launcher == b.launcher
        && *launcher_gone_ms == b.launcher_gone_ms
        && *name == b.name
        && alike_but_charges(ranks, &b.ranks)
        && alike_but_charges(helpers, &b.helpers)
        && *gpus == b.gpus
        && *started_ms == b.started_ms
        && *phase == b.phase
        && *phase_since_ms == b.phase_since_ms
        && *warmup_ms == b.warmup_ms
        && *settled_bytes == b.settled_bytes
        && *lost == b.lost
        && *kept == b.kept
        && *phase_why == b.phase_why
        && *waiting_on == b.waiting_on;
    if but_memory {
        Moved::Memory
    } else {
        Moved::More
    }
}

/// Whether two lists of ranks are the same processes, GPUs, states and stragglers (charges aside).
fn alike_but_charges(a: &[Rank], b: &[Rank]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            (x.pid, &x.gpus, x.state, x.straggler) == (y.pid, &y.gpus, y.state, y.straggler)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{FindingKind, Gpu, ListedProcess, Memory, ProcessKind, Severity};

    fn reading() -> HostSnapshot {
        HostSnapshot {
            host: "h".into(),
            gpus: vec![Gpu {
                index: 0,
                memory: Memory {
                    used: Some(10),
                    total: Some(100),
                    reserved: None,
                },
                processes: vec![ListedProcess {
                    pid: 7,
                    used_bytes: Some(10),
                    kind: ProcessKind::Compute,
                    name: None,
                    gpu_instance: None,
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn finding(bytes: Option<u64>, detail: &str) -> Finding {
        Finding {
            kind: FindingKind::Ghost,
            severity: Severity::Leak,
            host: "h".into(),
            gpu: Some(0),
            pid: Some(7),
            bytes,
            detail: detail.into(),
            action: String::new(),
            target_pid: None,
            gpu_instance: None,
            file: None,
            confirms_as: None,
        }
    }

    #[test]
    fn each_kind_of_move_is_told_apart() {
        let base = reading();
        assert!(base.diff(&base.clone()).is_nothing());
        let mut later = base.clone();
        later.gpus[0].utilization = Some(99);
        assert!(base.diff(&later).is_nothing(), "gauges are not news");
        later.gpus[0].memory.used = Some(20);
        later.gpus[0].processes[0].used_bytes = Some(20);
        assert_eq!(base.diff(&later).reading, Moved::Memory);
        later.gpus[0].processes[0].pid = 8;
        assert_eq!(base.diff(&later).reading, Moved::More, "another process");
        let mut other = base.clone();
        other.gpus[0].memory.total = Some(200);
        assert_eq!(
            base.diff(&other).reading,
            Moved::More,
            "another total is another GPU"
        );

        let mut judged = base.clone();
        judged.findings = vec![finding(Some(10), "held 1 s")];
        let mut next = judged.clone();
        next.findings[0].detail = "held 2 s".into();
        assert!(
            judged.diff(&next).is_nothing(),
            "wording (an age) is not news"
        );
        next.findings[0].bytes = Some(20);
        assert_eq!(judged.diff(&next).verdict, Moved::Figures);
        next.findings[0].severity = Severity::Warning;
        assert_eq!(judged.diff(&next).verdict, Moved::More);
        assert_eq!(
            judged.diff(&next).reading,
            Moved::Nothing,
            "the verdict is not the reading"
        );
        assert!(!judged.diff(&next).input_moved(false) && judged.diff(&next).input_moved(true));
    }

    #[test]
    fn a_verdict_goes_back_only_into_a_reading_of_its_shape() {
        let mut a = reading();
        a.gpus[0].state = Some(GpuState::Leak);
        a.findings = vec![finding(Some(10), "x")];
        let v = Verdict::of(&a);
        assert_eq!(v.state(0), Some(Some(GpuState::Leak)));
        assert_eq!(v.state(1), None);
        assert_eq!(v.moved_to(&a), Moved::Nothing);
        let mut b = reading();
        assert!(v.clone().put(&mut b));
        assert_eq!(b, a);
        let mut two = reading();
        two.gpus.push(Gpu::default());
        assert!(!v.put(&mut two));
        assert!(two.findings.is_empty(), "nothing put into another shape");
    }
}
