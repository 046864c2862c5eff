//! Answers joined into per-host data: a whole read's, a summary's, and the details a summary leaves.

use std::collections::HashMap;

use super::PromServer;
use super::answer::{Sample, Up};
use super::query::Query;
use super::reading::{HostData, PromHost, whole};
use Part::{Clean, CleanUsed, Findings, States, Taken, Unexplained, Unreadable, Used};
use gpusweep_core::metrics as m;
use gpusweep_core::model::GpuState;

/// The fleet's names, each to its place in a poll's table: looked up once per sample, so a thousand hosts'
/// answers cost no tree walk (the names are copied once, when the poller starts).
pub(super) struct Names {
    pub(super) place: HashMap<String, usize>,
    /// Each place's name.
    order: Vec<String>,
}

impl Names {
    pub(super) fn new(hosts: &[PromHost]) -> Names {
        let mut place = HashMap::with_capacity(hosts.len());
        let mut order = Vec::with_capacity(hosts.len());
        for h in hosts {
            let next = place.len();
            place.entry(h.name.clone()).or_insert_with(|| {
                order.push(h.name.clone());
                next
            });
        }
        Names { place, order }
    }
    /// The names, each at its place.
    pub(super) fn in_order(&self) -> impl Iterator<Item = &str> {
        self.order.iter().map(String::as_str)
    }
    pub(super) fn of(&self, name: &str) -> Option<usize> {
        self.place.get(name).copied()
    }
    pub(super) fn len(&self) -> usize {
        self.place.len()
    }
}

/// What one poll read: each host's data by its place in `Names` (None: no series for it), and `up` by
/// scrape target.
pub(super) type Polled = (Vec<Option<HostData>>, Up);

/// What an answer says of each host it names.
#[derive(Clone, Copy)]
pub(super) enum Part {
    /// Memory used per GPU (dcgm-exporter's and a serve's).
    Used,
    /// A serve's clean per GPU.
    Clean,
    /// GPUs a serve could not read, and (a sample without `gpu`) a serve that says the driver or one of its
    /// GPUs does not answer.
    Unreadable,
    /// Unexplained bytes per GPU, by kind.
    Unexplained,
    /// Findings by kind and severity.
    Findings,
    /// The reading's time.
    Taken,
    /// A compact summary's GPU states, each a mask of GPU indices.
    States,
    /// A compact summary's bytes used on the clean GPUs: its presence says the states are whole.
    CleanUsed,
}

/// The host's data in this poll's table, begun at its first sample; the sample's scrape target is noted.
pub(super) fn of<'t>(
    table: &'t mut [Option<HostData>],
    names: &Names,
    sample: &Sample,
) -> Option<&'t mut HostData> {
    let at = names.of(sample.host()?)?;
    let data = table.get_mut(at)?.get_or_insert_with(HostData::default);
    data.targets.insert(sample.target());
    Some(data)
}

/// Fold answers into `hosts` (by each name's place in `names`), each parsed, folded in and let go before
/// the next: one answer's samples are held at a time.
pub(super) fn fold<'b>(
    server: &PromServer,
    names: &Names,
    hosts: &mut [Option<HostData>],
    answers: impl IntoIterator<Item = (Part, &'b bytes::Bytes)>,
) -> Result<(), String> {
    for (part, body) in answers {
        for sample in server.samples(body)? {
            fold_sample(names, hosts, part, &sample);
        }
    }
    // Prometheus may answer in any order: sorted, two polls that say the same compare equal.
    for data in hosts.iter_mut().flatten() {
        data.counts.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        for g in data.gpus.values_mut() {
            g.unexplained.sort_by(|a, b| a.0.cmp(&b.0));
        }
    }
    Ok(())
}

