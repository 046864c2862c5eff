//! One collector per host, all feeding one event channel, keyed by `HostId`. A host that is slow, down or
//! sending garbage only ever delays its own events: front ends read the channel and never block on a host.
//!
//! Local and demo hosts run the poll loop on threads of their own (NVML and /proc reads are blocking and
//! cheap); remote hosts are tokio tasks. Every reading is analyzed here, once, with the operator's options.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as smpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};

use super::eventlog::Recorder;
use super::ledger::{Judged, Judgement, Ledger};
use super::poll;
use gpusweep_act::{AuditLog, Deliverer};
use gpusweep_analyze::AnalyzeOptions;
use gpusweep_core::action::ActionAnswer;
use gpusweep_core::event::Event;
use gpusweep_core::host::{HostSpec, unique_labels};
use gpusweep_core::model::{HostId, HostSnapshot, SaidGauges, SourceKind, now_ms};
use gpusweep_core::signal::Protected;
use gpusweep_source::demo::{DemoClock, DemoHost};
use gpusweep_source::local::LocalSource;
use gpusweep_source::local::procfs::ProcfsConfig;
use gpusweep_source::remote::http::{HttpClient, HttpOptions};
use gpusweep_source::remote::http_group::{self, GroupCmd, GroupHost};
use gpusweep_source::remote::prom::{PromCmd, PromHost, PromServer, Voices};
use gpusweep_source::remote::{RemoteOptions, RemoteTask, ssh::SshOptions};
use gpusweep_source::{ConnStatus, HostCmd, Sink, Source};

/// One host of the fleet: what it is, its collector, and where its readings go.
struct Member {
    spec: HostSpec,
    handle: Handle,
    slot: Slot,
    sink: Arc<dyn Sink>,
    /// Its readings are judged here, and the actions sent to it recorded.
    ledger: Arc<Mutex<Ledger>>,
    /// Read from Prometheus: set when it is opened live, so its poller leaves it alone.
    detached: Option<Arc<AtomicBool>>,
}

/// What the fleet hands a front end: everything its hosts' ledgers decided, in order per host.
#[derive(Debug, Clone)]
pub enum HostEvent {
    /// What the host's ledger decided of its readings since the front end last took one: a whole judged
    /// reading, memory alone (to a front end that asked, `FleetOptions::memory_alone`: put onto the one it
    /// holds), or only a new time and gauges. Readings that came faster than the front end took them
    /// come as one (`Judgement::then`).
    Update {
        host: HostId,
        update: Judgement,
    },
    Status {
        host: HostId,
        status: ConnStatus,
    },
    /// What happened on the host since its last events: each exactly once, never coalesced away.
    Events {
        host: HostId,
        events: Vec<Event>,
    },
    /// The answer to an action request sent with this id.
    Answer {
        host: HostId,
        id: u64,
        answer: ActionAnswer,
    },
}

#[derive(Debug, Clone)]
pub struct FleetOptions {
    pub interval: Duration,
    pub analyze: AnalyzeOptions,
    pub procfs: ProcfsConfig,
    pub load_nvml: bool,
    /// Read utilization, temperature and power of this host's GPUs (readers of the verdict alone skip them).
    pub gauges: bool,
    /// The front end holds every reading it is handed (kept fresh): a reading that moved only its memory
    /// comes as `Judgement::Memory`, to be put onto it. Others get every new reading whole.
    pub memory_alone: bool,
    /// And dcgm-exporter's counters (clocks, energy, engines, GPM ratios...): the serve's, at its interval.
    pub counters: bool,
    pub audit: AuditLog,
    /// Signal with kill(2) after a start-time check where this host has no pidfd (opt-in).
    pub kill_without_pidfd: bool,
    pub ssh: SshOptions,
    pub demo_clock: DemoClock,
    /// `http(s)://` and `prom:` hosts: the token and extra trusted certificate.
    pub http: HttpOptions,
    /// Read this host through the serve answering on this socket, where one does (`snapshot`, `wait`,
    /// `sweep`, `kill`): then the serve's ledger sees the actions too.
    pub serve_socket: Option<std::path::PathBuf>,
    /// This front end acts on the host (kills, removals): a serve that would refuse this user's actions
    /// (it takes them from root and its own user only) is not used, and this host is read in-process.
    pub acts: bool,
    /// `--events FILE`: every host's events appended as its ledger produces them (the TUI writes its own).
    pub events_file: Option<std::path::PathBuf>,
    /// `prom:` hosts are first shown from their compact summaries (each GPU's state, findings by kind),
    /// their bytes and identities a poll later: for a front end that shows readings as they come (the
    /// TUI). A one-shot reader takes a host's first reading as its answer, so it waits for the whole one.
    pub quick_first_view: bool,
    /// This host's name where it is not its kernel's (a serve in a pod says its Kubernetes node's name,
    /// `--kube-node`, not the pod's UTS name, which changes at every restart).
    pub local_name: Option<String>,
}

impl FleetOptions {
    /// For a front end that needs only the verdict (memory, processes, holders): local GPUs are read without
    /// utilization, temperature and power, whose first reading costs a fresh process ~5 ms per GPU.
    #[must_use]
    pub fn without_gauges(mut self) -> Self {
        self.gauges = false;
        self
    }
}

/// Commands queued for one host at most; past that a host is busy and further commands are answered at once.
pub const CMD_QUEUE: usize = 64;

