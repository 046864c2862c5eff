//! The calls gpusweep needs that rustix, nix and nvml-wrapper do not wrap safely, each behind a safe
//! function: the default SIGPIPE, a supervisor's spec file taken by its number, the pre_exec hook that joins a
//! cgroup, kcmp(2), NVML's MIG instance ids and the allocator's give-back. The only crate of gpusweep allowed
//! `unsafe` (every other one forbids it); each block carries its SAFETY argument.
#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::process::Command;

/// Put SIGPIPE back to its default: a command whose reader went away (`gpusweep snapshot | head`) ends
/// quietly, as every Unix filter does, instead of failing on a write with "Broken pipe". Call it before
/// any other thread exists.
pub fn default_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL; no handler, no memory.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Take fd `fd` as a file, but only when it is an anonymous file (memfd) named `name`: never whatever else
/// a mistyped number names. The caller is the one owner of that fd from now on (a re-executed process
/// taking what its parent left open for it, once, at start).
pub fn adopt_memfd(fd: i32, name: &str) -> Option<File> {
    use std::os::fd::FromRawFd;
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    if !link
        .to_string_lossy()
        .starts_with(&format!("/memfd:{name}"))
    {
        return None;
    }
    // SAFETY: the fd is open (its /proc link was just read) and is the memfd named `name`, which only the
    // parent's re-exec leaves open; nothing else in this process owns it.
    Some(unsafe { File::from_raw_fd(fd) })
}

/// Between fork and exec, have the child write "0" to `procs` (a cgroup's `cgroup.procs`), so it runs its
/// first instruction inside the cgroup and not even its first fork escapes. `procs` must stay open until the
/// command is spawned; if it is not, the write fails and so does the spawn.
pub fn join_cgroup_before_exec(cmd: &mut Command, procs: BorrowedFd<'_>) {
    use std::os::unix::process::CommandExt;
    let raw = procs.as_raw_fd();
    // SAFETY: between fork and exec only write(2) on an fd opened before the fork: async-signal-safe, no
    // allocation, no lock.
    unsafe {
        cmd.pre_exec(move || {
            let n = libc::write(raw, b"0".as_ptr().cast(), 1);
            if n == 1 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

/// Whether two tasks share one fd table (kcmp(2) KCMP_FILES); `None` when the kernel cannot say (no kcmp,
/// no permission).
pub fn same_fd_table(a: u32, b: u32) -> Option<bool> {
    const KCMP_FILES: libc::c_long = 2;
    // SAFETY: kcmp(2) takes five integers and returns one; no memory is passed or written.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            libc::c_long::from(a),
            libc::c_long::from(b),
            KCMP_FILES,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    };
    (r >= 0).then_some(r == 0)
}

/// A MIG device's (GPU instance id, compute instance id): NVML's `nvmlDeviceGetGpuInstanceId` and
/// `nvmlDeviceGetComputeInstanceId`, which nvml-wrapper loads but does not wrap. `None` where NVML does not
/// say.
pub fn mig_instance_ids(
    nvml: &nvml_wrapper::Nvml,
    dev: &nvml_wrapper::Device<'_>,
) -> (Option<u32>, Option<u32>) {
    let lib = nvml.lib();
    let (Ok(gi), Ok(ci)) = (
        lib.nvmlDeviceGetGpuInstanceId.as_ref(),
        lib.nvmlDeviceGetComputeInstanceId.as_ref(),
    ) else {
        return (None, None);
    };
    let (mut g, mut c) = (0u32, 0u32);
    // SAFETY: both are NVML's own entry points, loaded with the library this handle came from; each takes
    // the handle (which the borrowed Device keeps valid) and writes one unsigned int through a pointer to a
    // local that outlives the call.
    let (rg, rc) = unsafe {
        let h = dev.handle();
        (gi(h, &raw mut g), ci(h, &raw mut c))
    };
    ((rg == 0).then_some(g), (rc == 0).then_some(c))
}

/// Return the allocator's free pages to the system now: mimalloc's `mi_collect(true)` (it purges freed pages
/// on its own after a delay too; this makes the end of a burst certain rather than eventual).
pub fn allocator_give_back() {
    // SAFETY: mi_collect takes no pointer and only releases memory the allocator holds free; it is
    // thread-safe (it collects the calling thread's heap and the abandoned ones).
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_shares_its_own_fd_table_and_an_fd_that_is_no_memfd_is_not_taken() {
        let me = std::process::id();
        // kcmp may be refused (no CAP_SYS_PTRACE over itself under some LSMs): then it says None, never false.
        assert_ne!(same_fd_table(me, me), Some(false));
        let f = File::open("/proc/self/status").expect("open");
        assert!(adopt_memfd(f.as_raw_fd(), "gpusweep-run-spec").is_none());
        assert!(adopt_memfd(987_654, "gpusweep-run-spec").is_none());
    }
}
