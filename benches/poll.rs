//! One in-process poll (NVML when a driver is present + /proc + holders + /dev/shm) on a host with at least
//! 500 processes: 500 real `sleep` processes (`GPUSWEEP_BENCH_PROCS`) are started for the measurement, each
//! holding a few fds.
//!
//! `cargo bench --bench poll` (on a GPU host the NVML part is included; without a driver it is skipped and the
//! report says so). The incremental poll is what every interval costs; the full fd walk is what the slow
//! cadence (every 5 s, or sooner when memory is unexplained) costs.

// In tests a panic is the failure message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use gpusweep::analyze::{AnalyzeOptions, analyzed};
use gpusweep::source::Source;
use gpusweep::source::demo::{DemoClock, DemoHost};
use gpusweep::source::local::LocalSource;
use gpusweep::source::local::nvml::Readout;
use gpusweep::source::local::procfs::ProcfsConfig;

/// `sleep` processes started for the measurement; `GPUSWEEP_BENCH_PROCS` asks for another number (5000 for a
/// busy node).
fn extra_procs() -> usize {
    std::env::var("GPUSWEEP_BENCH_PROCS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(500)
}

fn spawn_load() -> Vec<Child> {
    (0..extra_procs())
        .filter_map(|_| {
            Command::new("sleep")
                .arg("600")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .ok()
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut load = spawn_load();
    let procs = std::fs::read_dir("/proc").map_or(0, |d| {
        d.flatten()
            .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
            .count()
    });
    let mut src = match LocalSource::new(
        "bench".into(),
        ProcfsConfig::default(),
        true,
        Readout::Gauges,
    ) {
        Ok(s) => s,
        Err(e) => panic!("local source: {e}"),
    };
    let first = src.poll().ok();
    let nvml = first.as_ref().is_some_and(|s| s.gpu_error.is_none());
    eprintln!(
        "poll bench: {procs} processes on this host, NVML {}",
        if nvml {
            format!("on ({} GPUs)", first.as_ref().map_or(0, |s| s.gpus.len()))
        } else {
            "absent (procfs only)".into()
        }
    );
    c.bench_function(&format!("poll_incremental_{procs}_procs"), |b| {
        b.iter(|| src.poll());
    });
    // The serve's reading: the same, with dcgm-exporter's counters (clocks, energy, GPM...); the verdict
    // readers (`wait`, `sweep`) read neither.
    for readout in [Readout::Verdict, Readout::Counters] {
        let mut other =
            match LocalSource::new("bench".into(), ProcfsConfig::default(), true, readout) {
                Ok(s) => s,
                Err(e) => panic!("local source: {e}"),
            };
        let _ = other.poll();
        c.bench_function(
            &format!("poll_incremental_{procs}_procs_{readout:?}"),
            |b| {
                b.iter(|| other.poll());
            },
        );
    }
    let full_cfg = ProcfsConfig {
        full_scan_every: Duration::ZERO,
        ..ProcfsConfig::default()
    };
    let mut full = match LocalSource::new("bench".into(), full_cfg, true, Readout::Gauges) {
        Ok(s) => s,
        Err(e) => panic!("local source: {e}"),
    };
    c.bench_function(&format!("poll_full_fd_walk_{procs}_procs"), |b| {
        b.iter(|| full.poll());
    });
    let (clock, _) = DemoClock::manual(5_000);
    let demo = DemoHost::new("gpu-b", clock);
    let snap = demo.snapshot();
    c.bench_function("analyze_8_gpu_host_after_pkill", |b| {
        b.iter(|| analyzed(snap.clone(), &AnalyzeOptions::default()));
    });
    for ch in &mut load {
        let _ = ch.kill();
        let _ = ch.wait();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
