//! What the TUI knows of its hosts: each host's latest judged reading (as its ledger handed it on), its
//! connection, the memory history its chart draws, how long each GPU process has held a GPU, and the
//! timeline of events. It takes what the fleet sends and judges nothing itself.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::history::Histories;
use crate::core::conn::ConnStatus;
use crate::core::event::Event;
use crate::core::model::{Gauges, Gpu, HostId, HostSnapshot, MIB, SaidGauges};
use crate::core::signal::Protected;
use crate::runtime::{Judged, MemoryJudged, StateCounts};

/// Samples of memory history kept per GPU (10 minutes at a 1 s poll).
pub const HISTORY: usize = 600;
/// Events kept for the timeline (the events file has them all).
pub const TIMELINE: usize = 2000;

#[derive(Debug, Clone)]
pub struct HostView {
    pub label: String,
    /// Its latest reading as its ledger judged it: the ledger's own, shared, not a copy.
    pub snap: Option<Arc<HostSnapshot>>,
    /// The gauges of the readings since `snap` that said the same, GPU by GPU as in `snap` (empty: as in
    /// `snap`): kept beside it, so `snap` stays the one reading its ledger holds too.
    pub gauges: Vec<Gauges>,
    pub status: ConnStatus,
    /// Unix ms of the last good reading.
    pub last_seen_ms: Option<u64>,
    /// Per GPU index, (Unix ms, used MiB) over time.
    pub history: Histories,
    /// When each GPU process (pid, start time) was first seen holding or listed, Unix ms.
    pub held_since: HashMap<(u32, u64), u64>,
    /// PIDs never offered for signals on this host.
    pub protected: Protected,
    /// Read over HTTP or from Prometheus: no kill, sweep or removal can reach it.
    pub read_only: bool,
    /// Its latest reading is of the simulated cluster (a demo read through a serve, too).
    pub simulated: bool,
    /// Its GPUs by state in `snap`, as its ledger counted them.
    pub counts: StateCounts,
    /// Leak findings in `snap`.
    pub leaks: usize,
}

impl HostView {
    fn new(label: String) -> HostView {
        HostView {
            label,
            snap: None,
            gauges: Vec::new(),
            status: ConnStatus::Connecting,
            last_seen_ms: None,
            history: Histories::default(),
            held_since: HashMap::new(),
            protected: Protected::remote(),
            read_only: false,
            simulated: false,
            counts: StateCounts::default(),
            leaks: 0,
        }
    }

    /// Its latest reading.
    pub fn snap(&self) -> Option<&HostSnapshot> {
        self.snap.as_deref()
    }

    /// Utilization, temperature and power of `g`, its `k`th GPU, as last read.
    pub fn gauges_of(&self, k: usize, g: &Gpu) -> (Option<u32>, Option<u32>, Option<u32>) {
        match self.gauges.get(k) {
            Some(v) => (v.utilization, v.temperature_c, v.power_mw),
            None => (g.utilization, g.temperature_c, g.power_mw),
        }
    }

    /// Keep its memory history and how long each GPU process has held a GPU, as of `snap`.
    fn remember(&mut self, snap: &HostSnapshot) {
        remember_memory(&mut self.history, snap, snap.taken_at_ms);
        let mut seen: Vec<(u32, u64)> = snap
            .holders
            .iter()
            .map(|x| x.pid)
            .chain(
                snap.gpus
                    .iter()
                    .flat_map(|g| g.processes.iter().map(|p| p.pid)),
            )
            .map(|pid| (pid, snap.proc(pid).map_or(0, |p| p.start_time)))
            .collect();
        seen.sort_unstable();
        seen.dedup();
        self.held_since.retain(|k, _| seen.binary_search(k).is_ok());
        for k in seen {
            self.held_since.entry(k).or_insert(snap.taken_at_ms);
        }
    }
}

/// Keep a host's memory history as of `snap` read at `at_ms`.
fn remember_memory(history: &mut Histories, snap: &HostSnapshot, at_ms: u64) {
    history.reading(
        at_ms,
        snap.gpus
            .iter()
            .map(|g| (g.index, g.memory.used.map(|u| u / MIB))),
        HISTORY,
    );
}

