//! A real one-node Slurm on loopback (slurmctld, slurmd and munge from Debian's packages, started by the test)
//! with gpusweep as its epilog, and stand-in device files as the GPUs. The README's test command installs the
//! packages; without them (or without root, which slurmd needs) this test fails rather than skip.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::{BIN, await_cond_every, free_port};

/// How often a condition is checked: most checks run a Slurm client (sinfo, squeue).
const POLL: Duration = Duration::from_millis(100);

/// The daemons of one test cluster; killed when dropped.
struct Cluster {
    dir: tempfile::TempDir,
    daemons: Vec<Child>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Everything the daemons started first, while they live to reap it: a job's slurmstepd ignores TERM
        // and would outlive slurmd, reparented to PID 1 (which here may never reap it).
        let mut all: Vec<u32> = self.daemons.iter().map(Child::id).collect();
        let mut i = 0;
        while i < all.len() {
            all.extend(children(all[i]));
            i += 1;
        }
        let started = &all[self.daemons.len()..];
        for pid in started.iter().rev() {
            if let Ok(p) = i32::try_from(*pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let t = std::time::Instant::now();
        while started
            .iter()
            .any(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
            && t.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        for d in &mut self.daemons {
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let ppid = std::fs::read_to_string(format!("/proc/{p}/stat"))
            .ok()
            .and_then(|s| {
                let after = s.get(s.rfind(')')? + 2..)?.to_string();
                after.split_whitespace().nth(1)?.parse::<u32>().ok()
            });
        if ppid == Some(pid) {
            out.push(p);
        }
    }
    out
}

fn daemon(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("{cmd:?}: {e} (apt-get install slurmctld slurmd slurm-client munge)")
        })
}

impl Cluster {
    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }
    fn conf(&self) -> PathBuf {
        self.path("slurm.conf")
    }
    fn client(&self, prog: &str, args: &[&str]) -> String {
        let o = Command::new(prog)
            .args(args)
            .env("SLURM_CONF", self.conf())
            .output()
            .unwrap_or_else(|e| panic!("{prog}: {e}"));
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    }
    /// `STATE REASON` of the one node.
    fn node(&self) -> String {
        self.client("sinfo", &["-h", "-N", "-o", "%T %E"])
            .trim()
            .to_string()
    }

    fn start() -> Cluster {
        Cluster::start_numbering_from(1)
    }

