//! `cmd:` hosts that misbehave: an agent that stalls after its hello, one that floods readings, one that stops
//! reading commands, and commands that never answer. Crafted agent streams come from a shell; the readings in
//! them are this binary's own `agent --demo` output.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use gpusweep::act::AuditLog;
use gpusweep::analyze::AnalyzeOptions;
use gpusweep::core::action::{ActionAnswer, ActionRequest};
use gpusweep::core::host::HostSpec;
use gpusweep::core::signal::{Fate, Sig, SignalRequest, TargetInfo};
use gpusweep::runtime::{Fleet, FleetOptions, HostEvent, Judgement};
use gpusweep::source::demo::DemoClock;
use gpusweep::source::local::procfs::ProcfsConfig;
use gpusweep::source::remote::http::HttpOptions;
use gpusweep::source::remote::ssh::SshOptions;
use gpusweep::source::{ConnStatus, HostCmd};

use crate::support::{BIN, await_cond};

/// The hello and the first snapshot of a demo agent, as two files a shell can replay.
fn agent_lines(dir: &Path) -> (String, String) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("'{BIN}' agent --demo | head -n 2"))
        .env("GPUSWEEP_CONFIG", dir.join("none.toml"))
        .stderr(Stdio::null())
        .output()
        .expect("demo agent");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut lines = text.lines();
    let hello = dir.join("hello.json");
    let snap = dir.join("snap.json");
    std::fs::write(&hello, format!("{}\n", lines.next().expect("hello"))).expect("hello");
    std::fs::write(&snap, format!("{}\n", lines.next().expect("snapshot"))).expect("snap");
    (hello.display().to_string(), snap.display().to_string())
}

async fn fleet(command: &str, interval: Duration, audit: &Path) -> Fleet {
    let spec = HostSpec::Command {
        command: command.to_string(),
    };
    fleet_of(spec, interval, audit).await
}

async fn fleet_of(spec: HostSpec, interval: Duration, audit: &Path) -> Fleet {
    fleet_of_all(&[spec], interval, audit).await
}

/// A fleet of `specs` as the front ends start one, read every `interval`.
pub(crate) async fn fleet_of_all(specs: &[HostSpec], interval: Duration, audit: &Path) -> Fleet {
    Fleet::start(specs, &options(interval, audit))
        .await
        .expect("fleet")
}

/// The options a front end starts its fleet with, read every `interval`.
pub(crate) fn options(interval: Duration, audit: &Path) -> FleetOptions {
    FleetOptions {
        interval,
        analyze: AnalyzeOptions::default(),
        procfs: ProcfsConfig::default(),
        load_nvml: false,
        gauges: true,
        memory_alone: false,
        counters: false,
        audit: AuditLog {
            path: Some(audit.to_path_buf()),
        },
        ssh: SshOptions {
            connect_timeout: Duration::from_secs(1),
            ..Default::default()
        },
        demo_clock: DemoClock::real(),
        kill_without_pidfd: false,
        http: HttpOptions::default(),
        serve_socket: None,
        acts: false,
        events_file: None,
        quick_first_view: false,
        local_name: None,
    }
}

/// PIDs whose command line is exactly `sleep SECS`.
fn sleepers(secs: &str) -> Vec<u32> {
    let want = format!("sleep\0{secs}\0");
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want.as_bytes())
        })
        .collect()
}

async fn next_event(fleet: &mut Fleet, within: Duration) -> HostEvent {
    tokio::time::timeout(within, fleet.recv())
        .await
        .expect("an event in time")
        .expect("the fleet is running")
}

/// An agent that says hello, sends one reading and then nothing: the host turns stale (with the age of what
/// it shows), then the connection is given up, and the command's whole process group is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_agent_goes_stale_then_is_dropped_with_its_process_group() {
    let dir = tempfile::tempdir().expect("tmp");
    let (hello, snap) = agent_lines(dir.path());
    let cmd = format!("cat '{hello}' '{snap}'; sleep 86391 & exec sleep 86392");
    let mut f = fleet(&cmd, Duration::from_millis(100), &dir.path().join("audit")).await;
    let mut got_reading = false;
    let mut stale = None;
    let down = loop {
        match next_event(&mut f, Duration::from_secs(20)).await {
            HostEvent::Update {
                update: Judgement::New(_),
                ..
            } => got_reading = true,
            HostEvent::Status {
                status: ConnStatus::Stale { silent_ms },
                ..
            } => stale = Some(silent_ms),
            HostEvent::Status {
                status: ConnStatus::Down(e),
                ..
            } => break e,
            _ => {}
        }
    };
    assert!(got_reading, "the one reading arrived");
    let silent = stale.expect("the host went stale before it was dropped");
    assert!(
        silent >= 3000,
        "stale after 3 s of silence, not before: {silent}"
    );
    assert!(down.contains("no reading from the agent for"), "{down}");
    // Both sleeps (the shell's background job and the exec'd one) are gone with the group.
    await_cond("the command's process group to die", 10, || {
        sleepers("86391").is_empty() && sleepers("86392").is_empty()
    });
}

