//! `~/.config/gpusweep/config.toml`. Precedence: command line > environment > this file > defaults.
//! A missing file is fine; a malformed one is an error that names the file and the line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Poll interval, e.g. "1s", "500ms".
    pub interval: Option<String>,
    /// Clean means used memory at or under this many MiB.
    pub tolerance_mib: Option<u64>,
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
    /// Key bindings: action name -> key ("kill" = "K", "sweep" = "S", ...).
    #[serde(default)]
    pub keys: BTreeMap<String, String>,
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

/// Load `path` (or the default location). `explicit` makes a missing file an error.
pub fn load(path: Option<&Path>, explicit: bool) -> Result<Config, String> {
    let Some(path) = path.map(Path::to_path_buf).or_else(default_path) else {
        return Ok(Config::default());
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => parse(&text).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => Ok(Config::default()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

pub fn parse(text: &str) -> Result<Config, String> {
    let c: Config = toml::from_str(text).map_err(|e| e.to_string())?;
    if let Some(i) = &c.interval {
        parse_duration(i).map_err(|e| format!("interval: {e}"))?;
    }
    Ok(c)
}

/// "1s", "250ms", "1m30s", or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    if let Ok(secs) = t.parse::<f64>() {
        if secs.is_finite() && (0.0..1e9).contains(&secs) {
            return Ok(std::time::Duration::from_secs_f64(secs));
        }
        return Err(format!("{s:?} is not a duration"));
    }
    humantime::parse_duration(t).map_err(|e| format!("{s:?}: {e} (use e.g. 500ms, 2s, 1m)"))
}

/// "0,1,4-7" -> [0,1,4,5,6,7]
pub fn parse_gpu_list(s: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((a, b)) = part.split_once('-') {
            let (a, b): (u32, u32) = (
                a.trim()
                    .parse()
                    .map_err(|_| format!("bad GPU index {a:?}"))?,
                b.trim()
                    .parse()
                    .map_err(|_| format!("bad GPU index {b:?}"))?,
            );
            if b < a || b - a > 1024 {
                return Err(format!("bad GPU range {part:?}"));
            }
            out.extend(a..=b);
        } else {
            out.push(
                part.parse()
                    .map_err(|_| format!("bad GPU index {part:?}"))?,
            );
        }
    }
    if out.is_empty() {
        return Err("empty GPU list".into());
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
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
hosts = ["node[01-02]"]
benign = ["my-exporter"]
[groups]
prod = ["node[01-16]", "admin@gpu-x:2222"]
[ssh]
remote_command = "/opt/gpusweep agent"
accept_new = true
[keys]
kill = "x"
"#,
        )
        .expect("parses");
        assert_eq!(c.tolerance_mib, Some(4));
        assert_eq!(c.groups["prod"].len(), 2);
        assert_eq!(c.ssh.accept_new, Some(true));
        assert_eq!(c.keys["kill"], "x");
    }

    #[test]
    fn bad_files_say_why() {
        assert!(
            parse("intervall = \"1s\"")
                .unwrap_err()
                .contains("intervall")
        );
        assert!(
            parse("interval = \"soon\"")
                .unwrap_err()
                .contains("interval")
        );
        assert!(parse("tolerance_mib = -1").is_err());
    }

    #[test]
    fn missing_default_file_is_fine_but_explicit_is_not() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("none.toml");
        assert_eq!(load(Some(&p), false).expect("ok"), Config::default());
        assert!(load(Some(&p), true).is_err());
    }

    #[test]
    fn durations_and_gpu_lists() {
        assert_eq!(parse_duration("250ms").expect("ok").as_millis(), 250);
        assert_eq!(parse_duration("2").expect("ok").as_secs(), 2);
        assert!(parse_duration("-1").is_err());
        assert_eq!(parse_gpu_list("0,2,4-6").expect("ok"), [0, 2, 4, 5, 6]);
        assert!(parse_gpu_list("a").is_err());
        assert!(parse_gpu_list("5-1").is_err());
    }
}
