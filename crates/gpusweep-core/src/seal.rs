//! A host's verdict as Prometheus carries it, and the seal that proves its own serve said it.
//!
//! Prometheus labels are anyone's to write (`honor_labels`, a Pushgateway, federation, relabelling), so a
//! `prom:` reader believes no label: it believes a host's verdict when it carries a seal only a holder of
//! the fleet's key could make. The verdict on the wire is the host's compact summary (`HostSummary`: each
//! GPU's state as a mask of GPU indices, the bytes its clean GPUs use, its findings by kind, whether every
//! GPU was read, when it was read); `HostSummary::of` encodes it from a judged reading and `states`
//! decodes it, here alone. The seal is HMAC-SHA256 over the summary's canonical bytes, its first 96 bits
//! carried as two 48-bit sample values (a float's mantissa holds them exactly), with the reading's time in
//! milliseconds: a reader recomputes it from what it read, so a series written by anyone else, a series
//! left out, one reading's parts mixed with another's, or another host's summary fails it.

use std::collections::BTreeMap;
use std::path::Path;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::metrics::STATE_MASK_GPUS;
use crate::model::{GpuState, HostSnapshot, Severity};

/// The fewest bytes a fleet key may have (after trimming the file's whitespace): 32 bytes of text, at least
/// 128 bits of secret when they are hex (`openssl rand -hex 32` writes 64).
pub const MIN_KEY_BYTES: usize = 32;
/// Bits of each of the seal's two parts: exact in a sample's float.
pub const PART_BITS: u32 = 48;
/// How much older than the moment Prometheus answered a sealed reading may be: an honest one is at most a
/// scrape interval (Prometheus's default is 1 minute) and a serve's poll interval old; older is a replay of
/// a reading that was once true. (The answer's time is Prometheus's own, not a sample's: a sample's
/// timestamp is the sender's to set where `honor_timestamps` holds.)
pub const FRESH_MS: u64 = 90_000;
/// How far ahead of Prometheus's clock a sealed reading may be (the node's and Prometheus's clocks apart).
pub const AHEAD_MS: u64 = 5_000;

/// A severity as the metrics' `severity` label spells it.
pub fn severity_word(s: Severity) -> &'static str {
    match s {
        Severity::Leak => "leak",
        Severity::Warning => "warning",
        Severity::Info => "info",
    }
}

/// The fleet's key: the secret every serve seals with and every `prom:` reader checks with.
#[derive(Clone)]
pub struct SealKey(Vec<u8>);

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

/// Why a key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SealKeyError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: others may read it (mode {mode:o}); the key would be no secret: chmod 600 it")]
    Loose { path: String, mode: u32 },
    #[error(
        "{path}: owned by user {uid}, neither root nor this user: not taken for the fleet's key"
    )]
    Owner { path: String, uid: u32 },
    #[error(
        "{path}: {len} bytes; a fleet key has at least {MIN_KEY_BYTES} (e.g. openssl rand -hex 32 > FILE)"
    )]
    Short { path: String, len: usize },
}

impl SealKey {
    /// The key in `path`: its bytes, whitespace trimmed at both ends. Opened once, never through a symbolic
    /// link, and judged by what was opened: a file group or others may read, one owned by another user
    /// than this one or root (a file put where this reader was told to look), or a key shorter than
    /// `MIN_KEY_BYTES` is refused.
    pub fn from_file(path: &Path) -> Result<SealKey, SealKeyError> {
        use std::io::Read;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let shown = path.display().to_string();
        let read = |source| SealKeyError::Read {
            path: shown.clone(),
            source,
        };
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(read)?;
        let md = f.metadata().map_err(read)?;
        if md.mode() & 0o077 != 0 {
            return Err(SealKeyError::Loose {
                path: shown,
                mode: md.mode() & 0o777,
            });
        }
        // This process's user, as the kernel shows it: the owner of its own /proc entry.
        let me = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
        if md.uid() != 0 && Some(md.uid()) != me {
            return Err(SealKeyError::Owner {
                path: shown,
                uid: md.uid(),
            });
        }
        let mut bytes = Vec::new();
        f.by_ref()
            .take(64 * 1024)
            .read_to_end(&mut bytes)
            .map_err(read)?;
        SealKey::new(bytes.trim_ascii()).map_err(|len| SealKeyError::Short { path: shown, len })
    }

    /// A key of these bytes; `Err(len)` when it is shorter than `MIN_KEY_BYTES`.
    pub fn new(bytes: &[u8]) -> Result<SealKey, usize> {
        if bytes.len() < MIN_KEY_BYTES {
            return Err(bytes.len());
        }
        Ok(SealKey(bytes.to_vec()))
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC takes a key of any length.
        Hmac::<Sha256>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!())
    }
}

