//! A finding seen to appear while a host is watched is said at its full severity once it has lasted the
//! confirm window. Every process passes through some findings for a moment: a rank starting CUDA holds its
//! GPU before NVML lists it (a hidden holder, a residual), a killed rank is charged until the driver has
//! freed its memory (a ghost), a driver call puts it in state D, a child is a zombie until its parent reaps
//! it. A real H200 showed each of these for 0.1-0.6 s. Until the window passes such a finding is said one
//! step lower (a leak as a warning, a warning as a note) and says so; one present at the host's first
//! reading was not seen to appear and is said as it is. Pure: the ledger gives the time.

use std::collections::HashMap;

use gpusweep_core::format::fmt_span;
use gpusweep_core::model::{Finding, FindingKind, Severity, Subject};

/// When each finding of one watched host was first seen (Unix ms; 0: at the first reading).
#[derive(Debug, Default)]
pub struct Confirm {
    since: HashMap<Subject, u64>,
    /// Each GPU a leak was said of at the last reading, at full severity, and since when: a leak there that
    /// only changed its name (a ghost become a residual, a lost rank whose launcher was reaped) is the same
    /// memory held, and no transition of the verdict passes through clean.
    held: HashMap<u32, u64>,
    read: bool,
}

/// What a finding is about for the window: its subject but for whom its action names (the launcher to
/// end, the holder behind a ghost), which moves while the memory stays held.
fn key(f: &Finding) -> Subject {
    Subject {
        target_pid: None,
        ..f.subject()
    }
}

/// What `apply` did to a reading's findings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Applied {
    /// A severity changed (lowered or restored): the GPU states are to be judged again.
    pub changed: bool,
    /// When the earliest finding still lowered will have lasted the window.
    pub due_ms: Option<u64>,
}

impl Confirm {
    /// Lower each finding that appeared less than `window_ms` before `at`, and restore those that lasted.
    /// Findings already lowered by an earlier call (a reading judged again) are restored first.
    pub fn apply(&mut self, findings: &mut [Finding], at: u64, window_ms: u64) -> Applied {
        let first = !self.read;
        self.read = true;
        let mut out = Applied::default();
        if findings.is_empty() {
            self.since.clear();
            self.held.clear();
            return out;
        }
        let mut since = HashMap::with_capacity(findings.len());
        let mut held: HashMap<u32, u64> = HashMap::new();
        for f in findings.iter_mut() {
            out.changed |= restore(f, window_ms);
            let subject = key(f);
            // A busy GPU is never judged on one reading: its utilization is a sample of the last second,
            // and a job that just ended reads busy for that second.
            let unseen = first && f.kind == FindingKind::BusyWithoutHolder;
            let renamed = || {
                (f.severity == Severity::Leak)
                    .then(|| f.gpu.and_then(|g| self.held.get(&g).copied()))
                    .flatten()
            };
            let t = if first && !unseen {
                0
            } else {
                self.since
                    .get(&subject)
                    .copied()
                    .or_else(renamed)
                    .unwrap_or(at)
            };
            since.insert(subject, t);
            let due = t.saturating_add(window_ms);
            if at < due && f.severity > Severity::Info {
                lower(f, window_ms, unseen);
                out.changed = true;
                out.due_ms = Some(out.due_ms.map_or(due, |d: u64| d.min(due)));
            } else if f.severity == Severity::Leak
                && let Some(g) = f.gpu
            {
                held.entry(g).and_modify(|s| *s = (*s).min(t)).or_insert(t);
            }
        }
        self.since = since;
        self.held = held;
        out
    }
}

impl Confirm {
    /// A zombie that touches no GPU is not said at all until it lasts the window: every process's child is
    /// one for a moment, until its parent reaps it (a shell's, gpusweep's own), and such a note offered a kill
    /// of an unrelated parent. One touching a GPU (a rank's, a holder's child) is said at once, lowered.
    pub fn withhold_passing(&self, findings: &mut Vec<Finding>, at: u64, window_ms: u64) {
        findings.retain(|f| {
            let young = self
                .since
                .get(&key(f))
                .is_some_and(|t| at < t.saturating_add(window_ms));
            !(f.kind == FindingKind::Zombie && f.gpu.is_none() && young)
        });
    }
}

fn word(s: Severity) -> &'static str {
    match s {
        Severity::Leak => "leak",
        Severity::Warning => "warning",
        Severity::Info => "note",
    }
}

fn note(then: Severity, window_ms: u64, unseen: bool) -> String {
    format!(
        " ({}: a {} if it lasts {})",
        if unseen {
            "one reading"
        } else {
            "just appeared"
        },
        word(then),
        fmt_span(window_ms)
    )
}

fn lower(f: &mut Finding, window_ms: u64, unseen: bool) {
    let then = f.severity;
    f.severity = if then == Severity::Leak {
        Severity::Warning
    } else {
        Severity::Info
    };
    f.detail.push_str(&note(then, window_ms, unseen));
    f.confirms_as = Some(then);
}

