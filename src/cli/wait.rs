//! `gpusweep wait`, and the watch-until-clean loop that `sweep` shares.

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::bail;

use super::common::runtime;
use crate::analyze::watch::{Scope, Watch, judged_by_holders_only};
use crate::core::format::{fmt_ms, millis, truncate};
use crate::core::model::MIB;
use crate::runtime::{Fleet, HostEvent, Settings};
use crate::source::ConnStatus;

pub struct WaitArgs {
    pub gpus: Option<Vec<u32>>,
    pub tolerance_mib: Option<u64>,
    pub timeout: Option<Duration>,
    pub poll: Duration,
}

/// The one progress line on stderr, redrawn in place.
struct Progress {
    on: bool,
    last_len: usize,
}

impl Progress {
    fn show(&mut self, elapsed_ms: u64, watch: &Watch) {
        if !self.on {
            return;
        }
        let line = truncate(
            &format!(
                "waiting {}: {}",
                fmt_ms(elapsed_ms),
                watch.remaining().join("; ")
            ),
            160,
        );
        let n = line.chars().count();
        eprint!("\r{line}{}", " ".repeat(self.last_len.saturating_sub(n)));
        self.last_len = n;
        let _ = std::io::stderr().flush();
    }
    fn clear(&self) {
        if self.on {
            eprint!("\r{}\r", " ".repeat(self.last_len));
        }
    }
    fn end(&self) {
        if self.on {
            eprintln!();
        }
    }
}

/// How long to wait for the next event.
fn next_deadline(
    deadline: Option<tokio::time::Instant>,
    first_deadline: tokio::time::Instant,
    any_reading: bool,
) -> tokio::time::Instant {
    match (deadline, any_reading) {
        (Some(d), true) => d,
        (Some(d), false) => d.min(first_deadline),
        (None, true) => tokio::time::Instant::now() + Duration::from_secs(3600),
        (None, false) => first_deadline,
    }
}

/// Watch until clean. `Ok(true)` clean, `Ok(false)` timed out; Err when no host ever answered.
pub async fn watch_until_clean(
    fleet: &mut Fleet,
    scope: Scope,
    tolerance: u64,
    timeout: Option<Duration>,
    started: Instant,
    connect_timeout: Duration,
) -> anyhow::Result<(bool, Watch)> {
    let mut watch = Watch::new(fleet.expected(), scope, tolerance, 0);
    let deadline = timeout.map(|t| tokio::time::Instant::from_std(started) + t);
    let first_deadline = tokio::time::Instant::now() + connect_timeout;
    let mut any_reading = false;
    let mut noted: HashSet<String> = HashSet::new();
    let mut progress = Progress {
        on: std::io::stderr().is_terminal(),
        last_len: 0,
    };
    loop {
        let until = next_deadline(deadline, first_deadline, any_reading);
        let ev = match tokio::time::timeout_at(until, fleet.events.recv()).await {
            Ok(Some(ev)) => ev,
            Ok(None) => bail!("all collectors stopped"),
            Err(_) if !any_reading && deadline.is_none_or(|d| first_deadline < d) => {
                let why = watch.remaining().join("; ");
                bail!(
                    "no host could be read within {}s: {why}",
                    connect_timeout.as_secs()
                )
            }
            Err(_) => {
                progress.end();
                return Ok((false, watch));
            }
        };
        let elapsed = millis(started.elapsed());
        match ev {
            HostEvent::Snapshot { host, snap } => {
                any_reading = true;
                if judged_by_holders_only(&snap) && noted.insert(snap.host.clone()) {
                    eprintln!(
                        "gpusweep: {}: no GPU can be read ({}); judging by holders alone",
                        snap.host,
                        snap.gpu_error.as_deref().unwrap_or("no GPUs")
                    );
                }
                if watch.observe(host, &snap, elapsed) {
                    progress.clear();
                    return Ok((true, watch));
                }
            }
            HostEvent::Status {
                host,
                status: ConnStatus::Down(e),
            } => watch.unreadable(host, e),
            _ => {}
        }
        progress.show(elapsed, &watch);
    }
}

pub fn run(s: &Settings, a: &WaitArgs) -> anyhow::Result<i32> {
    let scope = Scope {
        gpus: a.gpus.clone(),
    };
    let tolerance = a
        .tolerance_mib
        .map_or(s.fleet.analyze.tolerance, |t| t.saturating_mul(MIB));
    let mut opts = s.fleet.clone();
    opts.interval = a.poll.max(Duration::from_millis(20));
    let rt = runtime()?;
    let started = Instant::now();
    let res = rt.block_on(async {
        let mut fleet = Fleet::start(&s.specs, &opts)?;
        watch_until_clean(
            &mut fleet,
            scope,
            tolerance,
            a.timeout,
            started,
            s.connect_timeout,
        )
        .await
    });
    rt.shutdown_background();
    let (clean, watch) = res?;
    if clean {
        println!(
            "clean: every chosen GPU reads {} after {}",
            if tolerance == 0 {
                "zero".to_string()
            } else {
                format!("<= {} MiB", tolerance / MIB)
            },
            fmt_ms(millis(started.elapsed()))
        );
        Ok(0)
    } else {
        println!(
            "timed out after {}; still held:",
            fmt_ms(millis(started.elapsed()))
        );
        for r in watch.remaining() {
            println!("  {r}");
        }
        Ok(1)
    }
}
