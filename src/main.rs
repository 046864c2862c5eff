//! CLI entry only: parse, pick the mode, map errors to exit codes.

use clap::Parser;
use gpusweep::cli::{Cli, Command};
use gpusweep::commands::{self, SmemArgs, SweepArgs};

fn main() {
    gpusweep::trace("main", "start");
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpusweep: error: {e:#}");
            2
        }
    };
    gpusweep::trace("main", "exit");
    std::process::exit(code);
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    let s = commands::settings(&cli.global)?;
    gpusweep::trace("main", "settings resolved");
    let explicit_hosts = !cli.global.hosts.is_empty() || cli.global.hostfile.is_some();
    match cli.command {
        None => gpusweep::tui::run(&s),
        Some(Command::Snapshot { json }) => commands::snapshot(&s, json),
        Some(Command::Wait {
            gpus,
            tolerance,
            timeout,
            poll,
        }) => commands::wait(&s, gpus.as_deref(), tolerance, timeout.as_deref(), &poll),
        Some(Command::Sweep {
            gpus,
            grace,
            dry_run,
            yes,
            no_wait,
            timeout,
            tolerance,
        }) => commands::sweep_cmd(
            &s,
            &SweepArgs {
                gpus: gpus.as_deref(),
                grace: &grace,
                dry_run,
                yes,
                no_wait,
                timeout: &timeout,
                tolerance,
            },
        ),
        Some(Command::Kill {
            pids,
            host,
            signal,
            grace,
            yes,
        }) => commands::kill_cmd(&s, &pids, host.as_deref(), &signal, grace.as_deref(), yes),
        Some(Command::Smem {
            tile,
            dtype,
            stages,
            epilogue,
            cc,
            json,
        }) => commands::smem_cmd(
            &s,
            &SmemArgs {
                tile: tile.as_deref(),
                dtype: &dtype,
                stages,
                epilogue,
                cc: cc.as_deref(),
                json,
            },
            explicit_hosts,
        ),
        Some(Command::Agent { demo_host }) => commands::agent_cmd(&s, &demo_host),
    }
}
