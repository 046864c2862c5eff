//! Everything a command needs, resolved from command line > environment > config file > defaults. Front ends
//! fill `Overrides` from their flags; nothing here knows about clap.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

use super::config::{self, Config, ConfigError};
use super::fleet::FleetOptions;
use gpusweep_act::AuditLog;
use gpusweep_analyze::AnalyzeOptions;
use gpusweep_core::host::{self, HostSpec};
use gpusweep_core::model::MIB;
use gpusweep_core::parse::parse_duration;
use gpusweep_source::DEFAULT_INTERVAL;
use gpusweep_source::demo::{DEMO_HOSTS, DemoClock, DemoHost};
use gpusweep_source::local::procfs::ProcfsConfig;
use gpusweep_source::remote::http::HttpOptions;
use gpusweep_source::remote::ssh::SshOptions;

/// Where a `gpusweep serve` of this host listens and its clients look: `$GPUSWEEP_SOCKET`, else
/// `/run/gpusweep.sock` for root, else `$XDG_RUNTIME_DIR/gpusweep.sock`; `None` where none can be named.
pub fn serve_socket() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GPUSWEEP_SOCKET").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if nix::unistd::geteuid().is_root() {
        return Some(PathBuf::from("/run/gpusweep.sock"));
    }
    std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join("gpusweep.sock"))
}

/// The fastest poll interval accepted.
pub const MIN_INTERVAL: Duration = Duration::from_millis(20);
/// Seconds to wait for a host's first reading, unless told otherwise.
pub(crate) const DEFAULT_CONNECT_TIMEOUT_S: u64 = 10;

/// What the operator said on the command line, as clap reads it (with the environment variables each
/// option names): the global options of every subcommand, resolved here against the config file.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Overrides {
    /// Hosts: [user@]host[:port] (SSH), comma lists, ranges (node[01-16]), @group, `local`, cmd:COMMAND,
    /// http(s)://HOST:PORT (a `gpusweep serve`), unix:PATH (a serve's socket), prom:URL (a Prometheus's
    /// fleet), `slurm:JOBID` for a Slurm job's nodes (`slurm`: the job this runs in). Repeatable. Default:
    /// this host.
    #[arg(
        help_heading = "Global options",
        long,
        global = true,
        env = "GPUSWEEP_HOSTS"
    )]
    pub hosts: Vec<String>,
    /// File with one host spec per line (# comments); MPI hostfiles too: OpenMPI's and DeepSpeed's
    /// `host slots=8`, MPICH's `host:8`.
    #[arg(
        help_heading = "Global options",
        long,
        global = true,
        value_name = "FILE"
    )]
    pub hostfile: Option<PathBuf>,
    /// The simulated cluster (gpu-a warming up, gpu-b after a pkill, gpu-c Blackwell, gpu-d's lost rank).
    /// --hosts picks among them.
    #[arg(help_heading = "Global options", long, global = true)]
    pub demo: bool,
    /// Poll interval (e.g. 500ms, 2s). Default 1s. A prom: fleet is asked at most four times per scrape.
    #[arg(help_heading = "Global options", long, global = true, env = "GPUSWEEP_INTERVAL", value_name = "DUR", value_parser = gpusweep_core::parse::duration_arg, allow_hyphen_values = true)]
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
    /// Append every event (processes, findings, signals, GPUs turning clean, hosts up and down) to FILE as
    /// JSON lines: a session to replay or attach to a report.
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
    /// Inside a container without the host's PIDs (a pod without hostPID), where NVML lists only the
    /// container's own processes: read this node's `gpusweep serve` instead (http://NODE:9401; in a pod
    /// the node's address comes from the downward API). Used when no hosts are named and the serve answers.
    #[arg(
        help_heading = "Global options",
        long,
        global = true,
        value_name = "URL",
        env = "GPUSWEEP_NODE_SERVE"
    )]
    pub node_serve: Option<String>,
    /// The fleet's key (a file of 32+ bytes, mode 600; e.g. `openssl rand -hex 32`): `serve` seals each
    /// host's summary on /metrics with it, and a prom: reader believes a host's verdict only where the seal
    /// checks (else it is never clean). Config: seal_key_file.
    #[arg(
        help_heading = "Global options",
        long,
        global = true,
        value_name = "FILE",
        env = "GPUSWEEP_SEAL_KEY_FILE"
    )]
    pub seal_key: Option<PathBuf>,
    /// Seconds to wait for a host's first reading (1 to 86400). Default 10.
    #[arg(help_heading = "Global options", long, global = true, value_name = "SECS", allow_hyphen_values = true,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub connect_timeout: Option<u64>,
}

