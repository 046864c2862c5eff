//! Server-sent events as they go out, formatted in one place: the hub formats each reading's and event's
//! body once, the HTTP layer adds each stream's id. (The hub and the HTTP layer imported each other for it.)

use bytes::Bytes;

use crate::core::sse;

/// One server-sent event. Its data is already in SSE's `data:` lines: a snapshot's are formatted once per
/// reading and shared by every stream that sends it (a `Bytes` is a reference), never copied per client —
/// a hundred streams of a thousand hosts held a copy each (768 MB) before.
#[derive(Debug, Clone)]
pub struct Frame {
    /// `event:` and `data:` lines.
    body: Bytes,
    pub retry_ms: Option<u64>,
}

/// Past this size an event's body goes out as it is shared; a smaller one is copied with its id into one
/// piece (a reader sees it whole in one read).
const SHARED_BODY: usize = 4096;

impl Frame {
    pub fn of(body: Bytes) -> Frame {
        Frame {
            body,
            retry_ms: None,
        }
    }

    /// The event as it goes out: its body and its id (and retry); one piece when small.
    pub fn chunks(self, id: &str) -> Vec<Bytes> {
        use std::fmt::Write as _;
        let mut tail = format!("id: {id}\n");
        if let Some(ms) = self.retry_ms {
            let _ = writeln!(tail, "retry: {ms}");
        }
        tail.push('\n');
        if self.body.len() > SHARED_BODY {
            return vec![self.body, Bytes::from(tail)];
        }
        let mut one = Vec::with_capacity(self.body.len() + tail.len());
        one.extend_from_slice(&self.body);
        one.extend_from_slice(tail.as_bytes());
        vec![Bytes::from(one)]
    }
}

/// An event's `event:` line and `text` as its `data:` lines (one per line of it: compact JSON has one).
pub fn sse_body(kind: sse::Kind, text: &str) -> Bytes {
    let mut out = String::with_capacity(text.len() + 32);
    out.push_str("event: ");
    out.push_str(kind.as_str());
    out.push('\n');
    for line in text.split('\n') {
        out.push_str("data: ");
        out.push_str(line.trim_end_matches('\r'));
        out.push('\n');
    }
    Bytes::from(out)
}
