//! Host keys: known_hosts (the user's or ssh_config's `UserKnownHostsFile`, then the system's), learned only
//! with --accept-new, a changed key always refused.
//!
//! The matching follows OpenSSH (sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT") rather than russh's own check, which
//! knows neither `@revoked` nor negated or wildcard patterns, and calls a host known by an ed25519 key that
//! now offers RSA "unknown" (so --accept-new would learn the new key where OpenSSH refuses a changed identity).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use data_encoding::BASE64_MIME;
use hmac::{Hmac, KeyInit, Mac};
use russh::client;
use russh::keys::{HashAlg, PublicKey, known_hosts, parse_public_key_base64};
use sha1::Sha1;

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

/// What one known_hosts file says about a host's key.
#[derive(Debug, PartialEq, Eq)]
pub enum Known {
    /// A line for this host holds this key.
    Match,
    /// An `@revoked` line holds this key: never accept it.
    Revoked { line: usize },
    /// Lines for this host hold other keys (of this type or another): a changed identity.
    Changed { line: usize, algorithm: String },
    /// Nothing about this host.
    Unknown,
}

/// `name` as known_hosts writes it: `host`, or `[host]:port` off port 22.
pub(crate) fn entry_name(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    }
}

/// Check `key` for `name` against the text of one known_hosts file.
pub fn check(text: &str, name: &str, key: &PublicKey) -> Known {
    let mut matched = false;
    let mut other: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let mut fields = raw.split_ascii_whitespace().peekable();
        if fields.peek().is_none_or(|f| f.starts_with('#')) {
            continue;
        }
        let marker = fields.next_if(|f| f.starts_with('@'));
        let (Some(patterns), Some(_alg), Some(b64)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        // Certificates are not used: a CA line says nothing about a plain host key.
        if marker == Some("@cert-authority") || !host_matches(name, patterns) {
            continue;
        }
        let Ok(recorded) = parse_public_key_base64(b64) else {
            continue;
        };
        let same = recorded.key_data() == key.key_data();
        match marker {
            Some("@revoked") if same => return Known::Revoked { line },
            Some(_) => {}
            None if same => matched = true,
            None => {
                other.get_or_insert((line, recorded.algorithm().to_string()));
            }
        }
    }
    match (matched, other) {
        (true, _) => Known::Match,
        (false, Some((line, algorithm))) => Known::Changed { line, algorithm },
        (false, None) => Known::Unknown,
    }
}

/// Whether a comma-separated pattern list names `name`: a negated pattern (`!pat`) that matches excludes the
/// line whatever else matches; `*` and `?` are wildcards; `|1|salt|hash` is a hashed name.
fn host_matches(name: &str, patterns: &str) -> bool {
    let mut hit = false;
    for p in patterns.split(',') {
        let (negated, p) = match p.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, p),
        };
        let m = if p.starts_with("|1|") {
            hashed_matches(name, p)
        } else {
            wildcard(&p.to_ascii_lowercase(), &name.to_ascii_lowercase())
        };
        if m && negated {
            return false;
        }
        hit |= m;
    }
    hit
}

fn hashed_matches(name: &str, entry: &str) -> bool {
    let mut parts = entry.split('|').skip(2);
    let (Some(Ok(salt)), Some(Ok(hash))) = (
        parts.next().map(|p| BASE64_MIME.decode(p.as_bytes())),
        parts.next().map(|p| BASE64_MIME.decode(p.as_bytes())),
    ) else {
        return false;
    };
    Hmac::<Sha1>::new_from_slice(&salt)
        .is_ok_and(|mac| mac.chain_update(name).verify_slice(&hash).is_ok())
}

