//! Analysis on fixtures, including what a real H200 showed (the readings in docs/validation.md).

use gpusweep_analyze::plan::plan;
use gpusweep_analyze::watch::{Scope, Verdict, Watch, verdict};
use gpusweep_analyze::{AnalyzeOptions, GpuState, analyze, analyzed, gpu_state};
use gpusweep_core::model::*;
use gpusweep_core::signal::Protected;

const H200_TOTAL: u64 = 143_771 * MIB;

fn gpu(index: u32, used_mib: u64, listed: &[(u32, u64)]) -> Gpu {
    Gpu {
        index,
        uuid: Some("GPU-a5b2e79f-a4e0-1241-ebeb-3cdbbcebd2a0".into()),
        name: Some("NVIDIA H200".into()),
        minor: Some(index),
        memory: Memory {
            used: Some(used_mib * MIB),
            total: Some(H200_TOTAL),
            reserved: Some(616 * MIB),
        },
        compute_capability: Some("9.0".into()),
        processes: listed
            .iter()
            .map(|&(pid, b)| ListedProcess {
                pid,
                used_bytes: Some(b),
                kind: ProcessKind::Compute,
                name: None,
                gpu_instance: None,
            })
            .collect(),
        ..Default::default()
    }
}

fn proc_(pid: u32, ppid: u32, sid: u32, state: char, cmd: &str) -> Proc {
    Proc {
        pid,
        ppid,
        sid,
        state: ProcState::from_char(state),
        start_time: 1000 + u64::from(pid),
        comm: cmd.split(' ').next().unwrap_or("").into(),
        cmdline: cmd.into(),
        ..Default::default()
    }
}

fn holder(pid: u32, gpus: &[u32]) -> Holder {
    let mut devices: Vec<String> = gpus.iter().map(|g| format!("/dev/nvidia{g}")).collect();
    devices.push("/dev/nvidiactl".into());
    Holder {
        pid,
        gpus: gpus.to_vec(),
        devices,
        fd_count: 23,
        benign: false,
        kept: false,
        declared: false,
    }
}

fn host(gpus: Vec<Gpu>, processes: Vec<Proc>, holders: Vec<Holder>) -> HostSnapshot {
    HostSnapshot {
        host: "h200".into(),
        gpus,
        processes,
        holders,
        ..Default::default()
    }
}

fn kinds(f: &[Finding]) -> Vec<(FindingKind, Option<u32>, Option<u32>)> {
    f.iter().map(|f| (f.kind, f.gpu, f.pid)).collect()
}

/// The real fork leak: NVML charges 10148 MiB to dead pid 924; orphan child 946 holds /dev/nvidia0; 10157 MiB used.
fn fork_leak() -> HostSnapshot {
    host(
        vec![gpu(0, 10157, &[(924, 10_640_949_248)])],
        vec![proc_(946, 1, 924, 'S', "python3 leak_fork.py")],
        vec![holder(946, &[0])],
    )
}

#[test]
fn real_fork_leak_is_ghost_hidden_holder_orphan_and_residual() {
    let snap = analyzed(fork_leak(), &AnalyzeOptions::default());
    let k = kinds(&snap.findings);
    assert!(
        k.contains(&(FindingKind::Ghost, Some(0), Some(924))),
        "{k:?}"
    );
    assert!(
        k.contains(&(FindingKind::HiddenHolder, Some(0), Some(946))),
        "{k:?}"
    );
    assert!(
        k.contains(&(FindingKind::Orphan, Some(0), Some(946))),
        "{k:?}"
    );
    let residual = snap.finding_of(FindingKind::Residual).expect("residual");
    assert_eq!(
        residual.bytes,
        Some(10157 * MIB),
        "nothing live is charged, so all used memory is residual"
    );
    let ghost = snap.finding_of(FindingKind::Ghost).expect("ghost");
    assert_eq!(ghost.bytes, Some(10_640_949_248));
    assert_eq!(
        ghost.target_pid,
        Some(946),
        "the ghost names the process that keeps its memory alive"
    );
    assert!(
        ghost.detail.contains("924") && ghost.detail.contains("946"),
        "{}",
        ghost.detail
    );
    assert_eq!(
        gpu_state(&snap, &snap.gpus[0], &AnalyzeOptions::default()),
        GpuState::Leak
    );
    // The plan kills 946, and nothing else (924 is dead).
    let p = plan(HostId(0), &snap, None, &Protected::remote());
    assert_eq!(p.items.iter().map(|i| i.pid).collect::<Vec<_>>(), vec![946]);
    assert_eq!(p.items[0].bytes, Some(10157 * MIB));
}

