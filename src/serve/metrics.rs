//! `/metrics`: the latest readings in the OpenMetrics text format (prometheus-client; the Prometheus text
//! format for readers that do not ask for OpenMetrics), with dcgm-exporter's
//! memory gauges and labels beside gpusweep's own verdicts. Built fresh at each scrape from the latest
//! readings, so a GPU or a process that is gone leaves no stale series behind; only the histogram persists.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Registry, Unit};

use super::hub::{Reading, Shared};
use crate::core::metrics as m;
use crate::core::model::{FindingKind, Gpu, GpuState, HostSnapshot, MIB, Severity};
use crate::core::seal::{HostSummary, SealKey};

/// Labels of one series: (name, value) pairs in the order they are written.
pub type Labels = Vec<(&'static str, String)>;

type Gauges = Family<Labels, Gauge<f64, AtomicU64>>;

const KINDS: [FindingKind; 14] = FindingKind::ALL;

const SEVERITIES: [(Severity, &str); 3] = [
    (Severity::Leak, "leak"),
    (Severity::Warning, "warning"),
    (Severity::Info, "info"),
];

/// `HOST_IDENTITY_DIGEST`: what a `prom:` client's identity read takes from the host's series (each GPU's
/// labels on its memory, the serve's info), hashed, so that it moves exactly when one of them does. The
/// GPUs' part only where their series are exported (not while the reading failed).
fn identity_digest(snap: &HostSnapshot, scheme: &str, api_path: &str) -> f64 {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    let mut field = |v: &str| {
        h.update(v.as_bytes());
        h.update([0xff]);
    };
    field(scheme);
    field(api_path);
    field(if snap.simulated { "simulated" } else { "" });
    if snap.error.is_none() {
        for g in &snap.gpus {
            for (_, v) in gpu_identity(g) {
                field(&v);
            }
        }
    }
    let d = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    (u64::from_be_bytes(first) >> (64 - m::DIGEST_BITS)) as f64
}

/// The labels that identify a GPU, in dcgm-exporter's order: gpu, UUID, pci_bus_id, device, modelName (what a
/// `prom:` client's identity read takes, and so what `identity_digest` hashes).
fn gpu_identity<'a>(g: &'a Gpu) -> [(&'static str, Cow<'a, str>); 5] {
    let text = |v: Option<&'a str>| Cow::Borrowed(v.unwrap_or_default());
    [
        (m::L_GPU, Cow::Owned(g.index.to_string())),
        (m::L_UUID, text(g.uuid.as_deref())),
        (m::L_PCI_BUS_ID, text(g.pci_bus_id.as_deref())),
        (
            m::L_DEVICE,
            Cow::Owned(format!("nvidia{}", g.minor.unwrap_or(g.index))),
        ),
        (m::L_MODEL, text(g.name.as_deref())),
    ]
}

/// dcgm-exporter's labels for one GPU, in its order: gpu, UUID, pci_bus_id, device, modelName, Hostname.
fn gpu_labels(host: &str, driver: Option<&str>, g: &Gpu) -> Labels {
    let mut l: Labels = gpu_identity(g)
        .into_iter()
        .map(|(k, v)| (k, v.into_owned()))
        .collect();
    l.extend([
        (m::L_HOSTNAME, host.to_string()),
        (m::L_HOSTNAME_NEW, host.to_string()),
        (m::L_DRIVER, driver.unwrap_or_default().to_string()),
    ]);
    l
}

fn with(mut l: Labels, k: &'static str, v: impl Into<String>) -> Labels {
    l.push((k, v.into()));
    l
}

fn set(f: &Gauges, l: &Labels, v: f64) {
    f.get_or_create(&escaped(l)).set(v);
}

/// Label values as the exposition format spells them (`\\`, `\"`, `\n`): prometheus-client writes them as
/// given, and a value a host chose (a unit or container name from a cgroup path) could otherwise close its
/// quote and add labels or lines.
fn escaped(l: &Labels) -> Labels {
    l.iter()
        .map(|(k, v)| {
            let v = if v.contains(['\\', '"', '\n']) {
                v.replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n")
            } else {
                v.clone()
            };
            (*k, v)
        })
        .collect()
}

#[derive(Default)]
struct Families {
    fb_used: Gauges,
    fb_free: Gauges,
    fb_reserved: Gauges,
    clean: Gauges,
    readable: Gauges,
    host_readable: Gauges,
    unexplained: Gauges,
    leftover: Gauges,
    blockers: Gauges,
    recovery: Gauges,
    xids: Gauges,
    findings: Gauges,
    host_findings: Gauges,
    host_states: Gauges,
    host_clean_used: Gauges,
    host_seal: Gauges,
    host_finding_kinds: Gauges,
    identity: Gauges,
    process: Gauges,
    shm: Gauges,
    taken: Gauges,
    revision: Gauges,
    info: Gauges,
    time_to_clean: TimeToCleanView,
    job_phase: Gauges,
    job_bytes: Gauges,
    warmup: TimeToCleanView,
    lost_ranks: CounterView,
    /// dcgm-exporter's fields, in `DCGM_FIELDS`' order.
    dcgm: Vec<Gauges>,
}

