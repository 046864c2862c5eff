//! The TUI over the demo cluster: reducer tests of `update(Action)` and snapshots of every screen and dialog at
//! 80x24 and 160x48. Clocks are simulated, so every time on screen is fixed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers, MouseButton, MouseEvent, MouseEventKind};
use gpusweep::analyze::AnalyzeOptions;
use gpusweep::core::action::{ActionAnswer, ActionRequest};
use gpusweep::core::model::{GpuState, HostId, SaidGauges};
use gpusweep::core::signal::{Fate, Outcome, Protected, Sig};
use gpusweep::runtime::ledger::{Judgement, Ledger};
use gpusweep::source::demo::{DEMO_HOSTS, DemoClock, DemoHost};
use gpusweep::source::{ConnStatus, HostCmd};
use gpusweep::tui::app::{Action, App, Dialog, Effect, Panel, SweepScope};
use gpusweep::tui::keymap::Keymap;
use gpusweep::tui::modes::kill::Kill;
use gpusweep::tui::modes::sweep::Sweep;
use gpusweep::tui::run::mouse_action;
use gpusweep::tui::view;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

const BASE_MS: u64 = 1_764_669_600_000;

struct Demo {
    app: App,
    hosts: Vec<DemoHost>,
    /// Each host's ledger, as the fleet keeps them: readings are judged there, actions recorded.
    ledgers: Vec<Ledger>,
    t: Arc<AtomicU64>,
    /// Readings that moved only their memory go to the ledger as that (as a serve's stream sends them),
    /// and on to the app as that: how many did.
    memory_alone: Option<usize>,
}

impl Demo {
    /// The three demo hosts, polled once a second for `secs` seconds of warm-up.
    fn new(secs: u64) -> Demo {
        Demo::start(secs, false)
    }
    fn start(secs: u64, memory_alone: bool) -> Demo {
        let (clock, t) = DemoClock::manual(0);
        let hosts: Vec<DemoHost> = DEMO_HOSTS
            .iter()
            .map(|h| DemoHost::new(h, clock.clone()))
            .collect();
        let ledgers = DEMO_HOSTS
            .iter()
            .map(|h| {
                let mut l = Ledger::new(h, AnalyzeOptions::default());
                if memory_alone {
                    l.hand_on_memory_alone();
                }
                l
            })
            .collect();
        let app = App::new(
            DEMO_HOSTS
                .iter()
                .map(std::string::ToString::to_string)
                .collect(),
            Duration::from_secs(1),
            Keymap::default(),
            AnalyzeOptions::default(),
            false,
        );
        let mut app = app;
        // As `new_app` starts it on the demo cluster.
        app.cfg.demo = true;
        let mut d = Demo {
            app,
            hosts,
            ledgers,
            t,
            memory_alone: memory_alone.then_some(0),
        };
        for s in 0..=secs {
            d.at(s * 1000);
            d.poll();
        }
        d
    }
    fn now(&self) -> u64 {
        BASE_MS + self.t.load(Ordering::SeqCst)
    }
    fn at(&mut self, ms: u64) {
        self.t.store(ms, Ordering::SeqCst);
        self.app.update(Action::Tick(BASE_MS + ms));
    }
    /// A reading of host `i`, through its ledger to the app, as the fleet hands it on.
    fn feed(&mut self, i: usize, snap: gpusweep::core::model::HostSnapshot) -> Vec<Effect> {
        let moved = self.memory_alone.and_then(|_| {
            let last = self.ledgers[i].latest()?;
            (last.snap.diff(&snap).reading <= gpusweep::core::verdict::Moved::Memory).then(|| {
                let (used, charged) = snap.memory_numbers();
                gpusweep::core::sse::MemoryMoved {
                    host: snap.host.clone(),
                    taken_at_ms: snap.taken_at_ms,
                    used,
                    charged,
                    gauges: Some(snap.gauges()),
                    moved: None,
                    findings: None,
                }
            })
        });
        let (j, events) = match moved.and_then(|m| self.ledgers[i].memory(m)) {
            Some(judged) => judged,
            None => self.ledgers[i].reading(snap),
        };
        if let (Some(n), Judgement::Memory(_)) = (&mut self.memory_alone, &j) {
            *n += 1;
        }
        let mut eff = Vec::new();
        if !events.is_empty() {
            eff.extend(self.app.update(Action::Events(HostId(i), events)));
        }
        eff.extend(self.app.update(Action::Update(HostId(i), j)));
        eff
    }
    fn poll(&mut self) -> Vec<Effect> {
        let mut eff = Vec::new();
        for i in 0..self.hosts.len() {
            let s = self.hosts[i].snapshot();
            eff.extend(self.feed(i, s));
        }
        eff
    }
    fn key(&mut self, c: KeyCode) -> Vec<Effect> {
        self.app
            .update(Action::Key(KeyEvent::new(c, KeyModifiers::NONE)))
    }
    fn ch(&mut self, c: char) -> Vec<Effect> {
        self.key(KeyCode::Char(c))
    }
    /// An action through the host's ledger, as `Fleet::send` records it.
    fn send(&mut self, h: HostId, req: &ActionRequest) {
        let now = self.now();
        let events = self.ledgers[h.0].sent(req, now);
        if !events.is_empty() {
            self.app.update(Action::Events(h, events));
        }
    }
    /// An answer through the host's ledger, as the fleet's sink hands it on.
    fn answer(&mut self, h: HostId, id: u64, answer: ActionAnswer) -> Vec<Effect> {
        let now = self.now();
        let events = self.ledgers[h.0].answered(&answer, now);
        let mut eff = Vec::new();
        if !events.is_empty() {
            eff.extend(self.app.update(Action::Events(h, events)));
        }
        eff.extend(self.app.update(Action::Answer(h, id, answer)));
        eff
    }
    /// Carry out the effects a host would: actions act on the simulation.
    fn run_effects(&mut self, eff: &[Effect]) {
        for e in eff {
            if let Effect::Send(h, HostCmd::Act { id, req }) = e {
                self.send(*h, req);
                let out = self.hosts[h.0].act(req);
                self.answer(*h, *id, out);
            }
        }
    }
    fn screen(&self, w: u16, h: u16) -> String {
        let mut term = Terminal::new(TestBackend::new(w, h)).expect("terminal");
        term.draw(|f| view::render(&self.app, f)).expect("draw");
        term.backend().to_string()
    }
}

