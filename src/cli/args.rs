//! Command-line contract (DESIGN's names). Every flag that has an environment variable says so in --help.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::core::parse::duration_arg;
use crate::core::signal::Sig;
use crate::core::smem::{Dtype, Tile};
use crate::runtime::Overrides;

/// A `--gpus` list as one value (clap would take a bare `Vec` for repeated values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuList(pub Vec<crate::core::parse::GpuRef>);

/// clap value parser for GPU lists: indices, ranges and UUIDs.
fn gpu_list_arg(s: &str) -> Result<GpuList, String> {
    crate::core::parse::gpu_refs_arg(s).map(GpuList)
}

fn dtype_arg(s: &str) -> Result<Dtype, String> {
    Dtype::parse(s).ok_or_else(|| format!("unknown dtype {s:?} (bf16, fp16, fp8, fp4, fp32)"))
}

fn tile_arg(s: &str) -> Result<Tile, crate::core::smem::TileError> {
    Tile::parse(s)
}

/// The most a tolerance may be: a petabyte of GPU memory is more than any host has.
const MAX_TOLERANCE_MIB: u64 = 1 << 30;

fn mib_arg(s: &str) -> Result<u64, String> {
    let n: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a whole number of MiB (e.g. 0, 512)"))?;
    if n > MAX_TOLERANCE_MIB {
        return Err(format!(
            "{n} MiB is more than any GPU has (at most {MAX_TOLERANCE_MIB})"
        ));
    }
    Ok(n)
}

fn signal_arg(s: &str) -> Result<Sig, String> {
    s.parse::<Sig>().map_err(|e| e.to_string())
}

pub const EXIT_CODES: &str = "\
Exit codes:
  0  success; `wait`, `sweep`: every chosen GPU of every host was read and
     is clean; `smem --tile`: the tile fits every capability shown
  1  `wait`/`sweep` timed out with memory still held (the holders are
     printed); `sweep --no-wait`, `kill`: a target could not be signalled
     (refused, failed, still there after KILL); `smem --tile`: it does not fit
  2  error: bad arguments or config; a host that could not be read; GPUs that
     cannot be read (no driver) unless --no-nvml; a GPU a host lacks; the
     action was not confirmed; --readonly refused it
  129/130/143  ended by HUP, INT or TERM (128 + the signal)

Findings:
  ghost          NVML charges memory to a PID that is gone: kill the holder
                 it names
  hidden_holder  a live process holds the GPU, unlisted, and memory is
                 unexplained: kill it
  residual       used memory no live listed process accounts for: sweep it
  orphan         a GPU holder whose launcher died (reparented to PID 1): kill
                 it if its job is over
  orphaned_job   a GPU holder of a job that is over: `gpusweep sweep --job JOB`
  zombie         state Z, holds nothing: its parent (named) must reap it
  unkillable     a GPU holder in state D: no signal ends it until its I/O
                 returns
  shm_leftover   a /dev/shm nccl-*/torch_*/psm_*/sem.* file nobody has open
                 or mapped: `gpusweep shm clean`
  smem_limit     less shared memory per block than Hopper's 227 KB: check
                 tiles with `gpusweep smem`
  not_visible    a listed PID in another PID namespace: run gpusweep there";

