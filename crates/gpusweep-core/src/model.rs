//! Plain snapshot types. A snapshot is always whole (never a delta) and every reading that could not be
//! taken is `None`, rendered as "N/A" — never 0.
//!
//! These types are the JSON contract of `gpusweep snapshot --json` and of the agent protocol; fields are only
//! ever added, never renamed. Bytes are integers.

use serde::{Deserialize, Serialize};

pub const MIB: u64 = 1024 * 1024;
pub const GIB: u64 = 1024 * MIB;
/// Memory past what live listed processes are charged that is context overhead, not a residual, by default
/// (a real H200 read 19692 MiB used for 19684 MiB charged).
pub const RESIDUAL_SLACK: u64 = 256 * MIB;

/// A host's identity inside one run: its place in the fleet. Labels are for people; routing (signals,
/// re-watches, plans) goes by this.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct HostId(pub usize);

impl std::fmt::Display for HostId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "host#{}", self.0)
    }
}

pub use super::proc_state::ProcState;

/// What a host's source cannot do or see. Verdicts name these as blind spots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Feature {
    /// Signals (agentless hosts: no pidfd there to make them safe).
    Signals,
    /// pidfd_open / pidfd_send_signal: without them kills are refused unless opted in.
    Pidfd,
    /// Which processes have GPU device files open.
    Holders,
    /// /dev/shm segments and their users.
    Shm,
    /// Temperature and power readings.
    Sensors,
    /// Kills, sweeps and removals: a host read over HTTP (a `serve`) or from Prometheus is read-only.
    Actions,
    /// NVML's list of processes and what it charges them (dcgm-exporter's metrics carry none).
    ProcessList,
    /// Utilization, temperature and power: left unread by a reading that only needs the verdict (their first
    /// reading in a process costs the driver ~5 ms per GPU).
    Gauges,
    /// Other users' processes: the `/proc` read hides them (`hidepid`) from this reader.
    OthersProcesses,
    /// The per-GPU bytes, the GPUs' identities and where each finding is: a first view of a host read from
    /// its Prometheus summary (each GPU's state as its serve judged it), read whole at the next poll.
    GpuDetail,
    /// A proof that the host's own node made its reading: a `prom:` host whose serve's seal did not check
    /// (no fleet key here, no seal there, or dcgm-exporter alone) rests on labels anyone could write, and
    /// a gate never stakes a launch on it.
    Proof,
}

impl Feature {
    /// What its absence means, for people.
    pub fn describe(self) -> &'static str {
        match self {
            Feature::Signals => "signals (agentless: install gpusweep there or use --deploy)",
            Feature::Pidfd => {
                "pidfd (this kernel has no pidfd, or a seccomp filter blocks it): kills are disabled; \
                 --kill-without-pidfd opts in to start-time checks and kill(2)"
            }
            Feature::Holders => "GPU holders (process fds could not be scanned)",
            Feature::Shm => "/dev/shm",
            Feature::Sensors => "temperature/power where nvidia-smi lacks them",
            Feature::Actions => {
                "kills, sweeps and removals (read-only: read over HTTP or from Prometheus; reach the host \
                 over SSH or through its agent to act on it)"
            }
            Feature::ProcessList => {
                "the GPU process list (only dcgm-exporter's memory metrics reach Prometheus for this host): \
                 a GPU in use cannot be told from a leak"
            }
            Feature::Gauges => "utilization, temperature and power (not read: --no-gauges)",
            Feature::OthersProcesses => {
                "other users' processes (this /proc hides them: hidepid, and this reader is not root nor \
                 in its exempt group): a GPU another user holds cannot be seen"
            }
            Feature::GpuDetail => {
                "the per-GPU bytes, the GPUs' identities and where each finding is (a first view from the \
                 host's summary in Prometheus: read whole at the next poll)"
            }
            Feature::Proof => {
                "a proof that the host itself said this (read from Prometheus without its serve's seal: \
                 labels anyone can write; give the fleet key with --seal-key, or read the host's serve): \
                 it is never judged clean"
            }
        }
    }
}

/// A mark on a process row: what the findings say about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mark {
    Ghost,
    Hidden,
    Orphan,
    Zombie,
    OtherNs,
    Benign,
}

impl Mark {
    pub fn as_str(self) -> &'static str {
        match self {
            Mark::Ghost => "ghost",
            Mark::Hidden => "hidden",
            Mark::Orphan => "orphan",
            Mark::Zombie => "zombie",
            Mark::OtherNs => "other-ns",
            Mark::Benign => "benign",
        }
    }
    /// The mark a finding puts on the process it names, if any.
    pub fn of(kind: FindingKind) -> Option<Mark> {
        match kind {
            FindingKind::Ghost => Some(Mark::Ghost),
            FindingKind::HiddenHolder => Some(Mark::Hidden),
            FindingKind::Orphan | FindingKind::OrphanedJob => Some(Mark::Orphan),
            FindingKind::Zombie => Some(Mark::Zombie),
            FindingKind::NotVisible => Some(Mark::OtherNs),
            _ => None,
        }
    }
}

/// How a GPU reads, as `analyze` judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuState {
    Clean,
    InUse,
    Leak,
    Unknown,
    Error,
    /// Not ready for a launch whatever its memory says: an XID that needs a reset was seen, or the driver
    /// asks for a reset or a reboot.
    NeedsReset,
}

impl GpuState {
    pub const ALL: [GpuState; 6] = [
        GpuState::Clean,
        GpuState::InUse,
        GpuState::Leak,
        GpuState::Unknown,
        GpuState::Error,
        GpuState::NeedsReset,
    ];

    /// Its name in JSON and in metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            GpuState::Clean => "clean",
            GpuState::InUse => "in_use",
            GpuState::Leak => "leak",
            GpuState::Unknown => "unknown",
            GpuState::Error => "error",
            GpuState::NeedsReset => "needs_reset",
        }
    }

    pub fn parse(s: &str) -> Option<GpuState> {
        GpuState::ALL.into_iter().find(|g| g.as_str() == s)
    }
}

