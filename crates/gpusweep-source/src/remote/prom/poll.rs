//! One poll: the glance (revision and time per host), the queries of the hosts that moved, identities once a
//! minute, the voices of down targets, all joined into per-host data.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use super::super::http::HttpClient;
use super::PromServer;
use super::answer::{Sample, Target, Up};
use super::proof::Proof;
use super::query::{MAX_HOSTS, Query, Spent, Voices, lookback};
use super::reading::{HostData, Ident, Identities, whole};
use super::table::{Names, Polled, fold_details, quick_table, summary_table, table};
use gpusweep_core::metrics as m;

/// The queries of one poll, each aggregated by host (and GPU) so the answer stays small at a thousand hosts.
pub(super) struct Queries {
    pub(super) used: String,
    pub(super) clean: String,
    pub(super) unreadable: String,
    pub(super) unexplained: String,
    pub(super) findings: String,
    pub(super) taken: String,
    pub(super) up: String,
    /// What a summary asks instead of `unreadable`, `unexplained` and `findings`.
    pub(super) summary: SummaryQueries,
}

/// A host's summary, beside its memory and clean per GPU: whether its serve read every GPU (one series a host)
/// and how many findings it has (one series a host). Where the serve read them all and found nothing, the
/// summary is all a whole read would say; the others' details are read after it, by `Hostname`.
pub(super) struct SummaryQueries {
    pub(super) unreadable: String,
    pub(super) findings: String,
}

impl Queries {
    /// A whole read's queries, in the order `table` joins their answers.
    pub(super) fn whole(&self) -> [&str; 7] {
        [
            &self.used,
            &self.clean,
            &self.unreadable,
            &self.unexplained,
            &self.findings,
            &self.taken,
            &self.up,
        ]
    }

    /// A summary's queries, in the order `summary_table` joins their answers.
    pub(super) fn summary(&self) -> [&str; 6] {
        [
            &self.used,
            &self.clean,
            &self.summary.unreadable,
            &self.summary.findings,
            &self.taken,
            &self.up,
        ]
    }

    /// What a summary leaves to read, in the order `fold_details` folds their answers.
    pub(super) fn details(&self) -> [&str; 3] {
        [&self.unreadable, &self.unexplained, &self.findings]
    }

    /// Every host's series, or (`only`, a matcher on `Hostname`) those of some hosts.
    pub(super) fn new(p: &PromServer, only: Option<&str>) -> Queries {
        let lb = lookback();
        let sel = |name: &str| p.sel_only(name, only);
        let by_gpu = |name: &str| {
            format!(
                "max by (Hostname, hostname, job, instance, gpu) ({})",
                sel(name)
            )
        };
        let by_host =
            |name: &str| format!("max by (Hostname, hostname, job, instance) ({})", sel(name));
        let gpu_0 = only.map_or(GPU_0.to_string(), |o| format!("{o},{GPU_0}"));
        Queries {
            summary: SummaryQueries {
                unreadable: format!("{} == 0", by_host(m::GPUS_READABLE)),
                findings: by_host(m::HOST_FINDINGS),
            },
            // A GPU in MIG mode has one series per instance (`GPU_I_ID`): their sum is the GPU's.
            // dcgm-exporter 4.8's MiB or 4.9's bytes (one series a GPU where a target says both).
            used: format!(
                "sum by (Hostname, hostname, job, instance, gpu) (max by (Hostname, hostname, job, \
                 instance, gpu, {}) ({} or {} / 1048576))",
                m::L_GPU_I_ID,
                sel(m::FB_USED),
                sel(m::FB_USED_BYTES)
            ),
            clean: by_gpu(m::GPU_CLEAN),
            // A GPU its serve could not read; and (without a `gpu` label) a host whose serve says the
            // driver or one of its GPUs does not answer.
            unreadable: format!(
                "({} == 0) or ({} == 0)",
                by_gpu(m::GPU_READABLE),
                by_host(m::GPUS_READABLE)
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
                "max by (Hostname, hostname, job, instance) ({} or timestamp({}) or timestamp({}))",
                sel(m::READING_TIMESTAMP),
                sel(m::FB_USED),
                sel(m::FB_USED_BYTES)
            ),
            // `up` of the scrape targets whose series the selector picks: Prometheus's own word on which
            // addresses it scrapes (a target's labels cannot add one), whatever labels the selector names.
            // One memory series a target (its GPU 0's) is enough to name it: a target whose GPU 0 is gone
            // has its `up` asked by instance after (`all_up`), as any target this query leaves out.
            up: format!(
                "max by (job, instance) (up and on (job, instance) group by (job, instance) \
                 (last_over_time({}[{lb}]) or last_over_time({}[{lb}]) or last_over_time({}[{lb}]))) \
                 or max by (job, instance) (up == 0)",
                p.sel_only(m::FB_USED, Some(&gpu_0)),
                p.sel_only(m::FB_USED_BYTES, Some(&gpu_0)),
                sel(m::SERVE_INFO)
            ),
        }
    }
}

