//! `gpusweep check`: a node-problem-detector custom plugin. One reading of each host named (this one by
//! default), one line on stdout, and the plugin protocol's status: 0 OK (no GPU memory held by leftovers),
//! 1 a problem (a GPU held by what no live job explains: which GPU, how much, by whom and which pod or job),
//! 2 unknown (a host or its GPUs could not be read: never an OK).

use std::io::Write;

use super::common::{first_snapshots, readings_since, runtime};
use crate::analyze::node::{Gate, node_verdict};
use crate::core::model::HostSnapshot;
use crate::runtime::{Fleet, Settings};

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The longest line printed, in bytes (node-problem-detector keeps `max_output_length` bytes, 80 by
    /// default).
    #[arg(long, value_name = "N", default_value_t = 80)]
    pub max_line: usize,
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
    let (gate, line) = snaps
        .iter()
        .map(|h| node_verdict(h, s.fleet.load_nvml))
        .map(|v| (v.gate, v.line))
        .max_by_key(|(g, _)| *g)
        .unwrap_or((Gate::Unknown, "unknown: no host read".into()));
    writeln!(
        std::io::stdout().lock(),
        "{}",
        crate::core::format::truncate_bytes(&line, a.max_line)
    )?;
    Ok(gate.code())
}
