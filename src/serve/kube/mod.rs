//! `serve --kube-node NAME`: the serve puts its host's verdict where the scheduler reads it, on its own Node
//! only: the `GPUHeld` condition (server-side apply, field manager `gpusweep`), the
//! `gpusweep.io/gpu-held:NoSchedule` taint (a patch guarded by the Node's resourceVersion), Events on
//! transitions, and per-GPU device taints where the cluster serves DRA. `hold` decides what the node says
//! (pure), `body` words it for the API (pure), `api` (the `kube` feature) writes it.

#[cfg(feature = "kube")]
pub mod api;
pub mod body;
pub mod hold;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use hold::Held;

/// The taint's key, the condition's type and the field manager: the writer's keys, and the only ones it
/// touches.
pub const TAINT_KEY: &str = "gpusweep.io/gpu-held";
pub const CONDITION: &str = "GPUHeld";
pub const MANAGER: &str = "gpusweep";

/// How long a verdict must last before the node says it (held is said at once: the confirm window held it).
pub const DEFAULT_HOLD: Duration = Duration::from_secs(30);

/// Whether `name` is a Node's name (a DNS subdomain): the writer puts it in field selectors and object names,
/// so anything else is refused before it is used.
pub fn node_name_ok(name: &str) -> bool {
    let label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    !name.is_empty() && name.len() <= 253 && name.split('.').all(label)
}

/// `gpusweep serve`'s Kubernetes flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KubeArgs {
    /// Write this host's verdict to its Kubernetes Node NAME (the downward API's spec.nodeName): the
    /// GPUHeld condition, the gpusweep.io/gpu-held:NoSchedule taint while a GPU is held or unread, Events
    /// on transitions, device taints where DRA is served. The API is found as kubectl finds it ($KUBECONFIG,
    /// else the pod's service account). Needs a build with the `kube` feature.
    #[arg(long, value_name = "NAME", env = "GPUSWEEP_KUBE_NODE")]
    pub kube_node: Option<String>,
    /// How long an unread or clean verdict must last before the node says it (a leftover is said once the
    /// confirm window has passed).
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = crate::core::parse::duration_arg)]
    pub kube_hold: Duration,
}

/// What the writer did, for `/metrics` and `/healthz`.
#[derive(Debug, Default)]
pub struct KubeStatus {
    pub node: String,
    writes: AtomicU64,
    failed: AtomicU64,
    /// Guarded taint patches that met a Node changed since it was read (and were read again).
    conflicts: AtomicU64,
    /// Transitions decided and not yet told to the API.
    pending: AtomicUsize,
    said: Mutex<Said>,
}

#[derive(Debug, Default)]
struct Said {
    /// What the node says, as last written.
    held: Option<Held>,
    /// Since when writes fail, and the last failure.
    failing: Option<(u64, String)>,
}

impl KubeStatus {
    pub fn new(node: &str) -> KubeStatus {
        KubeStatus {
            node: node.to_string(),
            ..KubeStatus::default()
        }
    }

    /// One request the API took.
    pub fn wrote(&self, held: Option<Held>) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut s) = self.said.lock() {
            s.failing = None;
            if held.is_some() {
                s.held = held;
            }
        }
    }

    /// One request that failed, and why.
    pub fn failed(&self, now_ms: u64, why: &str) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut s) = self.said.lock() {
            let since = s.failing.as_ref().map_or(now_ms, |f| f.0);
            s.failing = Some((since, why.to_string()));
        }
    }

    pub fn conflict(&self) {
        self.conflicts.fetch_add(1, Ordering::Relaxed);
    }

    pub fn set_pending(&self, n: usize) {
        self.pending.store(n, Ordering::Relaxed);
    }

    /// `/healthz`'s line when the node could not be written: the serve stays healthy (its GPU readings are
    /// fine), and whoever reads it learns the node's condition is stale.
    pub fn health_note(&self) -> Option<String> {
        let s = self.said.lock().ok()?;
        let (since, why) = s.failing.as_ref()?;
        let pending = match self.pending.load(Ordering::Relaxed) {
            0 => String::new(),
            1 => "; 1 transition not yet told".into(),
            n => format!("; {n} transitions not yet told"),
        };
        Some(format!(
            "kube: node {}'s GPUHeld condition could not be written since {} ({} ago): {}{pending}",
            crate::core::format::escape(&self.node),
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + Duration::from_millis(*since)
            ),
            crate::core::format::fmt_ms(crate::core::model::now_ms().saturating_sub(*since)),
            crate::core::format::escape(why)
        ))
    }

    /// `gpusweep_kube_writes_total`, `gpusweep_kube_writes_failed_total`, `gpusweep_kube_conflicts_total` and
    /// `gpusweep_kube_node_held`
    /// (1 held, 0 clean, -1 unread, absent until written).
    pub fn register(&self, r: &mut Registry) {
        for (name, help, n) in [
            (
                "gpusweep_kube_writes",
                "Requests the Kubernetes API took from this serve's node writer",
                &self.writes,
            ),
            (
                "gpusweep_kube_writes_failed",
                "Requests of this serve's node writer that failed (the node's condition may be stale)",
                &self.failed,
            ),
            (
                "gpusweep_kube_conflicts",
                "Taint patches that met a Node another writer had changed since it was read (read again, retried)",
                &self.conflicts,
            ),
        ] {
            let c = Counter::<u64>::default();
            c.inc_by(n.load(Ordering::Relaxed));
            r.register(name, help, c);
        }
        let held = self.said.lock().ok().and_then(|s| s.held);
        if let Some(h) = held {
            let g = Gauge::<i64>::default();
            g.set(match h {
                Held::Yes => 1,
                Held::No => 0,
                Held::Unread => -1,
            });
            r.register(
                "gpusweep_kube_node_held",
                "The GPUHeld condition this serve last wrote: 1 True, 0 False, -1 Unknown",
                g,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_a_dns_subdomain_is_a_node_name() {
        for ok in ["gpu-a", "node-7.example.com", "a"] {
            assert!(super::node_name_ok(ok), "{ok}");
        }
        for bad in [
            "",
            "Gpu-A",
            "a,metadata.name=b",
            "-a",
            "a..b",
            "a_b",
            &"x".repeat(254),
        ] {
            assert!(!super::node_name_ok(bad), "{bad}");
        }
    }
}
