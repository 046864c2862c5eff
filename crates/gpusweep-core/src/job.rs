//! Which job a process belongs to, from its cgroup path (`/proc/PID/cgroup`): a Slurm job and step, a
//! Kubernetes pod and container, a Docker or Podman container, a systemd unit, or a `gpusweep run` job. The
//! kernel keeps a process in its cgroup whatever it forks or whoever adopts it, so a double-forked worker
//! reparented to PID 1 is still named by its job.

use serde::{Deserialize, Serialize};

/// The cgroup leaf `gpusweep run` puts a job in: `gpusweep-run-<supervisor pid>`.
pub const RUN_LEAF_PREFIX: &str = "gpusweep-run-";

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Job {
    Slurm {
        job: u64,
        step: Option<String>,
    },
    Kubernetes {
        pod: String,
        container: Option<String>,
    },
    Docker {
        container: String,
    },
    Podman {
        container: String,
    },
    /// A container of another runtime (containerd without Kubernetes, CRI-O).
    Container {
        runtime: String,
        container: String,
    },
    Systemd {
        unit: String,
    },
    /// A `gpusweep run` job, named by its supervisor's PID.
    Run {
        supervisor: u32,
    },
}

/// Why a `--job` value cannot name a job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobQueryError {
    #[error(
        "--job needs a job: a Slurm job (4711, slurm:4711.0), a pod or container ID, a unit, run:PID, tree:PID"
    )]
    Empty,
    #[error(
        "--job {0:?}: a pod or container ID is named by 4 characters or more (a Slurm job by its number)"
    )]
    TooShort(String),
    #[error("--job {0:?}: {1}")]
    Malformed(String, &'static str),
}

/// Whether `q` can name a job at all, as `Job::matches` reads it: a Slurm job by its number (and step), a
/// `run:` job by its supervisor's PID, a unit by name, a pod or container by 4 characters or more.
pub fn check_query(q: &str) -> Result<(), JobQueryError> {
    let q = q.trim();
    let (kind, id) = q.split_once(':').unwrap_or(("", q));
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    // A unit's suffix is as systemd spells it, lower case.
    #[allow(clippy::case_sensitive_file_extension_comparisons)]
    let unit = |s: &str| s.ends_with(".service") || s.ends_with(".scope");
    let slurm = |s: &str| {
        s.split_once('.')
            .map_or_else(|| number(s), |(j, _)| number(j))
    };
    match kind {
        _ if id.is_empty() => Err(JobQueryError::Empty),
        "slurm" if !slurm(id) => Err(JobQueryError::Malformed(
            q.to_string(),
            "a Slurm job is its number (4711, slurm:4711.0)",
        )),
        "run" if !number(id) => Err(JobQueryError::Malformed(
            q.to_string(),
            "a run job is its supervisor's PID (run:812)",
        )),
        "tree" if !number(id) => Err(JobQueryError::Malformed(
            q.to_string(),
            "a launcher tree is its launcher's PID (tree:4100)",
        )),
        "slurm" | "run" | "systemd" | "tree" => Ok(()),
        "" if slurm(id) || unit(id) => Ok(()),
        _ if id.chars().count() < 4 => Err(JobQueryError::TooShort(q.to_string())),
        _ => Ok(()),
    }
}

impl Job {
    /// Its names with their control and bidi characters escaped (they come from a cgroup path a host
    /// reported).
    pub fn escape_labels(&mut self) {
        let defang = |s: &mut String| {
            if let std::borrow::Cow::Owned(e) = super::escape::escape(s) {
                *s = e;
            }
        };
        match self {
            Job::Kubernetes { pod, container } => {
                defang(pod);
                if let Some(c) = container {
                    defang(c);
                }
            }
            Job::Docker { container } | Job::Podman { container } => defang(container),
            Job::Container { runtime, container } => {
                defang(runtime);
                defang(container);
            }
            Job::Systemd { unit } => defang(unit),
            Job::Slurm { step, .. } => {
                if let Some(s) = step {
                    defang(s);
                }
            }
            Job::Run { .. } => {}
        }
    }

