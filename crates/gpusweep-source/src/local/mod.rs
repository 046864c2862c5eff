//! This host: NVML (when a driver exists), /proc and /dev/shm, joined into one snapshot.

pub mod acts;
pub mod cgroups;
pub mod early;
pub mod exits;
pub mod nvml;
pub mod pod_shm;
pub mod procfs;
pub mod tasks;
pub mod watchdog;
pub mod xid;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use super::{Source, SourceError};
use gpusweep_core::model::{Gpu, Holder, HostSnapshot, SourceKind, now_ms};
use gpusweep_core::trace;
use procfs::{Depth, ProcScanner, ProcTable, ProcfsConfig};

/// NVML once loaded: its GPUs behind the watchdog.
struct Nvml {
    gpus: watchdog::Guarded,
    driver_version: Option<String>,
}

/// This host: NVML (when a driver exists) plus /proc.
pub struct LocalSource {
    host: String,
    nvml: Result<Nvml, String>,
    /// NVML is loaded on a thread of its own (about 10 ms on a real H200) while the first /proc scan runs.
    /// A load that does not finish within the deadline (a wedged driver) is waited for again at each poll.
    loader: Option<early::Loading>,
    deadline: Duration,
    scanner: ProcScanner,
    /// Every process as last read: each poll reads only what may have changed.
    table: ProcTable,
    /// When the list of processes was last read.
    listed_at: Option<Instant>,
    /// What was unexplained at the last full scan: a change of it asks for another one early.
    unexplained_at_full: Vec<(u32, Vec<u32>, bool)>,
    /// The pidfds of the GPU processes, waited on by a thread of their own (set up by `watch`).
    exits: Option<exits::ExitWatch>,
    /// The GPU processes of the last reading: PID -> (start time, GPUs).
    gpu_procs: HashMap<u32, (u64, Vec<u32>)>,
    /// GPUs whose holder died and whose memory is still being released, read every few ms until it settles.
    drain: Option<Drain>,
    self_pid: u32,
    in_child_ns: bool,
    /// The `/proc` read hides other users' processes from this reader (`hidepid`).
    others_hidden: bool,
    /// How much of each GPU is read.
    readout: nvml::Readout,
}

impl LocalSource {
    /// `load_nvml: false` never touches the driver (tests, and hosts where only holders matter);
    /// `Readout::Verdict` reads only what the verdict needs (memory, processes, identity).
    pub fn new(
        host: String,
        procfs: ProcfsConfig,
        load_nvml: bool,
        readout: nvml::Readout,
    ) -> Result<Self, SourceError> {
        // A load started early is for a one-shot reader (never the counters).
        let gauges = readout == nvml::Readout::Gauges;
        let early = (readout != nvml::Readout::Counters)
            .then(|| early::take(gauges))
            .flatten();
        let in_child_ns = procfs::in_child_pid_namespace(&procfs.proc_root);
        let others_hidden = procfs::others_hidden(&procfs.proc_root);
        Ok(LocalSource {
            host,
            nvml: Err(if load_nvml {
                "NVML loading".into()
            } else {
                "NVML disabled (--no-nvml)".into()
            }),
            loader: load_nvml
                .then(|| early.unwrap_or_else(|| early::spawn(readout, nvml::Life::LivesOn))),
            deadline: watchdog::DEFAULT_DEADLINE,
            scanner: ProcScanner::new(procfs)?,
            table: ProcTable::default(),
            listed_at: None,
            unexplained_at_full: Vec::new(),
            exits: None,
            gpu_procs: HashMap::new(),
            drain: None,
            self_pid: std::process::id(),
            in_child_ns,
            others_hidden,
            readout,
        })
    }
}

impl Source for LocalSource {
    fn host(&self) -> &str {
        &self.host
    }

