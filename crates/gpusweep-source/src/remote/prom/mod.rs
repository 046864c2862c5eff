//! `prom:` fleets: every host a Prometheus server knows, read through its HTTP API. Where the host runs
//! `gpusweep serve`, its own verdicts come through (clean, leak, findings by kind); where only dcgm-exporter
//! runs, its memory per GPU, and "clean" only where nothing is used (the process list is a named blind
//! spot). One poll is a handful of aggregated queries for the whole fleet, whatever its size; a host whose
//! reading did not change is only marked fresh. Read-only: kills and removals are refused, saying how to act.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use super::http::HttpClient;
use crate::{ConnStatus, HostCmd, Refuse};
use gpusweep_core::format::escape;
use gpusweep_core::model::SaidGauges;
use gpusweep_core::seal::HostSummary;

/// Prometheus data moves at its scrape interval; polling it faster than this buys nothing.
pub(crate) const MIN_PROM_INTERVAL: Duration = Duration::from_secs(1);

/// A Prometheus server and the selector that narrows it to the fleet: the spec as parsed.
pub type PromServer = gpusweep_core::host::PromSpec;

mod answer;
mod pace;
mod poll;
mod proof;
mod query;
mod reading;
mod table;
#[cfg(test)]
mod tests;

use answer::{Target, Up, conflict};
use poll::{
    GlanceQueries, Queries, QuickQueries, Seen, details, glance, host_identities, identities,
    identities_again, only_hosts, poll, quick, summary, voices_up,
};
use proof::Proof;
use query::Spent;
pub use query::{Discovered, Voices, discover};
pub use reading::PromHost;
use reading::{HostData, Identities, own_target, snapshot};
use table::{Names, Polled};

/// The fleet's commands, by the host's place in `hosts`.
pub type PromCmd = (usize, HostCmd);

/// One Prometheus server's poller: its hosts, what each last said, and how often they are asked for.
struct Poller {
    server: PromServer,
    http: HttpClient,
    queries: Queries,
    glance: GlanceQueries,
    quick: QuickQueries,
    /// The first view is still to come from every host's compact summary (`quick_round`).
    quick_first: bool,
    /// Every target that named each host, as the discovery before this poller found them.
    discovered: Option<Voices>,
    /// Poll again as soon as the pacing lets it (after a first view, for what it left to read).
    again: bool,
    hosts: Vec<PromHost>,
    names: Names,
    ids: Identities,
    /// What each host's last snapshot was built from (cleared where identities read again changed).
    said: Vec<Option<HostData>>,
    /// The proven summary each host's last snapshot was built with.
    proven: Vec<Option<HostSummary>>,
    /// The latest reading time each host's serve proved: a serve's readings only move forward, so an
    /// older sealed one is a replay of a page that was once true.
    newest: Vec<u64>,
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
    /// Each host's reading time at the last glance, and what their steps say of the scrape.
    taken: Vec<Option<f64>>,
    pace: pace::Pace,
    /// Microseconds Prometheus took to answer this poller's queries, in all, and the share of its time they
    /// may take (`pace::Budget`).
    busy: AtomicU64,
    budget: pace::Budget,
    /// What the last identity read took of it.
    identity_busy: Duration,
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

