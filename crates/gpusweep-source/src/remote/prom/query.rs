//! What this source asks of a Prometheus server: one bounded query, the fleet's hosts (discovery), the
//! lookback, the limits on what an answer may hold.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use super::super::http::HttpClient;
use super::PromServer;
use super::answer::{Answer, MAX_SERIES, Sample, Target};
use gpusweep_core::format::{escape, truncate};
use gpusweep_core::metrics as m;

/// What this source asks of a Prometheus server, for the spec that names it (the spec is core's word; asking
/// is this source's).
pub(super) trait Query {
    fn sel(&self, name: &str) -> String;
    fn sel_only(&self, name: &str, only: Option<&str>) -> String;
    async fn fetch(
        &self,
        http: &HttpClient,
        q: &str,
        spent: &Spent<'_>,
    ) -> Result<bytes::Bytes, String>;
    fn samples<'a>(&self, body: &'a [u8]) -> Result<Vec<Sample<'a>>, String>;
    async fn discover(&self, http: &HttpClient) -> Result<Discovered, String>;
}

/// The hosts a Prometheus server knows (see `Query::discover`).
pub async fn discover(server: &PromServer, http: &HttpClient) -> Result<Discovered, String> {
    server.discover(http).await
}

/// What a server's discovery found: the hosts, and every scrape target that named each within the lookback
/// (a TUI's first view takes them as the hosts' voices, not asking again a moment later).
#[derive(Debug, Default, Clone)]
pub struct Discovered {
    pub names: Vec<String>,
    pub voices: Voices,
}

/// Every scrape target that named each host, as a discovery found them.
#[derive(Debug, Default, Clone)]
pub struct Voices(pub(super) std::collections::HashMap<String, std::collections::BTreeSet<Target>>);

/// What the queries asked together cost: their answers' bytes (held within `MAX_ROUND`), and the time
/// Prometheus took to answer them, added to the poller's count of it (`busy`, in microseconds), which
/// paces the poller so that its queries stay a small share of the server's time.
pub(super) struct Spent<'a> {
    bytes: AtomicUsize,
    busy: &'a AtomicU64,
}

impl<'a> Spent<'a> {
    pub(super) fn new(busy: &'a AtomicU64) -> Spent<'a> {
        Spent {
            bytes: AtomicUsize::new(0),
            busy,
        }
    }

    /// Counts the time until it is dropped, however the answer ends (in full, failed, too large).
    fn answering(&self) -> Answering<'a> {
        Answering {
            busy: self.busy,
            since: Instant::now(),
        }
    }
}

/// One query's answer under way (see `Spent::answering`).
struct Answering<'a> {
    busy: &'a AtomicU64,
    since: Instant,
}

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        let us = u64::try_from(self.since.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.busy.fetch_add(us, Ordering::Relaxed);
    }
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
        spent: &Spent<'_>,
    ) -> Result<bytes::Bytes, String> {
        let answering = spent.answering();
        let failed = |e: reqwest::Error| format!("Prometheus {}: {}", self.url, short(&e));
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
            let before = spent.bytes.fetch_add(chunk.len(), Ordering::Relaxed);
            if body.len() + chunk.len() > MAX_ANSWER {
                return Err(too_big());
            }
            if before + chunk.len() > MAX_ROUND {
                return Err(format!(
                    "Prometheus {}: answers larger than {} MiB in all to the queries asked together \
                     (narrow the fleet with ?{{...}})",
                    self.url,
                    MAX_ROUND / (1024 * 1024)
                ));
            }
            body.extend_from_slice(&chunk);
        }
        if gpusweep_core::trace::on() {
            gpusweep_core::trace::trace(
                &self.url.to_string(),
                &format!(
                    "{} bytes in {} ms: {}",
                    body.len(),
                    answering.since.elapsed().as_millis(),
                    truncate(q, 200)
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
    /// ever named. With each host, every target that named it (by any GPU's memory, a serve's info or
    /// readings): its voices.
    async fn discover(&self, http: &HttpClient) -> Result<Discovered, String> {
        let lb = lookback();
        let seen = format!(
            "group by (Hostname, hostname, job, instance) (last_over_time({{__name__=~\"{}|{}|{}|{}\"{}}}[{lb}]))",
            m::FB_USED,
            m::FB_USED_BYTES,
            m::SERVE_INFO,
            m::READING_TIMESTAMP,
            self.selector
                .as_ref()
                .map(|s| format!(",{s}"))
                .unwrap_or_default()
        );
        let down = format!("{} == 0", self.sel("up"));
        let busy = AtomicU64::new(0);
        let spent = Spent::new(&busy);
        let (seen, down) = tokio::join!(
            self.fetch(http, &seen, &spent),
            self.fetch(http, &down, &spent)
        );
        let (seen, down) = (seen?, down.unwrap_or_default());
        let seen = self.samples(&seen)?;
        let down = self.samples(&down).unwrap_or_default();
        let mut voices = Voices::default();
        for x in &seen {
            if let Some(host) = x.host() {
                voices
                    .0
                    .entry(host.to_string())
                    .or_default()
                    .insert(x.target());
            }
        }
        let mut names: Vec<String> = voices.0.keys().cloned().collect();
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
        Ok(Discovered { names, voices })
    }
}

/// How far back a host counts as part of the fleet (Prometheus keeps a dead target's last samples): 10
/// minutes, or `GPUSWEEP_PROM_LOOKBACK` (a Prometheus duration such as `30m`, `2h`).
pub(super) fn lookback() -> &'static str {
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
pub(super) const MAX_ANSWER: usize = 128 * 1024 * 1024;

/// The most hosts one `prom:` fleet may name: each is a host of its own in the client (its ledger, its
/// channel), so a Prometheus could otherwise make the client build millions.
pub(super) const MAX_HOSTS: usize = 20_000;

/// The most that the queries asked together (a poll's seven; identities' four, the glance's two and the
/// summary's six at start; identities read again, and the sizes they lack) may answer in all: at 10,000
/// hosts of 8 GPUs the largest round answers about 140 MiB.
pub(super) const MAX_ROUND: usize = 256 * 1024 * 1024;

pub(super) fn short(e: &reqwest::Error) -> String {
    use std::error::Error as _;
    let mut s = e.to_string();
    if let Some(c) = e.source() {
        s.push_str(": ");
        s.push_str(&c.to_string());
    }
    truncate(&escape(&s), 200)
}
