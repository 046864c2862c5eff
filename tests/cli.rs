//! The real binary against real processes (no GPU needed) and the demo cluster.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::{BIN, alive, await_cond, stat_field, text, wedged_nvml};

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
        let mut c = Command::new(BIN);
        c.args(args)
            .env("GPUSWEEP_AUDIT_LOG", self.audit())
            .env("GPUSWEEP_CONFIG", self.dir.path().join("no-config.toml"))
            // Never a serve a developer runs: every reading here is taken in-process.
            .env("GPUSWEEP_SOCKET", self.dir.path().join("no-serve.sock"))
            .env_remove("GPUSWEEP_HOSTS")
            .stdin(Stdio::null());
        c
    }
    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run gpusweep")
    }
    /// `snapshot --json` of this host by holders alone, with the stand-in devices.
    fn local_snapshot(&self) -> Output {
        self.run(&[
            "snapshot",
            "--json",
            "--no-nvml",
            "--device-glob",
            &self.glob(),
        ])
    }
}

/// The first child of a process (its main thread's `children`), if it has one.
fn first_child(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()
        .and_then(|c| c.split_whitespace().next().and_then(|p| p.parse().ok()))
}

/// A process's start time (stat field 22), as a target names it.
fn start_time(pid: u32) -> u64 {
    stat_field(pid, 19)
        .expect("starttime")
        .parse()
        .expect("num")
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
    await_cond("reparenting", 10, || {
        stat_field(pid, 1).as_deref() == Some("1")
    });
    pid
}

/// The audit log holds no record (it may exist: it is opened before the first signal is decided).
fn no_record(env: &Env) -> bool {
    std::fs::read_to_string(env.audit()).map_or(true, |s| s.is_empty())
}

/// A sweep ends leftovers, not a live job: an orphan holding GPU 0 is ended; a launcher's live rank holding
/// GPU 1 is named as live and left alone, and the sweep reads clean (what only a live job holds is its
/// own); `--live` ends it too.
#[test]
fn a_sweep_ends_leftovers_and_leaves_a_live_job_alone() {
    let env = Env::new();
    let dev0 = env.device();
    let dev1 = env.dir.path().join("nvidia1");
    std::fs::write(&dev1, b"").expect("stand-in device");
    let orphan = orphan_holding(&dev0);
    // In a session of its own, as a job's launcher is (the test's own session holds other tests' processes).
    let mut launcher = Command::new("setsid")
        .args(["sh", "-c", "sleep 301 <\"$1\" & wait", "sh"])
        .arg(&dev1)
        .spawn()
        .expect("launcher");
    let lp = launcher.id();
    let mut rank = 0u32;
    await_cond("the live rank", 10, || {
        rank = std::fs::read_to_string(format!("/proc/{lp}/task/{lp}/children"))
            .ok()
            .and_then(|c| c.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        rank != 0
    });
    let glob = env.glob();
    let sweep = |extra: &[&str]| {
        let mut args = vec![
            "sweep",
            "--yes",
            "--no-nvml",
            "--device-glob",
            &glob,
            "--grace",
            "5s",
            "--timeout",
            "10s",
        ];
        args.extend_from_slice(extra);
        env.run(&args)
    };
    let t = crate::support::exited(&sweep(&[]), 0);
    assert!(
        t.contains(&format!("{orphan} sleep 300: exited after TERM")),
        "{t}"
    );
    assert!(
        t.lines()
            .any(|l| l.trim_start().starts_with("live") && l.contains(&format!(" {rank}:"))),
        "the live rank named as such: {t}"
    );
    assert!(!alive(orphan), "{t}");
    assert!(
        alive(rank),
        "a live job's rank ended by a sweep of leftovers: {t}"
    );
    let t = crate::support::exited(&sweep(&["--live"]), 0);
    assert!(
        t.contains(&format!("{rank} sleep 301: exited after TERM")),
        "{t}"
    );
    let _ = launcher.kill();
    let _ = launcher.wait();
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
    let t = crate::support::exited(&o, 0);
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
    await_cond("the zombie", 10, || {
        stat_field(zpid, 0).as_deref() == Some("Z")
    });
    let o = env.local_snapshot();
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
    crate::support::exited(&o, 1);
    assert!(
        text(&o).contains("refused: PID 1 is never signalled"),
        "{}",
        text(&o)
    );

    let me = std::process::id().to_string();
    let o = env.run(&["kill", &me, "--yes", "--no-nvml", "--signal", "KILL"]);
    crate::support::exited(&o, 1);
    assert!(
        text(&o).contains("an ancestor of gpusweep is never signalled"),
        "{}",
        text(&o)
    );

    let mut victim = Command::new("sleep").arg("300").spawn().expect("sleep");
    let o = env.run(&["kill", &victim.id().to_string(), "--no-nvml"]);
    crate::support::exited(&o, 2);
    assert!(text(&o).contains("refusing without --yes"), "{}", text(&o));
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
    crate::support::exited(&o, 0);
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
    let start = start_time(pid);
    // The PID now names a process that started at another time: exactly what a reused PID looks like.
    let stale = SignalRequest {
        targets: vec![TargetInfo {
            pid,
            start_time: start + 1,
            cmdline: "old".into(),
            pidfs_ino: None,
        }],
        signal: Sig::Kill,
        grace_ms: None,
        purpose: None,
    };
    let out = deliver("local", &stale, &audit, false);
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
            pidfs_ino: None,
        }],
        signal: Sig::Term,
        grace_ms: Some(5000),
        purpose: None,
    };
    let out = deliver("local", &ok, &audit, false);
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
    let start = start_time(pid);
    let audit = AuditLog {
        path: Some(PathBuf::from("/proc/version/actions.jsonl")),
    };
    let req = SignalRequest {
        targets: vec![TargetInfo {
            pid,
            start_time: start,
            cmdline: String::new(),
            pidfs_ino: None,
        }],
        signal: Sig::Kill,
        grace_ms: None,
        purpose: None,
    };
    let out = deliver("local", &req, &audit, false);
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
    assert_eq!(
        o.status.code(),
        Some(1),
        "a tile that does not fit exits 1: {t}"
    );
    assert!(
        t.contains("does NOT fit") && t.contains("98,320") && t.contains("101,376"),
        "{t}"
    );
    // Capabilities as people write them, dtypes in any case.
    for cc in ["12", "sm120", "sm_120a"] {
        let o = env.run(&[
            "smem",
            "--tile",
            "128x256x128",
            "--dtype",
            "BF16",
            "--cc",
            cc,
        ]);
        assert_eq!(o.status.code(), Some(1), "{cc}: {}", text(&o));
        assert!(text(&o).contains("CC 12.0"), "{cc}: {}", text(&o));
    }
    let o = env.run(&["smem", "--tile", "128x256x128", "--cc", "sm_90"]);
    crate::support::exited(&o, 0);
    assert!(
        text(&o).contains("no room for another stage"),
        "{}",
        text(&o)
    );
    let o = env.run(&["smem", "--stages", "65", "--cc", "9.0"]);
    assert_eq!(o.status.code(), Some(2), "stages are capped: {}", text(&o));
    let o = env.run(&["smem", "--json", "--cc", "9.0"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert!(v["rows"][0]["gpus"].is_array(), "{v}");
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
    assert_eq!(hosts, ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]);
    assert_eq!(v["hosts"][0]["gpus"].as_array().expect("gpus").len(), 8);

    let o = env.run(&["wait", "--demo", "--hosts", "gpu-b", "--timeout", "300ms"]);
    crate::support::exited(&o, 1);
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
    crate::support::exited(&o, 0);

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
    let t = crate::support::exited(&o, 0);
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
        // A simulated host asked for without the demo is not this host read silently.
        (vec!["agent", "--demo-host", "gpu-a"], "needs --demo"),
    ] {
        let o = env.run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(needle), "{args:?}: {}", text(&o));
    }
}

/// Two `cmd:` hosts whose commands share their first 50 characters: each demo agent is its own host.
fn twin_agents() -> (String, String) {
    let a = format!(
        "cmd:env GPUSWEEP_PADDING_FOR_A_LONG_COMMON_PREFIX=1 {BIN} agent --demo --demo-host gpu-b"
    );
    let b = format!(
        "cmd:env GPUSWEEP_PADDING_FOR_A_LONG_COMMON_PREFIX=2 {BIN} agent --demo --demo-host gpu-b"
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
    let out = crate::support::exited(&o, 0);
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
    let t = crate::support::exited(&o, 0);
    assert!(
        t.contains("PREFIX=2") && t.contains("exited after TERM"),
        "{t}"
    );
    let o = env.run(&[
        "kill", "7306", "--hosts", &a, "--hosts", &b, "--host", "cmd:nope", "--yes",
    ]);
    crate::support::exited(&o, 2);
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
    await_cond("the child to exec sleep", 10, || {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
    });
    let start = start_time(pid);
    let req = SignalRequest {
        targets: vec![TargetInfo {
            pid,
            start_time: start,
            cmdline: String::new(),
            pidfs_ino: None,
        }],
        signal: Sig::Term,
        grace_ms: Some(300),
        purpose: None,
    };
    let out = deliver("local", &req, &audit, false);
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
    let t = crate::support::exited(&o, 2);
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
    crate::support::exited(&o, 2);
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
    let t = crate::support::exited(&o, 2);
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
    crate::support::exited(&o, 0);
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
    crate::support::exited(&o, 2);
}

#[test]
fn wait_takes_at_least_one_reading() {
    let agent = format!("cmd:{BIN} agent --demo --demo-host gpu-b");
    let env = Env::new();
    // An agent takes milliseconds to say hello: its first reading comes after the timeout has passed.
    let o = env.run(&["wait", "--hosts", &agent, "--gpus", "0", "--timeout", "1ms"]);
    crate::support::exited(&o, 0);
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
    await_cond("the exec", 10, || {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
    });
    // A live process no finding names: planned where live processes are asked for.
    let o = env.run(&[
        "sweep",
        "--dry-run",
        "--live",
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
    await_cond("the holder", 10, || {
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
    await_cond("the exec", 10, || {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
    });
    for args in [
        vec!["snapshot", "--no-nvml", "--device-glob", &env.glob()],
        vec![
            "sweep",
            "--dry-run",
            "--live",
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
        BIN,
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
    crate::support::exited(&o, 2);
    assert!(text(&o).contains("needs a terminal"), "{}", text(&o));
    // A reader that goes away: quiet, whatever the status.
    let script = format!("{BIN} snapshot --demo | true; echo \"status ${{PIPESTATUS[0]}}\"");
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
        .arg(BIN)
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
    let o = env.local_snapshot();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["hosts"][0]["in_child_pid_namespace"], false);

    // From the host, a holder inside a container's PID namespace is named by both its PIDs (NSpid).
    let dev = env.device();
    let mut boxed = Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--kill-child",
            "sh",
            "-c",
            "exec sleep 300 <\"$0\"",
        ])
        .arg(&dev)
        .spawn()
        .expect("unshare");
    let unshare = boxed.id();
    let mut inner = None;
    await_cond("the boxed holder", 10, || {
        inner = first_child(unshare)
            .filter(|p| std::fs::read_link(format!("/proc/{p}/fd/0")).is_ok_and(|l| l == dev));
        inner.is_some()
    });
    let holder = inner.expect("holder");
    let o = env.local_snapshot();
    let _ = boxed.kill();
    let _ = boxed.wait();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let p = v["hosts"][0]["processes"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["pid"] == holder))
        .unwrap_or_else(|| panic!("the holder {holder} is listed: {v}"))
        .clone();
    assert_eq!(p["ns_pid"], 1, "PID 1 of its namespace: {p}");
}

/// Four gpusweep processes signalling at once into one audit log: every line is one whole record. The
/// records are long (a 3 KB command line each) so that a record written in pieces would show.
#[test]
fn four_killers_sharing_one_audit_log_never_interleave() {
    let env = Env::new();
    let name = "x".repeat(3000);
    let mut children: Vec<std::process::Child> = (0..80)
        .map(|_| {
            Command::new("bash")
                .args(["-c", "exec -a \"$1\" sleep 300", "bash", &name])
                .spawn()
                .expect("sleep")
        })
        .collect();
    let pids: Vec<String> = children.iter().map(|c| c.id().to_string()).collect();
    await_cond("80 renamed sleeps", 10, || {
        children.iter().all(|c| {
            std::fs::read(format!("/proc/{}/cmdline", c.id()))
                .is_ok_and(|b| b.starts_with(name.as_bytes()))
        })
    });
    let killers: Vec<std::process::Child> = pids
        .chunks(20)
        .map(|chunk| {
            let mut args = vec!["kill", "--no-nvml", "--yes"];
            args.extend(chunk.iter().map(String::as_str));
            env.cmd(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("gpusweep kill")
        })
        .collect();
    for mut k in killers {
        assert_eq!(k.wait().expect("wait").code(), Some(0));
    }
    for c in &mut children {
        let _ = c.wait();
    }
    let log = std::fs::read_to_string(env.audit()).expect("audit log");
    let records: Vec<serde_json::Value> = log
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("a broken record ({e}): {l:.80}"))
        })
        .collect();
    assert_eq!(records.len(), 80, "one record per signal");
    let mut seen: Vec<u64> = records
        .iter()
        .map(|r| {
            assert_eq!(
                r["cmdline"].as_str().map(str::len),
                Some(3000 + " 300".len())
            );
            r["pid"].as_u64().expect("pid")
        })
        .collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 80);
}