/// Where a host's readings came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// In-process NVML + /proc on this host.
    #[default]
    Local,
    /// The deterministic simulated cluster.
    Demo,
    /// A remote `gpusweep agent` (over SSH or a local command).
    Agent,
    /// Agentless: nvidia-smi CSV and a shell scan of /proc over SSH.
    Smi,
    /// This host, read from a running `gpusweep serve` through its Unix socket (NVML already warm there).
    Serve,
    /// A remote `gpusweep serve`, read over HTTP(S): read-only.
    Http,
    /// A Prometheus server's view of the host (a `serve`'s or dcgm-exporter's metrics): summaries, judged by
    /// the host's own gpusweep where it runs one; read-only.
    Prometheus,
}

impl SourceKind {
    /// Whether the host's findings and GPU states come judged from elsewhere (Prometheus carries a serve's
    /// verdicts, not the processes to judge by): the client does not analyze them again.
    pub fn judged_remotely(self) -> bool {
        // A host is judged once, where its history is: a serve's readings (over HTTP or its socket) come
        // with its findings, GPU states and jobs (lost ranks, phases), which a client reading them afresh
        // would not have.
        matches!(
            self,
            SourceKind::Prometheus | SourceKind::Http | SourceKind::Serve
        )
    }
    /// Whether no kill, sweep or removal can be sent through this source.
    pub fn read_only(self) -> bool {
        matches!(self, SourceKind::Http | SourceKind::Prometheus)
    }
}

/// One host at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct HostSnapshot {
    pub host: String,
    /// Whole-host error (unreachable, auth failed, agent died). The rest may be from the last good reading.
    pub error: Option<String>,
    /// Unix time of the reading, milliseconds.
    pub taken_at_ms: u64,
    pub source: SourceKind,
    /// Why GPUs could not be read at all (for example "no NVIDIA driver: libnvidia-ml.so.1 not found").
    pub gpu_error: Option<String>,
    pub driver_version: Option<String>,
    pub gpus: Vec<Gpu>,
    /// Processes worth showing: holders, listed processes, zombies, and their ancestors (for the tree).
    pub processes: Vec<Proc>,
    pub holders: Vec<Holder>,
    /// PIDs of processes in state Z (details are in `processes`).
    pub zombies: Vec<u32>,
    pub shm: Option<ShmInfo>,
    /// Processes whose fds could not be read (permissions); they may hold GPUs unseen.
    pub unreadable_processes: u32,
    /// True when this reader runs in a child PID namespace (a container): NVML's host PIDs may not be visible.
    pub in_child_pid_namespace: bool,
    /// Features this host's source lacks (agentless hosts cannot see shared-memory users, for example).
    #[serde(default)]
    pub missing_features: Vec<Feature>,
    /// Filled by `analyze`; present in JSON output.
    pub findings: Vec<Finding>,
    /// Its jobs: the GPU processes that belong together, with their phase. Filled by the host's ledger
    /// (it remembers the readings before); present in JSON output.
    #[serde(default)]
    pub jobs: Vec<super::job::JobReport>,
    /// Where live readings of a host seen through Prometheus can be had: its serve's API
    /// (`http://node:9401`), or `ssh://node` where only dcgm-exporter's metrics exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_url: Option<String>,
    /// The reading is of the simulated demo cluster (wherever it was read from: a demo serve over HTTP
    /// too). Always in JSON.
    #[serde(default)]
    pub simulated: bool,
    /// Signals a gpusweep on the host noted before it sent them (`acts`), read after `/proc`: a rank a
    /// sweep ended is no lost rank to any watcher. Empty when none (and then not on the wire).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acts: Vec<crate::acts::Act>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Memory {
    pub used: Option<u64>,
    pub total: Option<u64>,
    pub reserved: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Gpu {
    pub index: u32,
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub pci_bus_id: Option<String>,
    /// `/dev/nvidiaN` minor number; holders are matched to GPUs through it.
    pub minor: Option<u32>,
    pub memory: Memory,
    /// Percent.
    pub utilization: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    /// dcgm-exporter's counters, where the reading asked for them (`serve`); each `None` where unread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<Box<Counters>>,
    /// "9.0", "12.0".
    pub compute_capability: Option<String>,
    pub mig_enabled: Option<bool>,
    pub persistence_mode: Option<bool>,
    pub processes: Vec<ListedProcess>,
    /// This GPU's own error (GpuLost, Unknown...); other GPUs go on.
    pub error: Option<String>,
    /// What the host's own gpusweep said of it, for hosts read from Prometheus (whose processes the client
    /// cannot see): an input to the verdict, believed only as far as the memory it reports agrees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judged: Option<GpuState>,
    /// The verdict: filled by the host's ledger (the one place a reading is judged), `None` in a reading
    /// not judged yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<GpuState>,
    /// A part the host's config declares keeps memory after its processes exit (`[keep] gpu_models`:
    /// unified-memory parts such as GB10, GH200): memory nobody holds there is kept, not leaked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kept: bool,
    /// Who would block a reset of this GPU, filled with the verdict (empty: nobody has it open).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reset_blockers: Vec<ResetBlocker>,
    /// The XID errors seen since this host began watching for them; `None` where nobody watched (a one-shot
    /// reading, an old agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xids: Option<Xids>,
    /// Its MIG instances, where the GPU is in MIG mode and they could be listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigInstance>,
    /// Why its MIG instances could not be listed, in MIG mode: then it cannot read clean.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_error: Option<String>,
    /// What the driver says this GPU needs to recover (NVML's recovery action: `none`, `gpu_reset`,
    /// `node_reboot`, `drain_p2p`, `drain_and_reset`), where it reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_action: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ProcessKind {
    #[default]
    Compute,
    Graphics,
}

/// A PID that NVML lists on a GPU, with the bytes charged to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ListedProcess {
    pub pid: u32,
    pub used_bytes: Option<u64>,
    pub kind: ProcessKind,
    /// Name as the source gave it (nvidia-smi prints "[Not Found]" for a ghost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The MIG GPU instance it runs in (NVML's `gpuInstanceId`), on a GPU in MIG mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance: Option<u32>,
}

