//! `gpusweep serve`: the node daemon. The same runtime and analysis as the TUI (one fleet of this host, or of
//! demo hosts, analyzed once per reading) feed a hub that HTTP clients, Prometheus and the local socket read.
//! NVML stays loaded, so a reading costs its clients a request, not a driver start-up.

pub mod frame;
pub mod http;
pub mod hub;
pub mod kube;
pub mod listen;
pub mod memory;
pub mod metrics;
pub mod redact;
pub mod socket;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

use crate::core::host::HostSpec;
use crate::runtime::{Fleet, Settings};

/// Loopback only, unless `--listen` says otherwise. (dcgm-exporter's port is 9400; both can run.)
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9401";

/// What `gpusweep serve --help` says after the options.
pub const SERVE_HELP: &str = "\
Endpoints (every one a GET; nothing over HTTP can signal or remove):
  /metrics          OpenMetrics: dcgm-exporter's counters and labels
                    (DCGM_FI_DEV_FB_USED/FREE/RESERVED in MiB...) and
                    gpusweep_* (clean, findings, unexplained bytes,
                    process memory, time to clean)
  /api/v1/snapshot  the JSON contract of `gpusweep snapshot --json`
  /api/v1/events    server-sent events: hello, snapshot, unchanged,
                    event, status; ?interval=DUR polls faster while
                    open (>= 100ms)
  /healthz          200 ok, or 503 naming the host without a fresh
                    reading, or whose GPUs cannot be read
  /hosts/NAME/...   the same for one host of several (--demo)

The socket speaks the agent protocol; only root and the serve's own user
may signal through it. `gpusweep snapshot`, `wait`, `sweep` and `kill`
reach this host through it when one answers (--no-serve reads NVML
in-process).";

/// `gpusweep serve`'s own flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// HTTP address. Default 127.0.0.1:9401 (loopback only; dcgm-exporter has 9400). [::]:9401 for every
    /// interface (then set --token-file).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,
    /// No HTTP: the local socket only.
    #[arg(long)]
    pub no_http: bool,
    /// The Unix socket. Default $GPUSWEEP_SOCKET, /run/gpusweep.sock for root, else
    /// $XDG_RUNTIME_DIR/gpusweep.sock.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// No Unix socket.
    #[arg(long)]
    pub no_socket: bool,
    /// Require `Authorization: Bearer TOKEN` (the file's first line, 16+ characters, mode 600) on every
    /// HTTP request but /healthz.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Serve HTTPS with this certificate chain (PEM); with --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Timeline events kept for event streams that reconnect with `Last-Event-ID` (a client further
    /// behind is told what it missed is gone).
    #[arg(long, value_name = "N", default_value_t = hub::DEFAULT_REPLAY)]
    pub replay: usize,
    /// Leave these metric families out of /metrics: names starting with any of these prefixes
    /// (e.g. DCGM_FI_PROF_,gpusweep_process,gpusweep_job), for a site that does not read them. What
    /// `prom:` readers and the shipped alerts read is never left out.
    #[arg(
        long,
        value_name = "PREFIX,...",
        value_delimiter = ',',
        env = "GPUSWEEP_METRICS_LEAVE_OUT"
    )]
    pub metrics_leave_out: Vec<String>,
    #[command(flatten)]
    pub kube: kube::KubeArgs,
}

