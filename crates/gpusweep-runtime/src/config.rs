//! `~/.config/gpusweep/config.toml`. Precedence: command line > environment > this file > defaults.
//! A missing file is fine; a malformed one is an error that names the file and the line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

use gpusweep_core::parse::parse_duration;

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Poll interval, e.g. "1s", "500ms".
    pub interval: Option<String>,
    /// Clean means used memory at or under this many MiB.
    pub tolerance_mib: Option<u64>,
    /// A finding seen to appear while watching is said at its full severity once it has lasted this long
    /// ("3s" by default; "0s": at once).
    pub confirm: Option<String>,
    /// Clean means idle: a GPU this busy (percent, default 50) with nothing listed and nobody holding it is
    /// a leftover (`busy_without_holder`), never clean. 0 leaves utilization out of the verdict.
    pub busy_percent: Option<u32>,
    /// Hosts watched when `--hosts` is not given.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Named host lists, used as `--hosts @name` or `--hosts name`.
    #[serde(default)]
    pub groups: BTreeMap<String, Vec<String>>,
    /// Extra process names that open GPUs without holding memory (monitors, exporters).
    #[serde(default)]
    pub benign: Vec<String>,
    /// Device files that make a process a holder (default `/dev/nvidia*`).
    #[serde(default)]
    pub device_globs: Vec<String>,
    #[serde(default)]
    pub ssh: SshConfig,
    /// Where a host has no pidfd, signal with kill(2) after a start-time check instead of refusing.
    pub kill_without_pidfd: Option<bool>,
    /// No kill, sweep or removal, and their keys hidden: for shared monitoring screens.
    pub readonly: Option<bool>,
    /// Where the shared-memory files are (default /dev/shm; a container may mount the host's elsewhere).
    pub shm_dir: Option<PathBuf>,
    /// The kubelet's root directory, where pods' memory-backed volumes are (default /var/lib/kubelet).
    pub kubelet_dir: Option<PathBuf>,
    /// Key bindings: action name -> key ("kill" = "K", "sweep" = "S", ...).
    #[serde(default)]
    pub keys: BTreeMap<String, String>,
    /// `http(s)://` hosts: a file whose first line is the bearer token their serves want.
    pub http_token_file: Option<PathBuf>,
    /// `https://` hosts: a PEM certificate to trust besides the system's (a serve's own CA).
    pub http_ca_file: Option<PathBuf>,
    /// The fleet's key (at least 32 bytes, mode 600): a serve seals each host's summary on /metrics with
    /// it, and a `prom:` reader believes a host only where the seal checks.
    pub seal_key_file: Option<PathBuf>,
    /// The windows a job's phases are told by.
    #[serde(default)]
    pub jobs: JobsConfig,
    /// GPU memory held on purpose: shown as kept, never swept, never a leak, never waited for.
    #[serde(default)]
    pub keep: KeepConfig,
}

/// `[keep]`: what keeps GPU memory on purpose on this host.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KeepConfig {
    /// Programs (by what they run, as `benign` is matched) whose GPU memory outlives their workers by
    /// design: a GPU memory service that keeps weights across worker crashes.
    #[serde(default)]
    pub programs: Vec<String>,
    /// GPU models (a part of the name, any case) whose memory stays after their processes exit: unified
    /// memory parts (GB10, GH200).
    #[serde(default)]
    pub gpu_models: Vec<String>,
}

/// `[jobs]`: durations as `interval` takes them ("60s", "2m").
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JobsConfig {
    /// Memory flat this long, every rank alive: settled (default 60s).
    pub settle: Option<String>,
    /// A rank behind its peers this long while loading: a straggler (default 10s).
    pub straggler: Option<String>,
    /// A rank in state D this long: lost (default 10s).
    pub stuck: Option<String>,
    /// GPUs spinning without work this long, memory flat: hung (default 5m).
    pub hang: Option<String>,
}

impl Config {
    /// The confirm window in ms (3 s where unset).
    pub fn confirm_ms(&self) -> Result<u64, ConfigError> {
        match &self.confirm {
            None => Ok(gpusweep_analyze::AnalyzeOptions::default().confirm_ms),
            Some(v) => parse_duration(v)
                .map(gpusweep_core::format::millis)
                .map_err(|e| ConfigError::Invalid(format!("confirm: {e}"))),
        }
    }
}

impl JobsConfig {
    /// The job book's windows, defaults where unset.
    pub fn options(&self) -> Result<gpusweep_analyze::jobs::JobOptions, ConfigError> {
        let mut o = gpusweep_analyze::jobs::JobOptions::default();
        for (name, v, slot) in [
            ("jobs.settle", &self.settle, &mut o.settle_ms),
            ("jobs.straggler", &self.straggler, &mut o.straggle_ms),
            ("jobs.stuck", &self.stuck, &mut o.stuck_ms),
            ("jobs.hang", &self.hang, &mut o.hang_ms),
        ] {
            if let Some(v) = v {
                let d =
                    parse_duration(v).map_err(|e| ConfigError::Invalid(format!("{name}: {e}")))?;
                *slot = gpusweep_core::format::millis(d);
            }
        }
        Ok(o)
    }
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SshConfig {
    /// Command run on remote hosts (default "gpusweep agent").
    pub remote_command: Option<String>,
    /// Upload this binary when the remote has none.
    pub deploy: Option<bool>,
    /// Learn unknown host keys (OpenSSH's accept-new). Changed keys are always refused.
    pub accept_new: Option<bool>,
    /// Connections opened at once.
    pub max_connections: Option<usize>,
    /// Seconds to wait for a connection.
    pub connect_timeout_s: Option<u64>,
    /// Extra private keys to try.
    #[serde(default)]
    pub identity_files: Vec<PathBuf>,
}

pub fn default_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GPUSWEEP_CONFIG") {
        return Some(PathBuf::from(p));
    }
    dirs::config_dir().map(|d| d.join("gpusweep").join("config.toml"))
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    #[error("{path}: {why}")]
    Read { path: String, why: String },
    #[error("{path}: {why}")]
    Parse { path: String, why: String },
    #[error("{0}")]
    Invalid(String),
}

