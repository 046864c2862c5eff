//! One host's snapshot from what Prometheus holds of it: GPUs, memory, what its serve says (verdicts,
//! findings), and where it can be read live.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

pub(super) use super::answer::whole;
use super::answer::{Target, Up};
use crate::Sink;
use gpusweep_core::model::{
    Feature, Finding, FindingKind, Gpu, GpuState, HostSnapshot, MIB, Memory, Severity, SourceKind,
};
use gpusweep_core::seal::HostSummary;

/// A host of the fleet as the poller feeds it.
pub struct PromHost {
    pub name: String,
    pub sink: Arc<dyn Sink>,
    /// Set when the operator opened the host live (over HTTP or SSH): the poller leaves it alone.
    pub detached: Arc<AtomicBool>,
}

/// One GPU's identity: read once a minute (less often on a slow server), not at every poll (its sizes once
/// for its life).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Ident {
    pub(super) uuid: Option<String>,
    pub(super) model: Option<String>,
    pub(super) pci: Option<String>,
    pub(super) minor: Option<u32>,
    /// MiB: free + used (the total but for the reservation), and the reservation. Fixed for a GPU's life.
    pub(super) usable_mib: Option<f64>,
    pub(super) reserved_mib: Option<f64>,
    /// Its sizes were asked for (whatever came): they are not asked again while its UUID stays.
    pub(super) sized: bool,
}

#[derive(Debug, Default)]
pub(super) struct Identities {
    pub(super) gpus: HashMap<(String, u32), Ident>,
    /// Per host: every scrape target that named it within the lookback (a target that has just failed
    /// included: its silence is the host's, never leave for another to speak).
    pub(super) voices: HashMap<String, BTreeSet<Target>>,
    /// By (host, the scrape target that said it): a target speaks only for the host it is.
    pub(super) serve: HashMap<(String, String), (String, String)>,
    /// (host, scrape target) whose serve says its readings are simulated (a demo serve).
    pub(super) simulated: std::collections::HashSet<(String, String)>,
    /// Down targets that could not be asked which host they spoke for (past the limit, or a name no query
    /// can carry).
    pub(super) unasked_down: usize,
    pub(super) read_at: Option<Instant>,
    /// When every host's GPUs and serve were last asked for (not only those whose digest moved).
    pub(super) every_host_at: Option<Instant>,
    /// Each host's identity digests (`HOST_IDENTITY_DIGEST`), by the target that said each.
    pub(super) digests: HashMap<String, BTreeSet<(Target, u64)>>,
    /// Hosts whose series name them by `Hostname`: a narrowed read can ask for them.
    pub(super) by_hostname: std::collections::HashSet<String>,
}

/// What one poll says of one host.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct HostData {
    pub(super) gpus: BTreeMap<u32, GpuData>,
    /// Any gpusweep series: the host's verdicts come from its own serve.
    pub(super) gpusweep: bool,
    /// Its serve says NVML or one of its GPUs does not answer (`gpusweep_gpus_readable` 0).
    pub(super) gpus_unreadable: bool,
    pub(super) taken_s: Option<f64>,
    /// (kind, severity) -> count, for kinds other than the per-GPU unexplained ones.
    pub(super) counts: Vec<(String, String, f64)>,
    /// Every scrape target that sent a series naming this host: more than one is a conflict.
    pub(super) targets: BTreeSet<Target>,
    /// Read from the host's compact summary alone (`quick_table`): each GPU's state as its serve judged it,
    /// the bytes of its clean GPUs where they are 0; other bytes, and identities, are read at the next poll.
    pub(super) quick: bool,
    /// The summary's bytes used on the host's clean GPUs, summed.
    pub(super) clean_used: Option<f64>,
}

#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct GpuData {
    pub(super) used: Option<f64>,
    pub(super) clean: Option<f64>,
    pub(super) unreadable: bool,
    /// (kind, bytes; NaN when unknown).
    pub(super) unexplained: Vec<(String, f64)>,
    /// The state its serve judged, from a compact summary (see `HostData::quick`).
    pub(super) state: Option<GpuState>,
}

