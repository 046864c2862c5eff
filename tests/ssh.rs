//! Remote hosts through a real OpenSSH sshd that each test starts on loopback (127.0.0.1-3, one port), with
//! generated host and user keys; the remote end is this binary's `agent --demo`. sshd is required (the
//! README's test command installs openssh-server); these tests fail rather than skip without it.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpusweep::core::host::HostSpec;
use gpusweep::runtime::{Fleet, FleetOptions, HostEvent, Judgement};
use gpusweep::source::ConnStatus;
use gpusweep::source::remote::ssh::SshOptions;

use crate::support::{BIN, await_cond, free_port, text};

struct Sshd {
    dir: tempfile::TempDir,
    port: u16,
    child: Child,
}

fn keygen(path: &Path) {
    keygen_type(path, "ed25519");
}

fn keygen_type(path: &Path, kind: &str) {
    let o = Command::new("ssh-keygen")
        .args(["-q", "-t", kind, "-N", "", "-f"])
        .arg(path)
        .output()
        .expect("ssh-keygen is required");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

impl Sshd {
    fn start() -> Sshd {
        Sshd::start_with_host_key("ed25519")
    }
    /// An sshd that offers only a host key of type `kind` (its file is `host_<kind>`).
    fn start_with_host_key(kind: &str) -> Sshd {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        keygen(&d.join("host_ed25519"));
        if kind != "ed25519" {
            keygen_type(&d.join(format!("host_{kind}")), kind);
        }
        keygen(&d.join("id_ed25519"));
        keygen(&d.join("bad_ed25519"));
        keygen(&d.join("other_host_ed25519"));
        std::fs::copy(d.join("id_ed25519.pub"), d.join("authorized_keys"))
            .expect("authorized_keys");
        std::fs::create_dir_all(d.join("home/.ssh")).expect("home");
        std::fs::create_dir_all(d.join("bin")).expect("bin");
        std::fs::create_dir_all(d.join("remote-home")).expect("remote home");
        // A fake nvidia-smi printing the reference H200's real CSV (idle GPU, ghost PID 924).
        let fake = "#!/bin/sh\ncase \"$*\" in\n *query-gpu*) echo '0, GPU-a5b2e79f-a4e0-1241-ebeb-3cdbbcebd2a0, NVIDIA H200, 10157, 143771, 616, 9.0, Enabled, 00000000:00:06.0' ;;\n *query-compute-apps=pid,gpu_uuid*) echo '924, GPU-a5b2e79f-a4e0-1241-ebeb-3cdbbcebd2a0, 10148, [Not Found]' ;;\n *query-compute-apps=pid*) echo '924' ;;\nesac\n";
        let fake_path = d.join("bin/nvidia-smi");
        std::fs::write(&fake_path, fake).expect("fake nvidia-smi");
        Command::new("chmod")
            .arg("755")
            .arg(&fake_path)
            .status()
            .expect("chmod");
        std::fs::create_dir_all("/run/sshd").expect("/run/sshd (run the tests as root)");
        let port = free_port();
        let cfg = format!(
            "Port {port}\nListenAddress 127.0.0.1\nListenAddress 127.0.0.2\nListenAddress 127.0.0.3\nHostKey {d}/host_{kind}\nAuthorizedKeysFile {d}/authorized_keys\nPidFile {d}/sshd.pid\nStrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\nPermitRootLogin yes\nAllowTcpForwarding yes\nSetEnv PATH={d}/bin:/usr/local/bin:/usr/bin:/bin GPUSWEEP_CONFIG={d}/none.toml HOME={d}/remote-home\nMaxStartups 200:30:400\nMaxSessions 200\nLogLevel ERROR\n",
            d = d.display()
        );
        std::fs::write(d.join("sshd_config"), cfg).expect("config");
        let sshd = ["/usr/sbin/sshd", "/usr/bin/sshd"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("sshd is required: apt-get install openssh-server");
        let child = Command::new(sshd)
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(d.join("sshd_config"))
            .stderr(Stdio::null())
            .spawn()
            .expect("start sshd");
        let s = Sshd { dir, port, child };
        let t = Instant::now();
        for a in ["127.0.0.1", "127.0.0.2", "127.0.0.3"] {
            while TcpStream::connect((a, port)).is_err() {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "sshd did not start listening"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        s.known_hosts(
            &["127.0.0.1", "127.0.0.2", "127.0.0.3"],
            &format!("host_{kind}.pub"),
        );
        s
    }
    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }
    fn known_hosts(&self, addrs: &[&str], key: &str) {
        let pubkey = std::fs::read_to_string(self.path(key)).expect("pub");
        let mut parts = pubkey.split_whitespace();
        let (alg, b64) = (parts.next().expect("alg"), parts.next().expect("key"));
        let text: String = addrs.iter().fold(String::new(), |mut t, a| {
            t.push_str(&format!("[{a}]:{} {alg} {b64}\n", self.port));
            t
        });
        self.write_known_hosts(&text);
    }
    /// known_hosts as `text` says.
    fn write_known_hosts(&self, text: &str) {
        std::fs::write(self.path("known_hosts"), text).expect("known_hosts");
    }
    /// The known_hosts line fields of a public key file: (algorithm, base64).
    fn key_fields(&self, key: &str) -> (String, String) {
        let pubkey = std::fs::read_to_string(self.path(key)).expect("pub");
        let mut parts = pubkey.split_whitespace();
        (
            parts.next().expect("alg").to_string(),
            parts.next().expect("key").to_string(),
        )
    }
    fn host(&self, n: u8) -> String {
        format!("root@127.0.0.{n}:{}", self.port)
    }
    fn cmd(&self, remote: &str, args: &[&str]) -> Command {
        self.cmd_with_key(remote, "id_ed25519", args)
    }
    fn cmd_with_key(&self, remote: &str, key: &str, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .arg("--known-hosts")
            .arg(self.path("known_hosts"))
            .arg("-i")
            .arg(self.path(key))
            .arg("--remote-command")
            .arg(remote)
            .arg("--connect-timeout")
            .arg("10")
            .env("HOME", self.path("home"))
            .env("GPUSWEEP_CONFIG", self.path("none.toml"))
            .env("GPUSWEEP_AUDIT_LOG", self.path("audit.jsonl"))
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("GPUSWEEP_HOSTS")
            .stdin(Stdio::null());
        c
    }
    fn run(&self, remote: &str, args: &[&str]) -> Output {
        self.cmd(remote, args).output().expect("gpusweep")
    }
    fn demo_agent() -> String {
        format!("{BIN} agent --demo --demo-host gpu-b")
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("json: {e}: {}", text(o)))
}

/// That the first host's error in a `snapshot --json` says each of `needles`.
#[track_caller]
fn assert_first_error(o: &Output, needles: &[&str]) {
    let e = host_error(o, 0);
    assert!(needles.iter().all(|n| e.contains(n)), "{e}");
}

#[test]
fn snapshot_of_three_hosts_and_one_that_is_down() {
    let s = Sshd::start();
    let hosts = format!(
        "{},{},{},root@127.0.0.4:{}",
        s.host(1),
        s.host(2),
        s.host(3),
        s.port
    );
    let t = Instant::now();
    let o = s.run(
        &Sshd::demo_agent(),
        &["snapshot", "--json", "--hosts", &hosts],
    );
    // Every host's reading, the down one's error in it; the exit says one could not be read.
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("could not be read"),
        "{}",
        text(&o)
    );
    let v = json(&o);
    let hs = v["hosts"].as_array().expect("hosts");
    assert_eq!(hs.len(), 4);
    for h in &hs[..3] {
        assert!(h["error"].is_null(), "{}", h["error"]);
        assert_eq!(h["source"], "agent");
        let kinds = crate::support::finding_kinds(h);
        for k in [
            "ghost",
            "hidden_holder",
            "residual",
            "orphaned_job",
            "zombie",
            "shm_leftover",
        ] {
            assert!(
                kinds.contains(&k),
                "{k} missing on {}: {kinds:?}",
                h["host"]
            );
        }
    }
    assert!(
        hs[3]["error"]
            .as_str()
            .expect("error")
            .contains("connection refused"),
        "{}",
        hs[3]["error"]
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "a down host must not stall the others"
    );
}

#[test]
fn remote_sweep_then_wait_across_hosts() {
    let s = Sshd::start();
    let hosts = format!("{},{}", s.host(1), s.host(2));
    let o = s.run(
        &Sshd::demo_agent(),
        &["wait", "--hosts", &hosts, "--timeout", "1500ms"],
    );
    crate::support::exited(&o, 1);
    assert!(
        text(&o).contains(&format!("{}: GPU 7", s.host(1)))
            && text(&o).contains(&format!("{}: GPU 6", s.host(2))),
        "{}",
        text(&o)
    );
    let o = s.run(
        &Sshd::demo_agent(),
        &[
            "wait",
            "--hosts",
            &hosts,
            "--gpus",
            "0-5",
            "--timeout",
            "10s",
        ],
    );
    crate::support::exited(&o, 0);
    let o = s.run(
        &Sshd::demo_agent(),
        &["sweep", "--yes", "--hosts", &hosts, "--timeout", "15s"],
    );
    let t = crate::support::exited(&o, 0);
    assert!(
        t.contains(&format!("{}: 7391", s.host(1))) && t.contains(&format!("{}: 7306", s.host(2))),
        "{t}"
    );
    assert!(t.contains("clean: every chosen GPU reads zero"), "{t}");
}

#[test]
fn host_keys_unknown_changed_and_learned() {
    let s = Sshd::start();
    let h = s.host(1);
    s.write_known_hosts("");
    let o = s.run(&Sshd::demo_agent(), &["snapshot", "--json", "--hosts", &h]);
    assert_first_error(&o, &["unknown host key", "--accept-new"]);
    s.known_hosts(&["127.0.0.1"], "other_host_ed25519.pub");
    let o = s.run(
        &Sshd::demo_agent(),
        &["snapshot", "--json", "--hosts", &h, "--accept-new"],
    );
    let e = host_error(&o, 0);
    assert!(
        e.contains("HOST KEY CHANGED"),
        "a changed key is refused even with --accept-new: {e}"
    );
    s.write_known_hosts("");
    let o = s.run(
        &Sshd::demo_agent(),
        &["snapshot", "--json", "--hosts", &h, "--accept-new"],
    );
    assert!(json(&o)["hosts"][0]["error"].is_null(), "{}", text(&o));
    let learned = std::fs::read_to_string(s.path("known_hosts")).expect("read");
    assert!(
        learned.contains(&format!("[127.0.0.1]:{}", s.port)),
        "{learned}"
    );
}

#[test]
fn failed_authentication_says_what_was_tried() {
    let s = Sshd::start();
    // A key the server does not know.
    let o = s
        .cmd_with_key(
            &Sshd::demo_agent(),
            "bad_ed25519",
            &["snapshot", "--json", "--hosts", &s.host(1)],
        )
        .output()
        .expect("run");
    assert_first_error(&o, &["authentication failed for user root", "bad_ed25519"]);
    assert_eq!(o.status.code(), Some(2), "no host could be read");
}

#[test]
fn garbage_instead_of_the_protocol() {
    let s = Sshd::start();
    let o = s.run(
        "echo hello from a login banner; cat",
        &["snapshot", "--json", "--hosts", &s.host(1)],
    );
    assert_first_error(
        &o,
        &[
            "did not speak the agent protocol",
            "hello from a login banner",
        ],
    );
    let bad = r#"printf '%s\n' '{"type":"hello","protocol":1,"version":"t","host":"h","pid":1}' 'NOT JSON'; cat"#;
    let o = s.run(bad, &["snapshot", "--json", "--hosts", &s.host(1)]);
    assert_first_error(&o, &["garbage from the agent", "NOT JSON"]);
}

/// Wait until `pid` has renamed itself.
fn await_comm(pid: u32, comm: &str) {
    let want = format!("{comm}\n");
    await_cond(&format!("{pid} to rename itself"), 10, || {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c == want)
    });
}

#[test]
#[allow(clippy::too_many_lines)] // one agentless session: readings, a hostile name, the refusal of a kill
fn agentless_fallback_reads_the_fake_nvidia_smi() {
    let s = Sshd::start();
    let o = s.run(
        "gpusweep-not-installed agent",
        &["snapshot", "--json", "--hosts", &s.host(1)],
    );
    let v = json(&o);
    let h = &v["hosts"][0];
    assert!(h["error"].is_null(), "{}", text(&o));
    assert_eq!(h["source"], "smi");
    assert_eq!(
        h["gpus"][0]["uuid"],
        "GPU-a5b2e79f-a4e0-1241-ebeb-3cdbbcebd2a0"
    );
    assert_eq!(h["gpus"][0]["memory"]["used"], 10157u64 * 1024 * 1024);
    assert!(
        h["gpus"][0]["utilization"].is_null(),
        "not asked of the fake: N/A, not 0"
    );
    assert!(
        h["missing_features"]
            .as_array()
            .expect("features")
            .iter()
            .any(|f| f.as_str().unwrap_or("").starts_with("signals"))
    );
    let kinds = crate::support::finding_kinds(h);
    assert!(
        kinds.contains(&"ghost") && kinds.contains(&"residual"),
        "{kinds:?}"
    );
    // A process whose name is a newline and a fake section header, started before the zombie's parent (so it
    // is listed first): every record after it must still be read.
    let mut hostile = Command::new("sh")
        .args([
            "-c",
            "printf '\\n##x' > /proc/$$/comm; while :; do sleep 1; done",
        ])
        .spawn()
        .expect("sh");
    await_comm(hostile.id(), "\n##x");
    // Kills are refused there: no pidfd without the agent. The target is a process the agentless scan sees
    // (the parent of a zombie), so the request reaches the host and the refusal is the host's own.
    let mut parent = Command::new("python3")
        .args([
            "-c",
            "import os,time\nif os.fork()==0: os._exit(0)\ntime.sleep(60)",
        ])
        .spawn()
        .expect("python3");
    let pid = parent.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let o = s.run(
            "gpusweep-not-installed agent",
            &["snapshot", "--json", "--hosts", &s.host(1)],
        );
        let seen = json(&o)["hosts"][0]["processes"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| p["pid"].as_u64() == Some(u64::from(pid))));
        if seen {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the zombie's parent never showed"
        );
    }
    let o = s.run(
        "gpusweep-not-installed agent",
        &["kill", &pid.to_string(), "--hosts", &s.host(1), "--yes"],
    );
    let _ = parent.kill();
    let _ = parent.wait();
    let _ = hostile.kill();
    let _ = hostile.wait();
    crate::support::exited(&o, 1);
    assert!(
        text(&o).contains("agentless host: signals and removals need gpusweep there"),
        "{}",
        text(&o)
    );
}