/// What travels on the event channel. A reading is not in it: it waits in its host's slot, so a host that
/// sends faster than a front end reads costs one snapshot of memory, not a queue of them. Events are, so none
/// is lost.
enum Wire {
    /// The host's slot went from empty to full.
    Reading(HostId),
    Status(HostId, ConnStatus),
    Events(HostId, Vec<Event>),
    Answer(HostId, u64, ActionAnswer),
}

/// What of a host waits to be read: the ledger's updates since the front end last took one. At most one
/// wake-up of each host is ever queued, however fast it sends.
type Slot = Arc<Mutex<Pending>>;

/// A host's updates not taken yet: its last whole reading, and what came after it as one
/// (`Judgement::then`). The whole reading is the ledger's own, shared: what came after waits beside it and
/// is taken after it, where putting it in would copy the reading (every host of a 10,000-host TUI, whose
/// first readings wait while it draws the first view).
#[derive(Debug, Default)]
struct Pending {
    whole: Option<Box<Judged>>,
    after: Option<Judgement>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.whole.is_none() && self.after.is_none()
    }

    fn put(&mut self, update: Judgement) {
        match update {
            Judgement::New(j) => {
                self.whole = Some(j);
                self.after = None;
            }
            u => {
                self.after = Some(match self.after.take() {
                    Some(earlier) => earlier.then(u),
                    None => u,
                });
            }
        }
    }

    /// The next update to hand on: the whole reading first.
    fn take(&mut self) -> Option<Judgement> {
        self.whole
            .take()
            .map(Judgement::New)
            .or_else(|| self.after.take())
    }
}

/// The runtime's side of a source: every reading, status and answer goes through the host's ledger, which
/// judges it; what the ledger decides goes on to the front end.
struct FleetSink {
    host: HostId,
    ledger: Arc<Mutex<Ledger>>,
    slot: Slot,
    tx: mpsc::UnboundedSender<Wire>,
    log: Option<Arc<Recorder>>,
}

impl FleetSink {
    /// Add an update to what waits in the slot; only an empty slot needs a wake-up (a full one is read once).
    fn put(&self, update: Judgement) -> bool {
        let was_empty = match self.slot.lock() {
            Ok(mut w) => {
                let empty = w.is_empty();
                w.put(update);
                empty
            }
            Err(_) => return false,
        };
        !was_empty || self.tx.send(Wire::Reading(self.host)).is_ok()
    }
    /// Events go out before the reading they came with is taken: a front end records them, then shows it.
    fn events(&self, events: Vec<Event>) -> bool {
        if events.is_empty() {
            return true;
        }
        if let Some(log) = &self.log {
            log.record(&events);
        }
        self.tx.send(Wire::Events(self.host, events)).is_ok()
    }

    fn judged(&self, j: Judgement, events: Vec<Event>) -> bool {
        self.events(events) && self.put(j)
    }
}

impl Sink for FleetSink {
    fn reading(&self, snap: HostSnapshot) -> bool {
        let Ok((j, events)) = self.ledger.lock().map(|mut l| l.reading(snap)) else {
            return false;
        };
        self.judged(j, events)
    }
    fn memory(&self, moved: gpusweep_core::sse::MemoryMoved) -> Option<bool> {
        let Ok(judged) = self.ledger.lock().map(|mut l| l.memory(moved)) else {
            return Some(false);
        };
        let (j, events) = judged?;
        Some(self.judged(j, events))
    }
    fn status(&self, status: ConnStatus) -> bool {
        let Ok(events) = self.ledger.lock().map(|mut l| l.status(&status, now_ms())) else {
            return false;
        };
        self.events(events) && self.tx.send(Wire::Status(self.host, status)).is_ok()
    }
    fn fresh(&self, taken_at_ms: u64, gauges: SaidGauges) -> bool {
        let Ok(fresh) = self.ledger.lock().map(|mut l| l.fresh(taken_at_ms, gauges)) else {
            return false;
        };
        match fresh {
            Some((j, events)) => self.judged(j, events),
            None => true,
        }
    }
    fn answer(&self, id: u64, answer: ActionAnswer) -> bool {
        let Ok(events) = self.ledger.lock().map(|l| l.answered(&answer, now_ms())) else {
            return false;
        };
        self.events(events) && self.tx.send(Wire::Answer(self.host, id, answer)).is_ok()
    }
}

/// The next update waiting in a host's slot. What came after a whole reading stays, and the host is woken
/// again: its turn comes after the events queued meanwhile.
fn take_waiting(slot: &Slot, host: HostId, tx: &mpsc::UnboundedSender<Wire>) -> Option<Judgement> {
    let mut waiting = slot.lock().ok()?;
    let update = waiting.take()?;
    if !waiting.is_empty() {
        let _ = tx.send(Wire::Reading(host));
    }
    Some(update)
}

enum Handle {
    Thread(smpsc::SyncSender<HostCmd>),
    Task(mpsc::Sender<HostCmd>),
    /// One host of a collector that reads several together (a Prometheus server's poller, a serve's one
    /// event stream): its place there.
    Shared(mpsc::Sender<(usize, HostCmd)>, usize),
    /// One simulated host of the thread that polls them all: its place there.
    Pool(smpsc::SyncSender<(usize, HostCmd)>, usize),
}