/// A seccomp filter that answers ENOSYS to pidfd_open and pidfd_send_signal, as on a 4.18 kernel.
#[cfg(target_arch = "x86_64")]
fn without_pidfd(c: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    const LD_ABS_W: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let filter: [libc::sock_filter; 7] = [
        op(LD_ABS_W, 0, 0, 4),               // seccomp_data.arch
        op(JEQ_K, 0, 3, AUDIT_ARCH_X86_64),  // another ABI: allow
        op(LD_ABS_W, 0, 0, 0),               // seccomp_data.nr
        op(JEQ_K, 2, 0, 434),                // pidfd_open
        op(JEQ_K, 1, 0, 424),                // pidfd_send_signal
        op(RET_K, 0, 0, 0x7fff_0000),        // SECCOMP_RET_ALLOW
        op(RET_K, 0, 0, 0x0005_0000 | 0x26), // SECCOMP_RET_ERRNO | ENOSYS
    ];
    // SAFETY: between fork and exec the closure only calls prctl, which is async-signal-safe; the filter
    // lives on this stack frame's copy in the child, which outlives both calls.
    #[allow(unsafe_code)]
    unsafe {
        c.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: 7,
                filter: filter.as_ptr().cast_mut(),
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &raw const prog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_kernel_without_pidfd_disables_kills_unless_the_operator_opts_in() {
    let env = Env::new();
    let mut child = Command::new("sleep").arg("300").spawn().expect("sleep");
    let pid = child.id();
    let o = without_pidfd(&mut env.cmd(&["kill", &pid.to_string(), "--no-nvml", "--yes"]))
        .output()
        .expect("run");
    let t = text(&o);
    assert_ne!(o.status.code(), Some(0), "{t}");
    assert!(
        t.contains("this kernel has no pidfd; kills are disabled"),
        "{t}"
    );
    assert!(
        t.contains("--kill-without-pidfd"),
        "the way out is named: {t}"
    );
    assert!(alive(pid), "{t}");
    assert!(no_record(&env), "nothing sent, nothing logged");

    let dev = env.device();
    let o = without_pidfd(&mut env.cmd(&[
        "snapshot",
        "--json",
        "--no-nvml",
        "--device-glob",
        &env.glob(),
    ]))
    .output()
    .expect("run");
    let _ = dev;
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    let missing = &v["hosts"][0]["missing_features"];
    assert!(
        missing
            .as_array()
            .is_some_and(|a| a.iter().any(|f| f == "pidfd")),
        "{missing}"
    );

    let o = without_pidfd(&mut env.cmd(&[
        "kill",
        &pid.to_string(),
        "--no-nvml",
        "--yes",
        "--grace",
        "5s",
        "--kill-without-pidfd",
    ]))
    .output()
    .expect("run");
    let t = text(&o);
    let _ = child.wait();
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("exited after TERM"), "{t}");
    let log = std::fs::read_to_string(env.audit()).expect("audit log");
    let rec: serde_json::Value =
        serde_json::from_str(log.lines().next().expect("a record")).expect("json");
    assert_eq!(rec["pid"], pid);
    assert!(
        rec["method"]
            .as_str()
            .is_some_and(|m| m.contains("kill(2)")),
        "{rec}"
    );
}

#[test]
fn a_pid_reused_within_one_tick_is_told_apart_by_its_pidfs_inode() {
    use gpusweep::act::{AuditLog, deliver};
    use gpusweep::core::signal::{Fate, Sig, SignalRequest, TargetInfo};
    let env = Env::new();
    let audit = AuditLog {
        path: Some(env.audit()),
    };
    let mut child = Command::new("sleep").arg("300").spawn().expect("sleep");
    let pid = child.id();
    let start = start_time(pid);
    let target = |pidfs_ino| SignalRequest {
        targets: vec![TargetInfo {
            pid,
            start_time: start,
            cmdline: String::new(),
            pidfs_ino,
        }],
        signal: Sig::Term,
        grace_ms: Some(5000),
        purpose: None,
    };
    // Same PID, same start tick, another pidfs inode: another process.
    let out = deliver("local", &target(Some(1)), &audit, false);
    assert!(
        matches!(&out[0].fate, Fate::Refused { reason } if reason.contains("pidfs inode")),
        "this kernel (6.9+) has pidfs: {out:?}"
    );
    assert!(child.try_wait().expect("try_wait").is_none());
    assert!(no_record(&env));
    // Without a known inode, delivery records the one it pinned.
    let out = deliver("local", &target(None), &audit, false);
    let _ = child.wait();
    assert!(matches!(out[0].fate, Fate::Exited { .. }), "{out:?}");
    let log = std::fs::read_to_string(env.audit()).expect("audit log");
    let rec: serde_json::Value =
        serde_json::from_str(log.lines().next().expect("a record")).expect("json");
    assert!(rec["pidfs_ino"].as_u64().is_some_and(|i| i > 1), "{rec}");
    assert_eq!(rec["method"], "pidfd");
}

/// A cgroup v1 freezer group (this machine's hybrid layout has one): its frozen members sleep in state D,
/// and a KILL stays pending until they are thawed, exactly like a process stuck in a hung read.
struct Frozen(PathBuf);

impl Frozen {
    fn new(pid: u32) -> Frozen {
        let root = Path::new("/sys/fs/cgroup/freezer");
        assert!(
            root.join("freezer.state").exists() || root.join("cgroup.procs").exists(),
            "this test needs the cgroup v1 freezer at {} (the CI machine has it)",
            root.display()
        );
        let dir = root.join(format!("gpusweep-test-{pid}"));
        std::fs::create_dir_all(&dir).expect("freezer group");
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).expect("move in");
        std::fs::write(dir.join("freezer.state"), "FROZEN").expect("freeze");
        await_cond("frozen", 10, || stat_field(pid, 0).as_deref() == Some("D"));
        Frozen(dir)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("freezer.state"), "THAWED");
        let t = Instant::now();
        while std::fs::remove_dir(&self.0).is_err() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[test]
fn a_holder_in_state_d_is_reported_as_unkillable_with_its_wchan() {
    let env = Env::new();
    let dev = env.device();
    let pid = orphan_holding(&dev);
    let frozen = Frozen::new(pid);
    let o = env.local_snapshot();
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    let f = v["hosts"][0]["findings"]
        .as_array()
        .and_then(|a| a.iter().find(|f| f["kind"] == "unkillable"))
        .unwrap_or_else(|| panic!("no unkillable finding: {v}"))
        .clone();
    assert_eq!(f["pid"], pid);
    let detail = f["detail"].as_str().expect("detail");
    assert!(
        detail.contains("state D") && detail.contains("waiting in "),
        "{detail}"
    );
    let proc = v["hosts"][0]["processes"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["pid"] == pid))
        .expect("the holder is listed")
        .clone();
    assert!(
        proc["wchan"].as_str().is_some_and(|w| !w.is_empty()),
        "{proc}"
    );

    let o = env.run(&[
        "kill",
        &pid.to_string(),
        "--no-nvml",
        "--signal",
        "KILL",
        "--grace",
        "0s",
        "--yes",
    ]);
    let t = text(&o);
    assert_ne!(o.status.code(), Some(0), "it did not die: {t}");
    assert!(
        t.contains("cannot die yet: in state D") && t.contains("waiting in "),
        "{t}"
    );
    drop(frozen);
    // Thawed, the pending KILL takes effect.
    await_cond("the pending KILL", 10, || !alive(pid));
}

#[test]
fn a_wedged_driver_marks_its_gpu_and_the_rest_goes_on() {
    let env = Env::new();
    let lib = wedged_nvml(env.dir.path());
    let started = Instant::now();
    let o = env
        .cmd(&["snapshot", "--json", "--device-glob", &env.glob()])
        .env("GPUSWEEP_NVML_LIBRARY", &lib)
        .output()
        .expect("run");
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    let gpus = v["hosts"][0]["gpus"].as_array().expect("gpus").clone();
    assert_eq!(gpus.len(), 2, "{v}");
    assert_eq!(gpus[0]["memory"]["used"], 0, "GPU 0 answers: {v}");
    assert!(gpus[1]["memory"]["used"].is_null(), "unknown, never 0: {v}");
    assert!(
        gpus[1]["error"]
            .as_str()
            .is_some_and(|e| e.contains("driver not answering")),
        "{v}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "snapshot returned although the driver never does"
    );
    // A gate on the wedged GPU is an error, not a pass and not "still held"; on GPU 0 alone it passes.
    let o = env
        .cmd(&["wait", "--timeout", "1s", "--device-glob", &env.glob()])
        .env("GPUSWEEP_NVML_LIBRARY", &lib)
        .output()
        .expect("run");
    let t = crate::support::exited(&o, 2);
    assert!(t.contains("driver not answering"), "{t}");
    let o = env
        .cmd(&[
            "wait",
            "--gpus",
            "0",
            "--timeout",
            "1s",
            "--device-glob",
            &env.glob(),
        ])
        .env("GPUSWEEP_NVML_LIBRARY", &lib)
        .output()
        .expect("run");
    crate::support::exited(&o, 0);
}

