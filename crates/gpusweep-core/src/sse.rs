//! The serve's event stream (`/api/v1/events`): the events' names and what each carries, shared by the serve
//! that writes them and the `http(s)://` client that reads them, so neither spells them on its own.

use serde::{Deserialize, Serialize};

use super::model::Gauges;

/// The name of a server-sent event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// First on every stream: `Hello`.
    Hello,
    /// A reading that says something new to this stream: the whole host object of the JSON contract.
    Snapshot,
    /// A reading that says nothing new: `Unchanged`.
    Unchanged,
    /// A reading that says nothing new but its memory, to a stream that asked (`memory=moved`) and was sent
    /// the reading it moves from: `MemoryMoved`.
    Memory,
    /// One of the timeline's events (`core::event::Event`).
    Event,
    /// A host's connection changed: `Status`.
    Status,
    /// A reconnecting stream asked (`Last-Event-ID`) for events the serve no longer keeps: `Gap`.
    Gap,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::Hello,
        Kind::Snapshot,
        Kind::Unchanged,
        Kind::Memory,
        Kind::Event,
        Kind::Status,
        Kind::Gap,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Hello => "hello",
            Kind::Snapshot => "snapshot",
            Kind::Unchanged => "unchanged",
            Kind::Memory => "memory",
            Kind::Event => "event",
            Kind::Status => "status",
            Kind::Gap => "gap",
        }
    }

    /// The kind an event's name says; `None` for a name this version does not know (a newer serve's).
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u32,
    pub version: String,
    pub hosts: Vec<String>,
    /// How often the serve reads when no client asks for more (older serves leave it out).
    #[serde(default)]
    pub interval_ms: Option<u64>,
    /// Names the stream asked for (`?hosts=`) that this serve does not have: not streamed, and said so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknown: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unchanged {
    pub host: String,
    pub taken_at_ms: u64,
    /// Each GPU's gauges, only when they moved since the stream last sent them; absent: as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gauges: Option<Vec<Gauges>>,
    /// On a stream asked with `gauges=moved`: only the GPUs whose gauges moved, as (position in the
    /// reading's `gpus`, gauges); the others as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved: Option<crate::model::SaidList>,
}

/// A reading that reads as the last one this stream was sent but for its memory (and its time and gauges,
/// as an `Unchanged` carries them): the reading is the last one with these numbers put in, in its order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryMoved {
    pub host: String,
    pub taken_at_ms: u64,
    /// Each GPU's used bytes.
    pub used: Vec<Option<u64>>,
    /// Per GPU, what NVML charges each of its listed processes.
    pub charged: Vec<Vec<Option<u64>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gauges: Option<Vec<Gauges>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved: Option<crate::model::SaidList>,
    /// The host's findings, where their figures moved with the memory (the same findings, as
    /// `verdict::findings_moved` says at most `Figures`; sent only to a stream that asked `findings=moved`). None:
    /// the findings are the reading's before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub findings: Option<Vec<crate::model::Finding>>,
}

/// A host's connection in a word, as the stream says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Conn {
    Up,
    Connecting,
    Stale,
    Down,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub host: String,
    pub status: Conn,
    pub reason: Option<String>,
}

/// Events a reconnecting stream missed and cannot be given: why. The events still kept follow it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gap {
    pub reason: String,
}

/// How soon a client should reconnect after a stream ends (`retry:`).
pub const RETRY_MS: u64 = 1000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_an_unchanged_without_gauges_leaves_them_out() {
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.as_str()), Some(k));
        }
        assert_eq!(Kind::parse("future"), None);
        let u = Unchanged {
            host: "h".into(),
            taken_at_ms: 5,
            gauges: None,
            moved: None,
        };
        let j = serde_json::to_string(&u).expect("json");
        assert_eq!(j, r#"{"host":"h","taken_at_ms":5}"#);
        let old: Hello = serde_json::from_str(r#"{"protocol":1,"version":"0.1.0","hosts":["a"]}"#)
            .expect("an older serve's hello");
        assert_eq!(old.interval_ms, None);
    }
}
