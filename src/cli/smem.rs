//! `gpusweep smem`: shared-memory limits per compute capability, and whether a GEMM tile fits.

use std::collections::BTreeMap;

use anyhow::bail;

use super::common::{first_snapshots, runtime};
use crate::core::smem::{self, Dtype, Tile};
use crate::runtime::{Fleet, Settings};

#[derive(Debug, clap::Args)]
pub struct SmemArgs {
    /// Tile as MxNxK, e.g. 128x256x64.
    #[arg(long, value_parser = super::values::tile_arg)]
    pub tile: Option<Tile>,
    /// Element type of A and B: bf16, fp16, fp8, fp4, fp32.
    #[arg(long, default_value = "bf16", value_parser = super::values::dtype_arg)]
    pub dtype: Dtype,
    /// Pipeline stages wanted (1 to 64).
    #[arg(long, default_value_t = 2, allow_hyphen_values = true,
          value_parser = clap::value_parser!(u64).range(1..=64))]
    pub stages: u64,
    /// Bytes set aside for the epilogue (at most 16 MiB).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true,
          value_parser = clap::value_parser!(u64).range(0..=16 * 1024 * 1024))]
    pub epilogue: u64,
    /// Compute capability (e.g. 12.0). Default: the GPUs of the chosen hosts, else every known one.
    #[arg(long)]
    pub cc: Option<String>,
    /// Limits and fits as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The compute capabilities to show, each with the GPUs (`host:index`) it was seen on: --cc, else the chosen
/// hosts' GPUs, else all.
fn capabilities(
    s: &Settings,
    a: &SmemArgs,
    explicit_hosts: bool,
) -> anyhow::Result<Vec<(String, Vec<String>)>> {
    let mut ccs: Vec<(String, Vec<String>)> = Vec::new();
    if let Some(typed) = a.cc.as_deref() {
        let Some(cc) = smem::normalize_cc(typed).filter(|c| smem::limits(c).is_some()) else {
            bail!(
                "--cc {typed}: unknown compute capability (known: {}; sm_90 and 12 are read as 9.0 and 12.0)",
                smem::TABLE
                    .iter()
                    .map(|r| r.cc)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        };
        ccs.push((cc, Vec::new()));
    } else {
        let rt = runtime()?;
        let snaps = rt.block_on(async {
            let mut fleet = Fleet::start(&s.specs, &s.fleet.clone().without_gauges()).await?;
            anyhow::Ok(first_snapshots(&mut fleet, s.connect_timeout).await)
        })?;
        rt.shutdown_background();
        let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for snap in &snaps {
            for g in &snap.gpus {
                if let Some(cc) = &g.compute_capability {
                    by.entry(cc.clone()).or_default().push(format!(
                        "{}:{}",
                        crate::core::escape::escape(&snap.host),
                        g.index
                    ));
                }
            }
        }
        ccs.extend(by);
        if ccs.is_empty() {
            if explicit_hosts || s.demo {
                eprintln!(
                    "gpusweep: no GPU compute capability could be read; showing every known one"
                );
            }
            ccs = smem::TABLE
                .iter()
                .map(|r| (r.cc.to_string(), Vec::new()))
                .collect();
        }
    }
    Ok(ccs)
}

/// Exit 0 when the tile fits every capability shown (or no tile was asked about), 1 when it does not fit one.
pub fn run(s: &Settings, a: &SmemArgs, explicit_hosts: bool) -> anyhow::Result<i32> {
    if a.stages == 0 {
        bail!("--stages: at least 1");
    }
    let mut misfit = false;
    let dtype = a.dtype;
    let tile = a.tile;
    let ccs = capabilities(s, a, explicit_hosts)?;
    let mut rows = Vec::new();
    for (cc, at) in &ccs {
        let Some(l) = smem::limits(cc) else {
            rows.push(
                serde_json::json!({"cc": cc, "gpus": at, "error": "unknown compute capability"}),
            );
            continue;
        };
        let fit = tile.map(|t| smem::fit(l, t, dtype, a.stages, a.epilogue));
        misfit |= fit.as_ref().is_some_and(|f| !f.fits);
        rows.push(serde_json::json!({"cc": cc, "gpus": at, "limits": l, "fit": fit}));
        if !a.json {
            println!(
                "CC {:<5} {:<34} per SM {:>7} B  per block {:>7} B (opt-in), {} B default  regs/SM {}{}",
                l.cc,
                l.family,
                smem::group(u64::from(l.per_sm)),
                smem::group(u64::from(l.per_block_optin)),
                smem::group(u64::from(l.per_block_default)),
                l.registers_per_sm,
                if at.is_empty() {
                    String::new()
                } else {
                    format!("  [{}]", at.join(" "))
                }
            );
            if let Some(f) = &fit {
                println!(
                    "    tile {} {}: {}",
                    a.tile
                        .map(|t| format!("{}x{}x{}", t.m, t.n, t.k))
                        .unwrap_or_default(),
                    dtype.name(),
                    f.sentence()
                );
            }
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "dtype": dtype.name(), "stages": a.stages, "epilogue": a.epilogue, "rows": rows })
            )?
        );
    }
    Ok(i32::from(misfit))
}
