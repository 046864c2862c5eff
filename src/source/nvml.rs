//! Local GPUs through NVML, loaded at run time (no link-time dependency on the driver).
//!
//! Only NVML is used: calling the CUDA driver API (`cuInit`) would itself make each GPU read 4 MiB used.
//! Each field is read on its own; a field the GPU does not support is `None`, and a GPU that fails as a whole
//! (GpuLost, Unknown) carries its error while the other GPUs go on.

use std::ffi::OsStr;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

use crate::model::{Gpu, ListedProcess, Memory, ProcessKind};

pub struct NvmlReader {
    nvml: Nvml,
}

/// The one line a user sees when NVML cannot be used.
pub fn describe_init_error(e: &NvmlError) -> String {
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
    /// Load `libnvidia-ml.so.1` (the name the driver installs; the unversioned name needs the -dev package).
    pub fn open() -> Result<Self, String> {
        let mut last = None;
        for lib in ["libnvidia-ml.so.1", "libnvidia-ml.so"] {
            match Nvml::builder().lib_path(OsStr::new(lib)).init() {
                Ok(nvml) => return Ok(NvmlReader { nvml }),
                Err(e) => last = Some(e),
            }
        }
        Err(last
            .map(|e| describe_init_error(&e))
            .unwrap_or_else(|| "NVML unavailable".into()))
    }

    pub fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    /// Every GPU. `Err` only when the device count itself cannot be read.
    pub fn read(&self) -> Result<Vec<Gpu>, String> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| format!("NVML device count: {e}"))?;
        Ok((0..count).map(|i| self.read_one(i)).collect())
    }

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
        match dev.memory_info() {
            Ok(m) => {
                gpu.memory = Memory {
                    used: Some(m.used),
                    total: Some(m.total),
                    reserved: Some(m.reserved),
                }
            }
            Err(e) => {
                // A lost GPU fails every call; say so once and stop asking it.
                if matches!(e, NvmlError::GpuLost | NvmlError::Unknown) {
                    gpu.error = Some(e.to_string());
                    return gpu;
                }
            }
        }
        gpu.uuid = dev.uuid().ok();
        gpu.name = dev.name().ok();
        gpu.pci_bus_id = dev.pci_info().ok().map(|p| p.bus_id);
        gpu.minor = dev.minor_number().ok();
        gpu.utilization = dev.utilization_rates().ok().map(|u| u.gpu);
        gpu.temperature_c = dev.temperature(TemperatureSensor::Gpu).ok();
        gpu.power_mw = dev.power_usage().ok();
        gpu.compute_capability = dev
            .cuda_compute_capability()
            .ok()
            .map(|c| format!("{}.{}", c.major, c.minor));
        gpu.mig_enabled = dev.mig_mode().ok().map(|m| m.current == 1);
        gpu.persistence_mode = dev.is_in_persistent_mode().ok();
        let mut procs = Vec::new();
        let mut listed_err = None;
        for (kind, res) in [
            (ProcessKind::Compute, dev.running_compute_processes()),
            (ProcessKind::Graphics, dev.running_graphics_processes()),
        ] {
            match res {
                Ok(list) => {
                    for p in list {
                        // A process with both contexts is listed twice: keep it once, compute first.
                        if procs.iter().any(|q: &ListedProcess| q.pid == p.pid) {
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
                        });
                    }
                }
                Err(NvmlError::NotSupported) => {}
                Err(e) if kind == ProcessKind::Compute => listed_err = Some(e.to_string()),
                Err(_) => {}
            }
        }
        if let Some(e) = listed_err {
            gpu.error = Some(format!("process list: {e}"));
        }
        gpu.processes = procs;
        gpu
    }
}
