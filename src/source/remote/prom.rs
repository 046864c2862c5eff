//! `prom:` fleets: every host a Prometheus server knows, read through its HTTP API. Where the host runs
//! `gpusweep serve`, its own verdicts come through (clean, leak, findings by kind); where only dcgm-exporter
//! runs, its memory per GPU, and "clean" only where nothing is used (the process list is a named blind
//! spot). One poll is a handful of aggregated queries for the whole fleet, whatever its size; a host whose
//! reading did not change is only marked fresh. Read-only: kills and removals are refused, saying how to act.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::sync::mpsc;

use super::http::HttpClient;
use crate::core::format::{escape, truncate};
use crate::core::metrics as m;
use crate::core::model::{
    Feature, Finding, FindingKind, Gpu, GpuState, HostSnapshot, MIB, Memory, Severity, SourceKind,
};
use crate::source::{ConnStatus, HostCmd, Refuse, Sink};

/// Prometheus data moves at its scrape interval; polling it faster than this buys nothing.
pub const MIN_PROM_INTERVAL: Duration = Duration::from_secs(1);
/// Identities (UUID, model, bus, where a serve answers) are read again this often.
const IDENTITY_EVERY: Duration = Duration::from_secs(60);

/// A Prometheus server and the selector that narrows it to the fleet: the spec as parsed.
pub type PromServer = crate::core::host::PromSpec;

#[derive(Deserialize)]
struct Answer<'a> {
    #[serde(borrow)]
    status: Cow<'a, str>,
    #[serde(borrow)]
    data: Option<Data<'a>>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct Data<'a> {
    #[serde(borrow, deserialize_with = "at_most_max_series")]
    result: Vec<Sample<'a>>,
}

/// The most series one answer may hold. Every query is aggregated per host and GPU: 10,000 hosts of 8 GPUs
/// answer with 80,000. A sample costs ~340 bytes once parsed, ten times its text, so an answer of tiny
/// samples would otherwise turn 128 MiB into gigabytes.
const MAX_SERIES: usize = 500_000;

/// An answer's samples, refused past `MAX_SERIES` before more are held.
fn at_most_max_series<'de: 'a, 'a, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<Sample<'a>>, D::Error> {
    struct Capped<'a>(std::marker::PhantomData<Sample<'a>>);
    impl<'de: 'a, 'a> serde::de::Visitor<'de> for Capped<'a> {
        type Value = Vec<Sample<'a>>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "at most {MAX_SERIES} samples")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
            while let Some(x) = seq.next_element()? {
                if out.len() == MAX_SERIES {
                    return Err(serde::de::Error::custom(format!(
                        "more than {MAX_SERIES} series in one answer"
                    )));
                }
                out.push(x);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Capped(std::marker::PhantomData))
}

/// A string of an answer, borrowed from it unless it holds an escape. (`#[serde(borrow)]` does not reach
/// through an `Option` or a tuple: a bare `Option<Cow<str>>` would allocate every label of every sample.)
#[derive(Deserialize, Debug)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// One sample of an instant query, borrowing from the answer: a thousand hosts' answer costs next to no
/// allocation. Only the labels gpusweep reads are kept; the rest are skipped, and so is the sample's time.
#[derive(Deserialize)]
struct Sample<'a> {
    #[serde(borrow)]
    metric: Labels<'a>,
    #[serde(borrow)]
    value: (serde::de::IgnoredAny, Text<'a>),
}

#[derive(Deserialize, Default)]
struct Labels<'a> {
    #[serde(borrow, rename = "Hostname")]
    hostname: Option<Text<'a>>,
    /// dcgm-exporter's spelling since its PR #655.
    #[serde(borrow, rename = "hostname")]
    hostname_new: Option<Text<'a>>,
    #[serde(borrow)]
    instance: Option<Text<'a>>,
    #[serde(borrow)]
    job: Option<Text<'a>>,
    #[serde(borrow)]
    gpu: Option<Text<'a>>,
    #[serde(borrow)]
    kind: Option<Text<'a>>,
    #[serde(borrow)]
    severity: Option<Text<'a>>,
    #[serde(borrow, rename = "UUID")]
    uuid: Option<Text<'a>>,
    #[serde(borrow, rename = "modelName")]
    model: Option<Text<'a>>,
    #[serde(borrow)]
    pci_bus_id: Option<Text<'a>>,
    #[serde(borrow)]
    device: Option<Text<'a>>,
    #[serde(borrow)]
    scheme: Option<Text<'a>>,
    #[serde(borrow)]
    api_path: Option<Text<'a>>,
    #[serde(borrow)]
    simulated: Option<Text<'a>>,
}

impl Sample<'_> {
    fn label(&self, k: &str) -> Option<&str> {
        let l = &self.metric;
        let text = match k {
            "Hostname" => &l.hostname,
            "hostname" => &l.hostname_new,
            "instance" => &l.instance,
            "job" => &l.job,
            "gpu" => &l.gpu,
            "kind" => &l.kind,
            "severity" => &l.severity,
            "UUID" => &l.uuid,
            "modelName" => &l.model,
            "pci_bus_id" => &l.pci_bus_id,
            "device" => &l.device,
            "scheme" => &l.scheme,
            "api_path" => &l.api_path,
            "simulated" => &l.simulated,
            _ => return None,
        };
        text.as_ref().map(|t| &*t.0)
    }
    fn value(&self) -> Option<f64> {
        self.value.1.0.parse::<f64>().ok()
    }
    /// The host it belongs to: its `Hostname` (dcgm-exporter's and gpusweep's label), else `hostname`
    /// (newer dcgm-exporters'), else `instance`.
    fn host(&self) -> Option<&str> {
        self.label(m::L_HOSTNAME)
            .filter(|h| !h.is_empty())
            .or_else(|| self.label(m::L_HOSTNAME_NEW).filter(|h| !h.is_empty()))
            .or_else(|| self.label("instance"))
    }
    fn gpu(&self) -> Option<u32> {
        self.label(m::L_GPU)?.parse().ok()
    }
    /// The scrape target that sent it, as Prometheus itself labels it (`job`, `instance`): not something the
    /// target can choose.
    fn target(&self) -> Target {
        Target {
            job: self.label("job").unwrap_or("").to_string(),
            instance: self.label("instance").unwrap_or("").to_string(),
        }
    }
}

/// A scrape target: Prometheus's own `job` and `instance` labels. A host is judged only from the series of
/// one target; two targets speaking for one host are a conflict.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Target {
    pub job: String,
    pub instance: String,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "job={:?} instance={:?}",
            escape(&self.job),
            escape(&self.instance)
        )
    }
}

/// Why a host's series cannot be trusted: more than one scrape target reports it.
fn conflict(name: &str, targets: &BTreeSet<Target>) -> Option<String> {
    if targets.len() < 2 {
        return None;
    }
    let list: Vec<String> = targets.iter().map(ToString::to_string).collect();
    Some(format!(
        "{} scrape targets report host {:?} ({}): its verdict cannot be trusted; narrow the fleet to one of \
         them, e.g. prom:URL?{{job=\"...\"}}",
        targets.len(),
        escape(name),
        list.join("; ")
    ))
}

/// What this source asks of a Prometheus server, for the spec that names it (the spec is core's word; asking
/// is this source's).
trait Query {
    fn sel(&self, name: &str) -> String;
    fn sel_only(&self, name: &str, only: Option<&str>) -> String;
    async fn fetch(
        &self,
        http: &HttpClient,
        q: &str,
        spent: &AtomicUsize,
    ) -> Result<bytes::Bytes, String>;
    fn samples<'a>(&self, body: &'a [u8]) -> Result<Vec<Sample<'a>>, String>;
    async fn discover(&self, http: &HttpClient) -> Result<Vec<String>, String>;
}

/// The hosts a Prometheus server knows (see `Query::discover`).
pub async fn discover(server: &PromServer, http: &HttpClient) -> Result<Vec<String>, String> {
    server.discover(http).await
}

impl Query for PromServer {
    /// `name{selector}`.
    fn sel(&self, name: &str) -> String {
        self.sel_only(name, None)
    }

    /// `name{selector,only}`: the selector narrowed by one more matcher (some hosts' `Hostname`).
    fn sel_only(&self, name: &str, only: Option<&str>) -> String {
        let sel = self.selector.as_ref().map_or("", |s| s.as_str());
        match only {
            Some(o) if sel.is_empty() => format!("{name}{{{o}}}"),
            Some(o) => format!("{name}{{{sel},{o}}}"),
            None => format!("{name}{{{sel}}}"),
        }
    }

