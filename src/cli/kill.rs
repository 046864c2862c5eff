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
    #[arg(long, default_value = "TERM", value_parser = super::values::signal_arg)]
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

/// The hosts a kill acts on: with `--job` and neither `--host` nor PIDs, every host read (a job runs on
/// several); otherwise the one `--host` names, or the only one (PIDs name processes of one host).
fn chosen_hosts(s: &Settings, a: &KillArgs) -> anyhow::Result<Vec<usize>> {
    let every = a.job.is_some() && a.host.is_none() && a.pids.is_empty();
    let chosen = if every {
        (0..s.specs.len()).collect()
    } else {
        vec![pick_host(s, a.host.as_deref())?]
    };
    for &i in &chosen {
        if s.specs[i].read_only() && !every {
            bail!(
                "{}: read-only host (read over HTTP or from Prometheus): no signal can be sent through it; \
                 kill over SSH (--hosts user@node) or through its agent",
                escape(&s.specs[i].label())
            );
        }
    }
    Ok(chosen)
}

/// One host's targets: the PIDs named and the job's processes, each as this reading knows it.
fn targets_of(
    snap: &crate::core::model::HostSnapshot,
    a: &KillArgs,
    local: bool,
) -> (Vec<TargetInfo>, usize) {
    let mut pids = a.pids.clone();
    if let Some(q) = &a.job {
        let of_job = crate::analyze::watch::job_processes(snap, q);
        if of_job.is_empty() && pids.is_empty() {
            println!(
                "  {}: no process of job {} holds a GPU",
                escape(&snap.host),
                escape(q)
            );
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
    (targets, pids.len())
}

pub fn run(s: &Settings, a: &KillArgs) -> anyhow::Result<i32> {
    let chosen = chosen_hosts(s, a)?;
    let specs: Vec<HostSpec> = chosen.iter().map(|&i| s.specs[i].clone()).collect();
    let rt = runtime()?;
    let res = rt.block_on(async {
        let opts = s.fleet_acting_via_serve().without_gauges();
        let mut fleet = Fleet::start(&specs, &opts).await?;
        let snaps = first_snapshots(&mut fleet, s.connect_timeout).await;
        let mut reqs: Vec<(HostId, SignalRequest)> = Vec::new();
        let mut asked = 0;
        let mut unread = false;
        for (i, snap) in snaps.iter().enumerate() {
            if let Some(e) = &snap.error {
                if specs.len() == 1 {
                    bail!("{}: {e}", snap.host);
                }
                eprintln!("gpusweep: {}: {}", escape(&snap.host), escape(e));
                unread = true;
                continue;
            }
            if specs[i].read_only() {
                eprintln!(
                    "gpusweep: {}: read-only host (read over HTTP or from Prometheus): nothing is signalled through it",
                    escape(&snap.host)
                );
                unread = true;
                continue;
            }
            let (targets, named) = targets_of(snap, a, specs[i] == HostSpec::Local);
            asked += named;
            for t in &targets {
                println!(
                    "  {} {:>7}  {}",
                    escape(&snap.host),
                    t.pid,
                    truncate(&escape(&t.cmdline), 80)
                );
            }
            if !targets.is_empty() {
                reqs.push((
                    HostId(i),
                    SignalRequest {
                        targets,
                        signal: a.signal,
                        grace_ms: a.grace.map(millis),
                        purpose: Some(Purpose::Kill),
                    },
                ));
            }
        }
        let n: usize = reqs.iter().map(|(_, r)| r.targets.len()).sum();
        if n == 0 {
            // A job with no process left anywhere is done; PIDs that name nothing are an error.
            return Ok(if unread { 2 } else { i32::from(asked > 0) });
        }
        let question = format!("Send {} to {n} process(es)?", a.signal.name());
        if !confirm(&question, a.yes)? {
            println!("nothing sent");
            return Ok(2);
        }
        let limit = a.grace.unwrap_or_default() + ANSWER_SLACK;
        let outs = deliver_all(&mut fleet, &reqs, limit).await;
        print_outcomes(&outs);
        let all_ok = outs.iter().all(|(_, o)| o.ok()) && outs.len() == asked;
        Ok(if unread { 2 } else { i32::from(!all_ok) })
    });
    rt.shutdown_background();
    res
}