impl Overrides {
    /// Hosts were named on the command line.
    pub fn hosts_named(&self) -> bool {
        !self.hosts.is_empty() || self.hostfile.is_some()
    }
}

#[derive(Debug, Error)]
pub enum SettingsError {
    #[error("config: {0}")]
    Config(#[from] ConfigError),
    #[error("--hostfile {path}: {why}")]
    Hostfile { path: String, why: String },
    #[error("--hosts: {0}")]
    Hosts(#[from] host::SpecError),
    #[error("--demo has hosts {known} (and more of each: gpu-b[0001-1000]); there is no {name:?}")]
    NoDemoHost { known: String, name: String },
    #[error("--interval: {0}")]
    Interval(String),
    #[error("no hosts to watch")]
    NoHosts,
    #[error("--hosts {spec}: {why}")]
    Slurm { spec: String, why: String },
    #[error("--node-serve: {0}")]
    NodeServe(host::SpecError),
}

/// Everything a command needs, resolved.
#[derive(Debug, Clone)]
pub struct Settings {
    pub specs: Vec<HostSpec>,
    pub fleet: FleetOptions,
    pub config: Config,
    pub connect_timeout: Duration,
    pub demo: bool,
    /// Hosts came from --hosts, --hostfile or the config file (not the local default).
    pub hosts_given: bool,
    /// --local: never fall back to the demo cluster.
    pub local: bool,
    /// --readonly or `readonly = true`: no kill, sweep or removal anywhere.
    pub readonly: bool,
    pub events: Option<PathBuf>,
    /// Read this host in-process even when a serve answers on its socket (`--no-serve`, or a scan the
    /// serve does not do: other device globs, another shm directory).
    pub no_serve: bool,
    /// What the operator should know about where the readings come from (one line each, escaped): inside
    /// a container without the host's PIDs, what NVML cannot list from there and whether the node's serve
    /// is read instead. The command-line front ends print them on stderr.
    pub notes: Vec<String>,
}

impl Settings {
    /// The fleet options of a front end that may read this host through a running serve (`snapshot`,
    /// `wait`): its socket, unless `--no-serve` or `--no-nvml` (a serve reads NVML) says otherwise.
    pub fn fleet_via_serve(&self) -> FleetOptions {
        let mut f = self.fleet.clone();
        if !self.no_serve && f.load_nvml {
            f.serve_socket = serve_socket();
        }
        f
    }

    /// The fleet options of a front end that acts on this host (`sweep`, `kill`, `shm clean`): through a
    /// running serve where it takes this user's actions, so its ledger, timeline and metrics see them.
    pub fn fleet_acting_via_serve(&self) -> FleetOptions {
        let mut f = self.fleet_via_serve();
        f.acts = true;
        f
    }
}

fn interval(o: &Overrides, config: &Config) -> Result<Duration, SettingsError> {
    let interval = match (o.interval, config.interval.as_deref()) {
        (Some(d), _) => d,
        (None, Some(s)) => parse_duration(s).map_err(|e| SettingsError::Interval(e.to_string()))?,
        (None, None) => DEFAULT_INTERVAL,
    };
    if interval < MIN_INTERVAL {
        return Err(SettingsError::Interval("at least 20ms".into()));
    }
    Ok(interval)
}

fn demo_specs(values: &[String]) -> Result<Vec<HostSpec>, SettingsError> {
    if values.is_empty() {
        return Ok(DEMO_HOSTS
            .iter()
            .map(|h| HostSpec::Demo((*h).to_string()))
            .collect());
    }
    let mut v = Vec::new();
    for item in values.iter().flat_map(|h| h.split(',')) {
        for name in host::expand(item.trim())? {
            if !DemoHost::is_demo_name(&name) {
                return Err(SettingsError::NoDemoHost {
                    known: DEMO_HOSTS.join(", "),
                    name,
                });
            }
            v.push(HostSpec::Demo(name));
        }
    }
    Ok(v)
}

/// What every note about a container's PID namespace starts with.
const OWN_PID_NAMESPACE: &str =
    "this container has its own PID namespace, where NVML lists only its own processes";

/// Inside a container without the host's PIDs, with no hosts named: the node's serve when `--node-serve`
/// names one that answers, else nothing (this container is read); a note either way.
fn node_serve(o: &Overrides, notes: &mut Vec<String>) -> Result<Option<HostSpec>, SettingsError> {
    if !gpusweep_source::local::procfs::in_child_pid_namespace(std::path::Path::new("/proc")) {
        return Ok(None);
    }
    let Some(given) = o.node_serve.as_deref() else {
        notes.push(format!(
            "{OWN_PID_NAMESPACE}: memory held by other containers or the host shows as residual with no \
             holder; --node-serve http://NODE:9401 (or GPUSWEEP_NODE_SERVE) reads the node's serve instead"
        ));
        return Ok(None);
    };
    let url = host::HttpUrl::parse(given).map_err(SettingsError::NodeServe)?;
    let shown = gpusweep_core::format::escape(given);
    match answers(&url) {
        Ok(()) => {
            notes.push(format!(
                "{OWN_PID_NAMESPACE}; reading this node through its serve at {shown} instead"
            ));
            Ok(Some(HostSpec::Http { url }))
        }
        Err(why) => {
            notes.push(format!(
                "{OWN_PID_NAMESPACE}: memory held by other containers shows as residual with no holder; the \
                 node's serve at {shown} could not be reached ({}), so this reading is of this container only",
                gpusweep_core::format::escape(&why)
            ));
            Ok(None)
        }
    }
}

/// Whether a TCP connection to the serve's address opens within 2 s (TLS, token and answers are the
/// reading's to check; an unreachable node falls back to this container's own reading).
fn answers(url: &host::HttpUrl) -> Result<(), String> {
    use std::net::ToSocketAddrs;
    let addrs = (url.host().as_str(), url.port())
        .to_socket_addrs()
        .map_err(|e| e.to_string())?;
    let mut why = "no address".to_string();
    for a in addrs {
        match std::net::TcpStream::connect_timeout(&a, Duration::from_secs(2)) {
            Ok(_) => return Ok(()),
            Err(e) => why = e.to_string(),
        }
    }
    Err(why)
}

/// The hosts to watch, and whether the operator named them.
fn specs(
    o: &Overrides,
    config: &Config,
    notes: &mut Vec<String>,
) -> Result<(Vec<HostSpec>, bool), SettingsError> {
    let mut values = o.hosts.clone();
    if let Some(f) = &o.hostfile {
        let text = read_hostfile(f)?;
        values.extend(host::parse_hostfile(&text));
    }
    if o.demo {
        let given = !values.is_empty();
        return Ok((demo_specs(&values)?, given));
    }
    if values.is_empty() {
        values.clone_from(&config.hosts);
    }
    if values.is_empty() {
        return Ok(match node_serve(o, notes)? {
            Some(node) => (vec![node], true),
            None => (vec![HostSpec::Local], false),
        });
    }
    // A Slurm job's nodes, as specs.
    let mut expanded = Vec::with_capacity(values.len());
    for v in values {
        if v.trim() == "slurm" || v.trim().starts_with("slurm:") {
            expanded.extend(slurm_hosts(v.trim())?);
        } else {
            expanded.push(v);
        }
    }
    let values = expanded;
    let specs = host::parse_specs(&values, &config.groups)?;
    // Every spec within the limit is not all of them within it.
    if specs.len() > host::MAX_EXPANSION {
        return Err(SettingsError::Hosts(host::SpecError::Range {
            spec: format!("{} hosts named", specs.len()),
            why: format!("more than {} hosts in all", host::MAX_EXPANSION),
        }));
    }
    Ok((specs, true))
}

/// The most a hostfile may be: 10,000 hosts of a long spec each fit well within it.
const MAX_HOSTFILE: u64 = 16 * 1024 * 1024;

/// A hostfile's text, refused past `MAX_HOSTFILE` before it is read whole.
fn read_hostfile(f: &std::path::Path) -> Result<String, SettingsError> {
    use std::io::Read;
    let err = |why: String| SettingsError::Hostfile {
        path: f.display().to_string(),
        why,
    };
    let file = std::fs::File::open(f).map_err(|e| err(e.to_string()))?;
    let mut text = String::new();
    file.take(MAX_HOSTFILE + 1)
        .read_to_string(&mut text)
        .map_err(|e| err(e.to_string()))?;
    if text.len() as u64 > MAX_HOSTFILE {
        return Err(err(format!("larger than {} MiB", MAX_HOSTFILE >> 20)));
    }
    Ok(text)
}

/// A Slurm client's answer, or why there is none.
fn scontrol(args: &[&str]) -> Result<String, String> {
    let o = std::process::Command::new("scontrol")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("scontrol: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "scontrol {}: {}",
            args.join(" "),
            gpusweep_core::format::escape(String::from_utf8_lossy(&o.stderr).trim())
        ));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// `KEY=value` of `scontrol -o show ...`'s one-line records (the key's case as either spelling:
/// `NodeHostName`, `NodeHostname`).
fn field<'a>(record: &'a str, key: &str) -> Option<&'a str> {
    record.split_whitespace().find_map(|w| {
        let (k, v) = w.split_once('=')?;
        k.eq_ignore_ascii_case(key).then_some(v)
    })
}

