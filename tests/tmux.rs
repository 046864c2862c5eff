//! The real binary in a real terminal: tmux starts `gpusweep --demo`, keys are typed, the screen is read.
//! tmux is required (the README's test command installs it); this test fails rather than skip without it.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{BIN, unique};

struct Tmux {
    socket: String,
}

impl Tmux {
    /// A tmux server of its own (named after `tag`, this test process and a counter: every test of the crate
    /// shares the process) running `cmd` in a `cols`x`rows` pane.
    fn start(tag: &str, cols: u16, rows: u16, cmd: &str) -> Tmux {
        let t = Tmux {
            socket: unique(&format!("gpusweep-{tag}")),
        };
        let (x, y) = (cols.to_string(), rows.to_string());
        let o = t.cmd(&["new-session", "-d", "-s", "gs", "-x", &x, "-y", &y, cmd]);
        assert!(
            o.status.success(),
            "tmux new-session: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        t
    }
    fn cmd(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux is required: apt-get install tmux")
    }
    fn keys(&self, keys: &[&str]) {
        let mut a = vec!["send-keys", "-t", "gs"];
        a.extend_from_slice(keys);
        assert!(self.cmd(&a).status.success());
    }
    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", "gs"]).stdout).into_owned()
    }
    /// Wait until the screen shows `needle` (returns at once when it does).
    fn await_text(&self, needle: &str) -> String {
        let t = Instant::now();
        loop {
            let s = self.screen();
            if s.contains(needle) {
                return s;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "timed out waiting for {needle:?}; screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Tmux {
    /// Wait until the screen no longer shows `needle`.
    fn await_gone(&self, needle: &str) -> String {
        let t = Instant::now();
        loop {
            let s = self.screen();
            if !s.contains(needle) {
                return s;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "timed out waiting for {needle:?} to go; screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

#[test]
fn demo_sweep_timeline_shm_removal_and_a_clean_gpu_b_recorded_in_the_events_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let events = dir.path().join("events.jsonl");
    let cmd = format!(
        "GPUSWEEP_CONFIG={0}/none.toml GPUSWEEP_AUDIT_LOG={0}/a.jsonl {BIN} --demo --events {1}; echo EXITED $?; sleep 30",
        dir.path().display(),
        events.display()
    );
    let t = Tmux::start("timeline", 160, 48, &cmd);
    t.await_text("gpu-b [······");
    t.keys(&["j", "Enter"]);
    t.await_text("▶ GPUs on gpu-b");
    t.keys(&["S"]);
    t.await_text("Sweep");
    t.keys(&["Tab"]);
    let s = t.await_text("[all of gpu-b]");
    assert!(
        s.contains("7306") && s.contains("7391"),
        "the plan names the orphan and the hidden holder:\n{s}"
    );
    t.keys(&["Enter"]);
    let s = t.await_text("gpu-b: all 8 GPUs read zero after");
    assert!(s.contains("gpu-b [········] 8/8 clean"), "{s}");
    // The timeline has the signals, their fates and the time to clean.
    t.keys(&["e"]);
    let s = t.await_text("all zero after");
    assert!(s.contains("→ sweep: TERM to 7306, 7391"), "{s}");
    assert!(
        s.contains("← 7306 sglang::scheduler_TP6: exited after TERM"),
        "{s}"
    );
    assert!(s.contains("after the first signal"), "{s}");
    t.keys(&["Escape"]);
    t.await_gone("Timeline (");
    // D lists the leftovers; Enter removes them.
    t.keys(&["D"]);
    let s = t.await_text("Remove /dev/shm leftovers");
    assert!(
        s.contains("nccl-7f3a2c") && s.contains("torch_7000_2381"),
        "{s}"
    );
    t.keys(&["Enter"]);
    t.await_text("removed /dev/shm/nccl-7f3a2c");
    // The zombie: K on its row offers its parent, which is what ends it.
    t.keys(&["/"]);
    t.keys(&["-l", "zombie"]);
    t.keys(&["Enter", "K"]);
    let s = t.await_text("is a zombie: it holds nothing and no signal");
    assert!(s.contains("pid     7340"), "{s}");
    t.keys(&["Enter"]);
    t.await_text("TERM 7340 on gpu-b: 7340");
    t.await_text("no findings: nothing leaked here");
    // Re-watch everything from the hosts panel (Esc dismisses the banner, clears the filter, goes back): gpu-a is
    // busy, so it keeps watching. A key right after Esc would read as Alt+key: each waits for the last.
    t.keys(&["Escape"]);
    t.await_gone("Esc to dismiss");
    t.keys(&["Escape"]);
    t.await_gone("filter:zombie");
    t.keys(&["Escape"]);
    t.await_text("▶ Hosts");
    t.keys(&["w"]);
    t.await_text("re-watching every host");
    t.keys(&["w", "q"]);
    t.await_text("EXITED 0");
    let log = std::fs::read_to_string(&events).expect("events file");
    let kinds: Vec<String> = log
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("one JSON object a line");
            assert_eq!(v["host"].as_str().map(str::is_empty), Some(false), "{l}");
            v["event"].as_str().expect("event").to_string()
        })
        .collect();
    for want in [
        "host_up",
        "signal_sent",
        "signal_fate",
        "process_exited",
        "gpu_clean",
        "all_clean",
        "shm_removed",
        "finding_cleared",
    ] {
        assert!(kinds.iter().any(|k| k == want), "{want} in {kinds:?}");
    }
}

#[test]
fn sigterm_ends_the_tui_with_143_and_restores_the_terminal() {
    let dir = tempfile::tempdir().expect("tmp");
    let cmd = format!(
        "GPUSWEEP_CONFIG={0}/none.toml {BIN} --demo; echo EXITED $?; sleep 30",
        dir.path().display()
    );
    let t = Tmux::start("term", 100, 30, &cmd);
    t.await_text("gpu-b [");
    let pane = String::from_utf8_lossy(
        &t.cmd(&["list-panes", "-t", "gs", "-F", "#{pane_pid}"])
            .stdout,
    )
    .trim()
    .to_string();
    let children =
        std::fs::read_to_string(format!("/proc/{pane}/task/{pane}/children")).expect("children");
    let pid: i32 = children
        .split_whitespace()
        .next()
        .expect("the TUI")
        .parse()
        .expect("pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("kill");
    let s = t.await_text("EXITED");
    assert!(s.contains("EXITED 143"), "{s}");
    assert!(!s.contains("gpu-b ["), "the alternate screen is gone: {s}");
}

#[test]
fn wait_progress_is_one_line_redrawn_in_place_at_80_columns() {
    let dir = tempfile::tempdir().expect("tmp");
    // The demo cluster is never all clean: `wait` redraws its progress until the timeout.
    let cmd = format!(
        "GPUSWEEP_CONFIG={0}/none.toml {BIN} wait --demo --timeout 3s --poll 50ms; echo EXITED $?; sleep 30",
        dir.path().display()
    );
    let t = Tmux::start("wait", 80, 40, &cmd);
    let screen = t.await_text("EXITED");
    let before: Vec<&str> = screen
        .lines()
        .take_while(|l| !l.starts_with("timed out"))
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(
        before.len(),
        1,
        "one progress line, never wrapped or repeated:\n{screen}"
    );
    assert!(before[0].starts_with("waiting "), "{screen}");
    assert!(screen.contains("EXITED 1"), "{screen}");
}

#[test]
fn a_demo_read_through_a_serve_is_marked_demo_in_the_header_and_dialogs() {
    let dir = tempfile::tempdir().expect("tmp");
    let serve = crate::support::DemoServe::start(dir.path(), &[]);
    let cmd = format!(
        "GPUSWEEP_CONFIG={0}/none.toml {BIN} --hosts http://{1}; echo EXITED $?; sleep 30",
        dir.path().display(),
        serve.addr
    );
    let t = Tmux::start("demo-http", 120, 40, &cmd);
    let s = t.await_text(&format!("{} [·", serve.addr));
    let header = s.lines().next().unwrap_or_default();
    assert!(header.contains("gpusweep DEMO"), "{s}");
    // The findings panel of gpu-b, and a finding opened whole.
    t.keys(&["Enter"]);
    t.await_text("▶ GPUs");
    t.keys(&["Tab", "Tab"]);
    t.await_text("▶ Findings");
    t.keys(&["Enter"]);
    let s = t.await_text("DEMO: simulated");
    assert!(
        s.lines()
            .next()
            .unwrap_or_default()
            .contains("gpusweep DEMO"),
        "{s}"
    );
    // A key right after Esc would read as Alt+key: q waits for the dialog to close.
    t.keys(&["Escape"]);
    t.await_gone("DEMO: simulated");
    t.keys(&["q"]);
    t.await_text("EXITED 0");
}

/// The mission's loop: kill, then re-watch until every GPU reads zero. `w` on a swept host whose reading has
/// stopped changing ends with its banner (it takes the host's current reading when it starts); the same for
/// a steady, clean host read through a serve over HTTP.
#[test]
fn w_on_a_steady_clean_host_ends_with_its_banner_in_the_demo_and_over_http() {
    let dir = tempfile::tempdir().expect("tmp");
    let cmd = format!(
        "GPUSWEEP_CONFIG={0}/none.toml GPUSWEEP_AUDIT_LOG={0}/a.jsonl {BIN} --demo; echo EXITED $?; sleep 30",
        dir.path().display(),
    );
    let t = Tmux::start("rewatch", 160, 48, &cmd);
    t.await_text("gpu-b [······");
    t.keys(&["j", "Enter"]);
    t.await_text("▶ GPUs on gpu-b");
    t.keys(&["S"]);
    t.await_text("Sweep");
    t.keys(&["Tab"]);
    t.await_text("[all of gpu-b]");
    t.keys(&["Enter"]);
    t.await_text("gpu-b: all 8 GPUs read zero after");
    // Steady now. Esc dismisses the banner; w watches gpu-b again.
    t.keys(&["Escape"]);
    t.await_gone("Esc to dismiss");
    t.keys(&["w"]);
    let s = t.await_text("gpu-b: all 8 GPUs read zero after");
    assert!(!s.contains("re-watching gpu-b"), "{s}");
    t.keys(&["Escape"]);
    t.await_gone("Esc to dismiss");
    t.keys(&["q"]);
    t.await_text("EXITED 0");
    drop(t);

    // Over HTTP: this host's serve on two stand-in GPUs that read zero.
    let lib = crate::support::standin_nvml(dir.path());
    crate::support::set_nvml(dir.path(), "0\n0\n");
    for i in 0..2 {
        std::fs::write(dir.path().join(format!("nvidia{i}")), b"").expect("stand-in device");
    }
    let mut c = Command::new(BIN);
    c.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--no-socket",
        "--device-glob",
    ])
    .arg(format!("{}/nvidia*", dir.path().display()))
    .env("GPUSWEEP_NVML_LIBRARY", &lib)
    .env("STANDIN_NVML_STATE", dir.path().join("nvml"));
    let serve = crate::support::DemoServe::spawn(c, dir.path());
    let cmd = format!(
        "GPUSWEEP_CONFIG={0}/none.toml {BIN} --hosts http://{1}; echo EXITED $?; sleep 30",
        dir.path().display(),
        serve.addr
    );
    let t = Tmux::start("rewatch-http", 160, 48, &cmd);
    t.await_text("2/2 clean");
    t.keys(&["Enter"]);
    t.await_text("▶ GPUs");
    t.keys(&["w"]);
    let s = t.await_text("all 2 GPUs read zero after");
    assert!(!s.contains("no reading yet"), "{s}");
    t.keys(&["Escape"]);
    t.await_gone("Esc to dismiss");
    t.keys(&["q"]);
    t.await_text("EXITED 0");
}

/// A TUI attached to a serve after gpu-d's warm-up crashed (the demo loses rank 3 at 24 s) shows what the node
/// saw: the job's lost rank in the jobs view, not a fresh judgement with no history.
#[test]
fn a_tui_attached_after_the_crash_shows_the_lost_rank() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut c = Command::new(BIN);
    c.args([
        "serve",
        "--demo",
        "--hosts",
        "gpu-d",
        "--listen",
        "127.0.0.1:0",
    ]);
    let serve = crate::support::DemoServe::spawn(c, dir.path());
    // The node's own view first: the crash has happened.
    let t0 = Instant::now();
    loop {
        let o = Command::new(BIN)
            .args([
                "snapshot",
                "--json",
                "--hosts",
                &format!("http://{}", serve.addr),
            ])
            .env("GPUSWEEP_CONFIG", dir.path().join("none.toml"))
            .output()
            .expect("snapshot");
        if String::from_utf8_lossy(&o.stdout).contains("lost_rank") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "gpu-d never lost its rank"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let cmd = format!(
        "GPUSWEEP_CONFIG={0}/none.toml {BIN} --hosts http://{1}; echo EXITED $?; sleep 30",
        dir.path().display(),
        serve.addr
    );
    let t = Tmux::start("attached", 160, 48, &cmd);
    t.await_text(&format!("{} [", serve.addr));
    t.keys(&["J"]);
    let s = t.await_text("lost    6123");
    assert!(s.contains("lost a rank"), "{s}");
    t.keys(&["Escape"]);
    t.await_gone("lost    6123");
    t.keys(&["q"]);
    t.await_text("EXITED 0");
}

/// A busy Prometheus takes longer than a connection may to say which hosts it knows (6-36 s at 10,000 hosts,
/// against the default `--connect-timeout` of 10 s): the TUI, whose fleet cannot grow once started, waits for
/// the answer (saying so before it takes the screen) instead of standing as one unreadable host that asks to
/// be started again. This "Prometheus" names its one host 3 s after it is asked; the TUI's connect timeout is 1 s.
#[test]
fn the_tui_waits_for_a_busy_prometheus_to_name_its_hosts() {
    use crate::prometheus::{NO_SERIES, answer_queries, hosts_query};
    let dir = tempfile::tempdir().expect("tmp");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    answer_queries(listener, |req| {
        if hosts_query(req) {
            std::thread::sleep(Duration::from_secs(3));
            return r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"Hostname":"slow-node-1","instance":"slow-node-1"},"value":[1,"1"]}]}}"#.to_string();
        }
        NO_SERIES.to_string()
    });
    let cmd = format!(
        "GPUSWEEP_CONFIG={0}/none.toml {BIN} --hosts prom:{url} --connect-timeout 1; echo EXITED $?; sleep 30",
        dir.path().display()
    );
    let t = Tmux::start("slowprom", 120, 30, &cmd);
    let s = t.await_text("slow-node-1");
    assert!(!s.contains("could not be asked"), "{s}");
    t.keys(&["q"]);
    let s = t.await_text("EXITED");
    assert!(
        s.contains("which hosts it knows (up to 120 s)"),
        "it said what it waited for: {s}"
    );
}