/// The effects that reach hosts (not the events-file records).
fn sent(eff: &[Effect]) -> Vec<Effect> {
    eff.iter()
        .filter(|e| matches!(e, Effect::Send(..) | Effect::Broadcast(..)))
        .cloned()
        .collect()
}

fn both(name: &str, d: &mut Demo) {
    for (w, h) in [(80u16, 24u16), (160, 48)] {
        d.app.update(Action::Resize(w, h));
        insta::assert_snapshot!(format!("{name}_{w}x{h}"), d.screen(w, h));
    }
}

fn gpu_b() -> Demo {
    let mut d = Demo::new(30);
    d.ch('j');
    d.key(KeyCode::Enter);
    d
}

#[test]
fn screen_overview_warming_up() {
    let mut d = Demo::new(30);
    both("overview", &mut d);
}

#[test]
fn screen_gpu_b_after_pkill() {
    let mut d = gpu_b();
    both("gpu_b", &mut d);
    d.key(KeyCode::Tab);
    both("gpu_b_processes", &mut d);
    d.key(KeyCode::Tab);
    both("gpu_b_findings", &mut d);
}

#[test]
fn screen_kill_dialog() {
    let mut d = gpu_b();
    d.key(KeyCode::Tab);
    d.ch('K');
    assert!(
        matches!(d.app.dialog(), Some(Dialog::Kill(k)) if k.target.pid == 7306 && k.signal == Sig::Term)
    );
    both("kill_dialog", &mut d);
    // The demo never passes for a real cluster: the mark is in the header and in the dialog, at any size.
    for (w, h) in [(80, 24), (160, 48)] {
        let screen = d.screen(w, h);
        let first = screen.lines().next().unwrap_or_default();
        assert!(first.contains("gpusweep DEMO"), "{screen}");
        assert!(screen.contains("DEMO: simulated"), "{screen}");
    }
    d.key(KeyCode::Tab);
    assert!(matches!(
        d.app.dialog(),
        Some(Dialog::Kill(Kill {
            signal: Sig::Kill,
            ..
        }))
    ));
}

#[test]
fn screen_sweep_dialog_and_banner() {
    let mut d = gpu_b();
    d.ch('S');
    assert!(matches!(
        d.app.dialog(),
        Some(Dialog::Sweep(Sweep {
            scope: SweepScope::Gpu,
            ..
        }))
    ));
    d.key(KeyCode::Tab);
    match d.app.dialog() {
        Some(Dialog::Sweep(Sweep {
            scope: SweepScope::Host,
            plan,
            ..
        })) => {
            let pids: Vec<u32> = plan.items.iter().map(|i| i.pid).collect();
            assert_eq!(pids, vec![7306, 7391]);
        }
        other => panic!("{other:?}"),
    }
    both("sweep_dialog", &mut d);
    d.at(31_000);
    let eff = d.key(KeyCode::Enter);
    assert!(
        eff.contains(&Effect::Send(
            HostId(1),
            HostCmd::Interval(Duration::from_millis(100))
        )) && !eff.iter().any(|e| matches!(
            e,
            Effect::Send(HostId(0 | 2), HostCmd::Interval(_)) | Effect::Broadcast(_)
        )),
        "fast polling of the swept host only: {eff:?}"
    );
    assert_eq!(
        eff.iter()
            .filter(|e| matches!(e, Effect::Send(HostId(1), HostCmd::Act { .. })))
            .count(),
        1
    );
    d.run_effects(&eff);
    assert!(d.app.rewatch().is_some());
    d.at(31_050);
    d.poll();
    both("rewatching", &mut d);
    d.at(31_100);
    let eff = d.poll();
    assert!(d.app.rewatch().is_none());
    assert_eq!(
        d.app.view.banner.as_deref(),
        Some("✓ gpu-b: all 8 GPUs read zero after 100 ms")
    );
    assert!(
        eff.contains(&Effect::Send(
            HostId(1),
            HostCmd::Interval(Duration::from_secs(1))
        )),
        "back to the normal poll: {eff:?}"
    );
    both("all_zero_banner", &mut d);
}

#[test]
fn screen_smem_help_filter_tree() {
    let mut d = gpu_b();
    d.ch('m');
    both("smem", &mut d);
    d.key(KeyCode::Esc);
    d.ch('?');
    both("help", &mut d);
    d.key(KeyCode::Esc);
    d.ch('/');
    for c in "sglang".chars() {
        d.ch(c);
    }
    d.key(KeyCode::Enter);
    assert_eq!(
        d.app
            .process_rows()
            .iter()
            .map(|r| r.pid)
            .collect::<Vec<_>>(),
        vec![7306]
    );
    both("filter", &mut d);
    d.key(KeyCode::Esc);
    d.ch('t');
    both("tree", &mut d);
}

#[test]
fn screen_host_down_and_no_gpu() {
    let mut d = Demo::new(2);
    d.app.update(Action::Status(
        HostId(2),
        ConnStatus::Down("connection refused".into()),
    ));
    both("host_down", &mut d);
}

#[test]
fn reducer_protects_pid_1_and_explains_zombies() {
    let mut d = gpu_b();
    d.app.view.sel.focus = Panel::Processes;
    let zombie = d
        .app
        .process_rows()
        .iter()
        .position(|r| r.pid == 7350)
        .expect("zombie row");
    d.app.view.sel.proc = zombie;
    d.ch('K');
    // A zombie cannot be killed: the dialog offers its parent and says why.
    match d.app.dialog() {
        Some(Dialog::Kill(Kill { target, note, .. })) => {
            assert_eq!(target.pid, 7340);
            let n = note.as_deref().expect("a note");
            assert!(n.contains("7350 is a zombie") && n.contains("7340"), "{n}");
        }
        other => panic!("{other:?}"),
    }
    d.key(KeyCode::Esc);
    let ghost = d
        .app
        .process_rows()
        .iter()
        .position(|r| r.pid == 7307)
        .expect("ghost row");
    d.app.view.sel.proc = ghost;
    d.ch('K');
    // A dead PID is never signalled: the holder that keeps its memory alive is offered, by name.
    match d.app.dialog() {
        Some(Dialog::Kill(Kill { target, note, .. })) => {
            assert_eq!(target.pid, 7391);
            assert!(note.as_deref().is_some_and(|n| n.contains("7307 is gone")));
        }
        other => panic!("{other:?}"),
    }
    d.key(KeyCode::Esc);
    d.app.store.hosts[1].protected = Protected::local(7391, []);
    d.app.view.sel.proc = d
        .app
        .process_rows()
        .iter()
        .position(|r| r.pid == 7391)
        .expect("row");
    d.ch('K');
    assert!(
        d.app
            .view
            .status
            .as_ref()
            .expect("status")
            .0
            .contains("protected")
    );
}