    /// Short, for a table column: `slurm:4711.0`, `k8s:3f2a9c1e`, `docker:9a8b7c6d5e4f`, `run:812`.
    pub fn short(&self) -> String {
        let cut = |s: &str, n: usize| s.chars().take(n).collect::<String>();
        match self {
            Job::Slurm { job, step: Some(s) } => format!("slurm:{job}.{s}"),
            Job::Slurm { job, step: None } => format!("slurm:{job}"),
            Job::Kubernetes { pod, .. } => format!("k8s:{}", cut(pod, 8)),
            Job::Docker { container } => format!("docker:{}", cut(container, 12)),
            Job::Podman { container } => format!("podman:{}", cut(container, 12)),
            Job::Container { runtime, container } => format!("{runtime}:{}", cut(container, 12)),
            Job::Systemd { unit } => unit.clone(),
            Job::Run { supervisor } => format!("run:{supervisor}"),
        }
    }

    /// What `--job` takes to name the whole job (every step of a Slurm job).
    pub fn query(&self) -> String {
        match self {
            Job::Slurm { job, .. } => format!("slurm:{job}"),
            other => other.short(),
        }
    }

    /// Whether `--job Q` names this job: `4711` or `slurm:4711` (any step), `slurm:4711.0` (that step), a
    /// pod UID or container ID or a prefix of at least 4 characters, a unit name, `run:812`.
    pub fn matches(&self, q: &str) -> bool {
        let q = q.trim();
        let (kind, id) = q.split_once(':').unwrap_or(("", q));
        let prefix = |full: &str| id.len() >= 4 && full.starts_with(id);
        match self {
            Job::Slurm { job, step } => {
                (kind.is_empty() || kind == "slurm")
                    && match id.split_once('.') {
                        Some((j, s)) => j == job.to_string() && step.as_deref() == Some(s),
                        None => id == job.to_string(),
                    }
            }
            Job::Kubernetes { pod, container } => {
                (kind.is_empty() || kind == "k8s" || kind == "pod")
                    && (prefix(pod) || container.as_deref().is_some_and(prefix))
            }
            Job::Docker { container } => (kind.is_empty() || kind == "docker") && prefix(container),
            Job::Podman { container } => (kind.is_empty() || kind == "podman") && prefix(container),
            Job::Container { runtime, container } => {
                (kind.is_empty() || kind == runtime) && prefix(container)
            }
            Job::Systemd { unit } => {
                (kind.is_empty() || kind == "systemd")
                    && (id == unit || unit.strip_suffix(".service") == Some(id))
            }
            Job::Run { supervisor } => {
                (kind.is_empty() || kind == "run") && id == supervisor.to_string()
            }
        }
    }
}

/// How a job's warm-up stands, from what gpusweep sees: its GPU processes and the memory NVML charges them.
/// Never "ready": that is the server's to say (its health endpoint), not its memory's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Its ranks are alive and hold a GPU, no memory charged yet.
    Starting,
    /// Its memory rose within the settle window.
    Loading,
    /// It holds memory that was not seen rising (first seen after its warm-up, or started too long ago to
    /// tell): it becomes `settled` once flat for the settle window.
    Holding,
    /// Its memory was flat for the settle window with every rank alive.
    Settled,
    /// A rank ended (exited, turned zombie, or stuck in state D) while other ranks still hold GPU memory.
    LostRank,
    /// Every rank alive, its memory flat, and its GPUs busy with no work (GPM: no SM, tensor or DRAM activity)
    /// for the hang window: a collective waiting for a rank that does not come. The ranks whose GPUs do not
    /// spin are named (`waiting_on`), the evidence said (`phase_why`).
    Hung,
    /// What its ranks are charged cannot be read (no NVML, MIG): no phase can be told.
    Unknown,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Loading => "loading",
            Phase::Holding => "holding",
            Phase::Settled => "settled",
            Phase::LostRank => "lost_rank",
            Phase::Hung => "hung",
            Phase::Unknown => "unknown",
        }
    }
    pub const ALL: [Phase; 7] = [
        Phase::Starting,
        Phase::Loading,
        Phase::Holding,
        Phase::Settled,
        Phase::LostRank,
        Phase::Hung,
        Phase::Unknown,
    ];
}