#[test]
fn proxy_jump_through_a_first_host() {
    let s = Sshd::start();
    let cfg = format!(
        "Host target\n  HostName 127.0.0.2\n  Port {0}\n  User root\n  ProxyJump root@127.0.0.1:{0}\n",
        s.port
    );
    std::fs::write(s.path("ssh_config"), cfg).expect("cfg");
    let cfg_path = s.path("ssh_config").display().to_string();
    let o = s.run(
        &Sshd::demo_agent(),
        &[
            "snapshot",
            "--json",
            "--hosts",
            "target",
            "--ssh-config",
            &cfg_path,
        ],
    );
    let v = json(&o);
    assert!(v["hosts"][0]["error"].is_null(), "{}", text(&o));
    assert_eq!(v["hosts"][0]["host"], "target");
    assert_eq!(v["hosts"][0]["gpus"].as_array().expect("gpus").len(), 8);
}

#[test]
fn local_command_transport() {
    let o = Command::new(BIN)
        .args([
            "snapshot",
            "--json",
            "--hosts",
            &format!("cmd:{BIN} agent --demo --demo-host gpu-c"),
        ])
        .env("GPUSWEEP_CONFIG", "/nonexistent/gpusweep.toml")
        .output()
        .expect("run");
    let v = json(&o);
    assert!(v["hosts"][0]["error"].is_null(), "{}", text(&o));
    assert!(
        v["hosts"][0]["findings"]
            .as_array()
            .expect("f")
            .iter()
            .any(|f| f["kind"] == "smem_limit")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_mid_stream_is_reported_and_reconnected() {
    let s = Sshd::start();
    let opts = FleetOptions {
        ssh: SshOptions {
            remote_command: format!("timeout 1 {BIN} agent --demo"),
            identities: vec![s.path("id_ed25519")],
            known_hosts: Some(s.path("known_hosts")),
            ssh_config: Some(s.path("none_config")),
            connect_timeout: Duration::from_secs(10),
            ..Default::default()
        },
        ..crate::remote::options(Duration::from_millis(200), &s.path("audit.jsonl"))
    };
    let spec = HostSpec::Ssh {
        user: Some("root".into()),
        host: "127.0.0.1".into(),
        port: Some(s.port),
    };
    let mut fleet = Fleet::start(&[spec], &opts).await.expect("fleet");
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut snapshots_after_down = 0;
    let mut down = None;
    while snapshots_after_down == 0 {
        let ev = tokio::time::timeout_at(deadline, fleet.recv())
            .await
            .expect("events in time")
            .expect("event");
        match ev {
            HostEvent::Update {
                update: Judgement::New(_),
                ..
            } if down.is_some() => snapshots_after_down += 1,
            HostEvent::Update {
                update: Judgement::New(_),
                ..
            } => seen.push("snapshot"),
            HostEvent::Status {
                status: ConnStatus::Down(e),
                ..
            } => down = Some(e),
            _ => {}
        }
    }
    assert!(!seen.is_empty(), "readings before the agent died");
    assert!(
        down.as_deref().unwrap_or("").contains("agent exited"),
        "{down:?}"
    );
}

fn host_error(o: &Output, i: usize) -> String {
    json(o)["hosts"][i]["error"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_host_known_by_ed25519_that_offers_only_rsa_is_a_changed_identity() {
    let s = Sshd::start_with_host_key("rsa");
    // The host was known by its ed25519 key; now it offers only RSA.
    s.known_hosts(&["127.0.0.1"], "host_ed25519.pub");
    let before = std::fs::read_to_string(s.path("known_hosts")).expect("read");
    let o = s.run(
        &Sshd::demo_agent(),
        &["snapshot", "--json", "--hosts", &s.host(1), "--accept-new"],
    );
    let e = host_error(&o, 0);
    assert!(
        e.contains("HOST KEY CHANGED") && e.contains("ssh-rsa") && e.contains("ssh-ed25519"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(s.path("known_hosts")).expect("read"),
        before,
        "nothing learned"
    );
}

#[test]
fn revoked_keys_and_negated_patterns_in_known_hosts() {
    let s = Sshd::start();
    let (alg, b64) = s.key_fields("host_ed25519.pub");
    let port = s.port;
    s.write_known_hosts(&format!(
        "[127.0.0.1]:{port} {alg} {b64}\n@revoked * {alg} {b64}\n"
    ));
    let o = s.run(
        &Sshd::demo_agent(),
        &["snapshot", "--json", "--hosts", &s.host(1), "--accept-new"],
    );
    let e = host_error(&o, 0);
    assert!(e.contains("REVOKED") && e.contains("@revoked"), "{e}");

    // Every loopback host but 127.0.0.1: .2 is known, .1 is not (and is not learned without --accept-new).
    s.write_known_hosts(&format!(
        "[127.0.0.*]:{port},![127.0.0.1]:{port} {alg} {b64}\n"
    ));
    let o = s.run(
        &Sshd::demo_agent(),
        &[
            "snapshot",
            "--json",
            "--hosts",
            &format!("{},{}", s.host(1), s.host(2)),
        ],
    );
    let v = json(&o);
    let by_host = |n: &str| {
        v["hosts"]
            .as_array()
            .and_then(|a| {
                a.iter()
                    .find(|h| h["host"].as_str().is_some_and(|x| x.contains(n)))
            })
            .unwrap_or_else(|| panic!("{n}: {v}"))
            .clone()
    };
    let one = by_host("127.0.0.1");
    assert!(
        one["error"]
            .as_str()
            .is_some_and(|e| e.contains("unknown host key")),
        "{one}"
    );
    assert!(by_host("127.0.0.2")["error"].is_null(), "{v}");
}

#[test]
fn ssh_config_options_are_honoured_or_refused_by_name() {
    let s = Sshd::start();
    let p = s.port;
    let kh = s.path("known_hosts").display().to_string();
    let cfg = format!(
        "Host viaproxy\n  HostName 127.0.0.1\n  Port {p}\n  ProxyCommand nc %h %p\n\
         Host lax\n  HostName 127.0.0.1\n  Port {p}\n  StrictHostKeyChecking no\n\
         Host ownfile\n  HostName 127.0.0.1\n  Port {p}\n  UserKnownHostsFile {kh}\n"
    );
    std::fs::write(s.path("ssh_config"), cfg).expect("cfg");
    let run = |host: &str| {
        Command::new(BIN)
            .args(["snapshot", "--json", "--hosts", host, "--ssh-config"])
            .arg(s.path("ssh_config"))
            .arg("-i")
            .arg(s.path("id_ed25519"))
            .args([
                "--remote-command",
                &Sshd::demo_agent(),
                "--connect-timeout",
                "10",
            ])
            .env("HOME", s.path("home"))
            .env("USER", "root")
            .env("GPUSWEEP_CONFIG", s.path("none.toml"))
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("GPUSWEEP_HOSTS")
            .stdin(Stdio::null())
            .output()
            .expect("gpusweep")
    };
    let e = host_error(&run("viaproxy"), 0);
    assert!(
        e.contains("ProxyCommand") && e.contains("not supported"),
        "{e}"
    );
    let e = host_error(&run("lax"), 0);
    assert!(e.contains("StrictHostKeyChecking no"), "{e}");
    // The known key is only in the file ssh_config names (HOME's known_hosts does not exist).
    let o = run("ownfile");
    assert!(json(&o)["hosts"][0]["error"].is_null(), "{}", text(&o));
}

/// A snapshot of host 1 where gpusweep is not installed, with --deploy.
fn deploy_snapshot(s: &Sshd) -> Output {
    s.run(
        "gpusweep-not-installed-here agent",
        &[
            "snapshot",
            "--json",
            "--hosts",
            &s.host(1),
            "--deploy",
            "--no-nvml",
        ],
    )
}

#[test]
fn deploy_uploads_through_a_fresh_name_and_runs_what_it_verified() {
    use std::os::unix::fs::PermissionsExt;
    let s = Sshd::start();
    let cache = s.path("remote-home/.cache/gpusweep");
    std::fs::create_dir_all(&cache).expect("cache");
    // Planted links where a fixed temporary name or the final name would be: neither victim may change.
    let victim = s.path("victim");
    std::fs::write(&victim, "precious").expect("victim");
    let version = env!("CARGO_PKG_VERSION");
    let bin = std::fs::read(BIN).expect("binary");
    let sum = {
        let o = Command::new("sha256sum")
            .arg(BIN)
            .output()
            .expect("sha256sum");
        String::from_utf8_lossy(&o.stdout)[..16].to_string()
    };
    let name = format!("gpusweep-{version}-{sum}");
    std::os::unix::fs::symlink(&victim, cache.join(format!("{name}.tmp"))).expect("link");
    std::os::unix::fs::symlink(&victim, cache.join(&name)).expect("link");
    let o = deploy_snapshot(&s);
    let v = json(&o);
    assert!(v["hosts"][0]["error"].is_null(), "{}", text(&o));
    assert_eq!(v["hosts"][0]["source"], "agent", "{v}");
    assert_eq!(
        std::fs::read_to_string(&victim).expect("victim"),
        "precious"
    );
    let placed = cache.join(&name);
    let meta = std::fs::symlink_metadata(&placed).expect("uploaded");
    assert!(
        meta.file_type().is_file(),
        "the link was replaced, not followed"
    );
    assert_eq!(std::fs::read(&placed).expect("read").len(), bin.len());
    let dir_mode = std::fs::metadata(&cache).expect("dir").permissions().mode() & 0o777;
    assert_eq!(dir_mode, 0o700);
    // A second run finds the verified binary and uploads nothing (the file is not rewritten).
    let before = std::fs::metadata(&placed)
        .expect("meta")
        .modified()
        .expect("mtime");
    let o = deploy_snapshot(&s);
    assert!(json(&o)["hosts"][0]["error"].is_null(), "{}", text(&o));
    assert_eq!(
        std::fs::metadata(&placed)
            .expect("meta")
            .modified()
            .expect("mtime"),
        before
    );
}
