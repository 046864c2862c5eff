//! The one protection rule, built for this host: PID 1, gpusweep itself and its ancestors.

use std::fs;

use gpusweep_core::procstat::parse_stat;
use gpusweep_core::signal::Protected;

/// PIDs never signalled from this process.
pub fn this_host() -> Protected {
    let me = std::process::id();
    let mut ancestors = Vec::new();
    let mut cur = me;
    for _ in 0..128 {
        let Ok(s) = fs::read_to_string(format!("/proc/{cur}/stat")) else {
            break;
        };
        let Some(p) = parse_stat(&s) else { break };
        if p.ppid == 0 || ancestors.contains(&p.ppid) {
            break;
        }
        ancestors.push(p.ppid);
        cur = p.ppid;
    }
    Protected::local(me, ancestors)
}
