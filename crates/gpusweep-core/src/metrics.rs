//! The names of the metrics `gpusweep serve` exports and a `prom:` host reads back: one vocabulary for both
//! ends. The DCGM names and labels are dcgm-exporter's, so dashboards built for it work unchanged.

/// Framebuffer memory used, MiB (dcgm-exporter's name).
pub const FB_USED: &str = "DCGM_FI_DEV_FB_USED";
/// Framebuffer memory free, MiB.
pub const FB_FREE: &str = "DCGM_FI_DEV_FB_FREE";
/// Framebuffer memory the driver reserves, MiB.
pub const FB_RESERVED: &str = "DCGM_FI_DEV_FB_RESERVED";
/// The same three in bytes, as dcgm-exporter 4.9 and later names them (DCGM 4.7's names; 4.10 keeps them).
pub const FB_USED_BYTES: &str = "DCGM_FI_DEV_FB_USED_BYTES";
pub const FB_FREE_BYTES: &str = "DCGM_FI_DEV_FB_FREE_BYTES";
pub const FB_RESERVED_BYTES: &str = "DCGM_FI_DEV_FB_RESERVED_BYTES";

/// dcgm-exporter's labels on every per-GPU series, in its order.
pub const L_GPU: &str = "gpu";
pub const L_UUID: &str = "UUID";
pub const L_PCI_BUS_ID: &str = "pci_bus_id";
pub const L_DEVICE: &str = "device";
pub const L_MODEL: &str = "modelName";
pub const L_HOSTNAME: &str = "Hostname";
/// The same, as dcgm-exporter spells it since its PR #655 (to join with Slurm's metrics): series carry both.
pub const L_HOSTNAME_NEW: &str = "hostname";
/// The driver's version, a label of every per-GPU series (dcgm-exporter's).
pub const L_DRIVER: &str = "DCGM_FI_DRIVER_VERSION";

/// A GPU's reading as one of dcgm-exporter's default fields, in its units: `None` where it was not read.
pub type Field = fn(&crate::model::Gpu) -> Option<f64>;

/// dcgm-exporter's default counters (its `etc/default-counters.csv`) that gpusweep reads without DCGM, with
/// its names and HELP texts, besides the framebuffer's. Exported as gauges: OpenMetrics would rename a
/// counter `..._total`, and dashboards ask for dcgm-exporter's names.
pub const DCGM_FIELDS: &[(&str, &str, Field)] = &[
    (
        "DCGM_FI_DEV_SM_CLOCK",
        "SM clock frequency (in MHz).",
        |g| c(g)?.sm_clock_mhz.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        "Memory clock frequency (in MHz).",
        |g| c(g)?.mem_clock_mhz.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_MEMORY_TEMP",
        "Memory temperature (in C).",
        |g| c(g)?.memory_temp_c.map(f64::from),
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", |g| {
        g.temperature_c.map(f64::from)
    }),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", |g| {
        g.power_mw.map(|mw| f64::from(mw) / 1000.0)
    }),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        |g| c(g)?.energy_mj.map(|x| x as f64),
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "Total number of PCIe retries.",
        |g| c(g)?.pcie_replays.map(|x| x as f64),
    ),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered.",
        |g| g.xids.as_ref()?.last.map(|x| x as f64),
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", |g| {
        g.utilization.map(f64::from)
    }),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "Memory utilization (in %).",
        |g| c(g)?.mem_copy_util.map(f64::from),
    ),
    ("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", |g| {
        c(g)?.enc_util.map(f64::from)
    }),
    ("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", |g| {
        c(g)?.dec_util.map(f64::from)
    }),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors",
        |g| c(g)?.remapped_rows_uncorrectable.map(|x| x as f64),
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors",
        |g| c(g)?.remapped_rows_correctable.map(|x| x as f64),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "Whether remapping of rows has failed",
        |g| c(g)?.row_remap_failure.map(|f| f64::from(u8::from(f))),
    ),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active.",
        |g| c(g)?.gr_engine_active,
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        |g| c(g)?.tensor_active,
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        |g| c(g)?.dram_active,
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
        |g| c(g)?.pcie_tx_bytes_per_s,
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
        |g| c(g)?.pcie_rx_bytes_per_s,
    ),
];

