//! A process's threads, where its main thread is not the whole story. A thread group whose leader exited
//! (`pthread_exit` in `main`) shows state Z while its other threads run on, holding fds and mappings that
//! only their own `/proc/PID/task/TID/` show; a thread that called `unshare(CLONE_FILES)` has an fd table of
//! its own, listed nowhere else. Either would let a live GPU holder pass as gone.

use std::path::Path;

use gpusweep_core::model::ProcState;
use gpusweep_core::procstat::parse_stat;

/// A live thread of `pid` other than its leader, with its state: where a zombie leader's fds and maps are
/// read from. `None` when none lives.
pub(crate) fn live_thread(proc_root: &Path, pid: u32) -> Option<(u32, ProcState)> {
    let dir = std::fs::read_dir(proc_root.join(pid.to_string()).join("task")).ok()?;
    dir.flatten().find_map(|e| {
        let tid: u32 = e.file_name().to_str()?.parse().ok()?;
        if tid == pid {
            return None;
        }
        let st = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let state = parse_stat(&st)?.state;
        (!state.is_zombie()).then_some((tid, state))
    })
}

/// The threads of `pid` whose fd table is not `reference`'s (the leader's, or the live thread standing in
/// for it). kcmp(2) compares the tables themselves: a thread that unshared its table and opened the same
/// numbers again is still told apart.
pub(crate) fn private_fd_tables(proc_root: &Path, pid: u32, reference: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(proc_root.join(pid.to_string()).join("task")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&tid| tid != reference && tid != pid)
        .filter(|&tid| !gpusweep_sys::same_fd_table(reference, tid).unwrap_or(true))
        .collect()
}
