//! SSH transport (russh): connect (through ProxyJump hops when ~/.ssh/config says so), verify the host key
//! against known_hosts, authenticate with ssh-agent or key files, then
//! - run `gpusweep agent` on the host and speak the agent protocol over the channel, or
//! - with `--deploy`, upload this binary first when the host has none (same architecture, checksummed), or
//! - fall back to agentless readings: nvidia-smi CSV and a read-only shell scan of /proc.
//!
//! Nothing a user types or a host file contains reaches a remote shell: host names are validated and only used
//! to connect; the remote command comes from the operator's own flag or config; PIDs travel as JSON numbers.

pub mod auth;
pub mod connect;
pub mod deploy;
pub mod known_hosts;

use std::path::{Path, PathBuf};
use std::time::Duration;

use russh::Disconnect;
use tokio::sync::mpsc;

use russh::client::Handle;

use super::stream::drive_stream;
use super::{RemoteTask, agentless};
use crate::{ConnStatus, HostCmd, Refuse};
use gpusweep_core::host::HostSpec;
use gpusweep_core::model::SourceKind;
use gpusweep_core::trace;

use connect::connect;
pub use connect::{Client, Session};
pub use deploy::{NOT_FOUND, exec, guarded, shell_quote};

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
    /// ssh_config's `UserKnownHostsFile` (honoured unless --known-hosts says otherwise).
    pub known_hosts: Option<PathBuf>,
    /// ssh_config options gpusweep does not implement for this host; connecting is refused, naming them,
    /// rather than silently doing something other than `ssh` would.
    pub unsupported: Vec<String>,
}

pub fn home() -> Option<PathBuf> {
    dirs::home_dir()
}

pub(crate) fn expand_tilde(p: &Path) -> PathBuf {
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
        known_hosts: hc.user_known_hosts_file.as_deref().map(expand_tilde),
        unsupported: unsupported_options(&hc),
    }
}

/// What ssh_config asks for that gpusweep will not do.
fn unsupported_options(hc: &russh_config::HostConfig) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(pc) = hc
        .proxy_command
        .as_deref()
        .filter(|c| !c.eq_ignore_ascii_case("none"))
    {
        out.push(format!(
            "ProxyCommand {:?} is not supported: use ProxyJump, or a cmd: host that runs ssh itself",
            gpusweep_core::format::truncate(pc, 60)
        ));
    }
    if hc.strict_host_key_checking == Some(false) {
        out.push(
            "StrictHostKeyChecking no is not honoured: gpusweep never connects to a host whose key it has \
             not verified (--accept-new learns keys of new hosts)"
                .into(),
        );
    }
    out
}

/// One connection's life: connect, then agent (or deploy, or agentless) until it ends. Err says why.
pub async fn run(
    task: &RemoteTask,
    cmds: &mut mpsc::Receiver<HostCmd>,
    interval: &mut Duration,
) -> Result<(), String> {
    let HostSpec::Ssh { user, host, port } = &task.spec else {
        return Err("not an SSH host".into());
    };
    let opts = &task.opts.ssh;
    // ~/.ssh/config is read from disk: off the async threads.
    let (alias, login, port, config) = (host.clone(), user.clone(), *port, opts.ssh_config.clone());
    let target = tokio::task::spawn_blocking(move || {
        resolve(&alias, login.as_deref(), port, config.as_deref())
    })
    .await
    .map_err(|e| format!("reading the ssh config: {e}"))?;
    trace(&task.label, "connecting");
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
    trace(&task.label, "connected and authenticated");
    let mut stream = deploy::start_agent(&session.handle, &guarded(&opts.remote_command)).await?;
    trace(&task.label, "agent started");
    if stream.is_none() && opts.deploy {
        let d = deploy::Deployment::prepare(&session.handle).await?;
        stream = deploy::start_agent(&session.handle, &d.run_line()).await?;
        if stream.is_none() {
            trace(&task.label, "uploading this binary");
            d.upload(&session.handle).await?;
            stream = deploy::start_agent(&session.handle, &d.run_line()).await?;
            if stream.is_none() {
                return Err(
                    "--deploy: the uploaded binary did not pass its checksum on the host".into(),
                );
            }
        }
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
    cmds: &mut mpsc::Receiver<HostCmd>,
    interval: &mut Duration,
) -> Result<(), String> {
    let script = agentless::shell_script();
    task.status(ConnStatus::Up);
    loop {
        let (_, out) = exec(handle, &script, None, 64 * 1024 * 1024).await?;
        let snap = agentless::agentless_snapshot(
            &task.label,
            &String::from_utf8_lossy(&out),
            &task.opts.benign,
        );
        if !task.sink.reading(snap) {
            return Ok(());
        }
        let sleep = tokio::time::sleep(*interval);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                () = &mut sleep => break,
                c = cmds.recv() => match c {
                    None => return Ok(()),
                    Some(HostCmd::PollNow | HostCmd::Wake) => break,
                    Some(HostCmd::Interval(d)) => { *interval = d; break; }
                    Some(c @ HostCmd::Act { .. }) => {
                        c.refuse(task.sink.as_ref(), "agentless host: signals and removals need gpusweep there (install it or use --deploy)");
                    }
                }
            }
        }
    }
}