#[derive(Debug, Clone, Default)]
pub struct Store {
    pub hosts: Vec<HostView>,
    /// What happened, oldest first (at most TIMELINE).
    pub timeline: VecDeque<Event>,
    /// Events kept during the current update, for the events file.
    unsaved: Vec<Event>,
    /// The longest host label, in characters: counted once (the hosts are fixed), not per frame over
    /// ten thousand labels.
    longest_label: usize,
}

impl Store {
    pub fn new(labels: Vec<String>) -> Store {
        Store {
            longest_label: labels.iter().map(|l| l.chars().count()).max().unwrap_or(0),
            hosts: labels.into_iter().map(HostView::new).collect(),
            ..Default::default()
        }
    }

    pub fn label(&self, h: HostId) -> String {
        self.hosts
            .get(h.0)
            .map(|v| v.label.clone())
            .unwrap_or_default()
    }

    /// The width of the longest host label, within `min..=max` (a column of host names).
    pub fn label_width(&self, min: usize, max: usize) -> usize {
        if self.hosts.is_empty() {
            return min;
        }
        self.longest_label.clamp(min, max)
    }

    /// Keep an event in the timeline (and, through the effects of this update, in the events file).
    /// Returns whether the timeline grew by one (a scrolled-back view stays on the rows it shows).
    pub fn keep(&mut self, e: Event) {
        self.timeline.push_back(e.clone());
        while self.timeline.len() > TIMELINE {
            self.timeline.pop_front();
        }
        self.unsaved.push(e);
    }

