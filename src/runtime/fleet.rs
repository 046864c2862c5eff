//! One collector per host, all feeding one event channel, keyed by `HostId`. A host that is slow, down or
//! sending garbage only ever delays its own events: front ends read the channel and never block on a host.
//!
//! Local and demo hosts run the poll loop on threads of their own (NVML and /proc reads are blocking and
//! cheap); remote hosts are tokio tasks. Every reading is analyzed here, once, with the operator's options.

use std::sync::mpsc as smpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};

use super::poll;
use crate::act::{AuditLog, Deliverer};
use crate::analyze::{AnalyzeOptions, analyzed};
use crate::core::host::{HostSpec, unique_labels};
use crate::core::model::{HostId, HostSnapshot};
use crate::core::removal::RemovalOutcome;
use crate::core::signal::{Outcome, Protected, all_failed};
use crate::source::demo::{DemoClock, DemoHost};
use crate::source::local::LocalSource;
use crate::source::local::procfs::ProcfsConfig;
use crate::source::remote::{RemoteOptions, RemoteTask, ssh::SshOptions};
use crate::source::{ConnStatus, HostCmd, Sink, Source};

#[derive(Debug, Clone)]
pub enum HostEvent {
    Snapshot {
        host: HostId,
        snap: Box<HostSnapshot>,
    },
    Status {
        host: HostId,
        status: ConnStatus,
    },
    Outcomes {
        host: HostId,
        id: u64,
        outcomes: Vec<Outcome>,
    },
    Removals {
        host: HostId,
        id: u64,
        outcomes: Vec<RemovalOutcome>,
    },
}

#[derive(Debug, Clone)]
pub struct FleetOptions {
    pub interval: Duration,
    pub analyze: AnalyzeOptions,
    pub procfs: ProcfsConfig,
    pub load_nvml: bool,
    pub audit: AuditLog,
    /// Signal with kill(2) after a start-time check where this host has no pidfd (opt-in).
    pub kill_without_pidfd: bool,
    pub ssh: SshOptions,
    pub demo_clock: DemoClock,
}

/// Commands queued for one host at most; past that a host is busy and further commands are answered at once.
pub const CMD_QUEUE: usize = 64;

/// What travels on the event channel. A reading is not in it: it waits in its host's slot, so a host that
/// sends faster than a front end reads costs one snapshot of memory, not a queue of them.
enum Wire {
    /// The host's slot went from empty to full.
    Reading(HostId),
    Status(HostId, ConnStatus),
    Outcomes(HostId, u64, Vec<Outcome>),
    Removals(HostId, u64, Vec<RemovalOutcome>),
}

/// The latest unread reading of one host.
type Slot = Arc<Mutex<Option<Box<HostSnapshot>>>>;

/// The runtime's side of a source: stamps the host's identity and label, analyzes, forwards.
struct FleetSink {
    host: HostId,
    label: String,
    analyze: AnalyzeOptions,
    slot: Slot,
    tx: mpsc::UnboundedSender<Wire>,
}

impl Sink for FleetSink {
    fn reading(&self, mut snap: HostSnapshot) -> bool {
        snap.host.clone_from(&self.label);
        let snap = Box::new(analyzed(snap, &self.analyze));
        let was_empty = match self.slot.lock() {
            Ok(mut slot) => slot.replace(snap).is_none(),
            Err(_) => return false,
        };
        // Only an empty slot needs a wake-up; a full one is replaced and read once.
        !was_empty || self.tx.send(Wire::Reading(self.host)).is_ok()
    }
    fn status(&self, status: ConnStatus) -> bool {
        self.tx.send(Wire::Status(self.host, status)).is_ok()
    }
    fn outcomes(&self, id: u64, outcomes: Vec<Outcome>) -> bool {
        self.tx
            .send(Wire::Outcomes(self.host, id, outcomes))
            .is_ok()
    }
    fn removals(&self, id: u64, outcomes: Vec<RemovalOutcome>) -> bool {
        self.tx
            .send(Wire::Removals(self.host, id, outcomes))
            .is_ok()
    }
}

enum Handle {
    Thread(smpsc::SyncSender<HostCmd>),
    Task(mpsc::Sender<HostCmd>),
}

pub struct Fleet {
    specs: Vec<HostSpec>,
    labels: Vec<String>,
    handles: Vec<Handle>,
    slots: Vec<Slot>,
    /// Kept to answer, at once, a signal request that a busy host's queue had no room for.
    tx: mpsc::UnboundedSender<Wire>,
    events: mpsc::UnboundedReceiver<Wire>,
}

