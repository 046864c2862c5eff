//! `gpusweep prolog` and `gpusweep epilog`: Slurm's gates, run by slurmd as root on each node around a job.
//!
//! The epilog ends what is left of the job (by its cgroup, or the SLURM_JOB_ID in its environment where
//! Slurm tracks processes without cgroups), waits for the job's GPUs to read zero, and exits 0 when they do.
//! When they do not, it prints one line fit for a drain reason (`gpusweep: GPU 3 holds 20 GiB, pid 4711 in
//! D state`), drains the node with it (scontrol), and exits 1, so a dirty GPU is never handed to the next
//! job. The prolog refuses, the same way, GPUs that are not clean when a job starts.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};

use super::common::{first_snapshots, local_identity, runtime};
use super::wait::{watch_for, watch_until_clean};
use crate::act::Deliverer;
use crate::analyze::node::unusable;
use crate::analyze::watch::Watch;
use crate::core::format::{escape, fmt_ms, millis, truncate};
use crate::core::host::HostSpec;
use crate::core::model::{HostSnapshot, ProcState};
use crate::core::parse::GpuRef;
use crate::core::signal::{Sig, SignalRequest};
use crate::runtime::{Fleet, Settings};
use crate::source::local::procfs::slurm_job_pids;

/// The job's GPUs and how long to give them; SLURM_JOB_ID names the job.
#[derive(Debug, clap::Args)]
pub struct GateArgs {
    /// The job's GPUs. Default: SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES; a job with neither has no GPUs
    /// and is judged on none. `all`: every GPU of the node (a site whose Slurm does not manage its GPUs).
    #[arg(long, value_name = "LIST", value_parser = super::values::gpu_list_arg)]
    pub gpus: Option<super::values::GpuList>,
    /// Epilog: time between TERM and KILL for the job's leftovers.
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = crate::core::parse::duration_arg, allow_hyphen_values = true)]
    pub grace: Duration,
    /// Epilog: how long the GPUs may take to read zero.
    #[arg(long, value_name = "DUR", default_value = "60s", value_parser = crate::core::parse::duration_arg, allow_hyphen_values = true)]
    pub timeout: Duration,
    /// Do not drain the node (scontrol) when not clean; only exit 1.
    #[arg(long)]
    pub no_drain: bool,
}

fn job_id() -> anyhow::Result<u64> {
    let v = std::env::var("SLURM_JOB_ID")
        .map_err(|_| anyhow!("SLURM_JOB_ID is not set: prolog and epilog are run by slurmd"))?;
    v.trim()
        .parse()
        .map_err(|_| anyhow!("SLURM_JOB_ID={v:?} is not a job number"))
}

/// The job's user, as slurmd tells the epilog (SLURM_JOB_UID).
fn job_uid() -> Option<u32> {
    std::env::var("SLURM_JOB_UID").ok()?.trim().parse().ok()
}

/// Which of the node's GPUs are a job's.
enum JobGpus {
    /// These (--gpus, SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES).
    Named(Vec<GpuRef>),
    /// Every GPU of the node (`--gpus all`).
    All,
    /// None: nothing of the node's GPUs is its to judge (another user's GPU never drains the node for a
    /// CPU-only job).
    None,
}

/// The job's GPUs: --gpus, else SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES; a job with none of them has
/// none.
fn job_gpus(a: &GateArgs) -> anyhow::Result<JobGpus> {
    if a.gpus.is_some() {
        return Ok(super::values::chosen(a.gpus.as_ref()).map_or(JobGpus::All, JobGpus::Named));
    }
    for var in ["SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"] {
        if let Ok(v) = std::env::var(var)
            && !v.trim().is_empty()
        {
            return crate::core::parse::gpu_refs_arg(&v)
                .map(JobGpus::Named)
                .map_err(|e| anyhow!("{var}={v:?}: {e}"));
        }
    }
    Ok(JobGpus::None)
}

/// What the gate says of a job without GPUs.
fn no_gpus(job: u64) -> String {
    format!(
        "gpusweep: job {job}: no GPUs of its own (no SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES or --gpus): none \
         judged (--gpus all judges every GPU of the node)"
    )
}

/// One line for `scontrol ... Reason=`: the first GPU still held, and in what state its holder is.
fn reason(watch: &Watch, snap: &HostSnapshot) -> String {
    let first = watch
        .remaining()
        .into_iter()
        .next()
        .unwrap_or_else(|| "the job's GPUs could not be judged".into());
    let stuck: Vec<String> = snap
        .holders
        .iter()
        .filter(|h| !h.benign)
        .filter_map(|h| snap.proc(h.pid))
        .filter(|p| p.state == ProcState::DiskSleep)
        .map(|p| format!("pid {} in D state", p.pid))
        .collect();
    let line = if stuck.is_empty() {
        format!("gpusweep: {first}")
    } else {
        format!("gpusweep: {first}, {}", stuck.join(", "))
    };
    truncate(&escape(&line), 240)
}

/// The gate's answer when the job's GPUs are not clean: the reason said, the node drained unless told not
/// to; exit 1.
fn not_clean(watch: &Watch, snap: &HostSnapshot, drains: bool) -> i32 {
    let why = reason(watch, snap);
    println!("{why}");
    if drains {
        drain(&why);
    }
    1
}

/// Drain this node with `why`, as slurmd names it (SLURMD_NODENAME). Failing to is said, never fatal: the
/// non-zero exit drains it anyway.
fn drain(why: &str) {
    let Ok(node) = std::env::var("SLURMD_NODENAME") else {
        eprintln!(
            "gpusweep: SLURMD_NODENAME is not set: not draining (the exit status still fails the job's gate)"
        );
        return;
    };
    let r = std::process::Command::new("scontrol")
        .args(["update", &format!("NodeName={node}"), "State=DRAIN"])
        .arg(format!("Reason={why}"))
        .output();
    match r {
        Ok(o) if o.status.success() => {}
        Ok(o) => eprintln!(
            "gpusweep: scontrol could not drain {node}: {}",
            escape(String::from_utf8_lossy(&o.stderr).trim())
        ),
        Err(e) => eprintln!("gpusweep: scontrol: {e}"),
    }
}

