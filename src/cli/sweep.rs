//! `gpusweep sweep`: plan from one reading of every host, confirm, TERM -> grace -> KILL, watch until clean.

use std::time::{Duration, Instant};

use anyhow::bail;

use super::common::{
    ANSWER_SLACK, FAST_POLL, any_failed, confirm, deliver_all, first_snapshots, print_outcomes,
    runtime,
};
use super::wait::{watch_for, watch_until_clean};
use crate::analyze::node::unusable;
use crate::analyze::plan::{Plan, plan, plan_summary};
use crate::analyze::watch::{Watch, job_processes};
use crate::core::action::Purpose;
use crate::core::format::{escape, fmt_bytes, fmt_gpus, fmt_ms, millis, truncate};
use crate::core::model::{HostId, MIB};
use crate::core::signal::{Sig, SignalRequest};
use crate::runtime::{Fleet, Settings};
use crate::source::HostCmd;

#[derive(Debug, clap::Args)]
pub struct SweepArgs {
    /// GPUs to sweep: indices, ranges and UUIDs (0,1,4-7,GPU-...). Default: all.
    #[arg(long, value_name = "LIST", value_parser = super::values::gpu_list_arg)]
    pub gpus: Option<super::values::GpuList>,
    /// Only this job's processes and the GPUs they hold (4711, slurm:4711.0, a container ID, run:PID), live
    /// or not.
    #[arg(long, value_name = "JOB")]
    pub job: Option<String>,
    /// Also end live, healthy jobs' processes on the chosen GPUs. By default a sweep ends leftovers only:
    /// orphans, hidden holders, what keeps a ghost or a residual, the processes of a job that lost a rank or
    /// its launcher.
    #[arg(long, conflicts_with = "job")]
    pub live: bool,
    /// Time between TERM and KILL.
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = crate::core::parse::duration_arg, allow_hyphen_values = true)]
    pub grace: Duration,
    /// Print the plan and do nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask (required when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Do not wait for the GPUs to become clean afterwards.
    #[arg(long)]
    pub no_wait: bool,
    /// Give up waiting for clean after this long.
    #[arg(long, value_name = "DUR", default_value = "60s", value_parser = crate::core::parse::duration_arg, allow_hyphen_values = true)]
    pub timeout: Duration,
    /// Clean means at most this many MiB used. Default 0.
    #[arg(long = "tolerance", env = "GPUSWEEP_TOLERANCE_MIB", value_name = "MIB", value_parser = super::values::mib_arg, allow_hyphen_values = true)]
    pub tolerance_mib: Option<u64>,
}

pub fn print_plan(plan: &Plan) {
    println!("plan: {}", plan_summary(plan));
    for i in &plan.items {
        println!(
            "  {:<10} {:>7}  {:<10} GPU {:<6} {:>10}  {}  [{}]",
            escape(&i.host),
            i.pid,
            truncate(&escape(i.user.as_deref().unwrap_or("N/A")), 10),
            fmt_gpus(&i.gpus),
            fmt_bytes(i.bytes),
            truncate(&escape(&i.cmdline), 60),
            escape(&i.why)
        );
    }
    for (pid, why) in &plan.skipped {
        println!("  skipped {pid}: {}", escape(why));
    }
    for i in &plan.live {
        println!(
            "  live {} {}: {}  [{}]",
            escape(&i.host),
            i.pid,
            truncate(&escape(&i.cmdline), 60),
            escape(&i.why)
        );
    }
}

/// What one reading of every host says: the plan for the chosen GPUs, the watch that follows, and the hosts
/// that could not be read (left out, reported, and the reason the sweep cannot end in exit 0).
struct Start {
    plan: Plan,
    watch: Watch,
    unreadable: Vec<String>,
}

