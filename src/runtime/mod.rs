//! The runtime: the fleet (one collector per host, keyed by `HostId`), the one poll loop shared by the
//! fleet and the agent, settings resolution and the config file. Analysis runs here, once per reading.

pub mod config;
pub mod eventlog;
pub mod fleet;
pub mod ledger;
pub mod poll;
pub mod settings;

pub use fleet::{CMD_QUEUE, Fleet, FleetOptions, HostEvent, load_local_early, start_local_nvml};
pub use ledger::{Judged, Provenance, StateCounts};

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

/// The async runtime every front end runs its fleet on: two workers (readings are parsed there; the front
/// end's own loop runs on the thread that blocks on it).
pub fn async_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// How often hosts are read while something waits for them to become clean (a sweep, a re-watch, `wait`).
pub const FAST_POLL: std::time::Duration = std::time::Duration::from_millis(100);
pub use settings::{Overrides, Settings};

/// End gpusweep on SIGINT, SIGTERM or SIGHUP with the shell's codes (130, 143, 129), after killing what it
/// started (the process groups of `cmd:` hosts): a signal runs no destructor. For the subcommands; the TUI
/// handles these signals itself and leaves through its own clean-up.
pub fn exit_on_signals() {
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(|| {
            use tokio::signal::unix::{SignalKind, signal};
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            let code = rt.block_on(async {
                let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::terminate()),
                    signal(SignalKind::hangup()),
                ) else {
                    return None;
                };
                tokio::select! {
                    _ = int.recv() => Some(130),
                    _ = term.recv() => Some(143),
                    _ = hup.recv() => Some(129),
                }
            });
            if let Some(code) = code {
                shutdown();
                std::process::exit(code);
            }
        });
    if let Err(e) = spawned {
        eprintln!("gpusweep: cannot watch for signals: {e}");
    }
}

/// What must not outlive gpusweep: the process groups of `cmd:` hosts; an NVML load started early and never
/// used is let finish first.
pub fn shutdown() {
    crate::source::remote::command::kill_all();
    crate::source::local::early::settle(std::time::Duration::from_secs(2));
}
