use super::*;
use gpusweep_core::model::{Gpu, Holder, ListedProcess, Memory};

const S: u64 = 1000;

/// A launcher (pid 100, under bash 10) and ranks 101.. each on its own GPU, charged `mib[i]` MiB; a rank
/// whose entry is `None` is gone; `state[i]` its state letter.
fn reading(at: u64, mib: &[Option<u64>], state: &[char]) -> HostSnapshot {
    let mut s = HostSnapshot {
        host: "h".into(),
        taken_at_ms: at,
        processes: vec![
            Proc {
                pid: 10,
                ppid: 1,
                sid: 10,
                comm: "bash".into(),
                ..Default::default()
            },
            Proc {
                pid: 100,
                ppid: 10,
                comm: "torchrun".into(),
                cmdline: "torchrun --nproc-per-node 4 serve.py".into(),
                start_time: 5,
                started_at: Some(at / 1000),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    for (i, m) in mib.iter().enumerate() {
        let idx = u32::try_from(i).unwrap_or(0);
        let pid = 101 + idx;
        let mut g = Gpu {
            index: idx,
            memory: Memory {
                used: Some(m.unwrap_or(0) * MIB),
                total: Some(141 * GIB),
                reserved: None,
            },
            ..Default::default()
        };
        if let Some(m) = m {
            let st = state.get(i).copied().unwrap_or('S');
            g.processes.push(ListedProcess {
                pid,
                used_bytes: Some(m * MIB),
                ..Default::default()
            });
            s.processes.push(Proc {
                pid,
                ppid: 100,
                comm: "python3".into(),
                cmdline: format!("python3 serve.py --rank {i}"),
                start_time: 6,
                started_at: Some(at / 1000),
                state: ProcState::from_char(st),
                ..Default::default()
            });
            if st != 'Z' {
                s.holders.push(Holder {
                    pid,
                    gpus: vec![idx],
                    ..Default::default()
                });
            }
        }
        s.gpus.push(g);
    }
    s
}

/// Whether a report names `pid` lost, and how.
fn lost_as(r: &JobReport, pid: u32, how: LostHow) -> bool {
    r.lost.iter().any(|l| l.pid == pid && l.how == how)
}

fn opts() -> JobOptions {
    JobOptions {
        settle_ms: 10 * S,
        straggle_ms: 5 * S,
        stuck_ms: 5 * S,
        hang_ms: 60 * S,
    }
}

#[test]
fn ranks_of_one_launcher_are_one_job_named_by_its_launcher() {
    let mut b = JobBook::new(opts());
    let seen = b.observe(&reading(0, &[Some(0); 4], &[]), 0);
    assert_eq!(seen.reports.len(), 1, "{:?}", seen.reports);
    let j = &seen.reports[0];
    assert_eq!(j.id, "tree:100");
    assert_eq!(j.launcher, Some(100));
    assert!(j.name.contains("torchrun"), "{}", j.name);
    assert_eq!(j.ranks.len(), 4);
    assert_eq!(j.gpus, [0, 1, 2, 3]);
    assert_eq!(j.phase, Phase::Starting);
    assert!(matches!(
        &seen.changes[..],
        [JobChange::Started { ranks: 4, .. }]
    ));
}

#[test]
fn a_warm_up_goes_starting_loading_settled_with_its_duration() {
    let mut b = JobBook::new(opts());
    let mut phases = Vec::new();
    let mut t = 0;
    // Starting, then memory rising for 30 s, then flat.
    for step in 0..=60 {
        t = step * S;
        let mib = if step < 5 {
            0
        } else {
            (step.min(35) - 4) * 2048
        };
        let seen = b.observe(&reading(0, &[Some(mib); 4], &[]), t);
        for c in seen.changes {
            if let JobChange::Phase {
                phase, warmup_ms, ..
            } = c
            {
                phases.push((phase, warmup_ms, t));
            }
        }
    }
    assert_eq!(
        phases,
        [
            (Phase::Loading, None, 5 * S),
            // Memory last rose at 35 s; flat for the 10 s window: settled at 45 s, warm-up 35 s.
            (Phase::Settled, Some(35 * S), 45 * S)
        ]
    );
    let seen = b.observe(&reading(0, &[Some(31 * 2048); 4], &[]), t);
    let j = &seen.reports[0];
    assert_eq!(j.phase, Phase::Settled);
    assert_eq!(
        j.phase_since_ms,
        35 * S,
        "settled since memory stopped rising"
    );
    assert_eq!(j.settled_bytes, Some(4 * 31 * 2048 * MIB));
    assert!(!b.due(u64::MAX), "a settled job waits on no clock");
}

/// Seen on a real H200: ranks starting CUDA hold their GPU a moment before NVML lists them. Unlisted, they
/// are charged nothing yet: the job is starting, not "memory unreadable".
#[test]
fn ranks_holding_their_gpus_before_nvml_lists_them_are_starting_then_loading() {
    let mut b = JobBook::new(opts());
    let mut r = reading(0, &[Some(0); 4], &[]);
    for g in &mut r.gpus {
        g.processes.clear();
    }
    let seen = b.observe(&r, 0);
    assert_eq!(seen.reports[0].phase, Phase::Starting);
    assert_eq!(seen.reports[0].ranks.len(), 4);
    let seen = b.observe(&reading(0, &[Some(500); 4], &[]), S);
    assert_eq!(seen.reports[0].phase, Phase::Loading);
    // Listed with bytes NVML could not read: that is unknown.
    let mut b = JobBook::new(opts());
    let mut r = reading(0, &[Some(0); 4], &[]);
    for g in &mut r.gpus {
        g.processes[0].used_bytes = None;
    }
    assert_eq!(b.observe(&r, 0).reports[0].phase, Phase::Unknown);
}

#[test]
fn a_job_first_seen_long_after_its_start_is_holding_not_loading() {
    let mut b = JobBook::new(opts());
    let mut r = reading(0, &[Some(4096); 2], &[]);
    let seen = b.observe(&r, 100 * S);
    assert_eq!(seen.reports[0].phase, Phase::Holding);
    r.taken_at_ms = 111 * S;
    let seen = b.observe(&r, 111 * S);
    assert_eq!(seen.reports[0].phase, Phase::Settled);
    assert_eq!(seen.reports[0].warmup_ms, None, "its warm-up was not seen");
}

/// A reading that says the same is seen again only when a clock of the book runs out, not at every reading:
/// ten thousand quiet hosts' `unchanged` readings cost no job analysis each.
#[test]
fn the_book_is_due_again_only_when_one_of_its_clocks_runs_out() {
    let mut b = JobBook::new(opts());
    let r = reading(0, &[Some(4096); 2], &[]);
    // First seen long after its start: holding, settled 10 s after memory was last seen rising.
    b.observe(&r, 100 * S);
    assert!(!b.due(100 * S + 1) && !b.due(109 * S));
    assert!(b.due(110 * S));
    b.observe(&r, 110 * S);
    assert!(!b.due(u64::MAX), "settled: no clock left");
    // A rank lagging while loading: due when it would become a straggler, and not again once it is one.
    let mut b = JobBook::new(opts());
    b.observe(&reading(0, &[Some(0); 4], &[]), 0);
    b.observe(
        &reading(0, &[Some(8192), Some(8192), Some(8192), Some(100)], &[]),
        S,
    );
    assert!(
        !b.due(5 * S) && b.due(6 * S),
        "a straggler 5 s after it lagged"
    );
    let seen = b.observe(
        &reading(0, &[Some(8192), Some(8192), Some(8192), Some(100)], &[]),
        6 * S,
    );
    assert!(
        seen.reports[0].ranks.iter().any(|r| r.straggler),
        "{:?}",
        seen.reports[0]
    );
    assert!(!b.due(7 * S), "the straggler is named: its clock ran out");
    assert!(
        !b.due(10 * S) && b.due(11 * S),
        "settled 10 s after the last rise"
    );
}

#[test]
fn a_rank_that_exits_while_the_others_hold_memory_is_lost_within_one_reading() {
    let mut b = JobBook::new(opts());
    b.observe(&reading(0, &[Some(0); 4], &[]), 0);
    b.observe(&reading(0, &[Some(8192); 4], &[]), S);
    let seen = b.observe(
        &reading(0, &[Some(8192), Some(8192), Some(8192), None], &[]),
        2 * S,
    );
    let j = &seen.reports[0];
    assert_eq!(j.phase, Phase::LostRank);
    assert_eq!(j.lost.len(), 1);
    assert_eq!(j.lost[0].pid, 104);
    assert_eq!(j.lost[0].how, LostHow::Exited);
    assert_eq!(j.lost[0].gpus, [3]);
    assert!(
        matches!(
            &seen.changes[..],
            [JobChange::RankLost { left: 3, left_bytes: Some(b), .. }, JobChange::Phase { phase: Phase::LostRank, .. }]
                if *b == 3 * 8192 * MIB
        ),
        "{:?}",
        seen.changes
    );
    let f: Vec<_> = seen
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::LostRank)
        .collect();
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].pid, Some(104));
    assert_eq!(f[0].gpu, Some(3));
    assert!(
        f[0].detail.contains("exited") && f[0].detail.contains("24.0 GiB"),
        "{}",
        f[0].detail
    );
    assert!(
        f[0].action.contains("sweep --job tree:100"),
        "{}",
        f[0].action
    );
    // It stays named until the job ends; then the job is over, with no finding left.
    let seen = b.observe(
        &reading(0, &[Some(8192), Some(8192), Some(8192), None], &[]),
        3 * S,
    );
    assert_eq!(seen.findings.len(), 1);
    assert!(seen.changes.is_empty());
    let seen = b.observe(&reading(0, &[None; 4], &[]), 4 * S);
    assert!(seen.reports.is_empty() && seen.findings.is_empty());
    assert!(matches!(&seen.changes[..], [JobChange::Ended { .. }]));
}

