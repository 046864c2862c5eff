//! Before the command line is parsed: a plain `gpusweep snapshot` or `wait` of this host starts loading NVML at
//! once, ~0.6 ms (clap and the settings) sooner than the parsed command would. Loading NVML and taking the
//! device handles is most of such a run (~20 ms on an H200), so this is ~3% of every run.
//!
//! Only arguments known to keep the host set at "this host" and NVML allowed qualify; anything else (hosts,
//! --demo, --no-nvml, --help, an option this list does not know) waits for the parsed settings. A load that
//! goes unused after all (the config names other hosts) is let finish before exit.

use crate::runtime::settings::serve_socket;

/// Start loading NVML now if `argv` is such a command.
pub fn load_nvml_before_parsing(argv: &[String]) {
    if let Some(gauges) = reads_local_nvml(
        argv,
        std::env::var_os("GPUSWEEP_HOSTS").is_some_and(|h| !h.is_empty()),
    ) && (argv.iter().any(|a| a == "--no-serve") || !serve_socket().is_some_and(|p| p.exists()))
    {
        crate::runtime::start_local_nvml(gauges);
    }
}

/// `Some(gauges)` where `argv` certainly reads this host through NVML, `None` where it may not.
fn reads_local_nvml(argv: &[String], hosts_in_env: bool) -> Option<bool> {
    if hosts_in_env {
        return None;
    }
    let (mut gauges, flags, valued): (bool, &[&str], &[&str]) = match argv.get(1)?.as_str() {
        "snapshot" => (true, &["--json", "--no-gauges", "--no-serve"], &[]),
        "wait" => (
            false,
            &["--no-serve"],
            &["--gpus", "--tolerance", "--timeout", "--poll", "--job"],
        ),
        _ => return None,
    };
    let mut args = argv[2..].iter();
    while let Some(a) = args.next() {
        if a == "--no-gauges" {
            gauges = false;
        }
        if flags.contains(&a.as_str()) {
            continue;
        }
        let name = a.split_once('=').map_or(a.as_str(), |(n, _)| n);
        if !valued.contains(&name) {
            return None;
        }
        if !a.contains('=') {
            args.next()?;
        }
    }
    Some(gauges)
}

#[cfg(test)]
mod tests {
    use super::reads_local_nvml;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn only_plain_local_readings_start_nvml_before_parsing() {
        assert_eq!(
            reads_local_nvml(&argv("gpusweep snapshot --json"), false),
            Some(true)
        );
        assert_eq!(
            reads_local_nvml(&argv("gpusweep snapshot --json --no-gauges"), false),
            Some(false)
        );
        assert_eq!(
            reads_local_nvml(
                &argv("gpusweep wait --timeout 0s --gpus=0,1 --no-serve"),
                false
            ),
            Some(false)
        );
        for no in [
            "gpusweep",
            "gpusweep snapshot --hosts node1",
            "gpusweep snapshot --demo",
            "gpusweep snapshot --no-nvml",
            "gpusweep snapshot --help",
            "gpusweep wait --timeout",
            "gpusweep wait --hostfile f",
            "gpusweep sweep --yes",
            "gpusweep snapshot --config other.toml",
        ] {
            assert_eq!(reads_local_nvml(&argv(no), false), None, "{no}");
        }
        assert_eq!(
            reads_local_nvml(&argv("gpusweep snapshot"), true),
            None,
            "GPUSWEEP_HOSTS set"
        );
    }
}
