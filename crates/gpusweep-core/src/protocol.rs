//! The agent protocol: versioned JSON messages, one per line, between `gpusweep agent` (on a host) and a
//! client (over SSH or a local command). The agent sends whole snapshots, unanalyzed: the client's runtime
//! analyzes every host once, with the operator's options.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::action::{ActionAnswer, ActionRequest};
use super::model::{Gauges, HostSnapshot};
use super::removal::{RemovalOutcome, RemovalRequest};
use super::signal::{Outcome, SignalRequest};

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
    /// A reading that says the same as the last snapshot sent but for its GPU gauges: only its time and
    /// gauges. Sent only to a client that asked for it (`interval` with `compact`).
    Unchanged {
        taken_at_ms: u64,
        gauges: Vec<Gauges>,
    },
    Outcomes {
        id: u64,
        outcomes: Vec<Outcome>,
    },
    /// The answer to a `remove` command.
    Removals {
        id: u64,
        outcomes: Vec<RemovalOutcome>,
    },
    Error {
        message: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum AgentCmd {
    /// Poll every `ms` milliseconds from now on (fast during a re-watch). `compact`: send `unchanged` for a
    /// reading that says nothing new but its gauges (an agent that does not know the field ignores it and
    /// sends every snapshot whole, which a client takes just as well).
    Interval {
        ms: u64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        compact: bool,
    },
    /// Poll now.
    Poll,
    /// Signal these targets (the client's confirmed plan); answered by an `outcomes` message with this id.
    Signal { id: u64, request: SignalRequest },
    /// Remove these /dev/shm leftovers (re-checked there); answered by a `removals` message with this id.
    Remove { id: u64, request: RemovalRequest },
}

impl AgentCmd {
    /// An action as the wire carries it.
    pub fn act(id: u64, req: ActionRequest) -> AgentCmd {
        match req {
            ActionRequest::Signal(request) => AgentCmd::Signal { id, request },
            ActionRequest::Remove(request) => AgentCmd::Remove { id, request },
        }
    }
}

impl AgentMsg {
    /// An action's answer as the wire carries it.
    pub fn answer(id: u64, answer: ActionAnswer) -> AgentMsg {
        match answer {
            ActionAnswer::Signal(outcomes) => AgentMsg::Outcomes { id, outcomes },
            ActionAnswer::Remove(outcomes) => AgentMsg::Removals { id, outcomes },
        }
    }
}

/// What an agent stream's command line asks for, once parsed: the wire's names folded into one action.
#[derive(Debug, Clone)]
pub enum Command {
    Interval { ms: u64, compact: bool },
    Poll,
    Act { id: u64, req: ActionRequest },
}

impl From<AgentCmd> for Command {
    fn from(c: AgentCmd) -> Command {
        match c {
            AgentCmd::Interval { ms, compact } => Command::Interval { ms, compact },
            AgentCmd::Poll => Command::Poll,
            AgentCmd::Signal { id, request } => Command::Act {
                id,
                req: ActionRequest::Signal(request),
            },
            AgentCmd::Remove { id, request } => Command::Act {
                id,
                req: ActionRequest::Remove(request),
            },
        }
    }
}

/// An agent's message, once parsed: the wire's answers folded into one.
#[derive(Debug)]
pub enum Message {
    Hello {
        protocol: u32,
        version: String,
        host: String,
    },
    Snapshot(Box<HostSnapshot>),
    Unchanged {
        taken_at_ms: u64,
        gauges: Vec<Gauges>,
    },
    Answer {
        id: u64,
        answer: ActionAnswer,
    },
    Error(String),
}

impl From<AgentMsg> for Message {
    fn from(m: AgentMsg) -> Message {
        match m {
            AgentMsg::Hello {
                protocol,
                version,
                host,
                ..
            } => Message::Hello {
                protocol,
                version,
                host,
            },
            AgentMsg::Snapshot { snapshot } => Message::Snapshot(snapshot),
            AgentMsg::Unchanged {
                taken_at_ms,
                gauges,
            } => Message::Unchanged {
                taken_at_ms,
                gauges,
            },
            AgentMsg::Outcomes { id, outcomes } => Message::Answer {
                id,
                answer: ActionAnswer::Signal(outcomes),
            },
            AgentMsg::Removals { id, outcomes } => Message::Answer {
                id,
                answer: ActionAnswer::Remove(outcomes),
            },
            AgentMsg::Error { message } => Message::Error(message),
        }
    }
}