fn c(g: &crate::model::Gpu) -> Option<&crate::model::Counters> {
    g.counters.as_deref()
}

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
/// What a leftover holds on a GPU, by `kind` (ghost, residual, orphan, hidden, busy) and `GPU_I_ID` (the MIG
/// instance, empty for a whole GPU): present from the moment a leftover is seen, before the confirm window has
/// passed, so an alert can fire within it. Bytes; NaN where unknown. The kinds overlap (`hidden` names who
/// holds a `residual`; `busy` is the memory of a GPU at work for nobody, often 0).
pub const LEFTOVER_BYTES: &str = "gpusweep_leftover_bytes";
/// The MIG instance a series is about, as dcgm-exporter labels it (empty for a whole GPU).
pub const L_GPU_I_ID: &str = "GPU_I_ID";
/// The MIG instance's profile ("1g.18gb"), as dcgm-exporter labels it.
pub const L_GPU_I_PROFILE: &str = "GPU_I_PROFILE";
/// How many processes would block a reset of the GPU (its device node's openers, benign ones included, and
/// the control nodes').
pub const RESET_BLOCKERS: &str = "gpusweep_reset_blockers";
/// 1, with what the driver says the GPU needs to recover (`action`: none, gpu_reset, node_reboot,
/// drain_p2p, drain_and_reset), where it says.
pub const RECOVERY_ACTION: &str = "gpusweep_gpu_recovery_action";
/// How many of each XID a GPU reported since the serve began watching (`xid`).
pub const XID_COUNT: &str = "gpusweep_gpu_xid_errors";
/// Findings now, by kind and severity (every kind and severity, 0 when none).
pub const FINDINGS: &str = "gpusweep_findings";
/// How many findings the host has now, of every kind and severity (one series a host): with
/// `GPUS_READABLE`, a `prom:` reader's summary. Where it is 0 and every GPU was read, a host's memory and
/// clean per GPU are all there is to read of it.
pub const HOST_FINDINGS: &str = "gpusweep_host_findings";
/// The host's compact summary, which a `prom:` client reads first for every host (a handful of series a host
/// where the per-GPU ones are hundreds): its GPUs by the state the ledger judged (`state`), as a bit mask of
/// GPU indices (bit i: GPU i), one series for each state some GPU is in. Absent where a GPU's index is
/// `STATE_MASK_GPUS` or more (a mask past that is no longer exact in a sample's float) or the host could
/// not be read.
pub const HOST_GPU_STATES: &str = "gpusweep_host_gpu_states";
/// GPU indices below this fit a state mask exactly (a float's 53 bits of mantissa).
pub const STATE_MASK_GPUS: u32 = 53;
/// Bytes used on the host's clean GPUs, summed (with `HOST_GPU_STATES`): 0 says each of them reads 0,
/// which a reader can hold a "clean" to without their per-GPU series.
pub const HOST_CLEAN_USED: &str = "gpusweep_host_clean_memory_used_bytes";
/// The seal over the host's compact summary (`seal::HostSummary`): `part="taken_ms"` the reading's time in
/// Unix milliseconds, `part="mac_0"` and `part="mac_1"` the seal's two 48-bit parts. Exported by a serve
/// given the fleet's key (`--seal-key`); a `prom:` reader believes a host's summary only where it checks.
pub const HOST_SEAL: &str = "gpusweep_host_seal";
/// The label naming a seal's part.
pub const L_PART: &str = "part";
/// Findings now by kind and severity, only those the host has (with `HOST_GPU_STATES`; `FINDINGS` has
/// every kind and severity, zeros too, for alerts and dashboards).
pub const HOST_FINDING_KINDS: &str = "gpusweep_host_finding_kinds";
/// Bytes NVML charges each process, by GPU, PID and job; at most `PROCESS_SERIES` a host (the largest), the
/// rest summed under pid="other".
pub const PROCESS_BYTES: &str = "gpusweep_process_gpu_memory_bytes";
/// Bytes of /dev/shm files of the GPU stack that no live process has open or mapped.
pub const SHM_LEFTOVER_BYTES: &str = "gpusweep_shm_leftover_bytes";
/// Seconds from the first signal (a sweep) or the last holder's exit (a re-watch) to the GPU reading clean.
pub const TIME_TO_CLEAN: &str = "gpusweep_time_to_clean_seconds";
/// A job's id on the job metrics: not `job`, which Prometheus sets to the scrape job's name (a target's own
/// `job` label is stored as `exported_job`).
pub const L_JOB_ID: &str = "job_id";
/// 1 for a job's phase now, 0 for the others (`job_id`, `phase`).
pub const JOB_PHASE: &str = "gpusweep_job_phase";
/// GPU memory a job's live ranks are charged.
pub const JOB_BYTES: &str = "gpusweep_job_gpu_memory_bytes";
/// Seconds from a job's start to when its memory stopped rising, for jobs seen settling.
pub const JOB_WARMUP: &str = "gpusweep_job_warmup_seconds";
/// Ranks lost while their peers held GPU memory (a counter: `_total`).
pub const JOB_LOST_RANKS: &str = "gpusweep_job_lost_ranks";
/// Most jobs per host with series of their own (the largest by memory).
pub const JOB_SERIES: usize = 64;
/// Unix time of the reading the metrics come from.
pub const READING_TIMESTAMP: &str = "gpusweep_reading_timestamp_seconds";
/// Moves when what the host says changes (its processes, their memory, its findings), not with the reading's
/// time or gauges: a `prom:` client reads the host's other series again only when this moved.
pub const READING_REVISION: &str = "gpusweep_reading_revision";
/// 1, with the serve's version and where its API answers (`scheme`, `api_path`): how a client reading
/// Prometheus opens the host live.
pub const SERVE_INFO: &str = "gpusweep_serve_info";
/// A digest of what identifies the host to a `prom:` client: each GPU's index, UUID, bus, device and model
/// as its memory series name them, and the serve's `scheme`, `api_path` and `simulated` (an integer below
/// 2^53, exact in a sample's float). It moves when one of them changes: a client reads those series again
/// only for hosts whose digest moved, and every host's now and then.
pub const HOST_IDENTITY_DIGEST: &str = "gpusweep_host_identity_digest";
/// A digest's bits: a float's mantissa.
pub const DIGEST_BITS: u32 = 53;

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
        HOST_FINDINGS,
        PROCESS_BYTES,
        SHM_LEFTOVER_BYTES,
        READING_TIMESTAMP,
        READING_REVISION,
        SERVE_INFO,
    ]
    .join("|")
}

/// The families a `prom:` reader queries (and the shipped alerts read `gpusweep_leftover_bytes` and
/// `gpusweep_gpus_readable`): a serve never leaves these out of its metrics.
pub const READ_BY_PROM: &[&str] = &[
    FB_USED,
    FB_FREE,
    FB_RESERVED,
    GPU_CLEAN,
    GPU_READABLE,
    GPUS_READABLE,
    UNEXPLAINED_BYTES,
    FINDINGS,
    HOST_FINDINGS,
    READING_TIMESTAMP,
    READING_REVISION,
    SERVE_INFO,
    HOST_GPU_STATES,
    HOST_CLEAN_USED,
    HOST_FINDING_KINDS,
    HOST_IDENTITY_DIGEST,
    HOST_SEAL,
    "gpusweep_leftover_bytes",
];
