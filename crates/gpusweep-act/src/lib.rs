//! Actions on real processes: pidfd delivery and escalation, the protection rule, the audit log, a job's
//! containment, shared-memory removal. What rustix cannot do safely (the pre_exec hook, the default SIGPIPE,
//! taking the supervisor's spec file by its number) is gpusweep-sys's.

#![forbid(unsafe_code)]

pub mod audit;
pub mod deliver;
pub mod job;
pub mod note;
pub mod own;
pub mod pidfd;
pub mod protect;
pub mod shm;

pub use audit::AuditLog;
pub use deliver::deliver;

/// Signals on this host, detached from whatever polls it (so a grace period never pauses readings).
#[derive(Debug, Clone)]
pub struct Deliverer {
    pub host: String,
    pub audit: AuditLog,
    /// Where the kernel has no pidfd: signal with kill(2) right after re-checking the start time (a small
    /// window for PID reuse remains). Off unless asked for; recorded as such in the audit log.
    pub without_pidfd: bool,
}

impl Deliverer {
    pub fn deliver(
        &self,
        req: &gpusweep_core::signal::SignalRequest,
    ) -> Vec<gpusweep_core::signal::Outcome> {
        deliver::deliver(&self.host, req, &self.audit, self.without_pidfd)
    }

    /// Why signals here lack a pidfd, if they do: a missing feature of this host.
    pub fn pidfd_missing(&self) -> Option<String> {
        pidfd::missing()
    }
}
