//! One GPU's memory history: the last `cap` readings as (time ms, MiB), kept as runs of equal values. A
//! GPU whose memory stays put (most of a fleet, most of the time) costs one run, not a sample per reading:
//! ten thousand hosts' eight GPUs at a 1 s poll keep a few megabytes, where a sample each kept hundreds, and
//! a reading that says the same extends a run in place. A host's readings that said the same are only
//! counted, and put into its GPUs' histories when one is read or a reading moves.

use std::borrow::Cow;
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

    /// `n` more readings of its last value, the last of them at `at_ms`, the oldest let go past `cap`.
    fn again(&mut self, n: usize, at_ms: u64, cap: usize) {
        let Some(r) = self.runs.back_mut() else {
            return;
        };
        r.last_ms = at_ms;
        r.count += n;
        self.len += n;
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
pub struct Histories {
    /// Each GPU's history, and whether the last reading read it.
    gpus: Vec<(u32, History, bool)>,
    /// Readings since the last one that said the same memory again: how many, the last one's time, and
    /// the cap they go in under. Touching each GPU's history for each of them was a sixth of a
    /// 10,000-host TUI's time.
    again: usize,
    again_ms: u64,
    cap: usize,
}

impl Histories {
    /// GPU `gpu`'s history, with the readings that said the same since the last one in.
    pub fn get(&self, gpu: &u32) -> Option<Cow<'_, History>> {
        let h = self
            .gpus
            .iter()
            .find(|(g, _, _)| g == gpu)
            .map(|(_, h, live)| (h, live))?;
        match h {
            (h, true) if self.again > 0 => {
                let mut h = h.clone();
                h.again(self.again, self.again_ms, self.cap);
                Some(Cow::Owned(h))
            }
            (h, _) => Some(Cow::Borrowed(h)),
        }
    }

    /// A reading's memory, GPU by GPU in MiB (None: not read), at `at_ms`: each read GPU's history takes
    /// it, the oldest let go past `cap` readings.
    pub fn reading(
        &mut self,
        at_ms: u64,
        gpus: impl Iterator<Item = (u32, Option<u64>)>,
        cap: usize,
    ) {
        self.settle();
        for (_, _, live) in &mut self.gpus {
            *live = false;
        }
        for (gpu, mib) in gpus {
            let Some(mib) = mib else { continue };
            if let Some((_, h, live)) = self.gpus.iter_mut().find(|(g, _, _)| *g == gpu) {
                h.push(at_ms, mib, cap);
                *live = true;
                continue;
            }
            let mut h = History::default();
            h.push(at_ms, mib, cap);
            self.gpus.push((gpu, h, true));
        }
    }

    /// A reading at `at_ms` that said every GPU's memory as the last one did: counted.
    pub fn again(&mut self, at_ms: u64, cap: usize) {
        self.again += 1;
        self.again_ms = at_ms;
        self.cap = cap;
    }

    /// The readings counted, put into the histories of the GPUs the last reading read.
    fn settle(&mut self) {
        if self.again == 0 {
            return;
        }
        for (_, h, _) in self.gpus.iter_mut().filter(|(_, _, live)| *live) {
            h.again(self.again, self.again_ms, self.cap);
        }
        self.again = 0;
    }

    /// The GPUs it has a history of, in the order first seen.
    pub fn keys(&self) -> impl Iterator<Item = &u32> {
        self.gpus.iter().map(|(g, _, _)| g)
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

    /// Readings that said the same are counted and read back as if each had been put in: one by one or
    /// counted, the same history, and a GPU the last reading did not read takes none of them.
    #[test]
    fn readings_that_said_the_same_read_back_as_if_put_in() {
        let (mut counted, mut each) = (Histories::default(), Histories::default());
        let reading = |h: &mut Histories, t: u64, a: u64, b: Option<u64>| {
            h.reading(t, [(0, Some(a)), (1, b)].into_iter(), 5);
        };
        for (t, a, b) in [(0, 1, Some(7)), (1_000, 1, Some(7)), (2_000, 2, None)] {
            reading(&mut counted, t, a, b);
            reading(&mut each, t, a, b);
        }
        for t in [3_000, 4_000, 5_000, 6_000] {
            counted.again(t, 5);
            reading(&mut each, t, 2, None);
        }
        let read = |h: &Histories, g: u32| h.get(&g).map(|x| x.iter().collect::<Vec<_>>());
        for g in [0, 1] {
            assert_eq!(read(&counted, g), read(&each, g), "GPU {g}");
        }
        assert_eq!(
            read(&counted, 0),
            Some(vec![
                (2_000, 2),
                (3_000, 2),
                (4_000, 2),
                (5_000, 2),
                (6_000, 2)
            ])
        );
        assert_eq!(read(&counted, 1), Some(vec![(0, 7), (1_000, 7)]));
        // Put in for good by the next reading that moves.
        reading(&mut counted, 7_000, 3, Some(8));
        reading(&mut each, 7_000, 3, Some(8));
        for g in [0, 1] {
            assert_eq!(counted.get(&g), each.get(&g), "GPU {g}");
            assert!(
                matches!(counted.get(&g), Some(Cow::Borrowed(_))),
                "put in: GPU {g}"
            );
        }
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