/// A lowered finding back as it was; whether it was lowered.
fn restore(f: &mut Finding, window_ms: u64) -> bool {
    let Some(then) = f.confirms_as.take() else {
        return false;
    };
    for unseen in [false, true] {
        if let Some(d) = f.detail.strip_suffix(&note(then, window_ms, unseen)) {
            let n = d.len();
            f.detail.truncate(n);
            break;
        }
    }
    f.severity = then;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_gpu_is_never_a_leak_on_one_reading_and_is_once_it_lasted() {
        let mut c = Confirm::default();
        let mut f = [finding(FindingKind::BusyWithoutHolder, Severity::Leak)];
        let a = c.apply(&mut f, 10_000, 3_000);
        assert_eq!(a.due_ms, Some(13_000));
        assert_eq!(f[0].severity, Severity::Warning);
        assert_eq!(f[0].detail, "d (one reading: a leak if it lasts 3.0 s)");
        c.apply(&mut f, 13_000, 3_000);
        assert_eq!((f[0].severity, f[0].detail.as_str()), (Severity::Leak, "d"));
        // Other kinds at the first reading are said as they are.
        let mut other = Confirm::default();
        let mut g = [finding(FindingKind::Ghost, Severity::Leak)];
        other.apply(&mut g, 10_000, 3_000);
        assert_eq!(g[0].severity, Severity::Leak);
    }

    #[test]
    fn a_passing_zombie_of_no_gpu_is_withheld_and_one_of_a_gpu_said_at_once() {
        let mut c = Confirm::default();
        c.apply(&mut [], 0, 3_000);
        let mut passing = finding(FindingKind::Zombie, Severity::Warning);
        passing.gpu = None;
        let of_a_rank = finding(FindingKind::Zombie, Severity::Warning);
        let mut f = vec![passing.clone(), of_a_rank];
        c.apply(&mut f, 1_000, 3_000);
        c.withhold_passing(&mut f, 1_000, 3_000);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].gpu, Some(0));
        // Still there past the window: said.
        let mut f = vec![passing];
        c.apply(&mut f, 4_500, 3_000);
        c.withhold_passing(&mut f, 4_500, 3_000);
        assert_eq!(f.len(), 1, "{f:?}");
    }

    /// No transition passes through clean: a leak said in one reading is said in the next when only its
    /// name moved (its launcher reaped, so the action names no one; a ghost become a residual once NVML
    /// lets go of the dead PID), while a leak new on another GPU still waits out the window.
    #[test]
    fn a_leak_that_changes_its_name_stays_a_leak() {
        let mut c = Confirm::default();
        c.apply(&mut [], 0, 3_000);
        let mut lost = finding(FindingKind::LostRank, Severity::Leak);
        lost.target_pid = Some(40);
        let mut f = [lost.clone()];
        c.apply(&mut f, 1_000, 3_000);
        assert_eq!(f[0].severity, Severity::Warning, "seen to appear");
        let mut f = [lost.clone()];
        c.apply(&mut f, 4_000, 3_000);
        assert_eq!(f[0].severity, Severity::Leak, "lasted");
        // The launcher is reaped: the action names no one now.
        lost.target_pid = None;
        let mut f = [lost];
        c.apply(&mut f, 4_100, 3_000);
        assert_eq!(f[0].severity, Severity::Leak, "its launcher reaped: {f:?}");
        // The dead rank's PID let go by NVML: a residual on the same GPU.
        let mut residual = finding(FindingKind::Residual, Severity::Leak);
        residual.pid = None;
        let mut f = [residual.clone()];
        c.apply(&mut f, 4_200, 3_000);
        assert_eq!(f[0].severity, Severity::Leak, "renamed on its GPU: {f:?}");
        // A leak new on another GPU waits out the window.
        let mut other = finding(FindingKind::Ghost, Severity::Leak);
        other.gpu = Some(3);
        let mut f = [residual, other];
        c.apply(&mut f, 4_300, 3_000);
        assert_eq!(
            (f[0].severity, f[1].severity),
            (Severity::Leak, Severity::Warning)
        );
    }

    fn finding(kind: FindingKind, severity: Severity) -> Finding {
        Finding {
            kind,
            severity,
            host: "h".into(),
            gpu: Some(0),
            pid: Some(7),
            bytes: None,
            detail: "d".into(),
            action: "a".into(),
            target_pid: None,
            gpu_instance: None,
            file: None,
            confirms_as: None,
        }
    }

    #[test]
    fn lowered_while_young_restored_whole_once_it_lasted_and_notes_stay_notes() {
        let mut c = Confirm::default();
        assert_eq!(c.apply(&mut [], 1_000, 3_000), Applied::default());
        let mut f = [
            finding(FindingKind::Ghost, Severity::Leak),
            finding(FindingKind::Zombie, Severity::Warning),
            finding(FindingKind::NotVisible, Severity::Info),
        ];
        let a = c.apply(&mut f, 2_000, 3_000);
        assert_eq!(
            a,
            Applied {
                changed: true,
                due_ms: Some(5_000)
            }
        );
        let sev: Vec<_> = f.iter().map(|f| (f.severity, f.confirms_as)).collect();
        assert_eq!(
            sev,
            [
                (Severity::Warning, Some(Severity::Leak)),
                (Severity::Info, Some(Severity::Warning)),
                (Severity::Info, None)
            ]
        );
        assert_eq!(f[0].detail, "d (just appeared: a leak if it lasts 3.0 s)");
        // Judged again before the window: as it was lowered, same words.
        let mut again = f.clone();
        c.apply(&mut again, 4_999, 3_000);
        assert_eq!(again, f);
        c.apply(&mut f, 5_000, 3_000);
        assert_eq!((f[0].severity, f[0].confirms_as), (Severity::Leak, None));
        assert_eq!(f[0].detail, "d");
        assert_eq!(f[1].severity, Severity::Warning);
        // No window: nothing is lowered.
        let mut off = Confirm::default();
        off.apply(&mut [], 1, 0);
        let mut g = [finding(FindingKind::Ghost, Severity::Leak)];
        assert!(!off.apply(&mut g, 2, 0).changed);
        assert_eq!(g[0].severity, Severity::Leak);
    }
}
