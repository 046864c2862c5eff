//! The client end of the agent protocol, over any byte stream: an SSH channel, or the stdio of a local
//! command. Remote output is untrusted: lines are bounded, JSON that does not parse ends the connection with a
//! message saying what came instead, nothing panics.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::RemoteTask;
use crate::core::format::{escape, millis, truncate};
use crate::core::model::{HostSnapshot, SourceKind};
use crate::core::protocol::{AgentCmd, AgentMsg, MAX_LINE_BYTES, PROTOCOL};
use crate::core::removal::RemovalRequest;
use crate::core::signal::SignalRequest;
use crate::core::trace;
use crate::source::{ConnStatus, HostCmd};

/// The last line or so a process wrote on stderr, for error messages.
pub fn spawn_tail<R: AsyncRead + Unpin + Send + 'static>(r: R) -> tokio::task::JoinHandle<String> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(r).lines();
        let mut last = String::new();
        while let Ok(Some(l)) = lines.next_line().await {
            if !l.trim().is_empty() {
                last = truncate(&escape(l.trim()), 200);
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
    truncate(&escape(String::from_utf8_lossy(b).trim()), 80)
}

/// Speak the agent protocol until the stream ends or misbehaves. Err says why, for the host's status line.
#[allow(clippy::too_many_lines)] // the protocol's one select loop: hello, readings, outcomes, commands
pub async fn drive_stream<R, W>(
    task: &RemoteTask,
    reader: R,
    mut writer: W,
    cmds: &mut mpsc::Receiver<HostCmd>,
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
        let first = await_hello(task, &mut lines, cmds, interval, connect_timeout).await?;
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
        trace(&task.label, "agent said hello");
        task.status(ConnStatus::Up);
        send_cmd(
            &mut writer,
            &AgentCmd::Interval {
                ms: millis(*interval),
                compact: true,
            },
        )
        .await?;
        // Commands are written by a loop of their own: an agent that stops reading its stdin blocks the writer,
        // never the readings, the stale check or the answers to signal requests.
        let (wtx, mut wrx) = mpsc::channel::<Outgoing>(WRITE_QUEUE);
        let writing = async {
            while let Some(o) = wrx.recv().await {
                // A signal request given up on before it was written is never written.
                if o.claim.as_ref().is_some_and(|c| c.swap(true, Ordering::SeqCst)) {
                    continue;
                }
                send_cmd(&mut writer, &o.cmd).await?;
            }
            Ok::<(), String>(())
        };
        let mut pending: Vec<Pending> = Vec::new();
        let reading = converse(task, &mut lines, cmds, interval, kind, &wtx, &mut pending);
        let out = tokio::select! {
            r = reading => r,
            w = writing => w.and(Err("the command writer stopped".into())),
        };
        // Whatever was asked and not answered is reported, never left hanging.
        for p in pending {
            let reason = if p.claim.swap(true, Ordering::SeqCst) {
                "connection lost before the outcome was known"
            } else {
                "connection lost before the request was sent: nothing was signalled"
            };
            p.cmd().refuse(task.sink.as_ref(), reason);
        }
        out
    }
    .await;
    reader_task.abort();
    result
}

/// A command on its way to the agent. `claim` (signal requests only) is taken by whoever settles it first:
/// the writer, just before writing it, or the reader, when it gives up on it.
struct Outgoing {
    cmd: AgentCmd,
    claim: Option<Arc<AtomicBool>>,
}

/// What a request asked for: signals, or removals.
enum Asked {
    Signal(SignalRequest),
    Remove(RemovalRequest),
}

/// A request (signals or removals) sent and not yet answered.
struct Pending {
    id: u64,
    req: Asked,
    claim: Arc<AtomicBool>,
    queued: Instant,
}

impl Pending {
    /// The command it came from, to be answered with a failure.
    fn cmd(&self) -> HostCmd {
        match &self.req {
            Asked::Signal(req) => HostCmd::Signal {
                id: self.id,
                req: req.clone(),
            },
            Asked::Remove(req) => HostCmd::Remove {
                id: self.id,
                req: req.clone(),
            },
        }
    }
}

/// Commands waiting for the writer at most; past that the agent is not reading and further ones are refused.
const WRITE_QUEUE: usize = 16;

/// How long a signal request may wait to be written before it is given up (and then never written).
const WRITE_DEADLINE: Duration = Duration::from_secs(10);