#[test]
fn a_zombie_rank_is_lost_and_a_rank_in_d_only_past_the_window() {
    let mut b = JobBook::new(opts());
    b.observe(&reading(0, &[Some(8192); 3], &[]), 0);
    let seen = b.observe(&reading(0, &[Some(8192); 3], &['S', 'Z', 'S']), S);
    // It exited; a zombie a moment, until its launcher reaps it, is no news.
    assert!(
        lost_as(&seen.reports[0], 102, LostHow::Exited),
        "{:?}",
        seen.reports[0]
    );
    // Not reaped past the window: said so.
    let seen = b.observe(&reading(0, &[Some(8192); 3], &['S', 'Z', 'S']), 7 * S);
    assert!(
        lost_as(&seen.reports[0], 102, LostHow::Zombie),
        "{:?}",
        seen.reports[0]
    );
    // Stopped (SIGSTOP, a debugger) past the window hangs the collective too.
    let mut b = JobBook::new(opts());
    b.observe(&reading(0, &[Some(8192); 3], &[]), 0);
    let seen = b.observe(&reading(0, &[Some(8192); 3], &['S', 'T', 'S']), S);
    assert!(seen.reports[0].lost.is_empty());
    let seen = b.observe(&reading(0, &[Some(8192); 3], &['S', 'T', 'S']), 7 * S);
    assert!(
        lost_as(&seen.reports[0], 102, LostHow::Stopped),
        "{:?}",
        seen.reports[0]
    );
    let mut b = JobBook::new(opts());
    b.observe(&reading(0, &[Some(8192); 3], &[]), 0);
    // Loading weights passes through D: not lost at once.
    let seen = b.observe(&reading(0, &[Some(8192); 3], &['D']), S);
    assert!(seen.reports[0].lost.is_empty());
    // Its clock runs out 5 s after it was first seen in D, not before.
    assert!(!b.due(5 * S) && b.due(6 * S));
    let seen = b.observe(&reading(0, &[Some(8192); 3], &['D']), 7 * S);
    assert_eq!(seen.reports[0].lost.len(), 1, "{:?}", seen.reports[0]);
    assert_eq!(seen.reports[0].lost[0].how, LostHow::StuckD);
}