#[test]
fn a_zombie_adopted_by_a_pid_1_that_never_reaps_is_not_promised_a_reaping() {
    let env = Env::new();
    // A PID namespace whose PID 1 is `sleep`: the orphaned `sleep 0.2` becomes its zombie, forever.
    let mut boxed = Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            "sh",
            "-c",
        ])
        .arg("(sleep 0.2 &); exec sleep 300")
        .spawn()
        .expect("unshare");
    let unshare = boxed.id();
    let mut init = None;
    await_cond("the namespace's zombie", 10, || {
        init = first_child(unshare);
        init.is_some_and(|i| {
            first_child(i).is_some_and(|z| stat_field(z, 0).as_deref() == Some("Z"))
        })
    });
    let init = init.expect("init");
    let o = Command::new("nsenter")
        .args(["--target", &init.to_string(), "--pid", "--mount"])
        .arg(BIN)
        .args([
            "snapshot",
            "--json",
            "--no-nvml",
            "--device-glob",
            &env.glob(),
        ])
        .env("GPUSWEEP_CONFIG", env.dir.path().join("no-config.toml"))
        .output()
        .expect("nsenter (util-linux)");
    let _ = boxed.kill();
    let _ = boxed.wait();
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    let f = v["hosts"][0]["findings"]
        .as_array()
        .and_then(|a| a.iter().find(|f| f["kind"] == "zombie"))
        .unwrap_or_else(|| panic!("no zombie finding: {v}"))
        .clone();
    let detail = f["detail"].as_str().expect("detail");
    assert!(
        detail.contains("PID 1 (sleep)") && detail.contains("not an init gpusweep knows"),
        "{detail}"
    );
    assert!(!detail.contains("will reap"), "{detail}");
}

#[test]
fn key_conflicts_in_the_config_are_refused_by_every_subcommand() {
    let env = Env::new();
    let cfg = env.dir.path().join("keys.toml");
    for (conf, want) in [
        ("[keys]\nkill = \"q\"\n", "already quit's"),
        ("[keys]\nkill = \"x\"\nsweep = \"x\"\n", "already"),
    ] {
        std::fs::write(&cfg, conf).expect("config");
        for args in [&["snapshot", "--demo"][..], &["smem", "--cc", "9.0"][..]] {
            let o = env
                .cmd(args)
                .env("GPUSWEEP_CONFIG", &cfg)
                .output()
                .expect("run");
            let t = text(&o);
            assert_eq!(o.status.code(), Some(2), "{args:?} {conf}: {t}");
            assert!(t.contains(want) && t.contains("[keys]"), "{t}");
        }
    }
    // Moving quit elsewhere frees q.
    std::fs::write(&cfg, "[keys]\nkill = \"q\"\nquit = \"Q\"\n").expect("config");
    let o = env
        .cmd(&["snapshot", "--demo"])
        .env("GPUSWEEP_CONFIG", &cfg)
        .output()
        .expect("run");
    crate::support::exited(&o, 0);
}

#[test]
fn help_shows_a_subcommands_own_flags_first_then_global_and_ssh_headings() {
    let env = Env::new();
    for sub in ["sweep", "wait", "kill", "snapshot", "smem"] {
        let o = env
            .cmd(&[sub, "--help"])
            .env("COLUMNS", "80")
            .output()
            .expect("run");
        let t = text(&o);
        let (own, global, ssh) = (
            t.find("Options:").expect("own options"),
            t.find("Global options:")
                .unwrap_or_else(|| panic!("{sub}: {t}")),
            t.find("SSH options:")
                .unwrap_or_else(|| panic!("{sub}: {t}")),
        );
        assert!(own < global && global < ssh, "{sub}: {t}");
        let hosts = t.find("--hosts <HOSTS>").expect("--hosts");
        assert!(
            hosts > global && hosts < ssh,
            "{sub}: --hosts under Global options: {t}"
        );
        assert!(
            t.lines().all(|l| l.chars().count() <= 80),
            "{sub}: wider than 80: {t}"
        );
    }
}

/// A process with `path` open on fd 3, until it is killed.
fn holding_open(path: &Path) -> std::process::Child {
    let c = Command::new("sh")
        .args(["-c", "exec 3<\"$1\"; exec sleep 300", "sh"])
        .arg(path)
        .spawn()
        .expect("sh");
    let fd = PathBuf::from(format!("/proc/{}/fd/3", c.id()));
    await_cond("the fd to be open", 10, || {
        std::fs::read_link(&fd).is_ok_and(|t| t == path)
    });
    c
}

#[test]
fn shm_clean_removes_only_unused_plain_files_each_recorded_first() {
    let env = Env::new();
    let shm = env.dir.path().join("shm");
    std::fs::create_dir(&shm).expect("dir");
    let unused = shm.join("nccl-unused");
    let open = shm.join("nccl-open");
    let keep = env.dir.path().join("keep");
    std::fs::write(&unused, vec![0u8; 4096]).expect("write");
    std::fs::write(&open, b"x").expect("write");
    std::fs::write(&keep, b"x").expect("write");
    std::fs::write(shm.join("unrelated.txt"), b"x").expect("write");
    std::os::unix::fs::symlink(&keep, shm.join("nccl-link")).expect("ln");
    let mut holder = holding_open(&open);
    let dir = shm.display().to_string();
    let base = ["shm", "clean", "--no-nvml", "--shm-dir", dir.as_str()];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter().chain(extra).map(|s| (*s).to_string()).collect()
    };
    let run = |args: Vec<String>| env.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let o = run(with(&["--dry-run"]));
    let t = crate::support::exited(&o, 0);
    assert!(t.contains("nccl-unused") && t.contains("dry run"), "{t}");
    assert!(
        !t.contains("nccl-open") && !t.contains("nccl-link"),
        "only unused plain files: {t}"
    );
    let o = run(with(&[]));
    assert_eq!(
        o.status.code(),
        Some(2),
        "no terminal, no --yes: {}",
        text(&o)
    );
    let mut ro = with(&["--yes"]);
    ro.push("--readonly".into());
    let o = run(ro);
    crate::support::exited(&o, 2);
    assert!(text(&o).contains("read-only"), "{}", text(&o));
    assert!(unused.exists() && no_record(&env));
    let o = run(with(&["--yes"]));
    let t = crate::support::exited(&o, 0);
    assert!(
        t.contains(&format!("removed {dir}/nccl-unused")),
        "the directory it read, never /dev/shm: {t}"
    );
    assert!(!unused.exists());
    assert!(open.exists() && keep.exists() && shm.join("nccl-link").exists());
    assert!(shm.join("unrelated.txt").exists());
    let log = std::fs::read_to_string(env.audit()).expect("audit log");
    let rec: serde_json::Value =
        serde_json::from_str(log.lines().next().expect("a record")).expect("json");
    assert_eq!(rec["action"], "remove");
    assert!(
        rec["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("nccl-unused")),
        "{rec}"
    );
    assert!(rec["ino"].as_u64().is_some(), "{rec}");
    assert_eq!(log.lines().count(), 1, "{log}");
    // Once its user is gone, the file that was open is a leftover too; an agent removes it on its host.
    holder.kill().expect("kill");
    holder.wait().expect("wait");
    let agent = format!("cmd:{BIN} agent --no-nvml --shm-dir {dir}");
    let o = env.run(&["shm", "clean", "--hosts", &agent, "--yes"]);
    let t = crate::support::exited(&o, 0);
    assert!(t.contains(&format!("removed {dir}/nccl-open")), "{t}");
    assert!(!open.exists() && keep.exists());
}

#[test]
fn readonly_refuses_kills_and_sweeps_before_reading_anything() {
    let env = Env::new();
    let o = env.run(&["kill", "--readonly", "--yes", "4242"]);
    crate::support::exited(&o, 2);
    assert!(text(&o).contains("read-only"), "{}", text(&o));
    let cfg = env.dir.path().join("ro.toml");
    std::fs::write(&cfg, "readonly = true\n").expect("config");
    let o = env.run(&[
        "sweep",
        "--demo",
        "--yes",
        "--config",
        cfg.to_str().expect("utf-8"),
    ]);
    crate::support::exited(&o, 2);
    let o = env.run(&[
        "sweep",
        "--demo",
        "--dry-run",
        "--config",
        cfg.to_str().expect("utf-8"),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "a dry run stays allowed: {}",
        text(&o)
    );
    assert!(no_record(&env));
}

#[test]
fn signals_out_of_range_and_unsent_say_so() {
    let env = Env::new();
    let o = env.run(&["kill", "--signal", "99", "5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("out of range: Linux signals are 1 to 64"),
        "{}",
        text(&o)
    );
    let o = env.run(&["kill", "--signal", "17", "5"]);
    assert!(text(&o).contains("not one gpusweep sends"), "{}", text(&o));
}

#[test]
fn help_fits_80_columns_every_flag_is_described_and_completions_and_man_are_generated() {
    let env = Env::new();
    for sub in [
        vec!["--help"],
        vec!["snapshot", "--help"],
        vec!["wait", "--help"],
        vec!["sweep", "--help"],
        vec!["kill", "--help"],
        vec!["smem", "--help"],
        vec!["shm", "clean", "--help"],
        vec!["run", "--help"],
        vec!["epilog", "--help"],
        vec!["prolog", "--help"],
        vec!["agent", "--help"],
    ] {
        let o = env.cmd(&sub).env("COLUMNS", "80").output().expect("run");
        let t = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(o.status.success(), "{sub:?}: {t}");
        for l in t.lines() {
            assert!(
                l.chars().count() <= 80,
                "{sub:?}: a line past 80 columns: {l:?}"
            );
            let flag = l.trim_start();
            // A flag line of the short help: the flag, then its description on the same line.
            if flag.starts_with('-')
                && l.starts_with("  ")
                && !l.starts_with("          ")
                && sub.len() > 1
            {
                assert!(
                    flag.split("  ").filter(|p| !p.trim().is_empty()).count() >= 2,
                    "{sub:?}: no description: {l:?}"
                );
            }
            assert!(
                !l.contains("Default") || !l.contains("[default:"),
                "{sub:?}: {l:?}"
            );
        }
    }
    let o = env.run(&["--help"]);
    let t = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        t.contains("  unkillable ")
            && t.contains("129/130/143")
            && t.contains("  3  `run --fail-fast`"),
        "{t}"
    );
    let o = env.run(&["completions", "bash"]);
    let t = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success() && t.contains("--readonly") && t.contains("shm"),
        "{t}"
    );
    let o = env.run(&["man"]);
    let t = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success() && t.contains(".TH gpusweep"), "{t}");
}

