//! `gpusweep sweep`: plan from one reading of every host, confirm, TERM -> grace -> KILL, watch until clean.

use std::time::{Duration, Instant};

use anyhow::bail;

use super::common::{
    ANSWER_SLACK, FAST_POLL, any_failed, confirm, deliver_all, first_snapshots, print_outcomes,
    runtime,
};
use super::wait::watch_until_clean;
use crate::analyze::plan::{Plan, plan, plan_summary};
use crate::analyze::watch::Scope;
use crate::core::format::{fmt_bytes, fmt_gpus, fmt_ms, millis, truncate};
use crate::core::model::{HostId, MIB};
use crate::core::signal::{Sig, SignalRequest};
use crate::runtime::{Fleet, Settings};
use crate::source::HostCmd;

pub struct SweepArgs {
    pub gpus: Option<Vec<u32>>,
    pub grace: Duration,
    pub dry_run: bool,
    pub yes: bool,
    pub no_wait: bool,
    pub timeout: Duration,
    pub tolerance_mib: Option<u64>,
}

pub fn print_plan(plan: &Plan) {
    println!("plan: {}", plan_summary(plan));
    for i in &plan.items {
        println!(
            "  {:<10} {:>7}  {:<10} GPU {:<6} {:>10}  {}  [{}]",
            i.host,
            i.pid,
            truncate(i.user.as_deref().unwrap_or("N/A"), 10),
            fmt_gpus(&i.gpus),
            fmt_bytes(i.bytes),
            truncate(&i.cmdline, 60),
            i.why
        );
    }
    for (pid, why) in &plan.skipped {
        println!("  skipped {pid}: {why}");
    }
}

/// One reading of every host, and the plan for the chosen GPUs.
async fn make_plan(fleet: &mut Fleet, s: &Settings, scope: &Scope) -> anyhow::Result<Plan> {
    let snaps = first_snapshots(fleet, s.connect_timeout).await;
    for snap in snaps.iter().filter(|s| s.error.is_some()) {
        eprintln!(
            "gpusweep: {}: {}",
            snap.host,
            snap.error.as_deref().unwrap_or("")
        );
    }
    if snaps.iter().all(|h| h.error.is_some()) {
        bail!("no host could be read");
    }
    let mut all = Plan::default();
    for (i, snap) in snaps.iter().enumerate() {
        if snap.error.is_none() {
            let id = HostId(i);
            all.extend(plan(id, snap, scope.gpus.as_deref(), &fleet.protected(id)));
        }
    }
    Ok(all)
}

/// Ask, then signal. `Ok(None)` when the operator said no; otherwise whether some target failed.
async fn signal_plan(
    fleet: &mut Fleet,
    plan: &Plan,
    a: &SweepArgs,
) -> anyhow::Result<Option<bool>> {
    if plan.items.is_empty() {
        println!("nothing to signal");
        return Ok(Some(false));
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
        .map(|h| (h, plan.request(h, Sig::Term, Some(millis(a.grace)))))
        .collect();
    for (h, _) in &reqs {
        fleet.send(*h, HostCmd::Interval(FAST_POLL));
    }
    let outs = deliver_all(fleet, &reqs, a.grace + ANSWER_SLACK).await;
    println!("signals:");
    print_outcomes(&outs);
    Ok(Some(any_failed(&outs)))
}

pub fn run(s: &Settings, a: &SweepArgs) -> anyhow::Result<i32> {
    let scope = Scope {
        gpus: a.gpus.clone(),
    };
    let tolerance = a
        .tolerance_mib
        .map_or(s.fleet.analyze.tolerance, |t| t.saturating_mul(MIB));
    let rt = runtime()?;
    let res = rt.block_on(async {
        let mut fleet = Fleet::start(&s.specs, &s.fleet)?;
        let plan = make_plan(&mut fleet, s, &scope).await?;
        print_plan(&plan);
        if a.dry_run {
            return Ok(0);
        }
        let started = Instant::now();
        // A target refused or failed: exit 1 unless the GPUs end up clean anyway.
        let Some(failed) = signal_plan(&mut fleet, &plan, a).await? else {
            return Ok(2);
        };
        if a.no_wait {
            return Ok(i32::from(failed));
        }
        fleet.broadcast(&HostCmd::Interval(FAST_POLL));
        let (clean, watch) = watch_until_clean(
            &mut fleet,
            scope,
            tolerance,
            Some(a.timeout),
            started,
            s.connect_timeout,
        )
        .await?;
        if clean {
            println!(
                "clean: every chosen GPU reads zero, {} after the first signal",
                fmt_ms(millis(started.elapsed()))
            );
            Ok(0)
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
