//! "Until clean": the state machine shared by `gpusweep wait`, `sweep` and the TUI's re-watch.
//! No clock inside: callers pass the time, so it is deterministic under test.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::analyze::gpu_clean;
use crate::model::{HostSnapshot, fmt_bytes};

/// Which GPUs matter: all, or these indices on every host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    pub gpus: Option<Vec<u32>>,
}

impl Scope {
    pub fn includes(&self, gpu: u32) -> bool {
        self.gpus.as_ref().is_none_or(|g| g.contains(&gpu))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "why", rename_all = "snake_case")]
pub enum Verdict {
    Clean,
    /// What still holds memory, one line per GPU or holder.
    Dirty(Vec<String>),
    /// The host could not be read.
    Unknown(String),
}

/// DESIGN's clean, for one host. Where no GPU can be read it judges by holders alone.
pub fn verdict(snap: &HostSnapshot, scope: &Scope, tolerance: u64) -> Verdict {
    if let Some(e) = &snap.error {
        return Verdict::Unknown(e.clone());
    }
    let gpus: Vec<_> = snap
        .gpus
        .iter()
        .filter(|g| scope.includes(g.index))
        .collect();
    let readable = gpus.iter().any(|g| g.memory.used.is_some());
    let mut why = Vec::new();
    if readable {
        for g in gpus {
            match gpu_clean(g, tolerance) {
                Some(true) => {}
                Some(false) => {
                    let holders: Vec<String> = snap
                        .holders
                        .iter()
                        .filter(|h| !h.benign && h.gpus.contains(&g.index))
                        .map(|h| h.pid.to_string())
                        .collect();
                    let listed: Vec<String> =
                        g.processes.iter().map(|p| p.pid.to_string()).collect();
                    let mut line = format!("GPU {}: {} used", g.index, fmt_bytes(g.memory.used));
                    if !listed.is_empty() {
                        line.push_str(&format!(", listed {}", listed.join(",")));
                    }
                    if !holders.is_empty() {
                        line.push_str(&format!(", held by {}", holders.join(",")));
                    }
                    why.push(line);
                }
                None => why.push(format!(
                    "GPU {}: no reading ({})",
                    g.index,
                    g.error.clone().unwrap_or_default()
                )),
            }
        }
    } else {
        for h in snap.holders.iter().filter(|h| !h.benign) {
            if h.gpus.is_empty() || h.gpus.iter().any(|&g| scope.includes(g)) {
                why.push(format!("holder {} ({})", h.pid, h.devices.join(" ")));
            }
        }
    }
    if why.is_empty() {
        Verdict::Clean
    } else {
        Verdict::Dirty(why)
    }
}

/// Whether this host's GPUs could be read at all (otherwise the verdict was by holders alone).
pub fn judged_by_holders_only(snap: &HostSnapshot) -> bool {
    snap.error.is_none() && !snap.gpus.iter().any(|g| g.memory.used.is_some())
}

#[derive(Debug, Clone)]
pub struct Watch {
    pub scope: Scope,
    pub tolerance: u64,
    pub started_ms: u64,
    pub clean_at_ms: Option<u64>,
    pub hosts: BTreeMap<String, Verdict>,
    /// Hosts that must report before the watch can end.
    pub expected: Vec<String>,
}

impl Watch {
    pub fn new(expected: Vec<String>, scope: Scope, tolerance: u64, now_ms: u64) -> Watch {
        Watch {
            scope,
            tolerance,
            started_ms: now_ms,
            clean_at_ms: None,
            hosts: BTreeMap::new(),
            expected,
        }
    }

    /// Take one host's snapshot. Returns true when this observation made everything clean.
    pub fn observe(&mut self, snap: &HostSnapshot, now_ms: u64) -> bool {
        self.hosts.insert(
            snap.host.clone(),
            verdict(snap, &self.scope, self.tolerance),
        );
        let all = self.all_clean();
        if all && self.clean_at_ms.is_none() {
            self.clean_at_ms = Some(now_ms);
            return true;
        }
        if !all {
            self.clean_at_ms = None;
        }
        false
    }

    pub fn all_clean(&self) -> bool {
        !self.expected.is_empty()
            && self
                .expected
                .iter()
                .all(|h| matches!(self.hosts.get(h), Some(Verdict::Clean)))
    }

    pub fn took_ms(&self) -> Option<u64> {
        self.clean_at_ms.map(|c| c.saturating_sub(self.started_ms))
    }

    /// Lines naming what still holds memory, for a timeout message.
    pub fn remaining(&self) -> Vec<String> {
        let mut out = Vec::new();
        for h in &self.expected {
            match self.hosts.get(h) {
                None => out.push(format!("{h}: no reading yet")),
                Some(Verdict::Clean) => {}
                Some(Verdict::Unknown(e)) => out.push(format!("{h}: {e}")),
                Some(Verdict::Dirty(why)) => out.extend(why.iter().map(|w| format!("{h}: {w}"))),
            }
        }
        out
    }
}

/// 75 -> "1m15s", 4000 -> "1h06m".
pub fn fmt_secs(s: u64) -> String {
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else if s < 86400 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else {
        format!("{}d{:02}h", s / 86400, (s % 86400) / 3600)
    }
}

/// Milliseconds for people: "850 ms", "2.3 s".
pub fn fmt_ms(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}