/// One sample into its host's data. A per-GPU part's sample without `gpu` says nothing (but that a serve
/// cannot read its GPUs), and a finding without its kind, severity or count nothing: neither begins a host's
/// data or names a target of it.
fn fold_sample(names: &Names, hosts: &mut [Option<HostData>], part: Part, x: &Sample) {
    if let Part::Findings = part {
        let (Some(kind), Some(sev), Some(n)) = (x.label("kind"), x.label("severity"), x.value())
        else {
            return;
        };
        if let Some(data) = of(hosts, names, x) {
            data.gpusweep = true;
            data.counts.push((kind.to_string(), sev.to_string(), n));
        }
        return;
    }
    if let Part::Taken = part {
        if let Some(data) = of(hosts, names, x) {
            data.taken_s = x.value().into_iter().chain(data.taken_s).reduce(f64::max);
        }
        return;
    }
    if let Part::States | Part::CleanUsed = part {
        fold_summary(names, hosts, part, x);
        return;
    }
    let Some(gpu) = x.gpu() else {
        if let Part::Unreadable = part
            && let Some(data) = of(hosts, names, x)
        {
            data.gpusweep = true;
            data.gpus_unreadable = true;
        }
        return;
    };
    let Some(data) = of(hosts, names, x) else {
        return;
    };
    // Every part but memory comes from a serve alone.
    data.gpusweep |= !matches!(part, Part::Used);
    let g = data.gpus.entry(gpu).or_default();
    match part {
        Part::Used => g.used = x.value(),
        Part::Clean => g.clean = x.value(),
        Part::Unreadable => g.unreadable = true,
        Part::Unexplained => {
            if let (Some(k), Some(v)) = (x.label("kind"), x.value()) {
                g.unexplained.push((k.to_string(), v));
            }
        }
        Part::Findings | Part::Taken | Part::States | Part::CleanUsed => {}
    }
}

/// One sample of a compact summary into its host's data. A state or a mask this client cannot read (a
/// newer serve's state, a mask past `STATE_MASK_GPUS`) leaves a GPU unaccounted for: the host's summary is
/// then not whole, and it waits for its per-GPU series.
fn fold_summary(names: &Names, hosts: &mut [Option<HostData>], part: Part, x: &Sample) {
    let Some(data) = of(hosts, names, x) else {
        return;
    };
    data.gpusweep = true;
    if let Part::CleanUsed = part {
        data.quick = true;
        data.clean_used = x.value();
        return;
    }
    let state = x.label("state").and_then(GpuState::parse);
    let mask = x
        .value()
        .and_then(whole)
        .filter(|m| *m < 1u64 << m::STATE_MASK_GPUS);
    let (Some(state), Some(mask)) = (state, mask) else {
        data.quick = false;
        data.clean_used = None;
        return;
    };
    for i in (0..m::STATE_MASK_GPUS).filter(|i| mask & (1u64 << i) != 0) {
        let g = data.gpus.entry(i).or_default();
        // A GPU said to be in two states is in neither that can be told.
        g.state = Some(match g.state {
            Some(s) if s != state => GpuState::Unknown,
            _ => state,
        });
    }
}

/// `up` by scrape target, from the answer of the `up` query.
pub(super) fn ups(server: &PromServer, body: &[u8]) -> Result<Up, String> {
    Ok(server
        .samples(body)?
        .iter()
        .filter_map(|sample| Some((sample.target(), sample.value()?)))
        .collect())
}

/// Answers folded into new per-host data, one place for each name.
fn folded<'b>(
    server: &PromServer,
    names: &Names,
    answers: impl IntoIterator<Item = (Part, &'b bytes::Bytes)>,
) -> Result<Vec<Option<HostData>>, String> {
    let mut hosts: Vec<Option<HostData>> =
        std::iter::repeat_with(|| None).take(names.len()).collect();
    fold(server, names, &mut hosts, answers)?;
    Ok(hosts)
}

/// The answers of one whole read (in the order of `Queries`' fields), joined into per-host data.
pub(super) fn table(
    server: &PromServer,
    names: &Names,
    answers: &[bytes::Bytes; 7],
) -> Result<Polled, String> {
    let [used, clean, unreadable, unexplained, findings, taken, up] = answers;
    let parts = [Used, Clean, Unreadable, Unexplained, Findings, Taken];
    let bodies = [used, clean, unreadable, unexplained, findings, taken];
    let hosts = folded(server, names, parts.into_iter().zip(bodies))?;
    Ok((hosts, ups(server, up)?))
}