pub struct Fleet {
    /// Every host, by `HostId`.
    hosts: Vec<Member>,
    /// Their labels, unique across the fleet (made for all hosts at once).
    labels: Vec<String>,
    remote: RemoteOptions,
    connect_limit: Arc<Semaphore>,
    /// Kept to answer, at once, a signal request that a busy host's queue had no room for.
    tx: mpsc::UnboundedSender<Wire>,
    events: mpsc::UnboundedReceiver<Wire>,
    log: Option<Arc<Recorder>>,
}

/// Why a host seen through Prometheus could not be opened live.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenLiveError {
    #[error("no such host")]
    NoSuchHost,
    #[error("{0}")]
    Spec(#[from] gpusweep_core::host::SpecError),
    #[error("no HTTP client in this fleet")]
    NoHttpClient,
    #[error(
        "{0:?} is not a bare host name: a user or port is never taken from what Prometheus holds (name it with --hosts user@host:port)"
    )]
    NotBareHost(String),
}

/// What "open live" may open: a serve's URL, or SSH to a host name alone. The address comes from what a
/// Prometheus server holds, so a user, a port or `local` is never taken from it.
/// Each host's label: its spec's, made unique, and `local_name` for this host where one is given.
fn labels_of(specs: &[HostSpec], local_name: Option<&str>) -> Vec<String> {
    let mut labels = unique_labels(specs);
    if let Some(name) = local_name {
        for (label, spec) in labels.iter_mut().zip(specs) {
            if matches!(spec, HostSpec::Local) {
                name.clone_into(label);
            }
        }
    }
    labels
}

pub(crate) fn live_spec(url: &str) -> Result<HostSpec, OpenLiveError> {
    match url.strip_prefix("ssh://") {
        Some(name) if gpusweep_core::host::is_bare_host(name) => {
            Ok(gpusweep_core::host::parse_one(name)?)
        }
        Some(name) => Err(OpenLiveError::NotBareHost(name.to_string())),
        None => Ok(HostSpec::Http {
            url: gpusweep_core::host::HttpUrl::parse(url)?,
        }),
    }
}

/// The hosts of one Prometheus server, gathered to be polled together, and their command channel.
type PromGroup = (
    mpsc::Sender<PromCmd>,
    mpsc::Receiver<PromCmd>,
    Vec<PromHost>,
);

/// The hosts of one serve read through one event stream, and their command channel.
type HttpGroup = (
    mpsc::Sender<GroupCmd>,
    mpsc::Receiver<GroupCmd>,
    Vec<GroupHost>,
);

/// What the fleet gathers while its hosts are added: the collectors that read several hosts together.
#[derive(Default)]
struct Gathered {
    /// Hosts of each Prometheus server, polled together.
    proms: BTreeMap<PromServer, PromGroup>,
    /// The event streams (`stream_of`) and how many hosts each reads: a command queue with room for one
    /// command of each (an interval change is sent to every host).
    grouped: BTreeMap<StreamKey, usize>,
    /// Their hosts.
    serves: BTreeMap<StreamKey, HttpGroup>,
    /// The simulated hosts, polled together on one thread: the channel of their commands (its receiving
    /// end until the thread takes it) and the hosts.
    demos: Option<DemoPool>,
    /// How many simulated hosts there are: room in their queue for one command each.
    demo_count: usize,
}

/// The simulated hosts' command channel and the hosts, until their thread starts.
type DemoPool = (
    smpsc::SyncSender<(usize, HostCmd)>,
    Option<smpsc::Receiver<(usize, HostCmd)>>,
    Vec<poll::Pooled>,
);

/// The event stream a `http(s)://` host is read through, and its name there: the hosts named of one serve
/// (`/hosts/NAME`) share the stream of the serve's origin; a serve named by its address is a stream of its
/// own (`i` keeps two such specs apart), its one host unnamed.
fn stream_of(i: usize, spec: &HostSpec) -> Option<(StreamKey, Option<&str>)> {
    let HostSpec::Http { url } = spec else {
        return None;
    };
    Some(match url.served_host() {
        Some(name) => ((url.origin(), None), Some(name)),
        None => ((url.base(), Some(i)), None),
    })
}

/// An event stream: where the serve's API is, and for a serve named by its address, the spec's place.
type StreamKey = (String, Option<usize>);

/// How many hosts each event stream reads.
fn shared_serves(specs: &[HostSpec]) -> BTreeMap<StreamKey, usize> {
    let mut count: BTreeMap<StreamKey, usize> = BTreeMap::new();
    for (key, _) in specs
        .iter()
        .enumerate()
        .filter_map(|(i, s)| stream_of(i, s))
    {
        *count.entry(key).or_default() += 1;
    }
    count
}

/// Every `prom:` spec replaced by the hosts its server knows now (discovered within the connect timeout),
/// and what each server's discovery found of their voices. A server that cannot be asked stays as one
/// host, which then says why it cannot be read.
async fn expand(
    specs: &[HostSpec],
    http: Option<&HttpClient>,
    timeout: Duration,
) -> (Vec<HostSpec>, BTreeMap<PromServer, Voices>) {
    let mut out = Vec::new();
    let mut voices = BTreeMap::new();
    for spec in specs {
        let HostSpec::Prom(server) = spec else {
            out.push(spec.clone());
            continue;
        };
        let found = match http {
            Some(h) => {
                tokio::time::timeout(timeout, gpusweep_source::remote::prom::discover(server, h))
                    .await
                    .ok()
            }
            None => None,
        };
        match found {
            Some(Ok(found)) if !found.names.is_empty() => {
                out.extend(found.names.into_iter().map(|name| HostSpec::PromHost {
                    server: server.clone(),
                    name,
                }));
                voices.insert(server.clone(), found.voices);
            }
            _ => out.push(spec.clone()),
        }
    }
    (out, voices)
}

