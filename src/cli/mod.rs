//! The command-line front end: one module per subcommand; tables and prompts. Each resolves its own
//! arguments, starts the fleet, prints, and maps results to exit codes.

pub mod args;
pub mod common;
pub mod early;
pub mod kill;
pub mod run;
pub mod shm;
pub mod slurm;
pub mod smem;
pub mod snapshot;
pub mod sweep;
pub mod wait;

pub use args::{Cli, Command, EXIT_CODES, Global, ShmAction};

use crate::runtime::Settings;

/// Run a subcommand other than the TUI and the agent (those are front ends of their own).
#[allow(clippy::too_many_lines)] // one arm per subcommand, each only unpacking its arguments
pub fn run(s: &Settings, cmd: Command, explicit_hosts: bool) -> anyhow::Result<i32> {
    match cmd {
        Command::Snapshot { json, no_gauges } => snapshot::run(s, json, !no_gauges),
        Command::Wait {
            gpus,
            tolerance,
            timeout,
            poll,
            job,
        } => wait::run(
            s,
            &wait::WaitArgs {
                gpus: gpus.map(|g| g.0),
                job,
                tolerance_mib: tolerance,
                timeout,
                poll,
            },
        ),
        Command::Sweep { dry_run: false, .. } | Command::Kill { .. } if s.readonly => {
            anyhow::bail!(
                "read-only (--readonly / readonly = true): no kill or sweep; `sweep --dry-run` shows the plan"
            )
        }
        Command::Sweep {
            gpus,
            job,
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
                job,
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
            job,
        } => kill::run(
            s,
            &kill::KillArgs {
                pids,
                host,
                signal,
                grace,
                yes,
                job,
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
        Command::Shm {
            action: ShmAction::Clean { dry_run, yes },
        } => shm::run(s, &shm::CleanArgs { dry_run, yes }),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "gpusweep",
                &mut std::io::stdout(),
            );
            Ok(0)
        }
        Command::Man => {
            clap_mangen::Man::new(<Cli as clap::CommandFactory>::command())
                .render(&mut std::io::stdout())?;
            Ok(0)
        }
        Command::Run { .. } => anyhow::bail!("run starts through its supervisor"),
        Command::Prolog(g) => slurm::prolog(s, &g.args()),
        Command::Epilog(g) => slurm::epilog(s, &g.args()),
        Command::Agent { .. } => anyhow::bail!("the agent is not a cli subcommand"),
        Command::Serve(_) => anyhow::bail!("serve is not a cli subcommand"),
    }
}
