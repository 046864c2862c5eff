//! The simulated cluster: what each host shows, and sweeps that drain like real GPUs.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use gpusweep::analyze::plan::plan;
use gpusweep::analyze::watch::{Scope, Verdict, verdict};
use gpusweep::analyze::{AnalyzeOptions, analyzed};
use gpusweep::core::model::FindingKind;
use gpusweep::core::model::HostId;
use gpusweep::core::signal::{Fate, Protected, Sig};
use gpusweep::source::demo::{DemoClock, DemoHost};

#[test]
fn gpu_b_after_pkill_has_every_kind_of_leftover() {
    let (clock, _) = DemoClock::manual(0);
    let h = DemoHost::new("gpu-b", clock);
    let s = analyzed(h.snapshot(), &AnalyzeOptions::default());
    let kinds: HashSet<FindingKind> = s.findings.iter().map(|f| f.kind).collect();
    for k in [
        FindingKind::Ghost,
        FindingKind::HiddenHolder,
        FindingKind::Residual,
        FindingKind::OrphanedJob,
        FindingKind::Zombie,
        FindingKind::ShmLeftover,
    ] {
        assert!(kinds.contains(&k), "missing {k:?}: {:?}", s.findings);
    }
}

#[test]
fn gpu_a_ramps_and_gpu_c_has_the_smem_limit() {
    let (clock, t) = DemoClock::manual(0);
    let a = DemoHost::new("gpu-a", clock.clone());
    let early = a.snapshot().gpus[0].memory.used.expect("used");
    t.store(30_000, Ordering::SeqCst);
    let mid = a.snapshot().gpus[0].memory.used.expect("used");
    t.store(120_000, Ordering::SeqCst);
    let late = a.snapshot().gpus[0].memory.used.expect("used");
    assert!(early < mid && mid < late, "{early} {mid} {late}");
    let c = analyzed(
        DemoHost::new("gpu-c", clock).snapshot(),
        &AnalyzeOptions::default(),
    );
    assert!(c.findings.iter().any(|f| f.kind == FindingKind::SmemLimit));
}

#[test]
fn sweeping_gpu_b_drains_100ms_after_the_kill() {
    let (clock, t) = DemoClock::manual(5_000);
    let mut h = DemoHost::new("gpu-b", clock);
    let s = analyzed(h.snapshot(), &AnalyzeOptions::default());
    let p = plan(HostId(0), &s, None, &Protected::remote());
    let pids: Vec<u32> = p.items.iter().map(|i| i.pid).collect();
    assert!(pids.contains(&7306) && pids.contains(&7391), "{pids:?}");
    assert!(!pids.contains(&812), "nvidia-persistenced is benign");
    let out = h.signal(&p.request(
        HostId(0),
        Sig::Term,
        Some(10_000),
        gpusweep::core::action::Purpose::Sweep,
    ));
    assert!(
        out.iter().all(|o| matches!(o.fate, Fate::Exited { .. })),
        "{out:?}"
    );
    // Still draining at +50 ms, clean at +100 ms.
    t.store(5_050, Ordering::SeqCst);
    assert!(matches!(
        verdict(&h.snapshot(), &Scope::default(), 0, &[]),
        Verdict::Dirty(_)
    ));
    t.store(5_100, Ordering::SeqCst);
    assert_eq!(
        verdict(&h.snapshot(), &Scope::default(), 0, &[]),
        Verdict::Clean
    );
}

#[test]
fn demo_refuses_pid_1_and_reused_pids() {
    let (clock, _) = DemoClock::manual(0);
    let mut h = DemoHost::new("gpu-b", clock);
    let req = gpusweep::core::signal::SignalRequest {
        targets: vec![
            gpusweep::core::signal::TargetInfo {
                pid: 1,
                start_time: 0,
                cmdline: String::new(),
                pidfs_ino: None,
            },
            gpusweep::core::signal::TargetInfo {
                pid: 7306,
                start_time: 1,
                cmdline: String::new(),
                pidfs_ino: None,
            },
        ],
        signal: Sig::Kill,
        grace_ms: None,
        purpose: None,
    };
    let out = h.signal(&req);
    assert!(matches!(&out[0].fate, Fate::Refused { reason } if reason.contains("PID 1")));
    assert!(matches!(&out[1].fate, Fate::Refused { reason } if reason.contains("reused")));
}

/// A demo host read by a ledger every second from `from` to `to` (simulated ms): every event, and the last
/// judged reading.
fn watch_demo(
    h: &DemoHost,
    t: &std::sync::atomic::AtomicU64,
    ledger: &mut gpusweep::runtime::ledger::Ledger,
    from: u64,
    to: u64,
) -> Vec<gpusweep::core::event::Event> {
    let mut events = Vec::new();
    let mut at = from;
    while at <= to {
        t.store(at, Ordering::SeqCst);
        events.extend(ledger.reading(h.snapshot()).1);
        at += 1_000;
    }
    events
}

