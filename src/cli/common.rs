//! What the subcommands share: the async runtime, first readings, confirmation, delivering signals.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::core::action::{ActionAnswer, ActionRequest};
use crate::core::model::{HostId, HostSnapshot};
use crate::core::procstat::{parse_cmdline, parse_stat};
use crate::core::signal::{Outcome, SignalRequest, TargetInfo, all_failed};
use crate::runtime::{Fleet, HostEvent, Judgement};
use crate::source::{ConnStatus, HostCmd};

pub use crate::runtime::FAST_POLL;
/// How long a host may take to answer a signal request beyond its grace period.
pub const ANSWER_SLACK: Duration = Duration::from_secs(30);

pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    crate::runtime::async_runtime().context("starting the async runtime")
}

/// The first reading of every host, or its error; hosts that say nothing within the timeout get an error.
pub async fn first_snapshots(fleet: &mut Fleet, timeout: Duration) -> Vec<HostSnapshot> {
    first_snapshots_each(fleet, timeout, |_| {}).await
}

/// `first_snapshots`, handing each host's reading (or error) to `each` as it arrives: a table can print the
/// hosts that answered while one that hangs is still waited for.
pub async fn first_snapshots_each(
    fleet: &mut Fleet,
    timeout: Duration,
    mut each: impl FnMut(&HostSnapshot),
) -> Vec<HostSnapshot> {
    let n = fleet.len();
    let mut told = vec![false; n];
    let got = gather(fleet, timeout, "no reading", |fleet, ev, got| {
        let (i, snap) = match ev {
            HostEvent::Update {
                host,
                update: Judgement::New(judged),
            } if host.0 < n => (host.0, Arc::unwrap_or_clone(judged.snap)),
            HostEvent::Status {
                host,
                status: ConnStatus::Down(e),
            } if host.0 < n && got[host.0].is_none() => (host.0, fleet.unreadable(host, &e)),
            _ => return None,
        };
        if !std::mem::replace(&mut told[i], true) {
            each(&snap);
        }
        Some((i, snap))
    })
    .await;
    // The hosts that said nothing in time, as errors.
    for (s, _) in got.iter().zip(&told).filter(|(_, told)| !**told) {
        each(s);
    }
    got
}

/// One reading of every host taken at or after `since_ms` (Unix ms): what a verdict about a moment may rest
/// on. A reading already in flight when that moment came is skipped, and a poll is asked for at once.
pub async fn readings_since(
    fleet: &mut Fleet,
    since_ms: u64,
    timeout: Duration,
) -> Vec<HostSnapshot> {
    fleet.broadcast(&HostCmd::PollNow);
    let n = fleet.len();
    gather(fleet, timeout, "no new reading", |fleet, ev, _| match ev {
        HostEvent::Update {
            host,
            update: Judgement::New(judged),
        } if host.0 < n && judged.snap.taken_at_ms >= since_ms => {
            Some((host.0, Arc::unwrap_or_clone(judged.snap)))
        }
        // A reading that said the same: the last one judged, as of its time.
        HostEvent::Update {
            host,
            update: Judgement::Same { taken_at_ms, .. },
        } if host.0 < n && taken_at_ms >= since_ms => fleet
            .latest(host)
            .map(|j| (host.0, Arc::unwrap_or_clone(j.snap))),
        _ => None,
    })
    .await
}

/// The fleet's events until every host has a reading `pick` takes from one (given what each host has so
/// far), or `timeout` passes: each host's reading in host order, an error saying `missing` where none came.
async fn gather(
    fleet: &mut Fleet,
    timeout: Duration,
    missing: &str,
    mut pick: impl FnMut(&Fleet, HostEvent, &[Option<HostSnapshot>]) -> Option<(usize, HostSnapshot)>,
) -> Vec<HostSnapshot> {
    let mut got: Vec<Option<HostSnapshot>> = vec![None; fleet.len()];
    let deadline = tokio::time::Instant::now() + timeout;
    while got.iter().any(Option::is_none) {
        let Ok(Some(ev)) = tokio::time::timeout_at(deadline, fleet.recv()).await else {
            break;
        };
        if let Some((i, snap)) = pick(fleet, ev, &got) {
            got[i] = Some(snap);
        }
    }
    let why = format!(
        "{missing} within {}s (--connect-timeout SECS waits longer)",
        timeout.as_secs()
    );
    got.into_iter()
        .enumerate()
        .map(|(i, s)| s.unwrap_or_else(|| fleet.unreadable(HostId(i), &why)))
        .collect()
}

pub fn confirm(question: &str, yes: bool) -> anyhow::Result<bool> {
    if yes {
        return Ok(true);
    }
    if !std::io::stdin().is_terminal() {
        bail!("refusing without --yes: stdin is not a terminal, so nobody can confirm");
    }
    eprint!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes" | "YES"))
}

/// Send one request per host and gather every outcome (hosts that never answer fail after `limit`).
pub async fn deliver_all(
    fleet: &mut Fleet,
    reqs: &[(HostId, SignalRequest)],
    limit: Duration,
) -> Vec<(String, Outcome)> {
    let mut waiting: BTreeMap<u64, usize> = BTreeMap::new();
    for (i, (host, req)) in reqs.iter().enumerate() {
        let id = i as u64 + 1;
        waiting.insert(id, i);
        let req = ActionRequest::Signal(req.clone());
        fleet.send(*host, HostCmd::Act { id, req });
    }
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    while !waiting.is_empty() {
        match tokio::time::timeout_at(deadline, fleet.recv()).await {
            Ok(Some(HostEvent::Answer {
                host,
                id,
                answer: ActionAnswer::Signal(outcomes),
            })) if waiting.get(&id).is_some_and(|&i| reqs[i].0 == host) => {
                waiting.remove(&id);
                let label = fleet.label(host).to_string();
                out.extend(outcomes.into_iter().map(|o| (label.clone(), o)));
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    for i in waiting.into_values() {
        let (host, req) = &reqs[i];
        let label = fleet.label(*host).to_string();
        for o in all_failed(req, "no answer from the host") {
            out.push((label.clone(), o));
        }
    }
    out
}

pub fn print_outcomes(outs: &[(String, Outcome)]) {
    for (host, o) in outs {
        println!("  {}: {}", crate::core::format::escape(host), o.describe());
    }
}

/// Whether any target's fate means it was not dealt with.
pub fn any_failed(outs: &[(String, Outcome)]) -> bool {
    outs.iter().any(|(_, o)| o.failed())
}

/// A PID's (start time, command line) as this host's /proc says now.
pub fn local_identity(pid: u32) -> Option<TargetInfo> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let p = parse_stat(&stat)?;
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| parse_cmdline(&raw))
        .unwrap_or_default();
    Some(TargetInfo {
        pid,
        start_time: p.start_time,
        cmdline: if cmd.is_empty() {
            format!("[{}]", p.comm)
        } else {
            cmd
        },
        pidfs_ino: crate::source::local::procfs::pidfs_inode(pid),
    })
}