    /// Ask one instant query; the answer's bytes, at most `MAX_ANSWER` of them, and at most what is left of
    /// `spent`'s share of `MAX_ROUND` for the queries asked together (a server, or whatever answers at its
    /// address, could otherwise make the client hold any amount).
    async fn fetch(
        &self,
        http: &HttpClient,
        q: &str,
        spent: &AtomicUsize,
    ) -> Result<bytes::Bytes, String> {
        let failed = |e: reqwest::Error| format!("Prometheus {}: {}", self.url, short(&e));
        let asked = Instant::now();
        let mut resp = http
            .client
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", q)])
            .send()
            .await
            .map_err(failed)?;
        let too_big = || {
            format!(
                "Prometheus {}: an answer larger than {} MiB (narrow the fleet with ?{{...}})",
                self.url,
                MAX_ANSWER / (1024 * 1024)
            )
        };
        if resp.content_length().is_some_and(|n| n > MAX_ANSWER as u64) {
            return Err(too_big());
        }
        // Sized once where the length is said: grown by doubling, a 40 MiB answer passed through 64 MiB.
        let said = resp.content_length().and_then(|n| usize::try_from(n).ok());
        let mut body = bytes::BytesMut::with_capacity(said.unwrap_or(0));
        while let Some(chunk) = resp.chunk().await.map_err(failed)? {
            let before = spent.fetch_add(chunk.len(), Ordering::Relaxed);
            if body.len() + chunk.len() > MAX_ANSWER || before + chunk.len() > MAX_ROUND {
                return Err(too_big());
            }
            body.extend_from_slice(&chunk);
        }
        if crate::core::trace::on() {
            crate::core::trace::trace(
                &self.url.to_string(),
                &format!(
                    "{} bytes in {} ms: {}",
                    body.len(),
                    asked.elapsed().as_millis(),
                    truncate(q, 90)
                ),
            );
        }
        Ok(body.freeze())
    }

    /// The samples of an answer, borrowed from it.
    fn samples<'a>(&self, body: &'a [u8]) -> Result<Vec<Sample<'a>>, String> {
        let a: Answer = serde_json::from_slice(body).map_err(|e| {
            if e.to_string().contains("series in one answer") {
                return format!(
                    "Prometheus {}: more than {MAX_SERIES} series in one answer (narrow the fleet with ?{{...}})",
                    self.url
                );
            }
            format!(
                "Prometheus {}: not an answer of its API: {:?}",
                self.url,
                truncate(&escape(String::from_utf8_lossy(body).trim()), 80)
            )
        })?;
        if a.status != "success" {
            return Err(format!(
                "Prometheus {}: {}",
                self.url,
                escape(a.error.as_deref().unwrap_or("query failed"))
            ));
        }
        Ok(a.data.map(|d| d.result).unwrap_or_default())
    }

    /// The hosts it knows: every `Hostname` (or `instance`) with GPU memory or a serve's readings in the last
    /// ten minutes, so a node whose exporter just died is still there (and reported as unreadable, not left
    /// out of a verdict); and every target Prometheus cannot scrape, named by its instance, that no series
    /// ever named.
    async fn discover(&self, http: &HttpClient) -> Result<Vec<String>, String> {
        let lb = lookback();
        let seen = format!(
            "max by (Hostname, hostname, instance) (last_over_time({{__name__=~\"{}|{}\"{}}}[{lb}]))",
            m::FB_USED,
            m::READING_TIMESTAMP,
            self.selector
                .as_ref()
                .map(|s| format!(",{s}"))
                .unwrap_or_default()
        );
        let down = format!("{} == 0", self.sel("up"));
        let spent = AtomicUsize::new(0);
        let (seen, down) = tokio::join!(
            self.fetch(http, &seen, &spent),
            self.fetch(http, &down, &spent)
        );
        let (seen, down) = (seen?, down.unwrap_or_default());
        let seen = self.samples(&seen)?;
        let down = self.samples(&down).unwrap_or_default();
        let mut names: Vec<String> = seen
            .iter()
            .filter_map(|s| s.host().map(str::to_string))
            .collect();
        let known: std::collections::HashSet<&str> =
            seen.iter().filter_map(|s| s.label("instance")).collect();
        names.extend(
            down.iter()
                .filter_map(|s| s.label("instance"))
                .filter(|i| !known.contains(i))
                .map(str::to_string),
        );
        names.sort();
        names.dedup();
        if names.len() > MAX_HOSTS {
            return Err(format!(
                "Prometheus {}: {} hosts, more than the {MAX_HOSTS} one client reads (narrow the fleet with ?{{...}})",
                self.url,
                names.len()
            ));
        }
        Ok(names)
    }
}

/// How far back a host counts as part of the fleet (Prometheus keeps a dead target's last samples): 10
/// minutes, or `GPUSWEEP_PROM_LOOKBACK` (a Prometheus duration such as `30m`, `2h`).
fn lookback() -> &'static str {
    static LOOKBACK: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LOOKBACK.get_or_init(|| {
        std::env::var("GPUSWEEP_PROM_LOOKBACK")
            .ok()
            .filter(|v| {
                let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
                let unit = &v[digits.len()..];
                !digits.is_empty()
                    && digits.bytes().all(|b| b.is_ascii_digit())
                    && matches!(unit, "ms" | "s" | "m" | "h" | "d")
            })
            .unwrap_or_else(|| "10m".to_string())
    })
}

/// The largest answer a query may have: every query is aggregated per host and GPU, so 10,000 hosts of 8
/// GPUs answer in about 25 MiB.
const MAX_ANSWER: usize = 128 * 1024 * 1024;

/// The most hosts one `prom:` fleet may name: each is a host of its own in the client (its ledger, its
/// channel), so a Prometheus could otherwise make the client build millions.
const MAX_HOSTS: usize = 20_000;

/// The most that the queries asked together (a poll's seven, identities' four) may answer in all.
const MAX_ROUND: usize = 192 * 1024 * 1024;

fn short(e: &reqwest::Error) -> String {
    use std::error::Error as _;
    let mut s = e.to_string();
    if let Some(c) = e.source() {
        s.push_str(": ");
        s.push_str(&c.to_string());
    }
    truncate(&escape(&s), 200)
}

/// A host of the fleet as the poller feeds it.
pub struct PromHost {
    pub name: String,
    pub sink: Arc<dyn Sink>,
    /// Set when the operator opened the host live (over HTTP or SSH): the poller leaves it alone.
    pub detached: Arc<AtomicBool>,
}

/// One GPU's identity: read once a minute, not at every poll.
#[derive(Debug, Clone, Default)]
struct Ident {
    uuid: Option<String>,
    model: Option<String>,
    pci: Option<String>,
    minor: Option<u32>,
    /// MiB: free + used (the total but for the reservation), and the reservation. Fixed for a GPU's life.
    usable_mib: Option<f64>,
    reserved_mib: Option<f64>,
}

#[derive(Debug, Default)]
struct Identities {
    gpus: HashMap<(String, u32), Ident>,
    /// Per host: every scrape target that named it within the lookback (a target that has just failed
    /// included: its silence is the host's, never leave for another to speak).
    voices: HashMap<String, BTreeSet<Target>>,
    /// By (host, the scrape target that said it): a target speaks only for the host it is.
    serve: HashMap<(String, String), (String, String)>,
    /// (host, scrape target) whose serve says its readings are simulated (a demo serve).
    simulated: std::collections::HashSet<(String, String)>,
    /// Down targets that could not be asked which host they spoke for (past the limit, or a name no query
    /// can carry).
    unasked_down: usize,
    read_at: Option<Instant>,
}

/// What one poll says of one host.
#[derive(Debug, Default, Clone, PartialEq)]
struct HostData {
    gpus: BTreeMap<u32, GpuData>,
    /// Any gpusweep series: the host's verdicts come from its own serve.
    gpusweep: bool,
    /// Its serve says NVML or one of its GPUs does not answer (`gpusweep_gpus_readable` 0).
    gpus_unreadable: bool,
    taken_s: Option<f64>,
    /// (kind, severity) -> count, for kinds other than the per-GPU unexplained ones.
    counts: Vec<(String, String, f64)>,
    /// Every scrape target that sent a series naming this host: more than one is a conflict.
    targets: BTreeSet<Target>,
}

#[derive(Debug, Default, Clone, PartialEq)]
struct GpuData {
    used: Option<f64>,
    clean: Option<f64>,
    unreadable: bool,
    /// (kind, bytes; NaN when unknown).
    unexplained: Vec<(String, f64)>,
}

/// A sample as a whole number; a NaN, an infinity or a negative number is no reading.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // checked finite and >= 0 first
fn whole(x: f64) -> Option<u64> {
    (x.is_finite() && x >= 0.0).then_some(x as u64)
}

fn mib(v: Option<f64>) -> Option<u64> {
    v.and_then(whole).map(|x| x.saturating_mul(MIB))
}