/// The first view's queries: every host's compact summary, a few series a host where its per-GPU series are
/// hundreds (`gpusweep_host_gpu_states` and the rest), and the targets that speak for each host.
pub(super) struct QuickQueries {
    clean_used: String,
    states: String,
    kinds: String,
    unreadable: String,
    /// Every scrape target that named each host within the lookback, by any GPU's memory or a serve's
    /// info: a target that speaks for a host only through its GPU series is its voice too.
    pub(super) voices: String,
}

impl QuickQueries {
    pub(super) fn new(p: &PromServer) -> QuickQueries {
        let by_host = |name: &str| {
            format!(
                "max by (Hostname, hostname, job, instance) ({})",
                p.sel(name)
            )
        };
        let sel = p
            .selector
            .as_ref()
            .map(|s| format!(",{s}"))
            .unwrap_or_default();
        QuickQueries {
            clean_used: by_host(m::HOST_CLEAN_USED),
            states: format!(
                "max by (Hostname, hostname, job, instance, state) ({})",
                p.sel(m::HOST_GPU_STATES)
            ),
            kinds: format!(
                "max by (Hostname, hostname, job, instance, kind, severity) ({})",
                p.sel(m::HOST_FINDING_KINDS)
            ),
            unreadable: format!("{} == 0", by_host(m::GPUS_READABLE)),
            voices: format!(
                "group by (Hostname, hostname, job, instance) (last_over_time({{__name__=~\"{}|{}|{}\"{sel}}}[{}]))",
                m::FB_USED,
                m::FB_USED_BYTES,
                m::SERVE_INFO,
                lookback()
            ),
        }
    }
}

/// The matcher of a target's first GPU.
const GPU_0: &str = r#"gpu="0""#;

/// The first, cheap step of every poll: one series per host of a serve, its revision and its reading's
/// time. Only hosts whose revision moved (or that have none: dcgm-exporter's, a serve before revisions)
/// have their other series read again; at ten thousand hosts most polls touch a tenth of the series.
pub(super) struct GlanceQueries {
    pub(super) revision: String,
    pub(super) taken: String,
    /// Every host's summary and its seal (`proof::query`).
    pub(super) proof: String,
}

impl GlanceQueries {
    pub(super) fn new(p: &PromServer) -> GlanceQueries {
        let by_host = |name: &str| {
            format!(
                "max by (Hostname, hostname, job, instance) ({})",
                p.sel(name)
            )
        };
        GlanceQueries {
            revision: by_host(m::READING_REVISION),
            taken: by_host(m::READING_TIMESTAMP),
            proof: super::proof::query(p),
        }
    }
}