    /// One poll: a glance at every host's revision, then the series of the hosts whose revision moved (or
    /// every host's summary and the details it leaves, when most moved or no glance can narrow the read).
    /// The first identities are read with every host's summary: the three are asked together, so a first
    /// view waits for one round of queries (two where some host has findings), not three. Identities read
    /// again (once a minute, less often where reads take long: `pace`) have the hosts whose identities
    /// changed read again, and only those. False once no host listens.
    async fn poll(&mut self) -> bool {
        if self
            .ids
            .read_at
            .is_some_and(|t| t.elapsed() >= pace::identities_every(self.identity_busy))
        {
            let before = self.busy.load(Ordering::Relaxed);
            let spent = Spent::new(&self.busy);
            let ids = identities_again(&self.server, &self.http, &self.ids, &spent).await;
            self.identity_busy = busy_since(&self.busy, before);
            match ids {
                Ok(ids) => self.forget_changed(ids),
                Err(e) => return say_down(&self.hosts, &mut self.down, &e),
            }
        }
        if self.ids.read_at.is_none() && std::mem::take(&mut self.quick_first) {
            return self.quick_round().await;
        }
        if self.ids.read_at.is_none() {
            // One share of `MAX_ROUND` for the three: asked together, they may not hold three rounds' worth.
            let spent = Spent::new(&self.busy);
            let (ids, g, sums) = tokio::join!(
                identities(&self.server, &self.http, &spent),
                glance(&self.server, &self.http, &self.glance, &self.names, &spent),
                summary(&self.server, &self.http, &self.queries, &self.names, &spent),
            );
            let (ids, g) = match (ids, g) {
                (Ok(ids), Ok(g)) => (ids, g),
                (Err(e), _) | (_, Err(e)) => return say_down(&self.hosts, &mut self.down, &e),
            };
            self.ids = ids;
            self.said.fill(None);
            let seen = self.seen(&g);
            // Every host moved (none is said yet); `moved` still learns how each is named.
            let _ = self.moved(&seen);
            let listening = self.hosts.iter().any(|h| h.detached.load(Ordering::SeqCst));
            let now = gpusweep_core::model::now_ms();
            return self.summed(sums, &seen, now).await || listening;
        }
        let spent = Spent::new(&self.busy);
        let g = match glance(&self.server, &self.http, &self.glance, &self.names, &spent).await {
            Ok(g) => g,
            Err(e) => return say_down(&self.hosts, &mut self.down, &e),
        };
        let seen = self.seen(&g);
        let moved = self.moved(&seen);
        let n_moved = moved.iter().filter(|m| **m).count();
        let now = gpusweep_core::model::now_ms();
        let mut listening = self.hosts.iter().any(|h| h.detached.load(Ordering::SeqCst));
        // A few moved: their series alone are read, named by `Hostname`.
        let only = (n_moved * 4 <= self.hosts.len()).then(|| self.only(&moved));
        let narrowed = match (n_moved, &only) {
            (0, _) => None,
            (_, Some(Some(m))) => Some(Queries::new(&self.server, Some(m))),
            _ => {
                // Most hosts moved, or one cannot be named in a query: read them all.
                let spent = Spent::new(&self.busy);
                let sums =
                    summary(&self.server, &self.http, &self.queries, &self.names, &spent).await;
                return self.summed(sums, &seen, now).await || listening;
            }
        };
        // The others are only fresh, at the time their serve took the reading.
        for (i, h) in self.hosts.iter().enumerate() {
            if moved[i] || h.detached.load(Ordering::SeqCst) {
                continue;
            }
            if let Some(said) = self.said[i].as_mut() {
                said.taken_s = seen[i].taken;
                listening |= h.sink.fresh(said.taken_at_ms(now), SaidGauges::default());
            }
        }
        match narrowed {
            None => listening,
            Some(q) => self.read((&q, &moved), &seen, now).await || listening,
        }
    }

