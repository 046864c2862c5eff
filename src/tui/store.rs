//! What the TUI knows of its hosts: each host's latest judged reading (as its ledger handed it on), its
//! connection, the memory history its chart draws, how long each GPU process has held a GPU, and the
//! timeline of events. It takes what the fleet sends and judges nothing itself.

use std::collections::{HashMap, VecDeque};

use crate::core::conn::ConnStatus;
use crate::core::event::Event;
use crate::core::model::{Gauges, HostId, HostSnapshot, MIB};
use crate::core::signal::Protected;
use crate::runtime::{Judged, MemoryJudged, StateCounts};

/// Samples of memory history kept per GPU (10 minutes at a 1 s poll).
pub const HISTORY: usize = 600;
/// Events kept for the timeline (the events file has them all).
pub const TIMELINE: usize = 2000;

#[derive(Debug, Clone)]
pub struct HostView {
    pub label: String,
    pub snap: Option<HostSnapshot>,
    pub status: ConnStatus,
    /// Unix ms of the last good reading.
    pub last_seen_ms: Option<u64>,
    /// Per GPU index, (Unix ms, used MiB) over time.
    pub history: super::history::Histories,
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
            status: ConnStatus::Connecting,
            last_seen_ms: None,
            history: super::history::Histories::default(),
            held_since: HashMap::new(),
            protected: Protected::remote(),
            read_only: false,
            simulated: false,
            counts: StateCounts::default(),
            leaks: 0,
        }
    }

    /// Keep its memory history and how long each GPU process has held a GPU, as of `snap`.
    fn remember(&mut self, snap: &HostSnapshot) {
        self.remember_memory(snap);
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

    /// Keep its memory history as of `snap`: all a reading that says the same (fresh) adds.
    fn remember_memory(&mut self, snap: &HostSnapshot) {
        for g in &snap.gpus {
            if let Some(used) = g.memory.used {
                self.history
                    .push(g.index, snap.taken_at_ms, used / MIB, HISTORY);
            }
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Store {
    pub hosts: Vec<HostView>,
    /// What happened, oldest first (at most TIMELINE).
    pub timeline: VecDeque<Event>,
    /// Events kept during the current update, for the events file.
    unsaved: Vec<Event>,
}

impl Store {
    pub fn new(labels: Vec<String>) -> Store {
        Store {
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
        self.hosts
            .iter()
            .map(|h| h.label.chars().count())
            .max()
            .unwrap_or(min)
            .clamp(min, max)
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
    }

    /// A reading that moved only its memory since the one shown: put onto it. `false`, and nothing
    /// changed, where none is shown or it has another shape.
    pub fn memory(&mut self, id: HostId, m: MemoryJudged) -> bool {
        let Some(h) = self.hosts.get_mut(id.0) else {
            return false;
        };
        let (counts, leaks) = (m.counts, m.leaks);
        let Some(mut snap) = h.snap.take() else {
            return false;
        };
        let fits = m.put_onto_reading(&mut snap);
        if fits {
            h.last_seen_ms = Some(snap.taken_at_ms);
            // The same processes as before: only the memory history moves.
            h.remember_memory(&snap);
        }
        h.snap = Some(snap);
        if !fits {
            return false;
        }
        h.status = ConnStatus::Up;
        h.counts = counts;
        h.leaks = leaks;
        true
    }

    /// A reading that said the same as the last: its time and gauges; the memory it said before goes on
    /// in the history and the chart.
    pub fn fresh(&mut self, id: HostId, taken_at_ms: u64, gauges: &[Gauges]) {
        let Some(h) = self.hosts.get_mut(id.0) else {
            return;
        };
        let Some(mut snap) = h.snap.take() else {
            return;
        };
        snap.refresh(taken_at_ms, gauges);
        // The same processes as before: only the memory history moves.
        h.remember_memory(&snap);
        h.last_seen_ms = Some(snap.taken_at_ms);
        h.snap = Some(snap);
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
