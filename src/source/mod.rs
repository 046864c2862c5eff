//! Where snapshots come from. Every source produces whole `HostSnapshot`s; a reading it could not take is
//! `None`, never 0, and a failing part (one GPU, NVML as a whole, /dev/shm) never hides the others.

pub mod agent_client;
pub mod demo;
pub mod nvml;
pub mod procfs;
pub mod smi;
pub mod ssh;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::model::{Gpu, Holder, HostSnapshot, SourceKind, now_ms};
use crate::sweep::{self, Outcome, SignalRequest};
use procfs::{ProcScanner, ProcTable, ProcfsConfig, device_minor};

/// A host whose readings can be taken synchronously and whose processes can be signalled.
pub trait Source: Send {
    fn host(&self) -> &str;
    fn poll(&mut self) -> anyhow::Result<HostSnapshot>;
    /// Deliver signals with the safety rules of `sweep::deliver`.
    fn signal(&mut self, req: &SignalRequest) -> Vec<Outcome>;
    /// A deliverer that can run on another thread (so a grace period does not pause polling).
    fn deliverer(&self) -> Option<Deliverer> {
        None
    }
}

/// Real signal delivery on this host, detached from the source that polls it.
#[derive(Debug, Clone)]
pub struct Deliverer {
    pub host: String,
    pub audit: sweep::AuditLog,
}

impl Deliverer {
    pub fn deliver(&self, req: &SignalRequest) -> Vec<Outcome> {
        sweep::deliver(&self.host, req, &self.audit)
    }
}

/// This host: NVML (when a driver exists) plus /proc.
pub struct LocalSource {
    host: String,
    nvml: Result<nvml::NvmlReader, String>,
    /// NVML is loaded on a thread of its own (about 10 ms on a real H200) while the first /proc scan runs.
    loader: Option<std::thread::JoinHandle<Result<nvml::NvmlReader, String>>>,
    scanner: ProcScanner,
    self_pid: u32,
    in_child_ns: bool,
    audit: sweep::AuditLog,
}

impl LocalSource {
    /// `load_nvml: false` never touches the driver (tests, and hosts where only holders matter).
    pub fn new(
        host: String,
        procfs: ProcfsConfig,
        audit: sweep::AuditLog,
        load_nvml: bool,
    ) -> anyhow::Result<Self> {
        let in_child_ns = procfs::in_child_pid_namespace(&procfs.proc_root);
        Ok(LocalSource {
            host,
            nvml: Err(if load_nvml {
                "NVML loading".into()
            } else {
                "NVML disabled (--no-nvml)".into()
            }),
            loader: load_nvml.then(|| std::thread::spawn(nvml::NvmlReader::open)),
            scanner: ProcScanner::new(procfs)?,
            self_pid: std::process::id(),
            in_child_ns,
            audit,
        })
    }
}

impl Source for LocalSource {
    fn host(&self) -> &str {
        &self.host
    }

    fn poll(&mut self) -> anyhow::Result<HostSnapshot> {
        crate::trace(&self.host, "poll");
        // While NVML loads, take the first (full) /proc scan; it walks every process, listed ones included.
        let early = self
            .loader
            .is_some()
            .then(|| self.scanner.scan(false, &HashSet::new()));
        if let Some(h) = self.loader.take() {
            crate::trace(&self.host, "first /proc scan done");
            self.nvml = h
                .join()
                .unwrap_or_else(|_| Err("NVML loader panicked".into()));
            crate::trace(&self.host, "NVML loaded");
        }
        let (gpus, gpu_error, driver_version) = match &self.nvml {
            Ok(r) => match r.read() {
                Ok(g) => (g, None, r.driver_version()),
                Err(e) => (Vec::new(), Some(e), r.driver_version()),
            },
            Err(e) => (Vec::new(), Some(e.clone()), None),
        };
        crate::trace(&self.host, "GPUs read");
        let listed: HashSet<u32> = gpus
            .iter()
            .flat_map(|g| g.processes.iter().map(|p| p.pid))
            .collect();
        let mut table = match early {
            Some(t) => t,
            None => self.scanner.scan(false, &listed),
        };
        if !table.full && memory_unexplained(&gpus, &table) {
            // Memory without a live owner: look at every process now rather than at the next full scan.
            table = self.scanner.scan(true, &listed);
        }
        let snap = build_snapshot(
            &self.host,
            &mut self.scanner,
            table,
            gpus,
            gpu_error,
            driver_version,
            self.self_pid,
            self.in_child_ns,
        );
        crate::trace(&self.host, "snapshot built");
        Ok(snap)
    }

