//! TUI state. It changes only through `update(Action)`, which does no I/O: what must happen outside (signal a
//! host, change its poll interval) comes back as `Effect`s for the event loop to carry out.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, MouseButton, MouseEvent, MouseEventKind};

use crate::analyze::{AnalyzeOptions, GpuState, gpu_state};
use crate::collect::{ConnStatus, HostCmd};
use crate::model::{FindingKind, HostSnapshot, MIB, Severity};
use crate::smem::{Dtype, Tile};
use crate::sweep::{self, Fate, Outcome, Plan, Sig, TargetInfo};
use crate::tui::keymap::{Cmd, Keymap};
use crate::watch::{Scope, Watch};

/// Samples of memory history kept per GPU (10 minutes at a 1 s poll).
pub const HISTORY: usize = 600;
/// Grace between TERM and KILL for sweeps started from the TUI.
pub const TUI_GRACE: Duration = Duration::from_secs(10);
/// Polling while re-watching.
pub const REWATCH_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Debug, Clone)]
pub enum Action {
    Snapshot(usize, Box<HostSnapshot>),
    Status(usize, ConnStatus),
    Outcomes(usize, u64, Vec<Outcome>),
    Key(KeyEvent),
    Mouse(MouseEvent),
    Resize(u16, u16),
    /// Wall-clock time in Unix milliseconds: ages and elapsed times are computed from it.
    Tick(u64),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    Send(usize, HostCmd),
    Broadcast(HostCmd),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Panel {
    Hosts,
    Gpus,
    Processes,
    Findings,
}

impl Panel {
    const ORDER: [Panel; 4] = [Panel::Hosts, Panel::Gpus, Panel::Processes, Panel::Findings];
    fn step(self, d: i32) -> Panel {
        let i = Self::ORDER.iter().position(|p| *p == self).unwrap_or(0) as i32;
        Self::ORDER[(i + d).rem_euclid(4) as usize]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    Memory,
    Pid,
    Age,
    User,
}

impl SortKey {
    pub fn name(self) -> &'static str {
        match self {
            SortKey::Memory => "memory",
            SortKey::Pid => "pid",
            SortKey::Age => "age",
            SortKey::User => "user",
        }
    }
    fn next(self) -> SortKey {
        match self {
            SortKey::Memory => SortKey::Pid,
            SortKey::Pid => SortKey::Age,
            SortKey::Age => SortKey::User,
            SortKey::User => SortKey::Memory,
        }
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
        host: usize,
        target: TargetInfo,
        user: Option<String>,
        signal: Sig,
    },
    Sweep {
        scope: SweepScope,
        host: usize,
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
    /// Per GPU index, used MiB over time.
    pub history: HashMap<u32, VecDeque<u64>>,
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
    pub selected_host: usize,
    pub focus: Panel,
    pub gpu_sel: usize,
    pub proc_sel: usize,
    pub finding_sel: usize,
    pub tree: bool,
    pub filter: String,
    pub filter_editing: bool,
    pub sort: SortKey,
    pub dialog: Option<Dialog>,
    pub smem_open: bool,
    pub smem: SmemForm,
    pub status: Option<(String, Level)>,
    pub rewatch: Option<Rewatch>,
    pub banner: Option<String>,
    pub last_sweep_ms: Option<u64>,
    pub interval: Duration,
    pub now_ms: u64,
    pub size: (u16, u16),
    pub quit: bool,
    pub color: bool,
    pub keymap: Keymap,
    pub analyze: AnalyzeOptions,
    /// PIDs never offered for signals on the local host (PID 1, us, our ancestors), by host index.
    pub protected: HashMap<usize, HashSet<u32>>,
    next_id: u64,
    pending: HashMap<u64, String>,
}

/// One row of the process panel.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcRow {
    pub pid: u32,
    pub user: String,
    pub state: char,
    pub ppid: Option<u32>,
    pub gpus: Vec<u32>,
    pub bytes: Option<u64>,
    pub started_at: Option<u64>,
    pub cmd: String,
    pub marks: Vec<&'static str>,
    pub depth: usize,
    pub start_time: Option<u64>,
    /// A dead PID: shown, never signalled.
    pub ghost: bool,
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
                })
                .collect(),
            selected_host: 0,
            focus: Panel::Hosts,
            gpu_sel: 0,
            proc_sel: 0,
            finding_sel: 0,
            tree: false,
            filter: String::new(),
            filter_editing: false,
            sort: SortKey::Memory,
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
            interval,
            now_ms: 0,
            size: (80, 24),
            quit: false,
            color,
            keymap,
            analyze,
            protected: HashMap::new(),
            next_id: 1,
            pending: HashMap::new(),
        }
    }

    pub fn host(&self) -> Option<&HostView> {
        self.hosts.get(self.selected_host)
    }

    pub fn snap(&self) -> Option<&HostSnapshot> {
        self.host().and_then(|h| h.snap.as_ref())
    }

    /// (clean, in use, leaking, unknown) over every GPU of every host.
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let mut c = (0, 0, 0, 0);
        for h in &self.hosts {
            let Some(s) = &h.snap else { continue };
            for g in &s.gpus {
                match gpu_state(s, g, &self.analyze) {
                    GpuState::Clean => c.0 += 1,
                    GpuState::InUse => c.1 += 1,
                    GpuState::Leak => c.2 += 1,
                    GpuState::Unknown | GpuState::Error => c.3 += 1,
                }
            }
        }
        c
    }

    fn set_status(&mut self, msg: impl Into<String>, level: Level) {
        self.status = Some((msg.into(), level));
    }

    pub fn update(&mut self, action: Action) -> Vec<Effect> {
        match action {
            Action::Snapshot(i, snap) => self.on_snapshot(i, *snap),
            Action::Status(i, st) => {
                if let Some(h) = self.hosts.get_mut(i) {
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
            Action::Outcomes(i, id, outs) => {
                let what = self.pending.remove(&id).unwrap_or_else(|| "signal".into());
                let label = self
                    .hosts
                    .get(i)
                    .map(|h| h.label.clone())
                    .unwrap_or_default();
                let bad = outs
                    .iter()
                    .filter(|o| {
                        matches!(
                            o.fate,
                            Fate::Refused { .. } | Fate::Failed { .. } | Fate::Survived
                        )
                    })
                    .count();
                let text: Vec<String> = outs.iter().map(|o| o.describe()).collect();
                let level = if bad > 0 { Level::Bad } else { Level::Good };
                self.set_status(format!("{what} on {label}: {}", text.join("; ")), level);
                vec![]
            }
            Action::Tick(now) => {
                self.now_ms = now;
                vec![]
            }
            Action::Resize(w, h) => {
                self.size = (w, h);
                vec![]
            }
            Action::Mouse(m) => {
                self.on_mouse(m);
                vec![]
            }
            Action::Key(k) => self.on_key(k),
        }
    }

    fn on_snapshot(&mut self, i: usize, snap: HostSnapshot) -> Vec<Effect> {
        let Some(h) = self.hosts.get_mut(i) else {
            return vec![];
        };
        for g in &snap.gpus {
            if let Some(used) = g.memory.used {
                let hist = h.history.entry(g.index).or_default();
                hist.push_back(used / MIB);
                while hist.len() > HISTORY {
                    hist.pop_front();
                }
            }
        }
        h.last_seen_ms = Some(snap.taken_at_ms);
        h.status = ConnStatus::Up;
        h.snap = Some(snap);
        let mut effects = vec![];
        if let Some(rw) = &mut self.rewatch {
            let Some(s) = &self.hosts[i].snap else {
                return effects;
            };
            let elapsed = self.now_ms;
            if rw.watch.observe(s, elapsed) {
                let took = rw.watch.took_ms().unwrap_or(0);
                let n: usize = rw
                    .watch
                    .expected
                    .iter()
                    .filter_map(|l| self.hosts.iter().find(|h| &h.label == l))
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
                    crate::watch::fmt_ms(took)
                ));
                self.rewatch = None;
                effects.push(Effect::Broadcast(HostCmd::Interval(self.interval)));
            }
        }
        self.clamp();
        effects
    }

    fn clamp(&mut self) {
        let gpus = self.snap().map(|s| s.gpus.len()).unwrap_or(0);
        let procs = self.process_rows().len();
        let finds = self.snap().map(|s| s.findings.len()).unwrap_or(0);
        self.gpu_sel = self.gpu_sel.min(gpus.saturating_sub(1));
        self.proc_sel = self.proc_sel.min(procs.saturating_sub(1));
        self.finding_sel = self.finding_sel.min(finds.saturating_sub(1));
    }

    fn on_key(&mut self, k: KeyEvent) -> Vec<Effect> {
        if self.filter_editing {
            match k.code {
                KeyCode::Enter => self.filter_editing = false,
                KeyCode::Esc => {
                    self.filter.clear();
                    self.filter_editing = false;
                }
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) if self.filter.len() < 64 => self.filter.push(c),
                _ => {}
            }
            self.proc_sel = 0;
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
                    self.smem.tile.push(c)
                }
                _ => {}
            }
            return vec![];
        }
        if let Some(d) = self.dialog.clone() {
            return self.on_dialog_key(d, k);
        }
        let cmd = self.keymap.lookup(&k);
        if self.smem_open {
            match (cmd, k.code) {
                (Some(Cmd::Quit), _) => self.quit = true,
                (Some(Cmd::Back) | Some(Cmd::Smem), _) => self.smem_open = false,
                (_, KeyCode::Char('e')) | (_, KeyCode::Enter) => self.smem.editing = true,
                (_, KeyCode::Char('d')) => {
                    self.smem.dtype_idx = (self.smem.dtype_idx + 1) % DTYPES.len()
                }
                (_, KeyCode::Char('+')) => self.smem.stages = (self.smem.stages + 1).min(16),
                (_, KeyCode::Char('-')) => {
                    self.smem.stages = self.smem.stages.saturating_sub(1).max(1)
                }
                (Some(Cmd::Up), _) => self.move_sel(-1),
                (Some(Cmd::Down), _) => self.move_sel(1),
                (Some(Cmd::Help), _) => self.dialog = Some(Dialog::Help),
                _ => {}
            }
            return vec![];
        }
        match cmd {
            Some(Cmd::Quit) => self.quit = true,
            Some(Cmd::Up) => self.move_sel(-1),
            Some(Cmd::Down) => self.move_sel(1),
            Some(Cmd::NextPanel) => self.focus = self.focus.step(1),
            Some(Cmd::PrevPanel) => self.focus = self.focus.step(-1),
            Some(Cmd::Open) if self.focus == Panel::Hosts => self.focus = Panel::Gpus,
            Some(Cmd::Open) => {}
            Some(Cmd::Back) => {
                if self.banner.is_some() {
                    self.banner = None;
                } else if !self.filter.is_empty() {
                    self.filter.clear();
                } else {
                    self.focus = Panel::Hosts;
                }
            }
            Some(Cmd::Kill) => self.open_kill(),
            Some(Cmd::Sweep) => self.open_sweep(),
            Some(Cmd::Rewatch) => return self.toggle_rewatch(),
            Some(Cmd::Filter) => {
                self.filter_editing = true;
                self.focus = Panel::Processes;
            }
            Some(Cmd::Sort) => self.sort = self.sort.next(),
            Some(Cmd::Refresh) => {
                self.set_status("refreshing", Level::Info);
                return vec![Effect::Broadcast(HostCmd::PollNow)];
            }
            Some(Cmd::Smem) => self.smem_open = true,
            Some(Cmd::Help) => self.dialog = Some(Dialog::Help),
            Some(Cmd::Tree) => self.tree = !self.tree,
            None => {}
        }
        vec![]
    }

    fn move_sel(&mut self, d: i64) {
        let mv = |v: &mut usize, n: usize| {
            if n == 0 {
                *v = 0;
            } else {
                *v = (*v as i64 + d).clamp(0, n as i64 - 1) as usize;
            }
        };
        match self.focus {
            Panel::Hosts => {
                let before = self.selected_host;
                mv(&mut self.selected_host, self.hosts.len());
                if before != self.selected_host {
                    self.gpu_sel = 0;
                    self.proc_sel = 0;
                    self.finding_sel = 0;
                }
            }
            Panel::Gpus => {
                let n = self.snap().map(|s| s.gpus.len()).unwrap_or(0);
                mv(&mut self.gpu_sel, n)
            }
            Panel::Processes => {
                let n = self.process_rows().len();
                mv(&mut self.proc_sel, n)
            }
            Panel::Findings => {
                let n = self.snap().map(|s| s.findings.len()).unwrap_or(0);
                mv(&mut self.finding_sel, n)
            }
        }
    }

    fn open_kill(&mut self) {
        let host = self.selected_host;
        let target_pid = match self.focus {
            Panel::Processes => self
                .process_rows()
                .get(self.proc_sel)
                .filter(|r| !r.ghost)
                .map(|r| r.pid),
            Panel::Findings => self
                .snap()
                .and_then(|s| s.findings.get(self.finding_sel))
                .and_then(|f| {
                    f.target_pid.or(if f.kind == FindingKind::Ghost {
                        None
                    } else {
                        f.pid
                    })
                }),
            _ => None,
        };
        let Some(pid) = target_pid else {
            self.set_status(
                "select a live process (Tab to the process or findings panel) to kill it",
                Level::Info,
            );
            return;
        };
        if self.protected.get(&host).is_some_and(|p| p.contains(&pid)) || pid <= 1 {
            self.set_status(
                format!(
                    "{pid} is protected: PID 1, gpusweep and its ancestors are never signalled"
                ),
                Level::Bad,
            );
            return;
        }
        let Some(p) = self.snap().and_then(|s| s.proc(pid)).cloned() else {
            self.set_status(format!("{pid} is not in the last reading"), Level::Bad);
            return;
        };
        if p.state == 'Z' {
            self.set_status(
                format!(
                    "{pid} is a zombie: killing it does nothing; kill its parent {}",
                    p.ppid
                ),
                Level::Info,
            );
            return;
        }
        self.dialog = Some(Dialog::Kill {
            host,
            target: TargetInfo {
                pid,
                start_time: p.start_time,
                cmdline: p.display_cmd(),
            },
            user: p.user.clone(),
            signal: Sig::Term,
        });
    }

    /// The plan for a scope, from the latest readings.
    pub fn plan_for(&self, scope: SweepScope, host: usize, gpu: Option<u32>) -> Plan {
        let mut plan = Plan::default();
        for (i, h) in self.hosts.iter().enumerate() {
            if scope != SweepScope::Everything && i != host {
                continue;
            }
            let Some(s) = &h.snap else { continue };
            let gpus = if scope == SweepScope::Gpu {
                gpu.map(|g| vec![g])
            } else {
                None
            };
            let empty = HashSet::from([0, 1]);
            let p = sweep::plan(s, gpus.as_deref(), self.protected.get(&i).unwrap_or(&empty));
            plan.items.extend(p.items);
            plan.skipped.extend(p.skipped);
        }
        plan
    }

    fn open_sweep(&mut self) {
        let host = self.selected_host;
        let gpu = self
            .snap()
            .and_then(|s| s.gpus.get(self.gpu_sel))
            .map(|g| g.index);
        let scope = match self.focus {
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

    fn on_dialog_key(&mut self, d: Dialog, k: KeyEvent) -> Vec<Effect> {
        let yes = matches!(k.code, KeyCode::Enter | KeyCode::Char('y'));
        let no = matches!(
            k.code,
            KeyCode::Esc | KeyCode::Char('n') | KeyCode::Char('q')
        );
        match d {
            Dialog::Help => {
                self.dialog = None;
                vec![]
            }
            Dialog::Kill {
                host,
                target,
                user,
                signal,
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
                    });
                    return vec![];
                }
                if !yes {
                    return vec![];
                }
                self.dialog = None;
                let id = self.take_id(format!("{} {}", signal.name(), target.pid));
                let grace = (signal == Sig::Term).then_some(TUI_GRACE.as_millis() as u64);
                self.set_status(
                    format!("sending {} to {}…", signal.name(), target.pid),
                    Level::Info,
                );
                vec![Effect::Send(
                    host,
                    HostCmd::Signal {
                        id,
                        req: sweep::SignalRequest {
                            targets: vec![target],
                            signal,
                            grace_ms: grace,
                        },
                    },
                )]
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
        host: usize,
        gpu: Option<u32>,
        plan: &Plan,
    ) -> Vec<Effect> {
        let mut effects = Vec::new();
        for label in plan.hosts() {
            let Some(i) = self.hosts.iter().position(|h| h.label == label) else {
                continue;
            };
            let id = self.take_id("sweep".into());
            effects.push(Effect::Send(
                i,
                HostCmd::Signal {
                    id,
                    req: plan.request(&label, Sig::Term, Some(TUI_GRACE.as_millis() as u64)),
                },
            ));
        }
        self.last_sweep_ms = Some(self.now_ms);
        let (expected, label, scope_gpus) = match scope {
            SweepScope::Everything => (
                self.hosts.iter().map(|h| h.label.clone()).collect(),
                "every host".to_string(),
                None,
            ),
            SweepScope::Host => {
                let l = self.hosts[host].label.clone();
                (vec![l.clone()], l, None)
            }
            SweepScope::Gpu => {
                let l = self.hosts[host].label.clone();
                (
                    vec![l.clone()],
                    format!("{l} GPU {}", gpu.unwrap_or(0)),
                    gpu.map(|g| vec![g]),
                )
            }
        };
        if plan.items.is_empty() {
            self.set_status("nothing to signal; watching until clean", Level::Info);
        } else {
            self.set_status(
                format!("sweeping: {}", sweep::plan_summary(plan)),
                Level::Info,
            );
        }
        self.rewatch = Some(Rewatch {
            watch: Watch::new(
                expected,
                Scope { gpus: scope_gpus },
                self.analyze.tolerance,
                self.now_ms,
            ),
            label,
        });
        self.banner = None;
        effects.push(Effect::Broadcast(HostCmd::Interval(REWATCH_INTERVAL)));
        effects
    }

    fn toggle_rewatch(&mut self) -> Vec<Effect> {
        if self.rewatch.take().is_some() {
            self.set_status("re-watch stopped", Level::Info);
            return vec![Effect::Broadcast(HostCmd::Interval(self.interval))];
        }
        let expected: Vec<String> = self.hosts.iter().map(|h| h.label.clone()).collect();
        self.rewatch = Some(Rewatch {
            watch: Watch::new(
                expected,
                Scope::default(),
                self.analyze.tolerance,
                self.now_ms,
            ),
            label: "every host".into(),
        });
        self.banner = None;
        vec![
            Effect::Broadcast(HostCmd::Interval(REWATCH_INTERVAL)),
            Effect::Broadcast(HostCmd::PollNow),
        ]
    }

    fn on_mouse(&mut self, m: MouseEvent) {
        let areas = crate::tui::view::layout(
            ratatui::layout::Rect::new(0, 0, self.size.0, self.size.1),
            self,
        );
        let inside = |r: ratatui::layout::Rect| {
            m.column >= r.x && m.column < r.x + r.width && m.row >= r.y && m.row < r.y + r.height
        };
        match m.kind {
            MouseEventKind::ScrollDown => self.move_sel(1),
            MouseEventKind::ScrollUp => self.move_sel(-1),
            MouseEventKind::Down(MouseButton::Left) => {
                // Rows start one line below a panel's top border (two where a header row follows).
                if inside(areas.hosts) {
                    self.focus = Panel::Hosts;
                    let row = m.row.saturating_sub(areas.hosts.y + 1) as usize;
                    if row < self.hosts.len() {
                        self.selected_host = row;
                    }
                } else if inside(areas.gpus) {
                    self.focus = Panel::Gpus;
                    let row = m.row.saturating_sub(areas.gpus.y + 2) as usize;
                    self.gpu_sel = row;
                } else if inside(areas.procs) {
                    self.focus = Panel::Processes;
                    self.proc_sel = m.row.saturating_sub(areas.procs.y + 2) as usize;
                } else if inside(areas.findings) {
                    self.focus = Panel::Findings;
                    self.finding_sel = m.row.saturating_sub(areas.findings.y + 1) as usize;
                }
                self.clamp();
            }
            _ => {}
        }
    }

    /// The process panel's rows for the selected host: holders, listed processes, ghosts and zombies, with
    /// their marks; filtered, sorted, or as a tree.
    pub fn process_rows(&self) -> Vec<ProcRow> {
        let Some(s) = self.snap() else { return vec![] };
        let marks_for = |pid: u32| -> Vec<&'static str> {
            let mut m = Vec::new();
            for f in s.findings.iter().filter(|f| f.pid == Some(pid)) {
                let t = match f.kind {
                    FindingKind::Ghost => "ghost",
                    FindingKind::HiddenHolder => "hidden",
                    FindingKind::Orphan => "orphan",
                    FindingKind::Zombie => "zombie",
                    FindingKind::NotVisible => "other-ns",
                    _ => continue,
                };
                if !m.contains(&t) {
                    m.push(t);
                }
            }
            if s.holder(pid).is_some_and(|h| h.benign) {
                m.push("benign");
            }
            m
        };
        let charged = |pid: u32| -> Option<u64> {
            let v: Vec<u64> = s
                .gpus
                .iter()
                .flat_map(|g| g.processes.iter())
                .filter(|p| p.pid == pid)
                .filter_map(|p| p.used_bytes)
                .collect();
            if v.is_empty() {
                None
            } else {
                Some(v.iter().sum())
            }
        };
        let listed_gpus = |pid: u32| -> Vec<u32> {
            s.gpus
                .iter()
                .filter(|g| g.processes.iter().any(|p| p.pid == pid))
                .map(|g| g.index)
                .collect()
        };
        let mut rows: Vec<ProcRow> = Vec::new();
        let relevant = |pid: u32, state: char| {
            s.holder(pid).is_some() || state == 'Z' || !listed_gpus(pid).is_empty()
        };
        for p in &s.processes {
            if !self.tree && !relevant(p.pid, p.state) {
                continue;
            }
            let mut gpus = s.holder(p.pid).map(|h| h.gpus.clone()).unwrap_or_default();
            for g in listed_gpus(p.pid) {
                if !gpus.contains(&g) {
                    gpus.push(g);
                }
            }
            gpus.sort_unstable();
            rows.push(ProcRow {
                pid: p.pid,
                user: p.user.clone().unwrap_or_else(|| "N/A".into()),
                state: p.state,
                ppid: Some(p.ppid),
                gpus,
                bytes: charged(p.pid),
                started_at: p.started_at,
                cmd: p.display_cmd(),
                marks: marks_for(p.pid),
                depth: 0,
                start_time: Some(p.start_time),
                ghost: false,
            });
        }
        // Ghosts: listed PIDs with no process behind them.
        for g in &s.gpus {
            for lp in &g.processes {
                if s.proc(lp.pid).is_none() && !rows.iter().any(|r| r.pid == lp.pid) {
                    rows.push(ProcRow {
                        pid: lp.pid,
                        user: "?".into(),
                        state: '-',
                        ppid: None,
                        gpus: listed_gpus(lp.pid),
                        bytes: charged(lp.pid),
                        started_at: None,
                        cmd: "(gone: NVML still charges it)".into(),
                        marks: marks_for(lp.pid),
                        depth: 0,
                        start_time: None,
                        ghost: true,
                    });
                }
            }
        }
        if !self.filter.is_empty() {
            let f = self.filter.to_lowercase();
            rows.retain(|r| {
                r.cmd.to_lowercase().contains(&f)
                    || r.user.to_lowercase().contains(&f)
                    || r.pid.to_string().contains(&f)
                    || r.marks.iter().any(|m| m.contains(&f))
            });
        }
        match self.sort {
            SortKey::Memory => rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid))),
            SortKey::Pid => rows.sort_by_key(|r| r.pid),
            SortKey::Age => {
                rows.sort_by(|a, b| a.started_at.cmp(&b.started_at).then(a.pid.cmp(&b.pid)))
            }
            SortKey::User => rows.sort_by(|a, b| a.user.cmp(&b.user).then(a.pid.cmp(&b.pid))),
        }
        if self.tree {
            rows = as_tree(rows);
        }
        rows
    }

    /// Findings worth a glance in the header: leaks on any host.
    pub fn leak_count(&self) -> usize {
        self.hosts
            .iter()
            .filter_map(|h| h.snap.as_ref())
            .flat_map(|s| s.findings.iter())
            .filter(|f| f.severity == Severity::Leak)
            .count()
    }
}

/// Depth-first order from the roots (rows whose parent is not shown), children under their parent.
fn as_tree(rows: Vec<ProcRow>) -> Vec<ProcRow> {
    let pids: HashSet<u32> = rows.iter().map(|r| r.pid).collect();
    let mut children: HashMap<u32, Vec<usize>> = HashMap::new();
    let mut roots = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        match r.ppid {
            Some(pp) if pids.contains(&pp) && pp != r.pid => {
                children.entry(pp).or_default().push(i)
            }
            _ => roots.push(i),
        }
    }
    let mut out = Vec::with_capacity(rows.len());
    let mut stack: Vec<(usize, usize)> = roots.into_iter().rev().map(|i| (i, 0)).collect();
    let mut seen = HashSet::new();
    while let Some((i, depth)) = stack.pop() {
        if !seen.insert(i) {
            continue;
        }
        let mut r = rows[i].clone();
        r.depth = depth;
        if let Some(kids) = children.get(&r.pid) {
            for &k in kids.iter().rev() {
                stack.push((k, depth + 1));
            }
        }
        out.push(r);
    }
    out
}