/// A GPU's XID errors (the driver's error events) since its host began watching for them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Xids {
    /// The last XID seen (dcgm-exporter's `DCGM_FI_DEV_XID_ERRORS`).
    pub last: Option<u64>,
    /// How many of each were seen, by XID.
    pub counts: std::collections::BTreeMap<u64, u64>,
    /// Since when they were watched (Unix ms).
    pub since_ms: u64,
    /// Why watching stopped, where it did (the driver went away): none seen since is not none that came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

/// XIDs after which NVIDIA's guidance is a GPU reset before the next job: 46 (GPU stopped processing) and
/// 48 (double-bit ECC error), whose action in NVIDIA's health checks is to drain and reset the GPU, and 79
/// (GPU has fallen off the bus). Others are told by the driver's own recovery action (XID 154 says it
/// changed), which is read as well.
pub const RESET_XIDS: &[(u64, &str)] = &[
    (46, "GPU stopped processing"),
    (48, "double-bit ECC error"),
    (79, "GPU has fallen off the bus"),
];

/// One MIG instance of a GPU in MIG mode: a GPU instance with its compute instance, read through its own
/// NVML handle. Its memory and processes are judged on their own: a leftover in one instance is named with
/// it, and the GPU is clean only when every instance is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct MigInstance {
    /// NVML's GPU instance id (dcgm-exporter's `GPU_I_ID`).
    pub gpu_instance: Option<u32>,
    pub compute_instance: Option<u32>,
    /// Its profile ("1g.18gb", dcgm-exporter's `GPU_I_PROFILE`), from the MIG device's name.
    pub profile: Option<String>,
    pub uuid: Option<String>,
    pub memory: Memory,
    pub processes: Vec<ListedProcess>,
    /// This instance's own error: the GPU it belongs to cannot read clean.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Its verdict, filled with the GPU's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<GpuState>,
}

impl MigInstance {
    /// "instance 2 (1g.18gb)".
    pub fn label(&self) -> String {
        let id = self
            .gpu_instance
            .map_or_else(|| "?".to_string(), |i| i.to_string());
        match &self.profile {
            Some(p) => format!("instance {id} ({p})"),
            None => format!("instance {id}"),
        }
    }
}

/// A process as /proc shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Proc {
    pub pid: u32,
    pub ppid: u32,
    /// Session id; a process that is its own session leader is a daemon, not an orphan.
    pub sid: u32,
    /// Process group: a launcher and the ranks it forks share it (a shell gives each pipeline its own),
    /// and the kernel keeps it when the launcher dies and its ranks are reparented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pgid: Option<u32>,
    /// State from /proc/PID/stat (R, S, D, Z, T...), one letter in JSON.
    pub state: ProcState,
    /// Start time in clock ticks since boot: with the pid, the identity a kill is checked against.
    pub start_time: u64,
    /// Unix seconds when it started, when the boot time is known.
    pub started_at: Option<u64>,
    pub uid: Option<u32>,
    pub user: Option<String>,
    pub comm: String,
    pub cmdline: String,
    /// A kernel thread (PF_KTHREAD): it has no fds to walk.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kernel_thread: bool,
    /// It is exiting (PF_EXITING): its files are closed or closing, and the driver may still be freeing
    /// its GPU memory, which NVML charges it until done. Not another program on a reused PID.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exiting: bool,
    /// Its fd table could not be read (permissions): whether it holds a GPU is unknown.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fds_unreadable: bool,
    /// The inode of a pidfd on it (pidfs, Linux 6.9+): unique per process for the whole boot, so a PID
    /// reused within one clock tick is still told apart. Read for GPU holders and listed PIDs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pidfs_ino: Option<u64>,
    /// Where it sleeps in the kernel (`/proc/PID/wchan`), read for processes in state D.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wchan: Option<String>,
    /// Its PID in the innermost PID namespace it lives in (NSpid), when that differs: a container's own
    /// name for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_pid: Option<u32>,
    /// Its cgroup path (`/proc/PID/cgroup`: the v2 line, or the v1 line that names its job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The job it belongs to, from its cgroup: a Slurm job, a pod, a container, a unit, a `gpusweep run`
    /// job. `null` where none (or where the cgroup could not be read).
    #[serde(default)]
    pub job: Option<super::job::Job>,
}

impl Proc {
    /// The command line for people, or `[comm]` for kernel threads and zombies whose cmdline is gone.
    /// Escaped: anyone can put terminal control sequences in their argv.
    pub fn display_cmd(&self) -> String {
        if self.cmdline.is_empty() {
            format!("[{}]", super::escape::escape(&self.comm))
        } else {
            super::escape::escape(&self.cmdline).into_owned()
        }
    }
}

/// A live process with a descriptor open on a GPU device file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Holder {
    pub pid: u32,
    /// GPU indices whose `/dev/nvidiaN` it has open.
    pub gpus: Vec<u32>,
    /// Distinct device files it has open.
    pub devices: Vec<String>,
    pub fd_count: u32,
    /// nvidia-persistenced, nvidia-smi, DCGM, monitors, gpusweep itself: never a leak, never swept.
    pub benign: bool,
    /// It runs a program the host's config declares keeps GPU memory on purpose (`[keep] programs`: a GPU
    /// memory service that outlives its workers): shown, never swept, never a leak, never waited for.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kept: bool,
    /// Benign or kept by the host's own config (not the built-in list of monitors): what it does with its
    /// GPU is declared, so a GPU it holds busy is no leftover.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub declared: bool,
}

