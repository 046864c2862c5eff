//! `--events FILE`: every timeline event as one JSON line, appended and flushed as it happens, so a session
//! can be replayed or attached to a bug report even if gpusweep is killed.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::core::event::Event;

pub struct EventLog {
    path: PathBuf,
    file: File,
}

impl EventLog {
    /// Open for appending (created 0600, never through a symlink).
    pub fn open(path: &Path) -> Result<EventLog, String> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| format!("--events {}: {e}", path.display()))?;
        Ok(EventLog {
            path: path.to_path_buf(),
            file,
        })
    }

    /// One event, one line, written whole.
    pub fn write(&mut self, e: &Event) -> Result<(), String> {
        let mut line = serde_json::to_vec(e).map_err(|x| x.to_string())?;
        line.push(b'\n');
        self.file
            .write_all(&line)
            .map_err(|x| format!("--events {}: {x}", self.path.display()))
    }
}
