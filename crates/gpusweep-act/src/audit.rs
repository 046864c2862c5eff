//! The audit log: one JSON line per signal, in `$GPUSWEEP_AUDIT_LOG` or
//! `$XDG_STATE_HOME/gpusweep/actions.jsonl`. The record of a signal is written and synced before the signal is
//! sent; when it cannot be, no signal is sent.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use thiserror::Error;

use gpusweep_core::removal::ShmFile;
use gpusweep_core::signal::{Sig, TargetInfo};

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AuditError {
    #[error("no audit log location (set GPUSWEEP_AUDIT_LOG)")]
    NoLocation,
    #[error("cannot create {0}: {1}")]
    CreateDir(String, String),
    #[error("cannot write audit log {0}: {1}")]
    Open(String, String),
    #[error("audit log write: {0}")]
    Write(String),
}

/// Where every signal is recorded, one JSON line each.
#[derive(Debug, Clone)]
pub struct AuditLog {
    pub path: Option<PathBuf>,
}

impl AuditLog {
    /// `$GPUSWEEP_AUDIT_LOG`, else `$XDG_STATE_HOME/gpusweep/actions.jsonl` (~/.local/state/...).
    pub fn default_location() -> AuditLog {
        if let Some(p) = std::env::var_os("GPUSWEEP_AUDIT_LOG") {
            return AuditLog {
                path: Some(PathBuf::from(p)),
            };
        }
        let base = std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| dirs::home_dir().map(|h| h.join(".local/state")));
        AuditLog {
            path: base.map(|b| b.join("gpusweep").join("actions.jsonl")),
        }
    }

    /// Open for appending: created 0600, never through a symlink (a planted link cannot redirect it).
    pub fn open(&self) -> Result<fs::File, AuditError> {
        let Some(path) = &self.path else {
            return Err(AuditError::NoLocation);
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir)
                .map_err(|e| AuditError::CreateDir(dir.display().to_string(), e.to_string()))?;
        }
        fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| AuditError::Open(path.display().to_string(), e.to_string()))
    }

    /// Append one complete record with a single write and flush it to disk. Records of several processes
    /// sharing one log never interleave: O_APPEND makes each write land whole at the end.
    pub fn record(
        &self,
        host: &str,
        t: &TargetInfo,
        signal: Sig,
        method: &str,
        result: &str,
    ) -> Result<(), AuditError> {
        self.append(&serde_json::json!({
            "time": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            "host": host,
            "pid": t.pid,
            "start_time": t.start_time,
            "cmdline": t.cmdline,
            "pidfs_ino": t.pidfs_ino,
            "signal": signal.name(),
            "method": method,
            "result": result,
        }))
    }

    /// The record of a /dev/shm removal, by the identity it is checked against (device and inode).
    pub fn record_removal(
        &self,
        host: &str,
        path: &str,
        file: &ShmFile,
        result: &str,
    ) -> Result<(), AuditError> {
        self.append(&serde_json::json!({
            "time": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            "host": host,
            "action": "remove",
            "path": path,
            "dev": file.dev,
            "ino": file.ino,
            "bytes": file.bytes,
            "result": result,
        }))
    }

    fn append(&self, record: &serde_json::Value) -> Result<(), AuditError> {
        let f = self.open()?;
        let mut line = record.to_string().into_bytes();
        line.push(b'\n');
        append_whole(&f, &line).map_err(|e| AuditError::Write(e.to_string()))?;
        f.sync_data().map_err(|e| AuditError::Write(e.to_string()))
    }
}

/// Append one record to a log opened for appending, all of it or none of it: under an exclusive lock (every
/// gpusweep writing the log takes it), the file's length is noted, the line written, and on a short or
/// failed write (a full disk) the file is cut back to that length, so no torn record is left for the next
/// one to be glued to.
pub fn append_whole(f: &fs::File, line: &[u8]) -> std::io::Result<()> {
    use rustix::fs::{FlockOperation, flock};
    flock(f, FlockOperation::LockExclusive)?;
    let result = (|| {
        let start = f.metadata()?.len();
        let mut w = f;
        w.write_all(line).inspect_err(|_| {
            let _ = f.set_len(start);
        })
    })();
    let _ = flock(f, FlockOperation::Unlock);
    result
}