/// A process that would make a GPU reset (`nvidia-smi -r`) or a MIG destroy fail "in use": it has the GPU's
/// device node, or a control node, open. Benign ones are blockers too (the persistence daemon, DCGM's host
/// engine, a display server refuse a reset as surely as a job does).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ResetBlocker {
    pub pid: u32,
    /// What it runs (its comm, escaped where shown).
    pub program: String,
    /// The node that makes it a blocker: `/dev/nvidia3`, or a control node (`/dev/nvidiactl`).
    pub node: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub benign: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ShmInfo {
    /// /dev/shm statvfs, bytes.
    pub total: Option<u64>,
    pub used: Option<u64>,
    pub free: Option<u64>,
    pub segments: Vec<ShmSegment>,
    /// SysV limits; `null` with `shmmax_unlimited`/`shmall_unlimited` set where the kernel's value is past
    /// 2^53 (its default, 2^64 - 2^24, means "no limit", and no JSON reader holds it exactly).
    pub shmmax: Option<u64>,
    pub shmall: Option<u64>,
    pub shmmni: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shmmax_unlimited: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shmall_unlimited: bool,
    pub sysv_segments: Vec<SysvSegment>,
    /// The directory read: `/dev/shm`, or what `--shm-dir` named (a container may mount the host's
    /// elsewhere). Absent from older agents, whose directory was `/dev/shm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    /// Pods' memory-backed volumes on this node (a Kubernetes `emptyDir` with `medium: Memory`, where NCCL
    /// and sglang keep their segments in place of the host's /dev/shm), each with the GPU stack's files in it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<PodShm>,
    /// Pods' volumes left unread past the bounds: no absence of leftovers is said of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_unread: Option<String>,
}

/// One pod's memory-backed volume and the GPU stack's files in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PodShm {
    /// The pod's UID (the kubelet's directory for it).
    pub pod_uid: String,
    /// The pod's host name as the kubelet wrote it in the pod's `etc-hosts` (its name, unless the pod sets
    /// `hostname`); `None` where it could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The volume's name.
    pub volume: String,
    /// Where it is mounted on the node.
    pub dir: String,
    pub segments: Vec<ShmSegment>,
}

impl PodShm {
    /// "pod web-0 (uid 3f2a…), volume dshm".
    pub fn describe(&self) -> String {
        format!(
            "pod {} (uid {}), volume {}",
            self.pod.as_deref().unwrap_or("?"),
            self.pod_uid,
            self.volume
        )
    }
}

/// The largest integer every JSON reader holds exactly (JavaScript's, jq 1.6's): 2^53 - 1.
pub(crate) const JSON_SAFE_MAX: u64 = (1 << 53) - 1;

/// A kernel limit as a reading carries it: the number where a JSON reader holds it exactly, else `None`
/// and `true` (past 2^53 a limit is "none": the kernel's defaults are near 2^64).
pub fn limit(v: Option<u64>) -> (Option<u64>, bool) {
    match v {
        Some(n) if n > JSON_SAFE_MAX => (None, true),
        other => (other, false),
    }
}

/// Where the shared-memory directory is when a reading does not say.
pub const DEFAULT_SHM_DIR: &str = "/dev/shm";

/// A file's path in the shared-memory directory `dir` (`/dev/shm` when not said).
pub fn shm_path(dir: Option<&str>, name: &str) -> String {
    format!(
        "{}/{name}",
        dir.unwrap_or(DEFAULT_SHM_DIR).trim_end_matches('/')
    )
}

impl ShmInfo {
    /// The path of one of its files, in the directory it was read from.
    pub fn path_of(&self, name: &str) -> String {
        shm_path(self.dir.as_deref(), name)
    }
}

/// A file in /dev/shm whose name marks it as GPU-stack state (nccl-*, torch_*, psm_*, sem.*).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ShmSegment {
    pub name: String,
    pub bytes: u64,
    /// Seconds since last modification.
    pub age_s: Option<u64>,
    /// Live PIDs that have it open or mapped; `None` when that could not be checked.
    pub users: Option<Vec<u32>>,
    /// Device and inode (never following a symlink): what a removal is checked against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ino: Option<u64>,
    /// Not a plain file (a symlink, directory, socket...): never removed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub special: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SysvSegment {
    pub shmid: u64,
    pub bytes: u64,
    pub creator_pid: u32,
    pub attached: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    Ghost,
    HiddenHolder,
    Residual,
    Orphan,
    Zombie,
    ShmLeftover,
    SmemLimit,
    /// NVML lists a PID that this PID namespace cannot see (running inside a container).
    NotVisible,
    /// A GPU holder in state D: no signal ends it until its I/O returns.
    Unkillable,
    /// A process of a job that is over (its `gpusweep run` supervisor or its Slurm step is gone) still
    /// holds a GPU.
    OrphanedJob,
    /// A job's rank ended (exited, zombie, stuck in D) while its other ranks still hold GPU memory.
    LostRank,
    /// While a job loads, one rank's memory lags its peers' median past the margin and window.
    Straggler,
    /// A GPU kept busy (utilization at or over the threshold) through the confirm window while no process is
    /// listed on it and none has it open: a kernel left running by a job that is gone.
    BusyWithoutHolder,
    /// A GPU not ready for a launch whatever its memory says: an XID that needs a reset was seen, or the
    /// driver asks for a reset or a reboot.
    NeedsReset,
}

impl FindingKind {
    /// Every kind, in the order metrics and `--help` list them.
    pub const ALL: [FindingKind; 14] = [
        FindingKind::Ghost,
        FindingKind::HiddenHolder,
        FindingKind::Residual,
        FindingKind::Orphan,
        FindingKind::Zombie,
        FindingKind::ShmLeftover,
        FindingKind::SmemLimit,
        FindingKind::NotVisible,
        FindingKind::Unkillable,
        FindingKind::OrphanedJob,
        FindingKind::LostRank,
        FindingKind::Straggler,
        FindingKind::BusyWithoutHolder,
        FindingKind::NeedsReset,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::Ghost => "ghost",
            FindingKind::HiddenHolder => "hidden_holder",
            FindingKind::Residual => "residual",
            FindingKind::Orphan => "orphan",
            FindingKind::Zombie => "zombie",
            FindingKind::ShmLeftover => "shm_leftover",
            FindingKind::SmemLimit => "smem_limit",
            FindingKind::NotVisible => "not_visible",
            FindingKind::Unkillable => "unkillable",
            FindingKind::OrphanedJob => "orphaned_job",
            FindingKind::LostRank => "lost_rank",
            FindingKind::Straggler => "straggler",
            FindingKind::BusyWithoutHolder => "busy_without_holder",
            FindingKind::NeedsReset => "needs_reset",
        }
    }

    /// A leftover that makes a GPU (or a MIG instance) leak rather than merely be in use: memory or work no
    /// live listed process explains.
    pub fn is_leftover(self) -> bool {
        matches!(
            self,
            FindingKind::Ghost
                | FindingKind::Residual
                | FindingKind::HiddenHolder
                | FindingKind::BusyWithoutHolder
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Leak,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub severity: Severity,
    pub host: String,
    pub gpu: Option<u32>,
    pub pid: Option<u32>,
    pub bytes: Option<u64>,
    /// One line a tired operator understands.
    pub detail: String,
    /// What to do about it.
    pub action: String,
    /// The process to act on, when it is not `pid` itself (a zombie's parent, a ghost's hidden holder).
    pub target_pid: Option<u32>,
    /// The MIG instance of `gpu` it is about (its GPU instance id), on a GPU in MIG mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance: Option<u32>,
    /// The /dev/shm file it is about (shm leftovers), by name and identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<FileRef>,
    /// Seen to appear less than the confirm window ago while the host was watched: said one step lower
    /// (every process passes through some findings for a moment) until it lasts; this is the severity it
    /// then has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirms_as: Option<Severity>,
}

/// A file a finding is about: its name, and the device and inode that tell it from another of that name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FileRef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ino: Option<u64>,
}

