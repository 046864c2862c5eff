//! Signals a gpusweep on a host sent, known to every other gpusweep watching that host. Only the process that
//! sends a signal knows it was its own: a serve or a second TUI watching while a third gpusweep sweeps a
//! healthy job would otherwise count each rank it ends as lost. So before each signal the sender leaves a note
//! in the host's act directory (after its audit record, before the signal), and every local reading reads the
//! notes after it read `/proc`: a death a reading sees was noted before that reading looked.
//!
//! A note is a claim. Its text names (pid, start time) pairs; who wrote it is the file's owner, which the
//! kernel says and the writer cannot choose. A note explains a process's end only where its owner could have
//! sent that signal: root, or the process's own user (`proves`). A note of anyone else is ignored, so a user
//! cannot hide another user's lost rank. Every note is bounded before it is read (`MAX_NOTE_BYTES`,
//! `MAX_NOTES`, `MAX_TARGETS_A_NOTE`) and believed for `NOTE_LIFE_MS`, as long as the sender's own memory of
//! its signals lasts.

use serde::{Deserialize, Serialize};

/// The act directory: tmpfs, on every Linux host, emptied at boot as the PIDs it names are.
pub const DEFAULT_DIR: &str = "/dev/shm/gpusweep-acts";
/// Where the act directory is, when not `DEFAULT_DIR`.
pub const DIR_ENV: &str = "GPUSWEEP_ACTS_DIR";
/// How long a note explains an exit (a sweep's grace, and more).
pub const NOTE_LIFE_MS: u64 = 10 * 60 * 1000;
/// A note larger than this is not read.
pub const MAX_NOTE_BYTES: u64 = 64 * 1024;
/// At most this many notes are read per reading (the newest are the ones that matter, but the directory
/// has no order: past this, the reading says it saw only some).
pub const MAX_NOTES: usize = 512;
/// At most this many targets are taken from one note.
pub const MAX_TARGETS_A_NOTE: usize = 4096;

/// One process a gpusweep on the host recorded it signalled, before it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Act {
    pub pid: u32,
    /// Its start time (clock ticks since boot): a later process of the same PID is another.
    pub start_time: u64,
    /// The note's owner, as the kernel says.
    pub by_uid: u32,
    /// When the note was written (its modification time), Unix ms.
    pub at_ms: u64,
}

impl Act {
    /// Whether this note explains the end of a process owned by `owner`: only root or the process's own
    /// user could have sent the signal it claims.
    pub fn proves_for(&self, owner: Option<u32>) -> bool {
        self.by_uid == 0 || Some(self.by_uid) == owner
    }
}

/// The act directory this process uses: `$GPUSWEEP_ACTS_DIR` when set (absolute), else `DEFAULT_DIR`.
pub fn dir() -> std::path::PathBuf {
    std::env::var_os(DIR_ENV)
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| std::path::PathBuf::from(DEFAULT_DIR))
}

/// A note's text: one `PID START_TIME` line per target.
pub fn note_text(targets: impl Iterator<Item = (u32, u64)>) -> String {
    let mut out = String::new();
    for (pid, start) in targets {
        out.push_str(&format!("{pid} {start}\n"));
    }
    out
}

/// The targets a note's text names, as acts of `by_uid` at `at_ms`: at most `MAX_TARGETS_A_NOTE`, lines of
/// another shape skipped.
pub fn parse_note(text: &str, by_uid: u32, at_ms: u64) -> Vec<Act> {
    text.lines()
        .filter_map(|l| {
            let (pid, start) = l.split_once(' ')?;
            Some(Act {
                pid: pid.parse().ok().filter(|p| *p > 0)?,
                start_time: start.parse().ok()?,
                by_uid,
                at_ms,
            })
        })
        .take(MAX_TARGETS_A_NOTE)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_reads_back_what_was_written_and_nothing_else() {
        let text = note_text([(42, 1000), (43, 1001)].into_iter());
        let acts = parse_note(&format!("{text}junk\n0 5\n44\n-1 3\n"), 1000, 7);
        assert_eq!(
            acts.iter()
                .map(|a| (a.pid, a.start_time))
                .collect::<Vec<_>>(),
            [(42, 1000), (43, 1001)]
        );
        assert!(acts.iter().all(|a| a.by_uid == 1000 && a.at_ms == 7));
        let many = note_text((1..=5000).map(|p| (p, 1)));
        assert_eq!(parse_note(&many, 0, 0).len(), MAX_TARGETS_A_NOTE);
    }

    #[test]
    fn a_note_proves_an_end_only_for_roots_or_the_processs_own_user() {
        let act = |by_uid| Act {
            pid: 1,
            start_time: 1,
            by_uid,
            at_ms: 0,
        };
        assert!(act(0).proves_for(Some(1000)));
        assert!(act(1000).proves_for(Some(1000)));
        assert!(!act(1001).proves_for(Some(1000)), "another user's claim");
        assert!(!act(1001).proves_for(None), "an owner not known");
        assert!(act(0).proves_for(None));
    }
}
