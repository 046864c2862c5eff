//! The event loop: terminal events, host events and a clock feed `App::update`; effects go to the fleet;
//! the screen is drawn only when something changed, at most every 16 ms. The terminal is restored on every
//! way out: normal quit, error, panic (ratatui's hook, chained) and SIGTERM/SIGHUP.

use std::io::stdout;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use crossterm::event::{
    DisableMouseCapture, EnableMouseCapture, Event, EventStream, KeyEventKind, MouseButton,
    MouseEvent, MouseEventKind,
};
use crossterm::execute;
use futures::StreamExt;
use tokio::signal::unix::{SignalKind, signal};

use super::app::{Action, App, Effect, Panel};
use super::keymap::Keymap;
use super::view;
use crate::core::host::HostSpec;
use crate::core::model::now_ms;
use crate::runtime::eventlog::EventLog;
use crate::runtime::fleet::protected_for;
use crate::runtime::{Fleet, HostEvent, Judgement, Settings};

const FRAME: Duration = Duration::from_millis(16);
/// Readings alone redraw at most this often (keys redraw within a frame): with many hosts each sending a
/// reading a second, drawing each one would cost more than everything else. It is also the longest a stream
/// of readings may keep the screen from being drawn.
const DATA_FRAME: Duration = Duration::from_millis(100);
/// The longest one batch of queued readings is taken before the loop draws and reads keys again.
const DRAIN: Duration = Duration::from_millis(20);

/// The app as the binary starts it (also used by tests over the demo cluster).
pub fn new_app(s: &Settings, labels: Vec<String>, specs: &[HostSpec]) -> anyhow::Result<App> {
    let keymap = Keymap::with_overrides(&s.config.keys).map_err(|e| anyhow!("config: {e}"))?;
    let color = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let mut app = App::new(labels, s.fleet.interval, keymap, s.fleet.analyze, color);
    app.cfg.demo = s.demo;
    app.cfg.readonly = s.readonly;
    app.cfg.connect_timeout = s.connect_timeout;
    for (h, spec) in app.store.hosts.iter_mut().zip(specs) {
        h.protected = protected_for(Some(spec));
        h.read_only = spec.read_only();
    }
    Ok(app)
}

pub fn action_of(ev: HostEvent) -> Action {
    match ev {
        HostEvent::Update { host, update } => Action::Update(host, update),
        HostEvent::Events { host, events } => Action::Events(host, events),
        HostEvent::Answer { host, id, answer } => Action::Answer(host, id, answer),
        HostEvent::Status { host, status } => Action::Status(host, status),
    }
}

/// Carry out the app's effects. Returns whether one asks for a draw now. An event that cannot be written to
/// the events file ends the TUI with that error: a record with holes would mislead.
fn apply(
    fleet: &mut Fleet,
    app: &mut App,
    log: &mut Option<EventLog>,
    effects: Vec<Effect>,
) -> anyhow::Result<bool> {
    let mut now = false;
    let mut queue: std::collections::VecDeque<Effect> = effects.into();
    while let Some(e) = queue.pop_front() {
        match e {
            Effect::Send(h, c) => fleet.send(h, c),
            Effect::Broadcast(c) => fleet.broadcast(&c),
            Effect::OpenLive(h, url) => {
                let action = match fleet.open_live(h, &url) {
                    Ok(spec) => Action::Opened(h, spec.as_typed(), spec.read_only()),
                    Err(e) => Action::OpenFailed(h, e.to_string()),
                };
                queue.extend(app.update(action));
            }
            Effect::Log(ev) => {
                if let Some(l) = log {
                    l.write(&ev).map_err(|e| anyhow!(e))?;
                }
            }
            Effect::DrawNow => now = true,
            Effect::Whole(h) => {
                if let Some(j) = fleet.latest(h) {
                    queue.extend(app.update(Action::Update(h, Judgement::New(Box::new(j)))));
                }
            }
        }
    }
    Ok(now)
}

