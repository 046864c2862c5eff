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
    let files = [
        "daemonset.yaml",
        "gate-pod.yaml",
        "npd-gpusweep.yaml",
        "node-writer.yaml",
    ];
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
        "clusterrole/gpusweep-node-writer",
        "validatingadmissionpolicy/gpusweep-node-writer",
        "networkpolicy/gpusweep-egress",
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
    // Closed by default: a token from a Secret, a NetworkPolicy, the runtime's seccomp profile; the gates
    // reach their own node's serve through a node-local Service, never a port of the node.
    assert!(ds.contains("\"--token-file\", \"/etc/gpusweep/token\""));
    assert!(ds.contains("mountPath: /etc/gpusweep") && ds.contains("secretName: gpusweep-token"));
    assert!(ds.contains("kind: NetworkPolicy") && ds.contains("gpusweep.io/client: \"true\""));
    // A pod's label is its author's: the gates' namespaces are an administrator's to name.
    assert!(ds.contains("gpusweep.io/gates: \"true\"") && !ds.contains("namespaceSelector: {}"));
    assert!(ds.contains("seccompProfile:") && ds.contains("type: RuntimeDefault"));
    assert!(ds.contains("name: gpusweep-node") && ds.contains("internalTrafficPolicy: Local"));
    assert!(!ds.contains("hostPort") && !ds.contains("hostNetwork"));
    let gate = std::fs::read_to_string(deploy("gate-pod.yaml")).expect("gate pod");
    assert!(
        gate.contains("http://gpusweep-node.gpusweep.svc:9401"),
        "{gate}"
    );
    assert!(
        gate.contains("gpusweep.io/client: \"true\""),
        "through the NetworkPolicy"
    );
    assert!(
        gate.contains("secretName: gpusweep-token") && gate.contains("GPUSWEEP_HTTP_TOKEN_FILE")
    );
    assert!(
        pm.contains("name: gpusweep-token"),
        "Prometheus scrapes with the token: {pm}"
    );
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
    // NPD refuses a monitor whose rule's program does not exist: it is where the .deb installs it.
    let cargo = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .expect("Cargo.toml");
    let deb_dir = cargo
        .lines()
        .find(|l| l.contains("\"target/release/gpusweep\""))
        .and_then(|l| l.split('"').nth(3))
        .expect("the .deb's binary");
    assert_eq!(rule["path"], format!("/{deb_dir}gpusweep"), "{rule}");
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
            &[
                "--listen",
                "--token-file",
                "--no-socket",
                "--readonly",
                "--shm-dir",
            ][..],
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

/// The gate's command line, as `gate-pod.yaml` writes it, with the serve at `127.0.0.1:port` for its node's
/// Service and `timeout`; and the path its token is mounted at.
fn gate_script(port: &str, timeout: &str) -> (String, String) {
    let pod = std::fs::read_to_string(deploy("gate-pod.yaml")).expect("gate pod");
    let line = pod
        .lines()
        .find(|l| l.contains("exec gpusweep wait"))
        .expect("the gate's command")
        .trim()
        .trim_start_matches("- ")
        .to_string();
    let token = pod
        .lines()
        .skip_while(|l| !l.contains("name: GPUSWEEP_HTTP_TOKEN_FILE"))
        .nth(1)
        .and_then(|l| l.trim().strip_prefix("value: "))
        .expect("the token's path")
        .to_string();
    (
        line.replace(
            "gpusweep-node.gpusweep.svc:9401",
            &format!("127.0.0.1:{port}"),
        )
        .replace("--timeout 10m", &format!("--timeout {timeout}")),
        token,
    )
}

