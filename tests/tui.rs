//! The TUI over the demo cluster: reducer tests of `update(Action)` and snapshots of every screen and dialog at
//! 80x24 and 160x48. Clocks are simulated, so every time on screen is fixed.

// In tests a panic is the failure message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers, MouseButton, MouseEvent, MouseEventKind};
use gpusweep::analyze::{AnalyzeOptions, analyzed};
use gpusweep::core::model::HostId;
use gpusweep::core::signal::{Fate, Outcome, Protected, Sig};
use gpusweep::source::demo::{DEMO_HOSTS, DemoClock, DemoHost};
use gpusweep::source::{ConnStatus, HostCmd};
use gpusweep::tui::app::{Action, App, Dialog, Effect, Panel, SweepScope};
use gpusweep::tui::keymap::Keymap;
use gpusweep::tui::run::mouse_action;
use gpusweep::tui::view;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

const BASE_MS: u64 = 1_764_669_600_000;

struct Demo {
    app: App,
    hosts: Vec<DemoHost>,
    t: Arc<AtomicU64>,
}

impl Demo {
    /// The three demo hosts, polled once a second for `secs` seconds of warm-up.
    fn new(secs: u64) -> Demo {
        let (clock, t) = DemoClock::manual(0);
        let hosts: Vec<DemoHost> = DEMO_HOSTS
            .iter()
            .map(|h| DemoHost::new(h, clock.clone()))
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
        let mut d = Demo { app, hosts, t };
        for s in 0..=secs {
            d.at(s * 1000);
            d.poll();
        }
        d
    }
    fn at(&mut self, ms: u64) {
        self.t.store(ms, Ordering::SeqCst);
        self.app.update(Action::Tick(BASE_MS + ms));
    }
    fn poll(&mut self) -> Vec<Effect> {
        let mut eff = Vec::new();
        for i in 0..self.hosts.len() {
            let s = analyzed(self.hosts[i].snapshot(), &AnalyzeOptions::default());
            eff.extend(self.app.update(Action::Snapshot(HostId(i), Box::new(s))));
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
    /// Carry out the effects a host would: signals act on the simulation.
    fn run_effects(&mut self, eff: &[Effect]) {
        for e in eff {
            if let Effect::Send(h, HostCmd::Signal { id, req }) = e {
                let out = self.hosts[h.0].signal(req);
                self.app.update(Action::Outcomes(*h, *id, out));
            }
        }
    }
    fn screen(&self, w: u16, h: u16) -> String {
        let mut term = Terminal::new(TestBackend::new(w, h)).expect("terminal");
        term.draw(|f| view::render(&self.app, f)).expect("draw");
        term.backend().to_string()
    }
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
        matches!(&d.app.dialog, Some(Dialog::Kill { target, signal: Sig::Term, .. }) if target.pid == 7306)
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
        &d.app.dialog,
        Some(Dialog::Kill {
            signal: Sig::Kill,
            ..
        })
    ));
}

