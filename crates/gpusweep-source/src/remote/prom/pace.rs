//! How often a `prom:` fleet is worth asking: Prometheus holds a host's new reading only once per scrape, so
//! a poll at a user's 1 s against a 15 s scrape reads what the one before it read, fourteen times out of
//! fifteen, and at ten thousand hosts each of those polls cost Prometheus most of what the client costs it.
//! The scrape interval is not asked for (a managed Prometheus may not say its configuration): it is seen, as
//! the steps of each host's reading time from one glance to the next.
//!
//! Prometheus is shared (its rules, its dashboards, its own scrapes), so the client also keeps its queries to
//! a share of the server's time: the time its answers took is counted, and the next poll (and identity read)
//! waits long enough that they stay at most `SHARE` of it. A quick server sees no change; a loaded one, or a
//! fleet so large that each glance takes a while, is asked less often (at least every `SLOWEST`).

use std::collections::VecDeque;
use std::time::Duration;

/// Steps kept: enough to outvote a few odd ones (a host whose serve reads slower than it is scraped).
const KEPT: usize = 256;
/// Steps seen before they are trusted.
const TRUSTED_AFTER: usize = 3;
/// Asked this many times per scrape: a reading waits at most a quarter of a scrape for the next poll.
const POLLS_PER_SCRAPE: u32 = 4;
/// However slow the scrape, a poll at least this often (a target's `up`, a host gone, are news too).
const SLOWEST: Duration = Duration::from_secs(15);

/// At most one part in this many of the time goes to the client's queries (5%).
const SHARE: u32 = 20;
/// Identities (GPUs, serves, voices) are read again this often, or less often when a read takes long.
const IDENTITY_EVERY: Duration = Duration::from_secs(60);
/// However long an identity read takes, one at least this often (a swapped GPU, a moved serve).
const IDENTITY_SLOWEST: Duration = Duration::from_secs(300);

/// How long to wait after a poll whose answers took Prometheus `busy` (summed over its queries): their
/// time is at most `SHARE` of the whole, but no poll waits longer than `SLOWEST`.
pub(super) fn quiet_after(busy: Duration) -> Duration {
    busy.saturating_mul(SHARE - 1).min(SLOWEST)
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
        // A quick server: the pace alone decides.
        assert_eq!(
            quiet_after(Duration::from_millis(10)),
            Duration::from_millis(190)
        );
        // A glance of 0.4 s: the next in 7.6 s, so 0.4 of every 8 s.
        assert_eq!(
            quiet_after(Duration::from_millis(400)),
            Duration::from_millis(7600)
        );
        // However slow, a poll every 15 s.
        assert_eq!(quiet_after(Duration::from_secs(30)), SLOWEST);
        assert_eq!(identities_every(Duration::from_secs(1)), IDENTITY_EVERY);
        assert_eq!(
            identities_every(Duration::from_secs(6)),
            Duration::from_secs(114)
        );
        assert_eq!(identities_every(Duration::from_secs(60)), IDENTITY_SLOWEST);
    }
}
