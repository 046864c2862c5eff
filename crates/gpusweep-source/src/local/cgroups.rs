//! A process's job from its cgroup, believed only where the cgroup's place and owner prove what its name
//! claims (`core::cgroup::claim`): a look-alike in a user's subtree names no scheduler's job.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use gpusweep_core::cgroup::{Claim, Mounts};
use gpusweep_core::job::{Job, Placed, from_proc_cgroup};

/// The cgroup mounts as this process sees them (`<proc_root>/self/mountinfo`).
pub fn mounts(proc_root: &Path) -> Mounts {
    fs::read_to_string(proc_root.join("self/mountinfo"))
        .map(|m| Mounts::parse(&m))
        .unwrap_or_default()
}

/// The process's cgroup (`/proc/PID/cgroup`'s text) and the job it names where the name is proven; an
/// unproven claim names no job.
pub(crate) fn job_of(
    cgroup_file: &str,
    mounts: &Mounts,
    proc_root: &Path,
) -> (Option<String>, Option<Job>) {
    let Placed {
        path,
        job,
        controllers,
    } = from_proc_cgroup(cgroup_file);
    let job = match (&job, &path) {
        (Some(j), Some(p)) if proven(j, p, controllers.as_deref(), mounts, proc_root) => job,
        _ => None,
    };
    (path, job)
}

/// Whether cgroup `path` (in the hierarchy of `controllers`) shows what `job`'s name claims.
fn proven(
    job: &Job,
    path: &str,
    controllers: Option<&str>,
    mounts: &Mounts,
    proc_root: &Path,
) -> bool {
    let owner = |p: &str| {
        mounts
            .dir(controllers, p)
            .and_then(|d| fs::metadata(d).ok())
            .map(|m| m.uid())
    };
    match gpusweep_core::cgroup::claim(job, path, controllers.is_some()) {
        Claim::Refused => false,
        Claim::RootOwned(dirs) => dirs.iter().all(|d| owner(d) == Some(0)),
        Claim::RunLeaf {
            supervisor,
            parent,
            leaf,
        } => {
            let sup = proc_root.join(supervisor.to_string());
            let Some(leaf_owner) = owner(&leaf) else {
                return false;
            };
            // The supervisor's own v2 cgroup, and its user; gone, only root's leaf is still proof.
            let sup_cgroup = fs::read_to_string(sup.join("cgroup"))
                .ok()
                .and_then(|s| gpusweep_core::cgroup::unified_path(&s).map(str::to_string));
            match (sup_cgroup, fs::metadata(&sup).ok().map(|m| m.uid())) {
                (Some(own), Some(uid)) => {
                    controllers.is_none() && own == parent && leaf_owner == uid
                }
                _ => leaf_owner == 0,
            }
        }
    }
}
