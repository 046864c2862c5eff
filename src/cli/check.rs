//! `gpusweep check`: a node-problem-detector custom plugin. One reading of each host named (this one by
//! default), one line on stdout, and the plugin protocol's status: 0 OK (no GPU memory held by leftovers),
//! 1 a problem (a GPU held by what no live job explains: which GPU, how much, by whom and which pod or job),
//! 2 unknown (a host or its GPUs could not be read: never an OK).

use std::io::Write;

use super::common::{first_snapshots, readings_since, runtime};
use super::wait::{blind_gate, blind_holders, unusable};
use crate::core::format::{escape, fmt_bytes};
use crate::core::model::{Finding, GpuState, HostSnapshot, Severity};
use crate::runtime::{Fleet, Settings};

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The longest line printed, in bytes (node-problem-detector keeps `max_output_length` bytes, 80 by
    /// default).
    #[arg(long, value_name = "N", default_value_t = 80)]
    pub max_line: usize,
}

/// node-problem-detector's plugin statuses.
pub const OK: i32 = 0;
pub const PROBLEM: i32 = 1;
pub const UNKNOWN: i32 = 2;

/// "GPU 7: 10148 MiB held by 7391 (k8s:3f2a9c1e), ghost": one problem finding in a few words.
fn problem(snap: &HostSnapshot, f: &Finding) -> String {
    let who = f.target_pid.or(f.pid).map(|pid| {
        let job = snap
            .proc(pid)
            .and_then(|p| p.job.as_ref())
            .map(|j| format!(" ({})", escape(&j.short())))
            .unwrap_or_default();
        format!(" by {pid}{job}")
    });
    let gpu = f
        .gpu
        .map_or_else(|| "a GPU".to_string(), |g| format!("GPU {g}"));
    let held = f.bytes.map_or_else(
        || " held".into(),
        |b| format!(" {} held", fmt_bytes(Some(b))),
    );
    format!(
        "{gpu}:{held}{}, {}",
        who.unwrap_or_default(),
        f.kind.as_str()
    )
}

/// When the latest reading with a busy-GPU finding still inside its confirm window was taken, if any.
fn young_busy(snaps: &[HostSnapshot]) -> Option<u64> {
    snaps
        .iter()
        .filter(|s| {
            s.findings.iter().any(|f| {
                f.kind == crate::core::model::FindingKind::BusyWithoutHolder
                    && f.confirms_as.is_some()
            })
        })
        .map(|s| s.taken_at_ms)
        .max()
}

/// A host's status and line.
fn judge(snap: &HostSnapshot, load_nvml: bool) -> (i32, String) {
    if let Some(e) = unusable(snap, load_nvml)
        .or_else(|| blind_holders(snap))
        .or_else(|| blind_gate(snap))
    {
        return (UNKNOWN, format!("unknown: {e}"));
    }
    let host = escape(&snap.host);
    // A GPU that could not be judged (its reading failed, its MIG instances unread) is never an OK.
    let unread: Vec<String> = snap
        .gpus
        .iter()
        .filter(|g| matches!(g.state, Some(GpuState::Unknown | GpuState::Error)))
        .map(|g| {
            let why = g
                .error
                .as_deref()
                .or(g.mig_error.as_deref())
                .unwrap_or("not judged");
            format!("GPU {} ({})", g.index, escape(why))
        })
        .collect();
    if !unread.is_empty() {
        return (
            UNKNOWN,
            format!("unknown: {host}: {} could not be judged", unread.join(", ")),
        );
    }
    // Not ready for a launch whatever its memory says: a problem, with why.
    if let Some(g) = snap
        .gpus
        .iter()
        .find(|g| g.state == Some(GpuState::NeedsReset))
    {
        let why =
            crate::analyze::state::needs_reset(g).unwrap_or_else(|| "as its host judged it".into());
        return (
            PROBLEM,
            format!("{host}: GPU {} needs a reset: {}", g.index, escape(&why)),
        );
    }
    let leaks: Vec<&Finding> = snap
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Leak)
        .collect();
    if let Some(first) = leaks.first() {
        let more = if leaks.len() > 1 {
            format!(" (+{} more)", leaks.len() - 1)
        } else {
            String::new()
        };
        return (PROBLEM, format!("{host}: {}{more}", problem(snap, first)));
    }
    let in_use = snap
        .gpus
        .iter()
        .filter(|g| g.memory.used.is_some_and(|u| u > 0))
        .count();
    (
        OK,
        format!(
            "{host}: ok, {} GPU(s), {in_use} in use by live processes, none held by leftovers",
            snap.gpus.len()
        ),
    )
}

pub fn run(s: &Settings, a: &CheckArgs) -> anyhow::Result<i32> {
    let opts = s.fleet_via_serve().without_gauges();
    crate::runtime::load_local_early(&s.specs, &opts);
    let rt = runtime()?;
    let confirm_ms = opts.analyze.confirm_ms;
    let snaps = rt.block_on(async {
        let mut fleet = Fleet::start(&s.specs, &opts).await?;
        let first = first_snapshots(&mut fleet, s.connect_timeout).await;
        // A GPU at work for nobody is judged only once it has lasted the confirm window (one reading of
        // utilization is a sample of the last second, which a job that just ended fills): read again then.
        let Some(since) = young_busy(&first).map(|t| t.saturating_add(confirm_ms)) else {
            return anyhow::Ok(first);
        };
        let wait = since.saturating_sub(crate::core::model::now_ms());
        tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        anyhow::Ok(readings_since(&mut fleet, since, s.connect_timeout).await)
    })?;
    rt.shutdown_background();
    // The worst host decides: unknown over a problem over OK (an unread host is never an OK).
    let judged: Vec<(i32, String)> = snaps.iter().map(|h| judge(h, s.fleet.load_nvml)).collect();
    let rank = |c: i32| match c {
        UNKNOWN => 2,
        PROBLEM => 1,
        _ => 0,
    };
    let (code, line) = judged
        .into_iter()
        .max_by_key(|(c, _)| rank(*c))
        .unwrap_or((UNKNOWN, "unknown: no host read".into()));
    writeln!(
        std::io::stdout().lock(),
        "{}",
        crate::core::format::truncate_bytes(&line, a.max_line)
    )?;
    Ok(code)
}
