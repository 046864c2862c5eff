//! What a front end asks of a host's collector, and what the collector says of its connection: the words
//! every front end and every source share.

use std::time::Duration;

use crate::action::ActionRequest;

/// What a front end asks of one host.
#[derive(Debug, Clone, PartialEq)]
pub enum HostCmd {
    /// Carry out this action (a signal, a removal); answered through `Sink::answer` with this id.
    Act {
        id: u64,
        req: ActionRequest,
    },
    Interval(Duration),
    PollNow,
    /// From a source's own watcher, not a front end: something happened; read now, whatever the last read.
    Wake,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ConnStatus {
    Connecting,
    Up,
    /// Connected, but no reading for this long: what is shown is old. Past the read timeout the collector
    /// reconnects.
    Stale {
        silent_ms: u64,
    },
    /// Down with this reason; the collector retries with backoff.
    Down(String),
}
