//! The deterministic simulated cluster: anyone can see the product without a GPU, and every test drives it.
//!
//! - `gpu-a`: 8 x H200 warming up an EP8 inference server (weights load, then the KV cache is allocated); rank
//!   5 loads at about half its peers' pace (a straggler).
//! - `gpu-b`: 8 x H200 just after a careless `pkill`: an orphaned TP worker still listed on GPU 6, a ghost PID
//!   on GPU 7 whose context a forked child keeps alive, a zombie whose parent never reaps, nccl leftovers.
//! - `gpu-c`: 8 x RTX PRO 6000 Blackwell (CC 12.0, 99 KB shared memory per block) serving a small model.
//! - `gpu-d`: 8 x RTX PRO 6000 Blackwell whose EP8 warm-up lost rank 3 at 24 s (a kernel tile larger than
//!   the part's shared memory per block) while the seven other ranks keep their memory and wait on it.
//!
//! The state is a pure function of simulated time and the signals received. Killed processes vanish at
//! once; their memory drains 0.1 s later, as a real H200 did after SIGKILL.

// Terminal geometry (u16) and row counts (usize) meet in layout math; every value is bounded by the
// screen or a small simulated quantity, so the casts cannot lose anything that matters.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use gpusweep_core::action::{ActionAnswer, ActionRequest};
use gpusweep_core::model::{
    Gpu, Holder, HostSnapshot, ListedProcess, MIB, Memory, Proc, ProcState, ProcessKind, ShmInfo,
    ShmSegment, SourceKind,
};
use gpusweep_core::removal::{Removal, RemovalOutcome, RemovalRequest};
use gpusweep_core::signal::{Fate, Outcome, Sig, SignalRequest};

pub const DEMO_HOSTS: &[&str] = &["gpu-a", "gpu-b", "gpu-c", "gpu-d"];

/// Simulated time. `Manual` is advanced by tests; `Real` follows the wall clock from creation.
#[derive(Debug, Clone)]
pub enum DemoClock {
    Real(Instant, u64),
    Manual(Arc<AtomicU64>),
}

impl DemoClock {
    pub fn real() -> Self {
        DemoClock::Real(Instant::now(), gpusweep_core::model::now_ms())
    }
    pub fn manual(ms: u64) -> (Self, Arc<AtomicU64>) {
        let a = Arc::new(AtomicU64::new(ms));
        (DemoClock::Manual(a.clone()), a)
    }
    pub fn now_ms(&self) -> u64 {
        match self {
            DemoClock::Real(t, _) => t.elapsed().as_millis() as u64,
            DemoClock::Manual(a) => a.load(Ordering::SeqCst),
        }
    }
    /// Unix ms at simulated time 0: the real start for a live demo, a fixed date under test.
    fn base_unix_ms(&self) -> u64 {
        match self {
            DemoClock::Real(_, base) => *base,
            DemoClock::Manual(_) => EPOCH_S * 1000,
        }
    }
}

/// Unix time a simulated cluster under test pretends it started at (fixed so screens are stable).
const EPOCH_S: u64 = 1_764_669_600;
const DRAIN_MS: u64 = 100;
const H200_TOTAL: u64 = 150_754_820_096;
const H200_RESERVED: u64 = 644_939_776;
const PRO6000_TOTAL: u64 = 102_642_237_440;
const PRO6000_RESERVED: u64 = 503_316_480;
const GIB: u64 = 1024 * MIB;

#[derive(Debug, Clone)]
enum Mem {
    None,
    Const(u64),
    /// Weights ramp from 0 to `weights` over [0, load_ms], then the KV cache is taken at `kv_at_ms`.
    WarmUp {
        weights: u64,
        load_ms: u64,
        kv: u64,
        kv_at_ms: u64,
    },
}

impl Mem {
    fn at(&self, t: u64) -> u64 {
        match *self {
            Mem::None => 0,
            Mem::Const(b) => b,
            Mem::WarmUp {
                weights,
                load_ms,
                kv,
                kv_at_ms,
            } => {
                let w = if t >= load_ms {
                    weights
                } else {
                    weights / load_ms.max(1) * t
                };
                w + if t >= kv_at_ms { kv } else { 0 }
            }
        }
    }
}