    /// The first view, from every host's compact summary: the hosts' identities (their serves, the targets
    /// that speak for them), the glance and the summaries, asked together, each a few series a host. A host
    /// whose summary is whole is handed on with each GPU's state as its serve judged it (bytes other than
    /// a clean GPU's 0 unknown, no UUIDs or sizes yet); the next poll, at once as the pacing allows, reads
    /// every host whole, as a first poll without a quick view does. False once no host listens.
    async fn quick_round(&mut self) -> bool {
        let spent = Spent::new(&self.busy);
        let (ids, g, polled) = tokio::join!(
            host_identities(
                &self.server,
                &self.http,
                &self.quick,
                self.discovered.take(),
                &spent
            ),
            glance(&self.server, &self.http, &self.glance, &self.names, &spent),
            quick(
                &self.server,
                &self.http,
                &self.quick,
                &self.queries,
                &self.names,
                &spent
            ),
        );
        self.again = true;
        // Nothing is said of any host on a failed first view: the whole read comes next.
        let (Ok(ids), Ok(g), Ok((mut data, up))) = (ids, g, polled) else {
            return true;
        };
        let Ok(up) = voices_up(&self.server, &self.http, &ids, up, &spent).await else {
            return true;
        };
        self.ids = ids;
        let seen = self.seen(&g);
        let _ = self.moved(&seen);
        let whole: Vec<bool> = self
            .hosts
            .iter()
            .zip(&seen)
            .map(|(h, s)| {
                let at = self.names.of(&h.name);
                match at.and_then(|at| data.get_mut(at)?.as_mut()) {
                    // Its reading's time is the glance's (the summary carries none).
                    Some(d) if d.quick => {
                        d.taken_s = s.taken;
                        true
                    }
                    _ => false,
                }
            })
            .collect();
        let now = gpusweep_core::model::now_ms();
        let listening = self.hosts.iter().any(|h| h.detached.load(Ordering::SeqCst));
        self.hand_on(&(data, up), Some(&whole), false, &seen, now) || listening
    }

    /// Take identities read again: what each host said is forgotten where its identities changed (its
    /// reading is built from both), or everywhere when the down targets that could not be asked changed
    /// (every host's word depends on them).
    fn forget_changed(&mut self, ids: Identities) {
        let every = ids.unasked_down != self.ids.unasked_down;
        let changed = self.ids.changed_hosts(&ids);
        for (h, said) in self.hosts.iter().zip(&mut self.said) {
            if every || changed.contains(h.name.as_str()) {
                *said = None;
            }
        }
        drop(changed);
        self.ids = ids;
    }

    /// The `Hostname` matcher naming these hosts (by their place in `hosts`), if every one can be named.
    fn only(&self, which: &[bool]) -> Option<String> {
        only_hosts(
            self.hosts
                .iter()
                .zip(which)
                .zip(&self.by_hostname)
                .filter(|((_, w), _)| **w)
                .map(|((h, _), by_name)| by_name.then_some(h.name.as_str())),
        )
    }