/// An agent that sends readings as fast as a shell can: a front end that does not read for a while finds
/// one reading waiting, the latest, not a queue of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_readings_keeps_only_the_latest() {
    let dir = tempfile::tempdir().expect("tmp");
    let (hello, snap) = agent_lines(dir.path());
    let count = dir.path().join("count");
    let cmd = format!(
        "cat '{hello}'; i=0; while :; do cat '{snap}'; i=$((i+1)); echo $i > '{}'; done",
        count.display()
    );
    let mut f = fleet(&cmd, Duration::from_secs(1), &dir.path().join("audit")).await;
    loop {
        if let HostEvent::Update {
            update: Judgement::New(_),
            ..
        } = next_event(&mut f, Duration::from_secs(20)).await
        {
            break;
        }
    }
    // Not reading events while the agent sends 300 more readings.
    let sent = || {
        std::fs::read_to_string(&count)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let from = sent();
    await_cond("300 more readings", 60, || sent() >= from + 300);
    let mut waiting = 0;
    while let Some(ev) = f.try_recv() {
        if let HostEvent::Update {
            update: Judgement::New(_),
            ..
        } = ev
        {
            waiting += 1;
        }
    }
    assert!(
        waiting <= 1,
        "{waiting} readings were queued for one host; only the latest is kept"
    );
}

/// An agent that never reads its commands: the command queue fills, and a signal request is answered at
/// once ("host busy") instead of waiting forever behind thousands of polls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_reads_no_commands_answers_signals_busy() {
    let dir = tempfile::tempdir().expect("tmp");
    let (hello, snap) = agent_lines(dir.path());
    // Readings keep coming (so the host is not stale), but stdin is never read.
    let cmd = format!("cat '{hello}'; while :; do cat '{snap}'; sleep 0.2; done");
    let mut f = fleet(&cmd, Duration::from_secs(1), &dir.path().join("audit")).await;
    loop {
        if let HostEvent::Status {
            status: ConnStatus::Up,
            ..
        } = next_event(&mut f, Duration::from_secs(20)).await
        {
            break;
        }
    }
    let host = f.ids().next().expect("one host");
    // Enough polls, in rounds that let the client move them on, to fill the agent's stdin pipe.
    for _ in 0..1000 {
        for _ in 0..100 {
            f.send(host, HostCmd::PollNow);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let req = SignalRequest {
        targets: vec![TargetInfo {
            pid: 4_000_000,
            start_time: 1,
            cmdline: String::new(),
            pidfs_ino: None,
        }],
        signal: Sig::Term,
        grace_ms: None,
        purpose: None,
    };
    let req = ActionRequest::Signal(req);
    f.send(host, HostCmd::Act { id: 7, req });
    let outcomes = loop {
        if let HostEvent::Answer {
            id: 7,
            answer: ActionAnswer::Signal(outcomes),
            ..
        } = next_event(&mut f, Duration::from_secs(10)).await
        {
            break outcomes;
        }
    };
    // Refused at once when the queues are full; never left hanging in any case.
    assert!(
        matches!(&outcomes[0].fate, Fate::Failed { reason }
            if reason.contains("busy") || reason.contains("not sent") || reason.contains("no answer")),
        "{outcomes:?}"
    );
}

/// `gpusweep ARGS` with its config and audit log in `dir`, output piped. Unlike `support::gpusweep` it names
/// no socket of its own, as these tests always did.
fn gpusweep_piped(args: &[&str], dir: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("GPUSWEEP_CONFIG", dir.join("none.toml"))
        .env("GPUSWEEP_AUDIT_LOG", dir.join("audit"))
        .env_remove("GPUSWEEP_HOSTS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// A command that never says hello: `snapshot` reports it at its deadline, and nothing it started survives.
#[test]
fn a_command_that_never_answers_is_reported_and_killed() {
    let dir = tempfile::tempdir().expect("tmp");
    let o = gpusweep_piped(
        &[
            "snapshot",
            "--json",
            "--connect-timeout",
            "1",
            "--hosts",
            "cmd:sleep 86393 & exec sleep 86394",
        ],
        dir.path(),
    )
    .output()
    .expect("run");
    assert_eq!(o.status.code(), Some(2), "no host was read");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let e = v["hosts"][0]["error"].as_str().unwrap_or_default();
    assert!(e.contains("no hello") || e.contains("no reading"), "{e}");
    await_cond("the command's processes to die", 10, || {
        sleepers("86393").is_empty() && sleepers("86394").is_empty()
    });
}

/// SIGTERM ends a waiting gpusweep with 143, and the `cmd:` host's processes go with it.
#[test]
fn sigterm_exits_143_and_takes_the_command_hosts_along() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut child = gpusweep_piped(
        &[
            "wait",
            "--no-nvml",
            "--timeout",
            "120s",
            "--hosts",
            "cmd:sleep 86395 & exec sleep 86396",
        ],
        dir.path(),
    )
    .spawn()
    .expect("spawn");
    await_cond("the command host to start", 20, || {
        !sleepers("86395").is_empty() && !sleepers("86396").is_empty()
    });
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(143));
    await_cond("the command's processes to die", 10, || {
        sleepers("86395").is_empty() && sleepers("86396").is_empty()
    });
}

/// The first `n` lines a demo agent writes after being sent `cmd`.
fn agent_says(cmd: &str, n: usize) -> Vec<serde_json::Value> {
    use std::io::{BufRead, Write};
    let mut child = Command::new(BIN)
        .args([
            "agent",
            "--demo",
            "--demo-host",
            "gpu-b",
            "--interval",
            "50ms",
        ])
        .env("GPUSWEEP_CONFIG", "/nonexistent/gpusweep.toml")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("agent");
    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin, "{cmd}").expect("command");
    let out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let lines: Vec<serde_json::Value> = out
        .lines()
        .take(n)
        .map(|l| serde_json::from_str(&l.expect("line")).expect("json"))
        .collect();
    let _ = child.kill();
    let _ = child.wait();
    lines
}