/// A rank SIGKILLed and not reaped by its launcher: a zombie that NVML no longer lists and that holds no
/// device file, so no member of the job any more, yet still in /proc. It is lost, not "let go of its GPU"
/// (as seen on an H100: `gpusweep run --fail-fast` waited on with the other ranks holding 21 GiB).
#[test]
fn a_killed_rank_left_a_zombie_off_the_gpu_is_lost() {
    let mut b = JobBook::new(opts());
    b.observe(&reading(0, &[Some(8192); 3], &[]), 0);
    let mut r = reading(0, &[Some(8192); 3], &['S', 'Z', 'S']);
    r.gpus[1].processes.clear();
    r.gpus[1].memory.used = Some(0);
    let seen = b.observe(&r, S);
    assert_eq!(
        seen.reports[0].phase,
        Phase::LostRank,
        "{:?}",
        seen.reports[0]
    );
    assert!(
        lost_as(&seen.reports[0], 102, LostHow::Exited),
        "{:?}",
        seen.reports[0]
    );
}

/// A rank SIGKILLed and read while it exits: its files closed (no device file, NVML no longer lists it) while
/// the driver frees its memory, so no member of the job, yet in /proc and not a zombie yet. It is lost, not
/// "let go of its GPU" (seen on an H100: a rank killed mid-warm-up read in that window, and never named).
#[test]
fn a_killed_rank_read_while_it_exits_is_lost() {
    let mut b = JobBook::new(opts());
    b.observe(&reading(0, &[Some(8192); 3], &[]), 0);
    let mut r = reading(0, &[Some(8192); 3], &['S', 'R', 'S']);
    r.gpus[1].processes.clear();
    r.holders.retain(|h| h.pid != 102);
    for p in r.processes.iter_mut().filter(|p| p.pid == 102) {
        p.exiting = true;
    }
    let seen = b.observe(&r, S);
    assert!(
        lost_as(&seen.reports[0], 102, LostHow::Exited),
        "{:?}",
        seen.reports[0]
    );
    // Gone the reading after: said once.
    let seen = b.observe(&reading(0, &[Some(8192), None, Some(8192)], &[]), 2 * S);
    assert_eq!(seen.reports[0].lost.len(), 1, "{:?}", seen.reports[0]);
}