/// The bearer token: the file's first line, trimmed. A file others may read is refused: the token would not
/// be a secret.
fn read_token(path: &Path) -> anyhow::Result<Arc<str>> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(path).with_context(|| format!("--token-file {}", path.display()))?;
    if md.mode() & 0o077 != 0 {
        bail!(
            "--token-file {}: readable by others (mode {:o}); chmod 600 it",
            path.display(),
            md.mode() & 0o777
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--token-file {}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim();
    if token.len() < 16 {
        bail!(
            "--token-file {}: the token is {} characters; use at least 16 (e.g. openssl rand -hex 32)",
            path.display(),
            token.len()
        );
    }
    Ok(token.into())
}

fn tls_acceptor(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("--tls-cert {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("--tls-cert {}", cert.display()))?;
    if certs.is_empty() {
        bail!("--tls-cert {}: no certificate in it", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("--tls-key {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| anyhow!("TLS: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// What a serve will serve, checked before anything starts.
struct Plan {
    token: Option<Arc<str>>,
    /// The fleet's key (`--seal-key`), which seals each host's summary on /metrics.
    seal: Option<crate::core::seal::SealKey>,
    tls: Option<TlsAcceptor>,
    /// The socket's path; `None`: no socket.
    socket: Option<PathBuf>,
    listen: SocketAddr,
}

/// Check the options: only this host (or demo hosts), a readable token, a certificate with its key,
/// something to serve, a place for the socket.
fn plan(s: &Settings, a: &ServeArgs) -> anyhow::Result<Plan> {
    if let Some(other) = s
        .specs
        .iter()
        .find(|h| !matches!(h, HostSpec::Local | HostSpec::Demo(_)))
    {
        bail!(
            "serve reads this host (or demo hosts with --demo); {} is another host: run gpusweep serve there",
            other.as_typed()
        );
    }
    let token = a.token_file.as_deref().map(read_token).transpose()?;
    let seal = s
        .fleet
        .http
        .seal_key_file
        .as_deref()
        .map(crate::core::seal::SealKey::from_file)
        .transpose()
        .context("--seal-key")?;
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(c), Some(k)) => Some(tls_acceptor(c, k)?),
        (None, None) => None,
        _ => bail!("--tls-cert and --tls-key go together"),
    };
    if a.no_http && (a.no_socket || (s.demo && a.socket.is_none())) {
        bail!("--no-http and no socket: nothing would be served");
    }
    // A demo serve takes no default socket: it must never answer for this host.
    let socket = if a.no_socket || (s.demo && a.socket.is_none()) {
        None
    } else {
        match a.socket.clone().or_else(socket::default_path) {
            Some(p) => Some(p),
            None => bail!(
                "no place for the socket: set XDG_RUNTIME_DIR or GPUSWEEP_SOCKET, pass --socket PATH, or --no-socket"
            ),
        }
    };
    if let Some(why) = metrics::leave_out_refused(&a.metrics_leave_out) {
        bail!("{why}");
    }
    if let Some(node) = &a.kube.kube_node {
        if s.demo {
            bail!("--kube-node with --demo: a demo serve never speaks for a Kubernetes node");
        }
        if !kube::node_name_ok(node) {
            bail!(
                "--kube-node {}: not a Kubernetes node name (lower-case letters, digits, '-' and '.', at most 253)",
                crate::core::format::escape(node)
            );
        }
        if !cfg!(feature = "kube") {
            bail!(
                "--kube-node: this gpusweep was built without the Kubernetes writer (cargo build --release --features kube)"
            );
        }
    }
    let listen: SocketAddr = match a.listen {
        Some(l) => l,
        None => DEFAULT_LISTEN.parse().context("default listen address")?,
    };
    Ok(Plan {
        token,
        seal,
        tls,
        socket,
        listen,
    })
}

pub fn run(s: &Settings, a: &ServeArgs) -> anyhow::Result<i32> {
    let plan = plan(s, a)?;
    let rt = crate::runtime::async_runtime().context("starting the async runtime")?;
    let code = rt.block_on(serve(s, a, plan))?;
    rt.shutdown_background();
    Ok(code)
}

/// A warning when HTTP leaves loopback with no token: every process list and whole command line (keys passed
/// as flags included) is then anyone's on the network to read.
fn open_without_token(listen: SocketAddr, token: bool) -> Option<String> {
    (!token && !listen.ip().is_loopback()).then(|| {
        format!(
            "gpusweep serve: warning: {listen} is reachable beyond this host and no --token-file is set: anyone \
             who reaches it reads every GPU process and its whole command line; set --token-file (and a firewall \
             or NetworkPolicy)"
        )
    })
}

/// The first line a serve says: what it serves, where, and how.
/// The accept queue a burst needs (a thousand clients' streams at once, a Prometheus with many targets on this
/// serve, clients reconnecting after a blip): as long as the kernel allows. `net.core.somaxconn` caps what is
/// asked; at the 128 a plain bind asked for, a burst of a thousand lost SYNs and waited a retransmit (~1 s).
pub fn backlog() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(4096)
        .clamp(128, 65_535)
}

/// The HTTP listener, with `backlog()` places in its accept queue.
fn bind_tcp(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let sock = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As a plain bind does: a serve restarted at once takes its port back from TIME_WAIT.
    sock.set_reuseaddr(true)?;
    sock.bind(addr)?;
    sock.listen(backlog())
}

fn banner(labels: &[String], served: &[String], token: bool, demo: bool) -> String {
    // A fleet's names are listed by /api/v1/snapshot; one line names a handful.
    let hosts = match labels {
        [first, .., last] if labels.len() > 4 => {
            format!("{} hosts ({first} … {last})", labels.len())
        }
        _ => labels.join(", "),
    };
    format!(
        "gpusweep serve: {hosts} on {}{}{}",
        served.join(" and "),
        if token { "; bearer token required" } else { "" },
        if demo { "; DEMO: simulated hosts" } else { "" }
    )
}

/// The fleet, the hub, and each listener started in order; until a signal or the hub ends.
async fn serve(s: &Settings, a: &ServeArgs, plan: Plan) -> anyhow::Result<i32> {
    let Plan {
        token,
        seal,
        tls,
        socket,
        listen,
    } = plan;
    // The serve exports dcgm-exporter's counters: read them at its interval.
    let opts = crate::runtime::FleetOptions {
        counters: true,
        local_name: a.kube.kube_node.clone(),
        ..s.fleet.clone()
    };
    let fleet = Fleet::start(&s.specs, &opts).await?;
    let labels = fleet.labels().to_vec();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let modes = hub::Modes {
        readonly: s.readonly,
        expect_gpus: s.fleet.load_nvml,
        http_view: redact::http_view(token.is_some()),
        seal: seal.map(Arc::new),
    };
    let hub = hub::Hub::new(&labels, s.fleet.interval, scheme, modes, a.replay);
    let shared = hub.shared();
    tokio::spawn(memory::keep_giving_back(shared.streams_ended.clone()));
    let http = if a.no_http {
        None
    } else {
        let l = bind_tcp(listen).with_context(|| format!("--listen {listen}"))?;
        Some(l)
    };
    let bound = socket
        .as_deref()
        .map(socket::bind)
        .transpose()
        .map_err(|e| anyhow!("--socket: {e}"))?;
    let mut served = Vec::new();
    if let Some(l) = &http {
        let addr = l.local_addr().unwrap_or(listen);
        served.push(format!(
            "{scheme}://{addr} (/metrics, /api/v1/snapshot, /api/v1/events, /healthz)"
        ));
    }
    if let Some((file, _)) = &bound {
        served.push(format!("socket {}", file.0.display()));
    }
    eprintln!("{}", banner(&labels, &served, token.is_some(), s.demo));
    if let Some(w) = http
        .as_ref()
        .and_then(|_| open_without_token(listen, token.is_some()))
    {
        eprintln!("{w}");
    }
    // What anyone may open is a share of the descriptors (main raised the soft limit to the hard one).
    let budget = listen::Budget::of(crate::runtime::raise_fd_limit().unwrap_or(1024));
    let router = http::router(http::Web {
        shared: shared.clone(),
        token,
        streams: Arc::new(tokio::sync::Semaphore::new(budget.streams)),
        leave_out: a.metrics_leave_out.clone().into(),
    });
    start_kube_writer(s, a, &shared);
    let hub_task = tokio::spawn(hub.run(fleet));
    if let Some(l) = http {
        tokio::spawn(listen::serve(l, tls, router, budget));
    }
    let file = bound.map(|(file, listener)| {
        tokio::spawn(socket::accept(listener, shared.clone(), budget.socket));
        file
    });
    let code = until_signal(hub_task).await;
    drop(file);
    Ok(code)
}

/// The node writer of `--kube-node`, beside the hub, reading what the hub publishes for this host.
#[cfg(feature = "kube")]
fn start_kube_writer(s: &Settings, a: &ServeArgs, shared: &Arc<hub::Shared>) {
    let Some(node) = a.kube.kube_node.clone() else {
        return;
    };
    let status = Arc::new(kube::KubeStatus::new(&node));
    let _ = shared.kube.set(status.clone());
    let writer = kube::api::Writer {
        node,
        hold: a.kube.kube_hold,
        load_nvml: s.fleet.load_nvml,
        status,
    };
    let shared = shared.clone();
    tokio::spawn(async move {
        if let Some(host) = shared.hosts.first() {
            writer.run(host).await;
        }
    });
}

#[cfg(not(feature = "kube"))]
fn start_kube_writer(_: &Settings, _: &ServeArgs, _: &Arc<hub::Shared>) {}

/// Run until INT, TERM or HUP (a clean stop: exit 0, the socket file removed) or the hub ends.
async fn until_signal(hub: tokio::task::JoinHandle<()>) -> i32 {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        let _ = hub.await;
        return 1;
    };
    tokio::select! {
        _ = int.recv() => 0,
        _ = term.recv() => 0,
        _ = hup.recv() => 0,
        _ = hub => {
            eprintln!("gpusweep serve: every collector stopped");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_address_beyond_loopback_without_a_token_is_warned_of() {
        let at = |s: &str| s.parse::<SocketAddr>().expect("addr");
        assert!(open_without_token(at("0.0.0.0:9401"), false).is_some());
        assert!(open_without_token(at("[::]:9401"), false).is_some());
        assert!(open_without_token(at("10.0.0.1:9401"), false).is_some());
        assert!(open_without_token(at("0.0.0.0:9401"), true).is_none());
        assert!(open_without_token(at("127.0.0.1:9401"), false).is_none());
        assert!(open_without_token(at("[::1]:9401"), false).is_none());
    }
}
