//! The one poll loop: a polled source (this host, or a demo host) on a thread of its own, read every
//! interval, its readings handed to a sink. The fleet runs it for local and demo hosts; `gpusweep agent` runs it
//! for the host it serves. Signals to this host run on a thread of their own, so a grace period never pauses
//! the readings a re-watch needs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use gpusweep_act::Deliverer;
use gpusweep_core::action::{ActionAnswer, ActionRequest};
use gpusweep_core::protocol::MIN_INTERVAL;
use gpusweep_source::{ConnStatus, HostCmd, Sink, Source};

/// Signal requests being delivered at once on this host; more are answered "busy" at once rather than
/// starting a thread each.
const MAX_DELIVERIES: usize = 16;

/// Remove /dev/shm leftovers on this host, checked against a reading taken now (every process's fds and
/// maps).
fn removal(
    src: &mut dyn Source,
    signals: Option<&Deliverer>,
    req: &gpusweep_core::removal::RemovalRequest,
) -> Vec<gpusweep_core::removal::RemovalOutcome> {
    match (signals, src.fresh_shm()) {
        (Some(d), Some((dir, now))) => remove_where_found(&d.host, &dir, req, &now, &d.audit),
        _ => gpusweep_core::removal::all_failed(req, "this host removes no files"),
    }
}

