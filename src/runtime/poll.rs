//! The one poll loop: a polled source (this host, or a demo host) on a thread of its own, read every
//! interval, its readings handed to a sink. The fleet runs it for local and demo hosts; `gpusweep agent` runs it
//! for the host it serves. Signals to this host run on a thread of their own, so a grace period never pauses
//! the readings a re-watch needs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::act::Deliverer;
use crate::core::action::{ActionAnswer, ActionRequest};
use crate::core::protocol::MIN_INTERVAL;
use crate::source::{ConnStatus, HostCmd, Sink, Source};

/// Signal requests being delivered at once on this host; more are answered "busy" at once rather than
/// starting a thread each.
const MAX_DELIVERIES: usize = 16;

/// Remove /dev/shm leftovers on this host, checked against a reading taken now (every process's fds and
/// maps).
fn removal(
    src: &mut dyn Source,
    signals: Option<&Deliverer>,
    req: &crate::core::removal::RemovalRequest,
) -> Vec<crate::core::removal::RemovalOutcome> {
    match (signals, src.fresh_shm()) {
        (Some(d), Some((dir, now))) => crate::act::shm::remove(&d.host, &dir, req, &now, &d.audit),
        _ => crate::core::removal::all_failed(req, "this host removes no files"),
    }
}

/// Deliver a signal request on a thread of its own (a grace period must not pause the readings), at most
/// `MAX_DELIVERIES` at once; the answer goes to the sink.
fn deliver(
    d: &Deliverer,
    sink: &Arc<dyn Sink>,
    in_flight: &Arc<AtomicUsize>,
    id: u64,
    req: &ActionRequest,
    signal: &crate::core::signal::SignalRequest,
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
                    s.missing_features.push(crate::core::model::Feature::Pidfd);
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
