//! /proc and /dev/shm: processes, holders (fds open on GPU device files), zombies, shared-memory leftovers,
//! System V limits.
//!
//! Reading every fd link of every process is the costly part of a poll (thousands of processes, hundreds of fds
//! each on a busy node). So each poll reads `/proc/PID/stat` for every process (cheap, and it is how zombies and
//! reparenting are seen at once), but walks fds only for processes it has not seen before and for known holders.
//! Everyone else is rescanned on a slower cadence, or sooner when the caller says memory is unexplained.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::tasks;
use crate::SourceError;
use gpusweep_core::model::{Proc, ProcState, ShmInfo, ShmSegment, SysvSegment};
use gpusweep_core::procstat::{dead_zombie, parse_cmdline, parse_stat, parse_threads};

/// At most this many PIDs handed out since the last listing are read one by one; past that (or when the PIDs
/// wrapped around), /proc is listed whole.
const MAX_PROBED: u32 = 2048;

/// Default device files that make a process a holder.
pub(crate) const DEFAULT_DEVICE_GLOBS: &[&str] = &["/dev/nvidia*"];

/// Names of processes that open GPU device files without holding memory.
pub(crate) const DEFAULT_BENIGN: &[&str] = &[
    "nvidia-persistenced",
    "nvidia-smi",
    "nv-hostengine",
    "dcgm-exporter",
    "dcgmi",
    "nvtop",
    "nvitop",
    "gpustat",
    "all-smi",
    "gpusweep",
    "Xorg",
];

/// Name prefixes in /dev/shm that the GPU stack leaves behind.
pub(crate) const SHM_PATTERNS: &[&str] = &["nccl-", "torch_", "psm_", "sem.", "cuda.shm", "vllm"];

#[derive(Debug, Clone)]
pub struct ProcfsConfig {
    pub proc_root: PathBuf,
    pub shm_dir: PathBuf,
    pub device_globs: Vec<String>,
    pub benign: Vec<String>,
    /// Programs that keep GPU memory on purpose (config `[keep] programs`), by what they run.
    pub keep: Vec<String>,
    /// GPU models whose memory outlives its processes on purpose (config `[keep] gpu_models`), by a part
    /// of their name.
    pub keep_models: Vec<String>,
    /// How often every process's fds are walked while all GPU memory is explained. (A process that opens a
    /// GPU later shows up sooner: NVML lists it once it holds memory, and new processes are read when
    /// they appear.)
    pub full_scan_every: Duration,
    /// How often while some GPU memory is unexplained (a ghost's holder may be any process).
    pub full_scan_unexplained: Duration,
    /// How soon a full scan may follow another when what is unexplained changes.
    pub min_full_scan_gap: Duration,
    /// How often the list of processes is read (new ones found, gone ones dropped). Between listings a
    /// poll reads only GPU holders, NVML's listed PIDs and zombies.
    pub list_every: Duration,
    /// The kubelet's root directory, where pods' memory-backed volumes are (`None`: not looked at).
    pub kubelet_dir: Option<PathBuf>,
}

impl Default for ProcfsConfig {
    fn default() -> Self {
        ProcfsConfig {
            proc_root: "/proc".into(),
            shm_dir: "/dev/shm".into(),
            device_globs: DEFAULT_DEVICE_GLOBS
                .iter()
                .map(std::string::ToString::to_string)
                .collect(),
            benign: DEFAULT_BENIGN
                .iter()
                .map(std::string::ToString::to_string)
                .collect(),
            keep: Vec::new(),
            keep_models: Vec::new(),
            full_scan_every: Duration::from_secs(30),
            full_scan_unexplained: Duration::from_secs(5),
            min_full_scan_gap: Duration::from_millis(500),
            list_every: Duration::from_secs(1),
            kubelet_dir: Some("/var/lib/kubelet".into()),
        }
    }
}

/// shmmax, shmall, shmmni and the System V segments, as last read.
type SysvState = (Option<u64>, Option<u64>, Option<u64>, Vec<SysvSegment>);

/// What one fd walk found for one process.
#[derive(Debug, Clone, Default)]
struct FdInfo {
    devices: Vec<String>,
    device_fds: u32,
    /// The (device, inode) of each file in the shared-memory directory it has open: matched to a segment by
    /// what the file is, never by its name's text.
    shm_open: Vec<(u64, u64)>,
    readable: bool,
    /// The process exited between its stat and its fd walk: not a blind spot, just gone.
    vanished: bool,
    /// Threads found with an fd table of their own (by kcmp, on a full scan): walked at every walk until
    /// the next full scan looks again.
    private_tables: Vec<u32>,
}

/// What is kept of a process between scans, beside its `Proc` in the table.
#[derive(Debug, Clone, Default)]
struct Cached {
    start_time: u64,
    /// Live threads, as its stat counts them.
    threads: u32,
    /// A live thread whose fds and maps stand for a leader that exited (state Z, threads running).
    files_task: Option<u32>,
    /// Its last fd walk; `None` if it was never walked (a kernel thread, or not yet).
    fds: Option<FdInfo>,
    /// (NSpid's innermost PID, pidfs inode): fixed for the life of a process, so read once.
    identity: Option<(Option<u32>, Option<u64>)>,
}

/// How much of /proc one scan reads. Reading every process's fds is what costs (200 ms for 5,000 processes);
/// listing /proc costs a few ms; what is known to matter, microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Only what is known to matter: GPU holders, NVML's listed PIDs and zombies (their stat and fds).
    Known,
    /// Also the list of processes: new ones are read and walked, gone ones dropped.
    Listing,
    /// Every process's stat and fds.
    Full,
}

/// Every process as last read, kept from scan to scan: a poll only reads what may have changed.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProcTable {
    /// Every process, keyed by pid (cmdline, user, cgroup filled only for those asked for through
    /// `fill_details`).
    pub procs: HashMap<u32, Proc>,
    /// pid -> (device files, fd count) for every process with a matching device fd open.
    pub holders: HashMap<u32, (Vec<String>, u32)>,
    /// PIDs whose fd table could not be read.
    pub unreadable: HashSet<u32>,
    /// Whether the last scan walked every process's fds.
    pub full: bool,
}

impl ProcTable {
    fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
        self.holders.remove(&pid);
        self.unreadable.remove(&pid);
    }
}

