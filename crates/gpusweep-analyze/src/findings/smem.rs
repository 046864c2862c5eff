//! One note per compute capability whose per-block shared memory is below Hopper's.

use std::collections::BTreeMap;

use super::{Draft, Findings};
use crate::index::Indexed;
use gpusweep_core::model::{FindingKind, Gpu, Severity};
use gpusweep_core::smem;

pub fn find(snap: &Indexed<'_>, out: &mut Findings) {
    let mut by_cc: BTreeMap<String, Vec<&Gpu>> = BTreeMap::new();
    for g in &snap.gpus {
        if let Some(cc) = &g.compute_capability {
            by_cc.entry(cc.clone()).or_default().push(g);
        }
    }
    for (cc, gpus) in by_cc {
        let Some(l) = smem::limits(&cc) else { continue };
        if l.per_block_optin >= smem::HOPPER_PER_BLOCK {
            continue;
        }
        let name = gpus[0].name.clone().unwrap_or_else(|| "GPU".into());
        let idx = gpus
            .iter()
            .map(|g| g.index.to_string())
            .collect::<Vec<_>>()
            .join(",");
        out.push(Draft {
            kind: FindingKind::SmemLimit,
            severity: Severity::Info,
            gpu: None,
            pid: None,
            bytes: Some(u64::from(l.per_block_optin)),
            detail: format!(
                "GPU {idx} ({name}, CC {cc}): {} KB shared memory per block, against 227 KB on H100/H200; tiles tuned for Hopper may not fit",
                l.per_block_optin / 1024
            ),
            action: format!("check kernel tiles with `gpusweep smem --cc {cc} --tile MxNxK`"),
            target_pid: None,
        });
    }
}