fn kind_of(s: &str) -> Option<FindingKind> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).ok()
}

fn severity_of(s: &str) -> Option<Severity> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).ok()
}

/// The findings a host's serve counts, by kind (the per-GPU unexplained ones are there already).
fn count_findings(name: &str, d: &HostData, findings: &mut Vec<Finding>) {
    for (kind, sev, n) in &d.counts {
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
                whole(*n).unwrap_or(0),
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

/// One GPU of a host from what Prometheus holds of it: memory, and what the host's serve says of it.
fn gpu(name: &str, index: u32, g: &GpuData, d: &HostData, ids: &Identities) -> Gpu {
    let id = ids
        .gpus
        .get(&(name.to_string(), index))
        .cloned()
        .unwrap_or_default();
    let reserved = mib(id.reserved_mib);
    // What the host's serve says; the runtime believes a "clean" only where these bytes agree. A serve that
    // says it cannot read its GPUs judges none of them clean, whatever else it sends.
    let judged = d.gpusweep.then_some(match g.clean {
        _ if d.gpus_unreadable && (g.unreadable || g.used.is_none()) => GpuState::Error,
        Some(c) if c >= 1.0 && !d.gpus_unreadable => GpuState::Clean,
        Some(c) if c >= 1.0 => GpuState::Unknown,
        Some(_) if !g.unexplained.is_empty() => GpuState::Leak,
        Some(_) => GpuState::InUse,
        None if g.unreadable => GpuState::Error,
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
fn unexplained(name: &str, index: u32, g: &GpuData, findings: &mut Vec<Finding>) {
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
                crate::core::format::fmt_bytes(bytes),
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
/// says; never one a label names), else SSH to its name where that is a host name alone (a user or a port is
/// never taken from a label). None otherwise.
fn live_url(name: &str, d: &HostData, ids: &Identities, up: &Up) -> Option<String> {
    let serve = own_target(d).and_then(|target| {
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
    serve.or_else(|| crate::core::host::is_bare_host(name).then(|| format!("ssh://{name}")))
}

/// The one scrape target that speaks for the host (none when several or none do).
fn own_target(d: &HostData) -> Option<&Target> {
    let mut targets = d.targets.iter();
    match (targets.next(), targets.next()) {
        (Some(t), None) => Some(t),
        _ => None,
    }
}

/// The snapshot of one host from what Prometheus holds of it.
fn snapshot(name: &str, d: &HostData, ids: &Identities, up: &Up, polled_ms: u64) -> HostSnapshot {
    let mut gpus = Vec::new();
    let mut findings = Vec::new();
    for (&index, g) in &d.gpus {
        unexplained(name, index, g, &mut findings);
        gpus.push(gpu(name, index, g, d, ids));
    }
    count_findings(name, d, &mut findings);
    findings.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.gpu.cmp(&b.gpu)));
    let mut missing = vec![Feature::Actions, Feature::Holders, Feature::Shm];
    if !d.gpusweep {
        missing.push(Feature::ProcessList);
    }
    let live_url = live_url(name, d, ids, up);
    let gpu_error = d.gpus_unreadable.then(|| {
        "its gpusweep serve says the driver or one of its GPUs does not answer (gpusweep_gpus_readable 0)"
            .to_string()
    });
    HostSnapshot {
        host: name.to_string(),
        gpu_error,
        taken_at_ms: d.taken_at_ms(polled_ms),
        source: SourceKind::Prometheus,
        simulated: own_target(d).is_some_and(|t| {
            ids.simulated
                .contains(&(name.to_string(), t.instance.clone()))
        }),
        gpus,
        missing_features: missing,
        findings,
        live_url,
        ..Default::default()
    }
}

/// The queries of one poll, each aggregated by host (and GPU) so the answer stays small at a thousand hosts.
struct Queries {
    used: String,
    clean: String,
    unreadable: String,
    unexplained: String,
    findings: String,
    taken: String,
    up: String,
}

impl Queries {
    /// Every host's series, or (`only`, a matcher on `Hostname`) those of some hosts.
    fn new(p: &PromServer, only: Option<&str>) -> Queries {
        let lb = lookback();
        let sel = |name: &str| p.sel_only(name, only);
        let by_gpu = |name: &str| {
            format!(
                "max by (Hostname, hostname, job, instance, gpu) ({})",
                sel(name)
            )
        };
        Queries {
            // A GPU in MIG mode has one series per instance (`GPU_I_ID`): their sum is the GPU's.
            used: format!(
                "sum by (Hostname, hostname, job, instance, gpu) (max by (Hostname, hostname, job, \
                 instance, gpu, {}) ({}))",
                m::L_GPU_I_ID,
                sel(m::FB_USED)
            ),
            clean: by_gpu(m::GPU_CLEAN),
            // A GPU its serve could not read; and (without a `gpu` label) a host whose serve says the
            // driver or one of its GPUs does not answer.
            unreadable: format!(
                "({} == 0) or (max by (Hostname, hostname, job, instance) ({}) == 0)",
                by_gpu(m::GPU_READABLE),
                sel(m::GPUS_READABLE)
            ),
            unexplained: format!(
                "max by (Hostname, hostname, job, instance, gpu, kind) ({})",
                sel(m::UNEXPLAINED_BYTES)
            ),
            findings: format!(
                "max by (Hostname, hostname, job, instance, kind, severity) ({}) > 0",
                sel(m::FINDINGS)
            ),
            taken: format!(
                "max by (Hostname, hostname, job, instance) ({} or timestamp({}))",
                sel(m::READING_TIMESTAMP),
                sel(m::FB_USED)
            ),
            // `up` of the scrape targets whose series the selector picks: Prometheus's own word on which
            // addresses it scrapes (a target's labels cannot add one), whatever labels the selector names.
            up: format!(
                "max by (job, instance) (up and on (job, instance) group by (job, instance) \
                 (last_over_time({}[{lb}]) or last_over_time({}[{lb}]))) \
                 or max by (job, instance) (up == 0)",
                sel(m::FB_USED),
                sel(m::SERVE_INFO)
            ),
        }
    }
}

/// The first, cheap step of every poll: one series per host of a serve, its revision and its reading's
/// time. Only hosts whose revision moved (or that have none: dcgm-exporter's, a serve before revisions)
/// have their other series read again; at ten thousand hosts most polls touch a tenth of the series.
struct GlanceQueries {
    revision: String,
    taken: String,
}

impl GlanceQueries {
    fn new(p: &PromServer) -> GlanceQueries {
        let by_host = |name: &str| {
            format!(
                "max by (Hostname, hostname, job, instance) ({})",
                p.sel(name)
            )
        };
        GlanceQueries {
            revision: by_host(m::READING_REVISION),
            taken: by_host(m::READING_TIMESTAMP),
        }
    }
}

/// What a glance read, by each name's place in `Names`: the revision (None where absent, or where more than
/// one series names the host: a conflict is for the whole read to find) and the reading's time.
struct Glance {
    revision: Vec<Option<f64>>,
    taken: Vec<Option<f64>>,
    /// Its revision's series names it by `Hostname` (as a serve does): a narrowed read can ask for it.
    by_hostname: Vec<bool>,
    /// The scrape target that sent its revision: another than the one its reading was believed from is news.
    target: Vec<Option<Target>>,
}

/// One host's part of a glance.
struct Seen {
    revision: Option<f64>,
    taken: Option<f64>,
    by_hostname: bool,
    target: Option<Target>,
}

async fn glance(
    server: &PromServer,
    http: &HttpClient,
    q: &GlanceQueries,
    names: &Names,
) -> Result<Glance, String> {
    let spent = AtomicUsize::new(0);
    let (revision, taken) = tokio::join!(
        server.fetch(http, &q.revision, &spent),
        server.fetch(http, &q.taken, &spent)
    );
    let (revision, taken) = (revision?, taken?);
    let revision = server.samples(&revision)?;
    let taken = server.samples(&taken)?;
    let revision = sole_per_host(&revision, names);
    Ok(Glance {
        revision: revision.iter().map(|s| s.and_then(Sample::value)).collect(),
        by_hostname: revision
            .iter()
            .map(|s| s.is_some_and(|s| s.label(m::L_HOSTNAME).is_some_and(|h| !h.is_empty())))
            .collect(),
        target: revision.iter().map(|s| s.map(Sample::target)).collect(),
        taken: sole_per_host(&taken, names)
            .iter()
            .map(|s| s.and_then(Sample::value))
            .collect(),
    })
}

/// Each name's one sample, by its place in `names`: None where there is none, or more than one.
fn sole_per_host<'s, 'a>(samples: &'s [Sample<'a>], names: &Names) -> Vec<Option<&'s Sample<'a>>> {
    let mut out: Vec<Option<&Sample>> = vec![None; names.len()];
    let mut seen = vec![0u8; names.len()];
    for sample in samples {
        let Some(at) = sample.host().and_then(|h| names.of(h)) else {
            continue;
        };
        seen[at] = seen[at].saturating_add(1);
        out[at] = (seen[at] == 1).then_some(sample);
    }
    out
}

/// The most bytes of a `Hostname` matcher a narrowed read names; past it every host is read.
const MAX_ONLY: usize = 16 * 1024;

/// `Hostname=~"a|b"` naming these hosts, regular-expression and PromQL escaped; None when one is not named by
/// `Hostname` or not a plain name (then every host is read: nothing a target said goes into a query), or
/// when they are too many. Narrowed by the host's name, not its target: every target's series naming the
/// host come, so two targets speaking for one host are still found.
fn only_hosts<'a>(names: impl Iterator<Item = Option<&'a str>>) -> Option<String> {
    let plain =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']');
    let mut alts: Vec<&str> = Vec::new();
    for name in names {
        alts.push(name.filter(|n| !n.is_empty() && n.chars().all(plain))?);
    }
    alts.sort_unstable();
    alts.dedup();
    let mut out = format!("{}=~\"", m::L_HOSTNAME);
    for (k, a) in alts.iter().enumerate() {
        if k > 0 {
            out.push('|');
        }
        for c in a.chars() {
            // A regular expression's metacharacter, its backslash doubled inside a PromQL string.
            if matches!(c, '.' | '[' | ']') {
                out.push_str("\\\\");
            }
            out.push(c);
        }
        if out.len() > MAX_ONLY {
            return None;
        }
    }
    out.push('"');
    Some(out)
}

/// The four queries of an identity read: GPU identities, serves, usable and reserved memory.
fn identity_queries(p: &PromServer) -> [String; 4] {
    let lb = lookback();
    [
        format!(
            "max by (Hostname, hostname, job, instance, gpu, UUID, modelName, pci_bus_id, device) (last_over_time({}[{lb}]))",
            p.sel(m::FB_USED)
        ),
        format!(
            "max by (Hostname, hostname, job, instance, scheme, api_path, simulated) (last_over_time({}[{lb}]))",
            p.sel(m::SERVE_INFO)
        ),
        format!(
            "max by (Hostname, hostname, gpu) (last_over_time({}[{lb}]) + last_over_time({}[{lb}]))",
            p.sel(m::FB_FREE),
            p.sel(m::FB_USED)
        ),
        format!(
            "max by (Hostname, hostname, gpu) (last_over_time({}[{lb}]))",
            p.sel(m::FB_RESERVED)
        ),
    ]
}

/// Read identities: GPU UUIDs, models, buses; each host's scrape target and serve.
async fn identities(p: &PromServer, http: &HttpClient) -> Result<Identities, String> {
    let [gpus_q, serve_q, usable_q, reserved_q] = identity_queries(p);
    let spent = AtomicUsize::new(0);
    let (gpu_body, serve_body, usable_body, reserved_body) = tokio::join!(
        p.fetch(http, &gpus_q, &spent),
        p.fetch(http, &serve_q, &spent),
        p.fetch(http, &usable_q, &spent),
        p.fetch(http, &reserved_q, &spent)
    );
    let (gpu_body, serve_body) = (gpu_body?, serve_body?);
    let (usable_body, reserved_body) = (usable_body?, reserved_body?);
    let mut ids = Identities {
        read_at: Some(Instant::now()),
        ..Default::default()
    };
    ids.gpus_from(&p.samples(&gpu_body)?);
    ids.sizes_from(&p.samples(&usable_body)?, true);
    ids.sizes_from(&p.samples(&reserved_body)?, false);
    ids.serves_from(&p.samples(&serve_body)?);
    down_voices(p, http, &mut ids).await?;
    Ok(ids)
}

/// How far back a target that is down now is asked which host it spoke for: past the lookback, a host
/// whose own target has been down for an hour is still that target's (and not an impostor's to speak for).
const DOWN_LOOKBACK: &str = "7d";

/// The most down targets asked about, in matchers of at most `MAX_ONLY` bytes each: as many as a fleet
/// may have hosts.
const MAX_DOWN_ASKED: usize = MAX_HOSTS;

/// Every target Prometheus scrapes that is down now, and the host its series last named within
/// `DOWN_LOOKBACK`: a voice of that host for as long as Prometheus keeps scraping it. Few targets are down
/// at once, so their old series are read by instance alone.
async fn down_voices(
    p: &PromServer,
    http: &HttpClient,
    ids: &mut Identities,
) -> Result<(), String> {
    let spent = AtomicUsize::new(0);
    let body = p
        .fetch(http, "max by (job, instance) (up == 0)", &spent)
        .await?;
    let samples = p.samples(&body)?;
    let down: BTreeSet<&str> = samples.iter().filter_map(|s| s.label("instance")).collect();
    let names = format!("{}|{}", m::SERVE_INFO, m::FB_USED);
    let sel = p
        .selector
        .as_ref()
        .map(|s| format!(",{s}"))
        .unwrap_or_default();
    let (matchers, skipped) = instance_matchers(down.into_iter(), MAX_DOWN_ASKED);
    // A down target not asked about may be any host's own: no host's word stands alone then.
    ids.unasked_down = skipped;
    for matcher in matchers {
        let q = format!(
            "max by (Hostname, hostname, job, instance) (last_over_time({{__name__=~\"{names}\",{matcher}{sel}}}[{DOWN_LOOKBACK}]))"
        );
        let body = p.fetch(http, &q, &spent).await?;
        for x in p.samples(&body)? {
            if let Some(host) = x.host() {
                ids.voices
                    .entry(host.to_string())
                    .or_default()
                    .insert(x.target());
            }
        }
    }
    Ok(())
}

impl Identities {
    /// Each GPU's UUID, model, bus and minor; each host's scrape target.
    fn gpus_from(&mut self, samples: &[Sample]) {
        for x in samples {
            let (Some(host), Some(gpu)) = (x.host(), x.gpu()) else {
                continue;
            };
            self.voices
                .entry(host.to_string())
                .or_default()
                .insert(x.target());
            let nonempty = |k: &str| x.label(k).filter(|v| !v.is_empty()).map(str::to_string);
            self.gpus.insert(
                (host.to_string(), gpu),
                Ident {
                    uuid: nonempty(m::L_UUID),
                    model: nonempty(m::L_MODEL),
                    pci: nonempty(m::L_PCI_BUS_ID),
                    minor: x
                        .label(m::L_DEVICE)
                        .and_then(|d| d.strip_prefix("nvidia"))
                        .and_then(|n| n.parse().ok()),
                    ..Default::default()
                },
            );
        }
    }

    /// Each GPU's usable memory (free + used) or its reservation, in MiB.
    fn sizes_from(&mut self, samples: &[Sample], usable: bool) {
        for x in samples {
            let (Some(host), Some(gpu)) = (x.host(), x.gpu()) else {
                continue;
            };
            let id = self.gpus.entry((host.to_string(), gpu)).or_default();
            if usable {
                id.usable_mib = x.value();
            } else {
                id.reserved_mib = x.value();
            }
        }
    }

    /// Where each host's serve answers: its scrape target, the scheme it says, and a path of the shape a
    /// serve uses (nothing else may end up in the address the client opens).
    fn serves_from(&mut self, samples: &[Sample]) {
        for x in samples {
            let Some(host) = x.host() else { continue };
            self.voices
                .entry(host.to_string())
                .or_default()
                .insert(x.target());
            let scheme = match x.label("scheme") {
                Some("https") => "https",
                _ => "http",
            };
            let said_by = (
                host.to_string(),
                x.label("instance").unwrap_or("").to_string(),
            );
            if x.label("simulated") == Some("true") {
                self.simulated.insert(said_by.clone());
            }
            let path = x.label("api_path").unwrap_or("").to_string();
            let name_ok = |n: &str| {
                n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            };
            let ok = path.is_empty() || path.strip_prefix("/hosts/").is_some_and(name_ok);
            if ok {
                self.serve.insert(said_by, (scheme.to_string(), path));
            }
        }
    }
}

impl HostData {
    /// Whether two polls say the same of the host but for when it was read. (A NaN, an unknown size, never
    /// equals itself: such a host's reading is built again, which costs time, not truth.)
    fn same_but_time(&self, b: &HostData) -> bool {
        self.gpus == b.gpus
            && self.gpusweep == b.gpusweep
            && self.counts == b.counts
            && self.targets == b.targets
    }

    /// When the host's serve took its reading, else when it was polled.
    fn taken_at_ms(&self, polled_ms: u64) -> u64 {
        self.taken_s
            .filter(|t| *t > 0.0)
            .and_then(|t| whole(t * 1000.0))
            .unwrap_or(polled_ms)
    }
}

/// The fleet's names, each to its place in a poll's table: looked up once per sample, so a thousand hosts'
/// answers cost no tree walk (the names are copied once, when the poller starts).
struct Names {
    place: HashMap<String, usize>,
}

impl Names {
    fn new(hosts: &[PromHost]) -> Names {
        let mut place = HashMap::with_capacity(hosts.len());
        for h in hosts {
            let next = place.len();
            place.entry(h.name.clone()).or_insert(next);
        }
        Names { place }
    }
    fn of(&self, name: &str) -> Option<usize> {
        self.place.get(name).copied()
    }
    fn len(&self) -> usize {
        self.place.len()
    }
}

/// Prometheus's own `up` of each scrape target it scrapes (a target cannot forge it): those that named a
/// fleet host in the lookback, and every target that is down.
type Up = HashMap<Target, f64>;

/// What one poll read: each host's data by its place in `Names` (None: no series for it), and `up` by
/// scrape target.
type Polled = (Vec<Option<HostData>>, Up);

/// One poll: every query, joined into per-host data, by each name's place in `names` (hosts Prometheus
/// knows but the fleet does not are left out).
async fn poll(
    server: &PromServer,
    http: &HttpClient,
    queries: &Queries,
    names: &Names,
) -> Result<Polled, String> {
    let spent = AtomicUsize::new(0);
    let bodies = tokio::join!(
        server.fetch(http, &queries.used, &spent),
        server.fetch(http, &queries.clean, &spent),
        server.fetch(http, &queries.unreadable, &spent),
        server.fetch(http, &queries.unexplained, &spent),
        server.fetch(http, &queries.findings, &spent),
        server.fetch(http, &queries.taken, &spent),
        server.fetch(http, &queries.up, &spent),
    );
    let answers = [
        bodies.0?, bodies.1?, bodies.2?, bodies.3?, bodies.4?, bodies.5?, bodies.6?,
    ];
    let (hosts, mut up) = table(server, names, &answers)?;
    // Targets whose series came without memory or a serve's info (the `up` query's own filter): asked
    // for by instance, so a target Prometheus scrapes is never taken for one it does not.
    let missing: BTreeSet<&str> = hosts
        .iter()
        .flatten()
        .flat_map(|d| d.targets.iter())
        .filter(|t| !up.contains_key(*t))
        .map(|t| t.instance.as_str())
        .collect();
    for m in instance_matchers(missing.into_iter(), MAX_DOWN_ASKED).0 {
        let body = server
            .fetch(http, &format!("max by (job, instance) (up{{{m}}})"), &spent)
            .await?;
        for s in server.samples(&body)? {
            if let Some(v) = s.value() {
                up.insert(s.target(), v);
            }
        }
    }
    Ok((hosts, up))
}

/// `instance=~"a|b"` matchers naming these instances, each at most `MAX_ONLY` bytes, every regular-
/// expression metacharacter and PromQL string escape escaped; at most `most` instances. Also how many could
/// not be named (past `most`, or with a control character): what was asked of those is unknown.
fn instance_matchers<'a>(
    instances: impl Iterator<Item = &'a str>,
    most: usize,
) -> (Vec<String>, usize) {
    let mut out = Vec::new();
    let mut chunk = String::new();
    let (mut named, mut skipped) = (0usize, 0usize);
    for inst in instances {
        if inst.is_empty() || inst.chars().any(char::is_control) || named >= most {
            skipped += 1;
            continue;
        }
        named += 1;
        if !chunk.is_empty() {
            chunk.push('|');
        }
        for c in inst.chars() {
            match c {
                // A regular expression's metacharacter is escaped by a backslash, which a PromQL string
                // doubles; a backslash itself is two, four in the string.
                '\\' => chunk.push_str(r"\\\\"),
                '.' | '+' | '*' | '?' | '(' | ')' | '|' | '[' | ']' | '{' | '}' | '^' | '$' => {
                    chunk.push_str(r"\\");
                    chunk.push(c);
                }
                '"' => chunk.push_str(r#"\""#),
                c => chunk.push(c),
            }
        }
        if chunk.len() >= MAX_ONLY {
            out.push(format!("instance=~\"{}\"", std::mem::take(&mut chunk)));
        }
    }
    if !chunk.is_empty() {
        out.push(format!("instance=~\"{chunk}\""));
    }
    (out, skipped)
}

/// The host's data in this poll's table, begun at its first sample; the sample's scrape target is noted.
fn of<'t>(
    table: &'t mut [Option<HostData>],
    names: &Names,
    sample: &Sample,
) -> Option<&'t mut HostData> {
    let at = names.of(sample.host()?)?;
    let data = table.get_mut(at)?.get_or_insert_with(HostData::default);
    data.targets.insert(sample.target());
    Some(data)
}

/// The answers of one poll (in the order of `Queries`' fields), joined into per-host data.
fn table(
    server: &PromServer,
    names: &Names,
    answers: &[bytes::Bytes; 7],
) -> Result<Polled, String> {
    // Each answer parsed, folded in and let go before the next: one answer's samples are held at a time.
    let [used, clean, unreadable, unexplained, findings, taken, up] = answers;
    let mut hosts: Vec<Option<HostData>> =
        std::iter::repeat_with(|| None).take(names.len()).collect();
    // (answer, what a GPU's sample sets, whether only gpusweep sends it, whether a sample without a `gpu`
    // speaks for the whole host: `gpusweep_gpus_readable == 0`).
    for (body, set, gpusweep, whole_host) in [
        (
            used,
            (|g, x| g.used = x.value()) as fn(&mut GpuData, &Sample),
            false,
            false,
        ),
        (clean, |g, x| g.clean = x.value(), true, false),
        (unreadable, |g, _| g.unreadable = true, true, true),
        (
            unexplained,
            |g, x| {
                if let (Some(k), Some(v)) = (x.label("kind"), x.value()) {
                    g.unexplained.push((k.to_string(), v));
                }
            },
            true,
            false,
        ),
    ] {
        for sample in server.samples(body)? {
            let Some(gpu) = sample.gpu() else {
                if whole_host && let Some(data) = of(&mut hosts, names, &sample) {
                    data.gpusweep = true;
                    data.gpus_unreadable = true;
                }
                continue;
            };
            let Some(data) = of(&mut hosts, names, &sample) else {
                continue;
            };
            data.gpusweep |= gpusweep;
            set(data.gpus.entry(gpu).or_default(), &sample);
        }
    }
    for sample in server.samples(findings)? {
        let (Some(kind), Some(sev), Some(n)) = (
            sample.label("kind"),
            sample.label("severity"),
            sample.value(),
        ) else {
            continue;
        };
        let Some(data) = of(&mut hosts, names, &sample) else {
            continue;
        };
        data.gpusweep = true;
        data.counts.push((kind.to_string(), sev.to_string(), n));
    }
    for sample in server.samples(taken)? {
        let Some(data) = of(&mut hosts, names, &sample) else {
            continue;
        };
        data.taken_s = sample
            .value()
            .into_iter()
            .chain(data.taken_s)
            .reduce(f64::max);
    }
    // Prometheus may answer in any order: sorted, two polls that say the same compare equal.
    for data in hosts.iter_mut().flatten() {
        data.counts.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        for g in data.gpus.values_mut() {
            g.unexplained.sort_by(|a, b| a.0.cmp(&b.0));
        }
    }
    let up: Up = server
        .samples(up)?
        .iter()
        .filter_map(|sample| Some((sample.target(), sample.value()?)))
        .collect();
    Ok((hosts, up))
}

/// The fleet's commands, by the host's place in `hosts`.
pub type PromCmd = (usize, HostCmd);

/// One Prometheus server's poller: its hosts, what each last said, and how often they are asked for.
struct Poller {
    server: PromServer,
    http: HttpClient,
    queries: Queries,
    glance: GlanceQueries,
    hosts: Vec<PromHost>,
    names: Names,
    ids: Identities,
    /// What each host's last snapshot was built from (cleared when identities are read again).
    said: Vec<Option<HostData>>,
    /// The revision each host's `said` was read at: a glance that finds it unmoved reads nothing more.
    revision: Vec<Option<f64>>,
    /// Read every host's series at the next poll (after a narrowed read missed a host it asked for).
    whole_next: bool,
    /// Whether each host's serve names it by `Hostname`, as last seen: one gone silent can still be asked for.
    by_hostname: Vec<bool>,
    /// Every scrape target heard naming each host while this client ran: a voice once heard is the host's
    /// (or a conflict) for good, whatever Prometheus's lookback has forgotten.
    voices: Vec<BTreeSet<Target>>,
    down: Vec<Option<String>>,
    asked: Vec<Duration>,
    interval: Duration,
    next: tokio::time::Instant,
}

impl Poller {
    /// A fleet's command for one of the hosts.
    fn on_cmd(&mut self, at: usize, cmd: HostCmd) {
        let Some(host) = self.hosts.get(at) else {
            return;
        };
        match cmd {
            refused @ HostCmd::Act { .. } => refused.refuse(
                host.sink.as_ref(),
                "read-only host (read from Prometheus): nothing was done; act on it over SSH \
                 (--hosts user@node) or through its agent",
            ),
            HostCmd::Interval(d) => {
                self.asked[at] = d;
                self.interval = self.asked.iter().copied().min().unwrap_or(d);
                let soon = tokio::time::Instant::now() + self.interval.max(MIN_PROM_INTERVAL);
                self.next = self.next.min(soon);
            }
            HostCmd::PollNow | HostCmd::Wake => self.next = tokio::time::Instant::now(),
        }
    }

    /// One poll (identities first, when they are old): a glance at every host's revision, then the series
    /// of the hosts whose revision moved (or of all, when most moved or no glance can narrow the read).
    /// False once no host listens.
    async fn poll(&mut self) -> bool {
        if self
            .ids
            .read_at
            .is_none_or(|t| t.elapsed() >= IDENTITY_EVERY)
        {
            match identities(&self.server, &self.http).await {
                Ok(i) => {
                    self.ids = i;
                    self.said.fill(None);
                }
                Err(e) => return say_down(&self.hosts, &mut self.down, &e),
            }
        }
        let g = match glance(&self.server, &self.http, &self.glance, &self.names).await {
            Ok(g) => g,
            Err(e) => return say_down(&self.hosts, &mut self.down, &e),
        };
        // Each host's glance, by its place in `hosts`: looked up once.
        let seen: Vec<Seen> = self
            .hosts
            .iter()
            .map(|h| {
                let at = self.names.of(&h.name);
                let get = |v: &[Option<f64>]| at.and_then(|at| v.get(at).copied().flatten());
                Seen {
                    revision: get(&g.revision),
                    taken: get(&g.taken),
                    by_hostname: at.and_then(|at| g.by_hostname.get(at).copied()) == Some(true),
                    target: at.and_then(|at| g.target.get(at).cloned().flatten()),
                }
            })
            .collect();
        let moved = self.moved(&seen);
        let n_moved = moved.iter().filter(|m| **m).count();
        let now = crate::core::model::now_ms();
        let mut listening = self.hosts.iter().any(|h| h.detached.load(Ordering::SeqCst));
        // A few moved: their series alone are read, named by `Hostname`.
        let only = (n_moved * 4 <= self.hosts.len()).then(|| {
            only_hosts(
                self.hosts
                    .iter()
                    .zip(&moved)
                    .zip(&self.by_hostname)
                    .filter(|((_, m), _)| **m)
                    .map(|((h, _), by_name)| by_name.then_some(h.name.as_str())),
            )
        });
        let narrowed = match (n_moved, &only) {
            (0, _) => None,
            (_, Some(Some(m))) => Some(Queries::new(&self.server, Some(m))),
            _ => {
                // Most hosts moved, or one cannot be named in a query: read them all.
                return self.read(None, &seen, now).await || listening;
            }
        };
        // The others are only fresh, at the time their serve took the reading.
        for (i, h) in self.hosts.iter().enumerate() {
            if moved[i] || h.detached.load(Ordering::SeqCst) {
                continue;
            }
            if let Some(said) = self.said[i].as_mut() {
                said.taken_s = seen[i].taken;
                listening |= h.sink.fresh(said.taken_at_ms(now), Vec::new());
            }
        }
        match narrowed {
            None => listening,
            Some(q) => self.read(Some((&q, &moved)), &seen, now).await || listening,
        }
    }

    /// Which hosts a glance says moved: read again when unread, down, without a revision, at another revision,
    /// or heard from another target than the one its reading was believed from.
    fn moved(&mut self, seen: &[Seen]) -> Vec<bool> {
        let mut moved = Vec::with_capacity(seen.len());
        for (i, s) in seen.iter().enumerate() {
            if s.revision.is_some() {
                self.by_hostname[i] = s.by_hostname;
            }
            moved.push(
                self.whole_next
                    || self.said[i].is_none()
                    || self.down[i].is_some()
                    || s.revision.is_none()
                    || s.revision != self.revision[i]
                    || s.taken.is_none()
                    || self.said[i]
                        .as_ref()
                        .is_some_and(|d| own_target(d) != s.target.as_ref()),
            );
        }
        moved
    }

    /// Read the series of every host, or (`narrowed`) of the hosts that moved with the queries naming them,
    /// and hand each on. False once no host listens.
    async fn read(
        &mut self,
        narrowed: Option<(&Queries, &[bool])>,
        seen: &[Seen],
        now: u64,
    ) -> bool {
        let queries = narrowed.map_or(&self.queries, |(q, _)| q);
        let (data, up) = match poll(&self.server, &self.http, queries, &self.names).await {
            Ok(x) => x,
            Err(e) => return say_down(&self.hosts, &mut self.down, &e),
        };
        self.whole_next = false;
        let mut listening = false;
        for i in 0..self.hosts.len() {
            if self.hosts[i].detached.load(Ordering::SeqCst)
                || narrowed.is_some_and(|(_, moved)| !moved[i])
            {
                continue;
            }
            let at = self.names.of(&self.hosts[i].name);
            let d = at.and_then(|at| data.get(at)).and_then(Option::as_ref);
            // A host the narrowed read asked for and did not find may have moved to another target: the
            // next poll reads every host, once (a host already down does not ask again).
            self.whole_next |= narrowed.is_some() && d.is_none() && self.down[i].is_none();
            self.revision[i] = seen[i].revision;
            listening |= self.host(i, d, &up, now);
        }
        listening
    }

    /// One host's part of a poll: unreadable (its target down, no series, two targets), only fresh, or a
    /// reading. False once its sink stops listening.
    fn host(&mut self, i: usize, d: Option<&HostData>, up: &Up, now: u64) -> bool {
        let h = &self.hosts[i];
        // Every target that has spoken for it: in this poll, within the lookback, or ever while this client
        // ran. Two are a conflict whether or not both still answer; the one alone is the host's own, and its
        // silence is the host's.
        let voices = &mut self.voices[i];
        voices.extend(d.iter().flat_map(|d| d.targets.iter().cloned()));
        if let Some(v) = self.ids.voices.get(&h.name) {
            voices.extend(v.iter().cloned());
        }
        let why = if self.ids.unasked_down > 0 {
            Some(format!(
                "{} scrape targets that are down could not be asked which host they spoke for: any of them \
                 may be this host's own",
                self.ids.unasked_down
            ))
        } else {
            judge_voices(&h.name, voices, d, up)
        };
        if let Some(why) = why {
            if self.down[i].as_deref() == Some(why.as_str()) {
                return true;
            }
            self.down[i] = Some(why.clone());
            return h.sink.status(ConnStatus::Down(why));
        }
        let Some(d) = d else { return true };
        let was_down = self.down[i].take().is_some();
        // Most polls of most hosts say what the last one said: then only its time is news, and no
        // snapshot is built to find that out.
        if !was_down && self.said[i].as_ref().is_some_and(|p| p.same_but_time(d)) {
            return h.sink.fresh(d.taken_at_ms(now), Vec::new());
        }
        self.said[i] = Some(d.clone());
        // Whether the snapshot says anything new is the runtime's to decide, once.
        let snap = snapshot(&h.name, d, &self.ids, up, now);
        (!was_down || h.sink.status(ConnStatus::Up)) && h.sink.reading(snap)
    }
}

/// Why a host cannot be read from the targets that spoke for it (`voices`), this poll's data and `up`; None
/// when its one own target, scraped and up, speaks for it alone. A target that has left Prometheus's
/// scraping (no `up`: gone from discovery, as a restarted pod's old address) no longer speaks; series that
/// name a target Prometheus does not scrape (a target relabelling itself with `honor_labels`) are no one's
/// word.
fn judge_voices(
    name: &str,
    voices: &BTreeSet<Target>,
    d: Option<&HostData>,
    up: &Up,
) -> Option<String> {
    if let Some(t) = d.and_then(|d| d.targets.iter().find(|t| !up.contains_key(*t))) {
        return Some(format!(
            "series for host {:?} name the scrape target {t}, which Prometheus does not scrape (a target \
             that relabels itself, honor_labels?): no one's word",
            escape(name)
        ));
    }
    let live: BTreeSet<Target> = voices
        .iter()
        .filter(|t| up.contains_key(*t))
        .cloned()
        .collect();
    if let Some(why) = conflict(name, &live) {
        return Some(why);
    }
    let down = |t: &Target| {
        format!(
            "Prometheus cannot scrape it (up == 0 for {})",
            escape(&t.instance)
        )
    };
    match (live.first(), d) {
        (Some(t), _) if up.get(t).is_some_and(|v| *v < 1.0) => Some(down(t)),
        (_, None) => {
            // A target never scraped is named by its instance.
            let never = up.iter().find(|(t, v)| t.instance == name && **v < 1.0);
            Some(never.map_or_else(
                || "no series for it in Prometheus now".to_string(),
                |(t, _)| down(t),
            ))
        }
        (_, Some(_)) => None,
    }
}

/// Poll the server for these hosts until every host's sink stops listening or the fleet goes away.
pub async fn run(
    server: PromServer,
    http: HttpClient,
    hosts: Vec<PromHost>,
    interval: Duration,
    mut cmds: mpsc::Receiver<PromCmd>,
) {
    for h in &hosts {
        h.sink.status(ConnStatus::Connecting);
    }
    let n = hosts.len();
    let mut p = Poller {
        queries: Queries::new(&server, None),
        glance: GlanceQueries::new(&server),
        names: Names::new(&hosts),
        server,
        http,
        hosts,
        ids: Identities::default(),
        said: vec![None; n],
        revision: vec![None; n],
        whole_next: true,
        by_hostname: vec![false; n],
        voices: vec![BTreeSet::new(); n],
        down: vec![None; n],
        asked: vec![interval; n],
        interval,
        next: tokio::time::Instant::now(),
    };
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(p.next) => {}
            asked_now = cmds.recv() => {
                let Some((at, cmd)) = asked_now else { return };
                p.on_cmd(at, cmd);
                continue;
            }
        }
        p.next = tokio::time::Instant::now() + p.interval.max(MIN_PROM_INTERVAL);
        if !p.poll().await {
            return;
        }
    }
}

