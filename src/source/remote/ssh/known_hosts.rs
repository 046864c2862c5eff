//! Host keys: known_hosts (the user's, then the system's), learned only with --accept-new, a changed key
//! always refused.

use russh::keys::{HashAlg, PublicKey, known_hosts};

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use russh::client;

/// Checks the server key against known_hosts and remembers why it refused.
pub struct Client {
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) accept_new: bool,
    pub(super) user_file: PathBuf,
    pub(super) system_file: PathBuf,
    pub(super) refusal: Arc<Mutex<Option<String>>>,
}

impl client::Handler for Client {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        key: &russh::keys::PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        match self.verdict(&key.public_key()) {
            Ok(()) => Ok(true),
            Err(why) => {
                if let Ok(mut r) = self.refusal.lock() {
                    *r = Some(why);
                }
                Ok(false)
            }
        }
    }
}

impl Client {
    pub(super) fn verdict(&self, key: &PublicKey) -> Result<(), String> {
        let fp = key.fingerprint(HashAlg::Sha256);
        let name = if self.port == 22 {
            self.host.clone()
        } else {
            format!("[{}]:{}", self.host, self.port)
        };
        for file in [&self.user_file, &self.system_file] {
            match known_hosts::check_known_hosts_path(&self.host, self.port, key, file) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(russh::keys::Error::KeyChanged { line }) => {
                    return Err(format!(
                        "HOST KEY CHANGED for {name} ({fp}; {}:{line} has another): refusing. If the change is expected, remove the old key with `ssh-keygen -R '{name}'`",
                        file.display()
                    ));
                }
                Err(e) => return Err(format!("reading {}: {e}", file.display())),
            }
        }
        if self.accept_new {
            known_hosts::learn_known_hosts_path(&self.host, self.port, key, &self.user_file)
                .map_err(|e| {
                    format!(
                        "cannot learn the key of {name} into {}: {e}",
                        self.user_file.display()
                    )
                })?;
            return Ok(());
        }
        Err(format!(
            "unknown host key for {name} ({fp}): not in {} or {}. Check it, then add it (ssh-keyscan) or run once with --accept-new",
            self.user_file.display(),
            self.system_file.display()
        ))
    }
}