/// What a glance read, by each name's place in `Names`: the revision (None where absent, or where more than
/// one series names the host: a conflict is for the whole read to find) and the reading's time.
pub(super) struct Glance {
    pub(super) revision: Vec<Option<f64>>,
    pub(super) taken: Vec<Option<f64>>,
    /// Its revision's series names it by `Hostname` (as a serve does): a narrowed read can ask for it.
    pub(super) by_hostname: Vec<bool>,
    /// The scrape target that sent its revision: another than the one its reading was believed from is news.
    pub(super) target: Vec<Option<Target>>,
    /// What its summary proves.
    pub(super) proof: Vec<Proof>,
}

/// One host's part of a glance.
pub(super) struct Seen {
    pub(super) revision: Option<f64>,
    pub(super) taken: Option<f64>,
    pub(super) by_hostname: bool,
    pub(super) target: Option<Target>,
    pub(super) proof: Proof,
}

pub(super) async fn glance(
    server: &PromServer,
    http: &HttpClient,
    q: &GlanceQueries,
    names: &Names,
    spent: &Spent<'_>,
) -> Result<Glance, String> {
    let [revision, taken, proof] =
        fetch_all(server, http, [&q.revision, &q.taken, &q.proof], spent).await?;
    let proof = super::proof::proofs(server, names, &proof, http.seal.as_deref())?;
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
        proof,
    })
}

