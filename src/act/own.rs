//! What gpusweep does to its own process.

/// Put SIGPIPE back to its default: a command whose reader went away (`gpusweep snapshot | head`) ends
/// quietly, as every Unix filter does, instead of failing on a write with "Broken pipe".
pub fn default_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL, before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