/// What a finding is about, typed: the same finding in two readings is about the same subject.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Subject {
    pub kind: FindingKind,
    pub gpu: Option<u32>,
    pub pid: Option<u32>,
    pub target_pid: Option<u32>,
    pub file: Option<FileRef>,
    pub gpu_instance: Option<u32>,
}

impl Finding {
    pub fn subject(&self) -> Subject {
        Subject {
            kind: self.kind,
            gpu: self.gpu,
            pid: self.pid,
            target_pid: self.target_pid,
            file: self.file.clone(),
            gpu_instance: self.gpu_instance,
        }
    }
}

/// A kill target: a PID is only ever signalled together with the start time it had when it was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Target {
    pub pid: u32,
    pub start_time: u64,
}

/// What a GPU's gauges read: they move at every reading of a busy GPU without saying anything new about who
/// holds its memory. A reading that differs from the last only in these travels as them alone.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Gauges {
    pub utilization: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    /// Where read: they move with every reading, like the gauges, and are refreshed with them. Not sent
    /// on event streams (a client reads the serve's `/metrics` for them).
    #[serde(skip)]
    pub counters: Option<Box<Counters>>,
}

/// Equal when what an event stream carries of them is: the counters move at every reading and travel only
/// in-process.
impl PartialEq for Gauges {
    fn eq(&self, b: &Gauges) -> bool {
        (self.utilization, self.temperature_c, self.power_mw)
            == (b.utilization, b.temperature_c, b.power_mw)
    }
}

impl Eq for Gauges {}

impl Gauges {
    /// Take what a later reading said of this GPU: its gauges, and its counters where it read them.
    pub fn take_from(&mut self, later: &Gauges) {
        (self.utilization, self.temperature_c, self.power_mw) =
            (later.utilization, later.temperature_c, later.power_mw);
        if later.counters.is_some() {
            self.counters.clone_from(&later.counters);
        }
    }
}

/// The gauges a reading that said the same carries, each by its GPU's position in the reading: every GPU's,
/// only those that moved since the last said, or none (as before). They travel as said and are put onto what
/// each holder keeps: copying every GPU's gauges on for each of ten thousand readings a second, where one GPU
/// of eight moved, was a tenth of a fleet client's time. A position the reading does not have is the
/// sender's mistake: left out.
///
/// Up to two GPUs' are held inline: a quiet host's reading says one GPU's at most, ten thousand a second in a
/// fleet client, each of which was a heap block made on the stream's thread and freed on the front end's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaidGauges(SaidList);

/// Gauges by position, as said; a few inline.
pub type SaidList = smallvec::SmallVec<[(u32, Gauges); 2]>;

impl SaidGauges {
    /// Every GPU's, in order.
    pub fn every(all: Vec<Gauges>) -> SaidGauges {
        SaidGauges((0..).zip(all).collect())
    }

    /// Only these GPUs', by position.
    pub fn moved(moved: Vec<(u32, Gauges)>) -> SaidGauges {
        SaidGauges(moved.into_iter().collect())
    }

    /// As an event carries them: every GPU's (`gauges`), else those that moved (`moved`), else none.
    pub fn from_wire(all: Option<Vec<Gauges>>, moved: Option<SaidList>) -> SaidGauges {
        match (all, moved) {
            (Some(all), _) => SaidGauges::every(all),
            (None, Some(moved)) => SaidGauges(moved),
            (None, None) => SaidGauges::default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each GPU's said, by position.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &Gauges)> {
        self.0
            .iter()
            .filter_map(|(i, g)| Some((usize::try_from(*i).ok()?, g)))
    }

    /// Put onto `held`, each GPU's by its position.
    pub fn put_onto(&self, held: &mut [Gauges]) {
        for (i, g) in self.iter() {
            if let Some(h) = held.get_mut(i) {
                h.take_from(g);
            }
        }
    }

    /// Put onto the gauges kept beside `reading` (every GPU's, made from the reading's own the first time
    /// some are said; empty until then): the reading itself stays as it was judged, shared.
    pub fn put_beside(&self, kept: &mut Vec<Gauges>, reading: &HostSnapshot) {
        if self.is_empty() {
            return;
        }
        if kept.is_empty() {
            *kept = reading.gauges();
        }
        self.put_onto(kept);
    }

    /// These, then `later`: where both say a GPU, the later.
    #[must_use]
    pub fn then(mut self, later: SaidGauges) -> SaidGauges {
        if self.0.is_empty() {
            return later;
        }
        for (i, g) in later.0 {
            match self.0.iter_mut().find(|(j, _)| *j == i) {
                Some(slot) => slot.1.take_from(&g),
                None => self.0.push((i, g)),
            }
        }
        self
    }
}

/// What dcgm-exporter's default counters say that NVML can give without DCGM, in its units. `None`: not read
/// (the part or driver does not support it), never 0.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub memory_temp_c: Option<u32>,
    /// Since the driver was loaded, millijoules.
    pub energy_mj: Option<u64>,
    pub pcie_replays: Option<u64>,
    /// Percent of time the memory (copy engine) was busy.
    pub mem_copy_util: Option<u32>,
    pub enc_util: Option<u32>,
    pub dec_util: Option<u32>,
    pub remapped_rows_correctable: Option<u64>,
    pub remapped_rows_uncorrectable: Option<u64>,
    pub row_remap_failure: Option<bool>,
    /// GPM, between this reading and the last (ratios 0..1, bytes per second).
    pub gr_engine_active: Option<f64>,
    pub tensor_active: Option<f64>,
    pub dram_active: Option<f64>,
    pub pcie_tx_bytes_per_s: Option<f64>,
    pub pcie_rx_bytes_per_s: Option<f64>,
    /// Whether the GPU gives GPM's activity ratios at all (`false`: before Hopper, MIG, a driver without
    /// GPM): what tells "no ratios yet" from "never any".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpm_supported: Option<bool>,
}

