//! pidfds: a handle on one process that a PID reuse cannot redirect. The only `unsafe` of gpusweep is here and
//! in the other `act` modules: raw syscalls with integer arguments.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use crate::core::signal::Sig;

/// An open pidfd; closed when dropped.
pub struct PidFd(OwnedFd);

impl PidFd {
    pub fn open(pid: u32) -> std::io::Result<PidFd> {
        let pid = libc::pid_t::try_from(pid)
            .map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?;
        // SAFETY: plain syscall with integer arguments.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd = i32::try_from(fd).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
        // SAFETY: the kernel just gave us this descriptor and nothing else owns it.
        Ok(PidFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub fn send(&self, sig: Sig) -> std::io::Result<()> {
        // SAFETY: a valid pidfd, a valid signal number, no siginfo.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                sig.number(),
                std::ptr::null::<libc::siginfo_t>(),
                0 as libc::c_uint,
            )
        };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    fn raw(&self) -> i32 {
        self.0.as_raw_fd()
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
        wait_exits(&[self], Instant::now())[0]
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

/// Wait until each pidfd is readable (its process exited) or the deadline passes. Returns which exited.
pub fn wait_exits(fds: &[&PidFd], deadline: Instant) -> Vec<bool> {
    let mut exited = vec![false; fds.len()];
    loop {
        let mut polls: Vec<libc::pollfd> = fds
            .iter()
            .zip(&exited)
            .filter(|(_, e)| !**e)
            .map(|(f, _)| libc::pollfd {
                fd: f.raw(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        if polls.is_empty() {
            return exited;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        let n_fds = libc::nfds_t::try_from(polls.len()).unwrap_or(libc::nfds_t::MAX);
        // SAFETY: `polls` is a valid array of pollfd for its length.
        let n = unsafe { libc::poll(polls.as_mut_ptr(), n_fds, ms) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return exited;
        }
        for p in polls.iter().filter(|p| p.revents != 0) {
            if let Some(i) = fds.iter().position(|f| f.raw() == p.fd) {
                exited[i] = true;
            }
        }
        if n == 0 || Instant::now() >= deadline {
            return exited;
        }
    }
}