impl Fleet {
    /// Start a collector per host. Must be called inside a tokio runtime when any host is remote.
    pub fn start(
        specs: &[HostSpec],
        opts: &FleetOptions,
    ) -> Result<Fleet, crate::source::SourceError> {
        let (tx, events) = mpsc::unbounded_channel();
        let labels = unique_labels(specs);
        let connect_limit = Arc::new(Semaphore::new(opts.ssh.max_connections.max(1)));
        let mut handles = Vec::new();
        let mut slots = Vec::new();
        for (i, (spec, label)) in specs.iter().zip(&labels).enumerate() {
            let slot: Slot = Arc::default();
            slots.push(slot.clone());
            let sink: Arc<dyn Sink> = Arc::new(FleetSink {
                host: HostId(i),
                label: label.clone(),
                analyze: opts.analyze,
                slot,
                tx: tx.clone(),
            });
            let handle = match spec {
                HostSpec::Local => {
                    let src = LocalSource::new(label.clone(), opts.procfs.clone(), opts.load_nvml)?;
                    let d = Deliverer {
                        host: label.clone(),
                        audit: opts.audit.clone(),
                        without_pidfd: opts.kill_without_pidfd,
                    };
                    Handle::Thread(spawn_thread(i, Box::new(src), Some(d), sink, opts.interval))
                }
                HostSpec::Demo(name) => {
                    let src = DemoHost::new(name, opts.demo_clock.clone());
                    Handle::Thread(spawn_thread(i, Box::new(src), None, sink, opts.interval))
                }
                HostSpec::Ssh { .. } | HostSpec::Command { .. } => {
                    let (ctx, crx) = mpsc::channel(CMD_QUEUE);
                    let task = RemoteTask {
                        label: label.clone(),
                        spec: spec.clone(),
                        opts: RemoteOptions {
                            interval: opts.interval,
                            ssh: opts.ssh.clone(),
                            benign: opts.procfs.benign.clone(),
                        },
                        sink,
                        connect_limit: connect_limit.clone(),
                    };
                    tokio::spawn(task.run(crx));
                    Handle::Task(ctx)
                }
            };
            handles.push(handle);
        }
        Ok(Fleet {
            specs: specs.to_vec(),
            labels,
            handles,
            slots,
            tx,
            events,
        })
    }

    /// The next event of any host; `None` once every collector is gone.
    pub async fn recv(&mut self) -> Option<HostEvent> {
        loop {
            let w = self.events.recv().await?;
            if let Some(ev) = self.event(w) {
                return Some(ev);
            }
        }
    }

    /// The next event already there, without waiting.
    pub fn try_recv(&mut self) -> Option<HostEvent> {
        loop {
            let w = self.events.try_recv().ok()?;
            if let Some(ev) = self.event(w) {
                return Some(ev);
            }
        }
    }

    fn event(&self, w: Wire) -> Option<HostEvent> {
        Some(match w {
            Wire::Reading(host) => {
                let snap = self.slots.get(host.0)?.lock().ok()?.take()?;
                HostEvent::Snapshot { host, snap }
            }
            Wire::Status(host, status) => HostEvent::Status { host, status },
            Wire::Outcomes(host, id, outcomes) => HostEvent::Outcomes { host, id, outcomes },
            Wire::Removals(host, id, outcomes) => HostEvent::Removals { host, id, outcomes },
        })
    }

    /// Queue a command for one host. A full queue (a host that stopped answering) drops polls and interval
    /// changes, which the next one supersedes, and answers a signal request at once: never left hanging.
    pub fn send(&self, host: HostId, cmd: HostCmd) {
        let refused = match self.handles.get(host.0) {
            Some(Handle::Thread(t)) => match t.try_send(cmd) {
                Ok(()) => None,
                Err(smpsc::TrySendError::Full(c) | smpsc::TrySendError::Disconnected(c)) => Some(c),
            },
            Some(Handle::Task(t)) => match t.try_send(cmd) {
                Ok(()) => None,
                Err(mpsc::error::TrySendError::Full(c) | mpsc::error::TrySendError::Closed(c)) => {
                    Some(c)
                }
            },
            None => Some(cmd),
        };
        let why = "host busy: its command queue is full";
        match refused {
            Some(HostCmd::Signal { id, req }) => {
                let _ = self
                    .tx
                    .send(Wire::Outcomes(host, id, all_failed(&req, why)));
            }
            Some(HostCmd::Remove { id, req }) => {
                let outcomes = crate::core::removal::all_failed(&req, why);
                let _ = self.tx.send(Wire::Removals(host, id, outcomes));
            }
            _ => {}
        }
    }

    pub fn broadcast(&self, cmd: &HostCmd) {
        for i in self.ids() {
            self.send(i, cmd.clone());
        }
    }

    pub fn ids(&self) -> impl Iterator<Item = HostId> + use<> {
        (0..self.handles.len()).map(HostId)
    }

    pub fn len(&self) -> usize {
        self.handles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// The host's label, unique in this fleet.
    pub fn label(&self, host: HostId) -> &str {
        self.labels.get(host.0).map_or("?", String::as_str)
    }

    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// (id, label) of every host, for a watch.
    pub fn expected(&self) -> Vec<(HostId, String)> {
        self.ids().map(|i| (i, self.label(i).to_string())).collect()
    }

    pub fn spec(&self, host: HostId) -> Option<&HostSpec> {
        self.specs.get(host.0)
    }

    /// The PIDs never offered for signals on this host.
    pub fn protected(&self, host: HostId) -> Protected {
        protected_for(self.spec(host))
    }
}

/// The protection rule for a host of this spec: this host knows its own ancestry; others are guarded by
/// their agents.
pub fn protected_for(spec: Option<&HostSpec>) -> Protected {
    if spec == Some(&HostSpec::Local) {
        crate::act::protect::this_host()
    } else {
        Protected::remote()
    }
}

/// Find a host by the spec as typed or by its label.
pub fn find_host(specs: &[HostSpec], labels: &[String], query: &str) -> Option<HostId> {
    specs
        .iter()
        .zip(labels)
        .position(|(s, l)| s.answers_to(query, l))
        .map(HostId)
}

fn spawn_thread(
    index: usize,
    src: Box<dyn Source>,
    signals: Option<Deliverer>,
    sink: Arc<dyn Sink>,
    interval: Duration,
) -> smpsc::SyncSender<HostCmd> {
    let (ctx, crx) = smpsc::sync_channel::<HostCmd>(CMD_QUEUE);
    let spawned = std::thread::Builder::new()
        .name(format!("host-{index}"))
        .spawn(move || poll::run(src, signals.as_ref(), &sink, &crx, interval));
    if let Err(e) = spawned {
        eprintln!("gpusweep: cannot start a collector thread: {e}");
    }
    ctx
}
