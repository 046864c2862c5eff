//! Local GPUs through NVML, loaded at run time (no link-time dependency on the driver).
//!
//! Only NVML is used: calling the CUDA driver API (`cuInit`) would itself make each GPU read 4 MiB used.
//! Each field is read on its own; a field the GPU does not support is `None`, and a GPU that fails as a whole
//! (GpuLost, Unknown) carries its error while the other GPUs go on.

use std::ffi::OsStr;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::GpmSample;

use super::watchdog::GpuReader;
use gpusweep_core::model::{Counters, Gpu, ListedProcess, Memory, MigInstance, ProcessKind};
use gpusweep_core::trace;

/// What identifies a GPU and how it is set up: read with the first reading and again every `IDENT_EVERY`
/// (MIG and persistence modes can change; the rest cannot), not at every poll: seven driver calls a poll saved.
type Ident = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<u32>,
    Option<String>,
    Option<bool>,
    Option<bool>,
    Option<String>,
);

const IDENT_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// How much of each GPU a reading reads, beyond what the verdict needs (memory, processes, identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readout {
    /// The verdict alone (`wait`, `sweep`, `snapshot --no-gauges`).
    Verdict,
    /// And utilization, temperature and power (the TUI, `snapshot`).
    Gauges,
    /// And dcgm-exporter's counters: clocks, energy, PCIe replays, engines, remapped rows, GPM's activity
    /// ratios (`serve`, at its interval).
    Counters,
}

impl Readout {
    pub fn of(gauges: bool, counters: bool) -> Readout {
        match (gauges, counters) {
            (_, true) => Readout::Counters,
            (true, false) => Readout::Gauges,
            (false, false) => Readout::Verdict,
        }
    }
}

/// How long a reader lives: a one-shot reading (`snapshot`, `check`, `wait`: NVML loaded early) or a reader
/// that reads again and again (the TUI, a serve, an agent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Life {
    OneShot,
    LivesOn,
}

/// XIDs come as events from the moment a reader registers for them: a one-shot reading would only say "none
/// seen" of the few milliseconds it lives (registering costs it each GPU's event calls and a thread), and the
/// verdict alone reads no XIDs.
fn watches_xids(readout: Readout, life: Life) -> bool {
    readout != Readout::Verdict && life == Life::LivesOn
}

pub struct NvmlReader {
    nvml: &'static Nvml,
    /// Per GPU index: its identity and when it was read.
    idents: std::sync::Mutex<std::collections::HashMap<u32, (std::time::Instant, Ident)>>,
    /// Read once when NVML is loaded: GPUs do not come and go while it runs.
    pub count: u32,
    /// How much of each GPU is read.
    readout: Readout,
    /// Per GPU index: its last GPM sample (GPM's ratios are the difference of two samples).
    gpm: std::sync::Mutex<std::collections::HashMap<u32, (std::time::Instant, GpmSample<'static>)>>,
    /// Per GPU index: its counters and when they were read (they cost ~4.7 ms a GPU on an H200, a hundred
    /// times a verdict's reading, so they are read at most every `COUNTERS_EVERY`).
    counters: std::sync::Mutex<std::collections::HashMap<u32, (std::time::Instant, Counters)>>,
    pub driver_version: Option<String>,
    /// Each GPU's XID errors since this reader began watching (a reader that lives on: the TUI, a serve).
    xids: Option<super::xid::Seen>,
}

/// The one line a user sees when NVML cannot be used.
pub(crate) fn describe_init_error(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound => {
            "no NVIDIA driver: libnvidia-ml.so.1 not found".into()
        }
        NvmlError::DriverNotLoaded => "no NVIDIA driver: the kernel driver is not loaded".into(),
        NvmlError::NoPermission => "NVML: no permission to talk to the driver".into(),
        other => format!("NVML init failed: {other}"),
    }
}