    /// Each host's part of a glance, by its place in `hosts`: looked up once. Its reading time's step since
    /// the last glance tells the scrape's pace.
    fn seen(&mut self, g: &poll::Glance) -> Vec<Seen> {
        let seen: Vec<Seen> = self
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let at = self.names.of(&h.name);
                let get = |v: &[Option<f64>]| at.and_then(|at| v.get(at).copied().flatten());
                let proof: Proof = at
                    .and_then(|at| g.proof.get(at).cloned())
                    .unwrap_or_default();
                let proof = proof.not_older_than(&h.name, &mut self.newest[i]);
                // A proven reading's time is its seal's, which no one else can move.
                let taken = match proof.proven() {
                    Some(p) => Some(p.taken_ms as f64 / 1000.0),
                    None => get(&g.taken),
                };
                Seen {
                    revision: get(&g.revision),
                    taken,
                    proof,
                    by_hostname: at.and_then(|at| g.by_hostname.get(at).copied()) == Some(true),
                    target: at.and_then(|at| g.target.get(at).cloned().flatten()),
                }
            })
            .collect();
        for (before, s) in self.taken.iter_mut().zip(&seen) {
            self.pace.saw(*before, s.taken);
            *before = s.taken;
        }
        seen
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
                        .is_some_and(|d| own_target(d) != s.target.as_ref())
                    || summary_moved(self.proven[i].as_ref(), s.proof.proven()),
            );
        }
        moved
    }

    /// Read the series of the hosts that moved with the queries naming them (`moved`), and hand each on.
    /// False once no host listens.
    async fn read(&mut self, narrowed: (&Queries, &[bool]), seen: &[Seen], now: u64) -> bool {
        let polled = poll(
            &self.server,
            &self.http,
            narrowed.0,
            &self.names,
            &self.busy,
        )
        .await;
        self.apply(polled, Some(narrowed.1), true, seen, now)
    }

    /// Hand on every host whose summary says all there is; then read the details of the others (by
    /// `Hostname` where each can be named, else every host's) and hand those on. A host with findings is
    /// never handed on from its summary: that would say clean what its serve found leaking. False once no
    /// host listens.
    async fn summed(
        &mut self,
        sums: Result<(Polled, Vec<bool>), String>,
        seen: &[Seen],
        now: u64,
    ) -> bool {
        let (polled, details_at) = match sums {
            Ok(x) => x,
            Err(e) => return say_down(&self.hosts, &mut self.down, &e),
        };
        let wanted: Vec<bool> = self
            .hosts
            .iter()
            .map(|h| self.names.of(&h.name).is_some_and(|at| details_at[at]))
            .collect();
        let summed: Vec<bool> = wanted.iter().map(|w| !w).collect();
        let mut listening = self.hand_on(&polled, Some(&summed), false, seen, now);
        if !wanted.contains(&true) {
            return listening;
        }
        let narrowed = self
            .only(&wanted)
            .map(|m| Queries::new(&self.server, Some(&m)));
        let queries = narrowed.as_ref().unwrap_or(&self.queries);
        let polled = details(
            &self.server,
            &self.http,
            queries,
            &self.names,
            polled,
            &self.busy,
        )
        .await;
        listening |= self.apply(polled, Some(&wanted), true, seen, now);
        listening
    }

    /// Hand on what a read found of every host it asked for (`only`: those alone). A host a read that named
    /// it (`named`) did not find may have moved to another target: the next poll reads every host, once (a
    /// host already down does not ask again). False once no host listens.
    fn apply(
        &mut self,
        polled: Result<Polled, String>,
        only: Option<&[bool]>,
        named: bool,
        seen: &[Seen],
        now: u64,
    ) -> bool {
        match polled {
            Ok(polled) => self.hand_on(&polled, only, named, seen, now),
            Err(e) => say_down(&self.hosts, &mut self.down, &e),
        }
    }

    /// Hand on what a read found (see `apply`).
    fn hand_on(
        &mut self,
        (data, up): &Polled,
        only: Option<&[bool]>,
        named: bool,
        seen: &[Seen],
        now: u64,
    ) -> bool {
        if !named {
            self.whole_next = false;
        }
        let mut listening = false;
        for i in 0..self.hosts.len() {
            if self.hosts[i].detached.load(Ordering::SeqCst) || only.is_some_and(|m| !m[i]) {
                continue;
            }
            let at = self.names.of(&self.hosts[i].name);
            let d = at.and_then(|at| data.get(at)).and_then(Option::as_ref);
            self.whole_next |= named && d.is_none() && self.down[i].is_none();
            self.revision[i] = seen[i].revision;
            listening |= self.host(i, (d, &seen[i].proof), up, now);
        }
        listening
    }

    /// One host's part of a poll: unreadable (its target down, no series, two targets, a summary whose seal
    /// does not hold), only fresh, or a reading (believed as its serve's word where `proof` proves it,
    /// else as labels). False once its sink stops listening.
    fn host(
        &mut self,
        i: usize,
        (d, proof): (Option<&HostData>, &Proof),
        up: &Up,
        now: u64,
    ) -> bool {
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
                .or_else(|| unproven(&h.name, proof, d, self.http.seal.is_some()))
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
        let proven = proof.proven();
        let proof_held = !summary_moved(self.proven[i].as_ref(), proven);
        if !was_down && proof_held && self.said[i].as_ref().is_some_and(|p| p.same_but_time(d)) {
            let at = proven.map_or_else(|| d.taken_at_ms(now), |p| p.taken_ms);
            return h.sink.fresh(at, SaidGauges::default());
        }
        self.said[i] = Some(d.clone());
        self.proven[i] = proven.cloned();
        // Whether the snapshot says anything new is the runtime's to decide, once.
        let snap = snapshot(&h.name, d, (&self.ids, proven), up, now);
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

/// Whether a host's proven summary says something else than the one its last reading was built with
/// (proven then and not now, or the other way, included).
fn summary_moved(before: Option<&HostSummary>, now: Option<&HostSummary>) -> bool {
    match (before, now) {
        (Some(before), Some(now)) => now.moved_from(before),
        (None, None) => false,
        _ => true,
    }
}

/// Why a host's reading is no one's word, from its summary's proof: a seal that does not hold, or (where this
/// reader has the fleet's key) a serve's series without one. None where it is proven, or rests on labels
/// alone (no key here, or dcgm-exporter's series alone): then it is read, but never judged clean.
fn unproven(name: &str, proof: &Proof, d: Option<&HostData>, keyed: bool) -> Option<String> {
    match proof {
        Proof::Broken(why) => Some(why.clone()),
        Proof::None if keyed && d.is_some_and(|d| d.gpusweep) => Some(format!(
            "host {:?} has gpusweep series in Prometheus but no sealed summary (its serve runs without the \
             fleet's --seal-key, or another wrote them): no one's word",
            escape(name)
        )),
        Proof::None | Proof::Proven(_) => None,
    }
}

/// Poll the server for these hosts until every host's sink stops listening or the fleet goes away.
/// `quick_first`: the first reading of each host from its compact summary (GPU states, findings by kind),
/// its bytes and identities at the next poll: for a front end that shows readings as they come (the TUI). A
/// one-shot reader takes each host's first reading as its answer, so it reads every host whole at once.
/// `discovered`: the voices the discovery of these hosts found, taken for the first view's.
pub async fn run(
    server: PromServer,
    http: HttpClient,
    hosts: Vec<PromHost>,
    interval: Duration,
    (quick_first, discovered): (bool, Option<Voices>),
    mut cmds: mpsc::Receiver<PromCmd>,
) {
    for h in &hosts {
        h.sink.status(ConnStatus::Connecting);
    }
    let n = hosts.len();
    let mut p = Poller {
        queries: Queries::new(&server, None),
        glance: GlanceQueries::new(&server),
        quick: QuickQueries::new(&server),
        quick_first,
        discovered,
        again: false,
        names: Names::new(&hosts),
        server,
        http,
        hosts,
        ids: Identities::default(),
        said: vec![None; n],
        proven: vec![None; n],
        newest: vec![0; n],
        revision: vec![None; n],
        whole_next: true,
        by_hostname: vec![false; n],
        voices: vec![BTreeSet::new(); n],
        down: vec![None; n],
        asked: vec![interval; n],
        interval,
        next: tokio::time::Instant::now(),
        taken: vec![None; n],
        pace: pace::Pace::default(),
        busy: AtomicU64::new(0),
        budget: pace::Budget::default(),
        identity_busy: Duration::ZERO,
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
        p.next = tokio::time::Instant::now() + p.pace.every(p.interval.max(MIN_PROM_INTERVAL));
        let before = p.busy.load(Ordering::Relaxed);
        if !p.poll().await {
            return;
        }
        // The server's time this poll took may hold the next one back (a command still asks at once).
        let now = tokio::time::Instant::now();
        let quiet = p.budget.spent(busy_since(&p.busy, before), now.into_std());
        if std::mem::take(&mut p.again) {
            p.next = now;
        }
        p.next = p.next.max(now + quiet);
    }
}

/// The answering time counted in `busy` since it read `before`.
fn busy_since(busy: &AtomicU64, before: u64) -> Duration {
    Duration::from_micros(busy.load(Ordering::Relaxed).saturating_sub(before))
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
