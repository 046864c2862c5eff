//! SSH transport (russh): connect (through ProxyJump hops when ~/.ssh/config says so), verify the host key
//! against known_hosts, authenticate with ssh-agent or key files, then
//! - run `gpusweep agent` on the host and speak the agent protocol over the channel, or
//! - with `--deploy`, upload this binary first when the host has none (same architecture, checksummed), or
//! - fall back to agentless readings: nvidia-smi CSV and a read-only shell scan of /proc.
//!
//! Nothing a user types or a host file contains reaches a remote shell: host names are validated and only used
//! to connect; the remote command comes from the operator's own flag or config; PIDs travel as JSON numbers.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::client::{self, Handle};
use russh::keys::{HashAlg, PrivateKeyWithHashAlg, PublicKey, known_hosts};
use russh::{ChannelMsg, Disconnect};
use sha2::{Digest, Sha256};
use tokio::io::BufReader;
use tokio::sync::mpsc;

use crate::collect::{ConnStatus, HostCmd, HostEvent};
use crate::hosts::HostSpec;
use crate::model::{HostSnapshot, SourceKind, now_ms};
use crate::source::agent_client::{RemoteTask, all_failed, drive_stream};
use crate::source::smi;

#[derive(Debug, Clone)]
pub struct SshOptions {
    pub remote_command: String,
    pub deploy: bool,
    pub accept_new: bool,
    pub max_connections: usize,
    pub connect_timeout: Duration,
    pub identities: Vec<PathBuf>,
    pub ssh_config: Option<PathBuf>,
    pub known_hosts: Option<PathBuf>,
}

impl Default for SshOptions {
    fn default() -> Self {
        SshOptions {
            remote_command: "gpusweep agent".into(),
            deploy: false,
            accept_new: false,
            max_connections: 16,
            connect_timeout: Duration::from_secs(10),
            identities: vec![],
            ssh_config: None,
            known_hosts: None,
        }
    }
}

/// Where and as whom to connect, after ~/.ssh/config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub identity_files: Vec<PathBuf>,
    pub proxy_jump: Vec<String>,
}

fn home() -> Option<PathBuf> {
    dirs::home_dir()
}

fn expand_tilde(p: &Path) -> PathBuf {
    match (p.strip_prefix("~"), home()) {
        (Ok(rest), Some(h)) => h.join(rest),
        _ => p.to_path_buf(),
    }
}

fn local_user() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "root".into())
}