#[test]
fn reducer_kill_sends_the_confirmed_target_and_reports() {
    let mut d = gpu_b();
    d.key(KeyCode::Tab);
    d.ch('K');
    d.key(KeyCode::Tab); // KILL now
    let eff = d.key(KeyCode::Enter);
    match &sent(&eff)[..] {
        [
            Effect::Send(
                HostId(1),
                HostCmd::Act {
                    req: ActionRequest::Signal(req),
                    ..
                },
            ),
        ] => {
            assert_eq!(req.signal, Sig::Kill);
            assert_eq!(req.grace_ms, None);
            assert_eq!(req.targets[0].pid, 7306);
            assert_eq!(req.targets[0].start_time, 10_000 + 7306 * 3);
        }
        other => panic!("{other:?}"),
    }
    d.answer(
        HostId(1),
        1,
        ActionAnswer::Signal(vec![Outcome {
            pid: 7306,
            start_time: 0,
            cmdline: "x".into(),
            fate: Fate::Refused {
                reason: "PID reused".into(),
            },
        }]),
    );
    let (msg, _) = d.app.view.status.clone().expect("status");
    assert!(msg.contains("refused: PID reused"), "{msg}");
}

#[test]
fn reducer_navigation_sort_quit_and_mouse() {
    let mut d = Demo::new(3);
    d.app.update(Action::Resize(160, 48));
    for _ in 0..5 {
        d.ch('j');
    }
    assert_eq!(d.app.view.sel.host, 3, "selection stops at the last host");
    d.ch('k');
    assert_eq!(d.app.view.sel.host, 2);
    let click = mouse_action(
        &d.app,
        &MouseEvent {
            kind: MouseEventKind::Down(MouseButton::Left),
            column: 5,
            row: 2,
            modifiers: KeyModifiers::NONE,
        },
    )
    .expect("a click on a panel is an action");
    d.app.update(click);
    assert_eq!(
        d.app.view.sel.host, 0,
        "a click on the first host row selects it"
    );
    d.ch('s');
    assert_eq!(d.app.view.procs.sort.name(), "pid");
    let eff = d.ch('w');
    for h in 0..3 {
        assert!(
            eff.contains(&Effect::Send(HostId(h), HostCmd::PollNow)),
            "{eff:?}"
        );
        assert!(
            eff.contains(&Effect::Send(
                HostId(h),
                HostCmd::Interval(Duration::from_millis(100))
            )),
            "{eff:?}"
        );
    }
    assert!(d.app.rewatch().is_some());
    // Esc stops an endless re-watch too.
    let eff = d.key(KeyCode::Esc);
    assert!(
        d.app.rewatch().is_none()
            && (0..3).all(|h| eff.contains(&Effect::Send(
                HostId(h),
                HostCmd::Interval(Duration::from_secs(1))
            ))),
        "Esc stops the re-watch: {eff:?}"
    );
    d.ch('w');
    let eff = d.ch('w');
    assert!(
        d.app.rewatch().is_none()
            && (0..3).all(|h| eff.contains(&Effect::Send(
                HostId(h),
                HostCmd::Interval(Duration::from_secs(1))
            )))
    );
    d.app.update(Action::Key(KeyEvent::new(
        KeyCode::Char('c'),
        KeyModifiers::CONTROL,
    )));
    assert!(d.app.view.quit);
}

/// gpu-b swept and re-watched until its GPUs read zero, as the event loop would drive it.
fn swept_gpu_b() -> (Demo, Vec<Effect>) {
    let mut d = gpu_b();
    d.ch('S');
    d.key(KeyCode::Tab);
    d.at(31_000);
    let eff = d.key(KeyCode::Enter);
    d.run_effects(&eff);
    d.at(31_050);
    d.poll();
    d.at(31_100);
    let eff = d.poll();
    (d, eff)
}

#[test]
fn screen_timeline_records_signals_fates_and_the_time_to_clean() {
    let (mut d, eff) = swept_gpu_b();
    assert!(
        eff.contains(&Effect::DrawNow),
        "the reading that completes the watch is drawn at once: {eff:?}"
    );
    let logged: Vec<String> = d
        .app
        .store
        .timeline
        .iter()
        .map(gpusweep::core::event::Event::describe)
        .collect();
    let has = |s: &str| logged.iter().any(|l| l.contains(s));
    assert!(has("→ sweep: TERM to 7306, 7391"), "{logged:#?}");
    assert!(has("← 7306"), "{logged:#?}");
    assert!(
        has("GPU 6 reads clean, 100 ms after the first signal"),
        "{logged:#?}"
    );
    assert!(has("gpu-b: all zero after 100 ms"), "{logged:#?}");
    assert!(has("- process 7306 exited from GPU 6"), "{logged:#?}");
    assert!(has("cleared ghost"), "{logged:#?}");
    // The events file gets the same events, as effects of the updates that made them.
    assert!(
        eff.iter()
            .any(|e| matches!(e, Effect::Log(ev) if ev.describe().contains("all zero")))
    );
    d.ch('e');
    assert!(d.app.timeline_scroll().is_some());
    both("timeline", &mut d);
    d.ch('k');
    assert_eq!(d.app.timeline_scroll().unwrap_or(0), 1, "k scrolls back");
    d.key(KeyCode::Esc);
    assert!(d.app.timeline_scroll().is_none());
}

#[test]
fn screen_the_banner_stays_at_40x10() {
    let (mut d, _) = swept_gpu_b();
    d.app.update(Action::Resize(40, 10));
    let s = d.screen(40, 10);
    insta::assert_snapshot!("all_zero_banner_40x10", s);
    assert!(s.contains("✓ all 8 GPUs read zero after 100 ms"), "{s}");
    assert!(s.lines().next().unwrap_or("").contains("DEMO"), "{s}");
}

#[test]
fn screen_chart_of_the_warm_up() {
    let mut d = Demo::new(90);
    d.ch('c');
    assert!(d.app.view.chart_open);
    both("chart", &mut d);
    // With the GPU panel focused, only the selected GPU's line.
    d.key(KeyCode::Enter);
    d.ch('j');
    let s = d.screen(160, 48);
    assert!(s.contains("Memory of GPU 1 on gpu-a"), "{s}");
    d.ch('c');
    assert!(!d.app.view.chart_open);
}

