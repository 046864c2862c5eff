//! Actions on real processes: pidfd delivery and escalation, the protection rule, the audit log. The only
//! `unsafe` code of gpusweep lives in this layer, and only what rustix cannot do safely: a pre_exec hook,
//! the default SIGPIPE, and taking the supervisor's spec pipe by its number.

pub mod audit;
pub mod deliver;
#[allow(unsafe_code)] // one pre_exec hook that write(2)s to an fd opened before the fork
pub mod job;
#[allow(unsafe_code)] // one libc::signal call
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
        req: &crate::core::signal::SignalRequest,
    ) -> Vec<crate::core::signal::Outcome> {
        deliver::deliver(&self.host, req, &self.audit, self.without_pidfd)
    }

    /// Why signals here lack a pidfd, if they do: a missing feature of this host.
    pub fn pidfd_missing(&self) -> Option<String> {
        pidfd::missing()
    }
}
