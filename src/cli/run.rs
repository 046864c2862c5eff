//! `gpusweep run [--gpus LIST] [--grace DUR] [--timeout DUR] [--no-preflight] -- COMMAND...`: a job that
//! cannot leak. Preflight (the GPUs are clean, /dev/shm has room, CUDA_VISIBLE_DEVICES is sane), then COMMAND
//! in a job of its own (a cgroup leaf, else a process group under gpusweep as child subreaper). When COMMAND
//! ends, or gpusweep gets INT/TERM/HUP (forwarded to the job first), every process still in the job is
//! ended, gpusweep waits until the job's GPUs read zero, says how long that took, and exits with COMMAND's
//! status.
//!
//! The supervisor re-executes itself as `gpusweep run [job PID spec-fd N]` and reads its arguments from a
//! pipe, so `pkill -f COMMAND` never matches it.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};

use super::common::{FAST_POLL, first_snapshots, local_identity, readings_since, runtime};
use super::wait::{watch_for, watch_until_clean};
use crate::act::Deliverer;
use crate::act::job::{self as jobs, Containment};
use crate::analyze::node::unusable;
use crate::core::format::{escape, fmt_bytes, fmt_gpus, fmt_ms, millis};
use crate::core::host::HostSpec;
use crate::core::model::{HostId, HostSnapshot, MIB};
use crate::core::parse::GpuRef;
use crate::core::signal::{Sig, SignalRequest};
use crate::runtime::{Fleet, Settings};
use crate::source::HostCmd;

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// GPUs the job uses. Default: CUDA_VISIBLE_DEVICES, else all.
    #[arg(long, value_name = "LIST", value_parser = super::values::gpu_list_arg)]
    pub gpus: Option<super::values::GpuList>,
    /// Time between TERM and KILL for what is left of the job, and after a forwarded signal.
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = crate::core::parse::duration_arg, allow_hyphen_values = true)]
    pub grace: Duration,
    /// How long to wait for the job's GPUs to read zero after it ends.
    #[arg(long, value_name = "DUR", default_value = "60s", value_parser = crate::core::parse::duration_arg, allow_hyphen_values = true)]
    pub timeout: Duration,
    /// Start even if the GPUs are not clean or /dev/shm is short.
    #[arg(long)]
    pub no_preflight: bool,
    /// When one of the job's GPU processes (a rank) ends and the others still hold GPU memory DUR later
    /// (default 5s), end the whole job (they would wait on it until the collective's timeout) and exit 3.
    /// The wait lets a job that is ending anyway end on its own: ranks of a finished job leave seconds
    /// apart. Give more where the last rank works on after the others (a final checkpoint save).
    #[arg(long, value_name = "DUR", num_args = 0..=1, default_missing_value = "5s", value_parser = crate::core::parse::duration_arg)]
    pub fail_fast: Option<Duration>,
    /// The command and its arguments (after --).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// The exit status of a job `--fail-fast` ended because it lost a rank.
pub const EXIT_LOST_RANK: i32 = 3;

/// NCCL's shared-memory transport: NCCL_BUFFSIZE (4 MiB by default) per channel and peer, two channels.
const NCCL_SHM_PER_PEER: u64 = 2 * 4 * MIB;

/// `CUDA_VISIBLE_DEVICES` as GPU references; an error names a GPU listed twice. "" and "-1" hide every GPU.
pub fn visible_devices(v: &str) -> Result<Vec<String>, String> {
    let items: Vec<String> = v
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    for (i, a) in items.iter().enumerate() {
        if items[..i].contains(a) {
            return Err(format!("CUDA_VISIBLE_DEVICES={v:?} names GPU {a} twice"));
        }
    }
    Ok(items)
}