impl Gpu {
    /// Take what a later reading said of this GPU's gauges (its counters where it read them).
    pub fn take_gauges(&mut self, v: &Gauges) {
        (self.utilization, self.temperature_c, self.power_mw) =
            (v.utilization, v.temperature_c, v.power_mw);
        if v.counters.is_some() {
            self.counters.clone_from(&v.counters);
        }
    }

    pub fn gauges(&self) -> Gauges {
        Gauges {
            utilization: self.utilization,
            temperature_c: self.temperature_c,
            power_mw: self.power_mw,
            counters: self.counters.clone(),
        }
    }
}

/// A label made safe in place: its control and bidi characters written as escapes.
fn defang(s: &mut String) {
    if let std::borrow::Cow::Owned(e) = super::escape::escape(s) {
        *s = e;
    }
}

fn defang_opt(s: &mut Option<String>) {
    if let Some(s) = s {
        defang(s);
    }
}

impl HostSnapshot {
    /// Every label of a reading that a host (a remote agent, a serve, a driver) chose, with its control and
    /// bidi characters escaped, once, where it enters: the driver version, GPU names, UUIDs, buses and
    /// capabilities, users, process names and jobs, device paths, errors. Command lines stay whole (they
    /// are escaped wherever shown: a kill's record names them as they are), and so do `/dev/shm` names (a
    /// removal needs the real one).
    pub fn escape_labels(&mut self) {
        defang_opt(&mut self.error);
        defang_opt(&mut self.gpu_error);
        defang_opt(&mut self.driver_version);
        defang_opt(&mut self.live_url);
        for g in &mut self.gpus {
            defang_opt(&mut g.name);
            defang_opt(&mut g.recovery_action);
            defang_opt(&mut g.mig_error);
            for m in &mut g.mig {
                defang_opt(&mut m.profile);
                defang_opt(&mut m.uuid);
                defang_opt(&mut m.error);
            }
            for b in &mut g.reset_blockers {
                defang(&mut b.program);
                defang(&mut b.node);
            }
            defang_opt(&mut g.uuid);
            defang_opt(&mut g.pci_bus_id);
            defang_opt(&mut g.compute_capability);
            defang_opt(&mut g.error);
            for p in &mut g.processes {
                defang_opt(&mut p.name);
            }
        }
        for p in &mut self.processes {
            defang(&mut p.comm);
            defang_opt(&mut p.user);
            defang_opt(&mut p.wchan);
            defang_opt(&mut p.cgroup);
            if let Some(j) = &mut p.job {
                j.escape_labels();
            }
        }
        for h in &mut self.holders {
            h.devices.iter_mut().for_each(defang);
        }
        for f in &mut self.findings {
            defang(&mut f.detail);
            defang(&mut f.action);
        }
    }

    /// Each GPU's gauges, in order.
    pub fn gauges(&self) -> Vec<Gauges> {
        self.gpus.iter().map(Gpu::gauges).collect()
    }

    /// Let go of what its lists hold beyond their items. A reading parsed from JSON grows each list by
    /// doubling (a GPU's one reset blocker takes room for four, nine findings room for sixteen): a kept
    /// reading of a 10,000-host client held about a fifth more than it said.
    pub fn shrink_to_fit(&mut self) {
        for g in &mut self.gpus {
            g.processes.shrink_to_fit();
            g.reset_blockers.shrink_to_fit();
            for i in &mut g.mig {
                i.processes.shrink_to_fit();
            }
            g.mig.shrink_to_fit();
        }
        self.gpus.shrink_to_fit();
        self.processes.shrink_to_fit();
        for h in &mut self.holders {
            h.gpus.shrink_to_fit();
            h.devices.shrink_to_fit();
        }
        self.holders.shrink_to_fit();
        self.zombies.shrink_to_fit();
        self.missing_features.shrink_to_fit();
        self.findings.shrink_to_fit();
        self.acts.shrink_to_fit();
        for j in &mut self.jobs {
            j.ranks.shrink_to_fit();
            j.helpers.shrink_to_fit();
            j.gpus.shrink_to_fit();
        }
        self.jobs.shrink_to_fit();
        if let Some(shm) = &mut self.shm {
            shm.segments.shrink_to_fit();
            shm.sysv_segments.shrink_to_fit();
            shm.pods.shrink_to_fit();
        }
    }

    /// A fresh reading that said the same but for its gauges: take its time and its gauges (every GPU's).
    pub fn refresh(&mut self, taken_at_ms: u64, gauges: &[Gauges]) {
        self.taken_at_ms = self.taken_at_ms.max(taken_at_ms);
        if gauges.len() == self.gpus.len() {
            for (g, v) in self.gpus.iter_mut().zip(gauges) {
                g.take_gauges(v);
            }
        }
    }

    /// A fresh reading that said the same but for its gauges: take its time and the gauges it said.
    pub fn refresh_said(&mut self, taken_at_ms: u64, said: &SaidGauges) {
        self.taken_at_ms = self.taken_at_ms.max(taken_at_ms);
        for (i, v) in said.iter() {
            if let Some(g) = self.gpus.get_mut(i) {
                g.take_gauges(v);
            }
        }
    }

