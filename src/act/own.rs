//! What gpusweep does to its own process.

/// Put SIGPIPE back to its default: a command whose reader went away (`gpusweep snapshot | head`) ends
/// quietly, as every Unix filter does, instead of failing on a write with "Broken pipe".
pub fn default_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL, before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Re-execute this binary as `gpusweep run [job PID spec-fd N]`, handing it `spec` through a pipe on fd N:
/// the supervisor's `/proc/PID/cmdline` then holds nothing of the command it runs, so `pkill -f COMMAND`
/// never hits it. Returns only on failure.
pub fn reexec_with_spec(spec: &[u8]) -> std::io::Error {
    use std::io::Write;
    use std::os::fd::{AsRawFd, IntoRawFd};
    let err = |e: nix::Error| std::io::Error::from_raw_os_error(e as i32);
    // Without O_CLOEXEC: the read end must survive the exec; the write end is closed before it.
    let (r, w) = match nix::unistd::pipe2(nix::fcntl::OFlag::empty()) {
        Ok(p) => p,
        Err(e) => return err(e),
    };
    let mut w = std::fs::File::from(w);
    if spec.len() > 60_000 {
        return std::io::Error::other("the command line is too long to hand over");
    }
    if let Err(e) = w.write_all(spec) {
        return e;
    }
    drop(w);
    let fd = r.as_raw_fd();
    let argv = [
        c"gpusweep".to_owned(),
        c"run".to_owned(),
        match std::ffi::CString::new(format!("[job {} spec-fd {fd}]", std::process::id())) {
            Ok(c) => c,
            Err(e) => return std::io::Error::other(e),
        },
    ];
    // The fd is the exec'd program's now; it closes it once read.
    let _ = r.into_raw_fd();
    match nix::unistd::execv(c"/proc/self/exe", &argv) {
        Err(e) => err(e),
        Ok(never) => match never {},
    }
}

/// In a re-executed supervisor (`gpusweep run [job PID spec-fd N]`), the spec from fd N, which is closed.
pub fn take_spec(arg: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    let inner = arg.strip_prefix("[job ")?.strip_suffix(']')?;
    let (pid, fd) = inner.split_once(" spec-fd ")?;
    if pid.parse::<u32>().ok()? != std::process::id() {
        return None;
    }
    let fd: i32 = fd.parse().ok()?;
    // Only a pipe: never read whatever else a mistyped number names.
    // SAFETY: the borrow lives for one fstat(2); a number that names no open fd is EBADF, nothing more.
    let st = nix::sys::stat::fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFIFO {
        return None;
    }
    // SAFETY: fd N was left open for us by `reexec_with_spec` and nothing else owns it; it is a pipe.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).ok()?;
    Some(buf)
}