#[test]
fn the_whole_job_ending_at_once_loses_no_rank() {
    let mut b = JobBook::new(opts());
    b.observe(&reading(0, &[Some(8192); 4], &[]), 0);
    // All ranks gone, or those left hold nothing: an end, not a lost rank.
    let seen = b.observe(&reading(0, &[Some(0), None, None, None], &[]), S);
    assert!(seen.findings.is_empty(), "{:?}", seen.findings);
    assert!(seen.reports[0].lost.is_empty());
}

#[test]
fn a_rank_far_behind_its_peers_while_loading_is_a_straggler_after_the_window() {
    let mut b = JobBook::new(opts());
    b.observe(&reading(0, &[Some(0); 4], &[]), 0);
    let mut last = JobsSeen::default();
    for step in 1..=8 {
        let peers = step * 4096;
        let slow = step * 1024;
        last = b.observe(
            &reading(0, &[Some(peers), Some(peers), Some(slow), Some(peers)], &[]),
            step * S,
        );
        if step < 6 {
            assert!(last.findings.is_empty(), "step {step}: {:?}", last.findings);
        }
    }
    let f: Vec<_> = last
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::Straggler)
        .collect();
    assert_eq!(f.len(), 1, "{:?}", last.findings);
    assert_eq!(f[0].pid, Some(103));
    assert_eq!(f[0].gpu, Some(2));
    assert!(
        last.reports[0]
            .ranks
            .iter()
            .any(|r| r.pid == 103 && r.straggler)
    );
}

#[test]
fn slurm_steps_are_one_job_and_a_parent_cycle_ends_the_walk() {
    let mut r = reading(0, &[Some(1024); 2], &[]);
    for p in &mut r.processes {
        if p.pid > 100 {
            p.job = Some(Job::Slurm {
                job: 4711,
                step: Some(p.pid.to_string()),
            });
        }
    }
    // A reading from elsewhere may loop its parents.
    r.processes[1].ppid = 101;
    let mut b = JobBook::new(opts());
    let seen = b.observe(&r, 0);
    assert_eq!(seen.reports.len(), 1, "{:?}", seen.reports);
    assert_eq!(seen.reports[0].id, "slurm:4711");
    assert_eq!(
        seen.reports[0].job,
        Some(Job::Slurm {
            job: 4711,
            step: None
        })
    );
}

#[test]
fn a_script_shell_is_a_launcher_and_an_interactive_one_is_not() {
    let mut r = reading(0, &[Some(1024); 2], &[]);
    // `bash launch.sh` (not its session's leader) started the ranks directly.
    for p in &mut r.processes {
        if p.pid > 100 {
            p.ppid = 50;
        }
    }
    r.processes.push(Proc {
        pid: 50,
        ppid: 10,
        sid: 10,
        comm: "bash".into(),
        cmdline: "bash launch.sh".into(),
        ..Default::default()
    });
    let mut b = JobBook::new(opts());
    let seen = b.observe(&r, 0);
    assert_eq!(seen.reports.len(), 1, "{:?}", seen.reports);
    assert_eq!(seen.reports[0].id, "tree:50");
    assert!(seen.reports[0].name.contains("launch.sh"));
}

/// A lost rank is named by the command line it last had (a process may rewrite its own), made printable.
#[test]
fn a_lost_rank_is_named_by_its_last_command_line_made_printable() {
    let retitled = |at: u64, title: &str| {
        let mut s = reading(at, &[Some(8192); 2], &[]);
        if let Some(p) = s.processes.iter_mut().find(|p| p.pid == 102) {
            p.cmdline = title.to_string();
        }
        s
    };
    for (titles, want) in [
        (["python3 serve.py", "worker 1 loading"], "worker 1 loading"),
        (["worker\x1b[2J", "worker\x1b[2J"], "worker\\x1b[2J"),
        (["worker 1", "worker\x1b[2J"], "worker\\x1b[2J"),
        (["worker\x1b[2J", "worker\\x1b[2J"], "worker\\x1b[2J"),
    ] {
        let mut b = JobBook::new(opts());
        b.observe(&retitled(0, titles[0]), 0);
        b.observe(&retitled(0, titles[1]), S);
        let seen = b.observe(&reading(0, &[Some(8192), None], &[]), 2 * S);
        let lost = &seen.reports[0].lost;
        assert_eq!(lost.len(), 1, "{titles:?}");
        assert_eq!(lost[0].cmdline, want, "{titles:?}");
    }
}

