//! Where cgroups are mounted (`/proc/self/mountinfo`), and what a cgroup path must show before the job its
//! name claims is believed. A cgroup's name is a claim; its place and its owner are the proof: any user with
//! a delegated subtree (every systemd user session on cgroup v2) can make a directory called
//! `x_slurmstepd.scope/job_4711` or `gpusweep-run-812`, but only root can make one that root owns, and only
//! `gpusweep run` puts its leaf beside its own supervisor.

use std::path::{Path, PathBuf};

use super::job::{Job, RUN_LEAF_PREFIX};

/// The cgroup mounts of this host: v2's, and each v1 hierarchy's by the controllers it carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mounts {
    pub v2: Option<PathBuf>,
    /// (its controllers as `/proc/PID/cgroup` names them, e.g. `memory` or `cpu,cpuacct`; the mount point).
    pub v1: Vec<(Vec<String>, PathBuf)>,
}

impl Mounts {
    /// Read from a `mountinfo` text (never assumed to be /sys/fs/cgroup: hybrid hosts mount v2 at
    /// /sys/fs/cgroup/unified).
    pub fn parse(mountinfo: &str) -> Mounts {
        let mut m = Mounts::default();
        for l in mountinfo.lines() {
            let Some((left, right)) = l.split_once(" - ") else {
                continue;
            };
            let Some(point) = left.split_whitespace().nth(4).map(PathBuf::from) else {
                continue;
            };
            let mut r = right.split_whitespace();
            match (r.next(), r.next(), r.next()) {
                (Some("cgroup2"), ..) if m.v2.is_none() => m.v2 = Some(point),
                (Some("cgroup"), _, Some(opts)) => {
                    // The super options name the controllers (and `name=...` for a named hierarchy) among
                    // mount flags such as `rw`.
                    let controllers = opts
                        .split(',')
                        .filter(|o| !matches!(*o, "rw" | "ro" | "xattr" | "clone_children"))
                        .filter(|o| !o.starts_with("release_agent="))
                        .map(str::to_string)
                        .collect();
                    m.v1.push((controllers, point));
                }
                _ => {}
            }
        }
        m
    }

    /// The directory of cgroup `path` in the hierarchy a `/proc/PID/cgroup` line names by its controllers
    /// (`None`: the v2 line).
    pub fn dir(&self, controllers: Option<&str>, path: &str) -> Option<PathBuf> {
        let mount = match controllers {
            None => self.v2.as_ref()?,
            Some(c) => {
                let want: Vec<&str> = c.split(',').filter(|c| !c.is_empty()).collect();
                &self
                    .v1
                    .iter()
                    .find(|(have, _)| {
                        !want.is_empty() && want.iter().all(|w| have.iter().any(|h| h == w))
                    })?
                    .1
            }
        };
        let rel = path.trim_start_matches('/');
        // A path outside this reader's cgroup namespace (`/../..`) is nowhere it can look.
        if rel.split('/').any(|p| p == "..") {
            return None;
        }
        Some(if rel.is_empty() {
            mount.clone()
        } else {
            Path::new(mount).join(rel)
        })
    }
}

/// A process's v2 cgroup path, from its `/proc/PID/cgroup` text (the `0::` line).
pub fn unified_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::trim)
}

/// What a cgroup path must show before the job it names is believed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Never: the name sits where its scheduler never puts it (inside a user's delegated subtree).
    Refused,
    /// These cgroup directories (paths in the same hierarchy) must be owned by root.
    RootOwned(Vec<String>),
    /// A `gpusweep run` leaf: its parent must be the supervisor's own cgroup (v2) and the leaf owned by the
    /// supervisor's user (by root, once the supervisor is gone).
    RunLeaf {
        supervisor: u32,
        parent: String,
        leaf: String,
    },
}