#[derive(Debug, Parser)]
#[command(
    name = "gpusweep",
    version,
    about = "Who holds this GPU memory, and is it gone yet?",
    long_about = "Watches GPU memory on one or many hosts, explains every MiB (which live process holds it, or that \
                  nobody does), kills leftovers precisely, and re-watches until every GPU reads zero.\n\n\
                  With no subcommand it opens the terminal UI. Where no NVIDIA driver exists and no hosts are \
                  named, the TUI opens the simulated demo cluster (--local watches this host's holders, zombies \
                  and /dev/shm instead); the subcommands always read what they are asked to.",
    after_help = EXIT_CODES
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Args, Clone, Default)]
pub struct Global {
    /// Hosts: [user@]host[:port], comma lists, ranges (node[01-16]), @group, `local`, or cmd:COMMAND.
    /// Repeatable. Default: this host.
    #[arg(
        help_heading = "Global options",
        long,
        global = true,
        env = "GPUSWEEP_HOSTS"
    )]
    pub hosts: Vec<String>,
    /// File with one host spec per line (# comments).
    #[arg(
        help_heading = "Global options",
        long,
        global = true,
        value_name = "FILE"
    )]
    pub hostfile: Option<PathBuf>,
    /// The simulated cluster (gpu-a warming up, gpu-b after a pkill, gpu-c Blackwell). --hosts picks among them.
    #[arg(help_heading = "Global options", long, global = true)]
    pub demo: bool,
    /// Poll interval (e.g. 500ms, 2s). Default 1s.
    #[arg(help_heading = "Global options", long, global = true, env = "GPUSWEEP_INTERVAL", value_name = "DUR", value_parser = duration_arg, allow_hyphen_values = true)]
    pub interval: Option<Duration>,
    /// Device files that make a process a holder (repeatable). Default /dev/nvidia*.
    #[arg(
        help_heading = "Global options",
        long = "device-glob",
        global = true,
        value_name = "GLOB"
    )]
    pub device_globs: Vec<String>,
    /// Config file. Default $GPUSWEEP_CONFIG or ~/.config/gpusweep/config.toml.
    #[arg(
        help_heading = "Global options",
        long,
        global = true,
        value_name = "FILE"
    )]
    pub config: Option<PathBuf>,
    /// TUI: watch this host even without an NVIDIA driver (otherwise the TUI opens the demo cluster there).
    #[arg(help_heading = "Global options", long, global = true)]
    pub local: bool,
    /// Do not load NVML: judge by holders, zombies and /dev/shm alone.
    #[arg(help_heading = "Global options", long, global = true)]
    pub no_nvml: bool,
    /// SSH: learn unknown host keys (like OpenSSH's accept-new). A changed key is always refused.
    #[arg(help_heading = "SSH options", long, global = true)]
    pub accept_new: bool,
    /// SSH: upload this binary to hosts that have no gpusweep (same architecture only).
    #[arg(help_heading = "SSH options", long, global = true)]
    pub deploy: bool,
    /// SSH: the command that starts the agent on remote hosts. Default "gpusweep agent".
    #[arg(
        help_heading = "SSH options",
        long,
        global = true,
        value_name = "CMD",
        env = "GPUSWEEP_REMOTE_COMMAND"
    )]
    pub remote_command: Option<String>,
    /// SSH: the ssh_config file to read. Default ~/.ssh/config.
    #[arg(help_heading = "SSH options", long, global = true, value_name = "FILE")]
    pub ssh_config: Option<PathBuf>,
    /// SSH: known_hosts file to check (and learn into). Default ~/.ssh/known_hosts (+ /etc/ssh/ssh_known_hosts).
    #[arg(help_heading = "SSH options", long, global = true, value_name = "FILE")]
    pub known_hosts: Option<PathBuf>,
    /// SSH: private key to try (repeatable), besides ssh-agent and ~/.ssh/id_*.
    #[arg(
        help_heading = "SSH options",
        long = "identity",
        short = 'i',
        global = true,
        value_name = "FILE"
    )]
    pub identities: Vec<PathBuf>,
    /// Where this host has no pidfd (old kernel, seccomp): signal with kill(2) right after re-checking the
    /// start time instead of refusing. A PID reused in that window could be hit; the audit log says so.
    #[arg(help_heading = "Global options", long, global = true)]
    pub kill_without_pidfd: bool,
    /// No kill, sweep or removal (their keys hidden in the TUI): for shared monitoring screens. Config: readonly.
    #[arg(help_heading = "Global options", long, global = true)]
    pub readonly: bool,
    /// TUI: append every timeline event to FILE as JSON lines (a session to replay or attach to a report).
    #[arg(
        help_heading = "Global options",
        long,
        global = true,
        value_name = "FILE"
    )]
    pub events: Option<PathBuf>,
    /// The shared-memory directory to watch and clean. Default /dev/shm. Config: shm_dir.
    #[arg(
        help_heading = "Global options",
        long,
        global = true,
        value_name = "DIR"
    )]
    pub shm_dir: Option<PathBuf>,
    /// snapshot, wait: read this host in-process even when a `gpusweep serve` answers on its socket.
    #[arg(help_heading = "Global options", long, global = true)]
    pub no_serve: bool,
    /// Seconds to wait for a host's first reading (1 to 86400). Default 10.
    #[arg(help_heading = "Global options", long, global = true, value_name = "SECS", allow_hyphen_values = true,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub connect_timeout: Option<u64>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// One reading of every host: GPUs, processes, holders, findings. A table, or --json.
    Snapshot {
        /// The documented JSON contract instead of a table.
        #[arg(long)]
        json: bool,
        /// Leave utilization, temperature and power unread on this host (N/A, and `gauges` in
        /// `missing_features`): the verdict alone, ~5 ms per GPU sooner when no serve runs here.
        #[arg(long)]
        no_gauges: bool,
    },
    /// Block until every chosen GPU is clean. Exit 0 clean, 1 timeout (naming what holds memory), 2 error.
    Wait {
        /// GPUs: indices, ranges and UUIDs (0,1,4-7,GPU-...). Default: all. A GPU a host lacks is an error.
        #[arg(long, value_name = "LIST", value_parser = gpu_list_arg)]
        gpus: Option<GpuList>,
        /// Clean means at most this many MiB used. Default 0.
        #[arg(long, env = "GPUSWEEP_TOLERANCE_MIB", value_name = "MIB", value_parser = mib_arg, allow_hyphen_values = true)]
        tolerance: Option<u64>,
        /// Give up after this long (e.g. 30s). Default: never.
        #[arg(long, value_name = "DUR", value_parser = duration_arg, allow_hyphen_values = true)]
        timeout: Option<Duration>,
        /// Poll interval while waiting.
        #[arg(long, value_name = "DUR", default_value = "100ms", value_parser = duration_arg, allow_hyphen_values = true)]
        poll: Duration,
        /// Only the GPUs this job's processes hold: a Slurm job (4711, slurm:4711.0), a pod or container ID
        /// (4 characters or more), a systemd unit, run:PID.
        #[arg(long, value_name = "JOB")]
        job: Option<String>,
    },
    /// Signal every holder of the chosen GPUs: TERM, a grace period, KILL; then wait until clean.
    Sweep {
        /// GPUs to sweep: indices, ranges and UUIDs (0,1,4-7,GPU-...). Default: all.
        #[arg(long, value_name = "LIST", value_parser = gpu_list_arg)]
        gpus: Option<GpuList>,
        /// Only this job's processes and the GPUs they hold (4711, slurm:4711.0, a container ID, run:PID).
        #[arg(long, value_name = "JOB")]
        job: Option<String>,
        /// Time between TERM and KILL.
        #[arg(long, value_name = "DUR", default_value = "10s", value_parser = duration_arg, allow_hyphen_values = true)]
        grace: Duration,
        /// Print the plan and do nothing.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask (required when stdin is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
        /// Do not wait for the GPUs to become clean afterwards.
        #[arg(long)]
        no_wait: bool,
        /// Give up waiting for clean after this long.
        #[arg(long, value_name = "DUR", default_value = "60s", value_parser = duration_arg, allow_hyphen_values = true)]
        timeout: Duration,
        /// Clean means at most this many MiB used. Default 0.
        #[arg(long, env = "GPUSWEEP_TOLERANCE_MIB", value_name = "MIB", value_parser = mib_arg, allow_hyphen_values = true)]
        tolerance: Option<u64>,
    },
    /// Signal chosen processes with the same safety as sweep.
    Kill {
        /// PIDs on the chosen host.
        #[arg(required_unless_present = "job", allow_negative_numbers = true)]
        pids: Vec<u32>,
        /// Every GPU process of this job (4711, slurm:4711.0, a container ID, run:PID), besides the PIDs.
        #[arg(long, value_name = "JOB")]
        job: Option<String>,
        /// The host the PIDs live on: the spec as typed in --hosts, or its label. Default: the only host.
        #[arg(long)]
        host: Option<String>,
        /// TERM, KILL, INT, HUP, ... or a number.
        #[arg(long, default_value = "TERM", value_parser = signal_arg)]
        signal: Sig,
        /// Wait this long for exit, then KILL. Default: do not wait.
        #[arg(long, value_name = "DUR", value_parser = duration_arg, allow_hyphen_values = true)]
        grace: Option<Duration>,
        /// Do not ask (required when stdin is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Shared-memory limits per compute capability, and whether a GEMM tile fits.
    Smem {
        /// Tile as MxNxK, e.g. 128x256x64.
        #[arg(long, value_parser = tile_arg)]
        tile: Option<Tile>,
        /// Element type of A and B: bf16, fp16, fp8, fp4, fp32.
        #[arg(long, default_value = "bf16", value_parser = dtype_arg)]
        dtype: Dtype,
        /// Pipeline stages wanted (1 to 64).
        #[arg(long, default_value_t = 2, allow_hyphen_values = true,
              value_parser = clap::value_parser!(u64).range(1..=64))]
        stages: u64,
        /// Bytes set aside for the epilogue (at most 16 MiB).
        #[arg(long, default_value_t = 0, allow_hyphen_values = true,
              value_parser = clap::value_parser!(u64).range(0..=16 * 1024 * 1024))]
        epilogue: u64,
        /// Compute capability (e.g. 12.0). Default: the GPUs of the chosen hosts, else every known one.
        #[arg(long)]
        cc: Option<String>,
        /// Limits and fits as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run COMMAND as a job that cannot leak: preflight, a cgroup (or a subreaper) of its own, every
    /// leftover ended when it ends, then wait until its GPUs read zero. Exits with COMMAND's status.
    #[command(
        after_help = "Containment: a cgroup v2 leaf under gpusweep's own cgroup where it may create one \
(root, or a delegated systemd user slice), ended with cgroup.kill; otherwise a process group with gpusweep as \
child subreaper, so double-forked workers are reparented to it, not PID 1. INT, TERM and HUP are forwarded to \
the job first. The supervisor shows as `gpusweep run [job PID ...]`: `pkill -f COMMAND` never hits it."
    )]
    Run {
        /// GPUs the job uses. Default: CUDA_VISIBLE_DEVICES, else all.
        #[arg(long, value_name = "LIST", value_parser = gpu_list_arg)]
        gpus: Option<GpuList>,
        /// Time between TERM and KILL for what is left of the job, and after a forwarded signal.
        #[arg(long, value_name = "DUR", default_value = "10s", value_parser = duration_arg, allow_hyphen_values = true)]
        grace: Duration,
        /// How long to wait for the job's GPUs to read zero after it ends.
        #[arg(long, value_name = "DUR", default_value = "60s", value_parser = duration_arg, allow_hyphen_values = true)]
        timeout: Duration,
        /// Start even if the GPUs are not clean or /dev/shm is short.
        #[arg(long)]
        no_preflight: bool,
        /// The command and its arguments (after --).
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Slurm Prolog=: exit 1, naming the holder (and drain the node), when the job's GPUs are not clean.
    Prolog(Gate),
    /// Slurm Epilog=: end the job's leftover processes, wait until its GPUs read zero; else exit 1 with a
    /// one-line reason and drain the node with it.
    Epilog(Gate),
    /// /dev/shm leftovers of the GPU stack (nccl-*, torch_*, psm_*, sem.*...).
    Shm {
        #[command(subcommand)]
        action: ShmAction,
    },
    /// Print a shell completion script: `gpusweep completions bash > ~/.local/share/bash-completion/completions/gpusweep`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff): `gpusweep man > ~/.local/share/man/man1/gpusweep.1`.
    Man,
    /// The node daemon: Prometheus metrics (dcgm-exporter's names), the JSON API and its event stream over
    /// HTTP, and a local socket that `snapshot` and `wait` use. Read-only over HTTP.
    #[command(after_help = SERVE_HELP)]
    Serve(ServeOpts),
    /// The remote end: JSON snapshots on stdout, one per line; commands on stdin.
    Agent {
        /// Which simulated host to serve with --demo.
        #[arg(long, default_value = "gpu-b")]
        demo_host: String,
    },
}

