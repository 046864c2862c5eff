//! `gpusweep kill PID...`: signal chosen processes with the same safety as a sweep.

use std::time::Duration;

use anyhow::{anyhow, bail};

use super::common::{
    ANSWER_SLACK, confirm, deliver_all, first_snapshots, local_identity, print_outcomes, runtime,
};
use crate::core::action::Purpose;
use crate::core::format::{escape, millis, truncate};
use crate::core::host::HostSpec;
use crate::core::model::HostId;
use crate::core::signal::{Sig, SignalRequest, TargetInfo};
use crate::runtime::fleet::find_host;
use crate::runtime::{Fleet, Settings};

#[derive(Debug, clap::Args)]
pub struct KillArgs {
    /// PIDs on the chosen host.
    #[arg(required_unless_present = "job", allow_negative_numbers = true)]
    pub pids: Vec<u32>,
    /// Every GPU process of this job (4711, slurm:4711.0, a container ID, run:PID), besides the PIDs.
    #[arg(long, value_name = "JOB")]
    pub job: Option<String>,
    /// The host the PIDs live on: the spec as typed in --hosts, or its label. Default: the only host.
    #[arg(long)]
    pub host: Option<String>,
    /// TERM, KILL, INT, HUP, ... or a number.
    #[arg(long, default_value = "TERM", value_parser = super::args::signal_arg)]
    pub signal: Sig,
    /// Wait this long for exit, then KILL. Default: do not wait.
    #[arg(long, value_name = "DUR", value_parser = crate::core::parse::duration_arg, allow_hyphen_values = true)]
    pub grace: Option<Duration>,
    /// Do not ask (required when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// The host the PIDs live on: `--host` as typed or as labelled, or the only host.
fn pick_host(s: &Settings, host: Option<&str>) -> anyhow::Result<usize> {
    let labels = crate::core::host::unique_labels(&s.specs);
    match host {
        Some(h) => find_host(&s.specs, &labels, h)
            .map(|id| id.0)
            .ok_or_else(|| anyhow!("--host {h:?} is not among {}", labels.join(", "))),
        None if labels.len() == 1 => Ok(0),
        None => bail!(
            "several hosts: say which with --host ({})",
            labels.join(", ")
        ),
    }
}

pub fn run(s: &Settings, a: &KillArgs) -> anyhow::Result<i32> {
    let idx = pick_host(s, a.host.as_deref())?;
    if s.specs[idx].read_only() {
        bail!(
            "{}: read-only host (read over HTTP or from Prometheus): no signal can be sent through it; \
             kill over SSH (--hosts user@node) or through its agent",
            escape(&s.specs[idx].label())
        );
    }
    let local = s.specs[idx] == HostSpec::Local;
    let rt = runtime()?;
    let res = rt.block_on(async {
        let opts = s.fleet_acting_via_serve().without_gauges();
        let mut fleet = Fleet::start(&s.specs[idx..=idx], &opts).await?;
        let snap = first_snapshots(&mut fleet, s.connect_timeout)
            .await
            .remove(0);
        if let Some(e) = &snap.error {
            bail!("{}: {e}", snap.host);
        }
        let mut pids = a.pids.clone();
        if let Some(q) = &a.job {
            let of_job = crate::analyze::watch::job_processes(&snap, q);
            if of_job.is_empty() && pids.is_empty() {
                println!(
                    "  {}: no process of job {} holds a GPU",
                    escape(&snap.host),
                    escape(q)
                );
                return Ok(0);
            }
            pids.extend(of_job.into_iter().map(|(pid, _)| pid));
        }
        let mut targets = Vec::new();
        for &pid in &pids {
            // On this host any PID can be named; elsewhere only what the agent reported.
            let found = snap
                .proc(pid)
                .map(TargetInfo::of)
                .or_else(|| local.then(|| local_identity(pid)).flatten());
            match found {
                Some(t) => targets.push(t),
                None => println!("  {}: {pid}: no such process", escape(&snap.host)),
            }
        }
        if targets.is_empty() {
            return Ok(1);
        }
        for t in &targets {
            println!(
                "  {} {:>7}  {}",
                escape(&snap.host),
                t.pid,
                truncate(&escape(&t.cmdline), 80)
            );
        }
        let question = format!("Send {} to {} process(es)?", a.signal.name(), targets.len());
        if !confirm(&question, a.yes)? {
            println!("nothing sent");
            return Ok(2);
        }
        let req = SignalRequest {
            targets,
            signal: a.signal,
            grace_ms: a.grace.map(millis),
            purpose: Some(Purpose::Kill),
        };
        let limit = a.grace.unwrap_or_default() + ANSWER_SLACK;
        let outs = deliver_all(&mut fleet, &[(HostId(0), req)], limit).await;
        print_outcomes(&outs);
        Ok(i32::from(
            !(outs.iter().all(|(_, o)| o.ok()) && outs.len() == pids.len()),
        ))
    });
    rt.shutdown_background();
    res
}
