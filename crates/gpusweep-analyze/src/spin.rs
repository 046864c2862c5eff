//! Whether a GPU works or spins. A rank waiting in a collective runs a kernel that polls a flag: NVML's
//! utilization ("a kernel was running") reads it busy while the GPU does no arithmetic, moves no memory and
//! draws little more than idle power. Measured on an H100 (driver 580): a bf16 matmul loop 81% busy with GPM
//! SM activity 79%, tensor 77%, 598 W; a one-thread spin kernel 83% busy with SM 0.6%, tensor 0, DRAM 0,
//! 109 W; a copy loop 82% busy, SM 76%, DRAM 66%. GPM's activity ratios (Hopper and later, outside MIG) tell
//! them apart; utilization and power alone do not, so a GPU without GPM says nothing either way.

use gpusweep_core::model::{Counters, Gpu};

/// Busy enough to be working or waiting (NVML utilization, percent).
pub const BUSY_PCT: u32 = 50;
/// GPM's ratios below which a busy GPU does no work: SM (graphics engine) activity, tensor activity,
/// DRAM bandwidth. A spin kernel keeps one SM's thread alive: ~0.6% of the SM activity on an H100.
pub const SM_IDLE: f64 = 0.05;
pub const TENSOR_IDLE: f64 = 0.01;
pub const DRAM_IDLE: f64 = 0.02;

/// What a GPU does, as far as a reading says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spin {
    /// Utilization unread (a reading without gauges): nothing to say.
    Unread,
    /// Not busy: idle, or its job works on the CPU (loading, compiling, a checkpoint).
    Idle,
    /// Busy, and its activity ratios show work.
    Working,
    /// Busy with no work: a kernel waiting (a collective, a barrier).
    Spinning,
    /// Busy, and no GPM sample yet to tell which (the first reading of a sampler).
    NotYet,
    /// Busy, and the GPU gives no activity ratios (before Hopper, MIG, a driver without GPM, a remote host
    /// read without them): working or spinning cannot be told.
    NoSignal,
}

/// What `g` does.
pub fn of(g: &Gpu) -> Spin {
    of_gauges(g.utilization, g.counters.as_deref())
}

/// What a GPU of this utilization and these counters does.
pub fn of_gauges(utilization: Option<u32>, counters: Option<&Counters>) -> Spin {
    let Some(util) = utilization else {
        return Spin::Unread;
    };
    if util < BUSY_PCT {
        return Spin::Idle;
    }
    let Some(c) = counters.filter(|c| c.gpm_supported != Some(false)) else {
        return Spin::NoSignal;
    };
    match (c.gr_engine_active, c.tensor_active, c.dram_active) {
        (Some(sm), Some(tensor), Some(dram)) => {
            if sm < SM_IDLE && tensor < TENSOR_IDLE && dram < DRAM_IDLE {
                Spin::Spinning
            } else {
                Spin::Working
            }
        }
        _ => Spin::NotYet,
    }
}

/// Whether some GPU that holds a process now does another thing (`of`) than it did in `before`: spinning,
/// working and idle are what a job's hang is told by, and gauges alone do not make a reading new, so a
/// reading whose GPUs changed what they do is judged again. Never for a host judged where it runs.
/// `next`: each GPU's utilization and counters, in order.
pub fn moved<'a>(
    before: &gpusweep_core::model::HostSnapshot,
    next: impl ExactSizeIterator<Item = (Option<u32>, Option<&'a Counters>)>,
) -> bool {
    !before.source.judged_remotely()
        && before.gpus.len() == next.len()
        && before
            .gpus
            .iter()
            .zip(next)
            .any(|(a, (util, c))| !a.processes.is_empty() && of(a) != of_gauges(util, c))
}

/// What a set of GPUs read, for a person: "busy 100% at 78 W, SM 0.6%, tensor 0%, DRAM 0%" (the busiest,
/// the total power where read, the highest of each ratio).
pub fn evidence<'a>(gpus: impl Iterator<Item = &'a Gpu>) -> String {
    let mut util = 0u32;
    let mut watts: Option<u64> = None;
    let (mut sm, mut tensor, mut dram) = (0f64, 0f64, 0f64);
    for g in gpus {
        util = util.max(g.utilization.unwrap_or(0));
        if let Some(mw) = g.power_mw {
            watts = Some(watts.unwrap_or(0) + u64::from(mw) / 1000);
        }
        if let Some(c) = g.counters.as_deref() {
            sm = sm.max(c.gr_engine_active.unwrap_or(0.0));
            tensor = tensor.max(c.tensor_active.unwrap_or(0.0));
            dram = dram.max(c.dram_active.unwrap_or(0.0));
        }
    }
    let power = watts.map_or(String::new(), |w| format!(" at {w} W"));
    format!(
        "busy {util}%{power}, SM {:.1}%, tensor {:.1}%, DRAM {:.1}%",
        sm * 100.0,
        tensor * 100.0,
        dram * 100.0
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(util: Option<u32>, ratios: Option<(f64, f64, f64)>) -> Gpu {
        Gpu {
            utilization: util,
            power_mw: Some(109_000),
            counters: ratios.map(|(sm, tensor, dram)| {
                Box::new(Counters {
                    gr_engine_active: Some(sm),
                    tensor_active: Some(tensor),
                    dram_active: Some(dram),
                    ..Counters::default()
                })
            }),
            ..Gpu::default()
        }
    }

    /// The H100's four loads (issue 62's table) read as they should.
    #[test]
    fn the_measured_loads_read_as_what_they_are() {
        assert_eq!(of(&gpu(Some(0), Some((0.0, 0.0, 0.0)))), Spin::Idle);
        assert_eq!(
            of(&gpu(Some(81), Some((0.79, 0.767, 0.196)))),
            Spin::Working,
            "matmul"
        );
        assert_eq!(
            of(&gpu(Some(83), Some((0.006, 0.0, 0.0)))),
            Spin::Spinning,
            "spin kernel"
        );
        assert_eq!(
            of(&gpu(Some(82), Some((0.76, 0.0, 0.66)))),
            Spin::Working,
            "copy loop"
        );
        assert_eq!(of(&gpu(Some(83), None)), Spin::NoSignal, "no GPM");
        assert_eq!(of(&gpu(None, None)), Spin::Unread);
        let mut first = gpu(Some(83), None);
        first.counters = Some(Box::default());
        assert_eq!(of(&first), Spin::NotYet);
        first.counters = Some(Box::new(Counters {
            gpm_supported: Some(false),
            ..Counters::default()
        }));
        assert_eq!(
            of(&first),
            Spin::NoSignal,
            "dcgm-exporter's counters, no GPM"
        );
        let e = evidence([gpu(Some(83), Some((0.006, 0.0, 0.0)))].iter());
        assert_eq!(e, "busy 83% at 109 W, SM 0.6%, tensor 0.0%, DRAM 0.0%");
    }
}