/// What a mouse event means, given where the panels are: the event loop owns the layout, the app gets an
/// action. Rows start one line below a panel's top border (two where a header row follows).
pub fn mouse_action(app: &App, m: &MouseEvent) -> Option<Action> {
    let areas = view::layout(
        ratatui::layout::Rect::new(0, 0, app.view.size.0, app.view.size.1),
        app,
    );
    let inside = |r: ratatui::layout::Rect| {
        m.column >= r.x && m.column < r.x + r.width && m.row >= r.y && m.row < r.y + r.height
    };
    match m.kind {
        MouseEventKind::ScrollDown => Some(Action::Scroll(1)),
        MouseEventKind::ScrollUp => Some(Action::Scroll(-1)),
        MouseEventKind::Down(MouseButton::Left) => {
            let (panel, area, header) = [
                (Panel::Hosts, areas.hosts, 1),
                (Panel::Gpus, areas.gpus, 2),
                (Panel::Processes, areas.procs, 2),
                (Panel::Findings, areas.findings, 1),
            ]
            .into_iter()
            .find(|(_, a, _)| inside(*a))?;
            let row = usize::from(m.row.saturating_sub(area.y + header));
            Some(Action::Click { panel, row })
        }
        _ => None,
    }
}

/// With no hosts named and no NVIDIA kernel driver here, the TUI shows the demo cluster (and says so) rather than an
/// empty screen; `--local` keeps this host.
fn demo_fallback(s: &Settings) -> Option<(Settings, String)> {
    if s.demo || s.hosts_given || s.local || s.specs != [HostSpec::Local] {
        return None;
    }
    // The kernel driver's presence answers the question without loading NVML here (the local source loads it
    // anyway, and a second load costs a driver attach).
    if std::path::Path::new("/proc/driver/nvidia/version").exists() {
        return None;
    }
    let why = "no NVIDIA driver on this host";
    let mut d = s.clone();
    d.demo = true;
    d.specs = crate::source::demo::DEMO_HOSTS
        .iter()
        .map(|h| HostSpec::Demo((*h).to_string()))
        .collect();
    Some((
        d,
        format!(
            "{why}: showing the simulated demo cluster (--local watches this host, --hosts others)"
        ),
    ))
}

pub fn run(s: &Settings) -> anyhow::Result<i32> {
    let fallback = demo_fallback(s);
    let (s, note) = match &fallback {
        Some((d, note)) => (d, Some(note.clone())),
        None => (s, None),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("async runtime")?;
    let mut log = s
        .events
        .as_deref()
        .map(EventLog::open)
        .transpose()
        .map_err(|e| anyhow!(e))?;
    let res = rt.block_on(async {
        // The TUI writes the file itself, its own events (a watch's scope turning clean) among the hosts'.
        // It holds every host's reading: one that moved only its memory comes as that.
        let opts = crate::runtime::FleetOptions {
            events_file: None,
            memory_alone: true,
            quick_first_view: true,
            ..s.fleet.clone()
        };
        // A `prom:` fleet is what its server names now, asked before the screen is taken: say so, and give a
        // busy server time (a large fleet's first answer takes longer than a connection may).
        let discovery = DISCOVERY.max(opts.ssh.connect_timeout);
        for spec in &s.specs {
            if let HostSpec::Prom(p) = spec {
                eprintln!(
                    "gpusweep: asking Prometheus {} which hosts it knows (up to {} s)...",
                    p.url,
                    discovery.as_secs()
                );
            }
        }
        let mut fleet = Fleet::start_discovering_within(&s.specs, &opts, discovery).await?;
        let specs: Vec<HostSpec> = fleet.ids().filter_map(|i| fleet.spec(i).cloned()).collect();
        let mut app = new_app(s, fleet.labels().to_vec(), &specs)?;
        if let Some(n) = note {
            app.set_status(n, crate::tui::app::Level::Info);
        }
        let mut terminal = ratatui::init();
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let _ = execute!(stdout(), DisableMouseCapture);
            prev(info);
        }));
        let _ = execute!(stdout(), EnableMouseCapture);
        let r = event_loop(&mut terminal, &mut fleet, &mut app, &mut log).await;
        let _ = execute!(stdout(), DisableMouseCapture);
        ratatui::restore();
        r
    });
    rt.shutdown_background();
    res
}

/// How long the TUI waits for a `prom:` server to say which hosts it knows, at least: 10,000 hosts on a busy
/// server took 6-36 s (docs/validation.md).
const DISCOVERY: Duration = Duration::from_secs(120);

/// An instant `d` ago (or now, on a clock too young for it).
fn ago(d: Duration) -> Instant {
    Instant::now().checked_sub(d).unwrap_or_else(Instant::now)
}

