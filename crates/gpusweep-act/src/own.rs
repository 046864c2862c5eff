//! What gpusweep does to its own process.

/// Put SIGPIPE back to its default: a command whose reader went away (`gpusweep snapshot | head`) ends
/// quietly, as every Unix filter does, instead of failing on a write with "Broken pipe".
pub fn default_sigpipe() {
    gpusweep_sys::default_sigpipe();
}

/// The name of the file a supervisor's spec is handed over in (memfd names show as `/memfd:NAME`).
const SPEC_NAME: &str = "gpusweep-run-spec";

/// Re-execute this binary as `gpusweep run [job PID spec-fd N]`, handing it `spec` in an anonymous file
/// (memfd) on fd N: the supervisor's `/proc/PID/cmdline` then holds nothing of the command it runs, so
/// `pkill -f COMMAND` never hits it. A file, not a pipe: a pipe holds 64 KiB (one page for a user over
/// `fs.pipe-user-pages-soft`), and nobody reads it before the exec. Returns only on failure.
pub fn reexec_with_spec(spec: &[u8]) -> std::io::Error {
    use std::io::{Seek, Write};
    use std::os::fd::{AsRawFd, IntoRawFd};
    // Without MFD_CLOEXEC: the file must survive the exec.
    let fd = match rustix::fs::memfd_create(SPEC_NAME, rustix::fs::MemfdFlags::empty()) {
        Ok(fd) => fd,
        Err(e) => return e.into(),
    };
    let mut f = std::fs::File::from(fd);
    if let Err(e) = f.write_all(spec).and_then(|()| f.rewind()) {
        return e;
    }
    let raw = f.as_raw_fd();
    let argv = [
        c"gpusweep".to_owned(),
        c"run".to_owned(),
        match std::ffi::CString::new(format!("[job {} spec-fd {raw}]", std::process::id())) {
            Ok(c) => c,
            Err(e) => return std::io::Error::other(e),
        },
    ];
    // The fd is the exec'd program's now; it closes it once read.
    let _ = f.into_raw_fd();
    match nix::unistd::execv(c"/proc/self/exe", &argv) {
        Err(e) => std::io::Error::from_raw_os_error(e as i32),
        Ok(never) => match never {},
    }
}

/// In a re-executed supervisor (`gpusweep run [job PID spec-fd N]`), the spec from fd N, which is closed.
pub fn take_spec(arg: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    let inner = arg.strip_prefix("[job ")?.strip_suffix(']')?;
    let (pid, fd) = inner.split_once(" spec-fd ")?;
    if pid.parse::<u32>().ok()? != std::process::id() {
        return None;
    }
    let fd: i32 = fd.parse().ok()?;
    // Only the file `reexec_with_spec` made: never read whatever else a mistyped number names.
    let mut f = gpusweep_sys::adopt_memfd(fd, SPEC_NAME)?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).ok()?;
    Some(buf)
}
