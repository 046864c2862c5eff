//! Requests to remove /dev/shm leftovers, and their outcomes. A file is chosen with the device and inode it had
//! in the reading, like a process with its start time: what is removed is that file, never whatever has its
//! name by then.

use serde::{Deserialize, Serialize};

use super::format::{escape, fmt_bytes};

/// One file in the host's /dev/shm, as a reading showed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmFile {
    /// The name inside /dev/shm (no slashes).
    pub name: String,
    pub dev: u64,
    pub ino: u64,
    pub bytes: u64,
    /// The pod volume it is in (its directory, as the host's reading named it); `None`: the host's /dev/shm.
    /// A host removes only from a pod volume its own fresh reading finds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_volume: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovalRequest {
    pub files: Vec<ShmFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Removal {
    Removed,
    /// Gone before anything was done.
    AlreadyGone,
    /// Not removed on purpose: in use now, replaced, not a plain file.
    Refused {
        reason: String,
    },
    Failed {
        error: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovalOutcome {
    pub name: String,
    /// The directory it was removed from (absent from older agents: `/dev/shm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    pub bytes: u64,
    #[serde(flatten)]
    pub result: Removal,
}

impl RemovalOutcome {
    pub fn failed(&self) -> bool {
        matches!(
            self.result,
            Removal::Refused { .. } | Removal::Failed { .. }
        )
    }

    pub fn describe(&self) -> String {
        let path = crate::model::shm_path(self.dir.as_deref(), &self.name);
        let name = escape(&path);
        match &self.result {
            Removal::Removed => {
                format!("removed {name} ({})", fmt_bytes(Some(self.bytes)))
            }
            Removal::AlreadyGone => format!("{name} was already gone"),
            Removal::Refused { reason } => format!("{name}: refused: {}", escape(reason)),
            Removal::Failed { error } => format!("{name}: failed: {}", escape(error)),
        }
    }
}

/// Every file of a request answered with the same failure (a host that cannot remove files).
pub fn all_failed(req: &RemovalRequest, why: &str) -> Vec<RemovalOutcome> {
    req.files
        .iter()
        .map(|f| RemovalOutcome {
            name: f.name.clone(),
            dir: None,
            bytes: f.bytes,
            result: Removal::Failed {
                error: why.to_string(),
            },
        })
        .collect()
}

/// Whether `name` may name a file directly inside /dev/shm: no path, no parent, nothing hidden in it.
pub fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}