#[test]
fn live_process_charged_20gb_is_in_use_not_a_leak() {
    // Real: NVML listed pid 510 Used(20640169984) while the GPU read 19692 MiB.
    let snap = analyzed(
        host(
            vec![gpu(0, 19692, &[(510, 20_640_169_984)])],
            vec![proc_(510, 400, 400, 'S', "python3 hold.py")],
            vec![holder(510, &[0])],
        ),
        &AnalyzeOptions::default(),
    );
    assert!(snap.findings.is_empty(), "{:?}", snap.findings);
    assert_eq!(
        gpu_state(&snap, &snap.gpus[0], &AnalyzeOptions::default()),
        GpuState::InUse
    );
    let p = plan(HostId(0), &snap, Some(&[0]), &Protected::remote());
    assert_eq!(p.items.len(), 1);
    assert_eq!(p.items[0].bytes, Some(20_640_169_984));
    assert!(p.items[0].why.contains("listed on GPU 0"));
}

#[test]
fn zombie_names_its_parent_and_holds_nothing() {
    // Real: the child 1345 exited and stayed Z under its parent; its 5380 MiB was released.
    let snap = analyzed(
        host(
            vec![gpu(0, 0, &[])],
            vec![
                proc_(1300, 1200, 1200, 'S', "python3 parent.py"),
                proc_(1345, 1300, 1200, 'Z', ""),
            ],
            vec![holder(1300, &[0])],
        )
        .with_zombies(vec![1345]),
        &AnalyzeOptions::default(),
    );
    let z = snap.finding_of(FindingKind::Zombie).expect("zombie");
    assert_eq!(z.pid, Some(1345));
    assert_eq!(z.target_pid, Some(1300));
    assert!(z.action.contains("1300") && z.action.contains("killing a zombie does nothing"));
    assert_eq!(
        gpu_state(&snap, &snap.gpus[0], &AnalyzeOptions::default()),
        GpuState::Clean
    );
    // A sweep never targets a zombie.
    assert!(
        plan(HostId(0), &snap, None, &Protected::remote())
            .items
            .iter()
            .all(|i| i.pid != 1345)
    );
}

trait WithZombies {
    fn with_zombies(self, z: Vec<u32>) -> Self;
}
impl WithZombies for HostSnapshot {
    fn with_zombies(mut self, z: Vec<u32>) -> Self {
        self.zombies = z;
        self
    }
}

#[test]
fn reused_pid_is_a_ghost_not_a_live_process() {
    let snap = analyzed(
        host(
            vec![gpu(0, 5000, &[(777, 5000 * MIB)])],
            vec![proc_(777, 1, 777, 'S', "sshd: alice")],
            vec![],
        ),
        &AnalyzeOptions::default(),
    );
    let g = snap.finding_of(FindingKind::Ghost).expect("ghost");
    assert!(g.detail.contains("reused"), "{}", g.detail);
    // And the plan does not kill the innocent process that now has that PID.
    assert!(
        plan(HostId(0), &snap, None, &Protected::remote())
            .items
            .is_empty()
    );
}

/// Seen on a real H200: a rank being killed closes its files first, and NVML charges it until the driver has
/// freed its memory. It is the same process on its way out (PF_EXITING), not another on a reused PID.
#[test]
fn a_listed_pid_on_its_way_out_is_no_ghost_and_no_leak() {
    let mut leaving = proc_(534, 530, 530, 'D', "python3 worker.py");
    leaving.exiting = true;
    let snap = analyzed(
        host(
            vec![gpu(0, 6893, &[(534, 6888 * MIB)])],
            vec![proc_(530, 1, 530, 'S', "python3 launcher.py"), leaving],
            vec![],
        ),
        &AnalyzeOptions::default(),
    );
    assert!(
        snap.findings.iter().all(|f| f.severity != Severity::Leak),
        "{:?}",
        kinds(&snap.findings)
    );
    assert_eq!(snap.gpus[0].state, Some(GpuState::InUse));
}