pub(super) fn mib(v: Option<f64>) -> Option<u64> {
    v.and_then(whole).map(|x| x.saturating_mul(MIB))
}

pub(super) fn kind_of(s: &str) -> Option<FindingKind> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).ok()
}

pub(super) fn severity_of(s: &str) -> Option<Severity> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).ok()
}

/// The findings a host's serve counts, by kind (the per-GPU unexplained ones are there already): its sealed
/// summary's where it is proven, else what its series say.
pub(super) fn count_findings(
    name: &str,
    d: &HostData,
    proven: Option<&HostSummary>,
    findings: &mut Vec<Finding>,
) {
    let counts: Vec<(&str, &str, f64)> = match proven {
        Some(p) => p
            .kinds
            .iter()
            .map(|((k, s), n)| (k.as_str(), s.as_str(), *n as f64))
            .collect(),
        None => d
            .counts
            .iter()
            .map(|(k, s, n)| (k.as_str(), s.as_str(), *n))
            .collect(),
    };
    for (kind, sev, n) in counts {
        let (Some(k), Some(s)) = (kind_of(kind), severity_of(sev)) else {
            continue;
        };
        if matches!(
            k,
            FindingKind::Ghost | FindingKind::Residual | FindingKind::HiddenHolder
        ) && findings.iter().any(|f| f.kind == k)
        {
            continue;
        }
        findings.push(Finding {
            kind: k,
            severity: s,
            host: name.to_string(),
            gpu: None,
            pid: None,
            bytes: None,
            detail: format!(
                "{} {} finding(s), as the host's gpusweep serve reports them to Prometheus",
                whole(n).unwrap_or(0),
                k.as_str()
            ),
            action: "open the host live (Enter in the TUI, or --hosts its serve) for the details"
                .into(),
            target_pid: None,
            gpu_instance: None,
            file: None,
            confirms_as: None,
        });
    }
}

/// One GPU of a host from what Prometheus holds of it: memory, and the state its serve judged where its
/// sealed summary proves it (`judged`; the runtime believes a "clean" only where these bytes agree). A
/// reading that rests on labels has no `judged`: the runtime judges its bytes, never clean (`Feature::Proof`).
pub(super) fn gpu(
    name: &str,
    index: u32,
    g: &GpuData,
    ids: &Identities,
    proven: Option<&HostSummary>,
) -> Gpu {
    let id = ids
        .gpus
        .get(&(name.to_string(), index))
        .cloned()
        .unwrap_or_default();
    let reserved = mib(id.reserved_mib);
    // A "clean" where its serve says it could not read every GPU is not one.
    let judged = proven.map(|p| match p.states().get(&index) {
        Some(GpuState::Clean) if p.readable == Some(false) => GpuState::Unknown,
        Some(s) => *s,
        None => GpuState::Unknown,
    });
    Gpu {
        index,
        uuid: id.uuid,
        name: id.model,
        pci_bus_id: id.pci,
        minor: id.minor,
        memory: Memory {
            used: mib(g.used),
            total: mib(id.usable_mib).map(|u| u + reserved.unwrap_or(0)),
            reserved,
        },
        error: g
            .unreadable
            .then(|| "its serve could not read this GPU".to_string()),
        judged,
        ..Default::default()
    }
}

/// The unexplained memory a host's serve reports for one GPU, as findings.
pub(super) fn unexplained(name: &str, index: u32, g: &GpuData, findings: &mut Vec<Finding>) {
    for (kind, bytes) in &g.unexplained {
        let Some(k) = kind_of(kind) else { continue };
        let bytes = whole(*bytes);
        findings.push(Finding {
            kind: k,
            severity: Severity::Leak,
            host: name.to_string(),
            gpu: Some(index),
            pid: None,
            bytes,
            detail: format!(
                "GPU {index}: {} of memory unexplained ({}), as the host's gpusweep serve reports to Prometheus",
                gpusweep_core::format::fmt_bytes(bytes),
                k.as_str()
            ),
            action: "open the host live (Enter in the TUI, or --hosts its serve) to see who holds it"
                .into(),
            target_pid: None,
            gpu_instance: None,
            file: None,
            confirms_as: None,
        });
    }
}

