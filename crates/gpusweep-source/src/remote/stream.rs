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
use crate::{ConnStatus, HostCmd, Refuse};
use gpusweep_core::action::ActionRequest;
use gpusweep_core::format::{escape, millis, truncate};
use gpusweep_core::model::{SaidGauges, SourceKind};
use gpusweep_core::protocol::{AgentCmd, AgentMsg, MAX_LINE_BYTES, Message, PROTOCOL};
use gpusweep_core::trace;

/// The last line or so a process wrote on stderr, for error messages.
pub(crate) fn spawn_tail<R: AsyncRead + Unpin + Send + 'static>(
    r: R,
) -> tokio::task::JoinHandle<String> {
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

/// Lines read from the agent by a task of its own.
type Lines = mpsc::Receiver<std::io::Result<Option<Vec<u8>>>>;

/// The agent's hello, checked: it must speak this protocol.
async fn hello(
    task: &RemoteTask,
    lines: &mut Lines,
    cmds: &mut mpsc::Receiver<HostCmd>,
    interval: &mut Duration,
) -> Result<(), String> {
    let first = await_hello(task, lines, cmds, interval, task.opts.ssh.connect_timeout).await?;
    let first = match first {
        Some(Ok(Some(l))) => l,
        Some(Ok(None)) | None => return Err("the agent exited before saying hello".to_string()),
        Some(Err(e)) => return Err(format!("reading the agent: {e}")),
    };
    match serde_json::from_slice::<AgentMsg>(&first).map(Message::from) {
        Ok(Message::Hello { protocol, .. }) if protocol == PROTOCOL => Ok(()),
        Ok(Message::Hello {
            protocol, version, ..
        }) => Err(format!(
            "the remote gpusweep {} speaks protocol {protocol}, this one {PROTOCOL}: upgrade one of them",
            escape(&version)
        )),
        _ => Err(format!(
            "the remote did not speak the agent protocol; it said: {:?}",
            preview(&first)
        )),
    }
}

/// Speak the agent protocol until the stream ends or misbehaves. Err says why, for the host's status line.
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
    let result = async {
        hello(task, &mut lines, cmds, interval).await?;
        trace(&task.label, "agent said hello");
        task.status(ConnStatus::Up);
        let first = AgentCmd::Interval {
            ms: millis(*interval),
            compact: true,
        };
        send_cmd(&mut writer, &first).await?;
        // Commands are written by a loop of their own: an agent that stops reading its stdin blocks the writer,
        // never the readings, the stale check or the answers to action requests.
        let (wtx, mut wrx) = mpsc::channel::<Outgoing>(WRITE_QUEUE);
        let writing = async {
            while let Some(o) = wrx.recv().await {
                // A request given up on before it was written is never written.
                if o.claim
                    .as_ref()
                    .is_some_and(|c| c.swap(true, Ordering::SeqCst))
                {
                    continue;
                }
                send_cmd(&mut writer, &o.cmd).await?;
            }
            Ok::<(), String>(())
        };
        let mut talk = Conversation::new(task, kind, wtx);
        let out = tokio::select! {
            r = talk.run(&mut lines, cmds, interval) => r,
            w = writing => w.and(Err("the command writer stopped".into())),
        };
        talk.give_up();
        out
    }
    .await;
    reader_task.abort();
    result
}

/// A command on its way to the agent. `claim` (action requests only) is taken by whoever settles it first:
/// the writer, just before writing it, or the reader, when it gives up on it.
struct Outgoing {
    cmd: AgentCmd,
    claim: Option<Arc<AtomicBool>>,
}

/// An action request sent and not yet answered.
struct Pending {
    id: u64,
    req: ActionRequest,
    claim: Arc<AtomicBool>,
    queued: Instant,
}

impl Pending {
    /// When it is given up: unwritten, after `WRITE_DEADLINE`; written, after its answer's deadline.
    fn deadline(&self) -> Instant {
        if self.claim.load(Ordering::SeqCst) {
            self.queued + answer_deadline(&self.req)
        } else {
            self.queued + WRITE_DEADLINE
        }
    }
}