impl Families {
    fn add_host(&mut self, shared: &Shared, i: usize, r: &Reading, api_path: &str) {
        let snap = &r.snap;
        let host = snap.host.as_str();
        if let Some(t) = shared.stats.get(i) {
            for (after, h) in [("signal", &t.after_signal), ("exit", &t.after_exit)] {
                let l = vec![
                    (m::L_HOSTNAME, host.to_string()),
                    ("after", after.to_string()),
                ];
                self.time_to_clean.0.push((escaped(&l), h.clone()));
            }
            let hl: Labels = vec![(m::L_HOSTNAME, host.to_string())];
            self.warmup.0.push((escaped(&hl), t.warmup.clone()));
            self.lost_ranks.0.push((escaped(&hl), t.lost_ranks.clone()));
        }
        let hl: Labels = vec![(m::L_HOSTNAME, host.to_string())];
        set(&self.taken, &hl, snap.taken_at_ms as f64 / 1000.0);
        set(&self.revision, &hl, r.content as f64);
        if shared.expect_gpus {
            set(
                &self.host_readable,
                &hl,
                f64::from(u8::from(gpus_readable(snap))),
            );
        }
        set(
            &self.info,
            &vec![
                (m::L_HOSTNAME, host.to_string()),
                ("version", env!("CARGO_PKG_VERSION").to_string()),
                ("scheme", shared.scheme.to_string()),
                ("api_path", api_path.to_string()),
                // A demo serve says so: a client reading it through Prometheus marks it DEMO.
                ("simulated", snap.simulated.to_string()),
            ],
            1.0,
        );
        set(
            &self.identity,
            &hl,
            identity_digest(snap, shared.scheme, api_path),
        );
        let readable = shared.expect_gpus.then(|| gpus_readable(snap));
        let summary = HostSummary::of(snap, readable);
        if let Some(key) = &shared.seal {
            self.add_seal(&hl, &summary, key);
        }
        if snap.error.is_some() {
            return;
        }
        self.add_gpus(host, snap);
        self.add_unexplained(host, snap);
        self.add_leftovers(host, snap);
        for kind in KINDS {
            for (sev, word) in SEVERITIES {
                let n = snap
                    .findings
                    .iter()
                    .filter(|f| f.kind == kind && f.severity == sev)
                    .count();
                let l = vec![
                    (m::L_HOSTNAME, host.to_string()),
                    ("kind", kind.as_str().to_string()),
                    ("severity", word.to_string()),
                ];
                set(&self.findings, &l, n as f64);
            }
        }
        set(&self.host_findings, &hl, snap.findings.len() as f64);
        self.add_summary(&summary, &hl);
        let shm: u64 = snap
            .findings
            .iter()
            .filter(|f| f.kind == FindingKind::ShmLeftover)
            .filter_map(|f| f.bytes)
            .sum();
        set(&self.shm, &hl, shm as f64);
        // A node whose /proc hides processes: no reader without a token learns their jobs here either.
        let shows_jobs = shared.http_view == super::redact::View::Whole;
        self.add_processes(host, snap, shows_jobs);
        self.add_jobs(host, snap, shows_jobs);
    }

    /// The host's compact summary (`HOST_GPU_STATES`, `HOST_CLEAN_USED`, `HOST_FINDING_KINDS`): what a
    /// `prom:` client shows of the host before it reads its per-GPU series, encoded by `HostSummary` alone
    /// (the same the seal is made over).
    fn add_summary(&self, summary: &HostSummary, hl: &Labels) {
        for (st, mask) in &summary.states {
            set(
                &self.host_states,
                &with(hl.clone(), "state", st.as_str()),
                *mask as f64,
            );
        }
        if let Some(used) = summary.clean_used {
            set(&self.host_clean_used, hl, used as f64);
        }
        for ((kind, sev), n) in &summary.kinds {
            let l = with(
                with(hl.clone(), "kind", kind.as_str()),
                "severity",
                sev.as_str(),
            );
            set(&self.host_finding_kinds, &l, *n as f64);
        }
    }

    /// The seal over the summary (`HOST_SEAL`): its time and its two parts.
    fn add_seal(&self, hl: &Labels, summary: &HostSummary, key: &SealKey) {
        let [mac_0, mac_1] = summary.seal(key);
        for (part, v) in [
            ("taken_ms", summary.taken_ms),
            ("mac_0", mac_0),
            ("mac_1", mac_1),
            ("simulated", u64::from(summary.simulated)),
        ] {
            set(
                &self.host_seal,
                &with(hl.clone(), m::L_PART, part),
                v as f64,
            );
        }
    }

