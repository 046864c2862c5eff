//! Authentication: ssh-agent first (no key material is read by gpusweep then), then key files.

use std::path::PathBuf;
use std::sync::Arc;

use russh::client::Handle;
use russh::keys::{HashAlg, PrivateKeyWithHashAlg};

use super::known_hosts::Client;
use super::{SshOptions, Target, expand_tilde, home};

pub async fn authenticate(
    handle: &mut Handle<Client>,
    t: &Target,
    opts: &SshOptions,
) -> Result<(), String> {
    let mut tried = Vec::new();
    // ssh-agent first: no key material is ever read by gpusweep then.
    if std::env::var_os("SSH_AUTH_SOCK").is_some() {
        match russh::keys::agent::client::AgentClient::connect_env().await {
            Ok(mut agent) => {
                let ids = agent.request_identities().await.unwrap_or_default();
                tried.push(format!("ssh-agent ({} keys)", ids.len()));
                for id in ids {
                    let key = id.public_key().into_owned();
                    let hash = rsa_hash(handle, key.algorithm().is_rsa()).await;
                    if let Ok(r) = handle
                        .authenticate_publickey_with(&t.user, key, hash, &mut agent)
                        .await
                        && r.success()
                    {
                        return Ok(());
                    }
                }
            }
            Err(e) => tried.push(format!("ssh-agent unreachable ({e})")),
        }
    }
    let mut files: Vec<PathBuf> = opts.identities.iter().map(|p| expand_tilde(p)).collect();
    files.extend(t.identity_files.iter().cloned());
    if let Some(h) = home() {
        for n in ["id_ed25519", "id_ecdsa", "id_rsa"] {
            files.push(h.join(".ssh").join(n));
        }
    }
    files.dedup();
    for f in files {
        if !f.exists() {
            continue;
        }
        let key = match russh::keys::load_secret_key(&f, None) {
            Ok(k) => k,
            Err(e) => {
                tried.push(format!(
                    "{} (unusable: {e}; load it into ssh-agent)",
                    f.display()
                ));
                continue;
            }
        };
        tried.push(f.display().to_string());
        let hash = rsa_hash(handle, key.algorithm().is_rsa()).await;
        match handle
            .authenticate_publickey(&t.user, PrivateKeyWithHashAlg::new(Arc::new(key), hash))
            .await
        {
            Ok(r) if r.success() => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(format!("authentication: {e}")),
        }
    }
    Err(format!(
        "authentication failed for user {} (tried: {})",
        t.user,
        if tried.is_empty() {
            "no ssh-agent and no key files".into()
        } else {
            tried.join(", ")
        }
    ))
}

/// The RSA signature hash the server prefers. Only RSA keys need it, and asking can wait up to a second for the
/// server's extension info, so other keys skip it.
async fn rsa_hash(handle: &Handle<Client>, is_rsa: bool) -> Option<HashAlg> {
    if !is_rsa {
        return None;
    }
    handle
        .best_supported_rsa_hash()
        .await
        .ok()
        .flatten()
        .flatten()
}