/// Resolve an alias through the ssh_config file. Command-line user and port win over the file.
pub fn resolve(
    alias: &str,
    user: Option<&str>,
    port: Option<u16>,
    ssh_config: Option<&Path>,
) -> Target {
    let path = ssh_config
        .map(Path::to_path_buf)
        .or_else(|| home().map(|h| h.join(".ssh/config")));
    let hc = path
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|text| russh_config::parse(&text, alias).ok())
        .map(|c| c.host_config)
        .unwrap_or_default();
    Target {
        host: hc.hostname.clone().unwrap_or_else(|| alias.to_string()),
        port: port.or(hc.port).unwrap_or(22),
        user: user
            .map(str::to_string)
            .or(hc.user.clone())
            .unwrap_or_else(local_user),
        identity_files: hc
            .identity_file
            .clone()
            .unwrap_or_default()
            .iter()
            .map(|p| expand_tilde(p))
            .collect(),
        proxy_jump: hc
            .proxy_jump
            .as_deref()
            .filter(|j| !j.eq_ignore_ascii_case("none"))
            .map(|j| {
                j.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// Checks the server key against known_hosts and remembers why it refused.
pub struct Client {
    host: String,
    port: u16,
    accept_new: bool,
    user_file: PathBuf,
    system_file: PathBuf,
    refusal: Arc<Mutex<Option<String>>>,
}

impl Client {
    fn verdict(&self, key: &PublicKey) -> Result<(), String> {
        let fp = key.fingerprint(HashAlg::Sha256);
        let name = if self.port == 22 {
            self.host.clone()
        } else {
            format!("[{}]:{}", self.host, self.port)
        };
        for file in [&self.user_file, &self.system_file] {
            match known_hosts::check_known_hosts_path(&self.host, self.port, key, file) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(russh::keys::Error::KeyChanged { line }) => {
                    return Err(format!(
                        "HOST KEY CHANGED for {name} ({fp}; {}:{line} has another): refusing. If the change is expected, remove the old key with `ssh-keygen -R '{name}'`",
                        file.display()
                    ));
                }
                Err(e) => return Err(format!("reading {}: {e}", file.display())),
            }
        }
        if self.accept_new {
            known_hosts::learn_known_hosts_path(&self.host, self.port, key, &self.user_file)
                .map_err(|e| {
                    format!(
                        "cannot learn the key of {name} into {}: {e}",
                        self.user_file.display()
                    )
                })?;
            return Ok(());
        }
        Err(format!(
            "unknown host key for {name} ({fp}): not in {} or {}. Check it, then add it (ssh-keyscan) or run once with --accept-new",
            self.user_file.display(),
            self.system_file.display()
        ))
    }
}

impl client::Handler for Client {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        key: &russh::keys::PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        match self.verdict(&key.public_key()) {
            Ok(()) => Ok(true),
            Err(why) => {
                if let Ok(mut r) = self.refusal.lock() {
                    *r = Some(why);
                }
                Ok(false)
            }
        }
    }
}

fn russh_config() -> Arc<client::Config> {
    Arc::new(client::Config {
        // A host that stops answering is noticed within ~45 s even when no data flows.
        keepalive_interval: Some(Duration::from_secs(15)),
        keepalive_max: 3,
        inactivity_timeout: None,
        ..Default::default()
    })
}

/// An authenticated session, and the jump sessions it runs through (kept alive with it).
pub struct Session {
    pub handle: Handle<Client>,
    _jumps: Vec<Handle<Client>>,
}

async fn open_one(
    t: &Target,
    via: Option<&Handle<Client>>,
    opts: &SshOptions,
) -> Result<Handle<Client>, String> {
    let refusal = Arc::new(Mutex::new(None));
    let handler = Client {
        host: t.host.clone(),
        port: t.port,
        accept_new: opts.accept_new,
        user_file: opts
            .known_hosts
            .clone()
            .or_else(|| home().map(|h| h.join(".ssh/known_hosts")))
            .unwrap_or_default(),
        system_file: PathBuf::from("/etc/ssh/ssh_known_hosts"),
        refusal: refusal.clone(),
    };
    let name = format!("{}@{}:{}", t.user, t.host, t.port);
    let res = match via {
        None => client::connect(russh_config(), (t.host.as_str(), t.port), handler).await,
        Some(jump) => {
            let ch = jump
                .channel_open_direct_tcpip(t.host.clone(), t.port as u32, "127.0.0.1", 0)
                .await
                .map_err(|e| format!("{name}: the jump host could not open a tunnel: {e}"))?;
            client::connect_stream(russh_config(), ch.into_stream(), handler).await
        }
    };
    let mut handle = match res {
        Ok(h) => h,
        Err(e) => {
            let why = refusal.lock().ok().and_then(|r| r.clone());
            return Err(why.unwrap_or_else(|| format!("{name}: {}", describe_io(&e))));
        }
    };
    authenticate(&mut handle, t, opts)
        .await
        .map_err(|e| format!("{name}: {e}"))?;
    Ok(handle)
}

fn describe_io(e: &russh::Error) -> String {
    match e {
        russh::Error::IO(io) => match io.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                "connection refused (no sshd listening?)".into()
            }
            std::io::ErrorKind::TimedOut => "connection timed out".into(),
            _ => io.to_string(),
        },
        other => other.to_string(),
    }
}