#[test]
#[allow(clippy::too_many_lines)] // one gate: clean, held, without the token
fn the_init_container_gate_passes_on_its_clean_gpus_and_holds_on_a_held_one() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tmp");
    // The DaemonSet's Secret, as its volume lays it out (0400 for the serve; the gate reads its own copy).
    let token = "3f6c0e7d9a1b2c4d5e6f708192a3b4c5";
    let serve_token = dir.path().join("serve-token");
    std::fs::write(&serve_token, format!("{token}\n")).expect("token");
    std::fs::set_permissions(&serve_token, std::fs::Permissions::from_mode(0o400)).expect("chmod");
    // The node's serve: the demo's gpu-b, whose GPUs 0-5 read clean and 6-7 are held.
    let serve = crate::support::DemoServe::start(
        dir.path(),
        &[
            "--no-socket".as_ref(),
            "--token-file".as_ref(),
            serve_token.as_os_str(),
        ],
    );
    let addr = serve.addr.clone();
    let port = addr.rsplit(':').next().expect("port").to_string();
    // The GPUs' UUIDs, as NVIDIA's device plugin puts them in NVIDIA_VISIBLE_DEVICES.
    let o = crate::support::gpusweep(dir.path())
        .args(["snapshot", "--json", "--hosts", &format!("http://{addr}")])
        .env("GPUSWEEP_HTTP_TOKEN_FILE", &serve_token)
        .output()
        .expect("snapshot");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let uuid = |i: usize| {
        v["hosts"][0]["gpus"][i]["uuid"]
            .as_str()
            .expect("uuid")
            .to_string()
    };
    let bin_dir = Path::new(BIN).parent().expect("bin dir");
    // The gate's token where the pod mounts it, moved under this test's directory.
    let gate = |devices: &str, timeout: &str, with_token: bool| {
        let (script, path) = gate_script(&port, timeout);
        let mounted = dir.path().join(path.trim_start_matches('/'));
        std::fs::create_dir_all(mounted.parent().expect("dir")).expect("mkdir");
        let _ = std::fs::remove_file(&mounted);
        if with_token {
            std::fs::write(&mounted, token).expect("the gate's token");
        }
        let o = Command::new("sh")
            .args(["-c", &script])
            .env("NVIDIA_VISIBLE_DEVICES", devices)
            .env("GPUSWEEP_HTTP_TOKEN_FILE", &mounted)
            .env("PATH", format!("{}:/usr/bin:/bin", bin_dir.display()))
            .env("GPUSWEEP_CONFIG", dir.path().join("none.toml"))
            .output()
            .expect("the gate");
        (o.status.code(), text(&o))
    };
    let (code, t) = gate(&format!("{},{}", uuid(0), uuid(1)), "10m", true);
    assert_eq!(code, Some(0), "the pod's GPUs are clean: {t}");
    let (code, t) = gate(&format!("{},{}", uuid(0), uuid(6)), "2s", true);
    assert_eq!(code, Some(1), "GPU 6 is held: {t}");
    assert!(t.contains("GPU 6"), "{t}");
    // A pod given every GPU: NVIDIA_VISIBLE_DEVICES=all, and two of them are held.
    let (code, t) = gate("all", "2s", true);
    assert_eq!(code, Some(1), "every GPU, 6 and 7 held: {t}");
    // Without the token the serve answers nothing: no verdict, never a start.
    let (code, t) = gate(&format!("{},{}", uuid(0), uuid(1)), "10m", false);
    assert_eq!(code, Some(2), "no token, no verdict: {t}");
}

/// The serve writes the node taint, so it tolerates it: a serve replaced on a held node comes back to lift it.
#[test]
fn the_serve_tolerates_its_own_taint() {
    let ds = std::fs::read_to_string(deploy("daemonset.yaml")).expect("daemonset");
    let tolerates = ds
        .split("tolerations:")
        .nth(1)
        .and_then(|t| t.split("priorityClassName").next())
        .unwrap_or("");
    assert!(
        tolerates.contains("key: gpusweep.io/gpu-held") && tolerates.contains("effect: NoSchedule"),
        "{tolerates}"
    );
}
