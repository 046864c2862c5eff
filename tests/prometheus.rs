//! A real Prometheus (Debian's `prometheus` package), started by the test on loopback, scraping three
//! `gpusweep serve --demo` instances and a dcgm-exporter-shaped target; then gpusweep reads the fleet back as
//! `prom:` hosts. What crosses Prometheus is exactly what dashboards and `prom:` clients see.

use std::io::{BufRead, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{await_cond, await_cond_every, free_port, gpusweep, gpusweep_via, text};
use std::sync::Arc;

/// A child killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `gpusweep serve --demo --hosts HOST` on a port of its own; returns it and its `127.0.0.1:PORT`.
fn serve(dir: &Path, host: &str, extra: &[&str]) -> (Proc, String) {
    serve_on(dir, host, "127.0.0.1", extra)
}

/// `gpusweep serve --demo --hosts HOST` on a port of its own at loopback address `ip`; returns it and its
/// `IP:PORT`.
fn serve_on(dir: &Path, host: &str, ip: &str, extra: &[&str]) -> (Proc, String) {
    // The fleet's key: the serve seals its summary, and every reader started in `dir` checks it.
    if !dir.join(crate::support::SEAL_KEY).exists() {
        crate::support::seal_key(dir);
    }
    let listen = format!("{ip}:0");
    let mut c = gpusweep(dir);
    c.args([
        "serve",
        "--demo",
        "--hosts",
        host,
        "--listen",
        &listen,
        "--interval",
        "200ms",
    ])
    .args(extra)
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let mut child = c.spawn().expect("serve");
    let (addr, err) = crate::support::serve_banner(&mut child);
    std::thread::spawn(move || for _ in err.lines() {});
    (Proc(child), addr)
}

/// What dcgm-exporter exposes for two GPUs of a node without gpusweep: GPU 0 idle, GPU 1 in use.
fn dcgm_exporter_shaped(listener: TcpListener) {
    const BODY: &str = "\
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-d0\",pci_bus_id=\"00000000:07:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"dcgm-node\"} 0
DCGM_FI_DEV_FB_USED{gpu=\"1\",UUID=\"GPU-d1\",pci_bus_id=\"00000000:0F:00.0\",device=\"nvidia1\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"dcgm-node\"} 1234
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu=\"0\",UUID=\"GPU-d0\",pci_bus_id=\"00000000:07:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"dcgm-node\"} 81000
DCGM_FI_DEV_FB_FREE{gpu=\"1\",UUID=\"GPU-d1\",pci_bus_id=\"00000000:0F:00.0\",device=\"nvidia1\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"dcgm-node\"} 79766
";
    answer_scrapes(listener, BODY.to_string());
}

/// Prometheus's HTTP API, called from this synchronous test through reqwest on a runtime of its own.
struct Http {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
}

impl Http {
    fn new() -> Http {
        Http {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime"),
            client: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("client"),
        }
    }
    /// GET: status and body; `None` when nothing answers.
    fn get(&self, url: &str, query: &[(&str, &str)]) -> Option<(u16, String)> {
        self.rt.block_on(async {
            let r = self.client.get(url).query(query).send().await.ok()?;
            let status = r.status().as_u16();
            Some((status, r.text().await.ok()?))
        })
    }
}

/// Equal as samples are: Prometheus sends whole numbers as they were written.
fn is(v: f64, want: f64) -> bool {
    (v - want).abs() < 1e-9
}

/// Prometheus's answer to an instant query: each sample's labels and value.
fn query(c: &Http, prom: &str, q: &str) -> Vec<(serde_json::Value, f64)> {
    let Some((200, body)) = c.get(&format!("{prom}/api/v1/query"), &[("query", q)]) else {
        return vec![];
    };
    let doc: serde_json::Value = serde_json::from_str(&body).expect("json");
    doc["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|s| {
            let value = s["value"][1]
                .as_str()
                .and_then(|v| v.parse().ok())
                .unwrap_or(f64::NAN);
            (s["metric"].clone(), value)
        })
        .collect()
}

fn await_query(
    c: &Http,
    prom: &str,
    q: &str,
    what: &str,
    ok: impl Fn(&[(serde_json::Value, f64)]) -> bool,
) -> Vec<(serde_json::Value, f64)> {
    let t = Instant::now();
    loop {
        let r = query(c, prom, q);
        if ok(&r) {
            return r;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}: {q} -> {r:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Wait until two targets' 8 GPUs each speak for `host` in Prometheus (its own serve and another).
fn await_two_voices(c: &Http, prom: &str, host: &str) {
    await_query(
        c,
        prom,
        &format!(r#"count(gpusweep_gpu_clean{{Hostname="{host}"}})"#),
        &format!("both voices for {host}"),
        |r| r.first().is_some_and(|(_, v)| is(*v, 16.0)),
    );
}

/// Stop a scrape target and wait until Prometheus reads it down (`up` 0).
fn stop_target(c: &Http, prom: &str, target: &mut Proc, addr: &str) {
    let _ = target.0.kill();
    let _ = target.0.wait();
    await_query(
        c,
        prom,
        &format!(r#"up{{instance="{addr}"}}"#),
        "the target down",
        |r| r.first().is_some_and(|(_, v)| is(*v, 0.0)),
    );
}

/// `snapshot --json` of `prom:URL` with `GPUSWEEP_TRACE=1`: the document and the trace (stderr and stdout,
/// each query's line naming it up to 200 characters).
fn traced_snapshot(dir: &Path, url: &str) -> (serde_json::Value, String) {
    let out = gpusweep(dir)
        .env("GPUSWEEP_TRACE", "1")
        .args(["snapshot", "--json", "--hosts", &format!("prom:{url}")])
        .output()
        .expect("snapshot");
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    (v, text(&out))
}

/// How many queries a trace shows answered that contain `q` (the trace names each query, cut at 200
/// characters).
fn times_asked(trace: &str, q: &str) -> usize {
    trace
        .lines()
        .filter(|l| l.contains("bytes in") && l.contains(q))
        .count()
}

fn snapshot_json(dir: &Path, spec: &str) -> serde_json::Value {
    let out = gpusweep(dir)
        .args(["snapshot", "--json", "--hosts", spec])
        .output()
        .expect("snapshot");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)))
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario: scrape, read back, sweep, read again, a target lost
fn prometheus_scrapes_dcgm_names_and_gpusweep_reads_the_fleet_back() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let sock = tmp.join("gpu-b.sock");
    let (_a, a) = serve(tmp, "gpu-a", &[]);
    let (_b, b) = serve(tmp, "gpu-b", &["--socket", sock.to_str().expect("utf-8")]);
    let (mut c_serve, c) = serve(tmp, "gpu-c", &[]);
    let dcgm = TcpListener::bind("127.0.0.1:0").expect("bind");
    let dcgm_addr = dcgm.local_addr().expect("addr").to_string();
    dcgm_exporter_shaped(dcgm);
    let port = free_port();
    std::fs::write(
        tmp.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n  - job_name: gpusweep\n    static_configs:\n      - targets: ['{a}', '{b}', '{c}']\n  - job_name: dcgm\n    static_configs:\n      - targets: ['{dcgm_addr}']\n"
        ),
    )
    .expect("config");
    let _prometheus = start_prometheus(tmp, port);
    let prom = format!("http://127.0.0.1:{port}");
    let http = Http::new();
    // Every target scraped: 3 serves x 8 GPUs, and dcgm-exporter's 2.
    await_query(
        &http,
        &prom,
        "count(gpusweep_gpu_clean)",
        "the serves' series",
        |r| r.first().is_some_and(|(_, v)| is(*v, 24.0)),
    );
    await_query(
        &http,
        &prom,
        "count(DCGM_FI_DEV_FB_USED)",
        "every FB_USED",
        |r| r.first().is_some_and(|(_, v)| is(*v, 26.0)),
    );
    // dcgm-exporter's names and labels, as Prometheus stored them.
    let r = query(
        &http,
        &prom,
        r#"DCGM_FI_DEV_FB_USED{Hostname="gpu-b",gpu="6"}"#,
    );
    assert_eq!(r.len(), 1, "{r:?}");
    let (labels, value) = &r[0];
    assert!(is(*value, 73126.0), "{value}");
    for k in [
        "UUID",
        "pci_bus_id",
        "device",
        "modelName",
        "Hostname",
        "gpu",
    ] {
        assert!(
            labels[k].as_str().is_some_and(|v| !v.is_empty()),
            "{k}: {labels}"
        );
    }
    assert_eq!(labels["device"], "nvidia6");
    assert_eq!(labels["modelName"], "NVIDIA H200");
    let r = query(
        &http,
        &prom,
        r#"gpusweep_unexplained_bytes{Hostname="gpu-b"}"#,
    );
    assert!(
        r.iter()
            .any(|(l, v)| l["kind"] == "ghost" && l["gpu"] == "7" && *v > 10e9),
        "{r:?}"
    );

    // gpu-a's EP8 warm-up, by phase; the lost-rank counter, parsed as the counter it is.
    await_query(
        &http,
        &prom,
        r#"gpusweep_job_phase{Hostname="gpu-a",job_id="sglang-ep8.service",phase="loading"} == 1"#,
        "gpu-a's job loading",
        |r| r.len() == 1,
    );
    await_query(
        &http,
        &prom,
        "count(gpusweep_job_lost_ranks_total)",
        "a lost-rank counter per serve",
        |r| r.first().is_some_and(|(_, v)| is(*v, 3.0)),
    );

    // gpusweep reads the fleet back: one host per Hostname, each with its own verdicts.
    let spec = format!("prom:{prom}");
    let doc = snapshot_json(tmp, &spec);
    let hosts = doc["hosts"].as_array().expect("hosts");
    let names: Vec<&str> = hosts.iter().filter_map(|h| h["host"].as_str()).collect();
    assert_eq!(names, ["dcgm-node", "gpu-a", "gpu-b", "gpu-c"], "{doc}");
    let host = |n: &str| hosts.iter().find(|h| h["host"] == n).expect("host").clone();
    let gb = host("gpu-b");
    assert_eq!(gb["source"], "prometheus");
    assert_eq!(
        gb["simulated"], true,
        "a demo serve says so through Prometheus: {gb}"
    );
    assert_eq!(gb["gpus"][6]["judged"], "in_use", "{gb}");
    assert_eq!(gb["gpus"][7]["judged"], "leak", "{gb}");
    assert_eq!(gb["gpus"][0]["judged"], "clean", "{gb}");
    assert_eq!(
        gb["gpus"][6]["uuid"]
            .as_str()
            .map(|u| u.starts_with("GPU-")),
        Some(true)
    );
    assert_eq!(gb["live_url"], format!("http://{b}"), "{gb}");
    let kinds = crate::support::finding_kinds(&gb);
    assert!(
        kinds.contains(&"ghost") && kinds.contains(&"zombie"),
        "{kinds:?}"
    );
    assert!(
        gb["missing_features"]
            .as_array()
            .is_some_and(|m| m.iter().any(|f| f == "actions"))
    );
    // The node with dcgm-exporter alone: memory, clean or in use, never a leak; its blind spot named.
    let dn = host("dcgm-node");
    assert_eq!(dn["simulated"], false, "{dn}");
    assert!(dn["gpus"][0]["judged"].is_null(), "{dn}");
    assert_eq!(dn["gpus"][1]["memory"]["used"], 1234_u64 * 1024 * 1024);
    assert!(dn["findings"].as_array().is_some_and(Vec::is_empty), "{dn}");
    assert!(
        dn["missing_features"]
            .as_array()
            .is_some_and(|m| m.iter().any(|f| f == "process_list"))
    );
    assert_eq!(dn["live_url"], "ssh://dcgm-node");
    // The table says the same.
    let out = gpusweep(tmp)
        .args(["snapshot", "--hosts", &spec])
        .output()
        .expect("snapshot");
    let said = text(&out);
    assert!(
        said.contains("== gpu-b (prometheus, DEMO: simulated)")
            && said.contains("leak")
            && said.contains("in use"),
        "{said}"
    );

    // wait over a selector: gpu-b's GPU 0 is clean, GPU 7 is not; a kill through Prometheus is refused.
    let only_b = format!("prom:{prom}?{{Hostname=\"gpu-b\"}}");
    let out = gpusweep(tmp)
        .args(["wait", "--hosts", &only_b, "--gpus", "0", "--timeout", "5s"])
        .output()
        .expect("wait");
    crate::support::exited(&out, 0);
    let out = gpusweep(tmp)
        .args(["wait", "--hosts", &only_b, "--gpus", "7", "--timeout", "2s"])
        .output()
        .expect("wait");
    crate::support::exited(&out, 1);
    let out = gpusweep(tmp)
        .args(["kill", "--hosts", &only_b, "7391", "--yes"])
        .output()
        .expect("kill");
    crate::support::exited(&out, 2);
    assert!(text(&out).contains("read-only"), "{}", text(&out));

    // A sweep of gpu-b (through its serve's socket) turns gpusweep_gpu_clean to 1 in Prometheus, and the
    // prom: view follows.
    crate::support::sweep_through(tmp, sock.to_str().expect("utf-8"));
    await_query(
        &http,
        &prom,
        r#"min(gpusweep_gpu_clean{Hostname="gpu-b"})"#,
        "gpu-b clean in Prometheus",
        |r| r.first().is_some_and(|(_, v)| is(*v, 1.0)),
    );
    let out = gpusweep(tmp)
        .args(["wait", "--hosts", &only_b, "--timeout", "10s"])
        .output()
        .expect("wait");
    crate::support::exited(&out, 0);
    let r = query(
        &http,
        &prom,
        r#"gpusweep_time_to_clean_seconds_count{Hostname="gpu-b",after="signal"}"#,
    );
    assert!(r.first().is_some_and(|(_, v)| *v >= 2.0), "{r:?}");

    // A target Prometheus can no longer scrape is not clean: its host reads "cannot scrape", wait exits 2.
    stop_target(&http, &prom, &mut c_serve, &c);
    let out = gpusweep(tmp)
        .args([
            "wait",
            "--hosts",
            &format!("prom:{prom}?{{job=\"gpusweep\"}}"),
            "--timeout",
            "3s",
        ])
        .output()
        .expect("wait");
    let said = crate::support::exited(&out, 2);
    assert!(
        said.contains("gpu-c") && said.contains("cannot scrape"),
        "{said}"
    );
}

/// A scrape target that serves `body` as its metrics, whatever it is asked.
fn static_target(body: String) -> String {
    static_target_on("127.0.0.1", body)
}

/// A scrape target at loopback address `ip` that serves `body` as its metrics, whatever it is asked.
fn static_target_on(ip: &str, body: String) -> String {
    let listener = TcpListener::bind((ip, 0)).expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    answer_scrapes(listener, body);
    addr
}

/// Every scrape on `listener` answered with `body`, in Prometheus's text format.
fn answer_scrapes(listener: TcpListener, body: String) {
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut s = stream;
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
}

/// Prometheus's configuration: `jobs` (name, targets) scraped every second; a job whose name starts with
/// `honor` keeps its targets' own `job` and `instance` labels (`honor_labels: true`).
fn write_config(tmp: &Path, jobs: &[(&str, Vec<String>)]) {
    let mut cfg =
        String::from("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n");
    for (name, targets) in jobs {
        let t: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let honor = if name.starts_with("honor") {
            "    honor_labels: true\n"
        } else {
            ""
        };
        cfg.push_str(&format!(
            "  - job_name: {name}\n{honor}    static_configs:\n      - targets: [{}]\n",
            t.join(", ")
        ));
    }
    std::fs::write(tmp.join("prometheus.yml"), cfg).expect("config");
}

/// Make Prometheus read its configuration again (SIGHUP).
fn reload(p: &Proc) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(p.0.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).expect("SIGHUP");
}

/// Debian's Prometheus on `127.0.0.1:port`, as `tmp/prometheus.yml` says, its data in `tmp/data`.
fn start_prometheus(tmp: &Path, port: u16) -> Proc {
    Proc(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                tmp.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                tmp.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian's prometheus package)"),
    )
}

/// Start Prometheus scraping `jobs` (name, targets) every second; its base URL. A job whose name starts with
/// `honor` keeps its targets' own `instance` labels (`honor_labels: true`), as some fleets configure it.
fn prometheus(tmp: &Path, jobs: &[(&str, Vec<String>)]) -> (Proc, String) {
    let port = free_port();
    write_config(tmp, jobs);
    let p = start_prometheus(tmp, port);
    (p, format!("http://127.0.0.1:{port}"))
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario: an honest serve, a spoofer beside it, a liar alone
fn a_scrape_target_speaks_only_for_itself_and_a_clean_that_contradicts_its_bytes_is_not_clean() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    // gpu-b's own serve: 71 GiB held on GPU 6, a 10 GiB ghost on GPU 7.
    let (_b, b) = serve(tmp, "gpu-b", &[]);
    // Another target in the same Prometheus says gpu-b's GPUs are clean.
    let mut spoof = String::from("# TYPE gpusweep_gpu_clean gauge\n");
    for g in 0..8 {
        spoof.push_str(&format!(
            "gpusweep_gpu_clean{{gpu=\"{g}\",Hostname=\"gpu-b\"}} 1\n"
        ));
    }
    let spoofer = static_target(spoof);
    // A lone target whose "clean" contradicts the memory it reports in use.
    let liar = static_target(
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n\
         DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-l0\",Hostname=\"liar\"} 70000\n\
         # TYPE gpusweep_gpu_clean gauge\n\
         gpusweep_gpu_clean{gpu=\"0\",UUID=\"GPU-l0\",Hostname=\"liar\"} 1\n"
            .to_string(),
    );
    let (_prometheus, prom) = prometheus(
        tmp,
        &[
            ("gpusweep", vec![b.clone()]),
            ("other", vec![spoofer.clone(), liar.clone()]),
        ],
    );
    let http = Http::new();
    await_two_voices(&http, &prom, "gpu-b");
    await_query(
        &http,
        &prom,
        r#"DCGM_FI_DEV_FB_USED{Hostname="liar"}"#,
        "the liar's bytes",
        |r| !r.is_empty(),
    );
    // Two voices for one host: a conflict, named with both targets, never clean: wait exits 2, not 0.
    let only_b = format!("prom:{prom}?{{Hostname=\"gpu-b\"}}");
    let out = gpusweep(tmp)
        .args(["wait", "--hosts", &only_b, "--timeout", "3s"])
        .output()
        .expect("wait");
    let said = crate::support::exited(&out, 2);
    assert!(
        said.contains(&b) && said.contains(&spoofer) && said.contains("gpu-b"),
        "both targets named: {said}"
    );
    let doc = snapshot_json(tmp, &only_b);
    let gb = &doc["hosts"][0];
    assert_eq!(gb["host"], "gpu-b", "{doc}");
    assert!(
        gb["error"].as_str().is_some_and(|e| e.contains("job=")),
        "the conflict says how to narrow it: {doc}"
    );
    // Narrowed to the serve's own job, gpu-b reads as its serve says: GPU 7 leaking, never clean.
    let narrowed = format!("prom:{prom}?{{job=\"gpusweep\"}}");
    let doc = snapshot_json(tmp, &narrowed);
    let gb = &doc["hosts"][0];
    assert_eq!(gb["error"], serde_json::Value::Null, "{doc}");
    assert_eq!(gb["gpus"][7]["judged"], "leak", "{doc}");
    assert_eq!(gb["gpus"][7]["state"], "leak", "{doc}");
    let out = gpusweep(tmp)
        .args(["wait", "--hosts", &narrowed, "--timeout", "2s"])
        .output()
        .expect("wait");
    crate::support::exited(&out, 1);
    // The liar: gpusweep series without its serve's seal are no one's word (and 70000 MiB used is not
    // clean, whatever it says).
    let only_liar = format!("prom:{prom}?{{Hostname=\"liar\"}}");
    let doc = snapshot_json(tmp, &only_liar);
    let l = &doc["hosts"][0];
    assert_eq!(l["host"], "liar", "{doc}");
    assert!(
        l["error"]
            .as_str()
            .is_some_and(|e| e.contains("no sealed summary")),
        "{doc}"
    );
    assert!(
        l["gpus"]
            .as_array()
            .is_none_or(|g| g.iter().all(|g| g["state"] != "clean")),
        "{doc}"
    );
    let out = gpusweep(tmp)
        .args(["wait", "--hosts", &only_liar, "--timeout", "2s"])
        .output()
        .expect("wait");
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
}

/// What an impostor exports for `host`: eight clean GPUs, and a serve's info so that its address would be
/// where the host is opened live.
fn impostor_of(host: &str) -> String {
    let mut body = String::from("# TYPE DCGM_FI_DEV_FB_USED gauge\n");
    for g in 0..8 {
        body.push_str(&format!(
            "DCGM_FI_DEV_FB_USED{{gpu=\"{g}\",Hostname=\"{host}\"}} 0\n"
        ));
    }
    body.push_str("# TYPE gpusweep_gpu_clean gauge\n");
    for g in 0..8 {
        body.push_str(&format!(
            "gpusweep_gpu_clean{{gpu=\"{g}\",Hostname=\"{host}\"}} 1\n"
        ));
    }
    body.push_str(&format!(
        "# TYPE gpusweep_serve_info gauge\n\
         gpusweep_serve_info{{Hostname=\"{host}\",scheme=\"http\",api_path=\"\",version=\"1\"}} 1\n"
    ));
    body
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario: two hosts, each with an impostor, their own targets stopped
fn while_a_hosts_own_target_is_silent_nothing_else_speaks_for_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    // Two hosts whose GPUs hold memory, each beside an impostor at 127.0.0.2: gpu-b's own address sorts
    // before the impostor's, gpu-c's after it (the order a remembered instance could depend on).
    let (mut own_b, b) = serve_on(tmp, "gpu-b", "127.0.0.1", &[]);
    let (mut own_c, c) = serve_on(tmp, "gpu-c", "127.0.0.3", &[]);
    let fake_b = static_target_on("127.0.0.2", impostor_of("gpu-b"));
    let fake_c = static_target_on("127.0.0.2", impostor_of("gpu-c"));
    let (_prometheus, prom) = prometheus(
        tmp,
        &[
            ("gpusweep", vec![b.clone(), c.clone()]),
            ("other", vec![fake_b.clone(), fake_c.clone()]),
        ],
    );
    let http = Http::new();
    for host in ["gpu-b", "gpu-c"] {
        await_two_voices(&http, &prom, host);
    }
    let spec = |host: &str| format!("prom:{prom}?{{Hostname=\"{host}\"}}");
    let wait = |host: &str| {
        let out = gpusweep(tmp)
            .args(["wait", "--hosts", &spec(host), "--timeout", "3s"])
            .output()
            .expect("wait");
        (out.status.code(), text(&out))
    };
    // Both voices heard: a conflict, never clean.
    for host in ["gpu-b", "gpu-c"] {
        let (code, said) = wait(host);
        assert_eq!(code, Some(2), "{host} while both answer: {said}");
    }
    // The hosts' own targets fall silent; the impostors still answer.
    stop_target(&http, &prom, &mut own_b, &b);
    stop_target(&http, &prom, &mut own_c, &c);
    for (host, own, fake) in [("gpu-b", &b, &fake_b), ("gpu-c", &c, &fake_c)] {
        let (code, said) = wait(host);
        assert_eq!(
            code,
            Some(2),
            "{host}'s own target is silent: nothing else speaks for it: {said}"
        );
        let doc = snapshot_json(tmp, &spec(host));
        let h = &doc["hosts"][0];
        assert_eq!(h["host"], host, "{doc}");
        assert!(
            h["error"]
                .as_str()
                .is_some_and(|e| e.contains(own.as_str())),
            "the error names the host's own target: {doc}"
        );
        assert!(
            !h["live_url"]
                .as_str()
                .is_some_and(|u| u.contains(fake.as_str())),
            "the impostor's address is never where the host is opened: {doc}"
        );
        assert!(
            h["gpus"]
                .as_array()
                .is_none_or(|g| g.iter().all(|g| g["state"] != "clean")),
            "no GPU of a silent host reads clean: {doc}"
        );
    }
    // And the whole fleet at once (no narrowing by name): the same.
    let out = gpusweep(tmp)
        .args([
            "wait",
            "--hosts",
            &format!("prom:{prom}"),
            "--timeout",
            "3s",
        ])
        .output()
        .expect("wait");
    crate::support::exited(&out, 2);
}

/// The same with what the lookback forgets and what `honor_labels` lets a target say. gpu-b's own target
/// has been down longer than the lookback (3 s here, 10 minutes by default): Prometheus still scrapes it, so
/// it is still gpu-b's, and an impostor answering alone is a conflict, never a clean. gpu-c's own target is
/// removed from Prometheus's configuration while a forger in an `honor_labels` job goes on exporting series
/// under that target's `job` and `instance`: Prometheus scrapes no such target (no `up`), so they are no
/// one's word.
#[test]
#[allow(clippy::too_many_lines)] // one Prometheus: a long silence, then a reload
fn a_silence_past_the_lookback_and_a_forged_target_are_never_a_voice() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let (mut own_b, b) = serve_on(tmp, "gpu-b", "127.0.0.1", &[]);
    let fake_b = static_target_on("127.0.0.2", impostor_of("gpu-b"));
    let (_own_c, c) = serve_on(tmp, "gpu-c", "127.0.0.3", &[]);
    // The forger: gpu-c's series, clean, labelled as gpu-c's own target.
    let forged = impostor_of("gpu-c").replace(
        "Hostname=\"gpu-c\"",
        &format!("Hostname=\"gpu-c\",job=\"gpusweep\",instance=\"{c}\""),
    );
    let forger = static_target_on("127.0.0.2", forged);
    let jobs = |with_c: bool| {
        let mut own = vec![b.clone()];
        if with_c {
            own.push(c.clone());
        }
        vec![
            ("gpusweep", own),
            ("other", vec![fake_b.clone()]),
            ("honoring", vec![forger.clone()]),
        ]
    };
    let (prometheus, prom) = prometheus(tmp, &jobs(true));
    let http = Http::new();
    await_two_voices(&http, &prom, "gpu-b");
    let wait = |host: &str| {
        let out = gpusweep(tmp)
            .env("GPUSWEEP_PROM_LOOKBACK", "3s")
            .args([
                "wait",
                "--hosts",
                &format!("prom:{prom}?{{Hostname=\"{host}\"}}"),
                "--timeout",
                "3s",
            ])
            .output()
            .expect("wait");
        (out.status.code(), text(&out))
    };
    // gpu-b's own target falls silent, and stays so past the lookback.
    stop_target(&http, &prom, &mut own_b, &b);
    await_query(
        &http,
        &prom,
        &format!(r#"last_over_time(DCGM_FI_DEV_FB_USED{{instance="{b}"}}[3s])"#),
        "gpu-b's series older than the lookback",
        <[_]>::is_empty,
    );
    let (code, said) = wait("gpu-b");
    assert_eq!(
        code,
        Some(2),
        "silent past the lookback, still gpu-b's own: {said}"
    );
    assert!(said.contains(&b) && said.contains(&fake_b), "{said}");
    // gpu-c's own target is taken out of Prometheus's configuration; the forger goes on.
    write_config(tmp, &jobs(false));
    reload(&prometheus);
    await_query(
        &http,
        &prom,
        &format!(r#"up{{instance="{c}",job="gpusweep"}}"#),
        "gpu-c's own target no longer scraped",
        <[_]>::is_empty,
    );
    await_query(
        &http,
        &prom,
        r#"gpusweep_gpu_clean{Hostname="gpu-c"}"#,
        "the forger's series",
        |r| !r.is_empty(),
    );
    let (code, said) = wait("gpu-c");
    assert_eq!(
        code,
        Some(2),
        "a target Prometheus does not scrape is no one's word: {said}"
    );
    assert!(said.contains("does not scrape"), "{said}");
}

#[test]
fn open_live_goes_only_to_a_scraped_target_and_never_takes_a_user_or_port_from_a_label() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    // A target in a job that honours its labels names another address as its instance: the token must not go
    // there. Another names its host `root@127.0.0.1:2222`: SSH must not be opened as that user to that port.
    let forged = static_target(
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n\
         DCGM_FI_DEV_FB_USED{gpu=\"0\",Hostname=\"forger\",instance=\"127.0.0.1:1\"} 0\n\
         # TYPE gpusweep_serve_info gauge\n\
         gpusweep_serve_info{Hostname=\"forger\",instance=\"127.0.0.1:1\",scheme=\"http\",api_path=\"\",version=\"1\"} 1\n"
            .to_string(),
    );
    let userport = static_target(
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n\
         DCGM_FI_DEV_FB_USED{gpu=\"0\",Hostname=\"root@127.0.0.1:2222\"} 0\n"
            .to_string(),
    );
    // An honest serve's own target, for contrast: opened live at the address Prometheus scrapes.
    let (_a, a) = serve(tmp, "gpu-a", &[]);
    let (_prometheus, prom) = prometheus(
        tmp,
        &[
            ("honoring", vec![forged.clone()]),
            ("plain", vec![userport, a.clone()]),
        ],
    );
    let http = Http::new();
    for (q, what) in [
        (r#"DCGM_FI_DEV_FB_USED{Hostname="forger"}"#, "the forger"),
        (
            r#"DCGM_FI_DEV_FB_USED{Hostname="root@127.0.0.1:2222"}"#,
            "the user@port name",
        ),
        (r#"gpusweep_serve_info{Hostname="gpu-a"}"#, "gpu-a's serve"),
    ] {
        await_query(&http, &prom, q, what, |r| !r.is_empty());
    }
    let doc = snapshot_json(tmp, &format!("prom:{prom}"));
    let hosts = doc["hosts"].as_array().expect("hosts");
    let host = |n: &str| hosts.iter().find(|h| h["host"] == n).expect("host").clone();
    let f = host("forger");
    assert!(
        !f["live_url"]
            .as_str()
            .is_some_and(|u| u.contains("127.0.0.1:1")),
        "a label's address is not where the token goes: {f}"
    );
    // Its series name a target Prometheus does not scrape (the address it gave itself): no one's word.
    assert!(
        f["error"]
            .as_str()
            .is_some_and(|e| e.contains("does not scrape")),
        "{f}"
    );
    let u = host("root@127.0.0.1:2222");
    assert!(u["live_url"].is_null(), "no user or port from a label: {u}");
    // Narrowed by a label only the data carries, the honest serve is still opened at its own target.
    let doc = snapshot_json(tmp, &format!("prom:{prom}?{{Hostname=\"gpu-a\"}}"));
    assert_eq!(doc["hosts"][0]["live_url"], format!("http://{a}"), "{doc}");
}

#[test]
fn a_prometheus_answer_past_the_limit_is_an_error_not_a_memory_balloon() {
    let dir = tempfile::tempdir().expect("tmp");
    // A "Prometheus" whose answer never ends: the client stops at its limit and says so.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = stream;
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{{\"status\":\"success\",\"data\":{{\"resultType\":\"vector\",\"result\":["
                );
                let chunk = "{\"metric\":{\"Hostname\":\"n\"},\"value\":[1,\"1\"]},".repeat(20_000);
                while s.write_all(chunk.as_bytes()).is_ok() {}
            });
        }
    });
    let out = gpusweep(dir.path())
        .args(["snapshot", "--json", "--hosts", &format!("prom:{url}")])
        .output()
        .expect("snapshot");
    let t = crate::support::exited(&out, 2);
    assert!(t.contains("larger than") && t.contains("MiB"), "{t}");
}

/// Run the program after it and print its peak resident set (KiB) as the last line of stderr.
const PEAK_RSS: &str = "import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True)
sys.stdout.buffer.write(r.stdout); sys.stderr.buffer.write(r.stderr)
print('peak_rss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(r.returncode)";

#[test]
fn answers_of_tiny_samples_cannot_make_the_client_hold_gigabytes() {
    let dir = tempfile::tempdir().expect("tmp");
    // A "Prometheus" that knows one host and answers every other query with 40 MiB of tiny samples for it
    // (900,000 of them): within the size of an answer, ten times that once parsed.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let sample = "{\"metric\":{\"Hostname\":\"n\",\"gpu\":\"0\"},\"value\":[1,\"1\"]},";
    let many: Arc<str> = format!(
        "{{\"status\":\"success\",\"data\":{{\"resultType\":\"vector\",\"result\":[{}{}]}}}}",
        sample.repeat(40 * 1024 * 1024 / sample.len()),
        "{\"metric\":{},\"value\":[1,\"1\"]}"
    )
    .into();
    let discovery: Arc<str> = "{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":[{\"metric\":{\"Hostname\":\"n\",\"instance\":\"n:9400\"},\"value\":[1,\"1\"]}]}}".into();
    fake_prometheus(listener, discovery, many);
    let out = gpusweep_via(dir.path(), &["/usr/bin/python3", "-c", PEAK_RSS])
        .args(["snapshot", "--json", "--hosts", &format!("prom:{url}")])
        .output()
        .expect("snapshot");
    let t = crate::support::exited(&out, 2);
    // Whichever limit is met first: the series of one answer, or what the queries asked together answer.
    assert!(
        t.contains("series in one answer")
            || t.contains("MiB in all to the queries asked together"),
        "{t}"
    );
    let peak_kib: u64 = t
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("peak_rss_kib ")?.trim().parse().ok())
        .expect("the peak");
    // Without the cap on series, four such answers parsed would be gigabytes. 292 MiB measured with
    // mimalloc since the queries asked together at start share one limit (569-692 MiB when each of the
    // three kept its own).
    assert!(
        peak_kib < 500 * 1024,
        "the client held {} MiB for answers of 40 MiB",
        peak_kib / 1024
    );
}

/// What a dcgm-exporter of the new label spelling (`hostname`, after its PR #655) exposes for one GPU of a
/// node without gpusweep: its default fields, as recorded in the exposition format.
const DCGM_NEW_SPELLING: &str = "\
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"GPU-n0\",pci_bus_id=\"00000000:07:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",hostname=\"new-node\",DCGM_FI_DRIVER_VERSION=\"580.105.08\"} 33
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu=\"0\",UUID=\"GPU-n0\",pci_bus_id=\"00000000:07:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",hostname=\"new-node\",DCGM_FI_DRIVER_VERSION=\"580.105.08\"} 71.5
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-n0\",pci_bus_id=\"00000000:07:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",hostname=\"new-node\",DCGM_FI_DRIVER_VERSION=\"580.105.08\"} 0
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu=\"0\",UUID=\"GPU-n0\",pci_bus_id=\"00000000:07:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",hostname=\"new-node\",DCGM_FI_DRIVER_VERSION=\"580.105.08\"} 81000
";

/// Grafana's value of a multi-value variable set to All (no `allValue`): every value, as one regex.
fn all_of(values: &[(serde_json::Value, f64)], label: &str) -> String {
    let mut v: Vec<String> = values
        .iter()
        .filter_map(|(m, _)| m[label].as_str().map(str::to_string))
        .collect();
    v.sort();
    v.dedup();
    v.iter()
        .map(|s| s.replace('.', "\\\\.").replace(':', "\\\\:"))
        .collect::<Vec<_>>()
        .join("|")
}

#[test]
fn nvidias_dcgm_exporter_dashboard_shows_data_in_every_panel() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let (_serve, gpusweep_at) = serve(tmp, "gpu-a,gpu-b", &[]);
    let newer = static_target(DCGM_NEW_SPELLING.to_string());
    let (_prom, prom) = prometheus(
        tmp,
        &[
            ("gpusweep", vec![gpusweep_at.clone()]),
            ("dcgm", vec![newer.clone()]),
        ],
    );
    let http = Http::new();
    // The dashboard's two variables, as Grafana asks for them: label_values(DCGM_FI_DEV_GPU_TEMP, instance)
    // and label_values(DCGM_FI_DEV_GPU_TEMP, gpu), each set to All.
    let instances = await_query(
        &http,
        &prom,
        "group by (instance) (DCGM_FI_DEV_GPU_TEMP)",
        "both targets' temperatures",
        |r| r.len() == 2,
    );
    assert!(
        instances
            .iter()
            .any(|(m, _)| m["instance"] == gpusweep_at.as_str()),
        "gpusweep's target is in the dashboard's instance list: {instances:?}"
    );
    let instance = all_of(&instances, "instance");
    let gpus = query(&http, &prom, "group by (gpu) (DCGM_FI_DEV_GPU_TEMP)");
    let gpu = all_of(&gpus, "gpu");
    let sel = format!("{{instance=~\"{instance}\", gpu=~\"{gpu}\"}}");
    // Every panel of NVIDIA's "NVIDIA DCGM Exporter Dashboard" (grafana/dcgm-exporter-dashboard.json of
    // dcgm-exporter 4.5.3-4.8.2, version 1), with the variables resolved.
    let panels = [
        ("GPU Temperature", format!("DCGM_FI_DEV_GPU_TEMP{sel}")),
        ("GPU Avg. Temp", format!("avg(DCGM_FI_DEV_GPU_TEMP{sel})")),
        ("GPU Power Usage", format!("DCGM_FI_DEV_POWER_USAGE{sel}")),
        (
            "GPU Power Total",
            format!("sum(DCGM_FI_DEV_POWER_USAGE{sel})"),
        ),
        (
            "GPU SM Clocks",
            format!("DCGM_FI_DEV_SM_CLOCK{sel} * 1000000"),
        ),
        ("GPU Utilization", format!("DCGM_FI_DEV_GPU_UTIL{sel}")),
        (
            "GPU Framebuffer Mem Used",
            format!("DCGM_FI_DEV_FB_USED{sel}"),
        ),
        (
            "Tensor Core Utilization",
            format!("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{sel}"),
        ),
    ];
    for (title, expr) in &panels {
        let r = await_query(&http, &prom, expr, title, |r| !r.is_empty());
        assert!(r.iter().all(|(_, v)| v.is_finite()), "{title}: {r:?}");
    }
    // gpusweep's series carry both spellings of the host and the driver's version.
    let temp = query(
        &http,
        &prom,
        &format!("DCGM_FI_DEV_GPU_TEMP{{instance=\"{gpusweep_at}\"}}"),
    );
    assert_eq!(temp.len(), 16, "8 GPUs of gpu-a and gpu-b: {temp:?}");
    for (m, _) in &temp {
        assert_eq!(m["Hostname"], m["hostname"], "{m}");
        assert!(
            m["DCGM_FI_DRIVER_VERSION"]
                .as_str()
                .is_some_and(|v| !v.is_empty()),
            "{m}"
        );
    }
    reads_both_spellings(tmp, &http, &prom);
}

/// gpusweep's prom: reader reads both kinds of host: its own serve's, and a newer exporter's by `hostname`.
fn reads_both_spellings(tmp: &Path, http: &Http, prom: &str) {
    await_query(
        http,
        prom,
        "DCGM_FI_DEV_FB_USED",
        "every host's memory",
        |r| r.len() == 17,
    );
    let doc = snapshot_json(tmp, &format!("prom:{prom}"));
    let hosts = crate::support::host_names(&doc);
    assert_eq!(hosts, ["gpu-a", "gpu-b", "new-node"], "{doc}");
    let new_node = &doc["hosts"][2];
    assert_eq!(new_node["gpus"][0]["memory"]["used"], 0, "{new_node}");
    assert_eq!(new_node["gpus"][0]["uuid"], "GPU-n0", "{new_node}");
}

/// A "Prometheus" on `listener`: `discovery` answers the fleet's discovery query, nothing the query for
/// targets that are down, `rest` every other query.
fn fake_prometheus(listener: TcpListener, discovery: Arc<str>, rest: Arc<str>) {
    answer_queries(listener, move |req| {
        if hosts_query(req) {
            discovery.to_string()
        } else if down_query(req) {
            NO_SERIES.to_string()
        } else {
            rest.to_string()
        }
    });
}

/// An answer of Prometheus's API without a series.
pub(crate) const NO_SERIES: &str =
    r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;

/// Whether `req` (a request's head) asks the fleet's discovery query: the hosts seen lately.
pub(crate) fn hosts_query(req: &str) -> bool {
    req.contains("group+by+%28Hostname%2C+hostname%2C+job%2C+instance%29")
        && req.contains("%7Cgpusweep_reading_timestamp_seconds%22")
}

/// Whether `req` asks which targets are down (`up == 0`, alone or within a query).
fn down_query(req: &str) -> bool {
    req.contains("up") && req.contains("%3D%3D+0")
}

/// A "Prometheus" on `listener`: every query answered with what `answer` makes of its request's head, on a
/// thread of its own (an answer may wait for others).
pub(crate) fn answer_queries(
    listener: TcpListener,
    answer: impl Fn(&str) -> String + Send + Sync + 'static,
) {
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let answer = answer.clone();
            std::thread::spawn(move || {
                let mut s = stream;
                let Some(req) = crate::support::read_request(&mut s) else {
                    return;
                };
                let body = answer(&req);
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
}

#[test]
fn a_prometheus_that_names_more_hosts_than_a_client_reads_is_an_error() {
    let dir = tempfile::tempdir().expect("tmp");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let hosts: Vec<String> = (0..20_001)
        .map(|i| format!("{{\"metric\":{{\"Hostname\":\"n{i}\"}},\"value\":[1,\"1\"]}}"))
        .collect();
    let discovery: Arc<str> = format!(
        "{{\"status\":\"success\",\"data\":{{\"resultType\":\"vector\",\"result\":[{}]}}}}",
        hosts.join(",")
    )
    .into();
    let empty: Arc<str> = NO_SERIES.into();
    fake_prometheus(listener, discovery, empty);
    let out = gpusweep(dir.path())
        .args(["snapshot", "--json", "--hosts", &format!("prom:{url}")])
        .output()
        .expect("snapshot");
    let t = crate::support::exited(&out, 2);
    assert!(t.contains("20001 hosts, more than the 20000"), "{t}");
}

/// A poll glances at each host's `gpusweep_reading_revision` and reads again only the hosts whose revision
/// moved, named by `Hostname`: five quiet serves cost one read of their series, and a sweep of one of them
/// reaches the client through a read that names it alone.
#[test]
#[allow(clippy::too_many_lines)] // one scenario: five serves, a glance, a sweep, the narrowed read
fn a_poll_reads_again_only_the_hosts_whose_revision_moved() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let sock = tmp.join("gpu-b1.sock");
    let socket = ["--socket", sock.to_str().expect("utf-8")];
    let mut serves: Vec<(Proc, String)> = ["gpu-b1", "gpu-b2", "gpu-b3", "gpu-b4", "gpu-b5"]
        .into_iter()
        .map(|h| serve(tmp, h, if h == "gpu-b1" { &socket } else { &[] }))
        .collect();
    let targets = serves.iter().map(|(_, a)| a.clone()).collect();
    let (_prometheus, prom) = prometheus(tmp, &[("gpusweep", targets)]);
    let http = Http::new();
    await_query(
        &http,
        &prom,
        "count(gpusweep_reading_revision)",
        "every serve's revision",
        |r| r.first().is_some_and(|(_, v)| is(*v, 5.0)),
    );
    let trace = tmp.join("trace.txt");
    let events = tmp.join("events.jsonl");
    let mut wait = Proc(
        gpusweep(tmp)
            .env("GPUSWEEP_TRACE", "1")
            .args([
                "wait",
                "--hosts",
                &format!("prom:{prom}"),
                "--timeout",
                "60s",
            ])
            .arg("--events")
            .arg(&events)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&trace).expect("trace"))
            .spawn()
            .expect("wait"),
    );
    let read = || std::fs::read_to_string(&trace).unwrap_or_default();
    let glances = |t: &str| {
        t.lines()
            .filter(|l| l.contains("bytes in") && l.contains("(gpusweep_reading_revision{})"))
            .count()
    };
    // The first poll reads everything; the next ones only glance, nothing having moved.
    await_cond("three glances", 30, || glances(&read()) >= 3);
    let out = gpusweep(tmp)
        .args([
            "sweep",
            "--hosts",
            &format!("unix:{}", sock.display()),
            "--yes",
        ])
        .args(["--grace", "1s", "--timeout", "20s"])
        .output()
        .expect("sweep");
    crate::support::exited(&out, 0);
    // gpu-b1's GPU 7 turns clean in the client, read through Prometheus.
    await_cond("gpu-b1's GPU 7 clean through prom:", 30, || {
        std::fs::read_to_string(&events)
            .unwrap_or_default()
            .lines()
            .any(|l| {
                l.contains(r#""event":"gpu_clean""#)
                    && l.contains(r#""host":"gpu-b1""#)
                    && l.contains(r#""gpu":7"#)
            })
    });
    let t = read();
    assert_eq!(
        times_asked(&t, "(gpusweep_gpu_clean{})"),
        1,
        "every host's series read once, at the first poll:\n{t}"
    );
    assert!(
        times_asked(&t, r#"gpusweep_gpu_clean{Hostname=~"gpu-b1"}"#) >= 1,
        "gpu-b1 read again alone after its sweep:\n{t}"
    );
    // A host gone for good (its serve killed) costs one whole read, when it vanishes, not one every poll.
    let (gone, addr) = &mut serves[4];
    stop_target(&http, &prom, gone, addr);
    let after = glances(&read());
    await_cond("six glances more", 30, || glances(&read()) >= after + 6);
    let _ = wait.0.kill();
    let t = read();
    assert!(
        times_asked(&t, "(gpusweep_gpu_clean{})") <= 2,
        "a down host read at every poll:\n{t}"
    );
}

/// A MIG GPU as dcgm-exporter shapes it (one framebuffer series per instance, `GPU_I_PROFILE` and
/// `GPU_I_ID`) read back through Prometheus: the GPU's memory is the sum of its instances', not one of them.
#[test]
fn a_mig_gpus_instances_add_up_to_its_memory() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let series = |gi: u32, mib: u32| {
        format!(
            "DCGM_FI_DEV_FB_USED{{gpu=\"0\",UUID=\"GPU-m0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",GPU_I_PROFILE=\"1g.10gb\",GPU_I_ID=\"{gi}\",Hostname=\"mig-node\"}} {mib}\n"
        )
    };
    let body = format!(
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n{}{}DCGM_FI_DEV_FB_USED{{gpu=\"1\",UUID=\"GPU-m1\",device=\"nvidia1\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"mig-node\"}} 0\n",
        series(1, 1024),
        series(2, 2048)
    );
    let target = static_target(body);
    let (_prom, url) = prometheus(tmp, &[("mig", vec![target])]);
    let c = Http::new();
    await_query(
        &c,
        &url,
        "DCGM_FI_DEV_FB_USED",
        "the instances scraped",
        |r| r.len() == 3,
    );
    let v = snapshot_json(tmp, &format!("prom:{url}"));
    let host = v["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .find(|h| h["host"] == "mig-node")
        .unwrap_or_else(|| panic!("{v}"))
        .clone();
    let used = |i: usize| host["gpus"][i]["memory"]["used"].as_u64();
    assert_eq!(used(0), Some(3072 * 1024 * 1024), "{host}");
    assert_eq!(used(1), Some(0), "{host}");
}

/// An identity read is always followed by a read of every host's summary, so the two (and the glance) are
/// asked together: a first view waits for one round of queries, not three. This "Prometheus" answers discovery at
/// once and holds every other answer until it has been asked for identities, the glance and the whole read;
/// a client that waited for each answer before asking the next would only be answered at its patience's end.
#[test]
fn identities_the_glance_and_the_first_read_are_asked_together() {
    use std::sync::{Condvar, Mutex};
    let dir = tempfile::tempdir().expect("tmp");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    // Identities (by UUID), the glance (revisions), the first read (the summary's count of findings, whose
    // answer says no host has any, so no details follow): how many of each wait for
    // their answer now; and whether all three have waited at once (then none waits any longer).
    let waiting = Arc::new((Mutex::new(([0usize; 3], false)), Condvar::new()));
    let together = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let together_in = together.clone();
    answer_queries(listener, move |req| {
        if hosts_query(req) {
            return r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"Hostname":"n1","instance":"n1"},"value":[1,"1"]}]}}"#.to_string();
        }
        let kinds = [
            "UUID",
            "gpusweep_reading_revision",
            "gpusweep_host_findings",
        ]
        .map(|needle| !down_query(req) && req.contains(needle));
        if kinds.iter().any(|k| *k) {
            let (lock, cv) = &*waiting;
            let mut now = lock.lock().expect("lock");
            for (n, k) in now.0.iter_mut().zip(kinds) {
                *n += usize::from(k);
            }
            if !now.0.contains(&0) {
                now.1 = true;
                together_in.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            cv.notify_all();
            let (mut now, _) = cv
                .wait_timeout_while(now, Duration::from_secs(20), |n| !n.1)
                .expect("lock");
            for (n, k) in now.0.iter_mut().zip(kinds) {
                *n -= usize::from(k);
            }
        }
        NO_SERIES.to_string()
    });
    let out = gpusweep(dir.path())
        .args([
            "snapshot",
            "--json",
            "--connect-timeout",
            "60",
            "--hosts",
            &format!("prom:{url}"),
        ])
        .output()
        .expect("snapshot");
    let t = text(&out);
    assert!(
        together.load(std::sync::atomic::Ordering::SeqCst),
        "identities, the glance and the first read were not asked together: {t}"
    );
    // The one host has no series: unreadable, never clean.
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(crate::support::host_names(&v), ["n1"], "{t}");
    assert!(v["hosts"][0]["error"].is_string(), "{t}");
}

/// Every host's summary is read first (its memory and clean per GPU, whether its serve read every GPU, how
/// many findings it has); a host with findings has its details read after it, named alone. A quiet host
/// (gpu-a, warming up: in use, nothing found) costs no query of findings or unexplained bytes, and still
/// reads whole; the loud one (gpu-b, after a pkill) keeps every finding its serve reports.
#[test]
fn a_quiet_hosts_summary_is_its_reading_and_only_a_loud_hosts_details_are_read() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let (_a, a) = serve(tmp, "gpu-a1", &[]);
    let (_b, b) = serve(tmp, "gpu-b1", &[]);
    let (_prometheus, prom) = prometheus(tmp, &[("gpusweep", vec![a, b])]);
    await_query(
        &Http::new(),
        &prom,
        "count(gpusweep_host_findings) and count(gpusweep_gpu_clean) == 16",
        "both serves' summaries and GPUs",
        |r| r.first().is_some_and(|(_, v)| is(*v, 2.0)),
    );
    let (v, trace) = traced_snapshot(tmp, &prom);
    let asked = |q: &str| times_asked(&trace, q);
    assert_eq!(asked("(gpusweep_host_findings{})"), 1, "{trace}");
    assert_eq!(
        asked("(gpusweep_findings{})"),
        0,
        "a whole read of findings:\n{trace}"
    );
    assert_eq!(asked("(gpusweep_unexplained_bytes{})"), 0, "{trace}");
    for details in [
        "gpusweep_findings",
        "gpusweep_unexplained_bytes",
        "gpusweep_gpu_readable",
    ] {
        assert_eq!(
            asked(&format!(r#"({details}{{Hostname=~"gpu-b1"}})"#)),
            1,
            "gpu-b1's {details}, read by name alone:\n{trace}"
        );
    }
    // Its memory and clean came with the summary: not asked again.
    assert_eq!(asked("gpusweep_gpu_clean{Hostname"), 0, "{trace}");

    assert_eq!(crate::support::host_names(&v), ["gpu-a1", "gpu-b1"], "{v}");
    let quiet = &v["hosts"][0];
    assert!(quiet["error"].is_null(), "{quiet}");
    assert_eq!(quiet["gpus"].as_array().map(Vec::len), Some(8), "{quiet}");
    assert!(
        quiet["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .all(|g| g["memory"]["used"].is_u64() && g["judged"] == "in_use"),
        "gpu-a1 read whole from its summary: {quiet}"
    );
    assert!(crate::support::finding_kinds(quiet).is_empty(), "{quiet}");
    let kinds = crate::support::finding_kinds(&v["hosts"][1]);
    for k in [
        "ghost",
        "residual",
        "zombie",
        "shm_leftover",
        "orphaned_job",
    ] {
        assert!(kinds.contains(&k), "gpu-b1 lost {k}: {kinds:?}");
    }
}

/// The TUI's first view of a `prom:` fleet comes from each host's compact summary (`gpusweep_host_gpu_states`
/// and the rest: a few series a host where its per-GPU ones are hundreds): every GPU as its serve judged it,
/// the findings by kind, a clean GPU's bytes where the summary says they are 0 and no other bytes, no UUIDs;
/// the whole reading follows at the next poll. A summary's "clean" is still held to its bytes: a target whose
/// summary says a GPU is clean with 70000 MiB used on its clean GPUs is not clean in the first view either.
#[test]
#[allow(clippy::too_many_lines)] // one scenario: three hosts, each one's first view and whole reading
fn a_first_view_comes_from_each_hosts_summary_and_the_whole_reading_follows() {
    use gpusweep::runtime::{Judgement, fleet::HostEvent};
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let (_a, a) = serve(tmp, "gpu-a1", &[]);
    let (_b, b) = serve(tmp, "gpu-b1", &[]);
    let liar = static_target(
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n\
         DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-l0\",Hostname=\"liar\"} 70000\n\
         # TYPE gpusweep_gpu_clean gauge\n\
         gpusweep_gpu_clean{gpu=\"0\",UUID=\"GPU-l0\",Hostname=\"liar\"} 1\n\
         # TYPE gpusweep_host_gpu_states gauge\n\
         gpusweep_host_gpu_states{Hostname=\"liar\",state=\"clean\"} 1\n\
         # TYPE gpusweep_host_clean_memory_used_bytes gauge\n\
         gpusweep_host_clean_memory_used_bytes{Hostname=\"liar\"} 73400320000\n"
            .to_string(),
    );
    // "twin": a whole summary saying clean, and another target that names it only by a GPU's memory (not
    // GPU 0's): a second voice, so twin is never read, in the first view either.
    let twin = static_target(
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n\
         DCGM_FI_DEV_FB_USED{gpu=\"0\",Hostname=\"twin\"} 0\n\
         # TYPE gpusweep_host_gpu_states gauge\n\
         gpusweep_host_gpu_states{Hostname=\"twin\",state=\"clean\"} 1\n\
         # TYPE gpusweep_host_clean_memory_used_bytes gauge\n\
         gpusweep_host_clean_memory_used_bytes{Hostname=\"twin\"} 0\n"
            .to_string(),
    );
    let twin_too = static_target(
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n\
         DCGM_FI_DEV_FB_USED{gpu=\"1\",Hostname=\"twin\"} 9000\n"
            .to_string(),
    );
    let (_prometheus, prom) = prometheus(
        tmp,
        &[
            ("gpusweep", vec![a, b, liar, twin]),
            ("other", vec![twin_too]),
        ],
    );
    await_query(
        &Http::new(),
        &prom,
        "count(gpusweep_host_clean_memory_used_bytes) == 4 and count(gpusweep_gpu_clean) == 17 \
         and count(gpusweep_host_finding_kinds{Hostname=\"gpu-b1\"}) > 0 \
         and count(DCGM_FI_DEV_FB_USED{Hostname=\"twin\"}) == 2",
        "every host's summary and GPUs",
        |r| !r.is_empty(),
    );
    let specs = gpusweep::core::host::parse_specs(
        &[format!("prom:{prom}")],
        &std::collections::BTreeMap::new(),
    )
    .expect("specs");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // Each host's readings in order, until every host has been read whole (its GPUs' UUIDs known).
    let readings = rt.block_on(async {
        let mut opts = gpusweep::runtime::FleetOptions {
            quick_first_view: true,
            ..crate::remote::options(Duration::from_millis(500), &tmp.join("audit.jsonl"))
        };
        opts.http.seal_key_file = Some(tmp.join(crate::support::SEAL_KEY));
        let mut fleet = gpusweep::runtime::Fleet::start(&specs, &opts)
            .await
            .expect("fleet");
        let mut readings: std::collections::BTreeMap<String, Vec<serde_json::Value>> =
            std::collections::BTreeMap::new();
        let mut events: Vec<serde_json::Value> = Vec::new();
        let mut twin_down = Vec::new();
        let mut liar_down = Vec::new();
        let whole =
            |r: &[serde_json::Value]| r.last().is_some_and(|s| s["gpus"][0]["uuid"].is_string());
        let t = Instant::now();
        while liar_down.is_empty()
            || !["gpu-a1", "gpu-b1"]
                .iter()
                .all(|h| readings.get(*h).is_some_and(|r| whole(r)))
        {
            assert!(t.elapsed() < Duration::from_secs(60), "{readings:#?}");
            let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(5), fleet.recv()).await
            else {
                continue;
            };
            match ev {
                HostEvent::Update {
                    host,
                    update: Judgement::New(judged),
                } => {
                    let snap = serde_json::to_value(&*judged.snap).expect("json");
                    readings
                        .entry(fleet.label(host).to_string())
                        .or_default()
                        .push(snap);
                }
                HostEvent::Events { events: e, .. } => {
                    events.extend(e.iter().map(|e| serde_json::to_value(e).expect("json")));
                }
                HostEvent::Status {
                    host,
                    status: gpusweep::source::ConnStatus::Down(why),
                } if fleet.label(host) == "twin" => twin_down.push(why),
                HostEvent::Status {
                    host,
                    status: gpusweep::source::ConnStatus::Down(why),
                } if fleet.label(host) == "liar" => liar_down.push(why),
                _ => {}
            }
        }
        (readings, events, (twin_down, liar_down))
    });
    let (readings, events, (twin_down, liar_down)) = readings;
    assert!(!readings.contains_key("twin"), "{readings:#?}");
    // The liar's summary says clean with 70000 MiB on its clean GPUs, unsealed: no one's word, never shown.
    assert!(!readings.contains_key("liar"), "{readings:#?}");
    assert!(
        liar_down.first().is_some_and(|w| w.contains("no seal")),
        "{liar_down:?}"
    );
    assert!(
        twin_down
            .first()
            .is_some_and(|w| w.contains("2 scrape targets report host")),
        "{twin_down:?}"
    );
    // The first view says no finding's place, so the whole reading after it clears none and tells each
    // finding once, where it is: gpu-b1's ghost on its GPU.
    assert!(
        !events.iter().any(|e| e["event"] == "finding_cleared"),
        "{events:#?}"
    );
    let ghosts: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| {
            e["event"] == "finding_appeared" && e["kind"] == "ghost" && e["host"] == "gpu-b1"
        })
        .collect();
    assert!(
        ghosts.len() == 1 && ghosts[0]["gpu"].is_u64(),
        "{events:#?}"
    );
    let first = |h: &str| readings[h].first().cloned().expect("a first reading");
    let last = |h: &str| readings[h].last().cloned().expect("a whole reading");
    let states = |s: &serde_json::Value| -> Vec<String> {
        s["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .map(|g| g["state"].as_str().unwrap_or("").to_string())
            .collect()
    };
    for h in ["gpu-a1", "gpu-b1"] {
        let (quick, whole) = (first(h), last(h));
        assert!(quick["error"].is_null(), "{quick}");
        // The first view says what the whole reading says, GPU by GPU, without its UUIDs or other bytes.
        assert_eq!(states(&quick), states(&whole), "{h}: {quick}\n{whole}");
        assert_eq!(states(&quick).len(), 8, "{quick}");
        let blind = |s: &serde_json::Value| {
            s["missing_features"]
                .as_array()
                .is_some_and(|m| m.iter().any(|f| f == "gpu_detail"))
        };
        assert!(blind(&quick) && !blind(&whole), "{quick}\n{whole}");
        for g in quick["gpus"].as_array().expect("gpus") {
            assert!(g["uuid"].is_null(), "{h}: {g}");
            let clean = g["state"] == "clean";
            assert_eq!(g["memory"]["used"].is_null(), !clean, "{h}: {g}");
        }
        for g in whole["gpus"].as_array().expect("gpus") {
            assert!(g["memory"]["used"].is_u64(), "{h}: {g}");
        }
    }
    assert!(
        states(&first("gpu-a1")).iter().all(|s| s == "in_use"),
        "{}",
        first("gpu-a1")
    );
    let b_quick = first("gpu-b1");
    assert!(states(&b_quick).contains(&"leak".to_string()), "{b_quick}");
    let kinds = crate::support::finding_kinds(&b_quick);
    for k in ["ghost", "zombie", "shm_leftover", "orphaned_job"] {
        assert!(
            kinds.contains(&k),
            "gpu-b1's first view lost {k}: {kinds:?}"
        );
    }
}

/// Identities are read again once a minute (a GPU swapped, a serve moved, a second voice for a host), but a
/// host whose identities did not change is not read again for it, and the GPUs' sizes, fixed for a GPU's life,
/// are asked only of GPUs not seen before. At ten thousand hosts the whole read that followed each identity
/// read cost Prometheus most of what the client cost it; and then the identity read itself (every GPU's
/// series): a read again asks each host's identity digest first, and the GPUs only of hosts whose digest
/// moved. A serve-shaped target whose reading never changes (its revision and digest stay, its reading's
/// time moves): a watch of 70 s asks the digest twice, its GPUs' identities, summary and sizes once.
#[test]
fn identities_read_again_reread_no_host_whose_identities_held_nor_known_sizes() {
    let dir = tempfile::tempdir().expect("tmp");
    let (_prometheus, prom) = steady_prometheus(
        dir.path(),
        "count(gpusweep_gpu_clean) == 2 and count(DCGM_FI_DEV_FB_RESERVED) == 2",
    );
    let (out, trace) = traced_wait(dir.path(), &prom, "70s");
    let asked = |q: &str| times_asked(&trace, q);
    assert_eq!(
        asked("(gpusweep_host_identity_digest{})"),
        2,
        "the digest twice:\n{trace}"
    );
    assert_eq!(
        asked("UUID, modelName"),
        1,
        "the GPUs' identities once:\n{trace}"
    );
    assert_eq!(
        asked("(gpusweep_gpu_clean{})"),
        1,
        "its summary once:\n{trace}"
    );
    assert_eq!(
        asked("DCGM_FI_DEV_FB_RESERVED"),
        1,
        "the sizes once:\n{trace}"
    );
    read_throughout(&out, &trace);
}

/// A Prometheus that answers slowly (each answer held 0.4 s on its way, as a loaded server's) is asked less
/// often than the 1 s poll asks: its first read (a dozen such answers, more than the 2 s of answering the
/// client may spend at once) is followed by up to 30 s of quiet, and each glance after it likewise (its queries a
/// twentieth of the time at most); the host is still read. Every second before.
#[test]
fn a_slow_prometheus_is_asked_less_often_so_the_client_takes_a_twentieth_of_its_time() {
    let dir = tempfile::tempdir().expect("tmp");
    let (_prometheus, prom) = steady_prometheus(dir.path(), "count(gpusweep_gpu_clean) == 2");
    let slow = slow_way_to(&prom, Duration::from_millis(400));
    let (out, trace) = traced_wait(dir.path(), &slow, "20s");
    let glances = times_asked(&trace, "(gpusweep_reading_revision{})");
    assert!(
        (1..=3).contains(&glances),
        "{glances} glances in 20 s:\n{trace}"
    );
    read_throughout(&out, &trace);
}

/// A real Prometheus scraping one `steady_serve_target`, once `ready` (a query) has an answer: the process
/// and its URL.
fn steady_prometheus(tmp: &Path, ready: &str) -> (Proc, String) {
    let steady = steady_serve_target(tmp);
    let (prometheus, prom) = prometheus(tmp, &[("gpusweep", vec![steady])]);
    await_query(&Http::new(), &prom, ready, "the target's GPUs", |r| {
        !r.is_empty()
    });
    (prometheus, prom)
}

/// `wait` on the `prom:` fleet at `url` at a 1 s poll until `timeout`, traced: its output and its trace.
fn traced_wait(tmp: &Path, url: &str, timeout: &str) -> (std::process::Output, String) {
    let out = gpusweep(tmp)
        .env("GPUSWEEP_TRACE", "1")
        .args(["wait", "--hosts", &format!("prom:{url}")])
        .args(["--timeout", timeout, "--poll", "1s"])
        .output()
        .expect("wait");
    let trace = text(&out);
    (out, trace)
}

/// The steady host was read throughout, its GPU 1 in use at the end: the wait timed out, not unreadable.
fn read_throughout(out: &std::process::Output, trace: &str) {
    assert_eq!(out.status.code(), Some(1), "{trace}");
    assert!(trace.contains("steady: GPU 1"), "{trace}");
}

/// A way to the Prometheus at `to` on which every answer is held `delay` first: its URL.
fn slow_way_to(to: &str, delay: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let to = to.to_string();
    answer_queries(listener, move |req| {
        let path = req.split_whitespace().nth(1).unwrap_or("/");
        let answer = Http::new().get(&format!("{to}{path}"), &[]);
        // The load being shown, not a wait for anything.
        std::thread::sleep(delay);
        answer.map_or_else(|| NO_SERIES.to_string(), |(_, body)| body)
    });
    url
}

/// A scrape target shaped as a serve of host `steady` (two GPUs, GPU 1 in use, nothing found) whose reading
/// never changes: the same revision at every scrape, its reading's time the scrape's.
fn steady_serve_target(tmp: &Path) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    // Sealed with the test's fleet key, as a serve seals: GPU 0 clean, GPU 1 in use.
    let key =
        gpusweep::core::seal::SealKey::from_file(&crate::support::seal_key(tmp)).expect("key");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut s = stream;
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let since = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            let now = since.as_secs_f64();
            let now_ms = u64::try_from(since.as_millis()).unwrap_or(u64::MAX);
            let mut body = String::new();
            for (g, used) in [(0, 0), (1, 7000)] {
                let l = format!(
                    r#"gpu="{g}",UUID="GPU-s{g}",modelName="NVIDIA H100 80GB HBM3",Hostname="steady""#
                );
                body.push_str(&format!(
                    "DCGM_FI_DEV_FB_USED{{{l}}} {used}\nDCGM_FI_DEV_FB_FREE{{{l}}} {}\n\
                     DCGM_FI_DEV_FB_RESERVED{{{l}}} 500\ngpusweep_gpu_clean{{{l}}} {}\n\
                     gpusweep_gpu_readable{{{l}}} 1\n",
                    81000 - used,
                    u8::from(used == 0)
                ));
            }
            body.push_str(&format!(
                "gpusweep_gpus_readable{{Hostname=\"steady\"}} 1\n\
                 gpusweep_host_findings{{Hostname=\"steady\"}} 0\n\
                 gpusweep_reading_revision{{Hostname=\"steady\"}} 7\n\
                 gpusweep_host_identity_digest{{Hostname=\"steady\"}} 4242\n\
                 gpusweep_reading_timestamp_seconds{{Hostname=\"steady\"}} {now:.3}\n"
            ));
            let summary = gpusweep::core::seal::HostSummary {
                host: "steady".into(),
                taken_ms: now_ms,
                readable: Some(true),
                states: [
                    (gpusweep::core::model::GpuState::Clean, 1),
                    (gpusweep::core::model::GpuState::InUse, 2),
                ]
                .into(),
                clean_used: Some(0),
                kinds: std::collections::BTreeMap::new(),
                simulated: false,
            };
            let [mac_0, mac_1] = summary.seal(&key);
            body.push_str(&format!(
                "gpusweep_host_gpu_states{{Hostname=\"steady\",state=\"clean\"}} 1\n\
                 gpusweep_host_gpu_states{{Hostname=\"steady\",state=\"in_use\"}} 2\n\
                 gpusweep_host_clean_memory_used_bytes{{Hostname=\"steady\"}} 0\n\
                 gpusweep_host_seal{{Hostname=\"steady\",part=\"taken_ms\"}} {}\n\
                 gpusweep_host_seal{{Hostname=\"steady\",part=\"mac_0\"}} {mac_0}\n\
                 gpusweep_host_seal{{Hostname=\"steady\",part=\"mac_1\"}} {mac_1}\n",
                summary.taken_ms
            ));
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

/// A Prometheus slower than `--connect-timeout` (a large fleet's first read on a busy server): every host is
/// unreadable, never clean, and the error says how to wait longer.
#[test]
fn a_first_read_past_the_connect_timeout_is_unreadable_and_says_how_to_wait() {
    let dir = tempfile::tempdir().expect("tmp");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    answer_queries(listener, |req| {
        if hosts_query(req) {
            return r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"Hostname":"n1","instance":"n1"},"value":[1,"1"]}]}}"#.to_string();
        }
        // Which targets are down: none, at once (discovery waits for it within the same timeout).
        if down_query(req) {
            return NO_SERIES.to_string();
        }
        // Every other answer comes long after the client stopped waiting.
        std::thread::sleep(Duration::from_secs(20));
        NO_SERIES.to_string()
    });
    let out = gpusweep(dir.path())
        .args(["snapshot", "--json", "--connect-timeout", "1"])
        .args(["--hosts", &format!("prom:{url}")])
        .output()
        .expect("snapshot");
    let t = crate::support::exited(&out, 2);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    // Discovery answered: the host is the one it named, and its reading is what did not come.
    assert_eq!(crate::support::host_names(&v), ["n1"], "{t}");
    let error = v["hosts"][0]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("within 1s") && error.contains("--connect-timeout"),
        "{error}\n{t}"
    );
}

/// A dcgm-exporter target whose GPU 0 is gone (fallen off the bus: only GPU 3 reports) is still a target
/// Prometheus scrapes: its host is read, never called unscraped.
#[test]
fn a_host_without_gpu_0_is_read_from_its_scraped_target() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let body = "# TYPE DCGM_FI_DEV_FB_USED gauge\nDCGM_FI_DEV_FB_USED{gpu=\"3\",UUID=\"GPU-l3\",device=\"nvidia3\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"lone-gpu\"} 512\n".to_string();
    let target = static_target(body);
    let (_prom, url) = prometheus(tmp, &[("dcgm", vec![target])]);
    await_query(
        &Http::new(),
        &url,
        "DCGM_FI_DEV_FB_USED",
        "GPU 3 scraped",
        |r| r.len() == 1,
    );
    let (v, trace) = traced_snapshot(tmp, &url);
    // The `up` query names targets by their GPU 0: this one's `up` is asked for by its instance.
    assert!(trace.contains("(up{instance=~"), "{trace}");
    let host = &v["hosts"][0];
    assert_eq!(host["host"], "lone-gpu", "{v}");
    assert!(host["error"].is_null(), "{host}");
    assert_eq!(host["gpus"][0]["index"], 3, "{host}");
    assert_eq!(
        host["gpus"][0]["memory"]["used"].as_u64(),
        Some(512 * 1024 * 1024),
        "{host}"
    );
}