/// Commands waiting for the writer at most; past that the agent is not reading and further ones are refused.
const WRITE_QUEUE: usize = 16;

/// How long an action request may wait to be written before it is given up (and then never written).
const WRITE_DEADLINE: Duration = Duration::from_secs(10);

/// How long after it was queued a written request may go unanswered: the write, the grace period, the wait
/// after KILL (or the scan before a removal), and a margin.
fn answer_deadline(req: &ActionRequest) -> Duration {
    WRITE_DEADLINE + Duration::from_millis(req.grace_ms()) + Duration::from_secs(35)
}

/// One connection's state after the hello: readings in, commands out, requests waiting for answers.
struct Conversation<'t> {
    task: &'t RemoteTask,
    kind: SourceKind,
    wtx: mpsc::Sender<Outgoing>,
    pending: Vec<Pending>,
    last_reading: Instant,
    stale: bool,
    /// A whole snapshot has come: an `unchanged` refers to it.
    whole: bool,
}

impl<'t> Conversation<'t> {
    fn new(task: &'t RemoteTask, kind: SourceKind, wtx: mpsc::Sender<Outgoing>) -> Self {
        Conversation {
            task,
            kind,
            wtx,
            pending: Vec::new(),
            last_reading: Instant::now(),
            stale: false,
            whole: false,
        }
    }

    /// Readings, answers and commands, until the stream ends or misbehaves.
    async fn run(
        &mut self,
        lines: &mut Lines,
        cmds: &mut mpsc::Receiver<HostCmd>,
        interval: &mut Duration,
    ) -> Result<(), String> {
        loop {
            let (stale_after, read_timeout) =
                silence_limits(*interval, self.task.opts.ssh.connect_timeout);
            let silence_alarm = self.last_reading
                + if self.stale {
                    read_timeout
                } else {
                    stale_after
                };
            let alarm = self
                .pending
                .iter()
                .map(Pending::deadline)
                .min()
                .map_or(silence_alarm, |u| u.min(silence_alarm));
            let go_on = tokio::select! {
                // What the agent said comes before any judgement of its silence.
                biased;
                l = lines.recv() => self.on_line(l)?,
                c = cmds.recv() => self.on_cmd(c, interval)?,
                () = tokio::time::sleep_until(alarm) => self.on_alarm(silence_alarm)?,
            };
            if !go_on {
                return Ok(());
            }
        }
    }

    /// Requests past their deadlines are answered; a silence makes the host stale, then ends the connection.
    fn on_alarm(&mut self, silence_alarm: Instant) -> Result<bool, String> {
        let now = Instant::now();
        let sink = self.task.sink.clone();
        self.pending.retain(|p| {
            if now < p.deadline() {
                return true;
            }
            let why = if p.claim.swap(true, Ordering::SeqCst) {
                // Written: the agent has it. Past a generous deadline, say the outcome is unknown.
                format!(
                    "no answer from the agent within {} s: whether it was done is unknown (its audit log says)",
                    answer_deadline(&p.req).as_secs()
                )
            } else {
                format!(
                    "not sent: the agent read no commands for {} s; nothing was done",
                    WRITE_DEADLINE.as_secs()
                )
            };
            sink.answer(p.id, p.req.refuse(&why));
            false
        });
        if now < silence_alarm {
            return Ok(true);
        }
        if !super::silence_is_the_hosts(silence_alarm, now) {
            // This client was not running: the agent's lines wait in the pipe. Silence counts again from now.
            self.last_reading = now;
            return Ok(true);
        }
        let silent = self.last_reading.elapsed();
        if self.stale {
            return Err(format!(
                "no reading from the agent for {}s: reconnecting",
                silent.as_secs()
            ));
        }
        self.stale = true;
        Ok(self.task.status(ConnStatus::Stale {
            silent_ms: millis(silent),
        }))
    }

