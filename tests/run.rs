//! `gpusweep run` and job attribution against real processes and real cgroups (this machine's cgroup v2
//! mount, found in /proc/self/mountinfo). Stand-in device files play the GPUs (`--device-glob`), as in cli.rs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::support::{BIN, alive, await_cond, set_nvml, standin_nvml, text, unique};

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let e = Env {
            dir: tempfile::tempdir().expect("tempdir"),
        };
        std::fs::write(e.dir.path().join("nvidia0"), b"").expect("stand-in device");
        e
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("GPUSWEEP_AUDIT_LOG", self.path("actions.jsonl"))
            .env("GPUSWEEP_CONFIG", self.path("no-config.toml"))
            // Never a serve a developer runs: every reading here is taken in-process.
            .env("GPUSWEEP_SOCKET", self.path("no-serve.sock"))
            .env_remove("GPUSWEEP_HOSTS")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .stdin(Stdio::null());
        c
    }
    /// `gpusweep sweep --no-nvml --device-glob <stand-ins> --job JOB --yes --grace 2s [extra]`.
    fn sweep_job(&self, job: &str, extra: &[&str]) -> Command {
        let glob = format!("{}/nvidia*", self.dir.path().display());
        let mut c = self.cmd(&[
            "sweep",
            "--no-nvml",
            "--device-glob",
            &glob,
            "--job",
            job,
            "--yes",
            "--grace",
            "2s",
        ]);
        c.args(extra);
        c
    }
    /// `gpusweep run --no-nvml --device-glob <stand-ins> [extra] -- sh -c SCRIPT`.
    fn run_cmd(&self, extra: &[&str], script: &str) -> Command {
        let glob = format!("{}/nvidia*", self.dir.path().display());
        let mut args = vec!["run", "--no-nvml", "--device-glob", &glob, "--grace", "2s"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", script, "launcher"]);
        let mut c = self.cmd(&args);
        c.current_dir(self.dir.path());
        c
    }
    fn snapshot(&self) -> serde_json::Value {
        let glob = format!("{}/nvidia*", self.dir.path().display());
        let o = self
            .cmd(&["snapshot", "--json", "--no-nvml", "--device-glob", &glob])
            .output()
            .expect("snapshot");
        serde_json::from_slice(&o.stdout).expect("json")
    }
}

/// PIDs a launcher wrote to `file`, one a line, once `n` are there.
fn pids_in(file: &Path, n: usize) -> Vec<u32> {
    let mut v = Vec::new();
    await_cond("the launcher's pids", 20, || {
        v = std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        v.len() >= n
    });
    v
}

/// A launcher that double-forks two workers holding the stand-in GPU (one in a session of its own), writes
/// their pids to `workers`, then does `then`.
fn launcher(then: &str) -> String {
    format!(
        "(sleep 300 <nvidia0 >/dev/null 2>&1 & echo $! >>workers); \
         (setsid sleep 301 <nvidia0 >/dev/null 2>&1 & echo $! >>workers); {then}"
    )
}

fn spawn(mut c: Command) -> Child {
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run")
}

#[test]
fn double_forked_workers_end_with_the_command_and_its_status_passes_through() {
    let env = Env::new();
    let o = env.run_cmd(&[], &launcher("exit 3")).output().expect("run");
    let t = crate::support::exited(&o, 3);
    assert!(
        t.contains("in cgroup") && t.contains("cgroup.kill"),
        "a cgroup leaf where one can be made: {t}"
    );
    // A job that held no GPU says so, not "GPU - read zero".
    assert!(t.contains("it held no GPU") && !t.contains("GPU - "), "{t}");
    assert!(t.contains("2 process(es) left"), "{t}");
    for w in pids_in(&env.path("workers"), 2) {
        assert!(!alive(w), "worker {w} outlived its job: {t}");
    }
    let log = std::fs::read_to_string(env.path("actions.jsonl")).expect("audit log");
    assert_eq!(
        log.lines().filter(|l| l.contains("cgroup.kill")).count(),
        2,
        "{log}"
    );
}

#[test]
fn without_a_cgroup_the_subreaper_catches_double_forked_workers() {
    let env = Env::new();
    let o = env
        .run_cmd(&[], &launcher("exit 0"))
        .env("GPUSWEEP_CGROUP_ROOT", env.path("not-a-cgroup"))
        .output()
        .expect("run");
    let t = crate::support::exited(&o, 0);
    assert!(
        t.contains("child subreaper (no cgroup: cannot create"),
        "{t}"
    );
    assert!(t.contains("TERM, KILL after"), "{t}");
    for w in pids_in(&env.path("workers"), 2) {
        assert!(!alive(w), "worker {w} outlived its job: {t}");
    }
}