/// Tell every host still read from this server that it could not be read. False once nobody listens.
fn say_down(hosts: &[PromHost], down: &mut [Option<String>], why: &str) -> bool {
    let mut listening = false;
    for (i, h) in hosts.iter().enumerate() {
        if h.detached.load(Ordering::SeqCst) {
            continue;
        }
        if down[i].as_deref() == Some(why) {
            listening = true;
            continue;
        }
        down[i] = Some(why.to_string());
        listening |= h.sink.status(ConnStatus::Down(why.to_string()));
    }
    listening
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(url: &str, selector: &str) -> PromServer {
        PromServer {
            url: crate::core::host::HttpUrl::parse(url).expect("url"),
            selector: crate::core::host::parse_selector(selector).expect("selector"),
        }
    }

    fn gpu(used: f64, clean: Option<f64>, unexplained: &[(&str, f64)]) -> GpuData {
        GpuData {
            used: Some(used),
            clean,
            unexplained: unexplained
                .iter()
                .map(|(k, b)| ((*k).to_string(), *b))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_serve_host_keeps_its_verdicts_and_a_dcgm_host_names_its_blind_spot() {
        let mut d = HostData {
            gpusweep: true,
            taken_s: Some(1_700_000_000.5),
            ..Default::default()
        };
        d.gpus.insert(0, gpu(0.0, Some(1.0), &[]));
        d.gpus.insert(1, gpu(500.0, Some(0.0), &[]));
        d.gpus.insert(
            2,
            gpu(
                10240.0,
                Some(0.0),
                &[("ghost", 10.0 * 1024.0 * 1024.0 * 1024.0)],
            ),
        );
        d.gpus.insert(
            3,
            GpuData {
                unreadable: true,
                ..Default::default()
            },
        );
        d.counts.push(("ghost".into(), "leak".into(), 1.0));
        d.counts.push(("zombie".into(), "warning".into(), 2.0));
        let mut ids = Identities::default();
        ids.gpus.insert(
            ("node1".into(), 0),
            Ident {
                usable_mib: Some(1000.0),
                reserved_mib: Some(24.0),
                ..Default::default()
            },
        );
        let s = snapshot("node1", &d, &ids, &HashMap::new(), 5);
        let states: Vec<Option<GpuState>> = s.gpus.iter().map(|g| g.judged).collect();
        assert_eq!(
            states,
            [
                Some(GpuState::Clean),
                Some(GpuState::InUse),
                Some(GpuState::Leak),
                Some(GpuState::Error)
            ]
        );
        assert_eq!(s.taken_at_ms, 1_700_000_000_500);
        assert_eq!(s.gpus[0].memory.total, Some(1024 * MIB));
        assert_eq!(s.gpus[3].memory.used, None, "no reading is not 0");
        // The ghost comes once, per GPU with its bytes; the zombies as a count.
        assert_eq!(
            s.findings
                .iter()
                .filter(|f| f.kind == FindingKind::Ghost)
                .count(),
            1
        );
        assert_eq!(s.findings[0].gpu, Some(2));
        assert!(
            s.findings
                .iter()
                .any(|f| f.kind == FindingKind::Zombie && f.detail.starts_with("2 zombie"))
        );
        assert!(s.missing_features.contains(&Feature::Actions));
        assert!(!s.missing_features.contains(&Feature::ProcessList));
        assert_eq!(s.live_url.as_deref(), Some("ssh://node1"));

        let mut dcgm = HostData::default();
        dcgm.gpus.insert(0, gpu(0.0, None, &[]));
        dcgm.gpus.insert(1, gpu(700.0, None, &[]));
        let s = snapshot("node2", &dcgm, &ids, &HashMap::new(), 7);
        assert!(s.gpus.iter().all(|g| g.judged.is_none()));
        assert_eq!(s.taken_at_ms, 7);
        assert!(s.missing_features.contains(&Feature::ProcessList));
        assert!(
            s.findings.is_empty(),
            "no leak is claimed without a process list"
        );
        assert_eq!(s.gpus[1].memory.used, Some(700 * MIB));
    }

    #[test]
    fn two_targets_naming_one_host_are_a_conflict() {
        let one: BTreeSet<Target> = [Target {
            job: "gpusweep".into(),
            instance: "10.0.0.2:9401".into(),
        }]
        .into();
        assert_eq!(conflict("gpu-b", &one), None);
        let mut two = one.clone();
        two.insert(Target {
            job: "other".into(),
            instance: "10.0.0.66:9400".into(),
        });
        let why = conflict("gpu-b", &two).expect("a conflict");
        assert!(
            why.contains("10.0.0.2:9401") && why.contains("10.0.0.66:9400") && why.contains("job="),
            "{why}"
        );
    }

    #[test]
    fn samples_borrow_their_labels_and_still_read_escaped_ones() {
        let p = server("http://p:9090", "");
        let body = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"Hostname":"gpu-b0001","gpu":"3","job":"x"},"value":[1733338338.123,"512"]},
            {"metric":{"Hostname":"odd\"host","gpu":"0"},"value":[1733338338.5,"NaN"]}]}}"#;
        let s = p.samples(body).expect("an answer");
        assert!(matches!(
            s[0].metric.hostname.as_ref().map(|t| &t.0),
            Some(Cow::Borrowed("gpu-b0001"))
        ));
        assert!(matches!(s[0].value.1.0, Cow::Borrowed("512")));
        assert_eq!(
            (s[0].host(), s[0].gpu(), s[0].value()),
            (Some("gpu-b0001"), Some(3), Some(512.0))
        );
        assert_eq!(s[1].host(), Some("odd\"host"));
        assert!(s[1].value().is_some_and(f64::is_nan));
        let failed = br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#;
        assert!(p.samples(failed).is_err_and(|e| e.contains("parse error")));
    }

    #[test]
    fn a_host_polled_again_is_the_same_but_for_its_time() {
        let mut a = HostData {
            taken_s: Some(10.0),
            ..Default::default()
        };
        a.gpus.insert(0, gpu(5.0, Some(0.0), &[("ghost", 1.0)]));
        let mut b = a.clone();
        b.taken_s = Some(15.0);
        assert!(a.same_but_time(&b));
        assert_eq!(b.taken_at_ms(1), 15_000);
        b.gpus.insert(1, gpu(0.0, Some(1.0), &[]));
        assert!(!a.same_but_time(&b), "a GPU more");
        let mut c = a.clone();
        c.gpus
            .insert(0, gpu(5.0, Some(0.0), &[("ghost", f64::NAN)]));
        assert!(
            !c.same_but_time(&c.clone()),
            "an unknown size is never taken as unchanged"
        );
        assert_eq!(
            HostData::default().taken_at_ms(7),
            7,
            "no serve time: when it was polled"
        );
    }

    struct Deaf;
    impl Sink for Deaf {
        fn reading(&self, _: HostSnapshot) -> bool {
            false
        }
        fn status(&self, _: ConnStatus) -> bool {
            false
        }
        fn answer(&self, _: u64, _: crate::core::action::ActionAnswer) -> bool {
            false
        }
    }

    #[test]
    fn names_keep_the_first_place_of_a_name() {
        let host = |n: &str| PromHost {
            name: n.into(),
            sink: Arc::new(Deaf),
            detached: Arc::default(),
        };
        let hosts = [host("a"), host("b"), host("a")];
        let names = Names::new(&hosts);
        assert_eq!(
            (names.of("a"), names.of("b"), names.of("c")),
            (Some(0), Some(1), None)
        );
        assert_eq!(names.len(), 2);
    }

    #[test]
    fn a_serve_that_says_it_cannot_read_its_gpus_has_no_clean_gpu() {
        let p = server("http://p:9090", "");
        let answer = |result: &str| -> bytes::Bytes {
            format!(
                r#"{{"status":"success","data":{{"resultType":"vector","result":[{result}]}}}}"#
            )
            .into_bytes()
            .into()
        };
        let t = r#""Hostname":"node1","job":"gpusweep","instance":"10.0.0.1:9401""#;
        let answers = [
            answer(&format!(
                r#"{{"metric":{{{t},"gpu":"0"}},"value":[1,"0"]}}"#
            )),
            answer(&format!(
                r#"{{"metric":{{{t},"gpu":"0"}},"value":[1,"1"]}}"#
            )),
            // gpusweep_gpus_readable 0: no `gpu` label.
            answer(&format!(r#"{{"metric":{{{t}}},"value":[1,"0"]}}"#)),
            answer(""),
            answer(""),
            answer(""),
            answer(""),
        ];
        let hosts = [PromHost {
            name: "node1".into(),
            sink: Arc::new(Deaf),
            detached: Arc::default(),
        }];
        let (table, _) = table(&p, &Names::new(&hosts), &answers).expect("a table");
        let d = table[0].as_ref().expect("node1's data");
        assert!(d.gpus_unreadable);
        let s = snapshot("node1", d, &Identities::default(), &Up::new(), 5);
        assert_ne!(s.gpus[0].judged, Some(GpuState::Clean), "{s:?}");
        assert!(
            s.gpu_error
                .as_deref()
                .is_some_and(|e| e.contains("gpus_readable")),
            "{s:?}"
        );
    }

    #[test]
    fn another_target_cannot_mark_a_host_demo_nor_move_its_api() {
        let p = server("http://p:9090", "");
        let body = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"Hostname":"gpu-b","instance":"10.0.0.2:9401","scheme":"http","api_path":""},"value":[1,"1"]},
            {"metric":{"Hostname":"gpu-b","instance":"10.0.0.66:9400","scheme":"https","api_path":"/hosts/x","simulated":"true"},"value":[1,"1"]}]}}"#;
        let mut ids = Identities::default();
        ids.serves_from(&p.samples(body).expect("an answer"));
        let mut d = HostData {
            gpusweep: true,
            ..Default::default()
        };
        d.targets.insert(Target {
            job: "gpusweep".into(),
            instance: "10.0.0.2:9401".into(),
        });
        let own = Target {
            job: "gpusweep".into(),
            instance: "10.0.0.2:9401".into(),
        };
        let up: Up = [(own, 1.0)].into();
        let s = snapshot("gpu-b", &d, &ids, &up, 5);
        assert!(!s.simulated, "marked DEMO by another target");
        assert_eq!(s.live_url.as_deref(), Some("http://10.0.0.2:9401"));
    }

    #[test]
    fn any_instance_is_asked_for_escaped_and_one_that_cannot_be_is_counted() {
        let (m, skipped) = instance_matchers(
            [
                "10.0.0.2:9401",
                "gpu-b/serve",
                r#"x"y\z"#,
                "bad\nname",
                "(a)+",
            ]
            .into_iter(),
            100,
        );
        assert_eq!(skipped, 1, "a control character cannot be asked for");
        assert_eq!(
            m,
            [r#"instance=~"10\\.0\\.0\\.2:9401|gpu-b/serve|x\"y\\\\z|\\(a\\)\\+""#]
        );
        let (m, skipped) = instance_matchers(["a", "b", "c"].into_iter(), 2);
        assert_eq!(
            (m.len(), skipped),
            (1, 1),
            "past the limit: counted, not asked"
        );
    }

    #[test]
    fn a_host_is_read_only_from_its_one_own_target_scraped_and_up() {
        let t = |job: &str, inst: &str| Target {
            job: job.into(),
            instance: inst.into(),
        };
        let (own, fake) = (t("gpusweep", "10.0.0.2:9401"), t("other", "10.0.0.66:9400"));
        let data = |targets: &[&Target]| HostData {
            targets: targets.iter().map(|x| (*x).clone()).collect(),
            ..Default::default()
        };
        let voices = |v: &[&Target]| v.iter().map(|x| (*x).clone()).collect::<BTreeSet<_>>();
        let up = |v: &[(&Target, f64)]| v.iter().map(|(x, u)| ((*x).clone(), *u)).collect::<Up>();
        // Its own target alone, up: read.
        let d = data(&[&own]);
        assert_eq!(
            judge_voices("gpu-b", &voices(&[&own]), Some(&d), &up(&[(&own, 1.0)])),
            None
        );
        // Its own target down, an impostor answering: a conflict naming both.
        let d = data(&[&fake]);
        let why = judge_voices(
            "gpu-b",
            &voices(&[&own, &fake]),
            Some(&d),
            &up(&[(&own, 0.0), (&fake, 1.0)]),
        )
        .expect("never the impostor's word");
        assert!(
            why.contains("10.0.0.2:9401") && why.contains("10.0.0.66:9400"),
            "{why}"
        );
        // Its own target gone from Prometheus's scraping (a restarted pod's old address): no voice any more.
        assert_eq!(
            judge_voices(
                "gpu-b",
                &voices(&[&own, &fake]),
                Some(&d),
                &up(&[(&fake, 1.0)])
            ),
            None
        );
        // Series naming a target Prometheus does not scrape (relabelled with honor_labels): no one's word.
        let d = data(&[&own]);
        let why =
            judge_voices("gpu-b", &voices(&[&own]), Some(&d), &up(&[])).expect("a forged target");
        assert!(why.contains("does not scrape"), "{why}");
        // Its own target alone and down.
        let why = judge_voices("gpu-b", &voices(&[&own]), None, &up(&[(&own, 0.0)])).expect("down");
        assert!(why.contains("up == 0"), "{why}");
    }

    #[test]
    fn a_narrowed_read_names_plain_hosts_escaped_and_nothing_else() {
        assert_eq!(
            only_hosts([Some("gpu-b2"), Some("node1.dc"), Some("gpu-b2")].into_iter()).as_deref(),
            Some(r#"Hostname=~"gpu-b2|node1\\.dc""#)
        );
        // A name a target chose that is not a plain host name, one not named by Hostname: read them all.
        assert_eq!(
            only_hosts([Some("a\"}) or vector(1"), Some("b")].into_iter()),
            None
        );
        assert_eq!(only_hosts([Some("a|b")].into_iter()), None);
        assert_eq!(only_hosts([Some("a"), None].into_iter()), None);
        let many: Vec<String> = (0..100).map(|k| format!("h{k:0>200}")).collect();
        assert_eq!(only_hosts(many.iter().map(|s| Some(s.as_str()))), None);
        let p = server("http://prom:9090", r#"job="gpu""#);
        let q = Queries::new(&p, Some(r#"Hostname=~"a""#));
        assert!(
            q.used
                .contains(r#"DCGM_FI_DEV_FB_USED{job="gpu",Hostname=~"a"}"#),
            "{}",
            q.used
        );
    }

    #[test]
    fn queries_carry_the_selector() {
        let p = server("http://p:9090", r#"job="gpu""#);
        let q = Queries::new(&p, None);
        assert_eq!(
            q.used,
            r#"sum by (Hostname, hostname, job, instance, gpu) (max by (Hostname, hostname, job, instance, gpu, GPU_I_ID) (DCGM_FI_DEV_FB_USED{job="gpu"}))"#
        );
        assert!(q.up.starts_with("max by (job, instance) (up and on (job, instance)"));
        assert!(q.up.contains(r#"DCGM_FI_DEV_FB_USED{job="gpu"}[10m]"#));
        let p = server("http://p:9090", "");
        assert!(
            Queries::new(&p, None)
                .clean
                .contains("gpusweep_gpu_clean{}")
        );
    }
}