pub(crate) struct ProcScanner {
    cfg: ProcfsConfig,
    /// /proc, open: each process's files are opened relative to it.
    proc_fd: Option<std::os::fd::OwnedFd>,
    /// The last PID the kernel handed out (`/proc/loadavg`) when /proc was last listed: while it has not moved,
    /// no process was created and a listing would find nothing new.
    listed_last_pid: Option<u32>,
    patterns: Vec<glob::Pattern>,
    cache: HashMap<u32, Cached>,
    last_full: Option<Instant>,
    clk_tck: u64,
    boot_time: Option<u64>,
    users: HashMap<u32, String>,
    /// Where the cgroup hierarchies are: a job a cgroup's name claims is believed only from its owner there.
    cgroups: gpusweep_core::cgroup::Mounts,
    buf: String,
    path_buf: String,
    /// System V limits and segments, re-read on full scans only.
    sysv: SysvState,
    /// Mapped-shm users from the last full scan (mapping outlives the fd).
    shm_mapped: HashMap<(u64, u64), Vec<u32>>,
    /// The device files the globs name, by what they are: an fd is a GPU's whatever path it was opened by.
    devices: DeviceIds,
    /// The shared-memory directory's file system: an fd on a file there is a segment's, whatever its path.
    shm_dev: Option<u64>,
    /// Pods' memory-backed volumes, looked up with the device files, and what was left unread past the
    /// bounds.
    pod_dirs: Vec<super::pod_shm::PodDir>,
    pods_unread: Option<String>,
    /// When the device files were last looked up (at each full scan: a driver may create them late).
    resolved: bool,
}

/// The files the device globs name, by identity: a character device by its device number (any node of it,
/// anywhere: a bind mount, a copy made with mknod), any other file (a test's stand-in) by device and inode.
#[derive(Debug, Default)]
struct DeviceIds {
    by_rdev: HashMap<u64, String>,
    by_file: HashMap<(u64, u64), String>,
}

impl DeviceIds {
    fn resolve(globs: &[String]) -> DeviceIds {
        use std::os::unix::fs::FileTypeExt;
        let mut ids = DeviceIds::default();
        for g in globs {
            for path in glob::glob(g).into_iter().flatten().flatten() {
                let Ok(md) = fs::metadata(&path) else {
                    continue;
                };
                let name = path.to_string_lossy().into_owned();
                if md.file_type().is_char_device() {
                    ids.by_rdev.entry(md.rdev()).or_insert(name);
                } else {
                    ids.by_file.entry((md.dev(), md.ino())).or_insert(name);
                }
            }
        }
        ids
    }

    /// The device file an fd is open on, by what `stat` says of it.
    fn of(&self, st: &rustix::fs::Stat) -> Option<&str> {
        let chr = rustix::fs::FileType::from_raw_mode(st.st_mode)
            == rustix::fs::FileType::CharacterDevice;
        if chr {
            self.by_rdev.get(&st.st_rdev).map(String::as_str)
        } else {
            self.by_file
                .get(&(st.st_dev, st.st_ino))
                .map(String::as_str)
        }
    }
}

impl ProcScanner {
    pub fn new(cfg: ProcfsConfig) -> Result<Self, SourceError> {
        let mut patterns = Vec::new();
        for g in &cfg.device_globs {
            patterns.push(glob::Pattern::new(g).map_err(|e| SourceError::BadGlob {
                glob: g.clone(),
                why: e.to_string(),
            })?);
        }
        let clk_tck = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .and_then(|t| u64::try_from(t).ok())
            .filter(|t| *t > 0)
            .unwrap_or(100);
        let boot_time = fs::read_to_string(cfg.proc_root.join("stat"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("btime "))
                    .and_then(|v| v.trim().parse().ok())
            });
        let proc_fd = rustix::fs::open(
            &cfg.proc_root,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ok();
        let cgroups = super::cgroups::mounts(&cfg.proc_root);
        Ok(ProcScanner {
            proc_fd,
            listed_last_pid: None,
            cfg,
            patterns,
            cache: HashMap::new(),
            last_full: None,
            clk_tck,
            boot_time,
            users: read_passwd(Path::new("/etc/passwd")),
            cgroups,
            buf: String::with_capacity(4096),
            path_buf: String::with_capacity(64),
            sysv: (None, None, None, Vec::new()),
            shm_mapped: HashMap::new(),
            devices: DeviceIds::default(),
            shm_dev: None,
            pod_dirs: Vec::new(),
            pods_unread: None,
            resolved: false,
        })
    }

    pub fn config(&self) -> &ProcfsConfig {
        &self.cfg
    }

