//! Where snapshots come from. Every source produces whole `HostSnapshot`s; a reading it could not take is
//! `None`, never 0, and a failing part (one GPU, NVML as a whole, /dev/shm) never hides the others.
//!
//! Sources hand their readings to a `Sink` that the runtime implements; they never see the runtime's types and
//! never analyze (the runtime does, once). Polled sources (`local`, `demo`) implement `Source`; remote hosts
//! (`remote`) are tasks that stream readings from an agent, an agentless shell scan, or a command.

#![forbid(unsafe_code)]

pub mod demo;
pub mod local;
pub mod remote;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use thiserror::Error;

use gpusweep_core::action::{ActionAnswer, ActionRequest};
use gpusweep_core::model::ShmInfo;
use gpusweep_core::model::{Gpu, HostSnapshot, Proc};
use gpusweep_core::procstat::device_minor;

/// How often sources are polled by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Error)]
pub enum SourceError {
    #[error("bad --device-glob {glob:?}: {why}")]
    BadGlob { glob: String, why: String },
    #[error("{0}")]
    Unreadable(String),
    #[error("{0}")]
    Http(#[from] remote::http::HttpClientError),
}

/// A host whose readings can be taken synchronously.
pub trait Source: Send {
    fn host(&self) -> &str;
    fn poll(&mut self) -> Result<HostSnapshot, SourceError>;
    /// Sources that simulate their processes and files (the demo) carry out actions themselves. Real hosts
    /// return `None`: the runtime acts through `act`, with every safety rule.
    fn simulate(&mut self, _req: &ActionRequest) -> Option<ActionAnswer> {
        None
    }
    /// A fresh reading of /dev/shm with every process's fds and maps scanned, and the directory it read, for
    /// a removal to be checked against. `None` where this source has none.
    fn fresh_shm(&mut self) -> Option<(std::path::PathBuf, ShmInfo)> {
        None
    }
    /// Call `wake` when something worth a reading at once happens between polls (a GPU process ended).
    /// Sources that learn nothing between polls ignore it.
    fn watch(&mut self, _wake: local::exits::Waker) {}
    /// How soon after this poll the source wants the next one, when sooner than the interval (a GPU draining
    /// after its holder died, read every few ms until clean).
    fn soon(&self) -> Option<Duration> {
        None
    }
}

pub use gpusweep_core::conn::{ConnStatus, HostCmd};

/// A request that will not be carried out, answered at once, so nothing waits for it forever (polls and
/// interval changes need no answer).
pub(crate) trait Refuse {
    fn refuse(self, sink: &dyn Sink, why: &str);
}

impl Refuse for HostCmd {
    fn refuse(self, sink: &dyn Sink, why: &str) {
        if let HostCmd::Act { id, req } = self {
            sink.answer(id, req.refuse(why));
        }
    }
}

/// Where a source's readings, connection states and signal outcomes go. Each call returns false once nobody
/// listens any more: the source then stops.
pub trait Sink: Send + Sync {
    fn reading(&self, snap: HostSnapshot) -> bool;
    /// A reading taken at `taken_at_ms` that says the same as the last one handed over but for its GPU gauges
    /// (a serve's `unchanged`, a Prometheus poll that moved nothing): the host is fresh, nothing needs judging
    /// again, and only the gauges it said are new (by position: every GPU's, those that moved, or none).
    fn fresh(&self, _taken_at_ms: u64, _gauges: gpusweep_core::model::SaidGauges) -> bool {
        true
    }
    /// A reading that reads as the last one handed over but for its memory (a serve's `memory` event, its
    /// gauges every GPU's or none): put onto that reading and judged. `None` when there is no such reading
    /// or the numbers do not fit it: the stream is then opened anew, which begins with a whole reading.
    fn memory(&self, _moved: gpusweep_core::sse::MemoryMoved) -> Option<bool> {
        None
    }
    fn status(&self, status: ConnStatus) -> bool;
    /// The answer to the action request with this id.
    fn answer(&self, id: u64, answer: ActionAnswer) -> bool;
}

/// A sink nobody listens to, for tests of a collector's own bookkeeping.
#[cfg(test)]
pub(crate) struct Deaf;

#[cfg(test)]
impl Sink for Deaf {
    fn reading(&self, _: HostSnapshot) -> bool {
        false
    }
    fn status(&self, _: ConnStatus) -> bool {
        false
    }
    fn answer(&self, _: u64, _: ActionAnswer) -> bool {
        false
    }
}

/// The processes worth showing: the seeds (holders, listed PIDs), every zombie, and their ancestors (for the
/// tree and for zombie parents), as far as `procs` knows them. Returns them and the sorted zombie PIDs.
pub(crate) fn shown_pids(
    procs: &HashMap<u32, Proc>,
    seeds: impl Iterator<Item = u32>,
) -> (HashSet<u32>, Vec<u32>) {
    let mut wanted: HashSet<u32> = seeds.collect();
    let mut zombies: Vec<u32> = procs
        .values()
        .filter(|p| p.state.is_zombie())
        .map(|p| p.pid)
        .collect();
    zombies.sort_unstable();
    wanted.extend(zombies.iter().copied());
    // Whether an adopted zombie will ever be reaped depends on what PID 1 is: show it then.
    if zombies
        .iter()
        .any(|z| procs.get(z).is_some_and(|p| p.ppid == 1))
    {
        wanted.insert(1);
    }
    let start: Vec<u32> = wanted.iter().copied().collect();
    for pid in start {
        let mut cur = pid;
        for _ in 0..64 {
            let Some(p) = procs.get(&cur) else { break };
            if p.ppid <= 1 || !wanted.insert(p.ppid) {
                break;
            }
            cur = p.ppid;
        }
    }
    wanted.retain(|p| procs.contains_key(p));
    (wanted, zombies)
}

/// A holder NVML charges memory to is never benign, whatever it is called.
pub(crate) fn unbenign_charged(holders: &mut [gpusweep_core::model::Holder], gpus: &[Gpu]) {
    for h in holders.iter_mut().filter(|h| h.benign) {
        let charged = gpus
            .iter()
            .flat_map(|g| g.processes.iter())
            .any(|p| p.pid == h.pid && p.used_bytes.is_none_or(|b| b > 0));
        if charged {
            h.benign = false;
        }
    }
}

/// GPU indices of the device files a process has open: `/dev/nvidiaN` -> the GPU whose NVML minor is N
/// (without GPU readings the minor is taken as the index). Control files map to no GPU.
pub(crate) fn gpus_of_devices(devices: &[String], gpus: &[Gpu]) -> Vec<u32> {
    let by_minor: HashMap<u32, u32> = gpus
        .iter()
        .filter_map(|g| g.minor.map(|m| (m, g.index)))
        .collect();
    let mut out: Vec<u32> = devices
        .iter()
        .filter_map(|d| device_minor(d))
        .filter_map(|m| {
            if gpus.is_empty() {
                Some(m)
            } else {
                by_minor.get(&m).copied()
            }
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}