/// A `gpusweep serve` of this host that answers on `path`, if one does: then this host is read through it.
/// Its hello must name this host (a demo serve, or one of another host's socket mounted here, does not).
/// For a one-shot reader, before its async runtime and fleet exist: start loading NVML now if this host
/// will be read from it (this host among the specs, NVML allowed, no serve socket to read it through).
pub fn load_local_early(specs: &[HostSpec], opts: &FleetOptions) {
    let local = specs.iter().any(|s| matches!(s, HostSpec::Local));
    let serve_may_answer = opts
        .serve_socket
        .as_deref()
        .is_some_and(std::path::Path::exists);
    if local && opts.load_nvml && !serve_may_answer {
        start_local_nvml(opts.gauges);
    }
}

/// Start loading this host's NVML now, for the local source to take when it starts (see `load_local_early`).
/// Left unused, it is let finish before exit (`runtime::shutdown`).
pub fn start_local_nvml(gauges: bool) {
    gpusweep_source::local::early::start(gauges);
}

/// The socket's path when a serve of this host answers there (its hello names this host) and, for a front end
/// that acts, would take this user's actions: this user is root or the serve's own user (told by
/// SO_PEERCRED).
fn serve_answers(path: Option<&std::path::Path>, this_host: &str, acts: bool) -> Option<String> {
    use std::io::{BufRead, Read};
    let path = path?;
    let stream = std::os::unix::net::UnixStream::connect(path).ok()?;
    if acts {
        let serve_uid = rustix::net::sockopt::socket_peercred(&stream).ok()?.uid;
        let me = rustix::process::geteuid();
        if !me.is_root() && me != serve_uid {
            return None;
        }
    }
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    let mut line = Vec::new();
    std::io::BufReader::new(stream)
        .take(64 * 1024)
        .read_until(b'\n', &mut line)
        .ok()?;
    match serde_json::from_slice::<gpusweep_core::protocol::AgentMsg>(&line).ok()? {
        gpusweep_core::protocol::AgentMsg::Hello { host, protocol, .. }
            if host == this_host && protocol == gpusweep_core::protocol::PROTOCOL =>
        {
            Some(path.to_string_lossy().into_owned())
        }
        _ => None,
    }
}

impl Fleet {
    /// Start a collector per host. Must be called inside a tokio runtime. `prom:` specs become the hosts
    /// their server knows (asked now); this host is read through a running serve where the options ask for
    /// that and one answers.
    pub async fn start(
        specs: &[HostSpec],
        opts: &FleetOptions,
    ) -> Result<Fleet, gpusweep_source::SourceError> {
        Fleet::start_discovering_within(specs, opts, opts.ssh.connect_timeout).await
    }

    /// `start`, where a `prom:` server may take up to `discovery` (not the connect timeout) to say which
    /// hosts it knows: for a front end that stays (the TUI), whose fleet cannot grow once started, and for
    /// which a busy server's slow first answer is no reason to stand as one unreadable host.
    pub async fn start_discovering_within(
        specs: &[HostSpec],
        opts: &FleetOptions,
        discovery: Duration,
    ) -> Result<Fleet, gpusweep_source::SourceError> {
        let needs_http = specs
            .iter()
            .any(|s| matches!(s, HostSpec::Http { .. } | HostSpec::Prom(_)));
        let http = if needs_http {
            Some(opts.http.client(opts.ssh.connect_timeout)?)
        } else {
            None
        };
        let (specs, mut voices) = expand(specs, http.as_ref(), discovery).await;
        let log = match &opts.events_file {
            Some(path) => {
                Some(Arc::new(Recorder::open(path).map_err(|e| {
                    gpusweep_source::SourceError::Unreadable(e.to_string())
                })?))
            }
            None => None,
        };
        let (tx, events) = mpsc::unbounded_channel();
        let mut fleet = Fleet {
            labels: labels_of(&specs, opts.local_name.as_deref()),
            hosts: Vec::with_capacity(specs.len()),
            remote: RemoteOptions {
                interval: opts.interval,
                ssh: opts.ssh.clone(),
                benign: opts.procfs.benign.clone(),
                http: http.clone(),
            },
            connect_limit: Arc::new(Semaphore::new(opts.ssh.max_connections.max(1))),
            tx,
            events,
            log,
        };
        let mut gathered = Gathered {
            grouped: shared_serves(&specs),
            demo_count: specs
                .iter()
                .filter(|s| matches!(s, HostSpec::Demo(_)))
                .count(),
            ..Gathered::default()
        };
        for spec in specs {
            fleet.add(spec, opts, &mut gathered)?;
        }
        for (server, (_, rx, hosts)) in gathered.proms {
            let found = voices.remove(&server);
            if let Some(http) = http.clone() {
                let poll = gpusweep_source::remote::prom::run(
                    server,
                    http,
                    hosts,
                    opts.interval,
                    (opts.quick_first_view, found),
                    rx,
                );
                tokio::spawn(poll);
            }
        }
        if let Some((_, Some(rx), hosts)) = gathered.demos {
            let interval = opts.interval;
            let spawned = std::thread::Builder::new()
                .name("demo-hosts".into())
                .spawn(move || poll::run_pool(hosts, &rx, interval));
            if let Err(e) = spawned {
                eprintln!("gpusweep: cannot start the simulated hosts' thread: {e}");
            }
        }
        for ((base, _), (_, rx, hosts)) in gathered.serves {
            if let Some(http) = http.clone() {
                let timeout = opts.ssh.connect_timeout;
                let read = http_group::run(base, http, hosts, opts.interval, timeout, rx);
                tokio::spawn(read);
            }
        }
        Ok(fleet)
    }

