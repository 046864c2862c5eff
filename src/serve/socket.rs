//! The serve's Unix socket: the agent protocol (a hello, then every reading of the served host, one JSON
//! object a line), for `gpusweep snapshot` and `wait` on this host and for `unix:PATH` hosts. NVML is already
//! warm here, so a reading costs the client a connect and a line.
//!
//! Anyone who can connect may read. Signals and removals are taken only from root and from the serve's own
//! user (told by SO_PEERCRED, not by anything the peer says), never with `--readonly`; they go through the
//! same delivery (pidfd, re-checks, audit record first) as every other kill.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

use super::hub::{Ask, Shared};
use crate::core::protocol::{AgentCmd, AgentMsg, MAX_LINE_BYTES, MIN_INTERVAL, PROTOCOL};
use crate::core::signal::all_failed;
use crate::source::remote::stream::read_line_bounded;

/// The fastest polling a peer other than root or the serve's user may ask for.
const MIN_UNPRIVILEGED_INTERVAL: Duration = Duration::from_millis(100);

/// Where `serve` listens and clients look by default: `$GPUSWEEP_SOCKET`, else `/run/gpusweep.sock` for root,
/// else `$XDG_RUNTIME_DIR/gpusweep.sock`. `None` where none can be named.
pub fn default_path() -> Option<PathBuf> {
    crate::runtime::settings::serve_socket()
}

/// The socket file, removed when the serve ends (a stale file would make clients try a dead serve).
pub struct SocketFile(pub PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Bind the socket. A file left by a serve that is gone is replaced; one a live serve answers on is not.
pub fn bind(path: &Path) -> Result<(SocketFile, UnixListener), String> {
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(format!(
                "another gpusweep serve answers on {} (stop it, or pick another --socket)",
                path.display()
            ));
        }
        let is_socket = std::fs::symlink_metadata(path)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()));
        if !is_socket {
            return Err(format!(
                "{} exists and is not a socket: not replacing it",
                path.display()
            ));
        }
        std::fs::remove_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let listener = UnixListener::bind(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let file = SocketFile(path.to_path_buf());
    // Readable by every local user, like the loopback HTTP port; signals are checked per peer.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((file, listener))
}

/// Accept connections until the serve ends. The socket serves the serve's first host.
pub async fn accept(listener: UnixListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _ = serve_peer(stream, shared).await;
        });
    }
}

async fn write(w: &mut (impl AsyncWriteExt + Unpin), line: &str) -> std::io::Result<()> {
    w.write_all(line.as_bytes()).await?;
    w.write_all(b"\n").await?;
    w.flush().await
}

fn msg(m: &AgentMsg) -> String {
    serde_json::to_string(m).unwrap_or_default()
}

