//! Analysis of one reading as the number of GPU holders grows: a node with thousands of processes that
//! hold a GPU (data loaders forked per rank, an MPS server's clients) must cost time linear in them.
//!
//! `cargo bench --bench analyze`: 1,000 and 10,000 holders side by side; the ratio of the two is what
//! matters (about 10 when linear, about 100 when quadratic). `jobs_*`: the ledger's job book on the same
//! readings; `jobs_warming_host`: the book on one warming demo host's reading.

// In tests a panic is the failure message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use gpusweep::analyze::{AnalyzeOptions, analyzed};
use gpusweep::core::model::{
    Gpu, Holder, HostSnapshot, ListedProcess, MIB, Memory, Proc, ProcState,
};

/// A host of 8 GPUs with `n` holders: each holds one GPU, a third are listed with memory, some are orphans
/// (parent 1), some zombies' parents.
fn host(n: u32) -> HostSnapshot {
    let mut snap = HostSnapshot {
        host: "big".into(),
        driver_version: Some("580.1".into()),
        ..Default::default()
    };
    for g in 0..8u32 {
        snap.gpus.push(Gpu {
            index: g,
            minor: Some(g),
            memory: Memory {
                used: Some(u64::from(n) * MIB),
                total: Some(141 * 1024 * MIB),
                reserved: Some(616 * MIB),
            },
            ..Default::default()
        });
    }
    for i in 0..n {
        let pid = 1000 + i;
        let g = i % 8;
        snap.processes.push(Proc {
            pid,
            ppid: if i % 5 == 0 { 1 } else { 999 },
            sid: 999,
            state: if i % 97 == 0 {
                ProcState::Zombie
            } else {
                ProcState::Sleeping
            },
            start_time: u64::from(pid),
            comm: "python3".into(),
            cmdline: format!("python3 worker.py --rank {i}"),
            ..Default::default()
        });
        snap.holders.push(Holder {
            pid,
            gpus: vec![g],
            devices: vec![format!("/dev/nvidia{g}")],
            fd_count: 1,
            benign: false,
            kept: false,
            declared: false,
        });
        if i % 3 == 0 {
            snap.gpus[g as usize].processes.push(ListedProcess {
                pid,
                used_bytes: Some(MIB),
                ..Default::default()
            });
        }
    }
    snap.zombies = snap
        .processes
        .iter()
        .filter(|p| p.state == ProcState::Zombie)
        .map(|p| p.pid)
        .collect();
    snap
}

fn bench(c: &mut Criterion) {
    for n in [1_000, 10_000] {
        let snap = host(n);
        c.bench_function(&format!("analyze_{n}_holders"), |b| {
            b.iter(|| analyzed(snap.clone(), &AnalyzeOptions::default()));
        });
        // The ledger's job book on the same reading, seen again (its jobs known): what each reading adds.
        let judged = analyzed(snap.clone(), &AnalyzeOptions::default());
        let mut book =
            gpusweep::analyze::jobs::JobBook::new(gpusweep::analyze::jobs::JobOptions::default());
        book.observe(&judged, 0);
        let mut at = 0;
        c.bench_function(&format!("jobs_{n}_holders"), |b| {
            b.iter(|| {
                at += 1000;
                book.observe(&judged, at)
            });
        });
    }
}

/// The job book on a warming demo host (one job of eight ranks, its memory moving), seen reading after
/// reading: what a fleet client pays per warming host per second.
fn warming(c: &mut Criterion) {
    use gpusweep::source::demo::{DemoClock, DemoHost};
    let (clock, t) = DemoClock::manual(0);
    let host = DemoHost::new("gpu-a", clock);
    t.store(10_000, std::sync::atomic::Ordering::SeqCst);
    let judged = analyzed(host.snapshot(), &AnalyzeOptions::default());
    let mut book =
        gpusweep::analyze::jobs::JobBook::new(gpusweep::analyze::jobs::JobOptions::default());
    book.observe(&judged, 0);
    let mut at = 0;
    c.bench_function("jobs_warming_host", |b| {
        b.iter(|| {
            at += 1000;
            book.observe(&judged, at)
        });
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = bench, warming
}
criterion_main!(benches);