    /// Where a host's readings go: its slot, its ledger (which judges them) and the sink its collector writes.
    fn judged_sink(
        &self,
        host: HostId,
        label: &str,
        opts: &FleetOptions,
    ) -> (Slot, Arc<Mutex<Ledger>>, Arc<dyn Sink>) {
        let slot: Slot = Arc::default();
        let mut ledger = Ledger::new(label, opts.analyze);
        if opts.memory_alone {
            ledger.hand_on_memory_alone();
        }
        let ledger = Arc::new(Mutex::new(ledger));
        let sink: Arc<dyn Sink> = Arc::new(FleetSink {
            host,
            ledger: ledger.clone(),
            slot: slot.clone(),
            tx: self.tx.clone(),
            log: self.log.clone(),
        });
        (slot, ledger, sink)
    }

    /// One host more: its ledger and slot, and its collector (a thread, a task, or a place in its Prometheus
    /// server's poller).
    fn add(
        &mut self,
        spec: HostSpec,
        opts: &FleetOptions,
        gathered: &mut Gathered,
    ) -> Result<(), gpusweep_source::SourceError> {
        let i = self.hosts.len();
        let label = self.labels.get(i).cloned().unwrap_or_default();
        let (slot, ledger, sink) = self.judged_sink(HostId(i), &label, opts);
        let member_sink = sink.clone();
        let mut detach = None;
        let handle = match &spec {
            HostSpec::Local => self.local(i, &label, sink, opts)?,
            HostSpec::Demo(name) => {
                let mut src = DemoHost::new(name, opts.demo_clock.clone());
                if opts.counters {
                    src = src.with_counters();
                }
                if !opts.gauges {
                    src = src.without_gauges();
                }
                let n = gathered.demo_count;
                let (tx, _, hosts) = gathered.demos.get_or_insert_with(|| {
                    let (t, r) = smpsc::sync_channel(CMD_QUEUE.max(n));
                    (t, Some(r), Vec::new())
                });
                hosts.push(poll::Pooled {
                    src: Box::new(src),
                    sink,
                });
                Handle::Pool(tx.clone(), hosts.len() - 1)
            }
            HostSpec::Http { .. }
                if let Some((key, name, n)) = stream_of(i, &spec)
                    .and_then(|(k, name)| Some((k.clone(), name, *gathered.grouped.get(&k)?))) =>
            {
                let entry = gathered.serves.entry(key).or_insert_with(|| {
                    let (t, r) = mpsc::channel(CMD_QUEUE.max(n));
                    (t, r, Vec::new())
                });
                entry.2.push(GroupHost {
                    name: name.map(str::to_string),
                    sink,
                });
                Handle::Shared(entry.0.clone(), entry.2.len() - 1)
            }
            HostSpec::PromHost { server, name } => {
                let entry = gathered.proms.entry(server.clone()).or_insert_with(|| {
                    let (t, r) = mpsc::channel(CMD_QUEUE);
                    (t, r, Vec::new())
                });
                let flag = Arc::new(AtomicBool::new(false));
                detach = Some(flag.clone());
                entry.2.push(PromHost {
                    name: name.clone(),
                    sink,
                    detached: flag,
                });
                Handle::Shared(entry.0.clone(), entry.2.len() - 1)
            }
            HostSpec::Ssh { .. }
            | HostSpec::Command { .. }
            | HostSpec::Http { .. }
            | HostSpec::Socket { .. }
            | HostSpec::Prom(_) => self.remote_task(&label, spec.clone(), sink),
        };
        self.hosts.push(Member {
            spec,
            handle,
            slot,
            sink: member_sink,
            ledger,
            detached: detach,
        });
        Ok(())
    }

    /// This host: through a running serve where one answers (and takes this user's actions, for a front end
    /// that acts), else in-process on a thread of its own.
    fn local(
        &self,
        i: usize,
        label: &str,
        sink: Arc<dyn Sink>,
        opts: &FleetOptions,
    ) -> Result<Handle, gpusweep_source::SourceError> {
        let socket = opts.serve_socket.as_deref();
        if let Some(path) = serve_answers(socket, &gpusweep_core::host::local_hostname(), opts.acts)
        {
            return Ok(self.remote_task(label, HostSpec::Socket { path }, sink));
        }
        let src = LocalSource::new(
            label.to_string(),
            opts.procfs.clone(),
            opts.load_nvml,
            gpusweep_source::local::nvml::Readout::of(opts.gauges, opts.counters),
        )?;
        let d = Deliverer {
            host: label.to_string(),
            audit: opts.audit.clone(),
            without_pidfd: opts.kill_without_pidfd,
        };
        let tx = spawn_thread(i, Box::new(src), Some(d), sink, opts.interval);
        Ok(Handle::Thread(tx))
    }