#[test]
fn an_agent_sends_unchanged_readings_compactly_only_to_a_client_that_asks() {
    // A client that asks: after the first whole snapshot, a quiet host's readings are time and gauges only.
    let said = agent_says(r#"{"cmd":"interval","ms":50,"compact":true}"#, 6);
    let types: Vec<&str> = said.iter().filter_map(|m| m["type"].as_str()).collect();
    assert_eq!(types[..2], ["hello", "snapshot"], "{types:?}");
    assert!(types[2..].iter().all(|t| *t == "unchanged"), "{types:?}");
    assert_eq!(said[3]["gauges"].as_array().map(Vec::len), Some(8));
    assert!(said[3]["taken_at_ms"].as_u64() > said[1]["snapshot"]["taken_at_ms"].as_u64());
    // A client of an older version, which never asks: every reading whole, as before.
    let said = agent_says(r#"{"cmd":"interval","ms":50}"#, 5);
    assert!(
        said[1..].iter().all(|m| m["type"] == "snapshot"),
        "{said:?}"
    );
}

#[test]
fn a_snapshot_table_prints_each_host_as_it_answers_while_one_hangs() {
    use std::io::{BufRead, BufReader};
    let agent = format!("cmd:'{BIN}' agent --demo --demo-host gpu-b");
    let mut child = Command::new(BIN)
        .args(["snapshot", "--connect-timeout", "60"])
        .args(["--hosts", "cmd:sleep 1000", "--hosts", &agent])
        .env("GPUSWEEP_CONFIG", "/nonexistent/gpusweep.toml")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("snapshot");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    // The agent's table comes out while the hung host is still waited for (60 s).
    let header = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.starts_with("== cmd:") && l.contains("agent"))
        .expect("the answering host's table");
    assert!(header.contains("(agent"), "{header}");
    assert!(
        child.try_wait().expect("status").is_none(),
        "printed before the hung host's deadline"
    );
    // TERM, not KILL: gpusweep ends the `cmd:` hosts' process groups on its way out.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("TERM");
    assert_eq!(child.wait().expect("wait").code(), Some(143));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpusweeps_own_client_resumes_its_stream_where_it_was() {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("tmp");
    let demo = Command::new(BIN)
        .args(["snapshot", "--demo", "--hosts", "gpu-a", "--json"])
        .env("GPUSWEEP_CONFIG", dir.path().join("none.toml"))
        .output()
        .expect("demo");
    let doc: serde_json::Value = serde_json::from_slice(&demo.stdout).expect("json");
    let host = doc["hosts"][0].to_string();
    // A "serve" whose first stream ends after its hello (id 5-7); the second is answered with a reading.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = asked.clone();
    std::thread::spawn(move || {
        for (n, stream) in listener.incoming().flatten().enumerate() {
            let mut s = stream;
            let req = crate::support::read_request(&mut s).unwrap_or_default();
            seen.lock().expect("lock").push(req.to_lowercase());
            let hello = r#"{"protocol":1,"version":"0.1.0","hosts":["gpu-a"],"interval_ms":1000}"#;
            let mut body = format!("event: hello\ndata: {hello}\nid: 5-7\n\n");
            if n > 0 {
                body.push_str(&format!("event: snapshot\ndata: {host}\nid: 5-8\n\n"));
            }
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n{body}"
            );
            if n > 0 {
                std::thread::sleep(Duration::from_secs(5));
            }
        }
    });
    let spec = HostSpec::Http {
        url: gpusweep::core::host::HttpUrl::parse(&format!("http://{addr}")).expect("url"),
    };
    let mut fleet = fleet_of(spec, Duration::from_secs(1), &dir.path().join("audit")).await;
    // The first stream ends (the host is down a moment), the second brings the reading.
    loop {
        if let HostEvent::Update {
            update: Judgement::New(_),
            ..
        } = next_event(&mut fleet, Duration::from_secs(20)).await
        {
            break;
        }
    }
    let asked = asked.lock().expect("lock").clone();
    assert!(asked.len() >= 2, "{asked:?}");
    assert!(!asked[0].contains("last-event-id"), "{}", asked[0]);
    assert!(asked[1].contains("last-event-id: 5-7"), "{}", asked[1]);
}
