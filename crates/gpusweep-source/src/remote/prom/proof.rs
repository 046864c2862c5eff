//! Each host's summary as Prometheus holds it, and whether its seal proves that the host's own serve said
//! it (`gpusweep_core::seal`). Read in one query, so one answer holds one moment: Prometheus commits a
//! scrape whole, and a query never sees half of one.
//!
//! Labels are anyone's to write: a Pushgateway's or a federated series may carry a serve's own `job` and
//! `instance`, and Prometheus then keeps one series of both, the last scraped winning. So two answers for
//! one part of a host's summary are a conflict, a part without its seal or a seal that does not check is
//! no one's word, and a sealed reading much older than Prometheus's answer is a replay.

use std::collections::BTreeMap;

use super::PromServer;
use super::answer::Sample;
use super::query::Query;
use super::reading::whole;
use super::table::Names;
use gpusweep_core::format::escape;
use gpusweep_core::metrics as m;
use gpusweep_core::model::GpuState;
use gpusweep_core::seal::{AHEAD_MS, FRESH_MS, HostSummary, PART_BITS, SealKey};

/// What a host's summary proves.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) enum Proof {
    /// Nothing to check: no summary or seal for the host, or no fleet key here. Its reading, if any, rests on
    /// labels.
    #[default]
    None,
    /// The seal checks: the host's own serve said this.
    Proven(HostSummary),
    /// A seal or a summary is there but does not hold: two answers, a seal that does not check, a replay.
    /// Why, for people.
    Broken(String),
}

impl Proof {
    /// Broken where it proves a reading older than one already proven of the host (`newest`, moved on
    /// where this one is newer): a replay.
    pub(super) fn not_older_than(self, name: &str, newest: &mut u64) -> Proof {
        match self {
            Proof::Proven(s) if s.taken_ms < *newest => Proof::Broken(format!(
                "host {:?}'s summary in Prometheus is not its serve's word: a sealed reading {} ms older \
                 than one already seen (a replay)",
                escape(name),
                *newest - s.taken_ms
            )),
            Proof::Proven(s) => {
                *newest = s.taken_ms;
                Proof::Proven(s)
            }
            other => other,
        }
    }

    pub(super) fn proven(&self) -> Option<&HostSummary> {
        match self {
            Proof::Proven(s) => Some(s),
            _ => None,
        }
    }
}

/// The one query of every host's summary and seal: the series whole, not aggregated (an aggregation would
/// fold two answers into one).
pub(super) fn query(p: &PromServer) -> String {
    let sel = p
        .selector
        .as_ref()
        .map(|s| format!(",{s}"))
        .unwrap_or_default();
    format!(
        "{{__name__=~\"{}|{}|{}|{}|{}\"{sel}}}",
        m::HOST_SEAL,
        m::HOST_GPU_STATES,
        m::HOST_CLEAN_USED,
        m::HOST_FINDING_KINDS,
        m::GPUS_READABLE
    )
}

/// One host's parts as they came, each with every value sent for it.
#[derive(Default)]
struct Parts {
    readable: Vec<f64>,
    states: BTreeMap<String, Vec<f64>>,
    clean_used: Vec<f64>,
    kinds: BTreeMap<(String, String), Vec<f64>>,
    /// part -> (value, when Prometheus answered)
    seal: BTreeMap<String, Vec<(f64, Option<u64>)>>,
}

/// Each host's proof, by its place in `names`, from the answer of `query`. `key`: the fleet's key (None:
/// nothing can be proven here).
pub(super) fn proofs(
    server: &PromServer,
    names: &Names,
    body: &[u8],
    key: Option<&SealKey>,
) -> Result<Vec<Proof>, String> {
    let mut parts: Vec<Option<Parts>> = std::iter::repeat_with(|| None).take(names.len()).collect();
    for x in server.samples(body)? {
        let Some(at) = x.host().and_then(|h| names.of(h)) else {
            continue;
        };
        let p = parts[at].get_or_insert_with(Parts::default);
        add(p, &x);
    }
    let hosts = names.in_order();
    Ok(parts
        .into_iter()
        .zip(hosts)
        .map(|(p, name)| match (p, key) {
            (None, _) | (_, None) => Proof::None,
            (Some(p), Some(key)) => decide(name, &p, key),
        })
        .collect())
}

fn add(p: &mut Parts, x: &Sample) {
    let v = x.value().unwrap_or(f64::NAN);
    match x.label("__name__") {
        Some(m::GPUS_READABLE) => p.readable.push(v),
        Some(m::HOST_CLEAN_USED) => p.clean_used.push(v),
        Some(m::HOST_GPU_STATES) => p
            .states
            .entry(x.label("state").unwrap_or_default().to_string())
            .or_default()
            .push(v),
        Some(m::HOST_FINDING_KINDS) => p
            .kinds
            .entry((
                x.label("kind").unwrap_or_default().to_string(),
                x.label("severity").unwrap_or_default().to_string(),
            ))
            .or_default()
            .push(v),
        Some(m::HOST_SEAL) => p
            .seal
            .entry(x.label(m::L_PART).unwrap_or_default().to_string())
            .or_default()
            .push((v, x.answered_ms())),
        _ => {}
    }
}

