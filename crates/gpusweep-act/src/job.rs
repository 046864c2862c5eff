//! A job of its own for `gpusweep run`: a cgroup v2 leaf where gpusweep may create one, else a process group
//! with gpusweep as child subreaper. Either way no worker can slip away: a cgroup holds every descendant
//! whatever it forks, and a subreaper adopts the double-forked ones instead of PID 1.

use std::fs;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use gpusweep_core::job::RUN_LEAF_PREFIX;
use gpusweep_core::procstat::parse_stat;

/// How a job is held together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Containment {
    /// A cgroup v2 leaf of our own; `kill` when the kernel has `cgroup.kill` (5.14+).
    Cgroup { leaf: PathBuf, kill: bool },
    /// A process group, gpusweep its child subreaper; `why` no cgroup could be made.
    Subreaper { why: String },
}

impl Containment {
    pub fn describe(&self) -> String {
        match self {
            Containment::Cgroup { leaf, kill } => format!(
                "cgroup {}{}",
                leaf.display(),
                if *kill {
                    " (ended with cgroup.kill)"
                } else {
                    ""
                }
            ),
            Containment::Subreaper { why } => {
                format!("a process group with gpusweep as child subreaper (no cgroup: {why})")
            }
        }
    }
}

/// The cgroup v2 mount point, from `/proc/self/mountinfo` (never assumed to be /sys/fs/cgroup: hybrid hosts
/// mount it at /sys/fs/cgroup/unified).
pub(crate) fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    gpusweep_core::cgroup::Mounts::parse(mountinfo).v2
}

/// Make a leaf for the job under our own cgroup, or say why not. `root` replaces the cgroup v2 mount point
/// (`GPUSWEEP_CGROUP_ROOT`: tests point it at a directory where no cgroup can be made).
pub fn contain(supervisor: u32, root: Option<&Path>) -> Containment {
    let mount = match root {
        Some(r) => Some(r.to_path_buf()),
        None => fs::read_to_string("/proc/self/mountinfo")
            .ok()
            .and_then(|m| cgroup2_mount(&m)),
    };
    let Some(mount) = mount else {
        return Containment::Subreaper {
            why: "no cgroup v2 mounted".into(),
        };
    };
    let own = fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|s| gpusweep_core::cgroup::unified_path(&s).map(str::to_string))
        .unwrap_or_else(|| "/".into());
    let parent = mount.join(own.trim_start_matches('/'));
    let leaf = parent.join(format!("{RUN_LEAF_PREFIX}{supervisor}"));
    if let Err(e) = fs::create_dir(&leaf) {
        return Containment::Subreaper {
            why: format!("cannot create {}: {e}", leaf.display()),
        };
    }
    // Moving a process needs write access to the leaf's cgroup.procs and to the common ancestor's.
    let writable = |p: &Path| {
        fs::OpenOptions::new()
            .write(true)
            .open(p.join("cgroup.procs"))
            .is_ok()
    };
    if !writable(&leaf) || !writable(&parent) {
        let _ = fs::remove_dir(&leaf);
        return Containment::Subreaper {
            why: format!("{} is not delegated to this user", parent.display()),
        };
    }
    let kill = leaf.join("cgroup.kill").exists();
    Containment::Cgroup { leaf, kill }
}

/// Why a job's containment could not be set up or ended.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("PR_SET_CHILD_SUBREAPER: {0}")]
    Subreaper(std::io::Error),
    #[error("{path}: {source}")]
    Kill {
        path: String,
        source: std::io::Error,
    },
}

/// Make gpusweep the child subreaper: orphans among its descendants are reparented to it, not PID 1.
pub fn become_subreaper() -> Result<(), JobError> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| JobError::Subreaper(e.into()))
}

/// Start `argv` in a process group of its own and, with a cgroup, inside the leaf: the child moves itself
/// there between fork and exec, so not even its first fork escapes.
pub fn spawn(argv: &[String], c: &Containment) -> std::io::Result<Child> {
    let Some((prog, args)) = argv.split_first() else {
        return Err(std::io::Error::other("no command"));
    };
    let mut cmd = Command::new(prog);
    cmd.args(args).process_group(0);
    if let Containment::Cgroup { leaf, .. } = c {
        let procs: OwnedFd = fs::OpenOptions::new()
            .write(true)
            .open(leaf.join("cgroup.procs"))?
            .into();
        gpusweep_sys::join_cgroup_before_exec(&mut cmd, procs.as_fd());
        let child = cmd.spawn();
        drop(procs);
        return child;
    }
    cmd.spawn()
}

