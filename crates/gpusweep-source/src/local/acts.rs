//! The host's act notes (`gpusweep_core::acts`), read after `/proc`: each bounded before it is read, its
//! writer the file's owner as the kernel says.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use gpusweep_core::acts::{Act, MAX_NOTE_BYTES, MAX_NOTES, NOTE_LIFE_MS, parse_note};

/// Every act noted in `dir` within `NOTE_LIFE_MS` of `now_ms`. A missing or unreadable directory, a link
/// in place of it or of a note, a note too large: nothing from it.
pub fn read(dir: &Path, now_ms: u64) -> Vec<Act> {
    let mut out = Vec::new();
    // The directory itself, never through a link.
    if !fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        return out;
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten().take(MAX_NOTES) {
        let Ok(mut f) = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(e.path())
        else {
            continue;
        };
        let Ok(md) = f.metadata() else { continue };
        let at_ms = u64::try_from(md.mtime()).unwrap_or(0).saturating_mul(1000);
        if !md.is_file() || md.len() > MAX_NOTE_BYTES || now_ms.saturating_sub(at_ms) > NOTE_LIFE_MS
        {
            continue;
        }
        let mut text = String::new();
        if (&mut f)
            .take(MAX_NOTE_BYTES)
            .read_to_string(&mut text)
            .is_ok()
        {
            out.extend(parse_note(&text, md.uid(), at_ms));
        }
    }
    out.sort_by_key(|a| (a.pid, a.start_time, a.by_uid));
    out.dedup_by_key(|a| (a.pid, a.start_time, a.by_uid));
    out
}