#[derive(Debug, Clone)]
struct SimProc {
    pid: u32,
    ppid: u32,
    sid: u32,
    state: ProcState,
    comm: &'static str,
    cmdline: String,
    user: &'static str,
    uid: u32,
    /// GPUs whose device file it holds.
    holds: Vec<u32>,
    /// GPU it is listed on by NVML, with this memory.
    listed_on: Option<u32>,
    mem: Mem,
    benign: bool,
    /// When it died (killed, or of itself in the story), in simulated ms.
    killed_at: Option<u64>,
    /// When it started, in simulated ms (a warm-up's ranks start with the demo); else ten minutes before.
    born_ms: Option<u64>,
    /// Its cgroup path, which names its job.
    cgroup: Option<String>,
}

/// Memory NVML keeps charging to a dead PID while `kept_by` lives.
#[derive(Debug, Clone)]
struct Ghost {
    pid: u32,
    gpu: u32,
    bytes: u64,
    kept_by: u32,
}

#[derive(Debug, Clone)]
pub struct DemoHost {
    name: String,
    gpu_name: &'static str,
    cc: &'static str,
    total: u64,
    reserved: u64,
    procs: Vec<SimProc>,
    ghosts: Vec<Ghost>,
    shm: Vec<ShmSegment>,
    clock: DemoClock,
    /// dcgm-exporter's counters too (a demo serve's dashboard has them to show).
    counters: bool,
    /// Utilization, temperature and power too (`--no-gauges` reads the verdict alone, as on a real host).
    gauges: bool,
    energy: Energy,
}

/// Each GPU's energy so far (mJ) and when it was last counted: the power integrated over the demo's time, so
/// the counter only grows and its `rate()` reads the power gauge.
#[derive(Debug, Default)]
struct Energy(std::sync::Mutex<std::collections::HashMap<u32, (u64, f64)>>);

impl Clone for Energy {
    fn clone(&self) -> Self {
        Energy(std::sync::Mutex::new(
            self.0.lock().map(|m| m.clone()).unwrap_or_default(),
        ))
    }
}

impl Energy {
    /// GPU `i`'s counter at `t` ms, having drawn `watts` since it was last counted (W x ms = mJ).
    fn at(&self, i: u32, t: u64, watts: f64) -> Option<u64> {
        let mut m = self.0.lock().ok()?;
        let e = m.entry(i).or_insert((t, 7.2e9 + f64::from(i) * 1.0e6));
        if t > e.0 {
            e.1 += watts * (t - e.0) as f64;
            e.0 = t;
        }
        Some(e.1 as u64)
    }
}

/// A demo GPU's power draw at `util` percent.
fn watts(cc: &str, util: u32) -> f64 {
    (if cc == "12.0" { 38.0 } else { 76.0 }) + f64::from(util) * 5.5
}

/// Plausible counters for a demo GPU at `util` percent, `t` ms into the demo: clocks of an H200 (or a
/// Blackwell workstation part), energy that grows with power, tensor activity with utilization.
fn demo_counters(cc: &str, util: u32, energy_mj: Option<u64>) -> gpusweep_core::model::Counters {
    let busy = f64::from(util) / 100.0;
    gpusweep_core::model::Counters {
        sm_clock_mhz: Some(if util > 0 { 1980 } else { 345 }),
        mem_clock_mhz: Some(if cc == "12.0" { 14_001 } else { 2619 }),
        memory_temp_c: Some(35 + util / 4),
        energy_mj,
        pcie_replays: Some(0),
        mem_copy_util: Some(util / 2),
        enc_util: Some(0),
        dec_util: Some(0),
        remapped_rows_correctable: Some(0),
        remapped_rows_uncorrectable: Some(0),
        row_remap_failure: Some(false),
        gr_engine_active: Some(busy * 0.95),
        tensor_active: Some(busy * 0.6),
        dram_active: Some(busy * 0.4),
        pcie_tx_bytes_per_s: Some(2.0e6 + busy * 1.5e9),
        pcie_rx_bytes_per_s: Some(3.0e6 + busy * 2.5e9),
        gpm_supported: None,
    }
}

/// Rank `i` of an sglang expert-parallel server whose first rank is `first`, running since the demo began:
/// it holds GPU `i` and NVML lists it there.
fn sglang_rank(i: u32, first: u32, ppid: u32, sid: u32) -> SimProc {
    let cmdline = format!("sglang::scheduler_TP{i}_EP{i}");
    let mut w = sp(first + i, ppid, sid, "python3", &cmdline);
    w.holds = vec![i];
    w.listed_on = Some(i);
    w.born_ms = Some(0);
    w
}

