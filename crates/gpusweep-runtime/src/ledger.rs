//! One host's ledger: the only place a reading is judged. Each reading is compared with the one before
//! (does it say anything new?), judged once (findings, each GPU's state, the counts the header shows), and
//! turned into the events since the previous reading; signals sent to the host and their answers go through
//! it too, so it keeps the clocks that say how long a GPU took to read clean after the signal that could
//! free it. Front ends (the TUI, `serve`, the CLI gates, `--events`) only show or publish what it hands out.
//!
//! It is a plain value with no I/O and no clock of its own (callers pass the time): the fleet wraps one per
//! host, and tests drive it directly.

use std::collections::HashMap;
use std::sync::Arc;

use gpusweep_analyze::confirm::Confirm;
use gpusweep_analyze::events::{between, gpus_of_targets, released_by_deaths, verdict_events};
use gpusweep_analyze::jobs::{JobBook, JobChange};
use gpusweep_analyze::state::busy_moved;
use gpusweep_analyze::{AnalyzeOptions, analyzed};
use gpusweep_core::action::{ActionAnswer, ActionRequest};
use gpusweep_core::conn::ConnStatus;
use gpusweep_core::event::{Event, EventKind};
use gpusweep_core::model::{
    Feature, Gauges, GpuState, HostSnapshot, SaidGauges, Severity, SourceKind,
};
use gpusweep_core::verdict::{Moved, Verdict, findings_moved};

/// Where a reading came from and what may be done through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Provenance {
    pub source: SourceKind,
    /// The simulated demo cluster, wherever it was read from.
    pub simulated: bool,
    /// Read over HTTP or from Prometheus: no kill, sweep or removal reaches it.
    pub read_only: bool,
}

impl Provenance {
    pub fn of(snap: &HostSnapshot) -> Provenance {
        Provenance {
            source: snap.source,
            simulated: snap.simulated,
            read_only: snap.source.read_only(),
        }
    }
}

/// A reading's GPUs by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateCounts {
    pub clean: usize,
    pub in_use: usize,
    pub leak: usize,
    /// Unknown or unreadable.
    pub unknown: usize,
}

impl StateCounts {
    fn of(snap: &HostSnapshot) -> StateCounts {
        let mut c = StateCounts::default();
        for g in &snap.gpus {
            match g.state {
                Some(GpuState::Clean) => c.clean += 1,
                Some(GpuState::InUse) => c.in_use += 1,
                // Not ready for a launch: as loud as a leak.
                Some(GpuState::Leak | GpuState::NeedsReset) => c.leak += 1,
                Some(GpuState::Unknown | GpuState::Error) | None => c.unknown += 1,
            }
        }
        c
    }
}

impl std::ops::Add for StateCounts {
    type Output = StateCounts;
    fn add(self, o: StateCounts) -> StateCounts {
        StateCounts {
            clean: self.clean + o.clean,
            in_use: self.in_use + o.in_use,
            leak: self.leak + o.leak,
            unknown: self.unknown + o.unknown,
        }
    }
}

/// A reading as its host's ledger judged it: the one value every front end shows or publishes.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    /// The reading, with its findings and each GPU's state filled in. Shared: the ledger and the front end
    /// that shows it hold one reading, not a copy each (15 KB twice for each of a 10,000-host TUI's hosts);
    /// a later reading that says the same leaves it as it is and goes on as its time and gauges
    /// (`Judgement::Same`), which each holder keeps beside it.
    pub snap: Arc<HostSnapshot>,
    pub counts: StateCounts,
    /// Findings of severity `leak`.
    pub leaks: usize,
    /// Every GPU read and clean (and at least one GPU).
    pub all_clean: bool,
    /// Moves only when what the host says changes, not with its time or gauges: readers that sent a reading
    /// send it again only when this moved.
    pub content: u64,
    pub provenance: Provenance,
    /// The content of the reading handed on before it, where this one reads as that one but for its memory
    /// and is judged the same but for memory: a serve may send it as memory alone (decided here, once, for
    /// every reader).
    pub memory_from: Option<u64>,
    /// As `memory_from`, where the findings may differ in their figures too (a straggler's bytes): a serve
    /// may send the memory with the findings to a stream that asked for them (`findings=moved`).
    pub figures_from: Option<u64>,
}

impl Judged {
    fn of(mut snap: HostSnapshot, content: u64) -> Judged {
        // Kept until the host says something new, by every front end that shows it.
        snap.shrink_to_fit();
        let counts = StateCounts::of(&snap);
        Judged {
            leaks: snap
                .findings
                .iter()
                .filter(|f| f.severity == Severity::Leak)
                .count(),
            all_clean: !snap.gpus.is_empty() && counts.clean == snap.gpus.len(),
            counts,
            content,
            provenance: Provenance::of(&snap),
            memory_from: None,
            figures_from: None,
            snap: Arc::new(snap),
        }
    }
}

/// A reading that moved only its memory, as the ledger judged it, for a front end that holds the reading
/// handed on before it (kept fresh): the numbers and what they amount to, put onto that reading in place.
/// A whole copy handed on, and the one it replaced dropped, per step of each warm-up was a sixth of a
/// 10,000-host TUI's time.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryJudged {
    pub taken_at_ms: u64,
    /// The gauges said since the reading it is put onto (none: as before).
    pub gauges: SaidGauges,
    /// Each GPU's used bytes.
    pub used: Vec<Option<u64>>,
    /// Per GPU, what NVML charges each of its listed processes.
    pub charged: Vec<Vec<Option<u64>>>,
    /// The ledger's verdict of it.
    pub verdict: Verdict,
    pub counts: StateCounts,
    pub leaks: usize,
    pub all_clean: bool,
    pub content: u64,
    /// The judged reading's own (`Judged::memory_from`, `Judged::figures_from`).
    pub from: (Option<u64>, Option<u64>),
}

impl MemoryJudged {
    fn of(j: &Judged, gauges: SaidGauges) -> MemoryJudged {
        let s = &j.snap;
        let (used, charged) = s.memory_numbers();
        MemoryJudged {
            taken_at_ms: s.taken_at_ms,
            gauges,
            used,
            charged,
            verdict: Verdict::of(s),
            counts: j.counts,
            leaks: j.leaks,
            all_clean: j.all_clean,
            content: j.content,
            from: (j.memory_from, j.figures_from),
        }
    }

    /// Put onto the reading it was judged after: `false`, and nothing changed, where that reading has
    /// another shape (then it was not the one).
    pub fn put_onto_reading(self, snap: &mut HostSnapshot) -> bool {
        if !snap.memory_fits(&self.used, &self.charged) || !self.verdict.fits(snap) {
            return false;
        }
        snap.put_memory(self.taken_at_ms, &self.used, &self.charged);
        snap.refresh_said(self.taken_at_ms, &self.gauges);
        self.verdict.put(snap)
    }

    /// `put_onto_reading`, with what the ledger counted.
    pub fn put_onto(self, j: &mut Judged) -> bool {
        let (counts, leaks, all_clean, content, from) = (
            self.counts,
            self.leaks,
            self.all_clean,
            self.content,
            self.from,
        );
        if !self.put_onto_reading(Arc::make_mut(&mut j.snap)) {
            return false;
        }
        (j.counts, j.leaks, j.all_clean, j.content) = (counts, leaks, all_clean, content);
        (j.memory_from, j.figures_from) = from;
        true
    }