#[test]
fn pids_of_another_namespace_are_not_ghosts() {
    let mut s = host(vec![gpu(0, 5000, &[(4242, 5000 * MIB)])], vec![], vec![]);
    s.in_child_pid_namespace = true;
    let f = analyze(&s, &AnalyzeOptions::default());
    assert_eq!(
        kinds(&f),
        vec![(FindingKind::NotVisible, Some(0), Some(4242))]
    );
    assert!(f[0].detail.contains("not visible from this PID namespace"));
}

#[test]
fn cuinit_only_4mib_with_nothing_listed_is_residual() {
    let f = analyze(
        &host(vec![gpu(0, 4, &[])], vec![], vec![]),
        &AnalyzeOptions::default(),
    );
    assert_eq!(kinds(&f), vec![(FindingKind::Residual, Some(0), None)]);
    assert_eq!(f[0].bytes, Some(4 * MIB));
    // With a 4 MiB tolerance it is clean.
    let f = analyze(
        &host(vec![gpu(0, 4, &[])], vec![], vec![]),
        &AnalyzeOptions {
            tolerance: 4 * MIB,
            ..Default::default()
        },
    );
    assert!(f.is_empty());
}

#[test]
fn benign_holders_are_never_leaks_or_targets() {
    let mut smi = holder(50, &[0]);
    smi.benign = true;
    let s = analyzed(
        host(
            vec![gpu(0, 300, &[])],
            vec![proc_(50, 1, 40, 'S', "nvidia-smi -l 5")],
            vec![smi],
        ),
        &AnalyzeOptions::default(),
    );
    assert!(
        s.findings.iter().all(|f| f.pid != Some(50)),
        "{:?}",
        s.findings
    );
    assert!(
        plan(HostId(0), &s, None, &Protected::remote())
            .items
            .is_empty()
    );
}

#[test]
fn idle_holder_with_no_unexplained_memory_is_not_hidden() {
    // Every NVML user opens /dev/nvidia0; on a clean GPU that is not a leak.
    let s = analyze(
        &host(
            vec![gpu(0, 0, &[])],
            vec![proc_(60, 55, 55, 'S', "python3 -c import pynvml")],
            vec![holder(60, &[0])],
        ),
        &AnalyzeOptions::default(),
    );
    assert!(s.is_empty(), "{s:?}");
}

#[test]
fn smem_limit_only_below_hopper() {
    let mut b = gpu(0, 0, &[]);
    b.compute_capability = Some("12.0".into());
    b.name = Some("NVIDIA RTX PRO 6000 Blackwell".into());
    let f = analyze(
        &host(vec![b, gpu(1, 0, &[])], vec![], vec![]),
        &AnalyzeOptions::default(),
    );
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].kind, FindingKind::SmemLimit);
    assert!(
        f[0].detail.contains("99 KB") && f[0].detail.contains("227 KB"),
        "{}",
        f[0].detail
    );
}

#[test]
fn shm_leftovers_only_when_nobody_uses_them() {
    let mut s = host(vec![], vec![], vec![]);
    s.shm = Some(ShmInfo {
        segments: vec![
            ShmSegment {
                name: "nccl-dead".into(),
                bytes: 33_554_432,
                age_s: Some(60),
                users: Some(vec![]),
                ..Default::default()
            },
            ShmSegment {
                name: "nccl-live".into(),
                bytes: 33_554_432,
                age_s: Some(60),
                users: Some(vec![123]),
                ..Default::default()
            },
            ShmSegment {
                name: "nccl-unknown".into(),
                bytes: 1,
                age_s: None,
                users: None,
                ..Default::default()
            },
            ShmSegment {
                name: "nccl-symlink".into(),
                bytes: 7,
                users: Some(vec![]),
                special: true,
                ..Default::default()
            },
        ],
        ..Default::default()
    });
    let f = analyze(&s, &AnalyzeOptions::default());
    assert_eq!(f.len(), 1, "a symlink is never a leftover: {f:?}");
    assert!(f[0].detail.contains("nccl-dead"));
    assert!(
        f[0].action.starts_with("`gpusweep shm clean`")
            && f[0].action.ends_with("rm -- '/dev/shm/nccl-dead'"),
        "{}",
        f[0].action
    );
}

