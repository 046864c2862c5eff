//! How often a `prom:` fleet is worth asking: Prometheus holds a host's new reading only once per scrape, so
//! a poll at a user's 1 s against a 15 s scrape reads what the one before it read, fourteen times out of
//! fifteen, and at ten thousand hosts each of those polls cost Prometheus most of what the client costs it.
//! The scrape interval is not asked for (a managed Prometheus may not say its configuration): it is seen, as
//! the steps of each host's reading time from one glance to the next.
//!
//! Prometheus is shared (its rules, its dashboards, its own scrapes), so the client also keeps its queries to
//! a share of the server's time (`Budget`): the time its answers took is counted, and once more than a
//! burst's worth went, the next poll waits long enough that they stay at most a twentieth of the time (an
//! identity read, likewise, `identities_every`). A quick server sees no change; a loaded one, or a fleet so
//! large that each glance takes a while, is asked less often (at least every `HELD_AT_MOST`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Steps kept: enough to outvote a few odd ones (a host whose serve reads slower than it is scraped).
const KEPT: usize = 256;
/// Steps seen before they are trusted.
const TRUSTED_AFTER: usize = 3;
/// Asked this many times per scrape: a reading waits at most a quarter of a scrape for the next poll.
const POLLS_PER_SCRAPE: u32 = 4;
/// However slow the scrape, a poll at least this often (a target's `up`, a host gone, are news too).
const SLOWEST: Duration = Duration::from_secs(15);
/// However slow the server, a poll at least this often: past `SLOWEST` only where its answers take so long
/// that a poll every `SLOWEST` would take more than its share (at 10,000 hosts on a loaded server, a
/// glance's two queries of 10,000 series each may take 0.8 s).
const HELD_AT_MOST: Duration = Duration::from_secs(30);

/// At most one part in this many of the time goes to the client's queries (5%).
const SHARE: u32 = 20;
/// Identities (GPUs, serves, voices) are read again this often, or less often when a read takes long.
const IDENTITY_EVERY: Duration = Duration::from_secs(60);
/// However long an identity read takes, one at least this often (a swapped GPU, a moved serve).
const IDENTITY_SLOWEST: Duration = Duration::from_secs(300);
/// Every host's identities are asked at least this often; between, only those of hosts whose identity
/// digest moved (or that have none).
pub(super) const EVERY_HOST_IDENTITIES: Duration = Duration::from_secs(300);

/// Answering time the client may spend at once (a first read, a read after most hosts moved) before it is
/// held to its share.
const BURST: Duration = Duration::from_secs(2);

/// The client's share of the server's time, kept as a bucket: it holds up to `BURST` of answering, each
/// poll takes what its answers took, and it fills again by a twentieth of the time that passes.
#[derive(Debug)]
pub(super) struct Budget {
    /// Seconds of answering left; below zero, owed (never more than `BURST`).
    left: f64,
    at: Option<Instant>,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget {
            left: BURST.as_secs_f64(),
            at: None,
        }
    }
}

impl Budget {
    /// A poll that ended at `now` took Prometheus `busy` to answer (summed over its queries): how long to
    /// wait before the next, so that what is owed is paid back first (at most `HELD_AT_MOST`).
    pub(super) fn spent(&mut self, busy: Duration, now: Instant) -> Duration {
        let burst = BURST.as_secs_f64();
        let share = f64::from(SHARE);
        if let Some(at) = self.at {
            let passed = now.saturating_duration_since(at).as_secs_f64();
            self.left = (self.left + passed / share).min(burst);
        }
        self.at = Some(now);
        self.left = (self.left - busy.as_secs_f64()).max(-burst);
        if self.left >= 0.0 {
            return Duration::ZERO;
        }
        Duration::try_from_secs_f64(-self.left * share)
            .unwrap_or(HELD_AT_MOST)
            .min(HELD_AT_MOST)
    }
}

/// How long after an identity read whose answers took `busy` the next is due.
pub(super) fn identities_every(busy: Duration) -> Duration {
    busy.saturating_mul(SHARE - 1)
        .clamp(IDENTITY_EVERY, IDENTITY_SLOWEST)
}

#[derive(Debug, Default)]
pub(super) struct Pace {
    /// The last steps of hosts' reading times, in seconds.
    steps: VecDeque<f64>,
}

impl Pace {
    /// A host's reading time at the last glance and at this one.
    pub(super) fn saw(&mut self, before: Option<f64>, now: Option<f64>) {
        if let (Some(a), Some(b)) = (before, now)
            && b > a
            && (b - a).is_finite()
        {
            if self.steps.len() == KEPT {
                self.steps.pop_front();
            }
            self.steps.push_back(b - a);
        }
    }