    /// Each job's phase (1 for the one it is in) and memory, the largest `JOB_SERIES` jobs of the host.
    /// Where readers may not learn other users' jobs, a job is named by its launcher's PID alone.
    fn add_jobs(&self, host: &str, snap: &HostSnapshot, shows_jobs: bool) {
        let mut jobs: Vec<&crate::core::job::JobReport> = snap.jobs.iter().collect();
        jobs.sort_by_key(|j| std::cmp::Reverse(j.bytes.unwrap_or(0)));
        for j in jobs.into_iter().take(m::JOB_SERIES) {
            let name = if shows_jobs {
                j.id.clone()
            } else {
                format!("pid:{}", j.launcher.unwrap_or(0))
            };
            for phase in crate::core::job::Phase::ALL {
                let l = vec![
                    (m::L_HOSTNAME, host.to_string()),
                    (m::L_JOB_ID, name.clone()),
                    ("phase", phase.as_str().to_string()),
                ];
                set(&self.job_phase, &l, f64::from(u8::from(j.phase == phase)));
            }
            if let Some(b) = j.bytes {
                let l = vec![(m::L_HOSTNAME, host.to_string()), (m::L_JOB_ID, name)];
                set(&self.job_bytes, &l, b as f64);
            }
        }
    }

    /// Each GPU's memory gauges, whether it was read, and the ledger's verdict.
    fn add_gpus(&self, host: &str, snap: &HostSnapshot) {
        for g in &snap.gpus {
            let l = gpu_labels(host, snap.driver_version.as_deref(), g);
            for ((_, _, field), family) in m::DCGM_FIELDS.iter().zip(&self.dcgm) {
                if let Some(v) = field(g) {
                    set(family, &l, v);
                }
            }
            set(
                &self.readable,
                &l,
                f64::from(u8::from(g.memory.used.is_some())),
            );
            if g.mig.is_empty() {
                self.add_memory(&l, &g.memory);
            }
            // In MIG mode the framebuffer is each instance's, labelled as dcgm-exporter labels it (the
            // GPU's own would count every instance twice in a sum).
            for i in &g.mig {
                let il = with(
                    with(
                        l.clone(),
                        m::L_GPU_I_PROFILE,
                        i.profile.clone().unwrap_or_default(),
                    ),
                    m::L_GPU_I_ID,
                    i.gpu_instance.map(|x| x.to_string()).unwrap_or_default(),
                );
                self.add_memory(&il, &i.memory);
            }
            if snap.holders_known() {
                set(&self.blockers, &l, g.reset_blockers.len() as f64);
            }
            if let Some(a) = &g.recovery_action {
                set(&self.recovery, &with(l.clone(), "action", a.clone()), 1.0);
            }
            for (xid, n) in g.xids.iter().flat_map(|x| x.counts.iter()) {
                set(
                    &self.xids,
                    &with(l.clone(), "xid", xid.to_string()),
                    *n as f64,
                );
            }
            // The ledger's verdict: absent where the GPU's state could not be told.
            match g.state {
                Some(GpuState::Clean) => set(&self.clean, &l, 1.0),
                Some(GpuState::InUse | GpuState::Leak | GpuState::NeedsReset) => {
                    set(&self.clean, &l, 0.0);
                }
                Some(GpuState::Unknown | GpuState::Error) | None => {}
            }
        }
    }

    /// Framebuffer used, free and reserved (MiB), as far as they were read.
    fn add_memory(&self, l: &Labels, mem: &crate::core::model::Memory) {
        if let Some(used) = mem.used {
            set(&self.fb_used, l, (used / MIB) as f64);
            if let Some(total) = mem.total {
                let free = total
                    .saturating_sub(used)
                    .saturating_sub(mem.reserved.unwrap_or(0));
                set(&self.fb_free, l, (free / MIB) as f64);
            }
        }
        if let Some(r) = mem.reserved {
            set(&self.fb_reserved, l, (r / MIB) as f64);
        }
    }