/// One event and what else is queued, taken before drawing once, but never so long that keys and the screen
/// wait.
fn take_batch(fleet: &mut Fleet, app: &mut App, first: HostEvent) -> Vec<Effect> {
    let mut effects = app.update(action_of(first));
    let until = Instant::now() + DRAIN;
    // The clock is read every few events, not each (a thousand of a 10,000-host fleet's events each batch).
    for taken in 1u32.. {
        if taken % CLOCK_EVERY == 0 && Instant::now() >= until {
            break;
        }
        let Some(ev) = fleet.try_recv() else { break };
        effects.extend(app.update(action_of(ev)));
    }
    effects
}

/// How many queued events are taken between two looks at the clock: a few microseconds' work, against the
/// 20 ms a batch may take.
const CLOCK_EVERY: u32 = 16;

async fn event_loop(
    terminal: &mut ratatui::DefaultTerminal,
    fleet: &mut Fleet,
    app: &mut App,
    log: &mut Option<EventLog>,
) -> anyhow::Result<i32> {
    let mut events = EventStream::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    if let Ok(sz) = terminal.size() {
        app.update(Action::Resize(sz.width, sz.height));
    }
    let first = app.update(Action::Tick(now_ms()));
    apply(fleet, app, log, first)?;
    let mut dirty = true;
    // Only readings changed since the last draw (no key, resize or tick).
    let mut data_only = false;
    let mut last_draw = ago(FRAME);
    // A completed watch is drawn at once, whatever the throttle.
    let mut urgent = false;
    let mut next_tick = Instant::now();
    let mut last_take = ago(DATA_FRAME);
    loop {
        let gap = if data_only && app.rewatch().is_none() && !urgent {
            DATA_FRAME
        } else {
            FRAME
        };
        if dirty && (urgent || last_draw.elapsed() >= gap) {
            terminal.draw(|f| view::render(app, f))?;
            dirty = false;
            data_only = false;
            urgent = false;
            last_draw = Instant::now();
        }
        let tick_wait = next_tick.saturating_duration_since(Instant::now());
        // Readings are taken in batches, one per DATA_FRAME at most: in between they wait in their hosts'
        // slots, where a newer one replaces an older one with no wake-up, so a thousand hosts cost the loop
        // ten wake-ups a second, not a thousand. A watch takes them as they come (its times need that).
        let hold_until =
            Some(last_take + DATA_FRAME).filter(|t| app.rewatch().is_none() && *t > Instant::now());
        let hold = hold_until.is_some();
        // Up to the next frame to draw, or the end of the hold.
        let frame_wait = [dirty.then(|| last_draw + gap), hold_until]
            .into_iter()
            .flatten()
            .min()
            .map_or(Duration::from_secs(3600), |t| {
                t.saturating_duration_since(Instant::now())
            });
        let mut effects = Vec::new();
        // Every event is handled at the time it arrives: elapsed times (re-watch) need that precision.
        let stamp = |app: &mut App| {
            app.update(Action::Tick(now_ms()));
        };
        tokio::select! {
            ev = events.next() => match ev {
                Some(Ok(Event::Key(k))) if k.kind != KeyEventKind::Release => { stamp(app); effects = app.update(Action::Key(k)); dirty = true; data_only = false; }
                Some(Ok(Event::Mouse(m))) => { if let Some(a) = mouse_action(app, &m) { effects = app.update(a); } dirty = true; data_only = false; }
                Some(Ok(Event::Resize(w, h))) => { app.update(Action::Resize(w, h)); dirty = true; data_only = false; }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(anyhow!("terminal: {e}")),
                None => return Ok(0),
            },
            ev = fleet.recv(), if !hold => {
                let Some(ev) = ev else { return Ok(0) };
                stamp(app);
                let before = app.changes();
                effects = take_batch(fleet, app, ev);
                last_take = Instant::now();
                // Fresh readings of hosts not on screen change nothing drawn: no frame for them.
                if app.changes() != before {
                    data_only = !dirty || data_only;
                    dirty = true;
                }
            },
            () = tokio::time::sleep(tick_wait) => {
                effects = app.update(Action::Tick(now_ms()));
                let period = if app.rewatch().is_some() { crate::runtime::FAST_POLL } else { Duration::from_secs(1) };
                next_tick = Instant::now() + period;
                dirty = true;
                data_only = false;
            },
            () = tokio::time::sleep(frame_wait) => {},
            // Ended by a signal: 128 + its number, as shells report it.
            _ = term.recv() => return Ok(128 + libc::SIGTERM),
            _ = hup.recv() => return Ok(128 + libc::SIGHUP),
        }
        urgent |= apply(fleet, app, log, effects)?;
        if app.view.quit {
            return Ok(0);
        }
    }
}
