//! `--events FILE`: every timeline event as one JSON line, appended and flushed as it happens, so a session
//! can be replayed or attached to a bug report even if gpusweep is killed.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::core::event::Event;

/// Why the events file cannot be kept.
#[derive(Debug, thiserror::Error)]
pub enum EventLogError {
    #[error("--events {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("an event that does not serialize: {0}")]
    Json(#[from] serde_json::Error),
}

pub struct EventLog {
    path: PathBuf,
    file: File,
}

impl EventLog {
    /// Open for appending (created 0600, never through a symlink).
    pub fn open(path: &Path) -> Result<EventLog, EventLogError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|source| EventLogError::Io {
                path: path.display().to_string(),
                source,
            })?;
        Ok(EventLog {
            path: path.to_path_buf(),
            file,
        })
    }

    /// One event, one line, written whole.
    pub fn write(&mut self, e: &Event) -> Result<(), EventLogError> {
        let mut line = serde_json::to_vec(e)?;
        line.push(b'\n');
        crate::act::audit::append_whole(&self.file, &line).map_err(|source| EventLogError::Io {
            path: self.path.display().to_string(),
            source,
        })
    }
}