/// One GPU process of a job (a rank: EP/TP/DP ranks each hold their GPU).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rank {
    pub pid: u32,
    pub gpus: Vec<u32>,
    /// What NVML charges it over its GPUs; `null` where unread.
    pub bytes: Option<u64>,
    /// Its state letter (R, S, D...).
    pub state: super::proc_state::ProcState,
    /// Lagging its peers while loading for longer than the straggler window.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub straggler: bool,
}

/// How a rank was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LostHow {
    Exited,
    /// Exited, and its parent has not reaped it past the window.
    Zombie,
    /// In state D (uninterruptible) past the window: no signal reaches it.
    StuckD,
    /// Stopped (state T: SIGSTOP, or t: a debugger) past the window: its collective hangs as surely as if
    /// it had died.
    Stopped,
}

impl LostHow {
    pub fn describe(self) -> &'static str {
        match self {
            LostHow::Exited => "exited",
            LostHow::Zombie => "exited and was not reaped (a zombie)",
            LostHow::StuckD => "is stuck in state D",
            LostHow::Stopped => "is stopped (SIGSTOP or a debugger)",
        }
    }

    /// Whether a rank so held up no longer holds its GPU (a zombie has closed its files).
    pub fn off_the_gpu(self) -> bool {
        matches!(self, LostHow::Exited | LostHow::Zombie)
    }
}

/// A rank that ended while its peers held on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostRank {
    pub pid: u32,
    pub gpus: Vec<u32>,
    pub how: LostHow,
    /// When it was seen lost (Unix ms): within one reading of when it happened.
    pub at_ms: u64,
    /// What it was charged when last seen alive.
    pub bytes: Option<u64>,
    pub cmdline: String,
}

/// A job as one host sees it: its GPU processes, their memory, and its phase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobReport {
    /// What `--job` takes to name it (`slurm:4711`, `k8s:3f2a9c1e`, `run:812`), or `tree:PID` for a
    /// launcher's process tree (no job of a scheduler or container): unique on its host, and the same on
    /// every host for a scheduler's job.
    pub id: String,
    /// The job its cgroup names; `null` for a launcher tree.
    pub job: Option<Job>,
    /// The launcher its ranks descend from (the top of the tree below a shell, a terminal or PID 1).
    pub launcher: Option<u32>,
    /// Since when its launcher is gone (Unix ms): its ranks were reparented, and it is still one job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launcher_gone_ms: Option<u64>,
    /// The launcher's command line, or the first rank's, cut and escaped.
    pub name: String,
    /// Its ranks: the members NVML charges or that hold a GPU as their own.
    pub ranks: Vec<Rank>,
    /// Its helpers: members NVML does not list whose GPUs its ranks (or their own ancestors) hold, a
    /// data-loader forked from a rank, a sidecar. Swept with the job; never counted as ranks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub helpers: Vec<Rank>,
    /// Every GPU its live ranks hold or are listed on.
    pub gpus: Vec<u32>,
    /// What NVML charges its live ranks, over every GPU; `null` when no rank's charge is known.
    pub bytes: Option<u64>,
    /// When its first process started (Unix ms), where the boot time is known; else when first seen.
    pub started_ms: u64,
    pub phase: Phase,
    /// Since when it is in this phase (Unix ms).
    pub phase_since_ms: u64,
    /// From its start to when its memory stopped rising, once it settled after being seen loading.
    pub warmup_ms: Option<u64>,
    /// What it held when it settled.
    pub settled_bytes: Option<u64>,
    /// Always present (empty when none): `jq '.hosts[].jobs[].lost[]'` reads every job.
    #[serde(default)]
    pub lost: Vec<LostRank>,
    /// Declared kept on purpose (config `keep`): shown, never swept, never a leak.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kept: bool,
    /// Why its phase is what it is, where that needs saying: a `hung` job's evidence ("GPU 0-6 busy 100% at
    /// 780 W, SM 0.4%, tensor 0.0%, DRAM 0.0% for 4m"), or why a busy job's phase is `unknown` (its GPUs give
    /// no activity counters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_why: Option<String>,
    /// A `hung` job's ranks whose GPUs do not spin (idle, computing, in D, stopped): the ones the others wait
    /// for. Empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_on: Vec<u32>,
}