    /// How long to wait between polls asked every `asked`: slower only where readings come slower.
    pub(super) fn every(&self, asked: Duration) -> Duration {
        if self.steps.len() < TRUSTED_AFTER {
            return asked;
        }
        let mut s: Vec<f64> = self.steps.iter().copied().collect();
        s.sort_by(f64::total_cmp);
        let median = s[s.len() / 2];
        let per_poll = Duration::try_from_secs_f64(median)
            .unwrap_or(SLOWEST)
            .checked_div(POLLS_PER_SCRAPE)
            .unwrap_or(SLOWEST)
            .min(SLOWEST);
        asked.max(per_poll)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_come_four_times_a_scrape_and_never_faster_than_asked() {
        let mut p = Pace::default();
        let asked = Duration::from_secs(1);
        assert_eq!(p.every(asked), asked, "nothing seen yet");
        // Hosts scraped every 15 s, one of them read by a serve every 30 s, none moved, one went back.
        for (a, b) in [
            (0.0, 15.0),
            (3.0, 18.0),
            (7.0, 37.0),
            (9.0, 24.0),
            (5.0, 5.0),
            (9.0, 1.0),
        ] {
            p.saw(Some(a), Some(b));
        }
        p.saw(None, Some(4.0));
        assert_eq!(p.every(asked), Duration::from_millis(3750));
        assert_eq!(p.every(Duration::from_secs(5)), Duration::from_secs(5));
        // Scraped every second: as asked.
        let mut fast = Pace::default();
        for t in 0..10 {
            fast.saw(Some(f64::from(t)), Some(f64::from(t + 1)));
        }
        assert_eq!(fast.every(asked), asked);
        // Scraped every ten minutes: at most 15 s between polls.
        let mut slow = Pace::default();
        for t in 0..5 {
            slow.saw(Some(f64::from(t)), Some(f64::from(t + 600)));
        }
        assert_eq!(slow.every(asked), SLOWEST);
    }

    #[test]
    fn a_slow_answer_has_the_next_poll_wait_so_the_client_takes_a_twentieth_of_the_servers_time() {
        let ms = Duration::from_millis;
        let near = |a: Duration, b: Duration| a.abs_diff(b) < ms(20);
        let t0 = Instant::now();
        // Quick answers, a poll a second: never held back (each second gives back 50 ms).
        let mut b = Budget::default();
        for i in 0..100 {
            assert_eq!(b.spent(ms(40), t0 + ms(1000 * i)), Duration::ZERO);
        }
        // A first read of 1.5 s, then glances of 0.4 s from a loaded server: the burst (2 s) goes first,
        // then each glance waits what pays it back, twenty times what it took less the time already passed.
        let mut b = Budget::default();
        assert_eq!(b.spent(ms(1500), t0), Duration::ZERO);
        assert_eq!(b.spent(ms(400), t0 + ms(1000)), Duration::ZERO);
        let wait = b.spent(ms(400), t0 + ms(2000));
        assert!(near(wait, ms(4000)), "{wait:?}");
        let t = t0 + ms(2000) + wait;
        let wait = b.spent(ms(400), t);
        assert!(near(wait, ms(8000)), "{wait:?}");
        // However slow, a poll every 30 s; what is owed stays within a burst, so a server quick again is
        // asked as before two polls later.
        let t = t + wait;
        assert_eq!(b.spent(Duration::from_secs(30), t), HELD_AT_MOST);
        let t = t + HELD_AT_MOST;
        let wait = b.spent(ms(10), t);
        assert!(near(wait, ms(10_200)), "{wait:?}");
        let t = t + wait;
        assert!(b.spent(ms(10), t) < ms(300));
        // A glance of 0.8 s (two queries of 10,000 series on a loaded server) is held 16 s, past the scrape's
        // 15 s: its share is kept.
        let mut b = Budget::default();
        let mut t = t0;
        let mut waits = Vec::new();
        for _ in 0..20 {
            let wait = b.spent(ms(800), t);
            waits.push(wait);
            t += wait;
        }
        assert!(waits[5..].iter().all(|w| near(*w, ms(16_000))), "{waits:?}");
        assert_eq!(identities_every(Duration::from_secs(1)), IDENTITY_EVERY);
        assert_eq!(
            identities_every(Duration::from_secs(6)),
            Duration::from_secs(114)
        );
        assert_eq!(identities_every(Duration::from_secs(60)), IDENTITY_SLOWEST);
    }
}
