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
        for d in &mut self.daemons {
            let _ = d.kill();
            let _ = d.wait();
        }
    }
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

    #[allow(clippy::too_many_lines)] // munged, the epilog script, slurm.conf, slurmctld, slurmd, in order
    fn start() -> Cluster {
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
                 SchedulerType=sched/builtin\nMpiDefault=none\nReturnToService=2\nEpilog={}\n\
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
    let wrap = format!(
        "sh -c '(sleep 300 <{} >/dev/null 2>&1 & echo $! >{})'; echo done",
        dev.display(),
        pidfile.display()
    );
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
    let o = Command::new(BIN)
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
        .expect("prolog");
    let t = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.starts_with("gpusweep: ") && t.contains(&outside.id().to_string()),
        "{t}"
    );
    outside.kill().expect("kill");
    outside.wait().expect("wait");
    // Recovered as the README says: the GPU is clean again, so resume the node.
    let o = Command::new(BIN)
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
        .expect("prolog");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    c.client("scontrol", &["update", "NodeName=gsnode", "State=RESUME"]);
    await_cond_every("idle again", 20, POLL, || c.node().starts_with("idle"));
}