#[test]
fn a_sigkilled_launcher_and_a_forwarded_term_end_the_whole_job() {
    let env = Env::new();
    // The launcher is SIGKILLed (not gpusweep): its workers are still ended, and the status is 137.
    let child = spawn(env.run_cmd(&[], &launcher("echo $$ >>launcher; exec sleep 300")));
    let l = pids_in(&env.path("launcher"), 1)[0];
    let workers = pids_in(&env.path("workers"), 2);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(l.cast_signed()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the launcher");
    let o = child.wait_with_output().expect("run");
    crate::support::exited(&o, 137);
    for w in workers {
        assert!(!alive(w), "worker {w} outlived its job");
    }
    // TERM to gpusweep goes to the job first; the command's own exit status comes back.
    let child = spawn(env.run_cmd(
        &[],
        "trap 'echo got-term >term; exit 7' TERM; echo $$ >>launcher2; while :; do sleep 0.05; done",
    ));
    pids_in(&env.path("launcher2"), 1);
    let sup = child.id();
    // The supervisor's command line holds nothing of the command: `pkill -f launcher2` cannot hit it.
    let cmdline = std::fs::read(format!("/proc/{sup}/cmdline")).expect("cmdline");
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(cmdline.starts_with("gpusweep run [job "), "{cmdline}");
    assert!(
        !cmdline.contains("launcher2") && !cmdline.contains("trap"),
        "{cmdline}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sup.cast_signed()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("TERM");
    let o = child.wait_with_output().expect("run");
    crate::support::exited(&o, 7);
    assert_eq!(
        std::fs::read_to_string(env.path("term"))
            .expect("trap ran")
            .trim(),
        "got-term"
    );
}

#[test]
fn preflight_refuses_a_held_gpu_and_a_gpu_named_twice() {
    let env = Env::new();
    let mut holder = Command::new("sleep")
        .arg("300")
        .stdin(std::fs::File::open(env.path("nvidia0")).expect("open"))
        .spawn()
        .expect("holder");
    let hp = holder.id();
    let glob = format!("{}/nvidia*", env.dir.path().display());
    await_cond("the holder to be seen", 20, || {
        env.snapshot()["hosts"][0]["holders"]
            .as_array()
            .is_some_and(|h| h.iter().any(|x| x["pid"] == hp))
    });
    let o = env
        .run_cmd(&[], "echo started >started")
        .output()
        .expect("run");
    let t = crate::support::exited(&o, 2);
    assert!(
        t.contains("refusing to start") && t.contains(&hp.to_string()),
        "names the holder: {t}"
    );
    assert!(!env.path("started").exists(), "the command never ran");
    // Told to start anyway, the job runs; at its end, what held the GPU before is named, not blamed, and
    // not waited for (a wait would take the whole minute and end in exit 1).
    let o = env
        .run_cmd(
            &["--no-preflight", "--timeout", "60s"],
            "echo started >started",
        )
        .output()
        .expect("run");
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "the command's status: {t}");
    assert!(env.path("started").exists());
    assert!(
        t.contains("held before the job started") && t.contains(&hp.to_string()),
        "{t}"
    );
    assert!(!t.contains("not clean"), "{t}");
    holder.kill().expect("kill");
    holder.wait().expect("wait");
    let o = env
        .cmd(&["run", "--no-nvml", "--device-glob", &glob, "--", "true"])
        .env("CUDA_VISIBLE_DEVICES", "0,1,0")
        .output()
        .expect("run");
    crate::support::exited(&o, 2);
    assert!(text(&o).contains("names GPU 0 twice"), "{}", text(&o));
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario, start to end
fn a_job_is_named_by_its_cgroup_and_an_orphaned_one_is_found_and_swept_by_job() {
    let env = Env::new();
    // gpusweep run's own job: its worker carries `run:<supervisor>` while the supervisor lives...
    // (Its output goes nowhere: the workers would hold a pipe open for as long as they live.)
    let mut c = env.run_cmd(&[], &launcher("exec sleep 300"));
    let mut child = c
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run");
    let sup = child.id();
    let workers = pids_in(&env.path("workers"), 2);
    let job = format!("run:{sup}");
    await_cond("the worker's job in the snapshot", 20, || {
        env.snapshot()["hosts"][0]["processes"]
            .as_array()
            .is_some_and(|ps| {
                ps.iter()
                    .any(|p| p["pid"] == workers[0] && p["job"]["kind"] == "run")
            })
    });
    let v = env.snapshot();
    let kinds = crate::support::finding_kinds(&v["hosts"][0]);
    assert!(
        !kinds.contains(&"orphaned_job"),
        "its supervisor lives: {kinds:?}"
    );
    // ...and once the supervisor is SIGKILLed, the kernel keeps them in the job's cgroup: an orphaned job.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sup.cast_signed()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
    child.wait().expect("reap the supervisor");
    await_cond("orphaned_job", 20, || {
        env.snapshot()["hosts"][0]["findings"]
            .as_array()
            .is_some_and(|f| {
                f.iter()
                    .any(|x| x["kind"] == "orphaned_job" && x["pid"] == workers[0])
            })
    });
    let o = env.sweep_job(&job, &[]).output().expect("sweep");
    let t = crate::support::exited(&o, 0);
    for w in &workers {
        assert!(!alive(*w), "{w} survived the job sweep: {t}");
    }
    // The leaf the dead supervisor left still holds the launcher (no GPU, so not swept): end it.
    let mount = std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .find(|l| l.contains(" - cgroup2 "))
        .and_then(|l| l.split_whitespace().nth(4).map(PathBuf::from))
        .expect("a cgroup v2 mount");
    let own = std::fs::read_to_string("/proc/self/cgroup").expect("cgroup");
    let own = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("v2 line")
        .trim_start_matches('/');
    let leaf = mount.join(own).join(format!("gpusweep-run-{sup}"));
    std::fs::write(leaf.join("cgroup.kill"), "1").expect("cgroup.kill");
    await_cond("the leaf to empty", 20, || {
        std::fs::read_to_string(leaf.join("cgroup.procs")).is_ok_and(|s| s.trim().is_empty())
    });
    std::fs::remove_dir(&leaf).expect("rmdir the leaf");
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario, start to end
fn slurm_docker_and_unit_cgroups_name_real_processes() {
    let env = Env::new();
    let base = own_v2_cgroup().join(unique("gpusweep-test"));
    let cid = "4f1c2b3a5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70";
    let cases = [
        ("slurmstepd.scope/job_777/step_0", "slurm"),
        (&*format!("docker-{cid}.scope"), "docker"),
        ("vllm-serve.service", "systemd"),
    ];
    let mut kids = Vec::new();
    for (rel, _) in &cases {
        let dir = base.join(rel);
        std::fs::create_dir_all(&dir).expect("a cgroup the test creates (needs root)");
        let c = Command::new("sleep")
            .arg("300")
            .stdin(std::fs::File::open(env.path("nvidia0")).expect("open"))
            .spawn()
            .expect("sleep");
        std::fs::write(dir.join("cgroup.procs"), c.id().to_string()).expect("move into the cgroup");
        kids.push(c);
    }
    let v = env.snapshot();
    let procs = v["hosts"][0]["processes"]
        .as_array()
        .expect("processes")
        .clone();
    for (c, (_, kind)) in kids.iter().zip(&cases) {
        let p = procs
            .iter()
            .find(|p| p["pid"] == c.id())
            .expect("the holder is shown");
        assert_eq!(p["job"]["kind"], *kind, "{p}");
    }
    let slurm = procs
        .iter()
        .find(|p| p["pid"] == kids[0].id())
        .expect("slurm");
    assert_eq!(slurm["job"]["job"], 777);
    let glob = format!("{}/nvidia*", env.dir.path().display());
    let o = env
        .cmd(&[
            "kill",
            "--no-nvml",
            "--device-glob",
            &glob,
            "--job",
            "slurm:777",
            "--yes",
            "--signal",
            "KILL",
        ])
        .output()
        .expect("kill");
    crate::support::exited(&o, 0);
    for (i, mut c) in kids.into_iter().enumerate() {
        if i > 0 {
            c.kill().expect("kill");
        }
        c.wait().expect("wait");
    }
    for (rel, _) in cases.iter().rev() {
        let mut d = base.join(rel);
        while d != base {
            let _ = std::fs::remove_dir(&d);
            d = d.parent().expect("parent").to_path_buf();
        }
    }
    std::fs::remove_dir(&base).expect("rmdir");
}

#[test]
fn a_gpu_taken_during_the_job_is_not_called_clean_at_its_end() {
    let env = Env::new();
    // The GPU is clean when the job starts; while it runs, a process outside the job opens it. At the end
    // that process still holds it: the verdict comes from readings taken after the job, never before.
    let script = "echo $$ >launcher; while [ ! -e go ]; do sleep 0.05; done; exit 0";
    let child = spawn(env.run_cmd(&["--timeout", "1s"], script));
    pids_in(&env.path("launcher"), 1);
    let mut outsider = Command::new("sleep")
        .arg("300")
        .stdin(std::fs::File::open(env.path("nvidia0")).expect("open"))
        .spawn()
        .expect("outsider");
    let op = outsider.id();
    await_cond("the outsider to be seen", 20, || {
        env.snapshot()["hosts"][0]["holders"]
            .as_array()
            .is_some_and(|h| h.iter().any(|x| x["pid"] == op))
    });
    std::fs::write(env.path("go"), b"").expect("go");
    let o = child.wait_with_output().expect("run");
    outsider.kill().expect("kill");
    outsider.wait().expect("wait");
    let t = text(&o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "never clean while {op} holds the GPU: {t}"
    );
    assert!(
        t.contains("not clean") && t.contains(&op.to_string()),
        "{t}"
    );
}

#[test]
fn memory_released_after_the_job_ends_is_seen_at_the_fast_poll_not_the_interval() {
    let env = Env::new();
    let lib = standin_nvml(env.dir.path());
    set_nvml(env.dir.path(), "0\n");
    // The job takes 64 MiB of GPU 0 and exits; the "driver" releases it only after the job is gone, as a
    // real one does ~0.1-1 s after the last holder dies. With a one-hour interval, only the fast poll
    // after the job's end can see the release before the timeout.
    let glob = format!("{}/nvidia*", env.dir.path().display());
    let script = "echo $$ >launcher; echo 64 >nvml.tmp; mv nvml.tmp nvml; exit 0";
    let mut c = env.cmd(&[
        "run",
        "--device-glob",
        &glob,
        "--interval",
        "1h",
        "--timeout",
        "15s",
        "--grace",
        "1s",
        "--",
        "sh",
        "-c",
        script,
    ]);
    c.current_dir(env.dir.path())
        .env("GPUSWEEP_NVML_LIBRARY", &lib)
        .env("STANDIN_NVML_STATE", env.path("nvml"))
        .env("STANDIN_NVML_LOG", env.path("reads"));
    let child = spawn(c);
    let launcher = pids_in(&env.path("launcher"), 1)[0];
    await_cond("the job to end", 20, || !alive(launcher));
    // A reading taken after the job ended still shows its 64 MiB; only then does the driver let go.
    let reads = || std::fs::read_to_string(env.path("reads")).unwrap_or_default();
    let before = reads().lines().count();
    await_cond("a reading of the held memory after the job", 20, || {
        reads().lines().skip(before).any(|l| l == "0 64")
    });
    set_nvml(env.dir.path(), "0\n");
    let o = child.wait_with_output().expect("run");
    let t = crate::support::exited(&o, 0);
    assert!(t.contains("read zero"), "{t}");
}

#[test]
fn exit_255_is_an_exit_status_and_a_long_command_line_is_handed_over() {
    let env = Env::new();
    let o = env.run_cmd(&[], "exit 255").output().expect("run");
    let t = crate::support::exited(&o, 255);
    assert!(
        t.contains("exit status 255") && !t.contains("signal"),
        "{t}"
    );
    // 100 KB of arguments: more than a pipe holds (the supervisor gets its argv through a file of its own).
    let long: Vec<String> = (0..10_000).map(|i| format!("arg{i:05}")).collect();
    let mut c = env.run_cmd(&[], "echo \"$#\" >count");
    c.args(&long);
    let o = c.output().expect("run");
    crate::support::exited(&o, 0);
    assert_eq!(
        std::fs::read_to_string(env.path("count"))
            .expect("count")
            .trim(),
        "10000"
    );
}

/// Lines a child writes to stderr, as they come (a thread reads them).
fn stderr_lines(child: &mut Child) -> std::sync::Arc<std::sync::Mutex<String>> {
    use std::io::BufRead;
    let buf = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let err = child.stderr.take().expect("stderr");
    let b = buf.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            if let Ok(mut s) = b.lock() {
                s.push_str(&line);
                s.push('\n');
            }
        }
    });
    buf
}

