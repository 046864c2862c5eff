//! pidfds: a handle on one process that a PID reuse cannot redirect. Opened, signalled and polled through
//! rustix's safe wrappers: no `unsafe` here.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;

use rustix::event::{PollFd, PollFlags};
use rustix::process::{Pid, PidfdFlags, Signal};

use gpusweep_core::signal::Sig;

/// An open pidfd; closed when dropped.
pub(crate) struct PidFd(OwnedFd);

impl PidFd {
    pub fn open(pid: u32) -> std::io::Result<PidFd> {
        let pid = i32::try_from(pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ESRCH))?;
        let fd = rustix::process::pidfd_open(pid, PidfdFlags::empty())?;
        Ok(PidFd(fd))
    }

    pub fn send(&self, sig: Sig) -> std::io::Result<()> {
        rustix::process::pidfd_send_signal(&self.0, signal(sig))?;
        Ok(())
    }

    /// The pidfs inode of the process (Linux 6.9+); `None` on older kernels, where every pidfd shares one.
    pub fn inode(&self) -> Option<u64> {
        let fs = rustix::fs::fstatfs(&self.0).ok()?;
        (fs.f_type == PIDFS_MAGIC)
            .then(|| rustix::fs::fstat(&self.0).ok().map(|st| st.st_ino))
            .flatten()
    }

    /// Whether the process has exited, without waiting.
    pub fn exited(&self) -> bool {
        wait_exits(&[self], Instant::now())[0].is_some()
    }
}

/// `PID_FS_MAGIC` from linux/magic.h.
const PIDFS_MAGIC: rustix::fs::FsWord = 0x5049_4446;

/// Why this kernel (or this seccomp profile) gives no pidfds, in words: `None` where they work.
pub fn missing() -> Option<String> {
    match PidFd::open(std::process::id()) {
        Ok(_) => None,
        Err(e) => no_pidfd(&e),
    }
}

/// The words for an error that means "no pidfds here" (rather than "no such process").
pub fn no_pidfd(e: &std::io::Error) -> Option<String> {
    match e.raw_os_error() {
        Some(libc::ENOSYS) => Some("this kernel has no pidfd; kills are disabled".into()),
        // pidfd_open checks no permission on its target: EPERM is a filter saying no.
        Some(libc::EPERM) => {
            Some("pidfd_open is blocked here (a seccomp filter); kills are disabled".into())
        }
        _ => None,
    }
}

/// The signal as rustix names it.
fn signal(sig: Sig) -> Signal {
    match sig {
        Sig::Term => Signal::TERM,
        Sig::Kill => Signal::KILL,
        Sig::Int => Signal::INT,
        Sig::Hup => Signal::HUP,
        Sig::Quit => Signal::QUIT,
        Sig::Usr1 => Signal::USR1,
        Sig::Usr2 => Signal::USR2,
        Sig::Cont => Signal::CONT,
        Sig::Stop => Signal::STOP,
    }
}

/// Wait until each pidfd is readable (its process exited) or the deadline passes. Returns when each was
/// seen to exit (`None`: still running): a target that ends at once is not timed by one that takes the grace.
pub(crate) fn wait_exits(fds: &[&PidFd], deadline: Instant) -> Vec<Option<Instant>> {
    let mut exited = vec![None; fds.len()];
    loop {
        let waiting: Vec<usize> = (0..fds.len()).filter(|&i| exited[i].is_none()).collect();
        if waiting.is_empty() {
            return exited;
        }
        let mut polls: Vec<PollFd> = waiting
            .iter()
            .map(|&i| PollFd::from_borrowed_fd(fds[i].0.as_fd(), PollFlags::IN))
            .collect();
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = rustix::event::Timespec::try_from(left).ok();
        let n = match rustix::event::poll(&mut polls, timeout.as_ref()) {
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return exited,
        };
        let now = Instant::now();
        for (p, &i) in polls.iter().zip(&waiting) {
            if !p.revents().is_empty() {
                exited[i] = Some(now);
            }
        }
        if n == 0 || Instant::now() >= deadline {
            return exited;
        }
    }
}