/// The GPUs the job will use, as references `wait` understands: --gpus, else CUDA_VISIBLE_DEVICES, else all.
fn chosen(a: &RunArgs, snap: &HostSnapshot) -> anyhow::Result<Option<Vec<GpuRef>>> {
    if a.gpus.is_some() {
        return Ok(super::values::chosen(a.gpus.as_ref()));
    }
    let Ok(v) = std::env::var("CUDA_VISIBLE_DEVICES") else {
        return Ok(None);
    };
    let items = visible_devices(&v).map_err(|e| anyhow!(e))?;
    let mut refs = Vec::new();
    for it in &items {
        if it == "-1" || it.starts_with("MIG-") {
            continue;
        }
        let r = crate::core::parse::gpu_refs_arg(it)
            .map_err(|e| anyhow!("CUDA_VISIBLE_DEVICES: {e}"))?;
        refs.extend(r);
    }
    // CUDA stops at the first entry it cannot use; a GPU this host lacks is a mistake to name now.
    if !snap.gpus.is_empty() {
        for r in &refs {
            let known = match r {
                GpuRef::Index(i) => snap.gpu(*i).is_some(),
                GpuRef::Uuid(u) => snap
                    .gpus
                    .iter()
                    .any(|g| g.uuid.as_deref().is_some_and(|x| x.eq_ignore_ascii_case(u))),
            };
            if !known {
                bail!(
                    "CUDA_VISIBLE_DEVICES={v:?} names {r}, which this host does not have (it has GPU {})",
                    fmt_gpus(&snap.gpus.iter().map(|g| g.index).collect::<Vec<_>>())
                );
            }
        }
    }
    Ok((!refs.is_empty()).then_some(refs))
}

/// What must be true before the job starts. Err: why not, naming who holds what.
fn preflight(
    s: &Settings,
    snap: &HostSnapshot,
    watch: &crate::analyze::watch::Watch,
) -> anyhow::Result<()> {
    if !watch.all_clean() {
        bail!(
            "refusing to start: the job's GPUs are not clean: {}",
            watch.remaining().join("; ")
        );
    }
    let n = watch
        .per_host
        .get(&HostId(0))
        .and_then(|sc| sc.gpus.as_ref().map(Vec::len))
        .unwrap_or(snap.gpus.len()) as u64;
    let need = n * n.saturating_sub(1) * NCCL_SHM_PER_PEER;
    if let Some(free) = snap.shm.as_ref().and_then(|i| i.free)
        && free < need
    {
        bail!(
            "refusing to start: {} has {} free; NCCL's shared-memory transport needs about {} for {n} GPUs \
             (2 channels x 4 MiB NCCL_BUFFSIZE per peer)",
            s.fleet.procfs.shm_dir.display(),
            fmt_bytes(Some(free)),
            fmt_bytes(Some(need))
        );
    }
    Ok(())
}

/// INT, TERM and HUP as they arrive, on a thread of its own (gpusweep's own exit-on-signal is not installed
/// for `run`: these signals are the job's to forward).
fn signals() -> mpsc::Receiver<Sig> {
    let (tx, rx) = mpsc::channel();
    let _ = std::thread::Builder::new()
        .name("run-signals".into())
        .spawn(move || {
            use tokio::signal::unix::{SignalKind, signal};
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::terminate()),
                    signal(SignalKind::hangup()),
                ) else {
                    return;
                };
                loop {
                    let s = tokio::select! {
                        _ = int.recv() => Sig::Int,
                        _ = term.recv() => Sig::Term,
                        _ = hup.recv() => Sig::Hup,
                    };
                    if tx.send(s).is_err() {
                        return;
                    }
                }
            });
        });
    rx
}

/// How the wait for COMMAND ended.
enum Stop {
    /// COMMAND ended with this status (`None`: not within the grace after a forwarded signal).
    Ended(Option<jobs::Ended>),
    /// `--fail-fast`: a rank was lost while others hold GPU memory; why, in words.
    LostRank(String),
}