/// Load `path` (or the default location). `explicit` makes a missing file an error.
pub fn load(path: Option<&Path>, explicit: bool) -> Result<Config, ConfigError> {
    let Some(path) = path.map(Path::to_path_buf).or_else(default_path) else {
        return Ok(Config::default());
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => parse(&text).map_err(|e| ConfigError::Parse {
            path: path.display().to_string(),
            why: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => Ok(Config::default()),
        Err(e) => Err(ConfigError::Read {
            path: path.display().to_string(),
            why: e.to_string(),
        }),
    }
}

pub fn parse(text: &str) -> Result<Config, ConfigError> {
    let c: Config = toml::from_str(text).map_err(|e| ConfigError::Invalid(e.to_string()))?;
    if let Some(i) = &c.interval {
        parse_duration(i).map_err(|e| ConfigError::Invalid(format!("interval: {e}")))?;
    }
    // Counts are bounded where they are read, so a typo cannot overflow a deadline or a byte count later.
    if c.tolerance_mib.is_some_and(|t| t > 1 << 30) {
        return Err(ConfigError::Invalid(
            "tolerance_mib: more than any GPU has (at most 1073741824)".into(),
        ));
    }
    c.jobs.options()?;
    c.confirm_ms()?;
    if let Some(b) = c.busy_percent
        && b > 100
    {
        return Err(ConfigError::Invalid(format!(
            "busy_percent: {b} is outside 0..=100"
        )));
    }
    if let Some(t) = c.ssh.connect_timeout_s
        && !(1..=86_400).contains(&t)
    {
        return Err(ConfigError::Invalid(format!(
            "ssh.connect_timeout_s: {t} is outside 1..=86400"
        )));
    }
    if let Some(n) = c.ssh.max_connections
        && !(1..=4096).contains(&n)
    {
        return Err(ConfigError::Invalid(format!(
            "ssh.max_connections: {n} is outside 1..=4096"
        )));
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_file_parses() {
        let c = parse(
            r#"
interval = "500ms"
tolerance_mib = 4
confirm = "5s"
busy_percent = 80
hosts = ["node[01-02]"]
benign = ["my-exporter"]
[groups]
prod = ["node[01-16]", "admin@gpu-x:2222"]
[ssh]
remote_command = "/opt/gpusweep agent"
accept_new = true
[keys]
kill = "x"
[jobs]
settle = "2m"
straggler = "30s"
[keep]
programs = ["gpu-memory-service"]
gpu_models = ["GB10", "GH200"]
"#,
        )
        .expect("parses");
        assert_eq!(c.keep.gpu_models, ["GB10", "GH200"]);
        let j = c.jobs.options().expect("durations");
        assert_eq!(
            (j.settle_ms, j.straggle_ms, j.stuck_ms),
            (120_000, 30_000, 10_000)
        );
        assert_eq!(c.tolerance_mib, Some(4));
        assert_eq!(c.busy_percent, Some(80));
        assert!(parse("busy_percent = 101").is_err());
        assert_eq!(c.confirm_ms().expect("a duration"), 5_000);
        assert_eq!(Config::default().confirm_ms().expect("default"), 3_000);
        assert_eq!(c.groups["prod"].len(), 2);
        assert_eq!(c.ssh.accept_new, Some(true));
        assert_eq!(c.keys["kill"], "x");
    }

    #[test]
    fn bad_files_say_why() {
        assert!(
            parse("intervall = \"1s\"")
                .unwrap_err()
                .to_string()
                .contains("intervall")
        );
        assert!(
            parse("interval = \"soon\"")
                .unwrap_err()
                .to_string()
                .contains("interval")
        );
        assert!(parse("tolerance_mib = -1").is_err());
        assert!(
            parse("confirm = \"later\"")
                .unwrap_err()
                .to_string()
                .contains("confirm")
        );
        assert!(parse("tolerance_mib = 18446744073709551615").is_err());
        assert!(parse("[ssh]\nconnect_timeout_s = 0").is_err());
        assert!(parse("[ssh]\nmax_connections = 0").is_err());
        assert!(parse("[ssh]\nconnect_timeout_s = 30").is_ok());
        assert!(
            parse("[jobs]\nsettle = \"soon\"")
                .unwrap_err()
                .to_string()
                .contains("jobs.settle")
        );
    }

    #[test]
    fn missing_default_file_is_fine_but_explicit_is_not() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("none.toml");
        assert_eq!(load(Some(&p), false).expect("ok"), Config::default());
        assert!(load(Some(&p), true).is_err());
    }
}
