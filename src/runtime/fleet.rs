//! One collector per host, all feeding one event channel, keyed by `HostId`. A host that is slow, down or
//! sending garbage only ever delays its own events: front ends read the channel and never block on a host.
//!
//! Local and demo hosts run the poll loop on threads of their own (NVML and /proc reads are blocking and
//! cheap); remote hosts are tokio tasks. Every reading is analyzed here, once, with the operator's options.

use std::sync::Arc;
use std::sync::mpsc as smpsc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};

use super::poll;
use crate::act::{AuditLog, Deliverer};
use crate::analyze::{AnalyzeOptions, analyzed};
use crate::core::host::{HostSpec, unique_labels};
use crate::core::model::{HostId, HostSnapshot};
use crate::core::signal::{Outcome, Protected};
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
}

#[derive(Debug, Clone)]
pub struct FleetOptions {
    pub interval: Duration,
    pub analyze: AnalyzeOptions,
    pub procfs: ProcfsConfig,
    pub load_nvml: bool,
    pub audit: AuditLog,
    pub ssh: SshOptions,
    pub demo_clock: DemoClock,
}

/// The runtime's side of a source: stamps the host's identity and label, analyzes, forwards.
struct FleetSink {
    host: HostId,
    label: String,
    analyze: AnalyzeOptions,
    tx: mpsc::UnboundedSender<HostEvent>,
}

impl Sink for FleetSink {
    fn reading(&self, mut snap: HostSnapshot) -> bool {
        snap.host.clone_from(&self.label);
        let snap = analyzed(snap, &self.analyze);
        self.tx
            .send(HostEvent::Snapshot {
                host: self.host,
                snap: Box::new(snap),
            })
            .is_ok()
    }
    fn status(&self, status: ConnStatus) -> bool {
        self.tx
            .send(HostEvent::Status {
                host: self.host,
                status,
            })
            .is_ok()
    }
    fn outcomes(&self, id: u64, outcomes: Vec<Outcome>) -> bool {
        self.tx
            .send(HostEvent::Outcomes {
                host: self.host,
                id,
                outcomes,
            })
            .is_ok()
    }
}

enum Handle {
    Thread(smpsc::Sender<HostCmd>),
    Task(mpsc::UnboundedSender<HostCmd>),
}

pub struct Fleet {
    specs: Vec<HostSpec>,
    labels: Vec<String>,
    handles: Vec<Handle>,
    pub events: mpsc::UnboundedReceiver<HostEvent>,
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
        for (i, (spec, label)) in specs.iter().zip(&labels).enumerate() {
            let sink: Arc<dyn Sink> = Arc::new(FleetSink {
                host: HostId(i),
                label: label.clone(),
                analyze: opts.analyze,
                tx: tx.clone(),
            });
            let handle = match spec {
                HostSpec::Local => {
                    let src = LocalSource::new(label.clone(), opts.procfs.clone(), opts.load_nvml)?;
                    let d = Deliverer {
                        host: label.clone(),
                        audit: opts.audit.clone(),
                    };
                    Handle::Thread(spawn_thread(i, Box::new(src), Some(d), sink, opts.interval))
                }
                HostSpec::Demo(name) => {
                    let src = DemoHost::new(name, opts.demo_clock.clone());
                    Handle::Thread(spawn_thread(i, Box::new(src), None, sink, opts.interval))
                }
                HostSpec::Ssh { .. } | HostSpec::Command { .. } => {
                    let (ctx, crx) = mpsc::unbounded_channel();
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
            events,
        })
    }

    pub fn send(&self, host: HostId, cmd: HostCmd) {
        match self.handles.get(host.0) {
            Some(Handle::Thread(t)) => {
                let _ = t.send(cmd);
            }
            Some(Handle::Task(t)) => {
                let _ = t.send(cmd);
            }
            None => {}
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
) -> smpsc::Sender<HostCmd> {
    let (ctx, crx) = smpsc::channel::<HostCmd>();
    let spawned = std::thread::Builder::new()
        .name(format!("host-{index}"))
        .spawn(move || poll::run(src, signals.as_ref(), &sink, &crx, interval));
    if let Err(e) = spawned {
        eprintln!("gpusweep: cannot start a collector thread: {e}");
    }
    ctx
}
