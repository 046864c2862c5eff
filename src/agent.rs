//! `gpusweep agent`: the remote end. It writes versioned JSON messages, one per line, on stdout: a hello,
//! then a snapshot every interval, and the outcome of each signal request. It reads commands on stdin, one JSON
//! object per line, and exits when stdin closes (the SSH channel or the parent went away).
//!
//! It runs the runtime's one poll loop over this host (or a demo host); signals go through the same
//! `act::deliver` as local kills, so every safety rule holds on its own host. Snapshots go out unanalyzed: the
//! client analyzes them once, with its operator's options.

use std::io::{BufRead, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::act::Deliverer;
use crate::core::action::ActionAnswer;
use crate::core::format::millis;
use crate::core::model::HostSnapshot;
use crate::core::protocol::{AgentCmd, AgentMsg, Command, MAX_LINE_BYTES, MIN_INTERVAL, PROTOCOL};
use crate::runtime::poll;
use crate::source::{ConnStatus, HostCmd, Sink, Source};

type Out = Arc<Mutex<std::io::Stdout>>;

fn emit(out: &Out, msg: &AgentMsg) -> bool {
    let Ok(line) = serde_json::to_string(msg) else {
        return false;
    };
    let Ok(mut o) = out.lock() else { return false };
    writeln!(o, "{line}").and_then(|()| o.flush()).is_ok()
}

/// The agent's sink: every reading, error and outcome becomes one line on stdout.
struct StdoutSink {
    out: Out,
    /// Stdin closed: the client went away (or never spoke: `agent </dev/null` is a one-off reading), and the
    /// next reading is the last (an answer still goes out).
    closed: Arc<AtomicBool>,
    /// The client asked for `unchanged` in place of a snapshot that says nothing new but its gauges.
    compact: Arc<AtomicBool>,
    /// The last snapshot sent whole.
    last: Mutex<Option<HostSnapshot>>,
}

impl Sink for StdoutSink {
    fn reading(&self, snap: HostSnapshot) -> bool {
        self.emit_reading(snap) && !self.closed.load(Ordering::SeqCst)
    }
    fn status(&self, status: ConnStatus) -> bool {
        match status {
            ConnStatus::Down(message) => emit(&self.out, &AgentMsg::Error { message }),
            ConnStatus::Up | ConnStatus::Connecting | ConnStatus::Stale { .. } => true,
        }
    }
    fn answer(&self, id: u64, answer: ActionAnswer) -> bool {
        emit(&self.out, &AgentMsg::answer(id, answer))
    }
}

impl StdoutSink {
    /// One reading on stdout: whole, or `unchanged` to a client that asked for it.
    fn emit_reading(&self, snap: HostSnapshot) -> bool {
        let Ok(mut last) = self.last.lock() else {
            return false;
        };
        if self.compact.load(Ordering::Relaxed)
            && last.as_ref().is_some_and(|l| l.diff(&snap).is_nothing())
        {
            return emit(
                &self.out,
                &AgentMsg::Unchanged {
                    taken_at_ms: snap.taken_at_ms,
                    gauges: snap.gauges(),
                },
            );
        }
        let ok = emit(
            &self.out,
            &AgentMsg::Snapshot {
                snapshot: Box::new(snap.clone()),
            },
        );
        *last = Some(snap);
        ok
    }
}

/// Read commands from stdin until it closes; bad lines are answered with an error message.
fn read_commands(
    out: &Out,
    tx: &mpsc::SyncSender<HostCmd>,
    compact: &AtomicBool,
    closed: &AtomicBool,
) {
    read_until_closed(out, tx, compact);
    // The loop ends at its next reading; ask for one now (after whatever commands came before).
    closed.store(true, Ordering::SeqCst);
    let _ = tx.send(HostCmd::PollNow);
}

fn read_until_closed(out: &Out, tx: &mpsc::SyncSender<HostCmd>, compact: &AtomicBool) {
    let stdin = std::io::stdin();
    let mut lock = stdin.lock();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match lock
            .by_ref()
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut buf)
        {
            Ok(0) | Err(_) => return,
            Ok(n) if n > MAX_LINE_BYTES => {
                emit(
                    out,
                    &AgentMsg::Error {
                        message: "command line too long".into(),
                    },
                );
                return;
            }
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&buf);
        let t = text.trim();
        if t.is_empty() {
            continue;
        }
        let cmd = match serde_json::from_str::<AgentCmd>(t).map(Command::from) {
            Ok(Command::Poll) => HostCmd::PollNow,
            Ok(Command::Interval { ms, compact: c }) => {
                compact.store(c, Ordering::Relaxed);
                HostCmd::Interval(Duration::from_millis(ms).max(MIN_INTERVAL))
            }
            Ok(Command::Act { id, req }) => HostCmd::Act { id, req },
            Err(e) => {
                emit(
                    out,
                    &AgentMsg::Error {
                        message: format!("bad command: {e}"),
                    },
                );
                continue;
            }
        };
        if tx.send(cmd).is_err() {
            return;
        }
    }
}