/// One host, n0, whose GPU 0 holds 1 GB (so a wait goes on): its reading time stepping `step` seconds at each
/// glance, its revision fixed.
fn stepping_prometheus(listener: TcpListener, step: f64) {
    let glances = std::sync::atomic::AtomicU32::new(0);
    let series = |labels: &str, v: f64| {
        format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{"Hostname":"n0","instance":"n0:9400","job":"gpusweep"{labels}}},"value":[1,"{v}"]}}]}}}}"#
        )
    };
    answer_queries(listener, move |req| {
        let has = |q: &str| req.contains(q);
        if hosts_query(req) {
            series("", 1.0)
        } else if has("up+and+on") {
            // Prometheus scrapes n0's target, and it is up.
            series("", 1.0)
        } else if down_query(req) {
            NO_SERIES.into()
        } else if has("gpusweep_reading_timestamp_seconds") && !has("timestamp%28") {
            let n = glances.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            series("", 1_800_000_000.0 + step * f64::from(n))
        } else if has("gpusweep_reading_timestamp_seconds") {
            series("", 1_800_000_000.0)
        } else if has("gpusweep_reading_revision") {
            series("", 7.0)
        } else if has("gpusweep_gpu_clean") {
            series(r#","gpu":"0""#, 0.0)
        } else if has("gpusweep_host_findings") {
            series("", 0.0)
        } else if has("sum+by") && has("DCGM_FI_DEV_FB_USED") {
            series(r#","gpu":"0""#, 1e9)
        } else {
            NO_SERIES.into()
        }
    });
}

/// When each glance of a traced `prom:` client was asked, in seconds from its start.
fn glance_times(trace: &str) -> Vec<f64> {
    trace
        .lines()
        .filter(|l| l.contains("bytes in") && l.contains("(gpusweep_reading_revision{})"))
        .filter_map(|l| {
            l.strip_prefix('[')?
                .split(" ms]")
                .next()?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map(|ms| ms / 1000.0)
        .collect()
}

/// Prometheus holds a host's new reading once a scrape: asked every second against a 20 s scrape, the
/// client reads it four times a scrape (every 5 s) once it has seen the readings' times step three times;
/// scraped every second, it keeps the second asked.
#[test]
fn a_prom_fleet_is_asked_four_times_a_scrape_not_faster() {
    let dir = tempfile::tempdir().expect("tmp");
    let gaps = |step: f64| {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        stepping_prometheus(listener, step);
        let out = gpusweep(dir.path())
            .env("GPUSWEEP_TRACE", "1")
            .args([
                "wait",
                "--hosts",
                &format!("prom:{url}"),
                "--timeout",
                "11s",
            ])
            .args(["--poll", "1s"])
            .output()
            .expect("wait");
        let t = String::from_utf8_lossy(&out.stderr).into_owned();
        let at = glance_times(&t);
        assert!(at.len() >= 6, "{t}");
        at.windows(2).map(|w| w[1] - w[0]).collect::<Vec<f64>>()
    };
    // Three steps seen by the fourth glance (the fifth was due by then); from then on, a quarter of the 20 s
    // scrape.
    let (slow, fast) = std::thread::scope(|s| {
        let slow = s.spawn(|| gaps(20.0));
        let fast = s.spawn(|| gaps(1.0));
        (
            slow.join().expect("20 s scrape"),
            fast.join().expect("1 s scrape"),
        )
    });
    assert!(slow.len() >= 5, "{slow:?}");
    assert!(slow[..4].iter().all(|g| *g < 4.0), "{slow:?}");
    assert!(slow[4..].iter().all(|g| *g >= 4.5), "{slow:?}");
    assert!(fast.iter().all(|g| *g < 4.0), "{fast:?}");
}

/// Debian's Pushgateway on loopback, its groups kept in `tmp` (Debian's default file is shared by every
/// Pushgateway of the machine); its `IP:PORT`.
fn pushgateway(tmp: &Path) -> (Proc, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let child = Command::new("prometheus-pushgateway")
        .arg(format!("--web.listen-address={addr}"))
        .arg(format!(
            "--persistence.file={}",
            tmp.join("pushgateway.data").display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus-pushgateway (Debian's package)");
    let p = Proc(child);
    let c = Http::new();
    await_cond_every(
        "the Pushgateway answering",
        30,
        Duration::from_millis(100),
        || {
            c.get(&format!("http://{addr}/-/ready"), &[])
                .is_some_and(|(s, _)| s == 200)
        },
    );
    (p, addr)
}

/// Push `body` to the Pushgateway as the group of `job` and `instance`: what anyone who reaches it can do.
fn push(c: &Http, pgw: &str, job: &str, instance: &str, body: &str) {
    let answer = c.rt.block_on(async {
        let r = c
            .client
            .put(format!(
                "http://{pgw}/metrics/job/{job}/instance/{instance}"
            ))
            .body(body.to_string())
            .send()
            .await
            .ok()?;
        Some((r.status().as_u16(), r.text().await.ok()?))
    });
    assert!(
        answer.as_ref().is_some_and(|(s, _)| *s == 200),
        "push to the Pushgateway: {answer:?}\n{body}"
    );
}

/// What an impostor pushes for `host`: its summary says every GPU clean and nothing found, its memory 0, and a
/// seal copied from what Prometheus holds of the host's own (anyone who can query Prometheus reads it).
fn impostor_summary(c: &Http, prom: &str, host: &str) -> String {
    let mut body = String::from("# TYPE gpusweep_host_gpu_states gauge\n");
    body.push_str(&format!(
        "gpusweep_host_gpu_states{{Hostname=\"{host}\",state=\"clean\"}} 255\n\
         # TYPE gpusweep_host_clean_memory_used_bytes gauge\n\
         gpusweep_host_clean_memory_used_bytes{{Hostname=\"{host}\"}} 0\n\
         # TYPE gpusweep_host_findings gauge\n\
         gpusweep_host_findings{{Hostname=\"{host}\"}} 0\n\
         # TYPE gpusweep_gpus_readable gauge\n\
         gpusweep_gpus_readable{{Hostname=\"{host}\"}} 1\n"
    ));
    body.push_str("# TYPE gpusweep_gpu_clean gauge\n");
    for g in 0..8 {
        body.push_str(&format!(
            "gpusweep_gpu_clean{{gpu=\"{g}\",Hostname=\"{host}\"}} 1\n"
        ));
    }
    body.push_str("# TYPE DCGM_FI_DEV_FB_USED gauge\n");
    for g in 0..8 {
        body.push_str(&format!(
            "DCGM_FI_DEV_FB_USED{{gpu=\"{g}\",Hostname=\"{host}\"}} 0\n"
        ));
    }
    body.push_str("# TYPE gpusweep_host_seal gauge\n");
    let seal = await_query(
        c,
        prom,
        &format!(r#"gpusweep_host_seal{{Hostname="{host}"}}"#),
        "the host's seal",
        |r| r.len() == 4,
    );
    for (labels, v) in seal {
        body.push_str(&format!(
            "gpusweep_host_seal{{Hostname=\"{host}\",part=\"{}\"}} {v}\n",
            labels["part"].as_str().unwrap_or_default()
        ));
    }
    body
}

/// Neither `wait` nor `check` over `spec` says clean of GPU `gpu`, nor does `snapshot` read it clean.
fn never_clean(tmp: &Path, spec: &str, gpu: &str, why: &str) {
    for cmd in ["wait", "check"] {
        let out = gpusweep(tmp)
            .args([cmd, "--hosts", spec, "--gpus", gpu, "--timeout", "3s"])
            .output()
            .expect(cmd);
        assert_ne!(
            out.status.code(),
            Some(0),
            "{why}: {cmd} said clean: {}",
            text(&out)
        );
    }
    let doc = snapshot_json(tmp, spec);
    let clean = doc["hosts"].as_array().into_iter().flatten().any(|h| {
        h["gpus"].as_array().into_iter().flatten().any(|g| {
            g["index"].as_u64().map(|i| i.to_string()).as_deref() == Some(gpu)
                && g["state"] == "clean"
        })
    });
    assert!(!clean, "{why}: snapshot reads GPU {gpu} clean: {doc}");
}

/// The attacks on a `prom:` verdict through labels, each with the real Prometheus and a real Pushgateway:
/// an impostor's page pushed under the serve's own `job` and `instance` (the Pushgateway scraped with
/// `honor_labels`, as its documentation asks), with a seal copied from Prometheus; the serve's target then
/// taken out of discovery while the pushed page stays; and a relabelling that names both targets by the
/// node. Each leaves gpu-b's held GPU 6 held or unreadable, never clean; the serve alone reads right (GPU 0
/// clean, GPU 6 held).
#[test]
#[allow(clippy::too_many_lines)] // one Prometheus and one Pushgateway through three attacks
fn a_reading_counts_only_where_its_node_sealed_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let (_b, b) = serve(tmp, "gpu-b", &[]);
    let (_pgw, pgw) = pushgateway(tmp);
    let (prometheus, prom) = prometheus(
        tmp,
        &[
            ("gpusweep", vec![b.clone()]),
            ("honor_pushgateway", vec![pgw.clone()]),
        ],
    );
    let http = Http::new();
    let spec = format!("prom:{prom}?{{job=\"gpusweep\",Hostname=\"gpu-b\"}}");
    // The serve alone: GPU 0 clean, GPU 6 held (its 71 GiB), both proven.
    await_query(
        &http,
        &prom,
        r#"gpusweep_host_seal{Hostname="gpu-b"}"#,
        "gpu-b's seal",
        |r| r.len() == 4,
    );
    let wait = |gpu: &str| {
        gpusweep(tmp)
            .args(["wait", "--hosts", &spec, "--gpus", gpu, "--timeout", "10s"])
            .output()
            .expect("wait")
    };
    crate::support::exited(&wait("0"), 0);
    crate::support::exited(&wait("6"), 1);
    // An impostor pushes a clean page as gpu-b's own target.
    let page = impostor_summary(&http, &prom, "gpu-b");
    push(&http, &pgw, "gpusweep", &b, &page);
    await_query(
        &http,
        &prom,
        r#"gpusweep_host_gpu_states{Hostname="gpu-b",state="clean"} == 255"#,
        "the pushed page scraped",
        |r| !r.is_empty(),
    );
    for _ in 0..3 {
        never_clean(tmp, &spec, "6", "a page pushed under the serve's labels");
    }
    // The one series the summary-first read trusted.
    push(
        &http,
        &pgw,
        "gpusweep",
        &b,
        "# TYPE gpusweep_host_findings gauge\ngpusweep_host_findings{Hostname=\"gpu-b\"} 0\n",
    );
    never_clean(tmp, &spec, "6", "a findings count of 0 pushed");
    push(&http, &pgw, "gpusweep", &b, &page);
    // The serve's target leaves discovery (its job stays, with another target: a removed job's series are
    // not marked stale at once); the pushed page stays.
    let elsewhere = format!("127.0.0.1:{}", free_port());
    write_config(
        tmp,
        &[
            ("gpusweep", vec![elsewhere]),
            ("honor_pushgateway", vec![pgw.clone()]),
        ],
    );
    reload(&prometheus);
    await_query(
        &http,
        &prom,
        &format!(r#"up{{instance="{b}",job="gpusweep"}}"#),
        "the serve's target gone",
        <[_]>::is_empty,
    );
    never_clean(tmp, &spec, "6", "the serve's target gone from discovery");
    let doc = snapshot_json(tmp, &spec);
    assert!(
        !doc["hosts"][0]["live_url"]
            .as_str()
            .is_some_and(|u| u.starts_with("http")),
        "no serve address where nothing proves the host: {doc}"
    );
    // Both targets relabelled to the node's name (one voice to Prometheus).
    let fake = static_target_on("127.0.0.2", page);
    let cfg = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n  - job_name: gpusweep\n    \
         static_configs:\n      - targets: ['{b}', '{fake}']\n    relabel_configs:\n      - target_label: instance\n        \
         replacement: gpu-b\n"
    );
    std::fs::write(tmp.join("prometheus.yml"), cfg).expect("config");
    reload(&prometheus);
    await_query(
        &http,
        &prom,
        r#"up{instance="gpu-b"}"#,
        "the relabelled targets",
        |r| !r.is_empty(),
    );
    never_clean(
        tmp,
        &format!("prom:{prom}?{{Hostname=\"gpu-b\"}}"),
        "6",
        "two targets relabelled as one",
    );
}

/// One GPU of a dcgm-exporter of `generation` ("4.8", "4.9", "4.10") on `host`, `used_mib` of 81,559 MiB
/// used, each name in its own generation's unit: 4.8 MiB, percent, `Hostname` and `DCGM_FI_DRIVER_VERSION`;
/// 4.9 bytes, 0..1 ratios, `hostname` and `DCGM_FI_SYSTEM_DRIVER_VERSION`; 4.10 as 4.9, its PCIe rates
/// `..._BYTES_PER_SECOND`.
fn exporter_of(generation: &str, host: &str, gpu: u32, used_mib: u64) -> String {
    const MIB: u64 = 1 << 20;
    let free_mib = 81_559 - used_mib;
    let new = generation != "4.8";
    let labels = format!(
        "gpu=\"{gpu}\",UUID=\"GPU-{host}-{gpu}\",pci_bus_id=\"00000000:0{gpu}:00.0\",device=\"nvidia{gpu}\",\
         modelName=\"NVIDIA H100 80GB HBM3\",{}=\"{host}\",{}=\"580.105.08\"",
        if new { "hostname" } else { "Hostname" },
        if new {
            "DCGM_FI_SYSTEM_DRIVER_VERSION"
        } else {
            "DCGM_FI_DRIVER_VERSION"
        },
    );
    let mut series: Vec<(&str, String)> = if new {
        vec![
            ("DCGM_FI_DEV_FB_USED_BYTES", (used_mib * MIB).to_string()),
            ("DCGM_FI_DEV_FB_FREE_BYTES", (free_mib * MIB).to_string()),
            ("DCGM_FI_DEV_FB_RESERVED_BYTES", (512 * MIB).to_string()),
            (
                "DCGM_FI_DEV_FB_CAPACITY_BYTES",
                ((81_559 + 512) * MIB).to_string(),
            ),
            ("DCGM_FI_DEV_GPU_UTIL_RATIO", "0.42".into()),
            ("DCGM_FI_DEV_SM_CLOCK_HERTZ", "1980000000".into()),
        ]
    } else {
        vec![
            ("DCGM_FI_DEV_FB_USED", used_mib.to_string()),
            ("DCGM_FI_DEV_FB_FREE", free_mib.to_string()),
            ("DCGM_FI_DEV_FB_RESERVED", "512".into()),
            ("DCGM_FI_DEV_GPU_UTIL", "42".into()),
            ("DCGM_FI_DEV_SM_CLOCK", "1980".into()),
        ]
    };
    if generation == "4.10" {
        series.push(("DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND", "2000000".into()));
    }
    let mut page = String::new();
    for (name, v) in &series {
        page.push_str(&format!("# TYPE {name} gauge\n{name}{{{labels}}} {v}\n"));
    }
    page
}

/// A `prom:` fleet of every dcgm-exporter generation reads the same: three exporters (4.8's names in MiB,
/// 4.9's in bytes, 4.10's) and a fourth target that says one GPU under both generations' names (a custom
/// collector beside a default one), scraped by a real Prometheus. Each host's GPUs read the same memory,
/// size and identity, and two generations' series of one GPU are one reading, not a conflict.
#[test]
fn every_dcgm_exporter_generation_reads_the_same_memory_and_identity() {
    let dir = tempfile::tempdir().expect("tmp");
    let tmp = dir.path();
    let page = |generation: &str, host: &str| {
        exporter_of(generation, host, 0, 0) + &exporter_of(generation, host, 1, 1234)
    };
    let targets = vec![
        static_target(page("4.8", "node-48")),
        static_target(page("4.9", "node-49")),
        static_target(page("4.10", "node-410")),
        static_target(page("4.8", "node-both") + &page("4.9", "node-both")),
    ];
    let (_p, prom) = prometheus(tmp, &[("dcgm", targets)]);
    let http = Http::new();
    await_query(
        &http,
        &prom,
        "count(DCGM_FI_DEV_FB_USED) + count(DCGM_FI_DEV_FB_USED_BYTES)",
        "every target scraped",
        |r| r.first().is_some_and(|(_, v)| is(*v, 10.0)),
    );
    let doc = snapshot_json(tmp, &format!("prom:{prom}"));
    let hosts = crate::support::host_names(&doc);
    assert_eq!(
        hosts,
        ["node-410", "node-48", "node-49", "node-both"],
        "{doc}"
    );
    for h in doc["hosts"].as_array().expect("hosts") {
        let name = h["host"].as_str().unwrap_or("");
        assert!(h["error"].is_null(), "{name}: {h}");
        let gpus = h["gpus"].as_array().expect("gpus");
        assert_eq!(
            gpus.len(),
            2,
            "{name}: one reading a GPU, whatever its names: {h}"
        );
        for (i, want_mib) in [(0usize, 0u64), (1, 1234)] {
            let g = &gpus[i];
            assert_eq!(g["memory"]["used"], want_mib << 20, "{name} GPU {i}: {g}");
            assert_eq!(
                g["memory"]["total"],
                (81_559u64 + 512) << 20,
                "{name} GPU {i}: {g}"
            );
            assert_eq!(g["memory"]["reserved"], 512u64 << 20, "{name} GPU {i}: {g}");
            assert_eq!(g["uuid"], format!("GPU-{name}-{i}"), "{name} GPU {i}: {g}");
            assert_eq!(g["name"], "NVIDIA H100 80GB HBM3", "{name} GPU {i}: {g}");
        }
    }
}
