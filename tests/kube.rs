//! `serve --kube-node` against a real Kubernetes API server: kube-apiserver v1.37.2 and its etcd, built from
//! the Go module proxy by scripts/kube-apiserver.sh (scripts/test.sh runs it) into target/kube/bin, started
//! here on loopback with a CA, a token file and a service-account key of the test's own. The manifests the
//! cluster gets are deploy/kubernetes's own; the serve authenticates with a token the API server issued for a
//! pod bound to node gpu-a, as the kubelet would give it.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde_json::{Value, json};

use crate::support::{Reaped, await_cond, free_port, gpusweep, openssl, set_nvml, standin_nvml};

fn kube_bin(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/kube/bin")
        .join(name);
    assert!(
        p.exists(),
        "{} is missing: scripts/kube-apiserver.sh builds it (scripts/test.sh runs it first)",
        p.display()
    );
    p
}

/// How to call the API server.
#[derive(Clone)]
struct Api {
    dir: PathBuf,
    port: u16,
}

/// etcd and kube-apiserver on loopback.
struct Cluster {
    api: Api,
    _etcd: Reaped,
    server: Option<Reaped>,
}

impl std::ops::Deref for Cluster {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

const ADMIN: &str = "admin-token-4b1f0c8e2d7a9f35";

impl Cluster {
    /// The CA and the server's certificate for 127.0.0.1, the service-account signing key, the admin's token.
    fn keys(dir: &Path) {
        crate::support::loopback_certificate(dir);
        openssl(dir, &["genrsa", "-out", "sa.key", "2048"]);
        openssl(dir, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
        std::fs::write(
            dir.join("tokens.csv"),
            format!("{ADMIN},admin,admin-uid,\"system:masters\"\n"),
        )
        .expect("tokens");
    }

    fn start(dir: &Path) -> Cluster {
        Cluster::keys(dir);
        let (client, peer) = (free_port(), free_port());
        let etcd = Reaped(
            Command::new(kube_bin("etcd"))
                .args(["--name", "t", "--unsafe-no-fsync", "--log-level", "error"])
                .arg("--data-dir")
                .arg(dir.join("etcd"))
                .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
                ))
                .arg(format!("--initial-cluster=t=http://127.0.0.1:{peer}"))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join("etcd.log")).expect("log"))
                .spawn()
                .expect("etcd"),
        );
        std::fs::write(dir.join("etcd-port"), client.to_string()).expect("port");
        let mut c = Cluster {
            api: Api {
                dir: dir.to_path_buf(),
                port: free_port(),
            },
            _etcd: etcd,
            server: None,
        };
        c.start_api(&[]);
        c
    }

    /// The API server (again, after `stop_api`: the same port, the same etcd).
    fn start_api(&mut self, extra: &[&str]) {
        let d = &self.api.dir;
        let etcd = std::fs::read_to_string(d.join("etcd-port")).expect("port");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("apiserver.log"))
            .expect("log");
        let child = Command::new(kube_bin("kube-apiserver"))
            .arg(format!("--etcd-servers=http://127.0.0.1:{etcd}"))
            .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
            .arg(format!("--secure-port={}", self.api.port))
            .arg(format!("--tls-cert-file={}", d.join("cert.pem").display()))
            .arg(format!(
                "--tls-private-key-file={}",
                d.join("key.pem").display()
            ))
            .arg(format!("--client-ca-file={}", d.join("ca.pem").display()))
            .arg(format!(
                "--token-auth-file={}",
                d.join("tokens.csv").display()
            ))
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!(
                "--service-account-key-file={}",
                d.join("sa.pub").display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                d.join("sa.key").display()
            ))
            .args([
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--endpoint-reconciler-type=none",
                "--enable-priority-and-fairness=false",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("kube-apiserver");
        self.server = Some(Reaped(child));
        await_cond("the API server ready", 120, || {
            self.call(ADMIN, "GET", "/readyz", None).0 == 200
        });
    }

    /// The API server hung (SIGSTOP: it keeps its connections and answers nothing) or going on (SIGCONT).
    fn hang_api(&self, hung: bool) {
        let pid = self.server.as_ref().expect("an API server").0.id();
        let sig = if hung {
            nix::sys::signal::Signal::SIGSTOP
        } else {
            nix::sys::signal::Signal::SIGCONT
        };
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
            sig,
        )
        .expect("signal the API server");
    }

    fn stop_api(&mut self) {
        self.server = None;
    }
}

impl Api {
    /// A pod of the writer's service account on gpu-a, and the token the kubelet would mount for it (bound to
    /// the pod, so to gpu-a).
    fn pod_token(&self, name: &str) -> String {
        self.pod_token_in("gpusweep", name)
    }

