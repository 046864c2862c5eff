//! `deploy/kubernetes/`: every built-in resource validated against Kubernetes 1.37's schemas by a real
//! validator (`kubernetes-validate` from PyPI, which scripts/test.sh installs), and what the files say of
//! gpusweep checked against gpusweep itself (the port the PodMonitor scrapes, the plugin's command line).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{BIN, text};

fn deploy(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/kubernetes")
        .join(name)
}

#[test]
fn the_manifests_validate_against_kubernetes_1_37() {
    let files = ["daemonset.yaml", "gate-pod.yaml", "npd-gpusweep.yaml"];
    let o = Command::new("kubernetes-validate")
        .args(["--strict", "-k", "1.37.0"])
        .args(files.iter().map(|f| deploy(f)))
        .output()
        .expect("kubernetes-validate (PyPI; scripts/test.sh installs it)");
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for kind in [
        "serviceaccount/gpusweep",
        "daemonset/gpusweep",
        "service/gpusweep",
        "pod/inference",
        "configmap/npd-gpusweep",
    ] {
        assert!(
            t.contains(&format!("passed for resource {kind}")),
            "{kind}: {t}"
        );
    }
}

#[test]
fn what_the_manifests_ask_of_gpusweep_is_what_it_does() {
    let ds = std::fs::read_to_string(deploy("daemonset.yaml")).expect("daemonset");
    let pm = std::fs::read_to_string(deploy("podmonitor.yaml")).expect("podmonitor");
    // The PodMonitor (a custom resource: no built-in schema) scrapes the port the DaemonSet names.
    assert!(ds.contains("- name: metrics") && ds.contains("containerPort: 9401"));
    assert!(pm.contains("- port: metrics") && pm.contains("path: /metrics"));
    assert!(ds.contains("\"--listen\", \"0.0.0.0:9401\""));
    // The plugin config is JSON node-problem-detector reads; its rule runs `gpusweep check` with a line no
    // longer than NPD keeps.
    let npd = std::fs::read_to_string(deploy("npd-gpusweep.yaml")).expect("npd");
    let json: String = npd
        .split_once("gpusweep-check.json: |\n")
        .expect("the plugin config")
        .1
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let cfg: serde_json::Value = serde_json::from_str(&json).expect("NPD's JSON");
    let rule = &cfg["rules"][0];
    assert_eq!(rule["args"][0], "check");
    assert_eq!(rule["args"][1], "--max-line");
    assert_eq!(
        rule["args"][2].as_str().and_then(|s| s.parse::<u64>().ok()),
        cfg["pluginConfig"]["max_output_length"].as_u64()
    );
    // And every option the manifests pass is one gpusweep takes.
    for (cmd, opts) in [
        (
            "serve",
            &["--listen", "--no-socket", "--readonly", "--shm-dir"][..],
        ),
        ("check", &["--max-line"][..]),
        ("wait", &["--hosts", "--gpus", "--timeout"][..]),
    ] {
        let o = Command::new(BIN)
            .args([cmd, "--help"])
            .output()
            .expect("help");
        let help = text(&o);
        for opt in opts {
            assert!(help.contains(opt), "{cmd} {opt}: {help}");
        }
    }
}