/// The answers of a summary (memory, clean, a serve that says it cannot read a GPU, the count of findings,
/// time, `up`) joined into per-host data, and which hosts' details are still to read.
pub(super) fn summary_table(
    server: &PromServer,
    names: &Names,
    answers: &[bytes::Bytes; 6],
) -> Result<(Polled, Vec<bool>), String> {
    let [used, clean, unreadable, findings, taken, up] = answers;
    let parts = [Used, Clean, Unreadable, Taken];
    let mut hosts = folded(
        server,
        names,
        parts.into_iter().zip([used, clean, unreadable, taken]),
    )?;
    let details = details_wanted(server, names, &mut hosts, findings)?;
    Ok(((hosts, ups(server, up)?), details))
}

/// The answers of the first view's compact summaries (bytes on clean GPUs, GPU states, findings by kind, a
/// serve that says it cannot read a GPU, `up`), joined into per-host data: each GPU as its serve judged it,
/// used 0 where it is clean and the summary says every clean GPU reads 0, other bytes unknown. A host
/// whose summary is not whole (`HostData::quick` false) is left for the next poll's whole read.
pub(super) fn quick_table(
    server: &PromServer,
    names: &Names,
    answers: &[bytes::Bytes; 5],
) -> Result<Polled, String> {
    let [clean_used, states, kinds, unreadable, up] = answers;
    let parts = [CleanUsed, States, Findings, Unreadable];
    let mut hosts = folded(
        server,
        names,
        parts
            .into_iter()
            .zip([clean_used, states, kinds, unreadable]),
    )?;
    for d in hosts.iter_mut().flatten().filter(|d| d.quick) {
        let zero = d.clean_used == Some(0.0);
        for g in d.gpus.values_mut() {
            let state = g.state.unwrap_or(GpuState::Unknown);
            g.clean = match state {
                GpuState::Clean => Some(1.0),
                GpuState::InUse | GpuState::Leak | GpuState::NeedsReset => Some(0.0),
                GpuState::Unknown | GpuState::Error => None,
            };
            g.used = (state == GpuState::Clean && zero).then_some(0.0);
            g.unreadable = state == GpuState::Error;
        }
    }
    Ok((hosts, ups(server, up)?))
}

/// Which hosts' summaries leave details to read, from the answer of each host's count of findings (the
/// targets that sent it are the host's voices too, as any series naming it): a host whose serve found
/// something or could not read a GPU, and a serve's that says no count (one from before summaries). A host
/// of dcgm-exporter alone has no more to read than its memory.
pub(super) fn details_wanted(
    server: &PromServer,
    names: &Names,
    hosts: &mut [Option<HostData>],
    findings: &[u8],
) -> Result<Vec<bool>, String> {
    // Per host: None when no count came; Some(true) when every count that came is 0.
    let mut none_found: Vec<Option<bool>> = vec![None; names.len()];
    for sample in server.samples(findings)? {
        let n = sample.value();
        let Some(at) = sample.host().and_then(|h| names.of(h)) else {
            continue;
        };
        none_found[at] = Some(none_found[at].unwrap_or(true) && n == Some(0.0));
        if let Some(d) = hosts.get_mut(at).and_then(Option::as_mut) {
            d.targets.insert(sample.target());
        }
    }
    Ok(hosts
        .iter()
        .zip(none_found)
        .map(|(d, none_found)| {
            d.as_ref()
                .is_some_and(|d| d.gpus_unreadable || none_found.map_or(d.gpusweep, |quiet| !quiet))
        })
        .collect())
}

/// The details a summary left (GPUs a serve could not read, unexplained bytes, findings: the answers of
/// those queries of `Queries`), folded into the summary's data: together what a whole read says.
pub(super) fn fold_details(
    server: &PromServer,
    names: &Names,
    hosts: &mut [Option<HostData>],
    answers: &[bytes::Bytes; 3],
) -> Result<(), String> {
    let parts = [Unreadable, Unexplained, Findings];
    fold(server, names, hosts, parts.into_iter().zip(answers))
}