    /// As `pod_token`, for the service account `gpusweep` of namespace `ns`.
    fn pod_token_in(&self, ns: &str, name: &str) -> String {
        let pod = self.ok(
            "POST",
            &format!("/api/v1/namespaces/{ns}/pods"),
            "application/json",
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"nodeName": "gpu-a",
                "serviceAccountName": "gpusweep", "automountServiceAccountToken": false,
                "containers": [{"name": "gpusweep", "image": "gpusweep"}]}})
            .to_string(),
        );
        let tr = self.ok(
            "POST",
            &format!("/api/v1/namespaces/{ns}/serviceaccounts/gpusweep/token"),
            "application/json",
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
                "expirationSeconds": 3600, "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                "name": name, "uid": pod["metadata"]["uid"]}}})
            .to_string(),
        );
        tr["status"]["token"].as_str().expect("token").to_string()
    }

    /// A kubeconfig that reads its token from the file `token` (as the pod's mounted one is read).
    fn kubeconfig(&self, token: &str) -> PathBuf {
        std::fs::write(self.dir.join("token"), token).expect("token");
        let p = self.dir.join("kubeconfig");
        std::fs::write(
            &p,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: https://127.0.0.1:{}\n    \
                 certificate-authority: {}\nusers:\n- name: w\n  user:\n    tokenFile: {}\ncontexts:\n- name: t\n  \
                 context:\n    cluster: t\n    user: w\ncurrent-context: t\n",
                self.port,
                self.dir.join("ca.pem").display(),
                self.dir.join("token").display()
            ),
        )
        .expect("kubeconfig");
        p
    }

    /// One request: (HTTP status, JSON body or Null).
    fn call(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<(&str, String)>,
    ) -> (u16, Value) {
        let mut c = Command::new("curl");
        c.args([
            "-sS",
            "--max-time",
            "20",
            "-X",
            method,
            "-w",
            "\n%{http_code}",
            "--cacert",
        ])
        .arg(self.dir.join("ca.pem"))
        .arg("-H")
        .arg(format!("Authorization: Bearer {token}"))
        .arg(format!("https://127.0.0.1:{}{path}", self.port))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::piped());
        if let Some((ctype, _)) = &body {
            c.args([
                "-H",
                &format!("Content-Type: {ctype}"),
                "--data-binary",
                "@-",
            ]);
        }
        let mut child = c.spawn().expect("curl");
        let data = body.map(|b| b.1).unwrap_or_default();
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(data.as_bytes())
            .expect("body");
        let out = child.wait_with_output().expect("curl");
        let s = String::from_utf8_lossy(&out.stdout).to_string();
        let (json, code) = s.rsplit_once('\n').unwrap_or(("", "0"));
        (
            code.trim().parse().unwrap_or(0),
            serde_json::from_str(json).unwrap_or(Value::Null),
        )
    }

    fn ok(&self, method: &str, path: &str, ctype: &str, body: String) -> Value {
        let (code, v) = self.call(ADMIN, method, path, Some((ctype, body)));
        assert!((200..300).contains(&code), "{method} {path}: {code} {v}");
        v
    }

    fn node(&self, name: &str) -> Value {
        self.call(ADMIN, "GET", &format!("/api/v1/nodes/{name}"), None)
            .1
    }

    /// Every resource of a manifest file, created as an administrator would apply it.
    fn apply_file(&self, file: &str) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy/kubernetes")
            .join(file);
        let all = std::fs::read_to_string(path).expect("manifest");
        for doc in all.split("\n---\n") {
            let field = |key: &str| {
                doc.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .map(|v| v.trim().to_string())
            };
            let kind = field("kind: ").expect("kind");
            let ns = field("  namespace: ").unwrap_or_default();
            let path = match kind.as_str() {
                "Namespace" => "/api/v1/namespaces".to_string(),
                "ServiceAccount" => format!("/api/v1/namespaces/{ns}/serviceaccounts"),
                "Service" => format!("/api/v1/namespaces/{ns}/services"),
                "DaemonSet" => format!("/apis/apps/v1/namespaces/{ns}/daemonsets"),
                "NetworkPolicy" => {
                    format!("/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies")
                }
                "ClusterRole" => "/apis/rbac.authorization.k8s.io/v1/clusterroles".into(),
                "ClusterRoleBinding" => {
                    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings".into()
                }
                "ValidatingAdmissionPolicy" => {
                    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies".into()
                }
                "ValidatingAdmissionPolicyBinding" => {
                    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings".into()
                }
                other => panic!("{file}: no path for {other}"),
            };
            self.ok("POST", &path, "application/yaml", doc.to_string());
        }
    }
}