/// Run COMMAND until it ends (or a forwarded signal and the grace after it), or until `lost` says the job
/// lost a rank.
fn supervise(
    child: u32,
    grace: Duration,
    sigs: &mpsc::Receiver<Sig>,
    mut lost: impl FnMut() -> Option<String>,
) -> Stop {
    let pgid = nix::unistd::Pid::from_raw(child.cast_signed());
    let mut deadline: Option<Instant> = None;
    loop {
        if let Some(st) = jobs::reap(child) {
            return Stop::Ended(Some(st));
        }
        if deadline.is_none()
            && let Some(why) = lost()
        {
            return Stop::LostRank(why);
        }
        match sigs.recv_timeout(Duration::from_millis(20)) {
            Ok(sig) => {
                eprintln!(
                    "gpusweep run: {} received: forwarded to the job",
                    sig.name()
                );
                if let Ok(s) = nix::sys::signal::Signal::try_from(sig.number()) {
                    let _ = nix::sys::signal::killpg(pgid, s);
                }
                deadline.get_or_insert_with(|| Instant::now() + grace);
            }
            Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected) => {}
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Stop::Ended(None);
        }
    }
}

/// The job's phase as the host's ledger reads it, said on stderr when it changes (and every 30 s while it
/// loads); with `--fail-fast`, why the job must end when it lost a rank.
struct PhaseWatch {
    me: u32,
    /// `--fail-fast`: how long a rank may stay lost, the others holding on, before the job is ended.
    fail_fast: Option<Duration>,
    /// When the job was first read with a lost rank.
    lost_since: Option<Instant>,
    /// The job's id in the readings, once one of its GPU processes is seen.
    id: Option<String>,
    said: Option<(crate::core::job::Phase, Instant)>,
    /// The reading last looked at.
    content: u64,
    /// Every process seen in the job (its leaf, or the supervisor's descendants): only their loss is the
    /// job's. A process of another job that the readings group with it (a look-alike name) is not.
    members: std::collections::HashSet<u32>,
}

impl PhaseWatch {
    /// Look at the latest reading when a new one came: the status line, and a lost rank.
    fn check(&mut self, fleet: &mut Fleet, contain: &Containment) -> Option<String> {
        use crate::core::job::Phase;
        use crate::runtime::HostEvent;
        let mut new = false;
        while let Some(ev) = fleet.try_recv() {
            new |= matches!(ev, HostEvent::Update { .. });
        }
        if !new {
            return None;
        }
        let latest = fleet.latest(HostId(0))?;
        // A reading that says the same moves nothing, unless a line is due while loading or a lost rank's
        // wait runs.
        if latest.content == self.content
            && self.lost_since.is_none()
            && self.said.is_some_and(|(p, _)| p != Phase::Loading)
        {
            return None;
        }
        self.content = latest.content;
        let snap = &latest.snap;
        self.members.extend(jobs::members(contain, self.me));
        if self.id.is_none() {
            self.id = snap
                .jobs
                .iter()
                .find(|j| j.members().any(|r| self.members.contains(&r.pid)))
                .map(|j| j.id.clone());
        }
        let report = snap.jobs.iter().find(|j| Some(&j.id) == self.id.as_ref())?;
        // Only a rank of this job lost is this job's loss.
        let lost: Vec<&crate::core::job::LostRank> = report
            .lost
            .iter()
            .filter(|l| self.members.contains(&l.pid))
            .collect();
        let now = Instant::now();
        let due = match self.said {
            None => true,
            Some((p, at)) => {
                p != report.phase
                    || (p == Phase::Loading && now.duration_since(at) >= Duration::from_secs(30))
            }
        };
        if due {
            eprintln!(
                "gpusweep run: job {}: {}",
                self.me,
                crate::core::format::phase_line(snap, report)
            );
            self.said = Some((report.phase, now));
        }
        if report.phase != Phase::LostRank || lost.is_empty() {
            self.lost_since = None;
            return None;
        }
        let since = *self.lost_since.get_or_insert(now);
        if self
            .fail_fast
            .is_some_and(|wait| now.duration_since(since) >= wait)
        {
            let lost: Vec<String> = lost
                .iter()
                .map(|l| {
                    format!(
                        "rank {} on GPU {} {}",
                        l.pid,
                        fmt_gpus(&l.gpus),
                        l.how.describe()
                    )
                })
                .collect();
            return Some(format!(
                "{} while {} rank(s) hold {} on GPU {}",
                lost.join(", "),
                report.ranks.len(),
                fmt_bytes(report.bytes),
                fmt_gpus(&report.gpus)
            ));
        }
        None
    }
}

