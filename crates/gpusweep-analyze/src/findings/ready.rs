//! A GPU not ready for a launch whatever its memory says: an XID after which NVIDIA's guidance is a reset
//! was seen since its host began watching, or the driver's recovery action asks for a reset or a reboot.
//! Its own finding, apart from any leak, with the reset's plan (who would block it).

use super::{Draft, Findings};
use crate::index::Indexed;
use gpusweep_core::model::{FindingKind, Severity};

pub fn find(snap: &Indexed<'_>, out: &mut Findings) {
    for g in &snap.gpus {
        let Some(why) = crate::state::needs_reset(g) else {
            continue;
        };
        out.push(Draft {
            kind: FindingKind::NeedsReset,
            severity: Severity::Leak,
            gpu: Some(g.index),
            pid: None,
            bytes: None,
            detail: format!("GPU {} is not ready for a launch: {why}", g.index),
            action: crate::reset::plan(snap, g),
            target_pid: None,
        });
    }
}