/// `r` with its launcher (pid 100) gone: its ranks reparented to PID 1, in the process group it led.
fn launcher_killed(mut r: HostSnapshot) -> HostSnapshot {
    r.processes.retain(|p| p.pid != 100);
    for p in &mut r.processes {
        if p.ppid == 100 {
            p.ppid = 1;
            p.pgid = Some(100);
        }
    }
    r
}

#[test]
fn a_job_whose_launcher_died_stays_one_job_and_keeps_its_lost_rank() {
    let mut b = JobBook::new(opts());
    b.observe(&reading(0, &[Some(4096); 4], &[]), 0);
    b.observe(&reading(0, &[Some(8192); 4], &[]), S);
    // Rank 3 dies mid-warm-up; then the launcher is killed (the ritual): the others are reparented.
    let seen = b.observe(
        &launcher_killed(reading(0, &[Some(8192), Some(8192), Some(8192), None], &[])),
        2 * S,
    );
    assert_eq!(seen.reports.len(), 1, "one job: {:?}", seen.reports);
    let j = &seen.reports[0];
    assert_eq!(j.id, "tree:100");
    assert_eq!(j.launcher_gone_ms, Some(2 * S));
    assert_eq!(j.ranks.len(), 3);
    assert_eq!(j.phase, Phase::LostRank);
    assert!(j.lost.iter().any(|l| l.pid == 104), "{j:?}");
    assert!(
        seen.findings
            .iter()
            .any(|f| f.kind == FindingKind::LostRank && f.detail.contains("its 3 other rank(s)")),
        "{:?}",
        seen.findings
    );
    // Still one job, its lost rank still named, while the others hold memory.
    let seen = b.observe(
        &launcher_killed(reading(0, &[Some(8192), Some(8192), Some(8192), None], &[])),
        3 * S,
    );
    assert_eq!(seen.reports.len(), 1);
    assert!(seen.reports[0].lost.iter().any(|l| l.pid == 104));
}

#[test]
fn ranks_read_first_after_their_launcher_died_are_one_job_by_their_process_group() {
    let mut b = JobBook::new(opts());
    let seen = b.observe(&launcher_killed(reading(0, &[Some(8192); 4], &[])), 0);
    assert_eq!(seen.reports.len(), 1, "{:?}", seen.reports);
    assert_eq!(seen.reports[0].id, "tree:100");
    assert_eq!(seen.reports[0].ranks.len(), 4);
    assert_eq!(seen.reports[0].launcher_gone_ms, Some(0));
}

/// `r` with a data-loader that rank 3 (pid 103) forked after opening GPU 2, and a sidecar of the launcher that
/// opens GPU 3: neither is listed by NVML.
fn with_helpers(mut r: HostSnapshot) -> HostSnapshot {
    for (pid, ppid, gpu) in [(201, 103, 2), (202, 100, 3)] {
        r.processes.push(Proc {
            pid,
            ppid,
            comm: "python3".into(),
            cmdline: format!("python3 helper-{pid}"),
            start_time: 7,
            ..Default::default()
        });
        r.holders.push(Holder {
            pid,
            gpus: vec![gpu],
            ..Default::default()
        });
    }
    r
}

#[test]
fn helpers_are_the_jobs_but_no_ranks_and_a_straggler_is_named_beside_them() {
    let mut b = JobBook::new(opts());
    let mut straggler = None;
    for step in 1..=12 {
        let mib = |full: u64| Some(full * step);
        let r = with_helpers(reading(
            0,
            &[mib(1024), mib(4096), mib(4096), mib(4096)],
            &[],
        ));
        let seen = b.observe(&r, step * S);
        let j = &seen.reports[0];
        assert_eq!(seen.reports.len(), 1, "{:?}", seen.reports);
        assert_eq!(j.ranks.len(), 4, "{j:?}");
        let helpers: Vec<u32> = j.helpers.iter().map(|h| h.pid).collect();
        assert_eq!(helpers, [201, 202]);
        if let Some(r) = j.ranks.iter().find(|r| r.straggler) {
            straggler = Some(r.pid);
        }
    }
    assert_eq!(
        straggler,
        Some(101),
        "rank 0 loads at a quarter of its peers' pace"
    );
    // A helper's exit is no lost rank.
    let mut r = with_helpers(reading(
        0,
        &[Some(12_288), Some(49_152), Some(49_152), Some(49_152)],
        &[],
    ));
    r.processes.retain(|p| p.pid != 201);
    r.holders.retain(|h| h.pid != 201);
    let seen = b.observe(&r, 13 * S);
    assert!(seen.reports[0].lost.is_empty(), "{:?}", seen.reports[0]);
}