async fn start(
    fleet: &mut Fleet,
    s: &Settings,
    a: &SweepArgs,
    tolerance: u64,
) -> anyhow::Result<Start> {
    let snaps = first_snapshots(fleet, s.connect_timeout).await;
    let mut unreadable = Vec::new();
    for snap in &snaps {
        match (&snap.error, unusable(snap, s.fleet.load_nvml)) {
            (Some(_), Some(why)) => {
                eprintln!("gpusweep: {why}");
                unreadable.push(why);
            }
            (None, Some(why)) => bail!("{why}"),
            _ => {}
        }
    }
    if snaps.iter().all(|h| h.error.is_some()) {
        bail!("no host could be read");
    }
    // `--gpus all` is no `--gpus`.
    let named_gpus = a.gpus.as_ref().and_then(super::values::GpuList::chosen);
    let watch = watch_for(fleet, &snaps, named_gpus, a.job.as_deref(), tolerance)?;
    let mut all = Plan::default();
    for (i, snap) in snaps.iter().enumerate() {
        let id = HostId(i);
        if snap.error.is_some() {
            continue;
        }
        // A host no signal can reach is refused by name, never swept "successfully" with nothing sent.
        let in_scope =
            (named_gpus.is_none() && a.job.is_none()) || watch.per_host.contains_key(&id);
        let read_only = fleet
            .spec(id)
            .is_some_and(crate::core::host::HostSpec::read_only);
        if read_only && in_scope && !a.dry_run {
            bail!(
                "{}: read-only host (read over HTTP or from Prometheus): a sweep cannot act on it; sweep it \
                 over SSH (--hosts user@node) or through its agent",
                escape(&snap.host)
            );
        }
        let chosen = named_gpus.is_some() || a.job.is_some();
        let gpus: Option<&[u32]> = match (chosen, watch.per_host.get(&id)) {
            (false, _) => None,
            (true, Some(scope)) => scope.gpus.as_deref(),
            // --gpus or --job names no GPU of this host.
            (true, None) => continue,
        };
        let mut p = plan(id, snap, gpus, &fleet.protected(id));
        if let Some(q) = &a.job {
            let of_job: Vec<u32> = job_processes(snap, q)
                .into_iter()
                .map(|(pid, _)| pid)
                .collect();
            p.items.retain(|i| of_job.contains(&i.pid));
        } else if !a.live {
            p.only_leftovers(snap);
        }
        all.extend(p);
    }
    // What a sweep of leftovers leaves alone is not waited for: a GPU only live jobs hold is theirs.
    let mut watch = watch;
    watch
        .exempt
        .extend(all.live.iter().map(|i| (i.pid, i.start_time)));
    Ok(Start {
        plan: all,
        watch,
        unreadable,
    })
}

/// Ask, then signal. `Ok(None)` when the operator said no; otherwise whether some target failed, and when
/// the first signal went out (the time at the prompt is not the sweep's).
async fn signal_plan(
    fleet: &mut Fleet,
    plan: &Plan,
    a: &SweepArgs,
) -> anyhow::Result<Option<(bool, Instant)>> {
    if plan.items.is_empty() {
        println!("nothing to signal");
        return Ok(Some((false, Instant::now())));
    }
    let question = format!(
        "Send TERM to {} processes, KILL after {}?",
        plan.items.len(),
        fmt_ms(millis(a.grace))
    );
    if !confirm(&question, a.yes)? {
        println!("nothing sent");
        return Ok(None);
    }
    let reqs: Vec<(HostId, SignalRequest)> = plan
        .hosts()
        .into_iter()
        .map(|h| {
            (
                h,
                plan.request(h, Sig::Term, Some(millis(a.grace)), Purpose::Sweep),
            )
        })
        .collect();
    let started = Instant::now();
    for (h, _) in &reqs {
        fleet.send(*h, HostCmd::Interval(FAST_POLL));
    }
    let outs = deliver_all(fleet, &reqs, a.grace + ANSWER_SLACK).await;
    println!("signals:");
    print_outcomes(&outs);
    Ok(Some((any_failed(&outs), started)))
}

pub fn run(s: &Settings, a: &SweepArgs) -> anyhow::Result<i32> {
    let tolerance = a
        .tolerance_mib
        .map_or(s.fleet.analyze.tolerance, |t| t.saturating_mul(MIB));
    let rt = runtime()?;
    let res = rt.block_on(async {
        let mut opts = s.fleet_acting_via_serve().without_gauges();
        // The ledgers judge with the tolerance this sweep was given.
        opts.analyze.tolerance = tolerance;
        let mut fleet = Fleet::start(&s.specs, &opts).await?;
        let Start {
            plan,
            watch,
            unreadable,
        } = start(&mut fleet, s, a, tolerance).await?;
        print_plan(&plan);
        // Hosts that could not be read were neither planned nor judged: never an all-clear.
        let unread = if unreadable.is_empty() { 0 } else { 2 };
        if a.dry_run {
            return Ok(unread);
        }
        // A target refused or failed: exit 1 unless the GPUs end up clean anyway.
        let Some((failed, started)) = signal_plan(&mut fleet, &plan, a).await? else {
            return Ok(2);
        };
        if a.no_wait {
            return Ok(unread.max(i32::from(failed)));
        }
        fleet.broadcast(&HostCmd::Interval(FAST_POLL));
        let (clean, watch) = watch_until_clean(&mut fleet, watch, Some(a.timeout), started).await?;
        if clean {
            println!(
                "clean: every chosen GPU reads zero, {} after the first signal",
                fmt_ms(millis(started.elapsed()))
            );
            for why in &unreadable {
                println!("  not judged: {why}");
            }
            Ok(unread)
        } else {
            println!(
                "not clean after {}; still held:",
                fmt_ms(millis(started.elapsed()))
            );
            for r in watch.remaining() {
                println!("  {r}");
            }
            Ok(1)
        }
    });
    rt.shutdown_background();
    res
}