/// What `path` (in the v2 hierarchy, or with `v1` in a v1 one) must show for `job` (read from it by
/// `job::from_cgroup`) to be believed.
pub fn claim(job: &Job, path: &str, v1: bool) -> Claim {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let prefix = |n: usize| format!("/{}", parts[..n].join("/"));
    // systemd hands a user's manager (`user@UID.service`) a subtree of its own: nothing under it is a
    // scheduler's or a runtime's, whatever it is called.
    let delegated = |n: usize| parts[..n].iter().any(|p| p.starts_with("user@"));
    match job {
        Job::Slurm { job, .. } => {
            let name = format!("job_{job}");
            // The very `job_<id>` the name was read from: the first in Slurm's layout.
            let at = |i: usize| {
                parts[i] == name
                    && ((i >= 1 && parts[i - 1].ends_with("slurmstepd.scope"))
                        || (i == 2
                            && parts[1].starts_with("uid_")
                            && (parts[0] == "slurm" || parts[0].starts_with("slurm_"))))
            };
            let Some(i) = (0..parts.len()).find(|&i| at(i)) else {
                return Claim::Refused;
            };
            if delegated(i) {
                return Claim::Refused;
            }
            if !v1 && parts[i - 1].ends_with("slurmstepd.scope") {
                // v2: every directory from the top down to the job's is root's (slurmd made them; a
                // delegated one on the way is someone else's subtree).
                Claim::RootOwned((1..=i + 1).map(prefix).collect())
            } else if v1 && i == 2 {
                // v1: `slurm[_<node>]/uid_<n>/job_<id>` at the top of a hierarchy, all three root's (a user
                // handed their `uid_<n>` could name any job in it).
                Claim::RootOwned((1..=3).map(prefix).collect())
            } else {
                Claim::Refused
            }
        }
        Job::Run { supervisor } => {
            let name = format!("{RUN_LEAF_PREFIX}{supervisor}");
            match parts.iter().position(|p| *p == name) {
                Some(i) => Claim::RunLeaf {
                    supervisor: *supervisor,
                    parent: prefix(i),
                    leaf: prefix(i + 1),
                },
                None => Claim::Refused,
            }
        }
        // A container's or unit's name inside a user's own subtree is that user's to choose; elsewhere it is
        // the runtime's or systemd's only where every directory down to it is root's (a service delegated
        // to a user may hold directories of any name).
        _ if delegated(parts.len()) => Claim::Refused,
        _ => Claim::RootOwned((1..=parts.len()).map(prefix).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::from_cgroup;

    const HYBRID: &str = "\
30 23 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:4 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:5 - cgroup2 cgroup2 rw,nsdelegate
34 30 0:30 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,memory
35 30 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,cpu,cpuacct
";

    #[test]
    fn mounts_of_a_hybrid_host_find_each_hierarchy() {
        let m = Mounts::parse(HYBRID);
        assert_eq!(m.v2.as_deref(), Some(Path::new("/sys/fs/cgroup/unified")));
        assert_eq!(
            m.dir(None, "/a/b"),
            Some(PathBuf::from("/sys/fs/cgroup/unified/a/b"))
        );
        assert_eq!(
            m.dir(Some("memory"), "/slurm/uid_0/job_9"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/slurm/uid_0/job_9"))
        );
        assert_eq!(
            m.dir(Some("cpu,cpuacct"), "/x"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/x"))
        );
        assert_eq!(m.dir(Some("pids"), "/x"), None, "no such hierarchy");
        assert_eq!(
            m.dir(None, "/../../system.slice"),
            None,
            "outside the namespace"
        );
    }

    #[test]
    fn a_slurm_name_inside_a_users_subtree_is_refused_and_slurmds_own_must_be_roots() {
        let users = "/user.slice/user-1000.slice/user@1000.service/app.slice/x_slurmstepd.scope/job_4711/step_0";
        let job = from_cgroup(users).expect("the name claims a Slurm job");
        assert_eq!(claim(&job, users, false), Claim::Refused);
        let slurmd = "/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0";
        let job = from_cgroup(slurmd).expect("slurm");
        assert_eq!(
            claim(&job, slurmd, false),
            Claim::RootOwned(vec![
                "/system.slice".into(),
                "/system.slice/slurmstepd.scope".into(),
                "/system.slice/slurmstepd.scope/job_4711".into()
            ])
        );
        let v1 = "/slurm/uid_0/job_9/step_0/task_0";
        let job = from_cgroup(v1).expect("slurm v1");
        assert_eq!(
            claim(&job, v1, true),
            Claim::RootOwned(vec![
                "/slurm".into(),
                "/slurm/uid_0".into(),
                "/slurm/uid_0/job_9".into()
            ])
        );
        assert_eq!(claim(&job, v1, false), Claim::Refused, "v1's layout in v2");
        // A `job_<id>` earlier in the path is not the one the name was read from: every directory down to
        // the one it was is proven.
        let nested = "/system.slice/deleg.service/job_4711/x_slurmstepd.scope/job_4711/step_0";
        let job = from_cgroup(nested).expect("the name claims a Slurm job");
        assert_eq!(
            claim(&job, nested, false),
            Claim::RootOwned(
                [
                    "/system.slice",
                    "/system.slice/deleg.service",
                    "/system.slice/deleg.service/job_4711",
                    "/system.slice/deleg.service/job_4711/x_slurmstepd.scope",
                    "/system.slice/deleg.service/job_4711/x_slurmstepd.scope/job_4711",
                ]
                .map(String::from)
                .to_vec()
            )
        );
        // A unit or container named inside a user's subtree is theirs.
        let unit = "/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service";
        assert_eq!(
            claim(&from_cgroup(unit).expect("unit"), unit, false),
            Claim::Refused
        );
    }

    #[test]
    fn a_run_leaf_is_proven_beside_its_supervisor() {
        let path = "/user.slice/user-0.slice/session-3.scope/gpusweep-run-812";
        let job = from_cgroup(path).expect("run");
        assert_eq!(
            claim(&job, path, false),
            Claim::RunLeaf {
                supervisor: 812,
                parent: "/user.slice/user-0.slice/session-3.scope".into(),
                leaf: path.into(),
            }
        );
        let docker = "/system.slice/docker-4f1c2b3a5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70.scope";
        assert_eq!(
            claim(&from_cgroup(docker).expect("docker"), docker, false),
            Claim::RootOwned(vec!["/system.slice".into(), docker.into()])
        );
    }
}