/// A host's verdict as Prometheus carries it: what a serve exports as its compact summary, and what a
/// `prom:` reader believes of the host once the seal over it checks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostSummary {
    /// The host's name, as its series' `Hostname` says.
    pub host: String,
    /// When the serve took the reading (Unix milliseconds).
    pub taken_ms: u64,
    /// Whether the driver answered and every GPU was read (`gpusweep_gpus_readable`); None where the serve
    /// reads no GPUs (a demo serve of hosts without them).
    pub readable: Option<bool>,
    /// Each state some GPU is in, with its GPUs as a mask of indices (bit i: GPU i). Empty where a GPU was
    /// not judged or its index does not fit a mask (`STATE_MASK_GPUS`): then no GPU's state is said.
    pub states: BTreeMap<GpuState, u64>,
    /// Bytes used on the clean GPUs, summed, where every state was said and every clean GPU's bytes read.
    pub clean_used: Option<u64>,
    /// Findings by (kind, severity word), only those the host has.
    pub kinds: BTreeMap<(String, String), u64>,
    /// The readings are simulated (a demo serve): sealed, so no key holder's demo passes for a real host.
    pub simulated: bool,
}

impl HostSummary {
    /// The summary of a judged reading (`readable` as its serve exports `gpusweep_gpus_readable`).
    pub fn of(snap: &HostSnapshot, readable: Option<bool>) -> HostSummary {
        let mut s = HostSummary {
            host: snap.host.clone(),
            taken_ms: snap.taken_at_ms,
            readable,
            simulated: snap.simulated,
            ..HostSummary::default()
        };
        if snap.error.is_some() {
            return s;
        }
        let mut clean_used = Some(0u64);
        let mut whole = true;
        for g in &snap.gpus {
            match g.state {
                Some(st) if g.index < STATE_MASK_GPUS => {
                    *s.states.entry(st).or_default() |= 1u64 << g.index;
                    if st == GpuState::Clean {
                        clean_used = clean_used.zip(g.memory.used).map(|(a, b)| a + b);
                    }
                }
                _ => whole = false,
            }
        }
        if whole {
            s.clean_used = clean_used;
        } else {
            s.states.clear();
        }
        for f in &snap.findings {
            let key = (
                f.kind.as_str().to_string(),
                severity_word(f.severity).to_string(),
            );
            *s.kinds.entry(key).or_default() += 1;
        }
        s
    }

    /// Each GPU's state as the summary says it, by index; a GPU in two masks is in neither that can be told.
    pub fn states(&self) -> BTreeMap<u32, GpuState> {
        let mut out = BTreeMap::new();
        for (&st, &mask) in &self.states {
            for i in (0..STATE_MASK_GPUS).filter(|i| mask & (1u64 << i) != 0) {
                out.entry(i)
                    .and_modify(|s| {
                        if *s != st {
                            *s = GpuState::Unknown;
                        }
                    })
                    .or_insert(st);
            }
        }
        out
    }

    /// Whether it says something else of the host than `before` did, its time aside.
    pub fn moved_from(&self, before: &HostSummary) -> bool {
        (
            &self.host,
            self.readable,
            &self.states,
            self.clean_used,
            &self.kinds,
            self.simulated,
        ) != (
            &before.host,
            before.readable,
            &before.states,
            before.clean_used,
            &before.kinds,
            before.simulated,
        )
    }

    /// The bytes the seal is made over: every field, each length-prefixed, in one order, so no two
    /// summaries share them.
    fn canonical(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        let mut field = |v: &[u8]| {
            out.extend_from_slice(&u32::try_from(v.len()).unwrap_or(u32::MAX).to_be_bytes());
            out.extend_from_slice(v);
        };
        field(b"gpusweep-seal-v1");
        field(self.host.as_bytes());
        field(if self.simulated {
            b"simulated"
        } else {
            b"read"
        });
        field(self.taken_ms.to_string().as_bytes());
        field(match self.readable {
            None => b"-",
            Some(true) => b"1",
            Some(false) => b"0",
        });
        for (st, mask) in &self.states {
            field(st.as_str().as_bytes());
            field(mask.to_string().as_bytes());
        }
        field(b"clean_used");
        field(
            self.clean_used
                .map(|u| u.to_string())
                .unwrap_or_default()
                .as_bytes(),
        );
        for ((kind, sev), n) in &self.kinds {
            field(kind.as_bytes());
            field(sev.as_bytes());
            field(n.to_string().as_bytes());
        }
        out
    }

    /// The seal: the first 96 bits of the summary's HMAC, as two 48-bit parts.
    pub fn seal(&self, key: &SealKey) -> [u64; 2] {
        let mut mac = key.mac();
        mac.update(&self.canonical());
        let d = mac.finalize().into_bytes();
        let part = |b: &[u8]| b.iter().fold(0u64, |acc, x| (acc << 8) | u64::from(*x));
        [part(&d[..6]), part(&d[6..12])]
    }

    /// Whether `parts` is this summary's seal under `key` (compared in constant time).
    pub fn verify(&self, key: &SealKey, parts: [u64; 2]) -> bool {
        if parts.iter().any(|p| *p >> PART_BITS != 0) {
            return false;
        }
        let mut tag = [0u8; 12];
        tag[..6].copy_from_slice(&parts[0].to_be_bytes()[2..]);
        tag[6..].copy_from_slice(&parts[1].to_be_bytes()[2..]);
        let mut mac = key.mac();
        mac.update(&self.canonical());
        mac.verify_truncated_left(&tag).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Finding, FindingKind, Gpu, Memory};