#[test]
fn screen_finding_details_show_the_evidence() {
    let mut d = gpu_b();
    d.key(KeyCode::Tab);
    d.key(KeyCode::Tab);
    assert_eq!(d.app.view.sel.focus, Panel::Findings);
    let ghost = d
        .app
        .snap()
        .expect("reading")
        .findings
        .iter()
        .position(|f| f.kind == gpusweep::core::model::FindingKind::Ghost)
        .expect("ghost finding");
    d.app.view.sel.finding = ghost;
    d.key(KeyCode::Enter);
    assert!(matches!(d.app.dialog(), Some(Dialog::Finding { .. })));
    both("finding_details", &mut d);
    let s = d.screen(160, 48);
    for want in [
        "acts on 7391",
        "parents 7391",
        "→ 1 ",
        "open    /dev/nvidia7",
        "held    for at least",
    ] {
        assert!(s.contains(want), "{want:?} in\n{s}");
    }
    // K from the details offers the holder the ghost stands for.
    d.ch('K');
    assert!(matches!(d.app.dialog(), Some(Dialog::Kill(k)) if k.target.pid == 7391));
}

#[test]
fn screen_shm_confirmation_then_no_leftovers() {
    let mut d = gpu_b();
    d.ch('D');
    match d.app.dialog() {
        Some(Dialog::Remove { files, .. }) => assert_eq!(files.len(), 3),
        other => panic!("{other:?}"),
    }
    both("shm_confirmation", &mut d);
    let eff = d.key(KeyCode::Enter);
    let Some(Effect::Send(h, HostCmd::Act { id, req })) = sent(&eff).into_iter().next() else {
        panic!("{eff:?}")
    };
    assert!(matches!(req, ActionRequest::Remove(_)), "{req:?}");
    let out = d.hosts[h.0].act(&req);
    d.answer(h, id, out);
    d.poll();
    let s = d.app.snap().expect("reading");
    assert!(
        !s.findings
            .iter()
            .any(|f| f.kind == gpusweep::core::model::FindingKind::ShmLeftover),
        "{:?}",
        s.findings
    );
    assert!(
        d.app
            .store
            .timeline
            .iter()
            .any(|e| e.describe().contains("rm removed /dev/shm/nccl-7f3a2c"))
    );
    d.ch('D');
    assert!(d.app.dialog().is_none());
    assert!(
        d.app
            .view
            .status
            .as_ref()
            .is_some_and(|(m, _)| m.contains("no /dev/shm leftovers"))
    );
}

#[test]
fn screen_readonly_hides_and_refuses_actions() {
    let mut d = gpu_b();
    d.app.cfg.readonly = true;
    d.key(KeyCode::Tab);
    for c in ['K', 'S', 'D'] {
        let eff = d.ch(c);
        assert!(d.app.dialog().is_none() && sent(&eff).is_empty(), "{c}");
        assert!(
            d.app
                .view
                .status
                .as_ref()
                .is_some_and(|(m, _)| m.starts_with("read-only"))
        );
    }
    d.app.view.status = None;
    both("readonly", &mut d);
    let s = d.screen(160, 48);
    assert!(
        !s.contains("K kill") && !s.contains("S sweep") && s.contains("read-only"),
        "{s}"
    );
}

#[test]
fn screen_kill_dialog_warns_about_a_benign_holder() {
    let mut d = gpu_b();
    d.key(KeyCode::Tab);
    let row = d
        .app
        .process_rows()
        .iter()
        .position(|r| r.marks.contains(&gpusweep::core::model::Mark::Benign))
        .expect("benign row");
    d.app.view.sel.proc = row;
    d.ch('K');
    assert!(
        matches!(d.app.dialog(), Some(Dialog::Kill(Kill { note: Some(n), .. })) if n.starts_with("benign")),
        "{:?}",
        d.app.dialog()
    );
    both("kill_benign", &mut d);
}

/// Memory alone, put onto the reading the app holds, shows what the whole readings show: every host's
/// reading, counts, history and process ages, and the screen, second by second of the warm-up.
#[test]
fn reducer_memory_alone_shows_what_whole_readings_show() {
    let mut whole = Demo::new(0);
    let mut alone = Demo::start(0, true);
    for s in 1..=45 {
        for d in [&mut whole, &mut alone] {
            d.at(s * 1000);
            d.poll();
        }
        for (a, b) in whole.app.store.hosts.iter().zip(&alone.app.store.hosts) {
            assert_eq!(a.snap, b.snap, "{} at {s} s", a.label);
            assert_eq!(
                (a.counts, a.leaks, &a.history, &a.held_since, a.last_seen_ms),
                (b.counts, b.leaks, &b.history, &b.held_since, b.last_seen_ms),
                "{} at {s} s",
                a.label
            );
        }
        assert_eq!(whole.screen(160, 48), alone.screen(160, 48), "at {s} s");
    }
    let n = alone.memory_alone.unwrap_or(0);
    assert!(n >= 10, "{n} readings went as memory alone");
    // Memory alone with no reading to put it onto asks for the ledger's whole reading.
    let mut fresh = App::new(
        vec!["gpu-a".into()],
        Duration::from_secs(1),
        Keymap::default(),
        AnalyzeOptions::default(),
        false,
    );
    let m = gpusweep::runtime::MemoryJudged {
        taken_at_ms: BASE_MS,
        gauges: SaidGauges::default(),
        used: vec![Some(0)],
        charged: vec![Vec::new()],
        verdict: gpusweep::core::verdict::Verdict {
            states: vec![(0, Some(GpuState::Clean))],
            ..Default::default()
        },
        counts: gpusweep::runtime::StateCounts::default(),
        leaks: 0,
        all_clean: true,
        content: 1,
        from: (None, None),
    };
    let eff = fresh.update(Action::Update(HostId(0), Judgement::Memory(Box::new(m))));
    assert!(matches!(eff[..], [Effect::Whole(HostId(0))]), "{eff:?}");
    assert!(fresh.store.hosts[0].snap.is_none());
}

