//! TUI state. It changes only through `update(Action)`, which does no I/O: what must happen outside (signal a
//! host, change its poll interval) comes back as `Effect`s for the event loop to carry out. `App` holds the
//! view: what is selected, what is on top (`modes`), the status line; what the hosts sent is in `Store`, and
//! the re-watch workflow in `watch`.

use std::collections::HashMap;
use std::time::Duration;

use crossterm::event::KeyEvent;

use super::keymap::Keymap;
pub use super::modes::{Dialog, Mode, SweepScope};

/// A job as the jobs overlay shows it: its id and what each host it runs on says of it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    pub id: String,
    pub members: Vec<(HostId, crate::core::job::JobReport)>,
}

impl JobRow {
    /// In trouble on some host: a rank lost, or hung alive (shown first).
    pub fn troubled(&self) -> bool {
        use crate::core::job::Phase;
        self.members
            .iter()
            .any(|(_, j)| matches!(j.phase, Phase::LostRank | Phase::Hung))
    }
    /// What its live ranks hold over every host; `None` where no charge is known.
    pub fn bytes(&self) -> Option<u64> {
        crate::analyze::jobs::sum_known(self.members.iter().map(|(_, j)| j.bytes))
    }
    pub fn ranks(&self) -> usize {
        self.members.iter().map(|(_, j)| j.ranks.len()).sum()
    }
}
use super::rows::{ProcRow, build_rows};
pub use super::rows::{ProcView, SortKey};
pub use super::store::{HISTORY, HostView, Store, TIMELINE};
pub use super::watch::{REWATCH_INTERVAL, Rewatch};
use crate::analyze::AnalyzeOptions;
use crate::core::action::ActionAnswer;
use crate::core::conn::{ConnStatus, HostCmd};
use crate::core::event::Event;
use crate::core::format::millis;
use crate::core::model::{HostId, HostSnapshot};
use crate::core::signal::Protected;
use crate::core::smem::{Dtype, Tile, TileError};
use crate::runtime::{Judgement, StateCounts};

