//! What `gpusweep serve` publishes: the latest reading of every host it serves and the events between them,
//! both as the runtime's ledgers judged them (the hub judges nothing itself), the time-to-clean histogram fed
//! from those events, and the polling rate its clients ask for. One loop (`run`) writes it; the HTTP
//! endpoints, the Unix socket and the metrics only read it, each reader waking only for the hosts it follows.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{Notify, broadcast, mpsc, oneshot, watch};

use super::redact::{self, View, redact};
use crate::core::action::{ActionAnswer, ActionRequest};
use crate::core::conn::{ConnStatus, HostCmd};
use crate::core::event::{Event, EventKind};
use crate::core::model::{HostId, HostSnapshot};
use crate::runtime::{Fleet, HostEvent, Judged, Judgement};

/// One host's seconds to clean: after a signal sent through the serve, and after its last holder's exit.
#[derive(Debug, Clone)]
/// A host's histories, kept across readings: how long its GPUs took to read clean, how long its jobs took to
/// warm up, how many ranks its jobs lost.
pub struct HostStats {
    pub after_signal: Histogram,
    pub after_exit: Histogram,
    pub warmup: Histogram,
    pub lost_ranks: prometheus_client::metrics::counter::Counter,
}

/// Seconds a job's warm-up takes: from a small model's seconds to the 11-23 minutes of an EP node's.
const WARMUP_BUCKETS: [f64; 10] = [
    10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1200.0, 1800.0, 3600.0,
];

/// Seconds: from a fast driver release (~0.1 s on an H200) to a job that takes minutes to let go.
const BUCKETS: [f64; 13] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

pub fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// Events kept for subscribers that fall behind; one that lags further catches up from the journal.
const EVENT_BACKLOG: usize = 1024;

/// Timeline events a serve keeps for streams that reconnect, unless `--replay` says otherwise.
pub const DEFAULT_REPLAY: usize = 10_000;

/// One timeline event as served: its place in the serve's sequence, its host, its JSON (as HTTP readers may
/// see it).
#[derive(Debug)]
pub struct Logged {
    pub seq: u64,
    pub host: usize,
    /// The event as SSE lines (`event: event`, its JSON as `data:`), formatted once for every stream.
    pub sse: bytes::Bytes,
}

/// The last timeline events, for streams that reconnect with `Last-Event-ID` (`EPOCH-SEQ`). The epoch is
/// this serve's start: an id of another epoch is from a serve that is gone, and its events with it.
pub struct Journal {
    pub epoch: u64,
    /// The sequence number the next event gets (the first is 1; 0 stands for "none yet").
    next: u64,
    kept: std::collections::VecDeque<Arc<Logged>>,
    cap: usize,
}

/// What a reconnecting stream may be given of what it missed.
#[derive(Debug)]
pub enum Missed {
    /// Every event after its last one (for its hosts), in order.
    Replay(Vec<Arc<Logged>>),
    /// Some are gone: why, and what is kept (from the oldest still here).
    Gap { why: String, kept: Vec<Arc<Logged>> },
}

impl Journal {
    fn new(cap: usize) -> Journal {
        Journal {
            epoch: crate::core::model::now_ms(),
            next: 1,
            kept: std::collections::VecDeque::new(),
            cap,
        }
    }

    fn push(&mut self, host: usize, json: &str) -> Arc<Logged> {
        let logged = Arc::new(Logged {
            seq: self.next,
            host,
            sse: super::frame::sse_body(crate::core::sse::Kind::Event, json),
        });
        self.next += 1;
        if self.cap > 0 {
            if self.kept.len() == self.cap {
                self.kept.pop_front();
            }
            self.kept.push_back(logged.clone());
        }
        logged
    }

    /// The sequence number of the last event so far (0: none).
    pub fn last(&self) -> u64 {
        self.next - 1
    }