    fn key(b: u8) -> SealKey {
        SealKey::new(&[b; 32]).expect("32 bytes")
    }

    fn judged(states: &[GpuState]) -> HostSnapshot {
        HostSnapshot {
            host: "node-1".into(),
            taken_at_ms: 1_765_000_000_123,
            gpus: states
                .iter()
                .enumerate()
                .map(|(i, s)| Gpu {
                    index: u32::try_from(i).expect("index"),
                    state: Some(*s),
                    memory: Memory {
                        used: Some(if *s == GpuState::Clean { 0 } else { 4 << 30 }),
                        ..Memory::default()
                    },
                    ..Gpu::default()
                })
                .collect(),
            ..HostSnapshot::default()
        }
    }

    #[test]
    fn every_state_reads_back_as_it_was_judged() {
        let all = GpuState::ALL;
        let snap = judged(&all);
        let s = HostSummary::of(&snap, Some(true));
        let back = s.states();
        for (i, st) in all.iter().enumerate() {
            assert_eq!(back.get(&u32::try_from(i).expect("i")), Some(st), "{s:?}");
        }
        assert_eq!(back.len(), all.len());
        assert_eq!(s.clean_used, Some(0));
    }

    #[test]
    fn a_gpu_past_the_mask_or_unjudged_leaves_every_state_unsaid() {
        let mut snap = judged(&[GpuState::Clean, GpuState::Clean]);
        snap.gpus[1].state = None;
        let s = HostSummary::of(&snap, Some(true));
        assert!(s.states.is_empty() && s.clean_used.is_none(), "{s:?}");
        let mut snap = judged(&[GpuState::Clean]);
        snap.gpus[0].index = STATE_MASK_GPUS;
        assert!(HostSummary::of(&snap, Some(true)).states().is_empty());
    }

    #[test]
    fn a_seal_checks_only_for_its_own_summary_and_key() {
        let mut snap = judged(&[GpuState::Clean, GpuState::InUse]);
        snap.findings.push(Finding {
            kind: FindingKind::Residual,
            severity: Severity::Leak,
            host: "node-1".into(),
            gpu: Some(1),
            pid: None,
            bytes: None,
            detail: String::new(),
            action: String::new(),
            target_pid: None,
            gpu_instance: None,
            file: None,
            confirms_as: None,
        });
        let s = HostSummary::of(&snap, Some(true));
        let seal = s.seal(&key(7));
        assert!(s.verify(&key(7), seal));
        assert!(!s.verify(&key(8), seal), "another key");
        // Each change an impostor could make: a state, the bytes, a finding gone, the time, the host.
        let mut forged = s.clone();
        forged.states = BTreeMap::from([(GpuState::Clean, 0b11)]);
        assert!(!forged.verify(&key(7), seal));
        let mut forged = s.clone();
        forged.kinds.clear();
        assert!(!forged.verify(&key(7), seal));
        let mut forged = s.clone();
        forged.taken_ms += 1;
        assert!(!forged.verify(&key(7), seal));
        let mut forged = s.clone();
        forged.host = "node-2".into();
        assert!(!forged.verify(&key(7), seal));
        let mut forged = s.clone();
        forged.readable = None;
        assert!(!forged.verify(&key(7), seal));
        let mut forged = s.clone();
        forged.simulated = true;
        assert!(
            !forged.verify(&key(7), seal),
            "a demo's seal is not a real host's"
        );
        // A truncated or widened seal.
        assert!(!s.verify(&key(7), [seal[0], 0]));
        assert!(!s.verify(&key(7), [seal[0] | 1 << 50, seal[1]]));
        assert!(seal.iter().all(|p| *p < 1 << PART_BITS));
    }

    #[test]
    fn field_boundaries_cannot_be_moved() {
        let a = HostSummary {
            host: "ab".into(),
            kinds: BTreeMap::from([(("c".into(), "d".into()), 1)]),
            ..HostSummary::default()
        };
        let b = HostSummary {
            host: "a".into(),
            kinds: BTreeMap::from([(("bc".into(), "d".into()), 1)]),
            ..HostSummary::default()
        };
        assert_ne!(a.canonical(), b.canonical());
    }

    #[test]
    fn a_key_file_others_may_read_or_too_short_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("gpusweep-seal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let p = dir.join("key");
        std::fs::write(&p, "0123456789abcdef0123456789abcdef\n").expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        assert!(matches!(
            SealKey::from_file(&p),
            Err(SealKeyError::Loose { mode: 0o640, .. })
        ));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(SealKey::from_file(&p).is_ok());
        // Never through a symbolic link.
        let link = dir.join("link");
        std::os::unix::fs::symlink(&p, &link).expect("symlink");
        assert!(matches!(
            SealKey::from_file(&link),
            Err(SealKeyError::Read { .. })
        ));
        std::fs::write(&p, "short\n").expect("write");
        assert!(matches!(
            SealKey::from_file(&p),
            Err(SealKeyError::Short { len: 5, .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