    /// Its memory as numbers: each GPU's used bytes, and per GPU what NVML charges each listed process (what a
    /// `memory` event carries, and what `put_memory` puts back).
    pub fn memory_numbers(&self) -> (Vec<Option<u64>>, Vec<Vec<Option<u64>>>) {
        let used = self.gpus.iter().map(|g| g.memory.used).collect();
        let charged = self
            .gpus
            .iter()
            .map(|g| g.processes.iter().map(|p| p.used_bytes).collect())
            .collect();
        (used, charged)
    }

    /// Whether these numbers have this reading's shape: one per GPU, one per listed process.
    pub fn memory_fits(&self, used: &[Option<u64>], charged: &[Vec<Option<u64>>]) -> bool {
        self.gpus.len() == used.len()
            && self.gpus.len() == charged.len()
            && self
                .gpus
                .iter()
                .zip(charged)
                .all(|(g, c)| g.processes.len() == c.len())
    }

    /// Whether these numbers are the ones this reading says (of its shape).
    pub fn memory_is(&self, used: &[Option<u64>], charged: &[Vec<Option<u64>>]) -> bool {
        self.memory_fits(used, charged)
            && self.gpus.iter().zip(used).zip(charged).all(|((g, u), c)| {
                g.memory.used == *u && g.processes.iter().zip(c).all(|(p, b)| p.used_bytes == *b)
            })
    }

    /// These numbers put onto this reading, taken at `taken_at_ms`: `false`, and nothing
    /// changed, when its shape is not this reading's (one number per GPU, one per listed process).
    pub fn put_memory(
        &mut self,
        taken_at_ms: u64,
        used: &[Option<u64>],
        charged: &[Vec<Option<u64>>],
    ) -> bool {
        if !self.memory_fits(used, charged) {
            return false;
        }
        for ((g, u), c) in self.gpus.iter_mut().zip(used).zip(charged) {
            g.memory.used = *u;
            for (p, b) in g.processes.iter_mut().zip(c) {
                p.used_bytes = *b;
            }
        }
        self.taken_at_ms = taken_at_ms;
        true
    }

    pub fn proc(&self, pid: u32) -> Option<&Proc> {
        self.processes.iter().find(|p| p.pid == pid)
    }

    pub fn holder(&self, pid: u32) -> Option<&Holder> {
        self.holders.iter().find(|h| h.pid == pid)
    }
    pub fn gpu(&self, index: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.index == index)
    }
    pub fn lacks(&self, f: Feature) -> bool {
        self.missing_features.contains(&f)
    }
    /// Whether holders were scanned at all (agentless hosts may not have /proc access).
    pub fn holders_known(&self) -> bool {
        !self.lacks(Feature::Holders)
    }
    /// The first finding of `kind`, if this reading has one.
    pub fn finding_of(&self, kind: FindingKind) -> Option<&Finding> {
        self.findings.iter().find(|f| f.kind == kind)
    }
    /// Bytes NVML charges this PID over every GPU; `None` when it is listed nowhere or no charge is known.
    pub fn charged(&self, pid: u32) -> Option<u64> {
        let v: Vec<u64> = self
            .gpus
            .iter()
            .flat_map(|g| g.processes.iter())
            .filter(|l| l.pid == pid)
            .filter_map(|l| l.used_bytes)
            .collect();
        if v.is_empty() {
            None
        } else {
            Some(v.iter().sum())
        }
    }
    /// GPU indices NVML lists this PID on.
    pub fn listed_gpus(&self, pid: u32) -> Vec<u32> {
        self.gpus
            .iter()
            .filter(|g| g.processes.iter().any(|p| p.pid == pid))
            .map(|g| g.index)
            .collect()
    }
}