/// `*` matches any run, `?` one character (OpenSSH's match_pattern).
fn wildcard(pat: &str, s: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pat.chars().collect(), s.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

impl Client {
    pub(super) fn verdict(&self, key: &PublicKey) -> Result<(), String> {
        let fp = key.fingerprint(HashAlg::Sha256);
        let name = entry_name(&self.host, self.port);
        let mut changed = None;
        for file in [&self.user_file, &self.system_file] {
            let text = match std::fs::read_to_string(file) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(format!("reading {}: {e}", file.display())),
            };
            match check(&text, &name, key) {
                Known::Match => return Ok(()),
                Known::Revoked { line } => {
                    return Err(format!(
                        "REVOKED host key for {name} ({fp}): {}:{line} marks it @revoked; refusing",
                        file.display()
                    ));
                }
                Known::Changed { line, algorithm } => {
                    changed.get_or_insert((file_line(file, line), algorithm));
                }
                Known::Unknown => {}
            }
        }
        if let Some((at, algorithm)) = changed {
            return Err(format!(
                "HOST KEY CHANGED for {name}: it offers {} {fp}, {at} knows it by another {algorithm} key: \
                 refusing (also with --accept-new). If the change is expected, remove the old key with \
                 `ssh-keygen -R '{name}'`",
                key.algorithm()
            ));
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

fn file_line(file: &Path, line: usize) -> String {
    format!("{}:{line}", file.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIOCXaHEXygi2G0Odc+wPsgfdGQdIZN3FQl4V3Voo+4f2";
    const ED2: &str = "AAAAC3NzaC1lZDI1NTE5AAAAILiYizQAAF0aQJWFyMM+zMTpJ5hwytAs232bBskk9Ga3";

    fn key(b64: &str) -> PublicKey {
        parse_public_key_base64(b64).expect("key")
    }

    #[test]
    fn plain_wildcard_negated_and_revoked() {
        let k = key(ED);
        let n = "[10.0.0.5]:2222";
        let known = |file: &str| check(file, n, &k);
        assert_eq!(known(&format!("{n} ssh-ed25519 {ED}\n")), Known::Match);
        assert_eq!(
            known(&format!("[10.0.0.*]:2222 ssh-ed25519 {ED}\n")),
            Known::Match
        );
        assert_eq!(
            known(&format!(
                "[10.0.0.*]:2222,![10.0.0.5]:2222 ssh-ed25519 {ED}\n"
            )),
            Known::Unknown,
            "a negated pattern excludes the line"
        );
        assert_eq!(
            known(&format!(
                "{n} ssh-ed25519 {ED}\n@revoked * ssh-ed25519 {ED}\n"
            )),
            Known::Revoked { line: 2 },
            "revoked wins over a match"
        );
        let changed = Known::Changed {
            line: 3,
            algorithm: "ssh-ed25519".into(),
        };
        assert_eq!(
            known(&format!("# comment\n\n{n} ssh-ed25519 {ED2}\n")),
            changed
        );
        assert_eq!(known(&format!("other ssh-ed25519 {ED2}\n")), Known::Unknown);
        assert_eq!(
            known(&format!("@cert-authority * ssh-ed25519 {ED2}\n")),
            Known::Unknown
        );
    }

    #[test]
    fn hashed_names_match() {
        // `ssh-keygen -H` of "gpu-node-1", salt and hash in base64.
        let salt = [7u8; 20];
        let mac = Hmac::<Sha1>::new_from_slice(&salt)
            .expect("key")
            .chain_update("gpu-node-1")
            .finalize()
            .into_bytes();
        let entry = format!(
            "|1|{}|{}",
            data_encoding::BASE64.encode(&salt),
            data_encoding::BASE64.encode(&mac)
        );
        let k = key(ED);
        assert_eq!(
            check(&format!("{entry} ssh-ed25519 {ED}\n"), "gpu-node-1", &k),
            Known::Match
        );
        assert_eq!(
            check(&format!("{entry} ssh-ed25519 {ED}\n"), "gpu-node-2", &k),
            Known::Unknown
        );
    }

    #[test]
    fn wildcards() {
        assert!(wildcard("gpu-*", "gpu-node-1"));
        assert!(wildcard("gpu-?", "gpu-1"));
        assert!(!wildcard("gpu-?", "gpu-12"));
        assert!(wildcard("*", ""));
        assert!(wildcard("a*b*c", "axxbyyc"));
        assert!(!wildcard("a*b*c", "axxbyy"));
    }
}