const SERVE_HELP: &str = "\
Endpoints (every one a GET; nothing over HTTP can signal or remove):
  /metrics          OpenMetrics: DCGM_FI_DEV_FB_USED/FREE/RESERVED (MiB, with
                    dcgm-exporter's labels) and gpusweep_* (clean, findings,
                    unexplained bytes, process memory, time to clean)
  /api/v1/snapshot  the JSON contract of `gpusweep snapshot --json`
  /api/v1/events    server-sent events: hello, snapshot, unchanged, event,
                    status; ?interval=DUR polls faster while open (>= 100ms)
  /healthz          200 ok, or 503 naming the host without a fresh reading
  /hosts/NAME/...   the same for one host of several (--demo)
The socket speaks the agent protocol; only root and the serve's own user may
signal through it. `gpusweep snapshot` and `wait` read a serve of this host
through it when one answers (--no-serve reads NVML in-process).";

/// `gpusweep serve`'s own flags.
#[derive(Debug, Args)]
pub struct ServeOpts {
    /// HTTP address. Default 127.0.0.1:9401 (loopback only; dcgm-exporter has 9400). [::]:9401 for every
    /// interface (then set --token-file).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<std::net::SocketAddr>,
    /// No HTTP: the local socket only.
    #[arg(long)]
    pub no_http: bool,
    /// The Unix socket. Default $GPUSWEEP_SOCKET, /run/gpusweep.sock for root, else
    /// $XDG_RUNTIME_DIR/gpusweep.sock.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// No Unix socket.
    #[arg(long)]
    pub no_socket: bool,
    /// Require `Authorization: Bearer TOKEN` (the file's first line, 16+ characters, mode 600) on every
    /// HTTP request but /healthz.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Serve HTTPS with this certificate chain (PEM); with --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// The job's GPUs and how long to give them; SLURM_JOB_ID names the job.
#[derive(Debug, Args)]
pub struct Gate {
    /// The job's GPUs. Default: SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES, else every GPU of the node.
    #[arg(long, value_name = "LIST", value_parser = gpu_list_arg)]
    pub gpus: Option<GpuList>,
    /// Epilog: time between TERM and KILL for the job's leftovers.
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = duration_arg, allow_hyphen_values = true)]
    pub grace: Duration,
    /// Epilog: how long the GPUs may take to read zero.
    #[arg(long, value_name = "DUR", default_value = "60s", value_parser = duration_arg, allow_hyphen_values = true)]
    pub timeout: Duration,
    /// Do not drain the node (scontrol) when not clean; only exit 1.
    #[arg(long)]
    pub no_drain: bool,
}