/// End every process still in the job; returns how many there were and how.
fn end_job(c: &Containment, me: u32, d: &Deliverer, grace: Duration) -> (usize, String) {
    let left = jobs::members(c, me);
    if left.is_empty() {
        return (0, String::new());
    }
    let targets: Vec<_> = left.iter().filter_map(|&p| local_identity(p)).collect();
    if let Containment::Cgroup { leaf, kill: true } = c {
        // On record first, as for every signal; cgroup.kill then reaches them all at once, forks included.
        let recorded = targets.iter().all(|t| {
            d.audit
                .record(&d.host, t, Sig::Kill, "cgroup.kill", "sending")
                .is_ok()
        });
        if recorded && jobs::cgroup_kill(leaf).is_ok() {
            return (left.len(), "cgroup.kill".into());
        }
    }
    let outs = d.deliver(&SignalRequest {
        targets,
        signal: Sig::Term,
        grace_ms: Some(millis(grace)),
        purpose: Some(crate::core::action::Purpose::Run),
    });
    for o in outs.iter().filter(|o| o.failed()) {
        eprintln!("gpusweep run: {}", o.describe());
    }
    (
        left.len(),
        format!("TERM, KILL after {}", fmt_ms(millis(grace))),
    )
}

fn status_words(st: Option<jobs::Ended>) -> String {
    st.map_or_else(
        || "did not end within the grace period after the signal".into(),
        |e| e.to_string(),
    )
}

/// A job started: its containment, its GPUs (the chosen references and the indices in scope), its pid.
struct Job {
    me: u32,
    contain: Containment,
    gpus: Option<Vec<GpuRef>>,
    scope: Vec<u32>,
    child: std::process::Child,
    /// What held the job's GPUs before it started (only with --no-preflight): (pid, start time), and a line
    /// naming them. Not the job's: never waited for at its end.
    before: Vec<(u32, u64)>,
    before_line: Option<String>,
}