/// The one value sent for a part, as a whole number; why not, where two or none came or it is not one.
fn sole(what: &str, vs: &[f64]) -> Result<Option<u64>, String> {
    match vs {
        [] => Ok(None),
        [v] => whole(*v)
            .map(Some)
            .ok_or_else(|| format!("its {what} is not a whole number ({v})")),
        _ => Err(format!(
            "{} answers for its {what}: more than one target (a Pushgateway, federation or relabelling) \
             speaks for it",
            vs.len()
        )),
    }
}

/// Whether the parts of `name`'s summary hold under `key`.
fn decide(name: &str, p: &Parts, key: &SealKey) -> Proof {
    match summary_of(name, p)
        .and_then(|(s, seal, scraped)| check(&s, seal, scraped, key).map(|()| s))
    {
        Ok(s) => Proof::Proven(s),
        Err(why) => Proof::Broken(format!(
            "host {:?}'s summary in Prometheus is not its serve's word: {why}",
            escape(name)
        )),
    }
}

/// The summary the parts say, its seal and when Prometheus answered for it.
fn summary_of(name: &str, p: &Parts) -> Result<(HostSummary, [u64; 2], Option<u64>), String> {
    let seal_part = |part: &str| -> Result<(u64, Option<u64>), String> {
        let got = p.seal.get(part).map_or(&[][..], Vec::as_slice);
        let values: Vec<f64> = got.iter().map(|(v, _)| *v).collect();
        let v = sole(&format!("seal's {part}"), &values)?.ok_or_else(|| {
            "it has no seal (is its serve started with the fleet's --seal-key?)".to_string()
        })?;
        Ok((v, got.first().and_then(|(_, at)| *at)))
    };
    let (taken_ms, scraped) = seal_part("taken_ms")?;
    let (mac_0, _) = seal_part("mac_0")?;
    let (mac_1, _) = seal_part("mac_1")?;
    // A serve says whether its readings are simulated; one that says nothing is taken for real, and its
    // seal then checks only if it is.
    let simulated = match p.seal.get("simulated").map(Vec::as_slice) {
        None | Some([]) => false,
        Some(v) => {
            let values: Vec<f64> = v.iter().map(|(x, _)| *x).collect();
            sole("seal's simulated", &values)? == Some(1)
        }
    };
    if mac_0 >> PART_BITS != 0 || mac_1 >> PART_BITS != 0 {
        return Err("its seal's parts are out of range".into());
    }
    let readable = match sole("gpusweep_gpus_readable", &p.readable)? {
        None => None,
        Some(0) => Some(false),
        Some(1) => Some(true),
        Some(v) => return Err(format!("its gpusweep_gpus_readable is {v}")),
    };
    let mut states = BTreeMap::new();
    for (word, vs) in &p.states {
        let st = GpuState::parse(word)
            .ok_or_else(|| format!("a state this client does not know ({:?})", escape(word)))?;
        if let Some(mask) = sole(&format!("{word} GPUs"), vs)? {
            states.insert(st, mask);
        }
    }
    let mut kinds = BTreeMap::new();
    for ((kind, sev), vs) in &p.kinds {
        if let Some(n) = sole(&format!("count of {kind} findings"), vs)? {
            kinds.insert((kind.clone(), sev.clone()), n);
        }
    }
    let s = HostSummary {
        host: name.to_string(),
        taken_ms,
        readable,
        states,
        clean_used: sole("clean GPUs' bytes", &p.clean_used)?,
        kinds,
        simulated,
    };
    Ok((s, [mac_0, mac_1], scraped))
}

/// The seal checks, and the reading is as fresh as an honest scrape leaves it.
fn check(
    s: &HostSummary,
    seal: [u64; 2],
    scraped: Option<u64>,
    key: &SealKey,
) -> Result<(), String> {
    if !s.verify(key, seal) {
        return Err(
            "its seal does not check (a part of it written by another than its serve, two serves' parts \
             mixed, or another fleet key)"
                .into(),
        );
    }
    if let Some(at) = scraped {
        if at.saturating_sub(s.taken_ms) > FRESH_MS {
            return Err(format!(
                "its sealed reading is {} s old (a replay of one that was once true?)",
                (at - s.taken_ms) / 1000
            ));
        }
        if s.taken_ms.saturating_sub(at) > AHEAD_MS {
            return Err("its sealed reading is later than Prometheus's clock".into());
        }
    }
    Ok(())
}
