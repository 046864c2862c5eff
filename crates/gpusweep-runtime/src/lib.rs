//! The runtime: the fleet (one collector per host, keyed by `HostId`), the one poll loop shared by the
//! fleet and the agent, settings resolution and the config file. Analysis runs here, once per reading.

#![forbid(unsafe_code)]

pub mod config;
pub mod eventlog;
pub mod fleet;
pub mod ledger;
pub mod poll;
pub mod settings;

pub use fleet::{CMD_QUEUE, Fleet, FleetOptions, HostEvent, load_local_early, start_local_nvml};
pub use ledger::{Judged, Judgement, MemoryJudged, Provenance, StateCounts};

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

/// The shell's code of the signal gpusweep is ending on (0: none): the main thread, finishing while the
/// signal's clean-up ends the `cmd:` hosts it waited on, must not exit with a success of its own.
static ENDING: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The code of the signal gpusweep is ending on, if one came.
pub fn ended_by_signal() -> Option<i32> {
    match ENDING.load(std::sync::atomic::Ordering::SeqCst) {
        0 => None,
        c => Some(c),
    }
}

/// End gpusweep on SIGINT, SIGTERM or SIGHUP with the shell's codes (130, 143, 129), after killing what it
/// started (the process groups of `cmd:` hosts): a signal runs no destructor. For the subcommands; the TUI
/// handles these signals itself and leaves through its own clean-up.
pub fn exit_on_signals() {
    use tokio::signal::unix::{SignalKind, signal};
    // The handlers are installed here, before this returns: installed by the watching thread instead, a
    // signal that came while `cmd:` hosts were starting killed gpusweep with its default action and left
    // their processes behind (the test that sends SIGTERM once they run saw it under load).
    let installed = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .and_then(|rt| {
            let signals = {
                let _in_rt = rt.enter();
                (
                    signal(SignalKind::interrupt())?,
                    signal(SignalKind::terminate())?,
                    signal(SignalKind::hangup())?,
                )
            };
            Ok((rt, signals))
        });
    let (rt, (mut int, mut term, mut hup)) = match installed {
        Ok(x) => x,
        Err(e) => {
            eprintln!("gpusweep: cannot watch for signals: {e}");
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let code = rt.block_on(async {
                tokio::select! {
                    _ = int.recv() => 130,
                    _ = term.recv() => 143,
                    _ = hup.recv() => 129,
                }
            });
            ENDING.store(code, std::sync::atomic::Ordering::SeqCst);
            shutdown();
            std::process::exit(code);
        });
    if let Err(e) = spawned {
        eprintln!("gpusweep: cannot watch for signals: {e}");
    }
}

/// What must not outlive gpusweep: the process groups of `cmd:` hosts; an NVML load started early and never
/// used is let finish first.
pub fn shutdown() {
    gpusweep_source::remote::command::kill_all();
    gpusweep_source::local::early::settle(std::time::Duration::from_secs(2));
}
