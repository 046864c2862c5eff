//! Shell completion scripts, generated from the clap definitions by clap_complete. Its fish script completes
//! options only: a positional argument's values (`gpusweep completions <shell>`) and `help`'s subcommands
//! fell back to file names (clap issue #6295). The lines that say them are added here, from the same
//! definitions.

use std::io::Write;

/// The completion script for `shell`.
pub fn write(
    shell: clap_complete::Shell,
    mut cmd: clap::Command,
    w: &mut dyn Write,
) -> std::io::Result<()> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "gpusweep", &mut script);
    w.write_all(&script)?;
    if shell == clap_complete::Shell::Fish {
        cmd.build();
        w.write_all(fish_positionals(&cmd).as_bytes())?;
    }
    Ok(())
}

/// For each subcommand, its positional arguments' possible values, and for `help`, the subcommands: fish
/// offers these and no file names.
fn fish_positionals(root: &clap::Command) -> String {
    let quote = |s: &str| s.replace('\\', "\\\\").replace('\'', "\\'");
    let mut out =
        String::from("\n# Positional values (clap_complete's fish script leaves them out).\n");
    for sub in root.get_subcommands().filter(|s| !s.is_hide_set()) {
        for arg in sub.get_positionals().filter(|a| !a.is_hide_set()) {
            let values: Vec<String> = arg
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| quote(v.get_name()))
                .collect();
            if values.is_empty() {
                continue;
            }
            out.push_str(&format!(
                "complete -c gpusweep -n \"__fish_gpusweep_using_subcommand {}\" -f -a '{}'\n",
                sub.get_name(),
                values.join(" ")
            ));
        }
    }
    let subs: Vec<String> = root
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .map(|s| quote(s.get_name()))
        .collect();
    out.push_str(&format!(
        "complete -c gpusweep -n \"__fish_gpusweep_using_subcommand help\" -f -a '{}'\n",
        subs.join(" ")
    ));
    out
}
