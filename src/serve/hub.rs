//! What `gpusweep serve` knows: the latest reading of every host it serves (analyzed once, by the runtime), the
//! events between readings, the time-to-clean histogram, and the polling rate its clients ask for. One loop
//! (`run`) writes it; the HTTP endpoints, the Unix socket and the metrics only read it, each reader waking only
//! for the hosts it follows.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use crate::analyze::AnalyzeOptions;
use crate::analyze::events::between;
use crate::core::event::{Event, EventKind};
use crate::core::model::{HostId, HostSnapshot, now_ms};
use crate::core::removal::{RemovalOutcome, RemovalRequest};
use crate::core::signal::{Outcome, SignalRequest};
use crate::runtime::{Fleet, HostEvent};
use crate::source::{ConnStatus, HostCmd};

/// Labels of one series: (name, value) pairs in the order they are written.
pub type Labels = Vec<(&'static str, String)>;

/// One host's seconds to clean: after a signal sent through the serve, and after its last holder's exit.
#[derive(Debug, Clone)]
pub struct TimeToClean {
    pub after_signal: Histogram,
    pub after_exit: Histogram,
}

/// Seconds: from a fast driver release (~0.1 s on an H200) to a job that takes minutes to let go.
const BUCKETS: [f64; 13] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

pub fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// Events kept for subscribers that fall behind; one that lags further skips ahead and is told so.
const EVENT_BACKLOG: usize = 1024;

/// One reading as served.
#[derive(Debug)]
pub struct Reading {
    pub snap: HostSnapshot,
    /// Bumped when what the reading says changes, not its time: subscribers send a whole snapshot only then.
    pub content: u64,
    json: OnceLock<String>,
}

impl Reading {
    /// The JSON contract of this reading, serialized once, by whoever asks first.
    pub fn json(&self) -> &str {
        self.json
            .get_or_init(|| serde_json::to_string(&self.snap).unwrap_or_default())
    }
}

/// What a reader of one host follows.
pub struct HostChannel {
    pub label: String,
    pub latest: watch::Receiver<Option<Arc<Reading>>>,
    pub status: watch::Receiver<ConnStatus>,
    /// Events of this host, as JSON (`core::event::Event`).
    pub events: broadcast::Sender<Arc<str>>,
}

/// What clients ask of the loop that owns the fleet.
#[derive(Debug)]
pub enum Ask {
    /// Poll this host at least this often while `client` is connected (`None`: it left).
    Interval {
        host: usize,
        client: u64,
        every: Option<Duration>,
    },
    PollNow {
        host: usize,
    },
    Signal {
        host: usize,
        req: SignalRequest,
        reply: oneshot::Sender<Vec<Outcome>>,
    },
    Remove {
        host: usize,
        req: RemovalRequest,
        reply: oneshot::Sender<Vec<RemovalOutcome>>,
    },
}

/// Everything the readers share.
pub struct Shared {
    pub hosts: Vec<HostChannel>,
    /// Host indices as their readings arrive, for readers of several hosts at once.
    pub readings: broadcast::Sender<usize>,
    /// Every host's events, for readers of several hosts at once.
    pub all_events: broadcast::Sender<Arc<str>>,
    pub ask: mpsc::Sender<Ask>,
    pub analyze: AnalyzeOptions,
    /// Per host, by index.
    pub time_to_clean: Vec<TimeToClean>,
    /// The poll interval when no client asks for a faster one.
    pub interval: Duration,
    /// `https` when serving TLS: how a client that reads Prometheus reaches this serve.
    pub scheme: &'static str,
    /// No signal or removal, even from the socket's privileged peers.
    pub readonly: bool,
    next_client: AtomicU64,
}

impl Shared {
    pub fn host_index(&self, label: &str) -> Option<usize> {
        self.hosts.iter().position(|h| h.label == label)
    }
    /// A number for a client's interval requests.
    pub fn client_id(&self) -> u64 {
        self.next_client.fetch_add(1, Ordering::Relaxed)
    }
}

/// The loop's side of each host's channels.
struct Writer {
    latest: watch::Sender<Option<Arc<Reading>>>,
    status: watch::Sender<ConnStatus>,
    content: u64,
    /// Unix ms of the first signal sent since the host was last all clean: "clean N s after it".
    first_signal_ms: Option<u64>,
    /// Per GPU, Unix ms of the reading where its last process was seen gone.
    exited_ms: HashMap<u32, u64>,
    /// Interval asked for, by client.
    asked: HashMap<u64, Duration>,
    interval: Duration,
}

pub struct Hub {
    shared: Arc<Shared>,
    writers: Vec<Writer>,
    asks: mpsc::Receiver<Ask>,
    next_id: u64,
    signals: HashMap<u64, oneshot::Sender<Vec<Outcome>>>,
    removals: HashMap<u64, oneshot::Sender<Vec<RemovalOutcome>>>,
}

/// The GPUs of processes that held or were listed on them in `prev` and have left /proc in `next` (or are
/// another process now).
fn died_on(prev: &HostSnapshot, next: &HostSnapshot) -> Vec<u32> {
    let mut out = Vec::new();
    let pids = prev.holders.iter().map(|h| h.pid).chain(
        prev.gpus
            .iter()
            .flat_map(|g| g.processes.iter().map(|p| p.pid)),
    );
    for pid in pids {
        let Some(before) = prev.proc(pid).filter(|p| !p.state.is_zombie()) else {
            continue;
        };
        // Dead is dead when it is a zombie too: its parent may reap it only after the driver let go.
        let alive = |p: &crate::core::model::Proc| {
            p.start_time == before.start_time && !p.state.is_zombie()
        };
        if next.proc(pid).is_some_and(alive) {
            continue;
        }
        out.extend(prev.listed_gpus(pid));
        if let Some(h) = prev.holder(pid) {
            out.extend(&h.gpus);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

impl Hub {
    pub fn new(
        labels: &[String],
        interval: Duration,
        analyze: AnalyzeOptions,
        scheme: &'static str,
        readonly: bool,
    ) -> Hub {
        let (ask, asks) = mpsc::channel(1024);
        let mut hosts = Vec::new();
        let mut writers = Vec::new();
        for label in labels {
            let (latest_tx, latest) = watch::channel(None);
            let (status_tx, status) = watch::channel(ConnStatus::Connecting);
            hosts.push(HostChannel {
                label: label.clone(),
                latest,
                status,
                events: broadcast::channel(EVENT_BACKLOG).0,
            });
            writers.push(Writer {
                latest: latest_tx,
                status: status_tx,
                content: 0,
                first_signal_ms: None,
                exited_ms: HashMap::new(),
                asked: HashMap::new(),
                interval,
            });
        }
        let shared = Arc::new(Shared {
            hosts,
            readings: broadcast::channel(EVENT_BACKLOG.max(labels.len() * 2)).0,
            all_events: broadcast::channel(EVENT_BACKLOG).0,
            ask,
            analyze,
            time_to_clean: labels
                .iter()
                .map(|_| TimeToClean {
                    after_signal: histogram(),
                    after_exit: histogram(),
                })
                .collect(),
            interval,
            scheme,
            readonly,
            next_client: AtomicU64::new(1),
        });
        Hub {
            shared,
            writers,
            asks,
            next_id: 1,
            signals: HashMap::new(),
            removals: HashMap::new(),
        }
    }

    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Own the fleet: take every reading and every client's request, until the fleet or every client
    /// handle is gone.
    pub async fn run(mut self, mut fleet: Fleet) {
        loop {
            tokio::select! {
                ev = fleet.recv() => match ev {
                    Some(ev) => self.on_event(ev),
                    None => return,
                },
                ask = self.asks.recv() => match ask {
                    Some(ask) => self.on_ask(&fleet, ask),
                    None => return,
                },
            }
        }
    }

    fn on_event(&mut self, ev: HostEvent) {
        match ev {
            HostEvent::Snapshot { host, snap } => self.on_reading(host.0, *snap),
            HostEvent::Fresh { .. } => {}
            HostEvent::Status { host, status } => {
                if let Some(w) = self.writers.get(host.0) {
                    w.status.send_replace(status);
                }
            }
            HostEvent::Outcomes { id, outcomes, .. } => {
                if let Some(reply) = self.signals.remove(&id) {
                    let _ = reply.send(outcomes);
                }
            }
            HostEvent::Removals { id, outcomes, .. } => {
                if let Some(reply) = self.removals.remove(&id) {
                    let _ = reply.send(outcomes);
                }
            }
        }
    }

    fn on_reading(&mut self, i: usize, snap: HostSnapshot) {
        let Some(w) = self.writers.get_mut(i) else {
            return;
        };
        let Some(ch) = self.shared.hosts.get(i) else {
            return;
        };
        let prev = w.latest.borrow().clone();
        let changed = prev.as_ref().is_none_or(|p| !p.snap.says_the_same(&snap));
        if changed {
            w.content += 1;
        }
        let events = between(prev.as_ref().map(|p| &p.snap), &snap, &self.shared.analyze);
        let at = snap.taken_at_ms;
        if let Some(p) = &prev {
            // A GPU process's death is when it leaves /proc; NVML may list it a while longer.
            for g in died_on(&p.snap, &snap) {
                w.exited_ms.insert(g, at);
            }
        }
        for e in &events {
            let EventKind::GpuClean { gpu, .. } = e else {
                continue;
            };
            let exited = w.exited_ms.remove(gpu);
            let Some(h) = self.shared.time_to_clean.get(i) else {
                continue;
            };
            let (since, hist) = match (w.first_signal_ms, exited) {
                (Some(t), _) => (t, &h.after_signal),
                (None, Some(t)) => (t, &h.after_exit),
                (None, None) => continue,
            };
            hist.observe(at.saturating_sub(since) as f64 / 1000.0);
        }
        let all_clean = !snap.gpus.is_empty()
            && snap.gpus.iter().all(|g| {
                crate::analyze::gpu_state(&snap, g, &self.shared.analyze)
                    == crate::analyze::GpuState::Clean
            });
        if all_clean {
            w.first_signal_ms = None;
        }
        let reading = Arc::new(Reading {
            snap,
            content: w.content,
            json: OnceLock::new(),
        });
        w.latest.send_replace(Some(reading));
        if !matches!(*w.status.borrow(), ConnStatus::Up) {
            w.status.send_replace(ConnStatus::Up);
        }
        let _ = self.shared.readings.send(i);
        for what in events {
            let e = Event {
                at_ms: at,
                host: ch.label.clone(),
                what,
            };
            if let Ok(json) = serde_json::to_string(&e) {
                let json: Arc<str> = json.into();
                let _ = ch.events.send(json.clone());
                let _ = self.shared.all_events.send(json);
            }
        }
    }

    fn on_ask(&mut self, fleet: &Fleet, ask: Ask) {
        match ask {
            Ask::Interval {
                host,
                client,
                every,
            } => {
                let base = self.shared.interval;
                let Some(w) = self.writers.get_mut(host) else {
                    return;
                };
                match every {
                    Some(d) => w.asked.insert(client, d),
                    None => w.asked.remove(&client),
                };
                let want = w
                    .asked
                    .values()
                    .copied()
                    .min()
                    .map_or(base, |d| d.min(base));
                if want != w.interval {
                    w.interval = want;
                    fleet.send(HostId(host), HostCmd::Interval(want));
                }
            }
            Ask::PollNow { host } => fleet.send(HostId(host), HostCmd::PollNow),
            Ask::Signal { host, req, reply } => {
                let id = self.next_id;
                self.next_id += 1;
                if let Some(w) = self.writers.get_mut(host) {
                    w.first_signal_ms.get_or_insert_with(now_ms);
                }
                self.signals.insert(id, reply);
                fleet.send(HostId(host), HostCmd::Signal { id, req });
            }
            Ask::Remove { host, req, reply } => {
                let id = self.next_id;
                self.next_id += 1;
                self.removals.insert(id, reply);
                fleet.send(HostId(host), HostCmd::Remove { id, req });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::{Gpu, Holder, ListedProcess, Proc, ProcState};

    fn reading(state: Option<ProcState>) -> HostSnapshot {
        HostSnapshot {
            gpus: vec![Gpu {
                index: 3,
                processes: vec![ListedProcess {
                    pid: 42,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            holders: vec![Holder {
                pid: 42,
                gpus: vec![3],
                ..Default::default()
            }],
            processes: state
                .map(|st| Proc {
                    pid: 42,
                    start_time: 7,
                    state: st,
                    ..Default::default()
                })
                .into_iter()
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_holder_dies_when_it_turns_zombie_not_when_its_parent_reaps_it() {
        let alive = reading(Some(ProcState::Sleeping));
        let zombie = reading(Some(ProcState::Zombie));
        let gone = reading(None);
        assert_eq!(died_on(&alive, &alive), Vec::<u32>::new());
        assert_eq!(died_on(&alive, &zombie), vec![3]);
        assert_eq!(died_on(&alive, &gone), vec![3]);
        assert_eq!(
            died_on(&zombie, &gone),
            Vec::<u32>::new(),
            "it died once, not twice"
        );
    }
}