/// Each file from where it is: the host's shared-memory directory, or a pod volume this host's own fresh
/// reading found (a request names a pod volume; only the host's reading makes it one). Answers in the
/// request's order.
fn remove_where_found(
    host: &str,
    dir: &std::path::Path,
    req: &gpusweep_core::removal::RemovalRequest,
    now: &gpusweep_core::model::ShmInfo,
    audit: &gpusweep_act::AuditLog,
) -> Vec<gpusweep_core::removal::RemovalOutcome> {
    use gpusweep_core::removal::{Removal, RemovalOutcome, RemovalRequest};
    let mut groups: Vec<(Option<&str>, Vec<usize>)> = Vec::new();
    for (i, f) in req.files.iter().enumerate() {
        let key = f.pod_volume.as_deref();
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    let mut out: Vec<Option<RemovalOutcome>> = vec![None; req.files.len()];
    for (key, idx) in groups {
        let part = RemovalRequest {
            files: idx.iter().map(|&i| req.files[i].clone()).collect(),
        };
        let done = match key {
            None => gpusweep_act::shm::remove(host, dir, &part, now, audit),
            Some(v) => match now.pods.iter().find(|p| p.dir == v) {
                Some(pod) => {
                    let seen = gpusweep_core::model::ShmInfo {
                        segments: pod.segments.clone(),
                        dir: Some(pod.dir.clone()),
                        ..Default::default()
                    };
                    gpusweep_act::shm::remove(
                        host,
                        std::path::Path::new(&pod.dir),
                        &part,
                        &seen,
                        audit,
                    )
                }
                None => part
                    .files
                    .iter()
                    .map(|f| RemovalOutcome {
                        name: f.name.clone(),
                        dir: Some(v.to_string()),
                        bytes: f.bytes,
                        result: Removal::Refused {
                            reason: "not a pod volume this host finds".into(),
                        },
                    })
                    .collect(),
            },
        };
        for (i, o) in idx.into_iter().zip(done) {
            out[i] = Some(o);
        }
    }
    out.into_iter().flatten().collect()
}

/// Deliver a signal request on a thread of its own (a grace period must not pause the readings), at most
/// `MAX_DELIVERIES` at once; the answer goes to the sink.
fn deliver(
    d: &Deliverer,
    sink: &Arc<dyn Sink>,
    in_flight: &Arc<AtomicUsize>,
    id: u64,
    req: &ActionRequest,
    signal: &gpusweep_core::signal::SignalRequest,
) {
    if in_flight.fetch_add(1, Ordering::SeqCst) >= MAX_DELIVERIES {
        in_flight.fetch_sub(1, Ordering::SeqCst);
        sink.answer(
            id,
            req.refuse("host busy: too many signal requests at once"),
        );
        return;
    }
    let (d, sink2, in_flight2, signal) =
        (d.clone(), sink.clone(), in_flight.clone(), signal.clone());
    let spawned = std::thread::Builder::new()
        .name("deliver".into())
        .spawn(move || {
            sink2.answer(id, ActionAnswer::Signal(d.deliver(&signal)));
            in_flight2.fetch_sub(1, Ordering::SeqCst);
        });
    if let Err(e) = spawned {
        in_flight.fetch_sub(1, Ordering::SeqCst);
        sink.answer(id, req.refuse(&format!("cannot start a thread: {e}")));
    }
}

/// Carry out an action on this host: the simulation's own, a removal checked against a fresh scan, or a
/// signal delivered through `act`.
fn act(
    src: &mut dyn Source,
    signals: Option<&Deliverer>,
    sink: &Arc<dyn Sink>,
    in_flight: &Arc<AtomicUsize>,
    id: u64,
    req: &ActionRequest,
) {
    if let Some(answer) = src.simulate(req) {
        sink.answer(id, answer);
        return;
    }
    match (req, signals) {
        (ActionRequest::Signal(r), Some(d)) => deliver(d, sink, in_flight, id, req, r),
        (ActionRequest::Signal(_), None) => {
            sink.answer(id, req.refuse("this host takes no signals"));
        }
        (ActionRequest::Remove(r), _) => {
            sink.answer(id, ActionAnswer::Remove(removal(src, signals, r)));
        }
    }
}

/// Poll `src` until the command channel closes or the sink stops listening. `signals` delivers real signals
/// on this host; sources that simulate theirs (the demo) answer them themselves.
pub fn run(
    mut src: Box<dyn Source>,
    signals: Option<&Deliverer>,
    sink: &Arc<dyn Sink>,
    cmds: &mpsc::Receiver<HostCmd>,
    wake: &mpsc::SyncSender<HostCmd>,
    mut interval: Duration,
) {
    if !sink.status(ConnStatus::Up) {
        return;
    }
    // A queued wake-up is enough: one reading serves any number of them.
    let waker = wake.clone();
    src.watch(Box::new(move || {
        let _ = waker.try_send(HostCmd::Wake);
    }));
    let in_flight = Arc::new(AtomicUsize::new(0));
    // Known once: a kernel does not grow pidfds while running.
    let no_pidfd = signals.and_then(Deliverer::pidfd_missing).is_some();
    loop {
        let read_at = Instant::now();
        let sent = match src.poll() {
            Ok(mut s) => {
                if no_pidfd {
                    s.missing_features
                        .push(gpusweep_core::model::Feature::Pidfd);
                }
                sink.reading(s)
            }
            Err(e) => sink.status(ConnStatus::Down(e.to_string())),
        };
        if !sent {
            return;
        }
        let mut next = Instant::now() + interval;
        if let Some(soon) = src.soon() {
            next = next.min(Instant::now() + soon);
        }
        loop {
            let wait = next.saturating_duration_since(Instant::now());
            match cmds.recv_timeout(wait) {
                // The time came, or a watched process ended: read now.
                Err(mpsc::RecvTimeoutError::Timeout) | Ok(HostCmd::Wake) => break,
                // Polls asked for in a burst cost one reading per MIN_INTERVAL, not one each.
                Ok(HostCmd::PollNow) => {
                    let soonest = read_at + MIN_INTERVAL;
                    if Instant::now() >= soonest {
                        break;
                    }
                    next = next.min(soonest);
                }
                Ok(HostCmd::Interval(d)) => {
                    // A shorter interval takes effect now; it does not cost an extra reading.
                    interval = d;
                    next = next.min(Instant::now() + d);
                }
                Ok(HostCmd::Act { id, req }) => {
                    act(src.as_mut(), signals, sink, &in_flight, id, &req);
                    // Read again right away: the signalled processes or removed files may be gone.
                    break;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

/// One source of a pool: its own interval and schedule, one thread for them all.
pub(crate) struct Pooled {
    pub src: Box<dyn Source>,
    pub sink: Arc<dyn Sink>,
}

/// A pooled source's schedule.
struct Slot {
    pooled: Pooled,
    interval: Duration,
    /// When it is read next; a queued entry for another time is an old one, let go when it comes up.
    next: Instant,
    read_at: Instant,
    /// Its sink stopped listening.
    gone: bool,
}

/// Read every pooled source that is due now, each scheduled again; how many stopped being listened to.
fn poll_due(
    slots: &mut [Slot],
    due: &mut std::collections::BinaryHeap<std::cmp::Reverse<(Instant, usize)>>,
) -> usize {
    use std::cmp::Reverse;
    let mut gone = 0;
    let now = Instant::now();
    while let Some(&Reverse((at, i))) = due.peek() {
        if at > now {
            break;
        }
        due.pop();
        let s = &mut slots[i];
        if s.gone || at != s.next {
            continue;
        }
        s.read_at = Instant::now();
        let sent = match s.pooled.src.poll() {
            Ok(snap) => s.pooled.sink.reading(snap),
            Err(e) => s.pooled.sink.status(ConnStatus::Down(e.to_string())),
        };
        if !sent {
            s.gone = true;
            gone += 1;
            continue;
        }
        let mut next = Instant::now() + s.interval;
        if let Some(soon) = s.pooled.src.soon() {
            next = next.min(Instant::now() + soon);
        }
        s.next = next;
        due.push(Reverse((next, i)));
    }
    gone
}

/// Poll many sources that need no thread each (simulated hosts: no NVML call can block them, no signal is
/// delivered for them) on this one thread, each at its own interval, until the command channel closes or
/// no sink listens. Commands name their source by its place in `sources`. A source costs a reading each
/// interval and nothing between: ten thousand simulated hosts are one thread, not ten thousand.
pub(crate) fn run_pool(
    sources: Vec<Pooled>,
    cmds: &mpsc::Receiver<(usize, HostCmd)>,
    interval: Duration,
) {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let now = Instant::now();
    let mut slots: Vec<Slot> = sources
        .into_iter()
        .map(|pooled| Slot {
            gone: !pooled.sink.status(ConnStatus::Up),
            pooled,
            interval,
            next: now,
            read_at: now,
        })
        .collect();
    let mut due: BinaryHeap<Reverse<(Instant, usize)>> =
        (0..slots.len()).map(|i| Reverse((now, i))).collect();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let mut live = slots.iter().filter(|s| !s.gone).count();
    while live > 0 {
        live -= poll_due(&mut slots, &mut due);
        let wait = due
            .peek()
            .map_or(Duration::from_secs(1), |Reverse((at, _))| {
                at.saturating_duration_since(Instant::now())
            });
        let (i, cmd) = match cmds.recv_timeout(wait) {
            Ok(c) => c,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        let Some(s) = slots.get_mut(i).filter(|s| !s.gone) else {
            continue;
        };
        let now = Instant::now();
        let next = match cmd {
            HostCmd::Wake => now,
            // Polls asked for in a burst cost one reading per MIN_INTERVAL, not one each.
            HostCmd::PollNow => s.next.min((s.read_at + MIN_INTERVAL).max(now)),
            HostCmd::Interval(d) => {
                s.interval = d;
                s.next.min(now + d)
            }
            HostCmd::Act { id, req } => {
                act(
                    s.pooled.src.as_mut(),
                    None,
                    &s.pooled.sink,
                    &in_flight,
                    id,
                    &req,
                );
                // Read again right away: what the action ended may be gone.
                now
            }
        };
        if next != s.next {
            s.next = next;
            due.push(Reverse((next, i)));
        }
    }
}