#[allow(clippy::too_many_lines)] // one peer's life: hello, readings, commands and their answers
async fn serve_peer(stream: UnixStream, shared: Arc<Shared>) -> std::io::Result<()> {
    const HOST: usize = 0;
    let uid = stream.peer_cred().map(|c| c.uid()).ok();
    let me = nix::unistd::geteuid().as_raw();
    let trusted = uid.is_some_and(|u| u == 0 || u == me);
    let Some(ch) = shared.hosts.get(HOST) else {
        return Ok(());
    };
    let (reader_half, mut w) = stream.into_split();
    let mut reader_half = BufReader::new(reader_half);
    let hello = AgentMsg::Hello {
        protocol: PROTOCOL,
        version: env!("CARGO_PKG_VERSION").into(),
        host: ch.label.clone(),
        pid: std::process::id(),
    };
    write(&mut w, &msg(&hello)).await?;
    let client = shared.client_id();
    let _asked = Withdraw {
        shared: shared.clone(),
        client,
    };
    let mut latest = ch.latest.clone();
    // The answers of requests still being carried out come back here, to be written between readings.
    let (atx, mut answers) = mpsc::channel::<String>(16);
    let (ltx, mut lines) = mpsc::channel::<std::io::Result<Option<Vec<u8>>>>(4);
    let reader = tokio::spawn(async move {
        loop {
            let got = read_line_bounded(&mut reader_half, MAX_LINE_BYTES).await;
            let end = !matches!(got, Ok(Some(_)));
            if ltx.send(got).await.is_err() || end {
                return;
            }
        }
    });
    // Whatever reading there is goes out at once (a one-off `snapshot` needs nothing more), then each new one.
    let mut send = true;
    let result = async {
        loop {
            if send {
                send = false;
                let reading = latest.borrow_and_update().clone();
                if let Some(reading) = reading {
                    let line = format!("{{\"type\":\"snapshot\",\"snapshot\":{}}}", reading.json());
                    write(&mut w, &line).await?;
                }
            }
            tokio::select! {
                r = latest.changed() => {
                    if r.is_err() {
                        return Ok(());
                    }
                    send = true;
                }
                a = answers.recv() => {
                    if let Some(a) = a {
                        write(&mut w, &a).await?;
                    }
                }
                got = lines.recv() => {
                    let Some(Ok(Some(line))) = got else {
                        return Ok(());
                    };
                    let text = String::from_utf8_lossy(&line);
                    if text.trim().is_empty() {
                        continue;
                    }
                    match serde_json::from_str::<AgentCmd>(text.trim()) {
                        Ok(AgentCmd::Poll) => {
                            let _ = shared.ask.try_send(Ask::PollNow { host: HOST });
                        }
                        Ok(AgentCmd::Interval { ms, .. }) => {
                            let floor = if trusted { MIN_INTERVAL } else { MIN_UNPRIVILEGED_INTERVAL };
                            let every = Some(Duration::from_millis(ms).max(floor));
                            let _ = shared.ask.try_send(Ask::Interval { host: HOST, client, every });
                        }
                        Ok(AgentCmd::Signal { id, request }) => {
                            let refused = refusal(&shared, trusted, uid);
                            let (tx, rx) = oneshot::channel();
                            let asked = refused.is_none()
                                && shared
                                    .ask
                                    .try_send(Ask::Signal { host: HOST, req: request.clone(), reply: tx })
                                    .is_ok();
                            let atx = atx.clone();
                            tokio::spawn(async move {
                                let outcomes = match (refused, asked) {
                                    (Some(why), _) => all_failed(&request, &why),
                                    (None, false) => all_failed(&request, "serve busy: nothing was signalled"),
                                    (None, true) => rx.await.unwrap_or_else(|_| {
                                        all_failed(&request, "the serve is stopping: outcome unknown")
                                    }),
                                };
                                let _ = atx.send(msg(&AgentMsg::Outcomes { id, outcomes })).await;
                            });
                        }
                        Ok(AgentCmd::Remove { id, request }) => {
                            let refused = refusal(&shared, trusted, uid);
                            let (tx, rx) = oneshot::channel();
                            let asked = refused.is_none()
                                && shared
                                    .ask
                                    .try_send(Ask::Remove { host: HOST, req: request.clone(), reply: tx })
                                    .is_ok();
                            let atx = atx.clone();
                            tokio::spawn(async move {
                                use crate::core::removal::all_failed as none_removed;
                                let outcomes = match (refused, asked) {
                                    (Some(why), _) => none_removed(&request, &why),
                                    (None, false) => none_removed(&request, "serve busy: nothing was removed"),
                                    (None, true) => rx.await.unwrap_or_else(|_| {
                                        none_removed(&request, "the serve is stopping: outcome unknown")
                                    }),
                                };
                                let _ = atx.send(msg(&AgentMsg::Removals { id, outcomes })).await;
                            });
                        }
                        Err(why) => {
                            let m = AgentMsg::Error { message: format!("bad command: {why}") };
                            write(&mut w, &msg(&m)).await?;
                        }
                    }
                }
            }
        }
    }
    .await;
    reader.abort();
    result
}

/// Why this peer may not act through the socket, if it may not.
fn refusal(shared: &Shared, trusted: bool, uid: Option<u32>) -> Option<String> {
    if shared.readonly {
        return Some("this serve is read-only (--readonly): nothing was done".into());
    }
    if !trusted {
        return Some(format!(
            "not allowed: only root or the serve's own user may act through its socket (you are uid {})",
            uid.map_or_else(|| "unknown".to_string(), |u| u.to_string())
        ));
    }
    None
}

/// Withdraws a peer's interval request when it goes.
struct Withdraw {
    shared: Arc<Shared>,
    client: u64,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        let _ = self.shared.ask.try_send(Ask::Interval {
            host: 0,
            client: self.client,
            every: None,
        });
    }
}
