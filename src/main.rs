//! Entry only: parse, pick the front end, map errors to exit codes.

use clap::Parser;
use gpusweep::cli::{Cli, Command};
use gpusweep::core::trace;

fn main() {
    trace("main", "start");
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpusweep: error: {e:#}");
            2
        }
    };
    trace("main", "exit");
    std::process::exit(code);
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    let s = gpusweep::runtime::settings::resolve(&cli.global.overrides())?;
    trace("main", "settings resolved");
    let explicit_hosts = cli.global.hosts_named();
    match cli.command {
        None => gpusweep::tui::run(&s),
        Some(Command::Agent { demo_host }) => gpusweep::agent::run(&s, &demo_host),
        Some(cmd) => gpusweep::cli::run(&s, cmd, explicit_hosts),
    }
}