    /// A remote host's task, started now.
    fn remote_task(&self, label: &str, spec: HostSpec, sink: Arc<dyn Sink>) -> Handle {
        let (ctx, crx) = mpsc::channel(CMD_QUEUE);
        let task = RemoteTask {
            label: label.to_string(),
            spec,
            opts: self.remote.clone(),
            sink,
            connect_limit: self.connect_limit.clone(),
        };
        tokio::spawn(task.run(crx));
        Handle::Task(ctx)
    }

    /// Read a host live that was seen through Prometheus: through its serve (`http(s)://...`) or over SSH
    /// (`ssh://name`), in place of its Prometheus summary. Must be called inside the fleet's runtime.
    pub fn open_live(&mut self, host: HostId, url: &str) -> Result<HostSpec, OpenLiveError> {
        let i = host.0;
        if i >= self.hosts.len() {
            return Err(OpenLiveError::NoSuchHost);
        }
        let spec = live_spec(url)?;
        // Hosts seen through Prometheus came with an HTTP client: their serves use the same one.
        if matches!(spec, HostSpec::Http { .. }) && self.remote.http.is_none() {
            return Err(OpenLiveError::NoHttpClient);
        }
        if let Some(flag) = self.hosts.get(i).and_then(|h| h.detached.as_ref()) {
            flag.store(true, Ordering::SeqCst);
        }
        let label = self.labels[i].clone();
        let handle = self.remote_task(&label, spec.clone(), self.hosts[i].sink.clone());
        self.hosts[i].handle = handle;
        self.hosts[i].spec = spec.clone();
        Ok(spec)
    }

    /// The next event of any host; `None` once every collector is gone.
    pub async fn recv(&mut self) -> Option<HostEvent> {
        loop {
            let w = self.events.recv().await?;
            if let Some(ev) = self.event(w) {
                return Some(ev);
            }
        }
    }

    /// The next event already there, without waiting.
    pub fn try_recv(&mut self) -> Option<HostEvent> {
        loop {
            let w = self.events.try_recv().ok()?;
            if let Some(ev) = self.event(w) {
                return Some(ev);
            }
        }
    }

    fn event(&self, w: Wire) -> Option<HostEvent> {
        Some(match w {
            Wire::Reading(host) => HostEvent::Update {
                host,
                update: take_waiting(&self.hosts.get(host.0)?.slot, host, &self.tx)?,
            },
            Wire::Status(host, status) => HostEvent::Status { host, status },
            Wire::Events(host, events) => HostEvent::Events { host, events },
            Wire::Answer(host, id, answer) => HostEvent::Answer { host, id, answer },
        })
    }

    /// Queue a command for one host. An action is recorded in the host's ledger first (a signal is an event,
    /// and starts the clocks of the GPUs it may free), whoever sends it. A full queue (a host that stopped
    /// answering) drops polls and interval changes, which the next one supersedes, and answers an action
    /// at once: never left hanging.
    pub fn send(&self, host: HostId, cmd: HostCmd) {
        if let HostCmd::Act { req, .. } = &cmd
            && let Some(Ok(events)) = self
                .hosts
                .get(host.0)
                .map(|h| h.ledger.lock().map(|mut l| l.sent(req, now_ms())))
            && !events.is_empty()
        {
            if let Some(log) = &self.log {
                log.record(&events);
            }
            let _ = self.tx.send(Wire::Events(host, events));
        }
        let refused = match self.hosts.get(host.0).map(|h| &h.handle) {
            Some(Handle::Thread(t)) => match t.try_send(cmd) {
                Ok(()) => None,
                Err(smpsc::TrySendError::Full(c) | smpsc::TrySendError::Disconnected(c)) => Some(c),
            },
            Some(Handle::Task(t)) => match t.try_send(cmd) {
                Ok(()) => None,
                Err(mpsc::error::TrySendError::Full(c) | mpsc::error::TrySendError::Closed(c)) => {
                    Some(c)
                }
            },
            Some(Handle::Pool(t, at)) => match t.try_send((*at, cmd)) {
                Ok(()) => None,
                Err(
                    smpsc::TrySendError::Full((_, c)) | smpsc::TrySendError::Disconnected((_, c)),
                ) => Some(c),
            },
            Some(Handle::Shared(t, at)) => match t.try_send((*at, cmd)) {
                Ok(()) => None,
                Err(
                    mpsc::error::TrySendError::Full((_, c))
                    | mpsc::error::TrySendError::Closed((_, c)),
                ) => Some(c),
            },
            None => Some(cmd),
        };
        if let Some(HostCmd::Act { id, req }) = refused {
            let answer = req.refuse("host busy: its command queue is full");
            if let Some(sink) = self.hosts.get(host.0).map(|h| &h.sink) {
                sink.answer(id, answer);
            } else {
                let _ = self.tx.send(Wire::Answer(host, id, answer));
            }
        }
    }

    /// The host's latest reading as its ledger judged it (kept fresh), if it sent one.
    pub fn latest(&self, host: HostId) -> Option<Judged> {
        self.hosts.get(host.0)?.ledger.lock().ok()?.latest()
    }

    /// A reading of a host that could not be read, saying why: never clean, and marked with the kind of
    /// source it was asked of.
    pub fn unreadable(&self, host: HostId, why: &str) -> HostSnapshot {
        HostSnapshot {
            host: self.label(host).to_string(),
            error: Some(why.to_string()),
            taken_at_ms: now_ms(),
            source: self
                .spec(host)
                .map_or(SourceKind::Local, HostSpec::source_kind),
            simulated: matches!(self.spec(host), Some(HostSpec::Demo(_))),
            ..Default::default()
        }
    }

