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
/// The longest command line a peer other than root or the serve's user may send: it may only poll and set
/// its interval (anything else is refused), which takes a few dozen bytes. A longer line ends the
/// connection, so nobody can make the serve hold what they send.
const MAX_UNPRIVILEGED_LINE: usize = 4096;
/// Connections one unprivileged user may hold open at once; past that a new one is told so and closed.
const MAX_CONNECTIONS_PER_USER: usize = 32;
/// Connections of every unprivileged user together.
const MAX_UNPRIVILEGED_CONNECTIONS: usize = 512;
/// A peer that reads nothing for this long (its socket buffer full) is let go: what it does not read
/// would otherwise wait in the serve's memory.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Open connections of unprivileged peers, by uid.
#[derive(Default)]
struct Peers {
    by_uid: std::sync::Mutex<std::collections::HashMap<u32, usize>>,
}

/// One unprivileged peer's place among the open connections, given back when it goes.
struct Seat {
    peers: Arc<Peers>,
    uid: u32,
}

impl Peers {
    /// A seat for a connection of `uid`, unless that user, or all of them together, hold their share.
    fn take(self: &Arc<Self>, uid: u32) -> Result<Seat, String> {
        let Ok(mut m) = self.by_uid.lock() else {
            return Err("the serve is stopping".into());
        };
        let total: usize = m.values().sum();
        let mine = m.entry(uid).or_insert(0);
        if *mine >= MAX_CONNECTIONS_PER_USER {
            return Err(format!(
                "too many connections: uid {uid} has {MAX_CONNECTIONS_PER_USER} open"
            ));
        }
        if total >= MAX_UNPRIVILEGED_CONNECTIONS {
            return Err("too many connections from unprivileged users".into());
        }
        *mine += 1;
        Ok(Seat {
            peers: self.clone(),
            uid,
        })
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        if let Ok(mut m) = self.peers.by_uid.lock()
            && let Some(n) = m.get_mut(&self.uid)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.uid);
            }
        }
    }
}

/// Who is on the other end, told by SO_PEERCRED (never by anything the peer says).
#[derive(Debug, Clone, Copy)]
struct Peer {
    uid: Option<u32>,
    /// Root or the serve's own user: may signal and remove, send long commands, poll at 20 ms.
    trusted: bool,
}

impl Peer {
    fn of(stream: &UnixStream) -> Peer {
        let uid = stream.peer_cred().map(|c| c.uid()).ok();
        let me = nix::unistd::geteuid().as_raw();
        Peer {
            uid,
            trusted: uid.is_some_and(|u| u == 0 || u == me),
        }
    }
    fn max_line(self) -> usize {
        if self.trusted {
            MAX_LINE_BYTES
        } else {
            MAX_UNPRIVILEGED_LINE
        }
    }
}

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

/// Accept connections until the serve ends. The socket serves the serve's first host. Unprivileged users
/// get a bounded share of connections; root and the serve's own user are not counted.
pub async fn accept(listener: UnixListener, shared: Arc<Shared>) {
    let peers = Arc::new(Peers::default());
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let peer = Peer::of(&stream);
        let seat = if peer.trusted {
            None
        } else {
            match peers.take(peer.uid.unwrap_or(u32::MAX)) {
                Ok(seat) => Some(seat),
                Err(why) => {
                    // Said without waiting on the peer: a full socket buffer costs nothing here.
                    let _ = stream.try_write(
                        format!("{}\n", msg(&AgentMsg::Error { message: why })).as_bytes(),
                    );
                    continue;
                }
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _ = serve_peer(stream, peer, shared).await;
            drop(seat);
        });
    }
}

/// One line to the peer; one that does not read it within `WRITE_TIMEOUT` is given up.
async fn write(w: &mut (impl AsyncWriteExt + Unpin), line: &str) -> std::io::Result<()> {
    let all = async {
        w.write_all(line.as_bytes()).await?;
        w.write_all(b"\n").await?;
        w.flush().await
    };
    tokio::time::timeout(WRITE_TIMEOUT, all)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "the peer reads nothing"))?
}

fn msg(m: &AgentMsg) -> String {
    serde_json::to_string(m).unwrap_or_default()
}

#[allow(clippy::too_many_lines)] // one peer's life: hello, readings, commands and their answers
async fn serve_peer(stream: UnixStream, peer: Peer, shared: Arc<Shared>) -> std::io::Result<()> {
    const HOST: usize = 0;
    let Peer { uid, trusted } = peer;
    let max_line = peer.max_line();
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
            let got = read_line_bounded(&mut reader_half, max_line).await;
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
                    let line = match got {
                        Some(Ok(Some(line))) => line,
                        Some(Err(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                            let m = AgentMsg::Error { message: format!("{e}: closing the connection") };
                            write(&mut w, &msg(&m)).await?;
                            return Ok(());
                        }
                        _ => return Ok(()),
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
                            if let Some(why) = &refused {
                                let outcomes = all_failed(&request, why);
                                write(&mut w, &msg(&AgentMsg::Outcomes { id, outcomes })).await?;
                                continue;
                            }
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
                            if let Some(why) = &refused {
                                let outcomes = crate::core::removal::all_failed(&request, why);
                                write(&mut w, &msg(&AgentMsg::Removals { id, outcomes })).await?;
                                continue;
                            }
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
