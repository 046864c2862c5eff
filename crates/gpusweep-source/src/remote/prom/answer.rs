//! What Prometheus answers: an instant query's samples, borrowed from the answer and bounded before they
//! are held, and the scrape target each speaks for.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};

use serde::Deserialize;

use gpusweep_core::format::escape;
use gpusweep_core::metrics as m;

#[derive(Deserialize)]
pub(super) struct Answer<'a> {
    #[serde(borrow)]
    pub(super) status: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) data: Option<Data<'a>>,
    pub(super) error: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct Data<'a> {
    #[serde(borrow, deserialize_with = "at_most_max_series")]
    pub(super) result: Vec<Sample<'a>>,
}

/// The most series one answer may hold. Every query is aggregated per host and GPU: 10,000 hosts of 8 GPUs
/// answer with 80,000. A sample costs ~340 bytes once parsed, ten times its text, so an answer of tiny
/// samples would otherwise turn 128 MiB into gigabytes.
pub(super) const MAX_SERIES: usize = 500_000;

/// An answer's samples, refused past `MAX_SERIES` before more are held.
pub(super) fn at_most_max_series<'de: 'a, 'a, D: serde::Deserializer<'de>>(
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
pub(super) struct Text<'a>(#[serde(borrow)] pub(super) Cow<'a, str>);

/// One sample of an instant query, borrowing from the answer: a thousand hosts' answer costs next to no
/// allocation. Only the labels gpusweep reads are kept; the rest are skipped.
#[derive(Deserialize)]
pub(super) struct Sample<'a> {
    #[serde(borrow)]
    pub(super) metric: Labels<'a>,
    /// (the query's time in Unix seconds, the value).
    #[serde(borrow)]
    pub(super) value: (f64, Text<'a>),
}

#[derive(Deserialize, Default)]
pub(super) struct Labels<'a> {
    #[serde(borrow, rename = "Hostname")]
    pub(super) hostname: Option<Text<'a>>,
    /// dcgm-exporter's spelling since its PR #655.
    #[serde(borrow, rename = "hostname")]
    pub(super) hostname_new: Option<Text<'a>>,
    #[serde(borrow)]
    pub(super) instance: Option<Text<'a>>,
    #[serde(borrow)]
    pub(super) job: Option<Text<'a>>,
    #[serde(borrow)]
    pub(super) gpu: Option<Text<'a>>,
    #[serde(borrow)]
    pub(super) kind: Option<Text<'a>>,
    #[serde(borrow)]
    pub(super) severity: Option<Text<'a>>,
    #[serde(borrow, rename = "UUID")]
    pub(super) uuid: Option<Text<'a>>,
    #[serde(borrow, rename = "modelName")]
    pub(super) model: Option<Text<'a>>,
    #[serde(borrow)]
    pub(super) pci_bus_id: Option<Text<'a>>,
    #[serde(borrow)]
    pub(super) device: Option<Text<'a>>,
    #[serde(borrow)]
    pub(super) scheme: Option<Text<'a>>,
    #[serde(borrow)]
    pub(super) api_path: Option<Text<'a>>,
    #[serde(borrow)]
    pub(super) simulated: Option<Text<'a>>,
    #[serde(borrow)]
    pub(super) state: Option<Text<'a>>,
    /// A seal's part (`gpusweep_host_seal`).
    #[serde(borrow)]
    pub(super) part: Option<Text<'a>>,
    #[serde(borrow, rename = "__name__")]
    pub(super) name: Option<Text<'a>>,
}

impl Sample<'_> {
    pub(super) fn label(&self, k: &str) -> Option<&str> {
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
            "state" => &l.state,
            "part" => &l.part,
            "__name__" => &l.name,
            _ => return None,
        };
        text.as_ref().map(|t| &*t.0)
    }
    pub(super) fn value(&self) -> Option<f64> {
        self.value.1.0.parse::<f64>().ok()
    }
    /// When Prometheus answered for it (the instant query's time, Unix milliseconds): Prometheus's own
    /// clock, which no target sets.
    pub(super) fn answered_ms(&self) -> Option<u64> {
        whole(self.value.0 * 1000.0)
    }
    /// The host it belongs to: its `Hostname` (dcgm-exporter's and gpusweep's label), else `hostname`
    /// (newer dcgm-exporters'), else `instance`.
    pub(super) fn host(&self) -> Option<&str> {
        self.label(m::L_HOSTNAME)
            .filter(|h| !h.is_empty())
            .or_else(|| self.label(m::L_HOSTNAME_NEW).filter(|h| !h.is_empty()))
            .or_else(|| self.label("instance"))
    }
    pub(super) fn gpu(&self) -> Option<u32> {
        self.label(m::L_GPU)?.parse().ok()
    }
    /// The scrape target that sent it, as Prometheus itself labels it (`job`, `instance`): not something the
    /// target can choose.
    pub(super) fn target(&self) -> Target {
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
pub(super) fn conflict(name: &str, targets: &BTreeSet<Target>) -> Option<String> {
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

/// Prometheus's own `up` of each scrape target it scrapes (a target cannot forge it): those that named a
/// fleet host in the lookback, and every target that is down.
pub(super) type Up = HashMap<Target, f64>;

/// A sample as a whole number; a NaN, an infinity or a negative number is no reading.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // checked finite and >= 0 first
pub(super) fn whole(x: f64) -> Option<u64> {
    (x.is_finite() && x >= 0.0).then_some(x as u64)
}
