//! How a GPU reads: clean, in use, leaking, or unknown. How each is shown belongs to `core::format`.

use super::AnalyzeOptions;
pub use crate::core::model::GpuState;
use crate::core::model::{FindingKind, Gpu, HostSnapshot};

/// DESIGN's "clean": used at or under the tolerance and nothing listed. `None` when it cannot be told.
pub fn gpu_clean(g: &Gpu, tolerance: u64) -> Option<bool> {
    // Judged by the host's own gpusweep (a host read from Prometheus): its verdict, not a guess from totals.
    if let Some(j) = g.judged {
        return match j {
            GpuState::Clean => Some(true),
            GpuState::InUse | GpuState::Leak => Some(false),
            GpuState::Unknown | GpuState::Error => None,
        };
    }
    if g.error.is_some() && g.memory.used.is_none() {
        return None;
    }
    g.memory
        .used
        .map(|u| u <= tolerance && g.processes.is_empty())
}

pub fn gpu_state(snap: &HostSnapshot, g: &Gpu, opts: &AnalyzeOptions) -> GpuState {
    if let Some(j) = g.judged {
        return j;
    }
    if g.error.is_some() && g.memory.used.is_none() {
        return GpuState::Error;
    }
    match gpu_clean(g, opts.tolerance) {
        None => GpuState::Unknown,
        Some(true) => GpuState::Clean,
        Some(false) => {
            let leaking = snap.findings.iter().any(|f| {
                f.gpu == Some(g.index)
                    && matches!(
                        f.kind,
                        FindingKind::Ghost | FindingKind::Residual | FindingKind::HiddenHolder
                    )
            });
            if leaking {
                GpuState::Leak
            } else {
                GpuState::InUse
            }
        }
    }
}
