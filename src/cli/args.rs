//! Command-line contract (DESIGN's names): the subcommands of the CLI front end, each with the `Args` struct
//! its module runs with (used as clap parsed it, never copied field by field), and the exit codes (the value
//! parsers they share are in `values.rs`, which the subcommands import without importing this). The binary adds `serve` and `agent` (front ends of their own) and the global options
//! (`runtime::Overrides`). Every flag that has an environment variable says so in --help.

use clap::Subcommand;

pub const EXIT_CODES: &str = "\
Exit codes:
  0  success; `wait`, `sweep`: every chosen GPU of every host was
     read and is clean; `smem --tile`: the tile fits every capability
  1  `wait`/`sweep` timed out with memory still held (the holders are
     printed); `sweep --no-wait`, `kill`: a target could not be
     signalled (refused, failed, still there after KILL);
     `smem --tile`: it does not fit
  2  error: bad arguments or config; a host that could not be read;
     GPUs that cannot be read (no driver) unless --no-nvml; a GPU a
     host lacks; a --job that names no process; the action was not
     confirmed; --readonly refused it
  3  `run --fail-fast`: the job lost a rank while its other ranks
     held GPU memory, and was ended
  129/130/143  ended by HUP, INT or TERM (128 + the signal)

Findings:
  ghost          NVML charges memory to a PID that is gone: kill
                 the holder it names
  hidden_holder  a live process holds the GPU, unlisted, and memory
                 is unexplained: kill it
  residual       used memory no live listed process accounts for:
                 sweep it
  orphan         a GPU holder whose launcher died (reparented to
                 PID 1): kill it if its job is over
  orphaned_job   a GPU holder of a job that is over:
                 `gpusweep sweep --job JOB`
  zombie         state Z, holds nothing: its parent (named) must
                 reap it
  unkillable     a GPU holder in state D: no signal ends it until
                 its I/O returns
  shm_leftover   a /dev/shm nccl-*/torch_*/psm_*/sem.* file nobody
                 has open or mapped: `gpusweep shm clean`
  smem_limit     less shared memory per block than Hopper's 227 KB:
                 check tiles with `gpusweep smem`
  not_visible    a listed PID in another PID namespace: run gpusweep
                 there
  lost_rank      a job's rank ended while its other ranks hold GPU
                 memory (they wait on it): `gpusweep sweep --job JOB`
  straggler      a rank loading far behind its peers: watch it, or
                 end the job
  busy_without_holder
                 a GPU busy with no process listed or holding it:
                 reset the GPU (who would block it is named)
  needs_reset    an XID or the driver says the GPU needs a reset or
                 a reboot before a launch";

pub const ABOUT: &str = "Who holds this GPU memory, and is it gone yet?";
pub const LONG_ABOUT: &str = "Watches GPU memory on one or many hosts, explains every MiB (which live process \
holds it, or that nobody does), kills leftovers precisely, and re-watches until every GPU reads zero.\n\n\
With no subcommand it opens the terminal UI. Where no NVIDIA driver exists and no hosts are named, the TUI \
opens the simulated demo cluster (--local watches this host's holders, zombies and /dev/shm instead); the \
subcommands always read what they are asked to.";

/// The CLI front end's subcommands.
#[derive(Debug, Subcommand)]
pub enum CliCommand {
    /// One reading of every host: GPUs, processes, holders, findings. A table, or --json.
    Snapshot(super::snapshot::SnapshotArgs),
    /// A node-problem-detector plugin: one line, exit 0 OK, 1 a GPU held by leftovers (which, how much, by
    /// whom, which pod), 2 unknown (the host or its GPUs could not be read).
    Check(super::check::CheckArgs),
    /// Block until every chosen GPU is clean. Exit 0 clean, 1 timeout (naming what holds memory), 2 error.
    Wait(super::wait::WaitArgs),
    /// End the leftovers of the chosen GPUs (a live job only with --job or --live): TERM, a grace period,
    /// KILL; then wait until they are gone.
    Sweep(super::sweep::SweepArgs),
    /// Signal chosen processes with the same safety as sweep.
    Kill(super::kill::KillArgs),
    /// Shared-memory limits per compute capability, and whether a GEMM tile fits.
    Smem(super::smem::SmemArgs),
    /// Run COMMAND as a job that cannot leak: preflight, a cgroup (or a subreaper) of its own, every
    /// leftover ended when it ends, then wait until its GPUs read zero. Exits with COMMAND's status.
    #[command(
        after_help = "Containment: a cgroup v2 leaf under gpusweep's own cgroup where it may create one \
(root, or a delegated systemd user slice), ended with cgroup.kill; otherwise a process group with gpusweep as \
child subreaper, so double-forked workers are reparented to it, not PID 1. INT, TERM and HUP are forwarded to \
the job first. The supervisor shows as `gpusweep run [job PID ...]`: `pkill -f COMMAND` never hits it."
    )]
    Run(super::run::RunArgs),
    /// Slurm Prolog=: exit 1, naming the holder (and drain the node), when the job's GPUs are not clean.
    Prolog(super::slurm::GateArgs),
    /// Slurm Epilog=: end the job's leftover processes, wait until its GPUs read zero; else exit 1 with a
    /// one-line reason and drain the node with it.
    Epilog(super::slurm::GateArgs),
    /// /dev/shm leftovers of the GPU stack (nccl-*, torch_*, psm_*, sem.*...).
    Shm {
        #[command(subcommand)]
        action: ShmAction,
    },
}

#[derive(Debug, Subcommand)]
pub enum ShmAction {
    /// Remove the files no live process has open or mapped, on every chosen host, after a confirmation.
    /// Each is re-checked at removal (same inode, a plain file, still unused) and logged in the audit log.
    /// Exit 0 removed (or nothing to remove), 1 a file refused or failed, 2 a host unreadable or not confirmed.
    Clean(super::shm::CleanArgs),
}

#[cfg(test)]
mod tests {
    use super::EXIT_CODES;
    use crate::core::model::FindingKind;

    /// `--help` names every finding kind a reading can carry.
    #[test]
    fn help_names_every_finding_kind() {
        for k in FindingKind::ALL {
            assert!(
                EXIT_CODES
                    .lines()
                    .any(|l| l.trim_start().starts_with(k.as_str())),
                "{} is not in --help",
                k.as_str()
            );
        }
    }
}
