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

use super::hub::{ActAsk, Reading, Shared};
use super::redact::{View, peer_view};
use crate::core::protocol::{AgentCmd, AgentMsg, Command, MAX_LINE_BYTES, MIN_INTERVAL, PROTOCOL};
use crate::source::remote::stream::read_line_bounded;

/// The fastest polling a peer other than root or the serve's user may ask for.
const MIN_UNPRIVILEGED_INTERVAL: Duration = Duration::from_millis(100);
/// The longest command line a peer other than root or the serve's user may send: it may only poll and set
/// its interval (anything else is refused), which takes a few dozen bytes. A longer line ends the
/// connection, so nobody can make the serve hold what they send.
const MAX_UNPRIVILEGED_LINE: usize = 4096;
/// Connections one unprivileged user may hold open at once; past that a new one is told so and closed.
const MAX_CONNECTIONS_PER_USER: usize = 32;
/// A peer that reads nothing for this long (its socket buffer full) is let go: what it does not read
/// would otherwise wait in the serve's memory.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Open connections of unprivileged peers, by uid, and how many all of them may hold together (a share of
/// the serve's file descriptors, at most 512).
struct Peers {
    by_uid: std::sync::Mutex<std::collections::HashMap<u32, usize>>,
    total_cap: usize,
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
        if total >= self.total_cap {
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
    /// Which processes it may see whole: what its own `/proc` would show it.
    view: View,
}

impl Peer {
    fn of(stream: &UnixStream) -> Peer {
        let cred = stream.peer_cred().ok();
        let uid = cred.map(|c| c.uid());
        let me = nix::unistd::geteuid().as_raw();
        let trusted = uid.is_some_and(|u| u == 0 || u == me);
        Peer {
            uid,
            trusted,
            view: peer_view(
                cred.and_then(|c| c.pid()),
                uid,
                cred.map(|c| c.gid()),
                trusted,
            ),
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

/// Why the socket could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("another gpusweep serve answers on {0} (stop it, or pick another --socket)")]
    Taken(String),
    #[error("{0} exists and is not a socket: not replacing it")]
    NotSocket(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// Bind the socket. A file left by a serve that is gone is replaced; one a live serve answers on is not.
pub fn bind(path: &Path) -> Result<(SocketFile, UnixListener), BindError> {
    let shown = || path.display().to_string();
    let io = |source| BindError::Io {
        path: path.display().to_string(),
        source,
    };
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(BindError::Taken(shown()));
        }
        let is_socket = std::fs::symlink_metadata(path)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()));
        if !is_socket {
            return Err(BindError::NotSocket(shown()));
        }
        std::fs::remove_file(path).map_err(io)?;
    }
    let listener = UnixListener::bind(path).map_err(io)?;
    let file = SocketFile(path.to_path_buf());
    // Readable by every local user, like the loopback HTTP port; signals are checked per peer.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(io)?;
    Ok((file, listener))
}

/// Accept connections until the serve ends. The socket serves the serve's first host. Unprivileged users
/// get a bounded share of connections; root and the serve's own user are not counted.
pub async fn accept(listener: UnixListener, shared: Arc<Shared>, total_cap: usize) {
    let peers = Arc::new(Peers {
        by_uid: std::sync::Mutex::default(),
        total_cap,
    });
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

/// What one peer of the socket has been sent.
struct Conn<'s> {
    shared: &'s Arc<Shared>,
    peer: Peer,
    client: u64,
    /// The peer asked for `unchanged` in place of a snapshot that says nothing new.
    compact: bool,
    /// The content of the last snapshot sent whole.
    sent: Option<u64>,
    /// Answers of actions still being carried out come back here, to be written between readings.
    answers: mpsc::Sender<String>,
}

/// The socket serves the serve's first host.
const HOST: usize = 0;

async fn serve_peer(stream: UnixStream, peer: Peer, shared: Arc<Shared>) -> std::io::Result<()> {
    let Some(ch) = shared.hosts.get(HOST) else {
        return Ok(());
    };
    let (reader_half, mut w) = stream.into_split();
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
    let (atx, mut answers) = mpsc::channel::<String>(16);
    let (reader, mut lines) = read_lines(reader_half, peer.max_line());
    let mut conn = Conn {
        shared: &shared,
        peer,
        client,
        compact: false,
        sent: None,
        answers: atx,
    };
    // Whatever reading there is goes out at once (a one-off `snapshot` needs nothing more), then each new one.
    let mut send = true;
    let result = async {
        loop {
            if send {
                send = false;
                let reading = latest.borrow_and_update().clone();
                if let Some(line) = reading.and_then(|r| conn.reading_line(&r)) {
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
                    if let Some(now) = conn.command(&line) {
                        write(&mut w, &now).await?;
                    }
                }
            }
        }
    }
    .await;
    reader.abort();
    result
}

/// Lines read by a task of their own: each, an error, or the end.
type Lines = mpsc::Receiver<std::io::Result<Option<Vec<u8>>>>;

/// The peer's command lines, read by a task of their own (a few at most waiting), each at most `max` bytes.
fn read_lines(
    half: tokio::net::unix::OwnedReadHalf,
    max: usize,
) -> (tokio::task::JoinHandle<()>, Lines) {
    let (ltx, lines) = mpsc::channel(4);
    let reader = tokio::spawn(async move {
        let mut half = BufReader::new(half);
        loop {
            let got = read_line_bounded(&mut half, max).await;
            let end = !matches!(got, Ok(Some(_)));
            if ltx.send(got).await.is_err() || end {
                return;
            }
        }
    });
    (reader, lines)
}

impl Conn<'_> {
    /// The line a reading goes out as: the whole snapshot (serialized once for every peer), or, to a peer
    /// that asked for it, `unchanged` when it says nothing new since the last one sent whole.
    fn reading_line(&mut self, r: &Reading) -> Option<String> {
        if self.compact && self.sent == Some(r.content) {
            return Some(msg(&AgentMsg::Unchanged {
                taken_at_ms: r.snap.taken_at_ms,
                gauges: r.snap.gauges(),
            }));
        }
        self.sent = Some(r.content);
        let snapshot =
            serde_json::value::RawValue::from_string(r.json_as(self.peer.view).into_owned())
                .ok()?;
        serde_json::to_string(&WireSnapshot::Snapshot {
            snapshot: &snapshot,
        })
        .ok()
    }