/// On an H100 the ranks' first charge was their CUDA context, 14 MiB, below what counts as a rise: a job seen
/// starting with nothing charged that then holds a little has begun loading (its rise from zero was seen),
/// and its warm-up is told, not "holding, not seen rising".
#[test]
fn a_job_seen_starting_that_then_holds_a_context_is_loading() {
    let mut b = JobBook::new(opts());
    assert_eq!(
        b.observe(&reading(0, &[Some(0); 4], &[]), 0).reports[0].phase,
        Phase::Starting
    );
    let seen = b.observe(&reading(S, &[Some(14); 4], &[]), S);
    assert_eq!(seen.reports[0].phase, Phase::Loading);
}

/// On an H100 (gpu-jobs.sh scene 2): the job was first seen starting with only its sidecar holding a GPU, then
/// four ranks loading beside their helpers, then rank 2 SIGKILLed (a zombie its launcher had not reaped, off the
/// GPU, then gone). Its loss must be told.
#[test]
fn a_rank_killed_while_loading_beside_helpers_is_lost() {
    let mut b = JobBook::new(opts());
    let mut first = reading(S, &[None; 4], &[]);
    first.processes.push(Proc {
        pid: 202,
        ppid: 100,
        comm: "python3".into(),
        cmdline: "python3 sidecar".into(),
        start_time: 7,
        ..Default::default()
    });
    first.holders.push(Holder {
        pid: 202,
        gpus: vec![3],
        ..Default::default()
    });
    assert_eq!(b.observe(&first, S).reports[0].phase, Phase::Starting);
    for step in 2..=3 {
        let seen = b.observe(
            &with_helpers(reading(step * S, &[Some(1024 * step); 4], &[])),
            step * S,
        );
        assert_eq!(seen.reports[0].ranks.len(), 4, "{:?}", seen.reports[0]);
    }
    // Rank 2 (pid 103) killed: a zombie, off the GPU; its child helper 201 reparented.
    let mut killed = with_helpers(reading(
        4 * S,
        &[Some(4096), Some(4096), None, Some(4096)],
        &[],
    ));
    killed.processes.push(Proc {
        pid: 103,
        ppid: 100,
        comm: "python3".into(),
        cmdline: "python3 serve.py --rank 2".into(),
        start_time: 6,
        state: ProcState::from_char('Z'),
        ..Default::default()
    });
    let mut b2 = JobBook::new(opts());
    let seen = b.observe(&killed, 4 * S);
    assert_eq!(
        seen.reports[0]
            .lost
            .iter()
            .map(|l| l.pid)
            .collect::<Vec<_>>(),
        [103],
        "{:?}",
        seen.reports[0]
    );
    // The same, the launcher gone in the same reading (the zombie reaped by whoever took it).
    b2.observe(&first, S);
    for step in 2..=3 {
        b2.observe(
            &with_helpers(reading(step * S, &[Some(1024 * step); 4], &[])),
            step * S,
        );
    }
    let gone = launcher_killed(with_helpers(reading(
        4 * S,
        &[Some(4096), Some(4096), None, Some(4096)],
        &[],
    )));
    let seen = b2.observe(&gone, 4 * S);
    assert_eq!(
        seen.reports[0]
            .lost
            .iter()
            .map(|l| l.pid)
            .collect::<Vec<_>>(),
        [103],
        "{:?}",
        seen.reports
    );
}

/// A rank gone in the one reading where the others' memory read as nothing held (NVML's listing caught while
/// a context changes): its loss is told once the others are seen holding again, not forgotten.
#[test]
fn a_rank_gone_while_the_others_read_empty_is_lost_when_they_read_again() {
    let mut b = JobBook::new(opts());
    b.observe(&reading(0, &[Some(0); 4], &[]), 0);
    b.observe(&reading(S, &[Some(8192); 4], &[]), S);
    let blink = b.observe(
        &reading(2 * S, &[Some(0), Some(0), Some(0), None], &[]),
        2 * S,
    );
    assert!(
        blink.reports[0].lost.is_empty(),
        "not yet: {:?}",
        blink.reports[0]
    );
    let seen = b.observe(
        &reading(3 * S, &[Some(8192), Some(8192), Some(8192), None], &[]),
        3 * S,
    );
    assert_eq!(
        seen.reports[0]
            .lost
            .iter()
            .map(|l| l.pid)
            .collect::<Vec<_>>(),
        [104],
        "{:?}",
        seen.reports[0]
    );
    // The whole job ending after such a blink loses no rank.
    let mut b = JobBook::new(opts());
    b.observe(&reading(0, &[Some(0); 4], &[]), 0);
    b.observe(&reading(S, &[Some(8192); 4], &[]), S);
    b.observe(
        &reading(2 * S, &[Some(0), Some(0), Some(0), None], &[]),
        2 * S,
    );
    let ended = b.observe(&reading(3 * S, &[None; 4], &[]), 3 * S);
    assert!(
        ended.reports.iter().all(|r| r.lost.is_empty()),
        "{:?}",
        ended.reports
    );
}

