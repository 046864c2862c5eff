//! Parsers for what `/proc` says about a process, shared by the local scan, the agentless scan and the
//! delivery re-check. Pure: callers read the files.

use super::model::{Proc, ProcState};

/// `include/linux/sched.h`: this task is a kernel thread.
pub(crate) const PF_KTHREAD: u64 = 0x0020_0000;
/// `include/linux/sched.h`: this task is getting shut down (set before its files are closed).
pub const PF_EXITING: u64 = 0x0000_0004;

/// Parse `/proc/PID/stat`. The comm may hold spaces and parentheses, so fields are read after the last ')'.
pub fn parse_stat(s: &str) -> Option<Proc> {
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let pid = s[..open].trim().parse().ok()?;
    let comm = s[open + 1..close].to_string();
    let mut f = s[close + 1..].split_ascii_whitespace();
    let state = ProcState::from_char(f.next()?.chars().next()?);
    let ppid = f.next()?.parse().ok()?;
    let pgid = f.next()?.parse().ok();
    let sid = f.next()?.parse().ok()?;
    let _tty = f.next()?;
    let _tpgid = f.next()?;
    // Field 9: the kernel's flags; PF_KTHREAD marks a kernel thread whatever its PID (PID 2 inside a PID
    // namespace is an ordinary process).
    let flags: u64 = f.next()?.parse().ok()?;
    // starttime is field 22; after ')' we have consumed fields 3..=9, so skip 12 more.
    let start_time = f.nth(12)?.parse().ok()?;
    Some(Proc {
        pid,
        ppid,
        sid,
        pgid,
        state,
        start_time,
        comm,
        kernel_thread: flags & PF_KTHREAD != 0,
        exiting: flags & PF_EXITING != 0,
        ..Default::default()
    })
}

/// The number of live threads `/proc/PID/stat` counts (field 20). A true zombie counts 1; a thread group
/// whose leader exited (state Z) while others run counts them: it is alive.
pub fn parse_threads(s: &str) -> Option<u32> {
    let close = s.rfind(')')?;
    // After ')': field 3 is the state; field 20 is the 18th.
    s[close + 1..]
        .split_ascii_whitespace()
        .nth(17)?
        .parse()
        .ok()
}

/// Whether a stat line is a zombie that is really dead: state Z and no thread left running.
pub fn dead_zombie(s: &str) -> bool {
    parse_stat(s).is_some_and(|p| p.state.is_zombie()) && parse_threads(s).is_none_or(|n| n <= 1)
}

/// `/proc/PID/cmdline` bytes as one line: NULs become spaces, trailing space trimmed.
pub fn parse_cmdline(raw: &[u8]) -> String {
    let mut s: String = String::from_utf8_lossy(raw).replace('\0', " ");
    let t = s.trim_end().len();
    s.truncate(t);
    s
}

/// The minor number a device file stands for: `/dev/nvidia3` -> 3. Control files (nvidiactl, nvidia-uvm,
/// nvidia-caps/*) stand for no single GPU.
pub fn device_minor(path: &str) -> Option<u32> {
    let base = path.rsplit('/').next()?;
    let digits = base.strip_prefix("nvidia")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zombie_leader_whose_threads_run_is_not_dead() {
        // Real lines: a leader that called pthread_exit with one thread running, and a true zombie.
        let leader =
            "26135 (leaderexit) Z 1 26135 26135 0 -1 4194564 100 0 0 0 0 0 0 0 20 0 2 0 610897 0 0";
        let zombie =
            "26200 (python3) Z 1 26200 26200 0 -1 4227084 100 0 0 0 0 0 0 0 20 0 1 0 610999 0 0";
        assert_eq!(parse_threads(leader), Some(2));
        assert!(!dead_zombie(leader));
        assert!(dead_zombie(zombie));
        assert!(!dead_zombie(
            "1 (init) S 0 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0"
        ));
    }

    #[test]
    fn stat_with_spaces_and_parens_in_comm() {
        let s = "946 (python3 (w) x) S 1 924 924 0 -1 4194560 1 0 0 0 5 3 0 0 20 0 2 0 123456 100 5 18446744073709551615";
        let p = parse_stat(s).expect("parses");
        assert_eq!(
            (p.pid, p.ppid, p.sid, p.state, p.start_time),
            (946, 1, 924, ProcState::Sleeping, 123_456)
        );
        assert_eq!(p.comm, "python3 (w) x");
    }

    #[test]
    fn kernel_threads_are_told_by_their_flags_not_their_pid() {
        // kthreadd on the host: flags 0x208040 (PF_KTHREAD set).
        let k =
            "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0 18446744073709551615";
        assert!(parse_stat(k).expect("parses").kernel_thread);
        // PID 2 inside a PID namespace: an ordinary process (flags 0x400100).
        let p = "2 (python3) S 1 1 1 0 -1 4194560 1 0 0 0 5 3 0 0 20 0 2 0 123456 100 5 18446744073709551615";
        let p = parse_stat(p).expect("parses");
        assert!(!p.kernel_thread);
        assert!(!p.exiting);
        assert_eq!(p.start_time, 123_456);
        // A rank on its way out (flags 0x40404044: PF_EXITING set).
        let x =
            "534 (python3) D 530 530 530 0 -1 1077952580 1 0 0 0 5 3 0 0 20 0 1 0 123456 100 5 1";
        assert!(parse_stat(x).expect("parses").exiting);
    }

    #[test]
    fn stat_garbage_is_none() {
        assert!(parse_stat("").is_none());
        assert!(parse_stat("12 (x) S").is_none());
        assert!(parse_stat("x (y) S 1 2 3").is_none());
    }

    #[test]
    fn device_minor_maps_only_gpu_files() {
        assert_eq!(device_minor("/dev/nvidia0"), Some(0));
        assert_eq!(device_minor("/dev/nvidia7"), Some(7));
        assert_eq!(device_minor("/tmp/x/nvidia12"), Some(12));
        assert_eq!(device_minor("/dev/nvidiactl"), None);
        assert_eq!(device_minor("/dev/nvidia-uvm"), None);
        assert_eq!(device_minor("/dev/nvidia-caps/nvidia-cap1"), None);
    }

    #[test]
    fn cmdline_nuls() {
        assert_eq!(parse_cmdline(b"python3\0-m\0x\0"), "python3 -m x");
    }
}