#[test]
fn a_job_that_names_no_process_is_an_error_not_a_pass() {
    let env = Env::new();
    for args in [
        &["wait", "--demo", "--job", "nosuchjob", "--timeout", "2s"][..],
        &[
            "sweep",
            "--demo",
            "--job",
            "nosuchjob",
            "--yes",
            "--grace",
            "1s",
            "--timeout",
            "2s",
        ][..],
    ] {
        let o = env.run(args);
        let t = text(&o);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{args:?}: a typo passes no gate: {t}"
        );
        assert!(t.contains("nosuchjob") && t.contains("no process"), "{t}");
    }
    // A container or pod ID is named by 4 characters or more, as the help says.
    let o = env.run(&["wait", "--demo", "--job", "4f1", "--timeout", "2s"]);
    let t = crate::support::exited(&o, 2);
    assert!(t.contains("4 characters"), "{t}");
    // The demo's Slurm job 4711 holds GPUs 6 and 7 of gpu-b: named, it is waited for.
    let o = env.run(&["wait", "--demo", "--job", "4711", "--timeout", "1s"]);
    crate::support::exited(&o, 1);
}

#[test]
fn killing_a_zombie_says_it_is_dead_and_names_its_parent() {
    let env = Env::new();
    // This test process is the parent, and it does not wait() until the end: a real zombie.
    let mut child = Command::new("true").spawn().expect("spawn");
    let zpid = child.id();
    await_cond("the zombie", 10, || {
        stat_field(zpid, 0).as_deref() == Some("Z")
    });
    let o = env.run(&["kill", &zpid.to_string(), "--yes", "--no-nvml"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "nothing was ended: {t}");
    assert!(!t.contains("sent TERM"), "{t}");
    assert!(
        t.contains("zombie") && t.contains(&std::process::id().to_string()),
        "says what it is and who must reap it: {t}"
    );
    let _ = child.wait();
}

/// A process that maps each of `segments` and closes its fd (as NCCL does), and maps `other` too: only the
/// mappings say it uses them.
const MAP_AND_CLOSE: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
for arg in sys.argv[1:]:
    fd = os.open(bytes.fromhex(arg), os.O_RDWR)
    # PROT_READ|PROT_WRITE, MAP_SHARED; Python's own mmap would keep a copy of the fd.
    if libc.mmap(None, 4096, 3, 1, fd, 0) in (None, ctypes.c_void_p(-1).value):
        sys.exit("mmap failed")
    os.close(fd)
print("ready", flush=True)
sys.stdin.read()
"#;

#[test]
fn shm_clean_keeps_every_mapped_segment_whatever_its_name() {
    let env = Env::new();
    let shm = env.dir.path().join("shm");
    std::fs::create_dir(&shm).expect("dir");
    let mk = |name: &std::ffi::OsStr| {
        let p = shm.join(name);
        std::fs::write(&p, vec![0u8; 4096]).expect("write");
        p
    };
    use std::os::unix::ffi::OsStrExt;
    // Names that a path-text match of /proc/PID/maps gets wrong: a newline (maps writes it as \012), a name
    // that ends in " (deleted)", and a plain one mapped by a process that also maps a non-UTF-8 path.
    let newline = mk(std::ffi::OsStr::new("nccl-new\nline"));
    let deleted = mk(std::ffi::OsStr::new("nccl-x (deleted)"));
    let plain = mk(std::ffi::OsStr::new("nccl-plain"));
    let odd = env
        .dir
        .path()
        .join(std::ffi::OsStr::from_bytes(b"odd-\xff"));
    std::fs::write(&odd, vec![0u8; 4096]).expect("write");
    let free = mk(std::ffi::OsStr::new("nccl-free"));
    // An unused one whose name is not UTF-8: removed like any other, not "already gone".
    let bad = mk(std::ffi::OsStr::from_bytes(b"nccl-bad-\xff"));
    let hex = |p: &Path| {
        p.as_os_str()
            .as_bytes()
            .iter()
            .fold(String::new(), |mut s, b| {
                use std::fmt::Write;
                let _ = write!(s, "{b:02x}");
                s
            })
    };
    let mut user = Command::new("/usr/bin/python3")
        .args(["-c", MAP_AND_CLOSE])
        .args([hex(&newline), hex(&deleted), hex(&odd), hex(&plain)])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(user.stdout.take().expect("stdout")),
        &mut ready,
    )
    .expect("ready");
    assert_eq!(ready.trim(), "ready");
    let dir = shm.display().to_string();
    let o = env.run(&["shm", "clean", "--no-nvml", "--shm-dir", &dir, "--yes"]);
    let t = text(&o);
    assert!(!free.exists(), "the unused one is removed: {t}");
    assert!(!bad.exists(), "the non-UTF-8 one is removed: {t}");
    assert!(
        !t.contains("/dev/shm"),
        "the directory it read is named: {t}"
    );
    assert_eq!(o.status.code(), Some(0), "{t}");
    for p in [&newline, &deleted, &plain] {
        assert!(
            p.exists(),
            "{} is mapped by {} and was removed: {t}",
            p.display(),
            user.id()
        );
    }
    drop(user.stdin.take());
    let _ = user.wait();
}

/// A tmpfs of 64 KiB mounted on `dir/full` for one test, unmounted when dropped.
struct TinyFs(PathBuf);

impl TinyFs {
    fn mount(dir: &Path) -> TinyFs {
        let at = dir.join("full");
        std::fs::create_dir(&at).expect("mkdir");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(&at)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "mounting a tmpfs needs root (scripts/test.sh runs the suite as root)"
        );
        TinyFs(at)
    }
}

impl Drop for TinyFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_leaves_no_torn_audit_record_and_no_signal() {
    let env = Env::new();
    let fs = TinyFs::mount(env.dir.path());
    let log = fs.0.join("actions.jsonl");
    // Earlier records fill most of one page; then the disk is filled: the next record fits only in part.
    // 50 bytes short of a page: a record (some 300 bytes) can only be written in part.
    let mut pad = String::new();
    for i in 0..39 {
        pad.push_str(&format!("{{\"pad\":{i},\"x\":\"{}\"}}\n", "x".repeat(80)));
    }
    let rest = 4096 - 50 - pad.len() - "{\"pad\":\"\"}\n".len();
    pad.push_str(&format!("{{\"pad\":\"{}\"}}\n", "y".repeat(rest)));
    std::fs::write(&log, &pad).expect("earlier records");
    let mut filler = std::fs::File::create(fs.0.join("filler")).expect("filler");
    while std::io::Write::write_all(&mut filler, &[0u8; 4096]).is_ok() {}
    drop(filler);
    let mut victim = Command::new("sleep").arg("300").spawn().expect("sleep");
    let pid = victim.id().to_string();
    let o = env
        .cmd(&["kill", &pid, "--yes", "--no-nvml"])
        .env("GPUSWEEP_AUDIT_LOG", &log)
        .output()
        .expect("kill");
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "no record, no signal: {t}");
    assert!(alive(victim.id()), "signalled without its record: {t}");
    let after = std::fs::read_to_string(&log).expect("log");
    assert!(
        after == pad,
        "the torn record was not rolled back: {:?} ({t})",
        after.get(pad.len().min(after.len())..)
    );
    // Room again: the record is written whole, after the earlier ones, and the signal sent.
    std::fs::remove_file(fs.0.join("filler")).expect("rm");
    let o = env
        .cmd(&["kill", &pid, "--yes", "--no-nvml"])
        .env("GPUSWEEP_AUDIT_LOG", &log)
        .output()
        .expect("kill");
    crate::support::exited(&o, 0);
    let after = std::fs::read_to_string(&log).expect("log");
    for line in after.lines() {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("a line that is not a record ({e}): {line:?}"));
    }
    let _ = victim.wait();
}

#[test]
fn events_are_written_by_every_command_that_reads_hosts_not_only_the_tui() {
    let env = Env::new();
    let file = env.dir.path().join("events.jsonl");
    let f = file.to_str().expect("utf-8");
    let mut victim = Command::new("sleep").arg("300").spawn().expect("sleep");
    let pid = victim.id().to_string();
    let o = env.run(&["kill", &pid, "--yes", "--no-nvml", "--events", f]);
    crate::support::exited(&o, 0);
    let _ = victim.wait();
    let kinds = |path: &Path| -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["event"].as_str().map(str::to_string))
            .collect()
    };
    let k = kinds(&file);
    assert!(
        k.iter().any(|e| e == "signal_sent") && k.iter().any(|e| e == "signal_fate"),
        "{k:?}"
    );
    // A demo sweep records what it did the same way.
    let file2 = env.dir.path().join("sweep.jsonl");
    let o = env.run(&[
        "sweep",
        "--demo",
        "--hosts",
        "gpu-b",
        "--yes",
        "--grace",
        "1s",
        "--timeout",
        "20s",
        "--events",
        file2.to_str().expect("utf-8"),
    ]);
    let k = kinds(&file2);
    assert!(
        k.iter().any(|e| e == "signal_sent") && k.iter().any(|e| e == "gpu_clean"),
        "{k:?} ({})",
        text(&o)
    );
}

#[test]
fn the_agent_exits_when_its_stdin_closes() {
    let env = Env::new();
    // stdin at its end from the start, stdout a pipe that is read: only the closed stdin can end it.
    let mut agent = env
        .cmd(&["agent", "--demo", "--interval", "200ms"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("agent");
    let mut out = agent.stdout.take().expect("stdout");
    let drain = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut out, &mut v);
        v
    });
    let mut status = None;
    let exited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        await_cond("the agent to exit", 10, || {
            status = agent.try_wait().ok().flatten();
            status.is_some()
        });
    }));
    if exited.is_err() {
        let _ = agent.kill();
        let _ = agent.wait();
        panic!("the agent still runs with its stdin closed");
    }
    assert_eq!(status.and_then(|s| s.code()), Some(0));
    let said = String::from_utf8_lossy(&drain.join().expect("drain")).into_owned();
    // A one-off reading: the hello and a snapshot (two if one was under way when stdin was found closed).
    assert!(said.contains("\"hello\""), "{said}");
    let n = said.matches("\"type\":\"snapshot\"").count();
    assert!((1..=2).contains(&n), "{n} snapshots: {said}");
}