/// On an H100 (gpu-jobs.sh scene 1, 1 run in 12): `gpusweep run` read the host before it started the job;
/// the ranks imported torch for longer than the settle window and were first seen with their CUDA contexts
/// charged (14 MiB). A job that began while the book watched rose while it watched: it is loading and its
/// warm-up is told, never "holding, not seen rising".
#[test]
fn a_job_begun_while_watched_and_first_seen_charged_is_loading() {
    let mut b = JobBook::new(opts());
    let before = HostSnapshot {
        host: "h".into(),
        ..Default::default()
    };
    // Watched from 1.6 s; the job began 0.3 s later (its processes' start known to the second: 1 s).
    assert!(b.observe(&before, 1600).reports.is_empty());
    let seen = b.observe(&reading(S, &[Some(14); 4], &[]), 20 * S);
    assert_eq!(seen.reports[0].phase, Phase::Loading);
    // Flat for the settle window: settled, with the warm-up it was seen to have.
    let seen = b.observe(&reading(S, &[Some(14); 4], &[]), 31 * S);
    assert_eq!(seen.reports[0].phase, Phase::Settled);
    assert!(seen.reports[0].warmup_ms.is_some(), "{:?}", seen.reports[0]);
}

/// The ranks of `reading` owned by `uid`.
fn owned(mut r: HostSnapshot, uid: u32) -> HostSnapshot {
    for p in &mut r.processes {
        p.uid = Some(uid);
    }
    r
}

#[test]
fn a_rank_another_gpusweep_noted_it_ended_is_no_loss_where_its_owner_or_root_noted_it() {
    let act = |by_uid| gpusweep_core::acts::Act {
        pid: 104,
        start_time: 6,
        by_uid,
        at_ms: 2 * S,
    };
    let gone = [Some(8192), Some(8192), Some(8192), None];
    for (by, lost) in [(1000, false), (0, false), (1001, true)] {
        let mut b = JobBook::new(opts());
        b.observe(&owned(reading(0, &[Some(8192); 4], &[]), 1000), S);
        let mut r = owned(reading(0, &gone, &[]), 1000);
        r.acts = vec![act(by)];
        let seen = b.observe(&r, 2 * S);
        assert_eq!(
            seen.reports[0].lost.iter().any(|l| l.pid == 104),
            lost,
            "noted by uid {by}: {:?}",
            seen.reports[0].lost
        );
        assert_eq!(
            seen.changes
                .iter()
                .any(|c| matches!(c, JobChange::RankLost { .. })),
            lost
        );
    }
    // A note of another process of that PID (another start time) explains nothing.
    let mut b = JobBook::new(opts());
    b.observe(&owned(reading(0, &[Some(8192); 4], &[]), 1000), S);
    let mut r = owned(reading(0, &gone, &[]), 1000);
    r.acts = vec![gpusweep_core::acts::Act {
        start_time: 99,
        ..act(1000)
    }];
    assert_eq!(b.observe(&r, 2 * S).reports[0].lost.len(), 1);
}

/// What a GPU does: utilization, and GPM's SM, tensor and DRAM ratios (`None`: a GPU without GPM).
type Doing = (u32, Option<(f64, f64, f64)>);

/// What each GPU of a reading does: `(utilization, GPM's SM, tensor, DRAM ratios)`, `None` ratios for a GPU
/// without GPM; power 110 W each.
fn doing(mut r: HostSnapshot, what: &[Doing]) -> HostSnapshot {
    for (g, (util, ratios)) in r.gpus.iter_mut().zip(what) {
        g.utilization = Some(*util);
        g.power_mw = Some(110_000);
        g.counters = ratios.map(|(sm, tensor, dram)| {
            Box::new(gpusweep_core::model::Counters {
                gr_engine_active: Some(sm),
                tensor_active: Some(tensor),
                dram_active: Some(dram),
                ..Default::default()
            })
        });
    }
    r
}

const SPIN: Doing = (100, Some((0.006, 0.0, 0.0)));
const MATMUL: Doing = (81, Some((0.79, 0.77, 0.2)));
const COPY: Doing = (82, Some((0.76, 0.0, 0.66)));
const IDLE: Doing = (0, Some((0.0, 0.0, 0.0)));

/// A book whose four-rank job settled at 8 GiB a rank by 20 s (settle window 10 s), and that time.
fn settled() -> (JobBook, u64) {
    let mut b = JobBook::new(opts());
    for step in 0..=20 {
        let mib = if step < 5 { 0 } else { 8192 };
        b.observe(&reading(0, &[Some(mib); 4], &[]), step * S);
    }
    (b, 20 * S)
}