#[test]
fn gpu_a_warms_up_through_its_phases_with_rank_5_straggling() {
    use gpusweep::core::event::EventKind;
    use gpusweep::core::job::Phase;
    let (clock, t) = DemoClock::manual(0);
    let h = DemoHost::new("gpu-a", clock);
    let mut l = gpusweep::runtime::ledger::Ledger::new("gpu-a", AnalyzeOptions::default());
    let events = watch_demo(&h, &t, &mut l, 0, 30_000);
    let last = l.latest().expect("read");
    let job = &last.snap.jobs[0];
    assert_eq!(job.id, "sglang-ep8.service");
    assert_eq!(job.ranks.len(), 8);
    assert_eq!(job.phase, Phase::Loading);
    let straggler: Vec<_> = last
        .snap
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::Straggler)
        .collect();
    assert_eq!(straggler.len(), 1, "{:?}", last.snap.findings);
    assert_eq!(straggler[0].gpu, Some(5));
    assert!(
        events.iter().any(|e| matches!(
            &e.what,
            EventKind::JobPhase {
                phase: Phase::Loading,
                ..
            }
        )),
        "{events:?}"
    );
    // Rank 5 takes its KV cache at 90 s; a minute flat after that, the job is settled.
    let events = watch_demo(&h, &t, &mut l, 31_000, 160_000);
    let settled = events.iter().find_map(|e| match &e.what {
        EventKind::JobPhase {
            phase: Phase::Settled,
            warmup_ms,
            ..
        } => Some((e.at_ms, *warmup_ms)),
        _ => None,
    });
    let (at, warmup) = settled.expect("settled");
    let start = l.latest().expect("read").snap.jobs[0].started_ms;
    assert_eq!(
        warmup,
        Some(90_000),
        "from the ranks' start to the last rise"
    );
    assert_eq!(at - start, 150_000, "a minute after memory stopped rising");
    assert!(
        !l.latest()
            .expect("read")
            .snap
            .findings
            .iter()
            .any(|f| f.kind == FindingKind::Straggler),
        "no straggler once settled"
    );
}

#[test]
#[allow(clippy::too_many_lines)] // one story: the loss, its finding, the sweep, the end
fn gpu_d_loses_rank_3_and_a_sweep_of_the_job_ends_the_seven_left() {
    use gpusweep::core::event::EventKind;
    let (clock, t) = DemoClock::manual(0);
    let mut h = DemoHost::new("gpu-d", clock);
    let mut l = gpusweep::runtime::ledger::Ledger::new("gpu-d", AnalyzeOptions::default());
    let events = watch_demo(&h, &t, &mut l, 0, 23_000);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.what, EventKind::RankLost { .. }))
    );
    let events = watch_demo(&h, &t, &mut l, 24_000, 24_000);
    let lost = events
        .iter()
        .find_map(|e| match &e.what {
            EventKind::RankLost {
                pid,
                gpus,
                left,
                left_bytes,
                ..
            } => Some((*pid, gpus.clone(), *left, *left_bytes)),
            _ => None,
        })
        .expect("rank lost within one reading");
    assert_eq!(lost.0, 6123);
    assert_eq!(lost.1, [3]);
    assert_eq!(lost.2, 7);
    assert!(lost.3.is_some_and(|b| b > 7 * 80 * 1024 * 1024 * 1024));
    let snap = l.latest().expect("read").snap;
    let finding = snap.finding_of(FindingKind::LostRank).expect("lost_rank");
    assert!(
        finding.detail.contains("SM120") && finding.detail.contains("shared memory"),
        "{}",
        finding.detail
    );
    assert!(
        finding.action.contains("sweep --job tree:6100"),
        "{}",
        finding.action
    );
    // A sweep of the job: its seven ranks, nothing else.
    let ranks = gpusweep::analyze::watch::job_processes(&snap, "tree:6100");
    assert_eq!(
        ranks.iter().map(|r| r.0).collect::<Vec<_>>(),
        [6120, 6121, 6122, 6124, 6125, 6126, 6127]
    );
    let targets = ranks
        .iter()
        .map(|(pid, _)| {
            let p = snap.proc(*pid).expect("proc");
            gpusweep::core::signal::TargetInfo {
                pid: *pid,
                start_time: p.start_time,
                cmdline: p.cmdline.clone(),
                pidfs_ino: None,
            }
        })
        .collect();
    let out = h.signal(&gpusweep::core::signal::SignalRequest {
        targets,
        signal: Sig::Term,
        grace_ms: Some(10_000),
        purpose: Some(gpusweep::core::action::Purpose::Sweep),
    });
    assert!(
        out.iter().all(|o| matches!(o.fate, Fate::Exited { .. })),
        "{out:?}"
    );
    let events = watch_demo(&h, &t, &mut l, 25_000, 25_000);
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.what, EventKind::JobEnded { job, .. } if job == "tree:6100")),
        "{events:?}"
    );
    assert_eq!(
        verdict(&l.latest().expect("read").snap, &Scope::default(), 0, &[]),
        Verdict::Clean
    );
}