#[test]
fn reducer_a_silent_host_is_reported_after_the_connect_timeout() {
    let mut app = App::new(
        vec!["quiet".into()],
        Duration::from_secs(1),
        Keymap::default(),
        AnalyzeOptions::default(),
        false,
    );
    app.update(Action::Tick(BASE_MS));
    app.update(Action::Resize(100, 24));
    let render = |app: &App| {
        let mut term = Terminal::new(TestBackend::new(100, 24)).expect("terminal");
        term.draw(|f| view::render(app, f)).expect("draw");
        term.backend().to_string()
    };
    assert!(render(&app).contains("connecting…"));
    app.update(Action::Tick(BASE_MS + 10_000));
    let s = render(&app);
    assert!(s.contains("no reading within 10s; still trying"), "{s}");
    assert!(s.contains("1 ✗"), "the header counts it: {s}");
    // As the fleet hands it on: the ledger's event, then the status.
    let down = ConnStatus::Down("no hello from the agent within 10s".into());
    let mut ledger = Ledger::new("quiet", AnalyzeOptions::default());
    let events = ledger.status(&down, BASE_MS + 10_000);
    app.update(Action::Events(HostId(0), events));
    app.update(Action::Status(HostId(0), down));
    let s = render(&app);
    assert!(s.contains("retrying"), "{s}");
    assert!(
        app.store
            .timeline
            .iter()
            .any(|e| e.describe().contains("host down"))
    );
}

/// The mission's loop: swept, then `w` again on a host whose reading has stopped changing. The watch takes the
/// host's current reading when it starts: the banner comes with the next poll (a reading that says the same),
/// not never.
#[test]
fn reducer_w_on_a_swept_steady_host_ends_with_its_banner() {
    let (mut d, _) = swept_gpu_b();
    assert!(d.app.rewatch().is_none(), "the sweep's own watch ended");
    let banner = d.app.view.banner.clone();
    assert!(
        banner.as_deref().is_some_and(|b| b.contains("zero")),
        "{banner:?}"
    );
    // Steady: every reading from now on says the same.
    d.at(32_000);
    d.poll();
    d.ch('w');
    assert!(
        d.app.rewatch().is_none(),
        "its current reading already reads zero: the watch ends as it starts"
    );
    assert!(
        d.app
            .view
            .banner
            .as_deref()
            .is_some_and(|b| b.contains("gpu-b") && b.contains("zero")),
        "{:?}",
        d.app.view.banner
    );
    // And a watch begun while a host's reading says nothing new ends at the next reading that says the same.
    d.at(33_000);
    d.poll();
    while d.app.view.sel.focus != Panel::Hosts {
        d.key(KeyCode::Esc);
    }
    d.ch('w');
    assert!(
        d.app.rewatch().is_some(),
        "every host: gpu-a still warms up"
    );
    d.at(34_000);
    d.poll();
    assert!(d.app.rewatch().is_some(), "gpu-a still holds memory");
}

#[test]
fn reducer_w_on_an_opened_host_watches_that_host() {
    let mut d = gpu_b();
    d.ch('w');
    assert_eq!(d.app.rewatch().map(|r| r.label.as_str()), Some("gpu-b"));
    d.key(KeyCode::Esc);
    d.key(KeyCode::Esc);
    assert_eq!(d.app.view.sel.focus, Panel::Hosts);
    d.ch('w');
    assert_eq!(
        d.app.rewatch().map(|r| r.label.as_str()),
        Some("every host")
    );
}

#[test]
fn reducer_after_a_sweep_the_zombie_parent_and_d_leave_gpu_b_without_findings() {
    let (mut d, _) = swept_gpu_b();
    d.ch('D');
    let eff = d.key(KeyCode::Enter);
    let Some(Effect::Send(h, HostCmd::Act { id, req })) = sent(&eff).into_iter().next() else {
        panic!("{eff:?}")
    };
    assert!(matches!(req, ActionRequest::Remove(_)), "{req:?}");
    let out = d.hosts[h.0].act(&req);
    d.answer(h, id, out);
    d.app.view.sel.focus = Panel::Processes;
    d.app.view.sel.proc = d
        .app
        .process_rows()
        .iter()
        .position(|r| r.pid == 7350)
        .expect("zombie row");
    d.ch('K');
    let eff = d.key(KeyCode::Enter);
    d.run_effects(&eff);
    d.at(32_000);
    d.poll();
    let s = d.app.snap().expect("reading");
    assert!(s.findings.is_empty(), "{:#?}", s.findings);
}

#[test]
fn a_watch_polls_fast_only_as_far_as_a_thousand_hosts_allow() {
    let d = Demo::new(0);
    assert_eq!(d.app.fast_interval(3), Duration::from_millis(100));
    assert_eq!(d.app.fast_interval(256), Duration::from_millis(256));
    assert_eq!(
        d.app.fast_interval(1000),
        Duration::from_secs(1),
        "never slower than the normal interval, never more than ~1000 readings a second"
    );
}

/// A reading that said the same moves the gauges shown and the time, beside the reading its ledger judged:
/// that stays as it was (the ledger's own, not a copy).
#[test]
fn a_fresh_reading_moves_the_gauges_and_the_time_only() {
    let mut d = Demo::new(5);
    d.app.view.sel.host = 1;
    let before = d.app.store.hosts[1].snap().cloned().expect("gpu-b read");
    let seen = d.app.store.hosts[1].last_seen_ms.expect("read");
    let mut gauges = before.gauges();
    gauges[0].utilization = Some(97);
    assert!(!d.screen(140, 40).contains("97%"), "not shown before");
    // Only the GPU that moved, by its position, as a serve's stream says it.
    d.app.update(Action::Update(
        HostId(1),
        Judgement::Same {
            taken_at_ms: seen + 700,
            gauges: SaidGauges::moved(vec![(0, gauges[0].clone())]),
        },
    ));
    let h = &d.app.store.hosts[1];
    let after = h.snap().expect("still there");
    assert_eq!(h.gauges_of(0, &after.gpus[0]).0, Some(97));
    assert_eq!(h.last_seen_ms, Some(seen + 700));
    assert_eq!(*after, before, "the reading itself as judged");
    assert!(
        d.screen(140, 40).contains("97%"),
        "the GPU's gauges as last said"
    );
}

