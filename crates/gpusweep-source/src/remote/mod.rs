//! Remote hosts: a task per host that connects, streams whole readings into its `Sink`, and on any failure
//! says why and reconnects with backoff. Transports: SSH (`ssh`), a local command whose stdio speaks the agent
//! protocol (`command`), and the agentless shell scan (`agentless`). Remote output is untrusted (`stream`).

pub mod agentless;
pub mod command;
pub mod http;
pub mod http_group;
pub mod prom;
pub mod socket;
pub mod ssh;
pub mod stream;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};

use super::{ConnStatus, HostCmd, Refuse, Sink};
use gpusweep_core::host::HostSpec;

/// How late a silence alarm may fire and still say the host was silent. Later than this, the client itself
/// was not running (a starved CPU, a stopped process): what the host said meanwhile waits unread in its
/// socket, so its silence cannot be told from the client's own, and the count starts again from now.
pub(crate) const SELF_STALL: Duration = Duration::from_millis(500);

/// Whether a silence alarm due at `due`, seen at `now`, is the host's silence (`true`), or the client's own
/// lateness (`false`): a host is down only from its own silence.
pub(crate) fn silence_is_the_hosts(due: tokio::time::Instant, now: tokio::time::Instant) -> bool {
    now.saturating_duration_since(due) < SELF_STALL
}

/// What every remote host needs to know.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    pub interval: Duration,
    pub ssh: ssh::SshOptions,
    /// Process names that open GPUs without holding memory (for agentless hosts).
    pub benign: Vec<String>,
    /// The client `http(s)://` hosts and Prometheus servers share, where the fleet has any.
    pub http: Option<http::HttpClient>,
}

pub struct RemoteTask {
    pub label: String,
    pub spec: HostSpec,
    pub opts: RemoteOptions,
    pub sink: Arc<dyn Sink>,
    /// Connections (or command spawns) in progress at once, shared by the fleet.
    pub connect_limit: Arc<Semaphore>,
}

/// The first backoff after a failure; it doubles up to `MAX_BACKOFF`.
pub(super) const FIRST_BACKOFF: Duration = Duration::from_millis(500);
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(30);

impl RemoteTask {
    pub fn status(&self, status: ConnStatus) -> bool {
        self.sink.status(status)
    }

    /// Connect, stream, and on any failure report it and reconnect with backoff, until the fleet is dropped.
    pub async fn run(self, mut cmds: mpsc::Receiver<HostCmd>) {
        let mut backoff = FIRST_BACKOFF;
        let mut interval = self.opts.interval;
        loop {
            if !self.status(ConnStatus::Connecting) {
                return;
            }
            let ended = match &self.spec {
                HostSpec::Command { command } => {
                    command::run(&self, command, &mut cmds, &mut interval).await
                }
                HostSpec::Ssh { .. } => ssh::run(&self, &mut cmds, &mut interval).await,
                HostSpec::Socket { path } => {
                    socket::run(&self, path, &mut cmds, &mut interval).await
                }
                HostSpec::Prom(p) => Err(self.why_no_prom_hosts(p).await),
                _ => Err("not a remote host".into()),
            };
            let reason = match ended {
                Ok(()) => return,
                Err(e) => e,
            };
            if !self.status(ConnStatus::Down(reason)) {
                return;
            }
            if !self.back_off(backoff, &mut cmds, &mut interval).await {
                return;
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Why a Prometheus server stands as one unreadable host: it could not be asked which hosts it knows
    /// when gpusweep started (asked again now, for the reason), or it knew none.
    async fn why_no_prom_hosts(&self, p: &gpusweep_core::host::PromSpec) -> String {
        let now = match &self.opts.http {
            Some(http) => {
                match tokio::time::timeout(self.opts.ssh.connect_timeout, prom::discover(p, http))
                    .await
                {
                    Ok(Ok(found)) if found.names.is_empty() => {
                        "it knows no host with GPU series".into()
                    }
                    Ok(Ok(_)) => "it answers now: start gpusweep again to read its hosts".into(),
                    Ok(Err(e)) => e,
                    Err(_) => "it did not answer in time".into(),
                }
            }
            None => "no HTTP client".into(),
        };
        format!(
            "Prometheus {} could not be asked which hosts it knows when gpusweep started: {now}",
            p.url
        )
    }

    /// Wait before reconnecting, but keep answering: a signal to a down host fails at once; `r` reconnects
    /// now. False when the fleet is gone.
    async fn back_off(
        &self,
        backoff: Duration,
        cmds: &mut mpsc::Receiver<HostCmd>,
        interval: &mut Duration,
    ) -> bool {
        wait_answering(backoff, cmds, |c| match c {
            HostCmd::PollNow | HostCmd::Wake => true,
            HostCmd::Interval(d) => {
                *interval = d;
                false
            }
            c @ HostCmd::Act { .. } => {
                c.refuse(self.sink.as_ref(), "host is down");
                false
            }
        })
        .await
    }
}

/// Wait `backoff` before connecting again, answering each command meanwhile with `on` (true: connect now).
/// False when the fleet is gone.
pub(super) async fn wait_answering<C>(
    backoff: Duration,
    cmds: &mut mpsc::Receiver<C>,
    mut on: impl FnMut(C) -> bool,
) -> bool {
    let sleep = tokio::time::sleep(backoff);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            () = &mut sleep => return true,
            c = cmds.recv() => match c {
                None => return false,
                Some(c) => if on(c) {
                    return true;
                },
            }
        }
    }
}
