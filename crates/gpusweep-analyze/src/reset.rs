//! Who would block a GPU reset (`nvidia-smi -r`) or a MIG destroy: every process with the GPU's device node
//! open, and every one with only a control node open (`/dev/nvidiactl`, `/dev/nvidia-uvm`: a driver client
//! that may hold any GPU), benign ones included. The persistence daemon, DCGM's host engine and a display
//! server make a reset fail "in use by another client" as surely as a job does, and nobody names them.

use gpusweep_core::escape::escape;
use gpusweep_core::model::{Gpu, HostSnapshot, ResetBlocker};

/// The blockers of one GPU, by PID.
pub fn blockers(snap: &HostSnapshot, g: &Gpu) -> Vec<ResetBlocker> {
    let node = format!("/dev/nvidia{}", g.minor.unwrap_or(g.index));
    let mut out: Vec<ResetBlocker> = snap
        .holders
        .iter()
        .filter_map(|h| {
            let via = if h.gpus.contains(&g.index) {
                node.clone()
            } else if h.gpus.is_empty() {
                h.devices.first()?.clone()
            } else {
                return None;
            };
            Some(ResetBlocker {
                pid: h.pid,
                program: snap.proc(h.pid).map(program).unwrap_or_default(),
                node: via,
                benign: h.benign,
            })
        })
        .collect();
    out.sort_by_key(|b| b.pid);
    out
}

/// What a process runs, as a blocker is named: its comm (cut at 15 bytes by the kernel), or the name its
/// argv[0] starts with where that name is longer and begins with the comm ("nvidia-persistenced").
fn program(p: &gpusweep_core::model::Proc) -> String {
    let argv0 = p.cmdline.split(' ').next().unwrap_or("");
    let base = argv0.rsplit('/').next().unwrap_or("");
    if !p.comm.is_empty() && base.len() > p.comm.len() && base.starts_with(&p.comm) {
        base.to_string()
    } else {
        p.comm.clone()
    }
}

/// Every GPU's blockers, in the reading (with its verdict).
pub fn fill(snap: &mut HostSnapshot) {
    if !snap.holders_known() {
        return;
    }
    let all: Vec<Vec<ResetBlocker>> = snap.gpus.iter().map(|g| blockers(snap, g)).collect();
    for (g, b) in snap.gpus.iter_mut().zip(all) {
        g.reset_blockers = b;
    }
}

/// "to reset GPU 3, stop: 812 (nvidia-persistenced), 1290 (nv-hostengine)", or that nothing blocks it. Where
/// holders could not be read, it says so rather than "nothing".
pub fn plan(snap: &HostSnapshot, g: &Gpu) -> String {
    let how = format!("nvidia-smi -r -i {}", g.index);
    let advice = match g.recovery_action.as_deref() {
        Some("node_reboot") => "; the driver asks for a node reboot",
        Some("drain_p2p" | "drain_and_reset") => "; the driver asks to drain the node first",
        _ => "",
    };
    if !snap.holders_known() {
        return format!(
            "to reset GPU {} ({how}), stop whatever has it open (which processes do could not be read){advice}",
            g.index
        );
    }
    // From the reading's holders: a finding asks before the reading's blockers are filled in.
    let blockers = blockers(snap, g);
    if blockers.is_empty() {
        return format!("reset GPU {} ({how}): nothing has it open{advice}", g.index);
    }
    let who: Vec<String> = blockers
        .iter()
        .map(|b| {
            let via = if b.node == format!("/dev/nvidia{}", g.minor.unwrap_or(g.index)) {
                String::new()
            } else {
                format!(", via {}", b.node)
            };
            format!("{} ({}{via})", b.pid, escape(&b.program))
        })
        .collect();
    format!(
        "to reset GPU {} ({how}), stop: {}{advice}",
        g.index,
        who.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusweep_core::model::{Holder, Proc};

    #[test]
    fn benign_openers_and_control_node_clients_block_a_reset_others_gpus_do_not() {
        let holder = |pid, gpus: Vec<u32>, dev: &str, benign| Holder {
            pid,
            gpus,
            devices: vec![dev.into()],
            fd_count: 1,
            benign,
            ..Default::default()
        };
        let proc = |pid, comm: &str| Proc {
            pid,
            comm: comm.into(),
            ..Default::default()
        };
        let mut snap = HostSnapshot {
            gpus: vec![
                Gpu {
                    index: 0,
                    minor: Some(0),
                    ..Default::default()
                },
                Gpu {
                    index: 3,
                    minor: Some(3),
                    ..Default::default()
                },
            ],
            holders: vec![
                holder(812, vec![0, 3], "/dev/nvidia0", true),
                holder(900, vec![], "/dev/nvidiactl", false),
                holder(950, vec![0], "/dev/nvidia0", false),
            ],
            processes: vec![
                proc(812, "nvidia-persistenced"),
                proc(900, "python3"),
                proc(950, "python3"),
            ],
            ..Default::default()
        };
        fill(&mut snap);
        let g3 = &snap.gpus[1];
        let pids: Vec<u32> = g3.reset_blockers.iter().map(|b| b.pid).collect();
        assert_eq!(pids, [812, 900]);
        assert_eq!(
            plan(&snap, g3),
            "to reset GPU 3 (nvidia-smi -r -i 3), stop: 812 (nvidia-persistenced), 900 (python3, via /dev/nvidiactl)"
        );
        assert_eq!(snap.gpus[0].reset_blockers.len(), 3);
        // Holders unread: no "nothing has it open".
        snap.missing_features
            .push(gpusweep_core::model::Feature::Holders);
        assert!(plan(&snap, &snap.gpus[1]).contains("could not be read"));
    }
}
