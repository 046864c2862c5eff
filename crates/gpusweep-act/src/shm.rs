//! Removing /dev/shm leftovers. A file is removed only when, in a reading taken just before, no live process
//! has it open or mapped; and at the moment of removal the name still names the same plain file (device
//! and inode, looked up without following symlinks, inside the directory opened once). The audit record is
//! written before the removal; when it cannot be, nothing is removed.
//!
//! One window remains, as with kill(2) without a pidfd: between the final lstat and unlinkat another
//! process could rename a different file onto the name. /dev/shm is sticky (mode 1777), so only the file's
//! owner or root can.

use std::path::Path;

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::AuditLog;
use gpusweep_core::model::{ShmInfo, ShmSegment};
use gpusweep_core::removal::{Removal, RemovalOutcome, RemovalRequest, ShmFile, plain_name};

/// Remove what `req` names from `dir`, checked against `now` (a reading of that directory taken after the
/// request arrived, with a full scan of every process's fds and maps).
pub fn remove(
    host: &str,
    dir: &Path,
    req: &RemovalRequest,
    now: &ShmInfo,
    audit: &AuditLog,
) -> Vec<RemovalOutcome> {
    let dirfd = rustix::fs::openat(
        CWD,
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    );
    // Each file is looked up in the reading by name once: a hundred thousand leftovers cost no more each.
    let seen: std::collections::HashMap<&str, &ShmSegment> =
        now.segments.iter().map(|s| (s.name.as_str(), s)).collect();
    req.files
        .iter()
        .map(|f| RemovalOutcome {
            name: f.name.clone(),
            dir: Some(dir.to_string_lossy().into_owned()),
            bytes: f.bytes,
            result: match &dirfd {
                Ok(d) => remove_one(host, dir, d, f, seen.get(f.name.as_str()).copied(), audit),
                Err(e) => Removal::Failed {
                    error: format!("cannot open {}: {e}", dir.display()),
                },
            },
        })
        .collect()
}

/// The name's bytes in the directory. A name that is not UTF-8 travels as text with U+FFFD in its place
/// (JSON carries no raw bytes): it is found again as the entry whose name reads the same that way and whose
/// inode is the chosen file's. `None`: no such entry now.
fn raw_name(dirfd: &rustix::fd::OwnedFd, f: &ShmFile) -> Option<std::ffi::CString> {
    if !f.name.contains(char::REPLACEMENT_CHARACTER) {
        return std::ffi::CString::new(f.name.as_bytes()).ok();
    }
    let mut dir = rustix::fs::Dir::read_from(dirfd).ok()?;
    while let Some(Ok(e)) = dir.read() {
        let bytes = e.file_name().to_bytes();
        if e.ino() == f.ino && String::from_utf8_lossy(bytes) == f.name {
            return Some(e.file_name().to_owned());
        }
    }
    None
}

fn refused(reason: impl Into<String>) -> Removal {
    Removal::Refused {
        reason: reason.into(),
    }
}