    /// The events after `after` (for the hosts `wanted` picks), or what is kept where some are gone.
    pub fn since(&self, epoch: u64, after: u64, wanted: impl Fn(usize) -> bool) -> Missed {
        let pick = |from: u64| -> Vec<Arc<Logged>> {
            self.kept
                .iter()
                .filter(|l| l.seq > from && wanted(l.host))
                .cloned()
                .collect()
        };
        if epoch != self.epoch {
            return Missed::Gap {
                why: "the serve restarted: the events before its start are gone".into(),
                kept: pick(0),
            };
        }
        // An id this serve never gave (past its newest): the client's place is unknown, so say so.
        if after > self.last() {
            return Missed::Gap {
                why: format!(
                    "event {after} was never sent (the newest is {}): every kept event follows",
                    self.last()
                ),
                kept: pick(0),
            };
        }
        let oldest = self.kept.front().map_or(self.next, |l| l.seq);
        if after + 1 < oldest && after < self.last() {
            return Missed::Gap {
                why: format!(
                    "{} events after {after} are no longer kept (the serve keeps the last {})",
                    oldest - after - 1,
                    self.cap
                ),
                kept: pick(after),
            };
        }
        Missed::Replay(pick(after))
    }
}

/// One reading as served.
#[derive(Debug)]
pub struct Reading {
    /// As its ledger judged it (shared with the ledger; a reading that said the same is a copy with its
    /// time and gauges put in).
    pub snap: Arc<HostSnapshot>,
    /// Bumped when what the reading says changes, not its time: subscribers send a whole snapshot only then.
    pub content: u64,
    /// The content of the reading before it, when this one reads the same but for its memory: a stream that
    /// sent that one and asked (`memory=moved`) is sent the memory alone.
    pub memory_from: Option<u64>,
    /// The same where the findings moved only in their figures too: sent as memory with the findings to a
    /// stream that asked (`findings=moved`).
    pub figures_from: Option<u64>,
    json: OnceLock<String>,
    /// The same with every process hidden but by PID and memory (`None`: nothing to hide).
    json_no_others: OnceLock<Option<String>>,
    /// Both as SSE `data:` lines, formatted once and shared by every stream that sends them.
    sse: OnceLock<bytes::Bytes>,
    sse_no_others: OnceLock<Option<bytes::Bytes>>,
}

impl Reading {
    fn of(judged: Judged) -> Reading {
        Reading {
            content: judged.content,
            memory_from: judged.memory_from,
            figures_from: judged.figures_from,
            snap: judged.snap,
            json: OnceLock::new(),
            json_no_others: OnceLock::new(),
            sse: OnceLock::new(),
            sse_no_others: OnceLock::new(),
        }
    }
}

impl Reading {
    /// The JSON contract of this reading, serialized once, by whoever asks first.
    pub fn json(&self) -> &str {
        self.json
            .get_or_init(|| serde_json::to_string(&*self.snap).unwrap_or_default())
    }

    /// The JSON contract of this reading as a reader with `view` may see it: whole (serialized once), or
    /// with the processes it may not see hidden (serialized once for readers the serve cannot name, per
    /// reader otherwise).
    pub fn json_as(&self, view: View) -> std::borrow::Cow<'_, str> {
        let hidden =
            |v| redact(&self.snap, v).map(|s| serde_json::to_string(&s).unwrap_or_default());
        match view {
            View::Whole => self.json().into(),
            View::NoOthers => match self.json_no_others.get_or_init(|| hidden(view)) {
                Some(j) => j.as_str().into(),
                None => self.json().into(),
            },
            View::Own(_) => hidden(view).map_or_else(|| self.json().into(), Into::into),
        }
    }

    /// The reading as an event stream sends it whole (`snapshot`), as a reader with `view` may see it, as
    /// SSE `data:` lines: for the whole view and for readers the serve cannot name, formatted once and shared
    /// (a clone is a reference); per reader otherwise.
    pub fn sse_as(&self, view: View) -> bytes::Bytes {
        let sse_data = |s: Cow<'_, HostSnapshot>| {
            let j = serde_json::to_string(&without_counters(s)).unwrap_or_default();
            super::frame::sse_body(crate::core::sse::Kind::Snapshot, &j)
        };
        // A redacted reading is already a copy: its counters are taken out of it in place.
        match view {
            View::Whole => self
                .sse
                .get_or_init(|| sse_data(Cow::Borrowed(&self.snap)))
                .clone(),
            View::NoOthers => self
                .sse_no_others
                .get_or_init(|| redact(&self.snap, view).map(|s| sse_data(Cow::Owned(s))))
                .clone()
                .unwrap_or_else(|| self.sse_as(View::Whole)),
            View::Own(_) => redact(&self.snap, view)
                .map_or_else(|| self.sse_as(View::Whole), |s| sse_data(Cow::Owned(s))),
        }
    }
}