/// Each name's one sample, by its place in `names`: None where there is none, or more than one.
pub(super) fn sole_per_host<'s, 'a>(
    samples: &'s [Sample<'a>],
    names: &Names,
) -> Vec<Option<&'s Sample<'a>>> {
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
pub(super) const MAX_ONLY: usize = 16 * 1024;

/// `Hostname=~"a|b"` naming these hosts, regular-expression and PromQL escaped; None when one is not named by
/// `Hostname` or not a plain name (then every host is read: nothing a target said goes into a query), or
/// when they are too many. Narrowed by the host's name, not its target: every target's series naming the
/// host come, so two targets speaking for one host are still found.
pub(super) fn only_hosts<'a>(names: impl Iterator<Item = Option<&'a str>>) -> Option<String> {
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

/// The queries of an identity read: GPU identities, serves, usable and reserved memory (the sizes), of the
/// hosts `only` names or every host's; and every host's identity digest (`HOST_IDENTITY_DIGEST`), which
/// tells an identity read again which hosts to ask the others of.
pub(super) fn identity_queries(p: &PromServer, only: Option<&str>) -> [String; 5] {
    let lb = lookback();
    let sel = |name: &str| p.sel_only(name, only);
    [
        format!(
            "max by (Hostname, hostname, job, instance, gpu, UUID, modelName, pci_bus_id, device) (last_over_time({}[{lb}]) or last_over_time({}[{lb}]) / 1048576)",
            sel(m::FB_USED),
            sel(m::FB_USED_BYTES)
        ),
        format!(
            "max by (Hostname, hostname, job, instance, scheme, api_path, simulated) (last_over_time({}[{lb}]))",
            sel(m::SERVE_INFO)
        ),
        format!(
            "max by (Hostname, hostname, gpu) (last_over_time({}[{lb}]) + last_over_time({}[{lb}]) or (last_over_time({}[{lb}]) + last_over_time({}[{lb}])) / 1048576)",
            sel(m::FB_FREE),
            sel(m::FB_USED),
            sel(m::FB_FREE_BYTES),
            sel(m::FB_USED_BYTES)
        ),
        format!(
            "max by (Hostname, hostname, gpu) (last_over_time({}[{lb}]) or last_over_time({}[{lb}]) / 1048576)",
            sel(m::FB_RESERVED),
            sel(m::FB_RESERVED_BYTES)
        ),
        format!(
            "max by (Hostname, hostname, job, instance) ({})",
            p.sel(m::HOST_IDENTITY_DIGEST)
        ),
    ]
}

/// Read identities: GPU UUIDs, models, buses, sizes; each host's scrape target, serve and identity digest
/// (asked once the others' answers are let go: what the first read's queries asked together hold at once
/// stays as it was).
pub(super) async fn identities(
    p: &PromServer,
    http: &HttpClient,
    spent: &Spent<'_>,
) -> Result<Identities, String> {
    let [gpus_q, serve_q, usable_q, reserved_q, digest_q] = identity_queries(p, None);
    let [gpu_body, serve_body, usable_body, reserved_body] =
        fetch_all(p, http, [&gpus_q, &serve_q, &usable_q, &reserved_q], spent).await?;
    let now = Instant::now();
    let mut ids = Identities {
        read_at: Some(now),
        every_host_at: Some(now),
        ..Default::default()
    };
    ids.gpus_from(&p.samples(&gpu_body)?);
    ids.sizes_from(&p.samples(&usable_body)?, true);
    ids.sizes_from(&p.samples(&reserved_body)?, false);
    ids.sized(None);
    ids.serves_from(&p.samples(&serve_body)?);
    drop((gpu_body, serve_body, usable_body, reserved_body));
    let digest_body = p.fetch(http, &digest_q, spent).await?;
    ids.digests_from(&p.samples(&digest_body)?);
    drop(digest_body);
    down_voices(p, http, &mut ids, spent).await?;
    Ok(ids)
}

/// The identities a first view needs: each host's serve (where its API answers, whether it is simulated)
/// and every target that spoke for it, the down ones' too. The GPUs' (UUIDs, models, sizes) are left to the
/// next poll, which reads every host whole (`read_at` stays None).
/// The voices a discovery just found are taken as they are (`discovered`): the same query a moment later
/// would cost the server as much again.
pub(super) async fn host_identities(
    p: &PromServer,
    http: &HttpClient,
    q: &QuickQueries,
    discovered: Option<Voices>,
    spent: &Spent<'_>,
) -> Result<Identities, String> {
    let [_, serve_q, ..] = identity_queries(p, None);
    let mut ids = Identities::default();
    let serve_body = if let Some(Voices(voices)) = discovered {
        ids.voices = voices;
        p.fetch(http, &serve_q, spent).await?
    } else {
        let [serve_body, voices_body] = fetch_all(p, http, [&serve_q, &q.voices], spent).await?;
        for x in p.samples(&voices_body)? {
            if let Some(host) = x.host() {
                ids.heard(host, &x);
            }
        }
        serve_body
    };
    ids.serves_from(&p.samples(&serve_body)?);
    drop(serve_body);
    down_voices(p, http, &mut ids, spent).await?;
    Ok(ids)
}

/// Read identities again. Each host's identity digest first: a host whose one digest is as before, from the
/// same target, keeps what it had (its GPUs, serve, voices); the others (a digest moved, gone, new, or said
/// by more than one target; a host without one, as dcgm-exporter's) have their GPUs and serve asked again
/// by `Hostname`. Every host's are asked at least every `pace::EVERY_HOST_IDENTITIES` (a target naming a
/// host through its GPU series alone is heard then, or at once when the host's reading moves), and whenever
/// the hosts to ask cannot be named. The sizes, fixed for a GPU's life, are kept from `known` for a GPU of
/// the same UUID and asked only of the hosts with a GPU not sized before.
pub(super) async fn identities_again(
    p: &PromServer,
    http: &HttpClient,
    known: &Identities,
    spent: &Spent<'_>,
) -> Result<Identities, String> {
    let now = Instant::now();
    let [.., digest_q] = identity_queries(p, None);
    let mut ids = Identities {
        read_at: Some(now),
        ..Default::default()
    };
    let every_host_due = known
        .every_host_at
        .is_none_or(|t| now.saturating_duration_since(t) >= super::pace::EVERY_HOST_IDENTITIES);
    let digest_body = p.fetch(http, &digest_q, spent).await?;
    ids.digests_from(&p.samples(&digest_body)?);
    drop(digest_body);
    let again = known.to_ask_again(&ids.digests);
    // None: every host's are asked.
    let only = if every_host_due {
        None
    } else {
        only_hosts(again.iter().map(|h| {
            (known.by_hostname.contains(h) || ids.by_hostname.contains(h)).then_some(h.as_str())
        }))
    };
    if only.is_some() {
        ids.every_host_at = known.every_host_at;
        ids.keep_unasked(known, &again);
    } else {
        ids.every_host_at = Some(now);
    }
    let gpu_body = if only.is_some() && again.is_empty() {
        None
    } else {
        let [gpus_q, serve_q, ..] = identity_queries(p, only.as_deref());
        let [gpu_body, serve_body] = fetch_all(p, http, [&gpus_q, &serve_q], spent).await?;
        ids.serves_from(&p.samples(&serve_body)?);
        Some(gpu_body)
    };
    let gpu_samples = match &gpu_body {
        Some(b) => p.samples(b)?,
        None => Vec::new(),
    };
    ids.gpus_from(&gpu_samples);
    let to_size = ids.keep_sizes(known);
    if !to_size.is_empty() {
        let by_hostname: BTreeSet<&str> = gpu_samples
            .iter()
            .filter_map(|x| x.label(m::L_HOSTNAME).filter(|h| x.host() == Some(*h)))
            .collect();
        let only = only_hosts(
            to_size
                .iter()
                .map(|h| by_hostname.contains(h.as_str()).then_some(h.as_str())),
        );
        let [_, _, usable_q, reserved_q, _] = identity_queries(p, only.as_deref());
        let [usable_body, reserved_body] =
            fetch_all(p, http, [&usable_q, &reserved_q], spent).await?;
        ids.sizes_from(&p.samples(&usable_body)?, true);
        ids.sizes_from(&p.samples(&reserved_body)?, false);
        ids.sized(only.is_some().then_some(&to_size));
    }
    drop(gpu_samples);
    drop(gpu_body);
    down_voices(p, http, &mut ids, spent).await?;
    Ok(ids)
}

/// How far back a target that is down now is asked which host it spoke for: past the lookback, a host
/// whose own target has been down for an hour is still that target's (and not an impostor's to speak for).
pub(super) const DOWN_LOOKBACK: &str = "7d";

/// The most down targets asked about, in matchers of at most `MAX_ONLY` bytes each: as many as a fleet
/// may have hosts.
pub(super) const MAX_DOWN_ASKED: usize = MAX_HOSTS;

/// Every target Prometheus scrapes that is down now, and the host its series last named within
/// `DOWN_LOOKBACK`: a voice of that host for as long as Prometheus keeps scraping it. Few targets are down
/// at once, so their old series are read by instance alone.
pub(super) async fn down_voices(
    p: &PromServer,
    http: &HttpClient,
    ids: &mut Identities,
    spent: &Spent<'_>,
) -> Result<(), String> {
    let body = p
        .fetch(http, "max by (job, instance) (up == 0)", spent)
        .await?;
    let samples = p.samples(&body)?;
    let down: BTreeSet<&str> = samples.iter().filter_map(|s| s.label("instance")).collect();
    let names = format!("{}|{}|{}", m::SERVE_INFO, m::FB_USED, m::FB_USED_BYTES);
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
        let body = p.fetch(http, &q, spent).await?;
        for x in p.samples(&body)? {
            if let Some(host) = x.host() {
                ids.heard(host, &x);
            }
        }
    }
    Ok(())
}

