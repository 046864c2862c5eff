//! Man pages, one per command (`gpusweep(1)`, `gpusweep-serve(1)`, `gpusweep-shm-clean(1)`...), generated from
//! the same clap definitions as `--help`. clap_mangen writes every section but the text after the options,
//! which it fills as one paragraph: a table there (exit codes, findings) would be run together. Here a block
//! whose lines are indented after a `Title:` line is a table, set unfilled under its own heading; any other
//! paragraph is filled.

use std::io::Write;
use std::path::{Path, PathBuf};

use roff::{Roff, roman};

/// Every page of `cmd` and its visible subcommands, written into `dir` (created); the paths written.
pub fn write_all(cmd: clap::Command, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut out = Vec::new();
    write_tree(&cmd, dir, &mut out)?;
    Ok(out)
}

fn write_tree(cmd: &clap::Command, dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_tree(sub, dir, out)?;
    }
    let man = clap_mangen::Man::new(cmd.clone());
    let path = dir.join(man.get_filename());
    let mut f = std::fs::File::create(&path)?;
    render(cmd, &mut f)?;
    f.flush()?;
    out.push(path);
    Ok(())
}

/// One command's page.
pub fn render(cmd: &clap::Command, w: &mut dyn Write) -> std::io::Result<()> {
    let mut cmd = cmd.clone();
    cmd.build();
    let man = page(&cmd);
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(w)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(w)?;
    }
    if let Some(after) = cmd.get_after_long_help().or_else(|| cmd.get_after_help()) {
        notes(&after.to_string()).to_writer(w)?;
    }
    if cmd.get_version().is_some() {
        man.render_version_section(w)?;
    }
    Ok(())
}

/// When these pages last changed in substance (`.TH`'s date slot: mandoc reads a date there, and without one
/// clap_mangen leaves the command's name in it).
const PAGES_DATE: &str = "2026-12-06";

/// A command's page with its title line whole: date, source (the version) and manual.
fn page(cmd: &clap::Command) -> clap_mangen::Man {
    clap_mangen::Man::new(cmd.clone())
        .date(PAGES_DATE)
        .source(format!("gpusweep {}", env!("CARGO_PKG_VERSION")))
        .manual("gpusweep manual")
}

/// The text after the options: tables unfilled under their headings, paragraphs filled.
fn notes(text: &str) -> Roff {
    let mut r = Roff::new();
    r.control("SH", ["NOTES"]);
    // A paragraph right under a heading needs no `.PP` (mandoc: "skipping paragraph macro").
    let mut under_heading = true;
    for block in text.split("\n\n") {
        let mut lines = block.lines();
        let Some(first) = lines.next() else { continue };
        let rest: Vec<&str> = lines.collect();
        let table = first.trim_end().ends_with(':')
            && !rest.is_empty()
            && rest.iter().all(|l| l.starts_with(' '));
        if table {
            r.control("SS", [first.trim_end().trim_end_matches(':')]);
            r.control("nf", []);
            for l in rest {
                r.text([roman(l.strip_prefix("  ").unwrap_or(l))]);
            }
            r.control("fi", []);
            under_heading = false;
        } else {
            if !under_heading {
                r.control("PP", []);
            }
            under_heading = false;
            r.text([roman(
                block.split_whitespace().collect::<Vec<_>>().join(" "),
            )]);
        }
    }
    r
}