impl JobReport {
    /// Every process of it, ranks then helpers (what a sweep of it ends).
    pub fn members(&self) -> impl Iterator<Item = &Rank> {
        self.ranks.iter().chain(&self.helpers)
    }

    /// Its ranks' charges (and their sum) as `charged` says them now: a reading whose memory alone moved.
    pub fn recharge(&mut self, charged: impl Fn(u32) -> Option<u64>) {
        for h in &mut self.helpers {
            h.bytes = charged(h.pid);
        }
        let mut total: Option<u64> = None;
        for r in &mut self.ranks {
            r.bytes = charged(r.pid);
            if let Some(b) = r.bytes {
                total = Some(total.unwrap_or(0).saturating_add(b));
            }
        }
        self.bytes = total;
    }
}

fn hex_id(s: &str) -> Option<String> {
    (s.len() >= 12 && s.chars().all(|c| c.is_ascii_hexdigit())).then(|| s.to_string())
}

/// `cri-containerd-<id>.scope`, `docker-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope`: (runtime, id).
fn scoped_container(part: &str) -> Option<(&'static str, String)> {
    let base = part.strip_suffix(".scope").unwrap_or(part);
    for (prefix, runtime) in [
        ("cri-containerd-", "containerd"),
        ("docker-", "docker"),
        ("crio-", "crio"),
        ("libpod-", "podman"),
    ] {
        if let Some(id) = base.strip_prefix(prefix).and_then(hex_id) {
            return Some((runtime, id));
        }
    }
    None
}

