//! The runtime: the fleet (one collector per host, keyed by `HostId`), the one poll loop shared by the
//! fleet and the agent, settings resolution and the config file. Analysis runs here, once per reading.

pub mod config;
pub mod fleet;
pub mod poll;
pub mod settings;

pub use fleet::{Fleet, FleetOptions, HostEvent};

/// Raise the soft limit on open files to the hard limit: a sweep holds a pidfd per target during its grace
/// period, and a node may have thousands of targets. Returns the soft limit now in force.
pub fn raise_fd_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return Some(hard);
    }
    Some(soft)
}

/// How often hosts are read while something waits for them to become clean (a sweep, a re-watch, `wait`).
pub const FAST_POLL: std::time::Duration = std::time::Duration::from_millis(100);
pub use settings::{Overrides, Settings};