/// The processes that hold or are listed on `scope`'s GPUs in `snap`, by (pid, start time), and a line that
/// names them by GPU.
fn held_before(snap: &HostSnapshot, scope: &[u32]) -> (Vec<(u32, u64)>, Option<String>) {
    let mut ids = Vec::new();
    let mut parts = Vec::new();
    for g in snap.gpus.iter().filter(|g| scope.contains(&g.index)) {
        let mut pids: Vec<u32> = g.processes.iter().map(|p| p.pid).collect();
        pids.extend(
            snap.holders
                .iter()
                .filter(|h| !h.benign && h.gpus.contains(&g.index))
                .map(|h| h.pid),
        );
        pids.sort_unstable();
        pids.dedup();
        let known: Vec<u32> = pids
            .into_iter()
            .filter_map(|pid| {
                let p = snap.proc(pid)?;
                ids.push((pid, p.start_time));
                Some(pid)
            })
            .collect();
        if !known.is_empty() {
            let list: Vec<String> = known.iter().map(u32::to_string).collect();
            parts.push(format!("GPU {} by pid {}", g.index, list.join(", ")));
        }
    }
    // Without GPU readings (--no-nvml), the holders of the stand-ins in scope.
    if snap.gpus.is_empty() {
        for h in snap.holders.iter().filter(|h| !h.benign) {
            if let Some(p) = snap.proc(h.pid) {
                ids.push((h.pid, p.start_time));
                parts.push(format!("pid {} ({})", h.pid, h.devices.join(" ")));
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    let line = (!parts.is_empty()).then(|| parts.join("; "));
    (ids, line)
}

/// Preflight (unless told not to), contain, start COMMAND.
fn start(s: &Settings, a: &RunArgs, fleet: &Fleet, snaps: &[HostSnapshot]) -> anyhow::Result<Job> {
    let me = std::process::id();
    let snap = &snaps[0];
    if let Some(e) = unusable(snap, s.fleet.load_nvml) {
        bail!("{e}");
    }
    let gpus = chosen(a, snap)?;
    let watch = watch_for(
        fleet,
        snaps,
        gpus.as_deref(),
        None,
        s.fleet.analyze.tolerance,
    )?;
    if !a.no_preflight {
        preflight(s, snap, &watch)?;
    }
    let scope = watch
        .per_host
        .get(&HostId(0))
        .and_then(|sc| sc.gpus.clone())
        .unwrap_or_else(|| snap.gpus.iter().map(|g| g.index).collect());
    let (before, before_line) = held_before(snap, &scope);
    let root = std::env::var_os("GPUSWEEP_CGROUP_ROOT");
    let contain = jobs::contain(me, root.as_deref().map(std::path::Path::new));
    jobs::become_subreaper()?;
    let child = jobs::spawn(&a.command, &contain).map_err(|e| {
        jobs::release(&contain);
        anyhow!("cannot start {}: {e}", escape(&a.command[0]))
    })?;
    eprintln!(
        "gpusweep run: job {me}: {} (pid {}) in {}; GPU {}",
        escape(&a.command.join(" ")),
        child.id(),
        contain.describe(),
        if scope.is_empty() {
            "none known".to_string()
        } else {
            fmt_gpus(&scope)
        }
    );
    Ok(Job {
        me,
        contain,
        gpus,
        scope,
        child,
        before,
        before_line,
    })
}

/// COMMAND ended: end what is left of the job. Returns COMMAND's status and whether the job is empty now.
fn end(
    s: &Settings,
    a: &RunArgs,
    job: &Job,
    status: Option<jobs::Ended>,
    host: &str,
) -> (Option<jobs::Ended>, bool) {
    let Job { me, contain, .. } = job;
    let d = Deliverer {
        host: host.to_string(),
        audit: s.fleet.audit.clone(),
        without_pidfd: s.fleet.kill_without_pidfd,
    };
    let (n, how) = end_job(contain, *me, &d, a.grace);
    let (empty, late) = jobs::await_empty(
        contain,
        *me,
        job.child.id(),
        a.grace + Duration::from_secs(5),
    );
    if n > 0 && status.is_none() {
        eprintln!("gpusweep run: job {me}: {n} process(es) ended ({how})");
    } else if n > 0 {
        eprintln!("gpusweep run: job {me}: {n} process(es) left after the command ended ({how})");
    }
    if empty {
        jobs::release(contain);
    } else {
        let left: Vec<String> = jobs::members(contain, *me)
            .iter()
            .map(u32::to_string)
            .collect();
        eprintln!(
            "gpusweep run: job {me}: still running after KILL: {}",
            left.join(", ")
        );
    }
    (status.or(late), empty)
}

/// The supervisor (re-executed): preflight, contain, run, end, wait for clean.
pub fn supervise_job(s: &Settings, a: &RunArgs) -> anyhow::Result<i32> {
    if s.specs != [HostSpec::Local] {
        bail!("run starts its job on this host: --hosts does not apply");
    }
    let rt = runtime()?;
    let mut fleet =
        rt.block_on(async { Fleet::start(&s.specs, &s.fleet.clone().without_gauges()).await })?;
    let snaps = rt.block_on(first_snapshots(&mut fleet, s.connect_timeout));
    let sigs = signals();
    let job = start(s, a, &fleet, &snaps)?;
    let mut phases = PhaseWatch {
        me: job.me,
        fail_fast: a.fail_fast,
        lost_since: None,
        id: None,
        said: None,
        content: 0,
        members: std::collections::HashSet::new(),
    };
    let stop = supervise(job.child.id(), a.grace, &sigs, || {
        phases.check(&mut fleet, &job.contain)
    });
    let (status, lost) = match stop {
        Stop::Ended(st) => (st, None),
        Stop::LostRank(why) => {
            eprintln!(
                "gpusweep run: job {}: --fail-fast: {why}; ending the job now",
                job.me
            );
            (None, Some(why))
        }
    };
    let ended = Instant::now();
    let ended_ms = crate::core::model::now_ms();
    let (status, empty) = end(s, a, &job, status, fleet.label(HostId(0)));
    // The job's GPUs, watched until they read zero, from readings taken after it ended: the preflight's
    // reading (clean, before the job) says nothing about now. Read at the fast poll: the time to clean is
    // only as exact as the readings (at the default 1 s interval a release was reported 1.0 s late).
    fleet.broadcast(&HostCmd::Interval(FAST_POLL));
    let after = rt.block_on(readings_since(&mut fleet, ended_ms, s.connect_timeout));
    let me = job.me;
    if let Some(e) = after[0].error.as_deref() {
        bail!("job {me}: its GPUs could not be read after it ended: {e}");
    }
    let tolerance = s.fleet.analyze.tolerance;
    let mut watch = watch_for(&fleet, &after, job.gpus.as_deref(), None, tolerance)?;
    // What held the GPUs before the job is not the job's (it could only start with --no-preflight): a GPU
    // only that holds is the job's no longer.
    watch.exempt.clone_from(&job.before);
    // The readings the watch was seeded with are judged again with the exemption: the first reading after the
    // end may be the last new one (readings that say the same are not shown to the watch again).
    if !job.before.is_empty() {
        for (i, snap) in after.iter().enumerate() {
            watch.observe(HostId(i), snap, 0);
        }
    }
    let (clean, watch) =
        rt.block_on(watch_until_clean(&mut fleet, watch, Some(a.timeout), ended))?;
    rt.shutdown_background();
    let code = if lost.is_some() {
        EXIT_LOST_RANK
    } else {
        status.map_or(128 + libc::SIGKILL, jobs::Ended::code)
    };
    Ok(say_end(
        &job,
        status,
        lost.as_deref(),
        clean && empty,
        &watch,
        ended,
        code,
    ))
}

/// The job's last lines: how COMMAND ended, whether its GPUs read zero, why --fail-fast ended it; the exit
/// status (a job that leaves its GPUs dirty never reports success).
fn say_end(
    job: &Job,
    status: Option<jobs::Ended>,
    lost: Option<&str>,
    clean: bool,
    watch: &crate::analyze::watch::Watch,
    ended: Instant,
    code: i32,
) -> i32 {
    let me = job.me;
    let took = fmt_ms(millis(ended.elapsed()));
    if let Some(line) = &job.before_line {
        eprintln!(
            "gpusweep run: job {me}: held before the job started, not the job's and not waited for: {line}"
        );
    }
    let said_lost = || {
        if let Some(why) = lost {
            eprintln!("gpusweep run: job {me}: exit {EXIT_LOST_RANK}: ended by --fail-fast: {why}");
        }
    };
    if clean {
        // Where something held the GPUs before, they may not read zero: only the job's share is gone.
        let what = if job.before.is_empty() {
            "read zero"
        } else {
            "hold nothing of the job's"
        };
        let gpus = if job.scope.is_empty() {
            format!("it held no GPU ({took} after it ended)")
        } else {
            format!("GPU {} {what} {took} after it ended", fmt_gpus(&job.scope))
        };
        eprintln!(
            "gpusweep run: job {me}: COMMAND {}; {gpus}",
            status_words(status)
        );
        said_lost();
        return code;
    }
    eprintln!(
        "gpusweep run: job {me}: COMMAND {}; not clean after {took}: {}",
        status_words(status),
        watch.remaining().join("; ")
    );
    said_lost();
    if code == 0 { 1 } else { code }
}

#[cfg(test)]
mod tests {
    #[test]
    fn visible_devices_duplicates_are_named() {
        assert_eq!(
            super::visible_devices("0, 1,2"),
            Ok(vec!["0".into(), "1".into(), "2".into()])
        );
        assert!(
            super::visible_devices("0,1,0")
                .unwrap_err()
                .contains("GPU 0 twice")
        );
        assert_eq!(super::visible_devices(""), Ok(vec![]));
    }
}
