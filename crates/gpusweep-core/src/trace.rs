//! `GPUSWEEP_TRACE=1` prints when each phase of a reading or a connection ends, on stderr, with the time since
//! the first trace line. For finding where time goes on a real host; silent otherwise.

use std::sync::OnceLock;
use std::time::Instant;

/// Whether tracing is on: a caller whose line costs something to make asks first.
pub fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("GPUSWEEP_TRACE").is_some())
}

pub fn trace(host: &str, what: &str) {
    static START: OnceLock<Instant> = OnceLock::new();
    if on() {
        let t = START.get_or_init(Instant::now).elapsed();
        eprintln!("[{:>9.3} ms] {host}: {what}", t.as_secs_f64() * 1e3);
    }
}