    /// The events kept since the last call, for the events file.
    pub fn take_unsaved(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.unsaved)
    }

    /// A judged reading: shown as it is.
    pub fn reading(&mut self, id: HostId, judged: Judged) {
        let Some(h) = self.hosts.get_mut(id.0) else {
            return;
        };
        h.remember(&judged.snap);
        h.last_seen_ms = Some(judged.snap.taken_at_ms);
        h.status = ConnStatus::Up;
        h.counts = judged.counts;
        h.leaks = judged.leaks;
        h.simulated = judged.provenance.simulated;
        h.snap = Some(judged.snap);
        h.gauges.clear();
    }

    /// A reading that moved only its memory since the one shown: put onto it. `false`, and nothing
    /// changed, where none is shown or it has another shape.
    pub fn memory(&mut self, id: HostId, m: MemoryJudged) -> bool {
        let Some(h) = self.hosts.get_mut(id.0) else {
            return false;
        };
        let (counts, leaks) = (m.counts, m.leaks);
        let Some(snap) = h.snap.as_mut() else {
            return false;
        };
        // Its own copy from here (its ledger made a new reading of the one they shared), the gauges said
        // since put in: memory alone may say none.
        let snap = Arc::make_mut(snap);
        if !h.gauges.is_empty() {
            snap.refresh(snap.taken_at_ms, &std::mem::take(&mut h.gauges));
        }
        if !m.put_onto_reading(snap) {
            return false;
        }
        h.last_seen_ms = Some(snap.taken_at_ms);
        // The same processes as before: only the memory history moves.
        remember_memory(&mut h.history, snap, snap.taken_at_ms);
        h.status = ConnStatus::Up;
        h.counts = counts;
        h.leaks = leaks;
        true
    }

    /// A reading that said the same as the last: its time and the gauges it said; the memory it said
    /// before goes on in the history and the chart.
    pub fn fresh(&mut self, id: HostId, taken_at_ms: u64, gauges: &SaidGauges) {
        let Some(h) = self.hosts.get_mut(id.0) else {
            return;
        };
        let Some(snap) = &h.snap else {
            return;
        };
        // Beside the reading, not into it: it stays its ledger's.
        gauges.put_beside(&mut h.gauges, snap);
        let at = taken_at_ms.max(h.last_seen_ms.unwrap_or(0));
        // The same memory as before: the history counts one more reading of it.
        h.history.again(at, HISTORY);
        h.last_seen_ms = Some(at);
        if matches!(h.status, ConnStatus::Stale { .. }) {
            h.status = ConnStatus::Up;
        }
    }

    pub fn status(&mut self, id: HostId, status: ConnStatus) {
        if let Some(h) = self.hosts.get_mut(id.0) {
            h.status = status;
        }
    }

    /// (clean, in use, leaking, unknown) over every GPU of every host.
    pub fn counts(&self) -> StateCounts {
        self.hosts
            .iter()
            .fold(StateCounts::default(), |c, h| c + h.counts)
    }

    /// Leak findings on every host.
    pub fn leaks(&self) -> usize {
        self.hosts.iter().map(|h| h.leaks).sum()
    }

    /// Whether some host's readings are of the simulated cluster.
    pub fn simulated(&self) -> bool {
        self.hosts.iter().any(|h| h.simulated)
    }

    /// Every host, with its label, for a watch of everything.
    pub fn all_hosts(&self) -> Vec<(HostId, String)> {
        self.hosts
            .iter()
            .enumerate()
            .map(|(i, h)| (HostId(i), h.label.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::AnalyzeOptions;
    use crate::core::model::{Gpu, ListedProcess, Memory, SourceKind};
    use crate::core::sse::MemoryMoved;
    use crate::runtime::Judgement;
    use crate::runtime::ledger::Ledger;

    /// A host read over HTTP, its GPU 0 held by 42, at `util` percent.
    fn reading(at: u64, util: u32, used_mib: u64) -> HostSnapshot {
        HostSnapshot {
            host: "h".into(),
            taken_at_ms: at,
            source: SourceKind::Http,
            gpus: vec![Gpu {
                index: 0,
                memory: Memory {
                    used: Some(used_mib * MIB),
                    total: Some(80 << 30),
                    reserved: None,
                },
                utilization: Some(util),
                processes: vec![ListedProcess {
                    pid: 42,
                    used_bytes: Some(used_mib * MIB),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// The TUI shows the ledger's reading itself, not a copy: readings that said the same go beside it
    /// (their gauges shown, their time in the history), and memory alone makes the TUI's own copy.
    #[test]
    fn the_reading_shown_is_the_ledgers_and_what_said_the_same_goes_beside_it() {
        let mut l = Ledger::new("h", AnalyzeOptions::default());
        l.hand_on_memory_alone();
        let mut store = Store::new(vec!["h".into()]);
        let id = HostId(0);
        let Judgement::New(j) = l.reading(reading(1_000, 5, 100)).0 else {
            panic!("a whole reading first")
        };
        let shared = Arc::clone(&j.snap);
        store.reading(id, *j);
        let Judgement::Same {
            taken_at_ms,
            gauges,
        } = l.reading(reading(2_000, 70, 100)).0
        else {
            panic!("the same")
        };
        store.fresh(id, taken_at_ms, &gauges);
        let h = &store.hosts[0];
        let snap = h.snap.as_ref().expect("shown");
        assert!(Arc::ptr_eq(snap, &shared), "still the ledger's reading");
        assert_eq!(h.gauges_of(0, &snap.gpus[0]).0, Some(70));
        assert_eq!(h.last_seen_ms, Some(2_000));
        assert_eq!(
            h.history.get(&0).map(|x| x.iter().collect::<Vec<_>>()),
            Some(vec![(1_000, 100), (2_000, 100)])
        );
        // Memory alone with no gauges: put onto the TUI's own copy, the gauges said before kept.
        let (used, charged) = reading(3_000, 70, 300).memory_numbers();
        let moved = MemoryMoved {
            host: "h".into(),
            taken_at_ms: 3_000,
            used,
            charged,
            gauges: None,
            moved: None,
            findings: None,
        };
        let Some((Judgement::Memory(m), _)) = l.memory(moved) else {
            panic!("memory alone")
        };
        assert!(store.memory(id, *m));
        let h = &store.hosts[0];
        let snap = h.snap.as_ref().expect("shown");
        assert_eq!(snap.gpus[0].memory.used, Some(300 * MIB));
        assert_eq!(h.gauges_of(0, &snap.gpus[0]).0, Some(70));
        assert_eq!(
            shared.gpus[0].memory.used,
            Some(100 * MIB),
            "the ledger's first reading as it was"
        );
        assert_eq!(
            l.latest().map(|j| j.snap.gpus[0].memory.used),
            Some(Some(300 * MIB))
        );
    }
}
