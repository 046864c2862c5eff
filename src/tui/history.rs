//! One GPU's memory history: the last `cap` readings as (time ms, MiB), kept as runs of equal values. A
//! GPU whose memory stays put (most of a fleet, most of the time) costs one run, not a sample per reading:
//! ten thousand hosts' eight GPUs at a 1 s poll keep a few megabytes, where a sample each kept hundreds, and
//! a reading that says the same extends a run in place.

use std::collections::VecDeque;

/// Readings of one value in a row: the first's and the last's times, and how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    first_ms: u64,
    last_ms: u64,
    mib: u64,
    count: usize,
}

impl Run {
    /// The time of its `i`th reading: the runs' readings are taken evenly spaced (a poll's pace).
    fn at(&self, i: usize) -> u64 {
        if self.count <= 1 {
            return self.first_ms;
        }
        let span = self.last_ms.saturating_sub(self.first_ms);
        let i = u64::try_from(i).unwrap_or(u64::MAX);
        let n = u64::try_from(self.count - 1).unwrap_or(u64::MAX);
        self.first_ms + span.saturating_mul(i) / n
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    runs: VecDeque<Run>,
    len: usize,
}

impl History {
    /// A reading, the oldest let go past `cap` readings.
    pub fn push(&mut self, at_ms: u64, mib: u64, cap: usize) {
        match self.runs.back_mut() {
            Some(r) if r.mib == mib => {
                r.last_ms = at_ms;
                r.count += 1;
            }
            _ => self.runs.push_back(Run {
                first_ms: at_ms,
                last_ms: at_ms,
                mib,
                count: 1,
            }),
        }
        self.len += 1;
        while self.len > cap {
            self.drop_oldest();
        }
    }

    fn drop_oldest(&mut self) {
        let Some(r) = self.runs.front_mut() else {
            self.len = 0;
            return;
        };
        if r.count <= 1 {
            self.runs.pop_front();
        } else {
            r.first_ms = r.at(1);
            r.count -= 1;
        }
        self.len -= 1;
    }

    /// How many readings it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The oldest reading.
    pub fn front(&self) -> Option<(u64, u64)> {
        self.runs.front().map(|r| (r.first_ms, r.mib))
    }

    /// Every reading, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (u64, u64)> + '_ {
        self.runs
            .iter()
            .flat_map(|r| (0..r.count).map(move |i| (r.at(i), r.mib)))
    }

    /// The last `n` readings (all, when fewer), oldest first.
    pub fn last(&self, n: usize) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self.iter().rev().take(n).collect();
        v.reverse();
        v
    }
}

/// A host's GPUs' histories, by GPU index: a handful, found by a look along them (cheaper than hashing
/// for each of ten thousand hosts' readings a second).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Histories(Vec<(u32, History)>);

impl Histories {
    pub fn get(&self, gpu: &u32) -> Option<&History> {
        self.0.iter().find(|(g, _)| g == gpu).map(|(_, h)| h)
    }

    /// A reading of GPU `gpu`.
    pub fn push(&mut self, gpu: u32, at_ms: u64, mib: u64, cap: usize) {
        if let Some((_, h)) = self.0.iter_mut().find(|(g, _)| *g == gpu) {
            h.push(at_ms, mib, cap);
            return;
        }
        let mut h = History::default();
        h.push(at_ms, mib, cap);
        self.0.push((gpu, h));
    }

    /// The GPUs it has a history of, in the order first seen.
    pub fn keys(&self) -> impl Iterator<Item = &u32> {
        self.0.iter().map(|(g, _)| g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_readings_are_one_run_and_read_back_as_they_came() {
        let mut h = History::default();
        for (t, v) in [
            (0, 5),
            (1000, 5),
            (2000, 5),
            (3000, 7),
            (4000, 7),
            (5000, 5),
        ] {
            h.push(t, v, 600);
        }
        assert_eq!(h.runs.len(), 3);
        assert_eq!(h.len(), 6);
        assert_eq!(
            h.iter().collect::<Vec<_>>(),
            [
                (0, 5),
                (1000, 5),
                (2000, 5),
                (3000, 7),
                (4000, 7),
                (5000, 5)
            ]
        );
        assert_eq!(h.last(2), [(4000, 7), (5000, 5)]);
        assert_eq!(h.front(), Some((0, 5)));
    }

    #[test]
    fn past_its_cap_the_oldest_readings_go_one_by_one() {
        let mut h = History::default();
        for t in 0..10u64 {
            h.push(t * 1000, if t < 6 { 1 } else { 2 }, 4);
        }
        assert_eq!(h.len(), 4);
        assert_eq!(
            h.iter().collect::<Vec<_>>(),
            [(6000, 2), (7000, 2), (8000, 2), (9000, 2)]
        );
        // A long flat run keeps one entry, whatever its length.
        let mut h = History::default();
        for t in 0..10_000u64 {
            h.push(t * 1000, 3, 600);
        }
        assert_eq!((h.runs.len(), h.len()), (1, 600));
        assert_eq!(h.front(), Some((9_400_000, 3)));
    }
}