/// The entries of a map keyed by (host, …) whose host `kept` says, copied.
fn of_hosts<'a, K: Clone, V: Clone>(
    map: &'a HashMap<(String, K), V>,
    kept: impl Fn(&String) -> bool + 'a,
) -> impl Iterator<Item = ((String, K), V)> + 'a {
    map.iter()
        .filter(move |((h, _), _)| kept(h))
        .map(|(k, v)| (k.clone(), v.clone()))
}

impl Identities {
    /// Each GPU's UUID, model, bus and minor; each host's scrape target.
    pub(super) fn gpus_from(&mut self, samples: &[Sample]) {
        for x in samples {
            let (Some(host), Some(gpu)) = (x.host(), x.gpu()) else {
                continue;
            };
            self.heard(host, x);
            if x.label(m::L_HOSTNAME) == Some(host) {
                self.by_hostname.insert(host.to_string());
            }
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

    /// The target that sent `x` spoke for `host`: one of its voices.
    fn heard(&mut self, host: &str, x: &Sample) {
        self.voices
            .entry(host.to_string())
            .or_default()
            .insert(x.target());
    }

    /// Each host's identity digests, by the target that said each (an integer below 2^53; anything else is
    /// no digest, and the host is asked again). A target that sends one for a host is its voice, as one that
    /// sends any other series naming it.
    pub(super) fn digests_from(&mut self, samples: &[Sample]) {
        for x in samples {
            let Some(host) = x.host() else { continue };
            self.heard(host, x);
            let Some(d) = x.value().and_then(whole) else {
                continue;
            };
            if x.label(m::L_HOSTNAME) == Some(host) {
                self.by_hostname.insert(host.to_string());
            }
            self.digests
                .entry(host.to_string())
                .or_default()
                .insert((x.target(), d));
        }
    }

    /// The hosts whose identities an identity read again asks for: every host known or with a digest now,
    /// but those whose one digest (`now`) is the one it had, from the same target.
    pub(super) fn to_ask_again(
        &self,
        now: &HashMap<String, BTreeSet<(Target, u64)>>,
    ) -> BTreeSet<String> {
        let known = self
            .gpus
            .keys()
            .map(|(h, _)| h)
            .chain(self.voices.keys())
            .chain(self.serve.keys().map(|(h, _)| h))
            .chain(self.digests.keys())
            .chain(now.keys());
        known
            .filter(|h| {
                let d = now.get(*h);
                d.is_none_or(|d| d.len() != 1) || self.digests.get(*h) != d
            })
            .cloned()
            .collect()
    }

    /// Keep what `known` had of every host not asked again (`asked`): its GPUs, serve and voices.
    pub(super) fn keep_unasked(&mut self, known: &Identities, asked: &BTreeSet<String>) {
        let kept = |h: &String| !asked.contains(h);
        self.gpus.extend(of_hosts(&known.gpus, kept));
        self.serve.extend(of_hosts(&known.serve, kept));
        self.simulated
            .extend(known.simulated.iter().filter(|(h, _)| kept(h)).cloned());
        for (h, v) in known.voices.iter().filter(|(h, _)| kept(h)) {
            self.voices
                .entry(h.clone())
                .or_default()
                .extend(v.iter().cloned());
        }
        self.by_hostname
            .extend(known.by_hostname.iter().filter(|h| kept(h)).cloned());
    }

    /// Each GPU's usable memory (free + used) or its reservation, in MiB.
    pub(super) fn sizes_from(&mut self, samples: &[Sample], usable: bool) {
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

    /// Sizes kept from `known` for every GPU of the same UUID that was sized there; the hosts with a GPU
    /// still to size (new, swapped, or never asked).
    pub(super) fn keep_sizes(&mut self, known: &Identities) -> BTreeSet<String> {
        let mut to_size = BTreeSet::new();
        for (key, id) in &mut self.gpus {
            match known.gpus.get(key) {
                Some(k) if k.sized && k.uuid == id.uuid => {
                    id.usable_mib = k.usable_mib;
                    id.reserved_mib = k.reserved_mib;
                    id.sized = true;
                }
                _ => {
                    to_size.insert(key.0.clone());
                }
            }
        }
        to_size
    }

    /// Mark the GPUs of these hosts (every GPU: None) as sized: asked for their sizes, whatever came (a
    /// size Prometheus does not have stays unknown, and is not asked for again while the GPU stays).
    pub(super) fn sized(&mut self, hosts: Option<&BTreeSet<String>>) {
        for ((host, _), id) in &mut self.gpus {
            if hosts.is_none_or(|h| h.contains(host)) {
                id.sized = true;
            }
        }
    }

    /// The hosts whose identities differ between `self` and `new`: a GPU's, a serve's, whether it says it is
    /// simulated, the targets that spoke for it.
    pub(super) fn changed_hosts<'a>(&'a self, new: &'a Identities) -> HashSet<&'a str> {
        let mut changed = HashSet::new();
        for (a, b) in [(self, new), (new, self)] {
            for (key, id) in &a.gpus {
                if b.gpus.get(key) != Some(id) {
                    changed.insert(key.0.as_str());
                }
            }
            for (key, serve) in &a.serve {
                if b.serve.get(key) != Some(serve) {
                    changed.insert(key.0.as_str());
                }
            }
            for key in a.simulated.difference(&b.simulated) {
                changed.insert(key.0.as_str());
            }
            for (host, voices) in &a.voices {
                if b.voices.get(host) != Some(voices) {
                    changed.insert(host.as_str());
                }
            }
        }
        changed
    }

    /// Where each host's serve answers: its scrape target, the scheme it says, and a path of the shape a
    /// serve uses (nothing else may end up in the address the client opens).
    pub(super) fn serves_from(&mut self, samples: &[Sample]) {
        for x in samples {
            let Some(host) = x.host() else { continue };
            self.heard(host, x);
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
    pub(super) fn same_but_time(&self, b: &HostData) -> bool {
        self.gpus == b.gpus
            && self.gpusweep == b.gpusweep
            && self.counts == b.counts
            && self.targets == b.targets
    }

    /// When the host's serve took its reading, else when it was polled.
    pub(super) fn taken_at_ms(&self, polled_ms: u64) -> u64 {
        self.taken_s
            .filter(|t| *t > 0.0)
            .and_then(|t| whole(t * 1000.0))
            .unwrap_or(polled_ms)
    }
}

/// One poll: every query, joined into per-host data, by each name's place in `names` (hosts Prometheus
/// knows but the fleet does not are left out).
pub(super) async fn poll(
    server: &PromServer,
    http: &HttpClient,
    queries: &Queries,
    names: &Names,
    busy: &AtomicU64,
) -> Result<Polled, String> {
    let spent = Spent::new(busy);
    let answers = fetch_all(server, http, queries.whole(), &spent).await?;
    let (hosts, up) = table(server, names, &answers)?;
    let up = all_up(server, http, &hosts, up, &spent).await?;
    Ok((hosts, up))
}

/// Every host's summary, joined into per-host data as `poll` joins a whole read, and which hosts' details
/// are still to read (by each name's place in `names`).
pub(super) async fn summary(
    server: &PromServer,
    http: &HttpClient,
    queries: &Queries,
    names: &Names,
    spent: &Spent<'_>,
) -> Result<(Polled, Vec<bool>), String> {
    let answers = fetch_all(server, http, queries.summary(), spent).await?;
    let ((hosts, up), details) = summary_table(server, names, &answers)?;
    let up = all_up(server, http, &hosts, up, spent).await?;
    Ok(((hosts, up), details))
}

/// Every host's compact summary (`QuickQueries`), joined into per-host data (see `quick_table`), with `up`
/// of every target that sent a series (`queries.up` is the whole read's).
pub(super) async fn quick(
    server: &PromServer,
    http: &HttpClient,
    q: &QuickQueries,
    queries: &Queries,
    names: &Names,
    spent: &Spent<'_>,
) -> Result<Polled, String> {
    let answers = fetch_all(
        server,
        http,
        [
            &q.clean_used,
            &q.states,
            &q.kinds,
            &q.unreadable,
            &queries.up,
        ],
        spent,
    )
    .await?;
    let (hosts, up) = quick_table(server, names, &answers)?;
    let up = all_up(server, http, &hosts, up, spent).await?;
    Ok((hosts, up))
}

/// The details a summary left, read with `queries` (narrowed to the hosts that want them, or not) and
/// folded into the summary's data (`polled`): together what a whole read says.
pub(super) async fn details(
    server: &PromServer,
    http: &HttpClient,
    queries: &Queries,
    names: &Names,
    polled: Polled,
    busy: &AtomicU64,
) -> Result<Polled, String> {
    let spent = Spent::new(busy);
    let answers = fetch_all(server, http, queries.details(), &spent).await?;
    let (mut hosts, up) = polled;
    fold_details(server, names, &mut hosts, &answers)?;
    // A target heard only in the details is asked for its `up` too.
    let up = all_up(server, http, &hosts, up, &spent).await?;
    Ok((hosts, up))
}

/// Ask these queries together, within `spent`'s share: their answers in the same order, or the first error.
pub(super) async fn fetch_all<const N: usize>(
    server: &PromServer,
    http: &HttpClient,
    queries: [&str; N],
    spent: &Spent<'_>,
) -> Result<[bytes::Bytes; N], String> {
    let answers = futures::future::join_all(queries.map(|q| server.fetch(http, q, spent))).await;
    let answers: Vec<bytes::Bytes> = answers.into_iter().collect::<Result<_, _>>()?;
    answers
        .try_into()
        .map_err(|_| "Prometheus: an answer went missing".to_string())
}

/// `up` of every target whose series came: those the `up` query left out (their series came without
/// memory or a serve's info, its own filter) asked for by instance, so a target Prometheus scrapes is never
/// taken for one it does not.
async fn all_up(
    server: &PromServer,
    http: &HttpClient,
    hosts: &[Option<HostData>],
    up: Up,
    spent: &Spent<'_>,
) -> Result<Up, String> {
    let targets = hosts.iter().flatten().flat_map(|d| d.targets.iter());
    up_of(server, http, targets, up, spent).await
}

/// `up` of every voice of every host too (see `all_up`): a target that named a host only by GPU series a
/// first view does not read is still a voice, and one without `up` would be taken for one Prometheus no
/// longer scrapes.
pub(super) async fn voices_up(
    server: &PromServer,
    http: &HttpClient,
    ids: &Identities,
    up: Up,
    spent: &Spent<'_>,
) -> Result<Up, String> {
    up_of(server, http, ids.voices.values().flatten(), up, spent).await
}

/// `up` with every one of `targets` it lacks asked for by instance.
async fn up_of<'t>(
    server: &PromServer,
    http: &HttpClient,
    targets: impl Iterator<Item = &'t Target>,
    mut up: Up,
    spent: &Spent<'_>,
) -> Result<Up, String> {
    let missing: BTreeSet<&str> = targets
        .filter(|t| !up.contains_key(*t))
        .map(|t| t.instance.as_str())
        .collect();
    for m in instance_matchers(missing.into_iter(), MAX_DOWN_ASKED).0 {
        let body = server
            .fetch(http, &format!("max by (job, instance) (up{{{m}}})"), spent)
            .await?;
        for s in server.samples(&body)? {
            if let Some(v) = s.value() {
                up.insert(s.target(), v);
            }
        }
    }
    Ok(up)
}

/// `instance=~"a|b"` matchers naming these instances, each at most `MAX_ONLY` bytes, every regular-
/// expression metacharacter and PromQL string escape escaped; at most `most` instances. Also how many could
/// not be named (past `most`, or with a control character): what was asked of those is unknown.
pub(super) fn instance_matchers<'a>(
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
