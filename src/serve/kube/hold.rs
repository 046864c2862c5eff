//! What the node should say, decided from the host's verdicts over time: the `GPUHeld` condition, the node
//! taint and the GPUs whose devices are tainted. Held goes on at once (the ledger's confirm window already held
//! it); unread goes on once it has lasted the hold (one failed reading is not yet a fact); clean comes off only
//! after every reading of the hold said clean. A verdict that says the same changes nothing, so the writer
//! writes once per transition. No clock inside: callers pass the time.

use crate::analyze::node::{Gate, NodeVerdict};

/// The condition's three statuses, as the API spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// `True`: a leftover holds a GPU, or one needs a reset.
    Yes,
    /// `False`: every GPU read clean for the hold.
    No,
    /// `Unknown`: the host or a GPU could not be read for the hold.
    Unread,
}

impl Held {
    pub fn status(self) -> &'static str {
        match self {
            Held::Yes => "True",
            Held::No => "False",
            Held::Unread => "Unknown",
        }
    }

    /// The condition's reason, and the Event's.
    pub fn reason(self) -> &'static str {
        match self {
            Held::Yes => "LeftoverHolds",
            Held::No => "Clean",
            Held::Unread => "Unread",
        }
    }

    /// The node is kept off the scheduler while a GPU is held or cannot be read: an unread node is never
    /// offered as clean.
    pub fn tainted(self) -> bool {
        self != Held::No
    }

    fn of(g: Gate) -> Held {
        match g {
            Gate::Ok => Held::No,
            Gate::Problem => Held::Yes,
            Gate::Unknown => Held::Unread,
        }
    }
}

/// What the node says, as the writer is to put it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    pub held: Held,
    /// The verdict's line (escaped, PIDs and pod UIDs only).
    pub message: String,
    /// GPUs whose devices are to be tainted.
    pub gpus: Vec<u32>,
    /// When the verdict that decided it was first read.
    pub since_ms: u64,
}

/// The hysteresis between readings and what the node says.
#[derive(Debug)]
pub struct Hold {
    /// How long unread or clean must last.
    window_ms: u64,
    shown: Option<Desired>,
    /// A verdict unlike the one shown, and since when it has been read without a break.
    candidate: Option<(Held, u64)>,
    /// Since when the verdict names fewer unfit GPUs than are shown.
    fewer_since: Option<u64>,
}

impl Hold {
    pub fn new(hold_ms: u64) -> Hold {
        Hold {
            window_ms: hold_ms,
            shown: None,
            candidate: None,
            fewer_since: None,
        }
    }

    /// What is shown now (`None`: nothing decided yet).
    pub fn shown(&self) -> Option<&Desired> {
        self.shown.as_ref()
    }

    /// When the verdict read now would next be decided, if it waits for the hold.
    pub fn due_ms(&self) -> Option<u64> {
        self.candidate
            .map(|(_, since)| since)
            .or(self.fewer_since)
            .map(|since| since + self.window_ms)
    }

    /// A verdict read at `now_ms`. Returns what the node is to say when that changed.
    pub fn observe(&mut self, v: &NodeVerdict, now_ms: u64) -> Option<&Desired> {
        let held = Held::of(v.gate);
        if self.shown.as_ref().is_some_and(|s| s.held == held) {
            self.candidate = None;
            return self.regroup(held, v, now_ms);
        }
        self.fewer_since = None;
        let since = match self.candidate {
            Some((c, since)) if c == held => since,
            _ => now_ms,
        };
        self.candidate = Some((held, since));
        // A leftover is shown at once (its confirm window has passed); unread and clean wait for the hold.
        let due = held == Held::Yes || now_ms.saturating_sub(since) >= self.window_ms;
        if !due {
            return None;
        }
        self.candidate = None;
        self.show(held, v.line.clone(), v.unfit.clone(), since)
    }

    /// The same status with other GPUs: one more GPU unfit is said at once; one fewer only once the smaller
    /// set has lasted the hold (a GPU's device taint comes off as the node's does).
    fn regroup(&mut self, held: Held, v: &NodeVerdict, now_ms: u64) -> Option<&Desired> {
        let shown = self.shown.as_ref()?;
        if shown.gpus == v.unfit {
            self.fewer_since = None;
            return None;
        }
        let since_shown = shown.since_ms;
        let mut union = shown.gpus.clone();
        union.extend(v.unfit.iter().copied());
        union.sort_unstable();
        union.dedup();
        if union != shown.gpus {
            if union != v.unfit {
                self.fewer_since.get_or_insert(now_ms);
            }
            return self.show(held, v.line.clone(), union, since_shown);
        }
        let since = *self.fewer_since.get_or_insert(now_ms);
        if now_ms.saturating_sub(since) < self.window_ms {
            return None;
        }
        self.fewer_since = None;
        self.show(held, v.line.clone(), v.unfit.clone(), since_shown)
    }

