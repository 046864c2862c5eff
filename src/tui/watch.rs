//! The re-watch: after a sweep (or on `w`), the hosts in scope are read fast until every GPU in it reads
//! zero; then the banner says how long that took. The verdict is `analyze::watch`'s, on the readings the
//! hosts' ledgers judged.

use std::time::Duration;

use super::app::{App, Effect, Level, Panel};
use crate::analyze::plan::{Plan, plan_summary};
use crate::analyze::watch::{Scope, Watch};
use crate::core::action::{ActionRequest, Purpose};
use crate::core::conn::{ConnStatus, HostCmd};
use crate::core::event::EventKind;
use crate::core::format::{fmt_ms, millis};
use crate::core::model::HostId;
use crate::core::signal::Sig;

/// Polling while re-watching.
pub const REWATCH_INTERVAL: Duration = crate::runtime::FAST_POLL;

#[derive(Debug, Clone)]
pub struct Rewatch {
    pub watch: Watch,
    pub label: String,
}

impl App {
    /// The poll interval of a watch over `n` hosts: 100 ms for a few, slower for many, so that a thousand
    /// hosts re-watched at once still send at most about a thousand readings a second; never slower than the
    /// normal interval.
    pub fn fast_interval(&self, n: usize) -> Duration {
        let per_host = Duration::from_millis(u64::try_from(n).unwrap_or(u64::MAX));
        REWATCH_INTERVAL.max(per_host).min(self.cfg.interval)
    }

    /// Poll these hosts (and only these) every `every`.
    fn poll_every(hosts: &[HostId], every: Duration) -> Vec<Effect> {
        hosts
            .iter()
            .map(|h| Effect::Send(*h, HostCmd::Interval(every)))
            .collect()
    }

    /// The hosts of the running watch, polled fast.
    fn watch_fast(&self) -> Vec<Effect> {
        let Some(rw) = &self.rewatch else {
            return vec![];
        };
        let hosts: Vec<HostId> = rw.watch.expected.iter().map(|(h, _)| *h).collect();
        Self::poll_every(&hosts, self.fast_interval(hosts.len()))
    }

    /// Watch `expected` (with these GPUs, or all) until clean, under `label`.
    fn begin_watch(
        &mut self,
        expected: Vec<(HostId, String)>,
        gpus: Option<Vec<u32>>,
        label: String,
    ) -> Vec<Effect> {
        let watch = Watch::new(
            expected,
            Scope { gpus },
            self.cfg.analyze.tolerance,
            self.view.now_ms,
        );
        let hosts: Vec<HostId> = watch.expected.iter().map(|(h, _)| *h).collect();
        self.rewatch = Some(Rewatch { watch, label });
        self.view.banner = None;
        let mut effects = self.watch_fast();
        // Each host's current reading, whatever the readings since have said: a host whose reading stopped
        // changing sends none that is new, and its watch would otherwise wait for ever.
        for h in hosts {
            let status = self.store.hosts.get(h.0).map(|x| x.status.clone());
            match status {
                Some(st @ (ConnStatus::Down(_) | ConnStatus::Stale { .. })) => {
                    self.unreadable(h, &st);
                }
                _ => effects.extend(self.observe(h)),
            }
            if self.rewatch.is_none() {
                break;
            }
        }
        effects
    }

    /// A confirmed sweep: TERM to the plan's targets host by host, then watch the scope until clean.
    pub(super) fn start_sweep(
        &mut self,
        scope: super::modes::SweepScope,
        host: HostId,
        gpu: Option<u32>,
        job: Option<&str>,
        plan: &Plan,
    ) -> Vec<Effect> {
        use super::modes::SweepScope;
        let mut effects = Vec::new();
        for h in plan.hosts() {
            let id = self.take_id("sweep".into());
            let req = plan.request(
                h,
                Sig::Term,
                Some(millis(super::app::TUI_GRACE)),
                Purpose::Sweep,
            );
            let req = ActionRequest::Signal(req);
            effects.push(Effect::Send(h, HostCmd::Act { id, req }));
        }
        self.view.last_sweep_ms = Some(self.view.now_ms);
        let l = self.label(host);
        let (expected, label, gpus) = match scope {
            SweepScope::Everything => (self.store.all_hosts(), "every host".to_string(), None),
            SweepScope::Host => (vec![(host, l.clone())], l, None),
            SweepScope::Gpu => (
                vec![(host, l.clone())],
                format!("{l} GPU {}", gpu.unwrap_or(0)),
                gpu.map(|g| vec![g]),
            ),
            // The job's hosts, until the GPUs its ranks held read zero.
            SweepScope::Job => {
                let mut hosts = plan.hosts();
                if hosts.is_empty() {
                    hosts.push(host);
                }
                let mut gpus: Vec<u32> = plan.items.iter().flat_map(|i| i.gpus.clone()).collect();
                gpus.sort_unstable();
                gpus.dedup();
                (
                    hosts.into_iter().map(|h| (h, self.label(h))).collect(),
                    format!("job {}", job.unwrap_or("?")),
                    (!gpus.is_empty()).then_some(gpus),
                )
            }
        };
        if plan.items.is_empty() {
            self.set_status("nothing to signal; watching until clean", Level::Info);
        } else {
            self.set_status(format!("sweeping: {}", plan_summary(plan)), Level::Info);
        }
        effects.extend(self.begin_watch(expected, gpus, label));
        effects
    }

