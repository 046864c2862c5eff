//! Entry only: parse, pick the front end, map errors to exit codes.

use clap::Parser;
use gpusweep::cli::{Cli, Command};
use gpusweep::core::trace;

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
        && !matches!(cli.command, Some(Command::Run { .. } | Command::Serve(_)))
    {
        gpusweep::act::own::default_sigpipe();
        gpusweep::runtime::exit_on_signals();
    }
    let code = match run(cli, supervisor.is_some()) {
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

fn run(cli: Cli, supervised: bool) -> anyhow::Result<i32> {
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
        Some(Command::Serve(o)) => gpusweep::serve::run(
            &s,
            &gpusweep::serve::ServeArgs {
                listen: o.listen,
                no_http: o.no_http,
                socket: o.socket,
                no_socket: o.no_socket,
                token_file: o.token_file,
                tls_cert: o.tls_cert,
                tls_key: o.tls_key,
            },
        ),
        Some(Command::Run {
            gpus,
            grace,
            timeout,
            no_preflight,
            command,
        }) => {
            if !supervised {
                gpusweep::act::own::default_sigpipe();
                let original: Vec<String> = std::env::args().collect();
                let e = gpusweep::act::own::reexec_with_spec(&serde_json::to_vec(&original)?);
                anyhow::bail!("cannot start the supervisor: {e}");
            }
            gpusweep::cli::run::supervise_job(
                &s,
                &gpusweep::cli::run::RunArgs {
                    gpus: gpus.map(|g| g.0),
                    grace,
                    timeout,
                    no_preflight,
                    command,
                },
            )
        }
        Some(cmd) => gpusweep::cli::run(&s, cmd, explicit_hosts),
    }
}