fn sp(pid: u32, ppid: u32, sid: u32, comm: &'static str, cmdline: &str) -> SimProc {
    SimProc {
        pid,
        ppid,
        sid,
        state: ProcState::Sleeping,
        comm,
        cmdline: cmdline.to_string(),
        user: "alice",
        uid: 1000,
        holds: vec![],
        listed_on: None,
        mem: Mem::None,
        benign: false,
        killed_at: None,
        born_ms: None,
        cgroup: None,
    }
}

fn persistenced() -> SimProc {
    let mut p = sp(
        812,
        1,
        812,
        "nvidia-persistenced",
        "/usr/bin/nvidia-persistenced --user nvidia-persistenced",
    );
    p.holds = (0..8).collect();
    p.benign = true;
    p.user = "nvidia-persistenced";
    p.uid = 998;
    p
}

impl DemoHost {
    /// A demo host by name: "gpu-a...", "gpu-b..." or "gpu-c..." tells its story (`gpu-b0042` is one more host
    /// just after a pkill, for a demo fleet of any size); any other name gets gpu-b's story.
    /// The same, with plausible dcgm-exporter counters in every reading.
    #[must_use]
    pub fn with_counters(mut self) -> DemoHost {
        self.counters = true;
        self
    }

    /// The same, read as `--no-gauges` reads a real host: the verdict alone (utilization only where nothing is
    /// listed, which the verdict needs; no temperature, no power).
    #[must_use]
    pub fn without_gauges(mut self) -> DemoHost {
        self.gauges = false;
        self
    }

    pub fn new(name: &str, clock: DemoClock) -> DemoHost {
        if name.starts_with("gpu-a") {
            Self::warming_up(name, clock)
        } else if name.starts_with("gpu-c") {
            Self::blackwell(name, clock)
        } else if name.starts_with("gpu-d") {
            Self::lost_rank(name, clock)
        } else {
            Self::after_pkill(name, clock)
        }
    }

