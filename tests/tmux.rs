//! The real binary in a real terminal: tmux starts `gpusweep --demo`, keys are typed, the screen is read.
//! tmux is required (the README's test command installs it); this test fails rather than skip without it.

// In tests a panic is the failure message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::{Duration, Instant};

struct Tmux {
    socket: String,
}

impl Tmux {
    /// A tmux server of its own (named after `tag` and this test process) running `cmd` in a `cols`x`rows` pane.
    fn start(tag: &str, cols: u16, rows: u16, cmd: &str) -> Tmux {
        let t = Tmux {
            socket: format!("gpusweep-{tag}-{}", std::process::id()),
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

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

#[test]
fn demo_open_gpu_b_sweep_confirm_and_see_all_zero() {
    let dir = tempfile::tempdir().expect("tmp");
    let bin = env!("CARGO_BIN_EXE_gpusweep");
    let cmd = format!(
        "GPUSWEEP_CONFIG={0}/none.toml GPUSWEEP_AUDIT_LOG={0}/a.jsonl {bin} --demo; echo EXITED $?; sleep 30",
        dir.path().display()
    );
    let t = Tmux::start("test", 160, 48, &cmd);
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
    // Re-watch everything: gpu-a is busy, so it keeps watching and says what still holds memory.
    t.keys(&["Escape", "w"]);
    t.await_text("re-watching every host");
    t.keys(&["w", "q"]);
    t.await_text("EXITED 0");
}

#[test]
fn wait_progress_is_one_line_redrawn_in_place_at_80_columns() {
    let dir = tempfile::tempdir().expect("tmp");
    let bin = env!("CARGO_BIN_EXE_gpusweep");
    // The demo cluster is never all clean: `wait` redraws its progress until the timeout.
    let cmd = format!(
        "GPUSWEEP_CONFIG={0}/none.toml {bin} wait --demo --timeout 3s --poll 50ms; echo EXITED $?; sleep 30",
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