/// A reading as an event stream carries it: without its GPUs' dcgm counters. They move at every reading,
/// and the stream's later readings (`unchanged`, `memory`) leave them out, so a client would show the
/// first reading's as current while they aged (gpusweep's dropped them on arrival: a third of each
/// whole reading it parsed); the serve's `/metrics` has them.
fn without_counters(mut s: Cow<'_, HostSnapshot>) -> Cow<'_, HostSnapshot> {
    if s.gpus.iter().any(|g| g.counters.is_some()) {
        for g in &mut s.to_mut().gpus {
            g.counters = None;
        }
    }
    s
}

/// How a serve was started: read-only, whether it reads NVML, and the fleet key it seals with.
#[derive(Debug, Clone)]
pub struct Modes {
    pub readonly: bool,
    pub expect_gpus: bool,
    /// What HTTP readers may see of other users' processes.
    pub http_view: View,
    /// The fleet's key (`--seal-key`): each host's summary on /metrics carries its seal.
    pub seal: Option<Arc<crate::core::seal::SealKey>>,
}

/// What a reader of one host follows.
pub struct HostChannel {
    pub label: String,
    pub latest: watch::Receiver<Option<Arc<Reading>>>,
    pub status: watch::Receiver<ConnStatus>,
    /// Events of this host, as JSON (`core::event::Event`).
    pub events: broadcast::Sender<Arc<Logged>>,
}

/// An action a privileged client asks the loop that owns the fleet to carry out (through the same delivery
/// as every kill); the answer comes back.
#[derive(Debug)]
pub struct ActAsk {
    pub host: usize,
    pub req: ActionRequest,
    pub reply: oneshot::Sender<ActionAnswer>,
}

/// What clients want of the polling, kept as state, not sent as messages: any number of asks changes a few
/// values and fills no queue, so a flood of polls from one client never keeps another's action or a
/// stream's goodbye from the loop.
#[derive(Default)]
pub struct Wants {
    pending: Mutex<Pending>,
    changed: Notify,
}

#[derive(Default)]
struct Pending {
    /// Interval asked for, per host, by client.
    intervals: HashMap<usize, HashMap<u64, Duration>>,
    /// Hosts whose intervals changed since the loop last looked.
    dirty: HashSet<usize>,
    /// Hosts to read now, and whether a privileged client asked.
    polls: HashMap<usize, bool>,
}

impl Wants {
    /// Poll `host` at least this often while `client` is connected (`None`: it left).
    pub fn interval(&self, host: usize, client: u64, every: Option<Duration>) {
        if let Ok(mut p) = self.pending.lock() {
            let of_host = p.intervals.entry(host).or_default();
            match every {
                Some(d) => of_host.insert(client, d),
                None => of_host.remove(&client),
            };
            if of_host.is_empty() {
                p.intervals.remove(&host);
            }
            p.dirty.insert(host);
        }
        self.changed.notify_one();
    }

    /// A reading of `host` now. An unprivileged client's ask is taken at most once per
    /// `MIN_UNPRIVILEGED_POLL` for all of them together (more would be a flood any local user could start).
    pub fn poll_now(&self, host: usize, privileged: bool) {
        if let Ok(mut p) = self.pending.lock() {
            *p.polls.entry(host).or_default() |= privileged;
        }
        self.changed.notify_one();
    }

    /// The fastest interval asked for `host` now, if any.
    fn fastest(&self, host: usize) -> Option<Duration> {
        let p = self.pending.lock().ok()?;
        p.intervals.get(&host)?.values().min().copied()
    }

    /// What changed since the last call.
    fn take(&self) -> Changes {
        let Ok(mut p) = self.pending.lock() else {
            return Changes::default();
        };
        let dirty: Vec<usize> = p.dirty.drain().collect();
        let intervals = dirty
            .into_iter()
            .map(|h| {
                let fastest = p.intervals.get(&h).and_then(|c| c.values().min().copied());
                (h, fastest)
            })
            .collect();
        Changes {
            intervals,
            polls: p.polls.drain().collect(),
        }
    }
}

/// Until `at`, or forever.
async fn wait_until(at: Option<std::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// What clients' wants changed since the loop last looked.
#[derive(Default)]
struct Changes {
    /// (host, the fastest interval asked, `None` when none is) for each host whose asks changed.
    intervals: Vec<(usize, Option<Duration>)>,
    /// Hosts to read now, and whether a privileged client asked.
    polls: Vec<(usize, bool)>,
}

/// Everything the readers share.
pub struct Shared {
    pub hosts: Vec<HostChannel>,
    /// Host indices as their readings arrive, for readers of several hosts at once.
    pub readings: broadcast::Sender<usize>,
    /// Every host's events, for readers of several hosts at once.
    pub all_events: broadcast::Sender<Arc<Logged>>,
    /// The last events, for streams that reconnect.
    pub journal: Mutex<Journal>,
    /// Actions of privileged clients, to the loop.
    pub act: mpsc::Sender<ActAsk>,
    /// What clients want of the polling.
    pub wants: Wants,
    /// Event streams that ended: the serve gives memory back after them.
    pub streams_ended: Arc<super::memory::Ended>,
    /// Per host, by index.
    pub stats: Vec<HostStats>,
    /// The poll interval when no client asks for a faster one.
    pub interval: Duration,
    /// `https` when serving TLS: how a client that reads Prometheus reaches this serve.
    pub scheme: &'static str,
    /// No signal or removal, even from the socket's privileged peers.
    pub readonly: bool,
    /// NVML is read (not `--no-nvml`): a host none of whose GPUs can be read is unhealthy.
    pub expect_gpus: bool,
    /// What HTTP readers may see of other users' processes: all but PID and memory hidden when the node's
    /// `/proc` hides them and no token names who reads.
    pub http_view: View,
    /// The Kubernetes node writer's state, when `--kube-node` runs one.
    pub kube: OnceLock<Arc<super::kube::KubeStatus>>,
    /// The fleet's key: each host's summary on /metrics is sealed with it (`core::seal`).
    pub seal: Option<Arc<crate::core::seal::SealKey>>,
    next_client: AtomicU64,
    /// Host indices by label: a client naming thousands of hosts is answered without a scan per name.
    by_label: HashMap<String, usize>,
}

impl Shared {
    pub fn host_index(&self, label: &str) -> Option<usize> {
        self.by_label.get(label).copied()
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
    interval: Duration,
    /// When its interval was last changed: clients may ask for changes at any rate, the host gets one
    /// per `MIN_INTERVAL_CHANGE` (each is a command in its queue, where kills wait too).
    changed_at: Option<std::time::Instant>,
}

/// The most often a host's polling interval is changed, whatever clients ask.
const MIN_INTERVAL_CHANGE: Duration = Duration::from_secs(1);

/// Whether an interval change asked now may go to the host, or when it may.
fn pace(
    changed_at: Option<std::time::Instant>,
    now: std::time::Instant,
) -> Option<std::time::Instant> {
    changed_at
        .map(|t| t + MIN_INTERVAL_CHANGE)
        .filter(|next| *next > now)
}

pub struct Hub {
    shared: Arc<Shared>,
    writers: Vec<Writer>,
    acts: mpsc::Receiver<ActAsk>,
    next_id: u64,
    replies: HashMap<u64, oneshot::Sender<ActionAnswer>>,
    /// When an unprivileged client's poll was last taken.
    last_unprivileged_poll: Option<std::time::Instant>,
    /// Hosts whose interval change waits for its pace, and when the first may go.
    deferred: HashSet<usize>,
    recheck: Option<std::time::Instant>,
}

/// The most often unprivileged clients, all together, may have a host read now.
pub const MIN_UNPRIVILEGED_POLL: Duration = Duration::from_millis(100);

impl Hub {
    pub fn new(
        labels: &[String],
        interval: Duration,
        scheme: &'static str,
        modes: Modes,
        replay: usize,
    ) -> Hub {
        let Modes {
            readonly,
            expect_gpus,
            http_view,
            seal,
        } = modes;
        let (act, acts) = mpsc::channel(1024);
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
                interval,
                changed_at: None,
            });
        }
        let shared = Arc::new(Shared {
            hosts,
            readings: broadcast::channel(EVENT_BACKLOG.max(labels.len() * 2)).0,
            all_events: broadcast::channel(EVENT_BACKLOG).0,
            journal: Mutex::new(Journal::new(replay)),
            act,
            wants: Wants::default(),
            streams_ended: Arc::default(),
            stats: labels
                .iter()
                .map(|_| HostStats {
                    after_signal: histogram(),
                    after_exit: histogram(),
                    warmup: Histogram::new(WARMUP_BUCKETS),
                    lost_ranks: prometheus_client::metrics::counter::Counter::default(),
                })
                .collect(),
            interval,
            scheme,
            readonly,
            expect_gpus,
            http_view,
            kube: OnceLock::new(),
            seal,
            next_client: AtomicU64::new(1),
            // The first of a label wins, as a scan would find it.
            by_label: labels
                .iter()
                .enumerate()
                .rev()
                .map(|(i, l)| (l.clone(), i))
                .collect(),
        });
        Hub {
            shared,
            writers,
            acts,
            next_id: 1,
            replies: HashMap::new(),
            last_unprivileged_poll: None,
            deferred: HashSet::new(),
            recheck: None,
        }
    }

    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Own the fleet: take every reading and every client's request, until the fleet or every client
    /// handle is gone.
    pub async fn run(mut self, mut fleet: Fleet) {
        let shared = self.shared.clone();
        let wants = &shared.wants;
        loop {
            tokio::select! {
                ev = fleet.recv() => match ev {
                    Some(ev) => self.on_event(ev, &fleet),
                    None => return,
                },
                ask = self.acts.recv() => match ask {
                    Some(ask) => self.on_act(&fleet, ask),
                    None => return,
                },
                () = wants.changed.notified() => self.on_wants(&fleet),
                () = wait_until(self.recheck) => {
                    self.recheck = None;
                    let hosts: Vec<usize> = self.deferred.drain().collect();
                    for host in hosts {
                        self.set_interval(&fleet, host, wants.fastest(host));
                    }
                }
            }
        }
    }

    fn on_event(&mut self, ev: HostEvent, fleet: &Fleet) {
        match ev {
            // Whether it may go as memory alone is the ledger's word (`Judged::memory_from`); a stream sends
            // it so only where the reading it moves from is the last it sent.
            HostEvent::Update {
                host,
                update: Judgement::New(judged),
            } => self.publish(host.0, Reading::of(*judged)),
            // The serve's fleet hands every reading on whole (it reads this host or demo hosts, never memory
            // alone from another serve); were memory alone to come, the ledger's whole reading goes out.
            HostEvent::Update {
                host,
                update: Judgement::Memory(_),
            } => {
                if let Some(j) = fleet.latest(host) {
                    self.publish(host.0, Reading::of(j));
                }
            }
            HostEvent::Update {
                host,
                update:
                    Judgement::Same {
                        taken_at_ms,
                        gauges,
                    },
            } => {
                // Said the same: the reading kept, with its new time and gauges (/healthz reads the time).
                let Some(mut r) = self.writers.get(host.0).and_then(|w| {
                    w.latest.borrow().as_ref().map(|r| Reading {
                        snap: r.snap.clone(),
                        content: r.content,
                        memory_from: r.memory_from,
                        figures_from: r.figures_from,
                        json: OnceLock::new(),
                        json_no_others: OnceLock::new(),
                        sse: OnceLock::new(),
                        sse_no_others: OnceLock::new(),
                    })
                }) else {
                    return;
                };
                Arc::make_mut(&mut r.snap).refresh_said(taken_at_ms, &gauges);
                self.publish(host.0, r);
            }
            HostEvent::Status { host, status } => {
                if let Some(w) = self.writers.get(host.0) {
                    w.status.send_replace(status);
                }
            }
            HostEvent::Events { host, events } => self.on_events(host.0, &events),
            HostEvent::Answer { id, answer, .. } => {
                if let Some(reply) = self.replies.remove(&id) {
                    let _ = reply.send(answer);
                }
            }
        }
    }

    fn publish(&mut self, i: usize, reading: Reading) {
        let Some(w) = self.writers.get(i) else {
            return;
        };
        w.latest.send_replace(Some(Arc::new(reading)));
        if !matches!(*w.status.borrow(), ConnStatus::Up) {
            w.status.send_replace(ConnStatus::Up);
        }
        let _ = self.shared.readings.send(i);
    }

    /// A host's events: to the event streams as they are, and a GPU turning clean into the histogram.
    fn on_events(&self, i: usize, events: &[Event]) {
        let Some(ch) = self.shared.hosts.get(i) else {
            return;
        };
        for e in events {
            if let Some(h) = self.shared.stats.get(i) {
                match &e.what {
                    EventKind::GpuClean {
                        after_ms,
                        after_exit_ms,
                        ..
                    } => match (after_ms, after_exit_ms) {
                        (Some(ms), _) => h.after_signal.observe(*ms as f64 / 1000.0),
                        (None, Some(ms)) => h.after_exit.observe(*ms as f64 / 1000.0),
                        (None, None) => {}
                    },
                    EventKind::JobPhase {
                        warmup_ms: Some(ms),
                        ..
                    } => h.warmup.observe(*ms as f64 / 1000.0),
                    EventKind::RankLost { .. } => {
                        h.lost_ranks.inc();
                    }
                    _ => {}
                }
            }
            // Events go only to HTTP streams: as HTTP readers may see them.
            // Kept in the journal first, then sent: a stream that subscribes in between finds it in both
            // and keeps one (by its sequence number).
            if let Ok(json) =
                serde_json::to_string(redact::event(e, self.shared.http_view).as_ref())
                && let Ok(mut journal) = self.shared.journal.lock()
            {
                let logged = journal.push(i, &json);
                drop(journal);
                let _ = ch.events.send(logged.clone());
                let _ = self.shared.all_events.send(logged);
            }
        }
    }

    fn on_wants(&mut self, fleet: &Fleet) {
        let Changes { intervals, polls } = self.shared.wants.take();
        for (host, fastest) in intervals {
            self.set_interval(fleet, host, fastest);
        }
        let now = std::time::Instant::now();
        let unprivileged_ok = self
            .last_unprivileged_poll
            .is_none_or(|t| now.duration_since(t) >= MIN_UNPRIVILEGED_POLL);
        let mut took_unprivileged = false;
        for (host, privileged) in polls {
            if privileged || unprivileged_ok {
                took_unprivileged |= !privileged;
                fleet.send(HostId(host), HostCmd::PollNow);
            }
        }
        if took_unprivileged {
            self.last_unprivileged_poll = Some(now);
        }
    }

    /// The host's interval as the fastest ask wants it, at most one change per `MIN_INTERVAL_CHANGE` (a
    /// change asked sooner waits, and is taken as the asks stand then).
    fn set_interval(&mut self, fleet: &Fleet, host: usize, fastest: Option<Duration>) {
        let base = self.shared.interval;
        let Some(w) = self.writers.get_mut(host) else {
            return;
        };
        let want = fastest.map_or(base, |d| d.min(base));
        if want == w.interval {
            return;
        }
        let now = std::time::Instant::now();
        if let Some(next) = pace(w.changed_at, now) {
            self.deferred.insert(host);
            self.recheck = Some(self.recheck.map_or(next, |r| r.min(next)));
            return;
        }
        w.interval = want;
        w.changed_at = Some(now);
        fleet.send(HostId(host), HostCmd::Interval(want));
    }

    fn on_act(&mut self, fleet: &Fleet, ask: ActAsk) {
        let ActAsk { host, req, reply } = ask;
        let id = self.next_id;
        self.next_id += 1;
        self.replies.insert(id, reply);
        fleet.send(HostId(host), HostCmd::Act { id, req });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hosts_interval_changes_at_most_once_a_second_whatever_clients_ask() {
        let t0 = std::time::Instant::now();
        assert_eq!(pace(None, t0), None, "the first change goes at once");
        let mut changed_at = Some(t0);
        let mut sent = 1;
        // A thousand asks over two seconds, as a client toggling its interval sends them.
        for i in 1..=1000u64 {
            let now = t0 + Duration::from_millis(i * 2);
            if pace(changed_at, now).is_none() {
                changed_at = Some(now);
                sent += 1;
            }
        }
        assert_eq!(sent, 3, "at 0 s, 1 s and 2 s");
        assert_eq!(
            pace(Some(t0), t0 + Duration::from_millis(300)),
            Some(t0 + MIN_INTERVAL_CHANGE)
        );
    }
}
