//! Opening SSH sessions: one hop at a time through ProxyJump, the host key checked by `known_hosts`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::client::{self, Handle};

pub use super::known_hosts::Client;
use super::{SshOptions, Target, auth::authenticate, home, resolve};
use gpusweep_core::host::HostSpec;

fn russh_config() -> Arc<client::Config> {
    Arc::new(client::Config {
        // A host that stops answering is noticed within ~45 s even when no data flows.
        keepalive_interval: Some(Duration::from_secs(15)),
        keepalive_max: 3,
        inactivity_timeout: None,
        ..Default::default()
    })
}

/// An authenticated session, and the jump sessions it runs through (kept alive with it).
pub struct Session {
    pub handle: Handle<Client>,
    _jumps: Vec<Handle<Client>>,
}

async fn open_one(
    t: &Target,
    via: Option<&Handle<Client>>,
    opts: &SshOptions,
) -> Result<Handle<Client>, String> {
    if !t.unsupported.is_empty() {
        return Err(format!(
            "{}@{}: ssh_config: {}",
            t.user,
            t.host,
            t.unsupported.join("; ")
        ));
    }
    let refusal = Arc::new(Mutex::new(None));
    let handler = Client {
        host: t.host.clone(),
        port: t.port,
        accept_new: opts.accept_new,
        user_file: opts
            .known_hosts
            .clone()
            .or_else(|| t.known_hosts.clone())
            .or_else(|| home().map(|h| h.join(".ssh/known_hosts")))
            .unwrap_or_default(),
        system_file: PathBuf::from("/etc/ssh/ssh_known_hosts"),
        refusal: refusal.clone(),
    };
    let name = format!("{}@{}:{}", t.user, t.host, t.port);
    let res = match via {
        None => client::connect(russh_config(), (t.host.as_str(), t.port), handler).await,
        Some(jump) => {
            let ch = jump
                .channel_open_direct_tcpip(t.host.clone(), u32::from(t.port), "127.0.0.1", 0)
                .await
                .map_err(|e| format!("{name}: the jump host could not open a tunnel: {e}"))?;
            client::connect_stream(russh_config(), ch.into_stream(), handler).await
        }
    };
    let mut handle = match res {
        Ok(h) => h,
        Err(e) => {
            let why = refusal.lock().ok().and_then(|r| r.clone());
            return Err(why.unwrap_or_else(|| format!("{name}: {}", describe_io(&e))));
        }
    };
    authenticate(&mut handle, t, opts)
        .await
        .map_err(|e| format!("{name}: {e}"))?;
    Ok(handle)
}

fn describe_io(e: &russh::Error) -> String {
    match e {
        russh::Error::IO(io) => match io.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                "connection refused (no sshd listening?)".into()
            }
            std::io::ErrorKind::TimedOut => "connection timed out".into(),
            _ => io.to_string(),
        },
        other => other.to_string(),
    }
}

/// Connect to `t`, through its ProxyJump hops in order.
pub(super) async fn connect(t: &Target, opts: &SshOptions) -> Result<Session, String> {
    let mut jumps: Vec<Handle<Client>> = Vec::new();
    for hop in &t.proxy_jump {
        let spec = gpusweep_core::host::parse_one(hop).map_err(|e| format!("ProxyJump: {e}"))?;
        let HostSpec::Ssh { user, host, port } = spec else {
            return Err(format!("ProxyJump {hop:?}: not a host"));
        };
        let mut ht = resolve(&host, user.as_deref(), port, opts.ssh_config.as_deref());
        ht.proxy_jump.clear();
        let h = open_one(&ht, jumps.last(), opts)
            .await
            .map_err(|e| format!("jump host {hop}: {e}"))?;
        jumps.push(h);
    }
    let handle = open_one(t, jumps.last(), opts).await?;
    Ok(Session {
        handle,
        _jumps: jumps,
    })
}