/// Grace between TERM and KILL for sweeps started from the TUI.
pub const TUI_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub enum Action {
    /// What the host's ledger decided of its readings: a whole judged reading, memory alone (put onto the
    /// one shown), or a new time and gauges for the reading shown.
    Update(HostId, Judgement),
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
    /// Show this host's whole reading as its ledger keeps it: memory alone did not fit the one shown.
    Whole(HostId),
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
    #[must_use]
    pub fn step(self, d: isize) -> Panel {
        let i = Self::ORDER.iter().position(|p| *p == self).unwrap_or(0);
        let n = Self::ORDER.len();
        Self::ORDER[(i + n).saturating_add_signed(d) % n]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Good,
    Bad,
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

/// The tile calculator's inputs, kept while its panel is closed.
#[derive(Debug, Clone, Default)]
pub struct SmemForm {
    pub tile: String,
    pub dtype_idx: usize,
    pub stages: u64,
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
    pub fn tile(&self) -> Result<Tile, TileError> {
        Tile::parse(&self.tile)
    }
}

/// The view: selection, panels, the status line and banner, the clock.
/// How long a status message stays on the status line.
pub const STATUS_FOR_MS: u64 = 10_000;

#[derive(Debug, Clone)]
pub struct View {
    pub sel: Selection,
    pub procs: ProcView,
    pub size: (u16, u16),
    pub chart_open: bool,
    pub status: Option<(String, Level)>,
    /// When the status message was said (`None`: before the first clock tick); it goes after `STATUS_FOR`
    /// and the key hints come back.
    pub status_at_ms: Option<u64>,
    /// "✓ gpu-b: all 8 GPUs read zero after 101 ms", until dismissed.
    pub banner: Option<String>,
    pub quit: bool,
    pub now_ms: u64,
    /// When the app got its first clock tick, Unix ms.
    pub started_ms: Option<u64>,
    pub last_sweep_ms: Option<u64>,
    /// The hosts panel's filter: words a host must all match, a part of its name or a state
    /// (`is:leaking`, see `HOST_STATES`).
    pub hosts_filter: String,
}

/// The states the hosts filter knows, as `is:STATE`.
pub const HOST_STATES: [&str; 5] = ["leaking", "unreadable", "connecting", "clean", "troubled"];

#[derive(Debug, Clone)]
pub struct App {
    pub store: Store,
    pub view: View,
    /// What is on top: the main screen, a dialog, an overlay, a line being typed.
    pub mode: Mode,
    pub cfg: AppConfig,
    pub smem: SmemForm,
    /// The running watch until clean, if any.
    pub(super) rewatch: Option<Rewatch>,
    next_id: u64,
    /// What each request in flight is, by id, for its answer's status line.
    pending: HashMap<u64, String>,
    /// The selected host's process rows, built once per reading of it (and when the filter, sort or tree
    /// change, or another host is selected): with a thousand hosts, only the one shown is worth the work.
    rows: Vec<ProcRow>,
    /// The host `rows` were built for.
    rows_host: Option<usize>,
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
            store: Store::new(labels),
            view: View {
                sel: Selection::default(),
                procs: ProcView {
                    tree: false,
                    filter: String::new(),
                    sort: SortKey::Memory,
                },
                size: (80, 24),
                chart_open: false,
                status: None,
                status_at_ms: None,
                banner: None,
                quit: false,
                now_ms: 0,
                started_ms: None,
                last_sweep_ms: None,
                hosts_filter: String::new(),
            },
            mode: Mode::Main,
            cfg: AppConfig {
                interval,
                keymap,
                analyze,
                color,
                demo: false,
                readonly: false,
                connect_timeout: Duration::from_secs(10),
            },
            smem: SmemForm {
                tile: "128x256x128".into(),
                dtype_idx: 0,
                stages: 2,
            },
            rewatch: None,
            next_id: 1,
            pending: HashMap::new(),
            rows: Vec::new(),
            rows_host: None,
            changes: 0,
        }
    }

    pub fn host(&self) -> Option<&HostView> {
        self.store.hosts.get(self.view.sel.host)
    }

    pub fn snap(&self) -> Option<&HostSnapshot> {
        self.host().and_then(HostView::snap)
    }

    /// The dialog on top, if one is.
    pub fn dialog(&self) -> Option<&Dialog> {
        match &self.mode {
            Mode::Dialog(d) => Some(d),
            _ => None,
        }
    }

    /// The running re-watch, if any.
    pub fn rewatch(&self) -> Option<&Rewatch> {
        self.rewatch.as_ref()
    }

    /// The timeline is open, scrolled back this many rows.
    pub fn timeline_scroll(&self) -> Option<usize> {
        match self.mode {
            Mode::Timeline { scroll } => Some(scroll),
            _ => None,
        }
    }

    /// Whether a host needs a look: it leaks, or it cannot be read (down, stale, silent too long).
    pub fn troubled(&self, h: &HostView) -> bool {
        h.leaks > 0
            || matches!(h.status, ConnStatus::Down(_) | ConnStatus::Stale { .. })
            || self.silent_too_long(h)
    }

    /// Whether host `h` is in state `state` (one of `HOST_STATES`).
    fn host_is(&self, h: &HostView, state: &str) -> bool {
        match state {
            "leaking" => h.leaks > 0,
            "unreadable" => {
                matches!(h.status, ConnStatus::Down(_) | ConnStatus::Stale { .. })
                    || self.silent_too_long(h)
            }
            "connecting" => h.snap.is_none() && matches!(h.status, ConnStatus::Connecting),
            "clean" => h.snap.as_ref().is_some_and(|s| {
                s.error.is_none() && !s.gpus.is_empty() && h.counts.clean == s.gpus.len()
            }),
            "troubled" => self.troubled(h),
            _ => false,
        }
    }

    /// Whether the hosts filter shows host `h`: it matches every word (a part of its name, any case, or
    /// `is:STATE`).
    fn host_matches(&self, h: &HostView, words: &[(bool, String)]) -> bool {
        words.iter().all(|(state, w)| {
            if *state {
                self.host_is(h, w)
            } else {
                h.label.to_lowercase().contains(w.as_str())
            }
        })
    }

    /// The hosts filter's words: (a state?, the word in lower case).
    fn filter_words(&self) -> Vec<(bool, String)> {
        self.view
            .hosts_filter
            .split_whitespace()
            .map(|w| match w.strip_prefix("is:") {
                Some(st) => (true, st.to_lowercase()),
                None => (false, w.to_lowercase()),
            })
            .collect()
    }

    /// The hosts the hosts panel shows, by index: every host, or those the filter matches.
    pub fn shown_hosts(&self) -> Vec<usize> {
        let words = self.filter_words();
        (0..self.store.hosts.len())
            .filter(|&i| words.is_empty() || self.host_matches(&self.store.hosts[i], &words))
            .collect()
    }

    /// The filter's `is:` words that name no state.
    pub fn unknown_states(&self) -> Vec<String> {
        self.filter_words()
            .into_iter()
            .filter(|(state, w)| *state && !HOST_STATES.contains(&w.as_str()))
            .map(|(_, w)| w)
            .collect()
    }

    /// After the hosts filter changed: a selected host it hides gives way to the first it shows.
    pub(super) fn keep_shown_host_selected(&mut self) {
        let shown = self.shown_hosts();
        if shown.contains(&self.view.sel.host) {
            return;
        }
        if let Some(&first) = shown.first() {
            self.select_host(first);
        }
    }

    /// Select host `i`, from its first GPU, process and finding.
    fn select_host(&mut self, i: usize) {
        let sel = &mut self.view.sel;
        if i != sel.host {
            sel.host = i;
            sel.gpu = 0;
            sel.proc = 0;
            sel.finding = 0;
        }
    }

    /// `n`: select the next host after the selected one that needs a look (round the list, among those the
    /// hosts filter shows), on the hosts panel; say so when none does.
    pub(super) fn next_trouble(&mut self) {
        let n = self.store.hosts.len();
        let from = self.view.sel.host;
        let words = self.filter_words();
        let next = (1..=n).map(|k| (from + k) % n.max(1)).find(|&i| {
            self.store
                .hosts
                .get(i)
                .is_some_and(|h| self.troubled(h) && self.host_matches(h, &words))
        });
        match next {
            Some(i) => {
                self.view.sel.focus = Panel::Hosts;
                self.select_host(i);
            }
            None => self.set_status("no host leaks or is unreadable", Level::Good),
        }
    }

    /// The jobs overlay is open, with this row selected.
    pub fn jobs_sel(&self) -> Option<usize> {
        match self.mode {
            Mode::Jobs { sel } => Some(sel),
            _ => None,
        }
    }

    /// Every job of every host, one row per job: a scheduler's job spread over hosts is one row (its id is
    /// the same on each), a launcher tree is its host's alone. Lost ranks first, then by memory.
    pub fn job_rows(&self) -> Vec<JobRow> {
        let mut rows: Vec<JobRow> = Vec::new();
        for (i, h) in self.store.hosts.iter().enumerate() {
            let Some(s) = &h.snap else { continue };
            for j in &s.jobs {
                let shared = j.job.is_some();
                match rows
                    .iter_mut()
                    .find(|r| shared && r.id == j.id && r.members[0].1.job.is_some())
                {
                    Some(r) => r.members.push((HostId(i), j.clone())),
                    None => rows.push(JobRow {
                        id: j.id.clone(),
                        members: vec![(HostId(i), j.clone())],
                    }),
                }
            }
        }
        rows.sort_by_key(|r| {
            (
                !r.troubled(),
                std::cmp::Reverse(r.bytes().unwrap_or(0)),
                r.id.clone(),
            )
        });
        rows
    }

    /// The shared-memory panel is open; `Some(true)` while its tile is typed.
    pub fn smem_editing(&self) -> Option<bool> {
        match self.mode {
            Mode::Smem { editing } => Some(editing),
            _ => None,
        }
    }

    /// The process filter is being typed.
    pub fn filter_editing(&self) -> bool {
        self.mode == Mode::Filter
    }

    /// The hosts filter is being typed.
    pub fn hosts_filter_editing(&self) -> bool {
        self.mode == Mode::HostFilter
    }

    /// (clean, in use, leaking, unknown) over every GPU of every host.
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let StateCounts {
            clean,
            in_use,
            leak,
            unknown,
        } = self.store.counts();
        (clean, in_use, leak, unknown)
    }

    /// Whether what is shown is (partly) the simulated cluster: the demo itself, or a host whose readings
    /// say they are simulated (a demo serve read over HTTP).
    pub fn simulated(&self) -> bool {
        self.cfg.demo || self.store.simulated()
    }

    pub fn set_status(&mut self, msg: impl Into<String>, level: Level) {
        self.view.status = Some((msg.into(), level));
        self.view.status_at_ms = (self.view.now_ms > 0).then_some(self.view.now_ms);
    }

    pub fn label(&self, h: HostId) -> String {
        self.store.label(h)
    }

    /// The protection rule of a host, and whether it is read-only, for dialogs to consult.
    pub fn protected(&self, h: HostId) -> Protected {
        self.store
            .hosts
            .get(h.0)
            .map_or_else(Protected::remote, |v| v.protected.clone())
    }

    /// Add an event of the TUI's own (a watch completed) to the timeline.
    pub(super) fn record(&mut self, host: HostId, what: crate::core::event::EventKind) {
        let e = Event {
            at_ms: self.view.now_ms,
            host: self.label(host),
            what,
        };
        self.keep(e);
    }

    fn keep(&mut self, e: Event) {
        self.store.keep(e);
        // A scrolled-back timeline stays on the rows it shows.
        if let Mode::Timeline { scroll } = &mut self.mode
            && *scroll > 0
        {
            *scroll += 1;
        }
    }

    /// Whether a host has said nothing usable for longer than the connect timeout.
    pub fn silent_too_long(&self, h: &HostView) -> bool {
        h.snap.is_none()
            && matches!(h.status, ConnStatus::Connecting)
            && self.view.started_ms.is_some_and(|t| {
                self.view.now_ms.saturating_sub(t) >= millis(self.cfg.connect_timeout)
            })
    }

    pub fn update(&mut self, action: Action) -> Vec<Effect> {
        let unseen = match &action {
            Action::Tick(_) => true,
            Action::Update(i, Judgement::Same { .. }) => !self.fresh_shows(*i),
            _ => false,
        };
        if !unseen {
            self.changes = self.changes.wrapping_add(1);
        }
        let mut effects = self.dispatch(action);
        if self.rows_host != Some(self.view.sel.host) {
            self.rebuild_rows();
        }
        effects.extend(self.store.take_unsaved().into_iter().map(Effect::Log));
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
        self.store.hosts.get(i.0).is_some_and(|h| {
            h.snap.is_some()
                && (i.0 == self.view.sel.host || matches!(h.status, ConnStatus::Stale { .. }))
        })
    }

    fn dispatch(&mut self, action: Action) -> Vec<Effect> {
        match action {
            Action::Update(i, Judgement::New(judged)) => {
                self.store.reading(i, *judged);
                if i.0 == self.view.sel.host {
                    self.rebuild_rows();
                }
                let effects = self.observe(i);
                self.clamp();
                effects
            }
            Action::Update(i, Judgement::Memory(memory)) => {
                if !self.store.memory(i, *memory) {
                    return vec![Effect::Whole(i)];
                }
                if i.0 == self.view.sel.host {
                    self.rebuild_rows();
                }
                let effects = self.observe(i);
                self.clamp();
                effects
            }
            Action::Update(
                i,
                Judgement::Same {
                    taken_at_ms,
                    gauges,
                },
            ) => {
                self.store.fresh(i, taken_at_ms, &gauges);
                // A reading that says the same is still a reading: a watch of this host takes it.
                if self.rewatch.as_ref().is_some_and(|rw| rw.watch.watches(i)) {
                    return self.observe(i);
                }
                vec![]
            }
            Action::Events(_, events) => {
                for e in events {
                    self.keep(e);
                }
                vec![]
            }
            Action::Answer(i, id, answer) => self.on_answer(i, id, &answer),
            Action::Status(i, st) => {
                self.on_status(i, st);
                vec![]
            }
            Action::Opened(i, spec, read_only) => {
                if let Some(h) = self.store.hosts.get_mut(i.0) {
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
            Action::Key(k) => super::modes::key(self, k),
            other => {
                self.on_view(&other);
                vec![]
            }
        }
    }

    /// The clock, the terminal's size and the mouse.
    fn on_view(&mut self, action: &Action) {
        match *action {
            Action::Tick(now) => {
                self.view.now_ms = now;
                self.view.started_ms.get_or_insert(now);
                // A status message is said for a while, then the key hints come back (a message said
                // before the first tick counts from it).
                if self.view.status.is_some() {
                    let at = *self.view.status_at_ms.get_or_insert(now);
                    if now.saturating_sub(at) >= STATUS_FOR_MS {
                        self.view.status = None;
                        self.view.status_at_ms = None;
                    }
                }
            }
            Action::Resize(w, h) => self.view.size = (w, h),
            Action::Click { panel, row } => self.on_click(panel, row),
            Action::Scroll(d) => self.move_sel(d),
            _ => {}
        }
    }

    fn on_status(&mut self, i: HostId, st: ConnStatus) {
        self.unreadable(i, &st);
        if let ConnStatus::Down(e) = &st {
            let msg = format!("{}: {e}", self.label(i));
            self.set_status(msg, Level::Bad);
        }
        self.store.status(i, st);
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

    /// A number for a request, remembered with what it is.
    pub(super) fn take_id(&mut self, what: String) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.pending.insert(id, what);
        id
    }

    pub(super) fn clamp(&mut self) {
        let gpus = self.snap().map_or(0, |s| s.gpus.len());
        let procs = self.process_rows().len();
        let finds = self.snap().map_or(0, |s| s.findings.len());
        let sel = &mut self.view.sel;
        sel.gpu = sel.gpu.min(gpus.saturating_sub(1));
        sel.proc = sel.proc.min(procs.saturating_sub(1));
        sel.finding = sel.finding.min(finds.saturating_sub(1));
    }

    pub(super) fn move_sel(&mut self, d: i64) {
        let mv = |v: &mut usize, n: usize| {
            let last = n.saturating_sub(1);
            *v = if d < 0 {
                v.saturating_sub(usize::try_from(d.unsigned_abs()).unwrap_or(usize::MAX))
            } else {
                v.saturating_add(usize::try_from(d).unwrap_or(usize::MAX))
                    .min(last)
            };
        };
        if self.view.sel.focus == Panel::Hosts {
            // Along the hosts the filter shows.
            let shown = self.shown_hosts();
            let mut at = shown
                .iter()
                .position(|&i| i == self.view.sel.host)
                .unwrap_or(0);
            mv(&mut at, shown.len());
            if let Some(&i) = shown.get(at) {
                self.select_host(i);
            }
            return;
        }
        let n = match self.view.sel.focus {
            Panel::Hosts => self.store.hosts.len(),
            Panel::Gpus => self.snap().map_or(0, |s| s.gpus.len()),
            Panel::Processes => self.process_rows().len(),
            Panel::Findings => self.snap().map_or(0, |s| s.findings.len()),
        };
        let sel = &mut self.view.sel;
        match sel.focus {
            Panel::Hosts => {}
            Panel::Gpus => mv(&mut sel.gpu, n),
            Panel::Processes => mv(&mut sel.proc, n),
            Panel::Findings => mv(&mut sel.finding, n),
        }
    }

    fn on_click(&mut self, panel: Panel, row: usize) {
        let shown = if panel == Panel::Hosts {
            self.shown_hosts()
        } else {
            Vec::new()
        };
        let sel = &mut self.view.sel;
        sel.focus = panel;
        match panel {
            Panel::Hosts => {
                if let Some(&i) = shown.get(row) {
                    sel.host = i;
                }
            }
            Panel::Gpus => sel.gpu = row,
            Panel::Processes => sel.proc = row,
            Panel::Findings => sel.finding = row,
        }
        self.clamp();
    }

    /// The process panel's rows for the selected host (cached: built when its reading arrives).
    pub fn process_rows(&self) -> &[ProcRow] {
        if self.rows_host == Some(self.view.sel.host) {
            &self.rows
        } else {
            &[]
        }
    }

    /// Rebuild the selected host's rows (the filter, sort or tree changed, or another host was chosen).
    pub(super) fn rebuild_rows(&mut self) {
        self.rows = self
            .snap()
            .map(|s| build_rows(s, &self.view.procs))
            .unwrap_or_default();
        self.rows_host = Some(self.view.sel.host);
    }

    /// Hosts without a usable reading now: down, or silent past the connect timeout.
    pub fn down_count(&self) -> usize {
        self.store
            .hosts
            .iter()
            .filter(|h| matches!(h.status, ConnStatus::Down(_)) || self.silent_too_long(h))
            .count()
    }

    /// Findings worth a glance in the header: leaks on any host.
    pub fn leak_count(&self) -> usize {
        self.store.leaks()
    }

    /// Jobs hung alive, over every host (the header says so: no GPU leaks, yet nothing progresses).
    pub fn hung_count(&self) -> usize {
        self.store
            .hosts
            .iter()
            .filter_map(|h| h.snap.as_ref())
            .flat_map(|s| s.jobs.iter())
            .filter(|j| j.phase == crate::core::job::Phase::Hung)
            .count()
    }
}
