//! A process's state letter (`/proc/PID/stat`), typed: the model's processes and the job book's lost ranks
//! both name it, so it stands apart from both (the model imports the job book).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The state letter of `/proc/PID/stat`, typed. Serialized as that one letter (the JSON contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ProcState {
    Running,
    #[default]
    Sleeping,
    /// Uninterruptible sleep (D): signals wait until the I/O returns.
    DiskSleep,
    Zombie,
    Stopped,
    TracingStop,
    Dead,
    Idle,
    /// Any other letter a kernel reports.
    Other(char),
}

impl ProcState {
    pub fn from_char(c: char) -> ProcState {
        match c {
            'R' => ProcState::Running,
            'S' => ProcState::Sleeping,
            'D' => ProcState::DiskSleep,
            'Z' => ProcState::Zombie,
            'T' => ProcState::Stopped,
            't' => ProcState::TracingStop,
            'X' | 'x' => ProcState::Dead,
            'I' => ProcState::Idle,
            other => ProcState::Other(other),
        }
    }
    pub fn as_char(self) -> char {
        match self {
            ProcState::Running => 'R',
            ProcState::Sleeping => 'S',
            ProcState::DiskSleep => 'D',
            ProcState::Zombie => 'Z',
            ProcState::Stopped => 'T',
            ProcState::TracingStop => 't',
            ProcState::Dead => 'X',
            ProcState::Idle => 'I',
            ProcState::Other(c) => c,
        }
    }
    pub fn is_zombie(self) -> bool {
        self == ProcState::Zombie
    }
}

impl std::fmt::Display for ProcState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_char().encode_utf8(&mut [0; 4]))
    }
}

impl Serialize for ProcState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_char(self.as_char())
    }
}

impl<'de> Deserialize<'de> for ProcState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let c = char::deserialize(d)?;
        Ok(ProcState::from_char(c))
    }
}
