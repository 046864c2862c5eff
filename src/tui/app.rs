//! TUI state. It changes only through `update(Action)`, which does no I/O: what must happen outside (signal a
//! host, change its poll interval) comes back as `Effect`s for the event loop to carry out.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent};

use super::keymap::{Cmd, Keymap};
use super::rows::{ProcRow, build_rows};
pub use super::rows::{ProcView, SortKey};
use super::targets::{self, Choice};
use crate::analyze::AnalyzeOptions;
use crate::analyze::findings::shm::removable;
use crate::analyze::plan::{Plan, plan, plan_summary};
use crate::analyze::watch::{Scope, Watch};
use crate::core::action::{ActionAnswer, ActionRequest, Purpose};
use crate::core::event::{Event, EventKind};
use crate::core::format::{fmt_ms, millis};
use crate::core::model::{Finding, HostId, HostSnapshot, MIB, SourceKind};
use crate::core::removal::{RemovalRequest, ShmFile};
use crate::core::signal::{Protected, Sig, SignalRequest, TargetInfo};
use crate::core::smem::{Dtype, Tile};
use crate::runtime::{Judged, StateCounts};
use crate::source::{ConnStatus, HostCmd};

/// Samples of memory history kept per GPU (10 minutes at a 1 s poll).
pub const HISTORY: usize = 600;
/// Events kept for the timeline (the events file has them all).
pub const TIMELINE: usize = 2000;
/// Grace between TERM and KILL for sweeps started from the TUI.
pub const TUI_GRACE: Duration = Duration::from_secs(10);
/// Polling while re-watching.
pub const REWATCH_INTERVAL: Duration = crate::runtime::FAST_POLL;