fn remove_one(
    host: &str,
    dir: &Path,
    dirfd: &rustix::fd::OwnedFd,
    f: &ShmFile,
    seen: Option<&ShmSegment>,
    audit: &AuditLog,
) -> Removal {
    if !plain_name(&f.name) {
        return refused("not a file name inside the shared-memory directory");
    }
    let Some(name) = raw_name(dirfd, f) else {
        return Removal::AlreadyGone;
    };
    let st = match rustix::fs::statat(dirfd, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Removal::AlreadyGone,
        Err(e) => {
            return Removal::Failed {
                error: e.to_string(),
            };
        }
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return refused("not a plain file (a symlink, directory or socket is never removed)");
    }
    if (st.st_dev, st.st_ino) != (f.dev, f.ino) {
        return refused(
            "another file has this name now (device or inode changed since it was chosen)",
        );
    }
    let Some(seg) = seen else {
        return refused(
            "not a GPU-stack leftover (nccl-*, torch_*, psm_*, sem.*, cuda.shm*, vllm*)",
        );
    };
    match &seg.users {
        None => return refused("who has it open or mapped could not be checked"),
        Some(u) if !u.is_empty() => {
            return refused(format!(
                "in use now: open or mapped by pid {}",
                u.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            ));
        }
        Some(_) => {}
    }
    let path = dir.join(&f.name).display().to_string();
    if let Err(e) = audit.record_removal(host, &path, f, "removing") {
        return Removal::Failed {
            error: format!("not removed: {e}"),
        };
    }
    match rustix::fs::unlinkat(dirfd, name.as_c_str(), AtFlags::empty()) {
        Ok(()) => Removal::Removed,
        Err(Errno::NOENT) => Removal::AlreadyGone,
        Err(e) => {
            let _ = audit.record_removal(host, &path, f, &format!("failed: {e}"));
            Removal::Failed {
                error: e.to_string(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;
    use gpusweep_core::model::ShmSegment;

    fn file(dir: &Path, name: &str) -> ShmFile {
        let md = std::fs::symlink_metadata(dir.join(name)).expect("stat");
        ShmFile {
            name: name.into(),
            dev: md.dev(),
            ino: md.ino(),
            bytes: md.len(),
            pod_volume: None,
        }
    }

    fn seen(names: &[(&str, Option<Vec<u32>>)]) -> ShmInfo {
        ShmInfo {
            segments: names
                .iter()
                .map(|(n, u)| ShmSegment {
                    name: (*n).to_string(),
                    users: u.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_chosen_unused_plain_file_is_removed_and_recorded_first() {
        let d = tempfile::tempdir().expect("tmp");
        let log = d.path().join("audit.jsonl");
        let shm = d.path().join("shm");
        std::fs::create_dir(&shm).expect("dir");
        for n in ["nccl-a", "nccl-b", "nccl-c", "nccl-swapped"] {
            std::fs::write(shm.join(n), b"x").expect("write");
        }
        std::os::unix::fs::symlink(d.path().join("audit.jsonl"), shm.join("nccl-link"))
            .expect("ln");
        let audit = AuditLog {
            path: Some(log.clone()),
        };
        let mut req = RemovalRequest {
            files: vec![
                file(&shm, "nccl-a"),
                file(&shm, "nccl-b"),
                file(&shm, "nccl-c"),
                file(&shm, "nccl-link"),
                file(&shm, "nccl-swapped"),
            ],
        };
        req.files.push(ShmFile {
            name: "../audit.jsonl".into(),
            ..req.files[0].clone()
        });
        // Replaced after it was chosen: same name, another inode.
        std::fs::write(shm.join("nccl-new"), b"new").expect("write");
        std::fs::rename(shm.join("nccl-new"), shm.join("nccl-swapped")).expect("mv");
        std::fs::remove_file(shm.join("nccl-c")).expect("rm");
        let now = seen(&[
            ("nccl-a", Some(vec![])),
            ("nccl-b", Some(vec![4242])),
            ("nccl-link", Some(vec![])),
            ("nccl-swapped", Some(vec![])),
        ]);
        let out = remove("h", &shm, &req, &now, &audit);
        let r: Vec<&Removal> = out.iter().map(|o| &o.result).collect();
        assert_eq!(r[0], &Removal::Removed);
        assert!(
            matches!(r[1], Removal::Refused { reason } if reason.contains("4242")),
            "{r:?}"
        );
        assert_eq!(r[2], &Removal::AlreadyGone);
        assert!(
            matches!(r[3], Removal::Refused { reason } if reason.contains("not a plain file")),
            "{r:?}"
        );
        assert!(
            matches!(r[4], Removal::Refused { reason } if reason.contains("another file")),
            "{r:?}"
        );
        assert!(matches!(r[5], Removal::Refused { .. }), "{r:?}");
        assert!(!shm.join("nccl-a").exists());
        assert!(shm.join("nccl-b").exists() && shm.join("nccl-swapped").exists());
        assert!(log.exists(), "the symlink's target was not removed");
        let text = std::fs::read_to_string(&log).expect("log");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.contains(r#""action":"remove""#) && text.contains("nccl-a"),
            "{text}"
        );
    }

    #[test]
    fn without_an_audit_record_nothing_is_removed() {
        let d = tempfile::tempdir().expect("tmp");
        std::fs::write(d.path().join("nccl-a"), b"x").expect("write");
        let req = RemovalRequest {
            files: vec![file(d.path(), "nccl-a")],
        };
        let audit = AuditLog {
            path: Some(d.path().join("no-such-dir/\0")),
        };
        let out = remove(
            "h",
            d.path(),
            &req,
            &seen(&[("nccl-a", Some(vec![]))]),
            &audit,
        );
        assert!(
            matches!(&out[0].result, Removal::Failed { error } if error.contains("not removed")),
            "{out:?}"
        );
        assert!(d.path().join("nccl-a").exists());
    }
}