#[test]
fn daemons_reparented_to_init_are_not_orphans() {
    // A service is its own session leader; a worker whose launcher died is not.
    let s = analyze(
        &host(
            vec![gpu(0, 0, &[])],
            vec![proc_(900, 1, 900, 'S', "tritonserver")],
            vec![holder(900, &[0])],
        ),
        &AnalyzeOptions::default(),
    );
    assert!(s.iter().all(|f| f.kind != FindingKind::Orphan));
}

#[test]
fn missing_readings_are_none_and_gpu_state_is_unknown() {
    let mut g = gpu(0, 0, &[]);
    g.memory.used = None;
    let s = host(vec![g], vec![], vec![]);
    assert!(analyze(&s, &AnalyzeOptions::default()).is_empty());
    assert_eq!(
        gpu_state(&s, &s.gpus[0], &AnalyzeOptions::default()),
        GpuState::Unknown
    );
    let json = serde_json::to_value(&s).expect("json");
    assert!(
        json["gpus"][0]["memory"]["used"].is_null(),
        "a missing reading is null in JSON, never 0"
    );
    assert!(json["gpus"][0]["utilization"].is_null());
}

#[test]
fn watch_verdicts_and_timing() {
    let dirty = analyzed(fork_leak(), &AnalyzeOptions::default());
    match verdict(&dirty, &Scope::default(), 0, &[]) {
        Verdict::Dirty(why) => assert!(
            why[0].contains("GPU 0") && why[0].contains("946"),
            "{why:?}"
        ),
        v => panic!("{v:?}"),
    }
    let clean = host(vec![gpu(0, 0, &[])], vec![], vec![]);
    let mut w = Watch::new(vec![(HostId(0), "h200".into())], Scope::default(), 0, 1000);
    assert!(!w.observe(HostId(0), &dirty, 1100));
    assert!(w.observe(HostId(0), &clean, 1222));
    assert_eq!(w.took_ms(), Some(222));
    // Scope: only GPU 1 matters, and GPU 1 is clean.
    let mut two = fork_leak();
    two.gpus.push(gpu(1, 0, &[]));
    assert_eq!(
        verdict(
            &two,
            &Scope {
                gpus: Some(vec![1])
            },
            0,
            &[]
        ),
        Verdict::Clean
    );
    // No GPU readable: judged by holders alone.
    let no_gpu = host(
        vec![],
        vec![proc_(5, 1, 2, 'S', "x")],
        vec![holder(5, &[0])],
    );
    assert!(matches!(
        verdict(&no_gpu, &Scope::default(), 0, &[]),
        Verdict::Dirty(_)
    ));
    let mut err = clean.clone();
    err.error = Some("unreachable".into());
    assert!(matches!(
        verdict(&err, &Scope::default(), 0, &[]),
        Verdict::Unknown(_)
    ));
}

#[test]
fn json_contract_field_names() {
    let snap = analyzed(fork_leak(), &AnalyzeOptions::default());
    let v = serde_json::to_value(&snap).expect("json");
    for k in [
        "host",
        "error",
        "gpus",
        "holders",
        "findings",
        "zombies",
        "shm",
        "processes",
    ] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    let g = &v["gpus"][0];
    for k in [
        "index",
        "uuid",
        "name",
        "memory",
        "compute_capability",
        "processes",
    ] {
        assert!(g.get(k).is_some(), "missing gpus[].{k}");
    }
    assert_eq!(g["memory"]["used"], serde_json::json!(10157 * MIB));
    let f = &v["findings"][0];
    for k in ["kind", "gpu", "pid", "bytes", "detail"] {
        assert!(f.get(k).is_some(), "missing findings[].{k}");
    }
    assert_eq!(f["kind"], "ghost");
}

