//! The command-line front end: one module per subcommand; tables and prompts. Each resolves its own
//! arguments, starts the fleet, prints, and maps results to exit codes.

pub mod args;
pub mod common;
pub mod kill;
pub mod smem;
pub mod snapshot;
pub mod sweep;
pub mod wait;

pub use args::{Cli, Command, EXIT_CODES, Global};

use crate::runtime::Settings;

/// Run a subcommand other than the TUI and the agent (those are front ends of their own).
pub fn run(s: &Settings, cmd: Command, explicit_hosts: bool) -> anyhow::Result<i32> {
    match cmd {
        Command::Snapshot { json } => snapshot::run(s, json),
        Command::Wait {
            gpus,
            tolerance,
            timeout,
            poll,
        } => wait::run(
            s,
            &wait::WaitArgs {
                gpus: gpus.map(|g| g.0),
                tolerance_mib: tolerance,
                timeout,
                poll,
            },
        ),
        Command::Sweep {
            gpus,
            grace,
            dry_run,
            yes,
            no_wait,
            timeout,
            tolerance,
        } => sweep::run(
            s,
            &sweep::SweepArgs {
                gpus: gpus.map(|g| g.0),
                grace,
                dry_run,
                yes,
                no_wait,
                timeout,
                tolerance_mib: tolerance,
            },
        ),
        Command::Kill {
            pids,
            host,
            signal,
            grace,
            yes,
        } => kill::run(
            s,
            &kill::KillArgs {
                pids,
                host,
                signal,
                grace,
                yes,
            },
        ),
        Command::Smem {
            tile,
            dtype,
            stages,
            epilogue,
            cc,
            json,
        } => smem::run(
            s,
            &smem::SmemArgs {
                tile,
                dtype,
                stages,
                epilogue,
                cc,
                json,
            },
            explicit_hosts,
        ),
        Command::Agent { .. } => anyhow::bail!("the agent is not a cli subcommand"),
    }
}
