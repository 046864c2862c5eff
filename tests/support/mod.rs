//! Helpers shared by the modules of the integration-test crate: each exists once, here.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_gpusweep");

/// What a command said: its stdout, then its stderr, as one string.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Wait for a condition, up to `secs` seconds, polling every 10 ms (not a sleep-as-synchronisation: it
/// returns as soon as the condition holds); panics naming `what` at the deadline.
pub fn await_cond(what: &str, secs: u64, f: impl FnMut() -> bool) {
    await_cond_every(what, secs, Duration::from_millis(10), f);
}

/// [`await_cond`] polling every `every`, for conditions that are costly to check (one that runs a program).
pub fn await_cond_every(what: &str, secs: u64, every: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}"
        );
        std::thread::sleep(every);
    }
}

/// A free loopback port (bound, then released for the server that takes it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A name no other test of this process gets: `prefix`, this process's id and a counter. For what lives
/// outside a test's temporary directory (a tmux server, a cgroup), now that every test shares one process.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Field `n` of `/proc/PID/stat` after the command name (0 is the state), if the process exists.
pub fn stat_field(pid: u32, n: usize) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 2..];
    after.split_whitespace().nth(n).map(str::to_string)
}

/// The process exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    stat_field(pid, 0).is_some_and(|s| s != "Z")
}

/// `gpusweep` with everything it reads from its environment kept inside `dir`: no config, its own audit log
/// and default socket, no hosts, token or CA file of the developer's.
pub fn gpusweep(dir: &Path) -> Command {
    gpusweep_via(dir, &[])
}

/// The same, run through `wrapper` (a program and its arguments that end by running the binary named after
/// them: `prlimit ... --`, `unshare ... sh -c 'exec "$0" "$@"'`).
pub fn gpusweep_via(dir: &Path, wrapper: &[&str]) -> Command {
    let mut c = match wrapper.split_first() {
        Some((prog, args)) => {
            let mut c = Command::new(prog);
            c.args(args).arg(BIN);
            c
        }
        None => Command::new(BIN),
    };
    c.env("GPUSWEEP_CONFIG", dir.join("no-config.toml"))
        .env("GPUSWEEP_AUDIT_LOG", dir.join("actions.jsonl"))
        .env("GPUSWEEP_SOCKET", dir.join("default.sock"))
        .env_remove("GPUSWEEP_HOSTS")
        .env_remove("GPUSWEEP_HTTP_TOKEN_FILE")
        .env_remove("GPUSWEEP_HTTP_CA_FILE")
        .env_remove("GPUSWEEP_SEAL_KEY_FILE")
        .stdin(Stdio::null());
    // A test's fleet key (`seal_key`), for every serve and reader it starts in that directory.
    let key = dir.join(SEAL_KEY);
    if key.exists() {
        c.env("GPUSWEEP_SEAL_KEY_FILE", key);
    }
    c
}

/// The file name of a test directory's fleet key.
pub const SEAL_KEY: &str = "seal.key";

/// A fleet key (mode 600) in `dir`: from then on every gpusweep a test starts there seals (serve) and checks
/// seals (`prom:` readers) with it.
pub fn seal_key(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(SEAL_KEY);
    std::fs::write(
        &p,
        "6f1c0e0a8d3b4e2f9a7c5b3d1e0f2a4c6e8d0b2a4c6e8f0a1b3c5d7e9f1a3b5c\n",
    )
    .expect("key");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    p
}

/// Build a stand-in driver library from `tests/fixtures/SOURCE` into `dir` as `libnvidia-ml.so.1`.
fn fixture_library(dir: &Path, source: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(source);
    let lib = dir.join("libnvidia-ml.so.1");
    let o = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .expect("cc (a C compiler is part of the Rust toolchain's needs)");
    assert!(o.status.success(), "{}", text(&o));
    lib
}

