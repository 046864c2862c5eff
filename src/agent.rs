//! `gpusweep agent`: the remote end. It writes versioned JSON messages, one per line, on stdout: a hello,
//! then a snapshot every interval, and the outcome of each signal request. It reads commands on stdin, one JSON
//! object per line, and exits when stdin closes (the SSH channel or the parent went away).
//!
//! Signals go through the same `sweep::deliver` as local kills, so the agent applies every safety rule on its
//! own host: (pid, start time) re-checked through a pidfd, never PID 1, itself or its ancestors, audit-logged.

use std::io::{BufRead, Read, Write};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::analyze::{AnalyzeOptions, analyzed};
use crate::model::HostSnapshot;
use crate::source::Source;
use crate::sweep::{Outcome, SignalRequest};

/// Bumped on an incompatible change; clients refuse other versions with a clear message.
pub const PROTOCOL: u32 = 1;
/// The longest line either side accepts.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// The fastest polling a client may ask for.
pub const MIN_INTERVAL: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentMsg {
    Hello {
        protocol: u32,
        version: String,
        host: String,
        pid: u32,
    },
    Snapshot {
        snapshot: Box<HostSnapshot>,
    },
    Outcomes {
        id: u64,
        outcomes: Vec<Outcome>,
    },
    Error {
        message: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum AgentCmd {
    /// Poll every `ms` milliseconds from now on (fast during a re-watch).
    Interval { ms: u64 },
    /// Poll now.
    Poll,
    /// Signal these targets (the client's confirmed plan); answered by an `outcomes` message with this id.
    Signal { id: u64, request: SignalRequest },
}

enum Input {
    Cmd(AgentCmd),
    Bad(String),
    Eof,
}

type Out = Arc<Mutex<std::io::Stdout>>;

fn emit(out: &Out, msg: &AgentMsg) -> bool {
    let Ok(line) = serde_json::to_string(msg) else {
        return false;
    };
    let Ok(mut o) = out.lock() else { return false };
    writeln!(o, "{line}").and_then(|_| o.flush()).is_ok()
}

/// Serve `src` until stdin closes. Returns the process exit code.
pub fn serve(mut src: Box<dyn Source>, interval: Duration) -> i32 {
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
    let (tx, rx) = mpsc::channel::<Input>();
    std::thread::spawn(move || {
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
                Ok(0) | Err(_) => {
                    let _ = tx.send(Input::Eof);
                    return;
                }
                Ok(n) if n > MAX_LINE_BYTES => {
                    let _ = tx.send(Input::Bad("command line too long".into()));
                    let _ = tx.send(Input::Eof);
                    return;
                }
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&buf);
            let t = text.trim();
            if t.is_empty() {
                continue;
            }
            let msg = match serde_json::from_str::<AgentCmd>(t) {
                Ok(c) => Input::Cmd(c),
                Err(e) => Input::Bad(format!("bad command: {e}")),
            };
            if tx.send(msg).is_err() {
                return;
            }
        }
    });
    let opts = AnalyzeOptions::default();
    let mut interval = interval.max(MIN_INTERVAL);
    loop {
        let msg = match src.poll() {
            Ok(s) => AgentMsg::Snapshot {
                snapshot: Box::new(analyzed(s, &opts)),
            },
            Err(e) => AgentMsg::Error {
                message: format!("{e:#}"),
            },
        };
        if !emit(&out, &msg) {
            return 0;
        }
        let next = Instant::now() + interval;
        loop {
            let wait = next.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(Input::Cmd(AgentCmd::Poll)) => break,
                Ok(Input::Cmd(AgentCmd::Interval { ms })) => {
                    interval = Duration::from_millis(ms).max(MIN_INTERVAL);
                    break;
                }
                Ok(Input::Cmd(AgentCmd::Signal { id, request })) => {
                    if let Some(d) = src.deliverer() {
                        let out = out.clone();
                        std::thread::spawn(move || {
                            let outcomes = d.deliver(&request);
                            emit(&out, &AgentMsg::Outcomes { id, outcomes });
                        });
                    } else {
                        let outcomes = src.signal(&request);
                        emit(&out, &AgentMsg::Outcomes { id, outcomes });
                    }
                    break;
                }
                Ok(Input::Bad(message)) => {
                    emit(&out, &AgentMsg::Error { message });
                }
                Ok(Input::Eof) | Err(mpsc::RecvTimeoutError::Disconnected) => return 0,
                Err(mpsc::RecvTimeoutError::Timeout) => break,
            }
        }
    }
}