    /// One command line. Returns what to write back at once (a refusal, an error); an action the peer may
    /// ask for is carried out by the hub, and its answer comes back through `answers`.
    fn command(&mut self, line: &[u8]) -> Option<String> {
        let text = String::from_utf8_lossy(line);
        if text.trim().is_empty() {
            return None;
        }
        let cmd = match serde_json::from_str::<AgentCmd>(text.trim()) {
            Ok(c) => Command::from(c),
            Err(why) => {
                let message = format!("bad command: {why}");
                return Some(msg(&AgentMsg::Error { message }));
            }
        };
        match cmd {
            Command::Poll => self.shared.wants.poll_now(HOST, self.peer.trusted),
            Command::Interval { ms, compact } => {
                self.compact = compact;
                let floor = if self.peer.trusted {
                    MIN_INTERVAL
                } else {
                    MIN_UNPRIVILEGED_INTERVAL
                };
                let every = Some(Duration::from_millis(ms).max(floor));
                self.shared.wants.interval(HOST, self.client, every);
            }
            Command::Act { id, req } => {
                // Refused at once, without a task: a peer that may not act costs the serve nothing more.
                if let Some(why) = refusal(self.shared, self.peer.trusted, self.peer.uid) {
                    return Some(msg(&AgentMsg::answer(id, req.refuse(&why))));
                }
                let (tx, rx) = oneshot::channel();
                let asked = self
                    .shared
                    .act
                    .try_send(ActAsk {
                        host: HOST,
                        req: req.clone(),
                        reply: tx,
                    })
                    .is_ok();
                if !asked {
                    let answer = req.refuse("serve busy: nothing was done");
                    return Some(msg(&AgentMsg::answer(id, answer)));
                }
                let answers = self.answers.clone();
                tokio::spawn(async move {
                    let answer = rx.await.unwrap_or_else(|_| {
                        req.refuse("the serve is stopping: whether it was done is unknown")
                    });
                    let _ = answers.send(msg(&AgentMsg::answer(id, answer))).await;
                });
            }
        }
        None
    }
}

/// A snapshot already serialized, as the wire carries it (`{"type":"snapshot","snapshot":...}`).
#[derive(serde::Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireSnapshot<'a> {
    Snapshot {
        snapshot: &'a serde_json::value::RawValue,
    },
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
        self.shared.wants.interval(HOST, self.client, None);
    }
}