/// The job a cgroup path names, if any. Both cgroup drivers' layouts are read (systemd's `.slice`/`.scope`
/// names and cgroupfs's plain directories), for v2 and v1 hierarchies alike.
pub fn from_cgroup(path: &str) -> Option<Job> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    // Slurm: .../job_<id>/step_<s>/..., only where Slurm puts it (v2: under `slurmstepd.scope`, or
    // `<node>_slurmstepd.scope` with several slurmds; v1: `slurm[_<node>]/uid_<n>/job_*`). A `job_N` in any
    // other manager's tree is not a Slurm job: an epilog acts on what this says.
    let slurms = |i: usize| {
        let parent = i.checked_sub(1).and_then(|j| parts.get(j));
        let grand = i.checked_sub(2).and_then(|j| parts.get(j));
        parent.is_some_and(|p| p.ends_with("slurmstepd.scope"))
            || (parent.is_some_and(|p| p.starts_with("uid_"))
                && grand.is_some_and(|g| *g == "slurm" || g.starts_with("slurm_")))
    };
    if let Some((i, job)) = parts
        .iter()
        .enumerate()
        .filter(|(i, _)| slurms(*i))
        .find_map(|(i, p)| {
            p.strip_prefix("job_")
                .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|n| n.parse::<u64>().ok())
                .map(|j| (i, j))
        })
    {
        let step = parts
            .get(i + 1)
            .and_then(|p| p.strip_prefix("step_"))
            .map(str::to_string);
        return Some(Job::Slurm { job, step });
    }
    if let Some(supervisor) = parts
        .iter()
        .find_map(|p| p.strip_prefix(RUN_LEAF_PREFIX)?.parse().ok())
    {
        return Some(Job::Run { supervisor });
    }
    // Kubernetes: a pod component (`kubepods-burstable-pod<uid>.slice` or `pod<uid>`), then its container.
    if parts.iter().any(|p| p.starts_with("kubepods")) {
        // cgroupfs: `pod<uid>`; systemd: `kubepods-<qos>-pod<uid with _>.slice`.
        let pod_of = |p: &str| -> Option<String> {
            let base = p.strip_suffix(".slice").unwrap_or(p);
            base.strip_prefix("pod")
                .or_else(|| base.rsplit('-').next().and_then(|t| t.strip_prefix("pod")))
                .filter(|u| !u.is_empty())
                .map(|u| u.replace('_', "-"))
        };
        if let Some((i, pod)) = parts
            .iter()
            .enumerate()
            .find_map(|(i, p)| pod_of(p).map(|u| (i, u)))
        {
            let container = parts
                .get(i + 1)
                .and_then(|c| scoped_container(c).map(|(_, id)| id).or_else(|| hex_id(c)));
            return Some(Job::Kubernetes { pod, container });
        }
    }
    for (i, p) in parts.iter().enumerate() {
        if let Some((runtime, container)) = scoped_container(p) {
            return Some(match runtime {
                "docker" => Job::Docker { container },
                "podman" => Job::Podman { container },
                r => Job::Container {
                    runtime: r.to_string(),
                    container,
                },
            });
        }
        // cgroupfs driver: /docker/<id>
        if *p == "docker"
            && let Some(container) = parts.get(i + 1).and_then(|c| hex_id(c))
        {
            return Some(Job::Docker { container });
        }
    }
    parts
        .iter()
        .rev()
        .find(|p| p.ends_with(".service") && !p.starts_with("user@"))
        .map(|u| Job::Systemd {
            unit: (*u).to_string(),
        })
}

/// A process's most telling cgroup: its path, the job its name claims, and (in a v1 hierarchy) the
/// controllers that name the hierarchy, where the claim's proof is to be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placed {
    pub path: Option<String>,
    pub job: Option<Job>,
    /// None: the v2 hierarchy.
    pub controllers: Option<String>,
}