    /// A cluster whose first job is `first_job`: tests that run side by side keep their job IDs apart (an
    /// epilog of one cluster's root job would take another's root processes that carry its ID).
    #[allow(clippy::too_many_lines)] // munged, the epilog script, slurm.conf, slurmctld, slurmd, in order
    fn start_numbering_from(first_job: u32) -> Cluster {
        let dir = tempfile::tempdir().expect("tmp");
        let mut c = Cluster {
            dir,
            daemons: Vec::new(),
        };
        for d in ["state", "spool", "munge"] {
            std::fs::create_dir(c.path(d)).expect("mkdir");
        }
        std::fs::write(c.path("nvidia0"), b"").expect("stand-in GPU");
        // A key of its own, so the test needs nothing from /etc/munge.
        let key: Vec<u8> = (0..1024u32)
            .map(|i| u8::try_from((i.wrapping_mul(2_654_435_761) >> 13) % 256).unwrap_or(0))
            .collect();
        std::fs::write(c.path("munge/key"), key).expect("key");
        let _ = Command::new("chmod")
            .arg("600")
            .arg(c.path("munge/key"))
            .status();
        let sock = c.path("munge/sock");
        c.daemons.push(daemon(
            Command::new("/usr/sbin/munged")
                .arg("--foreground")
                .arg("--force")
                .arg(format!("--socket={}", sock.display()))
                .arg(format!("--key-file={}", c.path("munge/key").display()))
                .arg(format!("--pid-file={}", c.path("munge/pid").display()))
                .arg(format!("--log-file={}", c.path("munge/log").display()))
                .arg(format!("--seed-file={}", c.path("munge/seed").display())),
        ));
        await_cond_every("munged", 20, POLL, || sock.exists());
        let audit = c.path("actions.jsonl");
        let epilog = c.path("epilog.sh");
        std::fs::write(
            &epilog,
            format!(
                "#!/bin/sh\nGPUSWEEP_AUDIT_LOG={} GPUSWEEP_CONFIG={}/none.toml exec {BIN} epilog --no-nvml \
                 --device-glob '{}/nvidia*' --gpus 0 --grace 1s --timeout 3s >>{}/epilog.out 2>&1\n",
                audit.display(),
                c.dir.path().display(),
                c.dir.path().display(),
                c.dir.path().display()
            ),
        )
        .expect("epilog");
        let _ = Command::new("chmod").arg("755").arg(&epilog).status();
        let host =
            String::from_utf8_lossy(&Command::new("hostname").output().expect("hostname").stdout)
                .trim()
                .to_string();
        let d = c.dir.path().display().to_string();
        std::fs::write(
            c.conf(),
            format!(
                "ClusterName=gstest\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort={}\nSlurmdPort={}\n\
                 AuthType=auth/munge\nAuthInfo=socket={}\nCredType=cred/munge\nSlurmUser=root\nSlurmdUser=root\n\
                 StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\nSlurmctldPidFile={d}/ctld.pid\n\
                 SlurmdPidFile={d}/d.pid\nSlurmctldLogFile={d}/ctld.log\nSlurmdLogFile={d}/d.log\n\
                 ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n\
                 AccountingStorageType=accounting_storage/none\nSelectType=select/linear\n\
                 SchedulerType=sched/builtin\nMpiDefault=none\nReturnToService=2\nEpilog={}\nFirstJobId={first_job}\n\
                 NodeName=gsnode NodeAddr=127.0.0.1 NodeHostname={host} CPUs=1 State=UNKNOWN\n\
                 PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n",
                free_port(),
                free_port(),
                sock.display(),
                epilog.display()
            ),
        )
        .expect("slurm.conf");
        c.daemons.push(daemon(
            Command::new("/usr/sbin/slurmctld")
                .arg("-D")
                .arg("-i")
                .arg("-f")
                .arg(c.conf()),
        ));
        c.daemons.push(daemon(
            Command::new("/usr/sbin/slurmd")
                .arg("-D")
                .arg("-f")
                .arg(c.conf())
                .arg("-N")
                .arg("gsnode"),
        ));
        await_cond_every("the node to be idle", 60, POLL, || {
            c.node().starts_with("idle")
        });
        c
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

#[test]
#[allow(clippy::too_many_lines)] // one cluster, two jobs, the prolog, the recovery: one scenario
fn the_epilog_ends_a_jobs_orphan_and_drains_a_node_whose_gpu_another_process_holds() {
    let c = Cluster::start();
    let dev = c.path("nvidia0");
    let pidfile = c.path("orphan.pid");
    // Job 1 leaves a double-forked orphan holding the GPU: Slurm's process tracking loses it, the epilog
    // finds it by its job and ends it, and the node stays idle.
    let wrap = orphan_job(&dev, &pidfile);
    let out = c.client("sbatch", &["-o", "/dev/null", "--wrap", &wrap]);
    assert!(out.contains("Submitted batch job"), "{out}");
    await_cond_every("the orphan's pid", 30, POLL, || {
        !read(&pidfile).trim().is_empty()
    });
    let orphan: u32 = read(&pidfile).trim().parse().expect("pid");
    await_cond_every("the epilog to finish", 30, POLL, || {
        read(&c.path("epilog.out")).contains("clean after")
    });
    // Gone, or a zombie awaiting a PID 1 that may never reap (a container's entry point): not running.
    let state = read(Path::new(&format!("/proc/{orphan}/stat")));
    assert!(
        state.is_empty()
            || state
                .rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z')),
        "the orphan survived the epilog: {state}"
    );
    let log = read(&c.path("epilog.out"));
    assert!(
        log.contains(&format!("{orphan} sleep 300: exited after TERM")),
        "{log}"
    );
    assert!(
        read(&c.path("actions.jsonl")).contains(&format!("\"pid\":{orphan}")),
        "audited first"
    );
    await_cond_every("idle", 20, POLL, || c.node().starts_with("idle"));
    // Job 2: the GPU is also held by a process outside the job. The epilog cannot clean it: it exits
    // non-zero and the node is drained with gpusweep's reason.
    let mut outside = Command::new("sleep")
        .arg("300")
        .stdin(std::fs::File::open(&dev).expect("open"))
        .spawn()
        .expect("outside holder");
    let out = c.client("sbatch", &["-o", "/dev/null", "--wrap", "true"]);
    assert!(out.contains("Submitted batch job"), "{out}");
    await_cond_every("the node to drain", 40, POLL, || {
        let n = c.node();
        n.starts_with("drain") && n.contains("gpusweep:")
    });
    let n = c.node();
    assert!(
        n.contains(&format!("holder {}", outside.id())),
        "the reason names the holder: {n}"
    );
    // The prolog says the same of a job about to start, without draining when asked not to.
    let prolog_99 = || {
        Command::new(BIN)
            .args([
                "prolog",
                "--no-nvml",
                "--no-drain",
                "--gpus",
                "0",
                "--device-glob",
            ])
            .arg(format!("{}/nvidia*", c.dir.path().display()))
            .env("SLURM_JOB_ID", "99")
            .env("GPUSWEEP_CONFIG", c.path("none.toml"))
            .output()
            .expect("prolog")
    };
    let o = prolog_99();
    let t = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.starts_with("gpusweep: ") && t.contains(&outside.id().to_string()),
        "{t}"
    );
    outside.kill().expect("kill");
    outside.wait().expect("wait");
    // Recovered as the README says: the GPU is clean again, so resume the node.
    let o = prolog_99();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    c.client("scontrol", &["update", "NodeName=gsnode", "State=RESUME"]);
    await_cond_every("idle again", 20, POLL, || c.node().starts_with("idle"));
}

/// A `sleep 300` kept for the test, killed when dropped.
struct Decoy(Child);

impl Drop for Decoy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A cgroup v1 `pids` group of this test's own, with a `job_N` directory in it: a name like Slurm's, but not
/// Slurm's layout (no `slurm/uid_*` above it). Removed when dropped.
struct NotSlurm(PathBuf);

impl Drop for NotSlurm {
    fn drop(&mut self) {
        // Its one process was killed (the decoy is dropped first); the kernel lets go of it a moment after its
        // reaping: the groups go once they are empty.
        let empty = |d: &Path| {
            std::fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|s| s.trim().is_empty())
        };
        for e in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                let t = std::time::Instant::now();
                while !empty(&e.path()) && t.elapsed() < Duration::from_secs(5) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = std::fs::remove_dir(e.path());
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
#[allow(clippy::too_many_lines)] // one job and the three processes that only look like it
fn the_epilog_ends_only_the_jobs_processes_never_another_users_or_a_look_alike_cgroup() {
    let c = Cluster::start_numbering_from(4711);
    // The job runs as nobody: it must reach the device file and write its orphan's PID.
    let share = c.path("share");
    std::fs::create_dir(&share).expect("mkdir");
    for (p, mode) in [
        (c.dir.path().to_path_buf(), 0o755),
        (c.path("munge"), 0o755),
        (share.clone(), 0o777),
        (c.path("nvidia0"), 0o666),
    ] {
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .expect("chmod");
    }
    let dev = c.path("nvidia0");
    let pidfile = share.join("orphan.pid");
    let wrap = orphan_job(&dev, &pidfile);
    let o = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(["sbatch", "--hold", "-o", "/dev/null", "--wrap", &wrap])
        .env("SLURM_CONF", c.conf())
        .current_dir(&share)
        .output()
        .expect("sbatch as nobody");
    let said =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    let job: u64 = said
        .trim()
        .strip_prefix("Submitted batch job ")
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    // Three processes that are not the job's, though each looks like it one way.
    let env_job = job.to_string();
    let other_user = Decoy(
        Command::new("setpriv")
            .args([
                "--reuid",
                "1234",
                "--regid",
                "1234",
                "--clear-groups",
                "sleep",
                "300",
            ])
            .env("SLURM_JOB_ID", &env_job)
            .spawn()
            .expect("another user's process"),
    );
    let root_daemon = Decoy(
        Command::new("sleep")
            .arg("300")
            .env("SLURM_JOB_ID", &env_job)
            .spawn()
            .expect("a root daemon"),
    );
    let group = Path::new("/sys/fs/cgroup/pids").join(crate::support::unique("gpusweep-test"));
    let leaf = group.join(format!("job_{job}"));
    std::fs::create_dir_all(&leaf).expect("a cgroup v1 pids group (the CI machine has one)");
    let _cleanup = NotSlurm(group);
    // Declared after the groups' guard: dropped (killed) before the groups are removed.
    let in_cgroup = Decoy(Command::new("sleep").arg("300").spawn().expect("sleep"));
    std::fs::write(leaf.join("cgroup.procs"), in_cgroup.0.id().to_string()).expect("move in");
    let out = c.client("scontrol", &["release", &env_job]);
    assert!(out.trim().is_empty(), "{out}");
    await_cond_every("the orphan's pid", 30, POLL, || {
        !read(&pidfile).trim().is_empty()
    });
    let orphan: u32 = read(&pidfile).trim().parse().expect("pid");
    await_cond_every("the epilog to finish", 30, POLL, || {
        read(&c.path("epilog.out")).contains("clean after")
    });
    let log = read(&c.path("epilog.out"));
    assert!(
        log.contains(&format!("{orphan} sleep 300: exited after TERM")),
        "the job's own orphan, found by its environment and its uid, is ended: {log}"
    );
    for (what, d) in [
        ("another user's process carrying SLURM_JOB_ID", &other_user),
        ("a root daemon carrying SLURM_JOB_ID", &root_daemon),
        (
            "a process in a job_N cgroup that is not Slurm's",
            &in_cgroup,
        ),
    ] {
        let pid = d.0.id();
        assert!(
            crate::support::alive(pid) && !log.contains(&format!("{pid} sleep")),
            "{what} ({pid}) was signalled: {log}"
        );
    }
}

#[test]
fn hosts_slurm_reads_a_jobs_nodes_and_this_node_is_local() {
    let c = Cluster::start_numbering_from(9300);
    let out = c.client("sbatch", &["-o", "/dev/null", "--wrap", "sleep 300"]);
    let id = out
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(out.contains("Submitted batch job"), "{out}");
    await_cond_every("the job to run", 30, POLL, || {
        c.client("squeue", &["-h", "-j", &id, "-o", "%T"]).trim() == "RUNNING"
    });
    let host =
        String::from_utf8_lossy(&Command::new("hostname").output().expect("hostname").stdout)
            .trim()
            .to_string();
    let snapshot = |hosts: &str, env: &[(&str, &str)]| {
        let mut cmd = Command::new(BIN);
        cmd.args(["snapshot", "--json", "--no-nvml", "--device-glob"])
            .arg(format!("{}/nvidia*", c.dir.path().display()))
            .args(["--hosts", hosts])
            .env("SLURM_CONF", c.conf())
            .env("GPUSWEEP_CONFIG", c.path("none.toml"))
            .env("GPUSWEEP_SOCKET", c.path("none.sock"))
            .env_remove("SLURM_JOB_NODELIST")
            .env_remove("SLURM_NODELIST");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("gpusweep")
    };
    // The node (gsnode) runs on this machine (its NodeHostname): read as this host.
    let o = snapshot(&format!("slurm:{id}"), &[]);
    let t = crate::support::exited(&o, 0);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let hosts = v["hosts"].as_array().expect("hosts");
    assert_eq!(hosts.len(), 1, "{t}");
    assert_eq!(hosts[0]["host"], host.as_str());
    assert_eq!(hosts[0]["source"], "local");
    // Inside a job: its node list from the environment.
    let o = snapshot("slurm", &[("SLURM_JOB_NODELIST", "gsnode")]);
    crate::support::exited(&o, 0);
    // Outside one, and a job that does not exist: errors that say so, never a pass.
    let o = snapshot("slurm", &[]);
    let t = crate::support::exited(&o, 2);
    assert!(t.contains("not inside a Slurm job"), "{t}");
    let o = snapshot("slurm:999999", &[]);
    let t = crate::support::exited(&o, 2);
    assert!(t.contains("slurm:999999"), "{t}");
    c.client("scancel", &[&id]);
}

/// A batch job's command that leaves a double-forked orphan holding `dev` (its PID in `pidfile`): what
/// Slurm's process tracking loses and the epilog finds by its job.
fn orphan_job(dev: &Path, pidfile: &Path) -> String {
    format!(
        "sh -c '(sleep 300 <{} >/dev/null 2>&1 & echo $! >{})'; echo done",
        dev.display(),
        pidfile.display()
    )
}

/// A job without GPUs (no SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES or --gpus) is judged on none: its prolog
/// passes while another user's process holds a GPU of the node, and neither drains the node nor names that
/// process; `--gpus all` still judges every GPU.
#[test]
fn a_job_without_gpus_is_judged_on_none() {
    let dir = tempfile::tempdir().expect("tmp");
    let dev = dir.path().join("nvidia0");
    std::fs::write(&dev, b"").expect("device");
    let mut holder = Decoy(
        Command::new("sleep")
            .arg("300")
            .stdin(std::fs::File::open(&dev).expect("open"))
            .spawn()
            .expect("holder"),
    );
    let gate = |which: &str, gpus: &[&str]| {
        let out = Command::new(BIN)
            .args([
                which,
                "--no-nvml",
                "--no-drain",
                "--grace",
                "1s",
                "--timeout",
                "2s",
            ])
            .args(gpus)
            .arg("--device-glob")
            .arg(format!("{}/nvidia*", dir.path().display()))
            .env("SLURM_JOB_ID", "4242")
            .env("SLURM_JOB_UID", "65534")
            .env_remove("SLURM_JOB_GPUS")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env("GPUSWEEP_CONFIG", dir.path().join("none.toml"))
            .env("GPUSWEEP_AUDIT_LOG", dir.path().join("actions.jsonl"))
            .stdin(Stdio::null())
            .output()
            .expect("gate");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), said)
    };
    let pid = holder.0.id().to_string();
    for which in ["prolog", "epilog"] {
        let (code, said) = gate(which, &[]);
        assert_eq!(code, Some(0), "{which}: {said}");
        assert!(said.contains("no GPUs of its own"), "{which}: {said}");
        assert!(
            !said.contains(&pid),
            "{which} names another's process: {said}"
        );
    }
    let (code, said) = gate("prolog", &["--gpus", "all"]);
    assert_eq!(code, Some(1), "--gpus all judges the held GPU: {said}");
    assert!(said.contains(&pid), "{said}");
    let _ = holder.0.kill();
}