    /// Whether `name` names a demo host: one of `DEMO_HOSTS`, or one of them followed by more letters and
    /// digits (`gpu-a7`, `gpu-b0042`: a demo fleet of any size, each host telling its base's story).
    pub fn is_demo_name(name: &str) -> bool {
        DEMO_HOSTS.iter().any(|base| {
            name.strip_prefix(base)
                .is_some_and(|rest| rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
        })
    }

    fn base(
        name: &str,
        clock: DemoClock,
        gpu_name: &'static str,
        cc: &'static str,
        total: u64,
        reserved: u64,
    ) -> Self {
        DemoHost {
            name: name.to_string(),
            gpu_name,
            cc,
            total,
            reserved,
            procs: vec![persistenced()],
            ghosts: vec![],
            shm: vec![],
            clock,
            counters: false,
            gauges: true,
            energy: Energy::default(),
        }
    }

    fn warming_up(name: &str, clock: DemoClock) -> Self {
        let mut h = Self::base(name, clock, "NVIDIA H200", "9.0", H200_TOTAL, H200_RESERVED);
        let mut launcher = sp(
            4100,
            3980,
            3980,
            "python3",
            "python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8 --ep 8 --port 30000",
        );
        launcher.holds = vec![];
        h.procs.push(sp(3980, 1, 3980, "bash", "-bash"));
        h.procs.push(launcher);
        for i in 0..8u32 {
            let mut w = sglang_rank(i, 4120, 4100, 3980);
            w.cgroup = Some("/system.slice/sglang-ep8.service".into());
            // Each rank loads at a slightly different pace, as real ranks do; rank 5 at half the pace.
            let slow = i == 5;
            w.mem = Mem::WarmUp {
                weights: 84 * GIB + u64::from(i) * 64 * MIB,
                load_ms: if slow {
                    85_000
                } else {
                    40_000 + u64::from(i) * 1_500
                },
                kv: 46 * GIB,
                kv_at_ms: if slow {
                    90_000
                } else {
                    55_000 + u64::from(i) * 700
                },
            };
            h.procs.push(w);
        }
        h
    }

    fn after_pkill(name: &str, clock: DemoClock) -> Self {
        let mut h = Self::base(name, clock, "NVIDIA H200", "9.0", H200_TOTAL, H200_RESERVED);
        // The launcher (7000) is gone. TP6 survived and was reparented to PID 1.
        let mut tp6 = sp(7306, 1, 7000, "python3", "sglang::scheduler_TP6");
        tp6.holds = vec![6];
        tp6.listed_on = Some(6);
        tp6.mem = Mem::Const(71 * GIB + 412 * MIB);
        // Its Slurm job ended; the kernel still keeps it in the job's cgroup.
        tp6.cgroup = Some("/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0".into());
        h.procs.push(tp6);
        // TP7 (7307) was killed, but a child it forked inherited the CUDA context: NVML still charges 7307.
        let mut child = sp(
            7391,
            1,
            7000,
            "python3",
            "python3 -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=12)",
        );
        child.holds = vec![7];
        child.cgroup = Some("/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0".into());
        h.procs.push(child);
        h.ghosts.push(Ghost {
            pid: 7307,
            gpu: 7,
            bytes: 10_640_949_248,
            kept_by: 7391,
        });
        // A benchmark driver that never waits for its finished client.
        h.procs.push(sp(
            7340,
            3900,
            3900,
            "bash",
            "bash run_bench.sh --concurrency 64",
        ));
        h.procs.push(sp(3900, 1, 3900, "bash", "-bash"));
        let mut z = sp(7350, 7340, 3900, "python3", "");
        z.state = ProcState::Zombie;
        h.procs.push(z);
        h.shm = vec![
            ShmSegment {
                name: "nccl-7f3a2c".into(),
                bytes: 33_554_432,
                age_s: Some(95),
                users: Some(vec![]),
                dev: Some(0x2a),
                ino: Some(4101),
                special: false,
            },
            ShmSegment {
                name: "nccl-91bd04".into(),
                bytes: 33_554_432,
                age_s: Some(95),
                users: Some(vec![]),
                dev: Some(0x2a),
                ino: Some(4102),
                special: false,
            },
            ShmSegment {
                name: "torch_7000_2381".into(),
                bytes: 1_048_576,
                age_s: Some(97),
                users: Some(vec![]),
                dev: Some(0x2a),
                ino: Some(4103),
                special: false,
            },
        ];
        h
    }

    /// Eight RTX PRO 6000 Blackwell parts (SM120), nothing on them yet.
    fn pro6000(name: &str, clock: DemoClock) -> Self {
        Self::base(
            name,
            clock,
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "12.0",
            PRO6000_TOTAL,
            PRO6000_RESERVED,
        )
    }

    fn blackwell(name: &str, clock: DemoClock) -> Self {
        let mut h = Self::pro6000(name, clock);
        h.procs.push(sp(
            5200,
            1,
            5200,
            "vllm",
            "vllm serve Qwen/Qwen3-32B --tensor-parallel-size 4 --port 8000",
        ));
        for i in 0..4u32 {
            let mut w = sp(
                5210 + i,
                5200,
                5200,
                "python3",
                &format!("VllmWorker TP{i}"),
            );
            w.holds = vec![i];
            w.listed_on = Some(i);
            w.mem = Mem::Const(82 * GIB + u64::from(i) * 16 * MIB);
            w.cgroup = Some(
                "/system.slice/docker-4f1c2b3a5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70.scope".into(),
            );
            h.procs.push(w);
        }
        h
    }

    /// An EP8 warm-up on SM120 parts: the ranks load their shards, then rank 3's first DeepGEMM kernel asks
    /// for more shared memory per block than the part has and the rank dies; the seven others keep their
    /// memory, waiting on it in a collective until NCCL's watchdog fires.
    fn lost_rank(name: &str, clock: DemoClock) -> Self {
        let mut h = Self::pro6000(name, clock);
        h.procs.push(sp(6090, 1, 6090, "bash", "-bash"));
        let mut launcher = sp(
            6100,
            6090,
            6090,
            "python3",
            "python3 -m sglang.launch_server --model-path Qwen/Qwen3-235B-A22B-FP8 --tp 8 --ep 8 --enable-deepep-moe",
        );
        launcher.born_ms = Some(0);
        h.procs.push(launcher);
        for i in 0..8u32 {
            let mut w = sglang_rank(i, 6120, 6100, 6090);
            w.mem = Mem::WarmUp {
                weights: 29 * GIB + u64::from(i) * 32 * MIB,
                load_ms: 18_000 + u64::from(i) * 400,
                kv: 52 * GIB,
                kv_at_ms: 22_000,
            };
            if i == 3 {
                w.killed_at = Some(24_000);
            }
            h.procs.push(w);
        }
        h
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn alive(p: &SimProc, t: u64) -> bool {
        p.killed_at.is_none_or(|k| t < k)
    }

    /// Memory still charged for a process: live, or killed less than DRAIN_MS ago.
    fn charged(p: &SimProc, t: u64) -> Option<u64> {
        let draining = p.killed_at.is_some_and(|k| t < k + DRAIN_MS);
        (Self::alive(p, t) || draining).then(|| p.mem.at(t))
    }

    fn killed_for(&self, pid: u32, t: u64) -> bool {
        self.procs
            .iter()
            .any(|p| p.pid == pid && p.killed_at.is_some_and(|k| t >= k + DRAIN_MS))
    }

    /// GPU `i` at simulated time `t`: what NVML would list and charge, and the gauges of a busy GPU.
    /// A GPU's counters: dcgm-exporter's where a demo serve has them, else GPM's activity on a GPU that holds
    /// a job (as a real reader's gauges have it), else none.
    fn gpu_counters(
        &self,
        i: u32,
        t: u64,
        util: u32,
        holds_job: bool,
    ) -> Option<Box<gpusweep_core::model::Counters>> {
        if self.counters {
            return Some(Box::new(demo_counters(
                self.cc,
                util,
                self.energy.at(i, t, watts(self.cc, util)),
            )));
        }
        (self.gauges && holds_job).then(|| {
            let c = demo_counters(self.cc, util, None);
            Box::new(gpusweep_core::model::Counters {
                gr_engine_active: c.gr_engine_active,
                tensor_active: c.tensor_active,
                dram_active: c.dram_active,
                ..gpusweep_core::model::Counters::default()
            })
        })
    }

    fn gpu(&self, i: u32, t: u64) -> Gpu {
        let mut listed = Vec::new();
        let mut used = 0u64;
        for p in &self.procs {
            if p.listed_on == Some(i)
                && let Some(b) = Self::charged(p, t)
            {
                listed.push(ListedProcess {
                    pid: p.pid,
                    used_bytes: Some(b),
                    kind: ProcessKind::Compute,
                    name: None,
                    gpu_instance: None,
                });
                // Context overhead NVML does not charge to the process.
                used += b + 10 * MIB;
            }
        }
        for g in self.ghosts.iter().filter(|g| g.gpu == i) {
            if !self.killed_for(g.kept_by, t) {
                listed.push(ListedProcess {
                    pid: g.pid,
                    used_bytes: Some(g.bytes),
                    kind: ProcessKind::Compute,
                    name: None,
                    gpu_instance: None,
                });
                used += g.bytes + 9 * MIB;
            }
        }
        let busy = !listed.is_empty() && used > 40 * GIB;
        let wave = ((t as f64 / 1000.0 + f64::from(i)) * 0.7).sin();
        let util = if busy && self.name != "gpu-b" {
            (70.0 + 25.0 * wave) as u32
        } else {
            0
        };
        let counters = self.gpu_counters(i, t, util, !listed.is_empty());
        Gpu {
            judged: None,
            state: None,
            counters,
            index: i,
            uuid: Some(format!(
                "GPU-{:08x}-{:04x}-4e0f-9a31-{:012x}",
                fnv(&self.name),
                i * 0x1111,
                0x3cdb_bceb_d2a0_u64 + u64::from(i)
            )),
            name: Some(self.gpu_name.to_string()),
            pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + i * 0x10)),
            minor: Some(i),
            memory: Memory {
                used: Some(used),
                total: Some(self.total),
                reserved: Some(self.reserved),
            },
            utilization: (self.gauges || listed.is_empty()).then_some(util),
            temperature_c: self.gauges.then_some(31 + util / 3),
            power_mw: self
                .gauges
                .then_some((watts(self.cc, util) * 1000.0) as u32),
            compute_capability: Some(self.cc.to_string()),
            mig_enabled: Some(false),
            persistence_mode: Some(true),
            processes: listed,
            error: None,
            kept: false,
            reset_blockers: Vec::new(),
            recovery_action: Some("none".into()),
            mig: Vec::new(),
            mig_error: None,
            xids: None,
        }
    }