impl Gate {
    pub fn args(&self) -> crate::cli::slurm::GateArgs {
        crate::cli::slurm::GateArgs {
            gpus: self.gpus.clone().map(|g| g.0),
            grace: self.grace,
            timeout: self.timeout,
            drain: !self.no_drain,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum ShmAction {
    /// Remove the files no live process has open or mapped, on every chosen host, after a confirmation.
    /// Each is re-checked at removal (same inode, a plain file, still unused) and logged in the audit log.
    /// Exit 0 removed (or nothing to remove), 1 a file refused or failed, 2 a host unreadable or not confirmed.
    Clean {
        /// List what would be removed and remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask (required when stdin is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

impl Global {
    /// The flags as the runtime's settings take them.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            hosts: self.hosts.clone(),
            hostfile: self.hostfile.clone(),
            demo: self.demo,
            interval: self.interval,
            device_globs: self.device_globs.clone(),
            config: self.config.clone(),
            local: self.local,
            no_nvml: self.no_nvml,
            accept_new: self.accept_new,
            deploy: self.deploy,
            remote_command: self.remote_command.clone(),
            ssh_config: self.ssh_config.clone(),
            known_hosts: self.known_hosts.clone(),
            identities: self.identities.clone(),
            connect_timeout: self.connect_timeout,
            kill_without_pidfd: self.kill_without_pidfd,
            readonly: self.readonly,
            events: self.events.clone(),
            shm_dir: self.shm_dir.clone(),
            no_serve: self.no_serve,
        }
    }

    /// Hosts were named on the command line.
    pub fn hosts_named(&self) -> bool {
        !self.hosts.is_empty() || self.hostfile.is_some()
    }
}