/// Where the host can be read live: its serve, at its own scrape target (an address Prometheus scrapes, as `up`
/// says; never one a label names) where its sealed summary proves it is the host's (the token goes nowhere
/// else), else SSH to its name where that is a host name alone (a user or a port is never taken from a
/// label). None otherwise.
pub(super) fn live_url(
    name: &str,
    d: &HostData,
    (ids, proven): (&Identities, bool),
    up: &Up,
) -> Option<String> {
    let serve = own_target(d).filter(|_| proven).and_then(|target| {
        let (scheme, path) = ids
            .serve
            .get(&(name.to_string(), target.instance.clone()))?;
        let authority =
            |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']');
        let inst = &target.instance;
        (up.get(target).is_some_and(|v| *v >= 1.0)
            && !inst.is_empty()
            && inst.chars().all(authority))
        .then(|| format!("{scheme}://{inst}{path}"))
    });
    serve.or_else(|| gpusweep_core::host::is_bare_host(name).then(|| format!("ssh://{name}")))
}

/// The one scrape target that speaks for the host (none when several or none do).
pub(super) fn own_target(d: &HostData) -> Option<&Target> {
    let mut targets = d.targets.iter();
    match (targets.next(), targets.next()) {
        (Some(t), None) => Some(t),
        _ => None,
    }
}

/// The snapshot of one host from what Prometheus holds of it: its serve's word where its sealed summary
/// (`proven`) proves it, labels otherwise (then `Feature::Proof` is missing).
pub(super) fn snapshot(
    name: &str,
    d: &HostData,
    (ids, proven): (&Identities, Option<&HostSummary>),
    up: &Up,
    polled_ms: u64,
) -> HostSnapshot {
    let mut gpus = Vec::new();
    let mut findings = Vec::new();
    // Every GPU its series name, and every GPU its proven summary names (a first view has no other).
    let mut indices: BTreeSet<u32> = d.gpus.keys().copied().collect();
    if let Some(p) = proven {
        indices.extend(p.states().keys());
    }
    let none = GpuData::default();
    for index in indices {
        let g = d.gpus.get(&index).unwrap_or(&none);
        unexplained(name, index, g, &mut findings);
        gpus.push(gpu(name, index, g, ids, proven));
    }
    count_findings(name, d, proven, &mut findings);
    findings.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.gpu.cmp(&b.gpu)));
    let mut missing = vec![Feature::Actions, Feature::Holders, Feature::Shm];
    if !d.gpusweep {
        missing.push(Feature::ProcessList);
    }
    if d.quick {
        missing.push(Feature::GpuDetail);
    }
    if proven.is_none() {
        missing.push(Feature::Proof);
    }
    let live_url = live_url(name, d, (ids, proven.is_some()), up);
    let unreadable = match proven {
        Some(p) => p.readable == Some(false),
        None => d.gpus_unreadable,
    };
    let gpu_error = unreadable.then(|| {
        "its gpusweep serve says the driver or one of its GPUs does not answer (gpusweep_gpus_readable 0)"
            .to_string()
    });
    HostSnapshot {
        host: name.to_string(),
        gpu_error,
        taken_at_ms: proven.map_or_else(|| d.taken_at_ms(polled_ms), |p| p.taken_ms),
        source: SourceKind::Prometheus,
        // A proven summary says it under the seal; a labels-only host as its own target's info says.
        simulated: proven.map_or_else(
            || {
                own_target(d).is_some_and(|t| {
                    ids.simulated
                        .contains(&(name.to_string(), t.instance.clone()))
                })
            },
            |p| p.simulated,
        ),
        gpus,
        missing_features: missing,
        findings,
        live_url,
        ..Default::default()
    }
}