    /// The live processes as /proc would show them, the GPU holders among them, and the zombies.
    fn procs(&self, base_s: u64, t: u64) -> (Vec<Proc>, Vec<Holder>, Vec<u32>) {
        let mut processes = Vec::new();
        let mut holders = Vec::new();
        let mut zombies = Vec::new();
        for p in self.procs.iter().filter(|p| Self::alive(p, t)) {
            processes.push(Proc {
                pid: p.pid,
                ppid: p.ppid,
                sid: p.sid,
                state: p.state,
                start_time: 10_000 + u64::from(p.pid) * 3,
                started_at: Some(
                    p.born_ms
                        .map_or(base_s - 600 + u64::from(p.pid) / 100, |b| base_s + b / 1000),
                ),
                uid: Some(p.uid),
                user: Some(p.user.to_string()),
                comm: p.comm.to_string(),
                cmdline: p.cmdline.clone(),
                cgroup: p.cgroup.clone(),
                job: p
                    .cgroup
                    .as_deref()
                    .and_then(gpusweep_core::job::from_cgroup),
                ..Default::default()
            });
            if p.state.is_zombie() {
                zombies.push(p.pid);
            }
            if !p.holds.is_empty() {
                let mut devices: Vec<String> =
                    p.holds.iter().map(|g| format!("/dev/nvidia{g}")).collect();
                devices.push("/dev/nvidia-uvm".into());
                devices.push("/dev/nvidiactl".into());
                holders.push(Holder {
                    pid: p.pid,
                    gpus: p.holds.clone(),
                    fd_count: devices.len() as u32 + 20,
                    devices,
                    benign: p.benign,
                    kept: false,
                    declared: false,
                });
            }
        }
        processes.sort_by_key(|p| p.pid);
        holders.sort_by_key(|h| h.pid);
        (processes, holders, zombies)
    }