impl NvmlReader {
    /// Load `libnvidia-ml.so.1` (the name the driver installs; the unversioned name needs the -dev package),
    /// or the library `GPUSWEEP_NVML_LIBRARY` names (a driver installed off the loader's path). `life` says
    /// whether the reader lives on (and so watches XIDs when it reads more than the verdict).
    pub(super) fn open(readout: Readout, life: Life) -> Result<Self, String> {
        let mut last = None;
        let chosen = std::env::var_os("GPUSWEEP_NVML_LIBRARY");
        let libs: Vec<&OsStr> = match &chosen {
            Some(p) => vec![p.as_os_str()],
            None => vec![
                OsStr::new("libnvidia-ml.so.1"),
                OsStr::new("libnvidia-ml.so"),
            ],
        };
        for lib in libs {
            match Nvml::builder().lib_path(lib).init() {
                Ok(nvml) => {
                    trace("nvml", "initialized");
                    // Loaded once for the process's life: GPM samples borrow it for as long.
                    let nvml: &'static Nvml = Box::leak(Box::new(nvml));
                    let count = nvml
                        .device_count()
                        .map_err(|e| format!("NVML device count: {e}"))?;
                    // Take each device handle now: it is the slowest first call, and this runs on the loader
                    // thread while /proc is being scanned.
                    for i in 0..count {
                        let _ = nvml.device_by_index(i);
                    }
                    trace("nvml", "device handles taken");
                    let driver_version = nvml.sys_driver_version().ok();
                    let xids = watches_xids(readout, life)
                        .then(|| super::xid::watch(nvml, count))
                        .flatten();
                    return Ok(NvmlReader {
                        xids,
                        nvml,
                        idents: std::sync::Mutex::default(),
                        count,
                        readout,
                        gpm: std::sync::Mutex::default(),
                        counters: std::sync::Mutex::default(),
                        driver_version,
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.map_or_else(|| "NVML unavailable".into(), |e| describe_init_error(&e)))
    }
}

impl NvmlReader {
    /// A GPU's identity and modes: from the cache while fresh, else read (seven driver calls).
    fn identity(&self, index: u32, dev: &nvml_wrapper::Device) -> Ident {
        let cached = self.idents.lock().ok().and_then(|m| {
            m.get(&index)
                .filter(|(at, _)| at.elapsed() < IDENT_EVERY)
                .cloned()
        });
        if let Some((_, id)) = cached {
            return id;
        }
        let id: Ident = (
            dev.uuid().ok(),
            dev.name().ok(),
            dev.pci_info().ok().map(|p| p.bus_id),
            dev.minor_number().ok(),
            dev.cuda_compute_capability()
                .ok()
                .map(|c| format!("{}.{}", c.major, c.minor)),
            dev.mig_mode().ok().map(|m| m.current == 1),
            dev.is_in_persistent_mode().ok(),
            recovery_action(dev),
        );
        trace("nvml", "identity read");
        if let Ok(mut m) = self.idents.lock() {
            m.insert(index, (std::time::Instant::now(), id.clone()));
        }
        id
    }
}

impl GpuReader for NvmlReader {
    /// One GPU, its fields one after another: on a cold first reading the driver serializes its slow first
    /// calls, so calls from parallel threads only wait on each other (an H200: 7.3 ms in four threads against
    /// 6.1 ms in one; see `scripts/gpu/nvml_order.py`).
    fn read_one(&self, index: u32) -> Gpu {
        let mut gpu = Gpu {
            index,
            ..Default::default()
        };
        let dev = match self.nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                gpu.error = Some(e.to_string());
                return gpu;
            }
        };
        let mem = dev.memory_info();
        trace("nvml", "memory read");
        let procs = read_processes(&dev);
        trace("nvml", "processes read");
        let id = self.identity(index, &dev);
        let idle_listed = procs.as_ref().is_ok_and(Vec::is_empty);
        let (rates, temp, power_mw) = if self.readout == Readout::Verdict {
            // Clean means idle: a GPU with nothing listed is asked whether it is at work (one call).
            let rates = idle_listed.then(|| dev.utilization_rates().ok()).flatten();
            (rates, None, None)
        } else {
            let g = (
                dev.utilization_rates().ok(),
                dev.temperature(TemperatureSensor::Gpu).ok(),
                dev.power_usage().ok(),
            );
            trace("nvml", "utilization, temperature and power read");
            g
        };
        match mem {
            Ok(m) => {
                gpu.memory = Memory {
                    used: Some(m.used),
                    total: Some(m.total),
                    reserved: Some(m.reserved),
                }
            }
            // A lost GPU fails every call; say so once.
            Err(e @ (NvmlError::GpuLost | NvmlError::Unknown)) => {
                gpu.error = Some(e.to_string());
                return gpu;
            }
            Err(_) => {}
        }
        (
            gpu.uuid,
            gpu.name,
            gpu.pci_bus_id,
            gpu.minor,
            gpu.compute_capability,
            gpu.mig_enabled,
            gpu.persistence_mode,
            gpu.recovery_action,
        ) = id;
        gpu.utilization = rates.as_ref().map(|u| u.gpu);
        gpu.temperature_c = temp;
        gpu.power_mw = power_mw;
        gpu.counters = self.counters_of(
            index,
            &dev,
            rates.as_ref().map(|u| u.memory),
            procs.as_ref().is_ok_and(|p| !p.is_empty()),
        );
        match procs {
            Ok(p) => gpu.processes = p,
            Err(e) => gpu.error = Some(format!("process list: {e}")),
        }
        gpu.xids = self
            .xids
            .as_ref()
            .and_then(|s| s.lock().ok()?.get(&index).cloned());
        if gpu.mig_enabled == Some(true) {
            match self.instances(&dev) {
                Ok(m) => gpu.mig = m,
                Err(e) => gpu.mig_error = Some(e),
            }
            trace("nvml", "MIG instances read");
        }
        gpu
    }
}

impl NvmlReader {
    /// Each MIG instance of a GPU in MIG mode, through its own handle: ids, profile, memory, processes.
    fn instances(&self, dev: &nvml_wrapper::Device) -> Result<Vec<MigInstance>, String> {
        let max = dev
            .mig_device_count()
            .map_err(|e| format!("MIG devices: {e}"))?;
        let mut out = Vec::new();
        for k in 0..max {
            let m = match dev.mig_device_by_index(k) {
                Ok(m) => m,
                // An index with no instance behind it.
                Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                Err(e) => return Err(format!("MIG device {k}: {e}")),
            };
            let (gpu_instance, compute_instance) = gpusweep_sys::mig_instance_ids(self.nvml, &m);
            let mut inst = MigInstance {
                gpu_instance,
                compute_instance,
                profile: m.name().ok().map(|n| mig_profile(&n)),
                uuid: m.uuid().ok(),
                ..MigInstance::default()
            };
            match m.memory_info() {
                Ok(mem) => {
                    inst.memory = Memory {
                        used: Some(mem.used),
                        total: Some(mem.total),
                        reserved: Some(mem.reserved),
                    };
                }
                Err(e) => inst.error = Some(format!("memory: {e}")),
            }
            match read_processes(&m) {
                Ok(p) => inst.processes = p,
                Err(e) => inst.error = Some(format!("process list: {e}")),
            }
            // A process listed on an instance runs in it, whatever NVML's record left out.
            for p in &mut inst.processes {
                p.gpu_instance = p.gpu_instance.or(gpu_instance);
            }
            out.push(inst);
        }
        Ok(out)
    }
}

/// A MIG device's profile from its name: "NVIDIA H100 80GB HBM3 MIG 1g.10gb" -> "1g.10gb".
fn mig_profile(name: &str) -> String {
    name.rsplit_once(" MIG ")
        .map_or(name, |(_, p)| p)
        .trim()
        .to_string()
}

/// What the driver says the GPU needs to recover (NVML's field 230, drivers 550 and later); `None` where it
/// does not say.
fn recovery_action(dev: &nvml_wrapper::Device) -> Option<String> {
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::structs::device::FieldId;
    use nvml_wrapper::sys_exports::field_id as fi;
    let values = dev
        .field_values_for(&[FieldId(fi::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)])
        .ok()?;
    let v = values.into_iter().next()?.ok()?.value.ok()?;
    let n = match v {
        SampleValue::U32(x) => u64::from(x),
        SampleValue::U64(x) => x,
        SampleValue::I64(x) => u64::try_from(x).ok()?,
        SampleValue::F64(_) => return None,
    };
    Some(
        match n {
            0 => "none",
            1 => "gpu_reset",
            2 => "node_reboot",
            3 => "drain_p2p",
            4 => "drain_and_reset",
            _ => return Some(format!("unknown_{n}")),
        }
        .to_string(),
    )
}

/// Compute and graphics processes, each PID once (compute first).
fn read_processes(dev: &nvml_wrapper::Device) -> Result<Vec<ListedProcess>, String> {
    let mut procs: Vec<ListedProcess> = Vec::new();
    for (kind, res) in [
        (ProcessKind::Compute, dev.running_compute_processes()),
        (ProcessKind::Graphics, dev.running_graphics_processes()),
    ] {
        match res {
            Ok(list) => {
                for p in list {
                    if procs.iter().any(|q| q.pid == p.pid) {
                        continue;
                    }
                    let used_bytes = match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    };
                    procs.push(ListedProcess {
                        pid: p.pid,
                        used_bytes,
                        kind,
                        name: None,
                        gpu_instance: p.gpu_instance_id,
                    });
                }
            }
            Err(NvmlError::NotSupported) => {}
            Err(e) if kind == ProcessKind::Compute => return Err(e.to_string()),
            Err(_) => {}
        }
    }
    Ok(procs)
}

/// How often a GPU's counters are read again (dcgm-exporter collects every 30 s by default; Prometheus
/// scrapes every 15 s by default).
const COUNTERS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// How far apart two GPM samples must be for their ratios to mean something.
const GPM_MIN_GAP: std::time::Duration = std::time::Duration::from_millis(100);

impl NvmlReader {
    /// The counters a reading at this readout has of a GPU: dcgm-exporter's (with memory-copy utilization,
    /// which came with the gauges' call), or at the gauges' depth GPM's activity on a GPU that holds a job
    /// (`holds_job`): what tells a rank spinning in a collective (busy, no SM, tensor or DRAM work) from one
    /// computing. Only there (a sample per reading), with `None` ratios until two samples are far enough
    /// apart; a GPU without GPM has none.
    fn counters_of(
        &self,
        index: u32,
        dev: &nvml_wrapper::Device<'static>,
        mem_copy_util: Option<u32>,
        holds_job: bool,
    ) -> Option<Box<Counters>> {
        match self.readout {
            Readout::Counters => {
                let mut c = self.counters_now(index, dev);
                c.mem_copy_util = mem_copy_util;
                Some(Box::new(c))
            }
            Readout::Gauges if holds_job && dev.gpm_support().unwrap_or(false) => {
                let mut c = Counters::default();
                self.gpm(index, dev, &mut c);
                Some(Box::new(c))
            }
            _ => None,
        }
    }