#[test]
fn the_header_counts_every_gpu_of_the_latest_readings() {
    let mut d = Demo::new(5);
    let recount = |app: &App| {
        let mut c = (0, 0, 0, 0);
        for s in app.store.hosts.iter().filter_map(|h| h.snap.as_ref()) {
            for g in &s.gpus {
                match gpusweep::analyze::state::gpu_state(s, g, &app.cfg.analyze) {
                    GpuState::Clean => c.0 += 1,
                    GpuState::InUse => c.1 += 1,
                    GpuState::Leak | GpuState::NeedsReset => c.2 += 1,
                    GpuState::Unknown | GpuState::Error => c.3 += 1,
                }
            }
        }
        c
    };
    let before = d.app.counts();
    assert_eq!(before, recount(&d.app));
    assert!(before.2 > 0, "the demo has leaks: {before:?}");
    // gpu-b swept clean: its leaking GPUs leave the count with its new reading.
    let mut b = d.app.store.hosts[1].snap().cloned().expect("gpu-b read");
    for g in &mut b.gpus {
        g.memory.used = Some(0);
        g.judged = None;
    }
    b.findings.clear();
    b.processes.clear();
    d.feed(1, b);
    assert_eq!(d.app.counts(), recount(&d.app));
    assert_ne!(d.app.counts(), before);
}

#[test]
fn only_what_is_on_screen_asks_for_a_frame() {
    let mut d = Demo::new(5);
    d.app.view.sel.host = 0;
    let b = d.app.store.hosts[1].snap().cloned().expect("gpu-b read");
    let a = d.app.store.hosts[0].snap.clone().expect("first host read");
    let at = d.app.changes();
    d.app.update(Action::Tick(b.taken_at_ms + 1_000));
    d.app.update(Action::Update(
        HostId(1),
        Judgement::Same {
            taken_at_ms: b.taken_at_ms + 700,
            gauges: SaidGauges::every(b.gauges()),
        },
    ));
    assert_eq!(
        d.app.changes(),
        at,
        "a fresh reading of a host not shown, and the clock: nothing to draw"
    );
    d.app.update(Action::Update(
        HostId(0),
        Judgement::Same {
            taken_at_ms: a.taken_at_ms + 700,
            gauges: SaidGauges::every(a.gauges()),
        },
    ));
    assert_ne!(
        d.app.changes(),
        at,
        "the shown host's processes age with its reading"
    );
    let at = d.app.changes();
    d.app.update(Action::Status(
        HostId(1),
        ConnStatus::Stale { silent_ms: 5_000 },
    ));
    assert_ne!(d.app.changes(), at, "a host gone stale");
    let at = d.app.changes();
    d.app.update(Action::Update(
        HostId(1),
        Judgement::Same {
            taken_at_ms: b.taken_at_ms + 9_000,
            gauges: SaidGauges::every(b.gauges()),
        },
    ));
    assert_ne!(d.app.changes(), at, "a stale host fresh again");
    assert_eq!(d.app.store.hosts[1].status, ConnStatus::Up);
    let at = d.app.changes();
    let mut b = b;
    b.gpus[0].memory.used = Some(1);
    d.feed(1, b);
    assert_ne!(d.app.changes(), at, "a whole reading");
}

#[test]
fn a_host_seen_through_prometheus_opens_live_and_refuses_kills_by_name() {
    let mut d = Demo::new(5);
    // gpu-b as Prometheus showed it: judged there, read-only here, with where its serve answers.
    let mut snap = d.app.store.hosts[1].snap().cloned().expect("gpu-b read");
    snap.source = gpusweep::core::model::SourceKind::Prometheus;
    snap.live_url = Some("http://gpu-b:9401".into());
    d.app.store.hosts[1].read_only = true;
    d.feed(1, snap);
    d.app.view.sel.focus = Panel::Hosts;
    d.app.view.sel.host = 1;
    for k in ['K', 'S', 'D'] {
        let eff = d.ch(k);
        assert!(
            eff.iter().all(|e| matches!(e, Effect::Log(_))),
            "{k}: {eff:?}"
        );
        assert!(
            d.app.dialog().is_none(),
            "{k}: no dialog on a read-only host"
        );
        let (msg, _) = d.app.view.status.clone().expect("a reason");
        assert!(
            msg.contains("read-only") && msg.contains("Enter"),
            "{k}: {msg}"
        );
    }
    let eff = d.key(KeyCode::Enter);
    assert!(
        eff.contains(&Effect::OpenLive(HostId(1), "http://gpu-b:9401".into())),
        "{eff:?}"
    );
    d.app
        .update(Action::Opened(HostId(1), "http://gpu-b:9401".into(), true));
    assert!(matches!(
        d.app.store.hosts[1].status,
        ConnStatus::Connecting
    ));
    // A host read live from its agent is not read-only: Enter only opens it.
    d.app.view.sel.focus = Panel::Hosts;
    d.app.view.sel.host = 0;
    let eff = d.key(KeyCode::Enter);
    assert!(
        !eff.iter().any(|e| matches!(e, Effect::OpenLive(..))),
        "{eff:?}"
    );
}

#[test]
fn reducer_time_to_clean_counts_from_the_signal_that_freed_the_gpu_not_an_earlier_unrelated_one() {
    let mut d = gpu_b();
    // Kill the zombie's parent: it holds no GPU, so it frees nothing.
    d.app.view.sel.focus = Panel::Processes;
    d.app.view.sel.proc = d
        .app
        .process_rows()
        .iter()
        .position(|r| r.pid == 7350)
        .expect("zombie row");
    d.ch('K');
    let eff = d.key(KeyCode::Enter);
    d.run_effects(&eff);
    d.at(30_500);
    d.poll();
    // 25 s later, sweep gpu-b: its GPUs read clean 100 ms after the sweep's own signal.
    d.at(55_000);
    d.poll();
    d.app.view.sel.focus = Panel::Gpus;
    d.ch('S');
    d.key(KeyCode::Tab);
    let eff = d.key(KeyCode::Enter);
    d.run_effects(&eff);
    let mut logged = Vec::new();
    for t in [55_050, 55_100, 55_200] {
        d.at(t);
        logged.extend(d.poll());
    }
    let cleaned: Vec<(u32, Option<u64>)> = d
        .app
        .store
        .timeline
        .iter()
        .filter(|e| e.host == "gpu-b")
        .filter_map(|e| match &e.what {
            gpusweep::core::event::EventKind::GpuClean { gpu, after_ms, .. } => {
                Some((*gpu, *after_ms))
            }
            _ => None,
        })
        .collect();
    assert!(
        cleaned.iter().any(|(g, _)| *g == 6) && cleaned.iter().any(|(g, _)| *g == 7),
        "{cleaned:?}"
    );
    for (gpu, after) in &cleaned {
        assert!(
            after.is_some_and(|ms| ms <= 1_000),
            "GPU {gpu} clean {after:?} ms after the first signal: counted from the unrelated kill"
        );
    }
    // The events file says the same.
    let logged_clean: Vec<String> = logged
        .iter()
        .filter_map(|e| match e {
            Effect::Log(ev) => Some(serde_json::to_string(ev).expect("json")),
            _ => None,
        })
        .filter(|j| j.contains("\"gpu_clean\""))
        .collect();
    assert!(!logged_clean.is_empty(), "{logged:?}");
    for j in &logged_clean {
        let v: serde_json::Value = serde_json::from_str(j).expect("json");
        assert!(v["after_ms"].as_u64().is_some_and(|ms| ms <= 1_000), "{j}");
    }
}