fn start(s: &Settings) -> anyhow::Result<(tokio::runtime::Runtime, Fleet, Vec<HostSnapshot>)> {
    if s.specs != [HostSpec::Local] {
        bail!("prolog and epilog judge this node: --hosts does not apply");
    }
    let rt = runtime()?;
    let mut fleet =
        rt.block_on(async { Fleet::start(&s.specs, &s.fleet.clone().without_gauges()).await })?;
    let snaps = rt.block_on(first_snapshots(&mut fleet, s.connect_timeout));
    if let Some(e) = unusable(&snaps[0], s.fleet.load_nvml)
        .or_else(|| crate::analyze::node::blind_holders(&snaps[0]))
    {
        bail!("{e}");
    }
    Ok((rt, fleet, snaps))
}

/// Exit 0: the job's GPUs are clean; 1: they are not (the reason printed, the node drained); 2: error.
pub fn prolog(s: &Settings, a: &GateArgs) -> anyhow::Result<i32> {
    let job = job_id()?;
    let gpus = match job_gpus(a)? {
        JobGpus::None => {
            println!("{}", no_gpus(job));
            return Ok(0);
        }
        JobGpus::All => None,
        JobGpus::Named(g) => Some(g),
    };
    let (rt, fleet, snaps) = start(s)?;
    let watch = watch_for(
        &fleet,
        &snaps,
        gpus.as_deref(),
        None,
        s.fleet.analyze.tolerance,
    )?;
    rt.shutdown_background();
    if watch.all_clean() {
        println!("gpusweep: job {job}: its GPUs are clean");
        return Ok(0);
    }
    // Held where this gate cannot see by whom: unknown, an error, not a drain on a guess.
    if let Some(b) = crate::analyze::node::blind_gate(&snaps[0]) {
        println!("gpusweep: job {job}: unknown: {b}");
        return Ok(2);
    }
    Ok(not_clean(&watch, &snaps[0], !a.no_drain))
}

/// Exit 0: the job's leftovers ended and its GPUs read zero; 1: not clean within --timeout (the reason
/// printed, the node drained); 2: error.
pub fn epilog(s: &Settings, a: &GateArgs) -> anyhow::Result<i32> {
    let job = job_id()?;
    let gpus = job_gpus(a)?;
    let protected = crate::act::protect::this_host();
    let uid = job_uid();
    if uid.is_none() {
        eprintln!(
            "gpusweep: job {job}: SLURM_JOB_UID is not set: only processes in the job's Slurm cgroup are ended \
             (one that merely carries SLURM_JOB_ID may be anyone's)"
        );
    }
    let left: Vec<u32> = slurm_job_pids(&s.fleet.procfs.proc_root, job, uid)
        .into_iter()
        .filter(|p| !protected.contains(*p))
        .collect();
    let started = Instant::now();
    if !left.is_empty() {
        let d = Deliverer {
            host: "local".into(),
            audit: s.fleet.audit.clone(),
            without_pidfd: s.fleet.kill_without_pidfd,
        };
        let outs = d.deliver(&SignalRequest {
            targets: left.iter().filter_map(|&p| local_identity(p)).collect(),
            signal: Sig::Term,
            grace_ms: Some(millis(a.grace)),
            purpose: Some(crate::core::action::Purpose::Epilog),
        });
        for o in &outs {
            eprintln!("gpusweep: job {job}: {}", o.describe());
        }
    }
    // Its leftovers are ended whatever GPUs it had; a job without GPUs has none to wait for.
    let gpus = match gpus {
        JobGpus::All => None,
        JobGpus::Named(g) => Some(g),
        JobGpus::None => {
            println!(
                "{} ({} leftover process(es) ended)",
                no_gpus(job),
                left.len()
            );
            return Ok(0);
        }
    };
    let (rt, mut fleet, snaps) = start(s)?;
    let watch = watch_for(
        &fleet,
        &snaps,
        gpus.as_deref(),
        None,
        s.fleet.analyze.tolerance,
    )?;
    let (clean, watch) = rt.block_on(watch_until_clean(
        &mut fleet,
        watch,
        Some(a.timeout),
        started,
    ))?;
    let last = rt.block_on(first_snapshots(&mut fleet, s.connect_timeout));
    rt.shutdown_background();
    if clean {
        println!(
            "gpusweep: job {job}: clean after {} ({} leftover process(es) ended)",
            fmt_ms(millis(started.elapsed())),
            left.len()
        );
        return Ok(0);
    }
    Ok(not_clean(&watch, &last[0], !a.no_drain))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::HostId;

    #[test]
    fn the_reason_is_one_escaped_line_naming_a_stuck_holder() {
        let mut snap = HostSnapshot::default();
        snap.holders.push(crate::core::model::Holder {
            pid: 4711,
            gpus: vec![3],
            ..Default::default()
        });
        snap.processes.push(crate::core::model::Proc {
            pid: 4711,
            state: ProcState::DiskSleep,
            ..Default::default()
        });
        let w = Watch::new(
            vec![(HostId(0), "n1".into())],
            crate::analyze::watch::Scope::default(),
            0,
            0,
        );
        let r = reason(&w, &snap);
        assert!(
            r.starts_with("gpusweep: ") && r.contains("pid 4711 in D state"),
            "{r}"
        );
        assert!(!r.contains('\n'));
    }
}