async fn authenticate(
    handle: &mut Handle<Client>,
    t: &Target,
    opts: &SshOptions,
) -> Result<(), String> {
    let mut tried = Vec::new();
    // ssh-agent first: no key material is ever read by gpusweep then.
    if std::env::var_os("SSH_AUTH_SOCK").is_some() {
        match russh::keys::agent::client::AgentClient::connect_env().await {
            Ok(mut agent) => {
                let ids = agent.request_identities().await.unwrap_or_default();
                tried.push(format!("ssh-agent ({} keys)", ids.len()));
                for id in ids {
                    let key = id.public_key().into_owned();
                    let hash = rsa_hash(handle, key.algorithm().is_rsa()).await;
                    if let Ok(r) = handle
                        .authenticate_publickey_with(&t.user, key, hash, &mut agent)
                        .await
                        && r.success()
                    {
                        return Ok(());
                    }
                }
            }
            Err(e) => tried.push(format!("ssh-agent unreachable ({e})")),
        }
    }
    let mut files: Vec<PathBuf> = opts.identities.iter().map(|p| expand_tilde(p)).collect();
    files.extend(t.identity_files.iter().cloned());
    if let Some(h) = home() {
        for n in ["id_ed25519", "id_ecdsa", "id_rsa"] {
            files.push(h.join(".ssh").join(n));
        }
    }
    files.dedup();
    for f in files {
        if !f.exists() {
            continue;
        }
        let key = match russh::keys::load_secret_key(&f, None) {
            Ok(k) => k,
            Err(e) => {
                tried.push(format!(
                    "{} (unusable: {e}; load it into ssh-agent)",
                    f.display()
                ));
                continue;
            }
        };
        tried.push(f.display().to_string());
        let hash = rsa_hash(handle, key.algorithm().is_rsa()).await;
        match handle
            .authenticate_publickey(&t.user, PrivateKeyWithHashAlg::new(Arc::new(key), hash))
            .await
        {
            Ok(r) if r.success() => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(format!("authentication: {e}")),
        }
    }
    Err(format!(
        "authentication failed for user {} (tried: {})",
        t.user,
        if tried.is_empty() {
            "no ssh-agent and no key files".into()
        } else {
            tried.join(", ")
        }
    ))
}

/// The RSA signature hash the server prefers. Only RSA keys need it, and asking can wait up to a second for the
/// server's extension info, so other keys skip it.
async fn rsa_hash(handle: &Handle<Client>, is_rsa: bool) -> Option<HashAlg> {
    if !is_rsa {
        return None;
    }
    handle
        .best_supported_rsa_hash()
        .await
        .ok()
        .flatten()
        .flatten()
}

/// Connect to `t`, through its ProxyJump hops in order.
pub async fn connect(t: &Target, opts: &SshOptions) -> Result<Session, String> {
    let mut jumps: Vec<Handle<Client>> = Vec::new();
    for hop in &t.proxy_jump {
        let spec = crate::hosts::parse_one(hop).map_err(|e| format!("ProxyJump: {e}"))?;
        let HostSpec::Ssh { user, host, port } = spec else {
            return Err(format!("ProxyJump {hop:?}: not a host"));
        };
        let mut ht = resolve(&host, user.as_deref(), port, opts.ssh_config.as_deref());
        ht.proxy_jump.clear();
        let h = open_one(&ht, jumps.last(), opts)
            .await
            .map_err(|e| format!("jump host {hop}: {e}"))?;
        jumps.push(h);
    }
    let handle = open_one(t, jumps.last(), opts).await?;
    Ok(Session {
        handle,
        _jumps: jumps,
    })
}

/// Run a command to completion: (exit status, stdout), stdin fed from `input`. Output is bounded.
pub async fn exec(
    handle: &Handle<Client>,
    command: &str,
    input: Option<&[u8]>,
    max: usize,
) -> Result<(Option<u32>, Vec<u8>), String> {
    let mut ch = handle
        .channel_open_session()
        .await
        .map_err(|e| format!("open channel: {e}"))?;
    ch.exec(true, command)
        .await
        .map_err(|e| format!("exec: {e}"))?;
    if let Some(data) = input {
        ch.data_bytes(data.to_vec())
            .await
            .map_err(|e| format!("upload: {e}"))?;
    }
    ch.eof().await.map_err(|e| format!("eof: {e}"))?;
    let mut out = Vec::new();
    let mut status = None;
    while let Some(msg) = ch.wait().await {
        match msg {
            ChannelMsg::Data { data } => {
                if out.len() + data.len() > max {
                    return Err(format!("the host sent more than {max} bytes"));
                }
                out.extend_from_slice(&data);
            }
            ChannelMsg::ExitStatus { exit_status } => status = Some(exit_status),
            _ => {}
        }
    }
    Ok((status, out))
}

/// Single-quote for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// What a host without the agent's program answers instead of a hello.
pub const NOT_FOUND: &str = "GPUSWEEP-AGENT-NOT-FOUND";

/// The agent command, guarded so that a host without the program says so in one line: one exec, one round
/// trip, instead of a probe session before the real one.
pub fn guarded(remote_command: &str) -> String {
    let prog = remote_command
        .split_whitespace()
        .next()
        .unwrap_or("gpusweep");
    format!(
        "if command -v {} >/dev/null 2>&1; then {remote_command}\nelse echo {NOT_FOUND}; fi",
        shell_quote(prog)
    )
}