    /// The simulated reading now.
    pub fn snapshot(&self) -> HostSnapshot {
        let t = self.clock.now_ms();
        let gpus = (0..8u32).map(|i| self.gpu(i, t)).collect();
        let (processes, holders, zombies) = self.procs(self.clock.base_unix_ms() / 1000, t);
        let shm_used: u64 = self.shm.iter().map(|s| s.bytes).sum();
        HostSnapshot {
            live_url: None,
            host: self.name.clone(),
            error: None,
            taken_at_ms: self.clock.base_unix_ms() + t,
            source: SourceKind::Demo,
            simulated: true,
            acts: Vec::new(),
            gpu_error: None,
            driver_version: Some("580.159.04".into()),
            gpus,
            processes,
            holders,
            zombies,
            shm: Some(ShmInfo {
                total: Some(128 * GIB),
                used: Some(shm_used),
                free: Some(128 * GIB - shm_used),
                segments: self.shm.clone(),
                // The kernel's defaults (2^64 - 2^24): no limit.
                shmmax: None,
                shmall: None,
                shmmax_unlimited: true,
                shmall_unlimited: true,
                shmmni: Some(4096),
                sysv_segments: vec![],
                dir: None,
                pods: Vec::new(),
                pods_unread: None,
            }),
            unreadable_processes: 0,
            in_child_pid_namespace: false,
            missing_features: if self.gauges {
                vec![]
            } else {
                vec![gpusweep_core::model::Feature::Gauges]
            },
            findings: vec![],
            jobs: vec![],
        }
    }

    /// Carry out an action on the simulation.
    pub fn act(&mut self, req: &ActionRequest) -> ActionAnswer {
        match req {
            ActionRequest::Signal(r) => ActionAnswer::Signal(self.signal(r)),
            ActionRequest::Remove(r) => ActionAnswer::Remove(self.remove(r)),
        }
    }