#[derive(Debug, Clone)]
pub enum Action {
    /// A reading that says something new, as the host's ledger judged it.
    Reading(HostId, Box<Judged>),
    /// A reading at this Unix ms that says the same as the host's last snapshot, with its GPU gauges.
    Fresh(HostId, u64, Vec<crate::core::model::Gauges>),
    Status(HostId, ConnStatus),
    /// What happened on a host, as its ledger recorded it: for the timeline and the events file.
    Events(HostId, Vec<Event>),
    /// The answer to an action request sent with this id.
    Answer(HostId, u64, ActionAnswer),
    Key(KeyEvent),
    /// A click on a row of a panel (the event loop, which owns the layout, found which).
    Click {
        panel: Panel,
        row: usize,
    },
    /// The mouse wheel: move the selection this many rows.
    Scroll(i64),
    Resize(u16, u16),
    /// Wall-clock time in Unix milliseconds: ages and elapsed times are computed from it.
    Tick(u64),
    /// The host is now read live from this spec (it was seen through Prometheus), read-only or not.
    Opened(HostId, String, bool),
    /// It could not be opened live, for this reason.
    OpenFailed(HostId, String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    Send(HostId, HostCmd),
    Broadcast(HostCmd),
    /// An event for the `--events` file.
    Log(Event),
    /// Draw now, not at the next throttled redraw: a watch just completed.
    DrawNow,
    /// Read this host live from this address (`http(s)://...` or `ssh://name`) instead of Prometheus.
    OpenLive(HostId, String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Panel {
    #[default]
    Hosts,
    Gpus,
    Processes,
    Findings,
}

impl Panel {
    const ORDER: [Panel; 4] = [Panel::Hosts, Panel::Gpus, Panel::Processes, Panel::Findings];
    fn step(self, d: isize) -> Panel {
        let i = Self::ORDER.iter().position(|p| *p == self).unwrap_or(0);
        let n = Self::ORDER.len();
        Self::ORDER[(i + n).saturating_add_signed(d) % n]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepScope {
    Gpu,
    Host,
    Everything,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Dialog {
    Kill {
        host: HostId,
        target: TargetInfo,
        user: Option<String>,
        signal: Sig,
        /// What the operator should know first: the zombie or ghost this target stands for, a benign
        /// holder, state D.
        note: Option<String>,
    },
    /// A finding's whole text and the evidence behind it.
    Finding {
        host: HostId,
        finding: Finding,
    },
    /// Remove these /dev/shm leftovers of a host.
    Remove {
        host: HostId,
        files: Vec<ShmFile>,
    },
    Sweep {
        scope: SweepScope,
        host: HostId,
        gpu: Option<u32>,
        plan: Plan,
    },
    Help,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Good,
    Bad,
}

#[derive(Debug, Clone)]
pub struct HostView {
    pub label: String,
    pub snap: Option<HostSnapshot>,
    pub status: ConnStatus,
    /// Unix ms of the last good reading.
    pub last_seen_ms: Option<u64>,
    /// Per GPU index, (Unix ms, used MiB) over time.
    pub history: HashMap<u32, VecDeque<(u64, u64)>>,
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

/// Which panel has the focus and what is selected in each.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub focus: Panel,
    pub host: usize,
    pub gpu: usize,
    pub proc: usize,
    pub finding: usize,
}

/// What the app was started with.
#[derive(Debug, Clone)]
pub struct AppConfig {
    pub interval: Duration,
    pub keymap: Keymap,
    pub analyze: AnalyzeOptions,
    pub color: bool,
    /// The simulated cluster: marked on every screen and dialog, so it never passes for a real one.
    pub demo: bool,
    /// No kill, sweep or removal: for shared monitoring screens. Their keys are hidden.
    pub readonly: bool,
    /// A host with no reading this long after the start is reported, and still retried.
    pub connect_timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct Rewatch {
    pub watch: Watch,
    pub label: String,
}

#[derive(Debug, Clone, Default)]
pub struct SmemForm {
    pub tile: String,
    pub dtype_idx: usize,
    pub stages: u64,
    pub editing: bool,
}

pub const DTYPES: [Dtype; 5] = [
    Dtype::Bf16,
    Dtype::Fp16,
    Dtype::Fp8,
    Dtype::Fp4,
    Dtype::Fp32,
];

impl SmemForm {
    pub fn dtype(&self) -> Dtype {
        DTYPES[self.dtype_idx % DTYPES.len()]
    }
    pub fn tile(&self) -> Result<Tile, String> {
        Tile::parse(&self.tile)
    }
}

#[derive(Debug, Clone)]
pub struct App {
    pub hosts: Vec<HostView>,
    pub sel: Selection,
    pub procs: ProcView,
    pub dialog: Option<Dialog>,
    pub smem_open: bool,
    pub smem: SmemForm,
    pub status: Option<(String, Level)>,
    pub rewatch: Option<Rewatch>,
    pub banner: Option<String>,
    pub last_sweep_ms: Option<u64>,
    pub now_ms: u64,
    pub size: (u16, u16),
    pub quit: bool,
    pub cfg: AppConfig,
    /// What happened, oldest first (at most TIMELINE).
    pub timeline: VecDeque<Event>,
    pub timeline_open: bool,
    /// Rows scrolled back from the newest event.
    pub timeline_scroll: usize,
    pub chart_open: bool,
    /// When the app got its first clock tick, Unix ms.
    pub started_ms: Option<u64>,
    next_id: u64,
    pending: HashMap<u64, String>,
    /// The selected host's process rows, built once per reading of it (and when the filter, sort or tree
    /// change, or another host is selected): with a thousand hosts, only the one shown is worth the work.
    rows: Vec<ProcRow>,
    /// The host `rows` were built for.
    rows_host: Option<usize>,
    /// Events recorded during the current update, handed out as `Effect::Log`.
    unsaved: Vec<Event>,
    /// Moves with every update that may change what is drawn. A fresh reading of a host not on screen
    /// (most of a thousand hosts' readings) and the clock do not move it: the loop draws the clock at its
    /// own tick, and nothing else to draw means no frame.
    changes: u64,
}

impl App {
    pub fn new(
        labels: Vec<String>,
        interval: Duration,
        keymap: Keymap,
        analyze: AnalyzeOptions,
        color: bool,
    ) -> App {
        App {
            hosts: labels
                .into_iter()
                .map(|label| HostView {
                    label,
                    snap: None,
                    status: ConnStatus::Connecting,
                    last_seen_ms: None,
                    history: HashMap::new(),
                    held_since: HashMap::new(),
                    protected: Protected::remote(),
                    read_only: false,
                    simulated: false,
                    counts: StateCounts::default(),
                    leaks: 0,
                })
                .collect(),
            sel: Selection::default(),
            procs: ProcView {
                tree: false,
                filter: String::new(),
                editing: false,
                sort: SortKey::Memory,
            },
            dialog: None,
            smem_open: false,
            smem: SmemForm {
                tile: "128x256x128".into(),
                dtype_idx: 0,
                stages: 2,
                editing: false,
            },
            status: None,
            rewatch: None,
            banner: None,
            last_sweep_ms: None,
            now_ms: 0,
            size: (80, 24),
            quit: false,
            cfg: AppConfig {
                interval,
                keymap,
                analyze,
                color,
                demo: false,
                readonly: false,
                connect_timeout: Duration::from_secs(10),
            },
            timeline: VecDeque::new(),
            timeline_open: false,
            timeline_scroll: 0,
            chart_open: false,
            started_ms: None,
            next_id: 1,
            pending: HashMap::new(),
            rows: Vec::new(),
            rows_host: None,
            unsaved: Vec::new(),
            changes: 0,
        }
    }

    pub fn host(&self) -> Option<&HostView> {
        self.hosts.get(self.sel.host)
    }

    pub fn snap(&self) -> Option<&HostSnapshot> {
        self.host().and_then(|h| h.snap.as_ref())
    }

    /// (clean, in use, leaking, unknown) over every GPU of every host.
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let c = self
            .hosts
            .iter()
            .fold(StateCounts::default(), |c, h| c + h.counts);
        (c.clean, c.in_use, c.leak, c.unknown)
    }

    /// Whether what is shown is (partly) the simulated cluster: the demo itself, or a host whose readings
    /// say they are simulated (a demo serve read over HTTP).
    pub fn simulated(&self) -> bool {
        self.cfg.demo || self.hosts.iter().any(|h| h.simulated)
    }

    /// Whether this host's readings are simulated.
    pub fn host_simulated(&self, host: HostId) -> bool {
        self.cfg.demo || self.hosts.get(host.0).is_some_and(|h| h.simulated)
    }

    fn set_status(&mut self, msg: impl Into<String>, level: Level) {
        self.status = Some((msg.into(), level));
    }

    fn label(&self, h: HostId) -> String {
        self.hosts
            .get(h.0)
            .map(|v| v.label.clone())
            .unwrap_or_default()
    }

    /// Add an event of the TUI's own (a watch completed) to the timeline.
    fn record(&mut self, host: HostId, what: EventKind) {
        let e = Event {
            at_ms: self.now_ms,
            host: self.label(host),
            what,
        };
        self.keep(e);
    }

    /// Keep an event in the timeline (and, through the effects of this update, in the events file).
    fn keep(&mut self, e: Event) {
        self.timeline.push_back(e.clone());
        while self.timeline.len() > TIMELINE {
            self.timeline.pop_front();
        }
        // A scrolled-back timeline stays on the rows it shows.
        if self.timeline_scroll > 0 {
            self.timeline_scroll += 1;
        }
        self.unsaved.push(e);
    }

    /// Whether a host has said nothing usable for longer than the connect timeout.
    pub fn silent_too_long(&self, h: &HostView) -> bool {
        h.snap.is_none()
            && matches!(h.status, ConnStatus::Connecting)
            && self
                .started_ms
                .is_some_and(|t| self.now_ms.saturating_sub(t) >= millis(self.cfg.connect_timeout))
    }

    pub fn update(&mut self, action: Action) -> Vec<Effect> {
        let unseen = match &action {
            Action::Tick(_) => true,
            Action::Fresh(i, ..) => !self.fresh_shows(*i),
            _ => false,
        };
        if !unseen {
            self.changes = self.changes.wrapping_add(1);
        }
        let mut effects = self.dispatch(action);
        if self.rows_host != Some(self.sel.host) {
            self.rebuild_rows();
        }
        effects.extend(self.unsaved.drain(..).map(Effect::Log));
        effects
    }

    /// The count of updates that may have changed what is drawn (see `changes`).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Whether a fresh reading of host `i` changes the screen: the host shown (its processes' ages run
    /// from its reading's time, its GPUs show the gauges), or a stale one now fresh. Other hosts show
    /// neither gauges nor reading times.
    fn fresh_shows(&self, i: HostId) -> bool {
        self.hosts.get(i.0).is_some_and(|h| {
            h.snap.is_some()
                && (i.0 == self.sel.host || matches!(h.status, ConnStatus::Stale { .. }))
        })
    }

    #[allow(clippy::too_many_lines)] // one arm per action
    fn dispatch(&mut self, action: Action) -> Vec<Effect> {
        match action {
            Action::Reading(i, judged) => self.on_reading(i, *judged),
            Action::Events(_, events) => {
                for e in events {
                    self.keep(e);
                }
                vec![]
            }
            Action::Answer(i, id, answer) => self.on_answer(i, id, &answer),
            Action::Opened(i, spec, read_only) => {
                if let Some(h) = self.hosts.get_mut(i.0) {
                    h.status = ConnStatus::Connecting;
                    h.protected = Protected::remote();
                    h.read_only = read_only;
                }
                let label = self.label(i);
                self.set_status(format!("{label}: now read live from {spec}"), Level::Info);
                vec![]
            }
            Action::OpenFailed(i, why) => {
                let label = self.label(i);
                self.set_status(format!("{label}: cannot open it live: {why}"), Level::Bad);
                vec![]
            }
            Action::Fresh(i, taken_at_ms, gauges) => {
                if let Some(h) = self.hosts.get_mut(i.0)
                    && let Some(mut snap) = h.snap.take()
                {
                    snap.refresh(taken_at_ms, &gauges);
                    // The memory it said before, as of now: the history and the chart go on.
                    Self::remember(h, &snap);
                    h.last_seen_ms = Some(snap.taken_at_ms);
                    h.snap = Some(snap);
                    if matches!(h.status, ConnStatus::Stale { .. }) {
                        h.status = ConnStatus::Up;
                    }
                }
                vec![]
            }
            Action::Status(i, st) => {
                // A re-watch never counts a host it cannot read now as clean.
                if let Some(rw) = &mut self.rewatch {
                    match &st {
                        ConnStatus::Down(e) => rw.watch.unreadable(i, e.clone()),
                        ConnStatus::Stale { silent_ms } => rw
                            .watch
                            .unreadable(i, format!("stale: no reading for {}", fmt_ms(*silent_ms))),
                        ConnStatus::Up | ConnStatus::Connecting => {}
                    }
                }
                if let Some(h) = self.hosts.get_mut(i.0) {
                    if let ConnStatus::Down(e) = &st {
                        let msg = format!("{}: {e}", h.label);
                        h.status = st.clone();
                        self.set_status(msg, Level::Bad);
                    } else {
                        h.status = st;
                    }
                }
                vec![]
            }
            Action::Tick(now) => {
                self.now_ms = now;
                self.started_ms.get_or_insert(now);
                vec![]
            }
            Action::Resize(w, h) => {
                self.size = (w, h);
                vec![]
            }
            Action::Click { panel, row } => {
                self.on_click(panel, row);
                vec![]
            }
            Action::Scroll(d) => {
                self.move_sel(d);
                vec![]
            }
            Action::Key(k) => self.on_key(k),
        }
    }

    /// What became of an action: on the status line (the ledger put each target's fate on the timeline).
    fn on_answer(&mut self, i: HostId, id: u64, answer: &ActionAnswer) -> Vec<Effect> {
        let what = self.pending.remove(&id).unwrap_or_else(|| "action".into());
        let label = self.label(i);
        let level = if answer.failures() > 0 {
            Level::Bad
        } else {
            Level::Good
        };
        let text = answer.lines().join("; ");
        self.set_status(format!("{what} on {label}: {text}"), level);
        match answer {
            // Read again: the leftover findings clear with the next reading.
            ActionAnswer::Remove(_) => vec![Effect::Send(i, HostCmd::PollNow)],
            ActionAnswer::Signal(_) => vec![],
        }
    }

    /// Keep a host's memory history and how long each GPU process has held a GPU.
    fn remember(h: &mut HostView, snap: &HostSnapshot) {
        for g in &snap.gpus {
            if let Some(used) = g.memory.used {
                let hist = h.history.entry(g.index).or_default();
                hist.push_back((snap.taken_at_ms, used / MIB));
                while hist.len() > HISTORY {
                    hist.pop_front();
                }
            }
        }
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
        h.held_since.retain(|k, _| seen.contains(k));
        for k in seen {
            h.held_since.entry(k).or_insert(snap.taken_at_ms);
        }
    }

    /// A judged reading: shown as it is; its events came before it.
    fn on_reading(&mut self, id: HostId, judged: Judged) -> Vec<Effect> {
        let i = id.0;
        let Some(h) = self.hosts.get_mut(i) else {
            return vec![];
        };
        Self::remember(h, &judged.snap);
        h.last_seen_ms = Some(judged.snap.taken_at_ms);
        h.status = ConnStatus::Up;
        h.counts = judged.counts;
        h.leaks = judged.leaks;
        h.simulated = judged.provenance.simulated;
        h.snap = Some(judged.snap);
        if i == self.sel.host {
            self.rebuild_rows();
        }
        let effects = self.observe(id);
        self.clamp();
        effects
    }

    /// Feed a host's new reading to the running watch; when it completes, say so.
    fn observe(&mut self, id: HostId) -> Vec<Effect> {
        let Some(rw) = &mut self.rewatch else {
            return vec![];
        };
        let Some(s) = self.hosts.get(id.0).and_then(|h| h.snap.as_ref()) else {
            return vec![];
        };
        if !rw.watch.observe(id, s, self.now_ms) {
            return vec![];
        }
        let took = rw.watch.took_ms().unwrap_or(0);
        let n: usize = rw
            .watch
            .expected
            .iter()
            .filter_map(|(h, _)| self.hosts.get(h.0))
            .filter_map(|h| h.snap.as_ref())
            .map(|s| {
                s.gpus
                    .iter()
                    .filter(|g| rw.watch.scope.includes(g.index))
                    .count()
            })
            .sum();
        let what = if n == 1 {
            "its GPU reads".to_string()
        } else {
            format!("all {n} GPUs read")
        };
        self.banner = Some(format!(
            "✓ {}: {what} zero after {}",
            rw.label,
            fmt_ms(took)
        ));
        let scope = rw.label.clone();
        let watched: Vec<HostId> = rw.watch.expected.iter().map(|(h, _)| *h).collect();
        self.rewatch = None;
        // A host's own ledger says when it reads all clean after signals; a watch of more (or less) than one
        // whole host says it here.
        let said = self
            .timeline
            .iter()
            .rev()
            .take(64)
            .any(|e| matches!(&e.what, EventKind::AllClean { scope: s, .. } if *s == scope));
        if !said {
            self.record(
                id,
                EventKind::AllClean {
                    scope,
                    after_ms: took,
                },
            );
        }
        let mut effects = Self::poll_every(&watched, self.cfg.interval);
        effects.push(Effect::DrawNow);
        effects
    }

    fn clamp(&mut self) {
        let gpus = self.snap().map_or(0, |s| s.gpus.len());
        let procs = self.process_rows().len();
        let finds = self.snap().map_or(0, |s| s.findings.len());
        self.sel.gpu = self.sel.gpu.min(gpus.saturating_sub(1));
        self.sel.proc = self.sel.proc.min(procs.saturating_sub(1));
        self.sel.finding = self.sel.finding.min(finds.saturating_sub(1));
    }

    #[allow(clippy::too_many_lines)] // the keymap's dispatch: one arm per command
    fn on_key(&mut self, k: KeyEvent) -> Vec<Effect> {
        if self.procs.editing {
            match k.code {
                KeyCode::Enter => self.procs.editing = false,
                KeyCode::Esc => {
                    self.procs.filter.clear();
                    self.procs.editing = false;
                }
                KeyCode::Backspace => {
                    self.procs.filter.pop();
                }
                KeyCode::Char(c) if self.procs.filter.len() < 64 => self.procs.filter.push(c),
                _ => {}
            }
            self.sel.proc = 0;
            self.rebuild_rows();
            return vec![];
        }
        if self.smem_open && self.smem.editing {
            match k.code {
                KeyCode::Enter | KeyCode::Esc => self.smem.editing = false,
                KeyCode::Backspace => {
                    self.smem.tile.pop();
                }
                KeyCode::Char(c)
                    if (c.is_ascii_digit() || c == 'x') && self.smem.tile.len() < 20 =>
                {
                    self.smem.tile.push(c);
                }
                _ => {}
            }
            return vec![];
        }
        if let Some(d) = self.dialog.clone() {
            return self.on_dialog_key(d, k);
        }
        let cmd = self.cfg.keymap.lookup(&k);
        if self.smem_open {
            match (cmd, k.code) {
                (Some(Cmd::Quit), _) => self.quit = true,
                (Some(Cmd::Back | Cmd::Smem), _) => self.smem_open = false,
                (_, KeyCode::Char('e') | KeyCode::Enter) => self.smem.editing = true,
                (_, KeyCode::Char('d')) => {
                    self.smem.dtype_idx = (self.smem.dtype_idx + 1) % DTYPES.len();
                }
                (_, KeyCode::Char('+')) => self.smem.stages = (self.smem.stages + 1).min(16),
                (_, KeyCode::Char('-')) => {
                    self.smem.stages = self.smem.stages.saturating_sub(1).max(1);
                }
                (Some(Cmd::Up), _) => self.move_sel(-1),
                (Some(Cmd::Down), _) => self.move_sel(1),
                (Some(Cmd::Help), _) => self.dialog = Some(Dialog::Help),
                _ => {}
            }
            return vec![];
        }
        if self.timeline_open {
            match cmd {
                Some(Cmd::Quit) => self.quit = true,
                Some(Cmd::Back | Cmd::Timeline) => self.timeline_open = false,
                Some(Cmd::Up) => {
                    self.timeline_scroll =
                        (self.timeline_scroll + 1).min(self.timeline.len().saturating_sub(1));
                }
                Some(Cmd::Down) => self.timeline_scroll = self.timeline_scroll.saturating_sub(1),
                Some(Cmd::Help) => self.dialog = Some(Dialog::Help),
                _ => {}
            }
            return vec![];
        }
        if self.cfg.readonly && matches!(cmd, Some(Cmd::Kill | Cmd::Sweep | Cmd::RemoveShm)) {
            self.set_status(
                "read-only: kills, sweeps and removals are off (--readonly / readonly = true)",
                Level::Info,
            );
            return vec![];
        }
        if matches!(cmd, Some(Cmd::Kill | Cmd::Sweep | Cmd::RemoveShm))
            && self.host().is_some_and(|h| h.read_only)
        {
            let src = self.snap().map_or(SourceKind::Http, |s| s.source);
            let how = if src == SourceKind::Prometheus {
                "Enter on it in the hosts panel opens it live"
            } else {
                "reach it over SSH (--hosts user@node) or through its agent to act"
            };
            self.set_status(
                format!(
                    "{} is read-only (read {}): {how}",
                    self.label(HostId(self.sel.host)),
                    if src == SourceKind::Prometheus {
                        "from Prometheus"
                    } else {
                        "over HTTP"
                    }
                ),
                Level::Info,
            );
            return vec![];
        }
        match cmd {
            Some(Cmd::Quit) => self.quit = true,
            Some(Cmd::Up) => self.move_sel(-1),
            Some(Cmd::Down) => self.move_sel(1),
            Some(Cmd::Open) if self.sel.focus == Panel::Findings => self.open_finding(),
            Some(Cmd::Timeline) => {
                self.timeline_open = true;
                self.timeline_scroll = 0;
                self.smem_open = false;
            }
            Some(Cmd::Chart) => self.chart_open = !self.chart_open,
            Some(Cmd::RemoveShm) => self.open_remove(),
            Some(Cmd::NextPanel) => self.sel.focus = self.sel.focus.step(1),
            Some(Cmd::PrevPanel) => self.sel.focus = self.sel.focus.step(-1),
            Some(Cmd::Open) if self.sel.focus == Panel::Hosts => {
                self.sel.focus = Panel::Gpus;
                // A host seen through Prometheus opens live: through its serve, or over SSH.
                let host = HostId(self.sel.host);
                if let Some(url) = self
                    .snap()
                    .filter(|s| s.source == SourceKind::Prometheus)
                    .and_then(|s| s.live_url.clone())
                {
                    self.set_status(
                        format!("opening {} live: {url}", self.label(host)),
                        Level::Info,
                    );
                    return vec![Effect::OpenLive(host, url)];
                }
            }
            Some(Cmd::Back) => {
                // Esc first ends what runs without end: a re-watch.
                if self.rewatch.is_some() {
                    return self.toggle_rewatch();
                }
                if self.banner.is_some() {
                    self.banner = None;
                } else if !self.procs.filter.is_empty() {
                    self.procs.filter.clear();
                    self.rebuild_rows();
                } else {
                    self.sel.focus = Panel::Hosts;
                }
            }
            Some(Cmd::Kill) => self.open_kill(),
            Some(Cmd::Sweep) => self.open_sweep(),
            Some(Cmd::Rewatch) => return self.toggle_rewatch(),
            Some(Cmd::Filter) => {
                self.procs.editing = true;
                self.sel.focus = Panel::Processes;
            }
            Some(Cmd::Sort) => {
                self.procs.sort = self.procs.sort.next();
                self.rebuild_rows();
            }
            Some(Cmd::Refresh) => {
                self.set_status("refreshing", Level::Info);
                return vec![Effect::Broadcast(HostCmd::PollNow)];
            }
            Some(Cmd::Smem) => self.smem_open = true,
            Some(Cmd::Help) => self.dialog = Some(Dialog::Help),
            Some(Cmd::Tree) => {
                self.procs.tree = !self.procs.tree;
                self.rebuild_rows();
            }
            Some(Cmd::Open) | None => {}
        }
        vec![]
    }

    fn move_sel(&mut self, d: i64) {
        let mv = |v: &mut usize, n: usize| {
            let last = n.saturating_sub(1);
            *v = if d < 0 {
                v.saturating_sub(usize::try_from(d.unsigned_abs()).unwrap_or(usize::MAX))
            } else {
                v.saturating_add(usize::try_from(d).unwrap_or(usize::MAX))
                    .min(last)
            };
        };
        match self.sel.focus {
            Panel::Hosts => {
                let before = self.sel.host;
                mv(&mut self.sel.host, self.hosts.len());
                if before != self.sel.host {
                    self.sel.gpu = 0;
                    self.sel.proc = 0;
                    self.sel.finding = 0;
                }
            }
            Panel::Gpus => {
                let n = self.snap().map_or(0, |s| s.gpus.len());
                mv(&mut self.sel.gpu, n);
            }
            Panel::Processes => {
                let n = self.process_rows().len();
                mv(&mut self.sel.proc, n);
            }
            Panel::Findings => {
                let n = self.snap().map_or(0, |s| s.findings.len());
                mv(&mut self.sel.finding, n);
            }
        }
    }

    fn open_kill(&mut self) {
        let host = HostId(self.sel.host);
        let (Some(h), Some(snap)) = (self.host(), self.snap()) else {
            self.set_status("no reading of this host yet", Level::Info);
            return;
        };
        let choice = match self.sel.focus {
            Panel::Processes => match self.process_rows().get(self.sel.proc) {
                Some(r) if r.ghost => targets::for_ghost(snap, r.pid, &h.protected),
                Some(r) => targets::for_pid(snap, r.pid, &h.protected),
                None => Choice::Explain("no process row selected".into()),
            },
            Panel::Findings => match snap.findings.get(self.sel.finding) {
                Some(f) => targets::for_finding(snap, f, &h.protected),
                None => Choice::Explain("no finding selected".into()),
            },
            Panel::Hosts | Panel::Gpus => Choice::Explain(
                "select a process first: Tab to the process or findings panel".into(),
            ),
        };
        match choice {
            Choice::Offer { target, note } => {
                self.dialog = Some(Dialog::Kill {
                    host,
                    target: TargetInfo::of(&target),
                    user: target.user.clone(),
                    signal: Sig::Term,
                    note,
                });
            }
            Choice::Explain(why) => self.set_status(why, Level::Info),
        }
    }

    /// Enter on a finding: its whole text and evidence.
    fn open_finding(&mut self) {
        let host = HostId(self.sel.host);
        if let Some(f) = self.snap().and_then(|s| s.findings.get(self.sel.finding)) {
            self.dialog = Some(Dialog::Finding {
                host,
                finding: f.clone(),
            });
        }
    }

    /// D: the selected host's /dev/shm leftovers, for a confirmation that lists them.
    fn open_remove(&mut self) {
        let host = HostId(self.sel.host);
        let files = self.snap().map(removable).unwrap_or_default();
        if files.is_empty() {
            let label = self.label(host);
            self.set_status(
                format!("no /dev/shm leftovers on {label} (nobody-uses-it files only)"),
                Level::Info,
            );
            return;
        }
        self.dialog = Some(Dialog::Remove { host, files });
    }

    /// The plan for a scope, from the latest readings.
    pub fn plan_for(&self, scope: SweepScope, host: HostId, gpu: Option<u32>) -> Plan {
        let mut all = Plan::default();
        for (i, h) in self.hosts.iter().enumerate() {
            if scope != SweepScope::Everything && i != host.0 {
                continue;
            }
            let Some(s) = &h.snap else { continue };
            let gpus = if scope == SweepScope::Gpu {
                gpu.map(|g| vec![g])
            } else {
                None
            };
            all.extend(plan(HostId(i), s, gpus.as_deref(), &h.protected));
        }
        all
    }

    fn open_sweep(&mut self) {
        let host = HostId(self.sel.host);
        let gpu = self
            .snap()
            .and_then(|s| s.gpus.get(self.sel.gpu))
            .map(|g| g.index);
        let scope = match self.sel.focus {
            Panel::Gpus if gpu.is_some() => SweepScope::Gpu,
            _ => SweepScope::Host,
        };
        let plan = self.plan_for(scope, host, gpu);
        self.dialog = Some(Dialog::Sweep {
            scope,
            host,
            gpu,
            plan,
        });
    }

    #[allow(clippy::too_many_lines)] // one arm per dialog, each short
    fn on_dialog_key(&mut self, d: Dialog, k: KeyEvent) -> Vec<Effect> {
        let yes = matches!(k.code, KeyCode::Enter | KeyCode::Char('y'));
        let no = matches!(k.code, KeyCode::Esc | KeyCode::Char('n' | 'q'));
        match d {
            Dialog::Help => {
                self.dialog = None;
                vec![]
            }
            Dialog::Finding { host, finding } => {
                self.dialog = None;
                // K from the details acts on the finding, as it would from the panel.
                if self.cfg.keymap.lookup(&k) == Some(Cmd::Kill)
                    && !self.cfg.readonly
                    && let Some(i) = self
                        .hosts
                        .get(host.0)
                        .and_then(|h| h.snap.as_ref())
                        .and_then(|s| s.findings.iter().position(|f| *f == finding))
                {
                    self.sel.host = host.0;
                    self.sel.focus = Panel::Findings;
                    self.sel.finding = i;
                    self.open_kill();
                }
                vec![]
            }
            Dialog::Remove { host, files } => {
                if no {
                    self.dialog = None;
                    return vec![];
                }
                if !yes {
                    return vec![];
                }
                self.dialog = None;
                let id = self.take_id("remove".into());
                self.set_status(
                    format!("removing {} /dev/shm file(s)…", files.len()),
                    Level::Info,
                );
                let req = ActionRequest::Remove(RemovalRequest { files });
                vec![Effect::Send(host, HostCmd::Act { id, req })]
            }
            Dialog::Kill {
                host,
                target,
                user,
                signal,
                note,
            } => {
                if no {
                    self.dialog = None;
                    return vec![];
                }
                if matches!(
                    k.code,
                    KeyCode::Tab | KeyCode::Left | KeyCode::Right | KeyCode::Char('t')
                ) {
                    let signal = if signal == Sig::Term {
                        Sig::Kill
                    } else {
                        Sig::Term
                    };
                    self.dialog = Some(Dialog::Kill {
                        host,
                        target,
                        user,
                        signal,
                        note,
                    });
                    return vec![];
                }
                if !yes {
                    return vec![];
                }
                self.dialog = None;
                let id = self.take_id(format!("{} {}", signal.name(), target.pid));
                let grace = (signal == Sig::Term).then_some(millis(TUI_GRACE));
                self.set_status(
                    format!("sending {} to {}…", signal.name(), target.pid),
                    Level::Info,
                );
                let req = ActionRequest::Signal(SignalRequest {
                    targets: vec![target],
                    signal,
                    grace_ms: grace,
                    purpose: Some(Purpose::Kill),
                });
                vec![Effect::Send(host, HostCmd::Act { id, req })]
            }
            Dialog::Sweep {
                scope,
                host,
                gpu,
                plan,
            } => {
                if no {
                    self.dialog = None;
                    return vec![];
                }
                if matches!(k.code, KeyCode::Tab | KeyCode::Left | KeyCode::Right) {
                    let order = [SweepScope::Gpu, SweepScope::Host, SweepScope::Everything];
                    let i = order.iter().position(|s| *s == scope).unwrap_or(1);
                    let mut next = order[(i + if k.code == KeyCode::Left { 2 } else { 1 }) % 3];
                    if next == SweepScope::Gpu && gpu.is_none() {
                        next = SweepScope::Host;
                    }
                    let plan = self.plan_for(next, host, gpu);
                    self.dialog = Some(Dialog::Sweep {
                        scope: next,
                        host,
                        gpu,
                        plan,
                    });
                    return vec![];
                }
                if !yes {
                    return vec![];
                }
                self.dialog = None;
                self.start_sweep(scope, host, gpu, &plan)
            }
        }
    }

    fn take_id(&mut self, what: String) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.pending.insert(id, what);
        id
    }

    fn start_sweep(
        &mut self,
        scope: SweepScope,
        host: HostId,
        gpu: Option<u32>,
        plan: &Plan,
    ) -> Vec<Effect> {
        let mut effects = Vec::new();
        for h in plan.hosts() {
            let id = self.take_id("sweep".into());
            let req = plan.request(h, Sig::Term, Some(millis(TUI_GRACE)), Purpose::Sweep);
            let req = ActionRequest::Signal(req);
            effects.push(Effect::Send(h, HostCmd::Act { id, req }));
        }
        self.last_sweep_ms = Some(self.now_ms);
        let label_of = |h: HostId| {
            self.hosts
                .get(h.0)
                .map(|v| v.label.clone())
                .unwrap_or_default()
        };
        let (expected, label, scope_gpus) = match scope {
            SweepScope::Everything => (self.all_hosts(), "every host".to_string(), None),
            SweepScope::Host => {
                let l = label_of(host);
                (vec![(host, l.clone())], l, None)
            }
            SweepScope::Gpu => {
                let l = label_of(host);
                (
                    vec![(host, l.clone())],
                    format!("{l} GPU {}", gpu.unwrap_or(0)),
                    gpu.map(|g| vec![g]),
                )
            }
        };
        if plan.items.is_empty() {
            self.set_status("nothing to signal; watching until clean", Level::Info);
        } else {
            self.set_status(format!("sweeping: {}", plan_summary(plan)), Level::Info);
        }
        self.rewatch = Some(Rewatch {
            watch: Watch::new(
                expected,
                Scope { gpus: scope_gpus },
                self.cfg.analyze.tolerance,
                self.now_ms,
            ),
            label,
        });
        self.banner = None;
        effects.extend(self.watch_fast());
        effects
    }

    /// The poll interval of a watch over `n` hosts: 100 ms for a few, slower for many, so that a thousand
    /// hosts re-watched at once still send at most about a thousand readings a second; never slower than the
    /// normal interval.
    pub fn fast_interval(&self, n: usize) -> Duration {
        let per_host = Duration::from_millis(u64::try_from(n).unwrap_or(u64::MAX));
        REWATCH_INTERVAL.max(per_host).min(self.cfg.interval)
    }

    /// Poll these hosts (and only these) every `every`.
    fn poll_every(hosts: &[HostId], every: Duration) -> Vec<Effect> {
        hosts
            .iter()
            .map(|h| Effect::Send(*h, HostCmd::Interval(every)))
            .collect()
    }

    /// The hosts of the running watch, polled fast.
    fn watch_fast(&self) -> Vec<Effect> {
        let Some(rw) = &self.rewatch else {
            return vec![];
        };
        let hosts: Vec<HostId> = rw.watch.expected.iter().map(|(h, _)| *h).collect();
        Self::poll_every(&hosts, self.fast_interval(hosts.len()))
    }

    fn toggle_rewatch(&mut self) -> Vec<Effect> {
        if let Some(rw) = self.rewatch.take() {
            self.set_status("re-watch stopped", Level::Info);
            let hosts: Vec<HostId> = rw.watch.expected.iter().map(|(h, _)| *h).collect();
            return Self::poll_every(&hosts, self.cfg.interval);
        }
        // The scope in view: every host from the hosts panel, the opened host otherwise.
        let (expected, label) = if self.sel.focus == Panel::Hosts {
            (self.all_hosts(), "every host".to_string())
        } else {
            let h = HostId(self.sel.host);
            let l = self.label(h);
            (vec![(h, l.clone())], l)
        };
        self.rewatch = Some(Rewatch {
            watch: Watch::new(
                expected,
                Scope::default(),
                self.cfg.analyze.tolerance,
                self.now_ms,
            ),
            label,
        });
        self.banner = None;
        let mut effects = self.watch_fast();
        effects.extend(
            effects
                .iter()
                .filter_map(|e| match e {
                    Effect::Send(h, _) => Some(Effect::Send(*h, HostCmd::PollNow)),
                    _ => None,
                })
                .collect::<Vec<_>>(),
        );
        effects
    }

    /// Every host, with its label, for a watch of everything.
    fn all_hosts(&self) -> Vec<(HostId, String)> {
        self.hosts
            .iter()
            .enumerate()
            .map(|(i, h)| (HostId(i), h.label.clone()))
            .collect()
    }

    fn on_click(&mut self, panel: Panel, row: usize) {
        self.sel.focus = panel;
        match panel {
            Panel::Hosts => {
                if row < self.hosts.len() {
                    self.sel.host = row;
                }
            }
            Panel::Gpus => self.sel.gpu = row,
            Panel::Processes => self.sel.proc = row,
            Panel::Findings => self.sel.finding = row,
        }
        self.clamp();
    }

    /// The process panel's rows for the selected host (cached: built when its reading arrives).
    pub fn process_rows(&self) -> &[ProcRow] {
        if self.rows_host == Some(self.sel.host) {
            &self.rows
        } else {
            &[]
        }
    }

    /// Rebuild the selected host's rows (the filter, sort or tree changed, or another host was chosen).
    fn rebuild_rows(&mut self) {
        self.rows = self
            .snap()
            .map(|s| build_rows(s, &self.procs))
            .unwrap_or_default();
        self.rows_host = Some(self.sel.host);
    }

    /// Hosts without a usable reading now: down, or silent past the connect timeout.
    pub fn down_count(&self) -> usize {
        self.hosts
            .iter()
            .filter(|h| matches!(h.status, ConnStatus::Down(_)) || self.silent_too_long(h))
            .count()
    }

    /// Findings worth a glance in the header: leaks on any host.
    pub fn leak_count(&self) -> usize {
        self.hosts.iter().map(|h| h.leaks).sum()
    }
}
