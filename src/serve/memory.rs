//! Giving back to the system what a burst of event streams took. The allocator keeps what a burst freed in
//! its heaps for reuse: a hundred streams of a thousand hosts left a serve at 371 MB resident after they had
//! all gone (184 MB once the free pages were returned). A serve runs for months; it must not keep the
//! memory of its largest burst for good.

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

/// Return the allocator's free pages to the system: glibc's `malloc_trim(0)` (which also releases free pages
/// inside its heaps, not only at their top); nothing where the C library is another.
pub fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer and only releases memory the allocator holds free; glibc's is
    // thread-safe (it locks each arena it trims).
    unsafe {
        libc::malloc_trim(0);
    }
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
