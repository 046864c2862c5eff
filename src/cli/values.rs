//! The value parsers the subcommands' arguments share (GPU lists, MiB, signals, tiles, dtypes), apart from
//! the command enum in `args.rs`: a subcommand imports these, and `args.rs` imports the subcommands.

use crate::core::signal::Sig;
use crate::core::smem::{Dtype, Tile};

/// A `--gpus` list as one value (clap would take a bare `Vec` for repeated values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuList(Vec<crate::core::parse::GpuRef>);

impl GpuList {
    /// The GPUs named; None for `all` (every GPU of every host read, as `NVIDIA_VISIBLE_DEVICES=all` says).
    pub fn chosen(&self) -> Option<&[crate::core::parse::GpuRef]> {
        (!self.0.is_empty()).then_some(self.0.as_slice())
    }
}

/// `--gpus` of a command: the GPUs named, or None for every GPU (no `--gpus`, or `--gpus all`).
pub fn chosen(g: Option<&GpuList>) -> Option<Vec<crate::core::parse::GpuRef>> {
    g.and_then(GpuList::chosen).map(<[_]>::to_vec)
}

/// A value clap could not take, said in the operator's terms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("unknown dtype {0:?} (bf16, fp16, fp8, fp4, fp32)")]
    Dtype(String),
    #[error("{0:?} is not a whole number of MiB (e.g. 0, 512)")]
    Mib(String),
    #[error("{0} MiB is more than any GPU has (at most {MAX_TOLERANCE_MIB})")]
    TooMuch(u64),
}

/// clap value parser for GPU lists: indices, ranges and UUIDs.
/// A GPU list, or `all` (what `NVIDIA_VISIBLE_DEVICES` holds for a pod given every GPU).
pub(crate) fn gpu_list_arg(s: &str) -> Result<GpuList, crate::core::parse::ParseError> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(GpuList(Vec::new()));
    }
    crate::core::parse::gpu_refs_arg(s).map(GpuList)
}

pub(crate) fn dtype_arg(s: &str) -> Result<Dtype, ValueError> {
    Dtype::parse(s).ok_or_else(|| ValueError::Dtype(s.to_string()))
}

pub(crate) fn tile_arg(s: &str) -> Result<Tile, crate::core::smem::TileError> {
    Tile::parse(s)
}

/// The most a tolerance may be: a petabyte of GPU memory is more than any host has.
const MAX_TOLERANCE_MIB: u64 = 1 << 30;

pub(crate) fn mib_arg(s: &str) -> Result<u64, ValueError> {
    let n: u64 = s
        .trim()
        .parse()
        .map_err(|_| ValueError::Mib(s.to_string()))?;
    if n > MAX_TOLERANCE_MIB {
        return Err(ValueError::TooMuch(n));
    }
    Ok(n)
}

pub(crate) fn signal_arg(s: &str) -> Result<Sig, crate::core::signal::UnknownSignal> {
    s.parse::<Sig>()
}
