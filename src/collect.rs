//! One collector per host, all feeding one event channel. A host that is slow, down or sending garbage only
//! ever delays its own events: the UI and `wait` read the channel and never block on a host.
//!
//! Local and demo hosts run on their own threads (NVML and /proc reads are blocking and cheap); remote hosts
//! are tokio tasks. Signals on the local host run on a thread of their own, so a grace period never pauses
//! the readings a re-watch needs.

use std::sync::Arc;
use std::sync::mpsc as smpsc;
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc};

use crate::analyze::{AnalyzeOptions, analyzed};
use crate::hosts::HostSpec;
use crate::model::HostSnapshot;
use crate::source::demo::{DemoClock, DemoHost};
use crate::source::procfs::ProcfsConfig;
use crate::source::{LocalSource, Source, agent_client, ssh};
use crate::sweep::{AuditLog, Outcome, SignalRequest};

#[derive(Debug, Clone, PartialEq)]
pub enum HostCmd {
    Signal { id: u64, req: SignalRequest },
    Interval(Duration),
    PollNow,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ConnStatus {
    Connecting,
    Up,
    /// Down with this reason; the collector retries with backoff.
    Down(String),
}

#[derive(Debug, Clone)]
pub enum HostEvent {
    Snapshot {
        host: usize,
        snap: Box<HostSnapshot>,
    },
    Status {
        host: usize,
        status: ConnStatus,
    },
    Outcomes {
        host: usize,
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
    pub ssh: ssh::SshOptions,
    pub demo_clock: DemoClock,
}

enum Handle {
    Thread(smpsc::Sender<HostCmd>),
    Task(mpsc::UnboundedSender<HostCmd>),
}

pub struct Fleet {
    pub labels: Vec<String>,
    handles: Vec<Handle>,
    pub events: mpsc::UnboundedReceiver<HostEvent>,
}

impl Fleet {
    /// Start a collector per host. Must be called inside a tokio runtime when any host is remote.
    pub fn start(specs: &[HostSpec], opts: &FleetOptions) -> anyhow::Result<Fleet> {
        let (tx, events) = mpsc::unbounded_channel();
        let mut handles = Vec::new();
        let mut labels = Vec::new();
        let connect_limit = Arc::new(Semaphore::new(opts.ssh.max_connections.max(1)));
        for (i, spec) in specs.iter().enumerate() {
            labels.push(spec.label());
            match spec {
                HostSpec::Local => {
                    let src = LocalSource::new(
                        spec.label(),
                        opts.procfs.clone(),
                        opts.audit.clone(),
                        opts.load_nvml,
                    )?;
                    handles.push(Handle::Thread(spawn_thread(
                        i,
                        Box::new(src),
                        tx.clone(),
                        opts,
                    )));
                }
                HostSpec::Demo(name) => {
                    let src = DemoHost::new(name, opts.demo_clock.clone());
                    handles.push(Handle::Thread(spawn_thread(
                        i,
                        Box::new(src),
                        tx.clone(),
                        opts,
                    )));
                }
                HostSpec::Ssh { .. } | HostSpec::Command { .. } => {
                    let (ctx, crx) = mpsc::unbounded_channel();
                    let task = agent_client::RemoteTask {
                        index: i,
                        label: spec.label(),
                        spec: spec.clone(),
                        opts: opts.clone(),
                        events: tx.clone(),
                        connect_limit: connect_limit.clone(),
                    };
                    tokio::spawn(task.run(crx));
                    handles.push(Handle::Task(ctx));
                }
            }
        }
        Ok(Fleet {
            labels,
            handles,
            events,
        })
    }

    pub fn send(&self, host: usize, cmd: HostCmd) {
        match self.handles.get(host) {
            Some(Handle::Thread(t)) => {
                let _ = t.send(cmd);
            }
            Some(Handle::Task(t)) => {
                let _ = t.send(cmd);
            }
            None => {}
        }
    }

    pub fn broadcast(&self, cmd: HostCmd) {
        for i in 0..self.handles.len() {
            self.send(i, cmd.clone());
        }
    }

    pub fn index_of(&self, label: &str) -> Option<usize> {
        self.labels.iter().position(|l| l == label)
    }
}

fn spawn_thread(
    index: usize,
    mut src: Box<dyn Source>,
    tx: mpsc::UnboundedSender<HostEvent>,
    opts: &FleetOptions,
) -> smpsc::Sender<HostCmd> {
    let (ctx, crx) = smpsc::channel::<HostCmd>();
    let mut interval = opts.interval;
    let analyze = opts.analyze;
    let name = format!("host-{index}");
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let _ = tx.send(HostEvent::Status {
            host: index,
            status: ConnStatus::Up,
        });
        loop {
            let ev = match src.poll() {
                Ok(s) => HostEvent::Snapshot {
                    host: index,
                    snap: Box::new(analyzed(s, &analyze)),
                },
                Err(e) => HostEvent::Status {
                    host: index,
                    status: ConnStatus::Down(format!("{e:#}")),
                },
            };
            if tx.send(ev).is_err() {
                return;
            }
            let mut next = Instant::now() + interval;
            loop {
                let wait = next.saturating_duration_since(Instant::now());
                match crx.recv_timeout(wait) {
                    Ok(HostCmd::PollNow) => break,
                    Ok(HostCmd::Interval(d)) => {
                        interval = d;
                        next = next.min(Instant::now() + d);
                    }
                    Ok(HostCmd::Signal { id, req }) => {
                        if let Some(d) = src.deliverer() {
                            let tx = tx.clone();
                            std::thread::spawn(move || {
                                let outcomes = d.deliver(&req);
                                let _ = tx.send(HostEvent::Outcomes {
                                    host: index,
                                    id,
                                    outcomes,
                                });
                            });
                        } else {
                            let outcomes = src.signal(&req);
                            let _ = tx.send(HostEvent::Outcomes {
                                host: index,
                                id,
                                outcomes,
                            });
                        }
                        break;
                    }
                    Err(smpsc::RecvTimeoutError::Timeout) => break,
                    Err(smpsc::RecvTimeoutError::Disconnected) => return,
                }
            }
        }
    });
    if let Err(e) = spawned {
        let _ = ctx.send(HostCmd::PollNow);
        eprintln!("gpusweep: cannot start a collector thread: {e}");
    }
    ctx
}
