//! Entry only: parse, pick the front end, map errors to exit codes.

use clap::Parser;
use gpusweep::cli::{Cli, Command};
use gpusweep::core::trace;

fn main() {
    trace("main", "start");
    gpusweep::runtime::raise_fd_limit();
    let cli = Cli::parse();
    if cli.command.is_some() {
        gpusweep::act::own::default_sigpipe();
        gpusweep::runtime::exit_on_signals();
    }
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpusweep: error: {e:#}");
            2
        }
    };
    trace("main", "exit");
    gpusweep::runtime::shutdown();
    std::process::exit(code);
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    let s = gpusweep::runtime::settings::resolve(&cli.global.overrides())?;
    trace("main", "settings resolved");
    // The config's keys are checked whatever the subcommand: a broken file is reported where it is read.
    gpusweep::tui::keymap::Keymap::with_overrides(&s.config.keys)
        .map_err(|e| anyhow::anyhow!("config: {e}"))?;
    let explicit_hosts = cli.global.hosts_named();
    match cli.command {
        None => {
            use std::io::IsTerminal;
            if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
                anyhow::bail!(
                    "the TUI needs a terminal (stdin and stdout); for a one-off reading use `gpusweep snapshot`, over SSH `ssh -t`"
                );
            }
            gpusweep::tui::run(&s)
        }
        Some(Command::Agent { demo_host }) => gpusweep::agent::run(&s, &demo_host),
        Some(cmd) => gpusweep::cli::run(&s, cmd, explicit_hosts),
    }
}
