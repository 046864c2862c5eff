//! `gpusweep serve` end to end: the real binary on loopback, read over HTTP (reqwest), through its Unix
//! socket, and by gpusweep itself as an `http://` or `unix:` host. The demo hosts and a file-driven stand-in
//! NVML (tests/fixtures/standin_nvml.c) play the GPUs.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{BIN, await_cond, gpusweep, gpusweep_via, set_nvml, standin_nvml, text};

/// A running `gpusweep serve`, stopped (SIGTERM) when dropped.
struct Serve {
    child: Child,
    /// `127.0.0.1:PORT`, when it serves HTTP.
    addr: Option<String>,
    /// What it printed when it started.
    banner: String,
}

impl Serve {
    /// Start `gpusweep serve ARGS` (`--listen 127.0.0.1:0` unless ARGS say) and wait for its banner.
    fn start(dir: &Path, args: &[&str], env: &[(&str, &Path)]) -> Serve {
        Serve::start_as(gpusweep(dir), args, env)
    }

    /// The same, with `c` as the command that runs gpusweep (a wrapper that execs it, its environment set).
    fn start_as(mut c: Command, args: &[&str], env: &[(&str, &Path)]) -> Serve {
        c.arg("serve");
        if !args.iter().any(|a| *a == "--listen" || *a == "--no-http") {
            c.args(["--listen", "127.0.0.1:0"]);
        }
        c.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
        for (k, doc) in env {
            c.env(k, doc);
        }
        let mut child = c.spawn().expect("serve");
        let mut err = BufReader::new(child.stderr.take().expect("stderr"));
        let mut banner = String::new();
        err.read_line(&mut banner).expect("banner");
        assert!(
            banner.starts_with("gpusweep serve:"),
            "serve said: {banner}"
        );
        // Keep draining its stderr so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in err.lines() {});
        let addr = banner
            .split("://")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .map(str::to_string);
        let serve = Serve {
            child,
            addr,
            banner,
        };
        // Listening comes first, the first reading a moment later: wait for it (/healthz says so).
        if let Some(addr) = serve
            .addr
            .as_deref()
            .filter(|_| serve.banner.contains("http://"))
        {
            let t = Instant::now();
            while !std::net::TcpStream::connect(addr).is_ok_and(|mut s| {
                use std::io::{Read, Write};
                let _ = write!(s, "GET /healthz HTTP/1.0\r\n\r\n");
                let mut r = String::new();
                let _ = s.read_to_string(&mut r);
                // A first reading taken: healthy, or unhealthy for a reason other than having none yet.
                let answered = r.starts_with("HTTP/1.0 ") || r.starts_with("HTTP/1.1 ");
                answered && !r.contains("no reading yet")
            }) {
                assert!(
                    t.elapsed() < Duration::from_secs(20),
                    "serve never got a reading"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        serve
    }
    /// The whole HTTP/1.0 answer to `GET path`, status line and headers included.
    fn raw_get(&self, path: &str) -> String {
        use std::io::{Read, Write};
        let mut s =
            std::net::TcpStream::connect(self.addr.as_deref().expect("http")).expect("connect");
        write!(s, "GET {path} HTTP/1.0\r\n\r\n").expect("ask");
        let mut r = String::new();
        s.read_to_string(&mut r).expect("an answer");
        r
    }
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr.as_deref().expect("http"))
    }
    fn stop(&mut self) -> Option<i32> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        self.child.wait().ok().and_then(|s| s.code())
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

async fn get(url: &str) -> (u16, String, String) {
    let r = client().get(url).send().await.expect("GET");
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .map(|doc| doc.to_str().unwrap_or("").to_string())
        .unwrap_or_default();
    (status, ct, r.text().await.expect("body"))
}

/// The value of the one sample of `metric` whose labels include every `want` pair.
fn sample(metrics: &str, metric: &str, want: &[(&str, &str)]) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .find(|l| {
            want.iter()
                .all(|(k, doc)| l.contains(&format!("{k}=\"{doc}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|doc| doc.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // one scenario, start to end
async fn metrics_carry_dcgm_names_and_labels_beside_gpusweeps_verdicts() {
    let dir = tempfile::tempdir().expect("tmp");
    let serve = Serve::start(dir.path(), &["--demo", "--hosts", "gpu-b"], &[]);
    assert!(serve.banner.contains("DEMO"), "{}", serve.banner);
    // What Prometheus asks for, it gets: OpenMetrics.
    let r = client()
        .get(serve.url("/metrics"))
        .header(
            "Accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )
        .send()
        .await
        .expect("scrape");
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    let open = r.text().await.expect("body");
    assert!(open.trim_end().ends_with("# EOF"), "{open}");
    assert!(
        open.contains("# TYPE gpusweep_job_lost_ranks counter"),
        "{open}"
    );
    // Any other reader gets the Prometheus text format, a counter typed on its `_total` name (Python's
    // parser read it as untyped from OpenMetrics).
    let (status, ct, m) = get(&serve.url("/metrics")).await;
    assert_eq!(status, 200);
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    assert!(!m.contains("# EOF"), "{m}");
    assert!(
        m.contains("# TYPE gpusweep_job_lost_ranks_total counter"),
        "{m}"
    );
    // dcgm-exporter's names and labels, MiB.
    let line = m
        .lines()
        .find(|l| l.starts_with("DCGM_FI_DEV_FB_USED{gpu=\"6\""))
        .expect("FB_USED of GPU 6");
    for label in [
        "UUID=\"GPU-",
        "pci_bus_id=\"0000",
        "device=\"nvidia6\"",
        "modelName=\"NVIDIA H200\"",
        "Hostname=\"gpu-b\"",
    ] {
        assert!(line.contains(label), "{label} in {line}");
    }
    let gpu6 = [("gpu", "6"), ("Hostname", "gpu-b")];
    assert_eq!(sample(&m, "DCGM_FI_DEV_FB_USED", &gpu6), Some(73126.0));
    assert_eq!(sample(&m, "DCGM_FI_DEV_FB_RESERVED", &gpu6), Some(615.0));
    let free = sample(&m, "DCGM_FI_DEV_FB_FREE", &gpu6).expect("free");
    assert!((free - (143_771.0 - 73126.0 - 615.0)).abs() < 2.0, "{free}");
    // gpusweep's verdicts: GPU 6 held by an orphaned job's worker, GPU 7 a ghost's memory.
    assert_eq!(sample(&m, "gpusweep_gpu_clean", &[("gpu", "0")]), Some(1.0));
    assert_eq!(sample(&m, "gpusweep_gpu_clean", &[("gpu", "6")]), Some(0.0));
    assert_eq!(sample(&m, "gpusweep_gpu_clean", &[("gpu", "7")]), Some(0.0));
    let ghost = sample(
        &m,
        "gpusweep_unexplained_bytes",
        &[("gpu", "7"), ("kind", "ghost")],
    )
    .expect("ghost bytes");
    assert!(ghost > 10e9, "{ghost}");
    assert!(
        sample(&m, "gpusweep_unexplained_bytes", &[("gpu", "6")]).is_none(),
        "GPU 6's memory is explained"
    );
    assert_eq!(
        sample(
            &m,
            "gpusweep_findings",
            &[("kind", "ghost"), ("severity", "leak")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &m,
            "gpusweep_findings",
            &[("kind", "unkillable"), ("severity", "leak")]
        ),
        Some(0.0),
        "a kind with no finding reads 0, not absent"
    );
    assert!(
        sample(
            &m,
            "gpusweep_process_gpu_memory_bytes",
            &[("pid", "7306"), ("gpu", "6"), ("job", "slurm:4711.0")]
        )
        .is_some_and(|b| b > 70e9),
        "{m}"
    );
    assert!(
        sample(&m, "gpusweep_shm_leftover_bytes", &[("Hostname", "gpu-b")])
            .is_some_and(|b| b > 0.0)
    );
    assert!(
        m.contains("# TYPE gpusweep_time_to_clean_seconds histogram"),
        "{m}"
    );
    assert_eq!(
        sample(
            &m,
            "gpusweep_serve_info",
            &[("Hostname", "gpu-b"), ("scheme", "http"), ("api_path", "")]
        ),
        Some(1.0)
    );
    let taken = sample(&m, "gpusweep_reading_timestamp_seconds", &[]).expect("timestamp");
    assert!(taken > 1.7e9, "{taken}");
    let (status, _, body) = get(&serve.url("/healthz")).await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // one scenario, start to end
async fn the_api_and_the_event_stream_serve_the_json_contract_read_only() {
    let dir = tempfile::tempdir().expect("tmp");
    let serve = Serve::start(dir.path(), &["--demo", "--hosts", "gpu-b"], &[]);
    let (status, ct, body) = get(&serve.url("/api/v1/snapshot")).await;
    assert_eq!(status, 200);
    assert_eq!(ct, "application/json");
    let doc: serde_json::Value = serde_json::from_str(&body).expect("json");
    let host0 = &doc["hosts"][0];
    assert_eq!(host0["host"], "gpu-b");
    assert_eq!(host0["source"], "demo");
    assert!(
        host0["findings"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["kind"] == "ghost"))
    );
    assert!(
        host0["gpus"][0]["counters"]["sm_clock_mhz"].is_u64(),
        "the serve reads dcgm's counters: {host0}"
    );
    // The stream: hello, the whole snapshot once, then readings that only say they are fresh.
    let mut r = client()
        .get(serve.url("/api/v1/events?interval=100ms"))
        .send()
        .await
        .expect("events");
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let mut got = String::new();
    let said = Instant::now();
    while got.matches("event: unchanged").count() < 2 {
        assert!(said.elapsed() < Duration::from_secs(20), "{got}");
        let chunk = r.chunk().await.expect("chunk").expect("open");
        got.push_str(&String::from_utf8_lossy(&chunk));
    }
    let kinds: Vec<&str> = got
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(kinds[0], "hello", "{got}");
    assert_eq!(
        kinds.iter().filter(|k| **k == "snapshot").count(),
        1,
        "{got}"
    );
    assert!(got.contains(r#""hosts":["gpu-b"]"#), "{got}");
    // The whole reading on the stream leaves the counters out: its later readings would not move them.
    let whole: serde_json::Value = got
        .split("event: snapshot\n")
        .nth(1)
        .and_then(|e| e.lines().next()?.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).expect("snapshot json"))
        .expect("a snapshot");
    assert_eq!(whole["host"], "gpu-b");
    assert!(
        whole["gpus"]
            .as_array()
            .is_some_and(|g| !g.is_empty() && g.iter().all(|g| g.get("counters").is_none())),
        "{whole}"
    );
    // gpu-b's GPUs idle: their gauges came with the snapshot, and an `unchanged` does not repeat them.
    let unchanged: Vec<serde_json::Value> = got
        .split("event: unchanged\n")
        .skip(1)
        .filter_map(|e| e.lines().next()?.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).expect("unchanged json"))
        .collect();
    assert!(unchanged.len() >= 2, "{got}");
    for u in &unchanged {
        assert!(u["taken_at_ms"].as_u64().is_some(), "{u}");
        assert!(u.get("gauges").is_none(), "gauges repeated: {u}");
    }
    // Read-only: no other method, nothing else.
    let c = client();
    for url in ["/metrics", "/api/v1/snapshot", "/api/v1/events"] {
        let s = c.post(serve.url(url)).send().await.expect("POST").status();
        assert_eq!(s.as_u16(), 405, "POST {url}");
        let s = c
            .delete(serve.url(url))
            .send()
            .await
            .expect("DELETE")
            .status();
        assert_eq!(s.as_u16(), 405, "DELETE {url}");
    }
    assert_eq!(get(&serve.url("/api/v1/signal")).await.0, 404);
    assert_eq!(get(&serve.url("/hosts/nope/metrics")).await.0, 404);
    // gpusweep reads it as an http:// host: the same findings, judged again with its own options.
    let url = serve.url("");
    let out = gpusweep(dir.path())
        .args(["snapshot", "--json", "--hosts", &url])
        .output()
        .expect("snapshot");
    let doc: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    let host0 = &doc["hosts"][0];
    assert_eq!(host0["error"], serde_json::Value::Null, "{doc}");
    assert_eq!(host0["source"], "http", "{doc}");
    assert!(
        host0["missing_features"]
            .as_array()
            .is_some_and(|m| m.iter().any(|f| f == "actions")),
        "read-only over HTTP, and it says so: {doc}"
    );
    assert!(
        host0["findings"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["kind"] == "ghost"))
    );
    // A kill or a sweep through it is refused, saying how to act instead; nothing is sent.
    let out = gpusweep(dir.path())
        .args(["kill", "--hosts", &url, "7391", "--yes"])
        .output()
        .expect("kill");
    let said = crate::support::exited(&out, 2);
    assert!(said.contains("read-only") && said.contains("SSH"), "{said}");
    let out = gpusweep(dir.path())
        .args(["sweep", "--hosts", &url, "--yes", "--grace", "1s"])
        .output()
        .expect("sweep");
    let said = crate::support::exited(&out, 2);
    assert!(said.contains("read-only") && said.contains("SSH"), "{said}");
    let (_, _, m) = get(&serve.url("/metrics")).await;
    assert_eq!(
        sample(&m, "gpusweep_gpu_clean", &[("gpu", "7")]),
        Some(0.0),
        "nothing was killed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_hosts_are_named_one_by_one() {
    let dir = tempfile::tempdir().expect("tmp");
    let serve = Serve::start(dir.path(), &["--demo"], &[]);
    let (_, _, m) = get(&serve.url("/metrics")).await;
    for host0 in ["gpu-a", "gpu-b", "gpu-c"] {
        assert!(
            sample(
                &m,
                "gpusweep_serve_info",
                &[
                    ("Hostname", host0),
                    ("api_path", &format!("/hosts/{host0}"))
                ]
            )
            .is_some(),
            "{host0}: {m}"
        );
    }
    let (_, _, one) = get(&serve.url("/hosts/gpu-c/metrics")).await;
    assert!(one.contains("Hostname=\"gpu-c\"") && !one.contains("Hostname=\"gpu-a\""));
    let (_, _, body) = get(&serve.url("/api/v1/snapshot")).await;
    let doc: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(doc["hosts"].as_array().map(Vec::len), Some(4));
    let out = gpusweep(dir.path())
        .args([
            "snapshot",
            "--hosts",
            &serve.url(""),
            "--connect-timeout",
            "3",
        ])
        .output()
        .expect("snapshot");
    let said = crate::support::exited(&out, 2);
    assert!(
        said.contains("serves 4 hosts") && said.contains("/hosts/gpu-a"),
        "{said}"
    );
    let out = gpusweep(dir.path())
        .args(["snapshot", "--json", "--hosts", &serve.url("/hosts/gpu-c")])
        .output()
        .expect("snapshot");
    let doc: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(
        doc["hosts"][0]["gpus"][0]["compute_capability"], "12.0",
        "{doc}"
    );
}

/// The event stream at `url`, read until `enough` says so (within 20 s).
async fn stream_until(url: &str, enough: impl Fn(&str) -> bool) -> String {
    let mut r = client().get(url).send().await.expect("events");
    let mut got = String::new();
    let said = Instant::now();
    while !enough(&got) {
        assert!(said.elapsed() < Duration::from_secs(20), "{got}");
        let chunk = r.chunk().await.expect("chunk").expect("open");
        got.push_str(&String::from_utf8_lossy(&chunk));
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_reading_carries_the_gauges_only_when_they_moved() {
    let dir = tempfile::tempdir().expect("tmp");
    // A quiet demo host whose busy GPU's utilization runs in a wave: its readings say nothing new but that.
    let serve = Serve::start(dir.path(), &["--demo", "--hosts", "gpu-b0001"], &[]);
    let got = stream_until(&serve.url("/api/v1/events?interval=100ms"), |got| {
        got.matches("event: unchanged").count() >= 6
    })
    .await;
    let mut last: Option<serde_json::Value> = None;
    let mut moved = 0;
    for (kind, data) in events(&got) {
        let v: serde_json::Value = serde_json::from_str(&data).expect("json");
        match kind.as_str() {
            "snapshot" => {
                let g: Vec<serde_json::Value> = v["gpus"]
                    .as_array()
                    .expect("gpus")
                    .iter()
                    .map(|g| {
                        serde_json::json!({"utilization": g["utilization"], "temperature_c": g["temperature_c"], "power_mw": g["power_mw"]})
                    })
                    .collect();
                last = Some(serde_json::Value::Array(g));
            }
            "unchanged" => {
                if let Some(g) = v.get("gauges") {
                    assert_ne!(Some(g), last.as_ref(), "gauges repeated unchanged: {got}");
                    last = Some(g.clone());
                    moved += 1;
                }
            }
            _ => {}
        }
    }
    assert!(moved > 0, "the wave's gauges never came: {got}");
    // Asked for `gauges=moved`, an unchanged carries only the GPUs whose gauges moved, by position: gpu-b's
    // busy GPU 6, never its seven idle ones.
    let got = stream_until(
        &serve.url("/api/v1/events?interval=100ms&gauges=moved"),
        |got| got.matches("\"moved\"").count() >= 3,
    )
    .await;
    for ev in got.split("\n\n").filter(|e| e.contains("event: unchanged")) {
        let data = ev
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .expect("data");
        let v: serde_json::Value = serde_json::from_str(data).expect("json");
        assert!(v.get("gauges").is_none(), "{data}");
        if let Some(m) = v.get("moved") {
            let at: Vec<u64> = m
                .as_array()
                .expect("moved")
                .iter()
                .map(|e| e[0].as_u64().expect("a position"))
                .collect();
            assert_eq!(at, [6], "{data}");
            assert!(m[0][1]["utilization"].is_u64(), "{data}");
        }
    }
    let bad = client()
        .get(serve.url("/api/v1/events?gauges=some"))
        .send()
        .await
        .expect("answer");
    assert_eq!(bad.status(), 400);
}

fn write_private(path: &Path, content: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, content).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // one scenario, start to end
async fn a_token_guards_every_route_but_healthz_and_tls_is_served_with_the_given_certificate() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    // A token others may read is no secret: refused.
    write_private(&tmp.join("loose"), "0123456789abcdef0123\n", 0o644);
    let out = gpusweep(tmp)
        .args([
            "serve",
            "--demo",
            "--no-socket",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
        ])
        .arg(tmp.join("loose"))
        .output()
        .expect("serve");
    crate::support::exited(&out, 2);
    assert!(text(&out).contains("chmod 600"), "{}", text(&out));
    // A CA of the test's own, and a certificate for 127.0.0.1 it signed.
    crate::support::loopback_certificate(tmp);
    let token = "s3cret-token-0123456789";
    write_private(&tmp.join("token"), &format!("{token}\n"), 0o600);
    let cert = tmp.join("cert.pem");
    let key = tmp.join("key.pem");
    let token_file = tmp.join("token");
    let serve = Serve::start(
        tmp,
        &[
            "--demo",
            "--hosts",
            "gpu-b",
            "--token-file",
            token_file.to_str().expect("utf-8"),
            "--tls-cert",
            cert.to_str().expect("utf-8"),
            "--tls-key",
            key.to_str().expect("utf-8"),
        ],
        &[],
    );
    assert!(
        serve.banner.contains("https://") && serve.banner.contains("bearer token"),
        "{}",
        serve.banner
    );
    let base = format!("https://{}", serve.addr.as_deref().expect("addr"));
    let ca = tmp.join("ca.pem");
    let pem = std::fs::read(&ca).expect("ca");
    let tls = reqwest::Client::builder()
        .no_proxy()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("pem"))
        .build()
        .expect("client");
    let s = tls
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("GET")
        .status();
    assert_eq!(s.as_u16(), 401);
    let s = tls
        .get(format!("{base}/metrics"))
        .bearer_auth("wrong-token-0123456789")
        .send()
        .await
        .expect("GET")
        .status();
    assert_eq!(s.as_u16(), 401);
    let r = tls
        .get(format!("{base}/metrics"))
        .bearer_auth(token)
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        r.text()
            .await
            .expect("body")
            .contains("DCGM_FI_DEV_FB_USED")
    );
    // The scheme is case-insensitive: `bearer` and `BEARER` are Bearer.
    for scheme in ["bearer", "BEARER"] {
        let s = tls
            .get(format!("{base}/metrics"))
            .header("Authorization", format!("{scheme} {token}"))
            .send()
            .await
            .expect("GET")
            .status();
        assert_eq!(s.as_u16(), 200, "{scheme}");
    }
    let s = tls
        .get(format!("{base}/healthz"))
        .send()
        .await
        .expect("GET")
        .status();
    assert_eq!(s.as_u16(), 200, "/healthz needs no token");
    // Nor does a host's: asked for one it does not have, it names none it has.
    let r = tls
        .get(format!("{base}/hosts/nope/healthz"))
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status().as_u16(), 404);
    let body = r.text().await.expect("body");
    assert!(
        !body.contains("gpu-b"),
        "the host list without a token: {body}"
    );
    // gpusweep as a client: the token and the CA from its settings.
    let out = gpusweep(tmp)
        .args(["snapshot", "--json", "--hosts", &base])
        .env("GPUSWEEP_HTTP_TOKEN_FILE", &token_file)
        .env("GPUSWEEP_HTTP_CA_FILE", &ca)
        .output()
        .expect("snapshot");
    let doc: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(doc["hosts"][0]["error"], serde_json::Value::Null, "{doc}");
    assert!(
        doc["hosts"][0]["gpus"]
            .as_array()
            .is_some_and(|g| g.len() == 8)
    );
    // Without the token: the error says where a token goes. Without the CA: the certificate is unknown.
    let out = gpusweep(tmp)
        .args(["snapshot", "--hosts", &base, "--connect-timeout", "3"])
        .env("GPUSWEEP_HTTP_CA_FILE", &ca)
        .output()
        .expect("snapshot");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("HTTP 401") && text(&out).contains("http_token_file"),
        "{}",
        text(&out)
    );
    let out = gpusweep(tmp)
        .args(["snapshot", "--hosts", &base, "--connect-timeout", "3"])
        .env("GPUSWEEP_HTTP_TOKEN_FILE", &token_file)
        .output()
        .expect("snapshot");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).to_lowercase().contains("certificate"),
        "{}",
        text(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // one scenario, start to end
async fn snapshot_and_wait_read_a_running_serve_through_its_socket() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let lib = standin_nvml(tmp);
    std::fs::write(tmp.join("nvidia0"), b"").expect("stand-in device");
    // A holder of GPU 0, listed with 512 MiB.
    let mut holder = Command::new("sleep")
        .arg("300")
        .stdin(std::fs::File::open(tmp.join("nvidia0")).expect("open"))
        .spawn()
        .expect("holder");
    set_nvml(tmp, &format!("512 {}:512\n", holder.id()));
    let glob = format!("{}/nvidia*", tmp.display());
    let sock = tmp.join("serve.sock");
    let env = [
        ("GPUSWEEP_NVML_LIBRARY", lib.as_path()),
        ("STANDIN_NVML_STATE", &tmp.join("nvml")),
        ("GPUSWEEP_SOCKET", &sock),
    ];
    let mut serve = Serve::start(tmp, &["--device-glob", &glob, "--interval", "1s"], &env);
    assert!(serve.banner.contains("socket"), "{}", serve.banner);
    let client = |args: &[&str]| {
        let mut c = gpusweep(tmp);
        c.args(args).env("GPUSWEEP_SOCKET", &sock);
        c
    };
    // Through the socket: the serve's reading, marked so; with --no-serve, this process's own (no driver).
    let out = client(&["snapshot", "--json"]).output().expect("snapshot");
    let doc: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    let host0 = &doc["hosts"][0];
    assert_eq!(host0["source"], "serve", "{doc}");
    assert_eq!(
        host0["gpus"][0]["memory"]["used"],
        512 * 1024 * 1024,
        "{doc}"
    );
    assert!(
        host0["holders"]
            .as_array()
            .is_some_and(|x| x.iter().any(|x| x["pid"] == holder.id())),
        "{doc}"
    );
    let out = client(&["snapshot", "--json", "--no-serve"])
        .output()
        .expect("snapshot");
    let doc: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(doc["hosts"][0]["source"], "local", "{doc}");
    // wait through the serve: held, then released when the holder dies and the "driver" lets go.
    let out = client(&["wait", "--timeout", "1s"]).output().expect("wait");
    crate::support::exited(&out, 1);
    let w = client(&["wait", "--timeout", "20s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("wait");
    holder.kill().expect("kill");
    holder.wait().expect("reap");
    set_nvml(tmp, "0\n");
    let out = w.wait_with_output().expect("wait");
    crate::support::exited(&out, 0);
    assert!(text(&out).contains("clean"), "{}", text(&out));
    // The release fed the time-to-clean histogram, counted from the holder's exit.
    let (_, _, m) = get(&serve.url("/metrics")).await;
    assert_eq!(
        sample(
            &m,
            "gpusweep_time_to_clean_seconds_count",
            &[("after", "exit")]
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(sample(&m, "gpusweep_gpu_clean", &[("gpu", "0")]), Some(1.0));
    // A second serve is refused the socket a live one answers on.
    let out = gpusweep(tmp)
        .args(["serve", "--no-http", "--socket"])
        .arg(&sock)
        .output()
        .expect("second serve");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("another gpusweep serve answers"),
        "{}",
        text(&out)
    );
    // A clean stop: exit 0, the socket file gone.
    assert_eq!(serve.stop(), Some(0));
    assert!(!sock.exists(), "the socket file was left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // one scenario, start to end
async fn a_sweep_through_the_socket_cleans_the_demo_and_the_metrics_say_so() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    // A directory every user may enter, for the unprivileged peer below.
    let shared = tmp.join("shared");
    std::fs::create_dir(&shared).expect("dir");
    std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    std::fs::set_permissions(tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let sock = shared.join("serve.sock");
    let sock_s = sock.to_str().expect("utf-8").to_string();
    let serve = Serve::start(
        tmp,
        &[
            "--demo",
            "--hosts",
            "gpu-b",
            "--socket",
            &sock_s,
            "--interval",
            "200ms",
        ],
        &[],
    );
    let unix = format!("unix:{sock_s}");
    // Someone else may read through the socket, but not act.
    if nix::unistd::geteuid().is_root() {
        // An audit log that user may write, in a directory of this test's own.
        let nobody = shared.join("nobody");
        std::fs::create_dir(&nobody).expect("dir");
        std::os::unix::fs::chown(&nobody, Some(65534), Some(65534)).expect("chown");
        let out = Command::new("setpriv")
            .args([
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                BIN,
                "kill",
                "--hosts",
                &unix,
                "7391",
                "--yes",
            ])
            .env("GPUSWEEP_CONFIG", "/nonexistent/config.toml")
            .env("GPUSWEEP_AUDIT_LOG", nobody.join("audit.jsonl"))
            .stdin(Stdio::null())
            .output()
            .expect("setpriv (util-linux)");
        let said = crate::support::exited(&out, 1);
        assert!(
            said.contains("not allowed") && said.contains("65534"),
            "{said}"
        );
    }
    let (_, _, m) = get(&serve.url("/metrics")).await;
    assert_eq!(sample(&m, "gpusweep_gpu_clean", &[("gpu", "7")]), Some(0.0));
    crate::support::sweep_through(tmp, &sock_s);
    let url = serve.url("/metrics");
    let said = Instant::now();
    let m = loop {
        let m = get(&url).await.2;
        let all = (0..8)
            .all(|g| sample(&m, "gpusweep_gpu_clean", &[("gpu", &g.to_string())]) == Some(1.0));
        if all {
            break m;
        }
        assert!(said.elapsed() < Duration::from_secs(20), "{m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The sweep fed the histogram: the GPUs that were dirty were clean some time after the first signal.
    let count = sample(
        &m,
        "gpusweep_time_to_clean_seconds_count",
        &[("after", "signal")],
    )
    .expect("count");
    assert!(count >= 2.0, "GPUs 6 and 7: {m}");
    assert_eq!(
        sample(
            &m,
            "gpusweep_findings",
            &[("kind", "ghost"), ("severity", "leak")]
        ),
        Some(0.0)
    );
}

/// Read an event stream into `got` until it holds `want` (20 s at most).
async fn read_until(events: &mut reqwest::Response, got: &mut String, want: &str) {
    let t = Instant::now();
    while !got.contains(want) {
        assert!(t.elapsed() < Duration::from_secs(20), "no {want} in: {got}");
        let chunk = tokio::time::timeout(Duration::from_secs(20), events.chunk())
            .await
            .expect("an event within 20 s")
            .expect("chunk")
            .expect("open");
        got.push_str(&String::from_utf8_lossy(&chunk));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holders_death_is_seen_at_once_and_its_gpu_read_until_released() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let lib = standin_nvml(tmp);
    std::fs::write(tmp.join("nvidia0"), b"").expect("stand-in device");
    let mut holder = Command::new("sleep")
        .arg("300")
        .stdin(std::fs::File::open(tmp.join("nvidia0")).expect("open"))
        .spawn()
        .expect("holder");
    set_nvml(tmp, &format!("2048 {}:2048\n", holder.id()));
    let glob = format!("{}/nvidia*", tmp.display());
    let env = [
        ("GPUSWEEP_NVML_LIBRARY", lib.as_path()),
        ("STANDIN_NVML_STATE", &tmp.join("nvml")),
    ];
    // Read once an hour: only the holder's pidfd can tell the serve it died.
    let serve = Serve::start(
        tmp,
        &["--no-socket", "--device-glob", &glob, "--interval", "1h"],
        &env,
    );
    // No overall timeout: a stream lasts.
    let streams = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let mut events = streams
        .get(serve.url("/api/v1/events"))
        .send()
        .await
        .expect("events");
    let mut got = String::new();
    read_until(&mut events, &mut got, "event: snapshot").await;
    holder.kill().expect("kill");
    holder.wait().expect("reap");
    // The death is read at once: NVML still charges the dead PID (the driver has not let go yet).
    read_until(&mut events, &mut got, r#""event":"finding_appeared""#).await;
    read_until(&mut events, &mut got, r#""kind":"ghost""#).await;
    // The driver lets go; the serve, reading the GPU every few ms since the death, says so.
    set_nvml(tmp, "0\n");
    read_until(&mut events, &mut got, r#""event":"gpu_clean""#).await;
    let (_, _, m) = get(&serve.url("/metrics")).await;
    assert_eq!(
        sample(
            &m,
            "gpusweep_time_to_clean_seconds_count",
            &[("after", "exit")]
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(sample(&m, "gpusweep_gpu_clean", &[("gpu", "0")]), Some(1.0));
}

/// A process's resident memory in KiB and its open descriptors, from /proc.
fn rss_and_fds(pid: u32) -> (u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .count();
    (rss, fds)
}

/// An unprivileged local user (nobody) against a root serve's socket: connections that each send a
/// 15 MB `signal` line and never read, and many that send nothing at all.
const SOCKET_FLOOD: &str = r#"
import socket, sys
path, big, idle = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
targets = ",".join('{"pid":%d,"start_time":1}' % (100000 + i) for i in range(500000))
line = ('{"cmd":"signal","id":1,"request":{"signal":"TERM","grace_ms":null,"targets":[' + targets + ']}}\n').encode()
held = []
for _ in range(big):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    held.append(s)
    try:
        s.sendall(line)
    except OSError:
        pass
for _ in range(idle):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        held.append(s)
    except OSError:
        pass
print("ready", flush=True)
sys.stdin.read()
"#;

#[test]
fn a_local_user_cannot_make_the_serve_hold_memory_or_connections() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test plays an unprivileged user with setpriv: run the suite as root (scripts/test.sh does)"
    );
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let shared = tmp.join("shared");
    std::fs::create_dir(&shared).expect("dir");
    for d in [tmp, shared.as_path()] {
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
    }
    let sock = shared.join("serve.sock");
    let sock_s = sock.to_str().expect("utf-8").to_string();
    let serve = Serve::start(
        tmp,
        &["--demo", "--hosts", "gpu-b", "--socket", &sock_s],
        &[],
    );
    let pid = serve.child.id();
    let (rss0, fds0) = rss_and_fds(pid);
    let mut peer = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(["/usr/bin/python3", "-c", SOCKET_FLOOD, &sock_s, "8", "40"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("setpriv (util-linux) and python3");
    let mut ready = String::new();
    BufReader::new(peer.stdout.take().expect("stdout"))
        .read_line(&mut ready)
        .expect("peer");
    assert_eq!(ready.trim(), "ready", "the peer could not run");
    // The serve lets go of what the peer sent and of the connections past its share; meanwhile its memory
    // never grows by more than a few MB.
    let t = Instant::now();
    let mut worst = 0;
    loop {
        let (rss, fds) = rss_and_fds(pid);
        worst = worst.max(rss.saturating_sub(rss0));
        assert!(
            worst < 64 * 1024,
            "the serve holds {} MB more for an unprivileged peer",
            worst / 1024
        );
        if fds <= fds0 + 32 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the serve still holds {} connections of one unprivileged peer ({} MB more)",
            fds - fds0,
            worst / 1024
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Root still reads through the socket while the peer holds its share.
    let out = gpusweep(tmp)
        .args(["snapshot", "--json", "--hosts", &format!("unix:{sock_s}")])
        .output()
        .expect("snapshot");
    let doc: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(doc["hosts"][0]["error"], serde_json::Value::Null, "{doc}");
    drop(peer.stdin.take());
    let _ = peer.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_to_clean_counts_from_the_signal_that_freed_the_gpu() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let sock = tmp.join("serve.sock");
    let sock_s = sock.to_str().expect("utf-8").to_string();
    let serve = Serve::start(
        tmp,
        &[
            "--demo",
            "--hosts",
            "gpu-b",
            "--socket",
            &sock_s,
            "--interval",
            "200ms",
        ],
        &[],
    );
    let unix = format!("unix:{sock_s}");
    // The zombie's parent holds no GPU: killing it frees nothing.
    let out = gpusweep(tmp)
        .args(["kill", "--hosts", &unix, "7340", "--yes"])
        .output()
        .expect("kill");
    crate::support::exited(&out, 0);
    // The scenario's gap between that kill and the sweep (not a synchronisation: the time it measures).
    tokio::time::sleep(Duration::from_secs(2)).await;
    crate::support::sweep_through(tmp, &sock_s);
    let url = serve.url("/metrics");
    let t = Instant::now();
    let m = loop {
        let m = get(&url).await.2;
        let count = sample(
            &m,
            "gpusweep_time_to_clean_seconds_count",
            &[("after", "signal")],
        );
        if count.is_some_and(|c| c >= 2.0) {
            break m;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let count = sample(
        &m,
        "gpusweep_time_to_clean_seconds_count",
        &[("after", "signal")],
    );
    let within_1s = sample(
        &m,
        "gpusweep_time_to_clean_seconds_bucket",
        &[("after", "signal"), ("le", "1.0")],
    );
    assert_eq!(
        within_1s, count,
        "every GPU clean within 1 s of the sweep, not counted from the unrelated kill: {m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // one scenario, start to end
async fn a_sweep_of_this_host_goes_through_its_serve_and_its_stream_tells_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let lib = standin_nvml(tmp);
    std::fs::write(tmp.join("nvidia0"), b"").expect("stand-in device");
    let mut holder = Command::new("sleep")
        .arg("300")
        .stdin(std::fs::File::open(tmp.join("nvidia0")).expect("open"))
        .spawn()
        .expect("holder");
    set_nvml(tmp, &format!("512 {}:512\n", holder.id()));
    let glob = format!("{}/nvidia*", tmp.display());
    let sock = tmp.join("serve.sock");
    let env = [
        ("GPUSWEEP_NVML_LIBRARY", lib.as_path()),
        ("STANDIN_NVML_STATE", &tmp.join("nvml")),
        ("GPUSWEEP_SOCKET", &sock),
    ];
    let serve = Serve::start(tmp, &["--device-glob", &glob, "--interval", "1s"], &env);
    let streams = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let mut events = streams
        .get(serve.url("/api/v1/events"))
        .send()
        .await
        .expect("events");
    let mut got = String::new();
    read_until(&mut events, &mut got, "event: snapshot").await;
    // `gpusweep sweep` of this host, as an operator types it: no --hosts (`--live`: the holder is a live
    // process no finding names).
    let mut sweep = gpusweep(tmp)
        .args([
            "sweep",
            "--yes",
            "--live",
            "--grace",
            "1s",
            "--timeout",
            "20s",
        ])
        .env("GPUSWEEP_SOCKET", &sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sweep");
    // The holder ends (the "driver" then lets go), unless the sweep gave up first.
    let t = Instant::now();
    while holder.try_wait().expect("holder").is_none() {
        if sweep.try_wait().expect("sweep").is_some() {
            let out = sweep.wait_with_output().expect("sweep");
            let _ = holder.kill();
            panic!("the sweep ended, the holder did not: {}", text(&out));
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the holder was never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    set_nvml(tmp, "0\n");
    let out = sweep.wait_with_output().expect("sweep");
    crate::support::exited(&out, 0);
    for want in [
        r#""event":"signal_sent""#,
        r#""event":"signal_fate""#,
        r#""event":"all_clean""#,
    ] {
        read_until(&mut events, &mut got, want).await;
    }
    let (_, _, m) = get(&serve.url("/metrics")).await;
    assert_eq!(
        sample(
            &m,
            "gpusweep_time_to_clean_seconds_count",
            &[("after", "signal")]
        ),
        Some(1.0),
        "{m}"
    );
}

#[test]
fn a_host_that_cannot_be_read_keeps_its_source_and_a_demo_read_over_http_says_simulated() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    // Nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let out = gpusweep(tmp)
        .args([
            "snapshot",
            "--json",
            "--connect-timeout",
            "2",
            "--hosts",
            &format!("http://127.0.0.1:{port}"),
        ])
        .output()
        .expect("snapshot");
    let doc: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert!(doc["hosts"][0]["error"].is_string(), "{doc}");
    assert_eq!(doc["hosts"][0]["source"], "http", "{doc}");
    let serve = Serve::start(tmp, &["--demo", "--hosts", "gpu-b"], &[]);
    let out = gpusweep(tmp)
        .args(["snapshot", "--json", "--hosts", &serve.url("")])
        .output()
        .expect("snapshot");
    let doc: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(doc["hosts"][0]["source"], "http", "{doc}");
    assert_eq!(doc["hosts"][0]["simulated"], true, "{doc}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serve_without_a_driver_is_unhealthy_and_says_why() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    // NVML cannot be loaded: no driver on this host, as far as the serve can tell.
    let missing = tmp.join("no-such-libnvidia-ml.so.1");
    let serve = Serve::start(
        tmp,
        &["--no-socket", "--interval", "200ms"],
        &[("GPUSWEEP_NVML_LIBRARY", missing.as_path())],
    );
    let (status, _, body) = get(&serve.url("/healthz")).await;
    assert_eq!(
        status, 503,
        "a serve that reads no GPU is not healthy: {body}"
    );
    assert!(body.contains("NVML") || body.contains("driver"), "{body}");
    let (_, _, m) = get(&serve.url("/metrics")).await;
    assert_eq!(
        sample(&m, "gpusweep_gpus_readable", &[]),
        Some(0.0),
        "a series an alert can fire on: {m}"
    );
    // Told not to read NVML, it is healthy on holders, zombies and /dev/shm alone.
    let nonvml = Serve::start(tmp, &["--no-socket", "--no-nvml"], &[]);
    let (status, _, body) = get(&nonvml.url("/healthz")).await;
    assert_eq!(status, 200, "{body}");
}

/// Print the first snapshot a serve's socket sends (argv[1]), as its JSON line.
const READ_ONE_SNAPSHOT: &str = r#"
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
for line in s.makefile("rb"):
    m = json.loads(line)
    if m.get("type") == "snapshot":
        print(line.decode().strip(), flush=True)
        break
"#;

/// A shell that mounts a `/proc` of its own with `hidepid=2` in a private mount namespace, then execs its
/// arguments: what a hardened node, a container or a `ProtectProc=invisible` unit shows its users.
const IN_HIDDEN_PROC: [&str; 7] = [
    "unshare",
    "--mount",
    "--propagation",
    "private",
    "--",
    "sh",
    "-c",
];
const HIDE_AND_EXEC: &str = "mount -t proc -o hidepid=2 proc /proc && exec \"$0\" \"$@\"";

fn in_hidden_proc() -> Command {
    let mut c = Command::new(IN_HIDDEN_PROC[0]);
    c.args(&IN_HIDDEN_PROC[1..]).arg(HIDE_AND_EXEC);
    c
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario: the same holder seen by four readers
fn a_reader_of_the_serve_sees_no_more_than_its_own_proc_shows_it() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test plays an unprivileged user with setpriv and mounts /proc: run the suite as root"
    );
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    std::fs::set_permissions(tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let dev = tmp.join("nvidia0");
    std::fs::write(&dev, b"").expect("device");
    let glob = tmp.join("nvidia*").to_str().expect("utf-8").to_string();
    // Root's GPU process, with a secret in its arguments (as too many launchers pass API keys).
    let mut holder = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(600)",
        ])
        .arg(&dev)
        .arg("--api-key=s3cret-4711")
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut ready = String::new();
    BufReader::new(holder.stdout.take().expect("stdout"))
        .read_line(&mut ready)
        .expect("holder");
    let hpid = holder.id();
    let sock = tmp.join("serve.sock");
    let sock_s = sock.to_str().expect("utf-8").to_string();
    let serve = Serve::start(
        tmp,
        &["--no-nvml", "--device-glob", &glob, "--socket", &sock_s],
        &[],
    );
    let read_as = |wrap: Option<Command>| -> serde_json::Value {
        let mut c = wrap.unwrap_or_else(|| Command::new("setpriv"));
        if c.get_program() != "setpriv" {
            c.arg("setpriv");
        }
        let o = c
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .args(["/usr/bin/python3", "-c", READ_ONE_SNAPSHOT, &sock_s])
            .output()
            .expect("setpriv, python3");
        serde_json::from_slice::<serde_json::Value>(&o.stdout)
            .unwrap_or_else(|_| panic!("{}", text(&o)))["snapshot"]
            .clone()
    };
    let holder_of = |snap: &serde_json::Value| -> serde_json::Value {
        snap["processes"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["pid"] == hpid))
            .cloned()
            .unwrap_or_else(|| panic!("the holder {hpid} is listed: {snap}"))
    };
    // A user whose /proc shows every process reads what ps would show them.
    let open = read_as(None);
    assert!(
        holder_of(&open)["cmdline"]
            .as_str()
            .is_some_and(|c| c.contains("s3cret-4711")),
        "{open}"
    );
    // A user whose /proc hides other users' processes does not get them from a root serve: the PID stays
    // (NVML would show it to anyone), the command line, name and user go.
    let hidden = read_as(Some(in_hidden_proc()));
    let h = holder_of(&hidden);
    assert!(!hidden.to_string().contains("s3cret"), "{hidden}");
    assert_eq!(h["comm"], "hidden", "{h}");
    assert!(h["user"].is_null() && h["uid"].is_null(), "{h}");
    // A user who makes namespaces of their own (user, PID, mount) and mounts a /proc there that hides
    // nothing sees only their own namespace's processes in it: no more through the serve.
    let o = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(["unshare", "-Urpf", "--mount-proc"])
        .args(["/usr/bin/python3", "-c", READ_ONE_SNAPSHOT, &sock_s])
        .output()
        .expect("setpriv, unshare, python3");
    let own_ns = serde_json::from_slice::<serde_json::Value>(&o.stdout)
        .unwrap_or_else(|_| panic!("{}", text(&o)))["snapshot"]
        .clone();
    assert!(!own_ns.to_string().contains("s3cret"), "{own_ns}");
    assert_eq!(holder_of(&own_ns)["comm"], "hidden", "{own_ns}");
    // Root still reads it whole through the same socket.
    let out = gpusweep(tmp)
        .args(["snapshot", "--json", "--hosts", &format!("unix:{sock_s}")])
        .output()
        .expect("snapshot");
    assert!(text(&out).contains("s3cret-4711"), "{}", text(&out));
    drop(serve);
    // A serve on a node whose /proc hides processes answers HTTP readers it cannot name (no token) the same.
    let wrapper: Vec<&str> = IN_HIDDEN_PROC
        .iter()
        .copied()
        .chain([HIDE_AND_EXEC])
        .collect();
    let serve = Serve::start_as(
        gpusweep_via(tmp, &wrapper),
        &["--no-nvml", "--device-glob", &glob, "--no-socket"],
        &[],
    );
    let body = serve.raw_get("/api/v1/snapshot");
    assert!(body.contains(&format!("\"pid\":{hpid}")), "{body}");
    assert!(!body.contains("s3cret"), "{body}");
    let _ = holder.kill();
    let _ = holder.wait();
}

#[test]
fn thousands_of_idle_connections_keep_neither_healthz_nor_the_socket_from_answering() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let sock = tmp.join("serve.sock");
    let sock_s = sock.to_str().expect("utf-8").to_string();
    // As systemd starts a service: 1,024 descriptors, and the hard limit no higher.
    let serve = Serve::start_as(
        gpusweep_via(tmp, &["prlimit", "--nofile=1024:1024", "--"]),
        &["--demo", "--hosts", "gpu-b", "--socket", &sock_s],
        &[],
    );
    let addr: std::net::SocketAddr = serve.addr.as_deref().expect("http").parse().expect("addr");
    // 3,000 connections that never send a byte (a connect the serve's backlog cannot take gives up soon).
    let mut idle = Vec::new();
    let mut refused = 0;
    while idle.len() < 3000 && refused < 20 {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(s) => idle.push(s),
            Err(_) => refused += 1,
        }
    }
    let health = || {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
            return String::new();
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = write!(s, "GET /healthz HTTP/1.0\r\n\r\n");
        let mut r = String::new();
        let _ = s.read_to_string(&mut r);
        r
    };
    crate::support::await_cond(
        "/healthz to answer beside 3,000 idle connections",
        20,
        || health().starts_with("HTTP/1."),
    );
    assert!(health().contains("ok"), "{}", health());
    let out = gpusweep(tmp)
        .args(["snapshot", "--json", "--hosts", &format!("unix:{sock_s}")])
        .output()
        .expect("snapshot");
    let doc: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(doc["hosts"][0]["error"], serde_json::Value::Null, "{doc}");
    // The serve holds a bounded share of descriptors, not one per connection.
    let fds =
        std::fs::read_dir(format!("/proc/{}/fd", serve.child.id())).map_or(0, Iterator::count);
    assert!(
        fds < 600,
        "the serve holds {fds} descriptors for {} idle connections",
        idle.len()
    );
    drop(idle);
}

#[test]
fn event_streams_take_half_the_places_and_healthz_still_answers() {
    use std::io::{BufRead, Write};
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    // 1,024 descriptors: 256 HTTP places, 128 of them for event streams.
    let serve = Serve::start_as(
        gpusweep_via(tmp, &["prlimit", "--nofile=1024:1024", "--"]),
        &["--demo", "--hosts", "gpu-b", "--no-socket"],
        &[],
    );
    let addr: std::net::SocketAddr = serve.addr.as_deref().expect("http").parse().expect("addr");
    // 300 clients open an event stream each and keep it open, reading as a browser would.
    let mut streams = Vec::new();
    let (mut open, mut turned_away) = (0, 0);
    for _ in 0..300 {
        let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
            continue;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        write!(s, "GET /api/v1/events HTTP/1.1\r\nHost: t\r\n\r\n").expect("ask");
        let mut status = String::new();
        let mut r = std::io::BufReader::new(s);
        let _ = r.read_line(&mut status);
        if status.contains(" 200 ") {
            open += 1;
        } else if status.contains(" 503 ") {
            turned_away += 1;
        }
        streams.push(r);
    }
    assert_eq!(
        open, 128,
        "half of the 256 places ({turned_away} turned away)"
    );
    assert!(turned_away >= 150, "{turned_away} told to come back later");
    // With every stream place taken, /healthz and a scrape still answer.
    let ask = |path: &str| {
        use std::io::Read;
        let mut s =
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect");
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        write!(s, "GET {path} HTTP/1.0\r\n\r\n").expect("ask");
        let mut r = String::new();
        let _ = s.read_to_string(&mut r);
        r
    };
    let health = ask("/healthz");
    assert!(health.starts_with("HTTP/1.0 200"), "{health}");
    assert!(ask("/metrics").contains("DCGM_FI_DEV_FB_USED"));
    // A place given back is a place for the next stream.
    drop(streams.remove(0));
    let first_line = |path: &str| {
        let mut s =
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect");
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        write!(s, "GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").expect("ask");
        let mut line = String::new();
        let _ = std::io::BufReader::new(s).read_line(&mut line);
        line
    };
    crate::support::await_cond("a stream place given back", 10, || {
        first_line("/api/v1/events").contains(" 200 ")
    });
    drop(streams);
}

/// Ask for a reading as fast as possible for argv[2] seconds over the socket argv[1]; print how many came.
const POLL_FLOOD: &str = r#"
import json, socket, sys, threading, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
secs = float(sys.argv[2])
end = time.monotonic() + secs
def flood():
    while time.monotonic() < end:
        try:
            s.sendall(b'{"cmd":"poll"}\n')
        except OSError:
            return
        time.sleep(0.002)
threading.Thread(target=flood, daemon=True).start()
f = s.makefile("rb")
n = -1  # the first reading comes unasked
s.settimeout(1)
while time.monotonic() < end:
    try:
        line = f.readline()
    except OSError:
        continue
    if not line:
        break
    if json.loads(line).get("type") in ("snapshot", "unchanged"):
        n += 1
print(n, flush=True)
"#;

#[test]
fn an_unprivileged_poll_flood_gets_no_more_than_ten_readings_a_second() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test plays an unprivileged user with setpriv: run the suite as root"
    );
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    std::fs::set_permissions(tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let sock = tmp.join("serve.sock");
    let sock_s = sock.to_str().expect("utf-8").to_string();
    // Read every 10 s unless asked: what the flood gets is what its polls get.
    let _serve = Serve::start(
        tmp,
        &[
            "--demo",
            "--hosts",
            "gpu-b",
            "--socket",
            &sock_s,
            "--interval",
            "10s",
        ],
        &[],
    );
    let o = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(["/usr/bin/python3", "-c", POLL_FLOOD, &sock_s, "3"])
        .output()
        .expect("setpriv, python3");
    let n: u32 = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{}", text(&o)));
    // 3 s at one reading per 100 ms is 30; a few more for the edges.
    assert!(n <= 33, "{n} readings in 3 s for an unprivileged flood");
    assert!(n >= 1, "polls are still answered: {n}");
}

/// argv[2] connections to the socket argv[1], each writing 200 polls at a time for argv[3] seconds (reading
/// what comes back); prints "flooding" once they all write.
const POLL_SPAM: &str = r#"
import socket, sys, threading, time
path, n, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
lines = b'{"cmd":"poll"}\n' * 200
started = threading.Barrier(n + 1)
def run():
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    def drain():
        try:
            while s.recv(1 << 20):
                pass
        except OSError:
            pass
    threading.Thread(target=drain, daemon=True).start()
    s.sendall(lines)
    started.wait()
    end = time.time() + secs
    try:
        while time.time() < end:
            s.sendall(lines)
    except OSError:
        pass
ts = [threading.Thread(target=run) for _ in range(n)]
[t.start() for t in ts]
started.wait()
print("flooding", flush=True)
[t.join() for t in ts]
"#;

/// argv[3] signal requests for PID argv[2] (as the process it is not: a start time it never had, so nothing
/// is sent) over the socket argv[1], one connection each; prints how many were answered "busy".
const ACT_MANY: &str = r#"
import json, socket, sys
path, pid, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
busy = 0
for i in range(k):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    f = s.makefile("rb")
    f.readline()
    req = {"cmd": "signal", "id": i, "request": {"targets": [{"pid": pid, "start_time": 1}], "signal": "TERM"}}
    s.sendall((json.dumps(req) + "\n").encode())
    for line in f:
        m = json.loads(line)
        if m.get("type") == "outcomes":
            busy += "busy" in line.decode()
            break
    s.close()
print(busy, flush=True)
"#;

#[test]
fn a_poll_flood_keeps_no_action_of_root_from_the_serve() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test plays an unprivileged user with setpriv: run the suite as root"
    );
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    std::fs::set_permissions(tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let sock = tmp.join("serve.sock");
    let sock_s = sock.to_str().expect("utf-8").to_string();
    let _serve = Serve::start(
        tmp,
        &["--demo", "--hosts", "gpu-b", "--socket", &sock_s],
        &[],
    );
    let mut flood = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(["/usr/bin/python3", "-c", POLL_SPAM, &sock_s, "8", "6"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("setpriv, python3");
    let mut line = String::new();
    BufReader::new(flood.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the flood");
    assert_eq!(line.trim(), "flooding");
    let o = Command::new("/usr/bin/python3")
        .args(["-c", ACT_MANY, &sock_s, "7340", "50"])
        .output()
        .expect("python3");
    let busy: u32 = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{}", text(&o)));
    assert_eq!(busy, 0, "root's requests answered busy during a poll flood");
    let _ = flood.kill();
    let _ = flood.wait();
}

#[test]
fn an_event_stream_nobody_reads_is_let_go() {
    let dir = tempfile::tempdir().expect("tmp");
    let serve = Serve::start(
        dir.path(),
        &[
            "--demo",
            "--hosts",
            "gpu-b[0001-1000]",
            "--no-socket",
            "--interval",
            "10s",
        ],
        &[],
    );
    // A client with a tiny receive buffer that asks for every host's stream and never reads a byte: the
    // first snapshots (megabytes) cannot all be sent.
    let addr: std::net::SocketAddr = serve.addr.as_deref().expect("http").parse().expect("addr");
    let sock = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::STREAM,
        None,
    )
    .expect("socket");
    rustix::net::sockopt::set_socket_recv_buffer_size(&sock, 4096).expect("SO_RCVBUF");
    rustix::net::connect(&sock, &addr).expect("connect");
    let mut stream = std::net::TcpStream::from(sock);
    let mine = stream.local_addr().expect("local").port();
    std::io::Write::write_all(
        &mut stream,
        b"GET /api/v1/events HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .expect("ask");
    // The serve's end of this connection, as the kernel lists it: established while the serve holds it.
    let served = || {
        std::fs::read_to_string("/proc/net/tcp")
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let port = |a: &str| {
                    a.rsplit(':')
                        .next()
                        .and_then(|p| u16::from_str_radix(p, 16).ok())
                };
                f.len() > 3
                    && port(f[1]) == Some(addr.port())
                    && port(f[2]) == Some(mine)
                    && f[3] == "01"
            })
    };
    await_cond("the stream to be served", 10, served);
    // The serve gives up on it (30 s without a byte taken) and lets go of what it held for it.
    await_cond("the stalled stream to be let go", 60, || !served());
    drop(stream);
}

/// A cgroup v2 group of this test's own, removed when dropped (its processes gone first).
struct Group(std::path::PathBuf);

impl Drop for Group {
    fn drop(&mut self) {
        let mut dirs: Vec<std::path::PathBuf> = std::fs::read_dir(&self.0)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        dirs.push(self.0.clone());
        for d in dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crafted_cgroup_name_cannot_forge_a_label_in_metrics() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let lib = standin_nvml(tmp);
    std::fs::write(tmp.join("nvidia0"), b"").expect("stand-in device");
    // A unit whose name closes the label value and opens another: the job label of its process.
    let mount = std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .find(|l| l.contains(" - cgroup2 "))
        .and_then(|l| l.split_whitespace().nth(4).map(std::path::PathBuf::from))
        .expect("a cgroup v2 mount");
    let group = Group(mount.join(crate::support::unique("gpusweep-test")));
    let leaf = group.0.join("evil\",Hostname=\"spoofed\\x.service");
    std::fs::create_dir_all(&leaf).expect("a cgroup v2 group (run the suite as root)");
    let mut holder = crate::support::Reaped(
        Command::new("sleep")
            .arg("300")
            .stdin(std::fs::File::open(tmp.join("nvidia0")).expect("open"))
            .spawn()
            .expect("holder"),
    );
    std::fs::write(leaf.join("cgroup.procs"), holder.0.id().to_string()).expect("move in");
    set_nvml(tmp, &format!("512 {}:512\n", holder.0.id()));
    let glob = format!("{}/nvidia*", tmp.display());
    let env = [
        ("GPUSWEEP_NVML_LIBRARY", lib.as_path()),
        ("STANDIN_NVML_STATE", &tmp.join("nvml")),
    ];
    let serve = Serve::start(tmp, &["--no-socket", "--device-glob", &glob], &env);
    let (_, _, m) = get(&serve.url("/metrics")).await;
    let line = m
        .lines()
        .find(|l| l.starts_with("gpusweep_process_gpu_memory_bytes{") && l.contains("evil"))
        .unwrap_or_else(|| panic!("the holder's series: {m}"));
    assert!(!line.contains("Hostname=\"spoofed"), "{line}");
    // The holder is a job of its own (its unit), loading: its phase and memory, named as safely.
    job_series_of_a_loading_holder(&m);
    // Prometheus's own checker reads the whole exposition.
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package)");
    std::io::Write::write_all(&mut check.stdin.take().expect("stdin"), m.as_bytes())
        .expect("write");
    let o = check.wait_with_output().expect("promtool");
    let said = text(&o);
    assert!(
        !said.contains("error parsing") && !said.contains("text format parsing error"),
        "{said}\n{line}"
    );
    // Its lints name dcgm-exporter's own spellings alone: the job families, the lost-rank counter's HELP
    // included, read as promtool wants them.
    let job_lints: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("gpusweep_job"))
        .collect();
    assert!(job_lints.is_empty(), "{said}");
    let _ = holder.0.kill();
    let _ = holder.0.wait();
}

/// A loading job's series in a serve's metrics, named by a crafted unit: its phase, its memory, the
/// lost-rank counter and the warm-up histogram.
fn job_series_of_a_loading_holder(m: &str) {
    let phase = m
        .lines()
        .find(|l| l.starts_with("gpusweep_job_phase{") && l.contains("evil") && l.ends_with(" 1.0"))
        .unwrap_or_else(|| {
            panic!(
                "the job's phase: {}",
                m.lines()
                    .filter(|l| l.contains("gpusweep_job"))
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        });
    assert!(
        phase.contains("phase=\"loading\"") && !phase.contains("Hostname=\"spoofed"),
        "{phase}"
    );
    assert!(
        m.lines()
            .any(|l| l.starts_with("gpusweep_job_gpu_memory_bytes{")
                && l.contains("evil")
                && l.ends_with(" 536870912.0")),
        "{m}"
    );
    assert!(
        m.lines()
            .any(|l| l.starts_with("gpusweep_job_lost_ranks_total{") && l.ends_with(" 0")),
        "{m}"
    );
    assert!(m.contains("gpusweep_job_warmup_seconds_count{"), "{m}");
}

/// Read a stream until its first snapshot event is whole.
async fn read_through_snapshot(events: &mut reqwest::Response, got: &mut String) {
    read_until(events, got, "event: snapshot").await;
    let t = Instant::now();
    while !got
        .split_once("event: snapshot")
        .is_some_and(|(_, rest)| rest.contains("\n\n"))
    {
        assert!(t.elapsed() < Duration::from_secs(20), "{got}");
        let chunk = tokio::time::timeout(Duration::from_secs(20), events.chunk())
            .await
            .expect("the snapshot's end within 20 s")
            .expect("chunk")
            .expect("open");
        got.push_str(&String::from_utf8_lossy(&chunk));
    }
}

/// The whole events of a stream's text: (id, name, data), in order.
fn sse_events(text: &str) -> Vec<(String, String, String)> {
    let whole = &text[..text.rfind("\n\n").map_or(0, |i| i + 2)];
    whole
        .split("\n\n")
        .filter_map(|block| {
            let (mut id, mut name, mut data) = (String::new(), String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.to_string();
                } else if let Some(v) = line.strip_prefix("event: ") {
                    name = v.to_string();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            (!name.is_empty()).then_some((id, name, data))
        })
        .collect()
}

/// The sequence number of an event id (`EPOCH-SEQ`).
fn seq_of(id: &str) -> u64 {
    id.split_once('-')
        .and_then(|(_, s)| s.parse().ok())
        .unwrap_or_else(|| panic!("an id EPOCH-SEQ: {id:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_reconnects_with_its_last_event_id_gets_every_event_it_missed() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let sock = tmp.join("serve.sock").to_str().expect("utf-8").to_string();
    let serve = Serve::start(
        tmp,
        &[
            "--demo",
            "--hosts",
            "gpu-b",
            "--socket",
            &sock,
            "--interval",
            "200ms",
        ],
        &[],
    );
    let c = client();
    // A stays connected throughout; B reads its first events and leaves.
    let mut a = c.get(serve.url("/api/v1/events")).send().await.expect("a");
    let mut got_a = String::new();
    read_until(&mut a, &mut got_a, "event: snapshot").await;
    let mut b = c.get(serve.url("/api/v1/events")).send().await.expect("b");
    let mut got_b = String::new();
    read_through_snapshot(&mut b, &mut got_b).await;
    drop(b);
    let first = sse_events(&got_b);
    assert_eq!(first[0].1, "hello", "{got_b}");
    assert!(got_b.contains("retry: "), "a reconnect delay: {got_b}");
    assert!(
        first.iter().all(|(id, ..)| !id.is_empty()),
        "an id on every event: {got_b}"
    );
    let left_at = first.last().expect("events").0.clone();
    // While B is away, a sweep.
    crate::support::sweep_through(tmp, &sock);
    read_until(&mut a, &mut got_a, r#""event":"all_clean""#).await;
    // B comes back from where it was: every timeline event A saw since, in order, then the state now.
    let mut b = c
        .get(serve.url("/api/v1/events"))
        .header("Last-Event-ID", &left_at)
        .send()
        .await
        .expect("b again");
    let mut got_b = String::new();
    read_through_snapshot(&mut b, &mut got_b).await;
    let missed: Vec<(String, String)> = sse_events(&got_a)
        .into_iter()
        .filter(|(id, name, _)| name == "event" && seq_of(id) > seq_of(&left_at))
        .map(|(id, _, data)| (id, data))
        .collect();
    assert!(missed.len() >= 3, "the sweep's events: {got_a}");
    let again = sse_events(&got_b);
    // Its hello carries the place it resumes from: a client dropping right after it misses nothing.
    assert_eq!(again[0].1, "hello", "{got_b}");
    assert_eq!(again[0].0, left_at, "{got_b}");
    let replayed: Vec<(String, String)> = again
        .iter()
        .take_while(|(_, name, _)| name != "snapshot")
        .filter(|(_, name, _)| name == "event")
        .map(|(id, _, data)| (id.clone(), data.clone()))
        .collect();
    assert_eq!(replayed, missed, "{got_b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_further_behind_than_the_serve_keeps_is_told_so() {
    let c = client();
    // A serve that keeps 4 events: a client further behind is told what is gone, then given what is kept.
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let sock = tmp.join("serve.sock").to_str().expect("utf-8").to_string();
    let serve = Serve::start(
        tmp,
        &[
            "--demo", "--hosts", "gpu-b", "--socket", &sock, "--replay", "4",
        ],
        &[],
    );
    let mut b = c.get(serve.url("/api/v1/events")).send().await.expect("b");
    let mut got_b = String::new();
    read_through_snapshot(&mut b, &mut got_b).await;
    drop(b);
    let left_at = sse_events(&got_b).last().expect("events").0.clone();
    crate::support::sweep_through(tmp, &sock);
    let behind = |id: String| {
        let c = c.clone();
        let url = serve.url("/api/v1/events");
        async move {
            let mut r = c
                .get(url)
                .header("Last-Event-ID", id)
                .send()
                .await
                .expect("again");
            let mut got = String::new();
            read_through_snapshot(&mut r, &mut got).await;
            sse_events(&got)
        }
    };
    let again = behind(left_at.clone()).await;
    assert_eq!(again[1].1, "gap", "{again:?}");
    assert!(again[1].2.contains("no longer kept"), "{again:?}");
    let kept = again.iter().filter(|(_, name, _)| name == "event").count();
    assert!((1..=4).contains(&kept), "{again:?}");
    // An id this serve never gave (past its newest): said so, then every kept event.
    let (epoch, _) = left_at.split_once('-').expect("EPOCH-SEQ");
    let again = behind(format!("{epoch}-999999")).await;
    assert_eq!(again[1].1, "gap", "{again:?}");
    assert!(again[1].2.contains("never sent"), "{again:?}");
    // An id of another serve's life: everything before this one's start is gone, and said so.
    let again = behind("1-3".to_string()).await;
    assert_eq!(again[1].1, "gap", "{again:?}");
    assert!(again[1].2.contains("restarted"), "{again:?}");
}

#[test]
fn a_thread_with_its_own_fd_table_holds_the_gpu_at_every_reading_not_only_at_full_scans() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let dev = tmp.join("nvidia0");
    std::fs::write(&dev, b"").expect("device");
    let glob = tmp.join("nvidia*").to_str().expect("utf-8").to_string();
    let private_fds = crate::support::fixture_program(tmp, "private_fds.c");
    let mut holder = crate::support::Reaped(
        Command::new(&private_fds)
            .arg(&dev)
            .stdout(Stdio::piped())
            .spawn()
            .expect("fixture"),
    );
    let mut ready = String::new();
    BufReader::new(holder.0.stdout.take().expect("stdout"))
        .read_line(&mut ready)
        .expect("ready");
    let pid = holder.0.id();
    let serve = Serve::start(
        tmp,
        &[
            "--no-nvml",
            "--device-glob",
            &glob,
            "--no-socket",
            "--interval",
            "100ms",
        ],
        &[],
    );
    // Thirty readings, 100 ms apart: one full scan, then listings; every one names the holder.
    let mut missing = 0;
    for _ in 0..30 {
        let body = serve.raw_get("/api/v1/snapshot");
        let json = body.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let doc: serde_json::Value = serde_json::from_str(json).expect("json");
        let held = doc["hosts"][0]["holders"]
            .as_array()
            .is_some_and(|hs| hs.iter().any(|h| h["pid"] == pid));
        missing += u32::from(!held);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        missing, 0,
        "the holder {pid} was missing from {missing} of 30 readings"
    );
}

#[test]
fn counters_stay_with_the_serve_that_reads_them_and_never_age_in_a_client() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let serve = Serve::start(tmp, &["--demo", "--hosts", "gpu-a", "--no-socket"], &[]);
    // The serve's own reading carries them (its /metrics exports them)...
    let url = format!("http://{}", serve.addr.as_deref().expect("http"));
    let own = serve.raw_get("/api/v1/snapshot");
    assert!(own.contains(r#""counters":{"sm_clock_mhz""#), "{own}");
    // ...a client reading it over HTTP keeps none: unchanged readings would not refresh them.
    let out = gpusweep(tmp)
        .args(["snapshot", "--json", "--hosts", &url])
        .output()
        .expect("snapshot");
    let t = crate::support::exited(&out, 0);
    assert!(!t.contains("\"counters\""), "{t}");
}

#[test]
fn the_serve_listens_with_the_largest_backlog_the_kernel_allows() {
    // A burst of connections (a thousand clients' streams, a Prometheus with many targets on it, clients
    // reconnecting after a blip) must wait in the accept queue, not be dropped to a SYN retransmit a
    // second later.
    let dir = tempfile::tempdir().expect("tmp");
    let serve = Serve::start(dir.path(), &["--demo", "--hosts", "gpu-a"], &[]);
    let addr = serve.addr.clone().expect("an HTTP address");
    let port = addr.rsplit(':').next().expect("port");
    let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .expect("somaxconn")
        .trim()
        .parse()
        .expect("a number");
    let o = Command::new("ss")
        .args(["-Hltn", &format!("sport = :{port}")])
        .output()
        .expect("ss (iproute2)");
    let line = String::from_utf8_lossy(&o.stdout).to_string();
    // A listening socket's Send-Q is its backlog.
    let backlog: u32 = line
        .split_whitespace()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("ss said: {line}"));
    assert_eq!(backlog, somaxconn.min(65_535), "{line}");
}

#[test]
fn a_client_that_falls_behind_never_calls_a_host_down_that_kept_answering() {
    // Forty hosts stream readings every 200 ms; the client is stopped for 12 s (a starved CPU, a laptop
    // lid, a debugger): longer than it waits before giving a silent host up. The hosts kept answering into
    // its sockets the whole time, so when it runs again it must read what they said, not judge them by
    // its own silence.
    let dir = tempfile::tempdir().expect("tmp");
    let names: Vec<String> = (1..=40).map(|i| format!("gpu-b{i:04}")).collect();
    let serve = Serve::start(
        dir.path(),
        &["--demo", "--hosts", &names.join(","), "--interval", "200ms"],
        &[],
    );
    let addr = serve.addr.clone().expect("an HTTP address");
    let hostfile = dir.path().join("hosts");
    std::fs::write(
        &hostfile,
        names
            .iter()
            .map(|n| format!("http://{addr}/hosts/{n}"))
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .expect("hostfile");
    let events = dir.path().join("events.jsonl");
    let mut client = crate::support::Reaped(
        gpusweep(dir.path())
            .args([
                "wait",
                "--timeout",
                "20s",
                "--interval",
                "200ms",
                "--hostfile",
            ])
            .arg(&hostfile)
            .arg("--events")
            .arg(&events)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("wait"),
    );
    let up = || {
        std::fs::read_to_string(&events)
            .unwrap_or_default()
            .matches("\"event\":\"host_up\"")
            .count()
    };
    await_cond("every host up", 30, || up() >= 40);
    let pid = client.0.id().to_string();
    let _ = Command::new("kill").args(["-STOP", &pid]).status();
    std::thread::sleep(Duration::from_secs(12));
    let _ = Command::new("kill").args(["-CONT", &pid]).status();
    // It goes on to its timeout (the demo's gpu-b hosts never read clean), having read through its backlog.
    let status = client.0.wait().expect("wait ends");
    assert_eq!(status.code(), Some(1), "timed out, held");
    let log = std::fs::read_to_string(&events).unwrap_or_default();
    let down: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("\"event\":\"host_down\""))
        .collect();
    assert!(
        down.is_empty(),
        "{} false host_down: {:?}",
        down.len(),
        &down[..down.len().min(3)]
    );
}

/// Resident memory of a process, KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_burst_of_streams_took_is_given_back_when_they_end() {
    let dir = tempfile::tempdir().expect("tmp");
    let serve = Serve::start(
        dir.path(),
        &["--demo", "--hosts", "gpu-b[0001-0300]", "--no-socket"],
        &[],
    );
    let pid = serve.child.id();
    await_cond("every host read", 30, || {
        serve
            .raw_get("/healthz")
            .lines()
            .next()
            .is_some_and(|l| l.contains(" 200"))
    });
    let idle = rss_kib(pid);
    // Forty clients each read the whole fleet once (300 snapshots), then go.
    let mut streams = Vec::new();
    for _ in 0..40 {
        let mut r = client()
            .get(serve.url("/api/v1/events"))
            .send()
            .await
            .expect("events");
        // Counted as the bytes come (a marker may straddle two reads), not by searching all read so far.
        const MARK: &[u8] = b"event: snapshot";
        let (mut seen, mut tail) = (0, Vec::new());
        while seen < 300 {
            let chunk = r.chunk().await.expect("chunk").expect("open");
            tail.extend_from_slice(&chunk);
            seen += tail.windows(MARK.len()).filter(|w| *w == MARK).count();
            tail = tail.split_off(tail.len().saturating_sub(MARK.len() - 1));
        }
        streams.push(r);
    }
    let peak = rss_kib(pid);
    assert!(
        peak > idle + 10 * 1024,
        "the burst took memory: {idle} -> {peak} KiB"
    );
    drop(streams);
    // What they took is given back to the system, not kept for a burst that may never come again.
    let halfway = idle + (peak - idle) / 2;
    await_cond("memory given back", 30, || rss_kib(pid) <= halfway);
}

/// The first child of a process, if it has one.
fn first_child(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()
        .and_then(|c| c.split_whitespace().next().and_then(|p| p.parse().ok()))
}

/// Inside a container without the host's PIDs the driver lists only the container's own processes (it drops
/// the PIDs it cannot translate; the stand-in NVML is told the same): gpusweep says so, does not call the rest
/// a leak, and reads the node's serve instead when `--node-serve` names one it can reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // one pod, three ways of reading it
async fn inside_a_pod_nvml_lists_only_its_pids_and_the_node_serve_is_read_instead() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let lib = standin_nvml(tmp);
    let dev = tmp.join("nvidia0");
    std::fs::write(&dev, b"").expect("stand-in device");
    // Another pod's holder, outside the namespace: 3000 MiB.
    let outside = crate::support::Reaped(
        Command::new("sleep")
            .arg("300")
            .stdin(std::fs::File::open(&dev).expect("open"))
            .spawn()
            .expect("outside holder"),
    );
    // The pod: a PID namespace and /proc of its own, its PID 1 holding 1000 MiB.
    let pod = crate::support::Reaped(
        Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
            .args(["sh", "-c", "exec sleep 300 <\"$0\""])
            .arg(&dev)
            .spawn()
            .expect("unshare (util-linux) runs as root"),
    );
    let mut inside = None;
    await_cond("the pod's holder", 10, || {
        inside = first_child(pod.0.id())
            .filter(|p| std::fs::read_link(format!("/proc/{p}/fd/0")).is_ok_and(|l| l == dev));
        inside.is_some()
    });
    let inside = inside.expect("holder");
    let status = std::fs::read_to_string(format!("/proc/{inside}/status")).expect("status");
    let inner: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|p| p.parse().ok())
        .expect("NSpid");
    // What the driver tells each side: the node both PIDs, the pod only its own.
    let outside_pid = outside.0.id();
    std::fs::write(
        tmp.join("nvml-node"),
        format!("4000 {inside}:1000 {outside_pid}:3000\n"),
    )
    .expect("node state");
    set_nvml(tmp, &format!("4000 {inner}:1000\n"));
    let glob = format!("{}/nvidia*", tmp.display());
    let serve = Serve::start(
        tmp,
        &["--device-glob", &glob, "--interval", "1s"],
        &[
            ("GPUSWEEP_NVML_LIBRARY", lib.as_path()),
            ("STANDIN_NVML_STATE", &tmp.join("nvml-node")),
            ("GPUSWEEP_SOCKET", &tmp.join("serve.sock")),
        ],
    );
    let target = inside.to_string();
    let in_pod = |node: Option<&str>| {
        let mut c = gpusweep_via(
            tmp,
            &["nsenter", "--target", &target, "--pid", "--mount", "--"],
        );
        c.args(["snapshot", "--json", "--device-glob", &glob])
            .env("GPUSWEEP_NVML_LIBRARY", &lib)
            .env("STANDIN_NVML_STATE", tmp.join("nvml"));
        if let Some(u) = node {
            c.env("GPUSWEEP_NODE_SERVE", u);
        }
        let o = c.output().expect("nsenter (util-linux) runs as root");
        let doc: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
        (doc, String::from_utf8_lossy(&o.stderr).into_owned())
    };
    // Alone in the pod: its holder by its own PID, the other 3000 MiB residual and named as invisible to
    // NVML from here — a warning, not a leak; the GPU in use, not leaking.
    let (doc, said) = in_pod(None);
    let host = &doc["hosts"][0];
    assert_eq!(host["in_child_pid_namespace"], true, "{doc}");
    assert!(
        said.contains("own PID namespace") && said.contains("--node-serve"),
        "{said}"
    );
    assert!(
        host["holders"]
            .as_array()
            .is_some_and(|h| h.iter().any(|h| h["pid"] == inner)),
        "{doc}"
    );
    let residual = host["findings"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["kind"] == "residual"))
        .unwrap_or_else(|| panic!("a residual: {doc}"));
    assert_eq!(residual["bytes"], 3000u64 * 1024 * 1024, "{residual}");
    assert_eq!(residual["severity"], "warning", "{residual}");
    assert!(
        residual["detail"]
            .as_str()
            .is_some_and(|d| d.contains("NVML lists only this namespace's processes")),
        "{residual}"
    );
    assert_eq!(host["gpus"][0]["state"], "in_use", "{doc}");
    // With the node's serve named and reachable: the node's reading, both holders by their node PIDs.
    let (doc, said) = in_pod(Some(&serve.url("")));
    let host = &doc["hosts"][0];
    assert!(said.contains("through its serve"), "{said}");
    assert_eq!(host["source"], "http", "{doc}");
    assert_eq!(host["in_child_pid_namespace"], false, "{doc}");
    for pid in [inside, outside_pid] {
        assert!(
            host["holders"]
                .as_array()
                .is_some_and(|h| h.iter().any(|h| h["pid"] == pid)),
            "holder {pid}: {doc}"
        );
    }
    assert!(
        host["findings"]
            .as_array()
            .is_some_and(|f| f.iter().all(|f| f["kind"] != "residual")),
        "{doc}"
    );
    // Named but not answering: this pod's own reading, and why the node's was not used.
    let closed = format!("http://127.0.0.1:{}", crate::support::free_port());
    let (doc, said) = in_pod(Some(&closed));
    assert_eq!(doc["hosts"][0]["in_child_pid_namespace"], true, "{doc}");
    assert!(
        said.contains(&closed) && said.contains("could not be reached"),
        "{said}"
    );
}

/// Hosts of one serve are read through one event stream, not one each: a client naming 300 hosts of a serve
/// that takes 128 streams (its budget under 1024 descriptors) reads all 300, over one connection, and none
/// is called down.
#[test]
fn many_hosts_of_one_serve_are_read_through_one_stream() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let names: Vec<String> = (1..=300).map(|i| format!("gpu-b{i:04}")).collect();
    let serve = Serve::start_as(
        gpusweep_via(tmp, &["prlimit", "--nofile=1024:1024", "--"]),
        &["--demo", "--hosts", &names.join(","), "--interval", "1s"],
        &[],
    );
    let addr = serve.addr.clone().expect("an HTTP address");
    let hostfile = tmp.join("hosts");
    let specs: Vec<String> = names
        .iter()
        .map(|n| format!("http://{addr}/hosts/{n}"))
        .collect();
    std::fs::write(&hostfile, specs.join("\n")).expect("hostfile");
    let events = tmp.join("events.jsonl");
    let client = crate::support::Reaped(
        gpusweep(tmp)
            .args(["wait", "--timeout", "60s", "--hostfile"])
            .arg(&hostfile)
            .arg("--events")
            .arg(&events)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("wait"),
    );
    let log = || std::fs::read_to_string(&events).unwrap_or_default();
    await_cond("every host up", 60, || {
        log().matches("\"event\":\"host_up\"").count() >= 300
    });
    // Its connections to the serve, as the kernel lists them.
    let port = addr.rsplit(':').next().expect("port");
    let ss = Command::new("ss")
        .args(["-tnpH", "state", "established"])
        .arg(format!("( dport = :{port} )"))
        .output()
        .expect("ss (iproute2)");
    let mine = format!("pid={},", client.0.id());
    let conns = String::from_utf8_lossy(&ss.stdout)
        .lines()
        .filter(|l| l.contains(&mine))
        .count();
    assert_eq!(conns, 1, "{}", String::from_utf8_lossy(&ss.stdout));
    let down = log().matches("\"event\":\"host_down\"").count();
    assert_eq!(down, 0, "{}", log());
}

/// The simulated fleet costs a thread, not a thread per host: a demo serve of 1,000 hosts has every one
/// read (its /healthz says so) with fewer threads than a hundredth of its hosts besides the runtime's.
#[test]
fn a_thousand_simulated_hosts_are_polled_on_one_thread() {
    let dir = tempfile::tempdir().expect("tmp");
    let serve = Serve::start(
        dir.path(),
        &["--demo", "--hosts", "gpu-b[0001-1000]", "--interval", "1s"],
        &[],
    );
    await_cond("every host read", 30, || {
        serve.raw_get("/healthz").starts_with("HTTP/1.0 200")
    });
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", serve.child.id())).expect("status");
    let threads: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("Threads:");
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    // The runtime's workers and blocking threads, the listener's, and the simulated hosts' one.
    assert!(threads <= cores + 10, "{threads} threads");
}

/// A warming host's reading that moved only its memory travels as a small `memory` event to a stream that
/// asks, and a gpusweep reading that serve (here a second serve, whose own snapshot shows what its client
/// made of the stream) holds exactly the memory the first one read, reading after reading.
#[test]
#[allow(clippy::too_many_lines)] // the serve's stream, then a client of it beside the serve, start to end
fn memory_alone_travels_and_the_client_puts_it_onto_the_reading_it_has() {
    use std::io::{Read, Write};
    let (up_dir, down_dir) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    let up = Serve::start(
        up_dir.path(),
        &[
            "--demo",
            "--hosts",
            "gpu-a,gpu-b",
            "--interval",
            "200ms",
            "--no-socket",
        ],
        &[],
    );
    // Asked for, the memory alone: one number per GPU and per listed process, nothing else of the reading.
    let mut s = std::net::TcpStream::connect(up.addr.as_deref().expect("http")).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(
        s,
        "GET /api/v1/events?hosts=gpu-a&memory=moved HTTP/1.0\r\n\r\n"
    )
    .expect("ask");
    let mut got = String::new();
    let mut buf = vec![0u8; 65536];
    while got.matches("event: memory").count() < 2 {
        let n = s.read(&mut buf).expect("the stream goes on");
        assert!(n > 0, "{got}");
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let data = got
        .split("event: memory\n")
        .nth(1)
        .and_then(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .expect("data");
    let m: serde_json::Value = serde_json::from_str(data).expect("json");
    assert_eq!(m["used"].as_array().map(Vec::len), Some(8), "{data}");
    assert_eq!(m["charged"].as_array().map(Vec::len), Some(8), "{data}");
    assert!(
        m.get("processes").is_none() && m.get("findings").is_none(),
        "{data}"
    );
    assert!(data.len() < 1024, "{} bytes: {data}", data.len());
    drop(s);
    let refused = up.raw_get("/api/v1/events?memory=some");
    assert!(refused.starts_with("HTTP/1.0 400"), "{refused}");
    // gpusweep's client of both hosts (one stream, which asks for the memory alone) and the serve itself:
    // gpu-a's memory as each says it, by the time it was read.
    let specs = gpusweep::core::host::parse_specs(
        &[format!(
            "{},{}",
            up.url("/hosts/gpu-a"),
            up.url("/hosts/gpu-b")
        )],
        &std::collections::BTreeMap::new(),
    )
    .expect("specs");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let up_memory = |at: u64| -> Option<(u64, Vec<Option<u64>>)> {
        let body = up.raw_get("/api/v1/snapshot");
        let doc: serde_json::Value = serde_json::from_str(body.split_once("\r\n\r\n")?.1).ok()?;
        let h = doc["hosts"]
            .as_array()?
            .iter()
            .find(|h| h["host"] == "gpu-a")?
            .clone();
        let used = h["gpus"]
            .as_array()?
            .iter()
            .map(|g| g["memory"]["used"].as_u64())
            .collect();
        let taken = h["taken_at_ms"].as_u64()?;
        (taken >= at).then_some((taken, used))
    };
    // The serve's own readings, sampled beside the client's.
    let upstream = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::scope(|scope| {
        let (sampled, done_too) = (upstream.clone(), done.clone());
        let up_memory = &up_memory;
        scope.spawn(move || {
            while !done_too.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some((at, used)) = up_memory(0)
                    && let Ok(mut m) = sampled.lock()
                {
                    m.insert(at, used);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let (client, alone, same_as_ledger) = rt.block_on(async {
            use gpusweep::runtime::{Judgement, fleet::HostEvent};
            // A front end that holds every reading (the TUI): memory alone is put onto the one it holds.
            let audit = down_dir.path().join("audit.jsonl");
            let opts = gpusweep::runtime::FleetOptions {
                memory_alone: true,
                ..crate::remote::options(Duration::from_millis(200), &audit)
            };
            let mut fleet = gpusweep::runtime::Fleet::start(&specs, &opts)
                .await
                .expect("fleet");
            let (mut seen, mut alone, mut same_as_ledger) = (Vec::new(), 0, 0);
            let mut held: Option<gpusweep::runtime::Judged> = None;
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(8) {
                let ev = tokio::time::timeout(Duration::from_secs(5), fleet.recv())
                    .await
                    .expect("a reading within 5 s")
                    .expect("the fleet goes on");
                let host = match ev {
                    HostEvent::Update {
                        host,
                        update: Judgement::New(judged),
                    } if fleet.label(host).ends_with("gpu-a") => {
                        held = Some(*judged);
                        host
                    }
                    HostEvent::Update {
                        host,
                        update: Judgement::Memory(memory),
                    } if fleet.label(host).ends_with("gpu-a") => {
                        let onto = held.as_mut().expect("a reading before memory alone");
                        assert!(memory.put_onto(onto), "memory alone fits the reading held");
                        alone += 1;
                        host
                    }
                    HostEvent::Update {
                        host,
                        update:
                            Judgement::Same {
                                taken_at_ms,
                                gauges,
                            },
                    } if fleet.label(host).ends_with("gpu-a") => {
                        if let Some(h) = held.as_mut() {
                            std::sync::Arc::make_mut(&mut h.snap)
                                .refresh_said(taken_at_ms, &gauges);
                        }
                        continue;
                    }
                    _ => continue,
                };
                let Some(h) = &held else { continue };
                seen.push((
                    h.snap.taken_at_ms,
                    h.snap
                        .gpus
                        .iter()
                        .map(|g| g.memory.used)
                        .collect::<Vec<_>>(),
                ));
                // The ledger's own whole reading, where it has not moved on since: the same.
                if let Some(l) = fleet.latest(host)
                    && l.snap.taken_at_ms == h.snap.taken_at_ms
                {
                    assert_eq!(&l, h, "the reading held against the ledger's");
                    same_as_ledger += 1;
                }
            }
            (seen, alone, same_as_ledger)
        });
        assert!(alone >= 3, "{alone} readings came as memory alone");
        assert!(
            same_as_ledger >= 5,
            "{same_as_ledger} compared with the ledger's"
        );
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let upstream = upstream.lock().expect("samples");
        let mut matched = 0;
        for (at, used) in &client {
            if let Some(theirs) = upstream.get(at) {
                assert_eq!(used, theirs, "gpu-a at {at}");
                matched += 1;
            }
        }
        assert!(
            matched >= 5 && client.len() >= 10,
            "{matched} of {} readings matched",
            client.len()
        );
    });
}

/// Each event of a raw stream read so far: its kind and data, in order.
fn events(got: &str) -> Vec<(String, String)> {
    got.split("\n\n")
        .filter_map(|e| {
            let kind = e.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = e.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((kind.to_string(), data.to_string()))
        })
        .collect()
}

/// A warming host with a straggler: its finding's bytes move with every step of the warm-up, so each
/// reading was sent whole (13 KB a second a host on the demo's 8 GPUs). A stream that asks `findings=moved`
/// gets the memory with the findings instead; one that does not gets no findings in a `memory` event.
#[test]
fn a_stragglers_moving_figures_travel_with_the_memory_not_as_whole_readings() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().expect("tmp");
    let serve = Serve::start(
        dir.path(),
        &[
            "--demo",
            "--hosts",
            "gpu-a",
            "--interval",
            "250ms",
            "--no-socket",
        ],
        &[],
    );
    let open = |query: &str| {
        let mut s =
            std::net::TcpStream::connect(serve.addr.as_deref().expect("http")).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        write!(s, "GET /api/v1/events?hosts=gpu-a&{query} HTTP/1.0\r\n\r\n").expect("ask");
        s
    };
    let (mut with, mut without) = (open("memory=moved&findings=moved"), open("memory=moved"));
    let carries_straggler = |data: &str| {
        serde_json::from_str::<serde_json::Value>(data).is_ok_and(|m| {
            m["findings"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f["kind"] == "straggler"))
        })
    };
    let (mut got, mut buf) = (String::new(), vec![0u8; 65536]);
    let t = Instant::now();
    // Until five memory events carried the straggler's finding (it is said some seconds into the warm-up).
    while events(&got)
        .iter()
        .filter(|(k, d)| k == "memory" && carries_straggler(d))
        .count()
        < 5
    {
        assert!(t.elapsed() < Duration::from_secs(60), "{got}");
        let n = with.read(&mut buf).expect("the stream goes on");
        assert!(n > 0, "{got}");
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let seen = events(&got);
    let first = seen
        .iter()
        .position(|(k, d)| k == "memory" && carries_straggler(d))
        .expect("one");
    // From the first on, the readings went as memory with findings, not whole (a finding of something new
    // still goes whole: at most one here).
    let whole_after = seen[first..]
        .iter()
        .filter(|(k, _)| k == "snapshot")
        .count();
    assert!(whole_after <= 1, "{whole_after} whole readings: {got}");
    let (_, data) = &seen[first];
    assert!(data.len() < 4096, "{} bytes: {data}", data.len());
    let m: serde_json::Value = serde_json::from_str(data).expect("json");
    assert_eq!(m["used"].as_array().map(Vec::len), Some(8), "{data}");
    // The stream that did not ask: the same readings whole, never findings in a memory event.
    without
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut other = String::new();
    while other.matches("event: snapshot").count() < 3 {
        let n = without.read(&mut buf).expect("the stream goes on");
        assert!(n > 0, "{other}");
        other.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(
        events(&other)
            .iter()
            .all(|(k, d)| k != "memory" || !d.contains("\"findings\"")),
        "{other}"
    );
    let refused = serve.raw_get("/api/v1/events?memory=moved&findings=some");
    assert!(refused.starts_with("HTTP/1.0 400"), "{refused}");
}

#[test]
fn a_serve_open_beyond_loopback_without_a_token_says_so() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut c = gpusweep(dir.path());
    c.args([
        "serve",
        "--demo",
        "--hosts",
        "gpu-a",
        "--listen",
        "0.0.0.0:0",
        "--no-socket",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let mut child = crate::support::Reaped(c.spawn().expect("serve"));
    let mut err = BufReader::new(child.0.stderr.take().expect("stderr"));
    let (mut banner, mut warning) = (String::new(), String::new());
    err.read_line(&mut banner).expect("banner");
    err.read_line(&mut warning).expect("warning");
    assert!(banner.starts_with("gpusweep serve:"), "{banner}");
    assert!(
        warning.contains("warning") && warning.contains("--token-file"),
        "{warning}"
    );
}

/// A host is judged once, where its history is: a client that attaches to a serve after gpu-d lost rank 3
/// (the demo's warm-up crash at 24 s) shows the lost rank, the job's phase and the finding the serve shows,
/// over HTTP and through the socket, not a fresh judgement with no history.
#[test]
fn a_client_attached_after_the_crash_shows_what_the_node_saw() {
    let dir = tempfile::tempdir().expect("tmp");
    let sock = dir.path().join("serve.sock");
    let sock_s = sock.to_str().expect("utf-8").to_string();
    let serve = Serve::start(
        dir.path(),
        &["--demo", "--hosts", "gpu-d", "--socket", &sock_s],
        &[],
    );
    let lost = |doc: &serde_json::Value| -> Option<(String, usize)> {
        let h = &doc["hosts"][0];
        let job = h["jobs"]
            .as_array()?
            .iter()
            .find(|j| j["phase"] == "lost_rank")?;
        let finding = h["findings"]
            .as_array()?
            .iter()
            .any(|f| f["kind"] == "lost_rank");
        finding.then(|| {
            (
                job["id"].as_str().unwrap_or("").to_string(),
                job["lost"].as_array().map_or(0, Vec::len),
            )
        })
    };
    // The node's own view: the lost rank, once the warm-up crashed.
    let mut node = None;
    await_cond("gpu-d's lost rank at the serve", 60, || {
        let r = serve.raw_get("/api/v1/snapshot");
        let body = r.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        node = serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .as_ref()
            .and_then(lost);
        node.is_some()
    });
    let node = node.expect("the serve's lost rank");
    assert!(node.1 > 0, "{node:?}");
    // Clients attached now, after the crash.
    for spec in [
        format!(
            "http://{}/hosts/gpu-d",
            serve.addr.as_deref().expect("http")
        ),
        format!("unix:{sock_s}"),
    ] {
        let o = gpusweep(dir.path())
            .args(["snapshot", "--json", "--hosts", &spec])
            .output()
            .expect("snapshot");
        let doc: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{spec}: {}", text(&o)));
        assert_eq!(
            lost(&doc),
            Some(node.clone()),
            "{spec}: the serve's lost rank and phase: {doc}"
        );
    }
}

/// Streams that read nothing of a many-host serve each hold what waits for them (megabytes); while more
/// than four stall at once, each is let go after 5 s instead of 30 s.
#[test]
fn many_streams_that_never_read_are_let_go_sooner() {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("tmp");
    let serve = Serve::start(
        dir.path(),
        &[
            "--demo",
            "--hosts",
            "gpu-b[0001-0900],gpu-a[001-100]",
            "--interval",
            "200ms",
        ],
        &[],
    );
    let pid = serve.child.id();
    let (_, fds0) = rss_and_fds(pid);
    let addr = serve.addr.clone().expect("http");
    let streams: Vec<std::net::TcpStream> = (0..12)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(&addr).expect("connect");
            write!(s, "GET /api/v1/events HTTP/1.1\r\nHost: x\r\n\r\n").expect("ask");
            s
        })
        .collect();
    // A 1,000-host serve at 200 ms starved by the rest of the suite may take a while to answer them all, and
    // the first may already be let go when the last is answered: each is seen answered on its own side (a
    // few bytes read, not enough to unstall it).
    for s in &streams {
        use std::io::Read;
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let mut head = [0u8; 12];
        (&*s).read_exact(&mut head).expect("an answer");
        assert_eq!(&head, b"HTTP/1.1 200", "{}", String::from_utf8_lossy(&head));
    }
    // Never read: once they stall, all but four are let go well before the 30 s a lone one is given (then
    // the serve is no longer crowded, and the last four get the 30 s).
    await_cond("the stalled streams let go", 25, || {
        rss_and_fds(pid).1 <= fds0 + 4
    });
    drop(streams);
}

/// The shipped alert fires on a leftover the serve exports: the series recorded from a real serve (a ghost:
/// 4 GiB charged to a PID that is gone) fed to `promtool test rules` with `deploy/prometheus/gpusweep-alerts.yml`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // one recorded series, the rule file checked and tested both ways
async fn the_leftover_alert_fires_on_a_recorded_series() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let pid = a_gone_pid();
    let (serve, _, _) = standin_serve(tmp, &format!("4096 {pid}:4096\n0 util=0\n"), &[]);
    let (_, _, m) = get(&serve.url("/metrics")).await;
    let series: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("gpusweep_leftover_bytes{"))
        .collect();
    assert_eq!(series.len(), 1, "one leftover, on GPU 0: {m}");
    let line = series[0];
    assert!(
        line.contains("kind=\"ghost\"")
            && line.contains("gpu=\"0\"")
            && line.contains("GPU_I_ID=\"\""),
        "{line}"
    );
    let (labels, value) = line.rsplit_once(' ').expect("a value");
    assert_eq!(
        value.parse::<f64>().ok(),
        Some(4096.0 * 1_048_576.0),
        "{line}"
    );
    let host = labels
        .split("Hostname=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("Hostname");
    let rules = std::fs::canonicalize("deploy/prometheus/gpusweep-alerts.yml").expect("rules");
    let test = format!(
        r#"rule_files: ["{rules}"]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - series: '{labels}'
        values: '{value}x8'
      - series: 'gpusweep_gpus_readable{{Hostname="{host}"}}'
        values: '1x8'
    alert_rule_test:
      - eval_time: 10s
        alertname: GpuLeftover
        exp_alerts: []
      - eval_time: 30s
        alertname: GpuLeftover
        exp_alerts:
          - exp_labels: {{severity: warning, Hostname: "{host}", gpu: "0", kind: ghost}}
            exp_annotations:
              summary: "GPU 0 of {host} holds a ghost leftover"
              description: "gpusweep snapshot --hosts {host} names it; gpusweep sweep ends it."
      - eval_time: 90s
        alertname: GpuUnreadable
        exp_alerts: []
"#,
        rules = rules.display()
    );
    let file = tmp.join("alerts.test.yml");
    std::fs::write(&file, test).expect("test file");
    let o = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .expect("promtool (Debian's prometheus package)");
    assert!(o.status.success(), "{}", text(&o));
    let o = Command::new("promtool")
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .expect("promtool");
    assert!(o.status.success(), "{}", text(&o));
    // The rule really reads the series: without it, nothing fires and the test above fails.
    let empty = std::fs::read_to_string(&file)
        .expect("read")
        .replace(&format!("values: '{value}x8'"), "values: '_x8'");
    std::fs::write(&file, empty).expect("test file");
    let o = Command::new("promtool")
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .expect("promtool");
    assert!(!o.status.success(), "{}", text(&o));
}

/// HELP texts as dcgm-exporter writes them (a demo serve has every field): one final period where it has
/// one, none where it has none (prometheus-client adds one of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dcgm_help_texts_read_as_dcgm_exporter_writes_them() {
    let dir = tempfile::tempdir().expect("tmp");
    let serve = Serve::start(
        dir.path(),
        &["--demo", "--hosts", "gpu-a", "--no-socket"],
        &[],
    );
    let (_, _, m) = get(&serve.url("/metrics")).await;
    let helps: Vec<&str> = m.lines().filter(|l| l.starts_with("# HELP ")).collect();
    assert!(helps.iter().all(|l| !l.ends_with("..")), "{helps:#?}");
    for exact in [
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
        "# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).",
        "# HELP DCGM_FI_DEV_ROW_REMAP_FAILURE Whether remapping of rows has failed",
        "# HELP DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS Number of remapped rows for correctable errors",
    ] {
        assert!(helps.contains(&exact), "{exact}: {helps:#?}");
    }
}

/// A stream asked for hosts this serve does not have streams those it has and says which it has not, in its
/// hello (it said nothing of them before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_asked_for_a_host_the_serve_lacks_says_so_in_its_hello() {
    let dir = tempfile::tempdir().expect("tmp");
    let serve = Serve::start(
        dir.path(),
        &["--demo", "--hosts", "gpu-a,gpu-b", "--no-socket"],
        &[],
    );
    let mut r = client()
        .get(serve.url("/api/v1/events?hosts=gpu-b,nope"))
        .send()
        .await
        .expect("events");
    let mut got = String::new();
    read_through_snapshot(&mut r, &mut got).await;
    let events = sse_events(&got);
    assert_eq!(events[0].1, "hello", "{got}");
    let hello: serde_json::Value = serde_json::from_str(&events[0].2).expect("hello json");
    assert_eq!(hello["hosts"], serde_json::json!(["gpu-b"]), "{hello}");
    assert_eq!(hello["unknown"], serde_json::json!(["nope"]), "{hello}");
}

/// A GPU in MIG mode in `/metrics`: its framebuffer per instance, labelled `GPU_I_PROFILE` and `GPU_I_ID` as
/// dcgm-exporter labels it (not the GPU's as well, which a sum would count twice), and a leftover on an
/// instance with its `GPU_I_ID`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mig_gpus_metrics_are_per_instance() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let dead = a_gone_pid();
    let (serve, _, _) = standin_serve(tmp, &format!("4096 mig=1/0 mig=2/4096/{dead}@4096\n"), &[]);
    let (_, _, m) = get(&serve.url("/metrics")).await;
    let fb: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_FB_USED{"))
        .collect();
    assert_eq!(fb.len(), 2, "one series per instance: {fb:#?}");
    assert!(
        fb.iter()
            .any(|l| l.contains("GPU_I_PROFILE=\"1g.18gb\",GPU_I_ID=\"2\"")
                && l.ends_with(" 4096.0")),
        "{fb:#?}"
    );
    let left: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("gpusweep_leftover_bytes{"))
        .collect();
    assert!(
        left.iter()
            .any(|l| l.contains("GPU_I_ID=\"2\"") && l.contains("kind=\"ghost\"")),
        "{left:#?}"
    );
}

/// An XID that needs a reset, seen by a serve: its last XID and its count in `/metrics` (dcgm-exporter's
/// `DCGM_FI_DEV_XID_ERRORS`) and JSON, the GPU not ready for a launch (`needs_reset`, apart from a leak),
/// and `check` through the node's serve says a problem with the reason. A driver asking for a reset does
/// the same without a serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xid_that_needs_a_reset_makes_the_gpu_not_ready() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let (serve, lib, glob) = standin_serve(tmp, "0 xid=13 xid=79\n0\n", &["--interval", "200ms"]);
    let started = Instant::now();
    let m = loop {
        let (_, _, m) = get(&serve.url("/metrics")).await;
        if m.contains("xid=\"79\"") {
            break m;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no XID 79: {m}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let last = m
        .lines()
        .find(|l| l.starts_with("DCGM_FI_DEV_XID_ERRORS{gpu=\"0\""))
        .unwrap_or_else(|| panic!("{m}"));
    assert!(last.ends_with(" 79.0"), "{last}");
    assert!(
        m.lines().any(|l| l.starts_with("gpusweep_gpu_xid_errors{")
            && l.contains("xid=\"13\"")
            && l.ends_with(" 1.0")),
        "{m}"
    );
    let (_, _, body) = get(&serve.url("/api/v1/snapshot")).await;
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    let g = &v["hosts"][0]["gpus"][0];
    assert_eq!(g["state"], "needs_reset", "{g}");
    assert_eq!(g["xids"]["last"], 79, "{g}");
    assert!(
        v["hosts"][0]["findings"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["kind"] == "needs_reset"
                && f["detail"].as_str().is_some_and(|d| d.contains("XID 79")))),
        "{v}"
    );
    assert_eq!(v["hosts"][0]["gpus"][1]["state"], "clean", "{v}");
    let o = crate::support::gpusweep(tmp)
        .args(["check", "--hosts", &serve.url("")])
        .output()
        .expect("check");
    let line = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(1), "{line} {}", text(&o));
    assert!(
        line.contains("GPU 0 needs a reset") && line.contains("XID 79"),
        "{line}"
    );
    // A one-shot reading does not watch XIDs (it would only say "none seen" of its few milliseconds): no
    // `xids` on any GPU, and what it says of readiness is the driver's recovery action alone.
    let o = crate::support::gpusweep(tmp)
        .args(["snapshot", "--json", "--no-serve", "--device-glob", &glob])
        .env("GPUSWEEP_NVML_LIBRARY", &lib)
        .env("STANDIN_NVML_STATE", tmp.join("nvml"))
        .output()
        .expect("snapshot");
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    for g in v["hosts"][0]["gpus"].as_array().expect("gpus") {
        assert!(g["xids"].is_null(), "a one-shot reading watched: {g}");
        assert_eq!(g["state"], "clean", "{g}");
    }
    // Without a serve: the driver's own recovery action.
    set_nvml(tmp, "0 recovery=1\n");
    let o = crate::support::gpusweep(tmp)
        .args(["check", "--device-glob", &glob])
        .env("GPUSWEEP_NVML_LIBRARY", &lib)
        .env("STANDIN_NVML_STATE", tmp.join("nvml"))
        .output()
        .expect("check");
    let line = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(1), "{line} {}", text(&o));
    assert!(line.contains("the driver asks for a GPU reset"), "{line}");
    // Draining peer-to-peer traffic first: not ready either.
    set_nvml(tmp, "0 recovery=3\n");
    let o = crate::support::gpusweep(tmp)
        .args(["check", "--device-glob", &glob])
        .env("GPUSWEEP_NVML_LIBRARY", &lib)
        .env("STANDIN_NVML_STATE", tmp.join("nvml"))
        .output()
        .expect("check");
    crate::support::exited(&o, 1);
}

/// A PID that was and is no more (a process started and reaped).
fn a_gone_pid() -> u32 {
    let mut gone = Command::new("true").spawn().expect("true");
    let pid = gone.id();
    gone.wait().expect("reaped");
    pid
}

/// A serve of this host over the stand-in NVML saying `state`, its device files stand-ins in `tmp`; with its
/// library, for commands run beside it.
fn standin_serve(tmp: &Path, state: &str, extra: &[&str]) -> (Serve, std::path::PathBuf, String) {
    let lib = standin_nvml(tmp);
    std::fs::write(tmp.join("nvidia0"), b"").expect("stand-in device");
    set_nvml(tmp, state);
    let glob = format!("{}/nvidia*", tmp.display());
    let env = [
        ("GPUSWEEP_NVML_LIBRARY", lib.as_path()),
        ("STANDIN_NVML_STATE", &tmp.join("nvml")),
    ];
    let mut args = vec!["--no-socket", "--device-glob", glob.as_str()];
    args.extend_from_slice(extra);
    let serve = Serve::start(tmp, &args, &env);
    (serve, lib, glob)
}

/// A site leaves out the metric families it does not read (the per-host series budget's knob): each goes
/// whole, the rest stays as it was, and what `prom:` readers and the alerts read cannot be left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_families_a_site_does_not_read_are_left_out_whole() {
    let dir = tempfile::tempdir().expect("tmp");
    let series = |m: &str| m.lines().filter(|l| !l.starts_with('#')).count();
    let all = Serve::start(
        dir.path(),
        &["--demo", "--hosts", "gpu-b", "--no-socket"],
        &[],
    );
    let (_, _, full) = get(&all.url("/metrics")).await;
    let lean = Serve::start(
        dir.path(),
        &[
            "--demo",
            "--hosts",
            "gpu-b",
            "--no-socket",
            "--metrics-leave-out",
            "DCGM_FI_PROF_,gpusweep_process,gpusweep_job",
        ],
        &[],
    );
    let (status, _, m) = get(&lean.url("/metrics")).await;
    assert_eq!(status, 200);
    for gone in ["DCGM_FI_PROF_", "gpusweep_process", "gpusweep_job"] {
        assert!(full.contains(gone), "the demo host has {gone}");
        assert!(
            !m.lines()
                .any(|l| l.starts_with(gone) || l.contains(&format!(" {gone}"))),
            "{gone} left in: {m}"
        );
    }
    for kept in [
        "DCGM_FI_DEV_FB_USED{",
        "gpusweep_gpu_clean{",
        "gpusweep_reading_timestamp_seconds",
    ] {
        assert!(m.contains(kept), "{kept}: {m}");
    }
    eprintln!(
        "metrics: one 8-GPU demo host, {} series; without the profiling, process and job families {}",
        series(&full),
        series(&m)
    );
    assert!(series(&m) < series(&full));
    let refused = gpusweep(dir.path())
        .args([
            "serve",
            "--demo",
            "--no-socket",
            "--metrics-leave-out",
            "DCGM_FI_DEV_FB",
        ])
        .output()
        .expect("serve");
    crate::support::exited(&refused, 2);
    assert!(
        text(&refused).contains("DCGM_FI_DEV_FB_USED"),
        "{}",
        text(&refused)
    );
}