    fn poll(&mut self) -> Result<HostSnapshot, SourceError> {
        trace(&self.host, "poll");
        // While NVML loads, take the first (full) /proc scan; it walks every process, listed ones included.
        let early = self.loader.is_some();
        if early {
            self.scanner
                .scan(&mut self.table, Depth::Full, &HashSet::new());
            self.listed_at = Some(Instant::now());
        }
        self.finish_loading();
        let (gpus, gpu_error, driver_version) = match &mut self.nvml {
            Ok(n) => (n.gpus.read(), None, n.driver_version.clone()),
            Err(e) => (Vec::new(), Some(e.clone()), None),
        };
        trace(&self.host, "GPUs read");
        let listed: HashSet<u32> = gpus
            .iter()
            .flat_map(|g| g.processes.iter().map(|p| p.pid))
            .collect();
        if early {
            // /proc was read before NVML (it was loading): a process that opened its GPU in between is listed
            // without its device seen. Its fds, looked at again, say whether it holds the GPU or is a ghost.
            self.scanner.recheck_listed(&mut self.table, &listed);
        } else {
            // Judged by holders alone (no GPU readable), every poll must know every process.
            let depth = match self.depth() {
                Depth::Known if gpus.iter().all(|g| g.memory.used.is_none()) => Depth::Listing,
                d => d,
            };
            self.scanner.scan(&mut self.table, depth, &listed);
            if depth != Depth::Known {
                self.listed_at = Some(Instant::now());
            }
        }
        // Memory without a live owner, other than at the last full scan: look at every process now rather than
        // at the next full scan.
        let unexplained = unexplained(&gpus, &self.table);
        let gap = self.scanner.config().min_full_scan_gap;
        if !self.table.full
            && unexplained != self.unexplained_at_full
            && self.scanner.last_full().is_none_or(|t| t.elapsed() >= gap)
        {
            self.scanner.scan(&mut self.table, Depth::Full, &listed);
        }
        if self.table.full {
            self.unexplained_at_full = unexplained;
        }
        let gauges_unread = self.readout == nvml::Readout::Verdict && self.nvml.is_ok();
        let mut snap = build_snapshot(
            &self.host,
            &mut self.scanner,
            &mut self.table,
            gpus,
            gpu_error,
            driver_version,
            self.self_pid,
            self.in_child_ns,
        );
        if gauges_unread {
            snap.missing_features
                .push(gpusweep_core::model::Feature::Gauges);
        }
        if self.others_hidden {
            snap.missing_features
                .push(gpusweep_core::model::Feature::OthersProcesses);
        }
        trace(&self.host, "snapshot built");
        self.follow_exits(&snap);
        Ok(snap)
    }

    fn watch(&mut self, wake: exits::Waker) {
        self.exits = exits::ExitWatch::start(wake);
    }

    fn soon(&self) -> Option<Duration> {
        self.drain.as_ref().map(|d| {
            if d.since.elapsed() < DRAIN_FAST_FOR {
                DRAIN_POLL
            } else {
                DRAIN_SLOW
            }
        })
    }

    fn fresh_shm(&mut self) -> Option<(std::path::PathBuf, gpusweep_core::model::ShmInfo)> {
        Some(self.scanner.shm_now(&mut self.table))
    }
}

/// How often GPUs whose holder died are read while their memory is released (an H200 freed 20 GB 120-260 ms
/// after the SIGKILL): "clean" is told within a few ms of the driver's release.
const DRAIN_POLL: Duration = Duration::from_millis(2);
/// That fast for this long after the last death; then every `DRAIN_SLOW` until `DRAIN_FOR` (a release that
/// slow is rare, and its ghost may never go: a forked child keeping the context).
const DRAIN_FAST_FOR: Duration = Duration::from_secs(1);
const DRAIN_SLOW: Duration = Duration::from_millis(20);
const DRAIN_FOR: Duration = Duration::from_secs(3);

/// GPUs being released after a holder's death: read fast until they read nothing used and nothing listed, or
/// until `DRAIN_FOR` after the last death.
struct Drain {
    since: Instant,
    gpus: Vec<u32>,
}