/// Serve `src` until stdin closes. Returns the process exit code.
pub fn serve(src: Box<dyn Source>, signals: Option<&Deliverer>, interval: Duration) -> i32 {
    let out: Out = Arc::new(Mutex::new(std::io::stdout()));
    let hello = AgentMsg::Hello {
        protocol: PROTOCOL,
        version: env!("CARGO_PKG_VERSION").into(),
        host: src.host().to_string(),
        pid: std::process::id(),
    };
    if !emit(&out, &hello) {
        return 0;
    }
    // Bounded: a client that floods commands waits on its own pipe; the agent's memory does not grow.
    let (tx, rx) = mpsc::sync_channel::<HostCmd>(crate::runtime::CMD_QUEUE);
    let wake = tx.clone();
    let reader_out = out.clone();
    let compact = Arc::new(AtomicBool::new(false));
    let reader_compact = compact.clone();
    let closed = Arc::new(AtomicBool::new(false));
    let reader_closed = closed.clone();
    std::thread::spawn(move || read_commands(&reader_out, &tx, &reader_compact, &reader_closed));
    let sink: Arc<dyn Sink> = Arc::new(StdoutSink {
        out,
        closed,
        compact,
        last: Mutex::new(None),
    });
    let interval = Duration::from_millis(millis(interval)).max(MIN_INTERVAL);
    poll::run(src, signals, &sink, &rx, &wake, interval);
    0
}

/// `gpusweep agent`'s own flags.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// Which simulated host to serve with --demo (default gpu-b).
    #[arg(long, value_name = "NAME")]
    pub demo_host: Option<String>,
}

/// `gpusweep agent [--demo-host H]`: serve this host, or a demo host with `--demo`.
pub fn run(s: &crate::runtime::Settings, a: &AgentArgs) -> anyhow::Result<i32> {
    use crate::source::demo::{DEMO_HOSTS, DemoHost};
    use crate::source::local::LocalSource;
    if !s.demo && a.demo_host.is_some() {
        anyhow::bail!(
            "--demo-host picks a simulated host: it needs --demo (this host is read without it)"
        );
    }
    let demo_host = a.demo_host.as_deref().unwrap_or("gpu-b");
    if s.demo {
        if !DemoHost::is_demo_name(demo_host) {
            anyhow::bail!(
                "--demo-host {demo_host:?}: the demo has {}",
                DEMO_HOSTS.join(", ")
            );
        }
        let src = DemoHost::new(demo_host, s.fleet.demo_clock.clone());
        return Ok(serve(Box::new(src), None, s.fleet.interval));
    }
    let host = crate::core::host::local_hostname();
    let src = LocalSource::new(
        host.clone(),
        s.fleet.procfs.clone(),
        s.fleet.load_nvml,
        crate::source::local::nvml::Readout::Gauges,
    )?;
    let d = Deliverer {
        host,
        audit: s.fleet.audit.clone(),
        without_pidfd: s.fleet.kill_without_pidfd,
    };
    Ok(serve(Box::new(src), Some(&d), s.fleet.interval))
}