/// The phase each reading of `what` (all GPUs doing it, but rank 4's GPU doing `last`; the ranks in the
/// states `states`) says, every 10 s for `for_s` seconds after the job settled.
fn phases_while(what: Doing, last: Doing, states: &[char], for_s: u64) -> Vec<JobReport> {
    let (mut b, t0) = settled();
    let mut out = Vec::new();
    for k in 1..=for_s / 10 {
        let r = doing(
            reading(0, &[Some(8192); 4], states),
            &[what, what, what, last],
        );
        out.push(b.observe(&r, t0 + k * 10 * S).reports.remove(0));
    }
    out
}

#[test]
fn ranks_spinning_for_the_window_are_hung_and_the_rank_they_wait_for_is_named() {
    let seen = phases_while(SPIN, IDLE, &[], 90);
    // Spinning from 30 s; the window is 60 s: hung from the reading at 90 s, said since 30 s.
    let first_hung = seen
        .iter()
        .position(|j| j.phase == Phase::Hung)
        .expect("hung");
    assert_eq!(
        first_hung,
        6,
        "{:?}",
        seen.iter().map(|j| j.phase).collect::<Vec<_>>()
    );
    let j = &seen[first_hung];
    assert_eq!(
        j.waiting_on,
        [104],
        "the idle rank is the one the others wait for"
    );
    assert_eq!(j.phase_since_ms, 30 * S);
    let why = j.phase_why.as_deref().unwrap_or("");
    assert!(
        why.contains("GPU 0-2 busy 100% at 330 W, SM 0.6%, tensor 0.0%, DRAM 0.0%"),
        "{why}"
    );
    assert!(
        gpusweep_core::format::phase_line(&HostSnapshot::default(), j).contains("waiting on 104")
    );
    // A rank in D is named just the same.
    let (mut b, t0) = settled();
    for k in 1..=8 {
        let r = doing(
            reading(0, &[Some(8192); 4], &['S', 'S', 'D', 'S']),
            &[SPIN, SPIN, SPIN, SPIN],
        );
        let j = b.observe(&r, t0 + k * 10 * S).reports.remove(0);
        if k == 8 {
            assert_eq!(
                j.phase,
                Phase::LostRank,
                "in D past the stuck window: lost, not hung"
            );
        }
    }
}

#[test]
fn work_an_idle_server_or_a_pause_is_never_hung() {
    for (what, last, states, name) in [
        (MATMUL, MATMUL, &[][..], "a training loop"),
        (IDLE, IDLE, &[], "a settled server waiting for requests"),
        (COPY, COPY, &[], "a memory-bound copy loop"),
        (
            IDLE,
            SPIN,
            &['R', 'R', 'R', 'S'][..],
            "three ranks compiling on the CPU while one waits",
        ),
        (
            SPIN,
            MATMUL,
            &[],
            "three waiting on a rank that computes (an evaluation step)",
        ),
    ] {
        let seen = phases_while(what, last, states, 300);
        assert!(
            seen.iter().all(|j| j.phase == Phase::Settled),
            "{name}: {:?}",
            seen.iter().map(|j| j.phase).collect::<Vec<_>>()
        );
    }
    // A pause of two minutes (the GPUs idle while the CPU works) between spells of spinning shorter than the
    // window: the clock starts again after each.
    let (mut b, t0) = settled();
    for k in 1..=30u64 {
        let what = if (k / 4) % 2 == 0 { SPIN } else { IDLE };
        let r = doing(reading(0, &[Some(8192); 4], &[]), &[what; 4]);
        assert_ne!(
            b.observe(&r, t0 + k * 10 * S).reports[0].phase,
            Phase::Hung,
            "at {k}"
        );
    }
}

#[test]
fn a_busy_job_on_gpus_without_activity_counters_is_unknown_said_why() {
    let seen = phases_while((100, None), (100, None), &[], 30);
    assert!(seen.iter().all(|j| j.phase == Phase::Unknown), "{seen:?}");
    let why = seen[0].phase_why.as_deref().unwrap_or("");
    assert!(why.contains("cannot be told"), "{why}");
    // A first GPM sample (no ratios yet) is no blind spot: the job stays settled.
    let (mut b, t0) = settled();
    let mut r = doing(reading(0, &[Some(8192); 4], &[]), &[SPIN; 4]);
    for g in &mut r.gpus {
        g.counters = Some(Box::default());
    }
    assert_eq!(b.observe(&r, t0 + S).reports[0].phase, Phase::Settled);
    // While loading (2 GiB more a rank each second, for longer than the window), spinning is no hang.
    let mut b = JobBook::new(opts());
    for step in 0..=90u64 {
        let r = doing(reading(0, &[Some(2048 * (step + 1)); 4], &[]), &[SPIN; 4]);
        assert_eq!(
            b.observe(&r, step * S).reports[0].phase,
            Phase::Loading,
            "at {step} s"
        );
    }
}