#[test]
fn text_a_remote_host_sends_is_shown_escaped_in_every_field() {
    let mut d = gpu_b();
    // gpu-b as a hostile agent could send it: bidi overrides and escape sequences in its labels.
    let mut s = d.hosts[1].snapshot();
    s.driver_version = Some("580\u{202e}.1".into());
    s.gpus[0].name = Some("H200\u{1b}[2J".into());
    s.gpus[0].compute_capability = Some("9.0\u{202e}".into());
    s.gpus[0].uuid = Some("GPU-\u{202e}x".into());
    for p in &mut s.processes {
        p.user = Some("bob\u{202e}".into());
    }
    d.feed(1, s);
    let mut screens = vec![d.screen(160, 50)];
    d.key(KeyCode::Tab);
    screens.push(d.screen(160, 50));
    d.key(KeyCode::Tab);
    d.key(KeyCode::Enter);
    screens.push(d.screen(160, 50));
    d.key(KeyCode::Esc);
    d.key(KeyCode::BackTab);
    d.ch('K');
    screens.push(d.screen(160, 50));
    for sc in &screens {
        assert!(
            !sc.contains('\u{202e}') && !sc.contains('\u{1b}'),
            "raw control text on screen:\n{sc}"
        );
    }
    assert!(
        screens.iter().any(|sc| sc.contains("\\u{202e}")),
        "shown escaped:\n{}",
        screens[0]
    );
}

#[test]
fn screen_jobs_view_names_the_lost_rank_and_sweeps_the_job_alone() {
    let mut d = Demo::new(30);
    d.ch('J');
    let rows = d.app.job_rows();
    // gpu-d's job lost rank 3: it comes first; gpu-a's warm-up with its straggler is among the others.
    assert_eq!(rows[0].id, "tree:6100", "{rows:?}");
    assert!(rows[0].troubled());
    assert!(rows.iter().any(|r| {
        r.id == "sglang-ep8.service"
            && r.members[0]
                .1
                .ranks
                .iter()
                .any(|k| k.pid == 4125 && k.straggler)
    }));
    both("jobs", &mut d);
    // S: the job's seven ranks on gpu-d, and nothing else.
    d.ch('S');
    match d.app.dialog() {
        Some(Dialog::Sweep(Sweep {
            scope: SweepScope::Job,
            plan,
            ..
        })) => {
            let pids: Vec<u32> = plan.items.iter().map(|i| i.pid).collect();
            assert_eq!(pids, [6120, 6121, 6122, 6124, 6125, 6126, 6127]);
        }
        other => panic!("{other:?}"),
    }
    both("jobs_sweep", &mut d);
    let eff = d.key(KeyCode::Enter);
    let to: Vec<HostId> = sent(&eff)
        .iter()
        .filter_map(|e| match e {
            Effect::Send(h, HostCmd::Act { .. }) => Some(*h),
            _ => None,
        })
        .collect();
    assert_eq!(to, [HostId(3)], "only gpu-d is signalled");
    d.run_effects(&eff);
    d.at(31_000);
    d.poll();
    assert!(
        d.app.store.timeline.iter().any(|e| e.host == "gpu-d"
            && matches!(&e.what, gpusweep::core::event::EventKind::JobEnded { job, .. } if job == "tree:6100")),
        "the job ended"
    );
}

/// A job gpusweep itself ends is no crash: sweeping gpu-a's healthy warm-up from the jobs view writes no
/// `rank_lost` and leaves no `lost_rank` phase or finding.
#[test]
fn reducer_a_job_swept_by_gpusweep_loses_no_rank() {
    let mut d = Demo::new(30);
    d.ch('J');
    let at = d
        .app
        .job_rows()
        .iter()
        .position(|r| r.id == "sglang-ep8.service")
        .expect("gpu-a's job");
    while d.app.jobs_sel() != Some(at) {
        d.key(KeyCode::Down);
    }
    d.ch('S');
    assert!(matches!(d.app.dialog(), Some(Dialog::Sweep(_))));
    let eff = d.key(KeyCode::Enter);
    d.run_effects(&eff);
    for ms in [31_000, 31_200, 32_000] {
        d.at(ms);
        d.poll();
    }
    let lost: Vec<String> = d
        .app
        .store
        .timeline
        .iter()
        .filter(|e| {
            e.host == "gpu-a"
                && matches!(&e.what, gpusweep::core::event::EventKind::RankLost { .. })
        })
        .map(gpusweep::core::event::Event::describe)
        .collect();
    assert!(lost.is_empty(), "ended by gpusweep, not lost: {lost:#?}");
    let a = d.app.store.hosts[0].snap.as_ref().expect("gpu-a");
    assert!(
        !a.findings
            .iter()
            .any(|f| f.kind == gpusweep::core::model::FindingKind::LostRank),
        "{:?}",
        a.findings
    );
    assert!(
        !a.jobs
            .iter()
            .any(|j| j.phase == gpusweep::core::job::Phase::LostRank),
        "{:?}",
        a.jobs
    );
}