    pub fn broadcast(&self, cmd: &HostCmd) {
        for i in self.ids() {
            self.send(i, cmd.clone());
        }
    }

    pub fn ids(&self) -> impl Iterator<Item = HostId> + use<> {
        (0..self.hosts.len()).map(HostId)
    }

    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// The host's label, unique in this fleet.
    pub fn label(&self, host: HostId) -> &str {
        self.labels.get(host.0).map_or("?", String::as_str)
    }

    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// (id, label) of every host, for a watch.
    pub fn expected(&self) -> Vec<(HostId, String)> {
        self.ids().map(|i| (i, self.label(i).to_string())).collect()
    }

    pub fn spec(&self, host: HostId) -> Option<&HostSpec> {
        self.hosts.get(host.0).map(|h| &h.spec)
    }

    /// The PIDs never offered for signals on this host.
    pub fn protected(&self, host: HostId) -> Protected {
        protected_for(self.spec(host))
    }
}

/// The protection rule for a host of this spec: this host knows its own ancestry; others are guarded by
/// their agents.
pub fn protected_for(spec: Option<&HostSpec>) -> Protected {
    if spec == Some(&HostSpec::Local) {
        gpusweep_act::protect::this_host()
    } else {
        Protected::remote()
    }
}

/// Find a host by the spec as typed or by its label.
pub fn find_host(specs: &[HostSpec], labels: &[String], query: &str) -> Option<HostId> {
    specs
        .iter()
        .zip(labels)
        .position(|(s, l)| s.answers_to(query, l))
        .map(HostId)
}

