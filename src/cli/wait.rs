//! `gpusweep wait`, and the watch-until-clean loop that `sweep` shares. A gate: it passes only on readings
//! it has. A host never read, a host whose GPUs cannot be read (unless `--no-nvml`), a GPU a host does not have:
//! each is an error (exit 2), never a pass.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::bail;

use super::common::{first_snapshots, runtime};
use crate::analyze::node::{blind_gate, blind_holders, unusable};
use crate::analyze::watch::{Scope, Watch, job_processes, judged_by_holders_only, resolve_gpus};
use crate::core::format::{escape, fmt_ms, millis, truncate};
use crate::core::model::{HostId, HostSnapshot, MIB};
use crate::core::parse::GpuRef;
use crate::runtime::{Fleet, HostEvent, Judgement, Settings};
use crate::source::ConnStatus;

#[derive(Debug, clap::Args)]
pub struct WaitArgs {
    /// GPUs: indices, ranges and UUIDs (0,1,4-7,GPU-...), or `all` (as NVIDIA_VISIBLE_DEVICES says for a
    /// pod given every GPU). Default: all. A GPU a host lacks is an error.
    #[arg(long, value_name = "LIST", value_parser = super::values::gpu_list_arg)]
    pub gpus: Option<super::values::GpuList>,
    /// Clean means at most this many MiB used. Default 0.
    #[arg(long = "tolerance", env = "GPUSWEEP_TOLERANCE_MIB", value_name = "MIB", value_parser = super::values::mib_arg, allow_hyphen_values = true)]
    pub tolerance_mib: Option<u64>,
    /// Give up after this long (e.g. 30s). Default: never.
    #[arg(long, value_name = "DUR", value_parser = crate::core::parse::duration_arg, allow_hyphen_values = true)]
    pub timeout: Option<Duration>,
    /// Poll interval while waiting.
    #[arg(long, value_name = "DUR", default_value = "100ms", value_parser = crate::core::parse::duration_arg, allow_hyphen_values = true)]
    pub poll: Duration,
    /// Only the GPUs this job's processes hold: a Slurm job (4711, slurm:4711.0), a pod or container ID
    /// (4 characters or more), a systemd unit, run:PID.
    #[arg(long, value_name = "JOB")]
    pub job: Option<String>,
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
        // One line, redrawn in place: cut below the terminal's width so it never wraps.
        let width = crossterm::terminal::size().map_or(80, |(w, _)| usize::from(w));
        let line = truncate(
            &escape(&format!(
                "waiting {}: {}",
                fmt_ms(elapsed_ms),
                watch.remaining().join("; ")
            )),
            width.saturating_sub(1).max(10),
        );
        let n = line.chars().count();
        eprint!("\r{line}\x1b[K");
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

/// The watch over the hosts and GPUs chosen, seeded with their first readings.
pub fn watch_for(
    fleet: &Fleet,
    snaps: &[HostSnapshot],
    gpus: Option<&[GpuRef]>,
    job: Option<&str>,
    tolerance: u64,
) -> anyhow::Result<Watch> {
    let readable: Vec<(HostId, &HostSnapshot)> = snaps
        .iter()
        .enumerate()
        .filter(|(_, s)| s.error.is_none())
        .map(|(i, s)| (HostId(i), s))
        .collect();
    if let Some(q) = job {
        if gpus.is_some() {
            bail!("--job and --gpus: choose one (a job's GPUs are the ones it holds)");
        }
        crate::core::job::check_query(q)?;
        // A gate never passes on a job it cannot find: a typo is an error, not "nothing to wait for".
        let seen = readable
            .iter()
            .any(|(_, s)| crate::analyze::watch::job_seen(s, q));
        if !seen {
            bail!(
                "--job {}: no process of it on any host that was read (`gpusweep snapshot` shows each \
                 process's job; a finished job's GPUs are named with --gpus)",
                escape(q)
            );
        }
        // The job's GPUs, host by host, as this first reading shows them.
        let mut expected = Vec::new();
        let mut per_host = BTreeMap::new();
        for (h, s) in &readable {
            let mut held: Vec<u32> = job_processes(s, q)
                .into_iter()
                .flat_map(|(_, g)| g)
                .collect();
            held.sort_unstable();
            held.dedup();
            if !held.is_empty() {
                expected.push((*h, fleet.label(*h).to_string()));
                per_host.insert(*h, Scope { gpus: Some(held) });
            }
        }
        let mut watch = Watch::new(expected, Scope::default(), tolerance, 0);
        watch.per_host = per_host;
        for (h, s) in readable {
            if watch.per_host.contains_key(&h) {
                watch.observe(h, s, 0);
            }
        }
        return Ok(watch);
    }
    let (expected, per_host) = match gpus {
        None => (
            readable
                .iter()
                .map(|(h, _)| (*h, fleet.label(*h).to_string()))
                .collect(),
            BTreeMap::new(),
        ),
        Some(refs) => {
            let map = resolve_gpus(refs, &readable).map_err(|e| anyhow::anyhow!("--gpus: {e}"))?;
            let expected = map
                .keys()
                .map(|h| (*h, fleet.label(*h).to_string()))
                .collect();
            let per_host = map
                .into_iter()
                .map(|(h, g)| (h, Scope { gpus: Some(g) }))
                .collect();
            (expected, per_host)
        }
    };
    let mut watch = Watch::new(expected, Scope::default(), tolerance, 0);
    watch.per_host = per_host;
    for (h, s) in readable {
        watch.observe(h, s, 0);
    }
    Ok(watch)
}

pub fn stale_reason(silent_ms: u64) -> String {
    format!(
        "stale: no reading for {} (the agent stopped answering)",
        fmt_ms(silent_ms)
    )
}

/// Watch until clean. `Ok(true)` clean, `Ok(false)` timed out.
pub async fn watch_until_clean(
    fleet: &mut Fleet,
    mut watch: Watch,
    timeout: Option<Duration>,
    started: Instant,
) -> anyhow::Result<(bool, Watch)> {
    if watch.all_clean() {
        return Ok((true, watch));
    }
    let deadline = timeout.map(|t| tokio::time::Instant::from_std(started) + t);
    let mut progress = Progress {
        on: std::io::stderr().is_terminal(),
        last_len: 0,
    };
    loop {
        let until =
            deadline.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
        let ev = match tokio::time::timeout_at(until, fleet.recv()).await {
            Ok(Some(ev)) => ev,
            Ok(None) => bail!("all collectors stopped"),
            Err(_) if deadline.is_some() => {
                progress.end();
                return Ok((false, watch));
            }
            Err(_) => continue,
        };
        let elapsed = millis(started.elapsed());
        match ev {
            HostEvent::Update {
                host,
                update: Judgement::New(judged),
            } if watch.observe(host, &judged.snap, elapsed) => {
                progress.clear();
                return Ok((true, watch));
            }
            HostEvent::Status {
                host,
                status: ConnStatus::Down(e),
            } => watch.unreadable(host, e),
            // An old reading is no verdict: the host is unknown until it sends a new one.
            HostEvent::Status {
                host,
                status: ConnStatus::Stale { silent_ms },
            } => watch.unreadable(host, stale_reason(silent_ms)),
            _ => {}
        }
        progress.show(elapsed, &watch);
    }
}

pub fn run(s: &Settings, a: &WaitArgs) -> anyhow::Result<i32> {
    let tolerance = a
        .tolerance_mib
        .map_or(s.fleet.analyze.tolerance, |t| t.saturating_mul(MIB));
    let mut opts = s.fleet_via_serve().without_gauges();
    opts.interval = a.poll.max(Duration::from_millis(20));
    // The ledgers judge with the tolerance this gate was given.
    opts.analyze.tolerance = tolerance;
    crate::runtime::load_local_early(&s.specs, &opts);
    let rt = runtime()?;
    let started = Instant::now();
    let res = rt.block_on(async {
        let mut fleet = Fleet::start(&s.specs, &opts).await?;
        // At least one reading of every host, whatever the timeout: a gate never passes on no reading.
        let snaps = first_snapshots(&mut fleet, s.connect_timeout).await;
        if let Some(e) = snaps
            .iter()
            .find_map(|h| unusable(h, s.fleet.load_nvml).or_else(|| blind_holders(h)))
        {
            bail!("{e}");
        }
        for snap in snaps.iter().filter(|h| judged_by_holders_only(h)) {
            eprintln!(
                "gpusweep: {}: no GPU can be read ({}); judging by holders alone (--no-nvml)",
                escape(&snap.host),
                escape(snap.gpu_error.as_deref().unwrap_or("no GPUs"))
            );
        }
        let watch = watch_for(
            &fleet,
            &snaps,
            a.gpus.as_ref().and_then(super::values::GpuList::chosen),
            a.job.as_deref(),
            tolerance,
        )?;
        if a.job.is_some() && watch.expected.is_empty() {
            return Ok(None);
        }
        // A host it cannot see whole: not clean by the deadline is unknown, not "still held".
        let blind: Vec<String> = snaps.iter().filter_map(blind_gate).collect();
        watch_until_clean(&mut fleet, watch, a.timeout, started)
            .await
            .map(|(clean, watch)| Some((clean, watch, blind)))
    });
    rt.shutdown_background();
    let Some((clean, watch, blind)) = res? else {
        println!(
            "job {}: none of its processes holds a GPU; nothing to wait for",
            escape(a.job.as_deref().unwrap_or_default())
        );
        return Ok(0);
    };
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
        let undecided = watch.undecided() || !blind.is_empty();
        println!(
            "timed out after {}; {}:",
            fmt_ms(millis(started.elapsed())),
            if undecided {
                "could not be read (no verdict)"
            } else {
                "still held"
            }
        );
        for r in watch.remaining() {
            println!("  {}", escape(&r));
        }
        for b in &blind {
            println!("  unknown: {b}");
        }
        // Something could not be read: an error, never "still held".
        Ok(if undecided { 2 } else { 1 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn why_a_host_cannot_be_judged_is_said_with_its_texts_escaped() {
        let snap = HostSnapshot {
            host: "gpu-b\u{1b}]0;owned\u{7}".into(),
            gpu_error: Some("driver \u{1b}[2J gone".into()),
            ..Default::default()
        };
        let said = unusable(&snap, true).expect("no GPU read: no verdict");
        assert!(
            !said.contains('\u{1b}') && !said.contains('\u{7}'),
            "{said:?}"
        );
        assert!(said.contains("gpu-b\\x1b]0;owned\\x07"), "{said:?}");
    }
}
