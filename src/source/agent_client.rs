//! The client end of the agent protocol, over any byte stream: an SSH channel, or the stdio of a local
//! command (`cmd:kubectl exec ... gpusweep agent`). Remote output is untrusted: lines are bounded, JSON that
//! does not parse ends the connection with a message saying what came instead, nothing panics.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Semaphore, mpsc};

use crate::agent::{AgentCmd, AgentMsg, MAX_LINE_BYTES, PROTOCOL};
use crate::analyze::analyzed;
use crate::collect::{ConnStatus, FleetOptions, HostCmd, HostEvent};
use crate::hosts::HostSpec;
use crate::model::SourceKind;
use crate::sweep::{Fate, Outcome, SignalRequest};

pub struct RemoteTask {
    pub index: usize,
    pub label: String,
    pub spec: HostSpec,
    pub opts: FleetOptions,
    pub events: mpsc::UnboundedSender<HostEvent>,
    pub connect_limit: Arc<Semaphore>,
}

/// Outcomes for a request that could not be carried out at all.
pub fn all_failed(req: &SignalRequest, reason: &str) -> Vec<Outcome> {
    req.targets
        .iter()
        .map(|t| Outcome {
            pid: t.pid,
            start_time: t.start_time,
            cmdline: t.cmdline.clone(),
            fate: Fate::Failed {
                reason: reason.to_string(),
            },
        })
        .collect()
}

impl RemoteTask {
    pub fn status(&self, status: ConnStatus) -> bool {
        self.events
            .send(HostEvent::Status {
                host: self.index,
                status,
            })
            .is_ok()
    }

    /// Connect, stream, and on any failure report it and reconnect with backoff, until the fleet is dropped.
    pub async fn run(self, mut cmds: mpsc::UnboundedReceiver<HostCmd>) {
        let mut backoff = Duration::from_millis(500);
        let mut interval = self.opts.interval;
        loop {
            if !self.status(ConnStatus::Connecting) {
                return;
            }
            let ended = match &self.spec {
                HostSpec::Command { command } => {
                    self.run_command(command, &mut cmds, &mut interval).await
                }
                HostSpec::Ssh { .. } => super::ssh::run(&self, &mut cmds, &mut interval).await,
                _ => Err("not a remote host".into()),
            };
            let reason = match ended {
                Ok(()) => return,
                Err(e) => e,
            };
            if !self.status(ConnStatus::Down(reason)) {
                return;
            }
            // Back off, but keep answering: a signal to a down host fails at once; `r` reconnects now.
            let sleep = tokio::time::sleep(backoff);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    _ = &mut sleep => break,
                    c = cmds.recv() => match c {
                        None => return,
                        Some(HostCmd::PollNow) => break,
                        Some(HostCmd::Interval(d)) => interval = d,
                        Some(HostCmd::Signal { id, req }) => {
                            let outcomes = all_failed(&req, "host is down");
                            let _ = self.events.send(HostEvent::Outcomes { host: self.index, id, outcomes });
                        }
                    }
                }
            }
            backoff = (backoff * 2).min(Duration::from_secs(30));
        }
    }

    async fn run_command(
        &self,
        command: &str,
        cmds: &mut mpsc::UnboundedReceiver<HostCmd>,
        interval: &mut Duration,
    ) -> Result<(), String> {
        let permit = self
            .connect_limit
            .acquire()
            .await
            .map_err(|e| e.to_string())?;
        let mut child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(command)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {command:?}: {e}"))?;
        drop(permit);
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("no stdio from the command".into());
        };
        let errtail = spawn_tail(stderr);
        let r = drive_stream(
            self,
            BufReader::new(stdout),
            stdin,
            cmds,
            interval,
            SourceKind::Agent,
        )
        .await;
        let _ = child.kill().await;
        let tail = errtail.await.unwrap_or_default();
        r.map_err(|e| {
            if tail.is_empty() {
                e
            } else {
                format!("{e}: {tail}")
            }
        })
    }
}

/// The last line or so a process wrote on stderr, for error messages.
pub fn spawn_tail<R: AsyncRead + Unpin + Send + 'static>(r: R) -> tokio::task::JoinHandle<String> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(r).lines();
        let mut last = String::new();
        while let Ok(Some(l)) = lines.next_line().await {
            if !l.trim().is_empty() {
                last = crate::tui::view::truncate(l.trim(), 200);
            }
        }
        last
    })
}

/// Read one line of at most `max` bytes. `Ok(None)` at end of stream.
pub async fn read_line_bounded<R: AsyncBufRead + Unpin>(
    r: &mut R,
    max: usize,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::new();
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(if buf.is_empty() { None } else { Some(buf) });
        }
        if let Some(i) = avail.iter().position(|&b| b == b'\n') {
            buf.extend_from_slice(&avail[..i]);
            r.consume(i + 1);
            return Ok(Some(buf));
        }
        let n = avail.len();
        buf.extend_from_slice(avail);
        r.consume(n);
        if buf.len() > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a line longer than {max} bytes"),
            ));
        }
    }
}