#[test]
fn screen_sweep_dialog_and_banner() {
    let mut d = gpu_b();
    d.ch('S');
    assert!(matches!(
        &d.app.dialog,
        Some(Dialog::Sweep {
            scope: SweepScope::Gpu,
            ..
        })
    ));
    d.key(KeyCode::Tab);
    match &d.app.dialog {
        Some(Dialog::Sweep {
            scope: SweepScope::Host,
            plan,
            ..
        }) => {
            let pids: Vec<u32> = plan.items.iter().map(|i| i.pid).collect();
            assert_eq!(pids, vec![7306, 7391]);
        }
        other => panic!("{other:?}"),
    }
    both("sweep_dialog", &mut d);
    d.at(31_000);
    let eff = d.key(KeyCode::Enter);
    assert!(
        eff.contains(&Effect::Broadcast(HostCmd::Interval(
            Duration::from_millis(100)
        ))),
        "fast polling: {eff:?}"
    );
    assert_eq!(
        eff.iter()
            .filter(|e| matches!(e, Effect::Send(HostId(1), HostCmd::Signal { .. })))
            .count(),
        1
    );
    d.run_effects(&eff);
    assert!(d.app.rewatch.is_some());
    d.at(31_050);
    d.poll();
    both("rewatching", &mut d);
    d.at(31_100);
    let eff = d.poll();
    assert!(d.app.rewatch.is_none());
    assert_eq!(
        d.app.banner.as_deref(),
        Some("✓ gpu-b: all 8 GPUs read zero after 100 ms")
    );
    assert!(
        eff.contains(&Effect::Broadcast(HostCmd::Interval(Duration::from_secs(
            1
        )))),
        "back to the normal poll"
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
    d.app.sel.focus = Panel::Processes;
    let zombie = d
        .app
        .process_rows()
        .iter()
        .position(|r| r.pid == 7350)
        .expect("zombie row");
    d.app.sel.proc = zombie;
    d.ch('K');
    assert!(d.app.dialog.is_none());
    assert!(
        d.app
            .status
            .as_ref()
            .expect("status")
            .0
            .contains("kill its parent 7340")
    );
    let ghost = d
        .app
        .process_rows()
        .iter()
        .position(|r| r.pid == 7307)
        .expect("ghost row");
    d.app.sel.proc = ghost;
    d.ch('K');
    assert!(
        d.app.dialog.is_none(),
        "a dead PID is never offered for a kill"
    );
    d.app.hosts[1].protected = Protected::local(7391, []);
    d.app.sel.proc = d
        .app
        .process_rows()
        .iter()
        .position(|r| r.pid == 7391)
        .expect("row");
    d.ch('K');
    assert!(
        d.app
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
    match &eff[..] {
        [Effect::Send(HostId(1), HostCmd::Signal { req, .. })] => {
            assert_eq!(req.signal, Sig::Kill);
            assert_eq!(req.grace_ms, None);
            assert_eq!(req.targets[0].pid, 7306);
            assert_eq!(req.targets[0].start_time, 10_000 + 7306 * 3);
        }
        other => panic!("{other:?}"),
    }
    d.app.update(Action::Outcomes(
        HostId(1),
        1,
        vec![Outcome {
            pid: 7306,
            start_time: 0,
            cmdline: "x".into(),
            fate: Fate::Refused {
                reason: "PID reused".into(),
            },
        }],
    ));
    let (msg, _) = d.app.status.clone().expect("status");
    assert!(msg.contains("refused: PID reused"), "{msg}");
}

#[test]
fn reducer_navigation_sort_quit_and_mouse() {
    let mut d = Demo::new(3);
    d.app.update(Action::Resize(160, 48));
    d.ch('j');
    d.ch('j');
    d.ch('j');
    assert_eq!(d.app.sel.host, 2, "selection stops at the last host");
    d.ch('k');
    assert_eq!(d.app.sel.host, 1);
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
        d.app.sel.host, 0,
        "a click on the first host row selects it"
    );
    d.ch('s');
    assert_eq!(d.app.procs.sort.name(), "pid");
    let eff = d.ch('w');
    assert!(eff.contains(&Effect::Broadcast(HostCmd::PollNow)));
    assert!(d.app.rewatch.is_some());
    // Esc stops an endless re-watch too.
    let eff = d.key(KeyCode::Esc);
    assert!(
        d.app.rewatch.is_none()
            && eff.contains(&Effect::Broadcast(HostCmd::Interval(Duration::from_secs(
                1
            )))),
        "Esc stops the re-watch: {eff:?}"
    );
    d.ch('w');
    let eff = d.ch('w');
    assert!(
        d.app.rewatch.is_none()
            && eff.contains(&Effect::Broadcast(HostCmd::Interval(Duration::from_secs(
                1
            ))))
    );
    d.app.update(Action::Key(KeyEvent::new(
        KeyCode::Char('c'),
        KeyModifiers::CONTROL,
    )));
    assert!(d.app.quit);
}