    /// The GPU's counters: as last read while fresh, else read now.
    fn counters_now(&self, index: u32, dev: &nvml_wrapper::Device<'static>) -> Counters {
        let fresh = self.counters.lock().ok().and_then(|m| {
            m.get(&index)
                .filter(|(at, _)| at.elapsed() < COUNTERS_EVERY)
                .map(|(_, c)| c.clone())
        });
        if let Some(c) = fresh {
            return c;
        }
        let c = self.counters(index, dev);
        trace("nvml", "counters read");
        if let Ok(mut m) = self.counters.lock() {
            m.insert(index, (std::time::Instant::now(), c.clone()));
        }
        c
    }

    /// dcgm-exporter's counters that NVML gives: each call on its own, a field the part lacks `None`.
    fn counters(&self, index: u32, dev: &nvml_wrapper::Device<'static>) -> Counters {
        use nvml_wrapper::enums::device::SampleValue;
        use nvml_wrapper::structs::device::FieldId;
        use nvml_wrapper::sys_exports::field_id as fi;
        let mut c = Counters {
            sm_clock_mhz: dev.clock_info(Clock::SM).ok(),
            mem_clock_mhz: dev.clock_info(Clock::Memory).ok(),
            energy_mj: dev.total_energy_consumption().ok(),
            pcie_replays: dev.pcie_replay_counter().ok().map(u64::from),
            enc_util: dev.encoder_utilization().ok().map(|u| u.utilization),
            dec_util: dev.decoder_utilization().ok().map(|u| u.utilization),
            ..Counters::default()
        };
        let ids = [
            FieldId(fi::NVML_FI_DEV_MEMORY_TEMP),
            FieldId(fi::NVML_FI_DEV_REMAPPED_COR),
            FieldId(fi::NVML_FI_DEV_REMAPPED_UNC),
            FieldId(fi::NVML_FI_DEV_REMAPPED_FAILURE),
        ];
        let whole = |v: &SampleValue| -> Option<u64> {
            match *v {
                SampleValue::U32(x) => Some(u64::from(x)),
                SampleValue::U64(x) => Some(x),
                SampleValue::I64(x) => u64::try_from(x).ok(),
                SampleValue::F64(_) => None,
            }
        };
        if let Ok(values) = dev.field_values_for(&ids) {
            let read: Vec<Option<u64>> = values
                .iter()
                .map(|r| r.as_ref().ok()?.value.as_ref().ok().and_then(whole))
                .collect();
            if let [temp, cor, unc, fail] = read[..] {
                c.memory_temp_c = temp.and_then(|t| u32::try_from(t).ok()).filter(|t| *t > 0);
                c.remapped_rows_correctable = cor;
                c.remapped_rows_uncorrectable = unc;
                c.row_remap_failure = fail.map(|f| f != 0);
            }
        }
        self.gpm(index, dev, &mut c);
        c
    }