fn preview(b: &[u8]) -> String {
    crate::tui::view::truncate(String::from_utf8_lossy(b).trim(), 80)
}

/// Speak the agent protocol until the stream ends or misbehaves. Err says why, for the host's status line.
pub async fn drive_stream<R, W>(
    task: &RemoteTask,
    reader: R,
    mut writer: W,
    cmds: &mut mpsc::UnboundedReceiver<HostCmd>,
    interval: &mut Duration,
    kind: SourceKind,
) -> Result<(), String>
where
    R: AsyncBufRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin,
{
    let (ltx, mut lines) = mpsc::channel::<std::io::Result<Option<Vec<u8>>>>(16);
    let reader_task = tokio::spawn(async move {
        let mut reader = reader;
        loop {
            let r = read_line_bounded(&mut reader, MAX_LINE_BYTES).await;
            let end = !matches!(r, Ok(Some(_)));
            if ltx.send(r).await.is_err() || end {
                return;
            }
        }
    });
    let connect_timeout = task.opts.ssh.connect_timeout;
    let result = async {
        // The first line must be the agent's hello.
        let first = tokio::time::timeout(connect_timeout, lines.recv())
            .await
            .map_err(|_| format!("no hello from the agent within {}s", connect_timeout.as_secs()))?;
        let first = match first {
            Some(Ok(Some(l))) => l,
            Some(Ok(None)) | None => return Err("the agent exited before saying hello".to_string()),
            Some(Err(e)) => return Err(format!("reading the agent: {e}")),
        };
        match serde_json::from_slice::<AgentMsg>(&first) {
            Ok(AgentMsg::Hello { protocol, .. }) if protocol == PROTOCOL => {}
            Ok(AgentMsg::Hello { protocol, version, .. }) => {
                return Err(format!(
                    "the remote gpusweep {version} speaks protocol {protocol}, this one {PROTOCOL}: upgrade one of them"
                ));
            }
            _ => return Err(format!("the remote did not speak the agent protocol; it said: {:?}", preview(&first))),
        }
        crate::trace(&task.label, "agent said hello");
        task.status(ConnStatus::Up);
        send_cmd(&mut writer, &AgentCmd::Interval { ms: interval.as_millis() as u64 }).await?;
        let mut pending: Vec<(u64, SignalRequest)> = Vec::new();
        let out: Result<(), String> = loop {
            tokio::select! {
                l = lines.recv() => {
                    let line = match l {
                        Some(Ok(Some(l))) => l,
                        Some(Ok(None)) | None => break Err("the agent exited".into()),
                        Some(Err(e)) => break Err(format!("reading the agent: {e}")),
                    };
                    match serde_json::from_slice::<AgentMsg>(&line) {
                        Ok(AgentMsg::Snapshot { mut snapshot }) => {
                            crate::trace(&task.label, "snapshot");
                            snapshot.host = task.label.clone();
                            snapshot.source = kind;
                            for f in &mut snapshot.findings { f.host = task.label.clone(); }
                            let snap = analyzed(*snapshot, &task.opts.analyze);
                            if task.events.send(HostEvent::Snapshot { host: task.index, snap: Box::new(snap) }).is_err() {
                                break Ok(());
                            }
                        }
                        Ok(AgentMsg::Outcomes { id, outcomes }) => {
                            pending.retain(|(p, _)| *p != id);
                            let _ = task.events.send(HostEvent::Outcomes { host: task.index, id, outcomes });
                        }
                        Ok(AgentMsg::Error { message }) => {
                            task.status(ConnStatus::Down(format!("agent: {message}")));
                        }
                        Ok(AgentMsg::Hello { .. }) => {}
                        Err(_) => break Err(format!("garbage from the agent: {:?}", preview(&line))),
                    }
                }
                c = cmds.recv() => {
                    let cmd = match c {
                        None => break Ok(()),
                        Some(HostCmd::PollNow) => AgentCmd::Poll,
                        Some(HostCmd::Interval(d)) => { *interval = d; AgentCmd::Interval { ms: d.as_millis() as u64 } }
                        Some(HostCmd::Signal { id, req }) => {
                            pending.push((id, req.clone()));
                            AgentCmd::Signal { id, request: req }
                        }
                    };
                    if let Err(e) = send_cmd(&mut writer, &cmd).await {
                        break Err(e);
                    }
                }
            }
        };
        // Whatever was asked and not answered is reported, never left hanging.
        for (id, req) in pending {
            let outcomes = all_failed(&req, "connection lost before the outcome was known");
            let _ = task.events.send(HostEvent::Outcomes { host: task.index, id, outcomes });
        }
        out
    }
    .await;
    reader_task.abort();
    result
}

async fn send_cmd<W: AsyncWrite + Unpin>(w: &mut W, cmd: &AgentCmd) -> Result<(), String> {
    let mut line = serde_json::to_vec(cmd).map_err(|e| e.to_string())?;
    line.push(b'\n');
    w.write_all(&line)
        .await
        .map_err(|e| format!("writing to the agent: {e}"))?;
    w.flush()
        .await
        .map_err(|e| format!("writing to the agent: {e}"))
}
