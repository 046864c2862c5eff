//! NVML loaded on a thread of its own: started by `LocalSource::new`, or earlier by a one-shot reader that
//! knows it will read this host (`snapshot`, `wait`) before its async runtime and fleet exist. Loading
//! NVML and taking the device handles is most of such a process's life (~20 ms on an H200); starting it
//! ~1 ms sooner is ~1 ms off every run.

use std::sync::Mutex;
use std::sync::mpsc::{Receiver, sync_channel};
use std::time::Duration;

use super::nvml::{Life, NvmlReader, Readout};

pub type Loading = Receiver<Result<NvmlReader, String>>;

/// A load started early and not yet taken by a source, with the `gauges` it was started for.
static EARLY: Mutex<Option<(bool, Loading)>> = Mutex::new(None);

/// Start loading NVML on its own thread. A thread that cannot start drops the sender: the first poll then
/// says the loader failed.
pub fn spawn(readout: Readout, life: Life) -> Loading {
    let (tx, rx) = sync_channel(1);
    let _ = std::thread::Builder::new()
        .name("nvml-load".into())
        .spawn(move || {
            let _ = tx.send(NvmlReader::open(readout, life));
        });
    rx
}

/// Start loading now, for the first `LocalSource` to take: only one-shot readers start early, so the reader
/// opened here does not watch XIDs.
pub fn start(gauges: bool) {
    if let Ok(mut e) = EARLY.lock()
        && e.is_none()
    {
        *e = Some((gauges, spawn(Readout::of(gauges, false), Life::OneShot)));
        gpusweep_core::trace("nvml", "loading started early");
    }
}

/// The load started early, if it was started for the same `gauges`.
pub fn take(gauges: bool) -> Option<Loading> {
    let mut e = EARLY.lock().ok()?;
    if e.as_ref().is_some_and(|(g, _)| *g == gauges) {
        e.take().map(|(_, rx)| rx)
    } else {
        None
    }
}

/// Before the process exits: a load started early and never used (the host was read through a serve after
/// all) is waited for, up to `limit`, so that the driver library is not torn down by `exit` while its
/// initialisation runs on another thread.
pub fn settle(limit: Duration) {
    let left = EARLY.lock().ok().and_then(|mut e| e.take());
    if let Some((_, rx)) = left {
        let _ = rx.recv_timeout(limit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_early_load_is_taken_once_and_only_for_the_gauges_it_was_started_for() {
        start(true);
        assert!(
            take(false).is_none(),
            "a load for other gauges is not handed out"
        );
        let rx = take(true).expect("the early load");
        assert!(take(true).is_none(), "taken once");
        // With or without a driver here, the loader answers.
        assert!(rx.recv_timeout(Duration::from_secs(30)).is_ok());
        // A load nobody took is waited for and dropped by settle.
        start(false);
        settle(Duration::from_secs(30));
        assert!(take(false).is_none());
    }
}
