//! gpusweep: who holds this GPU memory, and is it gone yet?
//!
//! Data flows one way: sources -> whole snapshots -> `analyze` -> app state -> pure render functions.
//! Actions (kill, sweep, re-watch) go out through `sweep`, locally or as agent commands.

pub mod agent;
pub mod analyze;
pub mod cli;
pub mod collect;
pub mod commands;
pub mod config;
pub mod hosts;
pub mod model;
pub mod smem;
pub mod source;
pub mod sweep;
pub mod tui;
pub mod watch;

/// `GPUSWEEP_TRACE=1` prints when each phase of a reading or a connection ends, on stderr, with the time since
/// the first trace line. For finding where time goes on a real host; silent otherwise.
pub fn trace(host: &str, what: &str) {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("GPUSWEEP_TRACE").is_some()) {
        let t = START.get_or_init(std::time::Instant::now).elapsed();
        eprintln!("[{:>8.3}s] {host}: {what}", t.as_secs_f64());
    }
}
