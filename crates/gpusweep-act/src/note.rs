//! The act note a signal leaves for every other gpusweep watching this host (`gpusweep_core::acts`): written
//! after the audit record, before the first signal. Best effort: without it, another watcher may count a rank
//! this sweep ends as lost (a false alarm, never a false clean); this process's own ledger knows regardless.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use gpusweep_core::acts::{MAX_NOTES, NOTE_LIFE_MS, note_text};

/// Note `targets` (pid, start time) in the act directory `dir`, created world-writable and sticky (as
/// `/tmp` is: each user's notes are theirs to remove) when absent. Notes of this user older than
/// `NOTE_LIFE_MS` are removed on the way.
pub fn note(dir: &Path, targets: &[(u32, u64)]) -> std::io::Result<()> {
    if targets.is_empty() {
        return Ok(());
    }
    match fs::DirBuilder::new().mode(0o1777).create(dir) {
        Ok(()) => {
            // The umask took bits from the mode asked for.
            fs::set_permissions(dir, fs::Permissions::from_mode(0o1777))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    // A link in place of the directory is not followed (a note must not land where another user chose).
    let md = fs::symlink_metadata(dir)?;
    if !md.is_dir() {
        return Err(std::io::Error::other(
            "the act directory is not a directory",
        ));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let name = format!("{}-{}", std::process::id(), now.as_nanos());
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join(name))?;
    f.write_all(note_text(targets.iter().copied()).as_bytes())?;
    prune(dir, now.as_secs());
    Ok(())
}

/// Remove this user's notes older than a note's life (at most `MAX_NOTES` looked at).
fn prune(dir: &Path, now_s: u64) {
    let me = rustix::process::geteuid().as_raw();
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten().take(MAX_NOTES) {
        let Ok(md) = e.metadata() else { continue };
        let age_s = now_s.saturating_sub(u64::try_from(md.mtime()).unwrap_or(0));
        if md.uid() == me && md.is_file() && age_s.saturating_mul(1000) > NOTE_LIFE_MS {
            let _ = fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_is_left_in_a_sticky_directory_and_read_back_by_its_owner() {
        let base = std::env::temp_dir().join(format!("gpusweep-note-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(&base).expect("temp dir");
        let dir = base.join("acts");
        note(&dir, &[(42, 7), (43, 8)]).expect("noted");
        let md = fs::symlink_metadata(&dir).expect("dir");
        assert_eq!(md.mode() & 0o7777, 0o1777);
        let files: Vec<_> = fs::read_dir(&dir).expect("read").flatten().collect();
        assert_eq!(files.len(), 1);
        let text = fs::read_to_string(files[0].path()).expect("note");
        assert_eq!(text, "42 7\n43 8\n");
        // A link in place of the directory is refused.
        let link = base.join("link");
        std::os::unix::fs::symlink(&dir, &link).expect("link");
        assert!(note(&link, &[(1, 1)]).is_err());
        let _ = fs::remove_dir_all(&base);
    }
}
