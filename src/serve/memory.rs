//! Giving back to the system what a burst of event streams took. An allocator keeps what a burst freed for
//! reuse: a hundred streams of a thousand hosts left a serve at 371 MB resident after they had all gone
//! (glibc's malloc then; 184 MB once the free pages were returned, 120-124 MB with mimalloc's collect now).
//! A serve runs for months; it must not keep the memory of its largest burst for good.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often the serve looks whether streams ended since it last gave memory back.
pub const EVERY: Duration = Duration::from_secs(5);

/// Streams that ended, counted as they end.
#[derive(Debug, Default)]
pub struct Ended(AtomicU64);

impl Ended {
    pub fn one(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Return the allocator's free pages to the system now: mimalloc's `mi_collect(true)` (it purges freed pages
/// on its own after a delay too; this makes the end of a burst certain rather than eventual).
pub fn give_back() {
    gpusweep_sys::allocator_give_back();
}

/// Every `EVERY`, when streams ended since the last look, give memory back.
pub async fn keep_giving_back(ended: std::sync::Arc<Ended>) {
    let mut seen = ended.count();
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = ended.count();
        if now != seen {
            seen = now;
            // It walks the heaps: off the async threads.
            let _ = tokio::task::spawn_blocking(give_back).await;
        }
    }
}
