//! A job that hangs alive: every rank alive, memory flat, and its GPUs busy with no work for the hang window
//! (`spin.rs` says what spinning is). The ranks whose GPUs do not spin are the ones the others wait for. A
//! busy job on GPUs without activity counters cannot be told hung or working: its phase is `unknown`, said
//! why, never settled-and-fine by default.

use gpusweep_core::format::{fmt_gpus, fmt_span};
use gpusweep_core::job::Phase;

use super::{JobOptions, Member, Track, held_up};
use crate::index::Indexed;
use crate::spin::{self, Spin};

/// What one rank does, its GPUs all together and its CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rank {
    /// Every GPU of it spins.
    Spinning,
    /// Its GPUs idle and the process asleep or held up (S, D, stopped): not in the collective, not working.
    Absent,
    /// Its GPU works, or it runs on the CPU (state R: a compile, a data step): the job progresses there.
    Progressing,
    /// A GPU of it is busy without activity counters.
    NoSignal,
    /// Not known yet (gauges unread, no GPM sample yet).
    Unknown,
}

fn rank_of(snap: &Indexed<'_>, m: &Member) -> Rank {
    if held_up(m.state).is_some() {
        return Rank::Absent;
    }
    let spins: Vec<Spin> = m
        .gpus
        .iter()
        .filter_map(|i| snap.gpu(*i))
        .map(spin::of)
        .collect();
    if spins.is_empty() {
        Rank::Unknown
    } else if spins.iter().all(|s| *s == Spin::Spinning) {
        Rank::Spinning
    } else if spins.contains(&Spin::NoSignal) {
        Rank::NoSignal
    } else if spins
        .iter()
        .any(|s| matches!(s, Spin::Unread | Spin::NotYet))
    {
        Rank::Unknown
    } else if spins.contains(&Spin::Working)
        || m.state == gpusweep_core::proc_state::ProcState::Running
    {
        Rank::Progressing
    } else {
        Rank::Absent
    }
}

/// The phase to say of a job whose memory says `t.flow`, at `at`: `hung` or `unknown` where its GPUs say so,
/// else its memory's phase. Keeps the track's spin clock, evidence and waited-on ranks.
pub(super) fn phase(
    t: &mut Track,
    snap: &Indexed<'_>,
    alive: &[&Member],
    at: u64,
    opts: JobOptions,
) -> Phase {
    t.phase_why = None;
    t.waiting_on.clear();
    // Only memory that stopped moving can hang; a job loading, starting or that lost a rank is that.
    if !matches!(t.flow, Phase::Settled | Phase::Holding) || alive.is_empty() {
        t.spin_since = None;
        return t.flow;
    }
    let ranks: Vec<(&Member, Rank)> = alive.iter().map(|m| (*m, rank_of(snap, m))).collect();
    if ranks.iter().any(|(_, r)| *r == Rank::NoSignal) {
        t.no_signal = true;
    }
    let spinning: Vec<&Member> = ranks
        .iter()
        .filter(|(_, r)| *r == Rank::Spinning)
        .map(|(m, _)| *m)
        .collect();
    // Some rank waits, and no rank progresses anywhere (a rank computing, or compiling on the CPU while its
    // peers wait, is a slow step, not a hang).
    let candidate = !spinning.is_empty()
        && ranks
            .iter()
            .all(|(_, r)| matches!(r, Rank::Spinning | Rank::Absent));
    if !candidate {
        t.spin_since = None;
        if t.no_signal {
            t.phase_why = Some(
                "busy, but its GPUs give no activity counters (GPM: Hopper or later, outside MIG), so \
                 whether it progresses or hangs cannot be told"
                    .into(),
            );
            return Phase::Unknown;
        }
        return t.flow;
    }
    let since = *t.spin_since.get_or_insert(at);
    if at.saturating_sub(since) < opts.hang_ms {
        return t.flow;
    }
    let mut gpus: Vec<u32> = spinning
        .iter()
        .flat_map(|m| m.gpus.iter().copied())
        .collect();
    gpus.sort_unstable();
    gpus.dedup();
    let evidence = spin::evidence(gpus.iter().filter_map(|i| snap.gpu(*i)));
    t.phase_why = Some(format!(
        "GPU {} {evidence} for {}",
        fmt_gpus(&gpus),
        fmt_span(at.saturating_sub(since))
    ));
    t.waiting_on = ranks
        .iter()
        .filter(|(_, r)| *r == Rank::Absent)
        .map(|(m, _)| m.pid)
        .collect();
    Phase::Hung
}