    /// Unexplained bytes per GPU, in two parts that add up: what NVML charges to dead PIDs (ghost), and what
    /// is charged to nobody (residual). NaN where a ghost's charge is unknown (never a made-up 0).
    fn add_unexplained(&self, host: &str, snap: &HostSnapshot) {
        let mut ghost: BTreeMap<u32, Option<u64>> = BTreeMap::new();
        let mut residual: BTreeMap<u32, Option<u64>> = BTreeMap::new();
        for f in &snap.findings {
            let Some(gpu) = f.gpu else { continue };
            let into = match f.kind {
                FindingKind::Ghost => &mut ghost,
                FindingKind::Residual => &mut residual,
                _ => continue,
            };
            let e = into.entry(gpu).or_insert(Some(0));
            *e = match (*e, f.bytes) {
                (Some(a), Some(b)) => Some(a + b),
                _ => None,
            };
        }
        for (gpu, bytes) in &mut residual {
            // A residual counts every byte no live listed process accounts for, the ghosts' charges too.
            if let (Some(r), Some(Some(g))) = (bytes.as_mut(), ghost.get(gpu)) {
                *r = r.saturating_sub(*g);
            }
        }
        for (kind, map) in [("ghost", &ghost), ("residual", &residual)] {
            for (gpu, bytes) in map {
                let Some(g) = snap.gpu(*gpu) else { continue };
                let l = with(
                    gpu_labels(host, snap.driver_version.as_deref(), g),
                    "kind",
                    kind,
                );
                set(&self.unexplained, &l, bytes.map_or(f64::NAN, |b| b as f64));
            }
        }
    }

    /// What each leftover holds, by GPU and kind, from the moment it is seen (a lowered finding included:
    /// an alert need not wait a poll past the confirm window); a kept one (a note) is no leftover.
    fn add_leftovers(&self, host: &str, snap: &HostSnapshot) {
        let mut by: BTreeMap<(u32, Option<u32>, &'static str), Option<u64>> = BTreeMap::new();
        for f in &snap.findings {
            let Some(gpu) = f.gpu else { continue };
            if f.severity == Severity::Info {
                continue;
            }
            let kind = match f.kind {
                FindingKind::Ghost => "ghost",
                FindingKind::Residual => "residual",
                FindingKind::Orphan | FindingKind::OrphanedJob => "orphan",
                FindingKind::HiddenHolder => "hidden",
                FindingKind::BusyWithoutHolder => "busy",
                _ => continue,
            };
            let e = by.entry((gpu, f.gpu_instance, kind)).or_insert(Some(0));
            *e = match (*e, f.bytes) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                _ => None,
            };
        }
        // A residual counts every byte no live listed process accounts for, the ghosts' charges too: the rest
        // is the residual's own, and none is none.
        let ghosts: Vec<(u32, Option<u32>, Option<u64>)> = by
            .iter()
            .filter(|((_, _, k), _)| *k == "ghost")
            .map(|((g, i, _), b)| (*g, *i, *b))
            .collect();
        for (gpu, inst, ghost) in ghosts {
            if let (Some(Some(r)), Some(g)) = (by.get_mut(&(gpu, inst, "residual")), ghost) {
                *r = r.saturating_sub(g);
            }
            if by.get(&(gpu, inst, "residual")) == Some(&Some(0)) {
                by.remove(&(gpu, inst, "residual"));
            }
        }
        for ((gpu, inst, kind), bytes) in by {
            let Some(g) = snap.gpu(gpu) else { continue };
            let l = with(
                with(
                    gpu_labels(host, snap.driver_version.as_deref(), g),
                    m::L_GPU_I_ID,
                    inst.map(|i| i.to_string()).unwrap_or_default(),
                ),
                "kind",
                kind,
            );
            set(&self.leftover, &l, bytes.map_or(f64::NAN, |b| b as f64));
        }
    }

    /// The largest `PROCESS_SERIES` charges of a host, the rest summed under pid="other".
    fn add_processes(&self, host: &str, snap: &HostSnapshot, shows_jobs: bool) {
        let mut all: Vec<(u64, u32, u32)> = snap
            .gpus
            .iter()
            .flat_map(|g| {
                g.processes
                    .iter()
                    .filter_map(move |p| p.used_bytes.map(|b| (b, g.index, p.pid)))
            })
            .collect();
        all.sort_unstable_by(|a, b| b.cmp(a));
        let mut other: BTreeMap<u32, u64> = BTreeMap::new();
        for (n, (bytes, gpu, pid)) in all.into_iter().enumerate() {
            if n >= m::PROCESS_SERIES {
                *other.entry(gpu).or_default() += bytes;
                continue;
            }
            let job = snap
                .proc(pid)
                .filter(|_| shows_jobs)
                .and_then(|p| p.job.as_ref())
                .map(crate::core::job::Job::short)
                .unwrap_or_default();
            let l = vec![
                (m::L_GPU, gpu.to_string()),
                ("pid", pid.to_string()),
                ("job", job),
                (m::L_HOSTNAME, host.to_string()),
            ];
            set(&self.process, &l, bytes as f64);
        }
        for (gpu, bytes) in other {
            let l = vec![
                (m::L_GPU, gpu.to_string()),
                ("pid", "other".to_string()),
                ("job", String::new()),
                (m::L_HOSTNAME, host.to_string()),
            ];
            set(&self.process, &l, bytes as f64);
        }
    }