    /// Remove simulated /dev/shm files, with the checks a real host makes: the same inode, nobody using it.
    pub fn remove(&mut self, req: &RemovalRequest) -> Vec<RemovalOutcome> {
        req.files
            .iter()
            .map(|f| {
                let at = self.shm.iter().position(|s| s.name == f.name);
                let result = match at.map(|i| &self.shm[i]) {
                    None => Removal::AlreadyGone,
                    Some(s) if s.ino != Some(f.ino) || s.dev != Some(f.dev) => Removal::Refused {
                        reason: "another file has this name now (device or inode changed since it was chosen)"
                            .into(),
                    },
                    Some(s) if s.users.as_ref().is_none_or(|u| !u.is_empty()) => Removal::Refused {
                        reason: "in use now".into(),
                    },
                    Some(_) => {
                        if let Some(i) = at {
                            self.shm.remove(i);
                        }
                        Removal::Removed
                    }
                };
                RemovalOutcome {
                    name: f.name.clone(),
                    dir: None,
                    bytes: f.bytes,
                    result,
                }
            })
            .collect()
    }

    /// Signals act on the simulation with the same refusals as real delivery.
    pub fn signal(&mut self, req: &SignalRequest) -> Vec<Outcome> {
        let t = self.clock.now_ms();
        let mut out = Vec::new();
        for target in &req.targets {
            let mut o = Outcome {
                pid: target.pid,
                start_time: target.start_time,
                cmdline: target.cmdline.clone(),
                fate: Fate::AlreadyGone,
            };
            if target.pid <= 1 {
                o.fate = Fate::Refused {
                    reason: "PID 1 is never signalled".into(),
                };
                out.push(o);
                continue;
            }
            let Some(idx) = self
                .procs
                .iter()
                .position(|p| p.pid == target.pid && Self::alive(p, t))
            else {
                out.push(o);
                continue;
            };
            if 10_000 + u64::from(target.pid) * 3 != target.start_time {
                o.fate = Fate::Refused {
                    reason: "PID reused: start time differs".into(),
                };
                out.push(o);
                continue;
            }
            let p = &self.procs[idx];
            o.cmdline.clone_from(&p.cmdline);
            // As a real host refuses: a zombie is dead already, a signal would be sent to no effect.
            if p.state.is_zombie() {
                o.fate = Fate::Refused {
                    reason: format!(
                        "a zombie: dead already, it holds nothing; its parent {} must reap it",
                        p.ppid
                    ),
                };
                out.push(o);
                continue;
            }
            if matches!(
                req.signal,
                Sig::Kill | Sig::Term | Sig::Int | Sig::Hup | Sig::Quit
            ) {
                self.kill_tree(target.pid, t);
                o.fate = Fate::Exited {
                    signal: req.signal,
                    after_ms: 0,
                };
            } else {
                o.fate = Fate::Signalled { signal: req.signal };
            }
            out.push(o);
        }
        out
    }

    /// A process dies; a launcher takes its workers with it; its zombie children are reaped by init.
    fn kill_tree(&mut self, pid: u32, t: u64) {
        let children: Vec<u32> = self
            .procs
            .iter()
            .filter(|p| p.ppid == pid && Self::alive(p, t))
            .map(|p| p.pid)
            .collect();
        if let Some(p) = self.procs.iter_mut().find(|p| p.pid == pid) {
            p.killed_at = Some(t);
        }
        for c in children {
            let zombie = self.procs.iter().any(|p| p.pid == c && p.state.is_zombie());
            if zombie || self.procs.iter().any(|p| p.pid == c && p.comm == "python3") {
                self.kill_tree(c, t);
            }
        }
    }
}

fn fnv(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

impl super::Source for DemoHost {
    fn host(&self) -> &str {
        &self.name
    }
    fn poll(&mut self) -> Result<HostSnapshot, super::SourceError> {
        Ok(self.snapshot())
    }
    fn simulate(&mut self, req: &ActionRequest) -> Option<ActionAnswer> {
        Some(DemoHost::act(self, req))
    }
}

#[cfg(test)]
mod energy_tests {
    use super::*;

    #[test]
    fn the_energy_counter_only_grows_and_its_rate_is_the_power() {
        let e = Energy::default();
        let a = e.at(0, 1_000, 458.0).expect("a");
        // Power falls: the counter still grows, by what was drawn (W x ms = mJ).
        let b = e.at(0, 3_000, 76.0).expect("b");
        assert_eq!(b - a, 152_000);
        // A reading of an earlier moment adds nothing.
        assert_eq!(e.at(0, 2_000, 900.0), Some(b));
    }
}