#[test]
fn the_hosts_are_filtered_by_name_and_by_state_and_moves_stay_among_them() {
    let mut d = Demo::new(30);
    // `/` on the hosts panel filters the hosts: the leaking ones are gpu-b and gpu-d.
    d.ch('n');
    d.ch('/');
    for c in "is:leaking".chars() {
        d.ch(c);
    }
    d.key(KeyCode::Enter);
    assert_eq!(d.app.shown_hosts(), [1, 3]);
    assert!(d.app.view.procs.filter.is_empty(), "not the process filter");
    let screen = d.screen(160, 48);
    assert!(
        screen.contains("Hosts 2 of 4 shown (is:leaking): 2 leaking"),
        "{screen}"
    );
    // Moves go along the hosts shown, and stop at their ends.
    d.key(KeyCode::Down);
    assert_eq!(d.app.view.sel.host, 3);
    d.key(KeyCode::Down);
    assert_eq!(d.app.view.sel.host, 3);
    d.key(KeyCode::Up);
    assert_eq!(d.app.view.sel.host, 1);
    // By name, any case: the selected host it hides gives way to the one it shows.
    d.ch('/');
    d.key(KeyCode::Esc);
    assert!(d.app.view.hosts_filter.is_empty());
    d.ch('/');
    for c in "GPU-C".chars() {
        d.ch(c);
    }
    d.key(KeyCode::Enter);
    assert_eq!(d.app.shown_hosts(), [2]);
    assert_eq!(d.app.view.sel.host, 2);
    // A state that does not exist is said, not silently matched by nothing.
    d.ch('/');
    for c in " is:leak".chars() {
        d.ch(c);
    }
    d.key(KeyCode::Enter);
    assert!(d.app.shown_hosts().is_empty());
    let status = d.app.view.status.clone().map(|s| s.0).unwrap_or_default();
    assert!(status.contains("no state leak"), "{status}");
    // Esc on the main screen clears it: every host again.
    d.key(KeyCode::Esc);
    assert_eq!(d.app.shown_hosts(), [0, 1, 2, 3]);
}

#[test]
fn n_goes_to_the_next_host_that_leaks_and_the_title_counts_them() {
    let mut d = Demo::new(30);
    // gpu-b leaks (its pkill's leftovers), gpu-d lost a rank; gpu-a and gpu-c do not.
    d.ch('n');
    assert_eq!(d.app.view.sel.host, 1);
    assert_eq!(d.app.view.sel.focus, Panel::Hosts);
    d.ch('n');
    assert_eq!(d.app.view.sel.host, 3);
    d.ch('n');
    assert_eq!(d.app.view.sel.host, 1, "round the list");
    let screen = d.screen(160, 48);
    assert!(
        screen.contains("Hosts 4: 2 leaking, 0 unreadable"),
        "{screen}"
    );
}

/// A GPU in MIG mode shows its instances under it, each with its memory and state; a ghost on instance 2
/// makes that instance (and the GPU) a leak while instance 1 reads clean.
#[test]
fn mig_instances_show_under_their_gpu() {
    let mut d = Demo::new(2);
    // Seen to appear at 3 s, said in full once it lasted the confirm window.
    for ms in [3_000, 7_000] {
        d.at(ms);
        let s = mig_reading(&d);
        d.feed(0, s);
    }
    d.app.update(Action::Resize(160, 48));
    let screen = d.screen(160, 48);
    let row = |what: &str| {
        screen
            .lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("{what}:\n{screen}"))
            .to_string()
    };
    assert!(row("└ instance 1 (1g.18gb)").contains("clean"), "{screen}");
    assert!(row("└ instance 2 (1g.18gb)").contains("leak"), "{screen}");
}

/// gpu-a's reading with GPU 0 in MIG mode: instance 1 empty, instance 2 charged to a PID that is gone.
fn mig_reading(d: &Demo) -> gpusweep::core::model::HostSnapshot {
    use gpusweep::core::model::{ListedProcess, MIB, Memory, MigInstance};
    let mut s = d.hosts[0].snapshot();
    let g = &mut s.gpus[0];
    g.mig_enabled = Some(true);
    g.processes.clear();
    g.processes.push(ListedProcess {
        pid: 4_000_123,
        used_bytes: Some(4096 * MIB),
        gpu_instance: Some(2),
        ..Default::default()
    });
    let inst = |id: u32, used: u64, procs: Vec<ListedProcess>| MigInstance {
        gpu_instance: Some(id),
        compute_instance: Some(0),
        profile: Some("1g.18gb".into()),
        memory: Memory {
            used: Some(used * MIB),
            total: Some(18_432 * MIB),
            reserved: Some(0),
        },
        processes: procs,
        ..Default::default()
    };
    let ghost = g.processes.clone();
    g.mig = vec![inst(1, 0, vec![]), inst(2, 4096, ghost)];
    s
}

/// A status message is said for a while, then the key hints come back: one said before the first tick (the
/// "no NVIDIA driver" note of a machine without a driver) counts from that tick; it held its place all
/// session before.
#[test]
fn a_status_message_gives_the_key_hints_back() {
    let mut d = Demo::new(2);
    d.app.set_status(
        "no NVIDIA driver: libnvidia-ml.so.1 not found",
        gpusweep::tui::app::Level::Info,
    );
    d.at(5_000);
    assert!(d.app.view.status.is_some());
    d.app.update(Action::Resize(160, 48));
    assert!(d.screen(160, 48).contains("no NVIDIA driver"));
    d.at(2_000 + gpusweep::tui::app::STATUS_FOR_MS);
    assert!(d.app.view.status.is_none(), "{:?}", d.app.view.status);
    let screen = d.screen(160, 48);
    assert!(!screen.contains("no NVIDIA driver"), "{screen}");
    assert!(screen.contains("help"), "the key hints are back: {screen}");
    // Said before any tick: it counts from the first.
    let mut fresh = App::new(
        vec!["gpu-a".into()],
        Duration::from_secs(1),
        Keymap::default(),
        AnalyzeOptions::default(),
        false,
    );
    fresh.set_status("note", gpusweep::tui::app::Level::Info);
    fresh.update(Action::Tick(BASE_MS));
    assert!(fresh.view.status.is_some());
    fresh.update(Action::Tick(BASE_MS + gpusweep::tui::app::STATUS_FOR_MS));
    assert!(fresh.view.status.is_none());
}

/// The key help is whole at every size: each command's keys on screen at 80x24 (two columns) and each
/// description whole at 160x48 (it was cut at both sizes).
#[test]
fn the_key_help_is_whole_at_every_size() {
    use gpusweep::tui::keymap::{Cmd, Layer};
    let mut d = Demo::new(2);
    d.ch('?');
    for (w, h) in [(80u16, 24u16), (160, 48)] {
        d.app.update(Action::Resize(w, h));
        let screen = d.screen(w, h);
        for (c, layer, _, what) in Cmd::ALL {
            if layer != Layer::Main {
                continue;
            }
            let keys = d.app.cfg.keymap.keys_in(Layer::Main, c);
            assert!(
                screen.contains(&format!(" {keys} ")),
                "{keys} at {w}x{h}:\n{screen}"
            );
            if w == 160 {
                assert!(screen.contains(what), "{what} at {w}x{h}:\n{screen}");
            }
        }
        assert!(screen.contains("any key closes"), "{w}x{h}:\n{screen}");
    }
}
