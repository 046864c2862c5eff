//! `--events FILE`: every timeline event as one JSON line, appended and flushed as it happens, so a session
//! can be replayed or attached to a bug report even if gpusweep is killed.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use gpusweep_core::event::Event;

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
        gpusweep_act::audit::append_whole(&self.file, &line).map_err(|source| EventLogError::Io {
            path: self.path.display().to_string(),
            source,
        })
    }
}

/// An events file shared by every host of a fleet: events are written as their ledgers produce them,
/// whichever front end reads the fleet (and whether or not it reads them). A write that fails is said once,
/// on stderr, and no more is written (a file missing events it says nothing of would mislead).
pub(crate) struct Recorder {
    log: std::sync::Mutex<Option<EventLog>>,
}

impl Recorder {
    pub fn open(path: &Path) -> Result<Recorder, EventLogError> {
        Ok(Recorder {
            log: std::sync::Mutex::new(Some(EventLog::open(path)?)),
        })
    }

    pub fn record(&self, events: &[Event]) {
        let Ok(mut guard) = self.log.lock() else {
            return;
        };
        let Some(log) = guard.as_mut() else { return };
        for e in events {
            if let Err(err) = log.write(e) {
                eprintln!("gpusweep: {err}; no further events are written");
                *guard = None;
                return;
            }
        }
    }
}