#[test]
fn unknown_bytes_of_a_live_process_are_never_a_residual_leak() {
    // Under MIG NVML lists the process but cannot say what it uses.
    let mut g = gpu(0, 40_000, &[(500, 0)]);
    g.processes[0].used_bytes = None;
    let snap = host(
        vec![g],
        vec![proc_(500, 400, 400, 'S', "python3 serve.py")],
        vec![holder(500, &[0])],
    );
    let f = analyze(&snap, &AnalyzeOptions::default());
    assert!(
        !f.iter().any(|f| f.kind == FindingKind::Residual),
        "no leak claimed from bytes nobody could read: {f:?}"
    );
    let s = analyzed(snap, &AnalyzeOptions::default());
    assert_eq!(
        gpu_state(&s, &s.gpus[0], &AnalyzeOptions::default()),
        GpuState::InUse
    );
    assert!(
        plan(HostId(0), &s, None, &Protected::remote())
            .items
            .iter()
            .all(|i| i.why.contains("listed")),
        "the server itself is only a listed process"
    );
}

#[test]
fn an_unprivileged_reader_never_claims_nobody_holds_the_gpu() {
    // Root's fork leak read by uid 65534: NVML lists the dead parent, root's fds cannot be read.
    let mut snap = host(
        vec![gpu(0, 10157, &[(924, 10_640_949_248)])],
        vec![],
        vec![],
    );
    snap.unreadable_processes = 6;
    let s = analyzed(snap, &AnalyzeOptions::default());
    let ghost = s.finding_of(FindingKind::Ghost).expect("ghost");
    assert!(
        !ghost.detail.contains("no live process"),
        "{}",
        ghost.detail
    );
    assert!(
        ghost.detail.contains("6 processes could not be inspected"),
        "{}",
        ghost.detail
    );
    assert!(ghost.action.contains("root"), "{}", ghost.action);
}

#[test]
fn inside_a_pid_namespace_the_holder_is_named_as_outside() {
    // A container without host PIDs: NVML lists nothing, memory is used.
    let mut snap = host(vec![gpu(0, 6762, &[])], vec![], vec![]);
    snap.in_child_pid_namespace = true;
    let s = analyzed(snap, &AnalyzeOptions::default());
    let r = s.finding_of(FindingKind::Residual).expect("residual");
    assert!(
        r.detail.contains("PID namespace") && r.detail.contains("outside"),
        "{}",
        r.detail
    );
    // NVML itself is blind there (the driver drops other namespaces' PIDs): another container's live memory
    // and a leak look the same, so this is no leak verdict, and the way to see is named.
    assert!(
        r.detail
            .contains("NVML lists only this namespace's processes"),
        "{}",
        r.detail
    );
    assert_eq!(r.severity, Severity::Warning, "{r:?}");
    assert!(r.action.contains("--node-serve"), "{}", r.action);
    assert_eq!(s.gpus[0].state, Some(GpuState::InUse));
}

#[test]
fn hosts_read_from_prometheus_keep_their_verdicts_and_are_never_called_leaking_on_totals() {
    let opts = AnalyzeOptions::default();
    // A serve's verdicts, carried by Prometheus: kept as they are, never judged again from totals.
    let mut g = gpu(0, 10_240, &[]);
    g.judged = Some(GpuState::Leak);
    let mut snap = host(vec![g], vec![], vec![]);
    snap.source = gpusweep_core::model::SourceKind::Prometheus;
    snap.findings = vec![Finding {
        kind: FindingKind::Zombie,
        severity: gpusweep_core::model::Severity::Warning,
        host: "h200".into(),
        gpu: None,
        pid: None,
        bytes: None,
        detail: "2 zombie finding(s)".into(),
        action: "open it live".into(),
        target_pid: None,
        gpu_instance: None,
        file: None,
        confirms_as: None,
    }];
    let snap = gpusweep_analyze::analyzed(snap, &opts);
    assert_eq!(kinds(&snap.findings), [(FindingKind::Zombie, None, None)]);
    assert_eq!(gpu_state(&snap, &snap.gpus[0], &opts), GpuState::Leak);
    assert_eq!(gpusweep_analyze::gpu_clean(&snap.gpus[0], 0), Some(false));
    // dcgm-exporter's totals alone: used memory is "in use", never a leak; nothing used is clean.
    let mut snap = host(vec![gpu(0, 700, &[]), gpu(1, 0, &[])], vec![], vec![]);
    snap.source = gpusweep_core::model::SourceKind::Prometheus;
    let snap = gpusweep_analyze::analyzed(snap, &opts);
    assert!(snap.findings.is_empty());
    assert_eq!(gpu_state(&snap, &snap.gpus[0], &opts), GpuState::InUse);
    assert_eq!(gpu_state(&snap, &snap.gpus[1], &opts), GpuState::Clean);
    // A GPU its serve could not read stays unknown: no verdict.
    let mut g = gpu(0, 0, &[]);
    g.judged = Some(GpuState::Error);
    assert_eq!(gpusweep_analyze::gpu_clean(&g, 0), None);
}

