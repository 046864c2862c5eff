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