/// `slurm` (the job this runs in, from `SLURM_JOB_NODELIST`) or `slurm:JOBID` (asked of `scontrol`): the
/// job's nodes as specs. A node is this host (`local`) when its host name is this one's; the others are
/// reached by the host name Slurm knows the node by (`NodeHostname`, else its node name).
fn slurm_hosts(spec: &str) -> Result<Vec<String>, SettingsError> {
    let err = |why: String| SettingsError::Slurm {
        spec: spec.to_string(),
        why,
    };
    let list = match spec.strip_prefix("slurm:") {
        None => std::env::var("SLURM_JOB_NODELIST")
            .or_else(|_| std::env::var("SLURM_NODELIST"))
            .map_err(|_| {
                err("not inside a Slurm job (no SLURM_JOB_NODELIST): name one, slurm:JOBID".into())
            })?,
        Some(id) => {
            let ok = !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit() || b == b'_');
            if !ok {
                return Err(err("a Slurm job is its number (slurm:4711)".into()));
            }
            let rec = scontrol(&["-o", "show", "job", id]).map_err(err)?;
            let nodes = field(&rec, "NodeList").unwrap_or("(null)");
            if nodes == "(null)" || nodes.is_empty() {
                let state = field(&rec, "JobState").unwrap_or("unknown");
                return Err(err(format!("job {id} has no nodes ({state})")));
            }
            nodes.to_string()
        }
    };
    // Slurm's own expansion where its client runs; else the same syntax, read here.
    let names: Vec<String> = match scontrol(&["show", "hostnames", &list]) {
        Ok(out) => out
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect(),
        Err(_) => host::expand_hostlist(&list)?,
    };
    let mut hostname: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    if let Ok(out) = scontrol(&["-o", "show", "node", &list]) {
        for rec in out.lines() {
            if let (Some(n), Some(h)) = (field(rec, "NodeName"), field(rec, "NodeHostname")) {
                hostname.insert(n.to_string(), h.to_string());
            }
        }
    }
    let me = host::local_hostname();
    let short = |h: &str| h.split('.').next().unwrap_or(h).to_string();
    Ok(names
        .into_iter()
        .map(|n| {
            let h = hostname.get(&n).cloned().unwrap_or(n);
            if h == me || short(&h) == short(&me) {
                "local".to_string()
            } else {
                h
            }
        })
        .collect())
}