    /// A later reading that said the same: its time and the gauges it said.
    pub fn refresh(&mut self, taken_at_ms: u64, gauges: SaidGauges) {
        self.taken_at_ms = self.taken_at_ms.max(taken_at_ms);
        self.gauges = std::mem::take(&mut self.gauges).then(gauges);
    }
}

/// What a reading amounts to.
#[derive(Debug, Clone, PartialEq)]
pub enum Judgement {
    /// It says something new (or comes after a silence): the whole judged reading.
    New(Box<Judged>),
    /// Only its memory moved since the reading handed on before, to a ledger told to hand that on alone.
    Memory(Box<MemoryJudged>),
    /// It says what the last one said: only its time and the gauges it said are new.
    Same {
        taken_at_ms: u64,
        gauges: SaidGauges,
    },
}

/// What readings that said the same as the last said since: their time and every GPU's gauges (empty
/// until one said some: as in the reading).
#[derive(Debug, Clone)]
struct Fresh {
    taken_at_ms: u64,
    gauges: Vec<Gauges>,
}

impl Judgement {
    /// This update followed by `next`, as one: what a front end that has not taken this one yet takes in
    /// place of both (a host's slot holds one update, however fast the host sends). A whole reading takes
    /// later memory and gauges in place; memory alone keeps the gauges a later one did not say.
    #[must_use]
    pub fn then(self, next: Judgement) -> Judgement {
        match (self, next) {
            (_, Judgement::New(j)) => Judgement::New(j),
            (Judgement::New(mut j), Judgement::Memory(m)) => {
                // Made from the ledger's last reading, which the waiting one is: it fits.
                let whole = m.put_onto(&mut j);
                debug_assert!(whole, "memory alone fits the reading it was judged after");
                Judgement::New(j)
            }
            (earlier, Judgement::Memory(mut m)) => {
                m.gauges = earlier.said_gauges().then(m.gauges);
                Judgement::Memory(m)
            }
            (
                Judgement::New(mut j),
                Judgement::Same {
                    taken_at_ms,
                    gauges,
                },
            ) => {
                Arc::make_mut(&mut j.snap).refresh_said(taken_at_ms, &gauges);
                Judgement::New(j)
            }
            (
                Judgement::Memory(mut m),
                Judgement::Same {
                    taken_at_ms,
                    gauges,
                },
            ) => {
                m.refresh(taken_at_ms, gauges);
                Judgement::Memory(m)
            }
            (
                Judgement::Same {
                    gauges: waiting, ..
                },
                Judgement::Same {
                    taken_at_ms,
                    gauges,
                },
            ) => Judgement::Same {
                taken_at_ms,
                // What the later did not say, the waiting one's still holds.
                gauges: waiting.then(gauges),
            },
        }
    }

    /// The gauges it says.
    fn said_gauges(self) -> SaidGauges {
        match self {
            Judgement::New(j) => SaidGauges::every(j.snap.gauges()),
            Judgement::Memory(m) => m.gauges,
            Judgement::Same { gauges, .. } => gauges,
        }
    }
}

#[derive(Debug)]
pub struct Ledger {
    label: String,
    opts: AnalyzeOptions,
    last: Option<Judged>,
    /// The time and gauges said since `last` was judged, kept beside it rather than put into it: the
    /// reading stays the one its front end holds too (see `Judged::snap`).
    fresh: Option<Fresh>,
    content: u64,
    /// The host went down or stale since its last reading: the next one is handed on whole, so whoever
    /// counted the host unreadable gets a reading to count it again.
    resend: bool,
    down: bool,
    /// Per GPU: the first signal since it was last clean that could free it (Unix ms).
    signalled: HashMap<u32, u64>,
    /// Per GPU: when the last of its holders died, since it was last clean.
    exited: HashMap<u32, u64>,
    /// The first signal since the host was last all clean that could free one of its GPUs.
    first_signal: Option<u64>,
    /// Its jobs, reading after reading (phases, lost ranks, stragglers).
    jobs: JobBook,
    /// When each finding was first seen: one seen to appear is a leak only once it lasts.
    confirm: Confirm,
    /// When the last reading's earliest lowered finding will have lasted the window.
    confirm_due: Option<u64>,
    /// Its front end holds each reading handed on: a reading that moved only its memory goes on as that.
    memory_alone: bool,
}

impl Ledger {
    pub fn new(label: &str, opts: AnalyzeOptions) -> Ledger {
        Ledger {
            label: label.to_string(),
            opts,
            last: None,
            fresh: None,
            content: 0,
            resend: false,
            down: false,
            signalled: HashMap::new(),
            exited: HashMap::new(),
            first_signal: None,
            jobs: JobBook::new(opts.jobs),
            confirm: Confirm::default(),
            confirm_due: None,
            memory_alone: false,
        }
    }