/// The job's processes now: the leaf's members, or every descendant of the supervisor (a subreaper
/// keeps them all in its subtree).
pub fn members(c: &Containment, supervisor: u32) -> Vec<u32> {
    match c {
        Containment::Cgroup { leaf, .. } => fs::read_to_string(leaf.join("cgroup.procs"))
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default(),
        Containment::Subreaper { .. } => descendants(supervisor),
    }
}

/// Every live descendant of `pid`, from one pass over /proc (zombies left out: they are reaped, not killed).
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parent = std::collections::HashMap::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(st) = fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| parse_stat(&s))
                .filter(|st| !st.state.is_zombie())
            {
                parent.insert(p, st.ppid);
            }
        }
    }
    let mut out: Vec<u32> = parent
        .keys()
        .copied()
        .filter(|&p| {
            let mut cur = p;
            for _ in 0..64 {
                match parent.get(&cur) {
                    Some(&pp) if pp == pid => return true,
                    Some(&pp) if pp > 1 => cur = pp,
                    _ => return false,
                }
            }
            false
        })
        .collect();
    out.sort_unstable();
    out
}

/// `cgroup.kill`: SIGKILL to every member at once, atomically, including ones forking right now.
pub fn cgroup_kill(leaf: &Path) -> Result<(), JobError> {
    let path = leaf.join("cgroup.kill");
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|mut f| f.write_all(b"1"))
        .map_err(|source| JobError::Kill {
            path: path.display().to_string(),
            source,
        })
}

/// Reap every child that has exited (a subreaper adopts orphans; their zombies are ours to reap). Returns
/// the exit status of `main` if it was among them: the shell's convention, 128 + N for a signal.
/// How the job's command ended: its exit status, or the signal that killed it (an exit status of 255 is
/// not a signal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Exited(i32),
    Signaled(i32),
}

impl Ended {
    /// The status a shell would report: the exit status, or 128 + the signal.
    pub fn code(self) -> i32 {
        match self {
            Ended::Exited(c) => c,
            Ended::Signaled(s) => 128 + s,
        }
    }
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::Exited(c) => write!(f, "exit status {c}"),
            Ended::Signaled(s) => write!(f, "killed by signal {s}"),
        }
    }
}

pub fn reap(main: u32) -> Option<Ended> {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let mut status = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(p, code)) => {
                if p.as_raw().cast_unsigned() == main {
                    status = Some(Ended::Exited(code));
                }
            }
            Ok(WaitStatus::Signaled(p, sig, _)) => {
                if p.as_raw().cast_unsigned() == main {
                    status = Some(Ended::Signaled(sig as i32));
                }
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return status,
            Ok(_) => {}
        }
    }
}

/// Wait until the job has no member left, reaping as they go; false if `limit` passed first.
pub fn await_empty(
    c: &Containment,
    supervisor: u32,
    main: u32,
    limit: Duration,
) -> (bool, Option<Ended>) {
    let deadline = Instant::now() + limit;
    let mut status = None;
    loop {
        if let Some(s) = reap(main) {
            status = Some(s);
        }
        if members(c, supervisor).is_empty() {
            return (true, status);
        }
        if Instant::now() >= deadline {
            return (false, status);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Remove the leaf once it is empty.
pub fn release(c: &Containment) {
    if let Containment::Cgroup { leaf, .. } = c {
        let _ = fs::remove_dir(leaf);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cgroup2_mount_is_read_from_mountinfo() {
        let hybrid = "30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                      31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n\
                      32 30 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(
            super::cgroup2_mount(hybrid).as_deref(),
            Some(std::path::Path::new("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            super::cgroup2_mount("1 0 0:1 / / rw - ext4 /dev/vda rw\n"),
            None
        );
    }
}