    /// Whether `pid` is a live process (a thread's ID has a /proc entry too, but names no process of its own).
    fn is_process(&self, pid: u32) -> bool {
        fs::read_to_string(self.cfg.proc_root.join(pid.to_string()).join("status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Tgid:"))
                    .and_then(|t| t.trim().parse::<u32>().ok())
            })
            == Some(pid)
    }

    /// The last PID the kernel handed out, from `/proc/loadavg` (its fifth field).
    fn last_pid(&self) -> Option<u32> {
        fs::read_to_string(self.cfg.proc_root.join("loadavg"))
            .ok()?
            .split_whitespace()
            .nth(4)?
            .parse()
            .ok()
    }

    /// When every process's fds were last walked.
    pub fn last_full(&self) -> Option<Instant> {
        self.last_full
    }

    /// A scan that walks every process's fds now, whatever the cadence, and the /dev/shm state it shows
    /// (maps included): what a removal is checked against.
    pub fn shm_now(&mut self, table: &mut ProcTable) -> (PathBuf, ShmInfo) {
        self.scan(table, Depth::Full, &HashSet::new());
        let info = self.read_shm(table);
        (self.cfg.shm_dir.clone(), info)
    }

    /// Bring `table` up to date, as deep as `depth` says. `always` names processes read and walked this
    /// time whatever the depth (NVML's listed PIDs).
    pub fn scan(&mut self, table: &mut ProcTable, depth: Depth, always: &HashSet<u32>) {
        table.full = depth == Depth::Full;
        if depth == Depth::Full {
            self.last_full = Some(Instant::now());
        }
        if depth == Depth::Full || !self.resolved {
            self.devices = DeviceIds::resolve(&self.cfg.device_globs);
            self.shm_dev = fs::metadata(&self.cfg.shm_dir).ok().map(|m| m.dev());
            (self.pod_dirs, self.pods_unread) = self
                .cfg
                .kubelet_dir
                .as_deref()
                .map(super::pod_shm::find)
                .unwrap_or_default();
            self.resolved = true;
        }
        let Some(to_read) = self.choose(table, depth, always) else {
            return;
        };
        // Their stat: which still exist, as which process, in which state; then whose fds to walk.
        let mut walk: Vec<u32> = Vec::new();
        for pid in to_read {
            if self.refresh(table, pid, depth, always) {
                walk.push(pid);
            }
        }
        // Their fds, on several threads when there are many (a full scan of a busy node).
        for (pid, fds) in self.walk_all(&walk, depth == Depth::Full) {
            if fds.vanished {
                table.forget(pid);
                self.cache.remove(&pid);
                continue;
            }
            if fds.readable {
                table.unreadable.remove(&pid);
            } else {
                table.unreadable.insert(pid);
            }
            if fds.devices.is_empty() {
                table.holders.remove(&pid);
            } else {
                table
                    .holders
                    .insert(pid, (fds.devices.clone(), fds.device_fds));
            }
            if let Some(c) = self.cache.get_mut(&pid) {
                c.fds = Some(fds);
            }
        }
    }

    /// The processes NVML lists looked at again after a scan that came before the listing: those not known to
    /// hold a GPU have their fds walked (see `refresh`). What the scan was (full or not) stays as it was.
    pub fn recheck_listed(&mut self, table: &mut ProcTable, listed: &HashSet<u32>) {
        let full = table.full;
        self.scan(table, Depth::Known, listed);
        table.full = full;
    }

    /// Read one process's stat into `table` (forgetting it when gone, and all that was known of an earlier
    /// process under its PID); true when its fds are to be walked this time.
    fn refresh(
        &mut self,
        table: &mut ProcTable,
        pid: u32,
        depth: Depth,
        always: &HashSet<u32>,
    ) -> bool {
        let Some((mut p, threads)) = self.read_stat(pid) else {
            table.forget(pid);
            self.cache.remove(&pid);
            return false;
        };
        let same = self
            .cache
            .get(&pid)
            .is_some_and(|c| c.start_time == p.start_time);
        if same {
            // The same process: what was read of it once stays (its command line, user, identity).
            if let Some(old) = table.procs.get(&pid) {
                keep_details(&mut p, old);
            }
        } else {
            // A new process, or the PID was reused: nothing of the old one applies.
            table.forget(pid);
            self.cache.insert(
                pid,
                Cached {
                    start_time: p.start_time,
                    ..Default::default()
                },
            );
        }
        // A leader that exited while its threads run: alive, in its threads' state, its fds and maps
        // theirs.
        let files_task = if p.state.is_zombie() && threads > 1 {
            tasks::live_thread(&self.cfg.proc_root, pid).map(|(tid, state)| {
                p.state = state;
                tid
            })
        } else {
            None
        };
        if let Some(c) = self.cache.get_mut(&pid) {
            c.threads = threads;
            c.files_task = files_task;
        }
        let mut walk_it = false;
        if p.state.is_zombie() {
            // A zombie has no fds and no memory.
            table.holders.remove(&pid);
            table.unreadable.remove(&pid);
            if let Some(c) = self.cache.get_mut(&pid) {
                c.fds = None;
            }
        } else if !p.kernel_thread {
            // A GPU process has hundreds of fds: between listings only its stat is read (it lives, in
            // which state, under which parent); its fds are walked again at each listing.
            let never_walked = self.cache.get(&pid).is_none_or(|c| c.fds.is_none());
            walk_it = match depth {
                Depth::Full => true,
                Depth::Listing => {
                    !same
                        || never_walked
                        || table.holders.contains_key(&pid)
                        || table.unreadable.contains(&pid)
                        || always.contains(&pid)
                }
                // Listed by NVML yet not known to hold a GPU: it opened one since its last walk (a rank
                // whose context just came to be), or it is a ghost; its fds say which.
                Depth::Known => {
                    !same
                        || never_walked
                        || (always.contains(&pid) && !table.holders.contains_key(&pid))
                }
            };
        }
        table.procs.insert(pid, p);
        walk_it
    }

    /// Which processes this scan reads: those known to matter, or (listing /proc, dropping the gone) also the
    /// new ones, or all. `None` when /proc cannot be listed.
    fn choose(
        &mut self,
        table: &mut ProcTable,
        depth: Depth,
        always: &HashSet<u32>,
    ) -> Option<Vec<u32>> {
        Some(match depth {
            Depth::Known => {
                let mut v: Vec<u32> = table
                    .holders
                    .keys()
                    .chain(always)
                    .chain(table.unreadable.iter())
                    .copied()
                    .chain(
                        table
                            .procs
                            .values()
                            .filter(|p| p.state.is_zombie())
                            .map(|p| p.pid),
                    )
                    .collect();
                v.sort_unstable();
                v.dedup();
                v
            }
            Depth::Listing | Depth::Full => {
                let last_pid = self.last_pid();
                if depth == Depth::Listing
                    && let (Some(now), Some(then)) = (last_pid, self.listed_last_pid)
                    && now >= then
                    && now - then <= MAX_PROBED
                {
                    // PIDs are handed out in order: the processes created since the last listing are among
                    // those after the last PID then. Reading those few costs less than listing thousands.
                    let mut v = self.choose(table, Depth::Known, always)?;
                    v.extend((then + 1..=now).filter(|&pid| self.is_process(pid)));
                    v.sort_unstable();
                    v.dedup();
                    self.listed_last_pid = last_pid;
                    return Some(v);
                }
                let mut dir = self
                    .proc_fd
                    .as_ref()
                    .and_then(|fd| rustix::fs::Dir::read_from(fd).ok())?;
                self.listed_last_pid = last_pid;
                let mut present: HashSet<u32> = HashSet::with_capacity(table.procs.len() + 64);
                let mut v = Vec::new();
                while let Some(entry) = dir.read() {
                    let Ok(entry) = entry else { break };
                    let Some(pid) = std::str::from_utf8(entry.file_name().to_bytes())
                        .ok()
                        .and_then(|s| s.parse::<u32>().ok())
                    else {
                        continue;
                    };
                    present.insert(pid);
                    // Between full scans a process read before and holding nothing stays as it was: a kill
                    // re-checks its start time anyway.
                    let known = table.procs.get(&pid);
                    let reread = depth == Depth::Full
                        || known.is_none_or(|p| p.state.is_zombie())
                        || table.holders.contains_key(&pid)
                        || table.unreadable.contains(&pid)
                        || always.contains(&pid);
                    if reread {
                        v.push(pid);
                    }
                }
                table.procs.retain(|p, _| present.contains(p));
                table.holders.retain(|p, _| present.contains(p));
                table.unreadable.retain(|p| present.contains(p));
                self.cache.retain(|p, _| present.contains(p));
                v
            }
        })
    }

    /// /dev/shm paths that each live process has open as an fd, from the last walk of each.
    fn shm_open(&self, table: &ProcTable) -> HashMap<(u64, u64), Vec<u32>> {
        let mut out: HashMap<(u64, u64), Vec<u32>> = HashMap::new();
        for (pid, c) in &self.cache {
            let Some(fds) = &c.fds else { continue };
            if fds.shm_open.is_empty() || !table.procs.contains_key(pid) {
                continue;
            }
            for &s in &fds.shm_open {
                out.entry(s).or_default().push(*pid);
            }
        }
        out
    }

    /// Read cmdline and user for the processes that will be shown (cached per pid and start time).
    pub fn fill_details(&mut self, table: &mut ProcTable, pids: &HashSet<u32>) {
        for &pid in pids {
            let Some(p) = table.procs.get_mut(&pid) else {
                continue;
            };
            if p.cmdline.is_empty() && !p.state.is_zombie() {
                p.cmdline = read_cmdline(&self.cfg.proc_root.join(pid.to_string()).join("cmdline"));
            }
            if p.uid.is_none() {
                p.uid = fs::metadata(self.cfg.proc_root.join(pid.to_string()))
                    .ok()
                    .map(|m| m.uid());
            }
            if let Some(uid) = p.uid {
                p.user = Some(
                    self.users
                        .get(&uid)
                        .cloned()
                        .unwrap_or_else(|| uid.to_string()),
                );
            }
            let dir = self.cfg.proc_root.join(pid.to_string());
            if p.state == ProcState::DiskSleep {
                p.wchan = fs::read_to_string(dir.join("wchan"))
                    .ok()
                    .map(|w| w.trim().to_string())
                    .filter(|w| !w.is_empty() && w != "0");
            }
            if p.state.is_zombie() {
                continue;
            }
            // Read each time: a process can be moved to another cgroup (a job's supervisor moves its child).
            (p.cgroup, p.job) = fs::read_to_string(dir.join("cgroup"))
                .map(|s| super::cgroups::job_of(&s, &self.cgroups, &self.cfg.proc_root))
                .unwrap_or_default();
            let cached = self
                .cache
                .get(&pid)
                .filter(|c| c.start_time == p.start_time)
                .and_then(|c| c.identity);
            let (ns_pid, pidfs_ino) = if let Some(id) = cached {
                id
            } else {
                let id = self.read_identity(pid, p.start_time, &dir);
                if let Some(entry) = self.cache.get_mut(&pid) {
                    entry.identity = Some(id);
                }
                id
            };
            p.ns_pid = ns_pid;
            p.pidfs_ino = pidfs_ino;
        }
    }

    /// A process's NSpid (when it differs) and pidfs inode, both fixed for its life.
    fn read_identity(&self, pid: u32, start_time: u64, dir: &Path) -> (Option<u32>, Option<u64>) {
        let ns_pid = fs::read_to_string(dir.join("status"))
            .ok()
            .and_then(|s| inner_ns_pid(&s))
            .filter(|&n| n != pid);
        // Only the real /proc has real processes to open a pidfd on.
        let pidfs_ino = (self.cfg.proc_root == Path::new("/proc"))
            .then(|| pidfs_inode(pid))
            .flatten()
            .filter(|_| {
                // The inode names the process with this start time only if the PID was not reused
                // between the stat read and the pidfd.
                fs::read_to_string(dir.join("stat"))
                    .ok()
                    .and_then(|s| parse_stat(&s))
                    .is_some_and(|now| now.start_time == start_time)
            });
        (ns_pid, pidfs_ino)
    }

    /// Benign by what the process runs (`/proc/PID/exe`), never by the argv it shows.
    pub fn is_benign(&self, p: &Proc, self_pid: u32) -> bool {
        if p.pid == self_pid {
            return true;
        }
        is_benign_program(&p.comm, self.exe(p.pid).as_deref(), &self.cfg.benign)
    }

    /// Benign or kept by the host's own config, not by the built-in list of monitors.
    pub fn is_declared(&self, p: &Proc) -> bool {
        let own: Vec<String> = self
            .cfg
            .benign
            .iter()
            .filter(|b| !DEFAULT_BENIGN.contains(&b.as_str()))
            .cloned()
            .collect();
        (!own.is_empty() && is_benign_program(&p.comm, self.exe(p.pid).as_deref(), &own))
            || self.is_kept(p)
    }

    /// Kept on purpose by what the process runs, as benign is told (never by its argv).
    pub fn is_kept(&self, p: &Proc) -> bool {
        !self.cfg.keep.is_empty()
            && is_benign_program(&p.comm, self.exe(p.pid).as_deref(), &self.cfg.keep)
    }

    /// Whether a GPU of this model keeps its memory on purpose (a part of its name, any case).
    pub fn keeps_model(&self, name: Option<&str>) -> bool {
        let Some(n) = name else { return false };
        let n = n.to_ascii_lowercase();
        self.cfg
            .keep_models
            .iter()
            .any(|m| !m.is_empty() && n.contains(&m.to_ascii_lowercase()))
    }

    fn exe(&self, pid: u32) -> Option<String> {
        fs::read_link(self.cfg.proc_root.join(pid.to_string()).join("exe"))
            .ok()
            .map(|l| {
                l.to_string_lossy()
                    .trim_end_matches(" (deleted)")
                    .to_string()
            })
    }

    /// A process's stat, and how many threads it counts.
    fn read_stat(&mut self, pid: u32) -> Option<(Proc, u32)> {
        use std::fmt::Write as _;
        // One reused buffer for the path: this runs for every process on every poll.
        let mut path = std::mem::take(&mut self.path_buf);
        path.clear();
        let _ = write!(path, "{}/{pid}/stat", self.cfg.proc_root.display());
        self.buf.clear();
        let ok = fs::File::open(&path)
            .ok()
            .and_then(|mut f| f.read_to_string(&mut self.buf).ok())
            .is_some();
        self.path_buf = path;
        if !ok {
            return None;
        }
        let mut p = parse_stat(&self.buf)?;
        p.started_at = self.boot_time.map(|b| b + p.start_time / self.clk_tck);
        let threads = parse_threads(&self.buf).unwrap_or(1);
        Some((p, threads))
    }

    /// Walk the fds of `pids`, splitting the work over up to 8 threads when there is enough of it.
    fn walk_all(&self, pids: &[u32], full: bool) -> HashMap<u32, FdInfo> {
        let threads = std::thread::available_parallelism()
            .map_or(1, std::num::NonZero::get)
            .min(8);
        if threads < 2 || pids.len() < 64 {
            return pids.iter().map(|&p| (p, self.read_fds(p, full))).collect();
        }
        let chunk = pids.len().div_ceil(threads);
        std::thread::scope(|s| {
            let handles: Vec<_> = pids
                .chunks(chunk)
                .map(|c| {
                    s.spawn(move || {
                        c.iter()
                            .map(|&p| (p, self.read_fds(p, full)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_default())
                .collect()
        })
    }

    /// Walk one process's fds: its fd table (a live thread's, where the leader exited), and the tables of
    /// threads that unshared theirs (found on full scans, walked at every walk). Each link is read relative to its fd directory (no path
    /// walked per fd), nothing allocated for the sockets, pipes and anon inodes that are most of them.
    fn read_fds(&self, pid: u32, full: bool) -> FdInfo {
        let mut info = FdInfo::default();
        let (files_task, threads, known_private) =
            self.cache.get(&pid).map_or((None, 1, Vec::new()), |c| {
                (
                    c.files_task,
                    c.threads,
                    c.fds
                        .as_ref()
                        .map(|f| f.private_tables.clone())
                        .unwrap_or_default(),
                )
            });
        let main = match files_task {
            Some(tid) => format!("{pid}/task/{tid}/fd"),
            None => format!("{pid}/fd"),
        };
        match self.walk_fd_dir(&main, &mut info) {
            Ok(()) => info.readable = true,
            Err(e) => {
                // Only a permission error is something we could not see; a missing directory is an exit.
                info.vanished = e == rustix::io::Errno::NOENT || e == rustix::io::Errno::SRCH;
                return info;
            }
        }
        let private = if full && threads > 1 {
            let reference = files_task.unwrap_or(pid);
            tasks::private_fd_tables(&self.cfg.proc_root, pid, reference)
        } else {
            known_private
        };
        for &tid in &private {
            if self
                .walk_fd_dir(&format!("{pid}/task/{tid}/fd"), &mut info)
                .is_err_and(|e| e != rustix::io::Errno::NOENT)
            {
                info.readable = false;
            }
        }
        info.private_tables = private;
        info.devices.sort();
        info.devices.dedup();
        info
    }

    /// One fd directory's GPU devices and shared-memory files, added to `info`. A file is matched by what it
    /// is (`stat` through the link), so a bind mount or another namespace's path to a GPU or a segment hides
    /// nothing; a path the globs match is taken without a `stat`.
    fn walk_fd_dir(&self, rel: &str, info: &mut FdInfo) -> Result<(), rustix::io::Errno> {
        use rustix::fs::{AtFlags, Dir, Mode, OFlags, openat, readlinkat_raw, statat};
        use std::os::unix::ffi::OsStrExt;
        let proc_fd = self.proc_fd.as_ref().ok_or(rustix::io::Errno::NOENT)?;
        let fd = openat(
            proc_fd,
            rel,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut dir = Dir::new(fd)?;
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        while let Some(entry) = dir.read() {
            let Ok(entry) = entry else { break };
            let name = entry.file_name();
            if name.to_bytes().first() == Some(&b'.') {
                continue;
            }
            let Ok(dfd) = dir.fd() else { break };
            let Ok((target, _)) = readlinkat_raw(dfd, name, &mut buf) else {
                continue;
            };
            let bytes: &[u8] = target;
            // Sockets, pipes and anon inodes are most fds; skip them before any matching.
            if !bytes.starts_with(b"/") {
                continue;
            }
            let path = Path::new(std::ffi::OsStr::from_bytes(bytes));
            if self.patterns.iter().any(|p| p.matches_path(path)) {
                info.device_fds += 1;
                let t = path.to_string_lossy().into_owned();
                if !info.devices.contains(&t) {
                    info.devices.push(t);
                }
                continue;
            }
            // The file the fd is open on (the link followed), whatever its path says.
            let Ok(st) = statat(dfd, name, AtFlags::empty()) else {
                continue;
            };
            if let Some(dev) = self.devices.of(&st) {
                info.device_fds += 1;
                if !info.devices.iter().any(|d| d == dev) {
                    info.devices.push(dev.to_string());
                }
            } else if Some(st.st_dev) == self.shm_dev
                || self.pod_dirs.iter().any(|p| p.dev == st.st_dev)
            {
                info.shm_open.push((st.st_dev, st.st_ino));
            }
        }
        Ok(())
    }

    /// Shared-memory state. `table` tells which live processes have segments open; on full scans the maps of
    /// every process are read too, since NCCL maps a segment and closes its fd.
    pub fn read_shm(&mut self, table: &ProcTable) -> ShmInfo {
        let mut info = ShmInfo {
            dir: Some(self.cfg.shm_dir.to_string_lossy().into_owned()),
            ..Default::default()
        };
        if let Some((total, free)) = statvfs(&self.cfg.shm_dir) {
            info.total = Some(total);
            info.free = Some(free);
            info.used = Some(total.saturating_sub(free));
        }
        info.segments = list_segments(&self.cfg.shm_dir);
        info.pods = self
            .pod_dirs
            .iter()
            .map(|d| gpusweep_core::model::PodShm {
                pod_uid: d.uid.clone(),
                pod: d.pod.clone(),
                volume: d.volume.clone(),
                dir: d.path.to_string_lossy().into_owned(),
                segments: list_segments(&d.path),
            })
            .filter(|p| !p.segments.is_empty())
            .collect();
        info.pods_unread.clone_from(&self.pods_unread);
        let any = !info.segments.is_empty() || !info.pods.is_empty();
        if table.full && any {
            let wanted: HashSet<(u64, u64)> = info
                .segments
                .iter()
                .chain(info.pods.iter().flat_map(|p| p.segments.iter()))
                .filter_map(|s| Some((s.dev?, s.ino?)))
                .collect();
            self.shm_mapped = self.read_shm_maps(table, &wanted);
        }
        let shm_open = if any {
            self.shm_open(table)
        } else {
            HashMap::new()
        };
        let pod_segments = info.pods.iter_mut().flat_map(|p| p.segments.iter_mut());
        for seg in info.segments.iter_mut().chain(pod_segments) {
            let (Some(dev), Some(ino)) = (seg.dev, seg.ino) else {
                continue;
            };
            let key = (dev, ino);
            let mut users: Vec<u32> = shm_open.get(&key).cloned().unwrap_or_default();
            if let Some(m) = self.shm_mapped.get(&key) {
                users.extend(m.iter().copied().filter(|p| table.procs.contains_key(p)));
            }
            users.sort_unstable();
            users.dedup();
            seg.users = Some(users);
        }
        info.segments.sort_by(|a, b| a.name.cmp(&b.name));
        if table.full {
            self.sysv = self.sysv_now();
        }
        let (max, all, mni, sysv) = self.sysv.clone();
        (info.shmmax, info.shmmax_unlimited) = gpusweep_core::model::limit(max);
        (info.shmall, info.shmall_unlimited) = gpusweep_core::model::limit(all);
        (info.shmmni, info.sysv_segments) = (mni, sysv);
        info
    }

    /// The System V limits and segments now.
    fn sysv_now(&self) -> SysvState {
        let sys = self.cfg.proc_root.join("sys/kernel");
        let read_u64 = |f: &str| {
            fs::read_to_string(sys.join(f))
                .ok()
                .and_then(|s| s.trim().parse().ok())
        };
        (
            read_u64("shmmax"),
            read_u64("shmall"),
            read_u64("shmmni"),
            fs::read_to_string(self.cfg.proc_root.join("sysvipc/shm"))
                .map(|s| parse_sysvipc_shm(&s))
                .unwrap_or_default(),
        )
    }

    /// Which processes map each of the `wanted` files, by (device, inode): `/proc/PID/maps` names a file by
    /// its path text, which a newline, a " (deleted)" in the name or another mapping's non-UTF-8 path would
    /// garble; its device and inode columns say which file it is.
    fn read_shm_maps(
        &self,
        table: &ProcTable,
        wanted: &HashSet<(u64, u64)>,
    ) -> HashMap<(u64, u64), Vec<u32>> {
        let mut out: HashMap<(u64, u64), Vec<u32>> = HashMap::new();
        for (&pid, p) in &table.procs {
            if p.state.is_zombie() {
                continue;
            }
            // A leader that exited has no memory map of its own: its threads' is the one they share.
            let dir = self.cfg.proc_root.join(pid.to_string());
            let maps = match self.cache.get(&pid).and_then(|c| c.files_task) {
                Some(tid) => dir.join("task").join(tid.to_string()).join("maps"),
                None => dir.join("maps"),
            };
            let Ok(maps) = fs::read(maps) else {
                continue;
            };
            for key in maps.split(|b| *b == b'\n').filter_map(mapped_file) {
                if wanted.contains(&key) {
                    let v = out.entry(key).or_default();
                    if !v.contains(&pid) {
                        v.push(pid);
                    }
                }
            }
        }
        out
    }
}

/// The GPU stack's files in a shared-memory directory, each as it is (lstat: a symlink is one), users not
/// yet known.
fn list_segments(shm_dir: &Path) -> Vec<ShmSegment> {
    let now = std::time::SystemTime::now();
    let mut out = Vec::new();
    let Ok(dir) = fs::read_dir(shm_dir) else {
        return out;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !SHM_PATTERNS.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        let Ok(md) = e.metadata() else { continue };
        let age_s = md
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .map(|d| d.as_secs());
        out.push(ShmSegment {
            name,
            bytes: md.len(),
            age_s,
            users: None,
            dev: Some(md.dev()),
            ino: Some(md.ino()),
            special: !md.file_type().is_file(),
        });
    }
    out
}

/// The (device, inode) of the file one line of `/proc/PID/maps` maps (`start-end perms offset MM:mm inode
/// path`), `None` for an anonymous mapping (inode 0) or a line of another shape.
fn mapped_file(line: &[u8]) -> Option<(u64, u64)> {
    let mut f = line.split(|b| *b == b' ').filter(|x| !x.is_empty());
    let dev = f.nth(3)?;
    let ino: u64 = std::str::from_utf8(f.next()?).ok()?.parse().ok()?;
    if ino == 0 {
        return None;
    }
    let (major, minor) = std::str::from_utf8(dev).ok()?.split_once(':')?;
    let major = u32::from_str_radix(major, 16).ok()?;
    let minor = u32::from_str_radix(minor, 16).ok()?;
    Some((rustix::fs::makedev(major, minor), ino))
}

/// What was read of a process once and holds for its life (or is re-read for the shown ones anyway), carried
/// to a fresh reading of its stat.
fn keep_details(new: &mut Proc, old: &Proc) {
    new.cmdline.clone_from(&old.cmdline);
    new.uid = old.uid;
    new.user.clone_from(&old.user);
    new.cgroup.clone_from(&old.cgroup);
    new.job.clone_from(&old.job);
    new.ns_pid = old.ns_pid;
    new.pidfs_ino = old.pidfs_ino;
    new.fds_unreadable = old.fds_unreadable;
}

/// A process that runs a program named in `benign`. `exe` is `/proc/PID/exe` when it could be read: its
/// name decides, or, for a Python interpreter, the script's name (the kernel sets comm from the script a
/// shebang runs). Without `exe` (another user's process) the comm decides. argv is never trusted: anyone can
/// start `exec -a nvidia-smi ...`.
pub(crate) fn is_benign_program(comm: &str, exe: Option<&str>, benign: &[String]) -> bool {
    match exe {
        Some(exe) => {
            let base = exe.rsplit('/').next().unwrap_or("");
            benign
                .iter()
                .any(|b| base == b || (base.starts_with("python") && comm == b))
        }
        None => benign.iter().any(|b| comm == b),
    }
}

/// `/proc/PID/cmdline` as one line; empty when it cannot be read (kernel threads, exited processes).
pub(crate) fn read_cmdline(path: &Path) -> String {
    fs::read(path)
        .map(|raw| parse_cmdline(&raw))
        .unwrap_or_default()
}

/// `/proc/sysvipc/shm`: a header line, then key shmid perms size cpid lpid nattch ...
pub(crate) fn parse_sysvipc_shm(s: &str) -> Vec<SysvSegment> {
    s.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_ascii_whitespace().collect();
            Some(SysvSegment {
                shmid: f.get(1)?.parse().ok()?,
                bytes: f.get(3)?.parse().ok()?,
                creator_pid: f.get(4)?.parse().ok()?,
                attached: f.get(6)?.parse().ok()?,
            })
        })
        .collect()
}

fn read_passwd(path: &Path) -> HashMap<u32, String> {
    fs::read_to_string(path)
        .map(|s| {
            s.lines()
                .filter_map(|l| {
                    let mut f = l.split(':');
                    let name = f.next()?;
                    let uid = f.nth(1)?.parse().ok()?;
                    Some((uid, name.to_string()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// (total, available) bytes of a filesystem.
pub fn statvfs(path: &Path) -> Option<(u64, u64)> {
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    let frsize = st.fragment_size();
    Some((
        st.blocks().saturating_mul(frsize),
        st.blocks_available().saturating_mul(frsize),
    ))
}

/// The inode number of the kernel's initial PID namespace (`PROC_PID_INIT_INO`), fixed by the kernel.
pub(crate) const INIT_PID_NS_INO: u64 = 0xEFFF_FFFC;

/// True when this process lives in a child PID namespace (a container), where NVML's host PIDs are not
/// visible. The link `/proc/self/ns/pid` names the namespace; any but the initial one is a child. (`NSpid`
/// alone cannot tell once /proc was remounted inside, as `unshare --pid --fork --mount-proc` does.)
/// Whether the `/proc` at `proc_root` hides other users' processes from this process: mounted with
/// `hidepid`, and this process neither root nor in the group it exempts.
pub(crate) fn others_hidden(proc_root: &Path) -> bool {
    let Some(h) = fs::read_to_string(proc_root.join("self/mountinfo"))
        .ok()
        .and_then(|m| gpusweep_core::mountinfo::proc_hiding(&m))
    else {
        return false;
    };
    // Root sees everyone only in the initial user namespace: uid 0 of a user namespace of its own (a
    // fakeroot container, `unshare -Ur`) is hidden from like any user.
    let initial_userns = fs::read_to_string(proc_root.join("self/uid_map")).is_ok_and(|m| {
        let lines: Vec<Vec<&str>> = m.lines().map(|l| l.split_whitespace().collect()).collect();
        lines == [vec!["0", "0", "4294967295"]]
    });
    if rustix::process::geteuid().is_root() && initial_userns {
        return false;
    }
    let exempt = h.exempt_gid.is_some_and(|g| {
        rustix::process::getegid().as_raw() == g
            || rustix::process::getgroups().is_ok_and(|gs| gs.iter().any(|x| x.as_raw() == g))
    });
    !exempt
}

pub fn in_child_pid_namespace(proc_root: &Path) -> bool {
    let by_link = fs::read_link(proc_root.join("self/ns/pid"))
        .ok()
        .and_then(|l| pid_ns_ino(&l.to_string_lossy()));
    if let Some(ino) = by_link {
        return ino != INIT_PID_NS_INO;
    }
    fs::read_to_string(proc_root.join("self/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("NSpid:"))
                .map(|l| l.split_whitespace().count() > 2)
        })
        .unwrap_or(false)
}

/// `pid:[4026531836]` -> 4026531836.
pub(crate) fn pid_ns_ino(link: &str) -> Option<u64> {
    link.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// The innermost PID of a process (the last field of `NSpid:` in /proc/PID/status).
pub(crate) fn inner_ns_pid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// The pidfs inode of a process: on Linux 6.9+ unique per process for the whole boot. `None` where the
/// kernel has no pidfd or no pidfs (the inode is then shared by all pidfds, so it says nothing).
pub fn pidfs_inode(pid: u32) -> Option<u64> {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
    let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    // Before pidfs every pidfd was an anon inode of one shared inode; pidfs gives each process its own,
    // on a filesystem whose magic is PID_FS_MAGIC.
    let fs = rustix::fs::fstatfs(&fd).ok()?;
    (fs.f_type == PIDFS_MAGIC).then_some(st.st_ino)
}

/// `PID_FS_MAGIC` from linux/magic.h.
const PIDFS_MAGIC: rustix::fs::FsWord = 0x5049_4446;

/// Every live process of Slurm job `job` on this host: its cgroup is the job's in Slurm's own layout (Slurm's
/// cgroup plugins), or, where Slurm tracks processes without cgroups (proctrack/linuxproc, which loses
/// double-forked ones), its environment carries `SLURM_JOB_ID=<id>` and it runs as the job's user
/// (`job_uid`, from `SLURM_JOB_UID`): anyone can put the variable in their environment, only the job's
/// user's processes are taken by it, and with no `job_uid` none are. Reading other users' environments
/// needs root, as an epilog has. A cgroup counts only where root owns Slurm's directories for it
/// (`cgroups::job_of`): a look-alike in a user's subtree is that user's, not the job's.
pub fn slurm_job_pids(proc_root: &Path, job: u64, job_uid: Option<u32>) -> Vec<u32> {
    let want = format!("SLURM_JOB_ID={job}");
    let mounts = super::cgroups::mounts(proc_root);
    let mut out = Vec::new();
    let Ok(dir) = fs::read_dir(proc_root) else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let d = e.path();
        // Gone, or dead; a leader in state Z whose threads run is the job's still.
        let dead = fs::read_to_string(d.join("stat")).is_ok_and(|s| dead_zombie(&s));
        if dead || !d.join("stat").exists() {
            continue;
        }
        let by_cgroup = fs::read_to_string(d.join("cgroup")).is_ok_and(|s| {
            matches!(
                super::cgroups::job_of(&s, &mounts, proc_root).1,
                Some(gpusweep_core::job::Job::Slurm { job: j, .. }) if j == job
            )
        });
        let by_env = || {
            job_uid.is_some_and(|u| real_uid(&d) == Some(u))
                && fs::read(d.join("environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == want.as_bytes()))
        };
        if by_cgroup || by_env() {
            out.push(pid);
        }
    }
    out.sort_unstable();
    out
}

/// The real uid a process runs as (`/proc/PID/status`, `Uid:` first field).
fn real_uid(dir: &Path) -> Option<u32> {
    let status = fs::read_to_string(dir.join("status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_is_its_device_and_inode_whatever_its_path_says() {
        let line = b"7f00-7f01 rw-s 00000000 00:1a 4242 /dev/shm/nccl-new\\012line (deleted)";
        assert_eq!(
            mapped_file(line),
            Some((rustix::fs::makedev(0, 0x1a), 4242))
        );
        assert_eq!(
            mapped_file(b"7f00-7f01 r--p 00000000 fd:01 77 /usr/lib/odd-\xff.so"),
            Some((rustix::fs::makedev(0xfd, 1), 77))
        );
        assert_eq!(mapped_file(b"7f00-7f01 rw-p 00000000 00:00 0 "), None);
        assert_eq!(mapped_file(b"garbage"), None);
    }

    #[test]
    fn nspid_is_the_innermost_pid() {
        assert_eq!(inner_ns_pid("Name:\tx\nNSpid:\t4242\t7\n"), Some(7));
        assert_eq!(inner_ns_pid("NSpid:\t4242\n"), Some(4242));
        assert_eq!(inner_ns_pid("Name:\tx\n"), None);
    }

    /// This kernel (6.18) has pidfs: our own inode is ours alone, and a child's differs from ours.
    #[test]
    fn pidfs_inodes_tell_processes_apart() {
        let me = pidfs_inode(std::process::id()).expect("pidfs on this kernel");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let other = pidfs_inode(child.id()).expect("the child's inode");
        let _ = child.kill();
        let _ = child.wait();
        assert_ne!(me, other);
        assert_eq!(
            pidfs_inode(std::process::id()),
            Some(me),
            "stable for one process"
        );
    }

    #[test]
    fn pid_namespace_links() {
        assert_eq!(pid_ns_ino("pid:[4026531836]"), Some(INIT_PID_NS_INO));
        assert_eq!(pid_ns_ino("pid:[4026532179]"), Some(4_026_532_179));
        assert_eq!(pid_ns_ino("net:[1]"), None);
    }

    #[test]
    fn sysvipc_parses_rows() {
        let s = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n         0          3  1600                 524288  1234  1240      2     0     0     0     0 1700000000 0 1700000000 524288 0\n";
        let v = parse_sysvipc_shm(s);
        assert_eq!(
            v,
            vec![SysvSegment {
                shmid: 3,
                bytes: 524_288,
                creator_pid: 1234,
                attached: 2
            }]
        );
    }

    /// A process that exits between its stat and its fd walk is gone, not "could not be inspected".
    #[test]
    fn a_process_gone_before_its_fd_walk_is_not_a_blind_spot() {
        let root = tempfile::tempdir().expect("tempdir");
        let stat =
            "4242 (python3) S 1 4242 4242 0 -1 4194560 1 0 0 0 5 3 0 0 20 0 2 0 123456 100 5\n";
        // Two processes whose stat is there: one whose fd directory has already vanished, one whose fd
        // directory exists but may not be read.
        for pid in ["4242", "4343"] {
            let d = root.path().join(pid);
            std::fs::create_dir(&d).expect("mkdir");
            std::fs::write(d.join("stat"), stat.replace("4242", pid)).expect("stat");
            std::fs::write(d.join("status"), "Uid:\t1000\t1000\t1000\t1000\n").expect("status");
        }
        let locked = root.path().join("4343").join("fd");
        std::fs::create_dir(&locked).expect("mkdir fd");
        // Not a directory: read_dir fails with ENOTDIR, standing in for EACCES (the tests may run as root,
        // who can read any mode).
        std::fs::remove_dir(&locked).expect("rmdir");
        std::fs::write(&locked, b"").expect("fd as a file");
        let (_, t) = full_scan(ProcfsConfig {
            proc_root: root.path().to_path_buf(),
            ..Default::default()
        });
        assert!(
            !t.procs.contains_key(&4242),
            "an exited process is not listed"
        );
        assert!(
            !t.unreadable.contains(&4242),
            "an exited process is not a blind spot"
        );
        assert!(
            t.unreadable.contains(&4343),
            "an fd table we could not read is a blind spot"
        );
    }

    #[test]
    fn between_listings_new_processes_are_found_by_the_pids_handed_out_and_threads_are_not_processes()
     {
        let root = tempfile::tempdir().expect("tempdir");
        let task = |pid: u32, tgid: u32| {
            let d = root.path().join(pid.to_string());
            std::fs::create_dir(&d).expect("mkdir");
            let stat = format!(
                "{pid} (sleep) S 1 {pid} {pid} 0 -1 4194560 1 0 0 0 5 3 0 0 20 0 1 0 {pid} 100 5\n"
            );
            std::fs::write(d.join("stat"), stat).expect("stat");
            std::fs::write(d.join("status"), format!("Tgid:\t{tgid}\n")).expect("status");
            std::fs::create_dir(d.join("fd")).expect("fd");
        };
        let loadavg = |last: u32| {
            std::fs::write(
                root.path().join("loadavg"),
                format!("0.00 0.00 0.00 1/5 {last}\n"),
            )
            .expect("loadavg");
        };
        task(100, 100);
        loadavg(100);
        let (mut s, mut t) = full_scan(ProcfsConfig {
            proc_root: root.path().to_path_buf(),
            ..Default::default()
        });
        assert_eq!(t.procs.len(), 1);
        // A process (101) and a thread of it (102) were created: only the process is one.
        task(101, 101);
        task(102, 101);
        loadavg(102);
        s.scan(&mut t, Depth::Listing, &HashSet::new());
        let mut pids: Vec<u32> = t.procs.keys().copied().collect();
        pids.sort_unstable();
        assert_eq!(pids, [100, 101]);
        // Nothing handed out since: a listing reads nothing new (a process that appeared anyway, which cannot
        // happen on a real kernel, is not seen until the next full scan).
        task(103, 103);
        s.scan(&mut t, Depth::Listing, &HashSet::new());
        assert!(!t.procs.contains_key(&103));
        s.scan(&mut t, Depth::Full, &HashSet::new());
        assert!(t.procs.contains_key(&103));
    }

    /// A process known not to hold a GPU that NVML now lists has its fds walked at once, even between
    /// listings (a scan of the known processes): NVML lists a rank the moment its context exists, and a scan that trusted the last walk
    /// called it a PID reused by another program (seen on an H100 as a job's ranks started).
    #[test]
    fn a_known_process_listed_by_nvml_is_walked_again_between_listings() {
        use std::io::{BufRead, Write};
        let (_dir, dev, cfg) = stand_in_device();
        let mut child = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "read _; exec 3<'{}'; echo opened; read _",
                dev.display()
            ))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("bash");
        let pid = child.id();
        let (mut s, mut t) = full_scan(cfg);
        assert!(t.procs.contains_key(&pid) && !t.holders.contains_key(&pid));
        // It opens the device; NVML lists it.
        let mut stdin = child.stdin.take().expect("stdin");
        writeln!(stdin).expect("go");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("opened");
        assert_eq!(line.trim(), "opened");
        // Looked at again after the listing that named it (a first reading scans /proc before NVML is
        // read): the full scan stays full.
        s.recheck_listed(&mut t, &HashSet::from([pid]));
        let (held, full) = (t.holders.contains_key(&pid), t.full);
        drop(stdin);
        let _ = child.wait();
        assert!(held, "the listed process's device was not seen");
        assert!(full, "the scan before was full");
    }

    /// A scanner of `cfg` and its table after one full scan.
    fn full_scan(cfg: ProcfsConfig) -> (ProcScanner, ProcTable) {
        let mut s = ProcScanner::new(cfg).expect("scanner");
        let mut t = ProcTable::default();
        s.scan(&mut t, Depth::Full, &HashSet::new());
        (s, t)
    }

    /// A stand-in GPU device (an ordinary file) in a directory of its own, and a scanner's config that takes
    /// it for one.
    fn stand_in_device() -> (tempfile::TempDir, std::path::PathBuf, ProcfsConfig) {
        let dir = tempfile::tempdir().expect("tempdir");
        let dev = dir.path().join("nvidia0");
        std::fs::write(&dev, b"").expect("write");
        let cfg = ProcfsConfig {
            device_globs: vec![format!("{}/nvidia*", dir.path().display())],
            ..Default::default()
        };
        (dir, dev, cfg)
    }

    #[test]
    fn scan_finds_self_with_a_stand_in_device_open() {
        let (_dir, dev, cfg) = stand_in_device();
        let _f = std::fs::File::open(&dev).expect("open");
        let (mut s, mut t) = full_scan(cfg);
        let me = std::process::id();
        let (devs, n) = t.holders.get(&me).expect("we hold the stand-in device");
        assert_eq!(devs, &vec![dev.to_string_lossy().into_owned()]);
        assert!(*n >= 1);
        assert!(t.full);
        // The next scans read less, but still read holders.
        for depth in [Depth::Listing, Depth::Known] {
            s.scan(&mut t, depth, &HashSet::new());
            assert!(!t.full);
            assert!(t.holders.contains_key(&me), "{depth:?}");
        }
    }
}