    /// GPM's activity ratios (Hopper and later), from this sample and the last one of this GPU.
    fn gpm(&self, index: u32, dev: &nvml_wrapper::Device<'static>, c: &mut Counters) {
        let supported = dev.gpm_support().unwrap_or(false);
        c.gpm_supported = Some(supported);
        if !supported {
            return;
        }
        let Ok(now) = dev.gpm_sample() else { return };
        let Ok(mut kept) = self.gpm.lock() else {
            return;
        };
        let previous = kept.insert(index, (std::time::Instant::now(), now));
        let (Some((at, before)), Some((_, now))) = (previous, kept.get(&index)) else {
            return;
        };
        if at.elapsed() < GPM_MIN_GAP {
            return;
        }
        let ids = [
            GpmMetricId::GraphicsUtil,
            GpmMetricId::AnyTensorUtil,
            GpmMetricId::DramBwUtil,
            GpmMetricId::PcieTxPerSec,
            GpmMetricId::PcieRxPerSec,
        ];
        let Ok(results) = nvml_wrapper::gpm::gpm_metrics_get(self.nvml, &before, now, &ids) else {
            return;
        };
        let v: Vec<Option<f64>> = results
            .into_iter()
            .map(|r| {
                r.ok()
                    .map(|m| m.value)
                    .filter(|x| x.is_finite() && *x >= 0.0)
            })
            .collect();
        if let [gr, tensor, dram, tx, rx] = v[..] {
            // Percent to dcgm-exporter's ratios; MiB/s to its bytes per second.
            c.gr_engine_active = gr.map(|x| x / 100.0);
            c.tensor_active = tensor.map(|x| x / 100.0);
            c.dram_active = dram.map(|x| x / 100.0);
            c.pcie_tx_bytes_per_s = tx.map(|x| x * 1_048_576.0);
            c.pcie_rx_bytes_per_s = rx.map(|x| x * 1_048_576.0);
        }
    }
}