/// The stand-in driver's state for four GPUs, each listing its worker with `mib` MiB.
fn four_gpus(workers: &[u32], mib: [u64; 4]) -> String {
    use std::fmt::Write;
    workers
        .iter()
        .zip(mib)
        .fold(String::new(), |mut s, (pid, m)| {
            let _ = writeln!(s, "{m} {pid}:{m}");
            s
        })
}

/// `gpusweep run` of `sh -c SCRIPT` on the stand-in devices and driver of `env` (its state `nvml`, each memory
/// reading logged to `reads`), polled every 200 ms, with `extra` options; started, its stderr read as it
/// comes.
fn run_on_standin(
    env: &Env,
    extra: &[&str],
    script: &str,
) -> (
    crate::support::Reaped,
    std::sync::Arc<std::sync::Mutex<String>>,
) {
    let lib = standin_nvml(env.dir.path());
    let glob = format!("{}/nvidia*", env.dir.path().display());
    let mut args = vec![
        "run",
        "--device-glob",
        &glob,
        "--interval",
        "200ms",
        "--grace",
        "2s",
        "--timeout",
        "15s",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    let mut c = env.cmd(&args);
    c.current_dir(env.dir.path())
        .env("GPUSWEEP_NVML_LIBRARY", &lib)
        .env("STANDIN_NVML_STATE", env.path("nvml"))
        .env("STANDIN_NVML_LOG", env.path("reads"));
    let mut child = crate::support::Reaped(spawn(c));
    let said = stderr_lines(&mut child.0);
    (child, said)
}

#[test]
#[allow(clippy::too_many_lines)] // one warm-up, start to lost rank
fn fail_fast_ends_a_job_that_lost_a_rank_after_saying_its_phases_and_straggler() {
    let env = Env::new();
    for i in 1..4 {
        std::fs::write(env.path(&format!("nvidia{i}")), b"").expect("stand-in device");
    }
    set_nvml(env.dir.path(), "0\n0\n0\n0\n");
    std::fs::write(
        env.path("no-config.toml"),
        "[jobs]\nsettle = \"2s\"\nstraggler = \"1s\"\n",
    )
    .expect("config");
    let events = env.path("events.jsonl");
    let script =
        "for i in 0 1 2 3; do sleep 300 <nvidia$i >/dev/null 2>&1 & echo $! >>workers; done; wait";
    let ev = events.to_str().expect("utf-8");
    let (mut child, said) = run_on_standin(&env, &["--fail-fast=2s", "--events", ev], script);
    let said = || said.lock().map(|s| s.clone()).unwrap_or_default();
    let w = pids_in(&env.path("workers"), 4);
    let reads = || {
        std::fs::read_to_string(env.path("reads"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    let logged = || std::fs::read_to_string(&events).unwrap_or_default();
    // The ranks load, rank 2 at a quarter of its peers' pace; each step waits for a whole reading.
    let mut step = 0u64;
    set_nvml(env.dir.path(), &four_gpus(&w, [0; 4]));
    await_cond("the job starting", 20, || {
        said().contains("starting: 4 rank(s)")
    });
    while !logged().contains("\"kind\":\"straggler\"") {
        step += 1;
        assert!(step < 200, "no straggler named: {}", logged());
        set_nvml(
            env.dir.path(),
            &four_gpus(&w, [step * 512, step * 512, step * 128, step * 512]),
        );
        let n = reads();
        await_cond("a reading", 20, || reads() >= n + 8);
    }
    assert!(said().contains("loading "), "{}", said());
    assert!(
        logged().contains(&format!("\"pid\":{}", w[2])),
        "the straggler is rank 2: {}",
        logged()
    );
    // Rank 2 catches up, and memory stays flat: settled, with the warm-up's length.
    let flat = (step + 8) * 512;
    set_nvml(env.dir.path(), &four_gpus(&w, [flat; 4]));
    await_cond("the job settling", 30, || said().contains("settled at"));
    assert!(said().contains("warm-up"), "{}", said());
    assert!(
        logged().contains("\"event\":\"job_phase\",\"job\""),
        "{}",
        logged()
    );
    // Rank 1 dies; the driver lets go of its memory: the rest are ended at once, exit 3.
    let _ = Command::new("kill")
        .args(["-9", &w[1].to_string()])
        .status();
    set_nvml(
        env.dir.path(),
        &format!(
            "{flat} {}:{flat}\n0\n{flat} {}:{flat}\n{flat} {}:{flat}\n",
            w[0], w[2], w[3]
        ),
    );
    await_cond("the other ranks to be ended", 20, || {
        [w[0], w[2], w[3]].iter().all(|p| !alive(*p))
    });
    // They are gone: the driver lets go of their memory too.
    set_nvml(env.dir.path(), "0\n0\n0\n0\n");
    await_cond("run to end the job", 30, || {
        child.0.try_wait().ok().flatten().is_some()
    });
    let status = child.0.wait().expect("status");
    let t = said();
    assert_eq!(status.code(), Some(3), "{t}");
    assert!(
        t.contains("--fail-fast") && t.contains(&format!("rank {} on GPU 1 exited", w[1])),
        "{t}"
    );
    assert!(t.contains("read zero"), "{t}");
    let log = logged();
    assert!(
        log.lines().any(|l| l.contains("\"event\":\"rank_lost\"")
            && l.contains(&format!("\"pid\":{}", w[1]))
            && l.contains("\"how\":\"exited\"")),
        "{log}"
    );
    assert!(log.contains("\"kind\":\"lost_rank\""), "{log}");
}

#[test]
fn fail_fast_lets_a_job_that_is_ending_anyway_end_on_its_own() {
    // Two ranks of a finished job leave a second apart: the one left holds memory a moment, which is no
    // hang. `--fail-fast` (5 s by default) must not end it, and COMMAND's status passes through.
    let env = Env::new();
    std::fs::write(env.path("nvidia1"), b"").expect("stand-in device");
    set_nvml(env.dir.path(), "0\n0\n");
    let script = "for i in 0 1; do sleep 300 <nvidia$i >/dev/null 2>&1 & echo $! >>workers; done; wait; exit 0";
    let (mut child, said) = run_on_standin(&env, &["--fail-fast"], script);
    let said = || said.lock().map(|s| s.clone()).unwrap_or_default();
    let w = pids_in(&env.path("workers"), 2);
    set_nvml(env.dir.path(), &four_gpus(&w, [4096, 4096, 0, 0])[..]);
    await_cond("the job holding memory", 20, || said().contains("loading "));
    let _ = Command::new("kill")
        .args(["-9", &w[1].to_string()])
        .status();
    set_nvml(env.dir.path(), &format!("4096 {}:4096\n0\n", w[0]));
    await_cond("the lost rank seen", 20, || said().contains("lost a rank"));
    // The last rank finishes a second later (the scenario, not a wait for a condition).
    std::thread::sleep(std::time::Duration::from_secs(1));
    let _ = Command::new("kill")
        .args(["-TERM", &w[0].to_string()])
        .status();
    set_nvml(env.dir.path(), "0\n0\n");
    await_cond("run to end", 30, || {
        child.0.try_wait().ok().flatten().is_some()
    });
    let status = child.0.wait().expect("status");
    let t = said();
    assert_eq!(status.code(), Some(0), "COMMAND's status: {t}");
    assert!(!t.contains("ending the job now"), "{t}");
}

/// The cgroup v2 mount and this test's own cgroup there.
fn own_v2_cgroup() -> PathBuf {
    let mount = std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .find(|l| l.contains(" - cgroup2 "))
        .and_then(|l| l.split_whitespace().nth(4).map(PathBuf::from))
        .expect("a cgroup v2 mount");
    let own = std::fs::read_to_string("/proc/self/cgroup").expect("cgroup");
    let own = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("v2 line")
        .trim_start_matches('/')
        .to_string();
    mount.join(own)
}

/// A cgroup a user was handed, as systemd delegates one (the directory and its files are the user's), with
/// `rel` made inside it by that user; the leaf's path.
fn delegated_cgroup(base: &Path, rel: &str, uid: u32) -> PathBuf {
    std::fs::create_dir_all(base).expect("a cgroup the test creates (needs root)");
    let mut d = base.to_path_buf();
    for part in Path::new(rel).components() {
        d = d.join(part);
        std::fs::create_dir_all(&d).expect("mkdir");
        std::os::unix::fs::chown(&d, Some(uid), Some(uid)).expect("chown");
        for f in ["cgroup.procs", "cgroup.subtree_control"] {
            let _ = std::os::unix::fs::chown(d.join(f), Some(uid), Some(uid));
        }
    }
    d
}

/// Cgroup trees a test made (or a job's leaf it started): their processes killed and the trees removed
/// however the test ends.
struct CgroupsGone(Vec<PathBuf>);

impl Drop for CgroupsGone {
    fn drop(&mut self) {
        for base in &self.0 {
            for d in walkdir(base) {
                let _ = std::fs::write(d.join("cgroup.kill"), "1");
            }
            let _ = await_empty(base);
            remove_cgroups(base);
        }
    }
}

/// Whether every cgroup under `base` is empty of processes within 5 s.
fn await_empty(base: &Path) -> bool {
    let t = std::time::Instant::now();
    while t.elapsed() < std::time::Duration::from_secs(5) {
        if walkdir(base).iter().all(|d| {
            std::fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|s| s.trim().is_empty())
        }) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

/// Remove a cgroup tree made by a test, deepest first (each must be empty of processes).
fn remove_cgroups(base: &Path) {
    let mut dirs: Vec<PathBuf> = walkdir(base);
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for d in dirs {
        let _ = std::fs::remove_dir(&d);
    }
}

fn walkdir(d: &Path) -> Vec<PathBuf> {
    let mut out = vec![d.to_path_buf()];
    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walkdir(&e.path()));
        }
    }
    out
}

/// A process of user `nobody` (65534) holding stand-in `device`, moved into cgroup `leaf`.
fn strangers_holder(device: &Path, leaf: &Path) -> crate::support::Reaped {
    let c = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sleep",
            "300",
        ])
        .stdin(std::fs::File::open(device).expect("open"))
        .stdout(Stdio::null())
        .spawn()
        .expect("setpriv (util-linux)");
    std::fs::write(leaf.join("cgroup.procs"), c.id().to_string()).expect("move into the cgroup");
    crate::support::Reaped(c)
}

