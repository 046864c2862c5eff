//! This host: NVML (when a driver exists), /proc and /dev/shm, joined into one snapshot.

pub mod nvml;
pub mod procfs;
pub mod watchdog;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use super::{Source, SourceError};
use crate::core::model::{Gpu, Holder, HostSnapshot, SourceKind, now_ms};
use crate::core::trace;
use procfs::{ProcScanner, ProcTable, ProcfsConfig};

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
    loader: Option<Receiver<Result<nvml::NvmlReader, String>>>,
    deadline: Duration,
    scanner: ProcScanner,
    self_pid: u32,
    in_child_ns: bool,
}

impl LocalSource {
    /// `load_nvml: false` never touches the driver (tests, and hosts where only holders matter).
    pub fn new(host: String, procfs: ProcfsConfig, load_nvml: bool) -> Result<Self, SourceError> {
        let in_child_ns = procfs::in_child_pid_namespace(&procfs.proc_root);
        Ok(LocalSource {
            host,
            nvml: Err(if load_nvml {
                "NVML loading".into()
            } else {
                "NVML disabled (--no-nvml)".into()
            }),
            loader: load_nvml.then(|| {
                let (tx, rx) = std::sync::mpsc::sync_channel(1);
                // A thread that cannot start drops `tx`: the first poll then says the loader failed.
                let _ = std::thread::Builder::new()
                    .name("nvml-load".into())
                    .spawn(move || {
                        let _ = tx.send(nvml::NvmlReader::open());
                    });
                rx
            }),
            deadline: watchdog::DEFAULT_DEADLINE,
            scanner: ProcScanner::new(procfs)?,
            self_pid: std::process::id(),
            in_child_ns,
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
        let early = self
            .loader
            .is_some()
            .then(|| self.scanner.scan(false, &HashSet::new()));
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
        let (gpus, gpu_error, driver_version) = match &mut self.nvml {
            Ok(n) => (n.gpus.read(), None, n.driver_version.clone()),
            Err(e) => (Vec::new(), Some(e.clone()), None),
        };
        trace(&self.host, "GPUs read");
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
        trace(&self.host, "snapshot built");
        Ok(snap)
    }

    fn fresh_shm(&mut self) -> Option<(std::path::PathBuf, crate::core::model::ShmInfo)> {
        Some(self.scanner.shm_now())
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
#[allow(clippy::too_many_arguments)] // the parts of one reading, gathered by `poll`
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
    let seeds = table
        .holders
        .keys()
        .copied()
        .chain(gpus.iter().flat_map(|g| g.processes.iter().map(|p| p.pid)));
    let (wanted, zombies) = super::shown_pids(&table.procs, seeds);
    scanner.fill_details(&mut table, &wanted);
    let shm = scanner.read_shm(&table);
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
    HostSnapshot {
        live_url: None,
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
    }
}