    fn register(self) -> Registry {
        let mut r = Registry::default();
        // prometheus-client ends every HELP with a period of its own: dcgm-exporter's texts go in without
        // theirs (`exact_help` takes it off again where dcgm-exporter has none).
        for ((name, help, _), family) in m::DCGM_FIELDS.iter().zip(self.dcgm) {
            r.register(*name, help.trim_end_matches('.'), family);
        }
        register_memory(&mut r, [self.fb_used, self.fb_free, self.fb_reserved]);
        r.register(
            m::GPU_CLEAN,
            "1 when the GPU is clean: used memory at or under the tolerance, no process listed, not busy; absent when it could not be read",
            self.clean,
        );
        r.register(
            m::GPU_READABLE,
            "1 when the GPU's memory could be read at the last poll",
            self.readable,
        );
        r.register(
            m::GPUS_READABLE,
            "1 when NVML answered and every GPU of the host was read at the last poll; 0 (alert on it) when the driver or a GPU does not answer",
            self.host_readable,
        );
        r.register(
            m::UNEXPLAINED_BYTES,
            "GPU memory no live listed process accounts for, by finding kind; NaN where the size is unknown",
            self.unexplained,
        );
        register_leftovers(
            &mut r,
            [self.leftover, self.blockers, self.recovery, self.xids],
        );
        register_findings(
            &mut r,
            [
                self.findings,
                self.host_findings,
                self.host_states,
                self.host_clean_used,
                self.host_finding_kinds,
            ],
        );
        r.register(
            m::PROCESS_BYTES,
            "GPU memory NVML charges each process (the largest per host; the rest under pid=\"other\")",
            self.process,
        );
        r.register(
            m::SHM_LEFTOVER_BYTES,
            "Bytes of /dev/shm files of the GPU stack that no live process has open or mapped",
            self.shm,
        );
        r.register(
            m::READING_TIMESTAMP,
            "Unix time of the reading these metrics come from",
            self.taken,
        );
        r.register(
            m::READING_REVISION,
            "Moves when what the host says changes (processes, their memory, findings), not with its time or gauges",
            self.revision,
        );
        register_serve(&mut r, self.info, self.identity);
        r.register(
            m::HOST_SEAL,
            "The seal over the host's summary (part: taken_ms, the reading's time; mac_0 and mac_1, the seal's two 48-bit parts; simulated, 1 for a demo's readings), made with the fleet's key",
            self.host_seal,
        );
        register_jobs(
            &mut r,
            self.job_phase,
            self.job_bytes,
            self.warmup,
            self.lost_ranks,
        );
        r.register_with_unit(
            m::TIME_TO_CLEAN.trim_end_matches("_seconds"),
            "Seconds from the first signal (after=\"signal\") or the last holder's exit (after=\"exit\") to the GPU reading clean",
            Unit::Seconds,
            self.time_to_clean,
        );
        r
    }
}

/// The serve's info, and the digest of what identifies the host (both read by a `prom:` client's identity
/// read).
fn register_serve(r: &mut Registry, info: Gauges, identity: Gauges) {
    r.register(
        m::SERVE_INFO,
        "1; the serve's version and where its API answers",
        info,
    );
    r.register(
        m::HOST_IDENTITY_DIGEST,
        "Moves when the host's GPUs (index, UUID, bus, device, model) or its serve's API change: a digest, below 2^53",
        identity,
    );
}

/// dcgm-exporter's framebuffer gauges, in MiB.
fn register_memory(r: &mut Registry, families: [Gauges; 3]) {
    let [used, free, reserved] = families;
    r.register(m::FB_USED, "Framebuffer memory used (in MiB)", used);
    r.register(m::FB_FREE, "Framebuffer memory free (in MiB)", free);
    r.register(
        m::FB_RESERVED,
        "Framebuffer memory reserved (in MiB)",
        reserved,
    );
}

/// Findings by kind and severity, and their count (with readability, a `prom:` reader's summary of a host);
/// the host's compact summary, what a `prom:` client's first view reads of every host.
fn register_findings(r: &mut Registry, families: [Gauges; 5]) {
    let [by_kind, count, states, clean_used, kinds] = families;
    r.register(m::FINDINGS, "Findings now, by kind and severity", by_kind);
    r.register(
        m::HOST_FINDINGS,
        "How many findings the host has now, of every kind and severity",
        count,
    );
    r.register(
        m::HOST_GPU_STATES,
        "The host's GPUs in each state the serve judged them (state), as a bit mask of GPU indices (bit i: GPU i); only states some GPU is in",
        states,
    );
    r.register(
        m::HOST_CLEAN_USED,
        "Bytes used on the host's clean GPUs, summed (0: each of them reads 0)",
        clean_used,
    );
    r.register(
        m::HOST_FINDING_KINDS,
        "Findings now by kind and severity, only those the host has",
        kinds,
    );
}