/// The most telling cgroup path of a `/proc/PID/cgroup` file and the job it names: the v2 line (`0::`) when
/// it names a job, else a v1 line that does (Slurm on hybrid hosts keeps its jobs in v1 hierarchies), else
/// the v2 line alone.
pub fn from_proc_cgroup(s: &str) -> Placed {
    let mut unified = None;
    let mut v1 = None;
    for line in s.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let path = path.trim();
        if id == "0" {
            unified = Some(path.to_string()).filter(|p| !p.is_empty());
        } else if v1.is_none()
            && let Some(job) = from_cgroup(path)
        {
            v1 = Some(Placed {
                path: Some(path.to_string()),
                job: Some(job),
                controllers: Some(controllers.to_string()),
            });
        }
    }
    if let Some(u) = &unified
        && let Some(job) = from_cgroup(u)
    {
        return Placed {
            path: unified,
            job: Some(job),
            controllers: None,
        };
    }
    v1.unwrap_or(Placed {
        path: unified,
        job: None,
        controllers: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CID: &str = "4f1c2b3a5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70";

    #[test]
    fn a_job_directory_outside_slurms_layout_is_no_slurm_job() {
        for path in [
            "/gpusweep-test/job_1",
            "/system.slice/backup.service/job_7/step_0",
            "/slurm/job_9",
            "/other/uid_0/job_9",
        ] {
            assert!(
                !matches!(from_cgroup(path), Some(Job::Slurm { .. })),
                "{path}: {:?}",
                from_cgroup(path)
            );
        }
        assert_eq!(
            from_cgroup("/system.slice/node1_slurmstepd.scope/job_5/step_batch"),
            Some(Job::Slurm {
                job: 5,
                step: Some("batch".into())
            })
        );
        assert_eq!(
            from_cgroup("/slurm_node1/uid_1000/job_6"),
            Some(Job::Slurm { job: 6, step: None })
        );
    }

    #[test]
    fn slurm_v2_and_v1_layouts() {
        assert_eq!(
            from_cgroup("/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0"),
            Some(Job::Slurm {
                job: 4711,
                step: Some("0".into())
            })
        );
        assert_eq!(
            from_cgroup("/slurm/uid_1000/job_12/step_batch"),
            Some(Job::Slurm {
                job: 12,
                step: Some("batch".into())
            })
        );
        let placed = from_proc_cgroup("4:memory:/slurm/uid_0/job_9/step_0/task_0\n1:cpu:/\n0::/\n");
        assert_eq!(placed.controllers.as_deref(), Some("memory"));
        let Placed { path, job, .. } = placed;
        assert_eq!(path.as_deref(), Some("/slurm/uid_0/job_9/step_0/task_0"));
        assert!(matches!(job, Some(Job::Slurm { job: 9, .. })));
    }

    #[test]
    fn kubernetes_docker_podman_systemd_and_run() {
        let systemd_pod = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3f2a9c1e_7b6d_4c5e_9f8a_1b2c3d4e5f60.slice/cri-containerd-{CID}.scope"
        );
        assert_eq!(
            from_cgroup(&systemd_pod),
            Some(Job::Kubernetes {
                pod: "3f2a9c1e-7b6d-4c5e-9f8a-1b2c3d4e5f60".into(),
                container: Some(CID.into())
            })
        );
        let cgroupfs_pod =
            format!("/kubepods/besteffort/pod3f2a9c1e-7b6d-4c5e-9f8a-1b2c3d4e5f60/{CID}");
        assert!(matches!(
            from_cgroup(&cgroupfs_pod),
            Some(Job::Kubernetes { container: Some(c), .. }) if c == CID
        ));
        assert_eq!(
            from_cgroup(&format!("/system.slice/docker-{CID}.scope")),
            Some(Job::Docker {
                container: CID.into()
            })
        );
        assert_eq!(
            from_cgroup(&format!("/docker/{CID}")),
            Some(Job::Docker {
                container: CID.into()
            })
        );
        assert_eq!(
            from_cgroup(&format!("/machine.slice/libpod-{CID}.scope/container")),
            Some(Job::Podman {
                container: CID.into()
            })
        );
        assert_eq!(
            from_cgroup("/system.slice/vllm-serve.service"),
            Some(Job::Systemd {
                unit: "vllm-serve.service".into()
            })
        );
        assert_eq!(
            from_cgroup("/process_api/1c75/gpusweep-run-812"),
            Some(Job::Run { supervisor: 812 })
        );
        assert_eq!(
            from_cgroup("/user.slice/user-1000.slice/session-3.scope"),
            None
        );
        assert_eq!(from_cgroup("/"), None);
    }

    #[test]
    fn job_queries() {
        let s = Job::Slurm {
            job: 4711,
            step: Some("0".into()),
        };
        assert!(s.matches("4711") && s.matches("slurm:4711") && s.matches("slurm:4711.0"));
        assert!(!s.matches("4711.1") && !s.matches("471") && !s.matches("docker:4711"));
        let d = Job::Docker {
            container: CID.into(),
        };
        assert!(d.matches("4f1c") && d.matches("docker:4f1c2b") && !d.matches("4f1"));
        assert_eq!(d.short(), "docker:4f1c2b3a5d6e");
        let u = Job::Systemd {
            unit: "vllm.service".into(),
        };
        assert!(u.matches("vllm") && u.matches("vllm.service"));
        assert!(Job::Run { supervisor: 812 }.matches("run:812"));
    }
}
