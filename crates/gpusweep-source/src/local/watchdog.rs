//! NVML behind a watchdog. A wedged driver makes NVML calls that never return (nvidia-smi hangs with them);
//! gpusweep must not. Each GPU is read on a thread of its own; a GPU whose reading does not come back before
//! the deadline is marked "driver not answering" and the others go on. The stuck thread keeps its call;
//! when it returns at last, its stale answer is dropped and that GPU is asked again.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, sync_channel};
use std::time::{Duration, Instant};

use gpusweep_core::format::{fmt_ms, millis};
use gpusweep_core::model::Gpu;

/// How long one GPU's reading may take. A cold first reading on an H200 takes tens of ms; a GPU without
/// persistence mode may take a second or two to wake up.
pub(crate) const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

/// What reads one GPU: NVML in the product.
pub trait GpuReader: Send + Sync + 'static {
    /// Read GPU `index`.
    fn read_one(&self, index: u32) -> Gpu;
}

struct Worker {
    ask: SyncSender<()>,
    answers: Receiver<Gpu>,
    /// When the question still unanswered was asked.
    asked: Option<Instant>,
    /// The last answer: its identity (UUID, name, bus) is kept on a GPU that stopped answering.
    last: Option<Gpu>,
}

/// One thread per GPU, each asked at every poll.
pub struct Guarded {
    workers: Vec<Worker>,
    deadline: Duration,
}

impl Guarded {
    pub fn new(reader: &Arc<dyn GpuReader>, count: u32, deadline: Duration) -> Guarded {
        let workers = (0..count)
            .map(|index| {
                let (ask, questions) = sync_channel::<()>(1);
                let (tell, answers) = sync_channel::<Gpu>(1);
                let reader = Arc::clone(reader);
                std::thread::Builder::new()
                    .name(format!("nvml-gpu{index}"))
                    .spawn(move || {
                        while questions.recv().is_ok() {
                            if tell.send(reader.read_one(index)).is_err() {
                                break;
                            }
                        }
                    })
                    .ok()
                    .map(|_| Worker {
                        ask,
                        answers,
                        asked: None,
                        last: None,
                    })
            })
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default();
        Guarded { workers, deadline }
    }

    /// Every GPU, in index order; a GPU that does not answer in time carries the error that says so.
    pub fn read(&mut self) -> Vec<Gpu> {
        let now = Instant::now();
        for w in &mut self.workers {
            if w.asked.is_some() {
                match w.answers.try_recv() {
                    // A late answer to an old question: stale, ask again.
                    Ok(_) => w.asked = None,
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => continue,
                }
            }
            if w.ask.try_send(()).is_ok() {
                w.asked = Some(now);
            }
        }
        let deadline = now + self.deadline;
        let mut out = Vec::with_capacity(self.workers.len());
        for (i, w) in self.workers.iter_mut().enumerate() {
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            let fresh = w.asked == Some(now);
            let answer = if fresh {
                await_answer(&w.answers, deadline)
            } else {
                None
            };
            if let Some(g) = answer {
                w.asked = None;
                w.last = Some(g.clone());
                out.push(g);
            } else {
                let waited = w.asked.map_or(self.deadline, |t| t.elapsed());
                out.push(not_answering(index, w.last.as_ref(), waited));
            }
        }
        out
    }
}

/// How long the caller stays on its CPU for an answer before it sleeps. A warm reading takes well under a
/// millisecond; waking a sleeping caller costs an inter-processor interrupt, which on a virtual machine can
/// cost as much as the reading itself.
const SPIN: Duration = Duration::from_millis(2);

fn await_answer(answers: &Receiver<Gpu>, deadline: Instant) -> Option<Gpu> {
    let spin_until = (Instant::now() + SPIN).min(deadline);
    while Instant::now() < spin_until {
        match answers.try_recv() {
            Ok(g) => return Some(g),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) => std::hint::spin_loop(),
        }
    }
    answers
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .ok()
}

/// A GPU whose reading did not come back: who it was, and no numbers (unknown, never 0).
fn not_answering(index: u32, last: Option<&Gpu>, waited: Duration) -> Gpu {
    let mut g = Gpu {
        index,
        ..Default::default()
    };
    if let Some(l) = last {
        g.uuid.clone_from(&l.uuid);
        g.name.clone_from(&l.name);
        g.pci_bus_id.clone_from(&l.pci_bus_id);
        g.minor = l.minor;
        g.compute_capability.clone_from(&l.compute_capability);
    }
    g.error = Some(format!(
        "driver not answering: NVML gave no reading for {} (nvidia-smi would hang too)",
        fmt_ms(millis(waited))
    ));
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::mpsc::{Sender, channel};

    /// GPU 1 blocks until the test lets it go, as a wedged driver's call does.
    struct OneWedged {
        release: Mutex<Receiver<()>>,
    }

    impl GpuReader for OneWedged {
        fn read_one(&self, index: u32) -> Gpu {
            if index == 1 {
                let _ = self.release.lock().map(|r| r.recv());
            }
            Gpu {
                index,
                uuid: Some(format!("GPU-{index}")),
                memory: gpusweep_core::model::Memory {
                    used: Some(u64::from(index)),
                    total: Some(10),
                    reserved: Some(0),
                },
                ..Default::default()
            }
        }
    }

    fn wedged() -> (Guarded, Sender<()>) {
        let (tx, rx) = channel();
        let reader: Arc<dyn GpuReader> = Arc::new(OneWedged {
            release: Mutex::new(rx),
        });
        (Guarded::new(&reader, 3, Duration::from_millis(50)), tx)
    }

    #[test]
    fn a_gpu_that_does_not_answer_is_marked_and_the_others_go_on() {
        let (mut g, release) = wedged();
        // Let GPU 1's first call return so its identity is known, then wedge it.
        release.send(()).expect("release");
        let first = g.read();
        assert_eq!(first[1].memory.used, Some(1));
        let second = g.read();
        assert_eq!(second.len(), 3);
        assert_eq!(second[0].memory.used, Some(0));
        assert_eq!(second[2].memory.used, Some(2));
        assert_eq!(second[1].memory.used, None, "unknown, never 0");
        assert_eq!(second[1].uuid.as_deref(), Some("GPU-1"), "still named");
        assert!(
            second[1]
                .error
                .as_deref()
                .is_some_and(|e| e.contains("driver not answering")),
            "{:?}",
            second[1].error
        );
        // Still stuck: the next poll does not wait for it again.
        let t = Instant::now();
        let third = g.read();
        assert!(third[1].error.is_some());
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "no second wait on a stuck GPU"
        );
        // The call returns at last: its stale answer is dropped and the GPU is asked again.
        release.send(()).expect("release");
        release.send(()).expect("release");
        // Awaited until a deadline, not for a count of reads: on a loaded machine the released call may
        // take a while to be scheduled, and a hundred reads can pass before it is.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut recovered = false;
        while !recovered && Instant::now() < deadline {
            recovered = g.read()[1].memory.used == Some(1);
            if !recovered {
                std::thread::yield_now();
            }
        }
        assert!(recovered, "the GPU answers again once the driver does");
    }
}
