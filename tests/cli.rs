//! The real binary against real processes (no GPU needed) and the demo cluster.

// In tests a panic is the failure message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }
    fn audit(&self) -> PathBuf {
        self.dir.path().join("actions.jsonl")
    }
    fn glob(&self) -> String {
        format!("{}/nvidia*", self.dir.path().display())
    }
    fn device(&self) -> PathBuf {
        let p = self.dir.path().join("nvidia0");
        if !p.exists() {
            std::fs::write(&p, b"").expect("stand-in device");
        }
        p
    }
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_gpusweep"));
        c.args(args)
            .env("GPUSWEEP_AUDIT_LOG", self.audit())
            .env("GPUSWEEP_CONFIG", self.dir.path().join("no-config.toml"))
            .env_remove("GPUSWEEP_HOSTS")
            .stdin(Stdio::null());
        c
    }
    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run gpusweep")
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn stat_field(pid: u32, n: usize) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 2..];
    after.split_whitespace().nth(n).map(str::to_string)
}

/// Wait for a condition on real processes, up to a bound (not a sleep-as-synchronisation: it returns as soon
/// as the condition holds).
fn await_cond(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A double-forked `sleep` holding `dev` open: its shell exits at once, so it is reparented to PID 1.
fn orphan_holding(dev: &Path) -> u32 {
    let out = Command::new("sh")
        .args(["-c", "sleep 300 <\"$1\" >/dev/null 2>&1 & echo $!", "sh"])
        .arg(dev)
        .output()
        .expect("sh");
    let pid: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("pid");
    await_cond("reparenting", || stat_field(pid, 1).as_deref() == Some("1"));
    pid
}

fn alive(pid: u32) -> bool {
    stat_field(pid, 0).is_some_and(|s| s != "Z")
}

#[test]
fn orphan_holder_is_found_and_swept_with_yes() {
    let env = Env::new();
    let dev = env.device();
    let pid = orphan_holding(&dev);
    let glob = env.glob();

    let o = env.run(&["snapshot", "--json", "--no-nvml", "--device-glob", &glob]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let h = &v["hosts"][0];
    let holder = h["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .find(|x| x["pid"] == pid)
        .expect("the sleep is a holder");
    assert_eq!(holder["gpus"], serde_json::json!([0]));
    let orphan = h["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["kind"] == "orphan" && f["pid"] == pid);
    assert!(
        orphan.is_some(),
        "orphan finding expected: {}",
        h["findings"]
    );
    assert!(h["error"].is_null());

    let o = env.run(&[
        "sweep",
        "--yes",
        "--no-nvml",
        "--device-glob",
        &glob,
        "--grace",
        "5s",
        "--timeout",
        "10s",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(
        t.contains(&format!("{pid} sleep 300: exited after TERM")),
        "{t}"
    );
    assert!(t.contains("clean"), "{t}");
    assert!(!alive(pid));
    let log = std::fs::read_to_string(env.audit()).expect("audit log");
    let line: serde_json::Value =
        serde_json::from_str(log.lines().last().expect("a line")).expect("json line");
    assert_eq!(line["pid"], pid);
    assert_eq!(line["signal"], "TERM");
    assert_eq!(line["result"], "sending", "recorded before the signal");
    assert!(
        line["cmdline"]
            .as_str()
            .expect("cmdline")
            .contains("sleep 300")
    );
}

#[test]
fn zombie_is_found_with_its_parent() {
    let env = Env::new();
    // This test process is the parent, and it does not wait() until the end: a real zombie.
    let mut child = Command::new("true").spawn().expect("spawn");
    let zpid = child.id();
    await_cond("the zombie", || stat_field(zpid, 0).as_deref() == Some("Z"));
    let o = env.run(&[
        "snapshot",
        "--json",
        "--no-nvml",
        "--device-glob",
        &env.glob(),
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let h = &v["hosts"][0];
    assert!(
        h["zombies"]
            .as_array()
            .expect("zombies")
            .contains(&serde_json::json!(zpid)),
        "{zpid} not in {}",
        h["zombies"]
    );
    let f = h["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["kind"] == "zombie" && f["pid"] == zpid)
        .expect("zombie finding");
    assert_eq!(
        f["target_pid"],
        std::process::id(),
        "the action is on the parent"
    );
    let _ = child.wait();
}

#[test]
fn pid_1_and_ancestors_are_refused_and_no_tty_needs_yes() {
    let env = Env::new();
    let o = env.run(&["kill", "1", "--yes", "--no-nvml"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("refused: PID 1 is never signalled"),
        "{}",
        text(&o)
    );

    let me = std::process::id().to_string();
    let o = env.run(&["kill", &me, "--yes", "--no-nvml", "--signal", "KILL"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("an ancestor of gpusweep is never signalled"),
        "{}",
        text(&o)
    );

    let mut victim = Command::new("sleep").arg("300").spawn().expect("sleep");
    let o = env.run(&["kill", &victim.id().to_string(), "--no-nvml"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("refusing to signal without --yes"),
        "{}",
        text(&o)
    );
    assert!(
        victim.try_wait().expect("try_wait").is_none(),
        "nothing was sent"
    );
    let o = env.run(&[
        "kill",
        &victim.id().to_string(),
        "--no-nvml",
        "--yes",
        "--signal",
        "KILL",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let st = victim.wait().expect("wait");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(9));
}

#[test]
fn reused_pid_is_refused_through_the_library() {
    use gpusweep::act::{AuditLog, deliver};
    use gpusweep::core::signal::{Fate, Sig, SignalRequest, TargetInfo};
    let env = Env::new();
    let audit = AuditLog {
        path: Some(env.audit()),
    };
    let mut child = Command::new("sleep").arg("300").spawn().expect("sleep");
    let pid = child.id();
    let start: u64 = stat_field(pid, 19)
        .expect("starttime")
        .parse()
        .expect("num");
    // The PID now names a process that started at another time: exactly what a reused PID looks like.
    let stale = SignalRequest {
        targets: vec![TargetInfo {
            pid,
            start_time: start + 1,
            cmdline: "old".into(),
        }],
        signal: Sig::Kill,
        grace_ms: None,
    };
    let out = deliver("local", &stale, &audit);
    assert!(
        matches!(&out[0].fate, Fate::Refused { reason } if reason.contains("PID reused")),
        "{out:?}"
    );
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "the innocent process lives"
    );
    assert!(
        !env.audit().exists()
            || std::fs::read_to_string(env.audit())
                .expect("read")
                .is_empty(),
        "nothing sent, nothing logged"
    );
    let ok = SignalRequest {
        targets: vec![TargetInfo {
            pid,
            start_time: start,
            cmdline: String::new(),
        }],
        signal: Sig::Term,
        grace_ms: Some(5000),
    };
    let out = deliver("local", &ok, &audit);
    // Our own child stays a zombie until we wait, but the pidfd reports its exit.
    assert!(
        matches!(
            out[0].fate,
            Fate::Exited {
                signal: Sig::Term,
                ..
            }
        ),
        "{out:?}"
    );
    let _ = child.wait();
}

#[test]
fn an_unwritable_audit_log_means_no_signal() {
    use gpusweep::act::{AuditLog, deliver};
    use gpusweep::core::signal::{Fate, Sig, SignalRequest, TargetInfo};
    let mut child = Command::new("sleep").arg("300").spawn().expect("sleep");
    let pid = child.id();
    let start: u64 = stat_field(pid, 19)
        .expect("starttime")
        .parse()
        .expect("num");
    let audit = AuditLog {
        path: Some(PathBuf::from("/proc/version/actions.jsonl")),
    };
    let req = SignalRequest {
        targets: vec![TargetInfo {
            pid,
            start_time: start,
            cmdline: String::new(),
        }],
        signal: Sig::Kill,
        grace_ms: None,
    };
    let out = deliver("local", &req, &audit);
    assert!(
        matches!(&out[0].fate, Fate::Refused { reason } if reason.contains("audit log") || reason.contains("cannot")),
        "{out:?}"
    );
    assert!(child.try_wait().expect("try_wait").is_none());
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn smem_tile_fit_from_the_issue() {
    let env = Env::new();
    let o = env.run(&[
        "smem",
        "--tile",
        "128x256x128",
        "--dtype",
        "bf16",
        "--cc",
        "12.0",
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("does NOT fit") && t.contains("98,320") && t.contains("101,376"),
        "{t}"
    );
    let o = env.run(&[
        "smem",
        "--tile",
        "128x256x128",
        "--dtype",
        "bf16",
        "--cc",
        "9.0",
    ]);
    assert!(
        text(&o).contains("fits on CC 9.0: 2 stages"),
        "{}",
        text(&o)
    );
    let o = env.run(&["smem", "--cc", "4.2"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("unknown compute capability"));
    // Without --cc, the demo's GPUs decide.
    let o = env.run(&["smem", "--demo", "--tile", "128x256x128"]);
    let t = text(&o);
    assert!(
        t.contains("CC 12.0") && t.contains("CC 9.0") && t.contains("gpu-c:0"),
        "{t}"
    );
}

#[test]
fn demo_snapshot_wait_and_sweep() {
    let env = Env::new();
    let o = env.run(&["snapshot", "--json", "--demo"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let hosts: Vec<&str> = v["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .map(|h| h["host"].as_str().expect("name"))
        .collect();
    assert_eq!(hosts, ["gpu-a", "gpu-b", "gpu-c"]);
    assert_eq!(v["hosts"][0]["gpus"].as_array().expect("gpus").len(), 8);

    let o = env.run(&["wait", "--demo", "--hosts", "gpu-b", "--timeout", "300ms"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("gpu-b: GPU 6") && text(&o).contains("gpu-b: GPU 7"),
        "{}",
        text(&o)
    );
    let o = env.run(&[
        "wait",
        "--demo",
        "--hosts",
        "gpu-b",
        "--gpus",
        "0-5",
        "--timeout",
        "5s",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    let o = env.run(&["sweep", "--demo", "--hosts", "gpu-b", "--dry-run"]);
    let t = text(&o);
    assert!(
        t.contains("7306") && t.contains("7391") && !t.contains("  812"),
        "{t}"
    );
    let o = env.run(&[
        "sweep",
        "--demo",
        "--hosts",
        "gpu-b",
        "--yes",
        "--timeout",
        "10s",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("clean: every chosen GPU reads zero"), "{t}");
}

#[test]
fn bad_arguments_exit_2_with_a_reason() {
    let env = Env::new();
    for (args, needle) in [
        (vec!["wait", "--gpus", "x"], "--gpus"),
        (
            vec!["snapshot", "--demo", "--hosts", "gpu-z"],
            "no \"gpu-z\"",
        ),
        (vec!["snapshot", "--hosts", "a;b"], "not a host name"),
        (vec!["snapshot", "--interval", "soon"], "--interval"),
        (vec!["kill", "1", "--signal", "NOPE"], "unknown signal"),
        // A negative value reaches its parser and gets its real message, not "unexpected argument".
        (vec!["snapshot", "--interval", "-1s"], "is negative"),
        (vec!["wait", "--timeout", "-5s"], "is negative"),
        (vec!["wait", "--tolerance", "-1"], "whole number of MiB"),
        (vec!["kill", "-5"], "-5"),
        // Counts are capped where they are parsed.
        (
            vec!["wait", "--tolerance", "99999999999999"],
            "more than any GPU has",
        ),
        (vec!["snapshot", "--connect-timeout", "0"], "1..=86400"),
        (vec!["smem", "--stages", "100000"], "1..=64"),
        (vec!["wait", "--timeout", "100y"], "longer than a year"),
    ] {
        let o = env.run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(needle), "{args:?}: {}", text(&o));
    }
}

/// Two `cmd:` hosts whose commands share their first 50 characters: each demo agent is its own host.
fn twin_agents() -> (String, String) {
    let bin = env!("CARGO_BIN_EXE_gpusweep");
    let a = format!(
        "cmd:env GPUSWEEP_PADDING_FOR_A_LONG_COMMON_PREFIX=1 {bin} agent --demo --demo-host gpu-b"
    );
    let b = format!(
        "cmd:env GPUSWEEP_PADDING_FOR_A_LONG_COMMON_PREFIX=2 {bin} agent --demo --demo-host gpu-b"
    );
    (a, b)
}

#[test]
fn cmd_hosts_with_a_common_prefix_stay_two_hosts_and_a_sweep_reaches_each() {
    let env = Env::new();
    let (first, second) = twin_agents();
    let o = env.run(&["snapshot", "--json", "--hosts", &first, "--hosts", &second]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let names: Vec<&str> = v["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .map(|h| h["host"].as_str().expect("name"))
        .collect();
    assert_eq!(names.len(), 2);
    assert_ne!(names[0], names[1], "two hosts, two labels");
    assert!(
        names[0].ends_with("gpu-b") && names[0].contains("PREFIX=1"),
        "{names:?}"
    );
    // GPU 7 of each simulated gpu-b is held by its own hidden holder 7391: each must get its own signal.
    let o = env.run(&[
        "sweep",
        "--hosts",
        &first,
        "--hosts",
        &second,
        "--gpus",
        "7",
        "--yes",
        "--grace",
        "2s",
        "--timeout",
        "10s",
    ]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.matches("7391").count() >= 2,
        "both holders planned: {out}"
    );
    assert!(out.contains("clean: every chosen GPU reads zero"), "{out}");
    assert!(
        !out.contains("already gone"),
        "no request went to the wrong host: {out}"
    );
}

#[test]
fn kill_host_accepts_the_spec_as_typed() {
    let env = Env::new();
    let (a, b) = twin_agents();
    let o = env.run(&[
        "kill", "7306", "--hosts", &a, "--hosts", &b, "--host", &b, "--yes",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(
        t.contains("PREFIX=2") && t.contains("exited after TERM"),
        "{t}"
    );
    let o = env.run(&[
        "kill", "7306", "--hosts", &a, "--hosts", &b, "--host", "cmd:nope", "--yes",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn deliver_escalates_term_to_kill_on_a_process_that_ignores_term() {
    use gpusweep::act::{AuditLog, deliver};
    use gpusweep::core::signal::{Fate, Sig, SignalRequest, TargetInfo};
    let env = Env::new();
    let audit = AuditLog {
        path: Some(env.audit()),
    };
    // An ignored signal stays ignored across exec: this sleep cannot be ended by TERM.
    let mut child = Command::new("sh")
        .args(["-c", "trap '' TERM; exec sleep 300"])
        .spawn()
        .expect("sh");
    let pid = child.id();
    await_cond("the child to exec sleep", || {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
    });
    let start: u64 = stat_field(pid, 19)
        .expect("starttime")
        .parse()
        .expect("num");
    let req = SignalRequest {
        targets: vec![TargetInfo {
            pid,
            start_time: start,
            cmdline: String::new(),
        }],
        signal: Sig::Term,
        grace_ms: Some(300),
    };
    let out = deliver("local", &req, &audit);
    assert!(
        matches!(
            out[0].fate,
            Fate::Exited {
                signal: Sig::Kill,
                ..
            }
        ),
        "TERM was ignored, so KILL ended it: {out:?}"
    );
    let st = child.wait().expect("wait");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(9));
    let log = std::fs::read_to_string(env.audit()).expect("audit log");
    let signals: Vec<String> = log
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).expect("json line")["signal"].to_string()
        })
        .collect();
    assert_eq!(signals, ["\"TERM\"", "\"KILL\""], "both signals recorded");
}

// ---- the verdict: never a false "clean", never a false "leak" ----

#[test]
fn a_gpu_the_host_does_not_have_is_an_error() {
    let env = Env::new();
    let o = env.run(&[
        "wait",
        "--demo",
        "--hosts",
        "gpu-b",
        "--gpus",
        "99",
        "--timeout",
        "5s",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("no GPU 99") && t.contains("0-7"),
        "names the host's GPUs: {t}"
    );
    let o = env.run(&[
        "sweep",
        "--demo",
        "--hosts",
        "gpu-b",
        "--gpus",
        "99",
        "--dry-run",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    // A UUID names a GPU too.
    let o = env.run(&["snapshot", "--json", "--demo", "--hosts", "gpu-b"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let uuid = v["hosts"][0]["gpus"][3]["uuid"]
        .as_str()
        .expect("uuid")
        .to_string();
    let o = env.run(&[
        "wait",
        "--demo",
        "--hosts",
        "gpu-b",
        "--gpus",
        &uuid,
        "--timeout",
        "5s",
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "GPU 3 of gpu-b is clean: {}",
        text(&o)
    );
}

#[test]
fn a_gate_never_passes_without_a_driver() {
    let env = Env::new();
    // This machine has no NVIDIA driver: NVML cannot load.
    let o = env.run(&["wait", "--timeout", "5s", "--device-glob", &env.glob()]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("no NVIDIA driver"), "{t}");
    // Asked explicitly to judge by holders alone, it may pass.
    let o = env.run(&[
        "wait",
        "--timeout",
        "5s",
        "--no-nvml",
        "--device-glob",
        &env.glob(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn a_host_never_read_is_an_error_not_a_timeout() {
    let env = Env::new();
    let o = env.run(&[
        "wait",
        "--hosts",
        "cmd:exit 3",
        "--timeout",
        "1s",
        "--connect-timeout",
        "5",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn wait_takes_at_least_one_reading() {
    let agent = format!(
        "cmd:{} agent --demo --demo-host gpu-b",
        env!("CARGO_BIN_EXE_gpusweep")
    );
    let env = Env::new();
    // An agent takes milliseconds to say hello: its first reading comes after the timeout has passed.
    let o = env.run(&["wait", "--hosts", &agent, "--gpus", "0", "--timeout", "1ms"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn kill_with_kill_and_no_grace_reports_the_exit() {
    let env = Env::new();
    let mut child = Command::new("sleep").arg("300").spawn().expect("sleep");
    let pid = child.id().to_string();
    let o = env.run(&[
        "kill",
        &pid,
        "--no-nvml",
        "--signal",
        "KILL",
        "--grace",
        "0s",
        "--yes",
    ]);
    let t = text(&o);
    let _ = child.wait();
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("exited after KILL"), "{t}");
}

#[test]
fn the_audit_record_is_written_before_the_signal_or_nothing_is_sent() {
    let env = Env::new();
    let mut child = Command::new("sleep").arg("300").spawn().expect("sleep");
    let pid = child.id();
    // /dev/full opens but every write fails: the disk is full.
    let o = env
        .cmd(&["kill", &pid.to_string(), "--no-nvml", "--yes"])
        .env("GPUSWEEP_AUDIT_LOG", "/dev/full")
        .output()
        .expect("run");
    let t = text(&o);
    assert_ne!(o.status.code(), Some(0), "{t}");
    assert!(alive(pid), "no record, no signal: {t}");
    assert!(t.contains("refused") && t.contains("audit"), "{t}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_fake_name_does_not_make_a_holder_benign() {
    let env = Env::new();
    let dev = env.device();
    // argv[0] says nvidia-smi; the executable is sleep.
    let mut child = Command::new("bash")
        .args(["-c", "exec -a /opt/x/nvidia-smi sleep 300 <\"$1\"", "sh"])
        .arg(&dev)
        .spawn()
        .expect("bash");
    let pid = child.id();
    await_cond("the exec", || {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
    });
    let o = env.run(&[
        "sweep",
        "--dry-run",
        "--no-nvml",
        "--device-glob",
        &env.glob(),
    ]);
    let t = text(&o);
    let _ = child.kill();
    let _ = child.wait();
    assert!(t.contains(&format!(" {pid} ")), "planned, not benign: {t}");
}

#[test]
fn a_holder_of_control_files_only_is_not_swept() {
    let env = Env::new();
    let ctl = env.dir.path().join("nvidiactl");
    std::fs::write(&ctl, b"").expect("stand-in nvidiactl");
    let mut child = Command::new("sleep")
        .arg("300")
        .stdin(std::fs::File::open(&ctl).expect("open"))
        .spawn()
        .expect("sleep");
    let pid = child.id();
    await_cond("the holder", || {
        std::fs::read_link(format!("/proc/{pid}/fd/0")).is_ok_and(|l| l == ctl)
    });
    let o = env.run(&[
        "sweep",
        "--dry-run",
        "--no-nvml",
        "--device-glob",
        &env.glob(),
    ]);
    let t = text(&o);
    let _ = child.kill();
    let _ = child.wait();
    assert!(t.contains("plan: 0 processes"), "{t}");
    assert!(
        t.contains(&format!("skipped {pid}")) && t.contains("control"),
        "{t}"
    );
}

#[test]
fn hostile_text_never_reaches_the_terminal_raw() {
    let env = Env::new();
    let dev = env.device();
    // argv[0] with a screen clear, a title change and a forged prompt row after a newline.
    let evil = "\u{1b}[2J\u{1b}]0;pwned\u{7}x\nplan: 0 processes\u{202e}";
    let mut child = Command::new("bash")
        .args(["-c", "exec -a \"$2\" sleep 300 <\"$1\"", "sh"])
        .arg(&dev)
        .arg(evil)
        .spawn()
        .expect("bash");
    let pid = child.id();
    await_cond("the exec", || {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
    });
    for args in [
        vec!["snapshot", "--no-nvml", "--device-glob", &env.glob()],
        vec![
            "sweep",
            "--dry-run",
            "--no-nvml",
            "--device-glob",
            &env.glob(),
        ],
    ] {
        let o = env.run(&args);
        let out =
            String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
        assert!(
            !out.contains('\u{1b}') && !out.contains('\u{7}') && !out.contains('\u{202e}'),
            "{out:?}"
        );
        assert!(out.contains("\\x1b[2J"), "shown escaped: {out}");
        assert!(
            !out.lines().any(|l| l.starts_with("plan: 0 processes")),
            "a newline in a cmdline cannot forge a row: {out}"
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn out_of_file_descriptors_is_never_already_gone() {
    let env = Env::new();
    let mut kids: Vec<std::process::Child> = (0..40)
        .map(|_| Command::new("sleep").arg("300").spawn().expect("sleep"))
        .collect();
    let pids: Vec<String> = kids.iter().map(|c| c.id().to_string()).collect();
    // A soft limit far below what 40 targets need; gpusweep raises it to the hard limit at start.
    let script = format!(
        "ulimit -Sn 24; exec {} kill {} --no-nvml --yes --grace 5s",
        env!("CARGO_BIN_EXE_gpusweep"),
        pids.join(" ")
    );
    let o = Command::new("bash")
        .args(["-c", &script])
        .env("GPUSWEEP_AUDIT_LOG", env.audit())
        .env("GPUSWEEP_CONFIG", env.dir.path().join("no-config.toml"))
        .stdin(Stdio::null())
        .output()
        .expect("bash");
    let out = text(&o);
    for k in &mut kids {
        let _ = k.kill();
        let _ = k.wait();
    }
    assert!(!out.contains("already gone"), "{out}");
    assert_eq!(out.matches("exited after TERM").count(), 40, "{out}");
    assert_eq!(o.status.code(), Some(0), "{out}");
}

#[test]
fn no_terminal_and_closed_pipes_are_handled() {
    let env = Env::new();
    // The TUI with no terminal: a clear error, exit 2 (not a panic).
    let o = env.run(&["--demo"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("needs a terminal"), "{}", text(&o));
    // A reader that goes away: quiet, whatever the status.
    let script = format!(
        "{} snapshot --demo | true; echo \"status ${{PIPESTATUS[0]}}\"",
        env!("CARGO_BIN_EXE_gpusweep")
    );
    let o = Command::new("bash")
        .args(["-c", &script])
        .env("GPUSWEEP_CONFIG", env.dir.path().join("no-config.toml"))
        .output()
        .expect("bash");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("Broken pipe") && !err.contains("error"),
        "{err}"
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        !out.contains("status 2") && !out.contains("status 101"),
        "{out}"
    );
}

#[test]
fn inside_a_pid_namespace_gpusweep_says_so() {
    let env = Env::new();
    let o = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_gpusweep"))
        .args([
            "snapshot",
            "--json",
            "--no-nvml",
            "--device-glob",
            &env.glob(),
        ])
        .env("GPUSWEEP_CONFIG", env.dir.path().join("no-config.toml"))
        .output()
        .expect("unshare (util-linux) runs as root");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(
        v["hosts"][0]["in_child_pid_namespace"],
        true,
        "{}",
        text(&o)
    );
    let o = env.run(&[
        "snapshot",
        "--json",
        "--no-nvml",
        "--device-glob",
        &env.glob(),
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["hosts"][0]["in_child_pid_namespace"], false);
}