/// Unix time in milliseconds (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Moved;

    /// `FindingKind::ALL` holds every kind once: each kind's place in it, told by a match with no wildcard
    /// (a kind added later fails to compile here until it has one).
    #[test]
    fn every_finding_kind_is_in_all() {
        let place = |k: FindingKind| match k {
            FindingKind::Ghost => 0,
            FindingKind::HiddenHolder => 1,
            FindingKind::Residual => 2,
            FindingKind::Orphan => 3,
            FindingKind::Zombie => 4,
            FindingKind::ShmLeftover => 5,
            FindingKind::SmemLimit => 6,
            FindingKind::NotVisible => 7,
            FindingKind::Unkillable => 8,
            FindingKind::OrphanedJob => 9,
            FindingKind::LostRank => 10,
            FindingKind::Straggler => 11,
            FindingKind::BusyWithoutHolder => 12,
            FindingKind::NeedsReset => 13,
        };
        for (i, k) in FindingKind::ALL.into_iter().enumerate() {
            assert_eq!(place(k), i, "{}", k.as_str());
        }
    }

    /// Gauges said by position go onto what is held, GPU by GPU: every GPU's, only those that moved (the
    /// others kept), none (as before); a position the reading does not have is left out, and readings not
    /// taken yet become one, the later winning where both say a GPU.
    #[test]
    fn gauges_said_by_position_go_onto_those_held() {
        let g = |u: u32| Gauges {
            utilization: Some(u),
            ..Default::default()
        };
        let mut held = vec![g(0), g(1), g(2)];
        SaidGauges::every(vec![g(10), g(11), g(12)]).put_onto(&mut held);
        assert_eq!(held, [g(10), g(11), g(12)]);
        SaidGauges::default().put_onto(&mut held);
        assert_eq!(held, [g(10), g(11), g(12)], "none said: as before");
        SaidGauges::moved(vec![(1, g(70)), (9, g(99))]).put_onto(&mut held);
        assert_eq!(held, [g(10), g(70), g(12)], "position 9 is not the host's");
        let one = SaidGauges::moved(vec![(1, g(20))]).then(SaidGauges::moved(vec![(2, g(30))]));
        assert_eq!(one, SaidGauges::moved(vec![(1, g(20)), (2, g(30))]));
        let one = one.then(SaidGauges::moved(vec![(1, g(40))]));
        assert_eq!(
            one,
            SaidGauges::moved(vec![(1, g(40)), (2, g(30))]),
            "the later"
        );
        assert_eq!(SaidGauges::default().then(one.clone()), one);
        assert_eq!(
            SaidGauges::from_wire(Some(vec![g(5)]), Some(vec![(0, g(6))].into())),
            SaidGauges::every(vec![g(5)]),
            "every GPU's, where both came"
        );
        // A quiet host's one or two GPUs said, as the wire carries them, hold no heap block.
        let wire: SaidList = serde_json::from_str(
            r#"[[3,{"utilization":91,"temperature_c":61,"power_mw":538500}],[5,{"utilization":0}]]"#,
        )
        .expect("moved as sent");
        let said = SaidGauges::from_wire(None, Some(wire));
        assert!(!said.0.spilled(), "{said:?}");
        assert_eq!(
            said.iter()
                .map(|(i, g)| (i, g.utilization))
                .collect::<Vec<_>>(),
            [(3, Some(91)), (5, Some(0))]
        );
        assert_eq!(
            serde_json::to_string(&said.0).expect("json"),
            r#"[[3,{"utilization":91,"temperature_c":61,"power_mw":538500}],[5,{"utilization":0,"temperature_c":null,"power_mw":null}]]"#,
            "the wire's form, as before"
        );
        // A reading takes them with its time; counters only where read.
        let mut snap = HostSnapshot {
            taken_at_ms: 1,
            gpus: vec![Gpu {
                counters: Some(Box::default()),
                ..Default::default()
            }],
            ..Default::default()
        };
        snap.refresh_said(5, &SaidGauges::moved(vec![(0, g(80))]));
        assert_eq!((snap.taken_at_ms, snap.gpus[0].utilization), (5, Some(80)));
        assert!(snap.gpus[0].counters.is_some(), "not read again: kept");
    }

    /// A reading parsed from JSON holds room for more than it says until shrunk; then none.
    #[test]
    fn a_shrunk_reading_holds_what_it_says() {
        let read = HostSnapshot {
            gpus: (0..3)
                .map(|i| Gpu {
                    index: i,
                    reset_blockers: vec![ResetBlocker::default()],
                    ..Default::default()
                })
                .collect(),
            zombies: (1..=9).collect(),
            ..Default::default()
        };
        let mut snap: HostSnapshot =
            serde_json::from_str(&serde_json::to_string(&read).unwrap_or_default())
                .unwrap_or_default();
        let slack = |s: &HostSnapshot| {
            (s.zombies.capacity() - s.zombies.len())
                + s.gpus
                    .iter()
                    .map(|g| g.reset_blockers.capacity() - g.reset_blockers.len())
                    .sum::<usize>()
        };
        assert!(slack(&snap) > 0, "parsed with room to spare");
        snap.shrink_to_fit();
        assert_eq!(slack(&snap), 0);
        assert_eq!(snap, read);
    }

    fn snap() -> HostSnapshot {
        HostSnapshot {
            host: "h".into(),
            taken_at_ms: 1,
            gpus: vec![Gpu {
                index: 0,
                memory: Memory {
                    used: Some(MIB),
                    total: Some(80 * 1024 * MIB),
                    reserved: None,
                },
                utilization: Some(10),
                ..Default::default()
            }],
            findings: vec![Finding {
                kind: FindingKind::ShmLeftover,
                severity: Severity::Warning,
                host: "h".into(),
                gpu: None,
                pid: None,
                bytes: Some(1),
                detail: "/dev/shm/nccl-1 (1 MiB, 5s old)".into(),
                action: "rm".into(),
                target_pid: None,
                gpu_instance: None,
                file: None,
                confirms_as: None,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn readings_say_the_same_whatever_their_time_gauges_and_wording() {
        let a = snap();
        let mut b = snap();
        b.taken_at_ms = 2;
        b.gpus[0].utilization = Some(99);
        b.findings[0].detail = "/dev/shm/nccl-1 (1 MiB, 6s old)".into();
        assert!(a.diff(&b).is_nothing());
        let mut c = snap();
        c.gpus[0].memory.used = Some(2 * MIB);
        assert!(!a.diff(&c).is_nothing(), "memory is news");
        let mut c = snap();
        c.gpus[0].processes.push(ListedProcess {
            pid: 7,
            ..Default::default()
        });
        assert!(!a.diff(&c).is_nothing(), "a listed process is news");
        let mut c = snap();
        c.findings[0].bytes = Some(2);
        assert!(!a.diff(&c).is_nothing(), "a finding's facts are news");
        let mut r = snap();
        r.refresh(5, &b.gauges());
        assert_eq!((r.taken_at_ms, r.gpus[0].utilization), (5, Some(99)));
        r.refresh(3, &[]);
        assert_eq!(r.taken_at_ms, 5, "time never runs back");
    }

    #[test]
    fn a_reading_that_moved_only_its_memory_takes_the_numbers_of_the_next_in_its_order() {
        let mut a = snap();
        a.gpus[0].processes.push(ListedProcess {
            pid: 7,
            used_bytes: Some(MIB),
            ..Default::default()
        });
        let mut b = a.clone();
        b.gpus[0].memory.used = Some(5 * MIB);
        b.gpus[0].processes[0].used_bytes = Some(4 * MIB);
        assert!(a.diff(&b).reading == Moved::Memory && a.diff(&b).input_moved(false));
        let mut c = b.clone();
        c.gpus[0].processes[0].pid = 8;
        assert!(
            a.diff(&c).reading == Moved::More,
            "another process is no memory move"
        );
        let mut c = b.clone();
        c.gpus[0].memory.total = Some(MIB);
        assert!(
            a.diff(&c).reading == Moved::More,
            "another total is another GPU"
        );
        let mut put = a.clone();
        assert!(put.put_memory(9, &[Some(5 * MIB)], &[vec![Some(4 * MIB)]]));
        assert_eq!((put.taken_at_ms, &put.gpus), (9, &b.gpus));
        // Numbers of another shape are not taken at all.
        let mut wrong = a.clone();
        assert!(!wrong.put_memory(9, &[Some(5 * MIB)], &[vec![]]));
        assert!(!wrong.put_memory(9, &[], &[]));
        assert_eq!(wrong, a);
    }
}
