//! The names of the metrics `gpusweep serve` exports and a `prom:` host reads back: one vocabulary for both
//! ends. The DCGM names and labels are dcgm-exporter's, so dashboards built for it work unchanged.

/// Framebuffer memory used, MiB (dcgm-exporter's name).
pub const FB_USED: &str = "DCGM_FI_DEV_FB_USED";
/// Framebuffer memory free, MiB.
pub const FB_FREE: &str = "DCGM_FI_DEV_FB_FREE";
/// Framebuffer memory the driver reserves, MiB.
pub const FB_RESERVED: &str = "DCGM_FI_DEV_FB_RESERVED";

/// dcgm-exporter's labels on every per-GPU series, in its order.
pub const L_GPU: &str = "gpu";
pub const L_UUID: &str = "UUID";
pub const L_PCI_BUS_ID: &str = "pci_bus_id";
pub const L_DEVICE: &str = "device";
pub const L_MODEL: &str = "modelName";
pub const L_HOSTNAME: &str = "Hostname";

/// 1 when the GPU is clean (used at or under the tolerance, nothing listed); 0 when not; absent when it could
/// not be read.
pub const GPU_CLEAN: &str = "gpusweep_gpu_clean";
/// 1 when the GPU's memory could be read at the last poll, 0 when not.
pub const GPU_READABLE: &str = "gpusweep_gpu_readable";
/// 1 when NVML answered and every GPU of the host was read; 0 when the driver or a GPU does not answer.
pub const GPUS_READABLE: &str = "gpusweep_gpus_readable";
/// Bytes no live listed process accounts for, in two parts that add up: `kind="ghost"`, charged by NVML to
/// PIDs that are gone, and `kind="residual"`, charged to nobody. NaN where a ghost's charge is unknown.
pub const UNEXPLAINED_BYTES: &str = "gpusweep_unexplained_bytes";
/// Findings now, by kind and severity (every kind and severity, 0 when none).
pub const FINDINGS: &str = "gpusweep_findings";
/// Bytes NVML charges each process, by GPU, PID and job; at most `PROCESS_SERIES` a host (the largest), the
/// rest summed under pid="other".
pub const PROCESS_BYTES: &str = "gpusweep_process_gpu_memory_bytes";
/// Bytes of /dev/shm files of the GPU stack that no live process has open or mapped.
pub const SHM_LEFTOVER_BYTES: &str = "gpusweep_shm_leftover_bytes";
/// Seconds from the first signal (a sweep) or the last holder's exit (a re-watch) to the GPU reading clean.
pub const TIME_TO_CLEAN: &str = "gpusweep_time_to_clean_seconds";
/// Unix time of the reading the metrics come from.
pub const READING_TIMESTAMP: &str = "gpusweep_reading_timestamp_seconds";
/// 1, with the serve's version and where its API answers (`scheme`, `api_path`): how a client reading
/// Prometheus opens the host live.
pub const SERVE_INFO: &str = "gpusweep_serve_info";

/// The most process series one host exports: a node with thousands of GPU processes must not flood
/// Prometheus.
pub const PROCESS_SERIES: usize = 64;

/// Every name a `prom:` host reads, as one PromQL regular expression over `__name__`.
pub fn read_names_regex() -> String {
    [
        FB_USED,
        FB_FREE,
        FB_RESERVED,
        GPU_CLEAN,
        GPU_READABLE,
        UNEXPLAINED_BYTES,
        FINDINGS,
        PROCESS_BYTES,
        SHM_LEFTOVER_BYTES,
        READING_TIMESTAMP,
        SERVE_INFO,
    ]
    .join("|")
}
