//! `GPUSWEEP_TRACE=1` prints when each phase of a reading or a connection ends, on stderr, with the time since
//! the first trace line. For finding where time goes on a real host; silent otherwise.

use std::sync::OnceLock;
use std::time::Instant;

pub fn trace(host: &str, what: &str) {
    static START: OnceLock<Instant> = OnceLock::new();
    static ON: OnceLock<bool> = OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("GPUSWEEP_TRACE").is_some()) {
        let t = START.get_or_init(Instant::now).elapsed();
        eprintln!("[{:>9.3} ms] {host}: {what}", t.as_secs_f64() * 1e3);
    }
}
