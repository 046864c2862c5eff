//! The command-line front end: one module per subcommand, each with its arguments as clap parsed them; tables
//! and prompts. Each resolves what it needs, starts the fleet, prints, and maps results to exit codes.

pub mod args;
pub mod check;
pub mod common;
pub mod completions;
pub mod early;
pub mod kill;
pub mod manpages;
pub mod run;
pub mod shm;
pub mod slurm;
pub mod smem;
pub mod snapshot;
pub mod sweep;
pub mod values;
pub mod wait;

pub use args::{CliCommand, EXIT_CODES, ShmAction};

use crate::runtime::Settings;

/// Run a subcommand of the CLI front end (`run` starts through its supervisor, in `main`).
pub fn run(s: &Settings, cmd: &CliCommand, explicit_hosts: bool) -> anyhow::Result<i32> {
    let acts = matches!(
        cmd,
        CliCommand::Kill(_) | CliCommand::Sweep(sweep::SweepArgs { dry_run: false, .. })
    );
    if s.readonly && acts {
        anyhow::bail!(
            "read-only (--readonly / readonly = true): no kill or sweep; `sweep --dry-run` shows the plan"
        );
    }
    match cmd {
        CliCommand::Snapshot(a) => snapshot::run(s, a),
        CliCommand::Check(a) => check::run(s, a),
        CliCommand::Wait(a) => wait::run(s, a),
        CliCommand::Sweep(a) => sweep::run(s, a),
        CliCommand::Kill(a) => kill::run(s, a),
        CliCommand::Smem(a) => smem::run(s, a, explicit_hosts),
        CliCommand::Shm {
            action: ShmAction::Clean(a),
        } => shm::run(s, a),
        CliCommand::Prolog(a) => slurm::prolog(s, a),
        CliCommand::Epilog(a) => slurm::epilog(s, a),
        CliCommand::Run(_) => anyhow::bail!("run starts through its supervisor"),
    }
}