fn spawn_thread(
    index: usize,
    src: Box<dyn Source>,
    signals: Option<Deliverer>,
    sink: Arc<dyn Sink>,
    interval: Duration,
) -> smpsc::SyncSender<HostCmd> {
    let (ctx, crx) = smpsc::sync_channel::<HostCmd>(CMD_QUEUE);
    let spawned = std::thread::Builder::new()
        .name(format!("host-{index}"))
        .spawn({
            let wake = ctx.clone();
            move || poll::run(src, signals.as_ref(), &sink, &crx, &wake, interval)
        });
    if let Err(e) = spawned {
        eprintln!("gpusweep: cannot start a collector thread: {e}");
    }
    ctx
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusweep_core::model::Gauges;

    fn sink() -> (FleetSink, mpsc::UnboundedReceiver<Wire>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let s = FleetSink {
            host: HostId(0),
            ledger: Arc::new(Mutex::new(Ledger::new("h", AnalyzeOptions::default()))),
            slot: Arc::default(),
            tx,
            log: None,
        };
        (s, rx)
    }

    #[test]
    fn open_live_takes_a_host_from_prometheus_never_a_user_or_port() {
        assert!(matches!(
            live_spec("ssh://node01"),
            Ok(HostSpec::Ssh { ref host, user: None, port: None }) if host == "node01"
        ));
        for bad in [
            "ssh://root@127.0.0.1:2222",
            "ssh://node01:2222",
            "ssh://root@node01",
            "ssh://local",
            "ssh://-oProxyCommand=x",
        ] {
            assert!(live_spec(bad).is_err(), "{bad}");
        }
        assert!(matches!(
            live_spec("http://10.0.0.5:9401/hosts/gpu-b"),
            Ok(HostSpec::Http { .. })
        ));
    }

    /// Gauges of one GPU (under the busy line below 50%: then they say nothing new of a GPU with nothing
    /// listed).
    fn hot(util: u32) -> Vec<Gauges> {
        vec![Gauges {
            utilization: Some(util),
            temperature_c: Some(60),
            power_mw: Some(300_000),
            counters: None,
        }]
    }

    /// The same, as a reading that said the same carries them.
    fn said(util: u32) -> SaidGauges {
        SaidGauges::every(hot(util))
    }

    #[test]
    fn a_fresh_reading_without_gauges_keeps_those_waiting() {
        let (s, mut rx) = sink();
        assert!(
            s.fresh(0, said(1)),
            "before any reading: nothing to refresh"
        );
        assert!(rx.try_recv().is_err());
        assert!(s.reading(HostSnapshot {
            gpus: vec![gpusweep_core::model::Gpu::default()],
            ..Default::default()
        }));
        assert!(
            matches!(rx.try_recv(), Ok(Wire::Events(HostId(0), _))),
            "host up"
        );
        assert!(matches!(rx.try_recv(), Ok(Wire::Reading(HostId(0)))));
        let _ = std::mem::take(&mut *s.slot.lock().expect("slot"));
        assert!(s.fresh(1, said(30)));
        assert!(
            s.fresh(2, SaidGauges::default()),
            "an unchanged that left its gauges out"
        );
        assert!(s.fresh(3, SaidGauges::default()));
        assert!(
            matches!(rx.try_recv(), Ok(Wire::Reading(HostId(0)))),
            "one wake-up"
        );
        assert!(rx.try_recv().is_err(), "a full slot wakes nobody again");
        let waiting = s.slot.lock().expect("slot").take();
        assert!(
            matches!(&waiting, Some(Judgement::Same { taken_at_ms: 3, gauges: g }) if *g == said(30)),
            "the latest time with the gauges last said"
        );
        assert!(s.fresh(4, said(10)));
        let waiting = s.slot.lock().expect("slot").take();
        assert!(
            matches!(&waiting, Some(Judgement::Same { taken_at_ms: 4, gauges: g }) if *g == said(10))
        );
    }

    /// A whole reading waiting with readings after it that said the same is handed on as the ledger's own
    /// (not a copy made to put their time in), then their time and gauges, woken again behind what was
    /// queued meanwhile.
    #[test]
    fn a_whole_reading_waiting_is_the_ledgers_own_and_what_came_after_follows() {
        let (s, mut rx) = sink();
        assert!(s.reading(HostSnapshot {
            taken_at_ms: 1_000,
            gpus: vec![gpusweep_core::model::Gpu::default()],
            ..Default::default()
        }));
        assert!(s.fresh(2_000, said(30)));
        assert!(s.fresh(3_000, said(31)));
        assert!(matches!(rx.try_recv(), Ok(Wire::Events(..))));
        assert!(matches!(rx.try_recv(), Ok(Wire::Reading(HostId(0)))));
        assert!(rx.try_recv().is_err(), "one wake-up");
        let Some(Judgement::New(j)) = take_waiting(&s.slot, HostId(0), &s.tx) else {
            panic!("the whole reading first")
        };
        let ledger = s.ledger.lock().expect("ledger");
        assert!(ledger.shares(&j.snap), "the ledger's own");
        drop(ledger);
        assert_eq!(j.snap.taken_at_ms, 1_000);
        assert!(
            matches!(rx.try_recv(), Ok(Wire::Reading(HostId(0)))),
            "woken again"
        );
        assert!(matches!(
            take_waiting(&s.slot, HostId(0), &s.tx),
            Some(Judgement::Same { taken_at_ms: 3_000, ref gauges }) if *gauges == said(31)
        ));
        assert!(rx.try_recv().is_err());
        assert!(take_waiting(&s.slot, HostId(0), &s.tx).is_none());
    }

    /// Memory alone waits in a host's slot with whatever came before or after it: put onto what the front
    /// end holds, it makes the reading the ledger keeps, at every take.
    #[test]
    fn memory_alone_waiting_with_anything_makes_the_ledgers_reading() {
        use gpusweep_core::model::{Gpu, MIB, Memory};
        let (mut s, _rx) = sink();
        let mut ledger = Ledger::new("h", AnalyzeOptions::default());
        ledger.hand_on_memory_alone();
        s.ledger = Arc::new(Mutex::new(ledger));
        let used = |mib: u64| Memory {
            used: Some(mib * MIB),
            total: Some(80 << 30),
            reserved: None,
        };
        let whole = |at: u64, gpus: usize| HostSnapshot {
            taken_at_ms: at,
            gpus: (0..gpus)
                .map(|i| Gpu {
                    index: u32::try_from(i).unwrap_or(0),
                    memory: used(0),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let moved =
            |at: u64, mib: u64, gauges: Option<Vec<Gauges>>| gpusweep_core::sse::MemoryMoved {
                host: "h".into(),
                taken_at_ms: at,
                used: vec![Some(mib * MIB)],
                charged: vec![vec![]],
                gauges,
                moved: None,
                findings: None,
            };
        let mut held: Option<Judged> = None;
        let take = |s: &FleetSink, held: &mut Option<Judged>| {
            let mut waiting = s.slot.lock().expect("slot");
            while let Some(u) = waiting.take() {
                match u {
                    Judgement::New(j) => *held = Some(*j),
                    Judgement::Memory(m) => assert!(m.put_onto(held.as_mut().expect("held"))),
                    Judgement::Same {
                        taken_at_ms,
                        gauges,
                    } => Arc::make_mut(&mut held.as_mut().expect("held").snap)
                        .refresh_said(taken_at_ms, &gauges),
                }
            }
            let l = s.ledger.lock().expect("ledger");
            assert_eq!(*held, l.latest());
        };
        assert!(s.reading(whole(1_000, 1)));
        take(&s, &mut held);
        // Alone; then two in a row, with gauges said by the first only, and a fresh one between.
        assert_eq!(s.memory(moved(2_000, 512, Some(hot(50)))), Some(true));
        take(&s, &mut held);
        assert_eq!(s.memory(moved(3_000, 1024, Some(hot(60)))), Some(true));
        assert!(s.fresh(4_000, said(70)));
        assert_eq!(s.memory(moved(5_000, 0, None)), Some(true));
        take(&s, &mut held);
        assert_eq!(
            held.as_ref().map(|j| j.snap.gpus[0].utilization),
            Some(Some(70))
        );
        // A fresh one before it, then one after it.
        assert!(s.fresh(6_000, said(80)));
        assert_eq!(s.memory(moved(7_000, 2048, None)), Some(true));
        assert!(s.fresh(8_000, said(90)));
        take(&s, &mut held);
        // A whole reading waiting, and memory after it: taken in turn.
        assert!(s.reading(whole(9_000, 1)));
        assert_eq!(s.memory(moved(10_000, 4096, Some(hot(10)))), Some(true));
        take(&s, &mut held);
        assert!(
            matches!(&held, Some(j) if j.snap.gpus[0].memory.used == Some(4096 * MIB)),
            "{held:?}"
        );
        // Numbers of another shape are not put anywhere.
        assert!(s.memory(moved(11_000, 1, None)).is_some());
        assert!(s.reading(whole(12_000, 2)));
        take(&s, &mut held);
        assert_eq!(s.memory(moved(13_000, 1, None)), None);
        take(&s, &mut held);
    }
}