    /// A reading came: the host is fresh again.
    fn heard(&mut self) {
        self.last_reading = Instant::now();
        if self.stale {
            self.stale = false;
            self.task.status(ConnStatus::Up);
        }
    }

    /// One line from the agent. Every reading goes to the sink: whether it says anything new is the
    /// runtime's to decide, once.
    fn on_line(&mut self, l: Option<std::io::Result<Option<Vec<u8>>>>) -> Result<bool, String> {
        let line = match l {
            Some(Ok(Some(l))) => l,
            Some(Ok(None)) | None => return Err("the agent exited".into()),
            Some(Err(e)) => return Err(format!("reading the agent: {e}")),
        };
        let Ok(msg) = serde_json::from_slice::<AgentMsg>(&line).map(Message::from) else {
            return Err(format!("garbage from the agent: {:?}", preview(&line)));
        };
        let sink = &self.task.sink;
        Ok(match msg {
            Message::Snapshot(mut snapshot) => {
                trace(&self.task.label, "snapshot");
                snapshot.source = self.kind;
                self.heard();
                self.whole = true;
                sink.reading(*snapshot)
            }
            Message::Unchanged {
                taken_at_ms,
                gauges,
            } => {
                if !self.whole {
                    return Err("the agent said a reading was unchanged before sending one".into());
                }
                self.heard();
                sink.fresh(taken_at_ms, SaidGauges::every(gauges))
            }
            Message::Answer { id, answer } => {
                self.pending.retain(|p| p.id != id);
                sink.answer(id, answer);
                true
            }
            Message::Error(message) => {
                self.task
                    .status(ConnStatus::Down(format!("agent: {}", escape(&message))));
                true
            }
            Message::Hello { .. } => true,
        })
    }

    /// A front end's command, passed on to the agent's writer; a request that cannot be queued is answered.
    fn on_cmd(&mut self, c: Option<HostCmd>, interval: &mut Duration) -> Result<bool, String> {
        let (cmd, act) = match c {
            None => return Ok(false),
            Some(HostCmd::PollNow | HostCmd::Wake) => (AgentCmd::Poll, None),
            Some(HostCmd::Interval(d)) => {
                *interval = d;
                let ms = millis(d);
                (AgentCmd::Interval { ms, compact: true }, None)
            }
            Some(HostCmd::Act { id, req }) => (AgentCmd::act(id, req.clone()), Some((id, req))),
        };
        let claim = act.as_ref().map(|_| Arc::new(AtomicBool::new(false)));
        match self.wtx.try_send(Outgoing {
            cmd,
            claim: claim.clone(),
        }) {
            Ok(()) => {
                if let (Some((id, req)), Some(claim)) = (act, claim) {
                    let queued = Instant::now();
                    self.pending.push(Pending {
                        id,
                        req,
                        claim,
                        queued,
                    });
                }
                Ok(true)
            }
            // A poll or an interval is superseded by the next one; a request is answered now.
            Err(mpsc::error::TrySendError::Full(_)) => {
                if let Some((id, req)) = act {
                    let why = "host busy: the agent is not reading its commands; nothing was done";
                    self.task.sink.answer(id, req.refuse(why));
                }
                Ok(true)
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err("the command writer stopped".into()),
        }
    }

    /// Whatever was asked and not answered is reported, never left hanging.
    fn give_up(&mut self) {
        for p in self.pending.drain(..) {
            let reason = if p.claim.swap(true, Ordering::SeqCst) {
                "connection lost before the outcome was known"
            } else {
                "connection lost before the request was sent: nothing was done"
            };
            self.task.sink.answer(p.id, p.req.refuse(reason));
        }
    }
}

/// How long a connected agent (or serve) may say nothing before its data is called stale, and before the
/// connection is given up and made again, when it sends a reading every `interval`.
pub(super) fn silence_limits(
    interval: Duration,
    connect_timeout: Duration,
) -> (Duration, Duration) {
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
    lines: &mut Lines,
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
                Some(c @ HostCmd::Act { .. }) => {
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