/// What leftovers hold, and what would block the reset that ends them.
/// And the XIDs that say a GPU needs a reset.
fn register_leftovers(r: &mut Registry, families: [Gauges; 4]) {
    let [leftover, blockers, recovery, xids] = families;
    r.register(
        m::XID_COUNT,
        "How many of each XID the GPU reported since the serve began watching",
        xids,
    );
    r.register(
        m::LEFTOVER_BYTES,
        "What a leftover holds on a GPU from the moment it is seen, by kind (ghost, residual, orphan, hidden, busy; they overlap) and MIG instance; NaN where unknown",
        leftover,
    );
    r.register(
        m::RESET_BLOCKERS,
        "Processes that would block a reset of the GPU: its device node's openers, benign ones included, and the control nodes'",
        blockers,
    );
    r.register(
        m::RECOVERY_ACTION,
        "1, with what the driver says the GPU needs to recover (action)",
        recovery,
    );
}

/// The job families: phase, memory, warm-up histogram, lost-rank counter.
fn register_jobs(
    r: &mut Registry,
    phase: Gauges,
    bytes: Gauges,
    warmup: TimeToCleanView,
    lost: CounterView,
) {
    r.register(
        m::JOB_PHASE,
        "1 for the phase a job is in (starting, loading, holding, settled, lost_rank, hung, unknown), 0 for the others",
        phase,
    );
    r.register(
        m::JOB_BYTES,
        "GPU memory NVML charges a job's live ranks",
        bytes,
    );
    r.register_with_unit(
        m::JOB_WARMUP.trim_end_matches("_seconds"),
        "Seconds from a job's start to when its memory stopped rising, for jobs seen settling",
        Unit::Seconds,
        warmup,
    );
    r.register(
        m::JOB_LOST_RANKS,
        "Ranks a job lost (exited, zombie, stuck in D) while its other ranks held GPU memory",
        lost,
    );
}

/// Whether every GPU of a reading was read: NVML answered, it listed GPUs, and each gave its memory.
pub fn gpus_readable(snap: &HostSnapshot) -> bool {
    snap.gpu_error.is_none()
        && !snap.gpus.is_empty()
        && snap.gpus.iter().all(|g| g.memory.used.is_some())
}

/// The chosen hosts' counters or histograms, as one family (a serve's per-host paths show only theirs).
#[derive(Debug)]
struct HostsView<M>(Vec<(Labels, M)>);

// Empty whatever `M` is (derived, `Default` would ask it of a histogram, which has none).
impl<M> Default for HostsView<M> {
    fn default() -> Self {
        HostsView(Vec::new())
    }
}

type CounterView = HostsView<prometheus_client::metrics::counter::Counter>;
type TimeToCleanView = HostsView<Histogram>;

impl<M: EncodeMetric + TypedMetric> EncodeMetric for HostsView<M> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, x) in &self.0 {
            x.encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
    }
    fn metric_type(&self) -> MetricType {
        M::TYPE
    }
}

/// The metrics of these hosts (by index), each reading with the API path it is served under.
pub fn render(shared: &Shared, hosts: &[(usize, String)]) -> String {
    let mut fam = Families {
        dcgm: m::DCGM_FIELDS.iter().map(|_| Gauges::default()).collect(),
        ..Families::default()
    };
    for (i, api_path) in hosts {
        let Some(ch) = shared.hosts.get(*i) else {
            continue;
        };
        let latest: Option<std::sync::Arc<Reading>> = ch.latest.borrow().clone();
        if let Some(r) = latest {
            fam.add_host(shared, *i, &r, api_path);
        }
    }
    let mut registry = fam.register();
    if let Some(k) = shared.kube.get() {
        k.register(&mut registry);
    }
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &registry);
    exact_help(out)
}

/// dcgm-exporter's HELP texts as it writes them: those without a final period lose the one prometheus-client
/// added (each family's HELP line is written once, before its samples).
fn exact_help(mut out: String) -> String {
    for (name, help, _) in m::DCGM_FIELDS {
        if help.ends_with('.') {
            continue;
        }
        let added = format!("# HELP {name} {help}.\n");
        if let Some(at) = out.find(&added) {
            out.replace_range(at..at + added.len(), &format!("# HELP {name} {help}\n"));
        }
    }
    out
}