/// The GPU processes of a reading: non-benign holders and listed PIDs alive in /proc, with their start times
/// and GPUs.
fn gpu_processes(snap: &HostSnapshot) -> HashMap<u32, (u64, Vec<u32>)> {
    let mut out: HashMap<u32, (u64, Vec<u32>)> = HashMap::new();
    let live = |pid: u32| snap.proc(pid).filter(|p| !p.state.is_zombie());
    for h in snap.holders.iter().filter(|h| !h.benign) {
        if let Some(p) = live(h.pid) {
            out.insert(h.pid, (p.start_time, h.gpus.clone()));
        }
    }
    for g in &snap.gpus {
        for l in &g.processes {
            if let Some(p) = live(l.pid) {
                let e = out.entry(l.pid).or_insert((p.start_time, Vec::new()));
                if !e.1.contains(&g.index) {
                    e.1.push(g.index);
                }
            }
        }
    }
    out
}

impl LocalSource {
    /// While NVML loads: wait for it up to the deadline (again at the next poll if a wedged driver holds it).
    fn finish_loading(&mut self) {
        if let Some(rx) = &self.loader {
            trace(&self.host, "first /proc scan done");
            match rx.recv_timeout(self.deadline) {
                Ok(loaded) => {
                    self.nvml = loaded.map(|r| Nvml {
                        driver_version: r.driver_version.clone(),
                        gpus: {
                            let count = r.count;
                            let reader: Arc<dyn watchdog::GpuReader> = Arc::new(r);
                            watchdog::Guarded::new(&reader, count, self.deadline)
                        },
                    });
                    self.loader = None;
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.nvml = Err(format!(
                        "driver not answering: NVML did not finish loading within {} s",
                        self.deadline.as_secs()
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.nvml = Err("NVML loader failed".into());
                    self.loader = None;
                }
            }
            trace(&self.host, "NVML loaded");
        }
    }

    /// After a reading: which GPU processes died since the last one (their GPUs are then read every few ms
    /// until the memory settles), and which to watch from now on.
    fn follow_exits(&mut self, snap: &HostSnapshot) {
        let now = gpu_processes(snap);
        let died: Vec<(u32, Vec<u32>)> = self
            .gpu_procs
            .iter()
            .filter(|(pid, (start, _))| now.get(pid).is_none_or(|(s, _)| s != start))
            .map(|(pid, (_, gpus))| (*pid, gpus.clone()))
            .collect();
        let readable = snap.gpus.iter().any(|g| g.memory.used.is_some());
        if readable && !died.is_empty() {
            let d = self.drain.get_or_insert_with(|| Drain {
                since: Instant::now(),
                gpus: Vec::new(),
            });
            d.since = Instant::now();
            d.gpus.extend(died.into_iter().flat_map(|(_, gpus)| gpus));
            d.gpus.sort_unstable();
            d.gpus.dedup();
        }
        if let Some(d) = &self.drain {
            let released = d.gpus.iter().all(|g| {
                snap.gpu(*g)
                    .is_none_or(|g| g.memory.used == Some(0) && g.processes.is_empty())
            });
            if released || d.since.elapsed() >= DRAIN_FOR {
                self.drain = None;
            }
        }
        if let Some(x) = &mut self.exits {
            let procs: Vec<(u32, u64)> =
                now.iter().map(|(pid, (start, _))| (*pid, *start)).collect();
            x.watch(&procs);
        }
        self.gpu_procs = now;
    }

    /// How deep this poll reads /proc: every process's fds on the slow cadence (sooner while memory is
    /// unexplained), the list of processes every `list_every`, and otherwise only what is known to matter.
    fn depth(&self) -> Depth {
        let cfg = self.scanner.config();
        let every = if self.unexplained_at_full.is_empty() {
            cfg.full_scan_every
        } else {
            cfg.full_scan_unexplained
        };
        if self
            .scanner
            .last_full()
            .is_none_or(|t| t.elapsed() >= every)
        {
            Depth::Full
        } else if self.listed_at.is_none_or(|t| t.elapsed() >= cfg.list_every) {
            Depth::Listing
        } else {
            Depth::Known
        }
    }
}

/// What no live listed process explains, per GPU: the listed PIDs that are gone, and whether memory is used
/// beyond what the live listed ones are charged (with nothing listed, any at all). Empty when everything is
/// explained. A change of it walks every process's descriptors at once: a process that opened the GPU after
/// it was first walked (a sidecar) is found before its memory is called a leak.
fn unexplained(gpus: &[Gpu], table: &ProcTable) -> Vec<(u32, Vec<u32>, bool)> {
    gpus.iter()
        .filter_map(|g| {
            let gone: Vec<u32> = g
                .processes
                .iter()
                .map(|p| p.pid)
                .filter(|pid| !table.procs.contains_key(pid))
                .collect();
            let used = g.memory.used.unwrap_or(0);
            let charged: Option<u64> = g
                .processes
                .iter()
                .filter(|p| table.procs.contains_key(&p.pid))
                .map(|p| p.used_bytes)
                .sum();
            // Busy with nothing listed is as unexplained as memory is: whoever runs the work is looked for.
            let residual = if g.processes.is_empty() {
                used > 0 || g.utilization.is_some_and(|u| u > 0)
            } else {
                charged
                    .is_some_and(|c| used.saturating_sub(c) > gpusweep_core::model::RESIDUAL_SLACK)
            };
            (!gone.is_empty() || residual).then_some((g.index, gone, residual))
        })
        .collect()
}

/// Join GPU readings and a /proc table into one snapshot holding only the processes worth showing.
#[allow(clippy::too_many_arguments)] // the parts of one reading, gathered by `poll`
pub(crate) fn build_snapshot(
    host: &str,
    scanner: &mut ProcScanner,
    table: &mut ProcTable,
    gpus: Vec<Gpu>,
    gpu_error: Option<String>,
    driver_version: Option<String>,
    self_pid: u32,
    in_child_ns: bool,
) -> HostSnapshot {
    let seeds = table
        .holders
        .keys()
        .copied()
        .chain(gpus.iter().flat_map(|g| g.processes.iter().map(|p| p.pid)));
    let (wanted, zombies) = super::shown_pids(&table.procs, seeds);
    scanner.fill_details(table, &wanted);
    trace(host, "details of shown processes read");
    let shm = scanner.read_shm(table);
    trace(host, "shm read");
    let mut holders: Vec<Holder> = table
        .holders
        .iter()
        .map(|(&pid, (devices, fds))| Holder {
            pid,
            gpus: super::gpus_of_devices(devices, &gpus),
            devices: devices.clone(),
            fd_count: *fds,
            benign: table
                .procs
                .get(&pid)
                .is_some_and(|p| scanner.is_benign(p, self_pid)),
            kept: table.procs.get(&pid).is_some_and(|p| scanner.is_kept(p)),
            declared: table
                .procs
                .get(&pid)
                .is_some_and(|p| scanner.is_declared(p)),
        })
        .collect();
    holders.sort_by_key(|h| h.pid);
    super::unbenign_charged(&mut holders, &gpus);
    let mut processes: Vec<_> = wanted
        .iter()
        .filter_map(|p| table.procs.get(p).cloned())
        .map(|mut p| {
            p.fds_unreadable = table.unreadable.contains(&p.pid);
            p
        })
        .collect();
    processes.sort_by_key(|p| p.pid);
    let mut gpus = gpus;
    for g in &mut gpus {
        g.kept = scanner.keeps_model(g.name.as_deref());
    }
    HostSnapshot {
        live_url: None,
        simulated: false,
        host: host.to_string(),
        error: None,
        taken_at_ms: now_ms(),
        source: SourceKind::Local,
        gpu_error,
        driver_version,
        gpus,
        processes,
        holders,
        zombies,
        shm: Some(shm),
        unreadable_processes: u32::try_from(table.unreadable.len()).unwrap_or(u32::MAX),
        in_child_pid_namespace: in_child_ns,
        missing_features: Vec::new(),
        findings: Vec::new(),
        jobs: Vec::new(),
        // After /proc: a death this reading saw was noted before it looked.
        acts: acts::read(&gpusweep_core::acts::dir(), now_ms()),
    }
}