    /// Hand a reading that moved only its memory on as `Judgement::Memory`: for a front end that holds
    /// every reading handed on (kept fresh) and puts that onto it.
    pub fn hand_on_memory_alone(&mut self) {
        self.memory_alone = true;
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// The last reading judged, with the time and gauges said since.
    pub fn latest(&self) -> Option<Judged> {
        let last = self.last.as_ref()?;
        Some(match self.fresh {
            Some(_) => Judged {
                snap: Arc::new(self.latest_snap()?),
                ..last.clone()
            },
            None => last.clone(),
        })
    }

    /// Whether `snap` is the last reading judged itself, not a copy.
    #[cfg(test)]
    pub(crate) fn shares(&self, snap: &Arc<HostSnapshot>) -> bool {
        self.last
            .as_ref()
            .is_some_and(|l| Arc::ptr_eq(&l.snap, snap))
    }

    /// A copy of the last reading with the time and gauges said since, to judge again.
    fn latest_snap(&self) -> Option<HostSnapshot> {
        let mut snap = HostSnapshot::clone(&self.last.as_ref()?.snap);
        if let Some(f) = &self.fresh {
            snap.refresh(f.taken_at_ms, &f.gauges);
        }
        Some(snap)
    }

    /// A reading that said the same as the last at `taken_at_ms`: its time and gauges kept beside the last.
    /// Returns the last reading's time now.
    fn note_fresh(&mut self, taken_at_ms: u64, gauges: &SaidGauges) -> u64 {
        let Some(last) = &self.last else {
            return taken_at_ms;
        };
        let f = self.fresh.get_or_insert_with(|| Fresh {
            taken_at_ms: last.snap.taken_at_ms,
            gauges: Vec::new(),
        });
        f.taken_at_ms = f.taken_at_ms.max(taken_at_ms);
        gauges.put_beside(&mut f.gauges, &last.snap);
        f.taken_at_ms
    }

    /// The last reading as a new one is to be judged after it: the time and gauges said since put in.
    fn take_last(&mut self) -> Option<HostSnapshot> {
        let mut snap = Arc::unwrap_or_clone(self.last.take()?.snap);
        if let Some(f) = self.fresh.take() {
            snap.refresh(f.taken_at_ms, &f.gauges);
        }
        Some(snap)
    }

    /// Keep a judged reading as the last.
    fn keep(&mut self, judged: Judged) {
        self.last = Some(judged);
        self.fresh = None;
    }

    fn event(&self, at_ms: u64, what: EventKind) -> Event {
        Event {
            at_ms,
            host: self.label.clone(),
            what,
        }
    }

    /// Judge a new reading: what it amounts to, and the events since the last one.
    pub fn reading(&mut self, mut snap: HostSnapshot) -> (Judgement, Vec<Event>) {
        snap.host.clone_from(&self.label);
        // Whatever a host chose to call things reaches every front end escaped.
        snap.escape_labels();
        // Busy or not is compared with the reading as judged: every crossing since was judged again.
        if !self.resend
            && let Some(last) = &self.last
            && !last
                .snap
                .diff(&snap)
                .input_moved(snap.source.judged_remotely())
            && !busy_moved(
                &last.snap,
                snap.gpus.iter().map(|g| g.utilization),
                &self.opts,
            )
            && !gpusweep_analyze::spin::moved(
                &last.snap,
                snap.gpus
                    .iter()
                    .map(|g| (g.utilization, g.counters.as_deref())),
            )
        {
            let gauges = SaidGauges::every(snap.gauges());
            let taken_at_ms = self.note_fresh(snap.taken_at_ms, &gauges);
            // Time alone may settle a job, name a straggler or confirm a finding: then the reading says
            // something new.
            if let Some(again) = self.time_moved(taken_at_ms) {
                return again;
            }
            return (
                Judgement::Same {
                    taken_at_ms,
                    gauges,
                },
                Vec::new(),
            );
        }
        let snap = analyzed(snap, &self.opts);
        let at = snap.taken_at_ms;
        let (snap, changes) = self.with_jobs(snap, at);
        self.judge(snap, changes)
    }

    /// The last reading seen again at `at`, when time alone changes what it says.
    fn time_moved(&mut self, at: u64) -> Option<(Judgement, Vec<Event>)> {
        if let Some(again) = self.jobs_moved(at) {
            return Some(again);
        }
        if self.confirm_due.is_none_or(|d| at < d) {
            return None;
        }
        let snap = self.latest_snap()?;
        Some(self.judge(snap, Vec::new()))
    }

    /// A reading that reads as the last one but for its memory: the last one with `moved`'s numbers put in,
    /// judged as any new reading. `None` before any reading, or when the numbers do not fit the last one.
    pub fn memory(
        &mut self,
        moved: gpusweep_core::sse::MemoryMoved,
    ) -> Option<(Judgement, Vec<Event>)> {
        let last = self.last.as_ref()?;
        if !last.snap.memory_fits(&moved.used, &moved.charged) {
            return None;
        }
        // The serve's findings, their figures moved with the memory: the same findings, or the event is
        // not of this reading.
        if let Some(f) = &moved.findings
            && !(last.snap.source.judged_remotely()
                && findings_moved(&last.snap.findings, f) <= Moved::Figures)
        {
            return None;
        }
        let at = moved.taken_at_ms;
        let gauges = SaidGauges::from_wire(moved.gauges, moved.moved);
        // The same numbers (what moved at the serve was not these): fresh, as an `unchanged` is.
        if moved.findings.is_none() && last.snap.memory_is(&moved.used, &moved.charged) {
            return self.fresh(at, gauges);
        }
        // After a silence the reading goes on whole with the host back up: the ordinary way.
        if self.resend {
            let mut snap = self.latest_snap()?;
            if let Some(f) = moved.findings {
                snap.findings = f;
            }
            snap.put_memory(at, &moved.used, &moved.charged);
            snap.refresh_said(at, &gauges);
            return Some(self.reading(snap));
        }
        // The last reading becomes the new one in place (a whole reading copied and dropped per step of a
        // warm-up was a quarter of a 10,000-host client's time): its processes are the new one's, so only
        // its verdict is kept apart, to judge the new one against.
        let mut snap = self.take_last()?;
        // The findings move into the verdict before (made anew by the analysis below). A serve's judgement
        // stays the serve's: its findings and jobs are kept (the serve sends memory alone only when they are
        // unchanged but for memory, its findings' figures where they moved), its ranks' charges put in.
        let findings = std::mem::take(&mut snap.findings);
        let remote = snap.source.judged_remotely();
        if remote {
            snap.findings = moved.findings.unwrap_or_else(|| findings.clone());
        }
        let before = Verdict::with_findings(&snap, findings);
        snap.put_memory(at, &moved.used, &moved.charged);
        snap.refresh_said(at, &gauges);
        if remote {
            let charges: Vec<(u32, Option<u64>)> = snap
                .jobs
                .iter()
                .flat_map(|j| j.members().map(|r| (r.pid, snap.charged(r.pid))))
                .collect();
            let of = |pid: u32| {
                charges
                    .iter()
                    .find(|(p, _)| *p == pid)
                    .and_then(|(_, b)| *b)
            };
            for j in &mut snap.jobs {
                j.recharge(of);
            }
        }
        let snap = analyzed(snap, &self.opts);
        let (snap, changes) = self.with_jobs(snap, at);
        let (judged, events) = self.judge_against(snap, changes, Some(&before));
        let judgement = if self.memory_alone {
            Judgement::Memory(Box::new(MemoryJudged::of(&judged, gauges)))
        } else {
            Judgement::New(Box::new(judged.clone()))
        };
        self.keep(judged);
        Some((judgement, events))
    }

    /// The last reading with its jobs seen again at `at`, when that changes what they say.
    fn jobs_moved(&mut self, at: u64) -> Option<(Judgement, Vec<Event>)> {
        if !self.jobs.due(at) {
            return None;
        }
        // The last reading with the gauges said since (a hang is told by what the GPUs do now): a copy only
        // where some were said.
        let last = self.last.as_ref()?;
        let now = match self.fresh {
            Some(_) => std::borrow::Cow::Owned(self.latest_snap()?),
            None => std::borrow::Cow::Borrowed(&*last.snap),
        };
        let seen = self.jobs.observe(&now, at);
        let same_findings = {
            let old: Vec<_> = last
                .snap
                .findings
                .iter()
                .filter(|f| is_job_finding(f.kind))
                .map(gpusweep_core::model::Finding::subject)
                .collect();
            let new: Vec<_> = seen
                .findings
                .iter()
                .map(gpusweep_core::model::Finding::subject)
                .collect();
            old == new
        };
        if seen.changes.is_empty() && same_findings && seen.reports == last.snap.jobs {
            return None;
        }
        let mut snap = now.into_owned();
        put_jobs(&mut snap, seen.reports, seen.findings);
        Some(self.judge(snap, seen.changes))
    }

    /// The reading's jobs, seen by the book: reports and findings put in, and what changed.
    fn with_jobs(&mut self, mut snap: HostSnapshot, at: u64) -> (HostSnapshot, Vec<JobChange>) {
        // A host read from Prometheus or a serve: its jobs are its own gpusweep's to tell, with their history.
        if snap.source.judged_remotely() {
            return (snap, Vec::new());
        }
        let seen = self.jobs.observe(&snap, at);
        put_jobs(&mut snap, seen.reports, seen.findings);
        (snap, seen.changes)
    }

    /// An analyzed reading with its jobs: judged, its events made, kept as the last.
    fn judge(&mut self, snap: HostSnapshot, changes: Vec<JobChange>) -> (Judgement, Vec<Event>) {
        let (judged, events) = self.judge_against(snap, changes, None);
        self.keep(judged.clone());
        (Judgement::New(Box::new(judged)), events)
    }

    /// Judge `snap` against `before` (the last reading's findings and GPU states, when the new one is the
    /// last with only its memory moved), else against the last reading kept: the judged reading, to be
    /// kept as the last, and its events.
    fn judge_against(
        &mut self,
        mut snap: HostSnapshot,
        changes: Vec<JobChange>,
        before: Option<&Verdict>,
    ) -> (Judged, Vec<Event>) {
        // A host read from Prometheus comes with its own gpusweep's findings, confirmed there.
        if !snap.source.judged_remotely() {
            let at = snap.taken_at_ms;
            let applied = self
                .confirm
                .apply(&mut snap.findings, at, self.opts.confirm_ms);
            if applied.changed {
                gpusweep_analyze::state::judge_gpus(&mut snap, &self.opts);
            }
            self.confirm
                .withhold_passing(&mut snap.findings, at, self.opts.confirm_ms);
            self.confirm_due = applied.due_ms;
        }
        let last_content = self.content;
        // Memory that moved is news.
        let changed = before.is_some()
            || self
                .last
                .as_ref()
                .is_none_or(|l| !l.snap.diff(&snap).is_nothing());
        if changed {
            self.content += 1;
        }
        let mut judged = Judged::of(snap, self.content);
        // The reading before it where this one reads as that one but for its memory: the last, or (memory
        // put in place) what was kept of it. A host read from Prometheus carries findings its reader cannot
        // make again: never memory alone.
        let verdict_moved = match before {
            Some(b) => Some((b.moved_to(&judged.snap), last_content)),
            None => self.last.as_ref().and_then(|l| {
                let d = l.snap.diff(&judged.snap);
                (d.reading <= Moved::Memory).then_some((d.verdict, l.content))
            }),
        }
        .filter(|_| changed && !judged.snap.source.judged_remotely());
        judged.figures_from = verdict_moved
            .filter(|(m, _)| *m <= Moved::Figures)
            .map(|(_, c)| c);
        judged.memory_from = verdict_moved
            .filter(|(m, _)| *m <= Moved::Memory)
            .map(|(_, c)| c);
        let mut events = self.events(&judged, before);
        let at = judged.snap.taken_at_ms;
        events.extend(changes.into_iter().map(|c| self.event(at, job_event(c))));
        self.resend = false;
        (judged, events)
    }

    /// A reading that said the same as the last but for its time and gauges. After a silence it is handed
    /// on whole; before any reading it says nothing.
    pub fn fresh(
        &mut self,
        taken_at_ms: u64,
        gauges: SaidGauges,
    ) -> Option<(Judgement, Vec<Event>)> {
        let remote = self.last.as_ref()?.provenance.source.judged_remotely();
        self.note_fresh(taken_at_ms, &gauges);
        // Busy or not is compared with the reading as judged, every GPU's as said since; a host judged
        // where it is read is not judged again here.
        let moved = !remote
            && !gauges.is_empty()
            && self
                .last
                .as_ref()
                .zip(self.fresh.as_ref())
                .is_some_and(|(last, f)| {
                    busy_moved(
                        &last.snap,
                        f.gauges.iter().map(|g| g.utilization),
                        &self.opts,
                    ) || gpusweep_analyze::spin::moved(
                        &last.snap,
                        f.gauges
                            .iter()
                            .map(|g| (g.utilization, g.counters.as_deref())),
                    )
                });
        if moved && !self.resend {
            // Clean means idle, and a job's hang is told by what its GPUs do: the last reading with these
            // gauges, judged again.
            let snap = analyzed(self.latest_snap()?, &self.opts);
            let (snap, changes) = self.with_jobs(snap, taken_at_ms);
            return Some(self.judge(snap, changes));
        }
        if !self.resend {
            if let Some(again) = self.time_moved(taken_at_ms) {
                return Some(again);
            }
            return Some((
                Judgement::Same {
                    taken_at_ms,
                    gauges,
                },
                Vec::new(),
            ));
        }
        self.resend = false;
        let whole = Box::new(self.latest()?);
        let mut events = Vec::new();
        if self.down {
            self.down = false;
            events.push(self.event(taken_at_ms, EventKind::HostUp { first: false }));
        }
        Some((Judgement::New(whole), events))
    }

    /// The events of a judged reading against the last, with the clocks of time to clean kept.
    fn events(&mut self, judged: &Judged, before: Option<&Verdict>) -> Vec<Event> {
        let next = &judged.snap;
        let at = next.taken_at_ms;
        let last = self.last.as_ref().map(|l| &*l.snap);
        let mut out = Vec::new();
        let first = before.is_none() && last.is_none();
        if first || self.down {
            out.push(EventKind::HostUp { first });
            self.down = false;
        }
        // A first view from a summary says no finding's place: its findings are told once, with the whole
        // reading that follows, as a first reading's are.
        let summary = |s: &HostSnapshot| s.missing_features.contains(&Feature::GpuDetail);
        let prev = last.filter(|p| !summary(p));
        // Only memory moved since `before` (the verdict of the reading this one is made from in place): no
        // process came or went.
        let kinds = if summary(next) {
            Vec::new()
        } else if let Some(b) = before {
            verdict_events(&b.findings, |i| b.state(i), next, false)
        } else {
            if let Some(p) = prev {
                // A GPU process's death is when it leaves /proc or turns zombie; NVML may list it a while
                // longer.
                for g in released_by_deaths(p, next) {
                    self.exited.insert(g, at);
                }
            }
            between(prev, next)
        };
        for mut e in kinds {
            if let EventKind::GpuClean {
                gpu,
                after_ms,
                after_exit_ms,
            } = &mut e
            {
                *after_ms = self.signalled.remove(gpu).map(|t| at.saturating_sub(t));
                *after_exit_ms = self.exited.remove(gpu).map(|t| at.saturating_sub(t));
            }
            out.push(e);
        }
        // A GPU clean now starts its clocks afresh, whatever the events said.
        for g in next
            .gpus
            .iter()
            .filter(|g| g.state == Some(GpuState::Clean))
        {
            self.signalled.remove(&g.index);
            self.exited.remove(&g.index);
        }
        if judged.all_clean
            && let Some(t) = self.first_signal.take()
        {
            out.push(EventKind::AllClean {
                scope: self.label.clone(),
                after_ms: at.saturating_sub(t),
            });
        }
        out.into_iter().map(|w| self.event(at, w)).collect()
    }

    /// The host's connection changed. Down (once, until a reading comes) is an event.
    pub fn status(&mut self, status: &ConnStatus, now_ms: u64) -> Vec<Event> {
        match status {
            ConnStatus::Down(reason) => {
                self.resend = true;
                if self.down {
                    return Vec::new();
                }
                self.down = true;
                vec![self.event(
                    now_ms,
                    EventKind::HostDown {
                        reason: reason.clone(),
                    },
                )]
            }
            ConnStatus::Stale { .. } => {
                self.resend = true;
                Vec::new()
            }
            ConnStatus::Up | ConnStatus::Connecting => Vec::new(),
        }
    }

    /// An action is on its way to the host. A signal starts the clock of every GPU it could free (held or
    /// listed by a target or a descendant of one, in the last reading), and is an event.
    pub fn sent(&mut self, req: &ActionRequest, now_ms: u64) -> Vec<Event> {
        let ActionRequest::Signal(r) = req else {
            return Vec::new();
        };
        let pids: Vec<u32> = r.targets.iter().map(|t| t.pid).collect();
        self.jobs
            .signalled(r.targets.iter().map(|t| (t.pid, t.start_time)), now_ms);
        let gpus = self
            .last
            .as_ref()
            .map(|l| gpus_of_targets(&l.snap, &pids))
            .unwrap_or_default();
        for g in &gpus {
            self.signalled.entry(*g).or_insert(now_ms);
        }
        if !gpus.is_empty() {
            self.first_signal.get_or_insert(now_ms);
        }
        vec![
            self.event(
                now_ms,
                EventKind::SignalSent {
                    signal: r.signal.name().to_string(),
                    pids,
                    what: r
                        .purpose
                        .map_or("signal", gpusweep_core::action::Purpose::as_str)
                        .to_string(),
                },
            ),
        ]
    }

    /// What became of an action: one event per target or file.
    pub fn answered(&self, answer: &ActionAnswer, now_ms: u64) -> Vec<Event> {
        match answer {
            ActionAnswer::Signal(outcomes) => outcomes
                .iter()
                .map(|o| {
                    self.event(
                        now_ms,
                        EventKind::SignalFate {
                            pid: o.pid,
                            fate: o.describe(),
                            ok: !o.failed(),
                        },
                    )
                })
                .collect(),
            ActionAnswer::Remove(outcomes) => outcomes
                .iter()
                .map(|o| {
                    self.event(
                        now_ms,
                        EventKind::ShmRemoved {
                            name: o.name.clone(),
                            result: o.describe(),
                            ok: !o.failed(),
                        },
                    )
                })
                .collect(),
        }
    }
}

fn is_job_finding(k: gpusweep_core::model::FindingKind) -> bool {
    use gpusweep_core::model::FindingKind;
    matches!(k, FindingKind::LostRank | FindingKind::Straggler)
}

/// Replace a reading's jobs and job findings with the book's.
fn put_jobs(
    snap: &mut HostSnapshot,
    reports: Vec<gpusweep_core::job::JobReport>,
    findings: Vec<gpusweep_core::model::Finding>,
) {
    snap.jobs = reports;
    snap.findings.retain(|f| !is_job_finding(f.kind));
    if !findings.is_empty() {
        snap.findings.extend(findings);
        gpusweep_analyze::order(&mut snap.findings);
    }
}

fn job_event(c: JobChange) -> EventKind {
    match c {
        JobChange::Started {
            job,
            name,
            ranks,
            gpus,
        } => EventKind::JobStarted {
            job,
            name,
            ranks,
            gpus,
        },
        JobChange::Phase {
            job,
            phase,
            after_ms,
            bytes,
            warmup_ms,
        } => EventKind::JobPhase {
            job,
            phase,
            after_ms,
            bytes,
            warmup_ms,
        },
        JobChange::RankLost {
            job,
            lost,
            left,
            left_bytes,
        } => EventKind::RankLost {
            job,
            pid: lost.pid,
            gpus: lost.gpus,
            how: lost.how,
            left,
            left_bytes,
        },
        JobChange::Ended { job, lived_ms } => EventKind::JobEnded { job, lived_ms },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusweep_core::action::Purpose;
    use gpusweep_core::model::{Gpu, Holder, ListedProcess, MIB, Memory, Proc};
    use gpusweep_core::signal::{Sig, SignalRequest, TargetInfo};

    /// GPU 0 held by 42 (child of launcher 40) while `held`; 50 holds nothing.
    fn reading(at: u64, held: bool) -> HostSnapshot {
        let mut s = HostSnapshot {
            host: "raw".into(),
            taken_at_ms: at,
            processes: vec![
                Proc {
                    pid: 40,
                    ppid: 1,
                    ..Default::default()
                },
                Proc {
                    pid: 50,
                    ppid: 1,
                    ..Default::default()
                },
            ],
            gpus: vec![Gpu {
                index: 0,
                memory: Memory {
                    used: Some(0),
                    total: Some(80 << 30),
                    reserved: None,
                },
                utilization: Some(u32::try_from(at % 100).unwrap_or(0)),
                ..Default::default()
            }],
            ..Default::default()
        };
        if held {
            s.gpus[0].memory.used = Some(1024 * MIB);
            s.gpus[0].processes.push(ListedProcess {
                pid: 42,
                used_bytes: Some(1024 * MIB),
                ..Default::default()
            });
            s.holders.push(Holder {
                pid: 42,
                gpus: vec![0],
                ..Default::default()
            });
            s.processes.push(Proc {
                pid: 42,
                ppid: 40,
                start_time: 9,
                ..Default::default()
            });
        }
        s
    }

    fn kill(pid: u32) -> ActionRequest {
        ActionRequest::Signal(SignalRequest {
            targets: vec![TargetInfo {
                pid,
                start_time: 0,
                cmdline: String::new(),
                pidfs_ino: None,
            }],
            signal: Sig::Term,
            grace_ms: None,
            purpose: Some(Purpose::Sweep),
        })
    }

    /// A front end's reading, with the time of one that said the same.
    fn refreshed(j: &mut Judged, at: u64) {
        Arc::make_mut(&mut j.snap).refresh(at, &[]);
    }

    fn kinds(ev: &[Event]) -> Vec<&EventKind> {
        ev.iter().map(|e| &e.what).collect()
    }

    #[test]
    fn a_reading_is_judged_once_and_one_that_says_the_same_is_only_fresh() {
        let mut l = Ledger::new("gpu-x", AnalyzeOptions::default());
        let (j, ev) = l.reading(reading(1_000, true));
        let Judgement::New(j) = j else {
            panic!("{j:?}")
        };
        assert_eq!(j.snap.host, "gpu-x", "stamped with the fleet's label");
        assert_eq!(j.snap.gpus[0].state, Some(GpuState::InUse));
        assert_eq!(j.counts.in_use, 1);
        assert!(!j.all_clean);
        assert_eq!(
            kinds(&ev),
            [
                &EventKind::HostUp { first: true },
                &EventKind::JobStarted {
                    job: "tree:40".into(),
                    name: "[]".into(),
                    ranks: 1,
                    gpus: vec![0]
                }
            ]
        );
        assert_eq!(j.snap.jobs[0].phase, gpusweep_core::job::Phase::Loading);
        let (j2, ev) = l.reading(reading(2_001, true));
        assert!(
            matches!(&j2, Judgement::Same { taken_at_ms: 2_001, gauges } if gauges.iter().next().is_some_and(|(i, g)| i == 0 && g.utilization == Some(1))),
            "{j2:?}"
        );
        assert!(ev.is_empty());
        // Down, then the same reading again: handed on whole, and the host is back.
        assert_eq!(l.status(&ConnStatus::Down("gone".into()), 2_500).len(), 1);
        assert!(
            l.status(&ConnStatus::Down("still".into()), 2_600)
                .is_empty()
        );
        let (j3, ev) = l.reading(reading(3_000, true));
        assert!(
            matches!(&j3, Judgement::New(j) if j.content == j.content),
            "{j3:?}"
        );
        assert_eq!(kinds(&ev), [&EventKind::HostUp { first: false }]);
    }

    /// The reading handed on is the ledger's own, shared: readings that say the same after it leave it as
    /// it is (a copy per host for the front end doubled a 10,000-host client), and what they said is kept
    /// beside it: in the latest reading, in one judged after it, in one handed on whole after a silence.
    #[test]
    fn a_reading_handed_on_is_shared_and_what_said_the_same_goes_beside_it() {
        let mut l = Ledger::new("gpu-x", AnalyzeOptions::default());
        let (j, _) = l.reading(reading(1_000, true));
        let Judgement::New(held) = j else {
            panic!("{j:?}")
        };
        assert!(l.shares(&held.snap), "handed on, not copied");
        for at in [2_007, 3_009] {
            assert!(matches!(
                l.reading(reading(at, true)).0,
                Judgement::Same { .. }
            ));
        }
        assert!(matches!(
            l.fresh(3_500, SaidGauges::default()),
            Some((Judgement::Same { .. }, _))
        ));
        assert!(
            l.shares(&held.snap),
            "readings that said the same left it as it is"
        );
        assert_eq!(held.snap.taken_at_ms, 1_000);
        let latest = l.latest().expect("read");
        assert_eq!(latest.snap.taken_at_ms, 3_500);
        assert_eq!(
            latest.snap.gpus[0].utilization,
            Some(9),
            "the last gauges said"
        );
        assert_eq!(latest.content, held.content);
        // A silence: the reading goes on whole, with what was said since.
        l.status(&ConnStatus::Stale { silent_ms: 3_000 }, 7_000);
        let (j, _) = l.fresh(8_000, SaidGauges::default()).expect("a reading");
        let Judgement::New(whole) = j else {
            panic!("{j:?}")
        };
        assert_eq!(
            (whole.snap.taken_at_ms, whole.snap.gpus[0].utilization),
            (8_000, Some(9))
        );
        // Memory that moves: judged from the reading with its latest gauges.
        let moved = gpusweep_core::sse::MemoryMoved {
            host: "gpu-x".into(),
            taken_at_ms: 9_000,
            used: vec![Some(2048 * MIB)],
            charged: vec![vec![Some(2048 * MIB)]],
            gauges: None,
            moved: None,
            findings: None,
        };
        let (j, _) = l.memory(moved).expect("it fits");
        let Judgement::New(j) = j else {
            panic!("{j:?}")
        };
        assert_eq!(
            (j.snap.taken_at_ms, j.snap.gpus[0].utilization),
            (9_000, Some(9))
        );
        assert_eq!(
            held.snap.gpus[0].memory.used,
            Some(1024 * MIB),
            "the first stays as handed on"
        );
    }

    #[test]
    fn time_to_clean_counts_from_the_signal_that_could_free_the_gpu() {
        let mut l = Ledger::new("gpu-x", AnalyzeOptions::default());
        l.reading(reading(1_000, true));
        // A process holding nothing is killed: no GPU's clock starts.
        let ev = l.sent(&kill(50), 1_500);
        assert!(matches!(
            kinds(&ev)[..],
            [EventKind::SignalSent { what, .. }] if what == "sweep"
        ));
        l.reading(reading(20_000, true));
        // The launcher is: its worker's GPU is what it may free.
        l.sent(&kill(40), 25_000);
        let (_, ev) = l.reading(reading(25_100, false));
        let clean: Vec<_> = kinds(&ev)
            .into_iter()
            .filter(|k| matches!(k, EventKind::GpuClean { .. } | EventKind::AllClean { .. }))
            .cloned()
            .collect();
        assert_eq!(
            clean,
            [
                EventKind::GpuClean {
                    gpu: 0,
                    after_ms: Some(100),
                    after_exit_ms: Some(0)
                },
                EventKind::AllClean {
                    scope: "gpu-x".into(),
                    after_ms: 100
                }
            ]
        );
    }

    #[test]
    fn time_alone_settles_a_job_and_the_reading_says_so() {
        let mut l = Ledger::new(
            "gpu-x",
            AnalyzeOptions {
                jobs: gpusweep_analyze::jobs::JobOptions {
                    settle_ms: 5_000,
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        l.reading(reading(1_000, true));
        let (j, ev) = l.reading(reading(3_000, true));
        assert!(matches!(j, Judgement::Same { .. }), "{j:?}");
        assert!(ev.is_empty());
        // The same reading, 5 s after memory last rose: settled, a new reading with its event.
        let (j, ev) = l.fresh(6_000, SaidGauges::default()).expect("a reading");
        let Judgement::New(j) = j else {
            panic!("{j:?}")
        };
        assert_eq!(j.snap.jobs[0].phase, gpusweep_core::job::Phase::Settled);
        assert!(
            matches!(
                kinds(&ev)[..],
                [EventKind::JobPhase {
                    phase: gpusweep_core::job::Phase::Settled,
                    ..
                }]
            ),
            "{ev:?}"
        );
        let (j, _) = l.fresh(7_000, SaidGauges::default()).expect("a reading");
        assert!(matches!(j, Judgement::Same { .. }), "settled once: {j:?}");
    }

    /// Seen on a real H200: ranks starting CUDA hold their GPU before NVML lists them, and a rank being
    /// killed is charged until the driver frees its memory. A finding seen to appear is said one step lower
    /// until it has lasted the confirm window; one there at the first reading was not seen to appear.
    #[test]
    fn a_finding_seen_to_appear_is_a_leak_only_once_it_lasts() {
        use gpusweep_core::model::{FindingKind, Severity};
        let opts = AnalyzeOptions {
            confirm_ms: 3_000,
            ..Default::default()
        };
        let ghost_of = |f: &[gpusweep_core::model::Finding]| {
            f.iter()
                .find(|f| f.kind == FindingKind::Ghost)
                .map(|f| (f.severity, f.confirms_as))
        };
        let appeared = |ev: &[Event]| -> Vec<Severity> {
            ev.iter()
                .filter_map(|e| match &e.what {
                    EventKind::FindingAppeared {
                        kind: FindingKind::Ghost,
                        severity,
                        ..
                    } => Some(*severity),
                    _ => None,
                })
                .collect()
        };
        let mut l = Ledger::new("gpu-x", opts);
        l.reading(reading(1_000, false));
        // 42 left /proc; NVML still charges it: a ghost, seen to appear.
        let mut ghost = reading(2_000, true);
        ghost.processes.retain(|p| p.pid != 42);
        ghost.holders.clear();
        let (j, ev) = l.reading(ghost.clone());
        let Judgement::New(j) = j else {
            panic!("{j:?}")
        };
        assert_eq!(
            ghost_of(&j.snap.findings),
            Some((Severity::Warning, Some(Severity::Leak)))
        );
        assert_eq!(j.snap.gpus[0].state, Some(GpuState::InUse));
        assert_eq!(j.leaks, 0);
        assert_eq!(appeared(&ev), [Severity::Warning]);
        // Still there, not yet for the window: nothing new.
        ghost.taken_at_ms = 4_000;
        let (j, ev) = l.reading(ghost.clone());
        assert!(matches!(j, Judgement::Same { .. }), "{j:?}");
        assert!(ev.is_empty());
        // Lasted 3 s: the same reading now says a leak, and says it again as an event.
        let (j, ev) = l.fresh(5_000, SaidGauges::default()).expect("a reading");
        let Judgement::New(j) = j else {
            panic!("{j:?}")
        };
        assert_eq!(ghost_of(&j.snap.findings), Some((Severity::Leak, None)));
        assert_eq!(j.snap.gpus[0].state, Some(GpuState::Leak));
        assert_eq!(
            j.leaks, 2,
            "a ghost and its residual: {:?}",
            j.snap.findings
        );
        assert_eq!(appeared(&ev), [Severity::Leak]);
        let (j, _) = l.fresh(6_000, SaidGauges::default()).expect("a reading");
        assert!(matches!(j, Judgement::Same { .. }), "{j:?}");
        // Gone and back: seen to appear again.
        l.reading(reading(7_000, false));
        ghost.taken_at_ms = 8_000;
        let (j, _) = l.reading(ghost.clone());
        let Judgement::New(j) = j else {
            panic!("{j:?}")
        };
        assert_eq!(
            ghost_of(&j.snap.findings).map(|g| g.0),
            Some(Severity::Warning)
        );
        // A host whose first reading has it: not seen to appear, said as it is.
        let mut first = Ledger::new("gpu-y", opts);
        let (j, _) = first.reading(ghost);
        let Judgement::New(j) = j else {
            panic!("{j:?}")
        };
        assert_eq!(ghost_of(&j.snap.findings), Some((Severity::Leak, None)));
    }

    #[test]
    fn memory_alone_is_put_onto_the_last_reading_and_judged_anew() {
        let mut l = Ledger::new("gpu-x", AnalyzeOptions::default());
        let moved = |at: u64, used: u64, charged: u64| gpusweep_core::sse::MemoryMoved {
            host: "gpu-x".into(),
            taken_at_ms: at,
            used: vec![Some(used * MIB)],
            charged: vec![vec![Some(charged * MIB)]],
            gauges: None,
            moved: None,
            findings: None,
        };
        assert!(
            l.memory(moved(500, 1, 1)).is_none(),
            "nothing to put it onto"
        );
        l.reading(reading(1_000, true));
        // 2 GiB used, 1 GiB charged: more than the context overhead goes unexplained.
        let (j, ev) = l.memory(moved(2_000, 2048, 1024)).expect("it fits");
        let Judgement::New(j) = j else {
            panic!("{j:?}")
        };
        assert_eq!(j.snap.taken_at_ms, 2_000);
        assert_eq!(j.snap.gpus[0].memory.used, Some(2048 * MIB));
        assert_eq!(j.snap.gpus[0].processes[0].used_bytes, Some(1024 * MIB));
        assert!(
            ev.iter().any(|e| matches!(
                &e.what,
                EventKind::FindingAppeared {
                    kind: gpusweep_core::model::FindingKind::Residual,
                    ..
                }
            )),
            "{ev:?}"
        );
        let two_processes = gpusweep_core::sse::MemoryMoved {
            charged: vec![vec![None, None]],
            ..moved(3_000, 1, 1)
        };
        assert!(l.memory(two_processes).is_none(), "another shape");
    }

    /// A reading whose findings moved only in their figures with its memory (unexplained bytes growing, a
    /// straggler's) may go as memory with its findings (`figures_from`), not as memory alone; a client holding
    /// the serve's reading takes those findings, and findings of other things are not its reading's.
    #[test]
    fn findings_whose_figures_moved_go_with_the_memory() {
        use gpusweep_core::model::FindingKind;
        let moved = |at: u64, used: u64, findings| gpusweep_core::sse::MemoryMoved {
            host: "gpu-x".into(),
            taken_at_ms: at,
            used: vec![Some(used * MIB)],
            charged: vec![vec![Some(1024 * MIB)]],
            gauges: None,
            moved: None,
            findings,
        };
        // At the serve: 2 GiB then 3 GiB used by a process charged 1 GiB: the same residual, larger.
        let mut serve = Ledger::new("gpu-x", AnalyzeOptions::default());
        let mut at = |used: u64, t: u64| {
            let mut s = reading(t, true);
            s.gpus[0].memory.used = Some(used * MIB);
            let Judgement::New(j) = serve.reading(s).0 else {
                panic!("a new reading")
            };
            j
        };
        // The first past its confirm window, so the two after it are of the same severity.
        let (_, two, three) = (at(1536, 1_000), at(2048, 6_000), at(3072, 7_000));
        let residual = |j: &Judged| {
            j.snap
                .findings
                .iter()
                .find(|f| f.kind == FindingKind::Residual)
                .and_then(|f| f.bytes)
        };
        assert!(
            residual(&three) > residual(&two),
            "{:?}",
            three.snap.findings
        );
        assert_eq!(three.memory_from, None, "its findings' figures moved");
        assert_eq!(three.figures_from, Some(two.content));
        // At a client holding the serve's reading of 2 GiB.
        let mut client = Ledger::new("gpu-x", AnalyzeOptions::default());
        let mut held = HostSnapshot::clone(&two.snap);
        held.source = SourceKind::Http;
        client.reading(held);
        let other = vec![gpusweep_core::model::Finding {
            kind: FindingKind::Ghost,
            ..three.snap.findings[0].clone()
        }];
        assert!(client.memory(moved(7_000, 3072, Some(other))).is_none());
        assert_eq!(client.latest().map(|l| l.snap.taken_at_ms), Some(6_000));
        let (j, _) = client
            .memory(moved(7_000, 3072, Some(three.snap.findings.clone())))
            .expect("the same findings");
        let Judgement::New(j) = j else {
            panic!("{j:?}")
        };
        assert_eq!(j.snap.findings, three.snap.findings);
        assert_eq!(j.snap.gpus[0].memory.used, Some(3072 * MIB));
    }

    /// Memory put onto the last reading in place is judged as the whole reading with those numbers would
    /// be: the same reading, the same events, the same revisions.
    #[test]
    fn memory_in_place_judges_as_the_whole_reading_would() {
        use gpusweep_core::model::Gpu;
        // GPU 0 held by 42; GPU 1 held by nobody, its memory draining.
        let first = || {
            let mut s = reading(1_000, true);
            s.gpus.push(Gpu {
                index: 1,
                memory: Memory {
                    used: Some(4096 * MIB),
                    total: Some(80 << 30),
                    reserved: None,
                },
                ..Default::default()
            });
            s
        };
        let steps: [(u64, [u64; 2], u64); 4] = [
            (2_000, [1024, 2048], 1024),
            (3_000, [3072, 0], 1024),
            (4_000, [3072, 0], 1024),
            (9_000, [3072, 0], 3072),
        ];
        let mut by_memory = Ledger::new("gpu-x", AnalyzeOptions::default());
        let mut whole = Ledger::new("gpu-x", AnalyzeOptions::default());
        // A ledger that hands memory on alone, and the reading its front end holds.
        let mut alone = Ledger::new("gpu-x", AnalyzeOptions::default());
        alone.hand_on_memory_alone();
        by_memory.reading(first());
        whole.reading(first());
        let Judgement::New(held) = alone.reading(first()).0 else {
            panic!("a first reading is whole")
        };
        let mut held = *held;
        for (at, used, charged) in steps {
            let moved = gpusweep_core::sse::MemoryMoved {
                host: "gpu-x".into(),
                taken_at_ms: at,
                used: used.iter().map(|u| Some(u * MIB)).collect(),
                charged: vec![vec![Some(charged * MIB)], vec![]],
                gauges: None,
                moved: None,
                findings: None,
            };
            let mut snap = HostSnapshot::clone(&whole.latest().expect("a reading").snap);
            assert!(snap.put_memory(at, &moved.used, &moved.charged));
            let (handed, handed_events) = alone.memory(moved.clone()).expect("it fits");
            let a = by_memory.memory(moved).expect("it fits");
            let b = whole.reading(snap);
            // Put onto the reading the front end holds, memory alone makes the whole reading judged.
            match handed {
                Judgement::Memory(m) => assert!(m.put_onto(&mut held), "at {at}"),
                Judgement::Same { taken_at_ms, .. } => refreshed(&mut held, taken_at_ms),
                Judgement::New(j) => panic!("memory alone came whole at {at}: {j:?}"),
            }
            assert_eq!(Some(&held), whole.latest().as_ref(), "at {at}");
            assert_eq!(handed_events, b.1, "at {at}");
            match (&a.0, &b.0) {
                // The same numbers again: fresh both ways (no gauges said: as before).
                (
                    Judgement::Same { taken_at_ms: x, .. },
                    Judgement::Same { taken_at_ms: y, .. },
                ) => assert_eq!((x, &a.1), (y, &b.1), "at {at}"),
                _ => assert_eq!(a, b, "at {at}"),
            }
        }
        let kinds_seen: Vec<_> = {
            let mut l = Ledger::new("gpu-x", AnalyzeOptions::default());
            l.reading(first());
            let moved = gpusweep_core::sse::MemoryMoved {
                host: "gpu-x".into(),
                taken_at_ms: 2_000,
                used: vec![Some(1024 * MIB), Some(0)],
                charged: vec![vec![Some(1024 * MIB)], vec![]],
                gauges: None,
                moved: None,
                findings: None,
            };
            l.memory(moved).expect("it fits").1
        };
        // GPU 1 drained: its residual cleared and it reads clean.
        assert!(
            kinds_seen
                .iter()
                .any(|e| matches!(e.what, EventKind::GpuClean { gpu: 1, .. })),
            "{kinds_seen:?}"
        );
    }

    #[test]
    fn answers_are_events_and_a_fresh_reading_after_a_silence_goes_on_whole() {
        use gpusweep_core::signal::{Fate, Outcome};
        let mut l = Ledger::new("gpu-x", AnalyzeOptions::default());
        assert!(
            l.fresh(5, SaidGauges::default()).is_none(),
            "nothing read yet"
        );
        l.reading(reading(1_000, false));
        let ev = l.answered(
            &ActionAnswer::Signal(vec![Outcome {
                pid: 42,
                start_time: 9,
                cmdline: "w".into(),
                fate: Fate::AlreadyGone,
            }]),
            1_100,
        );
        assert!(matches!(
            kinds(&ev)[..],
            [EventKind::SignalFate { ok: true, .. }]
        ));
        l.status(&ConnStatus::Stale { silent_ms: 3_000 }, 4_000);
        let (j, _) = l.fresh(5_000, SaidGauges::default()).expect("a reading");
        assert!(
            matches!(j, Judgement::New(ref j) if j.snap.taken_at_ms == 5_000),
            "{j:?}"
        );
        let (j, _) = l.fresh(6_000, SaidGauges::default()).expect("a reading");
        assert!(matches!(j, Judgement::Same { .. }));
    }

    /// Clean means idle: a GPU with nothing listed whose utilization crosses the busy line says something
    /// new though its memory and processes do not move, whether the reading came whole or as `unchanged`
    /// gauges. A busy GPU seen again idle was left "in use" for good (a job's end then never read clean),
    /// and an idle one seen again busy stayed clean: a kernel left running, never named.
    #[test]
    fn utilization_crossing_the_busy_line_is_judged_again() {
        let opts = AnalyzeOptions::default();
        let at = |t: u64, util: u32| {
            let mut s = reading(t, false);
            s.gpus[0].utilization = Some(util);
            s
        };
        let state = |j: &Judgement| match j {
            Judgement::New(j) => j.snap.gpus[0].state,
            _ => None,
        };
        let mut l = Ledger::new("h", opts);
        let (j, _) = l.reading(at(1_000, 99));
        assert_eq!(state(&j), Some(GpuState::InUse), "busy, nothing listed");
        let (j, _) = l.reading(at(1_500, 0));
        assert_eq!(
            state(&j),
            Some(GpuState::Clean),
            "idle again: judged again, clean"
        );
        let (j, _) = l.reading(at(2_000, 3));
        assert!(
            matches!(j, Judgement::Same { .. }),
            "gauges alone: the same"
        );
        let (j, _) = l.reading(at(2_500, 97));
        assert_eq!(
            state(&j),
            Some(GpuState::InUse),
            "busy again with nothing listed"
        );
        // The same through `unchanged` gauges (an agent's or a serve's compact reading).
        let g = |util: u32| {
            SaidGauges::every(vec![Gauges {
                utilization: Some(util),
                ..Default::default()
            }])
        };
        let (j, _) = l.fresh(3_000, g(0)).expect("a reading before");
        assert_eq!(
            state(&j),
            Some(GpuState::Clean),
            "idle through an unchanged"
        );
        let (j, _) = l.fresh(3_500, g(10)).expect("a reading before");
        assert!(matches!(j, Judgement::Same { .. }));
        let (j, _) = l.fresh(4_000, g(100)).expect("a reading before");
        assert_eq!(
            state(&j),
            Some(GpuState::InUse),
            "busy through an unchanged"
        );
        assert_eq!(
            l.latest().map(|j| j.snap.gpus[0].state),
            Some(Some(GpuState::InUse))
        );
    }

    /// Gauges said by position (a serve's `gauges=moved`): those of the GPU that moved go onto the others
    /// as said before, and the busy line is judged with every GPU's as said since, so a crossing on the one
    /// that moved is judged again while the others keep theirs.
    #[test]
    fn gauges_said_by_position_keep_the_others_and_a_crossing_is_judged_again() {
        let mut two = reading(1_000, false);
        let mut second = two.gpus[0].clone();
        second.index = 1;
        two.gpus.push(second);
        for g in &mut two.gpus {
            g.utilization = Some(0);
        }
        let g = |u: u32| Gauges {
            utilization: Some(u),
            ..Default::default()
        };
        let utils = |j: &Judged| (j.snap.gpus[0].utilization, j.snap.gpus[1].utilization);
        let mut l = Ledger::new("h", AnalyzeOptions::default());
        l.reading(two);
        let (j, _) = l
            .fresh(2_000, SaidGauges::moved(vec![(0, g(10))]))
            .expect("a reading before");
        assert!(matches!(j, Judgement::Same { .. }), "{j:?}");
        let (j, _) = l
            .fresh(3_000, SaidGauges::moved(vec![(1, g(95))]))
            .expect("a reading before");
        let Judgement::New(j) = j else {
            panic!("GPU 1 crossed the busy line: {j:?}")
        };
        assert_eq!(utils(&j), (Some(10), Some(95)), "GPU 0 as said before");
        assert_eq!(j.snap.gpus[1].state, Some(GpuState::InUse));
        let (j, _) = l
            .fresh(4_000, SaidGauges::moved(vec![(0, g(20))]))
            .expect("a reading before");
        assert!(
            matches!(j, Judgement::Same { .. }),
            "GPU 1 still busy: {j:?}"
        );
        assert_eq!(l.latest().map(|j| utils(&j)), Some((Some(20), Some(95))));
    }

    /// Updates a front end has not taken become one: a whole reading takes later times, gauges and memory
    /// in place, a later whole reading replaces anything, and gauges said once hold until others are said.
    #[test]
    fn updates_not_yet_taken_become_one() {
        let g = |util: u32| {
            SaidGauges::every(vec![Gauges {
                utilization: Some(util),
                ..Default::default()
            }])
        };
        let same = |at: u64, gauges: SaidGauges| Judgement::Same {
            taken_at_ms: at,
            gauges,
        };
        let mut l = Ledger::new("h", AnalyzeOptions::default());
        let (first, _) = l.reading(reading(1_000, true));
        let Judgement::New(j) = first.clone() else {
            panic!("a first reading is whole")
        };
        // Whole, then the same at a later time with new gauges: the whole reading, at that time.
        match first.clone().then(same(2_000, g(7))) {
            Judgement::New(w) => {
                assert_eq!(w.snap.taken_at_ms, 2_000);
                assert_eq!(w.snap.gpus[0].utilization, Some(7));
                assert_eq!(w.content, j.content, "the same content");
            }
            other => panic!("{other:?}"),
        }
        // Anything, then whole: the later whole reading.
        let (second, _) = l.reading(reading(3_000, false));
        let Judgement::New(k) = second.clone() else {
            panic!("another reading is whole")
        };
        assert_eq!(same(2_500, g(1)).then(second.clone()), Judgement::New(k));
        // The same twice: the later time, the gauges last said.
        assert_eq!(
            same(1, g(30)).then(same(2, SaidGauges::default())),
            same(2, g(30)),
            "no gauges said: those waiting hold"
        );
        assert_eq!(same(1, g(30)).then(same(2, g(40))), same(2, g(40)));
    }
}