#[test]
#[allow(clippy::too_many_lines)] // one job, a stranger's look-alike leaf, the stranger gone
fn a_strangers_look_alike_run_leaf_is_no_rank_of_the_job_and_its_exit_ends_nothing() {
    let env = Env::new();
    for i in 1..3 {
        std::fs::write(env.path(&format!("nvidia{i}")), b"").expect("stand-in device");
    }
    set_nvml(env.dir.path(), "0\n0\n0\n");
    let script =
        "for i in 0 1; do sleep 300 <nvidia$i >/dev/null 2>&1 & echo $! >>workers; done; wait";
    let (mut child, said) = run_on_standin(&env, &["--fail-fast=1s"], script);
    let base = own_v2_cgroup().join(unique("gpusweep-test-user"));
    // Declared after the run: dropped first, its processes never outlive a failing test.
    let _gone = CgroupsGone(vec![
        base.clone(),
        own_v2_cgroup().join(format!("gpusweep-run-{}", child.0.id())),
    ]);
    let said = || said.lock().map(|s| s.clone()).unwrap_or_default();
    let w = pids_in(&env.path("workers"), 2);
    let reads = || {
        std::fs::read_to_string(env.path("reads"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    let nvml = |stranger: Option<u32>| {
        let third = stranger.map_or_else(|| "0\n".to_string(), |p| format!("4096 {p}:4096\n"));
        format!("4096 {}:4096\n4096 {}:4096\n{third}", w[0], w[1])
    };
    set_nvml(env.dir.path(), &nvml(None));
    await_cond("the job loading", 20, || said().contains("loading "));
    // A stranger (nobody, in a subtree of its own as systemd delegates one) names a cgroup after this job's
    // supervisor and holds GPU 2 from it.
    let leaf = delegated_cgroup(
        &base,
        &format!("app.slice/gpusweep-run-{}", child.0.id()),
        65534,
    );
    let mut stranger = strangers_holder(&env.path("nvidia2"), &leaf);
    set_nvml(env.dir.path(), &nvml(Some(stranger.0.id())));
    let snap = env.snapshot();
    let p = snap["hosts"][0]["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["pid"] == stranger.0.id()))
        .expect("the stranger is shown")
        .clone();
    assert_ne!(
        p["job"]["kind"], "run",
        "a look-alike leaf names no run job: {p}"
    );
    // The stranger leaves; the job's two ranks hold on. Past --fail-fast's second, it is still running.
    let _ = stranger.0.kill();
    let _ = stranger.0.wait();
    set_nvml(env.dir.path(), &nvml(None));
    let n = reads();
    await_cond("readings past --fail-fast", 20, || reads() >= n + 30);
    assert!(
        child.0.try_wait().ok().flatten().is_none(),
        "the job was ended: {}",
        said()
    );
    assert!(!said().contains("lost a rank"), "{}", said());
    // Its own ranks end; the job ends as COMMAND does.
    for p in &w {
        let _ = Command::new("kill")
            .args(["-TERM", &p.to_string()])
            .status();
    }
    set_nvml(env.dir.path(), "0\n0\n0\n");
    await_cond("run to end", 30, || {
        child.0.try_wait().ok().flatten().is_some()
    });
    let status = child.0.wait().expect("status");
    assert_ne!(status.code(), Some(3), "{}", said());
}

#[test]
fn a_users_look_alike_slurm_cgroup_names_no_slurm_job() {
    let env = Env::new();
    // Slurm's names where a user chose them: in their user manager's subtree at any depth; under a service
    // delegated to them (`Delegate=yes` with `User=`), a `job_4711` of their own above a look-alike
    // `x_slurmstepd.scope/job_4711`; and a unit name in their subtree. None is the job or unit it says.
    let base = own_v2_cgroup().join(unique("gpusweep-test-user"));
    let _gone = CgroupsGone(vec![base.clone()]);
    let cases = [
        (
            "user@65534.service/app.slice/x_slurmstepd.scope/job_4711/step_0",
            "slurm",
        ),
        (
            "deleg.service/job_4711/x_slurmstepd.scope/job_4711/step_0",
            "slurm",
        ),
        ("user@65534.service/app.slice/vllm.service", "systemd"),
        (
            "deleg2.service/docker-4f1c2b3a5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70.scope",
            "docker",
        ),
    ];
    let mut holders = Vec::new();
    for (rel, _) in &cases {
        let leaf = delegated_cgroup(&base, rel, 65534);
        holders.push(strangers_holder(&env.path("nvidia0"), &leaf));
    }
    let v = env.snapshot();
    for (h, (rel, kind)) in holders.iter().zip(&cases) {
        let p = v["hosts"][0]["processes"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["pid"] == h.0.id()))
            .expect("the holder is shown")
            .clone();
        assert_ne!(p["job"]["kind"], *kind, "{rel}: {p}");
    }
    // `kill --job slurm:4711` finds nothing of them.
    let glob = format!("{}/nvidia*", env.dir.path().display());
    let o = env
        .cmd(&[
            "kill",
            "--no-nvml",
            "--device-glob",
            &glob,
            "--job",
            "slurm:4711",
            "--yes",
        ])
        .output()
        .expect("kill");
    assert!(text(&o).contains("no process of job"), "{}", text(&o));
    for h in &mut holders {
        assert!(alive(h.0.id()), "{}", text(&o));
        let _ = h.0.kill();
        let _ = h.0.wait();
    }
}

/// A job gpusweep itself ends is no crash: `sweep --job` over a launcher's ranks, two of which shrug off TERM
/// until the grace runs out, writes no `rank_lost` (the readings between the signal and the KILL see some
/// ranks gone while others hold their GPUs, which is what a crash looks like from the outside).
#[test]
fn a_job_swept_by_gpusweep_loses_no_rank() {
    let env = Env::new();
    for i in 1..4 {
        std::fs::write(env.path(&format!("nvidia{i}")), b"").expect("stand-in device");
    }
    let script = "sleep 300 <nvidia0 & sleep 301 <nvidia1 & \
                  sh -c \"trap '' TERM; sleep 302\" <nvidia2 & sh -c \"trap '' TERM; sleep 303\" <nvidia3 & \
                  echo $$ >launcher; wait";
    let launcher = crate::support::Reaped(
        Command::new("sh")
            .args(["-c", script])
            .current_dir(env.dir.path())
            .spawn()
            .expect("sh"),
    );
    let pid = pids_in(&env.path("launcher"), 1)[0];
    assert_eq!(pid, launcher.0.id());
    // The job its ranks (the launcher's children) are in, as gpusweep names it.
    let mut job = String::new();
    await_cond("the job's ranks", 20, || {
        let v = env.snapshot();
        let h = &v["hosts"][0];
        let kids: Vec<u64> = h["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["ppid"] == pid)
            .filter_map(|p| p["pid"].as_u64())
            .collect();
        let found = h["jobs"].as_array().into_iter().flatten().find(|j| {
            j["ranks"].as_array().is_some_and(|r| {
                r.iter()
                    .filter(|r| r["pid"].as_u64().is_some_and(|p| kids.contains(&p)))
                    .count()
                    >= 4
            })
        });
        job = found
            .and_then(|j| j["id"].as_str())
            .unwrap_or("")
            .to_string();
        !job.is_empty()
    });
    let events = env.path("events.jsonl");
    let o = env
        .sweep_job(
            &job,
            &[
                "--interval",
                "100ms",
                "--events",
                events.to_str().expect("utf-8"),
            ],
        )
        .output()
        .expect("sweep");
    let log = std::fs::read_to_string(&events).unwrap_or_default();
    assert!(log.contains("signal_sent"), "{}\n{log}", text(&o));
    assert!(
        !log.contains("\"rank_lost\"") && !log.contains("\"lost_rank\""),
        "ended by gpusweep, not lost: {log}"
    );
}

/// `GET path` of a serve at `addr`: the body of its HTTP/1.0 answer.
fn get_body(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").expect("ask");
    let mut r = String::new();
    s.read_to_string(&mut r).expect("answer");
    r.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string()
}

/// The sum of a serve's `gpusweep_job_lost_ranks_total` series.
fn lost_ranks_total(addr: &str) -> f64 {
    get_body(addr, "/metrics")
        .lines()
        .filter(|l| l.starts_with("gpusweep_job_lost_ranks_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A serve watching this host's stand-in devices every 100 ms, its events in `events`, its act notes read from
/// `acts`: it and its address.
fn act_watcher(
    env: &Env,
    glob: &str,
    acts: &Path,
    events: &Path,
) -> (crate::support::Reaped, String) {
    let mut c = env.cmd(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--no-socket",
        "--no-nvml",
        "--device-glob",
        glob,
        "--interval",
        "100ms",
        "--events",
        events.to_str().expect("utf-8"),
    ]);
    c.env("GPUSWEEP_ACTS_DIR", acts)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = crate::support::Reaped(c.spawn().expect("serve"));
    let (addr, _) = crate::support::serve_banner(&mut child.0);
    (child, addr)
}

/// The job of four ranks a serve at `addr` names, and its ranks.
fn four_ranks(addr: &str) -> Option<(String, Vec<u64>)> {
    let v = get_json(addr, "/api/v1/snapshot");
    v["hosts"][0]["jobs"].as_array()?.iter().find_map(|j| {
        let ranks: Vec<u64> = j["ranks"]
            .as_array()?
            .iter()
            .filter_map(|r| r["pid"].as_u64())
            .collect();
        (ranks.len() == 4).then(|| (j["id"].as_str().unwrap_or("").to_string(), ranks))
    })
}

/// How many `rank_lost` events an events file holds.
fn lost_in(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"event\":\"rank_lost\""))
        .count()
}

/// Watchers of one host agree about gpusweep's own acts: two serves watch a launcher's four ranks (each
/// process a watcher, as a second TUI is) while a rank is killed by hand (a crash: one lost rank, seen by
/// both), then a third gpusweep sweeps the job. The sweep left its act note before its signals, so neither
/// watcher counts the swept ranks as lost, and the serve's lost-rank counter stays at the crash's one.
#[test]
fn a_job_swept_by_one_gpusweep_is_no_crash_to_the_others_watching() {
    let env = Env::new();
    for i in 1..4 {
        std::fs::write(env.path(&format!("nvidia{i}")), b"").expect("stand-in device");
    }
    let acts = env.path("acts");
    // The launcher's four ranks (killed when the test ends, whatever happens).
    let _ranks = ranks_by_gpu(&env);
    let glob = format!("{}/nvidia*", env.dir.path().display());
    let logs = [env.path("a.jsonl"), env.path("b.jsonl")];
    let (_a, addr_a) = act_watcher(&env, &glob, &acts, &logs[0]);
    let (_b, addr_b) = act_watcher(&env, &glob, &acts, &logs[1]);
    let mut job = None;
    await_cond("both watchers see the job's four ranks", 30, || {
        job = four_ranks(&addr_a).filter(|_| four_ranks(&addr_b).is_some());
        job.is_some()
    });
    let (job, ranks) = job.expect("the job");
    // A crash: one rank killed by hand, which both watchers see as one lost rank.
    let crashed = i32::try_from(ranks[0]).expect("pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(crashed),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill a rank");
    await_cond("both watchers name the crashed rank lost", 30, || {
        logs.iter().all(|l| lost_in(l) == 1) && lost_ranks_total(&addr_a) >= 1.0
    });
    // A third gpusweep sweeps the job.
    let o = env
        .sweep_job(&job, &[])
        .env("GPUSWEEP_ACTS_DIR", &acts)
        .output()
        .expect("sweep");
    assert!(o.status.success(), "{}", text(&o));
    await_cond("both watchers see the job end", 30, || {
        four_ranks(&addr_a).is_none()
            && four_ranks(&addr_b).is_none()
            && logs.iter().all(|l| {
                std::fs::read_to_string(l).is_ok_and(|t| t.contains("\"event\":\"job_ended\""))
            })
    });
    for l in &logs {
        assert_eq!(
            lost_in(l),
            1,
            "the crash is one lost rank, the sweep none: {}",
            std::fs::read_to_string(l).unwrap_or_default()
        );
    }
    assert!((lost_ranks_total(&addr_a) - 1.0).abs() < f64::EPSILON);
}

/// `gpusweep serve` of this host on the stand-in devices and driver of `env`, polled every 200 ms; it and its
/// `127.0.0.1:PORT`.
fn standin_serve(env: &Env, lib: &Path, glob: &str) -> (crate::support::Reaped, String) {
    let mut serve = crate::support::Reaped(
        env.cmd(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--no-socket",
            "--interval",
            "200ms",
        ])
        .args(["--device-glob", glob])
        .env("GPUSWEEP_NVML_LIBRARY", lib)
        .env("STANDIN_NVML_STATE", env.path("nvml"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve"),
    );
    let (addr, _) = crate::support::serve_banner(&mut serve.0);
    (serve, addr)
}

/// `GET path` of a serve at `addr`, the body of its HTTP/1.0 answer as JSON.
fn get_json(addr: &str, path: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").expect("ask");
    let mut r = String::new();
    s.read_to_string(&mut r).expect("answer");
    let body = r.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or(serde_json::Value::Null)
}

/// The launcher of the EP scene: four ranks, each holding its stand-in GPU (rank 2 a shell that forks a
/// data-loader inheriting its GPU), and a sidecar that opens GPU 3; their PIDs written to `pids`.
const EP_LAUNCHER: &str = r#"
import subprocess, sys, time
dev = lambda i: open(f"nvidia{i}")
ranks = []
for i in range(4):
    cmd = ["sh", "-c", "exec 3<&0; sleep 301 <&3 & wait"] if i == 2 else ["sleep", "300"]
    ranks.append(subprocess.Popen(cmd, stdin=dev(i)))
side = subprocess.Popen(["sleep", "302"], stdin=dev(3))
with open("pids.tmp", "w") as f:
    f.write(" ".join(str(p.pid) for p in ranks) + f" {side.pid}\n")
import os
os.rename("pids.tmp", "pids")
time.sleep(600)
"#;

/// An EP warm-up watched by a serve, as an operator lives it: a slow rank named beside the job's helpers; a
/// rank stopped (SIGSTOP) named as such; a rank killed, then the launcher (the ritual): one job still, its lost
/// rank named, its launcher said gone; and `sweep --job` ending every rank and helper it had.
#[test]
#[allow(clippy::too_many_lines)] // one scene, start to sweep
fn an_ep_job_stays_one_unit_through_its_crash_and_is_swept_whole() {
    let env = Env::new();
    for i in 1..4 {
        std::fs::write(env.path(&format!("nvidia{i}")), b"").expect("stand-in device");
    }
    std::fs::write(
        env.path("no-config.toml"),
        "[jobs]\nsettle = \"60s\"\nstraggler = \"1s\"\nstuck = \"1s\"\n",
    )
    .expect("config");
    set_nvml(env.dir.path(), "0\n0\n0\n0\n");
    let lib = standin_nvml(env.dir.path());
    std::fs::write(env.path("launcher.py"), EP_LAUNCHER).expect("launcher");
    // Started on its own (a double fork): its parent is PID 1 or a subreaper, as a launcher's is.
    let o = Command::new("setsid")
        .args(["-f", "/usr/bin/python3", "launcher.py"])
        .current_dir(env.dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .expect("setsid");
    assert!(o.success());
    let pids: Vec<u32> = {
        let mut v = Vec::new();
        await_cond("the launcher's pids", 20, || {
            v = std::fs::read_to_string(env.path("pids"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            v.len() == 5
        });
        v
    };
    let (ranks, sidecar) = (&pids[..4], pids[4]);
    let launcher = crate::support::stat_field(ranks[0], 1)
        .and_then(|p| p.parse::<u32>().ok())
        .expect("the launcher");
    assert!(launcher > 1 && launcher != std::process::id(), "{launcher}");
    let mut loader = None;
    await_cond("rank 2's data-loader", 20, || {
        loader = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", ranks[2]))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok());
        loader.is_some()
    });
    let loader = loader.expect("loader");
    // Whatever happens, nothing of the scene outlives the test.
    struct Gone(Vec<u32>);
    impl Drop for Gone {
        fn drop(&mut self) {
            for p in self
                .0
                .iter()
                .filter(|p| **p > 1 && **p != std::process::id())
            {
                let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
            }
        }
    }
    let _gone = Gone([&pids[..], &[launcher, loader]].concat());
    let glob = format!("{}/nvidia*", env.dir.path().display());
    let (_serve, addr) = standin_serve(&env, &lib, &glob);
    let job_id = format!("tree:{launcher}");
    let job = || {
        let v = get_json(&addr, "/api/v1/snapshot");
        v["hosts"][0]["jobs"]
            .as_array()
            .and_then(|j| j.iter().find(|j| j["id"] == job_id.as_str()).cloned())
            .unwrap_or(serde_json::Value::Null)
    };
    let state = |mib: [Option<u64>; 4]| {
        let mut s = String::new();
        for (i, m) in mib.iter().enumerate() {
            match m {
                Some(m) => s.push_str(&format!("{m} {}:{m}\n", ranks[i])),
                None => s.push_str("0\n"),
            }
        }
        set_nvml(env.dir.path(), &s);
    };
    // Loading, rank 0 at a quarter of its peers' pace: a straggler, named with the helpers present.
    let mut step = 0u64;
    await_cond("rank 0 named a straggler", 60, || {
        step += 1;
        state([
            Some(512 * step),
            Some(2048 * step),
            Some(2048 * step),
            Some(2048 * step),
        ]);
        std::thread::sleep(std::time::Duration::from_millis(250)); // the warm-up's pace, not a wait
        let j = job();
        j["ranks"].as_array().is_some_and(|r| {
            r.iter()
                .any(|r| r["pid"] == ranks[0] && r["straggler"] == true)
        })
    });
    let j = job();
    assert_eq!(j["ranks"].as_array().map(Vec::len), Some(4), "{j}");
    let mut helpers: Vec<u64> = j["helpers"]
        .as_array()
        .expect("helpers")
        .iter()
        .filter_map(|h| h["pid"].as_u64())
        .collect();
    helpers.sort_unstable();
    let mut want = vec![u64::from(loader), u64::from(sidecar)];
    want.sort_unstable();
    assert_eq!(helpers, want, "{j}");
    // Rank 1 stopped (a debugger, SIGSTOP): named as such once past the window.
    let _ = Command::new("kill")
        .args(["-STOP", &ranks[1].to_string()])
        .status();
    await_cond("the stopped rank named", 20, || {
        job()["lost"].as_array().is_some_and(|l| {
            l.iter()
                .any(|l| l["pid"] == ranks[1] && l["how"] == "stopped")
        })
    });
    // Rank 3 dies; then the ritual: the launcher killed. One job still, its lost ranks named.
    let _ = Command::new("kill")
        .args(["-9", &ranks[3].to_string()])
        .status();
    let held = Some(2048 * step);
    state([Some(512 * step), held, held, None]);
    await_cond("rank 3 lost", 20, || {
        job()["lost"]
            .as_array()
            .is_some_and(|l| l.iter().any(|l| l["pid"] == ranks[3]))
    });
    let _ = Command::new("kill")
        .args(["-9", &launcher.to_string()])
        .status();
    await_cond("the launcher gone", 20, || {
        job()["launcher_gone_ms"].is_u64()
    });
    let v = get_json(&addr, "/api/v1/snapshot");
    let jobs = v["hosts"][0]["jobs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(jobs.len(), 1, "one job: {v}");
    let j = &jobs[0];
    assert_eq!(j["phase"], "lost_rank", "{j}");
    assert!(
        j["lost"]
            .as_array()
            .is_some_and(|l| l.iter().any(|l| l["pid"] == ranks[3])),
        "{j}"
    );
    // `sweep --job` ends every rank and helper it had (read afresh, the launcher long gone).
    let _ = Command::new("kill")
        .args(["-CONT", &ranks[1].to_string()])
        .status();
    let o = env
        .cmd(&[
            "sweep",
            "--job",
            &job_id,
            "--yes",
            "--grace",
            "2s",
            "--no-wait",
        ])
        .args(["--device-glob", &glob])
        .env("GPUSWEEP_NVML_LIBRARY", &lib)
        .env("STANDIN_NVML_STATE", env.path("nvml"))
        .output()
        .expect("sweep");
    crate::support::exited(&o, 0);
    for p in [ranks[0], ranks[1], ranks[2], loader, sidecar] {
        await_cond("the job's processes ended", 20, || !alive(p));
    }
}

/// A launcher of four ranks, each holding its stand-in GPU and nothing else; their PIDs written to `pids`.
const PLAIN_LAUNCHER: &str = r#"
import os, subprocess, time
ranks = [subprocess.Popen(["sleep", "300"], stdin=open(f"nvidia{i}")) for i in range(4)]
with open("pids.tmp", "w") as f:
    f.write(" ".join(str(p.pid) for p in ranks) + "\n")
os.rename("pids.tmp", "pids")
time.sleep(600)
"#;

/// The H100 scene of a crash: a rank SIGKILLed mid-warm-up (NVML still charging it), then the launcher killed,
/// so the dead rank is reaped by init while its peers, orphans now, hold their memory. `check` through the
/// node's serve, polled throughout (past the confirm window), never says ok: the lost rank's leak keeps its
/// memory held when its launcher goes, and the ghost its PID becomes inherits it.
#[test]
#[allow(clippy::too_many_lines)] // one scene: a crash, the ritual, a gate polled through it
fn no_verdict_passes_through_clean_while_a_crashed_jobs_ranks_hold_memory() {
    let env = Env::new();
    for i in 1..4 {
        std::fs::write(env.path(&format!("nvidia{i}")), b"").expect("stand-in device");
    }
    set_nvml(env.dir.path(), "0\n0\n0\n0\n");
    let lib = standin_nvml(env.dir.path());
    // Four ranks, each its GPU's one holder (no sidecar: nothing else names the dead rank's memory).
    std::fs::write(env.path("launcher.py"), PLAIN_LAUNCHER).expect("launcher");
    let o = Command::new("setsid")
        .args(["-f", "/usr/bin/python3", "launcher.py"])
        .current_dir(env.dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .expect("setsid");
    assert!(o.success());
    let mut pids: Vec<u32> = Vec::new();
    await_cond("the launcher's pids", 20, || {
        pids = std::fs::read_to_string(env.path("pids"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        pids.len() == 4
    });
    let ranks = pids.clone();
    let launcher = crate::support::stat_field(ranks[0], 1)
        .and_then(|p| p.parse::<u32>().ok())
        .expect("the launcher");
    assert!(launcher > 1 && launcher != std::process::id(), "{launcher}");
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", ranks[2]))
        .unwrap_or_default();
    struct Gone(Vec<u32>);
    impl Drop for Gone {
        fn drop(&mut self) {
            for p in self
                .0
                .iter()
                .filter(|p| **p > 1 && **p != std::process::id())
            {
                let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
            }
        }
    }
    let mut all = [&pids[..], &[launcher]].concat();
    all.extend(
        children
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok()),
    );
    let _gone = Gone(all);
    // Each rank charged 20 GiB on its GPU, as NVML charges a warmed-up rank.
    let charged = |listed: &[u32]| {
        let mut s = String::new();
        for r in &ranks {
            if listed.contains(r) {
                s.push_str(&format!("20480 {r}:20480\n"));
            } else {
                s.push_str("0\n");
            }
        }
        set_nvml(env.dir.path(), &s);
    };
    charged(&ranks);
    let glob = format!("{}/nvidia*", env.dir.path().display());
    let (_serve, addr) = standin_serve(&env, &lib, &glob);
    let leak = |kind: &str| {
        get_json(&addr, "/api/v1/snapshot")["hosts"][0]["findings"]
            .as_array()
            .is_some_and(|f| {
                f.iter()
                    .any(|f| f["kind"] == kind && f["severity"] == "leak")
            })
    };
    await_cond("the job's four ranks", 20, || {
        get_json(&addr, "/api/v1/snapshot")["hosts"][0]["jobs"][0]["ranks"]
            .as_array()
            .is_some_and(|r| r.len() == 4)
    });
    // Rank 3 dies, its memory freed; its three peers hold theirs and wait on it.
    let _ = Command::new("kill")
        .args(["-9", &ranks[3].to_string()])
        .status();
    charged(&ranks[..3]);
    await_cond("rank 3's loss a confirmed leak", 30, || leak("lost_rank"));
    // The ritual: the launcher killed. Its zombie rank is reaped by init; the three others are orphans.
    let _ = Command::new("kill")
        .args(["-9", &launcher.to_string()])
        .status();
    let check = || {
        env.cmd(&["check", "--hosts", &format!("http://{addr}")])
            .output()
            .expect("check")
    };
    let t = std::time::Instant::now();
    let mut polled = 0;
    while t.elapsed() < std::time::Duration::from_secs(5) {
        let o = check();
        assert_ne!(
            o.status.code(),
            Some(0),
            "ok while the crashed job's ranks hold 60 GiB ({:?} after the launcher's kill): {}",
            t.elapsed(),
            crate::support::text(&o)
        );
        polled += 1;
    }
    assert!(polled >= 5, "checked {polled} times");
}

/// Memory on a GPU past what its live listed process is charged, held by a process that opened the GPU after
/// it was first walked (a sidecar): every process's descriptors are walked again at once, and the holder is
/// named within a few readings, not at the next slow full walk (30 s), and before its memory is a confirmed
/// leak with "no holder found".
#[test]
fn a_residual_walks_every_process_and_finds_a_holder_that_opened_the_gpu_late() {
    let env = Env::new();
    let lib = standin_nvml(env.dir.path());
    set_nvml(env.dir.path(), "0\n");
    // The rank: holds GPU 0 from the start. The sidecar: walked first with no GPU, opens it a moment later.
    let rank = crate::support::Reaped(
        Command::new("sleep")
            .arg("300")
            .stdin(std::fs::File::open(env.path("nvidia0")).expect("open"))
            .spawn()
            .expect("rank"),
    );
    let fifo = Command::new("mkfifo")
        .arg(env.path("go"))
        .status()
        .expect("mkfifo");
    assert!(fifo.success());
    let sidecar = crate::support::Reaped(
        Command::new("sh")
            .args(["-c", "read _ <go; exec sleep 301 <nvidia0"])
            .current_dir(env.dir.path())
            .stdin(Stdio::null())
            .spawn()
            .expect("sidecar"),
    );
    let glob = format!("{}/nvidia*", env.dir.path().display());
    let (_serve, addr) = standin_serve(&env, &lib, &glob);
    set_nvml(env.dir.path(), &format!("1024 {}:1024\n", rank.0.id()));
    let host = || get_json(&addr, "/api/v1/snapshot")["hosts"][0].clone();
    // Its first full walk is done (the rank is known to hold GPU 0; the sidecar to hold nothing).
    await_cond("the rank seen holding its GPU", 20, || {
        host()["holders"]
            .as_array()
            .is_some_and(|h| h.iter().any(|h| h["pid"] == rank.0.id()))
    });
    // The sidecar opens GPU 0 and allocates 4 GiB that NVML does not charge to anyone alive.
    std::fs::write(env.path("go"), "\n").expect("go");
    await_cond("the sidecar holding the GPU", 10, || {
        std::fs::read_link(format!("/proc/{}/fd/0", sidecar.0.id()))
            .is_ok_and(|l| l.ends_with("nvidia0"))
    });
    set_nvml(env.dir.path(), &format!("5120 {}:1024\n", rank.0.id()));
    await_cond("the sidecar named as the holder", 10, || {
        host()["holders"]
            .as_array()
            .is_some_and(|h| h.iter().any(|h| h["pid"] == sidecar.0.id()))
    });
    let h = host();
    assert!(
        !h["findings"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["action"]
                .as_str()
                .is_some_and(|a| a.contains("no holder found")))),
        "{h}"
    );
}

/// A launcher and its ranks, each rank killed when this goes (they outlive the launcher's shell).
struct Ranks {
    _launcher: crate::support::Reaped,
    by_gpu: Vec<u32>,
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for p in &self.by_gpu {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(*p).unwrap_or(i32::MAX)),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// A launcher's four ranks, each `sleep 30N` holding the stand-in device nvidiaN: each GPU's rank once each
/// has exec'd.
fn ranks_by_gpu(env: &Env) -> Ranks {
    let script = "sleep 300 <nvidia0 & sleep 301 <nvidia1 & sleep 302 <nvidia2 & sleep 303 <nvidia3 & \
                  echo $$ >launcher; wait";
    let launcher = crate::support::Reaped(
        Command::new("sh")
            .args(["-c", script])
            .current_dir(env.dir.path())
            .spawn()
            .expect("sh"),
    );
    let pid = pids_in(&env.path("launcher"), 1)[0];
    let ranks: Vec<u32> = {
        let mut v = Vec::new();
        await_cond("the four ranks", 20, || {
            v = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            v.len() == 4
        });
        v.sort_unstable();
        v
    };
    // Each rank on the GPU of its device (its `sleep 30N` reads nvidiaN), 8 GiB each, once each has exec'd.
    let mut by_gpu: Vec<Option<u32>> = vec![None; 4];
    await_cond("each rank's command", 20, || {
        for (i, slot) in by_gpu.iter_mut().enumerate() {
            let want = format!("sleep 30{i}");
            *slot = ranks.iter().copied().find(|p| {
                std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.replace('\0', " ").trim() == want)
            });
        }
        by_gpu.iter().all(Option::is_some)
    });
    Ranks {
        _launcher: launcher,
        by_gpu: by_gpu
            .into_iter()
            .map(|p| p.expect("a rank per GPU"))
            .collect(),
    }
}

/// A job that hangs alive, watched by a serve on the stand-in driver (GPM activity, power): four ranks
/// settle; three GPUs then read busy 100% at 110 W with no SM, tensor or DRAM activity (a collective's wait)
/// while the fourth rank's GPU is idle and the rank asleep. Past the hang window (3 s here) the job is `hung`,
/// the idle rank named as the one the others wait for, the evidence said, and `/metrics` says the phase.
/// Then the same busy GPUs without GPM (no activity counters): `unknown`, said why, never settled.
#[test]
fn a_job_whose_gpus_spin_without_work_is_hung_and_names_the_rank_they_wait_for() {
    let env = Env::new();
    for i in 1..4 {
        std::fs::write(env.path(&format!("nvidia{i}")), b"").expect("stand-in device");
    }
    std::fs::write(
        env.path("no-config.toml"),
        "[jobs]\nsettle = \"1s\"\nhang = \"3s\"\n",
    )
    .expect("config");
    let ranks = ranks_by_gpu(&env);
    let on_gpu = |i: usize| ranks.by_gpu[i];
    let state = |gpm: bool| {
        let mut out = String::new();
        for i in 0..4 {
            let doing = match (i, gpm) {
                (3, _) => "util=0 power=70",
                (_, true) => "util=100 power=110 sm=0.6 tensor=0 dram=0",
                (_, false) => "util=100 power=110",
            };
            out.push_str(&format!("8192 {}:8192 {doing}\n", on_gpu(i)));
        }
        out
    };
    set_nvml(env.dir.path(), &state(true));
    let lib = standin_nvml(env.dir.path());
    let glob = format!("{}/nvidia*", env.dir.path().display());
    let (_serve, addr) = standin_serve(&env, &lib, &glob);
    let job = || -> serde_json::Value {
        get_json(&addr, "/api/v1/snapshot")["hosts"][0]["jobs"]
            .as_array()
            .and_then(|j| j.first().cloned())
            .unwrap_or_default()
    };
    await_cond("hung", 60, || job()["phase"] == "hung");
    let j = job();
    assert_eq!(j["waiting_on"], serde_json::json!([on_gpu(3)]), "{j}");
    let why = j["phase_why"].as_str().unwrap_or("");
    assert!(
        why.starts_with("GPU 0-2 busy 100% at 330 W, SM 0.6%, tensor 0.0%, DRAM 0.0% for "),
        "{why}"
    );
    let metrics = get_body(&addr, "/metrics");
    assert!(
        metrics.lines().any(|l| l.starts_with("gpusweep_job_phase{")
            && l.contains("phase=\"hung\"")
            && l.ends_with(" 1.0")),
        "{metrics}"
    );
    hung_alert_fires_on(&metrics);
    // The same spin on GPUs that give no activity counters: whether it progresses cannot be told.
    set_nvml(env.dir.path(), &state(false));
    await_cond("unknown", 60, || job()["phase"] == "unknown");
    let j = job();
    assert!(
        j["phase_why"]
            .as_str()
            .is_some_and(|w| w.contains("give no activity counters")),
        "{j}"
    );
    assert!(j["waiting_on"].is_null(), "{j}");
}

/// The shipped `GpuJobHung` alert fires on the hung phase a serve exported (its series as recorded, fed to
/// `promtool test rules` with `deploy/prometheus/gpusweep-alerts.yml`), and not before its 30 s.
fn hung_alert_fires_on(metrics: &str) {
    let line = metrics
        .lines()
        .find(|l| l.starts_with("gpusweep_job_phase{") && l.contains("phase=\"hung\""))
        .expect("the hung series");
    let (labels, _) = line.rsplit_once(' ').expect("a value");
    let field = |name: &str| {
        labels
            .split(&format!("{name}=\""))
            .nth(1)
            .and_then(|r| r.split('"').next())
            .expect("label")
            .to_string()
    };
    let (host, job) = (field("Hostname"), field("job_id"));
    let rules = std::fs::canonicalize("deploy/prometheus/gpusweep-alerts.yml").expect("rules");
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("hung.test.yml");
    std::fs::write(
        &file,
        format!(
            r#"rule_files: ["{rules}"]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - series: '{labels}'
        values: '1x8'
    alert_rule_test:
      - eval_time: 15s
        alertname: GpuJobHung
        exp_alerts: []
      - eval_time: 60s
        alertname: GpuJobHung
        exp_alerts:
          - exp_labels: {{severity: warning, Hostname: "{host}", job_id: "{job}", phase: hung}}
            exp_annotations:
              summary: "job {job} on {host} hangs: its GPUs spin without work"
              description: "gpusweep snapshot --hosts {host} names the rank it waits for."
"#,
            rules = rules.display()
        ),
    )
    .expect("test file");
    let o = Command::new("promtool")
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .expect("promtool (Debian's prometheus package)");
    assert!(o.status.success(), "{}", text(&o));
}