/// Start `command` on a new channel; `Ok(None)` when the host lacks its program.
async fn start_agent(
    handle: &Handle<Client>,
    command: &str,
) -> Result<
    Option<(
        impl tokio::io::AsyncBufRead + Unpin + Send + 'static + use<>,
        impl tokio::io::AsyncWrite + Unpin + use<>,
    )>,
    String,
> {
    let ch = handle
        .channel_open_session()
        .await
        .map_err(|e| format!("open channel: {e}"))?;
    ch.exec(true, guarded(command))
        .await
        .map_err(|e| format!("exec: {e}"))?;
    let (r, w) = tokio::io::split(ch.into_stream());
    let mut r = BufReader::new(r);
    let first =
        crate::source::agent_client::read_line_bounded(&mut r, crate::agent::MAX_LINE_BYTES)
            .await
            .map_err(|e| format!("reading the agent: {e}"))?
            .unwrap_or_default();
    if String::from_utf8_lossy(&first).trim() == NOT_FOUND {
        return Ok(None);
    }
    // Hand the first line back to the protocol reader, in front of the rest.
    let mut line = first;
    line.push(b'\n');
    Ok(Some((
        BufReader::new(tokio::io::AsyncReadExt::chain(
            std::io::Cursor::new(line),
            r,
        )),
        w,
    )))
}

/// Upload this binary to `~/.cache/gpusweep/gpusweep-VERSION-SHA` when the architectures match; returns the
/// command that runs it as an agent.
async fn deploy(handle: &Handle<Client>) -> Result<String, String> {
    let (st, arch) = exec(handle, "uname -m", None, 256).await?;
    let arch = String::from_utf8_lossy(&arch).trim().to_string();
    if st != Some(0) || arch != std::env::consts::ARCH {
        return Err(format!(
            "cannot deploy: the host is {arch:?}, this binary is {}",
            std::env::consts::ARCH
        ));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let bytes = std::fs::read(&exe).map_err(|e| format!("reading {}: {e}", exe.display()))?;
    let sum = hex(&Sha256::digest(&bytes));
    let path = format!(
        "\"$HOME/.cache/gpusweep/gpusweep-{}-{}\"",
        env!("CARGO_PKG_VERSION"),
        &sum[..16]
    );
    let check = format!("sha256sum {path} 2>/dev/null | cut -d' ' -f1");
    let (_, have) = exec(handle, &check, None, 256).await?;
    if String::from_utf8_lossy(&have).trim() != sum {
        let up = format!(
            "mkdir -p \"$HOME/.cache/gpusweep\" && cat > {path}.tmp && chmod 755 {path}.tmp && mv {path}.tmp {path}"
        );
        let (st, _) = exec(handle, &up, Some(&bytes), 4096).await?;
        if st != Some(0) {
            return Err(format!("upload failed (exit {st:?})"));
        }
        let (_, have) = exec(handle, &check, None, 256).await?;
        if String::from_utf8_lossy(&have).trim() != sum {
            return Err("the uploaded binary's checksum does not match".into());
        }
    }
    Ok(format!("{path} agent"))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// One connection's life: connect, then agent (or deploy, or agentless) until it ends. Err says why.
pub async fn run(
    task: &RemoteTask,
    cmds: &mut mpsc::UnboundedReceiver<HostCmd>,
    interval: &mut Duration,
) -> Result<(), String> {
    let HostSpec::Ssh { user, host, port } = &task.spec else {
        return Err("not an SSH host".into());
    };
    let opts = &task.opts.ssh;
    let target = resolve(host, user.as_deref(), *port, opts.ssh_config.as_deref());
    crate::trace(&task.label, "connecting");
    let session = {
        let _permit = task
            .connect_limit
            .acquire()
            .await
            .map_err(|e| e.to_string())?;
        tokio::time::timeout(opts.connect_timeout, connect(&target, opts))
            .await
            .map_err(|_| format!("no connection within {}s", opts.connect_timeout.as_secs()))??
    };
    crate::trace(&task.label, "connected and authenticated");
    let mut stream = start_agent(&session.handle, &opts.remote_command).await?;
    crate::trace(&task.label, "agent started");
    if stream.is_none() && opts.deploy {
        let command = deploy(&session.handle).await?;
        stream = start_agent(&session.handle, &command).await?;
    }
    let r = match stream {
        Some((r, w)) => drive_stream(task, r, w, cmds, interval, SourceKind::Agent).await,
        None => run_agentless(task, &session.handle, cmds, interval).await,
    };
    let _ = session
        .handle
        .disconnect(Disconnect::ByApplication, "", "en")
        .await;
    r
}

/// Agentless: read nvidia-smi and /proc through a shell every interval. Signals are refused here: without
/// the agent there is no pidfd to make them safe.
async fn run_agentless(
    task: &RemoteTask,
    handle: &Handle<Client>,
    cmds: &mut mpsc::UnboundedReceiver<HostCmd>,
    interval: &mut Duration,
) -> Result<(), String> {
    let script = smi::shell_script();
    task.status(ConnStatus::Up);
    loop {
        let (_, out) = exec(handle, &script, None, 64 * 1024 * 1024).await?;
        let snap = agentless_snapshot(
            &task.label,
            &String::from_utf8_lossy(&out),
            &task.opts.procfs.benign,
        );
        let snap = crate::analyze::analyzed(snap, &task.opts.analyze);
        if task
            .events
            .send(HostEvent::Snapshot {
                host: task.index,
                snap: Box::new(snap),
            })
            .is_err()
        {
            return Ok(());
        }
        let sleep = tokio::time::sleep(*interval);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                _ = &mut sleep => break,
                c = cmds.recv() => match c {
                    None => return Ok(()),
                    Some(HostCmd::PollNow) => break,
                    Some(HostCmd::Interval(d)) => { *interval = d; break; }
                    Some(HostCmd::Signal { id, req }) => {
                        let outcomes = all_failed(&req, "agentless host: signals need gpusweep there (install it or use --deploy)");
                        let _ = task.events.send(HostEvent::Outcomes { host: task.index, id, outcomes });
                    }
                }
            }
        }
    }
}