/// How long after it was queued a written request may go unanswered: the write, the grace period, the wait
/// after KILL (or the scan before a removal), and a margin.
fn answer_deadline(req: &Asked) -> Duration {
    let grace = match req {
        Asked::Signal(r) => r.grace_ms.unwrap_or(0),
        Asked::Remove(_) => 0,
    };
    WRITE_DEADLINE + Duration::from_millis(grace) + Duration::from_secs(35)
}

/// Readings, outcomes and commands after the hello, until the stream ends or misbehaves.
#[allow(clippy::too_many_lines)] // the protocol's one select loop: readings, outcomes, commands, silences
async fn converse(
    task: &RemoteTask,
    lines: &mut mpsc::Receiver<std::io::Result<Option<Vec<u8>>>>,
    cmds: &mut mpsc::Receiver<HostCmd>,
    interval: &mut Duration,
    kind: SourceKind,
    wtx: &mpsc::Sender<Outgoing>,
    pending: &mut Vec<Pending>,
) -> Result<(), String> {
    let connect_timeout = task.opts.ssh.connect_timeout;
    let mut last_reading = Instant::now();
    let mut stale = false;
    // The last whole reading, kept fresh; after a silence the next reading is handed on whole.
    let mut last: Option<HostSnapshot> = None;
    let mut resend = false;
    loop {
        let (stale_after, read_timeout) = silence_limits(*interval, connect_timeout);
        let silence_alarm = last_reading + if stale { read_timeout } else { stale_after };
        let unsent = pending
            .iter()
            .map(|p| {
                if p.claim.load(Ordering::SeqCst) {
                    p.queued + answer_deadline(&p.req)
                } else {
                    p.queued + WRITE_DEADLINE
                }
            })
            .min();
        let alarm = unsent.map_or(silence_alarm, |u| u.min(silence_alarm));
        tokio::select! {
            () = tokio::time::sleep_until(alarm) => {
                let now = Instant::now();
                pending.retain(|p| {
                    if now < p.queued + WRITE_DEADLINE {
                        return true;
                    }
                    if p.claim.swap(true, Ordering::SeqCst) {
                        // Written: the agent has it. Past a generous deadline, say the outcome is unknown.
                        let limit = answer_deadline(&p.req);
                        if now < p.queued + limit {
                            return true;
                        }
                        let why = format!(
                            "no answer from the agent within {} s: whether it was done is unknown \
                             (its audit log says)",
                            limit.as_secs()
                        );
                        p.cmd().refuse(task.sink.as_ref(), &why);
                        return false;
                    }
                    let why = format!(
                        "not sent: the agent read no commands for {} s; nothing was done",
                        WRITE_DEADLINE.as_secs()
                    );
                    p.cmd().refuse(task.sink.as_ref(), &why);
                    false
                });
                if now < silence_alarm {
                    continue;
                }
                let silent = last_reading.elapsed();
                if stale {
                    return Err(format!(
                        "no reading from the agent for {}s: reconnecting",
                        silent.as_secs()
                    ));
                }
                stale = true;
                // After a silence the next reading goes on whole: whoever counted the host unreadable
                // needs a reading to count it again.
                resend = true;
                task.status(ConnStatus::Stale { silent_ms: millis(silent) });
            }
            l = lines.recv() => {
                let line = match l {
                    Some(Ok(Some(l))) => l,
                    Some(Ok(None)) | None => return Err("the agent exited".into()),
                    Some(Err(e)) => return Err(format!("reading the agent: {e}")),
                };
                match serde_json::from_slice::<AgentMsg>(&line) {
                    Ok(AgentMsg::Snapshot { mut snapshot }) => {
                        trace(&task.label, "snapshot");
                        snapshot.source = kind;
                        last_reading = Instant::now();
                        if stale {
                            stale = false;
                            task.status(ConnStatus::Up);
                        }
                        // A reading that says nothing new but its gauges is passed on as only that: it needs
                        // no judging again, and a thousand quiet hosts cost their reader next to nothing.
                        let same = !resend && last.as_ref().is_some_and(|l| l.says_the_same(&snapshot));
                        let sent = if same {
                            task.sink.fresh(snapshot.taken_at_ms, snapshot.gauges())
                        } else {
                            resend = false;
                            last = Some((*snapshot).clone());
                            task.sink.reading(*snapshot)
                        };
                        if !sent {
                            return Ok(());
                        }
                    }
                    Ok(AgentMsg::Unchanged { taken_at_ms, gauges }) => {
                        let Some(whole) = last.as_mut() else {
                            return Err("the agent said a reading was unchanged before sending one".into());
                        };
                        last_reading = Instant::now();
                        if stale {
                            stale = false;
                            task.status(ConnStatus::Up);
                        }
                        whole.refresh(taken_at_ms, &gauges);
                        let sent = if resend {
                            resend = false;
                            task.sink.reading(whole.clone())
                        } else {
                            task.sink.fresh(taken_at_ms, gauges)
                        };
                        if !sent {
                            return Ok(());
                        }
                    }
                    Ok(AgentMsg::Outcomes { id, outcomes }) => {
                        pending.retain(|p| p.id != id);
                        task.sink.outcomes(id, outcomes);
                    }
                    Ok(AgentMsg::Removals { id, outcomes }) => {
                        pending.retain(|p| p.id != id);
                        task.sink.removals(id, outcomes);
                    }
                    Ok(AgentMsg::Error { message }) => {
                        task.status(ConnStatus::Down(format!("agent: {}", escape(&message))));
                    }
                    Ok(AgentMsg::Hello { .. }) => {}
                    Err(_) => return Err(format!("garbage from the agent: {:?}", preview(&line))),
                }
            }
            c = cmds.recv() => {
                let (cmd, signal) = match c {
                    None => return Ok(()),
                    Some(HostCmd::PollNow | HostCmd::Wake) => (AgentCmd::Poll, None),
                    Some(HostCmd::Interval(d)) => {
                        *interval = d;
                        (AgentCmd::Interval { ms: millis(d), compact: true }, None)
                    }
                    Some(HostCmd::Signal { id, req }) => {
                        (AgentCmd::Signal { id, request: req.clone() }, Some((id, Asked::Signal(req))))
                    }
                    Some(HostCmd::Remove { id, req }) => {
                        (AgentCmd::Remove { id, request: req.clone() }, Some((id, Asked::Remove(req))))
                    }
                };
                let claim = signal.as_ref().map(|_| Arc::new(AtomicBool::new(false)));
                match wtx.try_send(Outgoing { cmd, claim: claim.clone() }) {
                    Ok(()) => {
                        if let (Some((id, req)), Some(claim)) = (signal, claim) {
                            pending.push(Pending { id, req, claim, queued: Instant::now() });
                        }
                    }
                    // A poll or an interval is superseded by the next one; a signal request is answered now.
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        if let Some((id, req)) = signal {
                            let why = "host busy: the agent is not reading its commands; nothing was done";
                            let p = Pending { id, req, claim: Arc::new(AtomicBool::new(true)), queued: Instant::now() };
                            p.cmd().refuse(task.sink.as_ref(), why);
                        }
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        return Err("the command writer stopped".into());
                    }
                }
            }
        }
    }
}