/// Wait until each of node-writer.yaml's policies is in force for `token` (a policy holds a moment after it is
/// created; a dry run says when): a label on gpu-b, a device taint in gpu-b's pool, an Event about gpu-b.
fn policies_in_force(c: &Api, token: &str) {
    let dev = gpusweep::serve::kube::body::Device {
        driver: "gpu.nvidia.com".into(),
        pool: "gpu-b".into(),
        device: "gpu-0".into(),
    };
    let rule = gpusweep::serve::kube::body::taint_rule("gpu-a", &dev, "LeftoverHolds");
    let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"generateName": "x-", "namespace": "default"}, "eventTime": "2026-12-07T00:00:00.000000Z",
        "reportingController": "gpusweep.io/serve", "reportingInstance": "gpusweep-gpu-a", "action": "Judge",
        "reason": "GPUHeld", "type": "Warning", "regarding": {"apiVersion": "v1", "kind": "Node",
        "name": "gpu-b"}, "note": "x"});
    await_cond("the admission policies in force", 60, || {
        let label = json!({"metadata": {"labels": {"x": "y"}}}).to_string();
        c.call(
            token,
            "PATCH",
            "/api/v1/nodes/gpu-b?dryRun=All",
            Some(("application/merge-patch+json", label)),
        )
        .0 == 403
            && c.call(
                token,
                "POST",
                "/apis/resource.k8s.io/v1/devicetaintrules?dryRun=All",
                Some(("application/json", rule.to_string())),
            )
            .0 == 403
            && c.call(
                token,
                "POST",
                "/apis/events.k8s.io/v1/namespaces/default/events?dryRun=All",
                Some(("application/json", event.to_string())),
            )
            .0 == 403
    });
}

fn condition(node: &Value, kind: &str) -> Option<Value> {
    node.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .cloned()
}