#[test]
fn a_config_error_is_said_once() {
    let env = Env::new();
    let cfg = env.dir.path().join("bad.toml");
    std::fs::write(&cfg, "interval = \"bogus\"\n").expect("config");
    let o = env
        .cmd(&["snapshot", "--demo"])
        .env("GPUSWEEP_CONFIG", &cfg)
        .output()
        .expect("snapshot");
    let t = crate::support::exited(&o, 2);
    assert_eq!(t.matches("is not a duration").count(), 1, "{t}");
    assert_eq!(t.lines().filter(|l| !l.trim().is_empty()).count(), 1, "{t}");
}

#[test]
fn a_target_that_ends_at_once_is_not_reported_as_taking_another_targets_grace() {
    let env = Env::new();
    let mut quick = Command::new("sleep").arg("300").spawn().expect("sleep");
    // Ignores TERM: it takes the whole grace and then KILL.
    let mut stubborn = Command::new("sh")
        .args(["-c", "trap '' TERM; echo ready; while :; do sleep 1; done"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("sh");
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(stubborn.stdout.take().expect("stdout")),
        &mut ready,
    )
    .expect("ready");
    let (qp, sp) = (quick.id().to_string(), stubborn.id().to_string());
    let o = env.run(&["kill", &qp, &sp, "--yes", "--grace", "5s", "--no-nvml"]);
    let t = text(&o);
    let line = t
        .lines()
        .find(|l| l.contains(&format!("{qp} sleep")))
        .unwrap_or_else(|| panic!("{t}"));
    let ms: f64 = line
        .rsplit('(')
        .next()
        .and_then(|r| {
            let r = r.trim_end_matches(')');
            r.strip_suffix(" ms")
                .map(|n| n.parse::<f64>().ok())
                .or_else(|| {
                    r.strip_suffix(" s")
                        .map(|n| n.parse::<f64>().ok().map(|s| s * 1000.0))
                })
        })
        .flatten()
        .unwrap_or_else(|| panic!("no time in {line:?}"));
    assert!(
        ms < 4000.0,
        "{qp} ended on TERM, reported after {ms} ms: {t}"
    );
    assert!(t.contains(&format!("{sp} sh")) && t.contains("KILL"), "{t}");
    let _ = quick.wait();
    let _ = stubborn.kill();
    let _ = stubborn.wait();
}

/// Two JSON documents say the same: integers exactly, other numbers as doubles (jq writes the double 0.0 as
/// `0`, the same number).
fn same_values(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value as V;
    match (a, b) {
        (V::Number(x), V::Number(y)) if x.is_f64() || y.is_f64() => x.as_f64() == y.as_f64(),
        (V::Array(x), V::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_values(p, q))
        }
        (V::Object(x), V::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_values(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn jq_1_6_round_trips_the_json_and_every_field_a_reader_needs_is_there() {
    let env = Env::new();
    let o = env.run(&["snapshot", "--json", "--demo"]);
    assert!(o.status.success(), "{}", text(&o));
    let ours: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    // jq 1.6 reads numbers as doubles: any integer past 2^53 would come back changed.
    let mut jq = Command::new("jq")
        .arg(".")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("jq (Debian's jq package)");
    std::io::Write::write_all(&mut jq.stdin.take().expect("stdin"), &o.stdout).expect("write");
    let back = jq.wait_with_output().expect("jq");
    let theirs: serde_json::Value = serde_json::from_slice(&back.stdout).expect("jq's json");
    assert!(
        same_values(&ours, &theirs),
        "jq changed the document:\n{ours}\n{theirs}"
    );
    for h in ours["hosts"].as_array().expect("hosts") {
        assert!(h["missing_features"].is_array(), "always present: {h}");
        let shm = &h["shm"];
        assert!(
            shm["shmmax"].is_null() && shm["shmmax_unlimited"] == true,
            "{shm}"
        );
    }
}

#[test]
fn the_readmes_install_lines_work_on_a_fresh_home_and_man_fish_and_bash_read_what_they_wrote() {
    let env = Env::new();
    let home = env.dir.path().join("home");
    let bin = env.dir.path().join("bin");
    std::fs::create_dir_all(&home).expect("home");
    std::fs::create_dir_all(&bin).expect("bin");
    std::os::unix::fs::symlink(BIN, bin.join("gpusweep")).expect("link");
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README");
    let block = readme
        .split("Completions and the man pages come from")
        .nth(1)
        .and_then(|r| r.split("```\n").nth(1))
        .expect("the install block");
    let sh = |script: &str| {
        Command::new("bash")
            .args(["-c", script])
            .env_clear()
            .env("HOME", &home)
            .env("PATH", &path)
            .env("GPUSWEEP_CONFIG", env.dir.path().join("no-config.toml"))
            .env("MANWIDTH", "80")
            .output()
            .expect("bash")
    };
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let o = sh(line);
        assert!(o.status.success(), "{line}: {}", text(&o));
    }
    // fish finds the file it was told to, and completes shells and subcommands, not file names.
    let fish = |line: &str| {
        let o = Command::new("fish")
            .args(["-c", &format!("complete -C '{line}'")])
            .env_clear()
            .env("HOME", &home)
            .env("PATH", &path)
            .output()
            .expect("fish (Debian's fish package)");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let shells = fish("gpusweep completions ");
    assert!(
        shells.lines().any(|l| l == "bash") && shells.contains("zsh"),
        "{shells}"
    );
    assert!(!shells.contains("Cargo.toml"), "files offered: {shells}");
    let subs = fish("gpusweep help ");
    assert!(subs.lines().any(|l| l.starts_with("serve")), "{subs}");
    // bash loads the script it was given.
    let o =
        sh("source ~/.local/share/bash-completion/completions/gpusweep && complete -p gpusweep");
    assert!(
        o.status.success() && text(&o).contains("gpusweep"),
        "{}",
        text(&o)
    );
    // man finds gpusweep-serve where the README put it; every page fits 80 columns.
    let o = sh("MANPATH=~/.local/share/man: man gpusweep-serve");
    let page = text(&o);
    assert!(
        page.contains("--listen") && page.contains("--token-file"),
        "{page}"
    );
    let pages = std::fs::read_dir(home.join(".local/share/man/man1")).expect("man1");
    let mut n = 0;
    for p in pages.flatten() {
        n += 1;
        let o = sh(&format!("man -l {}", p.path().display()));
        for l in text(&o).lines() {
            assert!(l.chars().count() <= 80, "{}: {l:?}", p.path().display());
        }
    }
    assert!(n >= 14, "a page per command: {n}");
}

#[test]
fn the_systemd_unit_is_hardened_to_at_most_5_0_and_keeps_what_the_serve_needs() {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/gpusweep.service");
    // systemd's own judge (Debian's systemd package): exit non-zero above 5.0 ("threshold" is 10x).
    let o = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--threshold=50"])
        .arg(&unit)
        .output()
        .expect("systemd-analyze");
    let said = text(&o);
    assert!(o.status.success(), "{said}");
    let overall = said
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("{said}"));
    let text = std::fs::read_to_string(&unit).expect("unit");
    // What the serve cannot do without: every process's fds, the GPUs' device files, the socket in /run.
    for needed in [
        "CAP_SYS_PTRACE",
        "CAP_KILL",
        "CAP_FOWNER",
        "DeviceAllow=char-nvidia* rw",
        "ReadWritePaths=/run",
        "LogsDirectory=gpusweep",
    ] {
        assert!(text.contains(needed), "{needed} ({overall})");
    }
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("ProtectProc=") || l.starts_with("PrivateIPC=")),
        "every holder, every SysV segment must stay visible"
    );
    // The install comment creates the token's directory before writing into it.
    let install = text
        .find("install -d -m 700 /etc/gpusweep")
        .expect("the directory made");
    let token = text
        .find("> /etc/gpusweep/token")
        .expect("the token written");
    assert!(install < token);
}

/// Start `program ARGS` with its stdout piped and wait for its "ready" line.
fn started(program: &Path, args: &[&Path]) -> crate::support::Reaped {
    let mut c = Command::new(program)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("fixture");
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(c.stdout.take().expect("stdout")),
        &mut ready,
    )
    .expect("ready");
    assert_eq!(ready.trim(), "ready");
    crate::support::Reaped(c)
}