#[test]
fn a_gpu_held_only_by_what_was_there_before_counts_as_clean_for_the_job_and_a_reused_pid_does_not()
{
    // GPU 0: 10 GiB listed to pid 5, which held it before the job (start tick 1005).
    let snap = host(
        vec![gpu(0, 10_240, &[(5, 10_240)])],
        vec![proc_(5, 1, 5, 'S', "python3 other.py")],
        vec![],
    );
    let all = Scope::default();
    assert!(matches!(verdict(&snap, &all, 0, &[]), Verdict::Dirty(_)));
    assert_eq!(verdict(&snap, &all, 0, &[(5, 1005)]), Verdict::Clean);
    // The PID now names another process (another start tick): not exempt.
    assert!(matches!(
        verdict(&snap, &all, 0, &[(5, 999)]),
        Verdict::Dirty(_)
    ));
    // A second process beside it, not there before: the GPU still holds the job's.
    let mut two = snap.clone();
    two.gpus[0]
        .processes
        .push(gpusweep_core::model::ListedProcess {
            pid: 6,
            used_bytes: Some(MIB),
            ..Default::default()
        });
    two.processes.push(proc_(6, 1, 6, 'S', "python3 job.py"));
    assert!(matches!(
        verdict(&two, &all, 0, &[(5, 1005)]),
        Verdict::Dirty(_)
    ));
}

#[test]
fn a_clean_no_node_proved_is_no_clean_for_a_gate() {
    let opts = AnalyzeOptions::default();
    // dcgm-exporter's zeros, or a serve's unsealed series: labels anyone may write.
    let mut snap = host(vec![gpu(0, 0, &[]), gpu(1, 0, &[])], vec![], vec![]);
    snap.source = gpusweep_core::model::SourceKind::Prometheus;
    snap.missing_features.push(Feature::Proof);
    let snap = analyzed(snap, &opts);
    let all = Scope::default();
    match verdict(&snap, &all, 0, &[]) {
        Verdict::Unknown(why) => assert!(why.contains("--seal-key"), "{why}"),
        v => panic!("a clean on labels alone: {v:?}"),
    }
    let n = gpusweep_analyze::node::node_verdict(&snap, true);
    assert_eq!(n.gate, gpusweep_analyze::node::Gate::Unknown, "{n:?}");
    // Held stays held: what was read still says not to launch.
    let mut held = host(vec![gpu(0, 700, &[])], vec![], vec![]);
    held.source = gpusweep_core::model::SourceKind::Prometheus;
    held.missing_features.push(Feature::Proof);
    let held = analyzed(held, &opts);
    assert!(matches!(verdict(&held, &all, 0, &[]), Verdict::Dirty(_)));
    // Nor on any screen: its zeros read unknown.
    assert!(
        snap.gpus.iter().all(|g| g.state == Some(GpuState::Unknown)),
        "{:?}",
        snap.gpus
    );
    // The same reading proven is clean.
    let mut proven = host(vec![gpu(0, 0, &[]), gpu(1, 0, &[])], vec![], vec![]);
    proven.source = gpusweep_core::model::SourceKind::Prometheus;
    let proven = analyzed(proven, &opts);
    assert_eq!(verdict(&proven, &all, 0, &[]), Verdict::Clean);
}

#[test]
fn a_held_line_names_at_most_eight_pids_and_counts_the_rest() {
    let listed: Vec<(u32, u64)> = (1000..41_000).map(|p| (p, 1)).collect();
    let snap = analyzed(
        host(vec![gpu(0, 40_000, &listed)], vec![], vec![]),
        &AnalyzeOptions::default(),
    );
    let Verdict::Dirty(lines) = verdict(&snap, &Scope::default(), 0, &[]) else {
        panic!("held");
    };
    assert!(lines[0].ends_with("and 39992 more"), "{}", lines[0]);
    assert!(lines[0].len() < 200, "{}", lines[0]);
}
