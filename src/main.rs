//! Entry only: parse, pick the front end, map errors to exit codes.

#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use gpusweep::cli::{CliCommand, args};
use gpusweep::core::trace;
use gpusweep::runtime::Overrides;

#[derive(Debug, Parser)]
#[command(
    name = "gpusweep",
    version,
    about = args::ABOUT,
    long_about = args::LONG_ABOUT,
    after_help = args::EXIT_CODES
)]
struct Cli {
    #[command(flatten)]
    global: Overrides,
    #[command(subcommand)]
    command: Option<Command>,
}

/// Every subcommand: the CLI front end's, then the node daemon, the remote end, and what is generated from
/// these definitions.
#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Cli(CliCommand),
    /// Print a shell completion script: `gpusweep completions bash > ~/.local/share/bash-completion/completions/gpusweep`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        #[arg(hide_possible_values = true)]
        // the line above names them; the man page's list broke mandoc
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), or with --dir write one per command (gpusweep-serve.1...):
    /// `gpusweep man --dir ~/.local/share/man/man1`.
    Man {
        /// Write every page into DIR (created), one per command, where `man` finds them.
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
    /// The node daemon: Prometheus metrics (dcgm-exporter's names), the JSON API and its event stream over
    /// HTTP, and a local socket that `snapshot`, `wait`, `sweep` and `kill` use. Read-only over HTTP.
    #[command(after_help = gpusweep::serve::SERVE_HELP)]
    Serve(gpusweep::serve::ServeArgs),
    /// The remote end: JSON snapshots on stdout, one per line; commands on stdin.
    Agent(gpusweep::agent::AgentArgs),
}

fn main() {
    trace("main", "start");
    gpusweep::runtime::raise_fd_limit();
    // `gpusweep run` re-executes itself with a neutral argv and reads its own from a pipe.
    let argv: Vec<String> = std::env::args().collect();
    let supervisor = match argv.as_slice() {
        [_, run, job] if run == "run" => gpusweep::act::own::take_spec(job)
            .and_then(|spec| serde_json::from_slice::<Vec<String>>(&spec).ok()),
        _ => None,
    };
    let cli = if let Some(original) = &supervisor {
        Cli::try_parse_from(original)
    } else {
        // A plain reading of this host starts loading NVML while clap parses.
        gpusweep::cli::early::load_nvml_before_parsing(&argv);
        Cli::try_parse()
    };
    let cli = cli.unwrap_or_else(|e| {
        // Usage errors, --help and --version end here; an NVML load started above finishes first.
        gpusweep::runtime::shutdown();
        e.exit()
    });
    // The supervisor forwards INT/TERM/HUP to its job; it must not die of them. A serve stops cleanly on
    // them (its socket file removed).
    if cli.command.is_some()
        && !matches!(
            cli.command,
            Some(Command::Cli(CliCommand::Run(_)) | Command::Serve(_))
        )
    {
        gpusweep::act::own::default_sigpipe();
        gpusweep::runtime::exit_on_signals();
    }
    let code = match run(cli, supervisor.is_some()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpusweep: error: {}", report(&e));
            2
        }
    };
    trace("main", "exit");
    gpusweep::runtime::shutdown();
    // Ended by a signal while finishing (its clean-up ended the hosts waited on): the signal's code.
    std::process::exit(gpusweep::runtime::ended_by_signal().unwrap_or(code));
}

/// An error and its causes on one line, each cause said once: a message that already quotes its cause (as
/// `config: FILE: WHY` does) is not followed by it again.
fn report(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !out.contains(&c) {
            out.push_str(": ");
            out.push_str(&c);
        }
    }
    out
}

fn run(mut cli: Cli, supervised: bool) -> anyhow::Result<i32> {
    // Generated from these definitions, before any setting is read.
    match &cli.command {
        Some(Command::Completions { shell }) => {
            let cmd = <Cli as clap::CommandFactory>::command();
            gpusweep::cli::completions::write(*shell, cmd, &mut std::io::stdout())?;
            return Ok(0);
        }
        Some(Command::Man { dir }) => {
            let cmd = <Cli as clap::CommandFactory>::command();
            match dir {
                Some(dir) => {
                    for p in gpusweep::cli::manpages::write_all(cmd, dir)
                        .map_err(|e| anyhow::anyhow!("--dir {}: {e}", dir.display()))?
                    {
                        println!("{}", p.display());
                    }
                }
                None => gpusweep::cli::manpages::render(&cmd, &mut std::io::stdout())?,
            }
            return Ok(0);
        }
        _ => {}
    }
    // Commands that act on this machine itself never read another (the node's serve, from a container).
    if matches!(
        cli.command,
        Some(
            Command::Serve(_)
                | Command::Agent(_)
                | Command::Cli(CliCommand::Run(_) | CliCommand::Prolog(_) | CliCommand::Epilog(_))
        )
    ) {
        cli.global.node_serve = None;
    }
    let s = gpusweep::runtime::settings::resolve(&cli.global)?;
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
        Some(Command::Agent(a)) => gpusweep::agent::run(&s, &a),
        Some(Command::Serve(a)) => gpusweep::serve::run(&s, &a),
        Some(Command::Cli(CliCommand::Run(a))) => {
            if !supervised {
                gpusweep::act::own::default_sigpipe();
                let original: Vec<String> = std::env::args().collect();
                let e = gpusweep::act::own::reexec_with_spec(&serde_json::to_vec(&original)?);
                anyhow::bail!("cannot start the supervisor: {e}");
            }
            gpusweep::cli::run::supervise_job(&s, &a)
        }
        Some(Command::Cli(cmd)) => {
            for note in &s.notes {
                eprintln!("gpusweep: {note}");
            }
            gpusweep::cli::run(&s, &cmd, explicit_hosts)
        }
        Some(Command::Completions { .. } | Command::Man { .. }) => Ok(0),
    }
}