/// Build a snapshot from the agentless shell scan's output.
pub fn agentless_snapshot(label: &str, out: &str, benign: &[String]) -> HostSnapshot {
    let scan = smi::parse_shell_scan(out);
    let mut gpus = smi::parse_gpus(&scan.gpus_csv);
    smi::attach_apps(&mut gpus, &scan.apps_csv);
    let mut procs = scan.procs;
    for (pid, cmd) in &scan.cmdlines {
        if let Some(p) = procs.get_mut(pid) {
            p.cmdline = cmd.clone();
        }
    }
    let mut holders = smi::holders_from_fds(&scan.fds, &gpus);
    for h in &mut holders {
        if let Some(p) = procs.get(&h.pid) {
            h.benign = crate::source::procfs::is_benign_name(p, benign);
        }
    }
    let mut wanted: std::collections::HashSet<u32> = holders.iter().map(|h| h.pid).collect();
    wanted.extend(gpus.iter().flat_map(|g| g.processes.iter().map(|p| p.pid)));
    let mut zombies: Vec<u32> = procs
        .values()
        .filter(|p| p.state == 'Z')
        .map(|p| p.pid)
        .collect();
    zombies.sort_unstable();
    wanted.extend(zombies.iter().copied());
    for pid in wanted.clone() {
        let mut cur = pid;
        for _ in 0..64 {
            let Some(p) = procs.get(&cur) else { break };
            if p.ppid <= 1 || !wanted.insert(p.ppid) {
                break;
            }
            cur = p.ppid;
        }
    }
    let mut processes: Vec<_> = wanted
        .iter()
        .filter_map(|p| procs.get(p).cloned())
        .collect();
    processes.sort_by_key(|p| p.pid);
    HostSnapshot {
        host: label.to_string(),
        error: None,
        taken_at_ms: now_ms(),
        source: SourceKind::Smi,
        gpu_error: scan.gpu_error,
        driver_version: None,
        gpus,
        processes,
        holders,
        zombies,
        shm: None,
        unreadable_processes: scan.unreadable,
        in_child_pid_namespace: false,
        missing_features: vec![
            "signals (agentless: install gpusweep there or use --deploy)".into(),
            "/dev/shm".into(),
            "temperature/power where nvidia-smi lacks them".into(),
        ],
        findings: vec![],
    }
}