    fn signal(&mut self, req: &SignalRequest) -> Vec<Outcome> {
        sweep::deliver(&self.host, req, &self.audit)
    }

    fn deliverer(&self) -> Option<Deliverer> {
        Some(Deliverer {
            host: self.host.clone(),
            audit: self.audit.clone(),
        })
    }
}

/// Memory that no live listed process explains: a listed PID that is gone, or used memory with nothing listed.
fn memory_unexplained(gpus: &[Gpu], table: &ProcTable) -> bool {
    gpus.iter().any(|g| {
        g.processes
            .iter()
            .any(|p| !table.procs.contains_key(&p.pid))
            || (g.processes.is_empty() && g.memory.used.unwrap_or(0) > 0)
    })
}

/// Join GPU readings and a /proc table into one snapshot holding only the processes worth showing.
#[allow(clippy::too_many_arguments)]
pub fn build_snapshot(
    host: &str,
    scanner: &mut ProcScanner,
    mut table: ProcTable,
    gpus: Vec<Gpu>,
    gpu_error: Option<String>,
    driver_version: Option<String>,
    self_pid: u32,
    in_child_ns: bool,
) -> HostSnapshot {
    // /dev/nvidiaN -> GPU index through NVML's minor numbers; without NVML the minor is the index.
    let by_minor: HashMap<u32, u32> = gpus
        .iter()
        .filter_map(|g| g.minor.map(|m| (m, g.index)))
        .collect();
    let gpu_of = |minor: u32| {
        if gpus.is_empty() {
            Some(minor)
        } else {
            by_minor.get(&minor).copied()
        }
    };

    let mut wanted: HashSet<u32> = HashSet::new();
    wanted.extend(table.holders.keys().copied());
    wanted.extend(gpus.iter().flat_map(|g| g.processes.iter().map(|p| p.pid)));
    let zombies: Vec<u32> = {
        let mut z: Vec<u32> = table
            .procs
            .values()
            .filter(|p| p.state == 'Z')
            .map(|p| p.pid)
            .collect();
        z.sort_unstable();
        z
    };
    wanted.extend(zombies.iter().copied());
    // Ancestors, for the process tree and for zombie parents.
    let seeds: Vec<u32> = wanted.iter().copied().collect();
    for pid in seeds {
        let mut cur = pid;
        for _ in 0..64 {
            let Some(p) = table.procs.get(&cur) else {
                break;
            };
            if p.ppid <= 1 || !wanted.insert(p.ppid) {
                break;
            }
            cur = p.ppid;
        }
    }
    wanted.retain(|p| table.procs.contains_key(p));
    scanner.fill_details(&mut table, &wanted);

    let shm = scanner.read_shm(&table);

    let mut holders: Vec<Holder> = table
        .holders
        .iter()
        .map(|(&pid, (devices, fds))| {
            let mut g: Vec<u32> = devices
                .iter()
                .filter_map(|d| device_minor(d))
                .filter_map(gpu_of)
                .collect();
            g.sort_unstable();
            g.dedup();
            let benign = table
                .procs
                .get(&pid)
                .map(|p| scanner.is_benign(p, self_pid))
                .unwrap_or(false);
            Holder {
                pid,
                gpus: g,
                devices: devices.clone(),
                fd_count: *fds,
                benign,
            }
        })
        .collect();
    holders.sort_by_key(|h| h.pid);
    let mut processes: Vec<_> = wanted
        .iter()
        .filter_map(|p| table.procs.get(p).cloned())
        .map(|mut p| {
            p.fds_unreadable = table.unreadable.contains(&p.pid);
            p
        })
        .collect();
    processes.sort_by_key(|p| p.pid);

    HostSnapshot {
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
        unreadable_processes: table.unreadable.len() as u32,
        in_child_pid_namespace: in_child_ns,
        missing_features: Vec::new(),
        findings: Vec::new(),
    }
}

/// How often sources are polled by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