/// The metrics without the families whose names start with one of `prefixes` (`--metrics-leave-out`): each
/// family's lines (HELP, TYPE, UNIT and samples) go together.
pub fn leave_out(open: String, prefixes: &[String]) -> String {
    if prefixes.is_empty() {
        return open;
    }
    let mut out = String::with_capacity(open.len());
    let mut dropping = false;
    for line in open.lines() {
        let family = line
            .strip_prefix("# HELP ")
            .or_else(|| line.strip_prefix("# TYPE "))
            .or_else(|| line.strip_prefix("# UNIT "))
            .and_then(|r| r.split(' ').next());
        if let Some(f) = family {
            dropping = prefixes.iter().any(|p| f.starts_with(p.as_str()));
        } else if line.starts_with('#') {
            dropping = false;
        }
        if !dropping {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Why a `--metrics-leave-out` prefix cannot be taken: it would leave out a family `prom:` readers or the
/// shipped alerts read.
pub fn leave_out_refused(prefixes: &[String]) -> Option<String> {
    if let Some(p) = prefixes.iter().find(|p| p.is_empty()) {
        return Some(format!(
            "--metrics-leave-out: an empty prefix ({p:?}) would leave out every family"
        ));
    }
    prefixes.iter().find_map(|p| {
        m::READ_BY_PROM
            .iter()
            .find(|f| f.starts_with(p.as_str()))
            .map(|f| {
                format!(
                    "--metrics-leave-out {p}: it would leave out {f}, which prom: readers and the shipped alerts need"
                )
            })
    })
}

/// OpenMetrics as the Prometheus text format (0.0.4): no `# EOF` or `# UNIT` lines, and a counter's HELP and
/// TYPE on its `_total` name, where that format looks for them (a reader otherwise takes it as untyped).
pub fn as_prometheus_text(open: &str) -> String {
    let counters: std::collections::HashSet<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = line
            .strip_prefix("# HELP ")
            .map(|r| ("# HELP ", r))
            .or_else(|| line.strip_prefix("# TYPE ").map(|r| ("# TYPE ", r)));
        match meta {
            Some((kind, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) {
                    out.push_str(&format!("{kind}{name}_total {tail}"));
                } else {
                    out.push_str(line);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod text_format_tests {
    #[test]
    fn a_family_left_out_goes_whole_and_what_prom_reads_is_never_left_out() {
        let open = "# HELP a_x A.\n# TYPE a_x gauge\na_x{g=\"0\"} 1\n# HELP b_total B.\n# TYPE b counter\nb_total 2\n# EOF\n";
        let kept = super::leave_out(open.to_string(), &["b".to_string()]);
        assert_eq!(
            kept,
            "# HELP a_x A.\n# TYPE a_x gauge\na_x{g=\"0\"} 1\n# EOF\n"
        );
        assert_eq!(super::leave_out(open.to_string(), &[]), open);
        assert!(
            super::leave_out_refused(&["DCGM_FI_PROF_".into(), "gpusweep_process".into()])
                .is_none()
        );
        let why = super::leave_out_refused(&["DCGM_FI_DEV_FB".into()]).expect("refused");
        assert!(why.contains("DCGM_FI_DEV_FB_USED"), "{why}");
        assert!(super::leave_out_refused(&[String::new()]).is_some());
    }

    #[test]
    fn a_counter_is_typed_on_its_total_and_openmetrics_markers_go() {
        let open = "# HELP a_seconds A.\n# TYPE a_seconds histogram\n# UNIT a_seconds seconds\na_seconds_count 1\n\
                    # HELP b Ranks lost.\n# TYPE b counter\nb_total{h=\"x\"} 2\n# EOF\n";
        assert_eq!(
            super::as_prometheus_text(open),
            "# HELP a_seconds A.\n# TYPE a_seconds histogram\na_seconds_count 1\n\
             # HELP b_total Ranks lost.\n# TYPE b_total counter\nb_total{h=\"x\"} 2\n"
        );
    }
}

#[cfg(test)]
mod summary_tests {
    use super::*;
    use crate::core::model::{Finding, Memory};

    fn gpu(index: u32, state: Option<GpuState>, used: u64) -> Gpu {
        Gpu {
            index,
            state,
            memory: Memory {
                used: Some(used),
                ..Memory::default()
            },
            ..Gpu::default()
        }
    }

    fn finding(kind: FindingKind, severity: Severity) -> Finding {
        Finding {
            kind,
            severity,
            host: "h".into(),
            gpu: None,
            pid: None,
            bytes: None,
            detail: String::new(),
            action: String::new(),
            target_pid: None,
            gpu_instance: None,
            file: None,
            confirms_as: None,
        }
    }

    fn summary(snap: &HostSnapshot) -> Vec<String> {
        let f = Families::default();
        f.add_summary(
            &HostSummary::of(snap, None),
            &vec![(m::L_HOSTNAME, snap.host.clone())],
        );
        let mut out = String::new();
        let _ = encode(&mut out, &f.register());
        let mut lines: Vec<String> = out
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_string)
            .collect();
        lines.sort();
        lines
    }

    #[test]
    fn the_summary_carries_each_gpus_state_as_a_mask_and_only_the_findings_there_are() {
        let snap = HostSnapshot {
            host: "h".into(),
            gpus: vec![
                gpu(0, Some(GpuState::Clean), 0),
                gpu(1, Some(GpuState::Leak), 10 << 30),
                gpu(2, Some(GpuState::Clean), 0),
                gpu(3, Some(GpuState::InUse), 1 << 30),
            ],
            findings: vec![
                finding(FindingKind::Ghost, Severity::Leak),
                finding(FindingKind::Ghost, Severity::Leak),
                finding(FindingKind::Zombie, Severity::Warning),
            ],
            ..HostSnapshot::default()
        };
        assert_eq!(
            summary(&snap),
            [
                "gpusweep_host_clean_memory_used_bytes{Hostname=\"h\"} 0.0",
                "gpusweep_host_finding_kinds{Hostname=\"h\",kind=\"ghost\",severity=\"leak\"} 2.0",
                "gpusweep_host_finding_kinds{Hostname=\"h\",kind=\"zombie\",severity=\"warning\"} 1.0",
                "gpusweep_host_gpu_states{Hostname=\"h\",state=\"clean\"} 5.0",
                "gpusweep_host_gpu_states{Hostname=\"h\",state=\"in_use\"} 8.0",
                "gpusweep_host_gpu_states{Hostname=\"h\",state=\"leak\"} 2.0",
            ]
        );
    }

    #[test]
    fn no_masks_where_a_gpu_is_unjudged_or_past_what_a_mask_holds_and_clean_bytes_are_summed() {
        let unjudged = HostSnapshot {
            host: "h".into(),
            gpus: vec![gpu(0, Some(GpuState::Clean), 0), gpu(1, None, 0)],
            ..HostSnapshot::default()
        };
        assert!(summary(&unjudged).is_empty(), "{:?}", summary(&unjudged));
        let wide = HostSnapshot {
            host: "h".into(),
            gpus: vec![gpu(m::STATE_MASK_GPUS, Some(GpuState::Clean), 0)],
            ..HostSnapshot::default()
        };
        assert!(summary(&wide).is_empty(), "{:?}", summary(&wide));
        let small = HostSnapshot {
            host: "h".into(),
            gpus: vec![
                gpu(0, Some(GpuState::Clean), 2 << 20),
                gpu(1, Some(GpuState::Clean), 0),
            ],
            ..HostSnapshot::default()
        };
        assert!(
            summary(&small).contains(
                &"gpusweep_host_clean_memory_used_bytes{Hostname=\"h\"} 2097152.0".into()
            )
        );
    }

    /// The identity digest moves exactly when what a client's identity read takes moves (a GPU's UUID,
    /// model, bus, device number; the serve's API), not with memory, state or findings; an integer a
    /// sample's float holds exactly.
    #[test]
    fn the_identity_digest_moves_with_what_identifies_the_host_and_nothing_else() {
        let with_uuid = |uuid: &str| {
            let mut g = gpu(0, Some(GpuState::Clean), 0);
            g.uuid = Some(uuid.into());
            g.name = Some("NVIDIA H100 80GB HBM3".into());
            HostSnapshot {
                host: "h".into(),
                gpus: vec![g, gpu(1, Some(GpuState::InUse), 1 << 30)],
                ..HostSnapshot::default()
            }
        };
        // Bit patterns: the same float exactly, or not.
        let d = |s: &HostSnapshot, path: &str| identity_digest(s, "http", path).to_bits();
        let a = with_uuid("GPU-a");
        let value = identity_digest(&a, "http", "");
        assert!(
            value.fract() == 0.0 && value >= 0.0 && value < 2f64.powi(53),
            "{value}"
        );
        let base = d(&a, "");
        // What moves it.
        assert_ne!(base, d(&with_uuid("GPU-b"), ""), "a swapped GPU");
        assert_ne!(base, d(&a, "/hosts/h"), "a serve answering elsewhere");
        assert_ne!(
            base,
            identity_digest(&a, "https", "").to_bits(),
            "another scheme"
        );
        let mut renamed = a.clone();
        renamed.gpus[0].name = Some("NVIDIA H200".into());
        assert_ne!(base, d(&renamed, ""), "another model");
        let mut fewer = a.clone();
        fewer.gpus.pop();
        assert_ne!(base, d(&fewer, ""), "a GPU gone");
        let mut demo = a.clone();
        demo.simulated = true;
        assert_ne!(base, d(&demo, ""), "a demo");
        // What does not.
        let mut busy = a.clone();
        busy.gpus[0].memory.used = Some(70 << 30);
        busy.gpus[0].state = Some(GpuState::Leak);
        busy.findings = vec![finding(FindingKind::Ghost, Severity::Leak)];
        busy.taken_at_ms += 60_000;
        assert_eq!(base, d(&busy, ""), "memory, verdicts, findings, time");
        assert_eq!(base, d(&with_uuid("GPU-a"), ""), "the same again");
    }
}