#[test]
fn a_holder_whose_main_thread_exited_or_whose_thread_hides_its_fds_is_seen_and_ended() {
    let env = Env::new();
    let dev = env.device();
    let leader_exit = crate::support::fixture_program(env.dir.path(), "leader_exit.c");
    let private_fds = crate::support::fixture_program(env.dir.path(), "private_fds.c");
    let mut exited = started(&leader_exit, &[&dev]);
    let hiding = started(&private_fds, &[&dev]);
    let (ep, hp) = (exited.0.id(), hiding.0.id());
    await_cond("the leader to exit", 10, || {
        stat_field(ep, 0).as_deref() == Some("Z")
    });
    // Both hold the GPU: the snapshot lists them, alive, and `wait` does not call it clean at any of its
    // polls (full scans and the listings between them alike).
    let o = env.local_snapshot();
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    let holders: Vec<u64> = v["hosts"][0]["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .filter_map(|h| h["pid"].as_u64())
        .collect();
    assert!(
        holders.contains(&u64::from(ep)) && holders.contains(&u64::from(hp)),
        "{holders:?} holds neither {ep} nor {hp}: {v}"
    );
    let o = env.run(&[
        "wait",
        "--no-nvml",
        "--device-glob",
        &env.glob(),
        "--poll",
        "100ms",
        "--timeout",
        "3s",
    ]);
    crate::support::exited(&o, 1);
    // A kill ends the leader-less one: its pidfd reaches the thread group.
    let o = env.run(&[
        "kill",
        &ep.to_string(),
        "--yes",
        "--no-nvml",
        "--grace",
        "2s",
    ]);
    crate::support::exited(&o, 0);
    let _ = exited.0.wait();
}

#[test]
fn shm_clean_keeps_a_segment_used_through_a_thread_or_another_path() {
    let env = Env::new();
    let shm = env.dir.path().join("shm");
    let alias = env.dir.path().join("alias");
    std::fs::create_dir(&shm).expect("dir");
    std::fs::create_dir(&alias).expect("dir");
    let mk = |name: &str| {
        let p = shm.join(name);
        std::fs::write(&p, vec![0u8; 8192]).expect("write");
        p
    };
    let mapped = mk("nccl-mapped-by-a-thread");
    let in_thread = mk("nccl-open-in-a-private-table");
    let via_alias = mk("nccl-open-through-a-bind-mount");
    let free = mk("nccl-free");
    let bound = Command::new("mount")
        .args(["--bind"])
        .arg(&shm)
        .arg(&alias)
        .status()
        .is_ok_and(|s| s.success());
    assert!(bound, "a bind mount needs root (the suite runs as root)");
    // Unmounted however the test ends.
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(alias.clone());
    let leader_exit = crate::support::fixture_program(env.dir.path(), "leader_exit.c");
    let private_fds = crate::support::fixture_program(env.dir.path(), "private_fds.c");
    let dev = env.device();
    let _leaderless = started(&leader_exit, &[&dev, &mapped]);
    let _private = started(&private_fds, &[&in_thread]);
    let through_alias = crate::support::Reaped(
        Command::new("sh")
            .args(["-c", "exec sleep 300 3<\"$1\"", "sh"])
            .arg(alias.join("nccl-open-through-a-bind-mount"))
            .spawn()
            .expect("sh"),
    );
    let alias_pid = through_alias.0.id();
    await_cond("the alias open", 10, || {
        std::fs::read_link(format!("/proc/{alias_pid}/fd/3")).is_ok()
    });
    let dir = shm.display().to_string();
    let out = env.run(&["shm", "clean", "--no-nvml", "--shm-dir", &dir, "--yes"]);
    let said = text(&out);
    assert!(!free.exists(), "{said}");
    for p in [&mapped, &in_thread, &via_alias] {
        assert!(
            p.exists(),
            "{} is in use and was removed: {said}",
            p.display()
        );
    }
}

#[test]
fn memory_kept_on_purpose_is_shown_never_swept_never_a_leak_never_waited_for() {
    let env = Env::new();
    let dir = env.dir.path();
    let lib = crate::support::standin_nvml(dir);
    env.device();
    // A GPU memory service: a program of its own name, holding GPU 0 with 4 GiB charged to it.
    let gms = dir.join("gpu-memory-service");
    std::fs::copy("/bin/sleep", &gms).expect("a program of that name");
    let service = crate::support::Reaped(
        Command::new(&gms)
            .arg("300")
            .stdin(std::fs::File::open(env.device()).expect("open"))
            .spawn()
            .expect("the service"),
    );
    let pid = service.0.id();
    // GPU 1: a unified-memory part's pages, held by nobody.
    crate::support::set_nvml(dir, &format!("4096 {pid}:4096\n2048\n"));
    let with = |config: &str, args: &[&str]| {
        std::fs::write(dir.join("no-config.toml"), config).expect("config");
        let mut c = env.cmd(args);
        c.args(["--device-glob", &env.glob()])
            .env("GPUSWEEP_NVML_LIBRARY", &lib)
            .env("STANDIN_NVML_STATE", dir.join("nvml"));
        c.output().expect("gpusweep")
    };
    // Undeclared: the unowned 2 GiB are a leak, and a sweep would take the service.
    let o = with("", &["snapshot", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["hosts"][0]["gpus"][1]["state"], "leak", "{}", text(&o));
    let keep = "[keep]\nprograms = [\"gpu-memory-service\"]\ngpu_models = [\"Stand-in\"]\n";
    let o = with(keep, &["snapshot", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let host = &v["hosts"][0];
    assert_eq!(host["gpus"][1]["state"], "in_use", "{host}");
    assert_eq!(host["gpus"][1]["kept"], true, "{host}");
    let holder = host["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .find(|h| h["pid"] == pid)
        .expect("the service holds GPU 0");
    assert_eq!(holder["kept"], true);
    assert!(
        !host["findings"]
            .as_array()
            .expect("findings")
            .iter()
            .any(|f| f["severity"] == "leak"),
        "{host}"
    );
    assert!(
        host["jobs"]
            .as_array()
            .expect("jobs")
            .iter()
            .any(|j| j["kept"] == true),
        "{host}"
    );
    // A sweep plans nothing and says why; the gate passes; the service lives on.
    let o = with(keep, &["sweep", "--yes", "--timeout", "2s"]);
    let t = crate::support::exited(&o, 0);
    assert!(t.contains("kept on purpose"), "{t}");
    let o = with(keep, &["wait", "--timeout", "2s"]);
    crate::support::exited(&o, 0);
    assert!(crate::support::alive(pid));
}

#[test]
fn an_mpi_hostfile_is_read_as_it_is() {
    let env = Env::new();
    let f = env.dir.path().join("hostfile");
    // OpenMPI/DeepSpeed and MPICH lines, with a comment: the demo hosts they name.
    std::fs::write(
        &f,
        "# nodes of the job\ngpu-a slots=8 max_slots=8\ngpu-d:8\n",
    )
    .expect("hostfile");
    let o = env.run(&[
        "snapshot",
        "--json",
        "--demo",
        "--hostfile",
        f.to_str().expect("utf-8"),
    ]);
    let t = crate::support::exited(&o, 0);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let hosts = crate::support::host_names(&v);
    assert_eq!(hosts, ["gpu-a", "gpu-d"], "{t}");
    // Every host has its jobs in the contract, always an array, and every job its lost ranks (`jq
    // '.hosts[].jobs[].lost[]'` reads them all).
    assert!(v["hosts"][1]["jobs"].is_array(), "{t}");
    let jobs: Vec<&serde_json::Value> = v["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .flat_map(|h| h["jobs"].as_array().into_iter().flatten())
        .collect();
    assert!(!jobs.is_empty(), "{t}");
    assert!(jobs.iter().all(|j| j["lost"].is_array()), "{t}");
}

#[test]
fn check_speaks_node_problem_detectors_plugin_protocol() {
    let env = Env::new();
    let dir = env.dir.path();
    let lib = crate::support::standin_nvml(dir);
    env.device();
    let check = |extra: &[(&str, &std::path::Path)]| {
        let mut c = env.cmd(&["check", "--device-glob", &env.glob()]);
        c.env("GPUSWEEP_NVML_LIBRARY", &lib)
            .env("STANDIN_NVML_STATE", dir.join("nvml"));
        for (k, v) in extra {
            c.env(k, v);
        }
        let o = c.output().expect("check");
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        assert_eq!(out.lines().count(), 1, "one line: {}", text(&o));
        // node-problem-detector keeps `max_output_length` bytes: never more, never a character cut.
        assert!(out.trim_end().len() <= 80, "{out}");
        (o.status.code(), out)
    };
    // Clean: OK.
    crate::support::set_nvml(dir, "0\n");
    let (code, line) = check(&[]);
    assert_eq!(code, Some(0), "{line}");
    assert!(line.contains("ok"), "{line}");
    // A holder alive and charged (a running job): still OK.
    let job = crate::support::Reaped(
        Command::new("sleep")
            .arg("300")
            .stdin(std::fs::File::open(env.device()).expect("open"))
            .spawn()
            .expect("a job's process"),
    );
    crate::support::set_nvml(dir, &format!("1024 {}:1024\n", job.0.id()));
    let (code, line) = check(&[]);
    assert_eq!(code, Some(0), "{line}");
    // 2 GiB held by nobody listed, while that process has GPU 0 open: a problem, naming GPU and holder.
    crate::support::set_nvml(dir, "2048\n");
    let (code, line) = check(&[]);
    assert_eq!(code, Some(1), "{line}");
    assert!(
        line.contains("GPU 0") && line.contains(&job.0.id().to_string()),
        "{line}"
    );
    // No driver: unknown, never OK.
    let (code, line) = check(&[(
        "GPUSWEEP_NVML_LIBRARY",
        std::path::Path::new("/nonexistent/libnvidia-ml.so.1"),
    )]);
    assert_eq!(code, Some(2), "{line}");
    assert!(line.starts_with("unknown"), "{line}");
    // A host name in UTF-8 and small limits: at most that many bytes, whole characters.
    for max in ["80", "20", "5"] {
        let o = env
            .cmd(&[
                "check",
                "--max-line",
                max,
                "--hosts",
                "cmd:echo ✓✓✓✓✓✓✓✓ héhé",
            ])
            .output()
            .expect("check");
        let out = String::from_utf8(o.stdout.clone()).expect("whole characters: valid UTF-8");
        let n: usize = max.parse().expect("n");
        assert!(out.trim_end().len() <= n, "{max}: {out:?}");
    }
}

/// A gate inside a PID namespace of its own (node-problem-detector without `hostPID`) cannot see who holds
/// the 4 GiB NVML charges to a process outside it: `check`, `wait` and the gate's answer is unknown (exit 2,
/// said on stdout where NPD reads it), never OK. Where every GPU reads zero, the zero itself was observed.
#[test]
#[allow(clippy::too_many_lines)] // one gate, every way it can be blind
fn a_gate_blind_to_the_host_says_unknown_not_ok() {
    let env = Env::new();
    let dir = env.dir.path();
    let lib = crate::support::standin_nvml(dir);
    env.device();
    // A host process holds GPU 0, charged 4 GiB: outside the namespace the gate runs in.
    let holder = crate::support::Reaped(
        Command::new("sleep")
            .arg("300")
            .stdin(std::fs::File::open(env.device()).expect("open"))
            .spawn()
            .expect("sleep"),
    );
    let boxed = |args: &[&str], state: &str| {
        crate::support::set_nvml(dir, state);
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--mount-proc", BIN])
            .args(args)
            .args(["--device-glob", &env.glob()])
            .env("GPUSWEEP_AUDIT_LOG", env.audit())
            .env("GPUSWEEP_CONFIG", dir.join("no-config.toml"))
            .env("GPUSWEEP_SOCKET", dir.join("no-serve.sock"))
            .env_remove("GPUSWEEP_HOSTS")
            .env_remove("GPUSWEEP_NODE_SERVE")
            .env("GPUSWEEP_NVML_LIBRARY", &lib)
            .env("STANDIN_NVML_STATE", dir.join("nvml"))
            .stdin(Stdio::null());
        c.output().expect("unshare (util-linux) runs as root")
    };
    let held = format!("4096 {}:4096\n", holder.0.id());
    let o = boxed(&["check"], &held);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    crate::support::exited(&o, 2);
    assert!(
        out.starts_with("unknown"),
        "on stdout, where NPD reads: {out}"
    );
    assert!(
        out.contains("PID namespace"),
        "the blind spot is named: {out}"
    );
    let o = boxed(&["wait", "--timeout", "1s"], &held);
    crate::support::exited(&o, 2);
    assert!(text(&o).contains("PID namespace"), "{}", text(&o));
    // Nothing used: the zero was read, and it is OK even from inside.
    let o = boxed(&["check"], "0\n");
    crate::support::exited(&o, 0);
    let o = boxed(&["wait", "--timeout", "5s"], "0\n");
    crate::support::exited(&o, 0);
    // Judging by holders alone (`--no-nvml`), a gate that cannot see every process's descriptors cannot
    // observe that nobody holds a GPU: from inside the namespace, or as a user who cannot read root's fds.
    for args in [
        &["wait", "--no-nvml", "--timeout", "2s"][..],
        &["check", "--no-nvml"],
    ] {
        let o = boxed(args, "0\n");
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains("holders alone"), "{}", text(&o));
    }
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN])
        .args(["wait", "--no-nvml", "--gpus", "0", "--timeout", "2s"])
        .args(["--device-glob", &env.glob()])
        .env("GPUSWEEP_AUDIT_LOG", dir.join("nobody-audit.jsonl"))
        .env("GPUSWEEP_CONFIG", dir.join("no-config.toml"))
        .env("GPUSWEEP_SOCKET", dir.join("no-serve.sock"))
        .env_remove("GPUSWEEP_HOSTS")
        .output()
        .expect("setpriv (util-linux)");
    crate::support::exited(&o, 2);
    assert!(
        text(&o).contains("holders alone") && text(&o).contains("descriptors could not be read"),
        "{}",
        text(&o)
    );
    // A /proc that hides other users' processes (hidepid): root's holder is invisible, not absent; and so it
    // is to root of a user namespace of its own (a fakeroot container).
    for userns in ["", "unshare -Ur"] {
        let script = format!(
            "mount --make-rprivate / && mount -t proc -o hidepid=2 proc /proc && exec setpriv --reuid=65534 \
             --regid=65534 --clear-groups {userns} {BIN} wait --no-nvml --timeout 2s --device-glob '{}'",
            env.glob()
        );
        let o = Command::new("unshare")
            .args(["-m", "sh", "-c", &script])
            .env("GPUSWEEP_AUDIT_LOG", dir.join("nobody-audit.jsonl"))
            .env("GPUSWEEP_CONFIG", dir.join("no-config.toml"))
            .env("GPUSWEEP_SOCKET", dir.join("no-serve.sock"))
            .env_remove("GPUSWEEP_HOSTS")
            .output()
            .expect("unshare (util-linux)");
        assert_eq!(o.status.code(), Some(2), "{userns}: {}", text(&o));
        assert!(text(&o).contains("hidepid"), "{userns}: {}", text(&o));
    }
}

/// Hosts are counted before any is dialled: two lists within the limit each but past it together, and a
/// hostfile past 16 MiB, are refused at once (exit 2), nothing read.
#[test]
fn too_many_hosts_in_all_or_too_large_a_hostfile_is_refused() {
    let env = Env::new();
    let o = env.run(&[
        "snapshot",
        "--hosts",
        "gpu-a[0001-6000]",
        "--hosts",
        "gpu-b[0001-6000]",
    ]);
    crate::support::exited(&o, 2);
    assert!(text(&o).contains("in all"), "{}", text(&o));
    let big = env.dir.path().join("hosts.txt");
    let line = format!("{}\n", "n".repeat(1023));
    std::fs::write(&big, line.repeat(17 * 1024)).expect("hostfile");
    let o = env.run(&["snapshot", "--hostfile", big.to_str().expect("utf-8")]);
    crate::support::exited(&o, 2);
    assert!(text(&o).contains("larger than 16 MiB"), "{}", text(&o));
}

/// Clean means idle: a GPU at 100% with 0 MiB and nothing listed or holding it is a leftover (a kernel left
/// running), never clean, and no gate passes it; one reading is never enough to call it a leak. Work a live
/// listed process does is "in use"; a GPU a program the config declares holds is its business. A benign
/// opener is named as what blocks the reset the finding advises.
#[test]
#[allow(clippy::too_many_lines)] // one GPU at work, every way it can be explained
fn a_gpu_at_work_for_nobody_is_no_clean_gpu() {
    let env = Env::new();
    let dir = env.dir.path();
    let lib = crate::support::standin_nvml(dir);
    env.device();
    let run = |config: &str, args: &[&str]| {
        std::fs::write(dir.join("no-config.toml"), config).expect("config");
        let mut c = env.cmd(args);
        c.args(["--device-glob", &env.glob()])
            .env("GPUSWEEP_NVML_LIBRARY", &lib)
            .env("STANDIN_NVML_STATE", dir.join("nvml"));
        c.output().expect("gpusweep")
    };
    let json = |config: &str| -> serde_json::Value {
        let o = run(config, &["snapshot", "--json"]);
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
    };
    let busy_findings = |v: &serde_json::Value| -> Vec<serde_json::Value> {
        v["hosts"][0]["findings"]
            .as_array()
            .expect("findings")
            .iter()
            .filter(|f| f["kind"] == "busy_without_holder")
            .cloned()
            .collect()
    };
    // A process running a program of this name (a copy of sleep), holding GPU 0's device file open.
    let holder_named = |name: &str| {
        let exe = dir.join(name);
        std::fs::copy("/bin/sleep", &exe).expect("a program of that name");
        let p = crate::support::Reaped(
            Command::new(&exe)
                .arg("300")
                .stdin(std::fs::File::open(env.device()).expect("open"))
                .spawn()
                .expect("the holder"),
        );
        let pid = p.0.id();
        // The kernel cuts comm at 15 bytes.
        let comm: String = name.chars().take(15).collect();
        crate::support::await_cond("the holder runs", 10, || {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
        });
        p
    };
    // Idle: clean, and no finding.
    crate::support::set_nvml(dir, "0 util=0\n");
    let v = json("");
    assert_eq!(v["hosts"][0]["gpus"][0]["state"], "clean", "{v}");
    assert!(busy_findings(&v).is_empty(), "{v}");
    // At work for nobody: not clean; on one reading a warning that says it is one reading.
    crate::support::set_nvml(dir, "0 util=100\n");
    let v = json("");
    assert_eq!(v["hosts"][0]["gpus"][0]["state"], "in_use", "{v}");
    let f = busy_findings(&v);
    assert_eq!(f.len(), 1, "{v}");
    assert_eq!(f[0]["severity"], "warning", "{v}");
    let detail = f[0]["detail"].as_str().expect("detail");
    assert!(
        detail.contains("100% busy") && detail.contains("one reading"),
        "{detail}"
    );
    assert!(
        detail.contains("every process's descriptors were read"),
        "what was checked is named: {detail}"
    );
    let o = run("", &["check"]);
    crate::support::exited(&o, 1);
    // A gate watching it past the confirm window: a leak, and still no pass.
    let o = run("confirm = \"1s\"\n", &["wait", "--timeout", "3s"]);
    let t = crate::support::exited(&o, 1);
    assert!(t.contains("100% busy"), "{t}");
    // A benign opener (the persistence daemon) explains nothing, and is named as what blocks the reset.
    let daemon = holder_named("nvidia-persistenced");
    let dpid = daemon.0.id();
    let v = json("");
    let f = busy_findings(&v);
    assert_eq!(f.len(), 1, "{v}");
    let action = f[0]["action"].as_str().expect("action");
    assert!(
        action.contains("to reset GPU 0")
            && action.contains(&format!("{dpid} (nvidia-persistenced)")),
        "{action}"
    );
    let blockers = v["hosts"][0]["gpus"][0]["reset_blockers"]
        .as_array()
        .expect("reset blockers in the JSON")
        .clone();
    assert!(
        blockers.iter().any(|b| b["pid"] == dpid
            && b["benign"] == true
            && b["program"] == "nvidia-persistenced"),
        "{v}"
    );
    drop(daemon);
    // A program the host's config declares (a burn-in it runs on purpose) holds it: its business.
    let burner = holder_named("my-burner");
    let bpid = burner.0.id();
    // An opener NVML does not list runs nothing on it (work needs a context NVML would list; the device
    // file is open to anyone): it hides no leftover, and is named.
    let v = json("");
    let f = busy_findings(&v);
    assert_eq!(f.len(), 1, "{v}");
    assert!(
        f[0]["detail"]
            .as_str()
            .is_some_and(|d| d.contains(&format!("{bpid} ("))
                && d.contains("my-burner")
                && d.contains("NVML does not list it")),
        "{f:?}"
    );
    // Declared benign by the config: still its business, not a leftover.
    let v = json("benign = [\"my-burner\"]\n");
    assert!(busy_findings(&v).is_empty(), "{v}");
    assert_eq!(v["hosts"][0]["gpus"][0]["state"], "in_use", "{v}");
    drop(burner);
    // A live listed process's work: in use, no finding.
    let job = crate::support::Reaped(
        Command::new("sleep")
            .arg("300")
            .stdin(std::fs::File::open(env.device()).expect("open"))
            .spawn()
            .expect("a job's process"),
    );
    crate::support::set_nvml(dir, &format!("1024 {}:1024 util=100\n", job.0.id()));
    let v = json("");
    assert_eq!(v["hosts"][0]["gpus"][0]["state"], "in_use", "{v}");
    assert!(busy_findings(&v).is_empty(), "{v}");
    // 0 leaves utilization out of the verdict.
    crate::support::set_nvml(dir, "0 util=100\n");
    let v = json("busy_percent = 0\n");
    assert_eq!(v["hosts"][0]["gpus"][0]["state"], "clean", "{v}");
}

/// A tmpfs mounted on a directory for one test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path) -> Tmpfs {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "mounting a tmpfs needs root (scripts/test.sh runs the suite as root)"
        );
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A pod's memory-backed volume (a tmpfs the kubelet mounts under its pod's directory) holds an NCCL
/// segment nobody uses: found, named with its pod, and removed; one a live process maps is kept, and a
/// disk-backed volume's files are not the stack's shared memory at all.
#[test]
#[allow(clippy::too_many_lines)] // one pod's volume: made, read, cleaned
fn a_pods_memory_volume_leftover_is_found_with_its_pod_and_removed_a_mapped_one_kept() {
    use std::os::unix::ffi::OsStrExt;
    let env = Env::new();
    let dir = env.dir.path();
    let kubelet = dir.join("kubelet");
    let pod = kubelet
        .join("pods")
        .join("3f2a9c1e-5b7d-4e0f-9a31-000000000001");
    let vols = pod.join("volumes").join("kubernetes.io~empty-dir");
    let vol = vols.join("dshm");
    let disk = vols.join("cache");
    std::fs::create_dir_all(&vol).expect("volume dir");
    std::fs::create_dir_all(&disk).expect("disk volume dir");
    std::fs::write(
        pod.join("etc-hosts"),
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n10.1.2.3\tweb-0\n",
    )
    .expect("etc-hosts");
    let _mounted = Tmpfs::mount(&vol);
    let left = vol.join("nccl-left");
    let used = vol.join("nccl-used");
    let on_disk = disk.join("nccl-disk");
    for f in [&left, &used, &on_disk] {
        std::fs::write(f, vec![0u8; 4096]).expect("segment");
    }
    let hex: String = used
        .as_os_str()
        .as_bytes()
        .iter()
        .fold(String::new(), |mut s, b| {
            use std::fmt::Write;
            let _ = write!(s, "{b:02x}");
            s
        });
    let mut user = Command::new("/usr/bin/python3")
        .args(["-c", MAP_AND_CLOSE, &hex])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(user.stdout.take().expect("stdout")),
        &mut ready,
    )
    .expect("ready");
    assert_eq!(ready.trim(), "ready");
    std::fs::write(
        dir.join("no-config.toml"),
        format!("kubelet_dir = \"{}\"\n", kubelet.display()),
    )
    .expect("config");
    let host_shm = dir.join("shm");
    std::fs::create_dir(&host_shm).expect("host shm");
    let shm_dir = host_shm.display().to_string();
    let o = env.run(&["snapshot", "--json", "--no-nvml", "--shm-dir", &shm_dir]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let pods = &v["hosts"][0]["shm"]["pods"];
    assert_eq!(pods.as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(pods[0]["pod"], "web-0", "{pods}");
    assert_eq!(pods[0]["volume"], "dshm", "{pods}");
    assert_eq!(
        pods[0]["segments"].as_array().map(Vec::len),
        Some(2),
        "{pods}"
    );
    let leftovers: Vec<String> = v["hosts"][0]["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["kind"] == "shm_leftover")
        .filter_map(|f| f["detail"].as_str().map(str::to_string))
        .collect();
    assert_eq!(leftovers.len(), 1, "{leftovers:?}");
    assert!(
        leftovers[0].contains("nccl-left") && leftovers[0].contains("pod web-0"),
        "{leftovers:?}"
    );
    let o = env.run(&["shm", "clean", "--no-nvml", "--shm-dir", &shm_dir, "--yes"]);
    let t = crate::support::exited(&o, 0);
    assert!(t.contains("pod web-0"), "{t}");
    assert!(!left.exists(), "the unused one is removed: {t}");
    assert!(used.exists(), "the mapped one is kept: {t}");
    assert!(on_disk.exists(), "a disk volume is no shared memory: {t}");
    // A pod with more volumes than are read: said, and no absence of leftovers is claimed for it.
    let crowded = kubelet
        .join("pods")
        .join("crowded")
        .join("volumes")
        .join("kubernetes.io~empty-dir");
    for i in 0..65 {
        std::fs::create_dir_all(crowded.join(format!("v{i}"))).expect("volume dir");
    }
    let o = env.run(&["shm", "clean", "--no-nvml", "--shm-dir", &shm_dir, "--yes"]);
    let t = crate::support::exited(&o, 2);
    assert!(t.contains("more than 64 emptyDir volumes"), "{t}");
    assert!(!t.contains("no /dev/shm leftovers"), "{t}");
    let o = env.run(&["snapshot", "--json", "--no-nvml", "--shm-dir", &shm_dir]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert!(v["hosts"][0]["shm"]["pods_unread"].is_string(), "{v}");
    drop(user.stdin.take());
    let _ = user.wait();
}

/// A GPU in MIG mode: a ghost on instance 2 of GPU 0 (its process dead, a child keeping its context) is
/// named with its instance while instance 1 reads clean; a sweep reaches the holder and its watch reads that
/// instance to zero. A MIG GPU whose instances cannot be listed is unknown, never clean.
#[test]
#[allow(clippy::too_many_lines)] // one MIG GPU: judged, swept, watched, and unread
fn a_ghost_on_a_mig_instance_is_named_with_it_swept_and_watched_to_zero() {
    let env = Env::new();
    let dir = env.dir.path();
    let lib = crate::support::standin_nvml(dir);
    env.device();
    let mut gone = Command::new("true").spawn().expect("true");
    let dead = gone.id();
    gone.wait().expect("reaped");
    let holder = crate::support::Reaped(
        Command::new("sleep")
            .arg("300")
            .stdin(std::fs::File::open(env.device()).expect("open"))
            .spawn()
            .expect("the context's keeper"),
    );
    let hpid = holder.0.id();
    crate::support::set_nvml(dir, &format!("4096 mig=1/0 mig=2/4096/{dead}@4096\n"));
    let run = |args: &[&str]| {
        let mut c = env.cmd(args);
        c.args(["--device-glob", &env.glob()])
            .env("GPUSWEEP_NVML_LIBRARY", &lib)
            .env("STANDIN_NVML_STATE", dir.join("nvml"));
        c.output().expect("gpusweep")
    };
    let o = run(&["snapshot", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let g = &v["hosts"][0]["gpus"][0];
    assert_eq!(g["mig"].as_array().map(Vec::len), Some(2), "{g}");
    assert_eq!(g["mig"][0]["state"], "clean", "{g}");
    assert_eq!(g["mig"][1]["gpu_instance"], 2, "{g}");
    assert_eq!(g["mig"][1]["profile"], "1g.18gb", "{g}");
    assert_eq!(g["mig"][1]["state"], "leak", "{g}");
    assert_eq!(g["state"], "leak", "{g}");
    let ghost = v["hosts"][0]["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["kind"] == "ghost")
        .cloned()
        .unwrap_or_else(|| panic!("a ghost: {v}"));
    assert_eq!(ghost["gpu_instance"], 2, "{ghost}");
    assert_eq!(ghost["target_pid"], hpid, "{ghost}");
    assert!(
        ghost["detail"]
            .as_str()
            .is_some_and(|d| d.contains("GPU 0 instance 2 (1g.18gb)")),
        "{ghost}"
    );
    let o = run(&["snapshot"]);
    assert!(text(&o).contains("instance 2 (1g.18gb)"), "{}", text(&o));
    // The driver frees the instance once its holder has gone.
    let state = dir.to_path_buf();
    let freer = std::thread::spawn(move || {
        crate::support::await_cond("the holder's end", 60, || !crate::support::alive(hpid));
        crate::support::set_nvml(&state, "0 mig=1/0 mig=2/0\n");
    });
    let o = run(&[
        "sweep",
        "--gpus",
        "0",
        "--yes",
        "--grace",
        "2s",
        "--timeout",
        "20s",
    ]);
    let t = crate::support::exited(&o, 0);
    assert!(t.contains(&hpid.to_string()), "the holder is planned: {t}");
    assert!(t.contains("clean: every chosen GPU reads zero"), "{t}");
    freer.join().expect("freer");
    // The GPU's own figure beyond its instances', and a dead PID listed outside every instance: never clean.
    let mut gone = Command::new("true").spawn().expect("true");
    let outside = gone.id();
    gone.wait().expect("reaped");
    crate::support::set_nvml(dir, "5000 mig=1/0\n");
    let v: serde_json::Value =
        serde_json::from_slice(&run(&["snapshot", "--json"]).stdout).expect("json");
    assert_ne!(v["hosts"][0]["gpus"][0]["state"], "clean", "{v}");
    crate::support::set_nvml(dir, &format!("0 {outside}:100 mig=1/0\n"));
    let o = run(&["check"]);
    crate::support::exited(&o, 1);
    assert!(text(&o).contains("ghost"), "{}", text(&o));
    crate::support::set_nvml(dir, "0 mig=1/0 mig=2/0\n");
    drop(holder);
    let o = run(&["snapshot", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["hosts"][0]["gpus"][0]["state"], "clean", "{v}");
    // Instances that cannot be listed: unknown, and no gate passes it.
    crate::support::set_nvml(dir, "0 migfail\n");
    let o = run(&["snapshot", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["hosts"][0]["gpus"][0]["state"], "unknown", "{v}");
    assert!(v["hosts"][0]["gpus"][0]["mig_error"].is_string(), "{v}");
    let o = run(&["wait", "--timeout", "1s"]);
    crate::support::exited(&o, 2);
    let o = run(&["check"]);
    crate::support::exited(&o, 2);
    assert!(text(&o).starts_with("unknown"), "{}", text(&o));
}

/// Every man page passes mandoc's checker at warning level (a title line whose date slot held the command's
/// name was a warning on every page).
#[test]
fn every_man_page_passes_mandoc_lint() {
    let env = Env::new();
    let dir = env.dir.path().join("man1");
    let o = env.run(&["man", "--dir", dir.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", text(&o));
    let pages: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("pages")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(pages.len() >= 10, "{pages:?}");
    let o = Command::new("mandoc")
        .args(["-Tlint", "-W", "warning"])
        .args(&pages)
        .output()
        .expect("mandoc (Debian's mandoc; scripts/test.sh installs it)");
    assert!(o.status.success() && o.stdout.is_empty(), "{}", text(&o));
}

/// `--help` names every host form the command line takes (it left out http(s)://, unix: and prom:).
#[test]
fn help_names_every_host_form() {
    let env = Env::new();
    let o = env.run(&["--help"]);
    let t = String::from_utf8_lossy(&o.stdout).into_owned();
    for form in [
        "cmd:COMMAND",
        "http(s)://",
        "unix:PATH",
        "prom:URL",
        "slurm:JOBID",
        "@group",
    ] {
        assert!(t.contains(form), "{form}: {t}");
    }
}

/// The demo's zombie is refused as a real host refuses one: dead already, its parent named, exit 1 (it said
/// "sent TERM" and exited 0).
#[test]
fn the_demos_zombie_is_refused_like_a_real_one() {
    let env = Env::new();
    let o = env.run(&["kill", "7350", "--demo", "--hosts", "gpu-b", "--yes"]);
    let t = crate::support::exited(&o, 1);
    assert!(!t.contains("sent TERM"), "{t}");
    assert!(t.contains("zombie") && t.contains("7340"), "{t}");
}

/// The demo reads as a real host does: `--no-gauges` leaves temperature and power unread (it changed
/// nothing), and a demo host read through an agent says it is simulated in the text snapshot too.
#[test]
fn the_demo_honours_no_gauges_and_says_simulated_through_an_agent() {
    let env = Env::new();
    let o = env.run(&[
        "snapshot",
        "--json",
        "--demo",
        "--hosts",
        "gpu-b",
        "--no-gauges",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let h = &v["hosts"][0];
    assert!(h["gpus"][0]["temperature_c"].is_null(), "{h}");
    assert!(h["gpus"][0]["power_mw"].is_null(), "{h}");
    assert!(
        h["missing_features"]
            .as_array()
            .is_some_and(|m| m.iter().any(|f| f == "gauges")),
        "{h}"
    );
    let agent = format!("cmd:{BIN} agent --demo --hosts gpu-b");
    let o = env.run(&["snapshot", "--hosts", &agent]);
    let t = text(&o);
    assert!(
        t.lines()
            .next()
            .is_some_and(|l| l.contains("DEMO: simulated")),
        "{t}"
    );
}

/// `kill --job` acts on every host read, as the README says (it asked for `--host`); PIDs still name the
/// processes of one host.
#[test]
fn kill_job_reaches_the_job_on_every_host() {
    let env = Env::new();
    let o = env.run(&[
        "kill",
        "--job",
        "4711",
        "--demo",
        "--hosts",
        "gpu-b,gpu-b0042",
        "--yes",
    ]);
    let t = crate::support::exited(&o, 0);
    for host in ["gpu-b:", "gpu-b0042:"] {
        assert!(
            t.lines().any(|l| l.trim_start().starts_with(host)
                && l.contains("7391")
                && l.contains("exited")),
            "{host} {t}"
        );
    }
    let o = env.run(&[
        "kill",
        "7391",
        "--demo",
        "--hosts",
        "gpu-b,gpu-b0042",
        "--yes",
    ]);
    crate::support::exited(&o, 2);
    assert!(text(&o).contains("--host"), "{}", text(&o));
}