/// Build the program `tests/fixtures/SOURCE` (C, with threads) into `dir`; its path.
pub fn fixture_program(dir: &Path, source: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(source);
    let exe = dir.join(source.trim_end_matches(".c"));
    let o = Command::new("cc")
        .args(["-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("cc (a C compiler is part of the Rust toolchain's needs)");
    assert!(o.status.success(), "{}", text(&o));
    exe
}

/// Build the file-driven stand-in NVML (tests/fixtures/standin_nvml.c) into `dir`; its state is the file
/// `dir/nvml` (see [`set_nvml`]).
pub fn standin_nvml(dir: &Path) -> PathBuf {
    fixture_library(dir, "standin_nvml.c")
}

/// Build the wedged-driver stand-in library (tests/fixtures/wedged_nvml.c) into `dir`.
pub fn wedged_nvml(dir: &Path) -> PathBuf {
    fixture_library(dir, "wedged_nvml.c")
}

/// Replace the stand-in driver's state (`dir/nvml`) at once (a reader never sees half a file).
pub fn set_nvml(dir: &Path, state: &str) {
    std::fs::write(dir.join("nvml.tmp"), state).expect("state");
    std::fs::rename(dir.join("nvml.tmp"), dir.join("nvml")).expect("rename");
}

/// A child process killed and reaped however the test ends (a panicking test would otherwise leave it
/// holding the test's output pipes open).
pub struct Reaped(pub std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `openssl ARGS` run in `dir`; it must succeed.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (Debian's openssl package)");
    assert!(out.status.success(), "openssl {args:?}: {}", text(&out));
}

/// In `dir`: a CA of the test's own (`ca.pem`, `ca.key`) and a certificate for 127.0.0.1 it signed
/// (`cert.pem`, `key.pem`), P-256 keys.
pub fn loopback_certificate(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let ca = [
        "req",
        "-x509",
        "-days",
        "1",
        "-subj",
        "/CN=gpusweep test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ];
    openssl(dir, &[&ca[..], &ec[..]].concat());
    let req = [
        "req",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "key.pem",
        "-out",
        "req.csr",
    ];
    openssl(dir, &[&req[..], &ec[..]].concat());
    std::fs::write(
        dir.join("ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .expect("ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "req.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "ext",
            "-out",
            "cert.pem",
        ],
    );
}

/// A started `gpusweep serve`'s `HOST:PORT`, read after the `http://` of its banner (its first stderr line),
/// and the rest of its stderr to drain or log; panics with the banner when it names no HTTP address.
pub fn serve_banner(
    child: &mut std::process::Child,
) -> (String, std::io::BufReader<std::process::ChildStderr>) {
    use std::io::BufRead;
    let mut err = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut banner = String::new();
    err.read_line(&mut banner).expect("banner");
    let addr = banner
        .split("http://")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("serve said: {banner}"))
        .to_string();
    (addr, err)
}

/// The kinds of a JSON host's findings (`snapshot --json`'s `hosts[i]`), in order.
pub fn finding_kinds(host: &serde_json::Value) -> Vec<&str> {
    host["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter_map(|f| f["kind"].as_str())
        .collect()
}

/// An HTTP request's head read from `s` (up to its blank line), or `None` when the peer closed first.
pub fn read_request(s: &mut std::net::TcpStream) -> Option<String> {
    use std::io::Read;
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
    }
    Some(String::from_utf8_lossy(&req).into_owned())
}

/// `gpusweep serve --demo --hosts gpu-b` on a port of its own, killed when dropped; and its address.
pub struct DemoServe {
    _process: Reaped,
    pub addr: String,
}

impl DemoServe {
    /// With no config, the serve's further arguments `extra`.
    pub fn start(dir: &Path, extra: &[&std::ffi::OsStr]) -> DemoServe {
        let mut c = Command::new(BIN);
        c.args([
            "serve",
            "--demo",
            "--hosts",
            "gpu-b",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(extra);
        DemoServe::spawn(c, dir)
    }

    /// `c` (a `gpusweep serve`) started with no config; its HTTP address read from its banner.
    pub fn spawn(mut c: Command, dir: &Path) -> DemoServe {
        use std::io::BufRead;
        let mut child = c
            .env("GPUSWEEP_CONFIG", dir.join("none.toml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("serve");
        let (addr, err) = serve_banner(&mut child);
        std::thread::spawn(move || for _ in err.lines() {});
        DemoServe {
            _process: Reaped(child),
            addr,
        }
    }
}

/// What a command said ([`text`]), once it is known to have exited with `code`.
#[track_caller]
pub fn exited(o: &Output, code: i32) -> String {
    let t = text(o);
    assert_eq!(o.status.code(), Some(code), "{t}");
    t
}

/// The hosts a JSON document (`snapshot --json`) names, in order.
pub fn host_names(doc: &serde_json::Value) -> Vec<&str> {
    doc["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .filter_map(|h| h["host"].as_str())
        .collect()
}

/// Sweep a demo serve's host through the serve's socket `sock` (every leftover ended, the GPUs waited for).
pub fn sweep_through(dir: &Path, sock: &str) {
    let out = gpusweep(dir)
        .args(["sweep", "--hosts", &format!("unix:{sock}"), "--yes"])
        .args(["--grace", "1s", "--timeout", "20s"])
        .output()
        .expect("sweep");
    exited(&out, 0);
}