    /// `w`: stop the running watch, or watch the scope in view (every host from the hosts panel, the
    /// opened host otherwise), reading its hosts now.
    pub(super) fn toggle_rewatch(&mut self) -> Vec<Effect> {
        if let Some(rw) = self.rewatch.take() {
            self.set_status("re-watch stopped", Level::Info);
            let hosts: Vec<HostId> = rw.watch.expected.iter().map(|(h, _)| *h).collect();
            return Self::poll_every(&hosts, self.cfg.interval);
        }
        let (expected, label) = if self.view.sel.focus == Panel::Hosts {
            (self.store.all_hosts(), "every host".to_string())
        } else {
            let h = HostId(self.view.sel.host);
            let l = self.label(h);
            (vec![(h, l.clone())], l)
        };
        let mut effects = self.begin_watch(expected, None, label);
        let now: Vec<Effect> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::Send(h, _) => Some(Effect::Send(*h, HostCmd::PollNow)),
                _ => None,
            })
            .collect();
        effects.extend(now);
        effects
    }

    /// A re-watch never counts a host it cannot read now as clean.
    pub(super) fn unreadable(&mut self, i: HostId, st: &ConnStatus) {
        let Some(rw) = &mut self.rewatch else { return };
        match st {
            ConnStatus::Down(e) => rw.watch.unreadable(i, e.clone()),
            ConnStatus::Stale { silent_ms } => rw
                .watch
                .unreadable(i, format!("stale: no reading for {}", fmt_ms(*silent_ms))),
            ConnStatus::Up | ConnStatus::Connecting => {}
        }
    }

    /// Feed a host's new reading to the running watch; when it completes, say so.
    pub(super) fn observe(&mut self, id: HostId) -> Vec<Effect> {
        let Some(rw) = &mut self.rewatch else {
            return vec![];
        };
        let Some(s) = self.store.hosts.get(id.0).and_then(|h| h.snap.as_ref()) else {
            return vec![];
        };
        if !rw.watch.observe(id, s, self.view.now_ms) {
            return vec![];
        }
        let took = rw.watch.took_ms().unwrap_or(0);
        let n: usize = rw
            .watch
            .expected
            .iter()
            .filter_map(|(h, _)| self.store.hosts.get(h.0))
            .filter_map(|h| h.snap.as_ref())
            .map(|s| {
                s.gpus
                    .iter()
                    .filter(|g| rw.watch.scope.includes(g.index))
                    .count()
            })
            .sum();
        let what = if n == 1 {
            "its GPU reads".to_string()
        } else {
            format!("all {n} GPUs read")
        };
        let scope = rw.label.clone();
        self.view.banner = Some(format!("✓ {scope}: {what} zero after {}", fmt_ms(took)));
        let watched: Vec<HostId> = rw.watch.expected.iter().map(|(h, _)| *h).collect();
        self.rewatch = None;
        // A host's own ledger says when it reads all clean after signals; a watch of more (or less) than one
        // whole host says it here.
        let said = self
            .store
            .timeline
            .iter()
            .rev()
            .take(64)
            .any(|e| matches!(&e.what, EventKind::AllClean { scope: s, .. } if *s == scope));
        if !said {
            self.record(
                id,
                EventKind::AllClean {
                    scope,
                    after_ms: took,
                },
            );
        }
        let mut effects = Self::poll_every(&watched, self.cfg.interval);
        effects.push(Effect::DrawNow);
        effects
    }
}