fn ssh_options(o: &Overrides, config: &Config, connect_timeout: Duration) -> SshOptions {
    let mut identities = o.identities.clone();
    identities.extend(config.ssh.identity_files.iter().cloned());
    SshOptions {
        remote_command: o
            .remote_command
            .clone()
            .or_else(|| config.ssh.remote_command.clone())
            .unwrap_or_else(|| "gpusweep agent".into()),
        deploy: o.deploy || config.ssh.deploy.unwrap_or(false),
        accept_new: o.accept_new || config.ssh.accept_new.unwrap_or(false),
        max_connections: config.ssh.max_connections.unwrap_or(16),
        connect_timeout,
        identities,
        ssh_config: o.ssh_config.clone(),
        known_hosts: o.known_hosts.clone(),
    }
}

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

pub fn resolve(o: &Overrides) -> Result<Settings, SettingsError> {
    let config = config::load(o.config.as_deref(), o.config.is_some())?;
    let interval = interval(o, &config)?;
    let mut notes = Vec::new();
    let (specs, hosts_given) = specs(o, &config, &mut notes)?;
    if specs.is_empty() {
        return Err(SettingsError::NoHosts);
    }
    let mut procfs = ProcfsConfig::default();
    if !o.device_globs.is_empty() {
        procfs.device_globs.clone_from(&o.device_globs);
    } else if !config.device_globs.is_empty() {
        procfs.device_globs.clone_from(&config.device_globs);
    }
    procfs.benign.extend(config.benign.iter().cloned());
    procfs.keep.clone_from(&config.keep.programs);
    procfs.keep_models.clone_from(&config.keep.gpu_models);
    if let Some(d) = o.shm_dir.clone().or_else(|| config.shm_dir.clone()) {
        procfs.shm_dir = d;
    }
    if let Some(d) = &config.kubelet_dir {
        procfs.kubelet_dir = Some(d.clone());
    }
    let connect_timeout = Duration::from_secs(
        o.connect_timeout
            .or(config.ssh.connect_timeout_s)
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT_S)
            .max(1),
    );
    let readonly = o.readonly || config.readonly.unwrap_or(false);
    let fleet = FleetOptions {
        interval,
        analyze: AnalyzeOptions {
            tolerance: config.tolerance_mib.unwrap_or(0).saturating_mul(MIB),
            jobs: config.jobs.options()?,
            confirm_ms: config.confirm_ms()?,
            busy_percent: config
                .busy_percent
                .unwrap_or(gpusweep_analyze::DEFAULT_BUSY_PERCENT),
            ..Default::default()
        },
        procfs,
        load_nvml: !o.no_nvml,
        gauges: true,
        memory_alone: false,
        counters: false,
        audit: AuditLog::default_location(),
        kill_without_pidfd: o.kill_without_pidfd || config.kill_without_pidfd.unwrap_or(false),
        ssh: ssh_options(o, &config, connect_timeout),
        demo_clock: DemoClock::real(),
        http: HttpOptions {
            token_file: env_path("GPUSWEEP_HTTP_TOKEN_FILE")
                .or_else(|| config.http_token_file.clone()),
            ca_file: env_path("GPUSWEEP_HTTP_CA_FILE").or_else(|| config.http_ca_file.clone()),
            seal_key_file: o.seal_key.clone().or_else(|| config.seal_key_file.clone()),
        },
        // The front ends that may read through a running serve say so (`snapshot`, `wait`).
        serve_socket: None,
        acts: false,
        events_file: o.events.clone(),
        // The TUI says so: it shows readings as they come.
        quick_first_view: false,
        local_name: None,
    };
    Ok(Settings {
        specs,
        fleet,
        config,
        connect_timeout,
        demo: o.demo,
        hosts_given,
        local: o.local || o.no_nvml,
        readonly,
        events: o.events.clone(),
        no_serve: o.no_serve || !o.device_globs.is_empty() || o.shm_dir.is_some(),
        notes,
    })
}