fn taint_keys(node: &Value) -> Vec<String> {
    node.pointer("/spec/taints")
        .and_then(Value::as_array)
        .map(|t| {
            t.iter()
                .filter_map(|t| t["key"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn held(node: &Value) -> Option<String> {
    condition(node, "GPUHeld").and_then(|c| c["status"].as_str().map(str::to_string))
}

/// The serve, its HTTP address, its stderr kept in a file.
fn serve(tmp: &Path, kubeconfig: &Path, lib: &Path) -> (Reaped, String) {
    let glob = format!("{}/nvidia*", tmp.display());
    let mut child = gpusweep(tmp)
        .args([
            "serve",
            "--no-socket",
            "--listen",
            "127.0.0.1:0",
            "--interval",
            "200ms",
        ])
        .args([
            "--device-glob",
            &glob,
            "--kube-node",
            "gpu-a",
            "--kube-hold",
            "1s",
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("GPUSWEEP_NVML_LIBRARY", lib)
        .env("STANDIN_NVML_STATE", tmp.join("nvml"))
        .env("STANDIN_NVML_LOG", tmp.join("readings"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve");
    let (addr, err) = crate::support::serve_banner(&mut child);
    let mut log = std::fs::File::create(tmp.join("serve.log")).expect("log");
    std::thread::spawn(move || {
        for l in err.lines().map_while(Result::ok) {
            let _ = writeln!(log, "{l}");
        }
    });
    (Reaped(child), addr)
}

fn get(addr: &str, path: &str) -> String {
    let o = Command::new("curl")
        .args(["-sS", "--max-time", "10", &format!("http://{addr}{path}")])
        .output()
        .expect("curl");
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn metric(addr: &str, name: &str) -> Option<f64> {
    get(addr, "/metrics")
        .lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.strip_prefix(' '))
                .map(str::to_string)
        })
        .and_then(|v| v.trim().parse().ok())
}

fn readings(tmp: &Path) -> usize {
    std::fs::read_to_string(tmp.join("readings")).map_or(0, |s| s.lines().count())
}

/// The reasons of gpusweep's Events on a node, oldest first.
fn events(c: &Api, node: &str) -> Vec<String> {
    let (_, v) = c.call(
        ADMIN,
        "GET",
        "/apis/events.k8s.io/v1/namespaces/default/events",
        None,
    );
    let mut e: Vec<(String, String)> = v["items"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|e| {
                    e["regarding"]["name"] == node
                        && e["reportingController"] == "gpusweep.io/serve"
                })
                .map(|e| {
                    (
                        e["eventTime"].as_str().unwrap_or("").to_string(),
                        e["reason"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    e.sort();
    e.into_iter().map(|(_, r)| r).collect()
}

#[test]
#[allow(clippy::too_many_lines)] // one cluster, one story
fn the_serve_keeps_its_own_node_off_the_scheduler_while_a_gpu_is_held() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let mut c = Cluster::start(tmp);
    c.apply_file("daemonset.yaml");
    c.apply_file("node-writer.yaml");
    for n in ["gpu-a", "gpu-b"] {
        c.ok(
            "POST",
            "/api/v1/nodes",
            "application/json",
            json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": n}})
            .to_string(),
        );
    }
    // Each node's GPU as a DRA driver publishes it: found by its UUID (the stand-in driver's GPU 0).
    for n in ["gpu-a", "gpu-b"] {
        c.ok("POST", "/apis/resource.k8s.io/v1/resourceslices", "application/json", json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": format!("{n}-gpus")},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": n, "pool": {"name": n, "generation": 1,
                "resourceSliceCount": 1}, "devices": [{"name": "gpu-0", "attributes": {
                    "uuid": {"string": "GPU-stand-in-0"}}}]}}).to_string());
    }
    // Another manager's taint and condition on gpu-a: never the writer's to touch.
    c.ok(
        "PATCH",
        "/api/v1/nodes/gpu-a",
        "application/merge-patch+json",
        json!({"spec": {"taints": [{"key": "other.io/maintenance", "effect": "NoSchedule"}]}})
            .to_string(),
    );
    c.ok("PATCH", "/api/v1/nodes/gpu-a/status?fieldManager=npd", "application/apply-patch+yaml",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-a"}, "status": {"conditions": [
            {"type": "KernelDeadlock", "status": "False", "reason": "KernelHasNoDeadlock",
             "lastTransitionTime": "2026-12-01T00:00:00Z", "lastHeartbeatTime": "2026-12-01T00:00:00Z"}]}})
        .to_string());
    // The serve's pod on gpu-a, and the token the kubelet would mount for it (bound to the pod, so to gpu-a).
    let token = c.pod_token("serve-a");
    let kubeconfig = c.kubeconfig(&token);

    // The policy holds the writer to its own node and its own keys, whatever RBAC allows. A policy is in force
    // a moment after it is created: a dry run says when.
    policies_in_force(&c, &token);
    let patch = |node: &str, body: Value| {
        c.call(
            &token,
            "PATCH",
            &format!("/api/v1/nodes/{node}"),
            Some(("application/merge-patch+json", body.to_string())),
        )
    };
    let (code, v) = patch(
        "gpu-b",
        json!({"spec": {"taints": [{"key": "gpusweep.io/gpu-held", "effect": "NoSchedule"}]}}),
    );
    assert_eq!(code, 403, "another node: {v}");
    assert!(
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("only the Node its pod runs on")),
        "{v}"
    );
    let (code, v) = patch("gpu-a", json!({"spec": {"taints": null}}));
    assert_eq!(code, 403, "another manager's taint: {v}");
    let (code, v) = patch("gpu-a", json!({"metadata": {"labels": {"x": "y"}}}));
    assert_eq!(code, 403, "a label: {v}");
    let (code, v) = patch(
        "gpu-a",
        json!({"metadata": {"annotations": {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}}}),
    );
    assert_eq!(code, 403, "an annotation: {v}");
    let (code, v) = c.call(
        &token,
        "PATCH",
        "/api/v1/nodes/gpu-a/status",
        Some((
            "application/merge-patch+json",
            json!({"status": {"allocatable": {"nvidia.com/gpu": "0"}}}).to_string(),
        )),
    );
    assert_eq!(code, 403, "what the node offers: {v}");
    // Nor another node's devices.
    let dev = gpusweep::serve::kube::body::Device {
        driver: "gpu.nvidia.com".into(),
        pool: "gpu-b".into(),
        device: "gpu-0".into(),
    };
    let mut rule = gpusweep::serve::kube::body::taint_rule("gpu-a", &dev, "LeftoverHolds");
    let (code, v) = c.call(
        &token,
        "POST",
        "/apis/resource.k8s.io/v1/devicetaintrules?dryRun=All",
        Some(("application/json", rule.to_string())),
    );
    assert_eq!(code, 403, "another node's device: {v}");
    rule["spec"]["deviceSelector"]["pool"] = json!("gpu-a");
    let (code, v) = c.call(
        &token,
        "POST",
        "/apis/resource.k8s.io/v1/devicetaintrules?dryRun=All",
        Some(("application/json", rule.to_string())),
    );
    assert_eq!(code, 201, "its own: {v}");
    assert_eq!(taint_keys(&c.node("gpu-a")), ["other.io/maintenance"]);
    // The writer's taint patch, made from a Node as read, after another writer changed the Node: refused (its
    // resourceVersion test fails), and nothing of the other writer's is lost. The writer then reads again.
    let as_read = c.node("gpu-a");
    let stale = gpusweep::serve::kube::body::taint_patch(&as_read, true, 0).expect("a change");
    c.ok(
        "PATCH",
        "/api/v1/nodes/gpu-a",
        "application/merge-patch+json",
        json!({"metadata": {"annotations": {"other.io/tick": "0"}}}).to_string(),
    );
    let (code, v) = c.call(
        &token,
        "PATCH",
        "/api/v1/nodes/gpu-a",
        Some(("application/json-patch+json", stale.to_string())),
    );
    assert!(code == 409 || code == 422, "a stale patch: {code} {v}");
    assert_eq!(taint_keys(&c.node("gpu-a")), ["other.io/maintenance"]);
    let fresh =
        gpusweep::serve::kube::body::taint_patch(&c.node("gpu-a"), true, 0).expect("a change");
    let undo = gpusweep::serve::kube::body::taint_patch(
        &c.call(
            &token,
            "PATCH",
            "/api/v1/nodes/gpu-a",
            Some(("application/json-patch+json", fresh.to_string())),
        )
        .1,
        false,
        0,
    )
    .expect("a change");
    let (code, v) = c.call(
        &token,
        "PATCH",
        "/api/v1/nodes/gpu-a",
        Some(("application/json-patch+json", undo.to_string())),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(taint_keys(&c.node("gpu-a")), ["other.io/maintenance"]);

    // A clean GPU: once the hold has passed, the node says so.
    let lib = standin_nvml(tmp);
    std::fs::write(tmp.join("nvidia0"), b"").expect("device");
    set_nvml(tmp, "0\n");
    let (_serve, addr) = serve(tmp, &kubeconfig, &lib);
    await_cond("GPUHeld False", 60, || {
        held(&c.node("gpu-a")).as_deref() == Some("False")
    });
    // The serve names its host by its node, not by the pod's UTS name (a new one at every restart).
    let snap: Value = serde_json::from_str(&get(&addr, "/api/v1/snapshot")).unwrap_or_default();
    assert_eq!(snap["hosts"][0]["host"], "gpu-a", "{snap}");
    assert_eq!(taint_keys(&c.node("gpu-a")), ["other.io/maintenance"]);

    // A leftover: a dead PID charged 4 GiB. The confirm window (3 s) and one poll, then the condition and taint.
    let gone = {
        let mut g = Command::new("true").spawn().expect("true");
        let pid = g.id();
        g.wait().expect("reaped");
        pid
    };
    // That GPU's device is tainted for claims; the node's other devices and gpu-b's are not, and the node itself
    // is not: DRA allocates the held GPU, so its siblings stay schedulable.
    let rules = || {
        let (_, v) = c.call(
            ADMIN,
            "GET",
            "/apis/resource.k8s.io/v1/devicetaintrules",
            None,
        );
        v["items"].as_array().cloned().unwrap_or_default()
    };
    set_nvml(tmp, &format!("4096 {gone}:4096\n"));
    let since = Instant::now();
    await_cond("the device taint and the condition", 60, || {
        rules().len() == 1 && held(&c.node("gpu-a")).as_deref() == Some("True")
    });
    let to_taint = since.elapsed();
    let node = c.node("gpu-a");
    let cond = condition(&node, "GPUHeld").expect("condition");
    assert_eq!(
        (cond["status"].as_str(), cond["reason"].as_str()),
        (Some("True"), Some("LeftoverHolds"))
    );
    let msg = cond["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("GPU 0") && msg.contains(&gone.to_string()),
        "{msg}"
    );
    let first = &rules()[0];
    assert_eq!(first["metadata"]["name"], "gpusweep-held.gpu-a.gpu-0");
    assert_eq!(
        first["spec"]["deviceSelector"],
        json!({"driver": "gpu.nvidia.com", "pool": "gpu-a", "device": "gpu-0"})
    );
    // Nothing of the other manager's moved, and no node-wide taint.
    assert_eq!(taint_keys(&node), ["other.io/maintenance"]);
    assert_eq!(
        condition(&node, "KernelDeadlock").expect("kept")["reason"],
        "KernelHasNoDeadlock"
    );

    // A reading that says the same writes nothing: five more polls, no more requests.
    let writes = metric(&addr, "gpusweep_kube_writes_total").expect("writes");
    let seen = readings(tmp);
    await_cond("five more readings", 30, || readings(tmp) >= seen + 5);
    assert_eq!(metric(&addr, "gpusweep_kube_writes_total"), Some(writes));
    assert_eq!(metric(&addr, "gpusweep_kube_node_held"), Some(1.0));

    // Reads zero while another writer keeps changing the Node: the guarded patch is retried, and what the other
    // writer did stays.
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let stop = stop.clone();
        let other = c.api.clone();
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                other.ok(
                    "PATCH",
                    "/api/v1/nodes/gpu-a",
                    "application/merge-patch+json",
                    json!({"metadata": {"annotations": {"other.io/tick": n.to_string()}}})
                        .to_string(),
                );
            }
            n
        })
    };
    set_nvml(tmp, "0\n");
    let since = Instant::now();
    await_cond("taint off", 60, || {
        let n = c.node("gpu-a");
        !taint_keys(&n).contains(&"gpusweep.io/gpu-held".to_string())
            && held(&n).as_deref() == Some("False")
    });
    let to_untaint = since.elapsed();
    await_cond("the device taint gone", 30, || rules().is_empty());
    let conflicts = metric(&addr, "gpusweep_kube_conflicts_total").expect("conflicts");
    stop.store(true, Ordering::Relaxed);
    let ticks = churn.join().expect("churn");
    let node = c.node("gpu-a");
    assert_eq!(taint_keys(&node), ["other.io/maintenance"]);
    assert_eq!(
        node["metadata"]["annotations"]["other.io/tick"],
        ticks.to_string()
    );
    assert_eq!(
        events(&c, "gpu-a"),
        ["GPUClean", "GPUHeld", "GPUClean"],
        "{}",
        std::fs::read_to_string(tmp.join("serve.log")).unwrap_or_default()
    );

    // The API goes away: the serve keeps serving, says the condition is stale, and what happened meanwhile is
    // all told once the API is back.
    c.stop_api();
    set_nvml(tmp, &format!("4096 {gone}:4096\n"));
    await_cond("a failed write said", 60, || {
        get(&addr, "/healthz").contains("could not be written")
    });
    assert!(
        get(&addr, "/healthz").starts_with("ok\n"),
        "the readings are fine"
    );
    assert!(metric(&addr, "gpusweep_kube_writes_failed_total").is_some_and(|f| f >= 1.0));
    set_nvml(tmp, "0\n");
    await_cond("both transitions waiting", 60, || {
        get(&addr, "/healthz").contains("2 transitions not yet told")
    });
    // Back, and this time serving no DeviceTaintRules (as before 1.37, or with the gate off): the node taint alone
    // keeps the node off, said once.
    c.start_api(&["--runtime-config=resource.k8s.io/v1/devicetaintrules=false"]);
    await_cond("told", 90, || events(&c, "gpu-a").len() == 5);
    assert_eq!(
        events(&c, "gpu-a"),
        ["GPUClean", "GPUHeld", "GPUClean", "GPUHeld", "GPUClean"]
    );
    let node = c.node("gpu-a");
    assert_eq!(held(&node).as_deref(), Some("False"));
    assert_eq!(taint_keys(&node), ["other.io/maintenance"]);
    await_cond("healthy again", 30, || {
        !get(&addr, "/healthz").contains("could not be written")
    });

    // The API hangs (stopped, not gone) while a GPU is held: the writer's requests time out (10 s) and
    // `/healthz` says the condition could not be written; once the API answers again the node is marked.
    c.hang_api(true);
    set_nvml(tmp, &format!("4096 {gone}:4096\n"));
    let since = Instant::now();
    await_cond("the hung API said", 60, || {
        get(&addr, "/healthz").contains("could not be written")
    });
    let to_said = since.elapsed();
    c.hang_api(false);
    await_cond("the taint once the API answers", 60, || {
        taint_keys(&c.node("gpu-a")).contains(&"gpusweep.io/gpu-held".to_string())
    });
    set_nvml(tmp, "0\n");
    await_cond("clean again", 60, || {
        !taint_keys(&c.node("gpu-a")).contains(&"gpusweep.io/gpu-held".to_string())
            && !get(&addr, "/healthz").contains("could not be written")
    });

    // The token rotates: its service account is made anew (the old token is refused from then on) and the file
    // holds a new one. The next transition lands at once, not after the client's next timed re-read (50 s).
    c.ok(
        "DELETE",
        "/api/v1/namespaces/gpusweep/serviceaccounts/gpusweep",
        "application/json",
        "{}".into(),
    );
    c.ok(
        "POST",
        "/api/v1/namespaces/gpusweep/serviceaccounts",
        "application/json",
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "gpusweep"}})
            .to_string(),
    );
    await_cond("the old token refused", 60, || {
        c.call(&token, "GET", "/api/v1/nodes/gpu-a", None).0 == 401
    });
    let rotated = c.pod_token("serve-a2");
    std::fs::write(tmp.join("token.new"), &rotated).expect("token");
    std::fs::rename(tmp.join("token.new"), tmp.join("token")).expect("rotate");
    set_nvml(tmp, &format!("4096 {gone}:4096\n"));
    let since = Instant::now();
    await_cond("the taint with the rotated token", 30, || {
        taint_keys(&c.node("gpu-a")).contains(&"gpusweep.io/gpu-held".to_string())
    });
    let after_rotation = since.elapsed();

    // Another manager takes GPUHeld over (forced apply, as an administrator may): the serve never takes it back,
    // says it cannot write it, and its taint still follows the GPUs.
    c.ok(
        "PATCH",
        "/api/v1/nodes/gpu-a/status?fieldManager=npd&force=true",
        "application/apply-patch+yaml",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-a"}, "status": {"conditions": [
            {"type": "GPUHeld", "status": "True", "reason": "NPDSays", "message": "held, says NPD",
             "lastTransitionTime": "2026-12-01T00:00:00Z", "lastHeartbeatTime": "2026-12-01T00:00:00Z"}]}})
        .to_string(),
    );
    set_nvml(tmp, "0\n");
    await_cond("the taint off with GPUHeld another manager's", 60, || {
        !taint_keys(&c.node("gpu-a")).contains(&"gpusweep.io/gpu-held".to_string())
    });
    await_cond("the conflict said", 30, || {
        get(&addr, "/healthz").contains("could not be written")
    });
    assert_eq!(
        condition(&c.node("gpu-a"), "GPUHeld").expect("kept")["reason"],
        "NPDSays"
    );
    let said = std::fs::read_to_string(tmp.join("serve.log")).unwrap_or_default();
    assert_eq!(
        said.matches("serves no DRA device taints").count(),
        1,
        "{said}"
    );
    eprintln!(
        "kube: leftover's first reading to the taint {:.2} s; all-zero to its removal {:.2} s (hold 1 s, confirm 3 s, \
         poll 200 ms); {ticks} concurrent Node updates, {conflicts} guarded patches retried; after the token \
         rotated {:.2} s; a hung API said after {:.2} s",
        to_taint.as_secs_f64(),
        to_untaint.as_secs_f64(),
        after_rotation.as_secs_f64(),
        to_said.as_secs_f64()
    );
}