/// How long a connected agent may say nothing before its data is called stale, and before the connection is
/// given up and made again. An agent sends a reading every interval.
fn silence_limits(interval: Duration, connect_timeout: Duration) -> (Duration, Duration) {
    let stale = interval.saturating_mul(3).max(Duration::from_secs(3));
    let timeout = interval
        .saturating_mul(10)
        .max(stale.saturating_mul(2))
        .max(connect_timeout);
    (stale, timeout)
}

/// The agent's first line, within `timeout`. Meanwhile commands are answered: `r` (a poll) starts over
/// instead of waiting out the timeout, and a signal fails at once.
async fn await_hello(
    task: &RemoteTask,
    lines: &mut mpsc::Receiver<std::io::Result<Option<Vec<u8>>>>,
    cmds: &mut mpsc::Receiver<HostCmd>,
    interval: &mut Duration,
    timeout: Duration,
) -> Result<Option<std::io::Result<Option<Vec<u8>>>>, String> {
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            () = &mut deadline => {
                return Err(format!("no hello from the agent within {}s", timeout.as_secs()));
            }
            l = lines.recv() => return Ok(l),
            c = cmds.recv() => match c {
                None => return Err("stopped".into()),
                Some(HostCmd::PollNow | HostCmd::Wake) => return Err("no hello from the agent yet: reconnecting as asked".into()),
                Some(HostCmd::Interval(d)) => *interval = d,
                Some(c @ (HostCmd::Signal { .. } | HostCmd::Remove { .. })) => {
                    c.refuse(task.sink.as_ref(), "not connected yet: the agent has not said hello");
                }
            }
        }
    }
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