    /// Time passing without a reading: a verdict whose hold is over is shown with what was last read.
    pub fn tick(&mut self, last: &NodeVerdict, now_ms: u64) -> Option<&Desired> {
        match self.candidate {
            Some((held, since))
                if held == Held::of(last.gate) && now_ms >= since + self.window_ms =>
            {
                self.candidate = None;
                self.show(held, last.line.clone(), last.unfit.clone(), since)
            }
            None if self.fewer_since.is_some() => {
                let held = Held::of(last.gate);
                if self.shown.as_ref().is_some_and(|s| s.held == held) {
                    self.regroup(held, last, now_ms)
                } else {
                    None
                }
            }
            _ => None,
        }
    }

    fn show(
        &mut self,
        held: Held,
        message: String,
        gpus: Vec<u32>,
        since_ms: u64,
    ) -> Option<&Desired> {
        self.shown = Some(Desired {
            held,
            message,
            gpus,
            since_ms,
        });
        self.shown.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(gate: Gate, unfit: &[u32]) -> NodeVerdict {
        NodeVerdict {
            gate,
            line: format!("{gate:?}"),
            unfit: unfit.to_vec(),
        }
    }

    #[test]
    fn a_leftover_is_shown_at_once_and_clean_only_after_the_hold() {
        let mut h = Hold::new(1_000);
        // Nothing decided until a verdict has lasted: a fresh writer says nothing on one clean reading.
        assert_eq!(h.observe(&v(Gate::Ok, &[]), 0), None);
        assert_eq!(h.observe(&v(Gate::Ok, &[]), 500), None);
        let clean = h.observe(&v(Gate::Ok, &[]), 1_000).cloned();
        assert_eq!(clean.map(|d| (d.held, d.since_ms)), Some((Held::No, 0)));
        // The same again: nothing to write.
        assert_eq!(h.observe(&v(Gate::Ok, &[]), 1_100), None);
        let held = h.observe(&v(Gate::Problem, &[3]), 1_200).cloned();
        assert_eq!(held.map(|d| (d.held, d.gpus)), Some((Held::Yes, vec![3])));
        // A second GPU held is said at once; one released while another holds comes off after the hold.
        assert!(h.observe(&v(Gate::Problem, &[3, 5]), 1_300).is_some());
        assert_eq!(h.observe(&v(Gate::Problem, &[3, 5]), 1_400), None);
        assert_eq!(h.observe(&v(Gate::Problem, &[5]), 1_500), None);
        assert_eq!(h.due_ms(), Some(2_500));
        let fewer = h.tick(&v(Gate::Problem, &[5]), 2_500).cloned();
        assert_eq!(fewer.map(|d| d.gpus), Some(vec![5]));
        assert!(
            h.observe(&v(Gate::Problem, &[3]), 2_600)
                .is_some_and(|d| d.gpus == vec![3, 5])
        );
        assert_eq!(h.due_ms(), Some(3_600));
        assert!(h.observe(&v(Gate::Problem, &[3, 5]), 2_700).is_none());
        assert_eq!(h.due_ms(), None);
        // Clean must last the hold, without a break.
        assert_eq!(h.observe(&v(Gate::Ok, &[]), 3_000), None);
        assert_eq!(h.observe(&v(Gate::Problem, &[3, 5]), 3_500), None);
        assert_eq!(h.observe(&v(Gate::Ok, &[]), 3_600), None);
        assert_eq!(h.tick(&v(Gate::Ok, &[]), 4_500), None);
        let off = h.tick(&v(Gate::Ok, &[]), 4_600).cloned();
        assert_eq!(off.map(|d| (d.held, d.since_ms)), Some((Held::No, 3_600)));
    }

    #[test]
    fn unread_waits_for_the_hold_and_then_taints() {
        let mut h = Hold::new(1_000);
        assert!(h.observe(&v(Gate::Ok, &[]), 0).is_none());
        assert!(h.tick(&v(Gate::Ok, &[]), 1_000).is_some());
        // One failed reading, then clean again: nothing said.
        assert_eq!(h.observe(&v(Gate::Unknown, &[0, 1]), 1_500), None);
        assert_eq!(h.observe(&v(Gate::Ok, &[]), 1_600), None);
        assert_eq!(h.due_ms(), None);
        assert_eq!(h.observe(&v(Gate::Unknown, &[0, 1]), 2_000), None);
        assert_eq!(h.due_ms(), Some(3_000));
        let d = h.tick(&v(Gate::Unknown, &[0, 1]), 3_000).cloned();
        assert_eq!(d.as_ref().map(|d| d.held), Some(Held::Unread));
        assert!(d.is_some_and(|d| d.held.tainted() && d.gpus == vec![0, 1]));
        assert!(!Held::No.tainted());
    }
}