/// A call of the writer's token that must be refused by a policy (403), not by RBAC or as malformed.
fn refused(c: &Api, token: &str, method: &str, path: &str, ctype: &str, body: &Value, what: &str) {
    let (code, v) = c.call(token, method, path, Some((ctype, body.to_string())));
    assert_eq!(code, 403, "{what}: {v}");
    assert!(
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("ValidatingAdmissionPolicy")),
        "{what}: refused by a policy, not RBAC: {v}"
    );
}

/// The writes a serve's token made past the policies before (each turned by the garbage collector, the taint
/// manager or the scheduler into a deletion or an eviction), every one refused now: owners, finalizers, a
/// NoExecute taint, the status but GPUHeld, device taints beyond one GPU of its own with NoSchedule, Events
/// about another object or elsewhere; and the same token's account in another namespace (a kustomize
/// `namespace:`) held to the same rules.
#[test]
#[allow(clippy::too_many_lines)] // one list of attacks, each a request and its answer
fn the_writers_token_changes_nothing_of_its_node_but_its_mark_in_any_namespace() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let c = Cluster::start(tmp);
    c.apply_file("daemonset.yaml");
    c.apply_file("node-writer.yaml");
    for n in ["gpu-a", "gpu-b"] {
        c.ok(
            "POST",
            "/api/v1/nodes",
            "application/json",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}}).to_string(),
        );
    }
    let token = c.pod_token("serve-a");
    policies_in_force(&c, &token);
    let merge = "application/merge-patch+json";
    let uid = c.node("gpu-a")["metadata"]["uid"].clone();
    for (body, what) in [
        (
            json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "gone",
            "uid": "00000000-0000-0000-0000-000000000000"}]}}),
            "a dangling owner",
        ),
        (
            json!({"metadata": {"finalizers": ["x.io/hold"]}}),
            "a finalizer",
        ),
        (
            json!({"spec": {"taints": [{"key": "gpusweep.io/gpu-held", "effect": "NoExecute"}]}}),
            "its own taint, evicting",
        ),
    ] {
        refused(
            &c,
            &token,
            "PATCH",
            "/api/v1/nodes/gpu-a?dryRun=All",
            merge,
            &body,
            what,
        );
    }
    for (body, what) in [
        (
            json!({"status": {"volumesInUse": ["kubernetes.io/csi/x^y"]}}),
            "volumes in use",
        ),
        (
            json!({"status": {"volumesAttached": [{"name": "kubernetes.io/csi/x^y", "devicePath": "/dev/x"}]}}),
            "volumes attached",
        ),
        (
            json!({"status": {"images": [{"names": ["evil:latest"], "sizeBytes": 1}]}}),
            "images",
        ),
        (json!({"status": {"phase": "Terminated"}}), "the phase"),
        (
            json!({"status": {"runtimeHandlers": [{"name": "evil"}]}}),
            "runtime handlers",
        ),
        (
            json!({"status": {"features": {"supplementalGroupsPolicy": true}}}),
            "features",
        ),
    ] {
        refused(
            &c,
            &token,
            "PATCH",
            "/api/v1/nodes/gpu-a/status?dryRun=All",
            merge,
            &body,
            what,
        );
    }
    // Device taints: one GPU of its own pool with NoSchedule passes; a NIC, the whole pool or NoExecute not.
    let dev = gpusweep::serve::kube::body::Device {
        driver: "gpu.nvidia.com".into(),
        pool: "gpu-a".into(),
        device: "gpu-0".into(),
    };
    let rule = gpusweep::serve::kube::body::taint_rule("gpu-a", &dev, "LeftoverHolds");
    let rules = "/apis/resource.k8s.io/v1/devicetaintrules?dryRun=All";
    let (code, v) = c.call(
        &token,
        "POST",
        rules,
        Some(("application/json", rule.to_string())),
    );
    assert_eq!(code, 201, "one GPU of its own: {v}");
    let mut nic = rule.clone();
    nic["spec"]["deviceSelector"]["driver"] = json!("nic.example.com");
    let mut pool = rule.clone();
    pool["spec"]["deviceSelector"]
        .as_object_mut()
        .expect("selector")
        .remove("device");
    let mut evict = rule.clone();
    evict["spec"]["taint"]["effect"] = json!("NoExecute");
    for (r, what) in [
        (nic, "another driver's device"),
        (pool, "every device of the pool"),
        (evict, "NoExecute"),
    ] {
        refused(&c, &token, "POST", rules, "application/json", &r, what);
    }
    // Events: about its own Node in default; never about another object, nor elsewhere.
    let event = |ns: &str, node: &str| {
        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"generateName": "x-", "namespace": ns}, "eventTime": "2026-12-07T00:00:00.000000Z",
        "reportingController": "gpusweep.io/serve", "reportingInstance": "gpusweep-gpu-a", "action": "Judge",
        "reason": "GPUHeld", "type": "Warning", "regarding": {"apiVersion": "v1", "kind": "Node", "name": node,
        "uid": uid}, "note": "x"})
    };
    let events = |ns: &str| format!("/apis/events.k8s.io/v1/namespaces/{ns}/events?dryRun=All");
    let (code, v) = c.call(
        &token,
        "POST",
        &events("default"),
        Some(("application/json", event("default", "gpu-a").to_string())),
    );
    assert_eq!(code, 201, "its own Node's: {v}");
    refused(
        &c,
        &token,
        "POST",
        &events("default"),
        "application/json",
        &event("default", "gpu-b"),
        "about another node",
    );
    refused(
        &c,
        &token,
        "POST",
        &events("kube-system"),
        "application/json",
        &event("kube-system", "gpu-a"),
        "in kube-system",
    );
    // The manifests applied under another namespace: its account is bound as the overlay binds it, and the
    // policies still hold it to its own node and mark.
    c.ok(
        "POST",
        "/api/v1/namespaces",
        "application/json",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tools"}}).to_string(),
    );
    c.ok(
        "POST",
        "/api/v1/namespaces/tools/serviceaccounts",
        "application/json",
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "gpusweep"}})
            .to_string(),
    );
    c.ok("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", "application/json",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "gpusweep-node-writer-tools"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole", "name": "gpusweep-node-writer"},
            "subjects": [{"kind": "ServiceAccount", "name": "gpusweep", "namespace": "tools"}]}).to_string());
    let other = c.pod_token_in("tools", "serve-tools");
    for (node, body, what) in [
        (
            "gpu-b",
            json!({"spec": {"taints": [{"key": "gpusweep.io/gpu-held", "effect": "NoSchedule"}]}}),
            "another node, from another namespace",
        ),
        (
            "gpu-a",
            json!({"spec": {"unschedulable": true}}),
            "a cordon, from another namespace",
        ),
        (
            "gpu-a",
            json!({"metadata": {"labels": {"x": "y"}}}),
            "a label, from another namespace",
        ),
    ] {
        await_cond("the binding in force", 30, || {
            c.call(&other, "GET", "/api/v1/nodes/gpu-a", None).0 == 200
        });
        refused(
            &c,
            &other,
            "PATCH",
            &format!("/api/v1/nodes/{node}?dryRun=All"),
            merge,
            &body,
            what,
        );
    }
    // Its own mark beside the taints already there (the API server's not-ready one).
    let (code, v) = c.call(
        &other,
        "PATCH",
        "/api/v1/nodes/gpu-a?dryRun=All",
        Some((
            "application/json-patch+json",
            json!([{"op": "add", "path": "/spec/taints/-",
            "value": {"key": "gpusweep.io/gpu-held", "effect": "NoSchedule"}}])
            .to_string(),
        )),
    );
    assert_eq!(code, 200, "its own mark, from another namespace: {v}");
}
