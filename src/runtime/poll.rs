//! The one poll loop: a polled source (this host, or a demo host) on a thread of its own, read every
//! interval, its readings handed to a sink. The fleet runs it for local and demo hosts; `gpusweep agent` runs it
//! for the host it serves. Signals to this host run on a thread of their own, so a grace period never pauses
//! the readings a re-watch needs.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::act::Deliverer;
use crate::source::{ConnStatus, HostCmd, Sink, Source};

/// Poll `src` until the command channel closes or the sink stops listening. `signals` delivers real signals
/// on this host; sources that simulate theirs (the demo) answer them themselves.
pub fn run(
    mut src: Box<dyn Source>,
    signals: Option<&Deliverer>,
    sink: &Arc<dyn Sink>,
    cmds: &mpsc::Receiver<HostCmd>,
    mut interval: Duration,
) {
    if !sink.status(ConnStatus::Up) {
        return;
    }
    loop {
        let sent = match src.poll() {
            Ok(s) => sink.reading(s),
            Err(e) => sink.status(ConnStatus::Down(e.to_string())),
        };
        if !sent {
            return;
        }
        let mut next = Instant::now() + interval;
        loop {
            let wait = next.saturating_duration_since(Instant::now());
            match cmds.recv_timeout(wait) {
                Ok(HostCmd::PollNow) | Err(mpsc::RecvTimeoutError::Timeout) => break,
                Ok(HostCmd::Interval(d)) => {
                    // A shorter interval takes effect now; it does not cost an extra reading.
                    interval = d;
                    next = next.min(Instant::now() + d);
                }
                Ok(HostCmd::Signal { id, req }) => {
                    if let Some(outcomes) = src.simulate_signal(&req) {
                        sink.outcomes(id, outcomes);
                    } else if let Some(d) = signals.cloned() {
                        let sink = sink.clone();
                        std::thread::spawn(move || {
                            sink.outcomes(id, d.deliver(&req));
                        });
                    } else {
                        sink.outcomes(
                            id,
                            crate::core::signal::all_failed(&req, "this host takes no signals"),
                        );
                    }
                    // Read again right away: the signalled processes may be gone.
                    break;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}
